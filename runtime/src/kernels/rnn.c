/*
 * rnn.c — the fused recurrent cells ATen asks an accelerator for: the LSTM
 * and GRU cells' pointwise part (everything after the two gate products)
 * and its backward. nn.LSTM / nn.GRU / LSTMCell / GRUCell on a non-CPU
 * device reach them through aten::_thnn_fused_lstm_cell and
 * _thnn_fused_gru_cell; CPU computes the same cells from separate ops.
 *
 * Layouts (PyTorch's): gates [B, 4H] in the order input, forget, cell,
 * output (LSTM) and [B, 3H] reset, update, new (GRU); the biases [4H] /
 * [3H] are added to both gate sets. The forward keeps what the backward
 * needs in a workspace: the four activated gates [B, 4H] (LSTM), or
 * r, z, n, hx and the hidden new-gate term hn [B, 5H] (GRU). Every element
 * is computed in double and rounded once to the tensors' dtype (f32, f64,
 * bf16, f16). Bias gradients are the column sums of the gate gradients,
 * left to the reduction kernels.
 */
#include "kcommon.h"

static inline double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static inline char *el(char *base, const tpurt_view *v, int64_t i, int64_t j) {
  return base + (i * v->strides[0] + j * v->strides[1]) * (int64_t)tpurt_dtype_size(v->dtype);
}
static inline double ld2(char *base, const tpurt_view *v, int64_t i, int64_t j) {
  return kc_ld(v->dtype, el(base, v, i, j));
}
static inline void st2(char *base, const tpurt_view *v, int64_t i, int64_t j, double x) {
  kc_st(v->dtype, el(base, v, i, j), x);
}

enum { RNN_MAXV = 8 };

/* One launch's views; which ones a kernel uses depends on the cell. */
typedef struct {
  tpurt_view v[RNN_MAXV];
  int present[RNN_MAXV];
  int64_t B, H;
} rnn_args;

typedef struct {
  rnn_args *a;
  char *p[RNN_MAXV];
} rnn_ctx;

static double ld(rnn_ctx *x, int k, int64_t b, int64_t j) { return ld2(x->p[k], &x->a->v[k], b, j); }
static double ld_opt(rnn_ctx *x, int k, int64_t b, int64_t j) { return x->p[k] ? ld(x, k, b, j) : 0.0; }
static double bias(rnn_ctx *x, int k, int64_t j) { return x->p[k] ? ld2(x->p[k], &x->a->v[k], 0, j) : 0.0; }
static void st(rnn_ctx *x, int k, int64_t b, int64_t j, double val) { st2(x->p[k], &x->a->v[k], b, j, val); }

static void rnn_ctx_init(rnn_ctx *x, rnn_args *a) {
  x->a = a;
  for (int k = 0; k < RNN_MAXV; k++) x->p[k] = a->present[k] ? tpurt__host_view(a->v[k].ptr) : NULL;
}

/* ------------------------------------------------------------- LSTM */
/* views: 0 hy, 1 cy, 2 workspace, 3 igates, 4 hgates, 5 cx, 6 bias_i, 7 bias_h */
static void lstm_fwd_rows(void *c, int64_t b0, int64_t b1) {
  rnn_ctx *x = c;
  int64_t H = x->a->H;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t j = 0; j < H; j++) {
      double g[4];
      for (int q = 0; q < 4; q++) {
        int64_t col = q * H + j;
        g[q] = ld(x, 3, b, col) + ld(x, 4, b, col) + bias(x, 6, col) + bias(x, 7, col);
      }
      double i = sigm(g[0]), f = sigm(g[1]), gg = tanh(g[2]), o = sigm(g[3]);
      double cy = f * ld(x, 5, b, j) + i * gg;
      st(x, 0, b, j, o * tanh(cy));
      st(x, 1, b, j, cy);
      st(x, 2, b, j, i);
      st(x, 2, b, H + j, f);
      st(x, 2, b, 2 * H + j, gg);
      st(x, 2, b, 3 * H + j, o);
    }
}

/* views: 0 grad_gates, 1 grad_cx, 2 grad_hy (opt), 3 grad_cy (opt), 4 cx, 5 cy, 6 workspace */
static void lstm_bwd_rows(void *c, int64_t b0, int64_t b1) {
  rnn_ctx *x = c;
  int64_t H = x->a->H;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t j = 0; j < H; j++) {
      double i = ld(x, 6, b, j), f = ld(x, 6, b, H + j), g = ld(x, 6, b, 2 * H + j), o = ld(x, 6, b, 3 * H + j);
      double gh = ld_opt(x, 2, b, j), gc = ld_opt(x, 3, b, j);
      double tcy = tanh(ld(x, 5, b, j));
      double dcy = gh * o * (1.0 - tcy * tcy) + gc;
      st(x, 0, b, j, dcy * g * i * (1.0 - i));
      st(x, 0, b, H + j, dcy * ld(x, 4, b, j) * f * (1.0 - f));
      st(x, 0, b, 2 * H + j, dcy * i * (1.0 - g * g));
      st(x, 0, b, 3 * H + j, gh * tcy * o * (1.0 - o));
      st(x, 1, b, j, dcy * f);
    }
}

