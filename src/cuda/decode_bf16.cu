/* decode_bf16.cu - the decode / verify kernel variants for bf16 state storage
 * (fp32 math: the tile is widened on load and rounded to nearest even on store). */
#include "cuda/decode_launch.cuh"

cudaError_t fqla_decode_launch_bf16(const DecodeParams &p, int K, int WV, int ks, bool vfirst, bool multi, int warps,
                                   cudaStream_t stream)
{
    return fqla_decode_launch_t<__nv_bfloat16>(p, K, WV, ks, vfirst, multi, warps, stream);
}
