#pragma once
// Runs a graph: the nodes a set of fetches needs (given the feeds), in one of two strategies. In order
// runs one node at a time and lets each op spread its own loop over the Context's pool; parallel runs
// ready nodes side by side on the pool (dependency counting), each op on one thread. Which is faster
// depends on the model (wide graphs of small ops like the second); results are identical either way.
// With a memory plan (passes.hpp) a value is freed after its last read, and planned elementwise ops
// write into the input they replace.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "../autograd/node.hpp"
#include "../device/cpu/elementwise.hpp"
#include "../prof/profiler.hpp"
#include "ir.hpp"

namespace dl::graph {

enum class strategy : std::uint8_t { in_order, parallel };

namespace detail {

[[nodiscard]] inline DType dtype_of_any(const any_tensor& t) {
    return std::visit(
        []<class V>(const V&) {
            if constexpr (std::is_same_v<V, std::monostate>)
                return DType::float32;
            else
                return V::dtype();
        },
        t);
}
[[nodiscard]] inline const Shape& shape_of_any(const any_tensor& t) {
    static const Shape none;
    return std::visit(
        []<class V>(const V& x) -> const Shape& {
            if constexpr (std::is_same_v<V, std::monostate>)
                return none;
            else
                return x.shape();
        },
        t);
}
/// A new tensor of dtype d (uninitialised).
[[nodiscard]] inline any_tensor make_tensor(DType d, const Shape& shape, Context& ctx) {
    switch (d) {
        case DType::boolean: return Tensor<bool>(shape, ctx);
        case DType::uint8: return Tensor<std::uint8_t>(shape, ctx);
        case DType::int32: return Tensor<std::int32_t>(shape, ctx);
        case DType::int64: return Tensor<std::int64_t>(shape, ctx);
        case DType::float32: return Tensor<float>(shape, ctx);
        case DType::float64: return Tensor<double>(shape, ctx);
        case DType::bfloat16: return Tensor<bfloat16>(shape, ctx);
        case DType::float16: return Tensor<float16>(shape, ctx);
    }
    return {};
}
/// t broadcast to `shape` as contiguous elements: t itself when it is contiguous and has shape's count,
/// else a copy through its strides (0 along broadcast dimensions). An element loop rather than
/// x.expand(shape).contiguous(): that records a view and runs an expression assignment with its
/// backward, which this visit would compile for all eight dtypes into every file that includes
/// dl.hpp (~0.9 s of its compile time).
[[nodiscard]] inline any_tensor dense_any(const any_tensor& t, const Shape& shape) {
    return std::visit(
        [&]<class V>(const V& x) -> any_tensor {
            if constexpr (std::is_same_v<V, std::monostate>) {
                return x;
            } else {
                const std::int64_t n = shape.numel();
                if (x.is_contiguous() && x.numel() == n) return x;
                V out(shape, x.context());
                if (n == 0) return out;
                // x's strides aligned to shape's trailing dimensions, 0 where x broadcasts.
                const int rank = shape.size(), skip = rank - x.rank();
                std::vector<std::int64_t> strides(static_cast<std::size_t>(rank), 0);
                for (int d = skip; d < rank; ++d)
                    if (x.shape()[d - skip] != 1) strides[static_cast<std::size_t>(d)] = x.strides()[d - skip];
                const std::int64_t inner = rank ? shape[rank - 1] : 1, step = rank ? strides.back() : 0;
                // An odometer over the outer dimensions; `at` is x's offset of the current row.
                std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
                const auto* src = x.data();
                auto* dst = out.data();
                for (std::int64_t at = 0, done = 0; done < n; done += inner) {
                    for (std::int64_t j = 0; j < inner; ++j) *dst++ = src[at + j * step];
                    for (int d = rank - 2; d >= 0; --d) {
                        const auto k = static_cast<std::size_t>(d);
                        at += strides[k];
                        if (++index[k] < shape[d]) break;
                        at -= strides[k] * shape[d];
                        index[k] = 0;
                    }
                }
                return out;
            }
        },
        t);
}
[[nodiscard]] inline bool is_contiguous_any(const any_tensor& t) {
    return std::visit(
        []<class V>(const V& x) {
            if constexpr (std::is_same_v<V, std::monostate>)
                return true;
            else
                return x.is_contiguous();
        },
        t);
}
[[nodiscard]] inline std::byte* bytes_of_any(const any_tensor& t) {
    return std::visit(
        []<class V>(const V& x) -> std::byte* {
            if constexpr (std::is_same_v<V, std::monostate>)
                return nullptr;
            else
                return reinterpret_cast<std::byte*>(const_cast<typename V::value_type*>(x.data()));
        },
        t);
}

/// Bytes of one tile of every stream a fused node touches (its tiled inputs, its steps' results, its
/// output): half of a 32 KiB L1, so that a step finds its operands there. The tile's length follows
/// from the chain: 2048 floats per stream (the earlier fixed size) made the six-op benchmark chain's
/// nine streams 72 KiB, and ran 1.5x slower than 512.
inline constexpr std::int64_t fused_tile_bytes = 16 * 1024;

/// Below this many bytes streamed (tiled inputs and output), a fused node's data most likely sits in
/// the last-level cache, where the hardware prefetcher keeps up and software prefetches only take
/// issue slots. Measured with the benchmark chain on 1 thread (Zen 4, 1 MiB L2): without them 10-15%
/// faster at 4 and 8 MiB, 12% slower at 16 MiB and 1.6-1.8x slower from 32 MiB on.
inline constexpr std::int64_t fused_prefetch_bytes = 12 * 1024 * 1024;

/// Runs a fused node: every step over one tile before the next tile, each worker of the pool taking a
/// contiguous range of tiles. `out` may hold the buffer to write into.
inline void run_fused(const node& n, std::span<const any_tensor> inputs, any_tensor& out, Context& ctx) {
    Shape shape;
    for (const auto& in : inputs) shape = broadcast_shapes(shape, shape_of_any(in), n.op);
    const std::int64_t numel = shape.numel();
    if (out.index() == 0 || shape_of_any(out) != shape || dtype_of_any(out) != n.steps.back().dtype ||
        !is_contiguous_any(out))
        out = make_tensor(n.steps.back().dtype, shape, ctx);
    // Single elements broadcast whole; every other input is read tile by tile, expanded to the full
    // shape first if it broadcasts along some dimensions (the fusion pass fuses none of those, but a
    // loaded elementwise node runs here too, graph/serialize.hpp).
    struct source {
        any_tensor tensor;  // holds the (contiguous) storage for the run
        std::byte* data;
        std::size_t element;
        bool tiled;
    };
    std::vector<source> sources;
    sources.reserve(inputs.size());
    for (const auto& in : inputs) {
        const std::int64_t own = shape_of_any(in).numel();
        const bool tiled = own > 1 && numel > 1;
        any_tensor t = !tiled ? in : dense_any(in, shape);
        std::byte* data = bytes_of_any(t);
        sources.push_back({std::move(t), data, dtype_size(dtype_of_any(in)), tiled});
    }
    std::byte* const out_data = bytes_of_any(out);
    const std::size_t out_element = dtype_size(n.steps.back().dtype);
    std::int64_t streamed = static_cast<std::int64_t>(out_element);  // bytes per element from and to memory
    for (const source& src : sources) streamed += src.tiled ? static_cast<std::int64_t>(src.element) : 0;
    std::int64_t stream_bytes = streamed;  // per element, over all streams, the steps' results too
    for (std::size_t s = 0; s + 1 < n.steps.size(); ++s) stream_bytes += static_cast<std::int64_t>(dtype_size(n.steps[s].dtype));
    const std::int64_t fused_tile = std::clamp<std::int64_t>(fused_tile_bytes / stream_bytes / 64 * 64, 256, 4096);
    const std::int64_t tiles = (numel + fused_tile - 1) / fused_tile;
    // Threads as an eager loop of the same work would take: the steps' costs per element, plus one
    // for the output. Waking a worker costs more than a small node (a ReLU's gradient at batch 32).
    std::int64_t cost = 1;
    for (const fused_step& step : n.steps) cost += step.tile.cost;
    const std::int64_t workers =
        std::min(tiles, dl::detail::parallel_chunks(numel * cost, serial_scope::active() ? 1 : ctx.concurrency()));
    if (n.compiled) {
        // One loop over the whole chain in registers, as a compile-time fused expression runs; each
        // worker takes a run of whole tiles.
        std::vector<unsigned char> broadcast;
        for (const source& src : sources) broadcast.push_back(src.tiled ? 0 : 1);
        // Compiled chains are float32 throughout; runs start on whole tiles, so they stay aligned.
        const bool stream = dl::detail::streams(reinterpret_cast<const float*>(out_data), numel);
        ctx.parallel_for(workers, [&](std::int64_t w) {
            const std::int64_t begin = std::min(numel, w * tiles / workers * fused_tile);
            const std::int64_t end = std::min(numel, (w + 1) * tiles / workers * fused_tile);
            std::vector<const void*> data;
            for (const source& src : sources)
                data.push_back(src.data + (src.tiled ? static_cast<std::size_t>(begin) * src.element : 0));
            n.compiled.run(data.data(), broadcast.data(), out_data + static_cast<std::size_t>(begin) * out_element, end - begin,
                            stream);
        });
        return;
    }
    const bool prefetch = numel * streamed > fused_prefetch_bytes;
    ctx.parallel_for(workers, [&](std::int64_t w) {
        const std::size_t steps = n.steps.size();
        std::vector<any_tensor> buffers(steps - 1);
        std::vector<std::byte*> buffer_data(steps - 1);
        for (std::size_t s = 0; s + 1 < steps; ++s) {
            buffers[s] = make_tensor(n.steps[s].dtype, {fused_tile}, ctx);
            buffer_data[s] = bytes_of_any(buffers[s]);
        }
        // Every step's operands, laid out once per run: per tile only the tiled inputs' pointers move
        // (`stride` bytes per element from `origin`); a broadcast input and a step's buffer stay put.
        struct placement {
            const std::byte* origin;
            std::size_t stride;
        };
        std::vector<tile_operand> operands;
        std::vector<placement> places;
        std::vector<std::size_t> first(steps + 1);  // step s's operands: [first[s], first[s + 1])
        for (std::size_t s = 0; s < steps; ++s) {
            first[s] = operands.size();
            for (int i : n.steps[s].inputs) {
                if (i < 0) {
                    operands.push_back({buffer_data[static_cast<std::size_t>(-1 - i)], false});
                    places.push_back({buffer_data[static_cast<std::size_t>(-1 - i)], 0});
                } else {
                    const source& src = sources[static_cast<std::size_t>(i)];
                    operands.push_back({src.data, !src.tiled});
                    places.push_back({src.data, src.tiled ? src.element : 0});
                }
            }
        }
        first[steps] = operands.size();
        // Memory is touched in bursts (a step reads an input's tile, then the next steps only compute),
        // so the next tile of every input is prefetched while this one computes, a slice before each
        // step: the loads overlap the math, as they do in a compile-time fused loop. The output's next
        // tile is fetched for writing the same way, so that the last step's stores do not wait for it.
        struct next_tile {
            const std::byte* data;
            std::size_t bytes, per_step;  // per_step: whole lines, fixed per run (no division per tile)
            bool write;
        };
        std::vector<next_tile> lines;
        auto per_step = [&](std::size_t element) {
            return (static_cast<std::size_t>(fused_tile) * element / steps + 63) & ~std::size_t{63};
        };
        for (std::int64_t t = w * tiles / workers; t < (w + 1) * tiles / workers; ++t) {
            const std::int64_t begin = t * fused_tile, count = std::min(fused_tile, numel - begin);
            lines.clear();
            if (prefetch && t + 1 < (w + 1) * tiles / workers) {
                const auto next = static_cast<std::size_t>(begin + fused_tile);
                const auto next_count = static_cast<std::size_t>(std::min(fused_tile, numel - begin - fused_tile));
                for (const source& src : sources)
                    if (src.tiled)
                        lines.push_back({src.data + next * src.element, next_count * src.element, per_step(src.element), false});
                lines.push_back({out_data + next * out_element, next_count * out_element, per_step(out_element), true});
            }
            for (std::size_t k = 0; k < operands.size(); ++k)
                operands[k].data = places[k].origin + static_cast<std::size_t>(begin) * places[k].stride;
            for (std::size_t s = 0; s < steps; ++s) {
                for (const next_tile& line : lines)
                    for (std::size_t b = s * line.per_step, end = std::min(line.bytes, b + line.per_step); b < end; b += 64) {
                        if (line.write)
                            __builtin_prefetch(line.data + b, 1);
                        else
                            __builtin_prefetch(line.data + b, 0);
                    }
                void* target = s + 1 < steps ? static_cast<void*>(buffer_data[s])
                                             : static_cast<void*>(out_data + static_cast<std::size_t>(begin) * out_element);
                n.steps[s].tile.run(operands.data() + first[s], target, count);
            }
        }
    });
}

}  // namespace detail

/// Runs graphs. It caches one plan per set of feeds and fetches; one run at a time.
class executor {
public:
    /// Computes `fetches` (value ids) given `feeds` (value id, tensor): only the nodes those fetches
    /// need, and none that make a fed value.
    std::vector<any_tensor> run(const Graph& g, Context& ctx, std::span<const std::pair<int, any_tensor>> feeds,
                                std::span<const int> fetches, strategy how) {
        const plan& p = plan_for(g, feeds, fetches);
        slots_.assign(g.values.size(), any_tensor{});
        for (std::size_t id = 0; id < g.values.size(); ++id)
            if (g.values[id].source == value_source::parameter || g.values[id].source == value_source::constant)
                slots_[id] = g.values[id].data;
        for (const auto& [id, t] : feeds) slots_[static_cast<std::size_t>(id)] = t;
        const bool release = g.memory.planned;
        if (remaining_.size() != g.values.size()) remaining_ = std::vector<std::atomic<int>>(g.values.size());
        for (std::size_t id = 0; id < g.values.size(); ++id) remaining_[id].store(p.uses[id], std::memory_order_relaxed);
        const no_grad off(ctx);
        try {
            if (how == strategy::parallel && ctx.concurrency() > 1 && p.nodes.size() > 1)
                run_parallel(g, ctx, p, release);
            else
                for (int n : p.nodes) execute(g, ctx, p, n, release, scratch_);
        } catch (...) {
            slots_.clear();
            throw;
        }
        std::vector<any_tensor> results;
        results.reserve(fetches.size());
        for (int id : fetches) results.push_back(slots_[static_cast<std::size_t>(id)]);
        slots_.clear();
        return results;
    }

