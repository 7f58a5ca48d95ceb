"""``torch.compile(model, backend="tpu")``: Dynamo + AOTAutograd graphs run
by the runtime's graph engine.

How a compiled call runs
------------------------
Dynamo captures the Python function as an FX graph; AOTAutograd turns it
into a forward and a backward graph of ATen operators (functionalized: in-
place updates of inputs and buffers become outputs that AOTAutograd's
wrapper copies back), partitioned with the min-cut partitioner, which
recomputes cheap activations in the backward instead of saving them. Each
graph is checked once, when it is lowered: every operator must have a
``tpu`` kernel (the error names the operator and the user's source line, as
eager raises it, when the graph is called). A call runs the graph's ATen
operators straight into the DeferAndFuse recorder (``torch_tpu.execution_mode``
"defer"): the runtime fuses them, plans their memory and runs the generated
kernels of its cached plan, the same engine and plans as the eager
DeferAndFuse mode. Outside any compiled region the process keeps its own
mode; a compiled call made in strict mode cuts its graph when it returns (one
plan per graph, reused every step); in defer mode it records into the
program's graph without a cut; in debug mode (``TPU_LAUNCH_BLOCKING=1``) it
keeps waiting for every kernel, so an error still names its operator.

Decompositions: none beyond what AOTAutograd always applies (the ops
PyTorch marks CompositeImplicitAutograd). The device has kernels for the
composite operators eager uses (layer norm, softmax, convolution, attention
and their backwards), so a compiled graph computes with exactly the kernels
of eager mode and its results equal strict mode's, dropout masks included
(the dropout ops draw from the device generator in the same order).

Replay: a call records its operators, so its host time grows with the
graph (Python, the dispatcher and the recorder per operator). A graph called
from strict mode is therefore captured as a template on a call (its
recording before the cut, with every device address written relative to the
input or the allocation it points into), checked against the next call's
own recording relocated onto that call's inputs (op for op, byte for byte),
and once equal, later calls replay it: the runtime copies the template,
patches in the new inputs' addresses and fresh memory, and runs the cached
plan, without Python or recording between the operators
(``runtime/src/graph/replay.c``). The glue (``_C._Replay``) describes the
call's inputs before it runs — tpu tensors by memory block, small host
tensors by value, None — and its outputs after: fresh memory, an input, a
view of an input, a host value, None. Inputs the graph lets go of inside (a
backward graph's saved values) are freed by the replay at the recorded
point, once the call's list holds their last references. Random draws
from the default generator replay with the blocks a replay reserves from it
(eager mode's numbers). Graphs whose recordings differ between calls (host
data copied in, a free of memory from outside) are never replayed and keep
recording (``replay_off`` in ``compile_stats()`` says why); a call whose
inputs do not fit the template records. ``TORCH_TPU_COMPILE_REPLAY=0``
turns replay off.

In-place updates of inputs: functionalization writes an update of a graph
input (a parameter, an optimizer's state, a KV cache, a buffer) as out-of-
place ops and a copy_ back at the end. Before lowering, a chain of ops that
have in-place variants, each taking the previous one's value as its first
operand and ending in the copy_ back, runs in place on the input when no op
reads an operand's old value after it (``inputs_updated_in_place``); a
foreach op goes in place when every tensor of its first list qualifies.
A compiled optimizer step (``torch.compile(opt.step, backend="tpu")``) over
tpu parameters creates its state on the device (``capturable``, as Dynamo
does for CUDA parameters), so its graph has no host values and replays;
its foreach ops then update parameters and state in place and run as the
runtime's foreach chains.

Dynamic shapes: ``dynamic=True`` / ``torch._dynamo.mark_dynamic`` give one
graph with symbolic sizes for all sizes of a dimension; its operators take
the sizes of each call, and the runtime keeps one cached plan per distinct
shape (``plans`` in ``compile_stats()``).

Plain ``torch.compile(model)`` (Inductor) on ``tpu`` tensors: Inductor's own
code generator for a device named "tpu" is its Pallas/JAX one. Graphs whose
inputs live on ``tpu`` are handed to this backend instead (counted as
``routed_from_inductor``); graphs on other devices go to Inductor unchanged.

``compile_stats()`` counts graphs lowered, calls and Dynamo's recompiles
with their reasons; ``TORCH_LOGS=recompiles`` prints them as they happen.
"""
from __future__ import annotations

import functools
import operator
import os
import threading
import time
from typing import Any, Callable, Sequence

import torch
from torch.fx.graph import _BoxedCodeGen

