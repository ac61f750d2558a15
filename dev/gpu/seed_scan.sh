#!/usr/bin/env bash
# seed_scan.sh - how a GPU test's errors spread over random inputs: runs a
# test program (default build/tests/test_gpu_bwd) once per seed with
# FQLA_SEED and FQLA_TEST_FILTER, and prints per seed its worst value of one
# reported error (default dg) and any FAIL line, then the seeds that failed.
# The tests draw new inputs every run (check_seed, tests/common/check.c), so a
# check near its threshold shows here as a tail, before it shows as a flaky
# failure.
#
#   FILTER=bwd_lengths,bwd_varlen_edges [ERR=dg] [SEEDS='1 2 3'] [SECONDS_MAX=60] \
#     dev/gpu/seed_scan.sh [TEST_BINARY]
#
# SEEDS: the seeds (default 1001 up, as many as SECONDS_MAX allows).
set -u
bin=${1:-build/tests/test_gpu_bwd}
filter=${FILTER:?FILTER: the test cases to run, FQLA_TEST_FILTER syntax}
err=${ERR:-dg}
limit=${SECONDS_MAX:-60}
[ -x "$bin" ] || { echo "seed_scan.sh: $bin is not an executable" >&2; exit 2; }
seeds=${SEEDS:-$(seq 1001 100000)}
end=$((SECONDS + limit))
failed=""
for s in $seeds; do
  [ $SECONDS -ge $end ] && break
  out=$(FQLA_SEED=$s FQLA_TEST_FILTER=$filter "$bin" 2>&1)
  worst=$(printf '%s\n' "$out" | awk -v e="$err" '{ for (i = 1; i < NF; i++) if ($i == e && $(i + 1) + 0 > m) m = $(i + 1) + 0 }
                                                  END { printf "%.3e", m }')
  echo "seed $s worst $err $worst"
  if printf '%s\n' "$out" | grep -q "FAIL"; then
    printf '%s\n' "$out" | grep "FAIL" | head -3
    failed="$failed $s"
  fi
done
echo "failed seeds:${failed:- none}"
