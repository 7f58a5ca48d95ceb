"""Parallelism on tpu_dist: DeviceMesh("tpu") and DTensor, tensor-parallel
layers (ColwiseParallel / RowwiseParallel / SequenceParallel) equal to the
unsharded module, FSDP2 x TP on a 2-D mesh, DCP save / load with resharding,
and the Llama example's DDP / FSDP2 / TP training under torchrun equal to
single-process training (one host, and two "nodes" on loopback).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_distributed import FULL, ROOT, free_port, launch

EXAMPLE = ROOT / "examples" / "distributed" / "train_llama.py"


def _setup():
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.accelerator.set_device_index(local)
    dev = torch.device("tpu", local)
    dist.init_process_group(device_id=dev)
    return torch, dist, rank, world, dev


def _close(torch, a, b, what, tol=1e-5):
    a, b = a.detach().cpu(), b.detach().cpu()
    assert torch.allclose(a, b, rtol=tol, atol=tol), f"{what}: largest difference {(a - b).abs().max().item()}"


def case_tensor_parallel() -> None:
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    torch, dist, rank, world, dev = _setup()
    mesh = init_device_mesh("tpu", (world,))
    assert mesh.device_type == "tpu"

    # distribute_tensor: shards hold the right slices; full_tensor / redistribute gather them back.
    torch.manual_seed(0)
    full = torch.randn(4 * world, 6)
    dt = distribute_tensor(full.to(dev), mesh, [Shard(0)])
    _close(torch, dt.to_local(), full.chunk(world)[rank], "Shard(0) local part", 0)
    _close(torch, dt.full_tensor(), full, "full_tensor", 0)
    _close(torch, dt.redistribute(mesh, [Replicate()]).to_local(), full, "redistribute", 0)
    _close(torch, (dt * 2).sum().full_tensor(), full.sum() * 2, "DTensor op", 1e-4)

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.up = nn.Linear(16, 32)
            self.down = nn.Linear(32, 16)

        def forward(self, x):
            return self.down(torch.relu(self.up(self.norm(x))))

    torch.manual_seed(1)
    ref = Mlp().to(dev)
    x = torch.randn(2, 4 * world, 16).to(dev)
    want = ref(x)
    want.sum().backward()
    for name, plan in (("colwise/rowwise", {"up": ColwiseParallel(), "down": RowwiseParallel()}),
                       ("sequence parallel", {"norm": SequenceParallel(),
                                              "up": ColwiseParallel(input_layouts=Shard(1)),
                                              "down": RowwiseParallel(output_layouts=Shard(1))})):
        torch.manual_seed(1)
        m = parallelize_module(Mlp().to(dev), mesh, plan)
        assert isinstance(m.up.weight, DTensor)
        inp = x if name == "colwise/rowwise" else x.chunk(world, dim=1)[rank].contiguous()
        out = m(inp)
        out.sum().backward()
        got = out if name == "colwise/rowwise" else DTensor.from_local(out, mesh, [Shard(1)]).full_tensor()
        _close(torch, got, want, f"{name} forward")
        for (pn, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            _close(torch, g, q.grad, f"{name} grad of {pn}", 1e-4)
    dist.destroy_process_group()
    print(f"rank {rank}: tensor parallel ok", flush=True)


def case_dcp() -> None:
    """FSDP2-sharded model saved with DCP on every rank, loaded back into a
    different layout (row-sharded on the other ranks' halves, and replicated):
    the values equal the original."""
    import torch.distributed.checkpoint as dcp
    import torch.nn as nn
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    torch, dist, rank, world, dev = _setup()
    path = os.environ["TORCH_TPU_TEST_DIR"]
    mesh = init_device_mesh("tpu", (world,))
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4 * world))
    full = {k: v.clone() for k, v in ref.state_dict().items()}
    model = nn.Sequential(*[m for m in ref]).to(dev)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    dcp.save(get_model_state_dict(model), checkpoint_id=path)
    dist.barrier()

    # Reshard on load: every tensor Shard(1) where it can (a layout it was not saved in), else replicated.
    target = {}
    for k, v in full.items():
        place = [Shard(1)] if v.dim() == 2 and v.shape[1] % world == 0 else [Replicate()]
        target[k] = distribute_tensor(torch.zeros_like(v).to(dev), mesh, place)
    dcp.load(target, checkpoint_id=path)
    for k, v in target.items():
        _close(torch, v.full_tensor(), full[k], f"resharded {k}", 0)

    # Back into a fresh FSDP2 model through the state-dict API.
    torch.manual_seed(99)
    fresh = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4 * world)).to(dev)
    for layer in (fresh[0], fresh[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(fresh, mesh=mesh)
    sd = get_model_state_dict(fresh)
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(fresh, sd)
    for k, v in get_model_state_dict(fresh).items():
        assert isinstance(v, DTensor)
        _close(torch, v.full_tensor(), full[k], f"reloaded {k}", 0)
    dist.destroy_process_group()
    print(f"rank {rank}: dcp ok", flush=True)


def case_fsdp_tp_2d() -> None:
    """FSDP2 on the mesh's dp dimension x TP on its tp dimension: a training
    step equals the unsharded module's."""
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch, dist, rank, world, dev = _setup()
    mesh = init_device_mesh("tpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(5)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).to(dev)
    model = nn.Sequential(*[nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)]).to(dev)
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    dp_rank, dp = mesh["dp"].get_local_rank(), world // 2
    for step in range(2):
        x = torch.randn(4 * dp, 8, generator=torch.Generator().manual_seed(step)).to(dev)
        loss = model(x.chunk(dp)[dp_rank]).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        rloss = ref(x).pow(2).mean()
        rloss.backward()
        ropt.step()
        ropt.zero_grad()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert isinstance(p, DTensor)
        _close(torch, p.full_tensor(), q, f"2-D parameter {n}", 1e-5)
    dist.destroy_process_group()
    print(f"rank {rank}: fsdp x tp ok", flush=True)


# ------------------------------------------------------------------- tests


def test_tensor_parallel_layers_equal_unsharded() -> None:
    outs = launch("tensor_parallel", 2, script=__file__)
    assert all("tensor parallel ok" in o for o in outs)


def test_dcp_save_load_resharding() -> None:
    with tempfile.TemporaryDirectory() as d:
        outs = launch("dcp", 2, env={"TORCH_TPU_TEST_DIR": os.path.join(d, "ckpt")}, script=__file__)
    assert all("dcp ok" in o for o in outs)


@pytest.mark.skipif(not FULL, reason="4 processes: TORCH_TPU_TEST_FULL=1 (make test-full)")
def test_fsdp_tp_2d_mesh() -> None:
    outs = launch("fsdp_tp_2d", 4, script=__file__)
    assert all("fsdp x tp ok" in o for o in outs)


def torchrun(args: list[str], nproc: int, extra: list[str] | None = None, env: dict | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *(extra or []),
           str(EXAMPLE), *args]
    e = {k: v for k, v in os.environ.items() if k not in ("TPU_NUM_DEVICES", "LOCAL_WORLD_SIZE")}
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=e)


