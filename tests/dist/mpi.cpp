// The MPI communicator (dist/mpi.hpp), run by ctest under `mpiexec -n 2` (every rank runs every test
// case, in the same order, so their collectives meet): allreduce against a rank-order fold and against
// the in-process group's bits, broadcast, length mismatches reported on every rank, and data-parallel
// training with one replica per process.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dl/dl.hpp>
#include <dl/dist/data_parallel.hpp>
#include <dl/dist/mpi.hpp>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

using dl::Tensor;
namespace dist = dl::dist;

dist::mpi_communicator& world() {
    static dist::mpi_communicator comm;
    return comm;
}

/// Rank r's element i: values of mixed magnitude (so the order of a sum shows in its bits), with a
/// NaN and infinities on rank 1.
template <class T>
T value(int rank, std::size_t i) {
    const std::uint64_t h = (static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
    const double u = static_cast<double>((h * 0x94D049BB133111EBull) >> 11) * 0x1p-53;
    if (rank == 1 && i == 5) return std::numeric_limits<T>::quiet_NaN();
    if (rank == 1 && i == 6) return std::numeric_limits<T>::infinity();
    return static_cast<T>((u - 0.5) * std::pow(10.0, static_cast<double>(i % 7) - 3));
}

template <class T>
std::vector<T> data_of(int rank, std::size_t n) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(rank, i);
    return v;
}

/// What every rank's allreduce gives in the in-process group (ranks as threads of this process).
template <class T>
std::vector<T> in_process(int ranks, std::size_t n, dist::reduce_op op) {
    dist::in_process_group group(ranks);
    std::vector<std::vector<T>> data;
    for (int r = 0; r < ranks; ++r) data.push_back(data_of<T>(r, n));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { group[r].allreduce(std::span<T>(data[std::size_t(r)]), op); });
    for (auto& t : threads) t.join();
    return data[0];
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("mpi allreduce: a rank-order fold, with the in-process group's bits on every rank", T, float, double) {
    dist::mpi_communicator& comm = world();
    REQUIRE(comm.size() >= 2);
    for (std::size_t n : {0, 1, 2, 7, 1000, 100003}) {
        for (auto op : {dist::reduce_op::sum, dist::reduce_op::mean, dist::reduce_op::max, dist::reduce_op::min}) {
            CAPTURE(n);
            CAPTURE(static_cast<int>(op));
            std::vector<T> mine = data_of<T>(comm.rank(), n);
            comm.allreduce(std::span<T>(mine), op);
            // The scalar reference: rank 0's values combined with each next rank's, in rank order.
            std::vector<T> want = data_of<T>(0, n);
            for (int r = 1; r < comm.size(); ++r)
                for (std::size_t i = 0; i < n; ++i) {
                    const T v = value<T>(r, i);
                    if (op == dist::reduce_op::max)
                        want[i] = std::max(want[i], v);
                    else if (op == dist::reduce_op::min)
                        want[i] = std::min(want[i], v);
                    else
                        want[i] += v;
                }
            if (op == dist::reduce_op::mean)
                for (T& w : want) w /= static_cast<T>(comm.size());
            CHECK(same_bits(mine, want));
            CHECK(same_bits(mine, in_process<T>(comm.size(), n, op)));
        }
    }
}

TEST_CASE("mpi broadcast copies the root's data; a bad root is refused on every rank") {
    dist::mpi_communicator& comm = world();
    const int root = comm.size() - 1;
    std::vector<double> mine = data_of<double>(comm.rank(), 1001);
    comm.broadcast(std::span<double>(mine), root);
    CHECK(same_bits(mine, data_of<double>(root, 1001)));
    std::vector<float> f(3, static_cast<float>(comm.rank()));
    comm.broadcast(std::span<float>(f), 0);
    CHECK(f == std::vector<float>(3, 0.0f));
    CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(f), comm.size()), doctest::Contains("no root rank"), dl::error);
    comm.barrier();
}

