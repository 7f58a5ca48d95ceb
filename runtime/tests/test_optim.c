/* test_optim.c — multi-tensor kernels (fused Adam/AdamW, SGD, AMP unscale
 * and scale update, foreach ops, foreach norms) against scalar references
 * computed in double with the same dtype rounding of stored values. */
#include <math.h>
#include <stdint.h>

#include "../src/internal.h"
#include "check.h"

static tpurt_stream *S;

static double val_to(tpurt_dtype dt, const void *p) {
  tpurt_scalar v = tpurt_scalar_load(dt, p);
  return v.kind == TPURT_SCALAR_FLOAT || v.kind == TPURT_SCALAR_COMPLEX ? v.re : (double)v.i;
}

typedef struct {
  tpurt_view v;
  int64_t n;
  double *ref; /* reference values (host) */
} dt_t;

static double round_to(tpurt_dtype dt, double x) {
  switch (dt) {
    case TPURT_F32: return (float)x;
    case TPURT_BF16: return tpurt__bf16_to_f32(tpurt__f32_to_bf16((float)x));
    case TPURT_F16: return tpurt__f16_to_f32(tpurt__f32_to_f16((float)x));
    default: return x;
  }
}

static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

/* host values -> device (dense 1-D, or every other element when strided) */
static void upload(dt_t *t) {
  size_t es = tpurt_dtype_size(t->v.dtype);
  int64_t stride = t->v.strides[0];
  int64_t span = t->n ? (t->n - 1) * stride + 1 : 0;
  unsigned char *h = calloc((size_t)(span ? span : 1), es);
  for (int64_t i = 0; i < t->n; i++) {
    double x = t->ref[i];
    unsigned char *p = h + (size_t)(i * stride) * es;
    switch (t->v.dtype) {
      case TPURT_F32: { float f = (float)x; memcpy(p, &f, 4); break; }
      case TPURT_F64: memcpy(p, &x, 8); break;
      case TPURT_BF16: { uint16_t u = tpurt__f32_to_bf16((float)x); memcpy(p, &u, 2); break; }
      case TPURT_F16: { uint16_t u = tpurt__f32_to_f16((float)x); memcpy(p, &u, 2); break; }
      case TPURT_I32: { int32_t u = (int32_t)x; memcpy(p, &u, 4); break; }
      default: break;
    }
  }
  if (span) CHECK_OK(tpurt_memcpy_h2d(S, t->v.ptr, h, (size_t)span * es, 0));
  free(h);
}

static double *download(const dt_t *t) {
  size_t es = tpurt_dtype_size(t->v.dtype);
  int64_t stride = t->v.strides[0];
  int64_t span = t->n ? (t->n - 1) * stride + 1 : 0;
  unsigned char *h = calloc((size_t)(span ? span : 1), es);
  double *out = calloc((size_t)(t->n ? t->n : 1), sizeof(double));
  if (span) CHECK_OK(tpurt_memcpy_d2h(S, h, t->v.ptr, (size_t)span * es, 0));
  for (int64_t i = 0; i < t->n; i++) {
    unsigned char *p = h + (size_t)(i * stride) * es;
    out[i] = val_to(t->v.dtype, p);
  }
  free(h);
  return out;
}

static dt_t mk(tpurt_dtype dt, int64_t n, int64_t stride, int random, double fill) {
  dt_t t;
  memset(&t, 0, sizeof t);
  t.n = n;
  t.v.dtype = dt;
  t.v.ndim = 1;
  t.v.sizes[0] = n;
  t.v.strides[0] = stride;
  int64_t span = n ? (n - 1) * stride + 1 : 1;
  CHECK_OK(tpurt_malloc(0, (size_t)span * tpurt_dtype_size(dt), S, &t.v.ptr));
  t.ref = calloc((size_t)(n ? n : 1), sizeof(double));
  for (int64_t i = 0; i < n; i++) t.ref[i] = round_to(dt, random ? urand() : fill);
  upload(&t);
  return t;
}

static void rm(dt_t *t) {
  tpurt_free(t->v.ptr);
  free(t->ref);
}

