"""tpu_dist, the c10d backend of the tpu device: every collective across 2
and 4 processes (strict and DeferAndFuse), dtypes and reduce ops, uneven
splits, point-to-point, coalesced forms, async works, functional and object
collectives (also inside torch.compile(backend="tpu") graphs), mixed
"cpu:gloo,tpu:tpu_dist" groups, mismatched collectives,
dead and silent ranks.

Each test launches its ranks as fresh interpreters (this file with a case
name) over TCP on loopback, with a bounded wait: a hang fails the test.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FULL = os.environ.get("TORCH_TPU_TEST_FULL") == "1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case: str, world: int, env: dict[str, str] | None = None, timeout: float = 180,
           expect_rc: dict[int, int] | None = None, wait_ranks: list[int] | None = None,
           script: str = __file__) -> list[str]:
    """Runs `case` (a case_NAME function of `script`) on `world` ranks;
    returns each rank's output. Fails if any
    rank hangs past `timeout` or exits with an unexpected code. Ranks not in
    `wait_ranks` (default all) are killed once those have finished."""
    port = free_port()
    procs = []
    for r in range(world):
        e = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
             "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
             "TORCH_TPU_TEST_CASE": case, "PYTHONUNBUFFERED": "1"}
        e.pop("TPU_NUM_DEVICES", None)
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, script], env=e, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    waited = range(world) if wait_ranks is None else wait_ranks
    deadline = time.monotonic() + timeout
    outs: list[str] = [""] * world
    try:
        for r in waited:
            try:
                outs[r] = procs[r].communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} of case {case!r} did not finish within {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    for r in waited:
        want = (expect_rc or {}).get(r, 0)
        assert procs[r].returncode == want, f"rank {r} of {case!r} exited {procs[r].returncode}:\n{outs[r][-6000:]}"
    return outs


# --------------------------------------------------------------- the cases


def _setup(backend: str | None = "device_id", timeout_s: float = 60):
    import datetime

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    index = int(os.environ["LOCAL_RANK"]) if "TPU_NUM_DEVICES" not in os.environ else 0
    dev = torch.device("tpu", index)
    torch.accelerator.set_device_index(index)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "device_id":
        dist.init_process_group(device_id=dev, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return torch, dist, rank, world, dev


def _val(torch, r: int, dtype, n: int = 6):
    """Rank r's deterministic input: small values exact in every dtype."""
    x = (torch.arange(n) % 3 + r + 1)
    if dtype == torch.bool:
        return (x % 2 == 0)
    return x.to(dtype)


