// Comparisons and logical ops: exact against a scalar reference, for float, double, integer and bool
// tensors, with numbers on either side; their results are bool.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

using namespace expr_test;

TEST_CASE_TEMPLATE("comparisons give bool and are exact, ties included", T, float, double, std::int32_t, std::int64_t,
                   std::uint8_t) {
    const double lo = std::is_unsigned_v<T> ? 0 : -3;
    // Quantised inputs (integers for integer types) make a = b frequent.
    check_binary_sizes<T, T>("a == b", [](const auto& a, const auto& b) { return a == b; },
                             [](double a, double b) { return a == b; }, lo, 3, lo, 3, exact, 1.0);
    check_binary_sizes<T, T>("a != b", [](const auto& a, const auto& b) { return a != b; },
                             [](double a, double b) { return a != b; }, lo, 3, lo, 3, exact, 1.0);
    check_binary_sizes<T, T>("a < b", [](const auto& a, const auto& b) { return a < b; },
                             [](double a, double b) { return a < b; }, lo, 3, lo, 3, exact, 0.5);
    check_binary_sizes<T, T>("a <= b", [](const auto& a, const auto& b) { return a <= b; },
                             [](double a, double b) { return a <= b; }, lo, 3, lo, 3, exact, 0.5);
    check_binary_sizes<T, T>("a > b", [](const auto& a, const auto& b) { return a > b; },
                             [](double a, double b) { return a > b; }, lo, 3, lo, 3, exact, 0.5);
    check_binary_sizes<T, T>("a >= b", [](const auto& a, const auto& b) { return a >= b; },
                             [](double a, double b) { return a >= b; }, lo, 3, lo, 3, exact, 0.5);
    const auto x = random<T>({100}, lo, 3, 4, 1.0);
    static_assert(std::is_same_v<dl::value_t<decltype(x < x)>, bool>);
    check_unary("x < 2", [](const auto& v) { return v < 2; }, [](double v) { return v < 2; }, x, exact);
    check_unary("2 < x", [](const auto& v) { return 2 < v; }, [](double v) { return 2 < v; }, x, exact);
    check_unary("x == 1", [](const auto& v) { return v == 1; }, [](double v) { return v == 1; }, x, exact);
    check_unary("1 != x", [](const auto& v) { return 1 != v; }, [](double v) { return 1 != v; }, x, exact);
    check_unary("x >= 2", [](const auto& v) { return v >= 2; }, [](double v) { return v >= 2; }, x, exact);
    check_unary("0 <= x", [](const auto& v) { return 0 <= v; }, [](double v) { return 0 <= v; }, x, exact);
}

TEST_CASE("comparisons between different types compare the promoted values") {
    const auto i = dl::tensor<std::int32_t>({1, 2, 3, -4});
    const auto f = dl::tensor<float>({1.0f, 2.5f, 2.999f, -4.0f});
    check_binary("int == float", [](const auto& a, const auto& b) { return a == b; },
                 [](double a, double b) { return a == b; }, i, f, exact);
    check_binary("int < float", [](const auto& a, const auto& b) { return a < b; },
                 [](double a, double b) { return a < b; }, i, f, exact);
    // A fractional number against an int tensor is not truncated to an int.
    check_unary("int < 1.5", [](const auto& v) { return v < 1.5; }, [](double v) { return v < 1.5; }, i, exact);
    check_unary("int == 2.5", [](const auto& v) { return v == 2.5; }, [](double v) { return v == 2.5; }, i, exact);
    // A float tensor against a number that float cannot hold exactly: the number is rounded to float.
    const auto big = dl::tensor<float>({16777216.0f});
    CHECK(dl::Tensor<bool>(big == 16777217.0)(0));
}

TEST_CASE("comparisons of bool tensors") {
    const auto a = random<bool>({1025}, 0, 1, 1), b = random<bool>({1025}, 0, 1, 2);
    check_binary("a == b", [](const auto& x, const auto& y) { return x == y; },
                 [](bool x, bool y) { return x == y; }, a, b, exact);
    check_binary("a != b", [](const auto& x, const auto& y) { return x != y; },
                 [](bool x, bool y) { return x != y; }, a, b, exact);
    check_binary("a < b", [](const auto& x, const auto& y) { return x < y; }, [](bool x, bool y) { return x < y; },
                 a, b, exact);
    check_binary("a >= b", [](const auto& x, const auto& y) { return x >= y; },
                 [](bool x, bool y) { return x >= y; }, a, b, exact);
}

// An integer number meets an integer tensor in a comparison as an int64: converted to the tensor's
// element type it wrapped (`x > -1` on uint8 compared with 255, `m == 2` on bool with true).
TEST_CASE("comparing with a number outside the tensor's range compares the values") {
    const auto x = dl::tensor<std::uint8_t>({0, 1, 255});
    CHECK(to_vector(dl::eval(x > -1)) == std::vector<bool>{true, true, true});
    CHECK(to_vector(dl::eval(x == 256)) == std::vector<bool>{false, false, false});
    CHECK(to_vector(dl::eval(x < 256)) == std::vector<bool>{true, true, true});
    const auto y = dl::tensor<std::int32_t>({0, -5});
    CHECK(to_vector(dl::eval(y < std::int64_t{3'000'000'000})) == std::vector<bool>{true, true});
    const auto m = dl::tensor<bool>({true, false});
    CHECK(to_vector(dl::eval(m == 2)) == std::vector<bool>{false, false});
    CHECK(to_vector(dl::eval(m < 2)) == std::vector<bool>{true, true});
}

TEST_CASE_TEMPLATE("logical and, or, xor, not treat nonzero as true", T, float, double, std::int32_t, std::uint8_t,
                   bool) {
    const auto a = random<T>({1025}, 0, 2, 1, 1.0), b = random<T>({1025}, 0, 2, 2, 1.0);
    check_binary("logical_and", EXPR_BINARY(dl::logical_and), [](double x, double y) { return x != 0 && y != 0; }, a, b,
                 exact);
    check_binary("logical_or", EXPR_BINARY(dl::logical_or), [](double x, double y) { return x != 0 || y != 0; }, a, b,
                 exact);
    check_binary("logical_xor", EXPR_BINARY(dl::logical_xor), [](double x, double y) { return (x != 0) != (y != 0); },
                 a, b, exact);
    static_assert(std::is_same_v<dl::value_t<decltype(dl::logical_and(a, b))>, bool>);
    check_unary("logical_or(x, 0)", [](const auto& v) { return dl::logical_or(v, 0); },
                [](double v) { return v != 0; }, a, exact);
    check_unary("logical_and(1, x)", [](const auto& v) { return dl::logical_and(1, v); },
                [](double v) { return v != 0; }, a, exact);
}

TEST_CASE("logical ops mix types, and negative or fractional values count as true") {
    const auto f = dl::tensor<float>({0.0f, -0.0f, 0.25f, -3.0f, 0.0f});
    const auto i = dl::tensor<std::int64_t>({1, 1, 0, -7, 0});
    check_binary("logical_and(float, int64)", EXPR_BINARY(dl::logical_and),
                 [](double x, double y) { return x != 0 && y != 0; }, f, i, exact);
    check_binary("logical_xor(float, int64)", EXPR_BINARY(dl::logical_xor),
                 [](double x, double y) { return (x != 0) != (y != 0); }, f, i, exact);
}
