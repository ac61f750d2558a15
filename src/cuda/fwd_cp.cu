/*
 * fwd_cp.cu - the scan of intra-card context parallelism (docs/design.md,
 * CUDA).
 *
 * With CP the forward runs three launches after the prepare kernel
 * (fwd.cu): the chunk kernel's state-only pre-pass gives every segment s of
 * every sequence its zero-start end state H_s and its transition M_s (K x K:
 * the columns of the state that start from the identity and see V = 0);
 * this kernel scans each sequence's segments in order,
 *
 *     S_0 = h0 (or 0),   S_{s+1} = M_s S_s + H_s,
 *
 * writing every start state S_s for the main pass, which runs every segment
 * from its S_s and the last one on to the final state. (The last segment
 * needs no H or M, so the pre-pass leaves it out; an empty sequence's final
 * state, h0, is written here.)
 *
 * Grid: x = (sequence, value head), y = the V / CB column slices; the
 * columns of S are independent, so one CTA owns CB value columns (CB = 8,
 * or 16 / 32 where 8 would need a second wave) and walks the segments.
 * Block: scan_cfg::THREADS = 32 (KD / 16) CGW threads, no warp
 * specialisation: every thread copies its fixed 16-byte pieces of M_s and
 * H_s (scan_load), and warp w computes rows 16 (w % (KD / 16)) .. + 15 of
 * M_s S_s + H_s for its NT n-tiles of columns on tensor cores in 3xTF32
 * (tf32 m16n8k8, big and small parts: ~fp32 accuracy; scan_step). Two CTA
 * barriers per step: S_s and the stage's copies landed; every read of S_s
 * and of the stage done (then the stage is refilled and S_{s+1} written).
 * Registers: ptxas' choice under __launch_bounds__(THREADS), 40 to 126;
 * the plan's shared memory keeps one CTA per SM.
 *
 * Shared memory (scan_cfg::smem): a ring of STAGES buffers of M_s
 * [KD][LDM] and of the CTA's columns of H_s [KD][LDS], cp.async copies
 * STAGES - 1 segments ahead (stage and lap by fqla_pipe), then S_s
 * [KD][LDS], which stays in shared memory.
 *
 * Why this shape: the scan's steps are sequential, so their latency adds
 * straight to the forward's, and each step waits for its 64 KB of M_s. fp32
 * FMAs fed from shared memory took ~3.8 us per step; tensor cores with 8
 * columns per CTA and copies one step ahead ~2.7 us, with 32 columns
 * ~4.8 us; bulk (TMA) copies of one row each ~9 us (a copy engine
 * instruction per 512-byte row costs more than the copy).
 */
#include "cuda/fwd_common.cuh"

#include "cuda/kernel/pipeline.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mma_sync.cuh"
#include "cuda/ptx/pdl.cuh"

#include <cuda_bf16.h>
#include <stddef.h>

