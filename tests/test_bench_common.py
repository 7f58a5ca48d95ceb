"""The sampling helpers of bench/: `interleaved` (per-config call counts,
finish hooks, raw samples in repeat order, the idle gap, priming) and the FMA peak
loop that bench/gemm.py samples between GEMM samples."""
from __future__ import annotations

import os
import time

from bench import common, gemm


def test_interleaved_counts_calls_per_config_and_keeps_raw_samples():
    calls = {"a": 0, "b": 0, "fin": 0}
    order: list[str] = []

    def a():
        calls["a"] += 1
        order.append("a")

    def b():
        calls["b"] += 1
        order.append("b")

    def fin():
        calls["fin"] += 1

    raw: dict[str, list[float]] = {}
    t = common.interleaved({"a": a, "b": b}, repeats=3, inner={"a": 4}, warmup=1, finish={"a": fin}, raw=raw,
                           gap_s=0)
    # warmup: 1 call each (+ a's finish); then 3 repeats of 4 calls of a (+ finish) and 1 call of b
    assert calls == {"a": 1 + 3 * 4, "b": 1 + 3, "fin": 1 + 3}
    assert order[2:] == (["a"] * 4 + ["b"]) * 3  # configs alternate inside every repeat
    assert set(raw) == {"a", "b"} and len(raw["a"]) == len(raw["b"]) == 3
    assert t["a"] == sorted(raw["a"])[1] and t["b"] == sorted(raw["b"])[1]  # medians of the raw samples


def test_interleaved_gap_idles_before_every_sample_outside_the_timing():
    raw: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    common.interleaved({"x": lambda: None, "y": lambda: None}, repeats=2, warmup=0, gap_s=0.05, raw=raw)
    elapsed = time.perf_counter() - t0
    assert elapsed >= 4 * 0.05  # one gap before each of the 4 samples
    assert max(raw["x"] + raw["y"]) < 0.05  # but the gap is not part of any sample


def test_interleaved_prime_runs_one_untimed_call_before_every_sample():
    calls = {"a": 0, "fin": 0}

    def a():  # every other call is slow, starting with the first
        calls["a"] += 1
        if calls["a"] % 2:
            time.sleep(0.05)

    def fin():
        calls["fin"] += 1

    for prime in (False, True):
        calls.update(a=0, fin=0)
        raw: dict[str, list[float]] = {}
        common.interleaved({"a": a}, repeats=3, warmup=0, finish={"a": fin}, raw=raw, gap_s=0, prime=prime)
        if prime:  # per repeat: the primed (slow) call and its finish, then the timed (fast) call and its finish
            assert calls == {"a": 6, "fin": 1 + 6}  # (+ the warm-up finish)
            assert max(raw["a"]) < 0.04
        else:  # the timed calls alternate slow, fast, slow
            assert calls == {"a": 3, "fin": 1 + 3}
            assert max(raw["a"]) >= 0.05


def test_fma_loop_reports_the_flops_it_ran():
    lib = gemm._fma_lib()
    threads = len(os.sched_getaffinity(0))
    fn, flops = gemm.fma_sampler(threads, 2e8)
    per = 12 * (16 if gemm.fma_isa() == "AVX-512" else 8) * 2  # 12 accumulators of that many lanes, 2 flops each
    assert flops == threads * max(100_000, int(2e8 / (threads * per))) * per
    t0 = time.perf_counter()
    gflops = fn()
    wall = time.perf_counter() - t0
    assert gflops > 0
    # the loop's own figure is flops over its own timing, which lies inside the call
    assert flops / gflops / 1e9 <= wall * 1.01
    assert lib.tpurt_bench_fma_gflops(1, 0) >= 0.0


def test_ab_env_pairs_two_settings_and_restores_the_environment(monkeypatch):
    from bench import ab_env
    monkeypatch.setenv("TORCH_TPU_DEFER_EPILOGUE", "keep")
    seen = []
    real = ab_env.time_steps

    def spy(step, device):
        seen.append(__import__("os").environ["TORCH_TPU_DEFER_EPILOGUE"])
        return real(step, device)

    monkeypatch.setattr(ab_env, "time_steps", spy)
    r = ab_env.ab("TORCH_TPU_DEFER_EPILOGUE", ("0", "1"), "mingpt", repeats=2, batch=2, warmup=1)
    assert seen == ["0", "1", "1", "0"]  # each sample under its runner's value, the order alternating
    assert __import__("os").environ["TORCH_TPU_DEFER_EPILOGUE"] == "keep"
    assert all(ms > 0 for ms in r["ms"]) and r["ratio"][0] <= r["ratio"][1] <= r["ratio"][2]


def test_ab_env_untimed_steps_run_under_the_sample_setting(monkeypatch):
    # --untimed N: N steps of the sample's runner under its value before each timed sample (a setting
    # that acts from the graphs before: early execution predicts after two graphs ran the same plan)
    from bench import ab_env
    seen = []
    real = ab_env.Runner.step

    def spy(self):
        seen.append(__import__("os").environ["TORCH_TPU_DEFER_EARLY"])
        return real(self)

    monkeypatch.setattr(ab_env.Runner, "step", spy)
    monkeypatch.setattr(ab_env, "time_steps", lambda step, device: (step(), 1.0)[1])
    ab_env.ab("TORCH_TPU_DEFER_EARLY", ("1", "0"), "mingpt", repeats=2, batch=2, warmup=1, untimed=2)
    # warm-up (one step each), then per sample 2 untimed steps and the timed one, order alternating
    assert seen == ["1", "0"] + ["1"] * 3 + ["0"] * 3 + ["0"] * 3 + ["1"] * 3


