#pragma once
// One descriptor per elementwise op: its name, result-type rule, relative cost per element (for
// deciding when to use threads), whether it has a SIMD path, and one call operator that serves scalars
// and SIMD batches alike (see simd.hpp). Eager evaluation, the profiler and (later) autograd and the
// graph IR read these descriptors; nothing else defines an elementwise op.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "math.hpp"

namespace dl::ops {

/// How an op's result element type follows from its operands'.
enum class result_rule {
    same,      ///< the promoted operand type
    floating,  ///< the promoted operand type if floating, else float
    boolean,   ///< bool
    select,    ///< where(cond, a, b): the promoted type of a and b
};

namespace detail {
template <class V>
inline constexpr bool integral = std::is_integral_v<V>;
}  // namespace detail

#define DL_OP_TRAITS(Name, Rule, Cost, Vectorized)                 \
    static constexpr std::string_view name = Name;                \
    static constexpr result_rule rule = result_rule::Rule;        \
    static constexpr int cost = Cost;                             \
    static constexpr bool vectorized = Vectorized

// Each op also carries its derivative: partial<I>(x...) is the partial derivative of the op with
// respect to operand I at the operands' values, written over V like the op itself, so that autograd
// builds the backward of an expression as another expression (one fused loop, see autograd/).
#define DL_UNARY(Struct, Name, Rule, Cost, Vectorized, Value, Derivative)    \
    struct Struct {                                                          \
        DL_OP_TRAITS(Name, Rule, Cost, Vectorized);                          \
        template <class V>                                                   \
        DL_HOST_DEVICE DL_INLINE auto operator()(const V& x) const {         \
            return Value;                                                    \
        }                                                                    \
        template <std::size_t I, class V>                                    \
        DL_HOST_DEVICE DL_INLINE V partial([[maybe_unused]] const V& x) const { \
            return V(Derivative);                                            \
        }                                                                    \
    }

#define DL_BINARY(Struct, Name, Rule, Cost, Vectorized, Value, DerivativeA, DerivativeB)  \
    struct Struct {                                                                     \
        DL_OP_TRAITS(Name, Rule, Cost, Vectorized);                                     \
        template <class V>                                                              \
        DL_HOST_DEVICE DL_INLINE auto operator()(const V& a, const V& b) const {        \
            return Value;                                                               \
        }                                                                               \
        template <std::size_t I, class V>                                               \
        DL_HOST_DEVICE DL_INLINE V partial([[maybe_unused]] const V& a, [[maybe_unused]] const V& b) const { \
            if constexpr (I == 0)                                                       \
                return V(DerivativeA);                                                  \
            else                                                                        \
                return V(DerivativeB);                                                  \
        }                                                                               \
    }

// Comparisons and logical ops have bool results: nothing differentiates through them, and their
// "derivative" is never used.
#define DL_NO_DERIVATIVE V(0)

// --- unary ---
DL_UNARY(neg, "neg", same, 1, true, V(-x), V(-1));
DL_UNARY(square, "square", same, 1, true, V(x * x), V(2) * x);
DL_UNARY(sqrt, "sqrt", floating, 4, true, math::sqrt(x), V(0.5) / math::sqrt(x));
DL_UNARY(rsqrt, "rsqrt", floating, 5, true, V(V(1) / math::sqrt(x)), V(-0.5) / (x * math::sqrt(x)));
DL_UNARY(reciprocal, "reciprocal", floating, 4, true, V(V(1) / x), V(-1) / (x * x));
DL_UNARY(exp, "exp", floating, 8, true, math::exp(x), math::exp(x));
DL_UNARY(exp2, "exp2", floating, 10, true, math::exp2(x), math::exp2(x) * V(0.6931471805599453));
DL_UNARY(log, "log", floating, 10, true, math::log(x), V(1) / x);
DL_UNARY(log2, "log2", floating, 10, true, math::log2(x), V(1.4426950408889634) / x);
DL_UNARY(log1p, "log1p", floating, 12, true, math::log1p(x), V(1) / (V(1) + x));
DL_UNARY(expm1, "expm1", floating, 12, true, math::expm1(x), math::exp(x));
DL_UNARY(sin, "sin", floating, 12, true, math::sin(x), math::cos(x));
DL_UNARY(cos, "cos", floating, 12, true, math::cos(x), -math::sin(x));
DL_UNARY(tanh, "tanh", floating, 14, true, math::tanh(x), ([&]() DL_INLINE_LAMBDA {
             const V t = math::tanh(x);
             return V(V(1) - t * t);
         }()));
DL_UNARY(sigmoid, "sigmoid", floating, 12, true, math::sigmoid(x), ([&]() DL_INLINE_LAMBDA {
             const V s = math::sigmoid(x);
             return V(s * (V(1) - s));
         }()));
DL_UNARY(silu, "silu", floating, 13, true, V(x * math::sigmoid(x)), ([&]() DL_INLINE_LAMBDA {
             const V s = math::sigmoid(x);
             return V(s * (V(1) + x * (V(1) - s)));
         }()));
/// log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x, no cancellation for small.
DL_UNARY(softplus, "softplus", floating, 22, true,
         V(simd::max(V(0), x) + math::log1p(math::exp(-simd::abs(x)))), math::sigmoid(x));
/// gelu, tanh approximation: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
DL_UNARY(gelu, "gelu", floating, 16, true,
         V(V(0.5) * x *
           (V(1) + math::tanh(V(0.7978845608028654) * simd::fma(V(0.044715) * x, x * x, x)))),
         ([&]() DL_INLINE_LAMBDA {
             const V t = math::tanh(V(0.7978845608028654) * simd::fma(V(0.044715) * x, x * x, x));
             const V du = V(0.7978845608028654) * (V(1) + V(3 * 0.044715) * x * x);
             return V(V(0.5) * (V(1) + t) + V(0.5) * x * (V(1) - t * t) * du);
         }()));
/// gelu, exact form: x/2 (1 + erf(x / sqrt(2))).
DL_UNARY(gelu_erf, "gelu_erf", floating, 16, true,
         V(V(0.5) * x * (V(1) + math::erf(x * V(0.7071067811865476)))),
         V(V(0.5) * (V(1) + math::erf(x * V(0.7071067811865476))) +
           x * V(0.3989422804014327) * math::exp(V(-0.5) * x * x)));
// Piecewise constant: derivative 0, as PyTorch defines it.
DL_UNARY(floor, "floor", same, 2, true, ([&]() DL_INLINE_LAMBDA {
             if constexpr (detail::integral<V>) return x; else return math::floor(x);
         }()), V(0));
DL_UNARY(ceil, "ceil", same, 2, true, ([&]() DL_INLINE_LAMBDA {
             if constexpr (detail::integral<V>) return x; else return math::ceil(x);
         }()), V(0));
/// Half away from zero (std::round), not numpy's half to even.
DL_UNARY(round, "round", same, 2, true, ([&]() DL_INLINE_LAMBDA {
             if constexpr (detail::integral<V>) return x; else return math::round(x);
         }()), V(0));
/// Derivative sign(x), 0 at 0.
DL_UNARY(abs, "abs", same, 1, true, ([&]() DL_INLINE_LAMBDA {
             if constexpr (std::is_unsigned_v<V> || std::is_same_v<V, bool>) return x;
             else if constexpr (detail::integral<V>) return x < 0 ? V(-x) : x;
             else return simd::abs(x);
         }()), simd::select(x > V(0), V(1), simd::select(x < V(0), V(-1), V(0))));
/// max(x, 0); NaN stays NaN. Derivative 1 for x > 0, else 0.
DL_UNARY(relu, "relu", same, 1, true, simd::max(V(0), x), simd::select(x > V(0), V(1), V(0)));
/// -1, 0 or 1 (NaN stays NaN, -0 stays -0).
DL_UNARY(sign, "sign", same, 2, true, ([&]() DL_INLINE_LAMBDA {
             if constexpr (std::is_same_v<V, bool>) return x;
             else return simd::select(x > V(0), V(1), simd::select(x < V(0), V(-1), x));
         }()), V(0));
DL_UNARY(isnan, "isnan", boolean, 1, true, simd::is_nan(x), DL_NO_DERIVATIVE);
DL_UNARY(isfinite, "isfinite", boolean, 1, true, ([&]() DL_INLINE_LAMBDA {
             if constexpr (detail::integral<V>) return true; else return x - x == V(0);
         }()), DL_NO_DERIVATIVE);
DL_UNARY(logical_not, "logical_not", boolean, 1, false, !static_cast<bool>(x), DL_NO_DERIVATIVE);

/// x for x >= 0, slope * x otherwise.
struct leaky_relu {
    DL_OP_TRAITS("leaky_relu", floating, 2, true);
    double slope = 0.01;
    template <class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const V& x) const {
        return simd::select(x >= V(0), x, x * V(static_cast<simd::scalar_t<V>>(slope)));
    }
    template <std::size_t I, class V>
    DL_HOST_DEVICE DL_INLINE V partial(const V& x) const {
        return simd::select(x > V(0), V(1), V(static_cast<simd::scalar_t<V>>(slope)));
    }
};
/// x for x > 0, alpha (e^x - 1) otherwise.
struct elu {
    DL_OP_TRAITS("elu", floating, 14, true);
    double alpha = 1.0;
    template <class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const V& x) const {
        return simd::select(x > V(0), x, V(static_cast<simd::scalar_t<V>>(alpha)) * math::expm1(x));
    }
    template <std::size_t I, class V>
    DL_HOST_DEVICE DL_INLINE V partial(const V& x) const {
        return simd::select(x > V(0), V(1), V(static_cast<simd::scalar_t<V>>(alpha)) * math::exp(x));
    }
};

