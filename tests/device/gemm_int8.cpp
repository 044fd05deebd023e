// The u8·s8 → s32 GEMM (device/cpu/gemm_int8.hpp): exact against an int64 reference, on the VNNI
// kernel where the target has it and on the portable kernel always, including the extreme values
// (255 · -128 in every product: saturating instructions would get these wrong).
#include "support.hpp"

#include <random>

namespace {

using dl::detail::matrix_ref;

template <bool Vnni>
void check_int8(std::int64_t M, std::int64_t N, std::int64_t K, bool transposed_b, bool extremes, int threads,
                std::uint32_t seed) {
    dl::Context ctx({.threads = threads});
    std::mt19937 rng(seed);
    std::vector<std::uint8_t> a(std::size_t(M * K));
    std::vector<std::int8_t> b(std::size_t(K * N));
    for (auto& v : a) v = extremes ? 255 : std::uint8_t(rng());
    for (auto& v : b) v = extremes ? -128 : std::int8_t(rng());
    // The transposed case transposes A too: a strided A is packed, a row-major one read in place.
    const matrix_ref<const std::uint8_t> am = transposed_b ? matrix_ref<const std::uint8_t>{a.data(), M, K, 1, M}
                                                           : matrix_ref<const std::uint8_t>{a.data(), M, K, K, 1};
    const matrix_ref<const std::int8_t> bm = transposed_b ? matrix_ref<const std::int8_t>{b.data(), K, N, 1, K}
                                                          : matrix_ref<const std::int8_t>{b.data(), K, N, N, 1};
    std::vector<std::int32_t> c(std::size_t(M * N), 7);
    dl::detail::gemm_u8s8<Vnni>(am, bm, {c.data(), M, N, N, 1}, true, ctx);
    int wrong = 0;
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            std::int64_t s = 7;
            for (std::int64_t k = 0; k < K; ++k) s += std::int64_t(am(i, k)) * std::int64_t(bm(k, j));
            if (c[std::size_t(i * N + j)] != s && wrong++ < 3)
                FAIL_CHECK("C(" << i << ", " << j << ") = " << c[std::size_t(i * N + j)] << ", expected " << s);
        }
}

template <bool Vnni>
void check_all() {
    std::uint32_t seed = 1;
    for (std::int64_t M : {1, 5, 8, 13, 37})
        for (std::int64_t N : {1, 31, 32, 67})
            for (std::int64_t K : {1, 3, 4, 29, 1030, 1032}) {  // K % 4 == 0: A read in place
                CAPTURE(M);
                CAPTURE(N);
                CAPTURE(K);
                check_int8<Vnni>(M, N, K, false, false, 1, seed++);
                check_int8<Vnni>(M, N, K, true, false, 1, seed++);
            }
    check_int8<Vnni>(19, 40, 2000, false, true, 1, 99);  // 255·-128 summed 2000 times: no saturation
    check_int8<Vnni>(200, 70, 300, false, false, 2, 100);
}

}  // namespace

TEST_CASE("gemm_u8s8, portable kernel, is exact") { check_all<false>(); }

TEST_CASE("gemm_u8s8, VNNI kernel, is exact (where the target has VNNI)") {
    if (!dl::detail::has_vnni) {
        MESSAGE("this build's target has no AVX-512 VNNI: the VNNI kernel is not compiled in");
        return;
    }
    check_all<true>();
}

TEST_CASE("gemm_u8s8 with B packed once serves many products") {
    dl::Context ctx({.threads = 2});
    std::mt19937 rng(5);
    constexpr std::int64_t M = 21, N = 40, K = 36;
    std::vector<std::int8_t> b(std::size_t(K * N));
    for (auto& v : b) v = std::int8_t(rng());
    const matrix_ref<const std::int8_t> bm{b.data(), K, N, N, 1};
    const dl::detail::packed_s8 packed(bm);
    CHECK(packed.rows() == K);
    CHECK(packed.cols() == N);
    for (int round = 0; round < 3; ++round) {
        std::vector<std::uint8_t> a(std::size_t(M * K));
        for (auto& v : a) v = std::uint8_t(rng());
        const matrix_ref<const std::uint8_t> am{a.data(), M, K, K, 1};
        std::vector<std::int32_t> once(std::size_t(M * N)), each(std::size_t(M * N));
        dl::detail::gemm_u8s8(am, packed, {once.data(), M, N, N, 1}, false, ctx);
        dl::detail::gemm_u8s8(am, bm, {each.data(), M, N, N, 1}, false, ctx);
        CHECK(once == each);
        CHECK(once[0] == [&] {
            std::int32_t s = 0;
            for (std::int64_t k = 0; k < K; ++k) s += std::int32_t(a[std::size_t(k)]) * b[std::size_t(k * N)];
            return s;
        }());
    }
}

TEST_CASE("gemm_u8s8 rejects shapes that do not multiply") {
    dl::Context ctx({.threads = 1});
    std::vector<std::uint8_t> a(12);
    std::vector<std::int8_t> b(12);
    std::vector<std::int32_t> c(9);
    CHECK_THROWS_WITH_AS(dl::detail::gemm_u8s8(matrix_ref<const std::uint8_t>{a.data(), 3, 4, 4, 1},
                                               matrix_ref<const std::int8_t>{b.data(), 3, 4, 4, 1},
                                               matrix_ref<std::int32_t>{c.data(), 3, 3, 3, 1}, false, ctx),
                         doctest::Contains("do not match"), dl::error);
}
