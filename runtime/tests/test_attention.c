/* test_attention.c — tpurt_attention / tpurt_attention_backward against a
 * naive double reference: plain and [B, L, H, D]-strided layouts, sizes not
 * multiples of the blocks, causal with L != S, bool and float masks with
 * broadcast, fully masked rows, GQA, bf16, dropout (mask regenerated from
 * the documented Philox mapping), empty shapes and argument errors. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static float bf16r(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  x &= 0xffff0000u;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t to_bf16(float f) {
  uint32_t x;
  f = bf16r(f);
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

/* 4-D tensor: host doubles (logical, row-major) + device copy with a layout. */
typedef struct {
  int64_t sz[4], st[4];
  tpurt_dtype dt;
  double *x;     /* logical values, row-major */
  tpurt_devptr d;
  size_t bytes;
  tpurt_view v;
} t4;

static int64_t n4(const int64_t *s) { return s[0] * s[1] * s[2] * s[3]; }

/* perm: order of dims from outermost to innermost in memory */
static void t4_init(t4 *t, tpurt_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, const int *perm, int fill) {
  memset(t, 0, sizeof *t);
  t->sz[0] = a, t->sz[1] = b, t->sz[2] = c, t->sz[3] = d;
  t->dt = dt;
  int def[4] = {0, 1, 2, 3};
  if (!perm) perm = def;
  int64_t s = 1;
  for (int k = 3; k >= 0; k--) {
    t->st[perm[k]] = s;
    s *= t->sz[perm[k]];
  }
  int64_t n = n4(t->sz);
  t->x = calloc((size_t)(n ? n : 1), sizeof(double));
  t->bytes = (size_t)(n ? n : 1) * tpurt_dtype_size(dt);
  CHECK_OK(tpurt_malloc(0, t->bytes, S, &t->d));
  t->v.ptr = t->d;
  t->v.dtype = dt;
  t->v.ndim = 4;
  for (int k = 0; k < 4; k++) t->v.sizes[k] = t->sz[k], t->v.strides[k] = t->st[k];
  if (fill) {
    void *h = calloc(1, t->bytes);
    int64_t i = 0;
    for (int64_t p = 0; p < t->sz[0]; p++)
      for (int64_t q = 0; q < t->sz[1]; q++)
        for (int64_t r = 0; r < t->sz[2]; r++)
          for (int64_t u = 0; u < t->sz[3]; u++, i++) {
            double v = urand();
            int64_t o = p * t->st[0] + q * t->st[1] + r * t->st[2] + u * t->st[3];
            if (dt == TPURT_F32) {
              ((float *)h)[o] = (float)v;
              t->x[i] = (float)v;
            } else if (dt == TPURT_BF16) {
              ((uint16_t *)h)[o] = to_bf16((float)v);
              t->x[i] = bf16r((float)v);
            }
          }
    CHECK_OK(tpurt_memcpy_h2d(S, t->d, h, t->bytes, 0));
    free(h);
  }
}
/* device -> logical doubles */
static double *t4_get(t4 *t) {
  void *h = calloc(1, t->bytes);
  CHECK_OK(tpurt_memcpy_d2h(S, h, t->d, t->bytes, 0));
  int64_t n = n4(t->sz), i = 0;
  double *r = calloc((size_t)(n ? n : 1), sizeof(double));
  for (int64_t p = 0; p < t->sz[0]; p++)
    for (int64_t q = 0; q < t->sz[1]; q++)
      for (int64_t s = 0; s < t->sz[2]; s++)
        for (int64_t u = 0; u < t->sz[3]; u++, i++) {
          int64_t o = p * t->st[0] + q * t->st[1] + s * t->st[2] + u * t->st[3];
          r[i] = t->dt == TPURT_F32 ? ((float *)h)[o] : from_bf16(((uint16_t *)h)[o]);
        }
  free(h);
  return r;
}
static void t4_free(t4 *t) {
  free(t->x);
  tpurt_free(t->d);
}

static int keep(uint64_t seed, uint64_t off, int64_t bh, int64_t L, int64_t S_, int64_t i, int64_t j, double p) {
  uint64_t blk = off + (uint64_t)((bh * L + i) * ((S_ + 3) / 4) + j / 4);
  uint32_t c[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, 0}, k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, w[4];
  tpurt_philox4x32_10(c, k, w);
  float u = (float)(w[j % 4] >> 8) * (1.0f / 16777216.0f);
  return u >= (float)p;
}

typedef struct {
  int64_t B, H, Hk, L, S, D, Dv;
  int causal, mask; /* mask: 0 none, 1 bool [L, S] broadcast, 2 float [1, H, L, S] broadcast over B */
  int masked_row;   /* bool mask: row 1 fully masked */
  double p;
  tpurt_dtype dt;
  int strided;
} cfg;

