"""``torch-tpu``: command-line tools of torch_tpu.

    torch-tpu doctor     versions, devices, memory and a device self-test, the
                         kernel compiler and the kernel cache; exits non-zero
                         with a clear message if anything fails
    torch-tpu trace SCRIPT [args]   runs SCRIPT under torch_tpu.profiler: writes
                         a Chrome / Perfetto trace, prints the kernel summary
                         and the roofline estimate (and a PNG with --png)
    torch-tpu check SCRIPT [args]   runs SCRIPT under a recorder and reports what
                         a port must fix; exits 1 when there are blockers
    torch-tpu port PATH [--fix] [--diff]   CUDA-specific code and its rewrite
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
                f"engine library built for {c['build']}; "
                f"bf16 matmul on {c['bf16_matmul']}; bf16 convolutions on {c['bf16_conv']}; "
                f"f32 GEMM {c['gemm_library']}")

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

    def kernel_cache() -> str:
        where, usable, why = _C._kcache_dir()
        if not usable:
            raise RuntimeError(f"kernel cache directory {where or '(none)'} refused: {why}")
        st = torch.tpu._get_cache_stats()
        return (f"{where}: {len(st['per_entry_stats'])} entries read this process, {st['num_cache_hits']} hits of "
                f"{st['num_cache_reqs']} requests{', read-only' if st['readonly'] else ''}")

    def compiler() -> str:
        import torch_tpu.compiler  # noqa: F401  (registers the backend)
        if "tpu" not in torch._dynamo.list_backends(exclude_tags=()):
            raise RuntimeError("torch.compile backend 'tpu' is not registered")
        f = torch.compile(lambda a: (a * 2 + 1).relu(), backend="tpu", fullgraph=True)
        x = torch.randn(64, device="tpu")
        if not torch.equal(f(x).cpu(), (x.cpu() * 2 + 1).relu()):
            raise RuntimeError("a compiled elementwise graph differs from eager CPU")
        return "torch.compile(backend=\"tpu\") runs a graph and matches CPU"

    def profiler() -> str:
        from torch_tpu import profiler as tp
        with tp.profile(with_stack=False) as prof:
            (torch.ones(256, device="tpu") + 1).sum().item()
        if not prof.kernels:
            raise RuntimeError("the profiler recorded no kernel")
        return f"{len(prof.kernels)} kernels traced"

    if ok:
        _check("kernel cache", kernel_cache, failures)
    _check("compiler", compiler, failures)
    _check("profiler", profiler, failures)
    if failures:
        print(f"\n{len(failures)} check(s) failed:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("\nall checks passed")
    return 0


def _run_script(script: str, args: list[str]) -> BaseException | None:
    """Runs script as __main__ with args; returns the exception it ended with (None: success)."""
    import runpy
    old_argv, old_path = sys.argv[:], sys.path[:]
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            return exc
    except BaseException as exc:  # reported by the caller
        return exc
    finally:
        sys.argv, sys.path = old_argv, old_path
    return None


def trace(script: str, args: list[str], out: str, png: str | None, top: int) -> int:
    from torch_tpu import profiler as tp
    with tp.profile() as prof:
        err = _run_script(script, args)
    prof.export_chrome_trace(out)
    print(prof.summary(top=top))
    print()
    print(prof.roofline().table(top))
    print(f"\ntrace written to {out} (open in https://ui.perfetto.dev or chrome://tracing)")
    if png:
        prof.save_roofline_png(png)
        print(f"roofline plot written to {png}")
    if err is not None:
        print(f"\n{script} failed: {type(err).__name__}: {err}")
        return 1
    return 0



def check(script: str, args: list[str]) -> int:
    """Runs script with the CPU fallback on (every missing op is counted, the
    script goes on) under the profiler and reports what a port must change."""
    import torch

    from torch_tpu import _C
    from torch_tpu import profiler as tp
    fallback_was = _C._cpu_fallback_enabled()
    _C._set_cpu_fallback(True)
    torch.tpu.reset_fallback_stats()
    torch.tpu.reset_peak_memory_stats()
    try:
        with tp.profile() as prof:
            err = _run_script(script, args)
    finally:
        _C._set_cpu_fallback(fallback_was)
    blockers: list[str] = []
    warnings: list[str] = []
    print(f"torch-tpu check {script}")
    fb = torch.tpu.fallback_stats()
    if fb:
        for op, n in sorted(fb.items(), key=lambda kv: -kv[1]):
            blockers.append(f"operator '{op}' is not implemented for TPU (ran on the CPU fallback {n} time(s))")
    if err is not None:
        blockers.append(f"the script failed: {type(err).__name__}: {err}")
    # host syncs: device->host reads, by the user line that made them
    syncs: dict[str, list[str]] = {}
    for c in prof.copies:
        if c["direction"] != "d2h":
            continue
        op = prof.ops.get(c["corr"])
        site = op.site if op else None
        syncs.setdefault(site or "(unknown line)", []).append(op.name if op else c["name"])
    for cut in prof.cuts:
        if cut["reason"] in ("item", "to_host", "print") and cut["site"]:
            syncs.setdefault(cut["site"], []).append(f"DeferAndFuse cut ({cut['reason']})")
    for site, ops in sorted(syncs.items(), key=lambda kv: -len(kv[1])):
        if len(ops) > 1:
            kinds = ", ".join(sorted(set(ops)))
            warnings.append(f"host sync inside a loop at {site}: {len(ops)} device->host reads ({kinds}); "
                            "each one waits for the device")
    reasons: dict[str, int] = {}
    for cut in prof.cuts:
        reasons[cut["reason"]] = reasons.get(cut["reason"], 0) + 1
    if reasons:
        print("  DeferAndFuse cuts: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])))
    cs = torch.tpu.compile_stats()
    for fn, why in cs.get("recompiles", {}).items():
        warnings.append(f"torch.compile recompiled {fn} {len(why)} time(s): " + "; ".join(why[:3]))
    if cs.get("unsupported_graphs"):
        blockers.append(f"{cs['unsupported_graphs']} compiled graph(s) hold an operator without a tpu kernel")
    peak = torch.tpu.max_memory_allocated()
    fits = {g: peak <= c.hbm_bytes for g, c in tp.CHIPS.items()}
    print(f"  peak device memory: {peak / 2**20:.1f} MiB; fits the HBM of "
          + ", ".join(f"{g} ({tp.CHIPS[g].hbm_bytes >> 30} GiB): {'yes' if ok else 'NO'}" for g, ok in fits.items()))
    if not any(fits.values()):
        blockers.append("peak device memory exceeds the HBM of every TPU generation")
    print(f"  {len(prof.kernels)} kernels, {prof.device_time_s * 1e3:.1f} ms device time, {len(prof.ops)} host ops")
    for w in warnings:
        print(f"  [warn]    {w}")
    for b in blockers:
        print(f"  [BLOCKER] {b}")
    print(f"{len(blockers)} blocker(s), {len(warnings)} warning(s)")
    return 1 if blockers else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-tpu", description="torch_tpu command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check versions, devices, memory, compiler, kernel cache; run a device self-test")
    p = sub.add_parser("trace", help="run a script under the profiler, write the trace, print the summary")
    p.add_argument("--out", default="torch_tpu_trace.json", help="trace file (.json or .json.gz)")
    p.add_argument("--png", default=None, help="also write a roofline plot here")
    p.add_argument("--top", type=int, default=20, help="rows of the summary")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p = sub.add_parser("check", help="run a script under a recorder and report port blockers")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p = sub.add_parser("port", help="find CUDA-specific code; --fix rewrites it for tpu")
    p.add_argument("path")
    p.add_argument("--fix", action="store_true", help="rewrite the files in place")
    p.add_argument("--diff", action="store_true", help="print a unified diff of the rewrite")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    if args.command == "trace":
        return trace(args.script, args.args, args.out, args.png, args.top)
    if args.command == "check":
        return check(args.script, args.args)
    if args.command == "port":
        from torch_tpu.port import port
        port(args.path, fix=args.fix, diff=args.diff)
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
