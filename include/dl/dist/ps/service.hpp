#pragma once
// The parameter server's engine: tables sharded over threads. Each thread owns its shards' tables
// (rows, map, pool) and runs an Asio io_context; a request is checked once, split by owning shard,
// and each part is posted to its thread, so the rows are never touched by two threads and nothing on
// the hot path takes a lock. The TCP server (server.hpp) and the in-process client (client.hpp) both
// drive this class.
//
// With a data dir the service is durable (durability.hpp): table changes and pushes are written
// ahead and synced before they are acknowledged — pushes that arrive together share a sync —
// checkpoints are taken while serving, and a service started on the dir restores everything that
// was acknowledged.
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "durability.hpp"
#include "protocol.hpp"
#include "table.hpp"

namespace dl::ps {

namespace asio = boost::asio;

struct service_options {
    unsigned threads = 2;  ///< shard threads; each owns 1/threads of every table's ids
    /// Where tables, checkpoints and the write-ahead log live; empty: nothing is kept on disk. A
    /// dir must be reopened with the same thread count.
    std::filesystem::path data_dir{};
    /// With a data dir: log every push before acknowledging it (off: only checkpoints persist).
    bool write_ahead_log = true;
    /// A push is acknowledged after the sync that holds it. 0 (the default): a shard syncs as soon
    /// as the requests already queued on it are applied, so pushes that arrive together share one
    /// sync; more: it also waits up to this long for more pushes to share it.
    std::chrono::milliseconds group_commit{0};
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

/// The keys of the pushes one shard applied: per client the most recent `window` sequences, and a
/// floor below which every sequence counts as applied. Retries come within seconds of the push
/// they repeat, so a client's pushes more than `window` apart are never retries of each other; at
/// most `max_clients` clients are kept, the one unseen longest dropped first.
class applied_pushes {
public:
    static constexpr std::size_t window = 4096, max_clients = std::size_t{1} << 14;

    [[nodiscard]] bool contains(push_key k) const {
        const auto it = clients_.find(k.client);
        return it != clients_.end() && (k.sequence < it->second.floor || it->second.recent.contains(k.sequence));
    }
    void insert(push_key k) {
        auto [it, fresh] = clients_.try_emplace(k.client);
        if (fresh && clients_.size() > max_clients) {
            auto oldest = clients_.begin();
            for (auto c = clients_.begin(); c != clients_.end(); ++c)
                if (c != it && c->second.last_use < oldest->second.last_use) oldest = c;
            if (oldest == it) oldest = std::next(clients_.begin());
            clients_.erase(oldest);
        }
        client& c = it->second;
        c.last_use = ++clock_;
        if (k.sequence < c.floor) return;
        c.recent.insert(k.sequence);
        if (c.recent.size() > window) {
            c.floor = *c.recent.begin() + 1;
            c.recent.erase(c.recent.begin());
        }
    }
    void clear() noexcept { clients_.clear(); }
    /// Visits (client, floor, recent sequences) for a checkpoint.
    template <class Visit>
    void for_each(Visit&& visit) const {
        for (const auto& [id, c] : clients_) visit(id, c.floor, c.recent);
    }
    /// Restores one client written by for_each.
    void restore(std::uint64_t client_id, std::uint64_t floor, std::span<const std::uint64_t> recent) {
        for (std::uint64_t s : recent) insert({client_id, s});
        client& c = clients_[client_id];
        c.floor = std::max(c.floor, floor);
    }

private:
    struct client {
        std::uint64_t floor = 0;
        std::set<std::uint64_t> recent;
        std::uint64_t last_use = 0;
    };
    std::unordered_map<std::uint64_t, client> clients_;
    std::uint64_t clock_ = 0;
};

class service {
public:
    using completion = std::function<void(outcome)>;

    /// Starts the shard threads; with a data dir, first restores what it holds (throws dl::error
    /// naming the file when something there is damaged).
    explicit service(service_options options = {}) : options_(std::move(options)), shards_(std::max(1u, options_.threads)) {
        for (unsigned i = 0; i < shards_.size(); ++i) shards_[i].index = i;
        if (!options_.data_dir.empty()) recover();
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
        // Handlers still queued on one shard, and pushes waiting for a sync, may own sockets of
        // another shard (a reply posted across): destroy them all while every context exists.
        for (auto& s : shards_) s.waiting_for_sync.clear();
        for (auto& s : shards_) s.io.shutdown();
    }
    service(const service&) = delete;
    service& operator=(const service&) = delete;

