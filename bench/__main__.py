"""Run the benchmarks: ``python -m bench [device] [elementwise] [gemm] [bf16] [attention] [defer] [fusion] [fft] [compile] [hf] [matrix] [convs] [sweep] [dist] [profiler] [--repeats N] [--quick|--full] [--record]``.

device   host<->device copy bandwidth vs memcpy, empty-op round trip
elementwise  large add/mul/gelu vs CPU and vs the machine's STREAM triad; softmax, norms,
         gelu, tanh, erf, log, sqrt, column sum at a small training step's sizes vs CPU; random
         sampling (rand, randn, uniform_, normal_, bernoulli_, randint, dropout, multinomial, a
         Linear built on the device) vs CPU; sort, unique, topk, kthvalue, median vs CPU; elementary
         functions (trig, inverse trig, sinh, exp2, expm1, log2/10, pow, atan2, hypot), fmod /
         remainder / floor division, clamp, elu, mse / huber loss on 1M floats vs CPU; bincount, histc,
         unique_consecutive, searchsorted / bucketize / isin, index_select, grid_sample, tril / triu,
         column cumsum vs CPU
defer    DeferAndFuse vs strict eager vs CPU eager on minGPT / Llama / ResNet train steps (defer also
         with 64-op pipelined segments, TORCH_TPU_DEFER_SEGMENT_OPS), and their AdamW step alone
         (strict, defer with foreach launches one by one, defer with one chain)
gemm     GEMM library choice (OpenBLAS / oneDNN / torch CPU, FMA peak),
         tpu fp32/bf16 GEMM vs CPU, conv2d on ResNet-18 shapes vs CPU
bf16     bf16 matmul vs CPU at 256-4096 and LLM shapes, % of the bf16 matrix-unit
         peak (AMX-BF16 or AVX512-BF16) sampled alongside
attention fused scaled_dot_product_attention fwd and fwd+bwd vs CPU SDPA
fusion   DeferAndFuse fusion patterns (RMSNorm, row sums, logsumexp with their reduction prologues; a norm's
         scale and a softmax's sum with their reduction epilogues; autocast casts; a linear layer's epilogue),
         each with its setting off and on, paired (not in the default run)
fft      rfft / fft of 2^20 and of 1024x1024 (batch and 2-d) vs CPU torch.fft (not in the default run)
compile  torch.compile(backend="tpu"): cold and warm-cache first training step vs cpu Inductor (fresh
         processes, minGPT / Llama / ResNet), the same vs Llama depth 1..32 (PNG), Llama decode tokens/s
         compiled vs strict vs CPU (not in the default run; steady-state steps: the matrix's tpu compiled)
matrix   examples' workloads (minGPT, Llama, ResNet, DLRM, UNet; Qwen with --qwen) x {cpu eager,
         cpu Inductor, tpu strict, tpu defer, tpu compiled}: train (and Llama/ResNet inference) step time,
         throughput, ratios, peak memory, compile cost; PNG charts (not in the default run)
convs    every convolution of a workload (--workloads, default ResNet and UNet; --quick/--full preset), bf16
         (--conv-dtype float32: f32)
         forward / input gradient / weight gradient, tpu vs CPU, and their weighted sum a step (not in the
         default run)
profiler torch_tpu.profiler's cost per op: off, the runtime's trace ring alone, the whole profile,
         torch.profiler with the PrivateUse1 activity (not in the default run)
hf       Hugging Face clients: Transformers generate() tokens/s of a ~10M-parameter Llama and a Diffusers
         DDPM sampling loop's steps/s, tpu strict / defer vs CPU eager (not in the default run)
sweep    Llama at ~1M..100M params: step time and peak memory vs params and FLOPs (not in the default run)
dist     tpu_dist all_reduce bus bandwidth vs Gloo on CPU tensors (2 processes, 4 KiB-256 MiB), DDP Llama
         throughput on 1 and 2 processes under torchrun (not in the default run)

``--quick`` (default for matrix/sweep: quick presets, 3 repeats, sweep up to 10M)
or ``--full`` (full presets, 10 repeats, sweep up to 100M), e.g.
``python -m bench matrix sweep --quick --record``.

Figures are medians of interleaved repeats (configs alternate in every
repeat; 20 ms idle before each sample lets the previous config's threads
park — CPU torch keeps OpenMP's default waiting, as its users run it;
GEMM and convolution samples then start with one untimed call of their
config, so that they time back-to-back throughput, not the cores waking).
``--record`` appends the Markdown tables to BENCHMARKS.md with the
machine description and the command. JSON goes to bench/results/.
"""
from __future__ import annotations

import argparse
import sys