/* -------------------------------------------------------------- GRU */
/* views: 0 hy, 1 workspace, 3 igates, 4 hgates, 5 hx, 6 bias_i, 7 bias_h */
static void gru_fwd_rows(void *c, int64_t b0, int64_t b1) {
  rnn_ctx *x = c;
  int64_t H = x->a->H;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t j = 0; j < H; j++) {
      double r = sigm(ld(x, 3, b, j) + bias(x, 6, j) + ld(x, 4, b, j) + bias(x, 7, j));
      double z = sigm(ld(x, 3, b, H + j) + bias(x, 6, H + j) + ld(x, 4, b, H + j) + bias(x, 7, H + j));
      double hn = ld(x, 4, b, 2 * H + j) + bias(x, 7, 2 * H + j);
      double n = tanh(ld(x, 3, b, 2 * H + j) + bias(x, 6, 2 * H + j) + r * hn);
      double hx = ld(x, 5, b, j);
      st(x, 0, b, j, n + z * (hx - n));
      st(x, 1, b, j, r);
      st(x, 1, b, H + j, z);
      st(x, 1, b, 2 * H + j, n);
      st(x, 1, b, 3 * H + j, hx);
      st(x, 1, b, 4 * H + j, hn);
    }
}

/* views: 0 grad_igates, 1 grad_hgates, 2 grad_hx, 3 grad_hy, 4 workspace */
static void gru_bwd_rows(void *c, int64_t b0, int64_t b1) {
  rnn_ctx *x = c;
  int64_t H = x->a->H;
  for (int64_t b = b0; b < b1; b++)
    for (int64_t j = 0; j < H; j++) {
      double r = ld(x, 4, b, j), z = ld(x, 4, b, H + j), n = ld(x, 4, b, 2 * H + j);
      double hx = ld(x, 4, b, 3 * H + j), hn = ld(x, 4, b, 4 * H + j);
      double gh = ld(x, 3, b, j);
      double dn = gh * (1.0 - z) * (1.0 - n * n); /* through tanh */
      double dz = gh * (hx - n) * z * (1.0 - z);  /* through the update gate's sigmoid */
      double dr = dn * hn * r * (1.0 - r);        /* through the reset gate's sigmoid */
      st(x, 0, b, j, dr);
      st(x, 0, b, H + j, dz);
      st(x, 0, b, 2 * H + j, dn);
      st(x, 1, b, j, dr);
      st(x, 1, b, H + j, dz);
      st(x, 1, b, 2 * H + j, dn * r);
      st(x, 2, b, j, gh * z);
    }
}

typedef void (*rnn_rows_fn)(void *, int64_t, int64_t);

typedef struct {
  rnn_args a;
  rnn_rows_fn rows;
} rnn_launch;

static tpurt_status k_rnn(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  rnn_launch *l = p;
  rnn_ctx x;
  rnn_ctx_init(&x, &l->a);
  int64_t grain = l->a.H >= 4096 ? 1 : 4096 / (l->a.H + 1) + 1;
  tpurt_parallel_for(l->a.B, grain, l->rows, &x);
  return TPURT_OK;
}

enum { RNN_OUT = 0, RNN_IN = 1, RNN_OPT = 2, RNN_BIAS = 4 };

/* Checks view k (NULL allowed with RNN_OPT): device, floating dtype,
 * 2-D [B, cols] or with RNN_BIAS a 1-D bias [cols] (seen as
 * [1, cols], stride 0). RNN_IN views are only read (DeferAndFuse's
 * dependency notes). */
