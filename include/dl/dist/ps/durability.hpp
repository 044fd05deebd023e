#pragma once
// What a parameter server keeps on disk, all in the record framing of dl::data (TFRecord's: length,
// CRC of the length, payload, CRC of the payload), so every byte read back is checked:
//
//   <data dir>/meta                    the shard count the files were written with
//   <data dir>/tables.log              create_table and grow_dim, in order (synced before the ack)
//   <data dir>/shard-<i>/wal-<n>.log   pushes applied by shard i after checkpoint n (n = 0: since
//                                      the start), with their keys, synced before the push is acknowledged
//   <data dir>/shard-<i>/full-<n>.ckpt, incr-<n>.ckpt
//                                      checkpoint n of shard i: every row, or the rows changed and
//                                      removed since checkpoint n-1, and the keys of the pushes
//                                      applied (all of them: the log before is gone); written to a temporary file,
//                                      synced and renamed, so a file that exists is complete
//
// Restoring a shard = its last full checkpoint, the incremental ones after it, then its log segments
// from the last checkpoint on. A log's torn tail (a crash mid-append, never acknowledged) is cut off.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../io/records.hpp"
#include "protocol.hpp"
#include "table.hpp"

namespace dl::ps {

namespace fs = std::filesystem;

namespace detail {

[[noreturn]] inline void fail_io(const std::string& what, const fs::path& path) {
    dl::detail::fail("dl::ps: ", what, " ", path.string(), ": ", std::strerror(errno));
}

/// An append-only file of records with explicit durability: append() buffers, sync() writes the
/// buffer and fdatasync()s. What sync() returned from is on disk.
class log_file {
public:
    log_file() = default;
    explicit log_file(const fs::path& path) : path_(path) {
        fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd_ < 0) fail_io("cannot open", path);
    }
    log_file(log_file&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), buffer_(std::move(o.buffer_)) {}
    log_file& operator=(log_file&& o) noexcept {
        if (this != &o) {
            close_fd();
            path_ = std::move(o.path_);
            fd_ = std::exchange(o.fd_, -1);
            buffer_ = std::move(o.buffer_);
        }
        return *this;
    }
    ~log_file() { close_fd(); }

    [[nodiscard]] bool is_open() const noexcept { return fd_ >= 0; }
    [[nodiscard]] const fs::path& path() const noexcept { return path_; }
    [[nodiscard]] bool pending() const noexcept { return !buffer_.empty(); }

    /// Frames one record (dl::data's framing) into the buffer. `fill(out)` appends the payload.
    template <class Fill>
    void append(Fill&& fill) {
        const std::size_t start = buffer_.size();
        buffer_.resize(start + 12);
        fill(buffer_);
        const std::uint64_t length = buffer_.size() - start - 12;
        const std::uint32_t length_crc = data::mask_crc(data::crc32c(&length, 8));
        const std::uint32_t payload_crc = data::mask_crc(data::crc32c(buffer_.data() + start + 12, length));
        std::memcpy(buffer_.data() + start, &length, 8);
        std::memcpy(buffer_.data() + start + 8, &length_crc, 4);
        buffer_.resize(buffer_.size() + 4);
        std::memcpy(buffer_.data() + buffer_.size() - 4, &payload_crc, 4);
        if (buffer_.size() >= flush_bytes) write_buffer();  // a checkpoint streams out; durability still needs sync()
    }
    void append_bytes(std::span<const std::byte> payload) {
        append([&](frame_bytes& out) { out.insert(out.end(), payload.begin(), payload.end()); });
    }
    /// Writes what was appended and waits for the disk. Throws dl::error on failure.
    void sync() {
        write_buffer();
        if (::fdatasync(fd_) != 0) fail_io("cannot sync", path_);
    }

private:
    static constexpr std::size_t flush_bytes = std::size_t{8} << 20;
    void write_buffer() {
        std::size_t done = 0;
        while (done < buffer_.size()) {
            const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail_io("cannot write", path_);
            done += static_cast<std::size_t>(n);
        }
        buffer_.clear();
    }
    void close_fd() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    fs::path path_;
    int fd_ = -1;
    frame_bytes buffer_;
};

/// Makes a rename or a new file in `dir` durable.
inline void sync_directory(const fs::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail_io("cannot open directory", dir);
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0) fail_io("cannot sync directory", dir);
}

