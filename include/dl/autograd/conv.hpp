#pragma once
// 2-D convolution and pooling over NCHW tensors, with their backward. Convolution lowers each image to
// columns (im2col) and multiplies by the weight with the packed GEMM, bias and activation in its
// epilogue; its backward multiplies the other way and folds columns back (col2im). Float 3×3 stride-1
// convolutions with enough channels run by Winograd's F(2×2, 3×3) instead (device/cpu/winograd.hpp),
// forward and backward, falling back to im2col when a result is not finite; convolutions whose windows
// hold 9, 25 or 27 values (first layers) run direct (device/cpu/direct_conv.hpp), forward and weight
// gradient. Pooling keeps the
// winning position of each max window for its backward; float pooling is vectorised (see
// vector_pooling).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "../device/cpu/direct_conv.hpp"
#include "../device/cpu/winograd.hpp"
#include "linalg.hpp"

namespace dl {

/// A pair of extents (height, width); one number means both.
struct extent2 {
    constexpr extent2(std::int64_t both) noexcept : h(both), w(both) {}  // NOLINT: 3 reads as {3, 3}
    constexpr extent2(std::int64_t height, std::int64_t width) noexcept : h(height), w(width) {}
    std::int64_t h, w;
};

struct conv2d_options {
    extent2 stride = 1, padding = 0, dilation = 1;
    std::int64_t groups = 1;
    activation act = activation::none;  ///< applied in the product's epilogue, after the bias
    /// k > 0: the result is max_pool2d(·, {.kernel = k}) of the activated output. The direct and
    /// Winograd kernels pool 2×2 windows in their epilogue (float, nothing recorded for gradients), so
    /// the full-size output never reaches memory; otherwise this runs the two ops.
    std::int64_t max_pool = 0;
};

struct pool2d_options {
    extent2 kernel;
    extent2 stride = 0;  ///< 0: the kernel size
    extent2 padding = 0;
    bool count_include_pad = true;  ///< avg_pool2d: divide by the full window, padding included
};

namespace autograd::detail {

/// Output extent of a sliding window (floor mode).
[[nodiscard]] inline std::int64_t window_count(std::int64_t in, std::int64_t kernel, std::int64_t stride,
                                               std::int64_t padding, std::int64_t dilation) {
    const std::int64_t room = in + 2 * padding - dilation * (kernel - 1) - 1;
    return room < 0 ? 0 : room / stride + 1;
}

/// The geometry of a convolution or pooling window over one [C, H, W] image.
struct window_geometry {
    std::int64_t channels, h, w, kh, kw, oh, ow;
    extent2 stride, padding, dilation;
    [[nodiscard]] std::int64_t column_rows() const noexcept { return channels * kh * kw; }
    [[nodiscard]] std::int64_t column_cols() const noexcept { return oh * ow; }
};

/// The outputs x in [first, last) of one kernel column j whose input column x·stride - padding +
/// j·dilation lies inside [0, w): outside it, the window reads padding.
struct valid_span {
    std::int64_t first, last;
};
[[nodiscard]] inline valid_span valid_outputs(std::int64_t j, std::int64_t w, std::int64_t ow, std::int64_t stride,
                                              std::int64_t padding, std::int64_t dilation) {
    const std::int64_t offset = j * dilation - padding;  // input column of output 0
    const std::int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
    const std::int64_t last = offset >= w ? 0 : (w - 1 - offset) / stride + 1;
    return {std::min(first, ow), std::clamp(last, std::min(first, ow), ow)};
}

/// Stride 1 with output rows as long as the input rows ("same" padding): a kernel tap (i, j) reads the
/// input plane shifted by a constant, so its output plane is one flat copy, with the padding columns
/// fixed up afterwards, instead of one short copy per output row. For tap (i, j): output rows
/// [y0, y1) read input rows; output element y0·ow + k (lo ≤ k < hi) is input element src + k.
struct flat_tap {
    std::int64_t y0, y1, src, lo, hi;
};
[[nodiscard]] inline bool has_flat_taps(const window_geometry& g) {
    return g.stride.h == 1 && g.stride.w == 1 && g.ow == g.w;
}
[[nodiscard]] inline flat_tap flat_tap_of(const window_geometry& g, std::int64_t i, std::int64_t j) {
    const auto [y0, y1] = valid_outputs(i, g.h, g.oh, 1, g.padding.h, g.dilation.h);
    const std::int64_t src = (y0 + i * g.dilation.h - g.padding.h) * g.w + j * g.dilation.w - g.padding.w;
    return {y0, y1, src, std::max<std::int64_t>(0, -src), std::min((y1 - y0) * g.ow, g.h * g.w - src)};
}
/// Zeroes the entries of output rows [y0, y1) outside the valid columns [first, last) (one or two per
/// row: plain loops, a memset call each would cost more).
template <class T>
void zero_padding_columns(T* plane, const flat_tap& t, valid_span cols, std::int64_t ow) {
    for (std::int64_t y = t.y0; y < t.y1; ++y) {
        for (std::int64_t x = 0; x < cols.first; ++x) plane[y * ow + x] = T(0);
        for (std::int64_t x = cols.last; x < ow; ++x) plane[y * ow + x] = T(0);
    }
}

/// Lowers image (strides sc, sh, sw) to the columns [C*kh*kw, oh*ow] at col, whose rows are `ld`
/// elements apart (the columns of several images sit side by side); padding reads as zero.
template <class T>
void im2col(const T* image, std::int64_t sc, std::int64_t sh, std::int64_t sw, const window_geometry& g, T* col,
            std::int64_t ld) {
    const bool flat = has_flat_taps(g) && sw == 1 && sh == g.w;
    for (std::int64_t c = 0; c < g.channels; ++c)
        for (std::int64_t i = 0; i < g.kh; ++i)
            for (std::int64_t j = 0; j < g.kw; ++j) {
                T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
                const valid_span cols = valid_outputs(j, g.w, g.ow, g.stride.w, g.padding.w, g.dilation.w);
                const auto [first, last] = cols;
                if (flat) {
                    const flat_tap t = flat_tap_of(g, i, j);
                    const T* in = image + c * sc + t.src;
                    T* out = row + t.y0 * g.ow;
                    for (std::int64_t k = t.lo; k < t.hi; ++k) out[k] = in[k];
                    zero_padding_columns(row, t, cols, g.ow);
                    std::fill(row, row + t.y0 * g.ow, T(0));
                    std::fill(row + t.y1 * g.ow, row + g.oh * g.ow, T(0));
                    continue;
                }
                for (std::int64_t y = 0; y < g.oh; ++y) {
                    const std::int64_t ih = y * g.stride.h - g.padding.h + i * g.dilation.h;
                    T* out = row + y * g.ow;
                    if (ih < 0 || ih >= g.h) {
                        std::fill(out, out + g.ow, T(0));
                        continue;
                    }
                    const T* in = image + c * sc + ih * sh + (j * g.dilation.w - g.padding.w) * sw;
                    const std::int64_t step = g.stride.w * sw;
                    for (std::int64_t x = 0; x < first; ++x) out[x] = T(0);
                    for (std::int64_t x = first; x < last; ++x) out[x] = in[x * step];
                    for (std::int64_t x = last; x < g.ow; ++x) out[x] = T(0);
                }
            }
}

/// The adjoint of im2col: adds each column entry (rows `ld` apart) back onto the contiguous image
/// [C, H, W]. The entries that im2col read from padding are dropped; on the flat path (see im2col)
/// they are zeroed first, which is why col is not const.
template <class T>
void col2im(T* col, std::int64_t ld, const window_geometry& g, T* image) {
    const bool flat = has_flat_taps(g);
    for (std::int64_t c = 0; c < g.channels; ++c)
        for (std::int64_t i = 0; i < g.kh; ++i)
            for (std::int64_t j = 0; j < g.kw; ++j) {
                T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
                const valid_span cols = valid_outputs(j, g.w, g.ow, g.stride.w, g.padding.w, g.dilation.w);
                const auto [first, last] = cols;
                if (flat) {
                    const flat_tap t = flat_tap_of(g, i, j);
                    zero_padding_columns(row, t, cols, g.ow);
                    T* out = image + c * g.h * g.w + t.src;
                    const T* in = row + t.y0 * g.ow;
                    for (std::int64_t k = t.lo; k < t.hi; ++k) out[k] += in[k];
                    continue;
                }
                for (std::int64_t y = 0; y < g.oh; ++y) {
                    const std::int64_t ih = y * g.stride.h - g.padding.h + i * g.dilation.h;
                    if (ih < 0 || ih >= g.h) continue;
                    T* out = image + (c * g.h + ih) * g.w + (j * g.dilation.w - g.padding.w);
                    const T* in = row + y * g.ow;
                    for (std::int64_t x = first; x < last; ++x) out[x * g.stride.w] += in[x];
                }
            }
}

/// Images are split into this many chunks (a fixed number, not the thread count, so that sums over
/// chunks are the same on every machine).
[[nodiscard]] inline std::int64_t image_chunks(std::int64_t images) { return std::min<std::int64_t>(images, 8); }

/// How many of a chunk's images one product covers. A product per image needs no copies, but when an
/// image has few output pixels its product is too narrow for the GEMM's tiles: such images are
/// lowered side by side into one wide product (and its output copied back to NCHW).
[[nodiscard]] inline std::int64_t images_per_product(std::int64_t pixels, std::int64_t images) {
    return pixels >= 256 ? 1 : images;
}

/// Runs f(chunk, first, last) for the image ranges of image_chunks(images) chunks on ctx's threads.
template <class F>
void for_each_image_chunk(std::int64_t images, Context& ctx, F&& f) {
    const std::int64_t chunks = image_chunks(images);
    ctx.parallel_for(chunks, [&](std::int64_t c) { f(c, c * images / chunks, (c + 1) * images / chunks); });
}

template <class T>
void check_images(const Tensor<T>& x, std::string_view op) {
    if (x.rank() != 4) dl::detail::fail("dl::", op, ": expected input [N, C, H, W], got shape ", x.shape());
}

/// "HxW", for the attributes of a traced op.
[[nodiscard]] inline std::string describe(extent2 e) { return std::to_string(e.h) + "x" + std::to_string(e.w); }

inline void check_positive(extent2 e, std::string_view op, std::string_view what, std::int64_t least = 1) {
    if (e.h < least || e.w < least)
        dl::detail::fail("dl::", op, ": ", what, " must be at least ", least, ", got (", e.h, ", ", e.w, ")");
}

/// The sum of g [N, C, H, W] (contiguous) over all but its channels: conv2d's bias gradient. Each
/// plane is summed in SIMD lanes, the planes in double, image after image: the generic reduction
/// adds one element at a time in one chain, which took as long as the rest of the 1→32 layer's
/// backward.
template <class T>
[[nodiscard]] Tensor<T> channel_sums(const Tensor<T>& g) {
    const std::int64_t images = g.shape()[0], channels = g.shape()[1], plane = g.shape()[2] * g.shape()[3];
    std::vector<double> totals(static_cast<std::size_t>(channels));
    for (std::int64_t i = 0; i < images; ++i)
        for (std::int64_t c = 0; c < channels; ++c) {
            const T* p = g.data() + (i * channels + c) * plane;
            std::conditional_t<simd::has_batch<T>, xsimd::batch<compute_t<T>>, compute_t<T>> lanes(0);
            double tail = 0;
            simd::for_each_block<T>(plane, [&]<class V>(std::int64_t k) {
                if constexpr (simd::is_batch<V>) lanes += simd::load_as<V>(p + k);
                else tail += static_cast<double>(p[k]);
            });
            if constexpr (simd::has_batch<T>) tail += static_cast<double>(xsimd::hadd(lanes));
            totals[static_cast<std::size_t>(c)] += tail;
        }
    Tensor<T> out({channels}, g.context());
    for (std::int64_t c = 0; c < channels; ++c) out.data()[c] = static_cast<T>(totals[static_cast<std::size_t>(c)]);
    return out;
}

/// Whether a convolution with this geometry, `ins` input and `outs` output channels runs by Winograd
/// F(2×2, 3×3): float, 3×3, stride 1, no dilation, one group, and at least 16 channels on each side
/// (below that the transforms cost more than the products save; measured in bench_gemm's conv rows).
template <class T>
[[nodiscard]] bool winograd_applies(const window_geometry& g, std::int64_t groups, std::int64_t ins, std::int64_t outs) {
    return std::is_same_v<T, float> && g.kh == 3 && g.kw == 3 && g.stride.h == 1 && g.stride.w == 1 &&
           g.dilation.h == 1 && g.dilation.w == 1 && groups == 1 && ins >= 16 && outs >= 16;
}

/// The direct kernels' shape (device/cpu/direct_conv.hpp) for a convolution of `images` images into
/// `outs` channels.
[[nodiscard]] inline dl::detail::direct_conv_shape direct_shape(const window_geometry& g, std::int64_t images,
                                                               std::int64_t outs) {
    return {images, g.channels, g.h, g.w, outs, g.kh, g.kw, g.padding.h, g.padding.w};
}

/// Whether a convolution runs by the direct kernels: float, stride 1, no dilation, one group, and a
/// window size and output width they cover. (Double stays on im2col, the tests' reference.)
template <class T>
[[nodiscard]] bool direct_conv_applies(const window_geometry& g, std::int64_t groups, std::int64_t outs) {
    return std::is_same_v<T, float> && g.stride.h == 1 && g.stride.w == 1 && g.dilation.h == 1 && g.dilation.w == 1 &&
           groups == 1 && dl::detail::direct_conv_covers<T>(direct_shape(g, 1, outs));
}

/// conv2d's input and weight gradients for the output gradient g, by Winograd where it applies. Each
/// gradient computed is accumulated and its node pointer cleared: conv2d's im2col loop then computes
/// only what is left, including a gradient that came out NaN or Inf (the definition says where).
/// For float only; a template so that a file that runs no convolution backward does not compile it.
template <class T>
void winograd_gradients(const window_geometry& geo, std::int64_t groups, const Tensor<T>& g, const Tensor<T>& in,
                        const Tensor<T>& wt, typed_node<T>*& x_node, typed_node<T>*& w_node) {
    static_assert(std::is_same_v<T, float>);
    const std::int64_t images = in.shape()[0], outs = wt.shape()[0], cols = geo.column_cols();
    Context& ctx = in.context();
    // The input gradient is the convolution of g with the kernels turned by 180° and the channel roles
    // swapped, padded by 2 − padding.
    if (x_node && geo.padding.h <= 2 && geo.padding.w <= 2 && winograd_applies<T>(geo, groups, outs, geo.channels)) {
        auto [target, had] = product_target(*x_node);
        const Tensor<T> dx = had ? Tensor<T>(target.shape(), ctx) : target;
        const bool finite = dl::detail::winograd_conv3x3(
            g.data(), {outs * cols, cols, geo.ow, 1},
            {images, outs, geo.oh, geo.ow, geo.channels, 2 - geo.padding.h, 2 - geo.padding.w},
            dl::detail::winograd_weights(wt.detach().contiguous().data(), outs, geo.channels, true), dx.data(),
            static_cast<const T*>(nullptr), activation::none, ctx);
        if (finite) {
            if (had) target += dx;
            x_node = nullptr;
        } else if (!had) {
            assign(target, T(0));
        }
    }
    if (w_node && winograd_applies<T>(geo, groups, geo.channels, outs)) {
        Tensor<T> dw(wt.shape(), ctx);
        const auto& xs = in.strides();
        if (dl::detail::winograd_weight_gradient(in.data(), {xs[0], xs[1], xs[2], xs[3]},
                                                 {images, geo.channels, geo.h, geo.w, outs, geo.padding.h, geo.padding.w},
                                                 g.data(), dw.data(), ctx)) {
            accumulate(*w_node, dw);
            w_node = nullptr;
        }
    }
}

}  // namespace autograd::detail

/// Cross-correlation of x [N, C, H, W] with weight [O, C / groups, kh, kw], plus bias [O] when given
/// (may be a null tensor): the result is [N, O, OH, OW], as torch.nn.functional.conv2d.
template <class T>
[[nodiscard]] Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& bias = {},
                               conv2d_options o = {}) {
    using namespace autograd::detail;
    static_assert(is_floating_element<T>, "dl::conv2d: needs a floating tensor");
    if (auto* r = autograd::recorder_of(x, weight, bias))
        return autograd::record_product(
            *r, "conv2d",
            autograd::attributes("stride", describe(o.stride), "padding", describe(o.padding), "dilation",
                                 describe(o.dilation), "groups", o.groups, "act", o.act) +
                (o.max_pool ? ", " + autograd::attributes("max_pool", o.max_pool) : std::string()),
            {.act = o.act, .max_pool = o.max_pool},
            [o](autograd::product_epilogue e) {
                conv2d_options with = o;
                with.act = e.act;
                with.max_pool = e.max_pool;
                return [with](const Tensor<T>& in, const Tensor<T>& w, const Tensor<T>& b) { return conv2d(in, w, b, with); };
            },
            x, weight, bias);
    // gelu's gradient needs its input, which the epilogue does not keep: with gradients it runs apart.
    if (o.act == activation::gelu && autograd::any_records(x, weight, bias)) {
        conv2d_options plain = o;
        plain.act = activation::none;
        return gelu(conv2d(x, weight, bias, plain));
    }
    check_images(x, "conv2d");
    if (weight.rank() != 4) detail::fail("dl::conv2d: expected weight [O, C/groups, kh, kw], got shape ", weight.shape());
    check_positive(o.stride, "conv2d", "stride");
    check_positive(o.dilation, "conv2d", "dilation");
    check_positive(o.padding, "conv2d", "padding", 0);
    const std::int64_t n = x.shape()[0], c = x.shape()[1], out_channels = weight.shape()[0], groups = o.groups;
    if (groups < 1 || c % groups != 0 || out_channels % groups != 0 || weight.shape()[1] * groups != c)
        detail::fail("dl::conv2d: input ", x.shape(), " and weight ", weight.shape(), " do not match with ", groups,
                     " group(s) (weight dimension 1 must be channels / groups)");
    if (bias.defined() && (bias.rank() != 1 || bias.shape()[0] != out_channels))
        detail::fail("dl::conv2d: bias of shape ", bias.shape(), " for ", out_channels, " output channels");
    const window_geometry geo{c,
                              x.shape()[2],
                              x.shape()[3],
                              weight.shape()[2],
                              weight.shape()[3],
                              window_count(x.shape()[2], weight.shape()[2], o.stride.h, o.padding.h, o.dilation.h),
                              window_count(x.shape()[3], weight.shape()[3], o.stride.w, o.padding.w, o.dilation.w),
                              o.stride,
                              o.padding,
                              o.dilation};
    if (geo.oh <= 0 || geo.ow <= 0)
        detail::fail("dl::conv2d: the kernel ", weight.shape(), " does not fit the padded input ", x.shape());
    if (o.max_pool < 0) detail::fail("dl::conv2d: max_pool must be 0 (none) or a window size, got ", o.max_pool);
    conv2d_options unpooled = o;
    unpooled.max_pool = 0;
    const bool pool = o.max_pool > 0;
    if (pool) {
        bool in_epilogue = false;
        if constexpr (std::is_same_v<T, float>)
            in_epilogue = o.max_pool == 2 && geo.oh >= 2 && geo.ow >= 2 && !autograd::any_records(x, weight, bias) &&
                          (direct_conv_applies<T>(geo, groups, out_channels) || winograd_applies<T>(geo, groups, c, out_channels));
        if (!in_epilogue) return max_pool2d(conv2d(x, weight, bias, unpooled), {.kernel = o.max_pool});
    }

    Context& ctx = x.context();
    Tensor<T> out({n, out_channels, pool ? geo.oh / 2 : geo.oh, pool ? geo.ow / 2 : geo.ow}, ctx);
    {
        // Its products are recorded as "matmul" or "conv2d_winograd" (with their FLOPs); what remains
        // here is im2col.
        const op_scope scope(ctx, "conv2d", 0,
                                   double(sizeof(T)) * double(x.numel() + geo.column_rows() * geo.column_cols() * n));
        no_grad off(ctx);
        const std::int64_t rows = geo.column_rows() / groups, og = out_channels / groups;
        const Tensor<T> w = weight.detach().reshape({out_channels, rows});
        const auto& s = x.strides();
        const Tensor<T> b = bias.defined() ? bias.detach().contiguous() : Tensor<T>();  // the epilogue reads a pointer
        const std::int64_t plane = geo.column_cols();
        // Winograd, unless an output came out NaN or Inf: then the definition says which ones.
        bool done = false;
        if constexpr (std::is_same_v<T, float>) {
            if (direct_conv_applies<T>(geo, groups, out_channels)) {
                const auto run = pool ? dl::detail::direct_conv_max_pool<T> : dl::detail::direct_conv<T>;
                run(x.data(), {s[0], s[1], s[2], s[3]}, direct_shape(geo, n, out_channels), weight.detach().contiguous().data(),
                    b.defined() ? b.data() : nullptr, o.act, out.data(), ctx);
                done = true;
            }
            done = done || (winograd_applies<T>(geo, groups, c, out_channels) &&
                   dl::detail::winograd_conv3x3(x.data(), {s[0], s[1], s[2], s[3]},
                                                {n, c, geo.h, geo.w, out_channels, o.padding.h, o.padding.w},
                                                dl::detail::winograd_weights(weight.detach().contiguous().data(),
                                                                             out_channels, c, false),
                                                out.data(), b.defined() ? b.data() : nullptr, o.act, ctx, pool));
        }
        // Winograd met a NaN or Inf: the definition says which outputs hold it, then the pool.
        if (pool && !done) return max_pool2d(conv2d(x, weight, bias, unpooled), {.kernel = o.max_pool});
        if (!done) for_each_image_chunk(n, ctx, [&](std::int64_t, std::int64_t first, std::int64_t last) {
            const std::int64_t per = images_per_product(plane, last - first), width = per * plane;
            Tensor<T> col({geo.column_rows(), width}, ctx), wide = per > 1 ? Tensor<T>({out_channels, width}, ctx) : Tensor<T>();
            for (std::int64_t i0 = first; i0 < last; i0 += per) {
                const Tensor<T> y = per > 1 ? wide : out.select(0, i0).reshape({out_channels, plane});
                for (std::int64_t i = i0; i < i0 + per; ++i)
                    im2col(x.data() + i * s[0], s[1], s[2], s[3], geo, col.data() + (i - i0) * plane, width);
                for (std::int64_t g = 0; g < groups; ++g)
                    gemm_into(y.slice(0, g * og, (g + 1) * og), w.slice(0, g * og, (g + 1) * og),
                              col.slice(0, g * rows, (g + 1) * rows),
                              dl::detail::gemm_epilogue<T>{.bias = b.defined() ? b.data() + g * og : nullptr,
                                                           .bias_per_row = true,
                                                           .act = o.act});
                for (std::int64_t i = i0; i < i0 + per && per > 1; ++i)
                    for (std::int64_t o = 0; o < out_channels; ++o)
                        std::copy_n(y.data() + o * width + (i - i0) * plane, plane, out.data() + (i * out_channels + o) * plane);
            }
        });
    }
    if (autograd::any_records(x, weight, bias))
        autograd::record(
            out,
            [geo, groups, act = o.act, y = out.detach()](const Tensor<T>& grad, const Tensor<T>& in, const Tensor<T>& wt,
                                                         const Tensor<T>& b) {
                const op_scope scope(in.context(), "conv2d_backward");
                const Tensor<T> g = activation_grad(grad, y, act).contiguous();
                const std::int64_t images = in.shape()[0], outs = wt.shape()[0], og = outs / groups;
                const std::int64_t rows = geo.column_rows() / groups, cols = geo.column_cols();
                Context& ctx = in.context();
                auto* x_node = autograd::node_of(in);
                auto* w_node = autograd::node_of(wt);
                const Tensor<T> w = wt.detach().reshape({outs, rows});
                if constexpr (std::is_same_v<T, float>) {
                    winograd_gradients(geo, groups, g, in, wt, x_node, w_node);
                    if (w_node && direct_conv_applies<T>(geo, groups, outs)) {
                        const Tensor<T> dw(wt.shape(), ctx);
                        const auto& xs = in.strides();
                        dl::detail::direct_conv_weight_gradient(in.data(), {xs[0], xs[1], xs[2], xs[3]},
                                                                direct_shape(geo, images, outs), g.data(),
                                                                image_chunks(images), dw.data(), ctx);
                        autograd::accumulate(*w_node, dw);
                        w_node = nullptr;
                    }
                }
                if (x_node) (void)autograd::grad_buffer(*x_node);  // allocated before the tasks share it
                // Each chunk of images sums its own weight gradient; the chunks are then added in order,
                // so the result does not depend on how many threads ran them.
                const std::int64_t chunks = image_chunks(images);
                Tensor<T> partial_dw = w_node ? Tensor<T>({chunks, outs, rows}, ctx) : Tensor<T>();
                const auto& s = in.strides();
                if (w_node || x_node) for_each_image_chunk(images, ctx, [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
                    // As in the forward: narrow images side by side, one wide product per group.
                    const std::int64_t per = images_per_product(cols, last - first), width = per * cols;
                    Tensor<T> col({geo.column_rows(), width}, ctx), wide = per > 1 ? Tensor<T>({outs, width}, ctx) : Tensor<T>();
                    for (std::int64_t i0 = first; i0 < last; i0 += per) {
                        const Tensor<T> gc = per > 1 ? wide : g.select(0, i0).reshape({outs, cols});
                        for (std::int64_t i = i0; i < i0 + per && per > 1; ++i)
                            for (std::int64_t o = 0; o < outs; ++o)
                                std::copy_n(g.data() + (i * outs + o) * cols, cols, gc.data() + o * width + (i - i0) * cols);
                        if (w_node) {
                            for (std::int64_t i = i0; i < i0 + per; ++i)
                                im2col(in.data() + i * s[0], s[1], s[2], s[3], geo, col.data() + (i - i0) * cols, width);
                            const Tensor<T> dw = partial_dw.select(0, chunk);
                            for (std::int64_t k = 0; k < groups; ++k)
                                gemm_into(dw.slice(0, k * og, (k + 1) * og), i0 > first, gc.slice(0, k * og, (k + 1) * og),
                                          col.slice(0, k * rows, (k + 1) * rows).t());
                        }
                        if (x_node) {
                            for (std::int64_t k = 0; k < groups; ++k)
                                gemm_into(col.slice(0, k * rows, (k + 1) * rows), false,
                                          w.slice(0, k * og, (k + 1) * og).t(), gc.slice(0, k * og, (k + 1) * og));
                            for (std::int64_t i = i0; i < i0 + per; ++i)
                                col2im(col.data() + (i - i0) * cols, width, geo, x_node->grad.select(0, i).data());
                        }
                    }
                });
                if (w_node) autograd::accumulate(*w_node, sum(partial_dw, {0}).reshape(wt.shape()));
                if (auto* n = autograd::node_of(b)) autograd::accumulate(*n, channel_sums(g));
            },
            x, weight, bias);
    return out;
}

