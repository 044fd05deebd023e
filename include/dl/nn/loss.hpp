#pragma once
// Losses. Most are elementwise expressions under a reduction, so forward and backward are each one
// fused loop; cross_entropy and nll_loss index by class and are ops of their own.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "../autograd/class_loss.hpp"
#include "../autograd/reduce.hpp"
#include "../autograd/softmax.hpp"

namespace dl::nn {

namespace detail {
template <class E>
[[nodiscard]] auto reduce_loss(E&& e, reduction r) {
    using T = value_t<E>;
    if (r == reduction::mean) return dl::mean(e);
    if (r == reduction::sum) return dl::sum(e);
    return Tensor<T>(std::forward<E>(e));
}
template <class T>
void check_same_shape(const Tensor<T>& a, const Tensor<T>& b, std::string_view loss) {
    if (a.shape() != b.shape())
        dl::detail::fail("dl::nn::", loss, ": input of shape ", a.shape(), " and target of shape ", b.shape(),
                         " differ");
}
}  // namespace detail

template <class T>
[[nodiscard]] Tensor<T> mse_loss(const Tensor<T>& input, const Tensor<T>& target, reduction r = reduction::mean) {
    detail::check_same_shape(input, target, "mse_loss");
    return detail::reduce_loss(dl::square(input - target), r);
}
template <class T>
[[nodiscard]] Tensor<T> l1_loss(const Tensor<T>& input, const Tensor<T>& target, reduction r = reduction::mean) {
    detail::check_same_shape(input, target, "l1_loss");
    return detail::reduce_loss(dl::abs(input - target), r);
}
/// Quadratic below beta, linear above (Huber loss divided by beta), as PyTorch's smooth_l1_loss.
template <class T>
[[nodiscard]] Tensor<T> smooth_l1_loss(const Tensor<T>& input, const Tensor<T>& target, reduction r = reduction::mean,
                                       double beta = 1.0) {
    detail::check_same_shape(input, target, "smooth_l1_loss");
    if (!(beta > 0)) dl::detail::fail("dl::nn::smooth_l1_loss: beta must be positive, got ", beta);
    const auto d = input - target;
    return detail::reduce_loss(dl::where(dl::abs(d) < T(beta), dl::square(d) * T(0.5 / beta), dl::abs(d) - T(0.5 * beta)), r);
}
/// Binary cross-entropy on logits, in the stable form softplus(x) - x·y.
template <class T>
[[nodiscard]] Tensor<T> binary_cross_entropy_with_logits(const Tensor<T>& logits, const Tensor<T>& target,
                                                         reduction r = reduction::mean) {
    detail::check_same_shape(logits, target, "binary_cross_entropy_with_logits");
    return detail::reduce_loss(dl::softplus(logits) - logits * target, r);
}

/// Cross-entropy of logits [N, C] against class indices [N] (log-softmax fused in), with label
/// smoothing and an ignored class index, as torch.nn.functional.cross_entropy.
template <class T>
[[nodiscard]] Tensor<T> cross_entropy(const Tensor<T>& logits, const Tensor<std::int64_t>& target,
                                      const cross_entropy_options& options = {}) {
    return detail::class_loss(logits, target, options, false, "cross_entropy");
}

/// Negative log-likelihood of log-probabilities [N, C] against class indices [N].
template <class T>
[[nodiscard]] Tensor<T> nll_loss(const Tensor<T>& log_probs, const Tensor<std::int64_t>& target,
                                 reduction r = reduction::mean, std::int64_t ignore_index = -100) {
    return detail::class_loss(log_probs, target, {r, 0, ignore_index}, true, "nll_loss");
}

}  // namespace dl::nn
