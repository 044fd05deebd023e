#pragma once
// The parameter server's wire protocol: length-prefixed little-endian frames.
//
//   header (32 bytes)  magic "DLPS" u32 | version u16 (1 or 2) | op u16 | request id u64 | table u32 |
//                      status u32 (0 in requests; 0 = ok in replies) | payload bytes u32 | reserved u32 = 0
//   payload            per op, below; an error reply carries a UTF-8 message
//
// Every field is checked on receive (parse_header, the decode_* functions): a frame that fails gets
// an error reply or, when the stream cannot be trusted any more (bad magic, version, oversized
// payload), a closed connection. No check allocates more than max_payload bytes.
//
// Version 2 carries Adam's beta1 and beta2 as f64 in a table config; a version 1 frame (f32) is
// still read, and its reply carries version 1. Every connection starts with the server's hello
// (op::hello): a client of version 1, which does not expect it, cannot talk to this server.
#include <bit>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "table.hpp"

namespace dl::ps {

static_assert(std::endian::native == std::endian::little, "dl::ps frames are little-endian on the wire and in memory");

inline constexpr std::uint32_t frame_magic = 0x53504C44u;  // "DLPS" read as little-endian bytes
inline constexpr std::uint16_t protocol_version = 2;
inline constexpr std::uint16_t oldest_protocol_version = 1;
inline constexpr std::size_t header_bytes = 32;
inline constexpr std::uint32_t default_max_payload = 256u << 20;

enum class op : std::uint16_t {
    create_table = 1,  ///< payload: encoded table_config
    pull = 2,          ///< payload: ids u64[n]; reply: dim u32, n u32, rows f32[n·dim]
    push = 3,          ///< payload: push_header, [push_key], ids u64[n], grads f32[n·dim], [shows u32[n], clicks u32[n]]
    stats = 4,         ///< reply: table_stats
    grow_dim = 5,      ///< payload: new dim u32
    checkpoint = 6,    ///< payload: kind u32 (0 full, 1 incremental); reply: checkpoint sequence u64
    export_table = 7,  ///< payload: path bytes (server side, inside its data dir); reply: rows u64
    /// The server's first frame: payload a nonce when it has a secret (auth.hpp), else empty. The
    /// client answers a nonce with hello, payload HMAC-SHA256; the server replies hello, status ok or
    /// unauthorized (then closes). Nothing else is read from a client before that.
    hello = 8,
};

enum class status : std::uint32_t {
    ok = 0,
    malformed = 1,      ///< sizes or fields inconsistent
    unknown_op = 2,
    unknown_table = 3,
    table_exists = 4,   ///< create_table of an id with a different config
    wrong_dim = 5,
    non_finite = 6,     ///< NaN or Inf in a gradient
    too_large = 7,
    failed = 8,         ///< the server could not carry out a valid request (disk full, ...)
    unavailable = 9,    ///< the server is shutting down
    unauthorized = 10,  ///< the handshake failed: no or a wrong answer to the server's nonce
};

[[nodiscard]] constexpr std::string_view to_string(status s) noexcept {
    switch (s) {
    case status::ok: return "ok";
    case status::malformed: return "malformed request";
    case status::unknown_op: return "unknown op";
    case status::unknown_table: return "unknown table";
    case status::table_exists: return "table exists with another config";
    case status::wrong_dim: return "wrong dimension";
    case status::non_finite: return "non-finite gradient";
    case status::too_large: return "request too large";
    case status::failed: return "server failure";
    case status::unavailable: return "server unavailable";
    case status::unauthorized: return "unauthorized";
    }
    return "unknown status";
}

[[nodiscard]] constexpr bool known_op(std::uint16_t o) noexcept { return o >= 1 && o <= 8; }

struct frame_header {
    std::uint32_t magic = frame_magic;
    std::uint16_t version = protocol_version;
    std::uint16_t op = 0;
    std::uint64_t request_id = 0;
    std::uint32_t table = 0;
    std::uint32_t status = 0;
    std::uint32_t payload_bytes = 0;
    std::uint32_t reserved = 0;
};
static_assert(sizeof(frame_header) == header_bytes && std::is_trivially_copyable_v<frame_header>);

/// What receiving a header decided.
enum class header_verdict {
    ok,
    reject,  ///< answer with an error reply (status in `error`) after skipping nothing: the payload is read and dropped
    close,   ///< the stream is out of step or hostile: close the connection
};

struct parsed_header {
    frame_header header;
    header_verdict verdict;
    status error = status::ok;
    std::string reason;
};

/// Decodes and checks a received header. An unknown op with a sane header is rejected (its payload is
/// read and dropped, the connection lives on); a bad magic, version, reserved field or a payload over
/// max_payload closes the connection: nothing after it can be trusted to be a frame boundary, and an
/// oversized length must not make anyone allocate it.
[[nodiscard]] inline parsed_header parse_header(std::span<const std::byte, header_bytes> bytes, std::uint32_t max_payload) {
    parsed_header p{};
    std::memcpy(&p.header, bytes.data(), header_bytes);
    const frame_header& h = p.header;
    auto close = [&](std::string why) {
        p.verdict = header_verdict::close;
        p.error = status::malformed;
        p.reason = std::move(why);
        return p;
    };
    if (h.magic != frame_magic) return close("bad magic " + std::to_string(h.magic));
    if (h.version < oldest_protocol_version || h.version > protocol_version) return close("unsupported protocol version " + std::to_string(h.version));
    if (h.reserved != 0) return close("reserved header field is not zero");
    if (h.payload_bytes > max_payload) {
        p = close("payload of " + std::to_string(h.payload_bytes) + " bytes exceeds the limit of " + std::to_string(max_payload));
        p.error = status::too_large;
        return p;
    }
    if (!known_op(h.op)) {
        p.verdict = header_verdict::reject;
        p.error = status::unknown_op;
        p.reason = "unknown op " + std::to_string(h.op);
        return p;
    }
    p.verdict = header_verdict::ok;
    return p;
}

/// Bytes of a frame: a vector whose resize leaves new bytes uninitialised, since a frame is written in
/// full right after (zeroing a 1 MB pull reply first costs as much as filling it).
template <class T>
struct uninitialized_allocator : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = uninitialized_allocator<U>;
    };
    uninitialized_allocator() = default;
    template <class U>
    uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}
    template <class U>
    void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
        ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
        std::construct_at(p, std::forward<Args>(args)...);
    }
};
using frame_bytes = std::vector<std::byte, uninitialized_allocator<std::byte>>;

