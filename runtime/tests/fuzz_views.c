/* fuzz_views.c — coverage-guided fuzzing of the runtime's launch validation
 * and of the deferred-graph planner.
 *
 * The input is read as a program: a mode byte (strict, blocking or
 * DeferAndFuse) then commands, each an entry point (strided copy, fill,
 * elementwise program, reduction, scan, softmax, index_select, gather, GEMM,
 * a flush or a synchronization) with views built from the bytes — dtype,
 * rank, sizes and strides, byte offset into one of two device buffers; mostly
 * small and valid, sometimes anything (negative or huge sizes and strides,
 * addresses outside the buffers, invalid dtypes and ranks). Every call must
 * return a status (accepted views lie in the device's memory; the rest are
 * refused with a message), and the device must synchronize afterwards; the
 * sanitizers (ASan, UBSan, LeakSanitizer) catch what a status cannot show.
 * In DeferAndFuse the accepted launches are recorded and then planned,
 * fused and run at the flush: random op sequences for the planner. */
#include <stdint.h>
#include <string.h>

#include "fuzz_main.h"
#include "tpurt.h"

#define BUF_BYTES 8192

static tpurt_devptr g_buf[2];

static int64_t pick_size(rd *r) {
  uint8_t m = u8(r);
  if (m < 200) return m % 6;            /* small */
  if (m < 230) return 1 + m % 40;       /* medium */
  return (int64_t)u64(r);               /* anything */
}
static int64_t pick_stride(rd *r) {
  uint8_t m = u8(r);
  if (m < 180) return m % 9;
  if (m < 215) return -(int64_t)(m % 5);
  return (int64_t)u64(r);
}

/* a view: contiguous (mode 0), arbitrary small strides, or raw */
static void mkview(rd *r, tpurt_view *v, tpurt_dtype force) {
  memset(v, 0, sizeof *v);
  uint8_t m = u8(r);
  v->dtype = force != TPURT_NUM_DTYPES ? force : (m & 1) ? (tpurt_dtype)(u8(r) % (TPURT_NUM_DTYPES + 1)) : TPURT_F32;
  uint8_t nd = u8(r);
  v->ndim = nd < 250 ? nd % 5 : (int)(int8_t)u8(r);
  int nds = v->ndim < 0 ? 0 : v->ndim > TPURT_MAX_DIMS ? TPURT_MAX_DIMS : v->ndim;
  for (int k = 0; k < nds; k++) v->sizes[k] = pick_size(r);
  if (!(m & 2)) { /* contiguous */
    int64_t s = 1;
    for (int k = nds - 1; k >= 0; k--) {
      v->strides[k] = s;
      s *= v->sizes[k] > 0 && v->sizes[k] < 64 ? v->sizes[k] : 1;
    }
  } else {
    for (int k = 0; k < nds; k++) v->strides[k] = pick_stride(r);
  }
  uint8_t o = u8(r);
  v->ptr = g_buf[o & 1];
  if (o < 200) v->ptr += (o >> 1) * 8;
  else if (o < 250) v->ptr += u8(r) * 64ull;
  else v->ptr += u64(r);   /* anywhere */
}

/* valid views of a huge element count (stride 0 makes them fit any buffer) are legitimate
 * work, only slow: calls on them are skipped (they would only time out) */
static int too_big(const tpurt_view *v) {
  if (v->ndim < 0 || v->ndim > TPURT_MAX_DIMS) return 0;
  double n = 1;
  for (int k = 0; k < v->ndim; k++) n *= v->sizes[k] > 0 ? (double)v->sizes[k] : 0;
  return n > (double)(1 << 20);
}

