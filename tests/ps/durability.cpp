// Durability: a service restarted from its data dir holds everything acknowledged — through full and
// incremental checkpoints, the write-ahead log, a torn log tail, and a server process killed with
// SIGKILL while pushes are in flight (the lost-update count must be 0). Damaged files are named.
#include "support.hpp"

#include "ps_test.hpp"

#include <atomic>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

namespace {

using namespace dl::ps;
namespace fs = std::filesystem;

struct temp_dir {
    fs::path path;
    explicit temp_dir(const std::string& name)
        : path(fs::temp_directory_path() / ("dl_test_ps_" + name + "_" + std::to_string(::getpid()))) {
        fs::remove_all(path);
    }
    ~temp_dir() { fs::remove_all(path); }
};

table_config config(std::uint32_t id, std::uint32_t dim, optimizer_kind kind = optimizer_kind::adagrad) {
    table_config c;
    c.id = id;
    c.dim = dim;
    c.init = {initializer_kind::uniform, 0.1f};
    c.optimizer.kind = kind;
    return c;
}

service_options durable(const fs::path& dir, unsigned threads = 2, std::chrono::milliseconds group_commit = {}) {
    service_options o;
    o.threads = threads;
    o.data_dir = dir;
    o.group_commit = group_commit;
    return o;
}

std::vector<float> pull_all(client& c, std::uint32_t table_id, std::uint32_t dim, std::uint64_t ids) {
    std::vector<std::uint64_t> keys(ids);
    for (std::uint64_t i = 0; i < ids; ++i) keys[i] = i;
    std::vector<float> out(ids * dim);
    c.pull(table_id, keys, out).get();
    return out;
}

void push_random(client& c, std::uint32_t table_id, std::uint32_t dim, std::mt19937_64& rng, int steps) {
    for (int s = 0; s < steps; ++s) {
        std::vector<std::uint64_t> ids(200);
        for (auto& id : ids) id = rng() % 1000;
        std::vector<float> g(ids.size() * dim);
        for (auto& v : g) v = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
        std::vector<std::uint32_t> shows(ids.size(), 1), clicks(ids.size(), s % 2);
        c.push(table_id, ids, g, shows, clicks).get();
    }
}

}  // namespace

TEST_CASE("a service restarted from its data dir has every table, row, optimizer state and step") {
    temp_dir dir("restart");
    // A twin in memory gets the same requests; after the restart both take one more push, which
    // only matches if the optimizer state came back too.
    service memory({.threads = 2});
    client twin(memory);
    std::mt19937_64 rng(1), twin_rng(1);
    std::uint64_t step = 0;
    twin.create_table(config(1, 8)).get();
    twin.create_table(config(2, 3, optimizer_kind::adam)).get();
    table_config idle = config(3, 2, optimizer_kind::sgd);
    idle.ttl_steps = 2;  // rows evicted between checkpoints are recorded as removed
    twin.create_table(idle).get();
    std::vector<std::uint64_t> early(10), late(10);
    std::iota(early.begin(), early.end(), 1);
    std::iota(late.begin(), late.end(), 100);
    const std::vector<float> ones(20, 1.0f);
    {
        service svc(durable(dir.path));
        client c(svc);
        c.create_table(config(1, 8)).get();
        c.create_table(config(2, 3, optimizer_kind::adam)).get();
        c.create_table(idle).get();
        push_random(c, 1, 8, rng, 10);
        push_random(twin, 1, 8, twin_rng, 10);
        c.push(3, early, ones).get();
        twin.push(3, early, ones).get();
        c.checkpoint(true).get();  // checkpoint 1
        push_random(c, 1, 8, rng, 10);
        push_random(twin, 1, 8, twin_rng, 10);
        push_random(c, 2, 3, rng, 5);
        push_random(twin, 2, 3, twin_rng, 5);
        for (int i = 0; i < 8; ++i) {  // the early rows go idle and are evicted
            c.push(3, late, ones).get();
            twin.push(3, late, ones).get();
        }
        CHECK(c.stats(3).get().evicted == 10);
        c.checkpoint(false).get();  // checkpoint 2: the rows changed and removed since 1
        push_random(c, 1, 8, rng, 10);  // only in the log
        push_random(twin, 1, 8, twin_rng, 10);
        c.grow_dim(2, 5).get();
        twin.grow_dim(2, 5).get();
        step = c.stats(1).get().step;
        // Old log segments and checkpoints were removed as checkpoints covered them.
        CHECK_FALSE(fs::exists(dir.path / "shard-0" / "wal-0.log"));
        CHECK(fs::exists(dir.path / "shard-0" / "full-1.ckpt"));
        CHECK(fs::exists(dir.path / "shard-0" / "incr-2.ckpt"));
        CHECK(fs::exists(dir.path / "shard-1" / "wal-2.log"));
    }
    {
        service svc(durable(dir.path));
        client c(svc);
        CHECK(pull_all(c, 1, 8, 1000) == pull_all(twin, 1, 8, 1000));
        CHECK(pull_all(c, 2, 5, 1000) == pull_all(twin, 2, 5, 1000));
        CHECK(pull_all(c, 3, 2, 200) == pull_all(twin, 3, 2, 200));  // the evicted rows stayed evicted
        CHECK(c.stats(3).get().rows == 10);
        CHECK(c.stats(1).get().step == step);
        CHECK(c.stats(2).get().dim == 5);
        push_random(c, 1, 8, rng, 3);
        push_random(twin, 1, 8, twin_rng, 3);
        CHECK(pull_all(c, 1, 8, 1000) == pull_all(twin, 1, 8, 1000));
        c.checkpoint(true).get();  // checkpoint 3
        push_random(c, 2, 5, rng, 3);
        push_random(twin, 2, 5, twin_rng, 3);
    }
    // The restarted service went on logging: a second restart has everything again.
    service svc(durable(dir.path));
    client c(svc);
    CHECK(pull_all(c, 1, 8, 1000) == pull_all(twin, 1, 8, 1000));
    CHECK(pull_all(c, 2, 5, 1000) == pull_all(twin, 2, 5, 1000));
    CHECK_FALSE(fs::exists(dir.path / "shard-0" / "full-1.ckpt"));
}

