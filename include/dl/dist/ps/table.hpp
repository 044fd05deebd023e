#pragma once
// One shard's part of a parameter-server embedding table: rows keyed by 64-bit feature ids, stored in
// slab pools (no allocation per row), found through an open-addressing map, updated by a server-side
// optimizer whose state sits in the row next to the weights.
//
// A shard is owned by one thread; nothing here locks. The service (service.hpp) routes every id to
// the shard that owns it.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "../../core/error.hpp"
#include "../../core/random.hpp"
#include "../../expr/math.hpp"

namespace dl::ps {

enum class initializer_kind : std::uint8_t { zeros = 0, uniform = 1, normal = 2 };

/// A row's initial values: zeros, uniform(-scale, scale) or normal(0, scale). The value of element j
/// of id's row is a pure function of (seed, id, j), so every server, every restart and the pull of a
/// not yet admitted id agree on it.
struct initializer {
    initializer_kind kind = initializer_kind::normal;
    float scale = 0.01f;
};

enum class optimizer_kind : std::uint8_t { sgd = 0, adagrad = 1, rowwise_adagrad = 2, adam = 3, ftrl = 4 };

/// The optimizer a table applies to pushed gradients. Fields a kind does not use are ignored.
struct optimizer_config {
    optimizer_kind kind = optimizer_kind::adagrad;
    float lr = 0.01f;
    float eps = 1e-10f;                ///< adagrad, rowwise_adagrad, adam
    float initial_accumulator = 0.0f;  ///< adagrad, rowwise_adagrad: the starting Σg²
    /// adam. Doubles: Adam's decay rates are 1 - beta, and 1 - 0.999f is 1.3e-5 relative off 0.001.
    double beta1 = 0.9, beta2 = 0.999;
    float beta = 1.0f, l1 = 0.0f, l2 = 0.0f;  ///< ftrl (lr is alpha), as dl::nn::ftrl
};

struct table_config {
    std::uint32_t id = 0;  ///< the name requests use for the table
    std::uint32_t dim = 0;
    initializer init{};
    std::uint64_t seed = 0;
    optimizer_config optimizer{};
    /// A row is created at the admit_after-th push of its id; before that pulls return the initial
    /// vector and pushes only count (a count-min sketch holds the counts).
    std::uint32_t admit_after = 1;
    /// Rows not updated for this many steps (push requests to the table) are evicted; 0 = never.
    std::uint32_t ttl_steps = 0;
    /// Bytes of live rows and map a server may hold for the table; beyond it the least frequently
    /// pushed rows are evicted first (down to 90 % of the budget). 0 = unlimited.
    std::uint64_t memory_budget = 0;
};

/// Checks a config; the message names the field. Used by every entry point that accepts one.
inline void validate(const table_config& c) {
    using dl::detail::fail;
    if (c.dim == 0 || c.dim > (1u << 20)) fail("dl::ps: table ", c.id, ": dim must be in [1, 2^20], got ", c.dim);
    if (static_cast<unsigned>(c.init.kind) > 2) fail("dl::ps: table ", c.id, ": unknown initializer kind");
    if (!std::isfinite(c.init.scale) || c.init.scale < 0) fail("dl::ps: table ", c.id, ": initializer scale must be finite and >= 0");
    const optimizer_config& o = c.optimizer;
    if (static_cast<unsigned>(o.kind) > 4) fail("dl::ps: table ", c.id, ": unknown optimizer kind");
    if (!(o.lr > 0) || !std::isfinite(o.lr)) fail("dl::ps: table ", c.id, ": lr must be finite and > 0, got ", o.lr);
    if (!(o.eps >= 0) || !(o.initial_accumulator >= 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) ||
        !(o.beta >= 0) || !(o.l1 >= 0) || !(o.l2 >= 0))
        fail("dl::ps: table ", c.id, ": optimizer hyper-parameters out of range (eps, accumulator, beta, l1, l2 >= 0; beta1, beta2 in [0, 1))");
    if (c.admit_after == 0 || c.admit_after > 255) fail("dl::ps: table ", c.id, ": admit_after must be in [1, 255], got ", c.admit_after);
    if (c.ttl_steps > (1u << 30)) fail("dl::ps: table ", c.id, ": ttl_steps must be at most 2^30, got ", c.ttl_steps);
}

/// Optimizer state floats per row of `dim` elements.
[[nodiscard]] constexpr std::uint32_t state_floats(optimizer_kind kind, std::uint32_t dim) noexcept {
    switch (kind) {
    case optimizer_kind::sgd: return 0;
    case optimizer_kind::adagrad: return dim;
    case optimizer_kind::rowwise_adagrad: return 1;
    case optimizer_kind::adam: return 2 * dim + 1;  // m, v, and the row's step count
    case optimizer_kind::ftrl: return 2 * dim;      // z, n
    }
    return 0;
}

/// What a row carries besides its values: the metadata of admission, eviction and caching.
struct row_meta {
    std::uint64_t id;
    std::uint32_t frequency : 31;  ///< pushes that included the id (saturating)
    std::uint32_t dirty : 1;       ///< changed since the last checkpoint
    std::uint32_t last_step;       ///< the table step of the last update (modulo 2^32)
    std::uint32_t shows, clicks;
};
static_assert(sizeof(row_meta) == 24);

namespace detail {

/// splitmix64's finaliser: every bit of the id reaches every bit of the hash.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/// Maps a 32-bit hash onto [0, n) without a division (Lemire's multiply-shift).
[[nodiscard]] constexpr std::uint32_t fast_range(std::uint32_t hash, std::uint32_t n) noexcept {
    return static_cast<std::uint32_t>((std::uint64_t{hash} * n) >> 32);
}

/// Element j of id's initial row.
[[nodiscard]] inline float initial_value(const initializer& init, std::uint64_t seed, std::uint64_t id, std::uint32_t j) noexcept {
    const std::uint64_t key = seed ^ mix64(id);
    switch (init.kind) {
    case initializer_kind::zeros: return 0.0f;
    case initializer_kind::uniform: return static_cast<float>((2 * dl::detail::uniform_at(key, j) - 1) * init.scale);
    case initializer_kind::normal: return static_cast<float>(dl::detail::normal_at(key, j) * init.scale);
    }
    return 0.0f;
}

/// Fixed-size rows in 256 KiB slabs: a row is an index, freed rows go on an intrusive free list and
/// are reused, no row costs a heap allocation of its own. (2 MiB slabs advised to huge pages were
/// tried: no gain measurable here, and a 2 MiB slab left part-filled per pool costs 2-4 bytes per
/// row of a million — more than the memory target leaves.)
class row_pool {
public:
    explicit row_pool(std::size_t row_bytes)
        : row_bytes_(row_bytes),
          // At least two rows a slab: the reciprocal below needs a divisor of 2 or more.
          slab_bytes_((std::max(2 * row_bytes, slab_target) + slab_align - 1) / slab_align * slab_align),
          slab_rows_(static_cast<std::uint32_t>(slab_bytes_ / row_bytes)),
          slab_reciprocal_(~std::uint64_t{0} / slab_rows_ + 1) {}

