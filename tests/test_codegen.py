"""Generated elementwise kernels (runtime/src/graph/codegen.c) under DeferAndFuse:
training steps and fused chains give strict mode's bits with TORCH_TPU_CODEGEN=sync
(every fused launch compiled before it runs), with TORCH_TPU_CODEGEN=0 (interpreter
only) and in the default background mode; the counters show which tier ran; the
doctor reports the compiler. Each configuration runs in its own process (the mode is
read once)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_python

# A small MLP training step (GEMM epilogues, GELU, dropout with a fixed seed,
# LayerNorm, SGD with momentum), then GELU- / LayerNorm-like chains, a dropout
# and a bfloat16 chain; sha256 of every result's bytes and the codegen counters.
SCRIPT = r"""
import hashlib, json, sys, time
import torch, torch_tpu
import torch.nn.functional as F

torch_tpu.set_execution_mode(sys.argv[1])
steps = int(sys.argv[2])
torch.manual_seed(0)
torch.tpu.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Dropout(0.1),
                            torch.nn.Linear(128, 64), torch.nn.LayerNorm(64)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(32, 64).to("tpu")
y = torch.randn(32, 64).to("tpu")
wait = sys.argv[3] == "wait"

def step():
    out = model(x)
    loss = F.mse_loss(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss

for i in range(steps):
    loss = step()
    if wait and i == 0:  # background mode: let the first step's kernels compile
        torch.tpu.synchronize()
        for _ in range(1200):
            if torch.tpu.defer_stats()["codegen_kernels"] >= 3:
                break
            time.sleep(0.05)

a = torch.randn(257, 129).to("tpu")
b = torch.randn(129).to("tpu")
chain = F.gelu(a * 1.5 + b).tanh() * torch.sigmoid(a) - a.square() / (b.abs() + 1)
mu = a.mean(-1, keepdim=True)
var = ((a - mu) ** 2).mean(-1, keepdim=True)
ln = (a - mu) * torch.rsqrt(var + 1e-5) * b + 0.5
drop = F.dropout(a * 2 + 1, p=0.3, training=True) * b
bf = (a.bfloat16() * 3 + b.bfloat16()).float().relu() * 0.25
a.mul_(0.5).add_(b).clamp_(-1, 1)
results = [p.detach().cpu() for p in model.parameters()]
results += [loss.detach().cpu(), chain.cpu(), ln.cpu(), drop.cpu(), bf.cpu(), a.cpu()]
hashes = [hashlib.sha256(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest() for t in results]
st = torch.tpu.defer_stats()
print(json.dumps({"hashes": hashes, "stats": {k: v for k, v in st.items() if k.startswith("codegen")}}))
"""


def run(mode: str, codegen: str, steps: int = 3, wait: bool = False) -> dict:
    env = {"TORCH_TPU_CODEGEN": codegen}
    r = run_python(SCRIPT.replace("sys.argv[1]", repr(mode)).replace("sys.argv[2]", str(steps))
                   .replace("sys.argv[3]", repr("wait" if wait else "")), env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def strict() -> dict:
    return run("strict", "0")


def test_defer_generated_matches_strict_and_interpreter(strict):
    interp = run("defer", "0")
    gen = run("defer", "sync")
    assert interp["hashes"] == strict["hashes"]
    assert gen["hashes"] == strict["hashes"]
    assert interp["stats"]["codegen_launches_compiled"] == 0
    assert interp["stats"]["codegen_launches_interpreted"] > 0
    s = gen["stats"]
    assert s["codegen_kernels"] > 0 and s["codegen_failures"] == 0
    assert s["codegen_launches_compiled"] > 0
    assert s["codegen_compile_seconds"] > 0


def test_strict_generated_matches(strict):
    gen = run("strict", "sync")
    assert gen["hashes"] == strict["hashes"]


def test_background_compile_serves_later_steps(strict):
    # the first step runs interpreted while its kernels compile, later steps compiled
    gen = run("defer", "1", steps=3, wait=True)
    assert gen["hashes"] == strict["hashes"]
    assert gen["stats"]["codegen_launches_compiled"] > 0
    assert gen["stats"]["codegen_launches_interpreted"] > 0


def test_missing_compiler_warns_and_interprets(strict):
    r = run_python(SCRIPT.replace("sys.argv[1]", "'defer'").replace("sys.argv[2]", "3")
                   .replace("sys.argv[3]", "''"), {"TORCH_TPU_CODEGEN": "sync", "CC": "/nonexistent/cc"}, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hashes"] == strict["hashes"]
    assert out["stats"]["codegen_launches_compiled"] == 0 and out["stats"]["codegen_failures"] > 0
    assert r.stderr.count("torch_tpu: generated kernels are unavailable") == 1


def test_doctor_reports_generated_kernels():
    exe = os.path.join(os.path.dirname(sys.executable), "torch-tpu")
    r = subprocess.run([exe, "doctor"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[ok]   generated kernels: " in r.stdout and "-march=" in r.stdout
    r = subprocess.run([exe, "doctor"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "CC": "/nonexistent/cc"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "generated kernels: unavailable: C compiler '/nonexistent/cc' not found" in r.stdout
