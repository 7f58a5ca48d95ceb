/*
 * philox.c — Philox-4x32-10 counter-based generator (Salmon et al., SC'11,
 * constants as in Random123), its bulk generators (16 blocks at a time with
 * AVX-512, 8 with AVX2 or portable), generator offset reservation and the
 * non-deterministic seed.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "internal.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void tpurt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r) {
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* ------------------------------------------------------------ bulk */

/* Bulk generation: block b of a run is the Philox block with counter
 * (ctr0 + b) (64 bits: low word 0, high word 1, words 2, 3 zero) under key
 * seed, bitwise the same as tpurt_philox4x32_10. Blocks go through the
 * rounds together: 16 in the lanes of AVX-512 registers when the kernel
 * level allows AVX-512 (cpu.c: the CPU has it and TORCH_TPU_ISA does not
 * cap it), else 8 in AVX2 registers when the CPU has AVX2, else eight-wide
 * arrays (structure of arrays) the compiler may vectorize. Leftover blocks
 * use the scalar function. TORCH_TPU_PHILOX=portable|avx2|avx512 (read
 * once; capped by the CPU) or tpurt__philox_force() selects a path. */

enum { PHILOX_PORTABLE = 0, PHILOX_AVX2 = 1, PHILOX_AVX512 = 2 };
static _Atomic int g_philox_path = -1;
static _Atomic int g_philox_forced = -1;

/* The best path the CPU runs, capped at `cap`. */
static int philox_capped(int cap) {
  int best = tpurt__cpu_avx512() ? PHILOX_AVX512 : tpurt__cpu_avx2_fma() ? PHILOX_AVX2 : PHILOX_PORTABLE;
  return cap < best ? cap : best;
}

static int philox_path(void) {
  int v = atomic_load_explicit(&g_philox_path, memory_order_relaxed);
  if (v < 0) {
    int f = atomic_load_explicit(&g_philox_forced, memory_order_relaxed);
    if (f < 0) {
      const char *e = getenv("TORCH_TPU_PHILOX");
      f = !e ? PHILOX_AVX512
          : strcmp(e, "portable") == 0 ? PHILOX_PORTABLE
          : strcmp(e, "avx2") == 0     ? PHILOX_AVX2
                                       : PHILOX_AVX512;
    }
    v = philox_capped(f);
    atomic_store_explicit(&g_philox_path, v, memory_order_relaxed);
  }
  return v;
}

void tpurt__philox_force(int path) {
  atomic_store_explicit(&g_philox_forced, path < 0 ? -1 : path, memory_order_relaxed);
  atomic_store_explicit(&g_philox_path, -1, memory_order_relaxed);
}

void tpurt__philox_force_portable(int on) { tpurt__philox_force(on ? PHILOX_PORTABLE : -1); }

const char *tpurt__philox_path(void) {
  static const char *names[] = {"portable", "avx2", "avx512"};
  return names[philox_path()];
}

static inline void philox_scalar(uint64_t key, uint64_t ctr, uint32_t w[4]) {
  const uint32_t c[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0}, k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
  tpurt_philox4x32_10(c, k, w);
}

static inline float philox_u24(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

/* Stores block b (words w) at out + 4b: as words, or as uniforms in
 * [0, 1) when as_float. */
static inline void store_block(const uint32_t w[4], void *out, int64_t b, int as_float) {
  for (int j = 0; j < 4; j++) {
    if (as_float)
      ((float *)out)[4 * b + j] = philox_u24(w[j]);
    else
      ((uint32_t *)out)[4 * b + j] = w[j];
  }
}

/* nblocks / 8 groups of 8 blocks, portable (c[j][l]: word j of block l):
 * returns the blocks done. */
static int64_t groups_portable(uint64_t key, uint64_t ctr0, int64_t nblocks, void *out, int as_float) {
  int64_t g = nblocks / 8;
  for (int64_t i = 0; i < g; i++) {
    uint32_t c[4][8];
    for (int l = 0; l < 8; l++) {
      uint64_t v = ctr0 + (uint64_t)(8 * i + l);
      c[0][l] = (uint32_t)v;
      c[1][l] = (uint32_t)(v >> 32);
      c[2][l] = c[3][l] = 0;
    }
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++, k0 += PHILOX_W0, k1 += PHILOX_W1)
      for (int l = 0; l < 8; l++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c[0][l], p1 = (uint64_t)PHILOX_M1 * c[2][l];
        c[0][l] = (uint32_t)(p1 >> 32) ^ c[1][l] ^ k0;
        c[2][l] = (uint32_t)(p0 >> 32) ^ c[3][l] ^ k1;
        c[1][l] = (uint32_t)p1;
        c[3][l] = (uint32_t)p0;
      }
    for (int l = 0; l < 8; l++) {
      const uint32_t w[4] = {c[0][l], c[1][l], c[2][l], c[3][l]};
      store_block(w, out, 8 * i + l, as_float);
    }
  }
  return 8 * g;
}

