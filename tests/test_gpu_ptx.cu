/*
 * test_gpu_ptx.cu - the Hopper primitives of src/cuda/ptx/ one at a time,
 * each against a CPU result, so that a wrong wrapper shows up here and not
 * as a wrong number deep in a kernel:
 *   tma_load_2d     a bf16 box through a 128-byte-swizzle tensor map into
 *                   shared memory, completing on an mbarrier with the full
 *                   box's bytes; the box overhangs the tensor on both edges
 *                   (those elements must arrive as zeros), and the shared
 *                   bytes are compared with the swizzle's formula;
 *   wgmma_ss        one 64 x 64 x 32 bf16 product (two m64n64k16 k-steps,
 *                   A and B K-major, 128-byte swizzle, written by threads
 *                   and fenced) against a CPU GEMM, exact (small integers);
 *   mbarrier_phase  try_wait.parity before and after each phase completes:
 *                   a fresh barrier's phase -1 reads complete, phase 0
 *                   completes on arrive.expect_tx + a bulk copy's bytes,
 *                   phase 1 on a plain arrive.
 * Built with nvcc when it is found (sm_90a); every case is skipped without
 * a CUDA device of compute capability 9.x.
 */
#include "cuda/ptx/ptx.cuh"

#include <cuda.h> /* CUtensorMap and the encode function's enums (libcuda is not linked) */
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/check.h"
}

#define CASES(X) X(tma_load_2d) X(wgmma_ss) X(mbarrier_phase)

namespace {

/* ---- tma_load_2d ---- */

constexpr int TM_ROWS = 100, TM_COLS = 96; /* the tensor: [100][96] bf16, row pitch TM_LD */
constexpr int TM_LD = 128;
constexpr int BOX = 64;                    /* box: 64 rows x 64 columns (128 bytes: the swizzle span) */
constexpr int TM_R0 = 64, TM_C0 = 64;      /* the box's origin: rows 64..127, columns 64..127 */

__global__ void tma_load_kernel(const __grid_constant__ CUtensorMap tm, unsigned char *out)
{
    __shared__ __align__(1024) unsigned char tile[BOX * 128];
    __shared__ uint64_t full;
    if (threadIdx.x == 0) {
        fqla_tma_prefetch(&tm);
        fqla_mbar_init(&full, 1);
        fqla_mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        fqla_mbar_arrive_tx(&full, BOX * 128); /* the whole box, its out-of-bounds part too */
        fqla_tma_load_2d(tile, &tm, &full, TM_C0, TM_R0);
    }
    fqla_mbar_wait(&full, 0);
    for (int i = threadIdx.x; i < BOX * 128; i += blockDim.x) out[i] = tile[i];
}

bool encode_2d(CUtensorMap *m, const void *base)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
        return false;
    cuuint64_t dims[2] = {TM_COLS, TM_ROWS}; /* innermost first */
    cuuint64_t strides[1] = {TM_LD * 2};     /* bytes */
    cuuint32_t box[2] = {BOX, BOX}, estr[2] = {1, 1};
    return ((PFN_cuTensorMapEncodeTiled_v12000)fn)(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base),
                                                   dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* a distinct nonzero bf16 per element (exact: 1 .. 2^8 fits bf16's mantissa) */
uint16_t tm_value(int r, int c) { return __bfloat16_as_ushort(__float2bfloat16((float)(1 + (r * 7 + c) % 200))); }

void tma_load_2d(void)
{
    uint16_t *h = (uint16_t *)calloc(TM_ROWS * TM_LD, 2);
    unsigned char got[BOX * 128];
    for (int r = 0; r < TM_ROWS; r++)
        for (int c = 0; c < TM_LD; c++) h[r * TM_LD + c] = c < TM_COLS ? tm_value(r, c) : 0xffff; /* pitch padding: NaN */
    void *d = NULL, *dout = NULL;
    CUtensorMap tm;
    CHECK(cudaMalloc(&d, TM_ROWS * TM_LD * 2) == cudaSuccess && cudaMalloc(&dout, sizeof got) == cudaSuccess,
          "cudaMalloc");
    CHECK(cudaMemcpy(d, h, TM_ROWS * TM_LD * 2, cudaMemcpyHostToDevice) == cudaSuccess, "copy in");
    CHECK(encode_2d(&tm, d), "cuTensorMapEncodeTiled");
    tma_load_kernel<<<1, 128>>>(tm, (unsigned char *)dout);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "kernel: %s", cudaGetErrorString(cudaGetLastError()));
    CHECK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "copy out");
    int bad = 0;
    for (int r = 0; r < BOX; r++)
        for (int c = 0; c < BOX; c++) {
            /* row r's 16-byte chunk c / 8 sits at chunk (c / 8) ^ (r % 8) of its 128-byte row */
            const int off = r * 128 + (((c >> 3) ^ (r & 7)) << 4) + (c & 7) * 2;
            uint16_t v;
            memcpy(&v, got + off, 2);
            const int gr = TM_R0 + r, gc = TM_C0 + c;
            const uint16_t want = gr < TM_ROWS && gc < TM_COLS ? tm_value(gr, gc) : 0; /* outside: zeros */
            if (v != want && bad++ < 5) CHECK(0, "box (%d, %d): 0x%04x, want 0x%04x", r, c, v, want);
        }
    CHECK(bad == 0, "%d of %d elements differ", bad, BOX * BOX);
    cudaFree(d);
    cudaFree(dout);
    free(h);
}

