// Convolution, normalization, embedding, recurrent and attention layers: values against scalar
// references, gradients of the input and of every parameter against finite differences, modes and
// bad input.
#include "support.hpp"

namespace {

using dl::Tensor;

dl::Context& ctx() {
    static dl::Context c({.seed = 17, .threads = 2});
    return c;
}
Tensor<double> randn(const dl::Shape& s, double scale = 1) { return dl::normal<double>(s, 0, scale, ctx()); }
double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

/// gradcheck of run(x) with respect to x, then to each parameter of `layer` in turn (the parameter is
/// swapped for gradcheck's copy while it runs).
template <class L, class Run>
void check_layer_gradients(L& layer, Run run, const Tensor<double>& x) {
    CHECK_GRAD([&](const auto& in) { return run(in); }, x);
    std::vector<std::pair<std::string, Tensor<double>*>> params;
    layer.for_each_parameter([&](std::string_view name, Tensor<double>& t) { params.emplace_back(name, &t); });
    REQUIRE(!params.empty());
    for (auto& [name, p] : params) {
        CAPTURE(name);
        const Tensor<double> original = *p;
        CHECK_GRAD([&](const auto& in, const auto& w) {
            *p = w;
            return run(in);
        }, x, original.detach());
        *p = original;
    }
}

}  // namespace

TEST_CASE("conv2d layer: shapes, PyTorch's initial range, gradients, the layer named in errors") {
    dl::nn::conv2d<double> conv(3, 4, 3, {.padding = 1}, true, ctx());
    CHECK(conv.weight.shape() == dl::Shape{4, 3, 3, 3});
    for (double w : dl_test::to_vector(conv.weight)) CHECK(std::abs(w) <= 1 / std::sqrt(27.0));
    const auto x = randn({2, 3, 4, 4});
    CHECK(conv(x).shape() == dl::Shape{2, 4, 4, 4});
    check_layer_gradients(conv, [&](const Tensor<double>& in) { return conv(in); }, x);
    const auto msg = dl_test::error_message([&] { (void)conv(randn({2, 2, 4, 4})); });
    CHECK(msg.find("conv2d") != std::string::npos);
    CHECK(msg.find("[N, 3, H, W]") != std::string::npos);
    CHECK(msg.find("[2, 2, 4, 4]") != std::string::npos);
    CHECK(dl_test::error_message([] { dl::nn::conv2d<float> bad(3, 4, 3, {.groups = 2}); }).find("groups") !=
          std::string::npos);
}

TEST_CASE("a small CNN as a flat sequential trains: loss falls on a fixed batch") {
    dl::Context c({.seed = 1, .threads = 2});
    dl::nn::sequential model{dl::nn::conv2d<float>(1, 4, 3, {.padding = 1}, true, c),
                             dl::nn::batch_norm<float>(4, {}, c),
                             dl::nn::relu{},
                             dl::nn::max_pool2d({.kernel = 2}),
                             dl::nn::adaptive_avg_pool2d(2),
                             dl::nn::flatten{},
                             dl::nn::linear<float>(16, 3, true, c)};
    const auto x = dl::normal<float>({8, 1, 8, 8}, 0, 1, c);
    const auto labels = dl::tensor<std::int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, c);
    dl::nn::adam<float> opt(dl::nn::parameters(model), {.lr = 0.05});
    float first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
        opt.zero_grad();
        auto loss = dl::nn::cross_entropy(model(x), labels);
        loss.backward();
        opt.step();
        (step == 0 ? first : last) = loss.item();
    }
    CHECK(last < first * 0.5f);
    model.train(false);  // evaluation uses the running statistics: same batch, finite output
    for (float v : dl_test::to_vector(model(x))) CHECK(std::isfinite(v));
}

