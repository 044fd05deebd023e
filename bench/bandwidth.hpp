#pragma once
// What the elementwise benchmarks share: the memory-bandwidth baseline they divide by (triad), and a
// cache of their workloads per thread count, built once, outside the timed loops.
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

#include <array>
#include <cstdint>
#include <memory>

namespace dl_bench {

/// a[i] = b[i] + s · c[i] over n floats, one chunk per thread of ctx: 12 bytes per element, the
/// bandwidth a plain compiled loop reaches.
inline void triad(benchmark::State& state, dl::Context& ctx, float* a, const float* b, const float* c, std::int64_t n) {
    const float s = 1.5f;
    const std::int64_t chunks = ctx.concurrency(), chunk = n / chunks;
    for (auto _ : state) {
        ctx.parallel_for(chunks, [&](std::int64_t t) {
            for (std::int64_t i = t * chunk; i < (t + 1) * chunk; ++i) a[i] = b[i] + s * c[i];
        });
        benchmark::DoNotOptimize(a);
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * n * 12);
}

/// The Workload for `threads` threads (1 or 2), constructed from the thread count on first use.
template <class Workload>
Workload& workload_for(int threads) {
    static std::array<std::unique_ptr<Workload>, 3> cache;
    auto& w = cache.at(static_cast<std::size_t>(threads));
    if (!w) w = std::make_unique<Workload>(threads);
    return *w;
}

}  // namespace dl_bench
