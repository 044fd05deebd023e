// Tracing: every layer traced gives what it gives eagerly, on other inputs than the example and at
// another batch size; the graph text; parameters by reference; clear errors for what is not traced.
#include "support.hpp"

#include <dl/graph/trace.hpp>

#include <string>

namespace {

using dl::Tensor;

/// Traces f on `example`, then checks the graph against eager f on a fresh input with `batch` rows.
template <class F>
void check_traced(F f, const Tensor<float>& example, std::int64_t batch, double tolerance = 1e-5) {
    auto g = dl::graph::trace(f, example);
    dl::Shape shape = example.shape();
    shape[0] = batch;
    const Tensor<float> x = dl::uniform<float>(shape, -2, 2, example.context());
    const Tensor<float> expected = f(x);
    for (bool optimized : {false, true}) {
        if (optimized) g.optimize();
        for (auto how : {dl::graph::strategy::in_order, dl::graph::strategy::parallel}) {
            g.set_strategy(how);
            const Tensor<float> got = g(x);
            INFO(g.to_string());
            CHECK(got.shape() == expected.shape());
            CHECK(dl_test::same_elements(got, expected, tolerance));
        }
    }
}

}  // namespace

TEST_CASE("graph: a traced elementwise chain prints one node per op and reruns on new inputs") {
    dl::Context ctx({.seed = 3, .threads = 2});
    const auto x = dl::uniform<float>({4, 8}, -1, 1, ctx), y = dl::uniform<float>({4, 8}, -1, 1, ctx);
    auto f = [](const Tensor<float>& a, const Tensor<float>& b) { return dl::sigmoid(a * 1.5f + b) - dl::tanh(a); };
    auto g = dl::graph::trace(f, x, y);
    const std::string text = g.to_string();
    CHECK(text.find("graph(%0: float32[N, 8], %1: float32[N, 8])") != std::string::npos);
    CHECK(text.find("mul(%0) {s1=1.5} : float32[N, 8]") != std::string::npos);
    CHECK(text.find("sigmoid(") != std::string::npos);
    CHECK(text.find("tanh(%0)") != std::string::npos);
    CHECK(g.graph().nodes.size() == 5);
    const auto a = dl::uniform<float>({7, 8}, -1, 1, ctx), b = dl::uniform<float>({7, 8}, -1, 1, ctx);
    const Tensor<float> expected = f(a, b);
    CHECK(dl_test::same_elements(g(a, b), expected, 1e-6));
}


