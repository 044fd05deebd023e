#pragma once
// The recorded graph. A tensor that requires grad carries a node (through Tensor's grad link): a leaf
// node for tensors the user marked, an op node for the result of a recorded op. An op node holds the
// inputs it needs (so the graph lives exactly as long as some tensor refers to it) and knows how to
// send its gradient to them. Nodes are numbered in creation order, so walking them in decreasing
// order is a topological order: that numbering, owned by the Context, is the tape.
//
// Nodes come from the Context's allocator and backward reuses the Context's scratch vectors, so a
// steady training loop allocates nothing here after its first step.
#include <algorithm>
#include <cstdint>
#include <new>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/tensor.hpp"
#include "../device/cpu/elementwise.hpp"
#include "../device/cpu/reduce.hpp"

namespace dl {

/// Turns recording off on a Context for its lifetime (every thread using that Context sees it), as
/// torch.no_grad does: for inference, and for updates of parameters in place.
class no_grad {
public:
    explicit no_grad(Context& ctx = default_context()) noexcept : ctx_(ctx), previous_(ctx.autograd().enabled) {
        ctx.autograd().enabled = false;
    }
    no_grad(const no_grad&) = delete;
    no_grad& operator=(const no_grad&) = delete;
    ~no_grad() { ctx_.autograd().enabled = previous_; }

private:
    Context& ctx_;
    bool previous_;
};

namespace autograd {

class node : public dl::detail::grad_link {
public:
    node(Context& ctx, const Shape& shape, std::size_t bytes) noexcept
        : shape_(shape), ctx_(&ctx), bytes_(bytes), sequence_(ctx.autograd().sequence.fetch_add(1) + 1) {
        destroy = [](dl::detail::grad_link* link) noexcept {
            auto* n = static_cast<node*>(link);
            Allocator& allocator = n->ctx_->allocator();
            const std::size_t bytes = n->bytes_;
            n->~node();
            allocator.deallocate(n, bytes);
        };
    }
    node(const node&) = delete;
    node& operator=(const node&) = delete;
    virtual ~node() = default;

