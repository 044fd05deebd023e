// Tensors of bfloat16 and float16: every elementwise op computes in float and rounds once, on store
// (the reference is the float op on the widened inputs, rounded once, compared bit for bit); a fused
// chain of seven ops rounds once too, which rounding after each op would not; reductions accumulate in
// wide precision; casts, views, broadcasting, strided outputs, tails and threads.
#include "support.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

namespace {

/// Values in [lo, hi] on a coarse grid (so ties and integers occur), with NaN, ±Inf, ±0 and a subnormal
/// sprinkled in when `specials`.
template <class H>
dl::Tensor<H> sample(const dl::Shape& shape, double lo, double hi, std::uint32_t seed, bool specials = true) {
    dl::Tensor<H> t(shape);
    std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    const double specials_list[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, double(std::numeric_limits<H>::denorm_min())};
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const double u = double(state >> 11) * 0x1p-53;
        double v = std::round((lo + u * (hi - lo)) * 64) / 64;
        if (specials && i % 53 == 7) v = specials_list[(i / 53) % 6];
        t.data()[i] = H(v);
    }
    return t;
}

/// Same bits, or both NaN (a NaN's sign and payload may differ between loops).
template <class H>
bool same_value(H got, H want) {
    return got.bits() == want.bits() || (std::isnan(float(got)) && std::isnan(float(want)));
}

/// `got` (16-bit) against `wide` (the float computation) rounded once to H.
template <class H>
void check_rounded_once(const dl::Tensor<H>& got, const dl::Tensor<float>& wide) {
    REQUIRE(got.shape() == wide.shape());
    const auto g = dl_test::to_vector(got);
    const auto w = dl_test::to_vector(wide);
    int wrong = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
        if (!same_value(g[i], H(w[i])) && wrong++ < 5)
            MESSAGE("element ", i, ": got ", float(g[i]), ", float computation ", w[i], " rounds to ", float(H(w[i])));
    CHECK(wrong == 0);
}

template <class H>
dl::Tensor<float> widen(const dl::Tensor<H>& t) {
    return dl::cast<float>(t);
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit unary ops: the float op on widened inputs, rounded once", H, dl::bfloat16, dl::float16) {
    for (std::int64_t n : {0, 1, 15, 17, 1037}) {
        CAPTURE(n);
        const auto a = sample<H>({n}, -6, 6, 1);
        const auto p = sample<H>({n}, 0.01, 6, 2);  // positive, for log and sqrt
        const auto aw = widen(a), pw = widen(p);
        check_rounded_once<H>(-a, -aw);
        check_rounded_once<H>(dl::abs(a), dl::abs(aw));
        check_rounded_once<H>(dl::sqrt(p), dl::sqrt(pw));
        check_rounded_once<H>(dl::rsqrt(p), dl::rsqrt(pw));
        check_rounded_once<H>(dl::exp(a), dl::exp(aw));
        check_rounded_once<H>(dl::exp2(a), dl::exp2(aw));
        check_rounded_once<H>(dl::log(p), dl::log(pw));
        check_rounded_once<H>(dl::log2(p), dl::log2(pw));
        check_rounded_once<H>(dl::log1p(p), dl::log1p(pw));
        check_rounded_once<H>(dl::expm1(a), dl::expm1(aw));
        check_rounded_once<H>(dl::sin(a), dl::sin(aw));
        check_rounded_once<H>(dl::cos(a), dl::cos(aw));
        check_rounded_once<H>(dl::tanh(a), dl::tanh(aw));
        check_rounded_once<H>(dl::sigmoid(a), dl::sigmoid(aw));
        check_rounded_once<H>(dl::relu(a), dl::relu(aw));
        check_rounded_once<H>(dl::silu(a), dl::silu(aw));
        check_rounded_once<H>(dl::softplus(a), dl::softplus(aw));
        check_rounded_once<H>(dl::gelu(a), dl::gelu(aw));
        check_rounded_once<H>(dl::gelu_erf(a), dl::gelu_erf(aw));
        check_rounded_once<H>(dl::square(a), dl::square(aw));
        check_rounded_once<H>(dl::reciprocal(a), dl::reciprocal(aw));
        check_rounded_once<H>(dl::floor(a), dl::floor(aw));
        check_rounded_once<H>(dl::ceil(a), dl::ceil(aw));
        check_rounded_once<H>(dl::round(a), dl::round(aw));
        check_rounded_once<H>(dl::sign(a), dl::sign(aw));
        check_rounded_once<H>(dl::leaky_relu(a, 0.1), dl::leaky_relu(aw, 0.1));
        check_rounded_once<H>(dl::elu(a), dl::elu(aw));
        check_rounded_once<H>(dl::clamp(a, -1.5, 2.25), dl::clamp(aw, -1.5, 2.25));
        CHECK(dl_test::same_elements(dl::Tensor<bool>(dl::isnan(a)), dl::Tensor<bool>(dl::isnan(aw))));
        CHECK(dl_test::same_elements(dl::Tensor<bool>(dl::isfinite(a)), dl::Tensor<bool>(dl::isfinite(aw))));
    }
}