TEST_CASE("batch_norm layer: batch statistics in training, running ones in evaluation") {
    dl::nn::batch_norm<double> bn(3, {.momentum = 0.5}, ctx());
    const Tensor<double> x = randn({6, 3, 2, 2}, 2) + 1.0;
    const auto y = bn(x);
    // Training output has zero mean and unit (biased) variance per channel.
    const auto m = dl::mean(y, {0, 2, 3}), v = dl::var(y, {0, 2, 3}, false, 0);
    for (std::int64_t c = 0; c < 3; ++c) {
        CHECK(m(c) == doctest::Approx(0).epsilon(1e-9).scale(1));
        CHECK(v(c) == doctest::Approx(1).epsilon(1e-4));
        CHECK(bn.running_mean(c) == doctest::Approx(0.5 * dl::mean(x, {0, 2, 3})(c)));
    }
    bn.train(false);
    const auto e = bn(x);
    for (std::int64_t c = 0; c < 3; ++c)
        CHECK(e(0, c, 0, 0) == doctest::Approx((x(0, c, 0, 0) - bn.running_mean(c)) / std::sqrt(bn.running_var(c) + 1e-5)));
    check_layer_gradients(bn, [&](const Tensor<double>& in) { return bn(in); }, x);
    bn.train(true);
    check_layer_gradients(bn, [&](const Tensor<double>& in) { return bn(in); }, randn({5, 3}));  // BatchNorm1d
    int buffers = 0;
    bn.for_each_buffer([&](std::string_view, Tensor<double>&) { ++buffers; });
    CHECK(buffers == 2);
    CHECK(dl_test::error_message([&] { (void)bn(randn({2, 4})); }).find("[N, 3]") != std::string::npos);
}

TEST_CASE("layer_norm layer over the trailing dimensions") {
    dl::nn::layer_norm<double> ln({4}, 1e-5, true, ctx());
    const auto x = randn({2, 3, 4});
    check_layer_gradients(ln, [&](const Tensor<double>& in) { return ln(in); }, x);
    const auto y = ln(x);
    CHECK(dl::mean(y, {-1})(1, 2) == doctest::Approx(0).scale(1));
    CHECK(dl_test::error_message([&] { (void)ln(randn({2, 5})); }).find("[..., [4]]") != std::string::npos);
}

TEST_CASE("embedding and embedding_bag layers look up rows; gradients only in the rows used") {
    dl::nn::embedding<double> emb(10, 3, ctx());
    const auto ids = dl::tensor<std::int64_t>({{1, 7}, {7, 0}});
    const auto e = emb(ids);
    CHECK(e.shape() == dl::Shape{2, 2, 3});
    CHECK(e(1, 0, 2) == emb.weight(7, 2));
    dl::sum(e * e).backward();
    CHECK(emb.weight.grad()(7, 1) == doctest::Approx(4 * emb.weight(7, 1)));  // used twice
    CHECK(emb.weight.grad()(5, 1) == 0);
    CHECK(dl_test::error_message([&] { (void)emb(dl::tensor<std::int64_t>({10})); }).find("index 10") != std::string::npos);

    dl::nn::embedding_bag<double> bag(10, 3, dl::bag_mode::sum, ctx());
    const auto out = bag(dl::tensor<std::int64_t>({1, 2, 3}), dl::tensor<std::int64_t>({0, 1}));
    CHECK(out(1, 0) == doctest::Approx(bag.weight(2, 0) + bag.weight(3, 0)));
}

