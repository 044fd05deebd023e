// Binary arithmetic on integer tensors: exact, in the promoted integer type. Division truncates
// toward zero, division by zero gives 0 and INT_MIN / -1 wraps (functors.hpp); uint8 wraps as C++
// conversions do.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

using namespace expr_test;

namespace {
/// functors.hpp's integer division, written out.
std::int64_t int_div(std::int64_t a, std::int64_t b) { return b == 0 ? 0 : a / b; }
}  // namespace

TEST_CASE_TEMPLATE("+ - * / minimum maximum on signed integers are exact", T, std::int32_t, std::int64_t) {
    auto ref = [](auto op) { return [op](std::int64_t a, std::int64_t b) { return static_cast<T>(op(a, b)); }; };
    check_binary_sizes<T, T>("a + b", [](const auto& a, const auto& b) { return a + b; },
                             ref([](std::int64_t a, std::int64_t b) { return a + b; }), -1000, 1000, -1000, 1000,
                             exact);
    check_binary_sizes<T, T>("a - b", [](const auto& a, const auto& b) { return a - b; },
                             ref([](std::int64_t a, std::int64_t b) { return a - b; }), -1000, 1000, -1000, 1000,
                             exact);
    check_binary_sizes<T, T>("a * b", [](const auto& a, const auto& b) { return a * b; },
                             ref([](std::int64_t a, std::int64_t b) { return a * b; }), -1000, 1000, -1000, 1000,
                             exact);
    // Divisors in -5..5: zeros, negatives and inexact quotients.
    check_binary_sizes<T, T>("a / b", [](const auto& a, const auto& b) { return a / b; }, ref(int_div), -1000, 1000, -5,
                             5, exact);
    check_binary_sizes<T, T>("minimum", EXPR_BINARY(dl::minimum),
                             ref([](std::int64_t a, std::int64_t b) { return std::min(a, b); }), -5, 5, -5, 5, exact);
    check_binary_sizes<T, T>("maximum", EXPR_BINARY(dl::maximum),
                             ref([](std::int64_t a, std::int64_t b) { return std::max(a, b); }), -5, 5, -5, 5, exact);
}

TEST_CASE_TEMPLATE("integer division truncates toward zero and gives 0 for a zero divisor", T, std::int32_t,
                   std::int64_t) {
    const auto a = dl::tensor<T>({7, -7, 7, -7, 0, 5, -5, 1, 0, -1});
    const auto b = dl::tensor<T>({2, 2, -2, -2, 3, 0, 0, 1, 0, 1});
    CHECK(to_vector(dl::eval(a / b)) == std::vector<T>{3, -3, -3, 3, 0, 0, 0, 1, 0, -1});
    CHECK(to_vector(dl::eval(a / 0)) == std::vector<T>(10, 0));
    CHECK(to_vector(dl::eval(100 / b)) == std::vector<T>{50, 50, -50, -50, 33, 0, 0, 100, 0, 100});
    static_assert(std::is_same_v<dl::value_t<decltype(a / b)>, T>);
}

TEST_CASE_TEMPLATE("numbers on either side of integer tensors keep the integer type", T, std::int32_t, std::int64_t) {
    const auto x = random<T>({1025}, -100, 100, 3);
    static_assert(std::is_same_v<dl::value_t<decltype(x * 2)>, T>);
    static_assert(std::is_same_v<dl::value_t<decltype(3 - x)>, T>);
    check_unary("x * 2", [](const auto& v) { return v * 2; }, [](std::int64_t v) { return 2 * v; }, x, exact);
    check_unary("3 - x", [](const auto& v) { return 3 - v; }, [](std::int64_t v) { return 3 - v; }, x, exact);
    check_unary("x / 7", [](const auto& v) { return v / 7; }, [](std::int64_t v) { return v / 7; }, x, exact);
    check_unary("1000 / x", [](const auto& v) { return 1000 / v; }, [](std::int64_t v) { return int_div(1000, v); }, x,
                exact);
    check_unary("x + 1", [](const auto& v) { return v + 1; }, [](std::int64_t v) { return v + 1; }, x, exact);
}

TEST_CASE("int64 arithmetic keeps all 64 bits") {
    const std::int64_t big = (std::int64_t{1} << 53) + 1;  // not representable as double
    const auto x = dl::tensor<std::int64_t>({big, -big});
    CHECK(to_vector(dl::eval(x + 2)) == std::vector<std::int64_t>{big + 2, -big + 2});
    CHECK(to_vector(dl::eval(x * 3)) == std::vector<std::int64_t>{3 * big, -3 * big});
    CHECK(to_vector(dl::eval(x / 3)) == std::vector<std::int64_t>{big / 3, -big / 3});
    CHECK(to_vector(dl::eval(dl::maximum(x, big - 1))) == std::vector<std::int64_t>{big, big - 1});
    CHECK(to_vector(dl::eval(x == big)) == std::vector<bool>{true, false});
}

