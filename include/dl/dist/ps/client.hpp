#pragma once
// The parameter-server client: one API over two transports.
//  - embedded: the service runs in this process (no sockets), the default on one machine;
//  - TCP: a cluster of server processes; ids are partitioned over the servers by hash, a request is
//    split per server and the replies merged.
// Calls are asynchronous and return std::future: a pull for the next batch can run while the current
// one computes (prefetch). Duplicate ids in a call are sent once (a pull copies the row to every
// position, a push sums their gradients and counts). Over TCP every call has a deadline: a server
// that is down, unreachable or silent fails the future with a dl::error naming it after a bounded
// number of retries (client_options::attempts); no call hangs, and no push is applied twice.
//
// A client object is used by one thread at a time (each worker owns one); many clients may share a
// service or a cluster.
#include <boost/asio/connect.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "server.hpp"

namespace dl::ps {

struct client_options {
    std::vector<std::string> servers;  ///< "host:port" each; ids are partitioned over them in this order
    std::chrono::milliseconds timeout{5000};  ///< per attempt, connecting included
    std::uint32_t max_payload = default_max_payload;
    /// Attempts of a call's part when its server cannot be reached or does not answer (refused, cut,
    /// past the timeout); each retry waits retry_backoff, doubled from one to the next. A call thus
    /// ends within about attempts × timeout. Retrying a push is safe: it carries a key with which the
    /// server applies it once (a push whose reply was lost may have been applied), also across a
    /// restart of a durable server. A retried checkpoint may take one more checkpoint.
    unsigned attempts = 3;
    std::chrono::milliseconds retry_backoff{50};
    /// The servers' shared secret (server_options::secret); empty for servers that ask for none.
    std::string secret{};
};

namespace detail {

/// The unique ids of a call and, for each position, which unique id it holds. An open-addressing
/// scratch table reused from call to call: no allocation once warm.
class id_dedupe {
public:
    void build(std::span<const std::uint64_t> ids) {
        unique_.clear();
        inverse_.resize(ids.size());
        std::size_t capacity = 16;
        while (capacity < ids.size() * 2) capacity *= 2;
        if (slots_.size() != capacity) slots_.assign(capacity, 0);
        else std::fill(slots_.begin(), slots_.end(), 0);
        const std::size_t mask = capacity - 1;
        for (std::size_t i = 0; i < ids.size(); ++i) {
            std::size_t s = static_cast<std::size_t>(mix64(ids[i])) & mask;
            for (;; s = (s + 1) & mask) {
                if (slots_[s] == 0) {
                    unique_.push_back(ids[i]);
                    slots_[s] = static_cast<std::uint32_t>(unique_.size());
                    break;
                }
                if (unique_[slots_[s] - 1] == ids[i]) break;
            }
            inverse_[i] = slots_[s] - 1;
        }
    }
    [[nodiscard]] std::span<const std::uint64_t> unique() const noexcept { return unique_; }
    [[nodiscard]] std::span<const std::uint32_t> inverse() const noexcept { return inverse_; }
    [[nodiscard]] bool has_duplicates() const noexcept { return unique_.size() != inverse_.size(); }

private:
    std::vector<std::uint64_t> unique_;
    std::vector<std::uint32_t> inverse_;
    std::vector<std::uint32_t> slots_;
};

/// What a call shares between its parts (one per server, or one embedded): the promise, the parts
/// still out, the first error, and the buffers the parts read or write.
struct call_state {
    std::promise<void> promise;
    std::atomic<unsigned> remaining{0};
    std::mutex error_guard;  // only taken on failure
    std::optional<outcome> error;
    // pull: rows of the unique ids (when there are duplicates), expanded into `out` at the end
    std::span<float> out;
    std::vector<float> unique_rows;
    std::vector<std::uint32_t> inverse;
    std::uint32_t dim = 0;
    // push: the summed gradients and counts of the unique ids (when there are duplicates)
    std::vector<std::uint64_t> ids;
    std::vector<float> grads;
    std::vector<std::uint32_t> shows, clicks;

