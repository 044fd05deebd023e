# Shared by scripts/test, scripts/run-example and scripts/bench. Source after `cd` to the repo root.
# shellcheck shell=bash
source scripts/lib/install-deps.sh

# shellcheck disable=SC2034 # used by the scripts that source this file
# libboost-dev: Asio, for the parameter server (dl::ps).
# libssl-dev: OpenSSL's libcrypto, the HMAC-SHA256 of the parameter server's handshake (dl::ps only).
# libopenmpi-dev, openmpi-bin: the MPI communicator (dl::mpi) and mpiexec for its test.
# libopenblas-dev: the DL_USE_BLAS backend's tests (test_device_blas) and the benchmarks' baseline.
# ninja-build: schedules the whole build at once (make builds the targets named on one command line
# one after another, each alone on its few files).
DL_BASE_PACKAGES=(cmake g++ make ninja-build libxsimd-dev doctest-dev libbenchmark-dev nlohmann-json3-dev
  ccache libeigen3-dev zlib1g-dev dataset-fashion-mnist libopenblas-dev libboost-dev libssl-dev libopenmpi-dev openmpi-bin)
JOBS=${JOBS:-2}
BUILD_DIR=${BUILD_DIR:-build}

section() { printf '\n==== %s ====\n' "$*"; }

# Prints "passed after Xm Ys", or the failure, as the script exits. A signal exits with 128 + its
# number: an EXIT trap alone would read the status of the last command that finished, and call an
# interrupted run passed.
dl_report_on_exit() {
  trap 'dl_finish_report' EXIT
  local signal
  for signal in HUP INT TERM; do
    # shellcheck disable=SC2064 # the signal's name and number are meant to be fixed now
    trap "dl_signal=SIG$signal; exit $((128 + $(kill -l "$signal")))" "$signal"
  done
}
dl_finish_report() {
  local rc=$? verdict=passed
  if [[ -n ${dl_signal:-} ]]; then
    verdict="FAILED: interrupted by $dl_signal (exit $rc)"
  elif ((rc != 0)); then
    verdict="FAILED (exit $rc)"
  fi
  section "$verdict after $((SECONDS / 60))m $((SECONDS % 60))s"
}

# The -G option for a new build tree: Ninja. A tree configured before keeps its generator (CMake
# refuses to switch one).
dl_generator() {
  [[ -f $1/CMakeCache.txt ]] || echo "-G Ninja"
}

# Every script configures the Release tree with the same options, so sharing BUILD_DIR
# between them never triggers a reconfigure of everything.
dl_configure_release() {
  cmake -S . -B "$BUILD_DIR" $(dl_generator "$BUILD_DIR") -DCMAKE_BUILD_TYPE=Release \
    -DDL_BUILD_TESTS=ON -DDL_BUILD_BENCH=ON -DDL_BUILD_EXAMPLES=ON
}
