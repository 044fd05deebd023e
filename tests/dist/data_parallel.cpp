// Data-parallel training (dist/data_parallel.hpp): the allreduce op eager, with its gradient, and
// traced; the graph rewrite; and N in-process replicas moving the parameters as one graph does on the
// whole batch, with a failing replica reported instead of hanging its peers.
#include "support.hpp"

#include <dl/dist/data_parallel.hpp>

#include <string>
#include <thread>
#include <vector>

namespace {

using dl::Tensor;
namespace dist = dl::dist;
namespace graph = dl::graph;

Tensor<std::int64_t> labels(std::int64_t n, dl::Context& ctx, std::int64_t classes = 4) {
    Tensor<std::int64_t> y({n}, ctx);
    for (std::int64_t i = 0; i < n; ++i) y(i) = (i * 5 + 1) % classes;
    return y;
}

auto make_model(dl::Context& ctx) {
    return dl::nn::sequential{dl::nn::linear<float>(10, 16, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(16, 12, true, ctx),
                              dl::nn::tanh{}, dl::nn::linear<float>(12, 4, true, ctx)};
}

}  // namespace

TEST_CASE("dist::allreduce: eager result and gradient on every rank, and traced as one effectful node") {
    dist::in_process_group group(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
            try {
                dl::Context ctx({.seed = 40, .threads = 1});
                const float base = static_cast<float>(r + 1);
                Tensor<float> x = dl::full<float>({3}, base, ctx);  // rank 0: 1s, rank 1: 2s
                x.requires_grad_();
                const Tensor<float> weight = dl::full<float>({3}, 10.0f * base, ctx);
                const Tensor<float> y = dist::allreduce(x, group[r]);
                CHECK(dl_test::same_elements(y, dl::full<float>({3}, 3.0f, ctx), 0));
                // Each rank's loss reads the sum of both ranks' x, so d(loss0 + loss1)/dx_r = w_0 + w_1.
                Tensor<float> loss = dl::sum(y * weight);
                loss.backward();
                CHECK(dl_test::same_elements(x.grad(), dl::full<float>({3}, 30.0f, ctx), 0));
                CHECK_THROWS_WITH_AS((void)dist::allreduce(x, group[r], dist::reduce_op::max), doctest::Contains("no gradient"),
                                     dl::error);

                const Tensor<float> example = dl::full<float>({2, 2}, base, ctx);
                auto f = graph::trace([&](const Tensor<float>& in) { return dist::allreduce(Tensor<float>(in * 2.0f), group[r]); }, example);
                const std::string text = f.to_string();
                CHECK(text.find("allreduce(") != std::string::npos);
                CHECK(text.find("rank=" + std::to_string(r)) != std::string::npos);
                CHECK(dl_test::same_elements(f(example), dl::full<float>({2, 2}, 6.0f, ctx), 0));
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : ranks) t.join();
    for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("dist::data_parallel rewrites a training graph: a share input, one allreduce, outputs of the same types") {
    dl::Context ctx({.seed = 41, .threads = 1});
    auto model = make_model(ctx);
    auto d = graph::detail::differentiate_loss(
        [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); },
        dl::uniform<float>({6, 10}, -1, 1, ctx), labels(6, ctx));
    graph::Graph g = d.graph;
    const std::size_t outputs = g.outputs.size(), inputs = g.inputs.size();
    std::vector<std::string> types;
    for (int id : g.outputs) types.push_back(g.describe_type(id));
    dist::in_process_group group(2);
    dist::data_parallel(g, group[1], ctx);
    const std::string text = g.to_string();
    CAPTURE(text);
    REQUIRE(g.inputs.size() == inputs + 1);
    CHECK(g.describe_type(g.inputs.back()) == "float32[]");
    REQUIRE(g.outputs.size() == outputs);
    for (std::size_t i = 0; i < outputs; ++i) CHECK(g.describe_type(g.outputs[i]) == types[i]);
    std::size_t collectives = 0;
    for (const auto& n : g.nodes) collectives += n.op == "allreduce";
    CHECK(collectives == 1);
    CHECK(text.find("rank=1, size=2") != std::string::npos);
    graph::detail::backward_passes().run(g);  // the passes keep the one collective
    collectives = 0;
    for (const auto& n : g.nodes) collectives += n.op == "allreduce";
    CHECK(collectives == 1);

    graph::Graph not_training = d.graph;
    not_training.outputs.push_back(not_training.inputs.at(1));  // the int64 labels
    CHECK_THROWS_WITH_AS(dist::data_parallel(not_training, group[0], ctx), doctest::Contains("are float32"), dl::error);
}

TEST_CASE("dist::train_data_parallel: N replicas move the parameters as one graph on the whole batch") {
    for (int replicas : {1, 2, 3}) {
        for (auto how : {graph::strategy::in_order, graph::strategy::parallel}) {
            CAPTURE(replicas);
            CAPTURE(static_cast<int>(how));
            dl::Context one_ctx({.seed = 42, .threads = 2}), dp_ctx({.seed = 42, .threads = 2});
            auto one_model = make_model(one_ctx);
            auto dp_model = make_model(dp_ctx);
            dl::nn::sgd<float> one_opt(dl::nn::parameters(one_model), {.lr = 0.1, .momentum = 0.9});
            dl::nn::sgd<float> dp_opt(dl::nn::parameters(dp_model), {.lr = 0.1, .momentum = 0.9});
            auto one = graph::train(
                [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(one_model(x), y); }, one_opt,
                dl::uniform<float>({6, 10}, -1, 1, one_ctx), labels(6, one_ctx));
            auto dp = dist::train_data_parallel(
                [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(dp_model(x), y); }, dp_opt,
                replicas, dl::uniform<float>({6, 10}, -1, 1, dp_ctx), labels(6, dp_ctx));
            dp.set_strategy(how);
            REQUIRE(dp.replicas() == replicas);
            CHECK(dp.replica(replicas - 1).to_string().find("allreduce(") != std::string::npos);
            for (std::int64_t batch : {6, 7, 12, 5}) {  // uneven splits: 7 rows over 2 or 3 replicas
                CAPTURE(batch);
                const Tensor<float> x = dl::uniform<float>({batch, 10}, -1, 1, one_ctx);
                const Tensor<float> x_dp = Tensor<float>::borrow(x.data(), x.shape(), x.strides(), dp_ctx);
                const Tensor<float> one_loss = one(x, labels(batch, one_ctx));
                const Tensor<float> dp_loss = dp(x_dp, labels(batch, dp_ctx));
                CHECK(dp_loss.item() == doctest::Approx(one_loss.item()).epsilon(1e-5));
            }
            const auto a = dl::nn::parameters(one_model), b = dl::nn::parameters(dp_model);
            REQUIRE(a.size() == b.size());
            for (std::size_t i = 0; i < a.size(); ++i) CHECK(dl_test::same_elements(a[i], b[i], 1e-5));
        }
    }
}

TEST_CASE("dist::train_data_parallel: a CNN, whose conv and pooling gradients come from vjp nodes, moves as one graph") {
    struct cnn {
        explicit cnn(dl::Context& ctx) : conv(1, 3, 3, {.padding = 1}, true, ctx), head(3 * 4 * 4, 4, true, ctx) {}
        Tensor<float> operator()(const Tensor<float>& x) {
            const Tensor<float> p = dl::max_pool2d(Tensor<float>(dl::relu(conv(x))), {.kernel = 2});
            return head(p.reshape({x.shape()[0], 3 * 4 * 4}));
        }
        dl::nn::conv2d<float> conv;
        dl::nn::linear<float> head;
    };
    dl::Context one_ctx({.seed = 44, .threads = 2}), dp_ctx({.seed = 44, .threads = 2});
    cnn one_model(one_ctx), dp_model(dp_ctx);
    auto params = [](cnn& m) { return std::vector<Tensor<float>>{m.conv.weight, m.conv.bias, m.head.weight, m.head.bias}; };
    dl::nn::sgd<float> one_opt(params(one_model), {.lr = 0.1});
    dl::nn::sgd<float> dp_opt(params(dp_model), {.lr = 0.1});
    auto one = graph::train([&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(one_model(x), y); },
                            one_opt, dl::uniform<float>({4, 1, 8, 8}, -1, 1, one_ctx), labels(4, one_ctx));
    // Two replicas run their vjp nodes at once: they share one scratch Context, under its lock.
    auto dp = dist::train_data_parallel(
        [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(dp_model(x), y); }, dp_opt, 2,
        dl::uniform<float>({4, 1, 8, 8}, -1, 1, dp_ctx), labels(4, dp_ctx));
    dp.set_strategy(graph::strategy::parallel);
    CHECK(dp.replica(0).to_string().find("vjp(") != std::string::npos);
    for (std::int64_t batch : {4, 7, 6}) {
        CAPTURE(batch);
        const Tensor<float> x = dl::uniform<float>({batch, 1, 8, 8}, -1, 1, one_ctx);
        const Tensor<float> one_loss = one(x, labels(batch, one_ctx));
        const Tensor<float> dp_loss = dp(Tensor<float>::borrow(x.data(), x.shape(), x.strides(), dp_ctx), labels(batch, dp_ctx));
        CHECK(dp_loss.item() == doctest::Approx(one_loss.item()).epsilon(1e-5));
    }
    const auto a = params(one_model), b = params(dp_model);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(dl_test::same_elements(a[i], b[i], 1e-5));
}

TEST_CASE("dist::train_data_parallel: bad batches and a failing replica give clear errors, and training goes on") {
    dl::Context ctx({.seed = 43, .threads = 2});
    auto model = make_model(ctx);
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.1});
    auto dp = dist::train_data_parallel(
        [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); }, opt, 2,
        dl::uniform<float>({4, 10}, -1, 1, ctx), labels(4, ctx));
    CHECK_THROWS_WITH_AS(dp(dl::uniform<float>({1, 10}, -1, 1, ctx), labels(1, ctx)),
                         doctest::Contains("a batch of 1 rows cannot be split over 2 replicas"), dl::error);
    CHECK_THROWS_WITH_AS(dp(dl::uniform<float>({4, 10}, -1, 1, ctx), labels(5, ctx)),
                         doctest::Contains("every input needs the batch of 4 rows"), dl::error);
    CHECK_THROWS_WITH_AS((void)dist::train_data_parallel(
                             [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); },
                             opt, 0, dl::uniform<float>({4, 10}, -1, 1, ctx), labels(4, ctx)),
                         doctest::Contains("at least one replica"), dl::error);

    const auto before = dl::nn::parameters(model);
    std::vector<Tensor<float>> saved;
    for (const auto& p : before) saved.push_back(p.clone());
    // Rows 2 and 3 (the second replica's) name a class the model does not have: that replica fails
    // before the allreduce, the first one is released from it, and the step reports the real error.
    Tensor<std::int64_t> bad = labels(4, ctx);
    bad(3) = 9;
    CHECK_THROWS_WITH_AS(dp(dl::uniform<float>({4, 10}, -1, 1, ctx), bad), doctest::Contains("target 9 at row 1 is not a class"),
                         dl::error);
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(dl_test::same_elements(before[i], saved[i], 0));  // nothing applied
    const Tensor<float> loss = dp(dl::uniform<float>({4, 10}, -1, 1, ctx), labels(4, ctx));
    CHECK(std::isfinite(loss.item()));
}

