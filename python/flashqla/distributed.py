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
run of tokens from start state S, S_end = H + M S and o = o0 + o_M S per
token and value head, with H and o0 the end state and output from a zero
start, M (K x K) the product of the per-token factors exp(g) (I - beta k k^T)
and o_M (a K-vector per token) the output of a call with zero values (K
columns) from the initial state I, which also gives M (_carried).

Forward, per rank: a first piece that continues from an earlier rank runs
from a zero start (every head, output in place) and, for its heads whose
carried state does not fade, the o_M / M call; pieces that start on the rank
and continue to the next run (their end state is the H the next rank
needs); one all-gather of [kind | H | M] per rank; every rank composes its
start state from the records of the ranks before it, in chain order (fp64,
the same arithmetic on every rank: deterministic); then only the start
state's effect is added: o += o_M S (an in-place product per head). The
gate-driven shortcut, per value head: when every token of the piece is
contractive for the head (beta ||k||^2 in [0, 2], so
||I - beta k k^T|| <= 1) and the head's decay sums to <= -17 within a prefix,
its ||M|| <= e^-17 (below fp32 rounding): the head needs no o_M / M call,
publishes M = 0, and reruns only that prefix from the carried state. Head
subsets run as calls of their own (GVA group 1); when every head fades the
rank publishes H alone (its successors' scan stops there).

Backward (the reverse scan): a rank whose first piece continues from an
earlier rank computes that piece's d(start state) G per head before the
exchange (over the whole piece for the carrying heads, over the prefix for
the fading ones; fqla_bwd with no gradient from the end, asked for dh0
alone where the backend's mode for it is tested); one all-gather of those,
under which the kept backward of every piece that needs nothing from later
ranks runs; every rank whose
last piece continues composes its end-state gradient D = G_j + M_j^T D over
the ranks after it (the M_j kept from the forward) and runs fqla_bwd with it
as d_final_state. Gradients of A_log / dt_bias are each rank's own share (a
data-parallel reduction sums them, as for any replicated parameter).

FLA 0.6's zigzag layout gives a rank two separate token ranges (chain
positions r and 2W - 1 - r); the code therefore works on parts (a token
range at one chain position: one per rank, or two), and the records, the
scans and the "rank before / after" above are per part, in chain order.

