#pragma once
// A scalar reference for reductions: gathers each output's slice (row-major over the reduced
// dimensions, as argmax counts positions) and folds it in double precision.
#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

namespace expr_test {

struct reference_result {
    dl::Shape shape;
    std::vector<double> values;
};

/// The slices of x (row-major values of `shape`) for every output of a reduction over `axes` (empty:
/// all; negative axes count from the end), folded by `fold`.
inline reference_result reduce_reference(const std::vector<double>& x, const dl::Shape& shape, std::vector<int> axes,
                                         bool keepdim, const std::function<double(const std::vector<double>&)>& fold) {
    const int rank = shape.size();
    std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
    for (int a : axes) reduced[static_cast<std::size_t>(a < 0 ? a + rank : a)] = true;
    reference_result r;
    dl::Shape kept;
    for (int d = 0; d < rank; ++d) {
        if (!reduced[static_cast<std::size_t>(d)]) {
            kept.push_back(shape[d]);
            r.shape.push_back(shape[d]);
        } else if (keepdim) {
            r.shape.push_back(1);
        }
    }
    std::vector<std::vector<double>> slices(static_cast<std::size_t>(kept.numel()));
    std::size_t flat = 0;
    dl_test::for_each_index(shape, [&](const std::int64_t* index) {
        std::int64_t out = 0;
        for (int d = 0; d < rank; ++d)
            if (!reduced[static_cast<std::size_t>(d)]) out = out * shape[d] + index[d];
        slices[static_cast<std::size_t>(out)].push_back(x[flat++]);
    });
    for (const auto& s : slices) r.values.push_back(fold(s));
    return r;
}

// --- folds, in double ---

inline double ref_sum(const std::vector<double>& v) {
    long double s = 0;
    for (double x : v) s += x;
    return static_cast<double>(s);
}
inline double ref_mean(const std::vector<double>& v) { return ref_sum(v) / static_cast<double>(v.size()); }
inline double ref_prod(const std::vector<double>& v) {
    long double p = 1;
    for (double x : v) p *= x;
    return static_cast<double>(p);
}
/// NaN wins, as in PyTorch.
inline double ref_max(const std::vector<double>& v) {
    double m = -inf;
    for (double x : v) {
        if (std::isnan(x)) return x;
        m = std::max(m, x);
    }
    return m;
}
inline double ref_min(const std::vector<double>& v) {
    double m = inf;
    for (double x : v) {
        if (std::isnan(x)) return x;
        m = std::min(m, x);
    }
    return m;
}
/// Index of the first maximum (the first NaN if any).
inline double ref_argmax(const std::vector<double>& v) {
    std::size_t best = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(v[i])) return static_cast<double>(i);
        if (v[i] > v[best]) best = i;
    }
    return static_cast<double>(best);
}
inline double ref_argmin(const std::vector<double>& v) {
    std::size_t best = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(v[i])) return static_cast<double>(i);
        if (v[i] < v[best]) best = i;
    }
    return static_cast<double>(best);
}
inline double ref_var(const std::vector<double>& v, double correction) {
    const double m = ref_mean(v);
    long double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return static_cast<double>(s) / (static_cast<double>(v.size()) - correction);
}
inline double ref_norm(const std::vector<double>& v, double p) {
    if (std::isinf(p)) {
        double m = 0;
        for (double x : v) {
            if (std::isnan(x)) return x;
            m = std::max(m, std::fabs(x));
        }
        return m;
    }
    long double s = 0;
    for (double x : v) s += std::pow(std::fabs(static_cast<long double>(x)), static_cast<long double>(p));
    return static_cast<double>(std::pow(s, 1 / static_cast<long double>(p)));
}
inline double ref_logsumexp(const std::vector<double>& v) {
    const double m = ref_max(v);
    if (std::isnan(m) || std::isinf(m)) return m;
    long double s = 0;
    for (double x : v) s += std::exp(static_cast<long double>(x - m));
    return m + static_cast<double>(std::log(s));
}
inline double ref_any(const std::vector<double>& v) {
    return std::any_of(v.begin(), v.end(), [](double x) { return x != 0; });
}
inline double ref_all(const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return x != 0; });
}

/// Checks a reduction's result (shape and values, rounded to its type) against the reference.
template <class R>
void check_reduction(const dl::Tensor<R>& got, const reference_result& want, tolerance tol, std::string_view what) {
    INFO(what, ": got shape ", dl_test::to_string(got.shape()), ", want ", dl_test::to_string(want.shape));
    REQUIRE(got.shape() == want.shape);
    check_elements(
        got, [&](std::size_t i) { return static_cast<double>(static_cast<R>(want.values[i])); }, tol, what,
        [](std::size_t i) { return "output " + std::to_string(i); });
}

template <class T>
std::vector<double> as_doubles(const dl::Tensor<T>& t) {
    const auto v = to_vector(t);
    return {v.begin(), v.end()};
}

}  // namespace expr_test
