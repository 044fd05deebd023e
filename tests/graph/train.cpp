// Training in graph mode (graph/differentiate.hpp): the differentiated graph gives eager autograd's
// gradients, through rules of its own or through vjp nodes (conv2d, pooling, layer_norm, reductions,
// softmax); a graph training step moves the parameters exactly as the eager loop does; what has no
// gradient rule fails clearly.
#include "support.hpp"

#include <dl/dl.hpp>
#include <dl/graph/differentiate.hpp>

#include <string>
#include <vector>

namespace {

using dl::Tensor;
namespace graph = dl::graph;
using any_tensor = dl::autograd::any_tensor;

/// A model with two branches joined by add and mul, so gradients meet and accumulate.
struct two_branch {
    explicit two_branch(dl::Context& ctx)
        : a(6, 8, true, ctx), b(6, 8, true, ctx), head(8, 4, true, ctx), scale(dl::uniform<float>({8}, 0.5f, 1.5f, ctx)) {
        scale.requires_grad_();
    }
    Tensor<float> operator()(const Tensor<float>& x) {
        const Tensor<float> left = dl::relu(a(x));
        const Tensor<float> right = dl::tanh(b(x));
        const Tensor<float> joined = (left + right) * dl::sigmoid(right) - left * scale;
        return head(joined.reshape({x.shape()[0], 2, 4}).reshape({x.shape()[0], 8}));
    }
    std::vector<Tensor<float>> parameters() { return {a.weight, a.bias, b.weight, b.bias, head.weight, head.bias, scale}; }
    dl::nn::linear<float> a, b, head;
    Tensor<float> scale;
};

Tensor<std::int64_t> labels(std::int64_t n, dl::Context& ctx) {
    Tensor<std::int64_t> y({n}, ctx);
    for (std::int64_t i = 0; i < n; ++i) y(i) = (i * 7) % 4;
    return y;
}

/// The graph's outputs (the loss, then the gradients of `gradients`' parameters, in parameter-value
/// order) against eager autograd's loss and the parameters' .grad() after eager.backward().
void check_against_eager(const graph::function& f, const std::vector<std::pair<int, int>>& gradients,
                         const std::vector<any_tensor>& out, const Tensor<float>& eager) {
    CHECK(dl_test::same_elements(std::get<Tensor<float>>(out[0]), eager, 1e-6));
    for (std::size_t i = 0; i < gradients.size(); ++i) {
        const Tensor<float>& p = std::get<Tensor<float>>(f.graph().values[std::size_t(gradients[i].first)].data);
        CHECK(dl_test::same_elements(std::get<Tensor<float>>(out[1 + i]), p.grad(), 1e-5));
    }
}

}  // namespace

TEST_CASE("graph training: the differentiated graph gives eager autograd's gradients") {
    dl::Context ctx({.seed = 21, .threads = 2});
    two_branch model(ctx);
    auto loss = [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) {
        return dl::nn::cross_entropy(model(x), y, {.label_smoothing = 0.1});
    };
    const Tensor<float> x = dl::uniform<float>({5, 6}, -1, 1, ctx);
    auto f = graph::trace(loss, x, labels(5, ctx));
    std::vector<std::pair<int, int>> gradients;
    f.transform([&](graph::Graph& g) { gradients = graph::differentiate(g, g.outputs.at(0)); });
    REQUIRE(gradients.size() == 7);
    const std::string text = f.to_string();
    CAPTURE(text);
    CHECK(text.find("cross_entropy_grad(") != std::string::npos);
    for (bool optimized : {false, true}) {
        if (optimized) f.optimize();
        for (std::int64_t batch : {5, 9}) {
            CAPTURE(optimized);
            CAPTURE(batch);
            const Tensor<float> in = dl::uniform<float>({batch, 6}, -1, 1, ctx);
            const auto out = f.run(std::vector<any_tensor>{in, labels(batch, ctx)});
            REQUIRE(out.size() == 8);
            dl::nn::zero_grad(model.parameters());
            Tensor<float> eager = loss(in, labels(batch, ctx));
            eager.backward();
            check_against_eager(f, gradients, out, eager);
        }
    }
}