namespace {

template <int KD, int CB>
struct scan_cfg {
    /* warps: KD / 16 row blocks of 16 rows x CGW column groups of NT n-tiles
     * (8 columns each): wider CTAs get more warps rather than more n-tiles
     * per warp (at 32 columns 73 us against 77 for 16 steps) */
    static constexpr int NT = CB == 32 ? 2 : 1;
    static constexpr int CGW = CB / (8 * NT);
    static constexpr int THREADS = 32 * (KD / 16) * CGW;
    /* row pitches (floats): A fragments (4 g + t) and B fragments
     * (t LDS + g) hit 32 distinct banks */
    static constexpr int LDM = KD + 4;
    static constexpr int LDS = CB == 8 ? 8 : CB + 8;
    /* ring depth: three stages where they fit beside S in 227 KB */
    static constexpr int STAGES = (227 * 1024 / 4 - KD * LDS) / (KD * LDM + KD * LDS) >= 3 ? 3 : 2;
    /* the shared-memory plan */
    struct smem {
        float m[STAGES][KD][LDM]; /* M_s per stage */
        float h[STAGES][KD][LDS]; /* the CTA's columns of H_s per stage */
        float s[KD][LDS];         /* S_s */
    };
    static constexpr size_t bytes = sizeof(smem);
    static_assert(bytes == (size_t)(STAGES * KD * (LDM + LDS) + KD * LDS) * sizeof(float), "no padding");
    static_assert(bytes <= 227 * 1024, "the plan fits an SM's shared memory");
    static_assert(offsetof(smem, h) % 16 == 0 && offsetof(smem, s) % 16 == 0 && LDM % 4 == 0 && LDS % 4 == 0,
                  "cp.async's 16-byte pieces: rows 16-byte aligned");
    static constexpr int oH = offsetof(smem, h) / sizeof(float); /* float offsets of h and s */
    static constexpr int oS = offsetof(smem, s) / sizeof(float);
};

/* M_j (columns V .. V + K of segment j's pre-pass output, src) and this
 * CTA's columns c0.. of H_j into the plan's stage st (sm), as one commit
 * group; past the last segment (none) an empty group, so that every step
 * waits for the same number of younger groups; without M (m_zero: the
 * pre-pass left it out as negligible, cp_skip) only H. Each thread copies
 * the same 16-byte pieces every step: column piece mq of rows mrow + ROWS k
 * of M (rows rotated by blockIdx.y to spread the head's CTAs over L2), and
 * piece i of its H columns. Their offsets are fixed once by the caller: the
 * per-copy index arithmetic (64-bit, signed division) was half of a step's
 * instructions (ncu). */
template <int KD, int CB>
__device__ __forceinline__ void scan_load(float *sm, int st, const float *src, bool none, bool m_zero, int64_t V,
                                          int VXi, int c0, int mq, int mrow, unsigned utid)
{
    typedef scan_cfg<KD, CB> cfg;
    constexpr int CPR = KD / 4;                  /* 16-byte pieces per row of M */
    constexpr int ROWS = cfg::THREADS / CPR;     /* rows of M per pass of the CTA */
    constexpr int MPASS = KD / ROWS;             /* passes over M */
    constexpr int HPASS = (KD * CB / 4 + cfg::THREADS - 1) / cfg::THREADS; /* passes over H's pieces */
    static_assert(cfg::THREADS % CPR == 0 && KD % ROWS == 0, "copy passes");
    if (none) {
        fqla_cp_async_commit();
        return;
    }
    float *Ms = sm + st * KD * cfg::LDM + 4 * mq, *Hs = sm + cfg::oH + st * KD * cfg::LDS;
    const float *msrc = src + V + 4 * mq;
    if (!m_zero)
#pragma unroll
        for (int k = 0; k < MPASS; k++) {
            const int row = (mrow + ROWS * k) % KD;
            fqla_cp_async16(Ms + row * cfg::LDM, msrc + row * VXi, 16);
        }
#pragma unroll
    for (int k = 0; k < HPASS; k++) {
        const unsigned i = utid + k * cfg::THREADS;
        const int row = (int)(i / (CB / 4)), q = (int)(i % (CB / 4));
        if (i < KD * CB / 4) fqla_cp_async16(Hs + row * cfg::LDS + 4 * q, src + row * VXi + c0 + 4 * q, 16);
    }
    fqla_cp_async_commit();
}

/* S_0: h0's columns c0.. of (sequence n, value head hv), or zeros */
template <int KD, int CB>
__device__ __forceinline__ void scan_init_state(const fqla_fwd_params &p, float *Ss, int64_t n, int hv, int c0, int tid)
{
    typedef scan_cfg<KD, CB> cfg;
    for (int i = tid; i < KD * CB; i += cfg::THREADS) {
        const int k = i / CB, c = i % CB;
        float x = 0.f;
        if (p.h0) {
            const int64_t off = fqla_fwd_state_off(n, hv, k, c0 + c, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
            x = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off]) : ((const float *)p.h0)[off];
        }
        Ss[k * cfg::LDS + c] = x;
    }
}

/* One step's product, acc = M_j S_j + H_j on the thread's accumulator rows
 * r0, r0 + 8 and its warp's columns cw0.. (m16n8k8 layout), M_j, H_j from
 * the stage (Ms, Hs), S_j from Ss; without M_j (m_zero) H_j alone. One
 * accumulator chain: four independent chains (summed at the end) measured
 * no faster, 45 -> 47 us on TP8 1x32768. */