    void fail(outcome o) {
        std::lock_guard lock(error_guard);
        if (!error) error = std::move(o);
    }
    /// Marks one part done; the last one settles the promise.
    void arrive() {
        if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        if (error) return promise.set_exception(std::make_exception_ptr(dl::error(error->message)));
        if (!inverse.empty()) {
            for (std::size_t i = 0; i < inverse.size(); ++i)
                std::memcpy(out.data() + i * dim, unique_rows.data() + std::size_t{inverse[i]} * dim, dim * sizeof(float));
        }
        promise.set_value();
    }
};

/// One TCP server as the client sees it: a connection made on first use, a write queue, the requests
/// waiting for their replies (each with a deadline). Lives on the client's io thread.
class server_link : public std::enable_shared_from_this<server_link> {
public:
    /// What to do with a reply to one part: called with the outcome and, when ok, the reply payload.
    using on_reply = std::function<void(outcome, std::span<const std::byte>)>;

    server_link(asio::io_context& io, std::string endpoint, const client_options& options)
        : io_(io), endpoint_(std::move(endpoint)), options_(options), socket_(io) {
        const auto colon = endpoint_.rfind(':');
        if (colon == std::string::npos) dl::detail::fail("dl::ps: server address '", endpoint_, "' is not host:port");
        host_ = endpoint_.substr(0, colon);
        port_ = endpoint_.substr(colon + 1);
    }

    [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }

    /// On the io thread: sends a frame (its header's request id set here) and calls reply exactly once.
    /// A reply payload of 8 + direct.size() bytes is read straight into `direct` after its first 8
    /// bytes (a pull's rows into the caller's buffer); `reply` then sees those 8 bytes only.
    void send(frame_bytes frame, std::string what, on_reply reply, std::span<std::byte> direct = {}) {
        const std::uint64_t id = ++last_id_;
        std::memcpy(frame.data() + 8, &id, 8);
        auto& p = pending_[id];
        p.reply = std::move(reply);
        p.what = std::move(what);
        p.direct = direct;
        p.timer = std::make_unique<asio::steady_timer>(io_, options_.timeout);
        p.timer->async_wait([self = shared_from_this(), id](boost::system::error_code ec) {
            if (!ec) self->fail_one(id, "did not answer within " + std::to_string(self->options_.timeout.count()) + " ms");
        });
        writes_.push_back(std::make_shared<frame_bytes>(std::move(frame)));
        if (state_ == link_state::connected && writes_.size() == 1) write_next();
        if (state_ == link_state::closed) connect();
    }

private:
    enum class link_state { closed, connecting, connected };
    struct pending_reply {
        on_reply reply;
        std::string what;
        std::span<std::byte> direct;
        bool receiving = false;  // its payload is being read into `direct`
        std::unique_ptr<asio::steady_timer> timer;
    };

    // Every handler carries the generation of the connection it was started on: after a drop, the
    // aborted operations of the old connection complete and must touch nothing of the new one.
    void connect() {
        state_ = link_state::connecting;
        auto resolver = std::make_shared<asio::ip::tcp::resolver>(io_);
        resolver->async_resolve(host_, port_, [self = shared_from_this(), resolver, gen = generation_](boost::system::error_code ec,
                                                                                                      asio::ip::tcp::resolver::results_type found) {
            if (gen != self->generation_) return;
            if (ec) return self->drop("cannot resolve: " + ec.message());
            asio::async_connect(self->socket_, found, [self, gen](boost::system::error_code ec, const asio::ip::tcp::endpoint&) {
                if (gen != self->generation_) return;
                if (ec) return self->drop("cannot connect: " + ec.message());
                self->socket_.set_option(asio::ip::tcp::no_delay(true));
                asio::co_spawn(self->io_, self->greet(), [self, gen](std::exception_ptr lost, std::string refused) {
                    if (gen != self->generation_) return;
                    // A refusal is the server's answer: retrying it would only be refused again.
                    if (!refused.empty()) return self->drop(refused, status::unauthorized);
                    if (lost) return self->drop("connection lost during the handshake");
                    self->state_ = link_state::connected;
                    self->read_next_header();
                    if (!self->writes_.empty()) self->write_next();
                });
            });
        });
    }

