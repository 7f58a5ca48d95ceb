/*
 * bench_ab.c — two builds of the runtime side by side in one process.
 *
 *   tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so KERNEL SHAPE...
 *     KERNEL gemm:    SHAPE M,N,K[,batch[,bf16]]  (f32, C = A @ B, plain layouts; bf16: bf16
 *                                            operands and result, DEFAULT precision)
 *     KERNEL softmax: SHAPE ROWS,D          (f32, along the last dim)
 *     KERNEL layernorm: SHAPE ROWS,D[,PASS] (f32, over the last dim, with a weight; PASS 0:
 *                                            forward saving the statistics, as PyTorch calls it
 *                                            (default), 1: backward, all three gradients)
 *     KERNEL sum:     SHAPE ROWS,D,DIM      (f32 sum of a ROWS x D matrix over dim 0 (columns: a bias
 *                                            gradient) or 1 (rows))
 *     KERNEL ew:      SHAPE OP:ROWS,D[,b|,s] (f32 elementwise op by name: unary, binary,
 *                                            activation backward or ternary)
 *     KERNEL conv:    SHAPE N,C,HW,CO,K,S,PASS[,bf16] (f32 — or bf16 — 2-D convolution of N images C x HW x HW
 *                                            to CO channels, K x K kernel, stride S, padding
 *                                            K / 2; PASS 0 forward, 1 input gradient,
 *                                            2 weight gradient)
 *     KERNEL groupnorm: SHAPE N,C,S,G,PASS[,bf16] (f32 — or bf16 — group norm of N samples of C
 *                                            channels of S elements in G groups, weight and
 *                                            bias; PASS 0 forward, 1 backward: input, weight
 *                                            and bias gradients)
 *     KERNEL batchnorm: SHAPE N,C,S,PASS[,bf16] (f32 — or bf16 — batch norm in training of N samples
 *                                            of C channels of S elements, weight and bias;
 *                                            PASS 0 forward, 1 backward)
 *     KERNEL attention: SHAPE B,H,L,D,CAUSAL,PASS (f32 fused attention of B x H heads, L queries and
 *                                            keys of D, q / k / v / out laid out [B, L, H, D]
 *                                            as a model's projections are; CAUSAL 0 or 1;
 *                                            PASS 0 forward with the log-sum-exp, 1 backward:
 *                                            dq, dk, dv; rate: GFLOP/s of the dense tile
 *                                            products, 4 (forward) or 10 (backward) B H L^2 D)
 *
 * On a shared host the speed of the machine moves by tens of percent
 * between (and within) processes, so two builds timed in separate runs
 * cannot be compared to a few percent. Here both builds are loaded
 * (dlopen with local, deep-bound symbols: each has its own device, stream
 * and thread pool), and every repeat times one sample of each, in
 * alternating order, with a pause before each sample (so that the other
 * build's pool threads have gone to sleep). Reported per shape: each
 * build's median and best rate, and the median and quartiles of the
 * paired ratios new / old — the figure that survives the host's drift.
 * Rates are GFLOP/s for gemm, million rows per second for softmax and
 * layernorm, million elements per second for ew.
 * --rotate N cycles every call over N separate sets of operands (default
 * 1): with N sets larger than the caches, each call reads its operands
 * from memory, as the kernels of a training step do, instead of from the
 * cache the previous call left them in.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tpurt.h"

#define MAX_REPEATS 101
#define MAX_ROTATE 64

typedef struct {
  const char *path;
  void *h;
  tpurt_status (*init)(void);
  tpurt_status (*stream_default)(int, tpurt_stream **);
  tpurt_status (*malloc_)(int, size_t, tpurt_stream *, tpurt_devptr *);
  tpurt_status (*free_)(tpurt_devptr);
  tpurt_status (*h2d)(tpurt_stream *, tpurt_devptr, const void *, size_t, int);
  tpurt_status (*gemm)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *, double, double,
                       tpurt_precision);
  tpurt_status (*softmax)(tpurt_stream *, const tpurt_view *, const tpurt_view *, int, int);
  tpurt_status (*reduce)(tpurt_stream *, tpurt_reduce_op, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                         double);
  tpurt_status (*layer_norm)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                             const tpurt_view *, const tpurt_view *, const tpurt_view *, int, double, int);
  tpurt_status (*layer_norm_bwd)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                 const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                 const tpurt_view *, int, int);
  tpurt_status (*conv[3])(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                          const tpurt_view *, const tpurt_conv_params *, tpurt_precision);
  tpurt_status (*group_norm)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                             const tpurt_view *, const tpurt_view *, const tpurt_view *, int, double);
  tpurt_status (*group_norm_bwd)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                 const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                 const tpurt_view *, int);
  tpurt_status (*batch_norm)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                             const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                             const tpurt_view *, int, double, double);
  tpurt_status (*batch_norm_bwd)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                 const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                 const tpurt_view *, const tpurt_view *, const tpurt_view *, int, double);
  tpurt_status (*elementwise)(tpurt_stream *, const tpurt_ew_program *, const tpurt_view *, const tpurt_view *, int,
                               const double *, int);
  tpurt_status (*attention)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                            const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_attention_params *);
  tpurt_status (*attention_bwd)(tpurt_stream *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                const tpurt_view *, const tpurt_view *, const tpurt_view *, const tpurt_view *,
                                const tpurt_attention_params *);
  const char *(*op_name)(tpurt_ew_op);
  tpurt_status (*sync)(tpurt_stream *);
  const char *(*last_error)(void);
  tpurt_stream *s;
} build;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void ck(const build *b, tpurt_status st) {
  if (st != TPURT_OK) {
    fprintf(stderr, "%s: %s\n", b->path, b->last_error());
    exit(1);
  }
}

static void *sym(build *b, const char *name) {
  void *p = dlsym(b->h, name);
  if (!p) {
    fprintf(stderr, "%s: no symbol %s\n", b->path, name);
    exit(2);
  }
  return p;
}

static void load(build *b, const char *path) {
  b->path = path;
  b->h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!b->h) {
    fprintf(stderr, "%s\n", dlerror());
    exit(2);
  }
  *(void **)&b->init = sym(b, "tpurt_init");
  *(void **)&b->stream_default = sym(b, "tpurt_stream_default");
  *(void **)&b->malloc_ = sym(b, "tpurt_malloc");
  *(void **)&b->free_ = sym(b, "tpurt_free");
  *(void **)&b->h2d = sym(b, "tpurt_memcpy_h2d");
  *(void **)&b->gemm = sym(b, "tpurt_gemm");
  *(void **)&b->softmax = sym(b, "tpurt_softmax");
  *(void **)&b->reduce = sym(b, "tpurt_reduce");
  *(void **)&b->layer_norm = sym(b, "tpurt_layer_norm");
  *(void **)&b->layer_norm_bwd = sym(b, "tpurt_layer_norm_backward");
  *(void **)&b->elementwise = sym(b, "tpurt_elementwise");
  *(void **)&b->group_norm = sym(b, "tpurt_group_norm");
  *(void **)&b->group_norm_bwd = sym(b, "tpurt_group_norm_backward");
  *(void **)&b->batch_norm = sym(b, "tpurt_batch_norm");
  *(void **)&b->batch_norm_bwd = sym(b, "tpurt_batch_norm_backward");
  *(void **)&b->attention = sym(b, "tpurt_attention");
  *(void **)&b->attention_bwd = sym(b, "tpurt_attention_backward");
  *(void **)&b->conv[0] = sym(b, "tpurt_conv2d");
  *(void **)&b->conv[1] = sym(b, "tpurt_conv2d_backward_input");
  *(void **)&b->conv[2] = sym(b, "tpurt_conv2d_backward_weight");
  *(void **)&b->op_name = sym(b, "tpurt_ew_op_name");
  *(void **)&b->sync = sym(b, "tpurt_stream_synchronize");
  *(void **)&b->last_error = sym(b, "tpurt_last_error");
  ck(b, b->init());
  ck(b, b->stream_default(0, &b->s));
}

/* a dense f32 view of n rows x c columns, batch nb (3-D) */
static tpurt_view view3(tpurt_devptr p, int64_t nb, int64_t n, int64_t c) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p;
  v.dtype = TPURT_F32;
  v.ndim = 3;
  v.sizes[0] = nb, v.sizes[1] = n, v.sizes[2] = c;
  v.strides[0] = n * c, v.strides[1] = c, v.strides[2] = 1;
  return v;
}

