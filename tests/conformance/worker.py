"""Worker process: runs a list of ops and streams its progress and results.

    python -m tests.conformance.worker SPEC.json OUT.jsonl

SPEC: {"ops": [...keys], "dtypes": [...], "bwd_dtypes": [...], "directions": ["fwd", "bwd"],
       "done": [[op, dtype, direction], ...], "cpu_fallback": bool, "max_samples": int|null,
       "device": "tpu"}

OUT receives one JSON object per line, flushed as written (so that the driver
sees them even if this process is killed or crashes):
  {"ev": "begin", "op", "dtype", "dir", "sample", "t"}   before every sample
  {"ev": "result", "op", "dtype", "dir", "status", ...}  after every item
  {"ev": "end"}                                           when the list is done
"""
from __future__ import annotations

import faulthandler
import json
import sys
import time
import warnings


def main(argv: list[str]) -> int:
    spec_path, out_path = argv[0], argv[1]
    with open(spec_path) as f:
        spec = json.load(f)
    out = open(out_path, "a", buffering=1)

    def emit(record: dict) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    import torch

    import torch_tpu  # noqa: F401 - registers the device even without autoload

    from . import opdb
    from .runner import run_item

    # After the imports: the Python stacks of a crash go to stderr (the driver
    # puts the innermost frames in the crash message).
    faulthandler.enable(file=sys.stderr, all_threads=True)

    warnings.simplefilter("ignore")
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    device = spec.get("device", "tpu")
    fallback = bool(spec.get("cpu_fallback"))
    torch_tpu._C._set_cpu_fallback(fallback)

    synthetic = opdb.synthetic_ops()
    needs_db = any(key not in synthetic for key in spec["ops"])
    ops = dict(opdb.load_ops()) if needs_db else {}
    ops.update(synthetic)

    def probe(thunk) -> list[str]:
        """Every operator missing for a sample: re-run with the fallback on."""
        torch.tpu.reset_fallback_stats()
        try:
            with torch_tpu.cpu_fallback_mode(True):
                thunk()
        except Exception:  # noqa: BLE001 - only the list of operators matters
            pass
        finally:
            torch_tpu._C._set_cpu_fallback(fallback)
        names = sorted(torch.tpu.fallback_stats())
        torch.tpu.reset_fallback_stats()
        return names

    done = {tuple(x) for x in spec.get("done", [])}
    no_probe = set(spec.get("no_probe", []))
    skip_ops = set(spec.get("skip_ops", []))
    dtypes = spec["dtypes"]
    bwd_dtypes = set(spec.get("bwd_dtypes", opdb.BACKWARD_DTYPES))
    directions = spec.get("directions", ["fwd", "bwd"])
    max_samples = spec.get("max_samples")

    for key in spec["ops"]:
        op = ops.get(key)
        for dtype_name in dtypes:
            for direction in directions:
                if direction == "bwd" and dtype_name not in bwd_dtypes:
                    continue
                item = (key, dtype_name, direction)
                if item in done:
                    continue
                base = {"op": key, "dtype": dtype_name, "dir": direction}
                if key in skip_ops:
                    emit({"ev": "result", **base, "status": "skipped", "message": "not run: the op crashed or hung "
                          "the worker in two earlier items", "aten": None, "samples": 0, "skipped_samples": 0,
                          "seconds": 0.0})
                    continue
                if op is None:
                    emit({"ev": "result", **base, "status": "skipped", "message": "unknown op (not in the OpInfo "
                          "database)", "aten": None, "samples": 0, "skipped_samples": 0, "seconds": 0.0})
                    continue
                emit({"ev": "begin", **base, "sample": -1, "t": time.time()})
                if fallback:
                    torch.tpu.reset_fallback_stats()
                dtype = opdb.parse_dtype(dtype_name)
                try:
                    result = run_item(
                        op, dtype, direction, device, max_samples=max_samples, values=not opdb.is_random(op),
                        override=opdb.tolerance_override(op, dtype),
                        on_sample=lambda i, base=base: emit({"ev": "begin", **base, "sample": i, "t": time.time()}))
                except Exception as exc:  # noqa: BLE001 - a harness bug must not stop the run
                    result = {"status": "error", "message": f"harness: {type(exc).__name__}: {exc}"[:600],
                              "aten": None, "samples": 0, "skipped_samples": 0, "seconds": 0.0}
                if fallback:
                    result["fallback_ops"] = sorted(torch.tpu.fallback_stats())
                if opdb.is_random(op):
                    result["values_compared"] = False
                retry = result.pop("retry", None)
                emit({"ev": "result", **base, **result})
                if retry is not None and not fallback and key not in no_probe:
                    # The result is recorded: a crash of the probe (CPU fallback) is not blamed on the item.
                    emit({"ev": "probe", **base, "t": time.time()})
                    emit({"ev": "probed", **base, "missing_ops": probe(retry)})
    emit({"ev": "end"})
    out.close()
    # A crash during interpreter teardown after "end" is reported by the
    # driver as a process error (not blamed on an op).
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