    /// Reads the server's hello and, when it holds a nonce, answers it (auth.hpp). What went wrong, or "".
    asio::awaitable<std::string> greet() {
        auto self = shared_from_this();  // the coroutine keeps the link alive
        std::array<std::byte, header_bytes> raw;
        co_await asio::async_read(socket_, asio::buffer(raw), asio::use_awaitable);
        const parsed_header p = parse_header(raw, hello_nonce_bytes);
        if (p.verdict != header_verdict::ok || p.header.op != static_cast<std::uint16_t>(op::hello) ||
            (p.header.payload_bytes != 0 && p.header.payload_bytes != hello_nonce_bytes))
            co_return "did not start with a dl::ps hello (" + (p.reason.empty() ? "op " + std::to_string(p.header.op) : p.reason) + ")";
        if (p.header.payload_bytes == 0) co_return "";  // it serves without a secret
        hello_nonce nonce{};
        co_await asio::async_read(socket_, asio::buffer(nonce), asio::use_awaitable);
        if (options_.secret.empty()) co_return "asks for a secret, and this client has none (client_options::secret)";
        const hello_mac answer = answer_hello(options_.secret, nonce);
        frame_bytes frame(header_bytes);
        frame_header h;
        h.op = static_cast<std::uint16_t>(op::hello);
        h.payload_bytes = static_cast<std::uint32_t>(answer.size());
        std::memcpy(frame.data(), &h, header_bytes);
        frame.insert(frame.end(), answer.begin(), answer.end());
        co_await asio::async_write(socket_, asio::buffer(frame), asio::use_awaitable);
        co_await asio::async_read(socket_, asio::buffer(raw), asio::use_awaitable);
        const parsed_header reply = parse_header(raw, 4096 + 256);
        if (reply.verdict != header_verdict::ok) co_return "sent a malformed reply to the handshake (" + reply.reason + ")";
        std::string message(reply.header.payload_bytes, '\0');
        co_await asio::async_read(socket_, asio::buffer(message), asio::use_awaitable);
        if (reply.header.status != 0) co_return "refused this client's secret (" + message + ")";
        co_return "";
    }

    void write_next() {
        // The handler owns the buffer: a drop may clear the queue while the write is in flight.
        auto buffer = writes_.front();
        asio::async_write(socket_, asio::buffer(*buffer), [self = shared_from_this(), buffer, gen = generation_](boost::system::error_code ec, std::size_t) {
            if (gen != self->generation_) return;
            if (ec) return self->drop("connection lost while sending: " + ec.message());
            self->writes_.pop_front();
            if (!self->writes_.empty()) self->write_next();
        });
    }

    void read_next_header() {
        asio::async_read(socket_, asio::buffer(header_), [self = shared_from_this(), gen = generation_](boost::system::error_code ec, std::size_t) {
            if (gen != self->generation_) return;
            if (ec) return self->drop("connection lost: " + ec.message());
            const parsed_header p = parse_header(self->header_, std::max(self->options_.max_payload, default_max_payload));
            // A reply with an op we did not send is as untrustworthy as a bad magic.
            if (p.verdict != header_verdict::ok) return self->drop("sent a malformed reply (" + p.reason + ")");
            self->reply_header_ = p.header;
            const auto it = self->pending_.find(p.header.request_id);
            const bool direct = it != self->pending_.end() && p.header.status == 0 && !it->second.direct.empty() &&
                                p.header.payload_bytes == 8 + it->second.direct.size();
            self->payload_.resize(direct ? 8 : p.header.payload_bytes);
            auto on_payload = [self, gen](boost::system::error_code ec, std::size_t) {
                if (gen != self->generation_) return;
                if (ec) return self->drop("connection lost: " + ec.message());
                self->deliver();
                self->read_next_header();
            };
            if (!direct) return asio::async_read(self->socket_, asio::buffer(self->payload_), on_payload);
            it->second.receiving = true;
            const std::array<asio::mutable_buffer, 2> parts{asio::buffer(self->payload_), asio::buffer(it->second.direct.data(), it->second.direct.size())};
            asio::async_read(self->socket_, parts, on_payload);
        });
    }

