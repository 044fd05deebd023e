// Reductions at the edges: NaN and infinity, empty inputs, bad axes, and the accuracy of float sums
// over millions of elements (accumulated in double).
#include "reduce_check.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace expr_test;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE_TEMPLATE("NaN propagates through max, min, argmax, sum, logsumexp and norm", T, float, double) {
    const T n = std::numeric_limits<T>::quiet_NaN();
    const auto x = dl::tensor<T>({{1, n, 5, n}, {2, 3, 9, -1}, {n, 8, 0, 100}});
    CHECK(std::isnan(dl::max(x).item()));
    CHECK(std::isnan(dl::min(x).item()));
    CHECK(dl::argmax(x).item() == 1);  // the first NaN
    CHECK(dl::argmin(x).item() == 1);
    CHECK(std::isnan(dl::sum(x).item()));
    CHECK(std::isnan(dl::mean(x).item()));
    CHECK(std::isnan(dl::var(x).item()));
    CHECK(std::isnan(dl::logsumexp(x).item()));
    CHECK(std::isnan(dl::norm(x, inf).item()));
    CHECK(std::isnan(dl::norm(x, 1).item()));
    CHECK(dl::any(x).item());  // NaN is nonzero
    const auto row_max = to_vector(dl::max(x, {1}));
    CHECK(std::isnan(row_max[0]));
    CHECK(row_max[1] == 9);
    CHECK(std::isnan(row_max[2]));
    CHECK(to_vector(dl::argmax(x, 1)) == std::vector<std::int64_t>{1, 2, 0});
    CHECK(to_vector(dl::argmin(x, 0)) == std::vector<std::int64_t>{2, 0, 2, 0});
    const auto col_min = to_vector(dl::min(x, {0}));
    CHECK(std::isnan(col_min[0]));
    CHECK(std::isnan(col_min[1]));
    CHECK(col_min[2] == 0);
    CHECK(std::isnan(col_min[3]));
    // NaN late in a long slice, past the first parallel block.
    auto long_x = random<T>({1 << 20}, -1, 1, 1);
    long_x((1 << 20) - 3) = n;
    CHECK(std::isnan(dl::max(long_x).item()));
    CHECK(dl::argmax(long_x).item() == (1 << 20) - 3);
    CHECK(std::isnan(dl::sum(long_x).item()));
}

TEST_CASE_TEMPLATE("infinities in reductions", T, float, double) {
    const T i = std::numeric_limits<T>::infinity();
    CHECK(dl::max(dl::tensor<T>({1, i, 3})).item() == i);
    CHECK(dl::min(dl::tensor<T>({1, -i, 3})).item() == -i);
    CHECK(dl::argmax(dl::tensor<T>({-i, -i, -i})).item() == 0);
    CHECK(dl::max(dl::tensor<T>({-i, -i})).item() == -i);
    CHECK(dl::sum(dl::tensor<T>({1, i})).item() == i);
    CHECK(std::isnan(dl::sum(dl::tensor<T>({-i, i})).item()));
    CHECK(dl::logsumexp(dl::tensor<T>({1, i, 3})).item() == i);
    CHECK(dl::logsumexp(dl::tensor<T>({-i, -i})).item() == -i);
    CHECK(dl::logsumexp(dl::tensor<T>({-i, T(0)})).item() == 0);
    CHECK(dl::norm(dl::tensor<T>({1, -i}), inf).item() == i);
    CHECK(dl::norm(dl::tensor<T>({1, -i}), 2).item() == i);
    // logsumexp does not overflow where exp would.
    const T big = std::is_same_v<T, float> ? T(200) : T(2000);
    CHECK(dl::logsumexp(dl::tensor<T>({big, big})).item() == doctest::Approx(big + std::log(2.0)));
    CHECK(dl::logsumexp(dl::tensor<T>({-big, -big})).item() == doctest::Approx(-big + std::log(2.0)));
}

