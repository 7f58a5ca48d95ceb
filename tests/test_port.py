"""`torch-tpu port`: findings and rewrites on realistic CUDA training scripts
(tests/port_samples: ImageNet-style and word-language-model-style); the
rewritten scripts run on tpu and match the originals run on CPU."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_tpu.port import port_source

SAMPLES = Path(__file__).parent / "port_samples"


def _run(script: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_findings_cover_the_cuda_idioms():
    src = (SAMPLES / "imagenet_train.py").read_text()
    new, findings = port_source(src, "imagenet_train.py")
    codes = {f.code for f in findings}
    lines = src.splitlines()
    for f in findings:  # every finding points at its code
        assert f.code.split("(")[0].split(".")[-1] in lines[f.line - 1] or f.code[:10] in lines[f.line - 1]
    assert "torch.cuda.is_available" in codes
    assert "model.cuda(args.gpu)" in codes and "model.cuda()" in codes
    assert "x.cuda(non_blocking=True)" in codes
    assert "torch.cuda.amp.GradScaler(enabled=args.amp)" in codes
    assert "torch.cuda.amp.autocast(enabled=args.amp)" in codes
    assert "torch.cuda.synchronize" in codes and "torch.cuda.max_memory_allocated" in codes
    assert any(f.code == '"cuda"' for f in findings)
    assert any("cudnn" in f.suggestion or "cuDNN" in f.suggestion for f in findings)
    assert "torch.cuda" not in new.replace("torch.backends.cudnn", "")
    assert 'torch.amp.GradScaler("tpu", enabled=args.amp)' in new
    assert 'torch.autocast("tpu", enabled=args.amp)' in new
    assert "x.to(torch.accelerator.current_accelerator(), non_blocking=True)" in new
    # formatting and comments kept: only the rewritten spans change
    assert new.count("\n") == src.count("\n")
    assert '"""A small ImageNet-style training script' in new


def test_distributed_and_strings():
    src = ('import torch.distributed as dist\n'
           'dist.init_process_group(backend="nccl", init_method="env://")  # comm\n'
           'dist.init_process_group("nccl")\n'
           'd = f"cuda:{rank}"\n'
           't = torch.ones(2, device="cuda:1")\n'
           'ok = t.is_cuda\n'
           'from torch.cuda.amp import autocast\n'
           's = "cudaMalloc is not a device"\n')
    new, findings = port_source(src)
    assert new.splitlines()[1] == 'dist.init_process_group(backend="tpu_dist", init_method="env://")  # comm'
    assert new.splitlines()[2] == 'dist.init_process_group("tpu_dist")'
    assert 'f"tpu:{rank}"' in new and 'device="tpu:1"' in new and "t.is_tpu" in new
    assert '"cudaMalloc is not a device"' in new
    manual = [f for f in findings if not f.fixable]
    assert len(manual) == 1 and manual[0].line == 7


def test_streams_events_seeds_memory_and_pin_memory_device_rewritten_and_run():
    """The rest of torch.cuda the issue names (streams, events, seeding, the
    memory calls, pin_memory_device, cuDNN flags): each finding, its rewrite,
    and the rewritten code running on tpu with the CPU's values."""
    src = ('import torch\n'
           'torch.cuda.manual_seed_all(0)\n'
           'torch.cuda.manual_seed(1)\n'
           's = torch.cuda.Stream()\n'
           'start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n'
           'x = torch.arange(6.0).cuda()\n'
           'start.record()\n'
           's.wait_stream(torch.cuda.current_stream())\n'
           'with torch.cuda.stream(s):\n'
           '    y = x * 2  # on the side stream\n'
           'end.record(s)\n'
           'torch.cuda.current_stream().wait_stream(s)\n'
           'end.synchronize()\n'
           'torch.cuda.empty_cache()\n'
           'mem = torch.cuda.memory_allocated()\n'
           'torch.backends.cudnn.deterministic = True\n'
           'loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2, pin_memory=True,\n'
           '                                     pin_memory_device="cuda")\n'
           'batches = [b.tolist() for b in loader]\n'
           'out = (y + 1).cpu().tolist()\n')
    new, findings = port_source(src)
    by_line = {f.line: f for f in findings}
    assert by_line[2].suggestion == "torch.tpu.manual_seed_all" and by_line[3].suggestion == "torch.tpu.manual_seed"
    assert by_line[4].suggestion == "torch.tpu.Stream" and by_line[9].suggestion == "torch.tpu.stream"
    assert {f.suggestion for f in findings if f.line == 5} == {"torch.Event"}
    assert {f.suggestion for f in findings if f.line in (8, 12)} == {"torch.accelerator.current_stream"}
    assert by_line[14].suggestion == "torch.accelerator.empty_cache"
    assert by_line[15].suggestion == "torch.accelerator.memory_allocated"
    assert not by_line[16].fixable and "cuDNN" in by_line[16].suggestion
    assert by_line[18].suggestion == '"tpu"'
    assert "torch.cuda" not in new.replace("torch.backends.cudnn", "")
    assert "# on the side stream" in new and new.count("\n") == src.count("\n")
    scope: dict = {}
    exec(compile(new, "ported.py", "exec"), scope)
    assert scope["y"].device.type == "tpu" and scope["s"].device.type == "tpu"
    assert scope["out"] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert scope["start"].elapsed_time(scope["end"]) >= 0
    assert scope["batches"] == [[0, 1], [2, 3]] and scope["mem"] > 0


@pytest.mark.parametrize("name,args", [("imagenet_train.py", ["--epochs", "1"]),
                                       ("word_language_model.py", ["--cuda"])])
def test_fixed_script_runs_on_tpu_and_matches_cpu(tmp_path, name, args):
    shutil.copy(SAMPLES / name, tmp_path / name)
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "port", str(tmp_path), "--fix", "--diff"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "rewritten" in r.stdout and "+++ b/" in r.stdout
    again = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "port", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert all("[fix]" not in line for line in again.stdout.splitlines())  # nothing left to rewrite
    ref = _run(SAMPLES / name, *args)  # the original: no CUDA here, so CPU
    assert ref["device"] == "cpu"
    got = _run(tmp_path / name, *args)
    assert got["device"].startswith("tpu")
    assert got["loss"] == pytest.approx(ref["loss"], rel=2e-3, abs=2e-4)
