// Record files: CRC32C against RFC 3720's vectors, round trips, every kind of damage detected (fail or
// skip), and CSR blocks of sparse ids read as views into the reader's buffer.
#include "support.hpp"

#include <dl/data.hpp>

#include <filesystem>
#include <fstream>

namespace {

namespace fs = std::filesystem;

fs::path temp_file(const std::string& name) {
    return fs::temp_directory_path() / ("dl_test_records_" + std::to_string(::getpid()) + "_" + name);
}

std::vector<char> read_all(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}
void write_all(const fs::path& p, const std::vector<char>& bytes) {
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}
std::string text(std::span<const std::byte> s) { return {reinterpret_cast<const char*>(s.data()), s.size()}; }

}  // namespace

TEST_CASE("CRC32C matches RFC 3720's test vectors on both paths") {
    const std::string digits = "123456789";
    CHECK(dl::data::crc32c(digits.data(), digits.size()) == 0xE3069283u);
    CHECK(dl::data::detail::crc32c_table_path(digits.data(), digits.size()) == 0xE3069283u);
    const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
    CHECK(dl::data::crc32c(zeros.data(), 32) == 0x8A9136AAu);
    CHECK(dl::data::crc32c(ones.data(), 32) == 0x62A8AB43u);
    std::vector<unsigned char> ascending(32);
    for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i);
    CHECK(dl::data::crc32c(ascending.data(), 32) == 0x46DD794Eu);
    // Both paths agree on every length (odd tails) and when continued in pieces.
    std::vector<unsigned char> bytes(1000);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
    for (std::size_t n : {0, 1, 7, 8, 9, 63, 1000}) {
        CAPTURE(n);
        CHECK(dl::data::crc32c(bytes.data(), n) == dl::data::detail::crc32c_table_path(bytes.data(), n));
    }
    const auto whole = dl::data::crc32c(bytes.data(), 1000);
    CHECK(dl::data::crc32c(bytes.data() + 13, 987, dl::data::crc32c(bytes.data(), 13)) == whole);
    CHECK(dl::data::mask_crc(0) == 0xa282ead8u);
}

TEST_CASE("records round trip in TFRecord framing: empty, small and large payloads") {
    const auto path = temp_file("round.rec");
    std::vector<std::string> payloads = {"hello", "", std::string(100000, 'x'), "last"};
    {
        dl::data::record_writer w(path);
        for (const auto& p : payloads) w.write(p);
        w.close();
        CHECK(w.records() == 4);
    }
    const auto bytes = read_all(path);
    std::uint64_t length = 0;
    std::memcpy(&length, bytes.data(), 8);
    CHECK(length == 5);  // little-endian uint64 length first, as TFRecord
    CHECK(std::string(bytes.data() + 12, 5) == "hello");
    dl::data::record_reader r(path);
    for (const auto& p : payloads) {
        const auto got = r.next();
        REQUIRE(got);
        CHECK(text(*got) == p);
        CHECK(reinterpret_cast<std::uintptr_t>(got->data()) % 16 == 0);
    }
    CHECK(!r.next());
    CHECK(r.records() == 4);
    fs::remove(path);
}

