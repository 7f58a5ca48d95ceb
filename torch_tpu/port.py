"""``torch-tpu port``: finds CUDA-specific code and rewrites it for ``tpu``.

A static analysis over libcst's concrete syntax tree (so ``--fix`` keeps
the file's formatting and comments). Each finding has file:line:column, the
code, the suggested rewrite and whether ``--fix`` applies it. Rewrites use
the device-agnostic ``torch.accelerator`` API where it has the function and
``tpu`` / ``torch.tpu`` otherwise:

* ``x.cuda()`` / ``x.cuda(i)`` / ``x.cuda(non_blocking=True)`` -> ``x.to(...)``
  on the current accelerator; ``x.is_cuda`` -> ``x.is_tpu``
* ``"cuda"`` / ``"cuda:N"`` strings (devices, autocast, ``pin_memory_device``)
  and f-strings starting ``cuda:`` -> ``"tpu"`` / ``"tpu:N"``
* ``torch.cuda.is_available / device_count / synchronize / current_device /
  set_device / current_stream / memory_* / empty_cache`` -> ``torch.accelerator``
* ``torch.cuda.manual_seed(_all)``, streams, events, the rest of ``torch.cuda.*``
  -> ``torch.tpu.*`` (``torch.cuda.Event`` -> ``torch.Event``)
* ``torch.cuda.amp.autocast(...)`` -> ``torch.autocast("tpu", ...)``,
  ``torch.cuda.amp.GradScaler(...)`` -> ``torch.amp.GradScaler("tpu", ...)``
* ``backend="nccl"`` / ``init_process_group("nccl")`` -> ``"tpu_dist"``
* reported only (no rewrite is right in every program): ``torch.backends.cudnn.*``
  (no effect on tpu), ``from torch.cuda... import`` names, ``torch.cuda.nvtx``.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

ACCEL = "torch.accelerator"
_ACCEL_NAMES = {  # torch.cuda.X -> torch.accelerator.Y
    "is_available": "is_available", "device_count": "device_count", "synchronize": "synchronize",
    "current_device": "current_device_index", "set_device": "set_device_index",
    "current_stream": "current_stream", "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated", "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved", "reset_peak_memory_stats": "reset_peak_memory_stats",
    "empty_cache": "empty_cache", "memory_stats": "memory_stats",
}
_SPECIAL = {"Event": "torch.Event", "Stream": "torch.tpu.Stream"}
_MODULES = {"amp", "memory", "nvtx", "random", "streams", "graphs", "comm", "nccl", "jiterator", "tunable"}
_DEVICE_STR = re.compile(r"^cuda(:\d+)?$")


def _accelerator_has(name: str) -> bool:
    try:
        import torch
        if hasattr(torch.accelerator, name):
            return True
        mem = getattr(torch.accelerator, "memory", None)
        return mem is not None and hasattr(mem, name) and hasattr(torch.accelerator, name)
    except Exception:
        return False


@dataclass
class Finding:
    path: str
    line: int
    col: int
    code: str
    suggestion: str
    fixable: bool

    def __str__(self) -> str:
        tag = "fix" if self.fixable else "manual"
        return f"{self.path}:{self.line}:{self.col}: [{tag}] {self.code}  ->  {self.suggestion}"


def _dotted(node: cst.BaseExpression) -> str | None:
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def _expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def _dev_call() -> str:
    return f"{ACCEL}.current_accelerator()"


class _Porter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str, module: cst.Module) -> None:
        super().__init__()
        self.path = path
        self.module = module
        self.findings: list[Finding] = []

    def _note(self, node: cst.CSTNode, suggestion: str, fixable: bool = True) -> None:
        pos = self.get_metadata(PositionProvider, node).start
        code = self.module.code_for_node(node)
        code = code if len(code) < 90 else code[:87] + "..."
        self.findings.append(Finding(self.path, pos.line, pos.column + 1, code.replace("\n", " "), suggestion, fixable))

    # torch.cuda.X and x.is_cuda
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        name = _dotted(original)
        if original.attr.value == "is_cuda" and name != "torch.is_cuda":
            self._note(original, "x.is_tpu")
            return updated.with_changes(attr=cst.Name("is_tpu"))
        if not name:
            return updated
        parts = name.split(".")
        if parts[:3] == ["torch", "backends", "cudnn"] and len(parts) == 4:
            self._note(original, "no effect on tpu (cuDNN settings); keep or remove", fixable=False)
            return updated
        if parts[:2] != ["torch", "cuda"] or len(parts) < 3:
            return updated
        if parts[2] == "amp" and len(parts) == 4 and parts[3] in ("autocast", "GradScaler"):
            return updated  # the enclosing call adds the device (leave_Call); a bare reference is reported there
        if parts[2] == "nvtx":
            if len(parts) == 4:
                self._note(original, "torch.profiler.record_function(...) (torch_tpu.profiler shows it)", fixable=False)
            return updated
        if parts[2] == "memory" and len(parts) == 4:
            fn = parts[3]
        elif len(parts) == 3 and parts[2] not in _MODULES:
            fn = parts[2]
        else:
            return updated
        if fn in _SPECIAL:
            new = _SPECIAL[fn]
        elif fn in _ACCEL_NAMES and _accelerator_has(_ACCEL_NAMES[fn]):
            new = f"{ACCEL}.{_ACCEL_NAMES[fn]}"
        else:
            new = f"torch.tpu.{fn}"
        self._note(original, new)
        return _expr(new)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        fname = _dotted(original.func)
        if fname in ("torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"):
            target = "torch.autocast" if fname.endswith("autocast") else "torch.amp.GradScaler"
            args = [cst.Arg(cst.SimpleString('"tpu"'))] + list(updated.args)
            self._note(original, f'{target}("tpu", ...)')
            return updated.with_changes(func=_expr(target), args=args)
        if fname and fname.split(".")[-1] == "init_process_group" or fname == "init_process_group":
            new_args = []
            changed = False
            for i, a in enumerate(updated.args):
                is_backend = (a.keyword and a.keyword.value == "backend") or (a.keyword is None and i == 0)
                if is_backend and isinstance(a.value, cst.SimpleString) and a.value.evaluated_value in ("nccl", "cuda:nccl"):
                    a = a.with_changes(value=cst.SimpleString('"tpu_dist"'))
                    changed = True
                new_args.append(a)
            if changed:
                self._note(original, 'backend="tpu_dist"')
                return updated.with_changes(args=new_args)
        if isinstance(original.func, cst.Attribute) and original.func.attr.value == "cuda" and _dotted(original.func) != "torch.cuda":
            assert isinstance(updated.func, cst.Attribute)
            pos = [a for a in updated.args if a.keyword is None]
            kw = [a for a in updated.args if a.keyword is not None and a.keyword.value != "device"]
            dev_kw = [a for a in updated.args if a.keyword is not None and a.keyword.value == "device"]
            index = pos[0].value if pos else (dev_kw[0].value if dev_kw else None)
            if index is None:
                dev = _expr(_dev_call())
            else:
                dev = _expr(f"torch.device({_dev_call()}.type, {self.module.code_for_node(index)})")
            args = [cst.Arg(dev)] + [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in kw]
            self._note(original, f".to({self.module.code_for_node(dev)}{', ...' if kw else ''})")
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")), args=args)
        return updated

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.BaseExpression:
        try:
            v = original.evaluated_value
        except Exception:
            return updated
        if isinstance(v, str) and _DEVICE_STR.match(v):
            q = original.quote
            new = f"{original.prefix}{q}tpu{v[4:]}{q}"
            self._note(original, new)
            return updated.with_changes(value=new)
        return updated

    def leave_FormattedString(self, original: cst.FormattedString, updated: cst.FormattedString) -> cst.BaseExpression:
        parts = list(updated.parts)
        if parts and isinstance(parts[0], cst.FormattedStringText) and parts[0].value.startswith("cuda:"):
            parts[0] = parts[0].with_changes(value="tpu:" + parts[0].value[5:])
            self._note(original, "f\"tpu:...\"")
            return updated.with_changes(parts=parts)
        return updated

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            if _dotted(alias.name) == "torch.backends.cudnn":
                self._note(node, "no effect on tpu (cuDNN settings made through this name); keep or remove",
                           fixable=False)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        mod = _dotted(node.module) if node.module else None
        if mod and (mod == "torch.cuda" or mod.startswith("torch.cuda.")):
            self._note(node, "import from torch.amp / torch.accelerator / torch.tpu and pass the device "
                             "(e.g. torch.amp.GradScaler(\"tpu\"), torch.autocast(\"tpu\"))", fixable=False)
        return False


def port_source(source: str, path: str = "<string>") -> tuple[str, list[Finding]]:
    """(rewritten source, findings) of one file's text."""
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    porter = _Porter(path, wrapper.module)
    new = wrapper.visit(porter)
    porter.findings.sort(key=lambda f: (f.line, f.col))
    return new.code, porter.findings


