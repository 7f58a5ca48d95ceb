"""python -m tests.fuzz [--seed S] [--n N] [--modes strict,defer] [--minimize] [--save]

Differential fuzzing of the tpu device against the CPU (see tests/fuzz/__init__.py).
Prints one line per failing program and a summary; exits 1 when any program
failed. ``--show SEED`` prints one program; ``--seed S --n 1 --minimize`` reproduces
and shrinks one failure; ``--save`` writes minimised failures to
tests/fuzz/regressions/ (replayed by pytest)."""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="first program's seed (programs seed .. seed+n-1)")
    ap.add_argument("--n", type=int, default=300, help="number of programs (default 300)")
    ap.add_argument("--modes", default="strict,defer",
                    help="tpu modes compared with the CPU: strict, defer, debug, compiled (default strict,defer)")
    ap.add_argument("--compiled-every", type=int, default=10, metavar="K",
                    help="compiled mode (torch.compile, backend='tpu') on every K-th program only (default 10)")
    ap.add_argument("--stmts", type=int, default=None, help="statements per program (default: random 3-24)")
    ap.add_argument("--minimize", action="store_true", help="shrink each failing program")
    ap.add_argument("--save", action="store_true", help="save minimised failures as regression tests")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds without an answer that count as a hang")
    ap.add_argument("--show", type=int, default=None, metavar="SEED", help="print the program of SEED and exit")
    ap.add_argument("--json", default=None, help="write every program's record to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    modes = tuple(m for m in a.modes.split(",") if m)
    for m in modes:
        if m not in ("strict", "defer", "debug", "compiled"):
            ap.error(f"unknown mode {m!r}: expected strict, defer, debug or compiled")
    if a.worker:
        from .campaign import worker
        worker(a.seed, a.n, modes, a.stmts, a.compiled_every)
        return 0
    from .campaign import campaign, minimize, program_modes, save_regression, show
    from .gen import generate
    if a.show is not None:
        print(show(generate(a.show, a.stmts)))
        return 0
    t0 = time.time()

    def log(rec):
        if rec["status"] != "ok":
            print(f"seed {rec['seed']}: {rec['status']}: {rec.get('msg')}", flush=True)

    results = campaign(a.seed, a.n, modes, a.stmts, a.timeout, log=log, compiled_every=a.compiled_every)
    for rec in results:
        if rec["status"] in ("crash", "hang"):
            log(rec)
    counts = collections.Counter(r["status"] for r in results)
    stmts = sum(r.get("stmts", 0) for r in results)
    dt = time.time() - t0
    print(f"{len(results)} programs ({stmts} statements) in {dt:.1f} s, modes {','.join(modes)}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed": a.seed, "n": a.n, "modes": modes, "seconds": dt, "results": results}, f)
    failed = [r for r in results if r["status"] != "ok"]
    if a.minimize or a.save:
        from .run import check
        for rec in failed:
            if rec["status"] != "mismatch" or rec["seed"] is None:
                continue
            prog = generate(rec["seed"], a.stmts)
            m = program_modes(modes, rec["seed"], a.compiled_every)
            small = minimize(prog, m)
            msg = check(small, m)
            print(f"\nseed {rec['seed']} minimised to {len(small['stmts'])} statements: {msg}")
            print(show(small))
            if a.save and msg:
                print("saved", save_regression(small, msg, modes=m if m != ("strict", "defer") else None))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