    void deliver() {
        const auto it = pending_.find(reply_header_.request_id);
        if (it == pending_.end()) return;  // timed out already: the caller has moved on
        pending_reply p = std::move(it->second);
        pending_.erase(it);
        p.timer->cancel();
        const auto code = static_cast<status>(reply_header_.status);
        if (code != status::ok) {
            std::string_view message(reinterpret_cast<const char*>(payload_.data()), payload_.size());
            if (message.starts_with("dl::ps: ")) message.remove_prefix(8);
            return p.reply({code, "dl::ps: server " + endpoint_ + ": " + std::string(message)}, {});
        }
        p.reply({}, payload_);
    }

    void fail_one(std::uint64_t id, const std::string& why) {
        const auto it = pending_.find(id);
        if (it == pending_.end()) return;
        // The caller's buffer is being written: only closing the connection stops that safely.
        if (it->second.receiving) return drop(why + " (stalled in the middle of a reply)");
        // A server stalled in the handshake: the next call connects afresh.
        if (state_ == link_state::connecting) return drop(why + " (still connecting)");
        pending_reply p = std::move(it->second);
        pending_.erase(it);
        p.reply({status::unavailable, "dl::ps: server " + endpoint_ + " " + why + " (" + p.what + ")"}, {});
    }

    /// The connection failed: every waiting request fails now (with `code`: unavailable ones are
    /// retried); the next send reconnects.
    void drop(const std::string& why, status code = status::unavailable) {
        ++generation_;
        boost::system::error_code ignored;
        socket_.close(ignored);
        state_ = link_state::closed;
        writes_.clear();
        auto waiting = std::move(pending_);
        pending_.clear();
        for (auto& [id, p] : waiting) {
            p.timer->cancel();
            p.reply({code, "dl::ps: server " + endpoint_ + ": " + why + " (" + p.what + ")"}, {});
        }
    }

    asio::io_context& io_;
    std::string endpoint_, host_, port_;
    const client_options& options_;
    asio::ip::tcp::socket socket_;
    link_state state_ = link_state::closed;
    std::deque<std::shared_ptr<frame_bytes>> writes_;
    std::unordered_map<std::uint64_t, pending_reply> pending_;
    std::uint64_t generation_ = 0;
    std::uint64_t last_id_ = 0;
    std::array<std::byte, header_bytes> header_{};
    frame_header reply_header_{};
    frame_bytes payload_;
};

}  // namespace detail

class client {
public:
    /// In-process: calls go straight to the service's shard threads.
    explicit client(service& embedded) : embedded_(&embedded) {}

    /// Over TCP to the servers of `options`; connections are made on first use.
    explicit client(client_options options) : options_(std::move(options)) {
        if (options_.servers.empty()) dl::detail::fail("dl::ps::client: no servers given");
        if (options_.timeout.count() <= 0) dl::detail::fail("dl::ps::client: the timeout must be positive");
        if (options_.attempts == 0 || options_.retry_backoff.count() < 0)
            dl::detail::fail("dl::ps::client: attempts must be at least 1 and retry_backoff not negative");
        for (const auto& s : options_.servers) links_.push_back(std::make_shared<detail::server_link>(io_, s, options_));
        io_thread_ = std::thread([this] { io_.run(); });
    }
    ~client() {
        if (embedded_) return;
        work_.reset();
        io_.stop();
        io_thread_.join();
    }
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    /// Creates the table on every server (succeeds when it exists with the same config).
    std::future<void> create_table(const table_config& config) {
        validate(config);
        if (embedded_) return embedded_call([&](service::completion done) { embedded_->create_table(config, std::move(done)); });
        frame_bytes payload;
        byte_writer w(payload);
        encode(w, config);
        return broadcast(op::create_table, config.id, payload, "create_table");
    }

    /// Raises a table's dim on every server.
    std::future<void> grow_dim(std::uint32_t table_id, std::uint32_t dim) {
        if (embedded_) return embedded_call([&](service::completion done) { embedded_->grow_dim(table_id, dim, std::move(done)); });
        frame_bytes payload(4);
        std::memcpy(payload.data(), &dim, 4);
        return broadcast(op::grow_dim, table_id, payload, "grow_dim");
    }

