#!/usr/bin/env bash
# ncu_prep.sh - ncu on one forward kernel of one benchmark row, from the
# carried flashqla binary ($BIN, default .fwdbin): the details page and the
# per-SASS-line source page (instructions executed, stall samples) as CSV
# under $OUT. Used for docs/perf.md's instruction counts.
#
#   tools/gpu/ncu_prep.sh [KERNEL_REGEX] [ROW_FILTER]
#   (default: fwd_prepare, "Sym h32 8192x4")
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
timeout 300 ncu --clock-control none --set full --import-source yes -k "regex:$kern" -c 1 -o "$rep" \
  "$BIN/flashqla" bench --rows "$R/bench/anchors_h200.csv" --filter "$row" --repeat 1 --check-tokens 0 \
  --out /tmp/ncu_bench.csv > "$OUT/ncu.log" 2>&1
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
