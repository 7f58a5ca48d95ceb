import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Benchmarking and profiling")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Benchmarking and profiling

        `python -m bench` runs the benchmarks (`python -m bench --help` lists them: device, elementwise,
        gemm, bf16, attention, defer, fusion, fft, compile, matrix, sweep); each writes JSON to
        `bench/results/`, and `--record` appends its tables to `BENCHMARKS.md` with the machine and the
        command. This page shows the recorded figures (and plots of recorded runs where this checkout has
        them), then measures a few things live on the machine building the page with `bench/`'s own
        helpers, and shows the per-kernel time profile.
        """
    )
    return (mo,)


@app.cell
def _(mo):
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    repo = mo.notebook_dir().parent
    results_dir = repo / "bench" / "results"

    def load(name: str) -> dict | None:
        path = results_dir / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    matrix = load("matrix")
    defer = load("defer")
    return defer, json, load, matplotlib, matrix, plt, repo, results_dir


@app.cell
def _(defer, matrix, mo, repo):
    _text = (repo / "BENCHMARKS.md").read_text()
    _start = _text.index("## Current figures")
    _end = _text.find("\n## ", _start + 1)
    _section = _text[_start:_end if _end > 0 else len(_text)].replace("## Current figures", "### Current figures", 1)
    _missing = [n for n, d in (("matrix", matrix), ("defer", defer)) if d is None]
    _note = (f"This checkout has no recorded `bench/results/{{{', '.join(_missing)}}}.json` (they are written by "
             "`make bench` / `python -m bench defer matrix` and not kept in git), so the plots of recorded runs "
             "are left out below; the live measurements further down always run." if _missing else
             "The plots below are drawn from this checkout's `bench/results/*.json`.")
    mo.vstack([
        mo.md("## Recorded figures\n\n`BENCHMARKS.md` keeps the current figure of every goal with its host, "
              "date and command:"),
        mo.md(_section),
        mo.md(_note),
    ])
    return


@app.cell
def _(matrix, mo, plt):
    def _plot():
        _groups = []
        for _name, _w in matrix["workloads"].items():
            if _w.get("status") != "ok":
                continue
            for _kind in ("train", "infer"):
                if _kind in _w:
                    _groups.append((f"{_name}\n{_kind}", _w[_kind]["configs"]))
        _configs = [c for c in matrix["configs"] if c != "cpu eager"]
        _fig, _ax = plt.subplots(figsize=(10, 3.6))
        _wd = 0.8 / len(_configs)
        for _j, _c in enumerate(_configs):
            _xs, _ys = [], []
            for _i, (_, _cells) in enumerate(_groups):
                _cell = _cells.get(_c, {})
                if _cell.get("status") == "ok":
                    _xs.append(_i + (_j - (len(_configs) - 1) / 2) * _wd)
                    _ys.append(_cell["speed_vs_cpu_eager"])
            _ax.bar(_xs, _ys, _wd, label=_c)
        _ax.axhline(1.0, color="black", linewidth=0.8)
        _ax.set_xticks(range(len(_groups)))
        _ax.set_xticklabels([g[0] for g in _groups], fontsize=8)
        _ax.set_ylabel("speed vs CPU eager (x)")
        _ax.legend(fontsize=7, ncol=2)
        _fig.tight_layout()
        return _fig

    _out = None
    if matrix is not None:
        _m = matrix["machine"]
        _out = mo.vstack([
            mo.md(
                f"""
                ## The workload matrix (`python -m bench matrix`)

                Recorded {_m.get("date", "?")} at commit `{_m.get("commit", "?")}` on {_m.get("cpu", "?")}
                ({_m.get("cores", "?")} cores, bf16 products on {_m.get("bf16_matmul", "?")}), preset
                `{matrix.get("preset")}`, {matrix.get("repeats")} repeats: each example's training (and
                inference) step in every configuration, as speed relative to PyTorch's CPU backend (above 1:
                faster).
                """
            ),
            _plot(),
        ])
    _out
    return


@app.cell
def _(defer, mo, plt):
    def _plot():
        _names = list(defer["workloads"])
        _fig, (_a1, _a2) = plt.subplots(1, 2, figsize=(10, 3.2))
        _modes = ["cpu eager", "tpu strict", "tpu defer"]
        _wd = 0.8 / len(_modes)
        for _j, _mode in enumerate(_modes):
            _a1.bar([i + (_j - 1) * _wd for i in range(len(_names))],
                    [defer["workloads"][n]["step_s"][_mode] * 1e3 for n in _names], _wd, label=_mode)
        _a1.set_xticks(range(len(_names)))
        _a1.set_xticklabels(_names)
        _a1.set_ylabel("ms per training step")
        _a1.legend(fontsize=8)
        _a2.bar([i - 0.2 for i in range(len(_names))],
                [defer["workloads"][n]["peak_strict"] / 2**20 for n in _names], 0.4, label="strict")
        _a2.bar([i + 0.2 for i in range(len(_names))],
                [defer["workloads"][n]["peak_defer"] / 2**20 for n in _names], 0.4, label="defer")
        _a2.set_xticks(range(len(_names)))
        _a2.set_xticklabels(_names)
        _a2.set_ylabel("peak device memory (MiB)")
        _a2.legend(fontsize=8)
        _fig.tight_layout()
        return _fig

    _out = None
    if defer is not None:
        _out = mo.vstack([
            mo.md(
                f"""
                ## DeferAndFuse vs strict (`python -m bench defer`)

                Recorded {defer["machine"].get("date", "?")}: training step time (median) and peak device
                memory of the examples' models in each mode.
                """
            ),
            _plot(),
        ])
    _out
    return


@app.cell
def _(repo):
    import sys

    import torch
    import torch_tpu  # noqa: F401

    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from bench import common as bench_common
    from bench import device as bench_device

    # host <-> device copies vs memcpy: bench/device.py's own measurement, 8 MiB, 3 interleaved repeats
    copies = bench_device.copy_bandwidth([8], repeats=3)[0][0]

    def matmul_gflops(n: int, dtype: torch.dtype) -> dict[str, float]:
        """n x n x n products, tpu vs PyTorch's CPU backend, samples interleaved (bench.common.interleaved):
        back-to-back products, one synchronize per tpu sample."""
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        da, db = a.to("tpu"), b.to("tpu")
        t = bench_common.interleaved({"cpu": lambda: a @ b, "tpu": lambda: da @ db}, repeats=3, inner=4,
                                     finish={"tpu": torch.tpu.synchronize}, prime=True)
        return {k: 2 * n**3 / v / 1e9 for k, v in t.items()}

    sizes = [128, 256, 512]
    live = {dt: [matmul_gflops(n, dt) for n in sizes] for dt in (torch.float32, torch.bfloat16)}
    return bench_common, bench_device, copies, live, matmul_gflops, sizes, sys, torch, torch_tpu


@app.cell
def _(copies, live, mo, plt, sizes, torch):
    _fig, (_a1, _a2) = plt.subplots(1, 2, figsize=(10, 3.2))
    for _dt, _rows in live.items():
        _name = str(_dt).replace("torch.", "")
        _a1.plot(sizes, [r["tpu"] for r in _rows], "o-", label=f"tpu {_name}")
        _a1.plot(sizes, [r["cpu"] for r in _rows], "s--", label=f"CPU {_name}")
    _a1.set_xlabel("n (n x n x n product)")
    _a1.set_ylabel("GFLOP/s")
    _a1.set_title("matmul")
    _a1.legend(fontsize=7)
    _kinds = ["memcpy", "h2d", "h2d_pinned", "d2h", "d2h_pinned", "d2d"]
    _bars = _a2.bar(_kinds, [copies["GBps"][k] for k in _kinds], color=["gray"] + ["C0"] * 5)
    _a2.bar_label(_bars, fmt="%.1f", fontsize=7)
    _a2.set_ylabel("GB/s")
    _a2.set_title(f"copies of {copies['size_mib']} MiB")
    _a2.tick_params(axis="x", labelsize=7)
    _fig.tight_layout()
    mo.vstack([
        mo.md(
            f"""
            ## Live measurements

            Measured while this page was built, with `bench/`'s own helpers: matmuls through
            `bench.common.interleaved` (configs alternate within every repeat, so machine noise hits
            them alike; median of repeats; {torch.get_num_threads()} CPU threads), and
            `bench.device.copy_bandwidth` (host to device, device to host, device to device, against a
            plain `memcpy`). A shared, busy machine makes single figures noisy: `python -m bench` repeats
            more.
            """
        ),
        _fig,
        mo.md(
            """
            In your own code, time device work with events, as with CUDA:
            `start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)`,
            `start.record()`, the work, `end.record()`, `end.synchronize()`, then `start.elapsed_time(end)`
            (milliseconds).
            """
        ),
    ])
    return


@app.cell
def _(mo):
    import os
    import subprocess
    import sys as _sys

    _script = (
        "import torch, torch_tpu\n"
        "m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to('tpu')\n"
        "x = torch.randn(64, 256, device='tpu')\n"
        "for _ in range(5):\n"
        "    m(x).square().mean().backward()\n"
        "torch.tpu.synchronize()\n"
    )
    _proc = subprocess.run([_sys.executable, "-c", _script], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TORCH_TPU_KERNEL_TIMES": "1"})
    if _proc.returncode != 0:
        raise RuntimeError(f"profiled script failed:\n{_proc.stderr}")
    kernel_times = "\n".join(_proc.stderr.strip().splitlines()[:14])
    _text = mo.md(
        f"""
        ## Where the time goes: `TORCH_TPU_KERNEL_TIMES=1`

        With this variable set, a process prints at exit the device's wall time per kernel (calls, total,
        µs per call, share), largest first — in strict and deferred runs alike (`=sites` gives one row per
        recording site of deferred work). An MLP's forward and backward, five times:
        """
    )
    mo.vstack([_text, mo.plain_text(kernel_times)])
    return (kernel_times,)


if __name__ == "__main__":
    app.run()
