/*
 * cuda_emu.h - runs the library's CUDA kernels on the CPU, one CTA at a
 * time, so that their logic can be checked on a machine without a GPU:
 * indexing, fragment and swizzle layouts, which barrier orders which
 * access, the copy pipelines and hand-offs. Not their speed, and not the
 * tensor cores' rounding to the last bit (a product here sums exact bf16 /
 * fp16 / tf32 products in fp32 in k order).
 *
 * It is included before everything else in a C++17 host compile of a
 * kernel source (g++ -include dev/emu/cuda_emu.h, the CUDA toolkit's
 * headers on the include path; dev/emu/README.md):
 * - every thread of the CTA is a fiber (ucontext) of its own, run round
 *   robin until it reaches a barrier or a collective; order = 1 runs them
 *   in the reverse order, so a result that changes with the order shows an
 *   access no barrier orders;
 * - __syncthreads and bar.sync wait for their thread counts; a warp
 *   collective (shuffle, mma.sync, ldmatrix, stmatrix) for the warp's 32
 *   lanes, wgmma for the warpgroup's 128 threads; mbarriers keep their
 *   phase in their own 8 bytes;
 * - cp.async queues its copy in the issuing thread, which performs its
 *   committed groups at cp.async.wait_group, all but the N most recent
 *   (data read before the wait, or of a copy not committed before it, is
 *   stale, as it may be on the GPU); FQLA_EMU_ASYNC=issue performs each
 *   copy at its issue instead (a buffer that other threads read until a
 *   barrier after the issue is overwritten under them, as it may be on the
 *   GPU); wgmma completes at its issue;
 * - the ptx layer's headers are replaced here by functions of the same
 *   names; a TMA or bulk copy completes at its issue (its bytes counted on
 *   its mbarrier), with the map's swizzle and out-of-bounds zeros;
 * - fqla_launch runs every CTA of the grid in turn, on the calling thread,
 *   with the dynamic shared memory filled with 0xFF bytes (NaN) first;
 *   FQLA_EMU_CTA_ORDER=1 runs them last first, so a CTA that depends on
 *   another of the same launch shows;
 * - fqla_launch_cluster runs each cluster's CTAs together, round robin over
 *   all their threads; the CTA whose threads run has its dynamic shared
 *   memory in the array, the others theirs in buffers of their own (copied
 *   in and out when the turn passes), and a shared::cluster address
 *   (fqla_mapa: the rank above bit 24) reaches whichever holds it (only
 *   smem_raw is kept apart: a cluster kernel's FQLA_SHARED arrays, statics
 *   here, would be common to its CTAs).
 * Shared-window addresses are offsets into the dynamic shared-memory array
 * (1024-aligned), so the 128-byte swizzle sees the same address bits as on
 * the GPU.
 */
#ifndef FQLA_DEV_CUDA_EMU_H
#define FQLA_DEV_CUDA_EMU_H

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dev/emu/tma_emu.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <ucontext.h>
#include <vector>

/* the ptx-layer headers (and launch.cuh) replaced below */
#define FQLA_CUDA_PTX_MMA_SYNC_CUH
#define FQLA_CUDA_PTX_CP_ASYNC_CUH
#define FQLA_CUDA_PTX_MISC_CUH
#define FQLA_CUDA_PTX_MATRIX_LDST_CUH
#define FQLA_CUDA_PTX_MBARRIER_CUH
#define FQLA_CUDA_PTX_BARRIER_CUH
#define FQLA_CUDA_PTX_PDL_CUH
#define FQLA_CUDA_PTX_TMA_CUH
#define FQLA_CUDA_PTX_SETMAXNREG_CUH
#define FQLA_CUDA_PTX_FENCE_CUH
#define FQLA_CUDA_PTX_WGMMA_CUH
#define FQLA_CUDA_PTX_CLUSTER_CUH
#define FQLA_CUDA_LAUNCH_CUH
#define FQLA_SHARED static /* one CTA at a time: a static is the CTA's */
#define FQLA_EMU 1         /* device helpers that nvcc alone would see (bwd_common.cuh) */

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif

