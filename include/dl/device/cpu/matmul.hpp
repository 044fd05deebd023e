#pragma once
// Matrix multiply C = A·B (+ C), cache-blocked and register-blocked with xsimd, for any strides.
// Two micro-kernels cover the layouts a Linear layer meets in forward and backward without copies:
//  - rows:  B's rows are contiguous. A block of MR rows of C times NR columns stays in registers while
//           k runs; each step broadcasts MR elements of A and loads NR elements of B.
//  - dots:  A's rows and B's columns are contiguous (B = Wᵀ for a weight W stored [out, in]). Each C
//           element is a dot product; 2×4 of them run together, reduced horizontally at the end.
// Other layouts copy B to contiguous rows first. This is the interim kernel: the CPU GEMM issue
// replaces it with packed BLIS-style panels.
#include <algorithm>
#include <cstdint>

#include "../../core/tensor.hpp"
#include "../../expr/simd.hpp"
#include "../../prof/profiler.hpp"

namespace dl::detail {

/// A strided matrix view: element (i, j) is data[i * row_stride + j * col_stride].
template <class T>
struct matrix_ref {
    T* data;
    std::int64_t rows, cols, row_stride, col_stride;
    DL_INLINE T& operator()(std::int64_t i, std::int64_t j) const noexcept {
        return data[i * row_stride + j * col_stride];
    }
};

inline constexpr std::int64_t gemm_k_block = 256;

#ifndef DL_NO_SIMD
// C[i0 .. i0+MR, j0 .. j0+2W) (+)= A[i0.., k0..k1) · B[k0..k1, j0..), B rows contiguous, C rows contiguous.
template <int MR, class T>
DL_INLINE void rows_tile(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                         std::int64_t i0, std::int64_t j0, std::int64_t k0, std::int64_t k1, bool load_c) {
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>;
    B acc0[MR], acc1[MR];
    for (int r = 0; r < MR; ++r) {
        acc0[r] = load_c ? simd::load(&c(i0 + r, j0)) : B(T(0));
        acc1[r] = load_c ? simd::load(&c(i0 + r, j0 + W)) : B(T(0));
    }
    const T* bp = &b(k0, j0);
    for (std::int64_t k = k0; k < k1; ++k, bp += b.row_stride) {
        const B b0 = simd::load(bp), b1 = simd::load(bp + W);
        for (int r = 0; r < MR; ++r) {
            const B ar(a(i0 + r, k));
            acc0[r] = simd::fma(ar, b0, acc0[r]);
            acc1[r] = simd::fma(ar, b1, acc1[r]);
        }
    }
    for (int r = 0; r < MR; ++r) {
        simd::store(&c(i0 + r, j0), acc0[r]);
        simd::store(&c(i0 + r, j0 + W), acc1[r]);
    }
}

template <class T>
void gemm_rows(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, bool accumulate,
               std::int64_t j_begin, std::int64_t j_end) {
    constexpr int NR = 2 * simd::width<T>, MR = 6;
    const std::int64_t M = c.rows, K = a.cols;
    const std::int64_t j_vec = j_begin + (j_end - j_begin) / NR * NR;
    for (std::int64_t k0 = 0; k0 < K; k0 += gemm_k_block) {
        const std::int64_t k1 = std::min(K, k0 + gemm_k_block);
        const bool load_c = accumulate || k0 > 0;
        for (std::int64_t j = j_begin; j < j_vec; j += NR) {
            std::int64_t i = 0;
            for (; i + MR <= M; i += MR) rows_tile<MR>(a, b, c, i, j, k0, k1, load_c);
            switch (M - i) {
                case 5: rows_tile<5>(a, b, c, i, j, k0, k1, load_c); break;
                case 4: rows_tile<4>(a, b, c, i, j, k0, k1, load_c); break;
                case 3: rows_tile<3>(a, b, c, i, j, k0, k1, load_c); break;
                case 2: rows_tile<2>(a, b, c, i, j, k0, k1, load_c); break;
                case 1: rows_tile<1>(a, b, c, i, j, k0, k1, load_c); break;
                default: break;
            }
        }
        for (std::int64_t i = 0; i < M; ++i)  // column tail
            for (std::int64_t j = j_vec; j < j_end; ++j) {
                T s = load_c ? c(i, j) : T(0);
                for (std::int64_t k = k0; k < k1; ++k) s += a(i, k) * b(k, j);
                c(i, j) = s;
            }
    }
}

// 2 rows of A against 4 columns of B (rows of Bᵀ), dot products over contiguous k.
template <int MR, int NC, class T>
DL_INLINE void dots_tile(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c,
                         std::int64_t i0, std::int64_t j0, bool accumulate) {
    using B = simd::batch<T>;
    constexpr int W = simd::width<T>;
    const std::int64_t K = a.cols, k_vec = K / W * W;
    B acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int n = 0; n < NC; ++n) acc[r][n] = B(T(0));
    for (std::int64_t k = 0; k < k_vec; k += W) {
        B bv[NC];
        for (int n = 0; n < NC; ++n) bv[n] = simd::load(&b(k, j0 + n));
        for (int r = 0; r < MR; ++r) {
            const B av = simd::load(&a(i0 + r, k));
            for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma(av, bv[n], acc[r][n]);
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int n = 0; n < NC; ++n) {
            T s = xsimd::hadd(acc[r][n]);
            for (std::int64_t k = k_vec; k < K; ++k) s += a(i0 + r, k) * b(k, j0 + n);
            T& out = c(i0 + r, j0 + n);
            out = accumulate ? out + s : s;
        }
}

template <class T>
void gemm_dots(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, bool accumulate,
               std::int64_t j_begin, std::int64_t j_end) {
    const std::int64_t M = c.rows;
    std::int64_t j = j_begin;
    for (; j + 4 <= j_end; j += 4) {
        std::int64_t i = 0;
        for (; i + 2 <= M; i += 2) dots_tile<2, 4>(a, b, c, i, j, accumulate);
        if (i < M) dots_tile<1, 4>(a, b, c, i, j, accumulate);
    }
    for (; j < j_end; ++j)
        for (std::int64_t i = 0; i < M; ++i) dots_tile<1, 1>(a, b, c, i, j, accumulate);
}
#endif

template <class T>
void gemm_scalar(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, bool accumulate,
                 std::int64_t j_begin, std::int64_t j_end) {
    using Acc = compute_t<T>;
    for (std::int64_t i = 0; i < c.rows; ++i)
        for (std::int64_t j = j_begin; j < j_end; ++j) {
            Acc s = accumulate ? static_cast<Acc>(c(i, j)) : Acc(0);
            for (std::int64_t k = 0; k < a.cols; ++k) s += static_cast<Acc>(a(i, k)) * static_cast<Acc>(b(k, j));
            c(i, j) = static_cast<T>(s);
        }
}

/// C = A·B, or C += A·B when `accumulate`. C must not overlap A or B. Runs on ctx's threads when large,
/// split over columns of C, so every element is computed the same way whatever the thread count.
template <class T>
void gemm(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<T>& c, bool accumulate,
          Context& ctx) {
    const prof::op_scope scope(ctx, "matmul", 2.0 * double(c.rows) * double(c.cols) * double(a.cols),
                               double(sizeof(T)) * double(a.rows * a.cols + b.rows * b.cols + c.rows * c.cols));
    if (c.rows == 0 || c.cols == 0) return;
    if (a.cols == 0) {
        if (!accumulate)
            for (std::int64_t i = 0; i < c.rows; ++i)
                for (std::int64_t j = 0; j < c.cols; ++j) c(i, j) = T(0);
        return;
    }
    auto run = [&](auto kernel, std::int64_t align, const matrix_ref<const T>& rhs) {
        const std::int64_t work = c.rows * c.cols * a.cols;
        const int threads = ctx.concurrency();
        const std::int64_t parts = threads > 1 && work >= (std::int64_t{1} << 18)
                                       ? std::min<std::int64_t>(threads, (c.cols + align - 1) / align)
                                       : 1;
        if (parts <= 1) return kernel(a, rhs, c, accumulate, 0, c.cols);
        const std::int64_t per = ((c.cols + parts - 1) / parts + align - 1) / align * align;
        ctx.parallel_for(parts, [&](std::int64_t p) {
            const std::int64_t begin = std::min(c.cols, p * per), end = std::min(c.cols, begin + per);
            if (begin < end) kernel(a, rhs, c, accumulate, begin, end);
        });
    };
#ifndef DL_NO_SIMD
    if constexpr (simd::has_batch<T>) {
        constexpr int W = simd::width<T>;
        if (b.col_stride == 1 && c.col_stride == 1)
            return run([](auto&&... x) { gemm_rows<T>(x...); }, 2 * W, b);
        if (a.col_stride == 1 && b.row_stride == 1)
            return run([](auto&&... x) { gemm_dots<T>(x...); }, 4, b);
        // Copy B to contiguous rows (and compute into a contiguous C when C's rows are strided).
        Tensor<T> packed({b.rows, b.cols}, ctx);
        const matrix_ref<T> p{packed.data(), b.rows, b.cols, b.cols, 1};
        for (std::int64_t k = 0; k < b.rows; ++k)
            for (std::int64_t j = 0; j < b.cols; ++j) p(k, j) = b(k, j);
        const matrix_ref<const T> pb{packed.data(), b.rows, b.cols, b.cols, 1};
        if (c.col_stride == 1) return run([](auto&&... x) { gemm_rows<T>(x...); }, 2 * W, pb);
        Tensor<T> out({c.rows, c.cols}, ctx);
        const matrix_ref<T> oc{out.data(), c.rows, c.cols, c.cols, 1};
        gemm(a, pb, oc, false, ctx);
        for (std::int64_t i = 0; i < c.rows; ++i)
            for (std::int64_t j = 0; j < c.cols; ++j) c(i, j) = accumulate ? c(i, j) + oc(i, j) : oc(i, j);
        return;
    }
#endif
    run([](auto&&... x) { gemm_scalar<T>(x...); }, 1, b);
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

}  // namespace dl::detail
