#pragma once
// 3×3 stride-1 convolution by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray, "Fast Algorithms
// for Convolutional Neural Networks", 2016). Each 2×2 block ("tile") of the output is computed from
// the 4×4 input patch under it: in the transformed domain a tile costs 16 multiplies per (input,
// output) channel pair instead of im2col's 36, so the products, which dominate, do 2.25× less work.
//  - weights: U = G·g·Gᵀ per (output, input) channel pair, 16 values, once per call;
//  - input:   V = Bᵀ·d·B per (input channel, tile);
//  - products: for each of the 16 positions ξ, M_ξ [O, tiles] = U_ξ [O, C] · V_ξ [C, tiles] (the GEMM);
//  - output:  Y = Aᵀ·M·A per (output channel, tile), 2×2 values, then bias and activation.
// The transform matrices hold only 0, ±1 and ±½, so the result differs from the direct sum by a few
// rounding errors of the transforms' additions (tests bound it against a double reference). The
// input gradient is the same algorithm on the output gradient (winograd_weights' adjoint); the weight
// gradient runs the transforms backwards (winograd_weight_gradient).
//
// Tiles of all images are numbered in one sequence (image, tile row, tile column) and processed in
// blocks of `tile_block` tiles, so that the transformed block stays in cache and small images still
// make wide products. Blocks write disjoint outputs: they run on the Context's threads with results
// independent of the thread count. With AVX-512 or AVX2 the transforms take a vector of tiles at a
// time (gathers), whatever rows they sit in; elsewhere they go element by element.
// The small fixed loops carry `#pragma GCC unroll`: their vector arrays stay in registers only when
// unrolled in full, which GCC 12 does by itself at -O3 but not at -O2.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "gemm.hpp"

// The float transforms that load whole rows (masked loads and stores on 256- and 512-bit vectors).
#if defined(__AVX512F__) && defined(__AVX512VL__) && !defined(DL_NO_SIMD)
#include <immintrin.h>
#define DL_WINOGRAD_ROWS 1
#else
#define DL_WINOGRAD_ROWS 0
#endif

namespace dl::detail {

/// A 3×3, stride-1, dilation-1, single-group convolution of x [N, C, H, W] into [N, O, OH, OW] with
/// OH = H + 2·pad_h − 2 (likewise OW).
struct winograd_shape {
    std::int64_t images, in_channels, h, w, out_channels, pad_h, pad_w;
    [[nodiscard]] std::int64_t oh() const noexcept { return h + 2 * pad_h - 2; }
    [[nodiscard]] std::int64_t ow() const noexcept { return w + 2 * pad_w - 2; }
    [[nodiscard]] std::int64_t tile_rows() const noexcept { return (oh() + 1) / 2; }
    [[nodiscard]] std::int64_t tile_cols() const noexcept { return (ow() + 1) / 2; }
};

/// U [16][outs][ins] from weights w [outs][ins][3][3] (contiguous). `adjoint`: the weights of the
/// convolution's input gradient instead, which swaps the channel roles and turns each kernel by 180°:
/// U [16][ins][outs] from w'(c, o, i, j) = w(o, c, 2 − i, 2 − j).
template <class T>
[[nodiscard]] std::vector<T> winograd_weights(const T* w, std::int64_t outs, std::int64_t ins, bool adjoint) {
    std::vector<T> u(static_cast<std::size_t>(16 * outs * ins));
    const std::int64_t rows = adjoint ? ins : outs, cols = adjoint ? outs : ins;
    for (std::int64_t o = 0; o < outs; ++o)
        for (std::int64_t c = 0; c < ins; ++c) {
            const T* k = w + (o * ins + c) * 9;
            T g[3][3];
#pragma GCC unroll 3
            for (int i = 0; i < 3; ++i)
#pragma GCC unroll 3
                for (int j = 0; j < 3; ++j) g[i][j] = adjoint ? k[(2 - i) * 3 + (2 - j)] : k[i * 3 + j];
            // G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]: rows of G·g, then columns of (G·g)·Gᵀ.
            T gg[4][3];
#pragma GCC unroll 3
            for (int j = 0; j < 3; ++j) {
                gg[0][j] = g[0][j];
                gg[1][j] = T(0.5) * (g[0][j] + g[1][j] + g[2][j]);
                gg[2][j] = T(0.5) * (g[0][j] - g[1][j] + g[2][j]);
                gg[3][j] = g[2][j];
            }
            const std::int64_t row = adjoint ? c : o, col = adjoint ? o : c;
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const T t[4] = {gg[i][0], T(0.5) * (gg[i][0] + gg[i][1] + gg[i][2]),
                                T(0.5) * (gg[i][0] - gg[i][1] + gg[i][2]), gg[i][2]};
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) u[static_cast<std::size_t>(((i * 4 + j) * rows + row) * cols + col)] = t[j];
            }
        }
    return u;
}

/// The 16 products M_ξ = U_ξ·V_ξ of one block, U_ξ [O, C] and M_ξ [O, npad] (rows `ms_row` apart, ξ
/// `ms` apart), V_ξ in the GEMM's packed-B layout: panels of NR tiles, each [C][NR] (ξ `vs` apart).
/// With SIMD, u holds the U_ξ packed as the GEMM's A panels (winograd_pack_weights) and the micro-kernel
/// runs on them directly: a block's products are too small to pay for packing on every call.
#ifndef DL_NO_SIMD
template <class T>
inline constexpr std::int64_t winograd_panel = gemm_shape<T>::NR;

/// U [16][O][C] as the GEMM's A panels: for each ξ and each k block of KC channels, panels of MR rows.
template <class T>
std::vector<T> winograd_pack_weights(const std::vector<T>& u, std::int64_t O, std::int64_t C) {
    using S = gemm_shape<T>;
    const std::int64_t rows = (O + S::MR - 1) / S::MR * S::MR;
    std::vector<T> packed(static_cast<std::size_t>(16 * rows * C));
    for (int xi = 0; xi < 16; ++xi)
        for (std::int64_t pc = 0; pc < C; pc += S::KC)
            pack_a<S::MR>(matrix_ref<const T>{u.data() + xi * O * C, O, C, C, 1}, 0, O, pc,
                          std::min(S::KC, C - pc), packed.data() + xi * rows * C + pc * rows);
    return packed;
}

