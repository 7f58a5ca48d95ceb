/*
 * elementwise.c — the elementwise program interpreter (tpurt_elementwise).
 *
 * A program is a short list of register instructions. The kernel walks the
 * (coalesced) output shape in blocks of up to EW_BLK elements; a register is
 * one block of values in the compute type (f32, f64, i64, c64, c128). Each
 * instruction is a tight loop over the block, so the compiler vectorizes the
 * arithmetic; loads convert from any dtype and any strides, stores convert
 * to each output's dtype. Blocks are split over the thread pool.
 *
 * Row mode walks rows of the innermost dimension: long rows in blocks,
 * short ones several (up to EW_KPB_MAX) to a block, where an operand whose
 * rows follow each other is read or written as one run and a row repeated
 * over the block (a [C] operand against [..., C]) is kept, repeated, for the
 * worker's next blocks (ew_bcache; constants too). Rows of fewer than 8
 * elements run so only when every operand is one run, a repeated row or one
 * float a row (short_rows_fit); other layouts run in gather mode: EW_BLK
 * elements at a time with per-element offsets.
 *
 * Launch (host side): validates the program against the views, bakes launch
 * scalars into the instruction list, coalesces dimensions of all views
 * together and serializes everything into the launch arguments.
 *
 * Second tier: when the launch's program has a generated kernel ready
 * (graph/codegen.c: the same per-element bodies of ew_exec.h compiled as
 * one loop), every chunk the pool runs, and every range another kernel
 * runs through tpurt__ew_epi_range / tpurt__ew_into_range, is computed by
 * it instead: the same elements, the same bits, the same thread split.
 *
 * Parameter conventions beyond tpurt.h's comments:
 *   ADD / SUB          p0 is alpha as given (a zeroed instruction means alpha 0)
 *   ROUND              p0 = decimals (0: round half to even)
 *   LOGIT              p0 = eps, applied when p1 != 0
 *   THRESHOLD_BACKWARD p1 = the replacement value (threshold forward: src0 =
 *                      src1 = x, p1 = value)
 *   SCALAR / CONST     complex compute: re = scalars[p0], im = scalars[p0 + 1]
 *                      (CONST: p0, p1)
 *   integer compute    DIV is truncating; division or remainder by zero fails
 *                      the kernel with "ZeroDivisionError"
 */
/* FP exceptions are never trapped here: lets gcc if-convert and vectorize the
 * select-heavy loops (results are unchanged). */
#pragma GCC optimize("no-trapping-math")

#include <complex.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../graph/codegen.h"
#include "ew_exec.h"
#include "fused.h"
#include "gemm_internal.h"

#define EW_BLK 2048
#define EW_GRAIN 32768
#define EW_KPB_MAX (EW_BLK / 2) /* row mode: most whole rows in one block (rows of 2) */
#define EW_MAX_OPS (2 * TPURT_EW_MAX_IO)

/* ------------------------------------------------------------ op table */

enum { K_F = 1, K_I = 2, K_C = 4, K_ALL = 7 };
typedef struct {
  const char *name;
  unsigned char nsrc, kinds;
} ew_opinfo;

