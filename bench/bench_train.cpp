// Time per full training step (forward, loss, backward, optimizer update, zero grad) of small MLPs,
// one thread, against the same models in libtorch's C++ API when libtorch is found. Each side clears
// the gradients its fastest way: dl drops them (zero_grad(true), set_to_none: the next backward
// writes them instead of adding into zeros, in buffers from the caching allocator); libtorch zeroes
// them in place, since dropping them costs it fresh pages on every step (2.05 ms instead of 0.81 ms
// per Adam step, measured on 2026-12-05).
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

#ifdef DL_BENCH_HAVE_TORCH
#include <torch/torch.h>
#endif

namespace {

// Defaults of the issue: one thread everywhere.
dl::context_options one_thread() { return {.seed = 1, .threads = 1}; }

/// The 16-64-64-4 tanh MLP of an agent inside a simulation.
auto small_mlp(dl::Context& ctx) {
    return dl::nn::sequential{dl::nn::linear<float>(16, 64, true, ctx), dl::nn::tanh{},
                              dl::nn::linear<float>(64, 64, true, ctx), dl::nn::tanh{},
                              dl::nn::linear<float>(64, 4, true, ctx)};
}

void train_mlp_784_256_128_10_adam_b32(benchmark::State& state) {
    dl::Context ctx(one_thread());
    dl::nn::sequential model{dl::nn::linear<float>(784, 256, true, ctx), dl::nn::relu{},
                             dl::nn::linear<float>(256, 128, true, ctx), dl::nn::relu{},
                             dl::nn::linear<float>(128, 10, true, ctx)};
    dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-3});
    const auto x = dl::normal<float>({32, 784}, 0, 1, ctx);
    auto y = dl::Tensor<std::int64_t>({32}, ctx);
    for (int i = 0; i < 32; ++i) y.data()[i] = i % 10;
    for (auto _ : state) {
        auto loss = dl::nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad(true);
        benchmark::DoNotOptimize(loss.data());
    }
}
BENCHMARK(train_mlp_784_256_128_10_adam_b32)->UseRealTime();

void train_mlp_16_64_64_4_sgd_b1(benchmark::State& state) {
    dl::Context ctx(one_thread());
    auto model = small_mlp(ctx);
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 1e-3});
    const auto x = dl::normal<float>({1, 16}, 0, 1, ctx), y = dl::normal<float>({1, 4}, 0, 1, ctx);
    for (auto _ : state) {
        auto loss = dl::nn::mse_loss(model(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad(true);
        benchmark::DoNotOptimize(loss.data());
    }
}
BENCHMARK(train_mlp_16_64_64_4_sgd_b1)->UseRealTime();

void infer_mlp_16_64_64_4_b1(benchmark::State& state) {
    dl::Context ctx(one_thread());
    auto model = small_mlp(ctx);
    const auto x = dl::normal<float>({1, 16}, 0, 1, ctx);
    dl::no_grad off(ctx);
    for (auto _ : state) {
        auto out = model(x);
        benchmark::DoNotOptimize(out.data());
    }
}
BENCHMARK(infer_mlp_16_64_64_4_b1)->UseRealTime();

#ifdef DL_BENCH_HAVE_TORCH
torch::nn::Sequential torch_mlp(int a, int b, int c, int d, bool relu) {
    torch::nn::Sequential m(torch::nn::Linear(a, b));
    if (relu) m->push_back(torch::nn::ReLU()); else m->push_back(torch::nn::Tanh());
    m->push_back(torch::nn::Linear(b, c));
    if (relu) m->push_back(torch::nn::ReLU()); else m->push_back(torch::nn::Tanh());
    m->push_back(torch::nn::Linear(c, d));
    return m;
}

void libtorch_train_mlp_784_256_128_10_adam_b32(benchmark::State& state) {
    torch::set_num_threads(1);
    auto model = torch_mlp(784, 256, 128, 10, true);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
    const auto x = torch::randn({32, 784});
    const auto y = torch::arange(32, torch::kLong).remainder(10);
    for (auto _ : state) {
        auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        benchmark::DoNotOptimize(loss.data_ptr());
    }
}
BENCHMARK(libtorch_train_mlp_784_256_128_10_adam_b32)->UseRealTime();

void libtorch_train_mlp_16_64_64_4_sgd_b1(benchmark::State& state) {
    torch::set_num_threads(1);
    auto model = torch_mlp(16, 64, 64, 4, false);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-3));
    const auto x = torch::randn({1, 16}), y = torch::randn({1, 4});
    for (auto _ : state) {
        auto loss = torch::mse_loss(model->forward(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        benchmark::DoNotOptimize(loss.data_ptr());
    }
}
BENCHMARK(libtorch_train_mlp_16_64_64_4_sgd_b1)->UseRealTime();

void libtorch_infer_mlp_16_64_64_4_b1(benchmark::State& state) {
    torch::set_num_threads(1);
    auto model = torch_mlp(16, 64, 64, 4, false);
    const auto x = torch::randn({1, 16});
    torch::NoGradGuard off;
    for (auto _ : state) {
        auto out = model->forward(x);
        benchmark::DoNotOptimize(out.data_ptr());
    }
}
BENCHMARK(libtorch_infer_mlp_16_64_64_4_b1)->UseRealTime();
#endif

}  // namespace