/* an f32 NCHW view of n images c x h x w */
static tpurt_view view4(tpurt_devptr p, int64_t n, int64_t c, int64_t h, int64_t w) {
  tpurt_view v = view3(p, n, c, h * w);
  v.ndim = 4;
  v.sizes[2] = h, v.sizes[3] = w;
  v.strides[2] = w, v.strides[3] = 1;
  return v;
}

enum { K_GEMM, K_SOFTMAX, K_LAYERNORM, K_EW, K_CONV, K_GROUPNORM, K_BATCHNORM, K_SUM, K_ATTN };
typedef struct {
  int kind, nset, bf16; /* gemm: bf16 operands and result */
  int bcast;            /* ew: the second input a [D] row broadcast over the rows (stride 0) */
  int64_t M, N, K, nb; /* softmax, layernorm, ew: M rows of K */
  int64_t cv[7];       /* conv: N, C, HW, CO, K, S, pass; group / batch norm: N, C, S, G (1), pass; sum: dim;
                          attention: B, H, L, D, causal, pass */
  tpurt_ew_program prog; /* ew: load inputs, the op, out of its register */
  int nin;
  tpurt_devptr a[MAX_ROTATE], b[MAX_ROTATE], c[MAX_ROTATE];
  tpurt_view va[MAX_ROTATE], vb[MAX_ROTATE], vc[MAX_ROTATE];
  tpurt_devptr stats[MAX_ROTATE], par[MAX_ROTATE]; /* groupnorm: mean and rstd; w, b, dw, db;
                                                      attention: lse; out, dout, dq, dk, dv */
} work;

