"""torch_tpu benchmarks (``python -m bench --help``)."""

import os as _os

# PyTorch's CPU kernels run on OpenMP threads that by default keep spinning
# after each parallel region; in a process that times CPU and tpu work side
# by side, those spinning threads take the cores from the tpu kernels that
# follow (measured: 16M-element add 0.56x -> 0.90x of CPU). Passive waiting
# makes the interleaved comparison fair; set OMP_WAIT_POLICY to override.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
