#!/usr/bin/env bash
# ncu_prep.sh - ncu on one forward kernel of one benchmark row, from the
# carried flashqla binary ($BIN, default .fwdbin): the details page and the
# per-SASS-line source page (instructions executed, stall samples) as CSV
# under $OUT, and on stdout a few headline metrics and the kernel's warp
# stall reasons (share of the sampled warp states). Used for docs/history/perf-log.md's
# instruction counts and stall profiles.
#
#   dev/gpu/ncu_prep.sh [KERNEL_REGEX] [ROW_FILTER]
#   (default: fwd_prepare, "Sym h32 8192x4"; NCU_CMD: see below)
set -u
OUT=${OUT:-/tmp/ncu_out}
mkdir -p "$OUT"
BIN=${FWD_BIN:-.fwdbin}
. "$(dirname "$0")/unpack.sh"
R=$PWD
export LD_LIBRARY_PATH=$BIN
kern=${1:-fwd_prepare}
row=${2:-Sym h32 8192x4}
rep=$(mktemp -d)/k
# NCU_SKIP: launches of the kernel to pass over before the one profiled
# (e.g. 3: the fourth bwd_chain_kernel of a CP backward, the reverse main pass)
# NCU_CMD: another command to profile instead of the flashqla binary's bench
# (e.g. bench/bench_fwd.py with --variants, for a kernel variant the CLI
# does not pick); its first launch of the kernel is the one profiled
if [ -n "${NCU_CMD:-}" ]; then
  cmd=(env BIN="$BIN" bash -c "$NCU_CMD")
else
  cmd=("$BIN/flashqla" bench --rows "$R/bench/anchors_h200.csv" --filter "$row" --repeat 1 --check-tokens 0
       --out /tmp/ncu_bench.csv)
fi
timeout 300 ncu --clock-control none --set full --import-source yes -k "regex:$kern" --launch-skip "${NCU_SKIP:-0}" -c 1 -o "$rep" \
  "${cmd[@]}" > "$OUT/ncu.log" 2>&1
ncu -i "$rep.ncu-rep" --page details --csv > "$OUT/ncu_details.csv" 2>&1
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass.csv" 2>&1
python3 - "$OUT/ncu_details.csv" <<'PY'
import csv, sys
keep = ("Duration", "Executed Instructions", "Issue Slots Busy", "Issued Warp Per Scheduler", "Eligible Warps Per Scheduler",
        "Achieved Active Warps Per SM", "Registers Per Thread", "DRAM Throughput")
for r in csv.DictReader(open(sys.argv[1])):
    if r["Metric Name"] in keep:
        print(r["Metric Name"], r["Metric Value"], r["Metric Unit"])
PY
ncu -i "$rep.ncu-rep" --page raw --csv > "$OUT/ncu_raw.csv" 2>&1
python3 - "$OUT/ncu_raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((r for r in rows if "ID" in r), None)
if head is None:
    sys.exit("ncu_raw.csv: no header")
data = [r for r in rows[rows.index(head) + 1:] if r and r[0].strip().isdigit()]
pre = "smsp__pcsamp_warps_issue_stalled_"
for r in data[:1]:
    vals = {}
    for name, v in zip(head, r):
        if name.startswith(pre) and not name.endswith("_not_issued"):
            try:
                vals[name[len(pre):]] = float(v.replace(",", ""))
            except ValueError:
                pass
    # the tensor pipe's busy share and the bf16 / fp16 tensor ops against the SM's peak
    for name, v in zip(head, r):
        if name in ("sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
                    "sm__ops_path_tensor_src_bf16_dst_fp32.avg.pct_of_peak_sustained_elapsed",
                    "sm__ops_path_tensor_src_fp16.avg.pct_of_peak_sustained_elapsed"):
            print(name, v)
    total = sum(vals.values()) or 1.0
    print("stall reasons (share of warp samples):",
          ", ".join("%s %.1f%%" % (k, 100 * x / total) for k, x in sorted(vals.items(), key=lambda kv: -kv[1])[:10]))
PY
