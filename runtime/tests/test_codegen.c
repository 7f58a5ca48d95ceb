/* test_codegen.c — generated elementwise kernels (src/graph/codegen.c)
 * against the interpreter, bit for bit: every program runs interpreted
 * (TORCH_TPU_CODEGEN=0) and generated (sync mode, so the first launch is
 * compiled) on the same inputs (NaN, inf, -0, subnormals among them); all
 * memory the launch may touch is compared byte for byte (the one
 * exception: a NaN an op made of two NaNs may carry the sign of the other,
 * see nan_sign_only), and the counters must show the generated kernel ran. Programs: chains of 8 ops (f32, f64,
 * int64, complex64), broadcasts against [C] and [N, 1], strided and
 * transposed inputs, rows shorter than 8 (the interpreter's gather mode),
 * sizes 1, 7 and 1000003, casts f32 <-> bf16 / f16 / int, casts through
 * integer dtypes, bool masks and where, in-place updates, two outputs,
 * uniform draws and dropout; integer division by zero. Failure modes: no
 * compiler (CC=/nonexistent), a compile error (an injected source), both
 * with the interpreter's results and a warning; the background compile
 * (the first launch interpreted, later ones compiled). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

void tpurt__codegen_reset(void);
void tpurt__codegen_test_inject(const char *text);
void tpurt__codegen_test_mode(const char *m);

static tpurt_stream *S;

/* ------------------------------------------------------------ buffers */

typedef struct {
  tpurt_devptr d;
  unsigned char *init, *got;
  size_t bytes;
  tpurt_dtype dt;
} dbuf;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
static double rval(void) {
  static const double special[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, 1e-40, -1e-39, 1.0, -1.0, 88.0, -104.5, 3.0};
  uint64_t r = rnd();
  if (r % 16 == 0) return special[(r >> 8) % (sizeof special / sizeof special[0])];
  return ((double)(r >> 11) / 9007199254740992.0 - 0.5) * 8.0;
}
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* n elements of dt with values every kernel meets */
static dbuf mkbuf(tpurt_dtype dt, size_t n) {
  dbuf b;
  size_t es = tpurt_dtype_size(dt);
  b.bytes = n * es;
  b.dt = dt;
  b.init = malloc(b.bytes ? b.bytes : 1);
  b.got = malloc(b.bytes ? b.bytes : 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char *p = b.init + i * es;
    double v = rval();
    switch (dt) {
      case TPURT_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
      case TPURT_F64: memcpy(p, &v, 8); break;
      case TPURT_BF16: { uint16_t h = f2bf((float)v); memcpy(p, &h, 2); break; }
      case TPURT_F16: { uint16_t h = (uint16_t)rnd(); memcpy(p, &h, 2); break; } /* every half bit pattern */
      case TPURT_C64: { float f[2] = {(float)v, (float)rval()}; memcpy(p, f, 8); break; }
      case TPURT_BOOL: p[0] = (unsigned char)(rnd() & 1); break;
      case TPURT_I64: { int64_t x = (int64_t)(rnd() % 2001) - 1000; if (rnd() % 50 == 0) x = (int64_t)rnd(); memcpy(p, &x, 8); break; }
      case TPURT_I32: { int32_t x = (int32_t)(rnd() % 2001) - 1000; memcpy(p, &x, 4); break; }
      default: for (size_t k = 0; k < es; k++) p[k] = (unsigned char)rnd(); break;
    }
  }
  b.d = check_up(S, b.init, b.bytes);
  return b;
}
static void freebuf(dbuf *b) {
  tpurt_free(b->d);
  free(b->init);
  free(b->got);
}

/* ------------------------------------------------------------ programs */

static tpurt_ew_program prog(tpurt_dtype compute) {
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = compute;
  return pr;
}
static int emit(tpurt_ew_program *pr, int op, int a, int b, int c, double p0) {
  tpurt_ew_inst *in = &pr->inst[pr->ninst];
  memset(in, 0, sizeof *in);
  in->op = (uint16_t)op;
  in->dst = (uint8_t)pr->ninst;
  in->src[0] = (uint8_t)a;
  in->src[1] = (uint8_t)b;
  in->src[2] = (uint8_t)c;
  in->p[0] = p0;
  return pr->ninst++;
}
static int load(tpurt_ew_program *pr, int i) { return emit(pr, TPURT_EW_LOAD, 0, 0, 0, i); }
static void out(tpurt_ew_program *pr, int reg) { pr->out_reg[pr->nout++] = (uint8_t)reg; }

