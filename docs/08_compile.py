import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="torch.compile with the tpu backend")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # `torch.compile(model, backend="tpu")`

        Dynamo captures the model's Python code as a graph; AOTAutograd splits it into a forward and a
        backward graph of ATen operators; each call of a graph runs its operators straight into the
        DeferAndFuse recorder (`torch_tpu/compiler.py`). So a compiled model gets the same fusion, memory
        plan, generated kernels and plan cache as the eager `"defer"` mode, one cached plan per graph, and
        its results equal strict eager's bit for bit (the graphs run the eager kernels). Plain
        `torch.compile(model)` on `tpu` tensors is handed to this backend too (Inductor's own code
        generator for a device named "tpu" needs JAX). `torch.tpu.compile_stats()` says what happened.
        """
    )
    return (mo,)


@app.cell
def _():
    import time

    import torch
    import torch_tpu  # noqa: F401

    def make_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                   torch.nn.Linear(128, 10)).to("tpu")

    def train(model: torch.nn.Module, forward, steps: int = 12, batch: int = 64) -> tuple[list[float], list[float]]:
        """Losses and per-step seconds of `steps` AdamW steps through `forward`."""
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        losses, secs = [], []
        for _ in range(steps):
            x = torch.randn(batch, 32, generator=g).to("tpu")
            y = torch.randint(0, 10, (batch,), generator=g).to("tpu")
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(forward(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            secs.append(time.perf_counter() - t0)
        return losses, secs

    return make_model, time, torch, train


@app.cell
def _(make_model, torch, train):
    torch.tpu.reset_compile_stats()
    eager_model = make_model()
    eager_losses, eager_secs = train(eager_model, eager_model)
    compiled_model = make_model()
    compiled = torch.compile(compiled_model, backend="tpu")
    compiled_losses, compiled_secs = train(compiled_model, compiled)
    stats_after_training = torch.tpu.compile_stats()
    return (compiled, compiled_losses, compiled_model, compiled_secs, eager_losses, eager_model, eager_secs,
            stats_after_training)


@app.cell
def _(compiled_losses, compiled_secs, eager_losses, eager_secs, mo, stats_after_training):
    _same = compiled_losses == eager_losses
    _st = stats_after_training
    _steady_c = sorted(compiled_secs[2:])[len(compiled_secs[2:]) // 2]
    _steady_e = sorted(eager_secs[2:])[len(eager_secs[2:]) // 2]
    mo.md(
        f"""
        ## A compiled training step

        ```python
        compiled = torch.compile(model, backend="tpu")
        loss = F.cross_entropy(compiled(x), y); loss.backward(); opt.step()   # the optimizer stays eager
        ```

        Twelve AdamW steps of a small MLP (Linear, GELU, LayerNorm, Linear) from the same initial weights
        and batches: the compiled losses equal the eager (strict) ones exactly — `{_same}`
        (last loss {compiled_losses[-1]:.6f} vs {eager_losses[-1]:.6f}). The first compiled step took
        {compiled_secs[0]:.2f} s (Dynamo's capture, AOTAutograd's tracing and partitioning, the lowering of
        {_st["nodes_lowered"]} graph nodes: `lowering_seconds` = {_st["lowering_seconds"]:.3f}), later ones {_steady_c * 1e3:.1f} ms (eager: {_steady_e * 1e3:.1f} ms).
        """
    )
    return


@app.cell
def _(compiled_secs, eager_secs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _fig, _ax = plt.subplots(figsize=(6, 3))
    _ax.semilogy([s * 1e3 for s in eager_secs], "o-", label="eager (strict)")
    _ax.semilogy([s * 1e3 for s in compiled_secs], "s-", label='torch.compile(backend="tpu")')
    _ax.set_xlabel("training step")
    _ax.set_ylabel("ms (log scale)")
    _ax.set_title("The first compiled step pays for compilation")
    _ax.legend()
    _fig.tight_layout()
    _fig
    return matplotlib, plt


@app.cell
def _(compiled, mo, torch):
    with torch.no_grad():
        compiled(torch.randn(24, 32, device="tpu"))  # a new batch size: Dynamo recompiles
    _st = torch.tpu.compile_stats()
    _reasons = [r for rs in _st["recompiles"].values() for r in rs]
    _keys = ["dynamo_graphs", "forward_graphs", "backward_graphs", "inference_graphs", "calls", "nodes_lowered",
             "unsupported_graphs", "routed_from_inductor"]
    mo.vstack([
        mo.md(
            """
            ## `torch.tpu.compile_stats()`

            After one more call with a batch of 24 instead of 64 (under `torch.no_grad()`: an inference
            graph):
            """
        ),
        mo.md("| counter | value |\n|---|---|\n" + "\n".join(f"| `{k}` | {_st[k]} |" for k in _keys)),
        mo.md(
            f"""
            Dynamo's recompile reasons are kept (`compile_stats()["recompiles"]`; `TORCH_LOGS=recompiles`
            prints them as they happen): `{_reasons[-1] if _reasons else "none"}`. After a size changes,
            Dynamo makes that dimension dynamic (`dynamic=True` asks for it from the start): one graph for
            all sizes, and the runtime keeps one cached plan per shape.
            """
        ),
    ])
    return


if __name__ == "__main__":
    app.run()
