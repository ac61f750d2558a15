"""dev/emu: the library built with its CUDA kernels on the CPU emulator (dev/emu/build.sh),
and a few of the GPU tests' cases run under it against the fp64 reference: the backward's
kernels (wgmma, mbarriers, named barriers, cp.async; its chains' CP), the forward's routes (TMA,
wgmma, mma.sync) and CP on the fp32 chain route and the chunked fp32 kernel; and the ptx
layer's cluster wrappers on a probe kernel (dev/gpu/cluster_probe.cu). Needs a C++ compiler and the CUDA toolkit's headers (no GPU); a few minutes on
two cores."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CUDA = os.environ.get("CUDA_HOME", "/usr/local/cuda")

pytestmark = [
    pytest.mark.skipif(not os.path.exists(os.path.join(CUDA, "include", "cuda_bf16.h")),
                       reason="no CUDA toolkit headers (CUDA_HOME): the emulator compiles the kernels against them"),
    pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler"),
]


@pytest.fixture(scope="module")
def built():
    r = subprocess.run([os.path.join(ROOT, "dev", "emu", "build.sh"), "test_gpu_fwd", "test_gpu_bwd"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    return os.path.join(ROOT, "build", "emu", "cuda", "tests")


def run(built, prog, cases, order=0, async_at="wait"):
    env = dict(os.environ, FQLA_TEST_QUICK="1", FQLA_TEST_FILTER=cases, FQLA_EMU_ORDER=str(order),
               FQLA_EMU_ASYNC=async_at)
    r = subprocess.run([os.path.join(built, prog)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " 0 failed" in r.stdout and "passed" in r.stdout, r.stdout[-2000:]
    return r.stdout


def test_backward_under_emulator(built):
    out = run(built, "test_gpu_bwd", "bwd_gva")
    assert "ok   bwd_gva" in out


def test_backward_reverse_thread_order_copies_at_issue(built):
    # threads in reverse, and every cp.async landing at its issue (a copy into a buffer other
    # threads still read overwrites it under them); the cases above land them at their wait
    out = run(built, "test_gpu_bwd", "bwd_varlen_edges", order=1, async_at="issue")
    assert "ok   bwd_varlen_edges" in out


def test_backward_chains_cp_under_emulator(built):
    # the chains' CP (2048 tokens, segments of 4-6 chunks): both chains' pre-passes, scans and main
    # passes in one launch each, the pre-pass window under moderate decay and none at g = 0, varlen with
    # an empty sequence; then the same calls for dh0 alone (the reverse chain alone)
    out = run(built, "test_gpu_bwd", "bwd_dh0_only")
    assert "ok   bwd_dh0_only" in out
    assert "CP segments of 4 chunks" in out


def test_forward_under_emulator(built):
    # varlen on the fused kernel, the TMA + wgmma chunk kernel and the mma.sync one, each route asserted
    out = run(built, "test_gpu_fwd", "fwd_varlen")
    assert "ok   fwd_varlen" in out


def test_one_kernel_forward_under_emulator(built):
    # issue 42's one-kernel forward (the experiment's mode 26): group 1 / 2, varlen with NaN rows past cu[N],
    # one and two chain warpgroups; the test asserts the experiment's kernel ran, not the two-kernel fallback
    out = run(built, "test_gpu_fwd", "fwd_one_kernel")
    assert "ok   fwd_one_kernel" in out
    out = run(built, "test_gpu_fwd", "fwd_one_kernel", order=1)
    assert "ok   fwd_one_kernel" in out


def test_forward_final_state_alone_under_emulator(built):
    # o absent: the state-only chunk kernel over whole sequences, after forced and planned CP, fp32 on the
    # chain route and (forced) the chunked fp32 kernel and the recurrence; o's buffer must stay unwritten
    out = run(built, "test_gpu_fwd", "fwd_final_only")
    assert "ok   fwd_final_only" in out


def test_forward_fp32_cp_under_emulator(built):
    # CP on the fp32 chain route and the chunked fp32 kernel, 2-chunk segments forced with the shortcut on:
    # varlen edges, g = -20
    # (every transition left out), moderate decay (the end state started late), per-head decay;
    # the final state alone after each
    out = run(built, "test_gpu_fwd", "fwd_fp32_cp_forced")
    assert "ok   fwd_fp32_cp_forced" in out


@pytest.mark.parametrize("order", [0, 1])
def test_cluster_probe_under_emulator(tmp_path, order):
    # clusters of 2, 4 and 8 CTAs: the next rank's row through mapa + ld.shared::cluster, rows
    # stored into every rank's inbox with st.shared::cluster and remote mbarrier arrivals; the
    # emulator keeps each CTA's shared memory apart (order 1: threads and clusters in reverse)
    emu = os.path.join(ROOT, "dev", "emu")
    cudart = tmp_path / "cudart_emu.o"
    obj = tmp_path / "cluster_probe.o"
    exe = tmp_path / "cluster_probe"
    cxx = os.environ.get("CXX", "g++")
    for cmd in ([cxx, "-std=c++17", "-O1", "-c", "-I.", "-I" + os.path.join(CUDA, "include"),
                 os.path.join(emu, "cudart_emu.cpp"), "-o", str(cudart)],
                [os.path.join(emu, "nvcc_emu.sh"), "-Isrc", "-c", "dev/gpu/cluster_probe.cu", "-o", str(obj)],
                [cxx, str(obj), str(cudart), "-o", str(exe), "-lstdc++"]):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, FQLA_EMU_ORDER=str(order), FQLA_EMU_CTA_ORDER=str(order))
    r = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok (0 wrong)") == 3, r.stdout
