/*
 * ptx/mma_sync.cuh - warp-level tensor-core products (mma.sync), fp32
 * accumulate: m16n8k16 on bf16 / fp16 and m16n8k8 on tf32.
 *
 * Fragment layouts (PTX ISA; g = lane / 4, t = lane % 4):
 *   accumulator d[4]: (row g, cols 2t, 2t+1), (row g + 8, cols 2t, 2t+1)
 *   m16n8k16 A (16 x 16) a[4]: rows g / g+8, cols 2t.. and 2t+8..
 *            B (16 x 8)  b0, b1: k = 2t.. and 2t+8.., column n = g
 *   m16n8k8  A (16 x 8)  a[4]: a0 (g, t), a1 (g+8, t), a2 (g, t+4),
 *            a3 (g+8, t+4); B b0, b1: k = t / t+4, column g
 */
#ifndef FQLA_CUDA_PTX_MMA_SYNC_CUH
#define FQLA_CUDA_PTX_MMA_SYNC_CUH

#include "cuda/ptx/common.cuh"

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d += a b */
FQLA_DEVICE_INLINE void fqla_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: d += a b */
FQLA_DEVICE_INLINE void fqla_mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: d += a b */
FQLA_DEVICE_INLINE void fqla_mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* x as two tf32 operands for 3xTF32 products: big = x with its 13 low bits
 * cleared, small = x - big (exact; the mma reads its top 10 mantissa bits),
 * so big + small carries ~21 bits. */
FQLA_DEVICE_INLINE void fqla_tf32_split3(float x, uint32_t &big, uint32_t &small)
{
    big = __float_as_uint(x) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

#endif
