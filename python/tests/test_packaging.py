"""Issue 44: the version's one source, and B = 0 in the chunked forward."""
import os

import torch

import flashqla

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_version_matches_VERSION_file():
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert flashqla.__version__ == f.read().strip()


def test_chunk_B0_returns_empty_outputs():
    B, T, H, HV, K = 0, 16, 2, 4, 64
    q = torch.randn(B, T, H, K)
    v = torch.randn(B, T, HV, K)
    g = torch.randn(B, T, HV)
    beta = torch.rand(B, T, HV)
    o, ht = flashqla.chunk_gated_delta_rule(q, q, v, g, beta, output_final_state=True)
    assert o.shape == (0, T, HV, K) and o.dtype == q.dtype
    assert ht.shape == (0, HV, K, K) and ht.dtype == torch.float32
    o, ht = flashqla.chunk_gated_delta_rule(q, q, v, g, beta)
    assert o.shape == (0, T, HV, K) and ht is None
