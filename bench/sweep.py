"""Llama size sweep: train-step time and peak memory vs parameter count
(~1M, 3M, 10M; full adds 30M, 100M) for tpu strict, tpu defer and cpu eager.

Shapes come from examples/llama/model.py::llama_config_for_params(target)
(param_count(cfg, vocab) gives the exact count). Step FLOPs = 6 · params ·
tokens + attention (12 · layers · width · seq per token: QKᵀ and AV, forward
and backward, not halved for the causal mask), so the table shows time per
FLOP. Whether cost grows no faster than FLOPs is judged from the log-log slope
of step time against step FLOPs (least squares over the points). Timing,
interleaving and peak memory are those of bench/matrix.py.
"""
from __future__ import annotations

import math
import os
import statistics
import time

import torch

from bench import common
from bench.matrix import Missing, Runner, _short, load_text, peak_bytes
from examples.common import lm_loss, random_token_batches

CONFIGS = ("cpu eager", "tpu strict", "tpu defer")
QUICK = (1e6, 3e6, 1e7)
FULL = (1e6, 3e6, 1e7, 3e7, 1e8)
VOCAB = 96


def _llama():
    try:
        from examples.llama import model as lm
    except ModuleNotFoundError as e:
        raise Missing(f"examples/llama/model.py not found ({e})") from None
    for fn in ("Llama", "llama_config_for_params", "param_count"):
        if not hasattr(lm, fn):
            raise Missing(f"examples/llama/model.py has no {fn}")
    return lm


def step_flops(params: int, cfg: dict, batch: int, seq: int) -> float:
    tokens = batch * seq
    return 6.0 * params * tokens + 12.0 * cfg["layers"] * cfg["width"] * seq * tokens


def _slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else None


def run(preset: str = "quick", repeats: int = 3, targets=None, configs=CONFIGS, batch: int | None = None,
        seq: int | None = None, warmup: int = 2, log=print) -> dict:
    lm = _llama()
    targets = targets or (QUICK if preset == "quick" else FULL)
    batch = batch or 4
    seq = seq or (64 if preset == "quick" else 128)
    t_start = time.perf_counter()
    out: dict = {"machine": common.machine(), "preset": preset, "repeats": repeats, "warmup": warmup,
                 "configs": list(configs),
                 "batch": batch, "seq": seq, "tokens": batch * seq, "points": [],
                 "load_avg": [os.getloadavg()[0]]}
    g = torch.Generator().manual_seed(0)
    batches = random_token_batches(VOCAB, batch, seq, g)
    loss_fn = lm_loss

    for target in targets:
        cfg = lm.llama_config_for_params(int(target), VOCAB)
        torch.manual_seed(0)
        base = lm.Llama(vocab=VOCAB, d=cfg["width"], layers=cfg["layers"], heads=cfg["heads"],
                        kv_heads=cfg["kv_heads"], hidden=cfg["hidden"], block=seq)
        params = sum(p.numel() for p in base.parameters())
        expected = lm.param_count(cfg, VOCAB)
        flops = step_flops(params, cfg, batch, seq)
        pt: dict = {"target": target, "cfg": cfg, "params": params, "param_count": expected, "flops": flops,
                    "configs": {}}
        out["points"].append(pt)
        runners: dict[str, Runner] = {}
        torch.tpu.reset_defer_stats()
        for c in configs:
            cell: dict = {"status": "ok"}
            pt["configs"][c] = cell
            try:
                r = Runner(c, base, batches, loss_fn)
                t0 = time.perf_counter()
                r.step()
                cell["first_step_s"] = time.perf_counter() - t0
                for _ in range(warmup - 1):
                    r.step()
                runners[c] = r
            except Exception as e:  # noqa: BLE001 - reported in the cell
                cell.update(status="error", error=_short(e))
                log(f"  {params / 1e6:.1f}M [{c}]: ERROR {_short(e, 400)}")
        samples: dict[str, list[float]] = {c: [] for c in runners}
        for _ in range(repeats):
            for c, r in runners.items():
                common.settle()
                samples[c].append(common.time_steps(r.step, r.device))
        if "tpu defer" in runners:
            st = torch.tpu.defer_stats()
            pt["configs"]["tpu defer"]["defer_stats"] = {k: v for k, v in st.items() if k != "recent_flushes"}
        for c, r in runners.items():
            cell = pt["configs"][c]
            cell["step_s"] = statistics.median(samples[c])
            cell["samples_s"] = samples[c]
            cell["s_per_gflop"] = cell["step_s"] / (flops / 1e9)
            cell["gflops_per_s"] = flops / 1e9 / cell["step_s"]
            try:
                cell["peak_bytes"] = peak_bytes(r, steps=1)
            except Exception as e:  # noqa: BLE001
                cell["peak_bytes"] = None
                cell["peak_error"] = _short(e)
        del runners
        log(f"  {params / 1e6:.2f}M params ({cfg['layers']}x{cfg['width']}): " + ", ".join(
            f"{c} {v['step_s'] * 1e3:.0f} ms" if v["status"] == "ok" else f"{c} ERROR"
            for c, v in pt["configs"].items()))
    out["scaling"] = {}
    for c in configs:
        pts = [(p["flops"], p["params"], p["configs"][c]) for p in out["points"] if p["configs"][c]["status"] == "ok"]
        time_slope = _slope([f for f, _, _ in pts], [v["step_s"] for _, _, v in pts])
        mem = [(n, v["peak_bytes"]) for _, n, v in pts if v.get("peak_bytes")]
        mem_slope = _slope([n for n, _ in mem], [b for _, b in mem])
        out["scaling"][c] = {"time_vs_flops_slope": time_slope, "peak_vs_params_slope": mem_slope,
                             "no_faster_than_flops": None if time_slope is None else time_slope <= 1.05}
    out["elapsed_s"] = time.perf_counter() - t_start
    out["load_avg"].append(os.getloadavg()[0])
    return out


