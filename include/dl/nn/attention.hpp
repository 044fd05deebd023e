#pragma once
// Multi-head scaled dot-product attention over batch-first sequences, as torch.nn.MultiheadAttention
// with batch_first = true: in_proj_weight [3E, E] and in_proj_bias [3E] project queries, keys and
// values; out_proj maps the concatenated heads back to E.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "../autograd/linalg.hpp"
#include "../autograd/softmax.hpp"
#include "init.hpp"
#include "layers.hpp"

namespace dl::nn {

template <class T = float>
class multihead_attention {
public:
    multihead_attention(std::int64_t embed_dim, std::int64_t heads, Context& ctx = default_context())
        : out_proj(embed_dim, embed_dim, true, ctx), heads_(heads) {
        if (embed_dim <= 0 || heads <= 0 || embed_dim % heads != 0)
            dl::detail::fail("dl::nn::multihead_attention: embed_dim ", embed_dim, " must be a positive multiple of heads ",
                             heads);
        in_proj_weight = Tensor<T>({3 * embed_dim, embed_dim}, ctx);
        init::xavier_uniform_(in_proj_weight);
        in_proj_weight.requires_grad_();
        in_proj_bias = zeros<T>({3 * embed_dim}, ctx).requires_grad_();
        init::zeros_(out_proj.bias);
    }

    /// query [N, L, E], key and value [N, S, E] -> [N, L, E]. `causal`: position i attends to keys
    /// 0..i only (needs L == S). `mask` (optional, [L, S]) is added to the scores before the softmax
    /// (-inf blocks a pair).
    Tensor<T> operator()(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value, bool causal = false,
                         const Tensor<T>& mask = {}) {
        const std::int64_t e = in_proj_weight.shape()[1];
        for (const Tensor<T>* x : {&query, &key, &value})
            if (x->rank() != 3 || x->shape()[2] != e || x->shape()[0] != query.shape()[0])
                dl::detail::fail("dl::nn::multihead_attention: expected query [N, L, ", e, "] and key, value [N, S, ", e,
                                 "], got shapes ", query.shape(), ", ", key.shape(), ", ", value.shape());
        if (key.shape() != value.shape())
            dl::detail::fail("dl::nn::multihead_attention: key ", key.shape(), " and value ", value.shape(),
                             " must have one shape");
        const std::int64_t n = query.shape()[0], l = query.shape()[1], s = key.shape()[1], d = e / heads_;
        if (causal && l != s) dl::detail::fail("dl::nn::multihead_attention: causal attention needs L == S, got ", l, " and ", s);
        if (mask.defined() && mask.shape() != Shape{l, s})
            dl::detail::fail("dl::nn::multihead_attention: mask must be [", l, ", ", s, "], got ", mask.shape());

        // [N, len, E] -> [N * heads, len, d], projected with rows [k E, (k+1) E) of the packed weight.
        auto heads = [&](const Tensor<T>& x, std::int64_t k) {
            const std::int64_t len = x.shape()[1];
            const Tensor<T> y = dl::linear(x.reshape({n * len, e}), in_proj_weight.slice(0, k * e, (k + 1) * e),
                                       in_proj_bias.slice(0, k * e, (k + 1) * e));
            return y.reshape({n, len, heads_, d}).permute({0, 2, 1, 3}).reshape({n * heads_, len, d});
        };
        const Tensor<T> q = heads(query, 0), k = heads(key, 1), v = heads(value, 2);
        Tensor<T> scores = matmul(q, k.transpose(1, 2)) * T(1 / std::sqrt(static_cast<double>(d)));
        if (causal) scores = scores + causal_mask(l, query.context());
        if (mask.defined()) scores = scores + mask;
        const Tensor<T> context = matmul(dl::softmax(scores, -1), v);
        const Tensor<T> merged = context.reshape({n, heads_, l, d}).permute({0, 2, 1, 3}).reshape({n * l, e});
        return out_proj(merged).reshape({n, l, e});
    }
    template <class F>
    void for_each_parameter(F&& f) {
        f(std::string_view("in_proj_weight"), in_proj_weight), f(std::string_view("in_proj_bias"), in_proj_bias);
        visit(f, "out_proj", out_proj);
    }
    void train(bool = true) {}

    Tensor<T> in_proj_weight, in_proj_bias;
    linear<T> out_proj;

private:
    /// [L, L]: 0 on and below the diagonal, -inf above.
    static Tensor<T> causal_mask(std::int64_t l, Context& ctx) {
        Tensor<T> m = zeros<T>({l, l}, ctx);
        for (std::int64_t i = 0; i < l; ++i)
            for (std::int64_t j = i + 1; j < l; ++j) m(i, j) = -std::numeric_limits<T>::infinity();
        return m;
    }

    std::int64_t heads_;
};

}  // namespace dl::nn
