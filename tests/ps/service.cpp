// The service through the embedded client: results equal a single table fed the same (deduplicated)
// pushes, bad requests fail with a message and change nothing, concurrent workers lose no update.
#include "support.hpp"

#include "ps_test.hpp"

#include <random>
#include <thread>

namespace {

using namespace dl::ps;
using dl_test::error_of;

table_config config(std::uint32_t id, std::uint32_t dim, optimizer_kind kind = optimizer_kind::adagrad) {
    table_config c;
    c.id = id;
    c.dim = dim;
    c.seed = 5;
    c.init = {initializer_kind::uniform, 0.1f};
    c.optimizer.kind = kind;
    c.optimizer.lr = 0.05f;
    return c;
}


}  // namespace

TEST_CASE("embedded: pulls and pushes over 2 shard threads equal one table fed the same pushes") {
    service svc({.threads = 2});
    client c(svc);
    const table_config cfg = config(3, 9);
    c.create_table(cfg).get();
    table reference(cfg);

    std::mt19937_64 rng(8);
    std::normal_distribution<float> normal(0, 1);
    for (int step = 0; step < 20; ++step) {
        const std::size_t n = 1 + rng() % 300;
        std::vector<std::uint64_t> ids(n);
        for (auto& id : ids) id = rng() % 500;  // repeats within a batch are common
        std::vector<float> grads(n * 9);
        for (auto& g : grads) g = normal(rng);
        c.push(3, ids, grads).get();
        // The reference sees what the client sends: each id once, its gradients summed.
        std::map<std::uint64_t, std::vector<float>> summed;
        for (std::size_t i = 0; i < n; ++i) {
            auto& s = summed.try_emplace(ids[i], 9, 0.0f).first->second;
            for (int j = 0; j < 9; ++j) s[j] += grads[i * 9 + j];
        }
        for (const auto& [id, g] : summed) reference.push(id, g.data(), 9, 0, 0, static_cast<std::uint32_t>(step));
    }
    std::vector<std::uint64_t> ids(700);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i % 600;  // stored, never pushed, and repeated ids
    std::vector<float> out(ids.size() * 9);
    c.pull(3, ids, out).get();
    for (std::size_t i = 0; i < ids.size(); ++i) {
        std::vector<float> expected(9);
        reference.pull(ids[i], expected.data(), 9);
        for (int j = 0; j < 9; ++j) CHECK(out[i * 9 + j] == doctest::Approx(expected[j]).epsilon(1e-5));
    }
    const table_stats s = c.stats(3).get();
    CHECK(s.rows == reference.size());
    CHECK(s.step == 20);
    CHECK(s.dim == 9);
    CHECK(s.reserved_bytes >= s.live_bytes);
}

TEST_CASE("embedded: bad requests fail with a message and change nothing") {
    service svc({.threads = 2});
    client c(svc);
    c.create_table(config(1, 4)).get();
    const std::vector<std::uint64_t> ids{1, 2, 3};
    std::vector<float> grads(12, 0.5f), before(12), after(12);
    c.push(1, ids, grads).get();
    c.pull(1, ids, before).get();

    CHECK(error_of(c.pull(9, ids, before)).find("unknown table 9") != std::string::npos);
    CHECK(error_of(c.push(9, ids, grads)).find("unknown table 9") != std::string::npos);
    std::vector<float> wide(ids.size() * 5);
    CHECK(error_of(c.pull(1, ids, wide)).find("dim 4") != std::string::npos);
    CHECK(error_of(c.push(1, ids, std::vector<float>(15, 1.0f))).find("dim 4") != std::string::npos);
    CHECK_THROWS_WITH_AS(c.pull(1, ids, std::span<float>(wide).first(13)), doctest::Contains("not a whole number of rows"), dl::error);
    const std::vector<std::uint32_t> two{1, 1};
    CHECK_THROWS_WITH_AS(c.push(1, ids, grads, two, two), doctest::Contains("shows"), dl::error);

    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
        std::vector<float> poisoned(12, 0.25f);
        poisoned[7] = bad;  // id 2, element 3
        const std::string message = error_of(c.push(1, ids, poisoned));
        CHECK(message.find("gradient of id 2") != std::string::npos);
        CHECK(message.find("nothing was applied") != std::string::npos);
    }
    c.pull(1, ids, after).get();
    CHECK(after == before);
    CHECK(c.stats(1).get().step == 1);  // rejected pushes do not count as steps

    // Creating again: the same config succeeds, another one fails.
    c.create_table(config(1, 4)).get();
    CHECK(error_of(c.create_table(config(1, 8))).find("exists with another config") != std::string::npos);
    table_config invalid = config(2, 4);
    invalid.optimizer.lr = 0;
    CHECK_THROWS_WITH_AS(c.create_table(invalid), doctest::Contains("lr must be"), dl::error);
    // Empty calls are ready at once.
    c.pull(1, {}, {}).get();
    c.push(1, {}, {}).get();
}

TEST_CASE("embedded: concurrent workers lose no update; shows and clicks add up") {
    service svc({.threads = 2});
    table_config cfg = config(1, 3, optimizer_kind::sgd);
    cfg.init.kind = initializer_kind::zeros;
    cfg.optimizer.lr = 1;
    client(svc).create_table(cfg).get();
    const int workers = 4, steps = 50;
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w)
        threads.emplace_back([&] {
            client c(svc);
            std::vector<std::uint64_t> ids(100);
            for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i;
            const std::vector<float> grads(300, 1.0f);
            const std::vector<std::uint32_t> shows(100, 2), clicks(100, 1);
            std::vector<std::future<void>> inflight;
            for (int s = 0; s < steps; ++s) inflight.push_back(c.push(1, ids, grads, shows, clicks));
            for (auto& f : inflight) f.get();
        });
    for (auto& t : threads) t.join();
    client c(svc);
    std::vector<std::uint64_t> ids(100);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i;
    std::vector<float> out(300);
    c.pull(1, ids, out).get();
    for (float v : out) CHECK(v == -float(workers * steps));
    CHECK(c.stats(1).get().step == std::uint64_t(workers * steps));
}

TEST_CASE("embedded: TTL eviction through the service, and grow_dim") {
    service svc({.threads = 2});
    client c(svc);
    table_config cfg = config(4, 2, optimizer_kind::sgd);
    cfg.ttl_steps = 8;
    c.create_table(cfg).get();
    const std::vector<std::uint64_t> idle{1000};
    const std::vector<float> g{1, 1};
    std::vector<float> initial(2), now(2);
    c.pull(4, idle, initial).get();
    c.push(4, idle, g).get();
    std::vector<std::uint64_t> busy(64);
    for (std::size_t i = 0; i < busy.size(); ++i) busy[i] = i;  // reaches both shards every step
    const std::vector<float> gb(128, 0.0f);
    for (int s = 0; s < 20; ++s) c.push(4, busy, gb).get();
    c.pull(4, idle, now).get();
    CHECK(now == initial);  // evicted: back to its initial row
    CHECK(c.stats(4).get().evicted >= 1);

    c.grow_dim(4, 5).get();
    std::vector<float> grown(5);
    c.pull(4, std::vector<std::uint64_t>{3}, grown).get();
    CHECK(error_of(c.push(4, idle, g)).find("dim 5") != std::string::npos);
    CHECK(error_of(c.grow_dim(4, 3)).find("can only grow") != std::string::npos);
}
