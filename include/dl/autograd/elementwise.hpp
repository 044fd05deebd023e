#pragma once
// Autograd for elementwise expressions. When `Tensor y = expr;` records, y's node keeps a copy of the
// expression (its tensors by handle, no elements copied). Backward builds, at compile time, one
// expression per tensor operand from each op's partial derivatives (ops::derivative) and the chain
// rule, and evaluates it in ONE fused loop that recomputes the forward values it needs: a chain of k
// ops costs one forward loop and one backward loop per input that requires grad.
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../expr/operators.hpp"
#include "node.hpp"
#include "tiles.hpp"
#include "tracing.hpp"

namespace dl::autograd {

namespace detail {

using dl::detail::fail;

/// The expression with every operand held by value, so a node can keep it after the statement that
/// built it (tensor handles are copied, not elements).
template <class T>
[[nodiscard]] Tensor<T> own(const Tensor<T>& t) {
    return t;
}
template <class T>
[[nodiscard]] scalar_node<T> own(const scalar_node<T>& s) {
    return s;
}
template <class Op, class... E>
[[nodiscard]] auto own(const fn_node<Op, E...>& n) {
    return std::apply(
        [&](const auto&... e) { return fn_node<Op, decltype(own(e))...>{{}, n.op, {own(e)...}}; }, n.operands);
}

/// Index of the operand of a node with operands E... that holds leaf K, and K's index inside it.
template <std::size_t K, class... E>
struct leaf_location;
template <std::size_t K, class First, class... Rest>
struct leaf_location<K, First, Rest...> {
    static constexpr std::size_t here = leaf_count<std::remove_cvref_t<First>>;
    static constexpr bool inside = K < here;
    static constexpr std::size_t operand = inside ? 0 : 1 + leaf_location<K - here, Rest...>::operand;
    static constexpr std::size_t index = inside ? K : leaf_location<K - here, Rest...>::index;
};
template <std::size_t K>
struct leaf_location<K> {
    static constexpr std::size_t operand = 0, index = 0;
};

/// Whether a gradient can flow from the root of E to its leaf K: every node on the path yields a
/// floating value, and no comparison, logical op or where-condition lies on it.
template <std::size_t K, class E>
inline constexpr bool flows_to = false;
template <std::size_t K, class T>
inline constexpr bool flows_to<K, Tensor<T>> = is_floating_element<T>;
template <std::size_t K, class Op, class... E>
inline constexpr bool flows_to<K, fn_node<Op, E...>> = [] {
    using L = leaf_location<K, E...>;
    using child = std::remove_cvref_t<std::tuple_element_t<L::operand, std::tuple<E...>>>;
    if constexpr (!is_floating_element<typename fn_node<Op, E...>::value_type> ||
                  Op::rule == ops::result_rule::boolean)
        return false;
    else if constexpr (std::is_same_v<Op, ops::where>)
        return L::operand != 0 && flows_to<L::index, child>;
    else
        return flows_to<L::index, child>;
}();

template <class Op>
inline constexpr bool is_cast = requires { typename Op::target; };

/// The gradient reaching leaf K of e when e's gradient is g (an expression of e's shape, or one that
/// broadcasts to it). Every step of the chain is an expression node: nothing is evaluated here.
template <std::size_t K, class T, class G>
[[nodiscard]] decltype(auto) leaf_gradient(const Tensor<T>&, G&& g) {
    return std::forward<G>(g);
}
template <std::size_t K, class Op, class... E, class G>
[[nodiscard]] auto leaf_gradient(const fn_node<Op, E...>& n, G&& g) {
    using L = leaf_location<K, E...>;
    constexpr std::size_t i = L::operand;
    const auto& child = std::get<i>(n.operands);
    using V = compute_t<typename fn_node<Op, E...>::value_type>;
    if constexpr (std::is_same_v<Op, ops::where>) {
        const auto& cond = std::get<0>(n.operands);
        if constexpr (i == 1)
            return leaf_gradient<L::index>(child, make_node(ops::where{}, cond, std::forward<G>(g), scalar_node<V>{{}, V(0)}));
        else
            return leaf_gradient<L::index>(child, make_node(ops::where{}, cond, scalar_node<V>{{}, V(0)}, std::forward<G>(g)));
    } else if constexpr (is_cast<Op> || std::is_same_v<Op, ops::add> ||
                         (std::is_same_v<Op, ops::sub> && i == 0)) {
        return leaf_gradient<L::index>(child, std::forward<G>(g));
    } else if constexpr (std::is_same_v<Op, ops::neg> || std::is_same_v<Op, ops::sub>) {
        return leaf_gradient<L::index>(child, make_node(ops::neg{}, std::forward<G>(g)));
    } else {
        auto local = std::apply(
            [&](const auto&... operand) { return make_node(ops::derivative<Op, i>{n.op}, operand...); },
            n.operands);
        return leaf_gradient<L::index>(child, make_node(ops::mul{}, std::forward<G>(g), std::move(local)));
    }
}

/// The tensor that is leaf K of e.
template <std::size_t K, class T>
[[nodiscard]] const Tensor<T>& leaf(const Tensor<T>& t) {
    return t;
}
template <std::size_t K, class Op, class... E>
[[nodiscard]] decltype(auto) leaf(const fn_node<Op, E...>& n) {
    using L = leaf_location<K, E...>;
    return leaf<L::index>(std::get<L::operand>(n.operands));
}

/// Sends gradient g of expression e (owned) to every tensor in e that requires grad.
template <class E, class G>
void send_gradient(const E& e, const G& g) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
        auto one = [&]<std::size_t L>(std::integral_constant<std::size_t, L>) {
            if constexpr (flows_to<L, E>) {
                const auto& t = leaf<L>(e);
                if (auto* n = node_of(t)) accumulate(*n, leaf_gradient<L>(e, g));
            }
        };
        (one(std::integral_constant<std::size_t, K>{}), ...);
    }(std::make_index_sequence<leaf_count<E>>{});
}

