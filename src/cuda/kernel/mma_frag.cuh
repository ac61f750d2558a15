/*
 * kernel/mma_frag.cuh - mma.sync m16n8k16 fragments loaded with ldmatrix
 * from shared-memory tiles of b16 elements (ld in elements, a multiple of 8,
 * rows 16-byte aligned). The fragment layouts are ptx/mma_sync.cuh's.
 */
#ifndef FQLA_CUDA_KERNEL_MMA_FRAG_CUH
#define FQLA_CUDA_KERNEL_MMA_FRAG_CUH

#include "cuda/ptx/matrix_ldst.cuh"

/* A fragment (16 x 16) at (m0, k0) of a row-major [m][k] tile. */
template <typename T>
FQLA_DEVICE_INLINE void fqla_frag_a(uint32_t (&a)[4], const T *base, int ld, int m0, int k0, int lane)
{
    fqla_ldsm_x4(a, base + (m0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
/* A fragment (16 x 16) at (m0, k0) of A = X^T where X is a row-major [k][m] tile. */
template <typename T>
FQLA_DEVICE_INLINE void fqla_frag_a_t(uint32_t (&a)[4], const T *base, int ld, int m0, int k0, int lane)
{
    fqla_ldsm_x4_t(a, base + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
}
/* B fragments of two n-tiles (k0.., n0.. and n0+8..) from a row-major [k][n]
 * tile: b[0], b[1] for n-tile n0, b[2], b[3] for n0 + 8. */
template <typename T>
FQLA_DEVICE_INLINE void fqla_frag_b_kn(uint32_t (&b)[4], const T *base, int ld, int k0, int n0, int lane)
{
    fqla_ldsm_x4_t(b, base + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
}
/* The same from a row-major [n][k] tile (B^T stored, e.g. keys for Q K^T). */
template <typename T>
FQLA_DEVICE_INLINE void fqla_frag_b_nk(uint32_t (&b)[4], const T *base, int ld, int k0, int n0, int lane)
{
    fqla_ldsm_x4(b, base + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}

#endif
