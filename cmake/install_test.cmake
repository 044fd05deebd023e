# cmake -DMODE=find_package|find_package_core|add_subdirectory -DSOURCE_DIR=... -DBUILD_DIR=...
#       -DWORK_DIR=... -DGENERATOR=... -DMAKE_PROGRAM=... -DCXX=... [-DLAUNCHER=...]
#       [-DCOMPONENTS=data,ps,mpi] -P install_test.cmake
#
# Builds (with dl_precompile_headers) and runs tests/install/consumer against dl as a user would get it: installed (find_package,
# asking for COMPONENTS), installed on a machine without zlib, nlohmann-json, Boost or MPI
# (find_package_core: dl::dl alone), or vendored (add_subdirectory).
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test (${MODE}): ${what} failed (${rc})")
  endif()
endfunction()

set(_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
set(_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release)
if(MAKE_PROGRAM)
  list(APPEND _args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(LAUNCHER)
  list(APPEND _args "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()

if(MODE MATCHES "^find_package")
  set(_prefix "${WORK_DIR}/prefix")
  run_step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${_prefix}" --config Release)
  list(APPEND _args "-DCMAKE_PREFIX_PATH=${_prefix}")
  if(MODE STREQUAL "find_package_core")
    # As if none of the components' dependencies were installed: find_package(dl) must not look for them.
    foreach(_absent IN ITEMS ZLIB nlohmann_json Boost MPI)
      list(APPEND _args "-DCMAKE_DISABLE_FIND_PACKAGE_${_absent}=ON")
    endforeach()
    execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer" -B "${WORK_DIR}/asks-ps"
      ${_args} "-DDL_CONSUMER_COMPONENTS=ps" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    if(_rc EQUAL 0 OR NOT _out MATCHES "component 'ps' needs Boost")
      message(FATAL_ERROR "install test: asking for dl's ps component without Boost should fail and say why:\n${_out}")
    endif()
  else()
    list(APPEND _args "-DDL_CONSUMER_COMPONENTS=${COMPONENTS}")
  endif()
  run_step("configure" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer" -B "${_build}" ${_args})
  # Guard against a stray dl found elsewhere (system prefix, package registry).
  file(STRINGS "${_build}/CMakeCache.txt" _dl_dir REGEX "^dl_DIR:")
  string(FIND "${_dl_dir}" "${_prefix}/" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "install test: dl was not found in ${_prefix}: ${_dl_dir}")
  endif()
elseif(MODE STREQUAL "add_subdirectory")
  run_step("configure" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/subdir" -B "${_build}"
    ${_args} "-DDL_SOURCE_DIR=${SOURCE_DIR}")
else()
  message(FATAL_ERROR "install test: unknown MODE '${MODE}'")
endif()

run_step("build" ${CMAKE_COMMAND} --build "${_build}" --config Release)
# The consumer precompiles <dl/tensor.hpp> with dl_precompile_headers: the header was built.
file(GLOB_RECURSE _gch "${_build}/CMakeFiles/consumer.dir/*.gch" "${_build}/CMakeFiles/consumer.dir/*.pch")  # GCC, Clang
if(NOT _gch)
  message(FATAL_ERROR "install test (${MODE}): dl_precompile_headers(consumer) built no precompiled header")
endif()

set(_exe "${_build}/consumer")
if(NOT EXISTS "${_exe}" AND EXISTS "${_build}/Release/consumer")
  set(_exe "${_build}/Release/consumer") # multi-config generators
endif()
run_step("running the consumer" "${_exe}")
