#pragma once
// The one place that touches xsimd. Everything else writes math once, as templates over `V`, which is
// either a scalar (float, double) or a batch of them: the same operations in the same order, so for dl's
// own kernels (exp, exp2, sigmoid, tanh, arithmetic) a SIMD lane equals the scalar path bit for bit
// when the target has FMA. Functions that fall back to xsimd (batches) and <cmath> (scalars) may
// differ in the last bits between the contiguous and the strided path.
// Define DL_NO_SIMD to build without xsimd batches: the scalar path then runs everywhere (a reference
// for the vectorised one). xsimd's headers are still included: the branches written for batches name
// its functions, and `if constexpr` only discards them after their names are looked up.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <xsimd/xsimd.hpp>
#if !defined(DL_NO_SIMD) && (defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#endif

#include "../core/error.hpp"
#include "../core/half.hpp"

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

// --- loads and stores that convert between an element type and its compute type ---
// For the 16-bit floats, Native picks the instructions this target has (AVX-512 BF16's
// vcvtneps2bf16, F16C's vcvtps2ph/vcvtph2ps, AVX-512/AVX2 integer rounding); !Native is the portable
// path, the scalar conversions of core/half.hpp lane by lane. Both give the scalar conversion's bits
// (tested for every float).

template <class T, bool Native = true>
DL_INLINE batch<compute_t<T>> load_compute(const T* p) noexcept {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, C>) {
        return load(p);
    } else {
        constexpr int W = batch<C>::size;
        if constexpr (Native && std::is_same_v<T, bfloat16>) {
#if defined(__AVX512F__)
            if constexpr (W == 16)
                return _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
#endif
#if defined(__AVX2__)
            if constexpr (W == 8)
                return _mm256_castsi256_ps(
                    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#endif
        }
        if constexpr (Native && std::is_same_v<T, float16>) {
#if defined(__AVX512F__)
            if constexpr (W == 16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
#if defined(__F16C__)
            if constexpr (W == 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
        }
        alignas(64) C buf[W];
        for (int k = 0; k < W; ++k) buf[k] = static_cast<C>(p[k]);
        return batch<C>::load_aligned(buf);
    }
}

namespace detail {
#if defined(__AVX512F__)
/// bfloat16 bits of 16 floats, rounded to nearest even in integer arithmetic (exact for subnormals).
DL_INLINE __m256i bfloat16_bits_avx512(__m512 x) noexcept {
    const __m512i u = _mm512_castps_si512(x), high = _mm512_srli_epi32(u, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, high, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}
#endif
#if defined(__AVX2__)
DL_INLINE __m128i bfloat16_bits_avx2(__m256 x) noexcept {
    const __m256i u = _mm256_castps_si256(x), high = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#endif
}  // namespace detail

template <class T, bool Native = true>
DL_INLINE void store_compute(T* p, const batch<compute_t<T>>& v) noexcept {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, C>) {
        store(p, v);
    } else {
        constexpr int W = batch<C>::size;
        if constexpr (Native && std::is_same_v<T, bfloat16>) {
#if defined(__AVX512F__)
            if constexpr (W == 16) {
                auto* out = reinterpret_cast<__m256i*>(p);
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
                // vcvtneps2bf16 flushes subnormal inputs to zero; lanes of those take the integer path.
                if (_mm512_fpclass_ps_mask(v, 0x20) == 0) {
                    _mm256_storeu_si256(out, std::bit_cast<__m256i>(_mm512_cvtneps_pbh(v)));
                    return;
                }
#endif
                _mm256_storeu_si256(out, detail::bfloat16_bits_avx512(v));
                return;
            }
#endif
#if defined(__AVX2__)
            if constexpr (W == 8) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(p), detail::bfloat16_bits_avx2(v));
                return;
            }
#endif
        }
        if constexpr (Native && std::is_same_v<T, float16>) {
#if defined(__AVX512F__)
            if constexpr (W == 16) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                                    _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                return;
            }
#endif
#if defined(__F16C__)
            if constexpr (W == 8) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                                 _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                return;
            }
#endif
        }
        alignas(64) C buf[W];
        v.store_aligned(buf);
        for (int k = 0; k < W; ++k) p[k] = static_cast<T>(buf[k]);
    }
}