static const ew_opinfo k_ops[TPURT_EW_NUM_OPS] = {
    [TPURT_EW_LOAD] = {"load", 0, K_ALL},
    [TPURT_EW_SCALAR] = {"scalar", 0, K_ALL},
    [TPURT_EW_CONST] = {"const", 0, K_ALL},
    [TPURT_EW_UNIFORM] = {"uniform", 0, K_F},
    [TPURT_EW_GCD] = {"gcd", 2, K_I},
    [TPURT_EW_LCM] = {"lcm", 2, K_I},
    [TPURT_EW_NEG] = {"neg", 1, K_ALL},
    [TPURT_EW_ABS] = {"abs", 1, K_ALL},
    [TPURT_EW_SQRT] = {"sqrt", 1, K_F | K_C},
    [TPURT_EW_RSQRT] = {"rsqrt", 1, K_F | K_C},
    [TPURT_EW_RECIPROCAL] = {"reciprocal", 1, K_F | K_C},
    [TPURT_EW_SQUARE] = {"square", 1, K_ALL},
    [TPURT_EW_EXP] = {"exp", 1, K_F | K_C},
    [TPURT_EW_EXP2] = {"exp2", 1, K_F | K_C},
    [TPURT_EW_EXPM1] = {"expm1", 1, K_F | K_C},
    [TPURT_EW_LOG] = {"log", 1, K_F | K_C},
    [TPURT_EW_LOG2] = {"log2", 1, K_F | K_C},
    [TPURT_EW_LOG10] = {"log10", 1, K_F | K_C},
    [TPURT_EW_LOG1P] = {"log1p", 1, K_F | K_C},
    [TPURT_EW_SIN] = {"sin", 1, K_F | K_C},
    [TPURT_EW_COS] = {"cos", 1, K_F | K_C},
    [TPURT_EW_TAN] = {"tan", 1, K_F | K_C},
    [TPURT_EW_ASIN] = {"asin", 1, K_F | K_C},
    [TPURT_EW_ACOS] = {"acos", 1, K_F | K_C},
    [TPURT_EW_ATAN] = {"atan", 1, K_F | K_C},
    [TPURT_EW_SINH] = {"sinh", 1, K_F | K_C},
    [TPURT_EW_COSH] = {"cosh", 1, K_F | K_C},
    [TPURT_EW_TANH] = {"tanh", 1, K_F | K_C},
    [TPURT_EW_ASINH] = {"asinh", 1, K_F | K_C},
    [TPURT_EW_ACOSH] = {"acosh", 1, K_F | K_C},
    [TPURT_EW_ATANH] = {"atanh", 1, K_F | K_C},
    [TPURT_EW_SIGMOID] = {"sigmoid", 1, K_F | K_C},
    [TPURT_EW_LOGIT] = {"logit", 1, K_F},
    [TPURT_EW_ERF] = {"erf", 1, K_F},
    [TPURT_EW_ERFC] = {"erfc", 1, K_F},
    [TPURT_EW_ERFINV] = {"erfinv", 1, K_F},
    [TPURT_EW_LGAMMA] = {"lgamma", 1, K_F},
    [TPURT_EW_DIGAMMA] = {"digamma", 1, K_F},
    [TPURT_EW_SIGN] = {"sign", 1, K_F | K_I},
    [TPURT_EW_SGN] = {"sgn", 1, K_ALL},
    [TPURT_EW_FLOOR] = {"floor", 1, K_F | K_I},
    [TPURT_EW_CEIL] = {"ceil", 1, K_F | K_I},
    [TPURT_EW_ROUND] = {"round", 1, K_F | K_I},
    [TPURT_EW_TRUNC] = {"trunc", 1, K_F | K_I},
    [TPURT_EW_FRAC] = {"frac", 1, K_F},
    [TPURT_EW_RELU] = {"relu", 1, K_F | K_I},
    [TPURT_EW_GELU] = {"gelu", 1, K_F},
    [TPURT_EW_GELU_TANH] = {"gelu_tanh", 1, K_F},
    [TPURT_EW_SILU] = {"silu", 1, K_F | K_C},
    [TPURT_EW_MISH] = {"mish", 1, K_F},
    [TPURT_EW_SOFTPLUS] = {"softplus", 1, K_F},
    [TPURT_EW_LEAKY_RELU] = {"leaky_relu", 1, K_F},
    [TPURT_EW_HARDTANH] = {"hardtanh", 1, K_F | K_I},
    [TPURT_EW_ELU] = {"elu", 1, K_F},
    [TPURT_EW_HARDSIGMOID] = {"hardsigmoid", 1, K_F},
    [TPURT_EW_HARDSWISH] = {"hardswish", 1, K_F},
    [TPURT_EW_LOGICAL_NOT] = {"logical_not", 1, K_ALL},
    [TPURT_EW_BITWISE_NOT] = {"bitwise_not", 1, K_I},
    [TPURT_EW_ISNAN] = {"isnan", 1, K_ALL},
    [TPURT_EW_ISINF] = {"isinf", 1, K_ALL},
    [TPURT_EW_ISFINITE] = {"isfinite", 1, K_ALL},
    [TPURT_EW_ISPOSINF] = {"isposinf", 1, K_F | K_I},
    [TPURT_EW_ISNEGINF] = {"isneginf", 1, K_F | K_I},
    [TPURT_EW_NAN_TO_NUM] = {"nan_to_num", 1, K_F | K_I | K_C},
    [TPURT_EW_CAST] = {"cast", 1, K_ALL},
    [TPURT_EW_ADD] = {"add", 2, K_ALL},
    [TPURT_EW_SUB] = {"sub", 2, K_ALL},
    [TPURT_EW_MUL] = {"mul", 2, K_ALL},
    [TPURT_EW_DIV] = {"div", 2, K_ALL},
    [TPURT_EW_DIV_TRUNC] = {"div_trunc", 2, K_F | K_I},
    [TPURT_EW_DIV_FLOOR] = {"div_floor", 2, K_F | K_I},
    [TPURT_EW_REMAINDER] = {"remainder", 2, K_F | K_I},
    [TPURT_EW_FMOD] = {"fmod", 2, K_F | K_I},
    [TPURT_EW_POW] = {"pow", 2, K_ALL},
    [TPURT_EW_ATAN2] = {"atan2", 2, K_F},
    [TPURT_EW_HYPOT] = {"hypot", 2, K_F},
    [TPURT_EW_COPYSIGN] = {"copysign", 2, K_F},
    [TPURT_EW_XLOGY] = {"xlogy", 2, K_F},
    [TPURT_EW_MAXIMUM] = {"maximum", 2, K_F | K_I},
    [TPURT_EW_MINIMUM] = {"minimum", 2, K_F | K_I},
    [TPURT_EW_FMAX] = {"fmax", 2, K_F | K_I},
    [TPURT_EW_FMIN] = {"fmin", 2, K_F | K_I},
    [TPURT_EW_EQ] = {"eq", 2, K_ALL},
    [TPURT_EW_NE] = {"ne", 2, K_ALL},
    [TPURT_EW_LT] = {"lt", 2, K_F | K_I},
    [TPURT_EW_LE] = {"le", 2, K_F | K_I},
    [TPURT_EW_GT] = {"gt", 2, K_F | K_I},
    [TPURT_EW_GE] = {"ge", 2, K_F | K_I},
    [TPURT_EW_LOGICAL_AND] = {"logical_and", 2, K_ALL},
    [TPURT_EW_LOGICAL_OR] = {"logical_or", 2, K_ALL},
    [TPURT_EW_LOGICAL_XOR] = {"logical_xor", 2, K_ALL},
    [TPURT_EW_BITWISE_AND] = {"bitwise_and", 2, K_I},
    [TPURT_EW_BITWISE_OR] = {"bitwise_or", 2, K_I},
    [TPURT_EW_BITWISE_XOR] = {"bitwise_xor", 2, K_I},
    [TPURT_EW_LSHIFT] = {"bitwise_left_shift", 2, K_I},
    [TPURT_EW_RSHIFT] = {"bitwise_right_shift", 2, K_I},
    [TPURT_EW_THRESHOLD_BACKWARD] = {"threshold_backward", 2, K_F | K_I},
    [TPURT_EW_GELU_BACKWARD] = {"gelu_backward", 2, K_F},
    [TPURT_EW_GELU_TANH_BACKWARD] = {"gelu_tanh_backward", 2, K_F},
    [TPURT_EW_SILU_BACKWARD] = {"silu_backward", 2, K_F},
    [TPURT_EW_SIGMOID_BACKWARD] = {"sigmoid_backward", 2, K_F},
    [TPURT_EW_TANH_BACKWARD] = {"tanh_backward", 2, K_F},
    [TPURT_EW_SOFTPLUS_BACKWARD] = {"softplus_backward", 2, K_F},
    [TPURT_EW_LEAKY_RELU_BACKWARD] = {"leaky_relu_backward", 2, K_F},
    [TPURT_EW_HARDTANH_BACKWARD] = {"hardtanh_backward", 2, K_F},
    [TPURT_EW_ELU_BACKWARD] = {"elu_backward", 2, K_F},
    [TPURT_EW_HARDSIGMOID_BACKWARD] = {"hardsigmoid_backward", 2, K_F},
    [TPURT_EW_HARDSWISH_BACKWARD] = {"hardswish_backward", 2, K_F},
    [TPURT_EW_MISH_BACKWARD] = {"mish_backward", 2, K_F},
    [TPURT_EW_WHERE] = {"where", 3, K_ALL},
    [TPURT_EW_CLAMP] = {"clamp", 3, K_F | K_I},
    [TPURT_EW_LERP] = {"lerp", 3, K_F | K_C},
    [TPURT_EW_ADDCMUL] = {"addcmul", 3, K_ALL},
    [TPURT_EW_ADDCDIV] = {"addcdiv", 3, K_F | K_C},
    [TPURT_EW_I0] = {"i0", 1, K_F},
    [TPURT_EW_I0E] = {"special_i0e", 1, K_F},
    [TPURT_EW_I1] = {"special_i1", 1, K_F},
    [TPURT_EW_I1E] = {"special_i1e", 1, K_F},
    [TPURT_EW_BESSEL_J0] = {"special_bessel_j0", 1, K_F},
    [TPURT_EW_BESSEL_J1] = {"special_bessel_j1", 1, K_F},
    [TPURT_EW_BESSEL_Y0] = {"special_bessel_y0", 1, K_F},
    [TPURT_EW_BESSEL_Y1] = {"special_bessel_y1", 1, K_F},
    [TPURT_EW_BESSEL_K0] = {"special_modified_bessel_k0", 1, K_F},
    [TPURT_EW_BESSEL_K1] = {"special_modified_bessel_k1", 1, K_F},
    [TPURT_EW_BESSEL_K0E] = {"special_scaled_modified_bessel_k0", 1, K_F},
    [TPURT_EW_BESSEL_K1E] = {"special_scaled_modified_bessel_k1", 1, K_F},
    [TPURT_EW_SPHERICAL_BESSEL_J0] = {"special_spherical_bessel_j0", 1, K_F},
    [TPURT_EW_AIRY_AI] = {"special_airy_ai", 1, K_F},
    [TPURT_EW_POLYGAMMA] = {"polygamma", 1, K_F},
    [TPURT_EW_NDTRI] = {"special_ndtri", 1, K_F},
    [TPURT_EW_LOG_NDTR] = {"special_log_ndtr", 1, K_F},
    [TPURT_EW_ERFCX] = {"special_erfcx", 1, K_F},
    [TPURT_EW_ENTR] = {"special_entr", 1, K_F},
    [TPURT_EW_SINC] = {"sinc", 1, K_F | K_C},
    [TPURT_EW_SIGNBIT] = {"signbit", 1, K_F | K_I},
    [TPURT_EW_HARDSHRINK] = {"hardshrink", 1, K_F},
    [TPURT_EW_SOFTSHRINK] = {"softshrink", 1, K_F},
    [TPURT_EW_ANGLE] = {"angle", 1, K_F | K_C},
    [TPURT_EW_FREXP_MANTISSA] = {"frexp_mantissa", 1, K_F},
    [TPURT_EW_FREXP_EXPONENT] = {"frexp_exponent", 1, K_F},
    [TPURT_EW_ZETA] = {"special_zeta", 2, K_F},
    [TPURT_EW_IGAMMA] = {"igamma", 2, K_F},
    [TPURT_EW_IGAMMAC] = {"igammac", 2, K_F},
    [TPURT_EW_XLOG1PY] = {"special_xlog1py", 2, K_F},
    [TPURT_EW_LOGADDEXP] = {"logaddexp", 2, K_F},
    [TPURT_EW_LOGADDEXP2] = {"logaddexp2", 2, K_F},
    [TPURT_EW_HEAVISIDE] = {"heaviside", 2, K_F | K_I},
    [TPURT_EW_NEXTAFTER] = {"nextafter", 2, K_F},
    [TPURT_EW_CHEBYSHEV_T] = {"special_chebyshev_polynomial_t", 2, K_F},
    [TPURT_EW_CHEBYSHEV_U] = {"special_chebyshev_polynomial_u", 2, K_F},
    [TPURT_EW_CHEBYSHEV_V] = {"special_chebyshev_polynomial_v", 2, K_F},
    [TPURT_EW_CHEBYSHEV_W] = {"special_chebyshev_polynomial_w", 2, K_F},
    [TPURT_EW_SHIFTED_CHEBYSHEV_T] = {"special_shifted_chebyshev_polynomial_t", 2, K_F},
    [TPURT_EW_SHIFTED_CHEBYSHEV_U] = {"special_shifted_chebyshev_polynomial_u", 2, K_F},
    [TPURT_EW_SHIFTED_CHEBYSHEV_V] = {"special_shifted_chebyshev_polynomial_v", 2, K_F},
    [TPURT_EW_SHIFTED_CHEBYSHEV_W] = {"special_shifted_chebyshev_polynomial_w", 2, K_F},
    [TPURT_EW_HERMITE_H] = {"special_hermite_polynomial_h", 2, K_F},
    [TPURT_EW_HERMITE_HE] = {"special_hermite_polynomial_he", 2, K_F},
    [TPURT_EW_LAGUERRE_L] = {"special_laguerre_polynomial_l", 2, K_F},
    [TPURT_EW_LEGENDRE_P] = {"special_legendre_polynomial_p", 2, K_F},
    [TPURT_EW_SHRINK_BACKWARD] = {"shrink_backward", 2, K_F},
    [TPURT_EW_LOGIT_BACKWARD] = {"logit_backward", 2, K_F},
    [TPURT_EW_COMPLEX] = {"complex", 2, K_C},
    [TPURT_EW_POLAR] = {"polar", 2, K_C},
};

