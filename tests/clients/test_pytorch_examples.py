"""pytorch/examples' dcgan, super_resolution, imagenet (ResNet-18) and
word_language_model/generate.py, run offline as a new user would with
`--accel`: the scripts' models, losses, optimizers and loops at tiny sizes,
on a synthetic image folder (PNG files written here, read back with PIL as
ImageFolder does) or a text corpus, on tpu and on CPU, in the strict and
DeferAndFuse modes. Every loss (and generate.py's words) must be the CPU's."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from examples.resnet.model import BasicBlock
from tests.clients.test_rnn_cells import _RNNModel, _corpus


# ------------------------------------------------------------ image folder

def _image_folder(root: Path, classes: int = 2, per_class: int = 4, size: int = 16) -> Path:
    """ImageFolder's layout: root/<class>/<n>.png, RGB images whose content
    depends on the class (a bright square at a class-dependent corner)."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = rng.integers(0, 96, (size, size, 3), dtype=np.uint8)
            o = (size // 2) * (c % 2)
            img[o:o + size // 2, o:o + size // 2] += 128
            Image.fromarray(img).save(root / f"class{c}" / f"{i}.png")
    return root


def _load_folder(root: Path, size: int | None = None, mode: str = "RGB"):
    """ImageFolder + ToTensor (+ Normalize(0.5, 0.5)): classes sorted by
    name, files sorted, values in [-1, 1], channels first."""
    xs, ys = [], []
    for c, d in enumerate(sorted(p for p in root.iterdir() if p.is_dir())):
        for f in sorted(d.glob("*.png")):
            img = Image.open(f).convert(mode)
            if size is not None:
                img = img.resize((size, size), Image.BICUBIC)
            a = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)
            xs.append(a.permute(2, 0, 1) if a.dim() == 3 else a[None])
            ys.append(c)
    return torch.stack(xs), torch.tensor(ys)


# ------------------------------------------------------------------ dcgan

class _DCGenerator(nn.Module):
    """dcgan/main.py's Generator (ConvTranspose2d + BatchNorm + ReLU, Tanh),
    two up-sampling stages fewer: nz -> 4x4 -> 8x8 -> 16x16."""

    def __init__(self, nz=8, ngf=8, nc=3):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class _DCDiscriminator(nn.Module):
    """dcgan/main.py's Discriminator (Conv2d + BatchNorm + LeakyReLU, Sigmoid)."""

    def __init__(self, ndf=8, nc=3):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


def _weights_init(m):  # dcgan/main.py's weights_init
    name = m.__class__.__name__
    if "Conv" in name:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def _dcgan(device: str, images: torch.Tensor, steps: int = 3) -> list[tuple[float, float, float, float]]:
    torch.manual_seed(999)
    net_g, net_d = _DCGenerator(), _DCDiscriminator()
    net_g.apply(_weights_init)
    net_d.apply(_weights_init)
    net_g, net_d = net_g.to(device), net_d.to(device)
    criterion = nn.BCELoss()
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    gen = torch.Generator().manual_seed(5)  # the noise drawn on the host, identical for both runs
    out = []
    for i in range(steps):
        real = images[(2 * i) % len(images):][:4].to(device)
        b = real.size(0)
        net_d.zero_grad()
        label = torch.full((b,), 1.0, device=device)
        err_d_real = criterion(net_d(real), label)
        err_d_real.backward()
        noise = torch.randn(b, 8, 1, 1, generator=gen).to(device)
        fake = net_g(noise)
        label.fill_(0.0)
        err_d_fake = criterion(net_d(fake.detach()), label)
        err_d_fake.backward()
        opt_d.step()
        net_g.zero_grad()
        label.fill_(1.0)
        output = net_d(fake)
        err_g = criterion(output, label)
        err_g.backward()
        opt_g.step()
        out.append(((err_d_real + err_d_fake).item(), err_g.item(), output.mean().item(),
                    net_g(noise).float().abs().mean().item()))
    return out


def test_dcgan_trains_like_cpu(tmp_path, both_modes, one_cpu_thread):
    images, _ = _load_folder(_image_folder(tmp_path / "imgs", per_class=4))
    images = images * 2 - 1  # Normalize((0.5,) * 3, (0.5,) * 3)
    cpu = _dcgan("cpu", images)
    tpu = _dcgan("tpu", images)
    assert len(tpu) == 3 and all(math.isfinite(v) for row in tpu for v in row)
    for got, want in zip(tpu, cpu):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


# ------------------------------------------------------- super_resolution

class _ESPCN(nn.Module):
    """super_resolution/model.py's Net: four convolutions and a pixel shuffle
    (the efficient sub-pixel network), orthogonal init as the script does."""

    def __init__(self, upscale: int):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, 1, 2)
        self.conv2 = nn.Conv2d(16, 16, 3, 1, 1)
        self.conv3 = nn.Conv2d(16, 8, 3, 1, 1)
        self.conv4 = nn.Conv2d(8, upscale ** 2, 3, 1, 1)
        self.shuffle = nn.PixelShuffle(upscale)
        gain = nn.init.calculate_gain("relu")
        for c in (self.conv1, self.conv2, self.conv3):
            nn.init.orthogonal_(c.weight, gain)
        nn.init.orthogonal_(self.conv4.weight)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.shuffle(self.conv4(x))


