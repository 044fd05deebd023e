#pragma once
// Ops that move elements by position: cat, stack, chunk, index_select, gather, scatter, scatter_add,
// with their backward. Indices are integer tensors (int32 or int64); an index out of range is a
// dl::error naming the op, the position and the value, raised before anything is written.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "node.hpp"
#include "tracing.hpp"

namespace dl {

namespace autograd::detail {

/// Calls f(offset_a, offset_b, offset_c) for every position of `shape` in row-major order, with the
/// element offsets of that position under three stride sets.
template <class F>
void walk(const Shape& shape, const Strides& a, const Strides& b, const Strides& c, F&& f) {
    if (shape.numel() == 0) return;
    const int rank = shape.size();
    std::int64_t index[max_rank] = {}, oa = 0, ob = 0, oc = 0;
    for (std::int64_t k = 0, n = shape.numel(); k < n; ++k) {
        f(oa, ob, oc);
        for (int d = rank - 1; d >= 0; --d) {
            if (++index[d] < shape[d]) {
                oa += a[d], ob += b[d], oc += c[d];
                break;
            }
            oa -= a[d] * (shape[d] - 1), ob -= b[d] * (shape[d] - 1), oc -= c[d] * (shape[d] - 1);
            index[d] = 0;
        }
    }
}

/// Strides of t with the one of `dim` set to zero (the index supplies that coordinate).
template <class T>
[[nodiscard]] Strides without_dim(const Tensor<T>& t, int dim) {
    Strides s = t.strides();
    s[dim] = 0;
    return s;
}

inline void check_index(std::int64_t value, std::int64_t extent, std::string_view op, std::int64_t position) {
    if (value < 0 || value >= extent)
        dl::detail::fail("dl::", op, ": index ", value, " at position ", position, " is out of range for extent ",
                         extent);
}

/// Checks every element of `index` against `extent` before any element is moved.
template <class I>
void check_indices(const Tensor<I>& index, std::int64_t extent, std::string_view op) {
    std::int64_t position = 0;
    walk(index.shape(), index.strides(), index.strides(), index.strides(), [&](std::int64_t o, std::int64_t, std::int64_t) {
        check_index(static_cast<std::int64_t>(index.data()[o]), extent, op, position++);
    });
}

/// For gather/scatter: index has the rank of `data`, and no larger extent except along dim (where
/// `data` is the tensor indexed into; PyTorch's rule).
template <class T, class I>
void check_gather_shapes(const Tensor<T>& data, const Tensor<I>& index, int dim, std::string_view op) {
    if (index.rank() != data.rank())
        dl::detail::fail("dl::", op, ": index of shape ", index.shape(), " must have the rank of the tensor ",
                         data.shape());
    for (int d = 0; d < data.rank(); ++d)
        if (d != dim && index.shape()[d] > data.shape()[d])
            dl::detail::fail("dl::", op, ": index of shape ", index.shape(), " is larger than the tensor ",
                             data.shape(), " in dimension ", d);
}

/// dst[pos] (+)= src[pos with coordinate dim replaced by index[pos]] over the positions of index
/// (gather), or the reverse direction (scatter): dst[... index[pos] ...] (+)= src[pos].
enum class direction { gather, scatter };
template <direction Dir, bool Add, class T, class I>
void move_by_index(const Tensor<T>& dst, const Tensor<T>& src, const Tensor<I>& index, int dim) {
    const Tensor<T>& indexed = Dir == direction::gather ? src : dst;
    const Strides plain = Dir == direction::gather ? dst.strides() : src.strides();
    const std::int64_t step = indexed.strides()[dim];
    T* d = dst.data();
    const T* s = src.data();
    const I* ix = index.data();
    walk(index.shape(), index.strides(), plain, without_dim(indexed, dim),
         [&](std::int64_t oi, std::int64_t op, std::int64_t ox) {
             const std::int64_t at = ox + static_cast<std::int64_t>(ix[oi]) * step;
             T& target = Dir == direction::gather ? d[op] : d[at];
             const T value = Dir == direction::gather ? s[at] : s[op];
             if constexpr (Add)
                 target += value;
             else
                 target = value;
         });
}

/// dst.select(dim, index[k]) (+)= src.select(dim, k) for each k, for contiguous dst and src whose
/// other extents agree: runs of `inner` elements copied or added directly.
template <bool Add, class T, class I>
void copy_rows(const Tensor<T>& dst, const Tensor<T>& src, const Tensor<I>& index, int dim, bool index_into_dst) {
    std::int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; ++d) outer *= src.shape()[d];
    for (int d = dim + 1; d < src.rank(); ++d) inner *= src.shape()[d];
    const std::int64_t k = index.numel(), n_dst = dst.shape()[dim], n_src = src.shape()[dim];
    for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t j = 0; j < k; ++j) {
            const auto r = static_cast<std::int64_t>(index.data()[j * index.strides()[0]]);
            T* to = dst.data() + (o * n_dst + (index_into_dst ? r : j)) * inner;
            const T* from = src.data() + (o * n_src + (index_into_dst ? j : r)) * inner;
            if constexpr (Add)
                for (std::int64_t i = 0; i < inner; ++i) to[i] += from[i];
            else
                std::copy(from, from + inner, to);
        }
}

