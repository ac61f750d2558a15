/*
 * decode_launch.cuh - picks the compiled decode kernel variant for a
 * (state type, K, WV, K split, layout, single/multi token) choice and
 * launches it. Each decode_<type>.cu instantiates this for one state element
 * type, so the variants compile in parallel.
 */
#ifndef FQLA_CUDA_DECODE_LAUNCH_CUH
#define FQLA_CUDA_DECODE_LAUNCH_CUH

#include <cuda_runtime.h>

#include "cuda/decode_kernel.cuh"
#include "cuda/launch.cuh"
#include "cuda/route_plan.h" /* the variants that exist */

/* The unsplit widths of a [K, V] state other than the planner's (route_plan.h
 * fqla_decode_wv) are compiled only for the developer build, whose hooks
 * force them. */
#ifndef FQLA_DECODE_TUNING
#ifdef FQLA_DEV
#define FQLA_DECODE_TUNING 1
#else
#define FQLA_DECODE_TUNING 0
#endif
#endif

/* Warps per CTA (default): adjacent warps take adjacent V-slices of one
 * head, so a CTA reads whole rows of a [K, V] state between them. The
 * kernel allows up to 8 (launch bounds 256). A K-split variant needs a
 * multiple of its KS. */
#define FQLA_DECODE_WARPS 4
#define FQLA_DECODE_MAX_WARPS 8

template <typename ST, int K, int WV, bool VF, int KS>
static cudaError_t fqla_decode_launch_kwv(const DecodeParams &p, bool multi, int warps, cudaStream_t stream)
{
    constexpr int kvals = K / KS / 4 * (16 / (int)sizeof(ST)); /* state values per lane of a K split */
    if constexpr (!DecodeLayout<K, WV, VF, ST, KS>::valid || (KS > 1 && (kvals < 16 || kvals > 64))) {
        return cudaErrorInvalidValue;
    } else {
        if (warps < 1 || warps > FQLA_DECODE_MAX_WARPS) warps = FQLA_DECODE_WARPS;
        if (warps % KS) warps = (warps / KS + 1) * KS;
        if (warps > FQLA_DECODE_MAX_WARPS) warps = KS;
        const int64_t blocks = (p.total_warps + warps - 1) / warps;
        /* the kernel indexes warps in 32 bits */
        if (p.total_warps >= 0x7fffffffLL - FQLA_DECODE_MAX_WARPS) return cudaErrorInvalidConfiguration;
        auto kernel = multi ? fqla_decode_kernel<K, WV, VF, true, ST, KS> : fqla_decode_kernel<K, WV, VF, false, ST, KS>;
        return fqla_launch(kernel, dim3((unsigned)blocks), dim3(32 * warps), 0, stream, p.pdl, p);
    }
}

/* WV is one of 2048 / K (64 state values per lane), 1024 / K or 512 / K with
 * ks = 1, or 128 / sizeof(ST) with ks in {2, 4, 8} ([K, V] only). */
template <typename ST, int K>
static cudaError_t fqla_decode_launch_k(const DecodeParams &p, int WV, int ks, bool vfirst, bool multi, int warps,
                                        cudaStream_t stream)
{
    constexpr int W0 = 2048 / K, W1 = 1024 / K, W2 = 512 / K, WR = 128 / (int)sizeof(ST);
    if (ks > 1) {
        if (vfirst || WV != WR) return cudaErrorInvalidValue;
        if (ks == 2) return fqla_decode_launch_kwv<ST, K, WR, false, 2>(p, multi, warps, stream);
        if (ks == 4) return fqla_decode_launch_kwv<ST, K, WR, false, 4>(p, multi, warps, stream);
        if (ks == 8) return fqla_decode_launch_kwv<ST, K, WR, false, 8>(p, multi, warps, stream);
        return cudaErrorInvalidValue;
    }
    if (!vfirst) {
#if FQLA_DECODE_TUNING
        if (WV == W0) return fqla_decode_launch_kwv<ST, K, W0, false, 1>(p, multi, warps, stream);
        if (WV == W1) return fqla_decode_launch_kwv<ST, K, W1, false, 1>(p, multi, warps, stream);
        if (WV == W2) return fqla_decode_launch_kwv<ST, K, W2, false, 1>(p, multi, warps, stream);
#else
        /* the planner leaves a [K, V] state unsplit only where its 128-byte
         * row segment is the widest slice (fp32 state at K = 64) */
        if constexpr (WR == W0)
            if (WV == W0) return fqla_decode_launch_kwv<ST, K, W0, false, 1>(p, multi, warps, stream);
#endif
        return cudaErrorInvalidValue;
    }
    if (WV == W0) return fqla_decode_launch_kwv<ST, K, W0, true, 1>(p, multi, warps, stream);
    if (WV == W1) return fqla_decode_launch_kwv<ST, K, W1, true, 1>(p, multi, warps, stream);
    if (WV == W2) return fqla_decode_launch_kwv<ST, K, W2, true, 1>(p, multi, warps, stream);
    return cudaErrorInvalidValue;
}

template <typename ST>
static cudaError_t fqla_decode_launch_t(const DecodeParams &p, int K, int WV, int ks, bool vfirst, bool multi,
                                        int warps, cudaStream_t stream)
{
    switch (K) {
    case 64: return fqla_decode_launch_k<ST, 64>(p, WV, ks, vfirst, multi, warps, stream);
    case 128: return fqla_decode_launch_k<ST, 128>(p, WV, ks, vfirst, multi, warps, stream);
    case 256: return fqla_decode_launch_k<ST, 256>(p, WV, ks, vfirst, multi, warps, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* defined in decode_f32.cu and decode_bf16.cu */
cudaError_t fqla_decode_launch_f32(const DecodeParams &p, int K, int WV, int ks, bool vfirst, bool multi, int warps,
                                   cudaStream_t stream);
cudaError_t fqla_decode_launch_bf16(const DecodeParams &p, int K, int WV, int ks, bool vfirst, bool multi, int warps,
                                    cudaStream_t stream);

#endif
