// Each pass on its own: the graph before and after (verifier on), and the results unchanged. The pass
// manager's ordering, its cycle check and its per-pass timings.
#include "support.hpp"

#include <dl/graph/trace.hpp>

#include <algorithm>
#include <string>

namespace {

using dl::Tensor;
namespace graph = dl::graph;

std::size_t count_ops(const graph::Graph& g, std::string_view op) {
    return static_cast<std::size_t>(
        std::count_if(g.nodes.begin(), g.nodes.end(), [&](const graph::node& n) { return n.op == op; }));
}

/// Runs one pass on f's graph and checks the results against the graph before it.
template <class F>
graph::Graph after_pass(F& f, graph::pass p, const std::vector<dl::autograd::any_tensor>& inputs) {
    const auto before = f.run(inputs);
    graph::pass_manager m;
    m.add(std::move(p));
    f.optimize(m);
    const auto after = f.run(inputs);
    REQUIRE(before.size() == after.size());
    for (std::size_t i = 0; i < before.size(); ++i)
        CHECK(dl_test::same_elements(std::get<Tensor<float>>(before[i]), std::get<Tensor<float>>(after[i]), 1e-6));
    return f.graph();
}

}  // namespace

TEST_CASE("graph passes: common-subexpression elimination merges equal ops on equal inputs") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({3, 4}, -1, 1, ctx);
    auto f = graph::trace(
        [](const Tensor<float>& a) {
            Tensor<float> p = dl::exp(a), q = dl::exp(a), r = a * 2.0f, s = a * 3.0f;
            return Tensor<float>(p + q + r + s);
        },
        x);
    CHECK(count_ops(f.graph(), "exp") == 2);
    const auto g = after_pass(f, graph::common_subexpression_elimination(), {x});
    CHECK(count_ops(g, "exp") == 1);
    CHECK(count_ops(g, "mul") == 2);  // different scalars are different ops
}

TEST_CASE("graph passes: constant folding runs constant subgraphs once; parameters are not constants") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({3, 4}, -1, 1, ctx);
    const auto c = dl::uniform<float>({4}, 1, 2, ctx);
    auto w = dl::uniform<float>({4}, 1, 2, ctx).requires_grad_();
    auto f = graph::trace([&](const Tensor<float>& a) { return Tensor<float>(a * dl::sqrt(c * 2.0f) + dl::exp(w)); }, x);
    CHECK(f.graph().nodes.size() == 5);
    const auto g = after_pass(f, graph::constant_folding(), {x});
    CHECK(count_ops(g, "sqrt") == 0);
    CHECK(count_ops(g, "exp") == 1);  // of the parameter: kept
    CHECK(g.nodes.size() == 3);
}

TEST_CASE("graph passes: dead-code elimination drops what no output needs, keeps ops with effects") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({3, 4}, -1, 1, ctx);
    dl::nn::dropout drop(0.5);
    auto f = graph::trace(
        [&](const Tensor<float>& a) {
            [[maybe_unused]] Tensor<float> unused = dl::exp(a) * 2.0f;
            [[maybe_unused]] Tensor<float> dropped = drop(a);  // draws random numbers: stays
            return dl::relu(a);
        },
        x);
    CHECK(f.graph().nodes.size() == 4);
    graph::pass_manager m;
    m.add(graph::dead_code_elimination());
    f.optimize(m);
    CHECK(count_ops(f.graph(), "exp") == 0);
    CHECK(count_ops(f.graph(), "dropout") == 1);
    CHECK(f.graph().nodes.size() == 2);
}

