#pragma once
// The reduction kernel: it consumes an expression without materialising it (the public, differentiable
// functions are in autograd/reduce.hpp). The reduced dimensions are moved
// innermost (a permutation of every operand's strides, no copy), then each output element folds its
// slice with an accumulator. Float data accumulates in double, so sums of 10^7 floats stay accurate.
// The split into work items depends only on the shapes, never on the thread count: results are
// bitwise identical for any number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../../expr/evaluator.hpp"
#include "elementwise.hpp"

namespace dl {

namespace detail {

template <class T>
using accumulate_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double,
                                        std::conditional_t<std::is_same_v<T, std::uint64_t>, T, std::int64_t>>;

/// Which dimensions of a rank-`rank` shape are reduced.
struct reduced_dims {
    bool mask[max_rank] = {};
    int count = 0;
};

inline reduced_dims parse_axes(const Dims& axes, int rank, std::string_view op) {
    reduced_dims r;
    if (axes.empty()) {  // all
        for (int d = 0; d < rank; ++d) r.mask[d] = true;
        r.count = rank;
        return r;
    }
    for (auto a : axes) {
        const int d = wrap_dim(a, rank, op);
        if (r.mask[d]) detail::fail("dl::", op, ": dimension ", d, " given twice in ", axes);
        r.mask[d] = true;
        ++r.count;
    }
    return r;
}

/// Calls acc.add(state, value, position) for every element of each output's slice (position counts within
/// the slice, row-major over the reduced dimensions), merges partial states in order and stores
/// acc.finish(state, count).
template <class Acc, class E>
[[nodiscard]] auto reduce(const E& e, const Dims& axes, bool keepdim, Acc acc, std::string_view op) {
    using R = typename Acc::result;
    using State = typename Acc::state;
    const Shape in_shape = shape_of(e);
    const int rank = in_shape.size();
    const reduced_dims red = parse_axes(axes, rank, op);
    const Context* scope_ctx = context_of(e);
    const op_scope scope(scope_ctx ? *scope_ctx : default_context(), "reduce", static_cast<double>(in_shape.numel()),
                               static_cast<double>(in_shape.numel() * std::int64_t(sizeof(value_t<E>))));

    Shape out_shape, kept_shape, red_shape;
    int order[max_rank], k = 0;
    for (int d = 0; d < rank; ++d) {
        if (!red.mask[d]) {
            order[k++] = d;
            kept_shape.push_back(in_shape[d]);
            out_shape.push_back(in_shape[d]);
        } else if (keepdim) {
            out_shape.push_back(1);
        }
    }
    for (int d = 0; d < rank; ++d)
        if (red.mask[d]) {
            order[k++] = d;
            red_shape.push_back(in_shape[d]);
        }
    Context* ctx = context_of(e);
    Tensor<R> out(out_shape, ctx ? *ctx : default_context());
    const std::int64_t outputs = kept_shape.numel(), length = red_shape.numel();
    if (outputs == 0) return out;
    if (length == 0) {
        if (!Acc::empty_ok) detail::fail("dl::", op, ": reduction over an empty dimension of shape ", in_shape);
        for (std::int64_t o = 0; o < outputs; ++o) out.data()[o] = acc.finish(acc.init(), 0);
        return out;
    }

    Context& context = out.context();
    if constexpr (is_tensor_v<E>) {
        // The leading dimensions of a contiguous tensor (a bias gradient, a column sum): rows folded one
        // after another into a block of column states, which vectorises; the generic fold below would
        // take one element at a time and seek before each. Each output still sees its values in
        // position order, so the result is the generic one, bit for bit.
        bool leading = e.is_contiguous() && red.count < rank;
        for (int d = 0; d < red.count; ++d) leading = leading && red.mask[d];
        if (leading) {
            constexpr std::int64_t columns = 256;  // states per block, on the stack
            const auto* in = e.data();
            context.parallel_for((outputs + columns - 1) / columns, [&](std::int64_t block) {
                const std::int64_t j0 = block * columns, n = std::min(columns, outputs - j0);
                State states[columns];
                for (std::int64_t j = 0; j < n; ++j) states[j] = acc.init();
                for (std::int64_t row = 0; row < length; ++row) {
                    const auto* values = in + row * outputs + j0;
                    for (std::int64_t j = 0; j < n; ++j) acc.add(states[j], static_cast<compute_t<value_t<E>>>(values[j]), row);
                }
                for (std::int64_t j = 0; j < n; ++j) out.data()[j0 + j] = acc.finish(states[j], length);
            });
            return out;
        }
    }

    // Iteration shape: kept dims, then reduced dims, then a unit inner row if there is no reduced dim.
    auto ev = make_eval(e, &in_shape);
    ev.for_each_strides([&](Strides& s) {
        Strides p;
        for (int i = 0; i < rank; ++i) p.push_back(s[order[i]]);
        if (red.count == 0) p.push_back(0);
        s = p;
    });
    Shape iter;
    for (int i = 0; i < rank; ++i) iter.push_back(in_shape[order[i]]);
    if (red.count == 0) iter.push_back(1);
    const int kept = rank - red.count, outer = iter.size() - 1;
    const std::int64_t inner = iter[outer];
    R* out_data = out.data();

    // Folds positions [begin, end) of output o's slice into s.
    auto fold = [&](auto& local, std::int64_t o, std::int64_t begin, std::int64_t end, State& s) {
        std::int64_t index[max_rank] = {};
        for (int d = kept - 1; d >= 0; --d) {
            index[d] = o % iter[d];
            o /= iter[d];
        }
        std::int64_t row = begin / inner, j = begin % inner;
        for (int d = outer - 1; d >= kept; --d) {
            index[d] = row % iter[d];
            row /= iter[d];
        }
        for (std::int64_t pos = begin; pos < end;) {
            local.seek(index, outer);
            const std::int64_t stop = std::min(inner, j + (end - pos));
            for (; j < stop; ++j, ++pos) acc.add(s, local.get(j), pos);
            j = 0;
            for (int d = outer - 1; d >= kept && ++index[d] == iter[d]; --d) index[d] = 0;
        }
    };

    constexpr std::int64_t block = std::int64_t{1} << 15;
    if (outputs == 1 && length > block) {
        // One output: fixed blocks of its slice in parallel, partial states merged in block order.
        constexpr std::int64_t max_blocks = 256;
        const std::int64_t size = std::max(block, (length + max_blocks - 1) / max_blocks);
        const std::int64_t blocks = (length + size - 1) / size;
        State partial[max_blocks];
        context.parallel_for(blocks, [&](std::int64_t b) {
            auto local = ev;
            partial[b] = acc.init();
            fold(local, 0, b * size, std::min(length, (b + 1) * size), partial[b]);
        });
        State s = partial[0];
        for (std::int64_t b = 1; b < blocks; ++b) acc.merge(s, partial[b]);
        out_data[0] = acc.finish(s, length);
        return out;
    }
    const std::int64_t per_chunk = std::max<std::int64_t>(1, block / std::max<std::int64_t>(length, 1));
    const std::int64_t chunks = (outputs + per_chunk - 1) / per_chunk;
    context.parallel_for(chunks, [&](std::int64_t c) {
        auto local = ev;
        for (std::int64_t o = c * per_chunk; o < std::min(outputs, (c + 1) * per_chunk); ++o) {
            State s = acc.init();
            fold(local, o, 0, length, s);
            out_data[o] = acc.finish(s, length);
        }
    });
    return out;
}

// --- accumulators: state, add one value, merge two partial states in order, finish ---

template <class T>
struct sum_acc {
    using result = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, std::int64_t>;
    using state = accumulate_t<T>;
    static constexpr bool empty_ok = true;
    static state init() { return 0; }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        s += static_cast<state>(v);
    }
    static void merge(state& a, state b) { a += b; }
    static result finish(state s, std::int64_t) { return static_cast<result>(s); }
};

template <class T>
struct mean_acc {
    using result = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, float>;
    using state = double;
    static constexpr bool empty_ok = false;
    static state init() { return 0; }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        s += static_cast<state>(v);
    }
    static void merge(state& a, state b) { a += b; }
    static result finish(state s, std::int64_t n) { return static_cast<result>(s / static_cast<double>(n)); }
};