int tpurt__ew_nsrc(int op) { return op >= 0 && op < TPURT_EW_NUM_OPS ? k_ops[op].nsrc : 0; }

const char *tpurt_ew_op_name(tpurt_ew_op op) {
  if ((unsigned)op >= TPURT_EW_NUM_OPS || !k_ops[op].name) return "invalid";
  return k_ops[op].name;
}


/* ------------------------------------------------------ loads / stores */

static inline int is_int_dtype(tpurt_dtype t) {
  return t == TPURT_BOOL || t == TPURT_U8 || t == TPURT_I8 || t == TPURT_I16 || t == TPURT_I32 ||
         t == TPURT_I64 || t == TPURT_U16 || t == TPURT_U32 || t == TPURT_U64;
}

/* element j of a segment: stride st (elements) or gather offsets (bytes) */
#define EW_AT(TYPE, j) (*(const TYPE *)(off ? base + off[j] : base + (int64_t)(j) * st * (int64_t)sizeof(TYPE)))

#define LOADLOOP(DT, ST, EXPR)                                                   \
  do {                                                                           \
    if (!off && st == 1) {                                                       \
      const ST *p = (const ST *)base;                                            \
      for (int j = 0; j < n; j++) {                                              \
        ST v = p[j];                                                             \
        d[j] = (EXPR);                                                           \
      }                                                                          \
    } else if (!off && st == 0) {                                                \
      ST v = *(const ST *)base;                                                  \
      DT r = (EXPR);                                                             \
      for (int j = 0; j < n; j++) d[j] = r;                                      \
    } else {                                                                     \
      for (int j = 0; j < n; j++) {                                              \
        ST v = EW_AT(ST, j);                                                     \
        d[j] = (EXPR);                                                           \
      }                                                                          \
    }                                                                            \
  } while (0)

/* one load function per compute type: a switch over the dtype table of
 * ew_exec.h */
#define LOAD_CASE(DT, D, ST, EXPR) \
  case D: LOADLOOP(DT, ST, EXPR); break;
#define LOAD_FN(DT, TABLE, CONVF)                                                                                \
  static void load_##DT(DT *restrict d, tpurt_dtype dt, const char *base, int64_t st, const int64_t *off, int n) { \
    switch (dt) {                                                                                                \
      TABLE(LOAD_CASE, DT, CONVF)                                                                                \
      default: break;                                                                                            \
    }                                                                                                            \
  }
LOAD_FN(float, EW_LOAD_REAL, CONV_F32)
LOAD_FN(double, EW_LOAD_REAL, CONV_F64)
LOAD_FN(int64_t, EW_LOAD_REAL, CONV_I64)
LOAD_FN(c64_t, EW_LOAD_CPLX, CONV_C64)
LOAD_FN(c128_t, EW_LOAD_CPLX, CONV_C128)

#define EW_PUT(TYPE, j) (*(TYPE *)(off ? base + off[j] : base + (int64_t)(j) * st * (int64_t)sizeof(TYPE)))
#define STORELOOP(DST, EXPR)                                                     \
  do {                                                                           \
    if (!off && st == 1) {                                                       \
      DST *p = (DST *)base;                                                      \
      for (int j = 0; j < n; j++) {                                              \
        __typeof__(s[0]) v = s[j];                                               \
        p[j] = (DST)(EXPR);                                                      \
      }                                                                          \
    } else {                                                                     \
      for (int j = 0; j < n; j++) {                                              \
        __typeof__(s[0]) v = s[j];                                               \
        EW_PUT(DST, j) = (DST)(EXPR);                                            \
      }                                                                          \
    }                                                                            \
  } while (0)

#define STORE_CASE(CT, D, DST, EXPR) \
  case D: STORELOOP(DST, EXPR); break;
#define STORE_FN(CT, TABLE, CONV)                                                                                 \
  static void store_##CT(const CT *restrict s, tpurt_dtype dt, char *base, int64_t st, const int64_t *off, int n) { \
    switch (dt) {                                                                                                 \
      TABLE(STORE_CASE, CT, CONV)                                                                                 \
      default: break;                                                                                             \
    }                                                                                                             \
  }
STORE_FN(float, EW_STORE_REAL, F2I)
STORE_FN(double, EW_STORE_REAL, F2I)
STORE_FN(int64_t, EW_STORE_REAL, ID_I)
STORE_FN(c64_t, EW_STORE_CPLX, crealf)
STORE_FN(c128_t, EW_STORE_CPLX, creal)

/* ------------------------------------------------------ launch arguments */

/* Serialized after the header: ptr[nops], sizes[ndim], strides[nops*ndim]
 * (elements), inst[ninst]. Operands: outputs first, then inputs. */
typedef struct {
  int32_t compute, ninst, nout, nin, nops, ndim, nregs, gather;
  int64_t numel;
  uint8_t out_reg[TPURT_EW_MAX_IO];
  uint8_t dt[EW_MAX_OPS];
} ew_hdr;

typedef struct {
  const ew_hdr *h;
  const int64_t *sizes;
  int64_t bstr[EW_MAX_OPS][TPURT_MAX_DIMS]; /* byte strides */
  char *base[EW_MAX_OPS];
  const tpurt_ew_inst *inst;
  int zc[TPURT_EW_MAX_REGS]; /* LOAD into this register may alias input memory */
  int64_t inner, rows, bpr;  /* row mode: inner size, rows, blocks per row */
  int64_t kpb;               /* row mode, short rows: whole rows per block (1: blocks within a row) */
  int64_t est[EW_MAX_OPS];   /* innermost stride of each operand, in elements */
  unsigned gdense;           /* gather mode: operands laid out row-major over the whole shape (no offsets) */
  unsigned bcok;             /* row mode: inputs no output overlaps, whose broadcast rows blocks may keep (bcache) */
  tpurt__cg_fn cg;           /* the launch's generated kernel (graph/codegen.c), or NULL: interpret */
  _Atomic int err;
} ew_ctx;

static size_t csize(tpurt_dtype c) { return tpurt_dtype_size(c); }

/* Uniform draws for the n elements from row-major index lin0 (see
 * TPURT_EW_UNIFORM; p holds the baked seed and offset halves). */
static void uniform_block(float *d, const double *p, int64_t lin0, int n) {
  uint64_t key = (uint64_t)p[0] | (uint64_t)p[1] << 32, off = (uint64_t)p[2] | (uint64_t)p[3] << 32;
  tpurt__philox_uniform(key, off, lin0, n, d);
}

static void cg_uniform(const double *p, int64_t lin0, int n, float *out) { uniform_block(out, p, lin0, n); }

/* Elements [lo, hi) of the launch (row-major) by its generated kernel:
 * the same elements a chunk of the interpreter computes, with the same
 * bits. 0 (error noted in x->err) on an integer division by zero. */
static int cg_run(ew_ctx *x, int64_t lo, int64_t hi) {
  tpurt__cg_args a = {x->h->ndim, x->sizes, x->base, (const int64_t(*)[TPURT_MAX_DIMS])x->bstr, x->inst, cg_uniform, 0};
  if (lo < hi && x->cg(&a, lo, hi)) {
    atomic_store(&x->err, 1);
    return 0;
  }
  return 1;
}

/* [p, p + n) and [q, q + m) share a byte (q NULL: no) */
static int overlaps(const void *p, size_t n, const void *q, size_t m) {
  if (!q) return 0;
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
  return a < b + m && b < a + n;
}

/* One block of n elements (returns 1 on division by zero). Row mode: k rows of n / k elements each, row r
 * of operand op at byte offset roff[op * k + r] with the operand's innermost
 * stride; bit op of `dense` says the k rows follow each other in memory
 * (the block is one contiguous run), bit op of `same` that they are all
 * the same row. Gather mode: k = 1, roff all zero,
 * per-element offsets goff. */
static void load_reg(tpurt_dtype ct, void *d, tpurt_dtype dt, const char *base, int64_t st, const int64_t *off, int n) {
  switch (ct) {
    case TPURT_F32: load_float(d, dt, base, st, off, n); break;
    case TPURT_F64: load_double(d, dt, base, st, off, n); break;
    case TPURT_I64: load_int64_t(d, dt, base, st, off, n); break;
    case TPURT_C64: load_c64_t(d, dt, base, st, off, n); break;
    default: load_c128_t(d, dt, base, st, off, n); break;
  }
}
static void store_reg(tpurt_dtype ct, const void *s, tpurt_dtype dt, char *base, int64_t st, const int64_t *off, int n) {
  switch (ct) {
    case TPURT_F32: store_float(s, dt, base, st, off, n); break;
    case TPURT_F64: store_double(s, dt, base, st, off, n); break;
    case TPURT_I64: store_int64_t(s, dt, base, st, off, n); break;
    case TPURT_C64: store_c64_t(s, dt, base, st, off, n); break;
    default: store_c128_t(s, dt, base, st, off, n); break;
  }
}

