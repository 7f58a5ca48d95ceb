/*
 * search.c — binary search into sorted rows (searchsorted / bucketize),
 * D-dimensional histograms over given bin edges, order statistics of the
 * rows of a matrix (k-th value, median, nanmedian, mode) and segment
 * reductions with their backward.
 */
#include "kcommon.h"
#include "kselect.h"

static tpurt_status stream_for(tpurt_stream **s, const tpurt_view *v) {
  return tpurt__resolve_stream(s, tpurt_devptr_device(v->ptr));
}

static inline const char *at2(const char *base, const tpurt_view *v, int64_t i, int64_t j) {
  return base + (i * v->strides[0] + j * v->strides[1]) * (int64_t)tpurt_dtype_size(v->dtype);
}

/* ------------------------------------------------------- searchsorted */

typedef struct {
  tpurt_view out, seq, values, sorter;
  int has_sorter, right;
} ss_args;

typedef struct {
  ss_args *a;
  char *out, *seq, *val, *srt;
  int isint;
  kc_err err;
} ss_ctx;

/* Does the search go right of sequence element m? Integers compare exactly
 * as int64, everything else as double. */
static int ss_go_right(const ss_ctx *x, int64_t sr, int64_t m, int64_t vi, double vd) {
  const ss_args *a = x->a;
  if (x->isint) {
    int64_t sv = kc_ldi(a->seq.dtype, at2(x->seq, &a->seq, sr, m));
    return a->right ? !(sv > vi) : !(sv >= vi);
  }
  double sv = kc_ld(a->seq.dtype, at2(x->seq, &a->seq, sr, m));
  return a->right ? !(sv > vd) : !(sv >= vd);
}

#define SS_KCHUNK 4096 /* values a work unit searches: a 1-D sequence's values spread over the threads */

/* Binary search of one row (dense sequence of type ST, values compared as
 * CT): the same comparisons as ss_go_right, typed, selects for the bounds */
#define SS_TYPED(ST, VT, CT)                                                     \
  do {                                                                           \
    const ST *sq = (const ST *)at2(x->seq, &a->seq, sr, 0);                      \
    for (int64_t k = k0; k < k1; k++) {                                          \
      CT v = (CT)*(const VT *)at2(x->val, &a->values, r, k);                     \
      int64_t lo = 0, hi = M; /* the probes of the generic loop (and the CPU's): \
                                 the same answer for an unsorted row */          \
      while (lo < hi) {                                                          \
        int64_t mid = lo + (hi - lo) / 2;                                        \
        CT sv = (CT)sq[mid];                                                     \
        int go = a->right ? !(sv > v) : !(sv >= v);                              \
        lo = go ? mid + 1 : lo;                                                  \
        hi = go ? hi : mid;                                                      \
      }                                                                          \
      kc_sti(a->out.dtype, (char *)at2(x->out, &a->out, r, k), lo);              \
    }                                                                            \
  } while (0)

static void ss_chunk(void *c, int64_t u0, int64_t u1) {
  ss_ctx *x = c;
  ss_args *a = x->a;
  int64_t K = a->values.sizes[1], M = a->seq.sizes[1];
  int64_t nch = (K + SS_KCHUNK - 1) / SS_KCHUNK;
  tpurt_dtype sdt = a->seq.dtype, vdt = a->values.dtype;
  int typed = !a->has_sorter && (M <= 1 || a->seq.strides[1] == 1) && sdt == vdt &&
              (sdt == TPURT_F32 || sdt == TPURT_F64 || sdt == TPURT_I64 || sdt == TPURT_I32);
  for (int64_t u = u0; u < u1; u++) {
    int64_t r = u / nch, k0 = u % nch * SS_KCHUNK, k1 = k0 + SS_KCHUNK < K ? k0 + SS_KCHUNK : K;
    int64_t sr = a->seq.sizes[0] == 1 ? 0 : r;
    if (typed) {
      switch (sdt) {
        case TPURT_F32: SS_TYPED(float, float, float); break;
        case TPURT_F64: SS_TYPED(double, double, double); break;
        case TPURT_I64: SS_TYPED(int64_t, int64_t, int64_t); break;
        default: SS_TYPED(int32_t, int32_t, int64_t); break;
      }
      continue;
    }
    for (int64_t k = k0; k < k1; k++) {
      const void *vp = at2(x->val, &a->values, r, k);
      int64_t vi = x->isint ? kc_ldi(a->values.dtype, vp) : 0;
      double vd = x->isint ? 0.0 : kc_ld(a->values.dtype, vp);
      int64_t lo = 0, hi = M;
      while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2, m = mid;
        if (a->has_sorter) {
          m = kc_ld_idx(a->sorter.dtype, at2(x->srt, &a->sorter, sr, mid));
          if (m < 0 || m >= M) {
            kc_err_index(&x->err, "index %" PRId64 " of sorter is out of range [0, %" PRId64 ")", m, M);
            return;
          }
        }
        if (ss_go_right(x, sr, m, vi, vd))
          lo = mid + 1;
        else
          hi = mid;
      }
      kc_sti(a->out.dtype, (char *)at2(x->out, &a->out, r, k), lo);
    }
  }
}