TEST_CASE("graph training: scalar-operand ops, div, exp, log, square, sqrt and transpose get eager's gradients") {
    dl::Context ctx({.seed = 24, .threads = 1});
    dl::nn::linear<float> layer(6, 4, true, ctx);
    Tensor<float> w = dl::uniform<float>({4, 4}, -1, 1, ctx);
    w.requires_grad_();
    auto loss = [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) {
        const Tensor<float> z = dl::matmul(layer(x), w.t());
        const Tensor<float> p = dl::exp(z * 0.5f) + 1.0f;  // > 1, so log, sqrt and division are smooth
        const Tensor<float> q = dl::log(p) / p;
        const Tensor<float> logits = 2.0f / p + (1.0f - q) + (dl::sqrt(p) - dl::square(z) * 0.1f) / 3.0f - (q - 0.5f);
        return dl::nn::cross_entropy(logits, y);
    };
    auto f = graph::trace(loss, dl::uniform<float>({5, 6}, -1, 1, ctx), labels(5, ctx));
    std::vector<std::pair<int, int>> gradients;
    f.transform([&](graph::Graph& g) { gradients = graph::differentiate(g, g.outputs.at(0)); });
    REQUIRE(gradients.size() == 3);
    const std::string text = f.to_string();
    CAPTURE(text);
    for (const char* op : {"transpose(", "exp(", "log(", "sqrt(", "square(", "div(", "{s0=2}", "{s0=1}", "{s1=3}"})
        CHECK(text.find(op) != std::string::npos);
    for (bool optimized : {false, true}) {
        if (optimized) f.optimize();
        const Tensor<float> in = dl::uniform<float>({7, 6}, -1, 1, ctx);
        const auto out = f.run(std::vector<any_tensor>{in, labels(7, ctx)});
        dl::nn::zero_grad(std::vector<Tensor<float>>{layer.weight, layer.bias, w});
        Tensor<float> eager = loss(in, labels(7, ctx));
        eager.backward();
        check_against_eager(f, gradients, out, eager);
    }
}

