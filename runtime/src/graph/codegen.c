/*
 * codegen.c — generated C for elementwise launches: the second kernel tier
 * (DESIGN.md section 3). The block interpreter (kernels/elementwise.c)
 * makes one pass over a block of EW_BLK elements per instruction; a
 * generated kernel makes one loop over the elements with the whole program
 * in registers, compiled by the system C compiler and loaded with dlopen.
 *
 * What is specialized (the signature, the key of the in-memory table,
 * compared in full, not only its hash):
 *   - the program: compute type, every instruction's op and registers, the
 *     stored registers; op parameters that choose a code path (a cast's
 *     dtype, logit's and elu_backward's flags, round to 0 decimals) and an
 *     alpha of exactly 1 are constants; every other parameter, every
 *     constant (the launch scalars baked into CONST) and RNG seeds are read
 *     from the launch's instruction list at run time — a learning rate that
 *     changes every step keeps the kernel;
 *   - each operand's dtype and the class of its innermost stride:
 *     contiguous (a plain p[j] the compiler vectorizes), broadcast (loaded
 *     once per row) or strided (p[j * s]);
 *   - which inputs are the very memory of an output (in-place updates:
 *     the input is read through the output's pointer; every pointer is
 *     restrict, since no two of them reach the same memory).
 * Passed at run time: number of (coalesced) dimensions, sizes, strides,
 * addresses, the instruction list. A training step's launches of one
 * program over tensors of other shapes share the kernel.
 *
 * Bit-identical to the interpreter by construction: the generated source
 * embeds the interpreter's own headers (ew_exec.h: instruction bodies,
 * special functions, float approximations, the load / store conversion
 * tables; dtype_conv.h: generic casts), whose texts are compiled into the
 * runtime (cg_sources.c, made by cmake/embed_sources.cmake) so an installed
 * runtime needs no source tree. Each instruction calls the interpreter's
 * body for its compute type with n = 1 and a constant op, always_inline:
 * the compiler folds the switch to that op's expression. The compile flags
 * are the runtime's numerics flags (-std=c11 -O3 -fno-math-errno
 * -ffp-contract=off, no -ffast-math; the no-trapping-math pragma of
 * elementwise.c, which changes no result); libm calls are the same calls
 * in the same process. The kernels run on the same worker threads as the
 * interpreter, so the FP environment (FTZ/DAZ) is theirs. Baked constants
 * are values the interpreter computes with exactly (1 * y == y), or branch
 * selectors. Each instruction's value passes a fold barrier (CG_BARRIER),
 * so no expression is folded into the next one's, as none can across the
 * interpreter's passes. The one freedom left is the compiler's in both
 * tiers: the sign of a NaN an op returns where it meets two NaNs (which
 * operand of a commutative instruction comes first) or where a negation
 * inside an op meets one — chosen per loop, it differs between the
 * interpreter's own vector and scalar loops the same way.
 *
 * What is declined (the interpreter runs it, counted as not generated):
 * an output overlapping another operand other than exactly (same address,
 * strides, dtype), outputs with stride-0 dimensions. Element order and
 * per-element values then cannot differ from the interpreter's blocks.
 *
 * Flow: a launch looks its signature up (tpurt__codegen_find). Ready: the
 * kernel runs the launch over the element ranges the interpreter's chunks
 * cover (same thread split). Missing: the entry is queued for the compile
 * thread (one dedicated thread, not the device pool) and the interpreter
 * runs this launch; later launches find it ready. TORCH_TPU_CODEGEN=sync
 * compiles on the launching thread (tests: the first launch is compiled);
 * TORCH_TPU_CODEGEN=0 turns generation off. Failures (no compiler, a
 * compile error, dlopen) mark the signature failed: the interpreter serves
 * it, one "torch_tpu: " warning per kind of failure says what happened.
 *
 * Gate: launches with at least two compute instructions (CG_MIN_OPS;
 * TORCH_TPU_CODEGEN_MIN_OPS for measurements), decided by measurement
 * (tpurt_bench_codegen, 2 threads, Xeon AVX-512, medians of 7): a one-op
 * launch (x + y) gains 1.08x at 256K elements and 1.11x at 16M — the
 * interpreter already reads its inputs in place and writes its result
 * straight to a dense output — for about a second of compiler time per
 * signature, of which strict mode makes one per op, dtype and layout; an
 * 8-op arithmetic chain gains 2.06x at 256K and 1.83x at 16M (0.91x of
 * the STREAM triad's bandwidth), an 8-op chain with tanh and sigmoid 1.05x
 * and 1.33x (both tiers run the same vector math, which bounds it). A
 * strict launch of a multi-instruction program (dropout, the norm
 * kernels' elementwise parts) is compiled like a fused one.
 *
 * Compiler: $CC, else cc, found once; -march= the x86-64 ISA level of the
 * runtime's kernels (cpu.c's level at run time, TORCH_TPU_ISA's cap
 * included; never the build host's), so a kernel built on one host is
 * valid on any host of the same level (the kernel cache's key holds it).
 * Kernels compile in a private temporary directory (mkdtemp); the
 * persistent kernel cache (graph/kcache.c) is asked first and given every
 * fresh object (cache_lookup / cache_store, the one place it plugs in):
 * its key is the whole generated source (the embedded headers included),
 * the compiler and its version, the flags and the ISA.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../kernels/fused.h"
#include "codegen.h"
#include "kcache.h"

extern char **environ;

/* The environment compilers run with, and the settings codegen reads: a
 * copy of the process's, taken when the runtime initializes (tpurt_init).
 * Compiles run on a background thread while the program may change its
 * environment, and glibc's environ is not safe to read while another
 * thread writes it (setenv reallocates the array: a reader, posix_spawn
 * among them, can walk freed memory); so no compile reads environ, getenv
 * or PATH after that. */
static char **g_env;

void tpurt__codegen_snapshot_env(void) {
  if (g_env || !environ) return;
  size_t n = 0;
  while (environ[n]) n++;
  char **e = calloc(n + 1, sizeof *e);
  if (!e) return;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if ((e[k] = strdup(environ[i]))) k++;
  g_env = e;
}

/* name's value in the snapshot (the live environment before tpurt_init). */
static const char *env_get(const char *name) {
  if (!g_env) return getenv(name);
  size_t n = strlen(name);
  for (char **e = g_env; *e; e++)
    if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

#define CG_MIN_OPS 2
#define CG_FLAGS "-std=c11 -D_GNU_SOURCE -O3 -fno-math-errno -ffp-contract=off -fPIC -shared -fvisibility=hidden"
#define CG_BUCKETS 1024
#define CG_UCHUNK 256 /* uniform draws per call in kernels with RNG */

/* --------------------------------------------------- embedded sources */

typedef struct tpurt__cg_file {
  const char *path;
  const unsigned char *text;
  size_t len;
} tpurt__cg_file;
extern const tpurt__cg_file tpurt__cg_files[]; /* cg_sources.c (generated at build time) */

typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->n + n + 1) c *= 2;
    char *q = realloc(b->p, c);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = c;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }
