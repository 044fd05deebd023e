// Binary arithmetic on floats against a double-precision scalar reference: + - * / and minimum/maximum
// exact, pow and atan2 within a few dozen ulps; every operator and named function, tensor with tensor
// and with a number on either side, over every size that exercises the SIMD tails and the threaded loop.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

using namespace expr_test;

TEST_CASE_TEMPLATE("+ - * / on float tensors are exact", T, float, double) {
    check_binary_sizes<T, T>("a + b", [](const auto& a, const auto& b) { return a + b; },
                             [](double a, double b) { return a + b; }, -100, 100, -100, 100, exact);
    check_binary_sizes<T, T>("a - b", [](const auto& a, const auto& b) { return a - b; },
                             [](double a, double b) { return a - b; }, -100, 100, -100, 100, exact);
    check_binary_sizes<T, T>("a * b", [](const auto& a, const auto& b) { return a * b; },
                             [](double a, double b) { return a * b; }, -100, 100, -100, 100, exact);
    check_binary_sizes<T, T>("a / b", [](const auto& a, const auto& b) { return a / b; },
                             [](double a, double b) { return a / b; }, -100, 100, 0.5, 100, exact);
}

TEST_CASE_TEMPLATE("named add, sub, mul, div equal the operators", T, float, double) {
    const auto a = random<T>({1025}, -10, 10, 1), b = random<T>({1025}, 1, 10, 2);
    check_binary("add", EXPR_BINARY(dl::add), [](double x, double y) { return x + y; }, a, b, exact);
    check_binary("sub", EXPR_BINARY(dl::sub), [](double x, double y) { return x - y; }, a, b, exact);
    check_binary("mul", EXPR_BINARY(dl::mul), [](double x, double y) { return x * y; }, a, b, exact);
    check_binary("div", EXPR_BINARY(dl::div), [](double x, double y) { return x / y; }, a, b, exact);
    check_unary("add(x, 3)", [](const auto& x) { return dl::add(x, 3); }, [](double x) { return x + 3; }, a, exact);
    check_unary("sub(3, x)", [](const auto& x) { return dl::sub(3, x); }, [](double x) { return 3 - x; }, a, exact);
    check_unary("div(x, 4)", [](const auto& x) { return dl::div(x, 4); }, [](double x) { return x / 4; }, a, exact);
}

TEST_CASE_TEMPLATE("numbers on either side of an operator", T, float, double) {
    check_unary_sizes<T>("2 * x", [](const auto& x) { return T(2) * x; }, [](double x) { return 2 * x; }, -10, 10,
                         exact);
    check_unary_sizes<T>("x * 2", [](const auto& x) { return x * 2; }, [](double x) { return 2 * x; }, -10, 10, exact);
    check_unary_sizes<T>("x - 1", [](const auto& x) { return x - 1; }, [](double x) { return x - 1; }, -10, 10, exact);
    check_unary_sizes<T>("1 - x", [](const auto& x) { return 1 - x; }, [](double x) { return 1 - x; }, -10, 10, exact);
    check_unary_sizes<T>("x + 0.5", [](const auto& x) { return x + 0.5; }, [](double x) { return x + 0.5; }, -10, 10,
                         exact);
    check_unary_sizes<T>("1 / x", [](const auto& x) { return 1 / x; }, [](double x) { return 1 / x; }, 0.1, 10, exact);
    check_unary_sizes<T>("x / 3", [](const auto& x) { return x / 3; }, [](double x) { return x / 3; }, -10, 10, exact);
    check_unary_sizes<T>("10 / x", [](const auto& x) { return 10.0f / x; }, [](double x) { return 10 / x; }, -10, -0.1,
                         exact);
    // A double number meets a float tensor as float: 0.1 is rounded to T first, and the sum to T.
    const double tenth = static_cast<T>(0.1);
    check_unary_sizes<T>("x + 0.1", [](const auto& x) { return x + 0.1; }, [=](double x) { return x + tenth; }, -10,
                         10, exact);
    check_unary_sizes<T>("0.1 * x", [](const auto& x) { return 0.1 * x; }, [=](double x) { return tenth * x; }, -10,
                         10, exact);
}

