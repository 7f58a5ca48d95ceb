/* test_isa.c — every kernel level the host can run (TORCH_TPU_ISA), the
 * bf16 GEMM paths behind them (AMX tiles, AVX512-BF16 dot products, the f32
 * path) against a double reference within the precision contract, bits
 * independent of the thread count, a level the host lacks refused with a
 * message, and the AMX permission refused by the kernel (a seccomp filter
 * on arch_prctl) falling back with a warning.
 *
 * Each level runs in a child process (the level is read once a process):
 *   test_isa              parent: runs the children, checks their output
 *   test_isa gemm LEVEL   child: the GEMM checks at LEVEL
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#endif

#include "check.h"
#include "check_child.h"

static tpurt_stream *S;

static float bf16r(float f) { return check_from_bf16(check_to_bf16(f)); }

/* a strided batch of matrices in f32 or bf16 on host and device */
typedef struct {
  tpurt_dtype dt;
  int64_t sz[3], st[3], span;
  void *h;
  tpurt_devptr d;
} mat;

static void mat_init(mat *m, tpurt_dtype dt, int64_t b, int64_t r, int64_t c, int64_t sb, int64_t sr, int64_t sc) {
  memset(m, 0, sizeof *m);
  m->dt = dt;
  m->sz[0] = b, m->sz[1] = r, m->sz[2] = c;
  m->st[0] = sb, m->st[1] = sr, m->st[2] = sc;
  m->span = 1 + (b - 1) * sb + (r - 1) * sr + (c - 1) * sc;
  m->h = calloc((size_t)m->span, 4);
  CHECK_OK(tpurt_malloc(0, (size_t)m->span * 4, S, &m->d));
}
static void mat_free(mat *m) {
  free(m->h);
  tpurt_free(m->d);
}
static int64_t off(const mat *m, int64_t b, int64_t i, int64_t j) { return b * m->st[0] + i * m->st[1] + j * m->st[2]; }
static float get(const mat *m, int64_t b, int64_t i, int64_t j) {
  int64_t o = off(m, b, i, j);
  return m->dt == TPURT_BF16 ? check_from_bf16(((uint16_t *)m->h)[o]) : ((float *)m->h)[o];
}
static void fill(mat *m, unsigned seed) {
  for (int64_t b = 0; b < m->sz[0]; b++)
    for (int64_t i = 0; i < m->sz[1]; i++)
      for (int64_t j = 0; j < m->sz[2]; j++) {
        seed = seed * 1103515245u + 12345u;
        float v = (float)(((seed >> 8) % 200001) / 100000.0 - 1.0);
        int64_t o = off(m, b, i, j);
        if (m->dt == TPURT_BF16)
          ((uint16_t *)m->h)[o] = check_to_bf16(v);
        else
          ((float *)m->h)[o] = v;
      }
}
static size_t bytes(const mat *m) { return (size_t)m->span * tpurt_dtype_size(m->dt); }
static tpurt_view view(const mat *m) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = m->d;
  v.dtype = m->dt;
  v.ndim = 3;
  for (int k = 0; k < 3; k++) v.sizes[k] = m->sz[k], v.strides[k] = m->st[k];
  return v;
}

/* The precision contract: operands as bf16 values (bf16 data exact; f32
 * rounded at DEFAULT, hi + lo split at HIGH with lo*lo dropped), products
 * exact, sums in f32. Reference in double over those values; the bound is
 * f32 accumulation over K (plus the output's rounding). */
static float part(float v, int high, int which) { /* which 0: hi, 1: lo */
  float h = bf16r(v);
  return which ? (high ? bf16r(v - h) : 0.0f) : h;
}

