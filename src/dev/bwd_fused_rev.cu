/*
 * bwd_fused_rev.cu - (developer build) step 1 of the backward's fused
 * reverse pass (docs/history/2026-12-07b-bwdfused.md, sections 3-4): the
 * reverse chain of bwd_chain.cu with the whole V of one (sequence, value
 * head) in one CTA, split over warpgroups by role instead of by value
 * columns, so that dS' is in shared memory as hi / lo planes where the
 * gradient warpgroups of step 2 will read it instead of the workspace.
 *
 * Notation of bwd_chain.cu (dS: the gradient w.r.t. the state leaving the
 * chunk; e, f, e_C from the chunk's gamma; T~, P~ from bwd_prepare.cu):
 *   dU = P~^T dO + diag(f) K dS;  dY = T~^T dU;
 *   dS <- e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY)
 *
 * Roles (384 threads, registers rebalanced by setmaxnreg):
 *   warpgroup 0 (state): dS^T (V = 128 value rows x K = 128) as two
 *     m64n128 accumulators; publishes it as hi / lo planes, then stores it
 *     to the workspace (the gradient kernel's input, as the reverse chain
 *     does) while the others run; forms (scale diag(e) dO)^T as split
 *     register fragments; after z_ready the update, RS for the dO term and
 *     SS for Z^T K.
 *   warpgroup 2 (dU side): K dS' (SS, dS' split), scaled by f, plus
 *     P~^T dO: dU, stored as hi / lo planes (du_ready).
 *   warpgroup 1 (dY side): dY = T~^T dU (both split), Z = -diag(e beta) dY
 *     over dU's planes (z_ready); it also issues the next chunk's copies.
 * Value columns never mix in the chain, so each hand-off is per value half
 * (64 columns): warpgroup 2 works on half 1 while warpgroup 1 works on
 * half 0, and so on, a three-stage pipeline of two items a chunk.
 * Timed as dh0 alone (prepare + this pass) against the reverse chain, ten
 * bench rows, H200 (docs/history/2026-12-07c-fusedrev.md): 1.21-1.35x
 * with CP off; without the dS stores, which sit on warpgroup 0's path
 * before its update, 0.91-1.05x. (Where the plan runs CP, a form 1-3 %
 * slower, since reverted: 0.95-0.98x, 0.86-0.90x without the stores. The
 * first form, one hand-off a chunk over all 128 columns with dS stored
 * before it was published: 1.28-1.55x, H100.)
 *
 * Two forms (NH, value halves a CTA): the whole V (NH = 2, above; modes 1
 * and 2 of fqla_cuda_bwd_tune_fused_rev) and one 64-column half a CTA
 * (NH = 1, blockIdx.z the half; modes 3 and 4), whose planes on the value
 * side are half as large: the room the gradient work needs
 * (docs/history/2026-12-07d-fusedproto.md section 1). As a reverse chain
 * alone the half form is 0.76-1.13x today's (dh0 alone, H100).
 *
 * The gradient work (GRAD, half form, mode 5): every gradient of the
 * chunks whose entering state the state chain stored as its bf16 plane
 * (bwd_state_bf16), in the lean route's precision of bwd_grads.cu (only
 * K dS' and dY split), beside the chain: warpgroup 1 K S, X, Y, U, dY, dT~,
 * dv, Z, the tail's M1 / K K^T / dL / M, dQ; warpgroup 2 dU, df (U formed
 * again in fp32), dP~ and dQ~, dK, the chunk's dg / dbeta rows; the state
 * warpgroup <S, dS'>. R's lower sums and the gate sums for dg by shuffles
 * (lower_sums, gate_scans). The
 * grid puts a q/k head's 2 x group CTAs (its value heads' halves) next to
 * each other; the last of them to arrive sums dq / dk in part order
 * (sum_parts), and the last of a value head's two halves its dg / dbeta
 * (sum_halves), both through fp32 slots in a developer-build scratch. The
 * gradient kernel forms the other chunks' gradients (a span's first chunk,
 * partial chunks, sequences of at most four chunks: fqla_bwd_params.
 * fused_grads), from the dS the pass stores for them. Correct under the
 * emulator and on the H100 on test_gpu_bwd's bwd_fused_rev (GVA 1-4, CP,
 * strong decay with beta near 2), but slow: the whole backward 1.42-1.75x
 * today's, 1.10-1.18x with dq / dk unsummed (mode 6;
 * docs/history/2026-12-07g-mode5gpu.md). Its forerunner, a timing prototype with the element-wise
 * math approximated, ran the whole backward at 0.80-0.94x today's (H100,
 * docs/history/2026-12-07d-fusedproto.md); the sums of dq / dk in L2 cost
 * +0.08 to +0.55 of it (2026-12-07f-fusedred.md). Warpgroup 2 forms R's
 * sums before dK's accumulator is live: with both at once ptxas serialised
 * the kernel's wgmma (C7512); now 240 / 244 bytes of spills.
 *
 * Covered (fqla_dev_bwd_fused_rev_covers): bf16 io, K = V = 128, no
 * in-kernel l2norm, whole sequences or CP's main pass over segments (from
 * the gradients the reverse chain's pre-pass and the scan leave), the
 * gradient kernel not beside the chains, 16-byte rows. The chunk walk is a
 * dependent chain through the three warpgroups (ds_ready -> du_ready ->
 * z_ready), one CTA barrier a chunk for the copies.
 *
 * Shared memory (KiB), whole V: two stages of k, q, dO (48 each); T~ and
 * P~ hi / lo (32, one set: each refilled by its last reader after its
 * product); dS' hi / lo (64); dU, then Z, hi / lo (32); the gamma / beta
 * rows: ~226. Half form: the dO, dS' and dU planes halved (~161); with
 * GRAD also S's plane in each stage, Y, U, dT~, dQ~ and the row terms
 * (~226.3: no room left for the 1 KiB of alignment slack, fr_layout).
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/kernel/wg_split.cuh"
#include "cuda/launch.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "dev/bwd_fused_rev.cuh"

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int KD = 128, VD = 128;
constexpr int THREADS = 384;
constexpr int PLANE = C * 128 * 2;          /* a [64][128] bf16 plane: k, q, dO, dU / Z */
constexpr int TILE = C * 64 * 2;            /* a [64][64] bf16 plane: T~, P~ */

/* per value half h: ds_ready + h, du_ready + h, z_ready + h; side_local + 0 / 1:
 * warpgroup 1's / 2's own */
enum class fr_bar : uint32_t { ds_ready = 1, du_ready = 3, z_ready = 5, side_local = 7 };
/* the gradient work's hand-offs between warpgroups 1 and 2 */
enum class gp_bar : uint32_t { u_ready = 10, qt_ready = 11, m_ready = 12, u_free = 13, rows_ready = 14 };

/* The kernel's flag: the state warpgroup stores dS to the workspace (the
 * gradient kernel's input; modes 1 and 3). */
/* fr_no_sum (mode 6, timing only): each chunk's dq / dk stored by part 0
 * alone, from its own part, unsummed: the pass as if the sum were free */
enum fr_flag : int { fr_store_ds = 1, fr_no_sum = 2 };

/* The roles' named barriers: each is reached by warps of different roles
 * from different places in the code, so the forms without .aligned (the
 * .aligned bar.sync wants one instruction for every thread of the barrier;
 * synccheck called the chunk barrier divergent with it, a __syncwarp before
 * it or not). */
template <typename E> __device__ __forceinline__ void bar_sync(E id, uint32_t n, uint32_t i = 0)
{
    fqla_named_sync_any(fqla_bar_id(id, i), n);
}
template <typename E> __device__ __forceinline__ void bar_arrive(E id, uint32_t n, uint32_t i = 0)
{
    fqla_named_arrive_any(fqla_bar_id(id, i), n);
}

/* Each role at chunk it's start: its own copies landed and visible to the
 * async proxy, then the CTA-wide barrier (every role's copies landed, the
 * previous chunk fully read). The barrier is an mbarrier that every thread
 * arrives on, phase it & 1: the three roles reach it from three places in
 * the code, which a named barrier of the whole block (bar.sync, with or
 * without .aligned) makes synccheck call divergent. */
