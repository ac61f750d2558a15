"""The flashqla operations on torch tensors, and their torch.library
registrations (flashqla::fwd, flashqla::bwd, flashqla::decode,
flashqla::verify) with fake implementations for torch.compile.

Each operation has one implementation (`*_impl`), a plain Python function
that packs the tensors into the C argument struct, takes a per-thread context
for (backend, device), sizes and allocates the workspace (CUDA) and calls the
library on the current stream. The registered custom ops call exactly these
functions. The public wrappers (chunk.py, serving.py) call the impls
directly in eager mode (fwd_run / decode_run, which also return the call's
description for the wrappers' per-signature fast paths), because a call
through the torch dispatcher costs about 25 us (torch.library.custom_op,
torch 2.15, measured) while the eager budget is 20 us; under
torch.compile they call the registered ops. The tensors are packed as
pointers plus metadata strings (meta(), _lib.FWD_FAST / DEC_FAST): fewer
values to pack, and strings a fast path can reuse.

Inputs reaching an impl are already normalised by the wrappers: dtypes the
library takes, the last dimension contiguous, every tensor on one device.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from . import _lib

# --------------------------------------------------------------------------
# Tensor -> packed fqla_tensor values

DTYPES = {
    torch.float32: _lib.DTYPE_F32,
    torch.float16: _lib.DTYPE_F16,
    torch.bfloat16: _lib.DTYPE_BF16,
    torch.float64: _lib.DTYPE_F64,
    torch.int32: _lib.DTYPE_I32,
    torch.int64: _lib.DTYPE_I64,
}
_ZEROS = (0,) * _lib.MAX_DIMS
_PADS = tuple(_ZEROS[n:] for n in range(_lib.MAX_DIMS + 1))
_ABSENT = _lib.ABSENT


def tv(x):
    """The 15 packed values of the fqla_tensor describing x (absent for None)."""
    if x is None:
        return _ABSENT
    s = x.shape
    n = len(s)
    pad = _PADS[n]
    return (x.data_ptr(), DTYPES[x.dtype], n, *s, *pad, *x.stride(), *pad)


# Outputs of the eager fast paths on the CPU: torch's own fast allocator for
# compiled code (inductor's empty_strided_cpu; no dispatcher, 0.5 us instead
# of 1.1 us for empty_like here). Private, so optional.
try:
    from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided_cpu
except ImportError:  # pragma: no cover - older or newer torch
    empty_strided_cpu = None

ALLOC_CPU, ALLOC_LIKE, ALLOC_EMPTY = 0, 1, 2



class SignatureCache:
    """Call signature -> description of a call, for the eager fast paths of
    chunk.py (forward) and serving.py (decode). The last hit is compared
    first, without hashing; the table starts over when it is full."""

    __slots__ = ("table", "last", "limit")

    def __init__(self, limit=256):
        self.table = {}
        self.last = [((), None)]        # [(key, entry)] of the last hit
        self.limit = limit

    def lookup(self, key):
        """(entry or None, key); key comes back None when it cannot be
        hashed or compared, and then the call is not cached either."""
        try:
            last = self.last[0]
            if key == last[0]:
                return last[1], key
            e = self.table.get(key)
            if e is not None:
                self.last[0] = (key, e)
            return e, key
        except Exception:
            return None, None

    def store(self, key, entry):
        if len(self.table) >= self.limit:
            self.table.clear()
        self.table[key] = entry
        self.last[0] = (key, entry)

def alloc_mode(out, like):
    """How a fast path recreates `out` (a fresh output of the general path)
    for a call of the same signature: empty_strided_cpu on the CPU, else
    empty_like(like) when that gives out's metadata (empty_like of a dense
    tensor keeps its strides), else torch.empty."""
    if out.device.type == "cpu" and empty_strided_cpu is not None:
        return ALLOC_CPU
    if like is not None and like.device == out.device and meta(like) == meta(out):
        return ALLOC_LIKE
    return ALLOC_EMPTY


_PACK_META = _lib.META.pack
META_ABSENT = _lib.META_ABSENT


def meta(x):
    """The fqla_tensor of x less its data pointer, as the bytes the fast
    packers take (absent for None). Depends only on x's dtype, shape and
    strides, so the wrappers cache it per call signature."""
    if x is None:
        return META_ABSENT
    s = x.shape
    n = len(s)
    pad = _PADS[n]
    return _PACK_META(DTYPES[x.dtype], n, *s, *pad, *x.stride(), *pad)


# Option bits of the `flags` argument of the registered ops (one int keeps
# the op schemas short).
L2NORM = 1
GATE_IN_KERNEL = 2
BETA_SIGMOID = 4
NEG_EIGVAL = 8
STATE_V_FIRST = 16


def pack_flags(l2norm, gate_in_kernel, beta_sigmoid, neg_eigval, state_v_first):
    """The option bits for the registered ops. As in FLA, the factor 2 of
    allow_neg_eigval belongs to the in-kernel sigmoid only."""
    flags = L2NORM if l2norm else 0
    if beta_sigmoid:
        flags |= BETA_SIGMOID
        if neg_eigval:
            flags |= NEG_EIGVAL
    if state_v_first:
        flags |= STATE_V_FIRST
    if gate_in_kernel:
        flags |= GATE_IN_KERNEL
    return flags


_OPTIONS = {}


_OPTIONS_META = {}


def options_meta(scale, flags):
    """fqla_options as the bytes the fast packers take (memoised)."""
    key = (scale, flags)
    m = _OPTIONS_META.get(key)
    if m is None:
        m = _lib.OPT.pack(*options(scale, flags))
        if len(_OPTIONS_META) < 4096:
            _OPTIONS_META[key] = m
    return m



def options(scale, flags):
    """The 6 packed values of fqla_options (memoised: calls repeat them)."""
    key = (scale, flags)
    opt = _OPTIONS.get(key)
    if opt is None:
        opt = (float(scale), 1 if flags & L2NORM else 0, 1 if flags & GATE_IN_KERNEL else 0,
               1 if flags & BETA_SIGMOID else 0, 1 if flags & NEG_EIGVAL else 0,
               1 if flags & STATE_V_FIRST else 0)
        if len(_OPTIONS) < 4096:
            _OPTIONS[key] = opt
    return opt


# Backend codes of the `backend` argument: the fqla_backend values, plus AUTO.
AUTO = -1
_NAMES = {None: AUTO, "auto": AUTO, "cpu": _lib.BACKEND_CPU, "cuda": _lib.BACKEND_CUDA,
          "reference": _lib.BACKEND_CPU_REFERENCE}


def backend_code(name):
    try:
        return _NAMES[name]
    except KeyError:
        raise ValueError(f"backend must be one of None, 'auto', 'cpu', 'cuda', 'reference'; got {name!r}") from None


def resolve(x, backend):
    """(fqla_backend, device ordinal) for tensors living where x lives.
    `backend` is AUTO or an fqla_backend value; the wrappers pass the value
    they resolved already, so CPU calls skip the device lookup."""
    if backend == _lib.BACKEND_CPU or backend == _lib.BACKEND_CPU_REFERENCE:
        if x.is_cuda:
            raise ValueError("flashqla: the CPU backends take CPU tensors; these are on " + str(x.device))
        return backend, 0
    dev = x.device
    if dev.type == "cuda":
        if backend not in (AUTO, _lib.BACKEND_CUDA):
            raise ValueError("flashqla: the CPU backends take CPU tensors; these are on " + str(dev))
        idx = dev.index
        return _lib.BACKEND_CUDA, torch.cuda.current_device() if idx is None else idx
    if dev.type != "cpu":
        raise NotImplementedError(f"flashqla: tensors on {dev.type} are not supported (cpu or cuda)")
    if backend == _lib.BACKEND_CUDA:
        raise ValueError("flashqla: backend 'cuda' takes CUDA tensors; these are on the CPU")
    if backend == AUTO:
        # fp64 only exists in the reference (the oracle; used by gradcheck)
        return (_lib.BACKEND_CPU_REFERENCE if x.dtype == torch.float64 else _lib.BACKEND_CPU), 0
    return backend, 0


def _stream(device):
    try:
        return torch._C._cuda_getCurrentRawStream(device)
    except AttributeError:  # older torch
        return torch.cuda.current_stream(device).cuda_stream


_SIZE_T = ctypes.c_size_t
_RUN = {op: getattr(_lib.lib, "fqla_" + op) for op in ("fwd", "bwd", "decode", "verify")}
_WORKSPACE = {op: getattr(_lib.lib, f"fqla_{op}_workspace_size")
              for op in ("fwd", "bwd", "decode", "verify")}


def run_cuda(op, ctx, buf, device, dev):
    """fqla_<op> on the CUDA backend: sizes and allocates the workspace on
    torch.device dev (ordinal `device`) and runs on the current stream;
    returns the status."""
    size = _SIZE_T()
    st = _WORKSPACE[op](ctx, buf, ctypes.byref(size))
    if st:
        return st
    n = size.value
    # the caching allocator is stream-ordered: freeing ws when this
    # returns is safe even though the kernels have not run yet
    ws = torch.empty(n, dtype=torch.uint8, device=dev) if n else None
    return _RUN[op](ctx, buf, ws.data_ptr() if n else None, n, _stream(device))


def _call(op, be, device, buf, like):
    """Runs fqla_<op> on the packed args in buf; raises on failure."""
    ctx = _lib.context(be, device)
    if be == _lib.BACKEND_CUDA:
        st = run_cuda(op, ctx, buf, device, like.device)
    else:
        st = _RUN[op](ctx, buf, None, 0, None)
    if st:
        raise _lib.error(st, ctx, op)


def _host_ptr(x):
    return x.data_ptr() if x is not None else 0


def _ptr(x):
    return 0 if x is None else x.data_ptr()


# --------------------------------------------------------------------------
# Forward


def state_shape(N, HV, K, V, flags):
    return (N, HV, V, K) if flags & STATE_V_FIRST else (N, HV, K, V)


def fwd_alloc(q, v, initial_state, cu_seqlens, flags, output_final_state, state_dtype, out=None,
              with_o=True):
    """o (out where given: a [B, T, HV, V] tensor or view of v's dtype and
    device; None without with_o), and the final state (None when not asked
    for)."""
    B, T, HV, V = v.shape
    o = out
    if with_o and out is None:
        o = v.new_empty((B, T, HV, V))  # o has v's (= q's) dtype and device
    elif not with_o:
        o = None
    if not output_final_state:
        return o, None
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    shape = state_shape(N, HV, q.shape[3], V, flags)
    if initial_state is not None:       # the final state takes the initial state's dtype
        return o, initial_state.new_empty(shape)
    return o, torch.empty(shape, dtype=state_dtype, device=q.device)


def state_dtype_for(q, initial_state):
    if initial_state is not None:
        return initial_state.dtype
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def fwd_run(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
            scale, flags, output_final_state, backend, out=None, final_only=False):
    """Runs the forward (o written into out where given, e.g. a token range of
    a larger output: the library takes strided tensors; final_only: no o at
    all, the final state alone, which the library computes without the
    output's work: the CPU backends, and CUDA at K = 64 / 128 with V a multiple
    of 64, elsewhere refused by name); returns (o or None,
    final_state or None, description), the
    description being what depends only on the call's signature: (backend,
    device ordinal, the metadata strings of the 11 tensors of
    fqla_fwd_args in order, whether the host copy of cu_seqlens is passed,
    the options string). The eager fast path caches it (chunk.py)."""
    be, device = resolve(q, backend)
    o, ht = fwd_alloc(q, v, initial_state, cu_seqlens, flags, output_final_state or final_only,
                      torch.float64 if q.dtype == torch.float64 else torch.float32, out, not final_only)
    host = be == _lib.BACKEND_CUDA and cu_seqlens_cpu is not None
    ms = (meta(q), meta(k), meta(v), meta(g), meta(beta), meta(A_log), meta(dt_bias),
          meta(initial_state), meta(cu_seqlens), meta(o), meta(ht))
    sopt = options_meta(scale, flags)
    buf = _lib.FwdBuffer()
    _lib.FWD_FAST.pack_into(
        buf, 0, q.data_ptr(), ms[0], k.data_ptr(), ms[1], v.data_ptr(), ms[2],
        g.data_ptr(), ms[3], beta.data_ptr(), ms[4], _ptr(A_log), ms[5], _ptr(dt_bias), ms[6],
        _ptr(initial_state), ms[7], _ptr(cu_seqlens), ms[8],
        cu_seqlens_cpu.data_ptr() if host else 0, _ptr(o), ms[9], _ptr(ht), ms[10], sopt)
    _call("fwd", be, device, buf, q)
    return o, ht, (be, device, ms, host, sopt)


def fwd_impl(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
             scale, flags, output_final_state, backend, out=None, final_only=False):
    """Runs the forward; returns (o, final_state or None); with final_only
    (None, final_state)."""
    o, ht, _ = fwd_run(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                       cu_seqlens_cpu, scale, flags, output_final_state, backend, out, final_only)
    return o, ht


def _fwd_outputs(o, ht, state_dtype):
    # a custom op returns tensors only: an absent final state is an empty one
    if ht is None:
        ht = o.new_empty((0,), dtype=state_dtype)
    return o, ht


@torch.library.custom_op("flashqla::fwd", mutates_args=())
def fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
           initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
           cu_seqlens_cpu: Optional[torch.Tensor], scale: float, flags: int,
           output_final_state: bool, backend: int) -> tuple[torch.Tensor, torch.Tensor]:
    o, ht = fwd_impl(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                     cu_seqlens_cpu, scale, flags, output_final_state, backend)
    return _fwd_outputs(o, ht, state_dtype_for(q, initial_state))


@fwd_op.register_fake
def _fwd_fake(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
              scale, flags, output_final_state, backend):
    sd = state_dtype_for(q, initial_state)
    o, ht = fwd_alloc(q, v, initial_state, cu_seqlens, flags, output_final_state, sd)
    return _fwd_outputs(o, ht, sd)


# --------------------------------------------------------------------------
# Backward

def bwd_alloc(q, k, v, initial_state, A_log, flags):
    gd = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, T, HV, V = v.shape
    dev = q.device
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dg = torch.empty((B, T, HV), dtype=gd, device=dev)
    dbeta = torch.empty((B, T, HV), dtype=gd, device=dev)
    # absent gradients are distinct empty tensors: custom-op outputs may not alias
    dh0 = torch.empty(initial_state.shape if initial_state is not None else (0,),
                      dtype=gd, device=dev)
    heads = (HV,) if flags & GATE_IN_KERNEL else (0,)
    dA = torch.empty(heads, dtype=gd, device=dev)
    ddt = torch.empty(heads, dtype=gd, device=dev)
    return dq, dk, dv, dg, dbeta, dh0, dA, ddt


def bwd_impl(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
             d_o, d_final_state, scale, flags, backend, dh0_only=False):
    """The backward: (dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias).

    dh0_only=True asks the library for the gradient of initial_state alone
    (fqla_bwd with the other gradients absent: the backends then skip the
    forward state pass and the per-token gradients); it needs initial_state,
    and returns (None, None, None, None, None, dh0, None, None) with dh0
    equal, bit for bit, to the full backward's."""
    be, device = resolve(q, backend)
    gate = flags & GATE_IN_KERNEL
    if dh0_only:
        if initial_state is None:
            raise ValueError("bwd_impl(dh0_only=True) needs initial_state: "
                             "its gradient is the only output")
        gd = torch.float64 if q.dtype == torch.float64 else torch.float32
        dh0 = torch.empty(initial_state.shape, dtype=gd, device=q.device)
        outs = (None, None, None, None, None, dh0, None, None)
    else:
        outs = bwd_alloc(q, k, v, initial_state, A_log, flags)
    dq, dk, dv, dg, dbeta, dh0, dA, ddt = outs
    buf = _lib.BwdBuffer()
    _lib.BWD_PACK.pack_into(
        buf, 0, *tv(q), *tv(k), *tv(v), *tv(g), *tv(beta), *tv(A_log), *tv(dt_bias),
        *tv(initial_state), *tv(cu_seqlens),
        _host_ptr(cu_seqlens_cpu) if be == _lib.BACKEND_CUDA else 0,
        *tv(d_o), *tv(d_final_state), *tv(dq), *tv(dk), *tv(dv), *tv(dg), *tv(dbeta),
        *tv(dh0 if initial_state is not None else None),
        *tv(dA if gate else None), *tv(ddt if gate else None), *options(scale, flags))
    _call("bwd", be, device, buf, q)
    return outs


