#pragma once
// Embedding tables: rows looked up by integer id. The weight's gradient after backward is nonzero only
// in the rows that were looked up (accumulated where ids repeat).
#include <concepts>
#include <cstdint>
#include <string_view>

#include "../autograd/indexing.hpp"
#include "init.hpp"
#include "layer.hpp"

namespace dl::nn {

namespace detail {
inline void check_table(std::int64_t rows, std::int64_t dim, std::string_view name) {
    if (rows <= 0 || dim <= 0)
        dl::detail::fail("dl::nn::", name, ": rows and dimension must be positive, got ", rows, " and ", dim);
}
}  // namespace detail

/// ids of any shape -> their rows: [ids..., dim]. weight [rows, dim] initialised N(0, 1), as PyTorch.
template <class T = float>
class embedding {
public:
    embedding(std::int64_t rows, std::int64_t dim, Context& ctx = default_context()) {
        detail::check_table(rows, dim, "embedding");
        weight = Tensor<T>({rows, dim}, ctx);
        init::normal_(weight, 0, 1);
        weight.requires_grad_();
    }
    template <std::integral I>
    Tensor<T> operator()(const Tensor<I>& ids) {
        Shape shape = ids.shape();
        shape.push_back(weight.shape()[1]);
        return index_select(weight, 0, ids.reshape({ids.numel()})).reshape(shape);
    }
    template <class F>
    void for_each_parameter(F&& f) {
        f(std::string_view("weight"), weight);
    }
    void train(bool = true) {}

    Tensor<T> weight;
};

/// Bags of rows reduced to one vector each (dl::embedding_bag): ids [total] with offsets [bags] -> [bags, dim].
template <class T = float>
class embedding_bag {
public:
    embedding_bag(std::int64_t rows, std::int64_t dim, bag_mode mode = bag_mode::mean, Context& ctx = default_context())
        : mode_(mode) {
        detail::check_table(rows, dim, "embedding_bag");
        weight = Tensor<T>({rows, dim}, ctx);
        init::normal_(weight, 0, 1);
        weight.requires_grad_();
    }
    template <std::integral I>
    Tensor<T> operator()(const Tensor<I>& ids, const Tensor<I>& offsets, const Tensor<T>& per_sample_weights = {}) {
        return dl::embedding_bag(weight, ids, offsets, mode_, per_sample_weights);
    }
    template <class F>
    void for_each_parameter(F&& f) {
        f(std::string_view("weight"), weight);
    }
    void train(bool = true) {}

    Tensor<T> weight;

private:
    bag_mode mode_;
};

}  // namespace dl::nn
