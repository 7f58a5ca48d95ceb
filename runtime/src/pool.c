/*
 * pool.c — persistent thread pool used by kernels.
 *
 * tpurt_parallel_for cuts [0, n) into balanced chunks (at least `grain`
 * indices each, at most CHUNKS_PER_THREAD per thread, boundaries a pure function of n,
 * grain and the pool size, so results never depend on scheduling), posts
 * the job and claims chunks itself; the helper threads claim chunks too.
 * Thread t (the caller is 0, helpers 1..) owns the t-th contiguous share of
 * the chunks and claims it first, front to back, so that consecutive
 * kernels over the same tensors touch the same bytes from the same core
 * (their data stays in that core's cache: a 256K-element mul at 2 threads
 * ran at 1.7x one thread with first-come claiming, which moved every chunk
 * to whichever thread came first). Claiming stays dynamic: a thread that
 * has finished its share takes the unstarted chunks of the others' (the
 * machine is shared, and with a static split a helper that the OS has not
 * scheduled made the caller wait for its whole share: kernels ran up to
 * 10x slower under load), and waits only for chunks that are in progress.
 *
 * The job lives in one static descriptor guarded by a generation number.
 * Each share's claim word packs generation<<32 | claimed from the front
 * <<16 | claimed from the back (compare-and-swap), so a helper that
 * wakes late claims from the generation it sees and checks the
 * descriptor still belongs to that generation (seqlock) before using it;
 * a claim past the last chunk, or of a finished generation, does nothing.
 * Nested calls, calls while another caller owns the pool and small ranges
 * run inline on the calling thread.
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define CHUNKS_PER_THREAD 4

/* How long a helper polls for the next job before it sleeps. A program
 * that syncs after each kernel (or records a deferred graph between
 * flushes) leaves gaps of one host round trip between kernels, and on a
 * shared VM a futex wake-up costs ~50-100 us and may land the woken
 * helper on the busy caller's CPU: with the 50 us of the other waits, a
 * 512^3 f32 product synced after each call ran at one thread's speed
 * (2.2 ms at 2 threads, 2.0 ms at 1; back to back 0.98 ms). Polling for
 * 1 ms (~GOMP's default spin) keeps the helper on its own core across
 * such gaps: 2.2 -> 1.3 ms (200 us: 1.3, 2 ms: 1.1). A helper that polls
 * executes pause and only reads one word; it gives its core back to the
 * OS after 1 ms of idleness. */
#define POOL_SPIN_NS 1000000

/* ... except after leaving a job whose last chunks run on other threads.
 * Their thread may have lost its core to the host's threads (Python and
 * autograd record the next ops meanwhile): a helper polling for 1 ms keeps
 * its own core busy, so the descheduled thread cannot move there, and the
 * region ends only when the host's time slice does. Instrumented Llama
 * steps (2 cores): 0.5 % of the regions ended more than 0.5 ms after their
 * first thread ran out of chunks, and they held 57 % of all the time
 * threads spent waiting at region ends (~3 ms a 50 ms step). After such a
 * job the helper polls briefly and then sleeps, which lets the scheduler
 * run the late thread on its core. */
#define POOL_SPIN_TAIL_NS 100000

#define POOL_MAX 256 /* threads */

/* per share: gen << 32 | chunks claimed from the front << 16 | from the back */
static struct {
  _Alignas(64) _Atomic uint64_t next;
} g_share[POOL_MAX];

static struct {
  _Alignas(64) _Atomic uint32_t gen;  /* generation of the fields below; 0 while they change */
  _Atomic(tpurt_parallel_fn) fn;
  _Atomic(void *) ctx;
  _Atomic int64_t n, nchunks;
  _Alignas(64) _Atomic int64_t done; /* chunks of this generation finished */
} g_job;

static int g_nthreads = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_flag g_busy = ATOMIC_FLAG_INIT;
static uint32_t g_gen; /* only touched by the owner of g_busy */
static _Atomic uint64_t g_posted; /* jobs posted; helpers wake when it moves */
static _Alignas(64) tpurt__waiter g_work_w; /* helpers sleep here */
static _Alignas(64) tpurt__waiter g_done_w; /* the caller waits for chunks in progress */
static _Thread_local int t_in_pool;

void tpurt__pool_configure(int nthreads) { g_nthreads = nthreads > 0 ? nthreads : 1; }
int tpurt__pool_nested(void) { return t_in_pool; }

/* Claims one chunk of share t (of `size` chunks) of job generation g: the
 * owner takes the share's next chunk from the front, others from the back
 * (a late owner then still finds its first chunks). Returns the chunk's
 * index in the share, -1 when the share is drained, -2 when the share's
 * word belongs to another job. The compare-and-swap only succeeds on a
 * word of generation g, and a job cannot finish while a claimed chunk of
 * it is unfinished, so the descriptor read for g stays valid. */
static int64_t claim(int t, int own, int64_t size, uint32_t g) {
  uint64_t w = atomic_load_explicit(&g_share[t].next, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(w >> 32) != g) return -2;
    int64_t front = (int64_t)(w >> 16 & 0xffffu), back = (int64_t)(w & 0xffffu);
    if (front + back >= size) return -1;
    uint64_t nw = own ? w + (1u << 16) : w + 1;
    if (atomic_compare_exchange_weak_explicit(&g_share[t].next, &w, nw, memory_order_acq_rel, memory_order_acquire))
      return own ? front : size - 1 - back;
  }
}