    [[nodiscard]] std::uint32_t allocate() {
        if (free_head_ != none) {
            const std::uint32_t index = free_head_;
            std::memcpy(&free_head_, at(index), sizeof free_head_);
            ++live_;
            return index;
        }
        if (next_unused_ == slabs_.size() * std::size_t{slab_rows_}) {
            if (next_unused_ >= max_rows - slab_rows_) dl::detail::fail("dl::ps: a shard holds at most ", max_rows, " rows of one size");
            add_slab();
        }
        ++live_;
        return next_unused_++;
    }
    void release(std::uint32_t index) noexcept {
        std::memcpy(at(index), &free_head_, sizeof free_head_);
        free_head_ = index;
        --live_;
    }
    [[nodiscard]] std::byte* at(std::uint32_t index) const noexcept {
        // index / slab_rows_ without a division (Lemire, Kaser and Kurz: exact for 32-bit operands).
        const auto slab = static_cast<std::uint32_t>((static_cast<wide>(slab_reciprocal_) * index) >> 64);
        return slabs_[slab].get() + std::size_t{index - slab * slab_rows_} * row_bytes_;
    }
    [[nodiscard]] std::size_t row_bytes() const noexcept { return row_bytes_; }
    [[nodiscard]] std::size_t live() const noexcept { return live_; }
    [[nodiscard]] std::size_t reserved_bytes() const noexcept { return slabs_.size() * slab_bytes_; }

