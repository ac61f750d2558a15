/*
 * fwd_prepare.cu - the forward's chunk-parallel preparation kernel
 * (DESIGN.md §2). One CTA of 256 threads per (chunk slot, q/k head):
 *
 *   1. load the chunk's Q and K rows (rows past the sequence end read as 0);
 *   2. with use_qk_l2norm, the row factors rq, rk = 1/sqrt(sum x^2 + 1e-6)
 *      (fp32, from the stored values), written to the workspace;
 *   3. KK = K K^T and QK = Q K^T on tensor cores (fp32 accumulate), scaled
 *      by the l2norm factors: shared by the r value heads of the GVA group;
 *   4. per batch of HB value heads of the group, side by side (each step
 *      runs the batch's heads at once, so a head costs a fraction of the
 *      barriers and latencies of the steps): the gate (optionally
 *      -exp(A_log) softplus(a + dt_bias)) and beta (optionally sigmoid) of the
 *      64 rows, gamma = inclusive cumsum of g (padded rows g = 0, beta = 0),
 *      written to the workspace; Ar = (I + StrictLower(diag(beta) KK))^-1 in
 *      fp32 by blocked forward substitution (16x16 diagonal blocks, then
 *      block rows); and Ag = Gamma (.) Ar diag(beta), Pg = scale Gamma (.)
 *      tril(QK) in the io dtype, with Gamma_ij = exp(gamma_i - gamma_j) on
 *      i >= j (exponents <= 0).
 *
 * Shared memory: the Q and K tiles are dead once KK and QK are formed, so the
 * batch's X (Ar) matrices reuse their space; with HB = 1 (the default) a CTA
 * takes ~74 KB at K = 128 and three fit on an SM.
 *
 * Extra CTAs (blockIdx.x >= slots, varlen only) zero the rows of o after the
 * last sequence. A slot that belongs to no chunk (base(n) + c with c past
 * sequence n's end) exits at once.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_ptx.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int LDF = C + 4; /* fp32 matrices [64][68]: rows 16-byte aligned for float4 access */

/* Value heads per batch, HB = 1, 2 or 4: more heads per batch means fewer
 * barriers per head but more shared memory, so fewer CTAs per SM: at K = 128,
 * HB = 1 / 2 / 4 take 74 / 77 / 119 KB (3 / 2 / 1 CTAs). The default is
 * FQLA_FWD_PREP_HB (1: the step-4 work is bound by shared-memory loads of the
 * block merges, so CTAs per SM count more than barriers per head, docs/perf.md
 * v3); fqla_cuda_fwd_tune (fwd.cu) picks another for tuning runs. */
template <int KD, int HB>
struct prep_smem {
    static_assert(HB == 1 || HB == 2 || HB == 4, "the diagonal inverse maps 64 threads per head onto 256");
    static constexpr int LDQ = KD + 8;
    static constexpr size_t qk_tiles = 2 * (size_t)C * LDQ * 2; /* Q, K (b16) */
    static constexpr size_t xs = (size_t)HB * C * LDF * 4;      /* X per head of the batch */
    static constexpr size_t region0 = qk_tiles > xs ? qk_tiles : xs;
    static constexpr size_t bytes = region0                     /* Q, K, later X[HB] */
                                    + 2 * (size_t)C * LDF * 4   /* KK, QK */
                                    + (size_t)HB * 3 * 256 * 4  /* block-row temporaries */
                                    + (size_t)HB * 2 * C * 4    /* gamma, beta per head */
                                    + 2 * C * 4;                /* rq, rk */
    static_assert(qk_tiles % 16 == 0 && region0 % 16 == 0, "float4 alignment of the fp32 regions");
};

__device__ __forceinline__ float load_gate(const void *p, int bf16, int64_t off)
{
    if (bf16) return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    return ((const float *)p)[off];
}

