// where and clamp: exact against a scalar reference for float, double and integer tensors, with
// numbers on either side, conditions of any type, and broadcasting of every operand.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

using namespace expr_test;

TEST_CASE_TEMPLATE("where selects elementwise, with numbers on either side", T, float, double, std::int32_t,
                   std::int64_t) {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto a = random<T>({n}, -100, 100, 1), b = random<T>({n}, -100, 100, 2);
        const auto c = random<bool>({n}, 0, 1, 3);
        const auto va = to_vector(a), vb = to_vector(b);
        const auto vc = to_vector(c);
        auto in = [&](std::size_t i) { return "c=" + show<bool>(vc[i]) + " a=" + show(va[i]) + " b=" + show(vb[i]); };
        check_elements(
            dl::Tensor<T>(dl::where(c, a, b)), [&](std::size_t i) { return vc[i] ? va[i] : vb[i]; }, exact,
            "where(bool, a, b)", in);
        // A comparison as the condition (the SIMD mask path for floats).
        check_elements(
            dl::Tensor<T>(dl::where(a > b, a, b)), [&](std::size_t i) { return std::max(va[i], vb[i]); }, exact,
            "where(a > b, a, b)", in);
        check_elements(
            dl::Tensor<T>(dl::where(a > 0, a, 0)), [&](std::size_t i) { return va[i] > 0 ? va[i] : 0; }, exact,
            "where(a > 0, a, 0)", in);
        check_elements(
            dl::Tensor<T>(dl::where(c, -1, b)), [&](std::size_t i) { return vc[i] ? -1 : vb[i]; }, exact,
            "where(c, -1, b)", in);
        check_elements(
            dl::Tensor<T>(dl::where(c, T(7), T(9))), [&](std::size_t i) { return vc[i] ? 7 : 9; }, exact,
            "where(c, 7, 9)", in);
    }
}

TEST_CASE_TEMPLATE("where reads a bool tensor as a vector mask: broadcast either way, strided, odd tails", T, float, double) {
    // A [rows, 1] condition broadcasts along rows (inner stride 0), a [cols] one down columns (stride
    // 1); a transposed one has neither and takes the scalar path. All against the scalar definition.
    for (const std::int64_t cols : {1, 7, 16, 17, 40}) {
        CAPTURE(cols);
        const std::int64_t rows = 5;
        const auto a = random<T>({rows, cols}, -100, 100, 1), b = random<T>({rows, cols}, -100, 100, 2);
        const auto per_row = random<bool>({rows, 1}, 0, 1, 3), per_col = random<bool>({cols}, 0, 1, 4);
        const auto transposed = random<bool>({cols, rows}, 0, 1, 5).transpose(0, 1);
        const dl::Tensor<T> by_row = dl::where(per_row, a, b), by_col = dl::where(per_col, a, T(3)),
                            by_view = dl::where(transposed, T(-1), b);
        const dl::Tensor<bool> mask = a > b;  // a comparison stored as bools
        for (std::int64_t i = 0; i < rows; ++i)
            for (std::int64_t j = 0; j < cols; ++j) {
                CHECK(by_row(i, j) == (per_row(i, 0) ? a(i, j) : b(i, j)));
                CHECK(by_col(i, j) == (per_col(j) ? a(i, j) : T(3)));
                CHECK(by_view(i, j) == (transposed(i, j) ? T(-1) : b(i, j)));
                CHECK(mask(i, j) == (a(i, j) > b(i, j)));
            }
    }
}

TEST_CASE("where: a non-bool condition is true where nonzero; the result type promotes a and b") {
    const auto cond = dl::tensor<float>({0.0f, 2.0f, -0.5f, 0.0f});
    const auto a = dl::tensor<std::int32_t>({1, 2, 3, 4});
    const auto b = dl::tensor<float>({10.5f, 20.5f, 30.5f, 40.5f});
    auto r = dl::where(cond, a, b);
    static_assert(std::is_same_v<dl::value_t<decltype(r)>, float>);
    CHECK(to_vector(dl::eval(r)) == std::vector<float>{10.5f, 2, 3, 40.5f});
    auto two_numbers = dl::where(a > 2, 1, 0.5);  // int and double numbers: double
    static_assert(std::is_same_v<dl::value_t<decltype(two_numbers)>, double>);
    CHECK(to_vector(dl::eval(two_numbers)) == std::vector<double>{0.5, 0.5, 1, 1});
    // The condition broadcasts against the values.
    const auto row_mask = dl::tensor<bool>({true, false, true});
    const auto m = random<float>({2, 3}, -1, 1, 4);
    dl::Tensor<float> picked = dl::where(row_mask, m, 100.0f);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) CHECK(picked(i, j) == (j != 1 ? m(i, j) : 100.0f));
}

TEST_CASE_TEMPLATE("clamp is min(max(x, lo), hi)", T, float, double, std::int32_t, std::int64_t, std::uint8_t) {
    const double lo = std::is_unsigned_v<T> ? 0 : -50;
    check_unary_sizes<T>("clamp(x, 10, 20)", [](const auto& x) { return dl::clamp(x, 10, 20); },
                         [](double x) { return std::min(std::max(x, 10.0), 20.0); }, lo, 50, exact);
    const auto x = random<T>({33}, lo, 50, 9);
    static_assert(std::is_same_v<dl::value_t<decltype(dl::clamp(x, 1, 2))>, T>);
    check_unary("clamp(x, 5, 5)", [](const auto& v) { return dl::clamp(v, 5, 5); }, [](double) { return 5; }, x,
                exact);
    if constexpr (std::is_floating_point_v<T>) {
        check_unary("clamp(x, -0.5, 0.25)", [](const auto& v) { return dl::clamp(v, -0.5, 0.25); },
                    [](double v) { return std::min(std::max(v, -0.5), 0.25); }, random<T>({33}, -1, 1, 10), exact);
        check_unary("clamp(x, -inf, 0)", [](const auto& v) { return dl::clamp(v, -inf, 0); },
                    [](double v) { return std::min(v, 0.0); }, x, exact);
    }
}