// --- binary ---
DL_BINARY(add, "add", same, 1, true, V(a + b), V(1), V(1));
DL_BINARY(sub, "sub", same, 1, true, V(a - b), V(1), V(-1));
DL_BINARY(mul, "mul", same, 1, true, V(a * b), b, a);
/// Integer division truncates; division by zero gives 0 (as numpy, without the warning) instead of a
/// crash, and INT_MIN / -1 wraps.
DL_BINARY(div, "div", same, 4, true, ([&]() DL_INLINE_LAMBDA {
              if constexpr (std::is_same_v<V, bool>)
                  return a;
              else if constexpr (detail::integral<V> && std::is_signed_v<V>)
                  return b == 0 ? V(0) : b == -1 ? V(~static_cast<std::make_unsigned_t<V>>(a) + 1u) : V(a / b);
              else if constexpr (detail::integral<V>)
                  return b == 0 ? V(0) : V(a / b);
              else
                  return V(a / b);
          }()),
          V(1) / b, -a / (b * b));
/// Derivatives as PyTorch defines them where the formula breaks down: 0 for the base when the
/// exponent is 0, 0 for the exponent when the base is 0 and the exponent is not negative.
DL_BINARY(pow, "pow", floating, 20, true, math::pow(a, b),
          simd::select(b == V(0), V(0), V(b * math::pow(a, V(b - V(1))))),
          simd::select(a == V(0), simd::select(b >= V(0), V(0), V(math::pow(a, b) * math::log(a))),
                       V(math::pow(a, b) * math::log(a))));
