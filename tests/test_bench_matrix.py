"""The benchmark matrix machinery on a tiny configuration: one workload
(minGPT, batch 2), 1 repeat, cpu eager + tpu strict + tpu defer (Inductor is
left out to keep it fast), plus a workload that does not exist (must be
reported as missing). Checks the JSON, the Markdown table and the PNG charts
and that they agree."""
from __future__ import annotations

import json

import pytest
import torch

import torch_tpu  # noqa: F401
from bench import common, matrix, plot
from examples.common import read_png_size

CONFIGS = ("cpu eager", "tpu strict", "tpu defer", "tpu compiled")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("results")
    mp = pytest.MonkeyPatch()
    mp.setattr(common, "RESULTS", out_dir)
    logs: list[str] = []
    try:
        res = matrix.run("quick", 1, workloads=("mingpt", "no_such_workload"), configs=CONFIGS,
                         inference=("mingpt",), batch=2, log=logs.append)
        path = common.save("matrix", res)
        pngs = plot.matrix(res)
    finally:
        mp.undo()
    return res, path, pngs, out_dir, logs


def test_json_roundtrip_and_fields(result):
    res, path, _, out_dir, _ = result
    assert path.parent == out_dir and path.name == "matrix.json"
    data = json.loads(path.read_text())
    assert data["configs"] == list(CONFIGS)
    assert data["machine"]["cores"] and data["machine"]["torch"] == torch.__version__
    w = data["workloads"]["mingpt"]
    assert w["status"] == "ok"
    for kind in ("train", "infer"):
        t = w[kind]
        assert t["batch"] == 2 and t["units"] == "tokens/s" and t["params"] > 0
        assert set(t["configs"]) == set(CONFIGS)
        for c, v in t["configs"].items():
            assert v["status"] == "ok", (kind, c, v)
            assert v["step_s"] > 0 and len(v["samples_s"]) == 1
            assert v["throughput"] == pytest.approx(t["per_step"] / v["step_s"])
            assert v["peak_bytes"] > 0
        cells = t["configs"]
        assert cells["cpu eager"]["speed_vs_cpu_eager"] == pytest.approx(1.0)
        assert cells["tpu strict"]["speed_vs_tpu_strict"] == pytest.approx(1.0)
        assert cells["tpu defer"]["speed_vs_cpu_eager"] == pytest.approx(
            cells["cpu eager"]["step_s"] / cells["tpu defer"]["step_s"])
        st = cells["tpu defer"]["defer_stats"]
        assert st["graphs_built"] >= 1 and st["cache_hits"] >= 1  # warm-up builds, later steps reuse


def test_peak_memory_covers_resident_state(result):
    res, *_ = result
    t = res["workloads"]["mingpt"]["train"]
    params = t["params"]
    # parameters + gradients + two AdamW moments, float32, on either device
    for c in CONFIGS:
        assert t["configs"][c]["peak_bytes"] >= 4 * 4 * params, c
    inf = res["workloads"]["mingpt"]["infer"]
    for c in CONFIGS:
        assert 4 * params <= inf["configs"][c]["peak_bytes"] < t["configs"][c]["peak_bytes"], c


def test_missing_is_reported_loudly(result):
    res, path, _, _, logs = result
    data = json.loads(path.read_text())
    assert data["missing"] == ["no_such_workload"]
    assert data["workloads"]["no_such_workload"]["status"] == "missing"
    assert any("MISSING" in line and "no_such_workload" in line for line in logs)
    md = matrix.describe(res)
    assert "MISSING workloads: no_such_workload" in md


def test_markdown_matches_json(result):
    res, *_ = result
    md = matrix.table(res)
    lines = md.splitlines()
    assert lines[0].startswith("| workload |") and lines[1].startswith("|---")
    rows = [line.split(" | ") for line in lines[2:]]
    assert len(rows) == 2 * len(CONFIGS) + 1  # train + infer per config, one missing row
    t = res["workloads"]["mingpt"]["train"]["configs"]
    for c in CONFIGS:
        row = next(r for r in rows if r[1] == "train" and r[2] == c)
        assert row[3] == f"{t[c]['step_s'] * 1e3:.1f}"
        assert row[7] == f"{t[c]['peak_bytes'] / 2**20:.1f}"
    assert "graphs" in next(r for r in rows if r[2] == "tpu defer")[8]


def test_pngs_valid(result):
    _, _, pngs, out_dir, _ = result
    assert [p.name for p in pngs] == ["matrix_speed.png", "matrix_memory.png"]
    for p in pngs:
        assert p.parent == out_dir
        w, h = read_png_size(str(p))
        assert w > 300 and h > 200


def test_error_cell_is_reported(monkeypatch):
    """A configuration that fails shows its error instead of disappearing."""
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 4)
    batches = [(torch.randn(3, 8), torch.randn(3, 4))]
    loss_fn = torch.nn.functional.mse_loss

    def broken(*a, **k):
        raise NotImplementedError("aten::fake_op is not implemented for tpu")

    real = matrix.Runner.step
    monkeypatch.setattr(matrix.Runner, "step",
                        lambda self: broken() if self.config == "tpu strict" else real(self))
    res = matrix.run_task("tiny", base, batches, loss_fn, True, ("cpu eager", "tpu strict"), 1, warmup=1,
                          log=lambda s: None)
    cell = res["configs"]["tpu strict"]
    assert cell["status"] == "error" and "fake_op" in cell["error"]
    assert res["configs"]["cpu eager"]["status"] == "ok"
    assert res["configs"]["cpu eager"]["speed_vs_tpu_strict"] is None
    md = matrix.table({"workloads": {"tiny": {"status": "ok", "train": res}}})
    assert "error: NotImplementedError: aten::fake_op" in md


def test_command_line_defaults_to_the_quick_preset(monkeypatch, tmp_path):
    """`python -m bench matrix` without --quick/--full runs the quick preset."""
    from bench import __main__ as cli

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    seen = {}

    def fake_run(preset, repeats, workloads, configs):
        seen.update(preset=preset, repeats=repeats)
        return {"missing": [], "preset": preset}

    monkeypatch.setattr(matrix, "run", fake_run)
    monkeypatch.setattr(matrix, "describe", lambda res: "")
    monkeypatch.setattr(plot, "matrix", lambda res: [])
    assert cli.main(["matrix"]) == 0
    assert seen == {"preset": "quick", "repeats": 3}
    assert cli.main(["matrix", "--full"]) == 0
    assert seen == {"preset": "full", "repeats": 10}