TEST_CASE("the log replays across grow_dim and evictions after the last checkpoint; concurrent checkpoints lose nothing") {
    temp_dir dir("order");
    service memory({.threads = 2});
    client twin(memory);
    table_config grows = config(1, 4, optimizer_kind::adam);
    table_config idle = config(2, 2, optimizer_kind::sgd);
    idle.ttl_steps = 2;
    std::vector<std::uint64_t> early(10), late(10);
    std::iota(early.begin(), early.end(), 1);
    std::iota(late.begin(), late.end(), 100);
    const std::vector<float> ones(20, 1.0f);
    std::mt19937_64 rng(5), twin_rng(5);
    twin.create_table(grows).get();
    twin.create_table(idle).get();
    {
        service svc(durable(dir.path));
        client c(svc);
        c.create_table(grows).get();
        c.create_table(idle).get();
        // Checkpoints asked from four threads at once, pushes in between.
        std::vector<std::thread> askers;
        for (int i = 0; i < 4; ++i)
            askers.emplace_back([&svc] {
                client mine(svc);
                mine.checkpoint(false).get();
            });
        for (auto* k : {&c, &twin}) push_random(*k, 1, 4, k == &c ? rng : twin_rng, 10);
        for (auto& a : askers) a.join();
        for (auto* k : {&c, &twin}) {
            k->push(2, early, ones).get();
            for (int i = 0; i < 8; ++i) k->push(2, late, ones).get();  // evicts the early rows: only the log says so
            k->grow_dim(1, 8).get();
            push_random(*k, 1, 8, k == &c ? rng : twin_rng, 10);  // pushes of both dims are in the log
        }
    }
    service svc(durable(dir.path));
    client c(svc);
    CHECK(pull_all(c, 1, 8, 1000) == pull_all(twin, 1, 8, 1000));
    CHECK(pull_all(c, 2, 2, 200) == pull_all(twin, 2, 2, 200));
    CHECK(c.stats(2).get().rows == 10);
}