template <int KD, int CB>
__device__ __forceinline__ void scan_step(float (&acc)[scan_cfg<KD, CB>::NT][4], const float *Ms, const float *Hs,
                                          const float *Ss, bool m_zero, int r0, int cw0, int g, int t)
{
    typedef scan_cfg<KD, CB> cfg;
#pragma unroll
    for (int nt = 0; nt < cfg::NT; nt++) {
        const float2 h0v = *reinterpret_cast<const float2 *>(Hs + r0 * cfg::LDS + cw0 + 8 * nt + 2 * t);
        const float2 h1v = *reinterpret_cast<const float2 *>(Hs + (r0 + 8) * cfg::LDS + cw0 + 8 * nt + 2 * t);
        acc[nt][0] = h0v.x; acc[nt][1] = h0v.y; acc[nt][2] = h1v.x; acc[nt][3] = h1v.y;
    }
    if (m_zero) return;
#pragma unroll 4
    for (int ks = 0; ks < KD / 8; ks++) {
        uint32_t ab[4], as[4];
        const float *ma = Ms + r0 * cfg::LDM + 8 * ks + t;
        fqla_tf32_split3(ma[0], ab[0], as[0]);
        fqla_tf32_split3(ma[8 * cfg::LDM], ab[1], as[1]);
        fqla_tf32_split3(ma[4], ab[2], as[2]);
        fqla_tf32_split3(ma[8 * cfg::LDM + 4], ab[3], as[3]);
#pragma unroll
        for (int nt = 0; nt < cfg::NT; nt++) {
            const float *sb = Ss + (8 * ks + t) * cfg::LDS + cw0 + 8 * nt + g;
            uint32_t b0b, b0s, b1b, b1s;
            fqla_tf32_split3(sb[0], b0b, b0s);
            fqla_tf32_split3(sb[4 * cfg::LDS], b1b, b1s);
            fqla_mma_tf32(acc[nt], as, b0b, b1b);
            fqla_mma_tf32(acc[nt], ab, b0s, b1s);
            fqla_mma_tf32(acc[nt], ab, b0b, b1b);
        }
    }
}

/* An empty sequence's final state: h0 (S_0 in Ss) to ht (the main pass
 * writes the others) */
template <int KD, int CB>
__device__ __forceinline__ void scan_store_final(const fqla_fwd_params &p, const float *Ss, int64_t n, int hv, int c0,
                                                 int tid)
{
    typedef scan_cfg<KD, CB> cfg;
    for (int i = tid; i < KD * CB; i += cfg::THREADS) {
        const int k = i / CB, c = i % CB;
        const int64_t off = fqla_fwd_state_off(n, hv, k, c0 + c, p.ht_sn, p.ht_sh, p.ht_s2, p.ht_v_first);
        const float x = Ss[k * cfg::LDS + c];
        if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(x);
        else ((float *)p.ht)[off] = x;
    }
}

