// Gradients of elementwise expressions: every differentiable op against finite differences, chains,
// broadcasting, where/clamp/cast, and the claim that a chain's backward is one fused loop.
#include "support.hpp"

namespace {

using dl::Tensor;
using dl::autograd::gradcheck;

dl::Context& ctx() {
    static dl::Context c({.seed = 11, .threads = 1});
    return c;
}
Tensor<double> randn(const dl::Shape& s) { return dl::normal<double>(s, 0, 1, ctx()); }
Tensor<double> positive(const dl::Shape& s) { return dl::uniform<double>(s, 0.5, 2.0, ctx()); }

}  // namespace

TEST_CASE("unary ops: backward matches finite differences") {
    const auto x = randn({3, 5});
    const auto p = positive({3, 5});
#define UNARY(name, input) CHECK_GRAD([](const Tensor<double>& a) { return Tensor<double>(dl::name(a)); }, input)
    UNARY(neg, x);
    UNARY(square, x);
    UNARY(sqrt, p);
    UNARY(rsqrt, p);
    UNARY(reciprocal, p);
    UNARY(exp, x);
    UNARY(exp2, x);
    UNARY(log, p);
    UNARY(log2, p);
    UNARY(log1p, p);
    UNARY(expm1, x);
    UNARY(sin, x);
    UNARY(cos, x);
    UNARY(tanh, x);
    UNARY(sigmoid, x);
    UNARY(silu, x);
    UNARY(softplus, x);
    UNARY(gelu, x);
    UNARY(gelu_erf, x);
    UNARY(abs, x);
    UNARY(relu, x);
    UNARY(floor, x);
    UNARY(ceil, x);
    UNARY(round, x);
    UNARY(sign, x);
#undef UNARY
    CHECK_GRAD([](const Tensor<double>& a) { return Tensor<double>(dl::leaky_relu(a, 0.2)); }, x);
    CHECK_GRAD([](const Tensor<double>& a) { return Tensor<double>(dl::elu(a, 0.7)); }, x);
}

TEST_CASE("binary ops: both operands, tensors and scalars") {
    const auto a = randn({4, 3}), b = randn({4, 3}), p = positive({4, 3});
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(x + y); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(x - y); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(x * y); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(x / y); }, a, p);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(dl::pow(x, y)); }, p, a);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(dl::atan2(x, y)); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(dl::minimum(x, y)); }, a, b);
    CHECK_GRAD([](const auto& x, const auto& y) { return Tensor<double>(dl::maximum(x, y)); }, a, b);
    CHECK_GRAD([](const auto& x) { return Tensor<double>(2.5 - x * 3.0 + 1.0 / (x * x + 1.0)); }, a);
    CHECK_GRAD([](const auto& x) { return Tensor<double>(dl::pow(x, 3.0)); }, a);
}

TEST_CASE("a chain of ops, a tensor used twice, where, clamp and cast") {
    const auto x = randn({2, 7}), w = randn({2, 7}), g = randn({2, 7});
    CHECK_GRAD([](const auto& a, const auto& b, const auto& c) {
        return Tensor<double>(a * dl::sigmoid(c) + dl::tanh(a * b) * dl::exp(-dl::square(b)));
    }, x, w, g);
    CHECK_GRAD([](const auto& a) { return Tensor<double>(dl::where(a > 0.0, a * a, -a * 3.0)); }, x);
    CHECK_GRAD([](const auto& a, const auto& b) { return Tensor<double>(dl::where(a > b, a, b * 2.0)); }, x, w);
    CHECK_GRAD([](const auto& a) { return Tensor<double>(dl::clamp(a, -0.5, 0.5) * a); }, x);
    // Through float and back: the gradient is converted at each cast.
    const auto r = gradcheck({.eps = 1e-3, .atol = 1e-3, .rtol = 1e-3},
                             [](const auto& a) { return Tensor<double>(dl::cast<double>(dl::cast<float>(a) * 2.0f)); }, x);
    INFO(r.message);
    CHECK(r.ok);
}

TEST_CASE("broadcast operands get gradients summed over the broadcast dimensions") {
    const auto x = randn({3, 4}), row = randn({4}), col = randn({3, 1}), s = randn({});
    CHECK_GRAD([](const auto& a, const auto& b, const auto& c, const auto& d) {
        return Tensor<double>(dl::sigmoid(a * b + c) * d);
    }, x, row, col, s);
    Tensor<float> b = dl::ones<float>({4}).requires_grad_();
    Tensor<float> y = dl::ones<float>({5, 4}) * b;
    dl::sum(y).backward();
    CHECK(dl_test::to_vector(b.grad()) == std::vector<float>{5, 5, 5, 5});
}

TEST_CASE("non-contiguous inputs and the float path agree with double") {
    auto xd = randn({5, 6});
    CHECK_GRAD([](const auto& a) { return Tensor<double>(dl::tanh(a.t()) * a.t().slice(0, 0, 6, 1)); }, xd);
    Tensor<float> xf = dl::cast<float>(xd);
    xf.requires_grad_();
    xd.requires_grad_();
    dl::sum(dl::sigmoid(xf.t()) * 3.0f).backward();
    dl::sum(dl::sigmoid(xd.t()) * 3.0).backward();
    CHECK(dl_test::same_elements(xf.grad(), xd.grad(), 1e-6));
}

TEST_CASE("a fused chain costs one forward and one backward loop, whatever its length") {
    // Counted as allocator requests: each loop over a new tensor needs one. Forward: the result and
    // its node; backward: x's gradient (the result's gradient is the given seed, not a copy of it).
    dl::Context c({.threads = 1});
    auto requests = [&] {
        const auto s = c.allocator().stats();
        return s.system_allocations + s.cache_hits;
    };
    auto count = [&](auto&& f) {
        Tensor<float> x = dl::normal<float>({1000}, 0, 1, c).requires_grad_();
        Tensor<float> seed = dl::ones<float>({1000}, c);
        const auto before = requests();
        Tensor<float> y = f(x);
        y.backward(seed);
        return requests() - before;
    };
    const auto one = count([](const auto& a) { return Tensor<float>(dl::tanh(a)); });
    const auto six = count([](const auto& a) {
        return Tensor<float>(dl::sigmoid(dl::tanh(a) * 2.0f + 1.0f) * dl::exp(-a) - dl::square(a));
    });
    CHECK(one == six);
    CHECK(six == 3);
    // Op by op, each intermediate costs a tensor, a node and a gradient.
    const auto unfused = count([](const auto& a) {
        Tensor<float> t = dl::tanh(a);
        Tensor<float> u = t * 2.0f;
        Tensor<float> v = u + 1.0f;
        return Tensor<float>(dl::sigmoid(v));
    });
    CHECK(unfused > six + 6);
}
