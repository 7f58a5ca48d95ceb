import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Distributed: tpu_dist")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Distributed training with `tpu_dist`

        `tpu_dist` is the tpu device's c10d backend, registered when `torch_tpu` loads, so scripts written
        for CUDA and NCCL run with the device type changed: `dist.init_process_group("tpu_dist")` (or with
        `device_id=torch.device("tpu", i)`, or `"cpu:gloo,tpu:tpu_dist"`), DDP, FSDP2, DeviceMesh and DTensor
        on top. Under `torchrun` each process sees `LOCAL_WORLD_SIZE` chips and uses `tpu:LOCAL_RANK`, as a
        CUDA script does. Below, two processes started by `torchrun` on this machine.
        """
    )
    return (mo,)


@app.cell
def _():
    import subprocess
    import sys
    import tempfile
    import textwrap
    from pathlib import Path

    SCRIPT = textwrap.dedent('''\
        import os
        import torch
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("tpu_dist")
        dev = torch.device("tpu", torch.tpu.current_device())

        t = torch.full((4,), float(rank + 1), device=dev)
        dist.all_reduce(t)                                   # SUM over the ranks
        parts = [torch.empty(2, device=dev) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, torch.tensor([rank, 10.0 * rank], device=dev))

        torch.manual_seed(0)                                 # the same initial weights on every rank
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1).to(dev))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank)).to(dev)  # each rank its own batch
        for _ in range(3):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()                                  # gradients averaged by tpu_dist
            opt.step()
        w = model.module.weight.detach().clone()
        same = [torch.empty_like(w) for _ in range(dist.get_world_size())]
        dist.all_gather(same, w)
        print(f"rank {rank} on {dev} ({dist.get_backend()}): all_reduce {t.tolist()}, "
              f"all_gather {[p.tolist() for p in parts]}, DDP weights equal on all ranks: "
              f"{all(torch.equal(same[0], s) for s in same)}\\n", end="", flush=True)  # one write a line
        dist.destroy_process_group()
    ''')
    _path = Path(tempfile.mkdtemp()) / "collectives.py"
    _path.write_text(SCRIPT)
    _proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(_path)],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if _proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({_proc.returncode}):\n{_proc.stdout}\n{_proc.stderr[-4000:]}")
    torchrun_output = "\n".join(sorted(ln for ln in _proc.stdout.splitlines() if ln.startswith("rank ")))
    return Path, SCRIPT, subprocess, sys, tempfile, textwrap, torchrun_output


@app.cell
def _(SCRIPT, mo, torchrun_output):
    mo.vstack([
        mo.md("The script, `torchrun --nproc-per-node 2 collectives.py`:"),
        mo.md("```python\n" + SCRIPT + "```"),
        mo.md("What each rank printed:"),
        mo.plain_text(torchrun_output),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(
        r"""
        ## Going further

        `examples/distributed/train_llama.py` trains the Llama example with `--parallel ddp`, `fsdp`
        (FSDP2's `fully_shard`), `tp` (tensor parallelism with DTensor) or `fsdp_tp` (a 2-D mesh); `--check`
        trains the same model in one process on the whole global batch and compares the losses step by
        step:

        ```sh
        .venv/bin/torchrun --nproc-per-node 2 examples/distributed/train_llama.py --parallel fsdp --check
        ```

        The README's *Distributed* section lists the collectives, what happens on failures (a mismatched
        collective raises `DistBackendError` naming every rank's call) and what is not supported yet;
        `python -m bench dist` measures all_reduce bandwidth against Gloo.
        """
    )
    return


if __name__ == "__main__":
    app.run()
