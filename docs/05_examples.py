import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="The examples")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # The examples: minGPT, Llama, ResNet, UNet

        Each example in `examples/` is a script with `--help` (`--device`, `--mode strict|defer|compiled`,
        `--steps`, `--dtype`, ...) and also a module: `parse(argv)` reads the same flags and `run(args)`
        returns the exit status and one result per mode (losses, throughput, peak device memory, graphs
        built, the example's own metric). This page runs each one with small settings so it builds in about
        a minute; the scripts' defaults train longer and larger.
        """
    )
    return (mo,)


@app.cell
def _(mo):
    import sys
    import tempfile
    from pathlib import Path

    import torch
    import torch_tpu  # noqa: F401

    _root = str(mo.notebook_dir().parent)
    if _root not in sys.path:
        sys.path.insert(0, _root)
    from examples.llama import train as llama
    from examples.mingpt import train as mingpt
    from examples.resnet import train as resnet
    from examples.unet import train as unet

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def run_example(module, argv: list[str]) -> dict:
        rc, results = module.run(module.parse(argv + ["--no-progress"]))
        if rc != 0:
            raise RuntimeError(f"{module.__name__} {' '.join(argv)} exited with {rc}")
        return results[0]

    return (Path, llama, matplotlib, mingpt, plt, resnet, run_example, sys, tempfile, torch, torch_tpu, unet)


@app.cell
def _(mingpt, run_example):
    gpt_argv = ["--steps", "40", "--batch-size", "16", "--layers", "2", "--width", "64", "--block", "32",
                "--mode", "defer", "--sample-chars", "160"]
    gpt = run_example(mingpt, gpt_argv)
    return gpt, gpt_argv


@app.cell
def _(gpt, gpt_argv, mo, plt):
    _fig, _ax = plt.subplots(figsize=(7, 3))
    _ax.plot(gpt["losses"], label="training loss")
    _ax.axhline(gpt["val"], color="C1", linestyle="--", label=f"validation loss {gpt['val']:.2f}")
    _ax.set_xlabel("step")
    _ax.set_ylabel("cross-entropy (nats/char)")
    _ax.set_title("minGPT on Python's documentation text, DeferAndFuse")
    _ax.legend()
    _fig.tight_layout()
    mo.vstack([
        mo.md(
            f"""
            ## minGPT: training with a loss plot

            `examples/mingpt/train.py {" ".join(gpt_argv)}`: loss {gpt["loss_first"]:.2f} →
            {gpt["loss_last"]:.2f} in {len(gpt["losses"])} steps, {gpt["throughput"]:,.0f} tokens/s, peak device
            memory {gpt["peak_mib"]:.1f} MiB, {gpt["graphs"]} graphs built and {gpt["cache_hits"]} plan-cache hits.
            """
        ),
        _fig,
        mo.md("A sample after this short training:"),
        mo.plain_text(gpt["sample"]),
    ])
    return


@app.cell
def _(llama, mo, run_example):
    llama_argv = ["--steps", "40", "--batch-size", "16", "--layers", "2", "--width", "64", "--heads", "4",
                  "--kv-heads", "2", "--block", "48", "--sample-chars", "120"]
    lm = run_example(llama, llama_argv)
    _text = mo.md(
        f"""
        ## Llama: generation with a KV cache

        `examples/llama/train.py {" ".join(llama_argv)}` trains a {lm["params"] / 1e6:.2f}M-parameter
        Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) for {len(lm["losses"])} steps
        (loss {lm["loss_first"]:.2f} → {lm["loss_last"]:.2f}, validation {lm["bpc"]:.2f} bits per
        character), then generates: one prefill pass over the prompt, then one token per step into a static
        KV cache written in place — {lm["gen_tokens_per_s"]:,.0f} tokens/s here:
        """
    )
    mo.vstack([_text, mo.plain_text(lm["sample"])])
    return llama_argv, lm


@app.cell
def _(mo, resnet, run_example, torch):
    resnet_argv = ["--steps", "60", "--width", "8", "--image-size", "16", "--lr", "0.1"]
    rn = run_example(resnet, resnet_argv)
    _conf = torch.zeros(10, 10, dtype=torch.long)
    _data = resnet.Digits(16)
    for _t, _p in zip(_data.y_test.tolist(), rn["predictions"].tolist()):
        _conf[_t, _p] += 1
    confusion = _conf
    mo.md(
        f"""
        ## ResNet: held-out accuracy

        `examples/resnet/train.py {" ".join(resnet_argv)}`: a ResNet-18-style network on scikit-learn's
        8×8 digits (upsampled to 16×16), {len(rn["losses"])} SGD steps of 32 images. Held-out accuracy
        **{rn["accuracy"]:.1%}** on {len(rn["predictions"])} images, inference at
        {rn["infer_throughput"]:,.0f} images/s (`model.eval()` + `torch.inference_mode()`).
        """
    )
    return confusion, resnet_argv, rn


@app.cell
def _(confusion, plt):
    _fig, _ax = plt.subplots(figsize=(4, 3.6))
    _im = _ax.imshow(confusion.numpy(), cmap="Blues")
    _ax.set_xlabel("predicted digit")
    _ax.set_ylabel("true digit")
    _ax.set_xticks(range(10))
    _ax.set_yticks(range(10))
    _ax.set_title("ResNet: held-out confusion matrix")
    _fig.colorbar(_im, ax=_ax)
    _fig.tight_layout()
    _fig
    return


@app.cell
def _(Path, mo, plt, run_example, tempfile, unet):
    _png = str(Path(tempfile.mkdtemp()) / "samples.png")
    unet_argv = ["--steps", "60", "--base", "16", "--timesteps", "100", "--sample-count", "16",
                 "--sample-steps", "20", "--samples-png", _png]
    un = run_example(unet, unet_argv)
    _grid = unet.grid(un["samples"])
    _fig, _ax = plt.subplots(figsize=(4, 4))
    _ax.imshow(_grid.numpy(), cmap="gray", vmin=0, vmax=255)
    _ax.set_axis_off()
    _ax.set_title("UNet-DDPM samples drawn on the device")
    _fig.tight_layout()
    mo.vstack([
        mo.md(
            f"""
            ## UNet: samples as images

            `examples/unet/train.py {" ".join(unet_argv[:-2])}` trains a small UNet as a DDPM noise
            predictor on the digits (held-out noise MSE {un["val"]:.3f} after {len(un["losses"])} steps),
            then draws {un["samples"].shape[0]} images on the device with {unet_argv[unet_argv.index("--sample-steps") + 1]}
            reverse steps in {un["sample_s"]:.1f} s. With so little training they are blurry strokes; the
            script's defaults (`--steps 300`) train longer. The script also writes the grid as a PNG
            (`--samples-png`).
            """
        ),
        _fig,
    ])
    return un, unet_argv


if __name__ == "__main__":
    app.run()
