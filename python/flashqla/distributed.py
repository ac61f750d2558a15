"""Context parallelism across ranks of a torch.distributed process group.

    import flashqla.distributed as fcp
    o, _ = fcp.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_global, group=group)

Each rank holds a contiguous slice of the tokens of one packed batch (q, k
[1, T_rank, H, K], ...); cu_seqlens is the batch's global [N + 1]; sequences
may span ranks and a rank may hold no tokens. The C library stays free of
communication: every rank runs fqla_fwd / fqla_bwd on its own tokens and the
ranks exchange only per-rank states, with torch.distributed collectives
(NCCL on GPUs, gloo on CPUs).

The state of one sequence is linear in its start (design.md §1): over a
rank's tokens S_end = M S_start + H, with H the end state from a zero start
and M (K x K per value head) the product of the per-token factors
exp(g) (I - beta k k^T). Both come out of one fqla_fwd: the values widened by
K zero columns and an initial state [0 | I] give the final state [H | M]
(two calls where the library does not take V + K columns).

Forward, per rank: the pieces that start on this rank run first (their end
state is the H the next rank needs); one all-gather of [kind | H | M] per
rank; every rank composes its start state from the records of the ranks
before it, in rank order (the same arithmetic on every rank: deterministic);
the first piece then runs from that start state. Only a rank whose single
piece continues both ways ("through") computes M, so such a rank does about
two forwards' work, every other rank one. The gate-driven shortcut: when
every token of a through piece is contractive (beta ||k||^2 in [0, 2], so
||I - beta k k^T|| <= 1) and every head's decay sums to <= -17 within a
prefix, ||M|| <= e^-17 (below fp32 rounding): the rank publishes H alone
(its successors' scan stops there) and reruns only that prefix from the
carried state.

Backward (the reverse scan): a rank whose first piece continues from an
earlier rank computes that piece's d(start state) with no gradient from its
end (dh0 of fqla_bwd); one all-gather of those; every rank whose last piece
continues composes its end-state gradient D = G_j + M_j^T D over the ranks
after it (the M_j kept from the forward) and runs fqla_bwd with it as
d_final_state. Gradients of A_log / dt_bias are each rank's own share (a
data-parallel reduction sums them, as for any replicated parameter).

Every rank of the group must call the forward and, when gradients are
needed, the backward (they are collectives). initial_state and
output_final_state are not offered (as in FLA's context parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from . import _lib, ops
from .chunk import prepare

# log of the bound on ||M|| below which the carried state is dropped (e^-17 ~ 4e-8)
NEGLIGIBLE_LOG_DECAY = -17.0

# the kind of a rank's record: what its last piece's end state depends on
EMPTY = 0      # no tokens: transparent to the scan
STARTS = 1     # S_end = H (the sequence starts on this rank, or M is negligible)
THROUGH = 2    # S_end = M S_start + H


@dataclass(frozen=True)
class RankLayout:
    """A rank's share of the packed batch: its pieces (local token ranges of
    one sequence each, non-empty, in order) and whether the first continues
    a sequence from an earlier rank and the last one into a later rank."""
    pieces: tuple
    cont_prev: bool
    cont_next: bool

    @property
    def through(self):
        return len(self.pieces) == 1 and self.cont_prev and self.cont_next


def layout_from_global(cu: Sequence[int], offsets: Sequence[int], rank: int) -> RankLayout:
    """The layout of rank `rank` holding global tokens [offsets[rank], offsets[rank + 1])."""
    a, b = offsets[rank], offsets[rank + 1]
    pieces, first_start, last_end = [], None, None
    for n in range(len(cu) - 1):
        lo, hi = max(cu[n], a), min(cu[n + 1], b)
        if hi > lo:
            if not pieces:
                first_start = cu[n]
            pieces.append((lo - a, hi - a))
            last_end = cu[n + 1]
    if not pieces:
        return RankLayout((), False, False)
    return RankLayout(tuple(pieces), first_start < a, last_end > b)


def layout_from_fla(cp_context) -> RankLayout:
    """The layout FLA's cp_context (fla.ops.cp.build_cp_context) describes:
    its cu_seqlens are the rank's local ones; is_first_rank / is_last_rank say
    whether the first / last local sequence starts / ends on this rank."""
    cu = cp_context.cu_seqlens_cpu
    if cu is None:
        cu = cp_context.cu_seqlens.cpu()
    cu = [int(x) for x in cu]
    pieces = tuple((cu[i], cu[i + 1]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i])
    if not pieces:
        return RankLayout((), False, False)
    return RankLayout(pieces, not cp_context.is_first_rank, not cp_context.is_last_rank)


# --------------------------------------------------------------------------
# The library calls on a rank's token ranges


@dataclass
class _Problem:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    A_log: Optional[torch.Tensor]
    dt_bias: Optional[torch.Tensor]
    scale: float
    flags: int
    backend: int

    @property
    def state_dtype(self):
        return ops.state_dtype_for(self.q, None)


def _tok(x, lo, hi):
    """Tokens [lo, hi) of a [1, T, ...] tensor; a copy where the slice's start
    is not 16-byte aligned (the CUDA backend's TMA needs it)."""
    s = x[:, lo:hi]
    if s.is_cuda and s.data_ptr() % 16:
        s = s.contiguous()
    return s


def _span(pieces):
    """(lo, hi, local cu_seqlens as a list) of consecutive pieces."""
    lo, hi = pieces[0][0], pieces[-1][1]
    return lo, hi, [p[0] - lo for p in pieces] + [hi - lo]


def _cu(cu, dev):
    host = torch.tensor(cu, dtype=torch.int64)
    return host.to(device=dev, dtype=torch.int32), host


def _fwd(P, pieces, o, h0=None, final=False):
    """Runs pieces (from h0 [n, HV, K, V] or zero), writes their o; returns the
    final states [n, HV, K, V] when asked."""
    lo, hi, cu = _span(pieces)
    cu_d, cu_h = _cu(cu, P.q.device)
    out, ht = ops.fwd_impl(_tok(P.q, lo, hi), _tok(P.k, lo, hi), _tok(P.v, lo, hi),
                           _tok(P.g, lo, hi), _tok(P.beta, lo, hi), P.A_log, P.dt_bias, h0,
                           cu_d, cu_h, P.scale, P.flags, final, P.backend)
    o[:, lo:hi] = out
    return ht


def _transition(P, piece):
    """(H [HV, K, V], M [HV, K, K]) of one piece: its zero-start end state and
    its transition. One call with V + K value columns where the library takes
    them (M's columns start from the identity and read zero values), else two."""
    lo, hi = piece
    q, k, g, beta = (_tok(x, lo, hi) for x in (P.q, P.k, P.g, P.beta))
    v = _tok(P.v, lo, hi)
    _, T, HV, V = v.shape
    K = q.shape[3]
    sd = P.state_dtype
    eye = torch.eye(K, dtype=sd, device=v.device).expand(1, HV, K, K)
    wide_v = torch.cat([v, v.new_zeros((1, T, HV, K))], dim=3)
    wide_h0 = torch.cat([torch.zeros((1, HV, K, V), dtype=sd, device=v.device), eye], dim=3)
    args = (q, k, wide_v, g, beta, P.A_log, P.dt_bias, wide_h0, None, None, P.scale, P.flags,
            True, P.backend)
    if ops.fwd_supported(*args) is None:
        _, ht = ops.fwd_impl(*args)
        return ht[0, :, :, :V], ht[0, :, :, V:]
    _, h = ops.fwd_impl(q, k, v, g, beta, P.A_log, P.dt_bias, None, None, None, P.scale,
                        P.flags, True, P.backend)
    _, m = ops.fwd_impl(q, k, v.new_zeros((1, T, HV, K)), g, beta, P.A_log, P.dt_bias,
                        eye.contiguous(), None, None, P.scale, P.flags, True, P.backend)
    return h[0], m[0]


def carry_prefix(g, beta, k, flags, A_log=None, dt_bias=None):
    """The gate-driven shortcut for one piece (g, beta [1, T, HV], k [1, T, H, K],
    the library's raw inputs and option bits): the number of leading tokens
    after which every head's carried state is scaled by at most
    e^NEGLIGIBLE_LOG_DECAY, or None (some token is not contractive, or some
    head does not decay that far)."""
    wide = torch.float64 if g.dtype == torch.float64 else torch.float32
    g = g.to(wide)
    if flags & ops.GATE_IN_KERNEL:
        g = -A_log.to(wide).exp() * torch.nn.functional.softplus(g + dt_bias.to(wide))
    beta = beta.to(wide)
    if flags & ops.BETA_SIGMOID:
        beta = beta.sigmoid() * (2.0 if flags & ops.NEG_EIGVAL else 1.0)
    kk = k.to(wide).square().sum(-1)                       # [1, T, H]
    if flags & ops.L2NORM:
        kk = kk / (kk + 1e-6)
    HV, H = g.shape[2], k.shape[2]
    bk = beta * kk.repeat_interleave(HV // H, dim=2)
    if not bool(((bk >= 0) & (bk <= 2)).all()):
        return None
    below = g.cumsum(1) <= NEGLIGIBLE_LOG_DECAY            # [1, T, HV], monotone in T
    if not bool(below[0, -1].all()):
        return None
    first = below[0].to(torch.int8).argmax(0)              # first token below, per head
    return int(first.max()) + 1


def _gather(rec, group, async_op=False):
    parts = [torch.empty_like(rec) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(parts, rec, group=group, async_op=async_op)
    return parts, work


def _start_state(parts, kinds, rank, HV, K, V):
    """The start state of this rank's first piece: the records of the ranks
    before it composed in rank order (fp64, the same on every rank)."""
    chain = []
    j = rank - 1
    while j >= 0 and kinds[j] != STARTS:
        if kinds[j] == THROUGH:
            chain.append(j)
        j -= 1
    if j < 0:
        raise RuntimeError(f"flashqla.distributed: rank {rank} continues a sequence that no earlier "
                           "rank starts (the ranks' layouts disagree)")
    n = HV * K * V
    S = parts[j][4:4 + n].view(HV, K, V).double()
    for i in reversed(chain):
        M = parts[i][4 + n:].view(HV, K, K).double()
        S = torch.matmul(M, S) + parts[i][4:4 + n].view(HV, K, V).double()
    return S


def _end_grad(gparts, kinds, Ms, rank, HV, K, V):
    """d(end state) of this rank's last piece: the start-state gradients of the
    ranks after it, composed back to front (D = G_j + M_j^T D, fp64)."""
    chain = []
    j = rank + 1
    while j < len(kinds):
        if kinds[j] != EMPTY:
            chain.append(j)
            if kinds[j] != THROUGH:
                break
        j += 1
    D = torch.zeros((HV, K, V), dtype=torch.float64, device=gparts[0].device)
    for i in reversed(chain):
        G = gparts[i].view(HV, K, V).double()
        D = G + torch.matmul(Ms[i].double().transpose(1, 2), D) if kinds[i] == THROUGH and i in Ms \
            else G
    return D


def _forward(P, L, group):
    """o of this rank's tokens and what the backward needs."""
    _, T, HV, V = P.v.shape
    K = P.q.shape[3]
    sd = P.state_dtype
    dev = P.q.device
    o = P.q.new_zeros((1, T, HV, V))
    n = HV * K * V
    rec = torch.zeros(4 + n + HV * K * K, dtype=sd, device=dev)
    H = rec[4:4 + n].view(HV, K, V)
    kind = STARTS if L.pieces else EMPTY
    prefix = None
    first, rest = (L.pieces[:1], L.pieces[1:]) if L.cont_prev else ((), L.pieces)
    if L.through:
        lo, hi = first[0]
        prefix = carry_prefix(_tok(P.g, lo, hi), _tok(P.beta, lo, hi), _tok(P.k, lo, hi),
                              P.flags, P.A_log, P.dt_bias)
        if prefix is None:
            kind = THROUGH
            h, m = _transition(P, first[0])
            H.copy_(h)
            rec[4 + n:].view(HV, K, K).copy_(m)
        else:  # the carried state fades within the prefix: run from zero now
            H.copy_(_fwd(P, first, o, final=True)[0])
    rec[0] = kind
    if rest and L.cont_next:
        H.copy_(_fwd(P, rest, o, final=True)[-1])
        parts, _ = _gather(rec, group)
    else:  # nobody needs this rank's end state: run its pieces under the all-gather
        parts, work = _gather(rec, group, async_op=True)
        if rest:
            _fwd(P, rest, o)
        work.wait()
    kinds = [int(x) for x in torch.stack([p[0] for p in parts]).tolist()]
    rank = dist.get_rank(group)
    S = None
    if L.cont_prev:
        S = _start_state(parts, kinds, rank, HV, K, V).to(sd).unsqueeze(0)
        lo, hi = first[0]
        run = [(lo, lo + prefix)] if prefix is not None else list(first)
        _fwd(P, run, o, h0=S)
    # the transitions the reverse scan reads (those of the ranks after this one)
    Ms = {i: parts[i][4 + n:].view(HV, K, K) for i in range(rank + 1, len(parts))
          if kinds[i] == THROUGH} if L.cont_next else {}
    return o, (S, prefix, kinds, Ms)


def _backward(P, L, group, saved, d_o):
    S, prefix, kinds, Ms = saved
    _, T, HV, V = P.v.shape
    K = P.q.shape[3]
    sd = P.state_dtype
    dev = P.q.device
    gd = torch.float64 if P.q.dtype == torch.float64 else torch.float32
    if d_o is None:
        d_o = torch.zeros_like(P.v)
    elif d_o.dtype != P.q.dtype:
        d_o = d_o.to(P.q.dtype)
    grads = [torch.zeros_like(P.q), torch.zeros_like(P.k), torch.zeros_like(P.v),
             torch.zeros(P.g.shape, dtype=gd, device=dev),
             torch.zeros(P.beta.shape, dtype=gd, device=dev)]
    gate = P.flags & ops.GATE_IN_KERNEL
    dA = torch.zeros((HV,), dtype=gd, device=dev) if gate else None
    ddt = torch.zeros((HV,), dtype=gd, device=dev) if gate else None

    def bwd(pieces, h0=None, d_final=None, keep=True):
        lo, hi, cu = _span(pieces)
        cu_d, cu_h = _cu(cu, dev)
        out = ops.bwd_impl(_tok(P.q, lo, hi), _tok(P.k, lo, hi), _tok(P.v, lo, hi),
                           _tok(P.g, lo, hi), _tok(P.beta, lo, hi), P.A_log, P.dt_bias, h0,
                           cu_d, cu_h, _tok(d_o, lo, hi).contiguous(), d_final, P.scale,
                           P.flags, P.backend)
        if keep:
            for full, part in zip(grads, out[:5]):
                full[:, lo:hi] = part
            if gate:
                dA.add_(out[6])
                ddt.add_(out[7])
        return out[5]

    G = torch.zeros((HV, K, V), dtype=sd, device=dev)
    first, rest = (L.pieces[:1], L.pieces[1:]) if L.cont_prev else ((), L.pieces)
    if L.through:   # d(start) from this rank's own outputs; the full pass comes later
        lo, hi = first[0]
        run = [(lo, lo + prefix)] if prefix is not None else list(first)
        G.copy_(bwd(run, h0=S, keep=False)[0])
    elif L.cont_prev:
        G.copy_(bwd(first, h0=S)[0])
    if L.cont_next:
        gparts, _ = _gather(G, group)
        D = _end_grad(gparts, kinds, Ms, dist.get_rank(group), HV, K, V).to(gd)
        if L.through:
            bwd(first, h0=S, d_final=D.unsqueeze(0))
        else:
            d_final = torch.zeros((len(rest), HV, K, V), dtype=gd, device=dev)
            d_final[-1] = D
            bwd(rest, d_final=d_final)
    else:  # no gradient comes from later ranks: run the pieces under the all-gather
        gparts, work = _gather(G, group, async_op=True)
        if rest:
            bwd(rest)
        work.wait()
    return grads, dA, ddt


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layout, group, scale, flags, backend, q, k, v, g, beta, A_log, dt_bias):
        P = _Problem(q, k, v, g, beta, A_log, dt_bias, scale, flags, backend)
        o, saved = _forward(P, layout, group)
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias)
        ctx.cp = (layout, group, scale, flags, backend, saved)
        ctx.set_materialize_grads(False)
        return o

    @staticmethod
    def backward(ctx, d_o):
        layout, group, scale, flags, backend, saved = ctx.cp
        q, k, v, g, beta, A_log, dt_bias = ctx.saved_tensors
        P = _Problem(q, k, v, g, beta, A_log, dt_bias, scale, flags, backend)
        (dq, dk, dv, dg, dbeta), dA, ddt = _backward(P, layout, group, saved, d_o)
        cast = (lambda x, like: None if x is None or like is None else x.to(like.dtype))
        return (None, None, None, None, None, dq, dk, dv, cast(dg, g), cast(dbeta, beta),
                cast(dA, A_log), cast(ddt, dt_bias))


def run(layout, q, k, v, g, beta, scale=None, use_qk_l2norm_in_kernel=False, *,
        use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, group=None, backend=None):
    """o of this rank's tokens, laid out by `layout` (a RankLayout)."""
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError("flashqla.distributed: q must be [1, T_rank, H, K] (one packed batch per group)")
    if group is None:
        group = dist.group.WORLD
    (q, k, v, g, beta, A_log, dt_bias, _, _, _, scale, flags, _, be) = prepare(
        q, k, v, g, beta, scale, None, False, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, False, None, None, None,
        backend)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                       for x in (q, k, v, g, beta, A_log, dt_bias)):
        return _ContextParallel.apply(layout, group, scale, flags, be, q, k, v, g, beta, A_log,
                                      dt_bias)
    P = _Problem(q, k, v, g, beta, A_log, dt_bias, scale, flags, be)
    return _forward(P, layout, group)[0]


