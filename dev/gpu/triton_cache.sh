# triton_cache.sh - sourced by the device scripts: keeps Triton's cache (FLA's
# compiled kernels and, since FLA sets cache_results, its autotuning choices)
# from one device session to the next, so that the benchmark's FLA baseline
# is not compiled again on every fresh machine. bench_fwd.py ignores the
# cached autotuning choices unless run with --fla-tune cache (bench/README.md).
# A cold FLA row costs ~3-8 s of device time, a warm one ~1-3 s (docs/history/perf-log.md).
#
#   . dev/gpu/triton_cache.sh        # before the first Triton launch:
#                                      # unpacks $TRITON_PACK if carried, sets TRITON_CACHE_DIR
#   triton_cache_save "$OUT"           # at the end: $OUT/triton_cache.tar.xz
#
# On the dev machine, put the returned file back as .tritoncache/triton_cache.tar.xz
# (ignored by git) and name .tritoncache in the next call's carry list.
TRITON_PACK=${TRITON_PACK:-.tritoncache/triton_cache.tar.xz}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
mkdir -p "$TRITON_CACHE_DIR"
if [ -f "$TRITON_PACK" ]; then
  xz -dc "$TRITON_PACK" | tar xf - -C "$TRITON_CACHE_DIR" 2>/dev/null ||
    echo "triton_cache.sh: $TRITON_PACK did not unpack; starting cold" >&2
fi

# Writes the cache (what was carried plus what this session added) to
# $1/triton_cache.tar.xz, one file so that it comes back whole. Nothing when
# the cache is empty (no cache carried, no Triton launch): an empty archive
# copied back would replace a full one on the dev machine.
triton_cache_save() {
  [ -n "$1" ] && [ -d "$TRITON_CACHE_DIR" ] || return 0
  [ -n "$(ls -A "$TRITON_CACHE_DIR")" ] || return 0
  tar cf - -C "$TRITON_CACHE_DIR" . | xz -T0 -6 > "$1/triton_cache.tar.xz"
}