TEST_CASE("graph training: a graph step moves the parameters as the eager loop does") {
    auto make = [](dl::Context& ctx) {
        return dl::nn::sequential{dl::nn::linear<float>(12, 16, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(16, 8, true, ctx),
                                  dl::nn::relu{}, dl::nn::linear<float>(8, 4, true, ctx)};
    };
    dl::Context eager_ctx({.seed = 22, .threads = 1}), graph_ctx({.seed = 22, .threads = 1});
    auto eager_model = make(eager_ctx);
    auto graph_model = make(graph_ctx);
    dl::nn::adam<float> eager_opt(dl::nn::parameters(eager_model), {.lr = 1e-2});
    dl::nn::adam<float> graph_opt(dl::nn::parameters(graph_model), {.lr = 1e-2});
    auto step = graph::train(
        [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(graph_model(x), y); }, graph_opt,
        dl::uniform<float>({4, 12}, -1, 1, graph_ctx), labels(4, graph_ctx));
    const std::string text = step.graph().to_string();
    CAPTURE(text);
    CHECK(text.find("linear(") != std::string::npos);
    CHECK(text.find("fused(") != std::string::npos);  // the relu gradients' where chains
    for (int i = 0; i < 4; ++i) {
        const std::int64_t batch = i % 2 ? 6 : 4;
        const Tensor<float> x = dl::uniform<float>({batch, 12}, -1, 1, eager_ctx);
        const Tensor<float> x_copy = x.clone();
        Tensor<float> eager_loss = dl::nn::cross_entropy(eager_model(x), labels(batch, eager_ctx));
        eager_loss.backward();
        eager_opt.step();
        std::vector<Tensor<float>> eager_grads;
        for (const auto& p : dl::nn::parameters(eager_model)) eager_grads.push_back(p.grad().clone());
        eager_opt.zero_grad();
        const Tensor<float> graph_loss = step(Tensor<float>(x_copy.contiguous()), labels(batch, graph_ctx));
        CHECK(graph_loss.item() == doctest::Approx(eager_loss.item()).epsilon(1e-5));
        // The step's gradients stay readable until the next step (which drops them before it runs).
        const auto graph_params = dl::nn::parameters(graph_model);
        for (std::size_t k = 0; k < graph_params.size(); ++k) {
            REQUIRE(graph_params[k].grad().defined());
            CHECK(dl_test::same_elements(graph_params[k].grad(), eager_grads[k], 1e-4));
        }
    }
    const auto eager_params = dl::nn::parameters(eager_model), graph_params = dl::nn::parameters(graph_model);
    REQUIRE(eager_params.size() == graph_params.size());
    for (std::size_t i = 0; i < eager_params.size(); ++i) CHECK(dl_test::same_elements(eager_params[i], graph_params[i], 1e-5));
}

TEST_CASE("graph training: conv2d, pooling, layer_norm, softmax and reductions get eager's gradients through vjp nodes") {
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        dl::Context ctx({.seed = 25, .threads = threads});
        dl::nn::conv2d<float> conv(2, 3, 3, {.padding = 1}, true, ctx);
        dl::nn::layer_norm<float> norm(dl::Shape{12}, 1e-5, true, ctx);
        dl::nn::linear<float> head(12, 4, true, ctx);
        auto loss = [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) {
            const Tensor<float> c = dl::relu(conv(x));                                     // [N, 3, 6, 6]
            const Tensor<float> p = dl::max_pool2d(c, {.kernel = 2});                      // [N, 3, 3, 3]
            const Tensor<float> a = dl::avg_pool2d(p, {.kernel = 2, .stride = 1});         // [N, 3, 2, 2]
            const Tensor<float> h = norm(a.reshape({x.shape()[0], 12}));
            const Tensor<float> s = dl::softmax(h, 1) * 4.0f + dl::mean(h, {1}, true);
            return Tensor<float>(dl::nn::cross_entropy(head(s), y) + dl::sum(dl::square(conv.weight)) * 0.01f);
        };
        auto f = graph::trace(loss, dl::uniform<float>({4, 2, 6, 6}, -1, 1, ctx), labels(4, ctx));
        std::vector<std::pair<int, int>> gradients;
        f.transform([&](graph::Graph& g) { gradients = graph::differentiate(g, g.outputs.at(0)); });
        REQUIRE(gradients.size() == 6);
        const std::string text = f.to_string();
        CAPTURE(text);
        for (const char* op : {"vjp(", "{of=conv2d", "{of=max_pool2d", "{of=avg_pool2d", "{of=layer_norm", "{of=softmax",
                               "{of=mean", "{of=sum", "vjp_part("})
            CHECK(text.find(op) != std::string::npos);
        for (bool optimized : {false, true}) {
            if (optimized) f.optimize();
            for (std::int64_t batch : {4, 7}) {  // the packed gradients follow the run's batch
                CAPTURE(optimized);
                CAPTURE(batch);
                const Tensor<float> in = dl::uniform<float>({batch, 2, 6, 6}, -1, 1, ctx);
                const auto out = f.run(std::vector<any_tensor>{in, labels(batch, ctx)});
                REQUIRE(out.size() == 7);
                const std::vector<Tensor<float>> params{conv.weight, conv.bias, norm.weight, norm.bias, head.weight, head.bias};
                dl::nn::zero_grad(params);
                Tensor<float> eager = loss(in, labels(batch, ctx));
                eager.backward();
                check_against_eager(f, gradients, out, eager);
            }
        }
    }
}

