#pragma once
// Binary record files for user data, in TFRecord's framing so TensorFlow's readers and dl's read each
// other's files: per record a little-endian uint64 length, the masked CRC32C of those 8 bytes, the
// payload, and the masked CRC32C of the payload. A damaged record is always detected — the reader
// fails, or skips it and counts it, as the caller chooses — and never handed out.
//
// Sparse ID features (the inputs of recommendation models) are stored as CSR blocks: a record holds
// the rows of one batch as offsets [rows + 1], ids [nnz] and optional weights [nnz], laid out so that
// reading them is a view into the reader's buffer, with no per-record copy.
//
// A file format, so it sits in io/ (the parameter server's write-ahead log uses it too); its names
// stay dl::data's, where users have always found them through <dl/data.hpp>.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/crc32c.hpp"
#include "../core/error.hpp"

namespace dl::data {

static_assert(std::endian::native == std::endian::little, "dl record files assume a little-endian machine");

// The parameter server's logs and the tests name these as dl::data's.
using dl::crc32c;
namespace detail {
using dl::detail::crc32c_table_path;
}  // namespace detail

/// TFRecord's masking, so that CRCs of data that itself holds CRCs stay well distributed.
[[nodiscard]] constexpr std::uint32_t mask_crc(std::uint32_t crc) noexcept {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

class record_writer {
public:
    explicit record_writer(const std::filesystem::path& path) : path_(path.string()), out_(path, std::ios::binary | std::ios::trunc) {
        if (!out_) dl::detail::fail("dl::data: cannot write ", path_);
    }
    void write(std::span<const std::byte> payload) {
        const std::uint64_t length = payload.size();
        const std::uint32_t length_crc = mask_crc(crc32c(&length, 8));
        const std::uint32_t payload_crc = mask_crc(crc32c(payload.data(), payload.size()));
        out_.write(reinterpret_cast<const char*>(&length), 8);
        out_.write(reinterpret_cast<const char*>(&length_crc), 4);
        out_.write(reinterpret_cast<const char*>(payload.data()), static_cast<std::streamsize>(payload.size()));
        out_.write(reinterpret_cast<const char*>(&payload_crc), 4);
        if (!out_) dl::detail::fail("dl::data: writing ", path_, " failed");
        ++count_;
    }
    void write(std::string_view payload) { write(std::as_bytes(std::span(payload.data(), payload.size()))); }
    /// Flushes; the destructor closes too, but cannot report a failure.
    void close() {
        out_.close();
        if (!out_) dl::detail::fail("dl::data: closing ", path_, " failed");
    }
    [[nodiscard]] std::int64_t records() const noexcept { return count_; }

private:
    std::string path_;
    std::ofstream out_;
    std::int64_t count_ = 0;
};

/// What to do with a record whose payload fails its CRC. (A damaged length cannot be skipped: the
/// next record's position is unknown, so that always fails.)
enum class on_corrupt { fail, skip };

class record_reader {
public:
    explicit record_reader(const std::filesystem::path& path, on_corrupt mode = on_corrupt::fail)
        : path_(path.string()), in_(path, std::ios::binary), mode_(mode) {
        if (!in_) dl::detail::fail("dl::data: cannot open ", path_);
        in_.seekg(0, std::ios::end);
        size_ = static_cast<std::int64_t>(in_.tellg());
        in_.seekg(0);
    }

    /// The next intact record's payload, or an empty optional at the end; an empty file is an error.
    /// The span points into the reader's buffer and stays valid until the next call (aligned to 16 bytes).
    [[nodiscard]] std::optional<std::span<const std::byte>> next() {
        // Zero records are not an empty file: a writer that wrote nothing, or a file cut at 0 bytes,
        // would otherwise read as a valid empty dataset.
        if (size_ == 0) fail_at(0, "is empty (0 bytes): a record file holds at least one record");
        for (;;) {
            if (offset_ == size_) return std::nullopt;
            const std::int64_t at = offset_;
            if (size_ - at < 12) fail_at(at, "is truncated: a record header needs 12 bytes, ", size_ - at, " remain");
            std::uint64_t length = 0;
            std::uint32_t length_crc = 0, payload_crc = 0;
            read(&length, 8);
            read(&length_crc, 4);
            if (mask_crc(crc32c(&length, 8)) != length_crc)
                fail_at(at, "has a damaged record length (CRC mismatch) in record ", index_);
            const std::int64_t room = size_ - at - 16;  // payload bytes the file can still hold
            if (room < 0 || length > static_cast<std::uint64_t>(room))
                fail_at(at, "is truncated: record ", index_, " declares ", length, " bytes of payload, ",
                        std::max<std::int64_t>(room, 0), " remain");
            buffer_.resize((length + 15) / 16);
            read(buffer_.data(), static_cast<std::int64_t>(length));
            read(&payload_crc, 4);
            ++index_;
            if (mask_crc(crc32c(buffer_.data(), length)) == payload_crc)
                return std::span<const std::byte>(reinterpret_cast<const std::byte*>(buffer_.data()), length);
            if (mode_ == on_corrupt::fail) fail_at(at, "has a damaged payload (CRC mismatch) in record ", index_ - 1);
            ++skipped_;
        }
    }
    /// Records skipped as damaged so far (on_corrupt::skip).
    [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }
    /// Records read so far, damaged ones included.
    [[nodiscard]] std::int64_t records() const noexcept { return index_; }
    /// Bytes consumed: the end of the last record read (where a log with a torn tail is cut).
    [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }

private:
    struct alignas(16) block {
        std::byte b[16];
    };
    void read(void* to, std::int64_t n) {
        in_.read(static_cast<char*>(to), n);
        if (in_.gcount() != n) fail_at(offset_, "could not be read (", in_.gcount(), " of ", n, " bytes)");
        offset_ += n;
    }
    template <class... Parts>
    [[noreturn]] void fail_at(std::int64_t offset, Parts&&... parts) const {
        dl::detail::fail("dl::data: ", path_, " ", std::forward<Parts>(parts)..., " (at byte offset ", offset, ")");
    }

    std::string path_;
    std::ifstream in_;
    on_corrupt mode_;
    std::int64_t size_ = 0, offset_ = 0, index_ = 0, skipped_ = 0;
    std::vector<block> buffer_;
};

// --- sparse ID features as CSR blocks ---

/// A CSR block: row r holds ids[offsets[r] .. offsets[r+1]) (and their weights, when present).
struct csr_view {
    std::span<const std::uint64_t> offsets, ids;
    std::span<const float> weights;  ///< empty when the block has none
    [[nodiscard]] std::int64_t rows() const noexcept { return offsets.empty() ? 0 : std::int64_t(offsets.size()) - 1; }
};

namespace detail {
/// Payload layout: 16-byte header {magic "CSR1", uint32 rows, uint64 nnz | has_weights << 63}, then
/// offsets (uint64), ids (uint64), weights (float) — each 8-byte aligned within the 16-aligned buffer.
inline constexpr std::uint32_t csr_magic = 0x31525343u;  // "CSR1"
inline constexpr std::uint64_t csr_weight_flag = std::uint64_t(1) << 63;
}  // namespace detail

/// Encodes rows of ids (and weights: empty, or one per id) as one CSR payload for record_writer.
[[nodiscard]] inline std::vector<std::byte> encode_csr(std::span<const std::uint64_t> offsets,
                                                       std::span<const std::uint64_t> ids,
                                                       std::span<const float> weights = {}) {
    if (offsets.empty() || offsets.front() != 0 || offsets.back() != ids.size())
        dl::detail::fail("dl::data::encode_csr: offsets must start at 0 and end at the number of ids (", ids.size(), ")");
    for (std::size_t r = 1; r < offsets.size(); ++r)
        if (offsets[r] < offsets[r - 1]) dl::detail::fail("dl::data::encode_csr: offsets decrease at row ", r - 1);
    if (!weights.empty() && weights.size() != ids.size())
        dl::detail::fail("dl::data::encode_csr: ", weights.size(), " weights for ", ids.size(), " ids");
    const std::uint32_t rows = static_cast<std::uint32_t>(offsets.size() - 1);
    const std::uint64_t nnz = ids.size() | (weights.empty() ? 0 : detail::csr_weight_flag);
    std::vector<std::byte> out(16 + 8 * offsets.size() + 8 * ids.size() + 4 * weights.size());
    std::byte* p = out.data();
    std::memcpy(p, &detail::csr_magic, 4);
    std::memcpy(p + 4, &rows, 4);
    std::memcpy(p + 8, &nnz, 8);
    p += 16;
    std::memcpy(p, offsets.data(), 8 * offsets.size());
    p += 8 * offsets.size();
    std::memcpy(p, ids.data(), 8 * ids.size());
    p += 8 * ids.size();
    if (!weights.empty()) std::memcpy(p, weights.data(), 4 * weights.size());
    return out;
}

/// Views a CSR payload (from record_reader::next, 16-byte aligned) without copying, after checking
/// its header, size and offsets.
[[nodiscard]] inline csr_view decode_csr(std::span<const std::byte> payload) {
    if (payload.size() < 16) dl::detail::fail("dl::data::decode_csr: payload of ", payload.size(), " bytes has no header");
    if (reinterpret_cast<std::uintptr_t>(payload.data()) % 8 != 0)
        dl::detail::fail("dl::data::decode_csr: the payload must be 8-byte aligned");
    std::uint32_t magic = 0, rows = 0;
    std::uint64_t nnz = 0;
    std::memcpy(&magic, payload.data(), 4);
    std::memcpy(&rows, payload.data() + 4, 4);
    std::memcpy(&nnz, payload.data() + 8, 8);
    if (magic != detail::csr_magic) dl::detail::fail("dl::data::decode_csr: not a CSR block (bad magic)");
    const bool weighted = (nnz & detail::csr_weight_flag) != 0;
    nnz &= ~detail::csr_weight_flag;
    const std::uint64_t expected = 16 + 8 * (std::uint64_t(rows) + 1) + 8 * nnz + (weighted ? 4 * nnz : 0);
    if (nnz > payload.size() || payload.size() != expected)
        dl::detail::fail("dl::data::decode_csr: ", rows, " rows and ", nnz, " ids need ", expected, " bytes, the payload has ",
                         payload.size());
    const auto* words = reinterpret_cast<const std::uint64_t*>(payload.data() + 16);
    csr_view v{{words, rows + std::size_t(1)}, {words + rows + 1, nnz}, {}};
    if (weighted) v.weights = {reinterpret_cast<const float*>(words + rows + 1 + nnz), nnz};
    if (v.offsets.front() != 0 || v.offsets.back() != nnz)
        dl::detail::fail("dl::data::decode_csr: offsets must run from 0 to ", nnz);
    for (std::uint32_t r = 0; r < rows; ++r)
        if (v.offsets[r + 1] < v.offsets[r]) dl::detail::fail("dl::data::decode_csr: offsets decrease at row ", r);
    return v;
}

}  // namespace dl::data
