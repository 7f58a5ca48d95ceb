"""Optimizers, foreach list ops, AMP (GradScaler) and autocast on the tpu
device, compared with PyTorch's CPU results on the same inputs.

Parameters and gradients are built directly (no forward/backward), so these
tests only need this family's kernels. Where PyTorch's Python code calls a
per-tensor op of another family (GradScaler's reciprocal / add, autocast's
matmul, clip_grad_norm_'s stack / vector_norm) the test runs that op under
CPU fallback and asserts that none of this family's ops fell back.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

DEV = "tpu"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
TOL = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-10, 1e-12), torch.bfloat16: (2e-2, 1e-2),
       torch.float16: (3e-3, 1e-3)}


def close(dev, ref, dtype=None, scale=1.0):
    rtol, atol = TOL.get(dtype or ref.dtype, (0.0, 0.0))  # integers: exact
    torch.testing.assert_close(dev.cpu(), ref, rtol=rtol * scale, atol=atol * scale, equal_nan=True)


def fallbacks():
    return set(torch.tpu.fallback_stats())


def assert_no_own_fallback():
    own = [n for n in fallbacks() if "_foreach_" in n or "_fused_" in n or "_amp_" in n]
    assert not own, f"ops of the optimizer family fell back to the CPU: {own}"


def make_params(shapes, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


SHAPES = [(3, 5), (70000,), (1,), (), (4, 1, 6)]


# ------------------------------------------------------------ optimizers


def run_steps(opt_cls, kwargs, dtype, device, steps=4, seed=0, lr_tensor=False):
    params = [p.to(device).requires_grad_() for p in make_params(SHAPES, dtype, seed)]
    kw = dict(kwargs)
    if lr_tensor:
        kw["lr"] = torch.tensor(kw["lr"], device=device if lr_tensor == "device" else "cpu")
    if lr_tensor == "device" and device == DEV:
        # the constructor validates lr with `0.0 <= lr` (a per-tensor compare
        # of another family): run that under CPU fallback
        with torch_tpu.cpu_fallback_mode(True):
            opt = opt_cls(params, **kw)
    else:
        opt = opt_cls(params, **kw)
    for k in range(steps):
        grads = make_params(SHAPES, dtype, seed + 100 + k)
        for p, gr in zip(params, grads):
            p.grad = gr.to(device)
        opt.step()
    return [p.detach() for p in params], opt


ADAM_CASES = [
    dict(lr=1e-2),
    dict(lr=1e-2, amsgrad=True, maximize=True, weight_decay=0.1),
    dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW], ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", range(len(ADAM_CASES)))
def test_fused_adam_matches_cpu(cls, case, dtype):
    kw = dict(ADAM_CASES[case], fused=True)
    dev, _ = run_steps(cls, kw, dtype, DEV)
    ref, _ = run_steps(cls, kw, dtype, "cpu")
    for d, r in zip(dev, ref):
        close(d, r, scale=4)
    assert_no_own_fallback()


@pytest.mark.parametrize("where", ["device", "cpu"])
@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW], ids=lambda c: c.__name__)
def test_fused_adam_tensor_lr(cls, where):
    kw = dict(lr=1e-2, weight_decay=0.01, fused=True)
    dev, opt = run_steps(cls, kw, torch.float32, DEV, lr_tensor=where)
    ref, _ = run_steps(cls, kw, torch.float32, "cpu", lr_tensor="cpu")
    for d, r in zip(dev, ref):
        close(d, r, scale=4)
    # the state lives on the device, steps counted there
    st = opt.state[opt.param_groups[0]["params"][0]]
    assert st["exp_avg"].device.type == "tpu" and st["step"].device.type == "tpu"
    assert st["step"].item() == 4


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", range(len(SGD_CASES)))
def test_fused_sgd_matches_cpu(case, dtype):
    kw = dict(SGD_CASES[case], fused=True)
    dev, opt = run_steps(torch.optim.SGD, kw, dtype, DEV)
    # reference: the plain per-tensor CPU SGD (CPU's own fused SGD loses
    # precision for bf16/f16 parameters)
    ref, _ = run_steps(torch.optim.SGD, dict(SGD_CASES[case], foreach=False), dtype, "cpu")
    for d, r in zip(dev, ref):
        close(d, r, scale=4)
    assert_no_own_fallback()


def test_fused_sgd_tensor_lr():
    kw = dict(lr=0.1, momentum=0.5, fused=True)
    dev, _ = run_steps(torch.optim.SGD, kw, torch.float32, DEV, lr_tensor="device")
    ref, _ = run_steps(torch.optim.SGD, kw, torch.float32, "cpu", lr_tensor="cpu")
    for d, r in zip(dev, ref):
        close(d, r)


@pytest.mark.parametrize("cls,kw", [(torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
                                    (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
                                    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True))],
                         ids=["Adam", "AdamW", "SGD"])
def test_foreach_optimizers_match_cpu(cls, kw):
    """foreach=True paths (only _foreach_* ops on the device)."""
    kw = dict(kw, foreach=True)
    torch_tpu.cpu_fallback_mode(True)  # only for ops of other families, checked below
    try:
        dev, _ = run_steps(cls, kw, torch.float32, DEV)
    finally:
        torch_tpu.cpu_fallback_mode(False)
    ref, _ = run_steps(cls, kw, torch.float32, "cpu")
    for d, r in zip(dev, ref):
        close(d, r, scale=4)
    assert_no_own_fallback()


def test_fused_adam_raw_op_skip_and_scale():
    """_fused_adam_ directly: found_inf skips everything; grad_scale unscales
    the grads (stored back) before the update; both match CPU."""
    params = make_params([(10,), (300,)], torch.float32, 1)
    grads = make_params([(10,), (300,)], torch.float32, 2)

    def state(device):
        return ([p.clone().to(device) for p in params], [g.clone().to(device) for g in grads],
                [torch.zeros_like(p).to(device) for p in params], [torch.zeros_like(p).to(device) for p in params],
                [torch.full((), 1.0, device=device) for _ in params])

    for found in (0.0, 1.0):
        out = {}
        for device in ("cpu", DEV):
            p, g, m, v, s = state(device)
            torch._fused_adam_(p, g, m, v, [], s, lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                               amsgrad=False, maximize=False, grad_scale=torch.tensor(4.0, device=device),
                               found_inf=torch.tensor(found, device=device))
            out[device] = (p, g, m, v)
        for d, r in zip(out[DEV], out["cpu"]):
            for a, b in zip(d, r):
                close(a, b)
        if found:
            for a, b in zip(out[DEV][0], params):
                assert torch.equal(a.cpu(), b)


def test_fused_errors():
    p = [torch.zeros(3, device=DEV)]
    with pytest.raises(RuntimeError, match="tensor lists"):
        torch._fused_sgd_(p, [], [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False,
                          maximize=False, is_first_step=False)
    with pytest.raises(RuntimeError, match="shape"):
        torch._fused_sgd_(p, [torch.zeros(4, device=DEV)], [], weight_decay=0.0, momentum=0.0, lr=0.1,
                          dampening=0.0, nesterov=False, maximize=False, is_first_step=False)
    torch.tpu.synchronize()
    # the device stays usable
    torch._fused_sgd_(p, [torch.ones(3, device=DEV)], [], weight_decay=0.0, momentum=0.0, lr=0.5, dampening=0.0,
                      nesterov=False, maximize=False, is_first_step=False)
    assert torch.equal(p[0].cpu(), torch.full((3,), -0.5))


# ------------------------------------------------------------------- AMP


def test_amp_unscale_and_update_scale_ops():
    grads = make_params([(1000,), (7, 3), ()], torch.float32, 3)
    for with_inf in (False, True):
        g_cpu = [g.clone() for g in grads]
        if with_inf:
            g_cpu[1][2, 1] = float("inf")
        g_dev = [g.to(DEV) for g in g_cpu]
        found = {d: torch.zeros((), device=d) for d in ("cpu", DEV)}
        inv = {d: torch.tensor(0.125, device=d) for d in ("cpu", DEV)}
        torch._amp_foreach_non_finite_check_and_unscale_(g_cpu, found["cpu"], inv["cpu"])
        torch._amp_foreach_non_finite_check_and_unscale_(g_dev, found[DEV], inv[DEV])
        assert found[DEV].item() == found["cpu"].item() == float(with_inf)
        for a, b in zip(g_dev, g_cpu):
            close(a, b)
    # update_scale: growth after growth_interval successes, backoff on inf
    for d in ("cpu", DEV):
        scale = torch.full((), 1024.0, device=d)
        tracker = torch.zeros((), dtype=torch.int32, device=d)
        seq = []
        for f in (0, 0, 0, 1, 0, 0, 0):
            torch._amp_update_scale_(scale, tracker, torch.full((), float(f), device=d), 2.0, 0.5, 3)
            seq.append((scale.item(), tracker.item()))
        if d == "cpu":
            ref = seq
    assert seq == ref == [(1024, 1), (1024, 2), (2048, 0), (1024, 0), (1024, 1), (1024, 2), (2048, 0)]
    with pytest.raises(RuntimeError, match="int tensor"):
        torch._amp_update_scale_(scale, scale.clone(), scale.clone(), 2.0, 0.5, 3)
    with pytest.raises(RuntimeError, match="float tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_([scale.clone()], tracker, scale)


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler(fused):
    """GradScaler("tpu"): inf grads skip the step and back the scale off;
    finite grads unscale, step and grow the scale after growth_interval."""
    torch_tpu.cpu_fallback_mode(True)  # GradScaler's reciprocal / add are per-tensor ops of other families
    try:
        scaler = torch.amp.GradScaler(DEV, init_scale=256.0, growth_interval=2)
        p = torch.ones(5, device=DEV, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.5, fused=fused)
        # step 1: inf grad -> skipped, scale halves
        scaler._lazy_init_scale_growth_tracker(p.device)
        p.grad = torch.tensor([256.0, float("inf"), 0, 0, 0], device=DEV)
        scaler.step(opt)
        scaler.update()
        assert torch.equal(p.detach().cpu(), torch.ones(5))
        assert scaler.get_scale() == 128.0
        # steps 2, 3: finite grads (scaled by 128) -> unscaled to 1, stepped; scale grows after 2
        for k in range(2):
            p.grad = torch.full((5,), 128.0, device=DEV)
            scaler.step(opt)
            scaler.update()
        assert torch.allclose(p.detach().cpu(), torch.zeros(5))
        assert scaler.get_scale() == 256.0
    finally:
        torch_tpu.cpu_fallback_mode(False)
    assert_no_own_fallback()


# --------------------------------------------------------------- foreach


def lists(dtype, seed=0, shapes=((3, 4), (1000,), (), (2, 0)), positive=False):
    ts = make_params(shapes, dtype, seed)
    if positive:
        ts = [t.abs() + 0.5 for t in ts]
    return ts


def to_dev(ts):
    return [t.to(DEV) for t in ts]


def check_lists(dev, ref, scale=2.0):
    assert len(dev) == len(ref)
    for d, r in zip(dev, ref):
        assert d.device.type == "tpu" and d.dtype == r.dtype and d.shape == r.shape
        close(d, r, scale=scale)


UNARY = ["sqrt", "neg", "abs", "exp", "reciprocal", "sign"]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_foreach_unary(name, dtype):
    x = lists(dtype, positive=name in ("sqrt", "reciprocal"))
    fn = getattr(torch, f"_foreach_{name}")
    check_lists(fn(to_dev(x)), fn(x))
    d = to_dev(x)
    getattr(torch, f"_foreach_{name}_")(d)
    getattr(torch, f"_foreach_{name}_")(x)
    check_lists(d, x)
    assert_no_own_fallback()


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "pow"]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_foreach_binary(name, dtype):
    fn, fn_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
    a = lists(dtype, 1, positive=name == "pow")
    b = lists(dtype, 2, positive=name in ("div",))
    if name in ("maximum", "minimum", "clamp_min", "clamp_max"):
        a[1][7] = float("nan")
    scalars = [0.5, -2.0, 3.0, 1.5]
    for other in (b, 1.5, scalars):
        check_lists(fn(to_dev(a), to_dev(other) if isinstance(other, list) and torch.is_tensor(other[0])
                       else other), fn(a, other), scale=4)
        d, c = to_dev(a), [t.clone() for t in a]
        fn_(d, to_dev(other) if isinstance(other, list) and torch.is_tensor(other[0]) else other)
        fn_(c, other)
        check_lists(d, c, scale=4)
    if name in ("add", "sub"):
        check_lists(fn(to_dev(a), to_dev(b), alpha=-0.75), fn(a, b, alpha=-0.75))
    assert_no_own_fallback()


@pytest.mark.parametrize("name", ["add", "mul", "div"])
@pytest.mark.parametrize("where", ["cpu", "device"])
def test_foreach_tensor_scalar(name, where):
    """The Tensor overloads (clip_grad_norm_'s _foreach_mul_ with a device
    scalar): the 0-dim tensor is read by the kernel, no host sync."""
    fn, fn_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
    # (a 0-dim member would promote with the 0-dim f64 scalar out of place:
    # that takes the per-tensor path)
    a = lists(torch.float32, 1, shapes=((3, 4), (1000,), (1,), (2, 0)))
    s = torch.tensor(0.3, dtype=torch.float64)
    s_dev = s if where == "cpu" else s.to(DEV)
    check_lists(fn(to_dev(a), s_dev), fn(a, s))
    d = to_dev(a)
    fn_(d, s_dev)
    fn_(a, s)
    check_lists(d, a)
    with pytest.raises(RuntimeError, match="0 dim"):
        fn(to_dev(a), torch.ones(2, device=DEV))
    assert_no_own_fallback()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_foreach_addcmul_addcdiv(name, dtype):
    fn, fn_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
    a, b, c = lists(dtype, 1), lists(dtype, 2), lists(dtype, 3, positive=True)
    for value in ({}, {"value": -0.5}, {"scalars": [0.1, 2.0, -1.0, 3.0]},
                  {"scalars": torch.tensor([0.1, 2.0, -1.0, 3.0])}):
        args = list(value.values())
        check_lists(fn(to_dev(a), to_dev(b), to_dev(c), *args), fn(a, b, c, *args), scale=4)
        d, r = to_dev(a), [t.clone() for t in a]
        fn_(d, to_dev(b), to_dev(c), *args)
        fn_(r, b, c, *args)
        check_lists(d, r, scale=4)
    assert_no_own_fallback()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_foreach_lerp(dtype):
    a, b = lists(dtype, 1), lists(dtype, 2)
    w = [t.clamp(-1, 2) for t in lists(dtype, 3)]
    for weight in (0.3, 0.8, [0.1, 0.9, 0.5, 0.2], w):
        wd = to_dev(weight) if isinstance(weight, list) and torch.is_tensor(weight[0]) else weight
        check_lists(torch._foreach_lerp(to_dev(a), to_dev(b), wd), torch._foreach_lerp(a, b, weight))
        d, r = to_dev(a), [t.clone() for t in a]
        torch._foreach_lerp_(d, to_dev(b), wd)
        torch._foreach_lerp_(r, b, weight)
        check_lists(d, r)
    assert_no_own_fallback()


def test_foreach_pow_scalar_base_and_noncontiguous():
    e = lists(torch.float32, 1)
    check_lists(torch._foreach_pow(2.0, to_dev(e)), torch._foreach_pow(2.0, e))
    # non-contiguous and differently-strided members of one tuple
    a = [torch.randn(6, 8).t(), torch.randn(5, 10)[:, ::3]]
    b = [torch.randn(8, 6), torch.randn(5, 4)]
    check_lists(torch._foreach_add(to_dev(a), to_dev(b), alpha=2), torch._foreach_add(a, b, alpha=2))
    base = [torch.randn(6, 8), torch.randn(5, 10)]
    d = to_dev(base)
    dv = [d[0].t(), d[1][:, ::3]]
    torch._foreach_mul_(dv, to_dev(b))
    expect = [t.clone() for t in base]
    expect[0].t().mul_(b[0])
    expect[1][:, ::3].mul_(b[1])
    check_lists(d, expect)  # strided writes, untouched elements kept
    assert_no_own_fallback()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("ord", [2, 1, 0, math.inf, 3, -math.inf])
def test_foreach_norm(ord, dtype):
    shapes = ((3, 4), (70000,), (), (5, 2))
    x = lists(dtype, 4, shapes=shapes)
    x[1][5] = 0
    ref = torch._foreach_norm(x, ord)
    dev = torch._foreach_norm(to_dev(x), ord)
    check_lists(dev, ref, scale=8)
    if dtype in (torch.bfloat16, torch.float16):
        ref32 = torch._foreach_norm(x, ord, dtype=torch.float32)
        check_lists(torch._foreach_norm(to_dev(x), ord, dtype=torch.float32), ref32)
    assert_no_own_fallback()


def test_foreach_copy_zero_and_empty_tensors():
    src = lists(torch.float32, 1) + [torch.randn(3)]
    dst = to_dev([torch.empty(t.shape, dtype=torch.bfloat16) for t in src])
    torch._foreach_copy_(dst, to_dev(src))
    check_lists(dst, [t.to(torch.bfloat16) for t in src])
    torch._foreach_copy_(dst, src)  # from the host: per-tensor copies
    check_lists(dst, [t.to(torch.bfloat16) for t in src])
    torch._foreach_zero_(dst)
    check_lists(dst, [torch.zeros(t.shape, dtype=torch.bfloat16) for t in src])
    assert_no_own_fallback()


def test_foreach_errors_and_slow_path():
    a = to_dev(lists(torch.float32, 1))
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add(a, a[:2])
    with pytest.raises(RuntimeError, match="at least one tensor"):
        torch._foreach_mul_([], 2.0)
    with pytest.raises(RuntimeError, match="scalar list"):
        torch._foreach_mul(a, [1.0])
    # integer lists take the per-tensor path (PyTorch's loop over our add kernel)
    ints = [torch.arange(5, dtype=torch.int32)]
    check_lists(torch._foreach_add(to_dev(ints), 1), torch._foreach_add(ints, 1))
    torch.tpu.synchronize()


def test_clip_grad_norm_foreach():
    grads = lists(torch.float32, 5, shapes=((10, 10), (1000,), (3,)))
    ps_cpu = [torch.zeros_like(g, requires_grad=True) for g in grads]
    ps_dev = [torch.zeros_like(g, device=DEV, requires_grad=True) for g in grads]
    for p, g in zip(ps_cpu, grads):
        p.grad = g.clone()
    for p, g in zip(ps_dev, grads):
        p.grad = g.to(DEV)
    ref = torch.nn.utils.clip_grad_norm_(ps_cpu, 1.0, foreach=True)
    torch_tpu.cpu_fallback_mode(True)  # stack / vector_norm / add / div / clamp: per-tensor ops of other families
    try:
        tot = torch.nn.utils.clip_grad_norm_(ps_dev, 1.0, foreach=True)
    finally:
        torch_tpu.cpu_fallback_mode(False)
    close(tot, ref)
    for p, r in zip(ps_dev, ps_cpu):
        close(p.grad, r.grad)
    assert_no_own_fallback()


# -------------------------------------------------------------- autocast


def test_autocast_availability_and_dtype():
    assert torch.amp.is_autocast_available(DEV)
    assert torch.get_autocast_dtype(DEV) in torch.tpu.get_amp_supported_dtype()
    for key_op in ("aten::mm", "aten::linear", "aten::bmm", "aten::softmax.int", "aten::log_softmax.int",
                   "aten::scaled_dot_product_attention", "aten::addcmul", "aten::exp", "aten::mse_loss"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(key_op, "AutocastPrivateUse1"), key_op
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(DEV)
        assert torch.get_autocast_dtype(DEV) == torch.bfloat16
    assert not torch.is_autocast_enabled(DEV)


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_norms_and_nearest_upsample_keep_the_activation_dtype(dtype, mode):
    """The device's one departure from CUDA's float32 list (the TPU policy,
    as CPU autocast): layer / group norm and nearest upsampling of a
    lower-precision activation return its dtype — the norms compute in f32
    or wider and round once — while exp and softmax still widen. Forward and
    backward match the float64 computation rounded to the dtype; parameter
    gradients stay f32."""
    g = torch.Generator().manual_seed(3)
    x64 = (torch.randn(4, 8, 6, 6, generator=g, dtype=torch.float64) * 3 + 5).to(dtype).double()
    w64, b64 = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    lw64, lb64 = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    gy = torch.randn(4, 8, 6, 6, generator=g, dtype=torch.float64).to(dtype).double()
    leaves = [t.float().to(DEV).requires_grad_() for t in (w64, b64, lw64, lb64)]
    x = x64.to(dtype).to(DEV).requires_grad_()
    with torch_tpu.execution_mode(mode):
        with torch.autocast(DEV, dtype=dtype):
            gn = F.group_norm(x, 4, leaves[0], leaves[1])
            ln = F.layer_norm(x, (6,), leaves[2], leaves[3])
            up = F.interpolate(x, scale_factor=2.0, mode="nearest")
            e, s = torch.exp(x), torch.softmax(x, -1)
        assert (gn.dtype, ln.dtype, up.dtype) == (dtype,) * 3
        assert e.dtype == s.dtype == torch.float32
        gyt = gy.to(dtype).to(DEV)
        grads = [torch.autograd.grad(y, [x, *ps], gyt) for y, ps in ((gn, leaves[:2]), (ln, leaves[2:]))]
        outs = [t.detach().cpu().double() for t in (gn, ln, up)]
    assert all(gr[0].dtype == dtype and gr[1].dtype == gr[2].dtype == torch.float32 for gr in grads)
    xr = x64.clone().requires_grad_()
    pr = [t.clone().requires_grad_() for t in (w64, b64, lw64, lb64)]
    refs = [F.group_norm(xr, 4, pr[0], pr[1]), F.layer_norm(xr, (6,), pr[2], pr[3])]
    eps = torch.finfo(dtype).eps  # one rounding of the result: within half an ulp, plus f32 arithmetic

    def once_rounded(got, ref):
        err = (got.cpu().double() - ref).abs() - (ref.abs() * eps / 2 + 1e-4 * ref.abs().max())
        assert err.max() <= 0, float(err.max())

    assert torch.equal(outs[2], F.interpolate(x64, scale_factor=2.0, mode="nearest"))
    for got, ref, gr, ps in zip(outs, refs, grads, (pr[:2], pr[2:])):
        once_rounded(got, ref.detach())
        rgr = torch.autograd.grad(ref, [xr, *ps], gy)
        once_rounded(gr[0], rgr[0])
        for a, b in zip(gr[1:], rgr[1:]):
            torch.testing.assert_close(a.cpu().double(), b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_policy(dtype):
    """Inside autocast, mm casts its f32 tpu inputs to the autocast dtype and
    exp (fp32 policy) casts low-precision inputs to f32. The cast happens in
    the autocast kernel; the op itself may run under CPU fallback until its
    own kernel is merged."""
    a = torch.randn(4, 5).to(DEV)
    b = torch.randn(5, 3).to(DEV)
    h = torch.randn(4, dtype=dtype).to(DEV)
    torch_tpu.cpu_fallback_mode(True)
    try:
        with torch.autocast(DEV, dtype=dtype):
            y = torch.mm(a, b)
            e = torch.exp(h)
            s = torch.softmax(h, 0)
        y_out = torch.mm(a, b)  # outside: unchanged dtype
    finally:
        torch_tpu.cpu_fallback_mode(False)
    assert y.dtype == dtype and y.device.type == "tpu"
    assert e.dtype == torch.float32 and s.dtype == torch.float32
    assert y_out.dtype == torch.float32
    ref = torch.mm(a.cpu().to(dtype), b.cpu().to(dtype))
    close(y, ref)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "pow"])
def test_foreach_list_of_one_element_tensors_runs_as_one_launch(name):
    """A List overload whose second list holds 0-dim tensors on the device (a
    capturable optimizer's per-parameter bias corrections): PyTorch's
    broadcasting results, from one multi-tensor launch instead of an op per
    tensor; with a 0-dim member in the first list the per-tensor path runs
    and still broadcasts."""
    from torch_tpu import profiler

    fn, fn_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
    a = lists(torch.float32, 1, shapes=((3, 4), (1000,), (5, 1, 2)), positive=True)
    s = [torch.tensor(v) for v in (0.5, 2.0, 1.25)]
    check_lists(fn(to_dev(a), to_dev(s)), fn(a, s))
    d, sd, c = to_dev(a), to_dev(s), [t.clone() for t in a]
    torch.tpu.synchronize()
    with profiler.profile() as prof:
        fn_(d, sd)
        torch.tpu.synchronize()
    fn_(c, s)
    check_lists(d, c)
    ran = [k.base_name for k in prof.kernels if k.base_name != "free_recorded_graph"]  # defer: the graph's end
    assert len(ran) == 1 and ran[0].startswith("foreach_"), ran
    mixed = lists(torch.float32, 2, shapes=((3, 4), ()), positive=True)
    check_lists(fn(to_dev(mixed), to_dev(s[:2])), fn(mixed, s[:2]))
    # bf16 tensors, f32 0-dim tensors (a bf16 model's bias corrections): bf16 results, one launch
    h = [t.to(torch.bfloat16) for t in a]
    hd = to_dev(h)
    torch.tpu.synchronize()
    with profiler.profile() as prof:
        out = fn(hd, sd)
        torch.tpu.synchronize()
    check_lists(out, fn(h, s))
    ran = [k.base_name for k in prof.kernels if k.base_name != "free_recorded_graph"]
    assert len(ran) == 1 and ran[0].startswith("foreach_"), ran
    assert_no_own_fallback()