template <class T>
[[nodiscard]] Shape joined_shape(const std::vector<Tensor<T>>& parts, int dim, std::string_view op) {
    if (parts.empty()) dl::detail::fail("dl::", op, ": needs at least one tensor");
    Shape out = parts[0].shape();
    for (std::size_t i = 1; i < parts.size(); ++i) {
        const Shape& s = parts[i].shape();
        bool fits = s.size() == out.size();
        for (int d = 0; fits && d < s.size(); ++d) fits = d == dim || s[d] == out[d];
        if (!fits)
            dl::detail::fail("dl::", op, ": tensor ", i, " has shape ", s, ", tensor 0 has ", parts[0].shape(),
                             " (only dimension ", dim, " may differ)");
        out[dim] += s[dim];
    }
    return out;
}

template <class T>
[[nodiscard]] bool any_list_records(const std::vector<Tensor<T>>& parts) {
    return std::any_of(parts.begin(), parts.end(), [](const Tensor<T>& t) { return records(t); });
}

/// Records an op over a list of tensors along dimension d (cat, stack): its kernel calls fn(list, d).
template <class T, class F>
[[nodiscard]] Tensor<T> record_list(recorder& r, std::string name, int d, const std::vector<Tensor<T>>& parts, F fn) {
    op_record op;
    op.name = std::move(name);
    op.attributes = attributes("dim", d);
    {
        const recording_paused pause(parts[0].context());
        op.output = fn(parts, d);
    }
    op.inputs.assign(parts.begin(), parts.end());
    op.kernel = [d, fn](std::span<const any_tensor> inputs, any_tensor& out) {
        std::vector<Tensor<T>> list;
        for (const auto& in : inputs) list.push_back(std::get<Tensor<T>>(in));
        out = fn(list, d);
    };
    Tensor<T> result = std::get<Tensor<T>>(op.output);
    r.record(std::move(op));
    return result;
}

}  // namespace autograd::detail

/// The tensors joined along dim; every other extent must agree.
template <class T>
[[nodiscard]] Tensor<T> cat(const std::vector<Tensor<T>>& parts, std::int64_t dim = 0) {
    if (parts.empty()) detail::fail("dl::cat: needs at least one tensor");
    const int d = wrap_dim(dim, parts[0].rank(), "cat");
    if (auto* r = parts[0].context().recorder())
        return autograd::detail::record_list(*r, "cat", d, parts, [](const std::vector<Tensor<T>>& l, int at) { return cat(l, at); });
    Tensor<T> out(autograd::detail::joined_shape(parts, d, "cat"), parts[0].context());
    {
        no_grad off(out.context());
        std::int64_t at = 0;
        for (const auto& p : parts) {
            Tensor<T> part = out.slice(d, at, at + p.shape()[d]);
            assign(part, p);
            at += p.shape()[d];
        }
    }
    if constexpr (is_floating_element<T>) {
        if (autograd::detail::any_list_records(parts))
            autograd::record(
                out,
                [d](const Tensor<T>& g, const std::vector<Tensor<T>>& inputs) {
                    std::int64_t at = 0;
                    for (const auto& p : inputs) {
                        if (auto* n = autograd::node_of(p)) autograd::accumulate(*n, g.slice(d, at, at + p.shape()[d]));
                        at += p.shape()[d];
                    }
                },
                parts);
    }
    return out;
}

