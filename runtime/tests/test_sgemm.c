#define _GNU_SOURCE
/* test_sgemm.c — the runtime's own packed f32 GEMM (kernels/sgemm.c),
 * forced with TORCH_TPU_SGEMM=own (AVX2 micro-kernel where the CPU has it,
 * with 8 x 32 AVX-512 tiles where it has those), =narrow (AVX2 6 x 16 tiles)
 * and =scalar (portable micro-kernel), against a double-accumulated
 * reference: shapes around the micro-tiles and the cache blocks, all
 * transposes, leading dimensions above the minimum, alpha/beta (beta 0 with
 * NaN in C), batches with stride-0 operands, K == 0; and bitwise
 * determinism across repeats and pool sizes (child processes with
 * TPU_NUM_THREADS=1 and 3). */
#include <math.h>
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static uint32_t g_seed = 12345;
static float rnd(void) {
  g_seed = g_seed * 1664525u + 1013904223u;
  return (float)((g_seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* One (batched) product through tpurt_gemm with f32 views:
 * A batch i, element (r, k) at A[i*sa + (ta ? k*lda + r : r*lda + k)]. */
typedef struct {
  int64_t nb, M, N, K;
  int ta, tb;
  int64_t lda, ldb, ldc; /* 0: minimum */
  int64_t sa, sb;        /* batch strides; -1: dense, 0: broadcast */
  double alpha, beta;
  int nan_c; /* fill C with NaN (beta must be 0) */
} prob;

typedef struct {
  float *a, *b, *c;
  size_t na, nb, nc;
  int64_t lda, ldb, ldc, sa, sb, sc;
} bufs;

static size_t span(int64_t nb, int64_t sbatch, int64_t rows, int64_t ld) {
  return (size_t)((nb - 1) * sbatch + rows * ld + 1);
}

static void setup(const prob *p, bufs *h) {
  int64_t M = p->M, N = p->N, K = p->K;
  h->lda = p->lda ? p->lda : (p->ta ? M : K);
  h->ldb = p->ldb ? p->ldb : (p->tb ? K : N);
  h->ldc = p->ldc ? p->ldc : N;
  if (h->lda < 1) h->lda = 1;
  if (h->ldb < 1) h->ldb = 1;
  int64_t arows = p->ta ? K : M, brows = p->tb ? N : K;
  h->sa = p->sa < 0 ? arows * h->lda + 3 : p->sa;
  h->sb = p->sb < 0 ? brows * h->ldb + 5 : p->sb;
  h->sc = M * h->ldc + 7;
  h->na = span(p->nb, h->sa, arows, h->lda);
  h->nb = span(p->nb, h->sb, brows, h->ldb);
  h->nc = span(p->nb, h->sc, M, h->ldc);
  h->a = malloc(h->na * 4);
  h->b = malloc(h->nb * 4);
  h->c = malloc(h->nc * 4);
  for (size_t i = 0; i < h->na; i++) h->a[i] = rnd();
  for (size_t i = 0; i < h->nb; i++) h->b[i] = rnd();
  for (size_t i = 0; i < h->nc; i++) h->c[i] = p->nan_c ? NAN : rnd();
}

static tpurt_view view(tpurt_devptr d, int64_t nb, int64_t r, int64_t c, int64_t s0, int64_t s1, int64_t s2) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = d;
  v.dtype = TPURT_F32;
  v.ndim = 3;
  v.sizes[0] = nb, v.sizes[1] = r, v.sizes[2] = c;
  v.strides[0] = s0, v.strides[1] = s1, v.strides[2] = s2;
  return v;
}

/* Runs the product on the device; out receives C (h->nc floats). */
static void run_dev(const prob *p, const bufs *h, float *out) {
  tpurt_devptr da, db, dc;
  CHECK_OK(tpurt_malloc(0, h->na * 4, S, &da));
  CHECK_OK(tpurt_malloc(0, h->nb * 4, S, &db));
  CHECK_OK(tpurt_malloc(0, h->nc * 4, S, &dc));
  CHECK_OK(tpurt_memcpy_h2d(S, da, h->a, h->na * 4, 0));
  CHECK_OK(tpurt_memcpy_h2d(S, db, h->b, h->nb * 4, 0));
  CHECK_OK(tpurt_memcpy_h2d(S, dc, h->c, h->nc * 4, 0));
  tpurt_view av = p->ta ? view(da, p->nb, p->M, p->K, h->sa, 1, h->lda) : view(da, p->nb, p->M, p->K, h->sa, h->lda, 1);
  tpurt_view bv = p->tb ? view(db, p->nb, p->K, p->N, h->sb, 1, h->ldb) : view(db, p->nb, p->K, p->N, h->sb, h->ldb, 1);
  tpurt_view cv = view(dc, p->nb, p->M, p->N, h->sc, h->ldc, 1);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, p->alpha, p->beta, TPURT_PRECISION_HIGHEST));
  CHECK_OK(tpurt_memcpy_d2h(S, out, dc, h->nc * 4, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(da), tpurt_free(db), tpurt_free(dc);
}

static void free_bufs(bufs *h) { free(h->a), free(h->b), free(h->c); }

static int check_prob(const prob *p, const char *mode) {
  bufs h;
  setup(p, &h);
  float *out = malloc(h.nc * 4);
  run_dev(p, &h, out);
  int bad = 0;
  double worst = 0;
  for (int64_t bi = 0; bi < p->nb && bad < 3; bi++)
    for (int64_t i = 0; i < p->M && bad < 3; i++)
      for (int64_t j = 0; j < p->N && bad < 3; j++) {
        double s = 0, mag = 0;
        for (int64_t k = 0; k < p->K; k++) {
          double x = p->ta ? h.a[bi * h.sa + k * h.lda + i] : h.a[bi * h.sa + i * h.lda + k];
          double y = p->tb ? h.b[bi * h.sb + j * h.ldb + k] : h.b[bi * h.sb + k * h.ldb + j];
          s += x * y;
          mag += fabs(x * y);
        }
        int64_t o = bi * h.sc + i * h.ldc + j;
        double c0 = p->beta == 0 ? 0 : h.c[o];
        double ref = p->alpha * s + p->beta * c0;
        double tol = 1e-5 * sqrt((double)p->K + 1) * (fabs(p->alpha) * mag + fabs(p->beta * c0)) + 1e-30;
        double err = fabs((double)out[o] - ref);
        if (!(err <= tol)) {
          fprintf(stderr,
                  "[%s] nb%lld M%lld N%lld K%lld ta%d tb%d ld %lld/%lld/%lld alpha %g beta %g: C[%lld,%lld,%lld] = %.9g, "
                  "want %.9g (tol %g)\n",
                  mode, (long long)p->nb, (long long)p->M, (long long)p->N, (long long)p->K, p->ta, p->tb,
                  (long long)h.lda, (long long)h.ldb, (long long)h.ldc, p->alpha, p->beta, (long long)bi,
                  (long long)i, (long long)j, out[o], ref, tol);
          bad++;
        }
        if (err / tol > worst) worst = err / tol;
      }
  /* elements of C outside the product are untouched */
  for (int64_t bi = 0; bi < p->nb && !bad; bi++)
    for (int64_t i = 0; i < p->M; i++)
      for (int64_t j = p->N; j < h.ldc && (bi < p->nb - 1 || i < p->M - 1); j++) {
        int64_t o = bi * h.sc + i * h.ldc + j;
        if (memcmp(&out[o], &h.c[o], 4) != 0) {
          fprintf(stderr, "[%s] M%lld N%lld K%lld: padding C[%lld,%lld,%lld] written\n", mode, (long long)p->M,
                  (long long)p->N, (long long)p->K, (long long)bi, (long long)i, (long long)j);
          bad++;
          break;
        }
      }
  free(out);
  free_bufs(&h);
  if (bad) g_failures++;
  return bad;
}

static prob P(int64_t nb, int64_t M, int64_t N, int64_t K, int ta, int tb) {
  prob p;
  memset(&p, 0, sizeof p);
  p.nb = nb, p.M = M, p.N = N, p.K = K, p.ta = ta, p.tb = tb;
  p.sa = p.sb = -1;
  p.alpha = 1.0, p.beta = 0.0;
  return p;
}

static void test_shapes(const char *mode) {
  setenv("TORCH_TPU_SGEMM", mode, 1);
  static const int64_t dims[] = {1, 2, 5, 6, 7, 13, 16, 17, 31, 37, 63, 65, 127, 129, 257};
  int nd = (int)(sizeof dims / sizeof *dims);
  /* M, N, K each over the list (diagonal and off-diagonal walks), all transposes */
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < nd; i++) {
      prob p = P(1, dims[i], dims[(i * 7 + 3) % nd], dims[(i * 5 + 1) % nd], t & 1, t >> 1);
      check_prob(&p, mode);
      p = P(1, dims[(i * 3 + 2) % nd], dims[i], dims[(i * 11 + 4) % nd], t & 1, t >> 1);
      check_prob(&p, mode);
    }
  for (int i = 0; i < nd; i++) {
    prob p = P(1, dims[i], dims[i], dims[i], 0, 0);
    check_prob(&p, mode);
  }
  /* 1..37 along each dimension around a fixed other two */
  for (int64_t d = 1; d <= 37; d++) {
    prob p = P(1, d, 19, 23, 0, 0);
    check_prob(&p, mode);
    p = P(1, 11, d, 23, 1, 0);
    check_prob(&p, mode);
    p = P(1, 11, 19, d, 0, 1);
    check_prob(&p, mode);
  }
  /* K across several KC chunks, N across several NC panels */
  prob p = P(1, 67, 45, 1100, 0, 0);
  p.beta = 0.5;
  check_prob(&p, mode);
  p = P(1, 20, 4200, 70, 1, 1);
  p.beta = 1.0;
  check_prob(&p, mode);
  p = P(1, 301, 389, 517, 1, 0);
  check_prob(&p, mode);
}

static void test_strides_alpha_beta(const char *mode) {
  setenv("TORCH_TPU_SGEMM", mode, 1);
  for (int t = 0; t < 4; t++) {
    prob p = P(1, 37, 41, 29, t & 1, t >> 1);
    p.lda = (t & 1 ? 37 : 29) + 5;
    p.ldb = (t >> 1 ? 29 : 41) + 3;
    p.ldc = 41 + 9;
    p.alpha = -1.75;
    p.beta = 0.5;
    check_prob(&p, mode);
    p.beta = 1.0;
    p.alpha = 0.25;
    check_prob(&p, mode);
    p.beta = 0.0;
    p.nan_c = 1; /* beta 0 never reads C */
    check_prob(&p, mode);
    p = P(1, 130, 70, 300, t & 1, t >> 1);
    p.nan_c = 1;
    p.alpha = 3.0;
    check_prob(&p, mode);
  }
  prob p = P(1, 1, 1, 1, 0, 0);
  check_prob(&p, mode);
  p.nan_c = 1;
  check_prob(&p, mode);
  /* K == 0: C = beta C (beta 0: zeros even over NaN) */
  p = P(1, 9, 17, 0, 0, 0);
  p.nan_c = 1;
  check_prob(&p, mode);
  p = P(3, 9, 17, 0, 1, 1);
  p.beta = 0.5;
  check_prob(&p, mode);
}

static void test_batched(const char *mode) {
  setenv("TORCH_TPU_SGEMM", mode, 1);
  for (int t = 0; t < 4; t++) {
    prob p = P(5, 33, 21, 47, t & 1, t >> 1);
    p.alpha = 0.5;
    p.beta = 1.0;
    check_prob(&p, mode);
    p.sa = 0; /* broadcast A */
    check_prob(&p, mode);
    p.sa = -1;
    p.sb = 0; /* broadcast B */
    p.beta = 0;
    p.nan_c = 1;
    check_prob(&p, mode);
  }
  prob p = P(64, 16, 16, 16, 0, 1); /* many small: parallel over the batch */
  check_prob(&p, mode);
  p = P(3, 200, 150, 300, 1, 0); /* few large: parallel inside each */
  p.sb = 0;
  check_prob(&p, mode);
  p = P(2, 7, 3000, 40, 0, 0);
  check_prob(&p, mode);
}

/* ------------------------------------------------------- determinism */

static uint64_t fnv(const float *x, size_t n, uint64_t h) {
  const unsigned char *b = (const unsigned char *)x;
  for (size_t i = 0; i < n * 4; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* Products that split over the pool in different ways; returns a hash
 * of all their results (bitwise). */
static uint64_t det_hash(void) {
  static const int64_t sh[][6] = {
      /* nb, M, N, K, ta, tb */
      {1, 301, 389, 517, 0, 0}, {1, 37, 2000, 300, 1, 0}, {1, 1000, 40, 700, 0, 1}, {8, 100, 90, 110, 1, 1},
      {2, 500, 500, 300, 0, 0}, {1, 4, 5000, 64, 0, 0},
  };
  uint64_t h = 0xcbf29ce484222325ull;
  g_seed = 777;
  for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
    prob p = P(sh[s][0], sh[s][1], sh[s][2], sh[s][3], (int)sh[s][4], (int)sh[s][5]);
    p.alpha = 0.75;
    p.beta = s & 1 ? 0.5 : 0.0;
    bufs b;
    setup(&p, &b);
    float *out = malloc(b.nc * 4);
    run_dev(&p, &b, out);
    h = fnv(out, b.nc, h);
    free(out);
    free_bufs(&b);
  }
  return h;
}

static uint64_t child_hash(const char *self, int threads, const char *mode) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "TPU_NUM_THREADS=%d TORCH_TPU_SGEMM=%s '%s' --hash", threads, mode, self);
  FILE *f = popen(cmd, "r");
  CHECK(f != NULL);
  unsigned long long v = 0;
  if (!f || fscanf(f, "%llx", &v) != 1) {
    fprintf(stderr, "child (%s) gave no hash\n", cmd);
    g_failures++;
  }
  if (f) CHECK(pclose(f) == 0);
  return v;
}