static tpurt_defer_stats stats(void) {
  tpurt_defer_stats s;
  tpurt_defer_get_stats(&s);
  return s;
}

/* Runs the launch once per mode on buffers reset to their initial bytes;
 * the bytes of every buffer afterwards into got (mode 1: into want). */
static tpurt_status run(const char *mode, const tpurt_ew_program *pr, const tpurt_view *outs, const tpurt_view *ins,
                        int nin, const double *sc, int ns, dbuf *bufs, int nb, int into_init) {
  tpurt__codegen_test_mode(mode);
  for (int i = 0; i < nb; i++) CHECK_OK(tpurt_memcpy_h2d(S, bufs[i].d, bufs[i].init, bufs[i].bytes, 0));
  tpurt_status st = tpurt_elementwise(S, pr, outs, ins, nin, sc, ns);
  if (st == TPURT_OK) st = tpurt_stream_synchronize(S);
  for (int i = 0; i < nb; i++) check_down(S, bufs[i].got, bufs[i].d, bufs[i].bytes);
  (void)into_init;
  return st;
}

static int g_cases;
static size_t g_nan_signs;

/* 1 if the element is a NaN whose only difference to `other` is its sign
 * bit. The one freedom the tiers do not share: which NaN an op returns
 * when it meets two (the operand order the C compiler picked for a
 * commutative instruction) and whether a negation inside an op reaches a
 * NaN are the compiler's choices, made per loop — the interpreter's own
 * vector and scalar loops, or its build for another ISA, differ the same
 * way. Every other bit, NaN payloads included, must be equal. */
