// Factory functions: empty/zeros/ones/full, scalar_tensor, nested lists, arange, linspace and the
// counter-based random tensors.
#include "support.hpp"

#include <cstring>
#include <map>

using dl::Shape;
using dl::Tensor;
using dl_test::error_message;
using dl_test::to_vector;

namespace {
template <class T>
bool bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
    return a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous() &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

struct moments {
    double mean, stddev, min, max;
};
template <class T>
moments moments_of(const Tensor<T>& t) {
    double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
    for (auto v : to_vector(t)) {
        const double x = static_cast<double>(v);
        sum += x;
        sq += x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    const double n = static_cast<double>(t.numel()), mean = sum / n;
    return {mean, std::sqrt(sq / n - mean * mean), lo, hi};
}

std::int64_t sample_count() { return dl_test::quick() ? 20000 : 100000; }

/// Five standard errors of the mean of n samples of a distribution with deviation sigma: a fixed seed
/// makes the checks deterministic, this makes them meaningful for any seed.
double mean_tolerance(double sigma, std::int64_t n) { return 5 * sigma / std::sqrt(static_cast<double>(n)); }
}  // namespace

// --- constant factories ---

TEST_CASE_TEMPLATE("zeros, ones and full fill every element; empty only allocates", T, DL_ELEMENT_TYPES) {
    dl::Context ctx({.threads = 1});
    const Shape shape{3, 1, 4};
    const auto e = dl::empty<T>(shape, ctx);
    CHECK(e.shape() == shape);
    CHECK(e.is_contiguous());
    CHECK(&e.context() == &ctx);

    CHECK(to_vector(dl::zeros<T>(shape, ctx)) == std::vector<T>(12, T(0)));
    CHECK(to_vector(dl::ones<T>(shape, ctx)) == std::vector<T>(12, T(1)));
    const T value = std::is_same_v<T, bool> ? T(true) : T(7);
    const auto f = dl::full<T>(shape, value, ctx);
    CHECK(to_vector(f) == std::vector<T>(12, value));
    CHECK(&f.context() == &ctx);

    CHECK(dl::zeros<T>({0, 5}, ctx).numel() == 0);
    CHECK(dl::zeros<T>({}, ctx).item() == T(0));
}

TEST_CASE("full keeps exact values of the element type") {
    CHECK(dl::full<double>({2}, 0.1).at(1) == 0.1);
    CHECK(dl::full<float>({2}, -0.0f).at(0) == 0.0f);
    CHECK(std::signbit(dl::full<float>({2}, -0.0f).at(0)));
    CHECK(dl::full<std::int64_t>({1}, std::int64_t{1} << 40).item() == std::int64_t{1} << 40);
    CHECK(dl::full<std::uint8_t>({1}, 255).item() == 255);
}

TEST_CASE_TEMPLATE("scalar_tensor has rank 0 and one element", T, DL_ELEMENT_TYPES) {
    const T value = std::is_same_v<T, bool> ? T(true) : T(42);
    const auto s = dl::scalar_tensor<T>(value);
    CHECK(s.rank() == 0);
    CHECK(s.shape() == Shape{});
    CHECK(s.numel() == 1);
    CHECK(s.item() == value);
    CHECK(s.owns_memory());
}

// --- nested lists ---

TEST_CASE("tensor<T> from nested lists of rank 1 to 4") {
    const auto r1 = dl::tensor<float>({1.5f, 2, 3});
    CHECK(r1.shape() == Shape{3});
    CHECK(to_vector(r1) == std::vector<float>{1.5f, 2, 3});

    const auto r2 = dl::tensor<int>({{1, 2, 3}, {4, 5, 6}});
    CHECK(r2.shape() == Shape{2, 3});
    CHECK(r2(1, 0) == 4);
    CHECK(to_vector(r2) == std::vector<int>{1, 2, 3, 4, 5, 6});

    const auto r3 = dl::tensor<double>({{{1, 2}}, {{3, 4}}, {{5, 6}}});
    CHECK(r3.shape() == Shape{3, 1, 2});
    CHECK(to_vector(r3) == std::vector<double>{1, 2, 3, 4, 5, 6});

    const auto r4 = dl::tensor<std::int64_t>({{{{1, 2, 3}, {4, 5, 6}}}, {{{7, 8, 9}, {10, 11, 12}}}});
    CHECK(r4.shape() == Shape{2, 1, 2, 3});
    CHECK(r4(1, 0, 1, 0) == 10);
    CHECK(to_vector(r4) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});

