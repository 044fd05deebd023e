// Allocators and storage: the caching allocator's reuse and statistics, the system allocator, and the
// "zero allocations when steady" promise, checked against both the allocator's own count and a count of
// every call to the global operator new (replaced in this file for the whole test binary).
#include "support.hpp"

#include <atomic>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <new>

using dl::Shape;
using dl::Tensor;

// --- counting global operator new ---

// GCC flags free() on what it sees come from operator new; here operator new is malloc itself.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<std::int64_t> new_calls{0};

void* counted_allocate(std::size_t size, std::size_t alignment) {
    if (counting.load(std::memory_order_relaxed)) new_calls.fetch_add(1, std::memory_order_relaxed);
    if (size == 0) size = 1;
    void* p = nullptr;
    if (alignment <= alignof(std::max_align_t))
        p = std::malloc(size);
    else if (::posix_memalign(&p, alignment, size) != 0)
        p = nullptr;
    if (p == nullptr) throw std::bad_alloc();
    return p;
}

/// Counts operator new calls (on any thread) made while it is alive.
class new_counter {
public:
    new_counter() {
        new_calls.store(0);
        counting.store(true);
    }
    ~new_counter() { counting.store(false); }
    new_counter(const new_counter&) = delete;
    new_counter& operator=(const new_counter&) = delete;
    [[nodiscard]] std::int64_t stop() {
        counting.store(false);
        return new_calls.load();
    }
};
}  // namespace