namespace autograd::detail {

/// Output size and window placement of a pooling op over x [N, C, H, W].
[[nodiscard]] inline window_geometry pool_geometry(const Shape& x, const pool2d_options& o, std::string_view op) {
    const extent2 stride{o.stride.h ? o.stride.h : o.kernel.h, o.stride.w ? o.stride.w : o.kernel.w};
    check_positive(o.kernel, op, "kernel");
    check_positive(stride, op, "stride");
    check_positive(o.padding, op, "padding", 0);
    if (o.padding.h * 2 > o.kernel.h || o.padding.w * 2 > o.kernel.w)
        dl::detail::fail("dl::", op, ": padding (", o.padding.h, ", ", o.padding.w,
                         ") must be at most half the kernel (", o.kernel.h, ", ", o.kernel.w, ")");
    window_geometry g{x[1],
                      x[2],
                      x[3],
                      o.kernel.h,
                      o.kernel.w,
                      window_count(x[2], o.kernel.h, stride.h, o.padding.h, 1),
                      window_count(x[3], o.kernel.w, stride.w, o.padding.w, 1),
                      stride,
                      o.padding,
                      1};
    if (g.oh <= 0 || g.ow <= 0)
        dl::detail::fail("dl::", op, ": the window (", o.kernel.h, ", ", o.kernel.w, ") does not fit the input ", x);
    if (g.h * g.w > std::numeric_limits<std::int32_t>::max())
        dl::detail::fail("dl::", op, ": planes of ", g.h, " x ", g.w, " elements are larger than the 2^31 - 1 positions ",
                         "its int32 window positions can name");
    return g;
}

/// The input window [h0, h1) x [w0, w1) of one pooling output (clipped to the image) and the number an
/// average divides its sum by.
struct pool_window {
    std::int64_t h0, h1, w0, w1, divisor;
};

/// Output (y, x)'s window of a max or average pool; the divisor counts padding when include_pad.
[[nodiscard]] inline pool_window clipped_window(const window_geometry& g, std::int64_t y, std::int64_t x,
                                                bool include_pad) {
    const std::int64_t h0 = y * g.stride.h - g.padding.h, w0 = x * g.stride.w - g.padding.w;
    const std::int64_t h1 = std::min(h0 + g.kh, g.h + g.padding.h), w1 = std::min(w0 + g.kw, g.w + g.padding.w);
    pool_window win{std::max<std::int64_t>(h0, 0), std::min(h1, g.h), std::max<std::int64_t>(w0, 0), std::min(w1, g.w),
                    (h1 - h0) * (w1 - w0)};
    if (!include_pad) win.divisor = (win.h1 - win.h0) * (win.w1 - win.w0);
    return win;
}

// The vectorised pooling kernels (float, on SIMD targets) run over a plane's outputs, a vector of them at
// a time, whatever rows they sit in: the Fashion-MNIST CNN's rows hold 14 and 7 outputs, fewer than an
// AVX-512 vector, so vectors along a row would leave most of the work to the scalar tail. Each lane
// gathers its window's taps at offsets read from tables built once per call (every plane has the same
// geometry). The results equal the scalar loops' bit for bit: the same comparisons, the same sums in
// the same order.
template <class T>
inline constexpr bool vector_pooling = simd::has_batch<T> && std::is_same_v<T, float>;

/// Per output, the plane offset of its window's first tap when the whole kh x kw window lies in the
/// image, else -1 (windows clipped by padding take the scalar path).
template <class Window>
[[nodiscard]] std::vector<std::int32_t> window_offsets(const window_geometry& g, Window window) {
    std::vector<std::int32_t> offsets(static_cast<std::size_t>(g.oh * g.ow));
    for (std::int64_t y = 0; y < g.oh; ++y)
        for (std::int64_t x = 0; x < g.ow; ++x) {
            const pool_window win = window(y, x);
            const bool whole = win.h1 - win.h0 == g.kh && win.w1 - win.w0 == g.kw;
            offsets[static_cast<std::size_t>(y * g.ow + x)] = whole ? std::int32_t(win.h0 * g.w + win.w0) : -1;
        }
    return offsets;
}

/// Per input position of an h x w plane, the output of an oh x ow pool whose window holds it, or -1.
/// Empty when two windows share a position: a backward can then read each input's gradient from its
/// one window instead of scattering, which only disjoint windows allow.
template <class Window>
[[nodiscard]] std::vector<std::int32_t> window_owners(std::int64_t h, std::int64_t w, std::int64_t oh, std::int64_t ow,
                                                      Window window) {
    std::vector<std::int32_t> owners(static_cast<std::size_t>(h * w), -1);
    for (std::int64_t y = 0; y < oh; ++y)
        for (std::int64_t x = 0; x < ow; ++x) {
            const pool_window win = window(y, x);
            for (std::int64_t i = win.h0; i < win.h1; ++i)
                for (std::int64_t j = win.w0; j < win.w1; ++j) {
                    std::int32_t& owner = owners[static_cast<std::size_t>(i * w + j)];
                    if (owner >= 0) return {};
                    owner = std::int32_t(y * ow + x);
                }
        }
    return owners;
}

/// The average pool's input gradient over one plane whose windows are disjoint: each position pos
/// adds g[o] / divisors[o] for the output o = owners[pos] whose window holds it. Positions of no window
/// are left untouched (not even +0, which would turn a -0 into +0).
template <class T>
void add_window_shares(const std::vector<std::int32_t>& owners, const std::vector<T>& divisors, const T* g, T* dx) {
    const auto inputs = static_cast<std::int64_t>(owners.size());
    std::int64_t pos = 0;
#ifndef DL_NO_SIMD
    if constexpr (vector_pooling<T>) {
        using I = simd::batch<std::int32_t>;
        constexpr int W = simd::width<T>;
        for (; pos + W <= inputs; pos += W) {
            const I owner = simd::load(owners.data() + pos);
            const auto held = owner >= I(0);
            const I o = simd::select(held, owner, I(0));
            const simd::batch<T> d = simd::load(dx + pos);
            const simd::batch<T> share = simd::gather(g, o) / simd::gather(divisors.data(), o);
            simd::store(dx + pos, simd::select(simd::mask_cast(held), d + share, d));
        }
    }
#endif
    for (; pos < inputs; ++pos) {
        const std::int32_t o = owners[static_cast<std::size_t>(pos)];
        if (o >= 0) dx[pos] += static_cast<T>(g[o] / divisors[static_cast<std::size_t>(o)]);
    }
}

/// An average pool whose window for output (y, x) is window(y, x), a pool_window. `uniform`: the
/// geometry when every window is kh x kw before clipping (avg_pool2d), so whole windows vectorise;
/// null for adaptive pooling, whose windows vary.
template <class T, class Window>
[[nodiscard]] Tensor<T> average_pool(const Tensor<T>& x, std::int64_t oh, std::int64_t ow, Window window,
                                     const window_geometry* uniform) {
    const std::int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
    const std::int64_t outputs = oh * ow, inputs = h * w;
    const op_scope scope(x.context(), "avg_pool2d");
    const Tensor<T> in = x.detach().contiguous();
    Tensor<T> out({n, c, oh, ow}, x.context());
    auto average = [&](const T* plane, std::int64_t o) {
        const auto [h0, h1, w0, w1, divisor] = window(o / ow, o % ow);
        compute_t<T> total = 0;  // float for 16-bit tensors: rounded once
        for (std::int64_t i = h0; i < h1; ++i)
            for (std::int64_t j = w0; j < w1; ++j) total += static_cast<compute_t<T>>(plane[i * w + j]);
        return static_cast<T>(total / static_cast<compute_t<T>>(divisor));
    };
    const std::vector<std::int32_t> offsets =
        vector_pooling<T> && uniform ? window_offsets(*uniform, window) : std::vector<std::int32_t>();
    for_each_image_chunk(n * c, x.context(), [&](std::int64_t, std::int64_t first, std::int64_t last) {
        for (std::int64_t p = first; p < last; ++p) {
            const T* plane = in.data() + p * inputs;
            T* result = out.data() + p * outputs;
            std::int64_t o = 0;
#ifndef DL_NO_SIMD
            if constexpr (vector_pooling<T>) {
                using I = simd::batch<std::int32_t>;
                constexpr int W = simd::width<T>;
                for (; !offsets.empty() && o + W <= outputs; o += W) {
                    const I first_tap = simd::load(offsets.data() + o);
                    if (xsimd::any(first_tap < I(0))) {
                        for (std::int64_t k = o; k < o + W; ++k) result[k] = average(plane, k);
                        continue;
                    }
                    simd::batch<T> total(T(0));
                    for (std::int64_t i = 0; i < uniform->kh; ++i)
                        for (std::int64_t j = 0; j < uniform->kw; ++j)
                            total += simd::gather(plane, first_tap + I(std::int32_t(i * w + j)));
                    simd::store(result + o, total / simd::batch<T>(T(uniform->kh * uniform->kw)));
                }
            }
#endif
            for (; o < outputs; ++o) result[o] = average(plane, o);
        }
    });
    if (autograd::records(x))
        autograd::record(
            out,
            [window](const Tensor<T>& grad, const Tensor<T>& src) {
                const op_scope scope(src.context(), "avg_pool2d_backward");
                const Tensor<T> g = grad.contiguous();
                const std::int64_t planes = g.shape()[0] * g.shape()[1], gh = g.shape()[2], gw = g.shape()[3];
                const std::int64_t h = src.shape()[2], w = src.shape()[3];
                T* buffer = autograd::grad_buffer(*autograd::node_of(src)).data();
                const std::vector<std::int32_t> owners = window_owners(h, w, gh, gw, window);
                if (!owners.empty()) {
                    std::vector<T> divisors(static_cast<std::size_t>(gh * gw));
                    for (std::int64_t k = 0; k < gh * gw; ++k)
                        divisors[std::size_t(k)] = static_cast<T>(window(k / gw, k % gw).divisor);
                    for_each_image_chunk(planes, src.context(), [&](std::int64_t, std::int64_t first, std::int64_t last) {
                        for (std::int64_t p = first; p < last; ++p)
                            add_window_shares(owners, divisors, g.data() + p * gh * gw, buffer + p * h * w);
                    });
                    return;
                }
                // Overlapping windows: each output adds its share to every position of its window.
                for_each_image_chunk(planes, src.context(), [&](std::int64_t, std::int64_t first, std::int64_t last) {
                    for (std::int64_t p = first; p < last; ++p)
                        for (std::int64_t k = 0; k < gh * gw; ++k) {
                            const auto [h0, h1, w0, w1, divisor] = window(k / gw, k % gw);
                            const T share = g.data()[p * gh * gw + k] / static_cast<T>(divisor);
                            T* plane = buffer + p * h * w;
                            for (std::int64_t i = h0; i < h1; ++i)
                                for (std::int64_t j = w0; j < w1; ++j) plane[i * w + j] += share;
                        }
                });
            },
            x);
    return out;
}

using dl::detail::beats;

#if defined(__AVX512F__) && !defined(DL_NO_SIMD)
/// 2×2 windows at stride 2 without padding (the CNNs' pooling), for float: each row of outputs from
/// its two input rows read as vectors (masked at the row's end), even and odd columns separated by
/// one permute each, in place of four gathers per vector of outputs (the gathers took 27% of the
/// Fashion-MNIST CNN's inference). The taps go in the general loop's order, so the maxima, the ties,
/// the NaNs and the winners are the same. Returns false for other geometries.
inline bool max_pool_2x2(const float* plane, const window_geometry& g, float* out, std::int32_t* winner) {
    if (g.kh != 2 || g.kw != 2 || g.stride.h != 2 || g.stride.w != 2 || g.padding.h != 0 || g.padding.w != 0 ||
        g.dilation.h != 1 || g.dilation.w != 1)
        return false;
    using B = simd::batch<float>;
    using I = simd::batch<std::int32_t>;
    static_assert(B::size == 16);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const I column_of_lane(even);  // a window's first input column, from its output's lane
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const float* top = plane + 2 * oy * g.w;
        for (std::int64_t ox = 0; ox < g.ow; ox += 16) {
            const auto n = static_cast<unsigned>(std::min<std::int64_t>(16, g.ow - ox)), values = 2 * n;
            const auto lanes = static_cast<__mmask16>((1u << n) - 1);
            const auto first = static_cast<__mmask16>(values >= 16 ? 0xFFFFu : (1u << values) - 1);
            const auto second = static_cast<__mmask16>(values > 16 ? (1u << (values - 16)) - 1 : 0u);
            auto columns = [&](const float* row, B& left, B& right) {
                const __m512 a = _mm512_maskz_loadu_ps(first, row + 2 * ox);
                const __m512 b = _mm512_maskz_loadu_ps(second, row + 2 * ox + 16);
                left = _mm512_permutex2var_ps(a, even, b);
                right = _mm512_permutex2var_ps(a, odd, b);
            };
            B taps[4];
            columns(top, taps[0], taps[1]);
            columns(top + g.w, taps[2], taps[3]);
            const I base = I(static_cast<std::int32_t>(2 * oy * g.w + 2 * ox)) + column_of_lane;
            const std::int32_t shift[4] = {0, 1, static_cast<std::int32_t>(g.w), static_cast<std::int32_t>(g.w + 1)};
            B best = taps[0];
            I at = base;
            if (winner) {
                // Unrolled in full, so that taps[] stays in registers at -O2 too (GCC 12 unrolls it
                // only at -O3; at -O2 the CNN's two pools took 2.5x as long).
#pragma GCC unroll 4
                for (int t = 1; t < 4; ++t) {
                    const auto better = beats(taps[t], best);
                    best = simd::select(better, taps[t], best);
                    at = simd::select(simd::mask_cast(better), base + I(shift[t]), at);
                }
            } else {
                best = dl::detail::window_max(taps[0], taps[1], taps[2], taps[3]);
            }
            // Whole vectors where the lanes past the row stay inside the plane (the next row overwrites
            // them): masked stores measured several times slower here (Zen 4).
            const std::int64_t o = oy * g.ow + ox;
            if (o + 16 <= g.oh * g.ow) {
                simd::store(out + o, best);
                if (winner) simd::store(winner + o, at);
            } else {
                _mm512_mask_storeu_ps(out + o, lanes, best);
                if (winner) _mm512_mask_storeu_epi32(winner + o, lanes, at);
            }
        }
    }
    return true;
}
#endif

