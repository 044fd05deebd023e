#pragma once
// General matrix multiply C = act(alpha·A·B + beta·C + bias) + residual, for any strides, in the BLIS
// style (Goto & van de Geijn, "Anatomy of high-performance matrix multiplication", 2008):
//  - K is cut into blocks of kc, N into blocks of nc and M into blocks of mc. For each (nc, kc) block,
//    B is packed into panels of NR columns (kc × NR contiguous: one micro-panel stays in L1 while it is
//    reused), and for each mc block A is packed into panels of MR rows (the block stays in L2).
//  - A register-blocked micro-kernel keeps an MR × NR tile of C in registers for the whole kc loop:
//    each step loads NR/W vectors of B and broadcasts MR elements of A.
//  - The epilogue (alpha, beta, bias, activation, residual) is applied to that tile while it is still in
//    registers, after the last kc block, so Linear + bias + ReLU is one pass over the output.
// Packing reads A and B through their strides, so all four transpose combinations and any view cost
// the same (row-major A and B = Wᵀ go through register transposes). Products of a few rows skip
// packing when B's rows are contiguous: the micro-kernel reads A and B in place.
//
// With DL_USE_BLAS (the CMake option of that name) float and double products go to OpenBLAS instead,
// and the epilogue runs as a pass over C after it (see blas_gemm).
//
// Threads: C is cut into one rectangle per thread (along M or N, whichever is larger), and each
// rectangle is a serial product with its own packed panels: no synchronisation inside, and every C
// element sums its k terms in the same order whatever the thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../core/tensor.hpp"
#include "../../expr/activation.hpp"
#include "../../expr/functors.hpp"
#include "../../expr/operators.hpp"
#include "../../expr/simd.hpp"
#include "../../core/op_scope.hpp"
#include "elementwise.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#ifdef DL_USE_BLAS
#include <cblas.h>
#endif

namespace dl::detail {

/// A strided matrix view: element (i, j) is data[i * row_stride + j * col_stride].
template <class T>
struct matrix_ref {
    T* data = nullptr;
    std::int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
    DL_INLINE T& operator()(std::int64_t i, std::int64_t j) const noexcept {
        return data[i * row_stride + j * col_stride];
    }
};

/// What happens to each element of C = A·B on its way out: out = act(alpha·(A·B) + beta·C + bias) + residual.
/// beta == 0 means C is not read (it may hold NaN), as in BLAS.
template <class T>
struct gemm_epilogue {
    T alpha = T(1), beta = T(0);
    const T* bias = nullptr;    ///< contiguous; bias[j] per column (Linear) or bias[i] per row (conv)
    bool bias_per_row = false;
    activation act = activation::none;
    matrix_ref<const T> residual{};  ///< same shape as C, added after the activation; none when data is null
};

template <activation A, class V>
DL_INLINE V activate(const V& x) noexcept {
    if constexpr (A == activation::relu) return ops::relu{}(x);
    else if constexpr (A == activation::gelu) return ops::gelu{}(x);
    else if constexpr (A == activation::sigmoid) return ops::sigmoid{}(x);
    else if constexpr (A == activation::tanh) return ops::tanh{}(x);
    else return x;
}

/// Whether v replaces best as a window's maximum: a NaN wins over numbers, else only a larger value,
/// so ties keep the first in row-major window order (as PyTorch). Scalars or batches.
template <class V>
DL_INLINE auto beats(const V& v, const V& best) {
    return (v > best) | (simd::is_nan(v) & !simd::is_nan(best));
}
/// The maximum of a 2×2 window given in row-major order, as max_pool2d takes it (see beats). Batches
/// take three maxps, which keep the earlier of equal values but not a later NaN: lanes that might
/// hold one (the four sum to NaN) go through beats.
template <class V>
DL_INLINE V window_max(const V& top_left, const V& top_right, const V& bottom_left, const V& bottom_right) {
    if constexpr (simd::is_batch<V>)
        if (!xsimd::any(simd::is_nan(top_left + top_right + bottom_left + bottom_right)))
            return simd::max(bottom_right, simd::max(bottom_left, simd::max(top_right, top_left)));
    V best = top_left;
    best = simd::select(beats(top_right, best), top_right, best);
    best = simd::select(beats(bottom_left, best), bottom_left, best);
    return simd::select(beats(bottom_right, best), bottom_right, best);
}

/// Calls f(std::integral_constant<activation, act>) so that the activation is a compile-time choice
/// inside f.
template <class F>
DL_INLINE void with_activation(activation act, F&& f) {
    switch (act) {
        case activation::relu: return f(std::integral_constant<activation, activation::relu>{});
        case activation::gelu: return f(std::integral_constant<activation, activation::gelu>{});
        case activation::sigmoid: return f(std::integral_constant<activation, activation::sigmoid>{});
        case activation::tanh: return f(std::integral_constant<activation, activation::tanh>{});
        case activation::none: break;
    }
    f(std::integral_constant<activation, activation::none>{});
}

/// The value stored at C(i, j), from the product sum `acc` of one k block (V: a scalar or a batch of
/// consecutive columns). `first`: the first k block (beta applies); `last`: the epilogue applies.
/// One definition for the vector and the scalar path, so both give the same bits.
template <activation A, class V, class T>
DL_INLINE V finish(V acc, const gemm_epilogue<T>& ep, bool first, bool last, auto&& load_c, auto&& bias_at,
                   auto&& residual_at) {
    if (ep.alpha != T(1)) acc = acc * V(ep.alpha);
    if (!first) acc = acc + load_c();
    else if (ep.beta != T(0)) acc = simd::fma(V(ep.beta), load_c(), acc);
    if (!last) return acc;
    if (ep.bias) acc = acc + bias_at();
    acc = activate<A>(acc);
    if (ep.residual.data) acc = acc + residual_at();
    return acc;
}

/// C's rows, and the residual's, are contiguous: the epilogue can load and store whole vectors of them.
template <class T>
[[nodiscard]] bool vector_rows(const matrix_ref<T>& c, const gemm_epilogue<T>& ep) noexcept {
    return c.col_stride == 1 && (!ep.residual.data || ep.residual.col_stride == 1);
}

template <class T>
void finish_scalar(const T* tile, std::int64_t tile_stride, const matrix_ref<T>& c, std::int64_t i0,
                   std::int64_t j0, std::int64_t rows, std::int64_t cols, const gemm_epilogue<T>& ep, bool first,
                   bool last) {
    with_activation(ep.act, [&](auto act) {
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t n = 0; n < cols; ++n) {
                const std::int64_t i = i0 + r, j = j0 + n;
                c(i, j) = finish<act.value>(
                    tile[r * tile_stride + n], ep, first, last, [&] { return c(i, j); },
                    [&] { return ep.bias[ep.bias_per_row ? i : j]; }, [&] { return ep.residual(i, j); });
            }
    });
}