    static constexpr std::uint32_t max_rows = 1u << 28;  // the handle keeps 4 bits for the row size class

private:
    __extension__ using wide = unsigned __int128;
    static constexpr std::size_t slab_target = std::size_t{256} << 10, slab_align = 64;
    static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
    struct free_slab {
        void operator()(std::byte* p) const noexcept { std::free(p); }
    };

    void add_slab() {
        auto* p = static_cast<std::byte*>(std::aligned_alloc(slab_align, slab_bytes_));
        if (p == nullptr) throw std::bad_alloc();
        slabs_.emplace_back(p);
    }

    std::size_t row_bytes_, slab_bytes_;
    std::uint32_t slab_rows_;
    std::uint64_t slab_reciprocal_;
    std::vector<std::unique_ptr<std::byte[], free_slab>> slabs_;
    std::uint32_t next_unused_ = 0, free_head_ = none;
    std::size_t live_ = 0;
};

/// Count-min sketch of 8-bit saturating counters: how often an id not yet admitted was pushed, in
/// fixed memory whatever the number of distinct ids. Over-counts on collisions, never under-counts.
class admission_sketch {
public:
    static constexpr unsigned depth = 4;
    explicit admission_sketch(std::size_t width = std::size_t{1} << 20) : width_(width), counts_(depth * width) {}

    /// Counts one more push of id; returns the (over-)estimate of its pushes so far.
    std::uint32_t add(std::uint64_t id) noexcept {
        std::uint32_t estimate = 255;
        for (unsigned d = 0; d < depth; ++d) {
            std::uint8_t& c = counts_[d * width_ + index(id, d)];
            if (c < 255) ++c;
            estimate = std::min<std::uint32_t>(estimate, c);
        }
        return estimate;
    }
    [[nodiscard]] std::size_t bytes() const noexcept { return counts_.size(); }

private:
    [[nodiscard]] std::size_t index(std::uint64_t id, unsigned d) const noexcept {
        return static_cast<std::size_t>(mix64(id + 0x9E3779B97F4A7C15ull * (d + 1)) % width_);
    }
    std::size_t width_;
    std::vector<std::uint8_t> counts_;
};

}  // namespace detail

/// One shard's rows of one table. Rows are [row_meta][dim weights][optimizer state] in a pool per row
/// size; the table's dim can grow (grow_dim) and old rows keep their size until a push reaches them,
/// which moves that one row to the new size (its new elements start from the initializer).
class table {
public:
    explicit table(const table_config& config) : config_(config) {
        validate(config);
        classes_.push_back({config.dim, detail::row_pool(row_bytes(config.dim))});
        if (config.admit_after > 1) sketch_.emplace();
        slots_.assign(min_capacity, 0);
    }

    [[nodiscard]] const table_config& config() const noexcept { return config_; }
    [[nodiscard]] std::uint32_t dim() const noexcept { return config_.dim; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }

    /// From now on new rows (and rows a push reaches) have `dim` elements; pulls return `dim` values.
    void grow_dim(std::uint32_t dim) {
        if (dim < config_.dim) dl::detail::fail("dl::ps: table ", config_.id, ": dim can only grow (", config_.dim, " -> ", dim, ")");
        if (dim == config_.dim) return;
        table_config next = config_;
        next.dim = dim;
        validate(next);
        current_ = class_for(dim);  // may throw: nothing is changed before it
        config_.dim = dim;
    }

    /// Writes `dim` values of id's row to out: the stored values, then initial ones past the stored
    /// row's size or for an id without a row. `dim` is the dim the request was checked against; it
    /// differs from dim() only while a grow_dim is under way.
    void pull(std::uint64_t id, float* out, std::uint32_t dim) const noexcept { copy_row(find(id), id, out, dim); }