template <class T>
void winograd_products(const T* packed_u, const T* v, std::int64_t vs, T* m, std::int64_t ms, std::int64_t ms_row,
                       std::int64_t O, std::int64_t C, std::int64_t panels) {
    using S = gemm_shape<T>;
    constexpr int MR = S::MR, NR = S::NR;
    const std::int64_t rows = (O + MR - 1) / MR * MR;
    for (int xi = 0; xi < 16; ++xi) {
        const matrix_ref<T> product{m + xi * ms, O, panels * NR, ms_row, 1};
        for (std::int64_t pc = 0; pc < C; pc += S::KC) {
            const std::int64_t kc = std::min(S::KC, C - pc);
            const bool first = pc == 0, last = pc + S::KC >= C;
            for (std::int64_t jp = 0; jp < panels; ++jp) {
                const T* pb = v + xi * vs + jp * C * NR + pc * NR;
                for (std::int64_t ir = 0; ir < O; ir += MR) {
                    const T* pa = packed_u + xi * rows * C + pc * rows + ir * kc;
                    if (ir + MR <= O) {
                        packed_tile<MR, T>(kc, pa, pb, product, ir, jp * NR, NR, {}, first, last);
                        continue;
                    }
                    with_rows<MR - 1>(O - ir, [&]<int R>() {
                        packed_tile<R, T>(kc, pa, pb, product, ir, jp * NR, NR, {}, first, last);
                    });
                }
            }
        }
    }
}
#else
template <class T>
inline constexpr std::int64_t winograd_panel = 16;

template <class T>
std::vector<T> winograd_pack_weights(const std::vector<T>& u, std::int64_t, std::int64_t) {
    return u;
}

template <class T>
void winograd_products(const T* u, const T* v, std::int64_t vs, T* m, std::int64_t ms, std::int64_t ms_row,
                       std::int64_t O, std::int64_t C, std::int64_t panels) {
    constexpr std::int64_t NR = winograd_panel<T>;
    for (int xi = 0; xi < 16; ++xi)
        for (std::int64_t jp = 0; jp < panels; ++jp)
            gemm_scalar(matrix_ref<const T>{u + xi * O * C, O, C, C, 1},
                        matrix_ref<const T>{v + xi * vs + jp * C * NR, C, NR, NR, 1},
                        matrix_ref<T>{m + xi * ms + jp * NR, O, NR, ms_row, 1}, gemm_epilogue<T>{}, 0, O, 0, NR);
}
#endif

/// Where V_ξ(c, k), input channel c of the block's tile k, is kept: at ξ·matrix + at(c, k). The forward
/// keeps each V_ξ as the GEMM's packed B (panels of NR tiles, each [C][NR]); the weight gradient as a
/// plain [C][tiles] matrix (one panel).
struct winograd_layout {
    std::int64_t matrix, panel, panel_stride, channel;
    [[nodiscard]] std::int64_t at(std::int64_t c, std::int64_t k) const noexcept {
        return k / panel * panel_stride + c * channel + k % panel;
    }
};

/// One tile row's worth of a block's tiles: tiles (image, ty, tx0 .. tx1) are the block's tiles
/// at .. at + tx1 − tx0.
struct winograd_run {
    std::int64_t image, ty, tx0, tx1, at;
};

/// V_ξ for the tiles of `runs` (the lanes past the last tile are left as they are), element by element:
/// the 4 input rows under a run, zero-padded, turned into the rows of Bᵀ·d
/// (Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1]) along the run at once, then per tile the columns of
/// (Bᵀ·d)·B. `rows` has room for 4 rows of 2·TX + 2.
template <class T>
void winograd_input_runs(const T* x, const std::array<std::int64_t, 4>& xs, const winograd_shape& s,
                         const std::vector<winograd_run>& runs, T* v, const winograd_layout& layout, T* rows) {
    const std::int64_t C = s.in_channels, H = s.h, W = s.w, padded_row = 2 * s.tile_cols() + 2;
    for (std::int64_t c = 0; c < C; ++c)
        for (const winograd_run& run : runs) {
            const std::int64_t x0 = 2 * run.tx0, x1 = 2 * run.tx1 + 2;  // the padded columns the run reads
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                T* row = rows + i * padded_row;
                const std::int64_t y = 2 * run.ty + i - s.pad_h;
                if (y < 0 || y >= H) {
                    std::fill(row + x0, row + x1, T(0));
                    continue;
                }
                const T* in = x + run.image * xs[0] + c * xs[1] + y * xs[2] - s.pad_w * xs[3];  // padded column 0
                const std::int64_t lo = std::clamp(s.pad_w, x0, x1), hi = std::clamp(s.pad_w + W, x0, x1);
                std::fill(row + x0, row + lo, T(0));
                for (std::int64_t p = lo; p < hi; ++p) row[p] = in[p * xs[3]];
                std::fill(row + hi, row + x1, T(0));
            }
            T *r0 = rows, *r1 = rows + padded_row, *r2 = rows + 2 * padded_row, *r3 = rows + 3 * padded_row;
            for (std::int64_t p = x0; p < x1; ++p) {
                const T d0 = r0[p], d1 = r1[p], d2 = r2[p], d3 = r3[p];
                r0[p] = d0 - d2;
                r1[p] = d1 + d2;
                r2[p] = d2 - d1;
                r3[p] = d1 - d3;
            }
            for (std::int64_t tx = run.tx0; tx < run.tx1; ++tx) {
                const std::int64_t k = run.at + tx - run.tx0;
                T* dst = v + layout.at(c, k);
                const std::int64_t vs = layout.matrix;
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) {
                    const T* e = rows + i * padded_row + 2 * tx;
                    dst[(i * 4 + 0) * vs] = e[0] - e[2];
                    dst[(i * 4 + 1) * vs] = e[1] + e[2];
                    dst[(i * 4 + 2) * vs] = e[2] - e[1];
                    dst[(i * 4 + 3) * vs] = e[1] - e[3];
                }
            }
        }
}

