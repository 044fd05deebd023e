# Debian's xsimd 8.1 package lists `xtl` in xsimd's INTERFACE_LINK_LIBRARIES without
# finding it, so every link line gets `-lxtl` and fails. xsimd only needs xtl for
# optional xtl::xcomplex support, so an empty stand-in target is enough.
if(TARGET xsimd AND NOT TARGET xtl)
  find_package(xtl QUIET)
  if(NOT TARGET xtl)
    add_library(xtl INTERFACE IMPORTED)
  endif()
endif()
