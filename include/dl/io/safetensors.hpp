#pragma once
// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// size, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}} and the raw
// little-endian elements, so PyTorch, JAX and the Hugging Face tools read dl's files and dl reads
// theirs. dl adds the data section's CRC32C to the metadata, which other readers ignore.
//
// A file format, so it sits in io/ (checkpoints and saved graphs both write it); its names stay
// dl::nn's, where users have always found them through <dl/nn/checkpoint.hpp>.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "../core/crc32c.hpp"
#include "../core/tensor.hpp"

namespace dl::nn {

static_assert(std::endian::native == std::endian::little, "dl checkpoints assume a little-endian machine");

/// One tensor of a safetensors file, as stored.
struct stored_tensor {
    DType dtype;
    Shape shape;
    std::int64_t begin = 0, end = 0;  ///< byte offsets in the data section
};

namespace detail {

/// Calls f(offset) with the element offset (from t.data()) of each element of t in row-major order.
/// The files hold elements row-major; tensors may be strided views. (io/ knows core alone, so it walks
/// the strides itself rather than through an expression copy.)
template <class T, class F>
void for_each_offset(const Tensor<T>& t, F&& f) {
    if (t.numel() == 0) return;
    std::array<std::int64_t, max_rank> index{};
    const int rank = t.rank();
    for (std::int64_t at = 0;;) {
        f(at);
        int d = rank - 1;
        for (; d >= 0; --d) {
            at += t.strides()[d];
            if (++index[static_cast<std::size_t>(d)] < t.shape()[d]) break;
            at -= t.strides()[d] * t.shape()[d];
            index[static_cast<std::size_t>(d)] = 0;
        }
        if (d < 0) return;
    }
}

inline std::string_view safetensors_dtype(DType d) {
    switch (d) {
        case DType::boolean: return "BOOL";
        case DType::uint8: return "U8";
        case DType::int32: return "I32";
        case DType::int64: return "I64";
        case DType::float32: return "F32";
        case DType::float64: return "F64";
        case DType::bfloat16: return "BF16";
        case DType::float16: return "F16";
    }
    return "?";
}
inline std::optional<DType> dtype_from_safetensors(std::string_view s) {
    for (DType d : {DType::boolean, DType::uint8, DType::int32, DType::int64, DType::float32, DType::float64,
                    DType::bfloat16, DType::float16})
        if (safetensors_dtype(d) == s) return d;
    return std::nullopt;
}

/// The metadata key of the data section's CRC32C, written by safetensors_writer and checked, when a
/// file has it, by safetensors_file. Other readers ignore metadata they do not know.
inline constexpr std::string_view data_crc_key = "dl.data_crc32c";

/// A CRC as 8 lowercase hexadecimal digits, as metadata values are strings.
[[nodiscard]] inline std::string format_crc(std::uint32_t crc) {
    std::string text(8, '0');
    for (int i = 7; i >= 0; --i, crc >>= 4) text[static_cast<std::size_t>(i)] = "0123456789abcdef"[crc & 0xF];
    return text;
}
[[nodiscard]] inline std::optional<std::uint32_t> parse_crc(std::string_view text) {
    if (text.size() != 8) return std::nullopt;
    std::uint32_t crc = 0;
    for (char c : text) {
        const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) return std::nullopt;
        crc = crc << 4 | static_cast<std::uint32_t>(digit);
    }
    return crc;
}

}  // namespace detail