#ifndef DL_NO_SIMD
/// winograd_input_runs for float, a vector of tiles at a time, whatever rows and images they sit in
/// (a 13×13 image has runs of 7 tiles, under half a vector): each lane gathers its tile's 4×4 patch,
/// with the taps in padding masked off. first_tap[k]: x's offset of tile k's top-left tap (possibly in
/// padding), top[k] / left[k]: its row and column, for k < npad (see winograd_block: past the last
/// tile, top is far out of range and nothing is read).
inline void winograd_input_vector(const float* x, const std::array<std::int64_t, 4>& xs, const winograd_shape& s,
                                  std::int64_t npad, const std::int32_t* first_tap, const std::int32_t* top,
                                  const std::int32_t* left, float* v, const winograd_layout& layout) {
    using F = simd::batch<float>;
    using I = simd::batch<std::int32_t>;
    constexpr std::int64_t Wd = simd::width<float>;
    const std::int64_t vs = layout.matrix;
    const std::int64_t C = s.in_channels;
    const I rows(std::int32_t(s.h)), cols(std::int32_t(s.w));
    for (std::int64_t k = 0; k < npad; k += Wd) {
        const I base = simd::load(first_tap + k), y = simd::load(top + k), xx = simd::load(left + k);
        I at[4][4];
        xsimd::batch_bool<float> inside[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const I yi = y + I(i), xj = xx + I(j);
                at[i][j] = base + I(std::int32_t(i * xs[2] + j * xs[3]));
                inside[i][j] = simd::mask_cast(yi >= I(0) && yi < rows && xj >= I(0) && xj < cols);
            }
        float* dst = v + layout.at(0, k);
        for (std::int64_t c = 0; c < C; ++c, dst += layout.channel) {
            const float* plane = x + c * xs[1];
            F e[4][4];  // rows of Bᵀ·d
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const F d0 = simd::gather(plane, at[0][j], inside[0][j]), d1 = simd::gather(plane, at[1][j], inside[1][j]);
                const F d2 = simd::gather(plane, at[2][j], inside[2][j]), d3 = simd::gather(plane, at[3][j], inside[3][j]);
                e[0][j] = d0 - d2;
                e[1][j] = d1 + d2;
                e[2][j] = d2 - d1;
                e[3][j] = d1 - d3;
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                simd::store(dst + (i * 4 + 0) * vs, e[i][0] - e[i][2]);
                simd::store(dst + (i * 4 + 1) * vs, e[i][1] + e[i][2]);
                simd::store(dst + (i * 4 + 2) * vs, e[i][2] - e[i][1]);
                simd::store(dst + (i * 4 + 3) * vs, e[i][1] - e[i][3]);
            }
        }
    }
}
#endif

#if DL_WINOGRAD_ROWS
/// Calls f(run, tx, len, k) for the pieces the row transforms work on: each run cut into pieces of at
/// most `longest` tiles (tiles tx .. tx + len − 1, the block's tiles k .. k + len − 1) that do not
/// cross a multiple of `panel` in k.
template <class F>
void for_each_piece(const std::vector<winograd_run>& runs, std::int64_t longest, std::int64_t panel, F&& f) {
    for (const winograd_run& run : runs)
        for (std::int64_t tx = run.tx0; tx < run.tx1;) {
            const std::int64_t k = run.at + tx - run.tx0;
            const std::int64_t len = std::min({longest, run.tx1 - tx, panel - k % panel});
            f(run, tx, len, k);
            tx += len;
        }
}

/// winograd_input_runs for float rows of unit column stride, up to 7 tiles of a run at a time (their 16
/// input columns fill one vector): one masked load per input row (padding reads as zero), the rows
/// of Bᵀ·d on whole vectors, then each column of every tile's (Bᵀ·d)·B picked out by a permute.
/// Gathering each tile's 16 taps instead (winograd_input_vector) cost about 20 cycles per tile and
/// channel here, half of the 32→64 layer's transform time.
inline void winograd_input_rows(const float* x, const std::array<std::int64_t, 4>& xs, const winograd_shape& s,
                                const std::vector<winograd_run>& runs, float* v, const winograd_layout& layout) {
    const std::int64_t vs = layout.matrix;
    // Lane t of column j: the input column 2t + j under the chunk.
    __m512i column[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
        column[j] = _mm512_add_epi32(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_set1_epi32(j));
    struct piece {
        const float* rows[4];  // the input rows under it at its first column (channel 0), null in padding
        std::int64_t at;       // V's offset of its first tile (channel 0)
        __mmask16 inside;      // the lanes whose column is in the image
        __mmask8 tiles;
    };
    thread_local std::vector<piece> pieces;
    pieces.clear();
    // 7 tiles read 16 input columns: one vector.
    for_each_piece(runs, 7, layout.panel, [&](const winograd_run& run, std::int64_t tx, std::int64_t len, std::int64_t k) {
        const std::int64_t first = 2 * tx - s.pad_w;  // the input column under lane 0
        const std::int64_t lo = std::max<std::int64_t>(0, -first), hi = std::min<std::int64_t>(2 * len + 2, s.w - first);
        piece p{{}, layout.at(0, k), hi > lo ? __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1)) : __mmask16(0),
                __mmask8((1u << len) - 1)};
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const std::int64_t y = 2 * run.ty + i - s.pad_h;
            p.rows[i] = y < 0 || y >= s.h ? nullptr : x + run.image * xs[0] + y * xs[2] + first;
        }
        pieces.push_back(p);
    });
    // Channel by channel, so that the loads walk each input plane in order.
    for (std::int64_t c = 0; c < s.in_channels; ++c)
        for (const piece& p : pieces) {
            __m512 d[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i)
                d[i] = p.rows[i] ? _mm512_maskz_loadu_ps(p.inside, p.rows[i] + c * xs[1]) : _mm512_setzero_ps();
            const __m512 e[4] = {_mm512_sub_ps(d[0], d[2]), _mm512_add_ps(d[1], d[2]), _mm512_sub_ps(d[2], d[1]),
                                 _mm512_sub_ps(d[1], d[3])};
            float* dst = v + p.at + c * layout.channel;
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const __m512 c0 = _mm512_permutexvar_ps(column[0], e[i]), c1 = _mm512_permutexvar_ps(column[1], e[i]);
                const __m512 c2 = _mm512_permutexvar_ps(column[2], e[i]), c3 = _mm512_permutexvar_ps(column[3], e[i]);
                _mm256_mask_storeu_ps(dst + (i * 4 + 0) * vs, p.tiles, _mm512_castps512_ps256(_mm512_sub_ps(c0, c2)));
                _mm256_mask_storeu_ps(dst + (i * 4 + 1) * vs, p.tiles, _mm512_castps512_ps256(_mm512_add_ps(c1, c2)));
                _mm256_mask_storeu_ps(dst + (i * 4 + 2) * vs, p.tiles, _mm512_castps512_ps256(_mm512_sub_ps(c2, c1)));
                _mm256_mask_storeu_ps(dst + (i * 4 + 3) * vs, p.tiles, _mm512_castps512_ps256(_mm512_sub_ps(c1, c3)));
            }
        }
}
#endif

