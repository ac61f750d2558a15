/*
 * inverse_bench.cu - a microbenchmark for the forward's preparation
 * (docs/history/perf-log.md, session 24). It times one candidate for a cheaper inverse:
 * X = (I + M)^-1 of one chunk's 64 x 64 strictly lower
 * M = diag(beta) StrictLower(K K^T), by one forward substitution over all
 * 64 rows in fp32 on CUDA cores, LPC lanes per column (LPC = 2: one
 * warpgroup per inverse; 4: two). The prepare kernel instead inverts 16x16
 * diagonal blocks the same way and merges them by doubling in 3xTF32 on
 * tensor cores. That takes ~0.9 k + ~2.4 k cycles per inverse for one
 * warpgroup alone on an SM (sessions 16 and 23). A helper warpgroup beside
 * the fused kernel's chain needs a whole chunk's preparation in ~5-6 k.
 *
 * The substitution is right-looking: once x_i is final (on the lane that
 * owns row i), one shuffle hands it to the column's other lanes, and each
 * lane adds M[r][i] x_i to the sums of its rows r (rows LPC k + q). So the
 * dependent path is ~64 x (shuffle + FMA), and the FMAs are fp32, as
 * docs/design.md §2 asks of the inverse. M is read transposed and regrouped
 * per lane (Mp[i][q][k] = M[LPC k + q][i]), 16 bytes per load.
 *
 * Per variant it prints:
 * - the cycles of one inverse for a CTA alone on its SM (clock64);
 * - the GPU-wide throughput with many CTAs per SM, as SM-cycles per inverse;
 * - the largest error against an fp64 inverse on the host, relative to the
 *   largest entry, for two input sets (random unit keys, beta in (0, 1);
 *   correlated keys, beta in (0, 2)).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
 *        -o inverse_bench dev/gpu/inverse_bench.cu && ./inverse_bench
 *
 * Standalone: not part of the library or its tests.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                           \
    do {                                                                                                \
        cudaError_t e_ = (x);                                                                           \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                   \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

constexpr int C = 64;

/* One inverse per CTA of 64 LPC threads, a grid-stride loop over the
 * matrices. Mt: [n][i][r] = M[r][i] (zero for r <= i); X: [n][r][j]. cyc:
 * per matrix, thread 0's clock64 span of the substitution. MINB > 1 caps
 * the registers as MINB CTAs per SM do (64 per thread at 256 threads x 4 or
 * 128 x 8: a helper warpgroup's budget). */
template <int LPC, int MINB>
__global__ void __launch_bounds__(64 * LPC, MINB) subst_kernel(const float *Mt_all, float *X_all, long long *cyc, int n)
{
    constexpr int RPL = C / LPC;  /* rows per lane */
    constexpr int QS = RPL + 4;   /* padded: the LPC lanes' 16-byte loads in distinct banks */
    extern __shared__ __align__(16) float Mp[]; /* [64][LPC][QS] */
    const int tid = threadIdx.x, j = tid / LPC, q = tid % LPC, lane = tid & 31;
    for (int mat = blockIdx.x; mat < n; mat += gridDim.x) {
        const float *Mt = Mt_all + (size_t)mat * C * C;
        __syncthreads();
        /* 16-byte loads, four in flight per thread before their stores (one
         * load at a time made the copy, not the substitution, the
         * throughput's measure) */
#pragma unroll
        for (int it = 0; it < C * C / 4 / (64 * LPC); it += 4) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = reinterpret_cast<const float4 *>(Mt)[tid + (it + u) * 64 * LPC];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int e = 4 * (tid + (it + u) * 64 * LPC), i = e / C;
                const float w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int r = e % C + c;
                    Mp[(i * LPC + r % LPC) * QS + r / LPC] = w[c];
                }
            }
        }
        __syncthreads();
        const long long t0 = clock64();
        float acc[RPL], xs[RPL];
