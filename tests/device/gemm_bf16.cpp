// The bf16 GEMM (device/cpu/gemm_half.hpp): bfloat16 A and B, float C, against a double-precision
// reference of the same bf16 values with a tolerance scaled by K, on the vdpbf16ps kernel where the
// target has AVX-512 BF16 and on the widened-float path always: shapes of 1, primes and odd K (the last
// k pair half padding), N past one packed B block, transposed and strided operands, accumulate, several threads.
#include "support.hpp"

#include <cmath>
#include <random>

namespace {

using dl::bfloat16;
using dl::detail::matrix_ref;

template <bool Native>
void check_bf16(std::int64_t M, std::int64_t N, std::int64_t K, bool transposed_a, bool transposed_b, bool accumulate,
                int threads, std::uint32_t seed) {
    dl::Context ctx({.threads = threads});
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1, 1);
    // Stored with a padded leading dimension, so strides are not the shapes.
    const std::int64_t lda = (transposed_a ? M : K) + 3, ldb = (transposed_b ? K : N) + 5;
    std::vector<bfloat16> a(std::size_t((transposed_a ? K : M) * lda)), b(std::size_t((transposed_b ? N : K) * ldb));
    for (auto& v : a) v = bfloat16(dist(rng));
    for (auto& v : b) v = bfloat16(dist(rng));
    const matrix_ref<const bfloat16> am = transposed_a ? matrix_ref<const bfloat16>{a.data(), M, K, 1, lda}
                                                       : matrix_ref<const bfloat16>{a.data(), M, K, lda, 1};
    const matrix_ref<const bfloat16> bm = transposed_b ? matrix_ref<const bfloat16>{b.data(), K, N, 1, ldb}
                                                       : matrix_ref<const bfloat16>{b.data(), K, N, ldb, 1};
    std::vector<float> c(std::size_t(M * N), 0.5f);
    dl::detail::gemm_bf16<Native>(am, bm, {c.data(), M, N, N, 1}, accumulate, ctx);
    int wrong = 0;
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            double s = accumulate ? 0.5 : 0, magnitude = 0;
            for (std::int64_t k = 0; k < K; ++k) {
                const double p = double(float(am(i, k))) * double(float(bm(k, j)));
                s += p;
                magnitude += std::fabs(p);
            }
            // Float accumulation: each of K additions may round by half an ulp of the running sum.
            const double tolerance = 1e-6 + double(K) * 0x1p-24 * (magnitude + 0.5);
            const float got = c[std::size_t(i * N + j)];
            if (!(std::fabs(got - s) <= tolerance) && wrong++ < 3)
                FAIL_CHECK("C(" << i << ", " << j << ") = " << got << ", expected " << s << " ± " << tolerance);
        }
}

template <bool Native>
void check_all() {
    std::uint32_t seed = 1;
    for (std::int64_t M : {1, 5, 12, 13, 37})
        for (std::int64_t N : {1, 31, 32, 67})
            for (std::int64_t K : {1, 2, 3, 29, 1030}) {
                CAPTURE(M);
                CAPTURE(N);
                CAPTURE(K);
                check_bf16<Native>(M, N, K, false, false, false, 1, seed++);
                check_bf16<Native>(M, N, K, true, true, true, 1, seed++);
            }
    check_bf16<Native>(200, 70, 300, false, true, false, 2, 100);
    check_bf16<Native>(64, 256, 784, false, true, true, 2, 101);
    // N past one packed B block (bf16_shape::NC = 512), its last panel partial, odd K.
    check_bf16<Native>(13, 555, 41, false, false, true, 1, 102);
    check_bf16<Native>(13, 555, 41, true, true, false, 2, 103);
}

/// Small integers: every product and partial sum is exact in float, so C must equal the integer
/// reference exactly, whatever the order of accumulation.
template <bool Native>
void check_exact(std::int64_t M, std::int64_t N, std::int64_t K, int threads) {
    dl::Context ctx({.threads = threads});
    std::vector<bfloat16> a(std::size_t(M * K)), b(std::size_t(K * N));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = bfloat16(int(i * 7 % 17) - 8);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = bfloat16(int(i * 5 % 13) - 6);
    std::vector<float> c(std::size_t(M * N));
    dl::detail::gemm_bf16<Native>({a.data(), M, K, K, 1}, {b.data(), K, N, N, 1}, {c.data(), M, N, N, 1}, false, ctx);
    int wrong = 0;
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            std::int64_t s = 0;
            for (std::int64_t k = 0; k < K; ++k) s += std::int64_t(float(a[std::size_t(i * K + k)])) * std::int64_t(float(b[std::size_t(k * N + j)]));
            if (c[std::size_t(i * N + j)] != float(s) && wrong++ < 3)
                FAIL_CHECK("C(" << i << ", " << j << ") = " << c[std::size_t(i * N + j)] << ", expected " << s);
        }
}

}  // namespace

TEST_CASE("gemm_bf16, widened-float path, matches the double reference") {
    check_all<false>();
    check_exact<false>(37, 67, 1031, 2);
}

TEST_CASE("gemm_bf16, vdpbf16ps kernel, matches the double reference (where the target has AVX-512 BF16)") {
    if (!dl::detail::has_avx512_bf16) {
        MESSAGE("this build's target has no AVX-512 BF16: the vdpbf16ps kernel is not compiled in");
        return;
    }
    check_all<true>();
    check_exact<true>(37, 67, 1031, 2);
}

TEST_CASE("gemm_bf16: empty products, and shapes that do not multiply") {
    dl::Context ctx({.threads = 1});
    std::vector<bfloat16> a(12, bfloat16(1.0f)), b(12, bfloat16(1.0f));
    std::vector<float> c(9, 7.0f);
    // K = 0: C = 0 (or unchanged when accumulating).
    dl::detail::gemm_bf16(matrix_ref<const bfloat16>{a.data(), 3, 0, 1, 1}, matrix_ref<const bfloat16>{b.data(), 0, 3, 3, 1},
                          matrix_ref<float>{c.data(), 3, 3, 3, 1}, true, ctx);
    CHECK(c[4] == 7.0f);
    dl::detail::gemm_bf16(matrix_ref<const bfloat16>{a.data(), 3, 0, 1, 1}, matrix_ref<const bfloat16>{b.data(), 0, 3, 3, 1},
                          matrix_ref<float>{c.data(), 3, 3, 3, 1}, false, ctx);
    CHECK(c[4] == 0.0f);
    CHECK_THROWS_WITH_AS(dl::detail::gemm_bf16(matrix_ref<const bfloat16>{a.data(), 3, 4, 4, 1},
                                               matrix_ref<const bfloat16>{b.data(), 3, 4, 4, 1},
                                               matrix_ref<float>{c.data(), 3, 3, 3, 1}, false, ctx),
                         doctest::Contains("do not match"), dl::error);
}
