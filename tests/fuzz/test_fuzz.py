"""CI's share of the differential fuzzer and the replay of its regressions.

test_fuzz_programs runs 300 generated programs (seeds 0-299, or
TORCH_TPU_FUZZ_SEED onwards) in a worker process, each on the CPU and on tpu
in strict and DeferAndFuse modes: no crash, no hang, no difference.
Long campaigns: ``make fuzz N=10000`` / ``python -m tests.fuzz --help``.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.fuzz.campaign import REGRESSIONS, campaign, kind
from tests.fuzz.gen import generate
from tests.fuzz.run import check, execute

CI_PROGRAMS = 300
CI_COMPILED_EVERY = 30   # compiled mode (a few seconds of compilation a program) on 10 of them


def test_fuzz_programs():
    seed = int(os.environ.get("TORCH_TPU_FUZZ_SEED", "0"))
    results = campaign(seed, CI_PROGRAMS, ("strict", "defer", "compiled"), timeout=120,
                       compiled_every=CI_COMPILED_EVERY)
    assert len(results) == CI_PROGRAMS
    assert sum("compiled" in r.get("modes", ()) for r in results) == CI_PROGRAMS // CI_COMPILED_EVERY
    failed = [r for r in results if r["status"] != "ok"]
    assert not failed, "\n".join(f"seed {r['seed']}: {r['status']}: {r.get('msg')}" for r in failed[:20])


def test_a_worker_that_logs_a_lot_is_not_taken_for_a_hang():
    """The worker's stderr is not a pipe the campaign leaves undrained: a worker
    that writes more than a pipe holds (here every plan printed, ~6 KB a program;
    a compiled program's graph-break tracebacks reach 46 KB) would block on its
    write and be reported as a hang (seeds 15100, 54700)."""
    results = campaign(0, 30, ("defer",), timeout=60, env={"TORCH_TPU_DEFER_DEBUG": "1"}, compiled_every=0)
    assert [r["status"] for r in results] == ["ok"] * 30, results[-1]


REGRESSION_FILES = sorted(REGRESSIONS.glob("*.json"))


@pytest.mark.parametrize("path", REGRESSION_FILES, ids=[p.stem for p in REGRESSION_FILES])
def test_regression(path):
    case = json.loads(path.read_text())
    assert check(case["program"], tuple(case.get("modes", ("strict", "defer")))) is None


def test_generator_is_reproducible():
    assert generate(12345) == generate(12345)
    assert generate(12345) != generate(12346)


def test_harness_detects_a_wrong_value():
    """The comparison is not vacuous: a program whose tpu result is changed
    after the fact is reported, exact values bit for bit."""
    prog = {"seed": 1, "precision": "HIGHEST", "stmts": [
        {"op": "input", "in": [], "p": {"shape": [3, 4], "dtype": "f32", "kind": "float", "seed": 7}, "out": 0, "x": True},
        {"op": "binary", "in": [0, 0], "p": {"f": "add"}, "out": 1, "x": True}]}
    from tests.fuzz.run import compare
    got = execute(prog, "tpu", "strict")
    ref = execute(prog, "cpu", tape=got["tape"])
    assert compare(prog, got, ref, "strict") is None
    got["values"]["v1"] = got["values"]["v1"].clone()
    got["values"]["v1"][1, 2] = got["values"]["v1"][1, 2].nextafter(got["values"]["v1"][1, 2] + 1)
    assert "exact" in compare(prog, got, ref, "strict")
    got["errors"].append((1, "RuntimeError", "injected"))
    assert kind(compare(prog, got, ref, "strict")) == "[strict] errors"


def test_alternative_references_do_not_accept_a_wrong_value():
    """The float64 and contract references only accept a value close to one
    of them: a program of inexact values (exp, a HIGH-precision product with
    its gradient) whose tpu value is moved by 1 % (a gradient at HIGH, compared
    within the bfloat16 tolerance, by 10 %) is still reported."""
    prog = {"seed": 2, "precision": "HIGH", "stmts": [
        {"op": "input", "in": [], "p": {"shape": [4, 5], "dtype": "f32", "kind": "float", "seed": 3, "rg": True},
         "out": 0, "x": True},
        {"op": "input", "in": [], "p": {"shape": [5, 3], "dtype": "f32", "kind": "float", "seed": 4}, "out": 1,
         "x": True},
        {"op": "unary", "in": [0], "p": {"f": "exp"}, "out": 2},
        {"op": "matmul", "in": [2, 1], "p": {"f": "mm"}, "out": 3},
        {"op": "backward", "in": [3], "p": {"seed": 5}, "out": None}]}
    import tests.fuzz.run as run
    seen = []
    orig = run.compare

    def spy(program, got, ref, mode, alts=None):
        seen.append((got, ref, alts))
        return orig(program, got, ref, mode, alts)

    run.compare = spy
    try:
        assert run.check(prog, ("strict",)) is None
    finally:
        run.compare = orig
    got, ref, alts = seen[0]
    for name, f in (("v2", 1.01), ("v3", 1.01), ("v0.grad", 1.1)):
        bad = {**got, "values": {**got["values"], name: got["values"][name] * f}}
        assert name in (orig(prog, bad, ref, "strict", alts) or ""), name


def test_compiled_mode_compiles_every_segment():
    """Compiled mode really runs graphs through the tpu backend (no recompile limit or error turns a
    segment eager without being counted): at least one Dynamo graph per segment of the program."""
    from tests.fuzz.run import EAGER_OPS, _plan
    prog = generate(20)
    ref = execute(prog, "cpu", tape=execute(prog, "tpu")["tape"])
    got = execute(prog, "tpu", "compiled", skip={e[0] for e in ref["errors"]})
    segments = [x for x in _plan(prog, {e[0] for e in ref["errors"]})
                if len(x) > 1 or prog["stmts"][x[0]]["op"] not in EAGER_OPS]
    assert len(segments) >= 5 and got["uncompilable"] == 0
    assert got["graphs"] >= len(segments)


def test_compiled_reference_does_not_accept_a_wrong_value():
    """Compiled mode falls back on PyTorch's own compile (aot_eager on the CPU) only for a run equal to it: a
    compiled tpu value moved by 1 % is still reported."""
    prog = {"seed": 3, "precision": "HIGHEST", "stmts": [
        {"op": "input", "in": [], "p": {"shape": [3, 4], "dtype": "f32", "kind": "float", "seed": 9}, "out": 0},
        {"op": "unary", "in": [0], "p": {"f": "exp"}, "out": 1}]}
    import tests.fuzz.run as run
    orig = run.execute

    def wrong(program, device, mode="strict", **kw):
        r = orig(program, device, mode, **kw)
        if device == "tpu" and mode == "compiled":
            r["values"]["v1"] = r["values"]["v1"] * 1.01
        return r

    assert run.check(prog, ("strict", "compiled")) is None
    run.execute = wrong
    try:
        msg = run.check(prog, ("strict", "compiled"))
    finally:
        run.execute = orig
    assert msg is not None and msg.startswith("[compiled] v1")


def test_rounded_reference_accepts_the_contract_and_no_wrong_value():
    """The per-op rounded reference (every op in float64, rounded once to its dtype) accepts a device value the
    CPU's less accurate bf16 kernel disagrees with (seed 30137: rsqrt one ulp off on the CPU, amplified by a
    layer norm of near-equal values) and nothing far from it: the value moved by 10 % is reported."""
    import tests.fuzz.run as run
    prog = json.loads((REGRESSIONS / "seed_30137.json").read_text())["program"]
    got = execute(prog, "tpu", "strict")
    ref = execute(prog, "cpu", tape=got["tape"])
    rounded = execute(prog, "cpu", tape=got["tape"], rounded=True)
    f64 = execute(prog, "cpu", tape=got["tape"], promote=True)
    assert run.compare(prog, got, ref, "strict", lambda n: [lambda: f64]) is not None  # the CPU and float64 disagree
    assert run.compare(prog, got, ref, "strict", lambda n: [lambda: f64, lambda: rounded]) is None
    bad = {**got, "values": {**got["values"], "v3": got["values"]["v3"] * 1.1}}
    assert "v3" in (run.compare(prog, bad, ref, "strict", lambda n: [lambda: f64, lambda: rounded]) or "")


def test_dist_fuzz_tpu_dist_against_gloo():
    """Random collectives on a "cpu:gloo,tpu:tpu_dist" group of 2 processes,
    strict and defer: tpu_dist gives Gloo's answers on the same values."""
    from . import dist
    recs = dist.campaign(0, 60, 2)
    bad = [r for r in recs if r["status"] != "ok"]
    assert not bad and len(recs) == 60 * 2 * 2, bad[:5]


