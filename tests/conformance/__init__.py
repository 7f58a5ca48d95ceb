"""OpInfo conformance harness of the tpu device.

Walks PyTorch's OpInfo database (``common_methods_invocations.op_db``, which
includes ``opinfo.definitions``) and, for every op and dtype (float32,
bfloat16, float16, float64, int64, int32, bool) the OpInfo supports on CPU,
runs its sample inputs on the CPU and on ``tpu`` with the CPU fallback off,
then compares results (structure, dtype, shape, values with assert_close's
default tolerances, NaN equal) and, for differentiable ops in float32 and
float64, gradients. Each (op, dtype, direction) is classified as pass,
mismatch, not_implemented (with the missing aten operator), error, crash,
timeout or skipped. A float32 sample whose values differ from the CPU's is
checked against the CPU run in float64 (inputs widened, result rounded
back): within float32's tolerances of that, it passes and is counted as
*arbitrated* in the report (the CPU's float32 kernel was the inexact one).
Ops run in worker subprocesses so that a crash or hang is recorded against
the op that caused it and the run goes on.

    python -m tests.conformance --help
    python -m tests.conformance --ops add,mul --dtypes float32 --report /tmp/r.json
    python -m tests.conformance --cpu-fallback   # dry run: checks the harness itself

Library: ``compare`` (result comparison), ``runner`` (one op/dtype/direction),
``worker`` (subprocess entry), ``driver`` (chunks, crash/timeout handling),
``report`` (report.json / REPORT.md), ``opdb`` (database access).
"""
