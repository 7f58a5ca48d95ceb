/*
 * softmax.c — softmax / log_softmax along any dim and their backward.
 * Every line along the dim is loaded into a compute buffer (f32 for
 * f16/bf16/f32, f64 for f64), processed in three vectorizable passes (max,
 * exp-sum, normalize) and stored; lines are split over the pool. f32
 * lines that are contiguous in every view are processed in place
 * (row_f_flat).
 */
/* FP compares may be if-converted (selects in the vector exp) */
#pragma GCC optimize("no-trapping-math")
#include "rk_common.h"
#include "vmath.h"

#define STACK_D 4096

typedef struct {
  int log, bwd, cls;
  tpurt_dtype odt, idt, i2dt;
  tpurt_devptr out, in, in2;
  rk_lines L; /* views: 0 out, 1 in, 2 in2 */
} smplan;

typedef struct {
  const smplan *p;
  char *out;
  const char *in, *in2;
  int failed;
} smctx;

#define SM_ROW(NAME, T, LOAD, STORE, EXP, LOGF)                                            \
  static void NAME(const smplan *p, char *op, const char *ip, const char *ip2, T *a, T *b) { \
    int64_t D = p->L.D;                                                                    \
    LOAD(a, ip, p->idt, p->L.step[1], D);                                                      \
    if (!p->bwd) {                                                                       \
      T m = a[0];                                                                        \
      for (int64_t i = 1; i < D; i++) m = a[i] > m ? a[i] : m;                           \
      T sum = 0;                                                                         \
      if (p->log) {                                                                      \
        for (int64_t i = 0; i < D; i++) sum += EXP(a[i] - m);                            \
        T ls = LOGF(sum); /* (x - m) - log(sum): m + log(sum) would absorb log(sum) */  \
        for (int64_t i = 0; i < D; i++) a[i] = (a[i] - m) - ls;                          \
      } else {                                                                           \
        for (int64_t i = 0; i < D; i++) {                                                \
          a[i] = EXP(a[i] - m);                                                          \
          sum += a[i];                                                                   \
        }                                                                                \
        T inv = (T)1 / sum;                                                              \
        for (int64_t i = 0; i < D; i++) a[i] *= inv;                                     \
      }                                                                                  \
    } else {                                                                             \
      LOAD(b, ip2, p->i2dt, p->L.step[2], D);                                                 \
      T acc = 0;                                                                         \
      if (p->log) {                                                                      \
        for (int64_t i = 0; i < D; i++) acc += a[i];                                     \
        for (int64_t i = 0; i < D; i++) a[i] -= EXP(b[i]) * acc;                         \
      } else {                                                                           \
        for (int64_t i = 0; i < D; i++) acc += a[i] * b[i];                              \
        for (int64_t i = 0; i < D; i++) a[i] = b[i] * (a[i] - acc);                      \
      }                                                                                  \
    }                                                                                    \
    STORE(op, p->odt, p->L.step[0], a, D);                                                    \
  }
SM_ROW(row_d, double, rk_load_f64, rk_store_row_f64, exp, log)

/* One f32 line: vectorized exp and eight-lane sums, on lines read in
 * place (in, in2: the backward's second input; out may alias them: each
 * element is written after the line's reductions, from its own index only;
 * b holds the exps of log_softmax). Lines that are contiguous f32 in every
 * view run this directly (a [16, 4, 64, 64] softmax spent about a third of
 * its time copying 64-float lines into buffers and back), others through
 * row_f's buffers: the same operations in the same order, the same bits. */