/// The tiles t0 .. t1 of the sequence (image, tile row, tile column) as runs, and per tile k < npad
/// what the vector transforms gather from: its top-left input position (top, left; far out of range
/// past the last tile, so that nothing is read) and that position's offset in x, and the offset of
/// its top-left output in a contiguous [N, O, OH, OW] (channel 0).
struct winograd_block {
    std::int64_t t0 = 0, t1 = 0, npad = 0;
    std::vector<winograd_run> runs;
    std::vector<std::int32_t> first_tap, top, left, first_out;

    void cover(const winograd_shape& s, const std::array<std::int64_t, 4>& xs, std::int64_t first, std::int64_t last,
               std::int64_t padded, bool taps) {
        t0 = first, t1 = last, npad = padded;
        const std::int64_t TX = s.tile_cols(), per_image = s.tile_rows() * TX;
        runs.clear();
        for (std::int64_t t = t0; t < t1;) {
            const std::int64_t image = t / per_image, ty = t % per_image / TX, tx0 = t % TX;
            const std::int64_t tx1 = std::min(TX, tx0 + (t1 - t));
            runs.push_back({image, ty, tx0, tx1, t - t0});
            t += tx1 - tx0;
        }
        if (!taps) return;
        constexpr std::int32_t nowhere = std::numeric_limits<std::int32_t>::min() / 2;
        for (auto* v : {&first_tap, &top, &left, &first_out}) v->assign(static_cast<std::size_t>(npad), 0);
        std::fill(top.begin() + (t1 - t0), top.end(), nowhere);
        for (const winograd_run& run : runs)
            for (std::int64_t tx = run.tx0; tx < run.tx1; ++tx) {
                const auto k = static_cast<std::size_t>(run.at + tx - run.tx0);
                const std::int64_t y = 2 * run.ty - s.pad_h, col = 2 * tx - s.pad_w;
                top[k] = std::int32_t(y);
                left[k] = std::int32_t(col);
                first_tap[k] = std::int32_t(run.image * xs[0] + y * xs[2] + col * xs[3]);
                first_out[k] = std::int32_t((run.image * s.out_channels * s.oh() + 2 * run.ty) * s.ow() + 2 * tx);
            }
    }
};

/// Whether the vector transforms can address x [N, C, H, W] (strides xs) and the [N, O, OH, OW] output
/// with int32 gather offsets.
[[nodiscard]] inline bool winograd_gathers(const winograd_shape& s, const std::array<std::int64_t, 4>& xs) {
    const std::int64_t reach = (s.images - 1) * xs[0] + (s.in_channels - 1) * xs[1] + (s.h - 1) * xs[2] + (s.w - 1) * xs[3];
    const std::int64_t limit = (std::int64_t{1} << 31) - 8 * (xs[2] + xs[3] + s.ow());
    return reach < limit && s.images * s.out_channels * s.oh() * s.ow() < limit;
}

/// V_ξ for a block's tiles: by gathers where the target has them for T, else element by element.
template <class T>
void winograd_input(const T* x, const std::array<std::int64_t, 4>& xs, const winograd_shape& s, const winograd_block& b,
                    bool gathers, T* v, const winograd_layout& layout, T* work) {
#if DL_WINOGRAD_ROWS
    if constexpr (std::is_same_v<T, float>)
        if (xs[3] == 1) return winograd_input_rows(x, xs, s, b.runs, v, layout);
#endif
#ifndef DL_NO_SIMD
    if constexpr (std::is_same_v<T, float>)
        if (gathers)
            return winograd_input_vector(x, xs, s, b.npad, b.first_tap.data(), b.top.data(), b.left.data(), v, layout);
#endif
    (void)gathers;
    winograd_input_runs(x, xs, s, b.runs, v, layout, work);
}

