"""Matrix products on the tpu device vs PyTorch CPU: mm/bmm/addmm/baddbmm/
addmv/mv/dot (functional, out=, in-place), matmul/linear composites,
non-contiguous and broadcast operands, float32/bfloat16/float16/float64/int,
autograd, errors like CPU, and the float32 precision modes."""
from __future__ import annotations

import pytest
import torch

import torch_tpu

FLOAT_TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-10, 1e-10), torch.bfloat16: (2e-2, 2e-2),
             torch.float16: (2e-3, 2e-3)}
MY_OPS = ("mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "dot")


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def close(got, want, dtype=None):
    dtype = dtype or want.dtype
    assert got.device.type == "tpu"
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype.is_floating_point:
        rtol, atol = FLOAT_TOL[dtype]
        # low-precision dtypes: CPU may round intermediate results differently
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol * max(1.0, want.double().abs().max().item() if want.numel() else 1.0))
    else:
        assert torch.equal(got, want)


@pytest.fixture
def fallback_for_others():
    """Ops of other families (sum, add, ...) may run through the CPU fallback
    in these tests; the matmul ops themselves must not."""
    torch_tpu._C._set_cpu_fallback(True)
    torch_tpu._C._reset_fallback_counts()
    yield
    stats = torch.tpu.fallback_stats()
    torch_tpu._C._set_cpu_fallback(False)
    bad = [k for k in stats if any(k == f"aten::{o}" or k.startswith(f"aten::{o}.") for o in MY_OPS)]
    assert not bad, f"matmul ops fell back to the CPU: {bad}"


@pytest.fixture(autouse=True)
def _highest():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    torch.tpu.precision.set(None)
    yield
    torch.set_float32_matmul_precision(old)
    torch.tpu.precision.set(None)


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mm_dtypes(dtype):
    a, b = rand(33, 47, dtype=dtype), rand(47, 21, dtype=dtype, seed=1)
    close(torch.mm(a.to("tpu"), b.to("tpu")), torch.mm(a, b))
    close(a.to("tpu") @ b.to("tpu"), a @ b)


@pytest.mark.parametrize("layout", ["tt", "tn", "nt", "strided", "expanded"])
def test_mm_layouts(layout):
    a, b = rand(40, 30), rand(30, 50, seed=1)
    if layout == "tt":
        a, b = rand(30, 40).t(), rand(50, 30, seed=1).t()
    elif layout == "tn":
        a = rand(30, 40).t()
    elif layout == "nt":
        b = rand(50, 30, seed=1).t()
    elif layout == "strided":
        a, b = rand(80, 60)[::2, ::2], rand(30, 150, seed=1)[:, ::3]
    else:
        a = rand(1, 30).expand(40, 30)
    da, db = a.to("tpu"), b.to("tpu")
    if layout in ("tt", "tn", "nt"):
        da = a.t().contiguous().to("tpu").t() if layout in ("tt", "tn") else da
        db = b.t().contiguous().to("tpu").t() if layout in ("tt", "nt") else db
    elif layout == "strided":
        da = rand(80, 60).to("tpu")[::2, ::2]
        db = rand(30, 150, seed=1).to("tpu")[:, ::3]
    else:
        da = rand(1, 30).to("tpu").expand(40, 30)
    close(torch.mm(da, db), torch.mm(a, b))


def test_mm_out_and_transposed_out():
    a, b = rand(20, 10), rand(10, 15, seed=1)
    out = torch.empty(15, 20, device="tpu").t()
    r = torch.mm(a.to("tpu"), b.to("tpu"), out=out)
    assert r is out
    close(out, a @ b)
    out2 = torch.empty(0, device="tpu")
    torch.mm(a.to("tpu"), b.to("tpu"), out=out2)
    close(out2, a @ b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64], ids=str)
def test_addmm_forms(dtype):
    s, a, b = rand(7, 9, dtype=dtype, seed=2), rand(7, 5, dtype=dtype), rand(5, 9, dtype=dtype, seed=1)
    ds, da, db = s.to("tpu"), a.to("tpu"), b.to("tpu")
    beta, alpha = (2, 3) if not dtype.is_floating_point else (0.5, 1.5)
    close(torch.addmm(ds, da, db, beta=beta, alpha=alpha), torch.addmm(s, a, b, beta=beta, alpha=alpha))
    # broadcast bias (like nn.Linear)
    bias = rand(9, dtype=dtype, seed=3)
    close(torch.addmm(bias.to("tpu"), da, db), torch.addmm(bias, a, b))
    out = torch.empty(7, 9, dtype=dtype, device="tpu")
    torch.addmm(ds, da, db, out=out)
    close(out, torch.addmm(s, a, b))
    ds.addmm_(da, db, beta=beta, alpha=alpha)
    close(ds, s.addmm(a, b, beta=beta, alpha=alpha))


def test_addmm_beta_zero_ignores_nan():
    s = torch.full((4, 4), float("nan"))
    a, b = rand(4, 3), rand(3, 4, seed=1)
    close(torch.addmm(s.to("tpu"), a.to("tpu"), b.to("tpu"), beta=0), torch.addmm(s, a, b, beta=0))


