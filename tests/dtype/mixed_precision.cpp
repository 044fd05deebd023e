// Mixed precision: 16-bit parameters with float master weights in the optimizers, dynamic loss
// scaling for float16, and Linear / Conv2d / pooling on 16-bit tensors (the float kernels on widened
// operands, rounded once), forward and backward.
#include "support.hpp"

#include <dl/data.hpp>

#include <cmath>
#include <filesystem>

using dl::bfloat16;
using dl::float16;
using dl::Tensor;

namespace {

/// got (16-bit) within `ulps` units of H's last place of the float computation `wide`.
template <class H>
void check_close(const Tensor<H>& got, const Tensor<float>& wide, int ulps = 1) {
    REQUIRE(got.shape() == wide.shape());
    const auto g = dl_test::to_vector(got);
    const auto w = dl_test::to_vector(wide);
    int wrong = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
        const float want = w[i], have = float(g[i]);
        const float ulp = float(std::numeric_limits<H>::epsilon()) * std::max(std::fabs(want), float(std::numeric_limits<H>::min()));
        if (!(std::fabs(have - want) <= ulps * ulp) && wrong++ < 5) MESSAGE("element ", i, ": got ", have, ", float ", want);
    }
    CHECK(wrong == 0);
}

template <class H>
Tensor<float> widen(const Tensor<H>& t) {
    return dl::cast<float>(t);
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit parameters: updates below the 16-bit ulp accumulate in the float master", H, bfloat16, float16) {
    dl::Context ctx;
    Tensor<H> w = dl::ones<H>({5}, ctx);
    w.requires_grad_();
    dl::nn::sgd<H> opt({w}, {.lr = 1e-4});  // far below the ulp of 1 (2^-7 and 2^-10)
    static_assert(std::is_same_v<typename decltype(opt)::compute_type, float>);
    REQUIRE(opt.master_params().size() == 1);
    for (int step = 0; step < 1000; ++step) {
        opt.zero_grad();
        dl::sum(w).backward();  // gradient 1 everywhere
        opt.step();
    }
    const float master = opt.master_params()[0].data()[0];
    CHECK(master == doctest::Approx(0.9).epsilon(1e-5));
    for (std::int64_t i = 0; i < 5; ++i) CHECK(w.data()[i].bits() == H(master).bits());
    // Without the master, each step would round back to 1.
    CHECK(float(H(1.0f) - H(1e-4f)) == 1.0f);
    // Parameters written by hand reach the master through sync_masters (else the next step would
    // overwrite them from the stale master).
    std::fill_n(w.data(), 5, H(4.0f));
    opt.sync_masters();
    CHECK(opt.master_params()[0].data()[3] == 4.0f);
    opt.zero_grad();
    dl::sum(w).backward();
    opt.step();
    CHECK(float(w.data()[0]) == float(H(4.0f - 1e-4f)));
}

TEST_CASE("16-bit parameters: Adam's state and masters are float and survive a checkpoint") {
    dl::Context ctx({.seed = 4});
    dl::nn::linear<bfloat16> layer(6, 3, true, ctx);
    dl::nn::adam<bfloat16> opt(dl::nn::parameters<bfloat16>(layer), {.lr = 1e-2});
    const auto x = dl::uniform<bfloat16>({4, 6}, -1, 1, ctx);
    for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        dl::sum(dl::square(layer(x))).backward();
        opt.step();
    }
    for (std::size_t i = 0; i < opt.params().size(); ++i)
        for (std::int64_t k = 0; k < opt.params()[i].numel(); ++k)
            REQUIRE(opt.params()[i].data()[k].bits() == bfloat16(opt.master_params()[i].data()[k]).bits());
    const auto path = std::filesystem::temp_directory_path() / "dl_mixed_precision.safetensors";
    dl::nn::save_checkpoint(path, layer, &opt);
    dl::nn::linear<bfloat16> restored(6, 3, true, ctx);
    dl::nn::adam<bfloat16> restored_opt(dl::nn::parameters<bfloat16>(restored), {.lr = 1e-2});
    dl::nn::load_checkpoint(path, restored, &restored_opt);
    std::filesystem::remove(path);
    for (std::size_t i = 0; i < opt.params().size(); ++i) {
        const auto& a = opt.master_params()[i];
        const auto& b = restored_opt.master_params()[i];
        REQUIRE(std::equal(a.data(), a.data() + a.numel(), b.data()));
    }
    // One more identical step from both: identical parameters.
    for (auto* pair : {&opt, &restored_opt}) {
        auto& o = *pair;
        o.zero_grad();
        auto& l = pair == &opt ? layer : restored;
        dl::sum(dl::square(l(x))).backward();
        o.step();
    }
    CHECK(std::equal(layer.weight.data(), layer.weight.data() + layer.weight.numel(), restored.weight.data(),
                     [](bfloat16 p, bfloat16 q) { return p.bits() == q.bits(); }));
}