static void run(const cfg *c) {
  int64_t B = c->B, H = c->H, Hk = c->Hk, L = c->L, Sk = c->S, D = c->D, Dv = c->Dv;
  int perm[4] = {0, 2, 1, 3}; /* [B, L, H, D] in memory */
  const int *pm = c->strided ? perm : NULL;
  t4 q, k, v, out, dout, dq, dk, dv, mask, dmask;
  t4_init(&q, c->dt, B, H, L, D, pm, 1);
  t4_init(&k, c->dt, B, Hk, Sk, D, pm, 1);
  t4_init(&v, c->dt, B, Hk, Sk, Dv, pm, 1);
  t4_init(&dout, c->dt, B, H, L, Dv, pm, 1);
  t4_init(&out, c->dt, B, H, L, Dv, NULL, 0);
  t4_init(&dq, c->dt, B, H, L, D, NULL, 0);
  t4_init(&dk, c->dt, B, Hk, Sk, D, NULL, 0);
  t4_init(&dv, c->dt, B, Hk, Sk, Dv, NULL, 0);
  t4_init(&dmask, TPURT_F32, B, H, L, Sk, NULL, 0);
  /* mask storage: bool [L, S] or f32 [H, L, S] */
  double *mvals = calloc((size_t)(H * L * Sk + 1), sizeof(double));
  tpurt_view mv;
  memset(&mv, 0, sizeof mv);
  tpurt_devptr mptr = 0;
  if (c->mask) {
    size_t n = (size_t)(c->mask == 1 ? L * Sk : H * L * Sk);
    size_t es = c->mask == 1 ? 1 : 4;
    void *h = calloc(n + 1, es);
    for (size_t i = 0; i < n; i++) {
      if (c->mask == 1) {
        int64_t row = (int64_t)i / (Sk ? Sk : 1);
        int on = (c->masked_row && row == 1) ? 0 : urand() > -0.4;
        ((uint8_t *)h)[i] = (uint8_t)on;
        mvals[i] = on ? 0 : -INFINITY;
      } else {
        float f = (float)urand();
        ((float *)h)[i] = f;
        mvals[i] = f;
      }
    }
    CHECK_OK(tpurt_malloc(0, (n + 1) * es, S, &mptr));
    CHECK_OK(tpurt_memcpy_h2d(S, mptr, h, (n + 1) * es, 0));
    free(h);
    mv.ptr = mptr;
    mv.dtype = c->mask == 1 ? TPURT_BOOL : TPURT_F32;
    mv.ndim = 4;
    mv.sizes[0] = B, mv.sizes[1] = H, mv.sizes[2] = L, mv.sizes[3] = Sk;
    mv.strides[0] = 0;
    mv.strides[1] = c->mask == 1 ? 0 : L * Sk;
    mv.strides[2] = Sk;
    mv.strides[3] = 1;
  }
  (void)mask;
  tpurt_view lse = {0};
  tpurt_devptr lptr;
  CHECK_OK(tpurt_malloc(0, (size_t)(B * H * L + 1) * 4, S, &lptr));
  lse.ptr = lptr;
  lse.dtype = TPURT_F32;
  lse.ndim = 3;
  lse.sizes[0] = B, lse.sizes[1] = H, lse.sizes[2] = L;
  lse.strides[0] = H * L, lse.strides[1] = L, lse.strides[2] = 1;
  CHECK_OK(tpurt_fill(S, &dmask.v, (tpurt_scalar){TPURT_SCALAR_FLOAT, 0, 0, 0}));

  tpurt_attention_params p = {1.0 / sqrt((double)D), c->causal, c->p, 1234567ull, 77, TPURT_PRECISION_HIGHEST};
  CHECK_OK(tpurt_attention(S, &out.v, &lse, &q.v, &k.v, &v.v, c->mask ? &mv : NULL, &p));
  CHECK_OK(tpurt_attention_backward(S, &dq.v, &dk.v, &dv.v, &dmask.v, &dout.v, &q.v, &k.v, &v.v, &out.v, &lse,
                                    c->mask ? &mv : NULL, &p));
  CHECK_OK(tpurt_stream_synchronize(S));
  double *go = t4_get(&out), *gq = t4_get(&dq), *gk = t4_get(&dk), *gv = t4_get(&dv), *gm = t4_get(&dmask);

  /* reference */
  double *rdq = calloc((size_t)(B * H * L * D + 1), 8), *rdk = calloc((size_t)(B * Hk * Sk * D + 1), 8);
  double *rdv = calloc((size_t)(B * Hk * Sk * Dv + 1), 8);
  double *sc = calloc((size_t)Sk + 1, 8), *pr = calloc((size_t)Sk + 1, 8), *z = calloc((size_t)Sk + 1, 8);
  double *dp = calloc((size_t)Sk + 1, 8), *o = calloc((size_t)Dv + 1, 8);
  double tol = c->dt == TPURT_F32 ? 2e-4 : 3e-2, err_o = 0, err_m = 0;
  double scale = p.scale, dsc = c->p < 1 ? 1 / (1 - c->p) : 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t hk = h / (H / Hk), bh = b * H + h;
      for (int64_t i = 0; i < L; i++) {
        const double *qi = q.x + ((b * H + h) * L + i) * D;
        double mx = -INFINITY;
        for (int64_t j = 0; j < Sk; j++) {
          const double *kj = k.x + ((b * Hk + hk) * Sk + j) * D;
          double s = 0;
          for (int64_t d = 0; d < D; d++) s += qi[d] * kj[d];
          s *= scale;
          if (c->mask == 1) s += mvals[i * Sk + j];
          if (c->mask == 2) s += mvals[(h * L + i) * Sk + j];
          if (c->causal && j > i) s = -INFINITY;
          sc[j] = s;
          if (s > mx) mx = s;
        }
        double sum = 0;
        for (int64_t j = 0; j < Sk; j++) {
          pr[j] = mx == -INFINITY ? 0 : exp(sc[j] - mx);
          sum += pr[j];
        }
        for (int64_t j = 0; j < Sk; j++) {
          pr[j] = sum > 0 ? pr[j] / sum : 0;
          z[j] = c->p > 0 ? (keep(p.seed, p.offset, bh, L, Sk, i, j, c->p) ? dsc : 0) : 1;
        }
        const double *g = dout.x + (bh * L + i) * Dv;
        double Di = 0;
        for (int64_t d = 0; d < Dv; d++) {
          double acc = 0;
          for (int64_t j = 0; j < Sk; j++) acc += pr[j] * z[j] * v.x[((b * Hk + hk) * Sk + j) * Dv + d];
          o[d] = acc;
          double e = fabs(acc - go[(bh * L + i) * Dv + d]);
          if (!(e <= err_o)) err_o = e;
          Di += g[d] * acc;
        }
        for (int64_t j = 0; j < Sk; j++) {
          const double *vj = v.x + ((b * Hk + hk) * Sk + j) * Dv;
          double a = 0;
          for (int64_t d = 0; d < Dv; d++) a += g[d] * vj[d];
          dp[j] = pr[j] * (a * z[j] - Di); /* dS */
          for (int64_t d = 0; d < Dv; d++) rdv[((b * Hk + hk) * Sk + j) * Dv + d] += pr[j] * z[j] * g[d];
          double e = fabs(dp[j] - gm[(bh * L + i) * Sk + j]);
          if (!(e <= err_m)) err_m = e;
        }
        for (int64_t j = 0; j < Sk; j++) {
          const double *kj = k.x + ((b * Hk + hk) * Sk + j) * D;
          for (int64_t d = 0; d < D; d++) {
            rdq[(bh * L + i) * D + d] += scale * dp[j] * kj[d];
            rdk[((b * Hk + hk) * Sk + j) * D + d] += scale * dp[j] * qi[d];
          }
        }
      }
    }
  double eq = 0, ek = 0, ev = 0;
  for (int64_t i = 0; i < B * H * L * D; i++) eq = fmax(eq, fabs(rdq[i] - gq[i])) + (isnan(gq[i]) ? 1e9 : 0);
  for (int64_t i = 0; i < B * Hk * Sk * D; i++) ek = fmax(ek, fabs(rdk[i] - gk[i])) + (isnan(gk[i]) ? 1e9 : 0);
  for (int64_t i = 0; i < B * Hk * Sk * Dv; i++) ev = fmax(ev, fabs(rdv[i] - gv[i])) + (isnan(gv[i]) ? 1e9 : 0);
  double gtol = tol * (c->p > 0 ? 4 : 2);
  if (!(err_o <= tol && eq <= gtol && ek <= gtol && ev <= gtol && err_m <= gtol))
    fprintf(stderr, "cfg B%lld H%lld Hk%lld L%lld S%lld D%lld Dv%lld causal%d mask%d p%g: out %g dq %g dk %g dv %g dm %g\n",
            (long long)B, (long long)H, (long long)Hk, (long long)L, (long long)Sk, (long long)D, (long long)Dv,
            c->causal, c->mask, c->p, err_o, eq, ek, ev, err_m);
  CHECK(err_o <= tol);
  CHECK(eq <= gtol);
  CHECK(ek <= gtol);
  CHECK(ev <= gtol);
  CHECK(err_m <= gtol);
  free(go), free(gq), free(gk), free(gv), free(gm), free(rdq), free(rdk), free(rdv), free(sc), free(pr), free(z);
  free(dp), free(o), free(mvals);
  t4_free(&q), t4_free(&k), t4_free(&v), t4_free(&out), t4_free(&dout), t4_free(&dq), t4_free(&dk), t4_free(&dv);
  t4_free(&dmask);
  if (mptr) tpurt_free(mptr);
  tpurt_free(lptr);
}