/* how operand o of a block is walked: per-element offsets (gather mode),
 * a contiguous run (gather mode, an operand dense over the whole shape), or
 * its innermost stride (row mode); returns the offsets or NULL */
static const int64_t *operand_walk(const ew_ctx *x, int64_t (*goff)[EW_BLK], int o, int64_t *st) {
  int gd = goff && (x->gdense >> o & 1);
  *st = gd ? 1 : goff ? 0 : x->est[o];
  return goff && !gd ? goff[o] : NULL;
}

/* The blocks a worker keeps across the blocks of its chunk (row mode):
 * - broadcast rows (several rows to a block): an input whose k rows in a
 *   block are all the same row (a [C] operand against [..., C]) is
 *   converted and repeated into its own block once, and the next blocks
 *   with the same row and k read it again instead of repeating it into a
 *   register every time (that copy was ~40 % of `X + b[1024]`'s kernel
 *   time, perf). Only for inputs no output overlaps (ew_ctx.bcok): their
 *   rows cannot change during the launch.
 * - constants (`x * 2`): the first EW_BC_CONSTS constant instructions fill
 *   their own blocks once per chunk instead of a register every block. */
#define EW_BC_CONSTS 4
#define EW_BC_BLOCKS(h) ((h)->nin + EW_BC_CONSTS)
typedef struct {
  char *buf;                    /* EW_BC_BLOCKS blocks of EW_BLK compute-type elements: inputs, then constants */
  int64_t off[TPURT_EW_MAX_IO]; /* byte offset of the row each input's block holds */
  int k[TPURT_EW_MAX_IO];       /* rows it holds; 0: nothing */
  int cq[EW_BC_CONSTS];         /* the instruction each constant block holds (-1: none) */
  int cn[EW_BC_CONSTS];         /* elements it holds */
} ew_bcache;

static int run_block(ew_ctx *x, const int64_t *roff, int k, unsigned dense, unsigned same, int64_t (*goff)[EW_BLK],
                     int n, char *scratch, int64_t lin0, ew_bcache *bc) {
  const ew_hdr *h = x->h;
  tpurt_dtype ct = (tpurt_dtype)h->compute;
  size_t rb = EW_BLK * csize(ct);
  void *R[TPURT_EW_MAX_REGS];
  char *buf[TPURT_EW_MAX_REGS + 1] = {0};
  for (int r = 0; r <= h->nregs; r++) buf[r] = scratch + (size_t)r * rb;
  char *spare = buf[h->nregs];
  for (int r = 0; r < h->nregs; r++) R[r] = buf[r];
  int inner = h->ndim - 1;
  int bad = 0, direct = 0, len = n / k;
  size_t cs = csize(ct);
  for (int q = 0; q < h->ninst; q++) {
    const tpurt_ew_inst *I = &x->inst[q];
    int dr = I->dst;
    if (I->op == TPURT_EW_LOAD) {
      int op = h->nout + (int)I->p[0];
      tpurt_dtype dt = (tpurt_dtype)h->dt[op];
      const int64_t *ro = roff + (size_t)op * (size_t)k;
      const char *base = x->base[op] + ro[0];
      int64_t st;
      const int64_t *off = operand_walk(x, goff, op, &st);
      if (!off && st == 1 && dt == ct && x->zc[dr] && (dense >> op & 1)) {
        R[dr] = (void *)base; /* zero-copy: the register reads the input */
        continue;
      }
      R[dr] = buf[dr];
      if (k == 1 || (dense >> op & 1)) {
        load_reg(ct, R[dr], dt, base, st, off, n);
      } else if (same >> op & 1) {
        /* the same row for every row of the block (a [C] operand against
         * [..., C]): converted once, then copied — into the kept block when
         * the input may be kept, and there only if it holds another row */
        int i = op - h->nout;
        char *d = R[dr];
        if (bc && (x->bcok >> op & 1)) {
          d = bc->buf + (size_t)i * rb;
          R[dr] = d;
          if (bc->k[i] == k && bc->off[i] == ro[0]) continue;
          bc->k[i] = k;
          bc->off[i] = ro[0];
        }
        load_reg(ct, d, dt, base, st, NULL, len);
        for (int r = 1; r < k; r++) memcpy(d + (size_t)r * (size_t)len * cs, d, (size_t)len * cs);
      } else if (ct == TPURT_F32 && dt == TPURT_F32 && (st == 1 || st == 0)) {
        /* float rows read as they are (or one value each, stride 0), without
         * load_reg's dispatch per row: kron's short rows spent more time
         * there than in the multiply */
        float *d = R[dr];
        for (int r = 0; r < k; r++, d += len) {
          const float *src = (const float *)(x->base[op] + ro[r]);
          if (st) {
            memcpy(d, src, (size_t)len * sizeof(float));
          } else {
            float v = *src;
            for (int j = 0; j < len; j++) d[j] = v;
          }
        }
      } else {
        for (int r = 0; r < k; r++) load_reg(ct, (char *)R[dr] + (size_t)r * (size_t)len * cs, dt, x->base[op] + ro[r], st, NULL, len);
      }
      continue;
    }
    if (I->op == TPURT_EW_UNIFORM) {
      R[dr] = buf[dr];
      if (ct == TPURT_F32) {
        uniform_block(R[dr], I->p, lin0, n);
      } else { /* f64 compute: the same float draws, widened */
        float u[EW_BLK];
        uniform_block(u, I->p, lin0, n);
        double *d = R[dr];
        for (int j = 0; j < n; j++) d[j] = u[j];
      }
      continue;
    }
    if (I->op == TPURT_EW_CONST) {
      R[dr] = buf[dr];
      if (bc) { /* a kept block: this constant's, a free one, or none */
        int c = 0;
        while (c < EW_BC_CONSTS && bc->cq[c] != q && bc->cq[c] >= 0) c++;
        if (c < EW_BC_CONSTS) {
          R[dr] = bc->buf + (size_t)(h->nin + c) * rb;
          if (bc->cq[c] == q && bc->cn[c] >= n) continue;
          bc->cq[c] = q;
          bc->cn[c] = n;
        }
      }
      switch (ct) {
        case TPURT_F32: { float v = (float)I->p[0]; float *d = R[dr]; for (int j = 0; j < n; j++) d[j] = v; break; }
        case TPURT_F64: { double v = I->p[0]; double *d = R[dr]; for (int j = 0; j < n; j++) d[j] = v; break; }
        case TPURT_I64: { int64_t v = tpurt__f2i64(I->p[0]); int64_t *d = R[dr]; for (int j = 0; j < n; j++) d[j] = v; break; }
        case TPURT_C64: { c64_t v = (float)I->p[0] + (float)I->p[1] * I_UNIT; c64_t *d = R[dr]; for (int j = 0; j < n; j++) d[j] = v; break; }
        default: { c128_t v = I->p[0] + I->p[1] * I_UNIT; c128_t *d = R[dr]; for (int j = 0; j < n; j++) d[j] = v; break; }
      }
      continue;
    }
    char *out = spare;
    const void *a = I->src[0] < h->nregs ? R[I->src[0]] : NULL;
    const void *b = I->src[1] < h->nregs ? R[I->src[1]] : NULL;
    const void *c = I->src[2] < h->nregs ? R[I->src[2]] : NULL;
    if (q == h->ninst - 1 && h->nout == 1 && h->out_reg[0] == dr && (!goff || (x->gdense & 1)) && h->dt[0] == ct &&
        x->bstr[0][inner] == (int64_t)csize(ct) && (dense & 1)) {
      /* the program's one result goes straight to a dense output of its
       * type (not through a register and a copy) unless the output's
       * memory overlaps what this instruction reads */
      char *o = x->base[0] + roff[0];
      size_t nb = (size_t)n * csize(ct);
      if (!overlaps(o, nb, a, nb) && !overlaps(o, nb, b, nb) && !overlaps(o, nb, c, nb)) {
        out = o;
        direct = 1;
      }
    }
    switch (ct) {
      case TPURT_F32: exec_f32(I, (float *)out, a, b, c, n); break;
      case TPURT_F64: exec_f64(I, (double *)out, a, b, c, n); break;
      case TPURT_I64: bad |= exec_i64(I, (int64_t *)out, a, b, c, n); break;
      case TPURT_C64: exec_c64(I, (c64_t *)out, a, b, c, n); break;
      default: exec_c128(I, (c128_t *)out, a, b, c, n); break;
    }
    if (direct) {
      R[dr] = out;
      break;
    }
    spare = buf[dr];
    buf[dr] = out;
    R[dr] = out;
  }
  if (bad) return 1;
  for (int o = direct; o < h->nout; o++) {
    tpurt_dtype dt = (tpurt_dtype)h->dt[o];
    const int64_t *ro = roff + (size_t)o * (size_t)k;
    int64_t st;
    const int64_t *off = operand_walk(x, goff, o, &st);
    const char *s = R[h->out_reg[o]];
    if (k == 1 || (dense >> o & 1))
      store_reg(ct, s, dt, x->base[o] + ro[0], st, off, n);
    else
      for (int r = 0; r < k; r++) store_reg(ct, s + (size_t)r * (size_t)len * cs, dt, x->base[o] + ro[r], st, NULL, len);
  }
  return 0;
}

