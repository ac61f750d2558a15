"""flashqla: Gated DeltaNet (GDN) linear-attention kernels for PyTorch.

    import flashqla
    o, ht = flashqla.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    o = flashqla.decode(q, k, v, a, b, A_log, dt_bias, state_pool, slots)
    # vLLM's / SGLang's and FLA's recurrent signatures (docs/serving.md)
    o, pool = flashqla.fused_sigmoid_gating_delta_rule_update(
        A_log, a, b, dt_bias, q, k, v, initial_state=pool, inplace_final_state=True,
        cu_seqlens=cu_seqlens, ssm_state_indices=indices, use_qk_l2norm_in_kernel=True)
    o, ht = flashqla.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0)
    flashqla.fla.enable()   # serve fla.ops.gated_delta_rule calls from flashqla

A thin layer over the C library libflashqla.so (loaded through ctypes; it is
built ahead of time, nothing is compiled at import or on first call).
"""

from . import _lib
from ._lib import FlashQLAError
from .chunk import chunk_gated_delta_rule
from .serving import decode, verify
from .engines import fused_recurrent_gated_delta_rule, fused_sigmoid_gating_delta_rule_update
from . import autograd as _autograd  # noqa: F401  (registers the op's autograd)

__version__ = _lib.version()
library_path = _lib.path


def set_cpu_threads(threads: int) -> None:
    """Worker threads per call of the CPU backends (0 = every online core)."""
    _lib.set_cpu_threads(threads)


def backend_available(backend: str = "cuda"):
    """(True, '') when the backend ('cpu', 'cuda', 'reference') is compiled in
    and has a device, else (False, reason)."""
    from .ops import backend_code
    code = backend_code(backend)
    if code < 0:
        raise ValueError("backend_available needs 'cpu', 'cuda' or 'reference'")
    return _lib.backend_available(code)


def device_info(backend: str = "cpu", device: int = 0) -> dict:
    """What the library's context sees: name, compute capability, SMs or cores."""
    from .ops import backend_code
    return _lib.device_info(backend_code(backend), device)


def __getattr__(name):
    # flashqla.fla imports nothing from FLA until enable() is called, but keep
    # it out of `import flashqla` anyway.
    if name == "fla":
        import importlib
        return importlib.import_module(".fla", __name__)
    raise AttributeError(f"module 'flashqla' has no attribute {name!r}")


__all__ = ["chunk_gated_delta_rule", "decode", "verify",
           "fused_sigmoid_gating_delta_rule_update", "fused_recurrent_gated_delta_rule",
           "set_cpu_threads",
           "backend_available", "device_info", "FlashQLAError", "__version__"]
