/*
 * view.c — launch-side checks of tpurt_views shared by every kernel module:
 * element count, byte extent, shape/dtype sanity and "lies in the chip's
 * memory". Kernels call these on the host before queueing work.
 */
#include <inttypes.h>

#include "internal.h"

int64_t tpurt__view_numel(const tpurt_view *v) {
  for (int k = 0; k < v->ndim; k++)
    if (v->sizes[k] == 0) return 0;
  int64_t n = 1;
  for (int k = 0; k < v->ndim; k++)
    if (__builtin_mul_overflow(n, v->sizes[k], &n)) return INT64_MAX; /* refused by tpurt__check_view */
  return n;
}

void tpurt__view_extent(const tpurt_view *v, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)tpurt_dtype_size(v->dtype), l = 0, h = 0;
  for (int k = 0; k < v->ndim; k++) {
    int64_t span = (v->sizes[k] - 1) * v->strides[k] * es;
    if (span < 0)
      l += span;
    else
      h += span;
  }
  *lo = l;
  *hi = h + es;
}

tpurt_status tpurt__check_view(const tpurt_view *v, const char *what) {
  if (!v) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: view is NULL", what);
  if ((unsigned)v->dtype >= TPURT_NUM_DTYPES)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", what, (int)v->dtype);
  if (v->ndim < 0 || v->ndim > TPURT_MAX_DIMS)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid number of dimensions %d", what, v->ndim);
  for (int k = 0; k < v->ndim; k++)
    if (v->sizes[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative size %" PRId64 " in dimension %d", what,
                        v->sizes[k], k);
  if (tpurt__view_numel(v) == 0) return TPURT_OK;
  /* element count and byte extent must be int64 (what every kernel indexes with) */
  int64_t n = 1, lo = 0, hi = 0, es = (int64_t)tpurt_dtype_size(v->dtype);
  for (int k = 0; k < v->ndim; k++) {
    int64_t span;
    if (__builtin_mul_overflow(n, v->sizes[k], &n) || __builtin_mul_overflow(v->sizes[k] - 1, v->strides[k], &span) ||
        __builtin_mul_overflow(span, es, &span) || __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: a view of sizes and strides whose element count or byte "
                        "extent overflows 64 bits (dimension %d: size %" PRId64 ", stride %" PRId64 ")", what, k,
                        v->sizes[k], v->strides[k]);
  }
  return TPURT_OK;
}

tpurt_status tpurt__check_view_range(int dev, const tpurt_view *v, const char *what) {
  tpurt_status st = tpurt__check_view(v, what);
  if (st != TPURT_OK) return st;
  if (tpurt__view_numel(v) == 0) return TPURT_OK;
  /* kernels access elements as their C type: a view must start on an element boundary (every
   * tensor does: allocations are aligned, offsets are whole elements) */
  size_t es = tpurt_dtype_size(v->dtype);
  if (es > 1 && v->ptr % es)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: device address 0x%" PRIx64 " is not aligned to the %zu bytes of a %s",
                      what, (uint64_t)v->ptr, es, tpurt_dtype_name(v->dtype));
  int64_t lo, hi;
  tpurt__view_extent(v, &lo, &hi);
  return tpurt__check_dev_range(dev, v->ptr, lo, hi, what);
}
