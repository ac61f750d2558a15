/*
 * fwd_prep_math.cuh - the preparation's arithmetic, shared by the prepare
 * kernel (fwd_prepare.cu) and the fused kernel's preparation warpgroup
 * (fwd_fused.cu): the per-token gate and beta transforms, fp32 products on
 * tf32 tensor cores (3xTF32), 2^x, the non-transposing stmatrix, and the
 * zeroing of o rows past the last sequence.
 */
#ifndef FQLA_CUDA_FWD_PREP_MATH_CUH
#define FQLA_CUDA_FWD_PREP_MATH_CUH

#include "cuda/fwd_common.cuh"
#include "cuda/fwd_ptx.cuh"

namespace fqla_pm {

__device__ __forceinline__ float load_gate(const void *p, int bf16, int64_t off)
{
    if (bf16) return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    return ((const float *)p)[off];
}

/* log(1 + e^x) without overflow (the CPU reference's form). */
__device__ __forceinline__ float softplus_f(float x)
{
    return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
__device__ __forceinline__ float sigmoid_f(float x)
{
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    float e = expf(x);
    return e / (1.f + e);
}

/* Token tt (of batch row batch) of value head hv: its gate and beta as
 * stored (token_load), then the in-kernel transforms (token_transform):
 * the gate -exp(A_log) softplus(g + dt_bias), beta sigmoid (times 2 with
 * negative eigenvalues allowed). Two steps, so that a kernel can issue the
 * loads early and transform when the values have arrived. */
__device__ __forceinline__ void token_load(const fqla_fwd_params &p, int64_t batch, int64_t tt, int hv, float &g,
                                           float &b)
{
    g = load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh);
    b = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
}
__device__ __forceinline__ void token_transform(const fqla_fwd_params &p, int hv, float &g, float &b)
{
    if (p.gate_in_kernel) g = -expf(p.A_log[hv * p.alog_s]) * softplus_f(g + p.dt_bias[hv * p.dtb_s]);
    if (p.beta_sigmoid) {
        b = sigmoid_f(b);
        if (p.neg_eig) b *= 2.f;
    }
}

/* tf32 operand: round to nearest (ties away), the 13 low bits cleared. */
__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r & 0xffffe000u;
}

/* An fp32 operand as tf32 parts. PREC 3 (3xTF32): fqla_tf32_split3. PREC 1:
 * big = x rounded to tf32. */
template <int PREC>
__device__ __forceinline__ void split_tf32(float x, uint32_t &big, uint32_t &small)
{
    if (PREC == 3) {
        fqla_tf32_split3(x, big, small);
    } else {
        big = to_tf32(x);
        small = 0u;
    }
}
template <int PREC>
struct tf32_a {
    uint32_t big[4], small[4];
    /* from fp32 values in A fragment order */
    __device__ __forceinline__ tf32_a(float a0, float a1, float a2, float a3)
    {
        split_tf32<PREC>(a0, big[0], small[0]);
        split_tf32<PREC>(a1, big[1], small[1]);
        split_tf32<PREC>(a2, big[2], small[2]);
        split_tf32<PREC>(a3, big[3], small[3]);
    }
};

/* d += A B for one m16n8k8 step (A fragment split once per k-step, B
 * fragment b0, b1 fp32). PREC 3: the small products first, small x small
 * dropped: about fp32 accuracy. PREC 1: plain tf32. */
template <int PREC>
__device__ __forceinline__ void mma_f32(float (&d)[4], const tf32_a<PREC> &a, float b0, float b1)
{
    uint32_t bb0, bb1, bs0, bs1;
    split_tf32<PREC>(b0, bb0, bs0);
    split_tf32<PREC>(b1, bb1, bs1);
    if (PREC == 3) {
        fqla_mma_tf32(d, a.small, bb0, bb1);
        fqla_mma_tf32(d, a.big, bs0, bs1);
    }
    fqla_mma_tf32(d, a.big, bb0, bb1);
}

/* 2^x (MUFU, ~2 ulp; 0 for large negative x) */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Four 8x8 b16 matrices from accumulator-layout registers; lane l gives the
 * row address of matrix l / 8. */
__device__ __forceinline__ void stsm_x4(void *p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(fqla_smem_u32(p)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

/* Zeroes o rows [64 tb, 64 tb + 64) past cu[N]. */
template <typename T>
__device__ __forceinline__ void zero_tail(const fqla_fwd_params &p, int64_t tb)
{
    const int64_t end = fqla_fwd_cu(p, p.N);
    if ((tb + 1) * FQLA_FWD_CHUNK <= end) return; /* every row of the block is in a sequence */
    const int vec_per_head = p.V / 8;
    const int per_row = p.HV * vec_per_head;
    for (int idx = threadIdx.x; idx < FQLA_FWD_CHUNK * per_row; idx += blockDim.x) {
        int64_t t = tb * FQLA_FWD_CHUNK + idx / per_row;
        if (t < end || t >= p.T) continue;
        int r = idx % per_row;
        int h = r / vec_per_head, cv = r % vec_per_head;
        T *dst = (T *)p.o + t * p.o_st + h * p.o_sh + cv * 8;
        *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    }
}


} // namespace fqla_pm

#endif