namespace fqla_emu {

/* ---- shared-window addresses ------------------------------------------ */
/* Every source file's dynamic shared-memory arrays are windows: a pointer
 * into one maps to its offset (below 2^18, as on the GPU, so it fits a
 * wgmma descriptor; the arrays are 1024-aligned, so the swizzle sees the
 * same address bits), and an offset maps back into the window a kernel
 * last took an address in (a kernel uses one dynamic array). */
constexpr size_t SMEM_BYTES = 232448; /* the H200's per-block opt-in maximum */
struct windows {
    char *base[256];
    int n;
    char *cur;
};
inline windows &win()
{
    static windows w;
    return w;
}
inline void add_window(void *p)
{
    windows &w = win();
    if (w.n < 256) w.base[w.n++] = (char *)p;
}
inline uint32_t u32_of(const void *p)
{
    windows &w = win();
    const char *c = (const char *)p;
    for (int i = 0; i < w.n; i++)
        if (c >= w.base[i] && c < w.base[i] + SMEM_BYTES) {
            w.cur = w.base[i];
            return (uint32_t)(c - w.base[i]);
        }
    fprintf(stderr, "cuda_emu: a shared-window address of %p, which is in no dynamic shared-memory array\n", p);
    abort();
}
/* The CTAs of the cluster that runs (fqla_launch_cluster; n = 1 for a
 * plain launch): `cur` has its dynamic shared memory in the window, every
 * other rank in backing[rank]. */
struct cluster_ctx {
    int n, cur;
    char *backing[8];
};
inline cluster_ctx &cluster()
{
    static cluster_ctx c = {1, 0, {}};
    return c;
}
inline char *ptr_of(uint32_t a)
{
    if (a >> 24) { /* a shared::cluster address (fqla_mapa): rank + 1 above bit 24 */
        const int rank = (int)(a >> 24) - 1;
        const uint32_t off = a & 0xFFFFFFu;
        cluster_ctx &c = cluster();
        if (rank >= c.n || off >= SMEM_BYTES || !win().cur) {
            fprintf(stderr, "cuda_emu: shared::cluster address %#x: rank %d of %d\n", a, rank, c.n);
            abort();
        }
        return rank == c.cur ? win().cur + off : c.backing[rank] + off;
    }
    if (!win().cur || a >= SMEM_BYTES) {
        fprintf(stderr, "cuda_emu: shared-window address %u outside the window\n", a);
        abort();
    }
    return win().cur + a;
}

/* ---- the CTA: fibers and barriers --------------------------------------- */
constexpr int MAX_THREADS = 1024;

struct pending_copy {
    void *dst;
    const void *src;
    int bytes, src_bytes;
};

struct thread_state {
    ucontext_t ctx;
    uint3 tid;
    bool done;
    std::vector<char> stack;
    std::vector<pending_copy> copies;              /* cp.async issued, not yet committed */
    std::vector<std::vector<pending_copy>> groups; /* committed groups, oldest first */
};

/* a barrier over n threads: count arrivals, release by generation */
struct group_bar {
    int count;
    unsigned gen;
};

struct cta_state {
    ucontext_t sched;
    thread_state th[MAX_THREADS];
    int nthreads, cur, live;
    uint3 block;
    dim3 block_dim, grid_dim;
    group_bar named[16]; /* bar.sync ids; 0 is __syncthreads */
    int bar_or;
    /* arrivals, releases and exits since the scheduler's last round: a
     * round without any means every live thread waits for good */
    long progress;
    struct warp_slots {
        uint64_t x[32][8];
        group_bar bar;
    } warp[MAX_THREADS / 32];
    struct wg_slots {
        float d[128][64];
        uint32_t a[128][4];
        group_bar bar;
    } wg[MAX_THREADS / 128];
    int rank;                            /* in its cluster */
    unsigned cluster_gen[MAX_THREADS];   /* the cluster barrier's phase each thread arrived in */
};

/* the CTA whose threads run now (the cluster scheduler switches it) */
inline cta_state *&cta_ptr()
{
    static cta_state *s = new cta_state();
    return s;
}
inline cta_state &cta() { return *cta_ptr(); }

inline int tid_linear() { return cta().cur; }
inline int lane() { return cta().cur & 31; }

inline void yield()
{
    cta_state &s = cta();
    swapcontext(&s.th[s.cur].ctx, &s.sched);
}

inline void bar_wait(group_bar &b, int n)
{
    cta_state &s = cta();
    s.progress++;
    const unsigned gen = b.gen;
    if (++b.count >= n) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == gen) yield();
}
inline void bar_arrive(group_bar &b, int n)
{
    cta_state &s = cta();
    s.progress++;
    if (++b.count >= n) {
        b.count = 0;
        b.gen++;
    }
}

inline void warp_wait()
{
    cta_state &s = cta();
    bar_wait(s.warp[s.cur / 32].bar, 32);
}
inline void wg_wait()
{
    cta_state &s = cta();
    bar_wait(s.wg[s.cur / 128].bar, 128);
}

/* the cluster barrier (barrier.cluster): every thread of every CTA of the
 * cluster arrives once a phase (a thread that exits before its last phase
 * leaves the others waiting for good here); a wait ends once the phase the
 * thread arrived in has completed */
struct cluster_barrier {
    int count;
    unsigned gen;
    int n;
};
inline cluster_barrier &cluster_bar()
{
    static cluster_barrier b;
    return b;
}
inline void cluster_arrive()
{
    cta_state &s = cta();
    cluster_barrier &b = cluster_bar();
    s.progress++;
    s.cluster_gen[s.cur] = b.gen;
    if (++b.count >= b.n) {
        b.count = 0;
        b.gen++;
    }
}
inline void cluster_wait()
{
    cta_state &s = cta();
    while (cluster_bar().gen == s.cluster_gen[s.cur]) yield();
}

/* every lane's x (up to 64 bytes), then each lane reads what it needs */
template <typename T> inline void warp_put(const T &x)
{
    static_assert(sizeof(T) <= 64, "a lane's part fits 64 bytes");
    cta_state &s = cta();
    memcpy(s.warp[s.cur / 32].x[lane()], &x, sizeof(T));
    warp_wait();
}
template <typename T> inline T warp_get(int l)
{
    cta_state &s = cta();
    T r;
    memcpy(&r, s.warp[s.cur / 32].x[l & 31], sizeof(T));
    return r;
}
inline void warp_done() { warp_wait(); }

template <typename T> inline T shfl(T v, int src)
{
    warp_put(v);
    const T r = warp_get<T>(src);
    warp_done();
    return r;
}

inline float bits_float(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}
inline uint32_t float_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}
inline float bf16_lo(uint32_t x) { return bits_float(x << 16); }
inline float bf16_hi(uint32_t x) { return bits_float(x & 0xffff0000u); }
inline float b16_at(uint32_t x, int half, bool f16)
{
    const uint16_t h = (uint16_t)(half ? x >> 16 : x & 0xffffu);
    if (!f16) return bits_float((uint32_t)h << 16);
    __half v;
    memcpy(&v, &h, 2);
    return __half2float(v);
}
inline float b16_mem(const char *p, bool f16)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return b16_at(h, 0, f16);
}

/* d += a b for one mma.sync m16n8k(8 E) (ptx/mma_sync.cuh's fragment
 * layouts): E operand elements a 32-bit register, 2 for bf16 / fp16 (k16),
 * 1 for tf32 (k8, each operand's top 19 bits). Lane 4 g + t holds A rows
 * g, g + 8 and B column g at k = E t .. E t + E - 1, and the same + 4 E. */