/* Bytes of a worker's blocks: its registers, a spare, the kept blocks
 * (ew_bcache). */
static size_t scratch_blocks_bytes(const ew_hdr *h) {
  return (size_t)(h->nregs + 1 + EW_BC_BLOCKS(h)) * EW_BLK * csize((tpurt_dtype)h->compute);
}

/* A worker's memory: its blocks, then the row offsets of a block of short
 * rows (multirow_rows) — per-thread heap memory, not the stack (up to 33
 * registers x EW_BLK x 16 bytes of complex128 = 1 MiB, the size of a
 * stream worker's whole stack). NULL when host memory is exhausted. */
static char *scratch_of(const ew_hdr *h) {
  return tpurt__scratch(8, scratch_blocks_bytes(h) + (size_t)h->nops * EW_KPB_MAX * sizeof(int64_t));
}

/* The kept blocks of a worker's chunk (empty), after its register blocks. */
static ew_bcache bcache_of(const ew_hdr *h, char *scratch) {
  ew_bcache bc;
  bc.buf = scratch + (size_t)(h->nregs + 1) * EW_BLK * csize((tpurt_dtype)h->compute);
  for (int i = 0; i < TPURT_EW_MAX_IO; i++) bc.k[i] = 0, bc.off[i] = 0;
  for (int c = 0; c < EW_BC_CONSTS; c++) bc.cq[c] = -1, bc.cn[c] = 0;
  return bc;
}

/* Advances the multi-index idx over dimensions [0, top) by one (the last
 * of them fastest), keeping every operand's byte offset cur[o] in step. */
static inline void next_index(const ew_ctx *x, int nops, int top, int64_t *idx, int64_t *cur) {
  for (int d = top - 1; d >= 0; d--) {
    idx[d]++;
    for (int o = 0; o < nops; o++) cur[o] += x->bstr[o][d];
    if (idx[d] < x->sizes[d]) return;
    for (int o = 0; o < nops; o++) cur[o] -= idx[d] * x->bstr[o][d];
    idx[d] = 0;
  }
}

/* row mode with short rows: rows [row_b, row_e) in blocks of kpb whole rows (up to EW_BLK
 * elements), so that the per-block work (offsets, instruction dispatch)
 * and each instruction's loop cover many short rows at once (broadcasts
 * against [..., 1] or [C] shapes: rows of the width). Row offsets are
 * walked with carries; an operand whose rows follow each other reads and
 * writes the block as one run. */
static void multirow_rows(ew_ctx *x, int64_t row_b, int64_t row_e, char *scratch, ew_bcache *bc) {
  const ew_hdr *h = x->h;
  int nops = h->nops, inner = h->ndim - 1, kpb = (int)x->kpb;
  int64_t *roff = (int64_t *)(scratch + scratch_blocks_bytes(h)); /* nops x kpb */
  int64_t run[EW_MAX_OPS];
  unsigned all = 0; /* one bit per operand */
  for (int o = 0; o < nops; o++) {
    run[o] = x->inner * x->bstr[o][inner];
    all |= 1u << o;
  }
  /* the chunk's first row; later rows follow by carries */
  int64_t idx[TPURT_MAX_DIMS], cur[EW_MAX_OPS];
  int64_t rem = row_b;
  for (int o = 0; o < nops; o++) cur[o] = 0;
  for (int d = inner - 1; d >= 0; d--) {
    idx[d] = rem % x->sizes[d];
    rem /= x->sizes[d];
    for (int o = 0; o < nops; o++) cur[o] += idx[d] * x->bstr[o][d];
  }
  for (int64_t row0 = row_b; row0 < row_e; row0 += kpb) {
    if (atomic_load_explicit(&x->err, memory_order_relaxed)) return;
    int k = row_e - row0 < kpb ? (int)(row_e - row0) : kpb;
    unsigned dense = all, same = all;
    int d1 = inner - 1; /* the dimension the rows step along */
    if (idx[d1] + k < x->sizes[d1]) {
      /* the block's rows stay inside that dimension (no carry): offsets
       * are arithmetic progressions (the usual case; the walk below cost
       * as much as the arithmetic on rows of 128) */
      for (int o = 0; o < nops; o++) {
        int64_t step = x->bstr[o][d1], c0 = cur[o];
        int64_t *ro = roff + (size_t)o * (size_t)k;
        /* one run, or an input's repeated row: run_block reads ro[0] alone */
        int whole = step == run[o] || (step == 0 && o >= h->nout);
        ro[0] = c0;
        for (int r = 1; r < k && !whole; r++) ro[r] = c0 + r * step;
        if (k > 1 && step != run[o]) dense &= ~(1u << o);
        if (k > 1 && step != 0) same &= ~(1u << o);
        cur[o] = c0 + k * step;
      }
      idx[d1] += k;
    } else {
      for (int r = 0; r < k; r++) {
        for (int o = 0; o < nops; o++) {
          roff[o * k + r] = cur[o];
          if (r && cur[o] != roff[o * k + r - 1] + run[o]) dense &= ~(1u << o);
          if (r && cur[o] != roff[o * k]) same &= ~(1u << o);
        }
        next_index(x, nops, inner, idx, cur);
      }
    }
    if (run_block(x, roff, k, dense, k > 1 ? same : 0, NULL, (int)(k * x->inner), scratch, row0 * x->inner, bc)) {
      atomic_store(&x->err, 1);
      return;
    }
  }
}

/* Row mode: the n <= EW_BLK elements from column col of row `row` (row-major
 * index row * inner + col). 0 (error noted in x->err) when the block failed. */
static int row_block(ew_ctx *x, int64_t row, int64_t col, int64_t n, char *scratch, ew_bcache *bc) {
  int nops = x->h->nops, inner = x->h->ndim - 1;
  int64_t offs[EW_MAX_OPS];
  for (int o = 0; o < nops; o++) offs[o] = col * x->bstr[o][inner];
  int64_t rem = row;
  for (int k = inner - 1; k >= 0 && rem; k--) {
    int64_t ik = rem % x->sizes[k];
    rem /= x->sizes[k];
    for (int o = 0; o < nops; o++) offs[o] += ik * x->bstr[o][k];
  }
  if (run_block(x, offs, 1, ~0u, 0, NULL, (int)n, scratch, row * x->inner + col, bc)) {
    atomic_store(&x->err, 1);
    return 0;
  }
  return 1;
}

/* row mode: unit = a block inside one row of the innermost dimension */
static void rows_chunk(void *c, int64_t b, int64_t e) {
  ew_ctx *x = c;
  if (x->cg) { /* units b..e cover consecutive elements: whole rows, or blocks of rows */
    if (x->kpb > 1)
      cg_run(x, b * x->kpb * x->inner, (e * x->kpb < x->rows ? e * x->kpb : x->rows) * x->inner);
    else
      cg_run(x, b / x->bpr * x->inner + b % x->bpr * EW_BLK, e / x->bpr * x->inner + e % x->bpr * EW_BLK);
    return;
  }
  char *scratch = scratch_of(x->h);
  if (!scratch) {
    atomic_store(&x->err, 2);
    return;
  }
  ew_bcache bc = bcache_of(x->h, scratch);
  if (x->kpb > 1) {
    multirow_rows(x, b * x->kpb, e * x->kpb < x->rows ? e * x->kpb : x->rows, scratch, &bc);
    return;
  }
  for (int64_t bi = b; bi < e; bi++) {
    if (atomic_load_explicit(&x->err, memory_order_relaxed)) return;
    int64_t row = bi / x->bpr, col = (bi % x->bpr) * EW_BLK;
    if (!row_block(x, row, col, x->inner - col < EW_BLK ? x->inner - col : EW_BLK, scratch, &bc)) return;
  }
}

/* gather mode (small innermost dimension): unit = EW_BLK linear elements,
 * per-element byte offsets computed by walking the index */
