#pragma once
// Allocators hand out 64-byte aligned blocks. The default, caching_allocator, keeps freed blocks in
// size classes and hands them back on the next request of that class, so a steady loop that creates
// and drops same-sized tensors never reaches the system allocator (fresh pages cost ~11 µs each here).
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>

namespace dl {

inline constexpr std::size_t storage_alignment = 64;

struct allocator_stats {
    std::int64_t system_allocations = 0;  ///< blocks obtained from the system allocator
    std::int64_t cache_hits = 0;          ///< requests served from the cache
    std::int64_t bytes_in_use = 0;        ///< bytes handed out and not yet returned
    std::int64_t bytes_cached = 0;        ///< bytes held in the cache, free for reuse
    std::int64_t peak_bytes_in_use = 0;   ///< the most bytes_in_use has been since creation or reset_peak()
};

/// Interface for tensor memory. Implementations must be thread-safe: tensors are freed on any thread.
class Allocator {
public:
    virtual ~Allocator() = default;
    /// Returns `bytes` of storage aligned to storage_alignment; throws std::bad_alloc on failure.
    [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
    /// Returns a block from allocate() with the same `bytes`.
    virtual void deallocate(void* block, std::size_t bytes) noexcept = 0;
    [[nodiscard]] virtual allocator_stats stats() const = 0;
    /// Starts a new peak_bytes_in_use measurement from the bytes in use now.
    virtual void reset_peak() noexcept {}
};

/// Every request goes to the system allocator. Useful to compare against and for leak checkers.
class system_allocator final : public Allocator {
public:
    void* allocate(std::size_t bytes) override {
        void* p = ::operator new(bytes, std::align_val_t{storage_alignment});
        std::lock_guard lock(mutex_);
        ++stats_.system_allocations;
        stats_.bytes_in_use += static_cast<std::int64_t>(bytes);
        stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
        return p;
    }
    void deallocate(void* block, std::size_t bytes) noexcept override {
        ::operator delete(block, std::align_val_t{storage_alignment});
        std::lock_guard lock(mutex_);
        stats_.bytes_in_use -= static_cast<std::int64_t>(bytes);
    }
    allocator_stats stats() const override {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    void reset_peak() noexcept override {
        std::lock_guard lock(mutex_);
        stats_.peak_bytes_in_use = stats_.bytes_in_use;
    }

private:
    mutable std::mutex mutex_;
    allocator_stats stats_;
};

class caching_allocator final : public Allocator {
public:
    caching_allocator() = default;
    caching_allocator(const caching_allocator&) = delete;
    caching_allocator& operator=(const caching_allocator&) = delete;
    ~caching_allocator() override { release_cached(); }

    void* allocate(std::size_t bytes) override {
        const auto [index, rounded] = size_class(bytes);
        {
            std::lock_guard lock(mutex_);
            stats_.bytes_in_use += static_cast<std::int64_t>(rounded);
            stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
            if (free_block* head = free_[index]) {
                free_[index] = head->next;
                ++stats_.cache_hits;
                stats_.bytes_cached -= static_cast<std::int64_t>(rounded);
                return head;
            }
            ++stats_.system_allocations;
        }
        return ::operator new(rounded, std::align_val_t{storage_alignment});
    }

    void deallocate(void* block, std::size_t bytes) noexcept override {
        const auto [index, rounded] = size_class(bytes);
        std::lock_guard lock(mutex_);
        // The free list lives inside the freed blocks themselves: caching never allocates.
        free_[index] = ::new (block) free_block{free_[index]};
        stats_.bytes_in_use -= static_cast<std::int64_t>(rounded);
        stats_.bytes_cached += static_cast<std::int64_t>(rounded);
    }

    allocator_stats stats() const override {
        std::lock_guard lock(mutex_);
        return stats_;
    }
    void reset_peak() noexcept override {
        std::lock_guard lock(mutex_);
        stats_.peak_bytes_in_use = stats_.bytes_in_use;
    }

    /// Returns every cached block to the system.
    void release_cached() noexcept {
        std::lock_guard lock(mutex_);
        for (auto& head : free_) {
            while (head) {
                free_block* next = head->next;
                ::operator delete(head, std::align_val_t{storage_alignment});
                head = next;
            }
        }
        stats_.bytes_cached = 0;
    }

private:
    struct free_block {
        free_block* next;
    };
    struct class_info {
        std::size_t index, rounded;
    };
    // Multiples of 64 B up to 4 KiB; above, four classes per power of two (at most 25% slack).
    static constexpr class_info size_class(std::size_t bytes) noexcept {
        if (bytes <= 4096) {
            const std::size_t units = (std::max<std::size_t>(bytes, 1) + 63) / 64;
            return {units, units * 64};
        }
        const int e = static_cast<int>(std::bit_width(bytes - 1)) - 1;  // 2^e < bytes <= 2^(e+1)
        const std::size_t step = std::size_t{1} << (e - 2);
        const std::size_t steps = (bytes + step - 1) / step;  // in 5..8
        return {65 + static_cast<std::size_t>(e - 12) * 4 + (steps - 5), steps * step};
    }
    static constexpr std::size_t class_count = 65 + (64 - 12) * 4;

    mutable std::mutex mutex_;
    std::array<free_block*, class_count> free_{};
    allocator_stats stats_;
};

}  // namespace dl