def test_dist_fuzz_all_to_all_from_a_rank_that_sends_nothing():
    """Seed 1000, statement 42: all_to_all_single with uneven splits where
    rank 0 sends no rows; tpu_dist's cross-rank check took the ranks' row
    sizes for a mismatch (a rank with no rows had none) and refused it."""
    from . import dist
    st = dist.generate(1000, 43, 2)[42]
    assert st["op"] == "all_to_all_single" and sum(st["splits"][0]) == 0
    recs = dist.campaign(1000, 43, 2, only=(42,))
    assert [r["status"] for r in recs] == ["ok"] * 4, recs


def test_generator_keeps_discrete_functions_off_inexact_values():
    """A function that jumps where its input rounds (floor, sign, logical_not: x == 0, ...) is generated on
    exact values only: seed 702234 applied logical_not to gelu(-5.84), 0 in the CPU's float arithmetic and the
    exact -1.6e-8 on tpu."""
    discrete = {"isnan", "isfinite", "signbit", "floor", "ceil", "trunc", "round", "sign", "frac", "logical_not"}
    for seed in [702234, *range(702200, 702260)]:
        prog = generate(seed)
        exact = {st["out"]: st.get("x", False) for st in prog["stmts"] if st.get("out") is not None}
        for st in prog["stmts"]:
            if st["op"] == "unary" and st["p"].get("f") in discrete:
                assert exact.get(st["in"][0], False), f"seed {seed}: {st}"
