// Passes for serving (graph/inference.hpp): conv + batch_norm folding, and int8 post-training
// quantization with the quantized_linear op it puts in place of linear nodes, checked against a
// scalar reference.
#include "support.hpp"

#include <dl/dl.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

using dl::Tensor;
namespace graph = dl::graph;
using any_tensor = dl::autograd::any_tensor;

std::size_t count_ops(const graph::Graph& g, std::string_view op) {
    return static_cast<std::size_t>(
        std::count_if(g.nodes.begin(), g.nodes.end(), [&](const graph::node& n) { return n.op == op; }));
}

graph::pass_manager just(graph::pass p) {
    graph::pass_manager m;
    m.add(std::move(p));
    return m;
}

/// quantized_linear computed element by element from its definition (autograd/quantized.hpp).
Tensor<float> quantized_reference(const Tensor<float>& x, const dl::int8_weight& w, const Tensor<float>& bias,
                                  dl::affine_quantization q, bool relu) {
    const std::int64_t rows = x.shape()[0], in = w.in_features(), out = w.out_features();
    Tensor<float> y({rows, out}, x.context());
    for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t o = 0; o < out; ++o) {
            std::int64_t sum = 0;
            for (std::int64_t k = 0; k < in; ++k) {
                // As the op computes it (one fma by the reciprocal): the same rounding at level boundaries.
                const float level = std::nearbyint(std::fma(x.at(i, k), 1.0f / q.scale, float(q.zero_point)));
                const auto qx = static_cast<std::int64_t>(std::clamp(level, 0.0f, 255.0f));
                sum += (qx - q.zero_point) * w.values()[std::size_t(o * in + k)];
            }
            double v = double(sum) * double(q.scale) * double(w.scales()[std::size_t(o)]);
            if (bias.defined()) v += bias.at(o);
            y.at(i, o) = static_cast<float>(relu ? std::max(v, 0.0) : v);
        }
    return y;
}

}  // namespace

TEST_CASE("affine_quantization covers a range widened to hold zero exactly") {
    const auto q = dl::affine_quantization::covering(-1.0f, 3.0f);
    CHECK(q.scale == doctest::Approx(4.0 / 255));
    CHECK(q.zero_point == 64);  // round(1 / (4/255)) = round(63.75)
    CHECK(dl::affine_quantization::covering(0.5f, 2.0f).zero_point == 0);    // widened down to 0
    CHECK(dl::affine_quantization::covering(-2.0f, -1.0f).zero_point == 255);  // widened up to 0
    const auto flat = dl::affine_quantization::covering(0.0f, 0.0f);
    CHECK(flat.scale == 1.0f);
    CHECK_THROWS_WITH_AS((void)dl::affine_quantization::covering(0.0f, NAN), doctest::Contains("cannot cover"), dl::error);
    CHECK_THROWS_WITH_AS((void)dl::affine_quantization::covering(2.0f, 1.0f), doctest::Contains("cannot cover"), dl::error);
}

TEST_CASE("int8_weight quantizes each output channel symmetrically to ±127") {
    dl::Context ctx({.seed = 3, .threads = 1});
    Tensor<float> w = dl::uniform<float>({5, 13}, -2, 2, ctx);
    for (std::int64_t k = 0; k < 13; ++k) w.at(2, k) = 0;  // an all-zero channel
    w.at(4, 7) = -9;                                       // an outlier sets its channel's scale
    const dl::int8_weight q(w);
    REQUIRE(q.out_features() == 5);
    REQUIRE(q.in_features() == 13);
    for (std::int64_t o = 0; o < 5; ++o) {
        int largest = 0, sum = 0;
        for (std::int64_t k = 0; k < 13; ++k) {
            const int v = q.values()[std::size_t(o * 13 + k)];
            largest = std::max(largest, std::abs(v));
            sum += v;
            // Round to nearest: the dequantized weight is within half a step.
            CHECK(std::abs(v * q.scales()[std::size_t(o)] - w.at(o, k)) <= q.scales()[std::size_t(o)] * 0.5f + 1e-6f);
        }
        CHECK(largest == (o == 2 ? 0 : 127));
        CHECK(sum == q.row_sums()[std::size_t(o)]);
    }
    CHECK(q.values()[4 * 13 + 7] == -127);
    Tensor<float> bad = dl::zeros<float>({2, 2}, ctx);
    bad.at(1, 0) = INFINITY;
    CHECK_THROWS_WITH_AS(dl::int8_weight{bad}, doctest::Contains("weight[1, 0] is inf"), dl::error);
    CHECK_THROWS_WITH_AS(dl::int8_weight{dl::zeros<float>({4}, ctx)}, doctest::Contains("expected a weight [out, in]"),
                         dl::error);
}

