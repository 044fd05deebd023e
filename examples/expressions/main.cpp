// A tour of dl's tensor core and fused expressions: what `scripts/run-example` runs until the
// Fashion-MNIST example exists.
#include <dl/dl.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

int main() {
    dl::Context ctx({.seed = 42});  // all state lives here: allocator, RNG, thread pool

    // Creation and views: slices, transposes and broadcasts share storage, never copy.
    auto m = dl::tensor<float>({{1, 2, 3}, {4, 5, 6}}, ctx);
    std::cout << "m =\n" << m << "\n\nm.t() =\n" << m.t() << "\n\nm.slice(1, 0, 3, 2) =\n" << m.slice(1, 0, 3, 2) << "\n\n";

    // An expression is a lazy type; assigning it runs one fused, vectorised loop.
    auto bias = dl::tensor<float>({10, 20, 30}, ctx);
    dl::Tensor<float> y = dl::relu(m * 2.0f - 3.0f) + bias;  // bias broadcasts over rows
    std::cout << "relu(m * 2 - 3) + bias =\n" << y << "\n\n";

    // Writing into a view, and reductions that consume expressions without materialising them.
    y.select(0, 1) = 0.0f;
    std::cout << "after y.select(0, 1) = 0:\n" << y << "\n";
    std::cout << "sum over rows: " << dl::sum(y, {1}) << "\nmean of exp(m): " << dl::mean(dl::exp(m)) << "\n\n";

    // The benchmark chain on 16M elements: fused vs one temporary per op.
    const std::int64_t n = std::int64_t{1} << 24;
    auto x = dl::uniform<float>({n}, -3, 3, ctx), u = dl::uniform<float>({n}, -3, 3, ctx),
         z = dl::uniform<float>({n}, -3, 3, ctx);
    dl::Tensor<float> out = dl::empty<float>({n}, ctx);
    auto time_ms = [](auto&& f) {
        f();  // warm-up
        const auto start = std::chrono::steady_clock::now();
        f();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    const double fused = time_ms([&] { out = dl::sigmoid(x * 1.5f + u) * z - dl::tanh(x); });
    const double unfused = time_ms([&] {
        dl::Tensor<float> a = x * 1.5f, b = a + u, c = dl::sigmoid(b), d = c * z, e = dl::tanh(x);
        out = d - e;
    });
    std::printf("sigmoid(x*1.5 + y)*z - tanh(x) on %lld floats, %d threads: fused %.1f ms, one op at a time %.1f ms\n",
                static_cast<long long>(n), ctx.concurrency(), fused, unfused);
}