enum class mma_kind { bf16, f16, tf32 };
inline float mma_elem(uint32_t x, int i, mma_kind kind)
{
    if (kind == mma_kind::tf32) return bits_float(x & 0xffffe000u);
    return b16_at(x, i, kind == mma_kind::f16);
}
inline void mma_sync(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, mma_kind kind)
{
    struct frag {
        uint32_t a[4], b[2];
    } f = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    warp_put(f);
    const int E = kind == mma_kind::tf32 ? 1 : 2, KS = 8 * E;
    const int ln = lane(), g = ln >> 2, t = ln & 3;
    for (int e = 0; e < 4; e++) {
        const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < KS; k++) {
            const int q = (k % (4 * E)) / E, hi = k >= 4 * E;
            const frag fa = warp_get<frag>(4 * (r & 7) + q), fb = warp_get<frag>(4 * n + q);
            acc += mma_elem(fa.a[(r >= 8) + 2 * hi], k % E, kind) * mma_elem(fb.b[hi], k % E, kind);
        }
        d[e] = acc;
    }
    warp_done();
}

/* ldmatrix / stmatrix .x4: lane 8 i + j gives the address of row j of
 * matrix i; lane l holds matrix i's pair (row l / 4, columns 2 (l % 4), + 1),
 * or with .trans (rows 2 (l % 4), + 1, column l / 4). */
inline void ldsm(uint32_t (&r)[4], uint32_t a, bool trans)
{
    warp_put(a);
    const int l = lane();
    for (int i = 0; i < 4; i++) {
        if (!trans) {
            memcpy(&r[i], ptr_of(warp_get<uint32_t>(8 * i + l / 4)) + 4 * (l % 4), 4);
        } else {
            uint16_t lo, hi;
            memcpy(&lo, ptr_of(warp_get<uint32_t>(8 * i + 2 * (l % 4))) + 2 * (l / 4), 2);
            memcpy(&hi, ptr_of(warp_get<uint32_t>(8 * i + 2 * (l % 4) + 1)) + 2 * (l / 4), 2);
            r[i] = lo | ((uint32_t)hi << 16);
        }
    }
    warp_done();
}
inline void stsm(uint32_t a, const uint32_t (&r)[4], bool trans)
{
    warp_put(a);
    const int l = lane();
    for (int i = 0; i < 4; i++) {
        if (!trans) {
            memcpy(ptr_of(warp_get<uint32_t>(8 * i + l / 4)) + 4 * (l % 4), &r[i], 4);
        } else {
            const uint16_t lo = (uint16_t)(r[i] & 0xffffu), hi = (uint16_t)(r[i] >> 16);
            memcpy(ptr_of(warp_get<uint32_t>(8 * i + 2 * (l % 4))) + 2 * (l / 4), &lo, 2);
            memcpy(ptr_of(warp_get<uint32_t>(8 * i + 2 * (l % 4) + 1)) + 2 * (l / 4), &hi, 2);
        }
    }
    warp_done();
}

/* Element (i, k) of a wgmma operand (i: its M or N row, k < 16) from a
 * 128-byte-swizzle descriptor (ptx/wgmma.cuh): K-major rows of 128 bytes
 * in 8-row atoms SBO apart; MN-major 64-element rows indexed by k, 8-row
 * atoms SBO apart, 64-wide MN blocks LBO apart. */
inline float desc_elem(uint64_t desc, int i, int k, bool mn_major, bool f16)
{
    if ((desc >> 62) != 1) {
        fprintf(stderr, "cuda_emu: wgmma descriptor without the 128-byte swizzle\n");
        abort();
    }
    const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4,
                   sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
    uint32_t a;
    if (!mn_major) a = start + (uint32_t)(i / 8) * sbo + (uint32_t)(i % 8) * 128u + (uint32_t)k * 2u;
    else a = start + (uint32_t)(k / 8) * sbo + (uint32_t)(k % 8) * 128u + (uint32_t)(i % 64) * 2u + (uint32_t)(i / 64) * lbo;
    a ^= ((a >> 7) & 7u) << 4;
    return b16_mem(ptr_of(a), f16);
}

/* D (64 x N) (+)= A (64 x 16) B (16 x N) for the warpgroup. a: this
 * thread's A fragment (RS) or null (A from da). The warpgroup's first
 * thread computes the product; each thread takes back its accumulators:
 * thread (warp w, lane 4 g + t) holds rows 16 w + g (d[4 j], d[4 j + 1])
 * and 16 w + g + 8 (d[4 j + 2], d[4 j + 3]) at columns 8 j + 2 t, + 1. */
template <int N>
inline void wgmma(float (&d)[N / 2], const uint32_t *a, uint64_t da, uint64_t db, int ta, int tb, int scale_d,
                  bool f16)
{
    cta_state &s = cta();
    auto &w = s.wg[s.cur / 128];
    const int me = s.cur % 128;
    for (int i = 0; i < N / 2; i++) w.d[me][i] = d[i];
    if (a)
        for (int q = 0; q < 4; q++) w.a[me][q] = a[q];
    wg_wait();
    if (me == 0) {
        static float A[64][16], B[16][128];
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < 16; k++) {
                if (a) {
                    const int th = 32 * (r / 16) + 4 * (r % 8) + (k % 8) / 2;
                    A[r][k] = b16_at(w.a[th][((r % 16) >= 8) + 2 * (k >= 8)], k & 1, f16);
                } else {
                    A[r][k] = desc_elem(da, r, k, ta != 0, f16);
                }
            }
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < N; n++) B[k][n] = desc_elem(db, n, k, tb != 0, f16);
        for (int r = 0; r < 64; r++)
            for (int n = 0; n < N; n++) {
                const int th = 32 * (r / 16) + 4 * (r % 8) + (n % 8) / 2;
                const int e = 4 * (n / 8) + 2 * ((r % 16) >= 8) + (n & 1);
                float acc = scale_d ? w.d[th][e] : 0.f;
                for (int k = 0; k < 16; k++) acc += A[r][k] * B[k][n];
                w.d[th][e] = acc;
            }
    }
    wg_wait();
    for (int i = 0; i < N / 2; i++) d[i] = w.d[me][i];
    wg_wait();
}

