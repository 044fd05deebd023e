#pragma once
// Passes that prepare a trained model for serving: conv + batch_norm folding and int8 post-training
// quantization of linear nodes take the parameters' values when they run (the rewritten graph holds
// constants derived from them, so later training does not show in it: trace and optimise again).
// Magnitude and channel pruning zero parameters in place and record what they zeroed for fine-tuning.
// Replacement nodes are recorded from the ops' public functions (splice), like traced ones.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../autograd/conv.hpp"
#include "../autograd/quantized.hpp"
#include "../core/creation.hpp"
#include "executor.hpp"
#include "passes.hpp"
#include "tracer.hpp"

namespace dl::graph {

namespace detail {

/// "HxW" (autograd::detail::describe) back to an extent.
[[nodiscard]] inline extent2 parse_extent(const node& n, std::string_view key) {
    const std::string_view text = attribute(n, key);
    const std::size_t x = text.find('x');
    std::int64_t h = 0, w = 0;
    const bool ok = x != std::string_view::npos &&
                    std::from_chars(text.data(), text.data() + x, h).ptr == text.data() + x &&
                    std::from_chars(text.data() + x + 1, text.data() + text.size(), w).ptr == text.data() + text.size();
    if (!ok) unreadable_attribute(n.op, n.attributes, key);
    return {h, w};
}

[[nodiscard]] inline bool is_fixed(const Graph& g, int id) {
    const value_source s = g.values[static_cast<std::size_t>(id)].source;
    return s == value_source::parameter || s == value_source::constant;
}

/// Removes the nodes that make `outputs`.
inline void remove_nodes_making(Graph& g, std::initializer_list<int> outputs) {
    std::vector<node> kept;
    for (auto& n : g.nodes)
        if (std::find(outputs.begin(), outputs.end(), n.output) == outputs.end()) kept.push_back(std::move(n));
    g.nodes = std::move(kept);
    g.reindex();
}

/// Folds one inference batch_norm into the conv2d before it; false when there is none to fold.
/// A template (as are fold_batch_norm and inference_passes) so that only the translation units that use
/// the pass compile the conv2d it splices in for every floating dtype: g++ takes ~7 s per dtype, which
/// every file including <dl/dl.hpp> paid when these were plain inline functions.
template <class = void>
bool fold_one_batch_norm(Graph& g) {
    const std::vector<int> uses = g.use_counts();
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        const node& bn = g.nodes[i];
        if (bn.op != "batch_norm" || bn.kind == op_kind::effectful || attribute(bn, "training") != "false") continue;
        // x, running mean, running var, and weight and bias when both are present (with one of them
        // absent the inputs do not say which).
        if (bn.inputs.size() != 5 && bn.inputs.size() != 3) continue;
        if (!std::all_of(bn.inputs.begin() + 1, bn.inputs.end(), [&](int id) { return is_fixed(g, id); })) continue;
        const int x = bn.inputs[0];
        const value& xv = g.values[static_cast<std::size_t>(x)];
        if (xv.source != value_source::node || uses[static_cast<std::size_t>(x)] != 1 ||
            std::find(g.outputs.begin(), g.outputs.end(), x) != g.outputs.end())
            continue;
        const std::size_t at = static_cast<std::size_t>(xv.producer);
        const node& conv = g.nodes[at];
        if (conv.op != "conv2d" || attribute(conv, "act") != "0" || !attribute(conv, "max_pool").empty() || conv.inputs.size() < 2 ||
            !std::all_of(conv.inputs.begin() + 1, conv.inputs.end(), [&](int id) { return is_fixed(g, id); }))
            continue;
        const conv2d_options options{parse_extent(conv, "stride"), parse_extent(conv, "padding"),
                                     parse_extent(conv, "dilation"), parse_attribute<std::int64_t>(conv, "groups")};
        const double eps = parse_attribute<double>(bn, "eps");
        const std::vector<int> conv_inputs = conv.inputs, bn_inputs = bn.inputs;
        const int conv_out = conv.output, bn_out = bn.output;
        const any_tensor& weight_data = g.values[static_cast<std::size_t>(conv_inputs[1])].data;
        Context& ctx = context_of(weight_data);
        const int folded = std::visit(
            [&]<class W>(const W& weight) -> int {
                if constexpr (std::is_same_v<W, std::monostate>) {
                    dl::detail::fail("dl::graph::fold_batch_norm: conv2d without a weight tensor");
                } else if constexpr (!is_floating_element<typename W::value_type>) {
                    dl::detail::fail("dl::graph::fold_batch_norm: conv2d with a ", dtype_name(W::dtype()), " weight");
                } else {
                    using T = typename W::value_type;
                    const no_grad off(ctx);
                    auto fixed = [&](int id) { return std::get<Tensor<T>>(g.values[static_cast<std::size_t>(id)].data).detach(); };
                    const std::int64_t channels = weight.shape()[0];
                    const Tensor<T> mean = fixed(bn_inputs[1]), var = fixed(bn_inputs[2]);
                    const Tensor<T> gamma = bn_inputs.size() == 5 ? fixed(bn_inputs[3]) : ones<T>({channels}, ctx);
                    const Tensor<T> beta = bn_inputs.size() == 5 ? fixed(bn_inputs[4]) : zeros<T>({channels}, ctx);
                    const Tensor<T> bias = conv_inputs.size() == 3 ? fixed(conv_inputs[2]) : zeros<T>({channels}, ctx);
                    // bn(conv(x, w) + b) = conv(x, w·s) + (b − mean)·s + beta, with s = gamma / √(var + eps)
                    const Tensor<T> scale = gamma * rsqrt(var + T(eps));
                    const Tensor<T> folded_weight = weight.detach() * scale.reshape({channels, 1, 1, 1});
                    const Tensor<T> folded_bias = (bias - mean) * scale + beta;
                    const Tensor<T> example = zeros<T>(g.values[static_cast<std::size_t>(conv_inputs[0])].shape, ctx);
                    const std::pair<int, any_tensor> bound[] = {{conv_inputs[0], example}};
                    return splice(g, at, ctx, bound, [&] { return conv2d(example, folded_weight, folded_bias, options); });
                }
            },
            weight_data);
        g.replace_uses(bn_out, folded);
        remove_nodes_making(g, {conv_out, bn_out});
        return true;
    }
    return false;
}

}  // namespace detail

