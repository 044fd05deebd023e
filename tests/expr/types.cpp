// Result types of expressions (promotion of tensors and numbers, comparison and floating rules,
// reductions) and cast<U> against C++ conversions.
#include "check.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>

using namespace expr_test;

namespace {
template <class E>
using vt = dl::value_t<E>;

using i32 = std::int32_t;
using i64 = std::int64_t;
using u8 = std::uint8_t;

const dl::Tensor<float> f32_t = dl::zeros<float>({2});
const dl::Tensor<double> f64_t = dl::zeros<double>({2});
const dl::Tensor<i32> i32_t = dl::zeros<i32>({2});
const dl::Tensor<i64> i64_t = dl::zeros<i64>({2});
const dl::Tensor<u8> u8_t = dl::zeros<u8>({2});
const dl::Tensor<bool> b_t = dl::zeros<bool>({2});
}  // namespace

TEST_CASE("tensor with tensor promotes to the wider type; floats win over integers") {
    static_assert(std::is_same_v<vt<decltype(f32_t + f32_t)>, float>);
    static_assert(std::is_same_v<vt<decltype(f32_t + f64_t)>, double>);
    static_assert(std::is_same_v<vt<decltype(i32_t + f32_t)>, float>);
    static_assert(std::is_same_v<vt<decltype(i64_t * f32_t)>, float>);
    static_assert(std::is_same_v<vt<decltype(i64_t - f64_t)>, double>);
    static_assert(std::is_same_v<vt<decltype(i32_t + i64_t)>, i64>);
    static_assert(std::is_same_v<vt<decltype(u8_t + i32_t)>, i32>);
    static_assert(std::is_same_v<vt<decltype(u8_t + u8_t)>, u8>);
    static_assert(std::is_same_v<vt<decltype(b_t + b_t)>, bool>);
    static_assert(std::is_same_v<vt<decltype(b_t + f32_t)>, float>);
    static_assert(std::is_same_v<vt<decltype(b_t * i64_t)>, i64>);
    static_assert(std::is_same_v<vt<decltype(dl::minimum(i32_t, f64_t))>, double>);
    // And the values: int + float computes in float.
    const auto a = dl::tensor<i32>({1, -2, 16777217});
    const auto b = dl::tensor<float>({0.5f, 0.25f, 0.0f});
    CHECK(to_vector(dl::eval(a + b)) == std::vector<float>{1.5f, -1.75f, 16777216.0f});
}

TEST_CASE("bool with uint8 promotes to uint8") {
    CHECK(std::is_same_v<vt<decltype(b_t + u8_t)>, u8>);
    CHECK(std::is_same_v<dl::promote_t<bool, u8>, u8>);
    CHECK(std::is_same_v<dl::promote_t<u8, bool>, u8>);
}

TEST_CASE("numbers do not widen tensors; an integer tensor meets a fractional number in floating point") {
    static_assert(std::is_same_v<vt<decltype(f32_t + 1.0)>, float>);  // double number, float tensor
    static_assert(std::is_same_v<vt<decltype(2.0 * f32_t)>, float>);
    static_assert(std::is_same_v<vt<decltype(f32_t + 1)>, float>);
    static_assert(std::is_same_v<vt<decltype(f32_t / i64{3})>, float>);
    static_assert(std::is_same_v<vt<decltype(f64_t + 1.0f)>, double>);
    static_assert(std::is_same_v<vt<decltype(i32_t + 1)>, i32>);
    static_assert(std::is_same_v<vt<decltype(i32_t + i64{1})>, i32>);  // an int64 number does not widen int32
    static_assert(std::is_same_v<vt<decltype(u8_t * 2)>, u8>);
    static_assert(std::is_same_v<vt<decltype(i32_t + 1.5f)>, float>);
    static_assert(std::is_floating_point_v<vt<decltype(i32_t + 1.5)>>);
    static_assert(std::is_floating_point_v<vt<decltype(1.5 - i64_t)>>);
    const auto x = dl::tensor<i32>({1, 2, -3});
    CHECK(to_vector(dl::eval(dl::cast<double>(x * 0.5))) == std::vector<double>{0.5, 1.0, -1.5});
    CHECK(to_vector(dl::eval(dl::cast<double>(1 / (x * 1.0f)))) ==
          std::vector<double>{1.0, 0.5, static_cast<double>(-1.0f / 3.0f)});
}

