#!/usr/bin/env python3
"""Per-kernel comparison of builds timed in one bench_fwd.py --profile run.

    python3 bench/kernel_pair.py LOG [LOG ...] --pair NEW,BASE

LOG is bench_fwd.py's stdout with --profile: a row line per build (its last
column the build's label), then that build's "kernels:" line. For every row
timed in both builds this prints the geomean end-to-end ratio NEW / BASE and,
per kernel role (prepare, fused, chunk, ...), the ratio of the rows' summed
device times. Rows are also split into group 1 (HQ = HV) and groups 2-4. Both
come from one process, so they compare the builds under the same machine
state (the profile's sums move 1-2 % between device calls, and single rows
+-5 %, measured on the H200).
"""
import argparse
import collections
import csv
import os
import re

from summarize import gmean

ROW = re.compile(r"^(\S.*?)\s{2,}(\S+)\s+([0-9.]+)\s+(?:\S+\s+){6}(\S+)$")
KERNELS = re.compile(r"^\s+kernels: (.*)$")
ENTRY = re.compile(r"(\S+?)=([0-9.]+)us")


def parse(paths):
    """{(model, seqlens): {label: {"ms": float, role: us, ...}}}"""
    rows = collections.defaultdict(dict)
    for path in paths:
        cur = None
        for line in open(path):
            m = ROW.match(line)
            if m:
                try:
                    ms = float(m.group(3))
                except ValueError:
                    cur = None
                    continue
                cur = rows[(m.group(1).strip(), m.group(2))].setdefault(m.group(4), {"ms": 0.0, "n": 0})
                cur["ms"] += ms
                cur["n"] += 1
                continue
            m = KERNELS.match(line)
            if m and cur is not None:
                for role, us in ENTRY.findall(m.group(1)):
                    cur[role] = cur.get(role, 0.0) + float(us)
    return rows


def head_counts():
    """{anchor model label: (HQ, HV)} from anchors_h200.csv."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchors_h200.csv")
    with open(path) as f:
        return {r["model"]: (int(r["h_qk"]), int(r["h_v"])) for r in csv.DictReader(f)}


def group_of(model, heads):
    """'g1' where the row's model (its label may carry a dims tag, e.g. 'Sym h32
    K64': the anchor label is a prefix) has HQ = HV, else 'g2-4'."""
    hq, hv = next((hc for name, hc in heads.items() if model.startswith(name)), (0, 1))
    return "g1" if hq == hv else "g2-4"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--pair", required=True, help="NEW,BASE: two build labels")
    a = ap.parse_args()
    new, base = a.pair.split(",")
    heads = head_counts()
    rows = parse(a.logs)
    ratios = collections.defaultdict(list)
    sums = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0.0]))
    for (model, _), builds in rows.items():
        if new not in builds or base not in builds:
            continue
        n, b = builds[new], builds[base]
        g = group_of(model, heads)
        for scope in ("all", g):
            ratios[scope].append((n["ms"] / n["n"]) / (b["ms"] / b["n"]))
            for role in set(n) | set(b):
                if role in ("ms", "n"):
                    continue
                sums[scope][role][0] += n.get(role, 0.0)
                sums[scope][role][1] += b.get(role, 0.0)
    if not ratios:
        raise SystemExit("no row timed in both %s and %s" % (new, base))
    for scope in ("all", "g1", "g2-4"):
        if scope not in ratios:
            continue
        r = ratios[scope]
        gm = gmean(r)
        kern = ", ".join("%s x%.4f" % (role, s[0] / s[1]) for role, s in sorted(sums[scope].items()) if s[1] > 0)
        print("%-5s %3d rows  %s / %s: end to end x%.4f (x%.3f - x%.3f); summed kernel time: %s" %
              (scope, len(r), new, base, gm, min(r), max(r), kern))


if __name__ == "__main__":
    main()
