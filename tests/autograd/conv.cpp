// conv2d, pooling and normalization: values against direct scalar loops, gradients against finite
// differences, edge cases (padding, dilation, groups, strided inputs, NaN) and bad shapes.
#include "support.hpp"

#include <string_view>

namespace {

using dl::Tensor;

dl::Context& ctx() {
    static dl::Context c({.seed = 3, .threads = 2});
    return c;
}
Tensor<double> randn(const dl::Shape& s) { return dl::normal<double>(s, 0, 1, ctx()); }

/// The definition of a (cross-correlation) convolution, one output element at a time.
Tensor<double> conv_reference(const Tensor<double>& x, const Tensor<double>& w, const Tensor<double>& b,
                              const dl::conv2d_options& o) {
    const std::int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
    const std::int64_t oc = w.shape()[0], cg = w.shape()[1], kh = w.shape()[2], kw = w.shape()[3];
    const std::int64_t oh = (h + 2 * o.padding.h - o.dilation.h * (kh - 1) - 1) / o.stride.h + 1;
    const std::int64_t ow = (wd + 2 * o.padding.w - o.dilation.w * (kw - 1) - 1) / o.stride.w + 1;
    Tensor<double> out({n, oc, oh, ow});
    const std::int64_t og = oc / o.groups;
    (void)c;
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t f = 0; f < oc; ++f)
            for (std::int64_t y = 0; y < oh; ++y)
                for (std::int64_t z = 0; z < ow; ++z) {
                    double s = b.defined() ? b(f) : 0;
                    for (std::int64_t ch = 0; ch < cg; ++ch)
                        for (std::int64_t p = 0; p < kh; ++p)
                            for (std::int64_t q = 0; q < kw; ++q) {
                                const std::int64_t iy = y * o.stride.h - o.padding.h + p * o.dilation.h;
                                const std::int64_t ix = z * o.stride.w - o.padding.w + q * o.dilation.w;
                                if (iy >= 0 && iy < h && ix >= 0 && ix < wd)
                                    s += x(i, (f / og) * cg + ch, iy, ix) * w(f, ch, p, q);
                            }
                    out(i, f, y, z) = s;
                }
    return out;
}

}  // namespace

TEST_CASE("conv2d matches the direct definition: stride, padding, dilation, groups, strided input") {
    struct case_t {
        dl::Shape x, w;
        dl::conv2d_options o;
    };
    const case_t cases[] = {
        {{2, 3, 6, 5}, {4, 3, 3, 3}, {}},
        {{1, 2, 7, 7}, {3, 2, 3, 2}, {.stride = {2, 1}, .padding = {1, 0}}},
        {{2, 4, 6, 6}, {6, 2, 3, 3}, {.padding = 2, .dilation = 2, .groups = 2}},
        {{1, 3, 1, 1}, {2, 3, 1, 1}, {}},
        {{1, 1, 5, 5}, {1, 1, 5, 5}, {.padding = 1}},
        {{1, 4, 5, 4}, {4, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 4}},  // depthwise
        // "Same" padding at stride 1: im2col/col2im's flat path (one shifted copy per kernel tap).
        {{3, 3, 6, 5}, {4, 3, 3, 3}, {.padding = 1}},
        {{1, 2, 5, 7}, {3, 2, 3, 5}, {.padding = {1, 2}}},
        {{2, 1, 1, 4}, {2, 1, 1, 3}, {.padding = {0, 1}}},
    };
    for (const auto& c : cases) {
        CAPTURE(c.x);
        CAPTURE(c.w);
        const auto x = randn(c.x), w = randn(c.w), b = randn({c.w[0]});
        CHECK(dl_test::same_elements(dl::conv2d(x, w, b, c.o), conv_reference(x, w, b, c.o), 1e-12));
        CHECK(dl_test::same_elements(dl::conv2d(x, w, {}, c.o), conv_reference(x, w, {}, c.o), 1e-12));
        CHECK_GRAD([&](const auto& a, const auto& k, const auto& bb) { return dl::conv2d(a, k, bb, c.o); }, x, w, b);
    }
    // A channels-last view of the input (non-contiguous NCHW), in float.
    const auto nhwc = dl::normal<float>({2, 5, 5, 3}, 0, 1, ctx());
    const auto x = nhwc.permute({0, 3, 1, 2});
    const auto w = dl::normal<float>({2, 3, 3, 3}, 0, 1, ctx());
    const auto y = dl::conv2d(x, w, {}, {.padding = 1});
    const auto ref = conv_reference(dl::cast<double>(x), dl::cast<double>(w), {}, {.padding = 1});
    CHECK(dl_test::same_elements(y, ref, 1e-4));
    CHECK_GRAD([](const auto& a, const auto& k) { return dl::conv2d(a.permute({0, 3, 1, 2}), k); },
               randn({1, 4, 4, 2}), randn({2, 2, 2, 2}));
}

