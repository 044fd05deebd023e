#pragma once
// What the parameter-server suites share.
#include <dl/ps.hpp>

#include <poll.h>

#include <array>
#include <atomic>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace dl_test {

/// The dl::error a call's future ends with, or "" when it succeeds.
inline std::string error_of(std::future<void> f) {
    try {
        f.get();
    } catch (const dl::error& e) {
        return e.what();
    }
    return "";
}

/// A TCP proxy on 127.0.0.1 in front of a server without a secret that cuts its first connection
/// as soon as the server's reply to the first request comes back, before passing it on: the request was carried
/// out, its reply is lost. on_cut runs then, before a later connection is served (a test restarts
/// the server there); later connections pass through both ways, one at a time. It stops with the object.
class reply_cutting_proxy {
public:
    explicit reply_cutting_proxy(std::function<std::uint16_t()> upstream_port, std::function<void()> on_cut = {})
        : upstream_port_(std::move(upstream_port)), on_cut_(std::move(on_cut)) {
        thread_ = std::thread([this] { run(); });
    }
    ~reply_cutting_proxy() {
        stop_ = true;
        thread_.join();
    }
    [[nodiscard]] std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
    /// Connections cut so far; once it reads 1, what on_cut did is visible.
    [[nodiscard]] int cuts() const { return cuts_.load(std::memory_order_acquire); }

private:
    using tcp = boost::asio::ip::tcp;

    /// Waits up to 50 ms for fd to be readable.
    static bool readable(int fd) {
        pollfd p{fd, POLLIN, 0};
        return ::poll(&p, 1, 50) > 0;
    }
    static void read_frame(tcp::socket& from, std::vector<char>& frame) {
        frame.resize(dl::ps::header_bytes);
        boost::asio::read(from, boost::asio::buffer(frame));
        dl::ps::frame_header h;
        std::memcpy(&h, frame.data(), sizeof h);
        frame.resize(dl::ps::header_bytes + h.payload_bytes);
        boost::asio::read(from, boost::asio::buffer(frame.data() + dl::ps::header_bytes, h.payload_bytes));
    }
    void run() {
        for (bool first = true; !stop_;) {
            if (!readable(acceptor_.native_handle())) continue;
            tcp::socket down(io_), up(io_);
            boost::system::error_code ec;
            acceptor_.accept(down, ec);
            if (ec) continue;
            up.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), upstream_port_()), ec);
            if (ec) continue;  // the client sees its connection closed, and retries
            try {
                if (first) {
                    std::vector<char> frame;
                    read_frame(up, frame);  // the server's hello (of a server without a secret)
                    boost::asio::write(down, boost::asio::buffer(frame));
                    read_frame(down, frame);
                    boost::asio::write(up, boost::asio::buffer(frame));
                    read_frame(up, frame);  // the reply: dropped
                    first = false;
                    down.close();
                    up.close();
                    if (on_cut_) on_cut_();
                    cuts_.fetch_add(1, std::memory_order_release);
                    continue;
                }
                pump(down, up);
            } catch (const boost::system::system_error&) {
                // a side closed: serve the next connection
            }
        }
    }
    void pump(tcp::socket& a, tcp::socket& b) {
        std::array<char, 65536> buffer;
        while (!stop_) {
            pollfd p[2] = {{a.native_handle(), POLLIN, 0}, {b.native_handle(), POLLIN, 0}};
            if (::poll(p, 2, 50) <= 0) continue;
            for (int i = 0; i < 2; ++i) {
                if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                tcp::socket& from = i == 0 ? a : b;
                tcp::socket& to = i == 0 ? b : a;
                const std::size_t n = from.read_some(boost::asio::buffer(buffer));  // throws at the end
                boost::asio::write(to, boost::asio::buffer(buffer.data(), n));
            }
        }
    }

    std::function<std::uint16_t()> upstream_port_;
    std::function<void()> on_cut_;
    boost::asio::io_context io_;
    tcp::acceptor acceptor_{io_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)};
    std::atomic<bool> stop_{false};
    std::atomic<int> cuts_{0};
    std::thread thread_;
};

}  // namespace dl_test