def case_collectives() -> None:
    import functools

    torch, dist, rank, world, dev = _setup()
    import torch.distributed._functional_collectives as funcol

    defer = os.environ.get("TORCH_TPU_DEFER_AND_FUSE") == "1"
    assert dist.get_backend() == "tpu_dist"
    assert dist.get_default_backend_for_device("tpu") == "tpu_dist"
    assert dist.group.WORLD._get_backend(dev).name() == "tpu_dist"
    R = ReduceOp = dist.ReduceOp

    def on_dev(x):
        """x on the device, produced by device ops (deferred in DeferAndFuse)."""
        d = x.to(dev)
        if d.dtype.is_floating_point:
            return d * 2 - d
        return d.clone()

    def same(got, want, what):
        got = got.cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), f"{what}: got {got}, want {want}"

    ranks = range(world)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
              torch.int32, torch.int64, torch.bool]
    for dt in dtypes:
        ops = {R.SUM: None, R.MAX: torch.maximum, R.MIN: torch.minimum, R.PRODUCT: None}
        if dt.is_floating_point:
            ops[R.AVG] = None
        else:
            ops.update({R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor})
        for op, fn in ops.items():
            vals = [_val(torch, r, dt) for r in ranks]
            if op == R.PRODUCT:
                vals = [v if dt == torch.bool else (v > 2).to(dt) + 1 for v in vals]  # 1s and 2s
            if dt == torch.bool and op in (R.SUM, R.MAX, R.BOR):
                want = functools.reduce(torch.logical_or, vals)
            elif dt == torch.bool and op in (R.PRODUCT, R.MIN, R.BAND):
                want = functools.reduce(torch.logical_and, vals)
            elif op == R.SUM:
                want = functools.reduce(torch.add, vals).to(dt)
            elif op == R.PRODUCT:
                want = functools.reduce(torch.mul, vals).to(dt)
            elif op == R.AVG:
                want = (functools.reduce(torch.add, [v.double() for v in vals]) / world).to(dt)
            else:
                want = functools.reduce(fn, vals)
            t = on_dev(vals[rank])
            dist.all_reduce(t, op=op)
            same(t, want, f"all_reduce {dt} {op}")
            if op in (R.SUM, R.MAX):
                t = on_dev(vals[rank])
                dist.reduce(t, dst=world - 1, op=op)
                if rank == world - 1:
                    same(t, want, f"reduce {dt} {op}")

    # Unsigned types Gloo lacks reduce in int32 / int64.
    for dt in (torch.uint16, torch.uint32, torch.uint64):
        t = _val(torch, rank, torch.int64).to(dev).to(dt)
        dist.all_reduce(t)
        same(t.to(torch.int64), sum(_val(torch, r, torch.int64) for r in ranks), f"all_reduce {dt}")

    # PREMUL_SUM with a float and a tensor factor.
    for factor in (0.5, torch.tensor(0.25, device=dev)):
        t = on_dev(_val(torch, rank, torch.float32))
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        want = sum(_val(torch, r, torch.float32) for r in ranks) * float(factor)
        same(t, want, f"premul_sum {factor}")

    # Complex sums (torch passes their real view) and non-contiguous, 0-d, empty tensors.
    c = torch.complex(_val(torch, rank, torch.float32), -_val(torch, rank, torch.float32))
    t = c.to(dev)
    dist.all_reduce(t)
    same(t, sum(torch.complex(_val(torch, r, torch.float32), -_val(torch, r, torch.float32)) for r in ranks), "complex")
    base = on_dev(torch.arange(12.).reshape(3, 4) + rank)
    tt = base.t()
    dist.all_reduce(tt)
    same(base, sum(torch.arange(12.).reshape(3, 4) + r for r in ranks), "all_reduce of a transposed view")
    t = torch.tensor(float(rank + 1), device=dev)
    dist.all_reduce(t, op=R.MAX)
    same(t, torch.tensor(float(world)), "0-d")
    t = torch.empty(0, device=dev)
    dist.all_reduce(t)
    assert t.numel() == 0

    # broadcast from every root, all dtypes incl. complex (bytes on the wire).
    for root in ranks:
        for dt in (torch.float32, torch.bfloat16, torch.int16, torch.bool, torch.complex64):
            src = _val(torch, root, dt) if dt != torch.complex64 else torch.complex(_val(torch, root, torch.float32),
                                                                                   torch.ones(6))
            t = on_dev(src) if rank == root else torch.zeros(6, dtype=dt, device=dev)
            dist.broadcast(t, src=root)
            same(t, src, f"broadcast {dt} from {root}")

    # all_gather (list and into one tensor), gather, scatter.
    for dt in (torch.float32, torch.int16, torch.bool):
        x = on_dev(_val(torch, rank, dt))
        outs = [torch.empty(6, dtype=dt, device=dev) for _ in ranks]
        dist.all_gather(outs, x)
        for r in ranks:
            same(outs[r], _val(torch, r, dt), f"all_gather {dt} [{r}]")
        big = torch.empty(6 * world, dtype=dt, device=dev)
        dist.all_gather_into_tensor(big, x)
        same(big, torch.cat([_val(torch, r, dt) for r in ranks]), f"all_gather_into_tensor {dt}")
    x = on_dev(_val(torch, rank, torch.float32))
    g = [torch.empty(6, device=dev) for _ in ranks] if rank == 0 else None
    dist.gather(x, g, dst=0)
    if rank == 0:
        for r in ranks:
            same(g[r], _val(torch, r, torch.float32), f"gather [{r}]")
    root = 1 % world
    out = torch.empty(6, device=dev)
    dist.scatter(out, [on_dev(_val(torch, 10 * r, torch.float32)) for r in ranks] if rank == root else None, src=root)
    same(out, _val(torch, 10 * rank, torch.float32), "scatter")

    # reduce_scatter (tensor and list forms).
    for op in (R.SUM, R.AVG, R.MAX):
        x = on_dev(torch.cat([_val(torch, rank + j, torch.float32) for j in ranks]))
        out = torch.empty(6, device=dev)
        dist.reduce_scatter_tensor(out, x, op=op)
        parts = [_val(torch, r + rank, torch.float32) for r in ranks]
        want = {R.SUM: sum(parts), R.AVG: sum(parts) / world, R.MAX: functools.reduce(torch.maximum, parts)}[op]
        same(out, want, f"reduce_scatter_tensor {op}")
    out = torch.empty(6, dtype=torch.int32, device=dev)
    dist.reduce_scatter(out, [on_dev(_val(torch, rank + j, torch.int32)) for j in ranks])
    same(out, sum(_val(torch, r + rank, torch.int32) for r in ranks).to(torch.int32), "reduce_scatter list")

    # all_to_all_single, even and uneven splits; all_to_all lists of uneven sizes.
    x = on_dev(torch.arange(2. * world) + 100 * rank)
    out = torch.empty(2 * world, device=dev)
    dist.all_to_all_single(out, x)
    same(out, torch.cat([torch.arange(2. * rank, 2. * rank + 2) + 100 * r for r in ranks]), "all_to_all_single")
    for dt in (torch.float32, torch.int16):
        in_splits = [rank + j + 1 for j in ranks]  # rows to rank j
        x = on_dev(torch.cat([torch.full((n, 3), 100 * rank + j) for j, n in enumerate(in_splits)]).to(dt))
        out = torch.empty(sum(j + rank + 1 for j in ranks), 3, dtype=dt, device=dev)
        dist.all_to_all_single(out, x, output_split_sizes=[j + rank + 1 for j in ranks], input_split_sizes=in_splits)
        same(out, torch.cat([torch.full((j + rank + 1, 3), 100 * j + rank) for j in ranks]).to(dt),
             f"all_to_all_single uneven {dt}")
    ins = [on_dev(torch.full((rank + j + 1,), float(10 * rank + j))) for j in ranks]
    outs = [torch.empty(j + rank + 1, device=dev) for j in ranks]
    dist.all_to_all(outs, ins)
    for j in ranks:
        same(outs[j], torch.full((j + rank + 1,), float(10 * j + rank)), f"all_to_all [{j}]")

    # point to point: a ring with isend/irecv, batch_isend_irecv, blocking send/recv pairs.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    x = on_dev(_val(torch, rank, torch.bfloat16))
    got = torch.empty(6, dtype=torch.bfloat16, device=dev)
    reqs = [dist.isend(x, nxt), dist.irecv(got, prv)]
    for q in reqs:
        q.wait()
    same(got, _val(torch, prv, torch.bfloat16), "isend/irecv ring")
    got = torch.empty(6, device=dev)
    ops = [dist.P2POp(dist.isend, on_dev(_val(torch, rank, torch.float32)), nxt), dist.P2POp(dist.irecv, got, prv)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    same(got, _val(torch, prv, torch.float32), "batch_isend_irecv")
    if rank % 2 == 0 and rank + 1 < world:
        dist.send(on_dev(_val(torch, rank, torch.int64)), rank + 1)
    elif rank % 2 == 1:
        got = torch.empty(6, dtype=torch.int64, device=dev)
        dist.recv(got, rank - 1)
        same(got, _val(torch, rank - 1, torch.int64), "send/recv")

    # coalesced forms (tpu_dist does not coalesce itself: torch issues the *_coalesced calls).
    a, b = on_dev(_val(torch, rank, torch.float32)), on_dev(_val(torch, rank, torch.float32) * 2)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    same(a, sum(_val(torch, r, torch.float32) for r in ranks), "coalesced all_reduce a")
    same(b, sum(_val(torch, r, torch.float32) * 2 for r in ranks), "coalesced all_reduce b")
    outs = [torch.empty(6 * world, device=dev) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for i in range(2):
            dist.all_gather_into_tensor(outs[i], on_dev(_val(torch, rank + i, torch.float32)))
    cm.wait()
    for i in range(2):
        same(outs[i], torch.cat([_val(torch, r + i, torch.float32) for r in ranks]), f"coalesced all_gather {i}")
    outs = [torch.empty(6, device=dev) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for i in range(2):
            dist.reduce_scatter_tensor(outs[i], on_dev(torch.cat([_val(torch, rank + i, torch.float32)] * world)))
    cm.wait()
    for i in range(2):
        same(outs[i], sum(_val(torch, r + i, torch.float32) for r in ranks), f"coalesced reduce_scatter {i}")
    a, b = on_dev(_val(torch, rank, torch.float32)), on_dev(_val(torch, rank, torch.float32))
    dist.all_reduce_coalesced([a, b])
    same(a, sum(_val(torch, r, torch.float32) for r in ranks), "all_reduce_coalesced")

    # async works: wait with a timeout, futures carrying the tpu result.
    import datetime

    t = on_dev(_val(torch, rank, torch.float32))
    w = dist.all_reduce(t, async_op=True)
    assert w.wait(timeout=datetime.timedelta(seconds=30))
    assert w.is_completed() and w.is_success()
    same(t, sum(_val(torch, r, torch.float32) for r in ranks), "async all_reduce")
    t = on_dev(_val(torch, rank, torch.float32))
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.then(lambda f: f.value()[0] * 2).wait()
    assert res.device == dev
    same(res, sum(_val(torch, r, torch.float32) for r in ranks) * 2, "future")

    # functional collectives (DTensor's path) and object collectives (DCP's).
    x = on_dev(_val(torch, rank, torch.float32))
    same(funcol.all_reduce(x, "sum", dist.group.WORLD), sum(_val(torch, r, torch.float32) for r in ranks),
         "funcol all_reduce")
    same(funcol.all_gather_tensor(x, 0, dist.group.WORLD), torch.cat([_val(torch, r, torch.float32) for r in ranks]),
         "funcol all_gather")
    y = on_dev(torch.cat([_val(torch, rank + j, torch.float32) for j in ranks]))
    same(funcol.reduce_scatter_tensor(y, "sum", 0, dist.group.WORLD),
         sum(_val(torch, r + rank, torch.float32) for r in ranks), "funcol reduce_scatter")
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in ranks], objs
    lst = [rank, "from", rank] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "from", 0]
    dist.barrier()

    # a tensor of another device raises like NCCL's; the group stays usable.
    with pytest.raises(ValueError, match="Tensors must be TPU and dense"):
        dist.group.WORLD._get_backend(dev).allreduce([torch.ones(2)])
    with pytest.raises(RuntimeError, match="cpu"):
        dist.all_reduce(torch.ones(2))
    t = on_dev(_val(torch, rank, torch.float32))
    dist.all_reduce(t)
    same(t, sum(_val(torch, r, torch.float32) for r in ranks), "all_reduce after errors")
    if defer:
        import torch_tpu

        assert torch_tpu.get_execution_mode() == "defer", torch_tpu.get_execution_mode()
    dist.destroy_process_group()
    print(f"rank {rank}: collectives ok", flush=True)


def case_mixed() -> None:
    """'cpu:gloo,tpu:tpu_dist': cpu tensors on Gloo, tpu tensors on tpu_dist."""
    torch, dist, rank, world, dev = _setup("cpu:gloo,tpu:tpu_dist")
    assert dist.group.WORLD._get_backend(torch.device("cpu")).name() == "gloo"
    assert dist.group.WORLD._get_backend(dev).name() == "tpu_dist"
    c = torch.full((3,), float(rank + 1))
    t = c.to(dev)
    dist.all_reduce(c)
    dist.all_reduce(t)
    want = torch.full((3,), float(sum(range(1, world + 1))))
    assert torch.equal(c, want) and torch.equal(t.cpu(), want), (c, t)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: mixed ok", flush=True)


def case_compiled() -> None:
    """Functional collectives inside a torch.compile(backend="tpu") graph run
    on tpu_dist and give eager's results."""
    torch, dist, rank, world, dev = _setup("tpu_dist")
    import torch.distributed._functional_collectives as funcol

    def f(x):
        y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
        z = funcol.all_gather_tensor(y.sin(), 0, dist.group.WORLD)
        return z + 1

    x = torch.arange(8.0, device=dev) + rank
    got = torch.compile(f, backend="tpu")(x)
    want = torch.cat([(sum(torch.arange(8.0) + r for r in range(world)) * 2).sin()] * world) + 1
    assert torch.allclose(got.cpu(), want, atol=1e-6) and torch.allclose(got.cpu(), f(x).cpu()), (got, want)
    stats = torch.tpu.compile_stats()
    assert stats["dynamo_graphs"] >= 1 and stats["unsupported_graphs"] == 0, stats
    dist.destroy_process_group()
    print(f"rank {rank}: compiled ok", flush=True)


def _verify_path(dist, dev, group=None) -> str:
    """How a tpu_dist group checks its collectives: board, gloo or off."""
    pg = group or dist.distributed_c10d._get_default_group()
    return pg._get_backend(dev)._verify_path


def case_mismatch() -> None:
    """Mismatched shape, dtype and op raise one clear error on every rank;
    the group is still usable afterwards. CHECK_PATH: how the fingerprints
    meet (TORCH_TPU_DIST_VERIFY set per rank by VERIFY_OF_RANK)."""
    verify = os.environ.get("VERIFY_OF_RANK", "").split(",")
    if verify != [""]:
        os.environ["TORCH_TPU_DIST_VERIFY"] = verify[int(os.environ["RANK"])]
    torch, dist, rank, world, dev = _setup("tpu_dist")
    assert _verify_path(dist, dev) == os.environ["CHECK_PATH"], _verify_path(dist, dev)
    shm = f"/dev/shm/tpu_dist-{os.getpid()}-"
    assert not any(("/dev/shm/" + f).startswith(shm) for f in os.listdir("/dev/shm")), "the board file stayed"
    calls = {
        "shape": lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 8, device=dev)),
        "dtype": lambda: dist.all_reduce(torch.ones(4, device=dev, dtype=torch.float32 if rank == 0 else
                                                    torch.float64)),
        "op": lambda: (dist.all_reduce(torch.ones(4, device=dev)) if rank == 0 else
                       dist.broadcast(torch.ones(4, device=dev), 0)),
        "reduce op": lambda: dist.all_reduce(torch.ones(4, device=dev),
                                             op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX),
    }
    expect = {"shape": ("float[4]", "float[8]"), "dtype": ("Float[4]", "Double[4]"),
              "op": ("ALLREDUCE", "BROADCAST"), "reduce op": ("ReduceOp.SUM", "ReduceOp.MAX")}
    for name, call in calls.items():
        with pytest.raises(dist.DistBackendError, match="mismatched collectives") as e:
            call()
        msg = str(e.value)
        assert "rank 0" in msg and "rank 1" in msg, msg
        for part in expect[name]:
            assert part.lower() in msg.lower(), (name, msg)
        t = torch.full((2,), float(rank), device=dev)
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), torch.full((2,), float(sum(range(world))))), t
    dist.destroy_process_group()
    print(f"rank {rank}: mismatch ok", flush=True)


