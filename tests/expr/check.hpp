#pragma once
// Helpers for the expression and reduction tests: deterministic inputs (independent of dl's own random
// streams), element checks against a double-precision scalar reference with a stated tolerance, and
// bitwise comparison of tensors.
#include "support.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace expr_test {

using dl_test::to_vector;

/// Sizes that exercise the SIMD tails (AVX float batches hold 8, double 4), and one that is split over
/// threads.
inline constexpr std::int64_t sizes[] = {0, 1, 7, 15, 17, 1023, 1025, std::int64_t{1} << 20};

inline constexpr double qnan = std::numeric_limits<double>::quiet_NaN();
inline constexpr double inf = std::numeric_limits<double>::infinity();

/// Allowed difference from the reference: |got - want| <= abs + rel |want|. Zero: exact.
/// NaN must meet NaN and an infinite reference must be met exactly, whatever the tolerance.
struct tolerance {
    double rel = 0, abs = 0;
};
inline constexpr tolerance exact{};

/// Transcendentals: a few dozen ulps, far above the kernels' error, far below a wrong formula.
template <class T>
inline constexpr tolerance transcendental = std::is_same_v<T, float> ? tolerance{4e-6, 0} : tolerance{1e-12, 0};
/// The same plus a small absolute term, for results that cancel to near 0 (sin near k pi, gelu's
/// 1 + tanh(x) for negative x).
template <class T>
inline constexpr tolerance transcendental_abs =
    std::is_same_v<T, float> ? tolerance{4e-6, 1e-6} : tolerance{1e-12, 1e-14};

[[nodiscard]] inline bool matches(double got, double want, tolerance tol) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want) || (tol.rel == 0 && tol.abs == 0)) return got == want;
    return std::fabs(got - want) <= tol.abs + tol.rel * std::fabs(want);
}

/// u in [0, 1) from (seed, i) by splitmix64.
[[nodiscard]] inline double unit(std::uint64_t seed, std::uint64_t i) {
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
}

/// Pseudo-random values in [lo, hi] (integers: uniform over lo..hi; bool: half true). With a
/// nonzero `quantum`, floats are rounded to multiples of it, so ties, halves and integers occur.
template <class T>
[[nodiscard]] dl::Tensor<T> random(const dl::Shape& shape, double lo, double hi, std::uint64_t seed = 1,
                                   double quantum = 0, dl::Context& ctx = dl::default_context()) {
    dl::Tensor<T> t(shape, ctx);
    T* p = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
        const double u = unit(seed, static_cast<std::uint64_t>(i));
        if constexpr (std::is_same_v<T, bool>) {
            p[i] = u < 0.5;
        } else if constexpr (std::is_integral_v<T>) {
            p[i] = static_cast<T>(std::min(hi, std::floor(lo + u * (hi - lo + 1))));
        } else {
            double v = lo + u * (hi - lo);
            if (quantum > 0) v = std::round(v / quantum) * quantum;
            p[i] = static_cast<T>(v);
        }
    }
    return t;
}

/// A contiguous tensor holding `values` (converted to T).
template <class T>
[[nodiscard]] dl::Tensor<T> from_values(const std::vector<double>& values, dl::Context& ctx = dl::default_context()) {
    dl::Tensor<T> t({static_cast<std::int64_t>(values.size())}, ctx);
    for (std::size_t i = 0; i < values.size(); ++i) t.data()[i] = static_cast<T>(values[i]);
    return t;
}

/// The same elements as `t`, laid out at stride 3 inside a bigger buffer: operations on the result
/// cannot take the SIMD path.
template <class T>
[[nodiscard]] dl::Tensor<T> spread(const dl::Tensor<T>& t) {
    dl::Tensor<T> wide = dl::zeros<T>({t.numel(), 3}, t.context());
    const auto v = to_vector(t);
    for (std::size_t i = 0; i < v.size(); ++i) wide.data()[3 * i + 1] = v[i];
    return wide.select(1, 1).reshape(t.shape());
}

template <class T>
[[nodiscard]] std::string show(T v) {
    if constexpr (std::is_same_v<T, bool>) {
        return v ? "true" : "false";
    } else if constexpr (std::is_integral_v<T>) {
        return std::to_string(static_cast<long long>(v));
    } else {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
        return buf;
    }
}

/// Checks element i (row-major) of `got` against want(i), a double already rounded to got's type.
/// On failure, reports how many differ and the first few, with input(i) describing the inputs.
template <class T, class Want, class Input>
void check_elements(const dl::Tensor<T>& got, Want&& want, tolerance tol, std::string_view what, Input&& input) {
    const std::vector<T> values = to_vector(got);
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < values.size(); ++i) {
        const double w = want(i);
        if (matches(static_cast<double>(values[i]), w, tol)) continue;
        if (bad++ < 4)
            first += "\n  [" + std::to_string(i) + "] " + input(i) + ": got " + show(values[i]) + ", want " +
                     show(w);
    }
    INFO(what, ": ", bad, " of ", values.size(), " elements differ", first);
    CHECK(bad == 0);
}

