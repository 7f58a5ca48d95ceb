"""The fused recurrent cells (aten::_thnn_fused_lstm_cell / _thnn_fused_gru_cell,
forward and backward) that nn.LSTM, nn.GRU, LSTMCell and GRUCell call on an
accelerator, against CPU's composite cells; and the word_language_model
settings of pytorch/examples (--accel, LSTM and GRU) on a synthetic corpus."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F




def _grads(m):
    return {n: p.grad.detach().cpu() for n, p in m.named_parameters()}


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_cpu_forward_and_backward(cell, bias, both_modes):
    torch.manual_seed(0)
    cpu = getattr(nn, cell)(5, 7, bias=bias)
    dev = getattr(nn, cell)(5, 7, bias=bias).to("tpu")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(3, 5, requires_grad=True)
    h = torch.randn(3, 7, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    ht = h.detach().to("tpu").requires_grad_()
    if cell == "LSTMCell":
        c = torch.randn(3, 7, requires_grad=True)
        ct = c.detach().to("tpu").requires_grad_()
        out, out_t = cpu(x, (h, c)), dev(xt, (ht, ct))
        w = [torch.randn(3, 7), torch.randn(3, 7)]
        (out[0] * w[0]).sum().add((out[1] * w[1]).sum()).backward()
        (out_t[0] * w[0].to("tpu")).sum().add((out_t[1] * w[1].to("tpu")).sum()).backward()
        torch.testing.assert_close(out_t[1].cpu(), out[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ct.grad.cpu(), c.grad, rtol=1e-5, atol=1e-6)
        out, out_t = out[0], out_t[0]
    else:
        out, out_t = cpu(x, h), dev(xt, ht)
        w = torch.randn(3, 7)
        (out * w).sum().backward()
        (out_t * w.to("tpu")).sum().backward()
    torch.testing.assert_close(out_t.cpu(), out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ht.grad.cpu(), h.grad, rtol=1e-5, atol=1e-6)
    g, gt = _grads(cpu), _grads(dev)
    assert set(g) == set(gt)
    for k in g:
        torch.testing.assert_close(gt[k], g[k], rtol=1e-5, atol=1e-6)


def test_the_fused_ops_are_what_runs_and_match_the_formulas():
    """The ops themselves: the gates and the workspace layout CUDA uses, the
    backward's gate gradients and the bias gradient (column sums)."""
    torch.manual_seed(1)
    B, H = 4, 3
    ig, hg, cx = torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H)
    bi, bh = torch.randn(4 * H), torch.randn(4 * H)
    hy, cy, ws = torch.ops.aten._thnn_fused_lstm_cell(ig.to("tpu"), hg.to("tpu"), cx.to("tpu"), bi.to("tpu"),
                                                       bh.to("tpu"))
    gates = ig + hg + bi + bh
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    c_ref = f * cx + i * g
    torch.testing.assert_close(cy.cpu(), c_ref)
    torch.testing.assert_close(hy.cpu(), o * c_ref.tanh())
    torch.testing.assert_close(ws.cpu(), torch.cat([i, f, g, o], 1))
    gh, gc = torch.randn(B, H), torch.randn(B, H)
    gg, gcx, gb = torch.ops.aten._thnn_fused_lstm_cell_backward_impl(gh.to("tpu"), gc.to("tpu"), cx.to("tpu"), cy, ws,
                                                                    True)
    gates_r = gates.clone().requires_grad_()
    cx_r = cx.clone().requires_grad_()
    i, f, g, o = gates_r.chunk(4, 1)
    c2 = f.sigmoid() * cx_r + i.sigmoid() * g.tanh()
    h2 = o.sigmoid() * c2.tanh()
    torch.autograd.backward([h2, c2], [gh, gc])
    torch.testing.assert_close(gg.cpu(), gates_r.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gcx.cpu(), cx_r.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gb.cpu(), gates_r.grad.sum(0), rtol=1e-5, atol=1e-6)

    igg, hgg, hx = torch.randn(B, 3 * H), torch.randn(B, 3 * H), torch.randn(B, H)
    hy, ws = torch.ops.aten._thnn_fused_gru_cell(igg.to("tpu"), hgg.to("tpu"), hx.to("tpu"))
    r = (igg[:, :H] + hgg[:, :H]).sigmoid()
    z = (igg[:, H:2 * H] + hgg[:, H:2 * H]).sigmoid()
    n = (igg[:, 2 * H:] + r * hgg[:, 2 * H:]).tanh()
    torch.testing.assert_close(hy.cpu(), (1 - z) * n + z * hx)
    torch.testing.assert_close(ws.cpu(), torch.cat([r, z, n, hx, hgg[:, 2 * H:]], 1))
    grads = torch.ops.aten._thnn_fused_gru_cell_backward(torch.ones(B, H, device="tpu"), ws, False)
    assert grads[3] is None and grads[4] is None  # no bias, no bias gradients
    ig_r, hg_r, hx_r = (t.clone().requires_grad_() for t in (igg, hgg, hx))
    r = (ig_r[:, :H] + hg_r[:, :H]).sigmoid()
    z = (ig_r[:, H:2 * H] + hg_r[:, H:2 * H]).sigmoid()
    n = (ig_r[:, 2 * H:] + r * hg_r[:, 2 * H:]).tanh()
    ((1 - z) * n + z * hx_r).sum().backward()
    for got, want in zip(grads[:3], (ig_r.grad, hg_r.grad, hx_r.grad)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_bf16_cells_round_once_and_bad_shapes_raise_like_cuda():
    torch.manual_seed(2)
    cell = nn.GRUCell(4, 6).to(torch.bfloat16)
    x, h = torch.randn(2, 4, dtype=torch.bfloat16), torch.randn(2, 6, dtype=torch.bfloat16)
    ref = nn.GRUCell(4, 6)
    ref.load_state_dict({k: v.float() for k, v in cell.state_dict().items()})
    got = cell.to("tpu")(x.to("tpu"), h.to("tpu")).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref(x.float(), h.float()), rtol=2e-2, atol=2e-2)
    with pytest.raises(RuntimeError, match="must have the same size"):
        torch.ops.aten._thnn_fused_lstm_cell(torch.zeros(2, 8, device="tpu"), torch.zeros(2, 4, device="tpu"),
                                             torch.zeros(2, 2, device="tpu"))
    with pytest.raises(RuntimeError, match="expected the state of size"):
        torch.ops.aten._thnn_fused_gru_cell(torch.zeros(2, 9, device="tpu"), torch.zeros(2, 9, device="tpu"),
                                            torch.zeros(2, 4, device="tpu"))
    assert torch.ones(2, device="tpu").sum().item() == 2.0  # the device stays usable