static tpurt_status rnn_add(tpurt_stream *s, rnn_launch *l, int k, const tpurt_view *v, int64_t cols, int flags,
                            const char *op, const char *what) {
  if (!v) {
    if (flags & RNN_OPT) return TPURT_OK;
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s is required", op, what);
  }
  tpurt__defer_note_reads(flags & RNN_IN);
  tpurt_status st = kc_check(s->dev, v, op, what);
  tpurt__defer_note_reads(0);
  if (st) return st;
  int is_bias = flags & RNN_BIAS;
  if (!kc_is_float(v->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be floating point", op, what);
  tpurt_view w = *v;
  if (is_bias) {
    if (v->ndim != 1 || v->sizes[0] != cols)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be [%" PRId64 "]", op, what, cols);
    w.ndim = 2;
    w.sizes[0] = 1;
    w.sizes[1] = cols;
    w.strides[0] = 0;
    w.strides[1] = v->strides[0];
  } else if (v->ndim != 2 || v->sizes[0] != l->a.B || v->sizes[1] != cols) {
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be [%" PRId64 ", %" PRId64 "]", op, what, l->a.B,
                      cols);
  }
  l->a.v[k] = w;
  l->a.present[k] = 1;
  return TPURT_OK;
}

/* One view of a launch: slot k, columns in units of H, flags, name. */
typedef struct {
  const tpurt_view *v;
  int k, hmul, flags;
  const char *what;
} rnn_spec;

/* Validates the views (B and H from the first one, [B, H]), then queues
 * rows over the batch. */
static tpurt_status rnn_run(tpurt_stream *s, const char *op, rnn_rows_fn rows, const rnn_spec *spec, int n) {
  const tpurt_view *first = spec[0].v;
  if (!first) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  tpurt_status st = tpurt__resolve_stream(&s, tpurt_devptr_device(first->ptr));
  if (st) return st;
  if (first->ndim != 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected a 2-D %s", op, spec[0].what);
  rnn_launch l;
  memset(&l, 0, sizeof l);
  l.a.B = first->sizes[0];
  l.a.H = first->sizes[1];
  l.rows = rows;
  for (int i = 0; i < n; i++) {
    if ((st = rnn_add(s, &l, spec[i].k, spec[i].v, spec[i].hmul * l.a.H, spec[i].flags, op, spec[i].what)))
      return st;
    if (spec[i].v && spec[i].v->dtype != first->dtype)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s has another dtype than %s", op, spec[i].what,
                        spec[0].what);
  }
  if (l.a.B * l.a.H == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_rnn, &l, sizeof l);
}

#define RNN_BIASES(n)                                                       \
  {bias_i, 6, n, RNN_IN | RNN_OPT | RNN_BIAS, "input_bias"}, {             \
    bias_h, 7, n, RNN_IN | RNN_OPT | RNN_BIAS, "hidden_bias"               \
  }

tpurt_status tpurt_lstm_cell(tpurt_stream *s, const tpurt_view *hy, const tpurt_view *cy,
                             const tpurt_view *workspace, const tpurt_view *igates, const tpurt_view *hgates,
                             const tpurt_view *cx, const tpurt_view *bias_i, const tpurt_view *bias_h) {
  TPURT__INIT_OR_RETURN();
  rnn_spec spec[] = {{hy, 0, 1, RNN_OUT, "hy"},           {cy, 1, 1, RNN_OUT, "cy"},
                     {workspace, 2, 4, RNN_OUT, "workspace"}, {igates, 3, 4, RNN_IN, "input_gates"},
                     {hgates, 4, 4, RNN_IN, "hidden_gates"}, {cx, 5, 1, RNN_IN, "cx"},
                     RNN_BIASES(4)};
  return rnn_run(s, "_thnn_fused_lstm_cell", lstm_fwd_rows, spec, 8);
}

tpurt_status tpurt_lstm_cell_backward(tpurt_stream *s, const tpurt_view *grad_gates, const tpurt_view *grad_cx,
                                      const tpurt_view *grad_hy, const tpurt_view *grad_cy, const tpurt_view *cx,
                                      const tpurt_view *cy, const tpurt_view *workspace) {
  TPURT__INIT_OR_RETURN();
  rnn_spec spec[] = {{grad_cx, 1, 1, RNN_OUT, "grad_cx"},   {grad_gates, 0, 4, RNN_OUT, "grad_gates"},
                     {grad_hy, 2, 1, RNN_IN | RNN_OPT, "grad_hy"}, {grad_cy, 3, 1, RNN_IN | RNN_OPT, "grad_cy"},
                     {cx, 4, 1, RNN_IN, "cx"},              {cy, 5, 1, RNN_IN, "cy"},
                     {workspace, 6, 4, RNN_IN, "workspace"}};
  return rnn_run(s, "_thnn_fused_lstm_cell_backward", lstm_bwd_rows, spec, 7);
}

tpurt_status tpurt_gru_cell(tpurt_stream *s, const tpurt_view *hy, const tpurt_view *workspace,
                            const tpurt_view *igates, const tpurt_view *hgates, const tpurt_view *hx,
                            const tpurt_view *bias_i, const tpurt_view *bias_h) {
  TPURT__INIT_OR_RETURN();
  rnn_spec spec[] = {{hy, 0, 1, RNN_OUT, "hy"},           {workspace, 1, 5, RNN_OUT, "workspace"},
                     {igates, 3, 3, RNN_IN, "input_gates"}, {hgates, 4, 3, RNN_IN, "hidden_gates"},
                     {hx, 5, 1, RNN_IN, "hx"},             RNN_BIASES(3)};
  return rnn_run(s, "_thnn_fused_gru_cell", gru_fwd_rows, spec, 7);
}

tpurt_status tpurt_gru_cell_backward(tpurt_stream *s, const tpurt_view *grad_igates, const tpurt_view *grad_hgates,
                                     const tpurt_view *grad_hx, const tpurt_view *grad_hy,
                                     const tpurt_view *workspace) {
  TPURT__INIT_OR_RETURN();
  rnn_spec spec[] = {{grad_hx, 2, 1, RNN_OUT, "grad_hx"},
                     {grad_igates, 0, 3, RNN_OUT, "grad_input_gates"},
                     {grad_hgates, 1, 3, RNN_OUT, "grad_hidden_gates"},
                     {grad_hy, 3, 1, RNN_IN, "grad_hy"},
                     {workspace, 4, 5, RNN_IN, "workspace"}};
  return rnn_run(s, "_thnn_fused_gru_cell_backward", gru_bwd_rows, spec, 5);
}
