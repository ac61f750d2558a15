/*
 * racecheck_probe.cu - does compute-sanitizer's racecheck report a hazard on
 * a pattern that a CTA barrier orders, once a kernel also uses mbarrier
 * hand-offs between warpgroups or wgmma?
 *
 * Why: racecheck reports hazards in bwd_grads.cu between a one-lane write
 * (ss.wsum[warp] by lane 0) and thread 0's read after the next
 * __syncthreads(), where every thread reaches that barrier at the same place
 * and reruns are bit-identical (docs/history/2026-12-04-bwd.md, late
 * session). This kernel has the same reduction and adds, by template flag,
 * the two things bwd_grads.cu has and the racecheck-clean kernels before it
 * had not: an mbarrier hand-off from warpgroup 0 to warpgroup 1 (MBAR) and
 * a wgmma on a zero tile by each warpgroup (WGMMA). Variant 0 has neither.
 *
 *   dev/gpu/racecheck_probe.sh      (device machine: builds, runs the four
 *                                    variants under racecheck, prints the
 *                                    hazard count of each)
 *
 * A hazard in variant 0 would mean racecheck flags the plain pattern; in
 * MBAR or WGMMA alone, that it loses the CTA barrier's order after them.
 */
#include <cstdio>
#include <cstdlib>

#include <cuda_bf16.h>

#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/wgmma.cuh"

template <bool MBAR, bool WGMMA> __global__ void __launch_bounds__(256, 1) probe(float *out, int rounds)
{
    __shared__ __align__(1024) __nv_bfloat16 tile[64 * 64];
    __shared__ float wsum[8];
    __shared__ float handoff[128];
    __shared__ uint64_t bar;
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;
    for (int i = tid; i < 64 * 64; i += 256) tile[i] = __float2bfloat16(0.f);
    if (tid == 0) fqla_mbar_init(&bar, 128);
    fqla_fence_async_smem();
    __syncthreads();
    float total = 0.f;
    for (int r = 0; r < rounds; r++) {
        if (WGMMA) {
            float acc[32];
#pragma unroll
            for (int i = 0; i < 32; i++) acc[i] = 0.f;
            const uint64_t d = fqla_desc_kmajor(tile);
            fqla_reg_fence(acc);
            fqla_wg_fence();
            fqla_wg<__nv_bfloat16>::ss64<0, 0>(acc, d, d, 0);
            fqla_wg_commit();
            fqla_wg_wait<0>();
            fqla_reg_fence(acc);
            total += acc[0];
        }
        if (MBAR) {
            if (wg == 0) {
                handoff[tid] = (float)(r + tid);
                fqla_mbar_arrive(&bar);
            } else {
                fqla_mbar_wait(&bar, (uint32_t)r & 1u);
                total += handoff[tid - 128];
            }
        }
        /* the reduction of bwd_grads.cu: one lane a warp writes, thread 0 reads
         * after the CTA barrier */
        float s = (float)(tid + r);
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) wsum[tid >> 5] = s;
        __syncthreads();
        if (tid == 0) {
            float t = 0.f;
            for (int w = 0; w < 8; w++) t += wsum[w];
            total += t;
        }
        __syncthreads();
    }
    out[blockIdx.x * 256 + tid] = total;
}

template <bool MBAR, bool WGMMA> static int run(const char *name)
{
    float *out = nullptr;
    if (cudaMalloc(&out, 4 * 256 * sizeof(float)) != cudaSuccess) return 1;
    probe<MBAR, WGMMA><<<4, 256>>>(out, 3);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaFree(out);
    std::printf("%-14s %s\n", name, e == cudaSuccess ? "ran" : cudaGetErrorString(e));
    return e != cudaSuccess;
}

int main(int argc, char **argv)
{
    const int v = argc > 1 ? std::atoi(argv[1]) : -1;
    int rc = 0;
    if (v < 0 || v == 0) rc |= run<false, false>("plain");
    if (v < 0 || v == 1) rc |= run<true, false>("mbarrier");
    if (v < 0 || v == 2) rc |= run<false, true>("wgmma");
    if (v < 0 || v == 3) rc |= run<true, true>("mbarrier+wgmma");
    return rc;
}