    const auto b = dl::tensor<bool>({{true, false}, {false, true}});
    CHECK(to_vector(b) == std::vector<bool>{true, false, false, true});
    const auto u = dl::tensor<std::uint8_t>({0, 128, 255});
    CHECK(to_vector(u) == std::vector<std::uint8_t>{0, 128, 255});

    dl::Context ctx({.threads = 1});
    CHECK(&dl::tensor<float>({1, 2}, ctx).context() == &ctx);
}

TEST_CASE("tensor<T> rejects ragged nested lists") {
    CHECK_THROWS_AS(dl::tensor<float>({{1, 2}, {3}}), dl::error);
    CHECK_THROWS_AS(dl::tensor<float>({{1}, {2, 3}}), dl::error);
    CHECK_THROWS_AS(dl::tensor<int>({{{1, 2}, {3, 4}}, {{5, 6}, {7}}}), dl::error);
    CHECK_THROWS_AS(dl::tensor<int>({{{1, 2}, {3, 4}}, {{5, 6}}}), dl::error);
    CHECK_THROWS_AS(dl::tensor<int>({{{{1, 2}}}, {{{3}}}}), dl::error);
    const std::string msg = error_message([] { (void)dl::tensor<float>({{1, 2, 3}, {4, 5}}); });
    CHECK(msg.find("ragged") != std::string::npos);
    CHECK(msg.find("dimension 1") != std::string::npos);
}

// --- arange / linspace ---

TEST_CASE("arange counts from start by step up to, not including, stop") {
    CHECK(to_vector(dl::arange<int>(5)) == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(to_vector(dl::arange<std::int64_t>(2, 11, 3)) == std::vector<std::int64_t>{2, 5, 8});
    CHECK(to_vector(dl::arange<std::int64_t>(2, 12, 3)) == std::vector<std::int64_t>{2, 5, 8, 11});
    CHECK(to_vector(dl::arange<int>(-3, 1)) == std::vector<int>{-3, -2, -1, 0});
    CHECK(to_vector(dl::arange<double>(0, 1, 0.25)) == std::vector<double>{0, 0.25, 0.5, 0.75});
    CHECK(to_vector(dl::arange<float>(1, 2.5, 0.5)) == std::vector<float>{1, 1.5f, 2});
    const auto tenths = dl::arange<double>(0, 1, 0.1);
    CHECK(tenths.numel() == 10);
    for (int i = 0; i < 10; ++i) CHECK(tenths(i) == doctest::Approx(0.1 * i));
    CHECK(dl::arange<int>(7).shape() == Shape{7});
}

TEST_CASE("arange with a negative step counts down") {
    CHECK(to_vector(dl::arange<int>(5, 0, -1)) == std::vector<int>{5, 4, 3, 2, 1});
    CHECK(to_vector(dl::arange<int>(5, -5, -3)) == std::vector<int>{5, 2, -1, -4});
    CHECK(to_vector(dl::arange<float>(1, 0, -0.25)) == std::vector<float>{1, 0.75f, 0.5f, 0.25f});
}

TEST_CASE("arange is empty when stop is not reached from start in the step's direction") {
    CHECK(dl::arange<int>(0).shape() == Shape{0});
    CHECK(dl::arange<int>(3, 3).numel() == 0);
    CHECK(dl::arange<int>(5, 0).numel() == 0);
    CHECK(dl::arange<float>(0, 5, -1).numel() == 0);
    CHECK(dl::arange<double>(-2).numel() == 0);
}

TEST_CASE("arange rejects a zero or non-finite step and non-finite bounds") {
    CHECK_THROWS_AS((void)dl::arange<int>(0, 5, 0), dl::error);
    CHECK_THROWS_AS((void)dl::arange<float>(0, INFINITY, 1), dl::error);
    CHECK_THROWS_AS((void)dl::arange<float>(NAN, 1, 1), dl::error);
    CHECK_THROWS_AS((void)dl::arange<float>(0, 1, NAN), dl::error);
}

TEST_CASE("linspace spaces count values evenly with both endpoints exact") {
    CHECK(to_vector(dl::linspace<float>(0, 1, 5)) == std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1});
    CHECK(to_vector(dl::linspace<double>(2, -2, 3)) == std::vector<double>{2, 0, -2});
    const auto odd = dl::linspace<double>(0, 0.3, 7);  // 0.3 is not reachable by repeated addition
    CHECK(odd(0) == 0.0);
    CHECK(odd(6) == 0.3);
    for (int i = 1; i < 6; ++i) CHECK(odd(i) == doctest::Approx(0.05 * i));
    const auto f = dl::linspace<float>(-1, 3.3, 11);
    CHECK(f(0) == -1.0f);
    CHECK(f(10) == 3.3f);
    CHECK(to_vector(dl::linspace<int>(0, 10, 6)) == std::vector<int>{0, 2, 4, 6, 8, 10});
    // Counts where start + (count - 1) * step misses stop by one ulp.
    CHECK(dl::linspace<double>(0, 1, 50)(49) == 1.0);
    CHECK(dl::linspace<double>(0, 0.1, 12)(11) == 0.1);
    CHECK(dl::linspace<double>(0, 0.1, 20)(19) == 0.1);
}

