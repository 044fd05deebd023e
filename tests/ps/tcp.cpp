// The TCP transport: the same results as in-process, ids partitioned over two servers, and hostile
// or broken peers — malformed, truncated, oversized and random frames get an error reply or a closed
// connection, never a crash or a touched table; a down or silent server fails a call by its deadline.
#include "support.hpp"

#include "ps_test.hpp"

#include <fstream>
#include <iomanip>
#include <numeric>
#include <random>
#include <thread>

namespace {

using namespace dl::ps;
using dl_test::error_of;
using boost::asio::ip::tcp;

table_config config(std::uint32_t id, std::uint32_t dim) {
    table_config c;
    c.id = id;
    c.dim = dim;
    c.init = {initializer_kind::uniform, 0.1f};
    c.optimizer.kind = optimizer_kind::adagrad;
    return c;
}

std::string address(const server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

/// The servers of these tests serve anyone on loopback; the handshake has a test of its own.
const server_options no_auth{.authenticate = false};


/// A raw connection for sending hand-made bytes and reading the reply frames.
struct raw_connection {
    boost::asio::io_context io;
    tcp::socket socket{io};
    explicit raw_connection(std::uint16_t port) {
        socket.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
        // Reads give up after 10 s instead of hanging the test when a reply never comes.
        struct timeval tv{10, 0};
        setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        // The server's hello comes first: a nonce when it has a secret, else nothing.
        frame_header h;
        boost::system::error_code ec;
        boost::asio::read(socket, boost::asio::buffer(&h, sizeof h), ec);
        if (!ec && h.op == static_cast<std::uint16_t>(op::hello) && h.payload_bytes == nonce.size()) boost::asio::read(socket, boost::asio::buffer(nonce), ec);
    }
    hello_nonce nonce{};
    void send(std::span<const std::byte> bytes) { boost::asio::write(socket, boost::asio::buffer(bytes.data(), bytes.size())); }
    /// The next reply frame, or nullopt when the server closed the connection.
    std::optional<std::pair<frame_header, std::string>> reply() {
        frame_header h;
        boost::system::error_code ec;
        boost::asio::read(socket, boost::asio::buffer(&h, sizeof h), ec);
        if (ec) return std::nullopt;
        std::string payload(h.payload_bytes, '\0');
        boost::asio::read(socket, boost::asio::buffer(payload), ec);
        if (ec) return std::nullopt;
        return std::pair{h, payload};
    }
};

frame_bytes frame(op code, std::uint32_t table_id, std::uint64_t request, std::span<const std::byte> payload) {
    frame_header h;
    h.op = static_cast<std::uint16_t>(code);
    h.table = table_id;
    h.request_id = request;
    h.payload_bytes = static_cast<std::uint32_t>(payload.size());
    frame_bytes f(header_bytes);
    std::memcpy(f.data(), &h, header_bytes);
    f.insert(f.end(), payload.begin(), payload.end());
    return f;
}

frame_bytes pull_frame(std::uint32_t table_id, std::uint64_t request, std::span<const std::uint64_t> ids) {
    return frame(op::pull, table_id, request, std::as_bytes(ids));
}

}  // namespace

TEST_CASE("tcp: two servers hold disjoint parts of a table; results equal the in-process service") {
    service a({.threads = 2}), b({.threads = 1}), local({.threads = 2});
    server sa(a, no_auth), sb(b, no_auth);
    client remote(client_options{{address(sa), address(sb)}});
    client embedded(local);
    const table_config cfg = config(2, 16);
    remote.create_table(cfg).get();
    embedded.create_table(cfg).get();

    std::mt19937_64 rng(4);
    for (int step = 0; step < 10; ++step) {
        std::vector<std::uint64_t> ids(1000);
        for (auto& id : ids) id = rng() % 3000;
        std::vector<float> grads(ids.size() * 16);
        for (auto& g : grads) g = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
        std::vector<std::uint32_t> shows(ids.size(), 1), clicks(ids.size(), 0);
        auto f1 = remote.push(2, ids, grads, shows, clicks);
        auto f2 = embedded.push(2, ids, grads, shows, clicks);
        f1.get();
        f2.get();
    }
    std::vector<std::uint64_t> ids(5000);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 7) % 4000;
    std::vector<float> x(ids.size() * 16), y(ids.size() * 16);
    auto fx = remote.pull(2, ids, x);  // both in flight at once
    auto fy = embedded.pull(2, ids, y);
    fx.get();
    fy.get();
    CHECK(x == y);
    const table_stats all = remote.stats(2).get(), here = embedded.stats(2).get();
    CHECK(all.rows == here.rows);
    client only_a(client_options{{address(sa)}}), only_b(client_options{{address(sb)}});
    const auto rows_a = only_a.stats(2).get().rows, rows_b = only_b.stats(2).get().rows;
    CHECK(rows_a + rows_b == all.rows);
    CHECK(rows_a > all.rows / 4);
    CHECK(rows_b > all.rows / 4);
    // Server-side errors come back with the server named.
    CHECK(error_of(remote.pull(77, ids, x)).find("unknown table 77") != std::string::npos);
    std::vector<float> nan(16, std::numeric_limits<float>::quiet_NaN());
    CHECK(error_of(remote.push(2, std::vector<std::uint64_t>{5}, nan)).find("nothing was applied") != std::string::npos);
}