/* log(1 + e^x) without overflow (the CPU reference's form). */
__device__ __forceinline__ float softplus_f(float x)
{
    return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
__device__ __forceinline__ float sigmoid_f(float x)
{
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    float e = expf(x);
    return e / (1.f + e);
}

/* Finds the sequence and chunk of slot s (varlen): the largest n with
 * base(n) = cu[n] / 64 + n <= s. Returns 0 when the slot holds no chunk. */
__device__ int find_slot(const fqla_fwd_params &p, int64_t s, int64_t &n_out, int64_t &c_out)
{
    int64_t lo = 0, hi = p.N - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) >> 1;
        if (fqla_fwd_cu(p, mid) / C + mid <= s) lo = mid;
        else hi = mid - 1;
    }
    int64_t base = fqla_fwd_cu(p, lo) / C + lo;
    if (base > s) return 0;
    int64_t len = fqla_fwd_cu(p, lo + 1) - fqla_fwd_cu(p, lo);
    int64_t c = s - base;
    if (c * C >= len) return 0;
    n_out = lo;
    c_out = c;
    return 1;
}

/* Zeroes o rows [64 tb, 64 tb + 64) past cu[N]. */
template <typename T>
__device__ void zero_tail(const fqla_fwd_params &p, int64_t tb)
{
    const int64_t end = fqla_fwd_cu(p, p.N);
    const int vec_per_head = p.V / 8;
    const int per_row = p.HV * vec_per_head;
    for (int idx = threadIdx.x; idx < C * per_row; idx += blockDim.x) {
        int64_t t = tb * C + idx / per_row;
        if (t < end || t >= p.T) continue;
        int r = idx % per_row;
        int h = r / vec_per_head, cv = r % vec_per_head;
        T *dst = (T *)p.o + t * p.o_st + h * p.o_sh + cv * 8;
        *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    }
}

