// Views as operands and as destinations: slices with a step, transposes, permuted rank-3/4 tensors,
// expanded (stride-0) and selected views give the same result as contiguous copies of them, on the
// strided loop (scalar) and the SIMD loop alike.
#include "check.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

using namespace expr_test;

namespace {

struct view_case {
    std::string name;
    dl::Tensor<float> view;
};

/// Views of pseudo-random tensors, covering every kind of stride the views produce.
std::vector<view_case> views() {
    const auto m = random<float>({37, 41}, -3, 3, 1);
    const auto r3 = random<float>({5, 6, 7}, -3, 3, 2);
    const auto r4 = random<float>({3, 4, 5, 6}, -3, 3, 3);
    const auto v = random<float>({100}, -3, 3, 4);
    const auto big = random<float>({300, 257}, -3, 3, 5);
    return {
        {"slice step 3", v.slice(0, 1, 100, 3)},
        {"slice of rows with a step", m.slice(0, 2, 37, 2)},
        {"slice of columns with a step", m.slice(1, 0, 41, 4)},
        {"slice with negative start", m.slice(1, -20, 41)},
        {"transpose", m.t()},
        {"transpose of a column slice", m.slice(1, 3, 30).t()},
        {"permute rank 3 (2, 0, 1)", r3.permute({2, 0, 1})},
        {"permute rank 3 (1, 2, 0) then slice", r3.permute({1, 2, 0}).slice(2, 1, 5, 2)},
        {"permute rank 4 (3, 1, 0, 2)", r4.permute({3, 1, 0, 2})},
        {"transpose rank 4 (0, 3)", r4.transpose(0, 3)},
        {"expand a row", v.slice(0, 0, 9).expand({6, 9})},
        {"expand a column", m.slice(1, 0, 1).expand({37, 5})},
        {"unsqueeze + expand middle", v.slice(0, 0, 8).unsqueeze(0).unsqueeze(2).expand({3, 8, 4})},
        {"select a column", m.select(1, 5)},
        {"select then step", r3.select(2, 3).slice(0, 0, 5, 2)},
        {"large transpose (threaded)", big.t()},
        {"large column step (threaded)", big.slice(1, 0, 257, 2)},
    };
}

/// f(view) and f(contiguous copy of view) are equal (bitwise when `tol` is exact, up to NaN payloads).
template <class F>
void check_views(F&& f, tolerance tol, std::string_view what) {
    for (const auto& [name, view] : views()) {
        CAPTURE(name);
        const dl::Tensor<float> copy = view.clone();
        REQUIRE(copy.is_contiguous());
        const auto from_view = dl::eval(f(view));
        const auto from_copy = dl::eval(f(copy));
        REQUIRE(from_view.shape() == view.shape());
        const auto vc = to_vector(from_copy);
        check_elements(from_view, [&](std::size_t i) { return static_cast<double>(vc[i]); }, tol, what,
                       [](std::size_t) { return std::string("same input"); });
    }
}

}  // namespace

TEST_CASE("arithmetic on views equals arithmetic on contiguous copies, exactly") {
    check_views([](const auto& x) { return x * 3.0f - 1.0f; }, exact, "x * 3 - 1");
    check_views([](const auto& x) { return dl::abs(x) / (x * x + 1.0f); }, exact, "abs(x) / (x^2 + 1)");
    check_views([](const auto& x) { return dl::where(x > 0.5f, dl::floor(x), dl::maximum(x, -1.0f)); }, exact,
                "where(x > .5, floor(x), maximum(x, -1))");
    check_views([](const auto& x) { return dl::clamp(dl::round(x * 2.0f), -2, 2); }, exact, "clamp(round(2x), -2, 2)");
    check_views([](const auto& x) { return x >= 0.0f; }, exact, "x >= 0");
    check_views([](const auto& x) { return dl::cast<std::int32_t>(x * 10.0f); }, exact, "cast<int32>(10 x)");
    // dl's own float kernels run the same formulas on either path; bitwise equal on AVX2+FMA, but with
    // AVX-512 GCC contracts the scalar and vector code differently (a few ulp apart, more where the sum cancels).
    check_views([](const auto& x) { return dl::exp(x) + dl::sigmoid(x) * dl::tanh(x); }, tolerance{1e-6, 1e-7},
                "exp(x) + sigmoid(x) tanh(x)");
}

TEST_CASE("transcendentals on views are close to the same on contiguous copies") {
    check_views([](const auto& x) { return dl::log1p(dl::abs(x)) + dl::sin(x) * dl::cos(x); },
                transcendental_abs<float>, "log1p(|x|) + sin(x) cos(x)");
    check_views([](const auto& x) { return dl::gelu_erf(x) + dl::softplus(x); }, transcendental_abs<float>,
                "gelu_erf(x) + softplus(x)");
    check_views([](const auto& x) { return dl::pow(dl::abs(x), 1.5f) + dl::atan2(x, 2.0f); },
                transcendental_abs<float>, "pow(|x|, 1.5) + atan2(x, 2)");
}

TEST_CASE("a view combined with contiguous and broadcast operands") {
    const auto m = random<float>({64, 48}, -2, 2, 1);
    const auto other = random<float>({48, 64}, -2, 2, 2);
    const auto row = random<float>({64}, -2, 2, 3);
    dl::Tensor<float> y = m.t() * other + row;  // transposed, contiguous, broadcast row
    dl::Tensor<float> want = m.t().clone() * other + row;
    CHECK(bitwise_equal(y, want));
    for (int i = 0; i < 48; i += 7)
        for (int j = 0; j < 64; j += 5) CHECK(y(i, j) == m(j, i) * other(i, j) + row(j));
}

