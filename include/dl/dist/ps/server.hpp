#pragma once
// The parameter server over TCP: connections are spread over the service's shard threads; each reads
// frames (protocol.hpp), checks them, hands them to the service and writes the replies back, several
// requests in flight per connection.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <future>
// Before Asio: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <memory>
#include <string>

#include "auth.hpp"
#include "service.hpp"

namespace dl::ps {

struct server_options {
    std::string address = "127.0.0.1";
    std::uint16_t port = 0;  ///< 0: the system picks one (see server::port())
    std::uint32_t max_payload = default_max_payload;
    /// Requests a connection may have in flight, from read until their replies are written; it stops
    /// reading until one is out, so a client holds at most this many requests of the server's memory.
    unsigned max_in_flight = 8;
    /// Bytes of requests and replies one connection may hold (read and not yet written back): at the
    /// limit it stops reading until its peer takes replies, so a client that never reads holds about
    /// this much plus one request and its reply. A connection with nothing in flight may always send one.
    std::size_t max_connection_bytes = std::size_t{16} << 20;
    /// The same over all connections: at the limit none reads a new request until others drain (or
    /// are closed as idle). Passed by at most one request and its reply per connection reading at once.
    std::size_t max_total_bytes = std::size_t{256} << 20;
    /// Connections served at once. At the limit a new connection takes the place of the one idle
    /// longest, if that one has been idle for a while (a second, or half the idle timeout when that is
    /// shorter: a new client gets that long to speak); else the new one is closed as soon as accepted.
    unsigned max_connections = 1024;
    /// A connection with no request in the service that has neither sent nor taken a byte for this
    /// long is closed: peers that only hold a connection open do not keep places for ever. 0: never.
    std::chrono::milliseconds idle_timeout{30000};
    /// The shared secret a client must prove it holds (auth.hpp) before anything it sends is read:
    /// without it, anyone who reaches the port may create tables, checkpoint and export.
    std::string secret{};
    /// Without a secret the server refuses to start unless this is set to false: serving anyone who
    /// can reach the port is something to ask for (keep the address on loopback then).
    bool authenticate = true;
};

namespace detail {

/// What the connections of one server count together (any thread).
struct connection_totals {
    std::atomic<unsigned> open{0};
    std::atomic<std::size_t> held_bytes{0};  ///< requests and replies held by connections
};

/// One client connection: a read loop (a coroutine) and a queue of replies to write. It lives on one
/// shard thread's io_context; replies finished on other shard threads are posted back to it.
class connection : public std::enable_shared_from_this<connection> {
public:
    connection(asio::ip::tcp::socket socket, service& svc, server_options options, std::shared_ptr<connection_totals> totals)
        : socket_(std::move(socket)),
          service_(svc),
          options_(options),
          slot_free_(socket_.get_executor()),
          idle_check_(socket_.get_executor()),
          totals_(std::move(totals)) {
        touch();
    }
    ~connection() {
        totals_->held_bytes.fetch_sub(held_, std::memory_order_relaxed);
        totals_->open.fetch_sub(1, std::memory_order_relaxed);
    }

    void start() {
        asio::co_spawn(socket_.get_executor(), [self = shared_from_this()] { return self->read_loop(); }, asio::detached);
        if (options_.idle_timeout.count() > 0) watch_idle(options_.idle_timeout);
    }

    // Read by the acceptor's thread when it must make room for a new connection.
    /// How long since the peer last sent or took a byte.
    [[nodiscard]] std::chrono::steady_clock::duration idle_for() const noexcept {
        return std::chrono::steady_clock::now() - std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_progress_.load(std::memory_order_relaxed)));
    }
    /// Whether a request of it is in the service: its peer is waiting for us, not idle.
    [[nodiscard]] bool busy() const noexcept { return in_service_.load(std::memory_order_relaxed) != 0; }
    [[nodiscard]] bool evicted() const noexcept { return evicted_.load(std::memory_order_relaxed); }
    /// Closes it (on its own thread) to make room for a new connection; false when already chosen.
    bool evict() {
        if (evicted_.exchange(true)) return false;
        asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
        return true;
    }

private:
    /// asio's transfer_all, noting the chunks moved as progress: a large frame that moves slowly is
    /// not idle, a peer that stops in the middle of one is. (asio does not ask it after the chunk that
    /// completes a buffer: the caller notes that one.)
    struct progress_noted {
        connection* self;
        std::size_t operator()(const boost::system::error_code& ec, std::size_t moved) const noexcept {
            if (moved != 0) self->touch();
            return ec ? 0 : 65536;
        }
    };