TEST_CASE("loss_scaler: float16 gradients that would flush to zero survive scaling") {
    dl::Context ctx;
    auto run = [&](bool scaled) {
        Tensor<float16> w = dl::ones<float16>({4}, ctx);
        w.requires_grad_();
        dl::nn::sgd<float16> opt({w}, {.lr = 1000});
        dl::nn::loss_scaler scaler;
        // d loss / d w = 1e-8: below float16's smallest subnormal (6e-8), so it is 0 unless scaled.
        auto loss = dl::sum(w * 1e-8f);
        opt.zero_grad();
        if (scaled) {
            scaler.backward(loss);
            CHECK(scaler.step(opt));
        } else {
            loss.backward();
            opt.step();
        }
        return opt.master_params()[0].data()[0];
    };
    CHECK(run(false) == 1.0f);
    CHECK(run(true) == doctest::Approx(1 - 1e-5).epsilon(0.02));
}

TEST_CASE("loss_scaler: Inf or NaN gradients skip the step and halve the scale; clean steps grow it") {
    dl::Context ctx;
    Tensor<float16> w = dl::full<float16>({3}, 2.0, ctx);
    w.requires_grad_();
    dl::nn::sgd<float16> opt({w}, {.lr = 0.1});
    dl::nn::loss_scaler scaler({.initial_scale = 1024, .growth_interval = 3});
    // 1e4 · 1024 overflows float16: the first step is skipped and nothing changes.
    auto loss = [&] { return dl::sum(w * 1e4f); };
    opt.zero_grad();
    scaler.backward(loss());
    CHECK_FALSE(scaler.step(opt));
    CHECK(scaler.scale() == 512);
    CHECK(scaler.skipped_steps() == 1);
    CHECK(float(w.data()[0]) == 2.0f);
    CHECK(opt.master_params()[0].data()[0] == 2.0f);
    // With 2^-4 the gradient fits (625 · ... ) — keep halving until it does, as training would.
    int tries = 0;
    while (tries++ < 20) {
        opt.zero_grad();
        scaler.backward(loss());
        if (scaler.step(opt)) break;
    }
    CHECK(scaler.scale() * 1e4 < 65504);
    CHECK(opt.master_params()[0].data()[0] == doctest::Approx(2.0 - 0.1 * 1e4).epsilon(1e-3));
    // Three clean steps double the scale.
    const double before = scaler.scale();
    for (int k = 0; k < 3; ++k) {
        opt.zero_grad();
        scaler.backward(dl::sum(w * 1e-3f));
        REQUIRE(scaler.step(opt));
    }
    CHECK(scaler.scale() == 2 * before);
    CHECK_THROWS_AS(dl::nn::loss_scaler({.backoff_factor = 1.5}), dl::error);
}