TEST_CASE("quantized_linear matches the scalar reference on odd shapes, with and without bias and relu") {
    dl::Context ctx({.seed = 4, .threads = 2});
    for (std::int64_t rows : {1, 5, 33})
        for (std::int64_t in : {1, 7, 37, 1030})  // 1030: two k blocks of the int8 GEMM
            for (std::int64_t out : {1, 10, 33}) {
                CAPTURE(rows);
                CAPTURE(in);
                CAPTURE(out);
                const auto w = std::make_shared<const dl::int8_weight>(dl::uniform<float>({out, in}, -1, 1, ctx));
                // Inputs partly outside the calibrated range: they clamp to 0 and 255.
                const Tensor<float> x = dl::uniform<float>({rows, in}, -1.5f, 2.5f, ctx);
                const auto q = dl::affine_quantization::covering(-1.0f, 2.0f);
                const Tensor<float> bias = dl::uniform<float>({out}, -1, 1, ctx);
                const double tolerance = 1e-5 * double(in);
                CHECK(dl_test::same_elements(dl::quantized_linear(x, w, bias, q, dl::activation::relu),
                                             quantized_reference(x, *w, bias, q, true), tolerance));
                CHECK(dl_test::same_elements(dl::quantized_linear(x, w, Tensor<float>(), q),
                                             quantized_reference(x, *w, Tensor<float>(), q, false), tolerance));
            }
}

TEST_CASE("quantized_linear is close to the float linear it quantizes; bad input is refused") {
    dl::Context ctx({.seed = 5, .threads = 1});
    const Tensor<float> x = dl::uniform<float>({16, 64}, 0, 1, ctx), w = dl::uniform<float>({8, 64}, -0.3f, 0.3f, ctx);
    const Tensor<float> exact = dl::linear(x, w);
    const Tensor<float> approx = dl::quantized_linear(x, std::make_shared<const dl::int8_weight>(w), {},
                                                      dl::affine_quantization::covering(0, 1));
    // Errors of half a step in x (1/510) and in w (0.3/254) over 64 terms stay well under 0.05.
    CHECK(dl_test::same_elements(exact, approx, 0.05));
    CHECK_FALSE(dl_test::same_elements(exact, approx, 0));  // it really is quantized

    const auto qw = std::make_shared<const dl::int8_weight>(w);
    const auto q = dl::affine_quantization::covering(0, 1);
    CHECK_THROWS_WITH_AS((void)dl::quantized_linear(dl::zeros<float>({2, 63}, ctx), qw, {}, q),
                         doctest::Contains("for a weight of 64 input features"), dl::error);
    CHECK_THROWS_WITH_AS((void)dl::quantized_linear(x, nullptr, {}, q), doctest::Contains("no weight"), dl::error);
    CHECK_THROWS_WITH_AS((void)dl::quantized_linear(x, qw, dl::zeros<float>({7}, ctx), q),
                         doctest::Contains("bias of shape [7]"), dl::error);
    CHECK_THROWS_WITH_AS((void)dl::quantized_linear(x, qw, {}, {0.0f, 0}), doctest::Contains("do not map to uint8"),
                         dl::error);
    Tensor<float> tracked = x.clone().requires_grad_();
    CHECK_THROWS_WITH_AS((void)dl::quantized_linear(tracked, qw, {}, q), doctest::Contains("has no gradient"), dl::error);
    dl::no_grad off(ctx);
    CHECK(dl::quantized_linear(tracked, qw, {}, q).shape() == dl::Shape{16, 8});
    CHECK(dl::quantized_linear(dl::zeros<float>({0, 64}, ctx), qw, {}, q).shape() == dl::Shape{0, 8});
}

