/* test_copy.c — memcpy h2d/d2h/d2d (blocking and not), validation,
 * copy_strided (transpose, negative and zero strides, large parallel
 * copies, overlap) and fill for every dtype. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static void test_memcpy(void) {
  size_t n = 10 << 20; /* above the parallel threshold */
  unsigned char *h = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 131 + 7);
  tpurt_devptr d, d2;
  CHECK_OK(tpurt_malloc(0, n, S, &d));
  CHECK_OK(tpurt_malloc(0, n, S, &d2));
  CHECK_OK(tpurt_memcpy_h2d(S, d, h, n, 0));
  CHECK_OK(tpurt_memcpy_d2d(S, d2, d, n));
  memset(back, 0, n);
  CHECK_OK(tpurt_memcpy_d2h(S, back, d2, n, 0));
  CHECK(memcmp(h, back, n) == 0);
  /* non-blocking with pinned memory */
  void *ph, *pb;
  CHECK_OK(tpurt_host_alloc(4096, &ph));
  CHECK_OK(tpurt_host_alloc(4096, &pb));
  for (int i = 0; i < 4096; i++) ((unsigned char *)ph)[i] = (unsigned char)(255 - i);
  CHECK_OK(tpurt_memcpy_h2d(S, d + 100, ph, 4096, 1));
  CHECK_OK(tpurt_memcpy_d2h(S, pb, d + 100, 4096, 1));
  CHECK_OK(tpurt_stream_synchronize(S));
  CHECK(memcmp(ph, pb, 4096) == 0);
  /* overlapping d2d on one device behaves like memmove */
  CHECK_OK(tpurt_memcpy_h2d(S, d, h, 2000, 1));
  CHECK_OK(tpurt_memcpy_d2d(S, d + 1, d, 1000));
  CHECK_OK(tpurt_memcpy_d2h(S, back, d, 1001, 0));
  CHECK_EQ(back[0], h[0]);
  int ok = 1;
  for (int i = 0; i < 1000; i++) ok &= back[i + 1] == h[i];
  CHECK(ok);
  /* validation */
  CHECK_ST(tpurt_memcpy_h2d(S, 0x1000, h, 16, 0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_memcpy_h2d(S, d, NULL, 16, 0), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_device_props p;
  tpurt_device_get_props(0, &p);
  CHECK_ST(tpurt_memcpy_h2d(S, 0xE000000000000000ull + p.total_memory - 8, h, 16, 0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_memcpy_d2h(S, back, 0xE000000000000000ull + (1ull << 44), 16, 0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_memcpy_h2d(S, d, h, 0, 0));
  CHECK_OK(tpurt_host_free(ph));
  CHECK_OK(tpurt_host_free(pb));
  CHECK_OK(tpurt_free(d));
  CHECK_OK(tpurt_free(d2));
  free(h);
  free(back);
}

/* Byte copies of every size class (inline memcpy, one vector loop, the
 * pool's 1 MiB chunks, non-temporal stores from 32 MiB) at odd offsets of
 * source and destination: every byte arrives, the bytes around the copy
 * stay as they were, through h2d, d2d and d2h. */
static void test_memcpy_sizes(void) {
  const size_t sizes[] = {100, 5000, (1u << 20) + 77, (5u << 20) + 13, (40u << 20) + 5};
  const size_t offs[][2] = {{0, 0}, {1, 63}, {37, 5}};
  size_t cap = (40u << 20) + 256;
  unsigned char *h = malloc(cap), *back = malloc(cap);
  for (size_t i = 0; i < cap; i++) h[i] = (unsigned char)(i * 2654435761u >> 13);
  tpurt_devptr a, b;
  CHECK_OK(tpurt_malloc(0, cap, S, &a));
  CHECK_OK(tpurt_malloc(0, cap, S, &b));
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
    for (size_t q = 0; q < sizeof offs / sizeof *offs; q++) {
      size_t n = sizes[k], od = offs[q][0], os = offs[q][1];
      memset(back, 0xA5, cap);
      CHECK_OK(tpurt_memcpy_h2d(S, b, back, cap, 0)); /* b: a known background */
      CHECK_OK(tpurt_memcpy_h2d(S, a + os, h + 3, n, 0));
      CHECK_OK(tpurt_memcpy_d2d(S, b + od, a + os, n));
      CHECK_OK(tpurt_memcpy_d2h(S, back, b, cap, 0));
      int ok = memcmp(back + od, h + 3, n) == 0;
      for (size_t i = 0; i < od; i++) ok &= back[i] == 0xA5;
      for (size_t i = od + n; i < od + n + 64 && i < cap; i++) ok &= back[i] == 0xA5;
      memset(back, 0, cap);
      CHECK_OK(tpurt_memcpy_d2h(S, back + 7, b + od, n, 0));
      ok &= memcmp(back + 7, h + 3, n) == 0 && back[6] == 0 && back[7 + n] == 0;
      if (!ok) fprintf(stderr, "  size %zu, offsets %zu / %zu\n", n, od, os);
      CHECK(ok);
    }
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  free(h);
  free(back);
}

static void test_strided(void) {
  enum { R = 37, C = 53 };
  float h[R * C], out[R * C];
  for (int i = 0; i < R * C; i++) h[i] = (float)i;
  tpurt_devptr a, b;
  CHECK_OK(tpurt_malloc(0, sizeof h, S, &a));
  CHECK_OK(tpurt_malloc(0, sizeof h, S, &b));
  CHECK_OK(tpurt_memcpy_h2d(S, a, h, sizeof h, 0));
  /* transpose: dst[j][i] = src[i][j]; dst is C x R contiguous */
  int64_t dsz[2] = {C, R}, dst_st[2] = {R, 1}, src_st[2] = {1, C};
  tpurt_view dv = check_view_st(b, TPURT_F32, 2, dsz, dst_st), sv = check_view_st(a, TPURT_F32, 2, dsz, src_st);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, out, b, sizeof out, 0));
  int ok = 1;
  for (int j = 0; j < C; j++)
    for (int i = 0; i < R; i++) ok &= out[j * R + i] == h[i * C + j];
  CHECK(ok);
  /* negative strides: reverse both dims */
  int64_t sz2[2] = {R, C}, cst[2] = {C, 1}, neg[2] = {-C, -1};
  dv = check_view_st(b, TPURT_F32, 2, sz2, cst);
  sv = check_view_st(a + (uint64_t)(R * C - 1) * 4, TPURT_F32, 2, sz2, neg);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, out, b, sizeof out, 0));
  ok = 1;
  for (int i = 0; i < R * C; i++) ok &= out[i] == h[R * C - 1 - i];
  CHECK(ok);
  /* zero stride broadcast of row 2 into every row, with a cast to f64 */
  tpurt_devptr c;
  CHECK_OK(tpurt_malloc(0, R * C * 8, S, &c));
  int64_t bst[2] = {0, 1};
  dv = check_view_st(c, TPURT_F64, 2, sz2, cst);
  sv = check_view_st(a + 2 * C * 4, TPURT_F32, 2, sz2, bst);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  static double outd[R * C];
  CHECK_OK(tpurt_memcpy_d2h(S, outd, c, sizeof outd, 0));
  ok = 1;
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++) ok &= outd[i * C + j] == (double)h[2 * C + j];
  CHECK(ok);
  /* 0-d (scalar) copy and empty copy */
  tpurt_view d0 = check_view_st(b, TPURT_F32, 0, NULL, NULL), s0 = check_view_st(a + 4 * 5, TPURT_F32, 0, NULL, NULL);
  CHECK_OK(tpurt_copy_strided(S, &d0, &s0));
  float one;
  CHECK_OK(tpurt_memcpy_d2h(S, &one, b, 4, 0));
  CHECK(one == 5.0f);
  int64_t zsz[2] = {0, 5};
  dv = check_view_st(b, TPURT_F32, 2, zsz, cst);
  sv = check_view_st(0x1234, TPURT_F32, 2, zsz, cst); /* not even checked: nothing to copy */
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  /* shape mismatch / out of range */
  int64_t sz3[2] = {R, C + 1};
  dv = check_view_st(b, TPURT_F32, 2, sz2, cst);
  sv = check_view_st(a, TPURT_F32, 2, sz3, cst);
  CHECK_ST(tpurt_copy_strided(S, &dv, &sv), TPURT_ERR_INVALID_ARGUMENT);
  int64_t huge[2] = {1 << 20, 1 << 20}, hst[2] = {1 << 20, 1};
  dv = check_view_st(b, TPURT_F32, 2, huge, hst);
  sv = check_view_st(a, TPURT_F32, 2, huge, hst);
  CHECK_ST(tpurt_copy_strided(S, &dv, &sv), TPURT_ERR_INVALID_ARGUMENT);
  dv = check_view_st(b, TPURT_F32, 2, sz2, cst);
  sv = check_view_st(a, (tpurt_dtype)42, 2, sz2, cst);
  CHECK_ST(tpurt_copy_strided(S, &dv, &sv), TPURT_ERR_INVALID_ARGUMENT);

  /* overlapping: shift a vector right by one inside the same buffer */
  CHECK_OK(tpurt_memcpy_h2d(S, a, h, sizeof h, 0));
  int64_t n1[1] = {100}, s1[1] = {1};
  dv = check_view_st(a + 4, TPURT_F32, 1, n1, s1);
  sv = check_view_st(a, TPURT_F32, 1, n1, s1);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, out, a, 101 * 4, 0));
  ok = out[0] == 0.0f;
  for (int i = 0; i < 100; i++) ok &= out[i + 1] == h[i];
  CHECK(ok);
  /* in-place transpose of a square matrix (overlap, not identical) */
  float sq[64 * 64], sqo[64 * 64];
  for (int i = 0; i < 64 * 64; i++) sq[i] = (float)i;
  CHECK_OK(tpurt_memcpy_h2d(S, a, sq, sizeof sq, 0));
  int64_t q[2] = {64, 64}, qr[2] = {64, 1}, qc[2] = {1, 64};
  dv = check_view_st(a, TPURT_F32, 2, q, qr);
  sv = check_view_st(a, TPURT_F32, 2, q, qc);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, sqo, a, sizeof sqo, 0));
  ok = 1;
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < 64; j++) ok &= sqo[i * 64 + j] == sq[j * 64 + i];
  CHECK(ok);
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  CHECK_OK(tpurt_free(c));
}