static double tol_of(tpurt_dtype dt) {
  switch (dt) {
    case TPURT_F64: return 1e-12;
    case TPURT_F32: return 2e-6;
    case TPURT_F16: return 2e-3;
    default: return 1.6e-2;
  }
}

/* compares device contents with ref: |d - r| <= tol * (1 + |r|) */
static int expect(const dt_t *t, double tol_scale, const char *what) {
  double *d = download(t);
  int bad = 0;
  double tol = tol_of(t->v.dtype) * tol_scale;
  for (int64_t i = 0; i < t->n; i++) {
    double r = t->ref[i];
    int ok = (isnan(r) && isnan(d[i])) || (isinf(r) && d[i] == r) || fabs(d[i] - r) <= tol * (1 + fabs(r));
    if (!ok) {
      if (bad < 3)
        fprintf(stderr, "%s (%s) [%lld]: got %.9g want %.9g\n", what, tpurt_dtype_name(t->v.dtype), (long long)i,
                d[i], r);
      bad++;
    }
  }
  free(d);
  if (bad) g_failures++;
  return bad;
}

/* --------------------------------------------------------------- Adam */

typedef struct {
  double lr, b1, b2, wd, eps;
  int amsgrad, maximize, decoupled;
  double grad_scale; /* 0 = none */
} adam_ref_cfg;

static void adam_ref(dt_t *p, dt_t *g, dt_t *m, dt_t *v, dt_t *vm, double step, const adam_ref_cfg *c) {
  double bc1 = 1 - pow(c->b1, step), bc2s = sqrt(1 - pow(c->b2, step));
  tpurt_dtype dt = p->v.dtype;
  for (int64_t i = 0; i < p->n; i++) {
    double gi = g->ref[i];
    if (c->grad_scale) {
      gi = round_to(dt, gi / c->grad_scale);
      g->ref[i] = gi;
    }
    if (c->maximize) gi = -gi;
    double pi = p->ref[i];
    if (c->wd) {
      if (c->decoupled)
        pi *= 1 - c->lr * c->wd;
      else
        gi += c->wd * pi;
    }
    double mi = c->b1 * m->ref[i] + (1 - c->b1) * gi;
    double vi = c->b2 * v->ref[i] + (1 - c->b2) * gi * gi;
    m->ref[i] = round_to(dt, mi);
    v->ref[i] = round_to(dt, vi);
    double vv = vi;
    if (c->amsgrad) {
      vv = fmax(vm->ref[i], vi);
      vm->ref[i] = round_to(dt, vv);
    }
    p->ref[i] = round_to(dt, pi - c->lr / bc1 * mi / (sqrt(vv) / bc2s + c->eps));
  }
}

