#pragma once
// Code generation for fused nodes: the chain of a fused node becomes C++ source that applies its
// functors one after another in registers (the same functors, named by their ops), a C++ compiler on
// this machine builds it into a shared object, and the executor calls that loop instead of running
// the steps tile by tile. This is what a compile-time fused expression does, for a chain that was only
// known after tracing; the interpreted tiles of executor.hpp stay the fallback.
//
// Opt in with the fused_codegen() pass (it is not in default_passes(): building a kernel takes a
// compiler and seconds). Kernels are cached on disk under a hash of their source, what the compiler
// and its flags resolve to, and dl's expression headers, so a chain compiles once per machine. When no compiler runs, a
// header is missing or a step has no generated form (a dtype other than float, or an op outside the
// named unary and binary functors), the node keeps its steps; DL_DEBUG=1 says why.
//
// Results equal the interpreted steps' bit for bit when both are compiled for the same target (the
// default flags: -march=native, and -ffp-contract=off so that no multiply and add of two steps merge
// into an FMA the steps would round twice) for dl's own kernels (arithmetic, exp, sigmoid, tanh and
// what builds on them). Functions that fall back to xsimd (log, sin, pow, ...) may differ in the last
// bit where the program's compiler contracted a multiply and add that the kernel's did not. Headers
// outside the system include path (xsimd) go into `flags` as -I options.
//
// POSIX only (dlopen, posix_spawn). The cache directory holds code this process loads: it must be
// writable by its user alone, as ccache's is.
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "../version.hpp"
#include "ir.hpp"
#include "passes.hpp"

extern char** environ;  // posix_spawn hands it to the compiler