static double run_case(tpurt_dtype dta, tpurt_dtype dtc, int64_t B, int64_t M, int64_t N, int64_t K, int layout,
                       double alpha, double beta, tpurt_precision prec, float *out_copy) {
  mat a, b, c;
  /* layout 0: row-major; 1: A transposed, B transposed; 2: general strides, B's batch broadcast */
  if (layout == 0) {
    mat_init(&a, dta, B, M, K, M * K, K, 1);
    mat_init(&b, dta, B, K, N, K * N, N, 1);
  } else if (layout == 1) {
    mat_init(&a, dta, B, M, K, M * K, 1, M);
    mat_init(&b, dta, B, K, N, K * N, 1, K);
  } else {
    mat_init(&a, dta, B, M, K, 2 * M * K + 3, 2 * K + 1, 2);
    mat_init(&b, dta, B, K, N, 0, N + 5, 1);
  }
  mat_init(&c, dtc, B, M, N, M * N, N, 1);
  fill(&a, 11u + (unsigned)M);
  fill(&b, 97u + (unsigned)N);
  fill(&c, 5u);
  int high = dta == TPURT_F32 && prec == TPURT_PRECISION_HIGH;
  int exact = dta == TPURT_F32 && prec == TPURT_PRECISION_HIGHEST;
  double *ref = malloc(sizeof(double) * (size_t)(B * M * N)), *mag = malloc(sizeof(double) * (size_t)(B * M * N));
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0, g = 0;
        for (int64_t k = 0; k < K; k++) {
          float x = get(&a, bi, i, k), y = get(&b, bi, k, j);
          double p = exact ? (double)x * y
                           : (double)part(x, high, 0) * part(y, high, 0) + (double)part(x, high, 0) * part(y, high, 1) +
                                 (double)part(x, high, 1) * part(y, high, 0);
          s += p;
          g += fabs((double)x * y);
        }
        ref[(bi * M + i) * N + j] = alpha * s + (beta == 0 ? 0 : beta * get(&c, bi, i, j));
        mag[(bi * M + i) * N + j] = fabs(alpha) * g + fabs(beta * get(&c, bi, i, j));
      }
  CHECK_OK(tpurt_memcpy_h2d(S, a.d, a.h, bytes(&a), 0));
  CHECK_OK(tpurt_memcpy_h2d(S, b.d, b.h, bytes(&b), 0));
  CHECK_OK(tpurt_memcpy_h2d(S, c.d, c.h, bytes(&c), 0));
  tpurt_view cv = view(&c), av = view(&a), bv = view(&b);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, alpha, beta, prec));
  CHECK_OK(tpurt_memcpy_d2h(S, c.h, c.d, bytes(&c), 0));
  double worst = 0; /* error / bound */
  double acc = (double)(K + 2) * 0x1p-23 * (high ? 3 : 1), outr = dtc == TPURT_BF16 ? 0x1p-8 : 0;
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        int64_t q = (bi * M + i) * N + j;
        double got = get(&c, bi, i, j), bound = acc * mag[q] + outr * fabs(ref[q]) + 1e-30;
        double r = fabs(got - ref[q]) / bound;
        if (!(r <= worst)) worst = r; /* NaN sticks */
        if (out_copy) out_copy[q] = (float)got;
      }
  if (!(worst <= 1.0))
    fprintf(stderr, "gemm B%lld M%lld N%lld K%lld layout %d dt %s->%s prec %d alpha %g beta %g: error %.3g x the bound\n",
            (long long)B, (long long)M, (long long)N, (long long)K, layout, tpurt_dtype_name(dta),
            tpurt_dtype_name(dtc), (int)prec, alpha, beta, worst);
  CHECK(worst <= 1.0);
  free(ref);
  free(mag);
  mat_free(&a);
  mat_free(&b);
  mat_free(&c);
  return worst;
}