    /// Reads the rows of ids into out (ids.size() × the table's dim floats). ids is read now; out must
    /// stay valid until the future is ready.
    std::future<void> pull(std::uint32_t table_id, std::span<const std::uint64_t> ids, std::span<float> out) {
        if (ids.empty() ? !out.empty() : out.size() % ids.size() != 0)
            dl::detail::fail("dl::ps::client: pull of ", ids.size(), " ids into ", out.size(), " floats (not a whole number of rows)");
        auto call = std::make_shared<detail::call_state>();
        if (ids.empty()) {
            call->promise.set_value();
            return call->promise.get_future();
        }
        dedupe_.build(ids);
        call->out = out;
        call->dim = static_cast<std::uint32_t>(out.size() / ids.size());
        std::span<float> rows = out;
        if (dedupe_.has_duplicates()) {
            call->unique_rows.resize(dedupe_.unique().size() * call->dim);
            call->inverse.assign(dedupe_.inverse().begin(), dedupe_.inverse().end());
            rows = call->unique_rows;
        }
        auto future = call->promise.get_future();
        if (embedded_) {
            call->ids.assign(dedupe_.unique().begin(), dedupe_.unique().end());  // must outlive the call
            call->remaining.store(1);
            embedded_->pull(table_id, call->ids, rows, [call](outcome o) {
                if (!o.ok()) call->fail(std::move(o));
                call->arrive();
            });
            return future;
        }
        split_by_server(dedupe_.unique());
        call->remaining.store(active_servers());
        for (unsigned s = 0; s < links_.size(); ++s) {
            if (part_ids_[s].empty()) continue;
            frame_bytes frame = frame_for(op::pull, table_id, std::span<const std::uint64_t>(part_ids_[s]).size_bytes());
            byte_writer(frame).put_span(std::span<const std::uint64_t>(part_ids_[s]));
            auto where = std::make_shared<std::vector<std::uint32_t>>(std::move(part_pos_[s]));
            part_pos_[s].clear();
            const std::uint32_t dim = call->dim;
            // One server holding every row: its reply is read straight into `rows`.
            const bool in_order = where->size() * dim == rows.size();
            post_send(
                s, std::move(frame), what(op::pull, table_id, part_ids_[s].size()),
                [call, where, rows, dim, in_order](outcome o, std::span<const std::byte> payload) {
                    if (o.ok()) o = in_order && payload.size() == 8 ? check_rows_header(payload, where->size(), dim) : scatter_rows(payload, *where, rows, dim);
                    if (!o.ok()) call->fail(std::move(o));
                    call->arrive();
                },
                in_order ? std::as_writable_bytes(rows) : std::span<std::byte>{});
        }
        return future;
    }

