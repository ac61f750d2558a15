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
 * Products: bf16 tensor cores (mma.sync m16n8k16) on operands kept in
 * shared memory as bf16 hi / lo planes (kernel/split_mma.cuh), read with
 * ldmatrix in whichever orientation a product needs. Every operand that is
 * not an exact bf16 input carries its lo plane (the "split", ~16
 * significant bits, three products): the numerics model
 * (dev/models/bwd_chunked.py, bench/results/bwd-model.md section 6) has
 * a one-token sequence's dbeta and dg fail with X, K dS' or dY in plain
 * bf16, and hold with every product split; P~ in plain bf16 failed a
 * one-token sequence of tests/test_gpu_bwd.c (dbeta 6e-2). The l2norm'd
 * or fp16 q / k and fp16 v / dO are not exact in bf16 and carry lo planes
 * too.
 *
 * Grid (slots, H): one CTA of 512 threads per chunk and q/k head runs the
 * value heads of its GVA group in order, so dq and dk are summed over the
 * group in registers (no atomics, bit-identical reruns). Per value head the
 * value columns go in slices of VS = 64 (the last one may be half full:
 * V is a multiple of 32). Warp w (16 of them) owns rows 16 (w % 4) of
 * every output; of a 64-column output (a slice, or a 64 x 64 tile such as
 * dP~), columns 16 (w / 4); of a K-column output (dQ, dK, dO S^T),
 * columns K/4 (w / 4).
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/split_mma.cuh"

#include <type_traits>

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = 64;        /* value columns per slice */
constexpr int LDT = 64 + 8;   /* bf16 rows of 64 x 64 and 64 x VS tiles */
constexpr int LDS = VS + 8;   /* bf16 rows of the K x VS state slices */
constexpr int LDR = C + 1;    /* fp32 R rows (one thread walks a row) */
constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;

typedef __nv_bfloat16 bf16;

template <int KD> struct grads_smem {
    static constexpr int LDK = KD + 8;
    bf16 kh[C * LDK], kl[C * LDK];             /* k (normalised) */
    bf16 th[C * LDT], tl[C * LDT], ph[C * LDT], pl[C * LDT]; /* T~, P~ of the value head */
    union {
        struct {
            bf16 sh[KD * LDS], sl[KD * LDS], dsh[KD * LDS], dsl[KD * LDS];
        } st;                      /* S, dS' slices (slice loop) */
        struct {
            bf16 qh[C * LDK], ql[C * LDK];
        } q;                       /* q (normalised; after the slices) */
    } a;
    union {
        struct {
            bf16 doh[C * LDT], dol[C * LDT], yh[C * LDT], yl[C * LDT];
            bf16 uh[C * LDT], ul[C * LDT], duh[C * LDT], dul[C * LDT];
        } s;                       /* slice tiles: dO, Y then -e beta dY, U then f U, dU */
        struct {
            bf16 w0h[C * LDT], w0l[C * LDT], w1h[C * LDT], w1l[C * LDT];
            float R[C * LDR];
        } p;                       /* after the slices: dT~ then dQ~; M1 then M; R */
    } b;
    float gam[C], bet[C], e[C], f[C], df[C], db[C], de[C];
    float red[4][4][C];            /* per warp-column partial row sums */
    float part[2][C];              /* per-row dA_log / ddt_bias parts */
    float wsum[WARPS], deC;
};

/* Sums v over the 4 lanes t of a quad (the lanes that hold one row of an
 * mma accumulator tile), in a fixed order. */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

/* red[wn][row] (op)= this warp's row sums of f(row, col, acc value) over
 * its accumulator tile (rows m0 + g, m0 + g + 8). ADD: accumulate across
 * calls (one owner thread per entry), else overwrite. */
template <bool ADD, int NT, typename F>
__device__ __forceinline__ void warp_row_sums(float (&acc)[NT][4], int m0, int n0, float *red_wn, F f)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = m0 + g + 8 * h;
        float s = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int j = n0 + 8 * nt + 2 * t;
            s += f(i, j, acc[nt][2 * h]) + f(i, j + 1, acc[nt][2 * h + 1]);
        }
        s = quad_sum(s);
        if (t == 0) red_wn[i] = ADD ? red_wn[i] + s : s;
    }
}

/* An io-dtype element as float. */
template <typename T> __device__ __forceinline__ float ld_io(const void *base, int64_t off)
{
    return bwd_ld<T>((const T *)base, off);
}

