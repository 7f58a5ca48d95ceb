/* test_dtype.c — dtype sizes and names, scalar loads. */
#include "check.h"

int main(void) {
  size_t sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16, 2, 4, 8};
  const char *names[] = {"bool",    "uint8",   "int8",      "int16",      "int32",  "int64",  "float16", "bfloat16",
                         "float32", "float64", "complex64", "complex128", "uint16", "uint32", "uint64"};
  for (int i = 0; i < TPURT_NUM_DTYPES; i++) {
    CHECK_EQ(tpurt_dtype_size((tpurt_dtype)i), sizes[i]);
    CHECK_STR(tpurt_dtype_name((tpurt_dtype)i), names[i]);
  }
  CHECK_EQ(tpurt_dtype_size(TPURT_NUM_DTYPES), 0);
  CHECK_STR(tpurt_dtype_name((tpurt_dtype)-1), "invalid");

  unsigned char b = 1;
  tpurt_scalar s = tpurt_scalar_load(TPURT_BOOL, &b);
  CHECK(s.kind == TPURT_SCALAR_BOOL && s.i == 1);
  int8_t i8 = -5;
  s = tpurt_scalar_load(TPURT_I8, &i8);
  CHECK(s.kind == TPURT_SCALAR_INT && s.i == -5);
  uint16_t u16 = 65535;
  s = tpurt_scalar_load(TPURT_U16, &u16);
  CHECK(s.kind == TPURT_SCALAR_INT && s.i == 65535);
  int64_t i64 = INT64_MIN;
  s = tpurt_scalar_load(TPURT_I64, &i64);
  CHECK(s.kind == TPURT_SCALAR_INT && s.i == INT64_MIN);
  uint16_t h = 0x3e00; /* 1.5 */
  s = tpurt_scalar_load(TPURT_F16, &h);
  CHECK(s.kind == TPURT_SCALAR_FLOAT && s.re == 1.5);
  uint16_t bf = 0xc0a0; /* -5 */
  s = tpurt_scalar_load(TPURT_BF16, &bf);
  CHECK(s.kind == TPURT_SCALAR_FLOAT && s.re == -5.0);
  double d = 0.1;
  s = tpurt_scalar_load(TPURT_F64, &d);
  CHECK(s.kind == TPURT_SCALAR_FLOAT && s.re == 0.1);
  float c[2] = {1.0f, -2.0f};
  s = tpurt_scalar_load(TPURT_C64, c);
  CHECK(s.kind == TPURT_SCALAR_COMPLEX && s.re == 1.0 && s.im == -2.0);
  double cd[2] = {3.0, 4.0};
  s = tpurt_scalar_load(TPURT_C128, cd);
  CHECK(s.kind == TPURT_SCALAR_COMPLEX && s.re == 3.0 && s.im == 4.0);
  TEST_MAIN_END();
}
