# cmake -DCXX=<compiler> -DSOURCE=<file.cpp> -DINCLUDES=<dir;dir> -P compile_fail.cmake
#
# Passes when SOURCE fails to compile and the diagnostics match the regex on its first
# line, `// expect-error: <CMake regex>`, and when the same file with DL_CONTROL defined (which
# swaps the misuse for its correct counterpart, `#ifdef DL_CONTROL ... #else misuse #endif`)
# compiles: without that control, a file that failed for an unrelated reason whose message
# happened to match would pass. The regex is read here rather than passed on the command line so
# that spaces, quotes and semicolons survive intact.
foreach(_var CXX SOURCE)
  if(NOT ${_var})
    message(FATAL_ERROR "compile_fail.cmake: ${_var} not set")
  endif()
endforeach()

file(READ "${SOURCE}" _head LIMIT 4096)
if(NOT _head MATCHES "^[ \t]*//[ \t]*expect-error:[ \t]*([^\r\n]*[^ \t\r\n])")
  message(FATAL_ERROR "${SOURCE}: first line must be `// expect-error: <regex>`")
endif()
set(_regex "${CMAKE_MATCH_1}")
file(READ "${SOURCE}" _text)
if(NOT _text MATCHES "#ifdef DL_CONTROL")
  message(FATAL_ERROR "${SOURCE}: needs a positive control: `#ifdef DL_CONTROL <correct use> #else <misuse> #endif`")
endif()

set(_flags -std=c++20 -fsyntax-only)
foreach(_dir IN LISTS INCLUDES)
  list(APPEND _flags "-I${_dir}")
endforeach()

# Plain ASCII quotes and no colour codes, so the regex sees what it was written against.
set(ENV{LC_ALL} C)
set(ENV{GCC_COLORS} "")
execute_process(COMMAND "${CXX}" ${_flags} -DDL_CONTROL "${SOURCE}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(NOTICE "---- compiler output ----\n${_out}-------------------------")
  message(FATAL_ERROR "${SOURCE}: the positive control (DL_CONTROL defined) does not compile")
endif()
execute_process(COMMAND "${CXX}" ${_flags} "${SOURCE}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)

if(_rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but was expected to fail with: ${_regex}")
endif()
if(NOT _out MATCHES "${_regex}")
  # NOTICE prints verbatim; FATAL_ERROR would re-wrap the compiler's lines.
  message(NOTICE "---- compiler output ----\n${_out}-------------------------")
  message(FATAL_ERROR "${SOURCE} failed to compile, but no diagnostic matched `${_regex}`")
endif()
message(STATUS "${SOURCE}: failed as expected (matched `${_regex}`)")