/// Reads every record of a log (none when the file does not exist). A torn tail — a last record cut
/// short or damaged, or zeros where it should be — is cut off the file: it was never acknowledged, as
/// an append is acknowledged only after the sync that wrote all of it. Damage with intact records
/// after it, and errors from on_record, are thrown: those are not crashes, and skipping them would
/// silently drop acknowledged records.
template <class OnRecord>
void replay_log(const fs::path& path, OnRecord&& on_record) {
    if (!fs::exists(path)) return;
    std::int64_t good = 0;
    std::string damage;
    {
        data::record_reader reader(path);
        for (;;) {
            std::optional<std::span<const std::byte>> record;
            try {
                record = reader.next();
            } catch (const dl::error& e) {
                damage = e.what();
                break;
            }
            if (!record) return;
            on_record(*record);
            good = reader.offset();
        }
    }
    // Is the damage the tail? Read what follows the last good record.
    const auto size = static_cast<std::int64_t>(fs::file_size(path));
    std::vector<char> rest(static_cast<std::size_t>(size - good));
    {
        std::ifstream in(path, std::ios::binary);
        in.seekg(good);
        in.read(rest.data(), static_cast<std::streamsize>(rest.size()));
    }
    bool torn = rest.size() < 16 || std::all_of(rest.begin(), rest.end(), [](char c) { return c == 0; });
    if (!torn) {
        // An intact length that reaches the end: the last record, cut or damaged while written.
        std::uint64_t length = 0;
        std::uint32_t length_crc = 0;
        std::memcpy(&length, rest.data(), 8);
        std::memcpy(&length_crc, rest.data() + 8, 4);
        torn = data::mask_crc(data::crc32c(&length, 8)) == length_crc && length >= rest.size() - 16;
    }
    if (!torn) dl::detail::fail("dl::ps: ", path.string(), " is damaged before its end (", damage, "); refusing to drop the records after it");
    fs::resize_file(path, static_cast<std::uintmax_t>(good));
}

/// Files named <prefix><n><suffix> in dir, by n.
inline std::map<std::uint64_t, fs::path> numbered_files(const fs::path& dir, std::string_view prefix, std::string_view suffix) {
    std::map<std::uint64_t, fs::path> found;
    if (!fs::exists(dir)) return found;
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        if (!name.starts_with(prefix) || !name.ends_with(suffix)) continue;
        const std::string_view digits(name.data() + prefix.size(), name.size() - prefix.size() - suffix.size());
        std::uint64_t n = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
        if (ec == std::errc{} && end == digits.data() + digits.size()) found.emplace(n, entry.path());
    }
    return found;
}

// --- record payloads (all little-endian; arrays of 8-byte values start at a multiple of 8, as records
// are read into 16-byte-aligned buffers) ---

enum class record_kind : std::uint32_t {
    meta = 1,        ///< u32 shards
    table = 2,       ///< table config (id first) in protocol version 1's layout (f32 betas): tables.log before version 2
    grow = 3,        ///< u32 table, u32 dim: tables.log, and a shard's log (where its pushes change dim)
    rows = 4,        ///< u32 table, u32 count, then per row: row_meta, u32 dim, weights, state
    removed = 5,     ///< u32 table, u32 count, u32 0, ids: rows evicted (in a log, and in an incremental checkpoint)
    push = 6,        ///< u32 table, u32 step, u32 0, then a push payload (protocol.hpp): the write-ahead log
    step = 7,        ///< u32 table, u32 dim, u64 step: a table's dim and step counter at a checkpoint
    end = 8,         ///< u64 sequence: the last record of a complete checkpoint
    export_head = 9, ///< u32 table, u32 dim: the first record of an exported table
    table_v2 = 10,   ///< table config (id first) in protocol version 2's layout (f64 betas): tables.log
    applied = 11,    ///< u32 0, u64 client, u64 floor, u64 sequences[]: keys of pushes applied (checkpoint; see applied_pushes)
};

template <class T>
void put(frame_bytes& out, const T& value) {
    byte_writer(out).put(value);
}

inline void put_config(frame_bytes& out, const table_config& c) {
    put(out, record_kind::table_v2);
    put(out, c.id);
    byte_writer w(out);
    encode(w, c);
}

inline void put_removed(frame_bytes& out, std::uint32_t table_id, std::span<const std::uint64_t> ids) {
    put(out, record_kind::removed);
    put(out, table_id);
    put(out, static_cast<std::uint32_t>(ids.size()));
    put(out, std::uint32_t{0});  // pads to 16 bytes: the ids stay 8-aligned
    byte_writer(out).put_span(ids);
}

/// Reads a record's kind, failing with the file named when it is not one of `expected`.
inline record_kind kind_of(byte_reader& r, const fs::path& file) {
    try {
        return static_cast<record_kind>(r.get<std::uint32_t>());
    } catch (const decode_error&) {
        dl::detail::fail("dl::ps: ", file.string(), ": an empty record");
    }
}

