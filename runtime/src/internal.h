/*
 * internal.h — cross-module internals of the tpurt runtime (not installed).
 *
 * Holds the runtime-wide configuration, the device/stream structures, the
 * wait/notify primitive (spin then futex) shared by streams, events and the
 * thread pool, the error helpers and inline half/bfloat16 conversions.
 */
#ifndef TPURT_INTERNAL_H
#define TPURT_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "tpurt.h"

#define TPURT_INTERNAL __attribute__((visibility("hidden")))
#define TPURT_MAX_DEVICES 64
#define TPURT_STREAMS_PER_DEVICE (TPURT_STREAM_POOL_SIZE + 1)
#define TPURT_ERRMSG_LEN 1024

/* ------------------------------------------------------------ errors */
/* Sets the thread's last error message and returns st. */
TPURT_INTERNAL tpurt_status tpurt__err(tpurt_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sets the message verbatim. */
TPURT_INTERNAL tpurt_status tpurt__err_str(tpurt_status st, const char *msg);
/* PyTorch-style size formatting ("N bytes", "x.xx KiB/MiB/GiB"). */
TPURT_INTERNAL void tpurt__format_size(uint64_t size, char *buf, size_t len);
/* A byte count with optional K/M/G/T suffix (binary multiples) and optional
 * "B"/"iB" (device.c); 0 on success, -1 if s is not one. */
TPURT_INTERNAL int tpurt__parse_bytes(const char *s, uint64_t *out);

/* --------------------------------------------------------- runtime config */
typedef struct tpurt__config {
  int num_devices;
  int num_threads;
  tpurt_device_props props; /* identical for every chip */
} tpurt__config;
TPURT_INTERNAL extern tpurt__config tpurt__cfg;
TPURT_INTERNAL extern _Atomic int tpurt__inited;
TPURT_INTERNAL extern _Atomic int tpurt__blocking;

#define TPURT__FORKED 2 /* tpurt__inited in the child of an initialized process */
static inline tpurt_status tpurt__ensure_init(void) {
  if (__builtin_expect(atomic_load_explicit(&tpurt__inited, memory_order_acquire) == 1, 1)) return TPURT_OK;
  return tpurt_init();
}
#define TPURT__INIT_OR_RETURN()                   \
  do {                                            \
    tpurt_status _st = tpurt__ensure_init();      \
    if (_st != TPURT_OK) return _st;              \
  } while (0)
TPURT_INTERNAL tpurt_status tpurt__check_device(int dev);

/* ------------------------------------------------------------ cpu.c */
/* Instruction-set levels the kernels may use (TORCH_TPU_ISA caps them). */
enum { TPURT__ISA_SCALAR = 0, TPURT__ISA_AVX2 = 1, TPURT__ISA_AVX512 = 2, TPURT__ISA_AMX = 3 };
TPURT_INTERNAL int tpurt__isa_level(void);
TPURT_INTERNAL const char *tpurt__isa_name(int level);
/* Fails (with the message) when TORCH_TPU_ISA asks for what the host lacks. */
TPURT_INTERNAL tpurt_status tpurt__cpu_check(void);
/* Paths allowed at the level in force on this CPU. */
TPURT_INTERNAL int tpurt__cpu_avx2_fma(void);
TPURT_INTERNAL int tpurt__cpu_avx512(void);
TPURT_INTERNAL int tpurt__cpu_avx512_bf16(void);
TPURT_INTERNAL int tpurt__cpu_amx_bf16(void);

/* ------------------------------------------------------- wait / notify */
/* A wait word: waiters spin for a while, then sleep on a futex; notifiers
 * bump the epoch and issue a wake syscall only when someone sleeps (wait.c).
 * Waiters notified from different threads belong on different lines. */
typedef struct tpurt__waiter {
  _Atomic uint32_t epoch;
  _Atomic uint32_t sleepers;
} tpurt__waiter;
TPURT_INTERNAL void tpurt__notify(tpurt__waiter *w);
/* 1 if pred(ctx) became true within spin_ns of polling (pause, and a
 * sched_yield every 64 polls unless TORCH_TPU_SPIN_YIELD=0), else 0. */
TPURT_INTERNAL int tpurt__spin_for(int (*pred)(void *), void *ctx, int64_t spin_ns);
/* Waits until pred(ctx) != 0. */
TPURT_INTERNAL void tpurt__wait(tpurt__waiter *w, int (*pred)(void *), void *ctx, int64_t spin_ns);
/* A counter waited for up to targets: a sleeper lowers *wake_at to its
 * target, and the notifier wakes the sleepers only when the counter has
 * reached *wake_at (then resets it to UINT64_MAX; woken waiters that are
 * not done announce their target again). */
TPURT_INTERNAL void tpurt__wait_until(tpurt__waiter *w, _Atomic uint64_t *v, uint64_t target,
                                      _Atomic uint64_t *wake_at, int64_t spin_ns);
/* After storing value into the counter. */
TPURT_INTERNAL void tpurt__notify_reached(tpurt__waiter *w, uint64_t value, _Atomic uint64_t *wake_at);
TPURT_INTERNAL int64_t tpurt__now_ns(void);
/* trace.c: the event ring behind tpurt_trace_* (tpurt.h); every hook sits
 * behind TPURT__TRACE_ON(), one relaxed load and a predictable branch */
TPURT_INTERNAL extern _Atomic int tpurt__trace_on;
#define TPURT__TRACE_ON() __builtin_expect(atomic_load_explicit(&tpurt__trace_on, memory_order_relaxed), 0)
TPURT_INTERNAL extern _Thread_local uint64_t tpurt__trace_corr;
/* The op (or compiled call) whose flush runs a plan: a LAUNCH event's b. */
TPURT_INTERNAL extern _Thread_local uint64_t tpurt__trace_ctx;
TPURT_INTERNAL void tpurt__trace_emit(int kind, int64_t ts, int64_t dur, const char *name, const char *site, int dev,
                                      int stream, uint64_t seq, uint64_t corr, int64_t a, int64_t b);
/* a command enqueued on stream s as number seq at time ts (0: now): its
 * LAUNCH, and one MEMBER per op tpurt__trace_members named for it (consumed) */
TPURT_INTERNAL void tpurt__trace_launch(const tpurt_stream *s, const char *name, uint64_t seq, int64_t ts);
TPURT_INTERNAL void tpurt__trace_members(const uint64_t *corr, int n);
/* ktimes.c: per-name command times (TORCH_TPU_KERNEL_TIMES=1), printed at exit */
TPURT_INTERNAL int tpurt__ktimes_on(void);
TPURT_INTERNAL void tpurt__ktimes_add(const char *name, int64_t ns);
#define TPURT_SPIN_NS 50000

static inline void tpurt__pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ----------------------------------------------------------- streams */
typedef struct tpurt__slot {
  tpurt_kernel_fn fn;
  const char *name;
  void *heap_args; /* non-NULL when args did not fit inline; a batch (stream.c) */
  uint64_t seq;    /* the (first) command's sequence number */
  _Alignas(16) unsigned char args[TPURT_MAX_ARGS_INLINE];
} tpurt__slot;

struct tpurt_stream {
  int dev;
  int64_t id;
  int priority;
  uint32_t cap; /* ring slots */
  tpurt__slot *ring;
  pthread_mutex_t mu; /* producers (held by a thread's open batch throughout) */
  uint64_t slots;     /* ring slots written (producers, under mu) */
  /* commands enqueued (= last seq), those of an open batch included */
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) _Atomic uint64_t pub;  /* commands the worker may run (<= tail) */
  _Alignas(64) _Atomic uint64_t head; /* commands completed (= completed seq) */
  _Alignas(64) tpurt__waiter work_w;  /* worker sleeps here */
  _Alignas(64) tpurt__waiter done_w;  /* synchronizers / full producers */
  _Atomic uint64_t wake_at;           /* the first seq a done_w sleeper waits for */
  _Alignas(64) pthread_mutex_t err_mu;
  tpurt_status err;
  uint64_t err_seq; /* the command that failed */
  char errmsg[TPURT_ERRMSG_LEN];
  pthread_t thread;
  pthread_mutex_t dmu; /* the pending deferred graph (graph/record.c) */
  void *dgraph;
  _Atomic int defer_running; /* graphs of this stream being run (their launches not all enqueued yet) */
  int defer_loop_len; /* recorded ops per graph once a loop was detected (0: none) */
  int defer_since_cut;     /* ops recorded since the last program cut (graph/record.c, segments) */
  int defer_prev_interval; /* ops between the last two program cuts */
  int defer_seg_ok;        /* the last two intervals were equal: segments are on */
  void *dearly;            /* early execution of a predicted plan (graph/execute.c) */
};