__device__ __forceinline__ void chunk_start(uint64_t *mb, int it)
{
    fqla_cp_async_wait_all();
    fqla_fence_async_smem();
    fqla_mbar_arrive(mb);
    fqla_mbar_wait(mb, (uint32_t)it & 1u);
}

struct fr_rows {
    alignas(16) float gam[C];
    alignas(16) float bet[C];
};

/* The chunk's per-token gradient terms of this value half (one set: a
 * chunk's are read before any role passes the next chunk's start): de, df,
 * db by row, the two lower sums of R (dgr: warpgroup 1's beta dL K K^T part,
 * warpgroup 2's dP~ P~ part), and the state warpgroup's <S, dS'> by warp.
 */
struct fr_grow {
    float de[C], df[C], db[C];
    float dgr[2][C];
    float deC[4];
};

/* NH value halves a CTA (2: the whole V = 128; 1: one 64-column half, a
 * CTA per half, blockIdx.z). Planes: k, q [64][128]; dO [64][64 NH]; dS'^T
 * [64 NH value rows][128]; dU / Z [64][64 NH]. */
template <int NH, bool GRAD> struct fr_layout {
    static constexpr int DOP = NH * TILE;            /* a dO plane */
    static constexpr int DSP = NH * PLANE;           /* a dS'^T plane */
    static constexpr int DUP = NH * TILE;            /* a dU / Z plane */
    static constexpr int SP = GRAD ? KD * 64 * 2 : 0; /* GRAD: S's bf16 plane, [K][64] */
    static constexpr int STAGE = 2 * PLANE + DOP + SP; /* k, q, dO (, S) */
    static constexpr int ring = 0;                   /* two stages */
    static constexpr int tp = 2 * STAGE;             /* T~ hi, lo; P~ hi, lo */
    static constexpr int ds = tp + 4 * TILE;         /* dS'^T hi, lo */
    static constexpr int du = ds + 2 * DSP;          /* dU (then Z) hi, lo */
    /* GRAD: Y, U (then M), dT~ (then M1), dQ~, hi planes */
    static constexpr int yp = du + 2 * DUP, up = yp + (GRAD ? TILE : 0), tq = up + (GRAD ? TILE : 0);
    static constexpr int qt = tq + (GRAD ? TILE : 0);
    static constexpr int rows = qt + (GRAD ? TILE : 0); /* fr_rows[2] */
    static constexpr int grow = rows + 2 * (int)sizeof(fr_rows); /* fr_grow (GRAD) */
    static constexpr int mbar = grow + (GRAD ? (int)sizeof(fr_grow) : 0); /* the chunk barrier */
    static constexpr int last = mbar + 8;            /* four ints: "this part is last" (sum_parts, sum_halves) */
    static constexpr int used = last + 16;
    /* 1024 bytes of slack to align the base where they fit; else the base
     * must come aligned (it does: the block's dynamic shared memory starts
     * after the 1 KiB the system reserves) and the kernel checks it */
    static constexpr int slack = used + 1024 <= 227 * 1024 ? 1024 : 0;
    static constexpr int bytes = used + slack;
    static_assert(!GRAD || NH == 1, "the gradient work is of the half-width form");
    static_assert(bytes <= 227 * 1024, "over the shared memory a block may have");
};

/* Registers a thread by role: (STATE + 2 SIDE) x 128 <= 384 x 168. At NH 2,
 * 240 / 128 spilled the side warpgroups. */
template <int NH, bool GRAD> struct fr_regs {
    static constexpr int ENTRY = 168; /* 65536 / 384, rounded down to 8 */
    static constexpr int STATE = NH == 2 ? 216 : 152, SIDE = NH == 2 ? 144 : 176;
    static_assert(STATE + 2 * SIDE <= 3 * ENTRY, "over the register file");
};

/* A role's register budget: .dec below the entry count, .inc above. */
template <int R, int ENTRY> __device__ __forceinline__ void set_regs()
{
    if constexpr (R < ENTRY)
        fqla_setmaxnreg_dec<R>();
    else if constexpr (R > ENTRY)
        fqla_setmaxnreg_inc<R>();
}

/* 64 rows of COLS bf16 from src (row i at src + i * st) into a swizzled
 * [64][COLS] plane by the 128 threads of one warpgroup (lt: the thread's
 * index in it); rows past nvalid as zeros. bwd_chain.cu's copy_plane in
 * the form this pass needs; that one reads threadIdx.x, and sharing one
 * helper changed the chains' generated code, untimed, so each keeps its own. */
template <int COLS>
__device__ __forceinline__ void copy_rows(unsigned char *plane, const uint16_t *src, int64_t st, int nvalid, int lt)
{
    /* COLS / 8 pieces a row, R rows a pass: a thread's pieces are rows R
     * apart in one column chunk, so one swizzled address and one source
     * pointer, each stepped by a constant */
    constexpr int P = COLS / 8, R = 128 / P;
    const int i0 = lt / P, j = 8 * (lt % P);
    unsigned char *d = plane + fqla_wg_off(C, i0, j);
    const uint16_t *sp = src + (int64_t)i0 * st + j;
    const int64_t step = R * st;
#pragma unroll
    for (int n = 0; n < C / R; n++) {
        const bool ok = i0 + R * n < nvalid;
        fqla_cp_async16(d + R * 128 * n, ok ? sp + step * n : src, ok ? 16 : 0);
    }
}

/* A T~ or P~ tile (hi, lo planes as bwd_prepare.cu stores them) by one warpgroup. */
__device__ __forceinline__ void copy_tile(unsigned char *dst, const float *src, int lt)
{
#pragma unroll
    for (int n = 0; n < C * C / 4 / 128; n++) {
        const int idx = lt + 128 * n;
        fqla_cp_async16(dst + 16 * idx, src + 4 * idx, 16);
    }
}

/* The token column of element a of an m64nN accumulator (or of fqla_wg_frags'
 * order), and its row offset (0 or 8) from the thread's first row. */
__device__ __forceinline__ int col_of(int a) { return 8 * (a >> 2) + 2 * (threadIdx.x & 3) + (a & 1); }
__device__ __forceinline__ int row8_of(int a) { return 8 * ((a >> 1) & 1); }

/* The sum over the quad of lanes that hold one accumulator row. */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* (scale diag(e) dO)^T for value rows c0 .. c0 + 63 as split A fragments
 * over the chunk's tokens: dO's plane read transposed, each token's column
 * scaled by scale e_t. */
__device__ __forceinline__ void scaled_do_frags(const fqla_wg_tile &DO, const fr_rows &r, float scale, int c0,
                                                uint32_t (&eh)[4][4], uint32_t (&el)[4][4])
{
    uint32_t xr[4][4];
    float x[32];
    fqla_wg_load_t<4>(DO, xr, c0);
    bwd_widen_frags<__nv_bfloat16>(xr, x);
#pragma unroll
    for (int a = 0; a < 32; a++) x[a] *= scale * __expf(r.gam[col_of(a)]);
    fqla_wg_frags(x, eh, el);
}

/* acc (+)= (e dO)^T Q (A: the fragments eh / el) + Z^T K (Z: the plane pair
 * of this value half), one group, retired. */
__device__ __forceinline__ void update_half(float (&acc)[64], uint32_t (&eh)[4][4], uint32_t (&el)[4][4],
                                            const fqla_wg_tile &Qt, const fqla_wg_tile &Z, const fqla_wg_tile &Kt)
{
    fqla_reg_fence_u(eh);
    fqla_reg_fence_u(el);
    fqla_wg_run(acc, [&] {
        fqla_wg_rs_split<128, 1, true, false, 4>(acc, eh, el, Qt, true);
        fqla_wg_split<128, 1, 1, true, false>(acc, Z, Kt, 0, C, true);
    });
    fqla_reg_fence_u(eh);
    fqla_reg_fence_u(el);
}


/* The count a group of CTAs makes of its parts, each after storing its own:
 * every thread of the calling warpgroup has stored (the barrier), one adds 1
 * to cnt (acq_rel: the parts stored before are visible to the one that sees
 * the last count), and all learn whether theirs was the last of `parts`.
 * bar_id: the warpgroup's own barrier; lastp a word of shared memory. */