__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    sb_add(b, tmp, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->oom = 1;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb_add(b, big, (size_t)n);
  free(big);
}

static const tpurt__cg_file *find_file(const char *path) {
  for (const tpurt__cg_file *f = tpurt__cg_files; f->path; f++)
    if (strcmp(f->path, path) == 0) return f;
  return NULL;
}

/* dir + "/" + rel with "." and ".." resolved, into out */
static void join_path(const char *dir, const char *rel, char *out, size_t n) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s%s%s", dir, *dir ? "/" : "", rel);
  const char *seg[64];
  size_t len[64];
  int k = 0;
  for (const char *s = tmp; *s;) {
    const char *e = strchr(s, '/');
    size_t l = e ? (size_t)(e - s) : strlen(s);
    if (l == 2 && s[0] == '.' && s[1] == '.') {
      if (k) k--;
    } else if (l && !(l == 1 && s[0] == '.') && k < 64) {
      seg[k] = s;
      len[k++] = l;
    }
    s += l + (e ? 1 : 0);
  }
  size_t o = 0;
  out[0] = 0;
  for (int i = 0; i < k && o + len[i] + 2 < n; i++) {
    if (i) out[o++] = '/';
    memcpy(out + o, seg[i], len[i]);
    o += len[i];
    out[o] = 0;
  }
}

/* Templates included once per instantiation; every other header once. */
static int is_template(const char *path) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  return !strcmp(b, "ew_real.h") || !strcmp(b, "ew_complex.h") || !strcmp(b, "ew_loops.h");
}

/* Appends file `path` with its quoted includes expanded in place (as the
 * preprocessor would find them: next to the including file, else in
 * include/); 0 when a file is missing. */
static int expand(sbuf *b, const char *path, const char **done, int *ndone, int depth) {
  const tpurt__cg_file *f = find_file(path);
  if (!f || depth > 16) return 0;
  if (!is_template(path)) {
    for (int i = 0; i < *ndone; i++)
      if (!strcmp(done[i], f->path)) return 1;
    if (*ndone < 64) done[(*ndone)++] = f->path;
  }
  char dir[512];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = 0;
  else
    dir[0] = 0;
  sb_printf(b, "#line 1 \"%s\"\n", path);
  const char *s = (const char *)f->text, *end = s + f->len;
  int line = 1;
  while (s < end) {
    const char *e = memchr(s, '\n', (size_t)(end - s));
    const char *next = e ? e + 1 : end;
    const char *t = s;
    while (t < next && (*t == ' ' || *t == '\t')) t++;
    if (next - t > 10 && !strncmp(t, "#include \"", 10)) {
      const char *q = t + 10, *qe = memchr(q, '"', (size_t)(next - q));
      char name[256], full[512];
      if (!qe || (size_t)(qe - q) >= sizeof name) return 0;
      memcpy(name, q, (size_t)(qe - q));
      name[qe - q] = 0;
      join_path(dir, name, full, sizeof full);
      if (!find_file(full)) join_path("include", name, full, sizeof full);
      if (!expand(b, full, done, ndone, depth + 1)) return 0;
      sb_printf(b, "#line %d \"%s\"\n", line + 1, path);
    } else {
      sb_add(b, s, (size_t)(next - s));
    }
    if (next == end && (next == s || next[-1] != '\n')) sb_add(b, "\n", 1);
    s = next;
    line++;
  }
  return 1;
}

/* ------------------------------------------------------------ signatures */

enum { CLS_BCAST = 0, CLS_CONTIG = 1, CLS_STRIDED = 2 };

typedef struct cg_inst {
  uint16_t op;
  uint8_t dst, src[3];
  uint8_t bake; /* bit q: p[q] is a constant of the kernel (else 0 here, read at run time) */
  uint8_t pad;
  double p[4];
} cg_inst;

typedef struct cg_sig {
  uint8_t compute, nout, nin, ninst;
  uint8_t dt[TPURT__CG_MAX_OPS];
  uint8_t cls[TPURT__CG_MAX_OPS];
  uint8_t alias[TPURT_EW_MAX_IO]; /* input i is output alias[i] - 1's memory (0: none) */
  uint8_t out_reg[TPURT_EW_MAX_IO];
  cg_inst inst[TPURT_EW_MAX_INST];
} cg_sig;

static size_t sig_len(const cg_sig *s) { return offsetof(cg_sig, inst) + (size_t)s->ninst * sizeof(cg_inst); }