TEST_CASE("conv2d applies an activation in its epilogue, forward and backward") {
    const auto x = randn({2, 3, 5, 4}), w = randn({4, 3, 3, 3}), b = randn({4});
    const dl::conv2d_options plain{.padding = 1};
    const auto reference = conv_reference(x, w, b, plain);
    for (auto act : {dl::activation::relu, dl::activation::sigmoid, dl::activation::tanh, dl::activation::gelu}) {
        CAPTURE(static_cast<int>(act));
        dl::conv2d_options o = plain;
        o.act = act;
        dl::Tensor<double> expected;  // null: each assignment below allocates (a handle of reference would be written into)
        switch (act) {
            case dl::activation::relu: expected = dl::relu(reference); break;
            case dl::activation::sigmoid: expected = dl::sigmoid(reference); break;
            case dl::activation::tanh: expected = dl::tanh(reference); break;
            default: expected = dl::gelu(reference); break;
        }
        CHECK(dl_test::same_elements(dl::conv2d(x, w, b, o), expected, 1e-12));
        CHECK_GRAD([&](const auto& a, const auto& k, const auto& bb) { return dl::conv2d(a, k, bb, o); }, x, w, b);
    }
}

/// Float results against a double reference: NaN exactly where the reference has NaN, the same
/// infinities, and finite values within `tolerance`.
bool close_to(const Tensor<float>& got, const Tensor<double>& want, double tolerance) {
    if (got.shape() != want.shape()) return false;
    const auto a = dl_test::to_vector(got);
    const auto b = dl_test::to_vector(want);
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double x = a[i], y = b[i];
        if (std::isnan(y) ? !std::isnan(x) : std::isinf(y) ? x != y : !(std::abs(x - y) <= tolerance)) return false;
    }
    return true;
}

TEST_CASE("conv2d by Winograd F(2x2, 3x3) matches the definition, forward and backward, NaN and Inf included") {
    struct case_t {
        dl::Shape x;
        std::int64_t outs;
        dl::extent2 padding;
    };
    const case_t cases[] = {
        {{2, 16, 13, 13}, 24, 1},  // odd extents: the last tile row and column are clipped
        {{1, 17, 8, 6}, 16, 0},    // the input gradient runs at padding 2
        {{3, 16, 5, 9}, 19, 2},    // ... and at padding 0
        {{1, 16, 1, 1}, 16, 1},    // one output
        {{2, 20, 12, 3}, 16, {1, 2}},
        {{4, 16, 14, 14}, 32, 1},  // several blocks of tiles, the last one short
        {{2, 16, 9, 25}, 16, 1},   // rows of 13 tiles: loaded 7 at a time, split where panels of 32 end
    };
    for (const auto& c : cases) {
        CAPTURE(c.x);
        CAPTURE(c.outs);
        const std::int64_t channels = c.x[1];
        const dl::conv2d_options o{.padding = c.padding};
        const dl::autograd::detail::window_geometry geo{
            channels, c.x[2], c.x[3], 3, 3, c.x[2] + 2 * c.padding.h - 2, c.x[3] + 2 * c.padding.w - 2, 1, c.padding, 1};
        REQUIRE(dl::autograd::detail::winograd_applies<float>(geo, 1, channels, c.outs));
        Tensor<float> x = dl::normal<float>(c.x, 0, 1, ctx()), w = dl::normal<float>({c.outs, channels, 3, 3}, 0, 0.2, ctx()),
                      b = dl::normal<float>({c.outs}, 0, 1, ctx());
        const Tensor<double> xd = dl::cast<double>(x), wd = dl::cast<double>(w), bd = dl::cast<double>(b);
        const Tensor<double> reference = conv_reference(xd, wd, bd, o);
        // Sums of 9·C products of magnitude ~0.2: float rounding stays far below 1e-4.
        CHECK(close_to(dl::conv2d(x, w, b, o), reference, 1e-4));
        dl::conv2d_options with_relu = o;
        with_relu.act = dl::activation::relu;
        CHECK(close_to(dl::conv2d(x, w, b, with_relu), dl::relu(reference), 1e-4));
        dl::conv2d_options with_tanh = o;
        with_tanh.act = dl::activation::tanh;
        CHECK(close_to(dl::conv2d(x, w, b, with_tanh), dl::tanh(reference), 1e-4));

        // Gradients against the double path (im2col), twice: the second backward adds to the first.
        const Tensor<float> g = dl::normal<float>(reference.shape(), 0, 1, ctx());
        x.requires_grad_();
        w.requires_grad_();
        b.requires_grad_();
        Tensor<double> xr = xd.detach().requires_grad_(), wr = wd.detach().requires_grad_(), br = bd.detach().requires_grad_();
        dl::conv2d(xr, wr, br, o).backward(dl::cast<double>(g));
        const double terms = double(g.numel()) / double(c.outs);  // per weight-gradient element
        for (int pass = 1; pass <= 2; ++pass) {
            CAPTURE(pass);
            dl::conv2d(x, w, b, o).backward(g);
            CHECK(close_to(x.grad(), xr.grad() * double(pass), 1e-4 * pass));
            CHECK(close_to(w.grad(), wr.grad() * double(pass), 1e-5 * terms * pass));
            CHECK(close_to(b.grad(), br.grad() * double(pass), 1e-5 * terms * pass));
        }

        // NaN and Inf in the input, then in the output gradient: each output (input gradient) is NaN
        // or infinite exactly where the definition's is, which the transforms alone would not give.
        if (x.numel() < 100) continue;
        Tensor<float> bad = x.detach().contiguous();
        bad.data()[7] = NAN;
        bad.data()[bad.numel() / 2] = INFINITY;
        bad.data()[bad.numel() - 20] = -INFINITY;
        CHECK(close_to(dl::conv2d(bad, w.detach(), b.detach(), o), conv_reference(dl::cast<double>(bad), wd, bd, o), 1e-4));
        Tensor<float> bad_g = g.detach().contiguous();
        bad_g.data()[3] = NAN;
        bad_g.data()[bad_g.numel() - 5] = INFINITY;
        Tensor<float> xf = x.detach().requires_grad_();
        Tensor<double> xdf = xd.detach().requires_grad_();
        dl::conv2d(xf, w.detach(), b.detach(), o).backward(bad_g);
        dl::conv2d(xdf, wd, bd, o).backward(dl::cast<double>(bad_g));
        CHECK(close_to(xf.grad(), xdf.grad(), 1e-4));
    }
}