// --- payload encoding: a bounds-checked cursor; reading past the end throws decode_error ---

/// Bytes that do not decode: a dl::error (what() says "dl::ps: " + reason) with the status to reply.
struct decode_error : dl::error {
    decode_error(status c, std::string why) : dl::error("dl::ps: " + why), code(c), reason(std::move(why)) {}
    status code;
    std::string reason;
};

class byte_writer {
public:
    explicit byte_writer(frame_bytes& out) : out_(out) {}
    template <class T>
    void put(const T& value) {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto* p = reinterpret_cast<const std::byte*>(&value);
        out_.insert(out_.end(), p, p + sizeof(T));
    }
    template <class T>
    void put_span(std::span<const T> values) {
        const auto* p = reinterpret_cast<const std::byte*>(values.data());
        out_.insert(out_.end(), p, p + values.size_bytes());
    }

private:
    frame_bytes& out_;
};

class byte_reader {
public:
    explicit byte_reader(std::span<const std::byte> in) : in_(in) {}
    template <class T>
    T get() {
        T value;
        std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
        return value;
    }
    /// The next n elements of T, in place (no copy). The caller checked n against the payload size.
    template <class T>
    std::span<const T> view(std::size_t n) {
        if (n > remaining() / sizeof(T)) throw decode_error{status::malformed, "payload ends inside an array"};
        const auto bytes = take(n * sizeof(T));
        return {reinterpret_cast<const T*>(bytes.data()), n};
    }
    [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - at_; }
    void expect_end() const {
        if (remaining() != 0) throw decode_error{status::malformed, std::to_string(remaining()) + " unexpected trailing payload bytes"};
    }

private:
    std::span<const std::byte> take(std::size_t n) {
        if (n > remaining()) throw decode_error{status::malformed, "payload ends early"};
        const auto s = in_.subspan(at_, n);
        at_ += n;
        return s;
    }
    std::span<const std::byte> in_;
    std::size_t at_ = 0;
};

