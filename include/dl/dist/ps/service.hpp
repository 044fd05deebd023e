#pragma once
// The parameter server's engine: tables sharded over threads. Each thread owns its shards' tables
// (rows, map, pool) and runs an Asio io_context; a request is checked once, split by owning shard,
// and each part is posted to its thread, so the rows are never touched by two threads and nothing on
// the hot path takes a lock. The TCP server (server.hpp) and the in-process client (client.hpp) both
// drive this class.
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "protocol.hpp"
#include "table.hpp"

namespace dl::ps {

namespace asio = boost::asio;

struct service_options {
    unsigned threads = 2;  ///< shard threads; each owns 1/threads of every table's ids
};

/// How a request ended: status::ok, or an error status with a message naming the table and the value.
struct outcome {
    ps::status code = status::ok;
    std::string message;
    [[nodiscard]] bool ok() const noexcept { return code == status::ok; }
};

/// The shard thread (of `shards`) that owns an id. Servers split ids by the low half of the same hash
/// (server_of), so the two choices are independent.
[[nodiscard]] inline unsigned shard_of(std::uint64_t id, unsigned shards) noexcept {
    return detail::fast_range(static_cast<std::uint32_t>(detail::mix64(id) >> 32), shards);
}
[[nodiscard]] inline unsigned server_of(std::uint64_t id, unsigned servers) noexcept {
    return detail::fast_range(static_cast<std::uint32_t>(detail::mix64(id)), servers);
}

class service {
public:
    using completion = std::function<void(outcome)>;

    explicit service(service_options options = {}) : shards_(std::max(1u, options.threads)) {
        for (auto& s : shards_) s.thread = std::thread([&s] { s.io.run(); });
    }
    /// Stops the shard threads. Requests still queued are dropped: their completions never run (an
    /// embedded client's future then reports a broken promise). Destroy servers first.
    ~service() {
        for (auto& s : shards_) {
            s.work.reset();
            s.io.stop();
        }
        for (auto& s : shards_) s.thread.join();
        // Handlers still queued on one shard may own sockets of another (a reply posted across):
        // destroy every queue while all contexts exist.
        for (auto& s : shards_) s.io.shutdown();
    }
    service(const service&) = delete;
    service& operator=(const service&) = delete;

    [[nodiscard]] unsigned shard_count() const noexcept { return static_cast<unsigned>(shards_.size()); }
    /// The io_context of shard thread i (the TCP server runs its connections on them too).
    [[nodiscard]] asio::io_context& context(unsigned i) noexcept { return shards_[i].io; }

    /// Creates a table on every shard. Creating an existing id with the same config succeeds (so
    /// every worker may create the tables it uses); with another config it fails.
    void create_table(const table_config& config, completion done) {
        try {
            validate(config);
        } catch (const dl::error& e) {
            return done({status::malformed, e.what()});
        }
        {
            std::lock_guard lock(registry_writer_);
            if (auto existing = find(config.id)) return done(compare_config(existing->config, config));
            // Every worker may create the tables it uses at start: later identical requests wait for
            // the first one instead of racing it.
            auto [pending, first] = creating_.try_emplace(config.id, config, std::vector<completion>{});
            if (!first) {
                if (!same_config(pending->second.first, config)) return done(compare_config(pending->second.first, config));
                pending->second.second.push_back(std::move(done));
                return;
            }
            pending->second.second.push_back(std::move(done));
        }
        auto entry = std::make_shared<table_entry>(config);
        fan_out_all([config](shard& s) { s.tables.emplace(config.id, std::make_unique<table>(config)); }, [this, entry](outcome o) {
            std::vector<completion> waiters;
            {
                std::lock_guard lock(registry_writer_);
                auto node = creating_.extract(entry->config.id);
                waiters = std::move(node.mapped().second);
                if (o.ok()) publish([&](registry& r) { r[entry->config.id] = entry; });
            }
            for (auto& w : waiters) w(o);
        });
    }

