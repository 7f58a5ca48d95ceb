"""Profiler overhead: the cost per op of torch_tpu.profiler, off and on.

Three configurations of the same loop of small strict-mode ops (an add on
1024 floats, launched back to back, one synchronize per sample), alternated
in every repeat:

* off: no tracing — the runtime's hooks are one relaxed load and a branch
  that is never taken;
* ring: the runtime's trace ring on (kernel, launch and memory events are
  written), no host op recorder — the device side of the profiler alone;
* profile: torch_tpu.profiler.profile() — the ring plus the host op
  recorder (a RecordFunction callback of the glue recording each op with its
  arguments' shapes, parent op and user line; FLOPs and bytes worked out
  when the profile ends, which the sample includes);
* torch.profiler: torch.profiler.profile(activities=[CPU, PrivateUse1]) —
  PyTorch's own op recorder with the ring behind its PrivateUse1 activity
  (torch_tpu/csrc/kineto_profiler.cpp).

Reported: microseconds per op and the overhead over off.
"""
from __future__ import annotations

import torch

from bench import common
from torch_tpu import _C
from torch_tpu import profiler as tp

OPS_PER_SAMPLE = 400


def overhead(repeats: int) -> tuple[dict, str]:
    x = torch.zeros(1024, device="tpu")
    torch.tpu.synchronize()

    def loop() -> None:
        for _ in range(OPS_PER_SAMPLE):
            x.add_(1.0)
        torch.tpu.synchronize()

    def off() -> None:
        loop()

    def ring() -> None:
        _C._trace_start(1 << 16)
        try:
            loop()
        finally:
            _C._trace_stop()

    def prof() -> None:
        with tp.profile(capacity=1 << 16):
            loop()

    def torch_prof() -> None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
            loop()

    configs = {"off": off, "ring": ring, "profile": prof, "torch.profiler": torch_prof}
    t = common.interleaved(configs, repeats, gap_s=0)
    us = {k: v / OPS_PER_SAMPLE * 1e6 for k, v in t.items()}
    rows = [[k, f"{us[k]:.2f}", f"{us[k] - us['off']:+.2f}", f"{us[k] / us['off']:.2f}x"] for k in configs]
    body = (f"Strict-mode `x.add_(1.0)` on 1024 floats, {OPS_PER_SAMPLE} ops per sample, median of {repeats}.\n\n"
            + common.markdown_table(["profiler", "us / op", "overhead us / op", "vs off"], rows))
    return {"us_per_op": us, "repeats": repeats}, body


if __name__ == "__main__":
    payload, body = overhead(15)
    print(body)
