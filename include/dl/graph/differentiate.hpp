#pragma once
// Training in graph mode. differentiate() appends to a graph the nodes that compute the gradient of a
// loss with respect to every parameter it depends on (reverse mode over the node list), each gradient
// rule written with the ops' public functions and recorded through splice(), so the backward nodes are
// op definitions like the forward ones and the same passes (fusion, memory planning) apply to them.
// train() traces a loss function, differentiates it and returns a step: one call runs forward and
// backward in the graph, then the optimizer's update.
//
// Gradient rules of their own (graph ops, so fusion and memory planning see through them) exist for
// linear (with its epilogue activation, except gelu), matmul, relu, tanh, sigmoid, neg, exp, log,
// square, sqrt, add/sub/mul/div of two tensors (broadcasting) or of a tensor and a scalar, reshape
// (flatten), transpose, clone, and cross_entropy / nll_loss. Every other op without effects (conv2d,
// pooling, normalization in eval mode, reductions, softmax, indexing) gets its gradient from its
// eager definition: a "vjp" node re-runs the op's own kernel where autograd records and runs its
// backward (see eager_gradient), which costs one more forward of that op per step. Elementwise ops
// without a rule (sin, gelu, ...) and ops with effects (dropout, batch_norm in training mode) fail
// clearly. The optimizer update runs after the graph, as the optimizer's own fused loop, not as graph
// nodes.
#include <charconv>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/linalg.hpp"
#include "../autograd/reduce.hpp"
#include "../autograd/class_loss.hpp"
#include "inference.hpp"
#include "trace.hpp"
#include "tracer.hpp"

