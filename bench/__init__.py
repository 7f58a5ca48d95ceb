"""torch_tpu benchmarks (``python -m bench --help``)."""