template <typename T, int KD, int HB>
__global__ void __launch_bounds__(FQLA_FWD_THREADS) fwd_prepare_kernel(const fqla_fwd_params p)
{
    typedef fqla_io<T> io;
    constexpr int LDQ = prep_smem<KD, HB>::LDQ;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *Qs = reinterpret_cast<T *>(smem_raw);
    T *Ks = Qs + C * LDQ;
    float *X = reinterpret_cast<float *>(smem_raw); /* [HB][64][LDF], over Q and K */
    float *KK = reinterpret_cast<float *>(smem_raw + prep_smem<KD, HB>::region0);
    float *QK = KK + C * LDF;
    float *Tm = QK + C * LDF;     /* [HB][3][16][16] */
    float *gam = Tm + HB * 3 * 256; /* [HB][64] */
    float *bet = gam + HB * C;      /* [HB][64] */
    float *rqs = bet + HB * C;
    float *rks = rqs + C;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t slot = blockIdx.x;
    const int hq = blockIdx.y;

    if (slot >= p.slots) {
        if (hq == 0) zero_tail<T>(p, slot - p.slots);
        return;
    }
    int64_t n, c;
    if (p.varlen) {
        if (!find_slot(p, slot, n, c)) return;
    } else {
        n = slot / p.cps;
        c = slot % p.cps;
    }
    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
    const int64_t t0 = start + c * C;
    const int nvalid = (int)min((int64_t)C, len - c * C);

    /* 1. Q, K rows (zero past the end) */
    {
        const T *qb = (const T *)p.q + batch * p.q_sb + hq * p.q_sh;
        const T *kb = (const T *)p.k + batch * p.k_sb + hq * p.k_sh;
        constexpr int VPR = KD / 8;
        for (int idx = tid; idx < C * VPR; idx += FQLA_FWD_THREADS) {
            int i = idx / VPR, cv = idx % VPR;
            int ok = i < nvalid;
            int64_t t = t0 + (ok ? i : 0);
            fqla_cp_async16(Qs + i * LDQ + cv * 8, qb + t * p.q_st + cv * 8, ok ? 16 : 0);
            fqla_cp_async16(Ks + i * LDQ + cv * 8, kb + t * p.k_st + cv * 8, ok ? 16 : 0);
        }
        fqla_cp_async_commit();
        fqla_cp_async_wait_all();
        __syncthreads();
    }

    /* 2. l2norm factors: 128 row tasks (64 of Q, 64 of K), 16 per warp */
    if (p.l2norm) {
        for (int r = warp; r < 2 * C; r += 8) {
            const T *row = (r < C ? Qs + r * LDQ : Ks + (r - C) * LDQ);
            float ss = 0.f;
            for (int j = lane; j < KD; j += 32) {
                float x = io::to_f(row[j]);
                ss += x * x;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) {
                float f = rsqrtf(ss + 1e-6f);
                if (r < C) rqs[r] = f;
                else rks[r - C] = f;
            }
        }
        __syncthreads();
        if (tid < C) {
            size_t off = ((size_t)slot * p.H + hq) * C + tid;
            p.rq[off] = rqs[tid];
            p.rk[off] = rks[tid];
        }
    } else if (tid < C) {
        rqs[tid] = 1.f;
        rks[tid] = 1.f;
    }

    /* 3. KK = K K^T, QK = Q K^T: warp -> rows 16 (w % 4), cols 32 (w / 4) */
    {
        const int mw = warp & 3, n0 = (warp >> 2) * 32;
        float akk[4][4], aqk[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) akk[i][e] = aqk[i][e] = 0.f;
#pragma unroll 4
        for (int ks = 0; ks < KD / 16; ks++) {
            uint32_t ak[4], aq[4];
            fqla_frag_a(ak, Ks, LDQ, 16 * mw, 16 * ks, lane);
            fqla_frag_a(aq, Qs, LDQ, 16 * mw, 16 * ks, lane);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t b[4];
                fqla_frag_b_nk(b, Ks, LDQ, 16 * ks, n0 + 16 * np, lane);
                io::mma(akk[2 * np], ak, b[0], b[1]);
                io::mma(akk[2 * np + 1], ak, b[2], b[3]);
                io::mma(aqk[2 * np], aq, b[0], b[1]);
                io::mma(aqk[2 * np + 1], aq, b[2], b[3]);
            }
        }
        __syncthreads(); /* rqs / rks written by other warps */
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = 16 * mw + g + 8 * (e >> 1);
                int col = n0 + 8 * nt + 2 * t + (e & 1);
                KK[r * LDF + col] = akk[nt][e] * rks[r] * rks[col];
                QK[r * LDF + col] = aqk[nt][e] * rqs[r] * rks[col];
            }
    }

    /* 4. per batch of up to HB value heads of the group. Q and K are dead
     * from here on (the barrier after the products above): X overwrites them. */
    for (int j0 = 0; j0 < p.group; j0 += HB) {
        const int nb = min(HB, p.group - j0);
        __syncthreads(); /* KK/QK visible; previous batch's reads of gam/bet/X/Tm done */
        if (warp < nb) {
            const int hv = hq * p.group + j0 + warp;
            float gv[2], bv[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = lane + 32 * h;
                gv[h] = 0.f;
                bv[h] = 0.f;
                if (i < nvalid) {
                    int64_t t = t0 + i;
                    float a = load_gate(p.g, p.g_bf16, batch * p.g_sb + t * p.g_st + hv * p.g_sh);
                    float b = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + t * p.b_st + hv * p.b_sh);
                    if (p.gate_in_kernel)
                        a = -expf(p.A_log[hv * p.alog_s]) * softplus_f(a + p.dt_bias[hv * p.dtb_s]);
                    if (p.beta_sigmoid) {
                        b = sigmoid_f(b);
                        if (p.neg_eig) b *= 2.f;
                    }
                    gv[h] = a;
                    bv[h] = b;
                }
            }
            /* inclusive scan of 64 values: rows lane and lane + 32 */
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    float y = __shfl_up_sync(0xffffffffu, gv[h], o);
                    if (lane >= o) gv[h] += y;
                }
            gv[1] += __shfl_sync(0xffffffffu, gv[0], 31);
            float *gh = gam + warp * C, *bh = bet + warp * C;
            gh[lane] = gv[0];
            gh[lane + 32] = gv[1];
            bh[lane] = bv[0];
            bh[lane + 32] = bv[1];
            float *gdst = p.gam + ((size_t)slot * p.HV + hv) * C;
            gdst[lane] = gv[0];
            gdst[lane + 32] = gv[1];
        }
        __syncthreads();

        /* Ar: diagonal 16x16 blocks, one thread per (head, block, column).
         * Right-looking: once x_i is known it updates every later row's sum,
         * so the dependent chain is two operations per row instead of a row's
         * whole dot product. Each row's sum still adds its terms in
         * increasing k, so the values are those of the row-by-row form. */
        if (tid < 64 * nb) {
            const int h = tid >> 6, s = ((tid >> 4) & 3) * 16, jc = tid & 15;
            const float *bh = bet + h * C + s;
            float *Xh = X + h * C * LDF;
            float acc[16], x[16];
#pragma unroll
            for (int i = 0; i < 16; i++) acc[i] = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                x[i] = (i == jc ? 1.f : 0.f) - bh[i] * acc[i];
#pragma unroll
                for (int r = i + 1; r < 16; r++) acc[r] += KK[(s + r) * LDF + s + i] * x[i];
            }