TEST_CASE("writing into strided destinations touches exactly the viewed elements") {
    SUBCASE("every other element of a vector") {
        auto v = dl::zeros<float>({1001});
        const auto src = random<float>({501}, -1, 1, 1);
        v.slice(0, 0, 1001, 2) = src * 2.0f;
        for (std::int64_t i = 0; i < 1001; ++i) CHECK(v(i) == (i % 2 == 0 ? src(i / 2) * 2.0f : 0.0f));
    }
    SUBCASE("a transposed destination") {
        auto m = dl::zeros<float>({40, 30});
        const auto src = random<float>({30, 40}, -1, 1, 2);
        m.t() = src * 3.0f - 1.0f;
        dl::Tensor<float> want = src.t().clone() * 3.0f - 1.0f;
        CHECK(bitwise_equal(m, want));
    }
    SUBCASE("a column of a matrix, from a row") {
        auto m = dl::zeros<float>({20, 10});
        m.select(1, 3) = dl::arange<float>(20) + 1.0f;
        for (int i = 0; i < 20; ++i)
            for (int j = 0; j < 10; ++j) CHECK(m(i, j) == (j == 3 ? i + 1.0f : 0.0f));
    }
    SUBCASE("a permuted rank-3 destination from a broadcast expression") {
        auto t = dl::zeros<double>({4, 5, 6});
        const auto row = random<double>({4}, -1, 1, 3);
        t.permute({2, 1, 0}) = row * 2.0;  // shape [6, 5, 4], row broadcast along the last axis
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 5; ++j)
                for (int k = 0; k < 6; ++k) CHECK(t(i, j, k) == row(i) * 2.0);
    }
    SUBCASE("a large strided destination (threaded)") {
        auto m = dl::zeros<float>({1024, 1030});
        const auto src = random<float>({1024, 515}, -1, 1, 4);
        m.slice(1, 1, 1030, 2) = src * 3.0f - 1.0f;
        dl::Tensor<float> want = src * 3.0f - 1.0f;
        CHECK(bitwise_equal(m.slice(1, 1, 1030, 2).clone(), want));
        CHECK(dl::sum(dl::abs(m.slice(1, 0, 1030, 2))).item() == 0.0f);
    }
}

TEST_CASE("integer and double tensors through views") {
    const auto a = random<std::int64_t>({30, 20}, -50, 50, 1);
    const auto b = random<double>({20, 30}, -5, 5, 2);
    dl::Tensor<double> y = a.t() * b - a.t() / 3;
    for (int i = 0; i < 20; ++i)
        for (int j = 0; j < 30; ++j)
            CHECK(y(i, j) == static_cast<double>(a(j, i)) * b(i, j) - static_cast<double>(a(j, i) / 3));
}

// simd.hpp promises that a SIMD lane computes the same bits as the scalar path, so that an op's result
// does not depend on the layout of its operands: math.hpp's scalar path runs xsimd's batch functions
// on a batch holding the one value, rather than <cmath>, whose last bits differ.
TEST_CASE_TEMPLATE("the SIMD and scalar paths give bitwise identical results for every op", T, float, double) {
    const auto x = random<T>({4099}, -20, 20, 11);
    const auto strided = spread(x);  // same values, scalar path
    std::vector<std::string> differ;
    auto probe = [&](const char* name, auto f) {
        const auto a = dl::eval(f(x)), b = dl::eval(f(strided));
        if (!same_values(a, b)) differ.push_back(name);
    };
    probe("exp", EXPR_UNARY(dl::exp));
    probe("exp2", EXPR_UNARY(dl::exp2));
    probe("expm1", EXPR_UNARY(dl::expm1));
    probe("log", [](const auto& v) { return dl::log(dl::abs(v)); });
    probe("log2", [](const auto& v) { return dl::log2(dl::abs(v)); });
    probe("log1p", [](const auto& v) { return dl::log1p(dl::abs(v)); });
    probe("sqrt", [](const auto& v) { return dl::sqrt(dl::abs(v)); });
    probe("rsqrt", [](const auto& v) { return dl::rsqrt(dl::abs(v)); });
    probe("sin", EXPR_UNARY(dl::sin));
    probe("cos", EXPR_UNARY(dl::cos));
    probe("tanh", EXPR_UNARY(dl::tanh));
    probe("sigmoid", EXPR_UNARY(dl::sigmoid));
    probe("silu", EXPR_UNARY(dl::silu));
    probe("softplus", EXPR_UNARY(dl::softplus));
    probe("gelu", EXPR_UNARY(dl::gelu));
    probe("gelu_erf", EXPR_UNARY(dl::gelu_erf));
    probe("elu", EXPR_UNARY(dl::elu));
    probe("pow", [](const auto& v) { return dl::pow(dl::abs(v), v * T(0.1)); });
    probe("atan2", [](const auto& v) { return dl::atan2(v, v - T(1)); });
    std::string list;
    for (const auto& name : differ) list += name + " ";
    INFO("ops whose SIMD and scalar results differ: ", list);
    CHECK(differ.empty());
}