TEST_CASE("linspace with count 0 is empty and with count 1 holds start") {
    CHECK(dl::linspace<float>(0, 1, 0).shape() == Shape{0});
    CHECK(to_vector(dl::linspace<float>(3, 7, 1)) == std::vector<float>{3});
    CHECK_THROWS_AS((void)dl::linspace<float>(0, 1, -1), dl::error);
}

// --- random ---

TEST_CASE("uniform values lie in [low, high) with mean (low + high) / 2") {
    const std::int64_t n = sample_count();
    dl::Context ctx({.seed = 1234, .threads = 2});
    const auto u = dl::uniform<float>({n}, -2, 6, ctx);
    const auto m = moments_of(u);
    CHECK(m.min >= -2.0);
    CHECK(m.max < 6.0);
    CHECK(m.mean == dl_test::relative(2.0, mean_tolerance(8.0 / std::sqrt(12.0), n) / 2.0));
    CHECK(m.stddev == dl_test::relative(8.0 / std::sqrt(12.0), 0.02));
    // Every eighth of the range is hit about equally often.
    std::int64_t bins[8] = {};
    for (float v : to_vector(u)) ++bins[static_cast<int>(v + 2.0f)];
    for (auto count : bins)
        CHECK(static_cast<double>(count) / static_cast<double>(n) == dl_test::relative(0.125, 0.1));

    const auto d = dl::uniform<double>({n}, 0, 1, ctx);
    CHECK(moments_of(d).min >= 0.0);
    CHECK(moments_of(d).max < 1.0);
    CHECK(moments_of(d).mean == dl_test::relative(0.5, mean_tolerance(1.0 / std::sqrt(12.0), n) / 0.5));
}

TEST_CASE("uniform<float> never returns high, even where rounding to float would reach it") {
    dl::Context ctx({.seed = 99, .threads = 1});
    // float(high) is the next float above 1, and draws in the upper half of [1, high) round up to it.
    const auto u = dl::uniform<float>({sample_count()}, 1.0, 1.0 + 1e-7, ctx);
    CHECK(moments_of(u).max < static_cast<float>(1.0 + 1e-7));
}

TEST_CASE("uniform over integers hits every value of [low, high) equally often") {
    const std::int64_t n = sample_count();
    dl::Context ctx({.seed = 5, .threads = 1});
    const auto u = dl::uniform<std::int32_t>({n}, -5, 5, ctx);
    std::map<std::int32_t, std::int64_t> counts;
    for (auto v : to_vector(u)) ++counts[v];
    CHECK(counts.begin()->first == -5);
    CHECK(counts.rbegin()->first == 4);
    for (std::int32_t v = -5; v < 5; ++v) {
        CAPTURE(v);
        CHECK(static_cast<double>(counts[v]) / static_cast<double>(n) == dl_test::relative(0.1, 0.15));
    }
}

TEST_CASE("uniform over non-negative integers stays in [low, high)") {
    const std::int64_t n = sample_count();
    dl::Context ctx({.seed = 5, .threads = 1});
    const auto u = dl::uniform<std::uint8_t>({n}, 0, 256, ctx);
    const auto m = moments_of(u);
    CHECK(m.min == 0);
    CHECK(m.max == 255);
    CHECK(m.mean == dl_test::relative(127.5, mean_tolerance(256.0 / std::sqrt(12.0), n) / 127.5));
}

