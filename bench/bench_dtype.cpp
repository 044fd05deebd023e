// 16-bit float conversions and a fused chain on bfloat16 against the memory-bandwidth triad, all on 16M
// elements in one run. The argument is the thread count. Conversions write into a preallocated
// tensor (as PyTorch's `dst.copy_(src)`); bytes/s count what the loop must read and write.
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

#include "bandwidth.hpp"

#include <cstdint>

namespace {

constexpr std::int64_t n = std::int64_t{1} << 24;

struct workload {
    explicit workload(int threads)
        : ctx({.seed = 42, .threads = threads}),
          x(dl::uniform<float>({n}, -3, 3, ctx)),
          y(dl::uniform<float>({n}, -3, 3, ctx)),
          out(dl::zeros<float>({n}, ctx)),
          xb(dl::cast<dl::bfloat16>(x)),
          yb(dl::cast<dl::bfloat16>(y)),
          zb(dl::uniform<dl::bfloat16>({n}, -3, 3, ctx)),
          outb(dl::zeros<dl::bfloat16>({n}, ctx)),
          xh(dl::cast<dl::float16>(x)),
          outh(dl::zeros<dl::float16>({n}, ctx)) {}
    dl::Context ctx;
    dl::Tensor<float> x, y, out;
    dl::Tensor<dl::bfloat16> xb, yb, zb, outb;
    dl::Tensor<dl::float16> xh, outh;
};

workload& data(int threads) { return dl_bench::workload_for<workload>(threads); }

void triad(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    dl_bench::triad(state, w.ctx, w.out.data(), w.x.data(), w.y.data(), n);
}

template <class To, class From>
void convert(benchmark::State& state, dl::Tensor<To>& to, const dl::Tensor<From>& from) {
    for (auto _ : state) {
        dl::assign(to, from);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 6);
}

void f32_to_bf16(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    convert(state, w.outb, w.x);
}
void bf16_to_f32(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    convert(state, w.out, w.xb);
}
void f32_to_f16(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    convert(state, w.outh, w.x);
}
void f16_to_f32(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    convert(state, w.out, w.xh);
}

// bench_elementwise's chain on bfloat16 inputs and output: 3 × 2 bytes read, 2 written.
void chain_fused_bf16(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    for (auto _ : state) {
        w.outb = dl::sigmoid(w.xb * 1.5f + w.yb) * w.zb - dl::tanh(w.xb);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 8);
}

// The same chain on 64K elements (512 KiB in all), which stay in L2: what the chain's arithmetic allows
// on one core once memory costs nothing. Same bytes/s accounting, so ÷ triad reads as a ceiling for
// chain_fused_bf16/1 (two cores: twice this at most). One thread only: a call this short on two threads
// measures the pool's hand-off as much as the chain.
void chain_fused_bf16_in_cache(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    constexpr std::int64_t m = std::int64_t{1} << 16;
    const auto x = w.xb.slice(0, 0, m), y = w.yb.slice(0, 0, m), z = w.zb.slice(0, 0, m);
    dl::Tensor<dl::bfloat16> out = dl::zeros<dl::bfloat16>({m}, w.ctx);
    for (auto _ : state) {
        out = dl::sigmoid(x * 1.5f + y) * z - dl::tanh(x);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * m * 8);
}

BENCHMARK(triad)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(f32_to_bf16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bf16_to_f32)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(f32_to_f16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(f16_to_f32)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(chain_fused_bf16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(chain_fused_bf16_in_cache)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