    /// A request's buffers: the request lives until its reply is complete, the reply until it is written.
    struct exchange {
        frame_header request_header;
        frame_bytes request;  // payload only
        frame_bytes reply;    // header + payload
        std::size_t charged = 0;  // bytes of request and reply counted in held_
    };
    /// A frame to write; one that answers a request frees its slot once written.
    struct outgoing {
        frame_bytes frame;
        bool answers = false;
    };

    asio::awaitable<void> read_loop() {
        try {
            if (!co_await greet()) co_return;
            for (;;) {
                std::array<std::byte, header_bytes> raw;
                co_await asio::async_read(socket_, asio::buffer(raw), progress(), asio::use_awaitable);
                touch();
                parsed_header parsed = parse_header(raw, options_.max_payload);
                if (parsed.verdict == header_verdict::close) {
                    // Say why, then hang up: the stream is no longer framed.
                    closing_ = true;  // the write queue closes the socket once this reply is out
                    queue(error_frame(parsed.header, parsed.error, "dl::ps: " + parsed.reason + "; closing the connection"), false);
                    co_return;
                }
                // A slot and room first, then the payload. Until its peer takes replies, a connection
                // reads nothing more (backpressure): what it holds stays bounded whatever it sends.
                for (;;) {
                    const bool own = in_flight_ >= options_.max_in_flight || (in_flight_ > 0 && held_ >= options_.max_connection_bytes);
                    const bool others = !own && totals_->held_bytes.load(std::memory_order_relaxed) >= options_.max_total_bytes;
                    if ((!own && !others) || !socket_.is_open()) break;
                    // Its own replies wake it when written; the others' finish on other threads: it looks again soon.
                    waiting_for_others_ = others;
                    boost::system::error_code ignored;
                    if (others) slot_free_.expires_after(std::chrono::milliseconds(5));
                    else slot_free_.expires_at(asio::steady_timer::time_point::max());
                    co_await slot_free_.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
                }
                waiting_for_others_ = false;
                auto ex = std::make_shared<exchange>();
                ex->request_header = parsed.header;
                ex->request.resize(parsed.header.payload_bytes);
                charge(*ex, ex->request.size());
                co_await asio::async_read(socket_, asio::buffer(ex->request), progress(), asio::use_awaitable);
                touch();
                ++in_flight_;
                in_service_.fetch_add(1, std::memory_order_relaxed);
                if (parsed.verdict == header_verdict::reject)
                    finish(ex, {parsed.error, "dl::ps: " + parsed.reason});
                else
                    dispatch(ex);
            }
        } catch (const boost::system::system_error&) {
            close();  // peer gone or reset: its in-flight replies are dropped when they finish
        }
    }

    /// The first frames of a connection: the server's hello, with a fresh nonce when it has a secret;
    /// then the client's answer, checked before anything else is read, and ours. Whether to go on.
    asio::awaitable<bool> greet() {
        const bool check = !options_.secret.empty();
        const hello_nonce nonce = check ? random_nonce() : hello_nonce{};
        frame_header h;
        h.op = static_cast<std::uint16_t>(op::hello);
        h.payload_bytes = check ? static_cast<std::uint32_t>(nonce.size()) : 0;
        frame_bytes hello(header_bytes);
        std::memcpy(hello.data(), &h, header_bytes);
        if (check) hello.insert(hello.end(), nonce.begin(), nonce.end());
        co_await asio::async_write(socket_, asio::buffer(hello), asio::use_awaitable);
        touch();
        if (!check) co_return true;
        std::array<std::byte, header_bytes> raw;
        co_await asio::async_read(socket_, asio::buffer(raw), progress(), asio::use_awaitable);
        touch();
        // Nothing larger than an answer is read from a peer not yet known.
        const parsed_header p = parse_header(raw, hello_mac_bytes);
        bool ok = p.verdict == header_verdict::ok && p.header.op == static_cast<std::uint16_t>(op::hello) && p.header.payload_bytes == hello_mac_bytes;
        if (ok) {
            hello_mac answer{};
            co_await asio::async_read(socket_, asio::buffer(answer), progress(), asio::use_awaitable);
            touch();
            ok = hello_answer_matches(options_.secret, nonce, answer);
        }
        if (!ok) {
            closing_ = true;  // the write queue closes the socket once this reply is out
            queue(error_frame(p.header, status::unauthorized,
                              "dl::ps: authentication failed: a client must first answer the server's hello with HMAC-SHA256 of its nonce under "
                              "the shared secret (client_options::secret); closing the connection"),
                  false);
            co_return false;
        }
        frame_header welcome = p.header;
        welcome.payload_bytes = 0;
        std::memcpy(hello.data(), &welcome, header_bytes);
        hello.resize(header_bytes);
        co_await asio::async_write(socket_, asio::buffer(hello), asio::use_awaitable);
        co_return true;
    }

