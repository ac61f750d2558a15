"""sass_by_function.py - which kernels of an object file a change touched.

    python3 dev/sass/sass_by_function.py NEW.o [BASE.o]

Prints, per kernel (function) of the object's sm_90a code, an 8-digit hash
of its SASS; given a second object, also whether each kernel's SASS is the
same as there, and a count of both. The hash covers the instructions and
their offsets in the function, not the file's anonymous-namespace tag
(which follows the source path) or the object's layout. So "same" means
the kernel's machine code did not change, and a change meant for one
template instantiation can be checked to leave the others alone (docs/history/perf-log.md,
session 32: every kernel but PAIR's identical).

The SASS comes from dev/sass/sass.sh (which fetches cuobjdump once into
.sasstools/).
"""
import hashlib
import os
import re
import subprocess
import sys

SASS_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sass.sh")

# the anonymous namespace's tag in a mangled name: _GLOBAL__N__<hash>_<len>_<file>_cu_<hash>
ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_[0-9]+_\w*?_cu_[0-9a-f]{8}")


def functions(sass_text):
    """{kernel name without the anonymous-namespace tag: hash of its SASS} from cuobjdump -sass output"""
    out, name, body = {}, None, []

    def close():
        if name is not None:
            out[name] = hashlib.md5("\n".join(body).encode()).hexdigest()[:8]

    for line in sass_text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            close()
            name, body = ANON.sub("", m.group(1)), []
        elif name is not None and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            # whitespace collapsed: cuobjdump pads the columns to the longest
            # name in the object, so removing another kernel shifts them
            body.append(re.sub(r"\s+", " ", ANON.sub("", line.strip())))
    close()
    return out


def sass(obj):
    res = subprocess.run(["bash", SASS_SH, obj], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit("sass_by_function.py: dev/sass/sass.sh %s failed: %s" % (obj, res.stderr.strip()))
    return functions(res.stdout)


def compare(new, base):
    """lines 'same|DIFF|new|gone HASH NAME' and the counts"""
    lines, counts = [], {}
    for name in sorted(set(new) | set(base)):
        if name not in base:
            kind = "new"
        elif name not in new:
            kind = "gone"
        else:
            kind = "same" if new[name] == base[name] else "DIFF"
        counts[kind] = counts.get(kind, 0) + 1
        lines.append("%-4s %s %s" % (kind, new.get(name, base.get(name)), name))
    lines.append(", ".join("%s %d" % kv for kv in sorted(counts.items())))
    return lines


def main(argv):
    if not argv or argv[0] in ("-h", "--help") or len(argv) > 2:
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    new = sass(argv[0])
    if len(argv) == 1:
        for name, h in sorted(new.items()):
            print(h, name)
        return 0
    print("\n".join(compare(new, sass(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