TEST_CASE("conv2d by Winograd reads an input whose rows are not contiguous through its strides") {
    // A transposed view: the transform gathers each tile's taps instead of loading rows.
    Tensor<float> stored = dl::normal<float>({2, 16, 11, 13}, 0, 1, ctx());
    Tensor<float> x = stored.transpose(2, 3), w = dl::normal<float>({16, 16, 3, 3}, 0, 0.2, ctx()),
                  b = dl::normal<float>({16}, 0, 1, ctx());
    REQUIRE_FALSE(x.is_contiguous());
    const Tensor<double> xd = dl::cast<double>(x), wd = dl::cast<double>(w), bd = dl::cast<double>(b);
    CHECK(close_to(dl::conv2d(x, w, b, {.padding = 1}), conv_reference(xd, wd, bd, {.padding = 1}), 1e-4));
    w.requires_grad_();
    Tensor<double> wr = wd.detach().requires_grad_();
    const Tensor<float> g = dl::normal<float>({2, 16, 13, 11}, 0, 1, ctx());
    dl::conv2d(x, w, b, {.padding = 1}).backward(g);
    dl::conv2d(xd, wr, bd, {.padding = 1}).backward(dl::cast<double>(g));
    CHECK(close_to(w.grad(), wr.grad(), 1e-5 * 2 * 13 * 11));
}

