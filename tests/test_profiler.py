"""torch_tpu.profiler: the runtime's trace ring, the Chrome / Perfetto JSON,
the summary table, the roofline estimate and `torch-tpu trace`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu
from torch_tpu import _C
from torch_tpu import profiler as tp


def _events(prof: tp.profile) -> list[dict]:
    return prof.trace_events()


def test_strict_trace_has_ops_kernels_copies_memory(tmp_path):
    a = torch.randn(64, 32)
    b = torch.randn(32, 16)
    with tp.profile() as prof:
        x = a.to("tpu")
        y = b.to("tpu")
        z = torch.relu(x @ y + 1)
        out = z.cpu()
    torch.testing.assert_close(out, torch.relu(a @ b + 1))
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text())
    ev = data["traceEvents"]
    ops = [e for e in ev if e.get("cat") == "op"]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert {"mm", "add", "relu"} <= {e["name"].split(".")[0] for e in ops}
    # device kernels sit on a stream track of the tpu:0 process
    names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert "stream 0 (default)" in names
    assert {e["pid"] for e in kernels} == {1_000_000}
    mm = [e for e in kernels if e["args"].get("ops") == ["mm"]]
    assert len(mm) == 1 and mm[0]["dur"] > 0
    assert mm[0]["args"]["flops"] == 2 * 64 * 32 * 16
    assert mm[0]["args"]["source"].rsplit("/", 1)[-1].startswith("test_profiler.py:")
    # the kernel runs after the host op launched it, linked by a flow
    mm_op = [e for e in ops if e["name"].startswith("mm")][0]
    assert mm[0]["ts"] >= mm_op["ts"]
    assert sum(e["ph"] == "s" for e in ev) == sum(e["ph"] == "f" for e in ev) >= 3
    copies = [e for e in ev if e.get("cat") == "copy"]
    assert {c["args"]["direction"] for c in copies} >= {"h2d", "d2h"}
    assert sum(c["args"]["bytes"] for c in copies if c["args"]["direction"] == "h2d") == (64 * 32 + 32 * 16) * 4
    mem = [e for e in ev if e.get("ph") == "C" and e["name"] == "memory"]
    assert mem and max(m["args"]["allocated"] for m in mem) >= (64 * 32 + 32 * 16 + 64 * 16) * 4
    assert all(m["args"]["reserved"] >= m["args"]["allocated"] for m in mem)
    assert not _C._trace_enabled()


def test_summary_consistent_with_trace():
    x = torch.randn(128, 128, device="tpu")
    with tp.profile() as prof:
        for _ in range(3):
            x = torch.tanh(x @ x)
        torch.tpu.synchronize()
    rows = prof.key_averages()
    by = {r["name"]: r for r in rows}
    kernels = [e for e in prof.trace_events() if e.get("cat") == "kernel"]
    assert by["tanh"]["calls"] == 3
    total_us = sum(e["dur"] for e in kernels)
    assert abs(sum(r["device_s"] for r in rows) * 1e6 - total_us) < 1e-3 * total_us + 1e-3
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-9
    mm = [r for r in rows if r["flops"] == 3 * 2 * 128 ** 3]
    assert len(mm) == 1
    r = mm[0]
    assert r["gflops_s"] == pytest.approx(r["flops"] / r["device_s"] / 1e9)
    text = prof.summary()
    assert "tanh" in text and "GFLOP/s" in text


def test_defer_fused_kernels_named_after_their_ops_and_cut_reasons():
    x = torch.randn(4096, device="tpu")
    with torch_tpu.execution_mode("defer"):
        with tp.profile() as prof:
            y = (x * 2 + 1).relu()
            y.sum().item()
    kernels = prof.kernels
    fused = [k for k in kernels if k.base_name.startswith("fused(")]
    assert fused, [k.name for k in kernels]
    k = fused[0]
    assert k.site and k.site.rsplit("/", 1)[-1].startswith("test_profiler.py:")
    ops = [prof.ops[c].name for c in k.ops]
    assert len(ops) >= 2 and {"mul.Tensor", "add.Tensor"} <= set(ops), ops
    assert k.flops >= 2 * 4096
    assert any(c["reason"] == "item" and c["site"] and c["site"].rsplit("/", 1)[-1].startswith("test_profiler.py:") for c in prof.cuts)
    ev = prof.trace_events()
    assert any(e.get("cat") == "cut" and e["args"]["reason"] == "item" for e in ev)
    assert any(e.get("cat") in ("plan",) for e in ev) or any(c["cache_hit"] for c in prof.cuts)


def test_roofline_known_gemm(tmp_path):
    n = 1024  # 2n^3 FLOPs over 3 n^2 bf16 values: n / 3 = 341 FLOP/B
    a = torch.randn(n, n, device="tpu", dtype=torch.bfloat16)
    with tp.profile() as prof:
        (a @ a)
    flops, nbytes = 2 * n ** 3, 3 * n * n * 2
    for gen, peak, bw, bound in (("v5e", 197e12, 819e9, "compute"),  # ridge 240 FLOP/B
                                 ("v6e", 918e12, 1640e9, "memory"),  # ridge 560
                                 ("v7x", 2307e12, 7.37e12, "compute")):  # ridge 313
        roof = prof.roofline(gen)
        row = [r for r in roof.rows if r["flops"] == flops][0]
        assert row["bytes"] == nbytes
        assert row["est_s"] == pytest.approx(max(flops / peak, nbytes / bw))
        assert row["bound"] == bound
        assert roof.step_estimate_s == pytest.approx(sum(r["est_s"] for r in roof.rows))
        assert "ESTIMATE" in roof.table()


def test_roofline_png(tmp_path):
    a = torch.randn(256, 256, device="tpu")
    with tp.profile() as prof:
        (a @ a).relu()
    p = tmp_path / "roof.png"
    prof.save_roofline_png(str(p))
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_off_records_nothing():
    x = torch.randn(100, device="tpu")
    with tp.profile() as prof:
        pass
    (x + 1).sum().item()  # after the profile: not traced
    events, _ = _C._trace_read()
    assert all(e[1] <= prof.t1 for e in events)
    assert not prof.kernels
    assert not _C._hostops_on()  # no RecordFunction callback left: the dispatch path pays nothing


def test_compiled_code_is_compiled_and_profiled():
    """Host ops come from a RecordFunction callback, not a dispatch mode:
    Dynamo compiles under the profiler (one graph, no eager fallback); no op
    of its fake-tensor tracing and no range that is not an operator is a host
    op; a replayed call is one host op, torch_tpu::compiled_graph, and each
    replay's fused kernel carries the full FLOPs of its ops."""
    torch._dynamo.reset()
    f = torch.compile(lambda a: (a * 2 + 1).relu().sum(), backend="tpu")
    x = torch.ones(32, device="tpu")
    before = torch.tpu.compile_stats()
    with tp.profile() as prof:
        for _ in range(6):
            assert f(x).item() == 96.0
    after = torch.tpu.compile_stats()
    assert after["dynamo_graphs"] == before["dynamo_graphs"] + 1
    assert after["replays"] > before["replays"]
    names = [o.name for o in prof.ops.values()]
    assert names.count("torch_tpu::compiled_graph") == after["replays"] - before["replays"]
    assert "PythonDispatchMode" not in names
    assert all(o.inputs or o.outputs for o in prof.ops.values() if o.name != "torch_tpu::compiled_graph")
    fused = [k for k in prof.kernels if k.base_name == "fused(mul,add,relu)"]
    assert len(fused) == 6 and all(k.flops == 3 * 32 for k in fused), [(k.name, k.flops) for k in fused]
    assert all(k.site and "test_profiler.py:" in k.site for k in fused)


