#pragma once
// IDX files (the MNIST family's format), raw or gzip-compressed: two zero bytes, a type code, the
// rank, the extents as big-endian uint32, then the elements big-endian. zlib reads both (gzread passes
// uncompressed files through), so one code path serves .gz and plain files. Needs linking zlib: the
// CMake target dl::data does that.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../core/creation.hpp"
#include "../core/dtype.hpp"

namespace dl::data {

/// What an IDX header says.
struct idx_header {
    DType dtype;  ///< uint8 (code 0x08), int32 (0x0C), float32 (0x0D), float64 (0x0E)
    Shape shape;
    std::int64_t data_offset;  ///< bytes of header before the elements (uncompressed stream)
};

namespace detail {

/// A gzip or plain file read sequentially, tracking the offset in the uncompressed stream so that
/// every error names where it happened.
class gz_reader {
public:
    explicit gz_reader(const std::filesystem::path& path) : path_(path.string()) {
        file_ = gzopen(path_.c_str(), "rb");
        if (!file_) dl::detail::fail("dl::data: cannot open ", path_, ": ", std::strerror(errno));
        gzbuffer(file_, 1 << 17);
    }
    gz_reader(const gz_reader&) = delete;
    gz_reader& operator=(const gz_reader&) = delete;
    ~gz_reader() { gzclose(file_); }

    /// Reads exactly n bytes or fails naming `what` and the offset where the data ran out.
    void read(void* out, std::int64_t n, const char* what) {
        auto* p = static_cast<unsigned char*>(out);
        std::int64_t done = 0;
        while (done < n) {
            const unsigned chunk = static_cast<unsigned>(std::min<std::int64_t>(n - done, 1 << 30));
            const int got = gzread(file_, p + done, chunk);
            if (got < 0) fail_stream(what, offset_ + done);
            if (got == 0)
                dl::detail::fail("dl::data: ", path_, " is truncated: ", what, " needs ", n, " bytes at offset ", offset_,
                                 ", the file ends at offset ", offset_ + done);
            done += got;
        }
        offset_ += n;
    }
    /// True when nothing follows (checked so that a file with extra bytes is reported, not half-read).
    [[nodiscard]] bool at_end() {
        unsigned char probe;
        const int got = gzread(file_, &probe, 1);
        if (got < 0) fail_stream("the end of the data", offset_);
        return got == 0;
    }
    [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
    [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
    [[noreturn]] void fail_stream(const char* what, std::int64_t at) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        dl::detail::fail("dl::data: ", path_, " is corrupt (", message, ") reading ", what, " near offset ", at);
    }

    std::string path_;
    gzFile file_ = nullptr;
    std::int64_t offset_ = 0;
};

inline std::uint32_t big_endian_u32(const unsigned char* b) {
    return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
}

inline idx_header read_idx_header(gz_reader& in) {
    unsigned char magic[4];
    in.read(magic, 4, "the IDX magic number");
    if (magic[0] != 0 || magic[1] != 0)
        dl::detail::fail("dl::data: ", in.path(), " is not an IDX file: its first two bytes are ", int(magic[0]), ", ",
                         int(magic[1]), " (expected 0, 0) at offset 0");
    idx_header h{};
    switch (magic[2]) {
        case 0x08: h.dtype = DType::uint8; break;
        case 0x0C: h.dtype = DType::int32; break;
        case 0x0D: h.dtype = DType::float32; break;
        case 0x0E: h.dtype = DType::float64; break;
        default:
            dl::detail::fail("dl::data: ", in.path(), " has IDX type code ", int(magic[2]),
                             " at offset 2 (supported: 0x08 uint8, 0x0C int32, 0x0D float32, 0x0E float64)");
    }
    const int rank = magic[3];
    if (rank < 1 || rank > max_rank)
        dl::detail::fail("dl::data: ", in.path(), " declares rank ", rank, " at offset 3 (supported: 1 to ", max_rank, ")");
    std::int64_t elements = 1;
    for (int d = 0; d < rank; ++d) {
        unsigned char b[4];
        in.read(b, 4, "an IDX extent");
        const std::int64_t extent = big_endian_u32(b);
        elements *= extent;
        if (elements > (std::int64_t(1) << 40))
            dl::detail::fail("dl::data: ", in.path(), " declares an implausible shape (over 2^40 elements) at offset ",
                             in.offset() - 4);
        h.shape.push_back(extent);
    }
    h.data_offset = in.offset();
    return h;
}

}  // namespace detail

/// The header of an IDX file (raw or gzip).
[[nodiscard]] inline idx_header read_idx_header(const std::filesystem::path& path) {
    detail::gz_reader in(path);
    return detail::read_idx_header(in);
}

/// The elements of an IDX file as a Tensor<T>; T must be the file's element type. Fails with the
/// file name and offset on a truncated, oversized or corrupt file.
template <class T>
[[nodiscard]] Tensor<T> read_idx(const std::filesystem::path& path, Context& ctx = default_context()) {
    detail::gz_reader in(path);
    const idx_header h = detail::read_idx_header(in);
    if (h.dtype != dtype_of<T>)
        dl::detail::fail("dl::data: ", in.path(), " holds ", h.dtype, " elements, read as ", dtype_of<T>);
    Tensor<T> out(h.shape, ctx);
    in.read(out.data(), out.numel() * std::int64_t(sizeof(T)), "the elements");
    if constexpr (sizeof(T) > 1 && std::endian::native == std::endian::little)
        for (std::int64_t i = 0; i < out.numel(); ++i) {
            auto bytes = std::bit_cast<std::array<unsigned char, sizeof(T)>>(out.data()[i]);
            std::reverse(bytes.begin(), bytes.end());
            out.data()[i] = std::bit_cast<T>(bytes);
        }
    if (!in.at_end())
        dl::detail::fail("dl::data: ", in.path(), " has bytes after the ", h.shape, " elements, from offset ",
                         in.offset());
    return out;
}

}  // namespace dl::data
