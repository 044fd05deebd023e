// Backward semantics: accumulation, retain_graph, detach, no_grad, non-leaf gradients, errors.
#include "support.hpp"

using dl::Tensor;

TEST_CASE("nothing is recorded when no input requires grad") {
    dl::Context c({.threads = 1});
    Tensor<float> x = dl::ones<float>({3}, c);
    Tensor<float> y = dl::exp(x) * 2.0f;
    CHECK_FALSE(y.requires_grad());
    CHECK(dl::sum(y).requires_grad() == false);
    CHECK(dl_test::error_message([&] { dl::sum(y).backward(); }).find("does not require grad") != std::string::npos);
}

TEST_CASE("gradients accumulate until zeroed; backward twice needs retain_graph") {
    Tensor<double> x = dl::tensor<double>({1.0, 2.0}).requires_grad_();
    CHECK(x.is_leaf());
    Tensor<double> y = x * x;
    CHECK_FALSE(y.is_leaf());
    auto loss = dl::sum(y);
    loss.backward(true);
    CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{2, 4});
    loss.backward();
    CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{4, 8});
    CHECK(dl_test::error_message([&] { loss.backward(); }).find("retain_graph") != std::string::npos);
    x.grad().fill(0);
    dl::sum(x * 3.0).backward();
    CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{3, 3});
}

TEST_CASE("backward with a given gradient, and retain_grad on a computed tensor") {
    Tensor<double> x = dl::tensor<double>({1.0, -2.0, 3.0}).requires_grad_();
    Tensor<double> h = x * 2.0;
    h.retain_grad();
    Tensor<double> y = dl::square(h);
    y.backward(dl::tensor<double>({1.0, 0.5, 0.0}));
    CHECK(dl_test::to_vector(h.grad()) == std::vector<double>{4, -4, 0});
    CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{8, -8, 0});
    CHECK(dl_test::error_message([&] { y.backward(dl::ones<double>({2})); }).find("[2]") != std::string::npos);
    CHECK(dl_test::error_message([&] { y.backward(); }).find("one element") != std::string::npos);
}

TEST_CASE("backward never writes into the given gradient, whatever the root") {
    const auto g = dl::tensor<double>({1.0, 0.5, -2.0});
    const std::vector<double> given = dl_test::to_vector(g);
    Tensor<double> x = dl::tensor<double>({1.0, -2.0, 3.0}).requires_grad_();
    SUBCASE("an op's result: its gradient may share g for the pass") {
        Tensor<double> y = x * 3.0;
        y.backward(g, true);
        y.backward(g);
        CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{6, 3, -12});
    }
    SUBCASE("a retained op result keeps a gradient of its own, which later passes add into") {
        Tensor<double> y = x * 3.0;
        y.retain_grad();
        y.backward(g, true);
        y.backward(g);
        CHECK(dl_test::to_vector(y.grad()) == std::vector<double>{2, 1, -4});
    }
    SUBCASE("a leaf") {
        x.backward(g);
        x.backward(g);
        CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{2, 1, -4});
    }
    SUBCASE("a strided gradient") {
        const auto wide = dl::tensor<double>({1.0, 9.0, 0.5, 9.0, -2.0, 9.0});
        Tensor<double> y = x * 3.0;
        y.backward(wide.slice(0, 0, 6, 2));
        CHECK(dl_test::to_vector(x.grad()) == std::vector<double>{3, 1.5, -6});
    }
    CHECK(dl_test::to_vector(g) == given);
}

