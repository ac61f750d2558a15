#!/usr/bin/env python3
"""plot.py - PNG pictures of the recorded benchmark results (bench/results/).

    python3 bench/plot.py                        # all three into plots/ (in the current folder)
    python3 bench/plot.py fwd --out docs/img/fwd-h200.png
    python3 bench/plot.py decode cpu --out-dir /tmp/plots

What each picture shows:

  fwd     the forward table (bench/anchors_h200.csv, K = V = 128, bf16): per row,
          the speedup over FLA of flashqla (measured, bench/results/fwd-h200.csv,
          FLA timed in the same process), of QwenLM's FlashQLA and of FlashInfer
          (their published times against FLA's published time); and flashqla's
          advantage over the better of the two (summarize.py's adv_best). Each
          row's latest plain-commit record counts (labels such as
          '735fb90-variant' are experiments and are skipped; --commit picks one).
  decode  decode time and the fraction of copy bandwidth against the batch
          (bench/results/decode-h200.csv, the latest commit per point).
  cpu     tokens/s of the CPU paths (bench/results/cpu-local.csv, the latest
          commit label, best run per op, path and thread count). The repository
          holds no ggml measurements, so there is no ggml comparison to draw.

matplotlib is an optional dependency (`pip install matplotlib`); only the
drawing needs it: the readers below are plain Python (python/tests reads
them without matplotlib).
"""
import argparse
import csv
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from summarize import UNIFORM, gmean  # noqa: E402  (the 36 uniform rows; geomean)

RESULTS = os.path.join(HERE, "results")
PLAIN_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


# ---------------------------------------------------------------- readers

def read_anchors(path):
    """{(model, seqlens): (fla_ms, flashqla_ms, flashinfer_ms)} of the published
    forward rows, in table order (dicts keep insertion order)."""
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["op"] == "fwd":
                out[(r["model"], r["seqlens"])] = (float(r["fla_ms"]), float(r["flashqla_ms"]),
                                                   float(r["flashinfer_ms"]))
    return out


def fwd_rows(results_path, anchors, commit=None):
    """One record per anchored row that has a measurement: the last record in
    the file of a plain commit label (or of `commit`) with an FLA time.
    Returns dicts in the anchors' order with the times and the speedups over
    FLA (x_*), and adv_best = x_flashqla / max(x_FlashQLA, x_FlashInfer)."""
    last = {}
    with open(results_path) as f:
        for r in csv.DictReader(f):
            key = (r["model"], r["seqlens"])
            if r["op"] != "fwd" or key not in anchors or r["fla_ms"] in ("", "nan"):
                continue
            if (r["commit"] != commit) if commit else not PLAIN_COMMIT.match(r["commit"]):
                continue
            last[key] = r
    rows = []
    for key, (fla_pub, fq_pub, fi_pub) in anchors.items():
        r = last.get(key)
        if r is None:
            continue
        ours, fla = float(r["flashqla_ms"]), float(r["fla_ms"])
        x_ours, x_fq, x_fi = fla / ours, fla_pub / fq_pub, fla_pub / fi_pub
        rows.append(dict(model=key[0], seqlens=key[1], commit=r["commit"], flashqla_ms=ours, fla_ms=fla,
                         x_flashqla=x_ours, x_FlashQLA=x_fq, x_FlashInfer=x_fi,
                         adv_best=x_ours / max(x_fq, x_fi), uniform=key[1] in UNIFORM))
    return rows


def decode_rows(path):
    """{(h_qk, h_v, state_dtype, state_layout): [point, ...]} sorted by batch; a
    point is a dict (batch, flashqla_ms, fla_ms or None, bw_fraction, commit);
    the last record in the file of each (config, batch) counts."""
    last = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            key = (int(r["h_qk"]), int(r["h_v"]), r["state_dtype"], r["state_layout"])
            last[key + (int(r["batch"]),)] = r
    out = {}
    for (hq, hv, dt, lay, batch), r in last.items():
        out.setdefault((hq, hv, dt, lay), []).append(dict(
            batch=batch, flashqla_ms=float(r["flashqla_ms"]),
            fla_ms=float(r["fla_ms"]) if r["fla_ms"] not in ("", "nan") else None,
            bw_fraction=float(r["bw_fraction"]), commit=r["commit"]))
    for pts in out.values():
        pts.sort(key=lambda p: p["batch"])
    return out