    /// Pushes gradients (ids.size() × dim floats) and, optionally, per-id show and click counts. The
    /// data is copied (TCP) or kept (embedded) by the call: the spans may be reused at once.
    std::future<void> push(std::uint32_t table_id, std::span<const std::uint64_t> ids, std::span<const float> grads,
                           std::span<const std::uint32_t> shows = {}, std::span<const std::uint32_t> clicks = {}) {
        if (ids.empty() ? !grads.empty() : grads.size() % ids.size() != 0)
            dl::detail::fail("dl::ps::client: push of ", ids.size(), " ids with ", grads.size(), " gradient values (not a whole number of rows)");
        if (shows.size() != clicks.size() || (!shows.empty() && shows.size() != ids.size()))
            dl::detail::fail("dl::ps::client: push of ", ids.size(), " ids with ", shows.size(), " shows and ", clicks.size(), " clicks");
        auto call = std::make_shared<detail::call_state>();
        auto future = call->promise.get_future();
        if (ids.empty()) {
            call->promise.set_value();
            return future;
        }
        const auto dim = static_cast<std::uint32_t>(grads.size() / ids.size());
        sum_duplicates(*call, ids, grads, shows, clicks, dim);
        if (!dedupe_.has_duplicates()) {
            // The caller's spans are the unique rows; only the embedded call needs them to outlive this function.
            if (!embedded_) return push_parts(std::move(call), std::move(future), table_id, grads, shows, clicks, dim);
            call->grads.assign(grads.begin(), grads.end());
            call->shows.assign(shows.begin(), shows.end());
            call->clicks.assign(clicks.begin(), clicks.end());
        }
        if (embedded_) {
            call->remaining.store(1);
            push_request r{call->ids, call->grads, call->shows, call->clicks, dim};
            embedded_->push(table_id, r, [call](outcome o) {
                if (!o.ok()) call->fail(std::move(o));
                call->arrive();
            });
            return future;
        }
        return push_parts(call, std::move(future), table_id, call->grads, call->shows, call->clicks, dim);
    }

private:
    /// Sends each server its part of a push (call->ids unique, grads/shows/clicks row-aligned with them).
    std::future<void> push_parts(std::shared_ptr<detail::call_state> call, std::future<void> future, std::uint32_t table_id,
                                 std::span<const float> grads, std::span<const std::uint32_t> shows, std::span<const std::uint32_t> clicks,
                                 std::uint32_t dim) {
        split_by_server(call->ids);
        call->remaining.store(active_servers());
        const push_key key{client_id_, ++pushes_};
        for (unsigned s = 0; s < links_.size(); ++s) {
            const std::span<const std::uint32_t> where = part_pos_[s];
            if (where.empty()) continue;
            // The part's rows are gathered straight into its frame.
            const auto n = static_cast<std::uint32_t>(where.size());
            frame_bytes frame = frame_for(op::push, table_id, 0);
            encode_push(frame, where, call->ids, grads, shows, clicks, dim, key);
            post_send(s, std::move(frame), what(op::push, table_id, n), [call](outcome o, std::span<const std::byte>) {
                if (!o.ok()) call->fail(std::move(o));
                call->arrive();
            });
        }
        return future;
    }

public:
    /// Takes a checkpoint on every server (full: all rows; else the rows changed since the last one).
    std::future<void> checkpoint(bool full) {
        if (embedded_) return embedded_call([&](service::completion done) {
            embedded_->checkpoint(full, [done = std::move(done)](outcome o, std::uint64_t) { done(std::move(o)); });
        });
        frame_bytes payload(4);
        const std::uint32_t kind = full ? 0 : 1;
        std::memcpy(payload.data(), &kind, 4);
        return broadcast(op::checkpoint, 0, payload, "checkpoint");
    }

    /// Exports a table for serving (rows and metadata, no optimizer state). Embedded: to `name` as a
    /// path. TCP: each server writes <its data dir>/exports/<name> with its part of the table.
    std::future<void> export_table(std::uint32_t table_id, const std::string& name) {
        if (embedded_) return embedded_call([&](service::completion done) { embedded_->export_table(table_id, name, std::move(done)); });
        const auto bytes = std::as_bytes(std::span(name.data(), name.size()));
        return broadcast(op::export_table, table_id, bytes, "export");
    }

    /// The table's figures, summed over the servers.
    std::future<table_stats> stats(std::uint32_t table_id) {
        auto result = std::make_shared<std::promise<table_stats>>();
        auto future = result->get_future();
        if (embedded_) {
            embedded_->stats(table_id, [result](outcome o, table_stats s) {
                if (o.ok()) result->set_value(s);
                else result->set_exception(std::make_exception_ptr(dl::error(o.message)));
            });
            return future;
        }
        // Every reply runs on the io thread: a plain count finds the last one.
        struct gather {
            std::size_t remaining = 0;
            table_stats sum{};
            std::optional<outcome> error;
        };
        auto g = std::make_shared<gather>();
        g->remaining = links_.size();
        for (unsigned s = 0; s < links_.size(); ++s)
            post_send(s, frame_for(op::stats, table_id, 0), what(op::stats, table_id, 0), [g, result](outcome o, std::span<const std::byte> payload) {
                if (o.ok() && payload.size() != sizeof(table_stats)) o = {status::malformed, "dl::ps: stats reply of the wrong size"};
                if (o.ok()) {
                    table_stats part;
                    std::memcpy(&part, payload.data(), sizeof part);
                    g->sum.rows += part.rows;
                    g->sum.live_bytes += part.live_bytes;
                    g->sum.reserved_bytes += part.reserved_bytes;
                    g->sum.evicted += part.evicted;
                    g->sum.step = std::max(g->sum.step, part.step);
                    g->sum.dim = part.dim;
                } else if (!g->error) {
                    g->error = std::move(o);
                }
                if (--g->remaining != 0) return;
                if (g->error) result->set_exception(std::make_exception_ptr(dl::error(g->error->message)));
                else result->set_value(g->sum);
            });
        return future;
    }

private:
    template <class Start>
    std::future<void> embedded_call(Start&& start) {
        auto promise = std::make_shared<std::promise<void>>();
        auto future = promise->get_future();
        start([promise](outcome o) {
            if (o.ok()) promise->set_value();
            else promise->set_exception(std::make_exception_ptr(dl::error(o.message)));
        });
        return future;
    }