/* ---- wgmma_ss ---- */

constexpr int WM = 64, WN = 64, WK = 32;

/* element (r, k) of a K-major [rows][64] b16 tile in the 128-byte swizzle */
__host__ __device__ int swz(int r, int k) { return r * 128 + (((k >> 3) ^ (r & 7)) << 4) + (k & 7) * 2; }

__global__ void wgmma_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D)
{
    __shared__ __align__(1024) unsigned char sa[WM * 128];
    __shared__ __align__(1024) unsigned char sb[WN * 128];
    for (int i = threadIdx.x; i < WM * 64; i += blockDim.x) { /* zeros past k = WK */
        const int r = i / 64, k = i % 64;
        *reinterpret_cast<__nv_bfloat16 *>(sa + swz(r, k)) = k < WK ? A[r * WK + k] : __float2bfloat16(0.f);
        *reinterpret_cast<__nv_bfloat16 *>(sb + swz(r, k)) = k < WK ? B[r * WK + k] : __float2bfloat16(0.f);
    }
    fqla_fence_async_smem(); /* generic-proxy writes -> the wgmma's reads */
    __syncthreads();
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.f;
    const uint64_t da = fqla_desc_kmajor(sa), db = fqla_desc_kmajor(sb);
    fqla_reg_fence(acc);
    fqla_wg_fence();
#pragma unroll
    for (int kk = 0; kk < WK / 16; kk++)
        fqla_wg<__nv_bfloat16>::ss64<0, 0>(acc, da + kk * FQLA_DESC_K16_KMAJOR, db + kk * FQLA_DESC_K16_KMAJOR, kk > 0);
    fqla_wg_commit();
    fqla_wg_wait<0>();
    fqla_reg_fence(acc);
    /* accumulator i of thread (warp w, lane l): row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2 */
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 32; i++)
        D[(16 * w + (l >> 2) + 8 * ((i >> 1) & 1)) * WN + 8 * (i >> 2) + 2 * (l & 3) + (i & 1)] = acc[i];
}

void wgmma_ss(void)
{
    /* small integers: every product and sum is exact in fp32 */
    static __nv_bfloat16 a[WM * WK], b[WN * WK];
    static float got[WM * WN];
    for (int i = 0; i < WM * WK; i++) a[i] = __float2bfloat16((float)((int)(check_uniform() * 9) - 4));
    for (int i = 0; i < WN * WK; i++) b[i] = __float2bfloat16((float)((int)(check_uniform() * 9) - 4));
    void *da = NULL, *db = NULL, *dd = NULL;
    CHECK(cudaMalloc(&da, sizeof a) == cudaSuccess && cudaMalloc(&db, sizeof b) == cudaSuccess &&
              cudaMalloc(&dd, sizeof got) == cudaSuccess,
          "cudaMalloc");
    CHECK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice) == cudaSuccess,
          "copy in");
    wgmma_kernel<<<1, 128>>>((const __nv_bfloat16 *)da, (const __nv_bfloat16 *)db, (float *)dd);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "kernel: %s", cudaGetErrorString(cudaGetLastError()));
    CHECK(cudaMemcpy(got, dd, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "copy out");
    int bad = 0;
    for (int m = 0; m < WM; m++)
        for (int n = 0; n < WN; n++) {
            float want = 0.f; /* D = A B with B stored [n][k] (K-major) */
            for (int k = 0; k < WK; k++) want += __bfloat162float(a[m * WK + k]) * __bfloat162float(b[n * WK + k]);
            if (got[m * WN + n] != want && bad++ < 5) CHECK(0, "D(%d, %d) = %g, want %g", m, n, got[m * WN + n], want);
        }
    CHECK(bad == 0, "%d of %d elements differ", bad, WM * WN);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
}