/* mbarrier in its own 8 bytes: expected count (bits 0-19), pending
 * arrivals (20-39), transaction bytes still expected (40-61, signed: a copy
 * may complete before its bytes are expected), phase parity (63). A phase
 * completes when no arrival and no byte is pending. */
inline uint64_t &mbar_word(uint32_t a) { return *reinterpret_cast<uint64_t *>(ptr_of(a)); }
struct mbar_fields {
    uint64_t count, pending, phase;
    int64_t tx;
};
inline mbar_fields mbar_get(uint32_t a)
{
    const uint64_t m = mbar_word(a);
    mbar_fields f;
    f.count = m & 0xFFFFF;
    f.pending = (m >> 20) & 0xFFFFF;
    f.tx = (int64_t)((m >> 40) & 0x3FFFFF);
    if (f.tx & 0x200000) f.tx -= 0x400000;
    f.phase = m >> 63;
    return f;
}
inline void mbar_put(uint32_t a, mbar_fields f)
{
    if (f.pending == 0 && f.tx == 0) { /* the phase completes */
        f.pending = f.count;
        f.phase ^= 1;
    }
    mbar_word(a) = f.count | (f.pending << 20) | ((uint64_t)(f.tx & 0x3FFFFF) << 40) | (f.phase << 63);
}
inline void mbar_init(uint32_t a, uint32_t count)
{
    if (count == 0 || count >= (1u << 20)) abort();
    mbar_word(a) = (uint64_t)count | ((uint64_t)count << 20);
}
inline void mbar_arrive(uint32_t a, int64_t expect_tx = 0)
{
    mbar_fields f = mbar_get(a);
    if (f.pending == 0 || f.count == 0) {
        fprintf(stderr, "cuda_emu: arrival on an mbarrier that is not initialised or has no pending count\n");
        abort();
    }
    cta().progress++;
    f.pending--;
    f.tx += expect_tx;
    mbar_put(a, f);
}
inline void mbar_complete_tx(uint32_t a, int64_t bytes)
{
    mbar_fields f = mbar_get(a);
    cta().progress++;
    f.tx -= bytes;
    mbar_put(a, f);
}
/* true once the phase of this parity has completed (the barrier's parity differs) */
inline bool mbar_done(uint32_t a, uint32_t parity) { return (mbar_word(a) >> 63) != parity; }

/* A TMA box between global memory and shared memory at s (a 1024-aligned
 * window address for swizzled maps): box elements packed innermost first,
 * rows of box[0] elements, the swizzle XORing the 16-byte chunk of a row with
 * its 128-byte line's index (bits 7-9, 7-8 or 7 by the span). Loads fill
 * coordinates outside the tensor with zeros; stores skip them. Returns the
 * box's bytes. */
inline int64_t tma_box(const CUtensorMap *map, uint32_t s, const int *c, bool store)
{
    fqla_emu_tmap t;
    memcpy(&t, map, sizeof t);
    const uint32_t mask = t.swizzle == 128 ? 7 : t.swizzle == 64 ? 3 : t.swizzle == 32 ? 1 : 0;
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.rank; d++) n *= t.box[d];
    for (uint64_t e = 0; e < n; e++) {
        uint64_t rem = e, off = 0;
        bool in = true;
        for (uint32_t d = 0; d < t.rank; d++) {
            const int64_t i = (int64_t)(rem % t.box[d]) + c[d];
            rem /= t.box[d];
            if (i < 0 || (uint64_t)i >= t.dims[d]) in = false;
            else off += (uint64_t)i * t.strides[d];
        }
        uint32_t so = (uint32_t)(e * t.esize);
        so ^= ((so >> 7) & mask) << 4;
        char *sp = ptr_of(s + so);
        if (store) {
            if (in) memcpy(t.base + off, sp, t.esize);
        } else if (in) {
            memcpy(sp, t.base + off, t.esize);
        } else {
            memset(sp, 0, t.esize);
        }
    }
    return (int64_t)(n * t.esize);
}

template <class F, class P>
void run_cluster(F &fn, dim3 grid, dim3 block_dim, const uint3 *blocks, int n, int order, size_t smem, P poison,
                 unsigned char *window);

} // namespace fqla_emu

/* ---- what the kernels call ------------------------------------------- */
inline unsigned __cvta_generic_to_shared(const void *p) { return fqla_emu::u32_of(p); }
inline void *__cvta_generic_to_global(const void *p) { return const_cast<void *>(p); }

#include "cuda/ptx/common.cuh" /* FQLA_DEVICE_INLINE, fqla_smem_u32 */

#define threadIdx (fqla_emu::cta().th[fqla_emu::cta().cur].tid)
#define blockIdx (fqla_emu::cta().block)
#define blockDim (fqla_emu::cta().block_dim)
#define gridDim (fqla_emu::cta().grid_dim)

