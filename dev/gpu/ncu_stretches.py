"""ncu_stretches.py - where a kernel's warps wait, by stretch between CTA barriers.

    python3 dev/gpu/ncu_stretches.py NCU_SASS_CSV [NCU_SASS_CSV ...]

Reads the per-SASS-instruction source page that dev/gpu/ncu_prep.sh writes
(ncu_sass.csv: `ncu --page source --csv --print-source sass`) and prints, for
each stretch of code that ends at a CTA barrier (BAR.SYNC, BAR.RED, a named
barrier), at an EXIT or at a MEMBAR, its warp stall samples (and their share
of the kernel's) and its executed warp instructions. Stretches are in address
order, which is program order within one instantiation of a code path.

How to read it: ncu charges a barrier's wait to the instruction after the
barrier, so a stretch's samples hold the wait at the barrier that *starts*
it (plus its own work). In the prepare kernel a chain of work between two
barriers costs its latency, not its instructions (docs/history/perf-log.md, sessions 31
and 32, where this script's first form, kept in /tmp, found both).

Give two files (e.g. a build and its base, same row) to compare them stretch
by stretch: the addresses differ, so match the stretches by their ending
instruction and order.
"""
import csv
import sys

# instructions that end a stretch (matched against the SASS text)
ENDS = ("BAR.SYNC", "BAR.RED", "BAR.ARV", "EXIT", "MEMBAR")


def load(path):
    """(kernel name, [(address, sass text, stall samples, executed warp instructions)])"""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    head = next((r for r in rows if "Address" in r and "Source" in r), None)
    if head is None:
        raise SystemExit("%s: no 'Address' / 'Source' header (not an ncu source page?)" % path)
    ia, isrc = head.index("Address"), head.index("Source")
    ismp = head.index("Warp Stall Sampling (All Samples)")
    iex = head.index("Instructions Executed")

    def num(x):
        x = x.replace(",", "").strip()
        return float(x) if x and x != "-" else 0.0

    out = []
    for r in rows[rows.index(head) + 1:]:
        if len(r) <= max(ia, isrc, ismp, iex):
            continue
        try:
            addr = int(r[ia], 16)
        except ValueError:
            continue
        out.append((addr, r[isrc].strip(), num(r[ismp]), num(r[iex])))
    return kernel, out


def stretches(ins):
    """[(first address, last address, ending instruction, samples, instructions)]; stretches that
    neither ran nor were sampled (dead code, padding) are left out."""
    out, smp, ex, first = [], 0.0, 0.0, None
    for i, (addr, src, s, e) in enumerate(ins):
        if first is None:
            first = addr
        smp += s
        ex += e
        ends = any(k in src for k in ENDS) and "DEPBAR" not in src
        if ends or i == len(ins) - 1:
            if smp > 0 or ex > 0:
                out.append((first, addr, src, smp, ex))
            smp, ex, first = 0.0, 0.0, None
    return out


def report(path):
    kernel, ins = load(path)
    total = sum(x[2] for x in ins) or 1.0
    base = ins[0][0] if ins else 0
    lines = ["%s\n  %s\n  samples %d, warp instructions %d" % (path, kernel[:150], total,
                                                                 sum(x[3] for x in ins))]
    for first, last, src, smp, ex in stretches(ins):
        lines.append("  %6x-%6x  %-40s samples %6d (%5.1f %%)  instructions %10d" %
                     (first - base, last - base, src[:40], smp, 100.0 * smp / total, ex))
    return "\n".join(lines)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    for path in argv:
        print(report(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