TEST_CASE_TEMPLATE("16-bit binary ops and comparisons, with broadcasting and scalars", H, dl::bfloat16, dl::float16) {
    const auto a = sample<H>({37, 29}, -5, 5, 3);
    const auto b = sample<H>({29}, -5, 5, 4);  // broadcast along rows
    const auto aw = widen(a), bw = widen(b);
    check_rounded_once<H>(a + b, aw + bw);
    check_rounded_once<H>(a - b, aw - bw);
    check_rounded_once<H>(a * b, aw * bw);
    check_rounded_once<H>(a / b, aw / bw);
    check_rounded_once<H>(dl::pow(dl::abs(a), b), dl::pow(dl::abs(aw), bw));
    check_rounded_once<H>(dl::atan2(a, b), dl::atan2(aw, bw));
    check_rounded_once<H>(dl::minimum(a, b), dl::minimum(aw, bw));
    check_rounded_once<H>(dl::maximum(a, b), dl::maximum(aw, bw));
    check_rounded_once<H>(dl::where(a > b, a, b), dl::where(aw > bw, aw, bw));
    // A float scalar stays float inside the computation: 0.1 is not first rounded to 16 bits.
    check_rounded_once<H>(a * 0.1f, aw * 0.1f);
    check_rounded_once<H>(2.5 - a, 2.5 - aw);
    CHECK(dl_test::same_elements(dl::Tensor<bool>(a < b), dl::Tensor<bool>(aw < bw)));
    CHECK(dl_test::same_elements(dl::Tensor<bool>(a == b), dl::Tensor<bool>(aw == bw)));
    CHECK(dl_test::same_elements(dl::Tensor<bool>(a >= 0.5f), dl::Tensor<bool>(aw >= 0.5f)));
    // Mixing with float gives float (computed from the exact widened values); with an integer, 16-bit.
    const dl::Tensor<float> mixed = a + bw, reference = aw + bw;
    for (std::int64_t k = 0; k < mixed.numel(); ++k)
        REQUIRE((mixed.data()[k] == reference.data()[k] || (std::isnan(mixed.data()[k]) && std::isnan(reference.data()[k]))));
    const auto i = dl::arange<std::int32_t>(29);
    static_assert(std::is_same_v<dl::value_t<decltype(a * i)>, H>);
    check_rounded_once<H>(a * i, aw * dl::cast<float>(i));
    // bfloat16 with float16 meets in float.
    using Other = std::conditional_t<std::is_same_v<H, dl::bfloat16>, dl::float16, dl::bfloat16>;
    static_assert(std::is_same_v<dl::value_t<decltype(a + dl::cast<Other>(b))>, float>);
}

