#pragma once
// Metrics for classification and ranking, computed from model outputs without recording: accuracy,
// top-k accuracy, a confusion matrix, a running mean, ROC AUC.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <string_view>
#include <vector>

#include "../core/tensor.hpp"

namespace dl::nn {

namespace detail {
template <class T, class I>
void check_scores(const Tensor<T>& scores, const Tensor<I>& labels, std::string_view metric) {
    if (scores.rank() != 2 || labels.rank() != 1 || scores.shape()[0] != labels.shape()[0])
        dl::detail::fail("dl::nn::", metric, ": expected scores [N, classes] and labels [N], got ", scores.shape(),
                         " and ", labels.shape());
}
/// The class with the highest score in row i (the first of ties).
template <class T>
[[nodiscard]] std::int64_t arg_best(const Tensor<T>& scores, std::int64_t i) {
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < scores.shape()[1]; ++c)
        if (scores(i, c) > scores(i, best)) best = c;
    return best;
}
}  // namespace detail

/// Fraction of rows of `scores` [N, classes] whose true label is among the k highest scores.
template <class T, std::integral I>
[[nodiscard]] double top_k_accuracy(const Tensor<T>& scores, const Tensor<I>& labels, std::int64_t k) {
    detail::check_scores(scores, labels, "top_k_accuracy");
    if (k < 1) dl::detail::fail("dl::nn::top_k_accuracy: k must be positive, got ", k);
    const std::int64_t n = scores.shape()[0];
    if (n == 0) return 0;
    std::int64_t hits = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        const auto label = static_cast<std::int64_t>(labels(i));
        if (label < 0 || label >= scores.shape()[1])
            dl::detail::fail("dl::nn::top_k_accuracy: label ", label, " at row ", i, " outside [0, ", scores.shape()[1], ")");
        const T own = scores(i, label);
        std::int64_t above = 0;  // classes ranked before the label (ties count against it)
        for (std::int64_t c = 0; c < scores.shape()[1]; ++c) above += c != label && !(scores(i, c) < own);
        hits += above < k;
    }
    return static_cast<double>(hits) / static_cast<double>(n);
}

/// Fraction of rows whose highest score is at the true label.
template <class T, std::integral I>
[[nodiscard]] double accuracy(const Tensor<T>& scores, const Tensor<I>& labels) {
    detail::check_scores(scores, labels, "accuracy");
    const std::int64_t n = scores.shape()[0];
    std::int64_t hits = 0;
    for (std::int64_t i = 0; i < n; ++i) hits += detail::arg_best(scores, i) == static_cast<std::int64_t>(labels(i));
    return n ? static_cast<double>(hits) / static_cast<double>(n) : 0.0;
}

/// Counts of (true class, predicted class) pairs.
class confusion_matrix {
public:
    explicit confusion_matrix(std::int64_t classes) : classes_(classes), counts_(static_cast<std::size_t>(classes * classes)) {
        if (classes <= 0) dl::detail::fail("dl::nn::confusion_matrix: needs at least one class");
    }
    /// Adds the predictions (highest score) of `scores` [N, classes] against `labels` [N].
    template <class T, std::integral I>
    void add(const Tensor<T>& scores, const Tensor<I>& labels) {
        detail::check_scores(scores, labels, "confusion_matrix");
        if (scores.shape()[1] != classes_)
            dl::detail::fail("dl::nn::confusion_matrix: scores have ", scores.shape()[1], " classes, expected ", classes_);
        for (std::int64_t i = 0; i < scores.shape()[0]; ++i) {
            const auto label = static_cast<std::int64_t>(labels(i));
            if (label < 0 || label >= classes_)
                dl::detail::fail("dl::nn::confusion_matrix: label ", label, " at row ", i, " outside [0, ", classes_, ")");
            ++counts_[static_cast<std::size_t>(label * classes_ + detail::arg_best(scores, i))];
        }
    }
    [[nodiscard]] std::int64_t operator()(std::int64_t truth, std::int64_t predicted) const {
        return counts_.at(static_cast<std::size_t>(truth * classes_ + predicted));
    }
    [[nodiscard]] std::int64_t total() const { return std::accumulate(counts_.begin(), counts_.end(), std::int64_t(0)); }
    [[nodiscard]] double accuracy() const {
        std::int64_t diagonal = 0;
        for (std::int64_t c = 0; c < classes_; ++c) diagonal += (*this)(c, c);
        const std::int64_t all = total();
        return all ? static_cast<double>(diagonal) / static_cast<double>(all) : 0.0;
    }
    /// Of the examples of class c, the fraction predicted as c.
    [[nodiscard]] double recall(std::int64_t c) const {
        std::int64_t row = 0;
        for (std::int64_t p = 0; p < classes_; ++p) row += (*this)(c, p);
        return row ? static_cast<double>((*this)(c, c)) / static_cast<double>(row) : 0.0;
    }
    [[nodiscard]] std::int64_t classes() const noexcept { return classes_; }
    void reset() { std::fill(counts_.begin(), counts_.end(), 0); }

    /// Rows are true classes, columns predictions.
    friend std::ostream& operator<<(std::ostream& out, const confusion_matrix& m) {
        for (std::int64_t t = 0; t < m.classes_; ++t) {
            for (std::int64_t p = 0; p < m.classes_; ++p) out << (p ? " " : "") << m(t, p);
            out << '\n';
        }
        return out;
    }

private:
    std::int64_t classes_;
    std::vector<std::int64_t> counts_;
};

/// The mean of the values added so far, each weighted by its count (e.g. a batch loss by batch size).
class running_mean {
public:
    void add(double value, std::int64_t count = 1) noexcept {
        sum_ += value * static_cast<double>(count);
        count_ += count;
    }
    [[nodiscard]] double mean() const noexcept { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
    [[nodiscard]] std::int64_t count() const noexcept { return count_; }
    void reset() noexcept { sum_ = 0, count_ = 0; }

private:
    double sum_ = 0;
    std::int64_t count_ = 0;
};

/// Area under the ROC curve of `scores` [N] for binary `labels` [N] (nonzero = positive): the
/// probability that a random positive scores above a random negative, ties counting half
/// (Mann-Whitney). Fails when either class is absent.
template <class T, class L>
[[nodiscard]] double roc_auc(const Tensor<T>& scores, const Tensor<L>& labels) {
    if (scores.rank() != 1 || labels.shape() != scores.shape())
        dl::detail::fail("dl::nn::roc_auc: expected scores [N] and labels [N], got ", scores.shape(), " and ", labels.shape());
    const std::int64_t n = scores.numel();
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return scores(a) < scores(b); });
    double positive_rank_sum = 0;
    std::int64_t positives = 0;
    for (std::int64_t i = 0; i < n;) {  // average ranks over groups of equal scores
        std::int64_t j = i;
        while (j < n && scores(order[static_cast<std::size_t>(j)]) == scores(order[static_cast<std::size_t>(i)])) ++j;
        const double rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
        for (std::int64_t k = i; k < j; ++k)
            if (labels(order[static_cast<std::size_t>(k)]) != L(0)) positive_rank_sum += rank, ++positives;
        i = j;
    }
    const std::int64_t negatives = n - positives;
    if (positives == 0 || negatives == 0)
        dl::detail::fail("dl::nn::roc_auc: needs both positive and negative labels, got ", positives, " positive of ", n);
    return (positive_rank_sum - static_cast<double>(positives) * static_cast<double>(positives + 1) / 2) /
           (static_cast<double>(positives) * static_cast<double>(negatives));
}

}  // namespace dl::nn
