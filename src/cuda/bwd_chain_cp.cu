/*
 * bwd_chain_cp.cu - context parallelism for the backward's two chains
 * (bwd_chain.cu): where sequences x value heads x value slices leave SMs
 * idle, each sequence is cut into segments of seg_chunks chunks (the
 * forward's segment indexing, cp_plan.h) and a chain runs in three steps:
 *
 *   pre-pass (bwd_chain.cu, mode CHAIN_PREPASS): every segment from a zero
 *     state, with K extra "identity" value columns whose inputs are zero and
 *     whose starting state is I. Both chains are affine in their state, so
 *     the segment's end state is M S_in + H: the real columns give H, the
 *     identity columns give M (K x K). Stored as [H | M], K x (V + K) fp32
 *     per (segment, value head).
 *   scan (here): per (sequence, value head, 16 value columns), the segments
 *     in chain order: S_in of the next segment = M S_in + H, in fp32 on CUDA
 *     cores; = H where the segment's decay makes M negligible (the
 *     forward's shortcut, fqla_cp_m_negligible: the pre-pass then leaves
 *     the identity columns out and flags the segment in f.seg_flag).
 *     Each segment's entering state is written where the main pass
 *     and the gradient kernel read it: the state chain's store of the state
 *     entering the segment's first chunk (bp.S), the reverse chain's store of
 *     the gradient leaving the segment's last chunk (bp.dS).
 *   main pass (bwd_chain.cu, mode CHAIN_MAIN): every segment from that
 *     state, storing every chunk's state as without CP.
 *
 * The pre-pass and the main pass run the same kernel code as the whole-
 * sequence chain, so the products and their precision are the same.
 */
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/misc.cuh"