from bench import attention, common, defer, device, elementwise, fft, fusion, gemm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", choices=[[], "device", "elementwise", "gemm", "bf16", "attention", "defer", "fusion", "fft", "compile", "hf", "matrix", "convs", "sweep", "dist", "profiler"], help="suites to run (default: all)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats per configuration (median reported; default 15, matrix/sweep: 3 quick, 10 full)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 256], help="copy sizes in MiB")
    parser.add_argument("--record", action="store_true", help="append the results to BENCHMARKS.md")
    parser.add_argument("--gemm-sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096],
                        help="square GEMM sizes of the gemm suite")
    parser.add_argument("--conv-batch", type=int, default=4, help="batch of the ResNet-18 conv shapes")
    parser.add_argument("--conv-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="convs: operand dtype (default bfloat16, an autocast step's)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="full", action="store_false", help="matrix/sweep: quick presets (default)")
    size.add_argument("--full", dest="full", action="store_true", help="matrix/sweep: full presets, more repeats")
    parser.set_defaults(full=False)  # --quick is the default (its store_false alone would default to True)
    parser.add_argument("--qwen", action="store_true", help="matrix: add the Qwen workload")
    parser.add_argument("--workloads", nargs="+", default=None, help="matrix: workloads to run (default: all five)")
    parser.add_argument("--no-inductor", action="store_true", help="matrix: skip the cpu torch.compile configuration")
    args = parser.parse_args(argv)
    matrix_repeats = args.repeats or (10 if args.full else 3)
    args.repeats = args.repeats or 15
    args.suites = args.suites or ["device", "elementwise", "gemm", "bf16", "attention", "defer"]
    command = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)

    def emit(key: str, payload: dict, title: str, body: str):
        """Saves the JSON, prints the body, appends it to BENCHMARKS.md with
        --record; returns the JSON's path."""
        path = common.save(key, payload)
        print(body)
        if args.record:
            common.record(title, command.strip(), body)
        return path

    if "device" in args.suites:
        copies, copy_table = device.copy_bandwidth(args.sizes_mib, args.repeats)
        ops, op_table = device.op_roundtrip(args.repeats)
        emit("device", {"machine": common.machine(), "copies": copies, "ops": ops},
             "Device foundation: copies and op round trip",
             "Copy bandwidth (GB/s; ratio to a host `memcpy` of the same size on one host thread, goal ≥ 0.7×; "
             "device copies of 4 MiB and more are split over the runtime's thread pool):\n\n" + copy_table +
             "\n\nSmallest-op round trip:\n\n" + op_table)
    if "elementwise" in args.suites:
        ew, ew_table = elementwise.elementwise(args.repeats)
        sk, sk_table = elementwise.step_kernels(args.repeats)
        rs, rs_table = elementwise.random_sampling(args.repeats)
        os_, os_table = elementwise.order_statistics(max(3, args.repeats // 3))
        mf, mf_table = elementwise.math_functions(args.repeats)
        ix, ix_table = elementwise.indexing_and_scans(max(3, args.repeats // 3))
        emit("elementwise", {"machine": common.machine(), **ew, "step_kernels": sk, "random": rs,
                             "order_statistics": os_, "math_functions": mf, "indexing_and_scans": ix},
             "Elementwise vs CPU and STREAM triad",
             "Large elementwise ops (out= preallocated for add/mul; gelu allocates):\n\n" + ew_table +
             "\n\nKernels at a small training step's sizes (tpu: back-to-back launches, one synchronize per "
             "sample; includes the host's per-op dispatch):\n\n" + sk_table +
             "\n\nRandom sampling (5 calls, then one synchronize, a sample):\n\n" + rs_table +
             "\n\nSorting and selection:\n\n" + os_table +
             "\n\nElementary functions, fmod family, clamp, pointwise losses:\n\n" + mf_table +
             "\n\nIndexing, search, histograms, scans:\n\n" + ix_table)
    if "gemm" in args.suites:
        reps = max(3, args.repeats // 3)
        lib, lib_table = gemm.library_choice(reps)
        mm, mm_table = gemm.gemm(reps, args.gemm_sizes)
        cv, cv_table = gemm.conv(reps, args.conv_batch)
        emit("gemm", {"machine": common.machine(), "library": lib, "gemm": mm, "conv": cv}, "GEMM and convolution",
             "Library candidates' sgemm vs CPU `torch.matmul` (same process; OpenBLAS = scipy-openblas32, oneDNN "
             "only when TORCH_TPU_BENCH_ONEDNN points at a libdnnl.so):\n\n" + lib_table +
             "\n\n" + mm_table + "\n\n" + cv_table)
    if "bf16" in args.suites:
        res, table = gemm.bf16(max(3, args.repeats // 3), args.gemm_sizes)
        emit("bf16", {"machine": common.machine(), **res}, "bf16 matmul on the matrix units", table)
    if "attention" in args.suites:
        att, att_table = attention.attention(max(3, args.repeats // 5))
        emit("attention", {"machine": common.machine(), **att}, "Fused attention", att_table)
    if "defer" in args.suites:
        res, table, seg_table = defer.run(max(5, args.repeats))
        opt_res, opt_table = defer.optimizer_steps(max(5, args.repeats))
        emit("defer", {"machine": common.machine(), "workloads": res, "optimizer_steps": opt_res},
             "DeferAndFuse vs strict eager vs CPU",
             "Training steps (batch 16; minGPT and Llama: 64 tokens, ResNet: 32×32 images), median of "
             "interleaved repeats:\n\n" + table + "\n\nThe same steps with pipelined segments "
             f"(`TORCH_TPU_DEFER_SEGMENT_OPS={defer.SEGMENT_OPS}`, off by default: the device runs one segment "
             "while the host records the next; values crossing a boundary are materialized), interleaved in the "
             "same repeats; peaks measured alone:\n\n" + seg_table + "\n\nThe AdamW step alone on the same parameters (fixed "
             "gradients; foreach launches run one by one or as one chain — `TORCH_TPU_DEFER_CHAINS`), ms per step, "
             "median of interleaved repeats of 5 steps:\n\n" + opt_table)
    if "fusion" in args.suites:
        res, table = fusion.run(args.repeats)
        emit("fusion", {"machine": common.machine(), **res}, "DeferAndFuse fusion patterns, off and on",
             "Each pattern a deferred graph cut by a synchronize (10 per sample), with the setting that turns "
             "its fusion off (0) and on (1), samples alternating in every repeat:\n\n" + table)
    if "fft" in args.suites:
        res, table = fft.fft(max(3, args.repeats // 3))
        emit("fft", {"machine": common.machine(), **res}, "FFT", table)
    if "convs" in args.suites:
        from bench import convs

        preset = "full" if args.full else "quick"
        res, table = convs.run(preset, tuple(args.workloads or ("resnet", "unet")), max(3, args.repeats // 3),
                               dtype=getattr(convs.torch, args.conv_dtype))
        emit("convs", {"machine": common.machine(), **res}, f"Convolutions of the workloads, {args.conv_dtype} ({preset})",
             table)
    if "profiler" in args.suites:
        from bench import profiler as prof

        res, table = prof.overhead(args.repeats)
        emit("profiler", {"machine": common.machine(), **res}, "Profiler overhead (issue 31)", table)
    if "compile" in args.suites:
        from bench import compile as comp

        cold_res, cold_table = comp.cold()
        lay_res, lay_table, png = comp.layers()
        dec_res, dec_table = comp.decode(repeats=max(3, args.repeats // 3))
        emit("compile", {"machine": common.machine(), "cold": cold_res, "layers": lay_res, "decode": dec_res},
             "torch.compile(backend=\"tpu\"): compile cost and decode",
             "First training step of a fresh process (compile included; `TORCH_TPU_CODEGEN=sync` so kernel "
             "compiles are inside it), empty caches, then a second process on the warm caches:\n\n" + cold_table +
             f"\n\nCold first step vs depth (chart {png}):\n\n" + lay_table +
             "\n\nLlama (quick preset) decode, one token a step with the KV cache, greedy on the device, 64 "
             "tokens a sample:\n\n" + dec_table)
    if "dist" in args.suites:
        from bench import dist

        ar, ar_table = dist.allreduce(max(3, args.repeats // 3))
        ddp, ddp_table = dist.ddp_scaling()
        emit("dist", {"machine": common.machine(), "allreduce": ar, "ddp": ddp}, "Distributed: tpu_dist",
             "all_reduce on 2 processes, one \"cpu:gloo,tpu:tpu_dist\" group, medians of interleaved repeats "
             "(goal tpu_dist / gloo ≥ 0.8×; tpu_dist checks each collective's fingerprint on the host's "
             "shared-memory board, verify=gloo through a Gloo all_gather, verify=0 not at all):\n\n" + ar_table +
             "\n\nDDP training of the Llama example under torchrun (4 layers, width 128, 64 tokens x 8 "
             "sequences a process a step; the host's cores are shared by the processes):\n\n" + ddp_table)
    if "hf" in args.suites:
        from bench import hf

        res, table = hf.run(max(3, args.repeats // 3))
        emit("hf", {"machine": common.machine(), **res}, "Hugging Face clients: generate() and DDPM sampling", table)
    if "matrix" in args.suites:
        from bench import matrix, plot

        workloads = tuple(args.workloads or matrix.WORKLOADS) + (matrix.OPTIONAL if args.qwen else ())
        configs = tuple(c for c in matrix.CONFIGS if not (args.no_inductor and c == "cpu inductor"))
        res = matrix.run("full" if args.full else "quick", matrix_repeats, workloads, configs)
        pngs = plot.matrix(res)
        path = emit("matrix", res, "Workload matrix: examples × cpu eager / Inductor / tpu strict / tpu defer",
                    matrix.describe(res))
        print(f"JSON {path}; charts " + ", ".join(str(p) for p in pngs))
        if res["missing"]:
            print(f"!!! MISSING workloads: {', '.join(res['missing'])}", file=sys.stderr)
    if "sweep" in args.suites:
        from bench import plot, sweep

        res = sweep.run("full" if args.full else "quick", matrix_repeats)
        pngs = plot.sweep(res)
        path = emit("sweep", res, "Llama size sweep: step time and peak memory vs parameters", sweep.describe(res))
        print(f"JSON {path}; chart " + ", ".join(str(p) for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
