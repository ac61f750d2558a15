/*
 * cluster_probe.cu - checks the ptx layer's cluster wrappers
 * (src/cuda/ptx/cluster.cuh) and launch.cuh's fqla_launch_cluster, on the
 * GPU and under the CPU emulator (dev/emu), before a kernel relies on them.
 *
 * Each CTA of a cluster of CL writes its own row of 128 values into its
 * shared memory, then:
 *   A  after a cluster barrier, reads the row of the next rank through
 *      fqla_mapa + ld.shared::cluster;
 *   B  stores its row, times (dest + 1), into slot [its rank] of every
 *      CTA's inbox (st.shared::cluster), arrives on each CTA's mbarrier
 *      (mbarrier.arrive.release.cluster), waits on its own (acquire at
 *      cluster scope) and sums its inbox in rank order.
 * The host checks both against what every rank wrote (exact: the values
 * are small integers and halves), for cluster sizes 2, 4 and 8.
 *
 * With --time it also prices what a cluster design pays a chunk (GPU
 * cycles a round, clock64 of rank 0's thread 0, 132 CTAs in clusters):
 *   sync  one cluster barrier (arrive.release + wait.acquire) a round;
 *   push  each CTA stores 8 or 32 KiB into the next rank's shared memory
 *         (st.shared::cluster, 8 bytes a store) and arrives on its
 *         mbarrier; it then waits on its own (the data of the round before
 *         it read meanwhile).
 *
 *   dev/gpu/cluster_probe.sh        (device machine: nvcc for sm_90a, runs it)
 *   dev/emu/build.sh's compiler: python3 -m pytest dev/tests/test_emu.py -k cluster
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/launch.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/mbarrier.cuh"

namespace {

constexpr int T = 128;       /* threads a CTA, values a row */
constexpr int INBOX = 1024;  /* byte offsets in the dynamic shared memory */
constexpr int MBAR = INBOX + 8 * T * 4;
constexpr int SMEM = MBAR + 64;

__device__ float value_of(unsigned block, int t) { return (float)(block * 1000 + t) + 0.5f; }

__global__ void __launch_bounds__(T, 1) probe(float *out_a, float *out_b)
{
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float *own = reinterpret_cast<float *>(smem_raw);
    float *inbox = reinterpret_cast<float *>(smem_raw + INBOX);
    uint64_t *mbar = reinterpret_cast<uint64_t *>(smem_raw + MBAR);
    const int t = threadIdx.x;
    const uint32_t rank = fqla_cluster_ctarank(), n = fqla_cluster_nctarank();
    own[t] = value_of(blockIdx.x, t);
    if (t == 0) {
        fqla_mbar_init(mbar, T * n); /* every thread of every CTA arrives once */
        fqla_mbar_init_fence();
    }
    /* A: every CTA's row and mbarrier in place, then the next rank's row */
    fqla_cluster_sync();
    const float2 nb = fqla_ld_cluster_f32x2(fqla_mapa(fqla_smem_u32(own + (t & ~1)), (rank + 1) % n));
    out_a[blockIdx.x * T + t] = (t & 1) ? nb.y : nb.x;
    /* B: this row into every CTA's inbox slot [rank], then one arrival on each CTA's mbarrier */
    for (uint32_t d = 0; d < n; d++) {
        const float x = own[t & ~1] * (float)(d + 1), y = own[t | 1] * (float)(d + 1);
        if ((t & 1) == 0) fqla_st_cluster_f32x2(fqla_mapa(fqla_smem_u32(inbox + rank * T + t), d), x, y);
    }
    for (uint32_t d = 0; d < n; d++) fqla_mbar_arrive_cluster(fqla_mapa(fqla_smem_u32(mbar), d));
    while (!fqla_mbar_try_wait_cluster(fqla_smem_u32(mbar), 0)) {
    }
    float sum = 0.f;
    for (uint32_t s = 0; s < n; s++) sum += inbox[s * T + t];
    out_b[blockIdx.x * T + t] = sum;
    /* no CTA leaves while another may still reach its shared memory */
    fqla_cluster_sync();
}

/* --time: rounds of one cluster barrier (push_floats 0) or of a push of
 * push_floats floats a thread into the next rank plus its mbarrier hand-off;
 * cycles[blockIdx.x] the cycles a round. */
