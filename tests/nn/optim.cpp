// Optimizers against scalar reference updates; the zero-allocation and determinism guarantees of a
// small training loop.
#include "support.hpp"

#include <atomic>
#include <cstring>
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

TEST_CASE("an update large enough to be split over threads gives the same bits on 1 and 2 threads") {
    // 2^17 + 5 elements: over the threshold at which an optimizer splits a parameter over the
    // Context's threads, with a scalar tail. Adam's update (four streams) and SGD's (two).
    const std::int64_t n = (std::int64_t{1} << 17) + 5;
    auto train = [&](int threads, bool use_adam) {
        dl::Context c({.seed = 11, .threads = threads});
        Tensor<float> p = dl::normal<float>({n}, 0, 1, c).requires_grad_();
        const Tensor<float> target = dl::normal<float>({n}, 0, 1, c);
        dl::nn::adam<float> adam({p}, {.lr = 0.01});
        dl::nn::sgd<float> sgd({p}, {.lr = 0.1, .momentum = 0.9});
        for (int step = 0; step < 3; ++step) {
            dl::nn::zero_grad(std::vector{p}, true);
            dl::sum(dl::square(p - target)).backward();
            use_adam ? adam.step() : sgd.step();
        }
        return dl_test::to_vector(p);
    };
    for (bool use_adam : {true, false}) {
        const auto one = train(1, use_adam), two = train(2, use_adam);
        REQUIRE(one.size() == static_cast<std::size_t>(n));
        CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
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
std::vector<float> train_small_mlp(int threads, long* allocations_after_first_step, bool set_to_none = false) {
    dl::Context c({.seed = 21, .threads = threads});
    dl::nn::sequential model{dl::nn::linear<float>(16, 64, true, c), dl::nn::tanh{}, dl::nn::linear<float>(64, 64, true, c),
                             dl::nn::tanh{}, dl::nn::linear<float>(64, 4, true, c)};
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.01, .momentum = 0.9});
    const auto x = dl::normal<float>({8, 16}, 0, 1, c), y = dl::normal<float>({8, 4}, 0, 1, c);
    long before = 0;
    for (int step = 0; step < 101; ++step) {
        if (step == 1) before = heap_allocations.load();
        auto loss = dl::nn::mse_loss(model(x), y);
        opt.zero_grad(set_to_none);
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
    // Dropped gradients are written instead of added into zeros: the same weights, bit for bit, and
    // their buffers come back from the caching allocator.
    long dropping = -1;
    CHECK(train_small_mlp(1, &dropping, true) == first);
    CHECK(dropping == 0);
}

TEST_CASE("zero_grad with set_to_none drops gradients; steps skip parameters left without one") {
    dl::Context c({.threads = 1});
    Tensor<float> p = dl::full<float>({3}, 1.0f, c).requires_grad_(), q = dl::full<float>({2}, 1.0f, c).requires_grad_();
    dl::sum(p * 2.0f + dl::sum(q)).backward();
    dl::nn::sgd<float> opt({p, q}, {.lr = 0.5, .weight_decay = 0.1});
    opt.zero_grad(true);
    CHECK_FALSE(p.grad().defined());
    CHECK_FALSE(q.grad().defined());
    dl::sum(p * 3.0f).backward();
    CHECK(dl_test::to_vector(p.grad()) == std::vector<float>{3, 3, 3});  // written, not added to the 2s
    CHECK_FALSE(q.grad().defined());
    opt.step();
    for (const float v : dl_test::to_vector(p)) CHECK(v == doctest::Approx(1 - 0.5 * (3 + 0.1)));
    CHECK(dl_test::to_vector(q) == std::vector<float>{1, 1});  // no gradient: no decay either
    opt.zero_grad();  // the default keeps p's buffer, zeroed, and leaves q without one
    CHECK(dl_test::to_vector(p.grad()) == std::vector<float>{0, 0, 0});
    CHECK_FALSE(q.grad().defined());
}

namespace {
/// Runs `steps` optimizer steps on p (float, 11 elements: one SIMD batch and a tail) with gradient
/// 2p + 0.3, and the same steps of `reference(x, g, step)` on a double copy; returns the largest
/// relative difference.
template <class Optimizer, class Reference>
double optimizer_error(Tensor<float> p, Optimizer& opt, int steps, Reference reference) {
    std::vector<double> x = dl_test::to_vector(dl::cast<double>(p.detach()).eval());
    double worst = 0;
    for (int step = 1; step <= steps; ++step) {
        opt.zero_grad();
        dl::sum(dl::square(p) + p * 0.3f).backward();
        opt.step();
        for (std::size_t i = 0; i < x.size(); ++i) {
            reference(x[i], 2 * x[i] + 0.3, i, step);
            worst = std::max(worst, std::abs(double(p(static_cast<std::int64_t>(i))) - x[i]) / (std::abs(x[i]) + 1e-3));
        }
    }
    return worst;
}
}  // namespace

TEST_CASE("adagrad, rmsprop (plain, centered, momentum) and ftrl follow their reference updates") {
    const int n = 11;
    SUBCASE("adagrad") {
        Tensor<float> p = dl::linspace<float>(-1, 1, n).requires_grad_();
        dl::nn::adagrad<float> opt({p}, {.lr = 0.1, .lr_decay = 0.01, .weight_decay = 0.05, .initial_accumulator_value = 0.1});
        std::vector<double> sum(n, 0.1);
        CHECK(optimizer_error(p, opt, 5, [&](double& x, double g, std::size_t i, int step) {
                  g += 0.05 * x;
                  sum[i] += g * g;
                  x -= 0.1 / (1 + (step - 1) * 0.01) * g / (std::sqrt(sum[i]) + 1e-10);
              }) < 1e-5);
    }
    for (bool centered : {false, true})
        for (double momentum : {0.0, 0.8}) {
            CAPTURE(centered);
            CAPTURE(momentum);
            Tensor<float> p = dl::linspace<float>(-1, 1, n).requires_grad_();
            dl::nn::rmsprop<float> opt({p}, {.lr = 0.01, .weight_decay = 0.02, .momentum = momentum, .centered = centered});
            std::vector<double> sq(n, 0), ga(n, 0), buf(n, 0);
            CHECK(optimizer_error(p, opt, 5, [&](double& x, double g, std::size_t i, int) {
                      g += 0.02 * x;
                      sq[i] = 0.99 * sq[i] + 0.01 * g * g;
                      double avg = sq[i];
                      if (centered) {
                          ga[i] = 0.99 * ga[i] + 0.01 * g;
                          avg -= ga[i] * ga[i];
                      }
                      const double denominator = std::sqrt(avg) + 1e-8;
                      if (momentum != 0) {
                          buf[i] = momentum * buf[i] + g / denominator;
                          x -= 0.01 * buf[i];
                      } else {
                          x -= 0.01 * g / denominator;
                      }
                  }) < 1e-4);
        }
    SUBCASE("ftrl: the L1 term holds small weights at exactly zero") {
        Tensor<float> p = dl::linspace<float>(-1, 1, n).requires_grad_();
        dl::nn::ftrl<float> opt({p}, {.lr = 0.5, .beta = 1, .l1 = 0.8, .l2 = 0.1});
        std::vector<double> z(n, 0), acc(n, 0);
        CHECK(optimizer_error(p, opt, 6, [&](double& w, double g, std::size_t i, int) {
                  const double grown = acc[i] + g * g;
                  z[i] += g - (std::sqrt(grown) - std::sqrt(acc[i])) / 0.5 * w;
                  acc[i] = grown;
                  w = std::abs(z[i]) <= 0.8 ? 0 : -(z[i] - std::copysign(0.8, z[i])) / ((1 + std::sqrt(acc[i])) / 0.5 + 0.1);
              }) < 1e-4);
        int zeros = 0;
        for (float v : dl_test::to_vector(p.detach())) zeros += v == 0.0f;
        CHECK(zeros > 0);
    }
}

namespace {
/// The largest |p - reference| over `steps` steps of a float optimizer driven by the gradient
/// sin(0.7 i + 1.3 t) + 0.5 p (varying in sign and size, fed back through p), next to the same
/// update written in double. Rounding alone stays near float's resolution; an update rule that
/// rounds its constants inconsistently drifts by a fixed fraction of every step.
template <class Optimizer, class Reference>
double drift_from_reference(Optimizer& opt, Tensor<float> p, int steps, Reference reference) {
    const std::int64_t n = p.numel();
    std::vector<double> x = dl_test::to_vector(dl::cast<double>(p.detach()).eval());
    Tensor<float> drive({n});
    double worst = 0;
    for (int t = 1; t <= steps; ++t) {
        for (std::int64_t i = 0; i < n; ++i) drive.data()[i] = static_cast<float>(std::sin(0.7 * double(i) + 1.3 * t));
        opt.zero_grad();
        dl::sum(p * drive + dl::square(p) * 0.25f).backward();
        opt.step();
        for (std::int64_t i = 0; i < n; ++i) {
            const auto k = static_cast<std::size_t>(i);
            reference(x[k], double(drive.data()[i]) + 0.5 * x[k], k, t);
            worst = std::max(worst, std::abs(double(p(i)) - x[k]));
        }
    }
    return worst;
}
}  // namespace

TEST_CASE("every optimizer stays within float rounding of a double-precision reference over 1,000 steps") {
    const int n = 37, steps = 1000;  // a SIMD batch or more and a tail
    // Rounding alone leaves 1.5e-7 to 6e-7 here (SIMD or scalar, with or without FMA); betas rounded
    // to float before forming 1 - beta drifted adam and rmsprop by 2.5e-6 to 3.9e-6.
    const double rounding = 1e-6;
    auto start = [&] { return dl::linspace<float>(-1, 1, n).requires_grad_(); };
    for (bool nesterov : {false, true}) {
        CAPTURE(nesterov);
        Tensor<float> p = start();
        dl::nn::sgd<float> opt({p}, {.lr = 0.01, .momentum = 0.9, .weight_decay = 0.01, .dampening = 0.1, .nesterov = nesterov});
        std::vector<double> buf(n);
        CHECK(drift_from_reference(opt, p, steps, [&](double& x, double g, std::size_t i, int t) {
                  g += 0.01 * x;
                  buf[i] = t == 1 ? g : 0.9 * buf[i] + 0.9 * g;
                  x -= 0.01 * (nesterov ? g + 0.9 * buf[i] : buf[i]);
              }) < rounding);
    }
    for (bool decoupled : {false, true}) {
        CAPTURE(decoupled);
        Tensor<float> p = start();
        dl::nn::adam<float> opt({p}, {.lr = 0.01, .weight_decay = 0.01, .decoupled_weight_decay = decoupled});
        std::vector<double> m(n), v(n);
        CHECK(drift_from_reference(opt, p, steps, [&](double& x, double g, std::size_t i, int t) {
                  if (decoupled)
                      x *= 1 - 0.01 * 0.01;
                  else
                      g += 0.01 * x;
                  m[i] = 0.9 * m[i] + 0.1 * g;
                  v[i] = 0.999 * v[i] + 0.001 * g * g;
                  x -= 0.01 * (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8);
              }) < rounding);
    }
    {
        Tensor<float> p = start();
        dl::nn::adagrad<float> opt({p}, {.lr = 0.05, .lr_decay = 0.001, .weight_decay = 0.01, .initial_accumulator_value = 0.1});
        std::vector<double> sum(n, 0.1);
        CHECK(drift_from_reference(opt, p, steps, [&](double& x, double g, std::size_t i, int t) {
                  g += 0.01 * x;
                  sum[i] += g * g;
                  x -= 0.05 / (1 + (t - 1) * 0.001) * g / (std::sqrt(sum[i]) + 1e-10);
              }) < rounding);
    }
    for (bool centered : {false, true})
        for (double momentum : {0.0, 0.5}) {
            CAPTURE(centered);
            CAPTURE(momentum);
            Tensor<float> p = start();
            dl::nn::rmsprop<float> opt({p}, {.lr = 0.001, .alpha = 0.999, .weight_decay = 0.01, .momentum = momentum, .centered = centered});
            std::vector<double> sq(n), ga(n), buf(n);
            CHECK(drift_from_reference(opt, p, steps, [&](double& x, double g, std::size_t i, int) {
                      g += 0.01 * x;
                      sq[i] = 0.999 * sq[i] + 0.001 * g * g;
                      double avg = sq[i];
                      if (centered) {
                          ga[i] = 0.999 * ga[i] + 0.001 * g;
                          avg -= ga[i] * ga[i];
                      }
                      const double denominator = std::sqrt(avg) + 1e-8;
                      if (momentum != 0) {
                          buf[i] = momentum * buf[i] + g / denominator;
                          x -= 0.001 * buf[i];
                      } else {
                          x -= 0.001 * g / denominator;
                      }
                  }) < rounding);
        }
    {
        Tensor<float> p = start();
        dl::nn::ftrl<float> opt({p}, {.lr = 0.1, .beta = 1, .l1 = 0.01, .l2 = 0.1});
        std::vector<double> z(n), acc(n);
        CHECK(drift_from_reference(opt, p, steps, [&](double& w, double g, std::size_t i, int) {
                  const double grown = acc[i] + g * g;
                  z[i] += g - (std::sqrt(grown) - std::sqrt(acc[i])) / 0.1 * w;
                  acc[i] = grown;
                  w = std::abs(z[i]) <= 0.01 ? 0 : -(z[i] - std::copysign(0.01, z[i])) / ((1 + std::sqrt(acc[i])) / 0.1 + 0.1);
              }) < rounding);
    }
}

TEST_CASE("adam's first step of gradient 1 and lr 1 moves p = 1 to within float rounding of the exact 1e-8") {
    Tensor<float> p = dl::ones<float>({1}).requires_grad_();
    dl::nn::adam<float> opt({p}, {.lr = 1});
    dl::sum(p).backward();
    opt.step();
    // Before the bias correction used the rounded beta2, p was -6.7e-6; PyTorch's float Adam gives 1.2e-7.
    CHECK(std::abs(p(0) - 1e-8) < 1.2e-7);
}

TEST_CASE("learning-rate schedules: step, cosine, linear warmup") {
    Tensor<float> p = dl::ones<float>({2}).requires_grad_();
    dl::nn::sgd<float> opt({p}, {.lr = 1.0});
    dl::nn::step_lr steps(opt, 2, 0.5);
    std::vector<double> seen;
    for (int i = 0; i < 5; ++i) steps.step(), seen.push_back(opt.lr());
    CHECK(seen == std::vector<double>{1.0, 0.5, 0.5, 0.25, 0.25});

    opt.set_lr(2.0);
    dl::nn::cosine_lr cosine(opt, 4, 0.0);
    cosine.step();
    CHECK(opt.lr() == doctest::Approx(1 + std::cos(std::numbers::pi / 4)));
    for (int i = 0; i < 3; ++i) cosine.step();
    CHECK(opt.lr() == doctest::Approx(0).scale(1));
    cosine.step();
    CHECK(opt.lr() == doctest::Approx(0).scale(1));  // held after the period

    opt.set_lr(1.0);
    dl::nn::linear_warmup warm(opt, 4, 0.2);
    CHECK(opt.lr() == doctest::Approx(0.2));
    warm.step();
    CHECK(opt.lr() == doctest::Approx(0.4));
    for (int i = 0; i < 5; ++i) warm.step();
    CHECK(opt.lr() == doctest::Approx(1.0));
    CHECK(dl_test::error_message([&] { dl::nn::step_lr bad(opt, 0); }).find("step_size") != std::string::npos);
}
