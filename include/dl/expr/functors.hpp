#pragma once
// One descriptor per elementwise op: its name, result-type rule, relative cost per element (for
// deciding when to use threads), whether it has a SIMD path, and one call operator that serves scalars
// and SIMD batches alike (see simd.hpp). Eager evaluation, the profiler and (later) autograd and the
// graph IR read these descriptors; nothing else defines an elementwise op.
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

#define DL_UNARY(Struct, Name, Rule, Cost, Vectorized, ...)               \
    struct Struct {                                                       \
        DL_OP_TRAITS(Name, Rule, Cost, Vectorized);                       \
        template <class V>                                                \
        DL_HOST_DEVICE DL_INLINE auto operator()(const V& x) const {      \
            return __VA_ARGS__;                                           \
        }                                                                 \
    }

#define DL_BINARY(Struct, Name, Rule, Cost, Vectorized, ...)                        \
    struct Struct {                                                                 \
        DL_OP_TRAITS(Name, Rule, Cost, Vectorized);                                 \
        template <class V>                                                          \
        DL_HOST_DEVICE DL_INLINE auto operator()(const V& a, const V& b) const {    \
            return __VA_ARGS__;                                                     \
        }                                                                           \
    }

// --- unary ---
DL_UNARY(neg, "neg", same, 1, true, V(-x));
DL_UNARY(square, "square", same, 1, true, V(x * x));
DL_UNARY(sqrt, "sqrt", floating, 4, true, math::sqrt(x));
DL_UNARY(rsqrt, "rsqrt", floating, 5, true, V(V(1) / math::sqrt(x)));
DL_UNARY(reciprocal, "reciprocal", floating, 4, true, V(V(1) / x));
DL_UNARY(exp, "exp", floating, 8, true, math::exp(x));
DL_UNARY(exp2, "exp2", floating, 10, true, math::exp2(x));
DL_UNARY(log, "log", floating, 10, true, math::log(x));
DL_UNARY(log2, "log2", floating, 10, true, math::log2(x));
DL_UNARY(log1p, "log1p", floating, 12, true, math::log1p(x));
DL_UNARY(expm1, "expm1", floating, 12, true, math::expm1(x));
DL_UNARY(sin, "sin", floating, 12, true, math::sin(x));
DL_UNARY(cos, "cos", floating, 12, true, math::cos(x));
DL_UNARY(tanh, "tanh", floating, 14, true, math::tanh(x));
DL_UNARY(sigmoid, "sigmoid", floating, 12, true, math::sigmoid(x));
DL_UNARY(silu, "silu", floating, 13, true, V(x * math::sigmoid(x)));
/// log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x, no cancellation for small.
DL_UNARY(softplus, "softplus", floating, 22, true,
         V(simd::max(V(0), x) + math::log1p(math::exp(-simd::abs(x)))));
/// gelu, tanh approximation: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
DL_UNARY(gelu, "gelu", floating, 16, true,
         V(V(0.5) * x *
           (V(1) + math::tanh(V(0.7978845608028654) * simd::fma(V(0.044715) * x, x * x, x)))));
/// gelu, exact form: x/2 (1 + erf(x / sqrt(2))).
DL_UNARY(gelu_erf, "gelu_erf", floating, 16, true,
         V(V(0.5) * x * (V(1) + math::erf(x * V(0.7071067811865476)))));
DL_UNARY(floor, "floor", same, 2, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (detail::integral<V>) return x; else return math::floor(x);
}());
DL_UNARY(ceil, "ceil", same, 2, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (detail::integral<V>) return x; else return math::ceil(x);
}());
/// Half away from zero (std::round), not numpy's half to even.
DL_UNARY(round, "round", same, 2, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (detail::integral<V>) return x; else return math::round(x);
}());
DL_UNARY(abs, "abs", same, 1, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (std::is_unsigned_v<V> || std::is_same_v<V, bool>) return x;
    else if constexpr (detail::integral<V>) return x < 0 ? V(-x) : x;
    else return simd::abs(x);
}());
/// max(x, 0); NaN stays NaN.
DL_UNARY(relu, "relu", same, 1, true, simd::max(V(0), x));
/// -1, 0 or 1 (NaN stays NaN, -0 stays -0).
DL_UNARY(sign, "sign", same, 2, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (std::is_same_v<V, bool>) return x;
    else return simd::select(x > V(0), V(1), simd::select(x < V(0), V(-1), x));
}());
DL_UNARY(isnan, "isnan", boolean, 1, true, simd::is_nan(x));
DL_UNARY(isfinite, "isfinite", boolean, 1, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (detail::integral<V>) return true; else return x - x == V(0);
}());
DL_UNARY(logical_not, "logical_not", boolean, 1, false, !static_cast<bool>(x));