from torch_tpu import _C

__all__ = ["tpu_backend", "compile_stats", "reset_compile_stats"]

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_DEFER = 2
_BLOCKING = 1

_lock = threading.Lock()
_stats: dict[str, Any] = {}
_replay_off: dict[str, int] = {}  # why graphs run without replay: graphs


def reset_compile_stats() -> None:
    """Zeroes the counters of ``compile_stats()``."""
    with _lock:
        _stats.clear()
        _stats.update(dynamo_graphs=0, forward_graphs=0, backward_graphs=0, inference_graphs=0, nodes_lowered=0,
                      lowering_seconds=0.0, inputs_updated_in_place=0, fast_calls=0, calls=0, first_calls_seconds=0.0,
                      backend_seconds=0.0, routed_from_inductor=0, unsupported_graphs=0, replays=0,
                      replays_refused=0, replay_templates=0, native_gqa=0, clones_elided=0)
        _replay_off.clear()


reset_compile_stats()


def compile_stats() -> dict[str, Any]:
    """What ``torch.compile(backend="tpu")`` did in this process: Dynamo
    graphs handed to the backend (``dynamo_graphs``), the ATen graphs lowered
    (``forward_graphs``, ``backward_graphs``, ``inference_graphs``,
    ``nodes_lowered``, ``lowering_seconds``, ``fast_calls``: ATen calls made
    through the eager Python bindings instead of ``torch.ops``, ``inputs_updated_in_place``:
    input updates run in place instead of through a copy of the input),
    compiled calls run
    (``calls``; ``first_calls_seconds``: the first call of each graph, which
    builds its plan and compiles or loads its kernels), ``backend_seconds``
    (AOTAutograd's tracing and partitioning plus the lowering), graphs of plain ``torch.compile`` routed here from Inductor
    (``routed_from_inductor``), graphs holding an operator without a kernel
    (``unsupported_graphs``), replays (``replays``: calls run from a verified
    template without recording, ``replay_templates``: templates captured,
    ``replays_refused``: calls a verified template could not take, e.g.
    inputs of another layout; ``replay_off``: why graphs run without replay,
    ``{reason: graphs}``), ``native_gqa``: attention calls over key / value
    heads a model repeated for the query heads that read the shared heads
    directly (``enable_gqa``), ``clones_elided``: copies of contiguous
    intermediates only read in the graph (``dropout(p=0)``) that read their
    source instead, and ``recompiles``: Dynamo's recompilations of
    each function with the guard that failed (``{"fn (file:line)": [reason,
    ...]}``)."""
    with _lock:
        out = dict(_stats)
        out["replay_off"] = dict(_replay_off)
    out["recompiles"] = _recompile_reasons()
    return out


def _count(key: str, n: float = 1) -> None:
    with _lock:
        _stats[key] += n


