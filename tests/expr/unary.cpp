// Unary elementwise ops that are exact in floating point (arithmetic, rounding, sign, predicates)
// against a double-precision scalar reference rounded to the element type, over every size that
// exercises the SIMD tails and the threaded loop.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

using namespace expr_test;

namespace {

double sign_ref(double x) { return x > 0 ? 1 : x < 0 ? -1 : x; }

}  // namespace

TEST_CASE_TEMPLATE("exact unary ops on floats equal the correctly rounded reference", T, float, double) {
    check_unary_sizes<T>("neg", EXPR_UNARY(dl::neg), [](double x) { return -x; }, -100, 100, exact);
    check_unary_sizes<T>("operator-", [](const auto& x) { return -x; }, [](double x) { return -x; }, -100, 100, exact);
    check_unary_sizes<T>("abs", EXPR_UNARY(dl::abs), [](double x) { return std::fabs(x); }, -100, 100, exact);
    check_unary_sizes<T>("square", EXPR_UNARY(dl::square), [](double x) { return x * x; }, -100, 100, exact);
    // sqrt and 1/x: double rounding through double is innocuous, so the reference is exact.
    check_unary_sizes<T>("sqrt", EXPR_UNARY(dl::sqrt), [](double x) { return std::sqrt(x); }, 0, 1000, exact);
    check_unary_sizes<T>("reciprocal", EXPR_UNARY(dl::reciprocal), [](double x) { return 1 / x; }, 0.01, 100, exact);
    check_unary_sizes<T>("reciprocal of negatives", EXPR_UNARY(dl::reciprocal), [](double x) { return 1 / x; }, -100,
                         -0.01, exact);
    check_unary_sizes<T>("relu", EXPR_UNARY(dl::relu), [](double x) { return std::max(x, 0.0); }, -10, 10, exact);
    check_unary_sizes<T>(
        "leaky_relu(x, 0.25)", [](const auto& x) { return dl::leaky_relu(x, 0.25); },
        [](double x) { return x >= 0 ? x : 0.25 * x; }, -10, 10, exact);
    // Multiples of 1/4 give exact halves (ties) and integers as well as generic values.
    for (const double quantum : {0.0, 0.25}) {
        CAPTURE(quantum);
        check_unary_sizes<T>("floor", EXPR_UNARY(dl::floor), [](double x) { return std::floor(x); }, -20, 20, exact,
                             quantum);
        check_unary_sizes<T>("ceil", EXPR_UNARY(dl::ceil), [](double x) { return std::ceil(x); }, -20, 20, exact,
                             quantum);
        check_unary_sizes<T>("round", EXPR_UNARY(dl::round), [](double x) { return std::round(x); }, -20, 20, exact,
                             quantum);
        check_unary_sizes<T>("sign", EXPR_UNARY(dl::sign), sign_ref, -3, 3, exact, quantum == 0 ? 0.5 : quantum);
    }
}

TEST_CASE_TEMPLATE("round is half away from zero, also next to the halves", T, float, double) {
    const T below_half = std::nextafter(T(0.5), T(0));
    const std::vector<double> x = {0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, below_half, -below_half, 0.0, -0.0,
                                   1e-30, std::nextafter(T(1.5), T(1)), std::ldexp(1.0, 23) + 1, 1e20};
    for (const bool strided : {false, true}) {
        CAPTURE(strided);
        const auto t = strided ? spread(from_values<T>(x)) : from_values<T>(x);
        check_unary("round", EXPR_UNARY(dl::round), [](double v) { return std::round(v); }, t, exact);
    }
}

TEST_CASE_TEMPLATE("predicates on floats give bool", T, float, double) {
    const std::vector<double> x = {0.0, -0.0, 1.0, -2.5, 1e30, -1e-300, inf, -inf, qnan, -qnan, 3.0, 7.0, qnan, inf,
                                   0.5, -7.0, 1.0, 2.0};
    for (const bool strided : {false, true}) {
        CAPTURE(strided);
        const auto t = strided ? spread(from_values<T>(x)) : from_values<T>(x);
        check_unary("isnan", EXPR_UNARY(dl::isnan), [](double v) { return std::isnan(v); }, t, exact);
        check_unary("isfinite", EXPR_UNARY(dl::isfinite), [](double v) { return std::isfinite(v); }, t, exact);
        check_unary("logical_not", EXPR_UNARY(dl::logical_not), [](double v) { return v == 0; }, t, exact);
        check_unary("operator!", [](const auto& v) { return !v; }, [](double v) { return v == 0; }, t, exact);
        static_assert(std::is_same_v<dl::value_t<decltype(dl::isnan(t))>, bool>);
        static_assert(std::is_same_v<dl::value_t<decltype(dl::isfinite(t))>, bool>);
        static_assert(std::is_same_v<dl::value_t<decltype(!t)>, bool>);
    }
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto t = random<T>({n}, -1, 1, 3, 0.5);  // zeros among them
        check_unary("logical_not", EXPR_UNARY(dl::logical_not), [](double v) { return v == 0; }, t, exact);
        check_unary("isfinite", EXPR_UNARY(dl::isfinite), [](double v) { return std::isfinite(v); }, t, exact);
    }
}

TEST_CASE("unary results have the input's shape, including rank 0 and empty") {
    for (const dl::Shape& shape : {dl::Shape{}, dl::Shape{0}, dl::Shape{3, 0, 2}, dl::Shape{1}, dl::Shape{2, 3, 4}}) {
        CAPTURE(shape);
        const auto x = random<float>(shape, -2, 2, 11);
        check_unary("exp", EXPR_UNARY(dl::exp), [](double v) { return std::exp(v); }, x, transcendental<float>);
        check_unary("abs", EXPR_UNARY(dl::abs), [](double v) { return std::fabs(v); }, x, exact);
    }
}
