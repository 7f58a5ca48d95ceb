"""``torch.tpu``: the device module of the tpu backend, shaped like ``torch.cuda``.

Devices, streams, events, RNG and memory statistics of the (emulated) TPU
chips of this process. Chips: ``TPU_NUM_DEVICES`` (default 1); generation:
``TORCH_TPU_EMULATE`` = v5e | v6e | v7x (default v6e).
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import torch

from torch_tpu import _C
from torch_tpu.tpu.precision import Precision, precision  # noqa: E402  (matmul precision)

Device = torch.types.Device | int | None

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "synchronize", "Stream", "Event", "stream", "current_stream", "default_stream", "set_stream",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "default_generators", "get_device_name",
    "get_device_properties", "get_device_capability", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "memory_stats", "empty_cache", "mem_get_info", "fallback_stats", "reset_fallback_stats",
    "get_amp_supported_dtype", "is_bf16_supported", "TpuDeviceProperties", "Precision", "precision",
    "defer_stats", "reset_defer_stats",
]


def _index(device: Device = None, optional: bool = True) -> int:
    """Device index of ``device`` (None/-1 = current device)."""
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, int):
        return current_device() if device == -1 and optional else device
    raise TypeError(f"Expected a torch.device, str or int, got {type(device).__name__}")


# ------------------------------------------------------------------ devices


def is_available() -> bool:
    """True if at least one TPU chip is usable."""
    try:
        return _C._device_count() > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    return _C._is_initialized()


def init() -> None:
    """Initializes the runtime (done lazily by any use)."""
    _C._init()


def _lazy_init() -> None:
    _C._init()


def _is_in_bad_fork() -> bool:
    """True in a forked child of a process that had initialized the device:
    the runtime's worker threads do not survive fork(), so it refuses work."""
    return _C._in_bad_fork()


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._get_device()


def set_device(device: Device) -> None:
    """Makes ``device`` the current chip of this thread. Like ``torch.cuda``,
    -1 (or None) keeps the current device."""
    if device is None:
        return
    index = _index(device)
    _C._set_device(index)


class device:
    """Context manager that switches the current chip and restores it."""

    def __init__(self, device: Device) -> None:
        self.idx = _index(device) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = current_device()
        if self.idx != -1 and self.idx != self.prev_idx:
            _C._set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx != -1 and self.idx != self.prev_idx:
            _C._set_device(self.prev_idx)


def synchronize(device: Device = None) -> None:
    """Waits for all work on every stream of the chip; raises a pending
    asynchronous error (named after the operation that failed)."""
    _C._synchronize(_index(device))


@dataclasses.dataclass(frozen=True)
class TpuDeviceProperties:
    name: str
    generation: str
    total_memory: int
    hbm_bytes: int
    peak_bf16_flops: float
    peak_int8_ops: float
    hbm_bandwidth: float
    tensor_cores: int
    host_threads: int
    # Dynamo/Inductor read multi_processor_count from device properties.
    multi_processor_count: int = 1
    # The host the emulated chip runs on, detected at run time: CPU model,
    # the kernel level in force (TORCH_TPU_ISA caps it) and the kernel
    # behind bf16 matmuls ("amx-bf16 tiles", "avx512-bf16 dot products",
    # "f32 GEMM") and bf16 convolutions (tpurt_bf16_conv_path).
    host_cpu: str = ""
    host_isa: str = ""
    bf16_matmul: str = ""
    bf16_conv: str = ""

    def __repr__(self) -> str:
        return (f"_TpuDeviceProperties(name='{self.name}', generation='{self.generation}', "
                f"total_memory={self.total_memory // (1 << 20)}MB, tensor_cores={self.tensor_cores})")


def get_device_properties(device: Device = None) -> TpuDeviceProperties:
    p = _C._device_properties(_index(device))
    cpu = _C._cpu_info()
    return TpuDeviceProperties(multi_processor_count=p["tensor_cores"], host_cpu=cpu["model"], host_isa=cpu["isa"],
                               bf16_matmul=cpu["bf16_matmul"], bf16_conv=cpu["bf16_conv"], **p)