/// Folds each inference batch_norm (training=false, statistics and affine parameters fixed) that alone
/// reads a conv2d without an activation into that conv2d's weight and bias: one op instead of two and
/// no pass over the conv's output. The folded weight and bias are constants computed when the pass runs.
template <class = void>
[[nodiscard]] pass fold_batch_norm() {
    return {"fold_batch_norm", {}, {"epilogue_fusion", "memory_planning"}, [](Graph& g) {
                while (detail::fold_one_batch_norm(g)) {
                }
                detail::forget_unread(g);
            }};
}

/// int8 post-training quantization of the float32 linear and conv2d (groups 1) nodes whose weight (and
/// bias) are parameters or constants. The graph runs on each calibration batch (one tensor per graph
/// input, a few batches of real data); the range each product's input takes over them sets its uint8
/// quantization, and its weight is quantized per output channel (int8_weight). The node becomes
/// quantized_linear or quantized_conv2d, which run the int8 GEMM. Weights are quantized when the pass
/// runs.
[[nodiscard]] inline pass quantize_int8(std::vector<std::vector<any_tensor>> calibration) {
    return {"quantize_int8", {"epilogue_fusion"}, {"pool_fusion", "memory_planning"}, [calibration = std::move(calibration)](Graph& g) {
                std::vector<std::size_t> candidates;
                for (std::size_t i = 0; i < g.nodes.size(); ++i) {
                    const node& n = g.nodes[i];
                    // (A conv2d that pools in its epilogue, from pool_fusion run before, stays float.)
                    const bool product = n.op == "linear" || (n.op == "conv2d" && detail::attribute(n, "groups") == "1" &&
                                                              detail::attribute(n, "max_pool").empty());
                    if (product && g.values[static_cast<std::size_t>(n.output)].dtype == DType::float32 &&
                        std::all_of(n.inputs.begin() + 1, n.inputs.end(), [&](int id) { return detail::is_fixed(g, id); }))
                        candidates.push_back(i);
                }
                if (candidates.empty()) return;
                if (calibration.empty()) dl::detail::fail("dl::graph::quantize_int8: needs at least one calibration batch");
                std::vector<int> fetches;
                for (std::size_t i : candidates) fetches.push_back(g.nodes[i].inputs[0]);
                std::vector<float> lo(fetches.size(), std::numeric_limits<float>::infinity()), hi(fetches.size(), -lo[0]);
                Context* ctx = nullptr;
                executor run;
                for (std::size_t b = 0; b < calibration.size(); ++b) {
                    const auto& batch = calibration[b];
                    if (batch.size() != g.inputs.size())
                        dl::detail::fail("dl::graph::quantize_int8: calibration batch ", b, " has ", batch.size(),
                                         " tensors for a graph of ", g.inputs.size(), " inputs");
                    std::vector<std::pair<int, any_tensor>> feeds;
                    for (std::size_t k = 0; k < batch.size(); ++k) {
                        const value& v = g.values[static_cast<std::size_t>(g.inputs[k])];
                        if (detail::dtype_of_any(batch[k]) != v.dtype || detail::shape_of_any(batch[k]).size() != v.shape.size())
                            dl::detail::fail("dl::graph::quantize_int8: calibration batch ", b, " input ", k, " is not ",
                                             g.describe_type(g.inputs[k]));
                        feeds.emplace_back(g.inputs[k], batch[k]);
                    }
                    ctx = &detail::context_of(batch.at(0));
                    const auto seen = run.run(g, *ctx, feeds, fetches, strategy::in_order);
                    for (std::size_t f = 0; f < seen.size(); ++f) {
                        const Tensor<float> t = std::get<Tensor<float>>(seen[f]).contiguous();
                        for (std::int64_t e = 0; e < t.numel(); ++e) {
                            const float x = t.data()[e];
                            if (!std::isfinite(x))
                                dl::detail::fail("dl::graph::quantize_int8: %", fetches[f], ", the input of a linear or conv2d, holds ", x,
                                                 " in calibration batch ", b, ": only finite ranges quantize");
                            lo[f] = std::min(lo[f], x);
                            hi[f] = std::max(hi[f], x);
                        }
                    }
                }
                // Last first: a splice before node i moves only the nodes from i on.
                for (std::size_t c = candidates.size(); c-- > 0;) {
                    const node& n = g.nodes[candidates[c]];
                    const int in = n.inputs[0], out = n.output;
                    const auto act = static_cast<activation>(detail::parse_attribute<int>(n, "act"));
                    const Tensor<float>& w = std::get<Tensor<float>>(g.values[static_cast<std::size_t>(n.inputs[1])].data);
                    const bool conv = n.op == "conv2d";
                    const extent2 kernel = conv ? extent2(w.shape()[2], w.shape()[3]) : extent2(1);
                    const conv2d_options options =
                        conv ? conv2d_options{detail::parse_extent(n, "stride"), detail::parse_extent(n, "padding"),
                                              detail::parse_extent(n, "dilation"), 1, act}
                             : conv2d_options{};
                    const auto weight = std::make_shared<const int8_weight>(
                        conv ? w.contiguous().reshape({w.shape()[0], w.numel() / std::max<std::int64_t>(w.shape()[0], 1)}) : w);
                    const Tensor<float> bias =
                        n.inputs.size() == 3 ? std::get<Tensor<float>>(g.values[static_cast<std::size_t>(n.inputs[2])].data) : Tensor<float>();
                    const int bias_id = n.inputs.size() == 3 ? n.inputs[2] : -1;
                    // No element seen (empty batches): nothing to calibrate with, and 0 is exact anyway.
                    const affine_quantization q = lo[c] <= hi[c] ? affine_quantization::covering(lo[c], hi[c]) : affine_quantization{};
                    const Tensor<float> example = zeros<float>(g.values[static_cast<std::size_t>(in)].shape, *ctx);
                    std::vector<std::pair<int, any_tensor>> bound{{in, example}};
                    if (bias_id >= 0) bound.emplace_back(bias_id, bias);
                    const int quantized = splice(g, candidates[c], *ctx, bound, [&] {
                        return conv ? quantized_conv2d(example, weight, kernel, bias, q, options)
                                    : quantized_linear(example, weight, bias, q, act);
                    });
                    g.replace_uses(out, quantized);
                    detail::remove_nodes_making(g, {out});
                }
                detail::forget_unread(g);
            }};
}

