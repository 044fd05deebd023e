#pragma once
// Direct convolution for layers whose windows hold few values: C·kh·kw of 9, 25 or 27 (a 3×3 or 5×5
// kernel over one gray or three color channels, the first layer of most image models), at stride 1,
// without dilation, in one group. im2col turns such a layer into products with K = 9 to 27, too short
// for the GEMM: on the Fashion-MNIST CNN's first layer (1→32, 28×28) they ran at a quarter of its speed,
// behind an im2col copy and a packing copy of a matrix nine times the image.
//
// Here each image is copied once into a zero-padded buffer of rows Wp = W + 2·pad_w wide, where window
// value t = (c, i, j) of output (y, x) is the buffer at (y, x) plus a constant offset (c·Hp + i)·Wp + j.
// A vector of outputs along a row is then bias + Σ_t w[o][t] · (the buffer at the vector + offset t):
// the kernel loads the Taps input vectors once and reuses them for every output channel. Rows are
// covered by whole vectors, the last one ending at the row's end and overlapping its predecessor, which
// needs no masked loads or stores (the forward writes the overlap twice, the same values; the weight
// gradient counts it once).
//
// Each output is the definition's sum (bias, then taps in order, fused multiply-adds), so NaN and Inf
// land where the definition puts them and no fallback is needed. Images write disjoint outputs and the
// weight gradient sums fixed chunks of images in order: results do not depend on the thread count.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "gemm.hpp"