    /// Forgets the cached plans (after the graph changes).
    void clear() { plans_.clear(); }

private:
    struct plan {
        std::vector<int> nodes;                  ///< to run, in graph order
        std::vector<int> uses;                   ///< per value: reads by planned nodes
        std::vector<char> keep;                  ///< per value: never freed during a run
        std::vector<int> pending;                ///< per planned node: inputs made by planned nodes
        std::vector<std::vector<int>> consumers; ///< per planned node: planned nodes reading its output
    };

    const plan& plan_for(const Graph& g, std::span<const std::pair<int, any_tensor>> feeds, std::span<const int> fetches) {
        std::pair<std::vector<int>, std::vector<int>> key;
        for (const auto& f : feeds) key.first.push_back(f.first);
        key.second.assign(fetches.begin(), fetches.end());
        std::sort(key.first.begin(), key.first.end());
        if (auto it = plans_.find(key); it != plans_.end()) return it->second;

        const std::size_t count = g.values.size();
        std::vector<char> fed(count, 0), needed(count, 0), runs(g.nodes.size(), 0);
        for (int id : key.first) {
            if (id < 0 || static_cast<std::size_t>(id) >= count) dl::detail::fail("dl::graph::run: feed of %", id, ", which does not exist");
            fed[static_cast<std::size_t>(id)] = 1;
        }
        std::vector<int> stack;
        for (int id : key.second) {
            if (id < 0 || static_cast<std::size_t>(id) >= count) dl::detail::fail("dl::graph::run: fetch of %", id, ", which does not exist");
            stack.push_back(id);
        }
        while (!stack.empty()) {
            const auto id = static_cast<std::size_t>(stack.back());
            stack.pop_back();
            if (needed[id]) continue;
            needed[id] = 1;
            const value& v = g.values[id];
            if (fed[id] || v.source == value_source::parameter || v.source == value_source::constant) continue;
            if (v.source == value_source::input)
                dl::detail::fail("dl::graph::run: the fetches need input %", id, ", which is not fed");
            runs[static_cast<std::size_t>(v.producer)] = 1;
            for (int in : g.nodes[static_cast<std::size_t>(v.producer)].inputs) stack.push_back(in);
        }
        plan p;
        p.uses.assign(count, 0);
        p.keep.assign(count, 0);
        std::vector<int> position(g.nodes.size(), -1);
        for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
            if (runs[static_cast<std::size_t>(i)]) {
                position[static_cast<std::size_t>(i)] = static_cast<int>(p.nodes.size());
                p.nodes.push_back(i);
            }
        p.pending.assign(p.nodes.size(), 0);
        p.consumers.resize(p.nodes.size());
        for (std::size_t k = 0; k < p.nodes.size(); ++k) {
            const node& n = g.nodes[static_cast<std::size_t>(p.nodes[k])];
            for (int in : n.inputs) {
                ++p.uses[static_cast<std::size_t>(in)];
                const value& v = g.values[static_cast<std::size_t>(in)];
                if (v.source == value_source::node && !fed[static_cast<std::size_t>(in)]) {
                    ++p.pending[k];
                    p.consumers[static_cast<std::size_t>(position[static_cast<std::size_t>(v.producer)])].push_back(
                        static_cast<int>(k));
                }
            }
        }
        for (std::size_t id = 0; id < count; ++id)
            p.keep[id] = fed[id] || g.values[id].source != value_source::node;
        for (int id : key.second) p.keep[static_cast<std::size_t>(id)] = 1;
        return plans_.emplace(std::move(key), std::move(p)).first->second;
    }