    /// Raises a table's dim: later pulls return `dim` values, later pushes must carry `dim`.
    void grow_dim(std::uint32_t table_id, std::uint32_t dim, completion done) {
        auto entry = find(table_id);
        if (!entry) return done(unknown_table(table_id));
        table_config next = entry->config;
        next.dim = dim;
        try {
            if (dim < entry->config.dim) dl::detail::fail("dl::ps: table ", table_id, ": dim can only grow (", entry->config.dim, " -> ", dim, ")");
            validate(next);
        } catch (const dl::error& e) {
            return done({status::malformed, e.what()});
        }
        fan_out_all([table_id, dim](shard& s) { s.tables.at(table_id)->grow_dim(dim); },
                    [this, entry, next, done = std::move(done)](outcome o) mutable {
                        if (o.ok()) {
                            auto grown = std::make_shared<table_entry>(next);
                            std::lock_guard lock(registry_writer_);
                            grown->step.store(entry->step.load());
                            grown->evicted.store(entry->evicted.load());
                            publish([&](registry& r) { r[next.id] = grown; });
                        }
                        done(std::move(o));
                    });
    }

    /// The table's current config (dim included); throws dl::error for an unknown id.
    [[nodiscard]] table_config config(std::uint32_t table_id) const {
        auto entry = find(table_id);
        if (!entry) dl::detail::fail(unknown_table(table_id).message);
        return entry->config;
    }

    /// Writes the rows of `ids` to out (ids.size() × dim floats). ids and out must stay valid until
    /// done is called.
    void pull(std::uint32_t table_id, std::span<const std::uint64_t> ids, std::span<float> out, completion done) {
        auto entry = find(table_id);
        if (!entry) return done(unknown_table(table_id));
        const std::uint32_t dim = entry->config.dim;
        if (out.size() != ids.size() * dim)
            return done({status::wrong_dim, dl::detail::concat("dl::ps: pull of ", ids.size(), " ids from table ", table_id, " of dim ", dim,
                                                           " into ", out.size(), " floats")});
        auto job = std::make_shared<split_job>(ids, shard_count(), std::move(done));
        job->for_each_part([&](unsigned s, std::span<const std::uint32_t> positions) {
            asio::post(shards_[s].io, [this, job, s, positions, table_id, ids, out, dim] {
                job->run_part([&] {
                    const table& t = *shards_[s].tables.at(table_id);
                    for (std::uint32_t p : positions) t.pull(ids[p], out.data() + std::size_t{p} * dim, dim);
                });
            });
        });
    }

    /// Applies a push. Everything is checked before any row is touched: an unknown table, a wrong
    /// dim, inconsistent sizes or a NaN/Inf gradient fail the whole request and change nothing.
    /// The spans must stay valid until done is called.
    void push(std::uint32_t table_id, const push_request& request, completion done) {
        auto entry = find(table_id);
        if (!entry) return done(unknown_table(table_id));
        const std::uint32_t dim = entry->config.dim;
        const std::size_t n = request.ids.size();
        if (request.dim != dim)
            return done({status::wrong_dim, dl::detail::concat("dl::ps: push to table ", table_id, " of dim ", dim, " carries rows of dim ", request.dim)});
        if (request.grads.size() != n * dim || (!request.shows.empty() && (request.shows.size() != n || request.clicks.size() != n)))
            return done({status::malformed, dl::detail::concat("dl::ps: push to table ", table_id, ": ", n, " ids with ", request.grads.size(),
                                                           " gradient values, ", request.shows.size(), " shows and ", request.clicks.size(), " clicks")});
        if (const std::size_t bad = first_non_finite(request.grads); bad != std::string::npos)
            return done({status::non_finite, dl::detail::concat("dl::ps: push to table ", table_id, ": gradient of id ", request.ids[bad / dim],
                                                            " holds ", request.grads[bad], " at element ", bad % dim, "; nothing was applied")});
        const auto step = static_cast<std::uint32_t>(entry->step.fetch_add(1, std::memory_order_relaxed));
        auto job = std::make_shared<split_job>(request.ids, shard_count(), std::move(done));
        job->for_each_part([&](unsigned s, std::span<const std::uint32_t> positions) {
            asio::post(shards_[s].io, [this, job, s, positions, table_id, request, dim, step, entry] {
                job->run_part([&] {
                    shard& sh = shards_[s];
                    table& t = *sh.tables.at(table_id);
                    const bool counts = !request.shows.empty();
                    for (std::uint32_t p : positions)
                        t.push(request.ids[p], request.grads.data() + std::size_t{p} * dim, dim, counts ? request.shows[p] : 0,
                               counts ? request.clicks[p] : 0, step);
                    if (const auto n = maybe_evict(sh, t, entry->config, step)) entry->evicted.fetch_add(n, std::memory_order_relaxed);
                });
            });
        });
    }

