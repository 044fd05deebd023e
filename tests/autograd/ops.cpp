// Gradients of reductions, views, matrix products and softmax.
#include "support.hpp"

namespace {

using dl::Tensor;

dl::Context& ctx() {
    static dl::Context c({.seed = 5, .threads = 2});
    return c;
}
Tensor<double> randn(const dl::Shape& s) { return dl::normal<double>(s, 0, 1, ctx()); }

}  // namespace

TEST_CASE("reductions over all elements and over axes, of tensors and expressions") {
    const auto x = randn({3, 4, 2});
    for (const dl::Dims& axes : {dl::Dims{}, dl::Dims{0}, dl::Dims{1, 2}, dl::Dims{-1}}) {
        CAPTURE(axes);
        for (bool keep : {false, true}) {
            CHECK_GRAD([&](const auto& a) { return dl::sum(a, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::mean(dl::sin(a) * a, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::max(a, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::min(a * 2.0, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::var(a, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::std(a, axes, keep, 0); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::norm(a, 2, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::norm(a, 3, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::logsumexp(a, axes, keep); }, x);
            CHECK_GRAD([&](const auto& a) { return dl::prod(a + 3.0, axes, keep); }, x);
        }
    }
}

TEST_CASE("max shares the gradient between ties") {
    Tensor<float> x = dl::tensor<float>({1, 3, 3, 2}).requires_grad_();
    dl::max(x).backward();
    CHECK(dl_test::to_vector(x.grad()) == std::vector<float>{0, 0.5f, 0.5f, 0});
}

TEST_CASE("views send gradients back to their source") {
    const auto x = randn({4, 5});
    CHECK_GRAD([](const auto& a) { return Tensor<double>(a.slice(1, 1, 5, 2) * 2.0); }, x);
    CHECK_GRAD([](const auto& a) { return Tensor<double>(a.select(0, 2).slice(0, 0, 4) * a.select(1, -1)); }, x);
    CHECK_GRAD([](const auto& a) { return Tensor<double>(dl::exp(a.transpose(0, 1))); }, x);
    CHECK_GRAD([](const auto& a) { return Tensor<double>(a.reshape({2, 10}) * a.reshape({2, 10}) * 0.5); }, x);
    CHECK_GRAD([](const auto& a) { return a.unsqueeze(0).permute({2, 0, 1}).squeeze(); }, x);
    CHECK_GRAD([](const auto& a) { return Tensor<double>(a.slice(0, 0, 1).expand({3, 4, 5}) * 1.5); }, x);
    CHECK_GRAD([](const auto& a) { return a.t().clone(); }, x);
}

TEST_CASE("matmul and linear, including strided operands") {
    const auto a = randn({3, 7}), b = randn({7, 5}), w = randn({4, 7}), bias = randn({4});
    CHECK_GRAD([](const auto& x, const auto& y) { return dl::matmul(x, y); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return dl::matmul(y.t(), x.t()); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y, const auto& z) { return dl::linear(x, y, z); }, a, w, bias);
    CHECK_GRAD([](const auto& x, const auto& y) { return dl::linear(x, y); }, a, w);
    // Fused activations: relu, sigmoid and tanh differentiate from the output, gelu runs as its own op.
    for (dl::activation act : {dl::activation::relu, dl::activation::gelu, dl::activation::sigmoid, dl::activation::tanh}) {
        CAPTURE(int(act));
        CHECK_GRAD([act](const auto& x, const auto& y, const auto& z) { return dl::linear(x, y, z, act); }, a, w, bias);
        CHECK_GRAD([act](const auto& x, const auto& y) { return dl::linear(x.t().t(), y, {}, act); }, a, w);
    }
    CHECK(dl_test::error_message([&] { (void)dl::matmul(a, a); }).find("[3, 7] and [3, 7]") != std::string::npos);
}

TEST_CASE("matmul against a scalar reference, sizes around the register blocks") {
    for (auto [m, k, n] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 17}, {6, 300, 33}, {13, 5, 64}, {32, 784, 40}}) {
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(n);
        auto a = dl::normal<float>({m, k}, 0, 1, ctx()), b = dl::normal<float>({k, n}, 0, 1, ctx());
        for (int layout = 0; layout < 3; ++layout) {
            const Tensor<float> bb = layout == 0 ? b : layout == 1 ? b.t().clone().t() : b.clone().t().clone().t();
            const auto c = dl::matmul(a, bb);
            double worst = 0;
            for (std::int64_t i = 0; i < m; ++i)
                for (std::int64_t j = 0; j < n; ++j) {
                    double s = 0;
                    for (std::int64_t q = 0; q < k; ++q) s += double(a(i, q)) * double(b(q, j));
                    worst = std::max(worst, std::abs(s - double(c(i, j))) / std::sqrt(double(k)));
                }
            CHECK(worst < 1e-5);
        }
    }
}

TEST_CASE("softmax and log_softmax along each dimension, stable for large inputs") {
    const auto x = randn({3, 4});
    for (int d : {0, 1}) {
        CHECK_GRAD([d](const auto& a) { return dl::softmax(a, d); }, x);
        CHECK_GRAD([d](const auto& a) { return dl::log_softmax(a, d); }, x);
    }
    const auto big = dl::tensor<float>({{1000, 1001}, {-1000, -1001}});
    const auto p = dl::softmax(big);
    CHECK(p(0, 1) == doctest::Approx(0.7310586));
    CHECK(p(1, 0) == doctest::Approx(0.7310586));
}

TEST_CASE("softmax and log_softmax of a row holding +inf, NaN or only -inf are NaN throughout, as in PyTorch") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const auto x = dl::tensor<float>({{1, inf, 2}, {1, nan, 2}, {-inf, -inf, -inf}, {-inf, 0, 1}});
    for (const auto& y : {dl::softmax(x), dl::log_softmax(x)})
        for (std::int64_t row = 0; row < 3; ++row)
            for (std::int64_t j = 0; j < 3; ++j) {
                CAPTURE(row);
                CAPTURE(j);
                CHECK(std::isnan(y(row, j)));
            }
    // -inf entries beside finite ones are ordinary: probability 0.
    const auto p = dl::softmax(x);
    CHECK(p(3, 0) == 0.0f);
    CHECK(p(3, 2) == doctest::Approx(0.7310586));
    CHECK(dl::log_softmax(x)(3, 0) == -inf);
}
