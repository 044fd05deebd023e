// Matrix multiply and convolution: dl's own GEMM against OpenBLAS and Eigen on the same square
// shapes (and its bf16 and int8 products), the fused Linear epilogue against the unfused ops, and the
// Fashion-MNIST CNN's convolutions and 2×2 poolings against libtorch. Every GEMM reports `gflops`
// (2·N³ / time); poolings report `gbps`, the bytes of input and output (and of max_pool2d's winner
// indices) over the time.
//
// `fma_peak/1` is one core's float multiply-add ceiling, measured in the same run: every GEMM ratio
// (÷ OpenBLAS, ÷ Eigen) is bounded by what is left between the slower kernel and it.
//
// Registration order matters: dl's benchmarks run first and OpenBLAS's last, because OpenBLAS's
// threads keep spinning for a while after each call and would steal the second core from whatever
// runs next.
#include <benchmark/benchmark.h>

#include <dl/dl.hpp>

#include <array>

#include <xsimd/xsimd.hpp>

#ifdef DL_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef DL_BENCH_HAVE_EIGEN
#include <Eigen/Core>
#endif
#ifdef DL_BENCH_HAVE_TORCH
#include <torch/torch.h>
#endif

namespace {

const std::vector<std::int64_t> sizes = {64, 256, 512, 1024, 2048};

void set_gflops(benchmark::State& state, double flops_per_iteration) {
    state.counters["gflops"] = benchmark::Counter(flops_per_iteration * double(state.iterations()) / 1e9,
                                                  benchmark::Counter::kIsRate);
}

// Twelve independent multiply-add chains on full vectors: enough in flight to cover the FMA latency
// on every x86 core with two FMA pipes, so the loop runs at the FMA throughput and nothing else.
void fma_peak(benchmark::State& state) {
    using batch = xsimd::batch<float>;
    constexpr int chains = 12;
    constexpr std::int64_t steps = 1 << 20;
    std::array<batch, chains> acc;
    for (int i = 0; i < chains; ++i) acc[std::size_t(i)] = batch(float(i) * 1e-3f);
    const batch a(0.9999f), b(1e-4f);
    for (auto _ : state) {
        for (std::int64_t step = 0; step < steps; ++step) {
#pragma GCC unroll 12
            for (int i = 0; i < chains; ++i) acc[std::size_t(i)] = xsimd::fma(acc[std::size_t(i)], a, b);
        }
        benchmark::DoNotOptimize(acc);
    }
    set_gflops(state, 2.0 * double(batch::size) * chains * double(steps));
}

void sgemm(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    dl::Context ctx({.seed = 1, .threads = int(state.range(1))});
    const auto a = dl::normal<float>({n, n}, 0, 1, ctx), b = dl::normal<float>({n, n}, 0, 1, ctx);
    dl::Tensor<float> c({n, n}, ctx);
    for (auto _ : state) {
        dl::detail::gemm(dl::detail::as_matrix(a), dl::detail::as_matrix(b), dl::detail::as_mutable_matrix(c), false, ctx);
        benchmark::DoNotOptimize(c.data());
    }
    set_gflops(state, 2.0 * double(n) * double(n) * double(n));
}

// u8·s8 → s32 (the quantized-inference product); `gflops` counts integer multiply-adds as 2 ops.
void igemm(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    dl::Context ctx({.seed = 1, .threads = int(state.range(1))});
    std::vector<std::uint8_t> a(std::size_t(n * n));
    std::vector<std::int8_t> b(std::size_t(n * n));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::uint8_t(i * 37), b[i] = std::int8_t(i * 91);
    std::vector<std::int32_t> c(std::size_t(n * n));
    for (auto _ : state) {
        dl::detail::gemm_u8s8({a.data(), n, n, n, 1}, {b.data(), n, n, n, 1}, {c.data(), n, n, n, 1}, false, ctx);
        benchmark::DoNotOptimize(c.data());
    }
    set_gflops(state, 2.0 * double(n) * double(n) * double(n));
}

// bf16 A and B, float C (gemm_half.hpp: vdpbf16ps where the target has AVX-512 BF16).
void bgemm(benchmark::State& state) {
    const std::int64_t n = state.range(0);
    dl::Context ctx({.seed = 1, .threads = int(state.range(1))});
    const auto a = dl::normal<dl::bfloat16>({n, n}, 0, 1, ctx), b = dl::normal<dl::bfloat16>({n, n}, 0, 1, ctx);
    dl::Tensor<float> c({n, n}, ctx);
    for (auto _ : state) {
        dl::detail::gemm_bf16(dl::detail::as_matrix(a), dl::detail::as_matrix(b), dl::detail::as_mutable_matrix(c), false, ctx);
        benchmark::DoNotOptimize(c.data());
    }
    set_gflops(state, 2.0 * double(n) * double(n) * double(n));
}

void register_square(const char* name, void (*f)(benchmark::State&), std::vector<int> threads) {
    for (std::int64_t n : sizes)
        for (int t : threads)
            benchmark::RegisterBenchmark(name, f)->Args({n, t})
                ->UseRealTime();
}

// y = relu(x·Wᵀ + b) for x [32, 784] and W [256, 784]: one pass over y, or product, bias and relu apart.
void linear_bias_relu(benchmark::State& state, bool fused) {
    dl::Context ctx({.seed = 1, .threads = 1});
    const auto x = dl::normal<float>({32, 784}, 0, 1, ctx), w = dl::normal<float>({256, 784}, 0, 0.05, ctx),
               bias = dl::normal<float>({256}, 0, 1, ctx);
    dl::Tensor<float> y;
    for (auto _ : state) {
        if (fused) {
            y = dl::linear(x, w, bias, dl::activation::relu);
        } else {  // the matmul, the bias add and the relu as three ops, three passes over y
            dl::Tensor<float> product = dl::matmul(x, w.t());
            product += bias;
            y = dl::relu(product);
        }
        benchmark::DoNotOptimize(y.data());
    }
    set_gflops(state, 2.0 * 32 * 784 * 256);
}

// The Fashion-MNIST CNN's convolutions, batch 64: 1→32 channels on 28×28 and 32→64 on 13×13, 3×3.
struct conv_shape {
    std::int64_t c, o, hw;
};
constexpr conv_shape conv_shapes[] = {{1, 32, 28}, {32, 64, 13}};

double conv_flops(const conv_shape& s) { return 2.0 * 64 * double(s.o) * double(s.c) * 9 * double(s.hw) * double(s.hw); }

void conv2d_fwd(benchmark::State& state, conv_shape s) {
    dl::Context ctx({.seed = 1, .threads = 1});
    const auto x = dl::normal<float>({64, s.c, s.hw, s.hw}, 0, 1, ctx), w = dl::normal<float>({s.o, s.c, 3, 3}, 0, 0.1, ctx),
               b = dl::normal<float>({s.o}, 0, 1, ctx);
    for (auto _ : state) {
        auto y = dl::conv2d(x, w, b, {.padding = 1});
        benchmark::DoNotOptimize(y.data());
    }
    set_gflops(state, conv_flops(s));
}

// Backward only: the input and weight gradients (and the bias's) from a given output gradient.
void conv2d_bwd(benchmark::State& state, conv_shape s) {
    dl::Context ctx({.seed = 1, .threads = 1});
    auto x = dl::normal<float>({64, s.c, s.hw, s.hw}, 0, 1, ctx), w = dl::normal<float>({s.o, s.c, 3, 3}, 0, 0.1, ctx),
         b = dl::normal<float>({s.o}, 0, 1, ctx);
    x.requires_grad_();
    w.requires_grad_();
    b.requires_grad_();
    const auto g = dl::normal<float>({64, s.o, s.hw, s.hw}, 0, 1, ctx);
    for (auto _ : state) {
        state.PauseTiming();
        auto y = dl::conv2d(x, w, b, {.padding = 1});
        dl::nn::zero_grad(std::vector{x, w, b});
        state.ResumeTiming();
        y.backward(g);
        benchmark::DoNotOptimize(w.grad().data());
    }
    set_gflops(state, 2 * conv_flops(s));
}

// The Fashion-MNIST CNN's 2×2 poolings, batch 64: after the 32-channel conv on 28×28 and the 64-channel
// one on 14×14.
struct pool_shape {
    std::int64_t c, hw;
    bool max;
};
constexpr pool_shape pool_shapes[] = {{32, 28, true}, {64, 14, true}, {32, 28, false}};

/// Bytes a pooling reads and writes: input and output, plus max_pool2d's int32 winners (forward
/// writes them, backward reads them; backward reads the output gradient and writes the input's).
double pool_bytes(const pool_shape& s) {
    const double in = 64.0 * double(s.c) * double(s.hw * s.hw), out = in / 4;
    return 4 * (in + out + (s.max ? out : 0));
}

void set_gbps(benchmark::State& state, double bytes_per_iteration) {
    state.counters["gbps"] = benchmark::Counter(bytes_per_iteration * double(state.iterations()) / 1e9,
                                                benchmark::Counter::kIsRate);
}

void pool2d_fwd(benchmark::State& state, pool_shape s) {
    dl::Context ctx({.seed = 1, .threads = 1});
    const auto x = dl::normal<float>({64, s.c, s.hw, s.hw}, 0, 1, ctx);
    for (auto _ : state) {
        auto y = s.max ? dl::max_pool2d(x, {.kernel = 2}) : dl::avg_pool2d(x, {.kernel = 2});
        benchmark::DoNotOptimize(y.data());
    }
    set_gbps(state, pool_bytes(s));
}

void pool2d_bwd(benchmark::State& state, pool_shape s) {
    dl::Context ctx({.seed = 1, .threads = 1});
    auto x = dl::normal<float>({64, s.c, s.hw, s.hw}, 0, 1, ctx);
    x.requires_grad_();
    const auto g = dl::normal<float>({64, s.c, s.hw / 2, s.hw / 2}, 0, 1, ctx);
    for (auto _ : state) {
        state.PauseTiming();
        auto y = s.max ? dl::max_pool2d(x, {.kernel = 2}) : dl::avg_pool2d(x, {.kernel = 2});
        dl::nn::zero_grad(std::vector{x});
        state.ResumeTiming();
        y.backward(g);
        benchmark::DoNotOptimize(x.grad().data());
    }
    set_gbps(state, pool_bytes(s));
}

#ifdef DL_BENCH_HAVE_TORCH
void libtorch_conv2d_fwd(benchmark::State& state, conv_shape s) {
    torch::set_num_threads(1);
    torch::NoGradGuard off;
    const auto x = torch::randn({64, s.c, s.hw, s.hw}), w = torch::randn({s.o, s.c, 3, 3}) * 0.1, b = torch::randn({s.o});
    for (auto _ : state) {
        auto y = torch::conv2d(x, w, b, 1, 1);
        benchmark::DoNotOptimize(y.data_ptr());
    }
    set_gflops(state, conv_flops(s));
}

void libtorch_conv2d_bwd(benchmark::State& state, conv_shape s) {
    torch::set_num_threads(1);
    auto x = torch::randn({64, s.c, s.hw, s.hw}).requires_grad_(), w = (torch::randn({s.o, s.c, 3, 3}) * 0.1).requires_grad_(),
         b = torch::randn({s.o}).requires_grad_();
    const auto g = torch::randn({64, s.o, s.hw, s.hw});
    for (auto _ : state) {
        state.PauseTiming();
        auto y = torch::conv2d(x, w, b, 1, 1);
        x.mutable_grad() = torch::Tensor();
        w.mutable_grad() = torch::Tensor();
        b.mutable_grad() = torch::Tensor();
        state.ResumeTiming();
        y.backward(g);
        benchmark::DoNotOptimize(w.grad().data_ptr());
    }
    set_gflops(state, 2 * conv_flops(s));
}

void libtorch_pool2d_fwd(benchmark::State& state, pool_shape s) {
    torch::set_num_threads(1);
    torch::NoGradGuard off;
    const auto x = torch::randn({64, s.c, s.hw, s.hw});
    for (auto _ : state) {
        auto y = s.max ? torch::max_pool2d(x, 2) : torch::avg_pool2d(x, 2);
        benchmark::DoNotOptimize(y.data_ptr());
    }
    set_gbps(state, pool_bytes(s));
}

void libtorch_pool2d_bwd(benchmark::State& state, pool_shape s) {
    torch::set_num_threads(1);
    auto x = torch::randn({64, s.c, s.hw, s.hw}).requires_grad_();
    const auto g = torch::randn({64, s.c, s.hw / 2, s.hw / 2});
    for (auto _ : state) {
        state.PauseTiming();
        auto y = s.max ? torch::max_pool2d(x, 2) : torch::avg_pool2d(x, 2);
        x.mutable_grad() = torch::Tensor();
        state.ResumeTiming();
        y.backward(g);
        benchmark::DoNotOptimize(x.grad().data_ptr());
    }
    set_gbps(state, pool_bytes(s));
}
#endif

#ifdef DL_BENCH_HAVE_EIGEN
void eigen_sgemm(benchmark::State& state) {
    const Eigen::Index n = state.range(0);
    using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const matrix a = matrix::Random(n, n), b = matrix::Random(n, n);
    matrix c(n, n);
    for (auto _ : state) {
        c.noalias() = a * b;
        benchmark::DoNotOptimize(c.data());
    }
    set_gflops(state, 2.0 * double(n) * double(n) * double(n));
}
#endif

#ifdef DL_BENCH_HAVE_OPENBLAS
void openblas_sgemm(benchmark::State& state) {
    const int n = int(state.range(0));
    openblas_set_num_threads(int(state.range(1)));
    dl::Context ctx({.seed = 1, .threads = 1});
    const auto a = dl::normal<float>({n, n}, 0, 1, ctx), b = dl::normal<float>({n, n}, 0, 1, ctx);
    dl::Tensor<float> c({n, n}, ctx);
    for (auto _ : state) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        benchmark::DoNotOptimize(c.data());
    }
    set_gflops(state, 2.0 * double(n) * double(n) * double(n));
}
#endif

