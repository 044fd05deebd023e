// NaN, infinities and signed zeros through binary ops, where and clamp, on the SIMD path (contiguous
// operands) and on the scalar path (strided operands): NaN in gives NaN out for arithmetic, minimum,
// maximum and clamp keep NaN, comparisons with NaN are false (!= true), and C99's limits of pow and
// atan2 hold; integer ops have no NaN.
#include "special_check.hpp"

#include <cstdint>

using namespace expr_test;

TEST_CASE_TEMPLATE("NaN and infinity through binary ops", T, float, double) {
    check_binary_specials<T>("add", [](const auto& a, const auto& b) { return a + b; },
                      std::vector<binary_special>{{qnan, 1, qnan}, {1, qnan, qnan}, {inf, -inf, qnan}, {inf, 1, inf}});
    check_binary_specials<T>("sub", [](const auto& a, const auto& b) { return a - b; },
                      std::vector<binary_special>{{qnan, 1, qnan}, {inf, inf, qnan}, {-inf, 1, -inf}});
    check_binary_specials<T>("mul", [](const auto& a, const auto& b) { return a * b; },
                      std::vector<binary_special>{{qnan, 0, qnan}, {inf, 0, qnan}, {-inf, 2, -inf}, {inf, -inf, -inf}});
    check_binary_specials<T>("div", [](const auto& a, const auto& b) { return a / b; },
                      std::vector<binary_special>{
                          {1, 0, inf}, {-1, 0, -inf}, {1, -0.0, -inf}, {0, 0, qnan}, {inf, inf, qnan}, {1, inf, 0},
                          {qnan, 1, qnan}});
    // NaN in the second operand of minimum/maximum (the first is in its own test case below).
    check_binary_specials<T>("minimum", EXPR_BINARY(dl::minimum),
                             std::vector<binary_special>{{1, qnan, qnan}, {-inf, 1, -inf}, {inf, qnan, qnan}}, exact);
    check_binary_specials<T>("maximum", EXPR_BINARY(dl::maximum),
                             std::vector<binary_special>{{1, qnan, qnan}, {inf, 1, inf}, {-inf, qnan, qnan}}, exact);
    check_binary_specials<T>("pow", EXPR_BINARY(dl::pow),
                      std::vector<binary_special>{
                          {qnan, 2, qnan}, {2, qnan, qnan}, {2, inf, inf}, {0.5, inf, 0}, {2, -inf, 0}, {inf, -1, 0},
                          {inf, 2, inf}, {-1, 0.5, qnan}});
    check_binary_specials<T>("atan2", EXPR_BINARY(dl::atan2),
                      std::vector<binary_special>{{qnan, 1, qnan}, {1, qnan, qnan}, {1, 0, pi / 2}, {-1, 0, -pi / 2}});
    check_binary_specials<T>("eq", [](const auto& a, const auto& b) { return a == b; },
                      std::vector<binary_special>{{qnan, qnan, 0}, {qnan, 1, 0}, {inf, inf, 1}, {0.0, -0.0, 1}}, exact);
    check_binary_specials<T>("ne", [](const auto& a, const auto& b) { return a != b; },
                      std::vector<binary_special>{{qnan, qnan, 1}, {1, qnan, 1}, {inf, inf, 0}}, exact);
    check_binary_specials<T>("lt", [](const auto& a, const auto& b) { return a < b; },
                      std::vector<binary_special>{{qnan, 1, 0}, {1, qnan, 0}, {-inf, inf, 1}, {-0.0, 0.0, 0}}, exact);
    check_binary_specials<T>("ge", [](const auto& a, const auto& b) { return a >= b; },
                      std::vector<binary_special>{{qnan, 1, 0}, {1, qnan, 0}, {inf, inf, 1}}, exact);
    check_binary_specials<T>("logical_and", EXPR_BINARY(dl::logical_and),
                      std::vector<binary_special>{{qnan, 1, 1}, {qnan, 0, 0}, {inf, -inf, 1}}, exact);
}