#if defined(__x86_64__) || defined(__i386__)
#define PHILOX_G 2 /* groups of 8 blocks in flight (2 and 3 measured best) */

/* hi and lo halves of the 32x32->64 products m * c for the 8 lanes of c */
__attribute__((target("avx2"))) static inline void mulhilo8(__m256i c, __m256i m, __m256i *hi, __m256i *lo) {
  __m256i pe = _mm256_mul_epu32(c, m);                        /* lanes 0, 2, 4, 6 */
  __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m); /* lanes 1, 3, 5, 7 */
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
  *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

/* Counter words 0 and 1 of the 8 blocks ctr, ctr + 1, ..., ctr + 7. */
__attribute__((target("avx2"))) static inline void ctr8(uint64_t c, __m256i *c0, __m256i *c1) {
  *c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  if ((uint32_t)c <= 0xFFFFFFFFu - 7u) { /* no carry into word 1 inside the group */
    *c1 = _mm256_set1_epi32((int)(uint32_t)(c >> 32));
  } else {
    uint32_t h[8];
    for (int l = 0; l < 8; l++) h[l] = (uint32_t)((c + (uint64_t)l) >> 32);
    *c1 = _mm256_loadu_si256((const __m256i *)h);
  }
}

/* Stores 8 blocks (c[j]: word j of the 8 lanes) block-major at dst (a 4x8
 * transpose), as words or as uniforms. */
__attribute__((target("avx2"))) static inline void store8_avx2(const __m256i c[4], char *dst, int as_float) {
  __m256i t0 = _mm256_unpacklo_epi32(c[0], c[1]), t1 = _mm256_unpackhi_epi32(c[0], c[1]);
  __m256i t2 = _mm256_unpacklo_epi32(c[2], c[3]), t3 = _mm256_unpackhi_epi32(c[2], c[3]);
  __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  __m256i o[4] = {_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u2, u3, 0x20),
                  _mm256_permute2x128_si256(u0, u1, 0x31), _mm256_permute2x128_si256(u2, u3, 0x31)};
  for (int q = 0; q < 4; q++) {
    if (as_float)
      _mm256_storeu_ps((float *)dst + 8 * q, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(o[q], 8)),
                                                           _mm256_set1_ps(1.0f / 16777216.0f)));
    else
      _mm256_storeu_si256((__m256i *)dst + q, o[q]);
  }
}

/* G groups of 8 blocks from counter ctr, interleaved so that the latency
 * of one group's rounds hides behind the others'. */
__attribute__((target("avx2"), always_inline)) static inline void run_avx2(const __m256i k0[10], const __m256i k1[10],
                                                                          uint64_t ctr, int G, char *dst,
                                                                          int as_float) {
  const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
  __m256i c[4][4];
  for (int u = 0; u < G; u++) {
    ctr8(ctr + (uint64_t)(8 * u), &c[u][0], &c[u][1]);
    c[u][2] = c[u][3] = _mm256_setzero_si256();
  }
  for (int r = 0; r < 10; r++)
    for (int u = 0; u < G; u++) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo8(c[u][0], m0, &hi0, &lo0);
      mulhilo8(c[u][2], m1, &hi1, &lo1);
      c[u][0] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[u][1]), k0[r]);
      c[u][1] = lo1;
      c[u][2] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[u][3]), k1[r]);
      c[u][3] = lo0;
    }
  for (int u = 0; u < G; u++) store8_avx2(c[u], dst + (size_t)u * 32 * 4, as_float);
}

