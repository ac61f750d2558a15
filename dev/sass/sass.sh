#!/usr/bin/env bash
# sass.sh - the SASS of the CUDA kernels, on the dev machine (no GPU needed).
# The toolkit here has nvcc and ptxas but no disassembler; NVIDIA ships
# cuobjdump and nvdisasm as pip wheels, which this fetches once into
# .sasstools/ (ignored by git) and uses from there.
#
#   dev/sass/sass.sh FILE [NAME]
#
# FILE: an object, a library or a binary with sm_90a code (e.g.
# build/obj/src/cuda/fwd_prepare.o); NAME: print only the functions whose
# (mangled) name contains it, e.g. 'fwd_prepare_kernelI13__nv_bfloat16Li128ELi3'.
# Counting instructions or diffing two builds' code needs no device time
# (docs/history/perf-log.md, session 5: the regression hunt).
set -eu
file=${1:?usage: dev/sass/sass.sh FILE [NAME]}
name=${2:-}
dir=$(cd "$(dirname "$0")/../.." && pwd)/.sasstools
if [ ! -x "$dir/cuobjdump" ] || [ ! -x "$dir/nvdisasm" ]; then
  mkdir -p "$dir/whl"
  python3 -m pip download -q --no-deps -d "$dir/whl" 'nvidia-cuda-cuobjdump>=13,<14' 'nvidia-cuda-nvdisasm>=13,<14' >&2
  python3 - "$dir" <<'EOF'
import glob, os, sys, zipfile
d = sys.argv[1]
for w in glob.glob(os.path.join(d, "whl", "*.whl")):
    z = zipfile.ZipFile(w)
    for n in z.namelist():
        base = os.path.basename(n)
        if n.endswith("/bin/" + base) and base in ("cuobjdump", "nvdisasm"):
            with open(os.path.join(d, base), "wb") as f:
                f.write(z.read(n))
            os.chmod(os.path.join(d, base), 0o755)
EOF
fi
PATH=$dir:$PATH
if [ -z "$name" ]; then
  cuobjdump -sass "$file"
else
  # functions start at a "Function : <name>" line
  cuobjdump -sass "$file" | awk -v want="$name" '/Function :/ { keep = index($0, want) > 0 } keep'
fi
