"""The architecture sweep: python -m tests.hf [--sample] [--archs a,b] [--out FILE]

Every architecture of tests/hf/archs.py runs forward + backward on CPU and on
tpu (strict, DeferAndFuse and compiled) and is compared (tests/hf/sweep.py); the table
of outcomes is written as Markdown (default tests/hf/SWEEP.md) with the date.
Architectures run in a worker process; a worker that dies takes only the
architecture it was running with it (reported as an error) and the sweep goes
on in a new one."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _worker(names: list[str]) -> int:
    import torch

    from tests.hf import archs as A
    from tests.hf import sweep

    torch.set_num_threads(1)  # the CPU reference: spinning OpenMP threads slow a shared host
    for arch in A.by_name(names):
        print("START " + arch.name, flush=True)
        for r in sweep.run_arch(arch):
            print("RESULT " + json.dumps(sweep.as_dict(r)), flush=True)
    return 0


def run(names: list[str], quiet: bool = False) -> list[dict]:
    from tests.hf import archs as A
    from tests.hf.sweep import MODES

    groups = {a.name: a.group for a in A.ARCHS}
    results: list[dict] = []
    todo = list(names)
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    while todo:
        proc = subprocess.Popen([sys.executable, "-m", "tests.hf", "--worker", ",".join(todo)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        current = None
        for line in proc.stdout:
            if line.startswith("START "):
                current = line.split()[1]
            elif line.startswith("RESULT "):
                r = json.loads(line[7:])
                results.append(r)
                if not quiet:
                    print(f"{r['arch']:22s} {r['mode']:7s} {r['status']:10s} {r['detail'][:90]}", flush=True)
                if r["mode"] == MODES[-1] and r["arch"] in todo:
                    todo.remove(r["arch"])
        err = proc.stderr.read()
        rc = proc.wait()
        if current is not None and current in todo:  # the worker died inside this architecture
            last = err.strip().splitlines()[-1] if err.strip() else f"worker exited with {rc}"
            for mode in MODES:
                if not any(r["arch"] == current and r["mode"] == mode for r in results):
                    results.append({"arch": current, "group": groups[current], "mode": mode, "status": "error",
                                    "detail": f"worker died: {last[:160]}", "worst": 0.0, "params": 0,
                                    "seconds": 0.0})
            todo.remove(current)
        elif rc != 0 and todo:
            raise SystemExit(f"sweep worker failed before {todo[0]}:\n{err}")
    return results


def markdown(results: list[dict], command: str) -> str:
    import torch
    import transformers

    from tests.hf.sweep import MODES

    by = {}
    for r in results:
        by.setdefault((r["group"], r["arch"]), {})[r["mode"]] = r
    counts = Counter(r["status"] for r in results)
    archs_passing = sum(1 for modes in by.values() if all(m["status"] == "pass" for m in modes.values()))
    lines = [
        "# Architecture sweep",
        "",
        f"Date: {datetime.date.today().isoformat()} · transformers {transformers.__version__} · "
        f"torch {torch.__version__} · command: `{command}`",
        "",
        "Each architecture is built from Transformers' own config class at tiny sizes (tests/hf/archs.py), "
        "runs one training-mode forward + backward in float32 on CPU and on tpu (strict, DeferAndFuse, and "
        "compiled: the forward under `torch.compile(backend=\"tpu\")`), and the loss, the first output "
        "and every parameter's gradient are compared (relative to each tensor's largest magnitude, tolerance "
        "2e-3). Outcomes: pass, mismatch (the worst tensor named), missing op (an operator without a TPU "
        "kernel), error (the message).",
        "",
        f"**{archs_passing} of {len(by)} architectures pass in every mode** ({', '.join(MODES)}); "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + " (architecture x mode).",
        "",
        "| group | architecture | params | " + " | ".join(MODES) + " | worst rel. error | detail |",
        "|---|---|---:|" + "---|" * len(MODES) + "---:|---|",
    ]
    order = ["decoder", "encoder", "encoder-decoder", "vision", "multimodal"]
    for (group, arch), modes in sorted(by.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        rs = [modes.get(m, {}) for m in MODES]
        worst = max(r.get("worst", 0.0) for r in rs)
        detail = "; ".join(sorted({r["detail"] for r in rs if r.get("detail")}))
        params = next((r["params"] for r in rs if r.get("params")), 0)
        lines.append(f"| {group} | {arch} | {params:,} | " + " | ".join(r.get("status", "-") for r in rs)
                     + f" | {worst:.1e} | {detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.hf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sample", action="store_true", help="only the CI sample (tests/hf/archs.py SAMPLE)")
    p.add_argument("--archs", help="comma-separated model types (default: all)")
    p.add_argument("--out", default=str(HERE / "SWEEP.md"), help="Markdown table to write ('-': stdout only)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.worker.split(","))
    from tests.hf import archs as A

    names = a.archs.split(",") if a.archs else (A.SAMPLE if a.sample else [x.name for x in A.ARCHS])
    A.by_name(names)
    results = run(names, a.quiet)
    cmd = "python -m tests.hf" + (" --sample" if a.sample else "") + (f" --archs {a.archs}" if a.archs else "")
    md = markdown(results, cmd)
    if a.out == "-":
        print(md)
    else:
        Path(a.out).write_text(md)
        print(f"wrote {a.out}")
    bad = [r for r in results if r["status"] != "pass"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
