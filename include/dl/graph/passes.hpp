#pragma once
// Graph passes and the pass manager. A pass names the passes it needs (they run first when both are
// in a pipeline) and the ones it invalidates (those run after it); the manager derives the order from
// that, times each pass and verifies the graph after each. DL_DEBUG=1 prints the order and the times,
// DL_DEBUG=2 the graph after every pass too.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "executor.hpp"
#include "ir.hpp"

namespace dl::graph {

struct pass {
    std::string name;
    std::vector<std::string> needs;        ///< passes that run before this one when both are in a pipeline
    std::vector<std::string> invalidates;  ///< passes whose result this one undoes: they run after it
    std::function<void(Graph&)> run;
};

struct pass_timing {
    std::string name;
    double milliseconds;
    std::size_t nodes_after;
};

class pass_manager {
public:
    pass_manager& add(pass p) {
        for (const auto& q : passes_)
            if (q.name == p.name) dl::detail::fail("dl::graph::pass_manager: pass ", p.name, " added twice");
        passes_.push_back(std::move(p));
        return *this;
    }

    /// The passes in the order they run: every requirement and invalidation respected, otherwise the
    /// order they were added in.
    [[nodiscard]] std::vector<const pass*> order() const {
        const std::size_t n = passes_.size();
        auto index_of = [&](const std::string& name) {
            for (std::size_t i = 0; i < n; ++i)
                if (passes_[i].name == name) return static_cast<int>(i);
            return -1;
        };
        std::vector<std::vector<int>> after(n);  // after[a]: passes that must follow a
        std::vector<int> blockers(n, 0);
        auto edge = [&](int first, int second) {
            if (first < 0 || second < 0) return;
            after[static_cast<std::size_t>(first)].push_back(second);
            ++blockers[static_cast<std::size_t>(second)];
        };
        for (std::size_t i = 0; i < n; ++i) {
            for (const auto& r : passes_[i].needs) edge(index_of(r), static_cast<int>(i));
            for (const auto& v : passes_[i].invalidates) edge(static_cast<int>(i), index_of(v));
        }
        std::vector<const pass*> result;
        std::vector<char> placed(n, 0);
        while (result.size() < n) {
            std::size_t next = n;
            for (std::size_t i = 0; i < n && next == n; ++i)
                if (!placed[i] && blockers[i] == 0) next = i;
            if (next == n) dl::detail::fail("dl::graph::pass_manager: the passes' requirements form a cycle");
            placed[next] = 1;
            result.push_back(&passes_[next]);
            for (int s : after[next]) --blockers[static_cast<std::size_t>(s)];
        }
        return result;
    }

