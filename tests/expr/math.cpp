// Accuracy of the vectorised transcendentals: max error in ulps against a double-precision reference,
// over a dense sample of every float bit pattern (every 1021st, plus the edges), on both the SIMD path
// (contiguous operands) and the scalar path (strided operands).
#include <doctest/doctest.h>

#include <dl/dl.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

/// Every `stride`-th float bit pattern, plus values that commonly break kernels.
std::vector<float> dense_floats(std::uint32_t stride) {
    std::vector<float> v;
    for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += stride)
        v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
    const float lim = std::numeric_limits<float>::max();
    for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 0.625f, -0.625f, 9.0f, -9.0f, 87.3f, -87.3f, 88.72f,
                    -88.72f, 89.0f, -104.0f, -103.9f, 1e-30f, -1e-30f, lim, -lim,
                    std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
        v.push_back(x);
    for (float x = -110.0f; x < 110.0f; x += 0.0137f) v.push_back(x);  // dense where the kernels branch
    return v;
}

/// Distance in ulps of `got` from `want` (ulp at want's magnitude, denorm_min below the normals).
double ulp_error(float got, double want) {
    if (std::isnan(want)) return std::isnan(got) ? 0 : INFINITY;
    const float rounded = static_cast<float>(want);
    if (std::isinf(rounded)) return got == rounded ? 0 : INFINITY;  // correctly rounded result is inf
    if (std::isnan(got) || std::isinf(got)) return INFINITY;
    const double a = std::abs(want);
    const double ulp = a < std::numeric_limits<float>::min() ? std::numeric_limits<float>::denorm_min()
                                                             : std::ldexp(1.0, std::ilogb(a) - 23);
    return std::abs(static_cast<double>(got) - want) / ulp;
}

struct case_t {
    std::string name;
    std::function<dl::Tensor<float>(const dl::Tensor<float>&)> dl_op;
    std::function<double(double)> reference;
    bool (*in_domain)(float) = [](float) { return true; };
};

double max_ulp(const case_t& c, const dl::Tensor<float>& input, float* worst_x) {
    dl::Tensor<float> out = c.dl_op(input);
    double worst = 0;
    for (std::int64_t i = 0; i < input.numel(); ++i) {
        const float x = input(i);
        if (!c.in_domain(x)) continue;
        const double err = ulp_error(out(i), c.reference(static_cast<double>(x)));
        if (err > worst) {
            worst = err;
            *worst_x = x;
        }
    }
    return worst;
}

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

TEST_CASE("transcendentals are within 4 ulp of a double reference on SIMD and scalar paths") {
    const bool quick = std::getenv("DL_TEST_QUICK") != nullptr;
    const std::vector<float> values = dense_floats(quick ? 65521 : 1021);
    const auto n = static_cast<std::int64_t>(values.size());
    // The subnormal range is part of what is checked, so results are not flushed to zero here.
    dl::Context ctx({.seed = 0, .threads = 2, .flush_denormals = false});
    dl::Tensor<float> contiguous({n}, ctx);
    std::copy(values.begin(), values.end(), contiguous.data());
    // The same values at stride 2 take the scalar path.
    dl::Tensor<float> spread = dl::zeros<float>({2 * n}, ctx);
    dl::Tensor<float> strided = spread.slice(0, 0, 2 * n, 2);
    strided.copy_from(contiguous);

    const std::vector<case_t> cases = {
        {"exp", [](auto& x) { return dl::exp(x).eval(); }, [](double x) { return std::exp(x); }},
        {"sigmoid", [](auto& x) { return dl::sigmoid(x).eval(); }, sigmoid_ref},
        {"tanh", [](auto& x) { return dl::tanh(x).eval(); }, [](double x) { return std::tanh(x); }},
        {"exp2", [](auto& x) { return dl::exp2(x).eval(); }, [](double x) { return std::exp2(x); }},
        {"expm1", [](auto& x) { return dl::expm1(x).eval(); }, [](double x) { return std::expm1(x); }},
        {"log", [](auto& x) { return dl::log(x).eval(); }, [](double x) { return std::log(x); }},
        {"log2", [](auto& x) { return dl::log2(x).eval(); }, [](double x) { return std::log2(x); }},
        {"log1p", [](auto& x) { return dl::log1p(x).eval(); }, [](double x) { return std::log1p(x); }},
        {"sqrt", [](auto& x) { return dl::sqrt(x).eval(); }, [](double x) { return std::sqrt(x); }},
        {"rsqrt", [](auto& x) { return dl::rsqrt(x).eval(); }, [](double x) { return 1 / std::sqrt(x); }},
        // xsimd reduces sin/cos arguments accurately up to ~1e5 rad: that is their tested domain.
        {"sin", [](auto& x) { return dl::sin(x).eval(); }, [](double x) { return std::sin(x); },
         [](float x) { return std::abs(x) < 1e5f; }},
        {"cos", [](auto& x) { return dl::cos(x).eval(); }, [](double x) { return std::cos(x); },
         [](float x) { return std::abs(x) < 1e5f; }},
        // silu = x * sigmoid(x): below -87 sigmoid is subnormal and has lost bits before the multiply.
        {"silu", [](auto& x) { return dl::silu(x).eval(); }, [](double x) { return x * sigmoid_ref(x); },
         [](float x) { return x > -87.0f; }},
        {"softplus", [](auto& x) { return dl::softplus(x).eval(); },
         [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }},
    };
    for (const auto& c : cases) {
        for (bool use_strided : {false, true}) {
            float worst_x = 0;
            const double err = max_ulp(c, use_strided ? strided : contiguous, &worst_x);
            const std::string what = c.name + (use_strided ? " (scalar path)" : " (SIMD path)");
            MESSAGE(what, ": max ", err, " ulp at x = ", worst_x);  // shown with --success
            CHECK_MESSAGE(err <= 4.0, what, ": max ", err, " ulp at x = ", worst_x);
        }
    }
}