TEST_CASE("normal has mean ~0 and standard deviation ~1, or the ones asked for") {
    const std::int64_t n = sample_count();
    dl::Context ctx({.seed = 2024, .threads = 2});
    const auto z = moments_of(dl::normal<float>({n}, 0, 1, ctx));
    CAPTURE(z.mean);
    CHECK(std::abs(z.mean) < mean_tolerance(1.0, n));
    CHECK(z.stddev == dl_test::relative(1.0, 0.02));
    CHECK(z.min < -3.0);  // tails are there
    CHECK(z.max > 3.0);
    CHECK(std::isfinite(z.min));
    CHECK(std::isfinite(z.max));
    const auto s = moments_of(dl::normal<double>({n}, 10, 0.5, ctx));
    CHECK(s.mean == dl_test::relative(10.0, mean_tolerance(0.5, n) / 10.0));
    CHECK(s.stddev == dl_test::relative(0.5, 0.02));
}

TEST_CASE("the same seed gives the same values, another seed other values") {
    dl::Context a({.seed = 7, .threads = 1}), b({.seed = 7, .threads = 1}), c({.seed = 8, .threads = 1});
    const auto ua = dl::uniform<float>({1000}, 0, 1, a);
    const auto ub = dl::uniform<float>({1000}, 0, 1, b);
    const auto uc = dl::uniform<float>({1000}, 0, 1, c);
    CHECK(bitwise_equal(ua, ub));
    CHECK_FALSE(bitwise_equal(ua, uc));
    CHECK(bitwise_equal(dl::normal<double>({300}, 0, 1, a), dl::normal<double>({300}, 0, 1, b)));
}

TEST_CASE("random tensors are bitwise identical with 1 and 2 threads") {
    const std::int64_t n = dl_test::quick() ? 50000 : 300000;  // several 16 Ki chunks
    dl::Context one({.seed = 7, .threads = 1}), two({.seed = 7, .threads = 2}), four({.seed = 7, .threads = 4});
    CHECK(bitwise_equal(dl::uniform<float>({n}, 0, 1, one), dl::uniform<float>({n}, 0, 1, two)));
    CHECK(bitwise_equal(dl::normal<float>({n}, 0, 1, one), dl::normal<float>({n}, 0, 1, two)));
    CHECK(bitwise_equal(dl::normal<double>({n}, 0, 1, one), dl::normal<double>({n}, 0, 1, two)));
    // After the same history, a third Context agrees too.
    (void)dl::uniform<float>({n}, 0, 1, four);
    (void)dl::normal<float>({n}, 0, 1, four);
    (void)dl::normal<double>({n}, 0, 1, four);
    CHECK(bitwise_equal(dl::uniform<float>({100, 1000}, 0, 1, one), dl::uniform<float>({100, 1000}, 0, 1, four)));
}

TEST_CASE("successive random tensors differ and continue one stream") {
    dl::Context ctx({.seed = 3, .threads = 1});
    const auto first = dl::uniform<double>({100}, 0, 1, ctx);
    const auto second = dl::uniform<double>({50}, 0, 1, ctx);
    CHECK_FALSE(bitwise_equal(first.slice(0, 0, 50).contiguous(), second));
    // Counter-based: the two calls are positions 0..99 and 100..149 of one stream.
    dl::Context fresh({.seed = 3, .threads = 1});
    const auto both = dl::uniform<double>({150}, 0, 1, fresh);
    CHECK(to_vector(both.slice(0, 0, 100)) == to_vector(first));
    CHECK(to_vector(both.slice(0, 100, 150)) == to_vector(second));
}

TEST_CASE("manual_seed restarts the stream") {
    dl::Context ctx({.seed = 11, .threads = 1});
    const auto a = dl::normal<float>({64}, 0, 1, ctx);
    const auto b = dl::normal<float>({64}, 0, 1, ctx);
    ctx.manual_seed(11);
    CHECK(ctx.seed() == 11);
    CHECK(bitwise_equal(dl::normal<float>({64}, 0, 1, ctx), a));
    CHECK(bitwise_equal(dl::normal<float>({64}, 0, 1, ctx), b));
    ctx.manual_seed(12);
    CHECK(ctx.seed() == 12);
    CHECK_FALSE(bitwise_equal(dl::normal<float>({64}, 0, 1, ctx), a));
}

TEST_CASE("random factories handle empty and rank-0 shapes") {
    dl::Context ctx({.seed = 1, .threads = 2});
    CHECK(dl::uniform<float>({0, 3}, 0, 1, ctx).numel() == 0);
    const float s = dl::uniform<float>({}, 5, 6, ctx).item();
    CHECK(s >= 5.0f);
    CHECK(s < 6.0f);
    CHECK(std::isfinite(dl::normal<double>({}, 0, 1, ctx).item()));
}
