"""Runs the conformance suite in worker subprocesses, crash- and hang-safe.

The op list is cut into chunks; each chunk runs in a fresh interpreter
(``python -m tests.conformance.worker``), up to ``jobs`` at a time. Workers
write a progress line before every sample. When a worker dies (signal or
non-zero exit) the item it was running is recorded as ``crash``; when one
sample runs longer than ``timeout`` seconds the worker is killed and the item
is recorded as ``timeout``. In both cases a new worker resumes the chunk with
the next item.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["Options", "run", "Results"]


@dataclass
class Options:
    ops: list[str]
    dtypes: list[str]
    bwd_dtypes: list[str] = field(default_factory=lambda: ["float32", "float64"])
    directions: list[str] = field(default_factory=lambda: ["fwd", "bwd"])
    jobs: int = 1
    chunk_size: int = 60
    timeout: float = 60.0          # seconds per sample
    startup_timeout: float = 600.0  # seconds from worker start to its first item
    cpu_fallback: bool = False
    max_samples: int | None = None
    device: str = "tpu"
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Results:
    items: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    process_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _signal_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Keep the fatal-error header and the innermost frames of faulthandler's dump.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if "Fatal Python error" in ln or "Error" in ln][-2:]
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")][:6]
    msg = " | ".join(keep + frames) or " | ".join(lines[-6:])
    return msg[-limit:]


class _Chunk:
    """One chunk of ops and the worker currently running it."""

    def __init__(self, index: int, ops: list[str], opts: Options, workdir: Path) -> None:
        self.index, self.ops, self.opts, self.workdir = index, list(ops), opts, workdir
        self.done: set[tuple[str, str, str]] = set()
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.finished = False
        self.progress = 0  # items recorded by all workers of this chunk
        self.no_probe: set[str] = set()   # ops whose probe (CPU fallback) crashed
        self.failures: dict[str, int] = {}  # op -> crashes/timeouts
        self.probing: dict | None = None
        self.last_op = self.ops[0] if self.ops else ""

    # -- process management
    def start(self) -> None:
        self.restarts += 1
        tag = f"c{self.index}_{self.restarts}"
        self.out = self.workdir / f"{tag}.jsonl"
        self.err = self.workdir / f"{tag}.stderr"
        spec = {
            "ops": self.ops, "dtypes": self.opts.dtypes, "bwd_dtypes": self.opts.bwd_dtypes,
            "directions": self.opts.directions, "done": sorted(self.done), "cpu_fallback": self.opts.cpu_fallback,
            "max_samples": self.opts.max_samples, "device": self.opts.device,
            "threads": max(1, (os.cpu_count() or 1) // max(1, self.opts.jobs)),
            "no_probe": sorted(self.no_probe), "skip_ops": sorted(op for op, n in self.failures.items() if n >= 2),
        }
        spec_path = self.workdir / f"{tag}.spec.json"
        spec_path.write_text(json.dumps(spec))
        self.out.write_text("")
        env = {**os.environ, **self.opts.env}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["TORCH_TPU_CPU_FALLBACK"] = "1" if self.opts.cpu_fallback else "0"
        self.errf = open(self.err, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.conformance.worker", str(spec_path), str(self.out)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.errf, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.started = time.time()
        self.pos = 0
        self.current: dict | None = None  # last "begin" record without a result
        self.current_since = self.started
        self.ended = False
        self.progress_at_start = self.progress

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    # -- progress
    def read(self, results: Results, on_result: Callable[[dict], None] | None) -> None:
        with open(self.out) as f:
            f.seek(self.pos)
            while True:
                line = f.readline()
                if not line or not line.endswith("\n"):
                    break
                self.pos = f.tell()
                rec = json.loads(line)
                ev = rec.pop("ev")
                if ev == "begin":
                    self.last_op = rec["op"]
                    self.current = rec
                    self.current_since = time.time()
                elif ev == "result":
                    item = (rec.pop("op"), rec.pop("dtype"), rec.pop("dir"))
                    self._record(results, item, rec, on_result)
                    self.current = None
                    self.probing = None
                elif ev == "probe":
                    self.probing = rec
                    self.current_since = time.time()
                elif ev == "probed":
                    self.probing = None
                    item = (rec.pop("op"), rec.pop("dtype"), rec.pop("dir"))
                    if item in results.items:
                        results.items[item]["missing_ops"] = rec.get("missing_ops", [])
                elif ev == "end":
                    self.ended = True

    def _record(self, results: Results, item: tuple[str, str, str], rec: dict,
                on_result: Callable[[dict], None] | None) -> None:
        self.done.add(item)
        self.last_op = item[0]
        self.progress += 1
        results.items[item] = rec
        if on_result:
            on_result({"op": item[0], "dtype": item[1], "dir": item[2], **rec})

    def poll(self, results: Results, on_result: Callable[[dict], None] | None) -> None:
        """Advances this chunk: reads progress, handles exit / timeout."""
        assert self.proc is not None
        rc = self.proc.poll()
        self.read(results, on_result)
        now = time.time()
        if rc is None:
            if self.probing is not None and now - self.current_since > self.opts.timeout:
                self.kill()
                self._probe_failed(results, "hung")
                self._restart_or_finish(results)
            elif self.current is not None and now - self.current_since > self.opts.timeout:
                self.kill()
                self.read(results, on_result)
                if self.current is not None:
                    self._fail(results, "timeout", f"sample {self.current['sample']} ran longer than "
                               f"{self.opts.timeout:g} s; the worker was killed", on_result)
                self._restart_or_finish(results)
            elif self.current is None and self.progress == self.progress_at_start and now - self.started > self.opts.startup_timeout:
                self.kill()
                results.process_errors.append(f"chunk {self.index}: worker did not start an item within "
                                              f"{self.opts.startup_timeout:g} s: {_tail(self.err)}")
                self.finished = True
            return
        self.errf.close()
        if self.ended:
            if rc != 0:
                results.process_errors.append(f"chunk {self.index}: worker {_signal_name(rc)} after its last "
                                              f"item (interpreter teardown): {_tail(self.err)}")
            self.finished = True
            return
        if self.probing is not None and self.current is None:
            self._probe_failed(results, f"died ({_signal_name(rc)}): {_tail(self.err)}")
            self._restart_or_finish(results)
            return
        if self.current is not None:
            self._fail(results, "crash", f"worker died ({_signal_name(rc)}) in sample "
                       f"{self.current['sample']}: {_tail(self.err)}", on_result)
            self._restart_or_finish(results)
            return
        # Died outside of any item: at start-up (import error...) or between items.
        results.process_errors.append(f"chunk {self.index}: worker {_signal_name(rc)} outside of any item: "
                                      f"{_tail(self.err)}")
        if self.progress > self.progress_at_start:
            self._restart_or_finish(results)
        else:
            self.finished = True  # no progress: don't loop

    def _probe_failed(self, results: Results, what: str) -> None:
        p = self.probing
        assert p is not None
        self.no_probe.add(p["op"])
        results.process_errors.append(f"{p['op']} {p['dtype']} {p['dir']}: re-running the not-implemented sample "
                                      f"with the CPU fallback on (to list its missing operators) {what}")
        self.probing = None

    def _fail(self, results: Results, status: str, message: str, on_result) -> None:
        cur = self.current
        assert cur is not None
        item = (cur["op"], cur["dtype"], cur["dir"])
        self.failures[item[0]] = self.failures.get(item[0], 0) + 1
        self._record(results, item, {"status": status, "message": message[:1500], "aten": None,
                                     "samples": max(0, cur["sample"]), "skipped_samples": 0,
                                     "seconds": round(time.time() - self.current_since, 3)}, on_result)
        self.current = None

    def _restart_or_finish(self, results: Results) -> None:
        """Starts a new worker at the op that was running (the worker goes in
        order, so earlier ops are complete; its finished items are skipped)."""
        if self.last_op in self.ops:
            self.ops = self.ops[self.ops.index(self.last_op):]
        self.done = {item for item in self.done if item[0] == self.last_op}
        self.start()


def run(opts: Options, on_result: Callable[[dict], None] | None = None, workdir: str | None = None) -> Results:
    """Runs every op of ``opts.ops``; returns the results of every item."""
    results = Results()
    start = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="tpu-conformance-") if workdir is None else None
    wd = Path(workdir or tmp.name)  # type: ignore[union-attr]
    wd.mkdir(parents=True, exist_ok=True)
    size = max(1, opts.chunk_size)
    chunks = [_Chunk(i, opts.ops[j:j + size], opts, wd) for i, j in enumerate(range(0, len(opts.ops), size))]
    pending = list(chunks)
    running: list[_Chunk] = []
    try:
        while pending or running:
            while pending and len(running) < max(1, opts.jobs):
                chunk = pending.pop(0)
                chunk.start()
                running.append(chunk)
            time.sleep(0.05)
            for chunk in list(running):
                chunk.poll(results, on_result)
                if chunk.finished:
                    running.remove(chunk)
    finally:
        for chunk in running:
            chunk.kill()
        if tmp is not None:
            tmp.cleanup()
    results.seconds = round(time.time() - start, 1)
    return results