TEST_CASE("tcp: malformed frames get an error reply or a closed connection, and the table is untouched") {
    service svc({.threads = 2});
    server srv(svc, no_auth);
    client c(client_options{{address(srv)}});
    c.create_table(config(1, 4)).get();
    const std::vector<std::uint64_t> ids{1, 2, 3};
    c.push(1, ids, std::vector<float>(12, 1.0f)).get();
    std::vector<float> before(12), after(12);
    c.pull(1, ids, before).get();

    SUBCASE("an unknown op is answered and the connection keeps working") {
        raw_connection raw(srv.port());
        frame_bytes f = frame(op::pull, 1, 41, std::as_bytes(std::span(ids)));
        std::uint16_t unknown = 99;
        std::memcpy(f.data() + 6, &unknown, 2);
        raw.send(f);
        auto r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.request_id == 41);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::unknown_op));
        raw.send(pull_frame(1, 42, ids));
        r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.request_id == 42);
        CHECK(r->first.status == 0);
        CHECK(r->second.size() == 8 + 12 * 4);
    }
    SUBCASE("a bad magic, a bad version or an oversized length: an error reply, then the connection closes") {
        for (int kind = 0; kind < 3; ++kind) {
            raw_connection raw(srv.port());
            frame_bytes f = pull_frame(1, 7, ids);
            if (kind == 0) f[0] = std::byte{'X'};
            if (kind == 1) f[4] = std::byte{9};
            if (kind == 2) {
                const std::uint32_t huge = 0xFFFFFFF0u;
                std::memcpy(f.data() + 24, &huge, 4);
            }
            raw.send(f);
            auto r = raw.reply();
            REQUIRE(r);
            CHECK(r->first.status != 0);
            CHECK(r->second.find("closing the connection") != std::string::npos);
            CHECK_FALSE(raw.reply());  // closed
        }
    }
    SUBCASE("payloads that do not match their op are answered with the reason") {
        raw_connection raw(srv.port());
        raw.send(frame(op::pull, 1, 1, frame_bytes(13)));  // not whole ids
        auto r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::malformed));
        frame_bytes push;
        byte_writer(push).put(push_header{3, 4, 0, 0});
        byte_writer(push).put_span(std::span<const std::uint64_t>(ids));
        std::vector<float> g(12, 1.0f);
        g[11] = std::numeric_limits<float>::infinity();
        byte_writer(push).put_span(std::span<const float>(g));
        raw.send(frame(op::push, 1, 2, push));
        r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::non_finite));
        frame_bytes cut(push.begin(), push.end() - 4);
        raw.send(frame(op::push, 1, 3, cut));
        r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::malformed));
        raw.send(frame(op::pull, 555, 4, std::as_bytes(std::span(ids))));
        r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::unknown_table));
    }
    SUBCASE("a frame cut short by a closed connection, and random bytes, leave the server serving") {
        {
            raw_connection raw(srv.port());
            const frame_bytes f = pull_frame(1, 9, ids);
            raw.send(std::span(f).first(header_bytes + 5));
        }
        std::mt19937_64 rng(99);
        const int connections = dl_test::quick() ? 20 : 100;
        for (int i = 0; i < connections; ++i) {
            raw_connection raw(srv.port());
            frame_bytes junk(1 + rng() % 600);
            for (auto& b : junk) b = std::byte(rng());
            if (i % 2 == 0) {  // a valid start, so the payload checks are reached
                frame_header h;
                h.op = static_cast<std::uint16_t>(1 + rng() % 7);
                h.table = rng() % 3;
                h.payload_bytes = static_cast<std::uint32_t>(rng() % 700);
                std::memcpy(junk.data(), &h, std::min(junk.size(), header_bytes));
            }
            raw.send(junk);
        }
    }
    c.pull(1, ids, after).get();
    CHECK(after == before);
    CHECK(c.stats(1).get().step == 1);
}

