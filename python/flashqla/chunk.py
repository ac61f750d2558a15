"""flashqla.chunk_gated_delta_rule: FLA's chunk_gated_delta_rule on
flashqla's kernels (CPU tensors -> the CPU backend, CUDA tensors -> the
sm_90a backend, float64 CPU tensors -> the fp64 reference).

The wrapper turns FLA's argument conventions into the C contract with
differentiable torch operations (dtype casts, copies of tensors whose last
dimension is not contiguous), so autograd casts the gradients back, then
calls the forward: directly (eager), through an autograd.Function when a
gradient is needed, or through the flashqla::fwd custom op under
torch.compile.
"""

from __future__ import annotations

import torch

from . import _lib, ops
from .autograd import ChunkFunction

_F32 = torch.float32
_F64 = torch.float64
_GATE_OK = (torch.float32, torch.bfloat16)


def fix_strides(x):
    """x itself when the library can read it as is (last dimension contiguous,
    no broadcast dimension), else a contiguous copy."""
    st = x.stride()
    if st and (st[-1] != 1 or 0 in st):
        return x.contiguous()
    return x


def _needs_grad(*xs):
    if not torch.is_grad_enabled():
        return False
    for x in xs:
        if x is not None and x.requires_grad:
            return True
    return False


def same_device(dev, names, *xs):
    for name, x in zip(names, xs):
        if x is not None and x.device != dev:
            raise ValueError(f"flashqla: {name} is on {x.device} but q is on {dev}")


def chunk_gated_delta_rule(
    q, k, v, g, beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    *,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    chunk_indices=None,
    cp_context=None,
    chunk_size=None,
    backend=None,
):
    """Gated delta rule, chunked prefill, with FLA's semantics.

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] (g = log decay,
    or the raw gate input with use_gate_in_kernel; beta, or its logit with
    use_beta_sigmoid_in_kernel); initial_state [N, HV, K, V] ([N, HV, V, K]
    with state_v_first); cu_seqlens [N + 1] with B == 1 for packed
    variable-length input (cu_seqlens_cpu: its host copy, which lets the CUDA
    backend plan without reading device memory).

    Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] fp32 or
    None). Differentiable in q, k, v, g, beta, A_log, dt_bias, initial_state.

    Arguments after use_qk_l2norm_in_kernel are keyword-only: FLA's
    positional order differs from this one there, and a positional mix-up
    would silently change the math. chunk_indices and chunk_size are
    accepted and ignored (the chunking is internal); cp_context (inter-card
    context parallel) is not supported. backend: None (by device and dtype),
    'cpu', 'cuda' or 'reference' (the fp64 oracle, CPU tensors).
    """
    args = prepare(q, k, v, g, beta, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                   use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
                   cu_seqlens_cpu, cp_context, backend)
    if torch.compiler.is_compiling():
        o, ht = ops.fwd_op(*args)
    elif _needs_grad(*args[:8]):
        o, ht = ChunkFunction.apply(*args)
    else:
        o, ht = ops.fwd_impl(*args)
    return o, (ht if output_final_state else None)


def prepare(q, k, v, g, beta, scale, initial_state, output_final_state,
            use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
            cu_seqlens_cpu, cp_context, backend):
    """FLA's arguments -> the 14 arguments of ops.fwd_impl / flashqla::fwd."""
    if cp_context is not None:
        raise NotImplementedError("flashqla: cp_context (inter-card context parallel) is not supported")
    be = ops.backend_code(backend)
    dev = q.device
    same_device(dev, ("k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"),
                k, v, g, beta, initial_state, A_log, dt_bias)
    be = ops.resolve(q, be)[0]
    on_cuda = be == _lib.BACKEND_CUDA
    reference = be == _lib.BACKEND_CPU_REFERENCE
    wide = _F64 if reference and q.dtype == _F64 else _F32

    q = fix_strides(q)
    k = fix_strides(k)
    v = fix_strides(v)
    # g and beta share one dtype: fp32 or bf16 (fp64 on the reference)
    if not (g.dtype == beta.dtype and (g.dtype in _GATE_OK or (reference and g.dtype == _F64))):
        g = g.to(wide)
        beta = beta.to(wide)
    g = fix_strides(g)
    beta = fix_strides(beta)

    flags = 0
    if use_qk_l2norm_in_kernel:
        flags |= ops.L2NORM
    if use_beta_sigmoid_in_kernel:
        flags |= ops.BETA_SIGMOID
        # as in FLA, the factor 2 belongs to the in-kernel sigmoid only
        if allow_neg_eigval:
            flags |= ops.NEG_EIGVAL
    if state_v_first:
        flags |= ops.STATE_V_FIRST
    if use_gate_in_kernel:
        flags |= ops.GATE_IN_KERNEL
        if A_log is None:
            raise ValueError("flashqla: use_gate_in_kernel=True needs A_log [HV]")
        if A_log.dtype != wide:
            A_log = A_log.to(wide)
        if dt_bias is None:
            dt_bias = torch.zeros(v.shape[2], dtype=wide, device=dev)
        elif dt_bias.dtype != wide:
            dt_bias = dt_bias.to(wide)
        A_log = fix_strides(A_log)
        dt_bias = fix_strides(dt_bias)
    else:
        # FLA ignores A_log / dt_bias without use_gate_in_kernel
        A_log = dt_bias = None

    if initial_state is not None:
        if initial_state.dtype != wide:
            initial_state = initial_state.to(wide)
        initial_state = fix_strides(initial_state)

    if cu_seqlens is not None:
        if cu_seqlens.device != dev:
            # a host cu_seqlens with device tensors: it doubles as the host copy
            if cu_seqlens_cpu is None and cu_seqlens.device.type == "cpu":
                cu_seqlens_cpu = cu_seqlens
            cu_seqlens = cu_seqlens.to(dev, non_blocking=True)
        cu_seqlens = fix_strides(cu_seqlens)
        if on_cuda and cu_seqlens_cpu is not None:
            if cu_seqlens_cpu.dtype != torch.int64 or not cu_seqlens_cpu.is_contiguous():
                cu_seqlens_cpu = cu_seqlens_cpu.to(torch.int64).contiguous()
            if cu_seqlens_cpu.device.type != "cpu":
                raise ValueError("flashqla: cu_seqlens_cpu must be a CPU tensor")
        else:
            cu_seqlens_cpu = None
    else:
        cu_seqlens_cpu = None

    scale = 0.0 if scale is None else float(scale)
    return (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
            scale, flags, bool(output_final_state), be)
