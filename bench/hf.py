"""Hugging Face clients on tpu vs CPU eager (python -m bench hf).

generate(): tokens/s of greedy decoding with the dynamic KV cache for a
~10M-parameter Llama config (tpu strict, tpu defer, CPU eager), each sample
one generate() call of NEW_TOKENS tokens after a 16-token prompt.
DDPM: steps/s of DDPMPipeline's sampling loop (a UNet2DModel of ~1.7M
parameters at 32x32) on tpu strict / defer and CPU eager.
Configurations alternate in every repeat (bench/common.py interleaved)."""
from __future__ import annotations

import copy

import torch

import torch_tpu
from bench import common

NEW_TOKENS = 32
DDPM_STEPS = 10


def llama_10m():
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def ddpm_unet():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D",
                                                                           "DownBlock2D"),
                       up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8).eval()


def _in_mode(mode: str, fn):
    def run():
        previous = torch_tpu.set_execution_mode(mode)
        try:
            return fn()
        finally:
            torch_tpu.set_execution_mode(previous)
    return run


def generate(repeats: int) -> tuple[dict, str]:
    cpu = llama_10m()
    dev = copy.deepcopy(cpu).to("tpu")
    params = sum(p.numel() for p in cpu.parameters())
    prompt = torch.randint(3, 8192, (1, 16), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    tokens = {}

    def on(model, device, key):
        def call():
            with torch.no_grad():
                tokens[key] = model.generate(prompt.to(device), **kw).cpu()
        return call

    configs = {"cpu eager": on(cpu, "cpu", "cpu"), "tpu strict": _in_mode("strict", on(dev, "tpu", "strict")),
               "tpu defer": _in_mode("defer", on(dev, "tpu", "defer"))}
    med = common.interleaved(configs, repeats, warmup=1)
    same = tokens["cpu"].tolist() == tokens["strict"].tolist() == tokens["defer"].tolist()
    rows = [[k, f"{NEW_TOKENS / v:.1f}", f"{v * 1e3 / NEW_TOKENS:.2f}", f"{med['cpu eager'] / v:.2f}x"]
            for k, v in med.items()]
    table = (f"Llama {params / 1e6:.1f}M parameters (6 layers, hidden 256, vocab 8192), greedy generate() of "
             f"{NEW_TOKENS} tokens after a 16-token prompt, dynamic KV cache, batch 1, f32; tokens identical on "
             f"all three: {'yes' if same else 'NO'}:\n\n"
             + common.markdown_table(["config", "tokens/s", "ms/token", "speed vs cpu eager"], rows))
    return {"params": params, "seconds": med, "same_tokens": same}, table


def ddpm(repeats: int) -> tuple[dict, str]:
    from diffusers import DDPMPipeline, DDPMScheduler

    unet = ddpm_unet()
    params = sum(p.numel() for p in unet.parameters())
    sched = DDPMScheduler(num_train_timesteps=DDPM_STEPS)
    cpu_pipe = DDPMPipeline(unet=unet, scheduler=sched)
    dev_pipe = DDPMPipeline(unet=copy.deepcopy(unet), scheduler=copy.deepcopy(sched)).to("tpu")
    cpu_pipe.set_progress_bar_config(disable=True)
    dev_pipe.set_progress_bar_config(disable=True)
    images = {}

    def on(pipe, key):
        def call():
            images[key] = pipe(batch_size=4, num_inference_steps=DDPM_STEPS, output_type="np",
                               generator=torch.Generator().manual_seed(0)).images
        return call

    configs = {"cpu eager": on(cpu_pipe, "cpu"), "tpu strict": _in_mode("strict", on(dev_pipe, "strict")),
               "tpu defer": _in_mode("defer", on(dev_pipe, "defer"))}
    med = common.interleaved(configs, repeats, warmup=1)
    err = max(float(abs(images[k] - images["cpu"]).max()) for k in ("strict", "defer"))
    rows = [[k, f"{DDPM_STEPS / v:.1f}", f"{v * 1e3 / DDPM_STEPS:.1f}", f"{med['cpu eager'] / v:.2f}x"]
            for k, v in med.items()]
    table = (f"DDPMPipeline, UNet2DModel {params / 1e6:.2f}M parameters, batch 4 of 32x32x3, {DDPM_STEPS} steps a "
             f"sample; largest pixel difference from CPU {err:.1e}:\n\n"
             + common.markdown_table(["config", "steps/s", "ms/step", "speed vs cpu eager"], rows))
    return {"params": params, "seconds": med, "max_pixel_diff": err}, table


def run(repeats: int) -> tuple[dict, str]:
    g, gt = generate(repeats)
    d, dt = ddpm(repeats)
    return {"generate": g, "ddpm": d}, gt + "\n\n" + dt


if __name__ == "__main__":
    res, body = run(5)
    print(common.host_line())
    print(body)
