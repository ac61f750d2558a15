#!/usr/bin/env bash
# pack.sh - shrink a folder of carried binaries for the device machine.
#
#   dev/gpu/pack.sh FOLDER
#
# Builds carry every CUDA kernel variant (~21 MB per library or statically
# linked test), so two or three builds exceed the device tool's 64 MiB carry
# limit. xz takes each to ~2 MB. This replaces FOLDER's files (subfolders
# included, e.g. base/) by FOLDER/pack.tar.xz; the device scripts
# (fwd_device.sh, bench/decode_device.sh) unpack it before use.
set -eu
dir=${1:?usage: dev/gpu/pack.sh FOLDER}
[ -d "$dir" ] || { echo "pack.sh: $dir is not a folder" >&2; exit 2; }
[ -f "$dir/pack.tar.xz" ] && { echo "pack.sh: $dir is already packed" >&2; exit 2; }
tmp=$(mktemp)
tar cf - -C "$dir" . | xz -T0 -6 > "$tmp"
find "$dir" -mindepth 1 -delete
mv "$tmp" "$dir/pack.tar.xz" && chmod 644 "$dir/pack.tar.xz"
echo "$dir/pack.tar.xz: $(du -h "$dir/pack.tar.xz" | cut -f1)"
