# cmake -DCLANG=<clang++> -DSOURCE=<fuzzer.cpp> -DINCLUDES=<dir;dir> -DOUT=<binary> -DRUNS=<n> -P fuzz_test.cmake
#
# Builds a libFuzzer target with clang (ASan + UBSan + fuzzer) and runs it for a bounded number of
# inputs: a smoke run in ctest, not a fuzzing campaign (run the binary without -runs for that).
set(_flags -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
foreach(_dir IN LISTS INCLUDES)
  list(APPEND _flags "-I${_dir}")
endforeach()
execute_process(COMMAND "${CLANG}" ${_flags} "${SOURCE}" -o "${OUT}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "building ${OUT} failed:\n${_out}")
endif()
execute_process(COMMAND "${OUT}" -runs=${RUNS} -max_len=4096 -seed=1 RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${OUT} found a failing input:\n${_out}")
endif()
string(REGEX MATCH "Done [0-9]+ runs[^\n]*" _done "${_out}")
message(STATUS "${_done}")