namespace dl::graph {

struct codegen_options {
    /// Where kernels are kept. Empty: $DL_CACHE_DIR, else $XDG_CACHE_HOME/dl, else $HOME/.cache/dl,
    /// else dl-cache-<uid> in the system's temporary directory. It must belong to this user and be
    /// writable by no one else (it holds code this process loads); compile_fused checks that.
    std::filesystem::path cache_dir{};
    /// Empty: $DL_CXX, else `c++` from PATH.
    std::string compiler{};
    /// The directory that holds dl/. Empty: $DL_INCLUDE_DIR, else the one this header was included from
    /// (__FILE__; a relative one, as ccache's base_dir makes it, is taken from the working directory,
    /// which only works when that is where the compiler ran).
    std::filesystem::path include_dir{};
    std::vector<std::string> flags = {"-std=c++20", "-O2", "-march=native", "-ffp-contract=off", "-DNDEBUG"};
};

namespace detail {

inline bool codegen_debug() {
    const char* env = std::getenv("DL_DEBUG");
    return env && std::atoi(env) >= 1;
}

inline std::string env_or(const char* name, std::string fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : std::move(fallback);
}

inline std::filesystem::path codegen_cache_dir(const codegen_options& o) {
    if (!o.cache_dir.empty()) return o.cache_dir;
    if (const char* v = std::getenv("DL_CACHE_DIR"); v && *v) return v;
    if (const char* v = std::getenv("XDG_CACHE_HOME"); v && *v) return std::filesystem::path(v) / "dl";
    if (const char* v = std::getenv("HOME"); v && *v) return std::filesystem::path(v) / ".cache" / "dl";
    return std::filesystem::temp_directory_path() / ("dl-cache-" + std::to_string(::geteuid()));
}

inline std::filesystem::path codegen_include_dir(const codegen_options& o) {
    if (!o.include_dir.empty()) return o.include_dir;
    if (const char* v = std::getenv("DL_INCLUDE_DIR"); v && *v) return v;
    std::error_code ec;
    // This file is <include>/dl/graph/codegen.hpp.
    return std::filesystem::absolute(std::filesystem::path(__FILE__), ec).parent_path().parent_path().parent_path();
}

/// A C++ literal of type T (float or double) for `value`, the shortest text that attributes print for
/// a T; "" when the text is not a number.
template <class T>
std::string literal(std::string_view value) {
    const std::string type = std::is_same_v<T, float> ? "float" : "double";
    if (value == "inf") return "std::numeric_limits<" + type + ">::infinity()";
    if (value == "-inf") return "-std::numeric_limits<" + type + ">::infinity()";
    if (value == "nan" || value == "-nan") return "std::numeric_limits<" + type + ">::quiet_NaN()";
    if (value.empty() || value.find_first_not_of("0123456789.eE+-") != std::string_view::npos) return {};
    std::string text(value);
    if (text.find_first_of(".eE") == std::string::npos) text += ".0";
    return std::is_same_v<T, float> ? text + "f" : text;
}

/// The "key=value" pairs of an attribute text.
inline std::vector<std::pair<std::string, std::string>> attribute_pairs(std::string_view attributes) {
    std::vector<std::pair<std::string, std::string>> pairs;
    while (!attributes.empty()) {
        const std::size_t end = std::min(attributes.find(", "), attributes.size());
        const std::string_view pair = attributes.substr(0, end);
        const std::size_t eq = pair.find('=');
        if (eq != std::string_view::npos) pairs.emplace_back(pair.substr(0, eq), pair.substr(eq + 1));
        attributes.remove_prefix(std::min(end + 2, attributes.size()));
    }
    return pairs;
}

/// The C++ source of fused node n's loop, or an empty string with `why` set when a step has no
/// generated form.
inline std::string fused_source(const Graph& g, const node& n, std::string& why) {
    for (int in : n.inputs)
        if (g.values[static_cast<std::size_t>(in)].dtype != DType::float32) {
            why = "an input is not float32";
            return {};
        }
    std::ostringstream body;
    for (std::size_t s = 0; s < n.steps.size(); ++s) {
        const fused_step& step = n.steps[s];
        const bool unary = ops::listed(ops::unary_functors{}, step.op);
        if (step.dtype != DType::float32 || !(unary || ops::listed(ops::binary_functors{}, step.op))) {
            why = dl::detail::concat("step ", s, " (", step.op, ") has no generated form");
            return {};
        }
        std::vector<std::string> scalars(2), members;
        // Scalar operands ("s<position>") have the step's dtype; functor parameters (leaky_relu's slope,
        // elu's alpha) are doubles.
        std::vector<std::string> seen;
        for (const auto& [key, value] : attribute_pairs(step.attributes)) {
            // Only the keys dl records, once each: a loaded graph's attributes are text from a file and
            // must not reach the source as anything but a checked number.
            const bool scalar = key == "s0" || key == "s1";
            if ((!scalar && key != "slope" && key != "alpha") || std::find(seen.begin(), seen.end(), key) != seen.end()) {
                why = dl::detail::concat("step ", s, " (", step.op, ") has attribute ", key);
                return {};
            }
            seen.push_back(key);
            const std::string text = scalar ? literal<float>(value) : literal<double>(value);
            if (text.empty()) {
                why = dl::detail::concat("step ", s, " (", step.op, ") has attribute ", key, "=", value);
                return {};
            }
            if (scalar)
                scalars[static_cast<std::size_t>(key[1] - '0')] = "V(" + text + ")";
            else
                members.push_back("f." + key + " = " + text + "; ");
        }
        const std::size_t arity = unary ? 1 : 2;
        std::vector<std::string> operands;
        std::size_t next = 0;
        for (std::size_t p = 0; p < arity; ++p) {
            if (!scalars[p].empty()) {
                operands.push_back(scalars[p]);
                continue;
            }
            if (next >= step.inputs.size()) {
                why = dl::detail::concat("step ", s, " (", step.op, ") has too few operands");
                return {};
            }
            const int i = step.inputs[next++];
            operands.push_back(i >= 0 ? "in" + std::to_string(i) : "s" + std::to_string(-1 - i));
        }
        if (next != step.inputs.size()) {
            why = dl::detail::concat("step ", s, " (", step.op, ") has too many operands");
            return {};
        }
        body << "    const auto f" << s << " = [] { dl::ops::named<\"" << step.op << "\"> f{}; " ;
        for (const auto& m : members) body << m;
        body << "return f; }();\n    const V s" << s << " = V(f" << s << '(';
        for (std::size_t p = 0; p < operands.size(); ++p) body << (p ? ", " : "") << operands[p];
        body << "));\n";
    }
    const std::size_t inputs = n.inputs.size();
    std::ostringstream src;
    src << "// Generated by dl::graph::fused_codegen.\n"
        << "#include <cstdint>\n#include <limits>\n#include <dl/expr/functors.hpp>\n\nnamespace {\n"
        << "template <class V>\nDL_INLINE V chain(";
    for (std::size_t k = 0; k < inputs; ++k) src << (k ? ", " : "") << "const V& in" << k;
    src << ") {\n" << body.str() << "    return s" << n.steps.size() - 1 << ";\n}\n}  // namespace\n\n"
        << "extern \"C\" void dl_fused_chain(const void* const* inputs, const unsigned char* broadcast, void* out_void,\n"
        << "                               std::int64_t count, bool stream) {\n"
        << "    using V = dl::simd::batch<float>;\n    constexpr std::int64_t W = dl::simd::width<float>;\n"
        << "    float* out = static_cast<float*>(out_void);\n";
    for (std::size_t k = 0; k < inputs; ++k)
        src << "    const float* p" << k << " = static_cast<const float*>(inputs[" << k << "]);\n    const bool b" << k
            << " = broadcast[" << k << "] != 0;\n";
    // The tail runs through the SIMD path too, on copies padded to a whole batch, as the interpreted
    // steps' rows do (run_row's partial loads): every element gets the same instructions either way.
    auto call = [&](bool tail) {
        std::string args;
        for (std::size_t k = 0; k < inputs; ++k) {
            const std::string p = "p" + std::to_string(k);
            args += (k ? ", " : "");
            args += "b" + std::to_string(k) + " ? V(*" + p + ") : dl::simd::load(" + (tail ? "t" + std::to_string(k) : p + " + i") + ")";
        }
        return "chain(" + args + ")";
    };
    src << "    std::int64_t i = 0;\n    for (; i + W <= count; i += W) {\n        const V r = " << call(false)
        << ";\n        if (stream)\n            dl::simd::store_stream(out + i, r);\n        else\n"
        << "            dl::simd::store(out + i, r);\n    }\n    if (stream) dl::simd::stream_fence();\n"
        << "    if (i == count) return;\n    const std::int64_t rest = count - i;\n";
    for (std::size_t k = 0; k < inputs; ++k)
        src << "    alignas(64) float t" << k << "[W] = {};\n    if (!b" << k << ") for (std::int64_t j = 0; j < rest; ++j) t" << k
            << "[j] = p" << k << "[i + j];\n";
    src << "    alignas(64) float r[W];\n    dl::simd::store(r, " << call(true)
        << ");\n    for (std::int64_t j = 0; j < rest; ++j) out[i + j] = r[j];\n}\n";
    return src.str();
}

/// FNV-1a, 64 bits: a cache key, not a defence against collisions someone crafts.
inline std::uint64_t fnv1a(std::string_view data, std::uint64_t h = 1469598103934665603ull) {
    for (const char c : data) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return h;
}

/// Hashes the headers a kernel compiles against, so that a changed dl invalidates its kernels.
inline std::uint64_t hash_headers(const std::filesystem::path& include_dir, std::uint64_t h) {
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const char* dir : {"dl/expr", "dl/core"})
        for (auto it = std::filesystem::recursive_directory_iterator(include_dir / dir, ec);
             !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
            if (it->is_regular_file()) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        h = fnv1a(f.filename().string(), fnv1a(text, h));
    }
    return h;
}

/// Runs argv to completion with stdout and stderr into `log`; true when it exits with status 0, or
/// when its status is lost (below).
inline bool run_program(const std::vector<std::string>& argv, const std::filesystem::path& log) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) return false;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        // A host that ignores SIGCHLD (servers often do) has its children reaped for it, status and
        // all. The callers then judge by what the compiler wrote: no macros, or no library to rename
        // and load, is a failure.
        if (errno == ECHILD) return true;
        if (errno != EINTR) return false;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// `compiler flags -dM -E` of an empty file: the compiler's version and what the flags select; empty