static void errors(void) {
  t4 q, k, v, out;
  t4_init(&q, TPURT_F32, 1, 3, 4, 8, NULL, 1);
  t4_init(&k, TPURT_F32, 1, 2, 5, 8, NULL, 1);
  t4_init(&v, TPURT_F32, 1, 2, 5, 8, NULL, 1);
  t4_init(&out, TPURT_F32, 1, 3, 4, 8, NULL, 0);
  tpurt_attention_params p = {1, 0, 0, 0, 0, TPURT_PRECISION_HIGHEST};
  /* 3 query heads over 2 kv heads */
  CHECK_ST(tpurt_attention(S, &out.v, NULL, &q.v, &k.v, &v.v, NULL, &p), TPURT_ERR_INVALID_ARGUMENT);
  q.v.sizes[1] = 2;
  out.v.sizes[1] = 2;
  k.v.sizes[3] = 7; /* head dim mismatch */
  CHECK_ST(tpurt_attention(S, &out.v, NULL, &q.v, &k.v, &v.v, NULL, &p), TPURT_ERR_INVALID_ARGUMENT);
  k.v.sizes[3] = 8;
  k.v.dtype = TPURT_F64;
  CHECK_ST(tpurt_attention(S, &out.v, NULL, &q.v, &k.v, &v.v, NULL, &p), TPURT_ERR_INVALID_ARGUMENT);
  k.v.dtype = TPURT_F32;
  CHECK_OK(tpurt_attention(S, &out.v, NULL, &q.v, &k.v, &v.v, NULL, &p));
  p.dropout_p = 1.5;
  CHECK_ST(tpurt_attention(S, &out.v, NULL, &q.v, &k.v, &v.v, NULL, &p), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_stream_synchronize(S));
  t4_free(&q), t4_free(&k), t4_free(&v), t4_free(&out);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  const cfg cs[] = {
      {2, 2, 2, 37, 45, 16, 16, 0, 0, 0, 0, TPURT_F32, 0},
      {1, 2, 2, 130, 200, 24, 12, 0, 0, 0, 0, TPURT_F32, 1},  /* blocks, Dv != D, strided */
      {1, 2, 2, 70, 150, 8, 8, 1, 0, 0, 0, TPURT_F32, 0},     /* causal L < S */
      {1, 1, 1, 150, 70, 8, 8, 1, 0, 0, 0, TPURT_F32, 1},     /* causal L > S */
      {2, 2, 2, 9, 11, 4, 4, 0, 1, 1, 0, TPURT_F32, 0},       /* bool mask, fully masked row */
      {2, 3, 3, 20, 140, 5, 6, 1, 2, 0, 0, TPURT_F32, 0},     /* float mask + causal */
      {2, 4, 2, 33, 17, 8, 8, 0, 0, 0, 0, TPURT_F32, 1},      /* GQA */
      {1, 2, 2, 70, 133, 32, 32, 1, 0, 0, 0, TPURT_BF16, 0},  /* bf16 */
      {1, 2, 1, 66, 131, 8, 8, 0, 0, 0, 0.3, TPURT_F32, 0},   /* dropout + GQA */
      /* causal, at most 64 queries: blocks of 32 rows, the second one's key
       * range ending at its last row; rows skip their masked columns */
      {2, 2, 1, 57, 57, 16, 16, 1, 0, 0, 0.2, TPURT_F32, 1},  /* + dropout, GQA, strided */
      {1, 3, 3, 64, 64, 32, 32, 1, 2, 0, 0, TPURT_F32, 0},    /* + float mask */
      {1, 2, 2, 13, 40, 12, 12, 1, 0, 0, 0.1, TPURT_BF16, 0}, /* one short block, L < S, bf16 */
      {1, 1, 1, 5, 9, 1, 1, 0, 0, 0, 0, TPURT_F32, 0},        /* head dim 1 */
      {1, 1, 1, 3, 10, 256, 256, 0, 0, 0, 0, TPURT_F32, 0},   /* head dim 256 */
      {1, 2, 2, 4, 0, 8, 8, 0, 0, 0, 0, TPURT_F32, 0},        /* no keys -> 0 */
      {1, 2, 2, 0, 5, 8, 8, 0, 0, 0, 0, TPURT_F32, 0},        /* no queries */
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run(&cs[i]);
  CHECK(tpurt_attention_dropout_blocks(2, 3, 5) == 12);
  errors();
  if (g_failures) fprintf(stderr, "%d failures\n", g_failures);
  return g_failures ? 1 : 0;
}
