#!/usr/bin/env python3
"""bwd_launch_order.py - a list-schedule model of the CUDA backward's chains and
gradient kernel on the bench rows' sequence splits, to predict what a launch
order is worth before timing it (docs/history/2026-12-06-bwdorder.md).

The GPU starts a launch's CTAs in the order of their linear index, each on the
first SM that frees up (one chain or gradient CTA an SM: their registers and
shared memory fill it). The model replays that with a time per CTA:

  chain CTA     (chunks + START) * step; the reverse chain's step 1, the state
                chain's STATE_STEP (both slice pairs of a 128-column value head
                in one CTA, as bwd_chain.cu runs them)
  gradient CTA  GRAD a chunk and q/k head (the GVA group's value heads inside)

Orders modelled:
  index    the chains in index order (sequence fastest), then the gradient
           kernel after the last chain CTA (6bf7b7c)
  longest  the chains longest sequence first (60c59ad), gradient kernel after
  beside   longest first, the gradient kernel's CTAs (shortest sequence first)
           starting once every chain CTA has started, each holding its SM
           until its sequence's chains are done (6cc77dd)

Units are chain steps; --step gives one in microseconds (H100: ~6.8 on the 8k
rows, the longest walk over its chunks) to print milliseconds. The model leaves
out the tails, prepare and CP, and the memory traffic the CTAs share: it ranks
orders, it does not time rows. Against the H100 (bench/results/bwd-ab-order-,
bwd-ab-beside-h100-2026-12-06.csv): longest first, modelled -9 to -11 % on
hk16_hv32 8k_8seq / 32k_4seq / 32k_8seq, measured -7 to -8 %; beside, modelled
-17 / -18 % on hk8_hv16 / hk4_hv8 8k_8seq, measured -7 / -12 % (with the
tails' overlap), and -14 % on hk16_hv32 8k_4seq where nothing was measured:
there the gradient CTAs beside the long chain share its memory bandwidth.

    python3 dev/models/bwd_launch_order.py [--rows hk4_hv8:8k_8seq,...] [--step 6.8]
"""
import argparse
import heapq
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
START = 4          # chain steps a CTA costs beyond its walk (launch, first loads)
STATE_STEP = 0.75  # the state chain's step against the reverse chain's
GRAD = 7.5         # a gradient CTA (chunk, q/k head, group of 2) in chain steps (~50 us / 6.8)
SMS = 132
HEADS = {"hk16_hv32": (16, 32), "hk8_hv16": (8, 16), "hk4_hv8": (4, 8), "hk2_hv4": (2, 4)}


def splits():
    """The bench rows' sequence lengths (bench/bench_bwd.py's BWD_SPLITS)."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
    from bench_bwd import BWD_SPLITS
    return {k: list(v) for k, v in BWD_SPLITS.items()}


def chain_ctas(chunks, hv, order):
    """(sequence, duration) of every chain CTA in launch order."""
    seqs = range(len(chunks)) if order == "index" else sorted(range(len(chunks)), key=lambda i: -chunks[i])
    out = []
    if order == "index":  # grid (sequence, head, chain): x fastest
        for w in (1.0, STATE_STEP):
            for _ in range(hv):
                for i in seqs:
                    out.append((i, (chunks[i] + START) * w))
    else:  # all CTAs of a sequence together, the reverse chain's first
        for i in seqs:
            for w in (1.0, STATE_STEP):
                out += [(i, (chunks[i] + START) * w)] * hv
    return out


def schedule(chunks, hq, hv, order, sms=SMS):
    """The span (chain steps) of the chains and the gradient kernel."""
    free = [0.0] * sms  # each SM's free time
    heapq.heapify(free)
    done = [0.0] * len(chunks)  # when each sequence's chains are done
    last_start = 0.0
    for i, d in chain_ctas(chunks, hv, order):
        t = heapq.heappop(free)
        last_start = max(last_start, t)
        heapq.heappush(free, t + d)
        done[i] = max(done[i], t + d)
    chains_end = max(done)
    grads = [i for i in sorted(range(len(chunks)), key=lambda i: chunks[i]) for _ in range(chunks[i] * hq)]
    if order != "beside":  # the next launch starts when the chains' last CTA ends
        free = [chains_end] * sms
    else:  # PDL: once every chain CTA has started
        free = [max(t, last_start) for t in free]
    heapq.heapify(free)
    end = chains_end
    for i in grads:
        t = heapq.heappop(free)
        fin = max(t, done[i] if order == "beside" else 0.0) + GRAD
        heapq.heappush(free, fin)
        end = max(end, fin)
    return chains_end, end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="model:split,... (default: the multi-sequence rows)")
    ap.add_argument("--step", type=float, default=0.0, help="microseconds a chain step (0: print steps)")
    a = ap.parse_args()
    sp = splits()
    rows = [r.split(":") for r in a.rows.split(",") if r] or [
        (m, s) for m in HEADS for s in ("8k_2seq", "8k_4seq", "8k_8seq", "32k_4seq", "32k_8seq")]
    unit = "ms" if a.step else "steps"
    scale = a.step / 1e3 if a.step else 1.0
    print(f"{'row':20s} {'order':8s} {'chains':>8s} {'+grads':>8s} ({unit}; chains then the gradient kernel)")
    for m, s in rows:
        hq, hv = HEADS[m]
        chunks = [(n + 63) // 64 for n in sp[s]]
        base = None
        for order in ("index", "longest", "beside"):
            c, e = schedule(chunks, hq, hv, order)
            base = base or e
            print(f"{m + ' ' + s:20s} {order:8s} {c * scale:8.3f} {e * scale:8.3f}  {e / base - 1:+.0%}")


if __name__ == "__main__":
    main()
