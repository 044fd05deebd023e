// The in-process communicator: collectives against a scalar reference over group sizes and lengths
// (empty, single, odd tails), identical bits on every rank, and failures (mismatched lengths, a rank
// that aborts) that reach every rank as errors instead of hangs.
#include <dl/dist/communicator.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

using dl::dist::reduce_op;

/// Runs body(rank) on one thread per rank of the group; returns each rank's error message ("" if none).
std::vector<std::string> on_every_rank(const dl::dist::in_process_group& group, const std::function<void(int)>& body) {
    std::vector<std::string> errors(static_cast<std::size_t>(group.size()));
    std::vector<std::thread> threads;
    for (int r = 0; r < group.size(); ++r)
        threads.emplace_back([&, r] {
            try {
                body(r);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

/// Rank r's element i: distinct per rank, with an odd fractional part so that sums round.
template <class T>
T element(int r, std::size_t i) {
    return static_cast<T>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * 10.0 + r);
}

template <class T>
T reference(reduce_op op, int ranks, std::size_t i) {
    T acc = element<T>(0, i);
    for (int r = 1; r < ranks; ++r) {
        const T v = element<T>(r, i);
        acc = op == reduce_op::max ? std::max(acc, v) : op == reduce_op::min ? std::min(acc, v) : static_cast<T>(acc + v);
    }
    return op == reduce_op::mean ? static_cast<T>(acc / static_cast<T>(ranks)) : acc;
}

}  // namespace

TEST_CASE_TEMPLATE("in-process allreduce equals the scalar reference, with the same bits on every rank", T, float, double) {
    for (int ranks : {1, 2, 3, 4})
        for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1001}})
            for (reduce_op op : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min}) {
                CAPTURE(ranks);
                CAPTURE(length);
                CAPTURE(static_cast<int>(op));
                dl::dist::in_process_group group(ranks);
                std::vector<std::vector<T>> data(static_cast<std::size_t>(ranks));
                const auto errors = on_every_rank(group, [&](int r) {
                    auto& mine = data[static_cast<std::size_t>(r)];
                    for (std::size_t i = 0; i < length; ++i) mine.push_back(element<T>(r, i));
                    CHECK(group[r].rank() == r);
                    CHECK(group[r].size() == ranks);
                    group[r].allreduce(std::span<T>(mine), op);
                });
                for (const auto& e : errors) CHECK(e.empty());
                for (std::size_t i = 0; i < length; ++i) {
                    // Ranks are combined in rank order, so the result is exact against the reference.
                    CHECK(data[0][i] == reference<T>(op, ranks, i));
                    for (int r = 1; r < ranks; ++r)
                        CHECK(std::memcmp(&data[static_cast<std::size_t>(r)][i], &data[0][i], sizeof(T)) == 0);
                }
            }
}

TEST_CASE("in-process allreduce: NaN and Inf propagate through sums") {
    dl::dist::in_process_group group(2);
    std::vector<std::vector<float>> data{{1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()},
                                         {std::numeric_limits<float>::quiet_NaN(), 1.0f, -std::numeric_limits<float>::infinity()}};
    const auto errors = on_every_rank(group, [&](int r) { group[r].allreduce(std::span<float>(data[static_cast<std::size_t>(r)]), reduce_op::sum); });
    for (int r = 0; r < 2; ++r) {
        CHECK(errors[static_cast<std::size_t>(r)].empty());
        CHECK(std::isnan(data[static_cast<std::size_t>(r)][0]));
        CHECK(data[static_cast<std::size_t>(r)][1] == std::numeric_limits<float>::infinity());
        CHECK(std::isnan(data[static_cast<std::size_t>(r)][2]));  // Inf + -Inf
    }
}

TEST_CASE("in-process broadcast and barrier; many collectives back to back stay in step") {
    for (int ranks : {1, 3}) {
        dl::dist::in_process_group group(ranks);
        std::vector<std::vector<double>> data(static_cast<std::size_t>(ranks));
        const auto errors = on_every_rank(group, [&](int r) {
            auto& mine = data[static_cast<std::size_t>(r)];
            for (int step = 0; step < 200; ++step) {
                mine.assign(5, static_cast<double>(r * 100 + step));
                group[r].broadcast(std::span<double>(mine), step % ranks);
                for (double v : mine) CHECK(v == static_cast<double>((step % ranks) * 100 + step));
                group[r].barrier();
                group[r].allreduce(std::span<double>(mine), reduce_op::sum);
                for (double v : mine) CHECK(v == static_cast<double>(ranks * ((step % ranks) * 100 + step)));
            }
        });
        for (const auto& e : errors) CHECK(e.empty());
    }
}

TEST_CASE("in-process collectives: bad use is reported on every rank, and the group can be reset") {
    dl::dist::in_process_group group(3);
    CHECK_THROWS_WITH_AS((void)group[3], doctest::Contains("no rank 3 in a group of 3"), dl::error);
    CHECK_THROWS_WITH_AS(dl::dist::in_process_group(0), doctest::Contains("at least one rank"), dl::error);

    SUBCASE("lengths differ") {
        const auto errors = on_every_rank(group, [&](int r) {
            std::vector<float> mine(r == 1 ? 4 : 3, 1.0f);
            group[r].allreduce(std::span<float>(mine), reduce_op::sum);
        });
        for (const auto& e : errors) CHECK(e.find("every rank must pass the same length") != std::string::npos);
        // The group stays failed until reset: no rank can post over lengths another has yet to read.
        std::vector<float> one(1);
        CHECK_THROWS_WITH_AS(group[0].allreduce(std::span<float>(one), reduce_op::sum), doctest::Contains("aborted"), dl::error);
    }
    SUBCASE("a rank aborts while the others wait in a collective") {
        const auto errors = on_every_rank(group, [&](int r) {
            if (r == 2) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                group[r].abort("out of memory");
                return;
            }
            std::vector<float> mine(8, 1.0f);
            group[r].allreduce(std::span<float>(mine), reduce_op::sum);
        });
        CHECK(errors[0].find("rank 2: out of memory") != std::string::npos);
        CHECK(errors[1].find("rank 2: out of memory") != std::string::npos);
        CHECK(errors[2].empty());
    }
    SUBCASE("broadcast from a root that does not exist") {
        std::vector<float> mine(2);
        CHECK_THROWS_WITH_AS(group[0].broadcast(std::span<float>(mine), 5), doctest::Contains("no root rank 5"), dl::error);
    }
    group.reset();
    std::vector<std::vector<float>> data(3, std::vector<float>(4, 2.0f));
    const auto errors = on_every_rank(group, [&](int r) { group[r].allreduce(std::span<float>(data[static_cast<std::size_t>(r)]), reduce_op::mean); });
    for (int r = 0; r < 3; ++r) {
        CHECK(errors[static_cast<std::size_t>(r)].empty());
        CHECK(data[static_cast<std::size_t>(r)] == std::vector<float>(4, 2.0f));
    }
}
