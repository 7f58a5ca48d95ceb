/*
 * kselect.h — selection of the k-th element of an array under a strict
 * total order (callers break ties by the elements' original positions, so
 * the result is the element a full sort would place at k): quickselect
 * with a median-of-three pivot, insertion sort for short ranges, and a
 * heap sort of the range left once the partitions have taken more than
 * 2 log2(n) + 4 rounds (no quadratic worst case). O(n) expected, against
 * the O(n log n) of sorting a whole line for topk / kthvalue / median.
 *
 * DEF_KSELECT(NAME, T, BEFORE) defines
 *   static void NAME(T *a, int64_t n, int64_t k)
 * which permutes a so that a[k] is the element of rank k, everything
 * before it ranks below and everything after it above, and
 *   static void NAME##_first(T *a, int64_t n, int64_t k)
 * which leaves the k first elements sorted in a[0, k) (a bounded heap:
 * for small k, O(n + k log k log n)), and NAME##_heapsort(a, lo, hi).
 */
#ifndef TPURT_KSELECT_H
#define TPURT_KSELECT_H
#include <stdint.h>

/* When NAME##_first (the bounded heap) takes the k first of n instead of
 * NAME (quickselect): for k up to 1024 and a quarter of n. A quickselect's
 * partition branches mispredict on every other element, the heap's test
 * against its top is predictable (Zen 5, 2 threads: topk 10 of each of
 * 1024 rows of 1024 29.8 ms sorted, ~5 ms selected, 2.4 ms with the heap;
 * topk 100 of 1M 127 / ~15 / 2.7 ms) */
#define KSELECT_BY_HEAP(k, n) ((k) > 0 && (k) <= 1024 && (k) <= (n) / 4)

/* DEF_ISORT(NAME, T, BEFORE): static void NAME(T *a, int64_t lo, int64_t hi)
 * insertion-sorts a[lo, hi) (stable) */
#define DEF_ISORT(NAME, T, BEFORE)                                                    \
  __attribute__((unused)) static void NAME(T *a, int64_t lo, int64_t hi) {            \
    for (int64_t i = lo + 1; i < hi; i++) {                                           \
      T v = a[i];                                                                     \
      int64_t j = i;                                                                  \
      while (j > lo && BEFORE(v, a[j - 1])) {                                         \
        a[j] = a[j - 1];                                                              \
        j--;                                                                          \
      }                                                                               \
      a[j] = v;                                                                       \
    }                                                                                 \
  }

#define DEF_KSELECT(NAME, T, BEFORE)                                                  \
  DEF_ISORT(NAME##_isort, T, BEFORE)                                                  \
  __attribute__((unused)) static void NAME##_sift(T *a, int64_t lo, int64_t root, int64_t end) { \
    for (;;) {                                                                        \
      int64_t c = 2 * (root - lo) + 1 + lo;                                           \
      if (c > end) return;                                                            \
      if (c + 1 <= end && BEFORE(a[c], a[c + 1])) c++;                                \
      if (!BEFORE(a[root], a[c])) return;                                             \
      T t = a[root];                                                                  \
      a[root] = a[c];                                                                 \
      a[c] = t;                                                                       \
      root = c;                                                                       \
    }                                                                                 \
  }                                                                                   \
  __attribute__((unused)) static void NAME##_heapsort(T *a, int64_t lo, int64_t hi) { \
    for (int64_t r = lo + (hi - lo - 1) / 2; r >= lo; r--) NAME##_sift(a, lo, r, hi); \
    for (int64_t end = hi; end > lo; end--) {                                         \
      T t = a[lo];                                                                    \
      a[lo] = a[end];                                                                 \
      a[end] = t;                                                                     \
      NAME##_sift(a, lo, lo, end - 1);                                                \
    }                                                                                 \
  }                                                                                   \
  /* the k (>= 1) first of a[0, n) sorted into a[0, k): a heap of the k best so       \
   * far whose top is the worst of them, which a later element replaces when it       \
   * ranks before it (rarely, on a long array: a predictable branch, unlike a         \
   * partition's) */                                                                  \
  __attribute__((unused)) static void NAME##_first(T *a, int64_t n, int64_t k) {      \
    for (int64_t r = (k - 2) / 2; r >= 0; r--) NAME##_sift(a, 0, r, k - 1);           \
    for (int64_t j = k; j < n; j++)                                                   \
      if (BEFORE(a[j], a[0])) {                                                       \
        a[0] = a[j];                                                                  \
        NAME##_sift(a, 0, 0, k - 1);                                                  \
      }                                                                               \
    NAME##_heapsort(a, 0, k - 1);                                                     \
  }                                                                                   \
  __attribute__((unused)) static void NAME(T *a, int64_t n, int64_t k) {              \
    int64_t lo = 0, hi = n - 1, depth = 4;                                            \
    for (int64_t m = n; m > 1; m /= 2) depth += 2;                                    \
    while (hi > lo) {                                                                 \
      if (hi - lo < 16 || depth-- == 0) {                                             \
        if (hi - lo < 16)                                                             \
          NAME##_isort(a, lo, hi + 1);                                                \
        else                                                                          \
          NAME##_heapsort(a, lo, hi);                                                 \
        return;                                                                       \
      }                                                                               \
      int64_t mid = lo + (hi - lo) / 2;                                               \
      /* median of three into a[mid] */                                               \
      if (BEFORE(a[mid], a[lo])) { T t = a[mid]; a[mid] = a[lo]; a[lo] = t; }         \
      if (BEFORE(a[hi], a[mid])) {                                                    \
        T t = a[mid]; a[mid] = a[hi]; a[hi] = t;                                      \
        if (BEFORE(a[mid], a[lo])) { T u = a[mid]; a[mid] = a[lo]; a[lo] = u; }       \
      }                                                                               \
      T p = a[mid];                                                                   \
      int64_t i = lo, j = hi;                                                         \
      while (i <= j) {                                                                \
        while (BEFORE(a[i], p)) i++;                                                  \
        while (BEFORE(p, a[j])) j--;                                                  \
        if (i <= j) {                                                                 \
          T t = a[i];                                                                 \
          a[i] = a[j];                                                                \
          a[j] = t;                                                                   \
          i++;                                                                        \
          j--;                                                                        \
        }                                                                             \
      }                                                                               \
      if (k <= j)                                                                     \
        hi = j;                                                                       \
      else if (k >= i)                                                                \
        lo = i;                                                                       \
      else                                                                            \
        return;                                                                       \
    }                                                                                 \
  }

#endif
