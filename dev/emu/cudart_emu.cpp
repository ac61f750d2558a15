/*
 * cudart_emu.cpp - the CUDA runtime calls of the library and its GPU tests,
 * for a build whose kernels run under cuda_emu.h: one "device" (an H200 as
 * the planners see it: 132 SMs, compute capability 9.0), device memory in
 * host memory, every call synchronous, no graphs (capture is refused), and
 * one driver entry point, cuTensorMapEncodeTiled, which writes the map in
 * the emulator's own form (tma_emu.h).
 */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "dev/emu/tma_emu.h"

#include <cstdlib>
#include <cstring>

extern "C" {

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties_v2(cudaDeviceProp *p, int d)
{
    if (d != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    strcpy(p->name, "CPU emulator (dev/emu)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->sharedMemPerBlockOptin = 232448;
    p->sharedMemPerMultiprocessor = 233472;
    p->maxThreadsPerBlock = 1024;
    p->l2CacheSize = 60 << 20;
    p->totalGlobalMem = (size_t)16 << 30;
    p->warpSize = 32;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) { return cudaGetDeviceProperties_v2(p, d); }
cudaError_t cudaDriverGetVersion(int *v)
{
    *v = 13000;
    return cudaSuccess;
}
static CUresult encode_tiled(CUtensorMap *m, CUtensorMapDataType type, cuuint32_t rank, void *base,
                             const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                             const cuuint32_t *estr, CUtensorMapInterleave, CUtensorMapSwizzle sw,
                             CUtensorMapL2promotion, CUtensorMapFloatOOBfill)
{
    fqla_emu_tmap t;
    memset(&t, 0, sizeof t);
    if (rank < 1 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
    t.base = (char *)base;
    t.rank = rank;
    t.esize = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 2;
    for (cuuint32_t i = 0; i < rank; i++) {
        if (estr[i] != 1) return CUDA_ERROR_INVALID_VALUE;
        /* the driver's rules: no empty dimension (an H100 refused a map of
         * zero tokens that this emulator once took), boxes of 1 to 256 */
        if (dims[i] == 0 || dims[i] > (1ull << 32) || box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
        t.dims[i] = dims[i];
        t.box[i] = box[i];
        t.strides[i] = i == 0 ? t.esize : strides[i - 1];
    }
    t.swizzle = sw == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : sw == CU_TENSOR_MAP_SWIZZLE_64B ? 64
              : sw == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : 0;
    if (t.swizzle && box[0] * t.esize > t.swizzle) return CUDA_ERROR_INVALID_VALUE; /* the hardware's rule */
    memset(m, 0, sizeof *m);
    memcpy(m, &t, sizeof t);
    return CUDA_SUCCESS;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char *name, void **fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult *r)
{
    if (!strcmp(name, "cuTensorMapEncodeTiled")) {
        *fn = (void *)&encode_tiled;
        if (r) *r = cudaDriverEntryPointSuccess;
        return cudaSuccess;
    }
    *fn = nullptr;
    if (r) *r = cudaDriverEntryPointSymbolNotFound;
    return cudaErrorSymbolNotFound;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "refused by the CPU emulator"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulator"; }
cudaError_t cudaFuncSetAttribute(const void *, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int, size_t)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *, int, size_t, unsigned int)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n)
{
    /* cudaMalloc's alignment (at least 256 bytes) */
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind)
{
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t)
{
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    *s = reinterpret_cast<cudaStream_t>(new char[1]);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    delete[] reinterpret_cast<char *>(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g)
{
    *g = nullptr;
    return cudaErrorNotSupported;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *st)
{
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t, unsigned long long)
{
    *e = nullptr;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t, unsigned long long)
{
    *e = nullptr;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = reinterpret_cast<cudaEvent_t>(new char[1]);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete[] reinterpret_cast<char *>(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t)
{
    *ms = 0.f;
    return cudaSuccess;
}
}