/// C = the epilogue of whole product sums (row i at sums + i·stride, contiguous; C itself for an
/// epilogue in place): whole vectors of each row when C's rows allow, finish_scalar for the rest. The
/// same finish() on batches and on elements, so the same bits as finish_scalar over everything, which
/// pays the epilogue's branches per element (a third of a 256³ bf16 product).
template <class T>
void finish_rows(const T* sums, std::int64_t stride, const matrix_ref<T>& c, const gemm_epilogue<T>& ep) {
    std::int64_t vectors = 0;  // columns of each row done in vectors
#ifndef DL_NO_SIMD
    if constexpr (simd::has_batch<T>) {
        using B = simd::batch<T>;
        constexpr int W = simd::width<T>;
        if (vector_rows(c, ep)) vectors = c.cols / W * W;
        with_activation(ep.act, [&](auto act) {
            for (std::int64_t i = 0; i < c.rows; ++i) {
                const T* row = sums + i * stride;
                T* out = &c(i, 0);
                for (std::int64_t j = 0; j < vectors; j += W)
                    simd::store(out + j, finish<act.value>(
                                             simd::load(row + j), ep, true, true, [&] { return simd::load(out + j); },
                                             [&] { return ep.bias_per_row ? B(ep.bias[i]) : simd::load(ep.bias + j); },
                                             [&] { return simd::load(&ep.residual(i, j)); }));
            }
        });
    }
#endif
    if (vectors < c.cols) finish_scalar(sums + vectors, stride, c, 0, vectors, c.rows, c.cols - vectors, ep, true, true);
}

/// Per-thread scratch for packed panels, grown on demand and kept: a product allocates nothing once
/// the thread has seen its size. Slot 0 holds A's panels, slot 1 B's.
template <class T>
T* gemm_scratch(int slot, std::int64_t count) {
    thread_local std::vector<T> buffers[2];
    constexpr std::size_t align = 64 / sizeof(T);
    auto& b = buffers[slot];
    if (b.size() < std::size_t(count) + align) b.resize(std::size_t(count) + align);
    const auto address = reinterpret_cast<std::uintptr_t>(b.data());
    return b.data() + (align - (address / sizeof(T)) % align) % align;
}

/// R rows of k values as a panel of k groups of G (the dot-product instructions' k step: 4 for
/// vpdpbusd, 2 for vdpbf16ps): p[(k/G · R + r)·G + k%G] = at(r, k), for r < rows and k < kc; the rest
/// of the panel (rows past `rows`, k past kc up to a multiple of G) is zero. A's panels take its rows
/// (R = MR), B's take its columns (R = NR).
template <int R, int G, class V, class At>
void pack_k_groups(std::int64_t rows, std::int64_t kc, At&& at, V* p) {
    std::fill(p, p + (kc + G - 1) / G * R * G, V(0));
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < kc; ++k) p[((k / G) * R + r) * G + k % G] = at(r, k);
}

#ifndef DL_NO_SIMD
/// Register blocking by target: an MR × NV·W tile of C in registers (W floats a vector). With 32 vector
/// registers (AVX-512) 12 × 2 accumulators leave room for the B vectors; with 16 (AVX2, SSE), 6 × 2.
template <class T>
struct gemm_shape {
    static constexpr int W = simd::width<T>;
    static constexpr int NV = 2;
    static constexpr int NR = NV * W;
    static constexpr int MR = W * sizeof(T) >= 64 ? 12 : 6;
    // mc · kc (one A block) fits L2; kc · nc (B block) fits L3. The textbook choice keeps a B
    // micro-panel (kc · NR) in L1 too, but every k block is one more pass of loads and stores over C:
    // on AVX-512 kc = 1024 (a 128 KiB micro-panel, from L2) measured fastest here, 2–3% over kc = 512
    // at N ≥ 1024 on 1 thread and up to 15% on 2, where C's traffic is shared.
    static constexpr std::int64_t KC = 1024, MC = 8 * MR, NC = 4096;
};

/// acc = A-panel · B-panel over kc steps, for the first MR rows of the panel. Packed A:
/// a[k * AStep + r]; packed B: b[k * NR + n]. Unpacked (the small path): A(r, k) = a[r * a_rs + k * a_ks],
/// B(k, n) = b[k * b_ks + n].
template <int MR, int NV, bool Packed, class T, int AStep = MR>
DL_INLINE void micro_kernel(std::int64_t kc, const T* a, std::int64_t a_rs, std::int64_t a_ks, const T* b,
                            std::int64_t b_ks, simd::batch<T> (&acc)[MR][NV]) {
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>;
    // Unrolled in full, so that acc stays in registers: -O3 does it by itself, but at -O2 (GCC 12)
    // the r and v loops stayed loops over acc on the stack, a load and a store around every FMA, and
    // the products took twice as long.
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = B(T(0));
    for (std::int64_t k = 0; k < kc; ++k) {
        B bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = simd::load(b + v * W);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            const B ar(Packed ? a[r] : a[r * a_rs]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[r][v] = simd::fma(ar, bv[v], acc[r][v]);
        }
        a += Packed ? AStep : a_ks;
        b += Packed ? NV * W : b_ks;
    }
}

