/*
 * scan.c — inclusive scans along one dim (cumsum, cumprod, cummax/cummin
 * with indices, logcumsumexp). Every line (one index of the other dims) is
 * loaded into a compute-typed buffer (f64 for floating data as PyTorch's CPU
 * accumulate type, i64 for integers), scanned and stored; lines are split
 * over the pool.
 */
#include "rk_common.h"

#define LCH 4096

typedef struct {
  int op, cls;
  tpurt_dtype idt, odt;
  tpurt_devptr in, out, idx;
  rk_lines L; /* views: 0 in, 1 out, 2 idx */
} splan;

typedef struct {
  const splan *p;
  const char *in;
  char *out, *idx;
} sctx;

static void scan_lines(void *c, int64_t lb, int64_t le) {
  sctx *x = c;
  const splan *p = x->p;
  int64_t ies = (int64_t)tpurt_dtype_size(p->idt), oes = (int64_t)tpurt_dtype_size(p->odt);
  _Alignas(32) double bd[LCH];
  int64_t *bi = (int64_t *)bd;
  for (int64_t l = lb; l < le; l++) {
    int64_t off[3];
    rk_line_offsets(&p->L, l, 3, off);
    int64_t io = off[0], oo = off[1], xo = off[2];
    const char *ip = x->in + io * ies;
    char *op = x->out + oo * oes;
    int64_t *xp = x->idx ? (int64_t *)x->idx + xo : NULL;
    /* carried state */
    double cd = p->op == TPURT_SCAN_CUMPROD ? 1.0 : p->op == TPURT_SCAN_LOGCUMSUMEXP ? -INFINITY : 0.0;
    int64_t ci = p->op == TPURT_SCAN_CUMPROD ? 1 : 0, cidx = 0;
    for (int64_t o = 0; o < p->L.D; o += LCH) {
      int64_t n = p->L.D - o < LCH ? p->L.D - o : LCH;
      const char *src = ip + o * p->L.step[0] * ies;
      if (p->cls == RK_I64) {
        rk_load_i64(bi, src, p->idt, p->L.step[0], n);
        switch (p->op) {
          case TPURT_SCAN_CUMSUM:
            for (int64_t i = 0; i < n; i++) bi[i] = ci = (int64_t)((uint64_t)ci + (uint64_t)bi[i]);
            break;
          case TPURT_SCAN_CUMPROD:
            for (int64_t i = 0; i < n; i++) bi[i] = ci = (int64_t)((uint64_t)ci * (uint64_t)bi[i]);
            break;
          default: { /* cummax / cummin: ties move to the later index */
            int mx = p->op == TPURT_SCAN_CUMMAX;
            for (int64_t i = 0; i < n; i++) {
              if ((o == 0 && i == 0) || (mx ? bi[i] >= ci : bi[i] <= ci)) {
                ci = bi[i];
                cidx = o + i;
              }
              bi[i] = ci;
              if (xp) xp[(o + i) * p->L.step[2]] = cidx;
            }
          }
        }
        if (p->odt == TPURT_I64 && p->L.step[1] == 1)
          memcpy(op + o * oes, bi, (size_t)n * sizeof(int64_t));
        else
          for (int64_t i = 0; i < n; i++) rk_store_i(op + (o + i) * p->L.step[1] * oes, p->odt, bi[i]);
        continue;
      }
      rk_load_f64(bd, src, p->idt, p->L.step[0], n);
      switch (p->op) {
        case TPURT_SCAN_CUMSUM:
          for (int64_t i = 0; i < n; i++) bd[i] = cd = cd + bd[i];
          break;
        case TPURT_SCAN_CUMPROD:
          for (int64_t i = 0; i < n; i++) bd[i] = cd = cd * bd[i];
          break;
        case TPURT_SCAN_LOGCUMSUMEXP:
          for (int64_t i = 0; i < n; i++) {
            double v = bd[i], m = rk_maxnan(cd, v), lo = cd < v ? cd : v;
            /* NaN, +inf and an all -inf prefix are absorbing */
            cd = (m != m || isinf(m)) ? m : m + log1p(exp(lo - m));
            bd[i] = cd;
          }
          break;
        default: {
          int mx = p->op == TPURT_SCAN_CUMMAX;
          for (int64_t i = 0; i < n; i++) {
            double v = bd[i];
            if ((o == 0 && i == 0) || v != v || (cd == cd && (mx ? v >= cd : v <= cd))) {
              cd = v;
              cidx = o + i;
            }
            bd[i] = cd;
            if (xp) xp[(o + i) * p->L.step[2]] = cidx;
          }
        }
      }
      rk_store_row_f64(op + o * p->L.step[1] * oes, p->odt, p->L.step[1], bd, n);
    }
  }
}