def test_host_op_nesting_and_the_op_a_kernel_is_credited_to():
    """Every operator the dispatcher runs on device tensors is a host op with
    the op it ran inside (linear -> addmm); a kernel names the innermost op
    that launched it, or the op that one implements (tanh.out inside tanh ->
    tanh); FLOPs come from PyTorch's formulas on the recorded shapes."""
    m = torch.nn.Linear(64, 32).to("tpu")
    x = torch.randn(8, 64, device="tpu")
    with tp.profile() as prof:
        torch.tanh(m(x)).cpu()
    by_name = {o.name: o for o in prof.ops.values()}
    addmm, linear = by_name["addmm"], by_name["linear"]
    assert addmm.parent == linear.corr and linear.parent == 0
    assert addmm.flops == 2 * 8 * 64 * 32 and addmm.shapes == [[32], [8, 64], [64, 32]]
    assert addmm.site and "test_profiler.py:" in addmm.site
    gemm = [k for k in prof.kernels if k.base_name == "gemm"]
    assert len(gemm) == 1 and [prof.ops[c].name for c in gemm[0].ops] == ["addmm"]
    assert gemm[0].flops == 2 * 8 * 64 * 32
    tanh = [k for k in prof.kernels if k.base_name == "tanh"]
    assert len(tanh) == 1 and [prof.ops[c].name for c in tanh[0].ops] == ["tanh"]
    assert not _C._hostops_on()


