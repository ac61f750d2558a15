"""The ctypes binding itself: struct layouts equal the C compiler's, the
library loads and answers, statuses map to the documented exceptions."""

import os
import shutil
import subprocess

import pytest
import torch

import flashqla
from flashqla import _lib

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEADER = os.path.join(REPO, "include", "flashqla.h")


def _c_layout(tmp_path):
    """sizeof / offsetof of every mirrored struct, from the C compiler."""
    structs = {
        "fqla_tensor": _lib.Tensor, "fqla_options": _lib.Options,
        "fqla_fwd_args": _lib.FwdArgs, "fqla_bwd_args": _lib.BwdArgs,
        "fqla_decode_args": _lib.DecodeArgs, "fqla_device_info": _lib.DeviceInfo,
    }
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "flashqla.h"',
             'int main(void) {']
    for cname, py in structs.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for field, _ in py._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    lines += ['return 0;', '}']
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.check_call([shutil.which("cc"), "-std=c99", "-I", os.path.dirname(HEADER),
                           str(src), "-o", str(exe)])
    out = subprocess.check_output([str(exe)], text=True)
    return structs, dict(((a, b), int(c)) for a, b, c in (l.split() for l in out.splitlines()))


@pytest.mark.skipif(not (os.path.exists(HEADER) and shutil.which("cc")),
                    reason="needs the source tree's include/flashqla.h and a C compiler")
def test_struct_layout_matches_c(tmp_path):
    import ctypes
    structs, c = _c_layout(tmp_path)
    for cname, py in structs.items():
        assert ctypes.sizeof(py) == c[(cname, "size")], cname
        for field, _ in py._fields_:
            assert getattr(py, field).offset == c[(cname, field)], (cname, field)


def test_packers_match_ctypes_layout():
    import ctypes
    # the struct.Struct packers must cover each ctypes struct up to its options
    for pack, st in ((_lib.FWD_PACK, _lib.FwdArgs), (_lib.BWD_PACK, _lib.BwdArgs),
                     (_lib.DEC_PACK, _lib.DecodeArgs)):
        assert pack.size == st.opt.offset + _lib.Options.state_v_first.offset + 4
        assert pack.size <= ctypes.sizeof(st)
        # a packed buffer reads back through the ctypes mirror
        buf = (ctypes.c_char * ctypes.sizeof(st))()
        vals = []
        for i, (name, ftype) in enumerate(st._fields_):
            if ftype is _lib.Tensor:
                vals += _lib.tensor_values(0x1000 * (i + 1), 2, (3, 4, 5), (20, 5, 1))
            elif ftype is _lib.Options:
                vals += (0.5, 1, 0, 1, 0, 1)
            else:
                vals.append(0x777)
        pack.pack_into(buf, 0, *vals)
        s = st.from_buffer(buf)
        first = getattr(s, st._fields_[0][0])
        assert first.data == 0x1000 and first.ndim == 3 and list(first.shape[:3]) == [3, 4, 5]
        assert list(first.strides[:4]) == [20, 5, 1, 0]
        assert s.opt.scale == 0.5 and s.opt.use_qk_l2norm == 1 and s.opt.state_v_first == 1


def test_fast_packers_write_the_same_bytes():
    """FWD_FAST / DEC_FAST (pointer + cached metadata string per tensor) give
    the bytes of FWD_PACK / DEC_PACK (every value) for random tensors."""
    import ctypes
    import random
    from flashqla import ops
    for full, fast, st, size in ((_lib.FWD_PACK, _lib.FWD_FAST, _lib.FwdArgs, 2),
                                 (_lib.DEC_PACK, _lib.DEC_FAST, _lib.DecodeArgs, 3)):
        assert fast.size == full.size
        vals, fvals = [], []
        for name, ftype in st._fields_:
            if ftype is _lib.Tensor:
                if random.random() < 0.3:
                    x = None
                else:
                    shape = [random.randint(1, 5) for _ in range(random.randint(1, 5))]
                    dt = random.choice(list(ops.DTYPES))
                    x = torch.empty(shape, dtype=dt).transpose(0, -1)
                vals += ops.tv(x)
                fvals += (0 if x is None else x.data_ptr(), ops.meta(x))
            elif ftype is _lib.Options:
                scale, flags = random.random(), random.randrange(32)
                vals += ops.options(scale, flags)
                fvals.append(ops.options_meta(scale, flags))
            else:
                vals.append(random.randrange(1 << 40))
                fvals.append(vals[-1])
        a = (ctypes.c_char * ctypes.sizeof(st))()
        b = (ctypes.c_char * ctypes.sizeof(st))()
        full.pack_into(a, 0, *vals)
        fast.pack_into(b, 0, *fvals)
        assert bytes(a) == bytes(b)


