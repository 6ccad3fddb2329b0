# The CPU GEMM/LAPACK engine, chosen at build time with one switch:
#
#   -DOSFTRT_CPU_BLAS=OpenBLAS   the default: Debian's libopenblas-dev and
#                                liblapacke-dev, nothing else to install
#   -DOSFTRT_CPU_BLAS=MKL        oneMKL (LP64, GNU OpenMP threading): PyPI's
#                                mkl-devel (.ci/setup.sh --mkl installs it
#                                under /opt/osftrt/mkl) or Debian's
#                                libmkl-dev; OSFTRT_MKL_ROOT or $MKLROOT
#                                points at another installation
#
# Sets, for the library and for the benchmarks and examples that call the
# BLAS themselves:
#   OSFTRT_BLAS_NAME           "OpenBLAS" or "MKL" (osft_build_info() adds
#                              the version and ISA at run time)
#   OSFTRT_CPU_BLAS_SOURCE     src/cpu/blas_<engine>_cpu.cpp
#   BLAS_LIBRARIES, LAPACK_LIBRARIES
#   OSFTRT_CBLAS_INCLUDE_DIR   where <cblas.h> and <lapack.h> come from (for
#                              MKL: cmake/mkl_compat, over MKL's headers)
#   OSFTRT_PC_BLAS_LIBS        the engine's part of osftrt.pc's Libs.private
set(OSFTRT_CPU_BLAS "OpenBLAS" CACHE STRING
    "CPU GEMM/LAPACK engine: OpenBLAS (default) or MKL")
set_property(CACHE OSFTRT_CPU_BLAS PROPERTY STRINGS OpenBLAS MKL)
string(TOLOWER "${OSFTRT_CPU_BLAS}" osftrt_cpu_blas)

if(osftrt_cpu_blas STREQUAL "openblas")
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  find_package(LAPACK REQUIRED)
  find_path(OSFTRT_CBLAS_INCLUDE_DIR cblas.h
    PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
    REQUIRED)
  set(OSFTRT_BLAS_NAME "OpenBLAS")
  set(OSFTRT_CPU_BLAS_SOURCE src/cpu/blas_openblas_cpu.cpp)
  set(OSFTRT_PC_BLAS_LIBS "-lopenblas")
elseif(osftrt_cpu_blas STREQUAL "mkl")
  set(OSFTRT_MKL_ROOT "" CACHE PATH
      "oneMKL installation (include/ and lib/); empty: $MKLROOT, /opt/osftrt/mkl, system")
  set(osftrt_mkl_hints)
  foreach(dir "${OSFTRT_MKL_ROOT}" "$ENV{MKLROOT}" /opt/osftrt/mkl/local /opt/osftrt/mkl
              /opt/intel/oneapi/mkl/latest)
    if(dir)
      list(APPEND osftrt_mkl_hints "${dir}")
    endif()
  endforeach()
  find_path(OSFTRT_MKL_INCLUDE_DIR mkl.h HINTS ${osftrt_mkl_hints}
    PATH_SUFFIXES include include/mkl mkl)
  # PyPI's wheels carry only the versioned names (libmkl_core.so.2 or .3).
  set(osftrt_mkl_libs)
  foreach(part intel_lp64 gnu_thread core)
    find_library(OSFTRT_MKL_${part}_LIBRARY
      NAMES mkl_${part} libmkl_${part}.so.3 libmkl_${part}.so.2
      HINTS ${osftrt_mkl_hints} PATH_SUFFIXES lib lib/intel64)
    if(NOT OSFTRT_MKL_${part}_LIBRARY)
      set(OSFTRT_MKL_INCLUDE_DIR OSFTRT_MKL_INCLUDE_DIR-NOTFOUND)
    endif()
    list(APPEND osftrt_mkl_libs "${OSFTRT_MKL_${part}_LIBRARY}")
  endforeach()
  if(NOT OSFTRT_MKL_INCLUDE_DIR)
    message(FATAL_ERROR
      "OSFTRT_CPU_BLAS=MKL, but oneMKL (mkl.h, libmkl_intel_lp64, libmkl_gnu_thread, "
      "libmkl_core) was not found: run `bash .ci/setup.sh --mkl` (PyPI's mkl-devel "
      "into /opt/osftrt/mkl), install Debian's libmkl-dev, or set OSFTRT_MKL_ROOT.")
  endif()
  # MKL's GNU threading layer runs on GCC's libgomp; the engine's
  # parallel_for runs the element-wise passes on the same OpenMP team.
  find_package(OpenMP REQUIRED COMPONENTS C CXX)
  set_source_files_properties(src/cpu/blas_mkl_cpu.cpp PROPERTIES
    COMPILE_OPTIONS "${OpenMP_CXX_FLAGS}")
  if(OpenMP_gomp_LIBRARY)
    set(osftrt_mkl_omp "${OpenMP_gomp_LIBRARY}")
  else()
    set(osftrt_mkl_omp ${OpenMP_C_LIBRARIES})
  endif()
  set(BLAS_LIBRARIES ${osftrt_mkl_libs} ${osftrt_mkl_omp} m ${CMAKE_DL_LIBS})
  set(LAPACK_LIBRARIES ${BLAS_LIBRARIES})
  set(OSFTRT_CBLAS_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/cmake/mkl_compat"
      "${OSFTRT_MKL_INCLUDE_DIR}")
  set(OSFTRT_BLAS_NAME "MKL")
  set(OSFTRT_CPU_BLAS_SOURCE src/cpu/blas_mkl_cpu.cpp)
  set(OSFTRT_PC_BLAS_LIBS)
  foreach(lib IN LISTS osftrt_mkl_libs)
    string(APPEND OSFTRT_PC_BLAS_LIBS " ${lib}")
  endforeach()
  string(APPEND OSFTRT_PC_BLAS_LIBS " -lgomp -lm -ldl")
  string(STRIP "${OSFTRT_PC_BLAS_LIBS}" OSFTRT_PC_BLAS_LIBS)
  # An installed libosftrt finds MKL where it was linked (not a system dir).
  set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
else()
  message(FATAL_ERROR "OSFTRT_CPU_BLAS must be OpenBLAS or MKL, not '${OSFTRT_CPU_BLAS}'")
endif()