@pytest.mark.parametrize("N,K", [(1, 1), (7, 5), (384, 128), (1000, 257), (32000, 64)])
@pytest.mark.parametrize("weight", ["linear", "plain"])
def test_one_row_products(N, K, weight):
    """M = 1 (a decode step's projections) runs as matrix-vector slices: both
    weight layouts, a transposed row, alpha / beta, and NaN in an output that
    beta = 0 must not read."""
    x, xt = rand(1, K), rand(K, 1, seed=3)
    w = rand(N, K, seed=1) if weight == "linear" else rand(K, N, seed=1)
    op = (lambda t: t.t()) if weight == "linear" else (lambda t: t)
    close(x.to("tpu") @ op(w.to("tpu")), x @ op(w))
    out = torch.full((1, N), float("nan"), device="tpu")
    torch.mm(x.to("tpu"), op(w.to("tpu")), out=out)
    close(out, x @ op(w))
    b = rand(1, N, seed=2)
    close(torch.addmm(b.to("tpu"), xt.to("tpu").t(), op(w.to("tpu")), beta=0.5, alpha=2.0),
          torch.addmm(b, xt.t(), op(w), beta=0.5, alpha=2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32], ids=str)
def test_bmm_baddbmm(dtype):
    a, b = rand(4, 6, 5, dtype=dtype), rand(4, 5, 3, dtype=dtype, seed=1)
    close(torch.bmm(a.to("tpu"), b.to("tpu")), torch.bmm(a, b))
    # transposed batches and a broadcast (stride 0) batch
    at = rand(4, 5, 6, dtype=dtype).transpose(1, 2)
    bb = rand(1, 5, 3, dtype=dtype, seed=4).expand(4, 5, 3)
    dat = rand(4, 5, 6, dtype=dtype).to("tpu").transpose(1, 2)
    dbb = rand(1, 5, 3, dtype=dtype, seed=4).to("tpu").expand(4, 5, 3)
    close(torch.bmm(dat, dbb), torch.bmm(at, bb))
    s = rand(4, 6, 3, dtype=dtype, seed=5)
    beta, alpha = (2, 3) if not dtype.is_floating_point else (0.25, 2.0)
    close(torch.baddbmm(s.to("tpu"), a.to("tpu"), b.to("tpu"), beta=beta, alpha=alpha),
          torch.baddbmm(s, a, b, beta=beta, alpha=alpha))
    ds = s.to("tpu")
    ds.baddbmm_(a.to("tpu"), b.to("tpu"))
    close(ds, s.baddbmm(a, b))
    out = torch.empty(4, 6, 3, dtype=dtype, device="tpu")
    torch.bmm(a.to("tpu"), b.to("tpu"), out=out)
    close(out, torch.bmm(a, b))


