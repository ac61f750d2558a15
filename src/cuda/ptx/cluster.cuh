/*
 * ptx/cluster.cuh - thread-block clusters (sm_90): a CTA's rank in its
 * cluster, the cluster barrier, and distributed shared memory (another
 * CTA's shared memory reached through a shared::cluster address).
 *
 * A kernel launched with a cluster dimension (launch.cuh's
 * fqla_launch_cluster) runs its cluster's CTAs at the same time on SMs of
 * one GPC. fqla_mapa turns a shared-window address of this CTA's layout
 * into the address of the same byte in the CTA of another rank; the
 * ld / st / mbarrier forms below take such addresses. A CTA's shared memory
 * may be accessed by the others only between a cluster barrier that every
 * CTA has passed after starting (so that the target exists) and one that
 * the target waits at before it exits.
 */
#ifndef FQLA_CUDA_PTX_CLUSTER_CUH
#define FQLA_CUDA_PTX_CLUSTER_CUH

#include "cuda/ptx/common.cuh"

/* %cluster_ctarank: this CTA's rank in its cluster (0 .. size - 1). */
FQLA_DEVICE_INLINE uint32_t fqla_cluster_ctarank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
/* %cluster_nctarank: the number of CTAs in the cluster. */
FQLA_DEVICE_INLINE uint32_t fqla_cluster_nctarank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

/* barrier.cluster.arrive.release: this thread arrives at the cluster
 * barrier; its earlier writes (shared::cluster ones included) are visible
 * to every thread after that thread's wait. Every thread of every CTA of
 * the cluster arrives once per phase (.aligned: the warp's threads
 * together). */
FQLA_DEVICE_INLINE void fqla_cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
/* barrier.cluster.arrive.relaxed: the same without ordering memory (for a
 * phase that only says "this CTA exists" or "has left its reads"). */
FQLA_DEVICE_INLINE void fqla_cluster_arrive_relaxed()
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
/* barrier.cluster.wait.acquire: waits until every thread of the cluster
 * has arrived in this phase. */
FQLA_DEVICE_INLINE void fqla_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
/* arrive, then wait */
FQLA_DEVICE_INLINE void fqla_cluster_sync()
{
    fqla_cluster_arrive();
    fqla_cluster_wait();
}

/* mapa.shared::cluster: the shared::cluster address of the byte at
 * shared-window address a in the CTA of the given rank. */
FQLA_DEVICE_INLINE uint32_t fqla_mapa(uint32_t a, uint32_t rank)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}

/* st.shared::cluster.v2.f32 / ld.shared::cluster.v2.f32: 8 bytes at a
 * shared::cluster address (8-aligned). */
FQLA_DEVICE_INLINE void fqla_st_cluster_f32x2(uint32_t a, float x, float y)
{
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(x), "f"(y) : "memory");
}
FQLA_DEVICE_INLINE float2 fqla_ld_cluster_f32x2(uint32_t a)
{
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}

/* mbarrier.arrive.release.cluster on a shared::cluster address: one
 * arrival on the mbarrier of another CTA (or this one), releasing this
 * thread's earlier writes at cluster scope to the threads that wait on it
 * (the waiter's try_wait is an acquire at CTA scope; for writes from
 * another CTA it waits with fqla_mbar_try_wait_cluster). */
FQLA_DEVICE_INLINE void fqla_mbar_arrive_cluster(uint32_t a)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(a) : "memory");
}
/* mbarrier.try_wait.parity.acquire.cluster: as fqla_mbar_try_wait, with
 * the writes released by other CTAs' arrivals (fqla_mbar_arrive_cluster)
 * visible after it. */
FQLA_DEVICE_INLINE uint32_t fqla_mbar_try_wait_cluster(uint32_t addr, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(addr), "r"(parity)
                 : "memory");
    return done;
}

#endif