TEST_CASE_TEMPLATE("16-bit fused chain: seven ops round once, on store", H, dl::bfloat16, dl::float16) {
    dl::Context ctx({.threads = 2});
    const auto a = sample<H>({4099}, -3, 3, 5, false);
    const auto b = sample<H>({4099}, -3, 3, 6, false);
    const auto c = sample<H>({4099}, -3, 3, 7, false);
    auto chain = [](const auto& x, const auto& y, const auto& z) {
        return ((x * y + z) * dl::sigmoid(x) - dl::tanh(y)) / 2.0f;
    };
    static_assert(dl::op_count<decltype(chain(a, b, c))> == 7);
    const dl::Tensor<H> fused = chain(a, b, c);
    check_rounded_once<H>(fused, chain(widen(a), widen(b), widen(c)));
    // Rounding after every op (what one-op-at-a-time evaluation would do) gives different values.
    const dl::Tensor<H> xy = a * b, xyz = xy + c, s = dl::sigmoid(a), m = xyz * s, t = dl::tanh(b), d = m - t;
    const dl::Tensor<H> stepwise = d / 2.0f;
    int differ = 0;
    for (std::int64_t k = 0; k < fused.numel(); ++k) differ += fused.data()[k].bits() != stepwise.data()[k].bits();
    CHECK(differ > 100);
}

TEST_CASE_TEMPLATE("16-bit strided operands and outputs, and threads, give the same bits", H, dl::bfloat16, dl::float16) {
    dl::Context one({.threads = 1}), two({.threads = 2});
    const auto a = sample<H>({300, 257}, -4, 4, 8);
    const auto b = sample<H>({257, 300}, -4, 4, 9);
    const auto bt = b.transpose(0, 1);  // non-contiguous
    dl::Tensor<H> r1 = dl::exp(a * 0.25f) - bt;
    check_rounded_once<H>(r1, dl::exp(widen(a) * 0.25f) - widen(b).transpose(0, 1));
    // The same into a strided output (every other column of a wider tensor).
    dl::Tensor<H> wide = dl::zeros<H>({300, 514});
    wide.slice(1, 0, 514, 2) = dl::exp(a * 0.25f) - bt;
    check_rounded_once<H>(wide.slice(1, 0, 514, 2), dl::exp(widen(a) * 0.25f) - widen(b).transpose(0, 1));
    CHECK(float(wide(5, 1)) == 0.0f);
    // Large enough to be split over threads: bitwise equal to one thread.
    const auto big1 = sample<H>({1 << 18}, -4, 4, 10);
    dl::Tensor<H> x1({1 << 18}, one), x2({1 << 18}, two);
    std::copy_n(big1.data(), big1.numel(), x1.data());
    std::copy_n(big1.data(), big1.numel(), x2.data());
    const dl::Tensor<H> y1 = dl::sigmoid(x1) * x1, y2 = dl::sigmoid(x2) * x2;
    CHECK(std::equal(y1.data(), y1.data() + y1.numel(), y2.data(),
                     [](H p, H q) { return p.bits() == q.bits(); }));
}

