import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Precision and autocast")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Precision and autocast

        A TPU's matrix unit multiplies bfloat16 values and accumulates in float32. The device follows that
        contract: float32 matrix products and convolutions run at one of three precisions.

        | `torch.tpu.Precision` | float32 product computed as | `torch.set_float32_matmul_precision` |
        |---|---|---|
        | `HIGHEST` | full float32 products | `"highest"` (PyTorch's default) |
        | `HIGH` | 3 bf16 passes: each operand split into `hi + lo`, `hi*hi + hi*lo + lo*hi` | `"high"` |
        | `DEFAULT` | 1 bf16 pass: both operands rounded to bfloat16 | `"medium"` |

        With no `torch.tpu.precision` setting the device follows `torch.set_float32_matmul_precision`;
        `torch.tpu.precision.set(...)` or `with torch.tpu.precision(...):` override it. Other dtypes are not
        affected. Below, the error of each against a float64 reference, measured here.
        """
    )
    return (mo,)


@app.cell
def _():
    import time

    import torch
    import torch_tpu  # noqa: F401

    g = torch.Generator().manual_seed(0)
    a64 = torch.randn(384, 384, generator=g, dtype=torch.float64)
    b64 = torch.randn(384, 384, generator=g, dtype=torch.float64)
    ref = a64 @ b64
    a, b = a64.float().to("tpu"), b64.float().to("tpu")

    def rel_error(out: torch.Tensor) -> float:
        return ((out.cpu().double() - ref).norm() / ref.norm()).item()

    def timed_matmul(reps: int = 5) -> tuple[torch.Tensor, float]:
        out = a @ b
        torch.tpu.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            out = a @ b
        torch.tpu.synchronize()
        return out, (time.perf_counter() - t0) / reps

    return a, b, g, rel_error, time, timed_matmul, torch


@app.cell
def _(mo, rel_error, timed_matmul, torch):
    P = torch.tpu.Precision
    by_precision = {}
    for _p in (P.HIGHEST, P.HIGH, P.DEFAULT):
        with torch.tpu.precision(_p):
            _eff = torch.tpu.precision.effective()
            _out, _secs = timed_matmul()
        by_precision[_p.name] = {"error": rel_error(_out), "ms": _secs * 1e3, "effective": _eff.name}

    by_torch_setting = {}
    _old = torch.get_float32_matmul_precision()
    for _name in ("highest", "high", "medium"):
        torch.set_float32_matmul_precision(_name)
        _out, _ = timed_matmul(reps=1)
        by_torch_setting[_name] = {"effective": torch.tpu.precision.effective().name, "error": rel_error(_out)}
    torch.set_float32_matmul_precision(_old)

    _rows = "\n".join(
        f"| `{k}` | `{v['effective']}` | {v['error']:.2e} |" for k, v in by_torch_setting.items())
    mo.vstack([
        mo.md(
            f"""
            `torch.tpu.precision.get()` is `{torch.tpu.precision.get()}` (no override), so the device follows
            PyTorch's setting:
            """
        ),
        mo.md("| `torch.set_float32_matmul_precision(...)` | `torch.tpu.precision.effective()` "
              "| relative error of `a @ b` |\n|---|---|---|\n" + _rows),
    ])
    return P, by_precision, by_torch_setting


@app.cell
def _(by_precision):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _names = list(by_precision)
    _fig, (_a1, _a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    _b = _a1.bar(_names, [by_precision[n]["error"] for n in _names], color=["C2", "C1", "C3"])
    _a1.bar_label(_b, fmt="%.1e")
    _a1.set_yscale("log")
    _a1.set_ylabel("relative error vs float64")
    _a1.set_title("384x384 float32 matmul: accuracy")
    _b = _a2.bar(_names, [by_precision[n]["ms"] for n in _names], color=["C2", "C1", "C3"])
    _a2.bar_label(_b, fmt="%.2f")
    _a2.set_ylabel("ms per product")
    _a2.set_title("time on this host")
    _fig.tight_layout()
    _fig
    return matplotlib, plt


@app.cell
def _(by_precision, mo):
    _h, _hi, _d = (by_precision[k]["error"] for k in ("HIGHEST", "HIGH", "DEFAULT"))
    mo.md(
        f"""
        `HIGH` is {_d / _hi:.0f}× more accurate than `DEFAULT` ({_hi:.1e} vs {_d:.1e}); `HIGHEST`'s
        {_h:.1e} is float32 rounding. How fast each one is depends on the host: bf16 products use the AMX
        tiles or AVX512-BF16 instructions where the CPU has them (`torch.tpu.get_device_properties().bf16_matmul`),
        float32 kernels otherwise.
        """
    )
    return


@app.cell
def _(mo, torch):
    _x = torch.randn(8, 32, device="tpu")
    _lin = torch.nn.Linear(32, 16).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        _h = _lin(_x)
        _mm = _x @ _x.T
        _sm = torch.softmax(_h, dim=-1)
        _sum = _h.sum()
        _relu = torch.relu(_h)
        _ln = torch.nn.functional.layer_norm(_h, (16,))
        _gn = torch.nn.functional.group_norm(_h.view(8, 4, 4), 2)
    mo.md(
        f"""
        ## bf16 autocast

        `torch.autocast("tpu", dtype=torch.bfloat16)` applies PyTorch's autocast policy on the device
        (`torch.tpu.is_bf16_supported()` → `{torch.tpu.is_bf16_supported()}`,
        `torch.tpu.get_amp_supported_dtype()` → `{torch.tpu.get_amp_supported_dtype()}`): CUDA's op lists,
        with one departure, the TPU one (PyTorch/XLA's TPU policy and CPU autocast make it too): layer norm,
        group norm and nearest upsampling keep their input's dtype instead of widening to float32. The
        norms compute their statistics and affine map in float32 or wider and round once (their saved
        mean and rstd are float32 when the parameters are), so the float32 rule would only add a widening
        copy, float32 activations and a narrowing copy at the next product. The parameters stay float32;
        what each op returned inside the region here:

        | op | result dtype |
        |---|---|
        | `nn.Linear` | `{_h.dtype}` |
        | `x @ x.T` | `{_mm.dtype}` |
        | `softmax` of a bf16 input | `{_sm.dtype}` |
        | `sum` of a bf16 input | `{_sum.dtype}` |
        | `relu` of a bf16 input | `{_relu.dtype}` |
        | `layer_norm` of a bf16 input | `{_ln.dtype}` |
        | `group_norm` of a bf16 input | `{_gn.dtype}` |
        | the layer's weight | `{_lin.weight.dtype}` |
        """
    )
    return


@app.cell
def _(mo, torch):
    def fit(autocast: bool, steps: int = 40) -> list[float]:
        torch.manual_seed(0)
        _g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 32, generator=_g).to("tpu")
        y = (x[:, :4].sum(1) > 0).long()
        model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2)).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(steps):
            with torch.autocast("tpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses).cpu().tolist()

    fp32_losses, bf16_losses = fit(False), fit(True)
    mo.md(
        f"""
        A classifier trained 40 steps with the forward pass under autocast and without (float32 master
        weights and optimizer either way; no gradient scaler is needed for bfloat16):
        float32 loss {fp32_losses[0]:.3f} → {fp32_losses[-1]:.3f}, bf16 autocast
        {bf16_losses[0]:.3f} → {bf16_losses[-1]:.3f}.
        """
    )
    return bf16_losses, fit, fp32_losses


@app.cell
def _(bf16_losses, fp32_losses, plt):
    _fig, _ax = plt.subplots(figsize=(6, 3))
    _ax.plot(fp32_losses, label="float32")
    _ax.plot(bf16_losses, "--", label="bf16 autocast")
    _ax.set_xlabel("step")
    _ax.set_ylabel("cross-entropy")
    _ax.legend()
    _fig.tight_layout()
    _fig
    return


if __name__ == "__main__":
    app.run()
