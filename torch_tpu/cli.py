"""``torch-tpu``: command-line tools of torch_tpu.

    torch-tpu doctor     versions, devices, memory and a device self-test;
                         exits non-zero with a clear message if anything fails
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import traceback
from collections.abc import Callable


def _check(name: str, fn: Callable[[], str], failures: list[str]) -> None:
    try:
        detail = fn()
        print(f"  [ok]   {name}: {detail}")
    except Exception as exc:  # report every failure, keep checking the rest
        failures.append(f"{name}: {type(exc).__name__}: {exc}")
        print(f"  [FAIL] {name}: {type(exc).__name__}: {exc}")
        if os.environ.get("TORCH_TPU_DEBUG"):
            traceback.print_exc()


def doctor() -> int:
    failures: list[str] = []
    print("torch_tpu doctor")
    print(f"  python {platform.python_version()} on {platform.machine()} {platform.system()}")
    try:
        import torch

        import torch_tpu
        from torch_tpu import _C
    except Exception as exc:
        print(f"  [FAIL] import torch_tpu: {type(exc).__name__}: {exc}")
        print("\ntorch_tpu is not usable: the package or its native library failed to load.")
        return 1
    print(f"  torch {torch.__version__}, torch_tpu {torch_tpu.__version__}, "
          f"runtime {_C._runtime_version()} (API {_C._api_version})")
    env = {k: os.environ[k] for k in ("TPU_NUM_DEVICES", "TORCH_TPU_EMULATE", "TORCH_TPU_HBM_LIMIT",
                                      "TPU_LAUNCH_BLOCKING", "TPU_NUM_THREADS", "TORCH_TPU_CPU_FALLBACK",
                                      "TORCH_TPU_ISA", "TORCH_TPU_AMX")
           if k in os.environ}
    print(f"  environment: {env or '(defaults)'}")

    def devices() -> str:
        n = torch.tpu.device_count()
        if n < 1:
            raise RuntimeError("no TPU chip is available")
        return f"{n} chip(s), accelerator={torch.accelerator.current_accelerator()}"

    def host() -> str:
        c = _C._cpu_info()
        feats = ", ".join(k for k, v in c["features"].items() if v and k != "amx_usable") or "none"
        note = f" ({c['amx_note']})" if c["amx_note"] else ""
        return (f"{c['model']} ({c['vendor']}); features {feats}; kernel level {c['isa']} of {c['host_isa']}{note}; "
                f"bf16 matmul on {c['bf16_matmul']}; f32 GEMM {c['gemm_library']}")

    _check("host", host, failures)
    _check("devices", devices, failures)
    if failures:
        print("\nNo usable TPU device: " + "; ".join(failures))
        return 1
    for i in range(torch.tpu.device_count()):
        p = torch.tpu.get_device_properties(i)
        print(f"  tpu:{i}: {p.name}, {p.total_memory / 2**30:.2f} GiB usable of {p.hbm_bytes / 2**30:.0f} GiB HBM, "
              f"{p.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, {p.hbm_bandwidth / 1e9:.0f} GB/s, "
              f"{p.host_threads} host threads")

    def allocate() -> str:
        before = torch.tpu.memory_allocated()
        t = torch.empty(1 << 20, dtype=torch.float32, device="tpu")
        grown = torch.tpu.memory_allocated() - before
        if grown < t.numel() * 4:
            raise RuntimeError(f"allocator accounted {grown} bytes for a 4 MiB tensor")
        return f"4 MiB on {t.device}, allocator accounted {grown} bytes"

    def roundtrip() -> str:
        x = torch.randn(257, 129, dtype=torch.float32)
        y = x.to("tpu").t().contiguous().cpu()
        if not torch.equal(y, x.t()):
            raise RuntimeError("values changed in a host->device->host round trip")
        z = x.to("tpu", torch.bfloat16).cpu()
        if not torch.equal(z, x.to(torch.bfloat16)):
            raise RuntimeError("device bfloat16 cast differs from PyTorch's")
        return "float32 transpose and bfloat16 cast match the host"

    def one_op() -> str:
        t = torch.empty(1000, dtype=torch.int64, device="tpu").fill_(7)
        torch.tpu.synchronize()
        v = t[999].item()
        if v != 7:
            raise RuntimeError(f"fill_(7) read back {v}")
        return "fill_ + synchronize + item()"

    def memory() -> str:
        free, total = torch.tpu.mem_get_info()
        return (f"allocated {torch.tpu.memory_allocated() / 2**20:.1f} MiB, reserved "
                f"{torch.tpu.memory_reserved() / 2**20:.1f} MiB, free {free / 2**30:.2f} of {total / 2**30:.2f} GiB")

    _check("allocate", allocate, failures)
    _check("copy both ways", roundtrip, failures)
    _check("one op", one_op, failures)
    _check("memory", memory, failures)
    ok, info = _C._codegen_info()
    if ok:
        print(f"  [ok]   generated kernels: {info}")
    else:
        print(f"  [info] generated kernels: {info}")
    if failures:
        print(f"\n{len(failures)} check(s) failed:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("\nall checks passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-tpu", description="torch_tpu command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check versions, devices, memory and run a device self-test")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
