"""DeferAndFuse: mode selection, every cut reason with its source line,
plan reuse across training steps, intermediates that never take memory,
views / in-place / aliasing, RNG and autograd parity with strict mode,
error attribution. (The kernel tests also run in this mode: conftest.py.)"""
from __future__ import annotations

import gc
import inspect
import io
import json

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu._internal import execution_mode as em
from tests.conftest import run_python

HERE = __file__.rsplit("/", 1)[-1]


def line_of_next() -> int:
    """Line number of the caller's next line."""
    return inspect.currentframe().f_back.f_lineno + 1


@pytest.fixture
def defer():
    previous = torch_tpu.set_execution_mode("defer")
    torch.tpu.reset_defer_stats()
    yield
    torch_tpu.set_execution_mode(previous)


def last_flush() -> dict:
    return torch.tpu.defer_stats()["recent_flushes"][0]


# ------------------------------------------------------------------ modes


def test_mode_api_round_trip():
    assert torch_tpu.get_execution_mode() == "strict"
    assert em.get_eager_mode() is em.EagerMode.DEFER_NEVER
    with em.eager_mode(em.EagerMode.DEFER_AND_FUSE):
        assert torch_tpu.get_execution_mode() == "defer"
        with torch_tpu.execution_mode("debug"):
            assert em.eager_mode() is em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
            assert torch_tpu._C._launch_blocking()
        assert torch_tpu.get_execution_mode() == "defer"
        assert not torch_tpu._C._launch_blocking()
    assert torch_tpu.get_execution_mode() == "strict"
    assert torch_tpu.set_execution_mode("defer") == "strict"
    assert em.set_eager_mode("DEFER_NEVER") is em.EagerMode.DEFER_AND_FUSE
    with pytest.raises(ValueError, match="unknown execution mode 'fast'"):
        torch_tpu.set_execution_mode("fast")


def test_environment_selects_mode():
    code = "import torch, torch_tpu; print(torch_tpu.get_execution_mode())"
    assert run_python(code, {"TORCH_TPU_DEFER_AND_FUSE": "1"}).stdout.strip() == "defer"
    assert run_python(code, {"TPU_LAUNCH_BLOCKING": "1"}).stdout.strip() == "debug"
    assert run_python(code, {"TORCH_TPU_DEFER_AND_FUSE": "1", "TPU_LAUNCH_BLOCKING": "1"}).stdout.strip() == "debug"
    bad = run_python(code, {"TORCH_TPU_DEFER_AND_FUSE": "maybe"})
    assert bad.returncode != 0 and "TORCH_TPU_DEFER_AND_FUSE" in bad.stderr


# --------------------------------------------------------------- cut reasons


def test_cut_reasons_and_sites(defer, tmp_path):
    a = torch.arange(6.0, device="tpu")
    expect = torch.arange(6.0)

    (a * 2).sum().item(); line = inspect.currentframe().f_lineno  # noqa: E702
    r = last_flush()
    assert r["reason"] == "item" and r["site"].endswith(f"/{HERE}:{line}")

    if (a + 1).sum() > 0:  # Python control flow on a device value
        line = inspect.currentframe().f_lineno - 1
    assert last_flush()["reason"] == "item" and last_flush()["site"].endswith(f"/{HERE}:{line}")

    assert torch.equal((a - 1).cpu(), expect - 1)
    assert last_flush()["reason"] == "to_host"
    assert (a * 3).tolist() == (expect * 3).tolist()
    assert last_flush()["reason"] == "to_host"

    text = repr(a / 2)
    assert "tensor([0.0000, 0.5000" in text and last_flush()["reason"] == "print"

    buf = io.BytesIO()
    torch.save(a + 5, buf)
    assert last_flush()["reason"] == "save"
    buf.seek(0)
    assert torch.equal(torch.load(buf).cpu(), expect + 5)

    b = a * 7
    torch.tpu.synchronize()
    assert last_flush()["reason"] == "synchronize"
    b = b + 1
    ev = torch.tpu.Event()
    ev.record()
    assert last_flush()["reason"] == "event"
    b = b + 1
    torch_tpu.flush()
    assert last_flush()["reason"] == "explicit"
    assert torch.equal(b.cpu(), expect * 7 + 2)

    c = a + 1
    torch_tpu.set_execution_mode("strict")
    assert last_flush()["reason"] == "mode"
    torch_tpu.set_execution_mode("defer")
    assert torch.equal(c.cpu(), expect + 1)

    torch_tpu._C._set_defer_max_ops(32)
    try:
        x = torch.zeros(4, device="tpu")
        for _ in range(100):
            x = x + 1
        flushes = torch.tpu.defer_stats()["flushes"]
        # the first cut is the cap; then the period of the ops is known and
        # later graphs are whole periods (loop detection), reusing one plan
        assert flushes["size_cap"] == 1 and flushes["loop"] >= 2, flushes
        assert torch.equal(x.cpu(), torch.full((4,), 100.0))
    finally:
        torch_tpu._C._set_defer_max_ops(8192)
    flushes = torch.tpu.defer_stats()["flushes"]
    for reason in ("item", "to_host", "print", "save", "synchronize", "event", "explicit", "mode", "size_cap",
                   "loop"):
        assert flushes[reason] >= 1, reason


def test_item_with_nothing_pending_does_not_name_a_later_cut():
    a = torch.ones(2, device="tpu")
    assert a.sum().item() == 2.0  # strict: no graph takes the .item() hint
    with torch_tpu.execution_mode("defer"):
        b = a + 1
        assert b.sum().item() == 4.0
        assert last_flush()["reason"] == "item"
        s = a.sum()
        torch_tpu.flush()
        assert s.item() == 2.0  # in defer, with nothing pending
        c = a * 3
        torch.tpu.synchronize()
        assert last_flush()["reason"] == "synchronize"
    assert torch.equal(c.cpu(), torch.full((2,), 3.0))


def test_side_stream_use_is_ordered(defer):
    a = torch.arange(1000.0, device="tpu") * 2
    s = torch.tpu.Stream()
    s.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(s):
        b = a + 1
    torch.tpu.current_stream().wait_stream(s)
    assert torch.equal(b.cpu(), torch.arange(1000.0) * 2 + 1)
    assert torch.tpu.defer_stats()["flushes"]["event"] >= 1


# --------------------------------------------------------- plans and memory


def _train(steps: int, mode: str, clip: bool = False, scaled: bool = False):
    """Losses, graphs built after each step and final parameters of a small
    training loop (AdamW, the lr changing between steps). clip: gradients
    clipped before the step; scaled: SGD with momentum under GradScaler and
    bfloat16 autocast instead."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
    if scaled:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # lr changes between steps
    scaler = torch.amp.GradScaler("tpu", init_scale=2.0**10, enabled=scaled)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(8, 16, generator=g) for _ in range(steps)]
    ys = [torch.randint(0, 4, (8,), generator=g) for _ in range(steps)]
    losses, graphs = [], []
    with torch_tpu.execution_mode(mode):
        for x, y in zip(xs, ys):
            opt.zero_grad()
            with torch.autocast("tpu", dtype=torch.bfloat16, enabled=scaled):
                loss = F.cross_entropy(model(x.to("tpu")), y.to("tpu"))
            scaler.scale(loss).backward()
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # _foreach_mul_ by a device scalar
            scaler.step(opt)
            scaler.update()
            sched.step()
            losses.append(loss.item())
            graphs.append(torch.tpu.defer_stats()["graphs_built"])
    return losses, graphs, [p.detach().cpu() for p in model.parameters()]


def _train_as_strict(steps: int) -> tuple[list[int], dict]:
    """Trains in strict then in defer mode, checks that both give the same
    losses and parameters; graphs built after each defer step, defer stats."""
    strict_losses, _, strict_params = _train(steps, "strict")
    torch.tpu.reset_defer_stats()
    defer_losses, graphs, defer_params = _train(steps, "defer")
    torch.testing.assert_close(defer_losses, strict_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(defer_params, strict_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    return graphs, torch.tpu.defer_stats()


def test_training_loop_reuses_cached_graphs():
    graphs, stats = _train_as_strict(8)
    # after warm-up no new graph is built: every step hits the cache
    assert graphs[-1] == graphs[3], graphs
    assert stats["cache_hits"] >= 4 and stats["flushes"]["item"] == 8


# ------------------------------------------------------ early execution


def _early() -> tuple[int, int, int]:
    s = torch.tpu.defer_stats()
    return s["early_steps"], s["early_graphs"], s["early_discarded"]


class _Step:
    """A small language-model training step on tpu (embedding, layer norm,
    linear + GELU + dropout, cross entropy, AdamW): its parameters,
    optimizer and a persistent counter buffer, all from seed 0."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(40, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 64),
                                         torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 40)).to("tpu")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, 40, (8, 16), generator=g)
        self.y = torch.randint(0, 40, (8, 16), generator=g)
        self.count = torch.zeros(4, device="tpu")

    def __call__(self, *, double: bool = False, keep: bool = False, bump: bool = False):
        # the batch comes first, as in a training loop: the step's graph has begun when zero_grad
        # drops the last gradients (recorded frees of memory from outside the graph)
        x, y = self.x.to("tpu"), self.y.to("tpu")
        self.opt.zero_grad(set_to_none=True)
        h = self.model[:3](x)
        if bump:
            self.count.add_(1)  # memory from outside the graph, changed mid-step
        logits = self.model[3:](h)
        loss = F.cross_entropy(logits.reshape(-1, 40), y.reshape(-1))
        if double:
            loss = loss * 2
        loss.backward()
        self.opt.step()
        kept = h if keep else None
        del h, logits  # (kept: a value of the graph the user still holds at its cut)
        return loss.item(), kept


