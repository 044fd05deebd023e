// One shard's table: initial rows, every server-side optimizer against a double-precision scalar
// reference, the map against std::unordered_map under inserts and evictions, admission, TTL and budget
// eviction, dim growth, checkpoint rows, and the memory a row costs.
#include "support.hpp"

#include <dl/ps.hpp>

#include <map>
#include <numeric>
#include <random>
#include <unordered_map>

namespace {

using dl::ps::optimizer_kind;
using dl::ps::table;
using dl::ps::table_config;

table_config config(std::uint32_t dim, optimizer_kind kind = optimizer_kind::sgd) {
    table_config c;
    c.id = 7;
    c.dim = dim;
    c.seed = 11;
    c.optimizer.kind = kind;
    c.optimizer.lr = 0.1f;
    return c;
}

std::vector<float> pulled(const table& t, std::uint64_t id) {
    std::vector<float> row(t.dim());
    t.pull(id, row.data(), t.dim());
    return row;
}

/// The optimizers in double precision, element by element, written from their papers' formulas.
struct reference_row {
    std::vector<double> w, a, b;  // a, b: the optimizer's state (Σg², m/v, z/n)
    double t = 0;                 // adam's step; rowwise adagrad keeps its accumulator in a[0]

    reference_row(const std::vector<float>& initial, const dl::ps::optimizer_config& o)
        : w(initial.begin(), initial.end()), a(initial.size(), o.initial_accumulator), b(initial.size(), 0) {
        if (o.kind == optimizer_kind::adam || o.kind == optimizer_kind::ftrl) std::fill(a.begin(), a.end(), 0.0);
    }
    void step(const std::vector<float>& g, const dl::ps::optimizer_config& o) {
        const std::size_t n = w.size();
        switch (o.kind) {
        case optimizer_kind::sgd:
            for (std::size_t j = 0; j < n; ++j) w[j] -= o.lr * double(g[j]);
            break;
        case optimizer_kind::adagrad:
            for (std::size_t j = 0; j < n; ++j) {
                a[j] += double(g[j]) * g[j];
                w[j] -= o.lr * double(g[j]) / (std::sqrt(a[j]) + o.eps);
            }
            break;
        case optimizer_kind::rowwise_adagrad: {
            double mean_square = 0;
            for (float v : g) mean_square += double(v) * v / double(n);
            a[0] += mean_square;
            for (std::size_t j = 0; j < n; ++j) w[j] -= o.lr * double(g[j]) / (std::sqrt(a[0]) + o.eps);
            break;
        }
        case optimizer_kind::adam:
            t += 1;
            for (std::size_t j = 0; j < n; ++j) {
                a[j] = o.beta1 * a[j] + (1 - double(o.beta1)) * g[j];
                b[j] = o.beta2 * b[j] + (1 - double(o.beta2)) * double(g[j]) * g[j];
                const double m_hat = a[j] / (1 - std::pow(double(o.beta1), t)), v_hat = b[j] / (1 - std::pow(double(o.beta2), t));
                w[j] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
            }
            break;
        case optimizer_kind::ftrl:
            for (std::size_t j = 0; j < n; ++j) {  // McMahan et al. 2013, algorithm 1 (per-coordinate lr alpha)
                const double sigma = (std::sqrt(b[j] + double(g[j]) * g[j]) - std::sqrt(b[j])) / o.lr;
                a[j] += g[j] - sigma * w[j];
                b[j] += double(g[j]) * g[j];
                w[j] = std::abs(a[j]) <= o.l1 ? 0.0 : -(a[j] - std::copysign(double(o.l1), a[j])) / ((o.beta + std::sqrt(b[j])) / o.lr + o.l2);
            }
            break;
        }
    }
};

}  // namespace