TEST_CASE("graph passes: elementwise fusion makes one fused node of a chain, not of a broadcast or a shared value") {
    dl::Context ctx({.seed = 2, .threads = 2});
    const auto x = dl::uniform<float>({5, 4099}, -1, 1, ctx);  // several tiles and an odd tail
    const auto y = dl::uniform<float>({5, 4099}, -1, 1, ctx);
    const auto bias = dl::uniform<float>({4099}, -1, 1, ctx);
    auto f = graph::trace(
        [&](const Tensor<float>& a, const Tensor<float>& b) {
            Tensor<float> t1 = a * 1.5f;
            Tensor<float> t2 = t1 + b;
            Tensor<float> t3 = dl::sigmoid(t2);
            Tensor<float> t4 = t3 - dl::tanh(a);
            Tensor<float> biased = t4 + bias;  // broadcast input: not fused
            Tensor<bool> positive = biased > 0.0f;  // a bool step
            return std::tuple{Tensor<float>(dl::where(positive, biased, 0.0f) * 2.0f), t2};  // t2 is an output too
        },
        x, y);
    const auto g = after_pass(f, graph::elementwise_fusion(), {x, y});
    INFO(g.to_string());
    // Three chains: t1 and t2 (t2 is an output, so it ends a chain); sigmoid, tanh and sub (reading t2
    // from outside); the comparison, where and the last product. The broadcast bias add stays alone.
    REQUIRE(count_ops(g, "fused") == 3);
    CHECK(count_ops(g, "add") == 1);
    std::vector<std::size_t> steps;
    for (const auto& n : g.nodes)
        if (n.fused()) steps.push_back(n.steps.size());
    CHECK(steps == std::vector<std::size_t>{2, 3, 3});
}

TEST_CASE("graph passes: fused chains of rank 0, of one element and of 16-bit floats") {
    dl::Context ctx({.seed = 2, .threads = 2});
    const auto x = dl::uniform<float>({3, 5}, -1, 1, ctx);
    auto f = graph::trace(
        [](const Tensor<float>& a) {
            Tensor<float> total = dl::sum(a);  // rank 0
            Tensor<float> first = a.slice(1, 0, 1).slice(0, 0, 1);  // [1, 1]
            return std::tuple{Tensor<float>(dl::exp(total) * 2.0f + 1.0f), Tensor<float>(dl::tanh(first) * 3.0f - first)};
        },
        x);
    const auto g = after_pass(f, graph::elementwise_fusion(), {x});
    CHECK(count_ops(g, "fused") == 2);
    const auto xb = dl::uniform<dl::bfloat16>({4, 1000}, -2, 2, ctx);
    auto h = graph::trace([](const Tensor<dl::bfloat16>& a) { return Tensor<dl::bfloat16>(dl::sigmoid(a * 2.0f) - a); }, xb);
    const Tensor<dl::bfloat16> before = h(xb);
    h.optimize();
    REQUIRE(count_ops(h.graph(), "fused") == 1);
    CHECK(dl_test::same_elements(h(xb), before));  // the same steps, rounded the same way
}

TEST_CASE("graph passes: epilogue fusion folds an activation into the product before it") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({2, 1, 6, 6}, -1, 1, ctx);
    dl::nn::conv2d<float> conv(1, 3, 3, {.padding = 1}, true, ctx);
    dl::nn::linear<float> fc(3 * 6 * 6, 4, true, ctx), shared(3 * 6 * 6, 4, true, ctx);
    auto f = graph::trace(
        [&](const Tensor<float>& in) {
            Tensor<float> activated = dl::relu(conv(in));
            Tensor<float> features = activated.flatten(1);
            Tensor<float> a = dl::sigmoid(fc(features));
            Tensor<float> s = shared(features);  // read twice: its activation cannot fold
            return Tensor<float>(a + dl::tanh(s) + s);
        },
        x);
    const auto g = after_pass(f, graph::epilogue_fusion(), {x});
    INFO(g.to_string());
    CHECK(count_ops(g, "relu") == 0);
    CHECK(count_ops(g, "sigmoid") == 0);
    CHECK(count_ops(g, "tanh") == 1);
    CHECK(g.to_string().find("conv2d(%0, %1, %2) {stride=1x1, padding=1x1, dilation=1x1, groups=1, act=1}") != std::string::npos);
    CHECK(g.to_string().find("act=3}") != std::string::npos);  // the sigmoid, in fc
}