static tpurt_devptr upload(build *b, size_t n, unsigned mul) {
  float *h = malloc(n * sizeof(float));
  if (!h) exit(3);
  for (size_t i = 0; i < n; i++) h[i] = (float)((i * mul) % 13) * 0.1f - 0.6f;
  tpurt_devptr d;
  ck(b, b->malloc_(0, n * sizeof(float), b->s, &d));
  ck(b, b->h2d(b->s, d, h, n * sizeof(float), 0));
  free(h);
  return d;
}

/* n bf16 values (the f32 pattern of upload, truncated to bf16) */
static tpurt_devptr upload_bf16(build *b, size_t n, unsigned mul) {
  uint16_t *h = malloc(n * sizeof(uint16_t));
  if (!h) exit(3);
  for (size_t i = 0; i < n; i++) {
    float f = (float)((i * mul) % 13) * 0.1f - 0.6f;
    uint32_t u;
    memcpy(&u, &f, 4);
    h[i] = (uint16_t)(u >> 16);
  }
  tpurt_devptr d;
  ck(b, b->malloc_(0, n * sizeof(uint16_t), b->s, &d));
  ck(b, b->h2d(b->s, d, h, n * sizeof(uint16_t), 0));
  free(h);
  return d;
}

/* a dense 1-D f32 view of n elements at element off of p */
static tpurt_view view1(tpurt_devptr p, int64_t off, int64_t n) {
  tpurt_view v = view3(p + (tpurt_devptr)off * sizeof(float), 1, 1, n);
  v.ndim = 1;
  v.sizes[0] = n, v.strides[0] = 1;
  return v;
}

/* group / batch norm views of set i: the statistics (per sample and group,
 * or per channel) and the four parameter vectors */
static void gn_views(const work *w, int i, tpurt_view *mean, tpurt_view *rstd, tpurt_view *par) {
  int64_t ng = w->kind == K_BATCHNORM ? w->cv[1] : w->cv[0] * w->cv[3], c = w->cv[1];
  *mean = view1(w->stats[i], 0, ng), *rstd = view1(w->stats[i], ng, ng);
  for (int k = 0; k < 4; k++) par[k] = view1(w->par[i], k * c, c);
}

/* layer norm views of set i: mean and rstd per row, w, dw, db (the forward uses the first three) */
static void ln_views(const work *w, int i, tpurt_view *mean, tpurt_view *rstd, tpurt_view *par) {
  *mean = view1(w->stats[i], 0, w->M), *rstd = view1(w->stats[i], w->M, w->M);
  for (int k = 0; k < 3; k++) par[k] = view1(w->par[i], k * w->K, w->K);
}

/* attention views of set i: q, k, v, out, dout, dq, dk, dv ([B, H, L, D] over [B, L, H, D] memory) and lse */
static void attn_views(const work *w, int i, tpurt_view v[8], tpurt_view *lse) {
  int64_t B = w->cv[0], H = w->cv[1], L = w->cv[2], D = w->cv[3], n = B * L * H * D;
  tpurt_devptr base[8] = {w->a[i], w->b[i], w->c[i]};
  for (int k = 3; k < 8; k++) base[k] = w->par[i] + (tpurt_devptr)((k - 3) * n) * sizeof(float);
  for (int k = 0; k < 8; k++) {
    tpurt_view x = view4(base[k], B, H, L, D);
    x.strides[0] = L * H * D, x.strides[1] = D, x.strides[2] = H * D, x.strides[3] = 1;
    v[k] = x;
  }
  *lse = view3(w->stats[i], B, H, L);
}

static tpurt_attention_params attn_params(const work *w) {
  tpurt_attention_params p;
  memset(&p, 0, sizeof p);
  p.scale = 1.0 / sqrt((double)w->cv[3]);
  p.is_causal = (int)w->cv[4];
  p.precision = TPURT_PRECISION_HIGHEST;
  return p;
}

