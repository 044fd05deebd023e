#pragma once
// softmax and log_softmax along one dimension, shifted by the maximum so that large inputs do not
// overflow, with their backward.
#include <cstdint>
#include <utility>

#include "reduce.hpp"

namespace dl {

namespace autograd::detail {
/// The row maximum m and log Σ exp(x - m) along dim, keeping the dimension (computed without
/// recording). Kept apart rather than added: m + log s rounds to the precision of m, which for large
/// logits loses the digits that x - m keeps.
template <class T>
[[nodiscard]] std::pair<Tensor<T>, Tensor<T>> softmax_shift(const Tensor<T>& x, int dim) {
    Tensor<T> m = dl::detail::reduce(x, {dim}, true, dl::detail::extreme_acc<T, true>{}, "softmax");
    // A row holding +inf or NaN, or only -inf, has a maximum that makes x - m NaN, so the whole row
    // comes out NaN, as in PyTorch.
    Tensor<T> s = dl::detail::reduce(exp(x - m.expand(x.shape())), {dim}, true, dl::detail::sum_acc<T>{}, "softmax");
    s = log(s);
    return {m.expand(x.shape()), s.expand(x.shape())};
}
}  // namespace autograd::detail

template <class T>
[[nodiscard]] Tensor<T> log_softmax(const Tensor<T>& x, std::int64_t dim = -1) {
    static_assert(is_floating_element<T>, "dl::log_softmax: needs a floating tensor");
    const int d = wrap_dim(dim, x.rank(), "log_softmax");
    if (auto* r = x.context().recorder())
        return autograd::record_op(*r, "log_softmax", autograd::attributes("dim", d), autograd::op_kind::pure,
                                   [](const Tensor<T>& in, int axis) { return log_softmax(in, axis); }, x, d);
    Tensor<T> out(x.shape(), x.context());
    {
        no_grad off(x.context());
        const auto [m, log_s] = autograd::detail::softmax_shift(x, d);
        assign(out, x - m - log_s);
    }
    if (autograd::records(x))
        autograd::record(
            out,
            [d](const Tensor<T>& g, const Tensor<T>& in, const Tensor<T>& y) {
                Tensor<T> total = detail::reduce(g, {d}, true, detail::sum_acc<T>{}, "log_softmax");
                autograd::accumulate(*autograd::node_of(in), g - exp(y) * total.expand(g.shape()));
            },
            x, out.detach());
    return out;
}

template <class T>
[[nodiscard]] Tensor<T> softmax(const Tensor<T>& x, std::int64_t dim = -1) {
    static_assert(is_floating_element<T>, "dl::softmax: needs a floating tensor");
    const int d = wrap_dim(dim, x.rank(), "softmax");
    if (auto* r = x.context().recorder())
        return autograd::record_op(*r, "softmax", autograd::attributes("dim", d), autograd::op_kind::pure,
                                   [](const Tensor<T>& in, int axis) { return softmax(in, axis); }, x, d);
    Tensor<T> out(x.shape(), x.context());
    {
        no_grad off(x.context());
        const auto [m, log_s] = autograd::detail::softmax_shift(x, d);
        assign(out, exp(x - m - log_s));
    }
    if (autograd::records(x))
        autograd::record(
            out,
            [d](const Tensor<T>& g, const Tensor<T>& in, const Tensor<T>& y) {
                Tensor<T> dot = detail::reduce(g * y, {d}, true, detail::sum_acc<T>{}, "softmax");
                autograd::accumulate(*autograd::node_of(in), y * (g - dot.expand(g.shape())));
            },
            x, out.detach());
    return out;
}

}  // namespace dl
