/*
 * kernel/pipeline.cuh - where a use of a ring of STAGES buffers lands: the
 * stage (buffer index) and the phase parity of that stage's barriers.
 *
 * Use c = 0, 1, 2, ... of a ring goes to stage c % STAGES in lap
 * c / STAGES, and lap l of a stage is its barriers' phase of parity l & 1.
 * A consumer waits on full[stage] with `phase`; a producer refilling the
 * stage waits on empty[stage] with `phase ^ 1` (empty_parity()): in lap 0
 * that is the phase before the first, which a fresh mbarrier counts as
 * completed, so the first STAGES fills do not wait. Every kernel computes
 * stage and phase here, by index (at(c)) or by stepping (advance()), and
 * nowhere else.
 */
#ifndef FQLA_CUDA_KERNEL_PIPELINE_CUH
#define FQLA_CUDA_KERNEL_PIPELINE_CUH

#include "cuda/ptx/common.cuh"

constexpr int fqla_log2(int n) { return n <= 1 ? 0 : 1 + fqla_log2(n >> 1); }

template <int STAGES> struct fqla_pipe {
    static_assert(STAGES >= 1, "a ring has a stage");
    int stage;      /* buffer index, 0 .. STAGES - 1 */
    uint32_t phase; /* parity of the lap: the full-barrier wait's parity */

    /* use c (>= 0; int or int64_t) of the ring. A power-of-two ring by
     * mask and shift: for a signed c, % and / would cost a sign fix-up
     * the compiler cannot always prove away. */
    template <typename I> static FQLA_DEVICE_INLINE fqla_pipe at(I c)
    {
        if constexpr ((STAGES & (STAGES - 1)) == 0)
            return fqla_pipe{(int)(c & (STAGES - 1)), (uint32_t)(c >> fqla_log2(STAGES)) & 1};
        else
            return fqla_pipe{(int)(c % STAGES), (uint32_t)(c / STAGES) & 1};
    }
    /* the next use: the stage advances, and the phase flips as it wraps */
    FQLA_DEVICE_INLINE void advance()
    {
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    /* the parity a producer waits on empty[stage] with before refilling it */
    FQLA_DEVICE_INLINE uint32_t empty_parity() const { return phase ^ 1; }
};

#endif
