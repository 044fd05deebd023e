#pragma once
// cross_entropy and nll_loss as one op of their own (rows of [N, C] indexed by class; forward and
// backward each one pass per row, no [N, C] temporary), with the gradient an op too, so a
// differentiated graph (graph/differentiate.hpp) runs the same definition as eager backward. An op
// with a kernel, so it sits with the other ops below graph/; its names stay dl::nn's, where users find
// them through <dl/nn/loss.hpp>.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "../core/creation.hpp"
#include "node.hpp"
#include "tracing.hpp"
#include "views.hpp"

namespace dl::nn {

enum class reduction { none, mean, sum };

struct cross_entropy_options {
    reduction reduce = reduction::mean;
    double label_smoothing = 0;
    std::int64_t ignore_index = -100;
};

namespace detail {

/// log Σ_j exp(row[j]), in double, shifted by the row's maximum.
template <class T>
[[nodiscard]] double log_sum_exp(const T* row, std::int64_t count) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < count; ++j) m = std::max(m, static_cast<double>(row[j]));
    double s = 0;
    for (std::int64_t j = 0; j < count; ++j) s += std::exp(static_cast<double>(row[j]) - m);
    return m + std::log(s);
}

/// The gradient of class_loss with respect to its input, for the loss's gradient g (one element, or
/// [N] without reduction): one pass per row, recomputing each row's log Σ exp. An op of its own, so a
/// differentiated graph (graph/differentiate.hpp) runs the same definition as eager backward.
template <class T>
[[nodiscard]] Tensor<T> class_loss_grad(const Tensor<T>& g, const Tensor<T>& input, const Tensor<std::int64_t>& target,
                                        const cross_entropy_options& o, bool from_log_probs) {
    if (auto* r = autograd::recorder_of(g, input, target))
        return autograd::record_op(
            *r, from_log_probs ? "nll_loss_grad" : "cross_entropy_grad",
            autograd::attributes("reduce", o.reduce, "label_smoothing", o.label_smoothing, "ignore_index", o.ignore_index),
            autograd::op_kind::pure,
            [](const Tensor<T>& gr, const Tensor<T>& in, const Tensor<std::int64_t>& tg, const cross_entropy_options& options,
               bool log_probs) { return class_loss_grad(gr, in, tg, options, log_probs); },
            g, input, target, o, from_log_probs);
    const std::int64_t N = input.shape()[0], C = input.shape()[1];
    const Tensor<T> xs = input.detach().contiguous();
    const Tensor<T> gs = g.detach().contiguous();
    const Tensor<std::int64_t> ts = target.contiguous();
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < N; ++i) counted += ts.data()[i] != o.ignore_index;
    const double scale = o.reduce != reduction::mean ? 1.0
                         : counted                    ? 1.0 / static_cast<double>(counted)
                                                      : std::numeric_limits<double>::quiet_NaN();
    Tensor<T> dx({N, C}, input.context());
    const double eps = o.label_smoothing;
    for (std::int64_t i = 0; i < N; ++i) {
        T* d = dx.data() + i * C;
        const std::int64_t c = ts.data()[i];
        const double gi = static_cast<double>(gs.rank() == 0 ? gs.data()[0] : gs.data()[i]) * scale;
        if (c == o.ignore_index) {
            for (std::int64_t j = 0; j < C; ++j) d[j] = T(0);
            continue;
        }
        const T* row = xs.data() + i * C;
        const double l = from_log_probs ? 0.0 : log_sum_exp(row, C);
        for (std::int64_t j = 0; j < C; ++j) {
            const double p = from_log_probs ? 0.0 : std::exp(static_cast<double>(row[j]) - l);
            const double target_weight = (j == c ? 1 - eps : 0) + eps / C;
            d[j] = static_cast<T>(gi * (from_log_probs ? -target_weight : p - target_weight));
        }
    }
    return dx;
}

/// Cross-entropy of rows of logits [N, C] (log-probabilities when `from_log_probs`, as nll_loss takes)
/// against class indices [N]: one pass per row forward, one per row backward, no [N, C] temporary.
template <class T>
[[nodiscard]] Tensor<T> class_loss(const Tensor<T>& input, const Tensor<std::int64_t>& target,
                                   const cross_entropy_options& o, bool from_log_probs, std::string_view name) {
    if (input.rank() != 2 || target.rank() != 1 || target.shape()[0] != input.shape()[0])
        dl::detail::fail("dl::nn::", name, ": expected input [N, C] and target [N], got ", input.shape(), " and ",
                         target.shape());
    if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
        dl::detail::fail("dl::nn::", name, ": label_smoothing must be in [0, 1], got ", o.label_smoothing);
    if (auto* r = autograd::recorder_of(input, target))
        return autograd::record_op(
            *r, std::string(name),
            autograd::attributes("reduce", o.reduce, "label_smoothing", o.label_smoothing, "ignore_index", o.ignore_index),
            autograd::op_kind::pure,
            [](const Tensor<T>& in, const Tensor<std::int64_t>& tg, const cross_entropy_options& options, bool log_probs,
               std::string_view op) { return class_loss(in, tg, options, log_probs, op); },
            input, target, o, from_log_probs, name);
    const std::int64_t N = input.shape()[0], C = input.shape()[1];
    const Tensor<T> x = input.detach().contiguous();
    const Tensor<std::int64_t> t = target.contiguous();
    Tensor<T> per_row({N}, input.context());
    const double eps = o.label_smoothing;
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < N; ++i) {
        const T* row = x.data() + i * C;
        const std::int64_t c = t.data()[i];
        if (c == o.ignore_index) {
            per_row.data()[i] = T(0);
            continue;
        }
        if (c < 0 || c >= C)
            dl::detail::fail("dl::nn::", name, ": target ", c, " at row ", i, " is not a class in [0, ", C, ")");
        ++counted;
        const double l = from_log_probs ? 0.0 : log_sum_exp(row, C);
        double total = 0;
        if (eps > 0)
            for (std::int64_t j = 0; j < C; ++j) total += static_cast<double>(row[j]);
        // Σ_j q_j (l - x_j) with q = (1 - eps)·onehot(c) + eps / C.
        per_row.data()[i] = static_cast<T>(l - (1 - eps) * static_cast<double>(row[c]) - eps / C * total);
    }
    Tensor<T> out;
    if (o.reduce == reduction::none) {
        out = per_row;
    } else {
        double s = 0;
        for (std::int64_t i = 0; i < N; ++i) s += static_cast<double>(per_row.data()[i]);
        if (o.reduce == reduction::mean)
            s *= counted ? 1.0 / static_cast<double>(counted) : std::numeric_limits<double>::quiet_NaN();
        out = full<T>({}, static_cast<T>(s), input.context());
    }
    if (autograd::records(input))
        autograd::record(
            out,
            [o, from_log_probs](const Tensor<T>& g, const Tensor<T>& in, const Tensor<std::int64_t>& tg) {
                autograd::accumulate(*autograd::node_of(in), class_loss_grad(g, in.detach(), tg, o, from_log_probs));
            },
            input, t);
    return out;
}

}  // namespace detail

}  // namespace dl::nn