#if DL_WINOGRAD_ROWS
/// The output transform of winograd_conv3x3 for float, written straight into out: up to 8 tiles of a
/// run at a time, Aᵀ·M·A (Aᵀ = [1 1 1 0; 0 1 −1 −1]) on their lanes of M, bias and activation, then
/// each output row's left and right columns interleaved by one permute and stored with one masked
/// store (clipped at odd edges). Going through a buffer of the block's outputs instead read vectors
/// that straddled stores still in flight. Returns whether every output before the activation is
/// finite (see winograd_conv3x3). `pool`: out takes the 2×2 max pool of the outputs instead, one value
/// per whole tile, stored as it is (a tile's lane is its pooled column).
inline bool winograd_output_rows(const float* m, std::int64_t ms, std::int64_t npad, const std::vector<winograd_run>& runs,
                                 const winograd_shape& s, const float* bias, activation act, bool pool, float* out) {
    // 8 lanes, one per tile: half-width vectors run at twice the rate of full ones on cores that
    // split 512-bit operations in two, and a piece has at most 8 tiles.
    using H = xsimd::batch<float, xsimd::avx2>;
    using F = xsimd::batch<float>;
    const std::int64_t O = s.out_channels, OH = s.oh(), OW = s.ow(), PH = OH / 2, PW = OW / 2;
    struct piece {
        std::int64_t out, at;  // out's offset of its first output (channel 0), M's of its first tile
        __mmask8 tiles;        // its lanes
        __mmask16 columns;     // the interleaved outputs inside the image; pooling: the whole tiles' lanes
        bool second;           // an odd height clips the last tile row
    };
    thread_local std::vector<piece> pieces;
    pieces.clear();
    for_each_piece(runs, 8, npad, [&](const winograd_run& run, std::int64_t tx, std::int64_t len, std::int64_t k) {
        const __mmask8 tiles((1u << len) - 1);
        if (!pool)
            pieces.push_back({(run.image * O * OH + 2 * run.ty) * OW + 2 * tx, k, tiles,
                              __mmask16((1u << std::min<std::int64_t>(2 * len, OW - 2 * tx)) - 1), 2 * run.ty + 1 < OH});
        else if (run.ty < PH && tx < PW)  // the floor of an odd size drops the clipped tiles
            pieces.push_back({(run.image * O * PH + run.ty) * PW + tx, k, tiles,
                              __mmask16((1u << std::min(len, PW - tx)) - 1), true});
    });
    const std::int64_t plane = pool ? PH * PW : OH * OW;
    const __m512i zip = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    H poison(0.0f);  // sums y − y: 0 while the outputs are finite, NaN after an Inf or a NaN
    with_activation(act, [&](auto a) {
        for (std::int64_t o = 0; o < O; ++o) {
            const H b(bias ? bias[o] : 0.0f);
            for (const piece& p : pieces) {
                const float* src = m + o * npad + p.at;
                H q[4][2];  // rows of M·A
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) {
                    const float* row = src + i * 4 * ms;
                    const H m0 = _mm256_maskz_loadu_ps(p.tiles, row), m1 = _mm256_maskz_loadu_ps(p.tiles, row + ms);
                    const H m2 = _mm256_maskz_loadu_ps(p.tiles, row + 2 * ms), m3 = _mm256_maskz_loadu_ps(p.tiles, row + 3 * ms);
                    q[i][0] = m0 + m1 + m2;
                    q[i][1] = m1 - m2 - m3;
                }
                H y[2][2];  // [output row][output column]
#pragma GCC unroll 2
                for (int j = 0; j < 2; ++j) {
                    y[0][j] = q[0][j] + q[1][j] + q[2][j] + b;
                    y[1][j] = q[1][j] - q[2][j] - q[3][j] + b;
                    poison += (y[0][j] - y[0][j]) + (y[1][j] - y[1][j]);
                }
                float* dst = out + o * plane + p.out;
                // The activations are written for full vectors: the columns widened, the upper half zero.
                auto activated = [&](const H& v) { return activate<a.value>(F(_mm512_zextps256_ps512(v))); };
                if (pool) {
                    const F best = window_max(activated(y[0][0]), activated(y[0][1]), activated(y[1][0]), activated(y[1][1]));
                    _mm256_mask_storeu_ps(dst, static_cast<__mmask8>(p.columns), _mm512_castps512_ps256(best));
                    continue;
                }
                for (int r = 0; r < (p.second ? 2 : 1); ++r)
                    _mm512_mask_storeu_ps(dst + r * OW, p.columns, _mm512_permutex2var_ps(activated(y[r][0]), zip, activated(y[r][1])));
            }
        }
    });
    return xsimd::hadd(poison) == 0.0f;
}
#endif