inline void __syncthreads()
{
    fqla_emu::cta_state &s = fqla_emu::cta();
    fqla_emu::bar_wait(s.named[0], s.live);
}
inline int __syncthreads_or(int x)
{
    fqla_emu::cta_state &s = fqla_emu::cta();
    __syncthreads();
    s.bar_or |= x;
    __syncthreads();
    const int r = s.bar_or != 0;
    __syncthreads();
    if (s.cur == 0) s.bar_or = 0;
    __syncthreads();
    return r;
}
inline int __syncthreads_count(int x)
{
    fqla_emu::cta_state &s = fqla_emu::cta();
    static int n;
    __syncthreads();
    if (s.cur == 0) n = 0;
    __syncthreads();
    n += x != 0;
    __syncthreads();
    const int r = n;
    __syncthreads();
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { fqla_emu::warp_wait(); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m) { return fqla_emu::shfl(v, fqla_emu::lane() ^ m); }
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int width = 32)
{
    const int l = fqla_emu::lane();
    return fqla_emu::shfl(v, (l & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, int o)
{
    const int l = fqla_emu::lane();
    return fqla_emu::shfl(v, l >= o ? l - o : l);
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, int o)
{
    const int l = fqla_emu::lane();
    return fqla_emu::shfl(v, l + o < 32 ? l + o : l);
}
inline unsigned __ballot_sync(unsigned, int pred)
{
    fqla_emu::warp_put(pred != 0);
    unsigned r = 0;
    for (int l = 0; l < 32; l++) r |= (unsigned)fqla_emu::warp_get<bool>(l) << l;
    fqla_emu::warp_done();
    return r;
}
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == 0xffffffffu; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline float __uint_as_float(unsigned x) { return fqla_emu::bits_float(x); }
inline unsigned __float_as_uint(float x) { return fqla_emu::float_bits(x); }
inline float __int_as_float(int x) { return fqla_emu::bits_float((uint32_t)x); }
inline int __float_as_int(float x) { return (int)fqla_emu::float_bits(x); }
template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
template <typename T> inline void __stcs(T *p, T v) { *p = v; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
template <typename T> inline void __stcg(T *p, T v) { *p = v; }
[[noreturn]] inline void __trap() { abort(); }
/* CUDA's min / max of mixed integer and float types */
template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }

/* ptx/mma_sync.cuh */
inline void fqla_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    fqla_emu::mma_sync(d, a, b0, b1, fqla_emu::mma_kind::bf16);
}
inline void fqla_mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    fqla_emu::mma_sync(d, a, b0, b1, fqla_emu::mma_kind::f16);
}
inline void fqla_mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    fqla_emu::mma_sync(d, a, b0, b1, fqla_emu::mma_kind::tf32);
}
inline void fqla_tf32_split3(float x, uint32_t &big, uint32_t &small)
{
    big = fqla_emu::float_bits(x) & 0xffffe000u;
    small = fqla_emu::float_bits(x - fqla_emu::bits_float(big));
}
/* ptx/misc.cuh */
inline float fqla_ex2(float x) { return std::exp2(x); }
inline uint32_t fqla_cvt_rna_tf32(float x) { return (fqla_emu::float_bits(x) + 0x1000u) & 0xffffe000u; /* ties away from zero */ }
inline void fqla_prefetch_l2(const void *) {}
inline void fqla_st_shared_v4(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
    const uint32_t v[4] = {x, y, z, w};
    memcpy(fqla_emu::ptr_of(a), v, 16);
}
/* ptx/cp_async.cuh: queued, performed at the wait; or, with
 * FQLA_EMU_ASYNC=issue, performed at the issue. The GPU lands a copy
 * anywhere between the two, so each end shows one hazard: at the wait, a
 * read of the buffer before the wait sees stale data; at the issue, a copy
 * into a buffer that other threads still read (no barrier between their
 * reads and the issue) overwrites what they have yet to read.
 * Commit groups are kept as the GPU keeps them: wait_group N performs the
 * thread's committed groups but its N most recent, and a copy not yet
 * committed belongs to no group, so no wait performs it (the library's
 * fqla_cp_async_wait_all is wait_group 0, not cp.async.wait_all, which
 * would commit first). */
namespace fqla_emu {
inline bool async_at_issue()
{
    static const bool at_issue = getenv("FQLA_EMU_ASYNC") && strcmp(getenv("FQLA_EMU_ASYNC"), "issue") == 0;
    return at_issue;
}
inline void perform_copy(const pending_copy &c)
{
    memset(c.dst, 0, c.bytes); /* bytes past src_bytes are zeros */
    if (c.src_bytes) memcpy(c.dst, c.src, c.src_bytes);
}
inline void cp_async(const pending_copy &c)
{
    if (async_at_issue()) perform_copy(c);
    else cta().th[cta().cur].copies.push_back(c);
}
inline void cp_async_wait(size_t n)
{
    auto &t = cta().th[cta().cur];
    size_t done = 0;
    for (; t.groups.size() - done > n; done++)
        for (const pending_copy &c : t.groups[done]) perform_copy(c);
    t.groups.erase(t.groups.begin(), t.groups.begin() + (long)done);
}
/* The GPU faults (misaligned address) on a cp.async whose source or
 * destination is not aligned to its size, even one of src_bytes 0. */
inline void cp_async_aligned(const void *dst, const void *src, unsigned bytes)
{
    if (((uintptr_t)dst | (uintptr_t)src) & (bytes - 1)) {
        fprintf(stderr, "cuda_emu: cp.async of %u bytes from %p to %p: not %u-byte aligned (a misaligned address on the GPU)\n",
                bytes, src, dst, bytes);
        abort();
    }
}
} // namespace fqla_emu
inline void fqla_cp_async16(void *dst, const void *src, int src_bytes)
{
    fqla_emu::cp_async_aligned(dst, src, 16);
    fqla_emu::cp_async(fqla_emu::pending_copy{dst, src, 16, src_bytes});
}
inline void fqla_cp_async4(void *dst, const void *src)
{
    fqla_emu::cp_async_aligned(dst, src, 4);
    fqla_emu::cp_async(fqla_emu::pending_copy{dst, src, 4, 4});
}
inline void fqla_cp_async_commit()
{
    auto &t = fqla_emu::cta().th[fqla_emu::cta().cur];
    t.groups.push_back(std::move(t.copies)); /* an empty group too: it counts */
    t.copies.clear();
}
template <int N> inline void fqla_cp_async_wait() { fqla_emu::cp_async_wait(N); }
inline void fqla_cp_async_wait_all() { fqla_cp_async_wait<0>(); }
/* ptx/matrix_ldst.cuh */
inline void fqla_ldsm_x4(uint32_t (&r)[4], const void *p) { fqla_emu::ldsm(r, fqla_emu::u32_of(p), false); }
inline void fqla_ldsm_x4_t(uint32_t (&r)[4], const void *p) { fqla_emu::ldsm(r, fqla_emu::u32_of(p), true); }
inline void fqla_ldsm_x4_at(uint32_t (&r)[4], uint32_t a) { fqla_emu::ldsm(r, a, false); }
inline void fqla_ldsm_x4_t_at(uint32_t (&r)[4], uint32_t a) { fqla_emu::ldsm(r, a, true); }
inline void fqla_stsm_x4(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    fqla_emu::stsm(fqla_emu::u32_of(p), {r0, r1, r2, r3}, false);
}
inline void fqla_stsm_x4_t(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    fqla_emu::stsm(fqla_emu::u32_of(p), {r0, r1, r2, r3}, true);
}
inline void fqla_stsm_x4_at(uint32_t a, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    fqla_emu::stsm(a, {r0, r1, r2, r3}, false);
}
/* ptx/mbarrier.cuh */
inline void fqla_mbar_init(uint64_t *b, uint32_t count) { fqla_emu::mbar_init(fqla_emu::u32_of(b), count); }
inline void fqla_mbar_init_fence() {}
inline void fqla_mbar_arrive(uint64_t *b) { fqla_emu::mbar_arrive(fqla_emu::u32_of(b)); }
inline void fqla_mbar_arrive_tx(uint64_t *b, uint32_t bytes) { fqla_emu::mbar_arrive(fqla_emu::u32_of(b), bytes); }
inline uint32_t fqla_mbar_try_wait(uint32_t a, uint32_t parity)
{
    if (fqla_emu::mbar_done(a, parity)) return 1;
    fqla_emu::yield();
    return 0;
}
inline void fqla_mbar_wait(uint64_t *b, uint32_t parity)
{
    const uint32_t a = fqla_emu::u32_of(b);
    while (!fqla_emu::mbar_done(a, parity)) fqla_emu::yield();
}
/* ptx/barrier.cuh */
inline void fqla_named_sync(uint32_t id, uint32_t n) { fqla_emu::bar_wait(fqla_emu::cta().named[id & 15], (int)n); }
inline void fqla_named_arrive(uint32_t id, uint32_t n) { fqla_emu::bar_arrive(fqla_emu::cta().named[id & 15], (int)n); }
/* the forms without .aligned (divergent warps): the same barrier here */
inline void fqla_named_sync_any(uint32_t id, uint32_t n) { fqla_named_sync(id, n); }
inline void fqla_named_arrive_any(uint32_t id, uint32_t n) { fqla_named_arrive(id, n); }
inline bool fqla_elect_one() { return fqla_emu::lane() == 0; }
/* ptx/pdl.cuh, setmaxnreg.cuh, fence.cuh */
inline void fqla_pdl_wait() {}
inline void fqla_pdl_trigger() {}
template <int R> inline void fqla_setmaxnreg_inc() {}
template <int R> inline void fqla_setmaxnreg_dec() {}
inline void fqla_fence_async_smem() {}
inline void fqla_fence_async_global() {}
/* ptx/misc.cuh's acquire load, and the CUDA built-ins the flags around it
 * take: one CTA runs at a time, so plain accesses (a spin that never ends
 * yields, as the mbarrier waits do) */