/* child: the GEMM checks at the level in force */
static int child_gemm(const char *level) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  const tpurt_cpu_info *ci = tpurt_cpu_get_info();
  CHECK_STR(ci->isa_name, level);
  printf("level %s: bf16 products on %s\n", ci->isa_name, tpurt_bf16_gemm_path());
  /* odd sizes, K not a multiple of the tile's 32, edges of every block kind */
  static const int64_t shapes[][4] = {{1, 1, 1, 1},    {1, 7, 5, 3},     {2, 33, 47, 61},  {1, 64, 64, 64},
                                      {1, 100, 33, 300}, {3, 31, 65, 129}, {1, 130, 290, 40}, {1, 257, 31, 1030}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int layout = 0; layout < 3; layout++) {
      const int64_t *x = shapes[s];
      run_case(TPURT_BF16, TPURT_F32, x[0], x[1], x[2], x[3], layout, 1, 0, TPURT_PRECISION_DEFAULT, NULL);
      run_case(TPURT_BF16, TPURT_BF16, x[0], x[1], x[2], x[3], layout, 1, 0, TPURT_PRECISION_DEFAULT, NULL);
      run_case(TPURT_F32, TPURT_F32, x[0], x[1], x[2], x[3], layout, 1, 0, TPURT_PRECISION_DEFAULT, NULL);
      run_case(TPURT_F32, TPURT_F32, x[0], x[1], x[2], x[3], layout, 1, 0, TPURT_PRECISION_HIGH, NULL);
    }
  /* alpha / beta into f32 and bf16 results */
  run_case(TPURT_BF16, TPURT_F32, 2, 45, 70, 90, 0, 0.5, 1.0, TPURT_PRECISION_DEFAULT, NULL);
  run_case(TPURT_BF16, TPURT_F32, 1, 45, 70, 90, 1, 1.0, 1.0, TPURT_PRECISION_DEFAULT, NULL);
  run_case(TPURT_BF16, TPURT_BF16, 1, 64, 96, 128, 0, -2.0, 0.25, TPURT_PRECISION_DEFAULT, NULL);
  run_case(TPURT_F32, TPURT_F32, 1, 50, 60, 70, 2, 1.5, -1.0, TPURT_PRECISION_HIGH, NULL);
  /* many small products (one per task) and a product larger than a panel */
  run_case(TPURT_BF16, TPURT_BF16, 24, 16, 24, 40, 0, 1, 0, TPURT_PRECISION_DEFAULT, NULL);
  run_case(TPURT_BF16, TPURT_F32, 1, 70, 1100, 96, 0, 1, 0, TPURT_PRECISION_DEFAULT, NULL);
  /* the same bits at any thread count: printed for the parent to compare */
  float *o = malloc(sizeof(float) * 200 * 300);
  run_case(TPURT_BF16, TPURT_F32, 1, 200, 300, 700, 0, 1, 0, TPURT_PRECISION_DEFAULT, o);
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 200 * 300; i++) {
    uint32_t u;
    memcpy(&u, &o[i], 4);
    h = (h ^ u) * 1099511628211ull;
  }
  free(o);
  printf("bits %016llx\n", (unsigned long long)h);
  return g_failures ? 1 : 0;
}

#if defined(__x86_64__)
/* arch_prctl(ARCH_REQ_XCOMP_PERM, ...) fails with EPERM; every other call passes. */
static int deny_amx_permission(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_arch_prctl, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}
#endif

/* this binary as a child with env assignments (the AMX permission denied
 * when seccomp_amx); its stdout+stderr in out */
static int run_child(char *const argv[], const char *const *env, char *out, size_t n, int seccomp_amx) {
#if defined(__x86_64__)
  return check_run_child(argv, env, out, n, seccomp_amx ? deny_amx_permission : NULL);
#else
  (void)seccomp_amx;
  return check_run_child(argv, env, out, n, NULL);
#endif
}