/// out = act(conv(x, w) + bias) with u = winograd_weights(w). x is read through its strides (element
/// (n, c, y, x) at x[n·xs[0] + c·xs[1] + y·xs[2] + x·xs[3]], strides ≥ 0); out is contiguous
/// [N, O, OH, OW]. Returns false when an output before the activation is not finite: the transforms
/// spread a NaN or Inf of x or w over the whole 2×2 tile (and Inf − Inf makes NaN), so such outputs do
/// not say which windows held it; the caller then computes the convolution by its definition.
/// `pool`: out is [N, O, OH / 2, OW / 2] instead, the 2×2 stride-2 max pool of those outputs, each
/// window one tile, taken from registers (max_pool2d's maxima and ties, see beats).
template <class T>
[[nodiscard]] bool winograd_conv3x3(const T* x, std::array<std::int64_t, 4> xs, const winograd_shape& s,
                                    const std::vector<T>& u, T* out, const T* bias, activation act, Context& ctx,
                                    bool pool = false) {
    const std::int64_t C = s.in_channels, O = s.out_channels, OH = s.oh(), OW = s.ow(), PH = OH / 2, PW = OW / 2;
    const std::int64_t TX = s.tile_cols(), tiles = s.images * s.tile_rows() * TX;
    if (tiles == 0 || O == 0) return true;
    const op_scope scope(ctx, "conv2d_winograd", 2.0 * 16 * double(O) * double(C) * double(tiles),
                               double(sizeof(T)) * double(s.images) * double(C * s.h * s.w + O * OH * OW));
    const std::vector<T> packed_u = winograd_pack_weights(u, O, C);
    constexpr std::int64_t NR = winograd_panel<T>;
    // A block's transformed inputs and products, 16·(C + O)·tile_block values, about 2^15 (128 KB of
    // floats), stay in L2. (On the 32→64 layer of bench_gemm, 2^14 to 2^17 measured the same.)
    const std::int64_t tile_block =
        std::clamp<std::int64_t>((std::int64_t{1} << 15) / (16 * (C + O)) / NR * NR, NR, 16 * NR);
    const std::int64_t blocks = (tiles + tile_block - 1) / tile_block;
    const bool gathers = winograd_gathers(s, xs);
    std::vector<char> block_finite(static_cast<std::size_t>(blocks));
    ctx.parallel_for(blocks, [&](std::int64_t block) {
        const std::int64_t t0 = block * tile_block, t1 = std::min(tiles, t0 + tile_block), n = t1 - t0;
        const std::int64_t panels = (n + NR - 1) / NR, npad = panels * NR;
        thread_local winograd_block tiles_here;
        tiles_here.cover(s, xs, t0, t1, npad, gathers);
        const std::vector<winograd_run>& runs = tiles_here.runs;
        // The 16 matrices of V and of M are `vs` and `ms` apart: a power-of-two distance would put the
        // 16 values of one tile in one L1 cache set.
        const std::int64_t vs = C * npad + 16, ms = O * npad + 16;
        thread_local std::vector<T> scratch;
        scratch.resize(std::size_t(16 * (vs + ms) + std::max(4 * (2 * TX + 2), 4 * npad + 8)));
        T* v = scratch.data();   // V [16][panels][C][NR]
        T* m = v + 16 * vs;      // M [16][O][npad]
        T* work = m + 16 * ms;   // the input rows of a run, or the output tiles of a channel
        winograd_input(x, xs, s, tiles_here, gathers, v, {vs, NR, C * NR, NR}, work);

        winograd_products(packed_u.data(), v, vs, m, ms, npad, O, C, panels);

#if DL_WINOGRAD_ROWS
        if constexpr (std::is_same_v<T, float>) {
            block_finite[std::size_t(block)] = winograd_output_rows(m, ms, npad, runs, s, bias, act, pool, out);
            return;
        }
#endif
        // Output transform, per output channel: Aᵀ·M·A with Aᵀ = [1 1 1 0; 0 1 −1 −1] gives each tile's
        // 2×2 outputs, computed along the whole block (M's rows are contiguous in the tile) into
        // work[(r·2 + j)·npad + tile], then spread over the output run by run (clipped at odd edges).
        // `poison` sums y − y over the outputs: 0 while they are finite, NaN after an Inf or a NaN.
        T* ys = work;
        std::conditional_t<simd::has_batch<T>, xsimd::batch<T>, T> poison_lanes(T(0));
        T poison(0);
        with_activation(act, [&](auto a) {
            for (std::int64_t o = 0; o < O; ++o) {
                const T* src = m + o * npad;
                const T b = bias ? bias[o] : T(0);
                simd::for_each_block<T>(n, [&]<class V>(std::int64_t k) {
                    V q[4][2];  // rows of M·A
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i) {
                        const T* row = src + i * 4 * ms + k;
                        const V m0 = simd::load_as<V>(row), m1 = simd::load_as<V>(row + ms);
                        const V m2 = simd::load_as<V>(row + 2 * ms), m3 = simd::load_as<V>(row + 3 * ms);
                        q[i][0] = m0 + m1 + m2;
                        q[i][1] = m1 - m2 - m3;
                    }
                    V seen(T(0));
#pragma GCC unroll 2
                    for (int j = 0; j < 2; ++j) {
                        const V top = q[0][j] + q[1][j] + q[2][j] + V(b), bottom = q[1][j] - q[2][j] - q[3][j] + V(b);
                        seen += (top - top) + (bottom - bottom);
                        simd::store_as(ys + j * npad + k, activate<a.value>(top));
                        simd::store_as(ys + (2 + j) * npad + k, activate<a.value>(bottom));
                    }
                    if constexpr (simd::is_batch<V>) poison_lanes += seen;
                    else poison += seen;
                });
                for (const winograd_run& run : runs) {
                    if (pool) {  // the floor of an odd size drops the clipped tiles
                        if (run.ty >= PH) continue;
                        T* dst = out + ((run.image * O + o) * PH + run.ty) * PW;
                        const T* tile = ys + run.at - run.tx0;
                        for (std::int64_t tx = run.tx0; tx < std::min(run.tx1, PW); ++tx)
                            dst[tx] = window_max(tile[tx], tile[npad + tx], tile[2 * npad + tx], tile[3 * npad + tx]);
                        continue;
                    }
                    const std::int64_t last = std::min(OW, 2 * run.tx1);  // an odd width drops the last column
                    for (int r = 0; r < 2 && 2 * run.ty + r < OH; ++r) {
                        T* dst = out + ((run.image * O + o) * OH + 2 * run.ty + r) * OW;
                        const T* left = ys + 2 * r * npad + run.at - run.tx0;
                        const T* right = left + npad;
                        std::int64_t tx = run.tx0;
                        for (; 2 * tx + 1 < last; ++tx) {
                            dst[2 * tx] = left[tx];
                            dst[2 * tx + 1] = right[tx];
                        }
                        if (2 * tx < last) dst[2 * tx] = left[tx];
                    }
                }
            }
        });
        if constexpr (simd::has_batch<T>) poison += xsimd::hadd(poison_lanes);
        block_finite[std::size_t(block)] = poison == T(0);
    });
    return std::all_of(block_finite.begin(), block_finite.end(), [](char finite) { return finite != 0; });
}

/// dM_ξ [O][npad] (ξ `ms` apart) = A·gy·Aᵀ per output channel and tile of a block, A = (Aᵀ)ᵀ with
/// Aᵀ = [1 1 1 0; 0 1 −1 −1], from the output gradient gy (contiguous [N, O, OH, OW]); zero past the
/// block's tiles and for outputs past an odd edge.
template <class T>
void winograd_output_gradient(const T* gy, const winograd_shape& s, const winograd_block& b, bool gathers, T* dm,
                              std::int64_t ms) {
    const std::int64_t O = s.out_channels, OH = s.oh(), OW = s.ow(), n = b.t1 - b.t0, npad = b.npad;
    auto transform = [&]<class V>(const V (&g)[2][2], T* dst) {  // dst: dM_0's element; ξ `ms` apart
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const V h0 = i == 0 ? g[0][0] : i == 1 ? g[0][0] + g[1][0] : i == 2 ? g[0][0] - g[1][0] : V(T(0)) - g[1][0];
            const V h1 = i == 0 ? g[0][1] : i == 1 ? g[0][1] + g[1][1] : i == 2 ? g[0][1] - g[1][1] : V(T(0)) - g[1][1];
            simd::store_as(dst + (i * 4 + 0) * ms, h0);
            simd::store_as(dst + (i * 4 + 1) * ms, h0 + h1);
            simd::store_as(dst + (i * 4 + 2) * ms, h0 - h1);
            simd::store_as(dst + (i * 4 + 3) * ms, V(T(0)) - h1);
        }
    };
