#pragma once
// Datasets and the loader. A data_loader cuts a dataset into batches (shuffled from the Context's
// seed, or in order), builds them on background threads into a bounded queue, and hands them to the
// training loop in order. Batch k of an epoch depends only on the seed, the epoch and k, never on the
// number of loader threads, so runs repeat exactly. The loader measures how long the consumer waited
// for data: when that is a large share of a step, more workers help.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/random.hpp"
#include "../core/tensor.hpp"

namespace dl::data {

namespace detail {
/// The rows `rows` (indices along dimension 0, in range: the loader makes them) of t, copied into a
/// new tensor: a batch is a gather of whole examples, so one copy per example does it.
template <class T>
[[nodiscard]] Tensor<T> rows_of(const Tensor<T>& t, const Tensor<std::int64_t>& rows) {
    const Tensor<T> source = t.contiguous();
    Shape shape = source.shape();
    shape[0] = rows.numel();
    Tensor<T> out(shape, t.context());
    const std::int64_t row = source.shape()[0] == 0 ? 0 : source.numel() / source.shape()[0];
    for (std::int64_t i = 0; i < rows.numel(); ++i)
        std::memcpy(out.data() + i * row, source.data() + rows.data()[i] * row, static_cast<std::size_t>(row) * sizeof(T));
    return out;
}
}  // namespace detail

/// (input, target) pairs held as two tensors whose dimension 0 is the example.
template <class X, class Y>
struct tensor_dataset {
    Tensor<X> inputs;
    Tensor<Y> targets;

    tensor_dataset(Tensor<X> x, Tensor<Y> y) : inputs(std::move(x)), targets(std::move(y)) {
        if (inputs.rank() == 0 || targets.rank() == 0 || inputs.shape()[0] != targets.shape()[0])
            dl::detail::fail("dl::data::tensor_dataset: inputs ", inputs.shape(), " and targets ", targets.shape(),
                             " must have the same extent in dimension 0");
    }
    [[nodiscard]] std::int64_t size() const noexcept { return inputs.shape()[0]; }
};

/// The examples of one batch, gathered from a tensor_dataset, before any transform.
template <class X, class Y>
struct batch {
    Tensor<X> inputs;
    Tensor<Y> targets;
    std::int64_t index = 0;  ///< position of this batch in its epoch
    std::uint64_t seed = 0;  ///< for random augmentation: a stream of its own per (epoch, batch)
};

struct loader_options {
    std::int64_t batch_size = 64;
    bool shuffle = true;
    bool drop_last = false;  ///< drop a last batch smaller than batch_size
    int workers = 1;         ///< background threads building batches; 0 builds them on the caller's thread
    int prefetch = 4;        ///< batches built ahead of the consumer, at most
};

/// Leaves a batch as it is.
struct no_transform {
    template <class B>
    B operator()(B b) const {
        return b;
    }
};

template <class X, class Y, class Transform = no_transform>
class data_loader {
public:
    using raw_batch = batch<X, Y>;
    using batch_type = std::invoke_result_t<const Transform&, raw_batch>;

    /// `transform(batch) -> anything` runs on the loader threads: conversion, normalisation,
    /// augmentation (draw randomness from batch.seed to keep runs repeatable). Ops there run on the
    /// loader thread alone (serial_scope), leaving the Context's pool to the training loop.
    data_loader(tensor_dataset<X, Y> dataset, loader_options options, Context& ctx = default_context(),
                Transform transform = {})
        : data_(std::move(dataset)), o_(options), ctx_(&ctx), transform_(std::move(transform)),
          stream_(ctx.seed() ^ (0x9e3779b97f4a7c15ull * (ctx.reserve_random(1) + 1))) {
        if (o_.batch_size <= 0 || o_.workers < 0 || o_.prefetch <= 0)
            dl::detail::fail("dl::data::data_loader: batch_size and prefetch must be positive, workers >= 0");
    }

    [[nodiscard]] std::int64_t batches_per_epoch() const noexcept {
        const std::int64_t n = data_.size(), b = o_.batch_size;
        return o_.drop_last ? n / b : (n + b - 1) / b;
    }
    [[nodiscard]] std::int64_t size() const noexcept { return data_.size(); }
    [[nodiscard]] const loader_options& options() const noexcept { return o_; }
    /// Seconds the consumer waited for batches during the last finished epoch.
    [[nodiscard]] double last_wait_seconds() const noexcept { return last_wait_; }

    class epoch_run;

    /// One pass over the data: `for (auto& b : loader.epoch()) ...`. Each call is the next epoch (a
    /// new order when shuffling).
    [[nodiscard]] epoch_run epoch() { return epoch_run(*this, epochs_++); }

    /// Batch k of epoch e, built on the calling thread (what the workers run).
    [[nodiscard]] batch_type make_batch(const std::vector<std::int64_t>& order, std::int64_t epoch, std::int64_t k) const {
        const std::int64_t first = k * o_.batch_size, last = std::min(first + o_.batch_size, data_.size());
        Tensor<std::int64_t> rows({last - first}, *ctx_);
        std::copy(order.begin() + first, order.begin() + last, rows.data());
        raw_batch b{detail::rows_of(data_.inputs, rows), detail::rows_of(data_.targets, rows), k,
                    stream_ + 0x100000000ull * static_cast<std::uint64_t>(epoch + 1) + static_cast<std::uint64_t>(k)};
        return transform_(std::move(b));
    }