TEST_CASE("tcp: a refused, silent or vanished server fails the call by its deadline") {
    using namespace std::chrono_literals;
    const std::vector<std::uint64_t> ids{1, 2};
    std::vector<float> out(8);
    {
        // Nothing listens on the port any more.
        boost::asio::io_context io;
        tcp::acceptor probe(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
        const auto port = probe.local_endpoint().port();
        probe.close();
        client c(client_options{{"127.0.0.1:" + std::to_string(port)}, 2000ms});
        const auto start = std::chrono::steady_clock::now();
        CHECK(error_of(c.pull(1, ids, out)).find("cannot connect") != std::string::npos);
        CHECK(std::chrono::steady_clock::now() - start < 2000ms);
    }
    {
        // Accepts, never answers.
        boost::asio::io_context io;
        tcp::acceptor silent(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
        client c(client_options{{"127.0.0.1:" + std::to_string(silent.local_endpoint().port())}, 300ms});
        const auto start = std::chrono::steady_clock::now();
        const std::string message = error_of(c.pull(1, ids, out));
        CHECK(message.find("did not answer within 300 ms") != std::string::npos);
        CHECK(message.find("pull of 2 ids") != std::string::npos);
        CHECK(std::chrono::steady_clock::now() - start < 5s);
    }
    {
        // The server goes away between calls: the next call fails, and one after a restart works.
        auto svc = std::make_unique<service>(service_options{.threads = 1});
        auto srv = std::make_unique<server>(*svc, no_auth);
        const std::uint16_t port = srv->port();
        client c(client_options{{"127.0.0.1:" + std::to_string(port)}, 2000ms});
        c.create_table(config(1, 4)).get();
        c.pull(1, ids, out).get();
        srv.reset();
        svc.reset();
        CHECK(!error_of(c.pull(1, ids, out)).empty());
        svc = std::make_unique<service>(service_options{.threads = 1});
        server again(*svc, server_options{.port = port, .authenticate = false});
        c.create_table(config(1, 4)).get();
        c.pull(1, ids, out).get();
    }
}

TEST_CASE("tcp: connections beyond max_connections are closed at once; a freed place is reused") {
    service svc({.threads = 1});
    server srv(svc, server_options{.max_connections = 1, .authenticate = false});
    const std::vector<std::uint64_t> ids{1};
    {
        raw_connection first(srv.port());
        first.send(pull_frame(9, 1, ids));  // answered: unknown table, but answered
        REQUIRE(first.reply());
        raw_connection second(srv.port());
        CHECK_FALSE(second.reply());  // closed without a word
    }
    // Once the server has noticed that the first one left (at once, or a moment later on a busy
    // machine), a new connection is served.
    std::optional<std::pair<frame_header, std::string>> r;
    for (int attempt = 0; attempt < 100 && !r; ++attempt) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        raw_connection third(srv.port());
        boost::system::error_code ignored;
        const frame_bytes f = pull_frame(9, 2, ids);
        boost::asio::write(third.socket, boost::asio::buffer(f.data(), f.size()), ignored);
        r = third.reply();
    }
    REQUIRE(r);
    CHECK(r->first.request_id == 2);
}

TEST_CASE("tcp: a success reply carries status ok, whatever the request's status field held") {
    service svc({.threads = 1});
    server srv(svc, no_auth);
    client c(client_options{{address(srv)}});
    c.create_table(config(1, 4)).get();
    raw_connection raw(srv.port());
    const std::vector<std::uint64_t> ids{1, 2};
    for (op code : {op::stats, op::pull}) {
        frame_bytes f = code == op::stats ? frame(op::stats, 1, 5, {}) : pull_frame(1, 5, ids);
        const std::uint32_t junk_status = 5;
        std::memcpy(f.data() + 20, &junk_status, 4);
        raw.send(f);
        const auto r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.request_id == 5);
        CHECK(r->first.status == 0);
    }
}

TEST_CASE("tcp: connections that send nothing do not lock out a client that speaks") {
    using namespace std::chrono_literals;
    service svc({.threads = 2});
    server srv(svc, server_options{.max_connections = 8, .authenticate = false});
    std::vector<std::unique_ptr<raw_connection>> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<raw_connection>(srv.port()));
    // All accepted, the limit full, and each idle longer than the second a new client is given to speak.
    std::this_thread::sleep_for(1200ms);
    // Each new client takes the place of the connection idle longest.
    for (int i = 0; i < 3; ++i) {
        client c(client_options{{address(srv)}, 3000ms});
        CHECK(error_of(c.create_table(config(1, 4))) == "");
    }
}

