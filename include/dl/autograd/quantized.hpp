#pragma once
// int8 inference for Linear and Conv2d: activations quantized to uint8 with a scale and zero point per tensor,
// weights to int8 symmetrically per output channel, an exact integer GEMM (device/cpu/gemm_int8.hpp,
// AVX-512 VNNI where the target has it) and one float pass that dequantizes, adds the bias and applies
// the activation. The graph's quantization pass (graph/inference.hpp) calibrates the input scales and
// puts this op in place of float linear nodes; it is a public op, usable eagerly too.
//
// With q_x = clamp(round(x·(1/s_x) + z), 0, 255) (one fused multiply-add, ties to even) and q_w[o] = round(w[o] / s_w[o]) in [-127, 127]:
//   y[m, o] = act(float(Σ_k q_x[m, k]·q_w[o, k] − z·Σ_k q_w[o, k]) · (s_x·s_w[o]) + bias[o])
// The sum is exact in int32 (255·127·K stays below 2^31 for K up to 66000).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "../device/cpu/gemm_int8.hpp"
#include "conv.hpp"
#include "node.hpp"
#include "tracing.hpp"

namespace dl {

/// How a float tensor maps to uint8: q = clamp(round(x / scale + zero_point), 0, 255), so that
/// x ≈ scale · (q − zero_point).
struct affine_quantization {
    float scale = 1;
    std::int32_t zero_point = 0;

    /// The quantization covering [lo, hi], widened to contain 0 so that zero is exact (ReLU outputs,
    /// padding).
    [[nodiscard]] static affine_quantization covering(float lo, float hi) {
        if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
            detail::fail("dl::affine_quantization: cannot cover the range [", lo, ", ", hi, "]");
        lo = std::min(lo, 0.0f);
        hi = std::max(hi, 0.0f);
        if (hi == lo) return {};
        const float scale = (hi - lo) / 255.0f;
        return {scale, static_cast<std::int32_t>(std::clamp(std::nearbyint(-lo / scale), 0.0f, 255.0f))};
    }
};

/// A Linear layer's weight [out, in] in int8 for inference: symmetric per output channel
/// (q = round(w / scale[o]), |q| ≤ 127, scale[o] = max |w[o, :]| / 127), packed once for the int8 GEMM.
class int8_weight {
public:
    explicit int8_weight(const Tensor<float>& weight) {
        if (weight.rank() != 2) detail::fail("dl::int8_weight: expected a weight [out, in], got shape ", weight.shape());
        out_ = weight.shape()[0];
        in_ = weight.shape()[1];
        const Tensor<float> w = weight.detach().contiguous();
        const float* data = w.data();
        values_.resize(static_cast<std::size_t>(out_ * in_));
        scales_.assign(static_cast<std::size_t>(out_), 1.0f);
        sums_.assign(static_cast<std::size_t>(out_), 0);
        for (std::int64_t o = 0; o < out_; ++o) {
            const float* row = data + o * in_;
            float largest = 0;
            for (std::int64_t k = 0; k < in_; ++k) {
                if (!std::isfinite(row[k]))
                    detail::fail("dl::int8_weight: weight[", o, ", ", k, "] is ", row[k], ": only finite weights quantize");
                largest = std::max(largest, std::abs(row[k]));
            }
            const float scale = largest > 0 ? largest / 127.0f : 1.0f;
            scales_[static_cast<std::size_t>(o)] = scale;
            for (std::int64_t k = 0; k < in_; ++k) {
                const auto q = static_cast<std::int8_t>(std::clamp(std::nearbyint(row[k] / scale), -127.0f, 127.0f));
                values_[static_cast<std::size_t>(o * in_ + k)] = q;
                sums_[static_cast<std::size_t>(o)] += q;
            }
        }
        // The GEMM multiplies by B = qᵀ [in, out]: q read column-wise.
        packed_.pack({values_.data(), in_, out_, 1, in_});
    }