def _run_steps(mode: str, early: str, monkeypatch, variants: list[dict]):
    monkeypatch.setenv("TORCH_TPU_DEFER_EARLY", early)
    with torch_tpu.execution_mode(mode):
        step = _Step()
        torch.manual_seed(7)
        out = [step(**v) for v in variants[:2]]
        # (counted from here: the stream's first graphs may be predicted from an earlier loop's)
        torch.tpu.reset_defer_stats()
        out += [step(**v) for v in variants[2:]]
        torch_tpu.flush()
        params = [p.detach().cpu() for p in step.model.parameters()]
        return out, params, step.count.cpu(), _early()


@pytest.mark.parametrize("case", ["same", "diverges", "keeps", "outside", "outside, diverges"])
def test_a_repeating_step_runs_while_the_next_is_recorded(monkeypatch, case):
    # once two steps ran the same plan, the next step's kernels start as its
    # ops are recorded; a step that turns out different (an op more, a value
    # the user keeps) discards the early work and runs whole: results are
    # bit for bit those of no early execution, and memory from outside the
    # graph is never changed early (the counter is bumped once a step)
    last = {"same": {}, "diverges": {"double": True}, "keeps": {"keep": True}, "outside": {"bump": True},
            "outside, diverges": {"bump": True, "double": True}}[case]
    first = {"bump": True} if case.startswith("outside") else {}
    variants = [dict(first) for _ in range(5)] + [last]
    got, params, count, (steps, graphs, discarded) = _run_steps("defer", "1", monkeypatch, variants)
    ref, ref_params, ref_count, (ref_steps, ref_graphs, _) = _run_steps("defer", "0", monkeypatch, variants)
    assert ref_steps == 0 and ref_graphs == 0
    assert [g[0] for g in got] == [r[0] for r in ref]
    for a, b in zip(params, ref_params):
        assert torch.equal(a, b)
    if case == "keeps":
        assert torch.equal(got[-1][1].cpu(), ref[-1][1].cpu())
    assert torch.equal(count, ref_count) and count[0].item() == (6 if first else 0)
    assert steps > 0 and graphs >= 2
    assert discarded == (1 if case in ("diverges", "keeps", "outside, diverges") else 0)
    strict, strict_params, _, _ = _run_steps("strict", "1", monkeypatch, variants)
    torch.testing.assert_close([g[0] for g in got], [r[0] for r in strict], rtol=1e-5, atol=1e-6)


@pytest.fixture
def segments():
    torch_tpu._C._set_defer_segment_ops(8)
    yield
    torch_tpu._C._set_defer_segment_ops(0)


def test_segments_pipeline_a_training_loop_through_cached_graphs(segments):
    graphs, stats = _train_as_strict(8)
    # once two steps had the same length, every step is cut into 8-op
    # segments counted from its loss.item(), so every step maps to the same
    # segments: no graph is built after warm-up
    assert graphs[-1] == graphs[4], graphs
    assert stats["flushes"]["item"] == 8 and stats["flushes"]["segment"] >= 5 * 3, \
        (stats["flushes"], stats["recent_flushes"][:12])
    assert all(f["ops"] <= 8 for f in stats["recent_flushes"][:12]), stats["recent_flushes"][:12]
    assert [f["reason"] for f in stats["recent_flushes"][:2]] == ["item", "segment"]


def _cut_after(ops: int, x: torch.Tensor) -> torch.Tensor:
    for _ in range(ops):
        x = x + 1
    torch.tpu.synchronize()
    return x


def test_segments_only_after_two_equal_intervals_between_cuts(defer, segments):
    x = torch.zeros(4, device="tpu")
    x = _cut_after(20, x)  # the first interval
    x = _cut_after(30, x)  # not the same length: no segments next time
    torch.tpu.reset_defer_stats()
    x = _cut_after(30, x)  # 30 == 30: segments from the next interval on
    assert torch.tpu.defer_stats()["flushes"]["segment"] == 0
    x = _cut_after(30, x)
    assert torch.tpu.defer_stats()["flushes"]["segment"] == 3  # at 8, 16, 24 ops
    assert torch.equal(x.cpu(), torch.full((4,), 110.0))


def test_segments_end_past_the_size_cap_and_loop_detection_takes_over(defer, segments):
    torch_tpu._C._set_defer_max_ops(32)
    try:
        x = torch.zeros(4, device="tpu")
        x = _cut_after(10, _cut_after(10, _cut_after(10, x)))  # two equal intervals: segments on
        torch.tpu.reset_defer_stats()
        for _ in range(180):
            x = x + 1
        stats = torch.tpu.defer_stats()
        # segments at 8, 16, 24, 32 ops after the last program cut; then one
        # graph to the size cap, whose period gives the loop length
        assert stats["flushes"]["segment"] == 4, stats["flushes"]
        assert stats["flushes"]["size_cap"] == 1 and stats["flushes"]["loop"] >= 3, stats["flushes"]
        assert stats["graphs_built"] <= 4, stats
        assert torch.equal(x.cpu(), torch.full((4,), 210.0))
        # the interval was not like the last one: no segments after the cut
        x = _cut_after(20, x)
        assert last_flush()["reason"] == "synchronize"
        torch.tpu.reset_defer_stats()
        x = _cut_after(20, x)  # 20 == 20: segments come back for the next one
        x = _cut_after(20, x)
        assert torch.tpu.defer_stats()["flushes"]["segment"] == 2
        assert torch.equal(x.cpu(), torch.full((4,), 270.0))
    finally:
        torch_tpu._C._set_defer_max_ops(8192)


def test_segment_length_from_the_environment():
    code = "import torch, torch_tpu; print(torch_tpu._C._get_defer_segment_ops())"
    assert run_python(code).stdout.strip() == "0"
    assert run_python(code, {"TORCH_TPU_DEFER_SEGMENT_OPS": "48"}).stdout.strip() == "48"
    bad = run_python(code, {"TORCH_TPU_DEFER_SEGMENT_OPS": "many"})
    assert bad.returncode != 0 and "TORCH_TPU_DEFER_SEGMENT_OPS='many' is invalid" in bad.stderr


def _peak_of(fn) -> int:
    # from an empty cache: a request the caching allocator serves from a
    # larger cached block (left unsplit when the rest is small) counts the
    # whole block, so what earlier tests left cached would move the peak.
    # Earlier tests' garbage is collected first and no collection runs
    # inside the measurement: one that freed an old tensor there would move
    # the blocks later requests land in (a fresh-clone run once read a
    # batch-norm recompute peak 2 MiB above this test's usual reading)
    gc.collect()
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    gc.disable()
    try:
        out = fn()
        torch.tpu.synchronize()
    finally:
        gc.enable()
    return torch.tpu.max_memory_allocated() - base, out


def test_intermediates_never_take_memory():
    x = torch.randn(1 << 20, device="tpu")

    def chain():
        return (torch.sigmoid(torch.tanh(x * 2 + 1) * x) - 0.5).sum().item()

    strict_peak, strict_val = _peak_of(chain)
    with torch_tpu.execution_mode("defer"):
        torch.tpu.reset_defer_stats()
        defer_peak, defer_val = _peak_of(chain)
        stats = torch.tpu.defer_stats()
    assert defer_val == pytest.approx(strict_val, rel=1e-5)
    assert stats["bytes_never_materialized"] >= 5 * (1 << 22)
    assert stats["stores_eliminated"] >= 5
    # strict holds two 4 MiB temporaries at once; defer only the input of
    # the sum (the five temporaries before it never take memory)
    assert strict_peak >= 2 * (4 << 20)
    assert defer_peak <= (4 << 20) + 4096