/// What pruning passes zeroed: which elements of which weights (held by handle, so they are the
/// model's own parameters). Fine-tuning moves pruned weights away from zero; reapply() after each
/// optimizer step (a Trainer's after_step hook) zeroes them again, so the pruning holds.
class pruning {
public:
    void reapply() const {
        for (const auto& e : entries_)
            std::visit(
                [&]<class W>(const W& w) {
                    if constexpr (!std::is_same_v<W, std::monostate>)
                        for (const std::int64_t i : e.zeroed) w.data()[i] = typename W::value_type(0);
                },
                e.weight);
    }
    /// The weights pruned so far.
    [[nodiscard]] std::size_t weights() const noexcept { return entries_.size(); }
    /// The elements zeroed over all pruned weights, and the elements of those weights.
    [[nodiscard]] std::int64_t zeroed() const noexcept {
        std::int64_t n = 0;
        for (const auto& e : entries_) n += static_cast<std::int64_t>(e.zeroed.size());
        return n;
    }
    [[nodiscard]] std::int64_t elements() const noexcept {
        std::int64_t n = 0;
        for (const auto& e : entries_) n += detail::shape_of_any(e.weight).numel();
        return n;
    }

    /// Records that `indices` (flat, into the contiguous weight) of `weight` are pruned, and zeroes them.
    void add(const any_tensor& weight, std::vector<std::int64_t> indices) {
        const std::byte* data = detail::bytes_of_any(weight);
        auto same = std::find_if(entries_.begin(), entries_.end(), [&](const entry& e) { return detail::bytes_of_any(e.weight) == data; });
        if (same == entries_.end()) same = entries_.insert(entries_.end(), entry{weight, {}});
        same->zeroed.insert(same->zeroed.end(), indices.begin(), indices.end());
        std::sort(same->zeroed.begin(), same->zeroed.end());
        same->zeroed.erase(std::unique(same->zeroed.begin(), same->zeroed.end()), same->zeroed.end());
        reapply();
    }

private:
    struct entry {
        any_tensor weight;
        std::vector<std::int64_t> zeroed;
    };
    std::vector<entry> entries_;
};

