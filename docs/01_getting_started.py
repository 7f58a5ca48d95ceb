import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="Getting started")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    mo.md(
        r"""
        # Getting started: the device, tensors, memory, streams

        `torch_tpu` registers a device named `"tpu"` with PyTorch. Today it is an *emulated* TPU: it runs on
        this machine's CPU cores but behaves like an accelerator — its own address space, a fixed HBM
        capacity, asynchronous streams and a caching allocator. Everything on this page runs live when the
        page is built; the figures are this machine's.
        """
    )
    return (mo,)


@app.cell
def _(mo):
    import torch
    import torch_tpu  # also loaded by `import torch` itself (autoload); importing it is harmless

    props = torch.tpu.get_device_properties(0)
    mo.md(
        f"""
        ## The device

        | | |
        |---|---|
        | `torch_tpu.__version__` | `{torch_tpu.__version__}` |
        | `torch.tpu.is_available()` | `{torch.tpu.is_available()}` |
        | `torch.tpu.device_count()` | `{torch.tpu.device_count()}` (set `TPU_NUM_DEVICES` for more chips) |
        | `torch.tpu.get_device_name()` | `{torch.tpu.get_device_name()}` |
        | capacity (`total_memory`) | {props.total_memory / 2**30:.1f} GiB |
        | host CPU (`host_cpu`) | {props.host_cpu} |
        | kernel level (`host_isa`) | `{props.host_isa}` |
        | bf16 products run on (`bf16_matmul`) | {props.bf16_matmul} |
        """
    )
    return props, torch, torch_tpu


@app.cell
def _(mo, torch):
    x = torch.arange(12, dtype=torch.float32, device="tpu").reshape(3, 4)
    w = torch.randn(4, 2).to("tpu")  # a host tensor copied to the device
    y = torch.relu(x @ w - 1.0)
    _text = mo.md(
        f"""
        ## Tensors

        Tensors are created on the device with `device="tpu"` or copied there with `.to("tpu")` / `.tpu()`;
        modules move with `module.to("tpu")`. Operators run as the runtime's C kernels.

        ```python
        x = torch.arange(12, dtype=torch.float32, device="tpu").reshape(3, 4)
        w = torch.randn(4, 2).to("tpu")
        y = torch.relu(x @ w - 1.0)
        ```

        `y.device` is `{y.device}`, `y.is_tpu` is `{y.is_tpu}`; `y.cpu()` copies it back to the host:
        """
    )
    mo.vstack([_text, mo.plain_text(str(y.cpu()))])
    return w, x, y


@app.cell
def _(mo, torch, x):
    _ref = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    _same = torch.equal((x * 2 + 1).cpu(), _ref * 2 + 1)
    mo.md(
        f"""
        Results agree with PyTorch's CPU backend: `torch.equal((x * 2 + 1).cpu(), ref * 2 + 1)` is `{_same}`.
        An operator without a device kernel is never run on the CPU behind your back: it raises
        `NotImplementedError` (the CPU fallback is opt-in and counted, see the README).
        """
    )
    return


@app.cell
def _(mo, torch):
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    torch.tpu.reset_peak_memory_stats()
    _trace = [("start", torch.tpu.memory_allocated(), torch.tpu.memory_reserved())]
    _kept = []
    for _i in range(4):
        _kept.append(torch.empty(2**20, device="tpu"))  # 4 MiB each
        _trace.append((f"+4 MiB ({_i + 1})", torch.tpu.memory_allocated(), torch.tpu.memory_reserved()))
    del _kept[:2]
    _trace.append(("del 2", torch.tpu.memory_allocated(), torch.tpu.memory_reserved()))
    del _kept
    _trace.append(("del all", torch.tpu.memory_allocated(), torch.tpu.memory_reserved()))
    torch.tpu.empty_cache()
    _trace.append(("empty_cache", torch.tpu.memory_allocated(), torch.tpu.memory_reserved()))
    memory_trace = _trace
    peak_mib = torch.tpu.max_memory_allocated() / 2**20
    mo.md(
        f"""
        ## Memory

        The device has its own caching allocator with PyTorch's statistics: `memory_allocated()` (bytes in
        live tensors), `memory_reserved()` (bytes the allocator holds, including freed blocks it keeps for
        reuse), `max_memory_allocated()` (the peak since `reset_peak_memory_stats()`), `memory_stats()`,
        `mem_get_info()` and `empty_cache()` (returns cached blocks). Below: four 4 MiB tensors are created,
        then freed; the peak was {peak_mib:.1f} MiB.
        """
    )
    return memory_trace, peak_mib