// A traced op runs, at trace time and in the graph, as its tile kernel over a chain of one step
// (autograd/tiles.hpp), which densifies what it cannot read tile by tile: a broadcast row, a
// transposed view, a one-element tensor, a number; and keeps a 0-row batch empty.
TEST_CASE("graph: traced single ops over broadcast, strided and scalar operands equal eager") {
    dl::Context ctx({.seed = 5, .threads = 2});
    const auto x = dl::uniform<float>({5, 8}, -1, 1, ctx);
    const auto row = dl::uniform<float>({1, 8}, -1, 1, ctx), column = dl::uniform<float>({8, 5}, -1, 1, ctx);
    const auto scale = dl::uniform<float>({1}, 1, 2, ctx);
    auto f = [&](const Tensor<float>& a) { return dl::exp(a + row) * column.transpose(0, 1) - a * scale + 0.5f; };
    const Tensor<float> expected = f(x);
    auto g = dl::graph::trace(f, x);
    for (bool optimized : {false, true}) {
        if (optimized) g.optimize();
        INFO(g.to_string());
        CHECK(dl_test::same_elements(g(x), expected, 1e-6));
    }
    auto h = dl::graph::trace([&](const Tensor<float>& a) { return dl::exp(a + row) * scale; }, x);
    const Tensor<float> want = dl::exp(x + row) * scale;
    CHECK(dl_test::same_elements(h(x), want, 1e-6));
    const Tensor<float> none = h(Tensor<float>({0, 8}, ctx));
    CHECK(none.shape() == dl::Shape{0, 8});
}
TEST_CASE("graph: every layer traced equals eager, at another batch size, optimised or not") {
    dl::Context ctx({.seed = 5, .threads = 2});
    SUBCASE("linear + relu + linear") {
        dl::nn::sequential m{dl::nn::linear<float>(6, 5, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(5, 3, true, ctx)};
        check_traced([&](const Tensor<float>& x) { return m(x); }, dl::uniform<float>({4, 6}, -1, 1, ctx), 9);
    }
    SUBCASE("activations") {
        dl::nn::sequential m{dl::nn::tanh{}, dl::nn::sigmoid{}, dl::nn::gelu{}, dl::nn::silu{}, dl::nn::softplus{},
                             dl::nn::leaky_relu{}, dl::nn::elu{}};
        check_traced([&](const Tensor<float>& x) { return m(x); }, dl::uniform<float>({3, 5}, -1, 1, ctx), 2);
    }
    SUBCASE("softmax and log_softmax") {
        dl::nn::sequential m{dl::nn::softmax{}, dl::nn::log_softmax{}};
        check_traced([&](const Tensor<float>& x) { return m(x); }, dl::uniform<float>({3, 5}, -1, 1, ctx), 4);
    }
    SUBCASE("the Fashion-MNIST CNN: conv2d, relu, max_pool2d, flatten, linear") {
        dl::nn::sequential m{dl::nn::conv2d<float>(1, 4, 3, {.padding = 1}, true, ctx), dl::nn::relu{},
                             dl::nn::max_pool2d({.kernel = 2}), dl::nn::conv2d<float>(4, 6, 3, {.padding = 1}, true, ctx),
                             dl::nn::relu{}, dl::nn::avg_pool2d({.kernel = 2}), dl::nn::flatten{},
                             dl::nn::linear<float>(6 * 2 * 2, 3, true, ctx)};
        check_traced([&](const Tensor<float>& x) { return m(x); }, dl::uniform<float>({2, 1, 8, 8}, 0, 1, ctx), 5, 1e-4);
    }
    SUBCASE("batch_norm (evaluation) and layer_norm") {
        dl::nn::batch_norm<float> bn(3, {}, ctx);
        bn.train(false);
        {
            const dl::no_grad off(ctx);
            bn.running_mean = dl::uniform<float>({3}, -1, 1, ctx);
            bn.running_var = dl::uniform<float>({3}, 0.5, 2, ctx);
        }
        check_traced([&](const Tensor<float>& x) { return bn(x); }, dl::uniform<float>({2, 3, 4, 4}, -1, 1, ctx), 3);
        dl::nn::layer_norm<float> ln({5}, 1e-5, true, ctx);
        check_traced([&](const Tensor<float>& x) { return ln(x); }, dl::uniform<float>({4, 5}, -1, 1, ctx), 6);
    }
    SUBCASE("adaptive_avg_pool2d") {
        check_traced([](const Tensor<float>& x) { return dl::adaptive_avg_pool2d(x, {2, 3}); },
                     dl::uniform<float>({2, 3, 5, 7}, -1, 1, ctx), 4);
    }
    SUBCASE("reductions over expressions, views and cat") {
        check_traced(
            [](const Tensor<float>& x) {
                Tensor<float> s = dl::sum(x * x, {1}, true);
                Tensor<float> m = dl::max(dl::abs(x), {1}, true);
                Tensor<float> v = dl::var(x, {1}, true);
                Tensor<float> joined = dl::cat(std::vector<Tensor<float>>{s, m, v}, 1);
                return Tensor<float>(joined.transpose(0, 1).contiguous().transpose(0, 1) + dl::mean(x, {1}, true));
            },
            dl::uniform<float>({3, 6}, -1, 1, ctx), 5);
    }
    SUBCASE("multi-head attention") {
        dl::nn::multihead_attention<float> attention(8, 2, ctx);
        check_traced([&](const Tensor<float>& x) { return attention(x, x, x); }, dl::uniform<float>({2, 3, 8}, -1, 1, ctx),
                     4, 1e-4);
    }
    SUBCASE("embedding lookups: the ids are the input") {
        dl::nn::embedding<float> table(10, 4, ctx);
        const Tensor<std::int64_t> ids = dl::arange<std::int64_t>(0, 6, 1, ctx).reshape({3, 2});
        auto f = [&](const Tensor<std::int64_t>& i) { return table(i); };
        auto g = dl::graph::trace(f, ids);
        const Tensor<std::int64_t> other = dl::full<std::int64_t>({5, 2}, 7, ctx);
        CHECK(dl_test::same_elements(g(other), f(other)));
    }
}

TEST_CASE("graph: recurrent layers and losses traced equal eager") {
    dl::Context ctx({.seed = 6, .threads = 1});
    SUBCASE("lstm and gru, at the traced batch size (their zero initial state is a constant of that size)") {
        dl::nn::lstm<float> lstm(3, 4, ctx);
        check_traced([&](const Tensor<float>& x) { return lstm(x).output; }, dl::uniform<float>({2, 5, 3}, -1, 1, ctx), 2);
        dl::nn::gru<float> gru(3, 4, ctx);
        check_traced([&](const Tensor<float>& x) { return gru(x).output; }, dl::uniform<float>({2, 5, 3}, -1, 1, ctx), 2);
    }
    SUBCASE("cross_entropy and nll_loss record themselves, the targets an input of the graph") {
        dl::nn::linear<float> head(6, 4, true, ctx);
        auto loss = [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) {
            const Tensor<float> scores = head(x);
            return Tensor<float>(dl::nn::cross_entropy(scores, y, {.label_smoothing = 0.1}) +
                                 dl::nn::nll_loss(dl::log_softmax(scores, 1), y, dl::nn::reduction::sum));
        };
        const Tensor<float> x = dl::uniform<float>({5, 6}, -1, 1, ctx);
        Tensor<std::int64_t> y({5}, ctx);
        for (std::int64_t i = 0; i < 5; ++i) y(i) = i % 4;
        auto g = dl::graph::trace(loss, x, y);
        const std::string text = g.to_string();
        CAPTURE(text);
        CHECK(text.find("cross_entropy(") != std::string::npos);
        CHECK(text.find("nll_loss(") != std::string::npos);
        const Tensor<float> other = dl::uniform<float>({9, 6}, -1, 1, ctx);
        Tensor<std::int64_t> labels({9}, ctx);
        for (std::int64_t i = 0; i < 9; ++i) labels(i) = (i * 3) % 4;
        g.optimize();
        CHECK(dl_test::same_elements(g(other, labels), loss(other, labels), 1e-5));
    }
}

TEST_CASE("graph: parameters are held by reference, so updates show in the next run") {
    dl::Context ctx({.seed = 1, .threads = 1});
    dl::nn::linear<float> layer(3, 2, true, ctx);
    const auto x = dl::uniform<float>({4, 3}, -1, 1, ctx);
    auto g = dl::graph::trace([&](const Tensor<float>& in) { return layer(in); }, x);
    g.optimize();
    CHECK(g.to_string().find("parameter : float32[2, 3]") != std::string::npos);
    {
        const dl::no_grad off(ctx);
        layer.weight *= 2.0f;
    }
    const Tensor<float> expected = layer(x);
    CHECK(dl_test::same_elements(g(x), expected, 1e-6));
}

TEST_CASE("graph: what cannot be traced fails clearly") {
    dl::Context ctx({.seed = 1, .threads = 1});
    const auto x = dl::uniform<float>({2, 3}, -1, 1, ctx);
    SUBCASE("writing into a traced value") {
        auto write = [](const Tensor<float>& in) {
            Tensor<float> y = in * 2.0f;
            y.slice(1, 0, 1) = in.slice(1, 0, 1);
            return y;
        };
        CHECK_THROWS_WITH_AS(dl::graph::trace(write, x), doctest::Contains("a traced value"), dl::error);
        CHECK(ctx.recorder() == nullptr);  // detached again after the failure
    }
    SUBCASE("inputs of the wrong type or shape") {
        auto g = dl::graph::trace([](const Tensor<float>& in) { return dl::relu(in); }, x);
        CHECK_THROWS_WITH_AS(g(dl::zeros<float>({2, 4}, ctx)), doctest::Contains("%0 is float32[N, 3], got float32[2, 4]"),
                             dl::error);
        CHECK_THROWS_WITH_AS(g(dl::zeros<double>({2, 3}, ctx)), doctest::Contains("got float64"), dl::error);
        CHECK(g(dl::zeros<float>({5, 3}, ctx)).shape() == dl::Shape{5, 3});  // another batch is fine
    }
    SUBCASE("writing into a constant made inside the traced code is allowed") {
        auto f = [&](const Tensor<float>& in) {
            Tensor<float> bias = dl::zeros<float>({3}, ctx);
            bias.fill(0.5f);
            return Tensor<float>(in + bias);
        };
        auto g = dl::graph::trace(f, x);
        CHECK(dl_test::same_elements(g(x), f(x)));
    }
}