// Arrays of u64/f32 are read in place from the frame buffer: the buffers are allocated by
// frame_bytes at new-alignment and the payload starts 32 bytes in, so they are aligned.

/// A table config as version 2 writes it: u32 dim, u32 initializer, f32 scale, u64 seed, u32 optimizer,
/// f32 lr, eps, initial accumulator, f64 beta1, beta2, f32 beta, l1, l2, u32 admit_after, u32 ttl,
/// u64 memory budget. (Version 1: the same with f32 beta1 and beta2.)
inline void encode(byte_writer& w, const table_config& c) {
    w.put(c.dim);
    w.put(static_cast<std::uint32_t>(c.init.kind));
    w.put(c.init.scale);
    w.put(c.seed);
    const optimizer_config& o = c.optimizer;
    w.put(static_cast<std::uint32_t>(o.kind));
    for (float f : {o.lr, o.eps, o.initial_accumulator}) w.put(f);
    w.put(o.beta1);
    w.put(o.beta2);
    for (float f : {o.beta, o.l1, o.l2}) w.put(f);
    w.put(c.admit_after);
    w.put(c.ttl_steps);
    w.put(c.memory_budget);
}

/// A version 1 f32 hyper-parameter as the decimal it was most likely written as (the shortest that
/// rounds to it): 0.999f comes back as 0.999, not as 0.99900001287.
[[nodiscard]] inline double widen_decimal(float f) {
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, f).ptr;
    double d = f;
    std::from_chars(text, end, d);
    return d;
}

/// Reads a table config written by protocol `version` (the id comes from the frame header) and
/// validates it.
[[nodiscard]] inline table_config decode_table_config(byte_reader& r, std::uint32_t id, std::uint16_t version = protocol_version) {
    table_config c;
    c.id = id;
    c.dim = r.get<std::uint32_t>();
    const auto init_kind = r.get<std::uint32_t>();
    c.init.scale = r.get<float>();
    c.seed = r.get<std::uint64_t>();
    const auto opt_kind = r.get<std::uint32_t>();
    optimizer_config& o = c.optimizer;
    for (float* f : {&o.lr, &o.eps, &o.initial_accumulator}) *f = r.get<float>();
    for (double* f : {&o.beta1, &o.beta2}) *f = version >= 2 ? r.get<double>() : widen_decimal(r.get<float>());
    for (float* f : {&o.beta, &o.l1, &o.l2}) *f = r.get<float>();
    c.admit_after = r.get<std::uint32_t>();
    c.ttl_steps = r.get<std::uint32_t>();
    c.memory_budget = r.get<std::uint64_t>();
    r.expect_end();
    if (init_kind > 2 || opt_kind > 4) throw decode_error{status::malformed, "unknown initializer or optimizer kind"};
    c.init.kind = static_cast<initializer_kind>(init_kind);
    o.kind = static_cast<optimizer_kind>(opt_kind);
    try {
        validate(c);
    } catch (const dl::error& e) {
        throw decode_error{status::malformed, e.what()};
    }
    return c;
}

/// The fixed part of a push payload.
struct push_header {
    std::uint32_t count = 0;
    std::uint32_t dim = 0;
    std::uint32_t flags = 0;  ///< bit 0: shows and clicks follow the gradients; bit 1: a push_key follows this header
    std::uint32_t reserved = 0;
};
inline constexpr std::uint32_t push_has_counts = 1;
inline constexpr std::uint32_t push_has_key = 2;

/// Which push this is: a client's retries of a push carry its key, and a server applies a keyed push
/// once however often it arrives (the write-ahead log and checkpoints keep the keys, so also across
/// a restart). A push whose reply was lost may have been applied: only the key makes a retry safe.
struct push_key {
    std::uint64_t client = 0;    ///< random per client object; 0: no key
    std::uint64_t sequence = 0;  ///< the client's count of pushes
    friend bool operator==(const push_key&, const push_key&) = default;
};

/// A decoded push, viewing the payload.
struct push_request {
    std::span<const std::uint64_t> ids;
    std::span<const float> grads;
    std::span<const std::uint32_t> shows, clicks;  ///< empty when the push carries none
    std::uint32_t dim = 0;
    push_key key{};  ///< client 0: none
};