    /// Sums the shards' figures for a table.
    void stats(std::uint32_t table_id, std::function<void(outcome, table_stats)> done) {
        auto entry = find(table_id);
        if (!entry) return done(unknown_table(table_id), {});
        auto sum = std::make_shared<table_stats>();
        sum->dim = entry->config.dim;
        sum->step = entry->step.load();
        sum->evicted = entry->evicted.load();
        auto guard = std::make_shared<std::mutex>();
        fan_out_all(
            [table_id, sum, guard](shard& s) {
                const table& t = *s.tables.at(table_id);
                std::lock_guard lock(*guard);  // stats are not on the hot path
                sum->rows += t.size();
                sum->live_bytes += t.live_bytes();
                sum->reserved_bytes += t.reserved_bytes();
            },
            [sum, done = std::move(done)](outcome o) { done(std::move(o), *sum); });
    }

private:
    struct table_entry {
        explicit table_entry(const table_config& c) : config(c) {}
        table_config config;
        std::atomic<std::uint64_t> step{0};     ///< push requests accepted: the clock of TTL eviction
        std::atomic<std::uint64_t> evicted{0};
    };
    using registry = std::map<std::uint32_t, std::shared_ptr<table_entry>>;

    /// An io_context whose queued handlers can be destroyed (shutdown) before the context itself.
    struct shard_context : asio::io_context {
        using asio::io_context::io_context;
        using asio::execution_context::shutdown;
    };
    struct shard {
        shard_context io{1};
        asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
        std::thread thread;
        std::unordered_map<std::uint32_t, std::unique_ptr<table>> tables;  // touched only by `thread`
        std::unordered_map<std::uint32_t, std::uint32_t> last_sweep;        // table -> step of its last TTL sweep
    };

    /// One request split by owning shard: positions of the ids grouped by shard (a counting sort),
    /// and the count of parts still running; the last part to finish calls done.
    class split_job {
    public:
        split_job(std::span<const std::uint64_t> ids, unsigned shards, completion done)
            : positions_(ids.size()), begin_(shards + 1, 0), done_(std::move(done)) {
            std::vector<std::uint16_t> owner(ids.size());
            for (std::size_t i = 0; i < ids.size(); ++i) ++begin_[(owner[i] = static_cast<std::uint16_t>(shard_of(ids[i], shards))) + 1];
            for (unsigned s = 0; s < shards; ++s) begin_[s + 1] += begin_[s];
            std::vector<std::uint32_t> fill(begin_.begin(), begin_.end() - 1);
            for (std::size_t i = 0; i < ids.size(); ++i) positions_[fill[owner[i]]++] = static_cast<std::uint32_t>(i);
            unsigned parts = 0;
            for (unsigned s = 0; s < shards; ++s) parts += begin_[s + 1] > begin_[s];
            remaining_.store(parts);
        }
        /// Calls post(shard, positions) for each shard with ids; done runs now when there are none.
        template <class Post>
        void for_each_part(Post&& post) {
            if (remaining_.load() == 0) return finish();
            for (unsigned s = 0; s + 1 < begin_.size(); ++s)
                if (begin_[s + 1] > begin_[s]) post(s, std::span<const std::uint32_t>(positions_).subspan(begin_[s], begin_[s + 1] - begin_[s]));
        }
        template <class Work>
        void run_part(Work&& work) noexcept {
            try {
                work();
            } catch (const std::exception& e) {
                std::lock_guard lock(error_guard_);
                if (error_.ok()) error_ = {status::failed, e.what()};
            }
            if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
        }

