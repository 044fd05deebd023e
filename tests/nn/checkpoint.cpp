// safetensors checkpoints: model + optimizer round trip that resumes training bit for bit, bytes as the
// spec lays them out, every mismatch reported with nothing loaded, damaged files, and Python's
// safetensors reading and writing dl's files when it is installed.
#include "support.hpp"

#include <dl/data.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace {

namespace fs = std::filesystem;
using dl::Tensor;

fs::path temp_file(const std::string& name) {
    return fs::temp_directory_path() / ("dl_test_ckpt_" + std::to_string(::getpid()) + "_" + name);
}

auto make_model(dl::Context& c) {
    return dl::nn::sequential{dl::nn::conv2d<float>(1, 2, 3, {}, true, c), dl::nn::batch_norm<float>(2, {}, c),
                              dl::nn::relu{}, dl::nn::flatten{}, dl::nn::linear<float>(8, 3, true, c)};
}

std::vector<char> file_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const fs::path& p, const std::string& header, const std::vector<char>& data) {
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    out.write(data.data(), std::streamsize(data.size()));
}

}  // namespace

TEST_CASE("a checkpoint of model and optimizer resumes training exactly") {
    const fs::path path = temp_file("resume.safetensors");
    dl::Context c1({.seed = 1, .threads = 1}), c2({.seed = 2, .threads = 1});
    auto a = make_model(c1);
    auto b = make_model(c2);
    dl::nn::adam<float> oa(dl::nn::parameters(a), {.lr = 0.01}), ob(dl::nn::parameters(b), {.lr = 0.01});
    const auto x = dl::normal<float>({4, 1, 4, 4}, 0, 1, c1);
    const auto y = dl::tensor<std::int64_t>({0, 1, 2, 1});
    auto step = [&](auto& model, auto& opt) {
        opt.zero_grad();
        dl::nn::cross_entropy(model(x), y).backward();
        opt.step();
    };
    for (int i = 0; i < 3; ++i) step(a, oa);
    dl::nn::save_checkpoint(path, a, &oa);
    dl::nn::load_checkpoint(path, b, &ob);
    CHECK(ob.steps() == 3);
    step(a, oa);
    step(b, ob);
    std::vector<Tensor<float>> ta, tb;
    dl::nn::for_each_tensor(a, [&](std::string_view, auto& t) { ta.push_back(t); });
    dl::nn::for_each_tensor(b, [&](std::string_view, auto& t) { tb.push_back(t); });
    REQUIRE(ta.size() == 8);  // conv w, b; bn w, b; linear w, b; bn running mean, var
    for (std::size_t i = 0; i < ta.size(); ++i) CHECK(dl_test::same_elements(ta[i], tb[i]));

    // The model alone loads from a file that also holds optimizer state; names follow PyTorch's.
    auto c = make_model(c2);
    dl::nn::load_checkpoint(path, c);
    const dl::nn::safetensors_file file(path);
    CHECK(file.contains("0.weight"));
    CHECK(file.contains("1.running_var"));
    CHECK(file.contains("4.bias"));
    CHECK(file.contains("optimizer.m.0"));
    CHECK(file.metadata().at("format") == "dl");
    fs::remove(path);
}

TEST_CASE("every mismatch is reported and nothing is loaded") {
    const fs::path path = temp_file("mismatch.safetensors");
    dl::Context ctx({.seed = 1, .threads = 1});
    dl::nn::sequential small{dl::nn::linear<float>(4, 3, true, ctx), dl::nn::linear<float>(3, 2, false, ctx)};
    dl::nn::save_checkpoint(path, small);
    dl::nn::sequential other{dl::nn::linear<float>(4, 5, true, ctx), dl::nn::linear<float>(5, 2, true, ctx)};
    const auto before = dl_test::to_vector(other.get<0>().weight.detach());
    const std::string m = dl_test::error_message([&] { dl::nn::load_checkpoint(path, other); });
    CHECK(m.find("nothing was loaded") != std::string::npos);
    CHECK(m.find("'0.weight' is float32 [3, 4] in the file, float32 [5, 4] in the model") != std::string::npos);
    CHECK(m.find("'0.bias' is float32 [3]") != std::string::npos);
    CHECK(m.find("'1.weight' is float32 [2, 3]") != std::string::npos);
    CHECK(m.find("missing '1.bias'") != std::string::npos);
    CHECK(dl_test::to_vector(other.get<0>().weight.detach()) == before);

    dl::nn::sequential doubles{dl::nn::linear<double>(4, 3, true, ctx), dl::nn::linear<double>(3, 2, false, ctx)};
    CHECK(dl_test::error_message([&] { dl::nn::load_checkpoint(path, doubles); }).find("float32 [3, 4] in the file, float64") !=
          std::string::npos);
    dl::nn::sequential fewer{dl::nn::linear<float>(4, 3, true, ctx)};
    CHECK(dl_test::error_message([&] { dl::nn::load_checkpoint(path, fewer); }).find("unexpected '1.weight'") !=
          std::string::npos);
    fs::remove(path);
}

