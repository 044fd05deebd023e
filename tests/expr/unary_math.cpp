// Transcendental unary ops and activations against a double-precision reference, within a few dozen
// ulps (their ulp accuracy is tests/expr/math.cpp's job), over every size that exercises the SIMD tails
// and the threaded loop; floating ops applied to integer tensors.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

using namespace expr_test;

namespace {

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_tanh_ref(double x) {
    return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_erf_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

TEST_CASE_TEMPLATE("transcendental unary ops are close to a double reference", T, float, double) {
    const tolerance tol = transcendental<T>, tol_abs = transcendental_abs<T>;
    check_unary_sizes<T>("rsqrt", EXPR_UNARY(dl::rsqrt), [](double x) { return 1 / std::sqrt(x); }, 1e-3, 1e4, tol);
    check_unary_sizes<T>("exp", EXPR_UNARY(dl::exp), [](double x) { return std::exp(x); }, -85, 85, tol);
    check_unary_sizes<T>("exp2", EXPR_UNARY(dl::exp2), [](double x) { return std::exp2(x); }, -120, 120, tol);
    check_unary_sizes<T>("log", EXPR_UNARY(dl::log), [](double x) { return std::log(x); }, 1e-6, 1e6, tol);
    check_unary_sizes<T>("log2", EXPR_UNARY(dl::log2), [](double x) { return std::log2(x); }, 1e-6, 1e6, tol);
    check_unary_sizes<T>("log1p", EXPR_UNARY(dl::log1p), [](double x) { return std::log1p(x); }, -0.999, 100, tol);
    check_unary_sizes<T>("log1p near 0", EXPR_UNARY(dl::log1p), [](double x) { return std::log1p(x); }, -1e-4, 1e-4,
                         tol);
    check_unary_sizes<T>("expm1", EXPR_UNARY(dl::expm1), [](double x) { return std::expm1(x); }, -20, 20, tol);
    check_unary_sizes<T>("expm1 near 0", EXPR_UNARY(dl::expm1), [](double x) { return std::expm1(x); }, -1e-4, 1e-4,
                         tol);
    check_unary_sizes<T>("sin", EXPR_UNARY(dl::sin), [](double x) { return std::sin(x); }, -10, 10, tol_abs);
    check_unary_sizes<T>("cos", EXPR_UNARY(dl::cos), [](double x) { return std::cos(x); }, -10, 10, tol_abs);
    check_unary_sizes<T>("tanh", EXPR_UNARY(dl::tanh), [](double x) { return std::tanh(x); }, -12, 12, tol);
    check_unary_sizes<T>("tanh near 0", EXPR_UNARY(dl::tanh), [](double x) { return std::tanh(x); }, -0.7, 0.7, tol);
    check_unary_sizes<T>("sigmoid", EXPR_UNARY(dl::sigmoid), sigmoid_ref, -40, 40, tol);
    check_unary_sizes<T>("silu", EXPR_UNARY(dl::silu), [](double x) { return x * sigmoid_ref(x); }, -20, 20, tol);
    check_unary_sizes<T>("softplus", EXPR_UNARY(dl::softplus), [](double x) { return std::log1p(std::exp(x)); }, -30,
                         30, tol);
    check_unary_sizes<T>("gelu", EXPR_UNARY(dl::gelu), gelu_tanh_ref, -6, 6, tol_abs);
    check_unary_sizes<T>("gelu_erf", EXPR_UNARY(dl::gelu_erf), gelu_erf_ref, -6, 6, tol_abs);
    check_unary_sizes<T>("elu", EXPR_UNARY(dl::elu), [](double x) { return x > 0 ? x : std::expm1(x); }, -10, 10, tol);
    check_unary_sizes<T>(
        "elu(x, 0.5)", [](const auto& x) { return dl::elu(x, 0.5); },
        [](double x) { return x > 0 ? x : 0.5 * std::expm1(x); }, -10, 10, tol);
    // The default slope 0.01 is rounded to T before multiplying: one extra rounding.
    check_unary_sizes<T>("leaky_relu", EXPR_UNARY(dl::leaky_relu), [](double x) { return x >= 0 ? x : 0.01 * x; }, -10,
                         10, tolerance{2.5e-7, 0});
}

TEST_CASE("floating ops on integer tensors compute in float") {
    const auto x = dl::tensor<std::int32_t>({1, 4, 9, 100, 0});
    static_assert(std::is_same_v<dl::value_t<decltype(dl::sqrt(x))>, float>);
    static_assert(std::is_same_v<dl::value_t<decltype(dl::exp(x))>, float>);
    static_assert(std::is_same_v<dl::value_t<decltype(dl::sigmoid(x))>, float>);
    static_assert(std::is_same_v<dl::value_t<decltype(dl::leaky_relu(x))>, float>);
    check_unary("sqrt", EXPR_UNARY(dl::sqrt), [](double v) { return std::sqrt(v); }, x, exact);
    check_unary("reciprocal", EXPR_UNARY(dl::reciprocal), [](double v) { return 1 / v; }, x, exact);
    check_unary("exp", EXPR_UNARY(dl::exp), [](double v) { return std::exp(v); }, x, transcendental<float>);
    check_unary("log", EXPR_UNARY(dl::log), [](double v) { return std::log(v); }, x, transcendental<float>);
    check_unary("leaky_relu", [](const auto& v) { return dl::leaky_relu(v, 0.5); },
                [](double v) { return v >= 0 ? v : 0.5 * v; }, dl::tensor<std::int64_t>({-3, 0, 5}), exact);
    const auto u = dl::tensor<std::uint8_t>({0, 1, 255});
    check_unary("sigmoid", EXPR_UNARY(dl::sigmoid), sigmoid_ref, u, transcendental<float>);
}
