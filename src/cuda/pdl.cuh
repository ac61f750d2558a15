/*
 * pdl.cuh - programmatic dependent launch (PDL), the device side and one
 * launcher for every kernel that uses it.
 *
 * A kernel launched with programmatic stream serialization may start while
 * the previous kernel of the stream is still running: once every CTA of that
 * kernel has executed griddepcontrol.launch_dependents (or exited). What the
 * overlap buys is the launch latency and the previous kernel's tail, about a
 * microsecond per edge in a CUDA graph (docs/perf.md, decode round 2).
 *
 * The rule that keeps it safe: a kernel launched this way executes
 * fqla_pdl_wait() in every CTA before its first global memory access and
 * before any early return. The wait returns once the previous kernel has
 * completed and its writes are visible; since that kernel waited likewise
 * for its own predecessor, a chain of such kernels stays ordered end to end.
 * Without the attribute both instructions are no-ops, so the same kernel
 * runs correctly under a plain launch. One exception to "no global access
 * before the wait": reads whose values only steer prefetch.global.L2 hints
 * (decode_kernel.cuh). L2 is the point of coherence, so a prefetch cannot
 * make a later load stale, and a stale value only warms the wrong lines.
 */
#ifndef FQLA_CUDA_PDL_CUH
#define FQLA_CUDA_PDL_CUH

#include <cuda_runtime.h>

/* Blocks until the previous kernel of the stream has completed (PDL only). */
__device__ __forceinline__ void fqla_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel of the stream (if launched with PDL) start launching. */
__device__ __forceinline__ void fqla_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

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
