# dl::blas: OpenBLAS with its own cblas.h (Debian: libopenblas-dev), for DL_USE_BLAS builds and for
# the tests of that path. Defines nothing when OpenBLAS or its header is missing (DL_BLAS_FOUND off).
if(NOT TARGET dl::blas)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  find_path(DL_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas openblas-openmp)
  if(BLAS_FOUND AND DL_CBLAS_INCLUDE_DIR)
    add_library(dl::blas INTERFACE IMPORTED)
    set_target_properties(dl::blas PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${DL_CBLAS_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${BLAS_LIBRARIES}")
  endif()
endif()
if(TARGET dl::blas)
  set(DL_BLAS_FOUND ON)
else()
  set(DL_BLAS_FOUND OFF)
  if(DL_USE_BLAS)
    message(FATAL_ERROR "DL_USE_BLAS is on but OpenBLAS (library and cblas.h) was not found: install libopenblas-dev")
  endif()
endif()
