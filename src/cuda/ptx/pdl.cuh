/*
 * ptx/pdl.cuh - programmatic dependent launch (PDL), the device side:
 * griddepcontrol. The host side (the launch attribute) is ../launch.cuh's (fqla_launch).
 *
 * A kernel launched with programmatic stream serialization may start while
 * the previous kernel of the stream is still running: once every CTA of that
 * kernel has executed griddepcontrol.launch_dependents (or exited). The
 * overlap saves the launch latency and the previous kernel's tail, about a
 * microsecond per edge in a CUDA graph on the H200.
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
 * A second exception: a kernel that reads nothing its predecessor writes,
 * only what was complete before the predecessor began (the predecessor was
 * launched plainly), may read it without waiting: the backward's tails
 * launch after its full chunks' (bwd_grads.cu). Such a kernel must still
 * complete after its predecessor where a later kernel reads both: one of
 * its CTAs waits before it exits.
 */
#ifndef FQLA_CUDA_PTX_PDL_CUH
#define FQLA_CUDA_PTX_PDL_CUH

/* griddepcontrol.wait: blocks until the previous kernel of the stream has
 * completed (PDL only). */
__device__ __forceinline__ void fqla_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* griddepcontrol.launch_dependents: lets the next kernel of the stream (if
 * launched with PDL) start launching. */
__device__ __forceinline__ void fqla_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#endif
