/*
 * bwd_grads.cu - every per-token gradient of one chunk, from the state
 * entering it (S) and the gradient w.r.t. the state leaving it (dS'), both
 * stored by bwd_chain.cu (bwd_common.cuh). The reverse of the chunk forward
 * (notation of src/cpu/chunked_bwd.c, whose header derives it):
 *
 *   X = V - diag(e) K S,  Y = diag(beta) X,  U = T~ Y
 *   dU  = P~^T dO + diag(f) K dS'          df_j = (K dS')_j . u_j
 *   dP~ = dO U^T,  dT~ = dU Y^T,  dY = T~^T dU,  dX = diag(beta) dY = dv
 *   dbeta_i = x_i . dy_i + sum_j dL_ij Gamma_ij k_i . k_j
 *   de_i = scale q_i . (dO S^T)_i - (K S)_i . dX_i,  de_C = <S, dS'>
 *   dQ = scale diag(e) dO S^T + dQ~ K
 *   dK = -diag(e) dX S^T + diag(f) U dS'^T + dQ~^T Q + (M + M^T) K
 *   dL = -T~^T dT~ T~^T (strict lower),  M = diag(beta) (Gamma . dL),
 *   dQ~ = scale Gamma . dP~ (lower)
 *   dg_t = sum_{i >= t} de_i e_i + sum_{j < t} df_j f_j + de_C e_C
 *          + sum_{i >= t > j} R_ij,  R_ij = Gamma_ij (dL_ij beta_i k_i.k_j
 *          + scale dP~_ij q_i.k_j)
 * dg from the terms that contain g_t, so a tiny dg under a strong decay
 * keeps its relative accuracy.
 *
 * Products: warpgroup MMA (wgmma m64nNk16, bf16, fp32 accumulate), every
 * one a warpgroup's 64 chunk rows, operands in shared memory as bf16 hi /
 * lo planes in the 128-byte swizzle (kernel/wg_split.cuh), read in
 * whichever orientation a product needs. Two precisions, chosen per chunk
 * (gw_route, one launch each):
 *   - a partial chunk (the last of a sequence whose length is not a
 *     multiple of 64, so every chunk of a sequence under 64 tokens), and
 *     every chunk of a sequence of at most FQLA_BWD_SHORT_CHUNKS chunks
 *     (the lean mix's dg has a heavy tail there, bwd_common.cuh): every
 *     operand that is not an exact bf16 input carries its lo plane (three
 *     products a k-step, ~16 significant bits). The numerics model
 *     (dev/models/bwd_chunked.py, bench/results/bwd-model.md section 6) has
 *     a one-token sequence's dbeta and dg fail with X, K dS' or dY in plain
 *     bf16; P~ in plain bf16 failed a one-token sequence of
 *     tests/test_gpu_bwd.c (dbeta 6e-2).
 *   - a full chunk ("lean"): only K dS' and dY = T~^T dU keep split
 *     operands (the model's recommended mix, section 2: each gradient
 *     within its threshold on long sequences, strong decay and beta near
 *     2 included, at about FlashQLA's plain-bf16 level: dk 5.5e-3 of 8e-3
 *     at beta near 2), every other product takes the hi planes alone, half
 *     the tensor work; the planes no value read needs (S, Y, W0 / W1) are
 *     not stored. H100: the kernel -15 % (3.39 -> 2.88 ms on hk16_hv32
 *     32k_1seq), the whole backward -9 %; dk 5.5e-3 at beta near 2
 *     (bench/results/bwd-builds-h100-2026-12-06.txt).
 * The l2norm'd or fp16 q / k and fp16 dO are not exact in bf16 and carry lo
 * planes in both; fp16 io runs every chunk split (the model covers bf16).
 * (The first form of this kernel ran every product as 16 warps of 16 x 16
 * mma.sync tiles between CTA barriers: 10 % slower on the 32k row, ncu had
 * its tensor pipe 18 % busy; docs/history/2026-12-04-bwd.md.)
 *
 * Grid (slots, H) for every chunk or the full ones, (sequences, H) for the
 * partial last chunks; 256 threads: one CTA per chunk and q/k head runs the
 * value heads of its GVA group in order, summing dq (warpgroup 0's
 * registers) and dk (warpgroup 1's) over the group without atomics. Per
 * value head, value columns in slices of 64 (a last one of 32 padded with
 * zeros). q and k are loaded once for the CTA (the group's heads share
 * them; exact bf16 rows by cp.async, in flight beside the first head's
 * loads: 10 % of the kernel against loading them through registers); per
 * value head T~ and P~ (their planes as bwd_prepare.cu stores them, by
 * bulk copies issued during the previous head's tail); per slice:
 *
 *   all     dO (bf16: as it is) and the raw value slice by cp.async, S and
 *           dS' (fp32 -> split) through registers, into shared memory; on
 *           the lean route S mostly as the bf16 plane the chains stored
 *           (bwd_state_bf16), through registers beside dS' (a bulk copy
 *           of the plane on an mbarrier, then <S, dS'> read back from it,
 *           timed 3-4 % slower for this kernel on the H100)
 *   wg 0    KS; X = V - diag(e) KS, Y = diag(beta) X; U = T~ Y  -> u_ready
 *   wg 1    KdS'; dU = P~^T dO + diag(f) KdS'                  -> du_ready
 *   wg 0    dY = T~^T dU, dT~ += dU Y^T: dv, dbeta (x . dy), de (-beta KS . dy);
 *           Y <- -diag(e beta) dY                              -> yp_ready;
 *           dO S^T: de (scale q . ), dQ += scale diag(e) dO S^T
 *   wg 1    df (KdS' . u); dP~ += dO U^T;
 *           U <- diag(f) U; after yp_ready: dK += Y S^T + U dS'^T
 *
 * and after the slices: wg 0 M1 = T~^T (strict lower dT~) -> m1_ready;
 * wg 1 K K^T, dL = -M1 T~^T and the element-wise terms (dbeta's, R, M,
 * dQ~) -> dqt_ready; wg 0 dQ += dQ~ K; wg 1 dK += dQ~^T Q + M K + M^T K;
 * then dg and dbeta per token.
 *
 * Nothing in a slice waits on a global load but the slice's own copies at
 * its start, and those wait on L2 only: each slice prefetches the next
 * one's S, dS', dO and v rows into L2 (prefetch_slice; -6 % for this kernel
 * on the H100 and the H200, bench/results/bwd-builds-h100-2026-12-06g.txt;
 * prefetching also the next head's T~ / P~ planes, which come by bulk copy
 * during the previous head's tail anyway, was 6 % slower than this, and the
 * first slice of the CTA dispatched next, guessed as this index + %nsmid,
 * +6 %). v, q and P~ are read from their tiles where a product needs
 * them as values (the first form loaded them from global memory as 4-byte
 * pairs under the products, and reloaded q every head: the kernel ran
 * 6.07 ms against 4.10 now on hk16_hv32 32k_1seq, H100). Shared memory
 * stays at most 196 KiB for bf16 q / k (gw_layout): two variants that
 * staged the next inputs (T~ and P~, or the next slice's dS') in the
 * ~30 KiB above it were 3 % and 21 % slower on the H100 / H200. Likely
 * (not measured) why: at a 196 KiB carve-out the SM keeps 60 KiB of L1, at
 * 228 KiB 28, and L1 holds the register spills and the fp32 state loads
 * (docs/history/2026-12-05-gpu3.md).
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/kernel/wg_split.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/pdl.cuh"
#include "cuda/ptx/tma.cuh"

#include <type_traits>

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = 64;             /* value columns per slice */
constexpr int THREADS = 256;
constexpr int TILE = C * 64 * 2;   /* a 64 x 64 bf16 plane */
constexpr int LDR = C + 1;         /* fp32 R rows */

