#pragma once
// What the parameter-server suites share.
#include <dl/ps.hpp>

#include <future>
#include <string>

namespace dl_test {

/// The dl::error a call's future ends with, or "" when it succeeds.
inline std::string error_of(std::future<void> f) {
    try {
        f.get();
    } catch (const dl::error& e) {
        return e.what();
    }
    return "";
}

}  // namespace dl_test
