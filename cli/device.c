/*
 * device.c - host and device buffers for the CLI. Device memory comes from
 * the CUDA runtime when the build has it (FQLA_HAVE_CUDA, set by the Makefile
 * when nvcc exists, which also links cudart); otherwise the program stays
 * pure C and every device call fails with a message.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>

void *cli_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (posix_memalign(&p, 256, bytes) != 0) return NULL;
    return p;
}

void cli_host_free(void *p)
{
    free(p);
}

#ifdef FQLA_HAVE_CUDA
#include "cudart_c.h"
#define CLI_MEMCPY_H2D CUDART_MEMCPY_H2D
#define CLI_MEMCPY_D2H CUDART_MEMCPY_D2H

static int cuda_ok(int err, const char *what, char *msg, size_t n)
{
    if (err == 0) return 0;
    if (msg) snprintf(msg, n, "%s: %s", what, cudaGetErrorString(err));
    return -1;
}

int cli_dev_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != 0) return 0;
    return n;
}

int cli_dev_alloc(int device, void **p, size_t bytes, char *err, size_t n)
{
    *p = NULL;
    if (cuda_ok(cudaSetDevice(device), "cudaSetDevice", err, n)) return -1;
    return cuda_ok(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc", err, n);
}

void cli_dev_free(void *p)
{
    if (p) cudaFree(p);
}

int cli_dev_upload(void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    return cuda_ok(cudaMemcpy(dst, src, bytes, CLI_MEMCPY_H2D), "cudaMemcpy to device", err, n);
}

int cli_dev_download(void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    return cuda_ok(cudaMemcpy(dst, src, bytes, CLI_MEMCPY_D2H), "cudaMemcpy to host", err, n);
}

int cli_dev_sync(char *err, size_t n)
{
    return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err, n);
}

#else /* !FQLA_HAVE_CUDA */

static int no_cuda(char *err, size_t n)
{
    if (err) snprintf(err, n, "flashqla was built without CUDA");
    return -1;
}

int cli_dev_count(void) { return 0; }
int cli_dev_alloc(int device, void **p, size_t bytes, char *err, size_t n)
{
    (void)device; (void)bytes;
    *p = NULL;
    return no_cuda(err, n);
}
void cli_dev_free(void *p) { (void)p; }
int cli_dev_upload(void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    (void)dst; (void)src; (void)bytes;
    return no_cuda(err, n);
}
int cli_dev_download(void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    (void)dst; (void)src; (void)bytes;
    return no_cuda(err, n);
}
int cli_dev_sync(char *err, size_t n) { return no_cuda(err, n); }

#endif
