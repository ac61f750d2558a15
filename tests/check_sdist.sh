#!/usr/bin/env bash
# check_sdist.sh - the sdist builds and installs: `python3 -m build --sdist`,
# then `pip install dist/flashqla-*.tar.gz` into a fresh virtual environment
# (with the system's site packages, for torch), then imports flashqla there
# and runs one CPU forward. Not part of `make test` (a few minutes: pip builds
# the library from the sdist; CUDA=0 by default to keep it short).
#
#   tests/check_sdist.sh                         CPU-only library (FLASHQLA_MAKE_ARGS=CUDA=0)
#   FLASHQLA_MAKE_ARGS= tests/check_sdist.sh     as a user would (CUDA when nvcc is found)
#   needs: python3 -m pip install build
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export FLASHQLA_MAKE_ARGS=${FLASHQLA_MAKE_ARGS-CUDA=0}
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m build --sdist --outdir "$tmp/dist" .
sdist=$(ls "$tmp"/dist/flashqla-*.tar.gz)
files=$(tar tzf "$sdist")
echo "sdist: $sdist ($(printf '%s\n' "$files" | wc -l) files)"
for f in Makefile VERSION LICENSE CHANGELOG.md include/flashqla.h src/api.c src/cpu/gemm.c \
         src/cuda/backend.cu src/cuda/ptx/common.cuh cli/main.c python/flashqla/__init__.py; do
  printf '%s\n' "$files" | grep -x "flashqla-[^/]*/$f" >/dev/null || { echo "FAIL: $f missing from the sdist"; exit 1; }
done
if printf '%s\n' "$files" | grep -E '^flashqla-[^/]*/(src/dev|dev|build|bench)/' >/dev/null; then echo "FAIL: src/dev, dev or build in the sdist"; exit 1; fi
python3 -m venv --system-site-packages "$tmp/venv"
(cd "$tmp" && "$tmp/venv/bin/python" -m pip install -v --no-deps "$sdist")
version=$(cat VERSION)
(cd "$tmp" && env -u FLASHQLA_LIB "$tmp/venv/bin/python" - "$version" <<'PY'
import sys, torch, flashqla
assert flashqla.__version__ == sys.argv[1], (flashqla.__version__, sys.argv[1])
assert "venv" in flashqla.__file__, flashqla.__file__
q = torch.randn(1, 64, 2, 64); v = torch.randn(1, 64, 2, 64)
g = -torch.rand(1, 64, 2); beta = torch.rand(1, 64, 2)
o, ht = flashqla.chunk_gated_delta_rule(q, q, v, g, beta, output_final_state=True,
                                        use_qk_l2norm_in_kernel=True)
assert o.shape == (1, 64, 2, 64) and torch.isfinite(o).all()
print("flashqla", flashqla.__version__, "from the sdist:", flashqla.__file__, "cuda:", flashqla.backend_available("cuda"))
PY
)
echo "PASS check_sdist"
