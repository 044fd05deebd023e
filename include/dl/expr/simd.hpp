#pragma once
// The one place that touches xsimd. Everything else writes math once, as templates over `V`, which is
// either a scalar (float, double) or a batch of them: the same operations in the same order, so for dl's
// own kernels (exp, exp2, sigmoid, tanh, arithmetic) a SIMD lane equals the scalar path bit for bit
// when the target has FMA. Functions that fall back to xsimd (batches) and <cmath> (scalars) may
// differ in the last bits between the contiguous and the strided path.
// Define DL_NO_SIMD to build without xsimd batches (the scalar path then runs everywhere).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifndef DL_NO_SIMD
#include <xsimd/xsimd.hpp>
#endif

#include "../core/error.hpp"

namespace dl::simd {

#ifndef DL_NO_SIMD
template <class T>
using batch = xsimd::batch<T>;
/// Compute types with a SIMD path.
template <class T>
inline constexpr bool has_batch = std::is_same_v<T, float> || std::is_same_v<T, double>;
template <class T>
inline constexpr int width = has_batch<T> ? static_cast<int>(xsimd::batch<T>::size) : 1;

template <class V>
inline constexpr bool is_batch = false;
template <class T, class A>
inline constexpr bool is_batch<xsimd::batch<T, A>> = true;

template <class T>
DL_INLINE batch<T> load(const T* p) noexcept {
    return batch<T>::load_unaligned(p);
}
template <class T>
DL_INLINE void store(T* p, const batch<T>& v) noexcept {
    v.store_unaligned(p);
}
#else
template <class T>
inline constexpr bool has_batch = false;
template <class T>
inline constexpr int width = 1;
template <class V>
inline constexpr bool is_batch = false;
#endif

/// Scalar element type of V.
template <class V>
struct scalar_of {
    using type = V;
};
#ifndef DL_NO_SIMD
template <class T, class A>
struct scalar_of<xsimd::batch<T, A>> {
    using type = T;
};
#endif
template <class V>
using scalar_t = typename scalar_of<V>::type;

// --- operations with one meaning for scalars and batches ---

template <class V>
DL_INLINE V fma(const V& a, const V& b, const V& c) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::fma(a, b, c);
    else
        return std::fma(a, b, c);
}
/// cond ? a : b, lane by lane.
template <class M, class V>
DL_INLINE V select(const M& cond, const V& a, const V& b) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::select(cond, a, b);
    else
        return cond ? a : b;
}
/// a < b ? a : b, which is what minps computes: NaN in either operand gives b. Put the operand whose
/// NaN must propagate second.
template <class V>
DL_INLINE V min(const V& a, const V& b) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::min(a, b);
    else
        return a < b ? a : b;
}
/// a > b ? a : b (maxps): NaN in either operand gives b.
template <class V>
DL_INLINE V max(const V& a, const V& b) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::max(a, b);
    else
        return a > b ? a : b;
}
template <class V>
DL_INLINE V abs(const V& x) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::abs(x);
    else
        return std::fabs(x);
}
/// Round to nearest, ties to even (the current rounding mode, which dl never changes).
template <class V>
DL_INLINE V round_even(const V& x) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::nearbyint(x);
    else
        return std::nearbyint(x);
}
template <class V>
DL_INLINE auto is_nan(const V& x) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::isnan(x);  // xsimd 8's batch != is an ordered compare: false for NaN
    else
        return x != x;
}
/// Sign bit of `sign` on the magnitude of `mag`.
template <class V>
DL_INLINE V copysign(const V& mag, const V& sign) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::copysign(mag, sign);
    else
        return std::copysign(mag, sign);
}

/// Float bits as int32 and back.
template <class V>
DL_INLINE auto bits_of(const V& x) noexcept {
    if constexpr (is_batch<V>)
        return xsimd::bitwise_cast<xsimd::batch<std::int32_t>>(x);
    else
        return std::bit_cast<std::int32_t>(x);
}
template <class I>
DL_INLINE auto float_from_bits(const I& bits) noexcept {
    if constexpr (std::is_same_v<I, std::int32_t>)
        return std::bit_cast<float>(bits);
    else
        return xsimd::bitwise_cast<xsimd::batch<float>>(bits);
}

/// 2^n for float n holding an integer in [-126, 127], built from the exponent bits.
template <class V>
DL_INLINE V pow2i(const V& n) noexcept {
    static_assert(std::is_same_v<scalar_t<V>, float>, "dl::simd::pow2i: float only");
    if constexpr (is_batch<V>)
        return float_from_bits((xsimd::batch_cast<std::int32_t>(n) + 127) << 23);
    else
        return std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

}  // namespace dl::simd