static void row_f_flat(const smplan *p, float *out, const float *in, const float *in2, float *b) {
  int64_t D = p->L.D;
  if (!p->bwd) {
    float m = tpurt__vmaxf(in, D);
    if (p->log && D >= 128) {
      float acc[16] = {0}; /* as the softmax below, without storing the exps */
      int64_t i = 0;
      for (; i + 16 <= D; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += tpurt__vexpf(in[i + j] - m);
      for (; i < D; i++) acc[i & 15] += tpurt__vexpf(in[i] - m);
      for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
      float ls = logf(acc[0]);
      for (i = 0; i < D; i++) out[i] = (in[i] - m) - ls;
    } else if (p->log) {
      for (int64_t i = 0; i < D; i++) b[i] = tpurt__vexpf(in[i] - m);
      float ls = logf(tpurt__vsumf(b, D));
      for (int64_t i = 0; i < D; i++) out[i] = (in[i] - m) - ls;
    } else if (D < 128) {
      for (int64_t i = 0; i < D; i++) out[i] = tpurt__vexpf(in[i] - m);
      float inv = 1.0f / tpurt__vsumf(out, D);
      for (int64_t i = 0; i < D; i++) out[i] *= inv;
    } else {
      /* the exps summed as they are stored: 16 lanes (one 512-bit vector,
       * two 256-bit ones), folded in a fixed order (rows from 128: 1.10 -
       * 1.33x the separate sum pass; below, 0.89x) */
      float acc[16] = {0};
      int64_t i = 0;
      for (; i + 16 <= D; i += 16)
        for (int j = 0; j < 16; j++) {
          float e = tpurt__vexpf(in[i + j] - m);
          out[i + j] = e;
          acc[j] += e;
        }
      for (; i < D; i++) acc[i & 15] += out[i] = tpurt__vexpf(in[i] - m);
      for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
      float inv = 1.0f / acc[0];
      for (i = 0; i < D; i++) out[i] *= inv;
    }
  } else if (p->log) {
    float acc = tpurt__vsumf(in, D);
    for (int64_t i = 0; i < D; i++) out[i] = in[i] - tpurt__vexpf(in2[i]) * acc;
  } else {
    float acc = tpurt__vdotf(in, in2, D);
    for (int64_t i = 0; i < D; i++) out[i] = in2[i] * (in[i] - acc);
  }
}
static void row_f(const smplan *p, char *op, const char *ip, const char *ip2, float *restrict a, float *restrict b) {
  rk_load_f32(a, ip, p->idt, p->L.step[1], p->L.D);
  if (p->bwd) rk_load_f32(b, ip2, p->i2dt, p->L.step[2], p->L.D);
  row_f_flat(p, a, a, b, b);
  rk_store_row_f32(op, p->odt, p->L.step[0], a, p->L.D);
}

static void sm_lines(void *c, int64_t lb, int64_t le) {
  smctx *x = c;
  const smplan *p = x->p;
  int64_t oes = (int64_t)tpurt_dtype_size(p->odt), ies = (int64_t)tpurt_dtype_size(p->idt),
          i2es = p->bwd ? (int64_t)tpurt_dtype_size(p->i2dt) : 0;
  _Alignas(32) double sa[STACK_D], sb[STACK_D];
  double *a = sa, *b = sb, *heap = NULL;
  size_t esz = p->cls == RK_F32 ? 4 : 8;
  if ((size_t)p->L.D * esz > sizeof sa) {
    heap = malloc(2 * (size_t)p->L.D * esz);
    if (!heap) {
      x->failed = 1;
      return;
    }
    a = heap;
    b = (double *)((char *)heap + (size_t)p->L.D * esz);
  }
  int flat = p->cls == RK_F32 && p->odt == TPURT_F32 && p->idt == TPURT_F32 && p->L.step[0] == 1 &&
             p->L.step[1] == 1 && (!p->bwd || (p->i2dt == TPURT_F32 && p->L.step[2] == 1));
  for (int64_t l = lb; l < le; l++) {
    int64_t off[3];
    rk_line_offsets(&p->L, l, 3, off);
    int64_t oo = off[0], io = off[1], io2 = off[2];
    const char *ip2 = p->bwd ? x->in2 + io2 * i2es : NULL;
    if (flat)
      row_f_flat(p, (float *)(x->out + oo * oes), (const float *)(x->in + io * ies), (const float *)ip2, (float *)b);
    else if (p->cls == RK_F32)
      row_f(p, x->out + oo * oes, x->in + io * ies, ip2, (float *)a, (float *)b);
    else
      row_d(p, x->out + oo * oes, x->in + io * ies, ip2, a, b);
  }
  free(heap);
}

static tpurt_status k_softmax(void *a, char *err, size_t errlen) {
  const smplan *p = a;
  smctx x = {p, rk_hv(p->out), rk_hv(p->in), p->bwd ? rk_hv(p->in2) : NULL, 0};
  tpurt_parallel_for(p->L.nlines, 16384 / (p->L.D + 1) + 1, sm_lines, &x);
  if (x.failed) {
    snprintf(err, errlen, "out of host memory for softmax rows of %" PRId64 " elements", p->L.D);
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  return TPURT_OK;
}

static tpurt_status sm_launch(tpurt_stream *s, const char *nm, const tpurt_view *out, const tpurt_view *in,
                              const tpurt_view *in2, int dim, int log) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = rk_check_view(out, nm)) || (st = rk_check_view(in, nm))) return st;
  if (in2 && (st = rk_check_view(in2, nm))) return st;
  if (!rk_same_shape(out, in) || (in2 && !rk_same_shape(in2, in)))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: tensor shapes differ", nm);
  if (!rk_is_float(out->dtype) || !rk_is_float(in->dtype) || (in2 && !rk_is_float(in2->dtype)))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: expected floating point tensors", nm);
  int nd = in->ndim;
  if (nd == 0) {
    if (dim != 0 && dim != -1) return tpurt__err(TPURT_ERR_INDEX, "%s: dimension %d out of range", nm, dim);
  } else {
    if (dim < 0) dim += nd;
    if (dim < 0 || dim >= nd) return tpurt__err(TPURT_ERR_INDEX, "%s: dimension out of range", nm);
  }
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if (rk_numel(in) == 0) return TPURT_OK;
  if ((st = rk_check_range(s->dev, in, nm)) || (st = rk_check_range(s->dev, out, nm)) ||
      (in2 && (st = rk_check_range(s->dev, in2, nm))))
    return st;
  smplan p;
  memset(&p, 0, sizeof p);
  p.log = log;
  p.bwd = in2 != NULL;
  p.cls = (out->dtype == TPURT_F64 || in->dtype == TPURT_F64) ? RK_F64 : RK_F32;
  p.odt = out->dtype;
  p.idt = in->dtype;
  p.i2dt = in2 ? in2->dtype : TPURT_F32;
  p.out = out->ptr;
  p.in = in->ptr;
  p.in2 = in2 ? in2->ptr : 0;
  const tpurt_view *views[3] = {out, in, in2};
  rk_lines_plan(&p.L, in, dim, views, 3);
  return tpurt_launch(s, nm, k_softmax, &p, sizeof p);
}

tpurt_status tpurt_softmax(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, int dim, int log) {
  return sm_launch(s, log ? "log_softmax" : "softmax", out, in, NULL, dim, log);
}

tpurt_status tpurt_softmax_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                    const tpurt_view *out, int dim, int log) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "softmax_backward: output view is NULL");
  return sm_launch(s, log ? "log_softmax_backward" : "softmax_backward", grad_in, grad_out, out, dim, log);
}
