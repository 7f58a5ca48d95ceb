/* ew_progs.h — helpers of the graph-engine C tests (test_defer.c,
 * test_replay.c): 1-D f32 views and one-op elementwise programs. */
#ifndef TPURT_TEST_EW_PROGS_H
#define TPURT_TEST_EW_PROGS_H

#include <string.h>

#include "tpurt.h"

static inline tpurt_view view1(tpurt_devptr p, int64_t n, int64_t st) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p;
  v.dtype = TPURT_F32;
  v.ndim = 1;
  v.sizes[0] = n;
  v.strides[0] = st;
  return v;
}

/* out = op(LOAD 0, LOAD 1) or op(LOAD 0, SCALAR 0) */
static inline tpurt_ew_program bin(tpurt_ew_op op, int with_scalar) {
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_F32;
  pr.inst[0].op = TPURT_EW_LOAD;
  pr.inst[0].dst = 0;
  pr.inst[0].p[0] = 0;
  pr.inst[1].op = with_scalar ? TPURT_EW_SCALAR : TPURT_EW_LOAD;
  pr.inst[1].dst = 1;
  pr.inst[1].p[0] = with_scalar ? 0 : 1;
  pr.inst[2].op = (uint16_t)op;
  pr.inst[2].dst = 2;
  pr.inst[2].src[0] = 0;
  pr.inst[2].src[1] = 1;
  pr.inst[2].p[0] = 1.0; /* alpha of add/sub */
  pr.ninst = 3;
  pr.nout = 1;
  pr.out_reg[0] = 2;
  return pr;
}

static inline tpurt_ew_program un(tpurt_ew_op op) {
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = TPURT_F32;
  pr.inst[0].op = TPURT_EW_LOAD;
  pr.inst[1].op = (uint16_t)op;
  pr.inst[1].dst = 1;
  pr.ninst = 2;
  pr.nout = 1;
  pr.out_reg[0] = 1;
  return pr;
}

#endif
