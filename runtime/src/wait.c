/*
 * wait.c — the wait/notify primitive: spin (with pause) for a short while
 * polling a predicate, then sleep on a futex word. Notifiers bump the
 * epoch and make the wake syscall only when a waiter is asleep.
 *
 * A notifier that finds no sleeper writes nothing: the waiter's line stays
 * in the caches of the threads that read it (a producer and a worker that
 * each bumped an epoch on every command moved two lines between the cores
 * a command). Lost wake-ups are excluded Dekker-style: the notifier makes
 * its condition true, then (full fence) reads the sleeper count; a waiter
 * counts itself a sleeper, then (full fence) reads the epoch and re-checks
 * the condition before it sleeps on that epoch. Either the notifier sees
 * the sleeper (and bumps the epoch, which fails the futex wait), or the
 * waiter sees the condition.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

int64_t tpurt__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void tpurt__notify(tpurt__waiter *w) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&w->sleepers, memory_order_relaxed) == 0) return;
  atomic_fetch_add(&w->epoch, 1);
  syscall(SYS_futex, (uint32_t *)&w->epoch, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void tpurt__wait(tpurt__waiter *w, int (*pred)(void *), void *ctx, int64_t spin_ns) {
  if (pred(ctx)) return;
  if (spin_ns > 0) {
    int64_t deadline = tpurt__now_ns() + spin_ns;
    for (unsigned it = 1;; it++) {
      tpurt__pause();
      if (pred(ctx)) return;
      if ((it & 63) == 0 && tpurt__now_ns() > deadline) break;
    }
  }
  atomic_fetch_add(&w->sleepers, 1);
  atomic_thread_fence(memory_order_seq_cst);
  for (;;) {
    uint32_t e = atomic_load(&w->epoch);
    if (pred(ctx)) break;
    syscall(SYS_futex, (uint32_t *)&w->epoch, FUTEX_WAIT_PRIVATE, e, NULL, NULL, 0);
  }
  atomic_fetch_sub(&w->sleepers, 1);
}