/* Each warpgroup's own named barrier (128 threads). */
enum class gw_bar : uint32_t { wg0 = 1, wg1 };

/* Hand-offs from one warpgroup to the other: an mbarrier each (every thread
 * of the producer arrives, the consumer waits for the phase), used once per
 * slice (u_ready, du_ready, yp_ready) or per value head (m1_ready,
 * dqt_ready), with a CTA barrier between two uses. (Named barriers with
 * bar.arrive did the same; racecheck reported hazards across later CTA
 * barriers with them, so the hand-offs use what racecheck models.) */
enum gw_signal { u_ready, du_ready, yp_ready, m1_ready, dqt_ready, n_signals };

/* A named barrier of a converged warp: bar.sync is .aligned, and a warp
 * still diverged after data-dependent code (loads past nvalid, a row's
 * owner lane) must reconverge first, which the compiler does not do for an
 * asm statement (synccheck caught it). */
__device__ __forceinline__ void gw_sync(gw_bar id, uint32_t n)
{
    __syncwarp();
    fqla_bar_sync(id, n);
}

constexpr int align1k(int x) { return (x + 1023) & ~1023; }

struct gw_small {
    uint64_t signal[n_signals]; /* mbarriers of the hand-offs */
    uint64_t tp;                /* a value head's T~ and P~ planes landed (bulk copies) */
    float gam[C], bet[C], e[C], f[C], df[C], db[C], de[C];
    float wsum[THREADS / 32], deC;
};

/* Shared memory (byte offsets from a 1024-aligned base). q and k are kept
 * for the whole CTA (read by every value head of the group); a lo plane
 * only where the operand is not exact in bf16 (QK_LO, DO_LO); the value
 * slice as raw 2-byte rows (VSM: where it fits, i.e. without q / k lo planes). */
template <int KD, bool QK_LO, bool DO_LO> struct gw_layout {
    static constexpr bool VSM = !QK_LO;
    static constexpr int KP = C * KD * 2;      /* a [64][KD] plane */
    static constexpr int SP = KD * VS * 2;     /* a [KD][64] plane */
    static constexpr int RB = C * LDR * 4;     /* R */
    static constexpr int NQK = QK_LO ? 2 : 1;  /* q / k planes */
    static constexpr int k = 0;                /* K hi (, lo) */
    static constexpr int q = k + NQK * KP;     /* Q hi (, lo) */
    static constexpr int t = q + NQK * KP;     /* T~ hi, lo */
    static constexpr int pt = t + 2 * TILE;    /* P~ hi, lo */
    static constexpr int st = pt + 2 * TILE;   /* slices: S hi, lo, dS' hi, lo; after them: R, the gate parts */
    static constexpr int st_bytes = 4 * SP > RB + 2 * C * 4 ? 4 * SP : RB + 2 * C * 4;
    static constexpr int dO = st + align1k(st_bytes); /* dO hi (, lo) */
    static constexpr int v = dO + (DO_LO ? 2 : 1) * TILE; /* VSM: the value slice, raw */
    static constexpr int sl = v + (VSM ? TILE : 0); /* slices: Y, U, dU (hi, lo); after them: W0, W1 */
    static constexpr int small = sl + 6 * TILE;
    static constexpr int bytes = small + (int)sizeof(gw_small) + 1024; /* + the base's alignment */
    /* wgmma's 128-byte swizzle: every plane 1024-aligned */
    static_assert(KP % 1024 == 0 && SP % 1024 == 0 && TILE % 1024 == 0 && st % 1024 == 0 && dO % 1024 == 0 &&
                      sl % 1024 == 0,
                  "tile planes must be 1024-aligned");
    static_assert(bytes <= 227 * 1024, "over the H100 / H200 shared memory a block may have");
    /* with the 1 KiB the system reserves a block: the carve-out that keeps
     * L1 at 60 KiB (the header says why) */
    static_assert(QK_LO || bytes + 1024 <= 196 * 1024, "bf16 q / k: keep the 196 KiB shared-memory carve-out");
};

__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

/* 8 io elements at off (zeros where !valid), as floats: one 16-byte load
 * where the address allows. */
template <typename T> __device__ __forceinline__ void load8(const void *base, int64_t off, bool valid, float (&x)[8])
{
    if (!valid) {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = 0.f;
        return;
    }
    const T *s = (const T *)base + off;
    if (((uintptr_t)s & 15) == 0) {
        const uint4 u = *reinterpret_cast<const uint4 *>(s);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[2 * i] = bwd_widen<T>(w[i] & 0xffffu);
            x[2 * i + 1] = bwd_widen<T>(w[i] >> 16);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = bwd_ld<T>(s, i);
    }
}

/* Rows of a chunk's q or k (64 x KD, times r[i] where given, zeros past
 * nvalid) into a tile; loads first, then stores. */
template <typename T, int KD>
__device__ __forceinline__ void load_rows(const fqla_wg_tile &dst, const void *x, int64_t base, int64_t st, int nvalid,
                                          const float *r)
{
    constexpr int N = C * KD / 8 / THREADS;
    float v[N][8];
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * THREADS, i = idx / (KD / 8), j = 8 * (idx % (KD / 8));
        load8<T>(x, base + (int64_t)i * st + j, i < nvalid, v[n]);
    }
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * THREADS, i = idx / (KD / 8), j = 8 * (idx % (KD / 8));
        if (r && i < nvalid) {
            const float ri = r[i];
#pragma unroll
            for (int e = 0; e < 8; e++) v[n][e] *= ri;
        }
        fqla_wg_put8(dst, i, j, v[n]);
    }
}

/* 64 rows of COLS 2-byte elements (row i at src + i * st; zeros past nvalid
 * rows and valid columns, a multiple of 8) into a plane of 64 rows as they
 * are: cp.async, 16 bytes a piece where `vec` (every row 16-byte aligned),
 * element by element otherwise. The caller commits and waits. The
 * backward's validation (check_aligned, src/validate.c) refuses rows off
 * 16-byte boundaries, so `vec` is always 1; dropping the other branch (and
 * the chains' alike) moved ptxas' spills here from 80 to 128 bytes a
 * thread, so it waits for a timed A/B. */
