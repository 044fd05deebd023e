#pragma once
// The public reductions, over all elements (axes empty) or the given axes. Each consumes a tensor or an
// elementwise expression without materialising it, and records its backward when the input requires
// grad: the gradient of the reduction and of the expression under it form one fused expression.
#include <cstdint>

#include "elementwise.hpp"

namespace dl {

namespace autograd::detail {

/// Records the reduction out = reduce(e, axes) with `rule(x, g, y, n)`: the gradient reaching the
/// reduction's input x, given the output's gradient g and value y (both broadcast to x's shape) and
/// the number n of elements folded into each output.
template <class R, class E, class Rule>
void record_reduction(Tensor<R>& out, const E& e, const Dims& axes, Rule rule) {
    if constexpr (is_floating_element<R> && differentiable<E>) {
        if (!expression_records(e)) return;
        const Tensor<R> value = out;
        record(
            out,
            [axes, rule](const Tensor<R>& g, const auto& x, const Tensor<R>& y) {
                const Shape in = shape_of(x);
                const auto red = dl::detail::parse_axes(axes, in.size(), "backward");
                Shape kept = in;
                std::int64_t n = 1;
                for (int d = 0; d < in.size(); ++d)
                    if (red.mask[d]) {
                        n *= in[d];
                        kept[d] = 1;
                    }
                const Tensor<R> g_full = g.reshape(kept).expand(in), y_full = y.reshape(kept).expand(in);
                send_gradient(x, rule(x, g_full, y_full, n));
            },
            own(e), value);
    }
}

}  // namespace autograd::detail

// A traced reduction records its operand (an expression becomes its chain of ops) and then itself, as
// one op whose kernel is the same reduction of a tensor.
// (The kernel is a generic lambda with its result type spelled out: the reduction's own result type is
// not deduced yet where the kernel is defined.)
#define DL_REDUCTION_PREAMBLE(name, accumulator, attributes, ...)                                     \
    static_assert(expression<E>, "dl::" #name ": the argument must be a Tensor or an elementwise expression"); \
    if (Context* traced = context_of(e); traced && traced->recorder())                               \
        return autograd::record_op(                                                                   \
            *traced->recorder(), #name, attributes, autograd::op_kind::pure,                          \
            [=](const auto& x) -> decltype(detail::reduce(x, Dims{}, false, accumulator, #name)) { \
                return name(x __VA_OPT__(, ) __VA_ARGS__);                                            \
            },                                                                                        \
            Tensor<value_t<E>>(e))

template <class E>
[[nodiscard]] auto sum(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(sum, (detail::sum_acc<value_t<E>>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    auto out = detail::reduce(e, axes, keepdim, detail::sum_acc<value_t<E>>{}, "sum");
    autograd::detail::record_reduction(out, e, axes, [](const auto&, const auto& g, const auto&, std::int64_t) {
        return g;
    });
    return out;
}
template <class E>
[[nodiscard]] auto mean(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(mean, (detail::mean_acc<value_t<E>>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    auto out = detail::reduce(e, axes, keepdim, detail::mean_acc<value_t<E>>{}, "mean");
    autograd::detail::record_reduction(out, e, axes, [](const auto&, const auto& g, const auto&, std::int64_t n) {
        return g * (1.0 / static_cast<double>(n));
    });
    return out;
}
/// The gradient assumes no element is zero (it divides the product by each element).
template <class E>
[[nodiscard]] auto prod(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(prod, (detail::prod_acc<value_t<E>>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    auto out = detail::reduce(e, axes, keepdim, detail::prod_acc<value_t<E>>{}, "prod");
    autograd::detail::record_reduction(out, e, axes, [](const auto& x, const auto& g, const auto& y, std::int64_t) {
        return g * y / x;
    });
    return out;
}

namespace autograd::detail {
/// Gradient of max/min: shared evenly by the elements equal to the result.
struct extreme_rule {
    Dims axes;
    template <class X, class R>
    auto operator()(const X& x, const Tensor<R>& g, const Tensor<R>& y, std::int64_t) const {
        Tensor<std::int64_t> ties = dl::detail::reduce(x == y, axes, true, dl::detail::sum_acc<bool>{}, "max");
        return where(x == y, g / cast<R>(ties.expand(shape_of(x))), R(0));
    }
};
}  // namespace autograd::detail

template <class E>
[[nodiscard]] auto max(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(max, (detail::extreme_acc<value_t<E>, true>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    auto out = detail::reduce(e, axes, keepdim, detail::extreme_acc<value_t<E>, true>{}, "max");
    autograd::detail::record_reduction(out, e, axes, autograd::detail::extreme_rule{axes});
    return out;
}
template <class E>
[[nodiscard]] auto min(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(min, (detail::extreme_acc<value_t<E>, false>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    auto out = detail::reduce(e, axes, keepdim, detail::extreme_acc<value_t<E>, false>{}, "min");
    autograd::detail::record_reduction(out, e, axes, autograd::detail::extreme_rule{axes});
    return out;
}
/// Index of the first maximum along `axis` (of the flattened tensor when axis is not given).
template <class E>
[[nodiscard]] Tensor<std::int64_t> argmax(const E& e) {
    DL_REDUCTION_PREAMBLE(argmax, (detail::arg_extreme_acc<value_t<E>, true>{}), "");
    return detail::reduce(e, {}, false, detail::arg_extreme_acc<value_t<E>, true>{}, "argmax");
}
template <class E>
[[nodiscard]] Tensor<std::int64_t> argmax(const E& e, std::int64_t axis, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(argmax, (detail::arg_extreme_acc<value_t<E>, true>{}), autograd::attributes("axis", axis, "keepdim", keepdim), axis, keepdim);
    return detail::reduce(e, {axis}, keepdim, detail::arg_extreme_acc<value_t<E>, true>{}, "argmax");
}
template <class E>
[[nodiscard]] Tensor<std::int64_t> argmin(const E& e) {
    DL_REDUCTION_PREAMBLE(argmin, (detail::arg_extreme_acc<value_t<E>, false>{}), "");
    return detail::reduce(e, {}, false, detail::arg_extreme_acc<value_t<E>, false>{}, "argmin");
}
template <class E>
[[nodiscard]] Tensor<std::int64_t> argmin(const E& e, std::int64_t axis, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(argmin, (detail::arg_extreme_acc<value_t<E>, false>{}), autograd::attributes("axis", axis, "keepdim", keepdim), axis, keepdim);
    return detail::reduce(e, {axis}, keepdim, detail::arg_extreme_acc<value_t<E>, false>{}, "argmin");
}
/// Variance with `correction` subtracted from the count (1: unbiased, as PyTorch's default).
template <class E>
[[nodiscard]] auto var(const E& e, const Dims& axes = {}, bool keepdim = false, double correction = 1) {
    DL_REDUCTION_PREAMBLE(var, (detail::moments_acc<value_t<E>>{correction, false}), autograd::attributes("axes", axes, "keepdim", keepdim, "correction", correction), axes, keepdim, correction);
    auto out = detail::reduce(e, axes, keepdim, detail::moments_acc<value_t<E>>{correction, false}, "var");
    autograd::detail::record_reduction(
        out, e, axes, [axes, correction](const auto& x, const auto& g, const auto& y, std::int64_t n) {
            using R = value_t<decltype(y)>;
            Tensor<R> m = detail::reduce(x, axes, true, detail::mean_acc<R>{}, "var");
            return g * (2.0 / (static_cast<double>(n) - correction)) * (x - m.expand(shape_of(x)));
        });
    return out;
}
template <class E>
[[nodiscard]] auto std(const E& e, const Dims& axes = {}, bool keepdim = false, double correction = 1) {
    DL_REDUCTION_PREAMBLE(std, (detail::moments_acc<value_t<E>>{correction, true}), autograd::attributes("axes", axes, "keepdim", keepdim, "correction", correction), axes, keepdim, correction);
    auto out = detail::reduce(e, axes, keepdim, detail::moments_acc<value_t<E>>{correction, true}, "std");
    autograd::detail::record_reduction(
        out, e, axes, [axes, correction](const auto& x, const auto& g, const auto& y, std::int64_t n) {
            using R = value_t<decltype(y)>;
            Tensor<R> m = detail::reduce(x, axes, true, detail::mean_acc<R>{}, "std");
            return g * (x - m.expand(shape_of(x))) / (y * (static_cast<double>(n) - correction));
        });
    return out;
}
/// The p-norm; its gradient is 0 where the norm is 0.
template <class E>
[[nodiscard]] auto norm(const E& e, double p = 2, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(norm, (detail::norm_acc<value_t<E>>{p}), autograd::attributes("p", p, "axes", axes, "keepdim", keepdim), p, axes, keepdim);
    if (!(p > 0)) detail::fail("dl::norm: p must be positive, got ", p);
    auto out = detail::reduce(e, axes, keepdim, detail::norm_acc<value_t<E>>{p}, "norm");
    autograd::detail::record_reduction(out, e, axes, [p](const auto& x, const auto& g, const auto& y, std::int64_t) {
        using R = value_t<decltype(y)>;
        return where(y == R(0), R(0), g * sign(x) * pow(abs(x), R(p - 1)) / pow(y, R(p - 1)));
    });
    return out;
}
template <class E>
[[nodiscard]] auto logsumexp(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(logsumexp, (detail::logsumexp_acc<value_t<E>>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    auto out = detail::reduce(e, axes, keepdim, detail::logsumexp_acc<value_t<E>>{}, "logsumexp");
    autograd::detail::record_reduction(out, e, axes, [](const auto& x, const auto& g, const auto& y, std::int64_t) {
        return g * exp(x - y);
    });
    return out;
}
template <class E>
[[nodiscard]] Tensor<bool> any(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(any, (detail::any_all_acc<true>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    return detail::reduce(e, axes, keepdim, detail::any_all_acc<true>{}, "any");
}
template <class E>
[[nodiscard]] Tensor<bool> all(const E& e, const Dims& axes = {}, bool keepdim = false) {
    DL_REDUCTION_PREAMBLE(all, (detail::any_all_acc<false>{}), autograd::attributes("axes", axes, "keepdim", keepdim), axes, keepdim);
    return detail::reduce(e, axes, keepdim, detail::any_all_acc<false>{}, "all");
}
#undef DL_REDUCTION_PREAMBLE

}  // namespace dl