TEST_CASE("a row starts from its initializer, the same on every call and independent of other ids") {
    for (auto kind : {dl::ps::initializer_kind::zeros, dl::ps::initializer_kind::uniform, dl::ps::initializer_kind::normal}) {
        table_config c = config(33);
        c.init = {kind, 0.5f};
        const table t(c);
        const auto a = pulled(t, 42), again = pulled(t, 42), other = pulled(t, 43);
        CHECK(a == again);
        CHECK(t.size() == 0);  // pulling creates nothing
        for (std::uint32_t j = 0; j < 33; ++j) CHECK(a[j] == dl::ps::detail::initial_value(c.init, c.seed, 42, j));
        if (kind == dl::ps::initializer_kind::zeros) {
            CHECK(a == std::vector<float>(33, 0.0f));
        } else {
            CHECK(a != other);
            for (float v : a) CHECK(std::isfinite(v));
        }
        if (kind == dl::ps::initializer_kind::uniform)
            for (float v : a) CHECK(std::abs(v) <= 0.5f);
    }
    // Normal(0, 0.5): the sample over many rows has about that spread.
    table_config c = config(64);
    c.init = {dl::ps::initializer_kind::normal, 0.5f};
    const table t(c);
    double sum = 0, squares = 0;
    const int rows = 2000;
    for (int id = 0; id < rows; ++id)
        for (float v : pulled(t, static_cast<std::uint64_t>(id))) {
            sum += v;
            squares += double(v) * v;
        }
    const double n = rows * 64.0, mean = sum / n;
    CHECK(std::abs(mean) < 0.01);
    CHECK(std::sqrt(squares / n - mean * mean) == doctest::Approx(0.5).epsilon(0.02));
}

TEST_CASE("every optimizer matches a double-precision reference over several pushes, odd dims included") {
    for (auto kind : {optimizer_kind::sgd, optimizer_kind::adagrad, optimizer_kind::rowwise_adagrad, optimizer_kind::adam, optimizer_kind::ftrl}) {
        for (std::uint32_t dim : {1u, 7u, 16u, 33u}) {
            CAPTURE(static_cast<int>(kind));
            CAPTURE(dim);
            table_config c = config(dim, kind);
            c.init = {dl::ps::initializer_kind::uniform, 0.3f};
            c.optimizer.initial_accumulator = kind == optimizer_kind::adagrad || kind == optimizer_kind::rowwise_adagrad ? 0.1f : 0.0f;
            c.optimizer.l1 = kind == optimizer_kind::ftrl ? 0.05f : 0.0f;
            c.optimizer.l2 = kind == optimizer_kind::ftrl ? 0.01f : 0.0f;
            c.optimizer.eps = kind == optimizer_kind::adam ? 1e-8f : 1e-10f;
            table t(c);
            const std::uint64_t id = 1234567890123ull;
            reference_row ref(pulled(t, id), c.optimizer);
            std::mt19937 rng(dim);
            std::normal_distribution<float> normal(0, 1);
            for (int step = 0; step < 5; ++step) {
                std::vector<float> g(dim);
                for (auto& v : g) v = normal(rng);
                t.push(id, g.data(), dim, 1, step % 2, static_cast<std::uint32_t>(step));
                ref.step(g, c.optimizer);
            }
            const auto got = pulled(t, id);
            // Adam divides by sqrt(v) of tiny squares: its float rounding is larger.
            const double tolerance = kind == optimizer_kind::adam ? 1e-4 : 1e-5;
            for (std::uint32_t j = 0; j < dim; ++j) CHECK(got[j] == doctest::Approx(ref.w[j]).epsilon(tolerance).scale(1e-2));
            // The row's metadata counted the pushes.
            t.for_each_row([&](const table::row_view& r) {
                CHECK(r.meta.id == id);
                CHECK(r.meta.frequency == 5);
                CHECK(r.meta.shows == 5);
                CHECK(r.meta.clicks == 2);
                CHECK(r.meta.last_step == 4);
                CHECK(r.weights.size() == dim);
                CHECK(r.state.size() == dl::ps::state_floats(kind, dim));
            });
        }
    }
}

TEST_CASE("the map stays consistent with std::unordered_map through inserts, erases and growth") {
    table t(config(2));
    std::unordered_map<std::uint64_t, float> expected;  // id -> weights[0] (sgd, zeros... from init)
    std::mt19937_64 rng(3);
    const int ops = dl_test::quick() ? 20000 : 60000;
    for (int i = 0; i < ops; ++i) {
        // Ids from a small range collide in their home slots often; some are huge.
        const std::uint64_t id = (rng() % 4 == 0) ? rng() : rng() % 5000;
        if (rng() % 3 == 0) {
            CHECK(t.erase(id) == (expected.erase(id) == 1));
        } else {
            const float g[2] = {1.0f, 0.0f};
            if (!expected.contains(id)) expected[id] = pulled(t, id)[0];
            t.push(id, g, 2, 0, 0, 0);
            expected[id] -= 0.1f;
        }
    }
    CHECK(t.size() == expected.size());
    for (const auto& [id, w0] : expected) CHECK(pulled(t, id)[0] == doctest::Approx(w0));
    std::size_t seen = 0;
    t.for_each_row([&](const table::row_view& r) {
        ++seen;
        CHECK(expected.contains(r.meta.id));
    });
    CHECK(seen == expected.size());
}