    void dispatch(const std::shared_ptr<exchange>& ex) {
        const frame_header& h = ex->request_header;
        auto self = shared_from_this();
        auto done = [self, ex](outcome o) {
            asio::post(self->socket_.get_executor(), [self, ex, o = std::move(o)]() mutable { self->finish(ex, std::move(o)); });
        };
        try {
            switch (static_cast<op>(h.op)) {
            case op::pull: {
                const auto ids = decode_pull(ex->request);
                std::uint32_t dim = 0;
                try {
                    dim = service_.config(h.table).dim;
                } catch (const dl::error& e) {
                    return finish(ex, {status::unknown_table, e.what()});
                }
                // reply: header, dim, n, rows. The rows' size is bounded by max_payload like a request's.
                const std::uint64_t floats = std::uint64_t{ids.size()} * dim;
                if (8 + floats * 4 > options_.max_payload)
                    return finish(ex, {status::too_large, dl::detail::concat("dl::ps: the reply to a pull of ", ids.size(), " ids of dim ", dim,
                                                                           " would exceed the frame limit of ", options_.max_payload, " bytes")});
                ex->reply.resize(header_bytes + 8 + floats * 4);
                charge(*ex, ex->reply.size());
                const auto n = static_cast<std::uint32_t>(ids.size());
                std::memcpy(ex->reply.data() + header_bytes, &dim, 4);
                std::memcpy(ex->reply.data() + header_bytes + 4, &n, 4);
                auto* rows = reinterpret_cast<float*>(ex->reply.data() + header_bytes + 8);
                return service_.pull(h.table, ids, {rows, floats}, done);
            }
            case op::push: return service_.push(h.table, decode_push(ex->request), done);
            case op::create_table: {
                byte_reader r(ex->request);
                return service_.create_table(decode_table_config(r, h.table, h.version), done);
            }
            case op::grow_dim: {
                byte_reader r(ex->request);
                const auto dim = r.get<std::uint32_t>();
                r.expect_end();
                return service_.grow_dim(h.table, dim, done);
            }
            case op::stats: {
                if (!ex->request.empty()) throw decode_error{status::malformed, "stats takes no payload"};
                return service_.stats(h.table, [self, ex](outcome o, table_stats s) {
                    if (o.ok()) {
                        ex->reply.resize(header_bytes + sizeof s);
                        std::memcpy(ex->reply.data() + header_bytes, &s, sizeof s);
                    }
                    asio::post(self->socket_.get_executor(), [self, ex, o = std::move(o)]() mutable { self->finish(ex, std::move(o)); });
                });
            }
            case op::checkpoint: {
                byte_reader r(ex->request);
                const auto kind = r.get<std::uint32_t>();
                r.expect_end();
                if (kind > 1) throw decode_error{status::malformed, "checkpoint kind must be 0 (full) or 1 (incremental)"};
                return service_.checkpoint(kind == 0, [self, ex](outcome o, std::uint64_t seq) {
                    if (o.ok()) {
                        ex->reply.resize(header_bytes + 8);
                        std::memcpy(ex->reply.data() + header_bytes, &seq, 8);
                    }
                    asio::post(self->socket_.get_executor(), [self, ex, o = std::move(o)]() mutable { self->finish(ex, std::move(o)); });
                });
            }
            case op::hello: throw decode_error{status::malformed, "hello after the handshake"};
            case op::export_table: {
                // A plain file name: the file goes to <data dir>/exports, nowhere else.
                const std::string name(reinterpret_cast<const char*>(ex->request.data()), ex->request.size());
                if (name.empty() || name.size() > 255 || name.find_first_of("/\\") != std::string::npos || name == "." || name == ".." ||
                    name.find('\0') != std::string::npos)
                    throw decode_error{status::malformed, "export needs a plain file name"};
                if (service_.data_dir().empty()) return finish(ex, {status::failed, "dl::ps: this server has no data dir to export into"});
                const fs::path dir = service_.data_dir() / "exports";
                std::error_code ec;
                fs::create_directories(dir, ec);
                return service_.export_table(h.table, dir / name, done);
            }
            }
            finish(ex, {status::unknown_op, "dl::ps: unknown op"});
        } catch (const decode_error& e) {
            finish(ex, {e.code, "dl::ps: " + e.reason});
        } catch (const std::exception& e) {  // bad_alloc of a reply, ...: the request fails, the connection lives
            finish(ex, {status::failed, dl::detail::concat("dl::ps: ", e.what())});
        }
    }