def case_dead_rank() -> None:
    """Rank 1 dies after the group is up; rank 0's next collective raises."""
    torch, dist, rank, world, dev = _setup("tpu_dist", timeout_s=20)
    dist.barrier()
    if rank == 1:
        os._exit(3)
    with pytest.raises(RuntimeError) as e:
        t = torch.ones(4, device=dev)
        dist.all_reduce(t)
    print(f"error: {e.value}", flush=True)
    assert torch.equal((torch.ones(2, device=dev) + 1).cpu(), torch.full((2,), 2.0))  # device still usable
    print(f"rank {rank}: dead rank raised", flush=True)
    os._exit(0)


def case_silent_rank() -> None:
    """Rank 1 is alive but never joins the collective: rank 0 raises within
    the process group's timeout."""
    import datetime

    torch, dist, rank, world, dev = _setup("tpu_dist", timeout_s=5)
    os.environ["TORCH_TPU_DIST_VERIFY"] = "0"  # an async call then returns before its peers arrive
    quick = dist.new_group(backend="tpu_dist")
    dist.barrier()
    if rank == 1:
        time.sleep(600)
    work = dist.all_reduce(torch.ones(4, device=dev), group=quick, async_op=True)
    with pytest.raises(RuntimeError, match="(?i)timed? ?out"):
        work.wait(timeout=datetime.timedelta(seconds=1))  # Work.wait's own timeout
    with pytest.raises(RuntimeError, match="(?i)timed? ?out.*rank 1"):
        dist.all_reduce(torch.ones(4, device=dev))  # the group's timeout (the board's wait)
    print(f"rank {rank}: silent rank timed out", flush=True)
    os._exit(0)