namespace detail {

/// Calls f(weight as Tensor<T>, bias or a null tensor) for the weight of every linear and conv2d node
/// whose weight and bias are parameters or constants, each weight once.
template <class F>
void for_each_product_weight(Graph& g, F&& f) {
    std::vector<int> seen;
    for (const node& n : g.nodes) {
        if ((n.op != "linear" && n.op != "conv2d") || n.inputs.size() < 2 ||
            !std::all_of(n.inputs.begin() + 1, n.inputs.end(), [&](int id) { return is_fixed(g, id); }) ||
            std::find(seen.begin(), seen.end(), n.inputs[1]) != seen.end())
            continue;
        seen.push_back(n.inputs[1]);
        std::visit(
            [&]<class W>(const W& weight) {
                if constexpr (!std::is_same_v<W, std::monostate>) {
                    if constexpr (is_floating_element<typename W::value_type>) {
                        if (!weight.is_contiguous())
                            dl::detail::fail("dl::graph: pruning needs contiguous weights; ", n.op, " %", n.output, " has a strided one");
                        const W bias = n.inputs.size() == 3 ? std::get<W>(g.values[static_cast<std::size_t>(n.inputs[2])].data) : W();
                        f(weight, bias);
                    }
                }
            },
            g.values[static_cast<std::size_t>(n.inputs[1])].data);
    }
}

inline void check_amount(double amount, std::string_view pass) {
    if (!(amount >= 0 && amount <= 1)) dl::detail::fail("dl::graph::", pass, ": amount must be in [0, 1], got ", amount);
}

}  // namespace detail

