// The CPU GEMM (device/cpu/gemm.hpp) against a double-precision reference: shapes from 1 to past one
// cache block (primes included, so every tile edge and remainder kernel runs), the four transpose
// combinations, strided views, alpha/beta, every epilogue, batched products, and thread-count
// independence.
#include "support.hpp"

#include <cmath>
#include <limits>
#include <random>

namespace {

using dl::Context;
using dl::Tensor;
using dl::detail::gemm_epilogue;
using dl::detail::matrix_ref;

/// A [rows, cols] matrix whose element (i, j) is at data[i * rs + j * cs], filled from `seed`, inside a
/// larger buffer so that row and column strides can both differ from 1 and from the width.
template <class T>
struct strided_matrix {
    std::vector<T> storage;
    matrix_ref<T> m;
    strided_matrix(std::int64_t rows, std::int64_t cols, int layout, std::uint32_t seed) {
        // layout 0: row-major; 1: column-major (a transposed view); 2: row-major with padded rows and every
        // other column (neither stride is 1).
        std::int64_t rs = cols, cs = 1;
        if (layout == 1) rs = 1, cs = rows;
        if (layout == 2) cs = 2, rs = 2 * cols + 3;
        storage.assign(std::size_t(std::max<std::int64_t>(1, rows * rs + cols * cs + 8)), T(0));
        m = {storage.data(), rows, cols, rs, cs};
        std::mt19937 rng(seed);
        std::uniform_real_distribution<double> u(-1, 1);
        for (std::int64_t i = 0; i < rows; ++i)
            for (std::int64_t j = 0; j < cols; ++j) m(i, j) = T(u(rng));
    }
    [[nodiscard]] matrix_ref<const T> in() const { return {m.data, m.rows, m.cols, m.row_stride, m.col_stride}; }
};

double apply_activation(double x, dl::activation act) {
    switch (act) {
        case dl::activation::relu: return x > 0 ? x : 0;
        case dl::activation::gelu: return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        case dl::activation::sigmoid: return 1 / (1 + std::exp(-x));
        case dl::activation::tanh: return std::tanh(x);
        case dl::activation::none: break;
    }
    return x;
}

/// Checks c == act(alpha·a·b + beta·c0 + bias) + residual element by element; the tolerance grows with K
/// (a float sum of K products may drift by ~K·eps of the sum of magnitudes).
template <class T>
void check_product(const matrix_ref<const T>& a, const matrix_ref<const T>& b, const matrix_ref<const T>& c0,
                   const matrix_ref<T>& c, const gemm_epilogue<T>& ep) {
    const double eps = std::numeric_limits<T>::epsilon();
    int reported = 0;
    for (std::int64_t i = 0; i < c.rows; ++i)
        for (std::int64_t j = 0; j < c.cols; ++j) {
            double sum = 0, magnitude = 0;
            for (std::int64_t k = 0; k < a.cols; ++k) {
                sum += double(a(i, k)) * double(b(k, j));
                magnitude += std::abs(double(a(i, k)) * double(b(k, j)));
            }
            double expected = double(ep.alpha) * sum;
            if (ep.beta != T(0)) expected += double(ep.beta) * double(c0(i, j));
            if (ep.bias) expected += double(ep.bias[ep.bias_per_row ? i : j]);
            expected = apply_activation(expected, ep.act);
            if (ep.residual.data) expected += double(ep.residual(i, j));
            const double tolerance = 4 * eps * (double(a.cols + 4) * (magnitude + 1) + std::abs(expected));
            if (!(std::abs(double(c(i, j)) - expected) <= tolerance) && reported++ < 3)
                FAIL_CHECK("C(" << i << ", " << j << ") = " << double(c(i, j)) << ", expected " << expected
                                << " (M " << c.rows << ", N " << c.cols << ", K " << a.cols << ")");
        }
}

template <class T>
void run_case(std::int64_t M, std::int64_t N, std::int64_t K, int layout_a, int layout_b, int layout_c,
              const gemm_epilogue<T>& ep, Context& ctx, std::uint32_t seed) {
    strided_matrix<T> a(M, K, layout_a, seed), b(K, N, layout_b, seed + 1), c(M, N, layout_c, seed + 2);
    const strided_matrix<T> c0 = c;
    const matrix_ref<const T> c0_in{c0.storage.data(), M, N, c.m.row_stride, c.m.col_stride};
    dl::detail::gemm(a.in(), b.in(), c.m, ep, ctx);
    check_product(a.in(), b.in(), c0_in, c.m, ep);
}

}  // namespace