TEST_CASE("graph training: a CNN's graph step moves the parameters as the eager loop does") {
    struct cnn {
        explicit cnn(dl::Context& ctx) : conv(1, 4, 3, {}, true, ctx), head(4 * 3 * 3, 5, true, ctx) {}
        Tensor<float> operator()(const Tensor<float>& x) {
            const Tensor<float> p = dl::max_pool2d(Tensor<float>(dl::relu(conv(x))), {.kernel = 2});
            return head(p.reshape({x.shape()[0], 4 * 3 * 3}));
        }
        std::vector<Tensor<float>> parameters() { return {conv.weight, conv.bias, head.weight, head.bias}; }
        dl::nn::conv2d<float> conv;
        dl::nn::linear<float> head;
    };
    dl::Context eager_ctx({.seed = 26, .threads = 2}), graph_ctx({.seed = 26, .threads = 2});
    cnn eager_model(eager_ctx), graph_model(graph_ctx);
    dl::nn::sgd<float> eager_opt(eager_model.parameters(), {.lr = 0.1, .momentum = 0.9});
    dl::nn::sgd<float> graph_opt(graph_model.parameters(), {.lr = 0.1, .momentum = 0.9});
    auto step = graph::train(
        [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(graph_model(x), y); }, graph_opt,
        dl::uniform<float>({3, 1, 8, 8}, -1, 1, graph_ctx), labels(3, graph_ctx));
    for (int i = 0; i < 4; ++i) {
        const std::int64_t batch = i % 2 ? 5 : 3;
        const Tensor<float> x = dl::uniform<float>({batch, 1, 8, 8}, -1, 1, eager_ctx);
        Tensor<float> eager_loss = dl::nn::cross_entropy(eager_model(x), labels(batch, eager_ctx));
        eager_loss.backward();
        eager_opt.step();
        eager_opt.zero_grad();
        const Tensor<float> graph_loss = step(Tensor<float>(x.clone()), labels(batch, graph_ctx));
        CHECK(graph_loss.item() == doctest::Approx(eager_loss.item()).epsilon(1e-5));
    }
    const auto eager_params = eager_model.parameters(), graph_params = graph_model.parameters();
    for (std::size_t i = 0; i < eager_params.size(); ++i) CHECK(dl_test::same_elements(eager_params[i], graph_params[i], 1e-5));
}

TEST_CASE("graph training: what cannot be differentiated fails clearly") {
    dl::Context ctx({.seed = 23, .threads = 1});
    dl::nn::linear<float> first(3, 3, true, ctx);
    auto no_rule = graph::trace([&](const Tensor<float>& in) { return dl::mean(dl::sin(first(in))); },
                                dl::uniform<float>({4, 3}, -1, 1, ctx));
    CHECK_THROWS_WITH_AS(no_rule.transform([](graph::Graph& g) { (void)graph::differentiate(g, g.outputs[0]); }),
                         doctest::Contains("no gradient rule for sin"), dl::error);
    dl::nn::dropout drop(0.5);
    auto effect = graph::trace([&](const Tensor<float>& in) { return dl::mean(drop(first(in))); },
                               dl::uniform<float>({4, 3}, -1, 1, ctx));
    CHECK_THROWS_WITH_AS(effect.transform([](graph::Graph& g) { (void)graph::differentiate(g, g.outputs[0]); }),
                         doctest::Contains("no gradient rule for dropout (an op with effects)"), dl::error);
    dl::nn::linear<float> layer(3, 2, true, ctx);
    const Tensor<float> x = dl::uniform<float>({4, 3}, -1, 1, ctx);
    auto not_scalar = graph::trace([&](const Tensor<float>& in) { return layer(in); }, x);
    CHECK_THROWS_WITH_AS(not_scalar.transform([](graph::Graph& g) { (void)graph::differentiate(g, g.outputs[0]); }),
                         doctest::Contains("the loss must be one float32 element"), dl::error);
    auto no_parameter = graph::trace([&](const Tensor<float>& in) { return dl::mean(in); }, x);
    CHECK_THROWS_WITH_AS(no_parameter.transform([](graph::Graph& g) { (void)graph::differentiate(g, g.outputs[0]); }),
                         doctest::Contains("depends on no parameter"), dl::error);
}
