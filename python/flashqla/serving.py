"""Serving entry points: decode (one token per sequence) and verify (T draft
tokens per sequence) on a state pool, the way vLLM and SGLang call GDN.

Conventions:
  - state_pool [P, HV, K, V] ([P, HV, V, K] with state_v_first=True, the
    vLLM/SGLang layout), fp32 or bf16 storage, math in fp32; updated in place;
  - slots [B] int32/int64 pool rows; a negative slot (-1, padding in a
    captured CUDA graph) is skipped: its pool row is neither read nor
    written and its output rows are zeros;
  - raw gate inputs: with A_log given, `a` is the raw gate input and
    g = -exp(A_log) * softplus(a + dt_bias) is computed in the kernel;
    `b` is the beta logit, beta = sigmoid(b) (2 sigmoid(b) with
    allow_neg_eigval); q and k are l2-normalised in the kernel by default;
  - out: an optional preallocated output, written in place (as vLLM's
    core_attn_out).
Both are CUDA-graph safe on CUDA tensors (no allocation, no host read)
unless slots_cpu is given, and run under torch.compile as the custom ops
flashqla::decode / flashqla::verify (no graph break).
"""

from __future__ import annotations

import torch

from . import _lib, ops
from .chunk import _sig, check_options, check_types, fix_strides, same_device

_F32 = torch.float32
_F64 = torch.float64
_GATE_OK = (torch.float32, torch.bfloat16)


def _prepare(q, k, v, a, b, A_log, dt_bias, state_pool, slots, scale,
             use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
             state_v_first, backend, tokens_dim):
    check_options(scale, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    check_types(("q", "k", "v", "a", "b", "state_pool", "slots"), {"q": (3, 4) if not tokens_dim else (4,)},
                q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state_pool=state_pool, slots=slots)
    be = ops.backend_code(backend)
    dev = q.device
    same_device(dev, ("k", "v", "a", "b", "A_log", "dt_bias", "state_pool", "slots"),
                k, v, a, b, A_log, dt_bias, state_pool, slots)
    squeeze = False
    if not tokens_dim and q.dim() == 3:
        # decode accepts [B, H, K] / [B, HV, V] / [B, HV] (T = 1 squeezed)
        q, k, v, a, b = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), a.unsqueeze(1), b.unsqueeze(1)
        squeeze = True
    be = ops.resolve(q, be)[0]
    reference = be == _lib.BACKEND_CPU_REFERENCE
    wide = _F64 if reference and q.dtype == _F64 else _F32
    q, k, v = fix_strides(q), fix_strides(k), fix_strides(v)
    if not (a.dtype == b.dtype and (a.dtype in _GATE_OK or (reference and a.dtype == _F64))):
        a, b = a.to(wide), b.to(wide)
    a, b = fix_strides(a), fix_strides(b)
    flags = ops.pack_flags(use_qk_l2norm_in_kernel, A_log is not None, use_beta_sigmoid_in_kernel,
                           allow_neg_eigval, state_v_first)
    if A_log is not None:
        if A_log.dtype != wide:
            A_log = A_log.to(wide)
        if dt_bias is None:
            dt_bias = torch.zeros(v.shape[2], dtype=wide, device=dev)
        elif dt_bias.dtype != wide:
            dt_bias = dt_bias.to(wide)
        A_log, dt_bias = fix_strides(A_log), fix_strides(dt_bias)
    elif dt_bias is not None:
        raise ValueError("flashqla: dt_bias without A_log (give A_log to compute the gate in the kernel)")
    scale = 0.0 if scale is None else float(scale)
    return q, k, v, a, b, A_log, dt_bias, fix_strides(slots), scale, flags, be, squeeze


def _out(out, q, v, squeeze):
    B, T, HV, V = v.shape
    if out is None:
        return torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device), None
    if squeeze and out.dim() == 3:
        return out.unsqueeze(1), out
    return out, out


def _slots_host(slots_cpu, on_cuda):
    if slots_cpu is None or not on_cuda:
        return None
    if slots_cpu.device.type != "cpu":
        raise ValueError("flashqla: slots_cpu must be a CPU tensor")
    if slots_cpu.dtype != torch.int64 or not slots_cpu.is_contiguous():
        slots_cpu = slots_cpu.to(torch.int64).contiguous()
    return slots_cpu


