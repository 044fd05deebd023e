// Optimizers against scalar reference updates; the zero-allocation and determinism guarantees of a
// small training loop.
#include "support.hpp"

#include <atomic>
#include <new>

namespace {
std::atomic<long> heap_allocations{0};
}  // namespace

// Counts every heap allocation of the test binary (the zero-allocation test reads it).
void* operator new(std::size_t n) {
    heap_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using dl::Tensor;

TEST_CASE("sgd with momentum, nesterov and weight decay follows torch.optim.SGD") {
    for (bool nesterov : {false, true}) {
        Tensor<double> p = dl::tensor<double>({1.0, -2.0, 0.5}).requires_grad_();
        dl::nn::sgd<double> opt({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
        std::vector<double> ref = {1.0, -2.0, 0.5}, buf(3, 0);
        for (int step = 0; step < 3; ++step) {
            opt.zero_grad();
            dl::sum(dl::square(p) * 0.5).backward();  // gradient = p
            opt.step();
            for (int i = 0; i < 3; ++i) {
                double g = ref[i] + 0.01 * ref[i];
                buf[i] = step == 0 ? g : 0.9 * buf[i] + g;
                ref[i] -= 0.1 * (nesterov ? g + 0.9 * buf[i] : buf[i]);
            }
        }
        for (int i = 0; i < 3; ++i) CHECK(p(i) == doctest::Approx(ref[i]).epsilon(1e-12));
    }
}

TEST_CASE("adam and adamw follow their reference updates over a SIMD batch and a tail") {
    for (bool decoupled : {false, true}) {
        const int n = 11;
        Tensor<float> p = dl::linspace<float>(-1, 1, n).requires_grad_();
        dl::nn::adam<float> opt({p}, {.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = decoupled});
        std::vector<double> ref = dl_test::to_vector(dl::cast<double>(p.detach()).eval()) , m(n, 0), v(n, 0);
        std::vector<double> ref_d(ref.begin(), ref.end());
        for (int step = 1; step <= 4; ++step) {
            opt.zero_grad();
            dl::sum(dl::square(p)).backward();  // gradient = 2p
            opt.step();
            for (int i = 0; i < n; ++i) {
                double g = 2 * ref_d[i];
                if (decoupled)
                    ref_d[i] *= 1 - 0.01 * 0.1;
                else
                    g += 0.1 * ref_d[i];
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.999 * v[i] + 0.001 * g * g;
                const double mh = m[i] / (1 - std::pow(0.9, step)), vh = v[i] / (1 - std::pow(0.999, step));
                ref_d[i] -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
            }
        }
        for (int i = 0; i < n; ++i) CHECK(p(i) == doctest::Approx(ref_d[i]).epsilon(1e-5));
    }
}

TEST_CASE("gradient clipping by global norm") {
    Tensor<float> a = dl::zeros<float>({2}).requires_grad_(), b = dl::zeros<float>({1}).requires_grad_();
    Tensor<float> y = a * dl::tensor<float>({3.0f, 0.0f}) + dl::sum(b * 4.0f);
    dl::sum(y).backward();
    const double norm = dl::nn::clip_grad_norm<float>({a, b}, 1.0);
    CHECK(norm == doctest::Approx(std::sqrt(9.0 + 64.0)));
    CHECK(dl::norm(a.grad()).item() * dl::norm(a.grad()).item() + dl::norm(b.grad()).item() * dl::norm(b.grad()).item() ==
          doctest::Approx(1.0));
}

namespace {
/// 100 steps of a 16-64-64-4 tanh MLP with SGD, returning the final weights of the first layer.
std::vector<float> train_small_mlp(int threads, long* allocations_after_first_step) {
    dl::Context c({.seed = 21, .threads = threads});
    dl::nn::sequential model{dl::nn::linear<float>(16, 64, true, c), dl::nn::tanh{}, dl::nn::linear<float>(64, 64, true, c),
                             dl::nn::tanh{}, dl::nn::linear<float>(64, 4, true, c)};
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.01, .momentum = 0.9});
    const auto x = dl::normal<float>({8, 16}, 0, 1, c), y = dl::normal<float>({8, 4}, 0, 1, c);
    long before = 0;
    for (int step = 0; step < 101; ++step) {
        if (step == 1) before = heap_allocations.load();
        auto loss = dl::nn::mse_loss(model(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
    }
    if (allocations_after_first_step) *allocations_after_first_step = heap_allocations.load() - before;
    return dl_test::to_vector(model.get<0>().weight);
}
}  // namespace

TEST_CASE("a small MLP's training step allocates nothing after the first, and repeats bitwise") {
    long allocations = -1;
    const auto first = train_small_mlp(1, &allocations);
    CHECK(allocations == 0);
    CHECK(train_small_mlp(1, nullptr) == first);
    CHECK(train_small_mlp(2, nullptr) == train_small_mlp(2, nullptr));
}