static void gather_chunk(void *c, int64_t b, int64_t e) {
  ew_ctx *x = c;
  const ew_hdr *h = x->h;
  if (x->cg) {
    cg_run(x, b * EW_BLK, e * EW_BLK < h->numel ? e * EW_BLK : h->numel);
    return;
  }
  int nops = h->nops, nd = h->ndim;
  char *scratch = scratch_of(h);
  if (!scratch) {
    atomic_store(&x->err, 2);
    return;
  }
  /* per-element offsets: on the stack for up to 4 operands, else heap */
  _Alignas(64) int64_t small[4][EW_BLK];
  int64_t (*goff)[EW_BLK] = nops <= 4 ? small : malloc(sizeof(int64_t) * EW_BLK * (size_t)nops);
  if (!goff) {
    atomic_store(&x->err, 2);
    return;
  }
  for (int64_t bi = b; bi < e; bi++) {
    if (atomic_load_explicit(&x->err, memory_order_relaxed)) break;
    int64_t start = bi * EW_BLK;
    int64_t n = h->numel - start < EW_BLK ? h->numel - start : EW_BLK;
    int64_t idx[TPURT_MAX_DIMS], cur[EW_MAX_OPS];
    int64_t rem = start;
    for (int o = 0; o < nops; o++) cur[o] = 0;
    for (int k = nd - 1; k >= 0; k--) {
      idx[k] = rem % x->sizes[k];
      rem /= x->sizes[k];
      for (int o = 0; o < nops; o++) cur[o] += idx[k] * x->bstr[o][k];
    }
    /* runs along the innermost dimension: a strided sequence per operand,
     * then one carry into the outer dimensions */
    int in = nd - 1;
    for (int64_t j = 0; j < n;) {
      int64_t run = x->sizes[in] - idx[in];
      if (run > n - j) run = n - j;
      for (int o = 0; o < nops; o++) {
        int64_t c0 = cur[o], st = x->bstr[o][in];
        if (!(x->gdense >> o & 1)) {
          int64_t *g = goff[o] + j;
          for (int64_t t = 0; t < run; t++) g[t] = c0 + t * st;
        }
        cur[o] += run * st;
      }
      j += run;
      idx[in] += run;
      if (idx[in] < x->sizes[in]) continue;
      for (int o = 0; o < nops; o++) cur[o] -= idx[in] * x->bstr[o][in];
      idx[in] = 0;
      next_index(x, nops, in, idx, cur);
    }
    int64_t roff[EW_MAX_OPS]; /* dense operands: their run's first byte */
    for (int o = 0; o < nops; o++)
      roff[o] = x->gdense >> o & 1 ? start * (int64_t)tpurt_dtype_size((tpurt_dtype)h->dt[o]) : 0;
    if (run_block(x, roff, 1, ~0u, 0, goff, (int)n, scratch, start, NULL)) {
      atomic_store(&x->err, 1);
      break;
    }
  }
  if (goff != small) free(goff);
}

/* Do the bytes operands a and b span (from their lowest to their highest
 * element) overlap? */
static int spans_overlap(const ew_ctx *x, const int64_t *sizes, int a, int b) {
  uintptr_t lo[2], hi[2];
  int ops[2] = {a, b};
  for (int t = 0; t < 2; t++) {
    int o = ops[t];
    intptr_t l = 0, u = 0;
    for (int k = 0; k < x->h->ndim; k++) {
      intptr_t e = (intptr_t)((sizes[k] - 1) * x->bstr[o][k]);
      if (e < 0) l += e; else u += e;
    }
    lo[t] = (uintptr_t)x->base[o] + (uintptr_t)l;
    hi[t] = (uintptr_t)x->base[o] + (uintptr_t)u + tpurt_dtype_size((tpurt_dtype)x->h->dt[o]);
  }
  return lo[0] < hi[1] && lo[1] < hi[0];
}

/* x over the serialized launch `args`; row-mode geometry set up unless
 * gather mode. Operand `skip` (-1: none) gets no address: its memory is
 * given per run (tpurt__ew_into_range). */
static void ew_ctx_init(ew_ctx *x, const void *args, int skip) {
  const ew_hdr *h = args;
  const char *p = (const char *)(h + 1);
  const tpurt_devptr *ptr = (const tpurt_devptr *)p;
  p += sizeof(tpurt_devptr) * (size_t)h->nops;
  const int64_t *sizes = (const int64_t *)p;
  p += sizeof(int64_t) * (size_t)h->ndim;
  const int64_t *str = (const int64_t *)p;
  p += sizeof(int64_t) * (size_t)(h->ndim * h->nops);
  memset(x, 0, sizeof *x);
  x->h = h;
  x->sizes = sizes;
  x->inst = (const tpurt_ew_inst *)p;
  for (int o = 0; o < h->nops; o++) {
    x->base[o] = o == skip ? NULL : tpurt__host_view(ptr[o]);
    int64_t es = (int64_t)tpurt_dtype_size((tpurt_dtype)h->dt[o]);
    for (int k = 0; k < h->ndim; k++) x->bstr[o][k] = str[o * h->ndim + k] * es;
    x->est[o] = h->ndim ? str[o * h->ndim + h->ndim - 1] : 0;
  }
  for (int r = 0; r < TPURT_EW_MAX_REGS; r++) x->zc[r] = 1;
  for (int k = 0; k < h->nout; k++) x->zc[h->out_reg[k]] = 0;
  atomic_init(&x->err, 0);
  if (h->gather) {
    for (int o = 0; o < h->nops; o++) {
      int64_t want = (int64_t)tpurt_dtype_size((tpurt_dtype)h->dt[o]);
      int dense = 1;
      for (int k = h->ndim - 1; k >= 0; k--) {
        dense &= sizes[k] == 1 || x->bstr[o][k] == want;
        want *= sizes[k];
      }
      x->gdense |= (unsigned)dense << o;
    }
  } else {
    /* inputs no output's bytes overlap may keep broadcast rows (ew_bcache);
     * an output given memory per run (skip) is not known yet: none */
    for (int i = h->nout; i < h->nops && skip < 0; i++) {
      int ok = 1;
      for (int o = 0; o < h->nout && ok; o++) ok = !spans_overlap(x, sizes, i, o);
      x->bcok |= (unsigned)ok << i;
    }
    x->inner = sizes[h->ndim - 1];
    x->bpr = (x->inner + EW_BLK - 1) / EW_BLK;
    x->rows = h->numel / x->inner;
    x->kpb = h->ndim > 1 && x->inner <= EW_BLK / 2 ? EW_BLK / x->inner : 1;
    if (x->kpb > EW_KPB_MAX) x->kpb = EW_KPB_MAX;
  }
  tpurt__cg_launch l = {h->compute, h->nout, h->nin, h->ninst, h->ndim, h->dt, h->out_reg, x->inst, sizes,
                        (const int64_t(*)[TPURT_MAX_DIMS])x->bstr, x->base};
  x->cg = tpurt__codegen_find(&l);
}

