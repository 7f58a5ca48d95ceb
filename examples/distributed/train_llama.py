"""Distributed training of the Llama example (examples/llama) on tpu with the
tpu_dist backend: DDP, FSDP2, tensor parallelism and FSDP x TP on a 2-D mesh.
One command each (CUDA-style device selection: tpu:LOCAL_RANK):

    torchrun --nproc-per-node 2 examples/distributed/train_llama.py --parallel ddp --check
    torchrun --nproc-per-node 2 examples/distributed/train_llama.py --parallel fsdp --check
    torchrun --nproc-per-node 2 examples/distributed/train_llama.py --parallel tp --check
    torchrun --nproc-per-node 4 examples/distributed/train_llama.py --parallel fsdp_tp --tp 2 --check

Every data-parallel rank trains on its own --batch sequences of one global
batch (the ranks of a tensor-parallel group share theirs). With --check, rank
0 also trains the same model in this one process on the whole global batch
and compares the losses step by step (exit code 1 past --tol).
--mode defer runs DeferAndFuse (collectives are cut points).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples import common  # noqa: E402
from examples.llama.model import Llama  # noqa: E402


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model and training options (shared with ray_train_llama.py)."""
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="sequences a step per data-parallel rank")
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)


def build_model(args: argparse.Namespace) -> tuple[common.CharData, Llama]:
    """The data and the model of args (seeded: the same on every rank)."""
    data = common.CharData(common.pydoc_text(), args.block)
    torch.manual_seed(args.seed)
    return data, Llama(vocab=data.vocab, d=args.width, layers=args.layers, heads=args.heads,
                       kv_heads=args.kv_heads, block=args.block)


def step_batch(data: common.CharData, args: argparse.Namespace, step: int, dp: int, dp_rank: int,
               device: torch.device) -> tuple[torch.Tensor, ...]:
    """The step's global batch of args.batch * dp sequences (the same on every
    rank, on the host) and this data-parallel rank's slice of it on device."""
    g = torch.Generator().manual_seed(args.seed * 1000 + step)
    x, y = data.batch("train", args.batch * dp, g)
    lo, hi = dp_rank * args.batch, (dp_rank + 1) * args.batch
    return x, y, x[lo:hi].to(device), y[lo:hi].to(device)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, xs: torch.Tensor, ys: torch.Tensor) -> float:
    """One optimizer step; returns the global batch's loss (the mean over the ranks)."""
    loss = common.lm_loss(model(xs), ys)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    g_loss = loss.detach().clone()
    dist.all_reduce(g_loss, op=dist.ReduceOp.AVG)
    return g_loss.item()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parallel", choices=["ddp", "fsdp", "tp", "fsdp_tp"], default="ddp")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (tp: all ranks; fsdp_tp: default 2)")
    add_model_args(p)
    p.add_argument("--device", default="tpu", help="device type (tpu; cpu runs the same on gloo)")
    p.add_argument("--mode", choices=["strict", "defer"], default="strict", help="tpu execution mode")
    p.add_argument("--check", action="store_true", help="compare with single-process training (rank 0)")
    p.add_argument("--tol", type=float, default=2e-3, help="largest relative loss difference --check accepts")
    return p.parse_args(argv)


def tp_plan(model: Llama, mesh) -> None:
    """Megatron-style: q/k/v and gate/up column-wise, out and down row-wise;
    each rank keeps heads / tp of the attention heads."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    n = mesh.size()
    if model.heads % n or model.kv_heads % n:
        raise SystemExit(f"--heads and --kv-heads must be multiples of the tensor-parallel size {n}")
    for blk in model.blocks:
        parallelize_module(blk, mesh, {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
                                       "wo": RowwiseParallel(), "w1": ColwiseParallel(), "w3": ColwiseParallel(),
                                       "w2": RowwiseParallel()})
        blk.heads //= n
        blk.kv_heads //= n


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "tpu" and args.mode == "defer":
        import torch_tpu

        torch_tpu.set_execution_mode("defer")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cpu":
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.accelerator.set_device_index(local_rank)
        device = torch.device(args.device, local_rank)
        dist.init_process_group(device_id=device)  # tpu -> tpu_dist, the device's default backend
    rank, world = dist.get_rank(), dist.get_world_size()

    tp = {"ddp": 1, "fsdp": 1, "tp": world, "fsdp_tp": args.tp or 2}[args.parallel]
    if args.parallel == "tp" and args.tp not in (None, world):
        raise SystemExit("--parallel tp uses every rank for tensor parallelism")
    if world % tp:
        raise SystemExit(f"{world} ranks do not split into tensor-parallel groups of {tp}")
    dp = world // tp
    mesh = None
    if args.parallel != "ddp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = rank // tp

    data, base = build_model(args)
    ref = copy.deepcopy(base).to(device) if args.check and rank == 0 else None
    model = base.to(device)
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[local_rank] if device.type != "cpu" else None)
    else:
        if tp > 1:
            tp_plan(model, mesh["tp"])
        if args.parallel in ("fsdp", "fsdp_tp"):
            from torch.distributed.fsdp import fully_shard

            for blk in model.blocks:
                fully_shard(blk, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
    # With TP only the parallelized linears hold DTensors (embedding, norms and
    # head stay plain, replicated tensors): AdamW's foreach kernels cannot mix
    # the two, so it updates one tensor at a time.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, foreach=False if tp > 1 else None)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01) if ref is not None else None

    worst, t_train, tokens = 0.0, 0.0, 0
    for step in range(args.steps):
        x, y, xs, ys = step_batch(data, args, step, dp, dp_rank, device)
        t0 = time.perf_counter()
        g_loss = train_step(model, opt, xs, ys)
        if step:  # the first step compiles / warms caches
            t_train += time.perf_counter() - t0
            tokens += args.batch * dp * args.block
        line = f"step {step} loss {g_loss:.5f}"
        if ref is not None:
            r_loss = common.lm_loss(ref(x.to(device)), y.to(device))
            ref_opt.zero_grad(set_to_none=True)
            r_loss.backward()
            ref_opt.step()
            r_loss = r_loss.item()
            worst = max(worst, abs(g_loss - r_loss) / max(abs(r_loss), 1e-12))
            line += f" single-process {r_loss:.5f}"
        if rank == 0:
            print(line, flush=True)
    rate = tokens / t_train if t_train else float("nan")
    ok = worst <= args.tol
    if rank == 0:
        print(f"{args.parallel} on {world} ranks (dp {dp} x tp {tp}, {device.type}/{args.mode}): "
              f"{rate:,.0f} tokens/s" + (f"; largest relative difference to single-process {worst:.2e} "
                                          f"({'ok' if ok else 'FAILED'}, tol {args.tol:g})" if ref is not None else ""),
              flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