TEST_CASE_TEMPLATE("16-bit Linear: the float product of the widened operands, rounded once, forward and backward", H,
                   bfloat16, float16) {
    dl::Context ctx({.seed = 7});
    for (std::int64_t n : {1, 5, 64}) {
        CAPTURE(n);
        dl::nn::linear<H> layer(37, 19, true, ctx);
        Tensor<H> x = dl::uniform<H>({n, 37}, -1, 1, ctx);
        x.requires_grad_();
        Tensor<H> y = dl::linear(x, layer.weight, layer.bias, dl::activation::relu);
        // The same in float on the widened values.
        Tensor<float> xf = dl::cast<float>(x.detach()), wf = dl::cast<float>(layer.weight.detach()),
                      bf = dl::cast<float>(layer.bias.detach());
        xf.requires_grad_();
        wf.requires_grad_();
        bf.requires_grad_();
        Tensor<float> yf = dl::linear(xf, wf, bf, dl::activation::relu);
        check_close<H>(y.detach(), yf.detach(), 1);
        const Tensor<H> g = dl::uniform<H>({n, 19}, -1, 1, ctx);
        y.backward(g);
        yf.backward(widen(g));
        // Gradients pass through one or two roundings of 16-bit values: allow a few ulps.
        check_close<H>(x.grad(), xf.grad(), 4);
        check_close<H>(layer.weight.grad(), wf.grad(), 4);
        check_close<H>(layer.bias.grad(), bf.grad(), 4);
    }
}

TEST_CASE_TEMPLATE("16-bit Conv2d and pooling against the float computation", H, bfloat16, float16) {
    dl::Context ctx({.seed = 8});
    const auto x = dl::uniform<H>({2, 3, 9, 9}, -1, 1, ctx);
    const auto w = dl::uniform<H>({4, 3, 3, 3}, -0.5, 0.5, ctx);
    const auto b = dl::uniform<H>({4}, -0.5, 0.5, ctx);
    const Tensor<H> y = dl::conv2d(x, w, b, {.padding = 1});
    const Tensor<float> yf = dl::conv2d(widen(x), widen(w), widen(b), {.padding = 1});
    check_close<H>(y, yf, 1);
    const Tensor<H> p = dl::max_pool2d(y, {.kernel = 2});
    const Tensor<float> pf = dl::max_pool2d(widen(y), {.kernel = 2});
    check_close<H>(p, pf, 0);
    const Tensor<H> a = dl::avg_pool2d(y, {.kernel = 3, .stride = 2});
    const Tensor<float> af = dl::avg_pool2d(widen(y), {.kernel = 3, .stride = 2});
    check_close<H>(a, af, 1);
}

TEST_CASE("bfloat16 MLP: a few hundred steps of mixed-precision training fit what float fits") {
    // Two Gaussian blobs per class, 3 classes: float and bfloat16 reach the same training accuracy.
    dl::Context ctx({.seed = 11});
    const std::int64_t n = 300;
    Tensor<float> x({n, 8}, ctx);
    Tensor<std::int64_t> y({n}, ctx);
    const auto noise = dl::normal<float>({n, 8}, 0, 0.4, ctx);
    for (std::int64_t i = 0; i < n; ++i) {
        y.data()[i] = i % 3;
        for (std::int64_t k = 0; k < 8; ++k) x.data()[i * 8 + k] = float((k % 3) == (i % 3)) + noise.data()[i * 8 + k];
    }
    auto train = [&]<class T>() {
        dl::Context local({.seed = 12});
        dl::nn::sequential model{dl::nn::linear<T>(8, 16, true, local), dl::nn::relu{}, dl::nn::linear<T>(16, 3, true, local)};
        dl::nn::adam<T> opt(dl::nn::parameters<T>(model), {.lr = 1e-2});
        const Tensor<T> xt = dl::cast<T>(x);
        for (int step = 0; step < 200; ++step) {
            opt.zero_grad();
            dl::nn::cross_entropy(model(xt), y).backward();
            opt.step();
        }
        dl::no_grad off(local);
        return dl::nn::accuracy(model(xt), y);
    };
    const double f32 = train.template operator()<float>(), b16 = train.template operator()<bfloat16>();
    CHECK(f32 > 0.9);
    CHECK(b16 > f32 - 0.03);
}