TEST_CASE_TEMPLATE("gemm matches a double reference for every transpose and stride combination", T, float, double) {
    Context ctx({.threads = 1});
    const std::int64_t sizes[] = {1, 2, 7, 13, 31, 64, 97};
    std::uint32_t seed = 1;
    for (std::int64_t M : sizes)
        for (std::int64_t N : {std::int64_t{1}, std::int64_t{17}, std::int64_t{33}, std::int64_t{64}})
            for (std::int64_t K : {std::int64_t{1}, std::int64_t{5}, std::int64_t{37}, std::int64_t{64}})
                for (int la = 0; la < 3; ++la)
                    for (int lb = 0; lb < 3; ++lb) {
                        CAPTURE(M);
                        CAPTURE(N);
                        CAPTURE(K);
                        CAPTURE(la);
                        CAPTURE(lb);
                        run_case<T>(M, N, K, la, lb, (la + lb) % 3, {}, ctx, seed++);
                    }
}

TEST_CASE_TEMPLATE("gemm crosses cache blocks: K past kc, M past mc, N with a tail", T, float, double) {
    Context ctx({.threads = 1});
    // 1031 and 577 are primes: every block boundary lands on a partial tile.
    run_case<T>(211, 67, 1031, 0, 0, 0, {}, ctx, 11);
    run_case<T>(577, 45, 300, 1, 1, 0, {.alpha = T(0.5), .beta = T(2)}, ctx, 12);
    run_case<T>(37, 4099, 3, 0, 1, 0, {}, ctx, 13);  // past nc columns
    // Two k block boundaries with the epilogue: beta only on the first block, the activation only on
    // the last.
    run_case<T>(50, 40, 2100, 1, 0, 1, {.alpha = T(0.5), .beta = T(2), .act = dl::activation::tanh}, ctx, 14);
}

// bfloat16 runs the widened path (gemm_half.hpp): the product in float, then the epilogue over whole
// rows of vectors with a scalar tail (contiguous C), or element by element (column-major C).
TEST_CASE_TEMPLATE("gemm alpha, beta and epilogues, on full tiles and edges", T, float, double, dl::bfloat16) {
    Context ctx({.threads = 1});
    std::vector<T> bias(200);
    for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = T(0.01 * double(i) - 0.7);
    // {37, 45, 1}: an outer product (gemm_outer), vectors and a tail per row.
    const std::int64_t shapes[][3] = {{1, 16, 64}, {24, 64, 32}, {29, 45, 19}, {37, 45, 1}, {96, 96, 600}};
    std::uint32_t seed = 100;
    for (const auto& s : shapes) {
        const std::int64_t M = s[0], N = s[1], K = s[2];
        strided_matrix<T> residual(M, N, 0, 77);
        for (dl::activation act : {dl::activation::none, dl::activation::relu, dl::activation::gelu,
                                   dl::activation::sigmoid, dl::activation::tanh})
            for (bool per_row : {false, true})
                for (int layout_c : {0, 1}) {
                    INFO("M ", M, " N ", N, " K ", K, " act ", int(act), " per_row ", per_row, " layout_c ", layout_c);
                    const gemm_epilogue<T> ep{.alpha = T(1.5), .beta = T(-0.5), .bias = bias.data(),
                                              .bias_per_row = per_row, .act = act, .residual = residual.in()};
                    run_case<T>(M, N, K, 0, 1, layout_c, ep, ctx, seed++);
                    run_case<T>(M, N, K, 0, 0, layout_c, {.bias = bias.data(), .bias_per_row = per_row, .act = act},
                                ctx, seed++);
                }
    }
}