/* ---- mbarrier_phase ---- */

enum { MB_FRESH_P1, MB_FRESH_P0, MB_PH0_P0, MB_PH0_P1, MB_PH1_P1, MB_PH1_P0, MB_N };

__global__ void mbarrier_kernel(const uint4 *src, uint4 *copied, uint32_t *res)
{
    __shared__ uint64_t bar;
    __shared__ __align__(16) uint4 buf;
    if (threadIdx.x != 0) return;
    const uint32_t a = fqla_smem_u32(&bar);
    fqla_mbar_init(&bar, 1);
    fqla_mbar_init_fence();
    res[MB_FRESH_P1] = fqla_mbar_try_wait(a, 1); /* the phase before the first: complete */
    res[MB_FRESH_P0] = fqla_mbar_try_wait(a, 0); /* phase 0: pending */
    /* phase 0: the one arrival, and 16 bytes that a bulk copy delivers */
    fqla_mbar_arrive_tx(&bar, 16);
    fqla_bulk_load(&buf, src, 16, &bar);
    fqla_mbar_wait(&bar, 0);
    res[MB_PH0_P0] = fqla_mbar_try_wait(a, 0); /* complete */
    res[MB_PH0_P1] = fqla_mbar_try_wait(a, 1); /* phase 1: pending */
    *copied = buf;
    /* phase 1: a plain arrival */
    fqla_mbar_arrive(&bar);
    fqla_mbar_wait(&bar, 1);
    res[MB_PH1_P1] = fqla_mbar_try_wait(a, 1); /* complete */
    res[MB_PH1_P0] = fqla_mbar_try_wait(a, 0); /* phase 2: pending */
}

void mbarrier_phase(void)
{
    const uint4 in = make_uint4(0x01234567u, 0x89abcdefu, 0xdeadbeefu, 0x0badf00du);
    uint4 out;
    uint32_t res[MB_N];
    void *dsrc = NULL, *dcopy = NULL, *dres = NULL;
    CHECK(cudaMalloc(&dsrc, 16) == cudaSuccess && cudaMalloc(&dcopy, 16) == cudaSuccess &&
              cudaMalloc(&dres, sizeof res) == cudaSuccess,
          "cudaMalloc");
    CHECK(cudaMemcpy(dsrc, &in, 16, cudaMemcpyHostToDevice) == cudaSuccess, "copy in");
    mbarrier_kernel<<<1, 32>>>((const uint4 *)dsrc, (uint4 *)dcopy, (uint32_t *)dres);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "kernel: %s", cudaGetErrorString(cudaGetLastError()));
    CHECK(cudaMemcpy(&out, dcopy, 16, cudaMemcpyDeviceToHost) == cudaSuccess &&
              cudaMemcpy(res, dres, sizeof res, cudaMemcpyDeviceToHost) == cudaSuccess,
          "copy out");
    CHECK(memcmp(&in, &out, 16) == 0, "the bulk copy's bytes");
    const uint32_t want[MB_N] = {1, 0, 1, 0, 1, 0};
    const char *what[MB_N] = {"fresh, parity 1", "fresh, parity 0", "after phase 0, parity 0",
                              "after phase 0, parity 1", "after phase 1, parity 1", "after phase 1, parity 0"};
    for (int i = 0; i < MB_N; i++)
        CHECK(res[i] == want[i], "try_wait %s: %u, want %u", what[i], res[i], want[i]);
    cudaFree(dsrc);
    cudaFree(dcopy);
    cudaFree(dres);
}

} // namespace

int main(void)
{
    int n = 0, major = 0;
    char msg[200] = "";
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        snprintf(msg, sizeof msg, "no CUDA device");
    else if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess || major != 9)
        snprintf(msg, sizeof msg, "needs compute capability 9.x (sm_90a), device 0 has %d.x", major);
    if (msg[0]) {
#define SKIP(name) check_skip(#name, msg);
        CASES(SKIP)
        return check_summary();
    }
    check_rng_seed(check_seed());
#define RUN(name) CHECK_RUN(name);
    CASES(RUN)
    return check_summary();
}
