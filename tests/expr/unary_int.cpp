// Unary ops that mean something on integers and bool, against an integer reference: exact, in the
// tensor's own type (uint8 wraps as C++ conversions do).
#include "check.hpp"

#include <algorithm>
#include <cstdint>

using namespace expr_test;

TEST_CASE_TEMPLATE("unary ops on signed integers", T, std::int32_t, std::int64_t) {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto x = random<T>({n}, -1000, 1000, static_cast<std::uint64_t>(n));
        check_unary("neg", EXPR_UNARY(dl::neg), [](std::int64_t v) { return -v; }, x, exact);
        check_unary("abs", EXPR_UNARY(dl::abs), [](std::int64_t v) { return v < 0 ? -v : v; }, x, exact);
        check_unary("square", EXPR_UNARY(dl::square), [](std::int64_t v) { return v * v; }, x, exact);
        check_unary("relu", EXPR_UNARY(dl::relu), [](std::int64_t v) { return std::max<std::int64_t>(v, 0); }, x,
                    exact);
        check_unary("sign", EXPR_UNARY(dl::sign), [](std::int64_t v) { return (v > 0) - (v < 0); }, x, exact);
        check_unary("floor", EXPR_UNARY(dl::floor), [](std::int64_t v) { return v; }, x, exact);
        check_unary("ceil", EXPR_UNARY(dl::ceil), [](std::int64_t v) { return v; }, x, exact);
        check_unary("round", EXPR_UNARY(dl::round), [](std::int64_t v) { return v; }, x, exact);
        check_unary("isnan", EXPR_UNARY(dl::isnan), [](std::int64_t) { return false; }, x, exact);
        check_unary("isfinite", EXPR_UNARY(dl::isfinite), [](std::int64_t) { return true; }, x, exact);
        check_unary("logical_not", EXPR_UNARY(dl::logical_not), [](std::int64_t v) { return v == 0; },
                    random<T>({n}, -2, 2, 5), exact);
        static_assert(std::is_same_v<dl::value_t<decltype(dl::abs(x))>, T>);
        static_assert(std::is_same_v<dl::value_t<decltype(dl::floor(x))>, T>);
    }
    // Values beyond float's 24-bit mantissa survive the identity ops exactly.
    if constexpr (sizeof(T) == 8) {
        const std::int64_t big = (std::int64_t{1} << 53) + 1;
        auto x = dl::tensor<T>({big, -big, 3});
        check_unary("abs", EXPR_UNARY(dl::abs), [](std::int64_t v) { return v < 0 ? -v : v; }, x, exact);
        CHECK(dl::Tensor<T>(dl::round(x))(0) == big);
        CHECK(dl::Tensor<T>(dl::neg(x))(1) == big);
    }
}

TEST_CASE("unary ops on uint8 stay in uint8, wrapping as C++ does") {
    using T = std::uint8_t;
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto x = random<T>({n}, 0, 255, static_cast<std::uint64_t>(n));
        check_unary("neg", EXPR_UNARY(dl::neg), [](int v) { return static_cast<T>(-v); }, x, exact);
        check_unary("abs", EXPR_UNARY(dl::abs), [](int v) { return v; }, x, exact);
        check_unary("square", EXPR_UNARY(dl::square), [](int v) { return static_cast<T>(v * v); }, x, exact);
        check_unary("relu", EXPR_UNARY(dl::relu), [](int v) { return v; }, x, exact);
        check_unary("sign", EXPR_UNARY(dl::sign), [](int v) { return v > 0; }, x, exact);
        check_unary("floor", EXPR_UNARY(dl::floor), [](int v) { return v; }, x, exact);
        check_unary("logical_not", EXPR_UNARY(dl::logical_not), [](int v) { return v == 0; }, x, exact);
        static_assert(std::is_same_v<dl::value_t<decltype(dl::square(x))>, T>);
    }
}

TEST_CASE("unary ops on bool") {
    const auto x = dl::tensor<bool>({true, false, false, true, true});
    check_unary("logical_not", EXPR_UNARY(dl::logical_not), [](bool v) { return !v; }, x, exact);
    check_unary("operator!", [](const auto& v) { return !v; }, [](bool v) { return !v; }, x, exact);
    check_unary("sign", EXPR_UNARY(dl::sign), [](bool v) { return v; }, x, exact);
    check_unary("abs", EXPR_UNARY(dl::abs), [](bool v) { return v; }, x, exact);
    check_unary("isnan", EXPR_UNARY(dl::isnan), [](bool) { return false; }, x, exact);
    check_unary("isfinite", EXPR_UNARY(dl::isfinite), [](bool) { return true; }, x, exact);
}