    [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
    [[nodiscard]] Context& context() const noexcept { return *ctx_; }
    [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_; }
    [[nodiscard]] virtual bool is_leaf() const noexcept { return true; }
    [[nodiscard]] virtual bool has_grad() const noexcept = 0;
    virtual void drop_grad() noexcept = 0;
    /// Sends this node's gradient to its inputs' nodes.
    virtual void backward() {}
    /// Pushes the nodes of the inputs that require grad.
    virtual void push_inputs(std::vector<void*>&) const {}
    /// Frees what backward needed (after a backward without retain_graph).
    virtual void release_saved() noexcept {}

    bool retain = false;            ///< keep the gradient of this non-leaf after backward
    std::uint64_t visited = 0;      ///< the last backward pass that reached this node

protected:
    Shape shape_;
    Context* ctx_;
    std::size_t bytes_;
    std::uint64_t sequence_;
};

/// A node whose gradient has element type T.
template <class T>
class typed_node : public node {
public:
    using node::node;
    [[nodiscard]] bool has_grad() const noexcept final { return grad.defined(); }
    void drop_grad() noexcept final { grad = Tensor<T>(); }
    Tensor<T> grad;
};

/// The node of a tensor that requires grad, or null.
template <class T>
[[nodiscard]] typed_node<T>* node_of(const Tensor<T>& t) noexcept {
    return static_cast<typed_node<T>*>(t.grad_link());
}

/// Allocates a node of type N from ctx's allocator.
template <class N, class... Args>
[[nodiscard]] dl::detail::grad_ref make_node(Context& ctx, const Shape& shape, Args&&... args) {
    void* p = ctx.allocator().allocate(sizeof(N));
    try {
        return dl::detail::grad_ref(::new (p) N(ctx, shape, sizeof(N), std::forward<Args>(args)...));
    } catch (...) {
        ctx.allocator().deallocate(p, sizeof(N));
        throw;
    }
}

/// Whether ops on t are recorded now.
template <class T>
[[nodiscard]] bool records(const Tensor<T>& t) noexcept {
    return t.requires_grad() && t.context().grad_enabled();
}

/// Sums `full` over the dimensions that broadcasting added or stretched to get from `target`.
template <class T>
[[nodiscard]] auto sum_to_shape(const Tensor<T>& full, const Shape& target) {
    const int lead = full.rank() - target.size();
    Dims axes;
    bool all_one = true;  // summing over extents of 1 only (a batch of one): a view, not a reduction
    for (int d = 0; d < full.rank(); ++d)
        if (d < lead || (target[d - lead] == 1 && full.shape()[d] != 1)) {
            axes.push_back(d);
            all_one = all_one && full.shape()[d] == 1;
        }
    if (all_one && full.is_contiguous()) return full.reshape(target);
    return dl::detail::reduce(full, axes, true, dl::detail::sum_acc<T>{}, "sum").reshape(target);
}

/// n.grad += g, where g (an expression or tensor) broadcasts to n's shape, or has a larger shape whose
/// extra extent is summed away. The first contribution allocates the gradient.
template <class T, class G>
void accumulate(typed_node<T>& n, G&& g) {
    if constexpr (std::is_same_v<G, Tensor<T>>) {
        // A gradient passed as a temporary that no other tensor shares becomes n's gradient as it is
        // (as PyTorch's AccumulateGrad steals it): no allocation, no copy.
        if (!n.grad.defined() && g.storage().use_count() == 1 && g.is_contiguous() && g.shape() == n.shape()) {
            n.grad = std::move(g);
            return;
        }
    }
    const Shape shape = shape_of(g);
    if (shape != n.shape() && broadcast_shapes(shape, n.shape(), "backward") != n.shape()) {
        if constexpr (is_tensor_v<G>) {
            auto summed = sum_to_shape(g, n.shape());
            if constexpr (std::is_same_v<G, Tensor<T>>) g = Tensor<T>();  // summed may be a view of it
            accumulate(n, std::move(summed));
        } else {
            Tensor<value_t<G>> full(shape, n.context());
            assign(full, std::forward<G>(g));
            accumulate(n, sum_to_shape(full, n.shape()));
        }
        return;
    }
    // One loop for both cases: a separate n.grad + g would compile g's whole chain a second time.
    const bool add = n.grad.defined();
    if (!add) n.grad = Tensor<T>(n.shape(), n.context());
    assign(n.grad, std::forward<G>(g), add);
}

/// The gradient tensor of n, allocated as zeros on first use (for ops that add into part of it).
template <class T>
[[nodiscard]] Tensor<T>& grad_buffer(typed_node<T>& n) {
    if (!n.grad.defined()) {
        n.grad = Tensor<T>(n.shape(), n.context());
        assign(n.grad, T(0));
    }
    return n.grad;
}

/// Saved inputs may be a list of tensors (for ops over any number of them, like cat).
template <class S>
inline constexpr bool is_tensor_list = false;
template <class U>
inline constexpr bool is_tensor_list<std::vector<Tensor<U>>> = true;

/// The node of an op's result: Backward is called as backward(grad, inputs...) with the result's
/// gradient and the saved input tensors, and sends gradients to the inputs that require grad.
template <class T, class Backward, class... Inputs>
class op_node final : public typed_node<T> {
public:
    op_node(Context& ctx, const Shape& shape, std::size_t bytes, Backward fn, Inputs... inputs)
        : typed_node<T>(ctx, shape, bytes), saved_(std::in_place, std::move(fn), std::move(inputs)...) {}

    [[nodiscard]] bool is_leaf() const noexcept override { return false; }
    void backward() override {
        if (!saved_)
            dl::detail::fail("dl::backward: this part of the graph was already freed by an earlier backward; "
                         "pass retain_graph = true to the first one to run backward twice");
        std::apply([&](const Backward& fn, const auto&... inputs) { fn(this->grad, inputs...); }, *saved_);
    }
    void push_inputs(std::vector<void*>& stack) const override {
        if (saved_) std::apply([&](const auto&, const auto&... inputs) { (push(stack, inputs), ...); }, *saved_);
    }
    void release_saved() noexcept override { saved_.reset(); }

private:
    template <class Saved>
    static void push(std::vector<void*>& stack, const Saved& saved) {
        if constexpr (expression<Saved>)
            dl::detail::for_each_tensor(saved, [&](const auto& t) {
                if (t.grad_link()) stack.push_back(static_cast<node*>(t.grad_link()));
            });
        else if constexpr (is_tensor_list<Saved>)
            for (const auto& t : saved)
                if (t.grad_link()) stack.push_back(static_cast<node*>(t.grad_link()));
    }


