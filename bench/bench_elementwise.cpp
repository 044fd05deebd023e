// Fused elementwise chains against the memory-bandwidth ceiling, eager one-op-at-a-time evaluation
// and Eigen's Tensor module, all on 16M float32 elements in one run. The argument is the thread count.
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

#include "bandwidth.hpp"

#include <cstdint>

#ifdef DL_BENCH_HAVE_EIGEN
#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>
#endif

namespace {

constexpr std::int64_t n = std::int64_t{1} << 24;

struct workload {
    explicit workload(int threads)
        : ctx({.seed = 42, .threads = threads}),
          x(dl::uniform<float>({n}, -3, 3, ctx)),
          y(dl::uniform<float>({n}, -3, 3, ctx)),
          z(dl::uniform<float>({n}, -3, 3, ctx)),
          out(dl::zeros<float>({n}, ctx)) {}
    dl::Context ctx;
    dl::Tensor<float> x, y, z, out;
};

workload& data(int threads) { return dl_bench::workload_for<workload>(threads); }

void triad(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    dl_bench::triad(state, w.ctx, w.out.data(), w.x.data(), w.y.data(), n);
}

void chain_fused(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    for (auto _ : state) {
        w.out = dl::sigmoid(w.x * 1.5f + w.y) * w.z - dl::tanh(w.x);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 16);
}

// Every op materialised into a fresh tensor, as an eager framework runs it.
void chain_unfused(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    auto step = [&] {
        dl::Tensor<float> scaled = w.x * 1.5f;
        dl::Tensor<float> shifted = scaled + w.y;
        dl::Tensor<float> gate = dl::sigmoid(shifted);
        dl::Tensor<float> gated = gate * w.z;
        dl::Tensor<float> t = dl::tanh(w.x);
        w.out = gated - t;
    };
    step();  // warm the allocator's cache: steady state is what is measured
    for (auto _ : state) {
        step();
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 16);
}

#ifdef DL_BENCH_HAVE_EIGEN
void chain_eigen(benchmark::State& state) {
    const int threads = static_cast<int>(state.range(0));
    auto& w = data(threads);
    using map = Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>>;
    map x(w.x.data(), n), y(w.y.data(), n), z(w.z.data(), n), out(w.out.data(), n);
    Eigen::ThreadPool pool(threads);
    Eigen::ThreadPoolDevice device(&pool, threads);
    for (auto _ : state) {
        if (threads == 1)
            out = (x * 1.5f + y).sigmoid() * z - x.tanh();
        else
            out.device(device) = (x * 1.5f + y).sigmoid() * z - x.tanh();
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 16);
}
BENCHMARK(chain_eigen)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

BENCHMARK(triad)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(chain_fused)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(chain_unfused)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