/// The tensors (all of one shape) stacked along a new dimension dim.
template <class T>
[[nodiscard]] Tensor<T> stack(const std::vector<Tensor<T>>& parts, std::int64_t dim = 0) {
    if (parts.empty()) detail::fail("dl::stack: needs at least one tensor");
    const int d = wrap_dim(dim, parts[0].rank() + 1, "stack");
    for (std::size_t i = 1; i < parts.size(); ++i)
        if (parts[i].shape() != parts[0].shape())
            detail::fail("dl::stack: tensor ", i, " has shape ", parts[i].shape(), ", tensor 0 has ", parts[0].shape());
    if (auto* r = parts[0].context().recorder())
        return autograd::detail::record_list(*r, "stack", d, parts, [](const std::vector<Tensor<T>>& l, int at) { return stack(l, at); });
    Shape shape = parts[0].shape();
    shape.insert(d, static_cast<std::int64_t>(parts.size()));
    Tensor<T> out(shape, parts[0].context());
    {
        no_grad off(out.context());
        for (std::size_t i = 0; i < parts.size(); ++i) {
            Tensor<T> part = out.select(d, static_cast<std::int64_t>(i));
            assign(part, parts[i]);
        }
    }
    if constexpr (is_floating_element<T>) {
        if (autograd::detail::any_list_records(parts))
            autograd::record(
                out,
                [d](const Tensor<T>& g, const std::vector<Tensor<T>>& inputs) {
                    for (std::size_t i = 0; i < inputs.size(); ++i)
                        if (auto* n = autograd::node_of(inputs[i]))
                            autograd::accumulate(*n, g.select(d, static_cast<std::int64_t>(i)));
                },
                parts);
    }
    return out;
}

/// `chunks` views of t along dim, each of extent ceil(extent / chunks) except a shorter last one.
template <class T>
[[nodiscard]] std::vector<Tensor<T>> chunk(const Tensor<T>& t, std::int64_t chunks, std::int64_t dim = 0) {
    if (chunks <= 0) detail::fail("dl::chunk: the number of chunks must be positive, got ", chunks);
    const int d = wrap_dim(dim, t.rank(), "chunk");
    const std::int64_t extent = t.shape()[d], size = (extent + chunks - 1) / chunks;
    std::vector<Tensor<T>> out;
    for (std::int64_t at = 0; at < extent || (extent == 0 && out.empty()); at += std::max<std::int64_t>(size, 1))
        out.push_back(t.slice(d, at, std::min(at + size, extent)));
    return out;
}

/// The slices of t along dim at the positions in `index` (rank 1), in that order; repeats allowed.
template <class T, std::integral I>
[[nodiscard]] Tensor<T> index_select(const Tensor<T>& t, std::int64_t dim, const Tensor<I>& index) {
    if (index.rank() != 1) detail::fail("dl::index_select: the index must have rank 1, got shape ", index.shape());
    const int d = wrap_dim(dim, t.rank(), "index_select");
    if (auto* r = autograd::recorder_of(t, index))
        return autograd::record_op(*r, "index_select", autograd::attributes("dim", d), autograd::op_kind::pure,
                                   [](const Tensor<T>& x, int axis, const Tensor<I>& i) { return index_select(x, axis, i); },
                                   t, d, index);
    autograd::detail::check_indices(index, t.shape()[d], "index_select");
    Shape shape = t.shape();
    shape[d] = index.numel();
    const op_scope scope(t.context(), "index_select");
    Tensor<T> out(shape, t.context());
    autograd::detail::copy_rows<false>(out, t.detach().contiguous(), index, d, false);
    if constexpr (is_floating_element<T>) {
        if (autograd::records(t))
            autograd::record(
                out,
                [d](const Tensor<T>& g, const Tensor<T>& src, const Tensor<I>& ix) {
                    // Repeated indices add up: the sparse rows of an embedding's gradient.
                    auto& buffer = autograd::grad_buffer(*autograd::node_of(src));
                    autograd::detail::copy_rows<true>(buffer, g.contiguous(), ix, d, true);
                },
                t, index);
    }
    return out;
}

