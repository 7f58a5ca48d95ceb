import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Execution modes")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Execution modes: strict, debug, DeferAndFuse

        The same program runs under three policies, chosen with `torch_tpu.set_execution_mode(name)` or
        scoped with `with torch_tpu.execution_mode(name):` (TorchTPU's names work too:
        `EagerMode.DEFER_NEVER`, `DEFER_NEVER_AND_LAUNCH_BLOCKING`, `DEFER_AND_FUSE`):

        | mode | what an operator call does | environment |
        |---|---|---|
        | `"strict"` (default) | launches its kernel asynchronously and returns | |
        | `"debug"` | launches and waits, so an error is raised by the op that caused it | `TPU_LAUNCH_BLOCKING=1` |
        | `"defer"` | is *recorded*; the recorded graph runs at the next cut, fused, with a memory plan | `TORCH_TPU_DEFER_AND_FUSE=1` |

        A cut is anything that needs a value: `.item()`, `.cpu()`, `print`, `synchronize()`, events, leaving
        the mode, `torch_tpu.flush()`, or the size cap. Plans are cached by the graph's structure, so a
        training loop builds its graphs once and then reuses them.

        Below, a small minGPT (from `examples/mingpt`) trains a few steps in each mode on this machine.
        """
    )
    return (mo,)


@app.cell
def _(mo):
    import sys
    import time

    import torch
    import torch_tpu

    _root = str(mo.notebook_dir().parent)
    if _root not in sys.path:
        sys.path.insert(0, _root)
    from examples import common
    from examples.mingpt.model import MinGPT

    data = common.CharData(common.pydoc_text(), block=32)

    def train_steps(mode: str, steps: int = 8, warmup: int = 3) -> dict:
        """Trains a fresh model (same seed every mode) and returns losses, the median step time after
        the warm-up steps, the peak device memory and the DeferAndFuse counters."""
        torch.manual_seed(0)
        model = MinGPT(vocab=data.vocab, d=64, layers=2, heads=4, block=32, dropout=0.1).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(0)
        batches = [data.batch("train", 16, g) for _ in range(warmup + steps)]
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        torch.tpu.reset_defer_stats()
        losses, times = [], []
        with torch_tpu.execution_mode(mode):
            for x, y in batches:
                t0 = time.perf_counter()
                loss = common.lm_loss(model(x.to("tpu")), y.to("tpu"))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())  # a cut: the step's graph runs here in defer mode
                times.append(time.perf_counter() - t0)
        torch.tpu.synchronize()
        timed = sorted(times[warmup:])
        return {"mode": mode, "losses": losses, "step_ms": 1e3 * timed[len(timed) // 2],
                "peak_mib": torch.tpu.max_memory_allocated() / 2**20, "stats": torch.tpu.defer_stats()}

    return common, data, sys, time, torch, torch_tpu, train_steps


@app.cell
def _(train_steps):
    runs = {m: train_steps(m) for m in ("strict", "debug", "defer")}
    return (runs,)


@app.cell
def _(mo, runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _modes = list(runs)
    _fig, (_a1, _a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    _b1 = _a1.bar(_modes, [runs[m]["step_ms"] for m in _modes], color=["C0", "C1", "C2"])
    _a1.bar_label(_b1, fmt="%.1f")
    _a1.set_ylabel("ms per training step (median)")
    _a1.set_title("Step time")
    _b2 = _a2.bar(_modes, [runs[m]["peak_mib"] for m in _modes], color=["C0", "C1", "C2"])
    _a2.bar_label(_b2, fmt="%.1f")
    _a2.set_ylabel("MiB")
    _a2.set_title("Peak device memory")
    _fig.suptitle("minGPT (2 layers, width 64, batch 16 x 32 characters) on this machine")
    _fig.tight_layout()
    mo.vstack([mo.md("## Step time and peak memory per mode"), _fig])
    return matplotlib, plt


@app.cell
def _(mo, runs):
    _s, _d = runs["strict"], runs["defer"]
    _diff = max(abs(a - b) for a, b in zip(_s["losses"], _d["losses"]))
    _dbg = max(abs(a - b) for a, b in zip(_s["losses"], runs["debug"]["losses"]))
    mo.md(
        f"""
        The three runs compute the same thing: the largest difference between strict's and defer's
        losses over the {len(_s["losses"])} steps is `{_diff:.3g}`, between strict's and debug's `{_dbg:.3g}`
        (dropout included: the device's random numbers are counter-based, the same in every mode).
        Peak memory in defer mode is {_d["peak_mib"] / _s["peak_mib"]:.2f}× strict's: tensors that only
        live inside a recorded graph need no memory when their producer and consumer are fused, and
        activations may be recomputed instead of kept.
        """
    )
    return


@app.cell
def _(mo, runs):
    _st = runs["defer"]["stats"]
    _keys = ["ops_recorded", "kernels_launched", "fused_kernels", "ops_fused", "graphs_built", "cache_hits",
             "bytes_never_materialized", "values_recomputed"]
    _rows = "\n".join(f"| `{k}` | {_st[k]:,} |" for k in _keys if k in _st)
    _flush = _st["recent_flushes"][0] if _st.get("recent_flushes") else {}
    mo.vstack([
        mo.md("## What DeferAndFuse did: `torch.tpu.defer_stats()`"),
        mo.md("| counter | value |\n|---|---|\n" + _rows),
        mo.md(
            f"""
        Cuts by reason: `{dict(_st["flushes"])}`. The latest cut (`recent_flushes[0]`):
        `{_flush}` — every step ended with `loss.item()`, so each step was one graph; after the first
        steps the plan came from the cache (`cache_hits`).
        """
        ),
    ])
    return


@app.cell
def _(mo, torch, torch_tpu):
    _x = torch.randn(1000, device="tpu")
    torch.tpu.reset_defer_stats()
    torch_tpu.set_execution_mode("defer")
    _y = (torch.sin(_x) * 2 + 1).relu()  # recorded, not run
    _recorded = torch.tpu.defer_stats()["ops_recorded"]
    torch_tpu.flush()  # run what was recorded without reading it
    _mode_inside = torch_tpu.get_execution_mode()
    torch_tpu.set_execution_mode("strict")
    mo.md(
        f"""
        ## Using the mode directly

        ```python
        torch_tpu.set_execution_mode("defer")     # process-wide; execution_mode("defer") scopes it
        y = (torch.sin(x) * 2 + 1).relu()         # recorded
        torch_tpu.flush()                         # runs the recorded graph (one fused kernel here)
        torch_tpu.set_execution_mode("strict")
        ```

        `get_execution_mode()` said `{_mode_inside!r}` inside; the counters held {_recorded} recorded ops
        before the flush. `TORCH_TPU_DEFER_DEBUG=1` prints every plan built, `TORCH_TPU_KERNEL_TIMES=1` the
        time per kernel at exit.
        """
    )
    return


if __name__ == "__main__":
    app.run()
