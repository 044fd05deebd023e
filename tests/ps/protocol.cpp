// The wire protocol's checks: every header field, every payload size rule, sizes that would overflow,
// and a bounded storm of random bytes through the parsers (they may only reject, never crash or read
// out of bounds: the sanitizer build runs this too).
#include "support.hpp"

#include <dl/ps.hpp>

#include <random>

namespace {

using namespace dl::ps;

std::array<std::byte, header_bytes> header_bytes_of(const frame_header& h) {
    std::array<std::byte, header_bytes> raw;
    std::memcpy(raw.data(), &h, header_bytes);
    return raw;
}

parsed_header parse(const frame_header& h, std::uint32_t max_payload = 1 << 20) { return parse_header(header_bytes_of(h), max_payload); }

template <class T>
void append(frame_bytes& out, const T& v) {
    byte_writer(out).put(v);
}

}  // namespace

TEST_CASE("a header is accepted only with the right magic, version, reserved field and a bounded payload") {
    frame_header ok;
    ok.op = static_cast<std::uint16_t>(op::pull);
    ok.payload_bytes = 64;
    CHECK(parse(ok).verdict == header_verdict::ok);

    frame_header h = ok;
    h.magic = 0x12345678;
    CHECK(parse(h).verdict == header_verdict::close);
    CHECK(parse(h).reason.find("bad magic") != std::string::npos);
    h = ok;
    h.version = protocol_version + 1;
    CHECK(parse(h).verdict == header_verdict::close);
    h.version = 0;
    CHECK(parse(h).verdict == header_verdict::close);
    h.version = 1;  // the version before f64 betas: still read
    CHECK(parse(h).verdict == header_verdict::ok);
    h = ok;
    h.reserved = 1;
    CHECK(parse(h).verdict == header_verdict::close);
    h = ok;
    h.payload_bytes = (1 << 20) + 1;
    CHECK(parse(h).verdict == header_verdict::close);
    CHECK(parse(h).error == status::too_large);
    h.payload_bytes = 0xFFFFFFFFu;
    CHECK(parse(h).verdict == header_verdict::close);
    // An unknown op in a sane header: rejected with a reply, the connection lives on.
    for (std::uint16_t code : {0, 9, 0xFFFF}) {
        h = ok;
        h.op = code;
        CHECK(parse(h).verdict == header_verdict::reject);
        CHECK(parse(h).error == status::unknown_op);
    }
}

TEST_CASE("push payloads: exact sizes, flags, and counts that would overflow are rejected before any allocation") {
    const std::vector<std::uint64_t> ids{1, 2};
    const std::vector<float> grads{1, 2, 3, 4, 5, 6};
    frame_bytes p;
    append(p, push_header{2, 3, 0, 0});
    byte_writer(p).put_span(std::span<const std::uint64_t>(ids));
    byte_writer(p).put_span(std::span<const float>(grads));
    const push_request r = decode_push(p);
    CHECK(r.dim == 3);
    CHECK(std::vector<std::uint64_t>(r.ids.begin(), r.ids.end()) == ids);
    CHECK(std::vector<float>(r.grads.begin(), r.grads.end()) == grads);
    CHECK(r.shows.empty());

    auto rejects = [](const frame_bytes& bytes, const char* why) {
        CAPTURE(why);
        try {
            (void)decode_push(bytes);
            FAIL("accepted");
        } catch (const decode_error& e) {
            CHECK(e.code == status::malformed);
        }
    };
    frame_bytes shorter(p.begin(), p.end() - 1);
    rejects(shorter, "one byte short");
    frame_bytes longer = p;
    longer.push_back(std::byte{0});
    rejects(longer, "one byte too many");
    frame_bytes flags = p;
    flags[8] = std::byte{2};
    rejects(flags, "unknown flag");
    frame_bytes huge;
    append(huge, push_header{0xFFFFFFFFu, 0xFFFFFFFFu, 1, 0});
    rejects(huge, "count x dim overflows");
    frame_bytes zero_dim;
    append(zero_dim, push_header{0, 0, 0, 0});
    rejects(zero_dim, "dim 0");
    frame_bytes counts_missing = p;
    counts_missing[8] = std::byte{1};  // says shows and clicks follow: they do not
    rejects(counts_missing, "counts flagged but absent");
    rejects(frame_bytes(7), "shorter than its fixed part");
}

