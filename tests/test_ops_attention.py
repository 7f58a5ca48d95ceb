"""Fused scaled_dot_product_attention on the tpu device (the "overrideable"
SDPA backend): forward and every gradient against PyTorch's CPU SDPA for
each feature (causal with L != S, bool / float / broadcast masks, scale,
GQA, 3-D inputs, non-contiguous layouts, head dims 1..256, fully masked
rows) and dtype, dropout (reproducible, keep rate, gradients consistent
with the mask actually drawn), errors, and a small GPT block training."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

DT = "tpu"
FUSED_GRAD_FN = "ScaledDotProductFusedAttentionOverrideableBackward0"


def tol(dtype):
    return {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 3e-2), torch.float16: (5e-3, 5e-3)}[dtype]


def run_both(q, k, v, grads=True, mask=None, check_fused=True, **kw):
    """SDPA on CPU (f32 math on the same values) and on the tpu; returns
    (cpu_out, tpu_out, cpu_grads, tpu_grads) for the inputs that require grad."""
    ins = [q, k, v] + ([mask] if mask is not None and mask.is_floating_point() and grads else [])
    cpu = [t.detach().float().requires_grad_(grads) for t in ins]
    dev = [t.detach().to(DT).requires_grad_(grads) for t in ins]
    cm = cpu[3] if len(cpu) > 3 else (mask.float() if mask is not None and mask.is_floating_point() else mask)
    dm = dev[3] if len(dev) > 3 else (mask.to(DT) if mask is not None else None)
    co = F.scaled_dot_product_attention(cpu[0], cpu[1], cpu[2], attn_mask=cm, **kw)
    do = F.scaled_dot_product_attention(dev[0], dev[1], dev[2], attn_mask=dm, **kw)
    if check_fused and grads:
        assert type(do.grad_fn).__name__ == FUSED_GRAD_FN
    if not grads:
        return co, do.cpu(), None, None
    g = torch.randn(co.shape, generator=torch.Generator().manual_seed(1))
    cg = torch.autograd.grad(co, cpu, g)
    dg = torch.autograd.grad(do, dev, g.to(q.dtype).to(DT))
    return co, do.cpu(), cg, [x.cpu() for x in dg]


def check(co, do, cg, dg, dtype):
    rtol, atol = tol(dtype)
    assert do.dtype == dtype
    torch.testing.assert_close(do.float(), co, rtol=rtol, atol=atol)
    if cg is not None:
        for c, d in zip(cg, dg):
            scale = max(1.0, c.abs().max().item()) if c.numel() else 1.0
            torch.testing.assert_close(d.float(), c, rtol=rtol * 4, atol=atol * 4 * scale)


def rnd(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_takes_the_fused_backend():
    q = rnd(2, 3, 5, 8).to(DT)
    assert torch._fused_sdp_choice(q, q, q) == 4  # SDPBackend.overrideable
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.OVERRIDEABLE):
        F.scaled_dot_product_attention(q, q, q)
    torch.tpu.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("L,S,D", [(37, 45, 16), (130, 70, 64), (64, 128, 32)])
def test_plain(dtype, L, S, D):
    q, k, v = rnd(2, 3, L, D, dtype=dtype, seed=1), rnd(2, 3, S, D, dtype=dtype, seed=2), rnd(2, 3, S, D, dtype=dtype, seed=3)
    check(*run_both(q, k, v), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("L,S", [(70, 150), (150, 70), (65, 65)])
def test_causal(dtype, L, S):
    q, k, v = rnd(1, 2, L, 16, dtype=dtype, seed=1), rnd(1, 2, S, 16, dtype=dtype, seed=2), rnd(1, 2, S, 16, dtype=dtype, seed=3)
    check(*run_both(q, k, v, is_causal=True), dtype)


@pytest.mark.parametrize("shape", [(9, 11), (3, 1, 9, 11), (1, 2, 9, 11), (3, 2, 9, 11)])
def test_bool_mask_broadcast(shape):
    q, k, v = rnd(3, 2, 9, 8, seed=1), rnd(3, 2, 11, 8, seed=2), rnd(3, 2, 11, 8, seed=3)
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(4)) > 0.3
    check(*run_both(q, k, v, mask=mask), torch.float32)


def test_fully_masked_rows_give_zero():
    q, k, v = rnd(2, 2, 6, 8, seed=1), rnd(2, 2, 7, 8, seed=2), rnd(2, 2, 7, 8, seed=3)
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[2] = False
    co, do, cg, dg = run_both(q, k, v, mask=mask)
    check(co, do, cg, dg, torch.float32)
    assert torch.equal(do[:, :, 2], torch.zeros(2, 2, 8))
    fmask = torch.zeros(6, 7)
    fmask[4] = float("-inf")
    check(*run_both(q, k, v, mask=fmask, grads=False), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 140), (1, 3, 9, 140), (2, 3, 9, 140)])
def test_float_mask_with_grad(dtype, shape):
    q, k, v = rnd(2, 3, 9, 8, dtype=dtype, seed=1), rnd(2, 3, 140, 8, dtype=dtype, seed=2), rnd(2, 3, 140, 8, dtype=dtype, seed=3)
    mask = rnd(*shape, dtype=dtype, seed=4)
    check(*run_both(q, k, v, mask=mask), dtype)


def test_scale_and_head_dims():
    for D in (1, 3, 100, 256):
        q, k, v = rnd(1, 2, 10, D, seed=1), rnd(1, 2, 20, D, seed=2), rnd(1, 2, 20, D, seed=3)
        check(*run_both(q, k, v, scale=0.3), torch.float32)
    # value head dim differs from the query's
    q, k, v = rnd(1, 2, 10, 8, seed=1), rnd(1, 2, 20, 8, seed=2), rnd(1, 2, 20, 24, seed=3)
    check(*run_both(q, k, v), torch.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_gqa(causal):
    q, k, v = rnd(2, 8, 33, 16, seed=1), rnd(2, 2, 40, 16, seed=2), rnd(2, 2, 40, 16, seed=3)
    check(*run_both(q, k, v, enable_gqa=True, is_causal=causal), torch.float32)


def test_three_dim_and_non_contiguous():
    q, k, v = rnd(4, 9, 8, seed=1), rnd(4, 13, 8, seed=2), rnd(4, 13, 8, seed=3)
    check(*run_both(q, k, v, is_causal=True), torch.float32)
    # [B, L, H, D] storage viewed as [B, H, L, D]
    q, k, v = (rnd(2, n, 3, 16, seed=s).transpose(1, 2) for n, s in ((17, 1), (23, 2), (23, 3)))
    assert not q.is_contiguous()
    check(*run_both(q, k, v), torch.float32)
    # expanded (stride-0) key / value
    k1, v1 = rnd(1, 1, 23, 16, seed=5).expand(2, 3, 23, 16), rnd(1, 1, 23, 16, seed=6).expand(2, 3, 23, 16)
    check(*run_both(q, k1, v1), torch.float32)


def test_empty():
    q, k, v = rnd(2, 2, 4, 8), rnd(2, 2, 0, 8), rnd(2, 2, 0, 8)
    co, do, cg, dg = run_both(q, k, v, check_fused=False)
    check(co, do, cg, dg, torch.float32)
    q = rnd(2, 2, 0, 8)
    check(*run_both(q, rnd(2, 2, 5, 8), rnd(2, 2, 5, 8), check_fused=False), torch.float32)


def test_other_cases_take_the_math_path():
    # float64 and shapes the fused kernel does not take go through the
    # composite path on the device, with CPU's results and errors
    q, k, v = rnd(2, 2, 5, 8, dtype=torch.float64), rnd(2, 2, 6, 8, dtype=torch.float64), rnd(2, 2, 6, 8, dtype=torch.float64)
    assert torch._fused_sdp_choice(q.to(DT), k.to(DT), v.to(DT)) == 0
    out = F.scaled_dot_product_attention(q.to(DT), k.to(DT), v.to(DT))
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v))


def test_errors_like_cpu():
    q, k, v = rnd(2, 4, 5, 8), rnd(2, 2, 6, 8), rnd(2, 2, 6, 8)
    for args in [(q, k, v), (q, rnd(2, 4, 6, 7), rnd(2, 4, 6, 7)), (q, k.double(), v)]:
        with pytest.raises(RuntimeError) as cpu_err:
            F.scaled_dot_product_attention(*args)
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(*(t.to(DT) for t in args))
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q.to(DT), q.to(DT), q.to(DT), attn_mask=torch.ones(3, 3, dtype=torch.bool, device=DT))
    # called directly with bad arguments
    with pytest.raises(RuntimeError, match="multiple of the heads"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(rnd(2, 3, 5, 8).to(DT), k.to(DT), v.to(DT))
    # the device stays usable
    check(*run_both(rnd(2, 2, 5, 8), k, v), torch.float32)


def dropout_mask(B, H, L, S, p, seed):
    """The keep mask * 1/(1-p) the device draws for (B, H, L, S) after manual_seed(seed):
    q = 0 makes every probability 1/S and v = I reads them out."""
    torch.manual_seed(seed)
    q = torch.zeros(B, H, L, 4, device=DT)
    k = torch.randn(B, H, S, 4).to(DT)
    v = torch.eye(S).expand(B, H, S, S).to(DT)
    return (F.scaled_dot_product_attention(q, k, v, dropout_p=p).cpu() * S)


def test_dropout_reproducible_and_rate():
    B, H, L, S, p = 2, 4, 64, 96, 0.3
    z1 = dropout_mask(B, H, L, S, p, 7)
    z2 = dropout_mask(B, H, L, S, p, 7)
    assert torch.equal(z1, z2)
    assert not torch.equal(z1, dropout_mask(B, H, L, S, p, 8))
    kept = (z1 > 0).double()
    assert abs(kept.mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(z1[z1 > 0], torch.full_like(z1[z1 > 0], 1 / (1 - p)))
    # the mask differs between rows and heads
    assert not torch.equal(z1[0, 0], z1[0, 1]) and not torch.equal(z1[0, 0, 0], z1[0, 0, 1])


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_gradients_match_the_drawn_mask(causal):
    B, H, L, S, D, p = 2, 2, 20, 33, 8, 0.25
    z = dropout_mask(B, H, L, S, p, 11)
    q, k, v = rnd(B, H, L, D, seed=1), rnd(B, H, S, D, seed=2), rnd(B, H, S, D, seed=3)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    s = cpu[0] @ cpu[1].transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    ref = (torch.softmax(s, -1) * z) @ cpu[2]
    dev = [t.to(DT).requires_grad_() for t in (q, k, v)]
    torch.manual_seed(11)
    torch.randn(B, H, S, 4)  # dropout_mask drew k on the CPU generator only
    out = F.scaled_dot_product_attention(*dev, dropout_p=p, is_causal=causal)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    g = torch.randn(ref.shape)
    cg = torch.autograd.grad(ref, cpu, g)
    dg = torch.autograd.grad(out, dev, g.to(DT))
    for c, d in zip(cg, dg):
        torch.testing.assert_close(d.cpu(), c, rtol=1e-4, atol=1e-4)


def test_gpt_block_trains():
    class Block(torch.nn.Module):
        def __init__(self, d=32, h=4, p=0.1):
            super().__init__()
            self.h, self.p = h, p
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
            self.emb, self.head = torch.nn.Embedding(50, d), torch.nn.Linear(d, 50)

        def forward(self, idx):
            x = self.emb(idx)
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            x = x + self.mlp(self.ln2(x))
            return self.head(x)

    torch.manual_seed(0)
    idx = torch.randint(0, 50, (4, 24))
    tgt = torch.roll(idx, -1, 1)
    # dropout 0: gradients match the CPU
    cpu_m = Block(p=0.0)
    dev_m = Block(p=0.0)
    dev_m.load_state_dict(cpu_m.state_dict())
    dev_m.to(DT)
    F.cross_entropy(cpu_m(idx).flatten(0, 1), tgt.flatten()).backward()
    F.cross_entropy(dev_m(idx.to(DT)).flatten(0, 1), tgt.to(DT).flatten()).backward()
    for (n, a), b in zip(cpu_m.named_parameters(), dev_m.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-3, atol=1e-4, msg=n)
    # dropout 0.1: trains
    model = Block(p=0.1).to(DT)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(idx.to(DT)).flatten(0, 1), tgt.to(DT).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * losses[0]