template <int COLS>
__device__ __forceinline__ void copy_raw(unsigned char *base, const uint16_t *src, int64_t st, int nvalid, int valid,
                                         bool vec)
{
    if (vec) {
#pragma unroll
        for (int n = 0; n < C * COLS / 8 / THREADS; n++) {
            const unsigned idx = threadIdx.x + n * THREADS; /* unsigned: / and % are shifts */
            const int i = (int)(idx / (COLS / 8)), j = (int)(8 * (idx % (COLS / 8)));
            const bool ok = i < nvalid && j < valid;
            fqla_cp_async16(base + fqla_wg_off(C, i, j), ok ? src + (int64_t)i * st + j : src, ok ? 16 : 0);
        }
    } else {
#pragma unroll 1
        for (int idx = threadIdx.x; idx < C * COLS; idx += THREADS) {
            const int i = idx / COLS, j = idx % COLS;
            *reinterpret_cast<uint16_t *>(base + fqla_wg_off(C, i, j)) =
                i < nvalid && j < valid ? src[(int64_t)i * st + j] : (uint16_t)0;
        }
    }
}

/* Elements (r, c0 + c .. c0 + c + 7) of a row-major fp32 matrix (row pitch
 * ld) as two 16-byte loads; zeros from column cols on. */
__device__ __forceinline__ void load_f32x8(const float *x, int64_t ld, int r, int c0, int c, int cols, float4 (&v)[2])
{
    const float4 *xs = reinterpret_cast<const float4 *>(x + (int64_t)r * ld + c0 + c);
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    v[0] = c < cols ? xs[0] : z;
    v[1] = c < cols ? xs[1] : z;
}
__device__ __forceinline__ void unpack_f32x8(const float4 (&v)[2], float (&o)[8])
{
    o[0] = v[0].x, o[1] = v[0].y, o[2] = v[0].z, o[3] = v[0].w;
    o[4] = v[1].x, o[5] = v[1].y, o[6] = v[1].z, o[7] = v[1].w;
}

/* A [ROWS][64] block of two fp32 row-major matrices x, y (row pitch ld,
 * columns from c0) into the split tiles dx, dy; returns this thread's sum of
 * x * y. All of a thread's loads are issued before its first store. */
template <int ROWS>
__device__ __forceinline__ float load_f32_pair(const fqla_wg_tile &dx, const float *x, const fqla_wg_tile &dy,
                                               const float *y, int64_t ld, int c0, int cols)
{
    /* 16-byte pieces of 8 values a thread, per matrix, all in flight at once
     * (registers: 16 N): one round trip (two, when issued two at a time,
     * cost the gradient kernel 5 % more on the H100) */
    constexpr int N = ROWS * 8 / THREADS;
    float dot = 0.f;
    float4 a[N][2], b[N][2];
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * THREADS, r = idx >> 3, c = 8 * (idx & 7);
        load_f32x8(x, ld, r, c0, c, cols, a[n]);
        load_f32x8(y, ld, r, c0, c, cols, b[n]);
    }
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * THREADS, r = idx >> 3, c = 8 * (idx & 7);
        float v[8], w[8];
        unpack_f32x8(a[n], v);
        unpack_f32x8(b[n], w);
        fqla_wg_put8(dx, r, c, v);
        fqla_wg_put8(dy, r, c, w);
#pragma unroll
        for (int i = 0; i < 8; i++) dot += v[i] * w[i];
    }
    return dot;
}

/* dS' for a slice whose S comes as its bf16 plane (bwd_state_bf16): y's
 * [ROWS][64] block (fp32, row pitch ld, columns from c0) into the split tile
 * dy, and S's hi plane from its global copy xg ([ROWS][64] bf16 in the tile
 * layout, as the chains stored it) into the shared plane xs, 16 bytes a
 * thread through registers, every load in flight before the first store;
 * returns this thread's share of <S, dS'> from the same registers (the
 * elements and order of load_f32_pair). */
template <int ROWS>
__device__ __forceinline__ float load_plane_f32(const fqla_wg_tile &dy, const float *y, unsigned char *xs,
                                                const unsigned char *xg, int64_t ld, int c0, int cols)
{
    constexpr int N = ROWS * 8 / THREADS;
    float4 b[N][2];
    uint4 u[N];
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * THREADS, r = idx >> 3, c = 8 * (idx & 7);
        load_f32x8(y, ld, r, c0, c, cols, b[n]);
        u[n] = *reinterpret_cast<const uint4 *>(xg + fqla_wg_off(ROWS, r, c));
    }
    float dot = 0.f;
#pragma unroll
    for (int n = 0; n < N; n++) {
        const int idx = threadIdx.x + n * THREADS, r = idx >> 3, c = 8 * (idx & 7);
        const uint32_t off = fqla_wg_off(ROWS, r, c);
        float w[8];
        unpack_f32x8(b[n], w);
        fqla_wg_put8(dy, r, c, w);
        *reinterpret_cast<uint4 *>(xs + off) = u[n];
        const uint32_t h[4] = {u[n].x, u[n].y, u[n].z, u[n].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 v = fqla_wg_unbf2(h[i]);
            dot += v.x * w[2 * i] + v.y * w[2 * i + 1];
        }
    }
    return dot;
}

/* Elements off, off + 1 as their raw 2-byte bits (first in the low half). */
template <typename T> __device__ __forceinline__ uint32_t ld_pair(const void *base, int64_t off)
{
    const uint16_t *s = (const uint16_t *)base + off;
    if (((uintptr_t)s & 3) == 0) return *reinterpret_cast<const uint32_t *>(s);
    return (uint32_t)s[0] | ((uint32_t)s[1] << 16);
}

template <int N> __device__ __forceinline__ void zero(float (&a)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) a[i] = 0.f;
}

/* A slice's global inputs into L2 (prefetch.global.L2: hints, nothing waits
 * on them): dS' of value head (hk, h)'s columns v0 .. v0 + 63 (two lines a
 * row), S alike or, with s16, its bf16 plane (KD lines), and the slice's dO
 * and v rows (one or two lines each). */
template <int KD>
__device__ __forceinline__ void prefetch_slice(const fqla_bwd_params &bp, int64_t slot, int hk, int h, int v0,
                                               int64_t batch, int64_t t0, int nvalid, bool s16)
{
    const fqla_fwd_params &p = bp.f;
    const int tid = threadIdx.x, hv = hk * p.group + h;
    const int r = tid >> 1, half = tid & 1;
    const size_t tile = (size_t)slot * p.HV + hv;
    if (r < KD && 32 * half < p.V - v0) {
        const int64_t o = (int64_t)tile * KD * p.V + (int64_t)r * p.V + v0 + 32 * half;
        if (!s16) fqla_prefetch_l2(bp.S + o);
        fqla_prefetch_l2(bp.dS + o);
    }
    if (s16 && tid < KD) /* S's bf16 plane (bwd_state_bf16): KD lines */
        fqla_prefetch_l2(bwd_state_plane<KD>(bp.S, tile, p.V, v0) + 128 * tid);
    const int i = tid & 63, which = tid >> 6;
    if (i < nvalid && which < 2) {
        const uint16_t *row =
            which == 0 ? (const uint16_t *)bp.d_o + batch * bp.do_sb + (t0 + i) * bp.do_st + (int64_t)hv * bp.do_sh + v0
                       : (const uint16_t *)p.v + batch * p.v_sb + (t0 + i) * p.v_st + (int64_t)hv * p.v_sh + v0;
        fqla_prefetch_l2(row);
        fqla_prefetch_l2(row + 63); /* a row not 128-byte aligned spans two lines */
    }
}

