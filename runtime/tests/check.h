/* check.h — minimal assertion macros for the runtime's C tests. */
#ifndef TPURT_TEST_CHECK_H
#define TPURT_TEST_CHECK_H
#include <math.h>
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

#endif
