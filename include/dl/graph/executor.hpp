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
#include "../autograd/tiles.hpp"
#include "../device/cpu/elementwise.hpp"
#include "../prof/profiler.hpp"
#include "ir.hpp"

namespace dl::graph {

enum class strategy : std::uint8_t { in_order, parallel };

namespace detail {

using autograd::detail::bytes_of_any;
using autograd::detail::context_of;
using autograd::detail::dtype_of_any;
using autograd::detail::make_tensor;
using autograd::detail::shape_of_any;
using autograd::detail::tiled_input;
using autograd::detail::tiled_layout;

/// Runs a fused node: its compiled loop when it has one, else its steps tile by tile
/// (autograd/tiles.hpp). `out` may hold the buffer to write into.
inline void run_fused(const node& n, std::span<const any_tensor> inputs, any_tensor& out, Context& ctx) {
    const tiled_layout layout = autograd::detail::lay_out_tiles(n.steps, inputs, out, ctx, n.op);
    if (!n.compiled) return autograd::detail::run_steps(n.steps, layout, ctx);
    // One loop over the whole chain in registers, as a compile-time fused expression runs; each
    // worker takes a run of whole tiles.
    std::vector<unsigned char> broadcast;
    for (const tiled_input& src : layout.sources) broadcast.push_back(src.tiled ? 0 : 1);
    // Compiled chains are float32 throughout; runs start on whole tiles, so they stay aligned.
    const bool stream = dl::detail::streams(reinterpret_cast<const float*>(layout.out_data), layout.numel);
    ctx.parallel_for(layout.workers, [&](std::int64_t w) {
        const std::int64_t begin = std::min(layout.numel, w * layout.tiles / layout.workers * layout.tile);
        const std::int64_t end = std::min(layout.numel, (w + 1) * layout.tiles / layout.workers * layout.tile);
        std::vector<const void*> data;
        for (const tiled_input& src : layout.sources)
            data.push_back(src.data + (src.tiled ? static_cast<std::size_t>(begin) * src.element : 0));
        n.compiled.run(data.data(), broadcast.data(), layout.out_data + static_cast<std::size_t>(begin) * layout.out_element, end - begin,
                        stream);
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