__device__ __forceinline__ bool arrived_last(int *cnt, int parts, int *lastp, uint32_t bar_id, int lt)
{
    fqla_named_sync_any(bar_id, 128);
    if (lt == 0) *lastp = fqla_atom_add_acq_rel_gpu(cnt, 1) == parts - 1;
    fqla_named_sync_any(bar_id, 128);
    return *lastp;
}

/* The sum of a chunk's dq or dk over the 2 x group parts of a q/k head (its
 * value heads' halves, one CTA each), in part order, by the part that
 * arrives last: acc this warpgroup's part (m64n128, rows row0 (+8), columns
 * col_of), buf the chunk's [parts][64][128] fp32 slots in the scratch, cnt
 * their counter (0 before; the last part sets it back). Every part stores
 * its slot and counts itself in with an acq_rel add; the last sums the slots
 * one part at a time (each part's 32 loads a thread independent: one L2
 * round trip a part), stores the bf16 rows (dst, row stride st, rows past
 * nvalid left out) and drops the slots' lines from L2 unwritten. Nothing
 * waits, and reruns are bit-identical. lt: the thread's index in the
 * warpgroup, bar_id its own named barrier, lastp a word of shared memory.
 * (In L2 a sum costs the parts' bytes at least: docs/history/
 * 2026-12-07f-fusedred.md measured this and three other forms.) */
__device__ __forceinline__ void sum_parts(const float (&acc)[64], float *buf, int *cnt, int part, int parts,
                                          uint16_t *dst, int64_t st, int nvalid, int row0, int lt, uint32_t bar_id,
                                          int *lastp, bool no_sum)
{
    if (no_sum) {
        if (part == 0)
#pragma unroll
            for (int a = 0; a < 64; a += 2) {
                const int i = row0 + row8_of(a);
                if (i < nvalid)
                    *reinterpret_cast<uint32_t *>(dst + (int64_t)i * st + col_of(a)) = fqla_wg_bf2(acc[a], acc[a + 1]);
            }
        return;
    }
    float *own = buf + (size_t)part * 64 * 128;
#pragma unroll
    for (int a = 0; a < 64; a += 2)
        *reinterpret_cast<float2 *>(own + (row0 + row8_of(a)) * 128 + col_of(a)) = make_float2(acc[a], acc[a + 1]);
    if (!arrived_last(cnt, parts, lastp, bar_id, lt)) return;
    /* its own part too from its slot, so that acc is dead after the stores (registers) */
    float sum[64];
#pragma unroll
    for (int a = 0; a < 64; a++) sum[a] = 0.f;
    for (int q = 0; q < parts; q++) {
        const float *src = buf + (size_t)q * 64 * 128;
#pragma unroll
        for (int a = 0; a < 64; a += 2) {
            const float2 x = *reinterpret_cast<const float2 *>(src + (row0 + row8_of(a)) * 128 + col_of(a));
            sum[a] += x.x;
            sum[a + 1] += x.y;
        }
    }
#pragma unroll
    for (int a = 0; a < 64; a += 2) {
        const int i = row0 + row8_of(a);
        if (i < nvalid)
            *reinterpret_cast<uint32_t *>(dst + (int64_t)i * st + col_of(a)) = fqla_wg_bf2(sum[a], sum[a + 1]);
    }
    /* every thread's loads done: the slots' lines dropped, the counter reset */
    fqla_named_sync_any(bar_id, 128);
    for (int l = lt; l < parts * 64 * 128 / 32; l += 128) fqla_discard_l2(buf + 32 * l);
    if (lt == 0) *cnt = 0;
}

/* For R, a warpgroup's m64n64 accumulator of a strictly lower 64 x 64 matrix
 * (zeros on and above the diagonal; rows row0 (+8), columns col_of), out[t]
 * = sum_{i >= t > j} R_ij for every t (dg's R term, bwd_grads.cu), in a fixed
 * order: each row's prefix sums over j by the quad's shuffles (W_it = sum_{j
 * < t} R_ij), each column's sum over i >= t by the warp's shuffles, then the
 * four warps' sums through tmp (256 floats of shared memory no one else
 * reads meanwhile). bar_id: the warpgroup's own barrier; lt its thread. */
__device__ __forceinline__ void lower_sums(const float (&R)[32], float *out, float *tmp, uint32_t bar_id, int lt,
                                           int row0)
{
    const int lane = lt & 31, t4 = lane & 3, warp = lt >> 5;
    const int up1 = (lane & ~3) | (t4 > 0 ? t4 - 1 : 0), up2 = (lane & ~3) | (t4 > 1 ? t4 - 2 : 0);
    float carry[2] = {0.f, 0.f}; /* the row's sum over the blocks before */
#pragma unroll
    for (int jb = 0; jb < 8; jb++) {
        const int c0 = 8 * jb + 2 * t4;
        float col0 = 0.f, col1 = 0.f; /* columns c0, c0 + 1: the thread's rows with i >= t */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int i = row0 + 8 * hh, a0 = 4 * jb + 2 * hh;
            const float pr = R[a0] + R[a0 + 1];
            /* inclusive scan of the pair sums over the quad, then its exclusive part */
            float x = pr;
            float y = __shfl_sync(0xffffffffu, x, up1);
            if (t4 >= 1) x += y;
            y = __shfl_sync(0xffffffffu, x, up2);
            if (t4 >= 2) x += y;
            const float prev = __shfl_sync(0xffffffffu, x, up1);
            const float total = __shfl_sync(0xffffffffu, x, lane | 3);
            const float w0 = carry[hh] + (t4 ? prev : 0.f), w1 = w0 + R[a0]; /* W at columns c0, c0 + 1 */
            if (i >= c0) col0 += w0;
            if (i >= c0 + 1) col1 += w1;
            carry[hh] += total;
        }
        /* over the warp's rows (the lanes of one t4) */
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            col0 += __shfl_xor_sync(0xffffffffu, col0, o);
            col1 += __shfl_xor_sync(0xffffffffu, col1, o);
        }
        if (lane < 4) {
            tmp[warp * 64 + c0] = col0;
            tmp[warp * 64 + c0 + 1] = col1;
        }
    }
    /* the warpgroup's four warps, in warp order */
    fqla_named_sync_any(bar_id, 128);
    if (lt < 64) out[lt] = ((tmp[lt] + tmp[64 + lt]) + tmp[128 + lt]) + tmp[192 + lt];
}

/* dg's two gate sums at token t (threads lt < 64, whole warps: t = lt):
 * sde = sum_{i >= t} de_i e^{gam_i} and sdf = sum_{j < t} df_j e^{gC - gam_j},
 * by each warp's shuffles over all 64 tokens (two a lane: 2 l, 2 l + 1), a
 * fixed order, instead of a serial walk of up to 64 dependent adds a sum. */
__device__ __forceinline__ void gate_scans(const float *de, const float *df, const float *gam, float gC, int t,
                                           float &sde, float &sdf)
{
    const int lane = t & 31;
    const float x0 = de[2 * lane] * __expf(gam[2 * lane]), x1 = de[2 * lane + 1] * __expf(gam[2 * lane + 1]);
    const float y0 = df[2 * lane] * __expf(gC - gam[2 * lane]), y1 = df[2 * lane + 1] * __expf(gC - gam[2 * lane + 1]);
    float sx = x0 + x1, py = y0 + y1; /* inclusive suffix over lanes >= lane, prefix over lanes <= lane */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float a = __shfl_down_sync(0xffffffffu, sx, o), b = __shfl_up_sync(0xffffffffu, py, o);
        if (lane + o < 32) sx += a;
        if (lane >= o) py += b;
    }
    /* the exclusive sums by a shift, never by subtracting a term (under a
     * strong decay one term can be ~e^20 times the rest) */
    float nx = __shfl_down_sync(0xffffffffu, sx, 1), ey = __shfl_up_sync(0xffffffffu, py, 1);
    if (lane == 31) nx = 0.f;
    if (lane == 0) ey = 0.f;
    const float s1 = x1 + nx, s0 = x0 + s1; /* sums from tokens 2 lane + 1 and 2 lane */
    const float p1 = ey + y0;               /* sum before token 2 lane + 1 (ey: before 2 lane) */
    /* token t's pair lives in lane t / 2 */
    const int src = t >> 1;
    const float a0 = __shfl_sync(0xffffffffu, s0, src), a1 = __shfl_sync(0xffffffffu, s1, src);
    const float b0 = __shfl_sync(0xffffffffu, ey, src), b1 = __shfl_sync(0xffffffffu, p1, src);
    sde = (t & 1) ? a1 : a0;
    sdf = (t & 1) ? b1 : b0;
}