static int nan_sign_only(tpurt_dtype dt, const unsigned char *a, const unsigned char *b) {
  switch (dt) {
    case TPURT_F32:
    case TPURT_C64: {
      uint32_t x, y;
      memcpy(&x, a, 4);
      memcpy(&y, b, 4);
      return (x ^ y) == 0x80000000u && (x & 0x7fffffffu) > 0x7f800000u;
    }
    case TPURT_F64:
    case TPURT_C128: {
      uint64_t x, y;
      memcpy(&x, a, 8);
      memcpy(&y, b, 8);
      return (x ^ y) == 0x8000000000000000ull && (x & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    }
    case TPURT_BF16:
    case TPURT_F16: {
      uint16_t x, y;
      memcpy(&x, a, 2);
      memcpy(&y, b, 2);
      return (x ^ y) == 0x8000u && (x & 0x7fffu) > (dt == TPURT_BF16 ? 0x7f80u : 0x7c00u);
    }
    default: return 0;
  }
}

/* The first byte where b->got differs from want (b->bytes if none),
 * NaN-sign-only differences counted in *nan_signs and passed over. */
static size_t first_difference(const dbuf *b, const unsigned char *want, size_t *nan_signs) {
  size_t es = tpurt_dtype_size(b->dt), part = b->dt == TPURT_C64 || b->dt == TPURT_C128 ? es / 2 : es;
  for (size_t k = 0; k < b->bytes; k += part) {
    if (!memcmp(b->got + k, want + k, part)) continue;
    if (nan_sign_only(b->dt, want + k, b->got + k)) {
      (*nan_signs)++;
      continue;
    }
    size_t q = k;
    while (b->got[q] == want[q]) q++;
    return q;
  }
  return b->bytes;
}

/* The program interpreted and generated: same status, same bytes, and
 * the generated kernel ran (want_compiled). */
static void compare(const char *name, const tpurt_ew_program *pr, const tpurt_view *outs, const tpurt_view *ins,
                    int nin, const double *sc, int ns, dbuf *bufs, int nb, int want_compiled) {
  unsigned char *ref[16];
  tpurt_status s0 = run("0", pr, outs, ins, nin, sc, ns, bufs, nb, 0);
  for (int i = 0; i < nb; i++) {
    ref[i] = malloc(bufs[i].bytes ? bufs[i].bytes : 1);
    memcpy(ref[i], bufs[i].got, bufs[i].bytes);
  }
  tpurt_defer_stats a = stats();
  tpurt_status s1 = run("sync", pr, outs, ins, nin, sc, ns, bufs, nb, 0);
  tpurt_defer_stats b = stats();
  g_cases++;
  if (s0 != s1) {
    fprintf(stderr, "%s: interpreter status %s, generated %s\n", name, tpurt_status_name(s0), tpurt_status_name(s1));
    g_failures++;
  }
  for (int i = 0; i < nb; i++) {
    size_t nan_signs = 0, k = s0 == TPURT_OK ? first_difference(&bufs[i], ref[i], &nan_signs) : bufs[i].bytes;
    if (k < bufs[i].bytes) {
      size_t k0 = k & ~(size_t)7;
      fprintf(stderr, "%s: buffer %d differs from the interpreter's at byte %zu of %zu:", name, i, k, bufs[i].bytes);
      for (size_t q = k0; q < k0 + 8 && q < bufs[i].bytes; q++) fprintf(stderr, " %02x/%02x", ref[i][q], bufs[i].got[q]);
      fprintf(stderr, " (interpreted/generated)\n");
      g_failures++;
    }
    g_nan_signs += nan_signs;
    free(ref[i]);
  }
  uint64_t ran = b.codegen_launches_compiled - a.codegen_launches_compiled;
  if (want_compiled && ran != 1) {
    fprintf(stderr, "%s: %llu launches ran generated code (want 1; failures %llu, declined %llu)\n", name,
            (unsigned long long)ran, (unsigned long long)(b.codegen_failures - a.codegen_failures),
            (unsigned long long)(b.codegen_not_generated - a.codegen_not_generated));
    g_failures++;
  }
  if (!want_compiled && ran != 0) {
    fprintf(stderr, "%s: generated code ran where the interpreter must\n", name);
    g_failures++;
  }
}

/* ------------------------------------------------------------- cases */

/* out = chain of 8 ops over x, y (f32 or f64), three op mixes */
static void chains(tpurt_dtype ct, const int64_t *sizes, int nd) {
  static const int mixes[3][8] = {
      {TPURT_EW_MUL, TPURT_EW_ADD, TPURT_EW_SIGMOID, TPURT_EW_SUB, TPURT_EW_GELU, TPURT_EW_TANH, TPURT_EW_DIV,
       TPURT_EW_EXP},
      {TPURT_EW_SILU, TPURT_EW_LOG, TPURT_EW_ERF, TPURT_EW_SQRT, TPURT_EW_RECIPROCAL, TPURT_EW_MAXIMUM,
       TPURT_EW_GELU_TANH, TPURT_EW_RSQRT},
      {TPURT_EW_SQUARE, TPURT_EW_LOG1P, TPURT_EW_ERFC, TPURT_EW_MINIMUM, TPURT_EW_ABS, TPURT_EW_SIN, TPURT_EW_POW,
       TPURT_EW_GELU_BACKWARD},
  };
  int64_t n = 1;
  for (int k = 0; k < nd; k++) n *= sizes[k];
  for (int m = 0; m < 3; m++) {
    tpurt_ew_program pr = prog(ct);
    int x = load(&pr, 0), y = load(&pr, 1), r = x;
    for (int k = 0; k < 8; k++) {
      int op = mixes[m][k];
      int binary = op == TPURT_EW_MUL || op == TPURT_EW_ADD || op == TPURT_EW_SUB || op == TPURT_EW_DIV ||
                   op == TPURT_EW_MAXIMUM || op == TPURT_EW_MINIMUM || op == TPURT_EW_POW ||
                   op == TPURT_EW_GELU_BACKWARD;
      r = emit(&pr, op, r, binary ? y : r, 0, op == TPURT_EW_ADD || op == TPURT_EW_SUB ? (k & 1 ? 1.0 : 0.75) : 0);
    }
    out(&pr, r);
    dbuf b[3] = {mkbuf(ct, (size_t)n), mkbuf(ct, (size_t)n), mkbuf(ct, (size_t)n)};
    tpurt_view o = check_view(b[0].d, ct, nd, sizes), in[2] = {check_view(b[1].d, ct, nd, sizes),
                                                                check_view(b[2].d, ct, nd, sizes)};
    char name[96];
    snprintf(name, sizeof name, "chain %d %s numel %lld", m, tpurt_dtype_name(ct), (long long)n);
    compare(name, &pr, &o, in, 2, NULL, 0, b, 3, 1);
    for (int i = 0; i < 3; i++) freebuf(&b[i]);
  }
}

/* LayerNorm-like: (x - mean[N,1]) * rstd[N,1] * w[C] + b[C], with a
 * scalar (a launch constant); x contiguous, strided (every other column)
 * or transposed */
static void broadcasts(int64_t N, int64_t C, int layout) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int x = load(&pr, 0), mu = load(&pr, 1), rs = load(&pr, 2), w = load(&pr, 3), bb = load(&pr, 4);
  int c = emit(&pr, TPURT_EW_SCALAR, 0, 0, 0, 0);
  int r = emit(&pr, TPURT_EW_SUB, x, mu, 0, 1.0);
  r = emit(&pr, TPURT_EW_MUL, r, rs, 0, 0);
  r = emit(&pr, TPURT_EW_MUL, r, w, 0, 0);
  r = emit(&pr, TPURT_EW_ADD, r, bb, 0, 1.0);
  r = emit(&pr, TPURT_EW_MUL, r, c, 0, 0);
  out(&pr, r);
  dbuf b[6] = {mkbuf(TPURT_F32, (size_t)(N * C)), mkbuf(TPURT_F32, (size_t)(2 * N * C)), mkbuf(TPURT_F32, (size_t)N),
               mkbuf(TPURT_F32, (size_t)N),       mkbuf(TPURT_F32, (size_t)C),           mkbuf(TPURT_F32, (size_t)C)};
  int64_t sz[2] = {N, C};
  int64_t xs[3][2] = {{C, 1}, {2 * C, 2}, {1, N}};
  int64_t col[2] = {1, 0}, row[2] = {0, 1};
  tpurt_view o = check_view(b[0].d, TPURT_F32, 2, sz);
  tpurt_view in[5] = {check_view_st(b[1].d, TPURT_F32, 2, sz, xs[layout]), check_view_st(b[2].d, TPURT_F32, 2, sz, col),
                      check_view_st(b[3].d, TPURT_F32, 2, sz, col), check_view_st(b[4].d, TPURT_F32, 2, sz, row),
                      check_view_st(b[5].d, TPURT_F32, 2, sz, row)};
  double sc[1] = {0.3};
  char name[96];
  snprintf(name, sizeof name, "broadcast %lldx%lld layout %d", (long long)N, (long long)C, layout);
  compare(name, &pr, &o, in, 5, sc, 1, b, 6, 1);
  sc[0] = -2.5; /* another scalar: the same kernel (read at run time) */
  compare(name, &pr, &o, in, 5, sc, 1, b, 6, 1);
  for (int i = 0; i < 6; i++) freebuf(&b[i]);
}

