// The parameter server: pull and push of 4096 ids of dim 64 over loopback TCP against one server
// process with 2 shard threads holding 1M rows (Adagrad), the same pull in-process, and the memory a
// stored row costs. Latency is measured per request (one request in flight: p50/p99 are what a
// training step waiting for its rows sees).
//
// The server is this binary forked before the benchmarks start (so it is a separate process, as the
// issue's setup asks, with no threads of the parent). ps_push_adagrad_wal runs the same push against a
// second, durable server (a data dir, write-ahead log with the default 2 ms group commit) holding
// 100k rows: what an acknowledged-means-on-disk push costs.
#include <benchmark/benchmark.h>

#include <dl/ps.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

constexpr std::uint32_t table_id = 1, dim = 64;
// The TCP benchmarks authenticate as a deployment would (one handshake per connection).
const std::string bench_secret = "bench_ps shared secret";
constexpr std::uint64_t stored_rows = 1'000'000;

dl::ps::table_config adagrad_table(std::uint32_t d) {
    dl::ps::table_config c;
    c.id = table_id;
    c.dim = d;
    c.optimizer.kind = dl::ps::optimizer_kind::adagrad;
    return c;
}

/// Pushes a zero-free gradient for ids 0 .. rows-1, so every row is stored (with its Adagrad state).
void fill(dl::ps::client& c, std::uint64_t rows, std::uint32_t d) {
    constexpr std::size_t batch = 8192;
    std::vector<std::uint64_t> ids(batch);
    std::vector<float> grads(batch * d, 0.01f);
    for (std::uint64_t first = 0; first < rows; first += batch) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(batch, rows - first));
        for (std::size_t i = 0; i < n; ++i) ids[i] = first + i;
        c.push(table_id, std::span(ids).first(n), std::span(grads).first(n * d)).get();
    }
}

int server_port = 0, durable_port = 0;
constexpr std::uint64_t durable_rows = 100'000;

/// Runs `request` once per iteration, timing each; reports rows/s and the latency percentiles.
template <class Request>
void measure(benchmark::State& state, std::size_t ids_per_request, Request&& request) {
    std::vector<double> ms;
    ms.reserve(1 << 16);
    for (auto _ : state) {
        const auto start = std::chrono::steady_clock::now();
        request();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ms.begin(), ms.end());
    const auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(q * static_cast<double>(ms.size())))]; };
    state.counters["rows_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * ids_per_request), benchmark::Counter::kIsRate);
    state.counters["p50_ms"] = at(0.50);
    state.counters["p99_ms"] = at(0.99);
}

/// Random stored ids, a fresh set per request (drawn before timing).
struct id_batches {
    explicit id_batches(std::size_t n) : ids(64, std::vector<std::uint64_t>(n)) {
        std::mt19937_64 rng(7);
        for (auto& b : ids)
            for (auto& id : b) id = rng() % stored_rows;
    }
    std::span<const std::uint64_t> next() { return ids[i++ % ids.size()]; }
    std::vector<std::vector<std::uint64_t>> ids;
    std::size_t i = 0;
};

dl::ps::client& tcp_client() {
    static dl::ps::client c(dl::ps::client_options{.servers = {"127.0.0.1:" + std::to_string(server_port)}, .timeout = std::chrono::milliseconds(10000), .secret = bench_secret});
    return c;
}

void ps_pull(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    id_batches batches(n);
    std::vector<float> out(n * dim);
    auto& c = tcp_client();
    measure(state, n, [&] { c.pull(table_id, batches.next(), out).get(); });
}

void ps_push_adagrad(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    id_batches batches(n);
    std::vector<float> grads(n * dim, 1e-3f);
    auto& c = tcp_client();
    measure(state, n, [&] { c.push(table_id, batches.next(), grads).get(); });
}

