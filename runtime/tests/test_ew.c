/* test_ew.c — elementwise programs: float ops against a double reference
 * (NaN, inf, -0 included), integer wrap and division semantics, division by
 * zero as an asynchronous error, bf16/f16 rounding at the store, broadcast
 * (stride 0), negative strides, gather mode (small inner dims), in-place
 * aliasing, blocks crossing the parallel split, multi-instruction programs,
 * program validation. */
#define _GNU_SOURCE
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static tpurt_view view1(tpurt_devptr p, tpurt_dtype dt, int64_t n, int64_t st) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p;
  v.dtype = dt;
  v.ndim = 1;
  v.sizes[0] = n;
  v.strides[0] = st;
  return v;
}

static tpurt_devptr dev_from(const void *h, size_t bytes) {
  tpurt_devptr d;
  CHECK_OK(tpurt_malloc(0, bytes ? bytes : 1, S, &d));
  if (bytes) CHECK_OK(tpurt_memcpy_h2d(S, d, h, bytes, 0));
  return d;
}

static tpurt_ew_program prog1(tpurt_ew_op op, tpurt_dtype compute, int nsrc, double p0, double p1) {
  if (nsrc < 0 || nsrc > 3) { /* an op reads at most 3 sources (and the loads fit the program) */
    fprintf(stderr, "prog1: %d sources\n", nsrc);
    abort();
  }
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = compute;
  for (int i = 0; i < nsrc; i++) {
    pr.inst[i].op = TPURT_EW_LOAD;
    pr.inst[i].dst = (uint8_t)i;
    pr.inst[i].p[0] = i;
  }
  tpurt_ew_inst *I = &pr.inst[nsrc];
  I->op = (uint16_t)op;
  I->dst = (uint8_t)nsrc;
  for (int i = 0; i < nsrc; i++) I->src[i] = (uint8_t)i;
  I->p[0] = p0;
  I->p[1] = p1;
  pr.ninst = nsrc + 1;
  pr.nout = 1;
  pr.out_reg[0] = (uint8_t)nsrc;
  return pr;
}

static int same(double got, double want, double rtol, double atol) {
  if (want != want) return got != got;
  if (isinf(want)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want);
}

static const double VALS[] = {0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -3.75, 7.0, 0.001, -20.0, 30.0, 1e-3, 100.0,
                              -100.0, NAN, INFINITY, -INFINITY, 0.9, -0.999};
#define NV ((int)(sizeof VALS / sizeof VALS[0]))

/* double reference of the real ops under test */
static double ref(tpurt_ew_op op, double x, double y, double z, double p0, double p1) {
  switch (op) {
    case TPURT_EW_NEG: return -x;
    case TPURT_EW_ABS: return fabs(x);
    case TPURT_EW_SQRT: return sqrt(x);
    case TPURT_EW_EXP: return exp(x);
    case TPURT_EW_LOG: return log(x);
    case TPURT_EW_TANH: return tanh(x);
    case TPURT_EW_SIGMOID: return 1 / (1 + exp(-x));
    case TPURT_EW_SILU: return x / (1 + exp(-x));
    case TPURT_EW_GELU: return 0.5 * x * (1 + erf(x * M_SQRT1_2));
    case TPURT_EW_GELU_TANH: return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case TPURT_EW_RELU: return x != x ? x : (x < 0 ? 0 : x);
    case TPURT_EW_ERFINV: return fabs(x) < 1 ? erf(x) : NAN; /* checked as erf(erfinv(x)) below */
    case TPURT_EW_ROUND: return nearbyint(x);
    case TPURT_EW_SIGN: return (x > 0) - (x < 0);
    case TPURT_EW_ISNAN: return x != x;
    case TPURT_EW_ADD: return x + p0 * y;
    case TPURT_EW_MUL: return x * y;
    case TPURT_EW_DIV: return x / y;
    case TPURT_EW_REMAINDER: {
      double m = fmod(x, y);
      if (m != 0 && ((y < 0) != (m < 0))) m += y;
      return m;
    }
    case TPURT_EW_DIV_FLOOR:
      if (y == 0) return x / y;
      if (isinf(x) || x != x || y != y) return NAN;
      {
        double m = fmod(x, y), q = (x - m) / y;
        if (m != 0 && ((y < 0) != (m < 0))) q -= 1;
        return q == 0 ? copysign(0.0, x / y) : floor(q + 0.5);
      }
    case TPURT_EW_MAXIMUM: return (x != x || y != y) ? NAN : (x > y ? x : y);
    case TPURT_EW_MINIMUM: return (x != x || y != y) ? NAN : (x < y ? x : y);
    case TPURT_EW_FMAX: return fmax(x, y);
    case TPURT_EW_LT: return x < y;
    case TPURT_EW_WHERE: return x != 0 ? y : z;
    case TPURT_EW_CLAMP: return (x != x || y != y || z != z) ? NAN : fmin(fmax(x, y), z);
    case TPURT_EW_ADDCMUL: return x + p0 * y * z;
    case TPURT_EW_HARDTANH: return x != x ? x : (x < p0 ? p0 : (x > p1 ? p1 : x));
    default: return NAN;
  }
}

