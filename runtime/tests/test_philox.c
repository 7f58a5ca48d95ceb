/* test_philox.c — Philox-4x32-10 known-answer vectors (Random123 kat_vectors),
 * the bulk generators (words and uniforms; AVX-512, AVX2 and portable paths) against
 * the scalar function, generator reservation and the non-deterministic seed. */
#include "../src/internal.h"
#include "check.h"

static void kat(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1, uint32_t e0,
                uint32_t e1, uint32_t e2, uint32_t e3) {
  uint32_t ctr[4] = {c0, c1, c2, c3}, key[2] = {k0, k1}, out[4];
  tpurt_philox4x32_10(ctr, key, out);
  CHECK_EQ(out[0], e0);
  CHECK_EQ(out[1], e1);
  CHECK_EQ(out[2], e2);
  CHECK_EQ(out[3], e3);
}

/* reference: one scalar call per block, counter carrying into word 1 */
static void ref_block(uint64_t key, uint64_t ctr, uint32_t w[4]) {
  uint32_t c[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0}, k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
  tpurt_philox4x32_10(c, k, w);
}

#define MAXB 1000
static uint32_t got[4 * MAXB + 8];

static void check_blocks(uint64_t key, uint64_t ctr0, int64_t nb) {
  const uint32_t canary = 0xA5A5A5A5u;
  for (int64_t i = 0; i < 4 * MAXB + 8; i++) got[i] = canary;
  tpurt__philox_blocks(key, ctr0, nb, got);
  int64_t bad = 0;
  for (int64_t b = 0; b < nb; b++) {
    uint32_t w[4];
    ref_block(key, ctr0 + (uint64_t)b, w);
    for (int j = 0; j < 4; j++) bad += got[4 * b + j] != w[j];
  }
  for (int64_t i = 4 * nb; i < 4 * MAXB + 8; i++) bad += got[i] != canary; /* nothing written past the end */
  if (bad) fprintf(stderr, "philox_blocks(key=%#llx, ctr0=%#llx, n=%lld) [%s]: %lld wrong words\n",
                   (unsigned long long)key, (unsigned long long)ctr0, (long long)nb, tpurt__philox_path(),
                   (long long)bad);
  CHECK_EQ(bad, 0);
}

static float gotf[4 * MAXB + 8];

static void check_uniform(uint64_t key, uint64_t off, int64_t lin0, int64_t n) {
  for (int64_t i = 0; i < 4 * MAXB + 8; i++) gotf[i] = -1.0f;
  tpurt__philox_uniform(key, off, lin0, n, gotf);
  int64_t bad = 0;
  for (int64_t i = lin0; i < lin0 + n; i++) {
    uint32_t w[4];
    ref_block(key, off + (uint64_t)(i / 4), w);
    float e = (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f);
    bad += memcmp(&gotf[i - lin0], &e, 4) != 0 || !(e >= 0.0f && e < 1.0f);
  }
  for (int64_t i = n; i < 4 * MAXB + 8; i++) bad += gotf[i] != -1.0f;
  if (bad) fprintf(stderr, "philox_uniform(key=%#llx, off=%#llx, lin0=%lld, n=%lld) [%s]: %lld wrong\n",
                   (unsigned long long)key, (unsigned long long)off, (long long)lin0, (long long)n,
                   tpurt__philox_path(), (long long)bad);
  CHECK_EQ(bad, 0);
}

static void bulk_suite(void) {
  static const uint64_t keys[] = {0, 1, 42, 0xffffffffull, 0x123456789abcdef0ull, ~0ull};
  static const uint64_t ctrs[] = {0,           1,           5,           1000,         0xfffffff0ull,
                                  0xfffffffcull, 0xffffffffull, 0x100000000ull, 0x1fffffff9ull, ~0ull - 20};
  static const int64_t ns[] = {0, 1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 48, 63, 1000};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
    for (size_t c = 0; c < sizeof ctrs / sizeof *ctrs; c++)
      for (size_t n = 0; n < sizeof ns / sizeof *ns; n++) check_blocks(keys[k], ctrs[c], ns[n]);
  /* carry from word 0 into word 1 at every position inside a group of 8 or 16 */
  for (int s = 0; s < 40; s++) check_blocks(7, 0x100000000ull - (uint64_t)s, 72);
  /* uniforms: unaligned starts, lengths that are not multiples of 4, runs
   * inside one block, counters that carry */
  static const int64_t lin0s[] = {0, 1, 2, 3, 4, 5, 6, 7, 4093, 1ll << 34};
  static const int64_t uns[] = {0, 1, 2, 3, 4, 5, 31, 32, 33, 35, 63, 64, 65, 127, 1000, 4003};
  static const uint64_t offs[] = {0, 0xfffffffaull, 0xffffffffull << 32};
  for (size_t o = 0; o < sizeof offs / sizeof *offs; o++)
    for (size_t l = 0; l < sizeof lin0s / sizeof *lin0s; l++)
      for (size_t n = 0; n < sizeof uns / sizeof *uns; n++)
        check_uniform(0x9e3779b97f4a7c15ull, offs[o], lin0s[l], uns[n]);
}

int main(void) {
  kat(0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  kat(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
      0xa20bc7c6u, 0x6d5451fdu);
  kat(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
      0x5001e420u, 0x24126ea1u);
  /* the first known answer through the bulk path */
  uint32_t w[4];
  tpurt__philox_blocks(0, 0, 1, w);
  CHECK_EQ(w[0], 0x6627e8d5u);
  CHECK_EQ(w[3], 0x9b00dbd8u);

  /* every path the CPU runs (each capped by it: forcing a wider one than
   * the CPU has runs the best it has), then the default again */
  static const char *names[] = {"portable", "avx2", "avx512"};
  for (int path = 2; path >= 0; path--) {
    tpurt__philox_force(path);
    fprintf(stderr, "bulk philox path %s asked: %s\n", names[path], tpurt__philox_path());
    if (path == 0) CHECK(strcmp(tpurt__philox_path(), "portable") == 0);
    bulk_suite();
  }
  tpurt__philox_force_portable(1);
  CHECK(strcmp(tpurt__philox_path(), "portable") == 0);
  tpurt__philox_force_portable(0);
  fprintf(stderr, "bulk philox path: %s\n", tpurt__philox_path());

  tpurt_generator g = {42, 10};
  CHECK_EQ(tpurt_generator_reserve(&g, 5), 10);
  CHECK_EQ(tpurt_generator_reserve(&g, 3), 15);
  CHECK_EQ(g.offset, 18);
  CHECK_EQ(g.seed, 42);
  uint64_t a = tpurt_nondeterministic_seed(), b = tpurt_nondeterministic_seed();
  CHECK(a != b);
  TEST_MAIN_END();
}
