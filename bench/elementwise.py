"""Large elementwise ops on tpu vs CPU and vs the machine's STREAM triad.

The triad (a = b + s*c over float32 host arrays, every core through the
runtime's thread pool) comes from ``runtime/bench/bench_stream.c``, built on
demand in the runtime's CMake tree. Effective bandwidth of an op counts the
bytes it must move at least once: two inputs and one output for add/mul, one
input and one output for gelu.
"""
from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import ROOT, interleaved, markdown_table

RUNTIME_BUILD = ROOT / "build" / "runtime"


def stream_triad(n: int, repeats: int) -> float:
    """Median GB/s of the triad over `repeats` runs of n float32 elements."""
    if not (RUNTIME_BUILD / "CMakeCache.txt").exists():
        raise RuntimeError(f"{RUNTIME_BUILD} is not configured: run `make build` first")
    subprocess.run(["cmake", "--build", str(RUNTIME_BUILD), "--target", "tpurt_bench_stream"], check=True,
                   stdout=subprocess.DEVNULL)
    exe = Path(RUNTIME_BUILD / "tpurt_bench_stream")
    out = subprocess.run([str(exe), str(n), str(repeats)], check=True, capture_output=True, text=True).stdout
    vals = [float(line.split()[1]) for line in out.splitlines() if line.startswith("triad_gbps")]
    return statistics.median(vals)


def elementwise(repeats: int, n: int = 1 << 24) -> tuple[dict, str]:
    triad = stream_triad(n, max(5, repeats))
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(n), torch.randn(n)
    a_tpu, b_tpu = a_cpu.to("tpu"), b_cpu.to("tpu")
    o_cpu, o_tpu = torch.empty(n), torch.empty(n, device="tpu")

    def tpu(fn):
        def run() -> None:
            fn()
            torch.tpu.synchronize()
        return run

    ops = {
        "add": (3, lambda: torch.add(a_cpu, b_cpu, out=o_cpu), lambda: torch.add(a_tpu, b_tpu, out=o_tpu)),
        "mul": (3, lambda: torch.mul(a_cpu, b_cpu, out=o_cpu), lambda: torch.mul(a_tpu, b_tpu, out=o_tpu)),
        "gelu": (2, lambda: F.gelu(a_cpu), lambda: F.gelu(a_tpu)),
        "gelu tanh": (2, lambda: F.gelu(a_cpu, approximate="tanh"), lambda: F.gelu(a_tpu, approximate="tanh")),
    }
    configs = {}
    for name, (_, c, t) in ops.items():
        configs[f"cpu {name}"] = c
        configs[f"tpu {name}"] = tpu(t)
    times = interleaved(configs, repeats=repeats)
    results: dict = {"elements": n, "triad_gbps": triad, "ops": {}}
    rows = []
    for name, (arrays, _, _) in ops.items():
        tc, tt = times[f"cpu {name}"], times[f"tpu {name}"]
        gbps = arrays * 4 * n / tt / 1e9
        results["ops"][name] = {"cpu_s": tc, "tpu_s": tt, "tpu_gbps": gbps}
        rows.append([name, f"{tc * 1e3:.2f}", f"{tt * 1e3:.2f}", f"{tc / tt:.2f}×", f"{gbps:.1f}",
                     f"{gbps / triad:.2f}×"])
    table = markdown_table(["op (16M float32)" if n == 1 << 24 else f"op ({n} float32)", "CPU ms", "tpu ms",
                            "tpu speed / CPU (goal ≥ 0.8×)", "tpu GB/s", "/ STREAM triad (goal ≥ 0.7×)"], rows)
    return results, f"STREAM triad (this machine, all cores): {triad:.1f} GB/s\n\n" + table