/// A safetensors file read into memory and validated: header size, JSON, dtypes, shapes, and offsets
/// that tile the data section exactly (no gaps, overlaps or bytes past the end), and the data
/// section's CRC32C when the metadata holds one (dl writes it; files from other writers load without).
class safetensors_file {
public:
    explicit safetensors_file(const std::filesystem::path& path) : path_(path.string()) {
        std::ifstream in(path, std::ios::binary);
        if (!in) dl::detail::fail("dl::nn: cannot open checkpoint ", path_);
        bytes_.assign(std::istreambuf_iterator<char>(in), {});
        if (bytes_.size() < 8) fail_at(0, "is ", bytes_.size(), " bytes long, shorter than the 8-byte header size");
        std::uint64_t header_size = 0;
        std::memcpy(&header_size, bytes_.data(), 8);
        if (header_size > bytes_.size() - 8)
            fail_at(0, "declares a ", header_size, "-byte header, but only ", bytes_.size() - 8, " bytes follow");
        data_ = 8 + static_cast<std::int64_t>(header_size);
        nlohmann::json header;
        try {
            header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + data_);
        } catch (const nlohmann::json::exception& e) {
            fail_at(8, "has a header that is not valid JSON: ", e.what());
        }
        if (!header.is_object()) fail_at(8, "has a header that is not a JSON object");
        std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
        for (const auto& [name, entry] : header.items()) {
            if (name == "__metadata__") {
                if (entry.is_object())
                    for (const auto& [k, v] : entry.items())
                        if (v.is_string()) metadata_[k] = v.get<std::string>();
                continue;
            }
            tensors_.emplace(name, parse_entry(name, entry));
            ranges.emplace_back(tensors_[name].begin, tensors_[name].end);
        }
        std::sort(ranges.begin(), ranges.end());
        std::int64_t at = 0;
        for (const auto& [b, e] : ranges) {
            if (b != at) fail_at(data_ + std::min(b, at), "has tensor data that ", b < at ? "overlaps" : "leaves a gap");
            at = e;
        }
        const std::int64_t available = static_cast<std::int64_t>(bytes_.size()) - data_;  // parse_entry: at <= available
        if (at < available) fail_at(data_ + at, "has ", available - at, " bytes after the last tensor's data");
        if (const auto it = metadata_.find(std::string(detail::data_crc_key)); it != metadata_.end()) {
            const auto stored = detail::parse_crc(it->second);
            if (!stored)
                fail_at(8, "has a malformed ", detail::data_crc_key, " \"", it->second, "\" (8 hexadecimal digits expected)");
            const std::uint32_t actual = crc32c(bytes_.data() + data_, static_cast<std::size_t>(available));
            if (actual != *stored)
                fail_at(data_, "has damaged tensor data (CRC32C mismatch): its ", available, "-byte data section sums to ",
                        detail::format_crc(actual), ", its header says ", it->second);
        }
    }

    [[nodiscard]] const std::map<std::string, stored_tensor>& tensors() const noexcept { return tensors_; }
    [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
    [[nodiscard]] bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

    /// Copies tensor `name` into `out` (same shape, element type T).
    template <class T>
    void read_into(const std::string& name, Tensor<T>& out) const {
        const stored_tensor& s = at(name);
        if (s.dtype != dtype_of<T> || s.shape != out.shape())
            dl::detail::fail("dl::nn: ", path_, ": tensor '", name, "' is ", s.dtype, " ", s.shape, ", expected ",
                             dtype_of<T>, " ", out.shape());
        const char* from = bytes_.data() + data_ + s.begin;
        if (out.is_contiguous()) {
            if (s.end > s.begin) std::memcpy(out.data(), from, static_cast<std::size_t>(s.end - s.begin));
        } else {
            detail::for_each_offset(out, [&](std::int64_t at) {
                std::memcpy(out.data() + at, from, sizeof(T));
                from += sizeof(T);
            });
        }
    }
    /// Tensor `name` as a new Tensor<T>.
    template <class T>
    [[nodiscard]] Tensor<T> get(const std::string& name, Context& ctx = default_context()) const {
        Tensor<T> out(at(name).shape, ctx);
        read_into(name, out);
        return out;
    }

private:
    template <class... Parts>
    [[noreturn]] void fail_at(std::int64_t offset, Parts&&... parts) const {
        dl::detail::fail("dl::nn: checkpoint ", path_, " ", std::forward<Parts>(parts)..., " (at byte offset ", offset,
                         ")");
    }
    const stored_tensor& at(const std::string& name) const {
        const auto it = tensors_.find(name);
        if (it == tensors_.end()) dl::detail::fail("dl::nn: ", path_, " has no tensor '", name, "'");
        return it->second;
    }
    stored_tensor parse_entry(const std::string& name, const nlohmann::json& e) const {
        auto bad = [&](const char* what) { fail_at(8, "has a bad entry for '", name, "': ", what); };
        if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
            bad("needs dtype, shape and data_offsets");
        stored_tensor s{};
        const auto dtype = e["dtype"].is_string() ? detail::dtype_from_safetensors(e["dtype"].get<std::string>())
                                                  : std::nullopt;
        if (!dtype) bad("unsupported dtype (dl reads BOOL, U8, I32, I64, F32, F64, BF16, F16)");
        s.dtype = *dtype;
        if (!e["shape"].is_array() || e["shape"].size() > static_cast<std::size_t>(max_rank)) bad("shape must be a list of at most 8 extents");
        // Extents and offsets are read as uint64 and checked before any arithmetic: a product or a sum
        // that wraps would pass the size checks and leave a tensor smaller than its shape.
        constexpr auto largest = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
        for (const auto& d : e["shape"]) {
            if (!d.is_number_unsigned()) bad("shape extents must be non-negative integers");
            const auto extent = d.get<std::uint64_t>();
            if (extent > largest) fail_at(8, "has a bad entry for '", name, "': extent ", extent, " overflows int64");
            s.shape.push_back(static_cast<std::int64_t>(extent));
        }
        const auto numel = s.shape.checked_numel();
        std::int64_t bytes = 0;
        if (!numel || __builtin_mul_overflow(*numel, static_cast<std::int64_t>(dtype_size(s.dtype)), &bytes))
            fail_at(8, "has a bad entry for '", name, "': shape ", s.shape, " of ", detail::safetensors_dtype(s.dtype),
                    " overflows int64 in elements or bytes");
        const auto& o = e["data_offsets"];
        if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
            bad("data_offsets must be two non-negative integers");
        const auto begin = o[0].get<std::uint64_t>(), end = o[1].get<std::uint64_t>();
        const auto available = bytes_.size() - static_cast<std::size_t>(data_);
        if (begin > available || end > available)
            fail_at(static_cast<std::int64_t>(bytes_.size()), "is truncated: its tensors need ", std::max(begin, end),
                    " bytes of data, the file has ", available);
        s.begin = static_cast<std::int64_t>(begin);
        s.end = static_cast<std::int64_t>(end);
        if (s.end < s.begin || s.end - s.begin != bytes) bad("data_offsets do not span dtype size x the number of elements");
        return s;
    }

    std::string path_;
    std::vector<char> bytes_;
    std::int64_t data_ = 0;
    std::map<std::string, stored_tensor> tensors_;
    std::map<std::string, std::string> metadata_;
};

