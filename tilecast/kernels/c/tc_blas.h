/* The BLAS the kernels call: OpenBLAS from the scipy-openblas32 wheel, whose
 * cblas.h declares every symbol with a scipy_ prefix (so it coexists with
 * numpy's and the system's OpenBLAS in one process). Kernels use the names
 * below; tilecast/kernels/blas.py says why this library. */
#ifndef TC_BLAS_H
#define TC_BLAS_H

#include <cblas.h>

#define tc_sgemm scipy_cblas_sgemm
#define tc_blas_set_threads scipy_openblas_set_num_threads

#endif