def _recompile_reasons() -> dict[str, list[str]]:
    try:
        from torch._dynamo.utils import guard_failures
    except ImportError:  # pragma: no cover - torch without Dynamo
        return {}
    out = {}
    for code, reasons in guard_failures.items():
        if reasons:
            out[f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"] = [str(r) for r in reasons]
    return out


# ------------------------------------------------------------- lowering


def _has_kernel(op: torch._ops.OpOverload) -> bool:
    """Whether eager dispatch of op on tpu reaches a kernel (the device's own,
    or a composite that runs through other operators)."""
    name = op.name()
    for key in ("PrivateUse1", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                "CompositeImplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            return True
    return False


def _user_line(node: torch.fx.Node) -> str:
    """The innermost user frame of the node's stack trace ("file.py:12 in f")."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return "an unknown line"
    # 'File "x.py", line 12, in f' -> x.py:12 in f
    last = lines[-1]
    try:
        path = last.split('"')[1]
        rest = last.split('"', 2)[2]
        lineno = rest.split("line", 1)[1].split(",")[0].strip()
        fn = rest.split(" in ", 1)[1].strip() if " in " in rest else ""
        return f"{path}:{lineno}" + (f" in {fn}" if fn else "")
    except IndexError:
        return last


def _unsupported(gm: torch.fx.GraphModule) -> tuple[str, str] | None:
    """(operator, user line) of the first node without a tpu kernel."""
    if _C._cpu_fallback_enabled():
        return None  # eager would run it on the CPU (counted and warned there); so does the graph
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target.namespace in ("aten", "prims") and not _has_kernel(node.target):
                return node.target.name(), _user_line(node)
    return None


def _op_returns_alias(op: torch._ops.OpOverload) -> bool:
    return any(r.alias_info is not None for r in op._schema.returns)


def _returns_alias(node: torch.fx.Node) -> bool:
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return node.op == "call_function"  # getitem of a tuple etc.: conservatively a possible alias
    return _op_returns_alias(t)


def _reinplace(gm: torch.fx.GraphModule) -> int:
    """Functionalization turns an in-place update of a graph input (a KV
    cache's index_copy_, an optimizer's update of its parameters and state)
    into out-of-place ops plus a copy_ back at the end. Where nothing reads
    the input's old value after the update, the in-place operators come back
    and the copy_ goes (_reinplace_chains): O(update) instead of O(input)
    work per call. Returns the number of ops made in place."""
    folded = _fold_constant_factors(gm)
    done = _reinplace_chains(gm)
    if done or folded:
        gm.graph.lint()  # the caller regenerates the code
    return done


def _is_mutable(node: torch.fx.Node) -> bool:
    """Might the call write one of its arguments (unknown callables: yes)?"""
    t = node.target
    if node.op != "call_function" or t is operator.getitem:
        return False
    return not isinstance(t, torch._ops.OpOverload) or t._schema.is_mutable


def _elide_clones(gm: torch.fx.GraphModule) -> int:
    """``clone`` of a contiguous intermediate whose result (and every view of
    it) is only read inside the graph reads the source instead: what
    ``dropout(p=0)`` leaves in a training graph (the attention probabilities'
    and the residual branches' dropout of Llama-style configurations) and
    matmul's decomposition of an operand already contiguous — a copy a call
    saved. Not for a clone of (a view of) an input, one that an op mutates or
    the graph returns (saved for the backward: outputs must not alias), nor in
    a graph that mutates anything but its inputs. Returns the clones removed."""
    mutated = set()
    for node in gm.graph.nodes:
        if _is_mutable(node):
            if not isinstance(node.target, torch._ops.OpOverload):
                return 0
            for a, arg in zip(node.target._schema.arguments, node.args):
                if a.alias_info is not None and a.alias_info.is_write:
                    mutated.add(arg)
    if any(not isinstance(m, torch.fx.Node) or m.op != "placeholder" for m in mutated):
        return 0

    def from_input(n: Any) -> bool:
        while isinstance(n, torch.fx.Node) and n.op == "call_function" and _returns_alias(n) and n.args:
            n = n.args[0]
        return not isinstance(n, torch.fx.Node) or n.op != "call_function"

    def only_read(n: torch.fx.Node) -> bool:
        for u in n.users:
            if u.op == "output" or _is_mutable(u):
                return False
            if _returns_alias(u) and not only_read(u):
                return False
        return True

    n_done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.clone.default or not node.args:
            continue
        src = node.args[0]
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        fmt = node.kwargs.get("memory_format")
        if (not isinstance(val, torch.Tensor) or fmt not in (None, torch.contiguous_format, torch.preserve_format)
                or not val.is_contiguous() or from_input(src) or not only_read(node)):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        n_done += 1
    return n_done


def _fold_constant_factors(gm: torch.fx.GraphModule) -> int:
    """``_foreach_addcmul(s, [full_like(x, c), ...], t)`` -> ``_foreach_add(s,
    t, alpha=c)``: the decomposition of a foreach lerp (an optimizer's
    moving average) fills a tensor of the weight for every parameter and
    multiplies by it. With value 1 the two compute the same product of the
    same float factors, so the same bits, without the fills (a launch per
    parameter, which also cut the step's foreach chain in pieces). A
    half-precision fill holds the weight rounded to its own dtype: alpha is
    that rounded value (exact in f32, where the kernels compute). Returns the
    number of ops folded."""
    aten = torch.ops.aten
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten._foreach_addcmul.Scalar:
            continue
        value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", 1)
        if len(node.args) < 3 or set(node.kwargs) - {"value"} or value != 1:
            continue
        s, t1, t2 = node.args[:3]
        for fills, other in ((t1, t2), (t2, t1)):
            if not isinstance(fills, (list, tuple)) or not fills:
                continue
            ok = all(isinstance(f, torch.fx.Node) and f.target is aten.full_like.default and len(f.args) == 2
                     and set(f.users) == {node} and f.kwargs.get("dtype") is None
                     and _same_layout(f.meta.get("val"), o.meta.get("val") if isinstance(o, torch.fx.Node) else None)
                     and f.meta["val"].dtype.is_floating_point
                     for f, o in zip(fills, other))
            if not ok or len({f.args[1] for f in fills}) != 1 or not isinstance(fills[0].args[1], (int, float)):
                continue
            dtypes = {f.meta["val"].dtype for f in fills}
            if len(dtypes) != 1:
                continue
            # the weight as the fills hold it (rounded to their dtype; the kernels round alpha to f32 anyway)
            c = torch.tensor(float(fills[0].args[1]), dtype=dtypes.pop()).item()
            node.target = aten._foreach_add.List
            node.args, node.kwargs = (s, other), {"alpha": c}
            for f in fills:
                gm.graph.erase_node(f)
            done += 1
            break
    return done


def _inplace_variant(target: Any) -> Any:
    """aten.op.overload -> aten.op_.overload (self written in place), or None.
    None for a view op too: its ``_`` variant (detach_, t_, squeeze_, ...)
    rewrites the tensor's metadata, not its values (a detach() of an input
    made detach_() failed on an input that is a view, fuzz seed 144860)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    if _op_returns_alias(target):
        return None
    name = target._schema.name.split("::")[-1]
    if name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, name + "_", None)
    ov = getattr(packet, target._overloadname, None) if packet is not None else None
    if ov is None or not ov._schema.arguments:
        return None
    first = ov._schema.arguments[0].alias_info
    return ov if first is not None and first.is_write else None


def _same_layout(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device)


def _reinplace_chains(gm: torch.fx.GraphModule) -> int:
    """Functionalization writes every in-place update of an input as
    out-of-place ops and a copy_ back at the end: a compiled optimizer step
    computed each parameter's and state's new value into fresh memory (and
    a foreach op per list for each), then copied it back — a copy per
    tensor per state, and the foreach chains cut at the copies. Where an
    input's final value comes from a chain of ops that each have an in-place
    variant writing their first operand (``_foreach_mul`` ->
    ``_foreach_mul_``, ``mul`` -> ``mul_``), each taking the previous
    link's value as that operand, and nothing reads a link's operand after
    the link, the chain runs in place on the input and the copy_ goes.
    A foreach op goes in place only when every entry of its first list is
    such a link of its own input. Returns the number of ops made in place."""
    aten = torch.ops.aten
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    copies: dict[torch.fx.Node, torch.fx.Node | None] = {}
    for n in nodes:
        if n.op == "call_function" and n.target is aten.copy_.default and not n.users:
            p, v = n.args[0], n.args[1]
            if isinstance(p, torch.fx.Node) and p.op == "placeholder" and isinstance(v, torch.fx.Node):
                copies[p] = None if p in copies else n  # two copies back into one input: left alone
    # links[F][i] = (input, operand, value): entry i of F (None: a one-tensor op) updates `input`
    links: dict[torch.fx.Node, dict[Any, tuple[torch.fx.Node, Any, torch.fx.Node]]] = {}
    chains: list[list[torch.fx.Node]] = []
    for p, cp in copies.items():
        if cp is None:
            continue
        v, chain = cp.args[1], []
        while v is not p:
            if not isinstance(v, torch.fx.Node) or v.op != "call_function":
                break
            if v.target is operator.getitem:
                f, i = v.args[0], v.args[1]
                lst = f.args[0] if isinstance(f, torch.fx.Node) and f.args else None
                if not isinstance(lst, (list, tuple)) or not isinstance(i, int) or not 0 <= i < len(lst):
                    break
                s = lst[i]
            else:
                f, i = v, None
                s = f.args[0] if f.args else None
                if isinstance(s, (list, tuple)):
                    break
            if _inplace_variant(f.target) is None or not isinstance(s, torch.fx.Node):
                break
            chain.append((f, i, s, v))
            v = s
        else:
            for f, i, s, v in chain:
                links.setdefault(f, {})[i] = (p, s, v)
            chains.append([f for f, _, _, _ in chain])

    def ok(f: torch.fx.Node) -> bool:
        ent = links[f]
        lst = f.args[0]
        if isinstance(lst, (list, tuple)):
            if set(ent) != set(range(len(lst))) or len({e[0] for e in ent.values()}) != len(lst):
                return False
        elif set(ent) != {None}:
            return False
        rest = [a for a in f.args[1:]] + list(f.kwargs.values())
        flat = [x for a in rest for x in (a if isinstance(a, (list, tuple)) else [a])]
        for p, s, v in ent.values():
            if not _same_layout(s.meta.get("val"), v.meta.get("val")) or s in flat:
                return False
            for u in s.users:
                if u is f or (u.target is aten.copy_.default and u.args[0] is s and u is copies.get(p)):
                    continue
                if order[u] > order[f] or _returns_alias(u):
                    return False  # the operand's old value is read after the link, or through a view
        return True

    # An input's chain goes in place whole or not at all: with a link left
    # out, the copy_ back stays and would overwrite the values of the links
    # before it, which their readers may still need.
    chosen = {f for f in links if ok(f)}
    changed = True
    while changed:
        changed = False
        for chain in chains:
            if not all(f in chosen for f in chain) and any(f in chosen for f in chain):
                chosen.difference_update(chain)
                changed = True
    for f in sorted(chosen, key=order.__getitem__):
        f.target = _inplace_variant(f.target)
        for p, s, v in links[f].values():
            v.replace_all_uses_with(p)
            if v is not f:
                gm.graph.erase_node(v)
    for p, cp in copies.items():
        if cp is not None and cp.args[1] is p:
            gm.graph.erase_node(cp)
    return len(chosen)


class _Compiled:
    """One lowered ATen graph: calling it runs the graph's operators into the
    runtime's DeferAndFuse recorder (see the module's docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str) -> None:
        self.gm = gm
        self.kind = kind
        # AOTAutograd passes the inputs as one list (an instance attribute:
        # the wrappers Dynamo puts around the backward copy __dict__ only)
        self._boxed_call = True
        self.first = True
        self.missing = _unsupported(gm)
        if self.missing:
            _count("unsupported_graphs")
        self.replay: Any = None  # the template (_C._Replay), once captured
        self.replay_off = os.environ.get("TORCH_TPU_COMPILE_REPLAY", "1") == "0"
        self.replay_tries = 0
        self.out_type: Any = tuple

    def __call__(self, args: list[Any]) -> Any:
        if self.missing:
            op, line = self.missing
            raise NotImplementedError(
                f"operator '{op}' is not implemented for TPU (in a graph compiled by torch.compile(backend=\"tpu\"), "
                f"from {line}). To run it on the CPU instead (slow: the tensors are copied to the host and back), "
                f"set TORCH_TPU_CPU_FALLBACK=1 or call torch_tpu._internal.execution_mode.cpu_fallback_mode(True).")
        _count("calls")
        if self.first:
            self.first = False
            t0 = time.perf_counter()
            try:
                return self._run(args)
            finally:
                _count("first_calls_seconds", time.perf_counter() - t0)
        return self._run(args)

    def _run(self, args: list[Any]) -> Any:
        mode = _C._exec_mode()
        # a strict program records the call's ops and cuts its graph on return
        switch = mode != _DEFER and mode != _BLOCKING
        replay = self.replay
        if switch and replay is not None and replay.verified:
            outs = replay.run(args)
            if outs is not None:
                args.clear()
                _count("replays")
                return self.out_type(outs)
            _count("replays_refused")
        # until a template is verified, the call's inputs are described before it runs
        watch = switch and not self.replay_off and (replay is None or not replay.verified)
        probe = _C._Replay.inputs(args) if watch else None
        cuts = _C._cut_count() if watch else 0
        # the graph's ops are recorded at a line of the user's compiled
        # function (one frame walk a call, not one an op)
        _C._hold_site(True)
        try:
            if switch:
                _C._set_exec_mode(_DEFER)
            # the graph's code takes the list and empties it, so each input can die
            # at its last use inside the graph (and its memory be reused there)
            result = self.gm(args)
            if watch:
                if _C._cut_count() != cuts:  # only the call's tail is pending
                    self._retry("the call's recording was cut inside it")
                else:
                    self._watch(probe, result)
            return result
        finally:
            _C._hold_site(False)
            if switch:
                _C._set_exec_mode(mode)  # cuts the graph: its plan runs now (asynchronously)

    def _watch(self, probe: Any, result: Any) -> None:
        """Before the cut of a recorded call: the recording becomes the
        template, or is checked against it (see "Replay" above)."""
        if not isinstance(result, (tuple, list)):
            return self._no_replay("its result is not a tuple of tensors")
        outs = list(result)
        if self.replay is not None:
            ok, why = self.replay.matches(probe, outs)
            if ok:
                return None
            self.replay = None
            if not self._retry(f"its recordings differ between calls: {why}"):
                return None
        template, why = probe.capture(outs)
        if template is None:
            self._retry(why)
            return None
        self.replay = template
        self.out_type = type(result)
        _count("replay_templates")
        return None

    def _retry(self, why: str) -> bool:
        """A call that could not capture or verify: False once the graph has
        had its tries (it then records for good, and ``why`` is counted)."""
        self.replay_tries += 1
        if self.replay_tries < _REPLAY_TRIES:
            return True
        self._no_replay(why)
        return False

    def _no_replay(self, why: str) -> None:
        self.replay_off = True
        self.replay = None
        with _lock:
            _replay_off[why] = _replay_off.get(why, 0) + 1


# calls a graph may fail to capture or verify on before it records for good
_REPLAY_TRIES = 3


_NAMESPACES = ("_VariableFunctions", "_nn", "_linalg", "_special", "_fft")


def _fast_call(op: Any, node: torch.fx.Node) -> tuple[str, Any] | None:
    """("call_function", fn) or ("call_method", name): the eager Python
    binding of ATen operator op for this node's arguments, or None. Calling
    ``torch.ops.aten.X.overload`` goes through TorchScript's boxed path
    (schema stacks, argument boxing: ~4x the host time of ``torch.X`` for a
    small op, and half a compiled decode step's host time); the eager binding
    reaches the same dispatcher entry. Taken only where the binding cannot
    choose another overload: the operator has one overload without ``out``,
    or the node passes tensors exactly where the schema takes tensors."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    schema = op._schema
    name = schema.name.split("::", 1)[1]
    if schema.is_mutable and not name.endswith("_"):
        return None  # only in-place methods may write their arguments
    if any(a.kwarg_only and a.name == "out" for a in schema.arguments):
        return None
    if any(str(a.type) == "List[Optional[Tensor]]" for a in schema.arguments):
        return None  # index / index_put: the bindings take no None among the indices
    packet = op.overloadpacket
    plain = [o for o in packet.overloads() if "out" not in o.split("_")]
    if len(plain) > 1:
        args = list(node.args) + [node.kwargs.get(a.name) for a in schema.arguments[len(node.args):]]
        for a, v in zip(schema.arguments, args):
            is_tensor = isinstance(a.type, torch._C.TensorType)
            if is_tensor != isinstance(v, torch.fx.Node) and not (v is None and not is_tensor):
                return None
    for ns in _NAMESPACES:
        fn = getattr(getattr(torch._C, ns), name, None)
        if fn is not None:
            return "call_function", fn
    if schema.arguments and schema.arguments[0].name == "self" and hasattr(torch._C.TensorBase, name):
        return "call_method", name
    return None


def _fast_calls(gm: torch.fx.GraphModule) -> int:
    """Points the graph's ATen calls at their eager Python bindings where
    that is exact (_fast_call); returns how many. TORCH_TPU_COMPILE_FAST_CALLS=0
    keeps ``torch.ops`` calls (for A/B runs)."""
    if os.environ.get("TORCH_TPU_COMPILE_FAST_CALLS", "1") == "0":
        return 0
    n = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        how = _fast_call(node.target, node)
        if how is None:
            continue
        node.op, node.target = how
        n += 1
    return n


def _lowerer(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
    def lower(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        t0 = time.perf_counter()
        reinplaced = _reinplace(gm)
        elided = _elide_clones(gm)  # after _reinplace: the in-place updates it makes are part of its test
        fn = _Compiled(gm, kind)  # checks the ATen operators have kernels
        nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        fast = _fast_calls(gm) if not fn.missing else 0
        gm.graph.set_codegen(_BoxedCodeGen())
        gm.recompile()
        with _lock:
            _stats[f"{kind}_graphs"] += 1
            _stats["nodes_lowered"] += nodes
            _stats["lowering_seconds"] += time.perf_counter() - t0
            _stats["inputs_updated_in_place"] += reinplaced
            _stats["clones_elided"] += elided
            _stats["fast_calls"] += fast
        return fn

    return lower


@functools.lru_cache(maxsize=1)
def _aot_backend() -> Callable[..., Any]:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd(fw_compiler=_lowerer("forward"), bw_compiler=_lowerer("backward"),
                        inference_compiler=_lowerer("inference"),
                        partition_fn=min_cut_rematerialization_partition, keep_inference_input_mutations=True)


def _kv_repeat_source(node: Any) -> tuple[Any, int] | None:
    """(x, rep) when node is ``x[:, :, None].expand(b, kv, rep, t, d).reshape(b,
    kv * rep, t, d)`` of a 4-D x (GQA's key/value heads repeated for the query
    heads, head h reading x's head h // rep: the models' ``repeat_kv``)."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_method" and node.target == "reshape"):
        return None
    exp = node.args[0]
    if not (isinstance(exp, torch.fx.Node) and exp.op == "call_method" and exp.target == "expand"):
        return None
    item = exp.args[0]
    if not (isinstance(item, torch.fx.Node) and item.op == "call_function" and len(item.args) == 2):
        return None
    idx = item.args[1]
    full = slice(None)
    if item.target is not operator.getitem or not isinstance(idx, tuple) or len(idx) < 3 or idx[:3] != (
            full, full, None) or any(i != full for i in idx[3:]):
        return None
    x = item.args[0]
    vals = [n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None for n in (x, exp, node)]
    if any(not isinstance(v, torch.Tensor) for v in vals):
        return None
    xs, es, rs = (tuple(v.shape) for v in vals)
    if len(xs) != 4 or len(es) != 5 or len(rs) != 4 or not all(isinstance(s, int) for s in xs + es + rs):
        return None  # symbolic sizes (dynamic=True) are left alone: comparing them would add guards
    b, kv, t, d = xs
    rep = es[2]
    if es != (b, kv, rep, t, d) or rs != (b, kv * rep, t, d):
        return None
    return x, rep


def _native_gqa(gm: torch.fx.GraphModule) -> int:
    """scaled_dot_product_attention over keys and values whose heads a model
    repeated for the query heads (``repeat_kv``) reads the unrepeated ones
    with ``enable_gqa=True``: the same values (head h reads key/value head
    h // rep either way), without the two repeated copies in the forward pass
    and the sums over the repeats in the backward pass — the attention kernel
    reads the shared heads itself. Returns the number of calls rewritten."""
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch._C._nn.scaled_dot_product_attention:
            continue
        if len(node.args) < 3 or node.kwargs.get("enable_gqa", False):
            continue
        k, v = _kv_repeat_source(node.args[1]), _kv_repeat_source(node.args[2])
        if k is None or v is None or k[1] != v[1] or k[1] < 2:
            continue
        reps = (node.args[1], node.args[2])
        node.args = (node.args[0], k[0], v[0], *node.args[3:])
        node.kwargs = {**node.kwargs, "enable_gqa": True}
        n += 1
        for r in dict.fromkeys(reps):  # the repeats' own nodes, now unused (not all dead code: in-place updates)
            for c in (r, r.args[0], r.args[0].args[0]):
                if not c.users:
                    gm.graph.erase_node(c)
    if n:
        gm.recompile()
    return n


def tpu_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The Dynamo backend registered as ``"tpu"``. ``mode`` takes
    torch.compile's names (all run the same way: there are no autotuning
    choices or CUDA graphs on this device); ``options`` must be empty."""
    if mode not in _MODES:
        raise ValueError(f"torch.compile(backend='tpu'): unknown mode {mode!r}; expected one of "
                         f"{', '.join(repr(m) for m in _MODES[1:])}")
    if options:
        raise ValueError(f"torch.compile(backend='tpu') takes no options (got {sorted(options)})")
    t0 = time.perf_counter()
    _count("native_gqa", _native_gqa(gm))
    fn = _aot_backend()(gm, example_inputs)  # may restart Dynamo's analysis (an exception): not counted
    _count("backend_seconds", time.perf_counter() - t0)
    _count("dynamo_graphs")
    return fn


# ------------------------------------------------ plain torch.compile


def _on_tpu(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in example_inputs)


def _route_inductor(compile_fx: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps Inductor's entry point: graphs on tpu tensors come here."""
    if getattr(compile_fx, "_torch_tpu_routed", False):
        return compile_fx

    @functools.wraps(compile_fx)
    def routed(model_: Any, example_inputs_: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        if _on_tpu(example_inputs_):  # Inductor's options (config_patches, ...) do not apply here
            _count("routed_from_inductor")
            return tpu_backend(model_, example_inputs_)
        return compile_fx(model_, example_inputs_, *args, **kwargs)

    routed._torch_tpu_routed = True  # type: ignore[attr-defined]
    return routed


# ------------------------------------------------- Dynamo's device interface


def _device_interface() -> type:
    from torch._dynamo.device_interface import DeviceInterface

    tpu = torch.tpu

    class TpuInterface(DeviceInterface):
        """Dynamo's view of the tpu device: chips, streams, events."""

        device = tpu.device
        Event = tpu.Event
        Stream = tpu.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                tpu.set_device(device)

            @staticmethod
            def current_device() -> int:
                return tpu.current_device()

            @staticmethod
            def get_device_properties(device: torch.types.Device = None) -> Any:
                return tpu.get_device_properties(device)

        current_device = staticmethod(tpu.current_device)
        set_device = staticmethod(tpu.set_device)
        device_count = staticmethod(tpu.device_count)
        is_available = staticmethod(tpu.is_available)
        stream = staticmethod(tpu.stream)
        current_stream = staticmethod(tpu.current_stream)
        set_stream = staticmethod(tpu.set_stream)
        synchronize = staticmethod(tpu.synchronize)
        memory_allocated = staticmethod(tpu.memory_allocated)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return TpuInterface.exchange_device(device)

        @staticmethod
        def exchange_device(device: int) -> int:
            previous = tpu.current_device()
            if device >= 0 and device != previous:
                tpu.set_device(device)
            return previous

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            tpu.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return tpu.current_stream(device_idx).stream_id

        @classmethod
        def get_device_properties(cls, device: torch.types.Device = None) -> Any:
            return tpu.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device: torch.types.Device = None) -> Any:
            return tpu.get_device_properties(device).host_isa

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def is_triton_capable(device: torch.types.Device = None) -> bool:
            return False

    return TpuInterface


def _install_fake_grouped_mm() -> None:
    """The fake (shape-only) ``aten::_grouped_mm`` of a tpu operand in float32
    or float16. PyTorch's meta function keeps CUDA's kernel's rule (bfloat16
    only), but on tpu the op runs ATen's grouped kernel, a product per group,
    in every floating dtype, and Transformers' grouped-experts MoE path calls
    it in float32 on tpu, in eager and under torch.compile: without this
    Dynamo refuses the graph. Other devices, and bfloat16, keep PyTorch's
    meta function."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses import fake_impls

    op = torch.ops.aten._grouped_mm.default

    @fake_impls.register_op_impl(lambda func: func is op)
    def grouped_mm(fake_mode: Any, func: Any, mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Any = None,
                   bias: Any = None, out_dtype: Any = None) -> Any:
        if mat_a.device.type != "tpu" or (mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16):
            return NotImplemented
        torch._check(mat_a.dtype == mat_b.dtype and mat_a.is_floating_point(),
                     lambda: f"_grouped_mm: expected floating operands of one dtype, got {mat_a.dtype} and {mat_b.dtype}")
        torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                     lambda: f"_grouped_mm: multiplicands must be 2D or 3D, got {mat_a.dim()}D and {mat_b.dim()}D")
        # the eager kernel's rules and messages
        torch._check((offs is None) == (mat_a.dim() == 3 and mat_b.dim() == 3),
                     lambda: "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
        torch._check(bias is None, lambda: "Bias not supported yet")
        with fake_mode:
            return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


def _install_capturable_optimizers() -> None:
    """A compiled optimizer step over tpu parameters keeps its state on the
    device, as Dynamo does for CUDA and XPU parameters: Dynamo traces the
    step as capturable (its step counts and bias corrections as device
    tensors) but sets the optimizer's own ``capturable`` only for those two
    devices, so the first compiled step created CPU step counts on tpu
    parameters and every call handed the graph host values that change
    (per-tensor divisions by a CPU scalar, and a graph that could not be
    replayed). Groups whose parameters are all on tpu and whose state is
    not yet created get ``capturable=True`` too."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if getattr(original, "_tpu", False):
        return

    def _set_capturable(self: Any, tx: Any) -> None:
        for group in self.value.param_groups:
            params = group.get("params", [])
            if ("capturable" in group and params and all(p.device.type == "tpu" for p in params)
                    and all(p not in self.value.state for p in params)):
                group["capturable"] = True
        original(self, tx)

    _set_capturable._tpu = True  # type: ignore[attr-defined]
    OptimizerVariable._set_capturable = _set_capturable


def _install_dynamo() -> None:
    """Called once torch._dynamo is imported: registers the backend name and
    the device interface (after Dynamo's own registrations, which would
    otherwise replace it), the fake _grouped_mm of tpu operands and
    capturable compiled optimizers on tpu."""
    from torch._dynamo import device_interface as di
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "tpu" not in _COMPILER_FNS:
        register_backend(tpu_backend, name="tpu")
    di.get_registered_device_interfaces()  # Dynamo's defaults first
    iface = _device_interface()
    di.register_interface_for_device("tpu", iface)
    for i in range(torch.tpu.device_count()):
        di.register_interface_for_device(f"tpu:{i}", iface)
    _install_fake_grouped_mm()
    _install_capturable_optimizers()


def _install_inductor(module: Any) -> None:
    module.compile_fx = _route_inductor(module.compile_fx)