static void test_large(void) {
  /* 2048 x 2048 float transpose and a large contiguous cast (pool paths) */
  int64_t n = 2048;
  size_t bytes = (size_t)(n * n * 4);
  float *h = malloc(bytes), *o = malloc(bytes);
  for (int64_t i = 0; i < n * n; i++) h[i] = (float)(i % 1000003);
  tpurt_devptr a, b, c;
  CHECK_OK(tpurt_malloc(0, bytes, S, &a));
  CHECK_OK(tpurt_malloc(0, bytes, S, &b));
  CHECK_OK(tpurt_malloc(0, bytes / 2, S, &c));
  CHECK_OK(tpurt_memcpy_h2d(S, a, h, bytes, 0));
  int64_t sz[2] = {n, n}, r[2] = {n, 1}, t[2] = {1, n};
  tpurt_view dv = check_view_st(b, TPURT_F32, 2, sz, r), sv = check_view_st(a, TPURT_F32, 2, sz, t);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, o, b, bytes, 0));
  int ok = 1;
  for (int64_t i = 0; i < n; i += 7)
    for (int64_t j = 0; j < n; j++) ok &= o[i * n + j] == h[j * n + i];
  CHECK(ok);
  /* f32 -> bf16 -> f32 over 4M elements */
  int64_t m[1] = {n * n}, one[1] = {1};
  dv = check_view_st(c, TPURT_BF16, 1, m, one);
  sv = check_view_st(a, TPURT_F32, 1, m, one);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  dv = check_view_st(b, TPURT_F32, 1, m, one);
  sv = check_view_st(c, TPURT_BF16, 1, m, one);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, o, b, bytes, 0));
  ok = 1;
  for (int64_t i = 0; i < n * n; i += 13) ok &= fabsf(o[i] - h[i]) <= fabsf(h[i]) / 128.0f;
  CHECK(ok);
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  CHECK_OK(tpurt_free(c));
  free(h);
  free(o);
}

