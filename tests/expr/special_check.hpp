#pragma once
// Tables of special inputs (NaN, infinities, zeros) and their expected results, checked on the SIMD
// path (contiguous operands) and the scalar path (strided operands).
#include "check.hpp"

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

namespace expr_test {

struct unary_special {
    double x, want;
};
struct binary_special {
    double a, b, want;
};

/// Repeats the items until there are at least 19 (a full float batch, full double batches and a tail).
template <class Item>
std::vector<Item> padded(const std::vector<Item>& items) {
    std::vector<Item> out;
    while (out.size() < 19)
        for (const auto& c : items) out.push_back(c);
    return out;
}

template <class T, class F>
void check_specials(std::string_view name, F&& f, const std::vector<unary_special>& cases,
                    tolerance tol = transcendental<T>) {
    const auto all = padded(cases);
    std::vector<double> xs;
    for (const auto& c : all) xs.push_back(c.x);
    for (const bool strided : {false, true}) {
        CAPTURE(strided);
        const auto x = strided ? spread(from_values<T>(xs)) : from_values<T>(xs);
        const auto y = dl::eval(f(x));
        using R = typename decltype(y)::value_type;
        check_elements(
            y, [&](std::size_t i) { return static_cast<double>(static_cast<R>(all[i].want)); }, tol, name,
            [&](std::size_t i) { return "x=" + show(static_cast<T>(all[i].x)); });
    }
}

template <class T, class F>
void check_binary_specials(std::string_view name, F&& f, const std::vector<binary_special>& cases,
                    tolerance tol = transcendental<T>) {
    const auto all = padded(cases);
    std::vector<double> as, bs;
    for (const auto& c : all) {
        as.push_back(c.a);
        bs.push_back(c.b);
    }
    for (const bool strided : {false, true}) {
        CAPTURE(strided);
        const auto a = strided ? spread(from_values<T>(as)) : from_values<T>(as);
        const auto b = strided ? spread(from_values<T>(bs)) : from_values<T>(bs);
        const auto y = dl::eval(f(a, b));
        using R = typename decltype(y)::value_type;
        check_elements(
            y, [&](std::size_t i) { return static_cast<double>(static_cast<R>(all[i].want)); }, tol, name,
            [&](std::size_t i) {
                return "a=" + show(static_cast<T>(all[i].a)) + " b=" + show(static_cast<T>(all[i].b));
            });
    }
}

constexpr double pi = std::numbers::pi;

}  // namespace expr_test