TEST_CASE("conv2d by the direct kernels (windows of 9, 25 and 27 values) matches the definition, NaN and Inf included") {
    struct case_t {
        dl::Shape x;
        std::int64_t outs, kernel;
        dl::extent2 padding;
        bool transposed;  // x is a transposed view: its rows are not contiguous
    };
    const case_t cases[] = {
        {{3, 1, 28, 28}, 32, 3, 1, false},  // the Fashion-MNIST CNN's first layer: a row is 28 outputs
        {{2, 3, 17, 19}, 5, 3, {0, 2}, false},  // RGB, 27 values; padding only along rows
        {{2, 1, 20, 16}, 4, 5, 2, false},       // 5x5: rows of 16 outputs
        {{1, 3, 18, 20}, 7, 3, 0, true},
        {{9, 1, 5, 33}, 3, 3, {3, 0}, false},  // padding beyond the kernel: whole rows of outputs see only bias
    };
    for (const auto& c : cases) {
        CAPTURE(c.x);
        CAPTURE(c.kernel);
        const dl::conv2d_options o{.padding = c.padding};
        const std::int64_t channels = c.x[1], oh = c.x[2] + 2 * c.padding.h - c.kernel + 1,
                           ow = c.x[3] + 2 * c.padding.w - c.kernel + 1;
        const dl::autograd::detail::window_geometry geo{channels, c.x[2], c.x[3], c.kernel, c.kernel, oh, ow, 1,
                                                        c.padding, 1};
        REQUIRE(dl::autograd::detail::direct_conv_applies<float>(geo, 1, c.outs));
        Tensor<float> x = c.transposed ? dl::normal<float>({c.x[0], c.x[1], c.x[3], c.x[2]}, 0, 1, ctx()).transpose(2, 3)
                                       : dl::normal<float>(c.x, 0, 1, ctx());
        Tensor<float> w = dl::normal<float>({c.outs, channels, c.kernel, c.kernel}, 0, 0.2, ctx()),
                      b = dl::normal<float>({c.outs}, 0, 1, ctx());
        const Tensor<double> xd = dl::cast<double>(x), wd = dl::cast<double>(w), bd = dl::cast<double>(b);
        const Tensor<double> reference = conv_reference(xd, wd, bd, o);
        CHECK(close_to(dl::conv2d(x, w, b, o), reference, 1e-5));
        CHECK(close_to(dl::conv2d(x, w, {}, o), conv_reference(xd, wd, {}, o), 1e-5));
        dl::conv2d_options with_relu = o;
        with_relu.act = dl::activation::relu;
        CHECK(close_to(dl::conv2d(x, w, b, with_relu), dl::relu(reference), 1e-5));

        // The weight gradient (the input's, too, by im2col) against the double path, twice: the second
        // backward adds to the first.
        const Tensor<float> g = dl::normal<float>(reference.shape(), 0, 1, ctx());
        w.requires_grad_();
        b.requires_grad_();
        Tensor<double> wr = wd.detach().requires_grad_(), br = bd.detach().requires_grad_();
        dl::conv2d(xd, wr, br, o).backward(dl::cast<double>(g));
        const double terms = double(g.numel()) / double(c.outs);  // per weight-gradient element
        for (int pass = 1; pass <= 2; ++pass) {
            CAPTURE(pass);
            dl::conv2d(x, w, b, o).backward(g);
            CHECK(close_to(w.grad(), wr.grad() * double(pass), 1e-6 * terms * pass));
            CHECK(close_to(b.grad(), br.grad() * double(pass), 1e-6 * terms * pass));
        }

        // NaN and Inf in the input, then in the output gradient, land where the definition puts them.
        Tensor<float> bad = x.detach().clone();  // x is used again below
        bad.data()[7] = NAN;
        bad.data()[bad.numel() / 2] = INFINITY;
        bad.data()[bad.numel() - 20] = -INFINITY;
        CHECK(close_to(dl::conv2d(bad, w.detach(), b.detach(), o), conv_reference(dl::cast<double>(bad), wd, bd, o), 1e-5));
        Tensor<float> bad_g = g.detach().clone();
        bad_g.data()[3] = NAN;
        bad_g.data()[bad_g.numel() - 5] = INFINITY;
        Tensor<float> wf = w.detach().requires_grad_();
        Tensor<double> wdf = wd.detach().requires_grad_();
        dl::conv2d(x, wf, b.detach(), o).backward(bad_g);
        dl::conv2d(xd, wdf, bd, o).backward(dl::cast<double>(bad_g));
        CHECK(close_to(wf.grad(), wdf.grad(), 1e-6 * terms));
    }
    // Rows narrower than a vector, strides and groups stay on im2col.
    const dl::autograd::detail::window_geometry narrow{1, 4, 4, 3, 3, 4, 4, 1, 1, 1};
    CHECK(dl::autograd::detail::direct_conv_applies<float>(narrow, 1, 8) == (dl::simd::width<float> <= 4));
    const dl::autograd::detail::window_geometry strided{1, 28, 28, 3, 3, 14, 14, 2, 1, 1};
    CHECK_FALSE(dl::autograd::detail::direct_conv_applies<float>(strided, 1, 8));
    const dl::autograd::detail::window_geometry four_channels{4, 28, 28, 3, 3, 28, 28, 1, 1, 1};
    CHECK_FALSE(dl::autograd::detail::direct_conv_applies<float>(four_channels, 1, 8));
    const dl::autograd::detail::window_geometry first_layer{1, 28, 28, 3, 3, 28, 28, 1, 1, 1};
    CHECK(dl::autograd::detail::direct_conv_applies<float>(first_layer, 1, 8));
    CHECK_FALSE(dl::autograd::detail::direct_conv_applies<double>(first_layer, 1, 8));
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
    if (a.shape() != b.shape()) return false;
    const auto ac = a.contiguous(), bc = b.contiguous();
    for (std::int64_t k = 0; k < a.numel(); ++k)
        if (std::bit_cast<std::uint32_t>(ac.data()[k]) != std::bit_cast<std::uint32_t>(bc.data()[k])) return false;
    return true;
}

