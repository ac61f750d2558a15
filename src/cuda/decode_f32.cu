/* decode_f32.cu - the decode / verify kernel variants for fp32 state storage. */
#include "cuda/decode_launch.cuh"

cudaError_t fqla_decode_launch_f32(const DecodeParams &p, int K, int WV, int ks, bool vfirst, bool multi, int warps,
                                   cudaStream_t stream)
{
    return fqla_decode_launch_t<float>(p, K, WV, ks, vfirst, multi, warps, stream);
}
