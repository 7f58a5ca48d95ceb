"""ResNet-18-style CNN (BasicBlocks [2, 2, 2, 2], BatchNorm, ReLU, adaptive
average pooling, configurable base width) with a small stem for small images
(one 3x3 stride-1 convolution, no max-pool), plain PyTorch; and the
scikit-learn digits data set (1797 8x8 grayscale images of the digits 0-9)
upsampled and normalized on the host, split into a stratified held-out set."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm; the shortcut is a 1x1 convolution
    with BatchNorm when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet18(nn.Module):
    """Stages of width w, 2w, 4w, 8w (the last three halve the resolution),
    `blocks` BasicBlocks per stage."""

    def __init__(self, classes: int = 10, width: int = 32, in_ch: int = 3,
                 blocks: tuple[int, ...] = (2, 2, 2, 2)) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(in_ch, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        layers, cin = [], w
        for i, n in enumerate(blocks):
            cout = w * 2**i
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


# ------------------------------------------------------------------ data


class Digits:
    """scikit-learn's digits, upsampled (bilinear, on the host, once) to
    size x size and normalized with the training set's mean and standard
    deviation; a stratified held-out split of `held_out` of each class drawn
    from a fixed seed (the same split whatever --seed is)."""

    def __init__(self, size: int = 32, held_out: float = 0.2, split_seed: int = 0) -> None:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [N, 1, 8, 8] in [0, 1]
        y = torch.tensor(d.target, dtype=torch.long)
        if size != x.shape[-1]:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        g = torch.Generator().manual_seed(split_seed)
        test_idx = []
        for c in range(int(y.max()) + 1):
            idx = (y == c).nonzero().flatten()
            idx = idx[torch.randperm(len(idx), generator=g)]
            test_idx.append(idx[: round(held_out * len(idx))])
        test = torch.zeros(len(y), dtype=torch.bool)
        test[torch.cat(test_idx)] = True
        xtr = x[~test]
        mean, std = xtr.mean(), xtr.std()
        self.x_train, self.y_train = ((xtr - mean) / std).contiguous(), y[~test]
        self.x_test, self.y_test = ((x[test] - mean) / std).contiguous(), y[test]
        self.classes = int(y.max()) + 1

    def batches(self, batch: int, g: torch.Generator):
        """Endless training batches: a new host-generator permutation every
        epoch, the last incomplete batch of an epoch dropped (fixed shapes)."""
        n = len(self.y_train)
        while True:
            perm = torch.randperm(n, generator=g)
            for i in range(0, n - batch + 1, batch):
                ix = perm[i:i + batch]
                yield self.x_train[ix], self.y_train[ix]


# ------------------------------------------------------------- benchmarks


def bench_workload(batch: int | None = None, preset: str = "quick") -> tuple[nn.Module, list, Callable]:
    """(model on CPU, 4 host batches [(images, labels)], cross-entropy) for
    the benchmarks; random 3x32x32 images from a fixed seed. "quick": width
    32, batch 16; "full": width 64 (ResNet-18's own widths), batch 64."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    width, b = (32, batch or 16) if preset == "quick" else (64, batch or 64)
    model = ResNet18(classes=10, width=width, in_ch=3)
    batches = [(torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g))
               for _ in range(4)]
    return model, batches, F.cross_entropy
