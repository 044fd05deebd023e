#pragma once
// Evaluators: how one element, or one SIMD batch, of an expression is computed. An evaluator tree
// mirrors the expression tree, with every tensor operand's strides aligned to the output shape
// (stride 0 where it broadcasts). Loops (device/) move the evaluator along rows: seek() to a row,
// then get(j) / load(j) for elements j of it.
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "expression.hpp"

namespace dl::detail {

/// Strides of `t` viewed as shape `out` (numpy broadcasting; the shapes were checked already).
template <class T>
[[nodiscard]] Strides broadcast_strides(const Tensor<T>& t, const Shape& out) {
    Strides s = Dims::filled(out.size(), 0);
    const int lead = out.size() - t.rank();
    for (int i = 0; i < t.rank(); ++i) s[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
    return s;
}

/// An operand and the output shape its evaluator reads it for (numpy broadcasting); a null shape reads
/// it flat: every tensor operand is contiguous and of the output's shape, one row in memory order, with
/// no broadcasting to work out. Evaluators are constructed from one in place, so a tree of them is built
/// without copying every leaf's strides (a Dims each) through each level above it — at a few dozen
/// elements that copying cost more than the loop.
template <class Operand>
struct eval_source {
    const Operand& operand;
    const Shape* shape;
};

/// One row of a leaf already in memory: `data` read with stride 1, or its first element broadcast
/// (stride 0). Graph tiles (autograd/elementwise.hpp) build their evaluators from these.
template <class T>
struct row_source {
    const T* data;
    bool broadcast;
};

template <class T>
struct leaf_eval {
    using compute = compute_t<T>;
    const T* base;
    Strides strides;
    const T* row = nullptr;
    std::int64_t inner = 0;

    leaf_eval(const T* data, const Strides& s) noexcept : base(data), strides(s) {}
    explicit leaf_eval(eval_source<Tensor<T>> s) : base(s.operand.data()), strides(strides_for(s.operand, s.shape)) {}
    explicit leaf_eval(row_source<T> s) noexcept : base(s.data), strides{s.broadcast ? 0 : 1} {}

    template <class F>
    void for_each_strides(F&& f) {
        f(strides);
    }
    void seek(const std::int64_t* index, int outer) noexcept {
        row = base;
        for (int d = 0; d < outer; ++d) row += index[d] * strides[d];
        inner = strides[outer];
    }
    DL_INLINE compute get(std::int64_t j) const noexcept { return static_cast<compute>(row[j * inner]); }
#ifndef DL_NO_SIMD
    /// The row's inner stride is 1, or 0 (broadcast).
    DL_INLINE simd::batch<compute> load(std::int64_t j) const noexcept {
        return inner ? simd::load_compute(row + j) : simd::batch<compute>(static_cast<compute>(row[0]));
    }
    DL_INLINE simd::batch<compute> load_partial(std::int64_t j, std::int64_t n) const noexcept {
        alignas(64) compute buf[simd::width<compute>] = {};
        for (std::int64_t k = 0; k < n; ++k) buf[k] = static_cast<compute>(row[(j + k) * inner]);
        return simd::batch<compute>::load_aligned(buf);
    }
    /// A bool leaf as the condition of a where() over batches of C.
    template <class C>
    DL_INLINE xsimd::batch_bool<C> load_mask(std::int64_t j) const noexcept
        requires std::is_same_v<T, bool>
    {
        return inner ? simd::load_mask<C>(row + j) : xsimd::batch_bool<C>(row[0]);
    }
    template <class C>
    DL_INLINE xsimd::batch_bool<C> load_mask_partial(std::int64_t j, std::int64_t n) const noexcept
        requires std::is_same_v<T, bool>
    {
        alignas(64) bool buf[simd::width<C>] = {};
        for (std::int64_t k = 0; k < n; ++k) buf[k] = row[(j + k) * inner];
        return simd::load_mask<C>(buf);
    }
#endif

private:
    // Out of line: one copy per element type rather than one per leaf of every expression.
    [[gnu::noinline]] static Strides strides_for(const Tensor<T>& t, const Shape* out) {
        return out ? broadcast_strides(t, *out) : Strides{1};
    }
};

template <class T>
struct scalar_eval {
    using compute = compute_t<T>;
    compute value;

    explicit scalar_eval(compute v) noexcept : value(v) {}
    explicit scalar_eval(eval_source<scalar_node<T>> s) noexcept : value(s.operand.value) {}

    template <class F>
    void for_each_strides(F&&) {}
    void seek(const std::int64_t*, int) noexcept {}
    DL_INLINE compute get(std::int64_t) const noexcept { return value; }
#ifndef DL_NO_SIMD
    DL_INLINE simd::batch<compute> load(std::int64_t) const noexcept {
        return simd::batch<compute>(value);
    }
    DL_INLINE simd::batch<compute> load_partial(std::int64_t, std::int64_t) const noexcept {
        return simd::batch<compute>(value);
    }
#endif
};

/// A where() whose condition is a Tensor<bool>: on batches the condition loads as a mask of the
/// selected values' lanes.
template <class Op, class... Evals>
inline constexpr bool selects_by_bool_tensor = false;
template <class Cond, class A, class B>
inline constexpr bool selects_by_bool_tensor<ops::where, Cond, A, B> = std::is_same_v<Cond, leaf_eval<bool>>;

template <class Op, class Operand, class... Evals>
struct node_eval {
    static constexpr bool is_where = std::is_same_v<Op, ops::where>;
    [[no_unique_address]] Op op;
    std::tuple<Evals...> evals;

    /// Each evaluator built in place from its own source (a row_source, or a scalar's value).
    template <class... Sources>
    node_eval(Op o, std::piecewise_construct_t, Sources... sources) : op(o), evals(sources...) {}
    template <class... E>
    explicit node_eval(eval_source<fn_node<Op, E...>> s)
        : op(s.operand.op), evals(std::apply(
                                [&](const auto&... e) {
                                    return std::tuple<Evals...>(eval_source<std::remove_cvref_t<decltype(e)>>{e, s.shape}...);
                                },
                                s.operand.operands)) {}

    template <class F>
    void for_each_strides(F&& f) {
        std::apply([&](auto&... e) { (e.for_each_strides(f), ...); }, evals);
    }
    void seek(const std::int64_t* index, int outer) noexcept {
        std::apply([&](auto&... e) { (e.seek(index, outer), ...); }, evals);
    }
    DL_INLINE auto get(std::int64_t j) const noexcept { return get(j, std::index_sequence_for<Evals...>{}); }
#ifndef DL_NO_SIMD
    // Only instantiated when simd_lane<> says the whole tree vectorises: operands are batches (or
    // masks, for where's condition) of Operand already.
    DL_INLINE auto load(std::int64_t j) const noexcept {
        return load(j, std::index_sequence_for<Evals...>{});
    }
    DL_INLINE auto load_partial(std::int64_t j, std::int64_t n) const noexcept {
        return load_partial(j, n, std::index_sequence_for<Evals...>{});
    }
#endif

private:
    // Index sequences rather than std::apply and lambdas: GCC does not always inline those, and a call
    // per element or batch costs more than the math.
    template <std::size_t... I>
    DL_INLINE auto get(std::int64_t j, std::index_sequence<I...>) const noexcept {
        if constexpr (is_where)
            return op(static_cast<bool>(std::get<0>(evals).get(j)), static_cast<Operand>(std::get<1>(evals).get(j)),
                      static_cast<Operand>(std::get<2>(evals).get(j)));
        else
            return op(static_cast<Operand>(std::get<I>(evals).get(j))...);
    }
#ifndef DL_NO_SIMD
    template <std::size_t... I>
    DL_INLINE auto load(std::int64_t j, std::index_sequence<I...>) const noexcept {
        if constexpr (selects_by_bool_tensor<Op, Evals...>)
            return op(std::get<0>(evals).template load_mask<Operand>(j), std::get<1>(evals).load(j), std::get<2>(evals).load(j));
        else
            return op(std::get<I>(evals).load(j)...);
    }
    template <std::size_t... I>
    DL_INLINE auto load_partial(std::int64_t j, std::int64_t n, std::index_sequence<I...>) const noexcept {
        if constexpr (selects_by_bool_tensor<Op, Evals...>)
            return op(std::get<0>(evals).template load_mask_partial<Operand>(j, n), std::get<1>(evals).load_partial(j, n),
                      std::get<2>(evals).load_partial(j, n));
        else
            return op(std::get<I>(evals).load_partial(j, n)...);
    }
#endif
};

// --- building an evaluator tree for a given output shape (null: flat, see eval_source) ---

template <class T>
[[nodiscard]] leaf_eval<T> make_eval(const Tensor<T>& t, const Shape* out) {
    return leaf_eval<T>(eval_source<Tensor<T>>{t, out});
}
template <class T>
[[nodiscard]] scalar_eval<T> make_eval(const scalar_node<T>& s, const Shape* out) {
    return scalar_eval<T>(eval_source<scalar_node<T>>{s, out});
}
template <class Op, class... E>
[[nodiscard]] auto make_eval(const fn_node<Op, E...>& n, const Shape* out) {
    using operand = typename fn_node<Op, E...>::operand_type;
    using eval = node_eval<Op, operand, decltype(make_eval(std::declval<const std::remove_cvref_t<E>&>(), out))...>;
    return eval(eval_source<fn_node<Op, E...>>{n, out});
}

// --- can the whole tree run on SIMD batches? ---

/// simd_lane<Eval>::type: the lane type of the batches the evaluator yields (void: no SIMD path);
/// mask: whether they are comparison masks rather than values.
template <class Eval>
struct simd_lane {
    using type = void;
    static constexpr bool mask = false;
};
template <class T>
struct simd_lane<leaf_eval<T>> {
    using type = std::conditional_t<simd::has_batch<compute_t<T>>, compute_t<T>, void>;
    static constexpr bool mask = false;
};
template <class T>
struct simd_lane<scalar_eval<T>> : simd_lane<leaf_eval<T>> {};

template <class Op, class Operand, class... Evals>
struct simd_lane<node_eval<Op, Operand, Evals...>> {
    template <class Eval>
    static constexpr bool value_of_lane = std::is_same_v<typename simd_lane<Eval>::type, Operand> &&
                                          !simd_lane<Eval>::mask;
    static constexpr bool ok = [] {
        if constexpr (!Op::vectorized || !simd::has_batch<Operand>) {
            return false;
        } else if constexpr (std::is_same_v<Op, ops::where>) {
            using C = std::tuple_element_t<0, std::tuple<Evals...>>;
            using A = std::tuple_element_t<1, std::tuple<Evals...>>;
            using B = std::tuple_element_t<2, std::tuple<Evals...>>;
            const bool mask_of_lane = (std::is_same_v<typename simd_lane<C>::type, Operand> && simd_lane<C>::mask) ||
                                      selects_by_bool_tensor<Op, Evals...>;
            return mask_of_lane && value_of_lane<A> && value_of_lane<B>;
        } else {
            return (value_of_lane<Evals> && ...);
        }
    }();
    using type = std::conditional_t<ok, Operand, void>;
    static constexpr bool mask = Op::rule == ops::result_rule::boolean;
};

/// The evaluator can fill a tensor of T with SIMD stores (converting on store for the 16-bit floats; a
/// Tensor<bool> takes a comparison's masks).
template <class Eval, class T>
inline constexpr bool vectorizes_into =
    std::is_same_v<T, bool>
        ? simd_lane<Eval>::mask && !std::is_void_v<typename simd_lane<Eval>::type>
        : std::is_same_v<typename simd_lane<Eval>::type, compute_t<T>> && !simd_lane<Eval>::mask;

// --- visiting the tensor operands of an expression ---

template <class T, class F>
void for_each_tensor(const Tensor<T>& t, F&& f) {
    f(t);
}
template <class T, class F>
void for_each_tensor(const scalar_node<T>&, F&&) {}
template <class Op, class... E, class F>
void for_each_tensor(const fn_node<Op, E...>& n, F&& f) {
    std::apply([&](const auto&... e) { (for_each_tensor(e, f), ...); }, n.operands);
}

}  // namespace dl::detail