Every rank of the group must call the forward and, when gradients are
needed, the backward (they are collectives). initial_state and
output_final_state are not offered (as in FLA's context parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from . import ops
from .chunk import prepare

# log of the bound on ||M|| below which the carried state is dropped (e^-17 ~ 4e-8)
NEGLIGIBLE_LOG_DECAY = -17.0

# the kind of a rank's record: what its last piece's end state depends on
EMPTY = 0      # no tokens: transparent to the scan
STARTS = 1     # S_end = H (the sequence starts on this rank, or M is negligible)
THROUGH = 2    # S_end = M S_start + H


@dataclass(frozen=True)
class Layout:
    """A part's share of the packed batch: its pieces (token ranges of one
    sequence each, relative to the part, non-empty, in order) and whether the
    first continues a sequence from the part before it in the chain and the
    last one into the part after it."""
    pieces: tuple
    cont_prev: bool
    cont_next: bool

    @property
    def through(self):
        return len(self.pieces) == 1 and self.cont_prev and self.cont_next


@dataclass(frozen=True)
class Part:
    """Consecutive tokens of a rank's buffer, [offset, offset + length), that
    hold chain position `slot` of the batch. A rank holds one part (its
    contiguous slice; slot = rank) or, in FLA's zigzag layout, two."""
    offset: int
    length: int
    layout: Layout
    slot: int


def layout_from_global(cu: Sequence[int], start: int, end: int) -> Layout:
    """The layout of the global tokens [start, end) of a batch with offsets cu."""
    pieces, first_start, last_end = [], None, None
    for n in range(len(cu) - 1):
        lo, hi = max(cu[n], start), min(cu[n + 1], end)
        if hi > lo:
            if not pieces:
                first_start = cu[n]
            pieces.append((lo - start, hi - start))
            last_end = cu[n + 1]
    if not pieces:
        return Layout((), False, False)
    return Layout(tuple(pieces), first_start < start, last_end > end)


def parts_from_global(cu: Sequence[int], offsets: Sequence[int], rank: int) -> list:
    """The part of rank `rank` holding global tokens [offsets[rank], offsets[rank + 1])."""
    a, b = offsets[rank], offsets[rank + 1]
    return [Part(0, b - a, layout_from_global(cu, a, b), rank)]


def _local_layout(cu, is_first, is_last):
    pieces = tuple((cu[i], cu[i + 1]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i])
    if not pieces:
        return Layout((), False, False)
    return Layout(pieces, not is_first, not is_last)


def parts_from_fla(cp_context, T: int) -> list:
    """The parts FLA's cp_context (fla.ops.cp.build_cp_context) describes:
    its cu_seqlens are the rank's local ones; is_first_rank / is_last_rank
    say whether the first / last local sequence starts / ends on this rank.
    FLA 0.6's zigzag layout gives rank r chain positions r and 2W - 1 - r,
    concatenated, with those flags per part."""
    cu = cp_context.cu_seqlens_cpu
    if cu is None:
        cu = cp_context.cu_seqlens.cpu()
    cu = [int(x) for x in cu]
    group = cp_context.group
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if getattr(cp_context, "layout", "contiguous") == "zigzag":
        part, nf = cp_context.part_len, cp_context.front_num_seqs
        first, last = cp_context.is_first_by_part, cp_context.is_last_by_part
        return [Part(0, part, _local_layout(cu[:nf + 1], first[0], last[0]), rank),
                Part(part, T - part, _local_layout([c - part for c in cu[nf:]], first[1], last[1]),
                     2 * world - 1 - rank)]
    return [Part(0, T, _local_layout(cu, cp_context.is_first_rank, cp_context.is_last_rank), rank)]


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

    def part(self, p):
        """The same problem on the tokens of part p (views)."""
        a, b = p.offset, p.offset + p.length
        return _Problem(self.q[:, a:b], self.k[:, a:b], self.v[:, a:b], self.g[:, a:b],
                        self.beta[:, a:b], self.A_log, self.dt_bias, self.scale, self.flags,
                        self.backend)

    def tokens(self, lo, hi):
        """Tokens [lo, hi) (views, as _tok)."""
        return _Problem(*(_tok(x, lo, hi) for x in (self.q, self.k, self.v, self.g, self.beta)),
                        self.A_log, self.dt_bias, self.scale, self.flags, self.backend)

    def tokens_heads(self, lo, hi, idx):
        """Tokens [lo, hi) of value heads idx (copies, as heads())."""
        return self.tokens(lo, hi).heads(idx)

    def heads(self, idx, values=True):
        """The same problem on value heads idx (copies; v None without values),
        each with its own copy of its q/k head (a GVA group of one in the call):
        the per-head shortcut runs the heads that need their transition apart
        from those that do not."""
        H, HV = self.q.shape[2], self.v.shape[2]
        t = torch.tensor(idx, dtype=torch.long, device=self.v.device)
        tq = torch.div(t, HV // H, rounding_mode="floor")
        per_head = (lambda x: None if x is None else x.index_select(0, t))
        return _Problem(self.q.index_select(2, tq), self.k.index_select(2, tq),
                        self.v.index_select(2, t) if values else None, self.g.index_select(2, t),
                        self.beta.index_select(2, t), per_head(self.A_log), per_head(self.dt_bias),
                        self.scale, self.flags, self.backend)


def _tok(x, lo, hi):
    """Tokens [lo, hi) of a [1, T, ...] tensor; a copy where the slice's start
    is not 16-byte aligned (the CUDA backend's TMA needs it)."""
    s = x[:, lo:hi]
    if s.is_cuda and s.data_ptr() % 16:
        s = s.contiguous()
    return s


def _span(pieces):
    """(lo, hi, cu_seqlens as a list) of consecutive pieces."""
    lo, hi = pieces[0][0], pieces[-1][1]
    return lo, hi, [p[0] - lo for p in pieces] + [hi - lo]


def _cu(cu, dev):
    host = torch.tensor(cu, dtype=torch.int64)
    return host.to(device=dev, dtype=torch.int32), host


def _fwd(P, pieces, o, h0=None, final=False):
    """Runs pieces (from h0 [n, HV, K, V] or zero), their o written in place
    (o: the part's output; the library takes the token range as a view);
    returns the final states [n, HV, K, V] when asked."""
    lo, hi, cu = _span(pieces)
    cu_d, cu_h = _cu(cu, P.q.device)
    dst = o[:, lo:hi]
    direct = not (dst.is_cuda and dst.data_ptr() % 16)
    out, ht = ops.fwd_impl(_tok(P.q, lo, hi), _tok(P.k, lo, hi), _tok(P.v, lo, hi),
                           _tok(P.g, lo, hi), _tok(P.beta, lo, hi), P.A_log, P.dt_bias, h0,
                           cu_d, cu_h, P.scale, P.flags, final, P.backend,
                           out=dst if direct else None)
    if not direct:
        dst.copy_(out)
    return ht


def _fwd_heads(P, idx, pieces, o, h0=None, final=False):
    """_fwd on value heads idx of P only (h0: those heads' start states), their
    columns of o written."""
    if len(idx) == P.v.shape[2]:
        return _fwd(P, pieces, o, h0=h0, final=final)
    lo, hi = pieces[0][0], pieces[-1][1]
    Ps = P.tokens_heads(lo, hi, idx)
    sub = o.new_empty((1, hi - lo, len(idx), o.shape[3]))
    ht = _fwd(Ps, [(a - lo, b - lo) for a, b in pieces], sub, h0=h0, final=final)
    o[:, lo:hi, idx] = sub
    return ht


def _carried(P):
    """What the start state S does over the tokens of P (one piece; its
    values are not read): (o_M [1, T, HV, K], M [HV, K, K]), the output and
    the final state of one fqla_fwd with zero values (K columns) from the
    initial state I. The state is linear in its start, so with o0 and H the
    output and end state from a zero start, o = o0 + o_M S per token and
    head, and S_end = H + M S."""
    _, T, HV = P.g.shape
    K = P.q.shape[3]
    eye = torch.eye(K, dtype=P.state_dtype, device=P.q.device).expand(1, HV, K, K).contiguous()
    o_m, m = ops.fwd_impl(P.q, P.k, P.q.new_zeros((1, T, HV, K)), P.g, P.beta, P.A_log,
                          P.dt_bias, eye, None, None, P.scale, P.flags, True, P.backend)
    return o_m, m[0]


def carry_prefixes(g, beta, k, flags, A_log=None, dt_bias=None):
    """The gate-driven shortcut per value head of one piece (g, beta [1, T, HV],
    k [1, T, H, K], the library's raw inputs and option bits): for each head
    the number of leading tokens after which its carried state is scaled by
    at most e^NEGLIGIBLE_LOG_DECAY, or None where the head does not decay that
    far within the piece or one of its tokens is not contractive."""
    wide = torch.float64 if g.dtype == torch.float64 else torch.float32
    g = g.to(wide)
    if flags & ops.GATE_IN_KERNEL:
        g = -A_log.to(wide).exp() * torch.nn.functional.softplus(g + dt_bias.to(wide))
    beta = beta.to(wide)
    if flags & ops.BETA_SIGMOID:
        beta = beta.sigmoid() * (2.0 if flags & ops.NEG_EIGVAL else 1.0)
    # ||k||^2 without a widened copy of k, the value heads of a q/k head as a view
    kk = torch.linalg.vector_norm(k, dim=-1, dtype=wide).square()   # [1, T, H]
    if flags & ops.L2NORM:
        kk = kk / (kk + 1e-6)
    _, T, HV = g.shape
    H = k.shape[2]
    bk = beta.reshape(1, T, H, HV // H) * kk.unsqueeze(-1)  # value head h = q/k head h // (HV/H)
    contractive = ((bk >= 0) & (bk <= 2)).all(1).reshape(HV)
    # the scan along the innermost dimension: torch's CUDA cumsum over an outer
    # one walks the tokens one at a time (47 ms at T = 131k, 12x the forward)
    below = g[0].t().contiguous().cumsum(1) <= NEGLIGIBLE_LOG_DECAY   # [HV, T], monotone in T
    token = torch.arange(T, device=g.device)
    first = torch.where(below, token, T).amin(1)           # first token below, per head
    first, ok = torch.stack([first, (contractive & below[:, -1]).long()]).tolist()
    return [int(f) + 1 if o else None for f, o in zip(first, ok)]


def carry_prefix(g, beta, k, flags, A_log=None, dt_bias=None):
    """The shortcut for every head of the piece at once (carry_prefixes' args):
    the number of leading tokens after which every head's carried state is
    negligible, or None where some head's is not."""
    per_head = carry_prefixes(g, beta, k, flags, A_log, dt_bias)
    return None if any(p is None for p in per_head) else max(per_head)


@dataclass
class _Carry:
    """How the start state of a part's first piece (one that continues from
    an earlier part) enters it, per value head: `fade` heads (their carried
    state is negligible after `prefix` tokens: only the prefix reruns from
    it) and `carry` heads (o += o_M S over the whole piece; M their
    transition). o_M is dropped once used."""
    fade: list
    carry: list
    prefix: int
    o_m: Optional[torch.Tensor] = None
    m: Optional[torch.Tensor] = None


def _plan_carry(Pp, piece):
    """_Carry of the first piece of part problem Pp, with the carry heads'
    o_M and M computed (one library call on those heads)."""
    lo, hi = piece
    Pt = Pp.tokens(lo, hi)
    per_head = carry_prefixes(Pt.g, Pt.beta, Pt.k, Pp.flags, Pp.A_log, Pp.dt_bias)
    fade = [h for h, x in enumerate(per_head) if x is not None]
    carry = [h for h, x in enumerate(per_head) if x is None]
    c = _Carry(fade, carry, max((per_head[h] for h in fade), default=0))
    if carry:
        c.o_m, c.m = _carried(Pt if len(carry) == len(per_head) else Pt.heads(carry, values=False))
    return c


def _apply_carry(Pp, op, piece, c, S):
    """The start state S [1, HV, K, V] into the first piece's output op (run
    from a zero start): the carry heads' o += o_M S, one in-place product per
    head on op's strided columns (no gather of the heads; in o's precision,
    accumulated in fp32, as the forward's own products of a 2-byte output
    round S), then the fading heads' prefix rerun from S."""
    lo, hi = piece
    for j, h in enumerate(c.carry):
        op[0, lo:hi, h].addmm_(c.o_m[0, :, j], S[0, h].to(op.dtype))
    c.o_m = None
    if c.fade:
        _fwd_heads(Pp, c.fade, [(lo, lo + c.prefix)], op, h0=S[:, c.fade])


def _gather(rec, group):
    """All-gather of every rank's rows, asynchronously: (rows of all ranks, work)."""
    parts = [torch.empty_like(rec) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(parts, rec, group=group, async_op=True)
    return parts, work


class _Chain:
    """The gathered records by chain position: kinds[s] and rows[s] of every
    slot s (the headers read in one device-to-host copy)."""

    def __init__(self, gathered):
        heads = torch.cat([part[:, :2] for part in gathered]).tolist()
        rows = [r for part in gathered for r in part.unbind(0)]
        self.kinds = {int(s): int(kind) for kind, s in heads}
        self.rows = {int(s): r for (_, s), r in zip(heads, rows)}
        self.n = max(self.kinds) + 1 if self.kinds else 0

    def kind(self, s):
        return self.kinds.get(s, EMPTY)


def _start_state(chain, slot, HV, K, V):
    """The start state of the part at `slot`: the records of the parts before
    it composed in chain order (fp64, the same arithmetic on every rank)."""
    through = []
    j = slot - 1
    while j >= 0 and chain.kind(j) != STARTS:
        if chain.kind(j) == THROUGH:
            through.append(j)
        j -= 1
    if j < 0:
        raise RuntimeError(f"flashqla.distributed: chain position {slot} continues a sequence that no "
                           "earlier position starts (the ranks' layouts disagree)")
    n = HV * K * V
    S = chain.rows[j][4:4 + n].view(HV, K, V).double()
    for i in reversed(through):
        row = chain.rows[i]
        S = torch.matmul(row[4 + n:].view(HV, K, K).double(), S) + row[4:4 + n].view(HV, K, V).double()
    return S


def _end_grad(gchain, kinds, Ms, slot, HV, K, V):
    """d(end state) of the part at `slot`: the start-state gradients of the
    parts after it, composed back to front (D = G_j + M_j^T D, fp64)."""
    after = []
    j = slot + 1
    while j < gchain.n:
        kind = kinds.get(j, EMPTY)
        if kind != EMPTY:
            after.append(j)
            if kind != THROUGH:
                break
        j += 1
    D = None
    for i in reversed(after):
        G = gchain.rows[i][2:].view(HV, K, V).double()
        D = G if D is None or kinds[i] != THROUGH else \
            G + torch.matmul(Ms[i].double().transpose(1, 2), D)
    if D is None:
        raise RuntimeError(f"flashqla.distributed: chain position {slot} continues a sequence into "
                           "no later position (the ranks' layouts disagree)")
    return D


def _split(L):
    """(the first piece when it continues from before, the other pieces)."""
    return (L.pieces[:1], L.pieces[1:]) if L.cont_prev else ((), L.pieces)


def _zero_gaps(op, L):
    """Zeros the part's tokens outside every piece (past the batch's last
    sequence): they have no output."""
    pos = 0
    for lo, hi in L.pieces + ((op.shape[1], op.shape[1]),):
        if lo > pos:
            op[:, pos:lo].zero_()
        pos = hi


def _forward(P, parts, group):
    """o of this rank's tokens and what the backward needs. Before the
    exchange every part's first piece that continues from before runs from a
    zero start (all heads, its output in place) and its carry heads' o_M / M
    call; after it only the start state's effect is added (_apply_carry)."""
    _, T, HV, V = P.v.shape
    K = P.q.shape[3]
    n = HV * K * V
    o = P.q.new_empty((1, T, HV, V))
    recs = torch.zeros((len(parts), 4 + n + HV * K * K), dtype=P.state_dtype, device=P.q.device)
    subs = [(P.part(p), o[:, p.offset:p.offset + p.length]) for p in parts]
    carries = []
    for p, (Pp, op), rec in zip(parts, subs, recs.unbind(0)):
        L = p.layout
        _zero_gaps(op, L)
        H = rec[4:4 + n].view(HV, K, V)
        kind = STARTS if L.pieces else EMPTY
        first, rest = _split(L)
        c = None
        if first:
            ht = _fwd(Pp, first, op, final=L.through)
            c = _plan_carry(Pp, first[0])
            if L.through:   # a fading head publishes M = 0: the scan then takes its H alone
                H.copy_(ht[0])
                if c.carry:
                    kind = THROUGH
                    rec[4 + n:].view(HV, K, K)[c.carry] = c.m
        if rest and L.cont_next:
            H.copy_(_fwd(Pp, rest, op, final=True)[-1])
        rec[0] = kind
        rec[1] = p.slot
        carries.append(c)
    gathered, work = _gather(recs, group)
    # pieces nobody else needs run under the all-gather
    for p, (Pp, op) in zip(parts, subs):
        rest = _split(p.layout)[1]
        if rest and not p.layout.cont_next:
            _fwd(Pp, rest, op)
    work.wait()
    chain = _Chain(gathered)
    starts = []
    for p, (Pp, op), c in zip(parts, subs, carries):
        S = None
        if c is not None:
            S = _start_state(chain, p.slot, HV, K, V).to(P.state_dtype).unsqueeze(0)
            _apply_carry(Pp, op, p.layout.pieces[0], c, S)
            c.m = None
        starts.append(S)
    # what the reverse scan reads: the kinds, and the transitions of later parts
    Ms = {}
    if any(p.layout.cont_next for p in parts):
        first_slot = min(p.slot for p in parts)
        Ms = {s: chain.rows[s][4 + n:].view(HV, K, K).clone() for s, kind in chain.kinds.items()
              if kind == THROUGH and s > first_slot}
    return o, (starts, carries, dict(chain.kinds), Ms)


def _backward(P, parts, group, saved, d_o):
    """The gradients of this rank's tokens. Before the exchange a part whose
    first piece continues from before computes that piece's d(start state)
    per head: over the whole piece for the carry heads, over the prefix for
    the fading ones (calls whose other gradients are dropped), so that the
    exchange does not wait for a whole backward; the kept backward of a piece
    that needs no gradient from later parts runs under the all-gather."""
    starts, carries, kinds, Ms = saved
    _, T, HV, V = P.v.shape
    K = P.q.shape[3]
    n = HV * K * V
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

    def bwd(p, pieces, h0=None, d_final=None, keep=True):
        """fqla_bwd on pieces of part p; adds the gradients (keep) and returns dh0."""
        lo, hi, cu = _span(pieces)
        lo, hi = lo + p.offset, hi + p.offset
        cu_d, cu_h = _cu(cu, dev)
        out = ops.bwd_impl(_tok(P.q, lo, hi), _tok(P.k, lo, hi), _tok(P.v, lo, hi),
                           _tok(P.g, lo, hi), _tok(P.beta, lo, hi), P.A_log, P.dt_bias, h0,
                           cu_d, cu_h, _tok(d_o, lo, hi).contiguous(), d_final, P.scale,
                           P.flags, P.backend, dh0_only=not keep)
        if keep:
            for full, part in zip(grads, out[:5]):
                full[:, lo:hi] = part
            if gate:
                dA.add_(out[6])
                ddt.add_(out[7])
        return out[5]

    def dh0_heads(p, idx, piece, S):
        """d(start state) [len(idx), K, V] of value heads idx over one piece of
        part p, from their start states in S [1, HV, K, V] and no gradient from
        the piece's end; the call's other gradients are dropped."""
        if len(idx) == HV:
            return bwd(p, [piece], h0=S, keep=False)[0]
        lo, hi = piece[0] + p.offset, piece[1] + p.offset
        Ps = P.tokens_heads(lo, hi, idx)
        cu_d, cu_h = _cu([0, hi - lo], dev)
        d_sub = _tok(d_o, lo, hi).index_select(2, torch.tensor(idx, dtype=torch.long, device=dev))
        out = ops.bwd_impl(Ps.q, Ps.k, Ps.v, Ps.g, Ps.beta, Ps.A_log, Ps.dt_bias,
                           S[:, idx], cu_d, cu_h, d_sub, None, P.scale, P.flags,
                           P.backend, dh0_only=True)
        return out[5][0]

    recs = torch.zeros((len(parts), 2 + n), dtype=P.state_dtype, device=dev)
    deferred = []   # (part, start state): first pieces whose kept backward runs under the exchange
    for p, S, c, rec in zip(parts, starts, carries, recs.unbind(0)):
        L = p.layout
        rec[0] = kinds.get(p.slot, EMPTY)
        rec[1] = p.slot
        if c is None:
            continue
        G = rec[2:].view(HV, K, V)
        piece = L.pieces[0]
        if not L.through and not c.fade:   # the kept backward itself is the cheapest way to G
            G.copy_(bwd(p, [piece], h0=S)[0])
            continue
        if c.carry:
            G[c.carry] = dh0_heads(p, c.carry, piece, S)
        if c.fade:
            G[c.fade] = dh0_heads(p, c.fade, (piece[0], piece[0] + c.prefix), S)
        if not L.through:
            deferred.append((p, S))
    gathered, work = _gather(recs, group)
    for p, S in deferred:
        bwd(p, [p.layout.pieces[0]], h0=S)
    for p in parts:   # no gradient comes from later parts: run under the all-gather
        rest = _split(p.layout)[1]
        if rest and not p.layout.cont_next:
            bwd(p, rest)
    work.wait()
    gchain = _Chain(gathered)
    for p, S in zip(parts, starts):
        L = p.layout
        if not L.cont_next:
            continue
        D = _end_grad(gchain, kinds, Ms, p.slot, HV, K, V).to(gd)
        if L.through:
            bwd(p, L.pieces, h0=S, d_final=D.unsqueeze(0))
        else:
            rest = _split(L)[1]
            d_final = torch.zeros((len(rest), HV, K, V), dtype=gd, device=dev)
            d_final[-1] = D
            bwd(p, rest, d_final=d_final)
    return grads, dA, ddt


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, parts, group, scale, flags, backend, q, k, v, g, beta, A_log, dt_bias):
        P = _Problem(q, k, v, g, beta, A_log, dt_bias, scale, flags, backend)
        o, saved = _forward(P, parts, group)
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias)
        ctx.cp = (parts, group, scale, flags, backend, saved)
        ctx.set_materialize_grads(False)
        return o

    @staticmethod
    def backward(ctx, d_o):
        parts, group, scale, flags, backend, saved = ctx.cp
        q, k, v, g, beta, A_log, dt_bias = ctx.saved_tensors
        P = _Problem(q, k, v, g, beta, A_log, dt_bias, scale, flags, backend)
        (dq, dk, dv, dg, dbeta), dA, ddt = _backward(P, parts, group, saved, d_o)

        def cast(x, like):
            return None if x is None or like is None else x.to(like.dtype)
        return (None, None, None, None, None, dq, dk, dv, cast(dg, g), cast(dbeta, beta),
                cast(dA, A_log), cast(ddt, dt_bias))


def _check_supported(q, k, v, g, beta, A_log, dt_bias, scale, flags, be, backward):
    """Raises what the library would raise on this rank's calls, before any
    collective: every rank of the group decides alike (same shapes but T,
    dtypes, backend), so none is left waiting in an all-gather. The check
    reads shapes only, on one token."""
    one = [x.new_empty((1, 1) + tuple(x.shape[2:])) for x in (q, k, v, g, beta)]
    err = ops.fwd_supported(*one, A_log, dt_bias, None, None, None, scale, flags, False, be,
                            backward=backward)
    if err is None:   # the call that gives a carried state's effect (_carried): K value columns
        HV, K = v.shape[2], q.shape[3]
        eye = q.new_empty((1, HV, K, K), dtype=ops.state_dtype_for(q, None))
        err = ops.fwd_supported(one[0], one[1], v.new_empty((1, 1, HV, K)), one[3], one[4], A_log,
                                dt_bias, eye, None, None, scale, flags, True, be)
    if err is not None:
        raise err


@torch.compiler.disable   # collectives and host-side planning: a graph break, as FLA's CP
def run(parts, q, k, v, g, beta, scale=None, use_qk_l2norm_in_kernel=False, *,
        use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, group=None, backend=None):
    """o of this rank's tokens, laid out as `parts` (a list of Part; every
    rank of the group passes as many)."""
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError("flashqla.distributed: q must be [1, T_rank, H, K] (one packed batch per group)")
    if sum(p.length for p in parts) != q.shape[1]:
        raise ValueError(f"flashqla.distributed: the parts cover {sum(p.length for p in parts)} tokens, "
                         f"q has {q.shape[1]}")
    if group is None:
        group = dist.group.WORLD
    (q, k, v, g, beta, A_log, dt_bias, _, _, _, scale, flags, _, be) = prepare(
        q, k, v, g, beta, scale, None, False, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, False, None, None, None,
        backend)
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                           for x in (q, k, v, g, beta, A_log, dt_bias))
    _check_supported(q, k, v, g, beta, A_log, dt_bias, scale, flags, be, grad)
    if grad:
        return _ContextParallel.apply(parts, group, scale, flags, be, q, k, v, g, beta, A_log,
                                      dt_bias)
    P = _Problem(q, k, v, g, beta, A_log, dt_bias, scale, flags, be)
    return _forward(P, parts, group)[0]


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
    o = run(parts_from_global(cu, offsets, rank), q, k, v, g, beta, scale,
            use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
            dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, group=group, backend=backend)
    return o, None


def chunk_gated_delta_rule_fla(q, k, v, g, beta, cp_context, scale=None,
                               use_qk_l2norm_in_kernel=False, **options):
    """The same with the layout of FLA's cp_context (flashqla.fla routes FLA
    calls that carry one here)."""
    o = run(parts_from_fla(cp_context, q.shape[1]), q, k, v, g, beta, scale,
            use_qk_l2norm_in_kernel, group=cp_context.group, **options)
    return o, None


__all__ = ["chunk_gated_delta_rule", "chunk_gated_delta_rule_fla", "Layout", "Part",
           "layout_from_global", "parts_from_global", "parts_from_fla", "carry_prefix",
           "token_offsets", "run", "NEGLIGIBLE_LOG_DECAY"]
