/*
 * ptx/ptx.cuh - the whole ptx layer, one include (the sm_90a kernels use
 * most of it).
 */
#ifndef FQLA_CUDA_PTX_PTX_CUH
#define FQLA_CUDA_PTX_PTX_CUH

#include "cuda/ptx/barrier.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/common.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/matrix_ldst.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/misc.cuh"
#include "cuda/ptx/mma_sync.cuh"
#include "cuda/ptx/pdl.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"

#endif
