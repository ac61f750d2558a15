"""dev/sass/sass_by_function.py's parsing of cuobjdump -sass output, on a
small made-up listing: a kernel's hash ignores the anonymous-namespace tag
(which follows the source path) but not its instructions, and compare()
names what changed. CPU only: no cuobjdump is run."""

import importlib.util
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
spec = importlib.util.spec_from_file_location("sass_by_function",
                                              os.path.join(ROOT, "dev", "sass", "sass_by_function.py"))
sbf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sbf)

TAG_A = "_GLOBAL__N__d949ecbb_14_fwd_prepare_cu_a913c3e8"
TAG_B = "_GLOBAL__N__0123abcd_14_fwd_prepare_cu_77777777"


def listing(tag, body_pair, body_lean):
    def fn(name, body):
        return ("\tFunction : _ZN47%s18fwd_prepare_kernelI%sEv\n\t.headerflags @\"EF_CUDA_SM90\"\n" % (tag, name) +
                "".join("        /*%04x*/                   %s ;      /* 0x0000 */\n" % (16 * i, ins)
                        for i, ins in enumerate(body)))
    return "Fatbin elf code:\n" + fn("Lb1E", body_pair) + fn("Lb0E", body_lean)


def test_hash_ignores_the_namespace_tag_not_the_code():
    pair = ["LDC R1, c[0x0][0x28]", "BAR.SYNC.DEFER_BLOCKING 0x0", "EXIT"]
    lean = ["LDC R1, c[0x0][0x28]", "EXIT"]
    a = sbf.functions(listing(TAG_A, pair, lean))
    b = sbf.functions(listing(TAG_B, pair, lean))
    assert sorted(a) == ["_ZN4718fwd_prepare_kernelILb0EEv", "_ZN4718fwd_prepare_kernelILb1EEv"], a
    assert a == b  # another source path, the same code
    c = sbf.functions(listing(TAG_B, pair[:1] + ["BAR.RED.OR.DEFER_BLOCKING 0x0, P0"] + pair[2:], lean))
    lines = sbf.compare(c, a)
    assert lines[-1] == "DIFF 1, same 1", lines
    assert lines[0].startswith("same") and "ILb0E" in lines[0], lines
    assert lines[1].startswith("DIFF") and "ILb1E" in lines[1], lines


def test_compare_names_added_and_removed_kernels():
    lines = sbf.compare({"k1": "aaaa0000", "k2": "bbbb0000"}, {"k2": "bbbb0000", "k3": "cccc0000"})
    assert lines == ["new  aaaa0000 k1", "same bbbb0000 k2", "gone cccc0000 k3", "gone 1, new 1, same 1"], lines