struct tpurt_event {
  int flags;
  _Atomic int refs;
  _Atomic int dev;
  _Atomic uint64_t recorded; /* number of records issued */
  _Atomic uint64_t done;     /* highest record counter completed */
  _Atomic int64_t time_ns;   /* completion time of record `done` */
  _Atomic(tpurt_stream *) stream;
  tpurt__waiter w;
};

/* Default stream without error reporting (NULL on failure). */
TPURT_INTERNAL tpurt_stream *tpurt__default_stream(int dev);
/* Queue a command; returns its sequence number in *seq. */
TPURT_INTERNAL tpurt_status tpurt__enqueue(tpurt_stream *s, const char *name, tpurt_kernel_fn fn,
                                           const void *args, size_t args_size, uint64_t *seq);
/* A batch: from tpurt__batch_begin(s) to tpurt__batch_end(s), the calling
 * thread's commands on s (a graph's launches) are numbered as usual but
 * reach the worker a few ring items at a time, each holding a run of them,
 * instead of one item and one wake-up each (stream.c); the worker still
 * runs, times, traces and reports each command by itself. Other producers
 * of s wait for the batch's end; waiting on s from the batching thread
 * hands the commands over first. Returns 0 (no batch: do not end it)
 * under TPU_LAUNCH_BLOCKING or inside another batch of the thread. */