TEST_CASE("damaged records are detected: fail names record and offset, skip counts and goes on") {
    const auto path = temp_file("damaged.rec");
    {
        dl::data::record_writer w(path);
        for (const char* p : {"first", "second", "third"}) w.write(p);
    }
    auto bytes = read_all(path);
    const std::size_t second_payload = 8 + 4 + 5 + 4 + 8 + 4;  // after record 0 and record 1's header
    bytes[second_payload + 2] ^= 0x20;
    write_all(path, bytes);
    {
        dl::data::record_reader r(path);
        CHECK(text(*r.next()) == "first");
        const std::string m = dl_test::error_message([&] { (void)r.next(); });
        CHECK(m.find("damaged payload (CRC mismatch) in record 1") != std::string::npos);
        CHECK(m.find("at byte offset 21") != std::string::npos);
        CHECK(m.find(path.string()) != std::string::npos);
    }
    {
        dl::data::record_reader r(path, dl::data::on_corrupt::skip);
        CHECK(text(*r.next()) == "first");
        CHECK(text(*r.next()) == "third");
        CHECK(!r.next());
        CHECK(r.skipped() == 1);
    }
    // A damaged length cannot be skipped past.
    auto length_damaged = read_all(path);
    length_damaged[21] ^= 0x01;
    write_all(path, length_damaged);
    dl::data::record_reader skipping(path, dl::data::on_corrupt::skip);
    (void)skipping.next();
    CHECK(dl_test::error_message([&] { (void)skipping.next(); }).find("damaged record length") != std::string::npos);
    // An empty file is not a file of no records: it is a file whose writer never wrote.
    write_all(path, {});
    dl::data::record_reader empty(path);
    const std::string m = dl_test::error_message([&] { (void)empty.next(); });
    CHECK(m.find(path.string() + " is empty (0 bytes)") != std::string::npos);
    // Truncated in a header and in a payload.
    write_all(path, {bytes.begin(), bytes.begin() + 5});
    dl::data::record_reader short_header(path);
    CHECK(dl_test::error_message([&] { (void)short_header.next(); }).find("needs 12 bytes, 5 remain") != std::string::npos);
    write_all(path, {bytes.begin(), bytes.begin() + 14});
    dl::data::record_reader short_payload(path);
    CHECK(dl_test::error_message([&] { (void)short_payload.next(); }).find("declares 5 bytes") != std::string::npos);
    fs::remove(path);
    CHECK(dl_test::error_message([&] { dl::data::record_reader missing(path); }).find("cannot open") != std::string::npos);
}

TEST_CASE("CSR blocks of sparse ids: round trip through records, read as views, bad blocks rejected") {
    const auto path = temp_file("csr.rec");
    const std::vector<std::uint64_t> offsets = {0, 2, 2, 5}, ids = {7, 1ull << 40, 3, 3, 9};
    const std::vector<float> weights = {0.5f, 1, 2, 2, -1};
    {
        dl::data::record_writer w(path);
        w.write(dl::data::encode_csr(offsets, ids, weights));
        w.write(dl::data::encode_csr(offsets, ids));
    }
    dl::data::record_reader r(path);
    const auto first = *r.next();
    const auto v = dl::data::decode_csr(first);
    CHECK(v.rows() == 3);
    CHECK(std::vector<std::uint64_t>(v.offsets.begin(), v.offsets.end()) == offsets);
    CHECK(std::vector<std::uint64_t>(v.ids.begin(), v.ids.end()) == ids);
    CHECK(std::vector<float>(v.weights.begin(), v.weights.end()) == weights);
    // A view: the ids live inside the record's payload buffer.
    CHECK(reinterpret_cast<const std::byte*>(v.ids.data()) >= first.data());
    CHECK(reinterpret_cast<const std::byte*>(v.ids.data() + v.ids.size()) <= first.data() + first.size());
    CHECK(dl::data::decode_csr(*r.next()).weights.empty());

    auto block = dl::data::encode_csr(offsets, ids);
    CHECK(dl_test::error_message([&] { (void)dl::data::decode_csr(std::span(block).first(block.size() - 8)); })
              .find("need 88 bytes, the payload has 80") != std::string::npos);
    block[16 + 8] = std::byte{9};  // offsets[1] = 9 > offsets[2]
    CHECK(dl_test::error_message([&] { (void)dl::data::decode_csr(block); }).find("decrease at row 1") != std::string::npos);
    block[0] = std::byte{0};
    CHECK(dl_test::error_message([&] { (void)dl::data::decode_csr(block); }).find("bad magic") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::data::encode_csr(std::vector<std::uint64_t>{0, 3}, ids); })
              .find("end at the number of ids (5)") != std::string::npos);
    fs::remove(path);
}
