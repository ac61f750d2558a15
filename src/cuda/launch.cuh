/*
 * launch.cuh - how every CUDA kernel of the library is launched (host side):
 * - fqla_smem_limit: a kernel's dynamic shared-memory limit, raised once
 *   per (kernel, device) and only when a launch needs more than was set
 *   before. cudaFuncSetAttribute stays out of later calls, so that they
 *   stay cheap (and capturable) in CUDA graphs. Thread-safe: the fast path
 *   is one atomic load; raising the limit takes a lock.
 * - fqla_launch: one launch, with programmatic dependent launch (PDL) when
 *   pdl is set (the kernel then keeps ptx/pdl.cuh's rule), plainly otherwise or
 *   when the stream or driver refuses the attribute.
 * - fqla_launch_cluster: one launch in clusters of cluster_x CTAs along x
 *   (ptx/cluster.cuh); grid.x a multiple of cluster_x.
 */
#ifndef FQLA_CUDA_LAUNCH_CUH
#define FQLA_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <stddef.h>

#define FQLA_LAUNCH_MAX_DEVICES 64

/* The limit set so far for one kernel on each device (bytes; 0: none). */
struct fqla_smem_cache {
    std::atomic<size_t> bytes[FQLA_LAUNCH_MAX_DEVICES];
};

static inline std::mutex &fqla_smem_lock()
{
    static std::mutex m;
    return m;
}

/* Raises kernel's dynamic shared-memory limit on the current device to at
 * least bytes. cache: one per kernel (a static beside its launcher). */
template <typename... Params>
static cudaError_t fqla_smem_limit(fqla_smem_cache &cache, void (*kernel)(Params...), size_t bytes)
{
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const bool cached = dev >= 0 && dev < FQLA_LAUNCH_MAX_DEVICES;
    if (cached && cache.bytes[dev].load(std::memory_order_acquire) >= bytes) return cudaSuccess;
    std::lock_guard<std::mutex> hold(fqla_smem_lock());
    if (cached && cache.bytes[dev].load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) return err;
    if (cached) cache.bytes[dev].store(bytes, std::memory_order_release);
    return cudaSuccess;
}

/* A launch's shape, without attributes. */
static inline cudaLaunchConfig_t fqla_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    return cfg;
}

/* Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic
 * stream serialization when pdl is set; returns the launch error. */
template <typename... Params, typename... Args>
static cudaError_t fqla_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               int pdl, Args &&...args)
{
    cudaLaunchConfig_t cfg = fqla_launch_config(grid, block, smem, stream);
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

/* Launches kernel over grid in clusters of cluster_x consecutive CTAs along
 * x (cluster_x <= 8, the portable size; grid.x a multiple of it); returns
 * the launch error (cudaErrorInvalidValue for a grid it cannot divide). */
template <typename... Params, typename... Args>
static cudaError_t fqla_launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t stream, unsigned cluster_x, Args &&...args)
{
    if (cluster_x == 0 || cluster_x > 8 || grid.x % cluster_x) return cudaErrorInvalidValue;
    cudaLaunchConfig_t cfg = fqla_launch_config(grid, block, smem, stream);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster_x;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

#endif
