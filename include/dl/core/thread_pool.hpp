#pragma once
// The CPU executor: a fixed pool of worker threads that runs the chunks of one parallel_for at a time.
// It lives in core/ (not device/cpu/) because the Context owns it and arrows only point down.
// Callers pick the chunking, never the pool, so results do not depend on how many threads ran them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "denormals.hpp"

namespace dl {

/// A non-owning reference to a callable `void(std::int64_t)`; never allocates.
class task_ref {
public:
    template <class F>
        requires(!std::same_as<std::remove_cvref_t<F>, task_ref> && std::invocable<F&, std::int64_t>)
    task_ref(F&& f) noexcept  // NOLINT: implicit by design, like std::function_ref
        : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
          call_([](void* o, std::int64_t i) { (*static_cast<std::remove_reference_t<F>*>(o))(i); }) {}
    void operator()(std::int64_t i) const { call_(object_, i); }

private:
    void* object_;
    void (*call_)(void*, std::int64_t);
};

/// Something that can run `count` independent tasks, possibly at once, and return when all are done:
/// the dl thread pool, or a game engine's own job system.
template <class E>
concept executor = requires(E& e, std::int64_t count, task_ref task) {
    e.parallel_for(count, task);
    { e.concurrency() } -> std::convertible_to<int>;
};

class thread_pool {
public:
    /// `threads` is the total concurrency: the calling thread works too, so threads - 1 are spawned,
    /// by the first parallel_for that has more than one task (a Context handed a user's executor
    /// before it runs anything never starts them). With `flush_denormals` the workers run with FTZ
    /// set for their whole life.
    explicit thread_pool(int threads = static_cast<int>(std::thread::hardware_concurrency()),
                         bool flush_denormals = true)
        : threads_(std::max(threads, 1)), flush_denormals_(flush_denormals) {}
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (auto& w : workers_) w.join();
    }

    [[nodiscard]] int concurrency() const noexcept { return threads_; }
    /// Whether the worker threads have been started.
    [[nodiscard]] bool started() const noexcept { return started_.load(std::memory_order_acquire); }

    /// Runs task(i) for i in [0, count); rethrows the first exception a task threw.
    void parallel_for(std::int64_t count, task_ref task) {
        if (count <= 0) return;
        if (count == 1 || threads_ == 1 || inside_ == this) {  // nested calls run inline
            for (std::int64_t i = 0; i < count; ++i) task(i);
            return;
        }
        std::lock_guard serial(submit_mutex_);
        if (!started_.load(std::memory_order_relaxed)) start_workers();
        {
            std::lock_guard lock(mutex_);
            task_ = &task;
            count_ = count;
            next_.store(0, std::memory_order_relaxed);
            done_.store(0, std::memory_order_relaxed);
            error_ = nullptr;
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        run_chunks(task, count);
        std::unique_lock lock(mutex_);
        finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == count && busy_workers_ == 0; });
        task_ = nullptr;  // late wakers find nothing to do
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

private:
    void start_workers() {
        workers_.reserve(static_cast<std::size_t>(threads_ - 1));
        for (int i = 0; i + 1 < threads_; ++i)
            workers_.emplace_back([this] {
                const dl::flush_denormals mode(flush_denormals_);
                work();
            });
        started_.store(true, std::memory_order_release);
    }

    void run_chunks(const task_ref& task, std::int64_t count) {
        const thread_pool* outer = std::exchange(inside_, this);
        std::int64_t completed = 0;
        for (std::int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < count; ++completed) {
            try {
                task(i);
            } catch (...) {
                std::lock_guard lock(mutex_);
                if (!error_) error_ = std::current_exception();
            }
        }
        inside_ = outer;
        if (completed && done_.fetch_add(completed, std::memory_order_acq_rel) + completed == count) {
            std::lock_guard lock(mutex_);
            finished_.notify_all();
        }
    }

    void work() {
        std::uint64_t seen = 0;
        for (;;) {
            const task_ref* task;
            std::int64_t count;
            spin_while_idle(seen);
            {
                std::unique_lock lock(mutex_);
                wake_.wait(lock, [&] { return stopping_ || generation_.load(std::memory_order_relaxed) != seen; });
                if (stopping_) return;
                seen = generation_.load(std::memory_order_relaxed);
                if (!task_) continue;
                task = task_;
                count = count_;
                ++busy_workers_;
            }
            run_chunks(*task, count);
            std::lock_guard lock(mutex_);
            if (--busy_workers_ == 0) finished_.notify_all();
        }
    }

    // A worker that has just finished polls for the next parallel_for for a short while before it sleeps:
    // a training step issues hundreds of them back to back, and waking a sleeping thread costs from
    // microseconds to, on a busy virtual machine, a millisecond, by which time the caller has run
    // every chunk alone.
    void spin_while_idle(std::uint64_t seen) const {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
        for (int i = 1; generation_.load(std::memory_order_acquire) == seen; ++i) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            if (i % 256 == 0 && std::chrono::steady_clock::now() > until) return;
        }
    }

    static inline thread_local const thread_pool* inside_ = nullptr;

    int threads_;
    bool flush_denormals_;
    std::atomic<bool> started_{false};
    std::vector<std::thread> workers_;  // written once, under submit_mutex_, before started_
    std::mutex submit_mutex_;  // one parallel_for at a time per pool
    std::mutex mutex_;
    std::condition_variable wake_, finished_;
    const task_ref* task_ = nullptr;
    std::int64_t count_ = 0;
    std::atomic<std::int64_t> next_{0}, done_{0};
    std::exception_ptr error_;
    std::atomic<std::uint64_t> generation_{0};
    int busy_workers_ = 0;
    bool stopping_ = false;
};

static_assert(executor<thread_pool>);

}  // namespace dl