/* Which chunks a launch runs, and at which precision (the header says why):
 * every chunk with every intermediate split (fp16 io); the full chunks of
 * sequences longer than FQLA_BWD_SHORT_CHUNKS chunks with the lean products
 * (bf16 io; any other chunk's CTA exits); the others, split (bf16 io: a
 * short sequence's chunks and a longer one's partial last chunk,
 * FQLA_BWD_SHORT_CHUNKS CTAs a sequence). */
enum class gw_route { every_chunk, full_chunks, tails };

/* QK_LO: q / k carry lo planes (fp16 io, or the l2norm in the kernel): a
 * template parameter, so that which products run is known to ptxas. */
template <typename T, int KD, bool QK_LO, gw_route ROUTE, bool BESIDE>
__device__ __forceinline__ void grads_cta(const fqla_bwd_params &bp, int vec)
{
    constexpr bool IO_BF16 = std::is_same<T, __nv_bfloat16>::value;
    /* LEAN: the products that tolerate plain bf16 operands drop the lo
     * planes of the intermediates (S, Y, U, T~ and P~ outside dY, dS' in
     * U dS'^T, W0 / W1); a plane no value read needs is not stored */
    constexpr bool LEAN = ROUTE == gw_route::full_chunks;
    constexpr bool LO = !LEAN; /* an intermediate's lo plane in a product */
    constexpr bool DO_LO = !IO_BF16; /* dO exact in bf16 only for bf16 inputs */
    using L = gw_layout<KD, QK_LO, DO_LO>;
    const fqla_fwd_params &p = bp.f;
    extern __shared__ unsigned char smem_raw[];
    /* 1024-aligned by an offset from smem_raw, not a round trip through an
     * integer: the compiler then still knows the pointers below are shared and
     * emits LDS / STS, not generic LD / ST (fwd_chunk_wg.cu's reason) */
    unsigned char *sm = smem_raw + ((1024u - (fqla_smem_u32(smem_raw) & 1023u)) & 1023u);
    gw_small &ss = *reinterpret_cast<gw_small *>(sm + L::small);
    float *Rs = reinterpret_cast<float *>(sm + L::st);
    float(*gpart)[C] = reinterpret_cast<float(*)[C]>(Rs + C * LDR); /* dA_log, ddt_bias per token */
    const uint32_t s0 = fqla_smem_u32(sm);
    constexpr int NK = KD / 2; /* accumulators of a 64 x KD product */
    int64_t slot = blockIdx.x;
    /* Beside the chains (BESIDE: bp.chain_done): the r-th sequence is the r-th
     * shortest (the chains' order reversed, bwd_common.cuh), and a CTA with a
     * chunk waits until the chains of its sequence have stored every state of
     * the group's value heads (both chains, every chain CTA). Every chain
     * CTA started before this CTA could (PDL), so the wait ends. */
    auto shortest = [&](int64_t r) -> int64_t { return bp.seq_order[bp.n_order - 1 - r]; };
    int64_t wait_seq = 0; /* BESIDE: the sequence whose chains this CTA waits for */
    if constexpr (ROUTE != gw_route::tails && BESIDE) { /* slot index r of the sequences taken shortest first */
        const int64_t r = blockIdx.x;
        if (r >= bp.done_cum[bp.n_order]) return; /* no chunk: its gate parts were zeroed */
        int lo = 0, hi = bp.n_order - 1; /* the last rank whose first slot index is <= r */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (bp.done_cum[mid] <= r) lo = mid;
            else hi = mid - 1;
        }
        int64_t b, start, len, slot0;
        const int64_t n = shortest(lo), c = r - bp.done_cum[lo];
        fqla_fwd_seq(p, n, b, start, len, slot0);
        if (LEAN && ((c + 1) * C > len || bwd_seq_short(len))) return; /* the tails' launch (below) */
        slot = slot0 + c;
        wait_seq = n;
    }
    if constexpr (ROUTE == gw_route::tails) {
        /* FQLA_BWD_SHORT_CHUNKS CTAs per sequence: chunk j of a short
         * sequence (bwd_seq_short), or (j = 0) a longer one's last chunk
         * where it is partial */
        int64_t n = blockIdx.x / FQLA_BWD_SHORT_CHUNKS;
        if constexpr (BESIDE) n = shortest(n);
        const int j = (int)(blockIdx.x % FQLA_BWD_SHORT_CHUNKS);
        int64_t b, start, len, slot0;
        fqla_fwd_seq(p, n, b, start, len, slot0);
        const int64_t chunks = (len + C - 1) / C;
        if (bwd_seq_short(len)) {
            if (j >= chunks) return;
            slot = slot0 + j;
        } else {
            if (j != 0 || len % C == 0) return;
            slot = slot0 + chunks - 1;
        }
        wait_seq = n;
    }
    const int hk = blockIdx.y;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = 16 * ((tid >> 5) & 3) + g; /* this thread's accumulator rows: r0, r0 + 8 */
    const float scale = p.scale;

    int64_t batch, t0, cseq, seq_len;
    int nvalid;
    if (!bwd_slot_chunk(p, slot, batch, t0, nvalid, cseq, seq_len)) {
        if (bp.gate_part)
            for (int h = tid; h < p.group; h += blockDim.x) {
                const size_t tile = (size_t)slot * p.HV + hk * p.group + h;
                bp.gate_part[2 * tile] = bp.gate_part[2 * tile + 1] = 0.f;
            }
        return;
    }
    if (LEAN && (nvalid < C || bwd_seq_short(seq_len))) return; /* the tails' launch */
    /* S of this chunk as the state chain stored it: bf16 planes (the lean
     * products' hi plane), or fp32 (split here) */
    const bool s16 = LEAN && IO_BF16 && bwd_state_bf16(p.cp_mode ? cseq % p.seg_chunks : cseq, nvalid, seq_len);
#ifdef FQLA_DEV
    if (LEAN && s16 && bp.fused_grads) return; /* formed by the fused pass (developer build) */
