#pragma once
// Matrix products with their backward: matmul, and linear (x·Wᵀ + b with W stored [out, in], as
// PyTorch stores it, so checkpoints interchange without transposes).
#include <cstdint>

#include "../device/cpu/gemm.hpp"
#include "elementwise.hpp"
#include "node.hpp"

namespace dl {

namespace autograd::detail {

/// The gradient buffer of n and whether a product should add into it (false: overwrite, first use).
template <class T>
[[nodiscard]] std::pair<Tensor<T>&, bool> product_target(typed_node<T>& n) {
    const bool had = n.grad.defined();
    if (!had) n.grad = Tensor<T>(n.shape(), n.context());
    return {n.grad, had};
}

/// dst = epilogue(a·b) for rank-2 tensors (see dl::detail::gemm_epilogue).
template <class T>
void gemm_into(const Tensor<T>& dst, const Tensor<T>& a, const Tensor<T>& b, const dl::detail::gemm_epilogue<T>& ep) {
    dl::detail::gemm(dl::detail::as_matrix(a), dl::detail::as_matrix(b), dl::detail::as_mutable_matrix(dst), ep,
                     dst.context());
}
/// dst (+)= a·b for rank-2 tensors.
template <class T>
void gemm_into(const Tensor<T>& dst, bool accumulate, const Tensor<T>& a, const Tensor<T>& b) {
    gemm_into(dst, a, b, dl::detail::gemm_epilogue<T>{.beta = accumulate ? T(1) : T(0)});
}

/// The gradient through a fused activation, from its output y: relu, sigmoid and tanh have derivatives
/// that y alone determines (gelu does not: fused products record it as a separate op).
template <class T>
[[nodiscard]] Tensor<T> activation_grad(const Tensor<T>& g, const Tensor<T>& y, activation act) {
    switch (act) {
        case activation::relu: return where(y > T(0), g, T(0));
        case activation::sigmoid: return g * y * (T(1) - y);
        case activation::tanh: return g * (T(1) - y * y);
        case activation::gelu: fail("dl: the gelu gradient needs its input; record gelu as its own op");
        case activation::none: break;
    }
    return g;
}

template <class T>
void check_matrix(const Tensor<T>& t, std::string_view op, std::string_view what) {
    if (t.rank() != 2) dl::detail::fail("dl::", op, ": ", what, " must be a matrix, got shape ", t.shape());
}

}  // namespace autograd::detail

/// a·b for matrices a [M, K] and b [K, N], or batches of them: a [B, M, K] and b [B, K, N] give
/// [B, M, N] (one product per batch entry).
template <class T>
[[nodiscard]] Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b) {
    const int rank = a.rank();
    if ((rank != 2 && rank != 3) || b.rank() != rank || (rank == 3 && a.shape()[0] != b.shape()[0]) ||
        a.shape()[rank - 1] != b.shape()[rank - 2])
        detail::fail("dl::matmul: shapes ", a.shape(), " and ", b.shape(),
                     " do not multiply (matrices [M, K]·[K, N], or batches [B, M, K]·[B, K, N])");
    if (auto* r = autograd::recorder_of(a, b))
        return autograd::record_op(*r, "matmul", "", autograd::op_kind::pure,
                                   [](const Tensor<T>& x, const Tensor<T>& y) { return matmul(x, y); }, a, b);
    Shape shape = a.shape();
    shape[rank - 1] = b.shape()[rank - 1];
    Tensor<T> out(shape, a.context());
    // Calls f(c, x, y) for each matrix product c = x·y of the batch.
    auto each_product = [rank](const Tensor<T>& c, const Tensor<T>& x, const Tensor<T>& y, auto&& f) {
        if (rank == 2) return f(c, x, y);
        for (std::int64_t i = 0; i < c.shape()[0]; ++i) f(c.select(0, i), x.select(0, i), y.select(0, i));
    };
    auto t = [rank](const Tensor<T>& m) { return m.transpose(rank - 2, rank - 1); };
    each_product(out, a.detach(), b.detach(),
                 [](const Tensor<T>& c, const Tensor<T>& x, const Tensor<T>& y) { autograd::detail::gemm_into(c, false, x, y); });
    if constexpr (is_floating_element<T>) {
        if (autograd::any_records(a, b))
            autograd::record(
                out,
                [each_product, t](const Tensor<T>& g, const Tensor<T>& x, const Tensor<T>& y) {
                    auto product = [](bool add) {
                        return [add](const Tensor<T>& c, const Tensor<T>& p, const Tensor<T>& q) {
                            autograd::detail::gemm_into(c, add, p, q);
                        };
                    };
                    if (auto* n = autograd::node_of(x)) {
                        auto [dst, add] = autograd::detail::product_target(*n);
                        each_product(dst, g, t(y.detach()), product(add));
                    }
                    if (auto* n = autograd::node_of(y)) {
                        auto [dst, add] = autograd::detail::product_target(*n);
                        each_product(dst, t(x.detach()), g, product(add));
                    }
                },
                a, b);
    }
    return out;
}