TEST_CASE("graph passes: int8 quantization calibrates, replaces linear nodes and stays close to float") {
    dl::Context ctx({.seed = 6, .threads = 2});
    dl::nn::sequential model{dl::nn::linear<float>(40, 32, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(32, 16, true, ctx),
                             dl::nn::tanh{}, dl::nn::linear<float>(16, 5, false, ctx)};
    const Tensor<float> example = dl::uniform<float>({8, 40}, -1, 1, ctx);
    auto f = graph::trace([&](const Tensor<float>& x) { return model(x); }, example);
    f.optimize();
    REQUIRE(count_ops(f.graph(), "linear") == 3);
    std::vector<std::vector<any_tensor>> calibration;
    for (int b = 0; b < 4; ++b) calibration.push_back({dl::uniform<float>({32, 40}, -1, 1, ctx)});
    const Tensor<float> test = dl::uniform<float>({200, 40}, -1, 1, ctx);  // another batch size than traced
    const Tensor<float> expected = f(test);

    graph::pass_manager passes = graph::default_passes();
    passes.add(graph::quantize_int8(calibration));
    f.optimize(passes);
    const std::string text = f.to_string();
    CAPTURE(text);
    CHECK(count_ops(f.graph(), "linear") == 0);
    CHECK(count_ops(f.graph(), "quantized_linear") == 3);
    CHECK(text.find("act=1}") != std::string::npos);  // the relu stays in the first product's epilogue
    CHECK(text.find("parameter : float32[32, 40]") == std::string::npos);  // float weights no longer read

    const Tensor<float> got = f(test);
    REQUIRE(got.shape() == expected.shape());
    double worst = 0;
    int same_class = 0;
    for (std::int64_t i = 0; i < 200; ++i) {
        std::int64_t a = 0, b = 0;
        for (std::int64_t j = 0; j < 5; ++j) {
            worst = std::max(worst, double(std::abs(got.at(i, j) - expected.at(i, j))));
            if (got.at(i, j) > got.at(i, b)) b = j;
            if (expected.at(i, j) > expected.at(i, a)) a = j;
        }
        same_class += a == b;
    }
    CHECK(worst < 0.05);
    CHECK(worst > 0);
    CHECK(same_class >= 190);
}

/// quantized_conv2d from its definition: padding reads 0.0, which quantizes to the zero point.
Tensor<float> quantized_conv_reference(const Tensor<float>& x, const dl::int8_weight& w, dl::extent2 kernel,
                                       const Tensor<float>& bias, dl::affine_quantization q, dl::conv2d_options o) {
    const std::int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], wd = x.shape()[3], oc = w.out_features();
    const std::int64_t oh = (h + 2 * o.padding.h - o.dilation.h * (kernel.h - 1) - 1) / o.stride.h + 1;
    const std::int64_t ow = (wd + 2 * o.padding.w - o.dilation.w * (kernel.w - 1) - 1) / o.stride.w + 1;
    Tensor<float> y({n, oc, oh, ow}, x.context());
    for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t f = 0; f < oc; ++f)
            for (std::int64_t r = 0; r < oh; ++r)
                for (std::int64_t s = 0; s < ow; ++s) {
                    std::int64_t sum = 0;
                    for (std::int64_t ch = 0; ch < c; ++ch)
                        for (std::int64_t i = 0; i < kernel.h; ++i)
                            for (std::int64_t j = 0; j < kernel.w; ++j) {
                                const std::int64_t ih = r * o.stride.h - o.padding.h + i * o.dilation.h;
                                const std::int64_t iw = s * o.stride.w - o.padding.w + j * o.dilation.w;
                                const float v = ih >= 0 && ih < h && iw >= 0 && iw < wd ? x.at(b, ch, ih, iw) : 0.0f;
                                const float level = std::nearbyint(std::fma(v, 1.0f / q.scale, float(q.zero_point)));
                                const auto qx = static_cast<std::int64_t>(std::clamp(level, 0.0f, 255.0f));
                                sum += (qx - q.zero_point) * w.values()[std::size_t(f * w.in_features() + (ch * kernel.h + i) * kernel.w + j)];
                            }
                    double v = double(sum) * double(q.scale) * double(w.scales()[std::size_t(f)]);
                    if (bias.defined()) v += bias.at(f);
                    y.at(b, f, r, s) = static_cast<float>(o.act == dl::activation::relu ? std::max(v, 0.0) : v);
                }
    return y;
}