namespace dl::graph {

namespace detail {

/// g summed down to `shape` (the shape an operand had before broadcasting), with the public dl::sum,
/// which records itself (autograd::sum_to_shape calls the reduction kernel directly, unrecorded).
template <class T>
[[nodiscard]] Tensor<T> sum_to(const Tensor<T>& g, const Shape& shape) {
    if (g.shape() == shape) return g;
    Dims axes;
    const int lead = g.rank() - shape.size();
    for (int d = 0; d < g.rank(); ++d)
        if (d < lead || shape[d - lead] == 1) axes.push_back(d);
    return dl::sum(g, axes, true).reshape(shape);
}

/// What the vjp nodes of one differentiated graph share: a Context in which autograd records (the graph
/// runs under no_grad on its own Context, which every thread using that Context sees), made at the first
/// run with the graph Context's allocator, threads and denormal mode; and a lock, since its tape is one.
struct eager_scratch {
    std::mutex lock;
    std::unique_ptr<Context> context;
};

/// A vjp node's work: op `kernel` re-run on borrowed views of inputs[0..n) (those at `wanted` recording,
/// in the scratch Context), backward from inputs[n], and the gradients of the wanted inputs packed one
/// after another into one flat tensor of the graph's Context (zeros where the op gave none).
template <class T>
[[nodiscard]] Tensor<T> eager_vjp(const op_kernel& kernel, const std::vector<std::size_t>& wanted, eager_scratch& scratch,
                                  std::span<const any_tensor> inputs) {
    const Tensor<T>& upstream = std::get<Tensor<T>>(inputs.back());
    Context& home = upstream.context();
    const std::scoped_lock hold(scratch.lock);
    if (!scratch.context)
        scratch.context = std::make_unique<Context>(context_options{.threads = home.concurrency(),
                                                                    .allocator = home.shared_allocator(),
                                                                    .flush_denormals = home.flushes_denormals()});
    Context& here = *scratch.context;
    auto borrow = [&](const Tensor<T>& t) { return Tensor<T>::borrow(const_cast<T*>(t.data()), t.shape(), t.strides(), here); };
    std::vector<any_tensor> args(inputs.begin(), inputs.end() - 1);
    std::vector<Tensor<T>> leaves;
    std::int64_t total = 0;
    for (std::size_t i : wanted) {
        Tensor<T> leaf = borrow(std::get<Tensor<T>>(args[i]));
        leaf.requires_grad_();
        total += leaf.numel();
        args[i] = leaf;
        leaves.push_back(std::move(leaf));
    }
    any_tensor result;
    kernel(args, result);
    const Tensor<T>* out = std::get_if<Tensor<T>>(&result);
    if (!out || !out->requires_grad())
        dl::detail::fail("dl::graph::differentiate: an op's eager definition recorded no gradient for its inputs");
    out->backward(borrow(upstream));
    Tensor<T> packed({total}, home);
    std::int64_t offset = 0;
    for (const Tensor<T>& leaf : leaves) {
        Tensor<T> part = packed.slice(0, offset, offset + leaf.numel()).reshape(leaf.shape());
        const Tensor<T> g = leaf.grad();
        if (g.defined())
            part.copy_from(g);
        else
            assign(part, T(0));
        offset += leaf.numel();
    }
    return packed;
}

/// Gradient k of a packed vjp result (inputs[0]): the k-th span of it, shaped as the wanted input
/// inputs[1 + k], at offsets that follow the inputs' run-time shapes (the batch may differ from the
/// traced one).
template <class T>
[[nodiscard]] Tensor<T> vjp_part(std::span<const any_tensor> inputs, std::size_t k) {
    const Tensor<T>& packed = std::get<Tensor<T>>(inputs[0]);
    std::int64_t offset = 0;
    for (std::size_t j = 0; j < k; ++j) offset += std::get<Tensor<T>>(inputs[1 + j]).numel();
    const Shape& shape = std::get<Tensor<T>>(inputs[1 + k]).shape();
    return packed.slice(0, offset, offset + shape.numel()).reshape(shape);
}

/// The gradients of node n's inputs from its eager definition, recorded as a "vjp" node (the op's
/// kernel re-run where autograd records, then its backward) and one view node per input gradient.
template <class T>
[[nodiscard]] std::vector<Tensor<T>> eager_gradient(const node& n, const std::vector<any_tensor>& in, const Tensor<T>& grad,
                                                    const std::shared_ptr<eager_scratch>& scratch) {
    // An elementwise node's kernel evaluates its expression without autograd, so it has nothing to re-run.
    if (n.kind == op_kind::elementwise || !n.kernel)
        dl::detail::fail("dl::graph::differentiate: no gradient rule for ", n.op, n.attributes.empty() ? "" : " {", n.attributes,
                         n.attributes.empty() ? "" : "}", " (elementwise ops with rules: relu, tanh, sigmoid, neg, exp, log, "
                         "square, sqrt, add/sub/mul/div of tensors and scalars)");
    std::vector<std::size_t> wanted;
    for (std::size_t i = 0; i < in.size(); ++i)
        if (std::holds_alternative<Tensor<T>>(in[i])) wanted.push_back(i);
    autograd::recorder& r = *grad.context().recorder();
    autograd::op_record vjp;
    vjp.name = "vjp";
    vjp.attributes = "of=" + n.op + (n.attributes.empty() ? "" : ", " + n.attributes);
    vjp.inputs = in;
    vjp.inputs.push_back(grad);
    vjp.kernel = [kernel = n.kernel, wanted, scratch](std::span<const any_tensor> inputs, any_tensor& out) {
        out = eager_vjp<T>(kernel, wanted, *scratch, inputs);
    };
    {
        const autograd::recording_paused pause(grad.context());
        vjp.kernel(vjp.inputs, vjp.output);
    }
    const Tensor<T> packed = std::get<Tensor<T>>(vjp.output);
    r.record(std::move(vjp));
    std::vector<Tensor<T>> grads(in.size());
    for (std::size_t k = 0; k < wanted.size(); ++k) {
        autograd::op_record part;
        part.name = "vjp_part";
        part.attributes = autograd::attributes("k", k);
        part.kind = op_kind::view;
        part.inputs.push_back(packed);
        for (std::size_t i : wanted) part.inputs.push_back(in[i]);
        part.kernel = [k](std::span<const any_tensor> inputs, any_tensor& out) { out = vjp_part<T>(inputs, k); };
        {
            const autograd::recording_paused pause(grad.context());
            part.kernel(part.inputs, part.output);
        }
        grads[wanted[k]] = std::get<Tensor<T>>(part.output);
        r.record(std::move(part));
    }
    return grads;
}

/// The gradients of node n's inputs (null tensors where an input gets none) from the gradient of its
/// output, recorded as ops. `in` and `out` stand for the node's inputs and output.
template <class T>
[[nodiscard]] std::vector<Tensor<T>> gradient_rule(const node& n, const std::vector<any_tensor>& in, const Tensor<T>& out,
                                                   const Tensor<T>& grad, const std::shared_ptr<eager_scratch>& scratch) {
    auto input = [&](std::size_t i) { return std::get<Tensor<T>>(in.at(i)); };
    const std::string_view op = n.op;
    const bool two = in.size() == 2 && n.attributes.empty();
    if (op == "linear") {
        const auto act = static_cast<activation>(parse_attribute<int>(n, "act"));
        if (act == activation::gelu) dl::detail::fail("dl::graph::differentiate: no gradient rule for linear with gelu in its epilogue");
        const Tensor<T> g = autograd::detail::activation_grad(grad, out, act);
        std::vector<Tensor<T>> result{matmul(g, input(1)), matmul(g.t(), input(0))};
        if (in.size() == 3) result.push_back(dl::sum(g, Dims{0}));
        return result;
    }
    if (op == "matmul" && in.size() == 2 && input(0).rank() == 2 && input(1).rank() == 2)
        return {matmul(grad, input(1).t()), matmul(input(0).t(), grad)};
    if (op == "relu" && in.size() == 1 && n.attributes.empty()) return {Tensor<T>(where(input(0) > T(0), grad, T(0)))};
    if (op == "tanh" && in.size() == 1) return {Tensor<T>(grad * (T(1) - out * out))};
    if (op == "sigmoid" && in.size() == 1) return {Tensor<T>(grad * out * (T(1) - out))};
    if (op == "neg" && in.size() == 1) return {Tensor<T>(-grad)};
    if (op == "add" && two) return {sum_to(grad, input(0).shape()), sum_to(grad, input(1).shape())};
    if (op == "sub" && two) return {sum_to(grad, input(0).shape()), sum_to(Tensor<T>(-grad), input(1).shape())};
    if (op == "mul" && two)
        return {sum_to(Tensor<T>(grad * input(1)), input(0).shape()), sum_to(Tensor<T>(grad * input(0)), input(1).shape())};
    if (op == "reshape" && in.size() == 1) return {grad.reshape(input(0).shape())};
    if (op == "clone" && in.size() == 1) return {grad};
    if (op == "transpose" && in.size() == 1) {
        const Dims dims = parse_dims(n, "args");
        if (dims.size() != 2) dl::detail::fail("dl::graph::differentiate: transpose needs two dimensions, got {", n.attributes, "}");
        return {grad.transpose(dims[0], dims[1])};
    }
    if (op == "exp" && in.size() == 1) return {Tensor<T>(grad * out)};
    if (op == "log" && in.size() == 1) return {Tensor<T>(grad / input(0))};
    if (op == "square" && in.size() == 1) return {Tensor<T>(grad * T(2) * input(0))};
    if (op == "sqrt" && in.size() == 1) return {Tensor<T>(grad * T(0.5) / out)};
    if (op == "div" && two)
        return {sum_to(Tensor<T>(grad / input(1)), input(0).shape()), sum_to(Tensor<T>(-grad * out / input(1)), input(1).shape())};
    // One tensor and one scalar operand: "s0=c" when the scalar is the left operand, "s1=c" the right.
    if ((op == "add" || op == "sub" || op == "mul" || op == "div") && in.size() == 1) {
        const bool left = !attribute(n, "s0").empty();
        const T c = static_cast<T>(parse_attribute<double>(n, left ? "s0" : "s1"));
        if (op == "add" || (op == "sub" && !left)) return {grad};
        if (op == "sub") return {Tensor<T>(-grad)};
        if (op == "mul") return {Tensor<T>(grad * c)};
        if (!left) return {Tensor<T>(grad / c)};
        return {Tensor<T>(-grad * out / input(0))};  // d(c / x) = -c / x² = -out / x
    }
    if ((op == "cross_entropy" || op == "nll_loss") && in.size() == 2) {
        const nn::cross_entropy_options o{static_cast<nn::reduction>(parse_attribute<int>(n, "reduce")),
                                          parse_attribute<double>(n, "label_smoothing"),
                                          parse_attribute<std::int64_t>(n, "ignore_index")};
        return {nn::detail::class_loss_grad(grad, input(0), std::get<Tensor<std::int64_t>>(in[1]), o, op == "nll_loss"),
                Tensor<T>()};
    }
    return eager_gradient(n, in, grad, scratch);
}

}  // namespace detail

/// Appends the nodes computing d loss / d p for each parameter p that `loss` (a one-element float
/// value) depends on; returns (parameter value, gradient value) pairs, in value order. The gradient
/// values are made graph outputs after the existing ones.
// A template only so that the gradient rules it records (every op's expressions, forward, backward
// and traced: ~8 s of g++) compile in the files that train in graph mode, not in every includer.
template <class = void>
std::vector<std::pair<int, int>> differentiate(Graph& g, int loss) {
    const value& l = g.values.at(static_cast<std::size_t>(loss));
    if (l.shape.numel() != 1 || l.dtype != DType::float32)
        dl::detail::fail("dl::graph::differentiate: the loss must be one float32 element, got ", g.describe_type(loss));
    // Which values depend on a parameter: only their gradients are computed.
    std::vector<char> needs(g.values.size(), 0);
    for (std::size_t id = 0; id < g.values.size(); ++id) needs[id] = g.values[id].source == value_source::parameter;
    for (const node& n : g.nodes)
        for (int in : n.inputs) needs[static_cast<std::size_t>(n.output)] |= needs[static_cast<std::size_t>(in)];
    if (!needs[static_cast<std::size_t>(loss)]) dl::detail::fail("dl::graph::differentiate: the loss depends on no parameter");
    Context* ctx = nullptr;
    for (const auto& v : g.values)
        if (v.source == value_source::parameter) ctx = &detail::context_of(v.data);
    // Stand-ins for values while a rule records: zeros (targets then name class 0, a valid class).
    auto example = [&](int id) -> any_tensor {
        const value& v = g.values[static_cast<std::size_t>(id)];
        if (v.source == value_source::parameter || v.source == value_source::constant) return v.data;
        if (v.dtype == DType::int64) return zeros<std::int64_t>(v.shape, *ctx);
        if (v.dtype == DType::float32) return zeros<float>(v.shape, *ctx);
        return detail::make_tensor(v.dtype, v.shape, *ctx);
    };

    const auto scratch = std::make_shared<detail::eager_scratch>();
    std::map<int, int> grad;  // value -> its gradient value
    auto add_gradient = [&](int id, int gradient) {
        auto [it, fresh] = grad.try_emplace(id, gradient);
        if (fresh) return;
        const Tensor<float> a = std::get<Tensor<float>>(example(it->second)), b = std::get<Tensor<float>>(example(gradient));
        const std::pair<int, any_tensor> bound[] = {{it->second, a}, {gradient, b}};
        it->second = splice(g, g.nodes.size(), *ctx, bound, [&] { return Tensor<float>(a + b); });
    };
    grad[loss] = splice(g, g.nodes.size(), *ctx, {}, [&] { return ones<float>(l.shape, *ctx); });

    const std::vector<node> forward = g.nodes;  // the list grows below
    for (std::size_t k = forward.size(); k-- > 0;) {
        const node& n = forward[k];
        const auto it = grad.find(n.output);
        if (it == grad.end() || !needs[static_cast<std::size_t>(n.output)]) continue;
        if (n.kind == op_kind::effectful)
            dl::detail::fail("dl::graph::differentiate: no gradient rule for ", n.op, " (an op with effects)");
        if (g.values[static_cast<std::size_t>(n.output)].dtype != DType::float32)
            dl::detail::fail("dl::graph::differentiate: ", n.op, " makes ", g.describe_type(n.output), "; graph training is float32");
        std::vector<any_tensor> inputs;
        std::vector<std::pair<int, any_tensor>> bound;
        for (int in : n.inputs) {
            inputs.push_back(example(in));
            bound.emplace_back(in, inputs.back());
        }
        const Tensor<float> out = std::get<Tensor<float>>(example(n.output)), upstream = std::get<Tensor<float>>(example(it->second));
        bound.emplace_back(n.output, out);
        bound.emplace_back(it->second, upstream);
        const std::vector<int> input_grads =
            splice(g, g.nodes.size(), *ctx, bound, [&] { return detail::gradient_rule<float>(n, inputs, out, upstream, scratch); });
        for (std::size_t i = 0; i < n.inputs.size() && i < input_grads.size(); ++i)
            if (input_grads[i] >= 0 && needs[static_cast<std::size_t>(n.inputs[i])]) add_gradient(n.inputs[i], input_grads[i]);
    }
    std::vector<std::pair<int, int>> result;
    for (std::size_t id = 0; id < g.values.size(); ++id)
        if (g.values[id].source == value_source::parameter) {
            const auto it = grad.find(static_cast<int>(id));
            if (it == grad.end()) continue;
            result.emplace_back(static_cast<int>(id), it->second);
            g.outputs.push_back(it->second);
        }
    return result;
}

/// A training step in graph mode (see train()).
template <class Optimizer>
class train_step {
public:
    train_step(function f, Optimizer& optimizer, std::vector<Tensor<float>> parameters)
        : function_(std::move(f)), optimizer_(optimizer), parameters_(std::move(parameters)) {}