static void test_adam(int amsgrad, int maximize, int decoupled, double wd, int lr_on_device, int use_scale,
                      int skip) {
  enum { N = 4 };
  tpurt_dtype dts[N] = {TPURT_F32, TPURT_BF16, TPURT_F64, TPURT_F16};
  int64_t sizes[N] = {1000, 37, 70000, 0};
  dt_t p[N], g[N], m[N], v[N], vm[N], st[N];
  tpurt_view pv[N], gv[N], mv[N], vv[N], vmv[N], sv[N];
  for (int i = 0; i < N; i++) {
    p[i] = mk(dts[i], sizes[i], 1, 1, 0);
    g[i] = mk(dts[i], sizes[i], 1, 1, 0);
    m[i] = mk(dts[i], sizes[i], 1, 0, 0);
    v[i] = mk(dts[i], sizes[i], 1, 0, 0);
    vm[i] = mk(dts[i], sizes[i], 1, 0, 0);
    st[i] = mk(i == 2 ? TPURT_F64 : TPURT_F32, 1, 1, 0, 0);
    pv[i] = p[i].v, gv[i] = g[i].v, mv[i] = m[i].v, vv[i] = v[i].v, vmv[i] = vm[i].v, sv[i] = st[i].v;
  }
  dt_t lr = mk(TPURT_F32, 1, 1, 0, 1e-2);
  dt_t scale = mk(TPURT_F32, 1, 1, 0, 4.0);
  dt_t found = mk(TPURT_F32, 1, 1, 0, skip ? 1.0 : 0.0);
  adam_ref_cfg rc = {lr_on_device ? (double)(float)1e-2 : 1e-2, 0.9, 0.999, wd, 1e-8, amsgrad, maximize, decoupled, use_scale ? 4.0 : 0};
  tpurt_adam_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.lr.value = 1e-2;
  if (lr_on_device) cfg.lr = (tpurt_dscalar){0, lr.v.ptr, TPURT_F32};
  cfg.beta1 = 0.9, cfg.beta2 = 0.999, cfg.weight_decay = wd, cfg.eps = 1e-8;
  cfg.amsgrad = amsgrad, cfg.maximize = maximize, cfg.decoupled = decoupled;
  if (use_scale) cfg.amp.grad_scale = (tpurt_dscalar){0, scale.v.ptr, TPURT_F32}, cfg.amp.has_grad_scale = 1;
  cfg.amp.found_inf = (tpurt_dscalar){0, found.v.ptr, TPURT_F32}, cfg.amp.has_found_inf = 1;
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < N; i++) {
      st[i].ref[0] = step;
      upload(&st[i]);
      if (!skip) adam_ref(&p[i], &g[i], &m[i], &v[i], &vm[i], step, &rc);
    }
    CHECK_OK(tpurt_fused_adam(S, N, pv, gv, mv, vv, amsgrad ? vmv : NULL, sv, &cfg));
    /* new grads each step */
    for (int i = 0; i < N; i++) {
      if (use_scale) expect(&g[i], 1, "adam grad (unscaled, stored back)");
      for (int64_t k = 0; k < g[i].n; k++) g[i].ref[k] = round_to(dts[i], urand());
      upload(&g[i]);
    }
  }
  for (int i = 0; i < N; i++) {
    expect(&p[i], 4, "adam param");
    expect(&m[i], 4, "adam exp_avg");
    expect(&v[i], 4, "adam exp_avg_sq");
    if (amsgrad) expect(&vm[i], 4, "adam max_exp_avg_sq");
    rm(&p[i]), rm(&g[i]), rm(&m[i]), rm(&v[i]), rm(&vm[i]), rm(&st[i]);
  }
  rm(&lr), rm(&scale), rm(&found);
}

/* ---------------------------------------------------------------- SGD */

static void test_sgd(double momentum, double dampening, int nesterov, int maximize, double wd, int use_scale,
                     int skip, int strided) {
  enum { N = 3 };
  tpurt_dtype dts[N] = {TPURT_F32, TPURT_BF16, TPURT_F64};
  int64_t sizes[N] = {513, 70001, 1};
  dt_t p[N], g[N], b[N];
  tpurt_view pv[N], gv[N], bv[N];
  int64_t stride = strided ? 2 : 1;
  for (int i = 0; i < N; i++) {
    p[i] = mk(dts[i], sizes[i], stride, 1, 0);
    g[i] = mk(dts[i], sizes[i], 1, 1, 0);
    b[i] = mk(dts[i], sizes[i], stride, 0, 0);
    pv[i] = p[i].v, gv[i] = g[i].v, bv[i] = b[i].v;
  }
  dt_t lr = mk(TPURT_F32, 1, 1, 0, 0.1);
  dt_t scale = mk(TPURT_F32, 1, 1, 0, 8.0);
  dt_t found = mk(TPURT_F32, 1, 1, 0, skip ? 1.0 : 0.0);
  tpurt_sgd_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.lr = (tpurt_dscalar){0, lr.v.ptr, TPURT_F32};
  cfg.momentum = momentum, cfg.dampening = dampening, cfg.weight_decay = wd;
  cfg.nesterov = nesterov, cfg.maximize = maximize;
  if (use_scale) cfg.amp.grad_scale = (tpurt_dscalar){0, scale.v.ptr, TPURT_F32}, cfg.amp.has_grad_scale = 1;
  cfg.amp.found_inf = (tpurt_dscalar){0, found.v.ptr, TPURT_F32}, cfg.amp.has_found_inf = 1;
  for (int step = 0; step < 3; step++) {
    cfg.first_step = step == 0;
    for (int i = 0; i < N && !skip; i++) {
      tpurt_dtype dt = dts[i];
      for (int64_t k = 0; k < p[i].n; k++) {
        double gi = g[i].ref[k];
        if (use_scale) g[i].ref[k] = gi = round_to(dt, gi / 8.0);
        if (maximize) gi = -gi;
        if (wd) gi += wd * p[i].ref[k];
        if (momentum) {
          double bk = step == 0 ? gi : momentum * b[i].ref[k] + (1 - dampening) * gi;
          b[i].ref[k] = round_to(dt, bk);
          gi = nesterov ? gi + momentum * bk : bk;
        }
        p[i].ref[k] = round_to(dt, p[i].ref[k] - (double)(float)0.1 * gi);
      }
    }
    CHECK_OK(tpurt_fused_sgd(S, N, pv, gv, momentum ? bv : NULL, &cfg));
    for (int i = 0; i < N; i++) {
      if (use_scale) expect(&g[i], 1, "sgd grad (unscaled)");
      for (int64_t k = 0; k < g[i].n; k++) g[i].ref[k] = round_to(dts[i], urand());
      upload(&g[i]);
    }
  }
  for (int i = 0; i < N; i++) {
    expect(&p[i], 4, "sgd param");
    if (momentum) expect(&b[i], 4, "sgd momentum buffer");
    rm(&p[i]), rm(&g[i]), rm(&b[i]);
  }
  rm(&lr), rm(&scale), rm(&found);
}