/* low-precision and integer dtypes around f32 compute: in dt, out dt2,
 * a cast through `via` in the middle */
static void casts(tpurt_dtype in_dt, tpurt_dtype out_dt, tpurt_dtype via, int64_t n) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int x = load(&pr, 0), y = load(&pr, 1);
  int r = emit(&pr, TPURT_EW_MUL, x, y, 0, 0);
  r = emit(&pr, TPURT_EW_CAST, r, 0, 0, via);
  r = emit(&pr, TPURT_EW_ADD, r, x, 0, 1.0);
  r = emit(&pr, TPURT_EW_SILU, r, 0, 0, 0);
  out(&pr, r);
  dbuf b[3] = {mkbuf(out_dt, (size_t)n), mkbuf(in_dt, (size_t)n), mkbuf(TPURT_F32, (size_t)n)};
  tpurt_view o = check_view(b[0].d, out_dt, 1, &n), in[2] = {check_view(b[1].d, in_dt, 1, &n),
                                                              check_view(b[2].d, TPURT_F32, 1, &n)};
  char name[128];
  snprintf(name, sizeof name, "cast %s -> f32 via %s -> %s", tpurt_dtype_name(in_dt), tpurt_dtype_name(via),
           tpurt_dtype_name(out_dt));
  compare(name, &pr, &o, in, 2, NULL, 0, b, 3, 1);
  for (int i = 0; i < 3; i++) freebuf(&b[i]);
}

/* masks: out = where(mask, x * 2, y), keep = x > y (bool output), rows of 3
 * (gather mode) and of 1000 */
static void masks(int64_t R, int64_t C) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int m = load(&pr, 0), x = load(&pr, 1), y = load(&pr, 2);
  int two = emit(&pr, TPURT_EW_CONST, 0, 0, 0, 2.0);
  int x2 = emit(&pr, TPURT_EW_MUL, x, two, 0, 0);
  int w = emit(&pr, TPURT_EW_WHERE, m, x2, y, 0);
  int gt = emit(&pr, TPURT_EW_GT, x, y, 0, 0);
  int nt = emit(&pr, TPURT_EW_LOGICAL_NOT, gt, 0, 0, 0);
  out(&pr, w);
  out(&pr, nt);
  int64_t sz[2] = {R, C}, n = R * C;
  dbuf b[5] = {mkbuf(TPURT_F32, (size_t)n), mkbuf(TPURT_BOOL, (size_t)n), mkbuf(TPURT_BOOL, (size_t)n),
               mkbuf(TPURT_BF16, (size_t)n), mkbuf(TPURT_F32, (size_t)n)};
  tpurt_view o[2] = {check_view(b[0].d, TPURT_F32, 2, sz), check_view(b[1].d, TPURT_BOOL, 2, sz)};
  tpurt_view in[3] = {check_view(b[2].d, TPURT_BOOL, 2, sz), check_view(b[3].d, TPURT_BF16, 2, sz),
                      check_view(b[4].d, TPURT_F32, 2, sz)};
  char name[96];
  snprintf(name, sizeof name, "masks %lldx%lld", (long long)R, (long long)C);
  compare(name, &pr, o, in, 3, NULL, 0, b, 5, 1);
  for (int i = 0; i < 5; i++) freebuf(&b[i]);
}

