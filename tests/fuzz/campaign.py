"""A fuzzing campaign: many programs, crash-safe, with minimisation.

The programs run in a worker process (``python -m tests.fuzz --worker``)
that reports each one as a JSON line; a worker that dies (a crash of the
device) or stops answering (a hang) is recorded against the program it was
running and a new worker carries on with the next seed. A failing program
is minimised (statements removed while the same kind of failure remains)
and can be saved under tests/fuzz/regressions/, which pytest replays.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REGRESSIONS = Path(__file__).resolve().parent / "regressions"


def program_modes(modes: tuple[str, ...], seed: int, compiled_every: int) -> tuple[str, ...]:
    """The modes program seed runs in: compiled mode (a few seconds of compilation a program) on
    every compiled_every-th seed only."""
    if "compiled" in modes and (compiled_every <= 0 or seed % compiled_every):
        return tuple(m for m in modes if m != "compiled")
    return modes


def worker(seed: int, n: int, modes: tuple[str, ...], stmts: int | None, compiled_every: int = 1) -> None:
    """Runs programs seed .. seed+n-1, one JSON line each on stdout."""
    import faulthandler
    import signal

    from .gen import generate
    from .run import check
    # a campaign that sees no answer asks for every thread's stack before it kills the worker
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    out = sys.stdout
    all_modes = modes
    for s in range(seed, seed + n):
        modes = program_modes(all_modes, s, compiled_every)
        out.write(json.dumps({"begin": s}) + "\n")
        out.flush()
        try:
            prog = generate(s, stmts)
        except Exception as exc:   # a generator bug, not a device one
            out.write(json.dumps({"seed": s, "status": "gen_error", "msg": f"{type(exc).__name__}: {exc}"}) + "\n")
            continue
        t0 = time.perf_counter()
        try:
            msg = check(prog, modes)
        except Exception as exc:
            msg = f"harness error {type(exc).__name__}: {exc}"
        out.write(json.dumps({"seed": s, "status": "ok" if msg is None else "mismatch", "msg": msg,
                              "stmts": len(prog["stmts"]), "s": round(time.perf_counter() - t0, 3),
                              "modes": list(modes)}) + "\n")
        out.flush()


def _spawn(seed: int, n: int, modes: tuple[str, ...], stmts: int | None, env: dict[str, str],
           compiled_every: int, stderr: Any) -> subprocess.Popen:
    """The worker's stderr goes to a file (``stderr``), never to a pipe nobody
    drains while it runs: a program that logs more than the pipe holds (Dynamo
    prints each graph break's traceback: seed 54700 writes 46 KB) would block the
    worker on its write, seen as a hang."""
    cmd = [sys.executable, "-m", "tests.fuzz", "--worker", "--seed", str(seed), "--n", str(n),
           "--modes", ",".join(modes), "--compiled-every", str(compiled_every)]
    if stmts is not None:
        cmd += ["--stmts", str(stmts)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env={**os.environ, **env})


def _tail(f: Any, n: int = 2000) -> str:
    """The last n bytes of a worker's stderr file."""
    f.flush()
    f.seek(max(0, f.seek(0, os.SEEK_END) - n))
    return f.read().decode(errors="replace")


def campaign(seed: int, n: int, modes: tuple[str, ...], stmts: int | None = None, timeout: float = 120.0,
             env: dict[str, str] | None = None, log=None, compiled_every: int = 1) -> list[dict[str, Any]]:
    """Runs n programs; returns one record per program (status ok / mismatch
    / crash / hang / gen_error)."""
    import selectors
    results: list[dict[str, Any]] = []
    nxt, end = seed, seed + n
    while nxt < end:
        errf = tempfile.TemporaryFile()
        proc = _spawn(nxt, end - nxt, modes, stmts, env or {}, compiled_every, errf)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        current = None
        while True:
            if not sel.select(timeout):
                proc.send_signal(signal.SIGUSR1)  # the worker's stacks, to its stderr
                time.sleep(2.0)
                proc.kill()
                proc.wait()
                results.append({"seed": current, "status": "hang",
                                "msg": f"no answer in {timeout:.0f} s; the worker's stderr ends: {_tail(errf)}"})
                nxt = (current if current is not None else nxt) + 1
                break
            line = proc.stdout.readline()
            if not line:
                rc = proc.wait()
                err = _tail(errf)
                if current is not None:
                    results.append({"seed": current, "status": "crash", "msg": f"worker exited {rc}: {err.strip()[-600:]}"})
                    nxt = current + 1
                else:
                    nxt = end if rc == 0 else nxt + 1
                    if rc:
                        results.append({"seed": None, "status": "crash", "msg": err[-600:]})
                break
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "begin" in rec:
                current = rec["begin"]
                continue
            results.append(rec)
            current = None
            if log is not None:
                log(rec)
            if rec["seed"] == end - 1:
                nxt = end
        sel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        errf.close()
    return results


def kind(msg: str | None) -> str | None:
    """The kind of a failure, kept while minimising: mode and category."""
    if msg is None:
        return None
    mode = msg.split("]")[0] + "]" if msg.startswith("[") else ""
    body = msg[len(mode):].strip()
    if body.startswith("errors differ"):
        return mode + " errors"
    parts = body.split(":")
    cat = parts[1].split()[0] if len(parts) > 1 and parts[1].split() else body
    return mode + " " + cat


def minimize(program: dict[str, Any], modes: tuple[str, ...], fails=None) -> dict[str, Any]:
    """Removes statements (halves, then quarters, ... then one by one)
    while the failure of the same kind remains."""
    from .run import check
    if fails is None:
        want = kind(check(program, modes))

        def fails(p):
            try:
                return kind(check(p, modes)) == want
            except Exception:
                return False
    stmts = list(program["stmts"])
    chunk = max(1, len(stmts) // 2)
    while chunk >= 1:
        i = 0
        changed = False
        while i < len(stmts):
            cand = stmts[:i] + stmts[i + chunk:]
            if cand and fails({**program, "stmts": cand}):
                stmts = cand
                changed = True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return {**program, "stmts": stmts}


def save_regression(program: dict[str, Any], msg: str, note: str = "", modes: tuple[str, ...] | None = None) -> Path:
    """Writes a regression; modes: the tpu modes it replays in (default run.MODES)."""
    REGRESSIONS.mkdir(exist_ok=True)
    path = REGRESSIONS / f"seed_{program['seed']}.json"
    case = {"found": msg, "note": note, "program": program}
    if modes:
        case["modes"] = list(modes)
    path.write_text(json.dumps(case, indent=1) + "\n")
    return path


def show(program: dict[str, Any]) -> str:
    """The program as readable pseudo-Python (one statement a line)."""
    lines = [f"# seed {program['seed']}, f32 matmul precision {program.get('precision', 'HIGHEST')}"]
    for i, st in enumerate(program["stmts"]):
        args = ", ".join(f"v{v}" for v in st["in"])
        params = ", ".join(f"{k}={v!r}" for k, v in st["p"].items())
        lhs = f"v{st['out']} = " if st.get("out") is not None else ""
        flags = "".join(f"  # {f}" for f in ("sync", "mut") if st.get(f) is not None)
        lines.append(f"{i:3d}: {lhs}{st['op']}({args}{', ' if args and params else ''}{params}){flags}")
    return "\n".join(lines)
