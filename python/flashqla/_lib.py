"""ctypes binding to libflashqla.so (include/flashqla.h), with no torch in it.

What lives here:
  - locating and loading the shared library (FLASHQLA_LIB, then the copy
    shipped inside the package, then build/ of a source checkout);
  - ctypes mirrors of fqla_tensor, fqla_options, fqla_fwd_args,
    fqla_bwd_args, fqla_decode_args and fqla_device_info, field for field;
  - fast packers that write an argument struct into a ctypes buffer with one
    struct.pack_into call (building ctypes Structures field by field costs
    about 10 us per tensor in CPython, a pack_into about 1 us for all), in
    two forms: every value, or pointers plus cached metadata strings;
  - per-thread contexts, and the status -> Python exception mapping.

The layouts are checked against the C compiler's offsetof() by
python/tests/test_binding.py.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

# --------------------------------------------------------------------------
# Enums (values of include/flashqla.h)

SUCCESS = 0
INVALID_VALUE = 1
INVALID_CONTEXT = 2
NOT_SUPPORTED = 3
ARCH_MISMATCH = 4
MISALIGNED = 5
WORKSPACE_TOO_SMALL = 6
OVERFLOW = 7
ALLOC_FAILED = 8
BACKEND_UNAVAILABLE = 9
DEVICE_ERROR = 10
INTERNAL_ERROR = 11

BACKEND_CPU = 0
BACKEND_CUDA = 1
BACKEND_CPU_REFERENCE = 2

DTYPE_F32 = 0
DTYPE_F16 = 1
DTYPE_BF16 = 2
DTYPE_F64 = 3
DTYPE_I32 = 4
DTYPE_I64 = 5

MAX_DIMS = 6

# --------------------------------------------------------------------------
# Struct mirrors


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("scale", ctypes.c_double),
        ("use_qk_l2norm", ctypes.c_int),
        ("use_gate_in_kernel", ctypes.c_int),
        ("use_beta_sigmoid", ctypes.c_int),
        ("allow_neg_eigval", ctypes.c_int),
        ("state_v_first", ctypes.c_int),
    ]


_FWD_TENSORS_IN = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens")
_FWD_TENSORS_OUT = ("o", "final_state")


class FwdArgs(ctypes.Structure):
    _fields_ = ([(n, Tensor) for n in _FWD_TENSORS_IN]
                + [("cu_seqlens_host", ctypes.c_void_p)]
                + [(n, Tensor) for n in _FWD_TENSORS_OUT]
                + [("opt", Options)])


_BWD_TENSORS_OUT = ("d_o", "d_final_state", "dq", "dk", "dv", "dg", "dbeta",
                    "d_initial_state", "dA_log", "ddt_bias")


class BwdArgs(ctypes.Structure):
    _fields_ = ([(n, Tensor) for n in _FWD_TENSORS_IN]
                + [("cu_seqlens_host", ctypes.c_void_p)]
                + [(n, Tensor) for n in _BWD_TENSORS_OUT]
                + [("opt", Options)])


_DEC_TENSORS_IN = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state_pool", "slots")
_DEC_TENSORS_OUT = ("o", "step_states", "step_slots")


class DecodeArgs(ctypes.Structure):
    _fields_ = ([(n, Tensor) for n in _DEC_TENSORS_IN]
                + [("slots_host", ctypes.c_void_p)]
                + [(n, Tensor) for n in _DEC_TENSORS_OUT]
                + [("opt", Options)])


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int),
        ("name", ctypes.c_char * 128),
        ("cc_major", ctypes.c_int),
        ("cc_minor", ctypes.c_int),
        ("sm_count", ctypes.c_int),
        ("threads", ctypes.c_int),
    ]


# --------------------------------------------------------------------------
# Packers: one struct.Struct per argument struct. A tensor is 15 values
# (data, dtype, ndim, shape[6], strides[6]); a host pointer is 1; the options
# are 6. Native alignment ('@') gives the C layout because every member is
# naturally aligned; the test compares offsets with offsetof().

_T = "Pii6q6q"
_OPT = "d5i"
ABSENT = (0, 0, 0) + (0,) * (2 * MAX_DIMS)


def _packer(n_in, n_out):
    fmt = "@" + _T * n_in + "P" + _T * n_out + _OPT
    return struct.Struct(fmt)


FWD_PACK = _packer(len(_FWD_TENSORS_IN), len(_FWD_TENSORS_OUT))
BWD_PACK = _packer(len(_FWD_TENSORS_IN), len(_BWD_TENSORS_OUT))
DEC_PACK = _packer(len(_DEC_TENSORS_IN), len(_DEC_TENSORS_OUT))

# Fast packers: the same structs, each tensor as its data pointer plus one
# 104-byte string holding the rest (dtype, ndim, shape, strides), and the
# options as one 28-byte string. The strings depend only on a call's
# shapes, strides, dtypes and flags, so the wrappers cache them per call
# signature and a repeated call packs 12-14 values instead of about 200.
META = struct.Struct("@ii6q6q")      # an fqla_tensor after its data pointer
OPT = struct.Struct("@" + _OPT)
META_ABSENT = bytes(META.size)
_TM = f"P{META.size}s"


def _fast_packer(n_in, n_out):
    return struct.Struct(f"@{_TM * n_in}P{_TM * n_out}{OPT.size}s")


FWD_FAST = _fast_packer(len(_FWD_TENSORS_IN), len(_FWD_TENSORS_OUT))
DEC_FAST = _fast_packer(len(_DEC_TENSORS_IN), len(_DEC_TENSORS_OUT))

FwdBuffer = ctypes.c_char * ctypes.sizeof(FwdArgs)
BwdBuffer = ctypes.c_char * ctypes.sizeof(BwdArgs)
DecodeBuffer = ctypes.c_char * ctypes.sizeof(DecodeArgs)

_ZEROS = (0,) * MAX_DIMS


def tensor_values(ptr, dtype, shape, strides):
    """The 15 packed values of one fqla_tensor."""
    pad = _ZEROS[len(shape):]
    return (ptr, dtype, len(shape), *shape, *pad, *strides, *pad)


# --------------------------------------------------------------------------
# Loading


class LibraryNotFound(ImportError):
    pass


def _candidates():
    env = os.environ.get("FLASHQLA_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [os.path.join(here, "libflashqla.so"), os.path.join(repo, "build", "libflashqla.so")]


def _declare(lib):
    P = ctypes.c_void_p
    I = ctypes.c_int
    sig = {
        "fqla_version": (I, []),
        "fqla_status_string": (ctypes.c_char_p, [I]),
        "fqla_context_create": (I, [ctypes.POINTER(P), I, I]),
        "fqla_context_destroy": (I, [P]),
        "fqla_context_set_threads": (I, [P, I]),
        "fqla_last_error": (ctypes.c_char_p, [P]),
        "fqla_context_info": (I, [P, ctypes.POINTER(DeviceInfo)]),
        "fqla_backend_available": (I, [I, ctypes.c_char_p, ctypes.c_size_t]),
    }
    for op in ("fwd", "bwd", "decode", "verify"):
        sig[f"fqla_{op}_supported"] = (I, [P, P])
        sig[f"fqla_{op}_workspace_size"] = (I, [P, P, ctypes.POINTER(ctypes.c_size_t)])
        sig[f"fqla_{op}"] = (I, [P, P, P, ctypes.c_size_t, P])
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def _load():
    errors = []
    for path in _candidates():
        if not os.path.exists(path):
            errors.append(f"{path}: not found")
            continue
        try:
            return _declare(ctypes.CDLL(path)), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise LibraryNotFound(
        "flashqla: could not load libflashqla.so (set FLASHQLA_LIB, run `make` in the "
        "source tree, or `pip install .`): " + "; ".join(errors))


lib, path = _load()

# The run functions once more, without argtypes, for the eager fast paths:
# they pass a context handle, a buffer, None and SIZE_0, which ctypes hands
# over as they are instead of converting each argument (0.4 us a call here).
_raw = ctypes.CDLL(path)
RAW_FWD = _raw.fqla_fwd
RAW_DECODE = _raw.fqla_decode
RAW_FWD.restype = RAW_DECODE.restype = ctypes.c_int
SIZE_0 = ctypes.c_size_t(0)

# --------------------------------------------------------------------------
# Errors


class FlashQLAError(RuntimeError):
    """A failed flashqla call not caused by the arguments or the backend."""


class FlashQLAValueError(ValueError):
    """Bad argument values, alignment, overflow or workspace."""


class FlashQLANotImplementedError(NotImplementedError):
    """No kernel of the chosen backend covers the call, or the backend is missing."""


_VALUE = (INVALID_VALUE, MISALIGNED, OVERFLOW, WORKSPACE_TOO_SMALL)
_NOT_IMPL = (NOT_SUPPORTED, ARCH_MISMATCH, BACKEND_UNAVAILABLE)


def status_string(status):
    s = lib.fqla_status_string(status)
    return s.decode() if s else f"status {status}"


def error(status, ctx, what):
    """The exception for a failed call: ValueError, NotImplementedError or
    RuntimeError subclasses, with the library's message."""
    msg = lib.fqla_last_error(ctx)
    msg = msg.decode(errors="replace") if msg else ""
    text = f"flashqla {what}: {status_string(status)}: {msg}"
    if status in _VALUE:
        return FlashQLAValueError(text)
    if status in _NOT_IMPL:
        return FlashQLANotImplementedError(text)
    return FlashQLAError(text)