    std::optional<std::tuple<Backward, Inputs...>> saved_;
};

/// Attaches to `out` a node recording that it was computed from `inputs` (tensors, or other saved
/// values); `backward(grad, inputs...)` runs when the gradient reaches out.
template <class T, class Backward, class... Inputs>
void record(Tensor<T>& out, Backward backward, Inputs... inputs) {
    using N = op_node<T, Backward, Inputs...>;
    out.set_grad_link(make_node<N>(out.context(), out.shape(), std::move(backward), std::move(inputs)...));
}

/// Whether any of the tensors (others ignored) makes an op on them record.
template <class... Args>
[[nodiscard]] bool any_records(const Args&... args) noexcept {
    auto one = []<class A>(const A& a) {
        if constexpr (is_tensor_v<A>)
            return records(a);
        else
            return false;
    };
    return (one(args) || ...);
}

// --- the members of Tensor that concern gradients ---

template <class T>
void set_requires_grad(Tensor<T>& t, bool on) {
    if constexpr (!is_floating_element<T>) {
        if (on) dl::detail::fail("dl::requires_grad_: only floating tensors have gradients, this one holds ", dtype_of<T>);
    } else {
        if (on) {
            if (!t.requires_grad())
                t.set_grad_link(make_node<typed_node<T>>(t.context(), t.shape()));
        } else if (t.requires_grad()) {
            if (!node_of(t)->is_leaf())
                dl::detail::fail("dl::requires_grad_: cannot turn off gradients of a computed tensor; use detach()");
            t.set_grad_link({});
        }
    }
}

template <class T>
Tensor<T> grad_of(const Tensor<T>& t) {
    const auto* n = node_of(t);
    return n ? n->grad : Tensor<T>();
}

template <class T>
void retain_grad(const Tensor<T>& t) {
    if (!t.requires_grad()) dl::detail::fail("dl::retain_grad: the tensor does not require grad");
    node_of(t)->retain = true;
}

template <class T>
bool is_leaf(const Tensor<T>& t) {
    return !t.requires_grad() || node_of(t)->is_leaf();
}

template <class T>
void backward(const Tensor<T>& root, const Tensor<T>* grad, bool retain_graph) {
    if (!root.requires_grad())
        dl::detail::fail("dl::backward: the tensor does not require grad (no input of the ops that made it requires "
                     "grad, or they ran under no_grad)");
    if (!grad && root.numel() != 1)
        dl::detail::fail("dl::backward: without a gradient argument the tensor must have one element, not shape ",
                     root.shape());
    if (grad && grad->shape() != root.shape())
        dl::detail::fail("dl::backward: gradient of shape ", grad->shape(), " for a tensor of shape ", root.shape());
    Context& ctx = root.context();
    no_grad off(ctx);
    auto* start = node_of(root);
    // An op node's gradient is only read by its backward (nothing newer sends it more) and dropped
    // after, so it can share the caller's tensor instead of copying it. A leaf's or a retained
    // gradient outlives the pass and later ones add into it: those get their own storage.
    if (grad && !start->is_leaf() && !start->retain && grad->is_contiguous())
        start->grad = grad->detach();
    else if (grad)
        accumulate(*start, *grad);
    else
        accumulate(*start, scalar_node<T>{{}, T(1)});

    // Collect the op nodes reachable from the root, then run them newest first. `order` holds a
    // reference to each, since freeing one node's saved inputs may drop the last other reference.
    auto& state = ctx.autograd();
    auto& stack = state.stack;
    auto& order = state.order;
    const std::uint64_t pass = state.sequence.fetch_add(1) + 1;
    stack.clear();
    order.clear();
    stack.push_back(start);
    while (!stack.empty()) {
        auto* n = static_cast<node*>(stack.back());
        stack.pop_back();
        if (n->visited == pass) continue;
        n->visited = pass;
        if (n->is_leaf()) continue;
        n->refs.fetch_add(1, std::memory_order_relaxed);
        order.push_back(n);
        n->push_inputs(stack);
    }
    std::sort(order.begin(), order.end(),
              [](void* a, void* b) { return static_cast<node*>(a)->sequence() > static_cast<node*>(b)->sequence(); });
    std::size_t next = 0;
    try {
        for (; next < order.size(); ++next) {
            auto* n = static_cast<node*>(order[next]);
            const dl::detail::grad_ref hold(n);  // takes over the reference taken above
            if (n->has_grad()) {
                const op_scope scope(ctx, "backward");
                n->backward();
            }
            if (!retain_graph) n->release_saved();
            if (!n->retain) n->drop_grad();
        }
    } catch (...) {
        for (++next; next < order.size(); ++next) const dl::detail::grad_ref release(static_cast<node*>(order[next]));
        order.clear();
        throw;
    }
    order.clear();
}

}  // namespace autograd
}  // namespace dl