TEST_CASE_TEMPLATE("clamp and where keep NaN", T, float, double) {
    check_specials<T>("clamp(x, 0, 1)", [](const auto& x) { return dl::clamp(x, 0, 1); },
                      {{qnan, qnan}, {inf, 1}, {-inf, 0}, {0.5, 0.5}}, exact);
    check_specials<T>("where(x > 0, x, -x)", [](const auto& x) { return dl::where(x > 0, x, -x); },
                      {{qnan, qnan}, {-inf, inf}, {inf, inf}}, exact);
}

// Bug: simd::is_nan(x) is `x != x`, but xsimd 8's AVX operator!= compares with _CMP_NEQ_OQ (ordered),
// which is false when either lane is NaN. So on the SIMD path isnan masks are all false: minimum and
// maximum lose a NaN in their first operand, and where(isnan(x), ...) / where(x != x, ...) never pick
// the NaN branch. The scalar path (strided operands) is right.
TEST_CASE_TEMPLATE("NaN masks on the SIMD path: isnan, !=, and minimum/maximum with NaN first", T,
                   float, double) {
    check_binary_specials<T>("minimum", EXPR_BINARY(dl::minimum),
                             std::vector<binary_special>{{qnan, 1, qnan}, {qnan, qnan, qnan}, {qnan, -inf, qnan}},
                             exact);
    check_binary_specials<T>("maximum", EXPR_BINARY(dl::maximum),
                             std::vector<binary_special>{{qnan, 1, qnan}, {qnan, qnan, qnan}, {qnan, inf, qnan}},
                             exact);
    check_specials<T>("where(isnan(x), 0, x)", [](const auto& x) { return dl::where(dl::isnan(x), 0, x); },
                      {{qnan, 0}, {inf, inf}, {2, 2}}, exact);
    check_specials<T>("where(x != x, 0, x)", [](const auto& x) { return dl::where(x != x, 0, x); },
                      {{qnan, 0}, {inf, inf}, {2, 2}}, exact);
    check_binary_specials<T>("where(a != b, b, b + 1)",
                             [](const auto& a, const auto& b) { return dl::where(a != b, b, b + 1); },
                             std::vector<binary_special>{{qnan, 1, 1}, {2, 2, 3}, {2, 3, 3}}, exact);
}

// xsimd 8's batch pow and atan2 do not follow C99 at these points (pow(0, 0), pow(NaN, 0) and
// pow(1, NaN) give 0 or NaN instead of 1; atan2 of two zeros or two infinities gives NaN): math.hpp
// selects C99's values there, on both paths.
TEST_CASE_TEMPLATE("pow and atan2 follow C99 at zeros, ones and infinities", T, float, double) {
    check_binary_specials<T>("pow", EXPR_BINARY(dl::pow),
                      std::vector<binary_special>{
                          {0, 0, 1}, {qnan, 0, 1}, {inf, 0, 1}, {1, qnan, 1}, {1, inf, 1}, {-1, inf, 1}, {0, 2, 0}});
    check_binary_specials<T>("atan2", EXPR_BINARY(dl::atan2),
                      std::vector<binary_special>{{0.0, 0.0, 0.0},
                                                  {0.0, -0.0, pi},
                                                  {-0.0, -0.0, -pi},
                                                  {inf, inf, pi / 4},
                                                  {-inf, inf, -pi / 4},
                                                  {inf, -inf, 3 * pi / 4},
                                                  {1, inf, 0},
                                                  {1, -inf, pi},
                                                  {inf, 1, pi / 2}});
}

TEST_CASE_TEMPLATE("integer ops have no NaN: isnan false, isfinite true, division by zero 0", T, std::int32_t,
                   std::int64_t, std::uint8_t) {
    const auto x = dl::tensor<T>({0, 1, 2, 100});
    CHECK(to_vector(dl::eval(dl::isnan(x))) == std::vector<bool>(4, false));
    CHECK(to_vector(dl::eval(dl::isfinite(x))) == std::vector<bool>(4, true));
    CHECK(to_vector(dl::eval(x / 0)) == std::vector<T>(4, 0));
    CHECK(to_vector(dl::eval(0 / x)) == std::vector<T>(4, 0));
}