template <int KD, int CB>
__global__ void __launch_bounds__(scan_cfg<KD, CB>::THREADS) cp_scan_kernel(const fqla_fwd_params p)
{
    typedef scan_cfg<KD, CB> cfg;
    typedef fqla_pipe<cfg::STAGES> ring;
    extern __shared__ float4 smem_f4[];
    float *sm = reinterpret_cast<float *>(smem_f4);
    float *Ss = sm + cfg::oS;
    fqla_pdl_wait(); /* for the pre-pass (launched with PDL: ptx/pdl.cuh) */
    fqla_pdl_trigger();

    const int64_t n = blockIdx.x / p.HV;
    const int hv = blockIdx.x % p.HV;
    const int c0 = blockIdx.y * CB;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int64_t VX = p.V + KD;
    const int64_t g0 = fqla_fwd_sbase(p, n), nseg = fqla_fwd_nseg(p, n);
    auto hm_of = [&](int64_t j) { return p.seg_hm + ((g0 + j) * p.HV + hv) * KD * VX; };
    /* the pre-pass left M_j out as negligible (cp_skip): S_{j+1} = H_j */
    auto m_zero = [&](int64_t j) { return p.cp_skip && p.seg_flag[(g0 + j) * p.HV + hv] != 0; };

    /* each thread's copy pieces (scan_load) */
    constexpr int CPR = KD / 4; /* 16-byte pieces per row of M */
    const int VXi = (int)VX;
    const unsigned utid = (unsigned)tid;
    const int mq = (int)(utid % CPR);
    const int mrow = (int)((utid / CPR + blockIdx.y * (KD / 4)) % KD);
    /* segments 0 .. nseg - 2: the pre-pass leaves the last one out (the main
     * pass runs it on to the final state) */
    auto load = [&](int64_t j) {
        const bool none = j >= nseg - 1;
        scan_load<KD, CB>(sm, ring::at(j).stage, none ? nullptr : hm_of(j), none, !none && m_zero(j), p.V, VXi, c0,
                          mq, mrow, utid);
    };
    for (int j = 0; j < cfg::STAGES; j++) load(j);

    scan_init_state<KD, CB>(p, Ss, n, hv, c0, tid);

    /* this thread's accumulator rows r0, r0 + 8; its warp's columns cw0 .. */
    const int r0 = 16 * (warp % (KD / 16)) + g, cw0 = 8 * cfg::NT * (warp / (KD / 16));
    for (int64_t j = 0; j < nseg; j++) {
        fqla_cp_async_wait<cfg::STAGES - 1>();
        __syncthreads(); /* S_j in Ss, M_j / H_j landed for every thread */
        const int st = ring::at(j).stage;

        float *s0 = p.seg_s0 + ((g0 + j) * p.HV + hv) * KD * p.V + c0;
        const int Vi = (int)p.V;
#pragma unroll
        for (int k = 0; k < KD * CB / cfg::THREADS; k++) {
            const unsigned i = utid + k * cfg::THREADS;
            s0[(int)(i / CB) * Vi + (int)(i % CB)] = Ss[(i / CB) * cfg::LDS + i % CB];
        }
        if (j == nseg - 1) break; /* the last start state; no H or M of this segment */

        const float *Ms = sm + st * KD * cfg::LDM, *Hs = sm + cfg::oH + st * KD * cfg::LDS;
        float acc[cfg::NT][4];
        scan_step<KD, CB>(acc, Ms, Hs, Ss, m_zero(j), r0, cw0, g, t);
        __syncthreads(); /* every read of S_j and of stage st is done */
        load(j + cfg::STAGES);
#pragma unroll
        for (int nt = 0; nt < cfg::NT; nt++) {
            *reinterpret_cast<float2 *>(Ss + r0 * cfg::LDS + cw0 + 8 * nt + 2 * t) =
                make_float2(acc[nt][0], acc[nt][1]);
            *reinterpret_cast<float2 *>(Ss + (r0 + 8) * cfg::LDS + cw0 + 8 * nt + 2 * t) =
                make_float2(acc[nt][2], acc[nt][3]);
        }
    }
    __syncthreads();
    if (p.ht && nseg == 0) scan_store_final<KD, CB>(p, Ss, n, hv, c0, tid); /* an empty sequence */
}

template <int KD, int CB>
cudaError_t launch_scan(const fqla_fwd_params &p, cudaStream_t stream)
{
    typedef scan_cfg<KD, CB> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, cp_scan_kernel<KD, CB>, cfg::bytes);
    if (err != cudaSuccess) return err;
    dim3 grid((unsigned)(p.N * p.HV), (unsigned)(p.V / CB));
    return fqla_launch(cp_scan_kernel<KD, CB>, grid, dim3(cfg::THREADS), cfg::bytes, stream, p.pdl, p);
}

/* cb > 0: that many columns per CTA; else the narrowest whose grid fits one
 * wave (one CTA per SM), measured fastest (route_plan.h's choice). */
template <int KD>
cudaError_t launch_kd(const fqla_fwd_params &p, int cb, int sms, cudaStream_t stream)
{
    const int64_t heads = p.N * p.HV;
    if (cb <= 0) cb = heads * (p.V / 8) <= sms ? 8 : heads * (p.V / 16) <= sms ? 16 : 32;
    if (cb == 8) return launch_scan<KD, 8>(p, stream);
    if (cb == 16) return launch_scan<KD, 16>(p, stream);
    return launch_scan<KD, 32>(p, stream);
}

} // namespace

cudaError_t fqla_fwd_launch_cp_scan(const fqla_fwd_params &p, int cb, int sms, cudaStream_t stream)
{
    if (p.N * p.HV == 0) return cudaSuccess;
    if (p.K == 128) return launch_kd<128>(p, cb, sms, stream);
    if (p.K == 64) return launch_kd<64>(p, cb, sms, stream);
    return cudaErrorInvalidValue;
}