/// out[p] = t[p with coordinate dim replaced by index[p]], for every position p of index (which has
/// t's rank and, outside dim, extents no larger than t's).
template <class T, std::integral I>
[[nodiscard]] Tensor<T> gather(const Tensor<T>& t, std::int64_t dim, const Tensor<I>& index) {
    const int d = wrap_dim(dim, t.rank(), "gather");
    if (auto* r = autograd::recorder_of(t, index))
        return autograd::record_op(*r, "gather", autograd::attributes("dim", d), autograd::op_kind::pure,
                                   [](const Tensor<T>& x, int axis, const Tensor<I>& i) { return gather(x, axis, i); },
                                   t, d, index);
    autograd::detail::check_gather_shapes(t, index, d, "gather");
    autograd::detail::check_indices(index, t.shape()[d], "gather");
    Tensor<T> out(index.shape(), t.context());
    autograd::detail::move_by_index<autograd::detail::direction::gather, false>(out, t, index, d);
    if constexpr (is_floating_element<T>) {
        if (autograd::records(t))
            autograd::record(
                out,
                [d](const Tensor<T>& g, const Tensor<T>& src, const Tensor<I>& ix) {
                    auto& buffer = autograd::grad_buffer(*autograd::node_of(src));
                    autograd::detail::move_by_index<autograd::detail::direction::scatter, true>(buffer, g, ix, d);
                },
                t, index);
    }
    return out;
}

namespace autograd::detail {
template <bool Add, class T, class I>
[[nodiscard]] Tensor<T> scatter_op(const Tensor<T>& t, std::int64_t dim, const Tensor<I>& index, const Tensor<T>& src,
                                   std::string_view name) {
    const int d = wrap_dim(dim, t.rank(), name);
    check_gather_shapes(t, index, d, name);
    for (int k = 0; k < index.rank(); ++k)
        if (index.shape()[k] > src.shape(k))
            dl::detail::fail("dl::", name, ": index of shape ", index.shape(), " is larger than the source ",
                             src.shape(), " in dimension ", k);
    check_indices(index, t.shape()[d], name);
    Tensor<T> out = t.detach().clone();
    move_by_index<direction::scatter, Add>(out, src, index, d);
    if constexpr (is_floating_element<T>) {
        if (any_records(t, src))
            record(
                out,
                [d](const Tensor<T>& g, const Tensor<T>& base, const Tensor<I>& ix, const Tensor<T>& from) {
                    if (auto* n = node_of(from)) {
                        auto& buffer = grad_buffer(*n);
                        move_by_index<direction::gather, true>(buffer, g, ix, d);
                    }
                    if (auto* n = node_of(base)) {
                        if constexpr (Add) {
                            accumulate(*n, g);
                        } else {  // overwritten positions did not come from base
                            Tensor<T> kept = g.clone();
                            Tensor<T> zero = zeros<T>(ix.shape(), g.context());
                            move_by_index<direction::scatter, false>(kept, zero, ix, d);
                            accumulate(*n, kept);
                        }
                    }
                },
                t, index, src);
    }
    return out;
}
}  // namespace autograd::detail