@pytest.mark.parametrize("parallel,mode", [("ddp", "strict"), ("fsdp", "strict"), ("tp", "strict"),
                                           ("ddp", "defer")])
def test_llama_example_matches_single_process(parallel: str, mode: str) -> None:
    if not FULL and (parallel, mode) not in (("ddp", "strict"), ("fsdp", "strict")):
        pytest.skip("TORCH_TPU_TEST_FULL=1 (make test-full) runs the other configurations")
    r = torchrun(["--parallel", parallel, "--mode", mode, "--check", "--steps", "4"], 2,
                 extra=["--master-port", str(free_port())])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    assert "single-process" in r.stdout and "(ok" in r.stdout, r.stdout


@pytest.mark.skipif(not FULL, reason="4 processes: TORCH_TPU_TEST_FULL=1 (make test-full)")
def test_llama_example_fsdp_tp() -> None:
    r = torchrun(["--parallel", "fsdp_tp", "--tp", "2", "--check", "--steps", "3"], 4,
                 extra=["--master-port", str(free_port())], timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    assert "(ok" in r.stdout, r.stdout


def test_two_nodes_on_loopback() -> None:
    """torchrun's c10d rendezvous across two "nodes" (one process each) on
    127.0.0.1, training the example with DDP."""
    port = free_port()
    common = ["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=tpu-test"]
    cmd = lambda node: [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", *common,  # noqa: E731
                        f"--node-rank={node}", str(EXAMPLE), "--parallel", "ddp", "--check", "--steps", "3"]
    e = {k: v for k, v in os.environ.items() if k not in ("TPU_NUM_DEVICES", "LOCAL_WORLD_SIZE")}
    procs = [subprocess.Popen(cmd(n), cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in (0, 1)]
    deadline = time.monotonic() + 300
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        pytest.fail("two-node run did not finish within 300 s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for n, p in enumerate(procs):
        assert p.returncode == 0, f"node {n}:\n{outs[n][-5000:]}"
    both = "".join(outs)  # the rendezvous decides which node holds rank 0
    assert "on 2 ranks" in both and "(ok" in both, both


if __name__ == "__main__":
    globals()["case_" + os.environ["TORCH_TPU_TEST_CASE"]]()