def python_files(path: str) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    skip = {".git", ".venv", "venv", "__pycache__", "build", "node_modules"}
    return sorted(f for f in p.rglob("*.py") if not (set(f.parts) & skip))


def port(path: str, fix: bool = False, diff: bool = False, out=None) -> int:  # type: ignore[no-untyped-def]
    """Reports (and with ``fix`` rewrites) every Python file under path;
    returns the number of findings."""
    import sys
    out = out or sys.stdout
    total = fixable = files = 0
    for f in python_files(path):
        src = f.read_text()
        try:
            new, findings = port_source(src, str(f))
        except cst.ParserSyntaxError as exc:
            print(f"{f}: not parsed ({exc.message} at line {exc.raw_line}); skipped", file=out)
            continue
        if not findings:
            continue
        files += 1
        total += len(findings)
        fixable += sum(x.fixable for x in findings)
        for x in findings:
            print(x, file=out)
        if diff and new != src:
            out.writelines(difflib.unified_diff(src.splitlines(True), new.splitlines(True), f"a/{f}", f"b/{f}"))
        if fix and new != src:
            f.write_text(new)
    verb = "rewritten" if fix else "rewritable with --fix"
    print(f"torch-tpu port: {total} CUDA-specific site(s) in {files} file(s); {fixable} {verb}, "
          f"{total - fixable} to review by hand", file=out)
    return total