TEST_CASE("pull payloads are whole ids; table configs round-trip and are validated") {
    frame_bytes ids(24);
    CHECK(decode_pull(ids).size() == 3);
    CHECK(decode_pull(frame_bytes{}).empty());
    CHECK_THROWS_AS((void)decode_pull(frame_bytes(23)), decode_error);

    table_config c;
    c.dim = 48;
    c.seed = 99;
    c.init = {initializer_kind::uniform, 0.25f};
    c.optimizer = {optimizer_kind::ftrl, 0.05f, 1e-9f, 0.1f, 0.8f, 0.99f, 2.0f, 0.01f, 0.02f};
    c.admit_after = 4;
    c.ttl_steps = 1000;
    c.memory_budget = 1 << 30;
    frame_bytes bytes;
    byte_writer w(bytes);
    encode(w, c);
    byte_reader r(bytes);
    const table_config back = decode_table_config(r, 17);
    CHECK(back.id == 17);
    CHECK(back.dim == 48);
    CHECK(back.seed == 99);
    CHECK(back.init.kind == initializer_kind::uniform);
    CHECK(back.optimizer.kind == optimizer_kind::ftrl);
    CHECK(back.optimizer.l2 == 0.02f);
    CHECK(back.admit_after == 4);
    CHECK(back.ttl_steps == 1000);
    CHECK(back.memory_budget == (1u << 30));

    // Adam's betas go as f64 (version 2); a version 1 config's f32 betas read as their decimals.
    c.optimizer = {};
    c.optimizer.kind = optimizer_kind::adam;
    c.optimizer.beta2 = 1 - 1e-9;
    frame_bytes adam;
    byte_writer wa(adam);
    encode(wa, c);
    byte_reader ra(adam);
    CHECK(decode_table_config(ra, 1).optimizer.beta2 == 1 - 1e-9);
    frame_bytes v1(adam.begin(), adam.begin() + 36);  // up to the betas
    const float betas[2] = {0.9f, 0.999f};
    v1.insert(v1.end(), reinterpret_cast<const std::byte*>(betas), reinterpret_cast<const std::byte*>(betas + 2));
    v1.insert(v1.end(), adam.begin() + 52, adam.end());
    byte_reader r1(v1);
    const table_config old = decode_table_config(r1, 1, 1);
    CHECK(old.optimizer.beta1 == 0.9);
    CHECK(old.optimizer.beta2 == 0.999);
    CHECK(old.memory_budget == (1u << 30));
    byte_reader r1_as_v2(v1);
    CHECK_THROWS_AS((void)decode_table_config(r1_as_v2, 1), decode_error);  // 8 bytes short

    frame_bytes truncated(bytes.begin(), bytes.end() - 1);
    byte_reader rt(truncated);
    CHECK_THROWS_AS((void)decode_table_config(rt, 1), decode_error);
    frame_bytes bad_kind = bytes;
    bad_kind[4] = std::byte{9};  // initializer kind
    byte_reader rk(bad_kind);
    CHECK_THROWS_AS((void)decode_table_config(rk, 1), decode_error);
    frame_bytes zero_dim = bytes;
    std::memset(zero_dim.data(), 0, 4);
    byte_reader rz(zero_dim);
    CHECK_THROWS_AS((void)decode_table_config(rz, 1), decode_error);
}

TEST_CASE("random bytes through every parser are rejected cleanly") {
    std::mt19937_64 rng(2024);
    const int rounds = dl_test::quick() ? 20000 : 100000;
    int accepted_headers = 0;
    for (int i = 0; i < rounds; ++i) {
        std::array<std::byte, header_bytes> raw;
        for (auto& b : raw) b = std::byte(rng());
        if (i % 2 == 0) {  // half of them with a valid prefix, so the later checks are reached too
            std::memcpy(raw.data(), &frame_magic, 4);
            std::memcpy(raw.data() + 4, &protocol_version, 2);
            std::memset(raw.data() + 28, 0, 4);
        }
        if (i % 4 == 0) {  // and a quarter with a known op and a small payload: accepted
            const auto code = static_cast<std::uint16_t>(1 + rng() % 7);
            const auto bytes = static_cast<std::uint32_t>(rng() % 5000);
            std::memcpy(raw.data() + 6, &code, 2);
            std::memcpy(raw.data() + 24, &bytes, 4);
        }
        const parsed_header p = parse_header(raw, 4096);
        if (p.verdict == header_verdict::ok) {
            ++accepted_headers;
            CHECK(p.header.payload_bytes <= 4096);
        }
        frame_bytes payload(rng() % 200);
        for (auto& b : payload) b = std::byte(rng());
        if (payload.size() >= 16 && i % 3 == 0) {  // a plausible push header over random data
            const push_header h{static_cast<std::uint32_t>(rng() % 8), static_cast<std::uint32_t>(rng() % 8), static_cast<std::uint32_t>(rng() % 2), 0};
            std::memcpy(payload.data(), &h, sizeof h);
        }
        try {
            const push_request r = decode_push(payload);
            CHECK(r.ids.size() * (8 + 4 * r.dim) + r.shows.size() * 8 + 16 == payload.size());
        } catch (const decode_error&) {
        }
        try {
            (void)decode_pull(payload);
        } catch (const decode_error&) {
        }
        try {
            byte_reader reader(payload);
            (void)decode_table_config(reader, 1);
        } catch (const decode_error&) {
        }
    }
    CHECK(accepted_headers > 0);
}

TEST_CASE("a push may carry a key: it round-trips, and a key of client 0 is rejected") {
    const std::vector<std::uint64_t> ids{3, 9};
    const std::vector<float> grads{1, 2, 3, 4};
    const std::vector<std::uint32_t> pick{0, 1};
    frame_bytes keyed;
    encode_push(keyed, pick, ids, grads, {}, {}, 2, push_key{0xABCDEFull, 42});
    const push_request p = decode_push(keyed);
    CHECK(p.key == push_key{0xABCDEFull, 42});
    CHECK(std::vector<std::uint64_t>(p.ids.begin(), p.ids.end()) == ids);
    CHECK(std::vector<float>(p.grads.begin(), p.grads.end()) == grads);
    frame_bytes plain;
    encode_push(plain, pick, ids, grads, {}, {}, 2);
    CHECK(plain.size() + sizeof(push_key) == keyed.size());
    CHECK(decode_push(plain).key.client == 0);
    frame_bytes zero = keyed;
    std::memset(zero.data() + sizeof(push_header), 0, 8);
    CHECK_THROWS_AS((void)decode_push(zero), decode_error);
    frame_bytes cut(keyed.begin(), keyed.begin() + sizeof(push_header) + 8);
    CHECK_THROWS_AS((void)decode_push(cut), decode_error);
}