    /// On this connection's thread: completes the reply frame and queues it. Its slot stays taken
    /// until the reply is written: a peer that does not read gets no more requests served.
    void finish(const std::shared_ptr<exchange>& ex, outcome o) {
        in_service_.fetch_sub(1, std::memory_order_relaxed);
        release(ex->charged);
        ex->charged = 0;
        ex->request = {};
        if (!o.ok()) {
            queue(error_frame(ex->request_header, o.code, o.message), true);
            return;
        }
        if (ex->reply.empty()) ex->reply.resize(header_bytes);
        frame_header h = ex->request_header;
        h.status = static_cast<std::uint32_t>(status::ok);  // a request's status field is not echoed: 0 is what says success
        h.payload_bytes = static_cast<std::uint32_t>(ex->reply.size() - header_bytes);
        std::memcpy(ex->reply.data(), &h, header_bytes);
        queue(std::move(ex->reply), true);
    }

    [[nodiscard]] static frame_bytes error_frame(frame_header h, status code, std::string_view message) {
        message = message.substr(0, 4096);
        h.magic = frame_magic;
        if (h.version < oldest_protocol_version || h.version > protocol_version) h.version = protocol_version;
        h.reserved = 0;
        h.status = static_cast<std::uint32_t>(code);
        h.payload_bytes = static_cast<std::uint32_t>(message.size());
        frame_bytes frame(header_bytes + message.size());
        std::memcpy(frame.data(), &h, header_bytes);
        std::memcpy(frame.data() + header_bytes, message.data(), message.size());
        return frame;
    }

    void queue(frame_bytes frame, bool answers) {
        if (!socket_.is_open()) return written(frame.size(), answers, false);
        held_ += frame.size();
        totals_->held_bytes.fetch_add(frame.size(), std::memory_order_relaxed);
        writes_.push_back({std::move(frame), answers});
        if (writes_.size() == 1) write_next();
    }
    void write_next() {
        asio::async_write(socket_, asio::buffer(writes_.front().frame), progress(), [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
            if (ec) {
                for (const outgoing& w : self->writes_) self->written(w.frame.size(), w.answers, true);
                self->writes_.clear();  // nothing is being written any more
                return self->close();
            }
            self->touch();
            const outgoing& done = self->writes_.front();
            self->written(done.frame.size(), done.answers, true);
            self->writes_.pop_front();
            if (!self->writes_.empty()) self->write_next();
            else if (self->closing_) self->close();
        });
    }
    /// A frame is out (or dropped): its bytes and its request's slot are free.
    void written(std::size_t bytes, bool answers, bool was_held) {
        if (was_held) release(bytes);
        if (answers) --in_flight_;
        slot_free_.cancel();
    }
    void charge(exchange& ex, std::size_t bytes) {
        ex.charged += bytes;
        held_ += bytes;
        totals_->held_bytes.fetch_add(bytes, std::memory_order_relaxed);
    }
    void release(std::size_t bytes) {
        held_ -= bytes;
        totals_->held_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    }
    void close() {
        boost::system::error_code ignored;
        socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        socket_.close(ignored);  // a write in progress ends with an error and clears the queue
        slot_free_.cancel();
        idle_check_.cancel();
    }

    void touch() noexcept { last_progress_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
    [[nodiscard]] progress_noted progress() noexcept { return {this}; }
    /// Closes the connection once it has been idle for options_.idle_timeout.
    void watch_idle(std::chrono::steady_clock::duration wait) {
        idle_check_.expires_after(wait);
        idle_check_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
            if (ec || !self->socket_.is_open()) return;
            const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(self->options_.idle_timeout);
            const auto idle = self->idle_for();
            // Held up by other connections' replies, with none of its own unwritten: it waits for us.
            const bool waiting = self->busy() || (self->waiting_for_others_ && self->writes_.empty());
            if (waiting || idle < timeout) return self->watch_idle(waiting ? timeout : timeout - idle);
            self->close();
        });
    }

    asio::ip::tcp::socket socket_;
    service& service_;
    server_options options_;
    asio::steady_timer slot_free_;  // wakes the read loop when a request slot frees up
    asio::steady_timer idle_check_;
    std::shared_ptr<connection_totals> totals_;
    unsigned in_flight_ = 0;  // requests read whose replies are not written yet
    std::size_t held_ = 0;    // bytes of requests and replies this connection holds
    bool waiting_for_others_ = false;  // its read loop waits for room other connections hold
    std::atomic<unsigned> in_service_{0};  // requests handed to the service and not finished
    std::atomic<std::chrono::steady_clock::rep> last_progress_{0};  // when a byte last moved, steady_clock ticks
    std::atomic<bool> evicted_{false};
    bool closing_ = false;
    std::deque<outgoing> writes_;
};

}  // namespace detail