    std::vector<pass_timing> run(Graph& g) const {
        const char* env = std::getenv("DL_DEBUG");
        const int debug = env ? std::atoi(env) : 0;
        const auto passes = order();
        if (debug >= 1) {
            std::cerr << "dl::graph: pipeline";
            for (const pass* p : passes) std::cerr << ' ' << p->name;
            std::cerr << '\n';
        }
        g.verify();
        std::vector<pass_timing> timings;
        for (const pass* p : passes) {
            const auto start = std::chrono::steady_clock::now();
            p->run(g);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
            try {
                g.verify();
            } catch (const std::exception& e) {
                dl::detail::fail("dl::graph: after pass ", p->name, ": ", e.what());
            }
            timings.push_back({p->name, ms, g.nodes.size()});
            if (debug >= 1) std::cerr << "dl::graph: " << p->name << ' ' << ms << " ms, " << g.nodes.size() << " nodes\n";
            if (debug >= 2) std::cerr << g.to_string();
        }
        return timings;
    }

private:
    std::vector<pass> passes_;
};

namespace detail {

/// Keeps the nodes for which keep(i) holds, in order.
template <class Keep>
void keep_nodes(Graph& g, Keep&& keep) {
    std::vector<node> kept;
    kept.reserve(g.nodes.size());
    for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
        if (keep(i)) kept.push_back(std::move(g.nodes[static_cast<std::size_t>(i)]));
    g.nodes = std::move(kept);
    g.reindex();
}

/// Drops the constants and parameters that no node or output reads any more.
inline void forget_unread(Graph& g) {
    const std::vector<int> uses = g.use_counts();
    for (std::size_t id = 0; id < g.values.size(); ++id) {
        value& v = g.values[id];
        if ((v.source == value_source::constant || v.source == value_source::parameter) && uses[id] == 0) {
            v.source = value_source::node;  // unreferenced: made by no node
            v.data = {};
        }
    }
}

[[nodiscard]] inline bool mergeable(const node& n) { return n.kind != op_kind::effectful && !n.fused(); }

}  // namespace detail

/// Removes the nodes no output needs (ops with effects stay) and the constants and parameters nothing
/// reads.
[[nodiscard]] inline pass dead_code_elimination() {
    return {"dead_code_elimination", {"common_subexpression_elimination", "constant_folding"}, {"memory_planning"},
            [](Graph& g) {
                std::vector<char> live(g.values.size(), 0), keep(g.nodes.size(), 0);
                for (int out : g.outputs) live[static_cast<std::size_t>(out)] = 1;
                for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
                    const node& n = g.nodes[static_cast<std::size_t>(i)];
                    if (!live[static_cast<std::size_t>(n.output)] && n.kind != op_kind::effectful) continue;
                    keep[static_cast<std::size_t>(i)] = 1;
                    for (int in : n.inputs) live[static_cast<std::size_t>(in)] = 1;
                }
                detail::keep_nodes(g, [&](int i) { return keep[static_cast<std::size_t>(i)] != 0; });
                detail::forget_unread(g);
            }};
}

/// Merges nodes that apply the same op, with the same attributes, to the same inputs.
[[nodiscard]] inline pass common_subexpression_elimination() {
    return {"common_subexpression_elimination", {}, {"memory_planning"}, [](Graph& g) {
                std::map<std::tuple<std::string, std::string, std::vector<int>>, int> seen;
                std::vector<char> keep(g.nodes.size(), 1);
                for (std::size_t i = 0; i < g.nodes.size(); ++i) {
                    node& n = g.nodes[i];
                    if (!detail::mergeable(n)) continue;
                    auto [it, inserted] = seen.try_emplace({n.op, n.attributes, n.inputs}, n.output);
                    if (inserted) continue;
                    g.replace_uses(n.output, it->second);
                    keep[i] = 0;
                }
                detail::keep_nodes(g, [&](int i) { return keep[static_cast<std::size_t>(i)] != 0; });
            }};
}

/// Runs, once, every node whose inputs are all constants, and makes its result a constant. Parameters
/// are not constants: training changes them.
[[nodiscard]] inline pass constant_folding() {
    return {"constant_folding", {}, {"memory_planning"}, [](Graph& g) {
                std::vector<char> keep(g.nodes.size(), 1);
                for (std::size_t i = 0; i < g.nodes.size(); ++i) {
                    node& n = g.nodes[i];
                    if (!detail::mergeable(n) || n.inputs.empty()) continue;
                    const bool all_constant = std::all_of(n.inputs.begin(), n.inputs.end(), [&](int in) {
                        return g.values[static_cast<std::size_t>(in)].source == value_source::constant;
                    });
                    if (!all_constant) continue;
                    std::vector<any_tensor> inputs;
                    for (int in : n.inputs) inputs.push_back(g.values[static_cast<std::size_t>(in)].data);
                    any_tensor out;
                    n.kernel(inputs, out);
                    value& v = g.values[static_cast<std::size_t>(n.output)];
                    v.source = value_source::constant;
                    v.data = std::move(out);
                    keep[i] = 0;
                }
                detail::keep_nodes(g, [&](int i) { return keep[static_cast<std::size_t>(i)] != 0; });
            }};
}