/// A copy of t with src[p] written at t[p with coordinate dim replaced by index[p]] for every position
/// p of index. With repeated targets the last write wins (use scatter_add to sum them).
template <class T, std::integral I>
[[nodiscard]] Tensor<T> scatter(const Tensor<T>& t, std::int64_t dim, const Tensor<I>& index, const Tensor<T>& src) {
    if (auto* r = autograd::recorder_of(t, index, src))
        return autograd::record_op(
            *r, "scatter", autograd::attributes("dim", dim), autograd::op_kind::pure,
            [](const Tensor<T>& x, std::int64_t axis, const Tensor<I>& i, const Tensor<T>& s) { return scatter(x, axis, i, s); },
            t, dim, index, src);
    return autograd::detail::scatter_op<false>(t, dim, index, src, "scatter");
}

/// A copy of t with src[p] added at t[p with coordinate dim replaced by index[p]].
template <class T, std::integral I>
[[nodiscard]] Tensor<T> scatter_add(const Tensor<T>& t, std::int64_t dim, const Tensor<I>& index, const Tensor<T>& src) {
    if (auto* r = autograd::recorder_of(t, index, src))
        return autograd::record_op(
            *r, "scatter_add", autograd::attributes("dim", dim), autograd::op_kind::pure,
            [](const Tensor<T>& x, std::int64_t axis, const Tensor<I>& i, const Tensor<T>& s) { return scatter_add(x, axis, i, s); },
            t, dim, index, src);
    return autograd::detail::scatter_op<true>(t, dim, index, src, "scatter_add");
}

enum class bag_mode { sum, mean, max };