def test_nested_profile_refused():
    with tp.profile():
        with pytest.raises(RuntimeError, match="already active"):
            with tp.profile():
                pass


def test_generated_kernel_compile_and_cache_hit(tmp_path):
    script = textwrap.dedent("""
        import torch, torch_tpu
        from torch_tpu import profiler as tp
        x = torch.randn(1 << 16, device="tpu")
        with torch_tpu.execution_mode("defer"):
            with tp.profile() as prof:
                for _ in range(3):
                    y = (((x * 1.5 + 0.5).sin() * x).relu() - 0.25).exp()
                    y.sum().item()
        print(sorted({c["name"] for c in prof.compiles}))
    """)
    env = dict(os.environ, TORCH_TPU_CODEGEN="sync", TORCH_TPU_CACHE_DIR=str(tmp_path / "kc"))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    ok, _info = _C._codegen_info()
    if not ok:
        pytest.skip("no C compiler: the interpreter runs every program")
    assert "kernel compile" in first.stdout
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "kernel cache hit" in second.stdout and "kernel compile" not in second.stdout


def test_cli_trace(tmp_path):
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent("""
        import torch
        m = torch.nn.Linear(64, 32).to("tpu")
        x = torch.randn(16, 64, device="tpu")
        for _ in range(2):
            m(x).sum().backward()
    """))
    out = tmp_path / "t.json"
    png = tmp_path / "r.png"
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "trace", "--out", str(out), "--png", str(png),
                        str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "device ms" in r.stdout and "Roofline ESTIMATE" in r.stdout
    ev = json.loads(out.read_text())["traceEvents"]
    ops = {e["name"] for e in ev if e.get("cat") == "op"}
    assert "addmm" in ops or "mm" in ops
    assert any(e.get("cat") == "kernel" for e in ev)
    assert png.stat().st_size > 0


def test_torch_profiler_merged():
    x = torch.randn(32, 32, device="tpu")
    with tp.profile(torch_profiler=True) as prof:
        (x @ x).relu().cpu()
    ev = prof.trace_events()
    torch_ev = [e for e in ev if e.get("pid") == 2_000_000 and e.get("ph") == "X"]
    assert any(e["name"].startswith("aten::mm") for e in torch_ev)
    assert any(e.get("cat") == "kernel" for e in ev)


