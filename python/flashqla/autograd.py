"""Autograd for the chunked forward: the backward runs fqla_bwd.

One backward function serves both ways in: the eager autograd.Function
(`ChunkFunction`, cheaper per call than the dispatcher) and the autograd
formula registered on the flashqla::fwd custom op (what torch.compile
traces). Gradients come back in the dtypes the library writes (dq, dk, dv in
q's dtype; dg, dbeta, dh0, dA_log, ddt_bias in fp32, fp64 on the reference)
and are cast to each input's dtype.
"""

from __future__ import annotations

import torch

from . import ops

# positions of the forward's arguments (fwd_impl / flashqla::fwd)
_N_TENSOR_ARGS = 10   # q k v g beta A_log dt_bias initial_state cu_seqlens cu_seqlens_cpu
_N_ARGS = 14          # + scale flags output_final_state backend


def _cast(grad, like):
    if like is None or grad is None:
        return None
    return grad if grad.dtype == like.dtype else grad.to(like.dtype)


def backward(saved, scale, flags, backend, d_o, d_final_state, bwd):
    """Gradients for the forward's 14 arguments, given the saved tensors."""
    q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu = saved
    if d_o is None:
        d_o = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    else:
        if d_o.dtype != q.dtype:
            d_o = d_o.to(q.dtype)
        if d_o.stride()[-1] != 1 or 0 in d_o.stride():
            d_o = d_o.contiguous()
    if d_final_state is not None:
        if d_final_state.numel() == 0:
            d_final_state = None
        else:
            want = torch.float64 if q.dtype == torch.float64 else torch.float32
            if d_final_state.dtype != want:
                d_final_state = d_final_state.to(want)
            if not d_final_state.is_contiguous():
                d_final_state = d_final_state.contiguous()
    dq, dk, dv, dg, dbeta, dh0, dA, ddt = bwd(
        q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu, d_o, d_final_state, scale, flags,
        backend)
    gate = flags & ops.GATE_IN_KERNEL
    return (dq, dk, dv, _cast(dg, g), _cast(dbeta, beta),
            _cast(dA, A_log) if gate else None, _cast(ddt, dt_bias) if gate else None,
            _cast(dh0, h0) if h0 is not None else None,
            None, None, None, None, None, None)


class ChunkFunction(torch.autograd.Function):
    """Eager path: forward = ops.fwd_impl, backward = ops.bwd_impl."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                cu_seqlens_cpu, scale, flags, output_final_state, backend):
        o, ht = ops.fwd_impl(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                             cu_seqlens_cpu, scale, flags, output_final_state, backend)
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                              cu_seqlens_cpu)
        ctx.args = (scale, flags, backend)
        ctx.set_materialize_grads(False)
        return o, ht   # ht is None without output_final_state

    @staticmethod
    def backward(ctx, d_o, d_final_state):
        scale, flags, backend = ctx.args
        return backward(ctx.saved_tensors, scale, flags, backend, d_o, d_final_state,
                        ops.bwd_impl)


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
     scale, flags, output_final_state, backend) = inputs
    ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                          cu_seqlens_cpu)
    ctx.args = (scale, flags, backend)


def _op_backward(ctx, d_o, d_final_state):
    scale, flags, backend = ctx.args
    return backward(ctx.saved_tensors, scale, flags, backend, d_o, d_final_state,
                    ops.bwd_op)


ops.fwd_op.register_autograd(_op_backward, setup_context=_setup_context)
