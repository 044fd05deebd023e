// 16-bit float conversions and a fused chain on bfloat16 against the memory-bandwidth triad, all on 16M
// elements in one run. The argument is the thread count. Conversions write into a preallocated
// tensor (as PyTorch's `dst.copy_(src)`); bytes/s count what the loop must read and write.
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

#include <array>
#include <cstdint>
#include <memory>

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

workload& data(int threads) {
    static std::array<std::unique_ptr<workload>, 3> cache;
    auto& w = cache.at(static_cast<std::size_t>(threads));
    if (!w) w = std::make_unique<workload>(threads);
    return *w;
}

// a[i] = b[i] + s * c[i]: 12 bytes per element, the bandwidth a plain compiled loop reaches.
void triad(benchmark::State& state) {
    auto& w = data(static_cast<int>(state.range(0)));
    float *a = w.out.data(), *b = w.x.data(), *c = w.y.data();
    const float s = 1.5f;
    const std::int64_t chunks = w.ctx.concurrency(), chunk = n / chunks;
    for (auto _ : state) {
        w.ctx.parallel_for(chunks, [&](std::int64_t t) {
            for (std::int64_t i = t * chunk; i < (t + 1) * chunk; ++i) a[i] = b[i] + s * c[i];
        });
        benchmark::DoNotOptimize(a);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 12);
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

BENCHMARK(triad)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(f32_to_bf16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bf16_to_f32)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(f32_to_f16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(f16_to_f32)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(chain_fused_bf16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
