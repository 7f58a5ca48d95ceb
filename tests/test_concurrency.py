"""Concurrency: Python threads issuing ops on one chip and on two chips, in
strict and DeferAndFuse modes (every thread's results equal the CPU's); a
forked child that touches the device gets a clear error while the parent
keeps working; DataLoader workers with pin_memory=True feed the device."""
from __future__ import annotations

import threading

import pytest
import torch

import torch_tpu
from tests.conftest import rnd, run_python

THREADS = 4
STEPS = 12


def _work(seed: int, device: str, steps: int = STEPS) -> list[torch.Tensor]:
    """A small chain per step: products, elementwise, reductions, indexing,
    in-place updates through a view, a read to the host every few steps."""
    a = rnd((16, 24), seed=seed).to(device)
    w = rnd((24, 8), seed=seed + 1).to(device)
    idx = torch.arange(0, 16, 3, device=device)
    acc = torch.zeros(8, device=device)
    out = []
    for step in range(steps):
        h = torch.tanh(a @ w) * (step + 1)
        h[::2].add_(0.5)
        acc += h.index_select(0, idx).sum(0)
        a = a * 0.9 + h.mean() * 0.01
        if step % 4 == 3:
            out.append(acc.to("cpu", copy=True))   # a cut in defer mode, a wait in strict mode
    out.append(acc.cpu())
    out.append(a.cpu())
    return out


def _run_threads(devices: list[str], mode: str) -> None:
    expected = [_work(100 + i, "cpu") for i in range(THREADS)]
    results: list[object] = [None] * THREADS
    barrier = threading.Barrier(THREADS)

    def body(i: int) -> None:
        try:
            dev = devices[i % len(devices)]
            with torch.tpu.device(torch.device(dev).index or 0):
                barrier.wait()
                results[i] = _work(100 + i, dev)
        except BaseException as exc:  # reported by the main thread
            results[i] = exc

    with torch_tpu.execution_mode(mode):
        threads = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a thread hung"
    for i in range(THREADS):
        assert not isinstance(results[i], BaseException), f"thread {i}: {results[i]!r}"
        for got, exp in zip(results[i], expected[i]):
            torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_threads_one_device(mode):
    _run_threads(["tpu:0"], mode)
    torch.tpu.synchronize()


_TWO_CHIPS = """
import sys, torch, torch_tpu
sys.path.insert(0, {root!r})
from tests.test_concurrency import _run_threads
assert torch.tpu.device_count() == 2
for mode in ("strict", "defer"):
    _run_threads(["tpu:0", "tpu:1"], mode)
    print(mode, "ok", torch.tpu.memory_allocated(0) >= 0, torch.tpu.memory_allocated(1) >= 0)
"""


def test_threads_two_devices():
    from tests.conftest import ROOT
    r = run_python(_TWO_CHIPS.format(root=str(ROOT)), env={"TPU_NUM_DEVICES": "2"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "strict ok" in r.stdout and "defer ok" in r.stdout


_FORK = """
import os, sys, torch, torch_tpu
x = torch.ones(4, device="tpu") * 3
pid = os.fork()
if pid == 0:
    try:
        y = torch.ones(2, device="tpu")
        y.cpu()
        print("child: no error", flush=True)
        os._exit(3)
    except RuntimeError as e:
        print("child:", type(e).__name__, e, flush=True)
        os._exit(0)
    except BaseException as e:
        print("child: wrong class", type(e).__name__, e, flush=True)
        os._exit(4)
_, status = os.waitpid(pid, 0)
print("parent:", (x * 2).sum().item(), os.waitstatus_to_exitcode(status), flush=True)
"""


def test_forked_child_gets_a_clear_error():
    r = run_python(_FORK)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    child = next(line for line in lines if line.startswith("child:"))
    assert child.startswith("child: RuntimeError") and "fork" in child, child
    assert lines[-1] == "parent: 24.0 0", r.stdout


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.full((5,), float(i)), torch.tensor(i * i)


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_dataloader_workers_pin_memory(mode):
    torch.ones(1, device="tpu").cpu()   # the device is initialized before the workers fork
    loader = torch.utils.data.DataLoader(_Squares(), batch_size=8, num_workers=2, pin_memory=True)
    total = torch.zeros((), device="tpu")
    seen = 0
    with torch_tpu.execution_mode(mode):
        for xb, yb in loader:
            assert xb.is_pinned() and yb.is_pinned()
            xd = xb.to("tpu", non_blocking=True)
            yd = yb.to("tpu", non_blocking=True)
            total = total + xd.sum() + yd.sum()
            seen += xb.shape[0]
        result = total.item()
    assert seen == 64
    assert result == sum(5 * i + i * i for i in range(64))
