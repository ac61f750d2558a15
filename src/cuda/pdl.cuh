/*
 * pdl.cuh - programmatic dependent launch (PDL), the host side: one
 * launcher for every kernel that uses it. The device side (griddepcontrol,
 * and the rule a kernel launched this way follows) is ptx/pdl.cuh.
 */
#ifndef FQLA_CUDA_PDL_CUH
#define FQLA_CUDA_PDL_CUH

#include <cuda_runtime.h>

/* Launches kernel with programmatic stream serialization when pdl is set,
 * plainly otherwise, or when the stream or driver refuses the attribute. */
template <typename... Params, typename... Args>
static cudaError_t fqla_launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                   int pdl, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess && cfg.numAttrs) {
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, kernel, args...);
    }
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

#endif