/// Some tensor of e requires grad.
template <class E>
[[nodiscard]] bool any_requires_grad(const E& e) {
    bool any = false;
    dl::detail::for_each_tensor(e, [&](const auto& t) { any = any || t.requires_grad(); });
    return any;
}

/// Some tensor of e requires grad and e's Context records.
template <class E>
[[nodiscard]] bool expression_records(const E& e) {
    if (!any_requires_grad(e)) return false;
    Context* ctx = context_of(e);
    return (ctx ? *ctx : default_context()).grad_enabled();
}

/// Expressions whose result could carry a gradient (a floating result from a floating tensor).
template <class E>
inline constexpr bool differentiable = [] {
    using D = std::remove_cvref_t<E>;
    if constexpr (!is_floating_element<value_t<D>>)
        return false;
    else
        return []<std::size_t... K>(std::index_sequence<K...>) {
            return (flows_to<K, D> || ... || false);
        }(std::make_index_sequence<leaf_count<D>>{});
}();

template <class T>
[[nodiscard]] const Tensor<T>& traced_operand(recorder&, const Tensor<T>& t) {
    return t;
}
template <class T>
[[nodiscard]] const scalar_node<T>& traced_operand(recorder&, const scalar_node<T>& s) {
    return s;
}
template <class Op, class... E>
[[nodiscard]] Tensor<value_t<fn_node<Op, E...>>> traced_operand(recorder& r, const fn_node<Op, E...>& n);

