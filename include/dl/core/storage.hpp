#pragma once
// Storage: a reference-counted block of tensor memory. The count and the owning allocator live in a
// 64-byte header inside the block itself, so creating a tensor costs one allocator request and no
// separate control block (a shared_ptr would add a malloc per tensor).
#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "allocator.hpp"

namespace dl {

class Storage {
public:
    Storage() noexcept = default;

    /// A block of `bytes` (64-byte aligned) from `allocator`, which stays alive while the block does.
    [[nodiscard]] static Storage allocate(std::shared_ptr<Allocator> allocator, std::size_t bytes) {
        void* block = allocator->allocate(bytes + header_size);
        Storage s;
        s.header_ = ::new (block) header{{1}, bytes, std::move(allocator)};
        return s;
    }

    Storage(const Storage& other) noexcept : header_(other.header_) {
        if (header_) header_->refs.fetch_add(1, std::memory_order_relaxed);
    }
    Storage(Storage&& other) noexcept : header_(std::exchange(other.header_, nullptr)) {}
    Storage& operator=(Storage other) noexcept {
        std::swap(header_, other.header_);
        return *this;
    }
    ~Storage() { release(); }

    [[nodiscard]] void* data() const noexcept {
        return header_ ? reinterpret_cast<std::byte*>(header_) + header_size : nullptr;
    }
    [[nodiscard]] std::size_t bytes() const noexcept { return header_ ? header_->bytes : 0; }
    [[nodiscard]] long use_count() const noexcept {
        return header_ ? header_->refs.load(std::memory_order_relaxed) : 0;
    }
    [[nodiscard]] explicit operator bool() const noexcept { return header_ != nullptr; }

private:
    struct header {
        std::atomic<long> refs;
        std::size_t bytes;
        std::shared_ptr<Allocator> allocator;
    };
    static constexpr std::size_t header_size = storage_alignment;
    static_assert(sizeof(header) <= header_size);

    void release() noexcept {
        if (header_ && header_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::shared_ptr<Allocator> allocator = std::move(header_->allocator);
            const std::size_t total = header_->bytes + header_size;
            header_->~header();
            allocator->deallocate(header_, total);
        }
        header_ = nullptr;
    }

    header* header_ = nullptr;
};

}  // namespace dl