static const char *bits_of(const char *out) {
  const char *p = strstr(out, "bits ");
  return p ? p + 5 : "";
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "gemm")) return child_gemm(argv[2]);
  if (argc == 2 && !strcmp(argv[1], "init")) { /* child: tpurt_init's verdict */
    tpurt_status st = tpurt_init();
    printf("init %s: %s\n", tpurt_status_name(st), st == TPURT_OK ? "" : tpurt_last_error());
    const tpurt_cpu_info *ci = tpurt_cpu_get_info();
    printf("amx_usable %d path %s\n", ci->amx_usable, tpurt_bf16_gemm_path());
    return 0;
  }
  const tpurt_cpu_info *ci = tpurt_cpu_get_info();
  printf("cpu: %s (%s), host level %s, AMX tile/bf16 %d/%d usable %d, AVX512-BF16 %d, L2 %lld KiB\n", ci->model,
         ci->vendor, ci->isa_name, ci->amx_tile, ci->amx_bf16, ci->amx_usable, ci->avx512_bf16,
         (long long)(ci->l2_bytes >> 10));
  static char out[1 << 16];
  static const char *const levels[] = {"scalar", "avx2", "avx512", "amx"};
  char ref_bits[32] = "";
  for (int lv = 0; lv <= ci->host_isa; lv++) {
    char env_isa[64];
    snprintf(env_isa, sizeof env_isa, "TORCH_TPU_ISA=%s", levels[lv]);
    /* two thread counts; at amx also small K chunks (several chunks per product) */
    const char *e1[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e2[] = {env_isa, "TPU_NUM_THREADS=1", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e3[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_AMX_KC=64", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    char *av[] = {argv[0], "gemm", (char *)levels[lv], NULL};
    const char *const *envs[] = {e1, e2, e3};
    for (int k = 0; k < 3; k++) {
      int rc = run_child(av, envs[k], out, sizeof out, 0);
      fputs(out, stdout);
      CHECK_EQ(rc, 0);
      char b[32];
      snprintf(b, sizeof b, "%.16s", bits_of(out));
      if (k == 0) snprintf(ref_bits, sizeof ref_bits, "%s", b);
      else if (k == 1) CHECK_STR(b, ref_bits); /* same bits at 1 and 2 threads */
      else if (lv == 3) CHECK_STR(b, ref_bits); /* and at any K chunking on the tile unit */
    }
    if (lv == 3) CHECK(strstr(out, "bf16 products on amx-bf16 tiles") != NULL);
    if (lv == 2 && ci->avx512_bf16) CHECK(strstr(out, "bf16 products on avx512-bf16") != NULL);
  }
  /* a level the host lacks, an unknown one: tpurt_init fails and says why */
  {
    char *av[] = {argv[0], "init", NULL};
    const char *e[] = {"TORCH_TPU_ISA=amx", "TORCH_TPU_AMX=0", NULL};
    CHECK_EQ(run_child(av, e, out, sizeof out, 0), 0);
    fputs(out, stdout);
    CHECK(strstr(out, "init TPURT_ERR_INVALID_ARGUMENT: TORCH_TPU_ISA=amx: this CPU") != NULL);
    const char *e2[] = {"TORCH_TPU_ISA=sse9", NULL};
    CHECK_EQ(run_child(av, e2, out, sizeof out, 0), 0);
    fputs(out, stdout);
    CHECK(strstr(out, "init TPURT_ERR_INVALID_ARGUMENT: TORCH_TPU_ISA=sse9: unknown level") != NULL);
  }
#if defined(__x86_64__)
  /* the kernel refuses the AMX permission: a warning, the next path serves */
  if (ci->amx_tile && ci->amx_bf16 && ci->amx_usable) {
    char *av[] = {argv[0], "init", NULL};
    const char *e[] = {"TORCH_TPU_HBM_LIMIT=1G", NULL};
    CHECK_EQ(run_child(av, e, out, sizeof out, 1), 0);
    fputs(out, stdout);
    CHECK(strstr(out, "refused the AMX tile-data permission") != NULL);
    CHECK(strstr(out, "init TPURT_OK") != NULL);
    CHECK(strstr(out, "amx_usable 0") != NULL);
    CHECK(strstr(out, "path amx") == NULL);
    char *ag[] = {argv[0], "gemm", "avx512", NULL};
    const char *eg[] = {"TORCH_TPU_HBM_LIMIT=1G", NULL};
    CHECK_EQ(run_child(ag, eg, out, sizeof out, 1), 0); /* host level drops to avx512: its GEMMs pass */
  } else {
    printf("skipped: the AMX permission refusal (this host has no usable AMX)\n");
  }
#endif
  if (g_failures) {
    fprintf(stderr, "test_isa: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_isa: OK\n");
  return 0;
}
