#pragma once
// Autograd for views: the gradient of a view goes back to the same elements of its source's gradient.
// Views are traced (graph/) as ops of their own, which a graph replays on its own tensors.
#include "node.hpp"
#include "tracing.hpp"

namespace dl::autograd {

namespace detail {

/// The shape a traced reshape or expand gives an input of shape `in`, when it gave `traced_out` to an
/// input of shape `traced_in`: the same one, unless the leading (batch) extent changed. Then a reshape
/// leaves for the view to infer (-1) its first extent above 1 that is a multiple or a divisor of the
/// input's traced leading extent: that extent itself, a dimension it was merged into, or the batch split
/// out of it. (Trace with a batch above 1.)
[[nodiscard]] inline Shape replayed_shape(const view_op& op, const Shape& traced_in, const Shape& traced_out,
                                          const Shape& in) {
    Shape target = traced_out;
    if (in == traced_in || in.size() == 0 || traced_in.size() == 0) return target;
    if (op.kind == view_op::expand) {
        const int lead = target.size() - traced_in.size();
        for (int i = 0; i < traced_in.size(); ++i)
            if (traced_in[i] == traced_out[lead + i]) target[lead + i] = -1;
        return target;
    }
    for (int k = 0; k < target.size(); ++k)
        if (traced_in[0] > 0 && target[k] > 1 && (target[k] % traced_in[0] == 0 || traced_in[0] % target[k] == 0)) {
            target[k] = -1;
            break;
        }
    return target;
}

template <class T>
void trace_view(recorder& r, const Tensor<T>& source, const Tensor<T>& view, const view_op& op) {
    static constexpr std::string_view names[] = {"slice", "select", "transpose", "permute", "reshape", "expand", "clone"};
    std::ostringstream attributes;
    if (op.kind == view_op::reshape || op.kind == view_op::expand)
        attributes << "shape=" << view.shape();
    else if (op.kind != view_op::copy)
        attributes << "args=" << op.args;
    op_record record;
    record.name = names[op.kind];
    record.attributes = attributes.str();
    record.kind = op.kind == view_op::copy ? op_kind::pure : op_kind::view;
    record.inputs = {source};
    record.output = view;
    record.kernel = [op, traced_in = source.shape(), traced_out = view.shape()](std::span<const any_tensor> inputs,
                                                                                any_tensor& out) {
        const auto& x = std::get<Tensor<T>>(inputs[0]);
        const auto& a = op.args;
        switch (op.kind) {
            case view_op::slice: out = x.slice(a[0], a[1], a[2], a[3]); break;
            case view_op::select: out = x.select(a[0], a[1]); break;
            case view_op::transpose: out = x.transpose(a[0], a[1]); break;
            case view_op::permute: out = x.permute(a); break;
            case view_op::reshape: out = x.reshape(replayed_shape(op, traced_in, traced_out, x.shape())); break;
            case view_op::expand: out = x.expand(replayed_shape(op, traced_in, traced_out, x.shape())); break;
            case view_op::copy: out = x.clone(); break;
        }
    };
    r.record(std::move(record));
}

}  // namespace detail

template <class T>
Tensor<T> record_view(const Tensor<T>& source, Tensor<T> view, const view_op& op) {
    if (auto* r = source.context().recorder()) detail::trace_view(*r, source, view, op);
    // Only floating tensors have gradients; graph code views tensors of every dtype, and compiling the
    // gradient expressions for those would cost every includer of dl.hpp ~0.5 s.
    if constexpr (is_floating_element<T>) {
        if (source.grad_link() && source.context().grad_enabled())
            record(
                view,
                [op](const Tensor<T>& g, const Tensor<T>& src) {
                    auto& n = *node_of(src);
                    const auto& a = op.args;
                    switch (op.kind) {
                        // assign(..., true) rather than +=, which would compile an add expression
                        // with its own gradient and trace for every dtype that graph code views.
                        case view_op::slice: {
                            Tensor<T> part = grad_buffer(n).slice(a[0], a[1], a[2], a[3]);
                            assign(part, g, true);
                            break;
                        }
                        case view_op::select: {
                            Tensor<T> part = grad_buffer(n).select(a[0], a[1]);
                            assign(part, g, true);
                            break;
                        }
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
    }
    return view;
}

}  // namespace dl::autograd