TEST_CASE("gemm with beta 0 never reads C, and K = 0 gives beta·C + epilogue") {
    Context ctx({.threads = 1});
    for (std::int64_t M : {3, 40}) {
        strided_matrix<float> a(M, 50, 0, 1), b(50, 40, 0, 2), c(M, 40, 0, 3);
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < 40; ++j) c.m(i, j) = std::numeric_limits<float>::quiet_NaN();
        dl::detail::gemm(a.in(), b.in(), c.m, gemm_epilogue<float>{}, ctx);
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < 40; ++j) REQUIRE(std::isfinite(c.m(i, j)));
    }
    strided_matrix<float> a(4, 0, 0, 1), b(0, 5, 0, 2), c(4, 5, 0, 3);
    const strided_matrix<float> c0 = c;
    const float bias[5] = {1, 2, 3, 4, 5};
    dl::detail::gemm(a.in(), b.in(), c.m, gemm_epilogue<float>{.beta = 2, .bias = bias}, ctx);
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 5; ++j) CHECK(c.m(i, j) == 2 * c0.storage[std::size_t(i * 5 + j)] + bias[j]);
    strided_matrix<float> empty_a(0, 7, 0, 1), empty_b(7, 3, 0, 2), empty_c(0, 3, 0, 3);
    dl::detail::gemm(empty_a.in(), empty_b.in(), empty_c.m, gemm_epilogue<float>{}, ctx);  // nothing to do
}

TEST_CASE("gemm: NaN and Inf in the inputs propagate") {
    Context ctx({.threads = 1});
    strided_matrix<float> a(20, 30, 0, 1), b(30, 40, 0, 2), c(20, 40, 0, 3);
    a.m(3, 7) = std::numeric_limits<float>::quiet_NaN();
    b.m(5, 11) = std::numeric_limits<float>::infinity();
    dl::detail::gemm(a.in(), b.in(), c.m, gemm_epilogue<float>{}, ctx);
    for (std::int64_t j = 0; j < 40; ++j) CHECK(std::isnan(c.m(3, j)));
    CHECK(std::isinf(c.m(0, 11)));
    // A few rows times a transposed B: the dot-product path, NaN and Inf in its vector part and its tail.
    for (std::int64_t K : {16, 37}) {
        strided_matrix<float> x(3, K, 0, 4), w(K, 9, 1, 5), y(3, 9, 0, 6);
        x.m(1, 2) = std::numeric_limits<float>::quiet_NaN();
        w.m(K - 1, 6) = std::numeric_limits<float>::infinity();
        x.m(0, K - 1) = 1;  // a positive factor for the Inf
        x.m(2, K - 1) = 1;
        dl::detail::gemm(x.in(), w.in(), y.m, gemm_epilogue<float>{}, ctx);
        for (std::int64_t j = 0; j < 9; ++j) CHECK(std::isnan(y.m(1, j)));
        CHECK(std::isinf(y.m(0, 6)));
        CHECK(std::isinf(y.m(2, 6)));
        CHECK(std::isfinite(y.m(0, 5)));
    }
}

TEST_CASE("gemm gives the same bits on 1 and 2 threads, split along M or along N") {
    Context one({.threads = 1}), two({.threads = 2});
    // 8 × 2000: the dot-product path (B = Wᵀ at a few rows), its columns split over the threads.
    for (auto [M, N] : {std::pair<std::int64_t, std::int64_t>{300, 200}, {100, 700}, {8, 2000}}) {
        strided_matrix<float> a(M, 257, 0, 1), b(257, N, 1, 2), c1(M, N, 0, 3), c2(M, N, 0, 3);
        const gemm_epilogue<float> ep{.beta = 1, .act = dl::activation::tanh};
        dl::detail::gemm(a.in(), b.in(), c1.m, ep, one);
        dl::detail::gemm(a.in(), b.in(), c2.m, ep, two);
        CHECK(c1.storage == c2.storage);
        strided_matrix<float> c0(M, N, 0, 3);
        check_product<float>(a.in(), b.in(), c0.in(), c2.m, ep);
    }
}