TEST_CASE("the log's torn tail is cut; damaged checkpoints and a wrong thread count are reported") {
    temp_dir dir("damage");
    std::mt19937_64 rng(2);
    std::vector<float> before;
    {
        service svc(durable(dir.path, 2, std::chrono::milliseconds(1)));
        client c(svc);
        c.create_table(config(1, 4)).get();
        push_random(c, 1, 4, rng, 5);
        before = pull_all(c, 1, 4, 1000);
    }
    // A crash in the middle of an append leaves part of a record behind.
    {
        std::ofstream tail(dir.path / "shard-0" / "wal-0.log", std::ios::binary | std::ios::app);
        tail.write("\x40\x00\x00\x00\x00\x00\x00\x00garbage", 15);
    }
    const auto size_with_tail = fs::file_size(dir.path / "shard-0" / "wal-0.log");
    {
        service svc(durable(dir.path, 2, std::chrono::milliseconds(1)));
        client c(svc);
        CHECK(pull_all(c, 1, 4, 1000) == before);
        CHECK(fs::file_size(dir.path / "shard-0" / "wal-0.log") == size_with_tail - 15);
        c.checkpoint(true).get();
    }
    CHECK_THROWS_WITH_AS(service(durable(dir.path, 3)), doctest::Contains("start this one with 2"), dl::error);
    // Damage in the middle of a log, with intact records after it, is not a torn tail: it is reported.
    {
        service svc(durable(dir.path, 2, std::chrono::milliseconds(1)));
        client c(svc);
        push_random(c, 1, 4, rng, 5);
    }
    const fs::path wal = dir.path / "shard-0" / "wal-1.log";
    REQUIRE(fs::file_size(wal) > 200);
    {
        std::fstream f(wal, std::ios::binary | std::ios::in | std::ios::out);
        f.seekp(40);
        f.put('\x5a');
    }
    CHECK_THROWS_WITH_AS(service(durable(dir.path, 2, std::chrono::milliseconds(1))), doctest::Contains("damaged before its end"), dl::error);
    fs::remove(wal);
    // Flip a byte inside the checkpoint's rows: its CRC catches it and the file is named.
    const fs::path ckpt = dir.path / "shard-1" / "full-1.ckpt";
    REQUIRE(fs::exists(ckpt));
    {
        std::fstream f(ckpt, std::ios::binary | std::ios::in | std::ios::out);
        f.seekp(static_cast<std::streamoff>(fs::file_size(ckpt) / 2));
        f.put('\x5a');
    }
    CHECK_THROWS_WITH_AS(service(durable(dir.path, 2, std::chrono::milliseconds(1))), doctest::Contains("full-1.ckpt"), dl::error);
}

TEST_CASE("an exported table holds the rows and metadata, without optimizer state") {
    temp_dir dir("export");
    service svc({.threads = 2});
    client c(svc);
    c.create_table(config(6, 5)).get();
    std::vector<std::uint64_t> ids{10, 20, 30};
    const std::vector<float> g(15, 0.25f);
    const std::vector<std::uint32_t> shows{4, 5, 6}, clicks{1, 0, 1};
    c.push(6, ids, g, shows, clicks).get();
    fs::create_directories(dir.path);
    const fs::path file = dir.path / "table6.dlps";
    c.export_table(6, file.string()).get();
    const exported_table e(file);
    CHECK(e.table_id() == 6);
    CHECK(e.dim() == 5);
    CHECK(e.size() == 3);
    std::vector<float> rows(15);
    c.pull(6, ids, rows).get();
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto row = e.find(ids[i]);
        REQUIRE(row.size() == 5);
        CHECK(std::vector<float>(row.begin(), row.end()) == std::vector<float>(rows.begin() + i * 5, rows.begin() + (i + 1) * 5));
        CHECK(e.meta(ids[i])->shows == shows[i]);
        CHECK(e.meta(ids[i])->clicks == clicks[i]);
    }
    CHECK(e.find(11).empty());
    CHECK(e.meta(11) == nullptr);
    // A cut file is not a table.
    fs::resize_file(file, fs::file_size(file) - 3);
    CHECK_THROWS_AS(exported_table{file}, dl::error);
}

