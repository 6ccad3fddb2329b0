/* <lapack.h> (the reference LAPACK's C prototypes) for the programs that
 * call LAPACK themselves in a build with OSFTRT_CPU_BLAS=MKL. */
#ifndef OSFTRT_MKL_COMPAT_LAPACK_H
#define OSFTRT_MKL_COMPAT_LAPACK_H

#include <mkl_lapack.h>

typedef MKL_INT lapack_int;
#define LAPACK_sgeqrf sgeqrf
#define LAPACK_sorgqr sorgqr
#define LAPACK_dgeqrf dgeqrf
#define LAPACK_dorgqr dorgqr

#endif