TEST_CASE("tcp: a connection that sends nothing, or stops inside a frame, is closed after idle_timeout") {
    using namespace std::chrono_literals;
    service svc({.threads = 1});
    server srv(svc, server_options{.idle_timeout = 300ms, .authenticate = false});
    const auto start = std::chrono::steady_clock::now();
    raw_connection silent(srv.port()), halfway(srv.port()), talking(srv.port());
    const std::vector<std::uint64_t> ids{1};
    const frame_bytes f = pull_frame(9, 1, ids);
    halfway.send(std::span(f).first(10));
    // One that speaks more often than that stays.
    for (std::uint64_t i = 0; i < 8; ++i) {
        talking.send(pull_frame(9, i, ids));
        REQUIRE(talking.reply());
        std::this_thread::sleep_for(100ms);
    }
    CHECK_FALSE(silent.reply());
    CHECK_FALSE(halfway.reply());
    // Closed by the server, not given up on by the 10 s read timeout of raw_connection.
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    talking.send(pull_frame(9, 99, ids));
    const auto r = talking.reply();
    REQUIRE(r);
    CHECK(r->first.request_id == 99);
}

namespace {

/// This process's resident memory in bytes.
std::size_t resident_bytes() {
    std::ifstream statm("/proc/self/statm");
    std::size_t pages = 0, resident = 0;
    statm >> pages >> resident;
    return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("tcp: a client that never reads its replies holds bounded server memory; others are served") {
    using namespace std::chrono_literals;
    std::vector<std::uint64_t> ids(64);
    std::iota(ids.begin(), ids.end(), std::uint64_t{1});
    const std::size_t reply = header_bytes + 8 + ids.size() * 4096 * 4, request = header_bytes + ids.size() * 8;
    std::vector<float> out(ids.size() * 4096);
    {
        service svc({.threads = 2});
        server srv(svc, no_auth);
        client good(client_options{{address(srv)}});
        good.create_table(config(1, 4096)).get();  // a pull of 64 ids is answered with 1 MiB
        const std::size_t before = resident_bytes();
        raw_connection greedy(srv.port());
        for (std::uint64_t i = 0; i < 96; ++i) greedy.send(pull_frame(1, i, ids));  // 96 MiB of replies if all were kept
        std::this_thread::sleep_for(1500ms);
        CHECK(error_of(good.pull(1, ids, out)) == "");
        const std::size_t grown = resident_bytes() - std::min(before, resident_bytes());
        INFO("resident memory grew by " << grown / (1 << 20) << " MiB");
        CHECK(grown < (std::size_t{40} << 20));
        // The default bound: 16 MiB, passed by at most one request and its reply.
        CHECK(srv.queued_bytes() <= (std::size_t{16} << 20) + request + reply);
    }
    // Several such clients against small bounds: all of them together stay under the server's
    // bound, a client that speaks is served once the idle timeout has closed them, and then
    // nothing is held any more.
    service svc({.threads = 2});
    const std::size_t per_connection = std::size_t{2} << 20, total = std::size_t{3} << 20;
    server srv(svc, server_options{.max_connection_bytes = per_connection, .max_total_bytes = total, .idle_timeout = 1000ms, .authenticate = false});
    client good(client_options{{address(srv)}, 8000ms});
    good.create_table(config(1, 4096)).get();
    std::vector<std::unique_ptr<raw_connection>> greedy;
    for (int c = 0; c < 3; ++c) {
        greedy.push_back(std::make_unique<raw_connection>(srv.port()));
        for (std::uint64_t i = 0; i < 48; ++i) greedy.back()->send(pull_frame(1, i, ids));
    }
    std::size_t most = 0;
    for (int i = 0; i < 40; ++i) {
        most = std::max(most, srv.queued_bytes());
        std::this_thread::sleep_for(10ms);
    }
    INFO("most bytes queued: " << most);
    CHECK(most > 0);
    CHECK(most <= total + 3 * (request + reply));
    const auto start = std::chrono::steady_clock::now();
    CHECK(error_of(good.pull(1, ids, out)) == "");
    CHECK(std::chrono::steady_clock::now() - start < 6s);
    for (int i = 0; i < 200 && srv.queued_bytes() != 0; ++i) std::this_thread::sleep_for(10ms);
    CHECK(srv.queued_bytes() == 0);
}

TEST_CASE("tcp: a push whose reply is lost is retried by the client and applied once") {
    using namespace std::chrono_literals;
    service svc({.threads = 2});
    server srv(svc, no_auth);
    client direct(client_options{{address(srv)}});
    table_config c = config(1, 4);
    c.init = {initializer_kind::zeros, 0.0f};
    c.optimizer.kind = optimizer_kind::sgd;
    c.optimizer.lr = 1.0f;
    direct.create_table(c).get();
    dl_test::reply_cutting_proxy proxy([&] { return srv.port(); });
    client retrying(client_options{{"127.0.0.1:" + std::to_string(proxy.port())}, 3000ms});
    const std::vector<std::uint64_t> ids{42, 43, 44};
    CHECK(error_of(retrying.push(1, ids, std::vector<float>(12, 1.0f))) == "");
    CHECK(proxy.cuts() == 1);
    std::vector<float> rows(12);
    direct.pull(1, ids, rows).get();
    CHECK(rows == std::vector<float>(12, -1.0f));  // applied once: -2 if the retry had been applied too
}

TEST_CASE("tcp: with a secret, only a client that answers the server's nonce with its HMAC is served") {
    using namespace std::chrono_literals;
    // OpenSSL's HMAC-SHA256 against RFC 4231, test cases 1 and 2.
    auto hex = [](std::span<const std::byte> b) {
        std::string s;
        for (std::byte x : b) s += dl::detail::concat(std::hex, std::setw(2), std::setfill('0'), static_cast<int>(x));
        return s;
    };
    const std::string hi = "Hi There", jefe = "what do ya want for nothing?";
    CHECK(hex(hmac_sha256(std::string(20, '\x0b'), std::as_bytes(std::span(hi)))) == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    CHECK(hex(hmac_sha256("Jefe", std::as_bytes(std::span(jefe)))) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");

    // No secret and no explicit opt-out: the server does not start.
    service svc({.threads = 1});
    CHECK_THROWS_WITH_AS(server{svc}, doctest::Contains("no secret"), dl::error);
    server srv(svc, server_options{.secret = "correct horse"});
    auto with_secret = [&](std::string secret) {
        client_options o;
        o.servers = {address(srv)};
        o.timeout = 3000ms;
        o.secret = std::move(secret);
        return o;
    };
    client good(with_secret("correct horse"));
    good.create_table(config(1, 4)).get();
    std::vector<float> out(4);
    good.pull(1, std::vector<std::uint64_t>{1}, out).get();
    client wrong(with_secret("battery staple")), none(with_secret(""));
    CHECK(error_of(wrong.create_table(config(2, 4))).find("refused this client's secret (dl::ps: authentication failed") != std::string::npos);
    CHECK(error_of(none.create_table(config(2, 4))).find("asks for a secret") != std::string::npos);

    // A peer that skips the handshake, or answers wrongly, is closed before a request is read.
    {
        raw_connection raw(srv.port());
        CHECK(raw.nonce != hello_nonce{});
        frame_bytes payload;
        byte_writer w(payload);
        encode(w, config(3, 4));
        raw.send(frame(op::create_table, 3, 1, payload));
        const auto r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::unauthorized));
        CHECK_FALSE(raw.reply());
    }
    {
        raw_connection raw(srv.port());
        hello_mac guess = answer_hello("correct horse", raw.nonce);
        guess[31] ^= std::byte{1};
        raw.send(frame(op::hello, 0, 0, guess));
        const auto r = raw.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::unauthorized));
        CHECK_FALSE(raw.reply());
    }
    {
        // The right answer to another connection's nonce does not open this one.
        raw_connection first(srv.port()), second(srv.port());
        CHECK(first.nonce != second.nonce);
        second.send(frame(op::hello, 0, 0, answer_hello("correct horse", first.nonce)));
        const auto r = second.reply();
        REQUIRE(r);
        CHECK(r->first.status == static_cast<std::uint32_t>(status::unauthorized));
        first.send(frame(op::hello, 0, 0, answer_hello("correct horse", first.nonce)));
        const auto welcome = first.reply();
        REQUIRE(welcome);
        CHECK(welcome->first.status == 0);
        first.send(pull_frame(1, 7, std::vector<std::uint64_t>{1}));
        const auto pulled = first.reply();
        REQUIRE(pulled);
        CHECK(pulled->first.request_id == 7);
        CHECK(pulled->first.status == 0);
    }
    // Neither the raw peer's table 3 nor the refused clients' table 2 exists.
    CHECK(error_of(good.grow_dim(3, 8)).find("unknown table 3") != std::string::npos);
    CHECK(error_of(good.grow_dim(2, 8)).find("unknown table 2") != std::string::npos);
}