TEST_CASE("conv2d with max_pool pools 2x2 windows in the direct and Winograd epilogues, bit for bit the two ops") {
    struct case_t {
        dl::Shape x;
        std::int64_t outs, kernel;
        dl::extent2 padding;
    };
    const case_t cases[] = {
        {{3, 1, 28, 28}, 16, 3, 1},     // direct: a pooled row of 14, shorter than a vector
        {{2, 1, 19, 21}, 4, 3, 1},      // direct: odd output sizes, the last row and column dropped
        {{2, 3, 17, 35}, 5, 3, {0, 2}}, // direct, 27 taps: pooled rows of 18, a whole vector and a part
        {{1, 1, 20, 36}, 4, 5, 2},      // direct, 25 taps
        {{2, 16, 13, 15}, 24, 3, 1},    // Winograd: odd output sizes, clipped tiles dropped
        {{4, 16, 14, 14}, 32, 3, 1},    // Winograd: the Fashion-MNIST CNN's second layer
        {{1, 16, 9, 25}, 16, 3, 1},     // Winograd: runs of 13 tiles cut into pieces
        {{2, 20, 12, 6}, 16, 3, {1, 2}},
    };
    for (const auto& c : cases) {
        CAPTURE(c.x);
        CAPTURE(c.outs);
        Tensor<float> x = dl::normal<float>(c.x, 0, 1, ctx());
        const Tensor<float> w = dl::normal<float>({c.outs, c.x[1], c.kernel, c.kernel}, 0, 0.3, ctx()),
                            b = dl::normal<float>({c.outs}, 0, 1, ctx());
        for (const dl::activation act : {dl::activation::none, dl::activation::relu, dl::activation::tanh}) {
            CAPTURE(static_cast<int>(act));
            const dl::conv2d_options o{.padding = c.padding, .act = act};
            dl::conv2d_options pooled = o;
            pooled.max_pool = 2;
            dl::prof::profiler profiler;
            ctx().set_profiler(&profiler);
            const Tensor<float> got = dl::conv2d(x, w, b, pooled), got_no_bias = dl::conv2d(x, w, {}, pooled);
            ctx().set_profiler(nullptr);
            CHECK(same_bits(got, dl::max_pool2d(dl::conv2d(x, w, b, o), {.kernel = 2})));
            CHECK(same_bits(got_no_bias, dl::max_pool2d(dl::conv2d(x, w, {}, o), {.kernel = 2})));
            // Pooled in the kernels' epilogue: no max_pool2d ran.
            for (const auto& e : profiler.events()) CHECK(std::string_view(e.name) != "max_pool2d");
        }
        // NaN and Inf: the direct kernels pool them as max_pool2d does (a NaN wins); Winograd, which
        // cannot tell which window held one, computes the definition and pools that.
        Tensor<float> bad = x.clone();
        bad.data()[5] = NAN;
        bad.data()[bad.numel() / 2] = INFINITY;
        bad.data()[bad.numel() - 9] = -INFINITY;
        const dl::conv2d_options o{.padding = c.padding, .act = dl::activation::relu};
        dl::conv2d_options pooled = o;
        pooled.max_pool = 2;
        CHECK(same_bits(dl::conv2d(bad, w, b, pooled), dl::max_pool2d(dl::conv2d(bad, w, b, o), {.kernel = 2})));
    }
}

TEST_CASE("conv2d with max_pool: other windows, doubles and gradients run the two ops; bad sizes are refused") {
    const Tensor<double> x = randn({2, 2, 9, 9}), w = randn({3, 2, 3, 3}), b = randn({3});
    CHECK(dl_test::same_elements(dl::conv2d(x, w, b, {.padding = 1, .max_pool = 3}),
                                 dl::max_pool2d(dl::conv2d(x, w, b, {.padding = 1}), {.kernel = 3})));
    CHECK(dl_test::same_elements(dl::conv2d(x, w, b, {.max_pool = 2}), dl::max_pool2d(dl::conv2d(x, w, b), {.kernel = 2})));
    // With gradients: max_pool2d's backward needs its winners, which only the two ops keep.
    Tensor<float> xf = dl::normal<float>({2, 1, 18, 18}, 0, 1, ctx()).requires_grad_();
    Tensor<float> xr = xf.detach().requires_grad_();
    const Tensor<float> wf = dl::normal<float>({4, 1, 3, 3}, 0, 0.3, ctx());
    dl::sum(dl::conv2d(xf, wf, {}, {.padding = 1, .act = dl::activation::relu, .max_pool = 2})).backward();
    dl::sum(dl::max_pool2d(dl::conv2d(xr, wf, {}, {.padding = 1, .act = dl::activation::relu}), {.kernel = 2})).backward();
    CHECK(same_bits(xf.grad(), xr.grad()));
    CHECK(dl_test::error_message([&] { (void)dl::conv2d(x, w, b, {.max_pool = -1}); }).find("max_pool") != std::string::npos);
}