def case_zero_copy() -> None:
    """all_reduce of a contiguous tensor of a Gloo dtype reduces in place in
    the device memory, all_gather_into_tensor and reduce_scatter_tensor read
    and write it there (no host<->device copy in the trace) unless
    TORCH_TPU_DIST_ZERO_COPY=0 stages it; both give the CPU's sums, also on
    a deferred value (its graph runs first) and through an async work."""
    import torch_tpu
    from torch_tpu import profiler as tp
    torch, dist, rank, world, dev = _setup()
    zero = os.environ.get("TORCH_TPU_DIST_ZERO_COPY") != "0"
    n = 1 << 16
    want = sum(torch.arange(n, dtype=torch.float32) * (r + 1) + 0.5 for r in range(world))
    with tp.profile() as prof:
        x = torch.arange(n, dtype=torch.float32, device=dev) * (rank + 1) + 0.5
        dist.all_reduce(x)
        with torch_tpu.execution_mode("defer"):
            y = torch.arange(n, dtype=torch.float32, device=dev) * (rank + 1)
            y = y + 0.5  # pending in the deferred graph when the collective comes
            dist.all_reduce(y, async_op=True).wait()
        g = torch.empty(world * n, device=dev)
        dist.all_gather_into_tensor(g, x)  # reads x, writes g in device memory
        rs_in = torch.arange(world * n, dtype=torch.float32, device=dev) + rank
        rs_out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(rs_out, rs_in)  # the same; rs_in stays as it was
        z = torch.zeros(4, 8, device=dev) + rank
        zt = z.t()  # not contiguous: staged
        dist.all_reduce(zt)
    torch.testing.assert_close(g.cpu(), want.repeat(world))
    full = sum(torch.arange(world * n, dtype=torch.float32) + r for r in range(world))
    torch.testing.assert_close(rs_out.cpu(), full[rank * n:(rank + 1) * n])
    torch.testing.assert_close(rs_in.cpu(), torch.arange(world * n, dtype=torch.float32) + rank)
    # an all-gather whose input is its own slot of the output: the input is staged
    slots = torch.zeros(world * 4, device=dev)
    slots[rank * 4:(rank + 1) * 4] = rank + 1.0
    dist.all_gather_into_tensor(slots, slots[rank * 4:(rank + 1) * 4])
    torch.testing.assert_close(slots.cpu(), torch.arange(1.0, world + 1).repeat_interleave(4))
    torch.testing.assert_close(x.cpu(), want)
    torch.testing.assert_close(y.cpu(), want)
    torch.testing.assert_close(z.cpu(), torch.full((4, 8), float(sum(range(world)))))
    big = [c for c in prof.copies if c["bytes"] in (n * 4, world * n * 4) and c["direction"] in ("d2h", "h2d")]
    print(f"rank {rank}: zero copy {zero}, copies of x and y {len(big)}", flush=True)
    assert (len(big) == 0) if zero else (len(big) >= 8), prof.copies
    print(f"rank {rank}: zero copy ok", flush=True)