/// The max over each output's window of one plane, and the plane position it came from (unless
/// `winner` is null: without a gradient to route, nothing reads it).
template <class T>
void max_pool_plane(const T* plane, const window_geometry& g, [[maybe_unused]] const std::vector<std::int32_t>& offsets,
                    T* out, std::int32_t* winner) {
#if defined(__AVX512F__) && !defined(DL_NO_SIMD)
    if constexpr (std::is_same_v<T, float>)
        if (max_pool_2x2(plane, g, out, winner)) return;
#endif
    const std::int64_t outputs = g.oh * g.ow;
    auto one = [&](std::int64_t o) {
        const pool_window win = clipped_window(g, o / g.ow, o % g.ow, true);
        T best = plane[win.h0 * g.w + win.w0];
        std::int64_t at = win.h0 * g.w + win.w0;
        for (std::int64_t i = win.h0; i < win.h1; ++i)
            for (std::int64_t j = win.w0; j < win.w1; ++j)
                if (beats(plane[i * g.w + j], best)) best = plane[i * g.w + j], at = i * g.w + j;
        out[o] = best;
        if (winner) winner[o] = static_cast<std::int32_t>(at);
    };
    std::int64_t o = 0;
#ifndef DL_NO_SIMD
    if constexpr (vector_pooling<T>) {
        using I = simd::batch<std::int32_t>;
        constexpr int W = simd::width<T>;
        for (; o + W <= outputs; o += W) {
            const I first_tap = simd::load(offsets.data() + o);
            if (xsimd::any(first_tap < I(0))) {
                for (std::int64_t k = o; k < o + W; ++k) one(k);
                continue;
            }
            simd::batch<T> best = simd::gather(plane, first_tap);
            I at = first_tap;
            for (std::int64_t i = 0; i < g.kh; ++i)
                for (std::int64_t j = i == 0 ? 1 : 0; j < g.kw; ++j) {
                    const I tap = first_tap + I(std::int32_t(i * g.w + j));
                    const simd::batch<T> v = simd::gather(plane, tap);
                    const auto better = beats(v, best);
                    best = simd::select(better, v, best);
                    at = simd::select(simd::mask_cast(better), tap, at);
                }
            simd::store(out + o, best);
            if (winner) simd::store(winner + o, at);
        }
    }
#endif
    for (; o < outputs; ++o) one(o);
}

}  // namespace autograd::detail