def _super_resolution(device: str, lo: torch.Tensor, hi: torch.Tensor, steps: int = 4):
    torch.manual_seed(123)
    model = _ESPCN(2).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()
    x, y = lo.to(device), hi.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():  # the script's test(): average PSNR
        mse = criterion(model(x), y).item()
    return losses, 10 * math.log10(1 / mse)


def test_super_resolution_trains_like_cpu(tmp_path, both_modes, one_cpu_thread):
    root = _image_folder(tmp_path / "imgs", per_class=3)
    hi, _ = _load_folder(root, mode="L")          # the Y channel, 16x16 targets
    lo, _ = _load_folder(root, size=8, mode="L")  # the script's input: resized down by the upscale factor
    cpu_losses, cpu_psnr = _super_resolution("cpu", lo, hi)
    tpu_losses, tpu_psnr = _super_resolution("tpu", lo, hi)
    assert tpu_losses[-1] < tpu_losses[0]
    assert tpu_losses == pytest.approx(cpu_losses, rel=1e-4)
    assert tpu_psnr == pytest.approx(cpu_psnr, rel=1e-4)


# --------------------------------------------------------- imagenet resnet18

class _ResNet18(nn.Module):
    """torchvision's resnet18 (imagenet/main.py's default --arch), layer for
    layer: 7x7 stem, max pool, four stages of two basic blocks
    (64-128-256-512; the block of examples/resnet), average pool, fc;
    torchvision's init."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _imagenet(device: str, x: torch.Tensor, y: torch.Tensor, steps: int = 2):
    """main.py's train() and validate() for a few iterations: the first
    iteration's gradients, every training loss, then the validation loss,
    top-1 and logits in eval mode (running statistics)."""
    torch.manual_seed(0)
    model = _ResNet18(num_classes=2).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)  # the script's defaults
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    x = ((x - mean) / std).to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    model.train()
    losses, first_grads = [], {}
    for step in range(steps):
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            first_grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(x)
        val_loss = criterion(logits, y).item()
        top1 = (logits.argmax(1) == y).float().mean().item()
    return {"grads": first_grads, "losses": losses, "val_loss": val_loss, "top1": top1, "logits": logits.cpu()}


def test_imagenet_resnet18_trains_like_cpu(tmp_path, both_modes, one_cpu_thread):
    x, y = _load_folder(_image_folder(tmp_path / "train", per_class=4, size=32))
    cpu = _imagenet("cpu", x, y)
    tpu = _imagenet("tpu", x, y)
    # the first iteration's gradients: within float32 rounding of the CPU's (both sides are ~1e-5 of a
    # float64 run's), relative to each gradient's scale, no finer than 1e-3 of the largest one
    scale = max(g.abs().max().item() for g in cpu["grads"].values())
    assert set(tpu["grads"]) == set(cpu["grads"])
    for name, want in cpu["grads"].items():
        err = (tpu["grads"][name] - want).abs().max().item()
        assert err <= 1e-4 * max(want.abs().max().item(), 1e-3 * scale), (name, err)
    # SGD at the script's lr 0.1 over a batch of 8 amplifies that rounding step by step (a batch-norm
    # network at 1x1 in its last stage): the losses and the eval-mode outputs agree to 1e-3
    assert all(math.isfinite(v) for v in tpu["losses"]) and tpu["losses"][-1] < tpu["losses"][0]
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-3)
    assert tpu["val_loss"] == pytest.approx(cpu["val_loss"], rel=2e-3)
    assert tpu["top1"] == cpu["top1"]
    err = (tpu["logits"] - cpu["logits"]).abs().max().item()
    assert err <= 2e-3 * cpu["logits"].abs().max().item()


# ---------------------------------------------- word_language_model/generate.py

def _generate(model: nn.Module, device: str, ntoken: int, words: int = 20, temperature: float = 1.0) -> list[int]:
    """generate.py's loop: a random first word, then each word drawn by
    torch.multinomial from exp(output / temperature) moved to the CPU."""
    torch.manual_seed(1111)
    model.eval()
    hidden = model.init_hidden(1)
    inp = torch.randint(ntoken, (1, 1), dtype=torch.long).to(device)
    out = []
    with torch.no_grad():
        for _ in range(words):
            output, hidden = model(inp, hidden)
            word_weights = output.squeeze().div(temperature).exp().cpu()
            word_idx = torch.multinomial(word_weights, 1)[0]
            inp.fill_(word_idx)
            out.append(int(word_idx))
    return out


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_word_language_model_generate_gives_cpus_words(kind, both_modes, tmp_path):
    data, ntoken = _corpus(tmp_path)
    torch.manual_seed(1111)
    cpu_model = _RNNModel(kind, ntoken, 16, 16, 2, dropout=0.0)
    for p in cpu_model.parameters():  # a trained-looking model: weights far from the uniform init
        p.data.mul_(8)
    dev_model = _RNNModel(kind, ntoken, 16, 16, 2, dropout=0.0)
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to("tpu")  # generate.py: torch.load(f, map_location=device)
    want = _generate(cpu_model, "cpu", ntoken)
    got = _generate(dev_model, "tpu", ntoken)
    assert len(set(want)) > 1
    assert got == want