# ------------------------------------------------------------------- tests


@pytest.mark.parametrize("world,mode", [(2, "strict"), (2, "defer"), (4, "strict")])
def test_collectives(world: int, mode: str) -> None:
    env = {}
    if mode == "defer":
        env = {"TORCH_TPU_DEFER_AND_FUSE": "1", "TPU_NUM_DEVICES": "1"}  # every rank on tpu:0
    outs = launch("collectives", world, env)
    for r in range(world):
        assert f"rank {r}: collectives ok" in outs[r]


def test_mixed_cpu_gloo_tpu_dist() -> None:
    outs = launch("mixed", 2)
    assert all("mixed ok" in o for o in outs)


def test_functional_collectives_in_compiled_graph() -> None:
    outs = launch("compiled", 2)
    assert all("compiled ok" in o for o in outs)


@pytest.mark.parametrize("verify,path", [("1,1", "board"), ("gloo,gloo", "gloo"), ("1,gloo", "gloo")])
def test_mismatched_collectives_raise(verify: str, path: str) -> None:
    """The fingerprints meet on the shared-memory board when every rank is
    on this host, through Gloo with TORCH_TPU_DIST_VERIFY=gloo, and through
    Gloo on every rank when one rank asks for it."""
    outs = launch("mismatch", 2, {"VERIFY_OF_RANK": verify, "CHECK_PATH": path})
    assert all("mismatch ok" in o for o in outs)


