/*
 * dtype.c — dtype sizes and names, scalar loads, and the generic value
 * conversion (load any dtype into an intermediate, store into any dtype)
 * that implements PyTorch's casting rules for every pair of dtypes.
 *
 * Float -> integer conversion is defined for every input (no C UB), as
 * PyTorch's CPU backend converts on x86 (its casts compile to cvttsd2si):
 *   - the value is truncated toward zero;
 *   - int64 and uint8 targets: NaN and values outside [-2^63, 2^63) give
 *     INT64_MIN (a NaN cast to an index is out of range, not index 0), and
 *     uint8 takes the low bits; uint64 targets accept [2^63, 2^64) too and
 *     take NaN to 0;
 *   - int8, int16, int32 and uint16 targets: NaN and values outside
 *     [-2^31, 2^31) give INT32_MIN, and the 8- and 16-bit targets take its
 *     low bits (so 1e10 -> int16 is 0, not 1e10's low 16 bits);
 *   - uint32: [2^31, 2^32) as unsigned values, anything else as int32 above
 *     (NaN -> 2^31, inf -> 0); from float16, the copy kernel goes through
 *     int64 as the CPU backend does there (copy.c).
 * Integer -> half/bfloat16 goes through float (as c10::Half/BFloat16 do);
 * double -> half/bfloat16 also goes through float.
 */
#include <math.h>
#include <stdbool.h>

#include "internal.h"

static const size_t k_sizes[TPURT_NUM_DTYPES] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16, 2, 4, 8};
static const char *const k_names[TPURT_NUM_DTYPES] = {
    "bool",    "uint8",   "int8",      "int16",      "int32",  "int64",  "float16", "bfloat16",
    "float32", "float64", "complex64", "complex128", "uint16", "uint32", "uint64"};

size_t tpurt_dtype_size(tpurt_dtype dt) {
  if ((unsigned)dt >= TPURT_NUM_DTYPES) return 0;
  return k_sizes[dt];
}

const char *tpurt_dtype_name(tpurt_dtype dt) {
  if ((unsigned)dt >= TPURT_NUM_DTYPES) return "invalid";
  return k_names[dt];
}

#include "dtype_conv.h"

tpurt__val tpurt__scalar_val(tpurt_scalar s) {
  tpurt__val v = {0, 0, 0, 0.0, 0.0};
  switch (s.kind) {
    case TPURT_SCALAR_BOOL: v.i = s.i != 0; v.u = (uint64_t)v.i; break;
    case TPURT_SCALAR_INT: v.i = s.i; v.u = (uint64_t)s.i; break;
    case TPURT_SCALAR_FLOAT: v.cls = 2; v.re = s.re; break;
    case TPURT_SCALAR_COMPLEX: v.cls = 2; v.re = s.re; v.im = s.im; break;
  }
  return v;
}

/* uint64 values above INT64_MAX come back as INT wrapped to int64 (the
 * glue reinterprets them for uint64 tensors). */
tpurt_scalar tpurt_scalar_load(tpurt_dtype dt, const void *p) {
  tpurt_scalar s;
  memset(&s, 0, sizeof s);
  if ((unsigned)dt >= TPURT_NUM_DTYPES || !p) return s;
  tpurt__val v = tpurt__load(dt, p);
  if (dt == TPURT_BOOL) {
    s.kind = TPURT_SCALAR_BOOL;
    s.i = v.i;
  } else if (v.cls == 0 || v.cls == 1) {
    s.kind = TPURT_SCALAR_INT;
    s.i = v.cls == 0 ? v.i : (int64_t)v.u;
  } else if (dt == TPURT_C64 || dt == TPURT_C128) {
    s.kind = TPURT_SCALAR_COMPLEX;
    s.re = v.re;
    s.im = v.im;
  } else {
    s.kind = TPURT_SCALAR_FLOAT;
    s.re = v.re;
  }
  return s;
}