@torch.library.custom_op("flashqla::bwd", mutates_args=())
def bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
           initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
           cu_seqlens_cpu: Optional[torch.Tensor], d_o: torch.Tensor,
           d_final_state: Optional[torch.Tensor], scale: float, flags: int,
           backend: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return bwd_impl(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
                    d_o, d_final_state, scale, flags, backend)


@bwd_op.register_fake
def _bwd_fake(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
              d_o, d_final_state, scale, flags, backend):
    return bwd_alloc(q, k, v, initial_state, A_log, flags)


# --------------------------------------------------------------------------
# Decode and verify (in-place on the pool and on the caller's output)


def decode_run(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
               step_states, step_slots, scale, flags, verify, backend):
    """Runs decode or verify; returns the description of the call (as
    fwd_run's, for the 12 tensors of fqla_decode_args)."""
    be, device = resolve(q, backend)
    host = be == _lib.BACKEND_CUDA and slots_cpu is not None
    ms = (meta(q), meta(k), meta(v), meta(g), meta(beta), meta(A_log), meta(dt_bias),
          meta(state_pool), meta(slots), meta(o), meta(step_states), meta(step_slots))
    sopt = options_meta(scale, flags)
    buf = _lib.DecodeBuffer()
    _lib.DEC_FAST.pack_into(
        buf, 0, q.data_ptr(), ms[0], k.data_ptr(), ms[1], v.data_ptr(), ms[2],
        g.data_ptr(), ms[3], beta.data_ptr(), ms[4], _ptr(A_log), ms[5], _ptr(dt_bias), ms[6],
        state_pool.data_ptr(), ms[7], slots.data_ptr(), ms[8], slots_cpu.data_ptr() if host else 0,
        o.data_ptr(), ms[9], _ptr(step_states), ms[10], _ptr(step_slots), ms[11], sopt)
    _call("verify" if verify else "decode", be, device, buf, q)
    return be, device, ms, host, sopt