    [[nodiscard]] unsigned shard_count() const noexcept { return static_cast<unsigned>(shards_.size()); }
    [[nodiscard]] const std::filesystem::path& data_dir() const noexcept { return options_.data_dir; }
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
        outcome early;
        {
            std::lock_guard lock(registry_writer_);
            if (auto existing = find(config.id)) {
                early = compare_config(existing->config, config);
            } else if (auto pending = creating_.find(config.id); pending != creating_.end()) {
                // A create of this id is under way: an identical request waits for it.
                if (same_config(pending->second.first, config)) {
                    pending->second.second.push_back(std::move(done));
                    return;
                }
                early = compare_config(pending->second.first, config);
            } else {
                // Logged before any shard has the table, so a checkpoint never holds a table that
                // a restart would not create.
                early = log_table_change([&](frame_bytes& out) { detail::put_config(out, config); });
                if (early.ok()) {
                    creating_.try_emplace(config.id, config, std::vector<completion>{}).first->second.second.push_back(std::move(done));
                    done = nullptr;
                }
            }
        }
        if (done) return done(std::move(early));
        auto entry = std::make_shared<table_entry>(config, std::make_shared<table_counters>());
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

    /// Raises a table's dim: later pulls return `dim` values, later pushes must carry `dim`. One
    /// grow_dim of a table at a time; pushes of the old dim that reach a shard after it grew fail
    /// there (the request reports it; parts already applied on other shards stay applied).
    void grow_dim(std::uint32_t table_id, std::uint32_t dim, completion done) {
        std::shared_ptr<table_entry> entry;
        outcome refused;
        {
            std::lock_guard lock(registry_writer_);
            entry = find(table_id);
            table_config next = entry ? entry->config : table_config{};
            next.dim = dim;
            if (!entry) {
                refused = unknown_table(table_id);
            } else if (!growing_.insert(table_id).second) {
                refused = {status::failed, dl::detail::concat("dl::ps: table ", table_id, ": another grow_dim is under way")};
            } else {
                try {
                    if (dim < entry->config.dim) dl::detail::fail("dl::ps: table ", table_id, ": dim can only grow (", entry->config.dim, " -> ", dim, ")");
                    validate(next);
                    refused = log_table_change([&](frame_bytes& out) {
                        detail::put(out, detail::record_kind::grow);
                        detail::put(out, table_id);
                        detail::put(out, dim);
                    });
                } catch (const dl::error& e) {
                    refused = {status::malformed, e.what()};
                }
                if (!refused.ok()) growing_.erase(table_id);
            }
        }
        if (!refused.ok()) return done(std::move(refused));
        if (dim == entry->config.dim) {
            std::lock_guard lock(registry_writer_);
            growing_.erase(table_id);
            return done({});
        }
        fan_out_all(
            [this, table_id, dim](shard& s) {
                s.tables.at(table_id)->grow_dim(dim);
                // In the shard's log too: replayed pushes before it keep their old dim.
                if (s.log.is_open())
                    s.log.append([&](frame_bytes& out) {
                        detail::put(out, detail::record_kind::grow);
                        detail::put(out, table_id);
                        detail::put(out, dim);
                    });
            },
            [this, entry, dim, done = std::move(done)](outcome o) mutable {
                {
                    std::lock_guard lock(registry_writer_);
                    if (o.ok()) {
                        table_config next = entry->config;
                        next.dim = dim;
                        auto grown = std::make_shared<table_entry>(next, entry->counters);  // steps and evictions carry on
                        publish([&](registry& r) { r[next.id] = grown; });
                    }
                    growing_.erase(entry->config.id);
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
                job->run([&] {
                    shards_[s].tables.at(table_id)->pull_many(positions, ids, out.data(), dim);
                });
                job->arrive();
            });
        });
    }

