#!/usr/bin/env bash
# pack.sh - shrink a folder of carried binaries for the device machine.
#
#   dev/gpu/pack.sh FOLDER
#
# Builds carry every CUDA kernel variant (~21 MB per library or statically
# linked test), so two or three builds exceed the device tool's 64 MiB carry
# limit. This replaces FOLDER's files (subfolders included, e.g. base/) by
# FOLDER/pack.tar.xz; the device scripts (fwd_device.sh, bwd_device.sh,
# bench/decode_device.sh) unpack it before use. xz -9e: its 64 MiB window
# spans a library and the test that links the same kernels statically, and
# builds that differ in one kernel: the backward's library + test_gpu_bwd
# pack to 4.0 MB against 7.7 at -6 (47 s against 15), two such builds to
# 4.2 MB against 15, which leaves room for .whl's 45 MB in one carry.
set -eu
dir=${1:?usage: dev/gpu/pack.sh FOLDER}
[ -d "$dir" ] || { echo "pack.sh: $dir is not a folder" >&2; exit 2; }
[ -f "$dir/pack.tar.xz" ] && { echo "pack.sh: $dir is already packed" >&2; exit 2; }
tmp=$(mktemp)
tar cf - -C "$dir" . | xz -T0 -9e > "$tmp"
find "$dir" -mindepth 1 -delete
mv "$tmp" "$dir/pack.tar.xz" && chmod 644 "$dir/pack.tar.xz"
echo "$dir/pack.tar.xz: $(du -h "$dir/pack.tar.xz" | cut -f1)"
