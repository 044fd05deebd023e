// Context and thread_pool: parallel_for, exceptions, nesting, user executors, independence of
// Contexts, train/eval.
#include "support.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

using dl::Tensor;

namespace {
/// Runs parallel_for(count) on `run` and returns how often each index ran.
template <class Run>
std::vector<int> hits_per_index(std::int64_t count, Run&& run) {
    auto hits = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)));
    run(count, [&](std::int64_t i) {
        if (i >= 0 && i < count) hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
    std::vector<int> out;
    for (std::int64_t i = 0; i < count; ++i) out.push_back(hits[static_cast<std::size_t>(i)].load());
    return out;
}

/// A user executor (as a game engine would hand in): runs every task inline, in reverse order, and
/// counts what it was asked.
struct counting_executor {
    std::atomic<int> calls{0}, single_tasks{0};
    std::atomic<std::int64_t> tasks{0};
    int threads = 4;
    void parallel_for(std::int64_t count, dl::task_ref task) {
        ++calls;
        single_tasks += count <= 1;
        tasks += count;
        for (std::int64_t i = count - 1; i >= 0; --i) task(i);
    }
    int concurrency() const { return threads; }
};
static_assert(dl::executor<counting_executor>);
}  // namespace

// --- thread_pool ---

TEST_CASE("thread_pool runs every index exactly once") {
    for (int threads : {1, 2, 3, 8}) {
        dl::thread_pool pool(threads);
        CHECK(pool.concurrency() == threads);
        for (std::int64_t count : {0, 1, 7, 1000}) {
            CAPTURE(threads);
            CAPTURE(count);
            const auto hits = hits_per_index(count, [&](std::int64_t n, dl::task_ref task) { pool.parallel_for(n, task); });
            CHECK(hits == std::vector<int>(static_cast<std::size_t>(count), 1));
        }
    }
}

TEST_CASE("thread_pool treats a non-positive thread count as 1 and a non-positive task count as nothing") {
    CHECK(dl::thread_pool(0).concurrency() == 1);
    CHECK(dl::thread_pool(-3).concurrency() == 1);
    dl::thread_pool pool(2);
    int calls = 0;
    pool.parallel_for(-5, [&](std::int64_t) { ++calls; });
    CHECK(calls == 0);
}

TEST_CASE("thread_pool uses more than one thread when it has them") {
    dl::thread_pool pool(2);
    std::atomic<int> inside{0}, most{0};
    // Each task waits (up to 50 ms) for another to overlap it, so two meet even on a busy machine.
    pool.parallel_for(64, [&](std::int64_t) {
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
        while (std::chrono::steady_clock::now() < until && most.load() < 2) std::this_thread::yield();
        --inside;
    });
    CHECK(most.load() == 2);
}

TEST_CASE("an exception thrown by a task reaches the caller and the pool keeps working") {
    for (int threads : {1, 2, 4}) {
        CAPTURE(threads);
        dl::thread_pool pool(threads);
        std::atomic<int> ran{0};
        CHECK_THROWS_WITH_AS(pool.parallel_for(100,
                                               [&](std::int64_t i) {
                                                   ++ran;
                                                   if (i == 37) throw std::runtime_error("task 37 failed");
                                               }),
                             "task 37 failed", std::runtime_error);
        // No task is still running, or starts, once parallel_for has thrown.
        const int ran_when_thrown = ran.load();
        CHECK(ran_when_thrown >= 1);
        CHECK(ran_when_thrown <= 100);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        CHECK(ran.load() == ran_when_thrown);
        // A dl::error keeps its type and message.
        CHECK_THROWS_WITH_AS(
            pool.parallel_for(10, [](std::int64_t i) { if (i == 9) dl::detail::fail("bad ", i); }), "bad 9",
            dl::error);
        // Every task throwing: one exception comes out.
        CHECK_THROWS_AS(pool.parallel_for(50, [](std::int64_t) { throw std::logic_error("all"); }), std::logic_error);
        // Afterwards, business as usual.
        const auto hits = hits_per_index(1000, [&](std::int64_t n, dl::task_ref task) { pool.parallel_for(n, task); });
        CHECK(hits == std::vector<int>(1000, 1));
    }
}

TEST_CASE("an exception thrown by a task reaches the caller of Context::parallel_for") {
    dl::Context ctx({.threads = 2});
    CHECK_THROWS_AS(ctx.parallel_for(64, [](std::int64_t i) { if (i == 63) throw std::out_of_range("x"); }),
                    std::out_of_range);
    const auto x = dl::full<float>({1 << 18}, 1.0f, ctx);
    Tensor<float> y = x * 3.0f;
    CHECK(y(12345) == 3.0f);
}

TEST_CASE("nested parallel_for on the same pool runs inline instead of deadlocking") {
    dl::thread_pool pool(3);
    std::atomic<int> total{0};
    pool.parallel_for(8, [&](std::int64_t) {
        pool.parallel_for(8, [&](std::int64_t) {
            pool.parallel_for(4, [&](std::int64_t) { ++total; });
        });
    });
    CHECK(total.load() == 8 * 8 * 4);
}