/* Claims and runs chunks of the current job until none is left: the
 * thread's own share first, then the others' in turn. Returns 1 if it
 * leaves the job with chunks still running on other threads. */
static int run_chunks(int self) {
  int nt = g_nthreads;
  uint32_t seen = 0;
  int64_t seen_nc = 0;
  for (int k = 0; k < nt; k++) {
    int t = (self + k) % nt;
    for (;;) {
      uint32_t g = atomic_load_explicit(&g_job.gen, memory_order_acquire);
      if (g == 0) return 0;
      tpurt_parallel_fn fn = atomic_load_explicit(&g_job.fn, memory_order_relaxed);
      void *ctx = atomic_load_explicit(&g_job.ctx, memory_order_relaxed);
      int64_t n = atomic_load_explicit(&g_job.n, memory_order_relaxed);
      int64_t nc = atomic_load_explicit(&g_job.nchunks, memory_order_relaxed);
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&g_job.gen, memory_order_relaxed) != g) return 0;
      seen = g, seen_nc = nc;
      int64_t c0 = nc * t / nt;
      int64_t j = claim(t, k == 0, nc * (t + 1) / nt - c0, g);
      if (j == -2) return 0;
      if (j == -1) break; /* share drained */
      int64_t i = c0 + j;
      int64_t b = n / nc * i + (i < n % nc ? i : n % nc);
      int64_t e = n / nc * (i + 1) + (i + 1 < n % nc ? i + 1 : n % nc);
      fn(ctx, b, e);
      if (atomic_fetch_add_explicit(&g_job.done, 1, memory_order_acq_rel) + 1 == nc) tpurt__notify(&g_done_w);
    }
  }
  return seen && atomic_load_explicit(&g_job.gen, memory_order_acquire) == seen &&
         atomic_load_explicit(&g_job.done, memory_order_acquire) < seen_nc;
}

typedef struct {
  uint64_t seen;
} post_ctx;
static int pred_posted(void *p) {
  return atomic_load_explicit(&g_posted, memory_order_acquire) != ((post_ctx *)p)->seen;
}
typedef struct {
  int64_t nc;
} done_ctx;
static int pred_done(void *p) {
  return atomic_load_explicit(&g_job.done, memory_order_acquire) >= ((done_ctx *)p)->nc;
}

static void *helper_main(void *arg) {
  char name[16];
  int self = (int)(intptr_t)arg;
  snprintf(name, sizeof name, "tpu-pool%d", self);
  pthread_setname_np(pthread_self(), name);
  t_in_pool = 1;
  post_ctx c = {0};
  int unfinished = 0;
  for (;;) {
    tpurt__wait(&g_work_w, pred_posted, &c, unfinished ? POOL_SPIN_TAIL_NS : POOL_SPIN_NS);
    c.seen = atomic_load_explicit(&g_posted, memory_order_acquire);
    unfinished = run_chunks(self);
  }
  return NULL;
}

static void pool_start(void) {
  if (g_nthreads > POOL_MAX) g_nthreads = POOL_MAX;
  int n = g_nthreads - 1;
  if (n <= 0) return;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int started = 0;
  for (int i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, &at, helper_main, (void *)(intptr_t)(i + 1)) != 0) break;
    started++;
  }
  pthread_attr_destroy(&at);
  g_nthreads = started + 1;
}

int tpurt_num_threads(void) {
  if (tpurt__ensure_init() != TPURT_OK) return 1;
  return tpurt__cfg.num_threads;
}

void tpurt_parallel_for(int64_t n, int64_t grain, tpurt_parallel_fn fn, void *ctx) {
  if (n <= 0 || !fn) return;
  if (grain < 1) grain = 1;
  if (n <= grain || t_in_pool || tpurt__ensure_init() != TPURT_OK) {
    fn(ctx, 0, n);
    return;
  }
  pthread_once(&g_once, pool_start);
  int nt = g_nthreads;
  int64_t chunks = n / grain; /* every chunk has at least grain indices */
  if (chunks > (int64_t)nt * CHUNKS_PER_THREAD) chunks = (int64_t)nt * CHUNKS_PER_THREAD;
  if (nt <= 1 || chunks <= 1 || atomic_flag_test_and_set_explicit(&g_busy, memory_order_acquire)) {
    fn(ctx, 0, n);
    return;
  }
  if (++g_gen == 0) g_gen = 1;
  uint32_t gen = g_gen;
  /* seqlock write: invalidate, change, publish */
  atomic_store_explicit(&g_job.gen, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&g_job.fn, fn, memory_order_relaxed);
  atomic_store_explicit(&g_job.ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&g_job.n, n, memory_order_relaxed);
  atomic_store_explicit(&g_job.nchunks, chunks, memory_order_relaxed);
  atomic_store_explicit(&g_job.done, 0, memory_order_relaxed);
  atomic_store_explicit(&g_job.gen, gen, memory_order_release);
  for (int t = 0; t < nt; t++) atomic_store_explicit(&g_share[t].next, (uint64_t)gen << 32, memory_order_release);
  atomic_fetch_add_explicit(&g_posted, 1, memory_order_release);
  tpurt__notify(&g_work_w);
  t_in_pool = 1;
  run_chunks(0);
  t_in_pool = 0;
  done_ctx d = {chunks};
  tpurt__wait(&g_done_w, pred_done, &d, TPURT_SPIN_NS);
  atomic_flag_clear_explicit(&g_busy, memory_order_release);
}