std::string conv_name(const char* op, const conv_shape& s) {
    return std::string(op) + "/64x" + std::to_string(s.c) + "x" + std::to_string(s.hw) + "x" + std::to_string(s.hw) +
           "/" + std::to_string(s.o) + "x3x3";
}

std::string pool_name(const char* direction, const pool_shape& s, bool torch) {
    return std::string(torch ? "libtorch_" : "") + (s.max ? "max" : "avg") + "_pool2d_" + direction + "/64x" +
           std::to_string(s.c) + "x" + std::to_string(s.hw) + "x" + std::to_string(s.hw) + "/2x2";
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::RegisterBenchmark("fma_peak/1", fma_peak)->UseRealTime();
    register_square("sgemm", sgemm, {1, 2});
    register_square("bgemm", bgemm, {1, 2});
    register_square("igemm", igemm, {1, 2});
    benchmark::RegisterBenchmark("linear_bias_relu/32/784/256", linear_bias_relu, true)->UseRealTime();
    benchmark::RegisterBenchmark("linear_bias_relu_unfused/32/784/256", linear_bias_relu, false)->UseRealTime();
    for (const conv_shape& s : conv_shapes) {
        benchmark::RegisterBenchmark(conv_name("conv2d_fwd", s).c_str(), conv2d_fwd, s)->UseRealTime();
        benchmark::RegisterBenchmark(conv_name("conv2d_bwd", s).c_str(), conv2d_bwd, s)->UseRealTime();
#ifdef DL_BENCH_HAVE_TORCH
        benchmark::RegisterBenchmark(conv_name("libtorch_conv2d_fwd", s).c_str(), libtorch_conv2d_fwd, s)->UseRealTime();
        benchmark::RegisterBenchmark(conv_name("libtorch_conv2d_bwd", s).c_str(), libtorch_conv2d_bwd, s)->UseRealTime();
#endif
    }
    for (const pool_shape& s : pool_shapes) {
        benchmark::RegisterBenchmark(pool_name("fwd", s, false).c_str(), pool2d_fwd, s)->UseRealTime();
        benchmark::RegisterBenchmark(pool_name("bwd", s, false).c_str(), pool2d_bwd, s)->UseRealTime();
#ifdef DL_BENCH_HAVE_TORCH
        benchmark::RegisterBenchmark(pool_name("fwd", s, true).c_str(), libtorch_pool2d_fwd, s)->UseRealTime();
        benchmark::RegisterBenchmark(pool_name("bwd", s, true).c_str(), libtorch_pool2d_bwd, s)->UseRealTime();
#endif
    }
#ifdef DL_BENCH_HAVE_EIGEN
    register_square("eigen_sgemm", eigen_sgemm, {1});
#endif
#ifdef DL_BENCH_HAVE_OPENBLAS
    register_square("openblas_sgemm", openblas_sgemm, {1, 2});
#endif
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
}