/* x = x * s + y * y in place (x bf16), and a partial overlap the
 * generator must decline */
static void in_place(int64_t n) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int x = load(&pr, 0), y = load(&pr, 1);
  int s = emit(&pr, TPURT_EW_SCALAR, 0, 0, 0, 0);
  int r = emit(&pr, TPURT_EW_MUL, x, s, 0, 0);
  int yy = emit(&pr, TPURT_EW_SQUARE, y, 0, 0, 0);
  r = emit(&pr, TPURT_EW_ADD, r, yy, 0, 1.0);
  out(&pr, r);
  dbuf b[2] = {mkbuf(TPURT_BF16, (size_t)n + 1), mkbuf(TPURT_F32, (size_t)n)};
  tpurt_view xv = check_view(b[0].d, TPURT_BF16, 1, &n), in[2] = {xv, check_view(b[1].d, TPURT_F32, 1, &n)};
  double sc[1] = {0.9};
  compare("in place", &pr, &xv, in, 2, sc, 1, b, 2, 1);
  /* out = x[1:] while reading x[:-1]: overlapping, not the same memory */
  tpurt_view shifted = xv;
  shifted.ptr = b[0].d + 2;
  tpurt_defer_stats a = stats();
  compare("partial overlap (declined)", &pr, &shifted, in, 2, sc, 1, b, 0, 0); /* racy in any tier: not compared */
  CHECK_EQ(stats().codegen_not_generated, a.codegen_not_generated + 1);
  for (int i = 0; i < 2; i++) freebuf(&b[i]);
}

/* int64 compute: wrap, floor division and remainder, a cast through int8;
 * division by zero fails in both tiers */
static void ints(int64_t n, int zero_div) {
  tpurt_ew_program pr = prog(TPURT_I64);
  int x = load(&pr, 0), y = load(&pr, 1);
  int r = emit(&pr, TPURT_EW_MUL, x, y, 0, 0);
  r = emit(&pr, TPURT_EW_ADD, r, x, 0, 3.0);
  int d = emit(&pr, TPURT_EW_DIV_FLOOR, r, y, 0, 0);
  int m = emit(&pr, TPURT_EW_REMAINDER, r, y, 0, 0);
  r = emit(&pr, TPURT_EW_BITWISE_XOR, d, m, 0, 0);
  r = emit(&pr, TPURT_EW_CAST, r, 0, 0, TPURT_I8);
  r = emit(&pr, TPURT_EW_ABS, r, 0, 0, 0);
  out(&pr, r);
  out(&pr, d);
  dbuf b[4] = {mkbuf(TPURT_I32, (size_t)n), mkbuf(TPURT_I64, (size_t)n), mkbuf(TPURT_I64, (size_t)n),
               mkbuf(TPURT_I32, (size_t)n)};
  for (int64_t i = 0; i < n; i++) { /* no zero divisors unless asked */
    int32_t v;
    memcpy(&v, b[3].init + 4 * i, 4);
    if (v == 0 && !zero_div) v = 7;
    if (zero_div && i == n / 2) v = 0;
    memcpy(b[3].init + 4 * i, &v, 4);
  }
  tpurt_view o[2] = {check_view(b[0].d, TPURT_I32, 1, &n), check_view(b[1].d, TPURT_I64, 1, &n)};
  tpurt_view in[2] = {check_view(b[2].d, TPURT_I64, 1, &n), check_view(b[3].d, TPURT_I32, 1, &n)};
  compare(zero_div ? "int64 division by zero" : "int64 chain", &pr, o, in, 2, NULL, 0, b, 4, 1);
  for (int i = 0; i < 4; i++) freebuf(&b[i]);
}

