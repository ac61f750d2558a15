/*
 * fwd_ptx.cuh - the few PTX wrappers the forward kernels use: warp-level
 * tensor-core products (mma.sync m16n8k16, fp32 accumulate), ldmatrix
 * fragment loads, cp.async 16-byte copies with zero fill, and the bf16/fp16
 * element traits (pack two floats, unpack a pair).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4):
 *   accumulator c[4]: (row g, cols 2t, 2t+1), (row g + 8, cols 2t, 2t+1)
 *   A (16 x 16) a[4]: rows g / g+8, cols 2t.. and 2t+8..
 *   B (16 x 8)  b[2]: k = 2t.. and 2t+8.., column n = g
 */
#ifndef FQLA_CUDA_FWD_PTX_CUH
#define FQLA_CUDA_FWD_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FQLA_DEV __device__ __forceinline__

FQLA_DEV uint32_t fqla_smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8. */
FQLA_DEV void fqla_ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fqla_smem_u32(p)));
}
/* The same, each 8x8 matrix transposed in flight. */
FQLA_DEV void fqla_ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fqla_smem_u32(p)));
}

/* 16-byte global -> shared copy; src_bytes = 0 writes zeros (src unread). */
FQLA_DEV void fqla_cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(fqla_smem_u32(dst)), "l"(src), "r"(src_bytes) : "memory");
}
/* 4-byte global -> shared copy (rows not 16-byte aligned). */
FQLA_DEV void fqla_cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(fqla_smem_u32(dst)), "l"(src) : "memory");
}
FQLA_DEV void fqla_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N of this thread's committed copy groups are pending. */
template <int N>
FQLA_DEV void fqla_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
FQLA_DEV void fqla_cp_async_wait_all() { fqla_cp_async_wait<0>(); }

/* d += a b, tf32 m16n8k8 (fp32 accumulate). Fragments (g = lane / 4,
 * t = lane % 4): a rows g / g+8, cols t / t+4 (a0 (g,t), a1 (g+8,t),
 * a2 (g,t+4), a3 (g+8,t+4)); b k = t / t+4, column g; d as m16n8k16. */
FQLA_DEV void fqla_mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* x as two tf32 operands for 3xTF32 products: big = x with its 13 low bits
 * cleared, small = x - big (exact; the mma reads its top 10 mantissa bits),
 * so big + small carries ~21 bits. */
FQLA_DEV void fqla_tf32_split3(float x, uint32_t &big, uint32_t &small)
{
    big = __float_as_uint(x) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

/* Element traits: T is __nv_bfloat16 or __half. */
template <typename T> struct fqla_io;

template <> struct fqla_io<__nv_bfloat16> {
    static FQLA_DEV uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static FQLA_DEV float2 unpack(uint32_t x)
    {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&x));
    }
    static FQLA_DEV float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    /* D += A B, bf16 operands, fp32 accumulate */
    static FQLA_DEV void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct fqla_io<__half> {
    static FQLA_DEV uint32_t pack(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static FQLA_DEV float2 unpack(uint32_t x)
    {
        return __half22float2(*reinterpret_cast<__half2 *>(&x));
    }
    static FQLA_DEV float to_f(__half x) { return __half2float(x); }
    static FQLA_DEV void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* Fragment loaders over shared memory tiles of b16 elements (ld in elements,
 * a multiple of 8, rows 16-byte aligned). */

/* A fragment (16 x 16) at (m0, k0) of a row-major [m][k] tile. */
template <typename T>
FQLA_DEV void fqla_frag_a(uint32_t (&a)[4], const T *base, int ld, int m0, int k0, int lane)
{
    fqla_ldsm_x4(a, base + (m0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
/* A fragment (16 x 16) at (m0, k0) of A = X^T where X is a row-major [k][m] tile. */
template <typename T>
FQLA_DEV void fqla_frag_a_t(uint32_t (&a)[4], const T *base, int ld, int m0, int k0, int lane)
{
    fqla_ldsm_x4_t(a, base + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
}
/* B fragments of two n-tiles (k0.., n0.. and n0+8..) from a row-major [k][n]
 * tile: b[0], b[1] for n-tile n0, b[2], b[3] for n0 + 8. */
template <typename T>
FQLA_DEV void fqla_frag_b_kn(uint32_t (&b)[4], const T *base, int ld, int k0, int n0, int lane)
{
    fqla_ldsm_x4_t(b, base + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
}
/* The same from a row-major [n][k] tile (B^T stored, e.g. keys for Q K^T). */
template <typename T>
FQLA_DEV void fqla_frag_b_nk(uint32_t (&b)[4], const T *base, int ld, int k0, int n0, int lane)
{
    fqla_ldsm_x4(b, base + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}

/* 2^x (MUFU, ~2 ulp; 0 for large negative x) */
FQLA_DEV float fqla_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The in-kernel l2norm's factor 1 / sqrt(sum x^2 + 1e-6) of row r of a
 * [64][KD] tile of 2-byte values that TMA stored as KD / 64 boxes of 64
 * rows x 128 bytes (box b at tile + b box_stride). Two adjacent lanes share
 * a row, each summing half of it (part = lane & 1). A sum may visit a row's
 * 16-byte chunks in any order, so each lane starts at its own: chunk j of
 * a box's row is read at j ^ (r & 7) (and ^ 4 for the second part where
 * both parts read the same chunks of different boxes). Then the 8 lanes of
 * each load phase hit 8 different 16-byte bank groups. Reading chunk j at
 * j for every row (one bank group for the whole warp, 8-way conflicts)
 * made these sums cost ~45 % of the prepare kernel without Q and ~18 % of
 * the fused kernel (docs/perf.md, session 27). Both lanes of the pair
 * return the factor. Used for rq by fwd_fused.cu's Pg warpgroup; the
 * prepare kernel without Q takes rk from K K^T's diagonal, the kernels
 * with Q sum padded rows (fwd_prepare.cu, step 2), all in fp32. */
template <typename T, int KD>
FQLA_DEV float fqla_row_rnorm(const unsigned char *tile, uint32_t box_stride, int r, int part)
{
    constexpr int CH = KD / 16; /* 16-byte chunks in half a row */
    const int rot = (r & 7) ^ (CH >= 8 ? 4 * part : 0);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const int q = part * CH + i; /* box q / 8, chunk q % 8 (read at (q % 8) ^ rot) */
        const uint4 w =
            *reinterpret_cast<const uint4 *>(tile + (q >> 3) * box_stride + r * 128 + (((q & 7) ^ rot) * 16));
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = fqla_io<T>::unpack(u[j]);
            ss += f.x * f.x + f.y * f.y;
        }
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    return rsqrtf(ss + 1e-6f);
}

/* Four 8x8 b16 matrices from accumulator-layout registers; lane l gives the
 * row address of matrix l / 8. */
FQLA_DEV void fqla_stsm_x4(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(fqla_smem_u32(p)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

#endif
