// The executor: feeds and fetches of any values (only the needed nodes run), both strategies giving
// identical results, errors from a node reaching the caller, the profiler seeing graph nodes.
#include "support.hpp"

#include <dl/graph/trace.hpp>

#include <string>

namespace {

using dl::Tensor;
using dl::autograd::any_tensor;
namespace graph = dl::graph;

int value_made_by(const graph::Graph& g, std::string_view op) {
    for (const auto& n : g.nodes)
        if (n.op == op) return n.output;
    FAIL("no node ", op);
    return -1;
}

}  // namespace

TEST_CASE("graph executor: feed and fetch intermediates; only what the fetches need runs") {
    dl::Context ctx({.seed = 4, .threads = 2});
    const auto x = dl::uniform<float>({3, 4}, -1, 1, ctx), y = dl::uniform<float>({3, 4}, -1, 1, ctx);
    auto f = graph::trace(
        [](const Tensor<float>& a, const Tensor<float>& b) {
            Tensor<float> e = dl::exp(a);
            Tensor<float> s = dl::sin(b);
            return Tensor<float>(e * s);
        },
        x, y);
    for (bool optimized : {false, true}) {
        if (optimized) {
            graph::pass_manager m;  // fusion would hide the intermediates; plan memory only
            m.add(graph::memory_planning());
            f.optimize(m);
        }
        const graph::Graph& g = f.graph();
        const int e = value_made_by(g, "exp"), s = value_made_by(g, "sin"), out = g.outputs[0];
        // Fetch an intermediate: input 1 is not needed, so it need not be fed.
        const std::pair<int, any_tensor> feed_x[] = {{g.inputs[0], x}};
        const int fetch_e[] = {e};
        const auto got = f.run(feed_x, fetch_e);
        CHECK(dl_test::same_elements(std::get<Tensor<float>>(got[0]), Tensor<float>(dl::exp(x)), 1e-6));
        // Feed an intermediate: its producer does not run, and input 0 is not needed.
        const auto fake_e = dl::full<float>({3, 4}, 2.0f, ctx);
        const std::pair<int, any_tensor> feed_e[] = {{e, fake_e}, {g.inputs[1], y}};
        const int fetch_out_s[] = {out, s};
        const auto both = f.run(feed_e, fetch_out_s);
        CHECK(dl_test::same_elements(std::get<Tensor<float>>(both[0]), Tensor<float>(dl::sin(y) * 2.0f), 1e-6));
        CHECK(dl_test::same_elements(std::get<Tensor<float>>(both[1]), Tensor<float>(dl::sin(y)), 1e-6));
        // A fetch that needs an input nobody fed.
        const int fetch_out[] = {out};
        CHECK_THROWS_WITH_AS((void)f.run(feed_x, fetch_out), doctest::Contains("need input %1, which is not fed"), dl::error);
        const int fetch_missing[] = {99};
        CHECK_THROWS_WITH_AS((void)f.run(feed_x, fetch_missing), doctest::Contains("does not exist"), dl::error);
    }
}

TEST_CASE("graph executor: in order and parallel give identical results on a wide graph") {
    dl::Context ctx({.seed = 4, .threads = 2});
    const auto x = dl::uniform<float>({16, 32}, -1, 1, ctx);
    dl::nn::linear<float> a(32, 32, true, ctx), b(32, 32, true, ctx), c(32, 32, true, ctx), d(32, 32, true, ctx);
    auto f = graph::trace(
        [&](const Tensor<float>& in) {
            Tensor<float> left = dl::relu(a(in)), right = dl::tanh(b(in));
            Tensor<float> l2 = c(left), r2 = d(right);
            return Tensor<float>(l2 * r2 + dl::sum(left, {1}, true));
        },
        x);
    f.optimize();
    f.set_strategy(graph::strategy::in_order);
    const Tensor<float> first = f(x);
    f.set_strategy(graph::strategy::parallel);
    for (int i = 0; i < 20; ++i) CHECK(dl_test::same_elements(f(x), first));  // bitwise
}

TEST_CASE("graph executor: an error inside a node reaches the caller, and the function still runs after") {
    dl::Context ctx({.seed = 4, .threads = 2});
    const auto ids = dl::zeros<std::int64_t>({4}, ctx);
    const auto table = dl::uniform<float>({5, 3}, -1, 1, ctx);
    auto f = graph::trace([&](const Tensor<std::int64_t>& i) { return dl::index_select(table, 0, i); }, ids);
    for (auto how : {graph::strategy::in_order, graph::strategy::parallel}) {
        f.set_strategy(how);
        CHECK_THROWS_AS(f(dl::full<std::int64_t>({4}, 9, ctx)), dl::error);  // row 9 of 5
        CHECK(f(ids).shape() == dl::Shape{4, 3});
    }
}

TEST_CASE("graph executor: the profiler sees graph nodes, fused ones included") {
    dl::Context ctx({.seed = 4, .threads = 1});
    const auto x = dl::uniform<float>({8, 8}, -1, 1, ctx);
    auto f = graph::trace([](const Tensor<float>& a) { return Tensor<float>(dl::exp(a) * 2.0f + 1.0f); }, x);
    f.optimize();
    dl::prof::profiler profiler;
    ctx.set_profiler(&profiler);
    (void)f(x);
    ctx.set_profiler(nullptr);
    bool saw_fused = false;
    for (const auto& row : profiler.summary()) saw_fused = saw_fused || row.name == "fused";
    CHECK(saw_fused);
}