/* complex64: z * w + z, exp, abs */
static void complexes(int64_t n) {
  tpurt_ew_program pr = prog(TPURT_C64);
  int z = load(&pr, 0), w = load(&pr, 1);
  int r = emit(&pr, TPURT_EW_MUL, z, w, 0, 0);
  r = emit(&pr, TPURT_EW_ADD, r, z, 0, 1.0);
  r = emit(&pr, TPURT_EW_EXP, r, 0, 0, 0);
  r = emit(&pr, TPURT_EW_SQRT, r, 0, 0, 0);
  out(&pr, r);
  dbuf b[3] = {mkbuf(TPURT_C64, (size_t)n), mkbuf(TPURT_C64, (size_t)n), mkbuf(TPURT_C64, (size_t)n)};
  tpurt_view o = check_view(b[0].d, TPURT_C64, 1, &n), in[2] = {check_view(b[1].d, TPURT_C64, 1, &n),
                                                                 check_view(b[2].d, TPURT_C64, 1, &n)};
  compare("complex64 chain", &pr, &o, in, 2, NULL, 0, b, 3, 1);
  for (int i = 0; i < 3; i++) freebuf(&b[i]);
}

/* dropout: out = x * (uniform >= p) * 1 / (1 - p), and the draws
 * themselves (f64 compute widens them) over a 2-D view */
static void rng(tpurt_dtype ct, int64_t R, int64_t C) {
  tpurt_ew_program pr = prog(ct);
  int x = load(&pr, 0);
  int u = emit(&pr, TPURT_EW_UNIFORM, 0, 0, 0, 0);
  int p = emit(&pr, TPURT_EW_CONST, 0, 0, 0, 0.25);
  int keep = emit(&pr, TPURT_EW_GE, u, p, 0, 0);
  int y = emit(&pr, TPURT_EW_MUL, x, keep, 0, 0);
  int sc = emit(&pr, TPURT_EW_CONST, 0, 0, 0, 1.0 / 0.75);
  y = emit(&pr, TPURT_EW_MUL, y, sc, 0, 0);
  out(&pr, y);
  out(&pr, u);
  int64_t sz[2] = {R, C}, n = R * C;
  dbuf b[3] = {mkbuf(ct, (size_t)n), mkbuf(TPURT_F32, (size_t)n), mkbuf(ct, (size_t)n)};
  tpurt_view o[2] = {check_view(b[0].d, ct, 2, sz), check_view(b[1].d, TPURT_F32, 2, sz)};
  tpurt_view in[1] = {check_view(b[2].d, ct, 2, sz)};
  double s[4] = {12345, 7, 3, 0}; /* seed 7 * 2^32 + 12345, offset 3 */
  char name[96];
  snprintf(name, sizeof name, "dropout %s %lldx%lld", tpurt_dtype_name(ct), (long long)R, (long long)C);
  compare(name, &pr, o, in, 1, s, 4, b, 3, 1);
  for (int i = 0; i < 3; i++) freebuf(&b[i]);
}

/* a training step's residual dropout as DeferAndFuse fuses it: x += b in
 * place, keep = uniform >= 0.1 stored as bool, out = x * keep * scale + r
 * (an in-place output, three outputs and the draws in one loop: the
 * generator's element loop is declared free of dependences for it) */
static void residual_dropout(int64_t R, int64_t C) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int x = load(&pr, 0), bias = load(&pr, 1);
  int sum = emit(&pr, TPURT_EW_ADD, x, bias, 0, 1.0);
  int u = emit(&pr, TPURT_EW_UNIFORM, 0, 0, 0, 0);
  int keep = emit(&pr, TPURT_EW_GE, u, emit(&pr, TPURT_EW_CONST, 0, 0, 0, 0.1), 0, 0);
  int y = emit(&pr, TPURT_EW_MUL, emit(&pr, TPURT_EW_MUL, sum, keep, 0, 0),
               emit(&pr, TPURT_EW_CONST, 0, 0, 0, 1.0 / 0.9), 0, 0);
  int o = emit(&pr, TPURT_EW_ADD, y, load(&pr, 2), 0, 1.0);
  out(&pr, sum);
  out(&pr, keep);
  out(&pr, o);
  int64_t sz[2] = {R, C}, n = R * C;
  dbuf b[4] = {mkbuf(TPURT_F32, (size_t)n), mkbuf(TPURT_BOOL, (size_t)n), mkbuf(TPURT_F32, (size_t)n),
               mkbuf(TPURT_F32, (size_t)n)};
  tpurt_view xv = check_view(b[0].d, TPURT_F32, 2, sz);
  tpurt_view outs[3] = {xv, check_view(b[1].d, TPURT_BOOL, 2, sz), check_view(b[2].d, TPURT_F32, 2, sz)};
  tpurt_view in[3] = {xv, check_view(b[3].d, TPURT_F32, 2, sz), check_view(b[3].d, TPURT_F32, 2, sz)};
  double s[4] = {99, 1, 5, 0};
  char name[96];
  snprintf(name, sizeof name, "residual dropout in place %lldx%lld", (long long)R, (long long)C);
  compare(name, &pr, outs, in, 3, s, 4, b, 4, 1);
  for (int i = 0; i < 4; i++) freebuf(&b[i]);
}

