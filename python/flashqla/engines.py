"""The serving engines' and FLA's recurrent GDN signatures on flashqla's
decode / verify kernels, so a model layer swaps its import and nothing else:

    fused_sigmoid_gating_delta_rule_update  vLLM's decode / spec-decode call
                                            (fla/ops/fused_sigmoid_gating.py)
    fused_recurrent_gated_delta_rule        FLA's (fla.ops.gated_delta_rule)

Both keep the engines' argument names, positional order, defaults, layouts
and return values; what flashqla cannot express raises (ValueError or
NotImplementedError naming the argument) instead of computing something
else. CPU and CUDA tensors take the same code: torch index operations around
flashqla.decode / flashqla.verify, none of which reads device memory on the
host in the in-place (serving) mode, so CUDA-graph capture stays possible.
docs/serving.md shows the swap in a vLLM / SGLang layer.
"""

from __future__ import annotations

import torch

from . import serving
from .chunk import chunk_gated_delta_rule as _chunk

_I64 = torch.int64


def _host(x):
    """x's values are host memory (reading them costs no synchronisation)."""
    return x.device.type == "cpu"


def _tokens(x, name, B, T, HV):
    """a / b as [B, T, HV]: vLLM's kernel reads them as flat [tokens, HV]
    arrays, so [T, HV] and [B, T, HV] both work there."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"flashqla: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.numel() != B * T * HV or x.dim() not in (2, 3) or x.shape[-1] != HV:
        raise ValueError(f"flashqla: {name} has shape {tuple(x.shape)}; expected [{B}, {T}, {HV}] "
                         f"or [{B * T}, {HV}] (tokens x v heads)")
    return x.reshape(B, T, HV)


def _check_lengths(cu, T_total, width, idx2d, inplace, sglang=False):
    """Host-side checks of what the engines' kernels would read out of
    bounds (only where the values are host memory)."""
    c = cu.tolist()
    if c and c[0] < 0 or any(b < a for a, b in zip(c, c[1:])) or (c and c[-1] > T_total):
        raise ValueError(f"flashqla: cu_seqlens = {c} must be non-decreasing within [0, T = {T_total}]")
    if inplace:
        for n, (a, b) in enumerate(zip(c, c[1:])):
            if b - a > width:
                what = ("with cu_seqlens, one token per sequence is supported in SGLang's form"
                        if sglang else
                        f"its row of ssm_state_indices has {width} entries" if idx2d else
                        "1-D ssm_state_indices give one pool row per sequence (the engines' kernel "
                        "would write token t's state to the row of sequence n + t); give 2-D "
                        "indices [N, T] for multi-token sequences")
                raise ValueError(f"flashqla: cu_seqlens: sequence {n} has {b - a} tokens but {what}")


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
    *,
    state_v_first=True,
    initial_state_source=None,
    initial_state_indices=None,
    softplus_beta=None,
    softplus_threshold=None,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=None,
    retrieve_parent_token=None,
):
    """vLLM's fused_sigmoid_gating_delta_rule_update on flashqla.

    Per token: g = -exp(A_log) * softplus(a + dt_bias) (softplus with
    beta = 1, threshold = 20), beta = sigmoid(b), q and k l2-normalised when
    use_qk_l2norm_in_kernel, then the gated delta rule on the state.

    q, k [B, T, H, K]; v [B, T, HV, V]; a, b [B, T, HV] or [B * T, HV]
    (raw, any float dtype); A_log, dt_bias [HV]. B == 1 with cu_seqlens
    [N + 1] (packed sequences), else N = B sequences of T tokens.
    initial_state is the pool [P, HV, V, K] (fp32 or bf16; the keyword-only
    extension state_v_first=False takes a [P, HV, K, V] pool instead).
    ssm_state_indices (int32 / int64): [N] one pool row per sequence, or
    [N, W] one row per token (spec decode); the state is read from row
    indices[n, num_accepted_tokens[n] - 1] (indices[n, 0] without
    num_accepted_tokens; indices[n] for 1-D) and, with inplace_final_state,
    the state after token t is written to row indices[n, t] (indices[n] for
    1-D). A negative index (-1, PAD_SLOT_ID) skips: at the read, the whole
    sequence (nothing read or written, its o rows are zeros); at a write,
    that write. inplace_final_state=False leaves the pool untouched and
    returns the state after every token in a new [T_total, HV, V, K] tensor
    of the pool's dtype (zeros for tokens of skipped sequences).

    Returns (o [B, T, HV, V] in q's dtype, final_state: the pool itself, or
    the per-token states). Tokens of padded or zero-length sequences, and
    tokens past cu_seqlens[-1], get o = 0 (the engines leave them unwritten).

    SGLang's form of the call (all by keyword: initial_state_source,
    initial_state_indices [N], softplus_beta, softplus_threshold,
    disable_state_update) reads row indices[n], writes the state after the
    sequence's last token back to it (not with disable_state_update) and
    returns o alone. A -1 index there runs SGLang's padding rows from a zero
    state and writes nothing; here their o rows are zeros. Its
    target_verify arguments (intermediate_states_buffer, ...) raise.

    Host reads: none in the in-place mode on CUDA tensors (graph-safe); the
    lengths and num_accepted_tokens are then trusted, as in the engines
    (a sequence longer than its index row is undefined there; here its
    extra tokens are dropped). CPU tensors are validated. The per-token mode
    with cu_seqlens reads the lengths (a synchronisation on CUDA).
    """
    sglang = initial_state_source is not None or initial_state_indices is not None
    if sglang:
        if initial_state is not None or ssm_state_indices is not None or num_accepted_tokens is not None:
            raise ValueError("flashqla: give either vLLM's initial_state / ssm_state_indices / "
                             "num_accepted_tokens or SGLang's initial_state_source / "
                             "initial_state_indices, not both")
        for name, x in (("intermediate_states_buffer", intermediate_states_buffer),
                        ("intermediate_state_indices", intermediate_state_indices),
                        ("cache_steps", cache_steps), ("retrieve_parent_token", retrieve_parent_token)):
            if x is not None:
                raise NotImplementedError(f"flashqla: {name} (SGLang's target_verify) is not supported; "
                                          "flashqla.verify writes the state after every draft token")
        if initial_state_source is None:
            raise ValueError("flashqla: initial_state_source (the state pool) is required")
        if initial_state_indices is None:
            raise ValueError("flashqla: initial_state_indices is required (the pool rows of the "
                             "sequences; -1 for padding)")
        if not isinstance(initial_state_indices, torch.Tensor) or initial_state_indices.dim() != 1:
            raise ValueError("flashqla: initial_state_indices must be a 1-D int32 / int64 tensor [N]")
        if softplus_beta is not None:
            beta = softplus_beta
        if softplus_threshold is not None:
            threshold = softplus_threshold
        try:
            return _update(A_log, a, b, dt_bias, q, k, v, beta, threshold, scale,
                           initial_state_source, True, cu_seqlens, initial_state_indices, None,
                           use_qk_l2norm_in_kernel, is_kda, state_v_first, True,
                           disable_state_update)[0]
        except (ValueError, TypeError, NotImplementedError) as e:
            # the same checks, in SGLang's argument names
            msg = str(e)
            for vllm_name, sgl in (("ssm_state_indices", "initial_state_indices"),
                                   ("initial_state ", "initial_state_source "),
                                   ("beta = ", "softplus_beta = "),
                                   ("threshold = ", "softplus_threshold = ")):
                msg = msg.replace(vllm_name, sgl)
            raise type(e)(msg) from None
    for name, x in (("softplus_beta", softplus_beta), ("softplus_threshold", softplus_threshold),
                    ("intermediate_states_buffer", intermediate_states_buffer),
                    ("intermediate_state_indices", intermediate_state_indices),
                    ("cache_steps", cache_steps), ("retrieve_parent_token", retrieve_parent_token)):
        if x is not None:
            raise ValueError(f"flashqla: {name} belongs to SGLang's form of the call (with "
                             "initial_state_source / initial_state_indices)")
    if disable_state_update:
        raise ValueError("flashqla: disable_state_update belongs to SGLang's form of the call "
                         "(vLLM's is inplace_final_state=False)")
    return _update(A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state,
                   inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                   use_qk_l2norm_in_kernel, is_kda, state_v_first, False, False)


def _update(A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state,
            inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
            use_qk_l2norm_in_kernel, is_kda, state_v_first, sglang, disable_state_update):
    if is_kda:
        raise NotImplementedError("flashqla: is_kda=True (per-channel KDA gates) is not supported")
    if float(beta) != 1.0:
        raise NotImplementedError(f"flashqla: beta = {beta} (softplus beta): the library's gate uses "
                                  "softplus with beta = 1")
    if float(threshold) != 20.0:
        raise NotImplementedError(f"flashqla: threshold = {threshold} (softplus threshold): the "
                                  "library's softplus matches threshold = 20 only")
    if scale is not None and not float(scale) > 0:
        raise ValueError(f"flashqla: scale = {scale} must be > 0 (None for K ** -0.5)")
    for name, x in (("q", q), ("k", k), ("v", v), ("initial_state", initial_state),
                    ("ssm_state_indices", ssm_state_indices), ("A_log", A_log)):
        if not isinstance(x, torch.Tensor):
            if x is None and name == "initial_state":
                raise ValueError("flashqla: initial_state (the state pool) is required")
            if x is None and name == "ssm_state_indices":
                raise ValueError("flashqla: ssm_state_indices is required (the pool rows of the "
                                 "sequences; -1 for padding)")
            raise TypeError(f"flashqla: {name} must be a torch.Tensor, got {type(x).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flashqla: q, k, v must be [B, T, H, K] / [B, T, HV, V]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    a, b = _tokens(a, "a", B, T, HV), _tokens(b, "b", B, T, HV)
    pool, idx, nat, cu = initial_state, ssm_state_indices, num_accepted_tokens, cu_seqlens
    dev = q.device
    want = (HV, V, K) if state_v_first else (HV, K, V)
    if pool.dim() != 4 or tuple(pool.shape[1:]) != want:
        other = "state_v_first=False for a [P, HV, K, V] pool" if state_v_first else \
            "state_v_first=True (the default) for a [P, HV, V, K] pool"
        raise ValueError(f"flashqla: initial_state has shape {tuple(pool.shape)}; expected "
                         f"[P, {', '.join(map(str, want))}] ([P, HV, {'V, K' if state_v_first else 'K, V'}]; "
                         f"{other})")
    if idx.dtype not in (torch.int32, torch.int64) or idx.dim() not in (1, 2):
        raise ValueError(f"flashqla: ssm_state_indices must be int32 / int64 [N] or [N, W]; got "
                         f"{idx.dtype} {tuple(idx.shape)}")
    for name, x in (("initial_state", pool), ("ssm_state_indices", idx),
                    ("num_accepted_tokens", nat), ("cu_seqlens", cu)):
        if x is not None and x.device != dev:
            raise ValueError(f"flashqla: {name} is on {x.device} but q is on {dev}")
    if cu is not None:
        if B != 1:
            raise ValueError(f"flashqla: q has batch size {B}; with cu_seqlens it must be 1 "
                             "(flatten variable-length inputs)")
        if cu.dim() != 1 or cu.numel() < 1 or cu.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"flashqla: cu_seqlens must be int32 / int64 [N + 1]; got "
                             f"{cu.dtype} {tuple(cu.shape)}")
        N = cu.numel() - 1
    else:
        N = B
    if idx.shape[0] < N:
        raise ValueError(f"flashqla: ssm_state_indices has {idx.shape[0]} rows for N = {N} sequences")
    idx = idx[:N]
    W = idx.shape[1] if idx.dim() == 2 else 1
    if nat is not None:
        if idx.dim() != 2:
            raise ValueError("flashqla: num_accepted_tokens needs 2-D ssm_state_indices [N, W] "
                             "(one pool row per draft position)")
        if nat.dim() != 1 or nat.shape[0] < N or nat.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"flashqla: num_accepted_tokens must be int32 / int64 [N = {N}]; got "
                             f"{nat.dtype} {tuple(nat.shape)}")
        nat = nat[:N]
    if cu is None and inplace_final_state and T > W and not sglang:
        raise ValueError(f"flashqla: ssm_state_indices has {W} entr{'y' if W == 1 else 'ies'} per "
                         f"sequence for T = {T} tokens each (in place, the state after token t goes to "
                         "row indices[n, t]: give 2-D indices [N, T])")

    if _host(idx) and idx.numel() and int(idx.max()) >= pool.shape[0]:
        raise ValueError(f"flashqla: ssm_state_indices holds row {int(idx.max())} but initial_state "
                         f"has P = {pool.shape[0]} rows")
    lens = None
    if cu is not None:
        lens = (cu[1:] - cu[:-1]).to(_I64)
        if _host(cu):
            _check_lengths(cu, T, W, idx.dim() == 2, inplace_final_state, sglang)
    # the row each sequence starts from (-1: the sequence is skipped)
    if idx.dim() == 1:
        init = idx.to(_I64)
    elif nat is None:
        init = idx[:, 0].to(_I64)
    else:
        col = nat.to(_I64) - 1
        if _host(nat):
            live = range(N) if lens is None else [n for n in range(N) if lens[n] > 0]
            bad = [n for n in live if not 0 <= int(col[n]) < W]
            if bad:
                raise ValueError(f"flashqla: num_accepted_tokens[{bad[0]}] = {int(col[bad[0]]) + 1} "
                                 f"must be in [1, {W}] (the width of ssm_state_indices)")
        init = idx.to(_I64).gather(1, col.clamp(0, W - 1).unsqueeze(1)).squeeze(1)
    if lens is not None:
        init = torch.where(lens > 0, init, init.new_full((), -1))

    # Tokens per sequence as the kernels see them: [N, Tn, ...]
    if cu is None:
        Tn = T
        qp, kp, vp, ap, bp = q, k, v, a, b
        pos = None
    else:
        if inplace_final_state:
            Tn = W
        else:
            Tn = int(lens.max()) if N > 0 else 0   # host read (documented)
        if N == 0 or T == 0 or Tn == 0:
            o = q.new_zeros(1, T, HV, V)
            return o, (pool if inplace_final_state else pool.new_zeros((T,) + tuple(pool.shape[1:])))
        pos = cu[:-1].to(_I64).unsqueeze(1) + torch.arange(Tn, device=dev)        # [N, Tn]
        src = pos.clamp(0, T - 1).reshape(-1)
        qp, kp, vp, ap, bp = (x[0].index_select(0, src).view((N, Tn) + tuple(x.shape[2:]))
                              for x in (q, k, v, a, b))
    if N == 0 or Tn == 0:
        o = q.new_zeros(B, T, HV, V)
        return o, (pool if inplace_final_state else pool.new_zeros((B * T,) + tuple(pool.shape[1:])))

    t_ar = torch.arange(Tn, device=dev)
    valid = (t_ar < (lens.unsqueeze(1) if lens is not None else T)) & (init >= 0).unsqueeze(1)   # [N, Tn]
    # the row each token's state is written to (-1: none), in place
    if not inplace_final_state:
        wrows = None
    elif sglang:
        last = (lens if lens is not None else torch.full((N,), T, device=dev)) - 1
        wrows = torch.where(t_ar == last.unsqueeze(1), idx.to(_I64).unsqueeze(1),
                            t_ar.new_full((), -1))
        if disable_state_update:
            wrows = torch.full_like(wrows, -1)
    elif idx.dim() == 2:
        wrows = idx.to(_I64)[:, :Tn]
    else:
        wrows = idx.to(_I64).unsqueeze(1)
    same_row = (inplace_final_state and Tn == 1 and not disable_state_update
                and (idx.dim() == 1 or nat is None))
    try:
        o, final = _run(q, qp, kp, vp, ap, bp, A_log, dt_bias, pool, wrows, init, valid, pos,
                        same_row, inplace_final_state, scale, use_qk_l2norm_in_kernel,
                        state_v_first, B, T, N, Tn)
    except ValueError as e:
        if "slots" in str(e):   # the library's name for the rows read
            raise ValueError(f"flashqla: ssm_state_indices (the library's slots): {e}") from None
        raise
    return o, final


def _run(q, qp, kp, vp, ap, bp, A_log, dt_bias, pool, wrows, init, valid, pos, same_row,
         inplace_final_state, scale, use_qk_l2norm_in_kernel, state_v_first, B, T, N, Tn):
    HV, V = vp.shape[2], vp.shape[3]
    dev = q.device
    t_ar = torch.arange(Tn, device=dev)
    if same_row:
        # one token, written back to the row it was read from: fqla_decode
        o_n = serving.decode(qp, kp, vp, ap, bp, A_log, dt_bias, pool, init, scale=scale,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             state_v_first=state_v_first)
        final = pool
    else:
        # fqla_verify into per-token states, then placed: its step_slots
        # cannot express a step that writes the row the sequence reads
        # (spec decode writes indices[n, num_accepted - 1] after reading it)
        steps = pool.new_empty((N, Tn) + tuple(pool.shape[1:]))
        o_n = serving.verify(qp, kp, vp, ap, bp, A_log, dt_bias, pool, init, step_states=steps,
                             scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             state_v_first=state_v_first)
        flat = steps.view((N * Tn,) + tuple(pool.shape[1:]))
        if inplace_final_state:
            rows = wrows
            ok = (valid & (rows >= 0) & (rows < pool.shape[0])).reshape(-1)
            rows = rows.reshape(-1)
            if pool.shape[0] > 0:
                # a masked scatter without a host read: skipped entries
                # rewrite one row with the value it gets anyway (the first
                # valid entry's, or row 0's own when nothing is written)
                first = torch.argmax(ok.to(torch.float32)).view(1)   # device ops only
                any_ok = ok.any()
                fb_row = torch.where(any_ok, rows.index_select(0, first)[0], rows.new_zeros(()))
                fb_val = torch.where(any_ok, flat.index_select(0, first)[0], pool[0])
                tgt = torch.where(ok, rows, fb_row)
                # (in place: flat is this call's own temporary; fb_val is a copy)
                torch.where(ok.view((-1,) + (1,) * 3), flat, fb_val, out=flat)
                pool.index_copy_(0, tgt, flat)
            final = pool
        else:
            ok = valid.reshape(-1)
            ntok = B * T
            final = pool.new_zeros((ntok + 1,) + tuple(pool.shape[1:]))
            dest = pos if pos is not None else (torch.arange(N, device=dev).unsqueeze(1) * T + t_ar)
            dest = torch.where(valid, dest, torch.full_like(dest, ntok)).reshape(-1)
            final.index_copy_(0, dest, torch.where(ok.view((-1,) + (1,) * 3), flat,
                                                   flat.new_zeros(())))
            final = final[:ntok]
    # outputs: zeros where the engines write nothing
    o_n = torch.where(valid.view(N, Tn, 1, 1), o_n, o_n.new_zeros(()))
    if pos is None:
        return o_n, final
    o = o_n.new_zeros((T + 1, HV, V))
    dest = torch.where(valid, pos, torch.full_like(pos, T)).reshape(-1)
    o.index_copy_(0, dest, o_n.reshape(N * Tn, HV, V))
    return o[:T].unsqueeze(0), final


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    gk=None,
    gv=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    **kwargs,
):
    """FLA's fused_recurrent_gated_delta_rule (fla-core 0.6) on flashqla.

    q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV] log decay (None: no
    decay; the raw gate input with use_gate_in_kernel, A_log, dt_bias);
    beta [B, T, HV] (None: ones; the logit with use_beta_sigmoid_in_kernel);
    initial_state [N, HV, K, V] ([N, HV, V, K] with state_v_first), any
    float dtype, never modified; cu_seqlens [N + 1] with B == 1. Returns
    (o [B, T, HV, V], final_state fp32 or None).

    One token per sequence (B sequences, T == 1, no cu_seqlens) runs
    fqla_decode on an fp32 copy of the state; longer or packed sequences run
    the chunked forward (the same recurrence, and differentiable, which
    FLA's recurrent kernel is not). gk / gv (per-channel gates) and a
    per-channel beta [B, T, HV, V] raise NotImplementedError.
    """
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("flashqla: both state_v_first and the deprecated transpose_state_layout given")
        state_v_first = kwargs.pop("transpose_state_layout")
    if kwargs:
        raise TypeError(f"flashqla: fused_recurrent_gated_delta_rule got unsupported argument(s) "
                        f"{', '.join(sorted(kwargs))}")
    if gk is not None:
        raise NotImplementedError("flashqla: gk (per-key decay [B, T, HV, K]) is not supported")
    if gv is not None:
        raise NotImplementedError("flashqla: gv (per-value decay [B, T, HV, V]) is not supported")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"flashqla: {name} must be a torch.Tensor, got {type(x).__name__}")
    if v.dim() != 4 or q.dim() != 4:
        raise ValueError(f"flashqla: q and v must be [B, T, H, K] / [B, T, HV, V]; got "
                         f"{tuple(q.shape)}, {tuple(v.shape)}")
    if beta is not None and beta.dim() == v.dim():
        raise NotImplementedError("flashqla: beta per value channel [B, T, HV, V] is not supported "
                                  "(give one beta per head, [B, T, HV])")
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(f"flashqla: q has batch size {q.shape[0]}; with cu_seqlens it must be 1 "
                             "(flatten variable-length inputs)")
        if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
            raise ValueError(f"flashqla: initial_state has {initial_state.shape[0]} states for "
                             f"{len(cu_seqlens) - 1} sequences")
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("flashqla: A_log must be given with use_gate_in_kernel=True")
        if g is None:
            raise ValueError("flashqla: g (the raw gate input) must be given with use_gate_in_kernel=True")
    else:
        A_log = dt_bias = None
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("flashqla: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if g is None:
        g = q.new_zeros((B, T, HV), dtype=torch.float32)
    if beta is None:
        beta = q.new_ones((B, T, HV), dtype=torch.float32)
    grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, beta, A_log, dt_bias, initial_state))
    if cu_seqlens is None and T == 1 and B > 0 and not grad:
        shape = (B, HV, V, K) if state_v_first else (B, HV, K, V)
        if initial_state is None:
            state = q.new_zeros(shape, dtype=torch.float32)
        else:
            if tuple(initial_state.shape) != shape:
                raise ValueError(f"flashqla: initial_state has shape {tuple(initial_state.shape)}; "
                                 f"expected {list(shape)}")
            state = initial_state.to(torch.float32, copy=True)
        slots = torch.arange(B, dtype=torch.int32, device=q.device)
        o = serving.decode(q, k, v, g, beta, A_log if use_gate_in_kernel else None, dt_bias, state,
                           slots, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                           allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first)
        return o, (state if output_final_state else None)
    return _chunk(q, k, v, g, beta, scale, initial_state, output_final_state,
                  use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
                  dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                  cu_seqlens=cu_seqlens)
