/*
 * fwd_tma.cu - the host side of the TMA chunk kernel (fwd_chunk_wg.cu):
 * whether a problem can use it, and its tensor maps.
 * cuTensorMapEncodeTiled comes from the driver through the runtime's entry
 * point query, so libcuda is not linked; maps are plain host structs passed
 * as kernel parameters (CUDA-graph safe, nothing allocated).
 */
#include "cuda/fwd_common.cuh"
#include "cuda/route_plan.h"

#include <cudaTypedefs.h>
#include <string.h>

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            return NULL;
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

/* [B, T, H, D] b16 tensor with element strides (sb, st, sh, 1) as a 4-D map
 * {D, H, T, B}, box {64, 1, 64, 1}, 128-byte swizzle, zeros out of bounds.
 * Strides of length-1 dimensions are never used; they get a packed value. */
bool map_btd(CUtensorMap *m, int bf16, const void *base, int64_t B, int64_t T, int64_t H, int64_t D, int64_t sb,
             int64_t st, int64_t sh)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = encode_fn();
    if (!enc || ((uintptr_t)base & 15)) return false;
    cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
    int64_t s[3] = {H > 1 ? sh : D, T > 1 ? st : H * D, B > 1 ? sb : T * H * D};
    cuuint64_t strides[3];
    for (int i = 0; i < 3; i++) {
        if (s[i] <= 0 || (s[i] * 2) % 16 != 0 || s[i] * 2 >= ((int64_t)1 << 40)) return false;
        strides[i] = (cuuint64_t)(s[i] * 2);
    }
    cuuint32_t box[4] = {64, 1, 64, 1}, estr[4] = {1, 1, 1, 1};
    return enc(m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
               const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Workspace [rows][width] b16 matrices (Pg's tiles: width 64; Ag's strips:
 * 16, 32, 48, 64), box {64, box_rows} with 128-byte swizzle (the chunk
 * kernels' loads; columns past width arrive as zeros), or {32, 16} with
 * 64-byte swizzle (the prepare kernel's per-warp stores; columns past width
 * are not written). */
bool map_tiles(CUtensorMap *m, int bf16, const void *base, int64_t rows, int width, int box_rows,
               bool store_box = false)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = encode_fn();
    if (!enc || ((uintptr_t)base & 15)) return false;
    cuuint64_t dims[2] = {(cuuint64_t)width, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)width * 2};
    cuuint32_t box[2] = {store_box ? 32u : 64u, store_box ? 16u : (cuuint32_t)box_rows}, estr[2] = {1, 1};
    return enc(m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
               const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               store_box ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Ag's four strip maps (fwd_common.cuh's packed layout) */
bool map_ag(fqla_fwd_ag_maps *m, int bf16, const fqla_fwd_params &p, bool store_box)
{
    const int64_t tiles = p.slots * p.HV;
    for (int w = 0; w < 4; w++)
        if (!map_tiles(&m->strip[w], bf16, (const unsigned char *)p.Ag + 2 * fqla_fwd_ag_strip(tiles, w), tiles * 16,
                       fqla_fwd_ag_width(w), 16, store_box))
            return false;
    return true;
}

} // namespace

int fqla_fwd_tma_encoder(void) { return encode_fn() != NULL; }

int fqla_fwd_tma_usable(const fqla_fwd_params &p)
{
    return fqla_route_tma_ok(p.K, p.V, p.T, p.slots, p.HV, ((uintptr_t)p.o & 15) == 0, p.o_sb, p.o_st, p.o_sh,
                             fqla_fwd_tma_encoder());
}

int fqla_fwd_wg_usable(const fqla_fwd_params &p)
{
    return (p.K == 64 || p.K == 128) && fqla_fwd_tma_usable(p);
}

int fqla_fwd_tma_maps(const fqla_fwd_params &p, int io_bf16, CUtensorMap maps[FQLA_FWD_MAPS], fqla_fwd_ag_maps *ag)
{
    const int64_t B = p.varlen ? 1 : p.N;
    const int64_t rows = p.slots * p.HV * FQLA_FWD_CHUNK;
    if (!p.Pg) memset(&maps[3], 0, sizeof maps[3]); /* a defined (unused) map */
    if (!p.o) memset(&maps[4], 0, sizeof maps[4]);  /* the final state alone: no o */
    return map_btd(&maps[0], io_bf16, p.q, B, p.T, p.H, p.K, p.q_sb, p.q_st, p.q_sh) &&
           map_btd(&maps[1], io_bf16, p.k, B, p.T, p.H, p.K, p.k_sb, p.k_st, p.k_sh) &&
           map_btd(&maps[2], io_bf16, p.v, B, p.T, p.HV, p.V, p.v_sb, p.v_st, p.v_sh) &&
           (!p.Pg || map_tiles(&maps[3], io_bf16, p.Pg, rows, 64, 64)) &&
           (!p.o || map_btd(&maps[4], io_bf16, p.o, B, p.T, p.HV, p.V, p.o_sb, p.o_st, p.o_sh)) &&
           map_ag(ag, io_bf16, p, false);
}

int fqla_fwd_map_ag_store(const fqla_fwd_params &p, int io_bf16, fqla_fwd_ag_maps *m)
{
    return map_ag(m, io_bf16, p, true);
}