def case_verify_disagrees() -> None:
    os.environ["TORCH_TPU_DIST_VERIFY"] = "1" if os.environ["RANK"] == "0" else "0"
    import torch.distributed as dist

    with pytest.raises(dist.DistBackendError, match=r"TORCH_TPU_DIST_VERIFY must be on .* rank 0: 1, rank 1: 0"):
        _setup("tpu_dist")
    print("verify disagreement raised", flush=True)
    os._exit(0)


def test_verify_setting_that_differs_across_ranks_raises() -> None:
    """One rank checking collectives and another not would hang at the first
    exchange: the group's creation says so instead."""
    outs = launch("verify_disagrees", 2)
    assert all("verify disagreement raised" in o for o in outs)


@pytest.mark.parametrize("verify", ["1", "gloo"])
def test_dead_rank_raises(verify: str) -> None:
    outs = launch("dead_rank", 2, {"TORCH_TPU_DIST_VERIFY": verify}, expect_rc={1: 3})
    assert "dead rank raised" in outs[0]
    if verify == "1":  # the board names the rank at once, long before the group's timeout
        assert "rank 1 has exited" in outs[0], outs[0]


def test_silent_rank_times_out() -> None:
    outs = launch("silent_rank", 2, wait_ranks=[0], timeout=120)
    assert "silent rank timed out" in outs[0]


