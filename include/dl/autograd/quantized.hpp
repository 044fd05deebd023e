#pragma once
// int8 inference for Linear: activations quantized to uint8 with a scale and zero point per tensor,
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
    if (!(input.scale > 0) || input.zero_point < 0 || input.zero_point > 255)
        detail::fail("dl::quantized_linear: input scale ", input.scale, " and zero point ", input.zero_point,
                     " do not map to uint8");
    if (auto* r = autograd::recorder_of(x, bias))
        return autograd::record_product(
            *r, "quantized_linear",
            autograd::attributes("weight", static_cast<const void*>(weight.get()), "scale", input.scale, "zero_point",
                                 input.zero_point, "act", act),
            act,
            [](activation a) {
                return [a](const Tensor<float>& in, const std::shared_ptr<const int8_weight>& w, const Tensor<float>& b,
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
        for (std::int64_t i = 0; i < rows * in; ++i) {
            const float level = std::clamp(std::fma(src[i], inverse, zero), 0.0f, 255.0f);
            // Adding 1.5·2^23 rounds to an integer (to nearest, ties to even) held in the low mantissa
            // bits: round() without a call, so the loop vectorises.
            dst[i] = static_cast<std::uint8_t>(std::bit_cast<std::uint32_t>(level + 12582912.0f));
        }
    }
    Tensor<std::int32_t> sums({rows, out}, ctx);
    detail::gemm_u8s8({xq.data(), rows, in, in, 1}, weight->packed(), {sums.data(), rows, out, out, 1}, false, ctx);
    Tensor<float> y({rows, out}, ctx);
    const Tensor<float> b = bias.defined() ? bias.detach().contiguous() : Tensor<float>();
    std::vector<float> combined(static_cast<std::size_t>(out));
    std::vector<std::int32_t> offset(static_cast<std::size_t>(out));
    for (std::int64_t o = 0; o < out; ++o) {
        combined[static_cast<std::size_t>(o)] = input.scale * weight->scales()[static_cast<std::size_t>(o)];
        offset[static_cast<std::size_t>(o)] = input.zero_point * weight->row_sums()[static_cast<std::size_t>(o)];
    }
    detail::with_activation(act, [&](auto a) {
        const std::int32_t* s = sums.data();
        float* dst = y.data();
        const float* bias_data = b.defined() ? b.data() : nullptr;
        for (std::int64_t i = 0; i < rows; ++i)
            for (std::int64_t o = 0; o < out; ++o) {
                float v = static_cast<float>(s[i * out + o] - offset[static_cast<std::size_t>(o)]) *
                          combined[static_cast<std::size_t>(o)];
                if (bias_data) v += bias_data[o];
                dst[i * out + o] = detail::activate<a.value>(v);
            }
    });
    return y;
}

}  // namespace dl