static void test_determinism(const char *self, const char *mode) {
  setenv("TORCH_TPU_SGEMM", mode, 1);
  uint64_t h0 = det_hash(), h1 = det_hash();
  CHECK(h0 == h1);
  uint64_t c1 = child_hash(self, 1, mode), c3 = child_hash(self, 3, mode);
  if (c1 != h0 || c3 != h0)
    fprintf(stderr, "[%s] results differ by pool size: %d threads %llx, 1 thread %llx, 3 threads %llx\n", mode,
            tpurt_num_threads(), (unsigned long long)h0, (unsigned long long)c1, (unsigned long long)c3);
  CHECK(c1 == h0);
  CHECK(c3 == h0);
}

/* Hash of one product in a TORCH_TPU_SGEMM mode (NULL: automatic choice). */
static uint64_t one_hash(const char *mode, int64_t nb, int64_t M, int64_t N, int64_t K) {
  if (mode)
    setenv("TORCH_TPU_SGEMM", mode, 1);
  else
    unsetenv("TORCH_TPU_SGEMM");
  g_seed = 4242;
  prob p = P(nb, M, N, K, 0, 0);
  bufs b;
  setup(&p, &b);
  float *out = malloc(b.nc * 4);
  run_dev(&p, &b, out);
  uint64_t h = fnv(out, b.nc, 0xcbf29ce484222325ull);
  free(out);
  free_bufs(&b);
  return h;
}