/// Reads a row record into `into` (rows of a table with `config`).
inline void restore_rows(byte_reader& r, table& into, const fs::path& file) {
    const auto count = r.get<std::uint32_t>();
    const optimizer_kind kind = into.config().optimizer.kind;
    for (std::uint32_t i = 0; i < count; ++i) {
        row_meta m;
        std::memcpy(&m, r.view<std::byte>(sizeof m).data(), sizeof m);
        const auto dim = r.get<std::uint32_t>();
        if (dim == 0 || dim > into.dim()) dl::detail::fail("dl::ps: ", file.string(), ": row ", m.id, " of dim ", dim, " in a table of dim ", into.dim());
        const auto weights = r.view<float>(dim);
        const auto state = r.view<float>(state_floats(kind, dim));
        into.restore_row(m, weights, state);
    }
}

/// Appends one rows record per `batch` rows of the table that `rows` visits.
template <class Visit>
void write_rows(log_file& out, std::uint32_t table_id, Visit&& visit, bool with_state) {
    constexpr std::uint32_t batch = 4096;
    frame_bytes payload;
    std::uint32_t count = 0;
    auto flush = [&] {
        if (count == 0) return;
        std::memcpy(payload.data() + 8, &count, 4);
        out.append_bytes(payload);
        count = 0;
    };
    auto start = [&] {
        payload.clear();
        put(payload, record_kind::rows);
        put(payload, table_id);
        put(payload, std::uint32_t{0});  // count, filled in by flush
    };
    start();
    visit([&](const table::row_view& r) {
        byte_writer w(payload);
        w.put(r.meta);
        w.put(static_cast<std::uint32_t>(r.weights.size()));
        w.put_span(r.weights);
        if (with_state) w.put_span(r.state);
        if (++count == batch) {
            flush();
            start();
        }
    });
    flush();
}

}  // namespace detail

/// An exported table for inference: rows and metadata, no optimizer state. Loads the file that
/// client::export_table asked a server to write (or service::export_table wrote) and looks rows up.
class exported_table {
public:
    explicit exported_table(const fs::path& path) {
        bool ended = false;
        data::record_reader reader(path);
        while (auto record = reader.next()) {
            byte_reader r(*record);
            const auto kind = detail::kind_of(r, path);
            if (kind == detail::record_kind::export_head) {
                id_ = r.get<std::uint32_t>();
                dim_ = r.get<std::uint32_t>();
            } else if (kind == detail::record_kind::rows && dim_ != 0) {
                (void)r.get<std::uint32_t>();
                const auto count = r.get<std::uint32_t>();
                for (std::uint32_t i = 0; i < count; ++i) {
                    row_meta m;
                    std::memcpy(&m, r.view<std::byte>(sizeof m).data(), sizeof m);
                    const auto d = r.get<std::uint32_t>();
                    if (d == 0 || d > dim_) dl::detail::fail("dl::ps: ", path.string(), ": row ", m.id, " of dim ", d, " in a table of dim ", dim_);
                    const auto w = r.view<float>(d);
                    index_.emplace(m.id, static_cast<std::uint32_t>(meta_.size()));
                    meta_.push_back(m);
                    weights_.insert(weights_.end(), w.begin(), w.end());
                    weights_.resize(meta_.size() * dim_, 0.0f);  // rows of an older, smaller dim: zeros past their end
                }
            } else if (kind == detail::record_kind::end) {
                ended = true;
            } else {
                dl::detail::fail("dl::ps: ", path.string(), " is not an exported table (record kind ", static_cast<std::uint32_t>(kind), ")");
            }
        }
        if (dim_ == 0 || !ended) dl::detail::fail("dl::ps: ", path.string(), " is not a complete exported table");
    }

    [[nodiscard]] std::uint32_t table_id() const noexcept { return id_; }
    [[nodiscard]] std::uint32_t dim() const noexcept { return dim_; }
    [[nodiscard]] std::size_t size() const noexcept { return meta_.size(); }
    /// id's row, or an empty span when the table has none (the caller picks the default).
    [[nodiscard]] std::span<const float> find(std::uint64_t id) const noexcept {
        const auto it = index_.find(id);
        if (it == index_.end()) return {};
        return {weights_.data() + std::size_t{it->second} * dim_, dim_};
    }
    [[nodiscard]] const row_meta* meta(std::uint64_t id) const noexcept {
        const auto it = index_.find(id);
        return it == index_.end() ? nullptr : &meta_[it->second];
    }

private:
    std::uint32_t id_ = 0, dim_ = 0;
    std::unordered_map<std::uint64_t, std::uint32_t> index_;
    std::vector<row_meta> meta_;
    std::vector<float> weights_;
};

}  // namespace dl::ps
