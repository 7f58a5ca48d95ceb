"""report.json (machine-readable) and REPORT.md (summary) of a conformance run."""
from __future__ import annotations

import datetime
import json
import platform
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .runner import STATUSES

__all__ = ["build", "write_json", "write_markdown", "summary_lines", "missing_operators"]

FORWARD_TARGET = 90.0
BACKWARD_TARGET = 80.0
_CODE = {"pass": "ok", "mismatch": "MIS", "not_implemented": "NI", "error": "ERR", "crash": "CRASH",
         "timeout": "TIME", "skipped": "-"}
_FAILING = ("mismatch", "not_implemented", "error", "crash", "timeout")


def build(results: Any, meta: dict) -> dict:
    """The report dict: meta, summary, per-item results, missing operators."""
    items = [{"op": op, "dtype": dt, "direction": d, **rec} for (op, dt, d), rec in results.items.items()]
    order = {op: i for i, op in enumerate(meta.get("ops", []))}
    items.sort(key=lambda r: (order.get(r["op"], len(order)), r["op"], r["dtype"], r["direction"]))
    report = {
        "meta": {**{k: v for k, v in meta.items() if k != "ops"}, "seconds": results.seconds,
                 "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "python": platform.python_version()},
        "process_errors": list(results.process_errors),
        "results": items,
    }
    report["summary"] = summarize(items)
    report["missing_operators"] = missing_operators(items)
    return report


def _rate(items: list[dict], dtype: str, direction: str) -> dict:
    rel = [r for r in items if r["dtype"] == dtype and r["direction"] == direction and r["status"] != "skipped"]
    counts = Counter(r["status"] for r in rel)
    total = len(rel)
    return {"ops": total, "passed": counts.get("pass", 0),
            "percent": round(100.0 * counts.get("pass", 0) / total, 1) if total else 0.0,
            "by_status": {s: counts.get(s, 0) for s in STATUSES if s != "skipped"}}


def summarize(items: list[dict]) -> dict:
    dtypes = sorted({r["dtype"] for r in items})
    out: dict[str, Any] = {"ops": len({r["op"] for r in items}),
                           "by_status": dict(Counter(r["status"] for r in items))}
    for direction in ("fwd", "bwd"):
        out[direction] = {dt: _rate(items, dt, direction) for dt in dtypes
                          if any(r["dtype"] == dt and r["direction"] == direction for r in items)}
    out["crashes"] = [f"{r['op']} {r['dtype']} {r['direction']}" for r in items if r["status"] == "crash"]
    out["timeouts"] = [f"{r['op']} {r['dtype']} {r['direction']}" for r in items if r["status"] == "timeout"]
    out["arbitrated"] = [f"{r['op']} {r['dtype']} {r['direction']} ({r['arbitrated']})" for r in items
                         if r["status"] == "pass" and r.get("arbitrated")]
    return out


def missing_operators(items: list[dict]) -> list[dict]:
    """aten operators ranked by how many OpInfo ops they block.

    An op is blocked by an operator when one of its (dtype, direction) items
    raised not_implemented for it, when the operator is among the missing ones
    of its failing sample (``missing_ops``, probed with the fallback on), or
    (in --cpu-fallback runs) when it ran through the CPU fallback for it.
    ``unlocks_f32_fwd``: ops whose failing float32 forward sample misses only
    this operator."""
    blocked: dict[str, set[str]] = defaultdict(set)
    sole_f32_fwd: dict[str, set[str]] = defaultdict(set)
    blocked_f32_fwd: dict[str, set[str]] = defaultdict(set)
    blocked_f32_bwd: dict[str, set[str]] = defaultdict(set)
    for r in items:
        names = set(r.get("fallback_ops") or ()) | set(r.get("missing_ops") or ())
        if r["status"] == "not_implemented" and r.get("aten"):
            names.add(r["aten"])
        if len(names) == 1 and r["dtype"] == "float32" and r["direction"] == "fwd":
            sole_f32_fwd[next(iter(names))].add(r["op"])
        for name in names:
            blocked[name].add(r["op"])
            if r["dtype"] == "float32" and r["direction"] == "fwd":
                blocked_f32_fwd[name].add(r["op"])
            if r["dtype"] == "float32" and r["direction"] == "bwd":
                blocked_f32_bwd[name].add(r["op"])
    ranking = [{"operator": name, "ops": len(ops), "f32_fwd_ops": len(blocked_f32_fwd[name]),
                "f32_bwd_ops": len(blocked_f32_bwd[name]), "unlocks_f32_fwd": len(sole_f32_fwd[name]),
                "examples": sorted(ops)[:8]}
               for name, ops in blocked.items()]
    ranking.sort(key=lambda x: (-x["ops"], -x["f32_fwd_ops"], x["operator"]))
    return ranking


def write_json(report: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")


def summary_lines(report: dict) -> list[str]:
    s = report["summary"]
    lines = []
    for direction, target, label in (("fwd", FORWARD_TARGET, "forward"), ("bwd", BACKWARD_TARGET, "backward")):
        r = s.get(direction, {}).get("float32")
        if r:
            mark = "meets" if r["percent"] >= target else "below"
            lines.append(f"float32 {label}: {r['passed']}/{r['ops']} ops pass = {r['percent']:.1f} % "
                         f"({mark} the {target:.0f} % target)")
    lines.append("items by status: " + ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items())))
    if s["crashes"]:
        lines.append(f"CRASHES ({len(s['crashes'])}): " + "; ".join(s["crashes"][:20]))
    if s["timeouts"]:
        lines.append(f"TIMEOUTS ({len(s['timeouts'])}): " + "; ".join(s["timeouts"][:20]))
    if s.get("arbitrated"):
        lines.append(f"passed against the float64 reference where the CPU's own result differs "
                     f"({len(s['arbitrated'])} items, samples in brackets): " + "; ".join(s["arbitrated"][:40]))
    if report.get("process_errors"):
        lines.append(f"process errors: {len(report['process_errors'])}")
    top = report["missing_operators"][:10]
    if top:
        lines.append("top missing operators: " + ", ".join(f"{m['operator']} ({m['ops']})" for m in top))
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_markdown(report: dict, path: str | Path, *, max_message: int = 110) -> None:
    meta, s = report["meta"], report["summary"]
    items = report["results"]
    dtypes = [d for d in meta.get("dtypes", []) if any(r["dtype"] == d for r in items)]
    bwd_dtypes = [d for d in meta.get("bwd_dtypes", []) if any(r["dtype"] == d and r["direction"] == "bwd"
                                                               for r in items)]
    out: list[str] = []
    w = out.append
    w("# OpInfo conformance of the tpu device")
    w("")
    w("Generated by `python -m tests.conformance` (see `tests/conformance/__init__.py`); do not edit by hand.")
    mode = "CPU fallback ON (dry run of the harness)" if meta.get("cpu_fallback") else "CPU fallback off"
    w(f"Run: {meta.get('generated')}, torch {meta.get('torch')}, {mode}, {s['ops']} ops, "
      f"{meta.get('seconds')} s" + (f", at most {meta['max_samples']} samples per item"
                                     if meta.get("max_samples") else "") + ".")
    w("")
    w("## Summary")
    w("")
    for line in summary_lines(report):
        w(f"- {line}")
    w("")
    w("| dtype | direction | ops | pass | % | mismatch | not implemented | error | crash | timeout |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for direction in ("fwd", "bwd"):
        for dt, r in s.get(direction, {}).items():
            b = r["by_status"]
            w(f"| {dt} | {direction} | {r['ops']} | {r['passed']} | {r['percent']:.1f} | {b['mismatch']} | "
              f"{b['not_implemented']} | {b['error']} | {b['crash']} | {b['timeout']} |")
    w("")
    if report.get("process_errors"):
        w("## Process errors")
        w("")
        for e in report["process_errors"]:
            w(f"- {_cell(e)[:400]}")
        w("")
    w("## Missing aten operators, ranked by the OpInfo ops they block")
    w("")
    w("An op is blocked by an operator when the operator is missing for the first failing sample of one of "
      "its dtypes/directions (all missing operators of that sample are found by re-running it once with the "
      "CPU fallback on). *ops*: OpInfo ops blocked (any dtype/direction); *f32 fwd* / *f32 bwd*: blocked in "
      "float32 forward / backward; *unlocks*: float32 forward items for which this is the only missing "
      "operator (implementing it alone lets that sample run).")
    w("")
    w("| # | operator | ops | f32 fwd | f32 bwd | unlocks | e.g. |")
    w("|---:|---|---:|---:|---:|---:|---|")
    for i, m in enumerate(report["missing_operators"][:80], 1):
        w(f"| {i} | `{m['operator']}` | {m['ops']} | {m['f32_fwd_ops']} | {m['f32_bwd_ops']} | "
          f"{m['unlocks_f32_fwd']} | {_cell(', '.join(m['examples'][:4]))} |")
    w("")
    w("## Per op")
    w("")
    legend = ", ".join(f"`{v}` {k}" for k, v in _CODE.items())
    w(f"Codes: {legend}. The note is the first failure in the order of the columns.")
    w("")
    cols = [(d, "fwd") for d in dtypes] + [(d, "bwd") for d in bwd_dtypes]
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64", "int64": "i64",
             "int32": "i32", "bool": "bool"}
    w("| op | " + " | ".join(f"{short.get(d, d)} {dr}" for d, dr in cols) + " | note |")
    w("|---|" + "---|" * len(cols) + "---|")
    by_op: dict[str, dict[tuple[str, str], dict]] = defaultdict(dict)
    for r in items:
        by_op[r["op"]][(r["dtype"], r["direction"])] = r
    for op, cells in by_op.items():
        row, note = [], ""
        for col in cols:
            r = cells.get(col)
            row.append(_CODE.get(r["status"], "?") if r else " ")
            if r and not note and r["status"] in _FAILING:
                msg = r["message"]
                if r["status"] == "not_implemented" and r.get("aten"):
                    msg = f"missing {r['aten']}"
                note = f"{col[0]} {col[1]}: {msg}"
        if len(note) > max_message:
            note = note[: max_message - 3] + "..."
        w(f"| `{op}` | " + " | ".join(row) + f" | {_cell(note)} |")
    w("")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(out))
