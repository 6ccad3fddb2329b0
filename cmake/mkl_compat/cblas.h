/* <cblas.h> for the programs that call the BLAS themselves (benchmarks,
 * examples) in a build with OSFTRT_CPU_BLAS=MKL: MKL's CBLAS, and the one
 * OpenBLAS extension they use. */
#ifndef OSFTRT_MKL_COMPAT_CBLAS_H
#define OSFTRT_MKL_COMPAT_CBLAS_H

#include <mkl_cblas.h>
#include <mkl_service.h>

static inline int openblas_get_num_threads(void) {
  return mkl_get_max_threads();
}

#endif