    /// Applies one gradient of `dim` finite floats (the service checks) to id's row at table step
    /// `step`, creating the row when the id is admitted.
    void push(std::uint64_t id, const float* grad, std::uint32_t dim, std::uint32_t shows, std::uint32_t clicks, std::uint32_t step) {
        if (dim != config_.dim)
            dl::detail::fail("dl::ps: table ", config_.id, ": a push of dim ", dim, " met dim ", config_.dim, " (grow_dim ran during the push)");
        std::uint32_t handle = find(id);
        if (handle == no_row) {
            if (sketch_ && sketch_->add(id) < config_.admit_after) return;
            handle = insert(id);
        } else if (class_of(handle).dim != config_.dim) {
            handle = resize_row(handle);
        }
        update(row(handle), grad, shows, clicks, step);
    }

    // Batched access: every id of a batch is looked up first, then the rows are read or updated.
    // The lookups are independent loads the CPU overlaps (one miss each in a table of GBs); interleaved
    // with the updates they would not be: a push of 2048 rows of 64 takes 0.36 ms instead of 0.46 ms
    // on a table of 500k rows. (Software prefetch of the rows on top measured no gain.)

    /// pull() for the ids at `positions`, into out + position · dim.
    void pull_many(std::span<const std::uint32_t> positions, std::span<const std::uint64_t> ids, float* out, std::uint32_t dim) {
        handles_.resize(positions.size());
        for (std::size_t k = 0; k < positions.size(); ++k) handles_[k] = find(ids[positions[k]]);
        for (std::size_t k = 0; k < positions.size(); ++k) copy_row(handles_[k], ids[positions[k]], out + std::size_t{positions[k]} * dim, dim);
    }

    /// push() for the rows at `positions` of ids/grads (and shows/clicks when not empty).
    void push_many(std::span<const std::uint32_t> positions, std::span<const std::uint64_t> ids, const float* grads, std::uint32_t dim,
                   std::span<const std::uint32_t> shows, std::span<const std::uint32_t> clicks, std::uint32_t step) {
        handles_.resize(positions.size());
        for (std::size_t k = 0; k < positions.size(); ++k) handles_[k] = find(ids[positions[k]]);
        for (std::size_t k = 0; k < positions.size(); ++k) {
            const std::uint32_t p = positions[k];
            const std::uint32_t h = handles_[k];
            const std::uint32_t sh = shows.empty() ? 0 : shows[p], cl = clicks.empty() ? 0 : clicks[p];
            // A missing row, or one an earlier duplicate of the id resized: the plain path looks again.
            if (h == no_row || dim != config_.dim || class_of(h).dim != config_.dim || meta(h).id != ids[p]) {
                push(ids[p], grads + std::size_t{p} * dim, dim, sh, cl, step);
                continue;
            }
            update(row(h), grads + std::size_t{p} * dim, sh, cl, step);
        }
    }

    /// Evicts rows idle for more than ttl_steps at `step`, then, over the memory budget, the least
    /// frequently pushed rows down to 90 % of it. `budget` is this shard's part. Returns rows evicted;
    /// calls on_evict(id) for each.
    template <class OnEvict>
    std::size_t evict(std::uint32_t step, std::uint64_t budget, OnEvict&& on_evict) {
        std::vector<std::uint32_t> victims;
        if (config_.ttl_steps != 0)
            for_each_handle([&](std::uint32_t h) {
                // Signed: a row updated at a later step than `step` (requests reach shards out of
                // step order) is not idle.
                if (static_cast<std::int32_t>(step - meta(h).last_step) > static_cast<std::int32_t>(config_.ttl_steps)) victims.push_back(h);
            });
        std::size_t evicted = erase_all(victims, on_evict);
        if (budget != 0 && live_bytes() > budget) {
            std::vector<std::pair<std::uint32_t, std::uint32_t>> by_frequency;  // (frequency, handle)
            by_frequency.reserve(size_);
            for_each_handle([&](std::uint32_t h) { by_frequency.emplace_back(std::uint32_t{meta(h).frequency}, h); });
            // Keep what fits in 90 % of the budget once the map's own bytes are paid.
            const std::uint64_t target = budget / 10 * 9, map = slots_.size() * sizeof(std::uint32_t);
            const std::size_t per_row = std::max<std::size_t>(1, (live_bytes() - map) / std::max<std::size_t>(1, size_));
            const std::size_t keep = target > map ? std::min<std::size_t>(size_, static_cast<std::size_t>((target - map) / per_row)) : 0;
            const std::size_t drop = size_ - keep;
            std::nth_element(by_frequency.begin(), by_frequency.begin() + static_cast<std::ptrdiff_t>(drop), by_frequency.end());
            victims.clear();
            for (std::size_t i = 0; i < drop; ++i) victims.push_back(by_frequency[i].second);
            evicted += erase_all(victims, on_evict);
        }
        return evicted;
    }