TEST_CASE("admission: a row is created at the k-th push; before that pulls give the initial row and pushes only count") {
    table_config c = config(4);
    c.admit_after = 3;
    c.init = {dl::ps::initializer_kind::uniform, 0.1f};
    table t(c);
    const auto initial = pulled(t, 9);
    const float g[4] = {1, 1, 1, 1};
    t.push(9, g, 4, 0, 0, 0);
    t.push(9, g, 4, 0, 0, 1);
    CHECK(t.size() == 0);
    CHECK(pulled(t, 9) == initial);
    t.push(9, g, 4, 0, 0, 2);  // admitted: created from the initializer, then this push applies
    CHECK(t.size() == 1);
    const auto now = pulled(t, 9);
    for (int j = 0; j < 4; ++j) CHECK(now[j] == doctest::Approx(initial[j] - 0.1f));
    t.push(10, g, 4, 0, 0, 3);
    CHECK(t.size() == 1);  // another id starts its own count
}

TEST_CASE("eviction: rows idle past the TTL go; over the budget the least frequent go first") {
    table_config c = config(4);
    c.ttl_steps = 10;
    table t(c);
    const auto initial = pulled(t, 1);
    const float g[4] = {1, 0, 0, 0};
    t.push(1, g, 4, 0, 0, 0);
    t.push(2, g, 4, 0, 0, 15);
    std::vector<std::uint64_t> evicted;
    CHECK(t.evict(20, 0, [&](std::uint64_t id) { evicted.push_back(id); }) == 1);
    CHECK(evicted == std::vector<std::uint64_t>{1});
    CHECK(t.size() == 1);
    CHECK(pulled(t, 1) == initial);  // back to its initial row

    table_config b = config(4);
    table u(b);
    for (std::uint64_t id = 0; id < 1000; ++id)
        for (std::uint64_t k = 0; k <= id % 10; ++k) u.push(id, g, 4, 0, 0, 0);  // frequency 1..10
    const std::size_t budget = u.live_bytes() / 2;
    evicted.clear();
    u.evict(0, budget, [&](std::uint64_t id) { evicted.push_back(id); });
    CHECK(u.live_bytes() <= budget);
    CHECK(u.size() > 300);
    // Everything evicted was at most as frequent as everything kept.
    std::uint32_t max_evicted = 0, min_kept = ~0u;
    for (auto id : evicted) max_evicted = std::max<std::uint32_t>(max_evicted, static_cast<std::uint32_t>(id % 10 + 1));
    u.for_each_row([&](const table::row_view& r) { min_kept = std::min(min_kept, r.meta.frequency); });
    CHECK(max_evicted <= min_kept);
    // Freed rows are reused: refilling allocates no new slab.
    const std::size_t reserved = u.reserved_bytes();
    for (auto id : evicted) u.push(id, g, 4, 0, 0, 1);
    CHECK(u.reserved_bytes() == reserved);
}

TEST_CASE("grow_dim: old rows keep their values and grow when a push reaches them") {
    table_config c = config(4, optimizer_kind::adagrad);
    c.init = {dl::ps::initializer_kind::uniform, 0.2f};
    table t(c);
    const float g4[4] = {1, 2, 3, 4};
    t.push(5, g4, 4, 0, 0, 0);
    const auto before = pulled(t, 5);
    t.grow_dim(6);
    CHECK(t.dim() == 6);
    auto now = pulled(t, 5);
    REQUIRE(now.size() == 6);
    for (int j = 0; j < 4; ++j) CHECK(now[j] == before[j]);
    for (std::uint32_t j = 4; j < 6; ++j) CHECK(now[j] == dl::ps::detail::initial_value(c.init, c.seed, 5, j));
    CHECK_THROWS_WITH_AS(t.push(5, g4, 4, 0, 0, 1), doctest::Contains("dim 4 met dim 6"), dl::error);
    const float g6[6] = {1, 1, 1, 1, 1, 1};
    t.push(5, g6, 6, 0, 0, 1);
    t.for_each_row([&](const table::row_view& r) {
        CHECK(r.weights.size() == 6);
        CHECK(r.state[0] == doctest::Approx(1 + 1));     // Σg² kept from the first push, plus this one
        CHECK(r.state[5] == doctest::Approx(0 + 1));     // a new element's state starts fresh
        CHECK(r.meta.frequency == 2);
    });
    CHECK_THROWS_WITH_AS(t.grow_dim(5), doctest::Contains("can only grow"), dl::error);
}