def _decode_key(q, k, v, a, b, A_log, dt_bias, state_pool, slots, slots_cpu, out, scale,
                use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, backend):
    """decode's fast-path key (every tensor's shape, strides, dtype and device,
    and the flags), or None for a non-tensor argument (_prepare names it)."""
    try:
        p, s = state_pool, slots
        return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
                v.shape, v.stride(), v.dtype, v.device, a.shape, a.stride(), a.dtype, a.device,
                b.shape, b.stride(), b.dtype, b.device, p.shape, p.stride(), p.dtype, p.device,
                s.shape, s.stride(), s.dtype, s.device,
                None if A_log is None else (A_log.shape, A_log.stride(), A_log.dtype, A_log.device),
                None if dt_bias is None else (dt_bias.shape, dt_bias.stride(), dt_bias.dtype,
                                              dt_bias.device),
                None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                None if slots_cpu is None else _sig(slots_cpu),
                scale, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                state_v_first, backend)
    except AttributeError:
        return None


def decode(q, k, v, a, b, A_log, dt_bias, state_pool, slots, *, scale=None,
           use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
           allow_neg_eigval=False, state_v_first=False, slots_cpu=None, out=None,
           backend=None):
    """One decode step for B sequences on a state pool.

    q, k [B, 1, H, K] (or [B, H, K]); v [B, 1, HV, V] (or [B, HV, V]);
    a, b [B, 1, HV] (or [B, HV]) raw gate and beta inputs (with A_log=None,
    `a` is the log decay g itself; with use_beta_sigmoid_in_kernel=False,
    `b` is beta itself); A_log, dt_bias [HV] fp32; state_pool
    [P, HV, K, V] (or [P, HV, V, K] with state_v_first) updated in place at
    rows slots[b] (negative = padding, skipped). Returns o shaped like v
    (out, when given, is written and returned).
    """
    if scale is not None and type(scale) is not float:
        scale = float(scale)  # by value in the fast path's key (chunk.py)
    key = None
    compiling = _is_compiling()
    if not compiling:
        # Fast path (eager): a call signature seen before (see chunk.py)
        key = _decode_key(q, k, v, a, b, A_log, dt_bias, state_pool, slots, slots_cpu, out, scale,
                          use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                          state_v_first, backend)
    if key is not None:
        p, s = state_pool, slots
        e, key = _lookup(key)
        if e is not None:
            (be, device, dev, sq, sk, sv, sa, sb, sA, sdt, sp, ss, host,
             o_mode, o_shape, o_strides, o_dtype, so, sopt) = e
            if out is not None:
                o = out
            elif o_mode == _ALLOC_CPU:
                o = _empty_cpu(o_shape, o_strides, o_dtype)
            elif o_mode == _ALLOC_LIKE:
                o = _empty_like(v)
            else:
                o = _empty(o_shape, dtype=o_dtype, device=dev)
            buf = _DecodeBuffer()
            _DEC_FAST(buf, 0, q.data_ptr(), sq, k.data_ptr(), sk, v.data_ptr(), sv,
                      a.data_ptr(), sa, b.data_ptr(), sb,
                      0 if A_log is None else A_log.data_ptr(), sA,
                      0 if dt_bias is None else dt_bias.data_ptr(), sdt,
                      p.data_ptr(), sp, s.data_ptr(), ss, slots_cpu.data_ptr() if host else 0,
                      o.data_ptr(), so, 0, _ABSENT, 0, _ABSENT, sopt)
            h = _handle(be, device)
            if be == _CUDA:
                st = ops.run_cuda("decode", h.value, buf, device, dev)
            else:
                st = _RUN_DECODE(h, buf, None, _SIZE_0, None)
            if st:
                raise _lib.error(st, h.value, "decode")
            return o

    given = (q, k, v, a, b, A_log, dt_bias, slots, slots_cpu)
    (q, k, v, a, b, A_log, dt_bias, slots, scale, flags, be, squeeze) = _prepare(
        q, k, v, a, b, A_log, dt_bias, state_pool, slots, scale, use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, backend, False)
    o, user_out = _out(out, q, v, squeeze)
    if q.shape[0] == 0:  # no sequences: nothing to read or write (the library wants B >= 1)
        return user_out if user_out is not None else (o.squeeze(1) if squeeze else o)
    slots_cpu = _slots_host(slots_cpu, q.device.type == "cuda")
    if compiling:
        ops.decode_op(q, k, v, a, b, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                      scale, flags, be)
    else:
        described = ops.decode_run(q, k, v, a, b, A_log, dt_bias, state_pool, slots, slots_cpu,
                                   o, None, None, scale, flags, False, be)
    if user_out is not None:
        ret = user_out
    else:
        ret = o.squeeze(1) if squeeze else o
    if key is not None:
        _remember(key, given, (q, k, v, a, b, A_log, dt_bias, slots, slots_cpu), ret, squeeze,
                  described)
    return ret