    /// Bytes the live rows and the map occupy (what the memory budget limits).
    [[nodiscard]] std::size_t live_bytes() const noexcept {
        std::size_t bytes = slots_.size() * sizeof(std::uint32_t);
        for (const auto& c : classes_) bytes += c.pool.live() * c.pool.row_bytes();
        return bytes;
    }
    /// Bytes held from the heap: slabs (free rows included), map, admission sketch.
    [[nodiscard]] std::size_t reserved_bytes() const noexcept {
        std::size_t bytes = slots_.size() * sizeof(std::uint32_t) + (sketch_ ? sketch_->bytes() : 0);
        for (const auto& c : classes_) bytes += c.pool.reserved_bytes();
        return bytes;
    }

    /// A view of one stored row.
    struct row_view {
        const row_meta& meta;
        std::span<const float> weights, state;
    };
    /// Calls f(row_view) for every row, in storage order.
    template <class F>
    void for_each_row(F&& f) const {
        for_each_handle([&](std::uint32_t h) {
            const std::uint32_t d = class_of(h).dim;
            std::byte* r = row(h);
            f(row_view{*reinterpret_cast<const row_meta*>(r), {weights(r), d}, {state(r, d), state_floats(config_.optimizer.kind, d)}});
        });
    }
    /// Calls f(row_view) for every row changed since the last call (all rows when `all`), and marks
    /// them unchanged: what a full or an incremental checkpoint writes.
    template <class F>
    void checkpoint_rows(bool all, F&& f) {
        for_each_handle([&](std::uint32_t h) {
            row_meta& m = meta(h);
            if (!all && !m.dirty) return;
            m.dirty = 0;  // cleared first, so the row is written as clean
            const std::uint32_t d = class_of(h).dim;
            std::byte* r = row(h);
            f(row_view{m, {weights(r), d}, {state(r, d), state_floats(config_.optimizer.kind, d)}});
        });
    }
    /// Stores a row as read back from a checkpoint (replacing any row of that id). weights.size() is
    /// the row's dim, at most dim(); state must have state_floats(kind, weights.size()) floats.
    void restore_row(const row_meta& m, std::span<const float> w, std::span<const float> s) {
        const auto d = static_cast<std::uint32_t>(w.size());
        if (d == 0 || d > config_.dim || s.size() != state_floats(config_.optimizer.kind, d))
            dl::detail::fail("dl::ps: table ", config_.id, ": restored row ", m.id, " has ", w.size(), " weights and ", s.size(),
                             " state floats (table dim ", config_.dim, ")");
        erase(m.id);
        const std::uint32_t h = insert_in_class(m.id, class_for(d));
        std::byte* r = row(h);
        std::memcpy(r, &m, sizeof m);
        meta(h).dirty = 0;  // as stored: a restored row has not changed since its checkpoint
        std::memcpy(weights(r), w.data(), w.size_bytes());
        std::memcpy(state(r, d), s.data(), s.size_bytes());
    }
    /// Removes id's row; false when it had none.
    bool erase(std::uint64_t id) noexcept {
        const std::uint32_t h = find(id);
        if (h == no_row) return false;
        erase_handle(h);
        return true;
    }

private:
    struct size_class {
        std::uint32_t dim;
        detail::row_pool pool;
    };
    static constexpr std::uint32_t no_row = std::numeric_limits<std::uint32_t>::max();
    static constexpr std::uint32_t max_frequency = (1u << 31) - 1;
    static constexpr std::size_t max_classes = 15;  // handle = class << 28 | index; class 15 + index 2^28-1 is no_row
    static constexpr std::size_t min_capacity = 16;