static void setup(build *b, work *w) {
  for (int i = 0; i < w->nset; i++) {
    if (w->kind == K_ATTN) { /* a, b, c: q, k, v; par: out, dout, dq, dk, dv; stats: lse */
      size_t n = (size_t)(w->cv[0] * w->cv[1] * w->cv[2] * w->cv[3]);
      w->a[i] = upload(b, n, 7), w->b[i] = upload(b, n, 5), w->c[i] = upload(b, n, 3);
      w->par[i] = upload(b, 5 * n, 11), w->stats[i] = upload(b, (size_t)(w->cv[0] * w->cv[1] * w->cv[2]), 1);
      tpurt_view v[8], lse;
      attn_views(w, i, v, &lse);
      tpurt_attention_params p = attn_params(w);
      ck(b, b->attention(b->s, &v[3], &lse, &v[0], &v[1], &v[2], NULL, &p));
    } else if (w->kind == K_LAYERNORM) { /* a: x, b: dy, c: y or dx; the forward fills the statistics */
      w->a[i] = upload(b, (size_t)(w->M * w->K), 7), w->b[i] = upload(b, (size_t)(w->M * w->K), 5);
      w->c[i] = upload(b, (size_t)(w->M * w->K), 3);
      w->va[i] = view3(w->a[i], 1, w->M, w->K), w->vb[i] = view3(w->b[i], 1, w->M, w->K);
      w->vc[i] = view3(w->c[i], 1, w->M, w->K);
      w->stats[i] = upload(b, (size_t)(2 * w->M), 1), w->par[i] = upload(b, (size_t)(3 * w->K), 11);
      tpurt_view m, r, par[3];
      ln_views(w, i, &m, &r, par);
      ck(b, b->layer_norm(b->s, &w->vc[i], &m, &r, &w->va[i], &par[0], NULL, 1, 1e-5, 0));
    } else if (w->kind == K_GROUPNORM || w->kind == K_BATCHNORM) { /* a: x, b: dy, c: y or dx */
      const int64_t *g = w->cv;
      tpurt_devptr (*up)(build *, size_t, unsigned) = w->bf16 ? upload_bf16 : upload;
      size_t n = (size_t)(g[0] * g[1] * g[2]);
      w->a[i] = up(b, n, 7), w->b[i] = up(b, n, 5), w->c[i] = up(b, n, 3);
      w->va[i] = view3(w->a[i], g[0], g[1], g[2]);
      w->vb[i] = view3(w->b[i], g[0], g[1], g[2]);
      w->vc[i] = view3(w->c[i], g[0], g[1], g[2]);
      if (w->bf16) w->va[i].dtype = w->vb[i].dtype = w->vc[i].dtype = TPURT_BF16;
      w->stats[i] = upload(b, (size_t)(2 * (w->kind == K_BATCHNORM ? g[1] : g[0] * g[3])), 1);
      w->par[i] = upload(b, (size_t)(4 * g[1]), 11);
      tpurt_view m, r, par[4];
      gn_views(w, i, &m, &r, par);
      if (w->kind == K_BATCHNORM)
        ck(b, b->batch_norm(b->s, &w->vc[i], &m, &r, &w->va[i], &par[0], &par[1], NULL, NULL, 1, 0.1, 1e-5));
      else
        ck(b, b->group_norm(b->s, &w->vc[i], &m, &r, &w->va[i], &par[0], &par[1], (int)g[3], 1e-5));
    } else if (w->kind == K_CONV) { /* a: x, b: w, c: y */
      const int64_t *g = w->cv, ho = (g[2] + 2 * (g[4] / 2) - g[4]) / g[5] + 1;
      tpurt_devptr (*up)(build *, size_t, unsigned) = w->bf16 ? upload_bf16 : upload;
      w->a[i] = up(b, (size_t)(g[0] * g[1] * g[2] * g[2]), 7);
      w->b[i] = up(b, (size_t)(g[3] * g[1] * g[4] * g[4]), 5);
      w->c[i] = up(b, (size_t)(g[0] * g[3] * ho * ho), 3);
      w->va[i] = view4(w->a[i], g[0], g[1], g[2], g[2]);
      w->vb[i] = view4(w->b[i], g[3], g[1], g[4], g[4]);
      w->vc[i] = view4(w->c[i], g[0], g[3], ho, ho);
      if (w->bf16) w->va[i].dtype = w->vb[i].dtype = w->vc[i].dtype = TPURT_BF16;
    } else if (w->kind == K_GEMM) {
      tpurt_devptr (*up)(build *, size_t, unsigned) = w->bf16 ? upload_bf16 : upload;
      w->a[i] = up(b, (size_t)(w->nb * w->M * w->K), 7);
      w->b[i] = up(b, (size_t)(w->nb * w->K * w->N), 5);
      w->c[i] = up(b, (size_t)(w->nb * w->M * w->N), 3);
      w->va[i] = view3(w->a[i], w->nb, w->M, w->K);
      w->vb[i] = view3(w->b[i], w->nb, w->K, w->N);
      w->vc[i] = view3(w->c[i], w->nb, w->M, w->N);
      if (w->bf16) w->va[i].dtype = w->vb[i].dtype = w->vc[i].dtype = TPURT_BF16;
    } else {
      w->a[i] = upload(b, (size_t)(w->M * w->K), 7);
      w->c[i] = upload(b, (size_t)(w->M * w->K), 3);
      w->b[i] = w->kind == K_EW && w->nin >= 2 ? upload(b, (size_t)(w->M * w->K), 5) : 0;
      w->vb[i] = view3(w->b[i], 1, w->M, w->K);
      if (w->bcast) w->vb[i].strides[1] = 0;
      w->va[i] = view3(w->a[i], 1, w->M, w->K);
      w->vc[i] = view3(w->c[i], 1, w->M, w->K);
      if (w->kind == K_SUM) { /* the result: a broadcast view, stride 0 along the reduced dim */
        w->vc[i].strides[w->cv[0] ? 2 : 1] = 0;
        w->vc[i].strides[w->cv[0] ? 1 : 2] = 1;
      }
    }
  }
}