/* ---------------------------------------------------------------- AMP */

static void test_unscale(void) {
  dt_t g0 = mk(TPURT_F32, 100000, 1, 1, 0), g1 = mk(TPURT_BF16, 33, 1, 1, 0), g2 = mk(TPURT_F16, 9, 2, 1, 0);
  dt_t found = mk(TPURT_F32, 1, 1, 0, 0), inv = mk(TPURT_F32, 1, 1, 0, 0.25);
  tpurt_view gv[3] = {g0.v, g1.v, g2.v};
  CHECK_OK(tpurt_amp_unscale(S, 3, gv, &found.v, &inv.v));
  for (int64_t i = 0; i < g0.n; i++) g0.ref[i] *= 0.25;
  for (int64_t i = 0; i < g1.n; i++) g1.ref[i] *= 0.25;
  for (int64_t i = 0; i < g2.n; i++) g2.ref[i] *= 0.25;
  expect(&g0, 1, "unscale"), expect(&g1, 1, "unscale"), expect(&g2, 1, "unscale"), expect(&found, 1, "found_inf");
  /* one inf deep inside the big tensor, one NaN in the small one */
  g0.ref[77777] = INFINITY;
  upload(&g0);
  CHECK_OK(tpurt_amp_unscale(S, 3, gv, &found.v, &inv.v));
  found.ref[0] = 1;
  expect(&found, 1, "found_inf after inf");
  found.ref[0] = 0;
  upload(&found);
  g0.ref[77777] = 1;
  upload(&g0);
  g2.ref[3] = NAN;
  upload(&g2);
  CHECK_OK(tpurt_amp_unscale(S, 3, gv, &found.v, &inv.v));
  found.ref[0] = 1;
  expect(&found, 1, "found_inf after nan");
  /* dtype errors */
  dt_t bad = mk(TPURT_F64, 1, 1, 0, 0);
  CHECK_ST(tpurt_amp_unscale(S, 3, gv, &bad.v, &inv.v), TPURT_ERR_INVALID_ARGUMENT);
  rm(&g0), rm(&g1), rm(&g2), rm(&found), rm(&inv), rm(&bad);
}

