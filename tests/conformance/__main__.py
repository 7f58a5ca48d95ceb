"""CLI of the OpInfo conformance harness: ``python -m tests.conformance --help``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from .opdb import BACKWARD_DTYPES, DTYPES

    p = argparse.ArgumentParser(
        prog="python -m tests.conformance",
        description="Runs PyTorch's OpInfo samples on the CPU and on the tpu device (CPU fallback off) and "
                    "compares results and gradients. Writes a machine-readable JSON report and a Markdown "
                    "summary. Exit status 1 if any op crashed or hung (always a bug), else 0.",
        epilog="Statuses: pass, mismatch, not_implemented (missing aten operator named), error, crash, timeout, "
               "skipped. Examples: --ops add,mul --dtypes float32 ; --ops 'nn.functional.*' --directions fwd ; "
               "--cpu-fallback (dry run validating the harness: everything should pass).")
    p.add_argument("--ops", type=_csv, default=None,
                   help="comma-separated op keys (name or name.variant) or globs; default: the whole database")
    p.add_argument("--exclude", type=_csv, default=None, help="comma-separated op keys or globs to leave out")
    p.add_argument("--dtypes", type=_csv, default=list(DTYPES),
                   help=f"comma-separated dtypes (default: {','.join(DTYPES)})")
    p.add_argument("--bwd-dtypes", type=_csv, default=list(BACKWARD_DTYPES),
                   help=f"dtypes whose gradients are compared (default: {','.join(BACKWARD_DTYPES)})")
    p.add_argument("--directions", type=_csv, default=["fwd", "bwd"], help="fwd,bwd (default: both)")
    p.add_argument("--report", default=str(HERE / "report.json"),
                   help="JSON report path (default: tests/conformance/report.json)")
    p.add_argument("--markdown", default=None,
                   help="Markdown summary path (default: REPORT.md next to the JSON report; '-' for none)")
    p.add_argument("--jobs", "-j", type=int, default=1, help="worker processes run at once (default 1)")
    p.add_argument("--chunk-size", type=int, default=60, help="ops per worker process (default 60)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds one sample may take before it is recorded as a timeout (default 60)")
    p.add_argument("--max-samples", type=int, default=None,
                   help="compare at most N samples per op/dtype/direction (default: all)")
    p.add_argument("--cpu-fallback", action="store_true",
                   help="dry run with the CPU fallback ON: validates the comparison machinery (correct results "
                        "must pass) and records every operator that fell back, per op")
    p.add_argument("--list", action="store_true", help="print the selected op keys and exit")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-item progress lines")
    args = p.parse_args(argv)
    for d in args.directions:
        if d not in ("fwd", "bwd"):
            p.error(f"unknown direction {d!r}")
    from .opdb import parse_dtype
    for d in args.dtypes + args.bwd_dtypes:
        try:
            parse_dtype(d)
        except ValueError as exc:
            p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from . import driver, opdb, report

    needs_db = not args.ops or any(any(ch in x for ch in "*?[") for x in args.ops) or args.exclude
    keys = opdb.select(args.ops, args.exclude, opdb.all_keys() if needs_db else list(args.ops))
    if args.list:
        print("\n".join(keys))
        return 0
    if not keys:
        print("no op selected", file=sys.stderr)
        return 2
    opts = driver.Options(ops=keys, dtypes=args.dtypes, bwd_dtypes=args.bwd_dtypes, directions=args.directions,
                          jobs=args.jobs, chunk_size=args.chunk_size, timeout=args.timeout,
                          cpu_fallback=args.cpu_fallback, max_samples=args.max_samples)
    t0 = time.time()
    counter = {"n": 0}

    def progress(rec: dict) -> None:
        counter["n"] += 1
        if args.quiet:
            return
        msg = rec.get("message") or ""
        if rec["status"] == "not_implemented" and rec.get("aten"):
            msg = rec["aten"]
        print(f"[{time.time() - t0:7.1f}s] {rec['op']:<40} {rec['dtype']:<9} {rec['dir']} {rec['status']:<15} "
              f"{msg[:100]}", flush=True)

    print(f"conformance: {len(keys)} ops, dtypes {','.join(args.dtypes)}, directions {','.join(args.directions)}, "
          f"cpu fallback {'ON' if args.cpu_fallback else 'off'}", flush=True)
    results = driver.run(opts, on_result=progress)
    meta = {"torch": torch.__version__, "cpu_fallback": args.cpu_fallback, "dtypes": args.dtypes,
            "bwd_dtypes": args.bwd_dtypes, "directions": args.directions, "max_samples": args.max_samples,
            "timeout": args.timeout, "ops": keys}
    rep = report.build(results, meta)
    report.write_json(rep, args.report)
    md = args.markdown or str(Path(args.report).parent / "REPORT.md")
    if md != "-":
        report.write_markdown(rep, md)
    print("\n".join(report.summary_lines(rep)))
    print(f"report: {args.report}" + (f", {md}" if md != "-" else ""))
    s = rep["summary"]
    return 1 if s["crashes"] or s["timeouts"] else 0


if __name__ == "__main__":
    sys.exit(main())