/// Writes an MR × NR accumulator tile to C(i0.., j0..) through the epilogue; `rows` × `cols` of it are
/// inside C. A full tile with contiguous C rows stays in registers; edges go through a small buffer.
template <int MR, int NV, class T>
DL_INLINE void store_tile(simd::batch<T> (&acc)[MR][NV], const matrix_ref<T>& c, std::int64_t i0, std::int64_t j0,
                          std::int64_t rows, std::int64_t cols, const gemm_epilogue<T>& ep, bool first, bool last) {
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>, NR = NV * W;
    if (rows == MR && cols == NR && vector_rows(c, ep)) {
        with_activation(last ? ep.act : activation::none, [&](auto act) DL_INLINE_LAMBDA {
#pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) {
                T* out = &c(i0 + r, j0);
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v)
                    simd::store(out + v * W,
                                finish<act.value>(
                                    acc[r][v], ep, first, last, [&] { return simd::load(out + v * W); },
                                    [&] {
                                        return ep.bias_per_row ? B(ep.bias[i0 + r]) : simd::load(ep.bias + j0 + v * W);
                                    },
                                    [&] { return simd::load(&ep.residual(i0 + r, j0 + v * W)); }));
            }
        });
        return;
    }
    alignas(64) T tile[MR * NR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) simd::store(tile + r * NR + v * W, acc[r][v]);
    finish_scalar(tile, NR, c, i0, j0, rows, cols, ep, first, last);
}

/// Calls f.template operator()<R>() for the compile-time R equal to rows (1 ≤ rows ≤ Max).
template <int Max, class F>
DL_INLINE void with_rows(std::int64_t rows, F&& f) {
    if constexpr (Max >= 1) {
        if (rows == Max) return f.template operator()<Max>();
        with_rows<Max - 1>(rows, f);
    }
}