/* On an AVX-512 CPU whose library runs AVX2 kernels (a CPU model the
 * library does not know), the automatic choice takes the own kernel for
 * small batched and thin products (gemm.c, use_own). Observed by bits:
 * the automatic result equals the own kernel's and, for these operands,
 * not the library tiles'. */
static void test_choice_by_library_width(void) {
  const char *lib = tpurt_gemm_library();
  int narrow = strstr(lib, "AVX-512") && !strcasestr(lib, "skylakex") && !strcasestr(lib, "cooperlake") &&
               !strcasestr(lib, "sapphirerapids");
  if (!narrow) {
    printf("choice by library width: not this machine (%s)\n", lib);
    return;
  }
  static const int64_t sh[][4] = {{64, 64, 64, 32}, {256, 32, 32, 32}, {1, 16, 96, 128}, {1, 512, 12, 512}};
  for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
    uint64_t a = one_hash(NULL, sh[s][0], sh[s][1], sh[s][2], sh[s][3]);
    uint64_t own = one_hash("own", sh[s][0], sh[s][1], sh[s][2], sh[s][3]);
    uint64_t tiles = one_hash("blas", sh[s][0], sh[s][1], sh[s][2], sh[s][3]);
    CHECK(own != tiles); /* else the bits could not tell the two apart */
    CHECK(a == own);
  }
}