template <class T>
struct prod_acc {
    using result = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, std::int64_t>;
    using state = accumulate_t<T>;
    static constexpr bool empty_ok = true;
    static state init() { return 1; }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        s *= static_cast<state>(v);
    }
    static void merge(state& a, state b) { a *= b; }
    static result finish(state s, std::int64_t) { return static_cast<result>(s); }
};

/// max (Greater) or min; NaN wins, as in PyTorch.
template <class T, bool Greater>
struct extreme_acc {
    using result = T;
    using C = compute_t<T>;
    using state = C;
    static constexpr bool empty_ok = false;
    static state init() {
        if constexpr (std::numeric_limits<C>::has_infinity)
            return Greater ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
        else
            return Greater ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
    }
    static void take(state& s, C v) {
        if (v != v || (Greater ? v > s : v < s)) s = s != s ? s : v;
    }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        take(s, static_cast<C>(v));
    }
    static void merge(state& a, state b) { take(a, b); }
    static result finish(state s, std::int64_t) { return static_cast<result>(s); }
};

/// Index of the first max (Greater) or min within the slice; the first NaN wins.
template <class T, bool Greater>
struct arg_extreme_acc {
    using result = std::int64_t;
    using C = compute_t<T>;
    struct state {
        C value;
        std::int64_t index;
    };
    static constexpr bool empty_ok = false;
    static state init() { return {extreme_acc<T, Greater>::init(), -1}; }
    static void take(state& s, state v) {
        if (s.index < 0) {
            s = v;
            return;
        }
        if (s.value != s.value) return;
        if (v.value != v.value || (Greater ? v.value > s.value : v.value < s.value)) s = v;
    }
    template <class V>
    void add(state& s, V v, std::int64_t pos) const {
        take(s, {static_cast<C>(v), pos});
    }
    static void merge(state& a, state b) { take(a, b); }
    static result finish(state s, std::int64_t) { return s.index; }
};

