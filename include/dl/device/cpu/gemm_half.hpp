#pragma once
// Products of 16-bit floats. gemm_bf16: C (+)= A·B with A and B bfloat16 and C float, accumulating in
// float. On AVX-512 BF16 (vdpbf16ps, compile-time dispatch on __AVX512BF16__) the kernel reads packed
// bf16 panels directly: k is grouped in pairs, each step broadcasts one pair of an A row and
// multiplies 16 column pairs of B into 16 float lanes, half the bytes of a float GEMM per
// multiply-add. vdpbf16ps flushes subnormal inputs and outputs to zero (as every bf16 dot-product
// unit does); products of bf16 values are exact in float. Elsewhere, and for float16, the float kernel
// runs on widened copies of the operands (gemm_bf16<false> forces that path; the tests run both).
// gemm() on Tensor<bfloat16>/<float16> operands (Linear, Conv2d on 16-bit weights) goes through here
// and rounds C once on the way back.
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "gemm.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define DL_HAVE_AVX512_BF16 1
#else
#define DL_HAVE_AVX512_BF16 0
#endif

namespace dl::detail {

inline constexpr bool has_avx512_bf16 = DL_HAVE_AVX512_BF16;

#if DL_HAVE_AVX512_BF16
struct bf16_shape {
    static constexpr int MR = 12, NR = 32;   // 24 accumulators + 2 B vectors + 1 broadcast of 32 registers
    static constexpr std::int64_t KC = 512;  // k per packed block, even
    static constexpr std::int64_t NC = 512;  // columns per packed B block: KC · NC bf16 (512 KiB) stays in L2
    static_assert(NC % NR == 0);
};

/// acc = Σ over k pairs of the packed panels' products (vdpbf16ps), an MR × NR float tile.
inline void bf16_tile(std::int64_t k2, const bfloat16* pa, const bfloat16* pb, float (&acc)[bf16_shape::MR][bf16_shape::NR]) {
    constexpr int MR = bf16_shape::MR, NR = bf16_shape::NR;
    __m512 sum[MR][2];
    // Unrolled in full so that sum stays in registers at -O2 too (see gemm.hpp's micro_kernel).
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_ps();
    for (std::int64_t k = 0; k < k2; ++k) {
        const auto b0 = std::bit_cast<__m512bh>(_mm512_loadu_si512(pb + k * NR * 2));
        const auto b1 = std::bit_cast<__m512bh>(_mm512_loadu_si512(pb + k * NR * 2 + 32));
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            std::int32_t pair;
            std::memcpy(&pair, pa + (k * MR + r) * 2, 4);
            const auto av = std::bit_cast<__m512bh>(_mm512_set1_epi32(pair));
            sum[r][0] = _mm512_dpbf16_ps(sum[r][0], av, b0);
            sum[r][1] = _mm512_dpbf16_ps(sum[r][1], av, b1);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        _mm512_storeu_ps(acc[r], sum[r][0]);
        _mm512_storeu_ps(acc[r] + 16, sum[r][1]);
    }
}

/// pack_k_groups<NR, 2> of B(pc .. pc+kc, j .. j+cols) for B with contiguous rows: each k pair is two
/// rows of NR = 32 values interleaved by two permutes, instead of one scattered element at a time.
/// Columns past `cols` and the row past an odd kc read as zero (masked loads touch no memory there).
inline void pack_b_bf16_rows(const matrix_ref<const bfloat16>& b, std::int64_t pc, std::int64_t kc, std::int64_t j,
                             std::int64_t cols, bfloat16* p) {
    static_assert(bf16_shape::NR == 32, "one 512-bit register holds a row of the panel");
    // Element e of an interleaved half takes row (e odd) at column e / 2 (+ 16 for the upper half).
    constexpr auto interleave = [](int first_column) {
        std::array<std::int16_t, 32> index{};
        for (int e = 0; e < 32; ++e) index[std::size_t(e)] = std::int16_t(first_column + e / 2 + (e % 2) * 32);
        return index;
    };
    alignas(64) static constexpr std::array<std::int16_t, 32> lower = interleave(0), upper = interleave(16);
    const __m512i lo = _mm512_load_si512(lower.data()), hi = _mm512_load_si512(upper.data());
    const auto valid = cols >= 32 ? ~__mmask32(0) : (__mmask32(1) << cols) - 1;
    for (std::int64_t k = 0; k < kc; k += 2, p += 64) {
        const __m512i r0 = _mm512_maskz_loadu_epi16(valid, &b(pc + k, j));
        const __m512i r1 = k + 1 < kc ? _mm512_maskz_loadu_epi16(valid, &b(pc + k + 1, j)) : _mm512_setzero_si512();
        _mm512_storeu_si512(p, _mm512_permutex2var_epi16(r0, lo, r1));
        _mm512_storeu_si512(p + 32, _mm512_permutex2var_epi16(r0, hi, r1));
    }
}

/// pack_k_groups<MR, 2> of A(i .. i+rows, pc .. pc+kc) for A with contiguous rows: a k pair of one row
/// is one 32-bit word, so the panel is a transpose of words (the element-wise pack took 15% of a
/// 512³ product). Rows past `rows` and the element past an odd kc read as zero.
inline void pack_a_bf16_rows(const matrix_ref<const bfloat16>& a, std::int64_t i, std::int64_t rows, std::int64_t pc,
                             std::int64_t kc, bfloat16* p) {
    constexpr int MR = bf16_shape::MR;
    const std::int64_t pairs = kc / 2, k2 = (kc + 1) / 2;
    if (rows < MR || kc % 2 != 0) std::fill(p, p + k2 * MR * 2, bfloat16{});
    for (std::int64_t r = 0; r < rows; ++r) {
        const bfloat16* row = &a(i + r, pc);
        for (std::int64_t k = 0; k < pairs; ++k) std::memcpy(p + (k * MR + r) * 2, row + 2 * k, 4);
        if (kc % 2 != 0) p[(pairs * MR + r) * 2] = row[kc - 1];
    }
}

/// The packed bf16 product on rows [i_begin, i_end) of C, serial. Each thread packs all of B (no
/// synchronisation between threads; the copy is O(K·N) against O(M·K·N) work), one L2-sized block of
/// columns at a time, and all of its rows of A once per k block, which every block of B then reads.
inline void gemm_bf16_rows(const matrix_ref<const bfloat16>& a, const matrix_ref<const bfloat16>& b,
                           const matrix_ref<float>& c, bool accumulate, std::int64_t i_begin, std::int64_t i_end) {
    constexpr int MR = bf16_shape::MR, NR = bf16_shape::NR;
    const std::int64_t K = a.cols, N = c.cols;
    const std::int64_t k2_max = (std::min<std::int64_t>(bf16_shape::KC, std::max<std::int64_t>(K, 2)) + 1) / 2;
    const std::int64_t strips = (i_end - i_begin + MR - 1) / MR;
    bfloat16* pa = gemm_scratch<bfloat16>(0, strips * k2_max * MR * 2);
    bfloat16* pb = gemm_scratch<bfloat16>(1, k2_max * NR * 2 * ((std::min(N, bf16_shape::NC) + NR - 1) / NR));
    float acc[MR][NR];
    for (std::int64_t pc = 0; pc == 0 || pc < K; pc += bf16_shape::KC) {
        const std::int64_t kc = std::min(bf16_shape::KC, K - pc), k2 = (kc + 1) / 2;
        const bool add = accumulate || pc > 0;
        for (std::int64_t i = i_begin; i < i_end; i += MR) {
            const std::int64_t rows = std::min<std::int64_t>(MR, i_end - i);
            bfloat16* strip = pa + (i - i_begin) / MR * k2 * MR * 2;
            if (a.col_stride == 1)
                pack_a_bf16_rows(a, i, rows, pc, kc, strip);
            else
                pack_k_groups<MR, 2>(rows, kc, [&](std::int64_t r, std::int64_t k) { return a(i + r, pc + k); }, strip);
        }
        for (std::int64_t jc = 0; jc < N; jc += bf16_shape::NC) {
            const std::int64_t jc_end = std::min(N, jc + bf16_shape::NC);
            for (std::int64_t j = jc; j < jc_end; j += NR) {
                bfloat16* panel = pb + ((j - jc) / NR) * k2 * NR * 2;
                if (b.col_stride == 1)
                    pack_b_bf16_rows(b, pc, kc, j, std::min<std::int64_t>(NR, jc_end - j), panel);
                else
                    pack_k_groups<NR, 2>(std::min<std::int64_t>(NR, jc_end - j), kc,
                                         [&](std::int64_t n, std::int64_t k) { return b(pc + k, j + n); }, panel);
            }
            for (std::int64_t i = i_begin; i < i_end; i += MR) {
                const std::int64_t rows = std::min<std::int64_t>(MR, i_end - i);
                const bfloat16* strip = pa + (i - i_begin) / MR * k2 * MR * 2;
                for (std::int64_t j = jc; j < jc_end; j += NR) {
                    bf16_tile(k2, strip, pb + ((j - jc) / NR) * k2 * NR * 2, acc);
                    const std::int64_t cols = std::min<std::int64_t>(NR, jc_end - j);
                    for (std::int64_t r = 0; r < rows; ++r) {
                        if (cols == NR && c.col_stride == 1) {  // whole vectors
                            float* out = &c(i + r, j);
                            for (int v = 0; v < NR; v += 16) {
                                const __m512 sum = _mm512_loadu_ps(acc[r] + v);
                                _mm512_storeu_ps(out + v, add ? _mm512_add_ps(_mm512_loadu_ps(out + v), sum) : sum);
                            }
                            continue;
                        }
                        for (std::int64_t n = 0; n < cols; ++n) {
                            float& out = c(i + r, j + n);
                            out = add ? out + acc[r][n] : acc[r][n];
                        }
                    }
                }
            }
        }
    }
}
#endif

/// The (possibly strided) matrix as a non-owning tensor view, for the elementwise conversions.
template <class E>
[[nodiscard]] Tensor<std::remove_const_t<E>> tensor_view(const matrix_ref<E>& m, Context& ctx) {
    using T = std::remove_const_t<E>;
    return Tensor<T>::borrow(const_cast<T*>(m.data), {m.rows, m.cols}, {m.row_stride, m.col_stride}, ctx);
}

/// C = A·B (or C += A·B when `accumulate`) for A [M, K] and B [K, N] bfloat16 and C [M, N] float, any
/// strides. Native: the vdpbf16ps kernel where the target has AVX-512 BF16, split over rows of C on
/// ctx's threads when large; otherwise (or Native = false) the float kernel on widened operands.
template <bool Native = has_avx512_bf16>
void gemm_bf16(const matrix_ref<const bfloat16>& a, const matrix_ref<const bfloat16>& b, const matrix_ref<float>& c,
               bool accumulate, Context& ctx) {
    const std::int64_t M = c.rows, N = c.cols, K = a.cols;
    if (a.rows != M || b.rows != K || b.cols != N)
        fail("dl::gemm_bf16: shapes [", a.rows, ", ", a.cols, "]·[", b.rows, ", ", b.cols, "] into [", M, ", ", N,
             "] do not match");
    if (M == 0 || N == 0) return;
    if constexpr (Native && has_avx512_bf16) {
#if DL_HAVE_AVX512_BF16
        const op_scope scope(ctx, "matmul_bf16", 2.0 * double(M) * double(N) * double(K),
                                   double(2 * (M * K + K * N) + 4 * M * N));
        constexpr int MR = bf16_shape::MR;
        const int threads = ctx.concurrency();
        const std::int64_t parts =
            threads > 1 && M * N * K >= (std::int64_t{1} << 20) ? std::min<std::int64_t>(threads, (M + MR - 1) / MR) : 1;
        if (parts <= 1) return gemm_bf16_rows(a, b, c, accumulate, 0, M);
        const std::int64_t per = ((M + parts - 1) / parts + MR - 1) / MR * MR;
        ctx.parallel_for(parts, [&](std::int64_t p) {
            const std::int64_t begin = std::min(M, p * per), end = std::min(M, begin + per);
            if (begin < end) gemm_bf16_rows(a, b, c, accumulate, begin, end);
        });
#endif
    } else {
        const Tensor<float> wa = cast<float>(tensor_view(a, ctx)), wb = cast<float>(tensor_view(b, ctx));
        gemm(as_matrix(wa), as_matrix(wb), c, accumulate, ctx);
    }
}

/// gemm() for 16-bit operands: the product in float (gemm_bf16's kernel for bfloat16 on AVX-512 BF16,
/// else the float kernel on widened copies: O(MK + KN) conversions against 2MNK flops), the epilogue in
/// float, C rounded once on the way back.
template <class T>
void gemm_widened(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                  const gemm_epilogue<T>& ep, Context& ctx) {
    Tensor<float> wc = ep.beta != T(0) ? Tensor<float>(cast<float>(tensor_view(c, ctx))) : Tensor<float>({c.rows, c.cols}, ctx);
    const matrix_ref<float> wide_c{wc.data(), c.rows, c.cols, c.cols, 1};
    Tensor<float> bias, residual;
    gemm_epilogue<float> wide{.alpha = float(ep.alpha), .beta = float(ep.beta), .bias_per_row = ep.bias_per_row, .act = ep.act};
    if (ep.bias) {
        const std::int64_t n = ep.bias_per_row ? c.rows : c.cols;
        bias = cast<float>(Tensor<T>::borrow(const_cast<T*>(ep.bias), {n}, {1}, ctx));
        wide.bias = bias.data();
    }
    if (ep.residual.data) {
        residual = cast<float>(tensor_view(ep.residual, ctx));
        wide.residual = as_matrix(residual);
    }
    if constexpr (std::is_same_v<T, bfloat16> && has_avx512_bf16) {
        // The product alone, then alpha, beta, bias, activation and residual in one pass over it.
        Tensor<float> product({c.rows, c.cols}, ctx);
        gemm_bf16(a, b, matrix_ref<float>{product.data(), c.rows, c.cols, c.cols, 1}, false, ctx);
        finish_rows(product.data(), c.cols, wide_c, wide);
    } else {
        const Tensor<float> wa = cast<float>(tensor_view(a, ctx)), wb = cast<float>(tensor_view(b, ctx));
        gemm(as_matrix(wa), as_matrix(wb), wide_c, wide, ctx);
    }
    Tensor<T> out = tensor_view(c, ctx);
    assign(out, wc);
}

}  // namespace dl::detail
