# dl_precompile_headers(<target> [HEADERS <header>...])
#
# Precompiles dl's headers for <target> (by default <dl/dl.hpp>; name the umbrella the target's files
# include, such as <dl/tensor.hpp> or <dl/nn.hpp>, and any other headers they all start with), so that
# each of its files skips parsing them: several seconds of g++ per file. The headers are compiled with
# the target's own flags and definitions, as every file of it must be for GCC to use them.
#
# The target is compiled without its compiler launcher (ccache): on a rebuild, ccache took the
# previous .gch beside the -include'd header for the header itself and returned a stale one.
function(dl_precompile_headers target)
  cmake_parse_arguments(ARG "" "" "HEADERS" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "dl_precompile_headers: unexpected arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_HEADERS)
    set(ARG_HEADERS <dl/dl.hpp>)
  endif()
  target_precompile_headers(${target} PRIVATE ${ARG_HEADERS})
  set_target_properties(${target} PROPERTIES CXX_COMPILER_LAUNCHER "")
endfunction()