/// Writes named tensors (any element types) as one safetensors file, header padded to 8 bytes, with the
/// CRC32C of the data section in the metadata.
class safetensors_writer {
public:
    template <class T>
    void add(std::string name, const Tensor<T>& t) {
        if (!names_.insert(name).second) dl::detail::fail("dl::nn: checkpoint tensor name '", name, "' used twice");
        entry e{std::move(name), dtype_of<T>, t.shape(), std::vector<char>(static_cast<std::size_t>(t.numel()) * sizeof(T))};
        if (t.is_contiguous()) {
            if (!e.bytes.empty()) std::memcpy(e.bytes.data(), t.data(), e.bytes.size());
        } else {
            char* to = e.bytes.data();
            detail::for_each_offset(t, [&](std::int64_t at) {
                std::memcpy(to, t.data() + at, sizeof(T));
                to += sizeof(T);
            });
        }
        entries_.push_back(std::move(e));
    }
    void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

    /// Writes to `path` through a temporary file renamed at the end, so a crash never leaves a
    /// half-written checkpoint under the final name.
    void write(const std::filesystem::path& path) const {
        std::uint32_t crc = 0;
        for (const auto& e : entries_) crc = crc32c(e.bytes.data(), e.bytes.size(), crc);
        auto metadata = metadata_;
        metadata[std::string(detail::data_crc_key)] = detail::format_crc(crc);
        nlohmann::ordered_json header;
        header["__metadata__"] = metadata;
        std::int64_t at = 0;
        for (const auto& e : entries_) {
            const auto size = static_cast<std::int64_t>(e.bytes.size());
            header[e.name] = {{"dtype", detail::safetensors_dtype(e.dtype)},
                              {"shape", std::vector<std::int64_t>(e.shape.begin(), e.shape.end())},
                              {"data_offsets", {at, at + size}}};
            at += size;
        }
        std::string text = header.dump();
        text.append((8 - text.size() % 8) % 8, ' ');
        const auto tmp = std::filesystem::path(path.string() + ".tmp");
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            if (!out) dl::detail::fail("dl::nn: cannot write checkpoint ", tmp.string());
            const std::uint64_t size = text.size();
            out.write(reinterpret_cast<const char*>(&size), 8);
            out.write(text.data(), static_cast<std::streamsize>(text.size()));
            for (const auto& e : entries_) out.write(e.bytes.data(), static_cast<std::streamsize>(e.bytes.size()));
            if (!out.flush()) dl::detail::fail("dl::nn: writing checkpoint ", tmp.string(), " failed");
        }
        std::filesystem::rename(tmp, path);
    }

private:
    struct entry {
        std::string name;
        DType dtype;
        Shape shape;
        std::vector<char> bytes;
    };
    std::vector<entry> entries_;
    std::set<std::string> names_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace dl::nn