    /// Applies a push. Everything is checked before any row is touched: an unknown table, a wrong
    /// dim, inconsistent sizes or a NaN/Inf gradient fail the whole request and change nothing. A
    /// push with a key (request.key) that a shard has applied before is not applied there again.
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
        const auto step = static_cast<std::uint32_t>(entry->counters->step.fetch_add(1, std::memory_order_relaxed));
        auto job = std::make_shared<split_job>(request.ids, shard_count(), std::move(done));
        job->for_each_part([&](unsigned s, std::span<const std::uint32_t> positions) {
            asio::post(shards_[s].io, [this, job, s, positions, table_id, request, dim, step, entry] {
                shard& sh = shards_[s];
                if (!sh.log_failure.empty()) {
                    job->fail({status::failed, sh.log_failure});
                    return job->arrive();
                }
                // A retry of a push this shard applied: acknowledged as the first one is, once the
                // log holding that one is synced, and not applied again.
                const bool keyed = request.key.client != 0;
                if (keyed && sh.applied.contains(request.key)) {
                    if (!sh.log.is_open()) return job->arrive();
                    sh.waiting_for_sync.push_back(job);
                    return schedule_commit(sh);
                }
                table* t = nullptr;
                const bool applied = job->run([&] {
                    t = sh.tables.at(table_id).get();
                    t->push_many(positions, request.ids, request.grads.data(), dim, request.shows, request.clicks, step);
                });
                if (!applied) return job->arrive();
                if (keyed) sh.applied.insert(request.key);
                // Logged in the order applied: the push, then what it evicted. Acknowledged only once
                // the log holding it is synced (commit).
                const bool durable = sh.log.is_open();
                const bool logged = job->run([&] {
                    if (durable)
                        sh.log.append([&](frame_bytes& out) {
                            detail::put(out, detail::record_kind::push);
                            detail::put(out, table_id);
                            detail::put(out, step);
                            detail::put(out, std::uint32_t{0});  // pads the push payload to 16 bytes: its ids stay 8-aligned
                            encode_push(out, positions, request.ids, request.grads, request.shows, request.clicks, dim, request.key);
                        });
                    if (const auto n = maybe_evict(sh, *t, entry->config, step)) entry->counters->evicted.fetch_add(n, std::memory_order_relaxed);
                    if (durable) sh.waiting_for_sync.push_back(job);
                });
                if (!logged || !durable) return job->arrive();
                schedule_commit(sh);
            });
        });
    }

    /// Takes checkpoint n (returned) of every shard: all rows (full) or the rows changed and removed
    /// since the previous one. Each shard's file is consistent (written between two of its requests);
    /// shards keep serving while the others write. Needs a data dir.
    void checkpoint(bool full, std::function<void(outcome, std::uint64_t)> done) {
        if (options_.data_dir.empty()) return done({status::failed, "dl::ps: checkpoints need a service with a data dir"}, 0);
        // Numbered and posted in one step: every shard then writes them in sequence order.
        std::lock_guard lock(checkpoint_guard_);
        const std::uint64_t seq = ++checkpoint_seq_;
        fan_out_all([this, full, seq](shard& sh) { write_checkpoint(sh, full, seq); },
                    [seq, done = std::move(done)](outcome o) { done(std::move(o), seq); });
    }

    /// Writes a table's rows and metadata, without optimizer state, to `path` for exported_table.
    void export_table(std::uint32_t table_id, const std::filesystem::path& path, completion done) {
        auto entry = find(table_id);
        if (!entry) return done(unknown_table(table_id));
        struct export_job {
            detail::log_file out;
            fs::path path, temp;
            completion done;
        };
        auto job = std::make_shared<export_job>();
        job->path = path;
        job->temp = fs::path(path.string() + ".tmp");
        job->done = std::move(done);
        try {
            job->out = detail::log_file(job->temp);
            fs::resize_file(job->temp, 0);
            job->out.append([&](frame_bytes& out) {
                detail::put(out, detail::record_kind::export_head);
                detail::put(out, table_id);
                detail::put(out, entry->config.dim);
            });
        } catch (const std::exception& e) {
            return job->done({status::failed, e.what()});
        }
        export_from(0, table_id, std::move(job));
    }