#endif
    const size_t rrow = ((size_t)slot * p.H + hk) * C;
    static_assert(IO_BF16 || QK_LO, "fp16 q / k always carry lo planes");
    const fqla_wg_tile Kt{s0 + L::k, QK_LO ? s0 + L::k + L::KP : 0u, C};
    const fqla_wg_tile Qt{s0 + L::q, QK_LO ? s0 + L::q + L::KP : 0u, C};
    const fqla_wg_tile Tt{s0 + L::t, s0 + L::t + TILE, C}, Pt{s0 + L::pt, s0 + L::pt + TILE, C};
    const fqla_wg_tile St{s0 + L::st, LO ? s0 + L::st + L::SP : 0u, KD};
    const fqla_wg_tile dSt{s0 + L::st + 2 * L::SP, s0 + L::st + 3 * L::SP, KD};
    const fqla_wg_tile dOt{s0 + L::dO, DO_LO ? s0 + L::dO + TILE : 0u, C};
    /* U keeps its lo plane in both precisions: df reads U's values */
    const fqla_wg_tile Yt{s0 + L::sl, LO ? s0 + L::sl + TILE : 0u, C}, Ut{s0 + L::sl + 2 * TILE, s0 + L::sl + 3 * TILE, C};
    const fqla_wg_tile dUt{s0 + L::sl + 4 * TILE, s0 + L::sl + 5 * TILE, C};
    const fqla_wg_tile W0{s0 + L::sl, LO ? s0 + L::sl + TILE : 0u, C};
    const fqla_wg_tile W1{s0 + L::sl + 2 * TILE, LO ? s0 + L::sl + 3 * TILE : 0u, C};

    if (tid < n_signals) fqla_mbar_init(&ss.signal[tid], 128);
    /* value head h's T~ and P~ planes (bwd_prepare.cu) by two bulk copies (one
     * thread; the previous head's products with them done) */
    auto copy_tp = [&](int h) {
        const size_t tile = (size_t)slot * p.HV + hk * p.group + h;
        fqla_mbar_arrive_tx(&ss.tp, 4 * TILE);
        fqla_bulk_load(sm + L::t, bp.Tt + tile * C * C, 2 * TILE, &ss.tp);
        fqla_bulk_load(sm + L::pt, bp.Pt + tile * C * C, 2 * TILE, &ss.tp);
    };
    if (tid == 0) {
        fqla_mbar_init(&ss.tp, 1);
        fqla_mbar_init_fence(); /* the bulk copies' completions reach it */
        copy_tp(0);
    }
    /* (the first CTA barrier below orders the inits before any other use) */
    auto signal = [&](gw_signal x) { fqla_mbar_arrive(&ss.signal[x]); };
    auto await = [&](gw_signal x, uint32_t use) { fqla_mbar_wait(&ss.signal[x], use & 1u); };
    uint32_t n_slice = 0; /* slices done (uses of the per-slice signals) */

    /* q and k: exact bf16 rows by cp.async, in flight beside the first
     * head's T~ / P~ loads (waited for with the first slice's copies); else
     * (fp16, or the l2norm's factors) converted through registers */
    const int64_t kb = batch * p.k_sb + t0 * p.k_st + (int64_t)hk * p.k_sh;
    const int64_t qb = batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh;
    if constexpr (!QK_LO) {
        copy_raw<KD>(sm + L::k, (const uint16_t *)p.k + kb, p.k_st, nvalid, KD, true);
        copy_raw<KD>(sm + L::q, (const uint16_t *)p.q + qb, p.q_st, nvalid, KD, true);
        fqla_cp_async_commit();
    } else {
        load_rows<T, KD>(Kt, p.k, kb, p.k_st, nvalid, p.l2norm ? p.rk + rrow : nullptr);
        load_rows<T, KD>(Qt, p.q, qb, p.q_st, nvalid, p.l2norm ? p.rq + rrow : nullptr);
    }

    float dQK[NK]; /* warpgroup 0: dQ, warpgroup 1: dK (rows r0, r0 + 8; KD columns) */
    zero(dQK);

    if constexpr (BESIDE) {
        /* the chains' states: the wait overlaps the copies issued above (q,
         * k, T~, P~), which read only inputs and prepare's workspace; one
         * thread a value head of the group polls */
        if (tid < p.group) {
            const int *done = bp.chain_done + wait_seq * p.HV + hk * p.group + tid;
            while (fqla_ld_acquire_gpu(done) < bp.n_chain_ctas) __nanosleep(500);
        }
        __syncthreads();
    }

    for (int h = 0; h < p.group; h++) {
        const int hv = hk * p.group + h;
        const size_t tile = (size_t)slot * p.HV + hv;
        __syncthreads(); /* the previous head's reads are done */
        if (tid < C) {
            const float gm = p.gam[tile * C + tid];
            ss.gam[tid] = gm;
            ss.bet[tid] = bp.bet[tile * C + tid];
            ss.e[tid] = __expf(gm);
            ss.f[tid] = __expf(p.gam[tile * C + C - 1] - gm);
            ss.df[tid] = ss.db[tid] = ss.de[tid] = 0.f;
        }
        float dP[32], dT[32]; /* dP~ (warpgroup 1), dT~ (warpgroup 0), summed over the slices */
        zero(dP);
        zero(dT);
        float deC = 0.f; /* this thread's share of <S, dS'> */

        for (int v0 = 0; v0 < p.V; v0 += VS, n_slice++) {
            const int vw = p.V - v0 < VS ? p.V - v0 : VS; /* 64, or 32 in a last half slice (zeros past it) */
            const int64_t vb = batch * p.v_sb + t0 * p.v_st + (int64_t)hv * p.v_sh + v0;
            __syncthreads(); /* the previous slice's reads are done */
            {
                /* dO and the value slice first, in flight with S's and dS' loads: as they
                 * are by cp.async where exact in bf16 (dO) or kept raw (v), else split */
                const int64_t ob = batch * bp.do_sb + t0 * bp.do_st + (int64_t)hv * bp.do_sh + v0;
                if constexpr (!DO_LO) copy_raw<64>(sm + L::dO, (const uint16_t *)bp.d_o + ob, bp.do_st, nvalid, vw, vec);
                if constexpr (L::VSM) copy_raw<64>(sm + L::v, (const uint16_t *)p.v + vb, p.v_st, nvalid, vw, vec);
                fqla_cp_async_commit();
                constexpr int ND = C * VS / 8 / THREADS;
                float x[DO_LO ? ND : 1][8];
                if constexpr (DO_LO)
#pragma unroll
                    for (int n = 0; n < ND; n++) {
                        const int idx = tid + n * THREADS, i = idx >> 3, c = 8 * (idx & 7);
                        load8<T>(bp.d_o, ob + (int64_t)i * bp.do_st + c, i < nvalid && c < vw, x[n]);
                    }
                const float *Sg = bp.S + tile * KD * p.V, *dSg = bp.dS + tile * KD * p.V;
                if (s16) {
                    deC += load_plane_f32<KD>(dSt, dSg, sm + L::st, bwd_state_plane<KD>(bp.S, tile, p.V, v0), p.V, v0,
                                              vw);
                } else {
                    deC += load_f32_pair<KD>(St, Sg, dSt, dSg, p.V, v0, vw);
                }
                {
                    /* the next slice's inputs into L2 while this one computes (its
                     * loads at its start then wait on L2 only) */
                    int hn = h, vn = v0 + VS;
                    if (vn >= p.V) {
                        hn = h + 1;
                        vn = 0;
                    }
                    if (hn < p.group) prefetch_slice<KD>(bp, slot, hk, hn, vn, batch, t0, nvalid, s16);
                }
                if constexpr (DO_LO)
#pragma unroll
                    for (int n = 0; n < ND; n++) {
                        const int idx = tid + n * THREADS;
                        fqla_wg_put8(dOt, idx >> 3, 8 * (idx & 7), x[n]);
                    }
                if (v0 == 0) fqla_mbar_wait(&ss.tp, (uint32_t)h & 1u); /* this head's T~ and P~ */
                fqla_cp_async_wait_all();
            }
            fqla_fence_async_smem();
            __syncthreads();

            if (wg == 0) {
                /* KS;  X = V - diag(e) K S;  Y = diag(beta) X;  U = T~ Y */
                float ks[32], x[32];
                fqla_wg_issue(ks, [&] { fqla_wg_split<64, 0, 1, QK_LO, LO>(ks, Kt, St, 0, KD, false); });
                uint32_t vr[16]; /* v at the accumulator places, raw pairs, read under the product */
                if constexpr (L::VSM) {
                    fqla_wg_load_raw<64>(s0 + L::v, C, vr, 0);
                } else {
#pragma unroll
                    for (int hh = 0; hh < 2; hh++)
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            vr[2 * j + hh] = r0 + 8 * hh < nvalid && 8 * j < vw
                                                 ? ld_pair<T>(p.v, vb + (int64_t)(r0 + 8 * hh) * p.v_st + 8 * j + 2 * t4)
                                                 : 0u;
                }
                fqla_wg_retire(ks);
#pragma unroll
                for (int a = 0; a < 32; a += 2) {
                    x[a] = bwd_widen<T>(vr[a >> 1] & 0xffffu);
                    x[a + 1] = bwd_widen<T>(vr[a >> 1] >> 16);
                }
                float acc[32];
#pragma unroll
                for (int a = 0; a < 32; a++) {
                    const int i = r0 + 8 * ((a >> 1) & 1);
                    x[a] -= ss.e[i] * ks[a];
                    acc[a] = ss.bet[i] * x[a];
                }
                fqla_wg_store<64>(Yt, acc, 0);
                fqla_fence_async_smem();
                gw_sync(gw_bar::wg0, 128); /* Y is stored */
                fqla_wg_run(acc, [&] { fqla_wg_split<64, 0, 1, LO, LO>(acc, Tt, Yt, 0, C, false); });
                fqla_wg_store<64>(Ut, acc, 0);
                fqla_fence_async_smem();
                signal(u_ready);

                /* dY = T~^T dU;  dT~ += dU Y^T;  dv = diag(beta) dY;  dbeta_i += x_i . dy_i;
                 * de_i -= beta_i (K S)_i . dy_i */
                await(du_ready, n_slice);
                fqla_reg_fence(dT);
                fqla_wg_issue(acc, [&] {
                    fqla_wg_split<64, 1, 1>(acc, Tt, dUt, 0, C, false);
                    fqla_wg_split<64, 0, 0, LO, LO>(dT, dUt, Yt, 0, VS, true);
                });
                fqla_wg_retire(acc);
                fqla_reg_fence(dT);
                /* dv in io pairs, stored once Y' is handed over (below): the fence
                 * before that signal (MEMBAR.ALL.CTA) then waits on no global store */
                uint32_t dvp[16];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = r0 + 8 * hh;
                    const float bi = ss.bet[i];
                    float sb = 0.f, se = 0.f;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int a = 4 * j + 2 * hh;
                        sb += x[a] * acc[a] + x[a + 1] * acc[a + 1];
                        se += ks[a] * acc[a] + ks[a + 1] * acc[a + 1];
                        dvp[2 * j + hh] = bwd_pack2<T>(bi * acc[a], bi * acc[a + 1]);
                    }
                    sb = quad_sum(sb);
                    se = quad_sum(se);
                    if (t4 == 0) {
                        ss.db[i] += sb;
                        ss.de[i] -= bi * se;
                    }
                }
                /* Y <- -diag(e beta) dY (this warpgroup's reads of Y are done; warpgroup 1 reads none) */
#pragma unroll
                for (int a = 0; a < 32; a++) {
                    const int i = r0 + 8 * ((a >> 1) & 1);
                    acc[a] *= -ss.e[i] * ss.bet[i];
                }
                fqla_wg_store<64>(Yt, acc, 0);
                fqla_fence_async_smem();
                signal(yp_ready);
                {
                    T *dv0 = (T *)bp.dv + batch * bp.dv_sb + t0 * bp.dv_st + (int64_t)hv * bp.dv_sh + v0;
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int i = r0 + 8 * hh;
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const int c = 8 * j + 2 * t4;
                            if (i < nvalid && c < vw) bwd_store2<T>(dv0 + (int64_t)i * bp.dv_st + c, dvp[2 * j + hh]);
                        }
                    }
                }

                /* dO S^T: de_i += scale q_i . (dO S^T)_i;  dQ += scale diag(e) dO S^T */
                float g2[NK];
                fqla_wg_run(g2, [&] { fqla_wg_split<KD, 0, 0, DO_LO, LO>(g2, dOt, St, 0, VS, false); });
                /* q (normalised where the kernel does it) from its tile, 64 columns at a time */
                float sq[2] = {0.f, 0.f};