def step_kernels(repeats: int, inner: int = 20) -> tuple[dict, str]:
    """Kernels at the sizes a small training step runs them (the minGPT /
    ResNet bench steps: 1024 tokens x 512 hidden, 16 x 4 heads x 64 x 64
    attention scores, 1024 x 128 normalized rows, 16 x 32 x 32 x 32 feature
    maps): tpu launches `inner` back to back and synchronizes once per
    sample, like the GEMM bench; CPU eager on the same cores."""
    torch.manual_seed(0)
    h, s, r = torch.randn(1024, 512), torch.randn(16, 4, 64, 64), torch.randn(1024, 128)
    fm = torch.randn(16, 32, 32, 32)
    w, b, c = torch.randn(128), torch.randn(128), torch.randn(32)
    g = torch.randn(1024, 512)

    def both(fn, *args):
        dev = [a.to("tpu") for a in args]
        return (lambda: fn(*args)), (lambda: fn(*dev))

    def ln_grad(x, w, b):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        y = F.layer_norm(x, (128,), w, b)
        return lambda: torch.autograd.grad(y, (x, w, b), y, retain_graph=True)

    ops = {
        "softmax (16×4×64×64, last dim)": both(lambda a: F.softmax(a, -1), s),
        "layer_norm (1024×128)": both(lambda a, w, b: F.layer_norm(a, (128,), w, b), r, w, b),
        "layer_norm backward (1024×128)": (ln_grad(r, w, b), ln_grad(r.to("tpu"), w.to("tpu"), b.to("tpu"))),
        "batch_norm train (16×32×32×32)": both(lambda a, c: F.batch_norm(a, None, None, c, c, training=True), fm, c),
        "gelu (1024×512)": both(F.gelu, h),
        "gelu backward (1024×512)": both(lambda a, g: torch.ops.aten.gelu_backward(g, a), h, g),
        "tanh (1024×512)": both(torch.tanh, h),
        "erf (1024×512)": both(torch.erf, h),
        "log (1024×512)": both(lambda a: torch.log(a.abs() + 0.1), h),
        "sqrt (1024×512)": both(lambda a: torch.sqrt(a.abs()), h),
        "sum over rows (1024×512 → 512)": both(lambda a: a.sum(0), h),
    }
    return cpu_vs_tpu(ops, repeats, inner, "kernel")


def cpu_vs_tpu(ops: dict, repeats: int, inner: int, title: str) -> tuple[dict, str]:
    """ops: name -> (CPU callable, tpu callable), interleaved; a tpu sample
    is `inner` calls and one synchronize."""
    configs, finish = {}, {}
    for name, (c_fn, t_fn) in ops.items():
        configs[f"cpu {name}"] = c_fn
        configs[f"tpu {name}"] = t_fn
        finish[f"tpu {name}"] = torch.tpu.synchronize
    times = interleaved(configs, repeats=repeats, inner=inner, finish=finish)
    results, rows = {}, []
    for name in ops:
        tc, tt = times[f"cpu {name}"], times[f"tpu {name}"]
        results[name] = {"cpu_s": tc, "tpu_s": tt}
        rows.append([name, f"{tc * 1e6:.0f}", f"{tt * 1e6:.0f}", f"{tc / tt:.2f}×"])
    return results, markdown_table([title, "CPU µs", "tpu µs", "tpu speed / CPU"], rows)


