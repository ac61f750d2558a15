/*
 * ptx/wgmma.cuh - warpgroup MMA (wgmma.mma_async) with shared-memory matrix
 * descriptors, and its fence / commit / wait.
 *
 * Layouts used here (bf16/fp16, 128-byte swizzle, tiles 1024-byte aligned):
 *   K-major operand: rows of 64 elements (128 B), 8-row atoms, SBO = 1024;
 *     a k-step of 16 elements adds 32 B to the start address.
 *   MN-major operand: 64 contiguous MN elements per 128-B row, 8 K-rows per
 *     atom (SBO = 1024), LBO = bytes between 64-wide MN atoms; a k-step of
 *     16 rows adds 2048 B.
 * An accumulator or RS A fragment must not be touched between the wgmma
 * that uses it and the wait that retires it; fqla_reg_fence keeps the
 * compiler from moving such accesses across the asm.
 */
#ifndef FQLA_CUDA_PTX_WGMMA_CUH
#define FQLA_CUDA_PTX_WGMMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/ptx/common.cuh"

/* wgmma.fence: orders register accesses before the next wgmma. */
FQLA_DEVICE_INLINE void fqla_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
/* wgmma.commit_group */
FQLA_DEVICE_INLINE void fqla_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* wgmma.wait_group: at most N groups in flight. */
template <int N> FQLA_DEVICE_INLINE void fqla_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
/* Keeps the compiler from moving accumulator accesses across the wgmma asm. */
template <int N> FQLA_DEVICE_INLINE void fqla_reg_fence(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N> FQLA_DEVICE_INLINE void fqla_reg_fence_u(uint32_t (&a)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a[i][j])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle (tile 1024-aligned), of
 * the shared-window address a or of a pointer. */
FQLA_DEVICE_INLINE uint64_t fqla_desc_at(uint32_t a, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
FQLA_DEVICE_INLINE uint64_t fqla_desc(const void *tile, uint32_t lbo, uint32_t sbo)
{
    return fqla_desc_at(fqla_smem_u32(tile), lbo, sbo);
}
FQLA_DEVICE_INLINE uint64_t fqla_desc_kmajor(const void *tile) { return fqla_desc(tile, 16, 1024); }
/* MN-major operand whose 64-wide MN atoms are atom_bytes apart. */
FQLA_DEVICE_INLINE uint64_t fqla_desc_mnmajor(const void *tile, uint32_t atom_bytes) { return fqla_desc(tile, atom_bytes, 1024); }
/* Descriptor start-address steps (the field counts 16-byte units). */
#define FQLA_DESC_K16_KMAJOR 2ull    /* +32 B */
#define FQLA_DESC_K16_MNMAJOR 128ull /* +2048 B */

#define FQLA_WG_ACC32                                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FQLA_WG_ACC64                                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FQLA_WG_OUT8(d, i)                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define FQLA_WG_OUT32(d) FQLA_WG_OUT8(d, 0), FQLA_WG_OUT8(d, 8), FQLA_WG_OUT8(d, 16), FQLA_WG_OUT8(d, 24)
#define FQLA_WG_OUT64(d) FQLA_WG_OUT32(d), FQLA_WG_OUT8(d, 32), FQLA_WG_OUT8(d, 40), FQLA_WG_OUT8(d, 48), FQLA_WG_OUT8(d, 56)

/* wgmma.mma_async: D (+)= A B for one k-step of 16, fp32 accumulate.
 * ss64 / ss128: m64n64k16 / m64n128k16, A and B from descriptors; rs64 / rs128: m64n64k16 /
 * m64n128k16, A from registers (the accumulator layout's columns 16j ..
 * 16j + 15 packed in pairs). TA / TB: 0 K-major, 1 MN-major. scale_d = 0
 * overwrites D. T is __nv_bfloat16 or __half. */
template <typename T> struct fqla_wg;

#define FQLA_WG_DEFINE(TYPE, PTX)                                                                                \
    template <> struct fqla_wg<TYPE> {                                                                           \
        template <int TA, int TB>                                                                                \
        static FQLA_DEVICE_INLINE void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d)                        \
        {                                                                                                        \
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"                                    \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " FQLA_WG_ACC32            \
                         ", %32, %33, p, 1, 1, %35, %36;\n\t}"                                                   \
                         : FQLA_WG_OUT32(d)                                                                      \
                         : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));                                   \
        }                                                                                                        \
        template <int TA, int TB>                                                                                \
        static FQLA_DEVICE_INLINE void ss128(float (&d)[64], uint64_t da, uint64_t db, int scale_d)                       \
        {                                                                                                        \
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"                                    \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " FQLA_WG_ACC64           \
                         ", %64, %65, p, 1, 1, %67, %68;\n\t}"                                                   \
                         : FQLA_WG_OUT64(d)                                                                      \
                         : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));                                   \
        }                                                                                                        \
        template <int TB>                                                                                        \
        static FQLA_DEVICE_INLINE void rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d)             \
        {                                                                                                        \
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"                                    \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " FQLA_WG_ACC32            \
                         ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n\t}"                                       \
                         : FQLA_WG_OUT32(d)                                                                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));        \
        }                                                                                                        \
        template <int TB>                                                                                        \
        static FQLA_DEVICE_INLINE void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d)            \
        {                                                                                                        \
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %69, 0;\n\t"                                    \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " FQLA_WG_ACC64           \
                         ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n\t}"                                       \
                         : FQLA_WG_OUT64(d)                                                                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));        \
        }                                                                                                        \
    };

FQLA_WG_DEFINE(__nv_bfloat16, "bf16")
FQLA_WG_DEFINE(__half, "f16")
#undef FQLA_WG_DEFINE

#endif
