/*
 * dtype_conv.h — the generic value conversions of dtype.c (float -> integer
 * rules, load any dtype into a tpurt__val, store a tpurt__val as any
 * dtype; the rules are in dtype.c's header comment). Definitions, not
 * declarations: included once by dtype.c, and embedded in the source of
 * generated kernels (graph/codegen.c) so that their casts are this code.
 */
#ifndef TPURT_DTYPE_CONV_H
#define TPURT_DTYPE_CONV_H

#include <stdbool.h>
#include <string.h>

#include "internal.h"

int64_t tpurt__f2i64(double d) {
  if (d >= -9223372036854775808.0 && d < 9223372036854775808.0) return (int64_t)d;
  return INT64_MIN;
}

int32_t tpurt__f2i32(double d) {
  if (d >= -2147483648.0 && d < 2147483648.0) return (int32_t)d;
  return INT32_MIN;
}

uint32_t tpurt__f2u32(double d) {
  if (d >= 2147483648.0) return (uint32_t)tpurt__f2i32(d - 2147483648.0) ^ 0x80000000u;
  return (uint32_t)tpurt__f2i32(d);
}

uint64_t tpurt__f2u64(double d) {
  if (d != d) return 0;
  if (d >= 9223372036854775808.0 && d < 18446744073709551616.0) return (uint64_t)d;
  return (uint64_t)tpurt__f2i64(d);
}

#define LD(T, var)   \
  T var;             \
  memcpy(&var, p, sizeof var)

tpurt__val tpurt__load(tpurt_dtype dt, const void *p) {
  tpurt__val v = {0, 0, 0, 0.0, 0.0};
  switch (dt) {
    case TPURT_BOOL: { LD(uint8_t, x); v.i = x != 0; break; }
    case TPURT_U8: { LD(uint8_t, x); v.i = x; break; }
    case TPURT_I8: { LD(int8_t, x); v.i = x; break; }
    case TPURT_I16: { LD(int16_t, x); v.i = x; break; }
    case TPURT_I32: { LD(int32_t, x); v.i = x; break; }
    case TPURT_I64: { LD(int64_t, x); v.i = x; break; }
    case TPURT_U16: { LD(uint16_t, x); v.i = x; break; }
    case TPURT_U32: { LD(uint32_t, x); v.i = x; break; }
    case TPURT_U64: { LD(uint64_t, x); v.cls = 1; v.u = x; break; }
    case TPURT_F16: { LD(uint16_t, x); v.cls = 2; v.re = tpurt__f16_to_f32(x); break; }
    case TPURT_BF16: { LD(uint16_t, x); v.cls = 2; v.re = tpurt__bf16_to_f32(x); break; }
    case TPURT_F32: { LD(float, x); v.cls = 2; v.re = x; break; }
    case TPURT_F64: { LD(double, x); v.cls = 2; v.re = x; break; }
    case TPURT_C64: { float x[2]; memcpy(x, p, 8); v.cls = 2; v.re = x[0]; v.im = x[1]; break; }
    case TPURT_C128: { double x[2]; memcpy(x, p, 16); v.cls = 2; v.re = x[0]; v.im = x[1]; break; }
    default: break;
  }
  if (v.cls == 0) v.u = (uint64_t)v.i;
  return v;
}

/* value -> int64 bits (wrapping), for integer targets */
static inline uint64_t val_bits(tpurt__val v, int unsigned_target) {
  if (v.cls == 0) return (uint64_t)v.i;
  if (v.cls == 1) return v.u;
  return unsigned_target ? tpurt__f2u64(v.re) : (uint64_t)tpurt__f2i64(v.re);
}
/* value -> int32 bits, for the 8- to 32-bit targets but uint8 */
static inline uint32_t val_bits32(tpurt__val v) {
  return v.cls == 2 ? (uint32_t)tpurt__f2i32(v.re) : (uint32_t)val_bits(v, 0);
}
static inline float val_f32(tpurt__val v) {
  if (v.cls == 0) return (float)v.i;
  if (v.cls == 1) return (float)v.u;
  return (float)v.re;
}
static inline double val_f64(tpurt__val v) {
  if (v.cls == 0) return (double)v.i;
  if (v.cls == 1) return (double)v.u;
  return v.re;
}

#define ST(T, expr)      \
  do {                   \
    T _x = (T)(expr);    \
    memcpy(p, &_x, sizeof _x); \
  } while (0)

void tpurt__store(tpurt_dtype dt, void *p, tpurt__val v) {
  switch (dt) {
    case TPURT_BOOL: {
      bool b = v.cls == 0 ? v.i != 0 : v.cls == 1 ? v.u != 0 : (v.re != 0.0 || v.im != 0.0);
      ST(uint8_t, b ? 1 : 0);
      break;
    }
    case TPURT_U8: ST(uint8_t, val_bits(v, 0)); break;
    case TPURT_I8: ST(int8_t, (int8_t)(uint8_t)val_bits32(v)); break;
    case TPURT_I16: ST(int16_t, (int16_t)(uint16_t)val_bits32(v)); break;
    case TPURT_I32: ST(int32_t, (int32_t)val_bits32(v)); break;
    case TPURT_I64: ST(int64_t, (int64_t)val_bits(v, 0)); break;
    case TPURT_U16: ST(uint16_t, val_bits32(v)); break;
    case TPURT_U32: ST(uint32_t, v.cls == 2 ? tpurt__f2u32(v.re) : (uint32_t)val_bits(v, 0)); break;
    case TPURT_U64: ST(uint64_t, val_bits(v, 1)); break;
    case TPURT_F16: ST(uint16_t, tpurt__f32_to_f16(val_f32(v))); break;
    case TPURT_BF16: ST(uint16_t, tpurt__f32_to_bf16(val_f32(v))); break;
    case TPURT_F32: ST(float, val_f32(v)); break;
    case TPURT_F64: ST(double, val_f64(v)); break;
    case TPURT_C64: {
      float x[2] = {val_f32(v), v.cls == 2 ? (float)v.im : 0.0f};
      memcpy(p, x, 8);
      break;
    }
    case TPURT_C128: {
      double x[2] = {val_f64(v), v.cls == 2 ? v.im : 0.0};
      memcpy(p, x, 16);
      break;
    }
    default: break;
  }
}

#endif