static uint64_t fnv(const void *p, size_t n) {
  const unsigned char *c = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

/* which parameters of an instruction become constants of the kernel */
static unsigned bake_of(const tpurt_ew_inst *I, double out[4]) {
  memset(out, 0, 4 * sizeof(double));
  switch (I->op) {
    case TPURT_EW_LOAD:
    case TPURT_EW_CAST:
    case TPURT_EW_NEXTAFTER: out[0] = I->p[0]; return 1u;
    case TPURT_EW_LOGIT: out[1] = I->p[1] != 0; return 2u;
    case TPURT_EW_ELU_BACKWARD: out[3] = I->p[3] != 0; return 8u;
    case TPURT_EW_ROUND: return I->p[0] == 0 ? 1u : 0u;
    case TPURT_EW_ADD:
    case TPURT_EW_SUB:
    case TPURT_EW_ADDCMUL:
    case TPURT_EW_ADDCDIV:
      if (I->p[0] == 1.0) {
        out[0] = 1.0;
        return 1u;
      }
      return 0u;
    default: return 0u;
  }
}

/* ------------------------------------------------------------ C names */

static const struct {
  const char *name, *ctype;
} k_dt[TPURT_NUM_DTYPES] = {
    [TPURT_BOOL] = {"TPURT_BOOL", "uint8_t"},   [TPURT_U8] = {"TPURT_U8", "uint8_t"},
    [TPURT_I8] = {"TPURT_I8", "int8_t"},        [TPURT_I16] = {"TPURT_I16", "int16_t"},
    [TPURT_I32] = {"TPURT_I32", "int32_t"},     [TPURT_I64] = {"TPURT_I64", "int64_t"},
    [TPURT_F16] = {"TPURT_F16", "uint16_t"},    [TPURT_BF16] = {"TPURT_BF16", "uint16_t"},
    [TPURT_F32] = {"TPURT_F32", "float"},       [TPURT_F64] = {"TPURT_F64", "double"},
    [TPURT_C64] = {"TPURT_C64", "c64_t"},       [TPURT_C128] = {"TPURT_C128", "c128_t"},
    [TPURT_U16] = {"TPURT_U16", "uint16_t"},    [TPURT_U32] = {"TPURT_U32", "uint32_t"},
    [TPURT_U64] = {"TPURT_U64", "uint64_t"},
};

typedef struct {
  const char *ct, *exec, *ldtab, *ldconv, *sttab, *stconv;
} ctinfo;

static int ct_info(int compute, ctinfo *c) {
  switch (compute) {
    case TPURT_F32: *c = (ctinfo){"float", "exec_f32", "EW_LOAD_REAL", "CONV_F32", "EW_STORE_REAL", "F2I"}; return 1;
    case TPURT_F64: *c = (ctinfo){"double", "exec_f64", "EW_LOAD_REAL", "CONV_F64", "EW_STORE_REAL", "F2I"}; return 1;
    case TPURT_I64: *c = (ctinfo){"int64_t", "exec_i64", "EW_LOAD_REAL", "CONV_I64", "EW_STORE_REAL", "ID_I"}; return 1;
    case TPURT_C64: *c = (ctinfo){"c64_t", "exec_c64", "EW_LOAD_CPLX", "CONV_C64", "EW_STORE_CPLX", "crealf"}; return 1;
    case TPURT_C128:
      *c = (ctinfo){"c128_t", "exec_c128", "EW_LOAD_CPLX", "CONV_C128", "EW_STORE_CPLX", "creal"};
      return 1;
    default: return 0;
  }
}

/* the interpreter's CONST value for a compute type (elementwise.c, run_block) */
static const char *const_expr(int compute) {
  switch (compute) {
    case TPURT_F32: return "(float)ins[%d].p[0]";
    case TPURT_F64: return "ins[%d].p[0]";
    case TPURT_I64: return "tpurt__f2i64(ins[%d].p[0])";
    case TPURT_C64: return "(float)ins[%1$d].p[0] + (float)ins[%1$d].p[1] * I_UNIT";
    default: return "ins[%1$d].p[0] + ins[%1$d].p[1] * I_UNIT";
  }
}

static const char *g_inject; /* test hook: appended to generated sources */

/* The kernel's C source for a signature (malloc'd), NULL when a header is
 * missing or out of memory. */
static char *gen_source(const cg_sig *s) {
  ctinfo c;
  if (!ct_info(s->compute, &c)) return NULL;
  sbuf b = {0};
  int nops = s->nout + s->nin;
  sb_puts(&b,
          "/* torch_tpu generated elementwise kernel (runtime/src/graph/codegen.c) */\n"
          "#pragma GCC optimize(\"no-trapping-math\")\n"
          "#define TPURT_CG_GENERATED 1\n"
          "#define EW_FN_ATTR inline __attribute__((always_inline))\n");
  const char *done[64];
  int ndone = 0;
  if (!expand(&b, "src/kernels/ew_exec.h", done, &ndone, 0) || !expand(&b, "src/dtype_conv.h", done, &ndone, 0) ||
      !expand(&b, "src/graph/codegen.h", done, &ndone, 0)) {
    free(b.p);
    return NULL;
  }
  sb_puts(&b, "#line 1 \"kernel\"\n");
  /* Every value an instruction (or a load) produces passes a barrier: its
   * bits XORed with a zero the compiler cannot see (a->zero), so no fold
   * reaches from one instruction's expression into the next (-(a / b) ->
   * (-a) / b and the like are exact but for a NaN's sign), as none can
   * across the interpreter's passes. One vector XOR; the loop still
   * vectorizes (__builtin_assoc_barrier did not survive vectorization). */
  sb_puts(&b, "typedef union { float f; uint32_t u; } cg_f32bits;\n"
              "typedef union { double f; uint64_t u; } cg_f64bits;\n"
              "static inline float cg_barf(float v, uint64_t z) { cg_f32bits c; c.f = v; c.u ^= (uint32_t)z; return c.f; }\n"
              "static inline double cg_bard(double v, uint64_t z) { cg_f64bits c; c.f = v; c.u ^= z; return c.f; }\n");
  if (s->compute == TPURT_I64)
    sb_puts(&b, "#define CG_BARRIER(v) ((void)0)\n"); /* integer folds are exact */
  else if (s->compute == TPURT_C64)
    sb_puts(&b, "#define CG_BARRIER(v) (__real__(v) = cg_barf(__real__(v), zero), __imag__(v) = cg_barf(__imag__(v), zero))\n");
  else if (s->compute == TPURT_C128)
    sb_puts(&b, "#define CG_BARRIER(v) (__real__(v) = cg_bard(__real__(v), zero), __imag__(v) = cg_bard(__imag__(v), zero))\n");
  else
    sb_printf(&b, "#define CG_BARRIER(v) ((v) = %s((v), zero))\n", s->compute == TPURT_F32 ? "cg_barf" : "cg_bard");
  sb_printf(&b, "#define CG_LD(DT, D, ST, EXPR) static inline DT cg_ld_##D(ST v) { return (EXPR); }\n%s(CG_LD, %s, %s)\n",
            c.ldtab, c.ct, c.ldconv);
  sb_printf(&b,
            "#define CG_ST(CT, D, DST, EXPR) static inline DST cg_st_##D(CT v) { return (DST)(EXPR); }\n%s(CG_ST, %s, %s)\n",
            c.sttab, c.ct, c.stconv);
  sb_puts(&b, "__attribute__((visibility(\"default\"))) int " TPURT__CG_SYMBOL
              "(const tpurt__cg_args *a, int64_t lo, int64_t hi) {\n"
              "  const tpurt_ew_inst *ins = a->inst;\n  const uint64_t zero = a->zero;\n  int bad = 0;\n  (void)zero;\n");
  int uniform = 0;
  for (int k = 0; k < s->ninst; k++) {
    const cg_inst *I = &s->inst[k];
    if (I->op == TPURT_EW_LOAD) continue;
    if (I->op == TPURT_EW_UNIFORM) {
      uniform = 1;
      continue;
    }
    if (I->op == TPURT_EW_CONST) {
      sb_printf(&b, "  const %s c%d = ", c.ct, k);
      sb_printf(&b, const_expr(s->compute), k);
      sb_puts(&b, ";\n");
      continue;
    }
    sb_printf(&b, "  tpurt_ew_inst L%d = ins[%d];\n  L%d.op = %u;\n", k, k, k, (unsigned)I->op);
    for (int q = 0; q < 4; q++)
      if (I->bake >> q & 1) sb_printf(&b, "  L%d.p[%d] = %a;\n", k, q, I->p[q]);
  }
  /* which inputs the program reads */
  int used[TPURT__CG_MAX_OPS] = {0};
  for (int k = 0; k < s->ninst; k++)
    if (s->inst[k].op == TPURT_EW_LOAD) used[s->nout + (int)s->inst[k].p[0]] = 1;
  sb_printf(&b,
            "  const int nd = a->ndim, in = nd - 1;\n"
            "  int64_t idx[TPURT_MAX_DIMS], off[%d];\n"
            "  int64_t rem = lo;\n"
            "  for (int o = 0; o < %d; o++) off[o] = 0;\n"
            "  for (int d = in; d >= 0; d--) {\n"
            "    idx[d] = rem %% a->sizes[d];\n"
            "    rem /= a->sizes[d];\n"
            "    for (int o = 0; o < %d; o++) off[o] += idx[d] * a->bstr[o][d];\n"
            "  }\n"
            "  int64_t rs[%d];\n"
            "  for (int o = 0; o < %d; o++) rs[o] = in > 0 ? a->bstr[o][in - 1] : 0;\n"
            "  while (lo < hi) {\n"
            "    int64_t n = a->sizes[in] - idx[in];\n"
            "    if (n > hi - lo) n = hi - lo;\n"
            "    int64_t rows = 1;\n"
            "    if (in > 0 && n == a->sizes[in]) {\n"
            "      rows = (hi - lo) / n;\n"
            "      if (rows > a->sizes[in - 1] - idx[in - 1]) rows = a->sizes[in - 1] - idx[in - 1];\n"
            "    }\n"
            "    for (int64_t r = 0; r < rows; r++) {\n"
            "    const int64_t lr = lo + r * n;\n"
            "    (void)lr;\n",
            nops, nops, nops, nops, nops);
  /* pointers of this run */
  for (int o = 0; o < nops; o++) {
    int out = o < s->nout;
    if (!out && (!used[o] || s->alias[o - s->nout])) continue;
    /* Every pointer is restrict, an in-place output's too: the input that
     * is its very memory is read through it (never through a pointer of
     * its own), and any other overlap was declined. For the same reason
     * the element loop carries no dependence (ivdep below): element j
     * reads and writes only element j of every operand. gcc 12 does not
     * take restrict of pointers made inside the loop nest, and versions a
     * loop for aliasing only up to 10 pairs of pointers: a fused add +
     * dropout + add updated in place (5 pointers and the uniforms' buffer)
     * stayed scalar, 2.4x the interpreter's time, until told. */
    const char *ty = k_dt[s->dt[o]].ctype;
    sb_printf(&b, "    %s%s *restrict q%d = (%s%s *)(a->base[%d] + off[%d] + r * rs[%d]);\n", out ? "" : "const ", ty, o,
              out ? "" : "const ", ty, o, o, o);
    if (s->cls[o] == CLS_STRIDED)
      sb_printf(&b, "    const int64_t s%d = a->bstr[%d][in] / (int64_t)sizeof(%s);\n", o, o, ty);
    if (!out && s->cls[o] == CLS_BCAST)
      sb_printf(&b, "    const %s b%d = cg_ld_%s(q%d[0]);\n", c.ct, o, k_dt[s->dt[o]].name, o);
  }
  if (uniform) {
    sb_printf(&b,
              "    for (int64_t j0 = 0; j0 < n; j0 += %d) {\n"
              "      const int m = n - j0 < %d ? (int)(n - j0) : %d;\n",
              CG_UCHUNK, CG_UCHUNK, CG_UCHUNK);
    for (int k = 0; k < s->ninst; k++)
      if (s->inst[k].op == TPURT_EW_UNIFORM)
        sb_printf(&b, "      float u%d[%d];\n      a->uniform(ins[%d].p, lr + j0, m, u%d);\n", k, CG_UCHUNK, k, k);
    sb_puts(&b, "#pragma GCC ivdep\n      for (int64_t j = j0; j < j0 + m; j++) {\n");
  } else {
    sb_puts(&b, "#pragma GCC ivdep\n    for (int64_t j = 0; j < n; j++) {\n");
  }
  int regv[TPURT_EW_MAX_REGS];
  for (int r = 0; r < TPURT_EW_MAX_REGS; r++) regv[r] = -1;
  for (int k = 0; k < s->ninst; k++) {
    const cg_inst *I = &s->inst[k];
    if (I->op == TPURT_EW_LOAD) {
      int op = s->nout + (int)I->p[0];
      int via = s->alias[op - s->nout] ? s->alias[op - s->nout] - 1 : op; /* the pointer it is read through */
      const char *dn = k_dt[s->dt[op]].name;
      if (s->cls[op] == CLS_BCAST)
        sb_printf(&b, "      const %s v%d = b%d;\n", c.ct, k, op);
      else if (s->cls[op] == CLS_CONTIG)
        sb_printf(&b, "      %s v%d = cg_ld_%s(q%d[j]);\n      CG_BARRIER(v%d);\n", c.ct, k, dn, via, k);
      else
        sb_printf(&b, "      %s v%d = cg_ld_%s(q%d[j * s%d]);\n      CG_BARRIER(v%d);\n", c.ct, k, dn, via, via, k);
    } else if (I->op == TPURT_EW_CONST) {
      sb_printf(&b, "      const %s v%d = c%d;\n", c.ct, k, k);
    } else if (I->op == TPURT_EW_UNIFORM) {
      sb_printf(&b, "      const %s v%d = (%s)u%d[j - j0];\n", c.ct, k, c.ct, k);
    } else {
      int ns = tpurt__ew_nsrc(I->op);
      int a0 = regv[I->src[0]];
      int a1 = ns > 1 ? regv[I->src[1]] : a0, a2 = ns > 2 ? regv[I->src[2]] : a0;
      if (ns < 1 || a0 < 0 || a1 < 0 || a2 < 0) {
        free(b.p);
        return NULL;
      }
      sb_printf(&b, "      %s v%d;\n      %s%s(&L%d, &v%d, &v%d, &v%d, &v%d, 1);\n      CG_BARRIER(v%d);\n", c.ct,
                k, s->compute == TPURT_I64 ? "bad |= " : "", c.exec, k, k, a0, a1, a2, k);
    }
    regv[I->dst] = k;
  }
  for (int o = 0; o < s->nout; o++) {
    int v = regv[s->out_reg[o]];
    if (v < 0) {
      free(b.p);
      return NULL;
    }
    if (s->cls[o] == CLS_CONTIG)
      sb_printf(&b, "      q%d[j] = cg_st_%s(v%d);\n", o, k_dt[s->dt[o]].name, v);
    else
      sb_printf(&b, "      q%d[j * s%d] = cg_st_%s(v%d);\n", o, o, k_dt[s->dt[o]].name, v);
  }
  sb_puts(&b, uniform ? "      }\n    }\n" : "    }\n");
  sb_printf(&b,
            "    }\n"
            "    const int k = rows > 1 ? in - 1 : in; /* whole rows: dim in - 1 moves */\n"
            "    const int64_t m = rows > 1 ? rows : n;\n"
            "    lo += rows * n;\n"
            "    for (int o = 0; o < %d; o++) off[o] += m * a->bstr[o][k];\n"
            "    idx[k] += m;\n"
            "    if (idx[k] < a->sizes[k]) continue;\n"
            "    for (int o = 0; o < %d; o++) off[o] -= idx[k] * a->bstr[o][k];\n"
            "    idx[k] = 0;\n"
            "    for (int d = k - 1; d >= 0; d--) {\n"
            "      idx[d]++;\n"
            "      for (int o = 0; o < %d; o++) off[o] += a->bstr[o][d];\n"
            "      if (idx[d] < a->sizes[d]) break;\n"
            "      for (int o = 0; o < %d; o++) off[o] -= idx[d] * a->bstr[o][d];\n"
            "      idx[d] = 0;\n"
            "    }\n"
            "  }\n"
            "  return bad;\n"
            "}\n",
            nops, nops, nops, nops);
  if (g_inject) sb_puts(&b, g_inject);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

/* ------------------------------------------------------------- state */

enum { ST_PENDING = 0, ST_READY = 1, ST_FAILED = 2 };
enum { MODE_OFF = 0, MODE_ASYNC = 1, MODE_SYNC = 2 };

typedef struct cg_entry {
  struct cg_entry *next, *next_job;
  uint64_t hash;
  size_t len;
  _Atomic int state;
  _Atomic(tpurt__cg_fn) fn;
  void *handle;
  cg_sig sig; /* sig_len(&sig) bytes used */
} cg_entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_job_cv = PTHREAD_COND_INITIALIZER, g_idle_cv = PTHREAD_COND_INITIALIZER;
static cg_entry *g_table[CG_BUCKETS];
static cg_entry *g_jobs, **g_jobs_tail = &g_jobs;
static int g_busy, g_thread;
static int g_mode = -1; /* -1: environment not read yet */
static int g_min_ops = CG_MIN_OPS;

/* the compiler, found once (under g_cc_mu) */
static pthread_mutex_t g_cc_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_cc_state; /* 0 unknown, 1 usable, -1 unavailable */
static char g_cc_exe[4096];
static char g_cc[256], g_cc_version[256], g_cc_why[1024], g_march[64], g_flags[512], g_tmpdir[256];
static unsigned g_warned; /* bit per kind of failure already reported */

static _Atomic uint64_t g_n_kernels, g_n_failures, g_n_declined, g_n_compiled, g_n_interp;
static double g_compile_secs; /* under g_mu */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { W_NOCC = 1, W_COMPILE = 2, W_DLOPEN = 4, W_TMP = 8 };
static void warn_once(unsigned kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Atomic int g_exiting; /* the process exits: a compile under way loses its files, silently */
static void warn_once(unsigned kind, const char *fmt, ...) {
  if (atomic_load(&g_exiting)) return;
  pthread_mutex_lock(&g_cc_mu);
  int first = !(g_warned & kind);
  g_warned |= kind;
  pthread_mutex_unlock(&g_cc_mu);
  if (!first) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "torch_tpu: %s\n", msg);
}

static int parse_mode(const char *e) {
  if (!e || !*e) return MODE_ASYNC;
  if (!strcmp(e, "0") || !strcasecmp(e, "off") || !strcasecmp(e, "false") || !strcasecmp(e, "no")) return MODE_OFF;
  if (!strcasecmp(e, "sync")) return MODE_SYNC;
  return MODE_ASYNC;
}

static int mode(void) {
  int m = __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE);
  if (m < 0) {
    const char *g = env_get("TORCH_TPU_CODEGEN_MIN_OPS"); /* the gate, for measurements */
    __atomic_store_n(&g_min_ops, g && atoi(g) > 0 ? atoi(g) : CG_MIN_OPS, __ATOMIC_RELAXED);
    m = parse_mode(env_get("TORCH_TPU_CODEGEN"));
    __atomic_store_n(&g_mode, m, __ATOMIC_RELEASE);
  }
  return m;
}

int tpurt__codegen_min_ops(void) { return mode() == MODE_OFF ? 0 : __atomic_load_n(&g_min_ops, __ATOMIC_RELAXED); }

/* The program `name` names: itself when it has a slash, else the first
 * executable of that name on the snapshot's PATH (else name itself: the
 * spawn then fails with ENOENT). */
static void find_in_path(const char *name, char *out, size_t n) {
  snprintf(out, n, "%s", name);
  if (strchr(name, '/')) return;
  const char *path = env_get("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  while (*path) {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    char cand[4096];
    if (len == 0) snprintf(cand, sizeof cand, "./%s", name);
    else snprintf(cand, sizeof cand, "%.*s/%s", (int)len, path, name);
    if (access(cand, X_OK) == 0) {
      snprintf(out, n, "%s", cand);
      return;
    }
    if (!end) break;
    path = end + 1;
  }
}

/* Runs argv (argv[0] found in the snapshot's PATH: g_cc_exe) with stdout
 * and stderr into `log`; the exit status (-1: could not start, errno in
 * *err). */
static int run_cmd(char *const argv[], const char *log, int *err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int rc = posix_spawn(&pid, g_cc_exe, &fa, NULL, argv, g_env ? g_env : environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) {
    *err = rc;
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 0; /* reaped elsewhere (SIGCHLD ignored): judge by the output */
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* first `lines` lines of a file, into buf */
static void read_head(const char *path, char *buf, size_t n, int lines) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t o = 0;
  char line[512];
  while (lines-- > 0 && fgets(line, sizeof line, f)) {
    size_t l = strlen(line);
    if (o + l + 1 >= n) break;
    memcpy(buf + o, line, l);
    o += l;
    buf[o] = 0;
  }
  fclose(f);
  while (o && (buf[o - 1] == '\n' || buf[o - 1] == ' ')) buf[--o] = 0;
}

/* The x86-64 ISA level of the kernels: the runtime's level in force
 * (cpu.c: detected at run time, capped by TORCH_TPU_ISA) as the compiler's
 * -march level, with the features that level needs checked as well. */
static const char *isa_level(void) {
#if defined(__x86_64__)
  int lv = tpurt__isa_level();
  __builtin_cpu_init();
  int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("bmi2");
  int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  if (lv >= TPURT__ISA_AVX512 && v4) return "x86-64-v4";
  if (lv >= TPURT__ISA_AVX2 && v3) return "x86-64-v3";
  return "x86-64";
#else
  return "";
#endif
}

/* TORCH_TPU_CODEGEN_KEEP=1: sources and objects stay in the temporary
 * directory (debugging) */
static int keep_files(void) {
  const char *e = env_get("TORCH_TPU_CODEGEN_KEEP");
  return e && *e && strcmp(e, "0");
}

static pid_t g_tmp_pid;

/* at exit: files of a compile still under way, then the directory (only
 * the process that made it: a forked child shares the path) */
static void cleanup_tmpdir(void) {
  atomic_store(&g_exiting, 1);
  if (!g_tmpdir[0] || getpid() != g_tmp_pid || keep_files()) return;
  DIR *d = opendir(g_tmpdir);
  if (d) {
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)))
      if (e->d_name[0] != '.') {
        snprintf(p, sizeof p, "%s/%s", g_tmpdir, e->d_name);
        unlink(p);
      }
    closedir(d);
  }
  rmdir(g_tmpdir);
}