    [[nodiscard]] static std::uint64_t random_client_id() {
        std::random_device entropy;
        std::uint64_t id = 0;
        while (id == 0) id = (std::uint64_t{entropy()} << 32) ^ entropy();
        return id;
    }

    /// Sends the same payload to every server.
    std::future<void> broadcast(op code, std::uint32_t table_id, std::span<const std::byte> payload, const char* name) {
        auto call = std::make_shared<detail::call_state>();
        auto future = call->promise.get_future();
        call->remaining.store(static_cast<unsigned>(links_.size()));
        for (unsigned s = 0; s < links_.size(); ++s) {
            frame_bytes frame = frame_for(code, table_id, payload.size());
            frame.insert(frame.end(), payload.begin(), payload.end());
            post_send(s, std::move(frame), dl::detail::concat(name, " of table ", table_id), [call](outcome o, std::span<const std::byte>) {
                if (!o.ok()) call->fail(std::move(o));
                call->arrive();
            });
        }
        return future;
    }

    /// A frame with its header filled in (request id set by the link); the payload is appended.
    [[nodiscard]] static frame_bytes frame_for(op code, std::uint32_t table_id, std::size_t payload_reserve) {
        frame_bytes frame(header_bytes);
        frame.reserve(header_bytes + payload_reserve);
        frame_header h;
        h.op = static_cast<std::uint16_t>(code);
        h.table = table_id;
        std::memcpy(frame.data(), &h, header_bytes);
        return frame;
    }
    [[nodiscard]] static std::string what(op code, std::uint32_t table_id, std::size_t ids) {
        const char* name = code == op::pull ? "pull" : code == op::push ? "push" : "stats";
        return dl::detail::concat(name, " of ", ids, " ids, table ", table_id);
    }

    void post_send(unsigned server, frame_bytes frame, std::string description, detail::server_link::on_reply reply,
                   std::span<std::byte> direct = {}) {
        // The payload size goes in last: the frame is complete now.
        const auto payload = static_cast<std::uint32_t>(frame.size() - header_bytes);
        if (frame.size() - header_bytes > options_.max_payload) {
            reply({status::too_large, dl::detail::concat("dl::ps::client: ", description, " makes a frame of ", frame.size() - header_bytes,
                                                         " bytes, over the limit of ", options_.max_payload)},
                  {});
            return;
        }
        std::memcpy(frame.data() + 24, &payload, 4);
        asio::post(io_, [this, server, frame = std::make_shared<const frame_bytes>(std::move(frame)), description = std::move(description),
                         reply = std::move(reply), direct]() mutable {
            send_attempt(server, std::move(frame), std::move(description), std::move(reply), direct, 1);
        });
    }

    /// On the io thread: one attempt of a call's part. One that the server could not take or answer
    /// (status unavailable: refused, cut, past its deadline) is sent again after the backoff, up to
    /// options_.attempts in all; the caller sees the last attempt's outcome.
    void send_attempt(unsigned server, std::shared_ptr<const frame_bytes> frame, std::string description, detail::server_link::on_reply reply,
                      std::span<std::byte> direct, unsigned attempt) {
        auto retry = [this, server, frame, description, reply = std::move(reply), direct, attempt](outcome o, std::span<const std::byte> payload) mutable {
            if (o.code != status::unavailable || attempt >= options_.attempts) return reply(std::move(o), payload);
            auto timer = std::make_shared<asio::steady_timer>(io_, options_.retry_backoff * (std::int64_t{1} << std::min(attempt - 1, 20u)));
            timer->async_wait([this, timer, server, frame = std::move(frame), description = std::move(description), reply = std::move(reply), direct,
                               attempt](boost::system::error_code) mutable {
                send_attempt(server, std::move(frame), std::move(description), std::move(reply), direct, attempt + 1);
            });
        };
        links_[server]->send(frame_bytes(*frame), description, std::move(retry), direct);
    }