def decode_impl(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                step_states, step_slots, scale, flags, verify, backend):
    decode_run(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
               step_states, step_slots, scale, flags, verify, backend)


@torch.library.custom_op("flashqla::decode", mutates_args=("state_pool", "o"))
def decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              beta: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
              state_pool: torch.Tensor, slots: torch.Tensor, slots_cpu: Optional[torch.Tensor],
              o: torch.Tensor, scale: float, flags: int, backend: int) -> None:
    decode_impl(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                None, None, scale, flags, False, backend)


@decode_op.register_fake
def _decode_fake(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                 scale, flags, backend):
    return None


@torch.library.custom_op("flashqla::verify", mutates_args=("state_pool", "o", "step_states"))
def verify_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              beta: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
              state_pool: torch.Tensor, slots: torch.Tensor, slots_cpu: Optional[torch.Tensor],
              o: torch.Tensor, step_states: Optional[torch.Tensor],
              step_slots: Optional[torch.Tensor], scale: float, flags: int,
              backend: int) -> None:
    decode_impl(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                step_states, step_slots, scale, flags, True, backend)


@verify_op.register_fake
def _verify_fake(q, k, v, g, beta, A_log, dt_bias, state_pool, slots, slots_cpu, o,
                 step_states, step_slots, scale, flags, backend):
    return None