TEST_CASE("kill -9 of a server process loses no acknowledged push") {
    temp_dir dir("kill");
    const std::uint32_t dim = 4;
    const std::uint64_t keys = 64;
    // The server process: examples/ps_server when it is built (DL_PS_SERVER_BINARY), else this test
    // binary forked; either serves TCP from the data dir until killed.
    auto start_server = [&]() -> std::pair<pid_t, std::uint16_t> {
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::close(fds[0]);
#ifdef DL_PS_SERVER_BINARY
            ::dup2(fds[1], STDOUT_FILENO);  // it prints "listening on ADDRESS:PORT ..."
            ::close(fds[1]);
            const std::string data = dir.path.string();
            ::execl(DL_PS_SERVER_BINARY, "ps_server", "--port", "0", "--threads", "2", "--data", data.c_str(), "--checkpoint-seconds", "0", "--no-auth",
                    static_cast<char*>(nullptr));
            ::_exit(127);
#else
            try {
                service svc(durable(dir.path));
                server srv(svc, server_options{.authenticate = false});
                const std::string line = "listening on 127.0.0.1:" + std::to_string(srv.port()) + "\n";
                if (::write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(2);
                for (;;) ::pause();
            } catch (...) {
                ::_exit(3);
            }
#endif
        }
        ::close(fds[1]);
        std::string line;
        char ch = 0;
        while (::read(fds[0], &ch, 1) == 1 && ch != '\n') line += ch;
        ::close(fds[0]);
        const auto colon = line.rfind(':', line.find(" with") == std::string::npos ? std::string::npos : line.find(" with"));
        INFO("server said: ", line);
        REQUIRE((line.starts_with("listening on ") && colon != std::string::npos));
        return {pid, static_cast<std::uint16_t>(std::stoul(line.substr(colon + 1)))};
    };

    auto [pid, port] = start_server();
    table_config cfg = config(1, dim, optimizer_kind::sgd);
    cfg.init.kind = initializer_kind::zeros;
    cfg.optimizer.lr = 1;  // a row's value is minus the number of pushes applied to it
    std::vector<std::atomic<std::int64_t>> acked(keys), sent(keys);
    {
        client c(client_options{{"127.0.0.1:" + std::to_string(port)}, std::chrono::milliseconds(3000)});
        c.create_table(cfg).get();
        std::atomic<bool> stop{false};
        std::vector<std::thread> workers;
        for (int w = 0; w < 3; ++w)
            workers.emplace_back([&, w] {
                client mine(client_options{{"127.0.0.1:" + std::to_string(port)}, std::chrono::milliseconds(3000)});
                std::mt19937_64 rng(w);
                const std::vector<float> grads(8 * dim, 1.0f);
                while (!stop) {
                    std::vector<std::uint64_t> ids(8);
                    for (auto& id : ids) id = rng() % keys;
                    std::sort(ids.begin(), ids.end());
                    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
                    for (auto id : ids) ++sent[id];
                    try {
                        mine.push(1, ids, std::span(grads).first(ids.size() * dim)).get();
                        for (auto id : ids) ++acked[id];
                    } catch (const dl::error&) {
                        // not acknowledged: it may or may not have been applied
                    }
                }
            });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        c.checkpoint(true).get();  // restore = checkpoint + log
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        stop = true;
        for (auto& t : workers) t.join();
    }
    auto [pid2, port2] = start_server();
    client c(client_options{{"127.0.0.1:" + std::to_string(port2)}, std::chrono::milliseconds(3000)});
    std::vector<std::uint64_t> ids(keys);
    for (std::uint64_t i = 0; i < keys; ++i) ids[i] = i;
    std::vector<float> out(keys * dim);
    c.pull(1, ids, out).get();
    std::int64_t lost = 0, total_acked = 0;
    for (std::uint64_t i = 0; i < keys; ++i) {
        const auto applied = static_cast<std::int64_t>(-out[i * dim]);
        total_acked += acked[i];
        lost += std::max<std::int64_t>(0, acked[i] - applied);
        CHECK(applied <= sent[i]);
    }
    MESSAGE("acknowledged pushes of a row: ", total_acked, ", lost after kill -9: ", lost);
    CHECK(total_acked > 100);
    CHECK(lost == 0);
    ::kill(pid2, SIGKILL);
    ::waitpid(pid2, nullptr, 0);
}

TEST_CASE("adam's beta1 and beta2 survive a restart as doubles; a tables.log of f32 betas still restores") {
    temp_dir dir("betas");
    table_config c = config(3, 4, optimizer_kind::adam);
    c.optimizer.beta1 = 0.95;
    c.optimizer.beta2 = 1 - 1e-9;  // 1.0 in float: only a double keeps it below 1
    {
        service svc(durable(dir.path));
        client(svc).create_table(c).get();
    }
    {
        service svc(durable(dir.path));
        CHECK(svc.config(3).optimizer.beta1 == 0.95);
        CHECK(svc.config(3).optimizer.beta2 == 1 - 1e-9);
    }
    // A data dir written before version 2: its table record holds the betas as f32.
    temp_dir old("betas_v1");
    {
        fs::create_directories(old.path);
        detail::log_file meta(old.path / "meta");
        meta.append([](frame_bytes& b) {
            detail::put(b, detail::record_kind::meta);
            detail::put(b, std::uint32_t{2});
        });
        meta.sync();
        detail::log_file tables(old.path / "tables.log");
        tables.append([](frame_bytes& b) {
            detail::put(b, detail::record_kind::table);
            detail::put(b, std::uint32_t{5});
            detail::put(b, std::uint32_t{4});                                         // dim
            detail::put(b, static_cast<std::uint32_t>(initializer_kind::zeros));
            detail::put(b, 0.0f);                                                     // scale
            detail::put(b, std::uint64_t{1});                                         // seed
            detail::put(b, static_cast<std::uint32_t>(optimizer_kind::adam));
            for (float f : {0.01f, 1e-8f, 0.0f, 0.9f, 0.999f, 1.0f, 0.0f, 0.0f}) detail::put(b, f);
            detail::put(b, std::uint32_t{1});                                         // admit_after
            detail::put(b, std::uint32_t{0});                                         // ttl
            detail::put(b, std::uint64_t{0});                                         // budget
        });
        tables.sync();
    }
    service svc(durable(old.path));
    CHECK(svc.config(5).dim == 4);
    CHECK(svc.config(5).optimizer.beta1 == 0.9);
    CHECK(svc.config(5).optimizer.beta2 == 0.999);
    CHECK(svc.config(5).optimizer.lr == 0.01f);
}