/* The (value head, chunk)'s dg and dbeta rows of this value half (64 each,
 * threads lt < 64) summed over the two halves in half order by the CTA that
 * arrives last (an acq_rel count), then stored with beta's sigmoid factor;
 * buf: [2 halves][2][64] fp32 scratch, cnt its counter; lastp a word of
 * shared memory; bar_id the calling warpgroup's own barrier. */
__device__ __forceinline__ void sum_halves(const fqla_bwd_params &bp, float dgv, float dbv, float *buf, int *cnt,
                                           int half, int *lastp, uint32_t bar_id, int lt, int64_t batch, int64_t t0,
                                           int nvalid, int hv)
{
    const fqla_fwd_params &p = bp.f;
    if (lt < 64) {
        buf[(2 * half) * 64 + lt] = dgv;
        buf[(2 * half + 1) * 64 + lt] = dbv;
    }
    if (!arrived_last(cnt, 2, lastp, bar_id, lt)) return;
    if (lt < 64) {
        const float g = half == 0 ? dgv + buf[2 * 64 + lt] : buf[lt] + dgv;
        float b = half == 0 ? dbv + buf[3 * 64 + lt] : buf[64 + lt] + dbv;
        if (lt < nvalid) {
            const int64_t tt = t0 + lt;
            if (p.beta_sigmoid) {
                const float x = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
                b *= (p.neg_eig ? 2.f : 1.f) * sigmoid_f(x) * sigmoid_f(-x);
            }
            bp.dg[batch * bp.dg_sb + tt * bp.dg_st + (int64_t)hv * bp.dg_sh] = g;
            bp.dbeta[batch * bp.db_sb + tt * bp.db_st + (int64_t)hv * bp.db_sh] = b;
        }
    }
    if (lt == 0) *cnt = 0;
}

