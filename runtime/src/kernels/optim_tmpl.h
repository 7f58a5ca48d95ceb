/*
 * optim_tmpl.h — block loops of the multi-tensor kernels, instantiated by
 * optim.c for one compute type: T = float (SFX f, for f32/f16/bf16 data)
 * and T = double (SFX d, for f64 data). A block is up to BLK consecutive
 * elements of a row; loads return the tensor's own memory when it already
 * holds T contiguously, else a converted copy in a stack buffer.
 */
#define FN2(a, b) a##_##b
#define FN1(a, b) FN2(a, b)
#define FN(name) FN1(name, SFX)

/* Pointer to n values of the block as T (writable). */
static T *FN(ld)(T *buf, char *p, int64_t st, int dt, int64_t n) {
  switch (dt) {
    case TPURT_F32:
      if (st == 4) {
        if (sizeof(T) == 4) return (T *)(void *)p;
        const float *q = (const float *)(void *)p;
        for (int64_t i = 0; i < n; i++) buf[i] = (T)q[i];
      } else {
        for (int64_t i = 0; i < n; i++) buf[i] = (T) * (const float *)(void *)(p + i * st);
      }
      return buf;
    case TPURT_F64:
      if (st == 8) {
        if (sizeof(T) == 8) return (T *)(void *)p;
        const double *q = (const double *)(void *)p;
        for (int64_t i = 0; i < n; i++) buf[i] = (T)q[i];
      } else {
        for (int64_t i = 0; i < n; i++) buf[i] = (T) * (const double *)(void *)(p + i * st);
      }
      return buf;
    case TPURT_BF16:
      if (st == 2) {
        const uint16_t *q = (const uint16_t *)(void *)p;
        for (int64_t i = 0; i < n; i++) buf[i] = (T)tpurt__bits_f32((uint32_t)q[i] << 16);
      } else {
        for (int64_t i = 0; i < n; i++) buf[i] = (T)tpurt__bf16_to_f32(*(const uint16_t *)(void *)(p + i * st));
      }
      return buf;
    case TPURT_F16:
      if (st == 2) {
        const uint16_t *q = (const uint16_t *)(void *)p;
        int64_t i = 0;
#ifdef __F16C__
        if (sizeof(T) == 4) {
          for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps((float *)(void *)(buf + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q + i))));
        }
#endif
        for (; i < n; i++) buf[i] = (T)tpurt__f16_to_f32(q[i]);
      } else {
        for (int64_t i = 0; i < n; i++) buf[i] = (T)tpurt__f16_to_f32(*(const uint16_t *)(void *)(p + i * st));
      }
      return buf;
    default:
      for (int64_t i = 0; i < n; i++) buf[i] = (T)val_to_double(tpurt__load((tpurt_dtype)dt, p + i * st));
      return buf;
  }
}