static tpurt_status k_searchsorted(void *p, char *err, size_t errlen) {
  ss_args *a = p;
  ss_ctx x;
  x.a = a;
  x.out = tpurt__host_view(a->out.ptr);
  x.seq = a->seq.sizes[1] ? tpurt__host_view(a->seq.ptr) : NULL;
  x.val = tpurt__host_view(a->values.ptr);
  x.srt = a->has_sorter && a->seq.sizes[1] ? tpurt__host_view(a->sorter.ptr) : NULL;
  x.isint = !kc_is_float(a->seq.dtype);
  atomic_init(&x.err.set, 0);
  int64_t K = a->values.sizes[1], nch = (K + SS_KCHUNK - 1) / SS_KCHUNK;
  int64_t per = nch == 1 ? K + 1 : SS_KCHUNK; /* values a unit */
  tpurt_parallel_for(a->values.sizes[0] * nch, per >= 2048 ? 1 : 2048 / per + 1, ss_chunk, &x);
  return kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
}

tpurt_status tpurt_searchsorted(tpurt_stream *s, const tpurt_view *out, const tpurt_view *seq,
                                const tpurt_view *values, const tpurt_view *sorter, int right) {
  TPURT__INIT_OR_RETURN();
  const char *op = "searchsorted";
  tpurt_status st;
  if (!out || !seq || !values) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, seq, op, "sorted_sequence")) ||
      (st = kc_check(s->dev, values, op, "values")))
    return st;
  if (out->ndim != 2 || seq->ndim != 2 || values->ndim != 2 || out->sizes[0] != values->sizes[0] ||
      out->sizes[1] != values->sizes[1] || (seq->sizes[0] != 1 && seq->sizes[0] != values->sizes[0]) ||
      !kc_is_index_dtype(out->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected seq [R|1, M], values [R, K], out int [R, K]", op);
  if (kc_is_complex(seq->dtype) || kc_is_float(seq->dtype) != kc_is_float(values->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: sequence and values must both be real floating or integer",
                      op);
  ss_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.seq = *seq;
  a.values = *values;
  a.right = right;
  if (sorter) {
    if ((st = kc_check(s->dev, sorter, op, "sorter"))) return st;
    if (sorter->ndim != 2 || sorter->sizes[0] != seq->sizes[0] || sorter->sizes[1] != seq->sizes[1] ||
        !kc_is_index_dtype(sorter->dtype))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: sorter must be an int view of seq's shape", op);
    a.sorter = *sorter;
    a.has_sorter = 1;
  }
  if (kc_numel(out) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_searchsorted, &a, sizeof a);
}

/* --------------------------------------------------------- histogramdd */

#define HIST_MAXD 16
typedef struct {
  tpurt_view hist, input, weight;
  tpurt_view edges[HIST_MAXD];
  int has_weight, D;
  tpurt_hist_mode mode;
} hist_args;

typedef struct {
  hist_args *a;
  char *in, *w;
  char *e[HIST_MAXD];
  int64_t *bin; /* flat bin of each sample, -1 = skipped */
  int64_t hstr[HIST_MAXD];
  double lo[HIST_MAXD], hi[HIST_MAXD]; /* each dim's first and last edge */
  int64_t nbins, nchunks, *counts;      /* unweighted counts: per chunk of samples */
} hist_ctx;

static inline double edge_at(hist_ctx *x, int d, int64_t i) {
  const tpurt_view *v = &x->a->edges[d];
  return kc_ld(v->dtype, x->e[d] + i * v->strides[0] * (int64_t)tpurt_dtype_size(v->dtype));
}

/* the bin of v by division in float (histc's arithmetic), v in [lo, hi];
 * outside it (and NaN) clamped into range so the conversion is defined */
static inline int64_t hist_lin_pos(double v, double lo, double hi, int64_t ne) {
  float scale = (float)(ne - 1);
  float q = ((float)v - (float)lo) * scale / ((float)hi - (float)lo);
  q = q > 0 ? q : 0; /* no-ops in range */
  q = q < scale ? q : scale;
  return (int64_t)q;
}
/* the last edge closes the last bin */
static inline int64_t hist_fix_pos(int64_t pos, int64_t ne) {
  pos = pos == ne - 1 ? pos - 1 : pos;
  return pos < 0 ? 0 : pos;
}

static void hist_chunk(void *c, int64_t n0, int64_t n1) {
  hist_ctx *x = c;
  hist_args *a = x->a;
  int single = a->input.dtype != TPURT_F64;
  if (a->D == 1 && a->mode == TPURT_HIST_LINEAR && a->input.dtype == TPURT_F32) {
    /* histc of float32: the general loop's arithmetic in a typed loop */
    const float *in = (const float *)x->in;
    int64_t st = a->input.strides[0], ne = a->edges[0].sizes[0];
    double lo = x->lo[0], hi = x->hi[0];
    for (int64_t n = n0; n < n1; n++) {
      double v = in[n * st];
      int64_t pos = hist_fix_pos(hist_lin_pos(v, lo, hi, ne), ne);
      x->bin[n] = (v >= lo && v <= hi) ? pos * x->hstr[0] : -1;
    }
    return;
  }
  for (int64_t n = n0; n < n1; n++) {
    int64_t flat = 0;
    for (int d = 0; d < a->D; d++) {
      double v = kc_ld(a->input.dtype, at2(x->in, &a->input, n, d));
      int64_t ne = a->edges[d].sizes[0];
      double lo = x->lo[d], hi = x->hi[d];
      if (!(v >= lo && v <= hi)) {
        flat = -1;
        break;
      }
      int64_t pos;
      if (a->mode == TPURT_HIST_BINARY) {
        int64_t l = 0, h = ne;
        while (l < h) {
          int64_t m = l + (h - l) / 2;
          if (v < edge_at(x, d, m)) h = m; else l = m + 1;
        }
        pos = l - 1;
      } else {
        if (single)
          pos = hist_lin_pos(v, lo, hi, ne);
        else
          pos = (int64_t)((v - lo) * (double)(ne - 1) / (hi - lo));
        if (a->mode == TPURT_HIST_LINEAR_SEARCH) {
          int64_t l = pos - 1 > 0 ? pos - 1 : 0, h = pos + 2 < ne ? pos + 2 : ne;
          while (l < h) {
            int64_t m = l + (h - l) / 2;
            if (v < edge_at(x, d, m)) h = m; else l = m + 1;
          }
          pos = l - 1;
        }
      }
      flat += hist_fix_pos(pos, ne) * x->hstr[d];
    }
    x->bin[n] = flat;
  }
}

/* unweighted counts of the samples of chunks [c0, c1), each chunk into its
 * own row of nbins */
static void hist_count(void *c, int64_t c0, int64_t c1) {
  hist_ctx *x = c;
  int64_t N = x->a->input.sizes[0];
  for (int64_t ch = c0; ch < c1; ch++) {
    int64_t *cnt = x->counts + ch * x->nbins;
    memset(cnt, 0, (size_t)x->nbins * sizeof(int64_t));
    for (int64_t n = N * ch / x->nchunks; n < N * (ch + 1) / x->nchunks; n++)
      if (x->bin[n] >= 0) cnt[x->bin[n]]++;
  }
}

static tpurt_status k_histogramdd(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  hist_args *a = p;
  hist_ctx x;
  memset(&x, 0, sizeof x);
  x.a = a;
  int64_t N = a->input.sizes[0];
  x.in = N ? tpurt__host_view(a->input.ptr) : NULL;
  x.w = a->has_weight && N ? tpurt__host_view(a->weight.ptr) : NULL;
  for (int d = 0; d < a->D; d++) x.e[d] = tpurt__host_view(a->edges[d].ptr);
  for (int d = 0; d < a->D; d++) x.hstr[d] = a->hist.strides[d];
  char *h = tpurt__host_view(a->hist.ptr);
  tpurt_dtype hd = a->hist.dtype;
  int64_t es = (int64_t)tpurt_dtype_size(hd);
  /* zero the histogram (walk all of its elements) */
  int64_t total = kc_numel(&a->hist);
  int64_t coord[TPURT_MAX_DIMS];
  for (int64_t i = 0; i < total; i++) {
    kc_unravel(i, a->hist.ndim, a->hist.sizes, coord);
    int64_t off = 0;
    for (int d = 0; d < a->hist.ndim; d++) off += coord[d] * a->hist.strides[d];
    kc_st(hd, h + off * es, 0.0);
  }
  if (N == 0) return TPURT_OK;
  x.bin = malloc((size_t)N * sizeof(int64_t));
  if (!x.bin) return TPURT_ERR_OUT_OF_MEMORY;
  for (int d = 0; d < a->D; d++) {
    x.lo[d] = edge_at(&x, d, 0);
    x.hi[d] = edge_at(&x, d, a->edges[d].sizes[0] - 1);
  }
  tpurt_parallel_for(N, 1024, hist_chunk, &x);
  /* accumulate in sample order (deterministic) */
  int64_t ws = a->has_weight ? a->weight.strides[0] * (int64_t)tpurt_dtype_size(a->weight.dtype) : 0;
  x.nbins = 1;
  for (int d = 0; d < a->hist.ndim; d++) x.nbins += (a->hist.sizes[d] - 1) * a->hist.strides[d];
  x.nchunks = (int64_t)tpurt_num_threads() * 4;
  if (x.nchunks > N / 4096) x.nchunks = N / 4096;
  if (hd == TPURT_F32 && !a->has_weight && x.nchunks > 1 && x.nbins * x.nchunks <= (int64_t)1 << 23 &&
      (x.counts = malloc((size_t)(x.nbins * x.nchunks) * sizeof(int64_t)))) {
    /* counted per chunk in parallel, then summed: the float adds of 1 in
     * sample order give the same value (exact up to 2^24, where adding
     * one more leaves 2^24) */
    tpurt_parallel_for(x.nchunks, 1, hist_count, &x);
    float *hf = (float *)h;
    for (int64_t b = 0; b < x.nbins; b++) {
      int64_t t = 0;
      for (int64_t ch = 0; ch < x.nchunks; ch++) t += x.counts[ch * x.nbins + b];
      if (t) hf[b] += (float)(t > (1 << 24) ? 1 << 24 : t);
    }
    free(x.counts);
  } else if (hd == TPURT_F32 && !a->has_weight) {
    float *hf = (float *)h;
    for (int64_t n = 0; n < N; n++)
      if (x.bin[n] >= 0) hf[x.bin[n]] += 1.0f;
  } else {
    for (int64_t n = 0; n < N; n++) {
      if (x.bin[n] < 0) continue;
      double w = a->has_weight ? kc_ld(a->weight.dtype, x.w + n * ws) : 1.0;
      char *pp = h + x.bin[n] * es;
      kc_st(hd, pp, kc_ld(hd, pp) + w);
    }
  }
  free(x.bin);
  return TPURT_OK;
}

tpurt_status tpurt_histogramdd(tpurt_stream *s, const tpurt_view *hist, const tpurt_view *input,
                               const tpurt_view *weight, const tpurt_view *edges, int D, tpurt_hist_mode mode) {
  TPURT__INIT_OR_RETURN();
  const char *op = "histogramdd";
  tpurt_status st;
  if (!hist || !input || !edges) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, hist))) return st;
  if ((st = kc_check(s->dev, hist, op, "hist")) || (st = kc_check(s->dev, input, op, "input"))) return st;
  if (D < 1 || D > HIST_MAXD || input->ndim != 2 || input->sizes[1] != D || hist->ndim != D)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected input [N, D] (D <= %d) and a D-dim hist", op,
                      HIST_MAXD);
  if (!kc_is_float(hist->dtype) || !kc_is_float(input->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input and hist must be floating", op);
  for (int d = 0; d < hist->ndim; d++)
    if (hist->strides[d] < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative hist strides", op);
  hist_args a;
  memset(&a, 0, sizeof a);
  a.hist = *hist;
  a.input = *input;
  a.D = D;
  a.mode = mode;
  for (int d = 0; d < D; d++) {
    if ((st = kc_check(s->dev, &edges[d], op, "bin_edges"))) return st;
    if (edges[d].ndim != 1 || edges[d].sizes[0] != hist->sizes[d] + 1 || !kc_is_float(edges[d].dtype))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bin_edges[%d] must be 1-D with %" PRId64 " entries", op, d,
                        hist->sizes[d] + 1);
    a.edges[d] = edges[d];
  }
  if (weight) {
    if ((st = kc_check(s->dev, weight, op, "weight"))) return st;
    if (weight->ndim != 1 || weight->sizes[0] != input->sizes[0])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: weight must be [N]", op);
    a.weight = *weight;
    a.has_weight = 1;
  }
  if (kc_numel(hist) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_histogramdd, &a, sizeof a);
}

/* -------------------------------------------- histc of integer samples */

typedef struct {
  tpurt_view hist, input;
  int64_t lo, hi;
} histi_args;

static tpurt_status k_histc_int(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  histi_args *a = p;
  char *h = tpurt__host_view(a->hist.ptr);
  const char *in = a->input.sizes[0] ? tpurt__host_view(a->input.ptr) : NULL;
  int64_t bins = a->hist.sizes[0], hs = a->hist.strides[0] * (int64_t)tpurt_dtype_size(a->hist.dtype);
  int64_t is = a->input.strides[0] * (int64_t)tpurt_dtype_size(a->input.dtype);
  int64_t *count = calloc((size_t)bins, sizeof *count);
  if (!count) return TPURT_ERR_OUT_OF_MEMORY;
  __int128 range = (__int128)a->hi - a->lo;
  for (int64_t n = 0; n < a->input.sizes[0]; n++) {
    int64_t x = kc_ldi(a->input.dtype, in + n * is);
    if (x < a->lo || x > a->hi) continue;
    int64_t b = (int64_t)(((__int128)x - a->lo) * bins / range);
    count[b == bins ? bins - 1 : b]++;
  }
  for (int64_t b = 0; b < bins; b++) {
    if (kc_is_float(a->hist.dtype))
      kc_st(a->hist.dtype, h + b * hs, (double)count[b]);
    else
      kc_sti(a->hist.dtype, h + b * hs, count[b]);
  }
  free(count);
  return TPURT_OK;
}

tpurt_status tpurt_histc_int(tpurt_stream *s, const tpurt_view *hist, const tpurt_view *input, int64_t lo,
                             int64_t hi) {
  TPURT__INIT_OR_RETURN();
  const char *op = "histc";
  tpurt_status st;
  if (!hist || !input) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, hist))) return st;
  tpurt__defer_note_reads(1);
  st = kc_check(s->dev, input, op, "input");
  tpurt__defer_note_reads(0);
  if (st || (st = kc_check(s->dev, hist, op, "hist"))) return st;
  if (hist->ndim != 1 || input->ndim != 1 || kc_is_complex(hist->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected a real 1-D hist and a 1-D input", op);
  if (kc_is_float(input->dtype) || kc_is_complex(input->dtype) || input->dtype == TPURT_BOOL)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: the input must be an integer view", op);
  if (!(lo < hi)) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: max must be larger than min", op);
  histi_args a = {*hist, *input, lo, hi};
  if (kc_numel(hist) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_histc_int, &a, sizeof a);
}

/* ------------------------------------------------ order statistics */

typedef struct {
  double v;
  int64_t i;
} vi;

static int vi_cmp(const void *pa, const void *pb) {
  const vi *a = pa, *b = pb;
  int na = isnan(a->v), nb = isnan(b->v);
  if (na != nb) return na - nb;
  if (!na && a->v != b->v) return a->v < b->v ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

/* kthvalue and the medians select (kselect.h) under vi_cmp's order
 * instead of sorting the row (1M floats: ~190 ms sorted, ~11-20 ms
 * selected); mode sorts */
#define VI_LT(a, b) (vi_cmp(&(a), &(b)) < 0)
DEF_KSELECT(vi_select, vi, VI_LT)

typedef struct {
  tpurt_view values, indices, in;
  tpurt_select_kind kind;
  int64_t k;
} sel_args;

typedef struct {
  sel_args *a;
  char *vals, *idx, *in;
  kc_err err;
} sel_ctx;

static void sel_chunk(void *c, int64_t r0, int64_t r1) {
  sel_ctx *x = c;
  sel_args *a = x->a;
  int64_t n = a->in.sizes[1];
  tpurt_dtype dt = a->in.dtype;
  int isint = !kc_is_float(dt);
  vi *buf = malloc((size_t)n * sizeof(vi));
  if (!buf) {
    kc_err_index(&x->err, "out of host memory");
    return;
  }
  for (int64_t r = r0; r < r1; r++) {
    int64_t nnan = 0;
    if (dt == TPURT_F32 && a->in.strides[1] == 1) {
      const float *p = (const float *)at2(x->in, &a->in, r, 0);
      for (int64_t j = 0; j < n; j++) {
        buf[j].v = p[j];
        buf[j].i = j;
        nnan += p[j] != p[j];
      }
    } else {
      for (int64_t j = 0; j < n; j++) {
        const char *p = at2(x->in, &a->in, r, j);
        buf[j].v = isint ? (double)kc_ldi(dt, p) : kc_ld(dt, p);
        buf[j].i = j;
        nnan += isnan(buf[j].v);
      }
    }
    int64_t pos = 0;
    if (a->kind == TPURT_SELECT_MODE) {
      qsort(buf, (size_t)n, sizeof(vi), vi_cmp);
      int64_t best = 0, run = 0;
      for (int64_t j = 0; j < n; j++) {
        run++;
        int last = j == n - 1 || !(buf[j].v == buf[j + 1].v || (isnan(buf[j].v) && isnan(buf[j + 1].v)));
        if (last) {
          if (run > best) {
            best = run;
            pos = j;
          }
          run = 0;
        }
      }
    } else {
      pos = a->kind == TPURT_SELECT_KTH      ? a->k
            : a->kind == TPURT_SELECT_MEDIAN ? (nnan ? n - nnan : (n - 1) / 2)
                                             : (n - nnan > 0 ? (n - nnan - 1) / 2 : 0); /* nanmedian */
      if (KSELECT_BY_HEAP(pos + 1, n))
        vi_select_first(buf, n, pos + 1);
      else
        vi_select(buf, n, pos);
    }
    char *vp = (char *)at2(x->vals, &a->values, r, 0);
    if (isint) kc_sti(a->values.dtype, vp, (int64_t)buf[pos].v); else kc_st(a->values.dtype, vp, buf[pos].v);
    if (x->idx) kc_sti(TPURT_I64, (char *)at2(x->idx, &a->indices, r, 0), buf[pos].i);
  }
  free(buf);
}

static tpurt_status k_select(void *p, char *err, size_t errlen) {
  sel_args *a = p;
  sel_ctx x;
  memset(&x, 0, sizeof x);
  x.a = a;
  x.vals = tpurt__host_view(a->values.ptr);
  x.idx = a->indices.ndim ? tpurt__host_view(a->indices.ptr) : NULL;
  x.in = tpurt__host_view(a->in.ptr);
  atomic_init(&x.err.set, 0);
  int64_t n = a->in.sizes[1] + 1;
  tpurt_parallel_for(a->in.sizes[0], n >= 1024 ? 1 : 1024 / n + 1, sel_chunk, &x);
  return kc_err_finish(&x.err, TPURT_ERR_OUT_OF_MEMORY, err, errlen);
}

tpurt_status tpurt_select_rows(tpurt_stream *s, const tpurt_view *values, const tpurt_view *indices,
                               const tpurt_view *in, tpurt_select_kind kind, int64_t k) {
  TPURT__INIT_OR_RETURN();
  const char *op = kind == TPURT_SELECT_KTH ? "kthvalue" : kind == TPURT_SELECT_MODE ? "mode"
                   : kind == TPURT_SELECT_MEDIAN ? "median" : "nanmedian";
  tpurt_status st;
  if (!values || !in) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, values))) return st;
  if ((st = kc_check(s->dev, values, op, "values")) || (st = kc_check(s->dev, in, op, "in"))) return st;
  if (in->ndim != 2 || values->ndim != 2 || values->sizes[0] != in->sizes[0] || values->sizes[1] != 1 ||
      values->dtype != in->dtype || kc_is_complex(in->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected in [R, n] and values [R, 1] of one real dtype", op);
  if (in->sizes[1] == 0 && in->sizes[0] > 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: cannot select from empty rows", op);
  if (kind == TPURT_SELECT_KTH && (k < 0 || k >= in->sizes[1]))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: k %" PRId64 " out of range", op, k + 1);
  sel_args a;
  memset(&a, 0, sizeof a);
  a.values = *values;
  a.in = *in;
  a.kind = kind;
  a.k = k;
  if (indices) {
    if ((st = kc_check(s->dev, indices, op, "indices"))) return st;
    if (indices->ndim != 2 || indices->sizes[0] != in->sizes[0] || indices->sizes[1] != 1 ||
        indices->dtype != TPURT_I64)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices must be int64 [R, 1]", op);
    a.indices = *indices;
  }
  if (in->sizes[0] == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_select, &a, sizeof a);
}

/* ---------------------------------------------------- segment reduce */

typedef struct {
  tpurt_view out, grad, data, offsets, result;
  int backward;
  tpurt_segment_op op;
  int has_initial;
  double initial;
} seg_args;

typedef struct {
  seg_args *a;
  char *out, *grad, *data, *off, *res;
  kc_err err;
} seg_ctx;

static inline char *at3(char *base, const tpurt_view *v, int64_t i, int64_t j, int64_t k) {
  return base + (i * v->strides[0] + j * v->strides[1] + k * v->strides[2]) * (int64_t)tpurt_dtype_size(v->dtype);
}

static void seg_chunk(void *c, int64_t t0, int64_t t1) {
  seg_ctx *x = c;
  seg_args *a = x->a;
  int64_t nseg = a->offsets.sizes[1] - 1, I = a->data.sizes[2], S = a->data.sizes[1];
  tpurt_dtype dt = a->data.dtype;
  for (int64_t t = t0; t < t1; t++) {
    int64_t o = t / nseg, sg = t % nseg;
    int64_t beg = kc_ld_idx(a->offsets.dtype, at2(x->off, &a->offsets, o, sg));
    int64_t end = kc_ld_idx(a->offsets.dtype, at2(x->off, &a->offsets, o, sg + 1));
    if (beg < 0 || end > S || beg > end) {
      kc_err_index(&x->err, "segment %" PRId64 " spans [%" PRId64 ", %" PRId64 ") outside the %" PRId64
                   " elements of the reduced axis (lengths must be non-negative and sum to the axis size)",
                   sg, beg, end, S);
      return;
    }
    int64_t len = end - beg;
    for (int64_t i = 0; i < I; i++) {
      if (!a->backward) {
        double acc;
        switch (a->op) {
          case TPURT_SEG_MAX: acc = a->has_initial ? a->initial : -INFINITY; break;
          case TPURT_SEG_MIN: acc = a->has_initial ? a->initial : INFINITY; break;
          case TPURT_SEG_PROD: acc = a->has_initial ? a->initial : 1.0; break;
          default: acc = a->has_initial ? a->initial : 0.0; break;
        }
        for (int64_t j = beg; j < end; j++) {
          double v = kc_ld(dt, at3(x->data, &a->data, o, j, i));
          switch (a->op) {
            case TPURT_SEG_MAX: acc = (isnan(v) || v > acc) && !isnan(acc) ? v : acc; break;
            case TPURT_SEG_MIN: acc = (isnan(v) || v < acc) && !isnan(acc) ? v : acc; break;
            case TPURT_SEG_PROD: acc *= v; break;
            default: acc += v; break;
          }
        }
        if (a->op == TPURT_SEG_MEAN) acc = len > 0 ? acc / (double)len : (a->has_initial ? acc : NAN);
        kc_st(a->out.dtype, at3(x->out, &a->out, o, sg, i), acc);
      } else {
        double g = kc_ld(dt, at3(x->grad, &a->grad, o, sg, i));
        double res = kc_ld(dt, at3(x->res, &a->result, o, sg, i));
        if (a->op == TPURT_SEG_MAX || a->op == TPURT_SEG_MIN) {
          int64_t cnt = 0;
          for (int64_t j = beg; j < end; j++) {
            double v = kc_ld(dt, at3(x->data, &a->data, o, j, i));
            cnt += v == res || (isnan(v) && isnan(res));
          }
          for (int64_t j = beg; j < end; j++) {
            double v = kc_ld(dt, at3(x->data, &a->data, o, j, i));
            int hit = v == res || (isnan(v) && isnan(res));
            kc_st(dt, at3(x->out, &a->out, o, j, i), hit ? g / (double)cnt : 0.0);
          }
        } else if (a->op == TPURT_SEG_PROD) {
          for (int64_t j = beg; j < end; j++) {
            double v = kc_ld(dt, at3(x->data, &a->data, o, j, i));
            double gv;
            if (v == 0 || isnan(v)) {
              double ex = a->has_initial ? a->initial : 1.0;
              for (int64_t k = beg; k < end; k++)
                if (k != j) ex *= kc_ld(dt, at3(x->data, &a->data, o, k, i));
              gv = g * ex;
            } else {
              gv = g * res / v;
            }
            kc_st(dt, at3(x->out, &a->out, o, j, i), gv);
          }
        } else {
          double gv = a->op == TPURT_SEG_MEAN ? (len > 0 ? g / (double)len : 0.0) : g;
          for (int64_t j = beg; j < end; j++) kc_st(dt, at3(x->out, &a->out, o, j, i), gv);
        }
      }
    }
  }
}

static tpurt_status k_segment(void *p, char *err, size_t errlen) {
  seg_args *a = p;
  seg_ctx x;
  memset(&x, 0, sizeof x);
  x.a = a;
  x.out = tpurt__host_view(a->out.ptr);
  x.data = kc_numel(&a->data) ? tpurt__host_view(a->data.ptr) : NULL;
  x.off = tpurt__host_view(a->offsets.ptr);
  if (a->backward) {
    x.grad = tpurt__host_view(a->grad.ptr);
    x.res = tpurt__host_view(a->result.ptr);
    /* elements outside every segment get 0 */
    int64_t O = a->out.sizes[0], S = a->out.sizes[1], I = a->out.sizes[2];
    for (int64_t o = 0; o < O; o++)
      for (int64_t j = 0; j < S; j++)
        for (int64_t i = 0; i < I; i++) kc_st(a->out.dtype, at3(x.out, &a->out, o, j, i), 0.0);
  }
  atomic_init(&x.err.set, 0);
  int64_t nseg = a->offsets.sizes[1] - 1;
  tpurt_parallel_for(a->offsets.sizes[0] * nseg, 64, seg_chunk, &x);
  return kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
}

static tpurt_status segment_common(tpurt_stream *s, seg_args *a, const char *op) {
  tpurt_status st;
  if ((st = stream_for(&s, &a->out))) return st;
  if ((st = kc_check(s->dev, &a->out, op, "out")) || (st = kc_check(s->dev, &a->data, op, "data")) ||
      (st = kc_check(s->dev, &a->offsets, op, "offsets")))
    return st;
  if (a->out.ndim != 3 || a->data.ndim != 3 || a->offsets.ndim != 2 || !kc_is_index_dtype(a->offsets.dtype) ||
      !kc_is_float(a->data.dtype) || a->out.dtype != a->data.dtype || a->offsets.sizes[1] < 1 ||
      a->offsets.sizes[0] != a->data.sizes[0] || a->out.sizes[0] != a->data.sizes[0] ||
      a->out.sizes[2] != a->data.sizes[2])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected data [O, S, I], offsets [O, n+1], out [O, *, I]", op);
  if (a->backward) {
    if ((st = kc_check(s->dev, &a->grad, op, "grad")) || (st = kc_check(s->dev, &a->result, op, "output")))
      return st;
    if (a->out.sizes[1] != a->data.sizes[1] || a->grad.ndim != 3 || a->result.ndim != 3 ||
        a->grad.sizes[1] != a->offsets.sizes[1] - 1 || a->result.sizes[1] != a->offsets.sizes[1] - 1 ||
        a->grad.dtype != a->data.dtype || a->result.dtype != a->data.dtype)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad / output must be [O, n, I]", op);
  } else if (a->out.sizes[1] != a->offsets.sizes[1] - 1) {
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must have one entry per segment", op);
  }
  if (kc_numel(&a->out) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_segment, a, sizeof *a);
}

tpurt_status tpurt_segment_reduce(tpurt_stream *s, const tpurt_view *out, const tpurt_view *data,
                                  const tpurt_view *offsets, tpurt_segment_op op, int has_initial, double initial) {
  TPURT__INIT_OR_RETURN();
  if (!out || !data || !offsets) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "segment_reduce: NULL view");
  seg_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.data = *data;
  a.offsets = *offsets;
  a.op = op;
  a.has_initial = has_initial;
  a.initial = initial;
  return segment_common(s, &a, "segment_reduce");
}

tpurt_status tpurt_segment_reduce_backward(tpurt_stream *s, const tpurt_view *grad_data, const tpurt_view *grad,
                                           const tpurt_view *output, const tpurt_view *data,
                                           const tpurt_view *offsets, tpurt_segment_op op, int has_initial,
                                           double initial) {
  TPURT__INIT_OR_RETURN();
  if (!grad_data || !grad || !output || !data || !offsets)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "segment_reduce_backward: NULL view");
  seg_args a;
  memset(&a, 0, sizeof a);
  a.out = *grad_data;
  a.grad = *grad;
  a.result = *output;
  a.data = *data;
  a.offsets = *offsets;
  a.backward = 1;
  a.op = op;
  a.has_initial = has_initial;
  a.initial = initial;
  return segment_common(s, &a, "segment_reduce_backward");
}
