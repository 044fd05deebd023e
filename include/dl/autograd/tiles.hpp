#pragma once
// Chains of elementwise ops run tile by tile over raw memory: each step's tile kernel (the op's functor
// in the device's row loop, autograd/tracing.hpp) over a tile of a few KiB before the next tile, so
// that the intermediates stay in L1. A graph's fused node runs here (graph/executor.hpp), and so does
// every traced elementwise op as a chain of one step: its kernel is its tile kernel and this one
// driver, not an expression assignment compiled per op into every file that writes an expression.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "../core/context.hpp"
#include "../device/cpu/elementwise.hpp"
#include "tracing.hpp"

namespace dl::autograd {

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

[[nodiscard]] inline Context& context_of(const any_tensor& t) {
    return std::visit(
        []<class V>(const V& x) -> Context& {
            if constexpr (std::is_same_v<V, std::monostate>)
                return default_context();
            else
                return x.context();
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

/// An input of a tiled run: read tile by tile (`tiled`), or its one element broadcast whole.
struct tiled_input {
    any_tensor tensor;  ///< holds the (contiguous) storage for the run
    std::byte* data;
    std::size_t element;
    bool tiled;
};

/// A chain's inputs and output laid out for a tiled run, and how the run splits: `tiles` tiles of
/// `tile` elements over `workers` threads of the pool.
struct tiled_layout {
    std::int64_t numel = 0;
    std::vector<tiled_input> sources;
    std::byte* out_data = nullptr;
    std::size_t out_element = 0;
    std::int64_t streamed = 0;  ///< bytes per element from and to memory: tiled inputs and output
    std::int64_t tile = 0, tiles = 0, workers = 1;
};

/// Broadcasts the inputs to one shape and makes `out` a contiguous tensor of it and of the chain's
/// dtype (keeping the buffer `out` holds when it is one). Single elements broadcast whole; every other
/// input is read tile by tile, expanded to the full shape first if it broadcasts along some dimensions
/// (the fusion pass fuses none of those, but single traced or loaded ops run here too).
[[nodiscard]] inline tiled_layout lay_out_tiles(std::span<const fused_step> chain, std::span<const any_tensor> inputs,
                                               any_tensor& out, Context& ctx, std::string_view op) {
    Shape shape;
    for (const auto& in : inputs) shape = broadcast_shapes(shape, shape_of_any(in), op);
    tiled_layout layout;
    layout.numel = shape.numel();
    const DType result = chain.back().dtype;
    if (out.index() == 0 || shape_of_any(out) != shape || dtype_of_any(out) != result || !is_contiguous_any(out))
        out = make_tensor(result, shape, ctx);
    layout.sources.reserve(inputs.size());
    for (const auto& in : inputs) {
        const bool tiled = shape_of_any(in).numel() > 1 && layout.numel > 1;
        any_tensor t = !tiled ? in : dense_any(in, shape);
        std::byte* data = bytes_of_any(t);
        layout.sources.push_back({std::move(t), data, dtype_size(dtype_of_any(in)), tiled});
    }
    layout.out_data = bytes_of_any(out);
    layout.out_element = dtype_size(result);
    layout.streamed = static_cast<std::int64_t>(layout.out_element);
    for (const tiled_input& src : layout.sources) layout.streamed += src.tiled ? static_cast<std::int64_t>(src.element) : 0;
    std::int64_t stream_bytes = layout.streamed;  // per element, over all streams, the steps' results too
    for (std::size_t s = 0; s + 1 < chain.size(); ++s) stream_bytes += static_cast<std::int64_t>(dtype_size(chain[s].dtype));
    layout.tile = std::clamp<std::int64_t>(fused_tile_bytes / stream_bytes / 64 * 64, 256, 4096);
    layout.tiles = (layout.numel + layout.tile - 1) / layout.tile;
    // Threads as an eager loop of the same work would take: the steps' costs per element, plus one
    // for the output. Waking a worker costs more than a small node (a ReLU's gradient at batch 32).
    std::int64_t cost = 1;
    for (const fused_step& step : chain) cost += step.tile.cost;
    layout.workers = std::min(layout.tiles, dl::detail::parallel_chunks(layout.numel * cost,
                                                                        serial_scope::active() ? 1 : ctx.concurrency()));
    return layout;
}

/// Runs every step of the chain over one tile before the next tile, each worker of the pool taking a
/// contiguous range of tiles.
inline void run_steps(std::span<const fused_step> chain, const tiled_layout& layout, Context& ctx) {
    const bool prefetch = layout.numel * layout.streamed > fused_prefetch_bytes;
    ctx.parallel_for(layout.workers, [&](std::int64_t w) {
        const std::size_t steps = chain.size();
        std::vector<any_tensor> buffers(steps - 1);
        std::vector<std::byte*> buffer_data(steps - 1);
        for (std::size_t s = 0; s + 1 < steps; ++s) {
            buffers[s] = make_tensor(chain[s].dtype, {layout.tile}, ctx);
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
            for (int i : chain[s].inputs) {
                if (i < 0) {
                    operands.push_back({buffer_data[static_cast<std::size_t>(-1 - i)], false});
                    places.push_back({buffer_data[static_cast<std::size_t>(-1 - i)], 0});
                } else {
                    const tiled_input& src = layout.sources[static_cast<std::size_t>(i)];
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
            return (static_cast<std::size_t>(layout.tile) * element / steps + 63) & ~std::size_t{63};
        };
        for (std::int64_t t = w * layout.tiles / layout.workers; t < (w + 1) * layout.tiles / layout.workers; ++t) {
            const std::int64_t begin = t * layout.tile, count = std::min(layout.tile, layout.numel - begin);
            lines.clear();
            if (prefetch && t + 1 < (w + 1) * layout.tiles / layout.workers) {
                const auto next = static_cast<std::size_t>(begin + layout.tile);
                const auto next_count = static_cast<std::size_t>(std::min(layout.tile, layout.numel - begin - layout.tile));
                for (const tiled_input& src : layout.sources)
                    if (src.tiled)
                        lines.push_back({src.data + next * src.element, next_count * src.element, per_step(src.element), false});
                lines.push_back({layout.out_data + next * layout.out_element, next_count * layout.out_element, per_step(layout.out_element), true});
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
                                             : static_cast<void*>(layout.out_data + static_cast<std::size_t>(begin) * layout.out_element);
                chain[s].tile.run(operands.data() + first[s], target, count);
            }
        }
    });
}

/// The kernel of an elementwise op of `inputs` operands (recorded as `op` with `attributes`) whose result
/// has dtype `result`: its tile kernel run as a chain of one step over the op's inputs in order.
[[nodiscard]] inline op_kernel step_kernel(std::string op, std::string attributes, std::size_t inputs, DType result,
                                           tile_kernel tile) {
    fused_step step{std::move(op), std::move(attributes), {}, result, std::move(tile)};
    for (std::size_t i = 0; i < inputs; ++i) step.inputs.push_back(static_cast<int>(i));
    return [step = std::move(step)](std::span<const any_tensor> inputs, any_tensor& out) {
        Context& ctx = inputs.empty() ? default_context() : context_of(inputs.front());
        const std::span<const fused_step> chain(&step, 1);
        run_steps(chain, lay_out_tiles(chain, inputs, out, ctx, step.op), ctx);
    };
}

}  // namespace detail

}  // namespace dl::autograd