def test_fusion_merges_elementwise_chain(defer):
    a = torch.randn(1000, device="tpu")
    b = torch.randn(1000, device="tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    out = F.gelu(a * b + a).sub(b).relu()
    got = out.cpu()
    stats = torch.tpu.defer_stats()
    ac, bc = a.cpu(), b.cpu()
    torch.testing.assert_close(got, F.gelu(ac * bc + ac).sub(bc).relu())
    assert stats["kernels_launched"] == 1 and stats["fused_kernels"] == 1
    assert stats["ops_fused"] == 5


def test_dropout_fuses_with_its_neighbours(defer):
    # dropout draws its mask inside an elementwise program: scale, dropout
    # and the (broadcast) add become one kernel, with strict's numbers — the
    # three ops' views arrive coalesced differently ([8192], [4, 16, 128],
    # [64, 128]): the group runs over their common refinement
    x = torch.randn(4, 16, 128, device="tpu")
    r = torch.randn(128, device="tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    torch.manual_seed(5)
    got = (F.dropout(x * 2, 0.2, training=True) + r).cpu()
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 1 and stats["fused_kernels"] == 1
    with torch_tpu.execution_mode("strict"):
        torch.manual_seed(5)
        ref = (F.dropout(x * 2, 0.2, training=True) + r).cpu()
    assert torch.equal(got, ref)


def test_linear_bias_fuses_with_the_activation(defer):
    # addmm = product, then the bias add as an elementwise op that joins
    # the activation after it: two kernels, strict's numbers
    x = torch.randn(64, 32, device="tpu")
    w = torch.randn(48, 32, device="tpu")
    b = torch.randn(48, device="tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    got = F.gelu(F.linear(x, w, b)).cpu()
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 2 and stats["fused_kernels"] == 1
    with torch_tpu.execution_mode("strict"):
        ref = F.gelu(F.linear(x, w, b)).cpu()
    assert torch.equal(got, ref)
    torch.testing.assert_close(got, F.gelu(F.linear(x.cpu(), w.cpu(), b.cpu())))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copies_that_fuse_only_with_each_other_run_as_copy_kernels(defer, dtype):
    # attention's head transposes: three copies of views of one tensor share
    # no computation; each runs as a launch of the copy kernel (as in strict
    # mode), not as one interpreted program, with strict's bits
    x = torch.randn(4, 16, 3 * 32, device="tpu").to(dtype)
    torch_tpu.flush()

    def heads():
        q, k, v = x.split(32, dim=2)
        return [t.view(4, 16, 2, 16).transpose(1, 2).contiguous() for t in (q, k, v)]

    torch.tpu.reset_defer_stats()
    got = [t.cpu() for t in heads()]
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 3 and stats["fused_kernels"] == 0
    with torch_tpu.execution_mode("strict"):
        ref = [t.cpu() for t in heads()]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    # a copy that changes the dtype is computed: it stays in the fused program
    x, other = x.float(), torch.bfloat16
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    y, z = x.transpose(1, 2).contiguous(), x.transpose(1, 2).to(other)
    got = (y.cpu(),)
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 1 and stats["fused_kernels"] == 1
    got += (z.cpu(),)
    xc = x.cpu()
    assert torch.equal(got[0], xc.transpose(1, 2).contiguous())
    assert torch.equal(got[1], xc.transpose(1, 2).to(other))


def _rope(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def test_copies_in_another_order_join_the_group_that_computes_their_input(defer):
    # RoPE on a head-transposed projection: the arithmetic runs in the
    # projection's [batch, token, head, pair] order (its outputs allocated in
    # its input's layout), the stack writes [batch, head, token, pair, 2]; the
    # two copies walk the same elements in another order and join the group
    # with their dims reordered — one kernel where there were three, strict's
    # bits (float32: copies within bfloat16 move bytes, copy.c)
    h = torch.randn(4, 16, 3, 8, device="tpu")
    cos = torch.randn(16, 4, device="tpu")
    sin = torch.randn(16, 4, device="tpu")
    torch_tpu.flush()

    def f():
        return _rope(h.transpose(1, 2), cos, sin)

    torch.tpu.reset_defer_stats()
    got = f().cpu()
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 1 and stats["fused_kernels"] == 1, stats
    with torch_tpu.execution_mode("strict"):
        ref = f().cpu()
    assert torch.equal(got, ref)
    torch.testing.assert_close(got, _rope(h.cpu().transpose(1, 2), cos.cpu(), sin.cpu()))
    # a transpose's copy after the op that computes its input: one kernel
    torch.tpu.reset_defer_stats()
    got = (h.exp() * 3).transpose(1, 2).contiguous().cpu()
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 1, stats
    torch.testing.assert_close(got, (h.cpu().exp() * 3).transpose(1, 2).contiguous())


def test_random_draws_keep_their_order_when_read_transposed(defer):
    # dropout of a transposed value draws its mask in its own row-major
    # order: it must not join the group in the writer's order (other bits)
    x = torch.randn(4, 16, 3, 8, device="tpu")
    torch_tpu.flush()

    def f():
        torch.manual_seed(11)
        return F.dropout((x * 2).transpose(1, 2), 0.3, training=True).cpu()

    got = f()
    with torch_tpu.execution_mode("strict"):
        ref = f()
    assert torch.equal(got, ref)


def test_permuted_members_only_join_groups_that_run_generated_code(defer):
    # one compute op and a transpose's copy: the interpreter would walk the
    # group's short rows slower than the add and the copy kernel apart
    h = torch.randn(4, 16, 3, 8, device="tpu")
    g = torch.randn(4, 16, 3, 8, device="tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    got = (h + g).transpose(1, 2).contiguous().cpu()
    assert torch.tpu.defer_stats()["kernels_launched"] == 2
    assert torch.equal(got, (h.cpu() + g.cpu()).transpose(1, 2).contiguous())


def test_permuted_members_are_off_with_the_setting(monkeypatch):
    # TORCH_TPU_DEFER_PERMUTE=0, or no generated kernels (TORCH_TPU_CODEGEN=0):
    # the copy runs apart (the plan key changes with both)
    code = """
import torch, torch_tpu
h = torch.randn(4, 16, 3, 8, device="tpu")
torch_tpu.flush()
with torch_tpu.execution_mode("defer"):
    torch.tpu.reset_defer_stats()
    (h * 2 + 1).transpose(1, 2).contiguous().cpu()
    print("kernels", torch.tpu.defer_stats()["kernels_launched"])
"""
    on = run_python(code)
    off = run_python(code, env={"TORCH_TPU_DEFER_PERMUTE": "0"})
    interpreted = run_python(code, env={"TORCH_TPU_CODEGEN": "0"})
    assert "kernels 1" in on.stdout, on.stdout + on.stderr
    assert "kernels 2" in off.stdout, off.stdout + off.stderr
    assert "kernels 2" in interpreted.stdout, interpreted.stdout + interpreted.stderr


def test_ops_of_equal_size_fuse_over_a_common_shape(defer):
    # one element in three shapes ([1], 0-dim, [1, 1, 1]) and [1, 1, 3] next to [3]
    a = torch.tensor([5.0], device="tpu")
    b = torch.tensor(3.0, device="tpu")
    torch.testing.assert_close((torch.minimum(a, b) + torch.ones(1, 1, 1, device="tpu")).cpu(),
                               torch.tensor([[[4.0]]]))
    torch.testing.assert_close((torch.ones(1, 1, 3, device="tpu") * 2 + torch.ones(3, device="tpu")).cpu(),
                               torch.full((1, 1, 3), 3.0))
    # [6, 2] and [4, 3] strided views: 12 elements each, no shape refines both
    p = torch.arange(18.0).view(6, 3).to("tpu")
    q = torch.arange(16.0).view(4, 4).to("tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    x = p[:, :2] * 2
    y = q[:, :3] + 1
    z = x.reshape(4, 3) - y
    torch.testing.assert_close(z.cpu(), (torch.arange(18.0).view(6, 3)[:, :2] * 2).reshape(4, 3)
                               - (torch.arange(16.0).view(4, 4)[:, :3] + 1))


def test_ops_hoisted_before_the_open_group_fuse_with_each_other(defer):
    # ops of another size that neither read nor write what the open group
    # touches run before it — as one group of their own, not one kernel each
    # (a RoPE backward's arithmetic over the query while the key's gradient
    # sums are open)
    x = torch.randn(1000, device="tpu")
    z = torch.randn(500, device="tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    a = x * 2
    w = ((z + 1) * 3).neg()
    b = a + 1
    got = (b.cpu(), w.cpu())
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 2 and stats["fused_kernels"] == 2, stats
    assert torch.equal(got[0], x.cpu() * 2 + 1)
    assert torch.equal(got[1], ((z.cpu() + 1) * 3).neg())


def _swiglu(x, wg, wu):
    g = x @ wg
    h = torch.nn.functional.silu(g)
    u = x @ wu  # recorded while the SiLU's group is open; reads nothing it writes
    return h * u


@pytest.mark.parametrize("hoist", ["1", "0"])
def test_products_independent_of_the_open_group_run_before_it(defer, monkeypatch, hoist):
    # SwiGLU: gate projection, SiLU, up projection, silu(gate) * up — the up
    # projection runs before the SiLU's group, so the SiLU and the product
    # are one kernel (TORCH_TPU_DEFER_HOIST_PRODUCTS=0: a kernel each)
    monkeypatch.setenv("TORCH_TPU_DEFER_HOIST_PRODUCTS", hoist)
    torch.manual_seed(0)
    x, wg, wu = torch.randn(64, 32), torch.randn(32, 48), torch.randn(32, 48)
    ref = _swiglu(x, wg, wu)
    xt, wgt, wut = x.to("tpu"), wg.to("tpu"), wu.to("tpu")
    with torch_tpu.execution_mode("strict"):
        strict = _swiglu(xt, wgt, wut).cpu()
    from torch_tpu import profiler

    torch_tpu.flush()
    torch.tpu.synchronize()
    with profiler.profile() as prof:
        got = _swiglu(xt, wgt, wut).cpu()
    names = {k.base_name for k in prof.kernels}
    # (with TORCH_TPU_DEFER_EPILOGUE=1 the group runs in the up projection's kernel: gemm+fused(silu,mul))
    assert any("fused(silu,mul)" in n for n in names) == (hoist == "1"), names
    assert torch.equal(got, strict)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_products_that_read_the_open_group_wait_for_it_to_close(defer):
    # a product reading the open group's output runs after the group, and
    # ops recorded after it that touch nothing it writes and write nothing
    # it reads still join the group; one that reads its result, or writes
    # an operand it has yet to read, closes the group first
    from torch_tpu import profiler

    torch.manual_seed(0)
    x, w = torch.randn(32, 16, device="tpu"), torch.randn(16, 8, device="tpu")
    xc, wc = x.cpu(), w.cpu()
    torch_tpu.flush()
    torch.tpu.synchronize()
    with profiler.profile() as prof:
        y = x * 2
        p = y @ w          # waits for the group
        z = y.exp()        # joins it
        q = p + 1          # reads the product: after it
        w.add_(1)          # writes an operand of the product: after it
        got = [t.cpu() for t in (y, z, q, w)]
    names = [k.base_name for k in prof.kernels]
    assert "fused(mul,exp)" in names, names
    want = [xc * 2, (xc * 2).exp(), (xc * 2) @ wc + 1, wc + 1]
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_products_that_touch_the_open_group_s_memory_stay_in_order(defer):
    # a product writing what the open group reads, or reading what it
    # writes, keeps its place (the group runs first)
    torch.manual_seed(0)
    a, b = torch.randn(16, 16, device="tpu"), torch.randn(16, 16, device="tpu")
    x = torch.randn(16, 16, device="tpu")
    ac, bc, xc = a.cpu(), b.cpu(), x.cpu()
    torch_tpu.flush()
    y = x.exp()
    torch.mm(a, b, out=x)       # overwrites the group's input
    y2 = y + 1
    z = y2 * 2
    w = torch.mm(z, b)          # reads the group's output
    z2 = z - 1
    got = [t.cpu() for t in (y2, x, w, z2)]
    y2r = xc.exp() + 1
    want = [y2r, ac @ bc, (y2r * 2) @ bc, y2r * 2 - 1]
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_mask_computed_between_two_ops_does_not_split_their_kernel(defer):
    # attention's pattern: scores * scale, a mask of another shape, then
    # masked_fill: the mask's op runs first, scale + fill become one kernel
    s = torch.randn(8, 4, 16, 16, device="tpu")
    m = torch.rand(16, 16, device="tpu") > 0.5
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    got = (s * 0.25).masked_fill(~m, float("-inf")).cpu()
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 2 and stats["fused_kernels"] == 1
    torch.testing.assert_close(got, (s.cpu() * 0.25).masked_fill(~m.cpu(), float("-inf")))
    # nodes that read what the open group writes, or write what it reads,
    # are not moved before it
    a = s + 0
    y = a * 2
    t = y[0, 0] + 1        # other shape, reads y
    a[1, 1].add_(5)        # other shape, writes what y's group read
    y2 = y + 1
    ref = s.cpu() * 2
    torch.testing.assert_close(t.cpu(), ref[0, 0] + 1)
    torch.testing.assert_close(y2.cpu(), ref + 1)
    torch.testing.assert_close(a[1, 1].cpu(), s.cpu()[1, 1] + 5)


# ------------------------------------------------------ rematerialization


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.out(F.dropout(F.gelu(self.fc(x)), 0.1, training=True))


class _NormBlock(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.fc = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class _ConvBlock(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class _GluBlock(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w1, self.w3 = torch.nn.Linear(d, 2 * d, bias=False), torch.nn.Linear(d, 2 * d, bias=False)
        self.w2 = torch.nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return x + self.w2(F.silu(self.w1(x)) * self.w3(x))


def _step(mode: str, block, width: int, shape):
    """Peak bytes, loss and gradients of one forward + backward of 4 blocks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[block(width) for _ in range(4)]).to("tpu")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to("tpu")

    def step():
        with torch_tpu.execution_mode(mode):
            torch.manual_seed(7)
            loss = model(x).square().mean()
            loss.backward()
            return loss.item()

    peak, loss = _peak_of(step)
    return peak, loss, [p.grad.cpu() for p in model.parameters()]


@pytest.mark.parametrize("block, width, shape, saved", [
    # dropout output (2 MiB) and mask per block, kept for the second linear's weight gradient
    (_Block, 128, (1024, 128), 2 << 20),
    # layer-norm output (2 MiB) per block, kept for the linear's weight gradient
    (_NormBlock, 256, (2048, 256), 2 << 20),
    # batch norm + ReLU output (2 MiB) per block, kept for the next convolution's weight gradient
    (_ConvBlock, 32, (8, 32, 32, 64), 2 << 20),
    # SiLU output and the SwiGLU product (2 MiB each) per block: the product
    # is recomputed from the SiLU output's recomputed copy (a chain)
    (_GluBlock, 128, (2048, 128), 4 << 20),
], ids=["dropout", "layer_norm", "batch_norm_relu", "swiglu_chain"])
def test_saved_activations_are_recomputed_for_the_backward_pass(block, width, shape, saved):
    # a value the forward pass stores for the backward pass is released
    # after its forward readers and recomputed (from the activation's saved
    # input / the normalization's input and statistics) just before the
    # backward pass reads it: lower peak, strict's bits. Measured in a fresh
    # interpreter: blocks that earlier tests leave in the caching allocator
    # (where later requests land) must not move the peaks compared here
    code = f"""
import json, os, torch, torch_tpu
from tests import test_defer as T
block, width, shape = T.{block.__name__}, {width}, {shape!r}
_, s_loss, s_grads = T._step("strict", block, width, shape)
os.environ["TORCH_TPU_DEFER_REMAT"] = "0"
torch.tpu.reset_defer_stats()
k_peak, k_loss, k_grads = T._step("defer", block, width, shape)
k_rec = torch.tpu.defer_stats()["values_recomputed"]
os.environ["TORCH_TPU_DEFER_REMAT"] = "1"
torch.tpu.reset_defer_stats()
r_peak, r_loss, r_grads = T._step("defer", block, width, shape)
st = torch.tpu.defer_stats()
same = all(torch.equal(a, c) and torch.equal(b, c) for a, b, c in zip(r_grads, k_grads, s_grads))
print(json.dumps(dict(kept_peak=k_peak, remat_peak=r_peak, kept_recomputed=k_rec,
                      recomputed=st["values_recomputed"], bytes=st["bytes_recomputed"],
                      losses=[s_loss, k_loss, r_loss], same_grads=same)))
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["kept_recomputed"] == 0
    assert r["recomputed"] >= 2 and r["bytes"] >= 2 * saved, r
    strict_loss, kept_loss, remat_loss = r["losses"]
    assert remat_loss == kept_loss == strict_loss
    assert r["same_grads"]
    # 4 blocks (the last one's backward comes first: too close to recompute),
    # less the copy that is alive
    assert r["remat_peak"] <= r["kept_peak"] - 2 * saved, r


def test_dropout_output_is_recomputed_from_its_mask_without_drawing_again():
    # the forward pass keeps the dropout mask for the backward pass; the
    # dropout output (read again by the weight gradient) is recomputed from
    # that mask - no random numbers drawn a second time - and the step has
    # strict's bits (TORCH_TPU_DEFER_DEBUG prints each kernel's instructions)
    code = """
import torch, torch.nn.functional as F, torch_tpu
from tests.test_defer import _Block, _step
_, s_loss, s_grads = _step("strict", _Block, 128, (1024, 128))
_, d_loss, d_grads = _step("defer", _Block, 128, (1024, 128))
assert d_loss == s_loss and all(torch.equal(a, b) for a, b in zip(d_grads, s_grads))
print("same")
"""
    out = run_python(code, {"TORCH_TPU_DEFER_DEBUG": "1", "TORCH_TPU_DEFER_REMAT": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "same", out.stderr[-3000:]
    groups = [ln for ln in out.stderr.splitlines() if "step group" in ln]
    forward = [ln for ln in groups if "native_dropout" in ln and "recompute(" not in ln
               and "native_dropout_backward" not in ln]
    # recomputed dropout outputs (x * keep * scale): the mask may be recomputed
    # first on its own (uniform, ge), the output only reads it
    outputs = [ln for ln in groups if "recompute(" in ln and "native_dropout" in ln and " mul" in ln]
    assert forward and all(" uniform" in ln for ln in forward), forward  # the forward draws the mask
    assert outputs, groups
    assert all(" uniform" not in ln for ln in outputs), outputs


def test_batch_norm_and_relu_are_one_kernel_after_the_statistics(defer):
    x = torch.randn(4, 8, 6, 6, device="tpu")
    w, b = torch.rand(8, device="tpu") + 0.5, torch.randn(8, device="tpu")
    rm, rv = torch.zeros(8, device="tpu"), torch.ones(8, device="tpu")
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    got = F.relu(F.batch_norm(x, rm, rv, w, b, training=True)).cpu()
    stats = torch.tpu.defer_stats()
    assert stats["kernels_launched"] == 2 and stats["fused_kernels"] == 1
    with torch_tpu.execution_mode("strict"):
        rm2, rv2 = torch.zeros(8, device="tpu"), torch.ones(8, device="tpu")
        ref = F.relu(F.batch_norm(x, rm2, rv2, w, b, training=True)).cpu()
    assert torch.equal(got, ref)
    assert torch.equal(rm.cpu(), rm2.cpu()) and torch.equal(rv.cpu(), rv2.cpu())
    xc = x.cpu()
    torch.testing.assert_close(got, F.relu(F.batch_norm(xc, torch.zeros(8), torch.ones(8), w.cpu(), b.cpu(),
                                                        training=True)))


def _optimizer_run(mode: str, opt_name: str, dtype, steps: int = 3):
    """Parameters, optimizer state and the last step's defer stats of a few
    optimizer steps on fixed gradients (the step alone is one graph)."""
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2), (130, 67), (1,), (64, 33)]
    params = [torch.randn(s, dtype=dtype, device="tpu", requires_grad=True) for s in shapes]
    grads = [torch.randn(s, dtype=dtype) for s in shapes]
    opts = {
        "adamw": lambda: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True),
        "adam_amsgrad": lambda: torch.optim.Adam(params, lr=1e-2, amsgrad=True, weight_decay=0.01, foreach=True),
        "sgd_nesterov": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                foreach=True),
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=1e-2, momentum=0.5, foreach=True),
        "adamw_capturable": lambda: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True,
                                                      capturable=True),
        "adam_amsgrad_capturable": lambda: torch.optim.Adam(params, lr=1e-2, amsgrad=True, weight_decay=0.01,
                                                            foreach=True, capturable=True),
    }
    opt = opts[opt_name]()
    stats = None
    with torch_tpu.execution_mode(mode):
        for i in range(steps):
            for p, g in zip(params, grads):
                p.grad = (g * (i + 1)).to("tpu")
            torch_tpu.flush()
            torch.tpu.reset_defer_stats()
            opt.step()
            torch_tpu.flush()
            stats = torch.tpu.defer_stats()
    state = [t.cpu() for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    return [p.detach().cpu() for p in params], state, stats


@pytest.mark.parametrize("opt_name", ["adamw", "adam_amsgrad", "sgd_nesterov", "rmsprop", "adamw_capturable",
                                      "adam_amsgrad_capturable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_foreach_optimizer_chain_runs_as_one_kernel_with_the_same_bits(opt_name, dtype):
    # DeferAndFuse runs consecutive foreach launches over the same tensors
    # as one pass: results bit for bit those of strict mode (values kept in
    # registers are rounded to their dtype as their stores would round)
    ref_p, ref_s, _ = _optimizer_run("strict", opt_name, dtype)
    got_p, got_s, stats = _optimizer_run("defer", opt_name, dtype)
    for a, b in zip(got_p + got_s, ref_p + ref_s):
        assert torch.equal(a, b), (a - b).abs().max()
    assert stats["fused_kernels"] >= 1 and stats["kernels_launched"] < stats["ops_recorded"], stats
    if opt_name == "adamw":
        # mul, lerp, mul, addcmul, sqrt, div, add, addcdiv: one kernel, and
        # sqrt(v)'s list never takes memory
        assert stats["kernels_launched"] == 1, stats
        assert stats["bytes_never_materialized"] >= sum(p.numel() for p in ref_p) * ref_p[0].element_size()
    if opt_name.endswith("_capturable"):
        # the step count and bias corrections over the one-element step tensors, recorded between the moments'
        # update and the parameters' update, run first (plan.c, hoist_foreign_runs): two kernels, one pass over
        # the parameters and their state
        assert stats["kernels_launched"] == 2, stats


@pytest.mark.parametrize("scaled", [False, True], ids=["clip_adamw", "grad_scaler_clip_sgd"])
def test_training_with_clipping_keeps_strict_bits_with_foreach_chains(scaled):
    # gradient clipping scales the gradients by a device scalar computed in
    # the same graph (a foreach launch that can lead a chain); GradScaler
    # unscales them first: the optimizer's chain must see the scaled values
    ref_losses, _, ref_params = _train(5, "strict", clip=True, scaled=scaled)
    torch.tpu.reset_defer_stats()
    losses, _, params = _train(5, "defer", clip=True, scaled=scaled)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert torch.tpu.defer_stats()["fused_kernels"] > 0


def test_foreach_over_many_tensors_stays_in_the_graph(defer):
    # a launch over n tuples of k lists validates n * k ranges: 300 tensors
    # of 3 lists are recorded like any launch (no size-cap cut, one chain)
    xs = [torch.full((3,), float(i), device="tpu") for i in range(300)]
    ys = [torch.full((3,), 2.0, device="tpu") for _ in range(300)]
    torch_tpu.flush()
    torch.tpu.reset_defer_stats()
    torch._foreach_addcdiv_(xs, ys, ys, 0.5)
    torch._foreach_mul_(xs, 2.0)
    torch_tpu.flush()
    stats = torch.tpu.defer_stats()
    assert stats["flushes"].get("size_cap", 0) == 0 and stats["kernels_launched"] == 1, stats
    assert torch.equal(torch.stack(xs).cpu(), (torch.arange(300.0).unsqueeze(1).expand(300, 3) + 0.5) * 2)


def _foreach_pattern(mode: str, case: str, dtype):
    torch.manual_seed(0)
    with torch_tpu.execution_mode(mode):
        x = torch.randn(12, device="tpu", dtype=dtype)
        y = torch.randn(12, device="tpu", dtype=dtype)
        s, t = torch.tensor(2.0, device="tpu", dtype=dtype), torch.tensor(3.0, device="tpu", dtype=dtype)
        u, w = torch.tensor(5.0, device="tpu", dtype=dtype), torch.tensor(7.0, device="tpu", dtype=dtype)
        torch_tpu.flush()
        torch.tpu.reset_defer_stats()
        if case == "same_tensor_in_two_tuples":
            torch._foreach_mul_([x, x], 2.0)
            torch._foreach_add_([x, x], 1.0)
        elif case == "overlapping_views":
            torch._foreach_mul_([x[0:6], y[0:6]], 3.0)
            torch._foreach_add_([x[3:9], y[3:9]], 1.0)
        elif case == "scalar_written_before":
            torch._foreach_add_([s, t], 1.0)
            torch._foreach_mul_([u, w], s)
        elif case == "read_by_another_tuple":
            torch._foreach_mul_([x[0:6], y[0:6]], 3.0)
            torch._foreach_add_([x[0:6], y[0:6]], [y[0:6], x[0:6]])
        elif case == "strided_in_place":
            a, b = x.view(3, 4).t(), y.view(4, 3)
            torch._foreach_mul_([a, b], 0.5)
            torch._foreach_addcmul_([a, b], [a, b], [a, b], 2.0)
            torch._foreach_lerp_([a, b], [a.t().t(), b], 0.25)
            torch._foreach_addcdiv_([a, b], [b, a], [a, b], 0.5)  # reads the other tuple's tensor
        out = [v.cpu() for v in (x, y, s, t, u, w)]
        return out, torch.tpu.defer_stats()


@pytest.mark.parametrize("case", ["same_tensor_in_two_tuples", "overlapping_views", "scalar_written_before",
                                  "read_by_another_tuple", "strided_in_place"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_chains_keep_the_order_of_dependent_work(case, dtype):
    # a chain runs tuple by tuple; launches whose tuples share memory (or
    # whose device scalar an earlier launch writes) must see each other's
    # results as in launch order (bfloat16: every value goes through a
    # block buffer, float32 works in place where it can)
    ref, _ = _foreach_pattern("strict", case, dtype)
    got, _ = _foreach_pattern("defer", case, dtype)
    for a, b in zip(got, ref):
        assert torch.equal(a, b), (case, a, b)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "batch_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", ["none", "weight", "weight_bias"])
def test_norm_outputs_have_the_same_bits_in_strict_and_defer(kind, dtype, affine):
    # strict eager computes y = (x - mean) * rstd * w + b inside the
    # statistics kernel, DeferAndFuse records it as an elementwise program
    # (fused with the ReLU after it): the same arithmetic, bit for bit,
    # signed zeros included (rows whose mean is exactly 0 and a zero element,
    # times a negative weight: -0.0, which layer norm's absent bias, +0.0,
    # turns, as on the CPU)
    g = torch.Generator().manual_seed(5)
    half = torch.randn(6, 3, 5, 4, generator=g, dtype=dtype)
    half[..., 1] = 0
    x = torch.cat([half, -half], -1)  # x[..., j] + x[..., j + 4] == 0
    C, L = x.shape[1], x.shape[-1]
    n = L if kind != "batch_norm" else C
    w = (torch.rand(n, generator=g, dtype=dtype) + 0.5) * torch.tensor([-1.0, 1.0], dtype=dtype).repeat(n // 2 + 1)[:n]
    b = torch.randn(n, generator=g, dtype=dtype)
    w = w if affine != "none" else None
    b = b if affine == "weight_bias" else None

    def run(mode):
        with torch_tpu.execution_mode(mode):
            t = x.to("tpu")
            wt, bt = (v.to("tpu") if v is not None else None for v in (w, b))
            if kind == "layer_norm":
                y = F.layer_norm(t, [L], wt, bt)
            elif kind == "rms_norm":
                y = F.rms_norm(t, [L], wt)
            else:
                y = F.batch_norm(t, None, None, wt, bt, training=True)
            return y.cpu(), F.relu(y).cpu()

    strict, defer = run("strict"), run("defer")
    ints = torch.int32 if dtype == torch.float32 else torch.int64
    for a, c in zip(strict, defer):
        assert torch.equal(a.view(ints), c.view(ints))
    ref = {"layer_norm": lambda: F.layer_norm(x, [L], w, b), "rms_norm": lambda: F.rms_norm(x, [L], w),
           "batch_norm": lambda: F.batch_norm(x, None, None, w, b, training=True)}[kind]()
    torch.testing.assert_close(strict[0], ref)
    if affine == "weight" and kind != "batch_norm":
        # exact zeros times negative weights: the CPU's signs (layer norm adds
        # its absent bias, +0; RMS norm does not, -0)
        zero = ref == 0
        assert zero.any() and torch.equal(torch.signbit(strict[0][zero]), torch.signbit(ref[zero]))
        assert torch.signbit(ref[zero]).any() == (kind == "rms_norm")


@pytest.mark.parametrize("change", ["none", "gemm_out", "inplace_add"])
def test_value_is_not_recomputed_from_inputs_changed_in_between(defer, monkeypatch, change):
    # a = gelu(h * 2) is read by a product now and by another after 20
    # unrelated kernels; if h changes in between (a product written into it,
    # an in-place add), a must not be recomputed from the new h
    g = torch.Generator().manual_seed(3)
    h0, w0, m0 = torch.randn(256, 1024, generator=g), torch.randn(1024, 8, generator=g), torch.randn(8, 8, generator=g)
    p0, q0 = torch.randn(256, 4, generator=g), torch.randn(4, 1024, generator=g)

    def run(mode):
        with torch_tpu.execution_mode(mode):
            h, w, m, p, q = (t.to("tpu") for t in (h0, w0, m0, p0, q0))
            ones = torch.ones(1024, 1024, device="tpu")

            def graph():
                a = F.gelu(h * 2)
                e1 = a @ w
                t = w[:8].clone()
                for _ in range(20):
                    t = t @ m
                t = t + (h @ ones).sum()  # a 1 MiB product alive in the middle
                if change == "gemm_out":
                    torch.mm(p, q, out=h)
                elif change == "inplace_add":
                    h.add_(1)
                e2 = a.t() @ h[:, :8]
                del a  # dead when the graph runs, like a saved activation after backward
                return e1.cpu(), e2.cpu(), t.cpu()

            return _peak_of(graph)

    _, ref = run("strict")
    peak, got = run("defer")
    monkeypatch.setenv("TORCH_TPU_DEFER_REMAT", "0")
    kept_peak, _ = run("defer")
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    if change == "none":  # recomputed: a (1 MiB) is not held next to the product
        assert peak <= kept_peak - (1 << 20) + (64 << 10), (peak, kept_peak)  # + small buffers of the graph


# ------------------------------------------------------ views and aliasing


def test_inplace_on_views_of_deferred_tensors(defer):
    base = torch.arange(24.0).reshape(4, 6)
    x = base.to("tpu") * 2
    ref = base * 2
    for t in (x, ref):
        v = t[1:3, ::2]
        v.add_(100)
        t.t()[0].mul_(-1)             # a column through a transposed view
        t[:, 1] = t[:, 2] + t[:, 3]   # reads and writes overlapping columns
        w = t.view(-1)
        w[5:9].copy_(w[0:4].clone())
        t.diagonal().zero_()
    torch.testing.assert_close(x.cpu(), ref)


def test_aliasing_reads_through_another_view(defer):
    h = torch.arange(10.0)
    x = h.to("tpu") + 0
    x.mul_(2)
    y = x + x.flip(0)   # reads x through a reversed view after writing it
    x.mul_(2)
    torch.testing.assert_close(y.cpu(), h * 2 + (h * 2).flip(0))
    torch.testing.assert_close(x.cpu(), h * 4)


# ---------------------------------------------------------- RNG, autograd


def test_rng_matches_strict():
    def draw():
        torch.manual_seed(123)
        a = torch.randn(1000, device="tpu")
        b = F.dropout(torch.ones(1000, device="tpu"), p=0.3)
        return a.cpu(), b.cpu()

    sa, sb = draw()
    with torch_tpu.execution_mode("defer"):
        da, db = draw()
    assert torch.equal(sa, da) and torch.equal(sb, db)


def test_autograd_matches_strict():
    def grads():
        torch.manual_seed(0)
        w = torch.randn(8, 8, device="tpu", requires_grad=True)
        x = torch.randn(4, 8, device="tpu")
        y = torch.tanh(x @ w).pow(2).mean() + F.softplus(w).sum() * 1e-3
        y.backward()
        return y.detach().cpu(), w.grad.cpu()

    s = grads()
    with torch_tpu.execution_mode("defer"):
        d = grads()
    torch.testing.assert_close(d[0], s[0])
    torch.testing.assert_close(d[1], s[1])


# ------------------------------------------------------------------- errors


def test_error_line_is_right_when_the_lines_were_recorded_before(defer):
    # op lines come from a cache keyed by code object and instruction: after
    # both lines of this function were recorded twice, a failing op on the
    # second names the second line, not the first (same function, same op)
    src = torch.arange(10.0, device="tpu")

    def two_gathers(i, j):
        a = torch.gather(src, 0, i)
        b = torch.gather(src, 0, j)
        return (a + b).sum().item()

    ok = torch.tensor([0, 3], device="tpu")
    for _ in range(2):
        assert two_gathers(ok, ok) == 6.0
    first = two_gathers.__code__.co_firstlineno
    with pytest.raises((IndexError, RuntimeError)) as info:
        two_gathers(ok, torch.tensor([0, 12], device="tpu"))
    msg = str(info.value)
    assert "gather" in msg and f"{HERE}:{first + 2}" in msg and f"{HERE}:{first + 1}" not in msg, msg
    assert two_gathers(ok, ok) == 6.0  # usable afterwards


def test_error_names_op_and_source_line(defer):
    src = torch.arange(10.0, device="tpu")
    idx = torch.tensor([0, 3, 12], device="tpu")
    y = src * 2
    line = line_of_next()
    bad = torch.gather(y, 0, idx)
    with pytest.raises((IndexError, RuntimeError)) as info:
        (bad + 1).sum().item()
    msg = str(info.value)
    assert "gather" in msg and f"{HERE}:{line}" in msg, msg
    # the device stays usable, in the same mode
    assert torch_tpu.get_execution_mode() == "defer"
    assert (src + 1).sum().item() == 55.0


def test_host_read_runs_before_later_ops(defer):
    # .item() of a value computed early in a graph is read right after the
    # op that writes it (the host does not wait for the rest of the graph):
    # ops recorded after it do not change it, and an error in one of them is
    # raised at the next synchronization, naming it, not by the read
    src = torch.arange(10.0, device="tpu")
    y = src * 2
    total = y.sum()
    y.add_(1)
    idx = torch.tensor([0, 12], device="tpu")
    line = line_of_next()
    bad = torch.gather(src, 0, idx)
    assert total.item() == 90.0
    with pytest.raises((IndexError, RuntimeError)) as info:
        torch.tpu.synchronize()
    msg = str(info.value)
    assert "gather" in msg and f"{HERE}:{line}" in msg, msg
    del bad
    assert y.sum().item() == 100.0


def test_shape_errors_raise_at_the_op(defer):
    a = torch.ones(3, device="tpu")
    b = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    assert (a * 2).sum().item() == 6.0


# ------------------------------------------------------- GEMM epilogues


@pytest.fixture
def epilogues(defer, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEFER_EPILOGUE", "1")


def _poisoned(*shapes):
    """NaN-filled device blocks of these shapes, freed again: the caching
    allocator hands them to the next tensors of those sizes, so a result
    that is never written shows as NaN, not as a stale copy of an earlier
    run's right answer."""
    for shape in shapes:
        torch.full(shape, float("nan"), device="tpu")
    torch.tpu.synchronize()


def _mlp_step(x, w1, b1, w2, b2, res):
    h = F.gelu(F.linear(x, w1, b1))
    y = F.dropout(F.linear(h, w2, b2), 0.1) + res
    y.sum().backward()
    return y.detach().cpu(), x.grad.cpu(), w1.grad.cpu(), b1.grad.cpu(), w2.grad.cpu()


@pytest.mark.parametrize("sgemm", ["own", "blas"])
def test_gemm_runs_the_next_group_as_its_epilogue_with_strict_bits(epilogues, monkeypatch, sgemm):
    # product + bias + GELU, product + bias + dropout + residual, and the
    # backward products: with TORCH_TPU_DEFER_EPILOGUE=1 the groups that
    # read a product's output in order run inside it (fewer kernels) and
    # every value keeps strict mode's bits, on the own kernel and on the
    # library tiles
    monkeypatch.setenv("TORCH_TPU_SGEMM", sgemm)
    g = torch.Generator().manual_seed(5)
    host = [torch.randn(s, generator=g) for s in ((300, 96), (160, 96), (160,), (96, 160), (96,), (300, 96))]

    def run(mode, epilogue):
        monkeypatch.setenv("TORCH_TPU_DEFER_EPILOGUE", epilogue)
        with torch_tpu.execution_mode(mode):
            torch.tpu.manual_seed(11)
            t = [h.to("tpu").requires_grad_(i < 5) for i, h in enumerate(host)]
            torch.tpu.reset_defer_stats()
            out = _mlp_step(*t)
            return out, torch.tpu.defer_stats()["kernels_launched"]

    _poisoned((300, 160), (300, 96), (160, 96), (96, 160))
    got, kernels = run("defer", "1")
    ref, _ = run("strict", "1")
    unfused, kernels_unfused = run("defer", "0")
    for a, b, c in zip(got, ref, unfused):
        assert torch.equal(a, b) and torch.equal(c, b)
    assert kernels < kernels_unfused, (kernels, kernels_unfused)


@pytest.mark.parametrize("sgemm", ["own", "blas"])
@pytest.mark.parametrize("shape", [(6, 96, 80, 72), (40, 16, 24, 16)])  # few large / many small products
def test_batched_gemm_epilogue_maps_every_product(epilogues, monkeypatch, sgemm, shape):
    # bmm + scale + bias + residual: the epilogue of product i covers
    # product i's rows, whichever way the batch is spread over the pool
    monkeypatch.setenv("TORCH_TPU_SGEMM", sgemm)
    nb, m, k, n = shape
    g = torch.Generator().manual_seed(7)
    a0, b0, r0, bias0 = (torch.randn(s, generator=g) for s in ((nb, m, k), (nb, k, n), (nb, m, n), (n,)))

    def run(mode):
        with torch_tpu.execution_mode(mode):
            a, b, r, bias = (t.to("tpu") for t in (a0, b0, r0, bias0))
            torch.tpu.reset_defer_stats()
            out = (torch.bmm(a, b) * 0.5 + bias + r).cpu()
            return out, torch.tpu.defer_stats()["kernels_launched"]

    _poisoned((nb, m, n), (nb, m, n))
    got, kernels = run("defer")
    ref, _ = run("strict")
    assert torch.equal(got, ref)
    assert kernels == 1 + 4  # the product with its epilogue, the four host->device copies
    torch.testing.assert_close(got, torch.bmm(a0, b0) * 0.5 + bias0 + r0)


# ------------------------------------------------- concurrent products

_PAIRS = r"""
import os, torch, torch_tpu
g = torch.Generator().manual_seed(3)
dtype = getattr(torch, os.environ["DT"])
x0, w0, gy0 = (torch.randn(s, generator=g).to(dtype) for s in ((300, 96), (160, 96), (300, 160)))
def run(mode, pairs, dependent):
    os.environ["TORCH_TPU_DEFER_PAIRS"] = pairs
    with torch_tpu.execution_mode(mode):
        x, w, gy = (t.to("tpu") for t in (x0, w0, gy0))
        torch.tpu.reset_defer_stats()
        dx = gy @ w                                     # 300 x 160 x 96 multiply-adds
        dw = dx @ w.t() if dependent else gy.t() @ x    # the same count; reads dx, or not
        out = (dx.float().cpu(), dw.float().cpu())
        return out, torch.tpu.defer_stats()["kernels_launched"]
for dependent in (False, True):
    ref, _ = run("strict", "1", dependent)
    got, k1 = run("defer", "1", dependent)
    alone, k0 = run("defer", "0", dependent)
    for a, b, c in zip(got, ref, alone):
        assert torch.equal(a, b) and torch.equal(c, b), dependent
    print("kernels", int(dependent), k1, k0)
"""


@pytest.mark.parametrize("dtype,sgemm", [("float32", ""), ("bfloat16", ""), ("float32", "blas")])
def test_independent_products_run_as_one_concurrent_pair_with_strict_bits(dtype, sgemm):
    # a linear layer's input and weight gradients (dY W, dY^T X: the same
    # multiply-adds, neither reads the other) run as one kernel, each whole
    # on one of the two threads: one kernel fewer, "gemm pair" in the
    # kernel table, strict mode's bits; a product that reads the other's
    # output is no pair. On the library tiles too: their tiles do not
    # depend on the product running inside the pair's pool task
    env = {"TPU_NUM_THREADS": "2", "TORCH_TPU_KERNEL_TIMES": "1", "DT": dtype, "TORCH_TPU_SGEMM": sgemm}
    p = run_python(_PAIRS, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    kernels = {int(d): (int(a), int(b)) for d, a, b in
               (line.split()[1:] for line in p.stdout.splitlines() if line.startswith("kernels"))}
    assert kernels[0][0] == kernels[0][1] - 1, kernels  # independent: paired
    assert kernels[1][0] == kernels[1][1], kernels  # dependent: one after the other
    assert "gemm pair" in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize("case", ["writes_b", "writes_a", "reads_transposed"])
def test_group_is_not_an_epilogue_where_blocks_would_see_unfinished_memory(epilogues, case):
    # a group that writes the product's operands, or reads its output in
    # another order, runs after the product: the same values as strict
    # (a group that reads C only in another order is no epilogue candidate)
    # writes_b: a [192, 192] @ b [192, 1100] reads B in place (few rows),
    # every row of it for each of C's two row blocks
    g = torch.Generator().manual_seed(6)
    m = 192 if case == "writes_b" else 1100
    a0, b0, e0 = (torch.randn(s, generator=g) for s in ((m, m), (m, 1100), (1100, 1100)))

    def run(mode):
        with torch_tpu.execution_mode(mode):
            a, b, e = a0.to("tpu"), b0.to("tpu"), e0.to("tpu")
            c = a @ b
            if case == "writes_b":
                b.add_(c)
            elif case == "writes_a":
                a.add_(c)
            else:  # in C's order and transposed
                e = c + c.t() + e
            return a.cpu(), b.cpu(), c.cpu(), e.cpu()

    _poisoned((m, 1100), (1100, 1100))
    got = run("defer")
    ref = run("strict")
    for x, y in zip(got, ref):
        assert torch.equal(x, y)


# --------------------------------------------------- reduction prologues


def _rmsnorm_step(x, w):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    (y * y).sum().backward()
    return y.detach().cpu(), x.grad.cpu(), w.grad.cpu()


def _prologue_runs(monkeypatch, fn, host, grad=False):
    """fn on device copies of host: in defer mode with and without reduction
    prologues, and in strict mode (outputs on the host, kernels launched)."""

    def run(mode, prologue):
        monkeypatch.setenv("TORCH_TPU_DEFER_PROLOGUE", prologue)
        with torch_tpu.execution_mode(mode):
            torch.tpu.manual_seed(3)
            t = [h.to("tpu").requires_grad_(grad and h.is_floating_point()) for h in host]
            torch.tpu.reset_defer_stats()
            out = fn(*t)
            out = tuple(o.cpu() for o in (out if isinstance(out, tuple) else (out,)))
            return out, torch.tpu.defer_stats()

    return run("defer", "1"), run("defer", "0"), run("strict", "1")


# name: (the group, the reduction of its result, input shapes and dtypes)
_F32_2 = [((512, 96), torch.float32)] * 2
_PROLOGUE_CASES = {
    # rows shorter than a buffer: several outputs' rows computed per range
    "mean_keepdim": (lambda x, y: x * x, lambda t: t.mean(-1, keepdim=True), [((1024, 128), torch.float32)] * 2),
    # rows longer than a buffer: each row computed in runs
    "sum_long_rows": (lambda x, y: x * y + 1, lambda t: t.sum(-1), [((16, 5000), torch.float32)] * 2),
    "amax": (lambda x, y: x - y, lambda t: t.amax(-1), _F32_2),
    "argmax": (lambda x, y: x * y, lambda t: t.argmax(-1), _F32_2),
    "var": (lambda x, y: x * y, lambda t: t.var(-1), _F32_2),
    "logsumexp": (lambda x, y: x * 2 + y, lambda t: t.logsumexp(-1), _F32_2),
    "norm": (lambda x, y: x - y, lambda t: t.norm(dim=-1), _F32_2),
    # one output: the reduced range split into parts combined in order
    "sum_all": (lambda x, y: x * x, lambda t: t.sum(), [((256, 512), torch.float32)] * 2),
    # outer strategy: whole short rows several per range, and single rows
    "outer_short_rows": (lambda x, y: x * y, lambda t: t.sum(1), [((8, 256, 128), torch.float32)] * 2),
    "outer_long_rows": (lambda x, y: x * y, lambda t: t.sum(1), [((2, 64, 4096), torch.float32)] * 2),
    # ... and one row of outputs: the reduced rows split into parts combined in order
    "outer_parts": (lambda x, y: x * y - 1, lambda t: t.sum(0), [((8192, 128), torch.float32)] * 2),
    # the stored dtype of the values, not the compute type
    "bf16": (lambda x, y: (x * y).to(torch.bfloat16), lambda t: t.sum(-1), _F32_2),
    "float64": (lambda x, y: x * y, lambda t: t.sum(-1), [((512, 96), torch.float64)] * 2),
    "int64": (lambda x, y: x * y + 3, lambda t: t.sum(-1), [((512, 96), torch.int64)] * 2),
    # rows of 4 that cannot merge: the group runs whole, into the kernel's own buffer
    "short_rows_whole": (lambda x, y: x[:, :1] * y[:1, :4], lambda t: t.sum(-1), [((65536, 8), torch.float32)] * 2),
}


@pytest.mark.parametrize("case", sorted(_PROLOGUE_CASES))
def test_reduction_runs_the_group_before_it_as_its_prologue(defer, monkeypatch, case):
    # the group computing a reduction's input runs inside the reduction,
    # run by run: one kernel fewer, the input never takes memory, and the
    # values are strict mode's bits
    pro, red, specs = _PROLOGUE_CASES[case]

    def fn(x, y):
        return red(pro(x, y))

    g = torch.Generator().manual_seed(4)
    host = [
        torch.randn(s, generator=g, dtype=dt) if dt.is_floating_point else torch.randint(-50, 50, s, generator=g, dtype=dt)
        for s, dt in specs
    ]
    ref = fn(*host)
    _poisoned(tuple(ref.shape) if ref.dim() else (1,))
    (got, st), (unfused, st0), (strict, _) = _prologue_runs(monkeypatch, fn, host)
    for a, b, c in zip(got, unfused, strict):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert st["kernels_launched"] == st0["kernels_launched"] - 1, (st, st0)
    assert st["bytes_never_materialized"] - st0["bytes_never_materialized"] == pro(*host).nbytes
    if ref.is_floating_point():
        torch.testing.assert_close(got[0], ref, rtol=1e-5, atol=1e-4)
    else:
        assert torch.equal(got[0], ref)


def test_rmsnorm_training_step_fuses_its_reductions_with_strict_bits(defer, monkeypatch):
    # the mean of squares forward, the row sums of the backward
    g = torch.Generator().manual_seed(8)
    host = [torch.randn(768, 256, generator=g), torch.randn(256, generator=g)]
    (got, st), (unfused, st0), (strict, _) = _prologue_runs(monkeypatch, _rmsnorm_step, host, grad=True)
    for a, b, c in zip(got, unfused, strict):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert st["kernels_launched"] <= st0["kernels_launched"] - 2, (st, st0)


@pytest.mark.parametrize("case", ["input_read_again", "output_over_the_group_input", "division_may_fail"])
def test_group_is_not_a_prologue_where_its_values_are_needed_elsewhere(defer, monkeypatch, case):
    # the reduction's input read by a later op, the reduction writing into
    # memory its group still reads (a later row of the group's input), an
    # integer division (its error is raised from memory as in strict mode):
    # the group runs on its own and the values are strict mode's
    g = torch.Generator().manual_seed(9)
    if case == "division_may_fail":
        host = [torch.randint(1, 9, (1024, 128), generator=g), torch.randint(1, 9, (1024, 128), generator=g)]

        def fn(a, b):
            return (a // b).sum(-1)

    else:
        host = [torch.randn(1025, 128, generator=g), torch.randn(1025, 128, generator=g)]

        def fn(a, b):
            if case == "input_read_again":
                sq = a * b
                return sq.sum(-1), sq * 2
            torch.sum(a[:-1] * 2, -1, out=a[1:, 0])  # row i's sum lands in row i + 1, read later
            return a

    (got, st), (unfused, st0), (strict, _) = _prologue_runs(monkeypatch, fn, host)
    for a, b, c in zip(got, unfused, strict):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert st["kernels_launched"] == st0["kernels_launched"], (st, st0)


# ------------------------------------------------------------------ casts

_CAST_PAIRS = [
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.float16),
    (torch.float16, torch.float32), (torch.float32, torch.float64), (torch.float64, torch.float32),
    (torch.float64, torch.bfloat16), (torch.bfloat16, torch.float16), (torch.int64, torch.float32),
    (torch.int64, torch.bfloat16), (torch.int32, torch.float64), (torch.uint8, torch.float32),
    (torch.bool, torch.float32), (torch.float32, torch.bool), (torch.float32, torch.int32),
    (torch.float64, torch.int64), (torch.bfloat16, torch.int16), (torch.int64, torch.int32),
    (torch.int32, torch.int8), (torch.int16, torch.int64), (torch.bool, torch.int64),
]


def _cast_source(dtype):
    """Values that probe a conversion: ties of the narrower float types,
    NaN, infinities, -0.0, magnitudes beyond every integer type, integers
    beyond float32's 24 bits, negative values for the unsigned ones."""
    g = torch.Generator().manual_seed(12)
    if dtype == torch.bool:
        return torch.rand(64, 96, generator=g) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(64, 96, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 12, (64, 96), generator=g)
        special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1.00390625, 1.001953125, 65520.0,
                                3e38, -2.5, 2.5, 2**63, -(2**63), 2**64, 300.7, -129.5], dtype=torch.float64)
        x.view(-1)[: special.numel()] = special
        return x.to(dtype)
    info = torch.iinfo(dtype)
    x = torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), (64, 96), generator=g, dtype=torch.int64)
    x.view(-1)[:4] = torch.tensor([info.min, info.max, 0, (1 << min(info.bits - 2, 25)) + 1])
    if dtype == torch.int64:  # rounds differently to float32 directly and through float64
        x.view(-1)[4] = 2**60 + 2**36 + 1
    return x.to(dtype)


@pytest.mark.parametrize("src,dst", _CAST_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
def test_casts_fuse_with_the_ops_around_them_with_strict_bits(defer, monkeypatch, src, dst):
    # a cast of a contiguous and of a transposed tensor, alone and between
    # elementwise ops: recorded as a program (load, store), it fuses and its
    # result need not take memory; the bits are the copy kernel's
    x0 = _cast_source(src)

    def fn(x):
        alone = x.to(dst)
        transposed = x.t().to(dst)
        # with an op of the same compute type (float, or integer) before or after it
        fused = (x * 2).to(dst) if src.is_floating_point and not dst.is_floating_point else x.to(dst) * 2
        return alone, transposed, fused

    def run(mode, copies):
        monkeypatch.setenv("TORCH_TPU_DEFER_COPIES", copies)
        with torch_tpu.execution_mode(mode):
            x = x0.to("tpu")
            torch.tpu.reset_defer_stats()
            out = tuple(o.cpu() for o in fn(x))
            return out, torch.tpu.defer_stats()

    def bits(t):  # NaN payloads included
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return t.view(ints[t.element_size()]) if t.is_floating_point() or t.dtype == torch.bool else t

    (got, st), (kernels, st0), (strict, _) = run("defer", "1"), run("defer", "0"), run("strict", "1")
    for a, b, c in zip(got, kernels, strict):
        assert a.dtype == c.dtype and torch.equal(bits(a), bits(c)) and torch.equal(bits(b), bits(c))
    # the CPU's casts, up to NaN payloads, and for float -> integer where
    # the value fits (out of range, C++ leaves the result undefined)
    cpu = fn(x0)
    if src.is_floating_point and not dst.is_floating_point and dst != torch.bool:
        fits = lambda t: t.isfinite() & (t.double().abs() < 2**31)  # noqa: E731
        keep = (fits(x0), fits(x0.t()), fits(x0 * 2))
        got, cpu = [a[k] for a, k in zip(got, keep)], [c[k] for c, k in zip(cpu, keep)]
    for a, c in zip(got, cpu):
        if a.is_floating_point():
            assert torch.equal(a.isnan(), c.isnan()) and torch.equal(a.nan_to_num(), c.nan_to_num())
        else:
            assert torch.equal(a, c)
    assert st["kernels_launched"] < st0["kernels_launched"], (st, st0)


def test_layout_copies_fuse_with_the_arithmetic_around_them(defer, monkeypatch):
    # a stack of two results and an expanded tensor made dense, next to the
    # ops that produce or read them: fewer kernels, memory never taken by
    # the intermediates, strict's bits; a transposing copy that fuses with
    # nothing (run by the copy kernel) gives strict's bits too
    g = torch.Generator().manual_seed(13)
    a0, b0, c0 = torch.randn(256, 96, generator=g), torch.randn(256, 96, generator=g), torch.randn(1, 256, 96, generator=g)
    i0 = torch.randint(-9, 9, (96, 256), generator=g)

    def fn(a, b, c, i):
        stacked = torch.stack((a * 2, b - a))  # each copy reads its result as the arithmetic wrote it
        dense = c.expand(4, 256, 96).contiguous() * b  # the copy's result read back in the same order
        return stacked, dense, i.t().contiguous(), a.t().contiguous() + 0

    def run(mode, copies):
        monkeypatch.setenv("TORCH_TPU_DEFER_COPIES", copies)
        with torch_tpu.execution_mode(mode):
            t = [h.to("tpu") for h in (a0, b0, c0, i0)]
            torch.tpu.reset_defer_stats()
            out = tuple(o.cpu() for o in fn(*t))
            return out, torch.tpu.defer_stats()

    _poisoned((2, 256, 96), (4, 256, 96), (256, 96))
    (got, st), (kernels, st0), (strict, _) = run("defer", "1"), run("defer", "casts"), run("strict", "1")
    for a, b, c, ref in zip(got, kernels, strict, fn(a0, b0, c0, i0)):
        assert torch.equal(a, c) and torch.equal(b, c) and torch.equal(c, ref)
    assert st["kernels_launched"] < st0["kernels_launched"], (st, st0)
    assert st["bytes_never_materialized"] > st0["bytes_never_materialized"], (st, st0)


def test_copies_within_half_and_bool_keep_every_byte(defer):
    # copies that move bytes (a NaN's payload, a bool byte that is not 0/1)
    # stay copy kernels: through a program's float or integer values they
    # could change
    payload = torch.tensor([0x7F81, 0x7FC3, -0x7F, 0x0001] * 64, dtype=torch.int16).view(torch.bfloat16)
    half = torch.tensor([0x7C01, 0x7E05, -0x3FF, 0x0001] * 64, dtype=torch.int16).view(torch.float16)
    flags = torch.tensor([0, 1, 2, 255] * 64, dtype=torch.uint8).view(torch.bool)
    for h in (payload, half, flags):
        ints = torch.int16 if h.element_size() == 2 else torch.uint8
        got = []
        for mode in ("defer", "strict"):
            with torch_tpu.execution_mode(mode):
                d = h.reshape(16, 16).to("tpu")
                # a lone transposing copy; two copies that would fuse with each other
                got.append([o.cpu().view(ints) for o in (d.t().contiguous(), torch.stack((d, d))[1])])
        for a, b in zip(*got):
            assert torch.equal(a, b)
        assert torch.equal(got[0][0], h.reshape(16, 16).view(ints).t())  # every byte moved as it was
        assert torch.equal(got[0][1], h.reshape(16, 16).view(ints))


# -------------------------------------------------- reduction epilogues


def _epilogue_runs(monkeypatch, fn, host):
    """fn in defer mode with and without reduction epilogues, and in strict
    mode: (outputs, stats) of each."""

    def run(mode, on):
        monkeypatch.setenv("TORCH_TPU_DEFER_REDUCE_EPILOGUE", on)
        with torch_tpu.execution_mode(mode):
            t = [h.to("tpu") for h in host]
            torch.tpu.synchronize()
            torch.tpu.reset_defer_stats()
            out = tuple(o.cpu() for o in fn(*t))
            return out, torch.tpu.defer_stats()

    return run("defer", "1"), run("defer", "0"), run("strict", "1")


def _rms_inv(x, w):  # the mean of squares (prologue) and rsqrt(mean + eps) (epilogue)
    return (torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),)


def _softmax_denominator(x, w):  # sum of exponentials, then its reciprocal times a weight
    return (w / x.exp().sum(-1),)


def _sum_then_two_outputs(x, w):  # an input of its own, two outputs
    s = x.sum(-1)
    return s * w + 1, s.exp()


def _mean_in_place(x, w):  # the epilogue updates the output in place
    m = x.mean(-1)
    m.mul_(2).add_(w)
    return (m,)


# name: (function, x shape, w shape, pairs expected)
_EPILOGUE_CASES = {
    "prologue_and_epilogue": (_rms_inv, (1024, 128), (1,), 1),
    "softmax_denominator": (_softmax_denominator, (1024, 96), (1024,), 1),
    "two_outputs": (_sum_then_two_outputs, (512, 200), (512,), 1),
    "in_place": (_mean_in_place, (600, 64), (600,), 1),
    # walks that do not write outputs chunk by chunk in order: the epilogue runs whole after the walk
    "outer_whole_after": (lambda x, w: ((x * 2).sum(0) * w,), (1024, 128), (128,), 1),
    "split_whole_after": (lambda x, w: ((x * x).sum() * w,), (256, 512), (1,), 1),
    "two_output_dims": (lambda x, w: (x.sum(1) - w,), (8, 64, 32), (8, 32), 1),
}


@pytest.mark.parametrize("case", sorted(_EPILOGUE_CASES))
def test_reduction_runs_the_group_after_it_as_its_epilogue(defer, monkeypatch, case):
    # the group reading a reduction's outputs in order runs inside the
    # reduction's kernel: one kernel fewer, strict mode's bits
    fn, xs, ws, pairs = _EPILOGUE_CASES[case]
    g = torch.Generator().manual_seed(14)
    host = [torch.randn(xs, generator=g), torch.randn(ws, generator=g)]
    ref = fn(*host)
    _poisoned(*(tuple(r.shape) if r.dim() else (1,) for r in ref))
    (got, st), (unfused, st0), (strict, _) = _epilogue_runs(monkeypatch, fn, host)
    for a, b, c, r in zip(got, unfused, strict, ref):
        assert torch.equal(a, c) and torch.equal(b, c)
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)
    assert st["kernels_launched"] == st0["kernels_launched"] - pairs, (st, st0)


@pytest.mark.parametrize("case", ["reads_transposed", "writes_the_input"])
def test_group_is_not_a_reduction_epilogue_where_chunks_would_race(defer, monkeypatch, case):
    # a group that reads the outputs in another order (outputs another
    # chunk has not written yet), or writes memory the reduction reads, runs
    # after the reduction: strict mode's values, no kernel saved
    g = torch.Generator().manual_seed(15)
    host = [torch.randn(64, 64, 256, generator=g), torch.randn(64, generator=g)]

    def fn(x, w):
        s = x.sum(-1)  # [64, 64], dense, written chunk by chunk
        if case == "reads_transposed":
            return (s + s.t(),)
        x[:, :, 0].copy_(s * 2)  # the first column of the input, from the outputs in order
        return s, x[:, :, :2]

    (got, st), (unfused, st0), (strict, _) = _epilogue_runs(monkeypatch, fn, host)
    for a, b, c in zip(got, unfused, strict):
        assert torch.equal(a, c) and torch.equal(b, c)
    assert st["kernels_launched"] == st0["kernels_launched"], (st, st0)