#pragma unroll
        for (int k = 0; k < RPL; k++) acc[k] = xs[k] = 0.f;
#pragma unroll
        for (int i = 0; i < C; i++) {
            const int ko = i / LPC, qo = i % LPC;
            /* x_i on its owner lane (q == qo), then to the column's lanes */
            const float xo = (i == j ? 1.f : 0.f) - acc[ko];
            const float x = __shfl_sync(0xffffffffu, xo, (lane & ~(LPC - 1)) | qo);
            if (q == qo) xs[ko] = x;
            /* every row r = LPC k + q >= LPC ko: M[r][i] is 0 for r <= i, and
             * the sums of rows <= i are not read again */
            const float *m = Mp + (i * LPC + q) * QS;
#pragma unroll
            for (int k4 = ko / 4 * 4; k4 < RPL; k4 += 4) {
                const float4 v = *reinterpret_cast<const float4 *>(m + k4);
                const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (k4 + u >= ko) acc[k4 + u] += e[u] * x;
            }
        }
        const long long t1 = clock64();
        if (tid == 0) cyc[mat] = t1 - t0;
        float *X = X_all + (size_t)mat * C * C;
#pragma unroll
        for (int k = 0; k < RPL; k++) X[(LPC * k + q) * C + j] = xs[k];
    }
}

/* M = diag(beta) StrictLower(K K^T) for n chunks: K rows of unit norm
 * (bf16-rounded), correlated (each row mixes a shared direction with
 * weight rho) or not; beta uniform in (0, bmax). Kept as M^T (Mt). */
static void make_inputs(int n, double rho, double bmax, unsigned seed, std::vector<float> &Mt)
{
    srand(seed);
    auto unif = [] { return (rand() + 0.5) / ((double)RAND_MAX + 1.0); };
    auto gauss = [&] { return sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif()); };
    const int D = 128;
    Mt.assign((size_t)n * C * C, 0.f);
    std::vector<double> K(C * D), base(D), beta(C);
    for (int m = 0; m < n; m++) {
        for (int d = 0; d < D; d++) base[d] = gauss();
        for (int r = 0; r < C; r++) {
            double nn = 0;
            for (int d = 0; d < D; d++) {
                K[r * D + d] = rho * base[d] + sqrt(1 - rho * rho) * gauss();
                nn += K[r * D + d] * K[r * D + d];
            }
            for (int d = 0; d < D; d++) { /* unit norm, then bf16's 8 mantissa bits */
                const double x = K[r * D + d] / sqrt(nn);
                int ex;
                const double fr = frexp(x, &ex);
                K[r * D + d] = ldexp(nearbyint(fr * 256.0) / 256.0, ex);
            }
            beta[r] = bmax * unif();
        }
        for (int r = 0; r < C; r++)
            for (int i = 0; i < r; i++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += K[r * D + d] * K[i * D + d];
                Mt[(size_t)m * C * C + i * C + r] = (float)(beta[r] * (float)s);
            }
    }
}

/* largest |X - X64| over the largest |X64|, over the first n matrices
 * (X64: the fp64 forward substitution of the same fp32 M) */
static double max_error(int n, const std::vector<float> &Mt, const std::vector<float> &X)
{
    double worst = 0;
    std::vector<double> R(C * C);
    for (int m = 0; m < n; m++) {
        const float *M = &Mt[(size_t)m * C * C];
        for (int j = 0; j < C; j++)
            for (int r = 0; r < C; r++) {
                double s = r == j ? 1.0 : 0.0;
                for (int i = 0; i < r; i++) s -= (double)M[i * C + r] * R[i * C + j];
                R[r * C + j] = s;
            }
        double emax = 0, xmax = 0;
        for (int e = 0; e < C * C; e++) {
            emax = fmax(emax, fabs(R[e] - X[(size_t)m * C * C + e]));
            xmax = fmax(xmax, fabs(R[e]));
        }
        worst = fmax(worst, emax / xmax);
    }
    return worst;
}

