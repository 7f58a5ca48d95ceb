/* bench_codegen.c — generated elementwise kernels (src/graph/codegen.c)
 * against the block interpreter, in one process: a chain of 8 float32 ops
 * over two inputs, arithmetic (x * y, + x, * 0.5, relu, + y, * x, - y,
 * max 0.5) and with transcendentals (tanh, sigmoid in place of relu and
 * max), at 256K elements (operands cache-resident) and 16M (memory), and a
 * launch of one op (x + y: what the codegen gate measures), and a training
 * step's residual dropout: x += b in place, mask = uniform >= 0.1, out =
 * x * mask * scale + r (three outputs, one of them updated in place, and
 * the random draws: the fused group DeferAndFuse makes of add, dropout,
 * add), and RoPE's rotation with its stack (run_rope). Samples of
 * `iters` launches alternate between the two tiers (paired, on a noisy
 * host); the median of each is printed with the STREAM triad bandwidth of
 * the same arrays (the runtime's pool, 12 bytes an element as STREAM
 * counts) as the reference for the 16M case.
 *
 * usage: tpurt_bench_codegen [repeats] (default 9)
 * env TORCH_TPU_CODEGEN_MIN_OPS=1 to let the one-op launch compile. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpurt.h"

void tpurt__codegen_test_mode(const char *m);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int emit(tpurt_ew_program *pr, int op, int a, int b, double p0) {
  tpurt_ew_inst *in = &pr->inst[pr->ninst];
  memset(in, 0, sizeof *in);
  in->op = (uint16_t)op;
  in->dst = (uint8_t)pr->ninst;
  in->src[0] = (uint8_t)a;
  in->src[1] = (uint8_t)b;
  in->p[0] = p0;
  return pr->ninst++;
}

static tpurt_ew_program chain(int ops) {
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_F32;
  int x = emit(&pr, TPURT_EW_LOAD, 0, 0, 0), y = emit(&pr, TPURT_EW_LOAD, 0, 0, 1), r;
  if (ops == 1) {
    r = emit(&pr, TPURT_EW_ADD, x, y, 1.0);
  } else if (ops == 8) { /* arithmetic: the interpreter's passes are the cost */
    int h = emit(&pr, TPURT_EW_CONST, 0, 0, 0.5);
    r = emit(&pr, TPURT_EW_MUL, x, y, 0);
    r = emit(&pr, TPURT_EW_ADD, r, x, 1.0);
    r = emit(&pr, TPURT_EW_MUL, r, h, 0);
    r = emit(&pr, TPURT_EW_RELU, r, 0, 0);
    r = emit(&pr, TPURT_EW_ADD, r, y, 1.0);
    r = emit(&pr, TPURT_EW_MUL, r, x, 0);
    r = emit(&pr, TPURT_EW_SUB, r, y, 1.0);
    r = emit(&pr, TPURT_EW_MAXIMUM, r, h, 0);
  } else { /* 8 with tanh and sigmoid: their arithmetic is the cost */
    int h = emit(&pr, TPURT_EW_CONST, 0, 0, 0.5);
    r = emit(&pr, TPURT_EW_MUL, x, y, 0);
    r = emit(&pr, TPURT_EW_ADD, r, x, 1.0);
    r = emit(&pr, TPURT_EW_MUL, r, h, 0);
    r = emit(&pr, TPURT_EW_TANH, r, 0, 0);
    r = emit(&pr, TPURT_EW_ADD, r, y, 1.0);
    r = emit(&pr, TPURT_EW_SIGMOID, r, 0, 0);
    r = emit(&pr, TPURT_EW_MUL, r, x, 0);
    r = emit(&pr, TPURT_EW_SUB, r, y, 1.0);
  }
  pr.nout = 1;
  pr.out_reg[0] = (uint8_t)r;
  return pr;
}

/* x (in place, input 0) += b (input 1); mask = uniform >= 0.1; out =
 * x * mask * (1 / 0.9) + r (input 2): outputs x, mask (bool), out */
static tpurt_ew_program residual_dropout(void) {
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_F32;
  int x = emit(&pr, TPURT_EW_LOAD, 0, 0, 0), b = emit(&pr, TPURT_EW_LOAD, 0, 0, 1);
  int sum = emit(&pr, TPURT_EW_ADD, x, b, 1.0);
  int u = emit(&pr, TPURT_EW_UNIFORM, 0, 0, 0);
  int keep = emit(&pr, TPURT_EW_GE, u, emit(&pr, TPURT_EW_CONST, 0, 0, 0.1f), 0);
  int y = emit(&pr, TPURT_EW_MUL, emit(&pr, TPURT_EW_MUL, sum, keep, 0), emit(&pr, TPURT_EW_CONST, 0, 0, 1 / 0.9f), 0);
  int out = emit(&pr, TPURT_EW_ADD, y, emit(&pr, TPURT_EW_LOAD, 0, 0, 2), 1.0);
  pr.nout = 3;
  pr.out_reg[0] = (uint8_t)sum;
  pr.out_reg[1] = (uint8_t)keep;
  pr.out_reg[2] = (uint8_t)out;
  return pr;
}

