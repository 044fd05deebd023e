# cmake -DMODE=find_package|add_subdirectory -DSOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=...
#       -DGENERATOR=... -DMAKE_PROGRAM=... -DCXX=... [-DLAUNCHER=...] -P install_test.cmake
#
# Builds and runs tests/install/consumer against dl as a user would get it: installed
# (find_package) or vendored (add_subdirectory).
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

if(MODE STREQUAL "find_package")
  set(_prefix "${BUILD_DIR}/install-test/prefix")
  file(REMOVE_RECURSE "${_prefix}")
  run_step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${_prefix}" --config Release)
  run_step("configure" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer" -B "${_build}"
    ${_args} "-DCMAKE_PREFIX_PATH=${_prefix}")
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

set(_exe "${_build}/consumer")
if(NOT EXISTS "${_exe}" AND EXISTS "${_build}/Release/consumer")
  set(_exe "${_build}/Release/consumer") # multi-config generators
endif()
run_step("running the consumer" "${_exe}")