/* call q of a sample: operand set q % nset */
static void run(build *b, const work *w, int q) {
  int i = q % w->nset;
  if (w->kind == K_ATTN) {
    tpurt_view v[8], lse;
    attn_views(w, i, v, &lse);
    tpurt_attention_params p = attn_params(w);
    if (w->cv[5] == 0)
      ck(b, b->attention(b->s, &v[3], &lse, &v[0], &v[1], &v[2], NULL, &p));
    else
      ck(b, b->attention_bwd(b->s, &v[5], &v[6], &v[7], NULL, &v[4], &v[0], &v[1], &v[2], &v[3], &lse, NULL, &p));
  } else if (w->kind == K_GROUPNORM) {
    tpurt_view m, r, par[4];
    gn_views(w, i, &m, &r, par);
    if (w->cv[4] == 0)
      ck(b, b->group_norm(b->s, &w->vc[i], &m, &r, &w->va[i], &par[0], &par[1], (int)w->cv[3], 1e-5));
    else
      ck(b, b->group_norm_bwd(b->s, &w->vc[i], &par[2], &par[3], &w->vb[i], &w->va[i], &m, &r, &par[0],
                              (int)w->cv[3]));
  } else if (w->kind == K_BATCHNORM) {
    tpurt_view m, r, par[4];
    gn_views(w, i, &m, &r, par);
    if (w->cv[4] == 0)
      ck(b, b->batch_norm(b->s, &w->vc[i], &m, &r, &w->va[i], &par[0], &par[1], NULL, NULL, 1, 0.1, 1e-5));
    else
      ck(b, b->batch_norm_bwd(b->s, &w->vc[i], &par[2], &par[3], &w->vb[i], &w->va[i], &par[0], NULL, NULL, &m, &r,
                              1, 1e-5));
  } else if (w->kind == K_CONV) {
    int64_t k = w->cv[4], st = w->cv[5];
    tpurt_conv_params p = {{st, st}, {k / 2, k / 2}, {1, 1}, 1};
    const tpurt_view *x = &w->va[i], *wt = &w->vb[i], *y = &w->vc[i];
    tpurt_precision pr = w->bf16 ? TPURT_PRECISION_DEFAULT : TPURT_PRECISION_HIGHEST;
    if (w->cv[6] == 0) ck(b, b->conv[0](b->s, y, x, wt, NULL, &p, pr));
    else if (w->cv[6] == 1) ck(b, b->conv[1](b->s, x, y, wt, NULL, &p, pr));
    else ck(b, b->conv[2](b->s, wt, NULL, y, x, &p, pr));
  } else if (w->kind == K_GEMM)
    ck(b, b->gemm(b->s, &w->vc[i], &w->va[i], &w->vb[i], 1.0, 0.0,
                  w->bf16 ? TPURT_PRECISION_DEFAULT : TPURT_PRECISION_HIGHEST));
  else if (w->kind == K_EW) {
    tpurt_view in[3] = {w->va[i], w->vb[i], w->vb[i]}; /* a ternary op reads b twice */
    ck(b, b->elementwise(b->s, &w->prog, &w->vc[i], in, w->nin, NULL, 0));
  } else if (w->kind == K_SOFTMAX)
    ck(b, b->softmax(b->s, &w->vc[i], &w->va[i], 2, 0));
  else if (w->kind == K_SUM)
    ck(b, b->reduce(b->s, TPURT_RED_SUM, &w->vc[i], NULL, &w->va[i], 0.0));
  else {
    tpurt_view m, r, par[3];
    ln_views(w, i, &m, &r, par);
    if (w->cv[0] == 1)
      ck(b, b->layer_norm_bwd(b->s, &w->vc[i], &par[1], &par[2], &w->vb[i], &w->va[i], &m, &r, &par[0], 1, 0));
    else
      ck(b, b->layer_norm(b->s, &w->vc[i], &m, &r, &w->va[i], &par[0], NULL, 1, 1e-5, 0));
  }
}