/// Stores v at the batch-aligned p past the caches (a non-temporal store: the line is not read in
/// first). The stores are weakly ordered: call stream_fence() before another thread reads p.
/// xsimd 8 has no streaming store.
template <class T>
DL_INLINE void store_stream(T* p, const batch<T>& v) noexcept {
    static_assert(has_batch<T>, "dl::simd::store_stream: float or double lanes");
    constexpr int W = batch<T>::size;
#if defined(__AVX512F__)
    if constexpr (W * sizeof(T) == 64) {
        if constexpr (std::is_same_v<T, float>)
            _mm512_stream_ps(p, v);
        else
            _mm512_stream_pd(p, v);
        return;
    }
#endif
#if defined(__AVX2__)
    if constexpr (W * sizeof(T) == 32) {
        if constexpr (std::is_same_v<T, float>)
            _mm256_stream_ps(p, v);
        else
            _mm256_stream_pd(p, v);
        return;
    }
#endif
    v.store_aligned(p);
}

/// Orders this thread's streaming stores before its later stores (a release for store_stream).
DL_INLINE void stream_fence() noexcept {
#if defined(__AVX2__) || defined(__AVX512F__)
    _mm_sfence();
#endif
}

/// Lane k is p[index[k]], for 4-byte T. xsimd 8 has no AVX-512 float gather, and its AVX-512 int32
/// one is never selected: both fall back to a lane loop that is not inlined.
template <class T>
DL_INLINE batch<T> gather(const T* p, const batch<std::int32_t>& index) noexcept {
    static_assert(sizeof(T) == 4 && batch<T>::size == batch<std::int32_t>::size, "dl::simd::gather: 4-byte lanes");
    constexpr std::size_t W = batch<T>::size;
#if defined(__AVX512F__)
    if constexpr (W == 16) {
        if constexpr (std::is_same_v<T, float>)
            return _mm512_i32gather_ps(index, p, 4);
        else
            return _mm512_i32gather_epi32(index, p, 4);
    }
#elif defined(__AVX2__)
    if constexpr (W == 8) {
        if constexpr (std::is_same_v<T, float>)
            return _mm256_i32gather_ps(p, index, 4);
        else
            return _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), index, 4);
    }
#endif
    alignas(64) std::int32_t at[W];
    alignas(64) T lanes[W];
    index.store_aligned(at);
    for (std::size_t k = 0; k < W; ++k) lanes[k] = p[at[k]];
    return batch<T>::load_aligned(lanes);
}
/// Lane k is p[index[k]] where mask[k], else 0; masked-off lanes read nothing (their index may point
/// anywhere).
template <class T>
DL_INLINE batch<T> gather(const T* p, const batch<std::int32_t>& index, const xsimd::batch_bool<T>& mask) noexcept {
    static_assert(std::is_same_v<T, float> && batch<T>::size == batch<std::int32_t>::size, "dl::simd::gather: float lanes");
    constexpr std::size_t W = batch<T>::size;
#if defined(__AVX512F__)
    if constexpr (W == 16) return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), static_cast<__mmask16>(mask), index, p, 4);
#elif defined(__AVX2__)
    if constexpr (W == 8) return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), p, index, static_cast<__m256>(mask), 4);
#endif
    alignas(64) std::int32_t at[W];
    alignas(64) T on[W], lanes[W];
    index.store_aligned(at);
    xsimd::select(mask, batch<T>(T(1)), batch<T>(T(0))).store_aligned(on);
    for (std::size_t k = 0; k < W; ++k) lanes[k] = on[k] != T(0) ? p[at[k]] : T(0);
    return batch<T>::load_aligned(lanes);
}
/// Lane q is the sum of v[q]'s lanes, for width<T> batches v (a transposing horizontal add). xsimd 8.1's
/// haddp computes it, except that its AVX-512 float version returns lanes 2-3 and 4-5 of every eight
/// swapped (1 2 5 6 3 4 7 8 … for v[q] = q + 1 in lane 0), so that case is written here.
template <class T>
DL_INLINE batch<T> lane_sums(const batch<T>* v) noexcept {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float> && batch<T>::size == 16) {
        // Pairs of vectors into one, then pairs of those, each lane holding a partial sum of its vector
        // within its 128-bit block; then the blocks are summed across.
        __m512 pairs[8], quads[4];
        // Unrolled, so that v and the partial sums stay in registers (else GCC spills them to the stack).
#pragma GCC unroll 8
        for (int p = 0; p < 8; ++p)
            pairs[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]), _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
            const __m512d a = _mm512_castps_pd(pairs[2 * g]), b = _mm512_castps_pd(pairs[2 * g + 1]);
            quads[g] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
        }
        auto halves = [](__m512 a, __m512 b) {
            return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
        };
        const __m512 low = halves(quads[0], quads[1]), high = halves(quads[2], quads[3]);
        return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(3, 1, 3, 1)));
    }
#endif
    return xsimd::haddp(v);
}
// --- bool tensors as comparison masks: a comparison's batch stores into a Tensor<bool>, and a
// Tensor<bool> loads as the mask where() selects by, so neither goes element by element ---