/* RoPE's stack: two outputs writing the interleaved halves of one buffer
 * (byte ranges overlap, no byte in common: generated), from inputs read
 * in the other order (a [R, C] walk of a [C, R] buffer); the same two
 * outputs on the same half collide (declined) */
static void interleaved(int64_t R, int64_t C) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int x = load(&pr, 0), y = load(&pr, 1);
  out(&pr, emit(&pr, TPURT_EW_SUB, emit(&pr, TPURT_EW_MUL, x, y, 0, 0), y, 0, 1.0));
  out(&pr, emit(&pr, TPURT_EW_ADD, emit(&pr, TPURT_EW_MUL, x, x, 0, 0), y, 0, 1.0));
  int64_t sz[2] = {R, C}, n = R * C, half[2] = {2 * C, 2}, tr[2] = {1, R};
  dbuf b[3] = {mkbuf(TPURT_F32, 2 * (size_t)n), mkbuf(TPURT_F32, (size_t)n), mkbuf(TPURT_F32, (size_t)n)};
  tpurt_view outs[2] = {check_view_st(b[0].d, TPURT_F32, 2, sz, half), check_view_st(b[0].d + 4, TPURT_F32, 2, sz, half)};
  tpurt_view in[2] = {check_view_st(b[1].d, TPURT_F32, 2, sz, tr), check_view(b[2].d, TPURT_F32, 2, sz)};
  char name[96];
  snprintf(name, sizeof name, "interleaved halves %lldx%lld", (long long)R, (long long)C);
  compare(name, &pr, outs, in, 2, NULL, 0, b, 3, 1);
  tpurt_defer_stats a = stats();
  outs[1].ptr = b[0].d + 8; /* the first output's next element: both write it */
  compare("interleaved halves colliding (declined)", &pr, outs, in, 2, NULL, 0, b, 0, 0); /* racy: not compared */
  CHECK_EQ(stats().codegen_not_generated, a.codegen_not_generated + 1);
  for (int i = 0; i < 3; i++) freebuf(&b[i]);
}

/* a small program used by the failure and background cases */
static tpurt_ew_program small_prog(double k) {
  tpurt_ew_program pr = prog(TPURT_F32);
  int x = load(&pr, 0);
  int c = emit(&pr, TPURT_EW_CONST, 0, 0, 0, k);
  int r = emit(&pr, TPURT_EW_MUL, x, c, 0, 0);
  r = emit(&pr, TPURT_EW_TANH, r, 0, 0, 0);
  r = emit(&pr, TPURT_EW_SIGMOID, r, 0, 0, 0);
  out(&pr, r);
  return pr;
}

/* stderr into a file while fn runs; 1 if it printed "torch_tpu: " and
 * `what` */
static int warned_during(void (*fn)(void), const char *what) {
  char path[] = "/tmp/test_codegen_stderr_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 0;
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char buf[4096] = {0};
  lseek(fd, 0, SEEK_SET);
  ssize_t got = read(fd, buf, sizeof buf - 1);
  close(fd);
  unlink(path);
  if (got > 0) fprintf(stderr, "(captured) %s", buf);
  return got > 0 && strstr(buf, "torch_tpu: ") && strstr(buf, what);
}

static int64_t g_fn = 1000;
static dbuf g_fb[2];

static void failing_launch(void) {
  tpurt_ew_program pr = small_prog(0.5);
  tpurt_view o = check_view(g_fb[0].d, TPURT_F32, 1, &g_fn), in = check_view(g_fb[1].d, TPURT_F32, 1, &g_fn);
  tpurt_defer_stats a = stats();
  compare("failure case", &pr, &o, &in, 1, NULL, 0, g_fb, 2, 0);
  tpurt_defer_stats b = stats();
  CHECK(b.codegen_failures > a.codegen_failures);
  compare("failure case, again", &pr, &o, &in, 1, NULL, 0, g_fb, 2, 0);
  tpurt_defer_stats c = stats();
  CHECK_EQ(c.codegen_failures, b.codegen_failures); /* marked failed: not compiled again */
}