def test_kernels_of_a_side_stream_get_their_own_track():
    x = torch.randn(256, 256, device="tpu")
    side = torch.tpu.Stream()
    with tp.profile() as prof:
        y = x @ x                      # default stream
        side.wait_stream(torch.tpu.current_stream())
        with torch.tpu.stream(side):
            z = torch.tanh(x)          # the side stream
        torch.tpu.current_stream().wait_stream(side)
        (y + z).cpu()
    ev = prof.trace_events()
    tracks = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"
              and e["pid"] == 1_000_000}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    tanh = [e for e in kernels if e["args"].get("ops") == ["tanh"]]
    mm = [e for e in kernels if e["args"].get("ops") == ["mm"]]
    assert len(tanh) == len(mm) == 1
    assert tanh[0]["tid"] != mm[0]["tid"] == 0
    assert tracks[0] == "stream 0 (default)" and tracks[tanh[0]["tid"]] == f"stream {tanh[0]['tid']}"


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_torch_profiler_privateuse1_activity_shows_device_work(tmp_path, mode):
    """torch.profiler with ProfilerActivity.PrivateUse1: the runtime's kernels
    reach Kineto through the PrivateUse1 profiler registry
    (torch_tpu/csrc/kineto_profiler.cpp) — in the exported trace, on a
    stream row of the chip, and as device time in key_averages()."""
    from torch.profiler import ProfilerActivity, profile

    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    with torch_tpu.execution_mode(mode):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            x, y = a.to("tpu"), b.to("tpu")
            out = (torch.relu(x @ y) * 2 + 1).cpu()
    torch.testing.assert_close(out, torch.relu(a @ b) * 2 + 1)
    assert not _C._trace_enabled()
    path = tmp_path / "torch_trace.json"
    prof.export_chrome_trace(str(path))
    ev = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert kernels and all(e["dur"] >= 0 for e in kernels)
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert all(rows[(e["pid"], e["tid"])] == "stream 0 (default)" for e in kernels)
    cpu_ops = [e for e in ev if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::mm" for e in cpu_ops)
    # device time on the host ops' clock: the kernels run inside the profile's window
    lo = min(e["ts"] for e in cpu_ops)
    hi = max(e["ts"] + e["dur"] for e in cpu_ops)
    assert all(lo - 1e3 <= e["ts"] <= hi + 1e3 for e in kernels), (lo, hi, [e["ts"] for e in kernels])
    copies = [e for e in ev if e.get("cat") == "gpu_memcpy"]
    assert {c["name"] for c in copies} >= {"Memcpy HtoD", "Memcpy DtoH"}
    assert sum(c["args"]["bytes"] for c in copies if c["name"] == "Memcpy HtoD") == (64 * 32 + 32 * 16) * 4
    if mode == "defer":
        fused = [e for e in kernels if e["name"].startswith("fused(")]
        assert fused and any("test_profiler.py:" in e["name"] for e in fused), [e["name"] for e in kernels]
        cuts = [e for e in ev if e["name"].startswith("DeferAndFuse cut: ")]
        assert cuts and all(rows[(e["pid"], e["tid"])].startswith("runtime (host)") for e in cuts)
        assert any(e["args"]["site"].rsplit("/", 1)[-1].startswith("test_profiler.py:") for e in cuts)
    assert sum(e.self_device_time_total for e in prof.key_averages()) > 0
    # CPU activity alone asks nothing of the device, and torch_tpu.profiler keeps its ring
    with profile(activities=[ProfilerActivity.CPU]) as cpu_only:
        (x + 1).cpu()
    cpu_only.export_chrome_trace(str(tmp_path / "cpu_only.json"))
    cpu_ev = json.loads((tmp_path / "cpu_only.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" for e in cpu_ev) and not any(e.get("cat") == "kernel" for e in cpu_ev)
    with tp.profile(torch_profiler=True) as mine:
        (x @ y).cpu()
    assert any(e.get("cat") == "kernel" for e in mine.trace_events())


def test_torch_profiler_sees_compiled_graphs_kernels():
    """torch.profiler is no dispatch mode, so Dynamo compiles under it: a
    compiled call's fused kernels show with device time."""
    from torch.profiler import ProfilerActivity, profile

    f = torch.compile(lambda a: (a * 2 + 1).relu().sum(), backend="tpu")
    x = torch.ones(64, device="tpu")
    f(x)
    calls = torch.tpu.compile_stats()["calls"]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        assert f(x).item() == 192.0
    assert torch.tpu.compile_stats()["calls"] == calls + 1
    timed = [e.key for e in prof.key_averages() if e.self_device_time_total > 0]
    assert any(k.startswith("fused(mul,add,relu)") and "test_profiler.py:" in k for k in timed), timed


def test_torch_profiler_after_an_asynchronous_error():
    """A kernel's asynchronous error inside a torch.profiler block is raised
    when the block ends (torch.profiler synchronizes the accelerator before
    it stops Kineto, as for CUDA; the PrivateUse1 session never takes the
    error). That session is never stopped: the next one takes the trace ring
    over, records the device, and leaves the ring off for torch_tpu.profiler."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.zeros(4, device="tpu")
    idx = torch.tensor([7], device="tpu")
    with pytest.raises(IndexError, match="out of bounds"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
            x[idx]  # fails on the device, after the op returned
    torch.tpu.synchronize()  # nothing pending: the error was raised once
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as again:
        (x + 1).cpu()
    assert any(e.self_device_time_total > 0 for e in again.key_averages())
    assert not _C._trace_enabled()
    with tp.profile() as prof:
        (x + 1).cpu()
    assert prof.kernels
