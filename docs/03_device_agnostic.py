import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Device-agnostic code")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Writing device-agnostic code with `torch.accelerator`

        PyTorch's `torch.accelerator` API names "the accelerator this process has" without naming CUDA, XPU
        or TPU. With `torch_tpu` installed, the accelerator is the `tpu` device, so code written against
        `torch.accelerator` — and against `torch.get_device_module()`, `torch.autocast(device_type=...)` and
        `torch.Generator(device)` — runs on it unchanged, and on a machine without it falls back to the CPU
        because the code says so, not silently.
        """
    )
    return (mo,)


@app.cell
def _(mo):
    import torch
    import torch_tpu  # noqa: F401  (import torch alone loads it too)

    acc = torch.accelerator.current_accelerator()
    mo.md(
        f"""
        | call | value here |
        |---|---|
        | `torch.accelerator.is_available()` | `{torch.accelerator.is_available()}` |
        | `torch.accelerator.current_accelerator()` | `{acc!r}` |
        | `torch.accelerator.device_count()` | `{torch.accelerator.device_count()}` |
        | `torch.accelerator.current_device_index()` | `{torch.accelerator.current_device_index()}` |
        | `torch.get_device_module(acc)` | `{torch.get_device_module(acc).__name__}` |
        | `torch.get_device_module(acc).get_device_name()` | `{torch.get_device_module(acc).get_device_name()}` |
        """
    )
    return acc, torch


@app.cell
def _(torch):
    import time

    def pick_device() -> torch.device:
        """The accelerator if there is one, else the CPU."""
        if torch.accelerator.is_available():
            return torch.accelerator.current_accelerator()
        return torch.device("cpu")

    def train(device: torch.device, steps: int = 30, seed: int = 0) -> dict:
        """A small regression MLP trained on `device`; nothing in here names a device type."""
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(512, 16, generator=g)
        y = (x[:, :1] * 2 - x[:, 1:2]).tanh() + 0.1 * torch.randn(512, 1, generator=g)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = x.to(device), y.to(device)
        if device.type != "cpu":
            torch.accelerator.synchronize()
            torch.accelerator.reset_peak_memory_stats()
        losses = []
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        losses = torch.stack(losses).cpu()  # one copy to the host at the end
        if device.type != "cpu":
            torch.accelerator.synchronize()
        out = {"device": str(device), "losses": losses, "seconds": time.perf_counter() - t0}
        if device.type != "cpu":
            out["peak_kib"] = torch.accelerator.max_memory_allocated() / 1024
        return out

    return pick_device, time, train


@app.cell
def _(mo, pick_device, torch, train):
    dev = pick_device()
    on_acc = train(dev)
    on_cpu = train(torch.device("cpu"))
    _gap = (on_acc["losses"] - on_cpu["losses"]).abs().max().item()
    mo.md(
        f"""
        ## One training function, two devices

        `pick_device()` returned `{dev}`. The same `train()` ran there and on the CPU with the same seed:
        loss {on_acc["losses"][0]:.4f} → {on_acc["losses"][-1]:.4f} on `{on_acc["device"]}`
        (peak device memory {on_acc.get("peak_kib", 0):.0f} KiB by `torch.accelerator.max_memory_allocated()`),
        {on_cpu["losses"][0]:.4f} → {on_cpu["losses"][-1]:.4f} on `cpu`; the largest difference of the
        two loss curves is {_gap:.2e} (float32 rounding: the kernels are different code).
        """
    )
    return dev, on_acc, on_cpu


@app.cell
def _(on_acc, on_cpu):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _fig, _ax = plt.subplots(figsize=(6, 3))
    _ax.plot(on_acc["losses"], label=on_acc["device"])
    _ax.plot(on_cpu["losses"], "--", label=on_cpu["device"])
    _ax.set_xlabel("step")
    _ax.set_ylabel("MSE loss")
    _ax.legend()
    _fig.tight_layout()
    _fig
    return matplotlib, plt


@app.cell
def _(dev, mo, torch):
    _mod = torch.get_device_module(dev)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
        _h = torch.nn.functional.linear(torch.randn(4, 8, device=dev), torch.randn(3, 8, device=dev))
    _s = torch.Stream(device=dev)
    with _s:
        _z = torch.ones(8, device=dev) * 3
    _s.synchronize()
    _gen = torch.Generator(device=dev).manual_seed(1)
    _r1 = torch.rand(3, device=dev, generator=_gen)
    _gen.manual_seed(1)
    _r2 = torch.rand(3, device=dev, generator=_gen)
    mo.md(
        f"""
        ## The other device-neutral pieces

        ```python
        mod = torch.get_device_module(dev)                  # torch.tpu here, torch.cuda on a GPU
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            h = F.linear(a, w)                              # {_h.dtype}
        s = torch.Stream(device=dev)                        # {type(_s).__name__} on {_s.device}
        with s: z = torch.ones(8, device=dev) * 3           # sum {_z.sum().item():.0f}
        gen = torch.Generator(device=dev).manual_seed(1)    # same seed, same numbers: {torch.equal(_r1, _r2)}
        ```

        `{_mod.__name__}.memory_allocated()` = {_mod.memory_allocated():,} bytes right now. Code that must
        also run where there is no accelerator checks `torch.accelerator.is_available()` once and picks
        the CPU explicitly, as `pick_device()` does.
        """
    )
    return


if __name__ == "__main__":
    app.run()
