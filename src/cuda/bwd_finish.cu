/*
 * bwd_finish.cu - the backward's last launch (bwd_common.cuh):
 *   blocks [0, HV) with the in-kernel gate: dA_log[hv], ddt_bias[hv] = the
 *     sums over every chunk slot of bwd_grads.cu's per-chunk partials, in
 *     a fixed order (each thread a strided run of slots, then a tree over
 *     the threads), so reruns are bit-identical;
 *   the rest, varlen only: dq, dk, dv, dg, dbeta rows of the tokens past the
 *     last sequence (cu[N] .. T) set to zero, as the forward zeroes o there.
 */
#include "cuda/bwd_common.cuh"

namespace {

constexpr int THREADS = 256;
constexpr int ZERO_ROWS = 64; /* token rows per zeroing block */

template <typename T>
__device__ void zero_row_block(const fqla_bwd_params &bp, int64_t blk)
{
    const fqla_fwd_params &p = bp.f;
    const int64_t end = fqla_fwd_cu(p, p.N);
    const int64_t r0 = end + blk * ZERO_ROWS;
    for (int64_t idx = threadIdx.x; idx < (int64_t)ZERO_ROWS * p.HV; idx += blockDim.x) {
        const int64_t t = r0 + idx / p.HV;
        const int h = (int)(idx % p.HV);
        if (t >= p.T) continue;
        for (int j = 0; j < p.V; j++) ((T *)bp.dv)[t * bp.dv_st + h * bp.dv_sh + j] = T(0.f);
        bp.dg[t * bp.dg_st + h * bp.dg_sh] = 0.f;
        bp.dbeta[t * bp.db_st + h * bp.db_sh] = 0.f;
        if (h < p.H)
            for (int j = 0; j < p.K; j++) {
                ((T *)bp.dq)[t * bp.dq_st + h * bp.dq_sh + j] = T(0.f);
                ((T *)bp.dk)[t * bp.dk_st + h * bp.dk_sh + j] = T(0.f);
            }
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) bwd_finish_kernel(const fqla_bwd_params bp, int gate_blocks)
{
    const fqla_fwd_params &p = bp.f;
    if ((int)blockIdx.x >= gate_blocks) {
        zero_row_block<T>(bp, blockIdx.x - gate_blocks);
        return;
    }
    FQLA_SHARED float red[2][THREADS];
    const int hv = blockIdx.x;
    float sa = 0.f, sd = 0.f;
    for (int64_t s = threadIdx.x; s < p.slots; s += THREADS) {
        sa += bp.gate_part[2 * (s * p.HV + hv)];
        sd += bp.gate_part[2 * (s * p.HV + hv) + 1];
    }
    red[0][threadIdx.x] = sa;
    red[1][threadIdx.x] = sd;
    __syncthreads();
    for (int w = THREADS / 2; w; w >>= 1) {
        if ((int)threadIdx.x < w) {
            red[0][threadIdx.x] += red[0][threadIdx.x + w];
            red[1][threadIdx.x] += red[1][threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        bp.dA_log[hv * bp.dalog_s] = red[0][0];
        bp.ddt_bias[hv * bp.ddtb_s] = red[1][0];
    }
}

template <typename T> cudaError_t launch(const fqla_bwd_params &p, int64_t zero_blocks, cudaStream_t stream)
{
    const int gate_blocks = p.gate_part ? p.f.HV : 0;
    const int64_t blocks = gate_blocks + zero_blocks;
    if (blocks == 0) return cudaSuccess;
    return fqla_launch(bwd_finish_kernel<T>, dim3((unsigned)blocks), dim3(THREADS), 0, stream, 0, p, gate_blocks);
}

} // namespace

/* The zeroing blocks cover every row from cu[N] (unknown on the host) to T:
 * at most T rows, so ceil(T / 64) blocks, most of which return at once
 * when the sequences fill the batch. */
cudaError_t fqla_bwd_launch_finish(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    const int64_t zero_blocks = p.f.varlen ? (p.f.T + ZERO_ROWS - 1) / ZERO_ROWS : 0;
    return io_bf16 ? launch<__nv_bfloat16>(p, zero_blocks, stream) : launch<__half>(p, zero_blocks, stream);
}