/// x for x >= 0, slope * x otherwise.
struct leaky_relu {
    DL_OP_TRAITS("leaky_relu", floating, 2, true);
    double slope = 0.01;
    template <class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const V& x) const {
        return simd::select(x >= V(0), x, x * V(static_cast<simd::scalar_t<V>>(slope)));
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
};

// --- binary ---
DL_BINARY(add, "add", same, 1, true, V(a + b));
DL_BINARY(sub, "sub", same, 1, true, V(a - b));
DL_BINARY(mul, "mul", same, 1, true, V(a * b));
/// Integer division truncates; division by zero gives 0 (as numpy, without the warning) instead of a
/// crash, and INT_MIN / -1 wraps.
DL_BINARY(div, "div", same, 4, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (std::is_same_v<V, bool>)
        return a;
    else if constexpr (detail::integral<V> && std::is_signed_v<V>)
        return b == 0 ? V(0) : b == -1 ? V(~static_cast<std::make_unsigned_t<V>>(a) + 1u) : V(a / b);
    else if constexpr (detail::integral<V>)
        return b == 0 ? V(0) : V(a / b);
    else
        return V(a / b);
}());
DL_BINARY(pow, "pow", floating, 20, true, math::pow(a, b));
DL_BINARY(atan2, "atan2", floating, 20, true, math::atan2(a, b));
/// Elementwise minimum; NaN in either operand gives NaN.
DL_BINARY(minimum, "minimum", same, 1, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (detail::integral<V>) return a < b ? a : b;
    else return simd::select(simd::is_nan(a), a, simd::min(a, b));
}());
DL_BINARY(maximum, "maximum", same, 1, true, [&]() DL_INLINE_LAMBDA {
    if constexpr (detail::integral<V>) return a < b ? b : a;
    else return simd::select(simd::is_nan(a), a, simd::max(a, b));
}());
DL_BINARY(equal, "eq", boolean, 1, true, a == b);
// !(a == b) rather than a != b: xsimd 8 compiles batch != as an ordered compare (false for NaN).
DL_BINARY(not_equal, "ne", boolean, 1, true, !(a == b));
DL_BINARY(less, "lt", boolean, 1, true, a < b);
DL_BINARY(less_equal, "le", boolean, 1, true, a <= b);
DL_BINARY(greater, "gt", boolean, 1, true, a > b);
DL_BINARY(greater_equal, "ge", boolean, 1, true, a >= b);
DL_BINARY(logical_and, "logical_and", boolean, 1, false, static_cast<bool>(a) && static_cast<bool>(b));
DL_BINARY(logical_or, "logical_or", boolean, 1, false, static_cast<bool>(a) || static_cast<bool>(b));
DL_BINARY(logical_xor, "logical_xor", boolean, 1, false, static_cast<bool>(a) != static_cast<bool>(b));

// --- ternary ---
/// cond ? a : b; the condition operand is evaluated as bool (or as a SIMD mask).
struct where {
    DL_OP_TRAITS("where", select, 1, true);
    template <class M, class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const M& cond, const V& a, const V& b) const {
        return simd::select(cond, a, b);
    }
};
/// min(max(x, lo), hi); NaN in x stays NaN.
struct clamp {
    DL_OP_TRAITS("clamp", same, 2, true);
    template <class V>
    DL_HOST_DEVICE DL_INLINE V operator()(const V& x, const V& lo, const V& hi) const {
        return simd::min(hi, simd::max(lo, x));
    }
};

/// Conversion to U's compute type (C++ conversion rules; float to int truncates).
template <class U>
struct cast {
    DL_OP_TRAITS("cast", same, 1, false);
    using target = U;
    template <class V>
    DL_HOST_DEVICE DL_INLINE auto operator()(const V& x) const {
        return static_cast<U>(x);
    }
};

#undef DL_UNARY
#undef DL_BINARY
#undef DL_OP_TRAITS

}  // namespace dl::ops