def table(out: dict) -> str:
    rows = []
    for p in out["points"]:
        cfg = p["cfg"]
        label = (f"{p['params'] / 1e6:.2f}M ({cfg['layers']} × {cfg['width']}, {cfg['heads']}/{cfg['kv_heads']} "
                 f"heads)")
        for c, v in p["configs"].items():
            if v["status"] != "ok":
                rows.append([label, f"{p['flops'] / 1e9:.2f}", c, f"error: {v['error']}", "–", "–", "–"])
                continue
            peak = "n/a" if v.get("peak_bytes") is None else f"{v['peak_bytes'] / 2**20:.1f}"
            rows.append([label, f"{p['flops'] / 1e9:.2f}", c, f"{v['step_s'] * 1e3:.0f}",
                         f"{v['s_per_gflop'] * 1e3:.1f}", f"{v['gflops_per_s']:.2f}", peak])
    return common.markdown_table(["params (layers × width, heads/kv)", "step GFLOP", "config", "median step ms",
                                  "ms per GFLOP", "GFLOP/s", "peak MiB"], rows)


def verdict(out: dict) -> str:
    lines = []
    for c, s in out["scaling"].items():
        ts, ms = s["time_vs_flops_slope"], s["peak_vs_params_slope"]
        if ts is None:
            lines.append(f"- {c}: not enough points")
            continue
        word = "grows no faster than FLOPs" if s["no_faster_than_flops"] else "grows FASTER than FLOPs"
        lines.append(f"- {c}: step time ∝ FLOPs^{ts:.2f} → cost {word} (slope ≤ 1.05 counts as no faster)"
                     + ("" if ms is None else f"; peak memory ∝ params^{ms:.2f}"))
    return "\n".join(lines)


def describe(out: dict) -> str:
    return (f"Preset `{out['preset']}`: batch {out['batch']} × {out['seq']} tokens per step, "
            f"{out['repeats']} interleaved repeats after {out['warmup']} warm-up steps, whole run "
            f"{out['elapsed_s'] / 60:.1f} min, {load_text(out)}. Step FLOPs = 6·params·tokens + 12·layers·width·seq·tokens "
            "(attention). Peak MiB as in the matrix (own tensors + growth within a step).\n\n"
            + table(out) + "\n\n" + verdict(out))