TEST_CASE("quantized_conv2d matches the scalar reference with padding, stride and dilation") {
    dl::Context ctx({.seed = 12, .threads = 2});
    struct geometry {
        std::int64_t channels, kernel;
        dl::conv2d_options options;
    };
    for (const geometry& g : {geometry{1, 3, {.padding = 1}}, geometry{4, 3, {.stride = 2, .padding = 1, .act = dl::activation::relu}},
                              geometry{3, 2, {.padding = {0, 2}, .dilation = 2}}, geometry{8, 1, {}}}) {
        CAPTURE(g.channels);
        CAPTURE(g.kernel);
        const Tensor<float> x = dl::uniform<float>({2, g.channels, 7, 6}, -1.5f, 2.5f, ctx);
        const Tensor<float> weight = dl::uniform<float>({5, g.channels, g.kernel, g.kernel}, -1, 1, ctx);
        const auto w = std::make_shared<const dl::int8_weight>(weight.reshape({5, g.channels * g.kernel * g.kernel}));
        const Tensor<float> bias = dl::uniform<float>({5}, -1, 1, ctx);
        const auto q = dl::affine_quantization::covering(-1.0f, 2.0f);
        const Tensor<float> got = dl::quantized_conv2d(x, w, g.kernel, bias, q, g.options);
        const Tensor<float> expected = quantized_conv_reference(x, *w, g.kernel, bias, q, g.options);
        CHECK(got.shape() == expected.shape());
        CHECK(dl_test::same_elements(got, expected, 1e-4));
        // And, inside the calibrated range, close to the float convolution it stands for (errors of half a
        // step in x and w over C·k·k terms).
        const Tensor<float> inside = dl::uniform<float>({2, g.channels, 7, 6}, -1, 2, ctx);
        CHECK(dl_test::same_elements(dl::quantized_conv2d(inside, w, g.kernel, bias, q, g.options),
                                     dl::conv2d(inside, weight, bias, g.options),
                                     0.05 * std::sqrt(double(g.channels * g.kernel * g.kernel))));
    }
    const auto w = std::make_shared<const dl::int8_weight>(dl::zeros<float>({2, 9}, ctx));
    const auto q = dl::affine_quantization::covering(0, 1);
    CHECK_THROWS_WITH_AS((void)dl::quantized_conv2d(dl::zeros<float>({1, 2, 5, 5}, ctx), w, 3, {}, q),
                         doctest::Contains("a weight of 9 inputs per output channel"), dl::error);
    CHECK_THROWS_WITH_AS((void)dl::quantized_conv2d(dl::zeros<float>({1, 1, 5, 5}, ctx), w, 3, {}, q, {.groups = 2}),
                         doctest::Contains("groups must be 1"), dl::error);
    CHECK_THROWS_WITH_AS((void)dl::quantized_conv2d(dl::zeros<float>({1, 1, 2, 2}, ctx), w, 3, {}, q),
                         doctest::Contains("does not fit"), dl::error);
}

TEST_CASE("graph passes: int8 quantization of the Fashion-MNIST CNN quantizes its convolutions and linears") {
    dl::Context ctx({.seed = 13, .threads = 2});
    dl::nn::sequential model{dl::nn::conv2d<float>(1, 4, 3, {.padding = 1}, true, ctx), dl::nn::relu{},
                             dl::nn::max_pool2d({.kernel = 2}), dl::nn::conv2d<float>(4, 6, 3, {.padding = 1}, true, ctx),
                             dl::nn::relu{}, dl::nn::max_pool2d({.kernel = 2}), dl::nn::flatten{},
                             dl::nn::linear<float>(6 * 2 * 2, 3, true, ctx)};
    const Tensor<float> example = dl::uniform<float>({4, 1, 8, 8}, 0, 1, ctx);
    auto f = graph::trace([&](const Tensor<float>& x) { return model(x); }, example);
    std::vector<std::vector<any_tensor>> calibration{{dl::uniform<float>({16, 1, 8, 8}, 0, 1, ctx)}};
    const Tensor<float> test = dl::uniform<float>({10, 1, 8, 8}, 0, 1, ctx);
    const Tensor<float> expected = f(test);
    graph::pass_manager passes = graph::default_passes();
    passes.add(graph::quantize_int8(calibration));
    f.optimize(passes);
    const std::string text = f.to_string();
    CAPTURE(text);
    CHECK(count_ops(f.graph(), "quantized_conv2d") == 2);
    CHECK(count_ops(f.graph(), "quantized_linear") == 1);
    CHECK(count_ops(f.graph(), "conv2d") == 0);
    CHECK(dl_test::same_elements(f(test), expected, 0.05));
}