# --------------------------------------------------------------------------
# Contexts: one per (backend, device) per thread, so fqla_last_error, which
# is per context, always belongs to this thread's last call.

_local = threading.local()
_all_contexts = []          # every live context, for set_cpu_threads
_all_lock = threading.Lock()
_cpu_threads = 0            # 0 = every online core


def context(backend, device):
    try:
        cache = _local.contexts
    except AttributeError:
        cache = _local.contexts = {}
    key = (backend, device)
    ctx = cache.get(key)
    if ctx is None:
        handle = ctypes.c_void_p()
        st = lib.fqla_context_create(ctypes.byref(handle), backend, device)
        if st != SUCCESS:
            raise error(st, None, "context_create")
        ctx = handle.value
        if backend != BACKEND_CUDA and _cpu_threads:
            lib.fqla_context_set_threads(ctx, _cpu_threads)
        cache[key] = ctx
        with _all_lock:
            _all_contexts.append((backend, ctx))
    return ctx


def context_handle(backend, device):
    """This thread's context for (backend, device) as a ctypes.c_void_p, for
    calls through the RAW_* functions."""
    try:
        return _local.handles[(backend, device)]
    except AttributeError:
        _local.handles = {}
    except KeyError:
        pass
    h = _local.handles[(backend, device)] = ctypes.c_void_p(context(backend, device))
    return h