TEST_CASE("a push whose reply is lost, retried by the client after the durable service restarted, is applied once") {
    using namespace std::chrono_literals;
    temp_dir dir("retry");
    table_config c = config(1, 4, optimizer_kind::sgd);
    c.init = {initializer_kind::zeros, 0.0f};
    c.optimizer.lr = 1.0f;
    auto svc = std::make_unique<service>(durable(dir.path));
    auto srv = std::make_unique<server>(*svc, server_options{.authenticate = false});
    client(*svc).create_table(c).get();
    std::uint16_t port = srv->port();
    // The push is applied and logged, its reply lost; the service restarts from its data dir before
    // the client's retry reaches it.
    dl_test::reply_cutting_proxy proxy([&] { return port; }, [&] {
        srv.reset();
        svc.reset();
        svc = std::make_unique<service>(durable(dir.path));
        srv = std::make_unique<server>(*svc, server_options{.authenticate = false});
        port = srv->port();
    });
    const std::vector<std::uint64_t> ids{5, 6, 7};
    {
        client retrying(client_options{{"127.0.0.1:" + std::to_string(proxy.port())}, 3000ms});
        CHECK(dl_test::error_of(retrying.push(1, ids, std::vector<float>(12, 1.0f))) == "");
    }
    REQUIRE(proxy.cuts() == 1);
    std::vector<float> rows(12);
    client(*svc).pull(1, ids, rows).get();
    CHECK(rows == std::vector<float>(12, -1.0f));
}

TEST_CASE("a keyed push is applied once across restarts: the log keeps its key, and so do full and incremental checkpoints") {
    temp_dir dir("keys");
    table_config c = config(1, 4, optimizer_kind::sgd);
    c.init = {initializer_kind::zeros, 0.0f};
    c.optimizer.lr = 1.0f;
    const std::vector<std::uint64_t> ids{5, 6, 7};
    const std::vector<float> g(12, 1.0f);
    auto push = [&](service& s, push_key key) {
        std::promise<outcome> done;
        s.push(1, push_request{ids, g, {}, {}, 4, key}, [&](outcome o) { done.set_value(std::move(o)); });
        return done.get_future().get();
    };
    auto row = [&](service& s) {
        std::vector<float> out(12);
        client(s).pull(1, ids, out).get();
        return out[0];
    };
    auto svc = std::make_unique<service>(durable(dir.path));
    client(*svc).create_table(c).get();
    CHECK(push(*svc, {77, 1}).ok());
    CHECK(push(*svc, {77, 1}).ok());  // a retry: acknowledged, not applied
    CHECK(row(*svc) == -1.0f);
    svc = std::make_unique<service>(durable(dir.path));  // from the log
    CHECK(push(*svc, {77, 1}).ok());
    CHECK(row(*svc) == -1.0f);
    CHECK(push(*svc, {77, 2}).ok());
    CHECK(push(*svc, {78, 1}).ok());  // another client's sequence 1
    CHECK(row(*svc) == -3.0f);
    client(*svc).checkpoint(true).get();
    svc = std::make_unique<service>(durable(dir.path));  // from the full checkpoint: the log before it is gone
    for (push_key k : {push_key{77, 1}, push_key{77, 2}, push_key{78, 1}}) CHECK(push(*svc, k).ok());
    CHECK(row(*svc) == -3.0f);
    CHECK(push(*svc, {77, 3}).ok());
    client(*svc).checkpoint(false).get();
    svc = std::make_unique<service>(durable(dir.path));  // from full + incremental
    CHECK(push(*svc, {77, 3}).ok());
    CHECK(push(*svc, {77, 2}).ok());
    CHECK(row(*svc) == -4.0f);
    // Pushes without a key are applied every time, as before.
    CHECK(push(*svc, {}).ok());
    CHECK(push(*svc, {}).ok());
    CHECK(row(*svc) == -6.0f);
}
