# cmake -DCXX=<compiler> -DSOURCE=<file.cpp> -DINCLUDES=<dir;dir> -DLIBRARY=<libdl_compiled.a>
#       -DWORK_DIR=<dir> -P compiled_arch_test.cmake
#
# dl::compiled is built for one instruction set: a file that links it must be built for the same one
# (device/cpu/gemm.hpp, DL_COMPILED_FOR). SOURCE built with -march=native links and runs; built for
# baseline x86-64 it must fail to link, naming the instruction set it expected.
foreach(_var CXX SOURCE LIBRARY WORK_DIR)
  if(NOT ${_var})
    message(FATAL_ERROR "compiled_arch_test.cmake: ${_var} not set")
  endif()
endforeach()
set(_flags -std=c++20 -O0 -DDL_COMPILED=1)
foreach(_dir IN LISTS INCLUDES)
  list(APPEND _flags "-I${_dir}")
endforeach()
file(MAKE_DIRECTORY "${WORK_DIR}")
set(ENV{LC_ALL} C)

execute_process(COMMAND "${CXX}" ${_flags} -march=native "${SOURCE}" "${LIBRARY}" -pthread -o "${WORK_DIR}/native"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "built with the compiled part's -march=native, ${SOURCE} does not link:\n${_out}")
endif()
execute_process(COMMAND "${WORK_DIR}/native" RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} linked with the compiled part gives wrong results (${_rc})")
endif()

execute_process(COMMAND "${CXX}" ${_flags} -march=x86-64 "${SOURCE}" "${LIBRARY}" -pthread -o "${WORK_DIR}/baseline"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "built for baseline x86-64, ${SOURCE} linked against a compiled part built for -march=native")
endif()
if(NOT _out MATCHES "undefined reference to `dl::detail::compiled_part_built_for_baseline\\(\\)'")
  message(NOTICE "---- linker output ----\n${_out}-----------------------")
  message(FATAL_ERROR "built for baseline x86-64, ${SOURCE} failed, but not by naming the instruction set")
endif()
message(STATUS "a file built for another instruction set than dl::compiled fails to link, naming it")