static void test_update_scale(void) {
  dt_t scale = mk(TPURT_F32, 1, 1, 0, 65536.0), tr = mk(TPURT_I32, 1, 1, 0, 0), found = mk(TPURT_F32, 1, 1, 0, 0);
  /* growth_interval 3: two successes count, the third grows */
  for (int k = 0; k < 3; k++) CHECK_OK(tpurt_amp_update_scale(S, &scale.v, &tr.v, &found.v, 2.0, 0.5, 3));
  scale.ref[0] = 131072.0, tr.ref[0] = 0;
  expect(&scale, 0, "scale grown"), expect(&tr, 0, "tracker reset");
  CHECK_OK(tpurt_amp_update_scale(S, &scale.v, &tr.v, &found.v, 2.0, 0.5, 3));
  tr.ref[0] = 1;
  expect(&tr, 0, "tracker counts");
  found.ref[0] = 1;
  upload(&found);
  CHECK_OK(tpurt_amp_update_scale(S, &scale.v, &tr.v, &found.v, 2.0, 0.5, 3));
  scale.ref[0] = 65536.0, tr.ref[0] = 0;
  expect(&scale, 0, "scale backoff"), expect(&tr, 0, "tracker reset on inf");
  /* growth to inf is refused */
  found.ref[0] = 0;
  upload(&found);
  scale.ref[0] = (float)3e38;
  upload(&scale);
  CHECK_OK(tpurt_amp_update_scale(S, &scale.v, &tr.v, &found.v, 2.0, 0.5, 1));
  expect(&scale, 0, "no growth to inf");
  CHECK_ST(tpurt_amp_update_scale(S, &tr.v, &tr.v, &found.v, 2.0, 0.5, 1), TPURT_ERR_INVALID_ARGUMENT);
  rm(&scale), rm(&tr), rm(&found);
}

/* ------------------------------------------------------------ foreach */

static double fe_ref(tpurt_foreach_op op, double a, double b, double c, double alpha) {
  switch (op) {
    case TPURT_FE_COPY: return a;
    case TPURT_FE_NEG: return -a;
    case TPURT_FE_ABS: return fabs(a);
    case TPURT_FE_SQRT: return sqrt(a);
    case TPURT_FE_EXP: return exp(a);
    case TPURT_FE_RECIPROCAL: return 1 / a;
    case TPURT_FE_SIGN: return (a > 0) - (a < 0);
    case TPURT_FE_ADD: return a + alpha * b;
    case TPURT_FE_MUL: return a * b;
    case TPURT_FE_DIV: return a / b;
    case TPURT_FE_MAXIMUM: return isnan(a) || isnan(b) ? NAN : fmax(a, b);
    case TPURT_FE_MINIMUM: return isnan(a) || isnan(b) ? NAN : fmin(a, b);
    case TPURT_FE_POW: return pow(a, b);
    case TPURT_FE_RPOW: return pow(b, a);
    case TPURT_FE_ADDCMUL: return a + alpha * b * c;
    case TPURT_FE_ADDCDIV: return a + alpha * b / c;
    case TPURT_FE_LERP: return a + c * (b - a);
    default: return 0;
  }
}