TPURT_INTERNAL int tpurt__batch_begin(tpurt_stream *s);
TPURT_INTERNAL void tpurt__batch_end(tpurt_stream *s);
/* Waits until the stream completed command seq. */
TPURT_INTERNAL void tpurt__stream_wait_seq(tpurt_stream *s, uint64_t seq);
/* Takes (and clears) the pending error, setting last_error; TPURT_OK if none. */
TPURT_INTERNAL tpurt_status tpurt__stream_take_error(tpurt_stream *s);
/* Runs s's chip's pending deferred work (a cut for `reason`), waits until s
 * has completed every command queued so far and returns its pending error. */
TPURT_INTERNAL tpurt_status tpurt__stream_sync(tpurt_stream *s, tpurt_flush_reason reason);
/* The same for an error of command seq or an earlier one (a later
 * command's error stays pending for the next synchronization: a host read
 * placed inside a deferred graph has later commands queued behind it). */
TPURT_INTERNAL tpurt_status tpurt__stream_take_error_upto(tpurt_stream *s, uint64_t seq);
/* Waits for every created stream of dev, without consuming errors. */
TPURT_INTERNAL void tpurt__device_wait(int dev);
static inline uint64_t tpurt__stream_enqueued(tpurt_stream *s) {
  return atomic_load_explicit(&s->tail, memory_order_acquire);
}
static inline int tpurt__stream_reached(tpurt_stream *s, uint64_t seq) {
  return atomic_load_explicit(&s->head, memory_order_acquire) >= seq;
}
/* Snapshot of every stream created so far (process-wide). */
TPURT_INTERNAL int tpurt__all_streams(tpurt_stream ***out);
/* NULL -> current stream of dev (dev < 0: current device). */
TPURT_INTERNAL tpurt_status tpurt__resolve_stream(tpurt_stream **s, int dev);

/* A fence: "stream s has completed seq". */
typedef struct tpurt__fence {
  tpurt_stream *s;
  uint64_t seq;
} tpurt__fence;