/* Finds the compiler and a temporary directory once; 1 when usable. */
static int compiler_ready(void) {
  pthread_mutex_lock(&g_cc_mu);
  if (g_cc_state) {
    int s = g_cc_state;
    pthread_mutex_unlock(&g_cc_mu);
    return s > 0;
  }
  const char *cc = env_get("CC");
  snprintf(g_cc, sizeof g_cc, "%s", cc && *cc ? cc : "cc");
  find_in_path(g_cc, g_cc_exe, sizeof g_cc_exe);
  snprintf(g_march, sizeof g_march, "%s", isa_level());
  const char *extra = env_get("TORCH_TPU_CODEGEN_FLAGS"); /* appended (experiments; part of the cache key) */
  snprintf(g_flags, sizeof g_flags, "%s%s%s%s", CG_FLAGS, g_march[0] ? " -march=" : "", g_march,
           extra && *extra ? " " : "");
  if (extra && *extra) snprintf(g_flags + strlen(g_flags), sizeof g_flags - strlen(g_flags), "%s", extra);
  if (!g_tmpdir[0]) {
    const char *t = env_get("TMPDIR");
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "%s/torch_tpu-codegen-XXXXXX", t && *t ? t : "/tmp");
    if (mkdtemp(tmpl)) {
      snprintf(g_tmpdir, sizeof g_tmpdir, "%s", tmpl);
      g_tmp_pid = getpid();
      static int registered;
      if (!registered++) atexit(cleanup_tmpdir);
    }
  }
  int state = -1;
  if (!g_tmpdir[0]) {
    snprintf(g_cc_why, sizeof g_cc_why, "no temporary directory (%s)", strerror(errno));
  } else {
    char log[320];
    snprintf(log, sizeof log, "%s/version.txt", g_tmpdir);
    char *argv[] = {g_cc, "--version", NULL};
    int err = 0, rc = run_cmd(argv, log, &err);
    if (rc < 0) {
      snprintf(g_cc_why, sizeof g_cc_why, "C compiler '%s' not found (%s)", g_cc, strerror(err));
    } else if (rc != 0) {
      snprintf(g_cc_why, sizeof g_cc_why, "C compiler '%s' does not run (`%s --version` exited with %d)", g_cc, g_cc,
               rc);
    } else {
      read_head(log, g_cc_version, sizeof g_cc_version, 1);
      state = 1;
    }
    unlink(log);
  }
  g_cc_state = state;
  pthread_mutex_unlock(&g_cc_mu);
  if (state < 0)
    warn_once(W_NOCC, "generated kernels are unavailable: %s; the elementwise interpreter runs every program",
              g_cc_why);
  return state > 0;
}

