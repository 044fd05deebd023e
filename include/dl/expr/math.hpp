#pragma once
// Elementwise math written once for scalars and SIMD batches (see simd.hpp). float gets dl's own
// kernels where speed matters (exp and what builds on it); the rest, and double, use xsimd, whose
// batch functions the scalar path calls too (on a batch holding the one value), so that an element's
// bits do not depend on whether its operands were contiguous or strided. Without SIMD (DL_NO_SIMD)
// the scalar path is <cmath>. Accuracy is tested against double references (tests/expr/math.cpp).
#include <cmath>
#include <type_traits>

#include "simd.hpp"

namespace dl::math {

namespace detail {
template <class M>
DL_INLINE bool all(const M& mask) noexcept {
    if constexpr (std::is_same_v<M, bool>)
        return mask;
    else
        return xsimd::all(mask);
}
template <class V>
inline constexpr bool is_float = std::is_same_v<simd::scalar_t<V>, float>;
}  // namespace detail

namespace detail {
/// f(x) for a batch; for a scalar, lane 0 of f on a batch holding x (the same bits as the SIMD path),
/// or `fallback` where the type has no batch.
template <class V, class F, class G>
DL_INLINE V batch_math(const V& x, F f, G fallback) noexcept {
#ifndef DL_NO_SIMD
    if constexpr (simd::is_batch<V>)
        return f(x);
    else if constexpr (simd::has_batch<V>)
        return f(simd::batch<V>(x)).get(0);
    else
#endif
        return fallback(x);
}
template <class V, class F, class G>
DL_INLINE V batch_math(const V& x, const V& y, F f, G fallback) noexcept {
#ifndef DL_NO_SIMD
    if constexpr (simd::is_batch<V>)
        return f(x, y);
    else if constexpr (simd::has_batch<V>)
        return f(simd::batch<V>(x), simd::batch<V>(y)).get(0);
    else
#endif
        return fallback(x, y);
}
}  // namespace detail

#define DL_MATH_FALLBACK(name, V, x) \
    return detail::batch_math(       \
        x, [](const auto& b) { return xsimd::name(b); }, [](const auto& v) { return std::name(v); })

namespace detail {
/// e^r - 1 for |r| <= ln2/2: r + r^2 P(r), P of degree 4 with minimax coefficients from
/// tools/fit_exp.py (relative error 1.4e-8, a quarter ulp; one FMA fewer than Cephes' degree 5).
template <class V>
DL_INLINE V expm1_poly(const V& r) noexcept {
    V p = V(1.387067488e-03f);
    p = simd::fma(p, r, V(8.366265334e-03f));
    p = simd::fma(p, r, V(4.166743532e-02f));
    p = simd::fma(p, r, V(1.666654646e-01f));
    p = simd::fma(p, r, V(4.999999702e-01f));
    return simd::fma(p, r * r, r);
}

/// Splits x = n ln2 + r (Cody-Waite two-part ln2, so r is exact to float precision) and returns
/// 2^n as a float. Adding 1.5 * 2^23 + 127 rounds x log2(e) to an integer n held in the low mantissa
/// bits, biased by 127: shifting those bits into the exponent field makes 2^n. Valid while n stays
/// in [-126, 127].
template <class V>
DL_INLINE V reduce_ln2(const V& x, V& r) noexcept {
    constexpr float shifter = 0x1.8p23f + 127.0f;
    const V k = simd::fma(x, V(1.44269504088896341f), V(shifter));
    const V n = k - V(shifter);
    r = simd::fma(n, V(-0.693359375f), x);
    r = simd::fma(n, V(2.12194440e-4f), r);
    return simd::float_from_bits(simd::bits_of(k) << 23);
}

/// e^x for float, ≤ 1 ulp. While every |x| <= 87.3 the result is a normal float and 2^n a single
/// multiply; otherwise x is clamped to [-104, 89] and 2^n applied in two steps, which reaches the
/// subnormal results and overflows to inf; NaN stays NaN.
template <class V>
DL_INLINE V exp_float(const V& x) noexcept {
    V r;
    const V scale = reduce_ln2(x, r);
    if (all(simd::abs(x) <= V(87.3f))) return simd::fma(expm1_poly(r), scale, scale);
    const V xc = simd::min(V(89.0f), simd::max(V(-104.0f), x));
    const V n = simd::round_even(xc * V(1.44269504088896341f));
    V rc = simd::fma(n, V(-0.693359375f), xc);
    rc = simd::fma(n, V(2.12194440e-4f), rc);
    const V n1 = simd::round_even(n * V(0.5f)), n2 = n - n1;
    const V y = expm1_poly(rc) + V(1.0f);
    return simd::select(simd::is_nan(x), x, y * simd::pow2i(n1) * simd::pow2i(n2));
}

/// 2^x for float: the same kernel on x ln2 split exactly (x - n is exact); own, because xsimd 8's
/// exp2 overflows to inf for x just below 128.
template <class V>
DL_INLINE V exp2_float(const V& x) noexcept {
    const V n = simd::round_even(x);
    const V r = (x - n) * V(0.693147180559945309f);
    if (all(simd::abs(x) <= V(125.0f))) return (expm1_poly(r) + V(1.0f)) * simd::pow2i(n);
    const V xc = simd::min(V(129.0f), simd::max(V(-151.0f), x));
    const V nc = simd::round_even(xc);
    const V n1 = simd::round_even(nc * V(0.5f)), n2 = nc - n1;
    const V rc = (xc - nc) * V(0.693147180559945309f);
    const V y = (expm1_poly(rc) + V(1.0f)) * simd::pow2i(n1) * simd::pow2i(n2);
    return simd::select(simd::is_nan(x), x, y);
}
}  // namespace detail

/// e^x; float: own kernel, double: xsimd / <cmath>.
template <class V>
DL_INLINE V exp(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        DL_MATH_FALLBACK(exp, V, x);
    } else {
        return detail::exp_float(x);
    }
}