    private:
        void finish() noexcept {
            try {
                done_(std::move(error_));
            } catch (...) {
                // A completion must not throw into a shard thread; what it failed to report is lost.
            }
        }
        std::vector<std::uint32_t> positions_;
        std::vector<std::uint32_t> begin_;
        std::atomic<unsigned> remaining_{0};
        std::mutex error_guard_;  // only taken when a part fails
        outcome error_;
        completion done_;
    };

    /// Runs f on every shard thread, then done.
    template <class F>
    void fan_out_all(F f, completion done) {
        auto remaining = std::make_shared<std::atomic<unsigned>>(shard_count());
        auto failure = std::make_shared<std::pair<std::mutex, outcome>>();
        auto shared_done = std::make_shared<completion>(std::move(done));
        for (auto& s : shards_)
            asio::post(s.io, [&s, f, remaining, failure, shared_done] {
                try {
                    f(s);
                } catch (const std::exception& e) {
                    std::lock_guard lock(failure->first);
                    failure->second = {status::failed, e.what()};
                }
                if (remaining->fetch_sub(1) == 1) (*shared_done)(std::move(failure->second));
            });
    }

    /// Evicts idle rows every ttl/4 steps (so a row goes at most 1.25 ttl after its last update), and
    /// over-budget rows whenever the shard's part of the budget is exceeded.
    std::uint64_t maybe_evict(shard& sh, table& t, const table_config& c, std::uint32_t step) {
        const std::uint64_t budget = c.memory_budget / shard_count();
        bool sweep = budget != 0 && t.live_bytes() > budget;
        if (c.ttl_steps != 0) {
            std::uint32_t& last = sh.last_sweep[c.id];
            if (step - last >= std::max(1u, c.ttl_steps / 4)) {
                sweep = true;
                last = step;
            }
        }
        return sweep ? t.evict(step, budget, [](std::uint64_t) {}) : 0;
    }

    [[nodiscard]] std::shared_ptr<table_entry> find(std::uint32_t id) const {
        const auto snapshot = registry_.load(std::memory_order_acquire);
        const auto it = snapshot->find(id);
        return it == snapshot->end() ? nullptr : it->second;
    }
    /// Replaces the registry snapshot; the caller holds registry_writer_.
    template <class Edit>
    void publish(Edit&& edit) {
        auto next = std::make_shared<registry>(*registry_.load());
        edit(*next);
        registry_.store(std::move(next), std::memory_order_release);
    }
    [[nodiscard]] static outcome unknown_table(std::uint32_t id) {
        return {status::unknown_table, dl::detail::concat("dl::ps: unknown table ", id)};
    }
    [[nodiscard]] static outcome compare_config(const table_config& existing, const table_config& requested) {
        if (same_config(existing, requested)) return {};
        return {status::table_exists, dl::detail::concat("dl::ps: table ", requested.id, " exists with another config (dim ", existing.dim, ")")};
    }
    [[nodiscard]] static bool same_config(const table_config& a, const table_config& b) {
        frame_bytes x, y;
        byte_writer wa(x), wb(y);
        encode(wa, a);
        encode(wb, b);
        return x == y;
    }

    std::vector<shard> shards_;
    std::mutex registry_writer_;  // serialises changes of the registry; readers never take it
    std::map<std::uint32_t, std::pair<table_config, std::vector<completion>>> creating_;  // under registry_writer_
    std::atomic<std::shared_ptr<const registry>> registry_{std::make_shared<const registry>()};
};

}  // namespace dl::ps