    [[nodiscard]] std::size_t row_bytes(std::uint32_t dim) const noexcept {
        const std::size_t bytes = sizeof(row_meta) + sizeof(float) * (dim + state_floats(config_.optimizer.kind, dim));
        return (bytes + alignof(row_meta) - 1) / alignof(row_meta) * alignof(row_meta);
    }
    /// The size class of rows of `dim` elements, made when missing (classes are only appended: handles
    /// name them by index).
    std::uint32_t class_for(std::uint32_t dim) {
        for (std::uint32_t c = 0; c < classes_.size(); ++c)
            if (classes_[c].dim == dim) return c;
        if (classes_.size() == max_classes) dl::detail::fail("dl::ps: table ", config_.id, ": more than ", max_classes, " row sizes");
        classes_.push_back({dim, detail::row_pool(row_bytes(dim))});
        return static_cast<std::uint32_t>(classes_.size() - 1);
    }
    [[nodiscard]] const size_class& class_of(std::uint32_t h) const noexcept { return classes_[h >> 28]; }
    [[nodiscard]] std::byte* row(std::uint32_t h) const noexcept { return class_of(h).pool.at(h & (detail::row_pool::max_rows - 1)); }
    [[nodiscard]] row_meta& meta(std::uint32_t h) const noexcept { return *reinterpret_cast<row_meta*>(row(h)); }
    [[nodiscard]] static float* weights(std::byte* r) noexcept { return reinterpret_cast<float*>(r + sizeof(row_meta)); }
    [[nodiscard]] static float* state(std::byte* r, std::uint32_t dim) noexcept { return weights(r) + dim; }