/// dst[k * Step + r] = src[r * stride + k] for r < rows and k < kc: `rows` rows, contiguous along k, laid
/// side by side, as packing needs for A's rows (row-major A) and for B's columns (B = Wᵀ). Element
/// by element this is a strided store per element; with AVX the rows go through 8 × 8 and 4 × 4
/// register transposes (xsimd 8 has no full-width interleave to write them portably).
template <int Step, class T>
void pack_transposed(const T* src, std::int64_t stride, int rows, std::int64_t kc, T* dst) {
    int r = 0;
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
        const std::int64_t k8 = kc / 8 * 8;
        for (; r + 8 <= rows; r += 8) {
            const float* s = src + r * stride;
            for (std::int64_t k = 0; k < k8; k += 8) {
                __m256 v[8];
                for (int q = 0; q < 8; ++q) v[q] = _mm256_loadu_ps(s + q * stride + k);
                const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
                const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
                const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
                const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
                const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
                const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float* d = dst + k * Step + r;
                _mm256_storeu_ps(d + 0 * Step, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_storeu_ps(d + 1 * Step, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_storeu_ps(d + 2 * Step, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_storeu_ps(d + 3 * Step, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_storeu_ps(d + 4 * Step, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_storeu_ps(d + 5 * Step, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_storeu_ps(d + 6 * Step, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_storeu_ps(d + 7 * Step, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
            for (std::int64_t k = k8; k < kc; ++k)
                for (int q = 0; q < 8; ++q) dst[k * Step + r + q] = s[q * stride + k];
        }
        const std::int64_t k4 = kc / 4 * 4;
        for (; r + 4 <= rows; r += 4) {
            const float* s = src + r * stride;
            for (std::int64_t k = 0; k < k4; k += 4) {
                __m128 v0 = _mm_loadu_ps(s + k), v1 = _mm_loadu_ps(s + stride + k);
                __m128 v2 = _mm_loadu_ps(s + 2 * stride + k), v3 = _mm_loadu_ps(s + 3 * stride + k);
                _MM_TRANSPOSE4_PS(v0, v1, v2, v3);
                float* d = dst + k * Step + r;
                _mm_storeu_ps(d, v0);
                _mm_storeu_ps(d + Step, v1);
                _mm_storeu_ps(d + 2 * Step, v2);
                _mm_storeu_ps(d + 3 * Step, v3);
            }
            for (std::int64_t k = k4; k < kc; ++k)
                for (int q = 0; q < 4; ++q) dst[k * Step + r + q] = s[q * stride + k];
        }
    }
#endif
    for (; r < rows; ++r)
        for (std::int64_t k = 0; k < kc; ++k) dst[k * Step + r] = src[r * stride + k];
}

/// Copies A(i0 .. i0+mc, k0 .. k0+kc) into panels of MR rows, k-major. A last, short panel is left
/// unpadded: the kernels of its own height (with_rows) read only its rows, and zeroing the rest cost a
/// memset per k, 15% of a batch-1 linear layer.
template <int MR, class T>
void pack_a(const matrix_ref<const T>& a, std::int64_t i0, std::int64_t mc, std::int64_t k0, std::int64_t kc, T* dst) {
    for (std::int64_t p = 0; p < mc; p += MR, dst += MR * kc) {
        const int rows = int(std::min<std::int64_t>(MR, mc - p));
        if (a.col_stride == 1) {
            pack_transposed<MR>(&a(i0 + p, k0), a.row_stride, rows, kc, dst);
        } else {  // column by column: contiguous reads when A is transposed
            for (std::int64_t k = 0; k < kc; ++k) {
                const T* src = &a(i0 + p, k0 + k);
                for (int r = 0; r < rows; ++r) dst[k * MR + r] = src[r * a.row_stride];
            }
        }
    }
}

/// Copies B(k0 .. k0+kc, j0 .. j0+nc) into panels of NR columns, k-major, the last panel zero-padded.
template <int NR, class T>
void pack_b(const matrix_ref<const T>& b, std::int64_t k0, std::int64_t kc, std::int64_t j0, std::int64_t nc, T* dst) {
    constexpr int W = simd::width<T>;
    for (std::int64_t p = 0; p < nc; p += NR, dst += NR * kc) {
        const int cols = int(std::min<std::int64_t>(NR, nc - p));
        if (b.col_stride == 1 && cols == NR) {  // whole vectors (memcpy's call costs more than 128 bytes)
            const T* src = &b(k0, j0 + p);
            for (std::int64_t k = 0; k < kc; ++k, src += b.row_stride)
                for (int v = 0; v < NR; v += W) simd::store(dst + k * NR + v, simd::load(src + v));
            continue;
        }
        if (b.row_stride == 1) {
            pack_transposed<NR>(&b(k0, j0 + p), b.col_stride, cols, kc, dst);
        } else {
            for (std::int64_t k = 0; k < kc; ++k) {
                const T* src = &b(k0 + k, j0 + p);
                for (int n = 0; n < cols; ++n) dst[k * NR + n] = src[n * b.col_stride];
            }
        }
        for (std::int64_t k = 0; k < kc && cols < NR; ++k) std::fill(dst + k * NR + cols, dst + (k + 1) * NR, T(0));
    }
}

/// One R × NR tile of C from packed panels (A's panels are MR rows wide; R ≤ MR).
template <int R, class T>
void packed_tile(std::int64_t kc, const T* pa, const T* pb, const matrix_ref<T>& c, std::int64_t i, std::int64_t j,
                 std::int64_t cols, const gemm_epilogue<T>& ep, bool first, bool last) {
    using S = gemm_shape<T>;
    simd::batch<T> acc[R][S::NV];
    micro_kernel<R, S::NV, true, T, S::MR>(kc, pa, 0, 0, pb, 0, acc);
    store_tile<R, S::NV>(acc, c, i, j, R, cols, ep, first, last);
}

/// The packed product on one rectangle of C, serial.
template <class T>
void gemm_packed(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                 const gemm_epilogue<T>& ep, std::int64_t i_begin, std::int64_t i_end, std::int64_t j_begin,
                 std::int64_t j_end) {
    using S = gemm_shape<T>;
    constexpr int MR = S::MR, NR = S::NR;
    const std::int64_t K = a.cols;
    const std::int64_t kc_max = std::min<std::int64_t>(S::KC, std::max<std::int64_t>(K, 1));
    T* packed_b = gemm_scratch<T>(1, kc_max * ((std::min(S::NC, j_end - j_begin) + NR - 1) / NR * NR));
    T* packed_a = gemm_scratch<T>(0, kc_max * ((std::min(S::MC, i_end - i_begin) + MR - 1) / MR * MR));
    for (std::int64_t jc = j_begin; jc < j_end; jc += S::NC) {
        const std::int64_t nc = std::min(S::NC, j_end - jc);
        for (std::int64_t pc = 0; pc == 0 || pc < K; pc += S::KC) {
            const std::int64_t kc = std::min(S::KC, K - pc);
            const bool first = pc == 0, last = pc + S::KC >= K;
            pack_b<NR>(b, pc, kc, jc, nc, packed_b);
            for (std::int64_t ic = i_begin; ic < i_end; ic += S::MC) {
                const std::int64_t mc = std::min(S::MC, i_end - ic);
                pack_a<MR>(a, ic, mc, pc, kc, packed_a);
                for (std::int64_t jr = 0; jr < nc; jr += NR)
                    for (std::int64_t ir = 0; ir < mc; ir += MR) {
                        // C's rows are far apart (and a power-of-two stride puts them in one cache set):
                        // fetch them while the k loop runs.
                        const std::int64_t rows = std::min<std::int64_t>(MR, mc - ir);
                        const std::int64_t cols = std::min<std::int64_t>(NR, nc - jr);
                        for (std::int64_t r = 0; r < rows; ++r) {
                            const T* row = &c(ic + ir + r, jc + jr);
                            __builtin_prefetch(row, 1);
                            __builtin_prefetch(row + cols - 1, 1);
                        }
                        const T* pa = packed_a + ir * kc;
                        const T* pb = packed_b + jr * kc;
                        if (rows == MR) {
                            packed_tile<MR, T>(kc, pa, pb, c, ic + ir, jc + jr, cols, ep, first, last);
                            continue;
                        }
                        // The last rows of the block run a kernel of their own height, not MR rows of
                        // zeros: it matters for small M.
                        with_rows<MR - 1>(rows, [&]<int R>() {
                            packed_tile<R, T>(kc, pa, pb, c, ic + ir, jc + jr, cols, ep, first, last);
                        });
                    }
            }
        }
    }
}

/// One R × NV·W tile of C read straight from A and B (B's rows contiguous), no packing.
template <int R, int NV, class T>
void direct_tile(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, std::int64_t i,
                 std::int64_t j, std::int64_t cols, const gemm_epilogue<T>& ep) {
    simd::batch<T> acc[R][NV];
    micro_kernel<R, NV, false>(a.cols, &a(i, 0), a.row_stride, a.col_stride, &b(0, j), b.row_stride, acc);
    store_tile<R, NV>(acc, c, i, j, R, cols, ep, true, true);
}

/// K = 1, an outer product (the weight gradient gᵀ·x of a batch-1 step): each row of C is a(i, 0) times
/// B's row, through the epilogue, one vector at a time. The tile kernels would set up and spill MR × NR
/// accumulators for one FMA each. Same bits as they give (a product added to zero, then finish()).
template <class T>
void gemm_outer(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                const gemm_epilogue<T>& epilogue) {
    // A local copy: the stores into C cannot change it, so alpha and beta are not reloaded per vector.
    const gemm_epilogue<T> ep = epilogue;
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>;
    const std::int64_t M = c.rows, N = c.cols;
    const T* row_b = &b(0, 0);
    const bool vectors = vector_rows(c, ep);
    if (vectors && ep.alpha == T(1) && (ep.beta == T(0) || ep.beta == T(1)) && !ep.bias && !ep.residual.data &&
        ep.act == activation::none) {
        // A weight gradient written or added to, the backward's case: without the epilogue's checks per
        // vector, which cost as much as the product at a few vectors per row. The same bits.
        const bool add = ep.beta == T(1);
        for (std::int64_t i = 0; i < M; ++i) {
            const B ai(a(i, 0));
            T* out = &c(i, 0);
            std::int64_t j = 0;
            for (; j + W <= N; j += W) {
                B v = ai * simd::load(row_b + j);
                if (add) v = v + simd::load(out + j);
                simd::store(out + j, v);
            }
            for (; j < N; ++j) {
                const T p = a(i, 0) * row_b[j];
                out[j] = add ? out[j] + p : p;
            }
        }
        return;
    }
    with_activation(ep.act, [&](auto act) {
        for (std::int64_t i = 0; i < M; ++i) {
            const T ai = a(i, 0);
            std::int64_t j = 0;
            if (vectors)
                for (T* out = &c(i, 0); j + W <= N; j += W)
                    simd::store(out + j, finish<act.value>(
                                             simd::fma(B(ai), simd::load(row_b + j), B(T(0))), ep, true, true,
                                             [&] { return simd::load(out + j); },
                                             [&] { return ep.bias_per_row ? B(ep.bias[i]) : simd::load(ep.bias + j); },
                                             [&] { return simd::load(&ep.residual(i, j)); }));
            for (; j < N; ++j)
                c(i, j) = finish<act.value>(
                    T(0) + ai * row_b[j], ep, true, true, [&] { return c(i, j); },
                    [&] { return ep.bias[ep.bias_per_row ? i : j]; }, [&] { return ep.residual(i, j); });
        }
    });
}

/// The small path for B with contiguous rows: the micro-kernel reads A and B in place.
template <class T>
void gemm_direct_rows(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                      const gemm_epilogue<T>& ep) {
    using S = gemm_shape<T>;
    constexpr int MR = S::MR, NV = S::NV, NR = S::NR, W = S::W;
    const std::int64_t M = c.rows, N = c.cols, K = a.cols;
    if (K == 1) return gemm_outer(a, b, c, ep);
    auto rows = [&]<int V>(std::int64_t j, std::int64_t cols) {
        std::int64_t i = 0;
        for (; i + MR <= M; i += MR) direct_tile<MR, V>(a, b, c, i, j, cols, ep);
        if (i < M) with_rows<MR - 1>(M - i, [&]<int R>() { direct_tile<R, V>(a, b, c, i, j, cols, ep); });
    };
    std::int64_t j = 0;
    for (; j + NR <= N; j += NR) rows.template operator()<NV>(j, NR);
    for (; j + W <= N; j += W) rows.template operator()<1>(j, W);
    if (j == N) return;
    // Fewer than W columns left: a vector load would read past B's rows.
    for (std::int64_t i = 0; i < M; ++i) {
        T sums[W];
        for (std::int64_t n = j; n < N; ++n) {
            T s(0);
            for (std::int64_t k = 0; k < K; ++k) s += a(i, k) * b(k, n);
            sums[n - j] = s;
        }
        finish_scalar(sums, W, c, i, j, 1, N - j, ep, true, true);
    }
}

/// An R × W/R tile of C at (i, j), `rows` × `cols` of it inside C, as dot products of A's rows and B's
/// columns, both contiguous along k: W accumulators, one per element, which simd::lane_sums folds into
/// one vector of the W sums. R rows share each B load; rows and columns past the edge repeat the
/// last one (computed, not stored). Single rows go through dot_row.
template <int R, class T>
void dot_tile(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, std::int64_t i,
              std::int64_t j, std::int64_t rows, std::int64_t cols, const gemm_epilogue<T>& ep) {
    static_assert(R > 1, "dl: single rows go through dot_row");
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>, C = W / R;
    const std::int64_t K = a.cols, kv = K / W * W;
    const T* row[R];
    const T* col[C];
    for (int r = 0; r < R; ++r) row[r] = &a(i + std::min<std::int64_t>(r, rows - 1), 0);
    for (int q = 0; q < C; ++q) col[q] = &b(0, j + std::min<std::int64_t>(q, cols - 1));
    // Unrolled outright, so that acc stays in registers (16 of them at AVX-512): GCC otherwise keeps the
    // array on the stack, zeroes it with a memset per tile and sends every FMA through memory.
    B acc[W];
#pragma GCC unroll 16
    for (int e = 0; e < W; ++e) acc[e] = B(T(0));
    for (std::int64_t k = 0; k < kv; k += W) {
        B bv[C];
#pragma GCC unroll 16
        for (int q = 0; q < C; ++q) bv[q] = simd::load(col[q] + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const B av = simd::load(row[r] + k);
#pragma GCC unroll 16
            for (int q = 0; q < C; ++q) acc[r * C + q] = simd::fma(av, bv[q], acc[r * C + q]);
        }
    }
    alignas(64) T sums[W] = {};
    for (std::int64_t k = kv; k < K; ++k)
        for (int r = 0; r < R; ++r)
            for (int q = 0; q < C; ++q) sums[r * C + q] += row[r][k] * col[q][k];
    simd::store(sums, simd::lane_sums(acc) + simd::load(sums));
    finish_scalar(sums, C, c, i, j, rows, cols, ep, true, true);
}

/// Row i of C over columns [j_begin, j_end) as dot products (dot_tile's method for one row), in one
/// call: W columns at a time, B's columns reached by stepping one pointer, so the set-up is paid once
/// per row rather than once per tile. At batch 1 (x·Wᵀ of a small layer) a per-tile set-up and the
/// spills of W column pointers cost more than the FMAs. A last, partial tile repeats its last column.
template <class T>
void dot_row(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, std::int64_t i,
             std::int64_t j_begin, std::int64_t j_end, const gemm_epilogue<T>& ep) {
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>;
    const std::int64_t K = a.cols, kv = K / W * W, ld = b.col_stride;
    const T* row = &a(i, 0);
    // Full is a template argument so that full tiles step the pointer unconditionally: with the
    // partial tile's run-time step in the same loop, GCC splits every FMA into a multiply and an add.
    auto tile = [&]<bool Full>(std::int64_t j, std::int64_t cols) {
        const T* col0 = &b(0, j);
        B acc[W];
#pragma GCC unroll 16
        for (int q = 0; q < W; ++q) acc[q] = B(T(0));
        for (std::int64_t k = 0; k < kv; k += W) {
            const B av = simd::load(row + k);
            const T* col = col0 + k;
#pragma GCC unroll 16
            for (int q = 0; q < W; ++q) {
                acc[q] = simd::fma(av, simd::load(col), acc[q]);
                if (Full || q + 1 < cols) col += ld;
            }
        }
        alignas(64) T sums[W] = {};
        if (kv < K)
            for (int q = 0; q < W; ++q) {
                const T* col = col0 + std::min<std::int64_t>(q, cols - 1) * ld;
                for (std::int64_t k = kv; k < K; ++k) sums[q] += row[k] * col[k];
            }
        B out[1][1] = {{simd::lane_sums(acc) + simd::load(sums)}};
        store_tile<1, 1>(out, c, i, j, 1, cols, ep, true, true);
    };
    std::int64_t j = j_begin;
    for (; j + W <= j_end; j += W) tile.template operator()<true>(j, W);
    if (j < j_end) tile.template operator()<false>(j, j_end - j);
}

/// C(i, j) = act(C(i, j)) + residual(i, j) over columns [j_begin, j_end) of every row: the end of
/// finish() for sums stored without it, a row of vectors at a time (the same bits: the scalar and
/// vector activations agree).
template <class T>
void finish_activation(const matrix_ref<T>& c, std::int64_t j_begin, std::int64_t j_end, const gemm_epilogue<T>& ep) {
    constexpr int W = simd::width<T>;
    const bool vectors = vector_rows(c, ep);
    with_activation(ep.act, [&](auto act) {
        for (std::int64_t i = 0; i < c.rows; ++i) {
            std::int64_t j = j_begin;
            if (vectors)
                for (; j + W <= j_end; j += W) {
                    auto v = activate<act.value>(simd::load(&c(i, j)));
                    if (ep.residual.data) v = v + simd::load(&ep.residual(i, j));
                    simd::store(&c(i, j), v);
                }
            for (; j < j_end; ++j) {
                T v = activate<act.value>(c(i, j));
                if (ep.residual.data) v = v + ep.residual(i, j);
                c(i, j) = v;
            }
        }
    });
}

/// Rows of A up to which x·Wᵀ reads W in place (dot products) rather than packing it, and the size
/// (M·N·K) below which it does at any row count. Measured on one thread at K = 784, N = 256: 8 µs
/// against 34 µs packed at M = 1 (nearly all of it the copy of W), level at M = 8, 1.4x slower at
/// M = 32, where the packed kernel's reuse of each B vector (12 rows against 4) pays for the copy; at
/// 64 × 64 · 64 × 64 the dot products' fold of each tile costs more than its four k steps.
inline constexpr std::int64_t dot_product_rows = 8, dot_product_work = std::int64_t{1} << 16;

/// The path for A's rows and B's columns contiguous (x·Wᵀ, a linear layer at a few rows, see
/// dot_product_rows): each element of C is a dot product read in place. Packing B would copy all of W
/// to use it a few times. Tiles of W/4 rows by 4 columns; single rows (M = 1, the last rows) by W
/// columns. Large products split their columns over the threads (each element is computed alone: any
/// split gives the same bits).
template <class T>
void gemm_direct_cols(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                      const gemm_epilogue<T>& ep, Context& ctx) {
    constexpr int W = simd::width<T>, R = W >= 8 ? W / 4 : 1, C = W / R;
    const std::int64_t M = c.rows, N = c.cols;
    // The activation, and the residual that follows it, run over whole rows once their sums are stored:
    // applied per tile, each tile's one vector went through tanh or sigmoid alone, a long dependency
    // chain after each fold (a fifth of a batch-1 MLP's time), and the R-row tiles applied it element
    // by element.
    gemm_epilogue<T> sums = ep;
    sums.act = activation::none;
    sums.residual = {};
    const bool then_activate = ep.act != activation::none || ep.residual.data;
    auto columns = [&](std::int64_t j_begin, std::int64_t j_end) {
        std::int64_t i = 0;
        if constexpr (R > 1)
            for (; i + R <= M; i += R)
                for (std::int64_t j = j_begin; j < j_end; j += C)
                    dot_tile<R>(a, b, c, i, j, R, std::min<std::int64_t>(C, j_end - j), sums);
        for (; i < M; ++i) dot_row(a, b, c, i, j_begin, j_end, sums);
        if (then_activate) finish_activation(c, j_begin, j_end, ep);
    };
    const std::int64_t work = M * N * a.cols, unit = W;  // whole vectors of columns per part
    const std::int64_t parts = ctx.concurrency() > 1 && work >= (std::int64_t{1} << 20)
                                   ? std::min<std::int64_t>(ctx.concurrency(), (N + unit - 1) / unit)
                                   : 1;
    if (parts <= 1) return columns(0, N);
    const std::int64_t per = ((N + parts - 1) / parts + unit - 1) / unit * unit;
    ctx.parallel_for(parts, [&](std::int64_t p) {
        const std::int64_t begin = std::min(N, p * per), end = std::min(N, begin + per);
        if (begin < end) columns(begin, end);
    });
}
#endif

/// Any element type, one element at a time, accumulating in compute_t<T> (double stays double).
template <class T>
void gemm_scalar(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                 const gemm_epilogue<T>& ep, std::int64_t i_begin, std::int64_t i_end, std::int64_t j_begin,
                 std::int64_t j_end) {
    using Acc = compute_t<T>;
    for (std::int64_t i = i_begin; i < i_end; ++i)
        for (std::int64_t j = j_begin; j < j_end; ++j) {
            Acc s(0);
            for (std::int64_t k = 0; k < a.cols; ++k) s += static_cast<Acc>(a(i, k)) * static_cast<Acc>(b(k, j));
            const T sum = static_cast<T>(s);
            finish_scalar(&sum, 1, c, i, j, 1, 1, ep, true, true);
        }
}

#ifdef DL_USE_BLAS
/// The DL_USE_BLAS backend: cblas_?gemm for the product (alpha, beta), then bias, activation and residual
/// in one pass over C. Returns false (dl's kernel then runs) for layouts BLAS cannot describe: C's
/// columns not contiguous, or an operand with neither stride 1. OpenBLAS uses its own threads
/// (OPENBLAS_NUM_THREADS), not the Context's.
template <class T>
bool blas_gemm(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
               const gemm_epilogue<T>& ep) {
    const std::int64_t M = c.rows, N = c.cols, K = a.cols;
    // Row-major operand X [rows, cols]: untransposed with leading dimension row_stride when its rows are
    // contiguous, else transposed with col_stride when its columns are.
    struct operand {
        bool ok;
        CBLAS_TRANSPOSE trans;
        std::int64_t ld;
    };
    auto describe = [](const auto& x) {
        if (x.col_stride == 1 && x.row_stride >= std::max<std::int64_t>(1, x.cols)) return operand{true, CblasNoTrans, x.row_stride};
        if (x.row_stride == 1 && x.col_stride >= std::max<std::int64_t>(1, x.rows)) return operand{true, CblasTrans, x.col_stride};
        return operand{false, CblasNoTrans, 0};
    };
    const operand oa = describe(a), ob = describe(b);
    if (K == 0 || !oa.ok || !ob.ok || c.col_stride != 1 || c.row_stride < std::max<std::int64_t>(1, N)) return false;
    if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, oa.trans, ob.trans, int(M), int(N), int(K), ep.alpha, a.data, int(oa.ld), b.data,
                    int(ob.ld), ep.beta, c.data, int(c.row_stride));
    else
        cblas_dgemm(CblasRowMajor, oa.trans, ob.trans, int(M), int(N), int(K), ep.alpha, a.data, int(oa.ld), b.data,
                    int(ob.ld), ep.beta, c.data, int(c.row_stride));
    if (ep.bias || ep.act != activation::none || ep.residual.data) {
        gemm_epilogue<T> rest = ep;
        rest.alpha = T(1);
        rest.beta = T(0);
        finish_rows(c.data, c.row_stride, c, rest);  // in place: reads each element before it writes it
    }
    return true;
}
#endif

#ifdef DL_COMPILED
// The instruction set the kernels are built for, as a symbol that only dl::compiled defines: a file
// built for another one than the compiled part fails to link, naming the one it expected, instead of
// running kernels built for other registers (src/compiled.cpp; the sets xsimd's batch width and dl's
// kernels branch on). Files built without DL_COMPILED are not checked: as with header-only dl, every
// file of a program must be built for the same instruction set.
#if defined(DL_NO_SIMD)
#define DL_COMPILED_FOR compiled_part_built_without_simd
#elif defined(__AVX512BW__)
#define DL_COMPILED_FOR compiled_part_built_for_avx512bw
#elif defined(__AVX512F__)
#define DL_COMPILED_FOR compiled_part_built_for_avx512f
#elif defined(__AVX2__) && defined(__FMA__)
#define DL_COMPILED_FOR compiled_part_built_for_avx2_fma
#elif defined(__AVX2__)
#define DL_COMPILED_FOR compiled_part_built_for_avx2
#elif defined(__AVX__)
#define DL_COMPILED_FOR compiled_part_built_for_avx
#elif defined(__SSE4_2__)
#define DL_COMPILED_FOR compiled_part_built_for_sse4_2
#elif defined(__ARM_FEATURE_SVE)
#define DL_COMPILED_FOR compiled_part_built_for_sve
#elif defined(__ARM_NEON)
#define DL_COMPILED_FOR compiled_part_built_for_neon
#else
#define DL_COMPILED_FOR compiled_part_built_for_baseline
#endif
void DL_COMPILED_FOR() noexcept;
#endif

template <class T>
void gemm(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
          const gemm_epilogue<T>& ep, Context& ctx);

/// 16-bit operands (gemm_half.hpp).
template <class T>
void gemm_widened(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                  const gemm_epilogue<T>& ep, Context& ctx);

/// C = act(alpha·A·B + beta·C + bias) + residual (see gemm_epilogue). C must not overlap A, B or the
/// residual. Runs on ctx's threads when large (with DL_USE_BLAS: on OpenBLAS's, see blas_gemm).
template <class T>
void gemm(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
          const gemm_epilogue<T>& ep, Context& ctx) {
    const std::int64_t M = c.rows, N = c.cols, K = a.cols;
    if (a.rows != M || b.rows != K || b.cols != N || (ep.residual.data && (ep.residual.rows != M || ep.residual.cols != N)))
        fail("dl::gemm: shapes [", a.rows, ", ", a.cols, "]·[", b.rows, ", ", b.cols, "] into [", M, ", ", N, "]",
             ep.residual.data ? " with a residual" : "", " do not match");
    if constexpr (is_half_float<T>) {
        if (M > 0 && N > 0) gemm_widened(a, b, c, ep, ctx);
    } else {
#ifdef DL_COMPILED
        DL_COMPILED_FOR();
#endif
        gemm_checked(a, b, c, ep, ctx);
    }
}

/// gemm() after its shape checks, for float, double and the other non-16-bit types.
template <class T>
void gemm_checked(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                  const gemm_epilogue<T>& ep, Context& ctx) {
    const std::int64_t M = c.rows, N = c.cols, K = a.cols;
    const op_scope scope(ctx, "matmul", 2.0 * double(M) * double(N) * double(K),
                               double(sizeof(T)) * double(M * K + K * N + M * N));
    if (M == 0 || N == 0) return;
    const std::int64_t work = M * N * std::max<std::int64_t>(K, 1);
#ifdef DL_USE_BLAS
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
        if (blas_gemm(a, b, c, ep)) return;
#endif
#ifndef DL_NO_SIMD
    if constexpr (simd::has_batch<T>) {
        using S = gemm_shape<T>;
        // A few rows: packing would copy more than the product reads.
        if ((M <= 4 || work < (std::int64_t{1} << 14)) && K > 0 && b.col_stride == 1)
            return gemm_direct_rows(a, b, c, ep);
        if ((M <= dot_product_rows || work < dot_product_work) && K > 0 && b.row_stride == 1 && a.col_stride == 1)
            return gemm_direct_cols(a, b, c, ep, ctx);
        const int threads = ctx.concurrency();
        const bool split_rows = M >= N;
        const std::int64_t extent = split_rows ? M : N, unit = split_rows ? S::MR : S::NR;
        const std::int64_t parts =
            threads > 1 && work >= (std::int64_t{1} << 20) ? std::min<std::int64_t>(threads, (extent + unit - 1) / unit) : 1;
        if (parts <= 1) return gemm_packed(a, b, c, ep, 0, M, 0, N);
        const std::int64_t per = ((extent + parts - 1) / parts + unit - 1) / unit * unit;
        ctx.parallel_for(parts, [&](std::int64_t p) {
            const std::int64_t begin = std::min(extent, p * per), end = std::min(extent, begin + per);
            if (begin >= end) return;
            if (split_rows) gemm_packed(a, b, c, ep, begin, end, 0, N);
            else gemm_packed(a, b, c, ep, 0, M, begin, end);
        });
        return;
    }
#endif
    if (ctx.concurrency() > 1 && work >= (std::int64_t{1} << 18))
        return ctx.parallel_for(M, [&](std::int64_t i) { gemm_scalar(a, b, c, ep, i, i + 1, 0, N); });
    gemm_scalar(a, b, c, ep, 0, M, 0, N);
}

#ifdef DL_COMPILED
// With the compiled part (the CMake target dl::compiled, src/compiled.cpp) the float and double
// products are compiled once, there: every other file links them instead of compiling the dozens of
// tile kernels again (~40% of the optimiser's time in a file that trains an MLP).
extern template void gemm_checked<float>(const matrix_ref<const float>&, const matrix_ref<const float>&,
                                         const matrix_ref<float>&, const gemm_epilogue<float>&, Context&);
extern template void gemm_checked<double>(const matrix_ref<const double>&, const matrix_ref<const double>&,
                                          const matrix_ref<double>&, const gemm_epilogue<double>&, Context&);
#endif

/// C = A·B, or C += A·B when `accumulate`.
template <class T>
void gemm(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, bool accumulate,
          Context& ctx) {
    gemm(a, b, c, gemm_epilogue<T>{.beta = accumulate ? T(1) : T(0)}, ctx);
}

/// `count` products C_n = A_n·B_n with A_n = a shifted by n·stride_a elements (likewise B, C): one
/// call for attention heads, batched matmul and convolution groups. Small products run one per thread.
template <class T>
void gemm_batched(const matrix_ref<const T>& a, std::int64_t stride_a, const matrix_ref<const T>& b,
                  std::int64_t stride_b, const matrix_ref<T>& c, std::int64_t stride_c, std::int64_t count,
                  const gemm_epilogue<T>& ep, Context& ctx) {
    if (ep.residual.data) fail("dl::gemm_batched: a residual is not supported for batched products");
    auto shifted = [](auto m, std::int64_t by) {
        m.data += by;
        return m;
    };
    const std::int64_t work = c.rows * c.cols * std::max<std::int64_t>(a.cols, 1);
    if (count > 1 && ctx.concurrency() > 1 && work < (std::int64_t{1} << 20) && count * work >= (std::int64_t{1} << 18)) {
        ctx.parallel_for(count, [&](std::int64_t n) {
            const serial_scope serial;  // each product on this thread: they are too small to split
            gemm(shifted(a, n * stride_a), shifted(b, n * stride_b), shifted(c, n * stride_c), ep, ctx);
        });
        return;
    }
    for (std::int64_t n = 0; n < count; ++n)
        gemm(shifted(a, n * stride_a), shifted(b, n * stride_b), shifted(c, n * stride_c), ep, ctx);
}

/// The matrix of a rank-2 tensor (or of a rank-2 view of one).
template <class T>
[[nodiscard]] matrix_ref<const T> as_matrix(const Tensor<T>& t) {
    return {t.data(), t.shape()[0], t.shape()[1], t.strides()[0], t.strides()[1]};
}
template <class T>
[[nodiscard]] matrix_ref<T> as_mutable_matrix(const Tensor<T>& t) {
    return {t.data(), t.shape()[0], t.shape()[1], t.strides()[0], t.strides()[1]};
}
/// The transpose of a rank-2 tensor's matrix, without making a transposed view (a Tensor) first.
template <class T>
[[nodiscard]] matrix_ref<const T> as_transposed_matrix(const Tensor<T>& t) {
    return {t.data(), t.shape()[1], t.shape()[0], t.strides()[1], t.strides()[0]};
}

}  // namespace dl::detail

#include "gemm_half.hpp"  // the 16-bit products, which call back into gemm() above