# --------------------------------------------------------------------------
# The eager fast path of decode: call signature -> entry (the tuple unpacked
# in decode), made only after the general path ran a call successfully
# without copying or converting an argument (chunk.py has the same for the
# forward; the C library still validates every call).

_CACHE = ops.SignatureCache(256)
_lookup = _CACHE.lookup
_FAST, _LAST, _FAST_MAX = _CACHE.table, _CACHE.last, _CACHE.limit   # for the tests
_is_compiling = torch.compiler.is_compiling
_empty = torch.empty
_empty_like = torch.empty_like
_empty_cpu = ops.empty_strided_cpu
_ALLOC_CPU, _ALLOC_LIKE = ops.ALLOC_CPU, ops.ALLOC_LIKE
_handle = _lib.context_handle
_SIZE_0 = _lib.SIZE_0
_DecodeBuffer = _lib.DecodeBuffer
_DEC_FAST = _lib.DEC_FAST.pack_into
_RUN_DECODE = _lib.RAW_DECODE
_CUDA = _lib.BACKEND_CUDA
_ABSENT = _lib.META_ABSENT


def _remember(key, given, used, ret, squeeze, described):
    """Caches a successful eager decode's description when _prepare() passed
    every tensor on as given (or, for [B, H, K] inputs, as unsqueeze(1)
    views of them)."""
    for i, (x, y) in enumerate(zip(given, used)):
        if x is y or (y is None and i == 8):    # slots_cpu is dropped off CUDA
            continue
        if not (squeeze and i < 5 and y.data_ptr() == x.data_ptr()
                and ops.meta(y) == ops.meta(x.unsqueeze(1))):
            return
    be, device, ms, host, sopt = described
    # without out=, the fast path allocates the returned tensor itself (the
    # library gets its [B, 1, HV, V] description)
    entry = (be, device, used[0].device, *ms[:9], host, ops.alloc_mode(ret, given[2]),
             tuple(ret.shape), ret.stride(), ret.dtype, ms[9], sopt)
    _CACHE.store(key, entry)


def verify(q, k, v, a, b, A_log, dt_bias, state_pool, slots, *, step_states=None,
           step_slots=None, scale=None, use_qk_l2norm_in_kernel=True,
           use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False, state_v_first=False,
           slots_cpu=None, out=None, backend=None):
    """Speculative-decode verification: T draft tokens per sequence, in order.

    q, k [B, T, H, K]; v [B, T, HV, V]; a, b [B, T, HV]; the state starts at
    state_pool[slots[b]] (negative = padding). The pool row itself is left
    untouched; the state after every token t goes to exactly one of
      step_states [B, T, HV, K, V] (dtype of the pool), or
      step_slots  [B, T] int: state_pool[step_slots[b, t]] (negative = skip),
    so the engine keeps the state at the accepted position (every
    non-negative slot in slots and step_slots must be distinct). Returns o
    [B, T, HV, V].
    """
    if (step_states is None) == (step_slots is None):
        raise ValueError("flashqla.verify: give exactly one of step_states or step_slots")
    (q, k, v, a, b, A_log, dt_bias, slots, scale, flags, be, _) = _prepare(
        q, k, v, a, b, A_log, dt_bias, state_pool, slots, scale, use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, backend, True)
    same_device(q.device, ("step_states", "step_slots"), step_states, step_slots)
    if step_slots is not None:
        step_slots = fix_strides(step_slots)
    o, user_out = _out(out, q, v, False)
    if q.shape[0] == 0 or q.shape[1] == 0:  # no tokens: the pool and the steps stay as they are
        return o if user_out is None else user_out
    slots_cpu = _slots_host(slots_cpu, q.device.type == "cuda")
    if torch.compiler.is_compiling():
        ops.verify_op(q, k, v, a, b, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                      step_states, step_slots, scale, flags, be)
    else:
        ops.decode_impl(q, k, v, a, b, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                        step_states, step_slots, scale, flags, True, be)
    return o if user_out is None else user_out
