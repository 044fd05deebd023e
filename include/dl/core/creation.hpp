#pragma once
// Factory functions. Every one takes the Context last (default: default_context()).
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "random.hpp"
#include "tensor.hpp"

namespace dl {

/// Uninitialised elements.
template <element T>
[[nodiscard]] Tensor<T> empty(const Shape& shape, Context& ctx = default_context()) {
    return Tensor<T>(shape, ctx);
}
/// `value` rounded once to T (a 16-bit float takes the value as a double, as float takes one).
template <element T>
[[nodiscard]] Tensor<T> full(const Shape& shape, std::conditional_t<is_half_float<T>, double, T> value,
                             Context& ctx = default_context()) {
    Tensor<T> t(shape, ctx);
    std::fill_n(t.data(), t.numel(), static_cast<T>(value));
    return t;
}
template <element T>
[[nodiscard]] Tensor<T> zeros(const Shape& shape, Context& ctx = default_context()) {
    return full<T>(shape, T(0), ctx);
}
template <element T>
[[nodiscard]] Tensor<T> ones(const Shape& shape, Context& ctx = default_context()) {
    return full<T>(shape, T(1), ctx);
}
/// A rank-0 tensor.
template <element T>
[[nodiscard]] Tensor<T> scalar_tensor(T value, Context& ctx = default_context()) {
    return full<T>({}, value, ctx);
}

namespace detail {
template <class T, class List>
void flatten_nested(const List& list, int depth, Shape& shape, std::vector<T>& out) {
    if (depth == shape.size()) shape.push_back(static_cast<std::int64_t>(list.size()));
    else if (shape[depth] != static_cast<std::int64_t>(list.size()))
        detail::fail("dl::tensor: ragged nested list: dimension ", depth, " has extents ", shape[depth], " and ",
                     list.size());
    for (const auto& item : list) {
        if constexpr (std::is_convertible_v<decltype(item), T>)
            out.push_back(static_cast<T>(item));
        else
            flatten_nested<T>(item, depth + 1, shape, out);
    }
}
template <class T, int Depth>
struct nested {
    using type = std::initializer_list<typename nested<T, Depth - 1>::type>;
};
template <class T>
struct nested<T, 1> {
    using type = std::initializer_list<T>;
};
template <element T, class List>
Tensor<T> from_nested(const List& values, Context& ctx) {
    Shape shape;
    std::vector<T> flat;
    flatten_nested<T>(values, 0, shape, flat);
    Tensor<T> t(shape, ctx);
    std::copy(flat.begin(), flat.end(), t.data());
    return t;
}
}  // namespace detail

/// A tensor from nested braces: dl::tensor<float>({{1, 2}, {3, 4}}) has shape [2, 2].
template <element T>
[[nodiscard]] Tensor<T> tensor(typename detail::nested<T, 1>::type v, Context& ctx = default_context()) {
    return detail::from_nested<T>(v, ctx);
}
template <element T>
[[nodiscard]] Tensor<T> tensor(typename detail::nested<T, 2>::type v, Context& ctx = default_context()) {
    return detail::from_nested<T>(v, ctx);
}
template <element T>
[[nodiscard]] Tensor<T> tensor(typename detail::nested<T, 3>::type v, Context& ctx = default_context()) {
    return detail::from_nested<T>(v, ctx);
}
template <element T>
[[nodiscard]] Tensor<T> tensor(typename detail::nested<T, 4>::type v, Context& ctx = default_context()) {
    return detail::from_nested<T>(v, ctx);
}

/// start, start + step, ... < stop (as Python's range, for any sign of step).
template <element T>
[[nodiscard]] Tensor<T> arange(double start, double stop, double step = 1, Context& ctx = default_context()) {
    if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
        detail::fail("dl::arange: bad range start=", start, " stop=", stop, " step=", step);
    const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((stop - start) / step)));
    Tensor<T> t({n}, ctx);
    for (std::int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<T>(start + static_cast<double>(i) * step);
    return t;
}
template <element T>
[[nodiscard]] Tensor<T> arange(double stop, Context& ctx = default_context()) {
    return arange<T>(0, stop, 1, ctx);
}
/// `count` evenly spaced values from start to stop, both included.
template <element T>
[[nodiscard]] Tensor<T> linspace(double start, double stop, std::int64_t count, Context& ctx = default_context()) {
    if (count < 0) detail::fail("dl::linspace: negative count ", count);
    Tensor<T> t({count}, ctx);
    const double step = count > 1 ? (stop - start) / static_cast<double>(count - 1) : 0;
    for (std::int64_t i = 0; i < count; ++i)
        t.data()[i] = static_cast<T>(i == count - 1 && count > 1 ? stop : start + static_cast<double>(i) * step);
    return t;
}

namespace detail {
template <element T, class Draw>
Tensor<T> random_tensor(const Shape& shape, Context& ctx, Draw draw) {
    Tensor<T> t(shape, ctx);
    const std::int64_t n = t.numel();
    const std::uint64_t seed = ctx.seed(), offset = ctx.reserve_random(static_cast<std::uint64_t>(n));
    constexpr std::int64_t chunk = 1 << 14;  // fixed: values never depend on the thread count
    T* data = t.data();
    ctx.parallel_for((n + chunk - 1) / chunk, [&](std::int64_t c) {
        for (std::int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i)
            data[i] = static_cast<T>(draw(seed, offset + static_cast<std::uint64_t>(i)));
    });
    return t;
}
}  // namespace detail

/// Uniform in [low, high), from the Context's counter-based stream.
template <element T>
[[nodiscard]] Tensor<T> uniform(const Shape& shape, double low = 0, double high = 1, Context& ctx = default_context()) {
    return detail::random_tensor<T>(shape, ctx, [=](std::uint64_t seed, std::uint64_t i) {
        const double u = low + (high - low) * detail::uniform_at(seed, i);
        if constexpr (is_floating_element<T>) {
            using std::nextafter;  // and dl's, for the 16-bit floats
            const T v = static_cast<T>(u);  // rounding to T may reach `high`
            return v >= static_cast<T>(high) && high > low ? nextafter(static_cast<T>(high), static_cast<T>(low)) : v;
        } else {
            return static_cast<T>(std::floor(u));  // integers: each of [low, high) equally likely
        }
    });
}
/// Normal with the given mean and standard deviation.
template <element T>
[[nodiscard]] Tensor<T> normal(const Shape& shape, double mean = 0, double stddev = 1, Context& ctx = default_context()) {
    return detail::random_tensor<T>(shape, ctx, [=](std::uint64_t seed, std::uint64_t i) {
        return mean + stddev * detail::normal_at(seed, i);
    });
}

}  // namespace dl