TEST_CASE("nested parallel_for across two pools completes") {
    dl::thread_pool outer(2), inner(2);
    std::atomic<int> total{0};
    outer.parallel_for(6, [&](std::int64_t) { inner.parallel_for(50, [&](std::int64_t) { ++total; }); });
    CHECK(total.load() == 300);
}

TEST_CASE("parallel_for from several threads at once on one pool runs each call completely") {
    dl::thread_pool pool(3);
    const int rounds = dl_test::quick() ? 50 : 300;
    std::atomic<int> wrong{0};
    std::vector<std::thread> callers;
    for (int c = 0; c < 3; ++c)
        callers.emplace_back([&] {
            for (int r = 0; r < rounds; ++r) {
                const auto hits =
                    hits_per_index(97, [&](std::int64_t n, dl::task_ref task) { pool.parallel_for(n, task); });
                wrong += hits != std::vector<int>(97, 1);
            }
        });
    for (auto& t : callers) t.join();
    CHECK(wrong.load() == 0);
}

TEST_CASE("task_ref calls the callable it refers to") {
    int sum = 0;
    auto add = [&](std::int64_t i) { sum += static_cast<int>(i); };
    const dl::task_ref ref = add;
    ref(3);
    ref(4);
    CHECK(sum == 7);
}

// --- Context ---

TEST_CASE("Context::parallel_for runs every index exactly once on its own pool") {
    for (int threads : {1, 2, 5}) {
        dl::Context ctx({.threads = threads});
        CHECK(ctx.concurrency() == threads);
        for (std::int64_t count : {0, 1, 7, 1000}) {
            CAPTURE(threads);
            CAPTURE(count);
            const auto hits = hits_per_index(count, [&](std::int64_t n, dl::task_ref task) { ctx.parallel_for(n, task); });
            CHECK(hits == std::vector<int>(static_cast<std::size_t>(count), 1));
        }
    }
    CHECK(dl::Context({.threads = 0}).concurrency() == 1);
}

TEST_CASE("a user executor plugged into a Context runs its parallel work") {
    dl::Context ctx({.seed = 3, .threads = 1});
    counting_executor exec;
    ctx.use_executor(exec);
    CHECK(ctx.concurrency() == 4);

    const std::int64_t n = std::int64_t{1} << 20;
    const auto x = dl::full<float>({n}, 1.5f, ctx);
    const int calls_before = exec.calls.load();
    const std::int64_t tasks_before = exec.tasks.load();
    Tensor<float> y = x * 2.0f + 1.0f;
    CHECK(exec.calls.load() == calls_before + 1);
    CHECK(exec.tasks.load() - tasks_before >= 2);
    CHECK(&y.context() == &ctx);
    CHECK(y(0) == 4.0f);
    CHECK(y(n - 1) == 4.0f);
    const auto y_values = dl_test::to_vector(y);
    CHECK(std::all_of(y_values.begin(), y_values.end(), [](float v) { return v == 4.0f; }));

    const int before = exec.calls.load();
    y.slice(0, 0, n, 2) = 0.0f;  // a strided write goes through the executor too
    CHECK(exec.calls.load() > before);
    CHECK(y(0) == 0.0f);
    CHECK(y(1) == 4.0f);

    ctx.use_own_pool();
    CHECK(ctx.concurrency() == 1);
    const int calls = exec.calls.load();
    Tensor<float> z = x + 1.0f;
    CHECK(exec.calls.load() == calls);
    CHECK(z(7) == 2.5f);
}

TEST_CASE("a small elementwise assignment does not go through the executor") {
    dl::Context ctx({.threads = 1});
    counting_executor exec;
    ctx.use_executor(exec);
    const auto x = dl::full<float>({100}, 1.0f, ctx);
    Tensor<float> y = x + 1.0f;
    CHECK(exec.calls.load() == 0);
    CHECK(y(99) == 2.0f);
}

TEST_CASE("a Context handed a user executor never starts its own threads, and runs single tasks inline") {
    const auto process_threads = [] {
        const std::filesystem::directory_iterator tasks("/proc/self/task");
        return std::distance(std::filesystem::begin(tasks), std::filesystem::end(tasks));
    };
    const auto before = process_threads();
    dl::Context ctx({.threads = 4});
    counting_executor exec;
    ctx.use_executor(exec);
    const auto x = dl::uniform<float>({1 << 20}, -1, 1, ctx);
    Tensor<float> y = dl::exp(x) * 2.0f;                      // split into many tasks
    const auto small = dl::uniform<float>({3, 5}, -1, 1, ctx);
    (void)dl::sum(small).item();                               // small ops: one task at most
    (void)dl::matmul(small, small.transpose(0, 1));
    std::int64_t ran = 0;
    ctx.parallel_for(1, [&](std::int64_t) { ++ran; });
    CHECK(ran == 1);
    CHECK(exec.calls.load() > 0);
    CHECK(exec.single_tasks.load() == 0);
    CHECK(process_threads() == before);

    ctx.use_own_pool();  // its 3 workers start with the first work split over them
    Tensor<float> z = dl::exp(x) * 2.0f;
    CHECK(process_threads() == before + 3);
    CHECK(dl_test::same_elements(y, z));
}