/* ---------------------------------------------------- kernel cache plug */

/* What a compiled kernel depends on (the persistent kernel cache's key). */
typedef struct cg_key {
  const char *source, *compiler, *compiler_version, *flags, *isa;
} cg_key;

/* The one place the persistent kernel cache (kcache.c) plugs in: a shared
 * object for the key (its path into so_path, 1) or a miss (0); and the
 * file of a fresh compile, stored under the key. A hit's descriptor stays
 * open for the life of the process (the library stays loaded: kcache.h). */
static int cache_lookup(const cg_key *key, char *so_path, size_t n) {
  tpurt__kkey k = {key->source, key->compiler, key->compiler_version, key->flags, key->isa};
  tpurt__kcache_so so;
  if (tpurt__kcache_lookup(&k, &so) != TPURT__KCACHE_HIT) return 0;
  snprintf(so_path, n, "%s", so.path);
  return 1;
}
static void cache_store(const cg_key *key, const char *so_path, double seconds) {
  FILE *f = fopen(so_path, "rb");
  if (!f) return;
  char *buf = NULL;
  long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (len > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
    tpurt__kkey k = {key->source, key->compiler, key->compiler_version, key->flags, key->isa};
    tpurt__kcache_store(&k, buf, (size_t)len, seconds); /* a failure is the cache's to report; the kernel is loaded */
  }
  free(buf);
  fclose(f);
}