static void test_float_ops(tpurt_dtype dt) {
  static const tpurt_ew_op unary[] = {TPURT_EW_NEG, TPURT_EW_ABS, TPURT_EW_SQRT, TPURT_EW_EXP, TPURT_EW_LOG,
                                      TPURT_EW_TANH, TPURT_EW_SIGMOID, TPURT_EW_SILU, TPURT_EW_GELU,
                                      TPURT_EW_GELU_TANH, TPURT_EW_RELU, TPURT_EW_ROUND, TPURT_EW_SIGN,
                                      TPURT_EW_ISNAN, TPURT_EW_HARDTANH};
  static const tpurt_ew_op binary[] = {TPURT_EW_ADD, TPURT_EW_MUL, TPURT_EW_DIV, TPURT_EW_REMAINDER,
                                       TPURT_EW_DIV_FLOOR, TPURT_EW_MAXIMUM, TPURT_EW_MINIMUM, TPURT_EW_FMAX,
                                       TPURT_EW_LT};
  static const tpurt_ew_op ternary[] = {TPURT_EW_WHERE, TPURT_EW_CLAMP, TPURT_EW_ADDCMUL};
  int f32 = dt == TPURT_F32;
  size_t es = f32 ? 4 : 8;
  double rtol = f32 ? 4e-6 : 1e-13, atol = f32 ? 1e-30 : 1e-300;
  /* all pairs / triples of VALS, flattened */
  int n3 = NV * NV * NV;
  double *xs = malloc(sizeof(double) * n3), *ys = malloc(sizeof(double) * n3), *zs = malloc(sizeof(double) * n3);
  void *hx = malloc(es * n3), *hy = malloc(es * n3), *hz = malloc(es * n3), *ho = malloc(es * n3);
  for (int i = 0; i < n3; i++) {
    xs[i] = VALS[i % NV];
    ys[i] = VALS[(i / NV) % NV];
    zs[i] = VALS[i / (NV * NV)];
    if (f32) {
      ((float *)hx)[i] = (float)xs[i];
      ((float *)hy)[i] = (float)ys[i];
      ((float *)hz)[i] = (float)zs[i];
      xs[i] = (float)xs[i];
      ys[i] = (float)ys[i];
      zs[i] = (float)zs[i];
    } else {
      ((double *)hx)[i] = xs[i];
      ((double *)hy)[i] = ys[i];
      ((double *)hz)[i] = zs[i];
    }
  }
  tpurt_devptr dx = dev_from(hx, es * n3), dy = dev_from(hy, es * n3), dz = dev_from(hz, es * n3), dout;
  CHECK_OK(tpurt_malloc(0, es * n3, S, &dout));
  tpurt_view ins[3] = {view1(dx, dt, n3, 1), view1(dy, dt, n3, 1), view1(dz, dt, n3, 1)};
  tpurt_view out = view1(dout, dt, n3, 1);
  for (int g = 0; g < 3; g++) {
    const tpurt_ew_op *ops = g == 0 ? unary : g == 1 ? binary : ternary;
    int nops = g == 0 ? (int)(sizeof unary / sizeof unary[0])
                      : g == 1 ? (int)(sizeof binary / sizeof binary[0]) : (int)(sizeof ternary / sizeof ternary[0]);
    for (int k = 0; k < nops; k++) {
      tpurt_ew_op op = ops[k];
      double p0 = op == TPURT_EW_HARDTANH ? -1.0 : (op == TPURT_EW_ADD || op == TPURT_EW_ADDCMUL ? 0.5 : 0);
      double p1 = op == TPURT_EW_HARDTANH ? 2.0 : 0;
      tpurt_ew_program pr = prog1(op, dt, g + 1, p0, p1);
      CHECK_OK(tpurt_elementwise(S, &pr, &out, ins, g + 1, NULL, 0));
      CHECK_OK(tpurt_memcpy_d2h(S, ho, dout, es * n3, 0));
      int bad = 0;
      for (int i = 0; i < n3 && bad < 3; i++) {
        double got = f32 ? ((float *)ho)[i] : ((double *)ho)[i];
        double want = ref(op, xs[i], ys[i], zs[i], p0, p1);
        if (f32) want = (float)want;
        double tol_a = atol;
        if (op == TPURT_EW_GELU || op == TPURT_EW_GELU_TANH || op == TPURT_EW_ADDCMUL) tol_a = f32 ? 1e-6 : 1e-15;
        if (!same(got, want, rtol, tol_a)) {
          fprintf(stderr, "%s %s(%g, %g, %g) = %.9g, want %.9g\n", tpurt_dtype_name(dt), tpurt_ew_op_name(op), xs[i],
                  ys[i], zs[i], got, want);
          bad++;
          g_failures++;
        }
      }
    }
  }
  tpurt_free(dx);
  tpurt_free(dy);
  tpurt_free(dz);
  tpurt_free(dout);
  free(xs), free(ys), free(zs), free(hx), free(hy), free(hz), free(ho);
}