/* Rows contiguous in both views moved one memcpy each down the next dim
 * (nd_chunk): an attention head transpose [B, T, H, D] -> [B, H, T, D] with
 * an odd row length, large enough that the pool's chunks start and end in
 * the middle of rows and of the row runs, in every dtype size. */
static void test_row_runs(void) {
  const int64_t B = 7, T = 53, H = 12, D = 29, n = B * T * H * D;
  const int es[4] = {1, 2, 4, 8};
  const tpurt_dtype dts[4] = {TPURT_U8, TPURT_BF16, TPURT_F32, TPURT_F64};
  unsigned char *h = malloc((size_t)n * 8), *o = malloc((size_t)n * 8);
  for (int64_t i = 0; i < n * 8; i++) h[i] = (unsigned char)(i * 37 + (i >> 8) * 11 + 5);
  tpurt_devptr a, b;
  CHECK_OK(tpurt_malloc(0, (size_t)n * 8, S, &a));
  CHECK_OK(tpurt_malloc(0, (size_t)n * 8, S, &b));
  CHECK_OK(tpurt_memcpy_h2d(S, a, h, (size_t)n * 8, 0));
  for (int t = 0; t < 4; t++) {
    /* destination [B, H, T, D] contiguous; source [B, T, H, D] read as [B, H, T, D] */
    int64_t sz[4] = {B, H, T, D}, dst[4] = {H * T * D, T * D, D, 1}, src[4] = {T * H * D, D, H * D, 1};
    tpurt_view dv = check_view_st(b, dts[t], 4, sz, dst), sv = check_view_st(a, dts[t], 4, sz, src);
    CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
    CHECK_OK(tpurt_memcpy_d2h(S, o, b, (size_t)n * es[t], 0));
    int ok = 1;
    for (int64_t ib = 0; ib < B; ib++)
      for (int64_t ih = 0; ih < H; ih++)
        for (int64_t it = 0; it < T; it++)
          ok &= !memcmp(o + ((ib * H + ih) * T + it) * D * es[t], h + ((ib * T + it) * H + ih) * D * es[t],
                        (size_t)(D * es[t]));
    if (!ok) fprintf(stderr, "row runs: element size %d differs\n", es[t]);
    CHECK(ok);
  }
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  free(h);
  free(o);
}