#pragma unroll
            for (int i = 0; i < 16; i++) Xh[(s + i) * LDF + s + jc] = x[i];
        }
        __syncthreads();
        /* block rows 1..3: X_ij = -X_ii sum_{k=j}^{i-1} A_ik X_kj, A = diag(beta) KK.
         * Task -> (head h, block column bj < bi, row r, 4 columns c4): float4
         * loads, 4 outputs per task, so shared-memory issue is not the limit;
         * the batch's heads share each phase's two barriers. */
#pragma unroll
        for (int bi = 1; bi < 4; bi++) {
            const int ntask = nb * bi * 64;
            for (int task = tid; task < ntask; task += FQLA_FWD_THREADS) {
                const int h = task / (bi * 64), rem = task - h * (bi * 64);
                const int bjt = rem >> 6, t64 = rem & 63;
                const int r = t64 >> 2, c4 = (t64 & 3) * 4;
                const int row = 16 * bi + r;
                const float *Xh = X + h * C * LDF;
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 4
                for (int kcol = 16 * bjt; kcol < 16 * bi; kcol += 4) {
                    const float4 kv = *reinterpret_cast<const float4 *>(KK + row * LDF + kcol);
                    const float kk4[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const float4 xv = *reinterpret_cast<const float4 *>(Xh + (kcol + u) * LDF + 16 * bjt + c4);
                        a0 += kk4[u] * xv.x;
                        a1 += kk4[u] * xv.y;
                        a2 += kk4[u] * xv.z;
                        a3 += kk4[u] * xv.w;
                    }
                }
                const float br = bet[h * C + row];
                *reinterpret_cast<float4 *>(Tm + h * 768 + bjt * 256 + r * 16 + c4) =
                    make_float4(br * a0, br * a1, br * a2, br * a3);
            }
            __syncthreads();
            for (int task = tid; task < ntask; task += FQLA_FWD_THREADS) {
                const int h = task / (bi * 64), rem = task - h * (bi * 64);
                const int bjt = rem >> 6, t64 = rem & 63;
                const int r = t64 >> 2, c4 = (t64 & 3) * 4;
                const int row = 16 * bi + r;
                float *Xh = X + h * C * LDF;
                const float *Th = Tm + h * 768 + bjt * 256;
                /* X_ii is lower triangular with zeros stored above its diagonal */
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
                for (int m4 = 0; m4 < 16; m4 += 4) {
                    const float4 xv = *reinterpret_cast<const float4 *>(Xh + row * LDF + 16 * bi + m4);
                    const float x4[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const float4 tv = *reinterpret_cast<const float4 *>(Th + (m4 + u) * 16 + c4);
                        a0 += x4[u] * tv.x;
                        a1 += x4[u] * tv.y;
                        a2 += x4[u] * tv.z;
                        a3 += x4[u] * tv.w;
                    }
                }
                *reinterpret_cast<float4 *>(Xh + row * LDF + 16 * bjt + c4) = make_float4(-a0, -a1, -a2, -a3);
            }
            __syncthreads();
        }

        /* Ag, Pg: thread -> row tid / 4, 16 columns, one head after another
         * (independent stores, no barrier between heads) */
        for (int h = 0; h < nb; h++) {
            const int hv = hq * p.group + j0 + h;
            const float *Xh = X + h * C * LDF, *gh = gam + h * C, *bh = bet + h * C;
            const int i = tid >> 2, cb = (tid & 3) * 16;
            const float gi = gh[i];
            uint32_t ag[8], pg[8];
#pragma unroll
            for (int e4 = 0; e4 < 16; e4 += 4) {
                const float4 xv = *reinterpret_cast<const float4 *>(Xh + i * LDF + cb + e4);
                const float4 qv = *reinterpret_cast<const float4 *>(QK + i * LDF + cb + e4);
                const float4 gv = *reinterpret_cast<const float4 *>(gh + cb + e4);
                const float4 bv = *reinterpret_cast<const float4 *>(bh + cb + e4);
                const float xs[4] = {xv.x, xv.y, xv.z, xv.w}, qs[4] = {qv.x, qv.y, qv.z, qv.w};
                const float gs[4] = {gv.x, gv.y, gv.z, gv.w}, bs[4] = {bv.x, bv.y, bv.z, bv.w};
                float va[4], vp[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    va[u] = 0.f;
                    vp[u] = 0.f;
                    if (cb + e4 + u <= i) { /* the upper triangle of X is never written */
                        float d = __expf(gi - gs[u]);
                        va[u] = d * xs[u] * bs[u];
                        vp[u] = p.scale * d * qs[u];
                    }
                }
                ag[e4 >> 1] = io::pack(va[0], va[1]);
                ag[(e4 >> 1) + 1] = io::pack(va[2], va[3]);
                pg[e4 >> 1] = io::pack(vp[0], vp[1]);
                pg[(e4 >> 1) + 1] = io::pack(vp[2], vp[3]);
            }
            size_t off = (((size_t)slot * p.HV + hv) * C + i) * C + cb;
            uint4 *da = reinterpret_cast<uint4 *>((T *)p.Ag + off);
            uint4 *dp = reinterpret_cast<uint4 *>((T *)p.Pg + off);
            da[0] = make_uint4(ag[0], ag[1], ag[2], ag[3]);
            da[1] = make_uint4(ag[4], ag[5], ag[6], ag[7]);
            dp[0] = make_uint4(pg[0], pg[1], pg[2], pg[3]);
            dp[1] = make_uint4(pg[4], pg[5], pg[6], pg[7]);
        }
    }
}