TEST_CASE("graph passes: int8 quantization refuses missing or mismatched calibration") {
    dl::Context ctx({.seed = 7, .threads = 1});
    const Tensor<float> w = dl::uniform<float>({3, 4}, -1, 1, ctx);
    const Tensor<float> example = dl::uniform<float>({2, 4}, -1, 1, ctx);
    auto make = [&] { return graph::trace([&](const Tensor<float>& x) { return dl::linear(x, w); }, example); };
    auto f = make();
    CHECK_THROWS_WITH_AS(f.optimize(just(graph::quantize_int8({}))), doctest::Contains("at least one calibration batch"),
                         dl::error);
    auto g = make();
    CHECK_THROWS_WITH_AS(g.optimize(just(graph::quantize_int8({{example, example}}))),
                         doctest::Contains("has 2 tensors for a graph of 1 inputs"), dl::error);
    auto h = make();
    CHECK_THROWS_WITH_AS(h.optimize(just(graph::quantize_int8({{dl::zeros<double>({2, 4}, ctx)}}))),
                         doctest::Contains("is not float32[N, 4]"), dl::error);
    Tensor<float> nan = example.clone();
    nan.at(0, 0) = NAN;
    auto k = make();
    CHECK_THROWS_WITH_AS(k.optimize(just(graph::quantize_int8({{nan}}))), doctest::Contains("only finite ranges quantize"),
                         dl::error);
    // The linear reads the graph input itself: its calibration fetch is the feed.
    auto ok = make();
    ok.optimize(just(graph::quantize_int8({{example}})));
    CHECK(count_ops(ok.graph(), "quantized_linear") == 1);
    CHECK(dl_test::same_elements(ok(example), dl::linear(example, w), 0.05));
}

TEST_CASE("graph passes: batch_norm folds into the conv2d before it, with or without a conv bias") {
    dl::Context ctx({.seed = 8, .threads = 1});
    const Tensor<float> x = dl::uniform<float>({2, 3, 9, 9}, -1, 1, ctx);
    auto param = [&](dl::Shape s, float lo, float hi) { return dl::uniform<float>(s, lo, hi, ctx).requires_grad_(); };
    const Tensor<float> w1 = param({4, 3, 3, 3}, -0.5f, 0.5f), b1 = param({4}, -0.5f, 0.5f);
    const Tensor<float> w2 = param({6, 4, 3, 3}, -0.5f, 0.5f);
    const Tensor<float> mean1 = dl::uniform<float>({4}, -0.5f, 0.5f, ctx), var1 = dl::uniform<float>({4}, 0.5f, 2, ctx);
    const Tensor<float> mean2 = dl::uniform<float>({6}, -0.5f, 0.5f, ctx), var2 = dl::uniform<float>({6}, 0.5f, 2, ctx);
    const Tensor<float> gamma = param({4}, 0.5f, 1.5f), beta = param({4}, -0.5f, 0.5f);
    auto model = [&](const Tensor<float>& in) {
        const Tensor<float> a = dl::relu(dl::batch_norm(dl::conv2d(in, w1, b1, {.padding = 1}), mean1, var1, gamma, beta, false));
        // No conv bias, no affine batch_norm parameters (three inputs), stride 2.
        return dl::batch_norm(dl::conv2d(a, w2, {}, {.stride = 2}), mean2, var2, {}, {}, false, 0.1, 1e-3);
    };
    auto f = graph::trace(model, x);
    REQUIRE(count_ops(f.graph(), "batch_norm") == 2);
    f.optimize(graph::inference_passes());
    const std::string text = f.to_string();
    CAPTURE(text);
    CHECK(count_ops(f.graph(), "batch_norm") == 0);
    CHECK(count_ops(f.graph(), "conv2d") == 2);
    CHECK(count_ops(f.graph(), "relu") == 0);  // the relu went into the folded conv's epilogue
    CHECK(text.find("parameter") == std::string::npos);  // every parameter was folded into constants
    dl::no_grad off(ctx);
    const Tensor<float> other = dl::uniform<float>({5, 3, 9, 9}, -1, 1, ctx);
    CHECK(dl_test::same_elements(f(other), model(other), 1e-5));
}

TEST_CASE("graph passes: batch_norm is not folded in training, or when something else reads the conv") {
    dl::Context ctx({.seed = 9, .threads = 1});
    const Tensor<float> x = dl::uniform<float>({2, 2, 5, 5}, -1, 1, ctx);
    const Tensor<float> w = dl::uniform<float>({3, 2, 3, 3}, -1, 1, ctx);
    const Tensor<float> mean = dl::zeros<float>({3}, ctx), var = dl::ones<float>({3}, ctx);
    auto training = graph::trace([&](const Tensor<float>& in) { return dl::batch_norm(dl::conv2d(in, w), mean, var, {}, {}, true); }, x);
    training.optimize(just(graph::fold_batch_norm()));
    CHECK(count_ops(training.graph(), "batch_norm") == 1);
    auto shared = graph::trace(
        [&](const Tensor<float>& in) {
            const Tensor<float> c = dl::conv2d(in, w);
            return Tensor<float>(dl::batch_norm(c, mean, var, {}, {}, false) + c);
        },
        x);
    const Tensor<float> before = shared(x);
    shared.optimize(just(graph::fold_batch_norm()));
    CHECK(count_ops(shared.graph(), "batch_norm") == 1);
    CHECK(dl_test::same_elements(shared(x), before, 0));
}

