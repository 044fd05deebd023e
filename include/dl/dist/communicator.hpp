#pragma once
// Collectives for synchronous data-parallel training: one `communicator` interface (what a rank of a
// group can do with its peers), and the in-process group whose ranks are threads of one process. The
// MPI communicator (CPU processes) is in dist/mpi.hpp; an NCCL one (GPUs) is still to come.
//
// Every rank of a group calls the same collectives in the same order with buffers of the same length;
// a mismatch is detected and reported on every rank. A rank that fails calls abort(): its peers, waiting
// in a collective or entering one later, throw instead of waiting forever.
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"

namespace dl::dist {

enum class reduce_op : std::uint8_t { sum, mean, max, min };

class communicator {
public:
    virtual ~communicator() = default;
    [[nodiscard]] virtual int rank() const noexcept = 0;
    [[nodiscard]] virtual int size() const noexcept = 0;

    /// Replaces data, on every rank, with op over the ranks' data, element by element. Every rank
    /// gets the same bits (the ranks' values are combined in rank order).
    virtual void allreduce(std::span<float> data, reduce_op op) = 0;
    virtual void allreduce(std::span<double> data, reduce_op op) = 0;
    /// Copies root's data into every other rank's.
    virtual void broadcast(std::span<float> data, int root) = 0;
    virtual void broadcast(std::span<double> data, int root) = 0;
    /// Returns when every rank has called it.
    virtual void barrier() = 0;
    /// Marks the group failed (this rank will not take part any more): the collectives of every rank
    /// throw dl::error from now on, with `why` in the message.
    virtual void abort(const std::string& why) noexcept = 0;
};

/// N ranks in one process, each used by its own thread. A collective meets all ranks at a barrier,
/// then each rank works on its own slice of the data (rank r reduces elements [r·n/N, (r+1)·n/N) of
/// every rank's buffer, reading and writing them in place), then all meet again: no copies beyond the
/// reduction itself, and the work is spread over the ranks' threads.
class in_process_group {
public:
    explicit in_process_group(int size) : shared_(std::make_shared<state>(size)) {
        if (size < 1) dl::detail::fail("dl::dist::in_process_group: needs at least one rank, got ", size);
        for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<rank_communicator>(shared_, r));
    }
    [[nodiscard]] int size() const noexcept { return static_cast<int>(ranks_.size()); }
    /// The communicator of rank r; it lives as long as the group.
    [[nodiscard]] communicator& operator[](int r) const {
        if (r < 0 || r >= size()) dl::detail::fail("dl::dist::in_process_group: no rank ", r, " in a group of ", size());
        return *ranks_[static_cast<std::size_t>(r)];
    }

    /// Clears an abort, so the group can run collectives again. Call it only when no rank is inside a
    /// collective (every rank's thread has returned from the step that failed).
    void reset() {
        std::lock_guard lock(shared_->mutex);
        shared_->aborted = false;
        shared_->why.clear();
        shared_->arrived = 0;
    }

private:
    struct state {
        explicit state(int n) : size(n), buffers(static_cast<std::size_t>(std::max(n, 0))), counts(buffers.size()) {}
        std::mutex mutex;
        std::condition_variable met;
        int size;
        int arrived = 0;
        std::uint64_t generation = 0;
        bool aborted = false;
        std::string why;
        std::vector<void*> buffers;  ///< each rank's data during a collective
        std::vector<std::size_t> counts;

        /// Returns when all ranks have arrived (or throws when the group is aborted).
        void meet(std::unique_lock<std::mutex>& lock) {
            if (aborted) fail_aborted();
            const std::uint64_t mine = generation;
            if (++arrived == size) {
                arrived = 0;
                ++generation;
                met.notify_all();
                return;
            }
            met.wait(lock, [&] { return generation != mine || aborted; });
            if (generation == mine) fail_aborted();
        }
        [[noreturn]] void fail_aborted() const {
            dl::detail::fail("dl::dist: the group was aborted (", why, "); its collectives cannot complete");
        }
    };