TEST_CASE("conv2d rejects shapes that do not fit, naming them") {
    const auto x = randn({1, 3, 4, 4});
    CHECK(dl_test::error_message([&] { (void)dl::conv2d(x, randn({2, 2, 3, 3})); }).find("[1, 3, 4, 4]") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::conv2d(x, randn({2, 3, 5, 5})); }).find("does not fit") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::conv2d(randn({3, 4, 4}), randn({2, 3, 3, 3})); })
              .find("[N, C, H, W]") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::conv2d(x, randn({2, 3, 3, 3}), randn({3})); }).find("bias") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::conv2d(x, randn({2, 3, 3, 3}), {}, {.stride = 0}); })
              .find("stride") != std::string::npos);
}

TEST_CASE("max_pool2d and avg_pool2d against scalar windows, with gradients") {
    const auto x = randn({2, 3, 7, 6});
    const dl::pool2d_options settings[] = {
        {.kernel = 2}, {.kernel = 3, .stride = 2, .padding = 1}, {.kernel = {3, 2}, .stride = {1, 2}}, {.kernel = 1}};
    for (const auto& o : settings) {
        CAPTURE(o.kernel.h);
        const dl::extent2 s{o.stride.h ? o.stride.h : o.kernel.h, o.stride.w ? o.stride.w : o.kernel.w};
        const auto mx = dl::max_pool2d(x, o);
        for (bool include_pad : {true, false}) {
            auto oo = o;
            oo.count_include_pad = include_pad;
            const auto av = dl::avg_pool2d(x, oo);
            REQUIRE(av.shape() == mx.shape());
            bool same = true;
            dl_test::for_each_index(mx.shape(), [&](const std::int64_t* p) {
                double best = -1e300, total = 0;
                std::int64_t valid = 0;
                for (std::int64_t i = 0; i < o.kernel.h; ++i)
                    for (std::int64_t j = 0; j < o.kernel.w; ++j) {
                        const std::int64_t r = p[2] * s.h - o.padding.h + i, c = p[3] * s.w - o.padding.w + j;
                        if (r < 0 || r >= 7 || c < 0 || c >= 6) continue;
                        best = std::max(best, x(p[0], p[1], r, c));
                        total += x(p[0], p[1], r, c);
                        ++valid;
                    }
                const double divisor = include_pad ? double(o.kernel.h * o.kernel.w) : double(valid);
                same = same && mx(p[0], p[1], p[2], p[3]) == best &&
                       std::abs(av(p[0], p[1], p[2], p[3]) - total / divisor) < 1e-12;
            });
            CHECK(same);
            CHECK_GRAD([&](const auto& a) { return dl::avg_pool2d(a, oo); }, x);
        }
        CHECK_GRAD([&](const auto& a) { return dl::max_pool2d(a, o); }, x);
        CHECK_GRAD([&](const auto& a) { return dl::max_pool2d(a.transpose(2, 3), o); }, x);
    }
    // NaN wins its window, as in PyTorch; the gradient goes to it.
    Tensor<float> n = dl::tensor<float>({{{{1, NAN}, {3, 2}}}}).requires_grad_();
    const auto m = dl::max_pool2d(n, {.kernel = 2});
    CHECK(std::isnan(m(0, 0, 0, 0)));
    m.backward(dl::ones<float>({1, 1, 1, 1}));
    CHECK(n.grad()(0, 0, 0, 1) == 1);
    CHECK(n.grad()(0, 0, 1, 0) == 0);
    // Ties go to the first position in row-major window order, and so does the first of two NaNs.
    Tensor<float> ties = dl::tensor<float>({{{{5, 5, NAN, 1}, {5, 5, 2, NAN}}}}).requires_grad_();
    dl::max_pool2d(ties, {.kernel = 2}).backward(dl::ones<float>({1, 1, 1, 2}));
    CHECK(ties.grad()(0, 0, 0, 0) == 1);
    CHECK(ties.grad()(0, 0, 0, 2) == 1);
    CHECK(float(dl::sum(ties.grad()).item()) == 2);

    CHECK(dl_test::error_message([&] { (void)dl::max_pool2d(x, {.kernel = 2, .padding = 2}); }).find("half") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::avg_pool2d(x, {.kernel = 8}); }).find("does not fit") !=
          std::string::npos);
}