    // --- the map: slots hold handle + 1 (0 = empty); the id is read from the row, so a slot costs 4
    // bytes. Linear probing, deletion by backward shift (no tombstones), at most 7/8 full.
    [[nodiscard]] std::size_t home(std::uint64_t id) const noexcept {
        return static_cast<std::size_t>((detail::mix64(id) * 0x9E3779B97F4A7C15ull) >> (64 - std::countr_zero(slots_.size())));
    }
    [[nodiscard]] std::uint32_t find(std::uint64_t id) const noexcept {
        const std::size_t mask = slots_.size() - 1;
        for (std::size_t i = home(id);; i = (i + 1) & mask) {
            const std::uint32_t s = slots_[i];
            if (s == 0) return no_row;
            if (meta(s - 1).id == id) return s - 1;
        }
    }
    void place(std::uint64_t id, std::uint32_t handle) noexcept {
        const std::size_t mask = slots_.size() - 1;
        std::size_t i = home(id);
        while (slots_[i] != 0) i = (i + 1) & mask;
        slots_[i] = handle + 1;
    }
    std::uint32_t insert_in_class(std::uint64_t id, std::uint32_t c) {
        if ((size_ + 1) * 8 > slots_.size() * 7) {
            std::vector<std::uint32_t> old(slots_.size() * 2, 0);
            old.swap(slots_);
            for (std::uint32_t s : old)
                if (s != 0) place(meta(s - 1).id, s - 1);
        }
        const std::uint32_t handle = (c << 28) | classes_[c].pool.allocate();
        meta(handle).id = id;
        place(id, handle);
        ++size_;
        return handle;
    }
    /// A new row of the current dim with the initial values and optimizer state.
    std::uint32_t insert(std::uint64_t id) {
        const std::uint32_t h = insert_in_class(id, current_);
        std::byte* r = row(h);
        meta(h) = row_meta{id, 0, 0, 0, 0, 0};
        float* w = weights(r);
        for (std::uint32_t j = 0; j < config_.dim; ++j) w[j] = detail::initial_value(config_.init, config_.seed, id, j);
        init_state(state(r, config_.dim), config_.dim);
        return h;
    }
    /// Moves a row of an older, smaller dim to the current one: old values and state are kept, new
    /// elements start from the initializer and fresh optimizer state.
    std::uint32_t resize_row(std::uint32_t old) {
        const row_meta m = meta(old);
        const std::uint32_t d = class_of(old).dim, n = config_.dim;
        std::vector<float> w(weights(row(old)), weights(row(old)) + d);
        std::vector<float> s(state(row(old), d), state(row(old), d) + state_floats(config_.optimizer.kind, d));
        erase_handle(old);
        const std::uint32_t h = insert(m.id);
        std::byte* r = row(h);
        meta(h) = m;
        std::memcpy(weights(r), w.data(), d * sizeof(float));
        float* st = state(r, n);
        switch (config_.optimizer.kind) {
        case optimizer_kind::sgd: break;
        case optimizer_kind::adagrad: std::copy_n(s.data(), d, st); break;
        case optimizer_kind::rowwise_adagrad: st[0] = s[0]; break;
        case optimizer_kind::adam:
            std::copy_n(s.data(), d, st);
            std::copy_n(s.data() + d, d, st + n);
            st[2 * n] = s[2 * d];
            break;
        case optimizer_kind::ftrl:
            std::copy_n(s.data(), d, st);
            std::copy_n(s.data() + d, d, st + n);
            break;
        }
        return h;
    }
    /// Writes `dim` values of the row `handle` (no_row: none) of id to out, initial values past its end.
    void copy_row(std::uint32_t handle, std::uint64_t id, float* out, std::uint32_t dim) const noexcept {
        std::uint32_t stored = 0;
        if (handle != no_row) {
            stored = std::min(dim, class_of(handle).dim);
            std::memcpy(out, weights(row(handle)), stored * sizeof(float));
        }
        for (std::uint32_t j = stored; j < dim; ++j) out[j] = detail::initial_value(config_.init, config_.seed, id, j);
    }
    /// Counts one push in a row of the current dim and applies its gradient.
    void update(std::byte* r, const float* grad, std::uint32_t shows, std::uint32_t clicks, std::uint32_t step) noexcept {
        row_meta& m = *reinterpret_cast<row_meta*>(r);
        if (m.frequency != max_frequency) ++m.frequency;
        m.dirty = 1;
        m.last_step = step;
        m.shows += shows;
        m.clicks += clicks;
        apply_optimizer(weights(r), state(r, config_.dim), grad);
    }
    void init_state(float* s, std::uint32_t dim) const noexcept {
        const optimizer_config& o = config_.optimizer;
        switch (o.kind) {
        case optimizer_kind::sgd: break;
        case optimizer_kind::adagrad: std::fill(s, s + dim, o.initial_accumulator); break;
        case optimizer_kind::rowwise_adagrad: s[0] = o.initial_accumulator; break;
        case optimizer_kind::adam: std::fill(s, s + 2 * dim + 1, 0.0f); break;
        case optimizer_kind::ftrl: std::fill(s, s + 2 * dim, 0.0f); break;
        }
    }
    void erase_handle(std::uint32_t handle) noexcept {
        const std::size_t mask = slots_.size() - 1;
        std::size_t hole = home(meta(handle).id);
        while (slots_[hole] != handle + 1) hole = (hole + 1) & mask;
        // Backward shift: pull later entries of the probe run into the hole when their home allows.
        for (std::size_t i = (hole + 1) & mask; slots_[i] != 0; i = (i + 1) & mask) {
            const std::size_t h = home(meta(slots_[i] - 1).id);
            if (((i - h) & mask) >= ((i - hole) & mask)) {
                slots_[hole] = slots_[i];
                hole = i;
            }
        }
        slots_[hole] = 0;
        classes_[handle >> 28].pool.release(handle & (detail::row_pool::max_rows - 1));
        --size_;
    }
    template <class OnEvict>
    std::size_t erase_all(const std::vector<std::uint32_t>& handles, OnEvict& on_evict) {
        for (std::uint32_t h : handles) {
            on_evict(meta(h).id);
            erase_handle(h);
        }
        return handles.size();
    }
    template <class F>
    void for_each_handle(F&& f) const {
        for (std::uint32_t s : slots_)
            if (s != 0) f(s - 1);
    }