/* mode: 0 tensor lists, 1 host scalar, 2 scalar list, 3 device scalar */
static void test_foreach(tpurt_foreach_op op, int mode, int inplace) {
  enum { N = 4 };
  tpurt_dtype dts[N] = {TPURT_F32, TPURT_BF16, TPURT_F64, TPURT_F16};
  int64_t sizes[N] = {70000, 5, 300, 0};
  int unary = op <= TPURT_FE_SIGN, ternary = op >= TPURT_FE_ADDCMUL;
  int scal_b = !unary && !ternary && mode != 0;
  int scal_c = op == TPURT_FE_LERP && mode != 0;
  dt_t a[N], b[N], c[N], o[N];
  tpurt_view av[N], bv[N], cv[N], ov[N];
  double svals[N] = {0.5, -2.0, 0.25, 3.0};
  dt_t dev_s = mk(TPURT_F64, 1, 1, 0, 0.75);
  double s = mode == 3 ? 0.75 : 1.5;
  for (int i = 0; i < N; i++) {
    int64_t st = i == 2 ? 3 : 1; /* a strided tuple */
    a[i] = mk(dts[i], sizes[i], st, 1, 0);
    if (op == TPURT_FE_SQRT || op == TPURT_FE_POW)
      for (int64_t k = 0; k < a[i].n; k++) a[i].ref[k] = fabs(a[i].ref[k]);
    if (op == TPURT_FE_MAXIMUM && sizes[i] > 3) a[i].ref[3] = NAN;
    upload(&a[i]);
    b[i] = mk(dts[i], sizes[i], 1, 1, 0);
    if (op == TPURT_FE_POW && !scal_b)
      for (int64_t k = 0; k < b[i].n; k++) b[i].ref[k] = round_to(dts[i], 2 * b[i].ref[k]);
    upload(&b[i]);
    c[i] = mk(dts[i], sizes[i], 1, 1, 0);
    if (op == TPURT_FE_ADDCDIV)
      for (int64_t k = 0; k < c[i].n; k++) c[i].ref[k] = round_to(dts[i], 1.5 + c[i].ref[k]);
    upload(&c[i]);
    o[i] = inplace ? a[i] : mk(dts[i], sizes[i], 2, 0, 0);
    av[i] = a[i].v, bv[i] = b[i].v, cv[i] = c[i].v, ov[i] = o[i].v;
  }
  tpurt_foreach_operands ops;
  memset(&ops, 0, sizeof ops);
  ops.out = ov;
  ops.a = av;
  ops.b = unary || scal_b ? NULL : bv;
  ops.c = (ternary && !scal_c) ? cv : NULL;
  ops.alpha = op == TPURT_FE_ADD ? -0.5 : 1;
  ops.scalars = mode == 2 ? svals : NULL;
  ops.scalar.value = s;
  if (mode == 3) ops.scalar = (tpurt_dscalar){0, dev_s.v.ptr, TPURT_F64};
  for (int i = 0; i < N; i++) {
    double sv = mode == 2 ? svals[i] : s;
    if (op == TPURT_FE_ADDCMUL || op == TPURT_FE_ADDCDIV) sv = mode == 0 ? 1.0 : sv;
    for (int64_t k = 0; k < a[i].n; k++) {
      double bb = scal_b ? sv : b[i].ref[k], cc = scal_c ? sv : c[i].ref[k];
      double al = (op == TPURT_FE_ADDCMUL || op == TPURT_FE_ADDCDIV) ? sv : ops.alpha;
      o[i].ref[k] = round_to(dts[i], fe_ref(op, a[i].ref[k], bb, cc, al));
    }
  }
  if ((op == TPURT_FE_ADDCMUL || op == TPURT_FE_ADDCDIV) && mode == 0) ops.scalar.value = 1.0;
  CHECK_OK(tpurt_foreach(S, op, N, &ops));
  char what[64];
  snprintf(what, sizeof what, "%s mode %d%s", tpurt_foreach_op_name(op), mode, inplace ? " in-place" : "");
  for (int i = 0; i < N; i++) {
    expect(&o[i], op == TPURT_FE_EXP || op == TPURT_FE_POW || op == TPURT_FE_RPOW ? 4 : 1.5, what);
    if (!inplace) rm(&o[i]);
    rm(&a[i]), rm(&b[i]), rm(&c[i]);
  }
  rm(&dev_s);
}

static void test_norm(void) {
  enum { N = 4 };
  tpurt_dtype dts[N] = {TPURT_F32, TPURT_BF16, TPURT_F64, TPURT_F16};
  int64_t sizes[N] = {200000, 7, 1000, 0};
  double ords[6] = {2, 1, 0, INFINITY, 3, -INFINITY};
  dt_t a[N], o[N];
  tpurt_view av[N], ov[N];
  for (int i = 0; i < N; i++) {
    a[i] = mk(dts[i], sizes[i], i == 2 ? 2 : 1, 1, 0);
    if (sizes[i] > 5) a[i].ref[5] = 0, upload(&a[i]);
    o[i] = mk(i == 1 ? TPURT_F32 : dts[i], 1, 1, 0, 0);
    av[i] = a[i].v, ov[i] = o[i].v;
  }
  for (int k = 0; k < 6; k++) {
    double ord = ords[k];
    if (isinf(ord) && ord < 0) {
      CHECK_ST(tpurt_foreach_norm(S, N, ov, av, ord), TPURT_ERR_INVALID_ARGUMENT); /* empty tensor */
      CHECK_OK(tpurt_foreach_norm(S, N - 1, ov, av, ord));
    } else {
      CHECK_OK(tpurt_foreach_norm(S, N, ov, av, ord));
    }
    for (int i = 0; i < N; i++) {
      if (isinf(ord) && ord < 0 && i == 3) continue;
      double acc = isinf(ord) && ord < 0 ? INFINITY : 0;
      for (int64_t j = 0; j < a[i].n; j++) {
        double x = fabs(a[i].ref[j]);
        if (ord == 2) acc += x * x;
        else if (ord == 1) acc += x;
        else if (ord == 0) acc += x != 0;
        else if (isinf(ord)) acc = ord > 0 ? fmax(acc, x) : fmin(acc, x);
        else acc += pow(x, ord);
      }
      if (ord == 2) acc = sqrt(acc);
      else if (ord == 3) acc = cbrt(acc);
      o[i].ref[0] = round_to(o[i].v.dtype, acc);
      char what[32];
      snprintf(what, sizeof what, "norm ord %g", ord);
      expect(&o[i], 8, what);
    }
  }
  for (int i = 0; i < N; i++) rm(&a[i]), rm(&o[i]);
}