/// Welford's running mean and sum of squared deviations; merged with Chan's formula.
template <class T>
struct moments_acc {
    using result = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, float>;
    struct state {
        double n = 0, mean = 0, m2 = 0;
    };
    static constexpr bool empty_ok = false;
    double correction = 1;
    bool take_sqrt = false;
    static state init() { return {}; }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        const double x = static_cast<double>(v);
        s.n += 1;
        const double delta = x - s.mean;
        s.mean += delta / s.n;
        s.m2 += delta * (x - s.mean);
    }
    static void merge(state& a, const state& b) {
        if (b.n == 0) return;
        const double n = a.n + b.n, delta = b.mean - a.mean;
        a.mean += delta * b.n / n;
        a.m2 += b.m2 + delta * delta * a.n * b.n / n;
        a.n = n;
    }
    result finish(const state& s, std::int64_t) const {
        const double var = s.m2 / std::max(0.0, s.n - correction);
        return static_cast<result>(take_sqrt ? std::sqrt(var) : var);
    }
};

/// p-norm: p = 2 (default), 1, inf, or any positive p.
template <class T>
struct norm_acc {
    using result = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, float>;
    using state = double;
    static constexpr bool empty_ok = true;
    double p = 2;
    static state init() { return 0; }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        const double a = std::fabs(static_cast<double>(v));
        if (std::isinf(p))
            s = (a != a || a > s) ? a : s;
        else if (p == 2)
            s += a * a;
        else if (p == 1)
            s += a;
        else
            s += std::pow(a, p);
    }
    void merge(state& a, state b) const {
        if (std::isinf(p))
            a = (b != b || b > a) ? b : a;
        else
            a += b;
    }
    result finish(state s, std::int64_t) const {
        if (std::isinf(p) || p == 1) return static_cast<result>(s);
        return static_cast<result>(p == 2 ? std::sqrt(s) : std::pow(s, 1 / p));
    }
};

/// log(sum(exp(x))), stable: a running max and a sum of exp(x - max), rescaled when the max grows.
template <class T>
struct logsumexp_acc {
    using result = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, float>;
    struct state {
        double max = -std::numeric_limits<double>::infinity(), sum = 0;
    };
    static constexpr bool empty_ok = true;
    static state init() { return {}; }
    static void take(state& s, double m, double sum) {
        if (m != m || s.max != s.max) {
            s.max = std::numeric_limits<double>::quiet_NaN();
            return;
        }
        if (m == -std::numeric_limits<double>::infinity()) return;
        if (m > s.max) {
            s.sum = s.sum * std::exp(s.max - m) + sum;
            s.max = m;
        } else {
            s.sum += sum * std::exp(m - s.max);
        }
    }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        take(s, static_cast<double>(v), 1.0);
    }
    static void merge(state& a, const state& b) { take(a, b.max, b.sum); }
    static result finish(const state& s, std::int64_t) {
        if (s.max != s.max) return static_cast<result>(s.max);
        if (std::isinf(s.max)) return static_cast<result>(s.max);
        return static_cast<result>(s.max + std::log(s.sum));
    }
};

template <bool Any>
struct any_all_acc {
    using result = bool;
    using state = bool;
    static constexpr bool empty_ok = true;
    static state init() { return !Any; }
    template <class V>
    void add(state& s, V v, std::int64_t) const {
        s = Any ? (s || static_cast<bool>(v)) : (s && static_cast<bool>(v));
    }
    static void merge(state& a, state b) { a = Any ? (a || b) : (a && b); }
    static result finish(state s, std::int64_t) { return s; }
};

}  // namespace detail

}  // namespace dl