TEST_CASE_TEMPLATE("16-bit reductions accumulate in wide precision and round once", H, dl::bfloat16, dl::float16) {
    // 4096 ones: a 16-bit accumulator would stop at 256 (bfloat16) or 2048 (float16).
    const auto ones = dl::ones<H>({4096});
    CHECK(float(dl::sum(ones).item()) == 4096.0f);
    CHECK(float(dl::mean(ones).item()) == 1.0f);
    const auto a = sample<H>({64, 33}, -4, 4, 11, false);
    const auto v = dl_test::to_vector(a);
    double total = 0;  // exact: 8 or 11 significant bits over a narrow range fit a double
    for (const H x : v) total += double(x);
    CHECK(dl::sum(a).item().bits() == H(total).bits());
    CHECK(dl::mean(a).item().bits() == H(total / double(v.size())).bits());
    const dl::Tensor<H> rows = dl::sum(a, {1});
    for (std::int64_t r = 0; r < 64; ++r) {
        double s = 0;
        for (std::int64_t k = 0; k < 33; ++k) s += double(a(r, k));
        REQUIRE(rows(r).bits() == H(s).bits());
    }
    float hi = -INFINITY;
    std::int64_t at = 0;
    for (std::size_t k = 0; k < v.size(); ++k)
        if (float(v[k]) > hi) hi = float(v[at = std::int64_t(k)]);
    CHECK(float(dl::max(a).item()) == hi);
    CHECK(dl::argmax(a).item() == at);
    double sq = 0;
    for (const H x : v) sq += (double(x) - total / double(v.size())) * (double(x) - total / double(v.size()));
    CHECK(float(dl::var(a).item()) == doctest::Approx(sq / double(v.size() - 1)).epsilon(0.01));
    // NaN propagates through sum and max.
    auto n = dl::ones<H>({5});
    n.data()[2] = std::numeric_limits<H>::quiet_NaN();
    CHECK(std::isnan(float(dl::sum(n).item())));
    CHECK(std::isnan(float(dl::max(n).item())));
}

TEST_CASE_TEMPLATE("16-bit casts to and from every element type", H, dl::bfloat16, dl::float16) {
    const auto a = sample<H>({101}, -300, 300, 12, false);
    const dl::Tensor<std::int32_t> i = dl::cast<std::int32_t>(a);
    const dl::Tensor<double> d = dl::cast<double>(a);
    const dl::Tensor<bool> nz = dl::cast<bool>(a);
    for (std::int64_t k = 0; k < 101; ++k) {
        REQUIRE(i(k) == static_cast<std::int32_t>(float(a(k))));
        REQUIRE(d(k) == double(float(a(k))));
        REQUIRE(nz(k) == (float(a(k)) != 0));
    }
    const auto big = dl::arange<std::int64_t>(0, 5000, 7);
    const dl::Tensor<H> from_int = dl::cast<H>(big);
    for (std::int64_t k = 0; k < big.numel(); ++k) REQUIRE(from_int(k).bits() == H(big(k)).bits());
    const dl::Tensor<double> fine = dl::linspace<double>(-2, 2, 1001);
    const dl::Tensor<H> from_double = dl::cast<H>(fine);
    for (std::int64_t k = 0; k < fine.numel(); ++k) REQUIRE(from_double(k).bits() == H(fine(k)).bits());
    using Other = std::conditional_t<std::is_same_v<H, dl::bfloat16>, dl::float16, dl::bfloat16>;
    const dl::Tensor<Other> other = dl::cast<Other>(a);
    for (std::int64_t k = 0; k < 101; ++k) REQUIRE(other(k).bits() == Other(float(a(k))).bits());
}

TEST_CASE_TEMPLATE("16-bit views, creation and printing", H, dl::bfloat16, dl::float16) {
    const auto a = dl::arange<H>(24).reshape({2, 3, 4});
    CHECK(a.dtype() == dl::dtype_of<H>);
    CHECK(float(a(1, 2, 3)) == 23.0f);
    CHECK(float(a.transpose(0, 2)(3, 2, 1)) == 23.0f);
    CHECK(float(a.slice(2, 1, 4, 2)(1, 1, 1)) == 19.0f);
    CHECK(float(a.select(1, 2)(0, 3)) == 11.0f);
    CHECK(float(a.slice(0, 0, 1).expand({5, 3, 4})(4, 2, 0)) == 8.0f);
    const auto u = dl::uniform<H>({10000}, -1, 1);
    CHECK(float(dl::min(u).item()) >= -1.0f);
    CHECK(float(dl::max(u).item()) < 1.0f);
    const auto f = dl::full<H>({3}, 0.1);
    CHECK(f(2).bits() == H(0.1).bits());
    std::ostringstream out;
    out << dl::full<H>({2}, 1.5);
    CHECK(out.str().find(std::string(dl::dtype_name(dl::dtype_of<H>))) != std::string::npos);
    CHECK(out.str().find("1.5") != std::string::npos);
}