/// float pooling, forward and backward, by the definition: one window at a time, taps in row-major
/// order, sums in float; the backward adds each output's share into its window, outputs in order.
struct pool_reference {
    Tensor<float> max, avg, max_grad, avg_grad;
};
pool_reference pool_by_definition(const Tensor<float>& x, const Tensor<float>& g, const dl::pool2d_options& o) {
    const std::int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
    const std::int64_t sh = o.stride.h ? o.stride.h : o.kernel.h, sw = o.stride.w ? o.stride.w : o.kernel.w;
    const std::int64_t oh = g.shape()[2], ow = g.shape()[3];
    pool_reference r{Tensor<float>(g.shape()), Tensor<float>(g.shape()), dl::zeros<float>(x.shape()),
                     dl::zeros<float>(x.shape())};
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t ch = 0; ch < c; ++ch)
            for (std::int64_t y = 0; y < oh; ++y)
                for (std::int64_t z = 0; z < ow; ++z) {
                    const std::int64_t y0 = y * sh - o.padding.h, z0 = z * sw - o.padding.w;
                    const std::int64_t y1 = std::min(y0 + o.kernel.h, h + o.padding.h);
                    const std::int64_t z1 = std::min(z0 + o.kernel.w, w + o.padding.w);
                    float best = 0, total = 0;
                    std::int64_t by = -1, bz = -1, valid = 0;
                    for (std::int64_t p = std::max<std::int64_t>(y0, 0); p < std::min(y1, h); ++p)
                        for (std::int64_t q = std::max<std::int64_t>(z0, 0); q < std::min(z1, w); ++q) {
                            const float v = x(i, ch, p, q);
                            if (by < 0 || v > best || (std::isnan(v) && !std::isnan(best))) best = v, by = p, bz = q;
                            total += v;
                            ++valid;
                        }
                    const float divisor = o.count_include_pad ? float((y1 - y0) * (z1 - z0)) : float(valid);
                    r.max(i, ch, y, z) = best;
                    r.avg(i, ch, y, z) = total / divisor;
                    r.max_grad(i, ch, by, bz) += g(i, ch, y, z);
                    const float share = g(i, ch, y, z) / divisor;
                    for (std::int64_t p = std::max<std::int64_t>(y0, 0); p < std::min(y1, h); ++p)
                        for (std::int64_t q = std::max<std::int64_t>(z0, 0); q < std::min(z1, w); ++q)
                            r.avg_grad(i, ch, p, q) += share;
                }
    return r;
}

TEST_CASE("float pooling (vectorised) equals the definition bit for bit, forward and backward") {
    // Small integers make ties; NaN and Inf sit in some windows. Planes of 28x28 fill whole vectors,
    // 13x11 leaves tails and windows clipped by padding inside vectors; 6x40 gives 2x2 pooling rows of
    // 20 outputs (a whole vector and a masked one).
    for (const dl::Shape& shape : {dl::Shape{2, 3, 28, 28}, dl::Shape{3, 2, 13, 11}, dl::Shape{1, 2, 6, 40}, dl::Shape{1, 1, 1, 1}}) {
        Tensor<float> x = dl::round(dl::normal<float>(shape, 0, 2, ctx()));
        const std::int64_t numel = x.numel();
        if (numel > 40) {
            x.data()[5] = NAN;
            x.data()[40] = INFINITY;
            x.data()[numel - 3] = -INFINITY;
            x.data()[numel / 2] = NAN;
            x.data()[numel / 2 + 1] = NAN;
        }
        const dl::pool2d_options settings[] = {{.kernel = 2},
                                               {.kernel = 3, .stride = 2, .padding = 1},
                                               {.kernel = 3, .stride = 1, .padding = 1},  // overlapping windows
                                               {.kernel = {3, 2}, .stride = {1, 2}},
                                               {.kernel = 2, .stride = 3},  // positions in no window
                                               {.kernel = 1}};
        for (auto o : settings) {
            if (o.kernel.h > shape[2] || o.kernel.w > shape[3]) continue;
            for (bool include_pad : {true, false}) {
                CAPTURE(shape);
                CAPTURE(o.kernel.h);
                CAPTURE(o.stride.h);
                CAPTURE(include_pad);
                o.count_include_pad = include_pad;
                Tensor<float> xm = x.detach().requires_grad_(), xa = x.detach().requires_grad_();
                const auto mx = dl::max_pool2d(xm, o), av = dl::avg_pool2d(xa, o);
                const Tensor<float> g = dl::round(dl::normal<float>(mx.shape(), 0, 4, ctx())) / 4.0f;
                mx.backward(g);
                av.backward(g);
                const pool_reference r = pool_by_definition(x, g, o);
                CHECK(same_bits(mx, r.max));
                CHECK(same_bits(dl::max_pool2d(x, o), r.max));  // no gradient: no winners kept
                CHECK(same_bits(av, r.avg));
                CHECK(same_bits(xm.grad(), r.max_grad));
                CHECK(same_bits(xa.grad(), r.avg_grad));
            }
        }
    }
}