template <int LPC, int MINB>
static void run(int sms, int clock_khz)
{
    const size_t smem = (size_t)C * LPC * (C / LPC + 4) * sizeof(float);
    CK(cudaFuncSetAttribute(subst_kernel<LPC, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, subst_kernel<LPC, MINB>, 64 * LPC, smem));
    const int n = sms * 64;
    float *dM, *dX;
    long long *dc;
    CK(cudaMalloc(&dM, (size_t)n * C * C * sizeof(float)));
    CK(cudaMalloc(&dX, (size_t)n * C * C * sizeof(float)));
    CK(cudaMalloc(&dc, n * sizeof(long long)));
    /* 1,024 distinct matrices per input set (host time), repeated to n */
    const int ng = 1024;
    std::vector<float> Mt, X((size_t)ng * C * C);
    std::vector<long long> cyc(n);
    double err[2];
    for (int set = 0; set < 2; set++) {
        make_inputs(ng, set ? 0.9 : 0.0, set ? 2.0 : 1.0, 1234u + set, Mt);
        for (int m = 0; m < n; m += ng)
            CK(cudaMemcpy(dM + (size_t)m * C * C, Mt.data(), (size_t)(n - m < ng ? n - m : ng) * C * C * sizeof(float),
                          cudaMemcpyHostToDevice));
        subst_kernel<LPC, MINB><<<sms * per_sm, 64 * LPC, smem>>>(dM, dX, dc, n);
        CK(cudaGetLastError());
        CK(cudaMemcpy(X.data(), dX, X.size() * sizeof(float), cudaMemcpyDeviceToHost));
        err[set] = max_error(ng, Mt, X);
    }
    /* latency: one CTA per SM (shared memory padded so that no second fits) */
    subst_kernel<LPC, MINB><<<sms, 64 * LPC, 120 * 1024>>>(dM, dX, dc, sms);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(cyc.data(), dc, sms * sizeof(long long), cudaMemcpyDeviceToHost));
    long long lo = cyc[0], hi = cyc[0], sum = 0;
    for (int s = 0; s < sms; s++) lo = cyc[s] < lo ? cyc[s] : lo, hi = cyc[s] > hi ? cyc[s] : hi, sum += cyc[s];
    /* throughput: every SM full, n inverses, best of 5 */
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int rep = 0; rep < 5; rep++) {
        CK(cudaEventRecord(a));
        subst_kernel<LPC, MINB><<<sms * per_sm, 64 * LPC, smem>>>(dM, dX, dc, n);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = ms < best ? ms : best;
    }
    const double sm_cycles = best * 1e-3 * clock_khz * 1e3 * sms / n;
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, subst_kernel<LPC, MINB>));
    printf("LPC %d (%d threads, %d registers, %d bytes local, %d CTAs per SM): alone %lld / %lld / %lld cycles (min / mean / max); "
           "full GPU %.1f us for %d inverses = %.0f SM-cycles each (incl. M's copy into shared memory); "
           "max error %.2e (random keys, beta < 1), %.2e (correlated keys, beta < 2)\n",
           LPC, 64 * LPC, fa.numRegs, (int)fa.localSizeBytes, per_sm, lo, sum / sms, hi, best * 1e3, n, sm_cycles, err[0], err[1]);
    CK(cudaFree(dM));
    CK(cudaFree(dX));
    CK(cudaFree(dc));
}

int main()
{
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    printf("%s, %d SMs, clock %d MHz (nominal)\n", prop.name, prop.multiProcessorCount, clock_khz / 1000);
    run<2, 1>(prop.multiProcessorCount, clock_khz);
    run<2, 8>(prop.multiProcessorCount, clock_khz);
    run<4, 1>(prop.multiProcessorCount, clock_khz);
    run<4, 4>(prop.multiProcessorCount, clock_khz);
    return 0;
}
