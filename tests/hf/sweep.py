"""One architecture of the sweep: forward + backward on CPU, then the same
model and inputs on tpu in the strict and DeferAndFuse modes and compiled
(the model's forward under torch.compile(backend="tpu"), its backward the
compiled backward graph), compared.

Outcome per mode: "pass" (outputs and every parameter's gradient within
tolerance of CPU's; where they are not, a float64 CPU run decides: tpu within
tolerance of it and closer than CPU's float32 passes as "arbitrated"), "mismatch" (something out of tolerance: the worst tensor
is named), "missing op" (an operator without a TPU kernel: named) or "error"
(anything else, with its message)."""
from __future__ import annotations

import copy
import re
import time
from dataclasses import asdict, dataclass

import torch

import torch_tpu

from tests.hf import archs as A

# f32 on both sides; the tpu's products and reductions associate differently from
# CPU's, so the error is measured relative to each tensor's own scale.
RTOL = 2e-3
FLOOR = 1e-3
MODES = ("strict", "defer", "compiled")
_MISSING = re.compile(r"operator '([\w:.]+)' is not implemented for TPU")


@dataclass
class Result:
    arch: str
    group: str
    mode: str
    status: str            # pass | mismatch | missing op | error
    detail: str = ""
    worst: float = 0.0     # largest relative error seen
    params: int = 0
    seconds: float = 0.0


def _first_output(out) -> torch.Tensor:
    for key in ("logits", "last_hidden_state", "logits_per_image"):
        t = getattr(out, key, None)
        if isinstance(t, torch.Tensor):
            return t
    return out[0]


def _step(model: torch.nn.Module, inputs: dict, device: str) -> dict[str, torch.Tensor]:
    """Forward + backward of a training-mode step; returns the tensors to
    compare, on the host: the loss, the first output and every gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    x = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    out = model(**x)
    first = _first_output(out)
    loss = getattr(out, "loss", None)
    if loss is None:  # no labels for this head: a fixed random projection of the output
        w = torch.randn(first.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        loss = (first * w.to(first.device, first.dtype)).sum()
    loss.backward()
    got = {"loss": loss.detach(), "output": first.detach()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            got["grad:" + name] = p.grad.detach()
    return {k: v.to("cpu", torch.float32) for k, v in got.items()}


def _relative_error(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    if a.shape != b.shape:
        return float("inf")
    if not torch.isfinite(b).all():
        same_nonfinite = torch.equal(torch.isfinite(a), torch.isfinite(b))
        keep = torch.isfinite(b)
        if not same_nonfinite:
            return float("inf")
        a, b = a[keep], b[keep]
    if b.numel() == 0:
        return 0.0
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / max(scale, floor, 1e-12)


def compare(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> tuple[float, str]:
    missing = sorted(set(ref) ^ set(got))
    if missing:
        return float("inf"), "tensors differ: " + ", ".join(missing[:3])
    # A gradient that is analytically zero (a key projection's bias: softmax ignores a shift) is rounding
    # noise on both sides; gradients are compared no finer than FLOOR of the model's largest gradient.
    grad_scale = max((v.abs().max().item() for k, v in ref.items() if k.startswith("grad:") and v.numel()),
                     default=0.0)
    worst, name = 0.0, ""
    for k in ref:
        e = _relative_error(got[k], ref[k], FLOOR * grad_scale if k.startswith("grad:") else 0.0)
        if e > worst:
            worst, name = e, k
    return worst, name


def _reference64(model: torch.nn.Module, inputs: dict) -> dict[str, torch.Tensor]:
    m64 = copy.deepcopy(model).double()
    x64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}
    return _step(m64, x64, "cpu")


def run_arch(arch: A.Arch, modes=MODES) -> list[Result]:
    """The architecture's results, one per mode (a build failure is an error
    in every mode)."""
    try:
        model = A.build_model(arch)
        inputs = A.make_inputs(arch, model)
        ref = _step(model, inputs, "cpu")
    except Exception as e:  # the architecture does not build or run on CPU: not the device's fault
        msg = f"CPU reference failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return [Result(arch.name, arch.group, m, "error", msg) for m in modes]
    nparams = sum(p.numel() for p in model.parameters())
    ref64 = None
    results = []
    for mode in modes:
        t = time.perf_counter()
        res = Result(arch.name, arch.group, mode, "pass", params=nparams)
        previous = torch_tpu.set_execution_mode("strict" if mode == "compiled" else mode)
        try:
            dev_model = copy.deepcopy(model).to("tpu")
            if mode == "compiled":  # as Transformers' users compile: the forward, the module kept
                torch._dynamo.reset()
                dev_model.forward = torch.compile(dev_model.forward, backend="tpu")
            got = _step(dev_model, inputs, "tpu")
            if mode == "compiled":  # AOTAutograd (Inductor on CPU too) gives a parameter the loss does not reach
                got = {k: v for k, v in got.items() if k in ref or v.any()}  # a zero gradient, eager None
            worst, name = compare(ref, got)
            if not worst <= RTOL:  # which side is inexact? CPU in float64 decides
                ref64 = ref64 if ref64 is not None else _reference64(model, inputs)
                worst64, name64 = compare(ref64, got)
                if worst64 <= RTOL and compare(ref64, ref)[0] > worst64:
                    res.detail = f"arbitrated: {name} {worst:.1e} from CPU f32, {worst64:.1e} from CPU f64"
                    worst = worst64
                else:
                    res.status, res.detail = "mismatch", f"{name}: relative error {worst:.2e}"
            res.worst = worst
        except NotImplementedError as e:
            m = _MISSING.search(str(e))
            res.status = "missing op" if m else "error"
            res.detail = m.group(1) if m else f"NotImplementedError: {str(e).splitlines()[0][:160]}"
        except Exception as e:
            res.status = "error"
            res.detail = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        finally:
            torch_tpu.set_execution_mode(previous)
            try:
                torch.tpu.synchronize()
            except Exception as e:  # a pending asynchronous error belongs to this architecture
                if res.status == "pass":
                    res.status, res.detail = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        res.seconds = time.perf_counter() - t
        results.append(res)
    return results


def as_dict(r: Result) -> dict:
    return asdict(r)