static tpurt_view view(tpurt_devptr p, int64_t n) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p;
  v.dtype = TPURT_F32;
  v.ndim = 1;
  v.sizes[0] = n;
  v.strides[0] = 1;
  return v;
}

typedef struct {
  float *a;
  const float *b, *c;
} triad_ctx;
static void triad(void *p, int64_t b0, int64_t e) {
  triad_ctx *t = p;
  float *restrict a = t->a;
  const float *restrict b = t->b, *restrict c = t->c;
  for (int64_t i = b0; i < e; i++) a[i] = b[i] + 3.0f * c[i];
}

static void run(tpurt_stream *s, int ops, int64_t n, int reps) {
  size_t bytes = (size_t)n * 4;
  tpurt_devptr d[5];
  float *h = malloc(bytes);
  for (int64_t i = 0; i < n; i++) h[i] = (float)((i % 1000) - 500) / 250.0f;
  for (int i = 0; i < 5; i++) {
    if (tpurt_malloc(0, bytes, s, &d[i]) || tpurt_memcpy_h2d(s, d[i], h, bytes, 0)) {
      fprintf(stderr, "setup failed: %s\n", tpurt_last_error());
      exit(1);
    }
  }
  int rd = ops == 3;
  tpurt_ew_program pr = rd ? residual_dropout() : chain(ops);
  tpurt_view o[3] = {view(d[0], n), view(d[3], n), view(d[4], n)}, in[3] = {view(d[1], n), view(d[2], n), view(d[1], n)};
  int nin = 2;
  const double sc[4] = {12345, 0, 0, 0};
  if (rd) { /* outputs x (d[0], also input 0), mask (bool over d[3]), out (d[4]); inputs x, b, r */
    o[1].dtype = TPURT_BOOL;
    in[0] = view(d[0], n);
    nin = 3;
  }
  int iters = (int)(((int64_t)1 << 26) / n);
  if (iters < 3) iters = 3;
  double t_int[64], t_gen[64];
  const char *modes[2] = {"0", "sync"};
  for (int r = -1; r < reps; r++) { /* r = -1: warm-up (and the compile) */
    for (int m = 0; m < 2; m++) {
      tpurt__codegen_test_mode(modes[m]);
      tpurt_stream_synchronize(s);
      double t0 = now();
      for (int k = 0; k < iters; k++) tpurt_elementwise(s, &pr, o, in, nin, rd ? sc : NULL, rd ? 4 : 0);
      tpurt_stream_synchronize(s);
      double t = (now() - t0) / iters;
      if (r >= 0) (m ? t_gen : t_int)[r] = t;
    }
  }
  tpurt_defer_stats st;
  tpurt_defer_get_stats(&st);
  /* the triad over the same host arrays */
  triad_ctx tc = {malloc(bytes), malloc(bytes), malloc(bytes)};
  memset(tc.a, 0, bytes);
  memcpy((void *)tc.b, h, bytes);
  memcpy((void *)tc.c, h, bytes);
  double t_tri[64];
  for (int r = -1; r < reps; r++) {
    double t0 = now();
    for (int k = 0; k < iters; k++) tpurt_parallel_for(n, 32768, triad, &tc);
    if (r >= 0) t_tri[r] = (now() - t0) / iters;
  }
  double mi = median(t_int, reps), mg = median(t_gen, reps), mt = median(t_tri, reps);
  double gb = 12.0 * (double)n / 1e9;
  printf("%s %9lld elements: interpreter %8.1f us (%6.1f GB/s)  generated %8.1f us (%6.1f GB/s)  %.2fx  "
         "triad %6.1f GB/s -> generated %.2fx triad  [compiled launches so far %llu]\n",
         ops == 1   ? "1 op (add)           "
         : ops == 3 ? "residual dropout     "
         : ops == 8 ? "8 ops (arithmetic)   "
                    : "8 ops (tanh, sigmoid)",
         (long long)n, mi * 1e6, gb / mi, mg * 1e6, gb / mg, mi / mg, gb / mt,
         (gb / mg) / (gb / mt), (unsigned long long)st.codegen_launches_compiled);
  free(tc.a);
  free((void *)tc.b);
  free((void *)tc.c);
  for (int i = 0; i < 5; i++) tpurt_free(d[i]);
  free(h);
}