/* fast f32 gelu / exp over a dense range: relative error within a few ulp */
static void test_fast_paths(void) {
  int n = 200001;
  float *h = malloc(4 * n), *o = malloc(4 * n);
  for (int i = 0; i < n; i++) h[i] = -20.0f + 40.0f * (float)i / (float)(n - 1);
  tpurt_devptr d = dev_from(h, 4 * (size_t)n), dout;
  CHECK_OK(tpurt_malloc(0, 4 * (size_t)n, S, &dout));
  tpurt_view in = view1(d, TPURT_F32, n, 1), out = view1(dout, TPURT_F32, n, 1);
  tpurt_ew_op ops[] = {TPURT_EW_GELU, TPURT_EW_EXP, TPURT_EW_SIGMOID, TPURT_EW_GELU_TANH};
  for (int k = 0; k < 4; k++) {
    tpurt_ew_program pr = prog1(ops[k], TPURT_F32, 1, 0, 0);
    CHECK_OK(tpurt_elementwise(S, &pr, &out, &in, 1, NULL, 0));
    CHECK_OK(tpurt_memcpy_d2h(S, o, dout, 4 * (size_t)n, 0));
    double worst = 0;
    for (int i = 0; i < n; i++) {
      double want = ops[k] == TPURT_EW_GELU ? 0.5 * h[i] * erfc(-h[i] * M_SQRT1_2) : ref(ops[k], h[i], 0, 0, 0, 0);
      if (fabs(want) < 1e-36) continue; /* float subnormals */
      /* tanh-gelu's tail: the f32 argument itself carries ~1e-5 relative error */
      if (ops[k] == TPURT_EW_GELU_TANH && fabs(want) < 1e-12) continue;
      if (ops[k] == TPURT_EW_GELU_TANH && sqrt(2 / M_PI) * (h[i] + 0.044715 * h[i] * h[i] * h[i]) < -9.010913) {
        /* where float tanh saturates to -1, PyTorch's 0.5 x (1 + tanh u) is -0.0 */
        if (!(o[i] == 0 && signbit(o[i]))) worst = 1;
        continue;
      }
      double e = fabs(o[i] - want) / fabs(want);
      if (e > worst) {
        worst = e;
        if (getenv("EW_DEBUG")) fprintf(stderr, "  %s x=%.9g got %.9g want %.9g\n", tpurt_ew_op_name(ops[k]), h[i], o[i], want);
      }
    }
    if (worst > (ops[k] == TPURT_EW_GELU_TANH ? 1e-5 : 5e-7)) {
      fprintf(stderr, "fast %s: worst relative error %g\n", tpurt_ew_op_name(ops[k]), worst);
      g_failures++;
    }
  }
  tpurt_free(d);
  tpurt_free(dout);
  free(h), free(o);
}

