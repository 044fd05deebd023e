#pragma once
// Batch and layer normalization: y = (x - mean) / sqrt(var + eps) * weight + bias, one node each. The
// forward and the backward are fused expressions over x; the backward uses the closed form
//   dx = rstd * (dx̂ - mean(dx̂) - x̂ * mean(dx̂ * x̂))   (statistics from the batch)
//   dx = rstd * dx̂                                     (fixed statistics, e.g. running ones)
// with dx̂ = g * weight, the means over the normalized dimensions.
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

#include "reduce.hpp"

namespace dl {

namespace autograd::detail {

/// y = (x - mean) * rstd [* weight] [+ bias]; mean and rstd keep the reduced dimensions, weight and
/// bias broadcast to x (either may be a null tensor). `batch_stats`: mean and rstd were computed
/// from x, so the gradient flows through them too.
template <class T>
[[nodiscard]] Tensor<T> normalize(const Tensor<T>& x, const Dims& axes, const Tensor<T>& mean, const Tensor<T>& rstd,
                                  const Tensor<T>& weight, const Tensor<T>& bias, bool batch_stats) {
    Tensor<T> out(x.shape(), x.context());
    {
        no_grad off(x.context());
        const auto xhat = (x - mean) * rstd;
        if (weight.defined() && bias.defined())
            assign(out, xhat * weight + bias);
        else if (weight.defined())
            assign(out, xhat * weight);
        else if (bias.defined())
            assign(out, xhat + bias);
        else
            assign(out, xhat);
    }
    if (any_records(x, weight, bias))
        record(
            out,
            [axes, batch_stats](const Tensor<T>& g, const Tensor<T>& in, const Tensor<T>& m, const Tensor<T>& r,
                                const Tensor<T>& w, const Tensor<T>& b) {
                const auto xhat = (in - m) * r;
                if (auto* n = node_of(w)) accumulate(*n, g * xhat);
                if (auto* n = node_of(b)) accumulate(*n, g);
                auto* n = node_of(in);
                if (!n) return;
                auto input_gradient = [&](const auto& dxhat) {
                    if (!batch_stats) {
                        accumulate(*n, dxhat * r);
                        return;
                    }
                    const Tensor<T> a = dl::mean(dxhat, axes, true), c = dl::mean(dxhat * xhat, axes, true);
                    accumulate(*n, r * (dxhat - a - xhat * c));
                };
                if (w.defined())
                    input_gradient(g * w.detach());
                else
                    input_gradient(g);
            },
            x, mean, rstd, weight, bias);
    return out;
}

/// Mean, biased variance and 1 / sqrt(var + eps) of x over axes (kept as size-1 dimensions), not
/// recorded.
template <class T>
[[nodiscard]] std::tuple<Tensor<T>, Tensor<T>, Tensor<T>> batch_statistics(const Tensor<T>& x, const Dims& axes,
                                                                          double eps) {
    no_grad off(x.context());
    Tensor<T> mean = dl::mean(x, axes, true);
    Tensor<T> var = dl::var(x, axes, true, 0);
    Tensor<T> rstd = rsqrt(var + T(eps));
    return {std::move(mean), std::move(var), std::move(rstd)};
}

}  // namespace autograd::detail

/// Normalizes x over its last `dims` dimensions; weight and bias (null, or of those dimensions' shape)
/// scale and shift the result, as torch.nn.functional.layer_norm.
template <class T>
[[nodiscard]] Tensor<T> layer_norm(const Tensor<T>& x, int dims, const Tensor<T>& weight = {}, const Tensor<T>& bias = {},
                                   double eps = 1e-5) {
    static_assert(is_floating_element<T>, "dl::layer_norm: needs a floating tensor");
    if (dims < 1 || dims > x.rank())
        detail::fail("dl::layer_norm: cannot normalize the last ", dims, " dimensions of shape ", x.shape());
    Dims axes;
    Shape normalized;
    for (int d = x.rank() - dims; d < x.rank(); ++d) axes.push_back(d), normalized.push_back(x.shape()[d]);
    for (const Tensor<T>* p : {&weight, &bias})
        if (p->defined() && p->shape() != normalized)
            detail::fail("dl::layer_norm: weight and bias must have shape ", normalized, ", got ", p->shape());
    if (auto* r = autograd::recorder_of(x, weight, bias))
        return autograd::record_op(
            *r, "layer_norm", autograd::attributes("dims", dims, "eps", eps), autograd::op_kind::pure,
            [](const Tensor<T>& in, int n, const Tensor<T>& w, const Tensor<T>& b, double e) { return layer_norm(in, n, w, b, e); },
            x, dims, weight, bias, eps);
    const auto [mean, var, rstd] = autograd::detail::batch_statistics(x, axes, eps);
    return autograd::detail::normalize(x, axes, mean, rstd, weight, bias, true);
}

/// Normalizes x [N, C, ...] per channel (dimension 1) over the batch and the other dimensions, as
/// torch.nn.functional.batch_norm: in training with the batch's statistics (updating running_mean and
/// running_var, when given, by `momentum` with the unbiased variance), otherwise with the running
/// ones. weight and bias are [C] or null.
template <class T>
[[nodiscard]] Tensor<T> batch_norm(const Tensor<T>& x, const Tensor<T>& running_mean, const Tensor<T>& running_var,
                                   const Tensor<T>& weight, const Tensor<T>& bias, bool training,
                                   double momentum = 0.1, double eps = 1e-5) {
    static_assert(is_floating_element<T>, "dl::batch_norm: needs a floating tensor");
    if (x.rank() < 2) detail::fail("dl::batch_norm: expected input [N, C, ...], got shape ", x.shape());
    const std::int64_t channels = x.shape()[1];
    for (const Tensor<T>* p : {&running_mean, &running_var, &weight, &bias})
        if (p->defined() && p->shape() != Shape{channels})
            detail::fail("dl::batch_norm: statistics, weight and bias must have shape [", channels, "], got ",
                         p->shape());
    if (!training && !(running_mean.defined() && running_var.defined()))
        detail::fail("dl::batch_norm: evaluation needs running_mean and running_var");
    if (auto* r = autograd::recorder_of(x, running_mean, running_var, weight, bias))
        return autograd::record_op(
            *r, "batch_norm", autograd::attributes("training", training, "momentum", momentum, "eps", eps),
            training && running_mean.defined() ? autograd::op_kind::effectful : autograd::op_kind::pure,
            [](const Tensor<T>& in, const Tensor<T>& m, const Tensor<T>& v, const Tensor<T>& w, const Tensor<T>& b,
               bool train, double mom, double e) { return batch_norm(in, m, v, w, b, train, mom, e); },
            x, running_mean, running_var, weight, bias, training, momentum, eps);
    Dims axes{0};
    Shape per_channel{channels};  // [C, 1, ...]: broadcasts against dimension 1 of x
    for (int d = 2; d < x.rank(); ++d) axes.push_back(d), per_channel.push_back(1);
    auto channel_view = [&](const Tensor<T>& t) { return t.defined() ? t.reshape(per_channel) : t; };
    if (!training) {
        const Tensor<T> mean = channel_view(running_mean.detach()).clone();
        const Tensor<T> rstd = rsqrt(channel_view(running_var.detach()) + T(eps));
        return autograd::detail::normalize(x, axes, mean, rstd, channel_view(weight), channel_view(bias), false);
    }
    const std::int64_t count = x.numel() / std::max<std::int64_t>(channels, 1);
    if (count < 2) detail::fail("dl::batch_norm: training needs more than one value per channel, got shape ", x.shape());
    const auto [mean, var, rstd] = autograd::detail::batch_statistics(x, axes, eps);
    if (running_mean.defined()) {
        no_grad off(x.context());
        const T keep = T(1 - momentum), take = T(momentum), unbias = T(double(count) / double(count - 1));
        Tensor<T> rm = running_mean, rv = running_var;  // handles: the updates land in the caller's tensors
        assign(rm, rm * keep + mean.reshape({channels}) * take);
        assign(rv, rv * keep + var.reshape({channels}) * (unbias * take));
    }
    return autograd::detail::normalize(x, axes, mean, rstd, channel_view(weight), channel_view(bias), true);
}

}  // namespace dl