def test_matmul_composites():
    x, w = rand(2, 3, 8, 16), rand(16, 12, seed=1)
    close(x.to("tpu") @ w.to("tpu"), x @ w)  # folded into one mm
    y = rand(2, 1, 16, 5, seed=2)
    close(x.to("tpu") @ y.to("tpu"), x @ y)  # broadcast batch -> bmm
    v = rand(16, seed=3)
    close(x.to("tpu") @ v.to("tpu"), x @ v)
    m = rand(12, 16, seed=4)
    close(torch.mv(m.to("tpu"), v.to("tpu")), torch.mv(m, v))
    close(torch.addmv(rand(12, seed=5).to("tpu"), m.to("tpu"), v.to("tpu"), beta=2, alpha=0.5),
          torch.addmv(rand(12, seed=5), m, v, beta=2, alpha=0.5))
    close(torch.dot(v.to("tpu"), rand(16, seed=6).to("tpu")), torch.dot(v, rand(16, seed=6)))
    close(torch.dot(rand(32)[::2].to("tpu"), v.to("tpu")), torch.dot(rand(32)[::2], v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_linear(dtype, fallback_for_others):
    lin = torch.nn.Linear(24, 10).to(dtype)
    x = rand(3, 5, 24, dtype=dtype)
    close(torch.nn.functional.linear(x.to("tpu"), lin.weight.to("tpu"), lin.bias.to("tpu")), lin(x).detach())
    close(torch.nn.functional.linear(x.to("tpu"), lin.weight.to("tpu")),
          torch.nn.functional.linear(x, lin.weight).detach())


def test_empty_and_k0():
    a, b = torch.empty(3, 0), torch.empty(0, 4)
    close(torch.mm(a.to("tpu"), b.to("tpu")), torch.mm(a, b))
    close(torch.mm(torch.empty(0, 5).to("tpu"), rand(5, 4).to("tpu")), torch.mm(torch.empty(0, 5), rand(5, 4)))
    s = rand(3, 4)
    close(torch.addmm(s.to("tpu"), a.to("tpu"), b.to("tpu"), beta=2), torch.addmm(s, a, b, beta=2))


def _same_error(fn, *args):
    with pytest.raises(Exception) as cpu_err:
        fn(*[a for a in args])
    with pytest.raises(type(cpu_err.value)) as tpu_err:
        fn(*[a.to("tpu") for a in args])
    return str(cpu_err.value), str(tpu_err.value)


def test_errors_like_cpu():
    cpu, tpu = _same_error(torch.mm, rand(2, 3), rand(4, 5))
    assert "shapes cannot be multiplied (2x3 and 4x5)" in cpu and "shapes cannot be multiplied (2x3 and 4x5)" in tpu
    _same_error(torch.mm, rand(2, 3), rand(3, 5, dtype=torch.float64))
    _same_error(torch.mm, rand(2, 3, 4), rand(4, 5))
    _same_error(torch.bmm, rand(2, 3, 4), rand(3, 4, 5))
    _same_error(torch.bmm, rand(2, 3, 4), rand(2, 5, 5))
    _same_error(torch.matmul, rand(2, 3), rand(4))
    _same_error(torch.dot, rand(3), rand(4))
    _same_error(torch.addmm, rand(3, 3), rand(2, 3), rand(3, 4))
    # device still usable
    close(torch.mm(rand(2, 3).to("tpu"), rand(3, 2).to("tpu")), torch.mm(rand(2, 3), rand(3, 2)))


def test_autograd_linear_and_matmul(fallback_for_others):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = rand(6, 16)
    dlin = torch.nn.Linear(16, 8).to("tpu")
    dlin.load_state_dict(lin.state_dict())
    dx = x.to("tpu").requires_grad_()
    x.requires_grad_()
    g = rand(6, 8, seed=9)
    lin(x).backward(g)
    dlin(dx).backward(g.to("tpu"))
    close(dx.grad, x.grad)
    close(dlin.weight.grad, lin.weight.grad)
    close(dlin.bias.grad, lin.bias.grad)
    a, b = rand(3, 4, 5), rand(3, 5, 2, seed=1)
    a.requires_grad_(), b.requires_grad_()
    da, db = a.detach().to("tpu").requires_grad_(), b.detach().to("tpu").requires_grad_()
    go = rand(3, 4, 2, seed=3)
    torch.bmm(a, b).backward(go)
    torch.bmm(da, db).backward(go.to("tpu"))
    close(da.grad, a.grad)
    close(db.grad, b.grad)


def test_mlp_forward_backward(fallback_for_others):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Linear(32, 10))
    dnet = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Linear(32, 10)).to("tpu")
    dnet.load_state_dict(net.state_dict())
    x = rand(8, 20)
    g = rand(8, 10, seed=2)
    net(x).backward(g)
    dnet(x.to("tpu")).backward(g.to("tpu"))
    for p, dp in zip(net.parameters(), dnet.parameters()):
        close(dp.grad, p.grad)


# ------------------------------------------------------------------ precision

def _bf16(x):
    return x.to(torch.bfloat16).float()


def test_precision_api():
    P = torch.tpu.Precision
    assert torch.tpu.precision.get() is None
    assert torch.tpu.precision.effective() == P.HIGHEST
    torch.set_float32_matmul_precision("medium")
    assert torch.tpu.precision.effective() == P.DEFAULT
    torch.set_float32_matmul_precision("high")
    assert torch.tpu.precision.effective() == P.HIGH
    with torch.tpu.precision(P.HIGHEST):
        assert torch.tpu.precision.get() == P.HIGHEST and torch.tpu.precision.effective() == P.HIGHEST
        with torch.tpu.precision("default"):
            assert torch.tpu.precision.effective() == P.DEFAULT
        assert torch.tpu.precision.get() == P.HIGHEST
    assert torch.tpu.precision.get() is None
    with pytest.raises(ValueError):
        torch.tpu.precision.set("fastest")


def test_precision_modes_numerics():
    a, b = rand(64, 256), rand(256, 48, seed=1)
    exact = a.double() @ b.double()
    da, db = a.to("tpu"), b.to("tpu")
    errs = {}
    for mode in ("highest", "high", "medium"):
        torch.set_float32_matmul_precision(mode)
        errs[mode] = ((da @ db).cpu().double() - exact).abs().max().item()
    torch.set_float32_matmul_precision("medium")
    # DEFAULT: an f32 product of the bf16-rounded operands
    torch.testing.assert_close((da @ db).cpu(), _bf16(a) @ _bf16(b), rtol=1e-5, atol=1e-4)
    assert errs["medium"] > 1e-3
    assert errs["high"] < errs["medium"] / 50
    assert errs["highest"] < 1e-4
    # the torch_tpu setting overrides PyTorch's
    torch.set_float32_matmul_precision("highest")
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        torch.testing.assert_close((da @ db).cpu(), _bf16(a) @ _bf16(b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close((da @ db).cpu(), a @ b, rtol=1e-5, atol=1e-4)
    # float64 is never reduced
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        close(a.double().to("tpu") @ b.double().to("tpu"), exact)


def test_gemm_library_name():
    name = torch_tpu._C._gemm_library()
    assert "OpenBLAS" in name
