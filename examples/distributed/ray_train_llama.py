"""Ray Train on tpu: ray.train.torch.TorchTrainer with TorchConfig(backend="tpu_dist")
training the Llama example (examples/llama) with DDP on local workers, one
process and one tpu chip each. One command (needs `make venv-full`: ray[train]==2.60.0):

    .venv/bin/python examples/distributed/ray_train_llama.py --workers 2 --steps 8

Ray already knows TorchTPU's backend: TorchConfig(backend="tpu_dist") makes
every worker call torch_tpu._loader.load() and then
dist.init_process_group("tpu_dist", ...). What Ray cannot do here is hand out
the device: ray.train.torch.get_device() returns torch.device("tpu") only to a
worker holding a "TPU" resource, and ScalingConfig accepts TPU resources only
with use_tpu=True, which for more than one worker requires a TPU pod slice
(topology, accelerator_type, slice labels on the nodes). So each worker picks
its chip itself, as a script written for one accelerator would:
tpu:LOCAL_RANK when the process sees that many chips, else tpu:0 (every Ray
worker is its own process with its own chip), and passes it to
ray.train.torch.prepare_model(model, move_to_device=device), which moves the
model there and wraps it in DDP over tpu_dist. Ray logs one warning for it
("it is recommended that each worker has exactly 1 TPU"). Each worker checks
that its parameters are on tpu and its process group's backend is tpu_dist;
rank 0 prints the global batch's loss each step and writes the losses to
--out (JSON), read by tests/test_dist_clients.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train_loop(config: dict) -> None:
    """Ray Train's train_loop_per_worker: DDP training of the Llama example."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from examples.distributed.train_llama import build_model, step_batch, train_step

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    local = ctx.get_local_rank()
    device = torch.device("tpu", local if local < torch.tpu.device_count() else 0)
    torch.tpu.set_device(device)
    backend = dist.get_backend()

    args = argparse.Namespace(**config)
    data, model = build_model(args)
    model = ray.train.torch.prepare_model(model, move_to_device=device)  # .to(tpu) + DDP over tpu_dist
    on = next(model.parameters()).device
    if on.type != "tpu" or backend != "tpu_dist":
        raise RuntimeError(f"worker {rank}: parameters on {on}, backend {backend}; expected tpu and tpu_dist")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    print(f"worker {rank}/{world}: model on {on}, process group backend {backend}", flush=True)

    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        _, _, xs, ys = step_batch(data, args, step, world, rank, device)  # one global batch, each rank its slice
        losses.append(train_step(model, opt, xs, ys))
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.5f}", flush=True)
        ray.train.report({"step": step, "loss": losses[-1]})
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "losses": losses, "device": str(on), "backend": backend, "world": world,
            "seconds": time.perf_counter() - t0}))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="Ray Train workers (processes, one tpu chip each)")
    sys.path.insert(0, str(ROOT))
    from examples.distributed.train_llama import add_model_args

    add_model_args(p)  # --batch: sequences a step per worker
    p.add_argument("--out", type=Path, default=ROOT / "build" / "ray_train_llama.json", help="losses (JSON)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.unlink(missing_ok=True)
    cores = os.cpu_count() or 1
    # Each worker's thread pool takes its share of the host's cores (Ray sets
    # LOCAL_WORLD_SIZE only after torch_tpu has loaded in the worker).
    threads = str(max(1, cores // args.workers))
    ray.init(num_cpus=args.workers + 1, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "TPU_NUM_THREADS": threads,
                                       "OMP_NUM_THREADS": "1"}})
    try:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        trainer = TorchTrainer(
            train_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.workers, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend="tpu_dist"),
            run_config=RunConfig(name="ray_train_llama", storage_path=str(ROOT / "build" / "ray_results")),
        )
        result = trainer.fit()
    finally:
        ray.shutdown()
    if result.error:
        print(f"training failed: {result.error}", file=sys.stderr)
        return 1
    out = json.loads(args.out.read_text())
    print(f"Ray Train, {out['world']} workers on {out['device']} ({out['backend']}): losses "
          + " ".join(f"{x:.4f}" for x in out["losses"]) + f"; {out['seconds']:.1f} s of training")
    return 0


if __name__ == "__main__":
    sys.exit(main())