static void test_int_ops(void) {
  int64_t a[] = {7, -7, 7, -7, INT64_MIN, 5, 0, 100, -1, 3};
  int64_t b[] = {2, 2, -2, -2, -1, 3, 4, 7, 5, 70};
  int n = 10;
  tpurt_devptr da = dev_from(a, sizeof a), db = dev_from(b, sizeof b), dout;
  CHECK_OK(tpurt_malloc(0, sizeof a, S, &dout));
  tpurt_view ins[2] = {view1(da, TPURT_I64, n, 1), view1(db, TPURT_I64, n, 1)};
  tpurt_view out = view1(dout, TPURT_I64, n, 1);
  int64_t o[10];
  struct {
    tpurt_ew_op op;
    int64_t want[10];
  } cases[] = {
      {TPURT_EW_DIV_TRUNC, {3, -3, -3, 3, INT64_MIN, 1, 0, 14, 0, 0}},
      {TPURT_EW_DIV_FLOOR, {3, -4, -4, 3, INT64_MIN, 1, 0, 14, -1, 0}},
      {TPURT_EW_REMAINDER, {1, 1, -1, -1, 0, 2, 0, 2, 4, 3}},
      {TPURT_EW_FMOD, {1, -1, 1, -1, 0, 2, 0, 2, -1, 3}},
      {TPURT_EW_POW, {49, 49, 0, 0, 0, 125, 0, 100000000000000, -1, 2187 * 0 + 0}},
      {TPURT_EW_RSHIFT, {1, -2, 0, -1, -1, 0, 0, 0, -1, 0}},
  };
  /* 3**70 wraps: compute the expected value with unsigned arithmetic */
  uint64_t w = 1;
  for (int i = 0; i < 70; i++) w *= 3u;
  cases[4].want[9] = (int64_t)w;
  for (unsigned c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tpurt_ew_program pr = prog1(cases[c].op, TPURT_I64, 2, 0, 0);
    CHECK_OK(tpurt_elementwise(S, &pr, &out, ins, 2, NULL, 0));
    CHECK_OK(tpurt_memcpy_d2h(S, o, dout, sizeof o, 0));
    for (int i = 0; i < n; i++)
      if (o[i] != cases[c].want[i]) {
        fprintf(stderr, "%s(%lld, %lld) = %lld, want %lld\n", tpurt_ew_op_name(cases[c].op), (long long)a[i],
                (long long)b[i], (long long)o[i], (long long)cases[c].want[i]);
        g_failures++;
      }
  }
  /* int8 wrap at the store: 100 + 100 -> -56; uint8 neg */
  int8_t i8a[4] = {100, -128, 127, 5}, i8o[4];
  tpurt_devptr d8 = dev_from(i8a, 4), d8o;
  CHECK_OK(tpurt_malloc(0, 4, S, &d8o));
  tpurt_view v8 = view1(d8, TPURT_I8, 4, 1), v8o = view1(d8o, TPURT_I8, 4, 1);
  tpurt_view v8s[2] = {v8, v8};
  tpurt_ew_program pr = prog1(TPURT_EW_ADD, TPURT_I64, 2, 1, 0);
  CHECK_OK(tpurt_elementwise(S, &pr, &v8o, v8s, 2, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, i8o, d8o, 4, 0));
  CHECK_EQ(i8o[0], -56);
  CHECK_EQ(i8o[1], 0);
  CHECK_EQ(i8o[2], -2);
  CHECK_EQ(i8o[3], 10);
  /* division by zero: asynchronous error at the next sync, stream usable after */
  int64_t z[10] = {1, 1, 1, 0, 1, 1, 1, 1, 1, 1};
  tpurt_devptr dz = dev_from(z, sizeof z);
  tpurt_view zins[2] = {ins[0], view1(dz, TPURT_I64, n, 1)};
  tpurt_ew_op zops[] = {TPURT_EW_DIV_TRUNC, TPURT_EW_DIV_FLOOR, TPURT_EW_REMAINDER, TPURT_EW_FMOD};
  for (int k = 0; k < 4; k++) {
    tpurt_ew_program pz = prog1(zops[k], TPURT_I64, 2, 0, 0);
    tpurt_status st = tpurt_elementwise(S, &pz, &out, zins, 2, NULL, 0);
    if (st == TPURT_OK) st = tpurt_stream_synchronize(S);
    CHECK_EQ(st, TPURT_ERR_KERNEL);
    CHECK(strstr(tpurt_last_error(), "ZeroDivisionError") != NULL);
  }
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_ew_program pok = prog1(TPURT_EW_MUL, TPURT_I64, 2, 0, 0);
  CHECK_OK(tpurt_elementwise(S, &pok, &out, ins, 2, NULL, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(da), tpurt_free(db), tpurt_free(dout), tpurt_free(d8), tpurt_free(d8o), tpurt_free(dz);
}

/* bf16 / f16 inputs computed in f32 and rounded once at the store */
static void test_low_precision(void) {
  uint16_t hb[3] = {0x3f80 /* 1.0 */, 0x3b80 /* 2^-8 */, 0x4040 /* 3.0 */}, ob[3];
  tpurt_devptr d = dev_from(hb, sizeof hb), dout;
  CHECK_OK(tpurt_malloc(0, sizeof hb, S, &dout));
  tpurt_view ins[2] = {view1(d, TPURT_BF16, 1, 0), view1(d + 2, TPURT_BF16, 1, 0)};
  ins[0].sizes[0] = ins[1].sizes[0] = 3;
  tpurt_view out = view1(dout, TPURT_BF16, 3, 1);
  /* 1 + 2^-8 is a tie in bf16: rounds to even (1.0) */
  tpurt_ew_program pr = prog1(TPURT_EW_ADD, TPURT_F32, 2, 1, 0);
  CHECK_OK(tpurt_elementwise(S, &pr, &out, ins, 2, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, ob, dout, sizeof ob, 0));
  CHECK_EQ(ob[0], 0x3f80);
  /* f16 overflow to inf */
  uint16_t hh[2] = {0x7bff /* 65504 */, 0x3c00}, oh[2];
  tpurt_devptr dh = dev_from(hh, sizeof hh), dho;
  CHECK_OK(tpurt_malloc(0, sizeof hh, S, &dho));
  tpurt_view hin[2] = {view1(dh, TPURT_F16, 2, 1), view1(dh, TPURT_F16, 2, 1)};
  tpurt_view hout = view1(dho, TPURT_F16, 2, 1);
  CHECK_OK(tpurt_elementwise(S, &pr, &hout, hin, 2, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, oh, dho, sizeof oh, 0));
  CHECK_EQ(oh[0], 0x7c00);
  CHECK_EQ(oh[1], 0x4000);
  tpurt_free(d), tpurt_free(dout), tpurt_free(dh), tpurt_free(dho);
}

/* strides: broadcast, negative, 2-D gather mode, in-place, parallel split,
 * a fused program with scalars, mixed dtypes and two outputs */
static void test_layouts(void) {
  /* [R, C] - [C] broadcast with a transposed (column-major) output */
  for (int mode = 0; mode < 2; mode++) {
    int64_t R = mode ? 700 : 3000, C = mode ? 5 : 1000; /* mode 1: small inner dim (gather) */
    int64_t n = R * C;
    float *a = malloc(4 * n), *b = malloc(4 * C), *o = malloc(4 * n);
    for (int64_t i = 0; i < n; i++) a[i] = (float)(i % 977) * 0.5f;
    for (int64_t j = 0; j < C; j++) b[j] = (float)j;
    tpurt_devptr da = dev_from(a, 4 * n), db = dev_from(b, 4 * C), dout;
    CHECK_OK(tpurt_malloc(0, 4 * n, S, &dout));
    tpurt_view va, vb, vo;
    memset(&va, 0, sizeof va);
    va.ptr = da, va.dtype = TPURT_F32, va.ndim = 2, va.sizes[0] = R, va.sizes[1] = C, va.strides[0] = C,
    va.strides[1] = 1;
    vb = va;
    vb.ptr = db, vb.strides[0] = 0;
    vo = va;
    vo.ptr = dout, vo.strides[0] = 1, vo.strides[1] = R; /* transposed output */
    tpurt_view ins[2] = {va, vb};
    tpurt_ew_program pr = prog1(TPURT_EW_SUB, TPURT_F32, 2, 1, 0);
    CHECK_OK(tpurt_elementwise(S, &pr, &vo, ins, 2, NULL, 0));
    CHECK_OK(tpurt_memcpy_d2h(S, o, dout, 4 * n, 0));
    int ok = 1;
    for (int64_t i = 0; i < R && ok; i++)
      for (int64_t j = 0; j < C; j++) ok &= o[j * R + i] == a[i * C + j] - b[j];
    CHECK(ok);
    /* in-place, negative stride input: a = a + reversed(a) */
    tpurt_view rev = view1(da + 4 * (n - 1), TPURT_F32, n, -1), fwd = view1(da, TPURT_F32, n, 1);
    tpurt_view ins2[2] = {fwd, rev};
    float *back = malloc(4 * n);
    tpurt_ew_program pa = prog1(TPURT_EW_ADD, TPURT_F32, 2, 1, 0);
    /* out of place first (in-place with a reversed alias would overlap inexactly) */
    tpurt_view o1 = view1(dout, TPURT_F32, n, 1);
    CHECK_OK(tpurt_elementwise(S, &pa, &o1, ins2, 2, NULL, 0));
    CHECK_OK(tpurt_memcpy_d2h(S, back, dout, 4 * n, 0));
    ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= back[i] == a[i] + a[n - 1 - i];
    CHECK(ok);
    tpurt_view ins3[2] = {fwd, fwd};
    tpurt_ew_program pm = prog1(TPURT_EW_MUL, TPURT_F32, 2, 0, 0);
    CHECK_OK(tpurt_elementwise(S, &pm, &fwd, ins3, 2, NULL, 0)); /* exact in-place alias */
    CHECK_OK(tpurt_memcpy_d2h(S, back, da, 4 * n, 0));
    ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= back[i] == a[i] * a[i];
    CHECK(ok);
    free(a), free(b), free(o), free(back);
    tpurt_free(da), tpurt_free(db), tpurt_free(dout);
  }
  /* fused: out0 (f64) = (x_f16 * s0 + x_i32) ; out1 (bool) = out0 > s1, with n crossing many blocks */
  int64_t n = 100003;
  uint16_t *xh = malloc(2 * n);
  int32_t *xi = malloc(4 * n);
  for (int64_t i = 0; i < n; i++) {
    xh[i] = 0x3c00; /* 1.0 */
    xi[i] = (int32_t)(i % 100) - 50;
  }
  tpurt_devptr dh = dev_from(xh, 2 * n), di = dev_from(xi, 4 * n), d0, d1;
  CHECK_OK(tpurt_malloc(0, 8 * n, S, &d0));
  CHECK_OK(tpurt_malloc(0, n, S, &d1));
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_F64;
  tpurt_ew_inst *I = pr.inst;
  I[0] = (tpurt_ew_inst){TPURT_EW_LOAD, 0, {0, 0, 0}, {0, 0, 0, 0}};
  I[1] = (tpurt_ew_inst){TPURT_EW_SCALAR, 1, {0, 0, 0}, {0, 0, 0, 0}};
  I[2] = (tpurt_ew_inst){TPURT_EW_MUL, 2, {0, 1, 0}, {0, 0, 0, 0}};
  I[3] = (tpurt_ew_inst){TPURT_EW_LOAD, 3, {0, 0, 0}, {1, 0, 0, 0}};
  I[4] = (tpurt_ew_inst){TPURT_EW_ADD, 2, {2, 3, 0}, {1, 0, 0, 0}};
  I[5] = (tpurt_ew_inst){TPURT_EW_SCALAR, 4, {0, 0, 0}, {1, 0, 0, 0}};
  I[6] = (tpurt_ew_inst){TPURT_EW_GT, 5, {2, 4, 0}, {0, 0, 0, 0}};
  pr.ninst = 7;
  pr.nout = 2;
  pr.out_reg[0] = 2;
  pr.out_reg[1] = 5;
  double sc[2] = {2.5, 10.0};
  tpurt_view outs[2] = {view1(d0, TPURT_F64, n, 1), view1(d1, TPURT_BOOL, n, 1)};
  tpurt_view ins[2] = {view1(dh, TPURT_F16, n, 1), view1(di, TPURT_I32, n, 1)};
  CHECK_OK(tpurt_elementwise(S, &pr, outs, ins, 2, sc, 2));
  double *o0 = malloc(8 * n);
  uint8_t *o1 = malloc(n);
  CHECK_OK(tpurt_memcpy_d2h(S, o0, d0, 8 * n, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, o1, d1, n, 0));
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    double w = 2.5 + (double)xi[i];
    ok &= o0[i] == w && o1[i] == (w > 10.0);
  }
  CHECK(ok);
  /* validation errors */
  tpurt_ew_program bad = pr;
  bad.inst[2].src[1] = 9; /* unwritten register */
  CHECK_ST(tpurt_elementwise(S, &bad, outs, ins, 2, sc, 2), TPURT_ERR_INVALID_ARGUMENT);
  bad = pr;
  bad.inst[3].p[0] = 5; /* input out of range */
  CHECK_ST(tpurt_elementwise(S, &bad, outs, ins, 2, sc, 2), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_elementwise(S, &pr, outs, ins, 2, sc, 1), TPURT_ERR_INVALID_ARGUMENT); /* scalar 1 missing */
  bad = pr;
  bad.compute = TPURT_I32;
  CHECK_ST(tpurt_elementwise(S, &bad, outs, ins, 2, sc, 2), TPURT_ERR_INVALID_ARGUMENT);
  bad = pr;
  bad.inst[2].op = TPURT_EW_NUM_OPS;
  CHECK_ST(tpurt_elementwise(S, &bad, outs, ins, 2, sc, 2), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_ew_program pe = prog1(TPURT_EW_EXP, TPURT_I64, 1, 0, 0);
  CHECK_ST(tpurt_elementwise(S, &pe, outs, ins, 1, NULL, 0), TPURT_ERR_NOT_SUPPORTED);
  tpurt_view shorter = ins[1];
  shorter.sizes[0] = n - 1;
  tpurt_view ins_bad[2] = {ins[0], shorter};
  CHECK_ST(tpurt_elementwise(S, &pr, outs, ins_bad, 2, sc, 2), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_STR(tpurt_ew_op_name(TPURT_EW_GELU_BACKWARD), "gelu_backward");
  CHECK_STR(tpurt_ew_op_name(TPURT_EW_ADD), "add");
  /* empty output: nothing to do */
  tpurt_view empty[2] = {view1(d0, TPURT_F64, 0, 1), view1(d1, TPURT_BOOL, 0, 1)};
  tpurt_view empty_in[2] = {view1(dh, TPURT_F16, 0, 1), view1(di, TPURT_I32, 0, 1)};
  CHECK_OK(tpurt_elementwise(S, &pr, empty, empty_in, 2, sc, 2));
  CHECK_OK(tpurt_stream_synchronize(S));
  free(xh), free(xi), free(o0), free(o1);
  tpurt_free(dh), tpurt_free(di), tpurt_free(d0), tpurt_free(d1);
}

static void test_complex(void) {
  float a[4] = {1, 2, 3, -1}, o[4];
  tpurt_devptr d = dev_from(a, sizeof a), dout;
  CHECK_OK(tpurt_malloc(0, sizeof a, S, &dout));
  tpurt_view ins[2] = {view1(d, TPURT_C64, 2, 1), view1(d, TPURT_C64, 2, 1)};
  tpurt_view out = view1(dout, TPURT_C64, 2, 1);
  tpurt_ew_program pr = prog1(TPURT_EW_MUL, TPURT_C64, 2, 0, 0);
  CHECK_OK(tpurt_elementwise(S, &pr, &out, ins, 2, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, o, dout, sizeof o, 0));
  CHECK_NEAR(o[0], -3, 1e-6); /* (1+2i)^2 = -3+4i */
  CHECK_NEAR(o[1], 4, 1e-6);
  CHECK_NEAR(o[2], 8, 1e-6); /* (3-i)^2 = 8-6i */
  CHECK_NEAR(o[3], -6, 1e-6);
  tpurt_view rout = view1(dout, TPURT_F32, 2, 1);
  tpurt_ew_program pa = prog1(TPURT_EW_ABS, TPURT_C64, 1, 0, 0);
  CHECK_OK(tpurt_elementwise(S, &pa, &rout, ins, 1, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, o, dout, 8, 0));
  CHECK_NEAR(o[0], sqrt(5.0), 1e-6);
  CHECK_NEAR(o[1], sqrt(10.0), 1e-6);
  tpurt_free(d), tpurt_free(dout);
}

/* A program that uses every register, on the widest compute type: the
 * kernel's register blocks must fit the worker threads whatever the
 * program (x + x + ... = 32 x, in complex128 over two pool chunks). */
static void test_all_registers(void) {
  enum { N = 100000 };
  double *h = malloc(sizeof(double) * 2 * N), *o = malloc(sizeof(double) * 2 * N);
  for (int i = 0; i < 2 * N; i++) h[i] = (double)(i % 97) - 48.0;
  tpurt_devptr d = dev_from(h, sizeof(double) * 2 * N), dout;
  CHECK_OK(tpurt_malloc(0, sizeof(double) * 2 * N, S, &dout));
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_C128;
  pr.inst[0].op = TPURT_EW_LOAD; /* r0 = x */
  for (int r = 1; r < TPURT_EW_MAX_REGS; r++) { /* r = r-1 + 1 * r0 */
    pr.inst[r].op = TPURT_EW_ADD;
    pr.inst[r].dst = (uint8_t)r;
    pr.inst[r].src[0] = (uint8_t)(r - 1);
    pr.inst[r].src[1] = 0;
    pr.inst[r].p[0] = 1.0;
  }
  pr.ninst = TPURT_EW_MAX_REGS;
  pr.nout = 1;
  pr.out_reg[0] = TPURT_EW_MAX_REGS - 1;
  tpurt_view in = view1(d, TPURT_C128, N, 1), out = view1(dout, TPURT_C128, N, 1);
  CHECK_OK(tpurt_elementwise(S, &pr, &out, &in, 1, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, o, dout, sizeof(double) * 2 * N, 0));
  int bad = 0;
  for (int i = 0; i < 2 * N; i++) bad += o[i] != TPURT_EW_MAX_REGS * h[i];
  CHECK_EQ(bad, 0);
  tpurt_free(d), tpurt_free(dout);
  free(h), free(o);
}

/* special-function instructions against known values and identities (f64
 * and f32 compute, NaN / inf / empty edge cases) */
static double run_special(tpurt_ew_op op, tpurt_dtype ct, int nsrc, double x, double y, double p0) {
  double hx[2] = {x, y}, o = 0;
  tpurt_devptr d = dev_from(hx, sizeof hx), dout;
  CHECK_OK(tpurt_malloc(0, 8, S, &dout));
  tpurt_view ins[2] = {view1(d, TPURT_F64, 1, 1), view1(d + 8, TPURT_F64, 1, 1)};
  tpurt_view out = view1(dout, TPURT_F64, 1, 1);
  tpurt_ew_program pr = prog1(op, ct, nsrc, p0, 0);
  CHECK_OK(tpurt_elementwise(S, &pr, &out, ins, nsrc, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, &o, dout, 8, 0));
  tpurt_free(d), tpurt_free(dout);
  return o;
}

static void test_special(void) {
  static const struct {
    tpurt_ew_op op;
    int nsrc;
    double x, y, p0, want;
  } cases[] = {
      {TPURT_EW_I0, 1, 0.0, 0, 0, 1.0},
      {TPURT_EW_I0, 1, 1.0, 0, 0, 1.2660658777520083356},
      {TPURT_EW_I0, 1, -50.0, 0, 0, 2.9325537838493363e+20},
      {TPURT_EW_I0E, 1, 100.0, 0, 0, 0.039944379299096683},
      {TPURT_EW_I1, 1, -1.0, 0, 0, -0.56515910399248502721},
      {TPURT_EW_I1E, 1, 2.0, 0, 0, 0.21526928924893765},
      {TPURT_EW_BESSEL_K0, 1, 1.0, 0, 0, 0.42102443824070833334},
      {TPURT_EW_BESSEL_K1, 1, 1.0, 0, 0, 0.60190723019723457474},
      {TPURT_EW_BESSEL_K0, 1, 5.0, 0, 0, 0.0036910983340425942},
      {TPURT_EW_BESSEL_K1E, 1, 50.0, 0, 0, 0.17856655855881557},
      {TPURT_EW_BESSEL_K0, 1, 0.0, 0, 0, INFINITY},
      {TPURT_EW_BESSEL_K0, 1, -1.0, 0, 0, NAN},
      {TPURT_EW_BESSEL_J0, 1, 2.404825557695773, 0, 0, 0.0},
      {TPURT_EW_AIRY_AI, 1, 0.0, 0, 0, 0.35502805388781723926},
      {TPURT_EW_AIRY_AI, 1, 3.0, 0, 0, 0.0065911393574607191},
      {TPURT_EW_AIRY_AI, 1, -10.0, 0, 0, 0.040241238486443191},
      {TPURT_EW_SPHERICAL_BESSEL_J0, 1, 0.0, 0, 0, 1.0},
      {TPURT_EW_POLYGAMMA, 1, 1.0, 0, 1, M_PI * M_PI / 6},
      {TPURT_EW_POLYGAMMA, 1, 1.0, 0, 2, -2.4041138063191885708},
      {TPURT_EW_POLYGAMMA, 1, 0.0, 0, 1, INFINITY},
      {TPURT_EW_ZETA, 2, 4.0, 1.0, 0, M_PI * M_PI * M_PI * M_PI / 90},
      {TPURT_EW_ZETA, 2, 0.5, 1.0, 0, NAN},
      {TPURT_EW_IGAMMA, 2, 1.0, 2.0, 0, 0.86466471676338730},
      {TPURT_EW_IGAMMAC, 2, 3.0, 1.5, 0, 0.80884683053805813},
      {TPURT_EW_IGAMMA, 2, 0.0, 0.0, 0, NAN},
      {TPURT_EW_NDTRI, 1, 0.975, 0, 0, 1.9599639845400542},
      {TPURT_EW_NDTRI, 1, 1e-300, 0, 0, -37.047096299361199},
      {TPURT_EW_LOG_NDTR, 1, -40.0, 0, 0, -804.60844201375379},
      {TPURT_EW_ERFCX, 1, 30.0, 0, 0, 0.018795888861416751},
      {TPURT_EW_ENTR, 1, 0.5, 0, 0, 0.34657359027997264},
      {TPURT_EW_SINC, 1, 0.5, 0, 0, 0.63661977236758134},
      {TPURT_EW_XLOG1PY, 2, 0.0, NAN, 0, NAN},
      {TPURT_EW_XLOG1PY, 2, 0.0, -1.0, 0, 0.0},
      {TPURT_EW_LOGADDEXP, 2, 1000.0, 1000.0, 0, 1000.6931471805599453},
      {TPURT_EW_LOGADDEXP2, 2, -INFINITY, -INFINITY, 0, -INFINITY},
      {TPURT_EW_HEAVISIDE, 2, 0.0, 0.5, 0, 0.5},
      {TPURT_EW_HEAVISIDE, 2, -3.0, 0.5, 0, 0.0},
      {TPURT_EW_CHEBYSHEV_T, 2, 0.3, 3.0, 0, 4 * 0.027 - 3 * 0.3},
      {TPURT_EW_CHEBYSHEV_T, 2, 0.3, 20.0, 0, 0.98213013105489211},
      {TPURT_EW_CHEBYSHEV_U, 2, -1.0, 5.0, 0, -6.0},
      {TPURT_EW_HERMITE_H, 2, 0.5, 3.0, 0, 8 * 0.125 - 12 * 0.5},
      {TPURT_EW_HERMITE_HE, 2, 2.0, -1.0, 0, 0.0},
      {TPURT_EW_LAGUERRE_L, 2, 1.0, 2.0, 0, -0.5},
      {TPURT_EW_LEGENDRE_P, 2, 0.5, 2.0, 0, -0.125},
      {TPURT_EW_SHIFTED_CHEBYSHEV_T, 2, 0.75, 2.0, 0, -0.5},
      {TPURT_EW_HARDSHRINK, 1, 0.4, 0, 0.5, 0.0},
      {TPURT_EW_SOFTSHRINK, 1, -2.0, 0, 0.5, -1.5},
      {TPURT_EW_SHRINK_BACKWARD, 2, 3.0, 0.7, 0.5, 3.0},
      {TPURT_EW_ANGLE, 1, -2.0, 0, 0, M_PI},
      {TPURT_EW_SIGNBIT, 1, -0.0, 0, 0, 1.0},
      {TPURT_EW_FREXP_MANTISSA, 1, 12.0, 0, 0, 0.75},
      {TPURT_EW_FREXP_EXPONENT, 1, 12.0, 0, 0, 4.0},
      {TPURT_EW_NEXTAFTER, 2, 1.0, 2.0, 0, 1.0 + 2.220446049250313e-16},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (int f = 0; f < 2; f++) {
      tpurt_dtype ct = f ? TPURT_F32 : TPURT_F64;
      double got = run_special(cases[i].op, ct, cases[i].nsrc, cases[i].x, cases[i].y, cases[i].p0);
      double want = cases[i].want;
      if (f) {
        if (cases[i].op == TPURT_EW_NEXTAFTER) want = nextafterf(1.0f, 2.0f);
        if (cases[i].op == TPURT_EW_I0 && cases[i].x == -50.0) want = (float)want;
        if (cases[i].op == TPURT_EW_NDTRI && cases[i].x < 1e-100) want = -INFINITY; /* 1e-300 is 0 in f32 */
      }
      double tol = f ? 2e-6 : (cases[i].op == TPURT_EW_NDTRI && cases[i].x < 1e-100 ? 1e-5 : 1e-12);
      if (cases[i].op == TPURT_EW_CHEBYSHEV_T && cases[i].y == 20.0) tol = 1e-6;
      if (cases[i].op == TPURT_EW_BESSEL_K1E || cases[i].op == TPURT_EW_IGAMMAC ||
          cases[i].op == TPURT_EW_AIRY_AI || cases[i].op == TPURT_EW_LOG_NDTR)
        tol = f ? 2e-6 : 1e-11;
      if (!same(got, want, tol, cases[i].want == 0 ? 1e-7 : 1e-300)) {
        fprintf(stderr, "special %s (%s) x=%g y=%g: got %.17g want %.17g\n", tpurt_ew_op_name(cases[i].op),
                f ? "f32" : "f64", cases[i].x, cases[i].y, got, want);
        g_failures++;
      }
    }
  }
  /* bf16 nextafter steps one bf16 ulp */
  CHECK(fabs(run_special(TPURT_EW_NEXTAFTER, TPURT_F32, 2, 1.0, 2.0, TPURT_BF16) - 1.0078125) < 1e-12);
  /* empty launch is a no-op */
  tpurt_view e = view1(0, TPURT_F32, 0, 1);
  tpurt_ew_program pr = prog1(TPURT_EW_I0, TPURT_F32, 1, 0, 0);
  CHECK_OK(tpurt_elementwise(S, &pr, &e, &e, 1, NULL, 0));
  /* complex / polar / angle in complex compute */
  double h[4] = {2.0, M_PI / 2, 0, 0};
  tpurt_devptr d = dev_from(h, sizeof h), dout;
  CHECK_OK(tpurt_malloc(0, 16, S, &dout));
  tpurt_view ins[2] = {view1(d, TPURT_F64, 1, 1), view1(d + 8, TPURT_F64, 1, 1)};
  tpurt_view out = view1(dout, TPURT_C128, 1, 1);
  tpurt_ew_program pp = prog1(TPURT_EW_POLAR, TPURT_C128, 2, 0, 0);
  CHECK_OK(tpurt_elementwise(S, &pp, &out, ins, 2, NULL, 0));
  double o[2];
  CHECK_OK(tpurt_memcpy_d2h(S, o, dout, 16, 0));
  CHECK_NEAR(o[0], 0.0, 1e-15);
  CHECK_NEAR(o[1], 2.0, 1e-15);
  tpurt_ew_program pc = prog1(TPURT_EW_COMPLEX, TPURT_C128, 2, 0, 0);
  CHECK_OK(tpurt_elementwise(S, &pc, &out, ins, 2, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, o, dout, 16, 0));
  CHECK(o[0] == 2.0 && o[1] == M_PI / 2);
  /* real-only ops are rejected for complex compute */
  tpurt_ew_program bad = prog1(TPURT_EW_I0, TPURT_C128, 1, 0, 0);
  CHECK_ST(tpurt_elementwise(S, &bad, &out, ins, 1, NULL, 0), TPURT_ERR_NOT_SUPPORTED);
  tpurt_free(d), tpurt_free(dout);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  test_float_ops(TPURT_F32);
  test_float_ops(TPURT_F64);
  test_fast_paths();
  test_int_ops();
  test_low_precision();
  test_layouts();
  test_complex();
  test_all_registers();
  test_special();
  TEST_MAIN_END();
}