/* cumsum / cumprod of float32 / float64 along a dim whose neighbouring
 * lines lie next to each other (a column scan of a row-major matrix): up
 * to SCB lines advance together, one contiguous row of them a step, each
 * line's running value carried in double exactly as scan_lines carries it
 * (one line at a time read every element from another cache line) */
#define SCB 64
static int scan_by_columns(const splan *p) {
  const rk_lines *L = &p->L;
  return (p->op == TPURT_SCAN_CUMSUM || p->op == TPURT_SCAN_CUMPROD) && p->cls != RK_I64 && L->no >= 1 &&
         L->ost[0][L->no - 1] == 1 && L->ost[1][L->no - 1] == 1 && L->step[0] != 1 &&
         (p->idt == TPURT_F32 || p->idt == TPURT_F64) && p->odt == p->idt;
}

static void scan_columns(void *c, int64_t gb, int64_t ge) {
  sctx *x = c;
  const splan *p = x->p;
  const rk_lines *L = &p->L;
  int64_t W = L->osz[L->no - 1], per = (W + SCB - 1) / SCB;
  int f32 = p->idt == TPURT_F32, prod = p->op == TPURT_SCAN_CUMPROD;
  double acc[SCB];
  for (int64_t g = gb; g < ge; g++) {
    int64_t l0 = g / per * W + g % per * SCB;
    int64_t w = W - g % per * SCB < SCB ? W - g % per * SCB : SCB;
    int64_t off[2];
    rk_line_offsets(L, l0, 2, off);
    for (int64_t j = 0; j < w; j++) acc[j] = prod ? 1.0 : 0.0;
    for (int64_t i = 0; i < L->D; i++) {
      int64_t io = off[0] + i * L->step[0], oo = off[1] + i * L->step[1];
      if (f32) {
        const float *ip = (const float *)x->in + io;
        float *op = (float *)x->out + oo;
        if (prod)
          for (int64_t j = 0; j < w; j++) op[j] = (float)(acc[j] = acc[j] * ip[j]);
        else
          for (int64_t j = 0; j < w; j++) op[j] = (float)(acc[j] = acc[j] + ip[j]);
      } else {
        const double *ip = (const double *)x->in + io;
        double *op = (double *)x->out + oo;
        if (prod)
          for (int64_t j = 0; j < w; j++) op[j] = acc[j] = acc[j] * ip[j];
        else
          for (int64_t j = 0; j < w; j++) op[j] = acc[j] = acc[j] + ip[j];
      }
    }
  }
}

static tpurt_status k_scan(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  const splan *p = a;
  sctx x = {p, rk_hv(p->in), rk_hv(p->out), p->idx ? rk_hv(p->idx) : NULL};
  if (scan_by_columns(p)) {
    int64_t W = p->L.osz[p->L.no - 1], groups = p->L.nlines / W * ((W + SCB - 1) / SCB);
    tpurt_parallel_for(groups, 32768 / (p->L.D * SCB + 1) + 1, scan_columns, &x);
    return TPURT_OK;
  }
  tpurt_parallel_for(p->L.nlines, 32768 / (p->L.D + 1) + 1, scan_lines, &x);
  return TPURT_OK;
}

tpurt_status tpurt_scan(tpurt_stream *s, tpurt_scan_op op, const tpurt_view *out, const tpurt_view *idx,
                        const tpurt_view *in, int dim) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  static const char *names[] = {"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"};
  if ((unsigned)op > TPURT_SCAN_LOGCUMSUMEXP) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "scan: invalid op %d", (int)op);
  const char *nm = names[op];
  if ((st = rk_check_view(out, nm)) || (st = rk_check_view(in, nm))) return st;
  if (idx && (st = rk_check_view(idx, nm))) return st;
  if (!rk_same_shape(out, in) || (idx && !rk_same_shape(idx, in)))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output and input shapes differ", nm);
  if (idx && idx->dtype != TPURT_I64) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices must be int64", nm);
  if (rk_is_complex(in->dtype) || rk_is_complex(out->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: complex tensors are not supported", nm);
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
      (idx && (st = rk_check_range(s->dev, idx, nm))))
    return st;
  splan p;
  memset(&p, 0, sizeof p);
  p.op = op;
  int by_in = op == TPURT_SCAN_CUMMAX || op == TPURT_SCAN_CUMMIN;
  p.cls = rk_class(by_in ? in->dtype : out->dtype) == RK_I64 ? RK_I64 : RK_F64;
  p.idt = in->dtype;
  p.odt = out->dtype;
  p.in = in->ptr;
  p.out = out->ptr;
  p.idx = idx ? idx->ptr : 0;
  const tpurt_view *views[3] = {in, out, idx};
  rk_lines_plan(&p.L, in, dim, views, 3);
  return tpurt_launch(s, nm, k_scan, &p, sizeof p);
}