TEST_CASE("reductions over empty inputs with an identity throw nothing and return it") {
    // Bug: detail::reduce folds an empty slice with `begin / inner` (and `row % iter[d]`) where the
    // extent is 0: SIGFPE. Each case runs in a child process so the crash fails one check.
    auto run = [](auto body) {
        return dl_test::exit_code_in_child([&] {
            dl::Context ctx({.seed = 0, .threads = 1});
            return body(ctx) ? 0 : 1;
        });
    };
    CHECK(run([](dl::Context& c) { return dl::sum(dl::zeros<float>({0}, c)).item() == 0.0f; }) == 0);
    CHECK(run([](dl::Context& c) { return dl::sum(dl::zeros<std::int32_t>({0, 3}, c)).item() == 0; }) == 0);
    CHECK(run([](dl::Context& c) {
              return to_vector(dl::sum(dl::zeros<float>({3, 0}, c), {1})) == std::vector<float>{0, 0, 0};
          }) == 0);
    CHECK(run([](dl::Context& c) { return dl::prod(dl::zeros<double>({0}, c)).item() == 1.0; }) == 0);
    CHECK(run([](dl::Context& c) { return dl::norm(dl::zeros<float>({0}, c)).item() == 0.0f; }) == 0);
    CHECK(run([](dl::Context& c) { return dl::logsumexp(dl::zeros<float>({0}, c)).item() == -INFINITY; }) == 0);
    CHECK(run([](dl::Context& c) { return !dl::any(dl::zeros<bool>({0}, c)).item(); }) == 0);
    CHECK(run([](dl::Context& c) { return dl::all(dl::zeros<bool>({0}, c)).item(); }) == 0);
}

TEST_CASE("reductions over empty inputs without an identity throw dl::error") {
    const auto e = dl::zeros<float>({0});
    std::string m = dl_test::error_message([&] { (void)dl::max(e); });
    CHECK(contains(m, "max"));
    CHECK(contains(m, "[0]"));
    CHECK_THROWS_AS((void)dl::min(e), dl::error);
    CHECK_THROWS_AS((void)dl::argmax(e), dl::error);
    CHECK_THROWS_AS((void)dl::argmin(dl::zeros<float>({2, 0}), 1), dl::error);
    CHECK_THROWS_AS((void)dl::mean(e), dl::error);
    CHECK_THROWS_AS((void)dl::var(e), dl::error);
    CHECK_THROWS_AS((void)dl::max(dl::zeros<float>({4, 0}), {1}), dl::error);
}

TEST_CASE("reducing away a non-empty axis of an empty tensor gives an empty result") {
    const auto e = dl::zeros<float>({0, 3});
    CHECK(dl::sum(e, {1}).shape() == dl::Shape{0});
    CHECK(dl::max(e, {1}).shape() == dl::Shape{0});  // nothing to take the max of, nothing to throw
    CHECK(dl::sum(e, {1}, true).shape() == dl::Shape{0, 1});
    CHECK(dl::argmax(e, 1).shape() == dl::Shape{0});
}

TEST_CASE("bad axes throw dl::error") {
    const auto x = dl::zeros<float>({2, 3, 4});
    std::string m = dl_test::error_message([&] { (void)dl::sum(x, {1, 1}); });
    CHECK(contains(m, "sum"));
    CHECK(contains(m, "twice"));
    m = dl_test::error_message([&] { (void)dl::var(x, {-1, 2}); });  // the same axis spelled two ways
    CHECK(contains(m, "var"));
    CHECK(contains(m, "2"));
    CHECK_THROWS_AS((void)dl::mean(x, {0, 2, 0}), dl::error);
    m = dl_test::error_message([&] { (void)dl::max(x, {3}); });
    CHECK(contains(m, "max"));
    CHECK(contains(m, "3"));
    CHECK_THROWS_AS((void)dl::sum(x, {-4}), dl::error);
    CHECK_THROWS_AS((void)dl::argmax(x, 5), dl::error);
    CHECK_THROWS_AS((void)dl::sum(dl::scalar_tensor<float>(1.0f), {0}), dl::error);
    m = dl_test::error_message([&] { (void)dl::norm(x, 0); });
    CHECK(contains(m, "norm"));
    CHECK_THROWS_AS((void)dl::norm(x, -1), dl::error);
    CHECK_THROWS_AS((void)dl::norm(x, std::nan("")), dl::error);
}