static void test_errors(void) {
  dt_t a = mk(TPURT_F32, 10, 1, 1, 0), b = mk(TPURT_F32, 11, 1, 1, 0), ii = mk(TPURT_I32, 10, 1, 0, 1);
  tpurt_foreach_operands o;
  memset(&o, 0, sizeof o);
  o.out = &a.v, o.a = &a.v, o.b = &b.v, o.alpha = 1;
  CHECK_ST(tpurt_foreach(S, TPURT_FE_ADD, 1, &o), TPURT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tpurt_last_error(), "different shapes") != NULL);
  o.b = &ii.v;
  CHECK_ST(tpurt_foreach(S, TPURT_FE_ADD, 1, &o), TPURT_ERR_NOT_SUPPORTED);
  o.b = NULL;
  CHECK_ST(tpurt_foreach(S, TPURT_FE_ADDCMUL, 1, &o), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_foreach(S, TPURT_FE_ADD, 0, &o)); /* empty list */
  tpurt_view stale = a.v;
  stale.ptr = 0x1234;
  o.a = &stale;
  CHECK_ST(tpurt_foreach(S, TPURT_FE_NEG, 1, &o), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_stream_synchronize(S));
  rm(&a), rm(&b), rm(&ii);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  /* Adam: plain, amsgrad + maximize + L2 decay, AdamW, device lr, grad scale, skipped */
  test_adam(0, 0, 0, 0, 0, 0, 0);
  test_adam(1, 1, 0, 0.1, 0, 0, 0);
  test_adam(0, 0, 1, 0.05, 1, 0, 0);
  test_adam(1, 0, 1, 0.05, 1, 1, 0);
  test_adam(0, 0, 0, 0, 0, 1, 1);
  /* SGD: plain, momentum + dampening, nesterov + decay + maximize, scale, skipped, strided */
  test_sgd(0, 0, 0, 0, 0, 0, 0, 0);
  test_sgd(0.9, 0.1, 0, 0, 0, 0, 0, 0);
  test_sgd(0.9, 0, 1, 1, 0.01, 0, 0, 1);
  test_sgd(0.5, 0, 0, 0, 0, 1, 0, 0);
  test_sgd(0.9, 0, 0, 0, 0, 1, 1, 0);
  test_unscale();
  test_update_scale();
  for (int op = 0; op < TPURT_FE_NUM_OPS; op++) {
    int unary = op <= TPURT_FE_SIGN;
    int modes = unary ? 1 : (op == TPURT_FE_ADDCMUL || op == TPURT_FE_ADDCDIV) ? 4 : 4;
    for (int mode = 0; mode < modes; mode++) {
      if (op == TPURT_FE_RPOW && mode == 0) continue; /* scalar base only */
      test_foreach((tpurt_foreach_op)op, mode, 0);
      test_foreach((tpurt_foreach_op)op, mode, 1);
    }
  }
  test_norm();
  test_errors();
  CHECK_OK(tpurt_device_synchronize(0));
  TEST_MAIN_END();
}