template <class V>
DL_INLINE V exp2(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        DL_MATH_FALLBACK(exp2, V, x);
    } else {
        return detail::exp2_float(x);
    }
}

/// e^x - 1; float above 80 goes through exp (xsimd 8's expm1 overflows early), where the -1 is lost
/// to rounding anyway.
template <class V>
DL_INLINE V expm1(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        DL_MATH_FALLBACK(expm1, V, x);
    } else {
        const V e = detail::batch_math(
            x, [](const auto& b) { return xsimd::expm1(b); }, [](const auto& v) { return std::expm1(v); });
        return simd::select(x > V(80.0f), math::exp(x), e);
    }
}

/// 1 / (1 + e^-x). While |x| <= 87.3, e^-x is a normal float and the plain formula is accurate
/// (≤ 2 ulp); beyond, e = e^-|x| <= 1 and x < 0 takes e / (1 + e), which reaches the subnormal
/// results instead of flushing them to 0.
template <class V>
DL_INLINE V sigmoid(const V& x) noexcept {
    if constexpr (detail::is_float<V>) {
        if (detail::all(simd::abs(x) <= V(87.3f))) {
            V r;
            const V scale = detail::reduce_ln2(-x, r);
            return V(1) / (V(1) + simd::fma(detail::expm1_poly(r), scale, scale));
        }
    }
    const V e = math::exp(-simd::abs(x));
    const V s = V(1) / (V(1) + e);
    return simd::select(x >= V(0), s, e * s);
}

/// tanh(x) = m / (m + 2) with m = e^(2|x|) - 1, sign restored. No cancellation near 0 (m ~ 2|x|, with
/// relative accuracy) and no separate small-argument branch; |x| is capped at 9.1, where tanh rounds
/// to 1, which keeps 2^n in range. ≤ 3 ulp.
template <class V>
DL_INLINE V tanh(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        DL_MATH_FALLBACK(tanh, V, x);
    } else {
        const V a = simd::min(V(9.1f), simd::abs(x));  // NaN stays NaN
        V r;
        const V scale = detail::reduce_ln2(a + a, r);
        const V m = simd::fma(scale, detail::expm1_poly(r), scale - V(1.0f));
        return simd::copysign(m / (m + V(2.0f)), x);
    }
}