/// Joins connected elementwise nodes of one shape into a fused node that runs the whole chain tile by
/// tile (detail::run_fused), so the intermediates stay in cache: k traced ops cost about one pass over
/// memory instead of k. A node joins when its inputs have its shape or are single elements, and its
/// result is read only inside the group.
[[nodiscard]] inline pass elementwise_fusion() {
    return {"elementwise_fusion", {"dead_code_elimination"}, {"memory_planning"}, [](Graph& g) {
                const std::vector<int> uses = g.use_counts();
                std::vector<char> is_output(g.values.size(), 0);
                for (int out : g.outputs) is_output[static_cast<std::size_t>(out)] = 1;
                auto fusable = [&](const node& n) {
                    if (n.kind != op_kind::elementwise || n.fused() || !n.tile) return false;
                    const Shape& shape = g.values[static_cast<std::size_t>(n.output)].shape;
                    return std::all_of(n.inputs.begin(), n.inputs.end(), [&](int in) {
                        const Shape& s = g.values[static_cast<std::size_t>(in)].shape;
                        return s == shape || s.numel() == 1;
                    });
                };
                const int count = static_cast<int>(g.nodes.size());
                std::vector<int> group_of(static_cast<std::size_t>(count), -1);
                std::vector<node> fused_nodes;  // by root position
                std::vector<int> root_of_fused(static_cast<std::size_t>(count), -1);
                for (int root = count - 1; root >= 0; --root) {
                    const node& r = g.nodes[static_cast<std::size_t>(root)];
                    if (group_of[static_cast<std::size_t>(root)] >= 0 || !fusable(r)) continue;
                    const Shape& shape = g.values[static_cast<std::size_t>(r.output)].shape;
                    std::vector<int> members{root};
                    group_of[static_cast<std::size_t>(root)] = root;
                    // Grow towards producers: a producer joins when every read of its result is a member's.
                    for (std::size_t m = 0; m < members.size(); ++m) {
                        for (int in : g.nodes[static_cast<std::size_t>(members[m])].inputs) {
                            const value& v = g.values[static_cast<std::size_t>(in)];
                            if (v.source != value_source::node || is_output[static_cast<std::size_t>(in)] || v.shape != shape)
                                continue;
                            const int p = v.producer;
                            if (group_of[static_cast<std::size_t>(p)] >= 0 || !fusable(g.nodes[static_cast<std::size_t>(p)])) continue;
                            int reads_inside = 0;
                            for (int member : members)
                                for (int x : g.nodes[static_cast<std::size_t>(member)].inputs) reads_inside += x == in;
                            if (reads_inside != uses[static_cast<std::size_t>(in)]) continue;
                            group_of[static_cast<std::size_t>(p)] = root;
                            members.push_back(p);
                        }
                    }
                    if (members.size() < 2) {
                        group_of[static_cast<std::size_t>(root)] = -1;
                        continue;
                    }
                    std::sort(members.begin(), members.end());
                    node f;
                    f.op = "fused";
                    f.kind = op_kind::elementwise;
                    f.output = r.output;
                    std::map<int, int> step_of_value;  // interior value -> step
                    for (int member : members) {
                        node& n = g.nodes[static_cast<std::size_t>(member)];
                        fused_step step{n.op, n.attributes, {}, g.values[static_cast<std::size_t>(n.output)].dtype, std::move(n.tile)};
                        for (int in : n.inputs) {
                            if (auto it = step_of_value.find(in); it != step_of_value.end()) {
                                step.inputs.push_back(-1 - it->second);
                                continue;
                            }
                            auto pos = std::find(f.inputs.begin(), f.inputs.end(), in);
                            if (pos == f.inputs.end()) pos = f.inputs.insert(f.inputs.end(), in);
                            step.inputs.push_back(static_cast<int>(pos - f.inputs.begin()));
                        }
                        f.attributes += (f.attributes.empty() ? "" : ", ") + n.op;
                        step_of_value[n.output] = static_cast<int>(f.steps.size());
                        f.steps.push_back(std::move(step));
                    }
                    root_of_fused[static_cast<std::size_t>(root)] = static_cast<int>(fused_nodes.size());
                    fused_nodes.push_back(std::move(f));
                }
                std::vector<node> result;
                for (int i = 0; i < count; ++i) {
                    if (const int f = root_of_fused[static_cast<std::size_t>(i)]; f >= 0)
                        result.push_back(std::move(fused_nodes[static_cast<std::size_t>(f)]));
                    else if (group_of[static_cast<std::size_t>(i)] < 0)
                        result.push_back(std::move(g.nodes[static_cast<std::size_t>(i)]));
                }
                g.nodes = std::move(result);
                g.reindex();
            }};
}

