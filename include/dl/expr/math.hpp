#pragma once
// Elementwise math written once for scalars and SIMD batches (see simd.hpp). float gets dl's own
// kernels where speed matters (exp and what builds on it); the rest, and double, use xsimd for batches
// and <cmath> for scalars. Accuracy is tested against double references (tests/expr/math.cpp).
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

#define DL_MATH_FALLBACK(name, V, x)        \
    if constexpr (simd::is_batch<V>)        \
        return xsimd::name(x);              \
    else                                    \
        return std::name(x)

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
    } else if constexpr (simd::is_batch<V>) {
        return simd::select(x > V(80.0f), math::exp(x), xsimd::expm1(x));
    } else {
        return x > 80.0f ? math::exp(x) : std::expm1(x);
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

template <class V>
DL_INLINE V log(const V& x) noexcept { DL_MATH_FALLBACK(log, V, x); }
template <class V>
DL_INLINE V log2(const V& x) noexcept { DL_MATH_FALLBACK(log2, V, x); }
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
template <class V>
DL_INLINE V pow(const V& x, const V& y) noexcept {
    if constexpr (simd::is_batch<V>)
        return xsimd::pow(x, y);
    else
        return std::pow(x, y);
}
template <class V>
DL_INLINE V atan2(const V& y, const V& x) noexcept {
    if constexpr (simd::is_batch<V>)
        return xsimd::atan2(y, x);
    else
        return std::atan2(y, x);
}

#undef DL_MATH_FALLBACK

}  // namespace dl::math
