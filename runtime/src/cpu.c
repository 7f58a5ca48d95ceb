/*
 * cpu.c — what the host CPU can run, detected once at run time, and which
 * instruction-set level the kernels may use.
 *
 * One build runs on any x86-64: the library is compiled once per x86-64
 * level (runtime/CMakeLists.txt; the loader maps the variant the host runs)
 * and kernels pick their paths from this module (never from the build
 * host). Detection reads cpuid (features, brand),
 * XCR0 (which register states the OS saves: the AVX-512 and AMX tile
 * states), sysconf (cache sizes) and, for AMX, asks the kernel for the
 * tile-data state (arch_prctl ARCH_REQ_XCOMP_PERM): Linux only lets a
 * process use AMX tiles after that request, and a refusal (old kernel, a
 * seccomp filter) leaves AMX off with one warning instead of a SIGILL.
 *
 * TORCH_TPU_ISA=scalar|avx2|avx512|amx caps the level (tests and
 * measurements force each path the host can run); asking for a level the
 * host lacks is an error of tpurt_init naming what is missing. Levels:
 *   scalar  portable C paths of the own kernels
 *   avx2    AVX2 + FMA kernels
 *   avx512  AVX-512 F/BW/VL/DQ kernels, and AVX512-BF16 dot products where
 *           the CPU has them
 *   amx     AMX-BF16 tiles for bf16 products where the CPU has them
 * A capped level never enables a path the CPU lacks: "avx512" on a CPU
 * without AVX512-BF16 runs bf16 products on the f32 path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#endif

#include "internal.h"

#ifndef TPURT_BUILD_VARIANT
#define TPURT_BUILD_VARIANT "unknown"
#endif

static tpurt_cpu_info g_cpu;
static int g_level;       /* tpurt__isa_level() in force */
static int g_forced_bad;  /* TORCH_TPU_ISA names a level the host lacks / an unknown level */
static char g_force_msg[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const char *const k_level_names[] = {"scalar", "avx2", "avx512", "amx"};

const char *tpurt__isa_name(int level) {
  return level >= 0 && level <= TPURT__ISA_AMX ? k_level_names[level] : "?";
}

#if defined(__x86_64__)
static void cpuid2(unsigned leaf, unsigned sub, unsigned r[4]) {
  if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) r[0] = r[1] = r[2] = r[3] = 0;
}
static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t)hi << 32 | lo;
}
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#endif

static void trim(char *s) {
  char *p = s;
  while (*p == ' ') p++;
  if (p != s) memmove(s, p, strlen(p) + 1);
  for (size_t n = strlen(s); n && s[n - 1] == ' '; n--) s[n - 1] = 0;
}

static void detect(void) {
  tpurt_cpu_info *c = &g_cpu;
  memset(c, 0, sizeof *c);
  snprintf(c->vendor, sizeof c->vendor, "unknown");
  snprintf(c->model, sizeof c->model, "unknown");
#if defined(__x86_64__)
  unsigned r[4];
  cpuid2(0, 0, r);
  unsigned max_leaf = r[0];
  memcpy(c->vendor, &r[1], 4);
  memcpy(c->vendor + 4, &r[3], 4);
  memcpy(c->vendor + 8, &r[2], 4);
  c->vendor[12] = 0;
  cpuid2(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    unsigned b[12];
    for (unsigned i = 0; i < 3; i++) cpuid2(0x80000002u + i, 0, b + 4 * i);
    memcpy(c->model, b, 48);
    c->model[48] = 0;
    trim(c->model);
  }
  cpuid2(1, 0, r);
  int osxsave = (r[2] >> 27) & 1, avx = (r[2] >> 28) & 1, fma = (r[2] >> 12) & 1;
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  int os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  int os_amx = (xcr0 & 0x60000) == 0x60000;
  unsigned l7[4] = {0}, l71[4] = {0};
  if (max_leaf >= 7) {
    cpuid2(7, 0, l7);
    cpuid2(7, 1, l71);
  }
  c->avx2 = os_avx && avx && ((l7[1] >> 5) & 1);
  c->fma = os_avx && avx && fma;
  c->avx512f = os_avx512 && ((l7[1] >> 16) & 1);
  c->avx512dq = os_avx512 && ((l7[1] >> 17) & 1);
  c->avx512bw = os_avx512 && ((l7[1] >> 30) & 1);
  c->avx512vl = os_avx512 && ((l7[1] >> 31) & 1);
  c->avx512_bf16 = c->avx512f && ((l71[0] >> 5) & 1);
  c->avx512_fp16 = c->avx512f && ((l7[3] >> 23) & 1);
  c->amx_bf16 = (l7[3] >> 22) & 1;
  c->amx_tile = (l7[3] >> 24) & 1;
  c->amx_int8 = (l7[3] >> 25) & 1;
  if (c->amx_tile && c->amx_bf16) {
    if (!os_amx) {
      snprintf(c->amx_note, sizeof c->amx_note, "the OS does not enable the AMX tile state (XCR0)");
    } else if (getenv("TORCH_TPU_AMX") && !strcmp(getenv("TORCH_TPU_AMX"), "0")) {
      snprintf(c->amx_note, sizeof c->amx_note, "off by TORCH_TPU_AMX=0");
    } else if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
      snprintf(c->amx_note, sizeof c->amx_note, "the kernel refused the AMX tile-data permission (arch_prctl: %s)",
               strerror(errno));
      fprintf(stderr, "torch_tpu: warning: %s; bf16 products run on %s\n", c->amx_note,
              c->avx512_bf16 ? "AVX512-BF16" : "the f32 path");
    } else {
      c->amx_usable = 1;
    }
  }