/// The mask of batch<C>'s lanes from as many bools at p.
template <class C>
DL_INLINE xsimd::batch_bool<C> load_mask(const bool* p) noexcept {
    constexpr int W = batch<C>::size;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    if constexpr (W == 16) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm_test_epi8_mask(bytes, bytes);
    } else if constexpr (W == 8 && std::is_same_v<C, double>) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        return static_cast<__mmask8>(_mm_test_epi8_mask(bytes, bytes));
    }
#endif
    alignas(64) C lanes[W];
    for (int k = 0; k < W; ++k) lanes[k] = static_cast<C>(p[k]);
    return batch<C>::load_aligned(lanes) != batch<C>(C(0));
}
/// The lanes of mask m as bools at p.
template <class C>
DL_INLINE void store_mask(bool* p, const xsimd::batch_bool<C>& m) noexcept {
    constexpr int W = batch<C>::size;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    if constexpr (W == 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_maskz_set1_epi8(m, 1));
        return;
    } else if constexpr (W == 8 && std::is_same_v<C, double>) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_maskz_set1_epi8(m, 1));
        return;
    }
#endif
    alignas(64) C lanes[W];
    xsimd::select(m, batch<C>(C(1)), batch<C>(C(0))).store_aligned(lanes);
    for (int k = 0; k < W; ++k) p[k] = lanes[k] != C(0);
}

/// A float mask as the mask of the int32 lanes beside it, and back (for selects on indices).
DL_INLINE xsimd::batch_bool<std::int32_t> mask_cast(const xsimd::batch_bool<float>& m) noexcept {
    return xsimd::bool_cast(m);
}
DL_INLINE xsimd::batch_bool<float> mask_cast(const xsimd::batch_bool<std::int32_t>& m) noexcept {
    return xsimd::bool_cast(m);
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

/// p[0 .. lanes of V) as V: a batch of consecutive elements, or the one element.
template <class V, class T>
DL_INLINE V load_as(const T* p) noexcept {
    if constexpr (is_batch<V>) return V::load_unaligned(p);
    else return *p;
}
template <class V, class T>
DL_INLINE void store_as(T* p, const V& v) noexcept {
    if constexpr (is_batch<V>) v.store_unaligned(p);
    else *p = v;
}
/// The first n lanes of v at p (n ≤ the lanes of V): masked on AVX-512 (slow on Zen 4, so for rare
/// tails), lane by lane elsewhere.
template <class V, class T>
DL_INLINE void store_first_as(T* p, const V& v, std::int64_t n) noexcept {
    if constexpr (!is_batch<V>) {
        if (n > 0) *p = v;
    } else {
#if defined(__AVX512F__) && !defined(DL_NO_SIMD)
        if constexpr (std::is_same_v<T, float> && V::size == 16) {
            _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
            return;
        } else if constexpr (std::is_same_v<T, double> && V::size == 8) {
            _mm512_mask_storeu_pd(p, static_cast<__mmask8>((1u << n) - 1), v);
            return;
        }
#endif
        alignas(64) T lanes[V::size];
        v.store_aligned(lanes);
        for (std::int64_t k = 0; k < n; ++k) p[k] = lanes[k];
    }
}
/// step.template operator()<V>(i) over i in [0, n): batches of T while whole ones fit, then scalars.
template <class T, class I, class Step>
DL_INLINE void for_each_block(I n, Step&& step) {
    I i = 0;
    if constexpr (has_batch<T>) {
        constexpr auto w = static_cast<I>(width<T>);
        for (; i + w <= n; i += w) step.template operator()<xsimd::batch<T>>(i);
    }
    for (; i < n; ++i) step.template operator()<T>(i);
}

/// a * b + c rounded once. xsimd 8 has no AVX-512 fma: its generic one is a * b + c, fused only
/// where the compiler contracts (GCC's default in gnu++ modes, not under -std=c++20 or
/// -ffp-contract=off), so 512-bit batches call the instruction themselves.
template <class V>
DL_INLINE V fma(const V& a, const V& b, const V& c) noexcept {
    if constexpr (is_batch<V>) {
#if defined(__AVX512F__)
        if constexpr (sizeof(V) == 64 && std::is_same_v<scalar_t<V>, float>)
            return V(_mm512_fmadd_ps(a, b, c));
        else if constexpr (sizeof(V) == 64 && std::is_same_v<scalar_t<V>, double>)
            return V(_mm512_fmadd_pd(a, b, c));
        else
#endif
            return xsimd::fma(a, b, c);
    } else {
        return std::fma(a, b, c);
    }
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