/// act(x·Wᵀ + bias) for x [N, in], weight [out, in] and bias [out] (bias may be a null tensor): the
/// product, the bias add and the activation are one pass over the output (the GEMM epilogue), with one
/// autograd node. With gradients recorded, gelu runs as its own op after the product (its derivative
/// needs the pre-activation, which the fused pass does not keep).
template <class T>
[[nodiscard]] Tensor<T> linear(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& bias = {},
                               activation act = activation::none) {
    autograd::detail::check_matrix(x, "linear", "the input");
    autograd::detail::check_matrix(weight, "linear", "the weight");
    if (x.shape()[1] != weight.shape()[1])
        detail::fail("dl::linear: input of shape ", x.shape(), " has ", x.shape()[1], " features, the weight ",
                     weight.shape(), " expects ", weight.shape()[1]);
    if (bias.defined() && (bias.rank() != 1 || bias.shape()[0] != weight.shape()[0]))
        detail::fail("dl::linear: bias of shape ", bias.shape(), " for a weight of shape ", weight.shape());
    if (auto* r = autograd::recorder_of(x, weight, bias))
        return autograd::record_product(
            *r, "linear", autograd::attributes("act", act), {.act = act},
            [](autograd::product_epilogue e) {
                return [a = e.act](const Tensor<T>& in, const Tensor<T>& w, const Tensor<T>& b) { return linear(in, w, b, a); };
            },
            x, weight, bias);
    const bool records = is_floating_element<T> && autograd::any_records(x, weight, bias);
    if (records && act == activation::gelu) return gelu(linear(x, weight, bias));
    Tensor<T> out({x.shape()[0], weight.shape()[0]}, x.context());
    // Matrices straight from the tensors rather than detached and transposed views: at batch 1 each
    // Tensor made here costs about as much as a small layer's arithmetic.
    Tensor<T> b;  // the epilogue reads a pointer: a strided bias is copied
    if (bias.defined() && !bias.is_contiguous()) b = bias.contiguous();
    const T* bias_data = b.defined() ? b.data() : bias.defined() ? bias.data() : nullptr;
    dl::detail::gemm(dl::detail::as_matrix(x), dl::detail::as_transposed_matrix(weight),
                     dl::detail::as_mutable_matrix(out), dl::detail::gemm_epilogue<T>{.bias = bias_data, .act = act},
                     out.context());
    if constexpr (is_floating_element<T>) {
        if (records)
            autograd::record(
                out,
                [act, y = out.detach()](const Tensor<T>& grad, const Tensor<T>& in, const Tensor<T>& w,
                                        const Tensor<T>& b) {
                    Tensor<T> g = autograd::detail::activation_grad(grad, y, act);
                    if (auto* n = autograd::node_of(in)) {
                        auto [dst, add] = autograd::detail::product_target(*n);
                        autograd::detail::gemm_into(dst, add, g, w);
                    }
                    if (auto* n = autograd::node_of(w)) {
                        auto [dst, add] = autograd::detail::product_target(*n);
                        autograd::detail::gemm_into(dst, add, g.t(), in);
                    }
                    // Sums over the rows; at one row, g itself becomes the bias gradient when nothing else holds it.
                    if (auto* n = autograd::node_of(b)) autograd::accumulate(*n, std::move(g));
                },
                x, weight, bias);
    }
    return out;
}

}  // namespace dl
