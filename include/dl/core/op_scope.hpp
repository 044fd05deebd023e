#pragma once
// How an op reports its time: it opens an op_scope, which times it into the op_listener attached to its
// Context (Context::set_profiler), if any. Defined here in core/ so that kernels at every layer time
// themselves without knowing the profiler; prof::profiler (prof/profiler.hpp) is the listener users
// attach. Detached, an op pays one load and one untaken branch.
//
// Times are self times: an op that runs other ops (a backward running a matrix product) is charged
// only for what it did itself, so the shares add up to 100%.
#include <atomic>
#include <cstdint>

#include "context.hpp"

namespace dl {

/// One finished op.
struct op_event {
    const char* name;
    std::int64_t start_ns, duration_ns, self_ns;
    double flops, bytes;
    std::uint32_t thread;
    std::uint16_t depth;
};

/// Receives the ops of a Context while attached to it (Context::set_profiler).
class op_listener {
public:
    virtual ~op_listener() = default;
    /// Called from any thread that runs the Context's ops.
    virtual void record(const op_event& e) = 0;
    /// The listener's clock, in nanoseconds.
    [[nodiscard]] virtual std::int64_t now_ns() const = 0;
};

namespace detail {
/// The open scopes of this thread: their children's time, to compute self time.
struct scope_stack {
    std::int64_t child_ns[64] = {};
    int depth = 0;
};
inline thread_local scope_stack scopes;
inline std::uint32_t thread_number() {
    static std::atomic<std::uint32_t> next{0};
    thread_local const std::uint32_t id = next.fetch_add(1);
    return id;
}
}  // namespace detail

/// Times the enclosing op into the Context's profiler, when one is attached; `name` must be a string
/// literal (events keep the pointer).
class op_scope {
public:
    op_scope(const Context& ctx, const char* name, double flops = 0, double bytes = 0) noexcept
        : profiler_(ctx.profiler()) {
        if (!profiler_) [[likely]]
            return;
        name_ = name, flops_ = flops, bytes_ = bytes;
        auto& s = detail::scopes;
        if (s.depth < 64) s.child_ns[s.depth] = 0;
        ++s.depth;
        start_ = profiler_->now_ns();
    }
    op_scope(const op_scope&) = delete;
    op_scope& operator=(const op_scope&) = delete;
    ~op_scope() {
        if (!profiler_) [[likely]]
            return;
        const std::int64_t duration = profiler_->now_ns() - start_;
        auto& s = detail::scopes;
        --s.depth;
        const std::int64_t children = s.depth < 64 ? s.child_ns[s.depth] : 0;
        if (s.depth > 0 && s.depth - 1 < 64) s.child_ns[s.depth - 1] += duration;
        try {
            profiler_->record({name_, start_, duration, duration - children, flops_, bytes_, detail::thread_number(),
                               static_cast<std::uint16_t>(s.depth)});
        } catch (...) {  // out of memory while profiling: drop the event rather than the op
        }
    }

private:
    op_listener* profiler_;
    const char* name_ = nullptr;
    double flops_ = 0, bytes_ = 0;
    std::int64_t start_ = 0;
};

}  // namespace dl
