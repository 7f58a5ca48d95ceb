import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Porting a CUDA script")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Porting a CUDA script

        Code written for a GPU with PyTorch runs on the `tpu` device by changing the device name and the
        `torch.cuda` module: the device module `torch.tpu` has the same functions (`synchronize`, `Stream`,
        `Event`, `manual_seed`, `memory_allocated`, `max_memory_allocated`, `empty_cache`, ...). Below is a
        typical CUDA training script, the port, and the port running here.
        """
    )
    return (mo,)


@app.cell
def _():
    import textwrap

    CUDA_SCRIPT = textwrap.dedent('''\
    import time
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.cuda.amp.GradScaler()
    x = torch.randn(512, 64).to(device, non_blocking=True)
    y = torch.randint(0, 10, (512,)).cuda()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.reset_peak_memory_stats()
    start.record()
    for step in range(30):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    end.record()
    torch.cuda.synchronize()
    print(f"loss {loss.item():.3f}, {start.elapsed_time(end):.1f} ms, "
          f"peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
    ''')
    return CUDA_SCRIPT, textwrap


@app.cell
def _():
    # (CUDA spelling, TPU spelling, why)
    CHANGES = [
        ('torch.backends.cuda.matmul.allow_tf32 = True', 'torch.set_float32_matmul_precision("high")',
         "the float32 product precision is PyTorch's device-neutral setting (here: 3 bf16 passes)"),
        ('"cuda" if torch.cuda.is_available()', '"tpu" if torch.tpu.is_available()', "the device name"),
        ("torch.cuda.manual_seed_all(0)", "torch.tpu.manual_seed_all(0)", "the device module"),
        ("scaler = torch.cuda.amp.GradScaler()\n", "",
         "bfloat16 has float32's range: no loss scaling"),
        (".cuda()", '.to("tpu")', "no Tensor.cuda(); `.tpu()` works too"),
        ("torch.cuda.Event", "torch.tpu.Event", "events"),
        ("torch.cuda.reset_peak_memory_stats", "torch.tpu.reset_peak_memory_stats", "memory statistics"),
        ('torch.autocast("cuda", dtype=torch.float16)', 'torch.autocast("tpu", dtype=torch.bfloat16)',
         "the TPU's low-precision type is bfloat16"),
        ("    scaler.scale(loss).backward()\n    scaler.step(opt)\n    scaler.update()\n",
         "    loss.backward()\n    opt.step()\n", "plain backward and step without the scaler"),
        ("torch.cuda.synchronize()", "torch.tpu.synchronize()", "wait for the device"),
        ("torch.cuda.max_memory_allocated", "torch.tpu.max_memory_allocated", "memory statistics"),
    ]

    def port(script: str) -> str:
        """Applies CHANGES, each of which must match (a stale table fails loudly)."""
        for old, new, _why in CHANGES:
            if old not in script:
                raise ValueError(f"the CUDA script no longer contains {old!r}")
            script = script.replace(old, new)
        return script

    return CHANGES, port


@app.cell
def _(CHANGES, CUDA_SCRIPT, mo, port):
    import difflib

    TPU_SCRIPT = port(CUDA_SCRIPT)
    _diff = "".join(difflib.unified_diff(CUDA_SCRIPT.splitlines(True), TPU_SCRIPT.splitlines(True),
                                         "train_cuda.py", "train_tpu.py"))
    _rows = "\n".join(f"| `{o.strip()}` | `{n.strip() or '(removed)'}` | {w} |" for o, n, w in CHANGES
                      if "\n" not in o.strip())
    mo.vstack([
        mo.md("## The changes"),
        mo.md("| CUDA | TPU | why |\n|---|---|---|\n" + _rows),
        mo.md("and the three `scaler` lines of the step become `loss.backward(); opt.step()`. As a diff:"),
        mo.plain_text(_diff),
    ])
    return TPU_SCRIPT, difflib


@app.cell
def _(TPU_SCRIPT, mo):
    import subprocess
    import sys

    _proc = subprocess.run([sys.executable, "-c", TPU_SCRIPT], capture_output=True, text=True, timeout=300)
    if _proc.returncode != 0:
        raise RuntimeError(f"the ported script failed:\n{_proc.stderr}")
    ported_output = _proc.stdout.strip()
    mo.vstack([
        mo.md("## The port, run in a fresh process (`import torch` loads `torch_tpu` by itself)"),
        mo.plain_text(ported_output),
    ])
    return ported_output, subprocess, sys


@app.cell(hide_code=True)
def _(mo):
    mo.md(
        r"""
        ## Things to know when porting

        - **Nothing falls back silently.** An operator without a `tpu` kernel raises
          `NotImplementedError: operator 'aten::X' is not implemented for TPU`; the CPU fallback is opt-in
          (`TORCH_TPU_CPU_FALLBACK=1` or `torch_tpu._internal.execution_mode.cpu_fallback_mode(True)`),
          warned once per operator and counted in `torch.tpu.fallback_stats()`.
        - **Errors keep PyTorch's classes**: `torch.OutOfMemoryError: TPU out of memory. Tried to allocate …`;
          an error inside asynchronous work is raised at the next synchronization, as with CUDA, and
          `TPU_LAUNCH_BLOCKING=1` plays `CUDA_LAUNCH_BLOCKING=1`'s part.
        - **Several chips**: `TPU_NUM_DEVICES=N` gives `tpu:0` … `tpu:N-1`; `torch.tpu.set_device(i)` and
          `with torch.tpu.device(i):` switch as their CUDA counterparts do.
        - **Device-neutral code** (`torch.accelerator`, `torch.get_device_module`) needs no port at all:
          see *Device-agnostic code*.
        - **Speed**: the *Execution modes* page shows `torch_tpu.execution_mode("defer")`, which fuses a
          step's operators; *torch.compile* shows `backend="tpu"`.
        """
    )
    return


if __name__ == "__main__":
    app.run()