TEST_CASE("the bytes follow the safetensors spec both ways") {
    const fs::path path = temp_file("spec.safetensors");
    // Hand-built from the spec: u64 header size, JSON header, little-endian data.
    std::vector<char> data(8 + 8);
    const float f[2] = {1.5f, -2.0f};
    const std::int64_t i = 7;
    std::memcpy(data.data(), f, 8);
    std::memcpy(data.data() + 8, &i, 8);
    write_bytes(path, R"({"__metadata__":{"by":"hand"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("n":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})", data);
    const dl::nn::safetensors_file file(path);
    CHECK(dl_test::to_vector(file.get<float>("w")) == std::vector<float>{1.5f, -2.0f});
    CHECK(file.get<std::int64_t>("n").item() == 7);
    CHECK(file.metadata().at("by") == "hand");
    CHECK(dl_test::error_message([&] { (void)file.get<double>("w"); }).find("float32 [2], expected float64") !=
          std::string::npos);

    // Written by dl: header size, header padded to 8 bytes with spaces, data in order.
    dl::nn::safetensors_writer w;
    w.add("b", dl::tensor<std::int32_t>({1, 2, 3}));
    w.add("a", dl::tensor<double>({0.5}));
    w.write(path);
    const auto bytes = file_bytes(path);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    CHECK(n % 8 == 0);
    const std::string header(bytes.data() + 8, n);
    REQUIRE(bytes.size() == 8 + n + 20);
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08x", dl::crc32c(bytes.data() + 8 + n, 20));
    CHECK(header.rfind(R"({"__metadata__":{"dl.data_crc32c":")" + std::string(crc) +
                           R"("},"b":{"dtype":"I32","shape":[3],"data_offsets":[0,12]},"a":{"dtype":"F64","shape":[1],)"
                           R"("data_offsets":[12,20]}})",
                       0) == 0);
    std::int32_t second = 0;
    std::memcpy(&second, bytes.data() + 8 + n + 4, 4);
    CHECK(second == 2);
    CHECK(!fs::exists(path.string() + ".tmp"));
    fs::remove(path);
}

TEST_CASE("strided views, empty tensors and scalars are written and read in row-major order") {
    const fs::path path = temp_file("views.safetensors");
    Tensor<float> a = dl::arange<float>(0, 24).reshape({2, 3, 4});
    const Tensor<float> view = a.permute({2, 0, 1}).slice(0, 1, 4, 2);  // [2, 2, 3], no stride of 1 last
    REQUIRE(!view.is_contiguous());
    dl::nn::safetensors_writer w;
    w.add("view", view);
    w.add("empty", Tensor<float>({0, 3}));
    w.add("scalar", dl::scalar_tensor<std::int64_t>(-5));
    w.write(path);
    const dl::nn::safetensors_file file(path);
    CHECK(dl_test::to_vector(file.get<float>("view")) == dl_test::to_vector(view.contiguous()));
    CHECK(file.get<float>("empty").shape() == dl::Shape{0, 3});
    CHECK(file.get<std::int64_t>("scalar").item() == -5);

    // Read into a strided view: the elements land where the view maps them, the rest stay.
    Tensor<float> target = dl::full<float>({3, 2, 2}, 100.0f);
    Tensor<float> into = target.permute({1, 2, 0});  // [2, 2, 3]
    file.read_into("view", into);
    CHECK(dl_test::to_vector(into.contiguous()) == dl_test::to_vector(view.contiguous()));
    fs::remove(path);
}

TEST_CASE("damaged checkpoint files give clear errors") {
    const fs::path path = temp_file("bad.safetensors");
    auto message = [&] { return dl_test::error_message([&] { const dl::nn::safetensors_file f(path); }); };
    const std::vector<char> eight(8, 0);
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", {eight.begin(), eight.begin() + 5});
    CHECK(message().find("is truncated: its tensors need 8 bytes of data, the file has 5") != std::string::npos);
    CHECK(message().find(path.string()) != std::string::npos);
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", {eight.begin(), eight.end()});
    CHECK(message() == "<no dl::error>");
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::vector<char>(9));
    CHECK(message().find("1 bytes after") != std::string::npos);
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight);
    CHECK(message().find("do not span") != std::string::npos);
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"v":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", eight);
    CHECK(message().find("overlaps") != std::string::npos);
    write_bytes(path, R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", eight);
    CHECK(message().find("unsupported dtype") != std::string::npos);
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", eight);
    CHECK(message().find("not valid JSON") != std::string::npos);
    {
        std::ofstream out(path, std::ios::binary);
        const std::uint64_t n = 1000;
        out.write(reinterpret_cast<const char*>(&n), 8);
        out << "{}";
    }
    CHECK(message().find("declares a 1000-byte header, but only 2 bytes follow") != std::string::npos);
    std::ofstream(path, std::ios::binary) << "abc";
    CHECK(message().find("shorter than the 8-byte header size") != std::string::npos);
    fs::remove(path);
    CHECK(message().find("cannot open") != std::string::npos);
}

