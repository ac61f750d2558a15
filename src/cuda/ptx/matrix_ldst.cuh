/*
 * ptx/matrix_ldst.cuh - ldmatrix / stmatrix: four 8x8 b16 matrices between
 * shared memory and the mma fragment layout, .trans transposing each one.
 *
 * Lanes 8q .. 8q + 7 give the row addresses (16 bytes each, 16-aligned) of
 * matrix q; register q of lane l holds row l / 4, columns 2 (l % 4) and
 * 2 (l % 4) + 1 of matrix q.
 */
#ifndef FQLA_CUDA_PTX_MATRIX_LDST_CUH
#define FQLA_CUDA_PTX_MATRIX_LDST_CUH

#include "cuda/ptx/common.cuh"

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16 */
FQLA_DEVICE_INLINE void fqla_ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fqla_smem_u32(p)));
}
/* ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 */
FQLA_DEVICE_INLINE void fqla_ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fqla_smem_u32(p)));
}
/* stmatrix.sync.aligned.m8n8.x4.shared.b16 */
FQLA_DEVICE_INLINE void fqla_stsm_x4(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(fqla_smem_u32(p)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
/* stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 */
FQLA_DEVICE_INLINE void fqla_stsm_x4_t(void *row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(fqla_smem_u32(row)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* The same by shared-window address, without a memory clobber (callers
 * order them with their barriers and fences). */
FQLA_DEVICE_INLINE void fqla_ldsm_x4_at(uint32_t (&r)[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
FQLA_DEVICE_INLINE void fqla_ldsm_x4_t_at(uint32_t (&r)[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
FQLA_DEVICE_INLINE void fqla_stsm_x4_at(uint32_t a, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3));
}

#endif