TEST_CASE_TEMPLATE("minimum and maximum are exact, ties included", T, float, double) {
    // Quantised inputs make a = b frequent.
    check_binary_sizes<T, T>("minimum", EXPR_BINARY(dl::minimum), [](double a, double b) { return std::min(a, b); }, -3,
                             3, -3, 3, exact, 0.5);
    check_binary_sizes<T, T>("maximum", EXPR_BINARY(dl::maximum), [](double a, double b) { return std::max(a, b); }, -3,
                             3, -3, 3, exact, 0.5);
    const auto x = random<T>({100}, -5, 5, 3);
    check_unary("minimum(x, 1)", [](const auto& v) { return dl::minimum(v, 1); },
                [](double v) { return std::min(v, 1.0); }, x, exact);
    check_unary("maximum(0, x)", [](const auto& v) { return dl::maximum(0, v); },
                [](double v) { return std::max(v, 0.0); }, x, exact);
}

TEST_CASE_TEMPLATE("pow is close to std::pow", T, float, double) {
    const tolerance tol = transcendental<T>;
    check_binary_sizes<T, T>("pow", EXPR_BINARY(dl::pow), [](double a, double b) { return std::pow(a, b); }, 0.01, 10,
                             -4, 4, tol);
    // Negative bases with integral exponents are defined; with fractional ones they are NaN.
    check_binary("pow of negative bases", EXPR_BINARY(dl::pow), [](double a, double b) { return std::pow(a, b); },
                 random<T>({1025}, -10, -0.1, 5), random<T>({1025}, -5, 5, 6, 1.0), tol);
    check_binary("pow, fractional exponent of negative base", EXPR_BINARY(dl::pow),
                 [](double a, double b) { return std::pow(a, b); }, random<T>({17}, -10, -0.1, 7),
                 dl::full<T>({17}, T(0.5)), tol);
    const auto x = random<T>({1025}, 0.01, 10, 8);
    check_unary("pow(x, 2)", [](const auto& v) { return dl::pow(v, 2); }, [](double v) { return v * v; }, x, tol);
    check_unary("pow(x, 0.5)", [](const auto& v) { return dl::pow(v, 0.5); }, [](double v) { return std::sqrt(v); },
                x, tol);
    check_unary("pow(2, x)", [](const auto& v) { return dl::pow(2, v); }, [](double v) { return std::exp2(v); }, x,
                tol);
}

TEST_CASE_TEMPLATE("atan2 is close to std::atan2 in all four quadrants", T, float, double) {
    check_binary_sizes<T, T>("atan2", EXPR_BINARY(dl::atan2), [](double y, double x) { return std::atan2(y, x); }, -10,
                             10, -10, 10, transcendental_abs<T>);
    const auto y = random<T>({100}, -10, 10, 9);
    check_unary("atan2(y, 1)", [](const auto& v) { return dl::atan2(v, 1); }, [](double v) { return std::atan(v); },
                y, transcendental<T>);
    check_unary("atan2(1, x)", [](const auto& v) { return dl::atan2(1, v); },
                [](double v) { return std::atan2(1.0, v); }, y, transcendental<T>);
}

TEST_CASE("binary results take the broadcast shape, including rank 0 and empty") {
    for (const dl::Shape& shape : {dl::Shape{}, dl::Shape{0}, dl::Shape{2, 0}, dl::Shape{1}, dl::Shape{3, 4, 5}}) {
        CAPTURE(shape);
        const auto a = random<float>(shape, -2, 2, 1), b = random<float>(shape, 1, 2, 2);
        check_binary("a / b", [](const auto& x, const auto& y) { return x / y; },
                     [](double x, double y) { return x / y; }, a, b, exact);
    }
}