inline int fqla_ld_acquire_gpu(const int *p) { return *(const volatile int *)p; }
inline int fqla_atom_add_acq_rel_gpu(int *p, int v)
{
    const int old = *p;
    *p = old + v;
    return old;
}
inline void fqla_discard_l2(void *p) { memset(p, 0xFF, 128); /* undefined bytes: NaN, so a later read shows */ }
inline void __threadfence() {}
inline void __nanosleep(unsigned) { fqla_emu::yield(); }
/* a count, not a time: one more each call (speed is not emulated) */
inline long long clock64()
{
    static long long c = 0;
    return ++c;
}
inline int atomicAdd(int *p, int v)
{
    const int old = *p;
    *p = old + v;
    return old;
}
/* ptx/cluster.cuh: ranks, the cluster barrier, and shared::cluster
 * addresses (rank + 1 above bit 24, fqla_emu::ptr_of) */
inline uint32_t fqla_cluster_ctarank() { return (uint32_t)fqla_emu::cta().rank; }
inline uint32_t fqla_cluster_nctarank() { return (uint32_t)fqla_emu::cluster().n; }
inline void fqla_cluster_arrive() { fqla_emu::cluster_arrive(); }
inline void fqla_cluster_arrive_relaxed() { fqla_emu::cluster_arrive(); }
inline void fqla_cluster_wait() { fqla_emu::cluster_wait(); }
inline void fqla_cluster_sync()
{
    fqla_cluster_arrive();
    fqla_cluster_wait();
}
inline uint32_t fqla_mapa(uint32_t a, uint32_t rank) { return ((rank + 1) << 24) | (a & 0xFFFFFFu); }
inline void fqla_st_cluster_f32x2(uint32_t a, float x, float y)
{
    const float v[2] = {x, y};
    memcpy(fqla_emu::ptr_of(a), v, 8);
}
inline float2 fqla_ld_cluster_f32x2(uint32_t a)
{
    float2 v;
    memcpy(&v, fqla_emu::ptr_of(a), 8);
    return v;
}
inline void fqla_mbar_arrive_cluster(uint32_t a) { fqla_emu::mbar_arrive(a); }
inline uint32_t fqla_mbar_try_wait_cluster(uint32_t a, uint32_t parity) { return fqla_mbar_try_wait(a, parity); }
/* ptx/tma.cuh: every copy completes at its issue */
inline void fqla_tma_prefetch(const CUtensorMap *) {}
inline void fqla_tma_load_4d(void *dst, const CUtensorMap *m, uint64_t *bar, int c0, int c1, int c2, int c3)
{
    const int c[4] = {c0, c1, c2, c3};
    const uint32_t s = fqla_emu::u32_of(dst);
    const uint32_t b = fqla_emu::u32_of(bar);
    fqla_emu::mbar_complete_tx(b, fqla_emu::tma_box(m, s, c, false));
}
inline void fqla_tma_load_2d(void *dst, const CUtensorMap *m, uint64_t *bar, int c0, int c1)
{
    const int c[2] = {c0, c1};
    const uint32_t s = fqla_emu::u32_of(dst);
    const uint32_t b = fqla_emu::u32_of(bar);
    fqla_emu::mbar_complete_tx(b, fqla_emu::tma_box(m, s, c, false));
}
inline void fqla_bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    memcpy(dst, src, bytes);
    fqla_emu::mbar_complete_tx(fqla_emu::u32_of(bar), bytes);
}
inline void fqla_bulk_store(void *dst, const void *src, uint32_t bytes) { memcpy(dst, src, bytes); }
inline void fqla_tma_store_4d(const CUtensorMap *m, const void *src, int c0, int c1, int c2, int c3)
{
    const int c[4] = {c0, c1, c2, c3};
    fqla_emu::tma_box(m, fqla_emu::u32_of(src), c, true);
}
inline void fqla_tma_store_2d(const CUtensorMap *m, const void *src, int c0, int c1)
{
    const int c[2] = {c0, c1};
    fqla_emu::tma_box(m, fqla_emu::u32_of(src), c, true);
}
inline void fqla_bulk_commit() {}
template <int N> inline void fqla_bulk_wait_read() {}
template <int N> inline void fqla_bulk_wait() {}
/* ptx/wgmma.cuh: completes at the issue */
inline void fqla_wg_fence() {}
inline void fqla_wg_commit() {}
template <int N> inline void fqla_wg_wait() {}
template <int N> inline void fqla_reg_fence(float (&)[N]) {}
template <int N> inline void fqla_reg_fence_u(uint32_t (&)[N][4]) {}
inline uint64_t fqla_desc_at(uint32_t a, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
inline uint64_t fqla_desc(const void *tile, uint32_t lbo, uint32_t sbo)
{
    return fqla_desc_at(fqla_emu::u32_of(tile), lbo, sbo);
}
inline uint64_t fqla_desc_kmajor(const void *tile) { return fqla_desc(tile, 16, 1024); }
inline uint64_t fqla_desc_mnmajor(const void *tile, uint32_t atom_bytes) { return fqla_desc(tile, atom_bytes, 1024); }
#define FQLA_DESC_K16_KMAJOR 2ull
#define FQLA_DESC_K16_MNMAJOR 128ull
template <typename T> struct fqla_wg {
    static constexpr bool F16 = sizeof(T) == 2 && !std::is_same<T, __nv_bfloat16>::value;
    template <int TA, int TB> static void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d)
    {
        fqla_emu::wgmma<64>(d, nullptr, da, db, TA, TB, scale_d, F16);
    }
    template <int TA, int TB> static void ss128(float (&d)[64], uint64_t da, uint64_t db, int scale_d)
    {
        fqla_emu::wgmma<128>(d, nullptr, da, db, TA, TB, scale_d, F16);
    }
    template <int TB> static void rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d)
    {
        fqla_emu::wgmma<64>(d, a, 0, db, 0, TB, scale_d, F16);
    }
    template <int TB> static void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d)
    {
        fqla_emu::wgmma<128>(d, a, 0, db, 0, TB, scale_d, F16);
    }
};
/* kernel/io.cuh is the real one (its mma calls the functions above) */

