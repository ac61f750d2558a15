"""dev/models/ungated_coords.py: the ungated chunk step equals the gated one in fp64 (both
anchors), the GPU model of the ungated form stays at today's error on the benchmark's gates,
and the per-chunk test sends a chunk whose e^(-gamma_C) overflows fp32 to today's form.
Small shapes (K = V = 32), numpy only, about a second."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import ungated_coords as uc  # noqa: E402


@pytest.mark.parametrize("gate", ["bench", -1.0, -5.0])
@pytest.mark.parametrize("mid", [False, True])
def test_fp64_identity(gate, mid):
    c = uc.make_case(np.random.default_rng(3), 256, 32, gate, "neg")
    Og, Sg, _ = uc.run_chunks(c, uc.gated64)
    Ou, Su, _ = uc.run_chunks(c, uc.ungated64, mid=mid)
    assert uc.rel(Ou, Og) < 1e-12 and uc.rel(Su, Sg) < 1e-12


def test_gated_chunk_matches_recurrence():
    c = uc.make_case(np.random.default_rng(4), 128, 32, "bench", "sigmoid")
    Or, Sr = uc.recurrence64(c)
    Og, Sg, _ = uc.run_chunks(c, uc.gated64)
    assert uc.rel(Og, Or) < 1e-12 and uc.rel(Sg, Sr) < 1e-12


def test_gpu_model_bench_gates():
    c = uc.make_case(np.random.default_rng(5), 512, 32, "bench", "sigmoid")
    today, ungated = uc.measure(c, uc.FORMS[:2])
    for t, u in zip(today[:2], ungated[:2]):
        assert u < uc.THRESHOLD and u < 1.5 * t
    assert ungated[2] == 1.0  # every chunk ran the ungated form


def test_fallback_where_exp_overflows():
    # -gamma_C = 96: e^96 is past fp32's range, so the pure ungated form overflows and the
    # hybrid must run today's form in every chunk
    c = uc.make_case(np.random.default_rng(6), 256, 32, -96 / 64, "sigmoid")
    today, ungated, _, hybrid = uc.measure(c, uc.FORMS)
    assert not np.isfinite(ungated[0])
    assert hybrid[2] == 0.0 and hybrid[0] == today[0] and hybrid[1] == today[1]