#endif
  long v;
  c->l1d_bytes = (v = sysconf(_SC_LEVEL1_DCACHE_SIZE)) > 0 ? v : 0;
  c->l2_bytes = (v = sysconf(_SC_LEVEL2_CACHE_SIZE)) > 0 ? v : 0;
  c->l3_bytes = (v = sysconf(_SC_LEVEL3_CACHE_SIZE)) > 0 ? v : 0;

  int host = c->amx_usable && c->avx512f && c->avx512bw ? TPURT__ISA_AMX
             : c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq ? TPURT__ISA_AVX512
             : c->avx2 && c->fma ? TPURT__ISA_AVX2
                                 : TPURT__ISA_SCALAR;
  c->host_isa = host;
  g_level = host;
  const char *e = getenv("TORCH_TPU_ISA");
  if (e && *e) {
    int want = -1;
    for (int i = 0; i <= TPURT__ISA_AMX; i++)
      if (!strcmp(e, k_level_names[i])) want = i;
    if (want < 0) {
      g_forced_bad = 1;
      snprintf(g_force_msg, sizeof g_force_msg, "TORCH_TPU_ISA=%.64s: unknown level (expected scalar, avx2, avx512 or amx)",
               e);
    } else if (want > host) {
      g_forced_bad = 1;
      snprintf(g_force_msg, sizeof g_force_msg, "TORCH_TPU_ISA=%.20s: this CPU (%.48s) cannot run it: %.120s", e, c->model,
               want == TPURT__ISA_AMX ? (c->amx_tile && c->amx_bf16 ? c->amx_note : "no AMX-BF16 tiles")
               : want == TPURT__ISA_AVX512 ? "no AVX-512 F/BW/VL/DQ"
                                           : "no AVX2 + FMA");
    } else {
      g_level = want;
    }
  }
  c->isa = g_level;
  snprintf(c->isa_name, sizeof c->isa_name, "%s", tpurt__isa_name(g_level));
  snprintf(c->build, sizeof c->build, "%s", TPURT_BUILD_VARIANT);
}

static void detect_once(void) { pthread_once(&g_once, detect); }

const tpurt_cpu_info *tpurt_cpu_get_info(void) {
  detect_once();
  return &g_cpu;
}

int tpurt__isa_level(void) {
  detect_once();
  return g_level;
}

tpurt_status tpurt__cpu_check(void) {
  detect_once();
  return g_forced_bad ? tpurt__err_str(TPURT_ERR_INVALID_ARGUMENT, g_force_msg) : TPURT_OK;
}

int tpurt__cpu_avx2_fma(void) { return tpurt__isa_level() >= TPURT__ISA_AVX2; }
int tpurt__cpu_avx512(void) { return tpurt__isa_level() >= TPURT__ISA_AVX512; }
int tpurt__cpu_avx512_bf16(void) { return tpurt__isa_level() >= TPURT__ISA_AVX512 && g_cpu.avx512_bf16; }
int tpurt__cpu_amx_bf16(void) { return tpurt__isa_level() >= TPURT__ISA_AMX; }
