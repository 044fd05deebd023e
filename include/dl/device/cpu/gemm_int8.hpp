#pragma once
// Integer GEMM C (+)= A·B with A uint8, B int8 and C int32, exact (no saturation), for quantized
// inference: activations are unsigned 8-bit, weights signed.
//
// Same structure as the float GEMM (gemm.hpp): panels packed, an MR × 32 tile of C in registers. The
// packing groups k in fours, because AVX-512 VNNI's vpdpbusd multiplies four u8·s8 pairs and adds them
// into one int32 lane: each step broadcasts 4 bytes of an A row and multiplies 64 bytes of B (16
// columns × 4 k). Dispatch is at compile time: the VNNI kernel when the target has it
// (__AVX512VNNI__, e.g. -march=native on Zen 4 / Ice Lake and later), otherwise a portable kernel over
// the same packed panels. gemm_u8s8<false> forces the portable one (the tests run both).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm.hpp"

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define DL_HAVE_VNNI 1
#else
#define DL_HAVE_VNNI 0
#endif

namespace dl::detail {

inline constexpr bool has_vnni = DL_HAVE_VNNI;

struct int8_shape {
    static constexpr int MR = 8, NR = 32;
    static constexpr std::int64_t KC = 1024;  // k per packed block, a multiple of 4
};

/// acc[r][n] = Σ A(r, k)·B-panel(k, n) over k4 groups of four. The four bytes of row r, group g are at
/// a + r·row_step + g·group_step: a packed panel (4, MR·4) or rows of A itself (its row stride, 4).
template <bool Vnni>
void int8_tile(std::int64_t k4, const std::uint8_t* a, std::int64_t row_step, std::int64_t group_step,
               const std::int8_t* pb, std::int32_t (&acc)[int8_shape::MR][int8_shape::NR]) {
    constexpr int MR = int8_shape::MR, NR = int8_shape::NR;
#if DL_HAVE_VNNI
    if constexpr (Vnni) {
        __m512i sum[MR][2];
        // Unrolled in full so that sum stays in registers at -O2 too (see gemm.hpp's micro_kernel).
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
        for (std::int64_t k = 0; k < k4; ++k) {
            const __m512i b0 = _mm512_loadu_si512(pb + k * NR * 4), b1 = _mm512_loadu_si512(pb + k * NR * 4 + 64);
#pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) {
                std::int32_t word;
                std::memcpy(&word, a + r * row_step + k * group_step, 4);
                const __m512i av = _mm512_set1_epi32(word);
                sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], av, b0);
                sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], av, b1);
            }
        }
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            _mm512_storeu_si512(acc[r], sum[r][0]);
            _mm512_storeu_si512(acc[r] + 16, sum[r][1]);
        }
        return;
    }
#endif
    for (int r = 0; r < MR; ++r)
        for (int n = 0; n < NR; ++n) acc[r][n] = 0;
    for (std::int64_t k = 0; k < k4; ++k)
        for (int r = 0; r < MR; ++r) {
            const std::uint8_t* av = a + r * row_step + k * group_step;
            for (int n = 0; n < NR; ++n) {
                const std::int8_t* bv = pb + (k * NR + n) * 4;
                acc[r][n] += std::int32_t(av[0]) * bv[0] + std::int32_t(av[1]) * bv[1] + std::int32_t(av[2]) * bv[2] +
                             std::int32_t(av[3]) * bv[3];
            }
        }
}

/// B [K, N] in the panels the int8 kernel reads: k in blocks of KC, each block as column panels of NR
/// with k in groups of four. Packed once per product, or once for good when B is a quantized layer's
/// weight (quantized.hpp), so that inference does not repack constant weights on every call.
class packed_s8 {
public:
    packed_s8() = default;
    explicit packed_s8(const matrix_ref<const std::int8_t>& b) { pack(b); }

    /// Repacks into this object's storage, which is kept for the next pack.
    void pack(const matrix_ref<const std::int8_t>& b) {
        constexpr int NR = int8_shape::NR;
        rows_ = b.rows;
        cols_ = b.cols;
        const std::int64_t panels = (cols_ + NR - 1) / NR, last = rows_ > 0 ? (rows_ - 1) / int8_shape::KC * int8_shape::KC : 0;
        panels_.resize(std::size_t(block_offset(last) + (rows_ - last + 3) / 4 * 4 * NR * panels));
        for (std::int64_t pc = 0; pc < rows_; pc += int8_shape::KC) {
            const std::int64_t kc = std::min(int8_shape::KC, rows_ - pc), k4 = (kc + 3) / 4;
            for (std::int64_t j = 0; j < cols_; j += NR)
                pack_k_groups<NR, 4>(std::min<std::int64_t>(NR, cols_ - j), kc,
                                     [&](std::int64_t n, std::int64_t k) { return b(pc + k, j + n); },
                                     panels_.data() + block_offset(pc) + (j / NR) * k4 * NR * 4);
        }
    }