namespace detail {
/// x scaled into the normal range when it is a positive subnormal double, with the log2 of the
/// scale to take off again: xsimd 8's double log and log2 mishandle subnormals (log(1e-320) gives
/// -746.5 instead of -736.8).
template <class V>
DL_INLINE V normal_double(const V& x, V& log2_scale) noexcept {
    const auto tiny = x < V(0x1p-1022);
    log2_scale = simd::select(tiny, V(52.0), V(0.0));
    return simd::select(tiny, x * V(0x1p52), x);
}
}  // namespace detail

template <class V>
DL_INLINE V log(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        V k;
        const V normal = detail::normal_double(x, k);
        const V y = detail::batch_math(
            normal, [](const auto& b) { return xsimd::log(b); }, [](const auto& v) { return std::log(v); });
        return y - k * V(0.693147180559945309);
    } else {
        DL_MATH_FALLBACK(log, V, x);
    }
}
template <class V>
DL_INLINE V log2(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        V k;
        const V normal = detail::normal_double(x, k);
        const V y = detail::batch_math(
            normal, [](const auto& b) { return xsimd::log2(b); }, [](const auto& v) { return std::log2(v); });
        return y - k;
    } else {
        DL_MATH_FALLBACK(log2, V, x);
    }
}
template <class V>
DL_INLINE V log1p(const V& x) noexcept { DL_MATH_FALLBACK(log1p, V, x); }
template <class V>
DL_INLINE V sin(const V& x) noexcept { DL_MATH_FALLBACK(sin, V, x); }
template <class V>
DL_INLINE V cos(const V& x) noexcept { DL_MATH_FALLBACK(cos, V, x); }
template <class V>
DL_INLINE V sqrt(const V& x) noexcept { DL_MATH_FALLBACK(sqrt, V, x); }
template <class V>
DL_INLINE V erf(const V& x) noexcept { DL_MATH_FALLBACK(erf, V, x); }
template <class V>
DL_INLINE V floor(const V& x) noexcept { DL_MATH_FALLBACK(floor, V, x); }
template <class V>
DL_INLINE V ceil(const V& x) noexcept { DL_MATH_FALLBACK(ceil, V, x); }
/// Half away from zero, as std::round.
template <class V>
DL_INLINE V round(const V& x) noexcept { DL_MATH_FALLBACK(round, V, x); }
/// x^y, with C99's special cases, which xsimd 8's batch pow misses: pow(x, ±0) = 1 and pow(1, y) = 1
/// for any x and y, NaN included, and pow(-1, ±inf) = 1.
template <class V>
DL_INLINE V pow(const V& x, const V& y) noexcept {
    const V p = detail::batch_math(
        x, y, [](const auto& a, const auto& b) { return xsimd::pow(a, b); },
        [](const auto& a, const auto& b) { return std::pow(a, b); });
    const auto one = (y == V(0)) | (x == V(1)) | ((x == V(-1)) & (simd::abs(y) == V(INFINITY)));
    return simd::select(one, V(1), p);
}
/// atan2(y, x), with C99's values where both are zeros or both infinities (xsimd 8 gives NaN):
/// ±0 or ±π for zeros, ±π/4 or ±3π/4 for infinities, by the signs of y and x.
template <class V>
DL_INLINE V atan2(const V& y, const V& x) noexcept {
    using S = simd::scalar_t<V>;
    const V a = detail::batch_math(
        y, x, [](const auto& p, const auto& q) { return xsimd::atan2(p, q); },
        [](const auto& p, const auto& q) { return std::atan2(p, q); });
    const V inf(static_cast<S>(INFINITY));
    const auto zeros = (y == V(0)) & (x == V(0)), infinities = (simd::abs(y) == inf) & (simd::abs(x) == inf);
    const auto x_negative = simd::copysign(V(1), x) < V(0);
    const V at_zeros = simd::select(x_negative, V(static_cast<S>(3.14159265358979323846)), V(0));
    const V at_infinities =
        simd::select(x_negative, V(static_cast<S>(2.35619449019234492885)), V(static_cast<S>(0.785398163397448309616)));
    return simd::select(zeros, simd::copysign(at_zeros, y), simd::select(infinities, simd::copysign(at_infinities, y), a));
}

#undef DL_MATH_FALLBACK

}  // namespace dl::math