/// Accepts connections for a service on the shard threads (round robin). Destroy it before the
/// service; connections already open live on until their peers close or the service stops.
class server {
public:
    server(service& svc, server_options options = {}) : state_(std::make_shared<accept_state>(svc, std::move(options))) {
        if (state_->options.authenticate && state_->options.secret.empty())
            dl::detail::fail("dl::ps::server: no secret to authenticate clients with: set server_options::secret (clients then need the same "
                             "client_options::secret), or authenticate = false to serve anyone who can reach ",
                             state_->options.address, ":", state_->options.port);
        auto& acceptor = state_->acceptor;
        const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(state_->options.address), state_->options.port);
        acceptor.open(endpoint.protocol());
        acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true));
        acceptor.bind(endpoint);
        acceptor.listen();
        port_ = acceptor.local_endpoint().port();
        accept_next(state_);
    }
    ~server() { stop(); }
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
    /// Bytes of requests and replies its connections hold now (bounded by max_total_bytes, about).
    [[nodiscard]] std::size_t queued_bytes() const noexcept { return state_->totals->held_bytes.load(std::memory_order_relaxed); }

    /// Stops accepting (on the acceptor's thread; waits for it).
    void stop() {
        std::promise<void> stopped;
        asio::post(state_->acceptor.get_executor(), [&, state = state_] {
            state->stopped = true;
            boost::system::error_code ignored;
            state->acceptor.close(ignored);
            stopped.set_value();
        });
        stopped.get_future().wait();
    }

private:
    /// What the accept handlers use: shared with them, so one completing after the server is gone
    /// finds it still there (and stopped).
    struct accept_state {
        accept_state(service& s, server_options o) : svc(s), options(std::move(o)), acceptor(s.context(0)) {}
        service& svc;
        server_options options;
        asio::ip::tcp::acceptor acceptor;
        unsigned next = 0;
        bool stopped = false;  // touched on the acceptor's thread only
        std::shared_ptr<detail::connection_totals> totals = std::make_shared<detail::connection_totals>();
        std::vector<std::weak_ptr<detail::connection>> connections;  // acceptor's thread only; some may be gone
    };

    /// At the connection limit: evicts the connection idle longest, if one has been idle long enough
    /// that a client that connected and speaks is not cut off. Evicting beats refusing: otherwise
    /// peers that connect and say nothing hold every place for as long as they like.
    static bool make_room(accept_state& state) {
        std::erase_if(state.connections, [](const auto& c) { return c.expired(); });
        using namespace std::chrono_literals;
        const auto timeout = state.options.idle_timeout;
        std::chrono::steady_clock::duration longest = timeout.count() > 0 ? std::min<std::chrono::steady_clock::duration>(1s, timeout / 2) : 1s;
        std::shared_ptr<detail::connection> victim;
        for (const auto& weak : state.connections) {
            auto c = weak.lock();
            if (!c || c->busy() || c->evicted()) continue;
            if (const auto idle = c->idle_for(); idle >= longest) {
                longest = idle;
                victim = std::move(c);
            }
        }
        return victim && victim->evict();
    }

    static void accept_next(std::shared_ptr<accept_state> state) {
        asio::io_context& target = state->svc.context(state->next++ % state->svc.shard_count());
        auto& acceptor = state->acceptor;
        acceptor.async_accept(target, [state = std::move(state)](boost::system::error_code ec, asio::ip::tcp::socket socket) mutable {
            if (state->stopped || ec == asio::error::operation_aborted) return;
            // A connection being evicted still counts until it is gone: the limit may be passed by
            // the evictions under way.
            if (!ec && (state->totals->open.load() < state->options.max_connections || make_room(*state))) {
                ++state->totals->open;
                boost::system::error_code ignored;
                socket.set_option(asio::ip::tcp::no_delay(true), ignored);
                auto c = std::make_shared<detail::connection>(std::move(socket), state->svc, state->options, state->totals);
                if (state->connections.size() >= state->options.max_connections)
                    std::erase_if(state->connections, [](const auto& w) { return w.expired(); });
                state->connections.push_back(c);
                c->start();
            }  // else the socket closes here
            accept_next(std::move(state));
        });
    }

    std::shared_ptr<accept_state> state_;
    std::uint16_t port_ = 0;
};

}  // namespace dl::ps
