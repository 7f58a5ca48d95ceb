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
#include <sched.h>
#include <stdlib.h>
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

/* Lost wake-ups are excluded as above: the waiter reads the epoch,
 * announces its target, then (full fence) re-reads the counter; the
 * notifier stores the counter, then (full fence) reads wake_at. A reset of
 * wake_at that wipes an announcement is followed by the epoch bump, which
 * the announcing waiter's futex wait (on the epoch read before it
 * announced) does not sleep through. */
void tpurt__notify_reached(tpurt__waiter *w, uint64_t value, _Atomic uint64_t *wake_at) {
  atomic_thread_fence(memory_order_seq_cst);
  if (value < atomic_load_explicit(wake_at, memory_order_relaxed)) return;
  atomic_store(wake_at, UINT64_MAX);
  tpurt__notify(w);
}

/* A spinning thread offers its core to any other runnable thread every
 * ~64 pauses (sched_yield: a no-op when nothing else wants the core). The
 * host's Python thread, the stream worker and the pool's helper are three
 * threads on these 2-core VMs, and a spinner that only paused kept a
 * thread that had just been woken off its core until the spin ran out (the
 * scheduler placed the woken stream worker on the core where the pool's
 * helper polled for its 1 ms): a 1024 x 128 x 128 bf16 product 2 ms after
 * the previous one took 1.15 ms instead of 0.09, an add 114 us instead of
 * 11, and after 20 ms of idleness a run of 100 products 112 us each
 * instead of 48 (Zen 5, KVM). Training steps paired in one process
 * (matrix runners, yield off / on): DLRM strict 1.06x, defer 1.24x, minGPT
 * strict 1.04x, defer 1.04x, compiled 1.04x, bf16 1.04x, Llama strict
 * 1.03x, defer 1.02x, bf16 1.05x, ResNet 1.00-1.02x, UNet 1.00-1.01x.
 * TORCH_TPU_SPIN_YIELD=0 spins with pause alone (read once, at load). */
static int g_yield = 1;
__attribute__((constructor)) static void yield_init(void) {
  const char *e = getenv("TORCH_TPU_SPIN_YIELD");
  if (e && *e) g_yield = atoi(e) != 0;
}

/* 1 if pred(ctx) became true within spin_ns of polling (with pause). */
int tpurt__spin_for(int (*pred)(void *), void *ctx, int64_t spin_ns) {
  if (pred(ctx)) return 1;
  if (spin_ns > 0) {
    int64_t deadline = tpurt__now_ns() + spin_ns;
    for (unsigned it = 1;; it++) {
      tpurt__pause();
      if (pred(ctx)) return 1;
      if ((it & 63) == 0) {
        if (tpurt__now_ns() > deadline) break;
        if (g_yield) sched_yield();
      }
    }
  }
  return 0;
}

typedef struct {
  _Atomic uint64_t *v;
  uint64_t target;
} until_ctx;
static int reached(void *p) {
  const until_ctx *c = p;
  return atomic_load_explicit(c->v, memory_order_acquire) >= c->target;
}

void tpurt__wait_until(tpurt__waiter *w, _Atomic uint64_t *v, uint64_t target, _Atomic uint64_t *wake_at,
                       int64_t spin_ns) {
  until_ctx c = {v, target};
  if (tpurt__spin_for(reached, &c, spin_ns)) return;
  atomic_fetch_add(&w->sleepers, 1);
  for (;;) {
    uint32_t e = atomic_load(&w->epoch);
    uint64_t cur = atomic_load(wake_at);
    while (target < cur && !atomic_compare_exchange_weak(wake_at, &cur, target)) {
    }
    atomic_thread_fence(memory_order_seq_cst);
    if (reached(&c)) break;
    syscall(SYS_futex, (uint32_t *)&w->epoch, FUTEX_WAIT_PRIVATE, e, NULL, NULL, 0);
  }
  atomic_fetch_sub(&w->sleepers, 1);
}

void tpurt__wait(tpurt__waiter *w, int (*pred)(void *), void *ctx, int64_t spin_ns) {
  if (tpurt__spin_for(pred, ctx, spin_ns)) return;
  atomic_fetch_add(&w->sleepers, 1);
  atomic_thread_fence(memory_order_seq_cst);
  for (;;) {
    uint32_t e = atomic_load(&w->epoch);
    if (pred(ctx)) break;
    syscall(SYS_futex, (uint32_t *)&w->epoch, FUTEX_WAIT_PRIVATE, e, NULL, NULL, 0);
  }
  atomic_fetch_sub(&w->sleepers, 1);
}