template <int NH, bool GRAD>
__global__ void __launch_bounds__(THREADS, 1) bwd_fused_rev_kernel(const fqla_bwd_params bp, int flags, float *scratch)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = smem_raw + ((1024u - (fqla_smem_u32(smem_raw) & 1023u)) & 1023u);
    using L = fr_layout<NH, GRAD>;
    using R = fr_regs<NH, GRAD>;
    const fqla_fwd_params &p = bp.f;
    const uint32_t s0 = fqla_smem_u32(sm);
    if constexpr (L::slack == 0)
        if (fqla_smem_u32(smem_raw) & 1023u) __trap(); /* the swizzle's alignment (fr_layout::slack) */
    fr_rows *rows = reinterpret_cast<fr_rows *>(sm + L::rows);
    fr_grow &grow = *reinterpret_cast<fr_grow *>(sm + L::grow);
    uint64_t *chunk_mb = reinterpret_cast<uint64_t *>(sm + L::mbar);
    int *last_word = reinterpret_cast<int *>(sm + L::last); /* [0], [1]: dq, dk; [2]: dg / dbeta */
    const int tid = threadIdx.x, wg = tid >> 7, lt = tid & 127;
    const int row0 = 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2); /* the thread's first accumulator row */
    /* GRAD: x = (span row, part) with the 2 x group parts of a q/k head (its
     * value heads' halves, part = hv % group + group x half) next to each
     * other, y = the q/k head; else x = span row, y = value head, z = half */
    constexpr bool adjacent = GRAD;
    const int parts = 2 * p.group, part = adjacent ? (int)(blockIdx.x % parts) : 0;
    const int hv = adjacent ? (int)blockIdx.y * p.group + part % p.group : (int)blockIdx.y, hk = hv / p.group;
    const int half = adjacent ? part / p.group : (NH == 2 ? 0 : (int)blockIdx.z);
    const int vb = 64 * half; /* the CTA's first value column */
    const int64_t span_row = adjacent ? (int64_t)(blockIdx.x / parts) : (int64_t)blockIdx.x;
    int64_t n, batch, start, len, slot0;
    bool last;
    if (!fqla_fwd_span(p, span_row, n, batch, start, len, slot0, last)) return;
    (void)last;
    int64_t seq_batch, seq_start, seq_len, seq_slot0;
    fqla_fwd_seq(p, n, seq_batch, seq_start, seq_len, seq_slot0);
    const bool first = start == seq_start; /* the span starts its sequence: dh0 is its gradient */
    const int chunks = (int)((len + C - 1) / C);
    auto chunk_at = [&](int it) { return chunks - 1 - it; };
    auto nvalid_of = [&](int c) { return (int)(len - (int64_t)c * C < C ? len - (int64_t)c * C : C); };
    auto stage = [&](int s) { return sm + L::ring + s * L::STAGE; };
    const fqla_wg_tile Tt{s0 + L::tp, s0 + L::tp + TILE, C}, Pt{s0 + L::tp + 2 * TILE, s0 + L::tp + 3 * TILE, C};
    const fqla_wg_tile DS{s0 + L::ds, s0 + L::ds + L::DSP, 64 * NH}; /* dS'^T: value rows, key columns */
    const fqla_wg_tile DU{s0 + L::du, s0 + L::du + L::DUP, C};        /* dU, then Z: token rows, value columns */

    /* warpgroup 1's copies of chunk c into stage s: k, q, dO and the rows */
    auto issue_inputs = [&](int c, int s) {
        const int64_t t0 = start + (int64_t)c * C;
        const int nv = nvalid_of(c);
        const size_t tile = (size_t)(slot0 + c) * p.HV + hv;
        unsigned char *st = stage(s);
        copy_rows<128>(st, (const uint16_t *)p.k + batch * p.k_sb + t0 * p.k_st + (int64_t)hk * p.k_sh, p.k_st, nv, lt);
        copy_rows<128>(st + PLANE, (const uint16_t *)p.q + batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh, p.q_st,
                     nv, lt);
        copy_rows<64 * NH>(st + 2 * PLANE,
                           (const uint16_t *)bp.d_o + batch * bp.do_sb + t0 * bp.do_st + (int64_t)hv * bp.do_sh + vb,
                           bp.do_st, nv, lt);
        if (lt < C / 4) {
            fqla_cp_async16(&rows[s].gam[4 * lt], p.gam + tile * C + 4 * lt, 16);
            fqla_cp_async16(&rows[s].bet[4 * lt], bp.bet + tile * C + 4 * lt, 16);
        }
        if constexpr (GRAD) { /* S's bf16 plane as the state chain stored it, on the chunks that have one
                               * (bwd_state_bf16: the gradient work's; zeros elsewhere, never read) */
            const unsigned char *src =
                bp.S && bwd_state_bf16(c, nv, seq_len) ? bwd_state_plane<KD>(bp.S, tile, p.V, vb) : nullptr;
#pragma unroll
            for (int n = 0; n < L::SP / 16 / 128; n++)
                fqla_cp_async16(st + 2 * PLANE + L::DOP + 16 * (lt + 128 * n), src ? src + 16 * (lt + 128 * n) : st,
                                src ? 16 : 0);
        }
    };
    auto tile_of = [&](int c) { return (size_t)(slot0 + c) * p.HV + hv; };

    if (chunks > 0) {
        if (wg == 1) {
            issue_inputs(chunk_at(0), 0);
            copy_tile(sm + L::tp, bp.Tt + tile_of(chunk_at(0)) * C * C, lt);
        } else if (wg == 2) {
            copy_tile(sm + L::tp + 2 * TILE, bp.Pt + tile_of(chunk_at(0)) * C * C, lt);
        }
        fqla_cp_async_commit();
    }
    if (tid == 0) {
        fqla_mbar_init(chunk_mb, THREADS);
        fqla_mbar_init_fence();
    }
    __syncthreads();

    /* each role's register budget set at its branch's start (ptxas sizes the
     * code after a branch join by the smaller) */
    /* value half h of a [*][128] plane pair (its 64-column block h) */
    auto half_cols = [](const fqla_wg_tile &t, int h) {
        const uint32_t o = (uint32_t)(h * t.rows * 128);
        return fqla_wg_tile{t.hi + o, t.lo ? t.lo + o : 0u, t.rows};
    };
    /* value half h of the dS'^T planes (its 64 rows) */
    auto half_rows = [&](int h) { return fqla_wg_tile{DS.hi + h * 64 * 128, DS.lo + h * 64 * 128, 64 * NH}; };
    /* the gradient work's planes (GRAD): Y, U (then M), dT~ (then M1), dQ~ */
    const fqla_wg_tile Yp{s0 + L::yp, 0u, C}, Up{s0 + L::up, 0u, C}, Tq{s0 + L::tq, 0u, C}, Qp{s0 + L::qt, 0u, C};
    const fqla_wg_tile Th{Tt.hi, 0u, C}; /* T~'s hi plane alone */
    /* scratch (fqla_dev_bwd_launch_fused_rev): [slots][H][dq, dk][parts][64][128]
     * fp32, [slots][H][2] counters, [slots][HV][2][2][64] fp32, [slots][HV] counters */
    int *red_flag = reinterpret_cast<int *>(scratch + (size_t)p.slots * p.H * 2 * parts * C * KD);
    auto red_at = [&](int c, int which, float *&buf, int *&flag) {
        const size_t i = ((size_t)(slot0 + c) * p.H + hk) * 2 + which;
        buf = scratch + i * parts * C * KD;
        flag = red_flag + i;
    };
    /* ---- the gradient work (GRAD, mode 5): every gradient of the
     * chunks whose state entering them the state chain stored as its bf16
     * plane (bwd_state_bf16: past a span's first chunk, full, in a sequence
     * longer than FQLA_BWD_SHORT_CHUNKS chunks), with the lean products of
     * bwd_grads.cu; the other chunks' dS goes to the workspace for the
     * gradient kernel, which skips the chunks done here (bp.fused_grads).
     * dq / dk: the parts of the q/k head's CTAs summed by the last to arrive
     * (sum_parts); dg / dbeta: this half's rows summed with the other
     * half's the same way (sum_halves). ---- */
    float *dg_buf = reinterpret_cast<float *>(red_flag + (size_t)p.slots * p.H * 2); /* [slots][HV][2][2][64] */
    int *dg_cnt = reinterpret_cast<int *>(dg_buf + (size_t)p.slots * p.HV * 4 * C);   /* [slots][HV] */
    auto gw_of = [&](int c) { return bwd_state_bf16(c, nvalid_of(c), seq_len); };
    /* warpgroup 1: X, Y, U; dY, dT~, dv, the x . dy and KS . dy row terms; Z;
     * the tail's M1, K K^T, dL, M, R's beta dL K K^T part and db's tail term;
     * dQ = scale diag(e) dO S^T + dQ~ K and de's q term */
    auto real_u_side = [&] {
        for (int it = 0; it < chunks; it++) {
            const int s = it & 1, c = chunk_at(it);
            unsigned char *st = stage(s);
            chunk_start(chunk_mb, it);
            if (it + 1 < chunks) issue_inputs(chunk_at(it + 1), s ^ 1);
            fqla_cp_async_commit();
            const fr_rows &r = rows[s];
            const fqla_wg_tile Kt{fqla_smem_u32(st), 0u, C}, Qt{fqla_smem_u32(st + PLANE), 0u, C};
            const fqla_wg_tile DO{fqla_smem_u32(st + 2 * PLANE), 0u, C};
            const fqla_wg_tile Sp{fqla_smem_u32(st + 2 * PLANE + L::DOP), 0u, KD};
            const int64_t t0 = start + (int64_t)c * C;
            const int nv = nvalid_of(c);
            const bool gw = gw_of(c);
            const float e0 = __expf(r.gam[row0]), e1 = __expf(r.gam[row0 + 8]);
            const float b0 = r.bet[row0], b1 = r.bet[row0 + 8];
            float ks[32];
            uint32_t vr[16];
            if (gw) {
                const uint16_t *vsrc =
                    (const uint16_t *)p.v + batch * p.v_sb + t0 * p.v_st + (int64_t)hv * p.v_sh + vb;
#pragma unroll
                for (int a = 0; a < 32; a += 2)
                    vr[a / 2] = *reinterpret_cast<const uint32_t *>(vsrc + (int64_t)(row0 + row8_of(a)) * p.v_st +
                                                                    col_of(a));
                fqla_wg_run(ks, [&] { fqla_wg_split<64, 0, 1, false, false>(ks, Kt, Sp, 0, KD, false); });
                float y[32];
#pragma unroll
                for (int a = 0; a < 32; a += 2) {
                    const float2 v2 = fqla_wg_unbf2(vr[a / 2]);
                    const bool hi = row8_of(a);
                    y[a] = (hi ? b1 : b0) * (v2.x - (hi ? e1 : e0) * ks[a]);
                    y[a + 1] = (hi ? b1 : b0) * (v2.y - (hi ? e1 : e0) * ks[a + 1]);
                }
                fqla_wg_store<64>(Yp, y, 0);
                fqla_fence_async_smem();
                bar_sync(fr_bar::side_local, 128, 0);
                fqla_wg_run(y, [&] { fqla_wg_split<64, 0, 1, false, false>(y, Th, Yp, 0, C, false); });
                fqla_wg_store<64>(Up, y, 0);
                fqla_fence_async_smem();
                bar_arrive(gp_bar::u_ready, 256);
            }
            /* dY = T~^T dU (split); dT~ = dU Y^T */
            bar_sync(fr_bar::du_ready, 256, 0);
            float dy[32], dt[32];
            fqla_wg_run(dy, [&] { fqla_wg_split<64, 1, 1, true, true>(dy, Tt, DU, 0, C, false); });
            if (gw) {
                const fqla_wg_tile DUhi{DU.hi, 0u, C};
                fqla_wg_run(dt, [&] { fqla_wg_split<64, 0, 0, false, false>(dt, DUhi, Yp, 0, 64, false); });
            }
            bar_sync(fr_bar::side_local, 128, 0); /* every warp's products read T~, dU, Y */
            float de0 = 0.f, de1 = 0.f, db0 = 0.f, db1 = 0.f;
            if (gw) {
                /* dv = diag(beta) dY; db_i = x_i . dy_i; de_i = -beta_i (K S)_i . dy_i */
                uint16_t *dvp = (uint16_t *)bp.dv + batch * bp.dv_sb + t0 * bp.dv_st + (int64_t)hv * bp.dv_sh + vb;
#pragma unroll
                for (int a = 0; a < 32; a += 2) {
                    const bool hi = row8_of(a);
                    const int i = row0 + row8_of(a);
                    const float bb = hi ? b1 : b0, ee = hi ? e1 : e0;
                    const float2 v2 = fqla_wg_unbf2(vr[a / 2]);
                    const float x0 = v2.x - ee * ks[a], x1 = v2.y - ee * ks[a + 1];
                    (hi ? db1 : db0) += x0 * dy[a] + x1 * dy[a + 1];
                    (hi ? de1 : de0) += ks[a] * dy[a] + ks[a + 1] * dy[a + 1];
                    *reinterpret_cast<uint32_t *>(dvp + (int64_t)i * bp.dv_st + col_of(a)) =
                        fqla_wg_bf2(bb * dy[a], bb * dy[a + 1]);
                }
                de0 = -b0 * quad_sum(de0);
                de1 = -b1 * quad_sum(de1);
                db0 = quad_sum(db0);
                db1 = quad_sum(db1);
            }
            /* Z = -diag(e beta) dY over dU's planes */
#pragma unroll
            for (int a = 0; a < 32; a++) dy[a] *= -(row8_of(a) ? e1 * b1 : e0 * b0);
            fqla_wg_store<64>(DU, dy, 0);
            fqla_fence_async_smem();
            bar_arrive(fr_bar::z_ready, 384, 0);
            if (!gw) { /* T~ read for the last time in this chunk: its refill */
                if (it + 1 < chunks) copy_tile(sm + L::tp, bp.Tt + tile_of(chunk_at(it + 1)) * C * C, lt);
                fqla_cp_async_commit();
                continue;
            }
            /* the tail: M1 = T~^T (strict lower dT~) beside K K^T; dL = -M1 T~^T */
#pragma unroll
            for (int a = 0; a < 32; a++)
                if (col_of(a) >= row0 + row8_of(a)) dt[a] = 0.f;
            fqla_wg_store<64>(Tq, dt, 0);
            fqla_fence_async_smem();
            bar_sync(fr_bar::side_local, 128, 0);
            float kk[32];
            fqla_wg_issue(dt, [&] { fqla_wg_split<64, 1, 1, false, false>(dt, Th, Tq, 0, C, false); });
            fqla_wg_issue(kk, [&] { fqla_wg_split<64, 0, 0, false, false>(kk, Kt, Kt, 0, KD, false); });
            fqla_wg_retire(dt);
            fqla_reg_fence(kk);
            bar_sync(fr_bar::side_local, 128, 0);
            fqla_wg_store<64>(Tq, dt, 0);
            fqla_fence_async_smem();
            bar_sync(fr_bar::side_local, 128, 0);
            float dl[32];
            fqla_wg_run(dl, [&] { fqla_wg_split<64, 0, 0, false, false>(dl, Tq, Th, 0, C, false); });
            bar_sync(fr_bar::side_local, 128, 0); /* T~ and Tq read for the last time */
            if (it + 1 < chunks) copy_tile(sm + L::tp, bp.Tt + tile_of(chunk_at(it + 1)) * C * C, lt);
            fqla_cp_async_commit();
            /* gdl = -Gamma . dL (strict lower); db_i += sum_j gdl kk; M = diag(beta) gdl;
             * R_ij's part beta_i gdl kk_ij (in kk) */
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int i = row0 + 8 * hh;
                const float gi = r.gam[i], bi = r.bet[i];
                float sdb = 0.f;
#pragma unroll
                for (int jb = 0; jb < 8; jb++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int a = 4 * jb + 2 * hh + e, jj = col_of(a);
                        const float gdl = jj < i ? -dl[a] * __expf(gi - r.gam[jj]) : 0.f;
                        sdb += gdl * kk[a];
                        kk[a] = bi * gdl * kk[a];
                        dl[a] = bi * gdl;
                    }
                sdb = quad_sum(sdb);
                (hh ? db1 : db0) += sdb;
            }
            bar_sync(gp_bar::u_free, 256); /* warpgroup 2 has read U */
            fqla_wg_store<64>(Up, dl, 0);  /* M over U */
            fqla_fence_async_smem();
            bar_arrive(gp_bar::m_ready, 256);
            lower_sums(kk, grow.dgr[0], reinterpret_cast<float *>(sm + L::tq), fqla_bar_id(fr_bar::side_local, 0), lt,
                       row0);
            /* dQ = scale diag(e) dO S^T + dQ~ K; de_i += scale q_i . (dO S^T)_i */
            float dq[64];
            fqla_wg_run(dq, [&] { fqla_wg_split<128, 0, 0, false, false>(dq, DO, Sp, 0, 64, false); });
            float sq0 = 0.f, sq1 = 0.f;
#pragma unroll
            for (int c0 = 0; c0 < KD; c0 += 64) {
                float qh[32];
                fqla_wg_load<64>(Qt, qh, c0);
#pragma unroll
                for (int a = 0; a < 32; a++) (row8_of(a) ? sq1 : sq0) += qh[a] * dq[c0 / 2 + a];
            }
            de0 += p.scale * quad_sum(sq0);
            de1 += p.scale * quad_sum(sq1);
            if ((lt & 3) == 0) {
                grow.de[row0] = de0;
                grow.de[row0 + 8] = de1;
                grow.db[row0] = db0;
                grow.db[row0 + 8] = db1;
            }
            bar_arrive(gp_bar::rows_ready, 256); /* warpgroup 2 forms dg */
#pragma unroll
            for (int a = 0; a < 64; a++) dq[a] *= p.scale * (row8_of(a) ? e1 : e0);
            bar_sync(gp_bar::qt_ready, 256);
            fqla_wg_run(dq, [&] { fqla_wg_split<128, 0, 1, false, false>(dq, Qp, Kt, 0, C, true); });
            float *buf;
            int *flag;
            red_at(c, 0, buf, flag);
            sum_parts(dq, buf, flag, part, parts,
                         (uint16_t *)bp.dq + batch * bp.dq_sb + t0 * bp.dq_st + (int64_t)hk * bp.dq_sh, bp.dq_st, nv,
                         row0, lt, fqla_bar_id(fr_bar::side_local, 0), last_word, flags & fr_no_sum);
        }
    };
    /* warpgroup 2: dU (P~^T dO, then K dS'); U (its own fp32 copy) for df; dP~
     * = dO U^T, dQ~ and R's dP~ P~ part; dK = diag(f) U dS'^T + Z S^T + dQ~^T Q
     * + M K + M^T K; then the chunk's dg and dbeta rows */
    auto real_du_side = [&] {
        for (int it = 0; it < chunks; it++) {
            const int s = it & 1, c = chunk_at(it);
            unsigned char *st = stage(s);
            chunk_start(chunk_mb, it);
            const fr_rows &r = rows[s];
            const float gC = r.gam[C - 1];
            const float f0 = __expf(gC - r.gam[row0]), f1 = __expf(gC - r.gam[row0 + 8]);
            const fqla_wg_tile Kt{fqla_smem_u32(st), 0u, C}, Qt{fqla_smem_u32(st + PLANE), 0u, C};
            const fqla_wg_tile DO{fqla_smem_u32(st + 2 * PLANE), 0u, C};
            const fqla_wg_tile Sp{fqla_smem_u32(st + 2 * PLANE + L::DOP), 0u, KD};
            const int64_t t0 = start + (int64_t)c * C;
            const int nv = nvalid_of(c);
            const bool gw = gw_of(c);
            float du[32], kds[32];
            fqla_wg_run(du, [&] { fqla_wg_split<64, 1, 1, true, false>(du, Pt, DO, 0, C, false); });
            bar_sync(fr_bar::ds_ready, 256, 0);
            fqla_wg_run(kds, [&] { fqla_wg_split<64, 0, 0, false, true>(kds, Kt, DS, 0, KD, false); });
#pragma unroll
            for (int a = 0; a < 32; a++) du[a] += (row8_of(a) ? f1 : f0) * kds[a];
            fqla_wg_store<64>(DU, du, 0);
            fqla_fence_async_smem();
            bar_arrive(fr_bar::du_ready, 256, 0);
            /* P~'s refill once every warp has read it: here, or with the
             * gradient work after R's dP~ P~ part (P~'s values read then) */
            auto refill_pt = [&] {
                bar_sync(fr_bar::side_local, 128, 1);
                if (it + 1 < chunks) copy_tile(sm + L::tp + 2 * TILE, bp.Pt + tile_of(chunk_at(it + 1)) * C * C, lt);
                fqla_cp_async_commit();
            };
            if (!gw) refill_pt();
            float dk[64], pg[32], d0 = 0.f, d1 = 0.f;
            if (gw) {
                /* df_i = (K dS')_i . u_i, with U formed again here in fp32 (warpgroup 1's plane is bf16) */
                bar_sync(gp_bar::u_ready, 256);
                fqla_wg_run(du, [&] { fqla_wg_split<64, 0, 1, false, false>(du, Th, Yp, 0, C, false); });
#pragma unroll
                for (int a = 0; a < 32; a++) (row8_of(a) ? d1 : d0) += kds[a] * du[a];
                d0 = quad_sum(d0);
                d1 = quad_sum(d1);
                /* dP~ = dO U^T; R's part dP~ P~ (strict lower, into pg; P~ hi + lo);
                 * dQ~ = scale Gamma . dP~ (lower) */
                float dp[32];
                fqla_wg_run(dp, [&] { fqla_wg_split<64, 0, 0, false, false>(dp, DO, Up, 0, 64, false); });
                fqla_wg_load<64>(Pt, pg, 0);
                refill_pt();
#pragma unroll
                for (int a = 0; a < 32; a++) {
                    const int i = row0 + row8_of(a), j = col_of(a);
                    pg[a] = j < i ? dp[a] * pg[a] : 0.f;
                    dp[a] *= j <= i ? p.scale * __expf(r.gam[i] - r.gam[j]) : 0.f;
                }
                fqla_wg_store<64>(Qp, dp, 0);
                fqla_fence_async_smem();
                bar_arrive(gp_bar::qt_ready, 256);
            }
            bar_sync(fr_bar::z_ready, 384, 0);
            if (!gw) continue;
            /* R's sums before dK's accumulator is live (with both, ptxas serialised
             * the kernel's wgmma); Y read by every warp (z_ready comes after
             * warpgroup 1's last read): Y's plane as the scratch */
            lower_sums(pg, grow.dgr[1], reinterpret_cast<float *>(sm + L::yp), fqla_bar_id(fr_bar::side_local, 1), lt,
                       row0);
            /* dK = diag(f) U dS'^T + ... */
            const fqla_wg_tile DShi{DS.hi, 0u, 64};
            fqla_wg_run(dk, [&] { fqla_wg_split<128, 0, 1, false, false>(dk, Up, DShi, 0, 64, false); });
            bar_arrive(gp_bar::u_free, 256); /* U read: warpgroup 1 may put M there */
#pragma unroll
            for (int a = 0; a < 64; a++) dk[a] *= row8_of(a) ? f1 : f0;
            const fqla_wg_tile Zhi{DU.hi, 0u, C};
            fqla_wg_run(dk, [&] { fqla_wg_split<128, 0, 0, false, false>(dk, Zhi, Sp, 0, 64, true); });
            bar_sync(gp_bar::m_ready, 256);
            fqla_wg_run(dk, [&] {
                fqla_wg_split<128, 1, 1, false, false>(dk, Qp, Qt, 0, C, true);
                fqla_wg_split<128, 0, 1, false, false>(dk, Up, Kt, 0, C, true);
                fqla_wg_split<128, 1, 1, false, false>(dk, Up, Kt, 0, C, true);
            });
            if ((lt & 3) == 0) {
                grow.df[row0] = d0;
                grow.df[row0 + 8] = d1;
            }
            float *buf;
            int *flag;
            red_at(c, 1, buf, flag);
            sum_parts(dk, buf, flag, part, parts,
                         (uint16_t *)bp.dk + batch * bp.dk_sb + t0 * bp.dk_st + (int64_t)hk * bp.dk_sh, bp.dk_st, nv,
                         row0, lt, fqla_bar_id(fr_bar::side_local, 1), last_word + 1, flags & fr_no_sum);
            /* dg_t = sum_{i >= t} de_i e_i + sum_{j < t} df_j f_j + <S, dS'> e_C + R's sums */
            bar_sync(gp_bar::rows_ready, 256);
            float dgv = 0.f, dbv = 0.f;
            if (lt < 64) {
                const int t = lt;
                float sde, sdf;
                gate_scans(grow.de, grow.df, r.gam, gC, t, sde, sdf);
                const float deC = ((grow.deC[0] + grow.deC[1]) + grow.deC[2]) + grow.deC[3];
                dgv = (((sde + sdf) + deC * __expf(gC)) + grow.dgr[0][t]) + grow.dgr[1][t];
                dbv = grow.db[t];
            }
            const size_t hvt = (size_t)(slot0 + c) * p.HV + hv;
            sum_halves(bp, dgv, dbv, dg_buf + hvt * 4 * C, dg_cnt + hvt, half, last_word + 2,
                       fqla_bar_id(fr_bar::side_local, 1), lt, batch, t0, nv, hv);
        }
    };
    (void)real_u_side;
    (void)real_du_side;
    if (wg == 0) {
        set_regs<R::STATE, R::ENTRY>();
        /* dS^T, rows 64 h + row0 (+8) of the CTA's value columns, key columns col_of(a) */
        float acc[NH][64];
        /* with CP (the main pass over a segment) the scan stored the gradient
         * leaving the segment in its last chunk's dS tile; else d_final_state */
        const float *dS_end = p.cp_mode && chunks > 0 ? bp.dS + tile_of(chunks - 1) * KD * p.V : nullptr;
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int a = 0; a < 64; a++) {
                const int k = col_of(a), v = vb + 64 * h + row0 + row8_of(a);
                acc[h][a] = dS_end ? dS_end[(int64_t)k * p.V + v] : bwd_start_state<true>(bp, n, hv, k, v);
            }
        for (int it = 0; it < chunks; it++) {
            const int c = chunk_at(it), s = it & 1;
            unsigned char *st = stage(s);
            chunk_start(chunk_mb, it);
            /* dS (the gradient leaving chunk c) as its planes for warpgroup 2, a
             * value half at a time so that its products on half 0 start first */
#pragma unroll
            for (int h = 0; h < NH; h++) {
                fqla_wg_store<128>(half_rows(h), acc[h], 0);
                fqla_fence_async_smem();
                bar_arrive(fr_bar::ds_ready, 256, (uint32_t)h);
            }
            /* GRAD: the chunk's <S, dS'> share of this half (its gradient work
             * here), or its dS for the gradient kernel (below) */
            const bool gw_c = GRAD && gw_of(c);
            if (gw_c) {
                /* S (k, v) at dS^T's accumulator places: k = 8 (a / 4) + 2 t4 + (a & 1), v = row0
                 * (+ 8); in the plane's swizzle the four (a & 1, v) bases step by 1024 bytes in a / 4 */
                const unsigned char *sp = st + 2 * PLANE + L::DOP;
                const int t4 = lt & 3;
                float d = 0.f;
#pragma unroll
                for (int q = 0; q < 4; q++) { /* q = (a & 1) + 2 (v is row0 + 8) */
                    const int k0 = 2 * t4 + (q & 1), v = row0 + 8 * (q >> 1);
                    const unsigned char *b = sp + k0 * 128 + ((((v & 63) >> 3) ^ (k0 & 7)) << 4) + ((v & 7) << 1);
#pragma unroll
                    for (int j = 0; j < 16; j++) {
                        const int a = 4 * j + 2 * (q >> 1) + (q & 1);
                        d += acc[0][a] * __uint_as_float((uint32_t)(*reinterpret_cast<const uint16_t *>(b + 1024 * j)) << 16);
                    }
                }
#pragma unroll
                for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                if ((lt & 31) == 0) grow.deC[lt >> 5] = d;
            }
            /* ... and to the workspace, [k][v], while the others run (left out
             * to time the pass without it; with the gradient work, only the
             * chunks it leaves to the gradient kernel) */
            if ((!GRAD && (flags & fr_store_ds)) || (GRAD && !gw_c)) {
                float *dst = bp.dS + tile_of(c) * KD * p.V + vb;
#pragma unroll
                for (int h = 0; h < NH; h++)
#pragma unroll
                    for (int a = 0; a < 64; a++)
                        dst[(int64_t)col_of(a) * p.V + 64 * h + row0 + row8_of(a)] = acc[h][a];
            }
            const fr_rows &r = rows[s];
            const float eC = __expf(r.gam[C - 1]);
#pragma unroll
            for (int h = 0; h < NH; h++)
#pragma unroll
                for (int a = 0; a < 64; a++) acc[h][a] *= eC;
            const fqla_wg_tile DO{fqla_smem_u32(st + 2 * PLANE), 0u, C};
            const fqla_wg_tile Kt{fqla_smem_u32(st), 0u, C}, Qt{fqla_smem_u32(st + PLANE), 0u, C};
            /* dS^T = e_C dS^T + (scale diag(e) dO)^T Q + Z^T K, Z = -diag(e beta) dY,
             * a value half at a time as its Z arrives; each half's A fragments
             * formed before its wait (both halves' at once spill) */
            uint32_t eh[4][4], el[4][4];
#pragma unroll
            for (int h = 0; h < NH; h++) {
                scaled_do_frags(DO, r, p.scale, 64 * h, eh, el);
                bar_sync(fr_bar::z_ready, GRAD ? 384 : 256, (uint32_t)h);
                update_half(acc[h], eh, el, Qt, half_cols(DU, h), Kt);
            }
        }
        /* the gradient entering the sequence */
        if (bp.dh0 && first)