/// when it does not run.
inline std::string predefined_macros(const std::string& compiler, const std::vector<std::string>& flags,
                                     const std::filesystem::path& out) {
    std::vector<std::string> argv{compiler};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"-x", "c++", "-dM", "-E", "/dev/null"});
    std::string text;
    if (run_program(argv, out)) {
        std::ifstream in(out, std::ios::binary);
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::error_code ec;
    std::filesystem::remove(out, ec);
    return text;
}

/// The part of a kernel's cache key that is not its source: dl's version, the compiler, what it and
/// its flags resolve to (version, target features: a cache shared between machines must not hand
/// AVX-512 code to one without it), the flags and the headers. Worked out once per process for each
/// compiler, flags and include directory: a compiler run and a read of dl's headers cost ~50 ms,
/// per fused node even when its kernel is cached. Empty when the compiler does not run (not
/// remembered: it may be installed later).
inline std::optional<std::uint64_t> toolchain_key(const std::string& compiler, const std::vector<std::string>& flags,
                                                  const std::filesystem::path& include, const std::filesystem::path& scratch) {
    static std::mutex mutex;
    static std::map<std::string, std::uint64_t> known;
    std::string id = compiler + '\n' + include.string();
    for (const auto& f : flags) id += '\n' + f;
    {
        const std::lock_guard lock(mutex);
        if (const auto it = known.find(id); it != known.end()) return it->second;
    }
    const std::string predefined = predefined_macros(compiler, flags, scratch);
    if (predefined.empty()) return std::nullopt;
    std::uint64_t key = fnv1a(compiler, fnv1a(DL_VERSION_STRING));
    key = fnv1a(predefined, key);
    for (const auto& f : flags) key = fnv1a(f + '\n', key);
    key = hash_headers(include, key);
    const std::lock_guard lock(mutex);
    known.emplace(std::move(id), key);
    return key;
}