    /// Runs forward and backward in the graph on one batch, then the optimizer's step; returns the loss.
    template <class... T>
    Tensor<float> operator()(const Tensor<T>&... batch) {
        // The last step's gradients stay readable until now. Dropped before the run, their buffers go
        // back to the allocator's cache while still warm, and the graph writes the new gradients into
        // them: kept, each gradient would alternate between two buffers, the colder one each time
        // (784x256 at batch 32: its product ran ~20 us slower writing into a cold 800 KB).
        for (const auto& p : parameters_) autograd::node_of(p)->drop_grad();
        const any_tensor in[] = {any_tensor(batch)...};
        const auto out = function_.run(std::span<const any_tensor>(in, sizeof...(T)));
        // The graph made each gradient whole: it becomes the parameter's gradient as it is, with no
        // zeroing and no accumulating pass over the buffers.
        for (std::size_t i = 0; i < parameters_.size(); ++i) autograd::node_of(parameters_[i])->grad = std::get<Tensor<float>>(out[1 + i]);
        optimizer_.step();
        return std::get<Tensor<float>>(out[0]);
    }

    [[nodiscard]] function& graph() noexcept { return function_; }

private:
    function function_;
    Optimizer& optimizer_;
    std::vector<Tensor<float>> parameters_;  ///< in the order of the graph's gradient outputs
};

namespace detail {

/// A traced loss, differentiated: its graph (outputs: the loss, then one gradient per parameter), the
/// Context it was traced on, and the parameters in the order of their gradient outputs.
struct differentiated_loss {
    Graph graph;
    Context* context;
    std::vector<Tensor<float>> parameters;
};

/// Traces loss(examples...), runs the forward passes (forward products take their activations into
/// the GEMM epilogue first, so their gradient rules see the fused op) and differentiates.
template <class F, class... T>
[[nodiscard]] differentiated_loss differentiate_loss(F&& loss, const Tensor<T>&... examples) {
    auto traced = trace(std::forward<F>(loss), examples...);
    differentiated_loss result{traced.graph(), &traced.context(), {}};
    pass_manager forward;
    forward.add(common_subexpression_elimination()).add(constant_folding()).add(dead_code_elimination()).add(epilogue_fusion());
    forward.run(result.graph);
    for (const auto& [parameter, gradient] : differentiate(result.graph, result.graph.outputs.at(0)))
        result.parameters.push_back(std::get<Tensor<float>>(result.graph.values[static_cast<std::size_t>(parameter)].data));
    return result;
}

/// The passes for a differentiated graph: elementwise chains of both directions fuse, memory is planned.
[[nodiscard]] inline pass_manager backward_passes() {
    pass_manager after;
    after.add(common_subexpression_elimination()).add(dead_code_elimination()).add(elementwise_fusion()).add(memory_planning());
    return after;
}

}  // namespace detail

/// Traces loss(examples...) (one float32 element), differentiates the graph with respect to every
/// parameter the loss reads, and optimises it (forward products take their activations into the GEMM
/// epilogue, elementwise chains of both directions fuse, memory is planned). The result's call runs one
/// training step on a batch and returns the loss; the parameters are the model's own, so eager code
/// sees every update.
template <class F, class Optimizer, class... T>
[[nodiscard]] auto train(F&& loss, Optimizer& optimizer, const Tensor<T>&... examples) {
    detail::differentiated_loss d = detail::differentiate_loss(std::forward<F>(loss), examples...);
    detail::backward_passes().run(d.graph);
    return train_step<Optimizer>(function(std::move(d.graph), *d.context), optimizer, std::move(d.parameters));
}

}  // namespace dl::graph
