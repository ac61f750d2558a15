#!/usr/bin/env python3
"""train_step.py - training a one-layer Gated DeltaNet block on the CPU with
flashqla.chunk_gated_delta_rule (forward and backward run in libflashqla).

What it shows:
  1. a GDN block as Qwen3-Next builds it: q, k, v, gate (a) and beta (b)
     projections, the gate computed inside the kernel from A_log and dt_bias,
     q and k l2-normalised inside the kernel;
  2. the loss and every parameter's gradient agree with plain torch autograd
     through a token-by-token recurrence in float64 (the definition of the
     layer, written out below), at a small size;
  3. a few Adam steps on a toy task (output the previous token) lower the loss.

Run from the repository root after `make` (`make test` runs it):

    PYTHONPATH=python python3 examples/train_step.py

(`pip install .` instead of PYTHONPATH works too; FLASHQLA_LIB=/path/libflashqla.so
picks a library.) Needs torch.
"""
import copy
import sys

import torch
import torch.nn.functional as F

import flashqla


def naive_gdn(q, k, v, a, b, A_log, dt_bias):
    """The Gated DeltaNet recurrence, token by token, in plain torch (differentiable).

    q, k [B, T, H, K]; v [B, T, HV, V]; a, b [B, T, HV]; A_log, dt_bias [HV].
    Value head h reads query/key head h // (HV // H) (grouped-value attention).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)     # in-kernel l2norm
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q.repeat_interleave(HV // H, dim=2) * K ** -0.5          # scale 1/sqrt(K)
    k = k.repeat_interleave(HV // H, dim=2)
    g = -A_log.exp() * F.softplus(a + dt_bias)                    # log decay <= 0
    beta = b.sigmoid()                                            # write strength in (0, 1)
    S = q.new_zeros(B, HV, K, V)                                  # the state: a K x V memory per head
    out = []
    for t in range(T):
        S = S * g[:, t, :, None, None].exp()                      # forget a little
        pred = torch.einsum("bhk,bhkv->bhv", k[:, t], S)          # what the memory says for k
        delta = beta[:, t, :, None] * (v[:, t] - pred)            # delta rule: correct the error
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], delta)
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))     # read with q
    return torch.stack(out, dim=1)                                # [B, T, HV, V]


def flashqla_gdn(q, k, v, a, b, A_log, dt_bias):
    """The same layer through flashqla: one call, chunked, forward and backward in C."""
    o, _ = flashqla.chunk_gated_delta_rule(
        q, k, v, a, b, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,   # g = -exp(A_log) softplus(a + dt_bias)
        use_beta_sigmoid_in_kernel=True)                         # beta = sigmoid(b)
    return o


class GDNBlock(torch.nn.Module):
    """x [B, T, D] -> x + out_proj(GDN(projections of x))."""

    def __init__(self, D=32, H=2, HV=4, K=16, V=16):
        super().__init__()
        self.H, self.HV, self.K, self.V = H, HV, K, V
        self.q_proj = torch.nn.Linear(D, H * K, bias=False)
        self.k_proj = torch.nn.Linear(D, H * K, bias=False)
        self.v_proj = torch.nn.Linear(D, HV * V, bias=False)
        self.a_proj = torch.nn.Linear(D, HV, bias=False)          # raw gate input
        self.b_proj = torch.nn.Linear(D, HV, bias=False)          # beta logit
        self.A_log = torch.nn.Parameter(torch.log(torch.empty(HV).uniform_(1, 16)))
        self.dt_bias = torch.nn.Parameter(torch.zeros(HV))
        self.out_proj = torch.nn.Linear(HV * V, D, bias=False)

    def forward(self, x, gdn):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.K)
        k = self.k_proj(x).view(B, T, self.H, self.K)
        v = self.v_proj(x).view(B, T, self.HV, self.V)
        o = gdn(q, k, v, self.a_proj(x), self.b_proj(x), self.A_log, self.dt_bias)
        return x + self.out_proj(o.reshape(B, T, self.HV * self.V))


def loss_fn(model, x, gdn):
    # toy task: at every position, output the previous token's vector
    target = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    return F.mse_loss(model(x, gdn), target)


def main():
    torch.manual_seed(0)
    model = GDNBlock()
    x = torch.randn(2, 64, 32)                                    # B = 2 sequences of T = 64 tokens

    # 1. flashqla (fp32, CPU backend) against autograd through the float64 recurrence
    loss = loss_fn(model, x, flashqla_gdn)
    loss.backward()
    ref_model = copy.deepcopy(model).double()
    ref_model.zero_grad()
    ref_loss = loss_fn(ref_model, x.double(), naive_gdn)
    ref_loss.backward()
    print("loss: flashqla %.6f, float64 recurrence %.6f" % (loss.item(), ref_loss.item()))
    worst = 0.0
    for (name, p), p_ref in zip(model.named_parameters(), ref_model.parameters()):
        err = ((p.grad.double() - p_ref.grad).abs().max() / p_ref.grad.abs().max()).item()
        worst = max(worst, err)
        print("  grad %-16s max |diff| / max |grad| = %.1e" % (name, err))
    ok = True
    if not (abs(loss.item() - ref_loss.item()) < 1e-4 * ref_loss.item() and worst < 1e-3):
        print("FAIL: flashqla differs from the float64 recurrence (fp32 should agree to ~1e-6)")
        ok = False
    model.zero_grad()

    # 2. a few optimiser steps; the loss goes down
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for step in range(30):
        opt.zero_grad()
        loss = loss_fn(model, x, flashqla_gdn)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 5 == 0 or step == 29:
            print("step %2d  loss %.4f" % (step, losses[-1]))
    if not losses[-1] < 0.5 * losses[0]:
        print("FAIL: the loss did not halve (%.4f -> %.4f)" % (losses[0], losses[-1]))
        ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
