"""bench/plot.py's readers of the results CSVs (which record counts per row,
the speedups and advantages it draws), on small files and on the recorded
results. Plain Python: only the drawing test needs matplotlib."""

import importlib.util
import math
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(ROOT, "bench")


def load_plot():
    spec = importlib.util.spec_from_file_location("bench_plot", os.path.join(BENCH, "plot.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plot = load_plot()

FWD_HEADER = "op,model,h_qk,h_v,seqlens,flashqla_ms,fla_ms,gpu,commit,date\n"
ANCHORS = ("op,model,h_qk,h_v,seqlens,flashqla_ms,flashinfer_ms,fla_ms\n"
           "fwd,M,2,8,8192x4,1.0,2.0,4.0\n"
           "fwd,M,2,8,1x32768,2.0,1.0,4.0\n"
           "fwd,N,4,8,1024x8,1.0,1.0,1.0\n"
           "bwd,M,2,8,8k_1seq,1.0,,2.0\n")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_fwd_rows_latest_plain_commit_per_row(tmp_path):
    anchors = plot.read_anchors(write(tmp_path, "anchors.csv", ANCHORS))
    assert list(anchors) == [("M", "8192x4"), ("M", "1x32768"), ("N", "1024x8")]  # fwd only, table order
    results = write(tmp_path, "fwd.csv", FWD_HEADER + "".join("fwd,%s,h200,%s,2026-12-01\n" % r for r in [
        ("M,2,8,8192x4,2.0,8.0", "aaaaaaa"),
        ("M,2,8,8192x4,1.0,8.0", "bbbbbbb"),            # later plain commit: counts
        ("M,2,8,8192x4,0.1,8.0", "bbbbbbb-variant"),    # experiment label: skipped
        ("M,2,8,1x32768,1.0,nan", "ccccccc"),           # no FLA time: skipped
        ("M,2,8,1x32768,2.0,4.0", "aaaaaaa"),
        ("M K64,2,8,1x32768,1.0,4.0", "ddddddd"),       # no anchor: not in the table
    ]))
    rows = plot.fwd_rows(results, anchors)
    assert [(r["model"], r["seqlens"], r["commit"]) for r in rows] == [
        ("M", "8192x4", "bbbbbbb"), ("M", "1x32768", "aaaaaaa")]
    r = rows[0]
    # ours 8.0 / 1.0; FlashQLA 4.0 / 1.0; FlashInfer 4.0 / 2.0; adv_best = 8 / max(4, 2)
    assert (r["x_flashqla"], r["x_FlashQLA"], r["x_FlashInfer"], r["adv_best"]) == (8.0, 4.0, 2.0, 2.0)
    assert r["uniform"] and not rows[1]["uniform"]
    assert rows[1]["adv_best"] == pytest.approx((4.0 / 2.0) / max(4.0 / 2.0, 4.0 / 1.0))
    # --commit: that label only, variants included
    picked = plot.fwd_rows(results, anchors, commit="bbbbbbb-variant")
    assert [(r["seqlens"], r["flashqla_ms"]) for r in picked] == [("8192x4", 0.1)]


def test_fwd_rows_of_the_recorded_results_match_summarize():
    anchors = plot.read_anchors(os.path.join(BENCH, "anchors_h200.csv"))
    rows = plot.fwd_rows(os.path.join(BENCH, "results", "fwd-h200.csv"), anchors)
    assert len(anchors) == 171 and 0 < len(rows) <= 171
    assert all(plot.PLAIN_COMMIT.match(r["commit"]) for r in rows)
    assert sum(r["uniform"] for r in rows) <= 36
    for r in rows:  # summarize.py's definition: adv_best = min(adv_fq, adv_fi)
        fla_pub, fq, fi = anchors[(r["model"], r["seqlens"])]
        x = r["fla_ms"] / r["flashqla_ms"]
        assert r["adv_best"] == pytest.approx(min(x / (fla_pub / fq), x / (fla_pub / fi)))
        assert math.isfinite(r["adv_best"]) and r["adv_best"] > 0


def test_decode_rows_latest_point_per_config(tmp_path):
    path = write(tmp_path, "decode.csv",
                 "batch,h_qk,h_v,state_dtype,flashqla_ms,fla_ms,bw_fraction,state_layout,gpu,commit,date\n"
                 "8,16,32,fp32,0.02,0.03,0.5,kv,H200,old,2026-11-30\n"
                 "1,16,32,fp32,0.005,0.004,0.2,kv,H200,old,2026-11-30\n"
                 "8,16,32,fp32,0.01,,0.7,kv,H200,new,2026-11-30\n"
                 "1,16,32,bf16,0.004,0.004,0.1,vk,H200,new,2026-11-30\n")
    series = plot.decode_rows(path)
    assert set(series) == {(16, 32, "fp32", "kv"), (16, 32, "bf16", "vk")}
    pts = series[(16, 32, "fp32", "kv")]
    assert [p["batch"] for p in pts] == [1, 8]                       # sorted by batch
    assert (pts[1]["flashqla_ms"], pts[1]["fla_ms"], pts[1]["commit"]) == (0.01, None, "new")
    assert pts[0]["commit"] == "old" and pts[0]["fla_ms"] == 0.004
    recorded = plot.decode_rows(os.path.join(BENCH, "results", "decode-h200.csv"))
    assert recorded and all(0 < p["bw_fraction"] <= 1.2 for pts in recorded.values() for p in pts)


def test_cpu_rows_latest_label_best_run(tmp_path):
    head = "op,impl,threads,T_measured,seconds,tokens_per_s,host,commit,date\n"
    path = write(tmp_path, "cpu.csv", head +
                 "fwd,chunked,1,8192,1.0,8192.0,EPYC,a1,2026-11-30\n"
                 "fwd,chunked,1,8192,0.5,16384.0,EPYC,b2,2026-11-30\n"
                 "fwd,chunked,1,8192,0.8,10240.0,EPYC,b2,2026-11-30\n"
                 "bwd,chunked,2,8192,2.0,4096.0,EPYC,b2,2026-11-30\n")
    label, rows = plot.cpu_rows(path)
    assert label == "b2"
    best = {(r["op"], r["threads"]): r["tokens_per_s"] for r in rows}
    assert best == {("fwd", 1): 16384.0, ("bwd", 2): 4096.0}
    label, rows = plot.cpu_rows(path, commit="a1")
    assert label == "a1" and [r["tokens_per_s"] for r in rows] == [8192.0]
    with pytest.raises(ValueError, match="no records of commit zz"):
        plot.cpu_rows(path, commit="zz")
    label, rows = plot.cpu_rows(os.path.join(BENCH, "results", "cpu-local.csv"))
    assert rows and all(r["tokens_per_s"] > 0 for r in rows)


def test_clear_message_without_matplotlib(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as e:
        plot.main(["fwd"])
    assert "pip install matplotlib" in str(e.value.code)


def test_draws_the_three_pictures(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (optional) is not installed: drawing not tested")
    plot.main(["--out-dir", str(tmp_path)])
    for name in ("fwd-h200.png", "decode-h200.png", "cpu-local.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 400_000, name
