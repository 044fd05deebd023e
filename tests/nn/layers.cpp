// Layers, both ways of building a model, losses and optimizers.
#include "support.hpp"

#include <dl/prof/profiler.hpp>

namespace {

using dl::Tensor;

/// A model written as a struct with layer members.
struct two_layer {
    dl::nn::linear<double> fc1, fc2;
    two_layer(dl::Context& c) : fc1(3, 5, true, c), fc2(5, 2, true, c) {}
    Tensor<double> operator()(const Tensor<double>& x) { return fc2(dl::nn::relu{}(fc1(x))); }
    template <class F>
    void for_each_parameter(F&& f) {
        dl::nn::visit(f, "fc1", fc1);
        dl::nn::visit(f, "fc2", fc2);
    }
    void train(bool on = true) {
        fc1.train(on);
        fc2.train(on);
    }
};
static_assert(dl::nn::layer<two_layer>);
static_assert(dl::nn::layer<dl::nn::linear<float>>);
static_assert(dl::nn::layer<dl::nn::relu>);

/// A custom layer written as one expression: fused forward and backward with no extra code.
struct gated {
    template <class T>
    Tensor<T> operator()(const Tensor<T>& x, const Tensor<T>& g, const Tensor<T>& r) const {
        return x * dl::sigmoid(g) + r;
    }
};

}  // namespace

TEST_CASE("linear layer: shapes, initial range, gradients, clear errors") {
    dl::Context c({.seed = 3, .threads = 1});
    dl::nn::linear<double> fc(4, 3, true, c);
    CHECK(fc.weight.shape() == dl::Shape{3, 4});
    CHECK(fc.bias.shape() == dl::Shape{3});
    for (double w : dl_test::to_vector(fc.weight)) CHECK(std::abs(w) <= 0.5);
    const auto x = dl::normal<double>({2, 4}, 0, 1, c);
    CHECK_GRAD([&](const auto& in, const auto& w, const auto& b) {
        fc.weight.copy_from(w);
        fc.bias.copy_from(b);
        return dl::linear(in, w, b);
    }, x, fc.weight.detach().clone(), fc.bias.detach().clone());
    const auto msg = dl_test::error_message([&] { (void)fc(dl::zeros<double>({2, 5}, c)); });
    CHECK(msg.find("linear") != std::string::npos);
    CHECK(msg.find("[N, 4]") != std::string::npos);
    CHECK(msg.find("[2, 5]") != std::string::npos);
    // Same seed, same weights.
    dl::Context c2({.seed = 3, .threads = 2});
    dl::nn::linear<double> again(4, 3, true, c2);
    CHECK(dl_test::same_elements(fc.weight, again.weight));
    // The input size inferred at the first call.
    dl::nn::linear<float> lazy(-1, 7);
    CHECK(lazy(dl::ones<float>({2, 9})).shape() == dl::Shape{2, 7});
    CHECK(lazy.weight.shape() == dl::Shape{7, 9});
}

TEST_CASE("sequential and struct models: parameters by name, gradcheck through the model") {
    dl::Context c({.seed = 9, .threads = 1});
    dl::nn::sequential model{dl::nn::linear<double>(3, 4, true, c), dl::nn::tanh{}, dl::nn::linear<double>(4, 2, true, c)};
    std::vector<std::string> names;
    model.for_each_parameter([&](std::string_view n, auto&) { names.emplace_back(n); });
    CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
    CHECK(dl::nn::parameter_count(model) == 3 * 4 + 4 + 4 * 2 + 2);
    const auto x = dl::normal<double>({5, 3}, 0, 1, c);
    CHECK_GRAD([&](const auto& in) { return model(in); }, x);

    two_layer net(c);
    names.clear();
    net.for_each_parameter([&](std::string_view n, auto&) { names.emplace_back(n); });
    CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
    CHECK_GRAD([&](const auto& in) { return net(in); }, x);
}

TEST_CASE("sequential runs an activation after linear or conv2d in the product's epilogue: same values and gradients") {
    dl::Context c({.seed = 5, .threads = 1});
    dl::nn::sequential model{dl::nn::linear<double>(6, 5, true, c), dl::nn::relu{}, dl::nn::linear<double>(5, 4, true, c),
                             dl::nn::tanh{}, dl::nn::linear<double>(4, 3, true, c), dl::nn::sigmoid{}};
    const auto x = dl::normal<double>({7, 6}, 0, 1, c);
    auto layer_by_layer = [&](const Tensor<double>& in) {
        return dl::nn::sigmoid{}(model.get<4>()(dl::nn::tanh{}(model.get<2>()(dl::nn::relu{}(model.get<0>()(in))))));
    };
    std::vector<Tensor<double>> fused_grads, plain_grads;
    dl::sum(model(x) * x.slice(1, 0, 3)).backward();
    model.for_each_parameter([&](std::string_view, Tensor<double>& p) { fused_grads.push_back(p.grad().clone()); });
    dl::nn::zero_grad(dl::nn::parameters<double>(model));
    const auto y = layer_by_layer(x);
    dl::sum(y * x.slice(1, 0, 3)).backward();
    model.for_each_parameter([&](std::string_view, Tensor<double>& p) { plain_grads.push_back(p.grad().clone()); });
    CHECK(dl_test::same_elements(model(x), y, 1e-12));
    REQUIRE(fused_grads.size() == 6);
    for (std::size_t i = 0; i < fused_grads.size(); ++i) CHECK(dl_test::same_elements(fused_grads[i], plain_grads[i], 1e-12));
    CHECK_GRAD([&](const auto& in) { return model(in); }, x);

    // The forward is three products and nothing else; a conv2d whose options name an activation keeps
    // it, and the relu after it runs on its own.
    dl::prof::profiler p;
    {
        const dl::no_grad off(c);
        c.set_profiler(&p);
        (void)model(x);
        c.set_profiler(nullptr);
    }
    for (const auto& row : p.summary()) CHECK_MESSAGE(row.name == "matmul", row.name);
    dl::nn::sequential convs{dl::nn::conv2d<double>(2, 3, 3, {.padding = 1, .act = dl::activation::tanh}, true, c),
                             dl::nn::relu{}, dl::nn::conv2d<double>(3, 2, 3, {}, true, c), dl::nn::relu{}};
    const auto image = dl::normal<double>({2, 2, 5, 5}, 0, 1, c);
    const Tensor<double> tanh_then_relu =
        dl::relu(dl::tanh(dl::conv2d(image, convs.get<0>().weight, convs.get<0>().bias, {.padding = 1})));
    const Tensor<double> expected = dl::relu(convs.get<2>()(tanh_then_relu));
    CHECK(dl_test::same_elements(convs(image), expected, 1e-12));
    CHECK_GRAD([&](const auto& in) { return convs(in); }, image);
}

