#pragma once
// The communicator of MPI processes: synchronous data-parallel training on CPUs, one replica per
// process (on one machine or many). Needs MPI's headers and library: link the dl::mpi CMake target.
//
// allreduce gives the bits the in-process group gives, on every rank: rank r gathers slice r of every
// rank's buffer (one MPI_Alltoallv), folds them in rank order, and MPI_Allgatherv hands the reduced
// slices to all. Each rank sends and receives 2·(N−1)/N of the buffer, as a ring allreduce does;
// MPI_Allreduce would be as fast but promises neither the order of the sum nor equal bits on every
// rank, and ranks whose gradients differ in the last bit drift apart over a training run.
//
// Every collective first agrees on the length (an MPI_Allreduce of −n and n under MAX), so a mismatch
// throws dl::error on every rank and the group stays usable. abort() calls MPI_Abort: MPI cannot make
// peers blocked in a collective return, so the whole job ends (exit code 1) instead of hanging.
// dl uses MPI's C API; the deprecated C++ bindings Open MPI and MPICH would pull in are not needed.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "communicator.hpp"

namespace dl::dist {

namespace detail {

template <class T>
[[nodiscard]] MPI_Datatype mpi_type() noexcept {
    if constexpr (std::is_same_v<T, float>)
        return MPI_FLOAT;
    else
        return MPI_DOUBLE;
}

/// Throws dl::error with MPI's own message when an MPI call did not succeed.
inline void check_mpi(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    dl::detail::fail("dl::dist::mpi_communicator: ", call, " failed: ", std::string(text, static_cast<std::size_t>(length)));
}

}  // namespace detail

/// Initialises MPI for the lifetime of the object (unless the program already did) and finalises it
/// after. Threads may run alongside, but only the thread that made it calls MPI (MPI_THREAD_FUNNELED).
class mpi_session {
public:
    mpi_session(int* argc = nullptr, char*** argv = nullptr) {
        int initialised = 0;
        MPI_Initialized(&initialised);
        if (initialised) return;
        int provided = 0;
        detail::check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        owner_ = true;
    }
    mpi_session(const mpi_session&) = delete;
    mpi_session& operator=(const mpi_session&) = delete;
    ~mpi_session() {
        if (owner_) MPI_Finalize();
    }

private:
    bool owner_ = false;
};

/// A rank of an MPI communicator (MPI_COMM_WORLD unless given). It works on a duplicate of it, so its
/// messages never meet the program's own, and reports MPI errors as dl::error.
class mpi_communicator final : public communicator {
public:
    explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD) {
        int initialised = 0;
        MPI_Initialized(&initialised);
        if (!initialised) dl::detail::fail("dl::dist::mpi_communicator: MPI is not initialised (make a dl::dist::mpi_session first)");
        detail::check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    mpi_communicator(const mpi_communicator&) = delete;
    mpi_communicator& operator=(const mpi_communicator&) = delete;
    ~mpi_communicator() override {
        int finalised = 0;
        MPI_Finalized(&finalised);
        if (!finalised) MPI_Comm_free(&comm_);
    }

    [[nodiscard]] int rank() const noexcept override { return rank_; }
    [[nodiscard]] int size() const noexcept override { return size_; }
    void allreduce(std::span<float> data, reduce_op op) override { reduce(data, op); }
    void allreduce(std::span<double> data, reduce_op op) override { reduce(data, op); }
    void broadcast(std::span<float> data, int root) override { copy_from(data, root); }
    void broadcast(std::span<double> data, int root) override { copy_from(data, root); }
    void barrier() override { detail::check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }
    void abort(const std::string& why) noexcept override {
        std::fprintf(stderr, "dl::dist::mpi_communicator: rank %d aborts the job: %s\n", rank_, why.c_str());
        MPI_Abort(comm_, 1);
    }

private:
    /// Agrees on the length with every rank; throws on all of them when the ranks' lengths differ.
    void agree_on_length(std::size_t n, const char* collective) {
        if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
            dl::detail::fail("dl::dist::", collective, ": ", n, " elements is more than MPI counts (2^31 - 1); split the buffer");
        std::int64_t bounds[2] = {-static_cast<std::int64_t>(n), static_cast<std::int64_t>(n)};
        detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, bounds, 2, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce");
        if (-bounds[0] != bounds[1])
            dl::detail::fail("dl::dist::", collective, ": rank ", rank_, " has ", n, " elements, and the ranks' lengths range from ",
                             -bounds[0], " to ", bounds[1], "; every rank must pass the same length");
    }

    template <class T>
    void reduce(std::span<T> data, reduce_op op) {
        agree_on_length(data.size(), "allreduce");
        const int n = static_cast<int>(data.size()), ranks = size_;
        // Rank r reduces elements [n·r/N, n·(r+1)/N), as in the in-process group.
        std::vector<int> counts(static_cast<std::size_t>(ranks)), offsets(static_cast<std::size_t>(ranks));
        for (int r = 0; r < ranks; ++r) {
            offsets[static_cast<std::size_t>(r)] = static_cast<int>(std::int64_t{n} * r / ranks);
            counts[static_cast<std::size_t>(r)] = static_cast<int>(std::int64_t{n} * (r + 1) / ranks) - offsets[static_cast<std::size_t>(r)];
        }
        const int mine = counts[static_cast<std::size_t>(rank_)];
        std::vector<int> from_counts(static_cast<std::size_t>(ranks), mine), from_offsets(static_cast<std::size_t>(ranks));
        for (int r = 0; r < ranks; ++r) from_offsets[static_cast<std::size_t>(r)] = r * mine;
        std::vector<T> slices(static_cast<std::size_t>(mine) * static_cast<std::size_t>(ranks));
        const MPI_Datatype type = detail::mpi_type<T>();
        detail::check_mpi(MPI_Alltoallv(data.data(), counts.data(), offsets.data(), type, slices.data(), from_counts.data(),
                                        from_offsets.data(), type, comm_),
                          "MPI_Alltoallv");
        T* const first = slices.data();
        for (int k = 1; k < ranks; ++k) {
            const T* other = first + static_cast<std::ptrdiff_t>(k) * mine;
            switch (op) {
                case reduce_op::sum:
                case reduce_op::mean:
                    for (int i = 0; i < mine; ++i) first[i] += other[i];
                    break;
                case reduce_op::max:
                    for (int i = 0; i < mine; ++i) first[i] = std::max(first[i], other[i]);
                    break;
                case reduce_op::min:
                    for (int i = 0; i < mine; ++i) first[i] = std::min(first[i], other[i]);
                    break;
            }
        }
        if (op == reduce_op::mean)
            for (int i = 0; i < mine; ++i) first[i] /= static_cast<T>(ranks);
        detail::check_mpi(MPI_Allgatherv(first, mine, type, data.data(), counts.data(), offsets.data(), type, comm_),
                          "MPI_Allgatherv");
    }

    template <class T>
    void copy_from(std::span<T> data, int root) {
        if (root < 0 || root >= size_) dl::detail::fail("dl::dist::broadcast: no root rank ", root, " in a group of ", size_);
        agree_on_length(data.size(), "broadcast");
        detail::check_mpi(MPI_Bcast(data.data(), static_cast<int>(data.size()), detail::mpi_type<T>(), root, comm_), "MPI_Bcast");
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
};

}  // namespace dl::dist
