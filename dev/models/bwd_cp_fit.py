#!/usr/bin/env python3
"""bwd_cp_fit.py - calibrates the backward chains' CP plan (src/cuda/cp_plan.h,
fqla_cp_bwd_cost) against a sweep of dev/gpu/bwd_cp_sweep.py.

The plan prices a segment length L in chunk steps; this file transcribes that
model with its three constants free (a wave's overhead in steps, the scan's
steps per segment, a pre-pass step's weight against a main-pass step), fits
time(row, L) = base(row) + tau * steps(row, L) by least squares for each
setting on a grid, and reports, for the settings whose choices come closest to
each row's measured best, the regret: the measured time of the model's choice
over the row's best, geomean and worst over the rows. The sweep's rows are
bench/bench_bwd.py's (their sequence splits, 132 SMs, K = V = 128, both
chains).

    python3 dev/models/bwd_cp_fit.py bench/results/bwd-cp-sweep-h100-2026-12-06.csv
    python3 dev/models/bwd_cp_fit.py SWEEP.csv --params 4,2,1.25   (one setting, per row)
"""
import argparse
import collections
import csv
import itertools
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_bwd import BWD_SPLITS  # noqa: E402

HV = {"hk16_hv32": 32, "hk8_hv16": 16, "hk4_hv8": 8, "hk2_hv4": 4}
SLOTS, SLICES, CHAINS, K = 2 * 132, 2, 2, 128
SKIP, SKIP_MIN_L, WINDOW = 0.75, 8, 6  # cp_plan.h's FQLA_CP_BWD_SKIP, FQLA_CP_SKIP_MIN_L, FQLA_CP_BWD_WINDOW


def nseg_of(tokens, L):
    return max(1, ((tokens + 63) // 64 + L - 1) // L)


def steps(L, lens, hv, wave, scan, pre_weight):
    """cp_plan.h's model: chunk steps of segment length L (0: no CP)."""
    chunks, N = (max(lens) + 63) // 64, len(lens)
    units = CHAINS * hv * SLICES
    if L == 0:
        if len(set(lens)) == 1:
            waves = math.ceil(units * N / SLOTS)
            return waves * (chunks + wave)
        spread = math.ceil(units * sum((n + 63) // 64 for n in lens) / SLOTS)
        return max(chunks, spread) + wave * math.ceil(units * N / SLOTS)
    nseg = (chunks + L - 1) // L
    segs = sum(nseg_of(n, L) for n in lens)
    rows = hv * (segs - N)
    full = rows - int((SKIP if L >= SKIP_MIN_L else 0.0) * rows)
    fu, su = CHAINS * full * (SLICES + K // 64), CHAINS * (rows - full) * SLICES
    pre = 0.0
    if rows:
        waves = (L + wave) * math.ceil(fu / SLOTS)
        spread = (fu * (L + wave) + su * (min(L, WINDOW) + wave)) / SLOTS
        pre = pre_weight * max(waves, spread)
    return pre + (L + wave) * math.ceil(units * segs / SLOTS) + scan * nseg


def load(path):
    times, plan = collections.defaultdict(dict), {}
    with open(path) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            key, L, ms = (r["model"], r["seqlens"]), int(r["seg_chunks"]), float(r["ms"])
            if r["planned"] == "1":
                plan[key] = L
            times[key][L] = min(ms, times[key].get(L, math.inf))
    return times, plan


def evaluate(times, params):
    """(tau ms a step, relative fit error, per-row (choice, regret))"""
    num = den = 0.0
    model = {}
    for key, m in times.items():
        s = {L: steps(L, BWD_SPLITS[key[1]], HV[key[0]], *params) for L in m}
        ms_, mt = sum(s.values()) / len(s), sum(m.values()) / len(m)
        model[key] = (s, ms_, mt)
        for L in m:
            num += (s[L] - ms_) * (m[L] - mt)
            den += (s[L] - ms_) ** 2
    tau = num / den if den else 0.0
    err, picks = 0.0, {}
    for key, m in times.items():
        s, ms_, mt = model[key]
        err += sum(((m[L] - mt) - tau * (s[L] - ms_)) ** 2 for L in m) / mt ** 2
        pick = min(m, key=lambda L: s[L])
        picks[key] = (pick, m[pick] / min(m.values()))
    return tau, err, picks


def geomean(xs):
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("--params", default="", help="wave,scan,pre_weight: report this setting row by row")
    a = ap.parse_args()
    times, plan = load(a.sweep)
    today = [times[k][plan[k]] / min(times[k].values()) for k in times if k in plan]
    print("rows %d; the sweep build's plan: regret geomean %.4f, worst %.3f" % (len(times), geomean(today), max(today)))
    if a.params:
        params = tuple(float(x) for x in a.params.split(","))
        tau, err, picks = evaluate(times, params)
        for k, (L, r) in picks.items():
            best = min(times[k], key=times[k].get)
            print("%-10s %-9s planned %4s  model %4d (x%.3f)  best %4d" % (k[0], k[1], plan.get(k, "-"), L, r, best))
        print("params %s: regret geomean %.4f worst %.3f, tau %.4f ms a step" % (
            params, geomean(r for _, r in picks.values()), max(r for _, r in picks.values()), tau))
        return
    res = []
    for params in itertools.product([0, 1, 2, 4, 6, 8, 12], [0, 1, 2, 4], [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]):
        tau, err, picks = evaluate(times, params)
        regrets = [r for _, r in picks.values()]
        res.append((geomean(regrets), max(regrets), err, params, tau))
    res.sort()
    for g, worst, err, params, tau in res[:10]:
        print("regret geomean %.4f worst %.3f  fit error %.3f  wave %g scan %g pre %g  tau %.4f ms" % (
            g, worst, err, *params, tau))


if __name__ == "__main__":
    main()