def test_registration_without_process_group() -> None:
    code = ("import torch, torch.distributed as dist\n"
            "assert dist.get_default_backend_for_device('tpu') == 'tpu_dist'\n"
            "assert 'tpu_dist' in dist.Backend.backend_list\n"
            "assert dist.Backend.backend_capability['tpu_dist'] == ['tpu']\n"
            "assert dist.is_backend_available('tpu_dist')\n"
            # what Ray Train's TorchConfig(backend='tpu_dist') calls first (idempotent)
            "import torch_tpu._loader; torch_tpu._loader.load()\n"
            "print('registered')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "registered" in r.stdout, r.stderr


def test_chips_follow_local_world_size() -> None:
    """torchrun's LOCAL_WORLD_SIZE sets the chips per process unless
    TPU_NUM_DEVICES is given; each process's pool gets its share of cores."""
    code = "import torch; print(torch.tpu.device_count(), torch.accelerator.device_count())"
    base = {k: v for k, v in os.environ.items() if k not in ("TPU_NUM_DEVICES", "LOCAL_WORLD_SIZE")}
    for env, want in (({"LOCAL_WORLD_SIZE": "3"}, "3 3"), ({"LOCAL_WORLD_SIZE": "3", "TPU_NUM_DEVICES": "1"}, "1 1"),
                      ({}, "1 1")):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**base, **env})
        assert r.returncode == 0 and r.stdout.split() == want.split(), (env, r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", "import torch; torch.ones(1, device='tpu')"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env={**base, "LOCAL_WORLD_SIZE": "x"})
    assert r.returncode != 0 and "LOCAL_WORLD_SIZE" in r.stderr, r.stderr


def test_is_initialized_follows_first_use() -> None:
    """As torch.cuda's: counting chips does not initialize the device, using
    one does (DeviceMesh picks tpu:LOCAL_RANK only before that)."""
    code = ("import torch\n"
            "assert torch.tpu.device_count() == 2 and torch.accelerator.is_available()\n"
            "assert not torch.tpu.is_initialized()\n"
            "torch.tpu.set_device(1)\n"
            "assert torch.tpu.is_initialized() and torch.tpu.current_device() == 1\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    code = "import torch\ntorch.ones(1, device='tpu')\nassert torch.tpu.is_initialized()\nprint('ok')\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


if __name__ == "__main__":
    globals()["case_" + os.environ["TORCH_TPU_TEST_CASE"]]()


@pytest.mark.parametrize("zero_copy", ["1", "0"])
def test_all_reduce_zero_copy(zero_copy: str) -> None:
    outs = launch("zero_copy", 2, {"TORCH_TPU_DIST_ZERO_COPY": zero_copy})
    assert all("zero copy ok" in o for o in outs), outs