static void teardown(build *b, work *w) {
  ck(b, b->sync(b->s));
  for (int i = 0; i < w->nset; i++) {
    b->free_(w->a[i]);
    if (w->b[i]) b->free_(w->b[i]);
    b->free_(w->c[i]);
    if (w->stats[i]) b->free_(w->stats[i]), b->free_(w->par[i]);
  }
}

/* ew: the program for op `name` (len chars): load its inputs, the op, store */
static int ew_program(build *b, const char *name, size_t len, work *w) {
  for (int op = 0; op < TPURT_EW_NUM_OPS; op++) {
    const char *o = b->op_name((tpurt_ew_op)op);
    if (!o || strlen(o) != len || strncmp(o, name, len)) continue;
    /* sources by the op's section of tpurt_ew_op: binary ops and activation
     * backwards read 2, where / clamp / lerp / addcmul / addcdiv 3, the others
     * (unary ops; the special functions) 1 */
    w->nin = op >= TPURT_EW_ADD && op < TPURT_EW_WHERE ? 2 : op >= TPURT_EW_WHERE && op <= TPURT_EW_ADDCDIV ? 3 : 1;
    memset(&w->prog, 0, sizeof w->prog);
    w->prog.compute = TPURT_F32;
    for (int s = 0; s < w->nin; s++) {
      w->prog.inst[s].op = TPURT_EW_LOAD;
      w->prog.inst[s].dst = (uint8_t)s;
      w->prog.inst[s].p[0] = s;
    }
    tpurt_ew_inst *I = &w->prog.inst[w->nin];
    I->op = (uint16_t)op;
    I->p[0] = op == TPURT_EW_ADD || op == TPURT_EW_SUB ? 1.0 : 0.0; /* alpha */
    I->dst = (uint8_t)w->nin;
    for (int s = 0; s < w->nin; s++) I->src[s] = (uint8_t)s;
    w->prog.ninst = w->nin + 1;
    w->prog.nout = 1;
    w->prog.out_reg[0] = (uint8_t)w->nin;
    return 1;
  }
  fprintf(stderr, "no elementwise op %.*s\n", (int)len, name);
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so gemm M,N,K[,batch[,bf16]]...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so softmax ROWS,D...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so layernorm ROWS,D[,PASS]...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so sum ROWS,D,DIM...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so ew OP:ROWS,D[,b|,s]...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so conv N,C,HW,CO,K,S,PASS[,bf16]...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so groupnorm N,C,S,G,PASS[,bf16]...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so batchnorm N,C,S,PASS[,bf16]...\n"
          "       tpurt_bench_ab [--repeats R] [--rotate N] OLD/libtpurt.so NEW/libtpurt.so attention B,H,L,D,CAUSAL,PASS...\n"
          "Times the two runtime builds in one process, alternating samples; prints each build's median\n"
          "and best rate and the median (quartiles) of the paired ratios new / old. ew: an f32\n"
          "elementwise op by name (gelu, add, gelu_backward, where, ...); ,b: its second input one row of D\n"
          "broadcast over the rows; ,s: a constant (0.5). conv: N images C x HW x HW to CO\n"
          "channels, K x K kernel, stride S, padding K / 2; PASS 0 forward, 1 input gradient, 2 weight gradient.\n"
          "layernorm: with a weight; PASS 0 forward saving mean and rstd (default), 1 backward (input, weight and\n"
          "bias gradients).\n"
          "groupnorm: N samples of C channels of S elements in G groups; PASS 0 forward, 1 backward.\n"
          "batchnorm: training batch norm of N samples of C channels of S elements; PASS 0 forward, 1 backward.\n"
          "sum: f32 sum of a ROWS x D matrix over DIM 0 (one result per column) or 1 (per row).\n"
          "attention: f32 fused attention, B x H heads of L queries and keys of D (laid out [B, L, H, D]),\n"
          "CAUSAL 0 or 1; PASS 0 forward, 1 backward; GFLOP/s of the dense tile products.\n"
          "--rotate N: calls\n"
          "cycle over N operand sets (N sets beyond the caches: operands come from memory).\n");
  exit(2);
}

