"""torch_tpu benchmarks (``python -m bench --help``).

CPU torch runs as its users get it: OpenMP's default waiting (its workers
spin for a few milliseconds after each parallel region). Forcing passive
waiting made CPU torch's many-small-op training steps ~1.5x slower (minGPT
step 58 -> 87 ms), i.e. flattered every tpu / CPU ratio. Instead, whenever
configs alternate, the timing helpers idle `common.SETTLE_S` before each
sample so that one config's spinning workers have parked before the next
config's clock starts (common.settle)."""