@app.cell
def _(memory_trace):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _fig, _ax = plt.subplots(figsize=(7, 3))
    _labels = [t[0] for t in memory_trace]
    _ax.plot(_labels, [t[1] / 2**20 for t in memory_trace], "o-", label="memory_allocated()")
    _ax.plot(_labels, [t[2] / 2**20 for t in memory_trace], "s--", label="memory_reserved()")
    _ax.set_ylabel("MiB")
    _ax.set_title("Device memory as tensors come and go")
    _ax.legend()
    _ax.tick_params(axis="x", labelsize=8)
    _fig.tight_layout()
    _fig
    return matplotlib, plt


@app.cell
def _(mo, props, torch):
    try:
        torch.empty(int(props.total_memory) * 2, dtype=torch.uint8, device="tpu")
        oom = "no error"
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0]
    _after = torch.ones(3, device="tpu").sum().item()
    mo.md(
        f"""
        Asking for more than the chip holds raises PyTorch's own `torch.OutOfMemoryError`:

        ```
        {oom}
        ```

        and the device stays usable afterwards (`torch.ones(3, device="tpu").sum().item()` → `{_after}`).
        """
    )
    return (oom,)


@app.cell
def _(mo, torch):
    import time

    _a = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    _t0 = time.perf_counter()
    for _ in range(20):
        _a = _a @ _a
        _a = _a / _a.norm()
    _t_issue = time.perf_counter() - _t0
    torch.tpu.synchronize()
    _t_done = time.perf_counter() - _t0

    _s = torch.tpu.Stream()
    _start, _end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    with torch.tpu.stream(_s):
        _start.record()
        _b = torch.randn(256, 256, device="tpu")
        for _ in range(10):
            _b = torch.tanh(_b @ _b)
        _end.record()
    _end.synchronize()
    _on_side = torch.tpu.current_stream() == torch.tpu.default_stream()
    torch.tpu.current_stream().wait_stream(_s)
    _checksum = _b.sum().item()
    mo.md(
        f"""
        ## Streams and events

        Operators return before their kernels finish: the 20 matmuls + norms above were *issued* in
        {_t_issue * 1e3:.1f} ms and *done* after {_t_done * 1e3:.1f} ms (`torch.tpu.synchronize()` waits for
        them). Copies to the host, `.item()`, `synchronize()` and events wait too.

        Each chip has a default stream; `torch.tpu.Stream()` makes more and `with torch.tpu.stream(s):` sends
        work to one. Events time device work: ten 256×256 matmul + tanh on a side stream took
        {_start.elapsed_time(_end):.2f} ms by `start.elapsed_time(end)`. Back outside the `with` block the
        current stream is the default one again (`{_on_side}`); `current_stream().wait_stream(s)` orders
        the default stream after the side stream's work before its result is read
        (sum: {_checksum:.3f}).
        """
    )
    return (time,)


@app.cell
def _(mo, torch):
    _idx = torch.tensor([0, 7], device="tpu")
    _src = torch.arange(4.0, device="tpu")
    try:
        _bad = _src[_idx]  # index 7 is out of range: detected by the kernel
        torch.tpu.synchronize()
        async_error = "no error"
    except (RuntimeError, IndexError) as e:
        async_error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    _fine = _src.sum().item()
    mo.md(
        f"""
        ## Errors in asynchronous work

        An error inside a kernel that already left the Python call (here an out-of-range index) is raised
        at the next synchronization with the operation's name, with PyTorch's exception class:

        ```
        {async_error}
        ```

        The device keeps working (`_src.sum().item()` → `{_fine}`). Run with `TPU_LAUNCH_BLOCKING=1` (the
        *debug* mode) to have the failing operator itself raise it; see *Execution modes*.
        """
    )
    return (async_error,)


if __name__ == "__main__":
    app.run()