#if DL_WINOGRAD_ROWS
    // Up to 8 tiles of a run at a time (their 16 output columns fill a vector): one masked load per
    // gradient row, each tile's left and right columns picked out by a permute (as winograd_input_rows).
    if constexpr (std::is_same_v<T, float>) {
        const __m512i left = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
        const __m512i right = _mm512_add_epi32(left, _mm512_set1_epi32(1));
        for (std::int64_t o = 0; o < O; ++o)
            for (int xi = 0; xi < 16; ++xi) std::fill(dm + xi * ms + o * npad + n, dm + xi * ms + (o + 1) * npad, T(0));
        struct piece {
            std::int64_t row, at;  // gy's offset of its first output (channel 0), dM's of its first tile
            __mmask16 columns;     // the lanes inside the image
            __mmask8 tiles;
            bool second;           // an odd height clips the last tile row
        };
        thread_local std::vector<piece> pieces;
        pieces.clear();
        for_each_piece(b.runs, 8, npad, [&](const winograd_run& run, std::int64_t tx, std::int64_t len, std::int64_t k) {
            pieces.push_back({(run.image * O * OH + 2 * run.ty) * OW + 2 * tx, k,
                              __mmask16((1u << std::min<std::int64_t>(2 * len, OW - 2 * tx)) - 1), __mmask8((1u << len) - 1),
                              2 * run.ty + 1 < OH});
        });
        // Channel by channel, so that the loads walk each gradient plane in order.
        for (std::int64_t o = 0; o < O; ++o)
            for (const piece& p : pieces) {
                const float* row = gy + p.row + o * OH * OW;
                const __m512 r0 = _mm512_maskz_loadu_ps(p.columns, row);
                const __m512 r1 = p.second ? _mm512_maskz_loadu_ps(p.columns, row + OW) : _mm512_setzero_ps();
                const __m512 g00 = _mm512_permutexvar_ps(left, r0), g01 = _mm512_permutexvar_ps(right, r0);
                const __m512 g10 = _mm512_permutexvar_ps(left, r1), g11 = _mm512_permutexvar_ps(right, r1);
                const __m512 zero = _mm512_setzero_ps();
                const __m512 h[4][2] = {{g00, g01},
                                        {_mm512_add_ps(g00, g10), _mm512_add_ps(g01, g11)},
                                        {_mm512_sub_ps(g00, g10), _mm512_sub_ps(g01, g11)},
                                        {_mm512_sub_ps(zero, g10), _mm512_sub_ps(zero, g11)}};
                float* dst = dm + o * npad + p.at;
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) {
                    const __m512 h0 = h[i][0], h1 = h[i][1];
                    _mm256_mask_storeu_ps(dst + (i * 4 + 0) * ms, p.tiles, _mm512_castps512_ps256(h0));
                    _mm256_mask_storeu_ps(dst + (i * 4 + 1) * ms, p.tiles, _mm512_castps512_ps256(_mm512_add_ps(h0, h1)));
                    _mm256_mask_storeu_ps(dst + (i * 4 + 2) * ms, p.tiles, _mm512_castps512_ps256(_mm512_sub_ps(h0, h1)));
                    _mm256_mask_storeu_ps(dst + (i * 4 + 3) * ms, p.tiles, _mm512_castps512_ps256(_mm512_sub_ps(zero, h1)));
                }
            }
        return;
    }
#endif
#ifndef DL_NO_SIMD
    if constexpr (std::is_same_v<T, float>)
        if (gathers) {
            using F = simd::batch<float>;
            using I = simd::batch<std::int32_t>;
            const I rows = I(std::int32_t(OH)), cols = I(std::int32_t(OW));
            for (std::int64_t k = 0; k < npad; k += simd::width<float>) {
                const I base = simd::load(b.first_out.data() + k);
                const I y = simd::load(b.top.data() + k) + I(std::int32_t(s.pad_h));
                const I x = simd::load(b.left.data() + k) + I(std::int32_t(s.pad_w));
                I at[2][2];
                xsimd::batch_bool<float> inside[2][2];
#pragma GCC unroll 2
                for (int a = 0; a < 2; ++a)
#pragma GCC unroll 2
                    for (int c = 0; c < 2; ++c) {
                        at[a][c] = base + I(std::int32_t(a * OW + c));
                        inside[a][c] = simd::mask_cast(y + I(a) >= I(0) && y + I(a) < rows && x + I(c) < cols);
                    }
                for (std::int64_t o = 0; o < O; ++o) {
                    const float* plane = gy + o * OH * OW;
                    F g[2][2];
#pragma GCC unroll 2
                    for (int a = 0; a < 2; ++a)
#pragma GCC unroll 2
                        for (int c = 0; c < 2; ++c) g[a][c] = simd::gather(plane, at[a][c], inside[a][c]);
                    transform(g, dm + o * npad + k);
                }
            }
            return;
        }
#endif
    (void)gathers;
    for (std::int64_t o = 0; o < O; ++o) {
        for (int xi = 0; xi < 16; ++xi) std::fill(dm + xi * ms + o * npad + n, dm + xi * ms + (o + 1) * npad, T(0));
        for (const winograd_run& run : b.runs)
            for (std::int64_t tx = run.tx0; tx < run.tx1; ++tx) {
                T g[2][2];
#pragma GCC unroll 2
                for (int a = 0; a < 2; ++a)
#pragma GCC unroll 2
                    for (int c = 0; c < 2; ++c) {
                        const std::int64_t y = 2 * run.ty + a, x = 2 * tx + c;
                        g[a][c] = y < OH && x < OW ? gy[((run.image * O + o) * OH + y) * OW + x] : T(0);
                    }
                transform(g, dm + o * npad + run.at + tx - run.tx0);
            }
    }
}

