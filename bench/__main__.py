"""Run the benchmarks: ``python -m bench [device] [--repeats N] [--record]``.

device   host<->device copy bandwidth vs memcpy, empty-op round trip

Figures are medians of interleaved repeats (configs alternate in every
repeat). ``--record`` appends the Markdown tables to BENCHMARKS.md with the
machine description and the command. JSON goes to bench/results/.
"""
from __future__ import annotations

import argparse
import sys

from bench import common, device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", choices=[[], "device"], help="suites to run (default: all)")
    parser.add_argument("--repeats", type=int, default=15, help="repeats per configuration (median reported)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 256], help="copy sizes in MiB")
    parser.add_argument("--record", action="store_true", help="append the results to BENCHMARKS.md")
    args = parser.parse_args(argv)
    args.suites = args.suites or ["device"]
    command = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    if "device" in args.suites:
        copies, copy_table = device.copy_bandwidth(args.sizes_mib, args.repeats)
        ops, op_table = device.op_roundtrip(args.repeats)
        common.save("device", {"machine": common.machine(), "copies": copies, "ops": ops})
        body = ("Copy bandwidth (GB/s; ratio to a host `memcpy` of the same size on one host thread, goal ≥ 0.7×; "
                "device copies of 4 MiB and more are split over the runtime's thread pool):\n\n" + copy_table +
                "\n\nSmallest-op round trip:\n\n" + op_table)
        print(body)
        if args.record:
            common.record("Device foundation: copies and op round trip", command.strip(), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