/// The attributes of one functor applied to `operands`: its parameters and its scalar operands (by
/// position: s1=1.5 is a second operand of 1.5).
template <class R, class Op, class... A>
[[nodiscard]] std::string functor_attributes(const Op& op, const A&... operands) {
    std::ostringstream os;
    const char* separator = "";
    auto pair = [&](std::string_view key, const auto& value) {
        os << separator << key << '=';
        detail::describe_value(os, value);
        separator = ", ";
    };
    if constexpr (requires { op.slope; }) pair("slope", op.slope);
    if constexpr (requires { op.alpha; }) pair("alpha", op.alpha);
    if constexpr (is_cast<Op>) pair("to", dtype_name(dtype_of<R>));
    int position = 0;
    auto scalar = [&]<class O>(const O& o) {
        if constexpr (!is_tensor_v<O>) {
            os << separator << 's' << position << '=';
            detail::describe_value(os, o.value);
            separator = ", ";
        }
        ++position;
    };
    (scalar(operands), ...);
    return os.str();
}

/// What one operand's evaluator is built from over a tile: a tensor operand reads its tile operand, a
/// scalar keeps its value.
template <class T>
[[nodiscard]] dl::detail::row_source<T> tile_source(const argument_slot<Tensor<T>>& s, const tile_operand* inputs) {
    const tile_operand& in = inputs[s.input];
    return {static_cast<const T*>(in.data), in.broadcast};
}
template <class T>
[[nodiscard]] compute_t<T> tile_source(const argument_slot<scalar_node<T>>& s, const tile_operand*) {
    return static_cast<compute_t<T>>(s.value.value);
}
template <class Slot>
struct tile_evaluator;
template <class T>
struct tile_evaluator<argument_slot<Tensor<T>>> {
    using type = dl::detail::leaf_eval<T>;
};
template <class T>
struct tile_evaluator<argument_slot<scalar_node<T>>> {
    using type = dl::detail::scalar_eval<T>;
};

/// op(operands...) into count elements at out, in the same row loop that evaluates expressions.
template <class R, class Op, class... Slots>
void run_tile(const Op& op, R* out, std::int64_t count, const tile_operand* inputs, const std::tuple<Slots...>& slots) {
    using operand = typename fn_node<Op, std::remove_cvref_t<decltype(std::declval<Slots>().get({}))>...>::operand_type;
    // Built in place, evaluator by evaluator: this runs once per tile and step, and copying each
    // leaf's strides into the tree cost as much as a tile's arithmetic.
    auto ev = std::apply(
        [&](const auto&... s) {
            return dl::detail::node_eval<Op, operand, typename tile_evaluator<Slots>::type...>(
                op, std::piecewise_construct, tile_source(s, inputs)...);
        },
        slots);
    const std::int64_t origin[1] = {0};
    ev.seek(origin, 0);
    using dl::detail::row_kernel;
    if constexpr (dl::detail::vectorizes_into<decltype(ev), R>)
        dl::detail::run_row<row_kernel::simd>(out, 1, ev, 0, count, dl::detail::store_mode::write);
    else
        dl::detail::run_row<row_kernel::scalar>(out, 1, ev, 0, count, dl::detail::store_mode::write);
}

/// The tile kernel of op over operands held as `slots`: one per (op, operand types), shared by every
/// expression that applies op to them.
template <class R, class Op, class... Slots>
[[nodiscard]] tile_kernel tile_of(const Op& op, const std::tuple<Slots...>& slots) {
    return {[op, slots](const tile_operand* inputs, void* out, std::int64_t count) {
                run_tile<R, Op>(op, static_cast<R*>(out), count, inputs, slots);
            },
            Op::cost};
}

