// Graph mode against eager mode, in one run. graph_chain_unfused_ops/T: the Foundation chain
// sigmoid(x*1.5+y)*z - tanh(x) written as six separate ops, traced, fused by the passes and compiled
// into one loop by fused_codegen (counter compiled: 1 when it was), on 16M floats (16 bytes/element);
// graph_chain_interpreted/T runs the same fused node's steps tile by tile (no codegen); chain_fused/T is
// the compile-time fused expression both are measured against.
// cnn_infer_eager/64 and cnn_infer_graph/64: the Fashion-MNIST CNN of examples/fashion_mnist at batch
// 64, eager and traced with every pass on; peak_bytes is the allocator's peak above what was in use
// before the call. mlp_f32_infer/64 and mlp_int8_infer/64: the 784-256-128-10 MLP after one epoch of
// Adam on Fashion-MNIST, traced with every pass on, the int8 one quantized too (calibrated on 8
// training batches); counter accuracy: on the 10,000 test images. mlp_train_eager/32 and
// mlp_train_graph/32: one Adam training step (forward, cross-entropy, backward, update) of the
// 784-256-128-10 MLP at batch 32, eagerly and as a differentiated graph; mlp_train_data_parallel/32/2:
// the same step over 2 in-process replicas (16 rows each, one allreduce of loss and gradients).
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>
#include <dl/data/fashion_mnist.hpp>
#include <dl/dist/data_parallel.hpp>
#include <dl/graph/codegen.hpp>
#include <dl/graph/differentiate.hpp>
#include <dl/graph/trace.hpp>

#include "bandwidth.hpp"

#include <cstdint>
#include <optional>

