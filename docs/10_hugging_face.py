import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Hugging Face on tpu")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Hugging Face Transformers and Diffusers on `tpu`

        Transformers and Diffusers see the `tpu` device through `torch.accelerator`, so the code written for
        CUDA runs with the device name changed: `from_pretrained(folder, device_map="tpu")`, `generate()`,
        `pipeline(..., device="tpu")`, `Trainer` (which picks the accelerator by itself) and Diffusers
        models. Nothing can be downloaded here, so the model is built from a small Llama config and a
        word-level tokenizer made on the spot, saved with `save_pretrained` and loaded back as a downloaded
        checkpoint would be. Each result is compared with the same code on CPU.
        """
    )
    return (mo,)


@app.cell
def _():
    import tempfile
    from pathlib import Path

    import torch
    import torch_tpu  # noqa: F401  (import torch alone loads it too, through its autoload entry point)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    TEXT = ("the cat sat on the mat . the dog ran in the park . a bird sang over the green hills . "
            "the cat saw the bird . the dog sat on the mat . ")

    # a word-level tokenizer over the words of TEXT (a real checkpoint ships its own tokenizer.json)
    _vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    for _w in dict.fromkeys(TEXT.split()):
        _vocab[_w] = len(_vocab)
    _tok = Tokenizer(models.WordLevel(vocab=_vocab, unk_token="[UNK]"))
    _tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_tok, pad_token="[PAD]", bos_token="[BOS]",
                                        eos_token="[EOS]", unk_token="[UNK]")

    config = LlamaConfig(vocab_size=len(_vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    untrained = AutoModelForCausalLM.from_config(config)          # random weights, on CPU
    workdir = Path(tempfile.mkdtemp(prefix="hf-on-tpu-"))
    untrained.save_pretrained(workdir / "tiny-llama")
    tokenizer.save_pretrained(workdir / "tiny-llama")
    n_params = sum(p.numel() for p in untrained.parameters())
    return AutoModelForCausalLM, TEXT, config, n_params, tokenizer, torch, workdir


@app.cell(hide_code=True)
def _(config, mo, n_params, workdir):
    mo.md(
        f"""
        A Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) of
        {config.num_hidden_layers} layers, hidden size {config.hidden_size}, {n_params:,} parameters and a
        vocabulary of {config.vocab_size} words, saved to `{workdir / "tiny-llama"}`.

        ## `Trainer` picks the `tpu` by itself

        `TrainingArguments` asks `torch.accelerator` which device to use, so the usual training script
        needs no change. It runs as a script, as a training job does (inside a notebook Transformers wants
        IPython for its progress bars), once as is and once with `use_cpu=True`:
        """
    )
    return


@app.cell
def _(TEXT, workdir):
    import json
    import os
    import subprocess
    import sys
    import textwrap

    TRAIN = textwrap.dedent('''\
        import json, sys
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

        folder, out, use_cpu = sys.argv[1], sys.argv[2], sys.argv[3] == "cpu"
        tokenizer = AutoTokenizer.from_pretrained(folder)
        stream = torch.tensor(tokenizer(TEXT * 8).input_ids)
        windows = stream.unfold(0, 12, 3)                       # overlapping 12-word pieces of the text

        class Pieces(torch.utils.data.Dataset):
            def __len__(self):
                return len(windows)

            def __getitem__(self, i):
                return {"input_ids": windows[i], "labels": windows[i]}

        args = TrainingArguments(output_dir=out, max_steps=40, per_device_train_batch_size=16,
                                 learning_rate=1e-2, warmup_steps=4, logging_steps=1, seed=0, use_cpu=use_cpu,
                                 report_to=[], save_strategy="no", disable_tqdm=True,
                                 dataloader_pin_memory=False)
        trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(folder), args=args, train_dataset=Pieces())
        trainer.train()
        trainer.save_model(out)                                 # weights + config, loadable by from_pretrained
        tokenizer.save_pretrained(out)
        print(json.dumps({"device": str(args.device),
                          "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}))
    ''').replace("TEXT", repr(TEXT))
    _script = workdir / "train.py"
    _script.write_text(TRAIN)
    _env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    # the two runs side by side (two processes: Accelerate keeps the device of a process's first Trainer)
    _procs = {dev: subprocess.Popen([sys.executable, str(_script), str(workdir / "tiny-llama"),
                                     str(workdir / f"trained-{dev}"), dev],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL, env=_env)
              for dev in ("tpu", "cpu")}
    runs = {}
    for _dev, _p in _procs.items():
        _out, _err = _p.communicate(timeout=300)
        if _p.returncode != 0:
            raise RuntimeError(f"training on {_dev} failed ({_p.returncode}):\n{_err[-4000:]}")
        runs[_dev] = json.loads(_out.strip().splitlines()[-1])
    trained = workdir / "trained-tpu"
    return TRAIN, runs, trained


@app.cell
def _(TRAIN, mo, runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _fig, _ax = plt.subplots(figsize=(6, 3))
    _ax.plot(runs["tpu"]["losses"], "o-", ms=3, label=f'Trainer on {runs["tpu"]["device"]}')
    _ax.plot(runs["cpu"]["losses"], "--", label=f'Trainer on {runs["cpu"]["device"]} (use_cpu=True)')
    _ax.set_xlabel("step")
    _ax.set_ylabel("training loss")
    _ax.set_title("The same losses on tpu and CPU")
    _ax.legend()
    _fig.tight_layout()
    _worst = max(abs(a - b) / abs(b) for a, b in zip(runs["tpu"]["losses"], runs["cpu"]["losses"]))
    mo.vstack([
        mo.accordion({"train.py": mo.md("```python\n" + TRAIN + "```")}),
        _fig,
        mo.md(f'`args.device` chose `{runs["tpu"]["device"]}`. The loss fell from {runs["tpu"]["losses"][0]:.3f} '
              f'to {runs["tpu"]["losses"][-1]:.3f} in {len(runs["tpu"]["losses"])} steps; the largest relative '
              f"difference from the CPU run over all steps is {_worst:.1e} (float32 on both; the kernels "
              f"sum in a different order)."),
    ])
    return matplotlib, plt


@app.cell
def _(AutoModelForCausalLM, tokenizer, torch, trained):
    # what a user writes: load a checkpoint straight onto the device, generate greedily
    model = AutoModelForCausalLM.from_pretrained(trained, device_map="tpu")
    prompt = tokenizer("the dog", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(prompt.to("tpu"), max_new_tokens=14, do_sample=False)
    on_cpu = AutoModelForCausalLM.from_pretrained(trained).generate(prompt, max_new_tokens=14, do_sample=False)
    placed = sorted({str(p.device) for p in model.parameters()})
    return model, on_cpu, out, placed, prompt


@app.cell
def _(mo, on_cpu, out, placed, tokenizer, torch):
    mo.vstack([
        mo.md(
            f"""
            ## `from_pretrained(folder, device_map="tpu")` and `generate()`

            ```python
            model = AutoModelForCausalLM.from_pretrained(folder, device_map="tpu")
            out = model.generate(prompt.to("tpu"), max_new_tokens=14, do_sample=False)
            ```

            Every weight was loaded onto {", ".join(f"`{d}`" for d in placed)}; the output tensor is on
            `{out.device}`. Greedy decoding (with Transformers' dynamic KV cache) from the trained
            checkpoint, and the same tokens as on CPU: `{torch.equal(out.cpu(), on_cpu)}`.
            """
        ),
        mo.plain_text(tokenizer.decode(out[0], skip_special_tokens=True)),
    ])
    return


@app.cell
def _(mo, trained):
    from transformers import pipeline

    generator = pipeline("text-generation", model=str(trained), device="tpu")
    _kw = dict(max_new_tokens=10, do_sample=False, return_full_text=False)   # the continuation only
    texts = {p: generator(p, **_kw)[0]["generated_text"] for p in ("the cat", "a bird")}
    _cpu = pipeline("text-generation", model=str(trained), device="cpu")
    _same = all(_cpu(p, **_kw)[0]["generated_text"] == t for p, t in texts.items())
    mo.vstack([
        mo.md(
            f"""
            ## `pipeline("text-generation", device="tpu")`

            ```python
            generator = pipeline("text-generation", model=folder, device="tpu")
            generator("the cat", max_new_tokens=10, do_sample=False, return_full_text=False)
            ```

            The pipeline runs its model on `{generator.device}` (tokenizing and decoding stay on the host);
            the texts equal a CPU pipeline's: `{_same}`.
            """
        ),
        mo.plain_text("\n".join(f"{p} -> {t}" for p, t in texts.items())),
    ])
    return generator, pipeline, texts


@app.cell
def _(torch):
    from diffusers import DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    sample = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    step_t = 500

    def denoise(model, x):
        """One reverse-diffusion step: the UNet predicts the noise, the scheduler removes its share."""
        with torch.no_grad():
            noise = model(x, step_t).sample
        # the step adds fresh noise: drawn by a CPU generator, the same numbers on both devices
        gen = torch.Generator().manual_seed(2)
        return noise, scheduler.step(noise, step_t, x, generator=gen).prev_sample

    cpu_noise, cpu_prev = denoise(unet, sample)
    unet_tpu = unet.to("tpu")
    tpu_noise, tpu_prev = denoise(unet_tpu, sample.to("tpu"))
    noise_diff = (tpu_noise.cpu() - cpu_noise).abs().max().item()
    prev_diff = (tpu_prev.cpu() - cpu_prev).abs().max().item()
    n_unet = sum(p.numel() for p in unet_tpu.parameters())
    return cpu_prev, n_unet, noise_diff, prev_diff, sample, step_t, tpu_prev


@app.cell
def _(cpu_prev, mo, n_unet, noise_diff, plt, prev_diff, sample, step_t, tpu_prev):
    _fig, _axes = plt.subplots(3, 4, figsize=(6.4, 5))
    _rows = (("input", sample), ("tpu", tpu_prev.cpu()), ("CPU", cpu_prev))
    for _r, (_name, _x) in enumerate(_rows):
        for _c in range(4):
            _img = _x[_c].permute(1, 2, 0)
            _axes[_r, _c].imshow(((_img - _img.min()) / (_img.max() - _img.min())).numpy())
            _axes[_r, _c].set_xticks([])
            _axes[_r, _c].set_yticks([])
        _axes[_r, 0].set_ylabel(_name)
    _fig.suptitle(f"one DDPM step at t={step_t}")
    _fig.tight_layout()
    mo.vstack([
        mo.md(
            f"""
            ## A Diffusers `UNet2DModel` denoising step

            ```python
            unet = UNet2DModel(sample_size=32, ...).to("tpu")
            noise = unet(x.to("tpu"), t).sample
            x_prev = DDPMScheduler(num_train_timesteps=1000).step(noise, t, x.to("tpu")).prev_sample
            ```

            A {n_unet:,}-parameter UNet (residual blocks, group norm, self-attention at the low resolution),
            random weights, four 32×32 images. Largest difference from CPU: {noise_diff:.1e} in the predicted
            noise, {prev_diff:.1e} in the denoised images (float32 on both). `tests/hf/` checks more:
            `UNet2DConditionModel`, `AutoencoderKL`, a DiT, `DDPMPipeline` / `DDIMPipeline` end to end in each
            execution mode, and 128 Transformers architectures (`tests/hf/SWEEP.md`).
            """
        ),
        _fig,
    ])
    return


if __name__ == "__main__":
    app.run()