__global__ void __launch_bounds__(T, 1) probe_time(long long *cycles, int rounds, int push_floats)
{
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float *inbox = reinterpret_cast<float *>(smem_raw);
    uint64_t *mbar = reinterpret_cast<uint64_t *>(smem_raw + (size_t)T * push_floats * 4);
    const int t = threadIdx.x;
    const uint32_t rank = fqla_cluster_ctarank(), n = fqla_cluster_nctarank();
    if (t == 0) {
        fqla_mbar_init(mbar, T);
        fqla_mbar_init_fence();
    }
    fqla_cluster_sync();
    const uint32_t next = (rank + 1) % n;
    const uint32_t dst = fqla_mapa(fqla_smem_u32(inbox), next), bar = fqla_mapa(fqla_smem_u32(mbar), next);
    float acc = 0.f;
    const long long t0 = clock64();
    for (int r = 0; r < rounds; r++) {
        if (push_floats == 0) {
            fqla_cluster_sync();
            continue;
        }
        for (int i = 0; i < push_floats; i += 2)
            fqla_st_cluster_f32x2(dst + 4u * (uint32_t)((i / 2) * 2 * T + 2 * t), (float)r, (float)i);
        fqla_mbar_arrive_cluster(bar);
        while (!fqla_mbar_try_wait_cluster(fqla_smem_u32(mbar), (uint32_t)r & 1u)) {
        }
        acc += inbox[t];
        /* the next round's stores overwrite what the next rank reads: keep
         * the ranks one round apart at most */
        fqla_cluster_sync();
    }
    const long long t1 = clock64();
    /* acc (never -1) keeps the inbox reads from being dropped as dead code */
    if (t == 0) cycles[blockIdx.x] = (t1 - t0) / (rounds > 0 ? rounds : 1) + (acc == -1.f);
    fqla_cluster_sync();
}

int time_cluster(unsigned cl)
{
    const unsigned blocks = 132 / cl * cl;
    long long *c = nullptr;
    if (cudaMalloc(&c, blocks * sizeof(long long)) != cudaSuccess) return 1;
    const int pushes[3] = {0, 16, 64}; /* floats a thread: 8 KiB, 32 KiB a CTA */
    for (int pf : pushes) {
        const size_t smem = (size_t)T * (pf ? pf : 2) * 4 + 64;
        cudaError_t e = fqla_launch_cluster(probe_time, dim3(blocks), dim3(T), smem, nullptr, cl, c, 200, pf);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "cluster_probe --time: cluster %u: %s\n", cl, cudaGetErrorString(e));
            cudaFree(c);
            return 1;
        }
        long long h = 0;
        cudaMemcpy(&h, c, sizeof h, cudaMemcpyDeviceToHost);
        if (pf == 0)
            printf("cluster of %u: sync %lld cycles a round\n", cl, h);
        else
            printf("cluster of %u: push %d KiB + mbarrier + sync %lld cycles a round\n", cl, T * pf * 4 / 1024, h);
    }
    cudaFree(c);
    return 0;
}

int run(unsigned cl, unsigned clusters)
{
    const unsigned blocks = cl * clusters;
    const size_t bytes = (size_t)blocks * T * sizeof(float);
    float *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        fprintf(stderr, "cluster_probe: cudaMalloc failed\n");
        return 1;
    }
    cudaError_t e = fqla_launch_cluster(probe, dim3(blocks), dim3(T), SMEM, nullptr, cl, a, b);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "cluster_probe: cluster %u: %s\n", cl, cudaGetErrorString(e));
        return 1;
    }
    std::vector<float> ha(blocks * T), hb(blocks * T);
    cudaMemcpy(ha.data(), a, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb.data(), b, bytes, cudaMemcpyDeviceToHost);
    cudaFree(a);
    cudaFree(b);
    long bad = 0;
    for (unsigned blk = 0; blk < blocks; blk++) {
        const unsigned base = blk / cl * cl, rank = blk % cl;
        for (int t = 0; t < T; t++) {
            const float want_a = (float)((base + (rank + 1) % cl) * 1000 + t) + 0.5f;
            float want_b = 0.f;
            for (unsigned s = 0; s < cl; s++) want_b += ((float)((base + s) * 1000 + t) + 0.5f) * (float)(rank + 1);
            if (ha[blk * T + t] != want_a || hb[blk * T + t] != want_b) {
                if (bad < 5)
                    fprintf(stderr, "cluster_probe: cluster %u block %u thread %d: A %g (want %g) B %g (want %g)\n",
                            cl, blk, t, ha[blk * T + t], want_a, hb[blk * T + t], want_b);
                bad++;
            }
        }
    }
    printf("cluster of %u, %u clusters: %s (%ld wrong)\n", cl, clusters, bad ? "FAILED" : "ok", bad);
    return bad != 0;
}

} // namespace

int main(int argc, char **argv)
{
    int fails = 0;
    const unsigned sizes[3] = {2, 4, 8};
    for (unsigned cl : sizes) fails += run(cl, 3);
    if (argc > 1 && !strcmp(argv[1], "--time"))
        for (unsigned cl : sizes) fails += time_cluster(cl);
    return fails ? 1 : 0;
}
