"""flashqla.chunk_gated_delta_rule: FLA's chunk_gated_delta_rule on
flashqla's kernels (CPU tensors -> the CPU backend, CUDA tensors -> the
sm_90a backend, float64 CPU tensors -> the fp64 reference).

The wrapper turns FLA's argument conventions into the C contract with
differentiable torch operations (dtype casts, copies of tensors whose last
dimension is not contiguous), so autograd casts the gradients back, then
calls the forward: directly (eager), through an autograd.Function when a
gradient is needed, or through the flashqla::fwd custom op under
torch.compile. An eager call that needs no gradient and repeats a call
signature seen before skips all of that (the fast path at the top of
chunk_gated_delta_rule; docs/python.md, Per-call cost).
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


# --------------------------------------------------------------------------
# The eager fast path's cache: call signature -> entry (the tuple unpacked in
# chunk_gated_delta_rule). An entry is made only after the general path ran a
# call successfully without converting or copying any argument, so a hit
# means the general path would pass the same tensors on unchanged; the C
# library still validates every call.

_CACHE = ops.SignatureCache(256)
_lookup = _CACHE.lookup
_FAST, _LAST, _FAST_MAX = _CACHE.table, _CACHE.last, _CACHE.limit   # for the tests
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_empty = torch.empty
_empty_like = torch.empty_like
_empty_cpu = ops.empty_strided_cpu
_ALLOC_CPU, _ALLOC_LIKE = ops.ALLOC_CPU, ops.ALLOC_LIKE
_handle = _lib.context_handle
_SIZE_0 = _lib.SIZE_0
_FwdBuffer = _lib.FwdBuffer
_FWD_FAST = _lib.FWD_FAST.pack_into
_RUN_FWD = _lib.RAW_FWD
_CUDA = _lib.BACKEND_CUDA


def _sig(x):
    return None if x is None else (x.shape, x.stride(), x.dtype, x.device)


def _fast_key(q, k, v, g, beta, h0, scale, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
              A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
              cu_seqlens_cpu, cp_context, backend):
    """The fast path's key of a call that needs no gradient (every tensor's
    shape, strides, dtype and device, and the flags), or None: a gradient
    is needed, or an argument is not a tensor (the general path's
    check_types then names it)."""
    try:
        if _grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad or g.requires_grad
                or beta.requires_grad or (h0 is not None and h0.requires_grad)
                or (use_gate_in_kernel and ((A_log is not None and A_log.requires_grad)
                                            or (dt_bias is not None and dt_bias.requires_grad)))):
            return None
        key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
               v.shape, v.stride(), v.dtype, v.device, g.shape, g.stride(), g.dtype, g.device,
               beta.shape, beta.stride(), beta.dtype, beta.device,
               None if h0 is None else (h0.shape, h0.stride(), h0.dtype, h0.device),
               scale, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
               use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, backend)
        if A_log is not None or dt_bias is not None or cu_seqlens is not None \
                or cu_seqlens_cpu is not None or cp_context is not None:
            key += (_sig(A_log), _sig(dt_bias), _sig(cu_seqlens), _sig(cu_seqlens_cpu),
                    cp_context is None)
        return key
    except AttributeError:
        return None


def _remember(key, args, given, o, ht, described):
    """Caches a successful no-grad eager call's description when prepare()
    passed every tensor on as given (costs about a microsecond: the
    description is what the general path packed)."""
    (q, k, v, g, beta, A_log, dt_bias, h0, cu, cu_cpu) = args[:10]
    gq, gk, gv, gg, gb, gA, gdt, gh0, gcu, gcu_cpu = given
    if not (q is gq and k is gk and v is gv and g is gg and beta is gb and h0 is gh0
            and cu is gcu and (A_log is None or A_log is gA)
            and (dt_bias is None or dt_bias is gdt) and (cu_cpu is None or cu_cpu is gcu_cpu)):
        return
    be, device, ms, host, sopt = described
    entry = (be, device, q.device, *ms[:9], A_log is not None, host,
             ops.alloc_mode(o, v), tuple(o.shape), o.stride(), o.dtype, ms[9],
             None if ht is None else ops.alloc_mode(ht, h0),
             None if ht is None else tuple(ht.shape), None if ht is None else ht.stride(),
             None if ht is None else ht.dtype, ms[10], sopt)
    _CACHE.store(key, entry)


def same_device(dev, names, *xs):
    for name, x in zip(names, xs):
        if x is not None and x.device != dev:
            raise ValueError(f"flashqla: {name} is on {x.device} but q is on {dev}")


_REQUIRED = ("q", "k", "v", "g", "beta")
_NDIM = {"v": (4,)}  # read before the library's own shape checks (fwd_alloc)


def check_types(required=_REQUIRED, ndim=_NDIM, **tensors):
    """A clear error naming the argument for what the library's validation
    cannot see: a missing or non-tensor argument, a dtype without a library
    code, a rank the wrapper reads before the library checks shapes by name."""
    for name, x in tensors.items():
        if x is None and name not in required:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"flashqla: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in ops.DTYPES:
            raise ValueError(f"flashqla: {name}: dtype {x.dtype} is not supported")
        if name in ndim and x.dim() not in ndim[name]:
            raise ValueError(f"flashqla: {name} must have {' or '.join(map(str, ndim[name]))} dimensions, "
                             f"got shape {tuple(x.shape)}")


def check_options(scale, allow_neg_eigval, use_beta_sigmoid_in_kernel):
    """The options the C API cannot tell apart from others (scale = 0 is its
    default) or would ignore (allow_neg_eigval without the sigmoid)."""
    if scale is not None and float(scale) == 0.0:
        # the C API's 0 means the default 1 / sqrt(K); FLA's 0 means o = 0
        raise ValueError("flashqla: scale = 0 is not supported (the library reads 0 as the default); "
                         "pass None for K ** -0.5")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("flashqla: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (as in FLA)")


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
    backend plan without reading device memory; it must match cu_seqlens).

    Returns (o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] fp32 or
    None). Differentiable in q, k, v, g, beta, A_log, dt_bias, initial_state.

    Arguments after use_qk_l2norm_in_kernel are keyword-only: FLA's
    positional order differs from this one there, and a positional mix-up
    would silently change the math. chunk_indices and chunk_size are
    accepted and ignored (the chunking is internal); cp_context (inter-card
    context parallel) is not supported. backend: None (by device and dtype),
    'cpu', 'cuda' or 'reference' (the fp64 oracle, CPU tensors).
    """
    h0 = initial_state
    if scale is not None and type(scale) is not float:
        # a 0-dim tensor or numpy scalar: its value, not the object, goes
        # into the fast path's key (an object changed in place, or a float
        # equal to it, would otherwise reuse another call's entry)
        scale = float(scale)
    key = None
    compiling = _is_compiling()
    # Fast path (eager, no gradient): a call whose signature (every tensor's
    # shape, strides, dtype and device, and the flags) was seen before and
    # needed no conversion reuses everything derived from it and only reads
    # pointers. Issue 5 budgets 20 us of Python per call; the general path
    # below costs about 30 (measured).
    if not compiling:
        key = _fast_key(q, k, v, g, beta, h0, scale, output_final_state, use_qk_l2norm_in_kernel,
                        use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                        state_v_first, cu_seqlens, cu_seqlens_cpu, cp_context, backend)
    if key is not None:
        e, key = _lookup(key)
        if e is not None:
            (be, device, dev, sq, sk, sv, sg, sb, sa, sd, sh, sc, gate, host,
             o_mode, o_shape, o_strides, o_dtype, so,
             h_mode, h_shape, h_strides, h_dtype, sht, sopt) = e
            if o_mode == _ALLOC_CPU:
                o = _empty_cpu(o_shape, o_strides, o_dtype)
            elif o_mode == _ALLOC_LIKE:
                o = _empty_like(v)
            else:
                o = _empty(o_shape, dtype=o_dtype, device=dev)
            if h_mode is None:
                ht = None
            elif h_mode == _ALLOC_CPU:
                ht = _empty_cpu(h_shape, h_strides, h_dtype)
            elif h_mode == _ALLOC_LIKE:
                ht = _empty_like(h0)
            else:
                ht = _empty(h_shape, dtype=h_dtype, device=dev)
            buf = _FwdBuffer()
            _FWD_FAST(buf, 0, q.data_ptr(), sq, k.data_ptr(), sk, v.data_ptr(), sv,
                      g.data_ptr(), sg, beta.data_ptr(), sb,
                      A_log.data_ptr() if gate else 0, sa, dt_bias.data_ptr() if gate else 0, sd,
                      0 if h0 is None else h0.data_ptr(), sh,
                      0 if cu_seqlens is None else cu_seqlens.data_ptr(), sc,
                      cu_seqlens_cpu.data_ptr() if host else 0,
                      o.data_ptr(), so, 0 if ht is None else ht.data_ptr(), sht, sopt)
            h = _handle(be, device)
            if be == _CUDA:
                st = ops.run_cuda("fwd", h.value, buf, device, dev)
            else:
                st = _RUN_FWD(h, buf, None, _SIZE_0, None)
            if st:
                raise _lib.error(st, h.value, "fwd")
            return o, ht

    args = prepare(q, k, v, g, beta, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                   use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
                   cu_seqlens_cpu, cp_context, backend)
    if args[0].shape[0] == 0 and args[8] is None:
        # no sequences (B = 0): nothing to compute, empty outputs as decode
        # gives (the library wants B >= 1)
        return ops.fwd_alloc(args[0], args[2], args[7], None, args[11], args[12],
                             ops.state_dtype_for(args[0], args[7]))
    if compiling:
        o, ht = ops.fwd_op(*args)
    elif key is None and _needs_grad(*args[:8]):
        if args[0].is_cuda:
            # what the CUDA backward does not cover (e.g. fp32 q/k/v, K = 256)
            # fails here, before the forward runs, not in loss.backward()
            err = ops.fwd_supported(*args, backward=True)
            if err is not None:
                raise err
        o, ht = ChunkFunction.apply(*args)
    else:
        o, ht, described = ops.fwd_run(*args)
        if key is not None:
            _remember(key, args, (q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens,
                                  cu_seqlens_cpu), o, ht, described)
    return o, (ht if output_final_state else None)


def prepare(q, k, v, g, beta, scale, initial_state, output_final_state,
            use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
            cu_seqlens_cpu, cp_context, backend):
    """FLA's arguments -> the 14 arguments of ops.fwd_impl / flashqla::fwd."""
    if cp_context is not None:
        raise NotImplementedError("flashqla: cp_context (inter-card context parallel) is not supported")
    check_options(scale, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    check_types(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias,
                cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
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

    flags = ops.pack_flags(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                           allow_neg_eigval, state_v_first)
    if use_gate_in_kernel:
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