int main(int argc, char **argv) {
  if (!getenv("TORCH_TPU_SGEMM")) setenv("TORCH_TPU_SGEMM", "own", 1);
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  if (argc > 1 && !strcmp(argv[1], "--hash")) {
    printf("%llx\n", (unsigned long long)det_hash());
    return g_failures ? 1 : 0;
  }
  /* the runtime reports its own kernel */
  printf("gemm library: %s\n", tpurt_gemm_library());
  CHECK(strstr(tpurt_gemm_library(), "tpurt sgemm") != NULL);
  test_choice_by_library_width();
  /* nobuf: the path taken when the packing buffers cannot be allocated */
  const char *modes[] = {"own", "scalar", "nobuf", "narrow"};
  for (int m = 0; m < 4; m++) {
    test_shapes(modes[m]);
    test_strides_alpha_beta(modes[m]);
    test_batched(modes[m]);
    test_determinism(argv[0], modes[m]);
  }
  /* ... and it gives the buffered path's bits */
  setenv("TORCH_TPU_SGEMM", "own", 1);
  uint64_t h_own = det_hash();
  setenv("TORCH_TPU_SGEMM", "nobuf", 1);
  CHECK(det_hash() == h_own);
  /* ... and so do the 6 x 16 tiles alone (AVX-512 CPUs run 8 x 32 tiles):
   * an element's bits do not depend on the tile shape */
  setenv("TORCH_TPU_SGEMM", "narrow", 1);
  CHECK(det_hash() == h_own);
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_sgemm: OK\n");
  return 0;
}