TEST_CASE("comparisons and logical ops give bool whatever the operands") {
    static_assert(std::is_same_v<vt<decltype(f32_t < f64_t)>, bool>);
    static_assert(std::is_same_v<vt<decltype(i32_t == 1.5)>, bool>);
    static_assert(std::is_same_v<vt<decltype(u8_t != b_t)>, bool>);
    static_assert(std::is_same_v<vt<decltype(dl::logical_xor(f32_t, i64_t))>, bool>);
    static_assert(std::is_same_v<vt<decltype(dl::isnan(f64_t))>, bool>);
    static_assert(std::is_same_v<vt<decltype(!i32_t)>, bool>);
}

TEST_CASE("floating ops give float for integer operands, the operand type for floating ones") {
    static_assert(std::is_same_v<vt<decltype(dl::exp(i32_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::exp(i64_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::sqrt(u8_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::tanh(b_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::log(f64_t))>, double>);
    static_assert(std::is_same_v<vt<decltype(dl::pow(i32_t, i32_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::pow(i32_t, f64_t))>, double>);
    static_assert(std::is_same_v<vt<decltype(dl::atan2(f32_t, 1))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::reciprocal(i64_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::abs(i64_t))>, i64>);
    static_assert(std::is_same_v<vt<decltype(dl::neg(u8_t))>, u8>);
    static_assert(std::is_same_v<vt<decltype(dl::where(b_t, i32_t, f32_t))>, float>);
    static_assert(std::is_same_v<vt<decltype(dl::where(b_t, i32_t, 1))>, i32>);
    static_assert(std::is_same_v<vt<decltype(dl::clamp(f64_t, 0, 1))>, double>);
    static_assert(std::is_same_v<vt<decltype(dl::cast<u8>(f64_t))>, u8>);
}

TEST_CASE("reductions: sums of integers in int64, of floats in the element type; statistics in floating point") {
    static_assert(std::is_same_v<decltype(dl::sum(i32_t)), dl::Tensor<i64>>);
    static_assert(std::is_same_v<decltype(dl::sum(u8_t)), dl::Tensor<i64>>);
    static_assert(std::is_same_v<decltype(dl::sum(b_t)), dl::Tensor<i64>>);
    static_assert(std::is_same_v<decltype(dl::prod(i32_t)), dl::Tensor<i64>>);
    static_assert(std::is_same_v<decltype(dl::sum(f32_t)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::sum(f64_t)), dl::Tensor<double>>);
    static_assert(std::is_same_v<decltype(dl::sum(i32_t * 0.5f)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::mean(f32_t)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::var(f32_t)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::std(f64_t)), dl::Tensor<double>>);
    static_assert(std::is_same_v<decltype(dl::var(i32_t)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::norm(i64_t)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::logsumexp(i32_t)), dl::Tensor<float>>);
    static_assert(std::is_same_v<decltype(dl::max(i32_t)), dl::Tensor<i32>>);
    static_assert(std::is_same_v<decltype(dl::min(u8_t)), dl::Tensor<u8>>);
    static_assert(std::is_same_v<decltype(dl::argmax(f32_t)), dl::Tensor<i64>>);
    static_assert(std::is_same_v<decltype(dl::argmin(i32_t, 0)), dl::Tensor<i64>>);
    static_assert(std::is_same_v<decltype(dl::any(f32_t)), dl::Tensor<bool>>);
    static_assert(std::is_same_v<decltype(dl::all(i32_t > 0)), dl::Tensor<bool>>);
    const auto big = dl::full<i32>({3}, 2'000'000'000);
    CHECK(dl::sum(big).item() == 6'000'000'000);  // no int32 overflow
    CHECK(dl::sum(dl::full<u8>({10}, 255)).item() == 2550);
    CHECK(dl::sum(dl::tensor<bool>({true, false, true, true})).item() == 3);
}

TEST_CASE("cast<U> converts as C++ does") {
    const auto f = dl::tensor<float>({-2.75f, -0.5f, 0.0f, 0.5f, 1.0f, 2.99f, 100.25f});
    // float -> integer truncates toward zero.
    CHECK(to_vector(dl::eval(dl::cast<i32>(f))) == std::vector<i32>{-2, 0, 0, 0, 1, 2, 100});
    CHECK(to_vector(dl::eval(dl::cast<i64>(f))) == std::vector<i64>{-2, 0, 0, 0, 1, 2, 100});
    CHECK(to_vector(dl::eval(dl::cast<bool>(f))) == std::vector<bool>{true, true, false, true, true, true, true});
    CHECK(to_vector(dl::eval(dl::cast<double>(f))) == std::vector<double>{-2.75, -0.5, 0, 0.5, 1, 2.99f, 100.25});
    CHECK(to_vector(dl::eval(dl::cast<u8>(dl::abs(f)))) == std::vector<u8>{2, 0, 0, 0, 1, 2, 100});
    // double -> float rounds to nearest.
    const auto d = dl::tensor<double>({0.1, 1.0 + 1e-12, 1e30, -1e-300});
    CHECK(to_vector(dl::eval(dl::cast<float>(d))) ==
          std::vector<float>{0.1f, 1.0f, 1e30f, -0.0f});
    // integer -> integer wraps modulo 2^bits; bool -> number is 0 or 1; integer -> bool is != 0.
    const auto i = dl::tensor<i32>({-1, 256, 300, 0, 7});
    CHECK(to_vector(dl::eval(dl::cast<u8>(i))) == std::vector<u8>{255, 0, 44, 0, 7});
    CHECK(to_vector(dl::eval(dl::cast<bool>(i))) == std::vector<bool>{true, true, true, false, true});
    CHECK(to_vector(dl::eval(dl::cast<float>(dl::tensor<bool>({true, false})))) == std::vector<float>{1, 0});
    CHECK(to_vector(dl::eval(dl::cast<i64>(dl::tensor<u8>({0, 255})))) == std::vector<i64>{0, 255});
    const i64 big = (i64{1} << 40) + 3;
    CHECK(to_vector(dl::eval(dl::cast<double>(dl::tensor<i64>({big})))) ==
          std::vector<double>{static_cast<double>(big)});
    CHECK(to_vector(dl::eval(dl::cast<i32>(dl::tensor<i64>({big})))) == std::vector<i32>{3});
}

TEST_CASE_TEMPLATE("cast over every size, fused into an expression", T, float, double, std::int32_t) {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto x = random<T>({n}, -1000, 1000, 5);
        check_unary("cast<i64>", [](const auto& v) { return dl::cast<i64>(v); },
                    [](T v) { return static_cast<i64>(v); }, x, exact);
        check_unary("cast<double>(x) * 3", [](const auto& v) { return dl::cast<double>(v) * 3; },
                    [](T v) { return static_cast<double>(v) * 3; }, x, exact);
        check_unary("cast<float>(x) + 0.5", [](const auto& v) { return dl::cast<float>(v) + 0.5; },
                    [](T v) { return static_cast<float>(v) + 0.5f; }, x, exact);
    }
}

TEST_CASE("assigning converts to the destination's type") {
    const auto f = dl::tensor<float>({1.75f, -1.75f});
    dl::Tensor<i32> i = dl::zeros<i32>({2});
    i = f * 2;  // float expression into an int tensor: truncates
    CHECK(to_vector(i) == std::vector<i32>{3, -3});
    dl::Tensor<double> d = f + 0;  // implicit conversion of an expression to another element type
    CHECK(to_vector(d) == std::vector<double>{1.75, -1.75});
    dl::Tensor<float> g = dl::zeros<float>({2});
    g = dl::tensor<i32>({5, 6}) + 1;
    CHECK(to_vector(g) == std::vector<float>{6, 7});
}