def get_device_name(device: Device = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Device = None) -> dict[str, Any]:
    p = get_device_properties(device)
    return {"generation": p.generation, "tensor_cores": p.tensor_cores}


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes ``torch.autocast("tpu", ...)`` accepts (bf16 is the TPU's)."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ----------------------------------------------------------- streams, events


class Stream(torch.Stream):
    """A queue of work on one chip, executed in order and asynchronously.
    ``Stream()`` takes one from the chip's pool; ``Stream(device, priority)``."""

    def __new__(cls, device: Device = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)


class _TpuEventMeta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_TpuEventMeta):
    """A marker in a stream: record, query, synchronize, wait, elapsed_time.

    Returns a ``torch.Event`` of the tpu device (PyTorch's generic event
    methods require that exact type), so ``isinstance(e, torch.tpu.Event)``
    and ``isinstance(e, torch.Event)`` both hold."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,  # type: ignore[misc]
                interprocess: bool = False) -> torch.Event:
        if interprocess:
            raise NotImplementedError("interprocess TPU events are not supported")
        return torch.Event(device=torch.device("tpu", current_device()), enable_timing=enable_timing,
                           blocking=blocking)


def current_stream(device: Device = None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("tpu", _index(device)))


# c10::DeviceType::PrivateUse1, the type code torch.Stream uses for tpu streams.
_DEVICE_TYPE_CODE = 20


def default_stream(device: Device = None) -> torch.Stream:
    """The chip's default stream (id 0), which work uses unless told otherwise."""
    return torch.Stream(stream_id=0, device_index=_index(device), device_type=_DEVICE_TYPE_CODE)


def set_stream(stream: torch.Stream) -> None:
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes ``stream`` current on its chip (and that
    chip current), restoring both afterwards. ``None`` is a no-op."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._prev_stream: torch.Stream | None = None
        self._prev_device = -1

    def __enter__(self) -> torch.Stream | None:
        if self.stream is None:
            return None
        self._prev_device = current_device()
        if self.stream.device_index != self._prev_device:
            _C._set_device(self.stream.device_index)
        self._prev_stream = current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        torch.accelerator.set_stream(self._prev_stream)
        if self._prev_device != self.stream.device_index:
            _C._set_device(self._prev_device)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


# ---------------------------------------------------------------------- RNG

_default_generators: tuple[torch.Generator, ...] = ()


def _generators() -> tuple[torch.Generator, ...]:
    global _default_generators
    if len(_default_generators) != device_count():
        _default_generators = tuple(_C._default_generator(i) for i in range(device_count()))
    return _default_generators


class _DefaultGenerators:
    """``torch.tpu.default_generators``: one counter-based generator per chip."""

    def __getitem__(self, i: int) -> torch.Generator:
        return _generators()[i]

    def __len__(self) -> int:
        return len(_generators())

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(_generators())


default_generators = _DefaultGenerators()


def manual_seed(seed: int) -> None:
    """Seeds the current chip's generator."""
    _generators()[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    _generators()[current_device()].seed()


def seed_all() -> None:
    s = _generators()[current_device()].seed()
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    return _generators()[current_device()].initial_seed()


def get_rng_state(device: Device = "tpu") -> torch.Tensor:
    return _generators()[_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: Device = "tpu") -> None:
    _generators()[_index(device)].set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for g, s in zip(_generators(), new_states):
        g.set_state(s)


# ------------------------------------------------------------------- memory


def memory_stats(device: Device = None) -> OrderedDict[str, Any]:
    """Caching-allocator statistics, with torch.cuda.memory_stats()'s keys."""
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: Device = None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device: Device = None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device: Device = None) -> int:
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device: Device = None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device: Device = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Device = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Returns every chip's unused cached memory (after synchronizing)."""
    torch.accelerator.empty_cache()


def mem_get_info(device: Device = None) -> tuple[int, int]:
    """(free, total) bytes of the chip: total capacity minus reserved."""
    return torch.accelerator.get_memory_info(_index(device))


def host_memory_stats() -> dict[str, dict[str, int]]:
    """Statistics of the pinned host allocator."""
    return _C._host_memory_stats()


# ----------------------------------------------------------------- fallback


def fallback_stats() -> dict[str, int]:
    """How many times each operator ran through the CPU fallback."""
    return dict(_C._fallback_counts())


def reset_fallback_stats() -> None:
    _C._reset_fallback_counts()