    /// The example order of epoch e: a Fisher-Yates shuffle driven by the counter-based generator
    /// (so it is the same on every machine and thread count), or 0..n-1.
    [[nodiscard]] std::vector<std::int64_t> order_of(std::int64_t epoch) const {
        std::vector<std::int64_t> order(static_cast<std::size_t>(data_.size()));
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
        if (o_.shuffle)
            for (std::size_t i = order.size(); i > 1; --i) {
                const double u = dl::detail::uniform_at(stream_ + static_cast<std::uint64_t>(epoch), i);
                std::swap(order[i - 1], order[static_cast<std::size_t>(u * static_cast<double>(i))]);
            }
        return order;
    }

    /// An epoch in progress: owns the worker threads (joined when it ends, also on an early break).
    class epoch_run {
    public:
        epoch_run(const epoch_run&) = delete;
        epoch_run& operator=(const epoch_run&) = delete;
        ~epoch_run() {
            {
                std::lock_guard lock(mutex_);
                stop_ = true;
            }
            space_.notify_all();
            for (auto& t : threads_) t.join();
            loader_.last_wait_ = wait_;
        }

        class iterator {
        public:
            using value_type = batch_type;
            using difference_type = std::ptrdiff_t;
            batch_type& operator*() const { return *run_->current_; }
            iterator& operator++() {
                run_->advance();
                return *this;
            }
            bool operator==(std::default_sentinel_t) const { return !run_->current_; }

        private:
            friend class epoch_run;
            explicit iterator(epoch_run* run) : run_(run) {}
            epoch_run* run_;
        };
        iterator begin() {
            if (!started_) {
                started_ = true;
                for (int i = 0; i < loader_.o_.workers; ++i) threads_.emplace_back([this] { work(); });
                advance();
            }
            return iterator(this);
        }
        std::default_sentinel_t end() const { return {}; }

        /// Seconds the consumer has waited for data so far in this epoch.
        [[nodiscard]] double wait_seconds() const noexcept { return wait_; }
        [[nodiscard]] std::int64_t batches() const noexcept { return count_; }

    private:
        friend class data_loader;
        epoch_run(data_loader& loader, std::int64_t epoch)
            : loader_(loader), epoch_(epoch), count_(loader.batches_per_epoch()), order_(loader.order_of(epoch)),
              ready_(static_cast<std::size_t>(loader.o_.prefetch)) {}

        void advance() {
            current_.reset();
            if (taken_ == count_) return;
            const auto start = std::chrono::steady_clock::now();
            if (threads_.empty()) {
                current_.emplace(loader_.make_batch(order_, epoch_, taken_));
            } else {
                std::unique_lock lock(mutex_);
                auto& slot = ready_[static_cast<std::size_t>(taken_) % ready_.size()];
                // Batches before a failed one are still handed out; the error comes in its turn.
                filled_.wait(lock, [&] { return slot.has_value() || (error_ && error_batch_ == taken_); });
                if (!slot) std::rethrow_exception(error_);
                current_.emplace(std::move(*slot));
                slot.reset();
            }
            ++taken_;
            space_.notify_all();
            wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }

        void work() {
            const serial_scope on_this_thread;  // batches are built here, never on the training loop's pool
            for (;;) {
                std::int64_t k;
                {
                    std::unique_lock lock(mutex_);
                    space_.wait(lock, [&] {
                        return stop_ || next_ == count_ || next_ - taken_ < static_cast<std::int64_t>(ready_.size());
                    });
                    if (stop_ || next_ == count_) return;
                    k = next_++;
                }
                try {
                    batch_type b = loader_.make_batch(order_, epoch_, k);
                    std::lock_guard lock(mutex_);
                    ready_[static_cast<std::size_t>(k) % ready_.size()].emplace(std::move(b));
                } catch (...) {
                    std::lock_guard lock(mutex_);
                    if (!error_ || k < error_batch_) error_ = std::current_exception(), error_batch_ = k;
                }
                filled_.notify_all();
            }
        }

        data_loader& loader_;
        std::int64_t epoch_, count_;
        std::vector<std::int64_t> order_;
        std::vector<std::optional<batch_type>> ready_;  // ring: batch k in slot k % prefetch
        std::optional<batch_type> current_;
        std::vector<std::thread> threads_;
        std::mutex mutex_;
        std::condition_variable filled_, space_;
        std::exception_ptr error_;
        std::int64_t next_ = 0, taken_ = 0, error_batch_ = 0;
        double wait_ = 0;
        bool stop_ = false, started_ = false;
    };

private:
    tensor_dataset<X, Y> data_;
    loader_options o_;
    Context* ctx_;
    Transform transform_;
    std::uint64_t stream_;
    std::int64_t epochs_ = 0;
    double last_wait_ = 0;
};

}  // namespace dl::data
