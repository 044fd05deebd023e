#pragma once
// Context: everything a computation needs — allocator, random stream, executor, mode. There is no
// global state; two Contexts never share anything unless the user hands them the same allocator.
// A Context must outlive the tensors created with it (they run on its executor); their storage alone
// keeps the allocator alive.
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "allocator.hpp"
#include "thread_pool.hpp"

namespace dl {

class op_listener;
namespace autograd {
class recorder;
}

enum class Device : std::uint8_t { cpu, cuda };

/// While alive, the parallel loops of dl ops called on this thread run inline on it instead of on the
/// Context's executor. For threads that do side work next to a training loop — the data loader's
/// workers use it — so that they never compete with (or wait for) the loop's use of the pool.
class serial_scope {
public:
    serial_scope() noexcept : previous_(active_) { active_ = true; }
    serial_scope(const serial_scope&) = delete;
    serial_scope& operator=(const serial_scope&) = delete;
    ~serial_scope() { active_ = previous_; }
    [[nodiscard]] static bool active() noexcept { return active_; }

private:
    static inline thread_local bool active_ = false;
    bool previous_;
};

struct context_options {
    std::uint64_t seed = 0;
    int threads = static_cast<int>(std::thread::hardware_concurrency());  ///< total, including the caller
    std::shared_ptr<Allocator> allocator = nullptr;                      ///< null: a new caching_allocator
    /// Compute with denormals flushed to zero (FTZ, see core/denormals.hpp): the pool's workers
    /// always, the calling thread during parallel_for and optimizer steps.
    bool flush_denormals = true;
};

class Context {
public:
    Context() : Context(context_options{}) {}
    explicit Context(context_options options)
        : allocator_(options.allocator ? std::move(options.allocator) : std::make_shared<caching_allocator>()),
          pool_(options.threads, options.flush_denormals),
          seed_(options.seed),
          flush_denormals_(options.flush_denormals) {
        use_executor(pool_);
    }
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    [[nodiscard]] Allocator& allocator() const noexcept { return *allocator_; }
    [[nodiscard]] const std::shared_ptr<Allocator>& shared_allocator() const noexcept { return allocator_; }

    /// Runs work on `user_executor` (which must outlive this Context or the next call) instead of the
    /// Context's own pool, e.g. a game engine's job system.
    template <executor E>
    void use_executor(E& user_executor) noexcept {
        executor_ = &user_executor;
        parallel_for_ = [](void* e, std::int64_t count, task_ref task) { static_cast<E*>(e)->parallel_for(count, task); };
        concurrency_ = [](void* e) { return static_cast<int>(static_cast<E*>(e)->concurrency()); };
    }
    void use_own_pool() noexcept { use_executor(pool_); }

    /// Runs task(i) for i in [0, count) on the current executor; a single task runs on the caller
    /// (a user's job system would only pay a hand-off for it).
    void parallel_for(std::int64_t count, task_ref task) const {
        const dl::flush_denormals mode(flush_denormals_);
        if (count <= 1 || serial_scope::active()) {
            for (std::int64_t i = 0; i < count; ++i) task(i);
            return;
        }
        parallel_for_(executor_, count, task);
    }
    [[nodiscard]] bool flushes_denormals() const noexcept { return flush_denormals_; }
    [[nodiscard]] int concurrency() const { return concurrency_(executor_); }

    /// Random streams: each call reserves `count` positions of the seed's stream, so successive random
    /// tensors differ and a re-seeded Context repeats them.
    [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
    void manual_seed(std::uint64_t seed) noexcept {
        seed_ = seed;
        random_offset_ = 0;
    }
    [[nodiscard]] std::uint64_t reserve_random(std::uint64_t count) noexcept {
        return random_offset_.fetch_add(count, std::memory_order_relaxed);
    }

    [[nodiscard]] bool training() const noexcept { return training_; }
    void train(bool on = true) noexcept { training_ = on; }
    void eval() noexcept { training_ = false; }

    [[nodiscard]] Device device() const noexcept { return device_; }

    /// The profiler that records this Context's ops (a prof::profiler, or any op_listener: see
    /// core/op_scope.hpp), or null (the default: ops then pay one untaken branch). The profiler must
    /// outlive its attachment.
    void set_profiler(op_listener* p) noexcept { profiler_ = p; }
    [[nodiscard]] op_listener* profiler() const noexcept { return profiler_; }

    /// The graph tracer recording this Context's ops (graph/trace.hpp sets it while it traces), or null.
    void set_recorder(autograd::recorder* r) noexcept { recorder_ = r; }
    [[nodiscard]] autograd::recorder* recorder() const noexcept { return recorder_; }

    /// Bookkeeping for autograd (autograd/): whether ops on tensors that require grad are recorded
    /// (dl::no_grad turns it off for every thread using this Context), a creation counter that orders
    /// recorded ops, and scratch space reused by every backward pass so that it allocates nothing.
    struct autograd_state {
        bool enabled = true;
        std::atomic<std::uint64_t> sequence{0};
        std::vector<void*> stack, order;
    };
    [[nodiscard]] autograd_state& autograd() noexcept { return autograd_; }
    [[nodiscard]] bool grad_enabled() const noexcept { return autograd_.enabled; }

private:
    std::shared_ptr<Allocator> allocator_;
    thread_pool pool_;
    void* executor_ = nullptr;
    void (*parallel_for_)(void*, std::int64_t, task_ref) = nullptr;
    int (*concurrency_)(void*) = nullptr;
    std::uint64_t seed_;
    bool flush_denormals_;
    std::atomic<std::uint64_t> random_offset_{0};
    bool training_ = true;
    Device device_ = Device::cpu;
    op_listener* profiler_ = nullptr;
    autograd::recorder* recorder_ = nullptr;
    autograd_state autograd_;
};

/// A process-wide Context for convenience (tensors created without one use it). It is just one more
/// Context: it shares nothing with any other.
[[nodiscard]] inline Context& default_context() {
    static Context context;
    return context;
}

}  // namespace dl