inline compiled_chain load_chain(const std::filesystem::path& library, std::string& why) {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* error = dlerror();
        why = dl::detail::concat("dlopen failed: ", error ? error : "unknown error");
        return {};
    }
    compiled_chain c;
    c.library = std::shared_ptr<void>(handle, [](void* h) { dlclose(h); });
    c.run = reinterpret_cast<decltype(c.run)>(dlsym(handle, "dl_fused_chain"));
    if (!c.run) {
        why = dl::detail::concat(library.string(), " has no dl_fused_chain");
        return {};
    }
    return c;
}

}  // namespace detail

/// Fused node n of g compiled into one loop (see the top of this file), or an empty compiled_chain
/// when it cannot be; `why`, when given, then says why.
[[nodiscard]] inline compiled_chain compile_fused(const Graph& g, const node& n, const codegen_options& options = {},
                                                  std::string* why = nullptr) {
    std::string reason;
    auto fail = [&](std::string r) {
        if (why) *why = r;
        if (detail::codegen_debug()) std::cerr << "dl::graph::fused_codegen: " << n.op << " {" << n.attributes << "} stays interpreted: " << r << '\n';
        return compiled_chain{};
    };
    if (!n.fused()) return fail("not a fused node");
    const std::string source = detail::fused_source(g, n, reason);
    if (source.empty()) return fail(reason);
    const std::filesystem::path include = detail::codegen_include_dir(options);
    if (!std::filesystem::exists(include / "dl" / "expr" / "functors.hpp"))
        return fail(dl::detail::concat("no dl headers under ", include.string(), " (set DL_INCLUDE_DIR)"));
    const std::filesystem::path dir = detail::codegen_cache_dir(options);
    std::error_code ec;
    if (std::filesystem::create_directories(dir, ec)) std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
    if (ec) return fail(dl::detail::concat("cannot create ", dir.string(), ": ", ec.message()));
    struct stat info{};
    if (::lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != ::geteuid() || (info.st_mode & (S_IWGRP | S_IWOTH)))
        return fail(dl::detail::concat(dir.string(), " is not a directory of this user's that only it can write"));
    // Files of this process and thread, renamed into place when whole: processes building the same
    // kernel at once each rename a whole file.
    const std::string own = dl::detail::concat(".", getpid(), ".", std::hash<std::thread::id>{}(std::this_thread::get_id()));
    const std::string compiler = options.compiler.empty() ? detail::env_or("DL_CXX", "c++") : options.compiler;
    const auto toolchain = detail::toolchain_key(compiler, options.flags, include, dir / ("macros" + own));
    if (!toolchain) return fail(dl::detail::concat(compiler, " did not run"));
    const std::uint64_t key = detail::fnv1a(source, *toolchain);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
    const std::filesystem::path library = dir / (std::string("fused-") + hex + ".so");
    if (std::filesystem::exists(library)) {
        if (compiled_chain c = detail::load_chain(library, reason)) return c;
        std::filesystem::remove(library, ec);  // unreadable (a crash mid-write elsewhere): build it again
    }
    const std::filesystem::path cpp = dir / (std::string("fused-") + hex + own + ".cpp");
    const std::filesystem::path partial = dir / (std::string("fused-") + hex + own + ".so.partial");
    const std::filesystem::path log = dir / (std::string("fused-") + hex + own + ".log");
    {
        std::ofstream out(cpp);
        out << source;
        if (!out) {
            std::filesystem::remove(cpp, ec);
            return fail(dl::detail::concat("cannot write ", cpp.string()));
        }
    }
    std::vector<std::string> argv{compiler};
    argv.insert(argv.end(), options.flags.begin(), options.flags.end());
    for (const char* f : {"-fPIC", "-shared", "-I"}) argv.emplace_back(f);
    argv.push_back(include.string());
    argv.insert(argv.end(), {"-o", partial.string(), cpp.string()});
    const bool built = detail::run_program(argv, log);
    std::filesystem::remove(cpp, ec);
    if (!built) {
        std::filesystem::remove(partial, ec);
        return fail(dl::detail::concat(compiler, " failed; see ", log.string()));
    }
    std::filesystem::rename(partial, library, ec);
    if (ec) {
        std::filesystem::remove(partial, ec);
        return fail(dl::detail::concat("cannot rename ", partial.string(), " to ", library.string()));
    }
    std::filesystem::remove(log, ec);
    compiled_chain c = detail::load_chain(library, reason);
    return c ? c : fail(reason);
}

/// Compiles every fused node it can (compile_fused); the others keep running their steps.
[[nodiscard]] inline pass fused_codegen(codegen_options options = {}) {
    return {"fused_codegen", {"elementwise_fusion"}, {}, [options = std::move(options)](Graph& g) {
                for (node& n : g.nodes)
                    if (n.fused() && !n.compiled) n.compiled = compile_fused(g, n, options);
            }};
}

}  // namespace dl::graph