/* launch.cuh: every CTA of the grid in turn, on this thread */
struct fqla_smem_cache {
    size_t bytes[64];
};
template <typename... Params>
static cudaError_t fqla_smem_limit(fqla_smem_cache &, void (*)(Params...), size_t bytes)
{
    return bytes <= fqla_emu::SMEM_BYTES ? cudaSuccess : cudaErrorInvalidValue;
}
namespace fqla_emu {
inline int order() { return getenv("FQLA_EMU_ORDER") && atoi(getenv("FQLA_EMU_ORDER")) == 1; }
/* FQLA_EMU_CTA_ORDER=1: the grid's CTAs in the reverse order (last block
 * first). The GPU runs them in no set order, all at once where they fit; a
 * result that changes with this order shows a CTA that reads what another
 * CTA of the same launch writes. */
inline int cta_order() { return getenv("FQLA_EMU_CTA_ORDER") && atoi(getenv("FQLA_EMU_CTA_ORDER")) == 1; }
inline long &launches()
{
    static long n = 0;
    return n;
}
} // namespace fqla_emu
/* the dynamic shared memory every kernel of a source file declares, by the
 * names the library's kernels use (extern __shared__ at block scope in the
 * unnamed namespace refers to these) */
namespace {
alignas(1024) unsigned char smem_raw[fqla_emu::SMEM_BYTES];
alignas(1024) float scan_smem[fqla_emu::SMEM_BYTES / 4];
alignas(1024) float4 smem_f4[fqla_emu::SMEM_BYTES / 16];
namespace f32c {
alignas(1024) float sm[fqla_emu::SMEM_BYTES / 4];
}
struct emu_windows_of_this_file {
    emu_windows_of_this_file()
    {
        fqla_emu::add_window(smem_raw);
        fqla_emu::add_window(scan_smem);
        fqla_emu::add_window(smem_f4);
        fqla_emu::add_window(f32c::sm);
    }
} emu_windows_registered;
/* FQLA_EMU_POISON: the byte dynamic shared memory starts with (default
 * 0xFF: NaN in every float and bf16 / fp16 element) */
inline void emu_poison_smem(size_t bytes)
{
    static const int byte = getenv("FQLA_EMU_POISON") ? (int)strtol(getenv("FQLA_EMU_POISON"), nullptr, 0) : 0xFF;
    memset(smem_raw, byte, bytes);
    memset(scan_smem, byte, bytes);
    memset(smem_f4, byte, bytes);
    memset(f32c::sm, byte, bytes);
}
} // namespace
template <typename... Params, typename... Args>
static cudaError_t fqla_launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                                       unsigned cluster_x, Args &&...args)
{
    if (smem > fqla_emu::SMEM_BYTES || block.x * block.y * block.z > (unsigned)fqla_emu::MAX_THREADS ||
        cluster_x == 0 || cluster_x > 8 || grid.x % cluster_x)
        return cudaErrorInvalidValue;
    fqla_emu::launches()++;
    if (getenv("FQLA_EMU_TRACE"))
        fprintf(stderr, "cuda_emu: launch %ld (kernel %p): grid (%u, %u, %u) block (%u, %u, %u) smem %zu cluster %u\n",
                fqla_emu::launches(), (void *)kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem,
                cluster_x);
    const unsigned n = grid.x * grid.y * grid.z / cluster_x;
    for (unsigned j = 0; j < n; j++) {
        /* clusters x fastest, then y, then z; FQLA_EMU_CTA_ORDER=1 last first */
        const unsigned c = fqla_emu::cta_order() ? n - 1 - j : j, nx = grid.x / cluster_x;
        uint3 blocks[8];
        for (unsigned r = 0; r < cluster_x; r++)
            blocks[r] = make_uint3(c % nx * cluster_x + r, c / nx % grid.y, c / (nx * grid.y));
        auto body = [&] { kernel(args...); };
        /* the CTAs' shared memory: the array for the one that runs, 0xFF bytes for all at the start */
        fqla_emu::run_cluster(body, grid, block, blocks, (int)cluster_x, fqla_emu::order(), smem,
                              [&] { emu_poison_smem(smem); }, smem_raw);
    }
    return cudaSuccess;
}
template <typename... Params, typename... Args>
static cudaError_t fqla_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               int, Args &&...args)
{
    return fqla_launch_cluster(kernel, grid, block, smem, stream, 1u, args...);
}