    [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
    [[nodiscard]] std::int64_t cols() const noexcept { return cols_; }
    /// The panels of the k block starting at pc (a multiple of KC).
    [[nodiscard]] const std::int8_t* block(std::int64_t pc) const noexcept { return panels_.data() + block_offset(pc); }

private:
    // Every block before pc is full: KC / 4 groups of NR · 4 bytes per panel.
    [[nodiscard]] std::int64_t block_offset(std::int64_t pc) const noexcept {
        return pc * int8_shape::NR * ((cols_ + int8_shape::NR - 1) / int8_shape::NR);
    }

    std::int64_t rows_ = 0, cols_ = 0;
    std::vector<std::int8_t> panels_;
};

/// The int8 product on rows [i_begin, i_end) of C, serial, with B packed already.
template <bool Vnni>
void gemm_u8s8_rows(const matrix_ref<const std::uint8_t>& a, const packed_s8& b, const matrix_ref<std::int32_t>& c,
                    bool accumulate, std::int64_t i_begin, std::int64_t i_end) {
    constexpr int MR = int8_shape::MR, NR = int8_shape::NR;
    const std::int64_t K = a.cols, N = c.cols;
    const std::int64_t kc_max = std::min<std::int64_t>(int8_shape::KC, std::max<std::int64_t>(K, 4));
    std::uint8_t* pa = gemm_scratch<std::uint8_t>(0, (kc_max + 3) / 4 * MR * 4);
    const bool direct = a.col_stride == 1 && K % 4 == 0;
    std::int32_t acc[MR][NR];
    for (std::int64_t pc = 0; pc == 0 || pc < K; pc += int8_shape::KC) {
        const std::int64_t kc = std::min(int8_shape::KC, K - pc), k4 = (kc + 3) / 4;
        const bool add = accumulate || pc > 0;
        const std::int8_t* pb = b.block(pc);
        for (std::int64_t i = i_begin; i < i_end; i += MR) {
            const std::int64_t rows = std::min<std::int64_t>(MR, i_end - i);
            // Whole row blocks of an A with rows of whole groups are read in place, not packed.
            const bool in_place = direct && rows == MR;
            if (!in_place)
                pack_k_groups<MR, 4>(rows, kc, [&](std::int64_t r, std::int64_t k) { return a(i + r, pc + k); }, pa);
            const std::uint8_t* panel = in_place ? &a(i, pc) : pa;
            const std::int64_t row_step = in_place ? a.row_stride : 4, group_step = in_place ? 4 : MR * 4;
            for (std::int64_t j = 0; j < N; j += NR) {
                int8_tile<Vnni>(k4, panel, row_step, group_step, pb + (j / NR) * k4 * NR * 4, acc);
                const std::int64_t cols = std::min<std::int64_t>(NR, N - j);
                for (std::int64_t r = 0; r < rows; ++r)
                    for (std::int64_t n = 0; n < cols; ++n) {
                        std::int32_t& out = c(i + r, j + n);
                        out = add ? out + acc[r][n] : acc[r][n];
                    }
            }
        }
    }
}

/// C = A·B (or C += A·B when `accumulate`) for A [M, K] uint8 (any strides), B [K, N] int8 packed and
/// C [M, N] int32; exact. Split over rows of C on ctx's threads when large. Vnni = false forces the
/// portable kernel on a VNNI machine.
template <bool Vnni = has_vnni>
void gemm_u8s8(const matrix_ref<const std::uint8_t>& a, const packed_s8& b, const matrix_ref<std::int32_t>& c,
               bool accumulate, Context& ctx) {
    const std::int64_t M = c.rows, N = c.cols, K = a.cols;
    if (a.rows != M || b.rows() != K || b.cols() != N)
        fail("dl::gemm_u8s8: shapes [", a.rows, ", ", a.cols, "]·[", b.rows(), ", ", b.cols(), "] into [", M, ", ", N,
             "] do not match");
    const op_scope scope(ctx, "matmul_int8", 2.0 * double(M) * double(N) * double(K),
                               double(M * K + K * N + 4 * M * N));
    if (M == 0 || N == 0) return;
    constexpr int MR = int8_shape::MR;
    const int threads = ctx.concurrency();
    const std::int64_t parts = threads > 1 && M * N * K >= (std::int64_t{1} << 20) ? std::min<std::int64_t>(threads, (M + MR - 1) / MR) : 1;
    if (parts <= 1) return gemm_u8s8_rows<Vnni>(a, b, c, accumulate, 0, M);
    const std::int64_t per = ((M + parts - 1) / parts + MR - 1) / MR * MR;
    ctx.parallel_for(parts, [&](std::int64_t p) {
        const std::int64_t begin = std::min(M, p * per), end = std::min(M, begin + per);
        if (begin < end) gemm_u8s8_rows<Vnni>(a, b, c, accumulate, begin, end);
    });
}

/// gemm_u8s8 with B [K, N] int8 at any strides, packed for this product (once, not per thread).
template <bool Vnni = has_vnni>
void gemm_u8s8(const matrix_ref<const std::uint8_t>& a, const matrix_ref<const std::int8_t>& b,
               const matrix_ref<std::int32_t>& c, bool accumulate, Context& ctx) {
    if (a.cols != b.rows || b.cols != c.cols)
        fail("dl::gemm_u8s8: shapes [", a.rows, ", ", a.cols, "]·[", b.rows, ", ", b.cols, "] into [", c.rows, ", ",
             c.cols, "] do not match");
    thread_local packed_s8 packed;  // its storage is reused by the next product on this thread
    packed.pack(b);
    gemm_u8s8<Vnni>(a, packed, c, accumulate, ctx);
}

}  // namespace dl::detail