/* ------------------------------------------------- strided operands' bytes */
/* Two strided operands whose byte ranges overlap may still share no byte:
 * with every byte stride of both a multiple of g, each operand's bytes lie
 * in one window of residues mod g (from its first byte, as wide as its
 * element), and windows that miss each other (the two interleaved halves
 * of a stack, real and imaginary parts) mean no byte in common.
 * tpurt__stride_gcd folds an operand's strides (in units of `unit`
 * bytes: 1 for byte strides, the element size for element strides; dims
 * of size 1 left out) into g (start with 0); tpurt__residues_apart is 1 when the
 * windows of operands starting at a and b miss each other (g 0: single
 * elements, never apart). */
static inline uint64_t tpurt__stride_gcd(uint64_t g, int nd, const int64_t *sizes, const int64_t *str, uint64_t unit) {
  for (int k = 0; k < nd; k++) {
    if (sizes[k] <= 1) continue;
    uint64_t a = (uint64_t)(str[k] < 0 ? -str[k] : str[k]) * unit;
    while (a) {
      uint64_t t = g % a;
      g = a;
      a = t;
    }
  }
  return g;
}
static inline int tpurt__residues_apart(uint64_t a, uint64_t ea, uint64_t b, uint64_t eb, uint64_t g) {
  if (g == 0) return 0;
  int64_t diff = (int64_t)(b - a), gi = (int64_t)g;
  uint64_t d = (uint64_t)((diff % gi + gi) % gi); /* b's window starts d bytes into a's period */
  return d >= ea && d + eb <= g;
}

/* ----------------------------------------------------------- memory */
#define TPURT_DEVPTR_BASE 0xE000000000000000ull
#define TPURT_DEVPTR_SHIFT 44
#define TPURT_DEVPTR_OFFMASK ((1ull << TPURT_DEVPTR_SHIFT) - 1)
static inline tpurt_devptr tpurt__devptr_make(int dev, uint64_t off) {
  return TPURT_DEVPTR_BASE + ((uint64_t)dev << TPURT_DEVPTR_SHIFT) + off;
}
static inline uint64_t tpurt__devptr_offset(tpurt_devptr p) { return p & TPURT_DEVPTR_OFFMASK; }
/* Backing storage of a device address; only for code running on a worker. */
TPURT_INTERNAL void *tpurt__host_view(tpurt_devptr p);
/* Bytes of the allocation that starts at p (a promise's size), 0 if none does. */
TPURT_INTERNAL uint64_t tpurt__alloc_bytes(tpurt_devptr p);
/* Checks that [p, p+n) lies in device dev's address space with backing.
 * Sets last error and returns INVALID_ARGUMENT otherwise. */
TPURT_INTERNAL tpurt_status tpurt__check_dev_range(int dev, tpurt_devptr p, int64_t lo, int64_t hi,
                                                   const char *what);

/* ------------------------------------------ DeferAndFuse (graph/record.c) */
/* Promise addresses: memory allocated while recording; backed (real != 0)
 * only once a graph decides it needs memory. */
#define TPURT_PROMISE_TAG 0xD000000000000000ull
#define TPURT_PROMISE_IDSHIFT 36
#define TPURT_PROMISE_OFFMASK ((1ull << TPURT_PROMISE_IDSHIFT) - 1)
static inline int tpurt__is_promise(tpurt_devptr p) { return (p & 0xF000000000000000ull) == TPURT_PROMISE_TAG; }
static inline uint32_t tpurt__promise_id(tpurt_devptr p) {
  return (uint32_t)((p >> TPURT_PROMISE_IDSHIFT) & 0xFFFFFFu);
}
typedef struct tpurt__promise {
  _Atomic tpurt_devptr real; /* backing device address, 0 if none */
  uint64_t size;
  int dev;
  uint8_t used, live, lost, real_freed;
  tpurt_stream *owner; /* stream whose pending graph allocated it */
  tpurt_stream *home;  /* stream it was materialized on */
  int local;           /* planner scratch */
} tpurt__promise;
TPURT_INTERNAL tpurt__promise *tpurt__promise_get(uint32_t id);
TPURT_INTERNAL tpurt_status tpurt__promise_new(int dev, size_t size, tpurt_stream *s, tpurt_devptr *out);
TPURT_INTERNAL tpurt_status tpurt__promise_free(tpurt_devptr p);