# ------------------------------------------ pytorch/examples word_language_model

class _RNNModel(nn.Module):
    """word_language_model's RNNModel structure: embedding, dropout, a
    multi-layer LSTM / GRU, dropout, a linear decoder and log_softmax."""

    def __init__(self, kind: str, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, kind)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.kind, self.nhid, self.nlayers, self.ntoken = kind, nhid, nlayers, ntoken
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return F.log_softmax(self.decoder(self.drop(out)).view(-1, self.ntoken), dim=1), hidden

    def init_hidden(self, bsz: int):
        w = next(self.parameters())
        z = w.new_zeros(self.nlayers, bsz, self.nhid)
        return (z, w.new_zeros(self.nlayers, bsz, self.nhid)) if self.kind == "LSTM" else z


def _corpus(tmp_path) -> torch.Tensor:
    """A text file written here (the script reads wikitext-2 files; none are
    downloaded), tokenized into word ids as data.Corpus does."""
    sentences = ["the cat sat on a mat", "a dog ran in the park", "the bird sang while the cat sat"]
    g = torch.Generator().manual_seed(0)
    lines = [sentences[i] for i in torch.randint(0, len(sentences), (60,), generator=g).tolist()]
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    vocab: dict[str, int] = {}
    ids = []
    for line in path.read_text().splitlines():
        for w in line.split() + ["<eos>"]:
            ids.append(vocab.setdefault(w, len(vocab)))
    return torch.tensor(ids), len(vocab)


def _train(kind: str, device: str, data: torch.Tensor, ntoken: int, steps: int = 10) -> list[float]:
    """The script's loop: batchify, bptt windows, detached hidden state,
    clip_grad_norm_ 0.25 (its default), manual SGD (--lr 5: its default 20 diverges at this size)."""
    torch.manual_seed(1111)
    model = _RNNModel(kind, ntoken, 16, 16, 2, dropout=0.0).to(device)
    bsz, bptt, lr = 4, 8, 5.0
    nb = data.size(0) // bsz
    batched = data[: nb * bsz].view(bsz, -1).t().contiguous().to(device)
    hidden = model.init_hidden(bsz)
    losses = []
    for i in range(0, min(steps * bptt, batched.size(0) - 1 - bptt), bptt):
        x, y = batched[i:i + bptt], batched[i + 1:i + 1 + bptt].reshape(-1)
        hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
        model.zero_grad()
        out, hidden = model(x, hidden)
        loss = F.nll_loss(out, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_word_language_model_accel_learns_what_cpu_learns(kind, both_modes, tmp_path):
    assert torch.accelerator.current_accelerator().type == "tpu"  # what --accel selects
    data, ntoken = _corpus(tmp_path)
    cpu = _train(kind, "cpu", data, ntoken)
    tpu = _train(kind, "tpu", data, ntoken)
    assert len(cpu) == len(tpu) == 10
    assert sum(tpu[-3:]) / 3 < tpu[0] - 0.15 and math.isfinite(tpu[-1])
    for a, b in zip(tpu, cpu):
        assert a == pytest.approx(b, rel=1e-4)