#ifndef DL_NO_SIMD
TEST_CASE_TEMPLATE("simd::lane_sums: lane q is the sum of the lanes of batch q", T, float, double) {
    // The small-M path (x·Wᵀ) folds its accumulators with it; xsimd 8.1's own haddp permutes lanes on AVX-512.
    constexpr int W = dl::simd::width<T>;
    dl::simd::batch<T> v[W];
    alignas(64) T lanes[W];
    for (int q = 0; q < W; ++q) {
        for (int l = 0; l < W; ++l) lanes[l] = T(q * 100 + l * l);
        v[q] = dl::simd::load(lanes);
    }
    dl::simd::store(lanes, dl::simd::lane_sums(v));
    for (int q = 0; q < W; ++q) {
        T expected = 0;
        for (int l = 0; l < W; ++l) expected += T(q * 100 + l * l);
        CHECK(lanes[q] == expected);
    }
}
#endif

TEST_CASE("gemm rejects shapes that do not multiply") {
    Context ctx({.threads = 1});
    strided_matrix<float> a(4, 5, 0, 1), b(6, 3, 0, 2), c(4, 3, 0, 3), r(4, 2, 0, 4);
    CHECK_THROWS_WITH_AS(dl::detail::gemm(a.in(), b.in(), c.m, gemm_epilogue<float>{}, ctx),
                         doctest::Contains("do not match"), dl::error);
    strided_matrix<float> b2(5, 3, 0, 2);
    CHECK_THROWS_WITH_AS(dl::detail::gemm(a.in(), b2.in(), c.m, gemm_epilogue<float>{.residual = r.in()}, ctx),
                         doctest::Contains("residual"), dl::error);
}

TEST_CASE_TEMPLATE("gemm_batched equals one product per entry, serial or spread over threads", T, float, double) {
    for (int threads : {1, 2}) {
        Context ctx({.threads = threads});
        const std::int64_t count = 6, M = 33, N = 20, K = 70;
        strided_matrix<T> a(count * M, K, 0, 1), b(count * K, N, 0, 2), c(count * M, N, 0, 3);
        const strided_matrix<T> c0 = c;
        std::vector<T> bias(std::size_t(N), T(0.25));
        const gemm_epilogue<T> ep{.beta = T(1), .bias = bias.data(), .act = dl::activation::relu};
        auto entry = [](auto m, std::int64_t rows, std::int64_t n) {
            m.rows = rows;
            m.data += n * rows * m.row_stride;
            return m;
        };
        dl::detail::gemm_batched(entry(a.in(), M, 0), M * K, entry(b.in(), K, 0), K * N, entry(c.m, M, 0), M * N, count,
                                 ep, ctx);
        for (std::int64_t n = 0; n < count; ++n)
            check_product(entry(a.in(), M, n), entry(b.in(), K, n),
                          entry(matrix_ref<const T>{c0.storage.data(), count * M, N, N, 1}, M, n), entry(c.m, M, n), ep);
    }
}

TEST_CASE("matmul and linear run on the GEMM: fused linear + bias + activation equals the unfused ops") {
    Context ctx({.threads = 1});
    const Tensor<float> x = dl::normal<float>({9, 31}, 0, 1, ctx), w = dl::normal<float>({13, 31}, 0, 1, ctx),
                        bias = dl::normal<float>({13}, 0, 1, ctx);
    for (dl::activation act : {dl::activation::relu, dl::activation::sigmoid, dl::activation::tanh}) {
        const Tensor<float> fused = dl::linear(x, w, bias, act);
        Tensor<float> unfused = dl::linear(x, w, bias);
        if (act == dl::activation::relu) unfused = dl::relu(unfused);
        if (act == dl::activation::sigmoid) unfused = dl::sigmoid(unfused);
        if (act == dl::activation::tanh) unfused = dl::tanh(unfused);
        // relu is exact; sigmoid and tanh may round differently in the last bits, because an edge tile
        // (or the BLAS backend's pass) evaluates them one element at a time and the unfused op in SIMD.
        for (std::int64_t i = 0; i < fused.numel(); ++i) {
            const double want = unfused.data()[i], got = fused.data()[i];
            if (act == dl::activation::relu) CHECK(got == want);
            else CHECK(std::abs(got - want) <= 4e-7 * std::max(1.0, std::abs(want)));
        }
    }
}
