"""Differential fuzzing of tpu_dist against Gloo on CPU tensors.

``python -m tests.fuzz.dist [--seed S] [--n N] [--world W] [--modes strict,defer] [--timeout T]``

Random collective statements — all_reduce (every reduce op), broadcast,
reduce, all_gather (list and into one tensor), reduce_scatter (list and
tensor), all_to_all_single with random uneven splits, gather, scatter,
send/recv around a ring, coalesced all_reduce; random dtypes, shapes (empty
ones too), source / destination ranks, sync and async calls — run on every
rank of one "cpu:gloo,tpu:tpu_dist" process group, each on tpu tensors
(tpu_dist) and on the same values as CPU tensors (Gloo), in strict and in
DeferAndFuse mode. Every rank draws its inputs from (seed, statement,
rank), so a run is reproducible from its seed. Outputs are compared exactly
for integers and bool, and for floats at the tolerance of the dtype (tpu_dist
reduces float16 / bfloat16 in float32, Gloo in the dtype); a statement that
raises on one side must raise the same exception class on the other.
Each rank prints one JSON line per statement; the launcher collects them and
reports ok / mismatch / hang (a rank without an answer in `timeout` s).
FUZZ_SIDES=cpu (or tpu) runs one side alone, to tell whose a stop is;
FUZZ_PG_TIMEOUT sets the process group's timeout (default 60 s).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("float32", "bfloat16", "float16", "int32", "int64", "uint8", "bool", "float64")
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "ring", "coalesced_all_reduce")
REDUCE = ("SUM", "AVG", "MAX", "MIN", "PRODUCT")


def generate(seed: int, n: int, world: int) -> list[dict[str, Any]]:
    """n statements, the same list on every rank."""
    g = random.Random(seed)
    out = []
    for i in range(n):
        op = g.choice(OPS)
        dt = g.choice(DTYPES)
        rop = g.choice(REDUCE)
        if dt not in ("float32", "float64", "bfloat16", "float16") and rop == "AVG":
            rop = "SUM"   # AVG of integers: Gloo refuses it on CPU as the device does; kept for floats
        ndim = g.randint(0, 3)
        shape = [g.choice((0, 1, 2, 3, 5, 8, 17)) if g.random() < 0.1 else g.choice((1, 2, 3, 4, 6, 9))
                 for _ in range(ndim)]
        st = {"i": i, "op": op, "dtype": dt, "rop": rop, "shape": shape, "root": g.randrange(world),
              "async": g.random() < 0.4, "seed": g.randrange(1 << 30)}
        if op == "all_to_all_single":
            # rows split unevenly: rank r sends split[r][j] rows to rank j
            st["splits"] = [[g.randint(0, 3) for _ in range(world)] for _ in range(world)]
            st["cols"] = g.randint(1, 4)
        if op in ("reduce_scatter_tensor", "all_gather_into_tensor") and not shape:
            st["shape"] = [g.randint(1, 4)]
        if op == "coalesced_all_reduce":
            st["count"] = g.randint(1, 3)
        out.append(st)
    return out


# ------------------------------------------------------------------ rank side

def _tensor(torch, dtype, shape, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        # small integers and halves: sums and products stay exact in every float dtype
        return (torch.randint(-4, 5, shape, generator=gen).to(torch.float32) / 2).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 4, shape, generator=gen).to(dtype)
    return torch.randint(-3, 4, shape, generator=gen).to(dtype)


def _run(torch, dist, st: dict[str, Any], dev, rank: int, world: int) -> list:
    """The statement on `dev` tensors; returns its outputs (moved to the CPU)."""
    dt = getattr(torch, st["dtype"])
    shape = st["shape"]
    rop = getattr(dist.ReduceOp, st["rop"])
    mk = lambda k: _tensor(torch, dt, shape, st["seed"] * 131 + rank * 7 + k).to(dev)  # noqa: E731
    op, root, asy = st["op"], st["root"], st["async"]

    def done(w):
        if w is not None:
            w.wait()

    if op == "all_reduce":
        x = mk(0)
        done(dist.all_reduce(x, op=rop, async_op=asy))
        outs = [x]
    elif op == "broadcast":
        x = mk(0)
        done(dist.broadcast(x, src=root, async_op=asy))
        outs = [x]
    elif op == "reduce":
        x = mk(0)
        done(dist.reduce(x, dst=root, op=rop, async_op=asy))
        outs = [x] if rank == root else []
    elif op == "all_gather":
        x = mk(0)
        ys = [torch.empty_like(x) for _ in range(world)]
        done(dist.all_gather(ys, x, async_op=asy))
        outs = ys
    elif op == "all_gather_into_tensor":
        x = mk(0)
        y = torch.empty([shape[0] * world] + shape[1:], dtype=dt, device=dev)
        done(dist.all_gather_into_tensor(y, x, async_op=asy))
        outs = [y]
    elif op == "reduce_scatter":
        xs = [mk(k) for k in range(world)]
        y = torch.empty_like(xs[0])
        done(dist.reduce_scatter(y, xs, op=rop, async_op=asy))
        outs = [y]
    elif op == "reduce_scatter_tensor":
        x = _tensor(torch, dt, [shape[0] * world] + shape[1:], st["seed"] * 131 + rank * 7).to(dev)
        y = torch.empty(shape, dtype=dt, device=dev)
        done(dist.reduce_scatter_tensor(y, x, op=rop, async_op=asy))
        outs = [y]
    elif op == "all_to_all_single":
        sp, cols = st["splits"], st["cols"]
        send = sp[rank]
        recv = [sp[j][rank] for j in range(world)]
        x = _tensor(torch, dt, [sum(send), cols], st["seed"] * 131 + rank * 7).to(dev)
        y = torch.empty([sum(recv), cols], dtype=dt, device=dev)
        done(dist.all_to_all_single(y, x, output_split_sizes=recv, input_split_sizes=send, async_op=asy))
        outs = [y]
    elif op == "gather":
        x = mk(0)
        ys = [torch.empty_like(x) for _ in range(world)] if rank == root else None
        done(dist.gather(x, ys, dst=root, async_op=asy))
        outs = ys or []
    elif op == "scatter":
        y = torch.empty(shape, dtype=dt, device=dev)
        xs = [mk(k) for k in range(world)] if rank == root else None
        done(dist.scatter(y, xs, src=root, async_op=asy))
        outs = [y]
    elif op == "ring":
        x = mk(0)
        y = torch.empty_like(x)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (rank + 1) % world),
                                       dist.P2POp(dist.irecv, y, (rank - 1) % world)])
        for q in reqs:
            q.wait()
        outs = [y]
    elif op == "coalesced_all_reduce":
        xs = [mk(k) for k in range(st["count"])]
        done(dist.all_reduce_coalesced(xs, op=rop, async_op=asy))
        outs = xs
    else:
        raise ValueError(op)
    return [o.cpu() for o in outs]


def _close(torch, a, b, dtype: str) -> str | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    if not a.is_floating_point():
        return None if torch.equal(a, b) else f"values differ (max |d| {(a.long() - b.long()).abs().max().item()})"
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2}.get(dtype, 1e-6)
    if torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True):
        return None
    return f"values differ (max |d| {(a.double() - b.double()).abs().max().item():.3g})"


def rank_main() -> None:
    import datetime

    import torch
    import torch.distributed as dist

    import torch_tpu

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    seed, n = int(os.environ["FUZZ_SEED"]), int(os.environ["FUZZ_N"])
    only = {int(i) for i in os.environ.get("FUZZ_ONLY", "").split(",") if i}
    sides = os.environ.get("FUZZ_SIDES", "cpu,tpu").split(",")  # one side alone: to tell whose a hang is
    modes = os.environ["FUZZ_MODES"].split(",")
    dev = torch.device("tpu", rank)
    torch.accelerator.set_device_index(rank)
    dist.init_process_group("cpu:gloo,tpu:tpu_dist",
                            timeout=datetime.timedelta(seconds=float(os.environ.get("FUZZ_PG_TIMEOUT", "60"))))
    for st in generate(seed, n, world):
        if only and st["i"] not in only:
            continue
        for mode in modes:
            previous = torch_tpu.set_execution_mode(mode)
            rec: dict[str, Any] = {"i": st["i"], "mode": mode, "op": st["op"], "dtype": st["dtype"]}
            res = {}
            for side, d in (("cpu", torch.device("cpu")), ("tpu", dev)):
                if side not in sides:
                    res[side] = ("ok", [])
                    continue
                try:
                    res[side] = ("ok", _run(torch, dist, st, d, rank, world))
                except Exception as e:  # noqa: BLE001 - compared between the two sides
                    res[side] = ("error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                    dist.barrier()  # both sides stay in step after a refusal
            torch_tpu.set_execution_mode(previous)
            (ks, vs), (kt, vt) = res["cpu"], res["tpu"]
            if ks != kt:
                rec.update(status="mismatch", msg=f"cpu {ks} {vs if ks == 'error' else ''} / tpu {kt} "
                                                  f"{vt if kt == 'error' else ''}")
            elif ks == "error":
                same = vs.split(":")[0] == vt.split(":")[0]
                rec.update(status="ok" if same else "mismatch", msg="" if same else f"cpu {vs} / tpu {vt}")
            else:
                msg = None
                if len(vs) != len(vt):
                    msg = f"{len(vs)} outputs vs {len(vt)}"
                for a, b in zip(vs, vt):
                    msg = msg or _close(torch, a, b, st["dtype"])
                rec.update(status="mismatch" if msg else "ok", msg=msg or "")
            print(json.dumps(rec), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------- launcher

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def campaign(seed: int, n: int, world: int = 2, modes: tuple[str, ...] = ("strict", "defer"),
             timeout: float = 300.0, only: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Runs the statements of `seed` (those in `only` if given) on `world`
    ranks; one record per (statement, mode, rank), and a "hang" / "crash"
    record for a rank that gave no answer or failed."""
    expect = len([i for i in range(n) if not only or i in only]) * len(modes)
    port = _free_port()
    procs = []
    for r in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
               "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
               "FUZZ_SEED": str(seed), "FUZZ_N": str(n), "FUZZ_MODES": ",".join(modes), "PYTHONUNBUFFERED": "1",
               "TPU_NUM_DEVICES": str(world), "FUZZ_ONLY": ",".join(map(str, only))}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.fuzz.dist", "--rank-main"], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    recs: list[dict[str, Any]] = []
    for r, p in enumerate(procs):
        try:
            out = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            recs.append({"rank": r, "status": "hang", "msg": f"no answer in {timeout:.0f} s"})
            continue
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        for ln in lines:
            recs.append({"rank": r, **json.loads(ln)})
        if p.returncode != 0 or len(lines) != expect:
            recs.append({"rank": r, "status": "crash", "msg": f"exit {p.returncode}, {len(lines)} answers: "
                                                              f"{out[-1500:]}"})
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=100, help="statements")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--modes", default="strict,defer")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--only", default="", help="comma-separated statement indices to run (the rest skipped)")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        rank_main()
        return
    t = time.monotonic()
    only = tuple(int(i) for i in a.only.split(",") if i)
    recs = campaign(a.seed, a.n, a.world, tuple(a.modes.split(",")), a.timeout, only)
    bad = [r for r in recs if r["status"] != "ok"]
    for r in bad[:30]:
        print(f"rank {r['rank']} statement {r.get('i')} [{r.get('mode')}] {r.get('op')} {r.get('dtype')}: "
              f"{r['status']}: {r.get('msg')}")
    counts: dict[str, int] = {}
    for r in recs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{a.n} statements x {a.world} ranks x modes {a.modes} in {time.monotonic() - t:.1f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
