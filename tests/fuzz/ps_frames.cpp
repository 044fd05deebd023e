// libFuzzer target for the parameter server's frame parser: the input is a byte stream as a socket
// would deliver it. Every frame header is parsed; payloads of accepted headers go through the decoder
// of their op. Parsers may reject (decode_error, a close verdict) but never crash, read out of
// bounds, or accept sizes that disagree with the bytes. Built with clang (-fsanitize=fuzzer) by the
// fuzz.ps_frames ctest when clang++ is installed.
#include <dl/dist/ps/protocol.hpp>

#include <cstdlib>

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

void decode(dl::ps::op code, std::uint32_t table, std::span<const std::byte> payload) {
    using namespace dl::ps;
    try {
        switch (code) {
        case op::pull: {
            const auto ids = decode_pull(payload);
            check(ids.size() * 8 == payload.size());
            break;
        }
        case op::push: {
            const push_request p = decode_push(payload);
            const std::size_t counts = p.shows.empty() ? 0 : 8;
            check(p.dim > 0 && p.grads.size() == p.ids.size() * p.dim);
            check(16 + p.ids.size() * (8 + 4 * std::size_t{p.dim} + counts) == payload.size());
            break;
        }
        case op::create_table: {
            byte_reader r(payload);
            const table_config c = decode_table_config(r, table);
            check(c.dim > 0 && c.id == table);
            break;
        }
        default: break;
        }
    } catch (const decode_error& e) {
        check(e.code != status::ok && !e.reason.empty());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace dl::ps;
    constexpr std::uint32_t max_payload = 1 << 16;
    std::span<const std::byte> stream(reinterpret_cast<const std::byte*>(data), size);
    while (stream.size() >= header_bytes) {
        const parsed_header p = parse_header(stream.first<header_bytes>(), max_payload);
        if (p.verdict == header_verdict::close) return 0;  // the server hangs up here
        stream = stream.subspan(header_bytes);
        check(p.header.payload_bytes <= max_payload);
        if (p.header.payload_bytes > stream.size()) return 0;  // truncated: the server waits, then the peer closes
        // The server reads a payload into its own buffer (16-byte aligned), as here.
        frame_bytes payload(stream.begin(), stream.begin() + p.header.payload_bytes);
        stream = stream.subspan(p.header.payload_bytes);
        if (p.verdict == header_verdict::ok) decode(static_cast<op>(p.header.op), p.header.table, payload);
    }
    return 0;
}