/// Folds an activation op (relu, sigmoid, tanh, gelu) into the product before it (linear, conv2d) when
/// the product has no activation yet and the activation is the only reader of its result: the product
/// then applies it in its GEMM epilogue, in registers, instead of a second pass over the result.
[[nodiscard]] inline pass epilogue_fusion() {
    return {"epilogue_fusion", {"dead_code_elimination"}, {"elementwise_fusion", "memory_planning"}, [](Graph& g) {
                const std::vector<int> uses = g.use_counts();
                std::vector<char> keep(g.nodes.size(), 1);
                for (std::size_t i = 0; i < g.nodes.size(); ++i) {
                    node& act = g.nodes[i];
                    static constexpr std::pair<std::string_view, activation> foldable[] = {
                        {"relu", activation::relu}, {"sigmoid", activation::sigmoid}, {"tanh", activation::tanh},
                        {"gelu", activation::gelu}};
                    const auto* match = std::find_if(std::begin(foldable), std::end(foldable),
                                                     [&](const auto& f) { return f.first == act.op; });
                    if (match == std::end(foldable) || act.kind != op_kind::elementwise || act.inputs.size() != 1 ||
                        !act.attributes.empty())
                        continue;
                    const int in = act.inputs[0];
                    const value& v = g.values[static_cast<std::size_t>(in)];
                    if (v.source != value_source::node || uses[static_cast<std::size_t>(in)] != 1) continue;
                    node& product = g.nodes[static_cast<std::size_t>(v.producer)];
                    const std::string none = "act=" + std::to_string(static_cast<int>(activation::none));
                    if (!product.with_epilogue || !product.attributes.ends_with(none)) continue;
                    product.kernel = product.with_epilogue({.act = match->second});
                    product.attributes.replace(product.attributes.size() - none.size(), none.size(),
                                               "act=" + std::to_string(static_cast<int>(match->second)));
                    g.replace_uses(act.output, in);
                    keep[i] = 0;
                }
                detail::keep_nodes(g, [&](int i) { return keep[static_cast<std::size_t>(i)] != 0; });
            }};
}

/// conv2d followed by a 2×2, stride-2 max_pool2d (the usual CNN block) into one conv2d that pools in
/// its epilogue (conv2d_options::max_pool): the convolution's output, four times the pool's, is never
/// stored or read back. After epilogue_fusion, which folds the activation between them first.
[[nodiscard]] inline pass pool_fusion() {
    return {"pool_fusion", {"epilogue_fusion"}, {"memory_planning"}, [](Graph& g) {
                const std::vector<int> uses = g.use_counts();
                std::vector<char> keep(g.nodes.size(), 1);
                for (std::size_t i = 0; i < g.nodes.size(); ++i) {
                    node& pool = g.nodes[i];
                    const std::string_view stride = detail::attribute(pool, "stride");
                    if (pool.op != "max_pool2d" || detail::attribute(pool, "kernel") != "2x2" || (stride != "0x0" && stride != "2x2") ||
                        detail::attribute(pool, "padding") != "0x0")
                        continue;
                    const int in = pool.inputs[0];
                    const value& v = g.values[static_cast<std::size_t>(in)];
                    if (v.source != value_source::node || uses[static_cast<std::size_t>(in)] != 1) continue;
                    node& conv = g.nodes[static_cast<std::size_t>(v.producer)];
                    if (conv.op != "conv2d" || !conv.with_epilogue || !detail::attribute(conv, "max_pool").empty()) continue;
                    const auto act = static_cast<activation>(detail::parse_attribute<int>(conv, "act"));
                    conv.kernel = conv.with_epilogue({.act = act, .max_pool = 2});
                    conv.attributes += ", max_pool=2";
                    conv.output = pool.output;  // the convolution's own value is left unmade
                    keep[i] = 0;
                }
                detail::keep_nodes(g, [&](int i) { return keep[static_cast<std::size_t>(i)] != 0; });
            }};
}