/* ------------------------------------------------------------ compile */

static _Atomic uint64_t g_seq;

/* Generates, compiles and loads e's kernel; sets its state. */
static void compile_entry(cg_entry *e) {
  double t0 = now_s();
  int ok = 0, from_cache = 0;
  if (!compiler_ready()) goto done;
  char *src = gen_source(&e->sig);
  if (!src) {
    warn_once(W_COMPILE, "code generation failed (embedded headers missing or out of memory); the interpreter runs "
                         "the program");
    goto done;
  }
  uint64_t id = atomic_fetch_add(&g_seq, 1);
  char cpath[320], sopath[320], log[320];
  snprintf(cpath, sizeof cpath, "%s/k%llu.c", g_tmpdir, (unsigned long long)id);
  snprintf(sopath, sizeof sopath, "%s/k%llu.so", g_tmpdir, (unsigned long long)id);
  snprintf(log, sizeof log, "%s/k%llu.log", g_tmpdir, (unsigned long long)id);
  cg_key key = {src, g_cc, g_cc_version, g_flags, g_march};
  char cached[320];
  int hit = cache_lookup(&key, cached, sizeof cached);
  const char *load = hit ? cached : sopath;
  from_cache = hit;
  if (!hit) {
    FILE *f = fopen(cpath, "w");
    size_t len = strlen(src);
    int wrote = f && fwrite(src, 1, len, f) == len;
    if (f && fclose(f)) wrote = 0;
    if (!wrote) {
      warn_once(W_TMP, "could not write a generated kernel to %s (%s); the interpreter runs it", cpath,
                strerror(errno));
      unlink(cpath);
      free(src);
      goto done;
    }
    /* argv: the compiler, its flags (split on spaces), -o out in */
    char flags[sizeof g_flags];
    snprintf(flags, sizeof flags, "%s", g_flags);
    char *argv[48];
    int na = 0;
    argv[na++] = g_cc;
    for (char *sv, *t = strtok_r(flags, " ", &sv); t && na < 40; t = strtok_r(NULL, " ", &sv)) argv[na++] = t;
    argv[na++] = "-o";
    argv[na++] = sopath;
    argv[na++] = cpath;
    argv[na++] = "-lm"; /* versioned libm symbols: the ones the runtime binds (unversioned ones bind the oldest) */
    argv[na] = NULL;
    int err = 0, rc = run_cmd(argv, log, &err);
    struct stat stt;
    if (rc != 0 || stat(sopath, &stt) != 0) {
      char head[700];
      read_head(log, head, sizeof head, 6);
      if (rc < 0)
        warn_once(W_COMPILE, "generated kernel not compiled: '%s' could not start (%s); the interpreter runs it", g_cc,
                  strerror(err));
      else
        warn_once(W_COMPILE, "generated kernel failed to compile (%s exited with %d); the interpreter runs it:\n%s",
                  g_cc, rc, head);
      unlink(cpath);
      unlink(sopath);
      unlink(log);
      free(src);
      goto done;
    }
    unlink(log);
    if (!keep_files()) unlink(cpath);
  }
  void *h = dlopen(load, RTLD_NOW | RTLD_LOCAL);
  tpurt__cg_fn fn = h ? (tpurt__cg_fn)(uintptr_t)dlsym(h, TPURT__CG_SYMBOL) : NULL;
  if (!fn) {
    const char *why = dlerror();
    warn_once(W_DLOPEN, "generated kernel not loaded (%s); the interpreter runs it", why ? why : "no kernel symbol");
    if (h) dlclose(h);
  } else {
    if (!hit) cache_store(&key, sopath, now_s() - t0);
    e->handle = h;
    atomic_store_explicit(&e->fn, fn, memory_order_release);
    ok = 1;
  }
  if (!hit && !keep_files()) unlink(sopath);
  free(src);
done:;
  double dt = now_s() - t0;
  if (TPURT__TRACE_ON()) tpurt__trace_emit(TPURT_TRACE_COMPILE, tpurt__now_ns() - (int64_t)(dt * 1e9), (int64_t)(dt * 1e9), from_cache ? "kernel cache hit" : "kernel compile", NULL, -1, -1, e->sig.ninst, 0, from_cache, ok);
  pthread_mutex_lock(&g_mu);
  g_compile_secs += dt;
  pthread_mutex_unlock(&g_mu);
  if (ok) {
    atomic_fetch_add(&g_n_kernels, 1);
    atomic_store_explicit(&e->state, ST_READY, memory_order_release);
  } else {
    atomic_fetch_add(&g_n_failures, 1);
    atomic_store_explicit(&e->state, ST_FAILED, memory_order_release);
  }
}