#pragma unroll
            for (int h = 0; h < NH; h++)
#pragma unroll
                for (int a = 0; a < 64; a++) {
                    const int k = col_of(a), v = vb + 64 * h + row0 + row8_of(a);
                    bp.dh0[fqla_fwd_state_off(n, hv, k, v, bp.dh0_sn, bp.dh0_sh, bp.dh0_s2, p.v_first)] = acc[h][a];
                }
    } else if (wg == 1) {
        set_regs<R::SIDE, R::ENTRY>();
        if constexpr (GRAD) {
            real_u_side();
        } else {
            for (int it = 0; it < chunks; it++) {
                const int s = it & 1;
                chunk_start(chunk_mb, it);
                if (it + 1 < chunks) issue_inputs(chunk_at(it + 1), s ^ 1);
                fqla_cp_async_commit();
                const fr_rows &r = rows[s];
                /* Z's row factors: -e_t beta_t for the thread's two rows */
                const float z0 = -__expf(r.gam[row0]) * r.bet[row0], z1 = -__expf(r.gam[row0 + 8]) * r.bet[row0 + 8];
#pragma unroll 1
                for (int h = 0; h < NH; h++) {
                    const fqla_wg_tile DUh = half_cols(DU, h);
                    bar_sync(fr_bar::du_ready, 256, (uint32_t)h);
                    /* dY = T~^T dU on this value half */
                    float dy[32];
                    fqla_wg_run(dy, [&] { fqla_wg_split<64, 1, 1, true, true>(dy, Tt, DUh, 0, C, false); });
                    /* every warp's part of the product has read T~ and dU's half */
                    bar_sync(fr_bar::side_local, 128, 0);
#pragma unroll
                    for (int a = 0; a < 32; a++) dy[a] *= row8_of(a) ? z1 : z0;
                    fqla_wg_store<64>(DUh, dy, 0);
                    fqla_fence_async_smem();
                    bar_arrive(fr_bar::z_ready, 256, (uint32_t)h);
                }
                if (it + 1 < chunks) copy_tile(sm + L::tp, bp.Tt + tile_of(chunk_at(it + 1)) * C * C, lt);
                fqla_cp_async_commit();
            }
        }
    } else {
        set_regs<R::SIDE, R::ENTRY>();
        if constexpr (GRAD) {
            real_du_side();
        } else {
            for (int it = 0; it < chunks; it++) {
                const int s = it & 1;
                unsigned char *st = stage(s);
                chunk_start(chunk_mb, it);
                const fr_rows &r = rows[s];
                const float gC = r.gam[C - 1];
                const float f0 = __expf(gC - r.gam[row0]), f1 = __expf(gC - r.gam[row0 + 8]);
                const fqla_wg_tile Kt{fqla_smem_u32(st), 0u, C}, DO{fqla_smem_u32(st + 2 * PLANE), 0u, C};
#pragma unroll 1
                for (int h = 0; h < NH; h++) {
                    bar_sync(fr_bar::ds_ready, 256, (uint32_t)h);
                    /* K dS' on this value half: token rows, its 64 value columns */
                    float du[32];
                    const fqla_wg_tile DSh = half_rows(h);
                    fqla_wg_run(du, [&] { fqla_wg_split<64, 0, 0, false, true>(du, Kt, DSh, 0, KD, false); });
#pragma unroll
                    for (int a = 0; a < 32; a++) du[a] *= row8_of(a) ? f1 : f0;
                    /* + P~^T dO */
                    const fqla_wg_tile DOh = half_cols(DO, h);
                    fqla_wg_run(du, [&] { fqla_wg_split<64, 1, 1, true, false>(du, Pt, DOh, 0, C, true); });
                    fqla_wg_store<64>(half_cols(DU, h), du, 0);
                    fqla_fence_async_smem();
                    bar_arrive(fr_bar::du_ready, 256, (uint32_t)h);
                }
                /* every warp's part of the products has read P~ */
                bar_sync(fr_bar::side_local, 128, 1);
                if (it + 1 < chunks) copy_tile(sm + L::tp + 2 * TILE, bp.Pt + tile_of(chunk_at(it + 1)) * C * C, lt);
                fqla_cp_async_commit();
            }
        }
    }
}