TEST_CASE("the float sum of millions of values is accurate to 1e-6 (accumulated in double)") {
    const std::int64_t n = dl_test::quick() ? 1'000'000 : 10'000'000;
    CAPTURE(n);
    const auto x = random<float>({n}, -1, 3, 17);
    long double want = 0, want_sq = 0;
    for (std::int64_t i = 0; i < n; ++i) want += x.data()[i];
    const long double mean = want / static_cast<long double>(n);
    for (std::int64_t i = 0; i < n; ++i) want_sq += (x.data()[i] - mean) * (x.data()[i] - mean);
    const double s = dl::sum(x).item();
    CHECK(std::fabs(s - static_cast<double>(want)) / std::fabs(static_cast<double>(want)) < 1e-6);
    const double m = dl::mean(x).item();
    CHECK(std::fabs(m - static_cast<double>(mean)) / std::fabs(static_cast<double>(mean)) < 1e-6);
    const double v = dl::var(x, {}, false, 0).item();
    const double want_var = static_cast<double>(want_sq / static_cast<long double>(n));
    CHECK(std::fabs(v - want_var) / want_var < 1e-6);
    // A naive float accumulation would be off by far more than 1e-6 at this size: the test has teeth.
    float naive = 0;
    for (std::int64_t i = 0; i < n; ++i) naive += x.data()[i];
    CHECK(std::fabs(naive - static_cast<double>(want)) / std::fabs(static_cast<double>(want)) > 1e-6);
    // Along an axis too: each of 4 outputs sums n / 4 values.
    const auto rows = x.slice(0, 0, n / 4 * 4).reshape({4, n / 4});
    const auto by_row = dl::sum(rows, {1});
    for (std::int64_t r = 0; r < 4; ++r) {
        long double w = 0;
        for (std::int64_t i = 0; i < n / 4; ++i) w += rows(r, i);
        CHECK(std::fabs(by_row(r) - static_cast<double>(w)) / std::fabs(static_cast<double>(w)) < 1e-6);
    }
}

TEST_CASE_TEMPLATE("large reductions (one output split in blocks) match the reference", T, float, double) {
    const std::int64_t n = (1 << 20) + 3;
    const auto x = random<T>({n}, -2, 2, 23);
    const auto v = as_doubles(x);
    const tolerance tol = std::is_same_v<T, float> ? tolerance{1e-6, 0} : tolerance{1e-11, 0};
    auto ref = [&](auto fold) { return reduce_reference(v, x.shape(), {}, false, fold); };
    check_reduction(dl::sum(x), ref(ref_sum), tol, "sum");
    check_reduction(dl::mean(x), ref(ref_mean), tolerance{tol.rel, 1e-9}, "mean");
    check_reduction(dl::var(x), ref([](const auto& s) { return ref_var(s, 1); }), tol, "var");
    check_reduction(dl::std(x, {}, false, 0), ref([](const auto& s) { return std::sqrt(ref_var(s, 0)); }), tol, "std");
    check_reduction(dl::norm(x, 3), ref([](const auto& s) { return ref_norm(s, 3); }), tol, "norm 3");
    check_reduction(dl::logsumexp(x), ref(ref_logsumexp), tol, "logsumexp");
    check_reduction(dl::max(x), ref(ref_max), exact, "max");
    check_reduction(dl::argmin(x), ref(ref_argmin), exact, "argmin");
    check_reduction(dl::all(x), ref(ref_all), exact, "all");
    // var of values with a large common offset: Welford does not cancel catastrophically.
    const auto shifted = dl::eval(x + T(1000));
    check_reduction(dl::var(shifted),
                    reduce_reference(as_doubles(shifted), x.shape(), {}, false,
                                     [](const auto& s) { return ref_var(s, 1); }),
                    tol, "var of x + 1000");
}