def random_sampling(repeats: int, sizes: tuple[int, ...] = (1 << 18, 1 << 22)) -> tuple[dict, str]:
    """Random sampling on tpu vs CPU at a small step's size (256K) and a
    large one (4M): torch.rand / randn (f32, bf16), in-place uniform_ /
    normal_ / bernoulli_ (f32 and bool), randint, dropout, multinomial (an
    LLM's one draw from 32,000 categories, 1,000 draws with replacement,
    2,000 of 50,000 without), and a ``nn.Linear(2048, 2048)`` built on the
    device (its init draws uniform_). A sample is 5 calls back to back, then
    one synchronize."""
    ops: dict = {}
    for n in sizes:
        k = f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M"
        bufs = {d: (torch.empty(n, device=d), torch.empty(n, dtype=torch.bool, device=d)) for d in ("cpu", "tpu")}

        def mk(fn, n=n, bufs=bufs):
            return tuple((lambda dev=dev: fn(dev, n, *bufs[dev])) for dev in ("cpu", "tpu"))

        ops[f"rand {k}"] = mk(lambda d, n, x, b: torch.rand(n, device=d))
        ops[f"randn {k}"] = mk(lambda d, n, x, b: torch.randn(n, device=d))
        ops[f"randn bf16 {k}"] = mk(lambda d, n, x, b: torch.randn(n, device=d, dtype=torch.bfloat16))
        ops[f"uniform_ {k}"] = mk(lambda d, n, x, b: x.uniform_(-1, 1))
        ops[f"normal_ {k}"] = mk(lambda d, n, x, b: x.normal_(0, 0.02))
        ops[f"bernoulli_(0.3) {k}"] = mk(lambda d, n, x, b: x.bernoulli_(0.3))
        ops[f"bernoulli_ bool {k}"] = mk(lambda d, n, x, b: b.bernoulli_(0.5))
        ops[f"randint {k}"] = mk(lambda d, n, x, b: torch.randint(0, 50000, (n,), device=d))
        ops[f"dropout(0.1) {k}"] = mk(lambda d, n, x, b: F.dropout(x, 0.1))
    for rows, cats, draws, repl in ((1, 32000, 1, False), (1, 32000, 1000, True), (1, 50000, 2000, False)):
        probs = torch.rand(rows, cats, generator=torch.Generator().manual_seed(0)).softmax(-1)
        pair = {"cpu": probs, "tpu": probs.to("tpu")}
        ops[f"multinomial {rows}×{cats}, {draws} draw{'s' * (draws > 1)}{', replacement' * repl}"] = tuple(
            (lambda d=d, draws=draws, repl=repl, pair=pair: torch.multinomial(pair[d], draws, replacement=repl))
            for d in ("cpu", "tpu"))
    ops["nn.Linear(2048, 2048) on the device"] = tuple((lambda d=d: torch.nn.Linear(2048, 2048, device=d))
                                                       for d in ("cpu", "tpu"))
    return cpu_vs_tpu(ops, repeats, 5, "sampling (float32 unless named)")


def order_statistics(repeats: int) -> tuple[dict, str]:
    """Sorting and selection vs CPU: a 1M-float line, 1024 rows of 1024 and
    one row of 32,000 logits (a language model's top-p sampling) sorted,
    the unique values of 1M ints, topk of 100 from the line and of 10 from
    each row, the line's 1000th value and median."""
    g = torch.Generator().manual_seed(0)
    line, rows = torch.randn(1 << 20, generator=g), torch.randn(1024, 1024, generator=g)
    logits, ints = torch.randn(1, 32000, generator=g), torch.randint(0, 50000, (1 << 20,), generator=g)
    dev = {d: tuple(t.to(d) for t in (line, rows, logits, ints)) for d in ("cpu", "tpu")}
    fns = {
        "sort 1M": lambda x, r, lg, i: torch.sort(x),
        "sort 1024 rows of 1024": lambda x, r, lg, i: torch.sort(r, dim=1),
        "sort 1 × 32,000 descending": lambda x, r, lg, i: torch.sort(lg, descending=True),
        "unique of 1M ints (sorted, counts)": lambda x, r, lg, i: torch.unique(i, return_counts=True),
        "topk 100 of 1M": lambda x, r, lg, i: torch.topk(x, 100),
        "topk 10 of each 1024-row": lambda x, r, lg, i: torch.topk(r, 10, dim=1),
        "kthvalue 1000 of 1M": lambda x, r, lg, i: torch.kthvalue(x, 1000),
        "median of 1M": lambda x, r, lg, i: torch.median(x),
    }
    ops = {name: tuple((lambda f=f, d=d: f(*dev[d])) for d in ("cpu", "tpu")) for name, f in fns.items()}
    return cpu_vs_tpu(ops, repeats, 1, "op (float32)")