int main(int argc, char **argv) {
  int repeats = 15, nset = 1, i = 1;
  if (i < argc && !strcmp(argv[i], "--help")) usage();
  for (;;) {
    if (i + 1 < argc && !strcmp(argv[i], "--repeats"))
      repeats = atoi(argv[i + 1]), i += 2;
    else if (i + 1 < argc && !strcmp(argv[i], "--rotate"))
      nset = atoi(argv[i + 1]), i += 2;
    else
      break;
  }
  if (repeats < 3 || repeats > MAX_REPEATS || nset < 1 || nset > MAX_ROTATE || argc - i < 4) usage();
  const char *kname = argv[i + 2];
  int kind = !strcmp(kname, "gemm")        ? K_GEMM
             : !strcmp(kname, "softmax")   ? K_SOFTMAX
             : !strcmp(kname, "layernorm") ? K_LAYERNORM
             : !strcmp(kname, "ew")        ? K_EW
             : !strcmp(kname, "conv")      ? K_CONV
             : !strcmp(kname, "groupnorm") ? K_GROUPNORM
             : !strcmp(kname, "batchnorm") ? K_BATCHNORM
             : !strcmp(kname, "sum")       ? K_SUM
             : !strcmp(kname, "attention") ? K_ATTN
                                           : -1;
  if (kind < 0) usage();
  int gemm = kind == K_GEMM || kind == K_CONV || kind == K_ATTN; /* rates in GFLOP/s */
  build bld[2];
  load(&bld[0], argv[i]);
  load(&bld[1], argv[i + 1]);
  int elems = kind == K_EW || kind == K_GROUPNORM || kind == K_BATCHNORM || kind == K_SUM; /* million elements/s */
  printf("old %s\nnew %s\n%s, %d paired repeats, %d operand set(s) (rates: %s)\n", argv[i], argv[i + 1], kname,
         repeats, nset, gemm ? "GFLOP/s" : elems ? "million elements/s" : "million rows/s");
  for (int a = i + 3; a < argc; a++) {
    long long m = 0, n = 0, k = 0, nb = 1;
    const char *dims = argv[a], *colon = strchr(argv[a], ':');
    work w[2];
    memset(w, 0, sizeof w);
    if (kind == K_EW) { /* OP:ROWS,D */
      if (!colon || !ew_program(&bld[0], argv[a], (size_t)(colon - argv[a]), &w[0])) usage();
      w[1].prog = w[0].prog, w[1].nin = w[0].nin;
      dims = colon + 1;
    }
    long long g[7] = {0};
    if (kind == K_CONV) { /* as a product: M = CO, N = N * Ho * Wo, K = C * K * K */
      char dt[8] = "";
      int got = sscanf(dims, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%7s", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], dt);
      if (got == 8 && strcmp(dt, "bf16")) usage();
      w[0].bf16 = w[1].bf16 = got == 8;
      if (got < 7 ||
          g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[3] <= 0 || g[4] <= 0 || g[5] <= 0 || g[6] < 0 || g[6] > 2 ||
          g[2] + 2 * (g[4] / 2) < g[4])
        usage();
      long long ho = (g[2] + 2 * (g[4] / 2) - g[4]) / g[5] + 1;
      m = g[3], n = g[0] * ho * ho, k = g[1] * g[4] * g[4];
    } else if (kind == K_GROUPNORM) { /* rates: million elements/s (M rows of K = N * C * S) */
      char dt[8] = "";
      int got = sscanf(dims, "%lld,%lld,%lld,%lld,%lld,%7s", &g[0], &g[1], &g[2], &g[3], &g[4], dt);
      if (got == 6 && strcmp(dt, "bf16")) usage();
      w[0].bf16 = w[1].bf16 = got == 6;
      if (got < 5 || g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[3] <= 0 || g[1] % g[3] || g[4] < 0 || g[4] > 1) usage();
      m = g[0] * g[1] * g[2], n = 1;
    } else if (kind == K_BATCHNORM) { /* rates: million elements/s */
      char dt[8] = "";
      int got = sscanf(dims, "%lld,%lld,%lld,%lld,%7s", &g[0], &g[1], &g[2], &g[4], dt);
      if (got == 5 && strcmp(dt, "bf16")) usage();
      w[0].bf16 = w[1].bf16 = got == 5;
      g[3] = 1;
      if (got < 4 || g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[4] < 0 || g[4] > 1) usage();
      m = g[0] * g[1] * g[2], n = 1;
    } else if (kind == K_ATTN) { /* as a product: M = B H L, N = L, K = D, flops times 2 (forward) or 5 */
      if (sscanf(dims, "%lld,%lld,%lld,%lld,%lld,%lld", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5]) != 6 || g[0] <= 0 ||
          g[1] <= 0 || g[2] <= 0 || g[3] <= 0 || g[4] < 0 || g[4] > 1 || g[5] < 0 || g[5] > 1)
        usage();
      m = g[0] * g[1] * g[2], n = g[2], k = g[3] * (g[5] ? 5 : 2);
    } else if (kind == K_SUM) { /* rates: million elements/s */
      if (sscanf(dims, "%lld,%lld,%lld", &m, &n, &g[0]) != 3 || m <= 0 || n <= 0 || g[0] < 0 || g[0] > 1) usage();
    } else {
      char dt[8] = "";
      int got = sscanf(dims, "%lld,%lld,%lld,%lld,%7s", &m, &n, &k, &nb, dt);
      if (kind == K_EW && got == 2 && sscanf(dims, "%lld,%lld,%7s", &m, &n, dt) == 3) {
        if (strcmp(dt, "b") && strcmp(dt, "s")) usage();
        if (dt[0] == 'b') w[0].bcast = w[1].bcast = 1; /* OP:ROWS,D,b */
        if (dt[0] == 's') { /* OP:ROWS,D,s: the second input a constant */
          if (w[0].nin < 2) usage();
          for (int q = 0; q < 2; q++) {
            w[q].prog.inst[1].op = TPURT_EW_CONST;
            w[q].prog.inst[1].p[0] = 0.5;
            if (w[q].nin == 2) w[q].nin = 1;
          }
        }
      }
      if (kind == K_LAYERNORM && got == 3) { /* ROWS,D,PASS */
        if (k < 0 || k > 1) usage();
        g[0] = k, got = 2;
      }
      if (gemm ? got < 3 : got != 2) usage();
      if (got == 5 && strcmp(dt, "bf16")) usage();
      w[0].bf16 = w[1].bf16 = got == 5;
    }
    for (int b = 0; b < 2; b++) {
      for (int q = 0; q < 7; q++) w[b].cv[q] = g[q];
      w[b].kind = kind;
      w[b].nset = nset;
      w[b].M = m, w[b].N = gemm ? n : 0, w[b].K = gemm ? k : n, w[b].nb = gemm ? nb : 1;
      if (w[b].M <= 0 || w[b].K <= 0 || (gemm && (w[b].N <= 0 || w[b].nb <= 0))) usage();
      setup(&bld[b], &w[b]);
    }
    double units = gemm ? 2.0 * m * n * k * nb / 1e9 : elems ? (double)m * n / 1e6 : m / 1e6; /* per call */
    /* seconds per call at ~100 GFLOP/s, 20 M rows/s, 2000 M elements/s */
    double work_s = gemm ? units / 100.0 : elems ? units / 2000.0 : units / 20.0;
    int inner = ((int)(0.03 / work_s) / nset + 1) * nset; /* ~30 ms samples, whole rotations */
    double rate[2][MAX_REPEATS], ratio[MAX_REPEATS];
    for (int r = -1; r < repeats; r++) {
      for (int j = 0; j < 2; j++) {
        int b = (j + (r < 0 ? 0 : r)) % 2; /* alternate which build goes first */
        usleep(5000);
        run(&bld[b], &w[b], 0); /* warm: the pool wakes, buffers are in place */
        ck(&bld[b], bld[b].sync(bld[b].s));
        double t0 = now();
        for (int q = 0; q < inner; q++) run(&bld[b], &w[b], q);
        ck(&bld[b], bld[b].sync(bld[b].s));
        if (r >= 0) rate[b][r] = units * inner / (now() - t0);
      }
      if (r >= 0) ratio[r] = rate[1][r] / rate[0][r];
    }
    for (int b = 0; b < 2; b++) qsort(rate[b], (size_t)repeats, sizeof(double), cmpd);
    qsort(ratio, (size_t)repeats, sizeof(double), cmpd);
    printf("%-22s old %8.1f (best %8.1f)  new %8.1f (best %8.1f)  new/old %.3f [%.3f, %.3f]\n", argv[a],
           rate[0][repeats / 2], rate[0][repeats - 1], rate[1][repeats / 2], rate[1][repeats - 1], ratio[repeats / 2],
           ratio[repeats / 4], ratio[3 * repeats / 4]);
    fflush(stdout);
    for (int b = 0; b < 2; b++) teardown(&bld[b], &w[b]);
  }
  return 0;
}
