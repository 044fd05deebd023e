#pragma once
// Autograd for views: the gradient of a view goes back to the same elements of its source's gradient.
#include "node.hpp"

namespace dl::autograd {

template <class T>
Tensor<T> record_view(const Tensor<T>& source, Tensor<T> view, const view_op& op) {
    if (!source.context().grad_enabled()) return view;
    record(
        view,
        [op](const Tensor<T>& g, const Tensor<T>& src) {
            auto& n = *node_of(src);
            const auto& a = op.args;
            switch (op.kind) {
                case view_op::slice: grad_buffer(n).slice(a[0], a[1], a[2], a[3]) += g; break;
                case view_op::select: grad_buffer(n).select(a[0], a[1]) += g; break;
                case view_op::transpose: accumulate(n, g.transpose(a[0], a[1])); break;
                case view_op::permute: {
                    Dims inverse = a;
                    for (int i = 0; i < a.size(); ++i) inverse[static_cast<int>(a[i])] = i;
                    accumulate(n, g.permute(inverse));
                    break;
                }
                case view_op::reshape: accumulate(n, g.reshape(n.shape())); break;
                case view_op::expand:  // accumulate sums over the broadcast dimensions
                case view_op::copy: accumulate(n, g); break;
            }
        },
        source);
    return view;
}

}  // namespace dl::autograd