TEST_CASE("rows read with for_each_row restore into another table exactly") {
    table_config c = config(8, optimizer_kind::adam);
    table a(c);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0, 1);
    for (std::uint64_t id = 0; id < 300; ++id) {
        std::vector<float> g(8);
        for (auto& v : g) v = normal(rng);
        a.push(id * 7919, g.data(), 8, 2, 1, static_cast<std::uint32_t>(id));
    }
    table b(c);
    a.for_each_row([&](const table::row_view& r) { b.restore_row(r.meta, r.weights, r.state); });
    CHECK(b.size() == a.size());
    for (std::uint64_t id = 0; id < 300; ++id) CHECK(pulled(b, id * 7919) == pulled(a, id * 7919));
    std::map<std::uint64_t, std::vector<float>> states;
    a.for_each_row([&](const table::row_view& r) { states[r.meta.id].assign(r.state.begin(), r.state.end()); });
    b.for_each_row([&](const table::row_view& r) {
        CHECK(std::vector<float>(r.state.begin(), r.state.end()) == states.at(r.meta.id));
        CHECK(r.meta.shows == 2);
    });
    const std::vector<float> w(3), s(5);
    CHECK_THROWS_WITH_AS(b.restore_row(dl::ps::row_meta{1, 0, 0, 0, 0, 0}, w, s), doctest::Contains("restored row 1"), dl::error);
}

TEST_CASE("a stored row of dim 16 with Adagrad state costs at most 1.15 x raw + 16 bytes") {
    if (dl_test::quick()) return;  // a million rows: the Release run checks it
    table_config c = config(16, optimizer_kind::adagrad);
    c.init.kind = dl::ps::initializer_kind::zeros;
    table t(c);
    const std::vector<float> g(16, 0.5f);
    const std::uint64_t rows = 1'000'000;
    for (std::uint64_t id = 0; id < rows; ++id) t.push(id, g.data(), 16, 0, 0, 0);
    const double per_row = double(t.reserved_bytes()) / double(rows), raw = 8.0 * 16;
    MESSAGE("bytes per row at dim 16: ", per_row);
    CHECK(per_row <= 1.15 * raw + 16);
}

TEST_CASE("table configs are validated with the field named") {
    table_config c = config(0);
    CHECK_THROWS_WITH_AS(table{c}, doctest::Contains("dim must be in"), dl::error);
    c = config(4);
    c.optimizer.lr = -1;
    CHECK_THROWS_WITH_AS(table{c}, doctest::Contains("lr must be"), dl::error);
    c = config(4);
    c.admit_after = 0;
    CHECK_THROWS_WITH_AS(table{c}, doctest::Contains("admit_after"), dl::error);
    c = config(4);
    c.init.scale = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(table{c}, doctest::Contains("scale"), dl::error);
}

TEST_CASE("rows larger than a slab's target size, and a failed grow_dim that changes nothing") {
    table_config c = config(40000);  // 160 KB rows: two to a slab
    c.init.kind = dl::ps::initializer_kind::zeros;
    table t(c);
    std::vector<float> g(40000);
    for (std::uint64_t id = 1; id <= 5; ++id) {
        std::fill(g.begin(), g.end(), float(id));
        t.push(id, g.data(), 40000, 0, 0, 0);
    }
    for (std::uint64_t id = 1; id <= 5; ++id) {
        const auto row = pulled(t, id);
        CHECK(row.front() == doctest::Approx(-0.1 * double(id)));
        CHECK(row.back() == doctest::Approx(-0.1 * double(id)));
    }

    table small(config(1));
    std::uint32_t dim = 1;
    for (int i = 0; i < 14; ++i) small.grow_dim(++dim);  // 15 row sizes: the most a table holds
    CHECK_THROWS_WITH_AS(small.grow_dim(dim + 1), doctest::Contains("row sizes"), dl::error);
    CHECK(small.dim() == dim);
    std::vector<float> h(dim, 1.0f);
    small.push(3, h.data(), dim, 0, 0, 0);
    CHECK(pulled(small, 3).size() == dim);
}

TEST_CASE("TTL eviction compares steps as a window: a row updated at a later step is not idle") {
    table_config c = config(2);
    c.ttl_steps = 10;
    table t(c);
    const float g[2] = {1, 1};
    t.push(1, g, 2, 0, 0, 101);  // shards may apply step 101 before step 100
    CHECK(t.evict(100, 0, [](std::uint64_t) {}) == 0);
    CHECK(t.evict(112, 0, [](std::uint64_t) {}) == 1);
}

