#pragma once
// Expression nodes. A node only holds its operands and a functor (ops::*); how one element or one SIMD
// batch is computed lives in evaluator.hpp, and where the loop runs in device/. Operands are stored as
// xtensor does: named tensors and named expressions by reference, temporaries moved into the node, so
// `auto e = a + b * 2;` is safe while `a` and `b` live.
#include <concepts>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../core/tensor.hpp"
#include "functors.hpp"

namespace dl {

template <class T>
struct is_tensor : std::false_type {};
template <class T>
struct is_tensor<Tensor<T>> : std::true_type {};
template <class T>
inline constexpr bool is_tensor_v = is_tensor<std::remove_cvref_t<T>>::value;

/// A tensor or a lazy elementwise expression.
template <class E>
concept expression = expression_node<E> || is_tensor_v<E>;

/// A plain number usable as an operand (bool excluded: `t + true` is more likely a bug than intent).
template <class S>
concept scalar = (std::is_arithmetic_v<std::remove_cvref_t<S>> && !std::is_same_v<std::remove_cvref_t<S>, bool>) ||
                 is_half_float<std::remove_cvref_t<S>>;

/// A constant, broadcast to any shape (rank 0). It takes part in type promotion as a T but keeps its
/// value in T's compute type: `x * 0.1f` on a bfloat16 tensor multiplies by float 0.1, not by 0.1
/// rounded to bfloat16.
template <element T>
struct scalar_node : detail::expression_tag {
    using value_type = T;
    compute_t<T> value;
};

namespace detail {

template <class E>
struct value_type_of {
    using type = typename std::remove_cvref_t<E>::value_type;
};
}  // namespace detail

/// Element type an expression produces.
template <class E>
using value_t = typename detail::value_type_of<E>::type;

namespace detail {

template <class... T>
struct promote_all;
template <class T>
struct promote_all<T> {
    using type = T;
};
template <class A, class B, class... Rest>
struct promote_all<A, B, Rest...> {
    using type = typename promote_all<promote_t<A, B>, Rest...>::type;
};

template <class Op, class... Values>
struct node_value {
    using promoted = typename promote_all<Values...>::type;
    using type = std::conditional_t<
        Op::rule == ops::result_rule::boolean, bool,
        std::conditional_t<Op::rule == ops::result_rule::floating && !is_floating_element<promoted>, float,
                           promoted>>;
};
template <class Cond, class A, class B>
struct node_value<ops::where, Cond, A, B> {
    using type = promote_t<A, B>;
};
template <class U, class V>
struct node_value<ops::cast<U>, V> {
    using type = U;
};

/// How a node holds an operand of (forwarding) type E.
template <class E>
using operand_t = std::conditional_t<std::is_lvalue_reference_v<E>, const std::remove_reference_t<E>&,
                                     std::remove_cvref_t<E>>;

}  // namespace detail

/// An elementwise op applied to operands (1 to 3) that broadcast against each other.
template <class Op, class... Operands>
struct fn_node : detail::expression_tag {
    using value_type = typename detail::node_value<Op, value_t<Operands>...>::type;
    /// Type the operands are converted to before Op runs (bool for where's condition).
    using operand_type =
        std::conditional_t<Op::rule == ops::result_rule::boolean || requires { typename Op::target; },
                           compute_t<typename detail::promote_all<value_t<Operands>...>::type>,
                           compute_t<value_type>>;
    [[no_unique_address]] Op op;
    std::tuple<Operands...> operands;

    /// Evaluates into a new tensor.
    [[nodiscard]] Tensor<value_type> eval() const { return Tensor<value_type>(*this); }

    template <class X>
    void operator=(X&&) {
        static_assert(std::is_void_v<X>, "dl: an expression is read-only; assign to a Tensor or a view of one");
    }
};

template <class Op, class... E>
[[nodiscard]] auto make_node(Op op, E&&... e) {
    fn_node<Op, detail::operand_t<E&&>...> node{{}, op, {std::forward<E>(e)...}};
    // Broadcasting is checked as the expression is built, so that the error points at the line that
    // built it rather than at a later assignment. (shape_of is found by argument-dependent lookup.)
    if constexpr (sizeof...(E) > 1) (void)shape_of(node);
    return node;
}

/// Wraps scalars as scalar_node<T> (T: the element type they combine with); passes expressions on.
template <class T, class S>
[[nodiscard]] decltype(auto) as_operand(S&& s) {
    if constexpr (expression<S>) {
        return std::forward<S>(s);
    } else {
        using U = std::remove_cvref_t<S>;
        // A float scalar does not widen a float tensor; an int tensor meets a float scalar as float.
        using V = std::conditional_t<is_floating_element<T> || std::is_integral_v<U>, T,
                                     std::conditional_t<std::is_same_v<U, double>, double, float>>;
        return scalar_node<V>{{}, static_cast<compute_t<V>>(s)};
    }
}

// --- shape and context of an expression ---

template <class T>
[[nodiscard]] Shape shape_of(const Tensor<T>& t) {
    return t.shape();
}
template <class T>
[[nodiscard]] Shape shape_of(const scalar_node<T>&) {
    return {};
}
template <class Op, class... E>
[[nodiscard]] Shape shape_of(const fn_node<Op, E...>& n) {
    return std::apply(
        [](const auto&... operand) {
            Shape s;
            ((s = broadcast_shapes(s, shape_of(operand), Op::name)), ...);
            return s;
        },
        n.operands);
}

/// Context of the first tensor in the expression (the default one if it has none).
template <class T>
[[nodiscard]] Context* context_of(const Tensor<T>& t) {
    return &t.context();
}
template <class T>
[[nodiscard]] Context* context_of(const scalar_node<T>&) {
    return nullptr;
}
template <class Op, class... E>
[[nodiscard]] Context* context_of(const fn_node<Op, E...>& n) {
    return std::apply(
        [](const auto&... operand) {
            Context* c = nullptr;
            ((c = c ? c : context_of(operand)), ...);
            return c;
        },
        n.operands);
}

/// Number of ops (nodes) in an expression.
template <class E>
inline constexpr int op_count = 0;
template <class Op, class... E>
inline constexpr int op_count<fn_node<Op, E...>> = 1 + (op_count<std::remove_cvref_t<E>> + ... + 0);

/// Number of tensor operands (leaves) in an expression, counted left to right.
template <class E>
inline constexpr std::size_t leaf_count = 0;
template <class T>
inline constexpr std::size_t leaf_count<Tensor<T>> = 1;
template <class Op, class... E>
inline constexpr std::size_t leaf_count<fn_node<Op, E...>> = (leaf_count<std::remove_cvref_t<E>> + ... + 0);

/// A name for what evaluating E does (the profiler's op names): the op for a single op, "copy" for a
/// tensor, "fused elementwise" for a chain.
template <class E>
inline constexpr const char* expression_name = op_count<E> == 0 ? "copy" : "fused elementwise";
template <class Op, class... E>
    requires(op_count<fn_node<Op, E...>> == 1)
inline constexpr const char* expression_name<fn_node<Op, E...>> = Op::name.data();

/// Sum of the per-element costs of the ops in an expression.
template <class E>
inline constexpr int cost_of = 0;
template <class Op, class... E>
inline constexpr int cost_of<fn_node<Op, E...>> = Op::cost + (cost_of<std::remove_cvref_t<E>> + ... + 0);

}  // namespace dl
