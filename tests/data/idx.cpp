// IDX files, raw and gzip: round trips, every kind of damage reported with the file and offset, and
// the real Fashion-MNIST files when Debian's package is installed.
#include "support.hpp"

#include <dl/data.hpp>

#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

/// A fresh temporary folder per test case, removed afterwards.
struct temp_dir {
    fs::path path;
    temp_dir() {
        path = fs::temp_directory_path() / ("dl_test_idx_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    static int& counter() {
        static int n = 0;
        return n;
    }
};

std::vector<unsigned char> idx_bytes(unsigned char type, const std::vector<std::uint32_t>& dims,
                                     const std::vector<unsigned char>& payload) {
    std::vector<unsigned char> b = {0, 0, type, static_cast<unsigned char>(dims.size())};
    for (auto d : dims)
        for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<unsigned char>(d >> shift));
    b.insert(b.end(), payload.begin(), payload.end());
    return b;
}

void write_raw(const fs::path& p, const std::vector<unsigned char>& bytes) {
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}
void write_gz(const fs::path& p, const std::vector<unsigned char>& bytes) {
    gzFile f = gzopen(p.string().c_str(), "wb");
    REQUIRE(f);
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
}

}  // namespace

TEST_CASE("IDX round trip, raw and gzip, uint8 and big-endian int32/float") {
    temp_dir dir;
    const std::vector<unsigned char> pixels = {1, 2, 3, 4, 5, 6};
    for (bool gz : {false, true}) {
        CAPTURE(gz);
        const fs::path p = dir.path / (gz ? "a.idx.gz" : "a.idx");
        (gz ? write_gz : write_raw)(p, idx_bytes(0x08, {2, 3}, pixels));
        const auto t = dl::data::read_idx<std::uint8_t>(p);
        CHECK(t.shape() == dl::Shape{2, 3});
        CHECK(dl_test::to_vector(t) == std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6});
        const auto h = dl::data::read_idx_header(p);
        CHECK(h.dtype == dl::DType::uint8);
        CHECK(h.data_offset == 12);
    }
    write_raw(dir.path / "i.idx", idx_bytes(0x0C, {2}, {0, 0, 1, 2, 0xFF, 0xFF, 0xFF, 0xFE}));
    CHECK(dl_test::to_vector(dl::data::read_idx<std::int32_t>(dir.path / "i.idx")) == std::vector<std::int32_t>{258, -2});
    write_raw(dir.path / "f.idx", idx_bytes(0x0D, {1}, {0x3F, 0xC0, 0, 0}));
    CHECK(dl::data::read_idx<float>(dir.path / "f.idx")(0) == 1.5f);
}

TEST_CASE("damaged IDX files give errors naming the file and the offset") {
    temp_dir dir;
    const fs::path p = dir.path / "bad.idx";
    auto message = [&](const std::vector<unsigned char>& bytes) {
        write_raw(p, bytes);
        return dl_test::error_message([&] { (void)dl::data::read_idx<std::uint8_t>(p); });
    };
    std::string m = message(idx_bytes(0x08, {2, 3}, {1, 2, 3, 4}));  // 2 of 6 bytes missing
    CHECK(m.find(p.string()) != std::string::npos);
    CHECK(m.find("truncated") != std::string::npos);
    CHECK(m.find("at offset 12") != std::string::npos);
    CHECK(m.find("ends at offset 16") != std::string::npos);
    CHECK(message(idx_bytes(0x08, {2}, {1, 2, 3})).find("bytes after") != std::string::npos);
    CHECK(message({1, 0, 8, 1}).find("not an IDX file") != std::string::npos);
    CHECK(message(idx_bytes(0x0B, {1}, {0, 1})).find("type code 11") != std::string::npos);
    CHECK(message({0, 0, 8, 0}).find("rank 0") != std::string::npos);
    CHECK(message({0, 0, 8, 2, 0, 0}).find("IDX extent") != std::string::npos);
    CHECK(message({}).find("magic") != std::string::npos);
    CHECK(message(idx_bytes(0x0C, {1}, {0, 0, 0, 1})).find("read as uint8") != std::string::npos);
    CHECK(dl_test::error_message([&] { (void)dl::data::read_idx<std::uint8_t>(dir.path / "missing.idx"); })
              .find("cannot open") != std::string::npos);

    // A gzip stream whose compressed bytes are damaged: zlib's error, the file and the offset.
    const fs::path gz = dir.path / "bad.idx.gz";
    std::vector<unsigned char> big(4000);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 7919 % 251);
    write_gz(gz, idx_bytes(0x08, {4000}, big));
    std::vector<char> bytes((std::istreambuf_iterator<char>(std::ifstream(gz, std::ios::binary).rdbuf())), {});
    for (std::size_t i = 20; i < bytes.size() - 8; i += 3) bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);
    std::ofstream(gz, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    m = dl_test::error_message([&] { (void)dl::data::read_idx<std::uint8_t>(gz); });
    CHECK(m.find(gz.string()) != std::string::npos);
    CHECK((m.find("corrupt") != std::string::npos || m.find("truncated") != std::string::npos));
}

TEST_CASE("the real Fashion-MNIST files, when installed") {
    std::filesystem::path folder;
    try {
        folder = dl::data::find_fashion_mnist();
    } catch (const dl::error& e) {
        CHECK(std::string(e.what()).find("/usr/share/datasets/fashion-mnist") != std::string::npos);
        MESSAGE("skipped: " << e.what());
        return;
    }
    const auto test = dl::data::load_fashion_mnist(false, folder);
    CHECK(test.images.shape() == dl::Shape{10000, 28, 28});
    CHECK(test.labels.shape() == dl::Shape{10000});
    CHECK(dl_test::to_vector(test.labels.slice(0, 0, 4)) == std::vector<std::uint8_t>{9, 2, 1, 1});
    std::int64_t per_class[10] = {};
    for (auto l : dl_test::to_vector(test.labels)) ++per_class[l];
    for (auto count : per_class) CHECK(count == 1000);
    if (!dl_test::quick()) {
        const auto train = dl::data::load_fashion_mnist(true, folder);
        CHECK(train.images.shape() == dl::Shape{60000, 28, 28});
        CHECK(dl_test::to_vector(train.labels.slice(0, 0, 4)) == std::vector<std::uint8_t>{9, 0, 0, 3});
        long first = 0;
        for (auto v : dl_test::to_vector(train.images.select(0, 0))) first += v;
        CHECK(first == 76247);
    }
    CHECK(dl_test::error_message([] { (void)dl::data::find_fashion_mnist("/nonexistent/folder"); })
              .find("/nonexistent/folder") != std::string::npos);
}
