#!/usr/bin/env python3
"""summarize.py - the advantage summary of bench_fwd.py's result rows, split
into the 36 uniform-batch rows and the rest (the two targets of the forward
issue), per commit label, from a results CSV (bench/results/fwd-h200.csv or
a run's own) and the published anchors (bench/anchors_h200.csv).

    python3 bench/summarize.py RESULTS.csv [--commits a,b] [--rows]
    python3 bench/summarize.py RESULTS.csv --pair NEW,BASE [--rows]

--pair compares two builds timed in one process (bench_fwd.py with several
--lib builds, FLA there or not): per row NEW's time over BASE's, their
geomean, and each build's advantage over the best anchor at the anchors'
own published times (best anchor / ours: no FLA needed, so it reads a
little differently from the FLA-relative advantage above; compare within
one run only).

Advantages as docs/benchmarks.md defines them, at the FLA time measured in the
same run: adv_A = (fla_now / ours) / (fla_pub / A_pub); best = the smaller
of FlashQLA's and FlashInfer's. With several rows for one (commit, row),
the last counts. Rows at other head dims, with the in-kernel l2norm or in
another io dtype (bench_fwd.py --head-dim / --value-dim / --l2norm /
--dtype: 'MODEL K64', 'MODEL K256 V512', 'MODEL l2norm', 'MODEL fp32') have
no anchors: they get one line per commit and dims, the geomean and minimum
speedup over FLA.
"""
import argparse
import csv
import math
import os
import re

UNIFORM = {"8192x4", "4096x8", "2048x4", "1024x8"}


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--anchors", default=os.path.join(os.path.dirname(__file__), "anchors_h200.csv"))
    ap.add_argument("--commits", default="", help="comma-separated commit labels (default: every one)")
    ap.add_argument("--rows", action="store_true", help="print every row's advantage")
    ap.add_argument("--pair", default="", help="NEW,BASE: two commit labels timed in one run")
    a = ap.parse_args()
    if a.pair:
        pair(a)
        return
    anchors = {}
    for r in csv.DictReader(open(a.anchors)):
        if r["op"] != "fwd":
            continue
        anchors[(r["model"], r["seqlens"])] = (float(r["fla_ms"]), float(r["flashqla_ms"]), float(r["flashinfer_ms"]))
    runs, other_dims = {}, {}
    for r in csv.DictReader(open(a.results)):
        key = (r["model"], r["seqlens"])
        if r["fla_ms"] in ("", "nan"):
            continue
        if key not in anchors:
            m = re.search(r" ((?:K\d+(?: V\d+)? ?)?(?:l2norm ?)?(?:fp32|fp16)?)$", r["model"])
            if m and r["op"] == "fwd":
                other_dims.setdefault((r["commit"], m.group(1)), {})[key] = float(r["fla_ms"]) / float(r["flashqla_ms"])
            continue
        runs.setdefault(r["commit"], {})[key] = (float(r["flashqla_ms"]), float(r["fla_ms"]))
    want = [c for c in a.commits.split(",") if c] or sorted(runs)
    for c in want:
        rows = runs.get(c, {})
        groups = {"all": [], "uniform": [], "others": []}
        for key, (ours, fla) in sorted(rows.items()):
            fla_pub, fq, fi = anchors[key]
            xf = fla / ours
            adv_fq, adv_fi = xf / (fla_pub / fq), xf / (fla_pub / fi)
            rec = (xf, adv_fq, min(adv_fq, adv_fi), key)
            groups["all"].append(rec)
            groups["uniform" if key[1] in UNIFORM else "others"].append(rec)
            if a.rows:
                print("%-12s %-16s %-14s x_fla %.2f adv_fq %.2f adv_best %.2f" % (c, key[0], key[1], *rec[:3]))
        for g, recs in groups.items():
            if not recs:
                continue
            best = [r[2] for r in recs]
            print("%-12s %-8s rows %3d  x_fla %.2f  adv_fq %.2f  adv_best %.2f  min %.2f  rows>=1 %d" % (
                c, g, len(recs), gmean([r[0] for r in recs]), gmean([r[1] for r in recs]), gmean(best), min(best),
                sum(b >= 1 for b in best)))
    for (c, dims), xs in sorted(other_dims.items()):
        if c not in want and a.commits:
            continue
        print("%-12s %-8s rows %3d  x_fla %.2f  min %.2f" % (c, dims, len(xs), gmean(list(xs.values())), min(xs.values())))
        if a.rows:
            for (model, sl), x in sorted(xs.items()):
                print("%-12s %-16s %-14s x_fla %.2f" % (c, model, sl, x))


def pair(a):
    new, base = a.pair.split(",")
    best = {}
    for r in csv.DictReader(open(a.anchors)):
        if r["op"] == "fwd":
            best[(r["model"], r["seqlens"])] = min(float(r["flashqla_ms"]), float(r["flashinfer_ms"]))
    times = {}
    for r in csv.DictReader(open(a.results)):
        key = (r["model"], r["seqlens"])
        if r["commit"] in (new, base):
            times.setdefault(key, {})[r["commit"]] = float(r["flashqla_ms"])  # the last row counts
    both = [(k, v) for k, v in times.items() if new in v and base in v]
    if not both:
        raise SystemExit("summarize.py: no row has both %s and %s" % (new, base))
    # rows without an anchor (K = 64 / 256, l2norm, fp32 labels): the time ratio only
    other = [v[new] / v[base] for k, v in both if k not in best]
    if other:
        print("%-8s rows %3d  %s / %s: x%.4f (x%.3f - x%.3f)" % ("unanchored", len(other), new, base, gmean(other),
                                                               min(other), max(other)))
    both_anchored = [(k, v) for k, v in both if k in best]
    for group in ("all", "uniform", "others"):
        recs = [(k, v) for k, v in both_anchored if group == "all" or (k[1] in UNIFORM) == (group == "uniform")]
        if not recs:
            continue
        ratio = [v[new] / v[base] for _, v in recs]
        adv_new = [best[k] / v[new] for k, v in recs]
        adv_base = [best[k] / v[base] for k, v in recs]
        print("%-8s rows %3d  %s / %s: x%.4f (x%.3f - x%.3f)  adv best at the anchors' times: %.3f -> %.3f, "
              "min %.3f -> %.3f, rows < 1: %d -> %d" % (
                  group, len(recs), new, base, gmean(ratio), min(ratio), max(ratio), gmean(adv_base), gmean(adv_new),
                  min(adv_base), min(adv_new), sum(x < 1 for x in adv_base), sum(x < 1 for x in adv_new)))
    if a.rows:
        for k, v in sorted(both):
            print("  %-16s %-14s %.4f -> %.4f ms  x%.3f" % (k[0], k[1], v[base], v[new], v[new] / v[base]))


if __name__ == "__main__":
    main()