TEST_CASE("random tensors do not depend on how the executor orders the work") {
    const std::int64_t n = 100000;
    dl::Context pooled({.seed = 42, .threads = 2}), user({.seed = 42, .threads = 1});
    counting_executor reverse;  // runs chunks last to first
    user.use_executor(reverse);
    const auto a = dl::normal<float>({n}, 0, 1, pooled);
    const auto b = dl::normal<float>({n}, 0, 1, user);
    CHECK(reverse.calls.load() == 1);
    CHECK(dl_test::to_vector(a) == dl_test::to_vector(b));
}

TEST_CASE("two Contexts share no allocator and no random state") {
    dl::Context a({.seed = 5, .threads = 1}), b({.seed = 5, .threads = 1});
    CHECK(&a.allocator() != &b.allocator());
    const auto a_first = dl::uniform<float>({16}, 0, 1, a);
    const auto a_second = dl::uniform<float>({16}, 0, 1, a);
    // b's stream did not move when a drew from its own.
    const auto b_first = dl::uniform<float>({16}, 0, 1, b);
    CHECK(dl_test::to_vector(b_first) == dl_test::to_vector(a_first));
    CHECK(dl_test::to_vector(b_first) != dl_test::to_vector(a_second));
    a.manual_seed(9);
    CHECK(b.seed() == 5);
    // Nor the default context.
    CHECK(&dl::default_context() != &a);
    CHECK(&dl::default_context().allocator() != &a.allocator());
    CHECK(&dl::default_context() == &dl::default_context());
}

TEST_CASE("train() and eval() switch the mode") {
    dl::Context ctx({.threads = 1});
    CHECK(ctx.training());
    ctx.eval();
    CHECK_FALSE(ctx.training());
    ctx.train();
    CHECK(ctx.training());
    ctx.train(false);
    CHECK_FALSE(ctx.training());
    ctx.train(true);
    CHECK(ctx.training());
    CHECK(ctx.device() == dl::Device::cpu);
}

TEST_CASE("a Context reports its seed and uses the allocator it was given") {
    auto alloc = std::make_shared<dl::system_allocator>();
    dl::Context ctx({.seed = 123, .threads = 1, .allocator = alloc});
    CHECK(ctx.seed() == 123);
    CHECK(&ctx.allocator() == alloc.get());
    CHECK(ctx.shared_allocator() == alloc);
    const Tensor<float> t({8}, ctx);
    CHECK(alloc->stats().system_allocations == 1);
    CHECK(dl::Context({.threads = 1}).seed() == 0);
}

TEST_CASE("reserve_random hands out consecutive ranges of the stream") {
    dl::Context ctx({.seed = 1, .threads = 1});
    CHECK(ctx.reserve_random(10) == 0);
    CHECK(ctx.reserve_random(5) == 10);
    CHECK(ctx.reserve_random(0) == 15);
    CHECK(ctx.reserve_random(1) == 15);
    ctx.manual_seed(1);
    CHECK(ctx.reserve_random(3) == 0);
}

TEST_CASE("compute threads flush denormals by default; the Context setting turns it off") {
    for (bool flush : {true, false}) {
        CAPTURE(flush);
        dl::Context ctx({.threads = 2, .flush_denormals = flush});
        CHECK(ctx.flushes_denormals() == flush);
        const bool caller_before = dl::flush_denormals::active_on_this_thread();
        std::atomic<int> flushed{0};
        ctx.parallel_for(64, [&](std::int64_t) {
            if (dl::flush_denormals::active_on_this_thread()) flushed.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::microseconds(50));  // let the worker take some
        });
        CHECK(flushed.load() == (flush ? 64 : 0));
        CHECK(dl::flush_denormals::active_on_this_thread() == caller_before);  // restored after
#ifdef DL_HAVE_MXCSR
        // What it changes: the smallest normal float halved is a denormal, or zero when flushed.
        volatile float tiny = std::numeric_limits<float>::min();
        std::atomic<float> half{-1};
        ctx.parallel_for(2, [&](std::int64_t i) {
            if (i == 0) half = tiny * 0.5f;
        });
        CHECK((half.load() == 0.0f) == flush);
#endif
    }
}

TEST_CASE("serial_scope runs a thread's parallel loops inline, and nests") {
    dl::Context ctx({.threads = 2});
    const auto caller = std::this_thread::get_id();
    auto threads_used = [&] {
        std::atomic<int> elsewhere{0};
        ctx.parallel_for(64, [&](std::int64_t) {
            if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        });
        return elsewhere.load();
    };
    {
        const dl::serial_scope outer;
        CHECK(dl::serial_scope::active());
        CHECK(threads_used() == 0);
        {
            const dl::serial_scope inner;
        }
        CHECK(dl::serial_scope::active());  // the inner scope restores, not clears
    }
    CHECK(!dl::serial_scope::active());
    CHECK(threads_used() > 0);
}