#pragma unroll
                for (int c0 = 0; c0 < KD; c0 += 64) {
                    float qh[32];
                    fqla_wg_load<64>(Qt, qh, c0);
#pragma unroll
                    for (int a = 0; a < 32; a++) sq[(a >> 1) & 1] += qh[a] * g2[c0 / 2 + a];
                }
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = r0 + 8 * hh;
                    const float ei = scale * ss.e[i];
#pragma unroll
                    for (int j = 0; j < KD / 8; j++) {
                        const int a = 4 * j + 2 * hh;
                        dQK[a] += ei * g2[a];
                        dQK[a + 1] += ei * g2[a + 1];
                    }
                    const float s = quad_sum(sq[hh]);
                    if (t4 == 0) ss.de[i] += scale * s;
                }
            } else {
                /* KdS';  dU = P~^T dO + diag(f) K dS' */
                float kds[32], acc[32];
                fqla_wg_run(kds, [&] { fqla_wg_split<64, 0, 1, QK_LO>(kds, Kt, dSt, 0, KD, false); });
                fqla_wg_run(acc, [&] { fqla_wg_split<64, 1, 1, LO, DO_LO>(acc, Pt, dOt, 0, C, false); });
#pragma unroll
                for (int a = 0; a < 32; a++) acc[a] += ss.f[r0 + 8 * ((a >> 1) & 1)] * kds[a];
                fqla_wg_store<64>(dUt, acc, 0);
                fqla_fence_async_smem();
                signal(du_ready);

                /* df_i += (K dS')_i . u_i;  dP~ += dO U^T */
                await(u_ready, n_slice);
                fqla_wg_load<64>(Ut, acc, 0);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = r0 + 8 * hh;
                    float s = 0.f;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int a = 4 * j + 2 * hh;
                        s += kds[a] * acc[a] + kds[a + 1] * acc[a + 1];
                    }
                    s = quad_sum(s);
                    if (t4 == 0) ss.df[i] += s;
                }
                fqla_wg_run(dP, [&] { fqla_wg_split<64, 0, 0, DO_LO, LO>(dP, dOt, Ut, 0, VS, true); });
                /* U <- diag(f) U (this warpgroup's reads of U are done) */