template <typename T, int KD, int HB>
cudaError_t launch(const fqla_fwd_params &p, cudaStream_t stream)
{
    const size_t smem = prep_smem<KD, HB>::bytes;
    /* Raise the shared-memory limit once per device (a host-side setting,
     * kept out of later calls so that they stay cheap under graph capture). */
    static volatile int configured[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= 64 || !configured[dev]) {
        err = cudaFuncSetAttribute(fwd_prepare_kernel<T, KD, HB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem);
        if (err != cudaSuccess) return err;
        if (dev >= 0 && dev < 64) configured[dev] = 1;
    }
    int64_t tail = p.varlen ? (p.T + C - 1) / C : 0;
    dim3 grid((unsigned)(p.slots + tail), (unsigned)p.H);
    fwd_prepare_kernel<T, KD, HB><<<grid, FQLA_FWD_THREADS, smem, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int HB>
cudaError_t launch_kd(const fqla_fwd_params &p, cudaStream_t stream)
{
    switch (p.K) {
    case 64: return launch<T, 64, HB>(p, stream);
    case 128: return launch<T, 128, HB>(p, stream);
    case 256: return launch<T, 256, HB>(p, stream);
    }
    return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_hb(const fqla_fwd_params &p, int hb, cudaStream_t stream)
{
#if FQLA_FWD_TUNING
    if (hb == 1) return launch_kd<T, 1>(p, stream);
    if (hb == 2) return launch_kd<T, 2>(p, stream);
#endif
    (void)hb;
    return launch_kd<T, FQLA_FWD_PREP_HB>(p, stream);
}

} // namespace

cudaError_t fqla_fwd_launch_prepare(const fqla_fwd_params &p, int io_bf16, int hb, cudaStream_t stream)
{
    if (p.slots + (p.varlen ? (p.T + C - 1) / C : 0) == 0 || p.H == 0) return cudaSuccess;
    return io_bf16 ? launch_hb<__nv_bfloat16>(p, hb, stream) : launch_hb<__half>(p, hb, stream);
}