namespace fqla_emu {
/* Runs fn() as every thread of the n CTAs of one cluster (blocks), round
 * robin over the CTAs and, in each, over its threads (order 1: in reverse).
 * poison() fills the shared-memory array for a CTA's start; for n > 1 the
 * array (the first smem bytes of `window`) holds the running CTA's, the
 * others' wait in backing buffers. */
template <class F, class P>
void run_cluster(F &fn, dim3 grid, dim3 block_dim, const uint3 *blocks, int n, int order, size_t smem, P poison,
                 unsigned char *window)
{
    static cta_state *states[8];
    static std::vector<char> backing[8];
    if (n > 8) abort();
    cluster_ctx &cl = cluster();
    cl.n = n;
    cl.cur = 0;
    for (int r = 0; r < n; r++) {
        if (!states[r]) states[r] = r == 0 ? cta_ptr() : new cta_state();
        if (n > 1) {
            backing[r].resize(SMEM_BYTES);
            poison();
            memcpy(backing[r].data(), window, smem);
            cl.backing[r] = backing[r].data();
        } else {
            poison();
        }
    }
    static F *body;
    body = &fn;
    struct tramp {
        static void go()
        {
            (*body)();
            cta_state &s = cta();
            /* copies never committed no wait covers: a read of them races
             * their landing on the GPU (said once a run) */
            static bool told;
            if (!s.th[s.cur].copies.empty() && !told) {
                told = true;
                fprintf(stderr, "cuda_emu: block (%u, %u, %u) thread %d ends with %zu cp.async copies never "
                                "committed (no cp.async.wait_group waits for them)\n",
                        s.block.x, s.block.y, s.block.z, s.cur, s.th[s.cur].copies.size());
            }
            s.th[s.cur].done = true;
            s.live--;
            s.progress++;
            swapcontext(&s.th[s.cur].ctx, &s.sched);
        }
    };
    int live = 0;
    for (int r = 0; r < n; r++) {
        cta_state &s = *states[r];
        s.nthreads = (int)(block_dim.x * block_dim.y * block_dim.z);
        if (s.nthreads > MAX_THREADS) abort();
        s.block = blocks[r];
        s.block_dim = block_dim;
        s.grid_dim = grid;
        s.rank = r;
        for (auto &b : s.named) b = group_bar{0, 0};
        s.bar_or = 0;
        for (auto &w : s.warp) w.bar = group_bar{0, 0};
        for (auto &w : s.wg) w.bar = group_bar{0, 0};
        s.live = s.nthreads;
        live += s.live;
        for (int i = 0; i < s.nthreads; i++) {
            thread_state &t = s.th[i];
            t.tid = make_uint3((unsigned)i % block_dim.x, (unsigned)i / block_dim.x % block_dim.y,
                               (unsigned)i / (block_dim.x * block_dim.y));
            t.done = false;
            t.copies.clear();
            t.groups.clear();
            t.stack.resize(256 * 1024);
            getcontext(&t.ctx);
            t.ctx.uc_stack.ss_sp = t.stack.data();
            t.ctx.uc_stack.ss_size = t.stack.size();
            t.ctx.uc_link = nullptr;
            makecontext(&t.ctx, (void (*)())tramp::go, 0);
        }
    }
    cluster_bar() = cluster_barrier{0, 0, n * states[0]->nthreads};
    /* the array holds rank 0's shared memory first */
    if (n > 1) memcpy(window, backing[0].data(), smem);
    while (live > 0) {
        long progress = 0;
        for (int r = 0; r < n; r++) {
            cta_state &s = *states[r];
            if (s.live == 0) continue;
            if (n > 1 && cl.cur != r) { /* the turn passes: the array to its owner's buffer, r's in */
                memcpy(backing[cl.cur].data(), window, smem);
                memcpy(window, backing[r].data(), smem);
                cl.cur = r;
            }
            cta_ptr() = &s;
            s.progress = 0;
            for (int j = 0; j < s.nthreads; j++) {
                const int i = order ? s.nthreads - 1 - j : j;
                if (s.th[i].done) continue;
                s.cur = i;
                swapcontext(&s.sched, &s.th[i].ctx);
            }
            progress += s.progress;
        }
        live = 0;
        for (int r = 0; r < n; r++) live += states[r]->live;
        if (progress == 0 && live > 0) {
            fprintf(stderr, "cuda_emu: block (%u, %u, %u)%s: %d threads wait for good (a barrier, collective or "
                            "mbarrier phase that never completes)\n",
                    blocks[0].x, blocks[0].y, blocks[0].z, n > 1 ? " and its cluster" : "", live);
            abort();
        }
    }
    cta_ptr() = states[0];
    cl.n = 1;
    cl.cur = 0;
}
} // namespace fqla_emu

#endif
