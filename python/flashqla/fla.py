"""flashqla as a backend of flash-linear-attention (FLA).

    import flashqla.fla
    flashqla.fla.enable()        # fla.ops.gated_delta_rule.chunk_gated_delta_rule -> flashqla
    flashqla.fla.disable()

enable() registers a backend for the operation 'gated_delta_rule' in FLA's
backend registry. FLA's dispatcher then offers every call of its public
chunk_gated_delta_rule to flashqla first (priority 1 by default; lower runs
earlier; FLA's own FlashQLA/TileLang backend has 3). The verifier accepts a
call only when flashqla's library says it can run it (fqla_fwd_supported,
and fqla_bwd_supported when an input requires grad, both answered without
launching anything), the call uses nothing flashqla lacks (deprecated
arguments; initial_state or output_final_state together with cp_context);
everything else falls back to the next backend and finally to FLA's Triton
code. (fp32 CUDA tensors were declined while flashqla's fp32 forward was
the slower one; since its chain route it is 1.07-3.09x FLA's fp32 forward
on the 152 rows measured, docs/python.md.) Set FLA_FLASHQLA=0 to switch it off without
code changes. A call with FLA's cp_context (fla.ops.cp.build_cp_context:
one sequence split across the ranks of a process group) runs on
flashqla.distributed with the rank layout that context describes.

Two registry APIs exist: FLA releases on PyPI (0.6: fla.backends with
register()/_get_operation_registry) and the development tree of mid-2026
(fla.ops.backends with a per-operation BackendRegistry); both are handled.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import torch

from . import ops
from .chunk import chunk_gated_delta_rule as _chunk, prepare as _prepare

BACKEND_TYPE = "flashqla"
ENV_VAR = "FLA_FLASHQLA"
OPERATION = "gated_delta_rule"

# FLA's public signature, in its positional order (fla/ops/gated_delta_rule/chunk.py,
# FLA 0.6); the first _SHARED_POSITIONAL are the same in FLA 0.5, whose 15th is
# cp_context where 0.6 has chunk_indices (_fla_positional)
_SHARED_POSITIONAL = 14
_FLA_PARAMS = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
               "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
               "state_v_first", "cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "cp_context")
_FLA_KWARGS = ("use_gate_in_kernel", "A_log", "dt_bias", "chunk_size")


def _fla_positional():
    """The positional parameter names of the loaded FLA's chunk_gated_delta_rule,
    or None when its module is not loaded (FLA calls the backend from it, so
    it is loaded whenever FLA dispatches)."""
    fn = getattr(sys.modules.get("fla.ops.gated_delta_rule.chunk"), "chunk_gated_delta_rule", None)
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in params if p.kind in kinds)


def _bind(args, kwargs):
    """FLA's (args, kwargs) -> one dict of named arguments; raises TypeError
    on anything flashqla does not know (the verifier then rejects)."""
    names = _FLA_PARAMS
    if len(args) > _SHARED_POSITIONAL:
        # past cu_seqlens_cpu the FLA versions differ: bind by the loaded one
        names = _fla_positional()
        if names is None:
            raise TypeError("positional arguments after cu_seqlens_cpu differ between FLA versions; "
                            "pass them by name")
        unknown = [n for n in names[:len(args)] if n not in _FLA_PARAMS and n not in _FLA_KWARGS]
        if unknown:
            raise TypeError(f"unsupported argument {unknown[0]}")
    if len(args) > len(names):
        raise TypeError(f"too many positional arguments ({len(args)})")
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name in bound:
            raise TypeError(f"argument {name} given twice")
        if name not in _FLA_PARAMS and name not in _FLA_KWARGS:
            raise TypeError(f"unsupported argument {name}")
        bound[name] = value
    for name in ("q", "k", "v", "g", "beta"):
        if name not in bound:
            raise TypeError(f"missing argument {name}")
    return bound


def _needs_backward(bound):
    if not torch.is_grad_enabled():
        return False
    for name in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"):
        x = bound.get(name)
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return True
    return False


def _prepared(bound):
    return _prepare(
        bound["q"], bound["k"], bound["v"], bound["g"], bound["beta"], bound.get("scale"),
        bound.get("initial_state"), bound.get("output_final_state", False),
        bound.get("use_qk_l2norm_in_kernel", False), bound.get("use_gate_in_kernel", False),
        bound.get("A_log"), bound.get("dt_bias"), bound.get("use_beta_sigmoid_in_kernel", False),
        bound.get("allow_neg_eigval", False), bound.get("state_v_first", False),
        bound.get("cu_seqlens"), bound.get("cu_seqlens_cpu"), bound.get("cp_context"), None)


def verify_call(*args, **kwargs):
    """(True, None) when flashqla runs this FLA call, else (False, reason)."""
    try:
        bound = _bind(args, kwargs)
    except TypeError as e:
        return False, f"flashqla: {e}"
    cp = bound.get("cp_context")
    if cp is not None:
        why = _cp_unsupported(bound, cp)
        if why:
            return False, why
        # the library's own check below is of this rank's share of the tokens
        bound = dict(bound, cu_seqlens=cp.cu_seqlens, cu_seqlens_cpu=cp.cu_seqlens_cpu,
                     cp_context=None)
    if bound.get("chunk_size", 64) not in (16, 32, 64):
        return False, "chunk_size must be 16, 32 or 64 (FLA raises the error)"
    if bound.get("cu_seqlens") is not None and bound["q"].shape[0] != 1:
        return False, "cu_seqlens with B != 1 (FLA raises the error)"
    q = bound["q"]
    if not isinstance(q, torch.Tensor) or q.device.type not in ("cpu", "cuda"):
        return False, "flashqla runs CPU and CUDA tensors only"
    try:
        prepared = _prepared(bound)
        err = ops.fwd_supported(*prepared, backward=_needs_backward(bound))
    except Exception as e:  # a verifier never raises: the call falls back
        return False, f"flashqla: {e}"
    if err is not None:
        return False, str(err)
    return True, None


def _cp_unsupported(bound, cp):
    """Why flashqla cannot run this call with FLA's cp_context (context
    parallelism across ranks, flashqla.distributed), or None."""
    if getattr(cp, "group", None) is None:
        return "flashqla: cp_context without a process group"
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return "flashqla: cp_context needs an initialised torch.distributed"
    if bound.get("initial_state") is not None or bound.get("output_final_state", False):
        return "initial_state / output_final_state with cp_context (FLA raises the error)"
    if getattr(cp, "cu_seqlens", None) is None:
        return "cp_context without cu_seqlens (FLA raises the error)"
    layout = getattr(cp, "layout", "contiguous")
    if layout not in ("contiguous", "zigzag"):
        return f"flashqla: cp_context layout {layout!r} (flashqla knows 'contiguous' and 'zigzag')"
    return None


def _run_cp(bound):
    from .distributed import chunk_gated_delta_rule_fla
    gate = bound.get("use_gate_in_kernel", False)
    return chunk_gated_delta_rule_fla(
        bound["q"], bound["k"], bound["v"], bound["g"], bound["beta"], bound["cp_context"],
        bound.get("scale"), bound.get("use_qk_l2norm_in_kernel", False),
        use_gate_in_kernel=gate, A_log=bound.get("A_log") if gate else None,
        dt_bias=bound.get("dt_bias") if gate else None,
        use_beta_sigmoid_in_kernel=bound.get("use_beta_sigmoid_in_kernel", False),
        allow_neg_eigval=bound.get("allow_neg_eigval", False))


def run_call(*args, **kwargs):
    bound = _bind(args, kwargs)
    if bound.get("cp_context") is not None:
        return _run_cp(bound)
    bound.pop("chunk_indices", None)
    bound.pop("chunk_size", None)
    if not bound.get("use_gate_in_kernel", False):
        bound.pop("A_log", None)
        bound.pop("dt_bias", None)
    q, k, v, g, beta = (bound.pop(n) for n in ("q", "k", "v", "g", "beta"))
    return _chunk(q, k, v, g, beta, **bound)


def _registry():
    """(BaseBackend class, registry) of the installed FLA."""
    try:
        backends = importlib.import_module("fla.backends")
        if hasattr(backends, "_get_operation_registry"):
            # FLA 0.6: importing the operation's backends module fills its registry
            importlib.import_module(f"fla.ops.{OPERATION}.backends")
            return backends.BaseBackend, backends._get_operation_registry(OPERATION)
    except ImportError:
        pass
    backends = importlib.import_module("fla.ops.backends")
    module = importlib.import_module(f"fla.ops.{OPERATION}.backends")
    backends.BackendRegistry.ensure_initialized(OPERATION)
    registry = getattr(module, "gdr_registry", None) or backends.BackendRegistry._registries[OPERATION]
    return backends.BaseBackend, registry


def _backend_class(base, priority):
    class FlashQLACBackend(base):
        """flashqla (C/CUDA library, AOT-built) for chunk_gated_delta_rule."""
        backend_type = BACKEND_TYPE
        package_name = "flashqla"
        env_var = ENV_VAR
        default_enable = True

        def chunk_gated_delta_rule_verifier(self, *args, **kwargs):
            return verify_call(*args, **kwargs)

        def chunk_gated_delta_rule(self, *args, **kwargs):
            return run_call(*args, **kwargs)

    FlashQLACBackend.priority = priority
    return FlashQLACBackend


def enable(priority: int = 1):
    """Registers flashqla in FLA's gated_delta_rule registry (idempotent;
    calling again changes the priority). Returns the backend object."""
    base, registry = _registry()
    backend = _backend_class(base, priority)()
    registry.register(backend)
    return backend


def disable():
    """Removes flashqla from FLA's registry (no-op when absent)."""
    try:
        _, registry = _registry()
    except ImportError:
        return
    lock = getattr(registry, "_lock", None)
    if lock is not None:
        with lock:
            registry._backends.pop(BACKEND_TYPE, None)
            update = getattr(registry, "_update_active_backend", None)
            if update is not None:
                update()
    else:
        registry._backends.pop(BACKEND_TYPE, None)


def enabled() -> bool:
    try:
        _, registry = _registry()
    except ImportError:
        return False
    return BACKEND_TYPE in registry._backends