static tpurt_ew_program mkprog(rd *r, int nin) {
  static const uint16_t ops[] = {TPURT_EW_ADD, TPURT_EW_MUL, TPURT_EW_NEG, TPURT_EW_EXP, TPURT_EW_MAXIMUM,
                                 TPURT_EW_WHERE, TPURT_EW_ABS, TPURT_EW_DIV};
  tpurt_ew_program p;
  memset(&p, 0, sizeof p);
  p.compute = (u8(r) & 3) == 0 ? TPURT_I64 : TPURT_F32;
  int regs = 0;
  for (int i = 0; i < nin && regs < TPURT_EW_MAX_REGS; i++) {
    p.inst[p.ninst].op = TPURT_EW_LOAD;
    p.inst[p.ninst].dst = (uint8_t)regs;
    p.inst[p.ninst].p[0] = i;
    p.ninst++;
    regs++;
  }
  int n = 1 + u8(r) % 6;
  for (int i = 0; i < n && p.ninst < TPURT_EW_MAX_INST - 1; i++) {
    tpurt_ew_inst *in = &p.inst[p.ninst++];
    uint8_t b = u8(r);
    in->op = b < 250 ? ops[b % (sizeof ops / sizeof ops[0])] : u8(r); /* sometimes an invalid op */
    in->dst = (uint8_t)(regs < TPURT_EW_MAX_REGS ? regs : TPURT_EW_MAX_REGS - 1);
    for (int s = 0; s < 3; s++) in->src[s] = regs ? (uint8_t)(u8(r) % (regs + (b > 252))) : 0;
    if (regs < TPURT_EW_MAX_REGS) regs++;
  }
  p.nout = 1;
  p.out_reg[0] = (uint8_t)(regs ? regs - 1 : 0);
  return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    if (tpurt_init() != TPURT_OK) return 0;
    if (tpurt_malloc(0, BUF_BYTES, NULL, &g_buf[0]) || tpurt_malloc(0, BUF_BYTES, NULL, &g_buf[1])) return 0;
    ready = 1;
  }
  rd r = {data, size};
  uint8_t mode = u8(&r) % 3;
  tpurt_set_exec_mode(mode == 0 ? TPURT_MODE_STRICT : mode == 1 ? TPURT_MODE_BLOCKING : TPURT_MODE_DEFER);
  for (int cmd = 0; cmd < 24 && r.n; cmd++) {
    tpurt_view a, b, c;
    uint8_t what = u8(&r) % 11;
    switch (what) {
      case 0:
        mkview(&r, &a, TPURT_NUM_DTYPES);
        mkview(&r, &b, TPURT_NUM_DTYPES);
        if (u8(&r) & 1) { /* same shape, the common case */
          b.ndim = a.ndim;
          memcpy(b.sizes, a.sizes, sizeof a.sizes);
        }
        if (!too_big(&a) && !too_big(&b)) tpurt_copy_strided(NULL, &a, &b);
        break;
      case 1: {
        mkview(&r, &a, TPURT_NUM_DTYPES);
        tpurt_scalar s = {TPURT_SCALAR_FLOAT, 0, (double)(int8_t)u8(&r) / 4, 0};
        if (!too_big(&a)) tpurt_fill(NULL, &a, s);
        break;
      }
      case 2: {
        tpurt_view ins[3];
        int nin = 1 + u8(&r) % 3;
        mkview(&r, &a, TPURT_NUM_DTYPES);
        for (int i = 0; i < nin; i++) {
          mkview(&r, &ins[i], TPURT_NUM_DTYPES);
          if (u8(&r) & 1) {
            ins[i].ndim = a.ndim;
            memcpy(ins[i].sizes, a.sizes, sizeof a.sizes);
          }
        }
        tpurt_ew_program p = mkprog(&r, nin);
        double sc[2] = {1.5, -2.0};
        int big = too_big(&a);
        for (int i = 0; i < nin; i++) big |= too_big(&ins[i]);
        if (!big) tpurt_elementwise(NULL, &p, &a, ins, nin, sc, 2);
        break;
      }
      case 3:
        mkview(&r, &a, TPURT_NUM_DTYPES);
        mkview(&r, &b, TPURT_NUM_DTYPES);
        if (u8(&r) & 1) { /* reduce every dim of size > 1 where out has stride 0 */
          b.ndim = a.ndim;
          memcpy(b.sizes, a.sizes, sizeof a.sizes);
          for (int k = 0; k < a.ndim && k < TPURT_MAX_DIMS; k++)
            if (u8(&r) & 1) a.strides[k] = 0;
        }
        if (!too_big(&a) && !too_big(&b))
          tpurt_reduce(NULL, (tpurt_reduce_op)(u8(&r) % (TPURT_RED_NUM_OPS + 1)), &a, NULL, &b, 2.0);
        break;
      case 4:
        mkview(&r, &a, TPURT_NUM_DTYPES);
        b = a;
        b.ptr = g_buf[1];
        if (!too_big(&a)) tpurt_scan(NULL, (tpurt_scan_op)(u8(&r) % 6), &b, NULL, &a, (int)(int8_t)u8(&r) % 6);
        break;
      case 5:
        mkview(&r, &a, TPURT_NUM_DTYPES);
        b = a;
        b.ptr = g_buf[1] + 8 * (u8(&r) % 4);
        if (!too_big(&a)) tpurt_softmax(NULL, &b, &a, (int)(int8_t)u8(&r) % 6, u8(&r) & 1);
        break;
      case 6:
      case 7:
        mkview(&r, &a, TPURT_NUM_DTYPES);
        mkview(&r, &b, TPURT_NUM_DTYPES);
        mkview(&r, &c, (u8(&r) & 3) ? TPURT_I64 : TPURT_NUM_DTYPES);
        if (too_big(&a) || too_big(&b) || too_big(&c))
          break;
        if (what == 6)
          tpurt_index_select(NULL, &a, &b, (int)(int8_t)u8(&r) % 6, &c);
        else
          tpurt_gather(NULL, &a, &b, (int)(int8_t)u8(&r) % 6, &c);
        break;
      case 8:
        mkview(&r, &c, TPURT_NUM_DTYPES);
        mkview(&r, &a, TPURT_NUM_DTYPES);
        mkview(&r, &b, TPURT_NUM_DTYPES);
        if (!too_big(&a) && !too_big(&b) && !too_big(&c))
          tpurt_gemm(NULL, &c, &a, &b, 1.0, (u8(&r) & 1) ? 0.5 : 0.0, (tpurt_precision)(u8(&r) % 4));
        break;
      case 9:
        tpurt_flush(0, TPURT_FLUSH_EXPLICIT);
        break;
      default:
        tpurt_device_synchronize(0);
        break;
    }
  }
  tpurt_set_exec_mode(TPURT_MODE_STRICT); /* flushes what was recorded */
  tpurt_device_synchronize(0);            /* a pending kernel error is fine; a crash is not */
  return 0;
}