void ps_push_adagrad_wal(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    static dl::ps::client c(dl::ps::client_options{.servers = {"127.0.0.1:" + std::to_string(durable_port)}, .timeout = std::chrono::milliseconds(10000), .secret = bench_secret});
    std::vector<std::vector<std::uint64_t>> batches(64, std::vector<std::uint64_t>(n));
    std::mt19937_64 rng(9);
    for (auto& b : batches)
        for (auto& id : b) id = rng() % durable_rows;
    std::vector<float> grads(n * dim, 1e-3f);
    std::size_t i = 0;
    measure(state, n, [&] { c.push(table_id, batches[i++ % batches.size()], grads).get(); });
}

void ps_embedded_pull(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    static dl::ps::service svc({.threads = 2});
    static dl::ps::client c(svc);
    static const bool filled = [] {
        c.create_table(adagrad_table(dim)).get();
        fill(c, stored_rows, dim);
        return true;
    }();
    (void)filled;
    id_batches batches(n);
    std::vector<float> out(n * dim);
    measure(state, n, [&] { c.pull(table_id, batches.next(), out).get(); });
}

/// Heap bytes per stored row (slabs, map) with Adagrad state, against the raw 4·dim + 4·dim bytes.
void ps_bytes_per_row(benchmark::State& state) {
    const auto d = static_cast<std::uint32_t>(state.range(0));
    dl::ps::table_stats stats{};
    for (auto _ : state) {
        dl::ps::service svc({.threads = 2});
        dl::ps::client c(svc);
        c.create_table(adagrad_table(d)).get();
        fill(c, stored_rows, d);
        stats = c.stats(table_id).get();
    }
    const double raw = 8.0 * d;
    state.counters["bytes_per_row"] = static_cast<double>(stats.reserved_bytes) / static_cast<double>(stats.rows);
    state.counters["limit"] = 1.15 * raw + 16;  // the bound: 1.15 × raw + 16 B of metadata
}

BENCHMARK(ps_pull)->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(ps_push_adagrad)->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(ps_push_adagrad_wal)->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(ps_embedded_pull)->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(ps_bytes_per_row)->Arg(16)->Arg(64)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

/// A server process: a 2-thread service behind TCP on an ephemeral port (durable when data_dir is
/// given), told to the parent through a pipe; it runs until killed.
[[noreturn]] void run_server(int port_pipe, const std::string& data_dir) {
    dl::ps::service_options options{.threads = 2};
    options.data_dir = data_dir;
    dl::ps::service svc(options);
    dl::ps::server srv(svc, {.secret = bench_secret});
    const std::uint16_t port = srv.port();
    if (write(port_pipe, &port, sizeof port) != sizeof port) _exit(1);
    close(port_pipe);
    for (;;) pause();
}

/// Forks a server process; returns its pid and port (pid 0 on failure).
std::pair<pid_t, std::uint16_t> start_server(const std::string& data_dir) {
    int fds[2];
    if (pipe(fds) != 0) return {0, 0};
    const pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        run_server(fds[1], data_dir);
    }
    close(fds[1]);
    std::uint16_t port = 0;
    const bool ok = read(fds[0], &port, sizeof port) == sizeof port;
    close(fds[0]);
    return {ok ? child : 0, port};
}

}  // namespace

int main(int argc, char** argv) {
    const std::string data_dir = "/tmp/dl_bench_ps_" + std::to_string(getpid());
    const auto [child, port] = start_server("");
    const auto [durable_child, port2] = start_server(data_dir);
    if (child == 0 || durable_child == 0) {
        std::fprintf(stderr, "bench_ps: a server process did not start\n");
        return 1;
    }
    server_port = port;
    durable_port = port2;
    {
        auto& c = tcp_client();
        c.create_table(adagrad_table(dim)).get();
        fill(c, stored_rows, dim);
        dl::ps::client d(dl::ps::client_options{.servers = {"127.0.0.1:" + std::to_string(durable_port)}, .timeout = std::chrono::milliseconds(10000), .secret = bench_secret});
        d.create_table(adagrad_table(dim)).get();
        fill(d, durable_rows, dim);
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    for (pid_t p : {child, durable_child}) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
    }
    std::filesystem::remove_all(data_dir);
    return 0;
}