/// Checks f(x) against the scalar reference ref(x[i]) rounded to the result type.
template <class T, class F, class Ref>
void check_unary(std::string_view name, F&& f, Ref&& ref, const dl::Tensor<T>& x, tolerance tol) {
    auto y = dl::eval(f(x));
    using R = typename decltype(y)::value_type;
    REQUIRE(y.shape() == x.shape());
    const auto xs = to_vector(x);
    check_elements(
        y, [&](std::size_t i) { return static_cast<double>(static_cast<R>(ref(xs[i]))); }, tol, name,
        [&](std::size_t i) { return "x=" + show(xs[i]); });
}

/// Checks f(a, b) against ref(a[i], b[i]) for same-shape a and b.
template <class A, class B, class F, class Ref>
void check_binary(std::string_view name, F&& f, Ref&& ref, const dl::Tensor<A>& a, const dl::Tensor<B>& b,
                  tolerance tol) {
    auto y = dl::eval(f(a, b));
    using R = typename decltype(y)::value_type;
    REQUIRE(y.shape() == a.shape());
    const auto as = to_vector(a);
    const auto bs = to_vector(b);
    check_elements(
        y, [&](std::size_t i) { return static_cast<double>(static_cast<R>(ref(as[i], bs[i]))); }, tol, name,
        [&](std::size_t i) { return "a=" + show(as[i]) + " b=" + show(bs[i]); });
}

/// The Context of the accuracy sweeps: results are compared down to the bottom of float's normal
/// range, where flushing denormal intermediates to zero (dl's default on compute threads) costs
/// relative precision, so this one does not flush.
inline dl::Context& exact_context() {
    static dl::Context c({.flush_denormals = false});
    return c;
}

/// check_unary on a pseudo-random input in [lo, hi] of every size in `sizes`.
template <class T, class F, class Ref>
void check_unary_sizes(std::string_view name, F&& f, Ref&& ref, double lo, double hi, tolerance tol,
                       double quantum = 0) {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        check_unary(name, f, ref, random<T>({n}, lo, hi, static_cast<std::uint64_t>(n) + 7, quantum, exact_context()),
                    tol);
    }
}

/// check_binary on pseudo-random inputs a in [lo_a, hi_a], b in [lo_b, hi_b] of every size in `sizes`.
template <class A, class B, class F, class Ref>
void check_binary_sizes(std::string_view name, F&& f, Ref&& ref, double lo_a, double hi_a, double lo_b, double hi_b,
                        tolerance tol, double quantum = 0) {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto seed = static_cast<std::uint64_t>(n) * 2;
        check_binary(name, f, ref, random<A>({n}, lo_a, hi_a, seed + 1, quantum, exact_context()),
                     random<B>({n}, lo_b, hi_b, seed + 2, quantum, exact_context()), tol);
    }
}

/// Same shape, same dtype and the same bytes in every element.
template <class T>
[[nodiscard]] bool bitwise_equal(const dl::Tensor<T>& a, const dl::Tensor<T>& b) {
    if (a.shape() != b.shape()) return false;
    const auto va = to_vector(a), vb = to_vector(b);
    if constexpr (std::is_same_v<T, bool>)
        return va == vb;
    else
        return va.empty() || std::memcmp(va.data(), vb.data(), va.size() * sizeof(T)) == 0;
}

/// Index of the first element whose bytes differ, or -1.
template <class T>
[[nodiscard]] std::int64_t first_difference(const dl::Tensor<T>& a, const dl::Tensor<T>& b) {
    const auto va = to_vector(a), vb = to_vector(b);
    for (std::size_t i = 0; i < std::min(va.size(), vb.size()); ++i)
        if (std::memcmp(&va[i], &vb[i], sizeof(T)) != 0) return static_cast<std::int64_t>(i);
    return va.size() == vb.size() ? -1 : static_cast<std::int64_t>(std::min(va.size(), vb.size()));
}

/// Element-wise comparison with NaN == NaN (and -0 == +0), for results that must match exactly in
/// value but may differ in NaN payload.
template <class T>
[[nodiscard]] bool same_values(const dl::Tensor<T>& a, const dl::Tensor<T>& b, tolerance tol = exact) {
    if (a.shape() != b.shape()) return false;
    const auto va = to_vector(a), vb = to_vector(b);
    for (std::size_t i = 0; i < va.size(); ++i)
        if (!matches(static_cast<double>(va[i]), static_cast<double>(vb[i]), tol)) return false;
    return true;
}

}  // namespace expr_test

/// A generic lambda calling dl function `f` on one operand (so one test body serves every op).
#define EXPR_UNARY(f) [](const auto& x_) { return f(x_); }
#define EXPR_BINARY(f) [](const auto& a_, const auto& b_) { return f(a_, b_); }