def token_offsets(T_rank, device, group=None):
    """[0, T_0, T_0 + T_1, ...]: every rank's token count, by one all-gather."""
    n = torch.tensor([T_rank], dtype=torch.int64, device=device)
    parts = [torch.empty_like(n) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, n, group=group)
    offsets = [0]
    for c in torch.cat(parts).tolist():
        offsets.append(offsets[-1] + int(c))
    return offsets


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, use_qk_l2norm_in_kernel=False, *,
                           use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           cu_seqlens=None, cu_seqlens_cpu=None, offsets=None, group=None,
                           backend=None):
    """flashqla.chunk_gated_delta_rule over the ranks of `group` (default: the
    world): q, k [1, T_rank, H, K], v [1, T_rank, HV, V], g, beta
    [1, T_rank, HV] are this rank's contiguous slice of one packed batch;
    cu_seqlens [N + 1] are the batch's global offsets (None: one sequence);
    cu_seqlens_cpu their host copy (saves a device read). offsets: every
    rank's first token and the total ([world + 1] ints, host); None gathers
    the ranks' token counts (one more small collective). Returns (o of this
    rank's tokens, None), differentiable as the single-process call."""
    if group is None:
        group = dist.group.WORLD
    if offsets is None:
        offsets = token_offsets(q.shape[1], q.device, group)
    offsets = [int(x) for x in offsets]
    rank = dist.get_rank(group)
    if len(offsets) != dist.get_world_size(group) + 1 or offsets[rank + 1] - offsets[rank] != q.shape[1]:
        raise ValueError(f"flashqla.distributed: offsets {offsets} do not give rank {rank} its "
                         f"{q.shape[1]} tokens")
    if cu_seqlens_cpu is not None:
        cu = [int(x) for x in cu_seqlens_cpu]
    elif cu_seqlens is not None:
        cu = [int(x) for x in cu_seqlens.tolist()]
    else:
        cu = [0, offsets[-1]]
    layout = layout_from_global(cu, offsets, rank)
    o = run(layout, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel,
            use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, group=group, backend=backend)
    return o, None


def chunk_gated_delta_rule_fla(q, k, v, g, beta, cp_context, scale=None,
                               use_qk_l2norm_in_kernel=False, **options):
    """The same with the layout of FLA's cp_context (flashqla.fla routes FLA
    calls that carry one here)."""
    o = run(layout_from_fla(cp_context), q, k, v, g, beta, scale, use_qk_l2norm_in_kernel,
            group=cp_context.group, **options)
    return o, None


__all__ = ["chunk_gated_delta_rule", "chunk_gated_delta_rule_fla", "RankLayout",
           "layout_from_global", "layout_from_fla", "carry_prefix", "token_offsets", "run",
           "NEGLIGIBLE_LOG_DECAY"]