#pragma unroll
                for (int a = 0; a < 32; a++) acc[a] *= ss.f[r0 + 8 * ((a >> 1) & 1)];
                fqla_wg_store<64>(Ut, acc, 0);
                fqla_fence_async_smem();
                gw_sync(gw_bar::wg1, 128);
                /* dK += -diag(e beta) dY S^T + diag(f) U dS'^T */
                await(yp_ready, n_slice);
                fqla_wg_run(dQK, [&] {
                    fqla_wg_split<KD, 0, 0, LO, LO>(dQK, Yt, St, 0, VS, true);
                    fqla_wg_split<KD, 0, 0, LO, LO>(dQK, Ut, dSt, 0, VS, true);
                });
            }
        }

        /* ---- after the slices ---- */
        __syncthreads(); /* the slice tiles and state slices are free */
        if (wg == 0) {
            /* strict lower dT~ into W0 */
#pragma unroll
            for (int a = 0; a < 32; a++) {
                const int i = r0 + 8 * ((a >> 1) & 1), c = 8 * (a >> 2) + 2 * t4 + (a & 1);
                if (c >= i) dT[a] = 0.f;
            }
            fqla_wg_store<64>(W0, dT, 0);
        }
        {
            float s = deC;
#pragma unroll
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) ss.wsum[tid >> 5] = s;
        }
        fqla_fence_async_smem();
        __syncwarp(); /* the owner lane's write before the warp's arrival (racecheck) */
        __syncthreads();
        if (tid == 0) {
            float s = 0.f;
            for (int w = 0; w < THREADS / 32; w++) s += ss.wsum[w];
            ss.deC = s;
        }

        if (wg == 0) {
            /* M1 = T~^T (strict lower dT~) into W1 */
            float acc[32];
            fqla_wg_run(acc, [&] { fqla_wg_split<64, 1, 1, LO, LO>(acc, Tt, W0, 0, C, false); });
            fqla_wg_store<64>(W1, acc, 0);
            fqla_fence_async_smem();
            signal(m1_ready);
            await(dqt_ready, h);
            /* dQ += dQ~ K */
            fqla_wg_run(dQK, [&] { fqla_wg_split<KD, 0, 1, LO, QK_LO>(dQK, W0, Kt, 0, C, true); });
        } else {
            /* K K^T;  dL = -M1 T~^T (strict lower);  per element (i, j):
             * gdl = Gamma dL; dbeta_i += sum_j gdl KK; M = diag(beta) gdl;
             * R_ij = beta_i gdl KK + dP~ P~ (j < i); dQ~ = scale Gamma dP~ (j <= i) */
            float kk[32], dl[32];
            fqla_wg_issue(kk, [&] { fqla_wg_split<64, 0, 0, QK_LO, QK_LO>(kk, Kt, Kt, 0, KD, false); });
            float pg[32]; /* P~ (hi + lo) at the accumulator places, read under the product */
            fqla_wg_load<64>(Pt, pg, 0);
            fqla_wg_retire(kk);
            await(m1_ready, h);
            fqla_wg_run(dl, [&] { fqla_wg_split<64, 0, 0, LO, LO>(dl, W1, Tt, 0, C, false); });
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int i = r0 + 8 * hh;
                const float gi = ss.gam[i], bi = ss.bet[i];
                float s = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int c2 = 0; c2 < 2; c2++) {
                        const int jj = 8 * j + 2 * t4 + c2, a = 4 * j + 2 * hh + c2;
                        const float G = jj <= i ? __expf(gi - ss.gam[jj]) : 0.f;
                        const float gdl = jj < i ? -dl[a] * G : 0.f;
                        s += gdl * kk[a];
                        const float dp = dP[a];
                        const float R = jj < i ? bi * gdl * kk[a] + dp * pg[a] : 0.f;
                        dl[a] = bi * gdl;          /* M */
                        Rs[i * LDR + jj] = R;
                        dP[a] = scale * G * dp;    /* dQ~ */
                    }
                s = quad_sum(s);
                if (t4 == 0) ss.db[i] += s;
            }
            fqla_wg_store<64>(W0, dP, 0);
            fqla_wg_store<64>(W1, dl, 0);
            fqla_fence_async_smem();
            /* this warpgroup's own sync (its wgmma read what all its threads stored) */
            gw_sync(gw_bar::wg1, 128);
            signal(dqt_ready);
            /* dK += dQ~^T Q + M K + M^T K */
            fqla_wg_run(dQK, [&] {
                fqla_wg_split<KD, 1, 1, LO, QK_LO>(dQK, W0, Qt, 0, C, true);
                fqla_wg_split<KD, 0, 1, LO, QK_LO>(dQK, W1, Kt, 0, C, true);
                fqla_wg_split<KD, 1, 1, LO, QK_LO>(dQK, W1, Kt, 0, C, true);
            });
        }
        __syncthreads(); /* T~ and P~ read for the last time */
        if (tid == 0 && h + 1 < p.group) copy_tp(h + 1);
        {
            /* R as row prefix sums sum_{j < t} R_it: four threads a row, 16
             * columns each, then the quad's segment totals */
            const int i = tid >> 2, seg = tid & 3;
            float *Ri = Rs + i * LDR + 16 * seg;
            float v[16], run = 0.f;
#pragma unroll
            for (int k = 0; k < 16; k++) v[k] = Ri[k];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                const float r = v[k];
                v[k] = run;
                run += r;
            }
            float off = 0.f;
#pragma unroll
            for (int q = 0; q < 3; q++) {
                const float tq = __shfl_sync(0xffffffffu, run, (lane & ~3) + q);
                if (q < seg) off += tq;
            }
#pragma unroll
            for (int k = 0; k < 16; k++) Ri[k] = v[k] + off;
        }
        __syncthreads();
        /* dg_t = sum_{i >= t} (de_i e_i + sum_{j < t} R_ij) + sum_{j < t} df_j f_j + de_C e_C:
         * four threads a token (rows and columns i = part mod 4), summed in a fixed order */
        {
            const int t = tid >> 2, part = tid & 3;
            float s = 0.f;
            for (int i = t + ((part - t) & 3); i < C; i += 4) s += ss.de[i] * ss.e[i] + Rs[i * LDR + t];
            for (int j = part; j < t; j += 4) s += ss.df[j] * ss.f[j];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (part == 0) {
                float dgv = s + ss.deC * __expf(ss.gam[C - 1]);
                float dbv = ss.db[t];
                float part_a = 0.f, part_d = 0.f;
                if (t < nvalid) {
                    const int64_t tt = t0 + t;
                    if (p.gate_in_kernel) {
                        const float raw = load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh);
                        const float A = __expf(p.A_log[hv * p.alog_s]);
                        const float xg = raw + p.dt_bias[hv * p.dtb_s];
                        const float gval = -A * softplus_f(xg);
                        /* the forward's floor: below it g did not depend on its input */
                        const float dx = gval < FQLA_FWD_G_FLOOR ? 0.f : -A * sigmoid_f(xg) * dgv;
                        part_d = dx;
                        part_a = gval < FQLA_FWD_G_FLOOR ? 0.f : gval * dgv;
                        dgv = dx;
                    }
                    if (p.beta_sigmoid) {
                        const float b = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
                        dbv *= (p.neg_eig ? 2.f : 1.f) * sigmoid_f(b) * sigmoid_f(-b);
                    }
                    bp.dg[batch * bp.dg_sb + tt * bp.dg_st + (int64_t)hv * bp.dg_sh] = dgv;
                    bp.dbeta[batch * bp.db_sb + tt * bp.db_st + (int64_t)hv * bp.db_sh] = dbv;
                }
                gpart[0][t] = part_a;
                gpart[1][t] = part_d;
            }
        }
        if (bp.gate_part) {
            __syncwarp(); /* the part == 0 lanes' writes before the warp's arrival (racecheck) */
            __syncthreads();
            if (tid == 0) {
                float sa = 0.f, sd = 0.f;
                for (int i = 0; i < C; i++) {
                    sa += gpart[0][i];
                    sd += gpart[1][i];
                }
                bp.gate_part[2 * tile] = sa;
                bp.gate_part[2 * tile + 1] = sd;
            }
        }
    }

    /* dq (warpgroup 0), dk (warpgroup 1): through the l2norm backward
     * dx = r (dxhat - xhat <xhat, dxhat>); a warp holds whole rows */
    const fqla_wg_tile &xs = wg == 0 ? Qt : Kt;
    const float *r = wg == 0 ? p.rq : p.rk;
    T *out = (T *)(wg == 0 ? bp.dq : bp.dk);
    const int64_t sb = wg == 0 ? bp.dq_sb : bp.dk_sb, st = wg == 0 ? bp.dq_st : bp.dk_st,
                  sh = wg == 0 ? bp.dq_sh : bp.dk_sh;
    float xh[NK]; /* q or k (normalised) at this thread's accumulator places */
    if (p.l2norm) fqla_wg_load<KD>(xs, xh, 0);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int i = r0 + 8 * hh;
        float dot = 0.f;
        if (p.l2norm) {
#pragma unroll
            for (int j = 0; j < KD / 8; j++) {
                const int a = 4 * j + 2 * hh;
                dot += dQK[a] * xh[a] + dQK[a + 1] * xh[a + 1];
            }
            dot = quad_sum(dot);
        }
        if (i >= nvalid) continue;
        T *o = out + batch * sb + (t0 + i) * st + (int64_t)hk * sh;