TPURT_INTERNAL extern _Atomic int tpurt__defer_on;
TPURT_INTERNAL extern _Thread_local int tpurt__defer_bypass; /* running a graph: launch for real */
static inline int tpurt__deferring(void) {
  return __builtin_expect(atomic_load_explicit(&tpurt__defer_on, memory_order_relaxed), 0) && !tpurt__defer_bypass;
}
TPURT_INTERNAL tpurt_status tpurt__defer_record_launch(tpurt_stream *s, const char *name, tpurt_kernel_fn fn,
                                                      const void *args, size_t args_size);
TPURT_INTERNAL tpurt_status tpurt__defer_record_ew(tpurt_stream *s, const tpurt_ew_program *prog,
                                                  const tpurt_view *outs, const tpurt_view *ins, int nin,
                                                  const double *scalars, int nscalars,
                                                  const char *name);
TPURT_INTERNAL tpurt_status tpurt__defer_record_h2d(tpurt_stream *s, tpurt_devptr dst, const void *src, size_t n);
/* 1 if the free was recorded for when s's pending graph runs. */
TPURT_INTERNAL int tpurt__defer_record_free(tpurt_stream *s, tpurt_devptr p);
/* Notes a device range validated by the launch being recorded. */
TPURT_INTERNAL void tpurt__defer_note(tpurt_devptr p, int64_t lo, int64_t hi);
/* While on, ranges noted by this thread are ones the launch being recorded
 * only reads (kernels mark their pure inputs; everything else counts as
 * possibly written). */
TPURT_INTERNAL void tpurt__defer_note_reads(int on);
TPURT_INTERNAL tpurt_status tpurt__defer_flush_stream(tpurt_stream *s, tpurt_flush_reason reason);
/* Copies the environment generated-kernel compiles run with (graph/codegen.c). */
TPURT_INTERNAL void tpurt__codegen_snapshot_env(void);
/* A graph of s is being run by this thread, which holds s->dmu (graph/record.c). */
TPURT_INTERNAL void tpurt__defer_run_begin(tpurt_stream *s);
TPURT_INTERNAL void tpurt__defer_run_end(tpurt_stream *s);
TPURT_INTERNAL tpurt_status tpurt__defer_flush_device(int dev, tpurt_flush_reason reason);
/* A device->host copy that cuts a deferred graph (graph/): the cut runs
 * the device's graphs as tpurt__defer_flush_device does, and the copy
 * command (fn, args) is enqueued on s inside s's graph, right after the
 * last kernel that may write [src, src + n), so that the host waits for
 * the value and not for the rest of the graph. placed and seq say where
 * it went (placed 0: s had no graph, the caller enqueues the copy). */
typedef struct tpurt__host_read {
  tpurt_stream *s;
  const char *name;
  tpurt_kernel_fn fn;
  const void *args;
  size_t args_size;
  tpurt_devptr src;
  size_t n;
  int placed;
  uint64_t seq;
} tpurt__host_read;
TPURT_INTERNAL tpurt_status tpurt__defer_flush_for_read(tpurt_flush_reason reason, tpurt__host_read *r);
/* The kernels' side of fused execution (elementwise programs run inside
 * other kernels, GEMM epilogues, reduction prologues and epilogues,
 * foreach chains, named copies) is kernels/fused.h. */

/* Launch-side view checks (view.c). */
TPURT_INTERNAL int64_t tpurt__view_numel(const tpurt_view *v);
/* Byte extent [lo, hi) of a non-empty view relative to its pointer. */
TPURT_INTERNAL void tpurt__view_extent(const tpurt_view *v, int64_t *lo, int64_t *hi);
/* Non-NULL, valid dtype, 0..TPURT_MAX_DIMS dims, no negative size. */
TPURT_INTERNAL tpurt_status tpurt__check_view(const tpurt_view *v, const char *what);
/* A non-empty view lies inside chip dev's memory (empty views pass). */
TPURT_INTERNAL tpurt_status tpurt__check_view_range(int dev, const tpurt_view *v, const char *what);

