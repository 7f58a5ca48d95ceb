"""PNG charts of the matrix and the sweep (matplotlib, Agg backend)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench import common  # noqa: E402


def _groups(out: dict):
    """[(label, {config: cell})] of the matrix, ok workloads only."""
    groups = []
    for name, w in out["workloads"].items():
        if w["status"] != "ok":
            continue
        for kind in ("train", "infer"):
            if kind in w:
                groups.append((f"{name}\n{kind}", w[kind]["configs"]))
    return groups


def _bars(ax, groups, configs, value, fmt, base: float = 0.0) -> None:
    n = max(1, len(configs))
    width = 0.8 / n
    for j, c in enumerate(configs):
        xs, ys = [], []
        for i, (_, cells) in enumerate(groups):
            v = cells.get(c, {})
            y = value(v) if v.get("status") == "ok" else None
            x = i + (j - (n - 1) / 2) * width
            if y is None:
                ax.text(x, 0, "n/a" if v.get("status") != "error" else "err", ha="center", va="bottom",
                        fontsize=6, rotation=90)
                continue
            xs.append(x)
            ys.append(y)
        bars = ax.bar(xs, [y - base for y in ys], width, bottom=base, label=c)
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y, fmt(y), ha="center", va="bottom" if y >= base else "top",
                    fontsize=6, rotation=90)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g[0] for g in groups], fontsize=8)
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def matrix(out: dict, out_dir: Path | None = None) -> list[Path]:
    out_dir = Path(out_dir or common.RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = _groups(out)
    configs = out["configs"]
    paths = []
    missing = f" — MISSING: {', '.join(out['missing'])}" if out.get("missing") else ""

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4.5))
    _bars(ax, groups, configs, lambda v: v.get("speed_vs_cpu_eager"), lambda y: f"{y:.2f}×",
          base=1.0)  # bars grow up (faster) or down (slower) from 1×
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_ylabel("speed vs cpu eager (×, higher is faster)")
    ax.set_title(f"Step speed relative to CPU eager ({out['preset']} preset){missing}", fontsize=10)
    paths.append(_save(fig, out_dir / "matrix_speed.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4.5))
    _bars(ax, groups, configs,
          lambda v: None if v.get("peak_bytes") is None else v["peak_bytes"] / 2**20, lambda y: f"{y:.0f}")
    ax.set_ylabel("peak MiB (own tensors + step growth)")
    ax.set_title(f"Peak memory per step ({out['preset']} preset){missing}", fontsize=10)
    paths.append(_save(fig, out_dir / "matrix_memory.png"))
    return paths


def sweep(out: dict, out_dir: Path | None = None) -> list[Path]:
    out_dir = Path(out_dir or common.RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for c in out["configs"]:
        pts = [(p["params"], p["configs"][c]) for p in out["points"] if p["configs"].get(c, {}).get("status") == "ok"]
        if not pts:
            continue
        xs = [x for x, _ in pts]
        axes[0].plot(xs, [v["step_s"] for _, v in pts], "o-", label=c)
        mem = [(x, v["peak_bytes"] / 2**20) for x, v in pts if v.get("peak_bytes")]
        if mem:
            axes[1].plot([x for x, _ in mem], [y for _, y in mem], "o-", label=c)
    pts = [p for p in out["points"]]
    if pts:
        # FLOPs scaled to the first point of the fastest config: a slope-1 reference line
        ref = min((p["configs"][c]["step_s"] for c in out["configs"] for p in pts[:1]
                   if p["configs"].get(c, {}).get("status") == "ok"), default=None)
        if ref:
            axes[0].plot([p["params"] for p in pts], [ref * p["flops"] / pts[0]["flops"] for p in pts], "k:",
                         label="∝ step FLOPs")
    for ax, yl in zip(axes, ("train step time (s)", "peak MiB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Llama size sweep ({out['preset']}): {out['tokens']} tokens per step", fontsize=10)
    return [_save(fig, out_dir / "sweep.png")]