/* RoPE's rotation with its stack fused (what DeferAndFuse makes of a
 * rotary embedding, plan.c's permuted members): x1 = x[:, 0::2], x2 =
 * x[:, 1::2] of a [R, 2C] buffer, cos and sin [C] broadcast over the rows,
 * y[:, 0::2] = x1 cos - x2 sin, y[:, 1::2] = x1 sin + x2 cos: rows of C
 * elements, every operand but cos and sin strided — the per-row cost of a
 * generated kernel at small C. */
static void run_rope(tpurt_stream *s, int64_t R, int64_t C, int reps) {
  int64_t n = R * C;
  size_t bytes = (size_t)(2 * n) * 4;
  tpurt_devptr x, y, cs;
  float *h = malloc(bytes);
  for (int64_t i = 0; i < 2 * n; i++) h[i] = (float)((i % 1000) - 500) / 250.0f;
  if (tpurt_malloc(0, bytes, s, &x) || tpurt_malloc(0, bytes, s, &y) || tpurt_malloc(0, (size_t)(2 * C) * 4, s, &cs) ||
      tpurt_memcpy_h2d(s, x, h, bytes, 0) || tpurt_memcpy_h2d(s, cs, h, (size_t)(2 * C) * 4, 0)) {
    fprintf(stderr, "setup failed: %s\n", tpurt_last_error());
    exit(1);
  }
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_F32;
  int x1 = emit(&pr, TPURT_EW_LOAD, 0, 0, 0), c = emit(&pr, TPURT_EW_LOAD, 0, 0, 1);
  int x2 = emit(&pr, TPURT_EW_LOAD, 0, 0, 2), sn = emit(&pr, TPURT_EW_LOAD, 0, 0, 3);
  int a = emit(&pr, TPURT_EW_SUB, emit(&pr, TPURT_EW_MUL, x1, c, 0), emit(&pr, TPURT_EW_MUL, x2, sn, 0), 1.0);
  int b = emit(&pr, TPURT_EW_ADD, emit(&pr, TPURT_EW_MUL, x1, sn, 0), emit(&pr, TPURT_EW_MUL, x2, c, 0), 1.0);
  pr.nout = 2;
  pr.out_reg[0] = (uint8_t)a;
  pr.out_reg[1] = (uint8_t)b;
  tpurt_view v = view(x, n);
  v.ndim = 2;
  v.sizes[0] = R;
  v.sizes[1] = C;
  v.strides[0] = 2 * C;
  v.strides[1] = 2;
  tpurt_view in[4] = {v, v, v, v}, o[2] = {v, v};
  in[2].ptr = x + 4;
  in[1].ptr = cs;
  in[3].ptr = cs + 4 * (uint64_t)C;
  in[1].strides[0] = in[3].strides[0] = 0;
  in[1].strides[1] = in[3].strides[1] = 1;
  o[0].ptr = y;
  o[1].ptr = y + 4;
  int iters = (int)(((int64_t)1 << 24) / n);
  if (iters < 3) iters = 3;
  double t_int[64], t_gen[64];
  const char *modes[2] = {"0", "sync"};
  for (int r = -1; r < reps; r++) {
    for (int m = 0; m < 2; m++) {
      tpurt__codegen_test_mode(modes[m]);
      tpurt_stream_synchronize(s);
      double t0 = now();
      for (int k = 0; k < iters; k++) tpurt_elementwise(s, &pr, o, in, 4, NULL, 0);
      tpurt_stream_synchronize(s);
      if (r >= 0) (m ? t_gen : t_int)[r] = (now() - t0) / iters;
    }
  }
  double mi = median(t_int, reps), mg = median(t_gen, reps);
  printf("rope, rows of %4lld  %9lld elements: interpreter %8.1f us  generated %8.1f us  %.2fx  (%.2f ns an element "
         "generated)\n",
         (long long)C, (long long)n, mi * 1e6, mg * 1e6, mi / mg, mg * 1e9 / (double)n);
  tpurt_free(x);
  tpurt_free(y);
  tpurt_free(cs);
  free(h);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 9;
  if (reps < 1) reps = 1;
  if (reps > 64) reps = 64;
  tpurt_stream *s;
  if (tpurt_init() || tpurt_stream_default(0, &s)) {
    fprintf(stderr, "init failed: %s\n", tpurt_last_error());
    return 1;
  }
  char info[512];
  tpurt_codegen_info(info, sizeof info);
  printf("generated kernels: %s; %d repeats, medians\n", info, reps);
  run(s, 8, 256 << 10, reps);
  run(s, 8, 16 << 20, reps);
  run(s, 9, 256 << 10, reps);
  run(s, 9, 16 << 20, reps);
  run(s, 1, 256 << 10, reps);
  run(s, 1, 16 << 20, reps);
  run(s, 3, 128 << 10, reps);
  run(s, 3, 16 << 20, reps);
  run_rope(s, 4096, 16, reps);
  run_rope(s, 1024, 64, reps);
  return 0;
}