/* ------------------------------------------------------------ dtypes */
/* Intermediate value for generic conversions. */
typedef struct tpurt__val {
  int cls; /* 0 signed int, 1 unsigned int, 2 floating / complex */
  int64_t i;
  uint64_t u;
  double re, im;
} tpurt__val;
TPURT_INTERNAL tpurt__val tpurt__load(tpurt_dtype dt, const void *p);
TPURT_INTERNAL void tpurt__store(tpurt_dtype dt, void *p, tpurt__val v);
TPURT_INTERNAL tpurt__val tpurt__scalar_val(tpurt_scalar s);
TPURT_INTERNAL int64_t tpurt__f2i64(double d);
TPURT_INTERNAL int32_t tpurt__f2i32(double d);
TPURT_INTERNAL uint32_t tpurt__f2u32(double d);
TPURT_INTERNAL uint64_t tpurt__f2u64(double d);

static inline uint32_t tpurt__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float tpurt__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* float -> bfloat16, round to nearest even, NaN stays (quiet) NaN. */
static inline uint16_t tpurt__f32_to_bf16(float f) {
  uint32_t x = tpurt__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}
static inline float tpurt__bf16_to_f32(uint16_t h) { return tpurt__bits_f32((uint32_t)h << 16); }
/* float -> IEEE half, round to nearest even (subnormals, overflow to inf,
 * NaN kept quiet with its top payload bits). */
static inline uint16_t tpurt__f32_to_f16(float f) {
  uint32_t x = tpurt__f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (a >= 0x38800000u) {                                   /* normal half */
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (a >> 13));
  }
  /* subnormal or zero: let the FPU round (default mode is to nearest even) */
  float v = tpurt__bits_f32(a) + 0.5f;
  return (uint16_t)(sign | (tpurt__f32_bits(v) - 0x3f000000u));
}
static inline float tpurt__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else {
      int k = -1;
      do {
        k++;
        m <<= 1;
      } while (!(m & 0x400u));
      bits = sign | ((uint32_t)(112 - k) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  return tpurt__bits_f32(bits);
}

/* ------------------------------------------------------------ philox */
/* Exported (default visibility, not in tpurt.h) for the C tests and the
 * benchmark. Bulk Philox-4x32-10: out[4b + j] = word j of the block with
 * counter (ctr0 + b as 64 bits: low word 0, high word 1; words 2, 3 zero)
 * under key (low word 0, high word 1), b in [0, nblocks). */
#define TPURT_TESTABLE __attribute__((visibility("default")))
TPURT_TESTABLE void tpurt__philox_blocks(uint64_t key, uint64_t ctr0, int64_t nblocks, uint32_t *out);
/* The uniforms of elements [lin0, lin0 + n): element i is (w >> 8) * 2^-24,
 * w = word i % 4 of block off + i / 4 (the mapping of tpurt.h). */
TPURT_TESTABLE void tpurt__philox_uniform(uint64_t key, uint64_t off, int64_t lin0, int64_t n, float *out);
/* The bulk generators' path: 0 portable, 1 AVX2, 2 AVX-512, each capped
 * by what the CPU (and TORCH_TPU_ISA) allows; -1: TORCH_TPU_PHILOX or the
 * best again. force_portable(1) is force(0), force_portable(0) force(-1). */
TPURT_TESTABLE void tpurt__philox_force(int path);
TPURT_TESTABLE void tpurt__philox_force_portable(int on);
/* "avx512", "avx2" or "portable": the path the bulk generators take now. */
TPURT_TESTABLE const char *tpurt__philox_path(void);

/* -------------------------------------------------------------- pool */
TPURT_INTERNAL void tpurt__pool_configure(int nthreads);
/* Nonzero on a thread running a chunk of tpurt_parallel_for (a nested
 * parallel_for would run inline). */
TPURT_INTERNAL int tpurt__pool_nested(void);

#endif