    /// Sums the shards' figures for a table.
    void stats(std::uint32_t table_id, std::function<void(outcome, table_stats)> done) {
        auto entry = find(table_id);
        if (!entry) return done(unknown_table(table_id), {});
        auto sum = std::make_shared<table_stats>();
        sum->dim = entry->config.dim;
        sum->step = entry->counters->step.load();
        sum->evicted = entry->counters->evicted.load();
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
    /// A table's counters, shared by the registry entries of its successive dims.
    struct table_counters {
        std::atomic<std::uint64_t> step{0};  ///< push requests accepted: the clock of TTL eviction
        std::atomic<std::uint64_t> evicted{0};
    };
    struct table_entry {
        table_entry(const table_config& c, std::shared_ptr<table_counters> k) : config(c), counters(std::move(k)) {}
        table_config config;  ///< immutable: a grow_dim publishes a new entry
        std::shared_ptr<table_counters> counters;
    };
    using registry = std::map<std::uint32_t, std::shared_ptr<table_entry>>;

    /// An io_context whose queued handlers can be destroyed (shutdown) before the context itself.
    struct shard_context : asio::io_context {
        using asio::io_context::io_context;
        using asio::execution_context::shutdown;
    };
    class split_job;
    struct shard {
        shard_context io{1};
        asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
        std::thread thread;
        std::unordered_map<std::uint32_t, std::unique_ptr<table>> tables;  // touched only by `thread`
        std::unordered_map<std::uint32_t, std::uint32_t> last_sweep;        // table -> step of its last TTL sweep
        unsigned index = 0;
        // durability (a data dir): the write-ahead log, the pushes waiting for its next sync, the
        // ids removed since the last checkpoint
        detail::log_file log;
        std::vector<std::shared_ptr<split_job>> waiting_for_sync;
        asio::steady_timer commit_timer{io};
        bool commit_armed = false;
        std::string log_failure;
        std::unordered_map<std::uint32_t, std::vector<std::uint64_t>> removed;
        bool next_checkpoint_full = false;
        applied_pushes applied;  // keys of the keyed pushes this shard applied
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
        /// Runs one part's work; an exception fails the request. Returns whether it succeeded.
        template <class Work>
        bool run(Work&& work) noexcept {
            try {
                work();
                return true;
            } catch (const std::exception& e) {
                fail({status::failed, e.what()});
                return false;
            }
        }
        void fail(outcome o) {
            std::lock_guard lock(error_guard_);
            if (error_.ok()) error_ = std::move(o);
        }
        /// One part is finished; the last one completes the request.
        void arrive() noexcept {
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

    /// Appends shard i's rows to an export, then hands the file to shard i + 1; the last one seals it.
    template <class Job>
    void export_from(unsigned i, std::uint32_t table_id, std::shared_ptr<Job> job) {
        asio::post(shards_[i].io, [this, i, table_id, job]() mutable {
            try {
                const table& t = *shards_[i].tables.at(table_id);
                detail::write_rows(job->out, table_id, [&](auto&& f) { t.for_each_row(f); }, false);
                if (i + 1 < shard_count()) return export_from(i + 1, table_id, std::move(job));
                job->out.append([](frame_bytes& out) {
                    detail::put(out, detail::record_kind::end);
                    detail::put(out, std::uint64_t{0});
                });
                job->out.sync();
                fs::rename(job->temp, job->path);
                detail::sync_directory(fs::absolute(job->path).parent_path());
                job->done({});
            } catch (const std::exception& e) {
                job->done({status::failed, e.what()});
            }
        });
    }

    // --- durability ---

    [[nodiscard]] fs::path shard_dir(unsigned i) const { return options_.data_dir / ("shard-" + std::to_string(i)); }

    /// Appends a table change to tables.log and syncs it; the caller holds registry_writer_.
    template <class Fill>
    outcome log_table_change(Fill&& fill) {
        if (!tables_log_.is_open()) return {};
        try {
            tables_log_.append(fill);
            tables_log_.sync();
            return {};
        } catch (const std::exception& e) {
            return {status::failed, e.what()};
        }
    }

    /// Arranges a sync for what the shard's log holds. With no interval it runs once the work already
    /// queued on the shard is done, so pushes that arrive together share it at no added wait.
    void schedule_commit(shard& sh) {
        if (sh.commit_armed) return;
        sh.commit_armed = true;
        if (options_.group_commit.count() == 0)
            return asio::post(sh.io, [this, &sh] {
                sh.commit_armed = false;
                commit(sh);
            });
        sh.commit_timer.expires_after(options_.group_commit);
        sh.commit_timer.async_wait([this, &sh](boost::system::error_code) {
            sh.commit_armed = false;
            commit(sh);
        });
    }
    /// Syncs the shard's log and acknowledges the pushes it holds. A failed sync fails them, and every
    /// later push: what is in memory is no longer what the disk holds (restart the server).
    void commit(shard& sh) {
        auto waiting = std::move(sh.waiting_for_sync);
        sh.waiting_for_sync.clear();
        if (sh.log.pending()) {
            try {
                sh.log.sync();
            } catch (const std::exception& e) {
                sh.log_failure = dl::detail::concat(e.what(), "; the server no longer accepts pushes (restart it from its data dir)");
            }
        }
        for (auto& job : waiting) {
            if (!sh.log_failure.empty()) job->fail({status::failed, sh.log_failure});
            job->arrive();
        }
    }

    /// On shard sh's thread: writes checkpoint seq of its tables, then starts log segment seq. After
    /// a failed checkpoint the next one is full, whatever was asked: the failed one had already marked
    /// rows as written.
    void write_checkpoint(shard& sh, bool full, std::uint64_t seq) {
        commit(sh);
        full = full || sh.next_checkpoint_full;
        sh.next_checkpoint_full = true;  // until this one is on disk
        const fs::path dir = shard_dir(sh.index);
        const fs::path file = dir / ((full ? "full-" : "incr-") + std::to_string(seq) + ".ckpt");
        const fs::path temp = fs::path(file.string() + ".tmp");
        {
            detail::log_file out(temp);
            fs::resize_file(temp, 0);
            const auto snapshot = registry_.load();
            for (auto& [id, t] : sh.tables) {
                const auto it = snapshot->find(id);
                const std::uint64_t step = it == snapshot->end() ? 0 : it->second->counters->step.load();
                out.append([&, id = id, dim = t->dim()](frame_bytes& b) {
                    detail::put(b, detail::record_kind::step);
                    detail::put(b, id);
                    detail::put(b, dim);
                    detail::put(b, step);
                });
                auto& removed = sh.removed[id];
                if (!full && !removed.empty()) out.append([&, id = id](frame_bytes& b) { detail::put_removed(b, id, removed); });
                removed.clear();
                detail::write_rows(out, id, [&](auto&& f) { t->checkpoint_rows(full, f); }, true);
            }
            // Every key, in incremental checkpoints too: the log segments that held them go once this exists.
            sh.applied.for_each([&](std::uint64_t client, std::uint64_t floor, const std::set<std::uint64_t>& recent) {
                out.append([&](frame_bytes& b) {
                    detail::put(b, detail::record_kind::applied);
                    detail::put(b, std::uint32_t{0});  // pads to 8 bytes: the sequences stay 8-aligned
                    detail::put(b, client);
                    detail::put(b, floor);
                    for (std::uint64_t s : recent) detail::put(b, s);
                });
            });
            out.append([&](frame_bytes& b) {
                detail::put(b, detail::record_kind::end);
                detail::put(b, seq);
            });
            out.sync();
        }
        // The next log segment exists before the checkpoint does: pushes never go to a segment that
        // a restart would skip.
        detail::log_file next_log;
        if (options_.write_ahead_log) next_log = detail::log_file(dir / ("wal-" + std::to_string(seq) + ".log"));
        fs::rename(temp, file);
        if (next_log.is_open()) sh.log = std::move(next_log);
        detail::sync_directory(dir);
        sh.next_checkpoint_full = false;
        // What the new checkpoint covers is no longer needed.
        for (const auto& [n, path] : detail::numbered_files(dir, "wal-", ".log"))
            if (n < seq) fs::remove(path);
        if (full)
            for (const char* prefix : {"full-", "incr-"})
                for (const auto& [n, path] : detail::numbered_files(dir, prefix, ".ckpt"))
                    if (n < seq) fs::remove(path);
    }

    /// Rebuilds the service from its data dir; runs before the shard threads start. Tables are made
    /// at the dim they were created with and grow where a checkpoint or a log says they did, so every
    /// logged push replays at its own dim.
    void recover() {
        const fs::path& root = options_.data_dir;
        fs::create_directories(root);
        const auto shards = static_cast<std::uint32_t>(shards_.size());
        const fs::path meta = root / "meta";
        if (fs::exists(meta)) {
            std::uint32_t written = 0;
            data::record_reader reader(meta);
            if (auto r = reader.next(); r && r->size() == 8) std::memcpy(&written, r->data() + 4, 4);
            if (written != shards)
                dl::detail::fail("dl::ps: ", root.string(), " was written by a service with ", written, " threads; start this one with ", written);
        } else {
            const fs::path temp = root / "meta.tmp";
            {
                detail::log_file out(temp);
                fs::resize_file(temp, 0);
                out.append([&](frame_bytes& b) {
                    detail::put(b, detail::record_kind::meta);
                    detail::put(b, shards);
                });
                out.sync();
            }
            fs::rename(temp, meta);
        }
        for (auto& sh : shards_) fs::create_directories(shard_dir(sh.index));

        // Tables first: every later record refers to them.
        const fs::path tables = root / "tables.log";
        std::map<std::uint32_t, table_config> final_config;
        std::map<std::uint32_t, std::uint64_t> steps;
        detail::replay_log(tables, [&](std::span<const std::byte> record) {
            byte_reader r(record);
            const auto kind = detail::kind_of(r, tables);
            const auto id = r.get<std::uint32_t>();
            if (kind == detail::record_kind::table || kind == detail::record_kind::table_v2) {
                const table_config c = decode_table_config(r, id, kind == detail::record_kind::table ? 1 : 2);
                final_config[id] = c;
                for (auto& sh : shards_) sh.tables.emplace(id, std::make_unique<table>(c));
            } else if (kind == detail::record_kind::grow) {
                final_config.at(id).dim = r.get<std::uint32_t>();
            } else {
                dl::detail::fail("dl::ps: ", tables.string(), ": unexpected record");
            }
        });
        tables_log_ = detail::log_file(tables);
        detail::sync_directory(root);  // meta, tables.log and the shard dirs exist for good

        std::uint64_t last_seq = 0;
        for (auto& sh : shards_) {
            const fs::path dir = shard_dir(sh.index);
            auto table_of = [&](std::uint32_t id, const fs::path& file) -> table& {
                const auto it = sh.tables.find(id);
                if (it == sh.tables.end()) dl::detail::fail("dl::ps: ", file.string(), " refers to table ", id, ", which tables.log does not create");
                return *it->second;
            };
            auto erase = [&](byte_reader& r, const fs::path& file) {
                table& t = table_of(r.get<std::uint32_t>(), file);
                const auto count = r.get<std::uint32_t>();
                (void)r.get<std::uint32_t>();
                for (std::uint64_t gone : r.view<std::uint64_t>(count)) t.erase(gone);
            };
            // The last full checkpoint, then the incremental ones after it, without a gap.
            const auto fulls = detail::numbered_files(dir, "full-", ".ckpt");
            std::uint64_t covered = fulls.empty() ? 0 : fulls.rbegin()->first;
            std::vector<fs::path> checkpoints;
            if (!fulls.empty()) checkpoints.push_back(fulls.rbegin()->second);
            for (const auto& [n, path] : detail::numbered_files(dir, "incr-", ".ckpt")) {
                if (n <= covered) continue;
                if (n != covered + 1 && covered != 0)
                    dl::detail::fail("dl::ps: ", dir.string(), ": checkpoint ", covered + 1, " is missing before ", path.filename().string());
                checkpoints.push_back(path);
                covered = n;
            }
            for (const fs::path& file : checkpoints) {
                sh.applied.clear();  // each checkpoint holds every key up to it
                bool complete = false;
                data::record_reader reader(file);
                while (auto record = reader.next()) {
                    byte_reader r(*record);
                    try {
                        switch (detail::kind_of(r, file)) {
                        case detail::record_kind::step: {
                            const auto id = r.get<std::uint32_t>();
                            table_of(id, file).grow_dim(r.get<std::uint32_t>());
                            steps[id] = std::max(steps[id], r.get<std::uint64_t>());
                            break;
                        }
                        case detail::record_kind::rows: detail::restore_rows(r, table_of(r.get<std::uint32_t>(), file), file); break;
                        case detail::record_kind::removed: erase(r, file); break;
                        case detail::record_kind::applied: {
                            (void)r.get<std::uint32_t>();
                            const auto client = r.get<std::uint64_t>();
                            const auto floor = r.get<std::uint64_t>();
                            sh.applied.restore(client, floor, r.view<std::uint64_t>(r.remaining() / 8));
                            r.expect_end();
                            break;
                        }
                        case detail::record_kind::end: complete = true; break;
                        default: dl::detail::fail("dl::ps: ", file.string(), ": unexpected record in a checkpoint");
                        }
                    } catch (const decode_error& e) {
                        dl::detail::fail("dl::ps: ", file.string(), ": ", e.reason);
                    }
                }
                if (!complete) dl::detail::fail("dl::ps: ", file.string(), " is an incomplete checkpoint");
            }
            last_seq = std::max(last_seq, covered);
            // Then the log from that checkpoint on, in order: pushes, the evictions they caused, grows.
            fs::path latest = dir / ("wal-" + std::to_string(covered) + ".log");
            for (const auto& [n, path] : detail::numbered_files(dir, "wal-", ".log")) {
                if (n < covered) continue;
                detail::replay_log(path, [&](std::span<const std::byte> record) {
                    byte_reader r(record);
                    try {
                        switch (detail::kind_of(r, path)) {
                        case detail::record_kind::push: {
                            const auto id = r.get<std::uint32_t>();
                            const auto step = r.get<std::uint32_t>();
                            const push_request p = decode_push(record.subspan(16));
                            table& t = table_of(id, path);
                            for (std::size_t k = 0; k < p.ids.size(); ++k)
                                t.push(p.ids[k], p.grads.data() + k * p.dim, p.dim, p.shows.empty() ? 0 : p.shows[k], p.clicks.empty() ? 0 : p.clicks[k], step);
                            steps[id] = std::max(steps[id], std::uint64_t{step} + 1);
                            if (p.key.client != 0) sh.applied.insert(p.key);
                            break;
                        }
                        case detail::record_kind::removed: erase(r, path); break;
                        case detail::record_kind::grow: {
                            const auto id = r.get<std::uint32_t>();
                            table_of(id, path).grow_dim(r.get<std::uint32_t>());
                            break;
                        }
                        default: dl::detail::fail("dl::ps: ", path.string(), ": unexpected record in a log");
                        }
                    } catch (const decode_error& e) {
                        dl::detail::fail("dl::ps: ", path.string(), ": ", e.reason);
                    }
                });
                latest = path;
            }
            // A grow the log did not record (none of its pushes were logged) still happened.
            for (auto& [id, t] : sh.tables) t->grow_dim(final_config.at(id).dim);
            if (options_.write_ahead_log) sh.log = detail::log_file(latest);
            detail::sync_directory(dir);
        }
        checkpoint_seq_ = last_seq;
        publish([&](registry& r) {
            for (auto& [id, c] : final_config) {
                auto counters = std::make_shared<table_counters>();
                counters->step.store(steps[id]);
                r[id] = std::make_shared<table_entry>(c, std::move(counters));
            }
        });
    }

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
            if (static_cast<std::int32_t>(step - last) >= static_cast<std::int32_t>(std::max(1u, c.ttl_steps / 4))) {
                sweep = true;
                last = step;
            }
        }
        if (!sweep) return 0;
        std::vector<std::uint64_t> gone;
        const std::uint64_t n = t.evict(step, budget, [&](std::uint64_t id) { gone.push_back(id); });
        if (gone.empty() || options_.data_dir.empty()) return n;
        // For the next incremental checkpoint, and in the log: a restart must not bring them back.
        auto& removed = sh.removed[c.id];
        removed.insert(removed.end(), gone.begin(), gone.end());
        if (sh.log.is_open()) sh.log.append([&](frame_bytes& out) { detail::put_removed(out, c.id, gone); });
        return n;
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

    service_options options_;
    std::vector<shard> shards_;
    detail::log_file tables_log_;  // under registry_writer_
    std::atomic<std::uint64_t> checkpoint_seq_{0};
    std::mutex registry_writer_;  // serialises changes of the registry; readers never take it
    std::map<std::uint32_t, std::pair<table_config, std::vector<completion>>> creating_;  // under registry_writer_
    std::set<std::uint32_t> growing_;                                                      // under registry_writer_
    std::mutex checkpoint_guard_;  // checkpoints reach every shard in sequence order
    std::atomic<std::shared_ptr<const registry>> registry_{std::make_shared<const registry>()};
};

}  // namespace dl::ps