void* operator new(std::size_t size) { return counted_allocate(size, 0); }
void* operator new[](std::size_t size) { return counted_allocate(size, 0); }
void* operator new(std::size_t size, std::align_val_t a) { return counted_allocate(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) {
    return counted_allocate(size, static_cast<std::size_t>(a));
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    try {
        return counted_allocate(size, 0);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    try {
        return counted_allocate(size, 0);
    } catch (...) {
        return nullptr;
    }
}
void* operator new(std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
    try {
        return counted_allocate(size, static_cast<std::size_t>(a));
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
    try {
        return counted_allocate(size, static_cast<std::size_t>(a));
    } catch (...) {
        return nullptr;
    }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {
void* volatile escape;  // keeps the compiler from eliding the allocations below
}

TEST_CASE("the operator new counter sees direct, aligned and container allocations") {
    new_counter counter;
    int* volatile one = new int(1);
    delete one;
    escape = ::operator new(100, std::align_val_t{64});
    ::operator delete(escape, std::align_val_t{64});
    std::vector<double> v(10);
    escape = v.data();
    CHECK(counter.stop() == 3);
}

// --- the steady-state loop ---

namespace {
/// One "training step" worth of tensor traffic: new tensors, a fused expression, random numbers,
/// views and a copy, all dropped at the end.
float steady_step(const Tensor<float>& x, dl::Context& ctx) {
    Tensor<float> scratch(x.shape(), ctx);
    scratch = 0.5f;
    Tensor<float> y = x * 2.0f + 1.0f;
    const auto noise = dl::uniform<float>(x.shape(), 0, 1, ctx);
    Tensor<float> z = y + noise;
    const auto copy = z.reshape({-1}).slice(0, 0, z.numel(), 2).clone();
    y += scratch;
    return y.data()[0] + copy.data()[0];
}

void check_steady_loop_allocates_nothing(int threads) {
    const int iterations = dl_test::quick() ? 20 : 200;
    // Large enough for the expression and the random fill to be split over the threads.
    const std::int64_t n = std::int64_t{1} << 18;
    dl::Context ctx({.seed = 1, .threads = threads});
    const auto x = dl::uniform<float>({n / 64, 64}, -1, 1, ctx);
    float sink = steady_step(x, ctx);  // warm-up: fills the cache

    const auto before = ctx.allocator().stats();
    new_counter counter;
    for (int i = 0; i < iterations; ++i) sink += steady_step(x, ctx);
    const std::int64_t news = counter.stop();
    const auto after = ctx.allocator().stats();

    CHECK(news == 0);
    CHECK(after.system_allocations == before.system_allocations);
    CHECK(after.cache_hits - before.cache_hits == 5 * iterations);  // scratch, y, noise, z, copy
    CHECK(after.bytes_in_use == before.bytes_in_use);
    CHECK(std::isfinite(sink));
}
}  // namespace

TEST_CASE("a steady loop on one thread reaches neither the system allocator nor operator new") {
    check_steady_loop_allocates_nothing(1);
}

TEST_CASE("a steady loop on two threads reaches neither the system allocator nor operator new") {
    check_steady_loop_allocates_nothing(2);
}

TEST_CASE("creating, viewing and dropping tensors makes no operator new call") {
    dl::Context ctx({.threads = 1});
    { const Tensor<double> warm({3, 4}, ctx); }
    double seen = 0;
    Shape view_shape;
    new_counter counter;
    {
        Tensor<double> t({3, 4}, ctx);
        t = 1.0;
        const auto v = t.t().slice(0, 1, 3).unsqueeze(0).expand({2, 2, 3}).squeeze(0).permute({0, 1, 2});
        const auto r = t.reshape({2, -1}).flatten().select(0, 5);
        seen = r.item();
        view_shape = v.shape();
    }
    const std::int64_t news = counter.stop();  // no doctest macro inside the counted region
    CHECK(news == 0);
    CHECK(seen == 1.0);
    CHECK(view_shape == Shape{2, 2, 3});
}

// --- caching_allocator ---

TEST_CASE("caching_allocator reuses a freed block for the next request of its size class") {
    auto alloc = std::make_shared<dl::caching_allocator>();
    dl::Context ctx({.threads = 1, .allocator = alloc});
    CHECK(&ctx.allocator() == alloc.get());
    const void* first_address = nullptr;
    {
        const Tensor<float> t({100}, ctx);
        first_address = t.data();
    }
    CHECK(alloc->stats().system_allocations == 1);
    CHECK(alloc->stats().cache_hits == 0);
    {
        const Tensor<float> again({100}, ctx);
        CHECK(again.data() == first_address);  // the same block
        const Tensor<float> second({100}, ctx);  // the cache is empty now: a new block
        CHECK(second.data() != first_address);
    }
    CHECK(alloc->stats().system_allocations == 2);
    CHECK(alloc->stats().cache_hits == 1);
    // 10 and 12 floats (+ the 64-byte header) share the 128-byte class.
    { const Tensor<float> a({10}, ctx); }
    { const Tensor<float> b({12}, ctx); }
    CHECK(alloc->stats().system_allocations == 3);
    CHECK(alloc->stats().cache_hits == 2);
}

TEST_CASE("caching_allocator keeps different size classes apart") {
    auto alloc = std::make_shared<dl::caching_allocator>();
    dl::Context ctx({.threads = 1, .allocator = alloc});
    { const Tensor<float> small({1000}, ctx); }  // 4064 bytes: the 4096 class
    { const Tensor<float> bigger({1100}, ctx); }  // 4464 bytes: the 5120 class
    CHECK(alloc->stats().system_allocations == 2);
    CHECK(alloc->stats().cache_hits == 0);
    { const Tensor<float> again({1000}, ctx); }
    { const Tensor<float> large({1 << 20}, ctx); }
    { const Tensor<float> large_again({(1 << 20) + 1000}, ctx); }  // same class as 1 << 20 (4..5 MiB)
    CHECK(alloc->stats().system_allocations == 3);
    CHECK(alloc->stats().cache_hits == 2);
}

TEST_CASE("caching_allocator accounts bytes in use and cached, and release_cached empties the cache") {
    auto alloc = std::make_shared<dl::caching_allocator>();
    dl::Context ctx({.threads = 1, .allocator = alloc});
    const auto start = alloc->stats();
    CHECK(start.bytes_in_use == 0);
    CHECK(start.bytes_cached == 0);
    {
        const Tensor<float> a({16}, ctx);   // 64 + 64 header = 128 bytes
        const Tensor<double> b({100}, ctx);  // 800 + 64 = 864 -> 896 bytes
        CHECK(alloc->stats().bytes_in_use == 128 + 896);
        CHECK(alloc->stats().bytes_cached == 0);
    }
    CHECK(alloc->stats().bytes_in_use == 0);
    CHECK(alloc->stats().bytes_cached == 128 + 896);
    {
        const Tensor<float> c({16}, ctx);
        CHECK(alloc->stats().bytes_cached == 896);
        CHECK(alloc->stats().bytes_in_use == 128);
    }
    alloc->release_cached();
    CHECK(alloc->stats().bytes_cached == 0);
    CHECK(alloc->stats().bytes_in_use == 0);
    const auto hits = alloc->stats().cache_hits;
    const auto systems = alloc->stats().system_allocations;
    { const Tensor<float> d({16}, ctx); }
    CHECK(alloc->stats().cache_hits == hits);  // nothing left to hit
    CHECK(alloc->stats().system_allocations == systems + 1);
}

TEST_CASE("caching_allocator returns 64-byte aligned blocks of at least the size asked") {
    dl::caching_allocator alloc;
    for (std::size_t bytes : {1u, 63u, 64u, 65u, 4096u, 4097u, 5000u, 8192u, 8193u, 100000u, 3000000u}) {
        CAPTURE(bytes);
        void* p = alloc.allocate(bytes);
        CHECK(reinterpret_cast<std::uintptr_t>(p) % dl::storage_alignment == 0);
        std::memset(p, 0xAB, bytes);  // the whole block is writable (ASan checks the bound)
        CHECK(alloc.stats().bytes_in_use >= static_cast<std::int64_t>(bytes));
        CHECK(alloc.stats().bytes_in_use <= static_cast<std::int64_t>(bytes + bytes / 4 + 64));  // <= 25% slack
        alloc.deallocate(p, bytes);
        CHECK(alloc.stats().bytes_in_use == 0);
    }
}

TEST_CASE("caching_allocator is safe to use from several threads at once") {
    auto alloc = std::make_shared<dl::caching_allocator>();
    dl::Context ctx({.threads = 4, .allocator = alloc});
    const int rounds = dl_test::quick() ? 200 : 2000;
    std::atomic<int> bad{0};
    ctx.parallel_for(8, [&](std::int64_t task) {
        for (int i = 0; i < rounds; ++i) {
            Tensor<std::int64_t> t({static_cast<std::int64_t>(1 + (task + i) % 50)}, ctx);
            for (std::int64_t k = 0; k < t.numel(); ++k) t.data()[k] = task;
            for (std::int64_t k = 0; k < t.numel(); ++k) bad += t.data()[k] != task;
        }
    });
    CHECK(bad.load() == 0);
    CHECK(alloc->stats().bytes_in_use == 0);
}

// --- system_allocator and custom allocators ---

TEST_CASE("system_allocator counts every allocation and returns bytes_in_use to its start") {
    auto alloc = std::make_shared<dl::system_allocator>();
    dl::Context ctx({.threads = 1, .allocator = alloc});
    {
        const Tensor<float> a({10}, ctx);
        CHECK(alloc->stats().system_allocations == 1);
        CHECK(alloc->stats().bytes_in_use == 40 + 64);
        CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
    }
    CHECK(alloc->stats().bytes_in_use == 0);
    for (int i = 0; i < 5; ++i) { const Tensor<float> b({10}, ctx); }
    CHECK(alloc->stats().system_allocations == 6);
    CHECK(alloc->stats().cache_hits == 0);
    CHECK(alloc->stats().bytes_cached == 0);
    CHECK(alloc->stats().bytes_in_use == 0);
}

namespace {
/// Records what Storage asks of an allocator.
class recording_allocator final : public dl::Allocator {
public:
    void* allocate(std::size_t bytes) override {
        last_allocated = bytes;
        ++live;
        return inner.allocate(bytes);
    }
    void deallocate(void* block, std::size_t bytes) noexcept override {
        last_deallocated = bytes;
        --live;
        inner.deallocate(block, bytes);
    }
    dl::allocator_stats stats() const override { return inner.stats(); }

    dl::system_allocator inner;
    std::size_t last_allocated = 0, last_deallocated = 0;
    int live = 0;
};
}  // namespace

TEST_CASE("a user allocator gets each block back with the size it handed out") {
    auto alloc = std::make_shared<recording_allocator>();
    dl::Context ctx({.threads = 1, .allocator = alloc});
    {
        const Tensor<std::int32_t> t({7, 3}, ctx);
        CHECK(alloc->live == 1);
        CHECK(alloc->last_allocated >= 7 * 3 * sizeof(std::int32_t));
        const auto view = t.t();  // views and handle copies do not allocate
        const auto copy = t;
        CHECK(alloc->live == 1);
        CHECK(view.shares_storage(copy));
    }
    CHECK(alloc->live == 0);
    CHECK(alloc->last_deallocated == alloc->last_allocated);
}

TEST_CASE("storage outlives its Context: the allocator stays alive while a block does") {
    std::weak_ptr<dl::Allocator> allocator;
    Tensor<float> survivor;
    {
        dl::Context ctx({.threads = 2});
        allocator = ctx.shared_allocator();
        survivor = dl::full<float>({4, 4}, 3.0f, ctx);
    }
    CHECK_FALSE(allocator.expired());  // kept alive by the storage
    CHECK(survivor.storage().use_count() == 1);
    CHECK(dl_test::to_vector(survivor) == std::vector<float>(16, 3.0f));
    survivor.data()[5] = 1.0f;
    CHECK(survivor(1, 1) == 1.0f);
    CHECK(allocator.lock()->stats().bytes_in_use > 0);
    survivor = Tensor<float>{};  // the last block goes back...
    CHECK(allocator.expired());  // ...and the allocator with it
}

TEST_CASE("two Contexts have separate allocators unless given the same one") {
    dl::Context a({.threads = 1}), b({.threads = 1});
    CHECK(&a.allocator() != &b.allocator());
    const auto b_before = b.allocator().stats();
    { const Tensor<float> t({1000}, a); }
    CHECK(a.allocator().stats().system_allocations == 1);
    CHECK(b.allocator().stats().system_allocations == b_before.system_allocations);
    CHECK(b.allocator().stats().bytes_cached == b_before.bytes_cached);

    auto shared = std::make_shared<dl::caching_allocator>();
    dl::Context c({.threads = 1, .allocator = shared}), d({.threads = 1, .allocator = shared});
    { const Tensor<float> t({1000}, c); }
    { const Tensor<float> t({1000}, d); }  // served from the block c returned
    CHECK(shared->stats().system_allocations == 1);
    CHECK(shared->stats().cache_hits == 1);
}
