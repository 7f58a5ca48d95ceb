/* test_wait.c — a spinning waiter offers its core to other runnable
 * threads (wait.c): two threads on one CPU under SCHED_FIFO at one
 * priority (neither is ever preempted by the other: only a yield hands
 * the core over), a waiter spinning with a long window and a notifier
 * that must run on the same core to make the waiter's condition true.
 * With the yield the notifier runs inside the spin and the waiter never
 * sleeps (the notify finds no sleeper: the futex epoch stays 0); with
 * TORCH_TPU_SPIN_YIELD=0 the spin holds the core until its window ends and
 * the notifier only runs when the window ends or the kernel throttles the
 * real-time threads (after 0.95 s) — the child run below checks that the
 * test tells the two apart. (Under SCHED_FIFO the test's threads run
 * before any load on the machine: the bound is not a speed figure.)
 *
 *   test_wait              parent: both settings in child processes
 *   test_wait child Y      child: Y 1 expects the yield, 0 not (TORCH_TPU_SPIN_YIELD=Y)
 *
 * wait.c is compiled into this test (its functions are internal to the
 * library). Needs permission for SCHED_FIFO and sched_setaffinity (root,
 * or CAP_SYS_NICE): without it the test says so and is skipped. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>

#include "check.h"
#include "check_child.h"
#include "../src/wait.c"

#define ROUNDS 3
#define WINDOW_NS 2000000000LL /* the waiter's spin */
#define BOUND_NS 500000000LL   /* the notifier runs sooner than this with the yield */

static tpurt__waiter g_w;
static _Atomic int g_flag, g_started;
static _Atomic int64_t g_t_spin, g_t_notify;
static int g_cpu;

static int pred_flag(void *p) {
  if (!atomic_exchange(&g_started, 1)) atomic_store(&g_t_spin, tpurt__now_ns());
  return atomic_load(&g_flag) >= *(int *)p;
}

/* A thread that starts as SCHED_FIFO on g_cpu (its first instruction
 * already there: a thread created as an ordinary one could be placed on
 * the spinner's CPU and wait there for the kernel's throttling), or -1. */
static int start_fifo(pthread_t *t, void *(*fn)(void *), void *arg) {
  pthread_attr_t at;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpu, &set);
  struct sched_param sp = {.sched_priority = 1};
  pthread_attr_init(&at);
  int rc = pthread_attr_setinheritsched(&at, PTHREAD_EXPLICIT_SCHED) || pthread_attr_setschedpolicy(&at, SCHED_FIFO) ||
           pthread_attr_setschedparam(&at, &sp) || pthread_attr_setaffinity_np(&at, sizeof set, &set) ||
           pthread_create(t, &at, fn, arg);
  pthread_attr_destroy(&at);
  return rc ? -1 : 0;
}

static void *waiter(void *p) {
  tpurt__wait(&g_w, pred_flag, p, WINDOW_NS);
  return NULL;
}

static void *notifier(void *p) {
  while (!atomic_load(&g_started)) sched_yield(); /* the waiter spins first */
  atomic_store(&g_t_notify, tpurt__now_ns());
  atomic_store(&g_flag, *(int *)p);
  tpurt__notify(&g_w);
  return NULL;
}

/* yield 1: ROUNDS rounds, each notifier inside the spin (no sleep, soon);
 * yield 0: one round (real-time budget: the kernel throttles real-time
 * threads after 0.95 s of a second), the notifier held off by the spin. */
static int child(int yield) {
  /* the threads on the last CPU, this one on another (it creates the
   * notifier while the waiter spins) */
  cpu_set_t all, me;
  CPU_ZERO(&me);
  if (sched_getaffinity(0, sizeof all, &all) || CPU_COUNT(&all) < 2) {
    printf("SKIP: fewer than 2 CPUs\n");
    return 0;
  }
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &all)) g_cpu = c;
  for (int c = 0; c < g_cpu; c++)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &me);
      break;
    }
  if (sched_setaffinity(0, sizeof me, &me)) {
    printf("SKIP: cannot set the CPU affinity\n");
    return 0;
  }
  for (int r = 1; r <= (yield ? ROUNDS : 1); r++) {
    atomic_store(&g_started, 0);
    atomic_store(&g_w.epoch, 0);
    int target = r;
    pthread_t tw, tn;
    if (start_fifo(&tw, waiter, &target)) {
      printf("SKIP: no permission for SCHED_FIFO threads\n");
      return 0;
    }
    if (start_fifo(&tn, notifier, &target)) {
      printf("SKIP: no permission for SCHED_FIFO threads\n");
      atomic_store(&g_flag, target); /* lets the waiter go */
      pthread_join(tw, NULL);
      return 0;
    }
    pthread_join(tw, NULL);
    pthread_join(tn, NULL);
    int64_t delay = atomic_load(&g_t_notify) - atomic_load(&g_t_spin);
    CHECK_EQ(atomic_load(&g_flag), r);
    if (yield) {
      CHECK(delay < BOUND_NS);
      CHECK_EQ(atomic_load(&g_w.epoch), 0); /* the waiter never slept */
    } else {
      CHECK(delay >= BOUND_NS);
    }
    CHECK_EQ(atomic_load(&g_w.sleepers), 0);
    printf("round %d: notifier ran %.3f ms into the spin, waiter slept %u time(s)\n", r, delay / 1e6,
           atomic_load(&g_w.epoch));
  }
  if (g_failures) return 1;
  printf("OK\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "child")) return child(atoi(argv[2]));
  static char out[4096];
  const char *vals[] = {"1", "0"};
  for (int i = 0; i < 2; i++) {
    char env1[64];
    snprintf(env1, sizeof env1, "TORCH_TPU_SPIN_YIELD=%s", vals[i]);
    char *args[] = {argv[0], "child", (char *)vals[i], NULL};
    const char *env[] = {env1, NULL};
    int rc = check_run_child(args, env, out, sizeof out, NULL);
    printf("%s:\n%s", env1, out);
    CHECK_EQ(rc, 0);
    if (strstr(out, "SKIP")) return 0;
    CHECK(strstr(out, "OK\n") != NULL);
  }
  if (g_failures) return 1;
  printf("test_wait: OK\n");
  return 0;
}