TEST_CASE("graph passes: pool fusion folds a 2x2 max pool into the conv2d before it, unless its output is read elsewhere") {
    dl::Context ctx({.seed = 2, .threads = 2});
    const auto x = dl::uniform<float>({3, 1, 28, 28}, -1, 1, ctx);
    dl::nn::conv2d<float> first(1, 16, 3, {.padding = 1}, true, ctx), second(16, 16, 3, {.padding = 1}, true, ctx),
        third(16, 16, 3, {.padding = 1}, true, ctx);
    auto f = graph::trace(
        [&](const Tensor<float>& in) {
            const Tensor<float> a = dl::max_pool2d(Tensor<float>(dl::relu(first(in))), {.kernel = 2});  // direct kernels
            const Tensor<float> b = dl::max_pool2d(second(a), {.kernel = 2, .stride = 2});  // Winograd
            const Tensor<float> c = third(b);  // read by the pool and by the sum: stays
            const Tensor<float> d = dl::max_pool2d(c, {.kernel = 2});
            const Tensor<float> e = dl::max_pool2d(b, {.kernel = 3});  // not 2x2: stays
            return Tensor<float>(dl::sum(d) + dl::sum(c) + dl::sum(e));
        },
        x);
    graph::pass_manager passes;
    passes.add(graph::epilogue_fusion()).add(graph::pool_fusion());
    const Tensor<float> before = f(x);
    f.optimize(passes);
    const auto& g = f.graph();
    INFO(g.to_string());
    CHECK(count_ops(g, "max_pool2d") == 2);
    CHECK(g.to_string().find("groups=1, act=1, max_pool=2} : float32[N, 16, 14, 14]") != std::string::npos);
    CHECK(g.to_string().find("groups=1, act=0, max_pool=2} : float32[N, 16, 7, 7]") != std::string::npos);
    // The same bits as the two ops (conv2d's tests check the kernels against max_pool2d too).
    CHECK(dl_test::same_elements(f(x), before));
    // A different batch: the fused node's output keeps the batch dimension symbolic.
    const auto more = dl::uniform<float>({5, 1, 28, 28}, -1, 1, ctx);
    const Tensor<float> eager = [&] {
        const dl::no_grad off(ctx);
        const Tensor<float> a = dl::max_pool2d(Tensor<float>(dl::relu(first(more))), {.kernel = 2});
        const Tensor<float> b = dl::max_pool2d(second(a), {.kernel = 2});
        const Tensor<float> c = third(b);
        return Tensor<float>(dl::sum(dl::max_pool2d(c, {.kernel = 2})) + dl::sum(c) + dl::sum(dl::max_pool2d(b, {.kernel = 3})));
    }();
    CHECK(dl_test::same_elements(f(more), eager));
}

TEST_CASE("graph passes: memory planning frees at last use, reuses dying inputs, reports the peak") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({64, 256}, -1, 1, ctx);
    dl::nn::linear<float> fc1(256, 256, true, ctx), fc2(256, 256, true, ctx), fc3(256, 8, true, ctx);
    // Each relu an op of its own (nn::sequential would run it in the product's epilogue).
    auto f = graph::trace([&](const Tensor<float>& in) { return fc3(dl::relu(fc2(dl::relu(fc1(in))))); }, x);
    const auto g = after_pass(f, graph::memory_planning(), {x});
    INFO(g.to_string());
    CHECK(g.memory.planned);
    CHECK(g.memory.in_place_nodes == 2);  // each relu into its linear's output
    const std::int64_t hidden = 64 * 256 * 4;
    CHECK(g.memory.peak_bytes_before == 4 * hidden + 64 * 8 * 4);
    CHECK(g.memory.peak_bytes_after == 2 * hidden);
    CHECK(g.to_string().find("# in place of %") != std::string::npos);
    // What the executor really holds: the allocator's peak over a run.
    auto& allocator = ctx.allocator();
    (void)f.run(std::vector<dl::autograd::any_tensor>{x});
    const std::int64_t base = allocator.stats().bytes_in_use;
    allocator.reset_peak();
    (void)f.run(std::vector<dl::autograd::any_tensor>{x});
    CHECK(allocator.stats().peak_bytes_in_use - base <= 2 * hidden + 64 * 1024);  // slack: the GEMM's packing
}

