/*
 * cuda_on_cpu.c - a stand-in for the CUDA runtime calls of the GPU test
 * programs (src/cudart_c.h) and for the CUDA context, for
 * dev/tests/gpu_test_on_cpu.sh: device memory is host memory, and a context
 * asked for FQLA_BACKEND_CUDA is a FQLA_BACKEND_CPU one (fp32 chunked), so a
 * test's own logic (arguments, poison, guards, comparison) runs end to end on
 * a machine without a GPU. Graph capture is refused (status 1).
 */
#include "flashqla.h"
#include <stdlib.h>
#include <string.h>
int cudaGetDeviceCount(int *c) { *c = 1; return 0; }
int cudaSetDevice(int d) { (void)d; return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
int cudaFree(void *p) { free(p); return 0; }
int cudaMemcpy(void *d, const void *s, size_t n, int k) { (void)k; memcpy(d, s, n); return 0; }
int cudaMemsetAsync(void *p, int v, size_t n, void *s) { (void)s; memset(p, v, n); return 0; }
const char *cudaGetErrorString(int e) { (void)e; return "refused by the CPU stand-in"; }
int cudaStreamCreate(void **s) { *s = (void *)1; return 0; }
int cudaStreamDestroy(void *s) { (void)s; return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaStreamBeginCapture(void *s, int m) { (void)s; (void)m; return 1; }
int cudaStreamEndCapture(void *s, void **g) { (void)s; *g = NULL; return 1; }
int cudaGraphInstantiate(void **e, void *g, unsigned long long f) { (void)g; (void)f; *e = NULL; return 1; }
int cudaGraphLaunch(void *e, void *s) { (void)e; (void)s; return 1; }
int cudaGraphExecDestroy(void *e) { (void)e; return 0; }
int cudaGraphDestroy(void *g) { (void)g; return 0; }
fqla_status cpu_standin_backend_available(fqla_backend b, char *why, size_t n) { (void)b; (void)why; (void)n; return FQLA_STATUS_SUCCESS; }
fqla_status cpu_standin_context_create(fqla_context **c, fqla_backend b, int d)
{
    return fqla_context_create(c, b == FQLA_BACKEND_CUDA ? FQLA_BACKEND_CPU : b, d);
}