    /// Runs planned node `index` of the graph, then frees the inputs it read last.
    void execute(const Graph& g, Context& ctx, const plan& p, int index, bool release, std::vector<any_tensor>& inputs) {
        const node& n = g.nodes[static_cast<std::size_t>(index)];
        inputs.clear();
        for (int in : n.inputs) inputs.push_back(slots_[static_cast<std::size_t>(in)]);
        any_tensor out;
        if (release && n.in_place >= 0) {
            const auto reused = static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(n.in_place)]);
            if (!p.keep[reused] && remaining_[reused].load(std::memory_order_relaxed) == 1) out = slots_[reused];
        }
        {
            const op_scope scope(ctx, n.op.c_str());
            if (n.fused())
                detail::run_fused(n, inputs, out, ctx);
            else
                n.kernel(inputs, out);
        }
        slots_[static_cast<std::size_t>(n.output)] = std::move(out);
        inputs.clear();
        if (!release) return;
        for (int in : n.inputs) {
            const auto id = static_cast<std::size_t>(in);
            if (remaining_[id].fetch_sub(1, std::memory_order_acq_rel) == 1 && !p.keep[id]) slots_[id] = {};
        }
    }

    void run_parallel(const Graph& g, Context& ctx, const plan& p, bool release) {
        std::vector<int> ready;
        std::vector<std::atomic<int>> pending(p.nodes.size());
        for (std::size_t k = 0; k < p.nodes.size(); ++k) {
            pending[k].store(p.pending[k], std::memory_order_relaxed);
            if (p.pending[k] == 0) ready.push_back(static_cast<int>(k));
        }
        std::mutex mutex;
        std::condition_variable wake;
        std::size_t done = 0;
        std::exception_ptr error;
        ctx.parallel_for(ctx.concurrency(), [&](std::int64_t) {
            const serial_scope one_thread_per_op;
            std::vector<any_tensor> inputs;
            for (;;) {
                int k;
                {
                    std::unique_lock lock(mutex);
                    wake.wait(lock, [&] { return !ready.empty() || done == p.nodes.size() || error; });
                    if (ready.empty() || error) return;
                    k = ready.back();
                    ready.pop_back();
                }
                try {
                    execute(g, ctx, p, p.nodes[static_cast<std::size_t>(k)], release, inputs);
                } catch (...) {
                    std::lock_guard lock(mutex);
                    if (!error) error = std::current_exception();
                    ready.clear();
                    wake.notify_all();
                    return;
                }
                std::lock_guard lock(mutex);
                ++done;
                for (int c : p.consumers[static_cast<std::size_t>(k)])
                    if (pending[static_cast<std::size_t>(c)].fetch_sub(1, std::memory_order_relaxed) == 1) ready.push_back(c);
                wake.notify_all();
            }
        });
        if (error) std::rethrow_exception(error);
    }

    std::map<std::pair<std::vector<int>, std::vector<int>>, plan> plans_;
    std::vector<any_tensor> slots_;
    std::vector<std::atomic<int>> remaining_;
    std::vector<any_tensor> scratch_;
};

}  // namespace dl::graph
