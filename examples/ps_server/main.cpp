// A parameter-server process: serves dl::ps tables over TCP until SIGINT or SIGTERM.
// Run: build/examples/ps_server (--secret-file FILE | --no-auth) [--port N] [--address A] [--threads N]
//      [--data DIR] [--group-commit-ms N] [--no-wal] [--checkpoint-seconds N]
//
// Clients must hold the secret in FILE (its first line; client_options::secret) before the server
// reads a request from them; --no-auth serves anyone who can reach the port. The address is
// 127.0.0.1 unless --address says otherwise.
//
// With --data the server is durable: it restores what DIR holds at start, acknowledges a push only
// after the write-ahead log holding it is synced (pushes arriving together share a sync;
// --group-commit-ms N also waits up to N ms for more to share it), takes a full
// checkpoint every --checkpoint-seconds (default 300; 0 = never) and a last one on SIGINT/SIGTERM.
// A restart on the same DIR must use the same --threads. It prints `listening on ADDRESS:PORT`
// once it accepts connections (--port 0, the default, lets the system pick one).
#include <dl/ps.hpp>

#include <boost/asio/signal_set.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

namespace {

struct settings {
    dl::ps::service_options service;
    dl::ps::server_options server;
    int checkpoint_seconds = 300;
};

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + std::string(flag));
            return argv[++i];
        };
        if (flag == "--port") s.server.port = static_cast<std::uint16_t>(std::stoul(value()));
        else if (flag == "--address") s.server.address = value();
        else if (flag == "--threads") s.service.threads = static_cast<unsigned>(std::stoul(value()));
        else if (flag == "--data") s.service.data_dir = value();
        else if (flag == "--group-commit-ms") s.service.group_commit = std::chrono::milliseconds(std::stol(value()));
        else if (flag == "--no-wal") s.service.write_ahead_log = false;
        else if (flag == "--checkpoint-seconds") s.checkpoint_seconds = std::stoi(value());
        else if (flag == "--secret-file") {
            const std::string path = value();
            std::ifstream in(path);
            if (!in || !std::getline(in, s.server.secret) || s.server.secret.empty())
                throw std::runtime_error("cannot read a secret from the first line of " + path);
        } else if (flag == "--no-auth") s.server.authenticate = false;
        else throw std::runtime_error("unknown flag " + std::string(flag) + " (see the top of examples/ps_server/main.cpp)");
    }
    if (s.service.threads == 0) throw std::runtime_error("--threads must be at least 1");
    if (s.server.authenticate && s.server.secret.empty())
        throw std::runtime_error("give --secret-file FILE (clients prove they hold it), or --no-auth to serve anyone who can reach the port");
    return s;
}

void checkpoint(dl::ps::service& svc) {
    std::promise<dl::ps::outcome> done;
    svc.checkpoint(true, [&](dl::ps::outcome o, std::uint64_t) { done.set_value(std::move(o)); });
    const auto o = done.get_future().get();
    if (!o.ok()) std::cerr << "ps_server: checkpoint failed: " << o.message << "\n";
}

}  // namespace

int main(int argc, char** argv) try {
    const settings s = parse(argc, argv);
    dl::ps::service svc(s.service);
    dl::ps::server srv(svc, s.server);
    std::cout << "listening on " << s.server.address << ":" << srv.port() << " with " << svc.shard_count() << " threads"
              << (s.service.data_dir.empty() ? "" : ", data in " + s.service.data_dir.string()) << std::endl;

    // The main thread waits for a signal or the next checkpoint time; the shard threads serve.
    boost::asio::io_context io;
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    bool stop = false;
    signals.async_wait([&](boost::system::error_code, int) { stop = true; });
    const bool durable = !s.service.data_dir.empty();
    while (!stop) {
        if (durable && s.checkpoint_seconds > 0) {
            io.run_for(std::chrono::seconds(s.checkpoint_seconds));
            if (!stop) checkpoint(svc);
        } else {
            io.run_one();
        }
    }
    srv.stop();
    if (durable) checkpoint(svc);
    std::cout << "stopped" << std::endl;
    return 0;
} catch (const std::exception& e) {
    std::cerr << "ps_server: " << e.what() << "\n";
    return 1;
}