    /// Fills part_ids_/part_pos_: for each server, its ids and their positions in `ids`.
    void split_by_server(std::span<const std::uint64_t> ids) {
        part_ids_.resize(links_.size());
        part_pos_.resize(links_.size());
        for (auto& p : part_ids_) p.clear();
        for (auto& p : part_pos_) p.clear();
        const auto servers = static_cast<unsigned>(links_.size());
        for (std::size_t i = 0; i < ids.size(); ++i) {
            const unsigned s = server_of(ids[i], servers);
            part_ids_[s].push_back(ids[i]);
            part_pos_[s].push_back(static_cast<std::uint32_t>(i));
        }
    }
    [[nodiscard]] unsigned active_servers() const noexcept {
        unsigned n = 0;
        for (const auto& p : part_ids_) n += !p.empty();
        return n;
    }

    /// Checks the (dim, count) that starts a pull reply.
    static outcome check_rows_header(std::span<const std::byte> payload, std::size_t count, std::uint32_t dim) {
        std::uint32_t got_dim = 0, got_n = 0;
        if (payload.size() < 8) return {status::malformed, "dl::ps::client: pull reply does not match the request"};
        std::memcpy(&got_dim, payload.data(), 4);
        std::memcpy(&got_n, payload.data() + 4, 4);
        if (got_dim != dim)
            return {status::wrong_dim, dl::detail::concat("dl::ps::client: pull into rows of ", dim, " floats from a table of dim ", got_dim)};
        if (got_n != count) return {status::malformed, "dl::ps::client: pull reply does not match the request"};
        return {};
    }
    /// Copies a pull reply's rows to their positions; checks its shape first.
    static outcome scatter_rows(std::span<const std::byte> payload, std::span<const std::uint32_t> where, std::span<float> rows, std::uint32_t dim) {
        if (outcome o = check_rows_header(payload, where.size(), dim); !o.ok()) return o;
        if (payload.size() != 8 + std::uint64_t{where.size()} * dim * 4)
            return {status::malformed, "dl::ps::client: pull reply does not match the request"};
        const std::byte* src = payload.data() + 8;
        for (std::size_t k = 0; k < where.size(); ++k) std::memcpy(rows.data() + std::size_t{where[k]} * dim, src + k * dim * 4, dim * 4);
        return {};
    }

    /// The unique ids of a push, with gradients and counts of repeated ids summed (left empty when no
    /// id repeats: the caller's rows are the unique rows then).
    void sum_duplicates(detail::call_state& call, std::span<const std::uint64_t> ids, std::span<const float> grads, std::span<const std::uint32_t> shows,
                        std::span<const std::uint32_t> clicks, std::uint32_t dim) {
        dedupe_.build(ids);
        const auto unique = dedupe_.unique();
        call.ids.assign(unique.begin(), unique.end());
        if (!dedupe_.has_duplicates()) return;
        call.grads.assign(unique.size() * dim, 0.0f);
        if (!shows.empty()) {
            call.shows.assign(unique.size(), 0);
            call.clicks.assign(unique.size(), 0);
        }
        const auto inverse = dedupe_.inverse();
        for (std::size_t i = 0; i < ids.size(); ++i) {
            float* g = call.grads.data() + std::size_t{inverse[i]} * dim;
            for (std::uint32_t j = 0; j < dim; ++j) g[j] += grads[i * dim + j];
            if (!shows.empty()) {
                call.shows[inverse[i]] += shows[i];
                call.clicks[inverse[i]] += clicks[i];
            }
        }
    }

    service* embedded_ = nullptr;
    client_options options_;
    std::uint64_t client_id_ = random_client_id();  // with pushes_, the key of each push
    std::uint64_t pushes_ = 0;
    asio::io_context io_{1};
    asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
    std::vector<std::shared_ptr<detail::server_link>> links_;
    std::thread io_thread_;
    detail::id_dedupe dedupe_;
    std::vector<std::vector<std::uint64_t>> part_ids_;
    std::vector<std::vector<std::uint32_t>> part_pos_;
};

}  // namespace dl::ps