TEST_CASE("a leaf takes over a gradient that nothing else holds, and copies one that is shared") {
    dl::Context c({.threads = 1});
    Tensor<double> w = dl::tensor<double>({{1.0, 2.0}, {3.0, 4.0}, {5.0, 6.0}}).requires_grad_();
    Tensor<double> b = dl::tensor<double>({1.0, 1.0, 1.0}).requires_grad_();
    const auto x = dl::tensor<double>({{1.0, -1.0}});
    SUBCASE("batch 1 with an activation: the bias gradient is the fresh activation gradient itself") {
        Tensor<double> y = dl::linear(x, w, b, dl::activation::tanh);
        dl::sum(y).backward();
        // x·Wᵀ + b = [0, 0, 0], where tanh' = 1: the bias gradient is all ones.
        CHECK(dl_test::to_vector(b.grad()) == std::vector<double>{1, 1, 1});
        CHECK(dl_test::to_vector(w.grad()) == std::vector<double>{1, -1, 1, -1, 1, -1});
        CHECK_FALSE(b.grad().shares_storage(w.grad()));
        b.grad().fill(0);  // the optimizer's zero_grad(false) writes into it in place
        dl::sum(dl::linear(x, w, b, dl::activation::tanh)).backward();
        CHECK(dl_test::to_vector(b.grad()) == std::vector<double>{1, 1, 1});
    }
    SUBCASE("no activation and a retained output gradient: the bias gets a copy, not the retained tensor") {
        Tensor<double> y = dl::linear(x, w, b);
        y.retain_grad();
        y.backward(dl::tensor<double>({{1.0, 2.0, 3.0}}));
        CHECK_FALSE(b.grad().shares_storage(y.grad()));
        b.grad().fill(7);
        CHECK(dl_test::to_vector(y.grad()) == std::vector<double>{1, 2, 3});
    }
    SUBCASE("several rows: the bias gradient sums them") {
        const auto x3 = dl::tensor<double>({{1.0, -1.0}, {2.0, 0.0}, {0.0, 1.0}});
        dl::sum(dl::linear(x3, w, b)).backward();
        CHECK(dl_test::to_vector(b.grad()) == std::vector<double>{3, 3, 3});
    }
}

TEST_CASE("detach and no_grad cut the graph") {
    dl::Context c({.threads = 1});
    Tensor<float> x = dl::full<float>({2}, 3.0f, c).requires_grad_();
    Tensor<float> y = x * x.detach();
    dl::sum(y).backward();
    CHECK(dl_test::to_vector(x.grad()) == std::vector<float>{3, 3});
    {
        dl::no_grad off(c);
        Tensor<float> z = x * 2.0f;
        CHECK_FALSE(z.requires_grad());
        x -= 1.0f;  // in place on a leaf is allowed here (it is how optimizers update)
    }
    CHECK(dl_test::to_vector(x) == std::vector<float>{2, 2});
    CHECK(c.grad_enabled());
}

TEST_CASE("in-place writes into tensors that require grad are refused or rebind") {
    Tensor<float> w = dl::ones<float>({2}).requires_grad_();
    CHECK(dl_test::error_message([&] { w += 1.0f; }).find("no_grad") != std::string::npos);
    CHECK(dl_test::error_message([&] { w = 0.0f; }).find("no_grad") != std::string::npos);
    Tensor<float> big = dl::zeros<float>({4});
    CHECK(dl_test::error_message([&] { big.slice(0, 0, 2) = w * 2.0f; }).find("view") != std::string::npos);
    // A computed tensor is rebound: the value saved for backward survives.
    Tensor<float> h = w * 3.0f;
    Tensor<float> y = h * h;
    h = h + 1.0f;
    dl::sum(y).backward();
    CHECK(dl_test::to_vector(w.grad()) == std::vector<float>{18, 18});
    CHECK(dl_test::to_vector(h) == std::vector<float>{4, 4});
}

TEST_CASE("requires_grad_ is for floating leaves") {
    Tensor<int> i = dl::zeros<int>({2});
    CHECK(dl_test::error_message([&] { i.requires_grad_(); }).find("floating") != std::string::npos);
    Tensor<float> x = dl::ones<float>({2}).requires_grad_();
    Tensor<float> y = x * 2.0f;
    CHECK(dl_test::error_message([&] { y.requires_grad_(false); }).find("detach") != std::string::npos);
    x.requires_grad_(false);
    CHECK_FALSE(x.requires_grad());
}

TEST_CASE("the graph is freed with the tensors that refer to it") {
    dl::Context c({.threads = 1});
    const auto in_use = [&] { return c.allocator().stats().bytes_in_use; };
    Tensor<float> x = dl::ones<float>({1000}, c).requires_grad_();
    const auto before = in_use();
    {
        Tensor<float> y = dl::exp(x);
        Tensor<float> z = dl::log(y) * y;
        CHECK(in_use() > before);
    }
    CHECK(in_use() == before);
}

TEST_CASE("a deep chain of recorded ops runs backward in creation order") {
    Tensor<double> x = dl::tensor<double>({0.5}).requires_grad_();
    Tensor<double> y = x;
    for (int i = 0; i < 200; ++i) y = y * 1.01 + x * 0.001;
    y.backward();
    double expected = 0;  // d/dx of the recurrence y_{i+1} = 1.01 y_i + 0.001 x
    for (int i = 0; i < 200; ++i) expected = expected * 1.01 + 0.001;
    expected += std::pow(1.01, 200);
    CHECK(x.grad().item() == doctest::Approx(expected).epsilon(1e-12));
}