TEST_CASE("graph passes: magnitude pruning zeroes the smallest weights of each product, and fine-tuning keeps them zero") {
    dl::Context ctx({.seed = 10, .threads = 1});
    dl::nn::sequential model{dl::nn::linear<float>(12, 10, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(10, 3, true, ctx)};
    const Tensor<float> w1 = model.get<0>().weight.clone();  // the weights before pruning
    const Tensor<float> x = dl::uniform<float>({6, 12}, -1, 1, ctx);
    auto f = graph::trace([&](const Tensor<float>& in) { return model(in); }, x);
    graph::pruning pruned;
    f.optimize(just(graph::prune_magnitude(0.4, pruned)));
    CHECK(pruned.weights() == 2);
    CHECK(pruned.zeroed() == 48 + 12);  // round(0.4 · 120) + round(0.4 · 30)
    CHECK(pruned.elements() == 150);
    // Exactly the 48 smallest magnitudes of the first weight are zero now; the rest are untouched.
    std::vector<float> magnitudes;
    for (std::int64_t i = 0; i < w1.numel(); ++i) magnitudes.push_back(std::abs(w1.data()[i]));
    std::sort(magnitudes.begin(), magnitudes.end());
    const Tensor<float>& w = model.get<0>().weight;
    int zeros = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
        if (w.data()[i] == 0) {
            ++zeros;
            CHECK(std::abs(w1.data()[i]) <= magnitudes[47]);
        } else {
            CHECK(w.data()[i] == w1.data()[i]);
        }
    }
    CHECK(zeros == 48);
    {
        dl::no_grad off(ctx);
        CHECK(dl_test::same_elements(f(x), model(x), 1e-6));  // the graph reads the pruned parameters
    }
    // Fine-tuning: the optimizer moves pruned weights; the after-step hook zeroes them again.
    dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 1e-2});
    const Tensor<std::int64_t> y = dl::full<std::int64_t>({6}, 1, ctx);
    for (int step = 0; step < 3; ++step) {
        auto loss = dl::nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        pruned.reapply();
    }
    int still_zero = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) still_zero += w.data()[i] == 0;
    CHECK(still_zero == 48);
    CHECK_FALSE(dl_test::same_elements(w, w1, 0));  // and the rest did train
    CHECK_THROWS_WITH_AS((void)graph::prune_magnitude(1.5, pruned), doctest::Contains("amount must be in [0, 1]"), dl::error);
}

TEST_CASE("graph passes: channel pruning zeroes whole output channels with the smallest norms") {
    dl::Context ctx({.seed = 11, .threads = 1});
    const Tensor<float> x = dl::uniform<float>({2, 2, 6, 6}, -1, 1, ctx);
    Tensor<float> w = dl::uniform<float>({4, 2, 3, 3}, -1, 1, ctx).requires_grad_();
    Tensor<float> b = dl::uniform<float>({4}, 0.5f, 1, ctx).requires_grad_();
    {
        dl::no_grad off(ctx);
        for (std::int64_t i = 0; i < 18; ++i) w.data()[2 * 18 + i] *= 0.01f;  // channel 2: the smallest norm
    }
    auto f = graph::trace([&](const Tensor<float>& in) { return dl::relu(dl::conv2d(in, w, b)); }, x);
    graph::pruning pruned;
    f.optimize(just(graph::prune_channels(0.25, pruned)));
    CHECK(pruned.zeroed() == 18 + 1);  // one channel of the weight, and its bias
    for (std::int64_t c = 0; c < 4; ++c) {
        bool all_zero = true;
        for (std::int64_t i = 0; i < 18; ++i) all_zero = all_zero && w.data()[c * 18 + i] == 0;
        CHECK(all_zero == (c == 2));
        CHECK((b.data()[c] == 0) == (c == 2));
    }
    const Tensor<float> out = f(x);
    for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t i = 0; i < 4; ++i)
            for (std::int64_t j = 0; j < 4; ++j) CHECK(out.at(n, 2, i, j) == 0);
}