def set_cpu_threads(threads):
    """Worker threads per call of the CPU backends (0 = every online core)."""
    global _cpu_threads
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    _cpu_threads = int(threads)
    with _all_lock:
        for backend, ctx in _all_contexts:
            if backend != BACKEND_CUDA:
                st = lib.fqla_context_set_threads(ctx, _cpu_threads)
                if st != SUCCESS:
                    raise error(st, ctx, "set_threads")


def device_info(backend, device=0):
    ctx = context(backend, device)
    info = DeviceInfo()
    st = lib.fqla_context_info(ctx, ctypes.byref(info))
    if st != SUCCESS:
        raise error(st, ctx, "context_info")
    return {
        "backend": {BACKEND_CPU: "cpu", BACKEND_CUDA: "cuda",
                    BACKEND_CPU_REFERENCE: "reference"}.get(info.backend, info.backend),
        "device": info.device,
        "name": info.name.decode(errors="replace"),
        "compute_capability": (info.cc_major, info.cc_minor),
        "sm_count": info.sm_count,
        "threads": info.threads,
    }


def backend_available(backend):
    """(True, "") or (False, reason)."""
    why = ctypes.create_string_buffer(256)
    st = lib.fqla_backend_available(backend, why, len(why))
    return st == SUCCESS, why.value.decode(errors="replace")


def version():
    v = lib.fqla_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