static void *compile_thread(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!g_jobs) {
      g_busy = 0;
      pthread_cond_broadcast(&g_idle_cv);
      pthread_cond_wait(&g_job_cv, &g_mu);
    }
    cg_entry *e = g_jobs;
    g_jobs = e->next_job;
    if (!g_jobs) g_jobs_tail = &g_jobs;
    g_busy = 1;
    pthread_mutex_unlock(&g_mu);
    compile_entry(e);
    pthread_mutex_lock(&g_mu);
  }
  return NULL;
}

/* ------------------------------------------------------------- lookup */

static void extent(const tpurt__cg_launch *l, int o, uintptr_t *lo, uintptr_t *hi) {
  int64_t a = 0, b = 0;
  for (int d = 0; d < l->ndim; d++) {
    int64_t s = l->bstr[o][d] * (l->sizes[d] - 1);
    if (s > 0)
      b += s;
    else
      a += s;
  }
  *lo = (uintptr_t)l->base[o] + (uintptr_t)a;
  *hi = (uintptr_t)l->base[o] + (uintptr_t)b + tpurt_dtype_size((tpurt_dtype)l->dt[o]);
}

static int same_memory(const tpurt__cg_launch *l, int a, int b) {
  if (l->base[a] != l->base[b] || l->dt[a] != l->dt[b]) return 0;
  for (int d = 0; d < l->ndim; d++)
    if (l->bstr[a][d] != l->bstr[b][d]) return 0;
  return 1;
}

/* Operands a and b share no byte by their strides (interleaved halves). */
static int apart(const tpurt__cg_launch *l, int a, int b) {
  uint64_t g = tpurt__stride_gcd(tpurt__stride_gcd(0, l->ndim, l->sizes, l->bstr[a], 1), l->ndim, l->sizes, l->bstr[b], 1);
  return tpurt__residues_apart((uintptr_t)l->base[a], tpurt_dtype_size((tpurt_dtype)l->dt[a]), (uintptr_t)l->base[b],
                               tpurt_dtype_size((tpurt_dtype)l->dt[b]), g);
}

/* The signature of a launch; 0 when the generator declines it. */
static int make_sig(const tpurt__cg_launch *l, cg_sig *s) {
  int nops = l->nout + l->nin;
  memset(s, 0, offsetof(cg_sig, inst));
  s->compute = (uint8_t)l->compute;
  s->nout = (uint8_t)l->nout;
  s->nin = (uint8_t)l->nin;
  s->ninst = (uint8_t)l->ninst;
  int in = l->ndim - 1;
  for (int o = 0; o < nops; o++) {
    s->dt[o] = l->dt[o];
    int64_t es = (int64_t)tpurt_dtype_size((tpurt_dtype)l->dt[o]);
    int64_t st = l->bstr[o][in];
    s->cls[o] = st == es ? CLS_CONTIG : st == 0 ? CLS_BCAST : CLS_STRIDED;
  }
  for (int o = 0; o < l->nout; o++) {
    s->out_reg[o] = l->out_reg[o];
    for (int d = 0; d < l->ndim; d++)
      if (l->bstr[o][d] == 0 && l->sizes[d] > 1) return 0; /* an output element written twice */
    if (!l->base[o]) continue;
    uintptr_t olo, ohi;
    extent(l, o, &olo, &ohi);
    for (int q = 0; q < nops; q++) {
      if (q == o || !l->base[q]) continue;
      if (q >= l->nout && same_memory(l, o, q)) {
        if (s->alias[q - l->nout]) return 0; /* the memory of two outputs */
        s->alias[q - l->nout] = (uint8_t)(o + 1);
        continue;
      }
      uintptr_t qlo, qhi;
      extent(l, q, &qlo, &qhi);
      if (olo < qhi && qlo < ohi && !apart(l, o, q)) return 0;
    }
  }
  for (int k = 0; k < l->ninst; k++) {
    const tpurt_ew_inst *I = &l->inst[k];
    cg_inst *c = &s->inst[k];
    memset(c, 0, sizeof *c);
    c->op = I->op;
    c->dst = I->dst;
    memcpy(c->src, I->src, 3);
    c->bake = (uint8_t)bake_of(I, c->p);
    if (I->op == TPURT_EW_SCALAR) return 0; /* never in a serialized launch */
  }
  return 1;
}