    /// The update of one row, in SIMD batches and a scalar tail (plain loops would stay scalar: std::sqrt
    /// does not vectorise while math-errno is on).
    void apply_optimizer(float* w, float* s, const float* g) const noexcept {
        using simd::load_as, simd::store_as;
        const optimizer_config o = config_.optimizer;
        const std::uint32_t n = config_.dim;
        switch (o.kind) {
        case optimizer_kind::sgd:
            simd::for_each_block<float>(n, [&]<class V>(std::uint32_t j) {
                store_as(w + j, load_as<V>(w + j) - V(o.lr) * load_as<V>(g + j));
            });
            break;
        case optimizer_kind::adagrad:
            simd::for_each_block<float>(n, [&]<class V>(std::uint32_t j) {
                const V d = load_as<V>(g + j), sum = load_as<V>(s + j) + d * d;
                store_as(s + j, sum);
                store_as(w + j, load_as<V>(w + j) - V(o.lr) * d / (math::sqrt(sum) + V(o.eps)));
            });
            break;
        case optimizer_kind::rowwise_adagrad: {
            float squares = 0;
            for (std::uint32_t j = 0; j < n; ++j) squares += g[j] * g[j];
            s[0] += squares / static_cast<float>(n);
            const float step = o.lr / (std::sqrt(s[0]) + o.eps);
            simd::for_each_block<float>(n, [&]<class V>(std::uint32_t j) {
                store_as(w + j, load_as<V>(w + j) - V(step) * load_as<V>(g + j));
            });
            break;
        }
        case optimizer_kind::adam: {
            float* m = s;
            float* v = s + n;
            float& t = s[2 * n];  // steps of this row: exact in float up to 2^24
            t += 1;
            const auto step = static_cast<float>(o.lr / (1 - std::pow(o.beta1, double(t))));
            const auto root_c2 = static_cast<float>(std::sqrt(1 - std::pow(o.beta2, double(t))));
            // The moments move toward g and g² by the rates 1 - beta, formed in double: as
            // beta·m + (1 - beta)·g in float, the rate would be 1 - float(beta), and a float beta
            // near 1 carries only a few digits of it.
            const auto rate1 = static_cast<float>(1 - o.beta1), rate2 = static_cast<float>(1 - o.beta2);
            simd::for_each_block<float>(n, [&]<class V>(std::uint32_t j) {
                const V d = load_as<V>(g + j), mj0 = load_as<V>(m + j), vj0 = load_as<V>(v + j);
                const V mj = mj0 + V(rate1) * (d - mj0);
                const V vj = vj0 + V(rate2) * (d * d - vj0);
                store_as(m + j, mj);
                store_as(v + j, vj);
                store_as(w + j, load_as<V>(w + j) - V(step) * mj / (math::sqrt(vj) / V(root_c2) + V(o.eps)));
            });
            break;
        }
        case optimizer_kind::ftrl: {
            float* z = s;
            float* sq = s + n;
            const float inv_lr = 1 / o.lr;
            simd::for_each_block<float>(n, [&]<class V>(std::uint32_t j) {
                const V d = load_as<V>(g + j), old = load_as<V>(sq + j), wj = load_as<V>(w + j);
                const V grown = old + d * d, root = math::sqrt(grown);
                const V zj = load_as<V>(z + j) + d - (root - math::sqrt(old)) * V(inv_lr) * wj;
                store_as(z + j, zj);
                store_as(sq + j, grown);
                const V shrunk = zj - simd::copysign(V(o.l1), zj);
                store_as(w + j, simd::select(simd::abs(zj) <= V(o.l1), V(0.0f), -shrunk / ((V(o.beta) + root) * V(inv_lr) + V(o.l2))));
            });
            break;
        }
        }
    }

    table_config config_;
    std::vector<size_class> classes_;
    std::uint32_t current_ = 0;  // the class of rows of the current dim
    std::vector<std::uint32_t> slots_;
    std::size_t size_ = 0;
    std::optional<detail::admission_sketch> sketch_;
    std::vector<std::uint32_t> handles_;  // pull_many's and push_many's lookups, reused
};

}  // namespace dl::ps