template <int NH, bool GRAD>
cudaError_t launch(const fqla_bwd_params &p, int flags, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    using L = fr_layout<NH, GRAD>;
    cudaError_t e = fqla_smem_limit(cache, bwd_fused_rev_kernel<NH, GRAD>, L::bytes);
    if (e != cudaSuccess) return e;
    const unsigned rows = (unsigned)fqla_bwd_chain_rows(p);
    /* GRAD: the parts' slots and counters (sum_parts, sum_halves) in a
     * developer-build scratch allocation kept across calls (made by the
     * first, uncaptured call; the counters zeroed every call) */
    static float *scratch = nullptr;
    static size_t scratch_bytes = 0;
    const size_t nbuf = (size_t)p.f.slots * p.f.H * 2 * 2 * p.f.group * C * KD;
    const size_t nflag = (size_t)p.f.slots * p.f.H * 2, ndg = (size_t)p.f.slots * p.f.HV; /* dg / dbeta */
    const size_t need = nbuf * sizeof(float) + nflag * sizeof(int) + ndg * (4 * C * sizeof(float) + sizeof(int));
    if (GRAD) {
        if (need > scratch_bytes) {
            if (scratch) cudaFree(scratch);
            e = cudaMalloc((void **)&scratch, need);
            if (e != cudaSuccess) return e;
            scratch_bytes = need;
        }
        e = cudaMemsetAsync(scratch + nbuf, 0, nflag * sizeof(int), stream);
        if (e == cudaSuccess)
            e = cudaMemsetAsync(reinterpret_cast<int *>(scratch + nbuf + nflag + ndg * 4 * C), 0, ndg * sizeof(int),
                                stream);
        if (e != cudaSuccess) return e;
    }
    const dim3 grid =
        GRAD ? dim3(rows * 2 * (unsigned)p.f.group, (unsigned)p.f.H, 1) : dim3(rows, (unsigned)p.f.HV, 2 / NH);
    return fqla_launch(bwd_fused_rev_kernel<NH, GRAD>, grid, dim3(THREADS), L::bytes, stream, 0, p, flags,
                       scratch);
}

} // namespace