static void test_fill(void) {
  tpurt_devptr d;
  CHECK_OK(tpurt_malloc(0, 1 << 16, S, &d));
  unsigned char buf[1 << 16];
  for (int dt = 0; dt < TPURT_NUM_DTYPES; dt++) {
    size_t es = tpurt_dtype_size((tpurt_dtype)dt);
    int64_t n[1] = {1000}, one[1] = {1};
    tpurt_view v = check_view_st(d, (tpurt_dtype)dt, 1, n, one);
    tpurt_scalar sc = {TPURT_SCALAR_FLOAT, 0, 3.0, 0};
    CHECK_OK(tpurt_fill(S, &v, sc));
    CHECK_OK(tpurt_memcpy_d2h(S, buf, d, 1000 * es, 0));
    int ok = 1;
    for (int i = 0; i < 1000; i++) {
      tpurt_scalar x = tpurt_scalar_load((tpurt_dtype)dt, buf + i * es);
      double val = x.kind == TPURT_SCALAR_FLOAT || x.kind == TPURT_SCALAR_COMPLEX ? x.re : (double)x.i;
      ok &= val == (dt == TPURT_BOOL ? 1.0 : 3.0);
    }
    if (!ok) fprintf(stderr, "fill failed for %s\n", tpurt_dtype_name((tpurt_dtype)dt));
    CHECK(ok);
  }
  /* complex fill keeps the imaginary part; zero fill uses memset */
  int64_t n4[1] = {4}, one[1] = {1};
  tpurt_view v = check_view_st(d, TPURT_C64, 1, n4, one);
  tpurt_scalar cz = {TPURT_SCALAR_COMPLEX, 0, 1.5, -2.0};
  CHECK_OK(tpurt_fill(S, &v, cz));
  float cf[8];
  CHECK_OK(tpurt_memcpy_d2h(S, cf, d, sizeof cf, 0));
  CHECK(cf[0] == 1.5f && cf[1] == -2.0f && cf[6] == 1.5f && cf[7] == -2.0f);
  /* strided fill: every other element of a 2D block */
  int32_t base[64];
  for (int i = 0; i < 64; i++) base[i] = -1;
  CHECK_OK(tpurt_memcpy_h2d(S, d, base, sizeof base, 0));
  int64_t sz[2] = {4, 8}, st[2] = {16, 2};
  v = check_view_st(d, TPURT_I32, 2, sz, st);
  tpurt_scalar iv = {TPURT_SCALAR_INT, 42, 0, 0};
  CHECK_OK(tpurt_fill(S, &v, iv));
  CHECK_OK(tpurt_memcpy_d2h(S, base, d, sizeof base, 0));
  int ok = 1;
  for (int i = 0; i < 64; i++) ok &= base[i] == ((i % 2 == 0) ? 42 : -1);
  CHECK(ok);
  /* large contiguous fill (parallel path) */
  tpurt_devptr big;
  int64_t nb[1] = {3 << 20};
  CHECK_OK(tpurt_malloc(0, (size_t)nb[0] * 4, S, &big));
  v = check_view_st(big, TPURT_F32, 1, nb, one);
  tpurt_scalar fv = {TPURT_SCALAR_FLOAT, 0, -0.25, 0};
  CHECK_OK(tpurt_fill(S, &v, fv));
  float *fb = malloc((size_t)nb[0] * 4);
  CHECK_OK(tpurt_memcpy_d2h(S, fb, big, (size_t)nb[0] * 4, 0));
  ok = 1;
  for (int64_t i = 0; i < nb[0]; i++) ok &= fb[i] == -0.25f;
  CHECK(ok);
  free(fb);
  CHECK_OK(tpurt_free(big));
  CHECK_OK(tpurt_free(d));
}

int main(void) {
  CHECK_OK(tpurt_stream_default(0, &S));
  test_memcpy();
  test_memcpy_sizes();
  test_strided();
  test_large();
  test_row_runs();
  test_fill();
  CHECK_OK(tpurt_device_synchronize(0));
  TEST_MAIN_END();
}