/// dw [O][C][3][3] = the gradient of the weights of winograd_conv3x3(x, ·) for the output gradient gy
/// (contiguous [N, O, OH, OW]). With V_ξ per (input channel, tile) as in the forward and
/// dM_ξ = A·gy·Aᵀ per (output channel, tile), dU_ξ [O, C] = Σ_tiles dM_ξ·V_ξᵀ: one GEMM per ξ whose k
/// dimension is the tiles (long, unlike the forward's channels); then dw = Gᵀ·dU·G per channel pair.
/// Returns false when a gradient is not finite (see winograd_conv3x3).
template <class T>
[[nodiscard]] bool winograd_weight_gradient(const T* x, std::array<std::int64_t, 4> xs, const winograd_shape& s,
                                            const T* gy, T* dw, Context& ctx) {
    const std::int64_t C = s.in_channels, O = s.out_channels, TX = s.tile_cols(), tiles = s.images * s.tile_rows() * TX;
    std::fill(dw, dw + O * C * 9, T(0));
    if (tiles == 0 || O == 0 || C == 0) return true;
    const op_scope scope(ctx, "conv2d_winograd", 2.0 * 16 * double(O) * double(C) * double(tiles),
                               double(sizeof(T)) * double(s.images) * double(C * s.h * s.w + O * s.oh() * s.ow()));
    constexpr std::int64_t NR = 32;
    // Blocks of about 2^18 values (V and dM): longer products than the forward's blocks (2^17 to 2^19
    // measured the same on the 32→64 layer of bench_gemm).
    const std::int64_t tile_block =
        std::clamp<std::int64_t>((std::int64_t{1} << 18) / (16 * (C + O)) / NR * NR, NR, 32 * NR);
    const std::int64_t blocks = (tiles + tile_block - 1) / tile_block;
    // A fixed number of partial sums, added in order: the result does not depend on the thread count.
    const std::int64_t chunks = std::min<std::int64_t>(blocks, 8);
    std::vector<T> partial(static_cast<std::size_t>(chunks * 16 * O * C));
    const bool gathers = winograd_gathers(s, xs);
    ctx.parallel_for(chunks, [&](std::int64_t chunk) {
        const serial_scope serial;  // the chunks are the parallelism
        T* du = partial.data() + chunk * 16 * O * C;
        for (std::int64_t block = chunk * blocks / chunks; block < (chunk + 1) * blocks / chunks; ++block) {
            const std::int64_t t0 = block * tile_block, t1 = std::min(tiles, t0 + tile_block);
            const std::int64_t npad = (t1 - t0 + NR - 1) / NR * NR, vs = C * npad + 16, ms = O * npad + 16;
            thread_local winograd_block tiles_here;
            tiles_here.cover(s, xs, t0, t1, npad, gathers);
            thread_local std::vector<T> scratch;
            scratch.resize(std::size_t(16 * (vs + ms) + 4 * (2 * TX + 2)));
            T* v = scratch.data();  // V [16][C][npad]
            T* dm = v + 16 * vs;    // dM [16][O][npad]
            winograd_input(x, xs, s, tiles_here, gathers, v, {vs, npad, 0, npad}, dm + 16 * ms);
            // The lanes past the tiles take part in the sums (and only the gathers write them).
            for (std::int64_t i = 0; i < 16 * C; ++i)
                std::fill(v + i / C * vs + i % C * npad + (t1 - t0), v + i / C * vs + (i % C + 1) * npad, T(0));
            winograd_output_gradient(gy, s, tiles_here, gathers, dm, ms);
            const bool first = block == chunk * blocks / chunks;
            for (int xi = 0; xi < 16; ++xi)
                gemm(matrix_ref<const T>{dm + xi * ms, O, npad, npad, 1}, matrix_ref<const T>{v + xi * vs, npad, C, 1, npad},
                     matrix_ref<T>{du + xi * O * C, O, C, C, 1}, gemm_epilogue<T>{.beta = first ? T(0) : T(1)}, ctx);
        }
    });
    for (std::int64_t chunk = 1; chunk < chunks; ++chunk)
        for (std::int64_t e = 0; e < 16 * O * C; ++e) partial[std::size_t(e)] += partial[std::size_t(chunk * 16 * O * C + e)];
    // dw = Gᵀ·dU·G with G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]: the columns of Gᵀ·X combine X's rows as
    // (X0 + ½X1 + ½X2, ½X1 − ½X2, ½X1 + ½X2 + X3).
    T poison(0);
    for (std::int64_t o = 0; o < O; ++o)
        for (std::int64_t c = 0; c < C; ++c) {
            T du[4][4], r[3][4];
            for (int xi = 0; xi < 16; ++xi) du[xi / 4][xi % 4] = partial[std::size_t((xi * O + o) * C + c)];
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                r[0][j] = du[0][j] + T(0.5) * (du[1][j] + du[2][j]);
                r[1][j] = T(0.5) * (du[1][j] - du[2][j]);
                r[2][j] = T(0.5) * (du[1][j] + du[2][j]) + du[3][j];
            }
            T* k = dw + (o * C + c) * 9;
#pragma GCC unroll 3
            for (int a = 0; a < 3; ++a) {
                k[a * 3 + 0] = r[a][0] + T(0.5) * (r[a][1] + r[a][2]);
                k[a * 3 + 1] = T(0.5) * (r[a][1] - r[a][2]);
                k[a * 3 + 2] = T(0.5) * (r[a][1] + r[a][2]) + r[a][3];
#pragma GCC unroll 3
                for (int q = 0; q < 3; ++q) poison += k[a * 3 + q] - k[a * 3 + q];
            }
        }
    return poison == T(0);
}

}  // namespace dl::detail