static void failures(void) {
  g_fb[0] = mkbuf(TPURT_F32, (size_t)g_fn);
  g_fb[1] = mkbuf(TPURT_F32, (size_t)g_fn);
  /* no compiler */
  setenv("CC", "/nonexistent/cc", 1);
  tpurt__codegen_reset();
  CHECK(warned_during(failing_launch, "not found"));
  char info[512];
  CHECK_EQ(tpurt_codegen_info(info, sizeof info), 0);
  CHECK(strstr(info, "/nonexistent/cc") != NULL);
  unsetenv("CC");
  /* a compile error */
  tpurt__codegen_reset();
  tpurt__codegen_test_inject("\n#error injected by test_codegen\n");
  CHECK(warned_during(failing_launch, "injected by test_codegen"));
  tpurt__codegen_test_inject(NULL);
  tpurt__codegen_reset();
  CHECK_EQ(tpurt_codegen_info(info, sizeof info), 1);
  for (int i = 0; i < 2; i++) freebuf(&g_fb[i]);
}

/* the default mode: the first launch is interpreted while the kernel
 * compiles on the compile thread; a later launch runs it */
static void background(void) {
  tpurt__codegen_reset();
  tpurt__codegen_test_mode("1");
  int64_t n = 4099;
  dbuf b[2] = {mkbuf(TPURT_F32, (size_t)n), mkbuf(TPURT_F32, (size_t)n)};
  tpurt_ew_program pr = small_prog(1.5);
  tpurt_view o = check_view(b[0].d, TPURT_F32, 1, &n), in = check_view(b[1].d, TPURT_F32, 1, &n);
  unsigned char *first = malloc(b[0].bytes);
  tpurt_defer_stats a = stats();
  CHECK_OK(tpurt_elementwise(S, &pr, &o, &in, 1, NULL, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
  check_down(S, first, b[0].d, b[0].bytes);
  tpurt_defer_stats m = stats();
  CHECK_EQ(m.codegen_launches_compiled, a.codegen_launches_compiled);
  for (int i = 0; i < 6000 && stats().codegen_kernels == m.codegen_kernels; i++) usleep(10000);
  CHECK_OK(tpurt_elementwise(S, &pr, &o, &in, 1, NULL, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
  check_down(S, b[0].got, b[0].d, b[0].bytes);
  tpurt_defer_stats z = stats();
  CHECK_EQ(z.codegen_launches_compiled, a.codegen_launches_compiled + 1);
  size_t nan_signs = 0;
  CHECK_EQ(first_difference(&b[0], first, &nan_signs), b[0].bytes);
  g_nan_signs += nan_signs;
  CHECK(z.codegen_compile_seconds > 0);
  free(first);
  for (int i = 0; i < 2; i++) freebuf(&b[i]);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  unsetenv("CC");
  tpurt__codegen_reset();
  char info[512];
  if (!tpurt_codegen_info(info, sizeof info)) {
    printf("skipped: %s\n", info);
    return 0;
  }
  printf("generated kernels: %s\n", info);
  int64_t s1[1] = {1}, s7[1] = {7}, sbig[1] = {1000003}, s2[2] = {37, 53}, s3[2] = {1000, 3};
  chains(TPURT_F32, s1, 1);
  chains(TPURT_F32, s7, 1);
  chains(TPURT_F32, sbig, 1);
  chains(TPURT_F32, s2, 2);
  chains(TPURT_F64, s3, 2);
  for (int layout = 0; layout < 3; layout++) {
    broadcasts(37, 53, layout);
    broadcasts(300, 3, layout);
  }
  broadcasts(1, 1000003, 0);
  casts(TPURT_BF16, TPURT_BF16, TPURT_BF16, 1000003);
  casts(TPURT_F16, TPURT_F16, TPURT_F16, 70001);
  casts(TPURT_I32, TPURT_F32, TPURT_I8, 7);
  casts(TPURT_F32, TPURT_I32, TPURT_F64, 4097);
  casts(TPURT_BF16, TPURT_U8, TPURT_BOOL, 1000);
  masks(1000, 3);
  masks(3, 1000);
  masks(1, 1);
  in_place(100003);
  ints(5003, 0);
  ints(5003, 1);
  complexes(2049);
  rng(TPURT_F32, 1, 1000003);
  rng(TPURT_F32, 513, 7);
  rng(TPURT_F64, 3, 999);
  residual_dropout(1024, 128);
  residual_dropout(37, 1001);
  interleaved(64, 16);
  interleaved(7, 1001);
  failures();
  background();
  printf("%d programs compared, bitwise equal (%zu NaN results of two-NaN operations with the other NaN's sign)\n",
         g_cases, g_nan_signs);
  TEST_MAIN_END();
}
