#pragma once
// The user-facing elementwise API: operators and named functions that build expression nodes.
// Nothing here computes; assigning the result to a Tensor (or .eval()) runs one fused loop.
#include <type_traits>
#include <utility>

#include "expression.hpp"

namespace dl {

namespace detail {
template <class...>
inline constexpr bool always_false = false;

template <class A, class B>
concept binary_operands = (expression<A> && (expression<B> || scalar<B>)) || (scalar<A> && expression<B>);

/// The type a number S meets an expression of element type T as: T, except that an integer number
/// compared with (or tested by a logical op against) an integer or bool tensor is an int64, so that
/// one outside T's range compares by value (`uint8 > -1` is true) instead of wrapping into T.
template <class Op, class T, class S>
using number_operand_t =
    std::conditional_t<Op::rule == ops::result_rule::boolean && std::is_integral_v<T> && std::is_integral_v<std::remove_cvref_t<S>>,
                       std::int64_t, T>;

template <class Op, class A, class B>
[[nodiscard]] auto make_binary(Op op, A&& a, B&& b) {
    if constexpr (expression<A> && expression<B>)
        return make_node(op, std::forward<A>(a), std::forward<B>(b));
    else if constexpr (expression<A>)
        return make_node(op, std::forward<A>(a), as_operand<number_operand_t<Op, value_t<A>, B>>(std::forward<B>(b)));
    else
        return make_node(op, as_operand<number_operand_t<Op, value_t<B>, A>>(std::forward<A>(a)), std::forward<B>(b));
}
}  // namespace detail

// --- operators ---
#define DL_BINARY_OPERATOR(sym, Op)                                                                          \
    template <class A, class B>                                                                              \
        requires detail::binary_operands<A, B>                                                               \
    [[nodiscard]] auto operator sym(A&& a, B&& b) {                                                          \
        return detail::make_binary(ops::Op{}, std::forward<A>(a), std::forward<B>(b));                       \
    }                                                                                                        \
    template <class A, class B>                                                                              \
        requires((expression<A> || expression<B>) && !detail::binary_operands<A, B>)                         \
    void operator sym(A&&, B&&) {                                                                            \
        static_assert(detail::always_false<A, B>,                                                            \
                      "dl: operator" #sym " needs a Tensor or expression, and a Tensor, expression or number"); \
    }
DL_BINARY_OPERATOR(+, add)
DL_BINARY_OPERATOR(-, sub)
DL_BINARY_OPERATOR(*, mul)
DL_BINARY_OPERATOR(/, div)
DL_BINARY_OPERATOR(==, equal)
DL_BINARY_OPERATOR(!=, not_equal)
DL_BINARY_OPERATOR(<, less)
DL_BINARY_OPERATOR(<=, less_equal)
DL_BINARY_OPERATOR(>, greater)
DL_BINARY_OPERATOR(>=, greater_equal)
#undef DL_BINARY_OPERATOR

template <expression E>
[[nodiscard]] auto operator-(E&& e) {
    return make_node(ops::neg{}, std::forward<E>(e));
}
template <expression E>
[[nodiscard]] auto operator!(E&& e) {
    return make_node(ops::logical_not{}, std::forward<E>(e));
}

// --- named functions ---
#define DL_UNARY_FUNCTION(name)                                 \
    template <expression E>                                     \
    [[nodiscard]] auto name(E&& e) {                            \
        return make_node(ops::name{}, std::forward<E>(e));      \
    }
DL_UNARY_FUNCTION(neg)
DL_UNARY_FUNCTION(abs)
DL_UNARY_FUNCTION(sqrt)
DL_UNARY_FUNCTION(rsqrt)
DL_UNARY_FUNCTION(exp)
DL_UNARY_FUNCTION(exp2)
DL_UNARY_FUNCTION(log)
DL_UNARY_FUNCTION(log2)
DL_UNARY_FUNCTION(log1p)
DL_UNARY_FUNCTION(expm1)
DL_UNARY_FUNCTION(sin)
DL_UNARY_FUNCTION(cos)
DL_UNARY_FUNCTION(tanh)
DL_UNARY_FUNCTION(sigmoid)
DL_UNARY_FUNCTION(relu)
DL_UNARY_FUNCTION(silu)
DL_UNARY_FUNCTION(softplus)
DL_UNARY_FUNCTION(gelu)
DL_UNARY_FUNCTION(gelu_erf)
DL_UNARY_FUNCTION(square)
DL_UNARY_FUNCTION(reciprocal)
DL_UNARY_FUNCTION(floor)
DL_UNARY_FUNCTION(ceil)
DL_UNARY_FUNCTION(round)
DL_UNARY_FUNCTION(sign)
DL_UNARY_FUNCTION(isnan)
DL_UNARY_FUNCTION(isfinite)
DL_UNARY_FUNCTION(logical_not)
#undef DL_UNARY_FUNCTION

template <expression E>
[[nodiscard]] auto leaky_relu(E&& e, double slope = 0.01) {
    return make_node(ops::leaky_relu{.slope = slope}, std::forward<E>(e));
}
template <expression E>
[[nodiscard]] auto elu(E&& e, double alpha = 1.0) {
    return make_node(ops::elu{.alpha = alpha}, std::forward<E>(e));
}

#define DL_BINARY_FUNCTION(name)                                                                \
    template <class A, class B>                                                                 \
        requires detail::binary_operands<A, B>                                                  \
    [[nodiscard]] auto name(A&& a, B&& b) {                                                     \
        return detail::make_binary(ops::name{}, std::forward<A>(a), std::forward<B>(b));        \
    }
DL_BINARY_FUNCTION(add)
DL_BINARY_FUNCTION(sub)
DL_BINARY_FUNCTION(mul)
DL_BINARY_FUNCTION(div)
DL_BINARY_FUNCTION(pow)
DL_BINARY_FUNCTION(atan2)
DL_BINARY_FUNCTION(minimum)
DL_BINARY_FUNCTION(maximum)
DL_BINARY_FUNCTION(logical_and)
DL_BINARY_FUNCTION(logical_or)
DL_BINARY_FUNCTION(logical_xor)
#undef DL_BINARY_FUNCTION

/// cond ? a : b elementwise; a and b may be numbers.
template <expression C, class A, class B>
    requires(expression<A> || expression<B> || (scalar<A> && scalar<B>))
[[nodiscard]] auto where(C&& cond, A&& a, B&& b) {
    if constexpr (expression<A> && expression<B>) {
        return make_node(ops::where{}, std::forward<C>(cond), std::forward<A>(a), std::forward<B>(b));
    } else if constexpr (expression<A>) {
        return make_node(ops::where{}, std::forward<C>(cond), std::forward<A>(a),
                         as_operand<value_t<A>>(std::forward<B>(b)));
    } else if constexpr (expression<B>) {
        return make_node(ops::where{}, std::forward<C>(cond), as_operand<value_t<B>>(std::forward<A>(a)),
                         std::forward<B>(b));
    } else {
        using T = promote_t<std::remove_cvref_t<A>, std::remove_cvref_t<B>>;
        return make_node(ops::where{}, std::forward<C>(cond), scalar_node<T>{{}, static_cast<T>(a)},
                         scalar_node<T>{{}, static_cast<T>(b)});
    }
}

/// min(max(x, lo), hi) with number bounds.
template <expression E, scalar L, scalar H>
[[nodiscard]] auto clamp(E&& e, L lo, H hi) {
    using T = value_t<E>;
    return make_node(ops::clamp{}, std::forward<E>(e), as_operand<T>(lo), as_operand<T>(hi));
}

/// Elementwise conversion to U.
template <element U, expression E>
[[nodiscard]] auto cast(E&& e) {
    return make_node(ops::cast<U>{}, std::forward<E>(e));
}

/// Evaluates an expression into a new tensor.
template <expression E>
[[nodiscard]] Tensor<value_t<E>> eval(E&& e) {
    if constexpr (is_tensor_v<E>)
        return e;
    else
        return Tensor<value_t<E>>(std::forward<E>(e));
}

namespace detail {
/// In-place arithmetic on a leaf that requires grad (a parameter) is refused while gradients are on,
/// as in PyTorch: the optimizer would not see the change, and backward would use the wrong values.
template <class T>
void check_in_place(const Tensor<T>& t, const char* op) {
    if (t.requires_grad() && t.is_leaf() && t.context().grad_enabled())
        fail("dl: operator", op, " on a leaf tensor that requires grad; update parameters under dl::no_grad");
}
}  // namespace detail

// --- compound assignment: t op= e is t = t op e (in place unless it records for autograd) ---
#define DL_COMPOUND(sym, Op)                                                       \
    template <class T, class E>                                                    \
        requires(expression<E> || scalar<E>)                                       \
    Tensor<T>& operator sym(Tensor<T>& t, E&& e) {                                 \
        detail::check_in_place(t, #sym);                                           \
        return t = detail::make_binary(ops::Op{}, t, std::forward<E>(e));          \
    }                                                                              \
    template <class T, class E>                                                    \
        requires(expression<E> || scalar<E>)                                       \
    Tensor<T>& operator sym(Tensor<T>&& t, E&& e) {                                \
        return std::move(t) = detail::make_binary(ops::Op{}, t, std::forward<E>(e)); \
    }
DL_COMPOUND(+=, add)
DL_COMPOUND(-=, sub)
DL_COMPOUND(*=, mul)
DL_COMPOUND(/=, div)
#undef DL_COMPOUND

}  // namespace dl