namespace {

constexpr int SCAN_THREADS = 256;
/* value columns per CTA: a step (M S + H) is bound by M's load and the
 * CTA's FMAs, so narrower CTAs finish a step sooner (16 against 32: the scan
 * 0.114 -> 0.075 ms on hk2_hv4 8k_1seq, a quarter of the heads ungated,
 * H100) while M's loads repeat from L2 */
constexpr int SCAN_COLS = 16;

/* One CTA per (sequence, value head, SCAN_COLS value columns) of a chain,
 * in shared memory (scan_smem) M (K x K) and the state slice (K x
 * SCAN_COLS), fp32. */
template <int KD, bool REVERSE> __device__ __forceinline__ void scan_run(const fqla_bwd_params &bp, int zcol, float *scan_smem)
{
    const fqla_fwd_params &p = bp.f;
    float *M = scan_smem, *S = scan_smem + KD * KD;
    const int64_t n = blockIdx.x;
    const int hv = blockIdx.y, v0 = zcol * SCAN_COLS;
    const int tid = threadIdx.x, c = tid % SCAN_COLS, r0 = tid / SCAN_COLS;
    constexpr int RSTEP = SCAN_THREADS / SCAN_COLS;
    const int64_t W = p.V + KD; /* [H | M] row length */
    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
    const int64_t chunks = (len + FQLA_BWD_C - 1) / FQLA_BWD_C;
    if (chunks == 0) return; /* no chunk stores; the main pass handles dh0 */
    const int64_t L = p.seg_chunks, nseg = (chunks + L - 1) / L;
    const int64_t sbase = fqla_fwd_sbase(p, n);
    /* the pre-pass left segment js's M out as negligible (cp_skip): S_next = H */
    auto m_zero = [&](int64_t js) { return p.cp_skip && p.seg_flag[js * p.HV + hv] != 0; };

    /* the chain's starting state: h0 (states) or d_final_state (dstates) */
    for (int idx = tid; idx < KD * SCAN_COLS; idx += SCAN_THREADS) {
        const int r = idx / SCAN_COLS, j = idx % SCAN_COLS;
        S[r * SCAN_COLS + j] = bwd_start_state<REVERSE>(bp, n, hv, r, v0 + j);
    }
    for (int64_t it = 0; it < nseg; it++) {
        const int64_t j = REVERSE ? nseg - 1 - it : it;
        /* the chunk whose stored state this segment starts from */
        const int64_t c0 = REVERSE ? (j + 1) * L < chunks ? (j + 1) * L - 1 : chunks - 1 : j * L;
        const size_t tile = (size_t)(slot0 + c0) * p.HV + hv;
        float *dst = (REVERSE ? bp.dS : bp.S) + tile * KD * p.V + v0;
        __syncthreads(); /* S complete */
        for (int r = r0; r < KD; r += RSTEP) dst[(int64_t)r * p.V + c] = S[r * SCAN_COLS + c];
        if (it == nseg - 1) break;
        /* S <- M S + H of segment j */
        const float *HM = bp.cp_hm[REVERSE] + ((size_t)(sbase + j) * p.HV + hv) * KD * W;
        /* the segment after next into L2: its loads below then wait on L2 only.
         * Never the chain's last segment: its [H | M] is not applied, and this
         * chain's pre-pass skips it, so its seg_flag may be unwritten (with dh0
         * alone the other chain's pre-pass, which writes it, does not run) */
        if (it + 3 < nseg) {
            const int64_t jn = REVERSE ? j - 2 : j + 2;
            const float *HMn = bp.cp_hm[REVERSE] + ((size_t)(sbase + jn) * p.HV + hv) * KD * W;
            const int lines = m_zero(sbase + jn) ? 1 : KD / 32 + 1; /* 1 of H, K / 32 of M */
            for (int idx = tid; idx < KD * lines; idx += SCAN_THREADS) {
                const int r = idx / lines, l = idx % lines;
                fqla_prefetch_l2(HMn + (int64_t)r * W + (l == 0 ? v0 : p.V + 32 * (l - 1)));
            }
        }
        if (m_zero(sbase + j)) { /* S <- H: each thread rewrites only the elements it stored above */
#pragma unroll
            for (int i = 0; i < KD / RSTEP; i++) {
                const int r = r0 + RSTEP * i;
                S[r * SCAN_COLS + c] = HM[(int64_t)r * W + v0 + c];
            }
            continue;
        }
        constexpr int MV = KD * KD / 4 / SCAN_THREADS; /* float4 loads of M per thread, all in flight */
        float4 mv[MV];
#pragma unroll
        for (int u = 0; u < MV; u++) {
            const int idx = tid + u * SCAN_THREADS, r = idx / (KD / 4), k = 4 * (idx % (KD / 4));
            mv[u] = *reinterpret_cast<const float4 *>(HM + (int64_t)r * W + p.V + k);
        }
#pragma unroll
        for (int u = 0; u < MV; u++) reinterpret_cast<float4 *>(M)[tid + u * SCAN_THREADS] = mv[u];
        __syncthreads();
        float acc[KD / RSTEP];
#pragma unroll
        for (int i = 0; i < KD / RSTEP; i++) acc[i] = HM[(int64_t)(r0 + RSTEP * i) * W + v0 + c];
        for (int k = 0; k < KD; k++) {
            const float s = S[k * SCAN_COLS + c];
#pragma unroll
            for (int i = 0; i < KD / RSTEP; i++) acc[i] += M[(r0 + RSTEP * i) * KD + k] * s;
        }
        __syncthreads(); /* every thread has read S and M */
#pragma unroll
        for (int i = 0; i < KD / RSTEP; i++) S[(r0 + RSTEP * i) * SCAN_COLS + c] = acc[i];
    }
}

/* Both chains' scans in one launch, as bwd_chain.cu's passes: blockIdx.z
 * the reverse chain's column groups first, then the state chain's (only
 * where its states are stored, bp.S). */
template <int KD> __global__ void __launch_bounds__(SCAN_THREADS, 1) bwd_chain_scan_kernel(const fqla_bwd_params bp, int zcols)
{
    extern __shared__ __align__(16) float scan_smem[];
    const int z = (int)blockIdx.z;
    if (z < zcols)
        scan_run<KD, true>(bp, z, scan_smem);
    else
        scan_run<KD, false>(bp, z - zcols, scan_smem);
}

template <int KD> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = (size_t)(KD * KD + KD * SCAN_COLS) * sizeof(float);
    cudaError_t e = fqla_smem_limit(cache, bwd_chain_scan_kernel<KD>, smem);
    if (e != cudaSuccess) return e;
    const int zcols = (int)(p.f.V / SCAN_COLS);
    return fqla_launch(bwd_chain_scan_kernel<KD>,
                       dim3((unsigned)p.f.N, (unsigned)p.f.HV, (unsigned)(zcols * (p.S ? 2 : 1))), dim3(SCAN_THREADS),
                       smem, stream, 0, p, zcols);
}

} // namespace

cudaError_t fqla_bwd_launch_chains_scan(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    (void)io_bf16;
    return p.f.K == 64 ? launch<64>(p, stream) : launch<128>(p, stream);
}