#pragma unroll
        for (int j = 0; j < KD / 8; j++) {
            const int c = 8 * j + 2 * t4, a = 4 * j + 2 * hh;
            float v0 = dQK[a], v1 = dQK[a + 1];
            if (p.l2norm) {
                v0 = r[rrow + i] * (v0 - xh[a] * dot);
                v1 = r[rrow + i] * (v1 - xh[a + 1] * dot);
            }
            o[c] = bwd_cvt<T>(v0);
            o[c + 1] = bwd_cvt<T>(v1);
        }
    }
}

/* The bf16 launches overlap: the full chunks' launch (plain, after the
 * chains) lets the tails' launch start as soon as every one of its CTAs has
 * started (programmatic dependent launch, ptx/pdl.cuh), so the tails' CTAs,
 * whose split products make them the longer, take the SMs the full chunks'
 * last wave leaves idle instead of running after it as a wave of their own
 * (0.06-0.12 ms on the bench's 8k_8seq rows, most SMs idle: 15 CTAs a q/k
 * head there). The tails read only what the full chunks' launch does not
 * write (the chains' states, prepare's workspace, the inputs), and both were
 * complete before that launch began, so the tails need no wait before they
 * start; they write other chunks' rows. One CTA of the tails waits for the
 * full chunks' launch at its end (griddepcontrol.wait), so the tails' launch
 * completes after it, and the finishing kernel, launched plainly, reads
 * every chunk's gate parts complete. (Waiting at the end in every CTA would
 * let CTAs without a chunk, most of this grid, hold SMs until then.)
 * BESIDE (bp.chain_done, bwd_common.cuh): both launches also start beside the
 * chains (the full chunks' after the chains' with PDL), take the sequences
 * shortest first and wait per sequence for its chains (grads_cta); the full
 * chunks' CTA (0, 0) then waits for the chains' launch at its end, so the
 * launches still complete in order. */
template <typename T, int KD, bool QK_LO, gw_route ROUTE, bool BESIDE>
__global__ void __launch_bounds__(THREADS, 1) bwd_grads_kernel(const fqla_bwd_params bp, int vec)
{
    if constexpr (ROUTE == gw_route::full_chunks) fqla_pdl_trigger();
    grads_cta<T, KD, QK_LO, ROUTE, BESIDE>(bp, vec);
    /* (only in the instances that need it: ptxas spills more around it, 12 / 28
     * bytes -> 56 / 56 in the full chunks' kernel) */
    if constexpr (BESIDE || ROUTE == gw_route::tails)
        if (blockIdx.x == 0 && blockIdx.y == 0) fqla_pdl_wait();
}

template <typename T, int KD, bool QK_LO, gw_route R, bool BESIDE = false>
cudaError_t launch_route(const fqla_bwd_params &p, unsigned ctas, int vec, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = gw_layout<KD, QK_LO, !std::is_same<T, __nv_bfloat16>::value>::bytes;
    cudaError_t e = fqla_smem_limit(cache, bwd_grads_kernel<T, KD, QK_LO, R, BESIDE>, smem);
    if (e != cudaSuccess) return e;
    /* the tails' launch follows the full chunks' with PDL (bwd_grads_kernel),
     * and beside the chains (bp.chain_done) every launch does */
    const int pdl = R == gw_route::tails || BESIDE;
    return fqla_launch(bwd_grads_kernel<T, KD, QK_LO, R, BESIDE>, dim3(ctas, (unsigned)p.f.H), dim3(THREADS), smem, stream,
                       pdl, p, vec);
}

template <typename T, int KD, bool QK_LO> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    const int vec = fqla_bwd_rows16(p, FQLA_BWD_ROWS_V | FQLA_BWD_ROWS_DO);
    const unsigned slots = (unsigned)p.f.slots;
    if constexpr (!std::is_same<T, __nv_bfloat16>::value) {
        return launch_route<T, KD, QK_LO, gw_route::every_chunk>(p, slots, vec, stream);
    } else {
        if (p.chain_done) { /* beside the chains (bwd_common.cuh): bf16 packed sequences */
            cudaError_t e = launch_route<T, KD, QK_LO, gw_route::full_chunks, true>(p, slots, vec, stream);
            if (e != cudaSuccess || p.no_tails) return e;
            return launch_route<T, KD, QK_LO, gw_route::tails, true>(p, (unsigned)(p.f.N * FQLA_BWD_SHORT_CHUNKS),
                                                                     vec, stream);
        }
        cudaError_t e = launch_route<T, KD, QK_LO, gw_route::full_chunks>(p, slots, vec, stream);
        /* nothing for the tails: no sequence, or whole chunks, none short (a
         * padded batch; packed sequences where the host cu_seqlens shows it,
         * p.no_tails; else their CTAs find out) */
        const bool whole = (!p.f.varlen && p.f.T % C == 0 && p.f.T > FQLA_BWD_SHORT_CHUNKS * C) || p.no_tails;
        if (e != cudaSuccess || p.f.N == 0 || whole) return e;
        return launch_route<T, KD, QK_LO, gw_route::tails>(p, (unsigned)(p.f.N * FQLA_BWD_SHORT_CHUNKS), vec, stream);
    }
}

/* bf16 io with or without the l2norm (q / k exact or not), or fp16 */
template <int KD> cudaError_t launch_io(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    if (!io_bf16) return launch<__half, KD, true>(p, stream);
    return p.f.l2norm ? launch<__nv_bfloat16, KD, true>(p, stream) : launch<__nv_bfloat16, KD, false>(p, stream);
}

} // namespace

cudaError_t fqla_bwd_launch_grads(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    /* K = 64 or 128 and V a multiple of 32: the CUDA backward's coverage
     * (fqla_cuda_bwd_supported) */
    return p.f.K == 64 ? launch_io<64>(p, io_bf16, stream) : launch_io<128>(p, io_bf16, stream);
}