    class rank_communicator final : public communicator {
    public:
        rank_communicator(std::shared_ptr<state> s, int rank) : state_(std::move(s)), rank_(rank) {}
        [[nodiscard]] int rank() const noexcept override { return rank_; }
        [[nodiscard]] int size() const noexcept override { return state_->size; }

        void allreduce(std::span<float> data, reduce_op op) override { reduce(data, op); }
        void allreduce(std::span<double> data, reduce_op op) override { reduce(data, op); }
        void broadcast(std::span<float> data, int root) override { copy_from(data, root); }
        void broadcast(std::span<double> data, int root) override { copy_from(data, root); }
        void barrier() override {
            std::unique_lock lock(state_->mutex);
            state_->meet(lock);
        }
        void abort(const std::string& why) noexcept override {
            std::lock_guard lock(state_->mutex);
            if (!state_->aborted) {
                state_->aborted = true;
                state_->why = "rank " + std::to_string(rank_) + ": " + why;
            }
            state_->met.notify_all();
        }

    private:
        /// Posts this rank's buffer and waits for the others'; checks every rank posted the same length.
        template <class T>
        std::vector<T*> post(std::span<T> data, const char* collective) {
            std::unique_lock lock(state_->mutex);
            if (state_->aborted) state_->fail_aborted();
            state_->buffers[static_cast<std::size_t>(rank_)] = data.data();
            state_->counts[static_cast<std::size_t>(rank_)] = data.size();
            state_->meet(lock);
            std::vector<T*> all;
            for (std::size_t r = 0; r < state_->counts.size(); ++r) {
                if (state_->counts[r] != data.size()) {
                    // Every rank sees the mismatch and throws; aborting keeps a rank that moves on to the
                    // next collective from posting over the lengths a slower rank has yet to read.
                    const std::string why = dl::detail::concat("dl::dist::", collective, ": rank ", rank_, " has ", data.size(),
                                                               " elements, rank ", r, " has ", state_->counts[r],
                                                               "; every rank must pass the same length");
                    if (!state_->aborted) {
                        state_->aborted = true;
                        state_->why = why;
                    }
                    throw dl::error(why);
                }
                all.push_back(static_cast<T*>(state_->buffers[r]));
            }
            return all;
        }
        void finish() {
            std::unique_lock lock(state_->mutex);
            state_->meet(lock);  // nobody returns while another rank still writes into its buffer
        }

        template <class T>
        void reduce(std::span<T> data, reduce_op op) {
            const std::vector<T*> all = post(data, "allreduce");
            const std::size_t n = data.size(), ranks = all.size();
            const std::size_t begin = n * static_cast<std::size_t>(rank_) / ranks,
                              end = n * static_cast<std::size_t>(rank_ + 1) / ranks;
            T* const first = all[0];
            for (std::size_t k = 1; k < ranks; ++k) {
                const T* other = all[k];
                switch (op) {
                    case reduce_op::sum:
                    case reduce_op::mean:
                        for (std::size_t i = begin; i < end; ++i) first[i] += other[i];
                        break;
                    case reduce_op::max:
                        for (std::size_t i = begin; i < end; ++i) first[i] = std::max(first[i], other[i]);
                        break;
                    case reduce_op::min:
                        for (std::size_t i = begin; i < end; ++i) first[i] = std::min(first[i], other[i]);
                        break;
                }
            }
            if (op == reduce_op::mean)
                for (std::size_t i = begin; i < end; ++i) first[i] /= static_cast<T>(ranks);
            for (std::size_t k = 1; k < ranks; ++k) std::copy(first + begin, first + end, all[k] + begin);
            finish();
        }

        template <class T>
        void copy_from(std::span<T> data, int root) {
            if (root < 0 || root >= size())
                dl::detail::fail("dl::dist::broadcast: no root rank ", root, " in a group of ", size());
            const std::vector<T*> all = post(data, "broadcast");
            if (rank_ != root) std::copy(all[static_cast<std::size_t>(root)], all[static_cast<std::size_t>(root)] + data.size(), data.data());
            finish();
        }

        std::shared_ptr<state> state_;
        int rank_;
    };

    std::shared_ptr<state> shared_;
    std::vector<std::unique_ptr<rank_communicator>> ranks_;
};

}  // namespace dl::dist