# --------------------------------------------------------------------------
# "Would this run?" without running or allocating: the library's
# fqla_*_supported reads no data, so the outputs are described at made-up,
# far-apart, 256-byte aligned addresses (only their shapes, dtypes and spans
# are checked, and those spans cannot overlap real tensors' addresses).

_FAKE_BASE = 1 << 60
_FAKE_STEP = 1 << 52


def _fake(i, shape, dtype):
    strides = []
    n = 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return (_FAKE_BASE + i * _FAKE_STEP, DTYPES[dtype], len(shape), *shape,
            *_ZEROS[len(shape):], *reversed(strides), *_ZEROS[len(shape):])


def fwd_supported(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, cu_seqlens_cpu,
                  scale, flags, output_final_state, backend, backward=False):
    """None when the backend runs this forward (and its backward, with
    backward=True); otherwise the exception the call would raise."""
    be, device = resolve(q, backend)
    lib = _lib.lib
    ctx = _lib.context(be, device)
    B, T, HV, V = v.shape
    H, K = q.shape[2], q.shape[3]
    sd = state_dtype_for(q, initial_state)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    host = _host_ptr(cu_seqlens_cpu) if be == _lib.BACKEND_CUDA else 0
    common = (*tv(q), *tv(k), *tv(v), *tv(g), *tv(beta), *tv(A_log), *tv(dt_bias),
              *tv(initial_state), *tv(cu_seqlens), host)
    opt = options(scale, flags)
    sshape = state_shape(N, HV, K, V, flags)
    buf = _lib.FwdBuffer()
    _lib.FWD_PACK.pack_into(buf, 0, *common, *_fake(0, (B, T, HV, V), q.dtype),
                            *(_fake(1, sshape, sd) if output_final_state else _ABSENT), *opt)
    st = lib.fqla_fwd_supported(ctx, buf)
    if st:
        return _lib.error(st, ctx, "fwd")
    if not backward:
        return None
    gd = torch.float64 if q.dtype == torch.float64 else torch.float32
    gate = flags & GATE_IN_KERNEL
    buf = _lib.BwdBuffer()
    _lib.BWD_PACK.pack_into(
        buf, 0, *common, *_fake(0, (B, T, HV, V), q.dtype),
        *(_fake(1, sshape, gd) if output_final_state else _ABSENT),
        *_fake(2, (B, T, H, K), q.dtype), *_fake(3, (B, T, H, K), q.dtype),
        *_fake(4, (B, T, HV, V), q.dtype), *_fake(5, (B, T, HV), gd), *_fake(6, (B, T, HV), gd),
        *(_fake(7, tuple(initial_state.shape), gd) if initial_state is not None else _ABSENT),
        *(_fake(8, (HV,), gd) if gate else _ABSENT), *(_fake(9, (HV,), gd) if gate else _ABSENT),
        *opt)
    st = lib.fqla_bwd_supported(ctx, buf)
    if st:
        return _lib.error(st, ctx, "bwd")
    return None