/// Magnitude pruning: zeroes the fraction `amount` of each linear and conv2d weight with the smallest
/// magnitudes (ties broken by position), as torch.nn.utils.prune.l1_unstructured. The weights are the
/// model's parameters, changed in place; `record` keeps what was zeroed for fine-tuning. The graph does
/// not change: the zeros make no kernel faster yet (no sparse kernels).
[[nodiscard]] inline pass prune_magnitude(double amount, pruning& record) {
    detail::check_amount(amount, "prune_magnitude");
    return {"prune_magnitude", {}, {"constant_folding"}, [amount, &record](Graph& g) {
                detail::for_each_product_weight(g, [&](const auto& weight, const auto&) {
                    const std::int64_t n = weight.numel();
                    const auto k = static_cast<std::int64_t>(std::llround(amount * static_cast<double>(n)));
                    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
                    for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
                    auto magnitude = [&](std::int64_t i) { return std::abs(static_cast<double>(weight.data()[i])); };
                    std::nth_element(order.begin(), order.begin() + k, order.end(), [&](std::int64_t a, std::int64_t b) {
                        return magnitude(a) < magnitude(b) || (magnitude(a) == magnitude(b) && a < b);
                    });
                    order.resize(static_cast<std::size_t>(k));
                    record.add(weight, std::move(order));
                });
            }};
}

/// Structured pruning: zeroes the fraction `amount` of each linear and conv2d layer's output channels
/// (weight rows, with their bias entries) with the smallest L2 norms, as
/// torch.nn.utils.prune.ln_structured(n=2, dim=0). A zeroed channel outputs act(0) for every input.
/// Unfinished: the channels are zeroed, not removed; shrinking the weight and the next layer's inputs
/// (the speed-up) is a rewrite still to come.
[[nodiscard]] inline pass prune_channels(double amount, pruning& record) {
    detail::check_amount(amount, "prune_channels");
    return {"prune_channels", {}, {"constant_folding"}, [amount, &record](Graph& g) {
                detail::for_each_product_weight(g, [&](const auto& weight, const auto& bias) {
                    const std::int64_t channels = weight.shape()[0], per = channels ? weight.numel() / channels : 0;
                    const auto k = static_cast<std::int64_t>(std::llround(amount * static_cast<double>(channels)));
                    std::vector<double> norm(static_cast<std::size_t>(channels), 0.0);
                    for (std::int64_t c = 0; c < channels; ++c)
                        for (std::int64_t i = 0; i < per; ++i) {
                            const double v = static_cast<double>(weight.data()[c * per + i]);
                            norm[static_cast<std::size_t>(c)] += v * v;
                        }
                    std::vector<std::int64_t> order(static_cast<std::size_t>(channels));
                    for (std::int64_t c = 0; c < channels; ++c) order[static_cast<std::size_t>(c)] = c;
                    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
                        return norm[static_cast<std::size_t>(a)] < norm[static_cast<std::size_t>(b)];
                    });
                    order.resize(static_cast<std::size_t>(k));
                    std::vector<std::int64_t> elements;
                    for (const std::int64_t c : order)
                        for (std::int64_t i = 0; i < per; ++i) elements.push_back(c * per + i);
                    record.add(weight, std::move(elements));
                    if (bias.defined()) record.add(bias, order);
                });
            }};
}

/// default_passes() with batch_norm folding: for a trained model in evaluation mode.
template <class = void>
[[nodiscard]] pass_manager inference_passes() {
    pass_manager m = default_passes();
    m.add(fold_batch_norm());
    return m;
}

}  // namespace dl::graph
