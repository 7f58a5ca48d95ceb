/* fma_peak.h — f32 FMA peak loop (see fma_peak.c). */
#ifndef TPURT_BENCH_FMA_PEAK_H
#define TPURT_BENCH_FMA_PEAK_H
#include <stdint.h>

/* "AVX-512" or "AVX2": the registers the loop runs on (the widest the CPU has). */
const char *tpurt_bench_fma_isa(void);
/* Floating-point operations one thread performs in `iters` iterations. */
double tpurt_bench_fma_flops(int64_t iters);
/* GFLOP/s of `iters` iterations of the FMA loop on each of `threads`
 * threads, timed from the first thread's start to the last one's end. */
double tpurt_bench_fma_gflops(int threads, int64_t iters);

/* The bf16 matrix-unit peak: "AMX-BF16", "AVX512-BF16" or "none"; flops
 * per thread of `iters` iterations; GFLOP/s on `threads` threads. */
const char *tpurt_bench_bf16_isa(void);
double tpurt_bench_bf16_flops(int64_t iters);
double tpurt_bench_bf16_gflops(int threads, int64_t iters);

#endif