def test_library_answers():
    assert flashqla.__version__ == _lib.version()
    assert os.path.exists(flashqla.library_path)
    info = flashqla.device_info("cpu")
    assert info["name"] == "cpu" and info["sm_count"] >= 1
    ok, why = flashqla.backend_available("cpu")
    assert ok, why
    ok, why = flashqla.backend_available("cuda")
    assert ok or why  # unavailable always says why
    assert _lib.status_string(_lib.NOT_SUPPORTED) == "FQLA_STATUS_NOT_SUPPORTED"


def test_set_cpu_threads():
    flashqla.set_cpu_threads(1)
    try:
        assert flashqla.device_info("cpu")["threads"] == 1
    finally:
        flashqla.set_cpu_threads(0)
    with pytest.raises(ValueError):
        flashqla.set_cpu_threads(-1)


def _small(**kw):
    B, T, H, HV, K, V = 1, 8, 2, 4, 16, 16
    x = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, HV, V),
             g=-torch.rand(B, T, HV), beta=torch.rand(B, T, HV))
    x.update(kw)
    return x


def test_invalid_value_is_value_error():
    x = _small(v=torch.randn(1, 8, 3, 16))  # HV = 3 not a multiple of H = 2
    with pytest.raises(ValueError, match="FQLA_STATUS_INVALID_VALUE"):
        flashqla.chunk_gated_delta_rule(**x)


def test_message_names_the_argument():
    x = _small(beta=torch.rand(1, 8, 5))
    with pytest.raises(ValueError, match="beta"):
        flashqla.chunk_gated_delta_rule(**x)


def test_bad_cu_seqlens_is_value_error():
    x = _small()
    with pytest.raises(ValueError, match="cu_seqlens"):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 5, 3]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 5, 9]))


def test_not_supported_is_not_implemented_error():
    # the reference covers head dims up to 1024
    x = _small(q=torch.randn(1, 2, 1, 1100, dtype=torch.float64),
               k=torch.randn(1, 2, 1, 1100, dtype=torch.float64),
               v=torch.randn(1, 2, 1, 4, dtype=torch.float64),
               g=-torch.rand(1, 2, 1, dtype=torch.float64), beta=torch.rand(1, 2, 1, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="FQLA_STATUS_NOT_SUPPORTED.*K = 1100"):
        flashqla.chunk_gated_delta_rule(**x)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_unavailable_is_not_implemented_error():
    import ctypes
    handle = ctypes.c_void_p()
    st = _lib.lib.fqla_context_create(ctypes.byref(handle), _lib.BACKEND_CUDA, 0)
    assert st != _lib.SUCCESS
    err = _lib.error(st, None, "context_create")
    assert isinstance(err, NotImplementedError), err


def test_error_classes():
    for st, cls in ((_lib.INVALID_VALUE, ValueError), (_lib.MISALIGNED, ValueError),
                    (_lib.OVERFLOW, ValueError), (_lib.WORKSPACE_TOO_SMALL, ValueError),
                    (_lib.NOT_SUPPORTED, NotImplementedError),
                    (_lib.ARCH_MISMATCH, NotImplementedError),
                    (_lib.BACKEND_UNAVAILABLE, NotImplementedError),
                    (_lib.DEVICE_ERROR, RuntimeError), (_lib.INTERNAL_ERROR, RuntimeError),
                    (_lib.ALLOC_FAILED, RuntimeError), (_lib.INVALID_CONTEXT, RuntimeError)):
        err = _lib.error(st, None, "x")
        assert isinstance(err, cls), (st, err)
        assert _lib.status_string(st) in str(err)
    assert not isinstance(_lib.error(_lib.DEVICE_ERROR, None, "x"), (ValueError, NotImplementedError))


def test_python_side_errors():
    x = _small()
    with pytest.raises(ValueError, match="backend"):
        flashqla.chunk_gated_delta_rule(**x, backend="gpu")
    with pytest.raises(NotImplementedError, match="cp_context"):
        flashqla.chunk_gated_delta_rule(**x, cp_context=object())
    with pytest.raises(ValueError, match="A_log"):
        flashqla.chunk_gated_delta_rule(**x, use_gate_in_kernel=True)
    with pytest.raises(TypeError):  # keyword-only past use_qk_l2norm_in_kernel
        flashqla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None,
                                        False, False, True)


def test_nothing_written_on_error():
    x = _small()
    pool = torch.randn(4, 4, 16, 16)
    before = pool.clone()
    with pytest.raises(ValueError, match="slots"):
        flashqla.decode(x["q"][:, :1].expand(2, 1, 2, 16).contiguous(),
                        x["k"][:, :1].expand(2, 1, 2, 16).contiguous(),
                        x["v"][:, :1].expand(2, 1, 4, 16).contiguous(),
                        torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.rand(4), None, pool,
                        torch.tensor([1, 1]))  # duplicate slot
    assert torch.equal(pool, before)
