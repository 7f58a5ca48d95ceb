/* check.h — minimal assertion macros and device helpers for the runtime's C
 * tests. */
#ifndef TPURT_TEST_CHECK_H
#define TPURT_TEST_CHECK_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpurt.h"

static int g_failures;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
      g_failures++;                                                                   \
    }                                                                                 \
  } while (0)

#define CHECK_EQ(a, b)                                                                \
  do {                                                                                \
    long long _a = (long long)(a), _b = (long long)(b);                               \
    if (_a != _b) {                                                                   \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__,   \
              __LINE__, #a, _a, #b, _b);                                              \
      g_failures++;                                                                   \
    }                                                                                 \
  } while (0)

#define CHECK_ST(expr, want)                                                          \
  do {                                                                                \
    tpurt_status _s = (expr);                                                         \
    if (_s != (want)) {                                                               \
      fprintf(stderr, "%s:%d: %s returned %s (want %s): %s\n", __FILE__, __LINE__,    \
              #expr, tpurt_status_name(_s), tpurt_status_name(want), tpurt_last_error()); \
      g_failures++;                                                                   \
    }                                                                                 \
  } while (0)
#define CHECK_OK(expr) CHECK_ST(expr, TPURT_OK)

#define CHECK_STR(a, b)                                                               \
  do {                                                                                \
    const char *_a = (a), *_b = (b);                                                  \
    if (strcmp(_a, _b) != 0) {                                                        \
      fprintf(stderr, "%s:%d: CHECK_STR failed:\n  got  \"%s\"\n  want \"%s\"\n",      \
              __FILE__, __LINE__, _a, _b);                                            \
      g_failures++;                                                                   \
    }                                                                                 \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
  do {                                                                                \
    double _a = (a), _b = (b);                                                        \
    if (!(fabs(_a - _b) <= (tol))) {                                                  \
      fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %g, %s = %g\n", __FILE__,        \
              __LINE__, #a, _a, #b, _b);                                              \
      g_failures++;                                                                   \
    }                                                                                 \
  } while (0)

#define TEST_MAIN_END()                                                               \
  do {                                                                                \
    if (g_failures) {                                                                 \
      fprintf(stderr, "%d check(s) failed\n", g_failures);                            \
      return 1;                                                                       \
    }                                                                                 \
    printf("ok\n");                                                                   \
    return 0;                                                                         \
  } while (0)

/* Device memory and views for kernel tests; s may be NULL (the default
 * stream). check_up copies n bytes of h (none when h is NULL) into a new
 * buffer of at least one byte. */
static inline tpurt_devptr check_up(tpurt_stream *s, const void *h, size_t n) {
  tpurt_devptr d = 0;
  CHECK_OK(tpurt_malloc(0, n ? n : 1, s, &d));
  if (n && h) CHECK_OK(tpurt_memcpy_h2d(s, d, h, n, 0));
  return d;
}
static inline void check_down(tpurt_stream *s, void *h, tpurt_devptr d, size_t n) {
  CHECK_OK(tpurt_memcpy_d2h(s, h, d, n, 0));
}
/* a view with sizes sz and element strides st */
static inline tpurt_view check_view_st(tpurt_devptr p, tpurt_dtype dt, int nd, const int64_t *sz,
                                       const int64_t *st) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p;
  v.dtype = dt;
  v.ndim = nd;
  for (int k = 0; k < nd; k++) {
    v.sizes[k] = sz[k];
    v.strides[k] = st[k];
  }
  return v;
}
/* a contiguous view with sizes sz */
static inline tpurt_view check_view(tpurt_devptr p, tpurt_dtype dt, int nd, const int64_t *sz) {
  tpurt_view v = check_view_st(p, dt, nd, sz, sz);
  int64_t st = 1;
  for (int k = nd - 1; k >= 0; k--) {
    v.strides[k] = st;
    st *= sz[k];
  }
  return v;
}

/* f32 -> bf16 rounded to nearest even (a NaN stays a quiet NaN), and back */
static inline uint16_t check_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static inline float check_from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