/// Maximum over each kernel window of x [N, C, H, W]; padding reads as -inf. A NaN in a window wins.
template <class T>
[[nodiscard]] Tensor<T> max_pool2d(const Tensor<T>& x, const pool2d_options& o) {
    using namespace autograd::detail;
    static_assert(is_floating_element<T>, "dl::max_pool2d: needs a floating tensor");
    if (auto* r = x.context().recorder())
        return autograd::record_op(
            *r, "max_pool2d",
            autograd::attributes("kernel", describe(o.kernel), "stride", describe(o.stride), "padding",
                                 describe(o.padding), "count_include_pad", o.count_include_pad),
            autograd::op_kind::pure, [](const Tensor<T>& in, const pool2d_options& opt) { return max_pool2d(in, opt); }, x, o);
    check_images(x, "max_pool2d");
    const window_geometry g = pool_geometry(x.shape(), o, "max_pool2d");
    const std::int64_t planes = x.shape()[0] * g.channels, outputs = g.oh * g.ow, inputs = g.h * g.w;
    const op_scope scope(x.context(), "max_pool2d");
    const Tensor<T> in = x.detach().contiguous();
    Tensor<T> out({x.shape()[0], g.channels, g.oh, g.ow}, x.context());
    const bool records = autograd::records(x);
    Tensor<std::int32_t> winner = records ? Tensor<std::int32_t>({x.shape()[0], g.channels, g.oh, g.ow}, x.context())
                                          : Tensor<std::int32_t>();
    auto window = [g](std::int64_t y, std::int64_t xx) { return clipped_window(g, y, xx, true); };
    const std::vector<std::int32_t> offsets = vector_pooling<T> ? window_offsets(g, window) : std::vector<std::int32_t>();
    for_each_image_chunk(planes, x.context(), [&](std::int64_t, std::int64_t first, std::int64_t last) {
        for (std::int64_t p = first; p < last; ++p)
            max_pool_plane(in.data() + p * inputs, g, offsets, out.data() + p * outputs,
                           records ? winner.data() + p * outputs : nullptr);
    });
    if (records)
        autograd::record(
            out,
            [](const Tensor<T>& grad, const Tensor<T>& src, const Tensor<std::int32_t>& win) {
                const op_scope scope(src.context(), "max_pool2d_backward");
                const Tensor<T> g = grad.contiguous();
                const std::int64_t gh = g.shape()[2], gw = g.shape()[3], per_plane = gh * gw;
                const std::int64_t h = src.shape()[2], w = src.shape()[3], plane = h * w;
                T* buffer = autograd::grad_buffer(*autograd::node_of(src)).data();
                // A scatter: each output's gradient goes to its winner. With windows that never overlap a
                // vector gather-add-scatter is legal, but on Zen 4 it measured 2.2x slower than this loop,
                // and so did reading every input's gradient from its window (vector_pooling's gathers).
                for_each_image_chunk(g.shape()[0] * g.shape()[1], src.context(),
                                     [&](std::int64_t, std::int64_t first, std::int64_t last) {
                                         for (std::int64_t p = first; p < last; ++p) {
                                             const T* gp = g.data() + p * per_plane;
                                             const std::int32_t* wp = win.data() + p * per_plane;
                                             T* dx = buffer + p * plane;
                                             for (std::int64_t k = 0; k < per_plane; ++k) dx[wp[k]] += gp[k];
                                         }
                                     });
            },
            x, winner);
    return out;
}