def cpu_rows(path, commit=None):
    """(commit label, [dict(op, impl, threads, tokens_per_s, seconds, T)]): the
    latest commit label in the file (or `commit`), the best tokens/s per op,
    path and thread count among its records (docs/status.md's reading: best
    of alternating runs)."""
    with open(path) as f:
        recs = list(csv.DictReader(f))
    if not recs:
        raise ValueError("%s: no records" % path)
    label = commit or recs[-1]["commit"]
    best = {}
    for r in recs:
        if r["commit"] != label:
            continue
        key = (r["op"], r["impl"], int(r["threads"]))
        if key not in best or float(r["tokens_per_s"]) > best[key]["tokens_per_s"]:
            best[key] = dict(op=r["op"], impl=r["impl"], threads=int(r["threads"]),
                             tokens_per_s=float(r["tokens_per_s"]), seconds=float(r["seconds"]),
                             T=int(r["T_measured"]), host=r["host"])
    if not best:
        raise ValueError("%s: no records of commit %s" % (path, label))
    return label, list(best.values())


# ---------------------------------------------------------------- drawing

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot.py needs matplotlib, an optional dependency: pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_fwd(rows, out, title_gpu="H200"):
    plt = _pyplot()
    if not rows:
        sys.exit("plot.py: no forward rows with a measurement to plot")
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(13, 6.4), sharex=True,
                                 gridspec_kw=dict(height_ratios=[3, 2]))
    xs = range(len(rows))
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.scatter(xs, [r["x_FlashInfer"] for r in rows], s=10, marker="x", color="tab:orange",
               label="FlashInfer (published)")
    ax.scatter(xs, [r["x_FlashQLA"] for r in rows], s=10, marker="^", color="tab:green",
               label="FlashQLA, QwenLM (published)")
    ax.scatter(xs, [r["x_flashqla"] for r in rows], s=12, marker="o", color="tab:blue",
               label="flashqla (this library, measured)")
    ax.set_yscale("log")
    ax.set_ylabel("speedup over FLA")
    ax.set_yticks([0.5, 1, 2, 4, 8])
    ax.set_yticklabels(["0.5", "1", "2", "4", "8"])
    ax.yaxis.set_minor_formatter(plt.NullFormatter())
    ax.legend(loc="upper left", fontsize=8, ncol=3, frameon=False)
    commits = sorted({r["commit"] for r in rows})
    ax.set_title("Forward, K = V = 128, bf16, one %s: %d rows (build %s); FLA = 1" % (
        title_gpu, len(rows), ", ".join(commits)), fontsize=10)

    adv = [r["adv_best"] for r in rows]
    bx.bar(xs, adv, width=0.85, color=["tab:blue" if a >= 1 else "tab:red" for a in adv])
    bx.axhline(1.0, color="0.3", lw=0.8)
    bx.set_ylabel("flashqla / best other\n(speedup ratio)")
    bx.set_ylim(0, max(adv) * 1.1)
    uni = [r["adv_best"] for r in rows if r["uniform"]]
    bx.set_title("flashqla's speedup over FLA / the better published one's: geomean %.2f, min %.2f, "
                 ">= 1 on %d of %d rows%s" % (gmean(adv), min(adv), sum(a >= 1 for a in adv), len(adv),
                                              "; the %d uniform rows: geomean %.2f" % (len(uni), gmean(uni))
                                              if uni else ""), fontsize=9)

    # one tick per model, lines between models
    starts = [i for i, r in enumerate(rows) if i == 0 or r["model"] != rows[i - 1]["model"]]
    ends = starts[1:] + [len(rows)]
    for s in starts[1:]:
        for axis in (ax, bx):
            axis.axvline(s - 0.5, color="0.85", lw=0.6, zorder=0)
    bx.set_xticks([(s + e - 1) / 2 for s, e in zip(starts, ends)])
    bx.set_xticklabels([rows[s]["model"] for s in starts], rotation=30, ha="right", fontsize=7)
    bx.set_xlim(-1, len(rows))
    bx.set_xlabel("rows of the table, by model (each model's sequence-length mixes in table order)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def plot_decode(series, out):
    plt = _pyplot()
    if not series:
        sys.exit("plot.py: no decode rows to plot")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    combos = sorted({(dt, lay) for (_, _, dt, lay) in series})
    colors = dict(zip(combos, ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:gray"]))
    heads = sorted({(hq, hv) for (hq, hv, _, _) in series})
    styles = dict(zip(heads, ["-", "--", ":", "-."]))
    name = {"kv": "[K, V]", "vk": "[V, K]"}
    main_heads = (16, 32) if (16, 32) in heads else heads[0]
    for (hq, hv, dt, lay), pts in sorted(series.items()):
        label = "%s %s" % (dt, name.get(lay, lay))
        b = [p["batch"] for p in pts]
        if (hq, hv) == main_heads:
            ax.plot(b, [p["flashqla_ms"] * 1e3 for p in pts], "o-", color=colors[(dt, lay)],
                    label="flashqla " + label)
            fla = [(p["batch"], p["fla_ms"] * 1e3) for p in pts if p["fla_ms"] is not None]
            if fla:
                ax.plot(*zip(*fla), "x--", color=colors[(dt, lay)], alpha=0.6, label="FLA " + label)
        bx.plot(b, [p["bw_fraction"] for p in pts], styles[(hq, hv)], marker="o", ms=3,
                color=colors[(dt, lay)], label="%s, H %d / HV %d" % (label, hq, hv))
    batches = sorted({p["batch"] for pts in series.values() for p in pts})
    for axis in (ax, bx):
        axis.set_xscale("log")
        axis.set_xticks(batches)
        axis.set_xticklabels([str(b) for b in batches])
        axis.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences, one token each)"); ax.set_ylabel("time per call (us)")
    ax.set_title("Decode time, H = %d, HV = %d, K = V = 128" % main_heads, fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    bx.set_ylim(0, 1.05)
    bx.set_xlabel("batch"); bx.set_ylabel("fraction of copy bandwidth")
    bx.set_title("Decode: state bytes moved / time, against a device copy", fontsize=10)
    bx.legend(fontsize=6, frameon=False, ncol=2, loc="lower right")
    commits = sorted({p["commit"] for pts in series.values() for p in pts})
    fig.suptitle("flashqla decode on one H200 (build %s; bench/results/decode-h200.csv)" % ", ".join(commits),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def plot_cpu(label, rows, out):
    plt = _pyplot()
    rows = sorted(rows, key=lambda r: (r["op"] != "fwd", r["impl"], r["threads"]))
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.6))
    ys = range(len(rows))
    ax.barh(ys, [r["tokens_per_s"] for r in rows],
            color=["tab:blue" if r["op"] == "fwd" else "tab:orange" for r in rows])
    ax.set_yticks(list(ys))
    ax.set_yticklabels(["%s, %s, %d thread%s" % (r["op"], r["impl"], r["threads"], "" if r["threads"] == 1 else "s")
                        for r in rows], fontsize=8)
    for y, r in zip(ys, rows):
        ax.text(r["tokens_per_s"], y, " %.0f" % r["tokens_per_s"], va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("tokens / s (higher is better)")
    hosts = ", ".join(sorted({r["host"] for r in rows}))
    ax.set_title("CPU (%s), build %s, bench/results/cpu-local.csv; no ggml results are recorded" % (hosts, label),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="*", metavar="fwd|decode|cpu",
                    help="pictures to draw (default: all three)")
    ap.add_argument("--out-dir", default="plots", help="folder for the pictures (default: plots/ in the current folder)")
    ap.add_argument("--out", help="the output file (one picture only)")
    ap.add_argument("--fwd", default=os.path.join(RESULTS, "fwd-h200.csv"))
    ap.add_argument("--anchors", default=os.path.join(HERE, "anchors_h200.csv"))
    ap.add_argument("--decode", default=os.path.join(RESULTS, "decode-h200.csv"))
    ap.add_argument("--cpu", default=os.path.join(RESULTS, "cpu-local.csv"))
    ap.add_argument("--commit", help="fwd: this commit label's records instead of the latest plain ones")
    ap.add_argument("--cpu-commit", help="cpu: this commit label instead of the file's last")
    a = ap.parse_args(argv)
    which = a.which or ["fwd", "decode", "cpu"]
    for w in which:
        if w not in ("fwd", "decode", "cpu"):
            ap.error("unknown picture %r: fwd, decode or cpu" % w)
    if a.out and len(which) != 1:
        ap.error("--out names one file: pick one picture (fwd, decode or cpu)")
    _pyplot()  # a clear message before any work when matplotlib is missing
    if not a.out:
        os.makedirs(a.out_dir, exist_ok=True)
    for w in which:
        out = a.out or os.path.join(a.out_dir, {"fwd": "fwd-h200.png", "decode": "decode-h200.png",
                                                 "cpu": "cpu-local.png"}[w])
        if w == "fwd":
            plot_fwd(fwd_rows(a.fwd, read_anchors(a.anchors), a.commit), out)
        elif w == "decode":
            plot_decode(decode_rows(a.decode), out)
        else:
            plot_cpu(*cpu_rows(a.cpu, a.cpu_commit), out)
        print("wrote %s (%d KB)" % (out, (os.path.getsize(out) + 1023) // 1024))


if __name__ == "__main__":
    main()
