#pragma once
// The CPU executor for elementwise expressions: `assign(out, expr)` runs one loop over out's
// elements. Shapes are broadcast once; dimensions that are contiguous for every operand are merged, so
// same-shape contiguous operands become one flat SIMD loop; anything else runs row by row (SIMD where
// every operand's innermost stride is 0 or 1, scalar otherwise). Large loops are split over the
// Context's executor. Every element is computed by the same code whatever the split (tails use partial
// batches, not a scalar loop), so 1 and N threads give bitwise identical results.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "../../expr/evaluator.hpp"
#include "../../core/op_scope.hpp"

namespace dl {

namespace detail {

/// Work (elements x op cost) below which threads cost more than they save.
inline constexpr std::int64_t parallel_threshold_work = std::int64_t{1} << 16;

/// How many threads an elementwise loop of `work` (elements x op cost) is worth: one below
/// parallel_threshold_work, then one more per half of it, up to `threads`.
[[nodiscard]] inline std::int64_t parallel_chunks(std::int64_t work, int threads) noexcept {
    if (threads <= 1 || work < parallel_threshold_work) return 1;
    return std::min<std::int64_t>(threads, work / (parallel_threshold_work / 2));
}

/// Elements per chunk when n elements are split into `chunks`: a multiple of 64, so every chunk but the
/// last starts and ends on whole cache lines and SIMD batches, whatever the element type.
[[nodiscard]] inline std::int64_t chunk_length(std::int64_t n, std::int64_t chunks) noexcept {
    return ((n + chunks - 1) / chunks + 63) & ~std::int64_t{63};
}

/// Byte range [lo, hi) that a tensor's elements span.
template <class T>
[[nodiscard]] std::pair<std::uintptr_t, std::uintptr_t> byte_span(const Tensor<T>& t) {
    auto lo = reinterpret_cast<std::uintptr_t>(t.data()), hi = lo;
    if (t.numel() == 0) return {lo, lo};
    for (int d = 0; d < t.rank(); ++d) {
        const std::int64_t reach = (t.shape()[d] - 1) * t.strides()[d] * static_cast<std::int64_t>(sizeof(T));
        (reach < 0 ? lo : hi) += static_cast<std::uintptr_t>(reach);
    }
    return {lo, hi + sizeof(T)};
}

/// Reading `in` while writing `out` element by element is only safe when `in` either does not touch
/// out's memory or reads exactly the element being written.
template <class T, class U>
[[nodiscard]] bool reads_ahead_of_write(const Tensor<U>& in, const Tensor<T>& out) {
    const auto [in_lo, in_hi] = byte_span(in);
    const auto [out_lo, out_hi] = byte_span(out);
    if (in_hi <= out_lo || out_hi <= in_lo) return false;
    if constexpr (std::is_same_v<T, U>)
        return !(in.data() == out.data() && broadcast_strides(in, out.shape()) == out.strides());
    return true;
}

/// Merges adjacent dimensions that are contiguous with each other for every operand and drops
/// size-1 dimensions; leaves at least one dimension.
template <class Eval>
void coalesce(Shape& shape, Strides& out_strides, Eval& ev) {
    auto drop = [&](int d) {
        shape.erase(d);
        out_strides.erase(d);
        ev.for_each_strides([d](Strides& s) { s.erase(d); });
    };
    for (int d = shape.size() - 1; d >= 0; --d)
        if (shape[d] == 1) drop(d);
    for (int d = shape.size() - 2; d >= 0; --d) {
        bool mergeable = out_strides[d] == out_strides[d + 1] * shape[d + 1];
        ev.for_each_strides([&](const Strides& s) { mergeable = mergeable && s[d] == s[d + 1] * shape[d + 1]; });
        if (!mergeable) continue;
        shape[d] *= shape[d + 1];
        out_strides[d] = out_strides[d + 1];
        ev.for_each_strides([d](Strides& s) { s[d] = s[d + 1]; });
        shape.erase(d + 1);
        out_strides.erase(d + 1);
        ev.for_each_strides([d](Strides& s) { s.erase(d + 1); });
    }
    if (shape.empty()) {
        shape.push_back(1);
        out_strides.push_back(1);
        ev.for_each_strides([](Strides& s) { s.push_back(0); });
    }
}

// Two loops per expression type, not one per operand layout: every instantiated loop inlines the whole
// chain, and an expression is instantiated forward, backward and traced, so each extra variant costs
// every file that writes one ~0.4 s of g++. A SIMD operand whose inner stride is 0 (broadcast) or 1 picks
// its load at run time, a branch the predictor gets right after the first batch.
enum class row_kernel { scalar, simd };

/// How run_row writes e[j]: a store; an add into out[j] (computed in the compute type and rounded
/// once, as the expression out + e would be); or a streaming store (see streams()). A run-time choice,
/// so that gradient accumulation and large outputs reuse the loop of a plain write instead of
/// instantiating others.
enum class store_mode { write, accumulate, stream };

/// out[j] = e[j] (or out[j] += e[j], see store_mode) for j in [j, end) of one row.
template <row_kernel Kind, class T, class Eval>
DL_INLINE void run_row(T* out, std::int64_t out_stride, const Eval& ev, std::int64_t j, std::int64_t end, store_mode mode) {
    using C = compute_t<T>;
    const bool accumulate = mode == store_mode::accumulate;
    if constexpr (Kind == row_kernel::scalar) {
        for (; j < end; ++j) {
            T& o = out[j * out_stride];
            o = accumulate ? static_cast<T>(static_cast<C>(o) + static_cast<C>(ev.get(j))) : static_cast<T>(ev.get(j));
        }
    }
#ifndef DL_NO_SIMD
    else if constexpr (std::is_same_v<T, bool>) {  // a comparison's masks; assign() refuses to add into bool
        constexpr int W = simd::width<typename simd_lane<Eval>::type>;
        for (; j + W <= end; j += W) simd::store_mask(out + j, ev.load(j));
        if (j < end) {
            alignas(64) bool buf[W];
            simd::store_mask(buf, ev.load_partial(j, end - j));
            std::copy_n(buf, end - j, out + j);
        }
    } else {
        constexpr int W = simd::width<C>;
        auto partial = [&](std::int64_t n) {
            alignas(64) C buf[W];
            ev.load_partial(j, n).store_aligned(buf);
            for (std::int64_t k = 0; k < n; ++k)
                out[j + k] = accumulate ? static_cast<T>(static_cast<C>(out[j + k]) + buf[k]) : static_cast<T>(buf[k]);
            j += n;
        };
        for (; j + W <= end; j += W) {
            auto v = ev.load(j);
            if (accumulate) v += simd::load_compute(out + j);
            if constexpr (std::is_same_v<T, C>)
                if (mode == store_mode::stream) {
                    simd::store_stream(out + j, v);
                    continue;
                }
            simd::store_compute(out + j, v);
        }
        if (j < end) partial(end - j);
    }
#endif
}

/// Evaluates elements [begin, end) of the flattened (coalesced) output.
template <row_kernel Kind, class T, class Eval>
void run_range(T* out, const Shape& shape, const Strides& out_strides, const Eval& shared, std::int64_t begin,
               std::int64_t end, store_mode mode) {
    // A local copy the compiler can keep in registers: stores through `out` cannot alias it.
    Eval ev = shared;
    const int outer = shape.size() - 1;
    const std::int64_t inner = shape[outer];
    std::int64_t index[max_rank] = {};
    std::int64_t row = begin / inner, j = begin % inner;
    for (int d = outer - 1; d >= 0; --d) {
        index[d] = row % shape[d];
        row /= shape[d];
    }
    while (begin < end) {
        ev.seek(index, outer);
        T* out_row = out;
        for (int d = 0; d < outer; ++d) out_row += index[d] * out_strides[d];
        const std::int64_t stop = std::min(inner, j + (end - begin));
        run_row<Kind>(out_row, out_strides[outer], ev, j, stop, mode);
        begin += stop - j;
        j = 0;
        for (int d = outer - 1; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
    }
#ifndef DL_NO_SIMD
    if (mode == store_mode::stream) simd::stream_fence();  // before parallel_for's join publishes out
#endif
}

/// Bytes of the last-level cache: what Linux's sysfs says for the L3 of cpu0, else 32 MiB.
/// (glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) says 320 MiB for this 32 MiB L3 under a hypervisor.)
[[nodiscard]] inline std::int64_t last_level_cache_bytes() {
    static const std::int64_t bytes = [] {
        long long size = 0;
        char unit = 0;
        if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
            if (std::fscanf(f, "%lld%c", &size, &unit) < 1) size = 0;
            std::fclose(f);
        }
        if (size <= 0) return std::int64_t{32} << 20;
        return static_cast<std::int64_t>(size) << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
    }();
    return bytes;
}

/// Whether an output written as one row of n elements from `out` takes streaming stores: a float or
/// double output larger than the last-level cache, from a batch-aligned start. Its lines leave the
/// cache before anyone reads them, and a streaming store does not read each line in before writing it
/// (a quarter less memory traffic for the chain x, y, z -> out). Smaller outputs stay cached for the
/// op that reads them next.
template <class T>
[[nodiscard]] bool streams([[maybe_unused]] const T* out, [[maybe_unused]] std::int64_t n) {
#ifndef DL_NO_SIMD
    if constexpr (simd::has_batch<T>)
        return n * static_cast<std::int64_t>(sizeof(T)) > last_level_cache_bytes() &&
               reinterpret_cast<std::uintptr_t>(out) % (sizeof(T) * simd::width<T>) == 0;
#endif
    return false;
}

/// Runs evaluator `ev` of expression E over out's elements, laid out as `shape` (coalesced) with
/// `out_strides`: the SIMD rows when every operand's inner stride allows, split over the threads when
/// large.
/// Not inlined: evaluate_into and evaluate_flat share it, and inlined into both, its loops (the bulk of
/// an expression's code) would be compiled twice.
template <class E, class T, class Eval>
[[gnu::noinline]] void run_evaluator(Tensor<T>& out, const Shape& shape, const Strides& out_strides, Eval& ev,
                                     bool accumulate) {
    const std::int64_t n = out.numel();
    auto run = [&]<row_kernel Kind>(store_mode mode) {
        const std::int64_t chunks = parallel_chunks(n * (cost_of<E> + 1), out.context().concurrency());
        if (chunks == 1) {
            run_range<Kind>(out.data(), shape, out_strides, ev, 0, n, mode);
            return;
        }
        // Chunks are whole batches (chunk_length), so a streaming row stays aligned in every chunk.
        const std::int64_t chunk = chunk_length(n, chunks);
        out.context().parallel_for(chunks, [&](std::int64_t i) {
            const std::int64_t begin = std::min(n, i * chunk), end = std::min(n, begin + chunk);
            if (begin < end) run_range<Kind>(out.data(), shape, out_strides, ev, begin, end, mode);
        });
    };
    const store_mode write = accumulate ? store_mode::accumulate : store_mode::write;

    if constexpr (vectorizes_into<Eval, T>) {
        bool simd = out_strides.back() == 1;
        ev.for_each_strides([&](const Strides& s) { simd = simd && (s.back() == 0 || s.back() == 1); });
        if (simd) {
            const bool stream = !accumulate && shape.size() == 1 && streams(out.data(), n);
            return run.template operator()<row_kernel::simd>(stream ? store_mode::stream : write);
        }
    }
    run.template operator()<row_kernel::scalar>(write);
}

/// out = e, or out += e when `accumulate` (see run_row).
template <class T, class E>
void evaluate_into(Tensor<T>& out, const E& e, bool accumulate = false) {
    if (out.numel() == 0) return;
    Shape shape = out.shape();
    Strides out_strides = out.strides();
    auto ev = make_eval(e, &shape);
    coalesce(shape, out_strides, ev);
    run_evaluator<E>(out, shape, out_strides, ev, accumulate);
}

/// evaluate_into for a contiguous `out` whose shape every tensor operand of e has, contiguous too:
/// one flat row, without the broadcasting and merging of dimensions that evaluate_into works out.
/// The same loop and the same bits; at a few dozen elements (a batch-1 layer) that set-up costs more
/// than the arithmetic.
template <class T, class E>
void evaluate_flat(Tensor<T>& out, const E& e, bool accumulate) {
    const std::int64_t n = out.numel();
    if (n == 0) return;
    auto ev = make_eval(e, nullptr);
    run_evaluator<E>(out, Shape{n}, Strides{1}, ev, accumulate);
}

/// The shape of every tensor operand of e when they all have that one shape and are contiguous (then
/// it is e's shape, and e can run flat); null otherwise, or when e has no tensor operand.
template <class E>
[[nodiscard]] const Shape* flat_shape(const E& e) {
    const Shape* shape = nullptr;
    bool flat = true;
    for_each_tensor(e, [&](const auto& t) {
        if (!shape) shape = &t.shape();
        flat = flat && t.shape() == *shape && t.is_contiguous();
    });
    return flat ? shape : nullptr;
}

}  // namespace detail

/// Writes expression (or number) `e` into `out`, broadcasting it to out's shape; a null `out` is
/// allocated with the expression's shape. Operands that overlap `out` in any way other than reading
/// exactly the element being written are evaluated through a temporary first. With `accumulate`,
/// adds e into the defined `out` instead (out + e rounded once, in the loop that would write e).
template <class T, class E>
void assign(Tensor<T>& out, E&& e, bool accumulate = false) {
    if (std::is_same_v<T, bool> && accumulate) detail::fail("dl::assign: cannot add into a bool tensor");
    if constexpr (!expression<E>) {
        static_assert(scalar<E> || std::is_same_v<std::remove_cvref_t<E>, bool>,
                      "dl: only a Tensor, an expression or a number can be assigned to a Tensor");
        if (!out.defined()) detail::fail("dl::assign: cannot write a number into a null tensor (it has no shape)");
        detail::evaluate_into(out, scalar_node<T>{{}, static_cast<T>(e)}, accumulate);
    } else {
        // Operands all contiguous and of out's shape (the common case) need no broadcasting.
        const Shape* common = detail::flat_shape(e);
        const bool flat = common && (!out.defined() || (out.shape() == *common && out.is_contiguous()));
        const Shape shape = flat ? *common : shape_of(e);
        if (!out.defined()) {
            if (accumulate) detail::fail("dl::assign: cannot add into a null tensor (it has no values)");
            Context* ctx = context_of(e);
            out = Tensor<T>(shape, ctx ? *ctx : default_context());
        } else if (shape != out.shape() && broadcast_shapes(out.shape(), shape, "assign") != out.shape()) {
            detail::fail("dl::assign: cannot write an expression of shape ", shape, " into a tensor of shape ",
                         out.shape());
        }
        using X = std::remove_cvref_t<E>;
        const auto n = static_cast<double>(out.numel());
        const op_scope scope(out.context(), expression_name<X>, n * op_count<X>,
                                   n * static_cast<double>(sizeof(T) * (leaf_count<X> + 1 + accumulate)));
        bool alias = false;
        if (flat) {
            // Same shapes, all contiguous: an operand overlaps out unless it is out itself, element for element.
            const auto* lo = reinterpret_cast<const std::byte*>(out.data());
            const auto* hi = lo + out.numel() * static_cast<std::int64_t>(sizeof(T));
            detail::for_each_tensor(e, [&]<class U>(const Tensor<U>& t) {
                const auto* t_lo = reinterpret_cast<const std::byte*>(t.data());
                const auto* t_hi = t_lo + t.numel() * static_cast<std::int64_t>(sizeof(U));
                alias = alias || (t_lo < hi && lo < t_hi && !(std::is_same_v<T, U> && t_lo == lo));
            });
        } else {
            detail::for_each_tensor(e, [&](const auto& t) { alias = alias || detail::reads_ahead_of_write(t, out); });
        }
        if (alias) {
            Tensor<value_t<E>> tmp(shape, out.context());
            detail::evaluate_into(tmp, e);
            detail::evaluate_into(out, tmp, accumulate);
        } else if (flat) {
            detail::evaluate_flat(out, e, accumulate);
        } else {
            detail::evaluate_into(out, e, accumulate);
        }
    }
}

}  // namespace dl
