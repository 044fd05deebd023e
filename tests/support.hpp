#pragma once
// Helpers shared by the tests: a scalar reference walk over any strided tensor, elementwise
// comparison, the DL_TEST_QUICK switch, and a child process for checks that may crash.
#include <dl/dl.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

/// The element types every core test runs over (TEST_CASE_TEMPLATE).
#define DL_ELEMENT_TYPES float, double, std::int32_t, std::int64_t, std::uint8_t, bool

/// CHECK that dl::autograd::gradcheck(args...) passes, reporting its message.
#define CHECK_GRAD(...)                                                \
    do {                                                               \
        const auto grad_result_ = dl::autograd::gradcheck(__VA_ARGS__); \
        INFO(grad_result_.message);                                    \
        CHECK(grad_result_.ok);                                        \
    } while (0)

namespace dl_test {

/// True when DL_TEST_QUICK is set (and not "0"): the sanitizer build asks heavy tests to shrink.
[[nodiscard]] inline bool quick() {
    const char* v = std::getenv("DL_TEST_QUICK");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

/// `expected` within a relative tolerance (doctest's Approx alone adds 1 to the scale, which makes a
/// small epsilon an absolute tolerance and hides errors in small values).
[[nodiscard]] inline doctest::Approx relative(double expected, double tolerance) {
    return doctest::Approx(expected).epsilon(tolerance).scale(0);
}

/// Calls f(index) for every index of `shape` in row-major order; `index` points at rank() values.
template <class F>
void for_each_index(const dl::Shape& shape, F&& f) {
    if (shape.numel() == 0) return;
    std::int64_t index[dl::max_rank] = {};
    for (std::int64_t k = 0; k < shape.numel(); ++k) {
        f(static_cast<const std::int64_t*>(index));
        for (int d = shape.size() - 1; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
    }
}

/// The reference loop: t's elements in row-major order of its shape, read one by one through its
/// strides and offset (no library code on the way but data(), shape() and strides()).
template <class T>
[[nodiscard]] std::vector<T> to_vector(const dl::Tensor<T>& t) {
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(t.numel()));
    for_each_index(t.shape(), [&](const std::int64_t* index) {
        std::int64_t pos = 0;
        for (int d = 0; d < t.rank(); ++d) pos += index[d] * t.strides()[d];
        out.push_back(t.data()[pos]);
    });
    return out;
}

/// Same shape and every element equal (within `tolerance` for floating types).
template <class T, class U>
[[nodiscard]] bool same_elements(const dl::Tensor<T>& a, const dl::Tensor<U>& b, double tolerance = 0) {
    if (a.shape() != b.shape()) return false;
    const auto va = to_vector(a);
    const auto vb = to_vector(b);
    for (std::size_t i = 0; i < va.size(); ++i) {
        const double x = static_cast<double>(va[i]), y = static_cast<double>(vb[i]);
        if (!(x == y || std::abs(x - y) <= tolerance)) return false;
    }
    return true;
}

/// A tensor of `shape` holding 0, 1, 2, ... in row-major order.
template <class T>
[[nodiscard]] dl::Tensor<T> iota(const dl::Shape& shape, dl::Context& ctx = dl::default_context()) {
    dl::Tensor<T> t(shape, ctx);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(i);
    return t;
}

/// The what() of the dl::error that f() throws, or "<no dl::error>".
template <class F>
[[nodiscard]] std::string error_message(F&& f) {
    try {
        f();
    } catch (const dl::error& e) {
        return e.what();
    }
    return "<no dl::error>";
}

template <class T>
[[nodiscard]] std::string to_string(const T& value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

/// Runs f() in a forked child so that a crash (a library bug) fails one check instead of taking the
/// whole test binary down. Returns f's result (0..255) when it returns, 128 + signal when the child
/// was killed, 200 when f threw something, -1 when fork failed. The child's output is discarded, it
/// gets the default crash signal handlers back (not doctest's, which would report and carry on with
/// the test run) and is killed after `seconds`. Keep f single-threaded: only the forking thread exists
/// in the child.
template <class F>
[[nodiscard]] int exit_code_in_child(F&& f, unsigned seconds = 30) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (const int null = ::open("/dev/null", O_WRONLY); null >= 0) {
            ::dup2(null, STDOUT_FILENO);
            ::dup2(null, STDERR_FILENO);
        }
        for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTRAP}) std::signal(sig, SIG_DFL);
        ::alarm(seconds);
        int code = 200;
        try {
            code = f();
        } catch (...) {
        }
        std::_Exit(code);
    }
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/// Words for an exit_code_in_child() result, for failure messages.
[[nodiscard]] inline std::string describe_child_outcome(int outcome) {
    if (outcome == 0) return "passed";
    if (outcome == -1) return "could not run a child process";
    if (outcome == 200) return "threw an unexpected exception";
    if (outcome > 128 && outcome < 200) return "killed by signal " + std::to_string(outcome - 128);
    return "exited with code " + std::to_string(outcome) + " (a failed check, or a sanitizer report)";
}

}  // namespace dl_test

// Readable failure messages for CHECK(to_vector(t) == std::vector<float>{...}).
namespace doctest {
template <class T>
struct StringMaker<std::vector<T>> {
    static String convert(const std::vector<T>& v) {
        std::ostringstream out;
        out << '{';
        for (std::size_t i = 0; i < v.size(); ++i) {
            out << (i ? ", " : "");
            if constexpr (sizeof(T) == 1)
                out << static_cast<int>(v[i]);
            else if constexpr (requires { v[i].size(); })
                out << StringMaker<T>::convert(v[i]);
            else
                out << v[i];
        }
        out << '}';
        return out.str().c_str();
    }
};
}  // namespace doctest
