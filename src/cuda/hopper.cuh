/*
 * hopper.cuh - the sm_90a primitives of the warp-specialised forward
 * (fwd_chunk_wg.cu): mbarriers, TMA tile and bulk copies, warpgroup MMA
 * (wgmma) with shared-memory matrix descriptors, setmaxnreg, named barriers
 * and stmatrix. Plain inline PTX; ../shared/anchors/hopper-primer.md has the
 * rules each one follows (parity, transaction bytes, fences, layouts).
 *
 * Layouts used here (bf16/fp16, 128-byte swizzle, tiles 1024-byte aligned):
 *   K-major operand: rows of 64 elements (128 B), 8-row atoms, SBO = 1024;
 *     a k-step of 16 elements adds 32 B to the start address.
 *   MN-major operand: 64 contiguous MN elements per 128-B row, 8 K-rows per
 *     atom (SBO = 1024), LBO = bytes between 64-wide MN atoms; a k-step of
 *     16 rows adds 2048 B.
 */
#ifndef FQLA_CUDA_HOPPER_CUH
#define FQLA_CUDA_HOPPER_CUH

#include <cuda.h> /* CUtensorMap (a type only: libcuda is not linked) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FQLA_HDEV __device__ __forceinline__

FQLA_HDEV uint32_t fqla_h_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarrier ---- */
FQLA_HDEV void fqla_mbar_init(uint64_t *b, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(fqla_h_smem(b)), "r"(count) : "memory");
}
FQLA_HDEV void fqla_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
FQLA_HDEV void fqla_mbar_arrive_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(fqla_h_smem(b)), "r"(bytes)
                 : "memory");
}
FQLA_HDEV void fqla_mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(fqla_h_smem(b)) : "memory");
}
/* Returns once the phase of the given parity has completed. */
FQLA_HDEV void fqla_mbar_wait(uint64_t *b, uint32_t parity)
{
    const uint32_t a = fqla_h_smem(b);
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- TMA ---- */
FQLA_HDEV void fqla_tma_prefetch(const CUtensorMap *m)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)m) : "memory");
}
/* 4-D tile load, coordinates innermost first, completion on bar. */
FQLA_HDEV void fqla_tma_load_4d(void *dst, const CUtensorMap *m, uint64_t *bar, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(fqla_h_smem(dst)),
                 "l"((uint64_t)m), "r"(fqla_h_smem(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
FQLA_HDEV void fqla_tma_load_2d(void *dst, const CUtensorMap *m, uint64_t *bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];" ::"r"(fqla_h_smem(dst)),
                 "l"((uint64_t)m), "r"(fqla_h_smem(bar)), "r"(c0), "r"(c1)
                 : "memory");
}
/* Contiguous global -> shared copy (bytes a multiple of 16, both 16-aligned). */
FQLA_HDEV void fqla_bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     fqla_h_smem(dst)),
                 "l"(src), "r"(bytes), "r"(fqla_h_smem(bar))
                 : "memory");
}
/* 4-D tile store shared -> global (box elements outside the tensor are not
 * written), in this thread's bulk async-group. */
FQLA_HDEV void fqla_tma_store_4d(const CUtensorMap *m, const void *src, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                     (uint64_t)m),
                 "r"(fqla_h_smem(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* 2-D tile store shared -> global, in this thread's bulk async-group. */
FQLA_HDEV void fqla_tma_store_2d(const CUtensorMap *m, const void *src, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"((uint64_t)m),
                 "r"(fqla_h_smem(src)), "r"(c0), "r"(c1)
                 : "memory");
}
FQLA_HDEV void fqla_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* This thread's bulk groups: at most N pending that still read shared memory. */
template <int N> FQLA_HDEV void fqla_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory"); }
/* ... at most N pending at all (their global writes done). */
template <int N> FQLA_HDEV void fqla_bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory"); }
/* Generic-proxy shared-memory writes -> visible to wgmma / TMA. */
FQLA_HDEV void fqla_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* ---- warpgroup registers and barriers ---- */
template <int R> FQLA_HDEV void fqla_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R> FQLA_HDEV void fqla_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }
FQLA_HDEV void fqla_named_sync(uint32_t id, uint32_t n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
FQLA_HDEV bool fqla_elect_one()
{
    uint32_t p;
    asm volatile("{\n\t.reg .b32 r;\n\t.reg .pred q;\n\telect.sync r|q, 0xffffffff;\n\t"
                 "selp.u32 %0, 1, 0, q;\n\t}"
                 : "=r"(p));
    return p != 0;
}
/* Four 8x8 b16 matrices from mma-fragment registers, each stored transposed;
 * lane l gives the address of row l % 8 of matrix l / 8. */
FQLA_HDEV void fqla_stsm_x4_t(void *row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(fqla_h_smem(row)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* ---- wgmma ---- */
FQLA_HDEV void fqla_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FQLA_HDEV void fqla_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> FQLA_HDEV void fqla_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
/* Keeps the compiler from moving accumulator accesses across the wgmma asm. */
template <int N> FQLA_HDEV void fqla_reg_fence(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N> FQLA_HDEV void fqla_reg_fence_u(uint32_t (&a)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a[i][j])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle (tile 1024-aligned). */
FQLA_HDEV uint64_t fqla_desc(const void *tile, uint32_t lbo, uint32_t sbo)
{
    const uint32_t a = fqla_h_smem(tile);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
FQLA_HDEV uint64_t fqla_desc_kmajor(const void *tile) { return fqla_desc(tile, 16, 1024); }
/* MN-major operand whose 64-wide MN atoms are atom_bytes apart. */
FQLA_HDEV uint64_t fqla_desc_mnmajor(const void *tile, uint32_t atom_bytes) { return fqla_desc(tile, atom_bytes, 1024); }
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

/* D (+)= A B for one k-step of 16, fp32 accumulate. TA / TB: 0 K-major,
 * 1 MN-major. scale_d = 0 overwrites D. T is __nv_bfloat16 or __half. */
template <typename T> struct fqla_wg;

#define FQLA_WG_DEFINE(TYPE, PTX)                                                                                \
    template <> struct fqla_wg<TYPE> {                                                                           \
        template <int TA, int TB>                                                                                \
        static FQLA_HDEV void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d)                       \
        {                                                                                                        \
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"                                    \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " FQLA_WG_ACC32            \
                         ", %32, %33, p, 1, 1, %35, %36;\n\t}"                                                   \
                         : FQLA_WG_OUT32(d)                                                                      \
                         : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));                                   \
        }                                                                                                        \
        template <int TB>                                                                                        \
        static FQLA_HDEV void rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d)            \
        {                                                                                                        \
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"                                    \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " FQLA_WG_ACC32            \
                         ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n\t}"                                       \
                         : FQLA_WG_OUT32(d)                                                                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));        \
        }                                                                                                        \
        template <int TB>                                                                                        \
        static FQLA_HDEV void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d)           \
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
