/*
 * cudart_c.h - the CUDA runtime calls made from C sources (the flashqla
 * program's device buffers and timing, the GPU tests), declared by hand.
 * Include it only where FQLA_HAVE_CUDA is defined: only then is the runtime
 * (libcudart_static) linked in.
 *
 * NOTE: <cuda_runtime_api.h> is not used because it is not C99-pedantic
 * clean and the C sources are compiled by the C compiler without the CUDA
 * include path. The declarations below follow the runtime's stable C ABI:
 * cudaError_t and the runtime's enums are C enums, passed as int (0 is
 * cudaSuccess); streams, events and graphs are opaque pointers, passed as
 * void *.
 */
#ifndef FQLA_CUDART_C_H
#define FQLA_CUDART_C_H

#include <stddef.h>

/* cudaMemcpyKind */
#define CUDART_MEMCPY_H2D 1
#define CUDART_MEMCPY_D2H 2
/* cudaStreamCaptureMode */
#define CUDART_CAPTURE_GLOBAL 0
#define CUDART_CAPTURE_THREAD_LOCAL 1

/* devices, memory, errors */
extern int cudaGetDeviceCount(int *count);
extern int cudaSetDevice(int device);
extern int cudaDeviceSynchronize(void);
extern int cudaMalloc(void **ptr, size_t bytes);
extern int cudaFree(void *ptr);
extern int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
extern int cudaMemsetAsync(void *ptr, int value, size_t bytes, void *stream);
extern const char *cudaGetErrorString(int err);

/* events */
extern int cudaEventCreate(void **event);
extern int cudaEventDestroy(void *event);
extern int cudaEventRecord(void *event, void *stream);
extern int cudaEventSynchronize(void *event);
extern int cudaEventElapsedTime(float *ms, void *start, void *end);

/* streams and graph capture */
extern int cudaStreamCreate(void **stream);
extern int cudaStreamDestroy(void *stream);
extern int cudaStreamSynchronize(void *stream);
extern int cudaStreamBeginCapture(void *stream, int mode);
extern int cudaStreamEndCapture(void *stream, void **graph);
extern int cudaGraphInstantiate(void **exec, void *graph, unsigned long long flags);
extern int cudaGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
extern int cudaGraphLaunch(void *exec, void *stream);
extern int cudaGraphExecDestroy(void *exec);
extern int cudaGraphDestroy(void *graph);

#endif /* FQLA_CUDART_C_H */