    [[nodiscard]] std::int64_t out_features() const noexcept { return out_; }
    [[nodiscard]] std::int64_t in_features() const noexcept { return in_; }
    [[nodiscard]] const std::vector<std::int8_t>& values() const noexcept { return values_; }  ///< [out, in]
    [[nodiscard]] const std::vector<float>& scales() const noexcept { return scales_; }
    [[nodiscard]] const std::vector<std::int32_t>& row_sums() const noexcept { return sums_; }  ///< Σ_k q[o, k]
    [[nodiscard]] const detail::packed_s8& packed() const noexcept { return packed_; }

private:
    std::int64_t out_ = 0, in_ = 0;
    std::vector<std::int8_t> values_;
    std::vector<float> scales_;
    std::vector<std::int32_t> sums_;
    detail::packed_s8 packed_;
};

namespace detail {

/// q(x) as affine_quantization defines it, with inverse = 1 / scale and zero = zero_point.
[[nodiscard]] inline std::uint8_t quantize_u8(float x, float inverse, float zero) noexcept {
    const float level = std::clamp(std::fma(x, inverse, zero), 0.0f, 255.0f);
    // Adding 1.5·2^23 rounds to an integer (to nearest, ties to even) held in the low mantissa bits:
    // round() without a call, so loops over this vectorise.
    return static_cast<std::uint8_t>(std::bit_cast<std::uint32_t>(level + 12582912.0f));
}

/// From int32 product sums back to float, per output channel o:
/// y = act(float(sum − offset[o])·scale[o] + bias[o]).
struct int8_output {
    int8_output(const int8_weight& w, affine_quantization input, const Tensor<float>& bias)
        : bias_(bias.defined() ? bias.detach().contiguous() : Tensor<float>()) {
        for (std::size_t o = 0; o < w.scales().size(); ++o) {
            scale.push_back(input.scale * w.scales()[o]);
            offset.push_back(input.zero_point * w.row_sums()[o]);
        }
    }
    [[nodiscard]] const float* bias() const noexcept { return bias_.defined() ? bias_.data() : nullptr; }