TEST_CASE("push_many and pull_many equal one push and one pull at a time, repeated and new ids included") {
    for (auto kind : {optimizer_kind::adagrad, optimizer_kind::adam}) {
        table_config c = config(5, kind);
        c.admit_after = 2;
        table one(c), many(c);
        std::mt19937_64 rng(9);
        std::normal_distribution<float> normal(0, 1);
        for (int step = 0; step < 6; ++step) {
            if (step == 3) {
                one.grow_dim(7);
                many.grow_dim(7);
            }
            const std::uint32_t dim = one.dim();
            std::vector<std::uint64_t> ids(300);
            for (auto& id : ids) id = rng() % 200;  // repeats within a batch, new ids, ids below admission
            std::vector<float> g(ids.size() * dim);
            for (auto& v : g) v = normal(rng);
            std::vector<std::uint32_t> positions(ids.size()), shows(ids.size(), 1), clicks(ids.size(), 0);
            std::iota(positions.begin(), positions.end(), 0u);
            for (std::size_t k = 0; k < ids.size(); ++k) one.push(ids[k], g.data() + k * dim, dim, 1, 0, static_cast<std::uint32_t>(step));
            many.push_many(positions, ids, g.data(), dim, shows, clicks, static_cast<std::uint32_t>(step));
        }
        CHECK(many.size() == one.size());
        std::vector<std::uint64_t> ids(250);
        std::iota(ids.begin(), ids.end(), 0u);
        std::vector<std::uint32_t> positions(ids.size());
        std::iota(positions.begin(), positions.end(), 0u);
        std::vector<float> out(ids.size() * 7);
        many.pull_many(positions, ids, out.data(), 7);
        for (std::size_t k = 0; k < ids.size(); ++k)
            CHECK(std::vector<float>(out.begin() + k * 7, out.begin() + (k + 1) * 7) == pulled(one, ids[k]));
    }
}

TEST_CASE("adam over 1000 steps matches a double-precision reference with beta1 = 0.9 and beta2 = 0.999 exactly") {
    // The reference uses the decimal hyper-parameters, not their float roundings: 1 - 0.999f formed in
    // float is 0.00099998713, so the second moment came out 1.3e-5 relative too small.
    table_config c = config(6, optimizer_kind::adam);
    c.init = {dl::ps::initializer_kind::zeros, 0.0f};
    c.optimizer.lr = 0.01f;
    c.optimizer.eps = 1e-8f;
    c.optimizer.beta1 = 0.9;
    c.optimizer.beta2 = 0.999;
    table t(c);
    const std::uint64_t id = 77;
    std::vector<double> w(6, 0.0), m(6, 0.0), v(6, 0.0);
    double worst_m = 0, worst_v = 0, worst_w = 0;
    for (int step = 1; step <= 1000; ++step) {
        // Gradients that change sign and scale: the decay rates matter, not only the ratios.
        std::vector<float> g(6);
        for (int j = 0; j < 6; ++j) g[j] = static_cast<float>(std::sin(0.05 * step + j) * (1 + (step * (j + 1)) % 7));
        t.push(id, g.data(), 6, 1, 0, static_cast<std::uint32_t>(step));
        for (int j = 0; j < 6; ++j) {
            m[j] = 0.9 * m[j] + 0.1 * g[j];
            v[j] = 0.999 * v[j] + 0.001 * double(g[j]) * g[j];
            const double m_hat = m[j] / (1 - std::pow(0.9, step)), v_hat = v[j] / (1 - std::pow(0.999, step));
            w[j] -= double(c.optimizer.lr) * m_hat / (std::sqrt(v_hat) + double(c.optimizer.eps));
        }
        // The moments are the state a row carries: m and v, then the step count.
        t.for_each_row([&](const table::row_view& r) {
            REQUIRE(r.state.size() == 13);
            CHECK(r.state[12] == static_cast<float>(step));
            for (int j = 0; j < 6; ++j) {
                worst_m = std::max(worst_m, std::abs(r.state[j] - m[j]) / 7);  // |g| < 7: m's scale
                worst_v = std::max(worst_v, std::abs(r.state[6 + j] - v[j]) / v[j]);
                worst_w = std::max(worst_w, std::abs(r.weights[j] - w[j]));
            }
        });
    }
    INFO("worst differences over the run: m " << worst_m << " (of 7), v " << worst_v << " relative, w " << worst_w);
    CHECK(worst_v < 3e-6);
    CHECK(worst_m < 1e-6);
    CHECK(worst_w < 2e-6);
}