TEST_CASE("Python's safetensors reads dl's files and dl reads Python's (skipped without it)") {
    if (std::system("python3 -c 'import safetensors.numpy' > /dev/null 2>&1") != 0) {
        MESSAGE("skipped: python3 with safetensors and numpy is not installed");
        return;
    }
    const fs::path ours = temp_file("ours.safetensors"), theirs = temp_file("theirs.safetensors");
    dl::nn::safetensors_writer w;
    w.add("x", dl::tensor<float>({{1, 2}, {3, 4}}));
    w.write(ours);
    const std::string script = R"(python3 -c "from safetensors.numpy import load_file, save_file; import numpy as np; )"
                               "t = load_file('" + ours.string() + "'); assert t['x'].tolist() == [[1, 2], [3, 4]]; "
                               "save_file({'y': np.arange(6, dtype=np.int64).reshape(2, 3)}, '" + theirs.string() + R"x(')")x";
    REQUIRE(std::system(script.c_str()) == 0);
    const dl::nn::safetensors_file file(theirs);
    CHECK(dl_test::to_vector(file.get<std::int64_t>("y")) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
    fs::remove(ours);
    fs::remove(theirs);
}

TEST_CASE("extents and offsets that overflow are errors, not wrapped sizes") {
    const fs::path path = temp_file("overflow.safetensors");
    auto message = [&] { return dl_test::error_message([&] { const dl::nn::safetensors_file f(path); }); };
    // 2^32 x 2^32 elements wrap to 0 in 64 bits: without a check they match data_offsets [0, 0].
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", {});
    CHECK(message().find("overflow") != std::string::npos);
    CHECK(message().find(path.string()) != std::string::npos);
    // 2^62 x 4 bytes wraps to 0 too, past the element count.
    write_bytes(path, R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", {});
    CHECK(message().find("overflow") != std::string::npos);
    // 2^63 does not fit an int64 extent at all.
    write_bytes(path, R"({"w":{"dtype":"U8","shape":[9223372036854775808,1],"data_offsets":[0,0]}})", {});
    CHECK(message().find("overflow") != std::string::npos);
    // Offsets past the data section, near 2^63 and 2^64: named, never summed into a wrapped position.
    write_bytes(path, R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[9223372036854775804,9223372036854775808]}})", {});
    CHECK(message().find("is truncated: its tensors need 9223372036854775808 bytes of data, the file has 0") != std::string::npos);
    write_bytes(path, R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", {});
    CHECK(message().find("is truncated: its tensors need 18446744073709551615 bytes of data, the file has 0") != std::string::npos);
    fs::remove(path);
}

TEST_CASE("a checkpoint carries a CRC32C of its data, and every flipped data byte is detected") {
    const fs::path path = temp_file("crc.safetensors"), damaged = temp_file("crc_damaged.safetensors");
    dl::Context ctx({.seed = 1, .threads = 1});
    auto model = make_model(ctx);
    dl::nn::save_checkpoint(path, model);
    const auto bytes = file_bytes(path);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const std::size_t data = 8 + n;
    {
        const dl::nn::safetensors_file file(path);
        REQUIRE(file.metadata().count("dl.data_crc32c") == 1);
        CHECK(file.metadata().at("dl.data_crc32c").size() == 8);
    }
    REQUIRE(bytes.size() > data);
    for (std::size_t at = data; at < bytes.size(); ++at)
        for (const unsigned char flip : {0x01, 0x80}) {
            auto copy = bytes;
            copy[at] = static_cast<char>(copy[at] ^ flip);
            {
                std::ofstream out(damaged, std::ios::binary);
                out.write(copy.data(), std::streamsize(copy.size()));
            }
            const std::string m = dl_test::error_message([&] { dl::nn::load_checkpoint(damaged, model); });
            CAPTURE(at);
            CHECK(m.find("damaged tensor data (CRC32C mismatch)") != std::string::npos);
            CHECK(m.find(damaged.string()) != std::string::npos);
        }
    dl::nn::load_checkpoint(path, model);  // the intact file still loads

    // Files without the checksum (other writers') load as before; a malformed one is an error.
    const std::vector<char> eight(8, 0);
    write_bytes(damaged, R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight);
    CHECK(dl_test::error_message([&] { const dl::nn::safetensors_file f(damaged); }) == "<no dl::error>");
    write_bytes(damaged, R"({"__metadata__":{"dl.data_crc32c":"xyz"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight);
    CHECK(dl_test::error_message([&] { const dl::nn::safetensors_file f(damaged); }).find("8 hexadecimal digits") !=
          std::string::npos);
    fs::remove(path);
    fs::remove(damaged);
}