static tpurt_status ew_status(const ew_ctx *x, char *err, size_t errlen) {
  int e = atomic_load(&x->err);
  if (e == 1) {
    snprintf(err, errlen, "ZeroDivisionError");
    return TPURT_ERR_KERNEL;
  }
  if (e == 2) {
    snprintf(err, errlen, "out of host memory");
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  return TPURT_OK;
}

/* The whole launch over x, on the pool. */
static void ew_run(ew_ctx *x) {
  const ew_hdr *h = x->h;
  if (h->gather) {
    int64_t nb = (h->numel + EW_BLK - 1) / EW_BLK;
    tpurt_parallel_for(nb, EW_GRAIN / EW_BLK, gather_chunk, x);
  } else {
    int64_t per = x->inner < EW_BLK ? x->inner * x->kpb : EW_BLK;
    int64_t grain = EW_GRAIN / per;
    int64_t units = x->kpb > 1 ? (x->rows + x->kpb - 1) / x->kpb : x->rows * x->bpr;
    tpurt_parallel_for(units, grain < 1 ? 1 : grain, rows_chunk, x);
  }
}

static tpurt_status k_elementwise(void *args, char *err, size_t errlen) {
  ew_ctx x;
  ew_ctx_init(&x, args, -1);
  ew_run(&x);
  return ew_status(&x, err, errlen);
}

tpurt_status tpurt__ew_kernel(void *args, char *err, size_t errlen) { return k_elementwise(args, err, errlen); }

/* ----------------------------------------------- epilogue of another kernel */

struct tpurt__ew_epi {
  ew_ctx x;
  int out;    /* tpurt__ew_into_*: the output given memory per run, or -1 */
  int64_t es; /* its element size */
};

tpurt__ew_epi *tpurt__ew_epi_begin(const void *args) {
  if (((const ew_hdr *)args)->gather) return NULL; /* per-element offsets: whole launches only */
  tpurt__ew_epi *e = malloc(sizeof *e);
  if (e) {
    ew_ctx_init(&e->x, args, -1);
    e->out = -1;
  }
  return e;
}

int tpurt__ew_out_dense(const void *args, int out) {
  const ew_hdr *h = args;
  if (out < 0 || out >= h->nout) return 0;
  const char *p = (const char *)(h + 1) + sizeof(tpurt_devptr) * (size_t)h->nops;
  const int64_t *sizes = (const int64_t *)p, *str = sizes + h->ndim + (size_t)out * (size_t)h->ndim;
  int64_t want = 1;
  for (int k = h->ndim - 1; k >= 0; k--) {
    if (sizes[k] != 1 && str[k] != want) return 0;
    want *= sizes[k];
  }
  return 1;
}

tpurt__ew_epi *tpurt__ew_into_begin(const void *args, int out) {
  const ew_hdr *h = args;
  tpurt__ew_epi *e = malloc(sizeof *e);
  if (!e) return NULL;
  ew_ctx_init(&e->x, args, out);
  e->out = out;
  e->es = (int64_t)tpurt_dtype_size((tpurt_dtype)h->dt[out]);
  return e;
}

int tpurt__ew_into_ranges(const tpurt__ew_epi *e) { return !e->x.h->gather; }

tpurt__ew_epi *tpurt__ew_epi_clone(const tpurt__ew_epi *e) {
  tpurt__ew_epi *c = malloc(sizeof *c);
  if (!c) return NULL;
  memcpy(c, e, sizeof *c);
  atomic_init(&c->x.err, 0);
  return c;
}

void tpurt__ew_into_range(tpurt__ew_epi *e, void *dst, int64_t lo, int64_t hi) {
  e->x.base[e->out] = (char *)((uintptr_t)dst - (uintptr_t)(lo * e->es));
  tpurt__ew_epi_range(e, lo, hi);
}

void tpurt__ew_into_whole(tpurt__ew_epi *e, void *dst) {
  e->x.base[e->out] = dst;
  ew_run(&e->x);
}

void tpurt__ew_epi_range(tpurt__ew_epi *e, int64_t lo, int64_t hi) {
  ew_ctx *x = &e->x;
  if (x->cg) {
    if (!atomic_load_explicit(&x->err, memory_order_relaxed)) cg_run(x, lo, hi);
    return;
  }
  char *scratch = scratch_of(x->h);
  if (!scratch) {
    atomic_store(&x->err, 2);
    return;
  }
  ew_bcache bc = bcache_of(x->h, scratch); /* one for the whole range: its blocks are the same memory */
  while (lo < hi && !atomic_load_explicit(&x->err, memory_order_relaxed)) {
    int64_t row = lo / x->inner, col = lo % x->inner, n = x->inner - col;
    if (col == 0 && x->kpb > 1 && hi - lo >= 2 * x->inner) { /* whole short rows, several to a block */
      int64_t rows = (hi - lo) / x->inner;
      multirow_rows(x, row, row + rows, scratch, &bc);
      lo += rows * x->inner;
      continue;
    }
    if (n > hi - lo) n = hi - lo;
    if (n > EW_BLK) n = EW_BLK;
    if (!row_block(x, row, col, n, scratch, &bc)) return;
    lo += n;
  }
}

tpurt_status tpurt__ew_epi_end(tpurt__ew_epi *e, char *err, size_t errlen) {
  tpurt_status st = ew_status(&e->x, err, errlen);
  free(e);
  return st;
}

/* ------------------------------------------------------------- launch */

static int kind_of(tpurt_dtype c) {
  switch (c) {
    case TPURT_F32:
    case TPURT_F64: return K_F;
    case TPURT_I64: return K_I;
    case TPURT_C64:
    case TPURT_C128: return K_C;
    default: return 0;
  }
}

static tpurt_status check_view(const tpurt_view *v, const char *what, int i) {
  if ((unsigned)v->dtype >= TPURT_NUM_DTYPES)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: %s %d has an invalid dtype %d", what, i, (int)v->dtype);
  if (v->ndim < 0 || v->ndim > TPURT_MAX_DIMS)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: %s %d has an invalid number of dimensions %d", what, i,
                      v->ndim);
  for (int k = 0; k < v->ndim; k++)
    if (v->sizes[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: %s %d has a negative size in dimension %d", what, i, k);
  return TPURT_OK;
}

static tpurt_status check_range(int dev, const tpurt_view *v, const char *what) {
  return tpurt__check_view_range(dev, v, what);
}

static tpurt_status validate(const tpurt_ew_program *prog, int nin, int nscalars) {
  if (prog->ninst < 1 || prog->ninst > TPURT_EW_MAX_INST)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: program has %d instructions (1..%d allowed)",
                      prog->ninst, TPURT_EW_MAX_INST);
  if (prog->nout < 1 || prog->nout > TPURT_EW_MAX_IO)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: program has %d outputs (1..%d allowed)", prog->nout,
                      TPURT_EW_MAX_IO);
  if (nin < 0 || nin > TPURT_EW_MAX_IO)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: %d inputs (0..%d allowed)", nin, TPURT_EW_MAX_IO);
  int kind = kind_of(prog->compute);
  if (!kind)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "elementwise: compute type %s is not one of float32, float64, int64, complex64, complex128",
                      tpurt_dtype_name(prog->compute));
  uint32_t defined = 0;
  for (int k = 0; k < prog->ninst; k++) {
    const tpurt_ew_inst *I = &prog->inst[k];
    if (I->op >= TPURT_EW_NUM_OPS || !k_ops[I->op].name)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: instruction %d has an invalid op %d", k, I->op);
    const ew_opinfo *oi = &k_ops[I->op];
    if (I->dst >= TPURT_EW_MAX_REGS)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: instruction %d (%s) writes register %d (0..%d)", k,
                        oi->name, I->dst, TPURT_EW_MAX_REGS - 1);
    for (int s = 0; s < oi->nsrc; s++) {
      if (I->src[s] >= TPURT_EW_MAX_REGS)
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: instruction %d (%s) reads register %d (0..%d)", k,
                          oi->name, I->src[s], TPURT_EW_MAX_REGS - 1);
      if (!(defined & (1u << I->src[s])))
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                          "elementwise: instruction %d (%s) reads register %d before it is written", k, oi->name,
                          I->src[s]);
    }
    if (!(oi->kinds & kind))
      return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "elementwise: %s is not supported for compute type %s", oi->name,
                        tpurt_dtype_name(prog->compute));
    if (I->op == TPURT_EW_LOAD && (I->p[0] < 0 || I->p[0] >= nin || I->p[0] != (int)I->p[0]))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: instruction %d loads input %g of %d", k, I->p[0], nin);
    if (I->op == TPURT_EW_SCALAR) {
      int need = (kind == K_C) ? 2 : 1;
      if (I->p[0] < 0 || I->p[0] + need > nscalars || I->p[0] != (int)I->p[0])
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: instruction %d reads scalar %g of %d", k, I->p[0],
                          nscalars);
    }
    if (I->op == TPURT_EW_UNIFORM && (I->p[0] < 0 || I->p[0] + 4 > nscalars || I->p[0] != (int)I->p[0]))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: instruction %d draws with scalars %g..%g of %d", k,
                        I->p[0], I->p[0] + 3, nscalars);
    if (I->op == TPURT_EW_CAST && (I->p[0] < 0 || I->p[0] >= TPURT_NUM_DTYPES))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: cast through invalid dtype %g", I->p[0]);
    defined |= 1u << I->dst;
  }
  for (int k = 0; k < prog->nout; k++) {
    if (prog->out_reg[k] >= TPURT_EW_MAX_REGS || !(defined & (1u << prog->out_reg[k])))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: output %d stores register %d, which is never written",
                        k, prog->out_reg[k]);
  }
  return TPURT_OK;
}

tpurt_status tpurt_elementwise(tpurt_stream *s, const tpurt_ew_program *prog, const tpurt_view *outs,
                               const tpurt_view *ins, int nin, const double *scalars, int nscalars) {
  return tpurt__elementwise_named(s, prog, outs, ins, nin, scalars, nscalars, NULL);
}

/* The operands of a launch in order: outputs, then inputs. */
static void ew_operands(const tpurt_view **v, const tpurt_view *outs, int nout, const tpurt_view *ins, int nin) {
  for (int i = 0; i < nout; i++) v[i] = &outs[i];
  for (int i = 0; i < nin; i++) v[nout + i] = &ins[i];
}

/* May rows of fewer than 8 elements run several to a block (row mode)
 * rather than per element (gather mode)? When every operand is laid out
 * row-major over the whole shape (its block one run), a row repeated over
 * every outer index (a kept block, ew_bcache: boxes * scale[:4]), or one
 * float a row in float compute (a row's value filled in place: x * x[:,
 * :1]): row mode reads those without per-element offsets (`X.view(-1, 4) +
 * a[:4]` ran 3.8x slower than CPU per element). Other layouts (transposed
 * short rows) gather. Strides in elements. */
static int short_rows_fit(int nd, const int64_t *sizes, int64_t (*str)[TPURT_MAX_DIMS], const tpurt_view **v,
                          int nops, tpurt_dtype compute) {
  for (int o = 0; o < nops; o++) {
    int64_t want = 1;
    int dense = 1, rep = 1;
    for (int k = nd - 1; k >= 0; k--) {
      dense &= sizes[k] == 1 || str[o][k] == want;
      want *= sizes[k];
      if (k < nd - 1) rep &= str[o][k] == 0;
    }
    int scalar_rows = str[o][nd - 1] == 0 && compute == TPURT_F32 && v[o]->dtype == TPURT_F32;
    if (!dense && !rep && !scalar_rows) return 0;
  }
  return 1;
}