[[nodiscard]] inline push_request decode_push(std::span<const std::byte> payload) {
    byte_reader r(payload);
    const auto h = r.get<push_header>();
    if (h.reserved != 0 || (h.flags & ~(push_has_counts | push_has_key)) != 0) throw decode_error{status::malformed, "unknown push flags"};
    if (h.dim == 0) throw decode_error{status::malformed, "push of dimension 0"};
    push_key key{};
    if (h.flags & push_has_key) {
        key = r.get<push_key>();
        if (key.client == 0) throw decode_error{status::malformed, "push key of client 0"};
    }
    // Sizes are checked against what is there before any multiplication can overflow.
    const std::uint64_t per_id = 8 + std::uint64_t{4} * h.dim + ((h.flags & push_has_counts) ? 8 : 0);
    if (std::uint64_t{h.count} * per_id != r.remaining())
        throw decode_error{status::malformed, "push of " + std::to_string(h.count) + " ids of dim " + std::to_string(h.dim) + " does not match its " +
                                                  std::to_string(r.remaining()) + " payload bytes"};
    push_request p;
    p.key = key;
    p.dim = h.dim;
    p.ids = r.view<std::uint64_t>(h.count);
    p.grads = r.view<float>(std::size_t{h.count} * h.dim);
    if (h.flags & push_has_counts) {
        p.shows = r.view<std::uint32_t>(h.count);
        p.clicks = r.view<std::uint32_t>(h.count);
    }
    r.expect_end();
    return p;
}

/// Appends the push payload of the rows at positions `pick` of ids/grads (and shows/clicks when given).
/// The client sends each server its part this way; the write-ahead log stores each shard's part so.
inline void encode_push(frame_bytes& out, std::span<const std::uint32_t> pick, std::span<const std::uint64_t> ids, std::span<const float> grads,
                        std::span<const std::uint32_t> shows, std::span<const std::uint32_t> clicks, std::uint32_t dim, push_key key = {}) {
    const auto n = static_cast<std::uint32_t>(pick.size());
    const bool counts = !shows.empty(), keyed = key.client != 0;
    const std::size_t start = out.size();
    out.resize(start + sizeof(push_header) + (keyed ? sizeof key : 0) + n * (8 + std::size_t{4} * dim + (counts ? 8 : 0)));
    std::byte* at = out.data() + start;
    auto put = [&](const void* data, std::size_t bytes) {
        std::memcpy(at, data, bytes);
        at += bytes;
    };
    const push_header h{n, dim, (counts ? push_has_counts : 0u) | (keyed ? push_has_key : 0u), 0};
    put(&h, sizeof h);
    if (keyed) put(&key, sizeof key);
    for (std::uint32_t p : pick) put(&ids[p], 8);
    for (std::uint32_t p : pick) put(grads.data() + std::size_t{p} * dim, dim * sizeof(float));
    if (counts) {
        for (std::uint32_t p : pick) put(&shows[p], 4);
        for (std::uint32_t p : pick) put(&clicks[p], 4);
    }
}

[[nodiscard]] inline std::span<const std::uint64_t> decode_pull(std::span<const std::byte> payload) {
    if (payload.size() % 8 != 0) throw decode_error{status::malformed, "pull payload of " + std::to_string(payload.size()) + " bytes is not a whole number of ids"};
    byte_reader r(payload);
    return r.view<std::uint64_t>(payload.size() / 8);
}

/// Per-table figures a server reports (stats op).
struct table_stats {
    std::uint64_t rows = 0;
    std::uint64_t live_bytes = 0;      ///< rows and map: what the memory budget limits
    std::uint64_t reserved_bytes = 0;  ///< heap held: slabs with free rows, map, admission sketch
    std::uint64_t evicted = 0;
    std::uint64_t step = 0;            ///< push requests applied
    std::uint32_t dim = 0;
    std::uint32_t reserved = 0;
};

/// The first non-finite value of a gradient, or npos.
[[nodiscard]] inline std::size_t first_non_finite(std::span<const float> g) noexcept {
    // One pass of a branch-free test the compiler vectorises; the position only when one is found.
    bool bad = false;
    for (float v : g) bad |= !(std::abs(v) <= std::numeric_limits<float>::max());
    if (!bad) return std::string::npos;
    for (std::size_t i = 0; i < g.size(); ++i)
        if (!std::isfinite(g[i])) return i;
    return std::string::npos;
}

}  // namespace dl::ps