/* Rows of a chunk's q or k (64 x KD, normalised by r where given, zeros
 * past nvalid) into a split tile. */
template <typename T, int KD>
__device__ __forceinline__ void load_rows(const fqla_split_tile &dst, const void *x, int64_t base, int64_t st,
                                          int nvalid, const float *r)
{
    for (int idx = threadIdx.x; idx < C * KD / 2; idx += THREADS) {
        const int i = idx / (KD / 2), j = 2 * (idx % (KD / 2));
        float a = 0.f, b = 0.f;
        if (i < nvalid) {
            const int64_t o = base + (int64_t)i * st + j;
            a = ld_io<T>(x, o);
            b = ld_io<T>(x, o + 1);
            if (r) {
                a *= r[i];
                b *= r[i];
            }
        }
        fqla_split_put2(dst, i, j, a, b);
    }
}

template <typename T, int KD>
__global__ void __launch_bounds__(THREADS, 1) bwd_grads_kernel(const fqla_bwd_params bp)
{
    const fqla_fwd_params &p = bp.f;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    grads_smem<KD> &sm = *reinterpret_cast<grads_smem<KD> *>(smem_raw);
    constexpr int LDK = grads_smem<KD>::LDK;
    constexpr int NTW = KD / 32; /* n-tiles of a warp's K/4 columns */
    constexpr bool IO_BF16 = std::is_same<T, __nv_bfloat16>::value;
    const int64_t slot = blockIdx.x;
    const int hk = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wm = warp & 3, wn = warp >> 2;
    const int m0 = 16 * wm, n0 = 16 * wn, w0 = (KD / 4) * wn;
    const float scale = p.scale;

    int64_t batch, t0;
    int nvalid;
    if (!bwd_slot_chunk(p, slot, batch, t0, nvalid)) {
        if (bp.gate_part)
            for (int h = tid; h < p.group; h += blockDim.x) {
                const size_t tile = (size_t)slot * p.HV + hk * p.group + h;
                bp.gate_part[2 * tile] = bp.gate_part[2 * tile + 1] = 0.f;
            }
        return;
    }
    const size_t rrow = ((size_t)slot * p.H + hk) * C;
    /* q / k rows are exact bf16 only for bf16 inputs without the in-kernel l2norm */
    const bool qk_lo = !IO_BF16 || p.l2norm;
    const fqla_split_tile Kt{sm.kh, qk_lo ? sm.kl : nullptr, LDK};
    const fqla_split_tile Qt{sm.a.q.qh, qk_lo ? sm.a.q.ql : nullptr, LDK};
    const fqla_split_tile Tt{sm.th, sm.tl, LDT}, Pt{sm.ph, sm.pl, LDT};
    const fqla_split_tile St{sm.a.st.sh, sm.a.st.sl, LDS}, dSt{sm.a.st.dsh, sm.a.st.dsl, LDS};
    const fqla_split_tile dOt{sm.b.s.doh, IO_BF16 ? nullptr : sm.b.s.dol, LDT};
    const fqla_split_tile Yt{sm.b.s.yh, sm.b.s.yl, LDT}, Ut{sm.b.s.uh, sm.b.s.ul, LDT};
    const fqla_split_tile dUt{sm.b.s.duh, sm.b.s.dul, LDT};
    const fqla_split_tile W0{sm.b.p.w0h, sm.b.p.w0l, LDT}, W1{sm.b.p.w1h, sm.b.p.w1l, LDT};

    load_rows<T, KD>(Kt, p.k, batch * p.k_sb + t0 * p.k_st + (int64_t)hk * p.k_sh, p.k_st, nvalid,
                     p.l2norm ? p.rk + rrow : nullptr);

    float dQ[NTW][4], dK[NTW][4];
    fqla_acc_zero(dQ);
    fqla_acc_zero(dK);

    for (int h = 0; h < p.group; h++) {
        const int hv = hk * p.group + h;
        const size_t tile = (size_t)slot * p.HV + hv;
        __syncthreads(); /* the previous head's reads are done */
        {
            const float *Tg = bp.Tt + tile * C * C, *Pg = bp.Pt + tile * C * C;
            for (int idx = tid; idx < C * C / 4; idx += THREADS) {
                const int i = idx >> 4, j = 4 * (idx & 15);
                const float4 tv = reinterpret_cast<const float4 *>(Tg)[idx];
                const float4 pv = reinterpret_cast<const float4 *>(Pg)[idx];
                fqla_split_put2(Tt, i, j, tv.x, tv.y);
                fqla_split_put2(Tt, i, j + 2, tv.z, tv.w);
                fqla_split_put2(Pt, i, j, pv.x, pv.y);
                fqla_split_put2(Pt, i, j + 2, pv.z, pv.w);
            }
        }
        if (tid < C) {
            const float gm = p.gam[tile * C + tid];
            sm.gam[tid] = gm;
            sm.bet[tid] = bp.bet[tile * C + tid];
            sm.e[tid] = __expf(gm);
            sm.f[tid] = __expf(p.gam[tile * C + C - 1] - gm);
        }
        for (int idx = tid; idx < 3 * 4 * C; idx += THREADS) (&sm.red[0][0][0])[idx] = 0.f;

        float dP[2][4], dT[2][4];
        fqla_acc_zero(dP);
        fqla_acc_zero(dT);
        float deC = 0.f; /* this thread's share of <S, dS'> */

        for (int v0 = 0; v0 < p.V; v0 += VS) {
            const int vw = p.V - v0 < VS ? p.V - v0 : VS; /* 64, or 32 in a last half slice */
            __syncthreads(); /* the previous slice's reads are done */
            {
                const float *Sg = bp.S + tile * KD * p.V, *dSg = bp.dS + tile * KD * p.V;
                for (int idx = tid; idx < KD * VS / 4; idx += THREADS) {
                    const int r = idx / (VS / 4), c = 4 * (idx % (VS / 4));
                    float4 s = make_float4(0.f, 0.f, 0.f, 0.f), d = s;
                    if (c < vw) {
                        s = *reinterpret_cast<const float4 *>(Sg + (int64_t)r * p.V + v0 + c);
                        d = *reinterpret_cast<const float4 *>(dSg + (int64_t)r * p.V + v0 + c);
                    }
                    deC += s.x * d.x + s.y * d.y + s.z * d.z + s.w * d.w;
                    fqla_split_put2(St, r, c, s.x, s.y);
                    fqla_split_put2(St, r, c + 2, s.z, s.w);
                    fqla_split_put2(dSt, r, c, d.x, d.y);
                    fqla_split_put2(dSt, r, c + 2, d.z, d.w);
                }
                const int64_t ob = batch * bp.do_sb + t0 * bp.do_st + (int64_t)hv * bp.do_sh + v0;
                for (int idx = tid; idx < C * VS / 2; idx += THREADS) {
                    const int i = idx / (VS / 2), c = 2 * (idx % (VS / 2));
                    float a = 0.f, b = 0.f;
                    if (i < nvalid && c < vw) {
                        a = ld_io<T>(bp.d_o, ob + (int64_t)i * bp.do_st + c);
                        b = ld_io<T>(bp.d_o, ob + (int64_t)i * bp.do_st + c + 1);
                    }
                    fqla_split_put2(dOt, i, c, a, b);
                }
            }
            __syncthreads();

            /* K S, K dS';  X = V - diag(e) K S;  Y = diag(beta) X */
            float ks[2][4], kds[2][4], x[2][4];
            fqla_acc_zero(ks);
            fqla_acc_zero(kds);
            fqla_split_mma<false, false>(ks, Kt, St, m0, n0, 0, KD);
            fqla_split_mma<false, false>(kds, Kt, dSt, m0, n0, 0, KD);
            {
                const int64_t vb = batch * p.v_sb + t0 * p.v_st + (int64_t)hv * p.v_sh + v0;
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int i = m0 + g + 8 * hh, j = n0 + 8 * nt + 2 * t4;
                        float va = 0.f, vb2 = 0.f;
                        if (i < nvalid && j < vw) {
                            va = ld_io<T>(p.v, vb + (int64_t)i * p.v_st + j);
                            vb2 = ld_io<T>(p.v, vb + (int64_t)i * p.v_st + j + 1);
                        }
                        x[nt][2 * hh] = va - sm.e[i] * ks[nt][2 * hh];
                        x[nt][2 * hh + 1] = vb2 - sm.e[i] * ks[nt][2 * hh + 1];
                        fqla_split_put2(Yt, i, j, sm.bet[i] * x[nt][2 * hh], sm.bet[i] * x[nt][2 * hh + 1]);
                    }
            }
            __syncthreads();

            /* U = T~ Y (T~ lower triangular);  df_i += (K dS')_i . u_i;
             * dU = P~^T dO + diag(f) K dS' (P~^T upper triangular) */
            {
                float u[2][4];
                fqla_acc_zero(u);
                fqla_split_mma<false, false>(u, Tt, Yt, m0, n0, 0, m0 + 16);
                float *r0 = sm.red[0][wn];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = m0 + g + 8 * hh;
                    float s = 0.f;
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
                        s += kds[nt][2 * hh] * u[nt][2 * hh] + kds[nt][2 * hh + 1] * u[nt][2 * hh + 1];
                    s = quad_sum(s);
                    if (t4 == 0) r0[i] += s;
                }
                fqla_acc_pairs(u, m0, n0, [&](int i, int j, float &a, float &b) { fqla_split_put2(Ut, i, j, a, b); });
            }
            float du[2][4];
            fqla_acc_zero(du);
            fqla_split_mma<true, false>(du, Pt, dOt, m0, n0, m0, C);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) du[nt][e] += sm.f[m0 + g + 8 * (e >> 1)] * kds[nt][e];
            fqla_acc_pairs(du, m0, n0, [&](int i, int j, float &a, float &b) { fqla_split_put2(dUt, i, j, a, b); });
            __syncthreads();

            /* dY = T~^T dU;  dv = diag(beta) dY;  dbeta_i += x_i . dy_i;
             * de_i += -(K S)_i . dx_i;  dP~ += dO U^T;  dT~ += dU Y^T */
            float dy[2][4];
            fqla_acc_zero(dy);
            fqla_split_mma<true, false>(dy, Tt, dUt, m0, n0, m0, C);
            {
                const int64_t db0 = batch * bp.dv_sb + t0 * bp.dv_st + (int64_t)hv * bp.dv_sh + v0;
                float *r1 = sm.red[1][wn], *r2 = sm.red[2][wn];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = m0 + g + 8 * hh;
                    const float bi = sm.bet[i];
                    float sb = 0.f, se = 0.f;
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        const int j = n0 + 8 * nt + 2 * t4;
                        const float y0 = dy[nt][2 * hh], y1 = dy[nt][2 * hh + 1];
                        sb += x[nt][2 * hh] * y0 + x[nt][2 * hh + 1] * y1;
                        se += ks[nt][2 * hh] * y0 + ks[nt][2 * hh + 1] * y1;
                        if (i < nvalid && j < vw) {
                            T *o = (T *)bp.dv + db0 + (int64_t)i * bp.dv_st + j;
                            o[0] = bwd_cvt<T>(bi * y0);
                            o[1] = bwd_cvt<T>(bi * y1);
                        }
                    }
                    sb = quad_sum(sb);
                    se = quad_sum(se);
                    if (t4 == 0) {
                        r1[i] += sb;
                        r2[i] -= bi * se;
                    }
                }
            }
            fqla_split_mma<false, true>(dP, dOt, Ut, m0, n0, 0, vw);
            fqla_split_mma<false, true>(dT, dUt, Yt, m0, n0, 0, vw);
            __syncthreads(); /* U and Y are read: they become f U and -e beta dY */
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = m0 + g + 8 * hh, j = n0 + 8 * nt + 2 * t4;
                    const float fi = sm.f[i], c = -sm.e[i] * sm.bet[i];
                    /* this thread's own elements of U, written above */
                    fqla_split_put2(Ut, i, j, fi * fqla_split_get(Ut, i, j), fi * fqla_split_get(Ut, i, j + 1));
                    fqla_split_put2(Yt, i, j, c * dy[nt][2 * hh], c * dy[nt][2 * hh + 1]);
                }
            __syncthreads();

            /* dO S^T: de_i += scale q_i . (dO S^T)_i, dQ += scale diag(e) dO S^T;
             * dK += -diag(e beta) dY S^T + diag(f) U dS'^T */
            {
                float g2[NTW][4];
                fqla_acc_zero(g2);
                fqla_split_mma<false, true>(g2, dOt, St, m0, w0, 0, vw);
                const int64_t qb = batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh;
                warp_row_sums<true>(g2, m0, w0, sm.red[2][wn], [&](int i, int j, float v) {
                    if (i >= nvalid) return 0.f;
                    const float q = ld_io<T>(p.q, qb + (int64_t)i * p.q_st + j);
                    return scale * v * (p.l2norm ? q * p.rq[rrow + i] : q);
                });
#pragma unroll
                for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dQ[nt][e] += scale * sm.e[m0 + g + 8 * (e >> 1)] * g2[nt][e];
            }
            fqla_split_mma<false, true>(dK, Yt, St, m0, w0, 0, vw);
            fqla_split_mma<false, true>(dK, Ut, dSt, m0, w0, 0, vw);
        }

        /* ---- after the slices ---- */
        __syncthreads(); /* the slice tiles and state slices are free */
        load_rows<T, KD>(Qt, p.q, batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh, p.q_st, nvalid,
                         p.l2norm ? p.rq + rrow : nullptr);
        /* strict lower dT~ into W0 */
        fqla_acc_pairs(dT, m0, n0, [&](int i, int j, float &a, float &b) {
            fqla_split_put2(W0, i, j, j < i ? a : 0.f, j + 1 < i ? b : 0.f);
        });
        {
            float s = deC;
#pragma unroll
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) sm.wsum[warp] = s;
        }
        if (tid < C) {
            float a = 0.f, b = 0.f, c = 0.f;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                a += sm.red[0][w][tid];
                b += sm.red[1][w][tid];
                c += sm.red[2][w][tid];
            }
            sm.df[tid] = a;
            sm.db[tid] = b;
            sm.de[tid] = c;
        }
        __syncthreads();

        /* M1 = T~^T (strict lower dT~) into W1;  de_C */
        {
            float m1[2][4];
            fqla_acc_zero(m1);
            fqla_split_mma<true, false>(m1, Tt, W0, m0, n0, m0, C);
            fqla_acc_pairs(m1, m0, n0, [&](int i, int j, float &a, float &b) { fqla_split_put2(W1, i, j, a, b); });
        }
        if (tid == 0) {
            float s = 0.f;
            for (int w = 0; w < WARPS; w++) s += sm.wsum[w];
            sm.deC = s;
        }
        __syncthreads();

        /* dL = -M1 T~^T (strict lower);  K K^T;  then per element (i, j):
         * gdl = Gamma dL; dbeta_i += sum_j gdl KK; M = diag(beta) gdl;
         * R_ij = beta_i gdl KK + dP~ P~ (j < i); dQ~ = scale Gamma dP~ (j <= i) */
        float dl[2][4], kk[2][4];
        fqla_acc_zero(dl);
        fqla_acc_zero(kk);
        fqla_split_mma<false, true>(dl, W1, Tt, m0, n0, 0, n0 + 16);
        fqla_split_mma<false, true>(kk, Kt, Kt, m0, n0, 0, KD);
        {
            const float *Pg = bp.Pt + tile * C * C;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int i = m0 + g + 8 * hh;
                const float gi = sm.gam[i], bi = sm.bet[i];
                float s = 0.f;
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int j = n0 + 8 * nt + 2 * t4 + c, e = 2 * hh + c;
                        const float G = j <= i ? __expf(gi - sm.gam[j]) : 0.f;
                        const float gdl = j < i ? -dl[nt][e] * G : 0.f;
                        s += gdl * kk[nt][e];
                        const float dp = dP[nt][e];
                        const float R = j < i ? bi * gdl * kk[nt][e] + dp * Pg[i * C + j] : 0.f;
                        dl[nt][e] = bi * gdl;     /* M */
                        kk[nt][e] = R;            /* R */
                        dP[nt][e] = scale * G * dp; /* dQ~ */
                    }
                s = quad_sum(s);
                if (t4 == 0) sm.red[3][wn][i] = s;
            }
        }
        __syncthreads(); /* W0 (dT~) and W1 (M1) are read */
        fqla_acc_pairs(dP, m0, n0, [&](int i, int j, float &a, float &b) { fqla_split_put2(W0, i, j, a, b); });
        fqla_acc_pairs(dl, m0, n0, [&](int i, int j, float &a, float &b) { fqla_split_put2(W1, i, j, a, b); });
        fqla_acc_pairs(kk, m0, n0, [&](int i, int j, float &a, float &b) {
            sm.b.p.R[i * LDR + j] = a;
            sm.b.p.R[i * LDR + j + 1] = b;
        });
        __syncthreads();

        /* dQ += dQ~ K;  dK += dQ~^T Q + M K + M^T K (dQ~ lower, M strict lower) */
        fqla_split_mma<false, false>(dQ, W0, Kt, m0, w0, 0, m0 + 16);
        fqla_split_mma<true, false>(dK, W0, Qt, m0, w0, m0, C);
        fqla_split_mma<false, false>(dK, W1, Kt, m0, w0, 0, m0 + 16);
        fqla_split_mma<true, false>(dK, W1, Kt, m0, w0, m0, C);
        if (tid < C) {
            /* dbeta's Gamma dL KK part; R as row prefix sums sum_{j < t} R_it */
            sm.db[tid] += sm.red[3][0][tid] + sm.red[3][1][tid] + sm.red[3][2][tid] + sm.red[3][3][tid];
            float run = 0.f;
            float *Ri = sm.b.p.R + tid * LDR;
            for (int j = 0; j < C; j++) {
                const float r = Ri[j];
                Ri[j] = run;
                run += r;
            }
        }
        __syncthreads();
        /* dg_t = sum_{i >= t} (de_i e_i + sum_{j < t} R_ij) + sum_{j < t} df_j f_j + de_C e_C */
        if (tid < C) {
            const int t = tid;
            float s = 0.f;
            for (int i = t; i < C; i++) s += sm.de[i] * sm.e[i] + sm.b.p.R[i * LDR + t];
            for (int j = 0; j < t; j++) s += sm.df[j] * sm.f[j];
            float dgv = s + sm.deC * __expf(sm.gam[C - 1]);
            float dbv = sm.db[t];
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
            sm.part[0][t] = part_a;
            sm.part[1][t] = part_d;
        }
        if (bp.gate_part) {
            __syncthreads();
            if (tid == 0) {
                float sa = 0.f, sd = 0.f;
                for (int i = 0; i < C; i++) {
                    sa += sm.part[0][i];
                    sd += sm.part[1][i];
                }
                bp.gate_part[2 * tile] = sa;
                bp.gate_part[2 * tile + 1] = sd;
            }
        }
    }

    /* dq, dk rows: through the l2norm backward dx = r (dxhat - xhat <xhat, dxhat>) */
    auto store = [&](float(&acc)[NTW][4], const fqla_split_tile &xs, T *out, int64_t sb, int64_t st, int64_t sh,
                     const float *r) {
        __syncthreads();
        if (p.l2norm) {
            warp_row_sums<false>(acc, m0, w0, sm.red[0][wn],
                                 [&](int i, int j, float v) { return v * fqla_split_get(xs, i, j); });
            __syncthreads();
            if (tid < C) sm.de[tid] = sm.red[0][0][tid] + sm.red[0][1][tid] + sm.red[0][2][tid] + sm.red[0][3][tid];
            __syncthreads();
        }
        fqla_acc_pairs(acc, m0, w0, [&](int i, int j, float &a, float &b) {
            if (i >= nvalid) return;
            if (p.l2norm) {
                a = r[rrow + i] * (a - fqla_split_get(xs, i, j) * sm.de[i]);
                b = r[rrow + i] * (b - fqla_split_get(xs, i, j + 1) * sm.de[i]);
            }
            T *o = out + batch * sb + (t0 + i) * st + (int64_t)hk * sh + j;
            o[0] = bwd_cvt<T>(a);
            o[1] = bwd_cvt<T>(b);
        });
    };
    store(dQ, Qt, (T *)bp.dq, bp.dq_sb, bp.dq_st, bp.dq_sh, p.rq);
    store(dK, Kt, (T *)bp.dk, bp.dk_sb, bp.dk_st, bp.dk_sh, p.rk);
}

template <typename T, int KD> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = sizeof(grads_smem<KD>);
    cudaError_t e = fqla_smem_limit(cache, bwd_grads_kernel<T, KD>, smem);
    if (e != cudaSuccess) return e;
    return fqla_launch(bwd_grads_kernel<T, KD>, dim3((unsigned)p.f.slots, (unsigned)p.f.H), dim3(THREADS), smem, stream,
                       0, p);
}

} // namespace

cudaError_t fqla_bwd_launch_grads(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    if (fqla_bwd_grads_wg_covers(p)) return fqla_bwd_launch_grads_wg(p, io_bf16, stream);
    if (p.f.K == 64) return io_bf16 ? launch<__nv_bfloat16, 64>(p, stream) : launch<__half, 64>(p, stream);
    return io_bf16 ? launch<__nv_bfloat16, 128>(p, stream) : launch<__half, 128>(p, stream);
}