namespace dl::detail {

/// A stride-1, dilation-1, single-group convolution of x [N, C, H, W] by kh×kw kernels into
/// [N, O, OH, OW].
struct direct_conv_shape {
    std::int64_t images, in_channels, h, w, out_channels, kh, kw, pad_h, pad_w;
    [[nodiscard]] std::int64_t padded_h() const noexcept { return h + 2 * pad_h; }
    [[nodiscard]] std::int64_t padded_w() const noexcept { return w + 2 * pad_w; }
    [[nodiscard]] std::int64_t oh() const noexcept { return padded_h() - kh + 1; }
    [[nodiscard]] std::int64_t ow() const noexcept { return padded_w() - kw + 1; }
    [[nodiscard]] std::int64_t taps() const noexcept { return in_channels * kh * kw; }
};

/// The window sizes C·kh·kw the direct kernels are compiled for (each is a template instance, with its
/// input vectors or accumulators in registers).
[[nodiscard]] constexpr bool direct_conv_taps(std::int64_t taps) noexcept { return taps == 9 || taps == 25 || taps == 27; }

/// Calls f(std::integral_constant<int, taps>) for one of the direct_conv_taps sizes.
template <class F>
void with_direct_conv_taps(std::int64_t taps, F&& f) {
    if (taps == 9) f(std::integral_constant<int, 9>{});
    else if (taps == 25) f(std::integral_constant<int, 25>{});
    else f(std::integral_constant<int, 27>{});
}

/// Image n of x (read through its strides xs) into dst [C][Hp][Wp], zero outside the image.
template <class T>
void pad_image(const T* x, const std::array<std::int64_t, 4>& xs, const direct_conv_shape& s, std::int64_t n, T* dst) {
    const std::int64_t hp = s.padded_h(), wp = s.padded_w();
    std::fill_n(dst, s.in_channels * hp * wp, T(0));
    for (std::int64_t c = 0; c < s.in_channels; ++c)
        for (std::int64_t y = 0; y < s.h; ++y) {
            const T* src = x + n * xs[0] + c * xs[1] + y * xs[2];
            T* row = dst + (c * hp + y + s.pad_h) * wp + s.pad_w;
            for (std::int64_t k = 0; k < s.w; ++k) row[k] = src[k * xs[3]];
        }
}

/// Offsets in the padded buffer of window value t = (c·kh + i)·kw + j, the weights' order.
template <int Taps>
[[nodiscard]] std::array<std::int64_t, Taps> tap_offsets(const direct_conv_shape& s) {
    std::array<std::int64_t, Taps> off{};
    for (std::int64_t c = 0, t = 0; c < s.in_channels; ++c)
        for (std::int64_t i = 0; i < s.kh; ++i)
            for (std::int64_t j = 0; j < s.kw; ++j) off[std::size_t(t++)] = (c * s.padded_h() + i) * s.padded_w() + j;
    return off;
}

/// f(x0, overlap) for vectors of `width` outputs covering a row of ow ≥ width outputs: whole vectors,
/// then, when ow is not a multiple of width, one ending at ow whose first `overlap` lanes its
/// predecessor already covered.
template <class F>
DL_INLINE void for_each_row_vector(std::int64_t ow, std::int64_t width, F&& f) {
    std::int64_t x0 = 0;
    for (; x0 + width <= ow; x0 += width) f(x0, std::int64_t{0});
    if (x0 < ow) f(ow - width, x0 + width - ow);
}

/// The vector type of the direct kernels: a batch of T where xsimd has one, else T itself.
template <class T>
using direct_conv_vector = std::conditional_t<simd::has_batch<T>, xsimd::batch<T>, T>;

/// Whether the direct kernels cover this convolution: stride 1, no dilation, one group, a window size
/// they are compiled for, and output rows at least one vector wide.
template <class T>
[[nodiscard]] bool direct_conv_covers(const direct_conv_shape& s) {
    return direct_conv_taps(s.taps()) && s.ow() >= simd::width<T> && s.oh() > 0;
}

/// out [N, O, OH, OW] (contiguous) = act(conv(x, w) + bias); w [O][C][kh][kw] contiguous, bias [O] or
/// null. The shape must be one direct_conv_covers.
template <class T>
void direct_conv(const T* x, const std::array<std::int64_t, 4>& xs, const direct_conv_shape& s, const T* w,
                 const T* bias, activation act, T* out, Context& ctx) {
    using V = direct_conv_vector<T>;
    const std::int64_t O = s.out_channels, OH = s.oh(), OW = s.ow(), wp = s.padded_w();
    const op_scope scope(ctx, "conv2d_direct", 2.0 * double(s.images * O * OH * OW * s.taps()),
                               double(sizeof(T)) * double(s.images) * double(s.in_channels * s.h * s.w + O * OH * OW));
    with_direct_conv_taps(s.taps(), [&](auto taps) {
        constexpr int Taps = taps.value;
        const auto off = tap_offsets<Taps>(s);
        with_activation(act, [&](auto a) {
            ctx.parallel_for(s.images, [&](std::int64_t n) {
                thread_local std::vector<T> padded;
                padded.resize(std::size_t(s.in_channels * s.padded_h() * wp));
                pad_image(x, xs, s, n, padded.data());
                for (std::int64_t y = 0; y < OH; ++y)
                    for_each_row_vector(OW, simd::width<T>, [&](std::int64_t x0, std::int64_t) {
                        const T* at = padded.data() + y * wp + x0;
                        V in[Taps];
                        // Unrolled in full, so that in[] stays in registers at -O2 too (GCC 12 unrolls
                        // these only at -O3; at -O2 this kernel took 9% of a CNN step's time, not 6.5%).
#pragma GCC unroll 32
                        for (int t = 0; t < Taps; ++t) in[t] = simd::load_as<V>(at + off[std::size_t(t)]);
                        for (std::int64_t o = 0; o < O; ++o) {
                            const T* wo = w + o * Taps;
                            V acc(bias ? bias[o] : T(0));
#pragma GCC unroll 32
                            for (int t = 0; t < Taps; ++t) acc = simd::fma(V(wo[t]), in[t], acc);
                            simd::store_as(out + ((n * O + o) * OH + y) * OW + x0, activate<a.value>(acc));
                        }
                    });
            });
        });
    });
}

/// Image n of x (read through its strides xs) into dst [C][Hp][2][Wh], Wh = ⌈Wp / 2⌉: each zero-padded
/// row split into its even and its odd columns. Output column 2k + p then reads window column j at
/// parity (p + j) mod 2, index k + (p + j) / 2: consecutive k are consecutive in memory for both
/// parities, so a vector of outputs at even (or odd) columns loads its taps whole.
template <class T>
void pad_image_split(const T* x, const std::array<std::int64_t, 4>& xs, const direct_conv_shape& s, std::int64_t n, T* dst) {
    const std::int64_t hp = s.padded_h(), wh = (s.padded_w() + 1) / 2;
    std::fill_n(dst, s.in_channels * hp * 2 * wh, T(0));
    for (std::int64_t c = 0; c < s.in_channels; ++c)
        for (std::int64_t y = 0; y < s.h; ++y) {
            const T* src = x + n * xs[0] + c * xs[1] + y * xs[2];
            T* row = dst + (c * hp + y + s.pad_h) * 2 * wh;
            for (std::int64_t parity = 0; parity < 2; ++parity) {  // a loop per half: no scatter
                T* half = row + parity * wh;
                for (std::int64_t k = (parity + s.pad_w) % 2; k < s.w; k += 2) half[(k + s.pad_w) >> 1] = src[k * xs[3]];
            }
        }
}

/// out [N, O, OH / 2, OW / 2] (contiguous) = the 2×2 stride-2 max pool of act(conv(x, w) + bias), as
/// max_pool2d(direct_conv(...)) gives it bit for bit, without the convolution's output ever reaching
/// memory: the four outputs of each window are summed as direct_conv sums them (even and odd columns
/// from the split rows of pad_image_split), staged per output channel, and reduced in the window's
/// order. Requires OH, OW ≥ 2; a vector of pooled outputs may run past the row (its lanes read the
/// buffer's zero tail or the next row, and are overwritten or not stored).
template <class T>
void direct_conv_max_pool(const T* x, const std::array<std::int64_t, 4>& xs, const direct_conv_shape& s, const T* w,
                          const T* bias, activation act, T* out, Context& ctx) {
    using V = direct_conv_vector<T>;
    constexpr int W = simd::width<T>;
    const std::int64_t O = s.out_channels, PH = s.oh() / 2, PW = s.ow() / 2, hp = s.padded_h(), wh = (s.padded_w() + 1) / 2;
    const op_scope scope(ctx, "conv2d_direct", 2.0 * double(s.images * O * 4 * PH * PW * s.taps()),
                               double(sizeof(T)) * double(s.images) * double(s.in_channels * s.h * s.w + O * PH * PW));
    with_direct_conv_taps(s.taps(), [&](auto taps) {
        constexpr int Taps = taps.value;
        std::array<std::array<std::int64_t, Taps>, 2> off{};  // [output column parity][tap]
        for (std::int64_t p = 0; p < 2; ++p)
            for (std::int64_t c = 0, t = 0; c < s.in_channels; ++c)
                for (std::int64_t i = 0; i < s.kh; ++i)
                    for (std::int64_t j = 0; j < s.kw; ++j, ++t)
                        off[std::size_t(p)][std::size_t(t)] = ((c * hp + i) * 2 + (p + j) % 2) * wh + (p + j) / 2;
        with_activation(act, [&](auto a) {
            ctx.parallel_for(s.images, [&](std::int64_t n) {
                thread_local std::vector<T> padded, staged;
                padded.resize(std::size_t(s.in_channels * hp * 2 * wh + 2 * W + s.kw));
                std::fill(padded.end() - (2 * W + s.kw), padded.end(), T(0));
                staged.resize(std::size_t(O * 4 * W));
                pad_image_split(x, xs, s, n, padded.data());
                for (std::int64_t py = 0; py < PH; ++py)
                    for (std::int64_t k0 = 0; k0 < PW; k0 += W) {
                        for (int q = 0; q < 4; ++q) {  // the window's outputs in row-major order
                            const int r = q / 2, p = q % 2;
                            const T* at = padded.data() + (2 * py + r) * 2 * wh + k0;
                            V in[Taps];
#pragma GCC unroll 32
                            for (int t = 0; t < Taps; ++t) in[t] = simd::load_as<V>(at + off[std::size_t(p)][std::size_t(t)]);
                            for (std::int64_t o = 0; o < O; ++o) {
                                const T* wo = w + o * Taps;
                                V acc(bias ? bias[o] : T(0));
#pragma GCC unroll 32
                                for (int t = 0; t < Taps; ++t) acc = simd::fma(V(wo[t]), in[t], acc);
                                simd::store_as(staged.data() + (o * 4 + q) * W, activate<a.value>(acc));
                            }
                        }
                        // A whole vector where its lanes past the row stay in the plane: the next row,
                        // written after this one, overwrites them.
                        const bool whole = (py * PW + k0 + W <= PH * PW);
                        for (std::int64_t o = 0; o < O; ++o) {
                            const T* st = staged.data() + o * 4 * W;
                            const V best = window_max(simd::load_as<V>(st), simd::load_as<V>(st + W),
                                                      simd::load_as<V>(st + 2 * W), simd::load_as<V>(st + 3 * W));
                            T* dst = out + ((n * O + o) * PH + py) * PW + k0;
                            if (whole)
                                simd::store_as(dst, best);
                            else
                                simd::store_first_as(dst, best, PW - k0);
                        }
                    }
            });
        });
    });
}

/// dw [O][C][kh][kw] = the weight gradient of direct_conv for the output gradient gy (contiguous
/// [N, O, OH, OW]). Images are summed in `chunks` fixed ranges (a number that must not depend on the
/// thread count), each chunk in vector lanes, then the chunks in order.
template <class T>
void direct_conv_weight_gradient(const T* x, const std::array<std::int64_t, 4>& xs, const direct_conv_shape& s,
                                 const T* gy, std::int64_t chunks, T* dw, Context& ctx) {
    using V = direct_conv_vector<T>;
    const std::int64_t O = s.out_channels, OH = s.oh(), OW = s.ow(), wp = s.padded_w();
    const std::int64_t plane = s.in_channels * s.padded_h() * wp;
    const op_scope scope(ctx, "conv2d_direct_backward", 2.0 * double(s.images * O * OH * OW * s.taps()),
                               double(sizeof(T)) * double(s.images) * double(s.in_channels * s.h * s.w + O * OH * OW));
    with_direct_conv_taps(s.taps(), [&](auto taps) {
        constexpr int Taps = taps.value;
        const auto off = tap_offsets<Taps>(s);
        std::vector<T> partial(std::size_t(chunks * O * Taps));
        ctx.parallel_for(chunks, [&](std::int64_t chunk) {
            const std::int64_t first = chunk * s.images / chunks, last = (chunk + 1) * s.images / chunks;
            thread_local std::vector<T> padded;
            padded.resize(std::size_t((last - first) * plane));
            for (std::int64_t n = first; n < last; ++n) pad_image(x, xs, s, n, padded.data() + (n - first) * plane);
            for (std::int64_t o = 0; o < O; ++o) {
                V acc[Taps];
#pragma GCC unroll 32
                for (auto& a : acc) a = V(T(0));
                for (std::int64_t n = first; n < last; ++n)
                    for (std::int64_t y = 0; y < OH; ++y) {
                        const T* g = gy + ((n * O + o) * OH + y) * OW;
                        const T* row = padded.data() + (n - first) * plane + y * wp;
                        for_each_row_vector(OW, simd::width<T>, [&](std::int64_t x0, std::int64_t overlap) {
                            V gv = simd::load_as<V>(g + x0);
                            if constexpr (simd::is_batch<V>)
                                if (overlap) {
                                    alignas(64) T lane[simd::width<T>];
                                    for (int k = 0; k < simd::width<T>; ++k) lane[k] = T(k);
                                    gv = simd::select(V::load_aligned(lane) >= V(T(overlap)), gv, V(T(0)));
                                }
#pragma GCC unroll 32
                            for (int t = 0; t < Taps; ++t)
                                acc[t] = simd::fma(gv, simd::load_as<V>(row + x0 + off[std::size_t(t)]), acc[t]);
                        });
                    }
                for (int t = 0; t < Taps; ++t) {
                    T total;
                    if constexpr (simd::is_batch<V>) total = xsimd::hadd(acc[t]);
                    else total = acc[t];
                    partial[std::size_t((chunk * O + o) * Taps + t)] = total;
                }
            }
        });
        for (std::int64_t k = 0; k < O * Taps; ++k) {
            T total = partial[std::size_t(k)];
            for (std::int64_t chunk = 1; chunk < chunks; ++chunk) total += partial[std::size_t(chunk * O * Taps + k)];
            dw[k] = total;
        }
    });
}

}  // namespace dl::detail