TEST_CASE("lstm and gru against scalar recurrences, with gradients of every parameter") {
    const std::int64_t n = 2, steps = 3, in = 2, hid = 3;
    const auto x = randn({n, steps, in});
    dl::nn::lstm<double> lstm(in, hid, ctx());
    auto& p = lstm.parameters();
    const auto out = lstm(x);
    CHECK(out.output.shape() == dl::Shape{n, steps, hid});
    for (std::int64_t b = 0; b < n; ++b) {
        std::vector<double> h(hid, 0), c(hid, 0);
        for (std::int64_t t = 0; t < steps; ++t) {
            std::vector<double> gates(4 * hid);
            for (std::int64_t r = 0; r < 4 * hid; ++r) {
                double s = p.bias_ih(r) + p.bias_hh(r);
                for (std::int64_t k = 0; k < in; ++k) s += p.weight_ih(r, k) * x(b, t, k);
                for (std::int64_t k = 0; k < hid; ++k) s += p.weight_hh(r, k) * h[k];
                gates[r] = s;
            }
            for (std::int64_t k = 0; k < hid; ++k) {
                c[k] = sigmoid(gates[hid + k]) * c[k] + sigmoid(gates[k]) * std::tanh(gates[2 * hid + k]);
                h[k] = sigmoid(gates[3 * hid + k]) * std::tanh(c[k]);
                CHECK(out.output(b, t, k) == doctest::Approx(h[k]));
            }
        }
        for (std::int64_t k = 0; k < hid; ++k) CHECK(out.c(b, k) == doctest::Approx(c[k]));
    }
    check_layer_gradients(lstm, [&](const Tensor<double>& v) { return lstm(v).output; }, x);

    dl::nn::gru<double> gru(in, hid, ctx());
    auto& q = gru.parameters();
    const auto h0 = randn({n, hid});
    const auto g = gru(x, h0);
    for (std::int64_t b = 0; b < n; ++b) {
        std::vector<double> h(hid);
        for (std::int64_t k = 0; k < hid; ++k) h[k] = h0(b, k);
        for (std::int64_t t = 0; t < steps; ++t) {
            std::vector<double> gi(3 * hid), gh(3 * hid);
            for (std::int64_t r = 0; r < 3 * hid; ++r) {
                gi[r] = q.bias_ih(r), gh[r] = q.bias_hh(r);
                for (std::int64_t k = 0; k < in; ++k) gi[r] += q.weight_ih(r, k) * x(b, t, k);
                for (std::int64_t k = 0; k < hid; ++k) gh[r] += q.weight_hh(r, k) * h[k];
            }
            std::vector<double> next(hid);
            for (std::int64_t k = 0; k < hid; ++k) {
                const double rr = sigmoid(gi[k] + gh[k]), z = sigmoid(gi[hid + k] + gh[hid + k]);
                const double nn = std::tanh(gi[2 * hid + k] + rr * gh[2 * hid + k]);
                next[k] = (1 - z) * nn + z * h[k];
                CHECK(g.output(b, t, k) == doctest::Approx(next[k]));
            }
            h = next;
        }
    }
    check_layer_gradients(gru, [&](const Tensor<double>& v) { return gru(v, h0).output; }, x);
    CHECK(dl_test::error_message([&] { (void)gru(randn({2, 3, 4})); }).find("[N, L, 2]") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)gru(x, randn({2, 2})); }).find("state [2, 3]") != std::string::npos);
}

TEST_CASE("multi-head attention against a scalar reference, causal mask, gradients") {
    const std::int64_t n = 2, l = 3, e = 4, heads = 2, d = e / heads;
    dl::nn::multihead_attention<double> mha(e, heads, ctx());
    dl::nn::init::normal_(mha.in_proj_bias, 0, 0.5);
    const auto q = randn({n, l, e}), kv = randn({n, l, e});
    for (bool causal : {false, true}) {
        CAPTURE(causal);
        const auto y = mha(q, kv, kv, causal);
        // Reference: project, attend per head with plain loops, merge, project out.
        auto project = [&](const Tensor<double>& x, std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t j) {
            double s = mha.in_proj_bias(part * e + j);
            for (std::int64_t k = 0; k < e; ++k) s += mha.in_proj_weight(part * e + j, k) * x(b, t, k);
            return s;
        };
        for (std::int64_t b = 0; b < n; ++b)
            for (std::int64_t t = 0; t < l; ++t) {
                std::vector<double> merged(e);
                for (std::int64_t h = 0; h < heads; ++h) {
                    std::vector<double> w(l);
                    double top = -1e300, total = 0;
                    for (std::int64_t s = 0; s < l; ++s) {
                        double dot = 0;
                        for (std::int64_t j = 0; j < d; ++j) dot += project(q, b, t, 0, h * d + j) * project(kv, b, s, 1, h * d + j);
                        w[s] = causal && s > t ? -1e300 : dot / std::sqrt(double(d));
                        top = std::max(top, w[s]);
                    }
                    for (auto& v : w) total += v = std::exp(v - top);
                    for (std::int64_t j = 0; j < d; ++j)
                        for (std::int64_t s = 0; s < l; ++s) merged[h * d + j] += w[s] / total * project(kv, b, s, 2, h * d + j);
                }
                for (std::int64_t o = 0; o < e; ++o) {
                    double s = mha.out_proj.bias(o);
                    for (std::int64_t k = 0; k < e; ++k) s += mha.out_proj.weight(o, k) * merged[k];
                    CHECK(y(b, t, o) == doctest::Approx(s));
                }
            }
        check_layer_gradients(mha, [&](const Tensor<double>& x) { return mha(x, kv, x, causal); }, q);
    }
    CHECK(dl_test::error_message([&] { (void)mha(q, kv, randn({n, 2, e})); }).find("one shape") != std::string::npos);
    CHECK(dl_test::error_message([] { dl::nn::multihead_attention<float> bad(6, 4); }).find("multiple") != std::string::npos);
}