/// Liveness analysis and buffer reuse: the executor frees each value after its last read, and an
/// elementwise node whose input dies at that node (of its dtype and shape, in storage of its own) writes
/// its result into that input. Reports peak bytes before and after at the traced shapes.
[[nodiscard]] inline pass memory_planning() {
    return {"memory_planning", {}, {}, [](Graph& g) {
                const std::vector<int> uses = g.use_counts();
                const auto count = g.values.size();
                std::vector<char> is_output(count, 0);
                for (int out : g.outputs) is_output[static_cast<std::size_t>(out)] = 1;
                // Values share storage with the value a view was taken of: the owner.
                std::vector<int> owner(count);
                for (std::size_t id = 0; id < count; ++id) owner[id] = static_cast<int>(id);
                for (const node& n : g.nodes)
                    if (n.kind == op_kind::view) owner[static_cast<std::size_t>(n.output)] = owner[static_cast<std::size_t>(n.inputs[0])];
                constexpr int forever = 1 << 30;
                std::vector<int> last_use(count, -1);
                for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i)
                    for (int in : g.nodes[static_cast<std::size_t>(i)].inputs) {
                        auto& l = last_use[static_cast<std::size_t>(owner[static_cast<std::size_t>(in)])];
                        l = std::max(l, i);
                    }
                for (std::size_t id = 0; id < count; ++id)
                    if (is_output[id]) last_use[static_cast<std::size_t>(owner[id])] = forever;
                std::int64_t before = 0, live = 0, peak = 0;
                int in_place = 0;
                for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
                    node& n = g.nodes[static_cast<std::size_t>(i)];
                    const value& out = g.values[static_cast<std::size_t>(n.output)];
                    n.in_place = -1;
                    if (n.kind == op_kind::elementwise)
                        for (int k = 0; k < static_cast<int>(n.inputs.size()) && n.in_place < 0; ++k) {
                            const int in = n.inputs[static_cast<std::size_t>(k)];
                            const value& v = g.values[static_cast<std::size_t>(in)];
                            if (v.source != value_source::node || v.producer < 0 || owner[static_cast<std::size_t>(in)] != in ||
                                uses[static_cast<std::size_t>(in)] != 1 || is_output[static_cast<std::size_t>(in)] ||
                                v.dtype != out.dtype || v.shape != out.shape)
                                continue;
                            n.in_place = k;
                        }
                    if (n.kind != op_kind::view) {
                        before += out.bytes();
                        if (n.in_place < 0) live += out.bytes();
                    }
                    if (n.in_place >= 0) {
                        ++in_place;
                        // The output takes over the input's storage and its lifetime.
                        const int taken = n.inputs[static_cast<std::size_t>(n.in_place)];
                        owner[static_cast<std::size_t>(n.output)] = taken;
                        auto& l = last_use[static_cast<std::size_t>(taken)];
                        l = std::max(l, last_use[static_cast<std::size_t>(n.output)]);
                    }
                    peak = std::max(peak, live);
                    for (std::size_t id = 0; id < count; ++id)
                        if (owner[id] == static_cast<int>(id) && last_use[id] == i && g.values[id].source == value_source::node &&
                            g.values[id].producer >= 0 && g.nodes[static_cast<std::size_t>(g.values[id].producer)].kind != op_kind::view)
                            live -= g.values[id].bytes();
                }
                g.memory = {true, before, peak, in_place};
            }};
}

/// The passes for running a trained model: merging, folding, dead code, epilogue and elementwise
/// fusion, memory planning.
[[nodiscard]] inline pass_manager default_passes() {
    pass_manager m;
    m.add(common_subexpression_elimination())
        .add(constant_folding())
        .add(dead_code_elimination())
        .add(epilogue_fusion())
        .add(pool_fusion())
        .add(elementwise_fusion())
        .add(memory_planning());
    return m;
}

}  // namespace dl::graph
