"""Kernel levels chosen at run time (TORCH_TPU_ISA) as PyTorch code sees them:
every level the host can run gives bf16 matmuls, autocast linears (forward
and backward) and bf16 convolutions within the precision contract of a
float64 reference; each level runs the engine library compiled for it (the
x86-64 level variants: lib/libtpurt.so, lib/glibc-hwcaps/x86-64-v3|v4/),
and the elementwise (the double-evaluated float functions of ew_dmath.h
included), reduction, normalization and random sampling kernels give the
same bits in every variant; the chosen paths show in get_device_properties and
``torch-tpu doctor``; a level the host lacks is a clear error."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu import _C
from tests.conftest import ROOT, run_python

LEVELS = ["scalar", "avx2", "avx512", "amx"]
HOST = _C._cpu_info()
RUNNABLE = LEVELS[: LEVELS.index(HOST["host_isa"]) + 1]

# Each case: the worst error of the tpu result over the contract's bound
# (f32 accumulation over K of exact bf16 products, plus the result's bf16
# rounding), and the path that ran.
CHILD = r"""
import json, torch, torch_tpu
from torch_tpu import _C
torch.manual_seed(0)
out = {"path": _C._cpu_info()["bf16_matmul"], "isa": _C._cpu_info()["isa"], "worst": 0.0,
       "build": _C._cpu_info()["build"],
       "mapped": sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/libtpurt.so")})}
def check(got, ref, mag, k, bf16_out):
    bound = (k + 2) * 2.0**-23 * mag + (2.0**-8 * ref.abs() if bf16_out else 0) + 1e-30
    out["worst"] = max(out["worst"], ((got.double() - ref) .abs() / bound).max().item())
for m, n, k in [(1, 1, 1), (7, 5, 3), (33, 47, 61), (130, 290, 40), (257, 31, 1030), (64, 1100, 96)]:
    a = torch.randn(m, k).bfloat16(); b = torch.randn(k, n).bfloat16()
    ref = a.double() @ b.double(); mag = a.double().abs() @ b.double().abs()
    check((a.to("tpu") @ b.to("tpu")).cpu(), ref, mag, k, True)
    # transposed and sliced operands
    at = a.t().contiguous().t(); bs = torch.cat([b, b], 1)[:, ::2]
    check((at.to("tpu") @ b.to("tpu")).cpu(), ref, mag, k, True)
    check((a.to("tpu") @ torch.cat([b, b], 1).to("tpu")[:, ::2]).cpu(), a.double() @ bs.double(),
          a.double().abs() @ bs.double().abs(), k, True)
# batched
a = torch.randn(5, 37, 70).bfloat16(); b = torch.randn(5, 70, 29).bfloat16()
check(torch.bmm(a.to("tpu"), b.to("tpu")).cpu(), a.double() @ b.double(), a.double().abs() @ b.double().abs(), 70, True)
# autocast linear forward and backward (the weight's gradient is a product over the batch)
lin = torch.nn.Linear(96, 80)
x = torch.randn(64, 96)
dl = torch.nn.Linear(96, 80).to("tpu"); dl.load_state_dict(lin.state_dict())
dx = x.to("tpu").requires_grad_()
with torch.autocast("tpu", torch.bfloat16):
    y = dl(dx)
assert y.dtype == torch.bfloat16, y.dtype
y.float().sum().backward()
xb, wb = x.bfloat16().double(), lin.weight.bfloat16().double()
ref = xb @ wb.t() + lin.bias.bfloat16().double()
check(y.cpu(), ref, xb.abs() @ wb.abs().t() + lin.bias.double().abs(), 96, True)
g = torch.ones(64, 80, dtype=torch.float64)
check(dl.weight.grad.cpu(), g.t() @ xb, g.t() @ xb.abs(), 64, True)
# bf16 convolution
c = torch.randn(2, 8, 9, 9).bfloat16(); w = torch.randn(6, 8, 3, 3).bfloat16()
ref = torch.nn.functional.conv2d(c.double(), w.double(), padding=1)
mag = torch.nn.functional.conv2d(c.double().abs(), w.double().abs(), padding=1)
check(torch.nn.functional.conv2d(c.to("tpu"), w.to("tpu"), padding=1).cpu(), ref, mag, 72, True)
print(json.dumps(out))
"""


@pytest.mark.parametrize("level", RUNNABLE)
def test_level_results_within_contract(level):
    r = run_python(CHILD, env={"TORCH_TPU_ISA": level}, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["isa"] == level
    want = {"amx": "amx-bf16 tiles",
            "avx512": "avx512-bf16 dot products" if HOST["features"]["avx512_bf16"] else "f32 GEMM"}.get(level,
                                                                                                   "f32 GEMM")
    assert out["path"] == want
    assert out["worst"] <= 1.0, out
    # the library variant of the level, and only it, is mapped
    assert len(out["mapped"]) == 1, out["mapped"]
    if HOST["build"] != "native":
        variant = VARIANT[level]
        assert out["build"] == variant
        rel = "lib/libtpurt.so" if variant == "x86-64" else f"lib/glibc-hwcaps/{variant}/libtpurt.so"
        assert out["mapped"][0].endswith("/torch_tpu/" + rel), out["mapped"]


VARIANT = {"scalar": "x86-64", "avx2": "x86-64-v3", "avx512": "x86-64-v4", "amx": "x86-64-v4"}

# Kernels whose results the variants must not change: element order and
# every rounding are the source's (-ffp-contract=off, explicit fmaf, fixed
# eight-lane sums), whatever vector width the compiler picked.
BITS_CHILD = r"""
import hashlib, torch, torch_tpu
import torch.nn.functional as F
torch.manual_seed(0)
x = torch.randn(67, 129) * 3
w, b = torch.randn(129), torch.randn(129)
h = hashlib.sha256()
t = x.to("tpu")
for y in [t.exp(), t.tanh(), t.sigmoid(), F.gelu(t), F.gelu(t, approximate="tanh"), F.silu(t), t.erf(), t.abs().log(),
          t.abs().sqrt(), t.softmax(-1), t.log_softmax(0), F.layer_norm(t, (129,), w.to("tpu"), b.to("tpu")),
          t.sum(0), t.sum(1), t.mean(), t.var(1), t.amax(0), t.cumsum(1), t.bfloat16(), t.half(), (t * 2 + 1) / 3,
          F.dropout(t, 0.3, training=True), torch.randn(1001, device="tpu"),
          torch.randn(1001, device="tpu", dtype=torch.float64), torch.rand(1001, device="tpu", dtype=torch.float64),
          torch.empty(1001, device="tpu").log_normal_(0.1, 0.5), torch.empty(1001, device="tpu").bernoulli_(0.3),
          t.sin(), t.cos(), t.tan(), t.atan(), (t / 9).asin(), (t / 9).acos(), t.sinh(), t.cosh(), t.exp2(),
          t.expm1(), t.abs().log2(), t.abs().log10(), torch.atan2(t, t.flip(0)), torch.hypot(t, t.flip(0)),
          t.abs().pow(t.flip(0)), t.pow(3.0), torch.fmod(t, t.flip(0)), torch.remainder(t, 0.7), F.elu(t),
          (t * 1e5).sin()]:
    h.update(y.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
# the norms' backward passes (f32 rows read in place: eight double lanes in one or two registers)
wt, bt, g = w.to("tpu"), b.to("tpu"), t.flip(0) / 3
_, mu, rs = torch.ops.aten.native_layer_norm(t, [129], wt, bt, 1e-5)
grads = list(torch.ops.aten.native_layer_norm_backward(g, t, [129], mu, rs, wt, bt, [True, True, True]))
if hasattr(torch.ops.aten, "_fused_rms_norm_backward"):
    y, r = torch.ops.aten._fused_rms_norm(t, [129], wt, 1e-6)
    grads += [y] + list(torch.ops.aten._fused_rms_norm_backward(g, t, [129], r, wt, [True, True]))
for y in grads:
    h.update(y.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
print(h.hexdigest())
"""


def assert_same_digest(child: str, levels) -> None:
    """child (printing a digest last) succeeds at each level and prints the same digest at all of them."""
    digests = {}
    for level in levels:
        r = run_python(child, env={"TORCH_TPU_ISA": level}, timeout=300)
        assert r.returncode == 0, r.stderr
        digests[level] = r.stdout.strip().splitlines()[-1]
    assert len(set(digests.values())) == 1, digests


def test_variants_give_the_same_bits():
    assert_same_digest(BITS_CHILD, RUNNABLE)


def test_default_maps_the_best_variant_the_host_runs():
    if HOST["build"] == "native":
        pytest.skip("a TPURT_NATIVE build has one library")
    r = run_python("import torch_tpu; from torch_tpu import _C; print(_C._cpu_info()['build'])",
                   env={"TORCH_TPU_ISA": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == VARIANT[HOST["host_isa"]]


def test_properties_show_the_host():
    p = torch.tpu.get_device_properties(0)
    assert p.host_cpu == HOST["model"] and p.host_isa == HOST["isa"]
    assert p.bf16_matmul in ("amx-bf16 tiles", "avx512-bf16 dot products", "f32 GEMM")
    assert p.bf16_conv == HOST["bf16_conv"] and p.bf16_conv in (
        "amx-bf16 tiles", "avx512-bf16 dot products for large passes, f32 implicit GEMM below", "f32 implicit GEMM")
    assert HOST["isa"] in LEVELS and HOST["l2_bytes"] >= 0


def test_unknown_level_is_an_error():
    r = run_python("import torch, torch_tpu; torch.ones(2, device='tpu')", env={"TORCH_TPU_ISA": "sse9"})
    assert r.returncode != 0
    assert "TORCH_TPU_ISA=sse9: unknown level" in r.stderr


def test_missing_level_is_an_error():
    # AMX turned off for the process makes "amx" a level this host lacks, on any host
    r = run_python("import torch, torch_tpu; torch.ones(2, device='tpu')",
                   env={"TORCH_TPU_ISA": "amx", "TORCH_TPU_AMX": "0"})
    assert r.returncode != 0
    assert "TORCH_TPU_ISA=amx: this CPU" in r.stderr and "cannot run it" in r.stderr


def test_doctor_prints_the_host_line():
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "doctor"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "host:" in ln)
    assert HOST["bf16_matmul"] in line and f"kernel level {HOST['isa']}" in line
    assert f"bf16 convolutions on {HOST['bf16_conv']}" in line
    assert f"engine library built for {HOST['build']}" in line


# Batch and group norm read f32 / bf16 rows of unit stride as vectors at the
# avx2 and avx512 levels (norm.c: the same lanes, sets and reduction tree in
# 4- and 8-lane registers): each level's forward and backward passes against
# a float64 reference, full 16-element chunks, tails, short rows (batch norm's
# channel blocks) and bf16 stores; both levels give the same bits.
NORM_CHILD = r"""
import hashlib, torch, torch_tpu
import torch.nn.functional as F
torch.manual_seed(0)
h = hashlib.sha256()
for dt in (torch.float32, torch.bfloat16):
    for shape, G in [((4, 32, 16, 16), 8), ((4, 64, 4, 4), 8), ((3, 6, 7, 5), 3), ((8, 128, 8, 8), 4),
                     ((2, 8, 33, 1), 2), ((5, 4, 19, 11), 2)]:
        C = shape[1]
        x = (torch.randn(*shape) * 3 + 1).to(dt)
        w, b, g = torch.randn(C).to(dt), torch.randn(C).to(dt), torch.randn(*shape).to(dt)
        for name in ("group", "batch"):
            def fn(x, w, b):
                return F.group_norm(x, G, w, b) if name == "group" else F.batch_norm(x, None, None, w, b, training=True)
            ins = [t.to("tpu").requires_grad_() for t in (x, w, b)]
            y = fn(*ins)
            got = [y] + list(torch.autograd.grad(y, ins, g.to("tpu")))
            ref_in = [t.double().requires_grad_() for t in (x, w, b)]
            yr = fn(*ref_in)
            ref = [yr] + list(torch.autograd.grad(yr, ref_in, g.double()))
            for k, (a, r) in enumerate(zip(got, ref)):
                a = a.detach().cpu()
                assert a.dtype == dt, (name, shape, k, a.dtype)
                scale = r.abs().max().item() + 1e-30
                tol = (2.0 ** -7 if dt == torch.bfloat16 else 2e-5) * scale
                err = (a.double() - r).abs().max().item()
                assert err <= tol, (name, str(dt), shape, k, err, tol)
                h.update(a.float().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
print(h.hexdigest())
"""


def test_batch_and_group_norm_vector_rows_at_every_level():
    levels = [lv for lv in ("avx2", "avx512") if lv in RUNNABLE]
    if not levels:
        pytest.skip("the host runs neither the avx2 nor the avx512 level")
    assert_same_digest(NORM_CHILD, levels)
