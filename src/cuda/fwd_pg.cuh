/*
 * fwd_pg.cuh - a chunk's Pg = scale Gamma (.) tril(Q K^T) by one warpgroup,
 * from the chunk's Q and K tiles in shared memory into a 128-byte-swizzled
 * 64 x 64 tile that the chain reads as G6's B operand. The kernels that form
 * Pg beside the chain share it: fwd_fused.cu's Pg warpgroup and
 * fwd_full.cu's helpers.
 */
#ifndef FQLA_CUDA_FWD_PG_CUH
#define FQLA_CUDA_FWD_PG_CUH

#include "cuda/fwd_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"

namespace fqla_pg {

/* QK = Q K^T (SS wgmma m64n64, fp32 accumulators; issued, not committed):
 * per 64-wide k block the K tile at k and the Q tile at q, kq bytes on to
 * the next block's, 128-byte swizzle */
template <typename T, int KD>
__device__ __forceinline__ void qk_issue(float (&acc)[32], const unsigned char *k, const unsigned char *q,
                                         uint32_t kq)
{
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        const uint64_t dK = fqla_desc_kmajor(k + (kk >> 2) * kq) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        const uint64_t dQ = fqla_desc_kmajor(q + (kk >> 2) * kq) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        fqla_wg<T>::template ss64<0, 0>(acc, dQ, dK, kk > 0);
    }
}

/* Pg from QK's accumulators, this warp's 16 rows, into tile (stmatrix,
 * 128-byte swizzle: 16-byte chunk ch of row r at ch ^ (r % 8)); gam: the
 * chunk's inclusive cumsum of g; rows and columns past nvalid are zeros */
template <typename T>
__device__ __forceinline__ void store(unsigned char *tile, const float (&acc)[32], const float *gam, int nvalid,
                                      float scale, int warp, int lane)
{
    constexpr float L2E = 1.4426950408889634f;
    const int g = lane >> 2, tq = lane & 3;
    const int r0 = 16 * warp + g;
    const float gi[2] = {gam[r0] * L2E, gam[r0 + 8] * L2E};
#pragma unroll
    for (int j2 = 0; j2 < 4; j2++) {
        uint32_t r[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int h = m & 1, j = 2 * j2 + (m >> 1), col = 8 * j + 2 * tq, row = r0 + 8 * h;
            const float2 gc = *reinterpret_cast<const float2 *>(gam + col);
            const bool rok = row < nvalid;
            float v0 = scale * acc[4 * j + 2 * h] * fqla_ex2(gi[h] - gc.x * L2E);
            float v1 = scale * acc[4 * j + 2 * h + 1] * fqla_ex2(gi[h] - gc.y * L2E);
            v0 = rok && col <= row && col < nvalid ? v0 : 0.f;
            v1 = rok && col + 1 <= row && col + 1 < nvalid ? v1 : 0.f;
            r[m] = fqla_io<T>::pack(v0, v1);
        }
        const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7), ch = 2 * j2 + (mi >> 1);
        fqla_stsm_x4(tile + row * 128 + 16 * (ch ^ (row & 7)), r[0], r[1], r[2], r[3]);
    }
}

/* The same in two halves of 32 columns (n0 = 0, 32), each 16
 * accumulators (m64n32): for a warpgroup with fewer registers
 * (fwd_full.cu's helpers, 64). qk_issue_half: QK's columns n0.. (K's rows
 * n0..: 32 rows of 128 bytes on in the swizzled tile); store_half: Pg's
 * columns n0.. from them. */
template <typename T, int KD>
__device__ __forceinline__ void qk_issue_half(float (&acc)[16], const unsigned char *k, const unsigned char *q,
                                              uint32_t kq, int n0)
{
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        const uint64_t dK = fqla_desc_kmajor(k + (kk >> 2) * kq + n0 * 128) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        const uint64_t dQ = fqla_desc_kmajor(q + (kk >> 2) * kq) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        fqla_wg<T>::template ss32<0, 0>(acc, dQ, dK, kk > 0);
    }
}
template <typename T>
__device__ __forceinline__ void store_half(unsigned char *tile, const float (&acc)[16], const float *gam, int nvalid,
                                           float scale, int warp, int lane, int n0)
{
    constexpr float L2E = 1.4426950408889634f;
    const int g = lane >> 2, tq = lane & 3;
    const int r0 = 16 * warp + g;
    const float gi[2] = {gam[r0] * L2E, gam[r0 + 8] * L2E};
#pragma unroll 1
    for (int j2 = 0; j2 < 2; j2++) {
        uint32_t r[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int h = m & 1, j = 2 * j2 + (m >> 1), col = n0 + 8 * j + 2 * tq, row = r0 + 8 * h;
            const float2 gc = *reinterpret_cast<const float2 *>(gam + col);
            const bool rok = row < nvalid;
            float v0 = scale * acc[4 * j + 2 * h] * fqla_ex2(gi[h] - gc.x * L2E);
            float v1 = scale * acc[4 * j + 2 * h + 1] * fqla_ex2(gi[h] - gc.y * L2E);
            v0 = rok && col <= row && col < nvalid ? v0 : 0.f;
            v1 = rok && col + 1 <= row && col + 1 < nvalid ? v1 : 0.f;
            r[m] = fqla_io<T>::pack(v0, v1);
        }
        const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7), ch = n0 / 8 + 2 * j2 + (mi >> 1);
        fqla_stsm_x4(tile + row * 128 + 16 * (ch ^ (row & 7)), r[0], r[1], r[2], r[3]);
    }
}

} // namespace fqla_pg

#endif