TEST_CASE("a custom layer written as an expression gets its backward for free") {
    dl::Context c({.seed = 2, .threads = 1});
    const auto x = dl::normal<double>({3, 4}, 0, 1, c), g = dl::normal<double>({3, 4}, 0, 1, c),
               r = dl::normal<double>({4}, 0, 1, c);
    CHECK_GRAD([](const auto& a, const auto& b, const auto& d) { return gated{}(a, b, d); }, x, g, r);
}

TEST_CASE("activation layers, flatten, dropout, residual") {
    dl::Context c({.seed = 4, .threads = 1});
    const auto x = dl::normal<double>({2, 3, 2}, 0, 1, c);
    CHECK_GRAD([](const auto& a) { return dl::nn::gelu{}(a); }, x);
    CHECK_GRAD([](const auto& a) { return dl::nn::log_softmax{}(a); }, x);
    CHECK(dl::nn::flatten{}(x).shape() == dl::Shape{2, 6});
    dl::nn::dropout drop(0.25);
    Tensor<float> ones = dl::ones<float>({10000}, c);
    const auto kept = dl::sum(drop(ones)).item() / 10000.0f;
    CHECK(kept == doctest::Approx(1.0).epsilon(0.05));
    drop.train(false);
    CHECK(dl_test::same_elements(drop(ones), ones));
    CHECK(dl_test::error_message([] { dl::nn::dropout bad(1.0); }).find("[0, 1)") != std::string::npos);
    dl::nn::residual block(dl::nn::sequential{dl::nn::linear<double>(2, 2, true, c), dl::nn::tanh{}});
    const auto y = dl::normal<double>({4, 2}, 0, 1, c);
    CHECK_GRAD([&](const auto& a) { return block(a); }, y);
}

TEST_CASE("losses against their definitions, with gradients") {
    dl::Context c({.seed = 8, .threads = 1});
    const auto a = dl::normal<double>({4, 3}, 0, 1, c), b = dl::normal<double>({4, 3}, 0, 1, c);
    using dl::nn::reduction;
    for (auto r : {reduction::none, reduction::mean, reduction::sum}) {
        CHECK_GRAD([r](const auto& x, const auto& y) { return dl::nn::mse_loss(x, y, r); }, a, b);
        CHECK_GRAD([r](const auto& x, const auto& y) { return dl::nn::l1_loss(x, y, r); }, a, b);
        CHECK_GRAD([r](const auto& x, const auto& y) { return dl::nn::smooth_l1_loss(x, y, r, 0.5); }, a, b);
        CHECK_GRAD([r](const auto& x, const auto& y) { return dl::nn::binary_cross_entropy_with_logits(x, y, r); },
                   a, dl::uniform<double>({4, 3}, 0, 1, c));
    }
    CHECK(dl::nn::mse_loss(a, b).item() == doctest::Approx(dl::mean(dl::square(a - b)).item()));

    const auto logits = dl::tensor<double>({{1.0, 2.0, 0.5}, {0.1, -1.0, 3.0}, {0.0, 0.0, 0.0}, {2.0, 1.0, 1.0}});
    const auto target = dl::tensor<std::int64_t>({1, 2, 0, 1});
    // Reference: -log softmax at the target, averaged.
    double ref = 0;
    for (int i = 0; i < 4; ++i) {
        double s = 0;
        for (int j = 0; j < 3; ++j) s += std::exp(logits(i, j));
        ref += std::log(s) - logits(i, target(i));
    }
    CHECK(dl::nn::cross_entropy(logits, target).item() == doctest::Approx(ref / 4));
    for (double smoothing : {0.0, 0.2})
        for (auto r : {reduction::none, reduction::mean, reduction::sum})
            CHECK_GRAD([&](const auto& x) {
                return dl::nn::cross_entropy(x, target, {.reduce = r, .label_smoothing = smoothing, .ignore_index = 2});
            }, logits);
    CHECK_GRAD([&](const auto& x) { return dl::nn::nll_loss(dl::log_softmax(x), target); }, logits);
    CHECK(dl::nn::nll_loss(dl::log_softmax(logits), target).item() == doctest::Approx(ref / 4));
    const auto bad = dl::tensor<std::int64_t>({1, 3, 0, 1});
    CHECK(dl_test::error_message([&] { (void)dl::nn::cross_entropy(logits, bad); }).find("target 3 at row 1") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::nn::mse_loss(a, logits.slice(1, 0, 2)); }).find("differ") !=
          std::string::npos);
}
