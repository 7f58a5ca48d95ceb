"""Tour of the tpu device: tensors in device memory, copies both ways,
streams and events, device info and memory statistics.

Usage: python examples/demo.py [--size-mib N]
(The examples issue turns the main job into minGPT training.)
"""
from __future__ import annotations

import argparse
import time

import torch

import torch_tpu  # noqa: F401  (also autoloaded by `import torch`)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=64, help="size of the tensor copied for the bandwidth figure")
    args = parser.parse_args()

    props = torch.tpu.get_device_properties(0)
    print(f"torch {torch.__version__}, torch_tpu {torch_tpu.__version__}")
    print(f"accelerator: {torch.accelerator.current_accelerator()}, chips: {torch.tpu.device_count()}")
    print(f"tpu:0 = {props.name}: {props.total_memory / 2**30:.2f} GiB usable "
          f"(HBM {props.hbm_bytes / 2**30:.0f} GiB), peak {props.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, "
          f"{props.host_threads} host threads")

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = x.to("tpu")
    print(f"\nhost tensor moved to {d.device}: is_tpu={d.is_tpu}, dtype={d.dtype}")
    t = d.t().contiguous()  # strided copy on the device
    back = t.cpu()
    assert torch.equal(back, x.t()), "round trip through the device changed the values"
    print("transposed on the device and copied back:\n", back)
    h = d.to(torch.bfloat16).cpu()
    print("cast to bfloat16 on the device:", h.flatten()[:6].tolist())
    d.fill_(2.5)
    print("fill_ on the device, first element via .item():", d[0, 0].item())

    n = args.size_mib * 2**20 // 4
    host = torch.empty(n, dtype=torch.float32).pin_memory()
    host.fill_(1.0)
    dev = torch.empty(n, dtype=torch.float32, device="tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    side = torch.tpu.Stream()
    with torch.tpu.stream(side):
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
    t0 = time.perf_counter()
    end.synchronize()
    print(f"\nnon-blocking {args.size_mib} MiB host->device copy on a side stream: "
          f"{start.elapsed_time(end):.2f} ms on the device clock "
          f"({args.size_mib / 1024 / (start.elapsed_time(end) / 1e3):.1f} GiB/s); host waited "
          f"{(time.perf_counter() - t0) * 1e3:.2f} ms")

    stats = torch.tpu.memory_stats()
    print(f"\nmemory: allocated {torch.tpu.memory_allocated() / 2**20:.1f} MiB, "
          f"reserved {torch.tpu.memory_reserved() / 2**20:.1f} MiB, "
          f"peak {torch.tpu.max_memory_allocated() / 2**20:.1f} MiB, "
          f"{stats['allocation.all.current']} live allocations")
    del dev, t, d
    torch.tpu.empty_cache()
    free, total = torch.tpu.mem_get_info()
    print(f"after empty_cache: reserved {torch.tpu.memory_reserved() / 2**20:.1f} MiB, "
          f"free {free / 2**30:.2f} of {total / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
