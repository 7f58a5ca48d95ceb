/* test_philox.c — Philox-4x32-10 known-answer vectors (Random123 kat_vectors),
 * generator reservation and the non-deterministic seed. */
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

int main(void) {
  kat(0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  kat(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
      0xa20bc7c6u, 0x6d5451fdu);
  kat(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
      0x5001e420u, 0x24126ea1u);
  tpurt_generator g = {42, 10};
  CHECK_EQ(tpurt_generator_reserve(&g, 5), 10);
  CHECK_EQ(tpurt_generator_reserve(&g, 3), 15);
  CHECK_EQ(g.offset, 18);
  CHECK_EQ(g.seed, 42);
  uint64_t a = tpurt_nondeterministic_seed(), b = tpurt_nondeterministic_seed();
  CHECK(a != b);
  TEST_MAIN_END();
}
