/*
 * philox.c — Philox-4x32-10 counter-based generator (Salmon et al., SC'11,
 * constants as in Random123), generator offset reservation and the
 * non-deterministic seed.
 */
#include <fcntl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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