TEST_CASE("mpi collectives with lengths that differ between ranks throw on every rank, and the group goes on") {
    dist::mpi_communicator& comm = world();
    std::vector<float> uneven(static_cast<std::size_t>(3 + comm.rank()), 1.0f);
    CHECK_THROWS_WITH_AS(comm.allreduce(std::span<float>(uneven), dist::reduce_op::sum),
                         doctest::Contains("every rank must pass the same length"), dl::error);
    CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(uneven), 0), doctest::Contains("every rank must pass the same length"),
                         dl::error);
    std::vector<float> even(4, 1.0f);
    comm.allreduce(std::span<float>(even), dist::reduce_op::sum);
    CHECK(even == std::vector<float>(4, static_cast<float>(comm.size())));
}

TEST_CASE("mpi data-parallel training: one replica per process, every rank's model the same, as one graph on the whole batch") {
    dist::mpi_communicator& comm = world();
    auto make_model = [](dl::Context& ctx) {
        return dl::nn::sequential{dl::nn::linear<float>(6, 8, true, ctx), dl::nn::relu{}, dl::nn::linear<float>(8, 3, true, ctx)};
    };
    auto labels = [](std::int64_t n, dl::Context& ctx) {
        Tensor<std::int64_t> y({n}, ctx);
        for (std::int64_t i = 0; i < n; ++i) y(i) = (i * 5 + 1) % 3;
        return y;
    };
    auto loss_of = [](auto& model) {
        return [&model](const Tensor<float>& x, const Tensor<std::int64_t>& y) { return dl::nn::cross_entropy(model(x), y); };
    };
    // Each process: its own model (seeded by rank: train_distributed starts all from rank 0's), and the
    // reference, rank 0's model trained by one graph on the whole batch.
    dl::Context ctx({.seed = 7 + static_cast<std::uint64_t>(comm.rank()), .threads = 1}), one_ctx({.seed = 7, .threads = 1});
    auto model = make_model(ctx);
    auto one_model = make_model(one_ctx);
    dl::nn::sgd<float> opt(dl::nn::parameters(model), {.lr = 0.1, .momentum = 0.9});
    dl::nn::sgd<float> one_opt(dl::nn::parameters(one_model), {.lr = 0.1, .momentum = 0.9});
    auto step = dist::train_distributed(comm, loss_of(model), opt, dl::uniform<float>({2, 6}, -1, 1, ctx), labels(2, ctx));
    auto one = dl::graph::train(loss_of(one_model), one_opt, dl::uniform<float>({2, 6}, -1, 1, one_ctx), labels(2, one_ctx));
    const int ranks = comm.size();
    for (std::int64_t batch : {8, 5, 9}) {
        CAPTURE(batch);
        const Tensor<float> x = dl::uniform<float>({batch, 6}, -1, 1, one_ctx);  // the same on every rank
        const Tensor<std::int64_t> y = labels(batch, one_ctx);
        const std::int64_t begin = batch * comm.rank() / ranks, end = batch * (comm.rank() + 1) / ranks;
        const float loss = step(x.slice(0, begin, end).contiguous(), y.slice(0, begin, end).contiguous()).item();
        CHECK(loss == doctest::Approx(one(x, y).item()).epsilon(1e-5));
    }
    const auto mine = dl::nn::parameters(model), reference = dl::nn::parameters(one_model);
    for (std::size_t i = 0; i < mine.size(); ++i) {
        std::vector<float> values(mine[i].data(), mine[i].data() + mine[i].numel()), rank_0 = values;
        comm.broadcast(std::span<float>(rank_0), 0);
        CHECK(same_bits(values, rank_0));
        for (std::int64_t k = 0; k < mine[i].numel(); ++k)
            REQUIRE(mine[i].data()[k] == doctest::Approx(reference[i].data()[k]).epsilon(1e-5));
    }
}

int main(int argc, char** argv) {
    const dist::mpi_session session(&argc, &argv);
    doctest::Context tests(argc, argv);
    const int failed = tests.run();
    // A rank whose tests failed must not leave its peers waiting in a collective: all agree here.
    int any = failed != 0;
    MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}