def math_functions(repeats: int, n: int = 1 << 20) -> tuple[dict, str]:
    """Elementary functions, clamp, fmod-family and pointwise losses on 1M
    float32 elements vs CPU (PyTorch's vectorized kernels): the trig, inverse
    trig, hyperbolic, exp2 / expm1, log2 / log10, pow, atan2, hypot, fmod,
    remainder, floor division, clamp, elu, mse_loss and huber_loss. A sample
    is 3 calls, then one synchronize."""
    g = torch.Generator().manual_seed(0)
    x, y, z = torch.randn(n, generator=g), torch.randn(n, generator=g) + 0.1, torch.rand(n, generator=g)
    dev = {d: (x.to(d), y.to(d), z.to(d)) for d in ("cpu", "tpu")}
    fns = {
        "sin": lambda a, b, c: a.sin(), "cos": lambda a, b, c: a.cos(), "tan": lambda a, b, c: a.tan(),
        "atan": lambda a, b, c: a.atan(), "asin": lambda a, b, c: c.asin(), "sinh": lambda a, b, c: a.sinh(),
        "exp2": lambda a, b, c: a.exp2(), "expm1": lambda a, b, c: a.expm1(), "log2": lambda a, b, c: c.log2(),
        "log10": lambda a, b, c: c.log10(), "pow(x, y)": lambda a, b, c: torch.pow(c, b),
        "pow(x, 2.5)": lambda a, b, c: c.pow(2.5), "atan2": lambda a, b, c: torch.atan2(a, b),
        "hypot": lambda a, b, c: torch.hypot(a, b), "fmod": lambda a, b, c: torch.fmod(a, b),
        "remainder": lambda a, b, c: torch.remainder(a, b),
        "floor divide": lambda a, b, c: torch.div(a, b, rounding_mode="floor"),
        "clamp(-0.5, 0.5)": lambda a, b, c: a.clamp(-0.5, 0.5), "elu": lambda a, b, c: F.elu(a),
        "mse_loss": lambda a, b, c: F.mse_loss(a, b), "huber_loss": lambda a, b, c: F.huber_loss(a, b),
    }
    ops = {name: tuple((lambda f=f, d=d: f(*dev[d])) for d in ("cpu", "tpu")) for name, f in fns.items()}
    return cpu_vs_tpu(ops, repeats, 3, "op (1M float32)")


def indexing_and_scans(repeats: int) -> tuple[dict, str]:
    """Indexing, search, histogram and scan kernels vs CPU: bincount and
    histc of 1M values, unique_consecutive of 1M ints, searchsorted /
    bucketize / isin of 1M values, index_select of 512K single elements,
    grid_sample of an 8 x 32 x 64 x 64 batch, tril / triu and a column
    cumsum of 1024 x 1024. A sample is 3 calls, then one synchronize."""
    g = torch.Generator().manual_seed(0)
    v, A = torch.randn(1 << 20, generator=g), torch.randn(1024, 1024, generator=g)
    ints = torch.randint(0, 1000, (1 << 20,), generator=g)
    runs = torch.randint(0, 4, (1 << 20,), generator=g).cumsum(0) // 3
    idx = torch.randint(0, 1 << 20, (1 << 19,), generator=g)
    img, grid = torch.randn(8, 32, 64, 64, generator=g), torch.rand(8, 64, 64, 2, generator=g) * 2 - 1
    bounds = torch.sort(v[:4096]).values
    dev = {d: {k: t.to(d) for k, t in dict(v=v, A=A, ints=ints, runs=runs, idx=idx, img=img, grid=grid,
                                             bounds=bounds).items()} for d in ("cpu", "tpu")}
    fns = {
        "bincount of 1M ints (1000 bins)": lambda t: torch.bincount(t["ints"]),
        "histc of 1M floats (100 bins)": lambda t: torch.histc(t["v"], 100, -3, 3),
        "unique_consecutive of 1M ints": lambda t: torch.unique_consecutive(t["runs"]),
        "searchsorted 1M into 4096": lambda t: torch.searchsorted(t["bounds"], t["v"]),
        "bucketize 1M by 4096": lambda t: torch.bucketize(t["v"], t["bounds"]),
        "isin 1M of 1000 values": lambda t: torch.isin(t["ints"], t["ints"][:1000]),
        "index_select 512K of a 1M vector": lambda t: t["v"].index_select(0, t["idx"]),
        "grid_sample 8 x 32 x 64 x 64": lambda t: F.grid_sample(t["img"], t["grid"], align_corners=False),
        "tril 1024 x 1024": lambda t: torch.tril(t["A"]),
        "triu 1024 x 1024": lambda t: torch.triu(t["A"], 1),
        "cumsum of 1024 x 1024 along dim 0": lambda t: t["A"].cumsum(0),
    }
    ops = {name: tuple((lambda f=f, d=d: f(dev[d])) for d in ("cpu", "tpu")) for name, f in fns.items()}
    return cpu_vs_tpu(ops, repeats, 3, "op (float32 unless named)")