    std::vector<float> scale;
    std::vector<std::int32_t> offset;

private:
    Tensor<float> bias_;
};

inline void check_quantization(affine_quantization q, std::string_view op) {
    if (!(q.scale > 0) || q.zero_point < 0 || q.zero_point > 255)
        fail("dl::", op, ": input scale ", q.scale, " and zero point ", q.zero_point, " do not map to uint8");
}

}  // namespace detail

/// act(x·Wᵀ + bias) for x [N, in] float, computed in int8: x quantized by `input`, W given as an
/// int8_weight. Inference only: it has no gradient, and fails if an input would record one.
[[nodiscard]] inline Tensor<float> quantized_linear(const Tensor<float>& x, const std::shared_ptr<const int8_weight>& weight,
                                                    const Tensor<float>& bias, affine_quantization input,
                                                    activation act = activation::none) {
    if (!weight) detail::fail("dl::quantized_linear: no weight");
    if (x.rank() != 2 || x.shape()[1] != weight->in_features())
        detail::fail("dl::quantized_linear: input of shape ", x.shape(), " for a weight of ", weight->in_features(),
                     " input features");
    if (bias.defined() && bias.shape() != Shape{weight->out_features()})
        detail::fail("dl::quantized_linear: bias of shape ", bias.shape(), " for ", weight->out_features(), " outputs");
    detail::check_quantization(input, "quantized_linear");
    if (auto* r = autograd::recorder_of(x, bias))
        return autograd::record_product(
            *r, "quantized_linear",
            autograd::attributes("weight", static_cast<const void*>(weight.get()), "scale", input.scale, "zero_point",
                                 input.zero_point, "act", act),
            {.act = act},
            [](autograd::product_epilogue e) {
                return [a = e.act](const Tensor<float>& in, const std::shared_ptr<const int8_weight>& w, const Tensor<float>& b,
                                   affine_quantization q) { return quantized_linear(in, w, b, q, a); };
            },
            x, weight, bias, input);
    if (autograd::any_records(x, bias))
        detail::fail("dl::quantized_linear: has no gradient (inference only); run it under dl::no_grad");
    Context& ctx = x.context();
    const std::int64_t rows = x.shape()[0], in = weight->in_features(), out = weight->out_features();
    const Tensor<float> xc = x.contiguous();
    Tensor<std::uint8_t> xq({rows, in}, ctx);
    {
        const float* src = xc.data();
        std::uint8_t* dst = xq.data();
        const float inverse = 1.0f / input.scale, zero = static_cast<float>(input.zero_point);
        for (std::int64_t i = 0; i < rows * in; ++i) dst[i] = detail::quantize_u8(src[i], inverse, zero);
    }
    Tensor<std::int32_t> sums({rows, out}, ctx);
    detail::gemm_u8s8({xq.data(), rows, in, in, 1}, weight->packed(), {sums.data(), rows, out, out, 1}, false, ctx);
    Tensor<float> y({rows, out}, ctx);
    const detail::int8_output to_float(*weight, input, bias);
    detail::with_activation(act, [&](auto a) {
        const std::int32_t* s = sums.data();
        float* dst = y.data();
        const float* b = to_float.bias();
        for (std::int64_t i = 0; i < rows; ++i)
            for (std::int64_t o = 0; o < out; ++o) {
                float v = static_cast<float>(s[i * out + o] - to_float.offset[static_cast<std::size_t>(o)]) *
                          to_float.scale[static_cast<std::size_t>(o)];
                if (b) v += b[o];
                dst[i * out + o] = detail::activate<a.value>(v);
            }
    });
    return y;
}

/// conv2d (groups 1) computed in int8: x [N, C, H, W] quantized by `input`, the weight [O, C, kh, kw]
/// given as an int8_weight of its [O, C·kh·kw] reshape and the kernel extent. Each image is lowered to
/// columns (padding reads as 0.0, so as the zero point), quantized, and multiplied by the int8 GEMM.
/// Inference only, like quantized_linear.
[[nodiscard]] inline Tensor<float> quantized_conv2d(const Tensor<float>& x, const std::shared_ptr<const int8_weight>& weight,
                                                    extent2 kernel, const Tensor<float>& bias, affine_quantization input,
                                                    conv2d_options o = {}) {
    using autograd::detail::window_count;
    if (!weight) detail::fail("dl::quantized_conv2d: no weight");
    if (o.groups != 1) detail::fail("dl::quantized_conv2d: groups must be 1, got ", o.groups);
    if (x.rank() != 4 || x.shape()[1] * kernel.h * kernel.w != weight->in_features())
        detail::fail("dl::quantized_conv2d: input of shape ", x.shape(), " for a ", kernel.h, "x", kernel.w,
                     " kernel and a weight of ", weight->in_features(), " inputs per output channel");
    if (bias.defined() && bias.shape() != Shape{weight->out_features()})
        detail::fail("dl::quantized_conv2d: bias of shape ", bias.shape(), " for ", weight->out_features(),
                     " output channels");
    detail::check_quantization(input, "quantized_conv2d");
    if (auto* r = autograd::recorder_of(x, bias))
        return autograd::record_product(
            *r, "quantized_conv2d",
            autograd::attributes("weight", static_cast<const void*>(weight.get()), "kernel", autograd::detail::describe(kernel),
                                 "stride", autograd::detail::describe(o.stride), "padding", autograd::detail::describe(o.padding),
                                 "dilation", autograd::detail::describe(o.dilation), "scale", input.scale, "zero_point",
                                 input.zero_point, "act", o.act),
            {.act = o.act},
            [o](autograd::product_epilogue e) {
                conv2d_options with = o;
                with.act = e.act;
                return [with](const Tensor<float>& in, const std::shared_ptr<const int8_weight>& w, extent2 k,
                              const Tensor<float>& b, affine_quantization q) { return quantized_conv2d(in, w, k, b, q, with); };
            },
            x, weight, kernel, bias, input);
    if (autograd::any_records(x, bias))
        detail::fail("dl::quantized_conv2d: has no gradient (inference only); run it under dl::no_grad");
    const std::int64_t n = x.shape()[0], c = x.shape()[1], channels = weight->out_features();
    const autograd::detail::window_geometry geo{c,
                                                x.shape()[2],
                                                x.shape()[3],
                                                kernel.h,
                                                kernel.w,
                                                window_count(x.shape()[2], kernel.h, o.stride.h, o.padding.h, o.dilation.h),
                                                window_count(x.shape()[3], kernel.w, o.stride.w, o.padding.w, o.dilation.w),
                                                o.stride,
                                                o.padding,
                                                o.dilation};
    if (geo.oh <= 0 || geo.ow <= 0)
        detail::fail("dl::quantized_conv2d: the ", kernel.h, "x", kernel.w, " kernel does not fit the padded input ", x.shape());
    Context& ctx = x.context();
    const std::int64_t k = geo.column_rows(), plane = geo.column_cols();
    Tensor<float> out({n, channels, geo.oh, geo.ow}, ctx);
    Tensor<float> col({k, plane}, ctx);
    Tensor<std::uint8_t> a({plane, k}, ctx);
    Tensor<std::int32_t> sums({plane, channels}, ctx);
    const detail::int8_output to_float(*weight, input, bias);
    const float inverse = 1.0f / input.scale, zero = static_cast<float>(input.zero_point);
    const auto& s = x.strides();
    for (std::int64_t i = 0; i < n; ++i) {
        autograd::detail::im2col(x.data() + i * s[0], s[1], s[2], s[3], geo, col.data(), plane);
        for (std::int64_t p = 0; p < plane; ++p)
            for (std::int64_t r = 0; r < k; ++r) a.data()[p * k + r] = detail::quantize_u8(col.data()[r * plane + p], inverse, zero);
        detail::gemm_u8s8({a.data(), plane, k, k, 1}, weight->packed(), {sums.data(), plane, channels, channels, 1}, false, ctx);
        detail::with_activation(o.act, [&](auto act) {
            const float* b = to_float.bias();
            float* dst = out.data() + i * channels * plane;
            for (std::int64_t ch = 0; ch < channels; ++ch)
                for (std::int64_t p = 0; p < plane; ++p) {
                    float v = static_cast<float>(sums.data()[p * channels + ch] - to_float.offset[static_cast<std::size_t>(ch)]) *
                              to_float.scale[static_cast<std::size_t>(ch)];
                    if (b) v += b[ch];
                    dst[ch * plane + p] = detail::activate<act.value>(v);
                }
        });
    }
    return out;
}

}  // namespace dl