/// Sums, means or maxima of bags of rows of weight [rows, dim]: bag b holds the rows
/// ids[offsets[b] .. offsets[b+1]) (the last bag runs to the end of ids), as torch's EmbeddingBag with
/// offsets. The result is [bags, dim]; an empty bag gives zeros. per_sample_weights (one per id, sum
/// mode only) scales each row and receives a gradient too. The weight's gradient touches only the rows
/// named in ids.
template <class T, std::integral I>
[[nodiscard]] Tensor<T> embedding_bag(const Tensor<T>& weight, const Tensor<I>& ids, const Tensor<I>& offsets,
                                      bag_mode mode = bag_mode::mean, const Tensor<T>& per_sample_weights = {}) {
    static_assert(is_floating_element<T>, "dl::embedding_bag: needs a floating weight");
    if (auto* r = autograd::recorder_of(weight, ids, offsets, per_sample_weights))
        return autograd::record_op(*r, "embedding_bag", autograd::attributes("mode", mode), autograd::op_kind::pure,
                                   [](const Tensor<T>& w, const Tensor<I>& i, const Tensor<I>& o, bag_mode m,
                                      const Tensor<T>& p) { return embedding_bag(w, i, o, m, p); },
                                   weight, ids, offsets, mode, per_sample_weights);
    if (weight.rank() != 2) detail::fail("dl::embedding_bag: the weight must be [rows, dim], got shape ", weight.shape());
    if (ids.rank() != 1 || offsets.rank() != 1)
        detail::fail("dl::embedding_bag: ids and offsets must have rank 1, got shapes ", ids.shape(), " and ",
                     offsets.shape());
    const bool weighted = per_sample_weights.defined();
    if (weighted && (mode != bag_mode::sum || per_sample_weights.shape() != ids.shape()))
        detail::fail("dl::embedding_bag: per_sample_weights need mode sum and the shape of ids ", ids.shape(),
                     ", got shape ", per_sample_weights.shape());
    autograd::detail::check_indices(ids, weight.shape()[0], "embedding_bag");
    const std::int64_t bags = offsets.numel(), count = ids.numel(), dim = weight.shape()[1];
    std::vector<std::int64_t> bounds(static_cast<std::size_t>(bags + 1), count);
    for (std::int64_t b = 0; b < bags; ++b) {
        bounds[b] = static_cast<std::int64_t>(offsets.data()[b * offsets.strides()[0]]);
        if ((b == 0 && bounds[0] != 0) || (b > 0 && bounds[b] < bounds[b - 1]) || bounds[b] > count)
            detail::fail("dl::embedding_bag: offsets must start at 0 and not decrease up to ", count,
                         ", offset ", b, " is ", bounds[b]);
    }
    const op_scope scope(weight.context(), "embedding_bag");
    auto id_at = [&ids](std::int64_t j) { return static_cast<std::int64_t>(ids.data()[j * ids.strides()[0]]); };
    const Tensor<T> w = weight.detach().contiguous();
    const Tensor<T> psw = weighted ? per_sample_weights.detach().contiguous() : Tensor<T>();
    Tensor<T> out = zeros<T>({bags, dim}, weight.context());
    Tensor<std::int64_t> winner = mode == bag_mode::max ? full<std::int64_t>({bags, dim}, -1, weight.context())
                                                          : Tensor<std::int64_t>();
    for (std::int64_t b = 0; b < bags; ++b) {
        T* o = out.data() + b * dim;
        for (std::int64_t j = bounds[b]; j < bounds[b + 1]; ++j) {
            const std::int64_t r = id_at(j);
            const T* row = w.data() + r * dim;
            if (mode == bag_mode::max) {
                std::int64_t* win = winner.data() + b * dim;
                for (std::int64_t k = 0; k < dim; ++k)
                    if (win[k] < 0 || row[k] > o[k]) o[k] = row[k], win[k] = r;
            } else {
                const T scale = weighted ? psw.data()[j] : T(1);
                for (std::int64_t k = 0; k < dim; ++k) o[k] += scale * row[k];
            }
        }
        if (mode == bag_mode::mean && bounds[b + 1] > bounds[b]) {
            const T inv = T(1) / static_cast<T>(bounds[b + 1] - bounds[b]);
            for (std::int64_t k = 0; k < dim; ++k) o[k] *= inv;
        }
    }
    if (autograd::any_records(weight, per_sample_weights))
        autograd::record(
            out,
            [mode, bounds = std::move(bounds)](const Tensor<T>& g_any, const Tensor<T>& wt, const Tensor<I>& ix,
                                               const Tensor<T>& sample_weights, const Tensor<std::int64_t>& win) {
                const Tensor<T> g = g_any.contiguous();
                const std::int64_t d = g.shape()[1];
                auto id = [&ix](std::int64_t j) { return static_cast<std::int64_t>(ix.data()[j * ix.strides()[0]]); };
                if (auto* n = autograd::node_of(wt)) {
                    T* buffer = autograd::grad_buffer(*n).data();
                    for (std::size_t b = 0; b + 1 < bounds.size(); ++b) {
                        const T* gb = g.data() + static_cast<std::int64_t>(b) * d;
                        if (mode == bag_mode::max) {
                            const std::int64_t* w = win.data() + static_cast<std::int64_t>(b) * d;
                            for (std::int64_t k = 0; k < d; ++k)
                                if (w[k] >= 0) buffer[w[k] * d + k] += gb[k];
                            continue;
                        }
                        const std::int64_t size = bounds[b + 1] - bounds[b];
                        for (std::int64_t j = bounds[b]; j < bounds[b + 1]; ++j) {
                            const T scale = sample_weights.defined() ? sample_weights.data()[j * sample_weights.strides()[0]]
                                            : mode == bag_mode::mean ? T(1) / static_cast<T>(size)
                                                                     : T(1);
                            T* row = buffer + id(j) * d;
                            for (std::int64_t k = 0; k < d; ++k) row[k] += scale * gb[k];
                        }
                    }
                }
                if (auto* n = autograd::node_of(sample_weights)) {
                    const Tensor<T> rows = wt.detach().contiguous();
                    T* buffer = autograd::grad_buffer(*n).data();
                    for (std::size_t b = 0; b + 1 < bounds.size(); ++b)
                        for (std::int64_t j = bounds[b]; j < bounds[b + 1]; ++j) {
                            const T* gb = g.data() + static_cast<std::int64_t>(b) * d;
                            const T* row = rows.data() + id(j) * d;
                            compute_t<T> dot = 0;  // bfloat16 and float16 sum in float
                            for (std::int64_t k = 0; k < d; ++k) dot += compute_t<T>(gb[k]) * compute_t<T>(row[k]);
                            buffer[j] += T(dot);
                        }
                }
            },
            weight, ids, per_sample_weights, winner);
    return out;
}

}  // namespace dl