/* Serializes a validated launch (ew_hdr and what follows it) into *bufp
 * when it fits in *cap bytes, else into malloc'd memory (*bufp replaced);
 * *cap becomes the size. Scalars are baked into the instructions. */
static tpurt_status ew_pack(const tpurt_ew_program *prog, const tpurt_view *outs, const tpurt_view *ins, int nin,
                            const double *scalars, unsigned char **bufp, size_t *cap) {
  int nout = prog->nout, nops = nout + nin;
  const tpurt_view *v[EW_MAX_OPS];
  ew_operands(v, outs, nout, ins, nin);
  const tpurt_view *o0 = &outs[0];
  int64_t numel = 1;
  for (int k = 0; k < o0->ndim; k++) numel *= o0->sizes[k];
  /* coalesce: drop size-1 dims, merge a dim into the next inner one when
   * every view is contiguous across the pair */
  int64_t sizes[TPURT_MAX_DIMS], str[EW_MAX_OPS][TPURT_MAX_DIMS];
  int nd = 0;
  for (int k = 0; k < o0->ndim; k++) {
    int64_t sz = o0->sizes[k];
    if (sz == 1) continue;
    if (nd > 0) {
      int ok = 1;
      for (int i = 0; i < nops && ok; i++) ok = str[i][nd - 1] == sz * v[i]->strides[k];
      if (ok) {
        sizes[nd - 1] *= sz;
        for (int i = 0; i < nops; i++) str[i][nd - 1] = v[i]->strides[k];
        continue;
      }
    }
    sizes[nd] = sz;
    for (int i = 0; i < nops; i++) str[i][nd] = v[i]->strides[k];
    nd++;
  }
  if (nd == 0) {
    sizes[0] = 1;
    for (int i = 0; i < nops; i++) str[i][0] = 1;
    nd = 1;
  }

  /* serialize */
  int nregs = 0;
  for (int k = 0; k < prog->ninst; k++) {
    if (prog->inst[k].dst + 1 > nregs) nregs = prog->inst[k].dst + 1;
  }
  size_t bytes = sizeof(ew_hdr) + sizeof(tpurt_devptr) * (size_t)nops + sizeof(int64_t) * (size_t)nd +
                 sizeof(int64_t) * (size_t)(nd * nops) + sizeof(tpurt_ew_inst) * (size_t)prog->ninst;
  unsigned char *buf = bytes <= *cap ? *bufp : malloc(bytes);
  if (!buf) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "elementwise: out of host memory");
  *bufp = buf;
  *cap = bytes;
  ew_hdr *h = (ew_hdr *)buf;
  memset(h, 0, sizeof *h);
  h->compute = prog->compute;
  h->ninst = prog->ninst;
  h->nout = nout;
  h->nin = nin;
  h->nops = nops;
  h->ndim = nd;
  h->nregs = nregs;
  h->numel = numel;
  /* rows of 8 or more elements run several to a block (row mode); shorter
   * ones too when each operand's rows are one run or one repeated row
   * (short_rows_fit), else per element (gather mode) */
  h->gather = nd > 1 && sizes[nd - 1] < 8 && !short_rows_fit(nd, sizes, str, v, nops, prog->compute);
  for (int k = 0; k < nout; k++) h->out_reg[k] = prog->out_reg[k];
  for (int i = 0; i < nops; i++) h->dt[i] = (uint8_t)v[i]->dtype;
  unsigned char *p = buf + sizeof *h;
  for (int i = 0; i < nops; i++) {
    memcpy(p, &v[i]->ptr, sizeof(tpurt_devptr));
    p += sizeof(tpurt_devptr);
  }
  memcpy(p, sizes, sizeof(int64_t) * (size_t)nd);
  p += sizeof(int64_t) * (size_t)nd;
  for (int i = 0; i < nops; i++) {
    memcpy(p, str[i], sizeof(int64_t) * (size_t)nd);
    p += sizeof(int64_t) * (size_t)nd;
  }
  tpurt_ew_inst *inst = (tpurt_ew_inst *)p;
  int kind = kind_of(prog->compute);
  for (int k = 0; k < prog->ninst; k++) {
    tpurt_ew_inst I = prog->inst[k];
    /* scalars are read now: bake them into constants */
    if (I.op == TPURT_EW_SCALAR) {
      int si = (int)I.p[0];
      I.op = TPURT_EW_CONST;
      I.p[0] = scalars[si];
      I.p[1] = kind == K_C ? scalars[si + 1] : 0.0;
      I.p[2] = 0;
      I.p[3] = 0;
    } else if (I.op == TPURT_EW_UNIFORM) {
      int si = (int)I.p[0];
      for (int q = 0; q < 4; q++) I.p[q] = scalars[si + q];
    }
    memcpy(&inst[k], &I, sizeof I);
  }
  return TPURT_OK;
}

/* The checks of a launch that need no device: program, views, shapes. */
static tpurt_status ew_check(const tpurt_ew_program *prog, const tpurt_view *outs, const tpurt_view *ins, int nin,
                             const double *scalars, int nscalars) {
  tpurt_status st;
  if (!prog || !outs || (nin > 0 && !ins) || (nscalars > 0 && !scalars))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "elementwise: NULL program, views or scalars");
  if ((st = validate(prog, nin, nscalars))) return st;
  int nout = prog->nout, nops = nout + nin;
  const tpurt_view *v[EW_MAX_OPS];
  ew_operands(v, outs, nout, ins, nin);
  for (int i = 0; i < nops; i++)
    if ((st = check_view(v[i], i < nout ? "output" : "input", i < nout ? i : i - nout))) return st;
  const tpurt_view *o0 = &outs[0];
  for (int i = 1; i < nops; i++) {
    if (v[i]->ndim != o0->ndim)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "elementwise: %s %d has %d dimensions but the output has %d (broadcast with stride 0)",
                        i < nout ? "output" : "input", i < nout ? i : i - nout, v[i]->ndim, o0->ndim);
    for (int k = 0; k < o0->ndim; k++)
      if (v[i]->sizes[k] != o0->sizes[k])
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                          "elementwise: %s %d has size %" PRId64 " in dimension %d but the output has %" PRId64,
                          i < nout ? "output" : "input", i < nout ? i : i - nout, v[i]->sizes[k], k, o0->sizes[k]);
  }
  return TPURT_OK;
}

tpurt_status tpurt__ew_args(const tpurt_ew_program *prog, const tpurt_view *outs, const tpurt_view *ins, int nin,
                            const double *scalars, int nscalars, void **args, size_t *bytes) {
  tpurt_status st = ew_check(prog, outs, ins, nin, scalars, nscalars);
  if (st) return st;
  unsigned char *buf = NULL;
  size_t cap = 0;
  if ((st = ew_pack(prog, outs, ins, nin, scalars, &buf, &cap))) return st;
  *args = buf;
  *bytes = cap;
  return TPURT_OK;
}

tpurt_status tpurt__elementwise_named(tpurt_stream *s, const tpurt_ew_program *prog, const tpurt_view *outs,
                                      const tpurt_view *ins, int nin, const double *scalars, int nscalars,
                                      const char *kname) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = ew_check(prog, outs, ins, nin, scalars, nscalars))) return st;
  int nout = prog->nout, nops = nout + nin;
  const tpurt_view *v[EW_MAX_OPS];
  ew_operands(v, outs, nout, ins, nin);
  const tpurt_view *o0 = &outs[0];
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(o0->ptr)))) return st;
  int64_t numel = 1;
  for (int k = 0; k < o0->ndim; k++) numel *= o0->sizes[k];
  if (numel == 0) return TPURT_OK;
  for (int i = 0; i < nops; i++)
    if ((st = check_range(s->dev, v[i], i < nout ? "elementwise (output)" : "elementwise (input)"))) return st;
  if (tpurt__deferring()) return tpurt__defer_record_ew(s, prog, outs, ins, nin, scalars, nscalars, kname);
  _Alignas(16) unsigned char stackbuf[2048];
  unsigned char *buf = stackbuf;
  size_t bytes = sizeof stackbuf;
  if ((st = ew_pack(prog, outs, ins, nin, scalars, &buf, &bytes))) return st;
  const char *name = kname ? kname : "elementwise";
  for (int k = prog->ninst - 1; k >= 0 && !kname; k--)
    if (prog->inst[k].op > TPURT_EW_CONST && prog->inst[k].op != TPURT_EW_UNIFORM) {
      name = k_ops[prog->inst[k].op].name;
      break;
    }
  st = tpurt_launch(s, name, k_elementwise, buf, bytes);
  if (buf != stackbuf) free(buf);
  return st;
}
