"""DLRM (deep learning recommendation model) and a SYNTHETIC click log to
train it on.

The model: dense features -> bottom MLP -> a vector of the embedding width;
each sparse categorical feature -> its own nn.EmbeddingBag (mode="sum") over a
multi-hot bag of ids; the pairwise dot products of those vectors (the upper
triangle of their Gram matrix, without the diagonal) concatenated with the
bottom-MLP output -> top MLP -> one click logit (BCEWithLogits loss).

The data is not a real click log: `SyntheticClickLog` draws it on the host
from a fixed seed -- Gaussian dense features, Zipf-distributed ids in multi-hot
bags of 1-4 ids per table, and a click label drawn from a hidden ground-truth
logistic model (a random linear function of the dense features, a random
per-id effect, and small random pairwise interactions between tables), so the
label carries real but noisy signal. The hidden model's own AUC on the data
(`oracle_auc`) is the ceiling a trained model can approach.

Batch layout, shared by the model, the training script and bench_workload:
  dense   [B, F] float32
  indices [T, B * max_bag] int64: for table t, the ids of the B bags one after
          the other, then padding up to the fixed length with id rows[t]
          (the table's padding_idx, excluded from the sum), so shapes do not
          change from batch to batch
  offsets [T, B] int64: where each bag starts in indices[t]
  clicks  [B] float32 in {0, 1}
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------- model


def mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM with dot-product interaction. rows[t] is the number of ids of
    table t; each table gets one extra all-zero row, rows[t], used as padding
    (padding_idx: never summed, never updated)."""

    def __init__(self, dense_features: int, rows: Sequence[int], emb_dim: int = 16,
                 bottom: Sequence[int] = (64, 32), top: Sequence[int] = (64, 32)) -> None:
        super().__init__()
        self.rows = list(rows)
        self.bottom = mlp([dense_features, *bottom, emb_dim], last_relu=True)
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(n + 1, emb_dim, mode="sum", padding_idx=n) for n in self.rows)
        with torch.no_grad():
            for n, t in zip(self.rows, self.tables):
                t.weight[:n].uniform_(-(1.0 / n) ** 0.5, (1.0 / n) ** 0.5)
        k = len(self.rows) + 1
        li, lj = torch.triu_indices(k, k, offset=1)
        # position of each (i < j) pair in the flattened k x k Gram matrix
        self.register_buffer("pairs", li * k + lj, persistent=False)
        self.top = mlp([emb_dim + k * (k - 1) // 2, *top, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)                                             # [B, D]
        embs = [t(indices[i], offsets[i]) for i, t in enumerate(self.tables)]  # T x [B, D]
        v = torch.stack([x, *(e.to(x.dtype) for e in embs)], dim=1)        # [B, T+1, D]
        gram = torch.bmm(v, v.transpose(1, 2))                             # [B, T+1, T+1]
        inter = gram.flatten(1)[:, self.pairs]                             # [B, (T+1)T/2]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)           # [B] logits


# ----------------------------------------------------------------------- data


class SyntheticClickLog:
    """A synthetic click log drawn on the host from `seed` (see the module
    docstring). Samples [0, n_train) are the training split, the rest the
    validation split."""

    def __init__(self, samples: int = 50_000, dense_features: int = 13,
                 rows: Sequence[int] = (400, 800, 1600, 3000, 300, 1200, 600, 2000),
                 max_bag: int = 4, zipf: float = 1.1, val_fraction: float = 0.1, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.rows, self.max_bag, self.dense_features = list(rows), max_bag, dense_features
        n, T = samples, len(self.rows)
        self.dense = torch.randn(n, dense_features, generator=g)
        # ids [N, T, max_bag], slots past the bag's length hold the table's padding id rows[t]
        self.lengths = torch.randint(1, max_bag + 1, (n, T), generator=g)
        self.ids = torch.empty(n, T, max_bag, dtype=torch.long)
        valid = torch.arange(max_bag) < self.lengths.unsqueeze(-1)         # [N, T, max_bag]
        for t, r in enumerate(self.rows):
            # Zipf popularity over ranks, ranks shuffled onto ids
            cdf = (1.0 / torch.arange(1, r + 1, dtype=torch.float64) ** zipf).cumsum(0)
            rank = torch.searchsorted(cdf, torch.rand(n * max_bag, generator=g, dtype=torch.float64) * cdf[-1])
            rank_to_id = torch.randperm(r, generator=g)
            draw = rank_to_id[rank.clamp_(max=r - 1)]
            self.ids[:, t] = torch.where(valid[:, t], draw.view(n, max_bag), r)
        # hidden ground truth: logit = dense . w + sum of per-id effects + pairwise table interactions + b
        w = torch.randn(dense_features, generator=g) * (1.0 / dense_features ** 0.5)
        logit = self.dense @ w - 1.0
        latent = []
        for t, r in enumerate(self.rows):
            eff = torch.cat([torch.randn(r, generator=g) * 0.3, torch.zeros(1)])
            u = torch.cat([torch.randn(r, 4, generator=g) * 0.5, torch.zeros(1, 4)])
            logit += eff[self.ids[:, t]].sum(1)
            latent.append(u[self.ids[:, t]].sum(1))                        # [N, 4]
        for a in range(T):
            for b in range(a + 1, T):
                logit += 0.1 * (latent[a] * latent[b]).sum(1)
        self.true_logit = logit
        self.clicks = torch.bernoulli(torch.sigmoid(logit), generator=g)
        self.n_train = int(round(n * (1 - val_fraction)))
        self.n = n

    def batch(self, idx: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """((dense, indices, offsets), clicks) of the samples idx, in the
        layout of the module docstring."""
        B, T = len(idx), len(self.rows)
        lengths = self.lengths[idx]                                        # [B, T]
        offsets = torch.zeros(T, B, dtype=torch.long)
        offsets[:, 1:] = lengths.t().cumsum(1)[:, :-1]
        indices = torch.empty(T, B * self.max_bag, dtype=torch.long)
        for t, r in enumerate(self.rows):
            ids = self.ids[idx, t]                                         # [B, max_bag]
            flat = ids[ids != r]                                           # row-major: bag after bag
            indices[t] = r
            indices[t, : flat.numel()] = flat
        return (self.dense[idx], indices, offsets), self.clicks[idx]

    def split(self, name: str) -> torch.Tensor:
        return torch.arange(self.n_train) if name == "train" else torch.arange(self.n_train, self.n)

    def click_rate(self, name: str) -> float:
        return float(self.clicks[self.split(name)].mean())

    def oracle_auc(self, name: str = "val") -> float:
        """AUC of the hidden ground-truth logit: the best a model can do."""
        s = self.split(name)
        return auc(self.true_logit[s], self.clicks[s])


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC on the host: the Mann-Whitney U statistic from average ranks
    (ties get their mean rank)."""
    s = scores.detach().double().cpu().flatten()
    y = labels.detach().cpu().flatten() > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = torch.argsort(s)
    sorted_s = s[order]
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    # average the ranks of tied scores
    uniq, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    if len(uniq) < len(s):
        ends = counts.cumsum(0).double()
        mean_rank = ends - (counts.double() - 1) / 2
        ranks[order] = mean_rank[inverse]
    u = float(ranks[y].sum()) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


# ------------------------------------------------------------------ benchmark


def bench_workload(batch: int | None = None, preset: str = "quick") -> tuple[nn.Module, list, Callable]:
    """(model on CPU, 4 host batches [((dense, indices, offsets), clicks)],
    loss_fn) for the benchmarks; batches from the synthetic click log."""
    torch.manual_seed(0)
    if preset == "quick":
        b, dim, rows = batch or 512, 16, (400, 800, 1600, 3000, 300, 1200, 600, 2000)
        bottom, top = (64, 32), (64, 32)
    else:
        b, dim = batch or 2048, 64
        rows = (100_000, 50_000, 20_000, 200_000, 5_000, 80_000, 10_000, 150_000,
                1_000, 30_000, 60_000, 3_000, 120_000, 40_000, 500, 25_000)
        bottom, top = (512, 256), (512, 512, 256)
    data = SyntheticClickLog(samples=4 * b, rows=rows, val_fraction=0.0, seed=0)
    model = DLRM(data.dense_features, rows, emb_dim=dim, bottom=bottom, top=top)
    batches = [data.batch(torch.arange(i * b, (i + 1) * b)) for i in range(4)]

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out.float(), y)

    return model, batches, loss_fn
