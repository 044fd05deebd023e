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
DL_INLINE bool any(const M& mask) noexcept {
    if constexpr (std::is_same_v<M, bool>)
        return mask;
    else
        return xsimd::any(mask);
}
template <class V>
inline constexpr bool is_float = std::is_same_v<simd::scalar_t<V>, float>;
}  // namespace detail

#define DL_MATH_FALLBACK(name, V, x)        \
    if constexpr (simd::is_batch<V>)        \
        return xsimd::name(x);              \
    else                                    \
        return std::name(x)

/// e^x for float: Cody-Waite reduction x = n ln2 + r, a degree-7 polynomial for e^r on |r| <= ln2/2
/// (Cephes coefficients), then 2^n added to the exponent bits. Results that are subnormal or
/// overflow, and NaN, take a slower scaling in two steps. ≤ 1 ulp.
template <class V>
DL_INLINE V exp(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        DL_MATH_FALLBACK(exp, V, x);
    } else {
        const V n = simd::round_even(x * V(1.44269504088896341f));
        V r = simd::fma(n, V(-0.693359375f), x);
        r = simd::fma(n, V(2.12194440e-4f), r);
        V p = V(1.9875691500e-4f);
        p = simd::fma(p, r, V(1.3981999507e-3f));
        p = simd::fma(p, r, V(8.3334519073e-3f));
        p = simd::fma(p, r, V(4.1665795894e-2f));
        p = simd::fma(p, r, V(1.6666665459e-1f));
        p = simd::fma(p, r, V(5.0000001201e-1f));
        const V y = simd::fma(p, r * r, r) + V(1.0f);
        // |x| <= 87.3 keeps n in [-126, 126]: e^x is a normal float and 2^n a normal scale.
        if (!detail::any(!(simd::abs(x) <= V(87.3f)))) return y * simd::pow2i(n);
        const V xc = simd::min(simd::max(x, V(-104.0f)), V(89.0f));  // NaN stays NaN
        const V nc = simd::round_even(xc * V(1.44269504088896341f));
        const V n1 = simd::round_even(nc * V(0.5f)), n2 = nc - n1;
        V rc = simd::fma(nc, V(-0.693359375f), xc);
        rc = simd::fma(nc, V(2.12194440e-4f), rc);
        V pc = V(1.9875691500e-4f);
        pc = simd::fma(pc, rc, V(1.3981999507e-3f));
        pc = simd::fma(pc, rc, V(8.3334519073e-3f));
        pc = simd::fma(pc, rc, V(4.1665795894e-2f));
        pc = simd::fma(pc, rc, V(1.6666665459e-1f));
        pc = simd::fma(pc, rc, V(5.0000001201e-1f));
        const V yc = simd::fma(pc, rc * rc, rc) + V(1.0f);
        return simd::select(simd::is_nan(x), x, yc * simd::pow2i(n1) * simd::pow2i(n2));
    }
}

/// 1 / (1 + e^-x), written with e = e^-|x| <= 1 so neither branch overflows or cancels.
template <class V>
DL_INLINE V sigmoid(const V& x) noexcept {
    const V e = math::exp(-simd::abs(x));
    const V s = V(1) / (V(1) + e);
    return simd::select(x >= V(0), s, e * s);
}

/// tanh: an odd polynomial below 0.625 (Cephes tanhf), (1 - e^-2a) / (1 + e^-2a) above.
template <class V>
DL_INLINE V tanh(const V& x) noexcept {
    if constexpr (!detail::is_float<V>) {
        DL_MATH_FALLBACK(tanh, V, x);
    } else {
        const V a = simd::abs(x);
        const V z = x * x;
        V p = V(-5.70498872745e-3f);
        p = simd::fma(p, z, V(2.06390887954e-2f));
        p = simd::fma(p, z, V(-5.37397155531e-2f));
        p = simd::fma(p, z, V(1.33314422036e-1f));
        p = simd::fma(p, z, V(-3.33332819422e-1f));
        const V small = simd::fma(p * z, x, x);
        const V e = math::exp(V(-2.0f) * simd::min(a, V(9.0f)));  // tanh(9) rounds to 1
        const V large = simd::copysign((V(1) - e) / (V(1) + e), x);
        return simd::select(a < V(0.625f), small, large);
    }
}

template <class V>
DL_INLINE V exp2(const V& x) noexcept { DL_MATH_FALLBACK(exp2, V, x); }
template <class V>
DL_INLINE V log(const V& x) noexcept { DL_MATH_FALLBACK(log, V, x); }
template <class V>
DL_INLINE V log2(const V& x) noexcept { DL_MATH_FALLBACK(log2, V, x); }
template <class V>
DL_INLINE V log1p(const V& x) noexcept { DL_MATH_FALLBACK(log1p, V, x); }
template <class V>
DL_INLINE V expm1(const V& x) noexcept { DL_MATH_FALLBACK(expm1, V, x); }
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
