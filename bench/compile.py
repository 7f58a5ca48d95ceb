"""torch.compile(backend="tpu") figures: compile cost and decode speed.

cold     first training step of a fresh process with empty caches (Dynamo,
         AOTAutograd, lowering, plan building, kernel compiles), tpu compiled
         vs cpu Inductor, minGPT / Llama / ResNet; then a second process on
         the same (now warm) caches; each in its own subprocess
layers   the same cold first step for Llama with 1..32 layers (PNG plot)
decode   Llama decode tokens/s (one token a step with the KV cache, greedy,
         on the device): tpu strict eager vs tpu compiled (`model.decode`
         through torch.compile) vs CPU eager

Steady-state training steps (compiled vs strict vs cpu Inductor) are the
matrix's `tpu compiled` column: ``python -m bench matrix``.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import common

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("mingpt", "llama", "resnet")


def _first_step(workload: str, backend: str, layers: int | None) -> dict:
    """Runs in a worker process: builds the workload, compiles it, times the
    first optimizer step (compile included) and the second."""
    import importlib

    import torch_tpu  # noqa: F401
    from examples import common as ex

    device = "tpu" if backend == "tpu" else "cpu"
    if layers is not None:
        from examples.llama.model import Llama

        torch.manual_seed(0)
        model = Llama(vocab=96, d=64, layers=layers, heads=4, kv_heads=2, block=32)
        batches = ex.random_token_batches(96, 8, 32, torch.Generator().manual_seed(0), n=1)
        loss_fn = ex.lm_loss
    else:
        model, batches, loss_fn = importlib.import_module(f"examples.{workload}.model").bench_workload(preset="quick")
    model = model.to(device)
    fn = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batches[0]
    x = tuple(t.to(device) for t in (x if isinstance(x, (tuple, list)) else (x,)))
    y = y.to(device)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fn(*x), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    out = {"first_s": times[0], "second_s": times[1]}
    if device == "tpu":
        st = torch.tpu.compile_stats()
        ds = torch.tpu.defer_stats()
        cs = torch.tpu._get_cache_stats()
        out.update(graphs=st["forward_graphs"] + st["backward_graphs"], lowering_s=st["lowering_seconds"],
                   first_calls_s=st["first_calls_seconds"], backend_s=st["backend_seconds"],
                   kernels_compiled=ds["codegen_kernels"], codegen_s=ds["codegen_compile_seconds"],
                   cache_hits=cs.get("num_cache_hits", 0), cache_reqs=cs.get("num_cache_reqs", 0))
    return out


def _worker_run(workload: str, backend: str, caches: dict[str, str], layers: int | None = None) -> dict:
    """One fresh process's first steps, with generated kernels in their
    default mode (compiled in the background while the interpreter serves,
    as a user's first step runs: TORCH_TPU_CODEGEN is not passed on)."""
    env = {**os.environ, **caches}
    env.pop("TORCH_TPU_CODEGEN", None)
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from bench import compile as c; "
            f"print('RESULT ' + json.dumps(c._first_step({workload!r}, {backend!r}, {layers!r})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"{workload}/{backend} worker failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(line[0][7:])


def _fresh_caches(root: str) -> dict[str, str]:
    return {"TORCH_TPU_CACHE_DIR": os.path.join(root, "tpu"), "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(root, "triton")}


def cold(repeats: int = 1, workloads=WORKLOADS) -> tuple[dict, str]:
    res: dict = {}
    rows = []
    for w in workloads:
        cells = {}
        for backend in ("tpu", "inductor"):
            cold_s, warm_s, extra = [], [], {}
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as d:
                    caches = _fresh_caches(d)
                    a = _worker_run(w, backend, caches)
                    b = _worker_run(w, backend, caches)
                cold_s.append(a["first_s"])
                warm_s.append(b["first_s"])
                extra = {"cold": a, "warm": b}
            cells[backend] = {"cold_s": statistics.median(cold_s), "warm_s": statistics.median(warm_s), **extra}
        res[w] = cells
        t, i = cells["tpu"], cells["inductor"]
        rows.append([w, f"{t['cold_s']:.2f}", f"{i['cold_s']:.2f}", f"{t['cold_s'] / i['cold_s']:.2f}×",
                     f"{t['cold']['graphs']} graphs, {t['cold']['kernels_compiled']} kernels compiled in "
                     f"{t['cold']['codegen_s']:.2f} s (in the background)", f"{t['warm_s']:.2f}", f"{i['warm_s']:.2f}",
                     f"{t['warm']['kernels_compiled']} kernels loaded, {t['warm']['cache_hits']} of them cache hits; "
                     f"ours (lowering + first calls: plans, kernel loads) "
                     f"{(t['warm']['lowering_s'] + t['warm']['first_calls_s']) / t['warm']['graphs'] * 1e3:.0f} ms "
                     f"a graph (goal ≤ 100)"])
    table = common.markdown_table(
        ["workload", "tpu compiled cold first step s", "cpu Inductor cold first step s",
         "tpu / Inductor (goal ≤ 0.25×)", "tpu cold: graphs, kernels", "tpu warm first step s",
         "Inductor warm first step s", "tpu warm process"], rows)
    return res, table


def layers(counts=(1, 2, 4, 8, 16, 32)) -> tuple[dict, str, Path | None]:
    res: dict = {}
    rows = []
    for n in counts:
        cell = {}
        for backend in ("tpu", "inductor"):
            with tempfile.TemporaryDirectory() as d:
                cell[backend] = _worker_run("llama", backend, _fresh_caches(d), layers=n)["first_s"]
        res[n] = cell
        rows.append([str(n), f"{cell['tpu']:.2f}", f"{cell['inductor']:.2f}", f"{cell['tpu'] / cell['inductor']:.2f}×"])
    table = common.markdown_table(["Llama layers (width 64)", "tpu compiled cold first step s",
                                   "cpu Inductor cold first step s", "tpu / Inductor"], rows)
    png = None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        xs = list(res)
        ax.plot(xs, [res[n]["tpu"] for n in xs], "o-", label="tpu compiled")
        ax.plot(xs, [res[n]["inductor"] for n in xs], "s-", label="cpu Inductor")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("layers")
        ax.set_ylabel("cold first training step (s)")
        ax.set_title("Compile time vs depth (Llama, width 64)")
        ax.legend()
        png = ROOT / "bench" / "results" / "compile_layers.png"
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=100, bbox_inches="tight")
        plt.close(fig)
    except ImportError:
        pass
    return res, table, png


def decode(tokens: int = 64, repeats: int = 5) -> tuple[dict, str]:
    import torch_tpu  # noqa: F401
    from examples.llama.model import bench_workload

    base, _, _ = bench_workload(preset="quick")
    base.eval()
    runs = {}
    for config in ("cpu eager", "tpu strict", "tpu compiled"):
        device = "cpu" if config.startswith("cpu") else "tpu"
        import copy

        model = copy.deepcopy(base).to(device)
        step = torch.compile(model.decode, backend="tpu") if config == "tpu compiled" else model.decode

        def run(model=model, step=step, device=device) -> None:
            with torch.no_grad():
                cache = model.new_cache(1)
                tok = torch.zeros(1, 1, dtype=torch.long, device=device)
                pos = torch.zeros(1, dtype=torch.long, device=device)
                for _ in range(tokens):
                    tok = step(tok, pos, cache).argmax(-1, keepdim=True)
                    pos += 1
                tok.cpu()

        run()  # warm-up: compiles, builds plans
        runs[config] = run
    raw: dict[str, list[float]] = {}
    med = common.interleaved(runs, repeats, raw=raw)
    res = {c: {"tokens_per_s": tokens / m, "samples_s": raw[c]} for c, m in med.items()}
    strict = res["tpu strict"]["tokens_per_s"]
    rows = [[c, f"{v['tokens_per_s']:.0f}", f"{v['tokens_per_s'] / strict:.2f}×"] for c, v in res.items()]
    table = common.markdown_table(["config", "decode tokens/s (batch 1)", "vs tpu strict (goal compiled ≥ 3×)"], rows)
    return res, table