/// Records e as one op per functor, innermost first, and returns its value: tracing (graph/) sees a
/// compile-time fused expression as the chain of ops it is made of, which its fusion pass can fuse again.
/// Each op runs, now and in the graph, as its tile kernel over a chain of one step (autograd/tiles.hpp):
/// an expression assignment per traced op would compile every loop variant of it into each file.
template <class Op, class... E>
[[nodiscard]] Tensor<value_t<fn_node<Op, E...>>> traced_operand(recorder& r, const fn_node<Op, E...>& n) {
    using R = value_t<fn_node<Op, E...>>;
    // Braced initialisation evaluates (and records) the operands left to right.
    auto operands = std::apply([&](const auto&... e) { return std::tuple{traced_operand(r, e)...}; }, n.operands);
    return std::apply(
        [&](const auto&... a) {
            op_record op;
            op.name = Op::name;
            op.attributes = functor_attributes<R>(n.op, a...);
            op.kind = op_kind::elementwise;
            auto slot = [&]<class A>(const A& x) {
                if constexpr (is_tensor_v<A>) {
                    detail::argument_slot<A> s;
                    s.input = static_cast<int>(op.inputs.size());
                    op.inputs.emplace_back(x);
                    return s;
                } else {
                    return detail::argument_slot<A>{x};
                }
            };
            const std::tuple<detail::argument_slot<std::remove_cvref_t<decltype(a)>>...> slots{slot(a)...};
            op.tile = tile_of<R>(n.op, slots);
            op.kernel = step_kernel(op.name, op.attributes, op.inputs.size(), dtype_of<R>, op.tile);
            op.kernel(op.inputs, op.output);
            Tensor<R> result = std::get<Tensor<R>>(op.output);
            r.record(std::move(op));
            return result;
        },
        operands);
}

}  // namespace detail

template <class T, class E>
void assign_expression(Tensor<T>& out, E&& e, bool into_view) {
    if constexpr (expression<E>) {
        if constexpr (expression_node<E>) {
            Context* ctx = context_of(e);
            if (auto* r = (ctx ? *ctx : out.context()).recorder()) {
                if (into_view || (out.defined() && out.shape() != shape_of(e))) {
                    r->check_write(out.data(), "an elementwise write into existing elements");
                } else {
                    if constexpr (std::is_same_v<T, value_t<E>>)
                        out = detail::traced_operand(*r, e);
                    else
                        out = detail::traced_operand(*r, make_node(ops::cast<T>{}, std::forward<E>(e)));
                    return;
                }
            }
        } else if (into_view) {
            if (auto* r = out.context().recorder()) r->check_write(out.data(), "a copy into existing elements");
        }
        Context* ctx = context_of(e);
        if (!ctx) ctx = &out.context();
        const bool enabled = ctx->grad_enabled();
        if (enabled && out.requires_grad() && into_view)
            detail::fail("dl: in-place write into a view of shape ", out.shape(),
                         " that requires grad; update parameters under dl::no_grad");
        // The result gets new storage when it records, or when out itself requires grad: backward may
        // still need out's old values, and a leaf's values must not change behind the optimizer's back
        // (`y = f(y)` rebinds y in Python too).
        auto shape = [&] { return out.defined() ? out.shape() : shape_of(e); };
        if constexpr (is_floating_element<T> && detail::differentiable<E>) {
            if (enabled && detail::any_requires_grad(e)) {
                if (into_view)
                    detail::fail("dl: writing an expression that requires grad into a view of shape ", out.shape(),
                                 " is not supported by autograd yet; build the result as a new tensor");
                auto saved = detail::own(e);
                Tensor<T> result(shape(), *ctx);
                assign(result, saved);
                record(
                    result, [](const Tensor<T>& g, const auto& expr) { detail::send_gradient(expr, g); },
                    std::move(saved));
                out = std::move(result);
                return;
            }
        }
        if (enabled && out.requires_grad()) {
            Tensor<T> result(shape(), *ctx);
            assign(result, std::forward<E>(e));
            out = std::move(result);
            return;
        }
        assign(out, std::forward<E>(e));
    } else {
        if (auto* r = out.context().recorder(); r && out.defined()) r->check_write(out.data(), "a fill");
        if (out.requires_grad() && out.context().grad_enabled())
            detail::fail("dl: in-place write into a tensor of shape ", out.shape(),
                         " that requires grad; do it under dl::no_grad");
        assign(out, std::forward<E>(e));
    }
}

}  // namespace dl::autograd