/* fork: the child has no compile thread (started again on its first
 * miss); entries the parent was compiling stay interpreted there */
static void fork_prepare(void) {
  pthread_mutex_lock(&g_cc_mu);
  pthread_mutex_lock(&g_mu);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_unlock(&g_cc_mu);
}
static void fork_child(void) {
  g_thread = 0;
  g_busy = 0;
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_unlock(&g_cc_mu);
}

static void start_thread_locked(void) {
  static int atfork;
  if (!atfork++) pthread_atfork(fork_prepare, fork_parent, fork_child);
  if (g_thread) return;
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, compile_thread, NULL) == 0) g_thread = 1;
  pthread_attr_destroy(&at);
}

tpurt__cg_fn tpurt__codegen_find(const tpurt__cg_launch *l) {
  int m = mode();
  int ncompute = 0;
  for (int k = 0; k < l->ninst; k++) ncompute += !tpurt__cg_is_source(l->inst[k].op);
  if (ncompute < __atomic_load_n(&g_min_ops, __ATOMIC_RELAXED)) return NULL;
  if (m == MODE_OFF) {
    atomic_fetch_add_explicit(&g_n_interp, 1, memory_order_relaxed);
    return NULL;
  }
  cg_sig sig;
  if (!make_sig(l, &sig)) {
    atomic_fetch_add_explicit(&g_n_declined, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_n_interp, 1, memory_order_relaxed);
    return NULL;
  }
  size_t len = sig_len(&sig);
  uint64_t h = fnv(&sig, len);
  cg_entry *e, *created = NULL;
  pthread_mutex_lock(&g_mu);
  for (e = g_table[h % CG_BUCKETS]; e; e = e->next)
    if (e->hash == h && e->len == len && !memcmp(&e->sig, &sig, len)) break;
  if (!e) {
    e = calloc(1, offsetof(cg_entry, sig) + len);
    if (e) {
      e->hash = h;
      e->len = len;
      memcpy(&e->sig, &sig, len);
      atomic_init(&e->state, ST_PENDING);
      atomic_init(&e->fn, NULL);
      e->next = g_table[h % CG_BUCKETS];
      g_table[h % CG_BUCKETS] = e;
      created = e;
      if (m == MODE_ASYNC) {
        *g_jobs_tail = e;
        g_jobs_tail = &e->next_job;
        start_thread_locked();
        pthread_cond_signal(&g_job_cv);
      }
    }
  }
  pthread_mutex_unlock(&g_mu);
  if (created && m == MODE_SYNC) compile_entry(created);
  tpurt__cg_fn fn = NULL;
  if (e && atomic_load_explicit(&e->state, memory_order_acquire) == ST_READY)
    fn = atomic_load_explicit(&e->fn, memory_order_acquire);
  atomic_fetch_add_explicit(fn ? &g_n_compiled : &g_n_interp, 1, memory_order_relaxed);
  return fn;
}

/* -------------------------------------------------------- stats, tests */

void tpurt__codegen_stats(tpurt__cg_stats *out) {
  out->kernels = atomic_load(&g_n_kernels);
  out->failures = atomic_load(&g_n_failures);
  out->not_generated = atomic_load(&g_n_declined);
  out->launches_compiled = atomic_load(&g_n_compiled);
  out->launches_interpreted = atomic_load(&g_n_interp);
  pthread_mutex_lock(&g_mu);
  out->compile_seconds = g_compile_secs;
  pthread_mutex_unlock(&g_mu);
}

void tpurt__codegen_reset_stats(void) {
  atomic_store(&g_n_kernels, 0);
  atomic_store(&g_n_failures, 0);
  atomic_store(&g_n_declined, 0);
  atomic_store(&g_n_compiled, 0);
  atomic_store(&g_n_interp, 0);
  pthread_mutex_lock(&g_mu);
  g_compile_secs = 0;
  pthread_mutex_unlock(&g_mu);
}

void tpurt__codegen_reset(void) {
  pthread_mutex_lock(&g_mu);
  while (g_jobs || g_busy) pthread_cond_wait(&g_idle_cv, &g_mu);
  for (int i = 0; i < CG_BUCKETS; i++) {
    cg_entry *e = g_table[i];
    while (e) {
      cg_entry *n = e->next;
      free(e); /* the library stays loaded: a kernel pointer may still be held */
      e = n;
    }
    g_table[i] = NULL;
  }
  __atomic_store_n(&g_mode, -1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_lock(&g_cc_mu);
  g_cc_state = 0;
  g_warned = 0;
  /* the environment is read again, as by a process starting now (no
   * compile runs: the queue is idle and compiler_ready is behind g_cc_mu) */
  if (g_env) {
    for (char **e = g_env; *e; e++) free(*e);
    free(g_env);
    g_env = NULL;
  }
  tpurt__codegen_snapshot_env();
  pthread_mutex_unlock(&g_cc_mu);
  tpurt__codegen_reset_stats();
}

void tpurt__codegen_test_mode(const char *m) { __atomic_store_n(&g_mode, parse_mode(m), __ATOMIC_RELEASE); }

void tpurt__codegen_test_inject(const char *text) {
  pthread_mutex_lock(&g_mu);
  g_inject = text;
  pthread_mutex_unlock(&g_mu);
}

int tpurt_codegen_info(char *buf, size_t n) {
  if (!buf || !n) return 0;
  if (mode() == MODE_OFF) {
    snprintf(buf, n, "off (TORCH_TPU_CODEGEN=0): the interpreter runs every elementwise program");
    return 0;
  }
  if (!compiler_ready()) {
    snprintf(buf, n, "unavailable: %s; the interpreter runs every elementwise program", g_cc_why);
    return 0;
  }
  snprintf(buf, n, "%s (%s), -march=%s, %s compiles", g_cc_version, g_cc, g_march[0] ? g_march : "default",
           mode() == MODE_SYNC ? "synchronous" : "background");
  return 1;
}