TEST_CASE("graph pass manager: order from needs and invalidations, cycles rejected, passes timed and verified") {
    graph::pass_manager m;
    std::vector<std::string> ran;
    auto named = [&](std::string name, std::vector<std::string> needs, std::vector<std::string> invalidates) {
        return graph::pass{name, std::move(needs), std::move(invalidates), [&ran, name](graph::Graph&) { ran.push_back(name); }};
    };
    m.add(named("plan", {}, {})).add(named("fuse", {"clean"}, {"plan"})).add(named("clean", {}, {}));
    const auto order = m.order();
    REQUIRE(order.size() == 3);
    CHECK(order[0]->name == "clean");
    CHECK(order[1]->name == "fuse");
    CHECK(order[2]->name == "plan");
    graph::Graph g;
    const auto timings = m.run(g);
    CHECK(ran == std::vector<std::string>{"clean", "fuse", "plan"});
    CHECK(timings.size() == 3);
    CHECK(timings[0].milliseconds >= 0);

    graph::pass_manager cyclic;
    cyclic.add(named("a", {"b"}, {})).add(named("b", {"a"}, {}));
    CHECK_THROWS_WITH_AS((void)cyclic.order(), doctest::Contains("cycle"), dl::error);

    graph::pass_manager breaking;
    breaking.add({"break", {}, {}, [](graph::Graph& h) { h.outputs.push_back(12); }});
    CHECK_THROWS_WITH_AS((void)breaking.run(g), doctest::Contains("after pass break"), dl::error);
}

TEST_CASE("graph verifier: rejects broken SSA, dangling uses and wrong shapes") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({3, 4}, -1, 1, ctx);
    auto traced = graph::trace([](const Tensor<float>& a) { return Tensor<float>(dl::exp(a) + a); }, x);
    const graph::Graph good = traced.graph();
    CHECK_NOTHROW(good.verify());
    SUBCASE("use before definition") {
        graph::Graph g = good;
        std::swap(g.nodes[0], g.nodes[1]);
        g.reindex();
        CHECK_THROWS_WITH_AS(g.verify(), doctest::Contains("before it is defined"), dl::error);
    }
    SUBCASE("dangling use") {
        graph::Graph g = good;
        g.nodes[1].inputs[0] = 99;
        CHECK_THROWS_WITH_AS(g.verify(), doctest::Contains("does not exist"), dl::error);
    }
    SUBCASE("an elementwise node of the wrong shape") {
        graph::Graph g = good;
        g.values[static_cast<std::size_t>(g.nodes[1].output)].shape = {3, 5};
        CHECK_THROWS_WITH_AS(g.verify(), doctest::Contains("is elementwise but makes shape [3, 5]"), dl::error);
    }
    SUBCASE("a value defined twice") {
        graph::Graph g = good;
        g.nodes.push_back(g.nodes[0]);
        CHECK_THROWS_AS(g.verify(), dl::error);
    }
}

TEST_CASE("graph: DL_DEBUG=2 prints the pipeline and the graph after each pass") {
    dl::Context ctx({.seed = 2, .threads = 1});
    const auto x = dl::uniform<float>({3, 4}, -1, 1, ctx);
    auto f = graph::trace([](const Tensor<float>& a) { return Tensor<float>(dl::exp(a) * 2.0f); }, x);
    ::setenv("DL_DEBUG", "2", 1);
    std::ostringstream captured;
    auto* old = std::cerr.rdbuf(captured.rdbuf());
    f.optimize();
    std::cerr.rdbuf(old);
    ::unsetenv("DL_DEBUG");
    const std::string log = captured.str();
    CHECK(log.find("dl::graph: pipeline common_subexpression_elimination constant_folding dead_code_elimination "
                   "epilogue_fusion pool_fusion elementwise_fusion memory_planning") != std::string::npos);
    CHECK(log.find("dl::graph: elementwise_fusion ") != std::string::npos);
    CHECK(log.find("fused(%0)") != std::string::npos);
}