# ------------------------------------------------------------ DeferAndFuse


def defer_stats() -> dict[str, Any]:
    """Counters of the DeferAndFuse mode since the last reset: ``flushes``
    (cuts by reason: the program's — ``item``, ``to_host``, ``print``,
    ``save``, ``synchronize``, ``event``, ``stream``, ``explicit``, ``mode``,
    ``collective`` — and the engine's own: ``size_cap``, ``loop``,
    ``segment`` with ``TORCH_TPU_DEFER_SEGMENT_OPS``), ``graphs_built`` (plans made: cache misses),
    ``cache_hits``, ``cached_graphs``, ``ops_recorded``, ``kernels_launched``,
    ``fused_kernels`` (kernels made of several ops), ``ops_fused``,
    ``ops_eliminated``, ``stores_eliminated`` (values kept in registers),
    ``bytes_materialized`` / ``bytes_never_materialized`` (tensors created
    while deferring that did / never did take device memory),
    ``values_recomputed`` / ``bytes_recomputed`` (activations recomputed for
    their late readers instead of kept: see ``TORCH_TPU_DEFER_REMAT``),
    ``early_steps`` / ``early_graphs`` / ``early_discarded`` (a predicted
    graph's steps run while it was recorded; graphs whose cut resumed such a
    run; graphs that were not the prediction, their early work discarded:
    see ``TORCH_TPU_DEFER_EARLY``) and ``recent_flushes`` (latest first: reason, user source line, ops, kernels,
    cache hit)."""
    return dict(_C._defer_stats())


def reset_defer_stats() -> None:
    _C._reset_defer_stats()


# ------------------------------------------------------------ torch.compile


def compile_stats() -> dict[str, Any]:
    """What ``torch.compile(backend="tpu")`` did in this process: graphs
    lowered, compiled calls, graphs routed from plain ``torch.compile`` and
    Dynamo's recompiles with their reasons (see ``torch_tpu.compiler``)."""
    from torch_tpu import compiler

    return compiler.compile_stats()


def reset_compile_stats() -> None:
    from torch_tpu import compiler

    compiler.reset_compile_stats()


# ------------------------------------------------------------ kernel cache


def _get_cache_stats() -> dict[str, Any]:
    """Statistics of the persistent kernel cache (compiled kernels kept on
    disk in ``TORCH_TPU_CACHE_DIR``, default ``~/.cache/torch_tpu``) for this
    process since the last :func:`_clear_cache`, with TorchTPU's names:

    - ``num_cache_reqs``: lookups; ``num_cache_hits``: lookups that loaded a
      verified entry; ``num_cache_misses``: the others;
    - ``num_cache_refused``: misses because the directory or an entry failed
      the security checks (owner, permissions) or the cache was unusable;
      ``num_cache_corrupt``: corrupt entries found (removed unless the cache
      is read-only, then rebuilt);
    - ``num_cache_stores``, ``num_cache_stores_skipped`` (read-only mode,
      refused directory, entry over the cap), ``num_cache_store_failures``
      (full disk, permissions), ``num_cache_evictions`` (size cap);
    - ``max_bytes`` (``TORCH_TPU_CACHE_MAX_BYTES``), ``readonly``
      (``TORCH_TPU_CACHE_READONLY=1``);
    - ``per_entry_stats``: for each entry this process read or stored, keyed
      by its id (the hex SHA-256 of its key, also its file name):
      ``read_count`` (hits), ``compile_duration`` (seconds the compile took,
      kept in the entry so a later process reports it too) and ``last_read``
      (Unix time of the last hit, ``None`` if not read in this process).
    """
    return dict(_C._kcache_stats())


def _clear_cache() -> None:
    """Removes every entry of the persistent kernel cache (only the cache's
    own files of its directory) and resets :func:`_get_cache_stats`. In
    read-only mode (``TORCH_TPU_CACHE_READONLY=1``) or when the directory is
    refused, no file is touched and only the statistics are reset."""
    _C._kcache_clear()


def _cache_dir() -> str:
    """The kernel cache's directory (a symlinked one by its target). Raises
    ``RuntimeError`` with the reason when the cache can't use it."""
    path, ok, why = _C._kcache_dir()
    if not ok:
        raise RuntimeError(why)
    return path