TEST_CASE("adaptive_avg_pool2d uses PyTorch's windows, including overlapping ones") {
    const auto x = randn({1, 2, 5, 7});
    for (auto [oh, ow] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {2, 3}, {5, 7}, {3, 4}}) {
        CAPTURE(oh);
        CAPTURE(ow);
        const auto y = dl::adaptive_avg_pool2d(x, {oh, ow});
        bool same = true;
        dl_test::for_each_index(y.shape(), [&](const std::int64_t* p) {
            const std::int64_t h0 = p[2] * 5 / oh, h1 = ((p[2] + 1) * 5 + oh - 1) / oh;
            const std::int64_t w0 = p[3] * 7 / ow, w1 = ((p[3] + 1) * 7 + ow - 1) / ow;
            double total = 0;
            for (std::int64_t i = h0; i < h1; ++i)
                for (std::int64_t j = w0; j < w1; ++j) total += x(p[0], p[1], i, j);
            same = same && std::abs(y(p[0], p[1], p[2], p[3]) - total / double((h1 - h0) * (w1 - w0))) < 1e-12;
        });
        CHECK(same);
        CHECK_GRAD([&](const auto& a) { return dl::adaptive_avg_pool2d(a, {oh, ow}); }, x);
    }
    // Global average pooling equals the mean over H and W.
    CHECK(dl_test::same_elements(dl::adaptive_avg_pool2d(x, 1).reshape({1, 2}), dl::mean(x, {2, 3}), 1e-12));
}

TEST_CASE("layer_norm and batch_norm against the definition, with gradients") {
    const auto x = randn({4, 3, 2, 5});
    // layer_norm over the last two dimensions.
    const auto w = randn({2, 5}), b = randn({2, 5});
    const auto y = dl::layer_norm(x, 2, w, b, 1e-5);
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t c = 0; c < 3; ++c) {
            double m = 0, v = 0;
            for (std::int64_t p = 0; p < 2; ++p)
                for (std::int64_t q = 0; q < 5; ++q) m += x(i, c, p, q) / 10;
            for (std::int64_t p = 0; p < 2; ++p)
                for (std::int64_t q = 0; q < 5; ++q) v += (x(i, c, p, q) - m) * (x(i, c, p, q) - m) / 10;
            for (std::int64_t p = 0; p < 2; ++p)
                for (std::int64_t q = 0; q < 5; ++q)
                    CHECK(y(i, c, p, q) == doctest::Approx((x(i, c, p, q) - m) / std::sqrt(v + 1e-5) * w(p, q) + b(p, q)));
        }
    CHECK_GRAD([](const auto& a, const auto& ww, const auto& bb) { return dl::layer_norm(a, 2, ww, bb); }, x, w, b);
    CHECK_GRAD([](const auto& a) { return dl::layer_norm(a, 1); }, x);

    // batch_norm over N, H, W per channel; running statistics move by momentum with the unbiased variance.
    auto rm = dl::zeros<double>({3}), rv = dl::ones<double>({3});
    const auto g = randn({3}), beta = randn({3});
    const auto z = dl::batch_norm(x, rm, rv, g, beta, true, 0.25);
    for (std::int64_t c = 0; c < 3; ++c) {
        double m = 0, v = 0;
        const double count = 4 * 2 * 5;
        dl_test::for_each_index({4, 2, 5}, [&](const std::int64_t* p) { m += x(p[0], c, p[1], p[2]) / count; });
        dl_test::for_each_index({4, 2, 5}, [&](const std::int64_t* p) {
            v += (x(p[0], c, p[1], p[2]) - m) * (x(p[0], c, p[1], p[2]) - m) / count;
        });
        dl_test::for_each_index({4, 2, 5}, [&](const std::int64_t* p) {
            CHECK(z(p[0], c, p[1], p[2]) ==
                  doctest::Approx((x(p[0], c, p[1], p[2]) - m) / std::sqrt(v + 1e-5) * g(c) + beta(c)));
        });
        CHECK(rm(c) == doctest::Approx(0.25 * m));
        CHECK(rv(c) == doctest::Approx(0.75 + 0.25 * v * count / (count - 1)));
    }
    CHECK_GRAD([&](const auto& a, const auto& gg, const auto& bb) { return dl::batch_norm(a, rm, rv, gg, bb, true); }, x, g, beta);
    CHECK_GRAD([&](const auto& a, const auto& gg, const auto& bb) { return dl::batch_norm(a, rm, rv, gg, bb, false); }, x, g, beta);
    CHECK_GRAD([&](const auto& a) { return dl::batch_norm(a, {}, {}, {}, {}, true); }, randn({5, 3}));

    CHECK(dl_test::error_message([&] { (void)dl::batch_norm(randn({1, 3}), rm, rv, g, beta, true); })
              .find("more than one value") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::batch_norm(x, {}, {}, g, beta, false); }).find("running") !=
          std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::layer_norm(x, 1, w, b); }).find("[5]") != std::string::npos);
}