TEST_CASE("dist::train_distributed: ranks with models of their own stay identical and move as one graph on the whole batch") {
    constexpr int ranks = 2;
    // The reference: rank 0's initial model trained by one graph on the whole batch.
    dl::Context one_ctx({.seed = 100, .threads = 1});
    auto one_model = make_model(one_ctx);
    dl::nn::adam<float> one_opt(dl::nn::parameters(one_model), {.lr = 1e-2});
    auto one = graph::train([&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(one_model(x), y); },
                            one_opt, dl::uniform<float>({5, 10}, -1, 1, one_ctx), labels(5, one_ctx));
    const std::vector<std::int64_t> batches = {5, 7, 2};
    std::vector<Tensor<float>> inputs;
    for (std::int64_t b : batches) inputs.push_back(dl::uniform<float>({b, 10}, -1, 1, one_ctx));
    std::vector<float> one_losses;
    for (std::size_t s = 0; s < batches.size(); ++s) one_losses.push_back(one(inputs[s], labels(batches[s], one_ctx)).item());

    dist::in_process_group group(ranks);
    std::vector<std::vector<std::vector<float>>> trained(ranks);  // values: a rank's Context ends with its thread
    std::vector<std::string> errors(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            try {
                dl::Context ctx({.seed = 100 + static_cast<std::uint64_t>(r), .threads = 1});  // rank 1 starts elsewhere
                auto model = make_model(ctx);
                dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-2});
                auto step = dist::train_distributed(
                    group[r], [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); },
                    opt, dl::uniform<float>({3, 10}, -1, 1, ctx), labels(3, ctx));
                for (std::size_t s = 0; s < batches.size(); ++s) {
                    // Rank r takes rows [b·r/N, b·(r+1)/N): uneven splits (5 and 7 rows over 2 ranks).
                    const std::int64_t b = batches[s], begin = b * r / ranks, end = b * (r + 1) / ranks;
                    const Tensor<float> x = inputs[s].slice(0, begin, end).contiguous();
                    const Tensor<std::int64_t> y = labels(b, ctx).slice(0, begin, end).contiguous();
                    const float loss = step(Tensor<float>::borrow(const_cast<float*>(x.data()), x.shape(), x.strides(), ctx), y).item();
                    CHECK(loss == doctest::Approx(one_losses[s]).epsilon(1e-5));
                }
                for (const auto& p : dl::nn::parameters(model)) trained[static_cast<std::size_t>(r)].push_back(dl_test::to_vector(p));
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (const auto& e : errors) CHECK(e.empty());
    const auto reference = dl::nn::parameters(one_model);
    REQUIRE(trained[0].size() == reference.size());
    for (std::size_t i = 0; i < reference.size(); ++i) {
        CHECK(trained[0][i] == trained[1][i]);  // the same bits on every rank
        const std::vector<float> want = dl_test::to_vector(reference[i]);
        for (std::size_t k = 0; k < want.size(); ++k) REQUIRE(trained[0][i][k] == doctest::Approx(want[k]).epsilon(1e-5));
    }
}

TEST_CASE("dist::train_distributed: a rank's bad batch fails that rank with its error and its peers with the abort") {
    constexpr int ranks = 2;
    dist::in_process_group group(ranks);
    std::vector<std::string> errors(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            dl::Context ctx({.seed = 110, .threads = 1});
            auto model = make_model(ctx);
            dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.1});
            auto step = dist::train_distributed(
                group[r], [&](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); },
                opt, dl::uniform<float>({3, 10}, -1, 1, ctx), labels(3, ctx));
            try {
                (void)step(dl::uniform<float>({3, 10}, -1, 1, ctx), labels(r == 1 ? 4 : 3, ctx));
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    CHECK(errors[1].find("every input needs this rank's 3 rows") != std::string::npos);
    CHECK(errors[0].find("aborted") != std::string::npos);
}
