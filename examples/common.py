"""What every example shares: the common command-line flags, the device /
execution-mode session with its progress bar and one-line summary,
checkpoints, the text corpus and a PNG writer.

    p = common.parser(__doc__, steps=100, batch_size=32, lr=3e-3)
    args = p.parse_args(argv)
    if (rc := common.check(args)) is not None:
        return rc
    with common.Run(args, mode, "ResNet") as run:
        model = run.to_device(model)
        run.train(step_fn, units_per_step=args.batch_size, unit="samples")
        ...
    print(common.summary(run.result))
"""
from __future__ import annotations

import argparse
import contextlib
import os
import struct
import sys
import time
import zlib
from typing import Callable

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# ----------------------------------------------------------------- flags


def parser(doc: str | None, *, steps: int, batch_size: int, lr: float) -> argparse.ArgumentParser:
    """An ArgumentParser with the flags every example takes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="tpu", choices=["tpu", "cpu"])
    p.add_argument("--mode", default="strict", choices=["strict", "defer", "compiled"],
                   help="tpu execution mode: strict eager, DeferAndFuse, or compiled "
                        "(the model's forward and backward through torch.compile(backend='tpu'); "
                        "the optimizer step stays eager)")
    p.add_argument("--compare", action="store_true", help="run in strict, then in defer mode; report both")
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument("--batch-size", type=int, default=batch_size, help=f"default {batch_size}")
    p.add_argument("--lr", type=float, default=lr, help=f"learning rate (default {lr})")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16: autocast of the forward pass (parameters and optimizer stay float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", help="checkpoint path to write after training")
    p.add_argument("--load", help="checkpoint path to start from")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def check(args: argparse.Namespace) -> int | None:
    """Exit status for flag combinations that cannot run (with the reason on
    stderr), None when the run can go ahead."""
    if args.device == "cpu" and (args.mode != "strict" or args.compare):
        print("--mode/--compare apply to the tpu device only", file=sys.stderr)
        return 2
    return None


def modes(args: argparse.Namespace) -> list[str]:
    return ["strict", "defer"] if args.compare else [args.mode]


# --------------------------------------------------------------- session


class Run:
    """One run of an example on one device and execution mode. Entering it
    selects the mode and resets the device's peak-memory and DeferAndFuse
    counters; `train` runs the step loop with a progress bar; `result` holds
    losses, throughput and the device's figures."""

    def __init__(self, args: argparse.Namespace, mode: str, name: str) -> None:
        self.args, self.mode, self.name = args, mode, name
        self.device = torch.device(args.device)
        self.result: dict = {"name": name, "device": args.device, "mode": mode}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Run":
        torch.manual_seed(self.args.seed)
        if self.device.type == "tpu":
            import torch_tpu

            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            torch.tpu.reset_defer_stats()
            # compiled graphs run on the graph engine whatever the mode; the
            # code around them (optimizer, data) runs strict
            self._stack.enter_context(torch_tpu.execution_mode("strict" if self.mode == "compiled" else self.mode))
        return self

    def compile(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to call in training steps: model itself, or with
        --mode compiled torch.compile(model, backend="tpu") (it shares the
        parameters, so checkpoints and evaluation keep using model)."""
        if self.mode == "compiled":
            return torch.compile(model, backend="tpu")
        return model

    def __exit__(self, *exc) -> None:
        self._stack.close()
        if exc[0] is None and self.device.type == "tpu":
            st = torch.tpu.defer_stats()
            self.result.update(peak_mib=torch.tpu.max_memory_allocated() / 2**20, graphs=st["graphs_built"],
                               cache_hits=st["cache_hits"])

    def autocast(self):
        """The forward pass's autocast context for --dtype."""
        if self.args.dtype == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def update(self, opt: torch.optim.Optimizer, forward: Callable[[], torch.Tensor],
               loss: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """One optimizer update: forward() under the run's autocast, loss(out)
        (computed on out.float()), backward, step; returns the loss."""
        with self.autocast():
            out = forward()
        value = loss(out.float())
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        return value

    def train(self, step: Callable[[int], torch.Tensor], units_per_step: float, unit: str = "samples") -> list[float]:
        """Calls step(i) for i in range(--steps); step returns the loss tensor
        of its (already applied) update. Throughput leaves out the first two
        steps (warm-up: allocation, plan building)."""
        n = self.args.steps
        bar = None
        if not self.args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=n, desc=f"{self.name} {self.args.device}/{self.mode}", unit="step", dynamic_ncols=True)
        losses: list[float] = []
        t0 = time.perf_counter()
        warm = None
        for i in range(n):
            losses.append(float(step(i).item()))
            if i == 1:
                warm = time.perf_counter()
            if bar:
                el = time.perf_counter() - t0
                bar.set_postfix({"loss": f"{losses[-1]:.3f}", f"{unit}/s": f"{(i + 1) * units_per_step / el:,.0f}"})
                bar.update()
        t1 = time.perf_counter()
        if bar:
            bar.close()
        timed = n - 2 if warm is not None and n > 2 else n
        rate = timed * units_per_step / max(t1 - (warm if timed != n else t0), 1e-9)
        tail = losses[-min(10, len(losses)):] if losses else [float("nan")]
        self.result.update(losses=losses, loss_first=losses[0] if losses else float("nan"),
                           loss_last=sum(tail) / len(tail), throughput=rate, unit=unit)
        return losses


def summary(r: dict, extra: str = "") -> str:
    """The one-line summary of a run."""
    s = f"{r['name']} {r['device']}/{r['mode']}:"
    if "losses" in r:
        s += f" loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}, {r['throughput']:,.1f} {r['unit']}/s"
    if extra:
        s += f", {extra}"
    if "peak_mib" in r:
        s += (f", peak device memory {r['peak_mib']:.1f} MiB, graphs built {r['graphs']},"
              f" cache hits {r['cache_hits']}")
    return s


def report(results: list[dict], extra: Callable[[dict], str] = lambda r: "") -> None:
    """Prints every run's summary line (with extra(r)) and, after --compare,
    the defer / strict throughput ratio."""
    for r in results:
        print(summary(r, extra(r)))
    if line := compare_line(results):
        print(line)


def compare_line(results: list[dict]) -> str | None:
    if len(results) == 2 and results[0]["mode"] == "strict" and results[1]["mode"] == "defer":
        return f"defer / strict throughput: {results[1]['throughput'] / results[0]['throughput']:.2f}x"
    return None


# ----------------------------------------------------------- checkpoints


def save_checkpoint(path: str, model: torch.nn.Module, opt: torch.optim.Optimizer | None = None, **extra) -> None:
    """Model (and optimizer) state on the host, so any device can load it."""
    def host(x):
        if isinstance(x, torch.Tensor):
            return x.detach().cpu()
        if isinstance(x, dict):
            return {k: host(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(host(v) for v in x)
        return x

    ck = {"model": host(model.state_dict()), **extra}
    if opt is not None:
        ck["optimizer"] = host(opt.state_dict())
    torch.save(ck, path)


def load_checkpoint(path: str, model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> dict:
    """Loads what save_checkpoint wrote into model (already on its device)
    and opt; returns the whole checkpoint."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(ck["model"])
    if opt is not None and "optimizer" in ck:
        opt.load_state_dict(ck["optimizer"])
    return ck


# ------------------------------------------------------------------ data


def pydoc_text() -> str:
    """The text of Python's own documentation topics (ships with Python)."""
    from pydoc_data import topics

    return "".join(topics.topics[k] for k in sorted(topics.topics))


class CharData:
    """Character-level tokens of a text, split 90/10 into train/val."""

    def __init__(self, text: str, block: int) -> None:
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        n = int(0.9 * len(ids))
        self.train, self.val, self.block = ids[:n], ids[n:], block

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def batch(self, split: str, size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        src = self.train if split == "train" else self.val
        ix = torch.randint(len(src) - self.block - 1, (size,), generator=g)
        x = torch.stack([src[i:i + self.block] for i in ix])
        y = torch.stack([src[i + 1:i + 1 + self.block] for i in ix])
        return x, y

    def encode(self, s: str) -> list[int]:
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of [B, T, V] logits against [B, T] targets."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def random_token_batches(vocab: int, batch: int, seq: int, g: torch.Generator, n: int = 4) -> list:
    """n (tokens, next tokens) pairs of random ids, [batch, seq] each."""
    out = []
    for _ in range(n):
        x = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((x[:, :-1].contiguous(), x[:, 1:].contiguous()))
    return out


# ------------------------------------------------------------------- PNG


def write_png(path: str, img) -> None:
    """Writes an 8-bit grayscale [H, W] or RGB [H, W, 3] image (uint8 tensor
    or array) as a PNG file."""
    t = torch.as_tensor(img).detach().cpu()
    if t.dtype != torch.uint8:
        raise TypeError(f"write_png expects uint8 pixels, got {t.dtype}")
    if t.dim() == 2:
        color, h, w = 0, t.shape[0], t.shape[1]
    elif t.dim() == 3 and t.shape[2] == 3:
        color, h, w = 2, t.shape[0], t.shape[1]
    else:
        raise ValueError(f"write_png expects [H, W] or [H, W, 3], got {list(t.shape)}")
    rows = t.contiguous().reshape(h, -1).numpy()
    raw = b"".join(b"\x00" + rows[i].tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


def read_png_size(path: str) -> tuple[int, int]:
    """(width, height) of a PNG after checking its signature and every
    chunk's CRC; raises ValueError for a file that is not a valid PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, size, idat = 8, None, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: bad CRC in {kind!r} chunk")
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    if size is None or not idat:
        raise ValueError(f"{path}: no IHDR/IDAT")
    zlib.decompress(idat)
    return size