bool fqla_dev_bwd_fused_rev_covers(const fqla_bwd_params &p, int io_bf16, int mode)
{
    /* 5: the in-kernel gate's dA_log / ddt_bias parts are the gradient kernel's (not here);
     * dh0 alone (no S) takes the reverse chain */
    if (fqla_dev_bwd_fused_rev_grads(mode) && (p.f.gate_in_kernel || !p.S)) return false;
    return io_bf16 && p.f.K == KD && p.f.V == VD && !p.f.l2norm && !p.chain_done &&
           fqla_bwd_rows16(p, FQLA_BWD_ROWS_Q | FQLA_BWD_ROWS_K | FQLA_BWD_ROWS_DO);
}

cudaError_t fqla_dev_bwd_launch_fused_rev(const fqla_bwd_params &p, int mode, cudaStream_t stream)
{
    /* 1, 2: the whole V a CTA, with and without the dS stores; 3, 4: a value half a CTA; 5: a
     * value half a CTA with the gradient work of the chunks whose states are bf16 planes;
     * 6: 5 with dq / dk unsummed (timing only, wrong dq / dk by design) */
    if (fqla_dev_bwd_fused_rev_grads(mode)) return launch<1, true>(p, mode == 6 ? fr_no_sum : 0, stream);
    const int flags = mode == 1 || mode == 3 ? fr_store_ds : 0;
    return mode >= 3 ? launch<1, false>(p, flags, stream) : launch<2, false>(p, flags, stream);
}
