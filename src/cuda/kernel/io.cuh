/*
 * kernel/io.cuh - the element traits of the kernels' 2-byte dtypes: T is
 * __nv_bfloat16 or __half. pack two floats into a b16 pair (lower index in
 * the low half, as mma fragments and stmatrix want them), unpack a pair,
 * convert one element, and the m16n8k16 mma.sync on that dtype.
 */
#ifndef FQLA_CUDA_KERNEL_IO_CUH
#define FQLA_CUDA_KERNEL_IO_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/ptx/mma_sync.cuh"

template <typename T> struct fqla_io;

template <> struct fqla_io<__nv_bfloat16> {
    static FQLA_DEVICE_INLINE uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static FQLA_DEVICE_INLINE float2 unpack(uint32_t x)
    {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&x));
    }
    static FQLA_DEVICE_INLINE float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    /* D += A B, bf16 operands, fp32 accumulate */
    static FQLA_DEVICE_INLINE void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        fqla_mma_m16n8k16_bf16(d, a, b0, b1);
    }
};

template <> struct fqla_io<__half> {
    static FQLA_DEVICE_INLINE uint32_t pack(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static FQLA_DEVICE_INLINE float2 unpack(uint32_t x)
    {
        return __half22float2(*reinterpret_cast<__half2 *>(&x));
    }
    static FQLA_DEVICE_INLINE float to_f(__half x) { return __half2float(x); }
    /* D += A B, fp16 operands, fp32 accumulate */
    static FQLA_DEVICE_INLINE void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        fqla_mma_m16n8k16_f16(d, a, b0, b1);
    }
};

#endif