namespace {

constexpr std::int64_t n = std::int64_t{1} << 24;

dl::Tensor<float> unfused_chain(const dl::Tensor<float>& x, const dl::Tensor<float>& y, const dl::Tensor<float>& z) {
    dl::Tensor<float> scaled = x * 1.5f;
    dl::Tensor<float> shifted = scaled + y;
    dl::Tensor<float> gate = dl::sigmoid(shifted);
    dl::Tensor<float> gated = gate * z;
    dl::Tensor<float> t = dl::tanh(x);
    return gated - t;
}

struct chain_workload {
    explicit chain_workload(int threads)
        : ctx({.seed = 42, .threads = threads}),
          x(dl::uniform<float>({n}, -3, 3, ctx)),
          y(dl::uniform<float>({n}, -3, 3, ctx)),
          z(dl::uniform<float>({n}, -3, 3, ctx)),
          out(dl::zeros<float>({n}, ctx)),
          graph(dl::graph::trace(unfused_chain, x, y, z)),
          interpreted(dl::graph::trace(unfused_chain, x, y, z)) {
        auto passes = dl::graph::default_passes();
        passes.add(dl::graph::fused_codegen({.include_dir = DL_BENCH_INCLUDE_DIR}));
        graph.optimize(passes);
        interpreted.optimize();
        for (const auto& node : graph.graph().nodes) compiled = compiled || static_cast<bool>(node.compiled);
    }
    dl::Context ctx;
    dl::Tensor<float> x, y, z, out;
    dl::graph::traced<dl::Tensor<float>> graph, interpreted;
    bool compiled = false;
};

chain_workload& chain_data(int threads) { return dl_bench::workload_for<chain_workload>(threads); }

void triad(benchmark::State& state) {
    auto& w = chain_data(static_cast<int>(state.range(0)));
    dl_bench::triad(state, w.ctx, w.out.data(), w.x.data(), w.y.data(), n);
}

void chain_fused(benchmark::State& state) {
    auto& w = chain_data(static_cast<int>(state.range(0)));
    for (auto _ : state) {
        w.out = dl::sigmoid(w.x * 1.5f + w.y) * w.z - dl::tanh(w.x);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 16);
}

void run_chain_graph(benchmark::State& state, dl::graph::traced<dl::Tensor<float>>& graph) {
    auto& w = chain_data(static_cast<int>(state.range(0)));
    w.out = graph(w.x, w.y, w.z);  // warm the allocator's cache
    for (auto _ : state) {
        w.out = graph(w.x, w.y, w.z);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 16);
}

void graph_chain_unfused_ops(benchmark::State& state) {
    auto& w = chain_data(static_cast<int>(state.range(0)));
    run_chain_graph(state, w.graph);
    state.counters["compiled"] = w.compiled ? 1 : 0;
}

void graph_chain_interpreted(benchmark::State& state) {
    run_chain_graph(state, chain_data(static_cast<int>(state.range(0))).interpreted);
}

// The CNN of examples/fashion_mnist (16 and 32 channels), in evaluation mode.
auto make_cnn(dl::Context& ctx) {
    return dl::nn::sequential{dl::nn::conv2d<float>(1, 16, 3, {.padding = 1}, true, ctx), dl::nn::relu{},
                              dl::nn::max_pool2d({.kernel = 2}),
                              dl::nn::conv2d<float>(16, 32, 3, {.padding = 1}, true, ctx), dl::nn::relu{},
                              dl::nn::max_pool2d({.kernel = 2}), dl::nn::flatten{},
                              dl::nn::linear<float>(32 * 7 * 7, 128, true, ctx), dl::nn::relu{},
                              dl::nn::linear<float>(128, 10, true, ctx)};
}
using cnn_t = decltype(make_cnn(std::declval<dl::Context&>()));

struct cnn_workload {
    explicit cnn_workload(std::int64_t batch)
        : ctx({.seed = 7}), model(make_cnn(ctx)), images(dl::uniform<float>({batch, 1, 28, 28}, 0, 1, ctx)) {
        model.train(false);
        graph.emplace(dl::graph::trace([this](const dl::Tensor<float>& x) { return model(x); }, images));
        graph->optimize();
    }
    dl::Context ctx;
    cnn_t model;
    dl::Tensor<float> images;
    std::optional<dl::graph::traced<dl::Tensor<float>>> graph;
};

cnn_workload& cnn_data(std::int64_t batch) {
    static std::optional<cnn_workload> w;
    if (!w) w.emplace(batch);
    return *w;
}

template <class Run>
void infer(benchmark::State& state, cnn_workload& w, Run&& run) {
    dl::Tensor<float> logits = run();  // warm up: the allocator's cache, the executor's plan
    logits = {};
    auto& allocator = w.ctx.allocator();
    const std::int64_t base = allocator.stats().bytes_in_use;
    allocator.reset_peak();
    for (auto _ : state) {
        logits = run();
        benchmark::DoNotOptimize(logits.data());
        logits = {};
    }
    state.counters["peak_bytes"] = static_cast<double>(allocator.stats().peak_bytes_in_use - base);
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

void cnn_infer_eager(benchmark::State& state) {
    auto& w = cnn_data(state.range(0));
    const dl::no_grad off(w.ctx);
    infer(state, w, [&] { return dl::Tensor<float>(w.model(w.images)); });
}

void cnn_infer_graph(benchmark::State& state) {
    auto& w = cnn_data(state.range(0));
    infer(state, w, [&] { return (*w.graph)(w.images); });
}

struct mlp_workload {
    mlp_workload()
        : ctx({.seed = 3}),
          model{dl::nn::linear<float>(784, 256, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(256, 128, true, ctx),
                dl::nn::relu{}, dl::nn::linear<float>(128, 10, true, ctx)} {
        const auto [train_images, train_labels] = load(true);
        const auto [test_images, test_labels] = load(false);
        dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-3});
        for (std::int64_t i = 0; i + batch <= train_images.shape()[0]; i += batch) {
            auto loss = dl::nn::cross_entropy(model(train_images.slice(0, i, i + batch)), train_labels.slice(0, i, i + batch));
            loss.backward();
            opt.step();
            opt.zero_grad();
        }
        model.train(false);
        images = test_images.slice(0, 0, batch).contiguous();
        auto traced = [&] { return dl::graph::trace([this](const dl::Tensor<float>& x) { return model(x); }, images); };
        f32.emplace(traced());
        f32->optimize();
        std::vector<std::vector<dl::autograd::any_tensor>> calibration;
        for (std::int64_t i = 0; i < 8; ++i) calibration.push_back({train_images.slice(0, i * batch, (i + 1) * batch)});
        int8.emplace(traced());
        auto passes = dl::graph::default_passes();
        passes.add(dl::graph::quantize_int8(std::move(calibration)));
        int8->optimize(passes);
        f32_accuracy = dl::nn::accuracy((*f32)(test_images), test_labels);
        int8_accuracy = dl::nn::accuracy((*int8)(test_images), test_labels);
    }
    std::pair<dl::Tensor<float>, dl::Tensor<std::int64_t>> load(bool train) {
        const auto split = dl::data::load_fashion_mnist(train, {}, ctx);
        const std::int64_t count = split.images.shape()[0];
        dl::Tensor<float> x = (dl::cast<float>(split.images) * (1.0f / 255.0f) - 0.2860f) * (1.0f / 0.3530f);
        return {x.reshape({count, 784}), dl::cast<std::int64_t>(split.labels)};
    }

    static constexpr std::int64_t batch = 64;
    dl::Context ctx;
    dl::nn::sequential<dl::nn::linear<float>, dl::nn::relu, dl::nn::linear<float>, dl::nn::relu, dl::nn::linear<float>> model;
    dl::Tensor<float> images;
    std::optional<dl::graph::traced<dl::Tensor<float>>> f32, int8;
    double f32_accuracy = 0, int8_accuracy = 0;
};

mlp_workload& mlp_data() {
    static mlp_workload w;
    return w;
}

void mlp_f32_infer(benchmark::State& state) {
    auto& w = mlp_data();
    for (auto _ : state) benchmark::DoNotOptimize((*w.f32)(w.images).data());
    state.counters["accuracy"] = w.f32_accuracy;
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

void mlp_int8_infer(benchmark::State& state) {
    auto& w = mlp_data();
    for (auto _ : state) benchmark::DoNotOptimize((*w.int8)(w.images).data());
    state.counters["accuracy"] = w.int8_accuracy;
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

auto make_mlp(dl::Context& ctx) {
    return dl::nn::sequential{dl::nn::linear<float>(784, 256, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(256, 128, true, ctx),
                              dl::nn::relu{}, dl::nn::linear<float>(128, 10, true, ctx)};
}

template <class Step>
void train(benchmark::State& state, dl::Context& ctx, Step&& step) {
    const dl::Tensor<float> x = dl::normal<float>({state.range(0), 784}, 0, 1, ctx);
    dl::Tensor<std::int64_t> y({state.range(0)}, ctx);
    for (std::int64_t i = 0; i < state.range(0); ++i) y(i) = i % 10;
    step(x, y);  // warm up: the allocator's cache, the executor's plan
    for (auto _ : state) benchmark::DoNotOptimize(step(x, y).data());
    state.SetItemsProcessed(state.iterations() * state.range(0));
}

void mlp_train_eager(benchmark::State& state) {
    dl::Context ctx({.seed = 4});
    auto model = make_mlp(ctx);
    dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-3});
    train(state, ctx, [&](const dl::Tensor<float>& x, const dl::Tensor<std::int64_t>& y) {
        dl::Tensor<float> loss = dl::nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        return loss;
    });
}

void mlp_train_graph(benchmark::State& state) {
    dl::Context ctx({.seed = 4});
    auto model = make_mlp(ctx);
    dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-3});
    const dl::Tensor<float> example = dl::zeros<float>({state.range(0), 784}, ctx);
    const dl::Tensor<std::int64_t> labels = dl::zeros<std::int64_t>({state.range(0)}, ctx);
    auto step = dl::graph::train(
        [&](const dl::Tensor<float>& x, const dl::Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); }, opt,
        example, labels);
    train(state, ctx, [&](const dl::Tensor<float>& x, const dl::Tensor<std::int64_t>& y) { return step(x, y); });
}

void mlp_train_data_parallel(benchmark::State& state) {
    dl::Context ctx({.seed = 4});
    auto model = make_mlp(ctx);
    dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-3});
    const dl::Tensor<float> example = dl::zeros<float>({state.range(0), 784}, ctx);
    const dl::Tensor<std::int64_t> labels = dl::zeros<std::int64_t>({state.range(0)}, ctx);
    auto step = dl::dist::train_data_parallel(
        [&](const dl::Tensor<float>& x, const dl::Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); }, opt,
        static_cast<int>(state.range(1)), example, labels);
    train(state, ctx, [&](const dl::Tensor<float>& x, const dl::Tensor<std::int64_t>& y) { return step(x, y); });
}

}  // namespace

BENCHMARK(triad)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(chain_fused)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(graph_chain_unfused_ops)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(graph_chain_interpreted)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(cnn_infer_eager)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(cnn_infer_graph)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(mlp_f32_infer)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(mlp_int8_infer)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(mlp_train_eager)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(mlp_train_graph)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(mlp_train_data_parallel)->Args({32, 2})->Unit(benchmark::kMicrosecond)->UseRealTime();