__attribute__((target("avx2"))) static int64_t groups_avx2(uint64_t key, uint64_t ctr0, int64_t nblocks, void *out,
                                                           int as_float) {
  __m256i k0[10], k1[10];
  uint32_t a0 = (uint32_t)key, a1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++, a0 += PHILOX_W0, a1 += PHILOX_W1) {
    k0[r] = _mm256_set1_epi32((int)a0);
    k1[r] = _mm256_set1_epi32((int)a1);
  }
  int64_t b = 0;
  for (; b + PHILOX_G * 8 <= nblocks; b += PHILOX_G * 8)
    run_avx2(k0, k1, ctr0 + (uint64_t)b, PHILOX_G, (char *)out + (size_t)b * 16, as_float);
  for (; b + 8 <= nblocks; b += 8) run_avx2(k0, k1, ctr0 + (uint64_t)b, 1, (char *)out + (size_t)b * 16, as_float);
  return b;
}

/* The same with 16 blocks a register (PHILOX_G groups in flight). */
#define PHILOX_T512 __attribute__((target("avx512f")))

/* hi and lo halves of the 32x32->64 products m * c for the 16 lanes of c */
PHILOX_T512 static inline void mulhilo16(__m512i c, __m512i m, __m512i *hi, __m512i *lo) {
  __m512i pe = _mm512_mul_epu32(c, m);                        /* even lanes */
  __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m); /* odd lanes */
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
  *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

/* Counter words 0 and 1 of the 16 blocks ctr, ..., ctr + 15. */
PHILOX_T512 static inline void ctr16(uint64_t c, __m512i *c0, __m512i *c1) {
  *c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)c),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  if ((uint32_t)c <= 0xFFFFFFFFu - 15u) {
    *c1 = _mm512_set1_epi32((int)(uint32_t)(c >> 32));
  } else {
    uint32_t h[16];
    for (int l = 0; l < 16; l++) h[l] = (uint32_t)((c + (uint64_t)l) >> 32);
    *c1 = _mm512_loadu_si512(h);
  }
}

/* Stores 16 blocks (c[j]: word j of the 16 lanes) block-major at dst: a
 * 4 x 4 transpose of words inside each 128-bit lane (lane q then holds
 * blocks q, q + 4, q + 8, q + 12), then a 4 x 4 transpose of the lanes. */
PHILOX_T512 static inline void store16(const __m512i c[4], char *dst, int as_float) {
  __m512i t0 = _mm512_unpacklo_epi32(c[0], c[1]), t1 = _mm512_unpackhi_epi32(c[0], c[1]);
  __m512i t2 = _mm512_unpacklo_epi32(c[2], c[3]), t3 = _mm512_unpackhi_epi32(c[2], c[3]);
  __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2); /* blocks 0 4 8 12, 1 5 9 13 */
  __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3); /* 2 6 10 14, 3 7 11 15 */
  __m512i a = _mm512_shuffle_i32x4(u0, u1, 0x44), b = _mm512_shuffle_i32x4(u2, u3, 0x44); /* 0 4 1 5, 2 6 3 7 */
  __m512i x = _mm512_shuffle_i32x4(u0, u1, 0xEE), y = _mm512_shuffle_i32x4(u2, u3, 0xEE); /* 8 12 9 13, 10 14 11 15 */
  __m512i o[4] = {_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD), _mm512_shuffle_i32x4(x, y, 0x88),
                  _mm512_shuffle_i32x4(x, y, 0xDD)};
  for (int q = 0; q < 4; q++) {
    if (as_float)
      _mm512_storeu_ps((float *)dst + 16 * q, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(o[q], 8)),
                                                            _mm512_set1_ps(1.0f / 16777216.0f)));
    else
      _mm512_storeu_si512((char *)dst + 64 * q, o[q]);
  }
}

