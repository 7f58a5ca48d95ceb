/*
 * view.c — launch-side checks of tpurt_views shared by every kernel module:
 * element count, byte extent, shape/dtype sanity and "lies in the chip's
 * memory". Kernels call these on the host before queueing work.
 */
#include <inttypes.h>

#include "internal.h"

int64_t tpurt__view_numel(const tpurt_view *v) {
  int64_t n = 1;
  for (int k = 0; k < v->ndim; k++) n *= v->sizes[k];
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
  return TPURT_OK;
}

tpurt_status tpurt__check_view_range(int dev, const tpurt_view *v, const char *what) {
  if (tpurt__view_numel(v) == 0) return TPURT_OK;
  int64_t lo, hi;
  tpurt__view_extent(v, &lo, &hi);
  return tpurt__check_dev_range(dev, v->ptr, lo, hi, what);
}