/// Mean over each kernel window of x [N, C, H, W]. With count_include_pad (the default, as PyTorch)
/// padded positions count as zeros in the divisor.
template <class T>
[[nodiscard]] Tensor<T> avg_pool2d(const Tensor<T>& x, const pool2d_options& o) {
    using namespace autograd::detail;
    static_assert(is_floating_element<T>, "dl::avg_pool2d: needs a floating tensor");
    if (auto* r = x.context().recorder())
        return autograd::record_op(
            *r, "avg_pool2d",
            autograd::attributes("kernel", describe(o.kernel), "stride", describe(o.stride), "padding",
                                 describe(o.padding), "count_include_pad", o.count_include_pad),
            autograd::op_kind::pure, [](const Tensor<T>& in, const pool2d_options& opt) { return avg_pool2d(in, opt); }, x, o);
    check_images(x, "avg_pool2d");
    const window_geometry g = pool_geometry(x.shape(), o, "avg_pool2d");
    const bool include_pad = o.count_include_pad;
    return average_pool(
        x, g.oh, g.ow, [g, include_pad](std::int64_t y, std::int64_t xx) { return clipped_window(g, y, xx, include_pad); },
        &g);
}

/// Mean pooling of x [N, C, H, W] to the output size: output (y, x) averages rows
/// [floor(y·H/OH), ceil((y+1)·H/OH)) and the same for columns, as torch's adaptive_avg_pool2d.
template <class T>
[[nodiscard]] Tensor<T> adaptive_avg_pool2d(const Tensor<T>& x, extent2 output) {
    using namespace autograd::detail;
    static_assert(is_floating_element<T>, "dl::adaptive_avg_pool2d: needs a floating tensor");
    if (auto* r = x.context().recorder())
        return autograd::record_op(*r, "adaptive_avg_pool2d", autograd::attributes("output", describe(output)),
                                   autograd::op_kind::pure,
                                   [](const Tensor<T>& in, extent2 out) { return adaptive_avg_pool2d(in, out); }, x, output);
    check_images(x, "adaptive_avg_pool2d");
    check_positive(output, "adaptive_avg_pool2d", "the output size");
    const std::int64_t h = x.shape()[2], w = x.shape()[3];
    if (h == 0 || w == 0) detail::fail("dl::adaptive_avg_pool2d: empty input of shape ", x.shape());
    return average_pool(x, output.h, output.w, [h, w, output](std::int64_t y, std::int64_t xx) {
        const std::int64_t h0 = y * h / output.h, h1 = ((y + 1) * h + output.h - 1) / output.h;
        const std::int64_t w0 = xx * w / output.w, w1 = ((xx + 1) * w + output.w - 1) / output.w;
        return pool_window{h0, h1, w0, w1, (h1 - h0) * (w1 - w0)};
    }, nullptr);
}

}  // namespace dl