PHILOX_T512 __attribute__((always_inline)) static inline void run_avx512(const __m512i k0[10], const __m512i k1[10],
                                                                        uint64_t ctr, int G, char *dst, int as_float) {
  const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
  __m512i c[PHILOX_G][4];
  for (int u = 0; u < G; u++) {
    ctr16(ctr + (uint64_t)(16 * u), &c[u][0], &c[u][1]);
    c[u][2] = c[u][3] = _mm512_setzero_si512();
  }
  for (int r = 0; r < 10; r++)
    for (int u = 0; u < G; u++) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo16(c[u][0], m0, &hi0, &lo0);
      mulhilo16(c[u][2], m1, &hi1, &lo1);
      c[u][0] = _mm512_ternarylogic_epi32(hi1, c[u][1], k0[r], 0x96); /* three-way xor */
      c[u][1] = lo1;
      c[u][2] = _mm512_ternarylogic_epi32(hi0, c[u][3], k1[r], 0x96);
      c[u][3] = lo0;
    }
  for (int u = 0; u < G; u++) store16(c[u], dst + (size_t)u * 64 * 4, as_float);
}

PHILOX_T512 static int64_t groups_avx512(uint64_t key, uint64_t ctr0, int64_t nblocks, void *out, int as_float) {
  __m512i k0[10], k1[10];
  uint32_t a0 = (uint32_t)key, a1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++, a0 += PHILOX_W0, a1 += PHILOX_W1) {
    k0[r] = _mm512_set1_epi32((int)a0);
    k1[r] = _mm512_set1_epi32((int)a1);
  }
  int64_t b = 0;
  for (; b + PHILOX_G * 16 <= nblocks; b += PHILOX_G * 16)
    run_avx512(k0, k1, ctr0 + (uint64_t)b, PHILOX_G, (char *)out + (size_t)b * 16, as_float);
  for (; b + 16 <= nblocks; b += 16) run_avx512(k0, k1, ctr0 + (uint64_t)b, 1, (char *)out + (size_t)b * 16, as_float);
  return b;
}
#endif

/* Whole blocks [0, nblocks) of counter ctr0 + b into out (4 words or
 * uniforms each). */
static void blocks_any(uint64_t key, uint64_t ctr0, int64_t nblocks, void *out, int as_float) {
  int64_t done;
#if defined(__x86_64__) || defined(__i386__)
  int path = philox_path();
  if (path == PHILOX_AVX512) {
    done = groups_avx512(key, ctr0, nblocks, out, as_float);
    if (done < nblocks) /* 8 to 15 blocks left */
      done += groups_avx2(key, ctr0 + (uint64_t)done, nblocks - done, (char *)out + (size_t)done * 16, as_float);
  } else if (path == PHILOX_AVX2) {
    done = groups_avx2(key, ctr0, nblocks, out, as_float);
  } else
#endif
    done = groups_portable(key, ctr0, nblocks, out, as_float);
  for (int64_t b = done; b < nblocks; b++) {
    uint32_t w[4];
    philox_scalar(key, ctr0 + (uint64_t)b, w);
    store_block(w, out, b, as_float);
  }
}

void tpurt__philox_blocks(uint64_t key, uint64_t ctr0, int64_t nblocks, uint32_t *out) {
  if (nblocks > 0) blocks_any(key, ctr0, nblocks, out, 0);
}

void tpurt__philox_uniform(uint64_t key, uint64_t off, int64_t lin0, int64_t n, float *out) {
  int64_t i = lin0, end = lin0 + n;
  if (n <= 0) return;
  if (i % 4) { /* head: the rest of a partial block */
    uint32_t w[4];
    philox_scalar(key, off + (uint64_t)(i / 4), w);
    for (int q = (int)(i % 4); q < 4 && i < end; q++, i++) out[i - lin0] = philox_u24(w[q]);
  }
  int64_t full = (end - i) / 4;
  if (full > 0) {
    blocks_any(key, off + (uint64_t)(i / 4), full, out + (i - lin0), 1);
    i += 4 * full;
  }
  if (i < end) { /* tail: the start of a partial block */
    uint32_t w[4];
    philox_scalar(key, off + (uint64_t)(i / 4), w);
    for (int q = 0; i < end; q++, i++) out[i - lin0] = philox_u24(w[q]);
  }
}

uint64_t tpurt_generator_reserve(tpurt_generator *g, uint64_t n) {
  if (!g) return 0;
  return __atomic_fetch_add(&g->offset, n, __ATOMIC_RELAXED);
}

uint64_t tpurt_nondeterministic_seed(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t r = read(fd, &v, sizeof v);
    close(fd);
    if (r == (ssize_t)sizeof v) return v;
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  v = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)(uintptr_t)&v << 16);
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull;
  v ^= v >> 33;
  return v;
}