def test_fusion_bench_measures_each_pattern_with_its_fusion_off_and_on(monkeypatch):
    # every pattern launches fewer kernels with its fusion on, keeps at least
    # as many bytes out of memory, and the settings come back as they were
    from bench import fusion
    import torch_tpu
    monkeypatch.setenv("TORCH_TPU_DEFER_PROLOGUE", "keep")
    monkeypatch.delenv("TORCH_TPU_DEFER_COPIES", raising=False)
    mode = torch_tpu.get_execution_mode()
    res, table = fusion.run(repeats=2, calls=1)
    assert set(res) == {"rmsnorm fwd+bwd", "row sums", "logsumexp", "norm scale", "softmax sum", "autocast casts",
                        "linear epilogue"}
    for name, r in res.items():
        assert r["kernels"]["1"] < r["kernels"]["0"], (name, r)
        assert r["bytes_never_materialized"]["1"] >= r["bytes_never_materialized"]["0"], (name, r)
        assert all(ms > 0 for ms in r["ms"].values()) and r["ratio"]["q1"] <= r["ratio"]["median"] <= r["ratio"]["q3"]
        assert name in table
    assert os.environ["TORCH_TPU_DEFER_PROLOGUE"] == "keep" and "TORCH_TPU_DEFER_COPIES" not in os.environ
    assert torch_tpu.get_execution_mode() == mode


def test_ceiling_reads_the_kernel_times_of_both_modes():
    # the child processes' kernel tables are parsed: products take part of
    # the kernel time, and strict's step over them is the ceiling. The test
    # checks the computation, not its value: on a loaded host the products'
    # summed wall times can exceed one measured step, so ceiling > 1 is a
    # figure the benchmark reports, not a behaviour
    # figures are medians over alternating children of each mode
    from bench import ceiling
    calls = []
    measure = ceiling.measure

    def counted(name, mode, steps):
        calls.append(mode)
        return measure(name, mode, steps)

    ceiling.measure = counted
    try:
        res, table = ceiling.run(("mingpt",), steps=1, repeats=2)
    finally:
        ceiling.measure = measure
    assert calls == ["strict", "defer", "defer", "strict"]
    r = res["mingpt"]
    for mode in ("strict", "defer"):
        assert 0 < r[mode]["fixed_ms"] < r[mode]["kernel_ms"], r
        lo, hi = r[mode]["step_ms_range"]
        assert 0 < lo <= r[mode]["step_ms"] <= hi
    assert r["ceiling"] == r["strict"]["step_ms"] / r["strict"]["fixed_ms"] > 0
    assert "mingpt" in table


def test_kernel_ab_puts_kernels_in_families_and_pairs_the_modes():
    # names as the runtime gives them; every family of a real step is paired,
    # recomputations exist only in DeferAndFuse, and "all" is the sum
    from bench import kernel_ab
    assert kernel_ab.family("recompute(fused(add,gelu))") == "recompute"
    assert kernel_ab.family("gemm") == "gemm"
    assert kernel_ab.family("fused(add,native_dropout,add)") == "dropout"
    assert kernel_ab.family("layer_norm_backward") == "norm"
    assert kernel_ab.family("fused(copy,copy)") == "copy"
    assert kernel_ab.family("fused(mul,where)") == "other fused"
    assert kernel_ab.family("index_select") == "other"
    res = kernel_ab.compare("mingpt", repeats=2, steps=1, warmup=1)
    assert res["gemm"]["strict_ms"] > 0 and res["gemm"]["defer_ms"] > 0
    assert res["recompute"]["strict_ms"] == 0 < res["recompute"]["defer_ms"]
    for mode in ("strict_ms", "defer_ms"):
        parts = sum(v[mode] for f, v in res.items() if f != "all")
        assert abs(parts - res["all"][mode]) <= 1e-6 * res["all"][mode]
    assert "gemm" in kernel_ab.table("mingpt", res)


def test_convs_lists_a_workloads_convolutions_and_times_each_pass_on_both_devices():
    from bench import convs

    found = convs.shapes("resnet", "quick")
    assert found and all(count >= 1 for _, count in found)
    assert sum(count for _, count in found) == 20  # ResNet-18: stem, 16 block convolutions, 3 shortcuts
    res, table = convs.run("quick", ("resnet",), repeats=1, calls=1)
    rows = res["workloads"]["resnet"]["shapes"]
    assert len(rows) == len(found)
    assert all(len(r["cpu_us"]) == len(r["tpu_us"]) == 3 and min(r["cpu_us"] + r["tpu_us"]) > 0 for r in rows)
    step = res["workloads"]["resnet"]["step_ms"]
    for d in ("cpu", "tpu"):  # the weighted sum of the rows
        want = sum(r[f"{d}_us"][0] * r["count"] for r in rows) / 1e3
        assert abs(step[d][0] - want) <= 1e-9 * max(1.0, want)
    assert table.count("\n| [") == len(rows) and "**a step**" in table


def test_core_kind_tells_the_hosts_apart():
    # the sessions' hosts all call themselves "AMD EPYC" or "Intel(R) Xeon(R) Processor"
    assert common.core_kind("AuthenticAMD", 25, 17) == "Zen 4"
    assert common.core_kind("AuthenticAMD", 25, 1) == "Zen 3"
    assert common.core_kind("AuthenticAMD", 26, 2) == "Zen 5"
    assert common.core_kind("GenuineIntel", 6, 143) == "Sapphire Rapids"
    assert common.core_kind("GenuineIntel", 6, 1) == ""
    assert "cores" in common.host_line()
