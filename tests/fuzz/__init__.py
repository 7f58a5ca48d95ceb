"""Differential fuzzing of the tpu device against PyTorch's CPU backend.

Random well-formed programs (gen.py) over the implemented operators — shapes
with 0-size dimensions and broadcasting, every common dtype, views and
as_strided, in-place ops through views, non-contiguous inputs, reductions,
matrix products at the device's f32 precision contract, indexing with
deliberately bad indices, seeded random numbers, autograd — run on the CPU
and on tpu in strict and DeferAndFuse modes (run.py); the values or the
exception classes must agree. ``python -m tests.fuzz --help``; a minimised
failing program is kept in regressions/ and replayed by test_fuzz.py.
"""