TEST_CASE("uint8 arithmetic wraps modulo 256 and never goes negative") {
    using u8 = std::uint8_t;
    check_binary_sizes<u8, u8>("a + b", [](const auto& a, const auto& b) { return a + b; },
                               [](int a, int b) { return static_cast<u8>(a + b); }, 0, 255, 0, 255, exact);
    check_binary_sizes<u8, u8>("a - b", [](const auto& a, const auto& b) { return a - b; },
                               [](int a, int b) { return static_cast<u8>(a - b); }, 0, 255, 0, 255, exact);
    check_binary_sizes<u8, u8>("a * b", [](const auto& a, const auto& b) { return a * b; },
                               [](int a, int b) { return static_cast<u8>(a * b); }, 0, 255, 0, 255, exact);
    // Divisors below 255 (255 is tested on its own below).
    check_binary_sizes<u8, u8>("a / b", [](const auto& a, const auto& b) { return a / b; },
                               [](int a, int b) { return b == 0 ? 0 : a / b; }, 0, 255, 0, 20, exact);
    check_binary_sizes<u8, u8>("minimum", EXPR_BINARY(dl::minimum), [](int a, int b) { return std::min(a, b); }, 0, 255,
                               0, 255, exact);
    check_binary_sizes<u8, u8>("maximum", EXPR_BINARY(dl::maximum), [](int a, int b) { return std::max(a, b); }, 0, 255,
                               0, 255, exact);
    const auto x = dl::tensor<u8>({0, 1, 200, 255});
    CHECK(to_vector(dl::eval(x + 100)) == std::vector<u8>{100, 101, 44, 99});
    CHECK(to_vector(dl::eval(x - 1)) == std::vector<u8>{255, 0, 199, 254});
}

// Bug: functors.hpp div tests `b == V(-1)` to special-case INT_MIN / -1, but for uint8 V(-1) is 255, so
// every division by 255 returns -a (mod 256) instead of a / 255.
TEST_CASE("uint8 division by 255") {
    using u8 = std::uint8_t;
    const auto a = dl::tensor<u8>({0, 1, 10, 200, 254, 255});
    const auto b = dl::full<u8>({6}, 255);
    CHECK(to_vector(dl::eval(a / b)) == std::vector<u8>{0, 0, 0, 0, 0, 1});
    CHECK(to_vector(dl::eval(a / 255)) == std::vector<u8>{0, 0, 0, 0, 0, 1});
}

// INT_MIN / -1 is documented to wrap (to INT_MIN). The functor computes it as 0 - a, which is signed
// overflow (UB) in int: run it in a child so a sanitizer build reports one failed check, not an abort.
TEST_CASE_TEMPLATE("INT_MIN / -1 wraps to INT_MIN", T, std::int32_t, std::int64_t) {
    const int code = dl_test::exit_code_in_child([] {
        dl::Context ctx({.seed = 0, .threads = 1});
        const T lowest = std::numeric_limits<T>::lowest();
        const auto a = dl::tensor<T>({lowest, lowest, 6}, ctx);
        const auto b = dl::tensor<T>({-1, 1, -1}, ctx);
        const auto q = to_vector(dl::eval(a / b));
        return q == std::vector<T>{lowest, lowest, -6} ? 0 : 1;
    });
    CHECK(code == 0);
}

TEST_CASE("mixed integer types promote to the wider type") {
    const auto a = dl::tensor<std::uint8_t>({200, 250});
    const auto b = dl::tensor<std::int32_t>({100, -300});
    auto s = a + b;
    static_assert(std::is_same_v<dl::value_t<decltype(s)>, std::int32_t>);
    CHECK(to_vector(dl::eval(s)) == std::vector<std::int32_t>{300, -50});
    const auto c = dl::tensor<std::int64_t>({std::int64_t{1} << 40, 1});
    auto p = b * c;
    static_assert(std::is_same_v<dl::value_t<decltype(p)>, std::int64_t>);
    CHECK(to_vector(dl::eval(p)) == std::vector<std::int64_t>{100 * (std::int64_t{1} << 40), -300});
}

TEST_CASE("bool arithmetic: + is or, * is and") {
    const auto a = dl::tensor<bool>({false, false, true, true});
    const auto b = dl::tensor<bool>({false, true, false, true});
    static_assert(std::is_same_v<dl::value_t<decltype(a + b)>, bool>);
    CHECK(to_vector(dl::eval(a + b)) == std::vector<bool>{false, true, true, true});
    CHECK(to_vector(dl::eval(a * b)) == std::vector<bool>{false, false, false, true});
    CHECK(to_vector(dl::eval(dl::maximum(a, b))) == std::vector<bool>{false, true, true, true});
    CHECK(to_vector(dl::eval(dl::minimum(a, b))) == std::vector<bool>{false, false, false, true});
}

TEST_CASE("pow and atan2 on integer tensors compute in float") {
    const auto a = dl::tensor<std::int32_t>({2, 3, -2, 10});
    const auto b = dl::tensor<std::int32_t>({10, 0, 3, -1});
    static_assert(std::is_same_v<dl::value_t<decltype(dl::pow(a, b))>, float>);
    check_binary("pow", EXPR_BINARY(dl::pow), [](double x, double y) { return std::pow(x, y); }, a, b,
                 transcendental<float>);
    check_binary("atan2", EXPR_BINARY(dl::atan2), [](double x, double y) { return std::atan2(x, y); }, a, b,
                 transcendental<float>);
}