DL_BINARY(atan2, "atan2", floating, 20, true, math::atan2(a, b), b / (a * a + b * b), -a / (a * a + b * b));
/// Elementwise minimum; NaN in either operand gives NaN. At a tie each operand gets half the gradient.
DL_BINARY(minimum, "minimum", same, 1, true, ([&]() DL_INLINE_LAMBDA {
              if constexpr (detail::integral<V>) return a < b ? a : b;
              else return simd::select(simd::is_nan(a), a, simd::min(a, b));
          }()),
          simd::select(a < b, V(1), simd::select(a == b, V(0.5), V(0))),
          simd::select(b < a, V(1), simd::select(a == b, V(0.5), V(0))));
DL_BINARY(maximum, "maximum", same, 1, true, ([&]() DL_INLINE_LAMBDA {
              if constexpr (detail::integral<V>) return a < b ? b : a;
              else return simd::select(simd::is_nan(a), a, simd::max(a, b));
          }()),
          simd::select(a > b, V(1), simd::select(a == b, V(0.5), V(0))),
          simd::select(b > a, V(1), simd::select(a == b, V(0.5), V(0))));
DL_BINARY(equal, "eq", boolean, 1, true, a == b, DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
// !(a == b) rather than a != b: xsimd 8 compiles batch != as an ordered compare (false for NaN).
DL_BINARY(not_equal, "ne", boolean, 1, true, !(a == b), DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(less, "lt", boolean, 1, true, a < b, DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(less_equal, "le", boolean, 1, true, a <= b, DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(greater, "gt", boolean, 1, true, a > b, DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(greater_equal, "ge", boolean, 1, true, a >= b, DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(logical_and, "logical_and", boolean, 1, false, static_cast<bool>(a) && static_cast<bool>(b),
          DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(logical_or, "logical_or", boolean, 1, false, static_cast<bool>(a) || static_cast<bool>(b),
          DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);
DL_BINARY(logical_xor, "logical_xor", boolean, 1, false, static_cast<bool>(a) != static_cast<bool>(b),
          DL_NO_DERIVATIVE, DL_NO_DERIVATIVE);

// --- ternary ---
/// cond ? a : b; the condition operand is evaluated as bool (or as a SIMD mask). Its gradient is
/// built directly (autograd/): where(cond, g, 0) for a, where(cond, 0, g) for b.
struct where {
    DL_OP_TRAITS("where", select, 1, true);
    template <class M, class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const M& cond, const V& a, const V& b) const {
        return simd::select(cond, a, b);
    }
};
/// min(max(x, lo), hi); NaN in x stays NaN. The gradient goes to x inside [lo, hi], else to the
/// bound that was hit.
struct clamp {
    DL_OP_TRAITS("clamp", same, 2, true);
    template <class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const V& x, const V& lo, const V& hi) const {
        return simd::min(hi, simd::max(lo, x));
    }
    template <std::size_t I, class V>
    DL_HOST_DEVICE DL_INLINE V partial(const V& x, const V& lo, const V& hi) const {
        if constexpr (I == 0)
            return simd::select(x >= lo, simd::select(x <= hi, V(1), V(0)), V(0));
        else if constexpr (I == 1)
            return simd::select(x < lo, simd::select(lo <= hi, V(1), V(0)), V(0));
        else
            return simd::select(x > hi, V(1), simd::select(lo > hi, V(1), V(0)));
    }
};

/// Conversion to U's compute type (C++ conversion rules; float to int truncates). Its gradient is the
/// incoming one converted back (autograd/).
template <class U>
struct cast {
    DL_OP_TRAITS("cast", same, 1, false);
    using target = U;
    template <class V>
    DL_HOST_DEVICE DL_INLINE auto operator()(const V& x) const {
        return static_cast<U>(x);
    }
};

/// The partial derivative of Op with respect to operand I, as an op of its own: the backward of an
/// expression applies it to the same operands.
template <class Op, std::size_t I>
struct derivative {
    static constexpr std::string_view name = "derivative";
    static constexpr result_rule rule = result_rule::floating;
    static constexpr int cost = Op::cost + 1;
    static constexpr bool vectorized = Op::vectorized;
    [[no_unique_address]] Op op;
    template <class... V>
    DL_HOST_DEVICE DL_INLINE auto operator()(const V&... x) const {
        return op.template partial<I>(x...);
    }
};

/// The functors whose ops take their operands by name alone (plus attributes such as leaky_relu's
/// slope): what a loaded graph (graph/serialize.hpp) and generated kernels (graph/codegen.hpp) name.
template <class... Op>
struct op_list {};
using unary_functors =
    op_list<neg, square, sqrt, rsqrt, reciprocal, exp, exp2, log, log2, log1p, expm1, sin, cos, tanh, sigmoid,
            silu, softplus, gelu, gelu_erf, floor, ceil, round, abs, relu, sign, isnan, isfinite, leaky_relu, elu>;
using binary_functors = op_list<add, sub, mul, div, pow, atan2, minimum, maximum, equal, not_equal, less,
                                less_equal, greater, greater_equal>;
using logical_functors = op_list<logical_and, logical_or, logical_xor>;

/// Whether one of the list's ops has this name.
template <class... Op>
[[nodiscard]] constexpr bool listed(op_list<Op...>, std::string_view name) {
    return ((Op::name == name) || ...);
}

/// An op's name as a template argument: `named<"sigmoid">` is ops::sigmoid.
template <std::size_t N>
struct op_name {
    char text[N];
    consteval op_name(const char (&s)[N]) {  // NOLINT: implicit, so that a string literal converts
        for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
    }
    [[nodiscard]] constexpr std::string_view view() const { return {text, N - 1}; }
};
namespace detail {
template <op_name Name, class First, class... Rest>
consteval auto find_named(op_list<First, Rest...>) {
    if constexpr (First::name == Name.view())
        return std::type_identity<First>{};
    else if constexpr (sizeof...(Rest) > 0)
        return find_named<Name>(op_list<Rest...>{});
    else
        static_assert(sizeof...(Rest) > 0, "dl::ops::named: no unary, binary or logical op has this name");
}
template <class... A, class... B, class... C>
consteval op_list<A..., B..., C...> join(op_list<A...>, op_list<B...>, op_list<C...>) { return {}; }
}  // namespace detail
template <op_name Name>
using named = typename decltype(detail::find_named<Name>(
    detail::join(unary_functors{}, binary_functors{}, logical_functors{})))::type;

#undef DL_UNARY
#undef DL_BINARY
#undef DL_NO_DERIVATIVE
#undef DL_OP_TRAITS

}  // namespace dl::ops
