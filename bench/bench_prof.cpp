// What the profiler costs: an op scope with no profiler attached (the default), and a small
// elementwise op with the profiler detached and attached.
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

namespace {

void op_scope_detached(benchmark::State& state) {
    dl::Context ctx({.threads = 1});
    for (auto _ : state) {
        const dl::op_scope scope(ctx, "nothing");
        benchmark::ClobberMemory();
    }
}
BENCHMARK(op_scope_detached);

void add_16(benchmark::State& state, bool attached) {
    dl::Context ctx({.threads = 1});
    dl::prof::profiler p;
    if (attached) ctx.set_profiler(&p);
    const auto a = dl::ones<float>({16}, ctx), b = dl::ones<float>({16}, ctx);
    auto c = dl::zeros<float>({16}, ctx);
    std::int64_t n = 0;
    for (auto _ : state) {
        dl::assign(c, a + b);
        benchmark::DoNotOptimize(c.data());
        if (++n % 65536 == 0) p.clear();  // bound the event list
    }
}
void add_16_profiler_detached(benchmark::State& state) { add_16(state, false); }
void add_16_profiler_attached(benchmark::State& state) { add_16(state, true); }
BENCHMARK(add_16_profiler_detached);
BENCHMARK(add_16_profiler_attached);

}  // namespace