/* Writes the block back (no-op when v is the tensor's own memory). */
static void FN(st)(const T *v, char *p, int64_t st, int dt, int64_t n) {
  if ((const void *)v == (const void *)p) return;
  switch (dt) {
    case TPURT_F32:
      if (st == 4) {
        float *q = (float *)(void *)p;
        for (int64_t i = 0; i < n; i++) q[i] = (float)v[i];
      } else {
        for (int64_t i = 0; i < n; i++) *(float *)(void *)(p + i * st) = (float)v[i];
      }
      return;
    case TPURT_F64:
      if (st == 8) {
        double *q = (double *)(void *)p;
        for (int64_t i = 0; i < n; i++) q[i] = (double)v[i];
      } else {
        for (int64_t i = 0; i < n; i++) *(double *)(void *)(p + i * st) = (double)v[i];
      }
      return;
    case TPURT_BF16:
      if (st == 2) {
        uint16_t *q = (uint16_t *)(void *)p;
        for (int64_t i = 0; i < n; i++) q[i] = tpurt__f32_to_bf16((float)v[i]);
      } else {
        for (int64_t i = 0; i < n; i++) *(uint16_t *)(void *)(p + i * st) = tpurt__f32_to_bf16((float)v[i]);
      }
      return;
    case TPURT_F16:
      if (st == 2) {
        uint16_t *q = (uint16_t *)(void *)p;
        int64_t i = 0;
#ifdef __F16C__
        if (sizeof(T) == 4) {
          for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(q + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(const void *)(v + i)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
#endif
        for (; i < n; i++) q[i] = tpurt__f32_to_f16((float)v[i]);
      } else {
        for (int64_t i = 0; i < n; i++) *(uint16_t *)(void *)(p + i * st) = tpurt__f32_to_f16((float)v[i]);
      }
      return;
    default: {
      tpurt__val x;
      memset(&x, 0, sizeof x);
      x.cls = 2;
      for (int64_t i = 0; i < n; i++) {
        x.re = (double)v[i];
        tpurt__store((tpurt_dtype)dt, p + i * st, x);
      }
    }
  }
}

static inline T FN(nanmax)(T a, T b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
static inline T FN(nanmin)(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }

/* out = f(a, b, c); b / c NULL: the scalar s takes their place. */
static void FN(fe_compute)(int op, T *o, const T *a, const T *b, const T *c, T s, T alpha, int64_t n) {
  int64_t i;
  switch (op) {
    case TPURT_FE_COPY: for (i = 0; i < n; i++) o[i] = a[i]; break;
    case TPURT_FE_NEG: for (i = 0; i < n; i++) o[i] = -a[i]; break;
    case TPURT_FE_ABS: for (i = 0; i < n; i++) o[i] = FABS(a[i]); break;
    case TPURT_FE_SQRT: for (i = 0; i < n; i++) o[i] = SQRT(a[i]); break;
    case TPURT_FE_EXP: for (i = 0; i < n; i++) o[i] = EXP(a[i]); break;
    case TPURT_FE_RECIPROCAL: for (i = 0; i < n; i++) o[i] = (T)1 / a[i]; break;
    case TPURT_FE_SIGN:
      for (i = 0; i < n; i++) o[i] = (T)((a[i] > 0) - (a[i] < 0));
      break;
    case TPURT_FE_ADD:
      if (b) {
        if (alpha == 1)
          for (i = 0; i < n; i++) o[i] = a[i] + b[i];
        else
          for (i = 0; i < n; i++) o[i] = a[i] + alpha * b[i];
      } else {
        T v = alpha * s;
        for (i = 0; i < n; i++) o[i] = a[i] + v;
      }
      break;
    case TPURT_FE_MUL:
      if (b)
        for (i = 0; i < n; i++) o[i] = a[i] * b[i];
      else
        for (i = 0; i < n; i++) o[i] = a[i] * s;
      break;
    case TPURT_FE_DIV:
      if (b)
        for (i = 0; i < n; i++) o[i] = a[i] / b[i];
      else
        for (i = 0; i < n; i++) o[i] = a[i] / s;
      break;
    case TPURT_FE_MAXIMUM:
      if (b)
        for (i = 0; i < n; i++) o[i] = FN(nanmax)(a[i], b[i]);
      else
        for (i = 0; i < n; i++) o[i] = FN(nanmax)(a[i], s);
      break;
    case TPURT_FE_MINIMUM:
      if (b)
        for (i = 0; i < n; i++) o[i] = FN(nanmin)(a[i], b[i]);
      else
        for (i = 0; i < n; i++) o[i] = FN(nanmin)(a[i], s);
      break;
    case TPURT_FE_POW:
      if (b) {
        for (i = 0; i < n; i++) o[i] = POW(a[i], b[i]);
      } else if (s == 2) {
        for (i = 0; i < n; i++) o[i] = a[i] * a[i];
      } else if (s == 3) {
        for (i = 0; i < n; i++) o[i] = a[i] * a[i] * a[i];
      } else if (s == (T)0.5) {
        for (i = 0; i < n; i++) o[i] = SQRT(a[i]);
      } else if (s == 1) {
        for (i = 0; i < n; i++) o[i] = a[i];
      } else if (s == -1) {
        for (i = 0; i < n; i++) o[i] = (T)1 / a[i];
      } else {
        for (i = 0; i < n; i++) o[i] = POW(a[i], s);
      }
      break;
    case TPURT_FE_RPOW:
      if (b)
        for (i = 0; i < n; i++) o[i] = POW(b[i], a[i]);
      else
        for (i = 0; i < n; i++) o[i] = POW(s, a[i]);
      break;
    case TPURT_FE_ADDCMUL:
      for (i = 0; i < n; i++) o[i] = a[i] + s * b[i] * c[i];
      break;
    case TPURT_FE_ADDCDIV:
      for (i = 0; i < n; i++) o[i] = a[i] + s * b[i] / c[i];
      break;
    case TPURT_FE_LERP:
      if (c) {
        for (i = 0; i < n; i++) {
          T w = c[i], d = b[i] - a[i];
          o[i] = FABS(w) < (T)0.5 ? a[i] + w * d : b[i] - d * ((T)1 - w);
        }
      } else if (FABS(s) < (T)0.5) {
        for (i = 0; i < n; i++) o[i] = a[i] + s * (b[i] - a[i]);
      } else {
        T w1 = (T)1 - s;
        for (i = 0; i < n; i++) o[i] = b[i] - (b[i] - a[i]) * w1;
      }
      break;
    default: break;
  }
}

/* ---------------------------------------------------------- block kernels */

static void FN(blk_foreach)(void *vctx, int t, char **p, const int64_t *st, const int *dt, int64_t n) {
  const fe_ctx *x = vctx;
  (void)t;
  T buf[4][BLK];
  /* operand order: 0 out, 1 a, then b, c when present */
  int k = 2;
  const T *a = FN(ld)(buf[1], p[1], st[1], dt[1], n);
  const T *b = NULL, *c = NULL;
  if (x->has_b) {
    b = FN(ld)(buf[2], p[k], st[k], dt[k], n);
    k++;
  }
  if (x->has_c) {
    c = FN(ld)(buf[3], p[k], st[k], dt[k], n);
    k++;
  }
  T *o = (dt[0] == NATIVE_DT && st[0] == (int64_t)sizeof(T)) ? (T *)(void *)p[0] : buf[0];
  FN(fe_compute)(x->op, o, a, b, c, (T)x->s, (T)x->alpha, n);
  FN(st)(o, p[0], st[0], dt[0], n);
}

/* v (n values of T) rounded to dtype dt and back: what a later read of the
 * value would see had it been stored. */
static void FN(round_to)(T *v, int dt, int64_t n) {
  if (dt == NATIVE_DT) return;
  double tmp[BLK]; /* room for BLK values of any floating dtype */
  int64_t sz = (int64_t)tpurt_dtype_size((tpurt_dtype)dt);
  FN(st)(v, (char *)tmp, sz, dt, n);
  T *r = FN(ld)(v, (char *)tmp, sz, dt, n);
  if (r != v) memcpy(v, r, (size_t)n * sizeof(T));
}

/* One block of a tuple of a foreach chain: the slots read before any write
 * are loaded, every member computes from and into the slots' buffers (a
 * value stored in a narrower dtype is rounded as its store would have), and
 * the slots to keep are stored. */
static void FN(blk_chain)(void *vctx, int t, char **p, const int64_t *st, const int *dt, int64_t n) {
  const chain_ctx *x = vctx;
  T buf[CHAIN_MAX_SLOTS][BLK];
  T *v[CHAIN_MAX_SLOTS];
  const chain_slot *sl = x->slots + x->sbeg[t];
  int ns = x->sbeg[t + 1] - x->sbeg[t];
  for (int s = 0; s < ns; s++) {
    int direct = dt[s] == NATIVE_DT && st[s] == (int64_t)sizeof(T);
    if (sl[s].flags & SLOT_LOAD)
      v[s] = FN(ld)(buf[s], p[s], st[s], dt[s], n);
    else
      v[s] = (direct && (sl[s].flags & SLOT_STORE)) ? (T *)(void *)p[s] : buf[s];
  }
  for (int m = 0; m < x->k; m++) {
    const chain_member *c = &x->mem[m];
    const uint8_t *mp = x->map + ((size_t)t * (size_t)x->k + (size_t)m) * 4;
    double sc = c->s;
    if (c->has_scalars) memcpy(&sc, &c->scalars[t], sizeof sc);
    FN(fe_compute)(c->op, v[mp[0]], v[mp[1]], mp[2] != 0xFF ? v[mp[2]] : NULL, mp[3] != 0xFF ? v[mp[3]] : NULL,
                   (T)sc, (T)c->alpha, n);
    FN(round_to)(v[mp[0]], dt[mp[0]], n);
  }
  for (int s = 0; s < ns; s++)
    if (sl[s].flags & SLOT_STORE) FN(st)(v[s], p[s], st[s], dt[s], n);
}

static void FN(blk_adam)(void *vctx, int t, char **p, const int64_t *st, const int *dt, int64_t n) {
  const adam_ctx *x = vctx;
  (void)t;
  T buf[5][BLK];
  T *pp = FN(ld)(buf[0], p[0], st[0], dt[0], n);
  T *g = FN(ld)(buf[1], p[1], st[1], dt[1], n);
  T *m = FN(ld)(buf[2], p[2], st[2], dt[2], n);
  T *v = FN(ld)(buf[3], p[3], st[3], dt[3], n);
  T *vm = x->amsgrad ? FN(ld)(buf[4], p[4], st[4], dt[4], n) : NULL;
  const T b1 = (T)x->beta1, b2 = (T)x->beta2, omb1 = (T)(1 - x->beta1), omb2 = (T)(1 - x->beta2);
  const T wd = (T)x->weight_decay, eps = (T)x->eps, step_size = (T)x->step_size, bc2s = (T)x->bc2_sqrt;
  const T decay = (T)(1 - x->lr * x->weight_decay), gs = (T)x->grad_scale;
  const int has_gs = x->has_grad_scale, maximize = x->maximize, decoupled = x->decoupled;
  const int use_wd = x->weight_decay != 0;
  /* unscale first (stored back), then branch-free loops per variant */
  if (has_gs)
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / gs;
  const T gsign = maximize ? (T)-1 : (T)1;   /* exact negation */
  const T pdecay = (use_wd && decoupled) ? decay : (T)1;
#define ADAM_BODY(AMS, L2)                               \
  for (int64_t i = 0; i < n; i++) {                      \
    T gi = g[i] * gsign;                                 \
    T pi = pp[i] * pdecay;                               \
    if (L2) gi = gi + wd * pi;                           \
    T mi = b1 * m[i] + omb1 * gi;                        \
    T vi = b2 * v[i] + omb2 * gi * gi;                   \
    m[i] = mi;                                           \
    v[i] = vi;                                           \
    T vv = vi;                                           \
    if (AMS) {                                           \
      T old = vm[i];                                     \
      vv = old > vi ? old : vi;                          \
      vm[i] = vv;                                        \
    }                                                    \
    pp[i] = pi - step_size * mi / (SQRT(vv) / bc2s + eps); \
  }
  const int l2 = use_wd && !decoupled;
  if (vm) {
    if (l2) ADAM_BODY(1, 1) else ADAM_BODY(1, 0)
  } else {
    if (l2) ADAM_BODY(0, 1) else ADAM_BODY(0, 0)
  }
#undef ADAM_BODY
  FN(st)(pp, p[0], st[0], dt[0], n);
  if (has_gs) FN(st)(g, p[1], st[1], dt[1], n);
  FN(st)(m, p[2], st[2], dt[2], n);
  FN(st)(v, p[3], st[3], dt[3], n);
  if (vm) FN(st)(vm, p[4], st[4], dt[4], n);
}

static void FN(blk_sgd)(void *vctx, int t, char **p, const int64_t *st, const int *dt, int64_t n) {
  const sgd_ctx *x = vctx;
  (void)t;
  T buf[3][BLK];
  T *pp = FN(ld)(buf[0], p[0], st[0], dt[0], n);
  T *g = FN(ld)(buf[1], p[1], st[1], dt[1], n);
  T *mb = x->has_buf ? FN(ld)(buf[2], p[2], st[2], dt[2], n) : NULL;
  const T lr = (T)x->lr, wd = (T)x->weight_decay, mom = (T)x->momentum, omd = (T)(1 - x->dampening);
  const T gs = (T)x->grad_scale;
  const int has_gs = x->has_grad_scale, maximize = x->maximize, nesterov = x->nesterov, first = x->first_step;
  const int use_wd = x->weight_decay != 0;
  if (has_gs)
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / gs;
  const T gsign = maximize ? (T)-1 : (T)1;
  for (int64_t i = 0; i < n; i++) {
    T gi = g[i] * gsign;
    if (use_wd) gi = gi + wd * pp[i];
    if (mb) {
      T bi = first ? gi : mom * mb[i] + omd * gi;
      mb[i] = bi;
      gi = nesterov ? gi + mom * bi : bi;
    }
    pp[i] = pp[i] - lr * gi;
  }
  FN(st)(pp, p[0], st[0], dt[0], n);
  if (has_gs) FN(st)(g, p[1], st[1], dt[1], n);
  if (mb) FN(st)(mb, p[2], st[2], dt[2], n);
}

static void FN(blk_unscale)(void *vctx, int t, char **p, const int64_t *st, const int *dt, int64_t n) {
  unscale_ctx *x = vctx;
  (void)t;
  T buf[BLK];
  T *g = FN(ld)(buf, p[0], st[0], dt[0], n);
  const T inv = (T)x->inv_scale;
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) {
      T gi = g[i + j];
      acc[j] += gi - gi; /* NaN for inf / NaN inputs, 0 otherwise */
      g[i + j] = gi * inv;
    }
  for (; i < n; i++) {
    T gi = g[i];
    acc[0] += gi - gi;
    g[i] = gi * inv;
  }
  FN(st)(g, p[0], st[0], dt[0], n);
  T tot = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
  if (tot != tot) atomic_store_explicit(&x->found, 1, memory_order_relaxed);
}

static void FN(blk_norm)(void *vctx, int t, char **p, const int64_t *st, const int *dt, int64_t n) {
  norm_acc *x = vctx;
  (void)t;
  T buf[BLK];
  const T *a = FN(ld)(buf, p[0], st[0], dt[0], n);
  int64_t i;
  switch (x->kind) {
    case NORM_L2: {
      T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * a[i + j];
      for (; i < n; i++) s[0] += a[i] * a[i];
      x->acc += (double)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
      break;
    }
    case NORM_L1: {
      T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += FABS(a[i + j]);
      for (; i < n; i++) s[0] += FABS(a[i]);
      x->acc += (double)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
      break;
    }
    case NORM_L0: {
      T s = 0;
      for (i = 0; i < n; i++) s += (T)(a[i] != 0);
      x->acc += (double)s;
      break;
    }
    case NORM_INF: {
      T m = (T)x->acc;
      for (i = 0; i < n; i++) m = FN(nanmax)(m, FABS(a[i]));
      x->acc = (double)m;
      break;
    }
    case NORM_NINF: {
      T m = (T)x->acc;
      for (i = 0; i < n; i++) m = FN(nanmin)(m, FABS(a[i]));
      x->acc = (double)m;
      break;
    }
    default: {
      T s = 0, pw = (T)x->ord;
      for (i = 0; i < n; i++) s += POW(FABS(a[i]), pw);
      x->acc += (double)s;
    }
  }
}

#undef FN
#undef FN1
#undef FN2
