/*
 * tpurt.h — the one public header of the torch_tpu engine ("TPU runtime").
 *
 * The runtime is C11 and knows nothing of PyTorch. It models an accelerator:
 *   - chips ("devices") with their own address space and HBM capacity,
 *   - a caching device allocator with per-device statistics,
 *   - streams executed asynchronously by one worker each, events,
 *   - host<->device and device<->device copies, strided copy/cast and fill,
 *   - a pinned host allocator, a counter-based (Philox) generator,
 *   - a persistent thread pool that kernels split their work over.
 *
 * Device pointers (tpurt_devptr) are opaque device addresses. They are NOT
 * host pointers: dereferencing one on the host faults. Only code that runs
 * on the device (kernels executed by a stream worker) translates them.
 *
 * Errors: every call that can fail returns a tpurt_status. On failure a
 * human-readable message is available from tpurt_last_error() on the same
 * thread. Errors raised inside asynchronous work are kept by the stream and
 * returned (once) by the next synchronizing call on that stream or device,
 * prefixed with the name of the operation that failed. The runtime never
 * aborts on user error.
 */
#ifndef TPURT_H
#define TPURT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPURT_API_VERSION 1

#if defined(__GNUC__)
#define TPURT_API __attribute__((visibility("default")))
#else
#define TPURT_API
#endif

/* ------------------------------------------------------------------ status */

typedef enum tpurt_status {
  TPURT_OK = 0,
  TPURT_ERR_INVALID_ARGUMENT = 1, /* bad shape, size, pointer, dtype */
  TPURT_ERR_INVALID_DEVICE = 2,   /* device index out of range */
  TPURT_ERR_OUT_OF_MEMORY = 3,    /* device or host allocation failed */
  TPURT_ERR_NOT_SUPPORTED = 4,    /* valid request the runtime cannot do */
  TPURT_ERR_KERNEL = 5,           /* an asynchronous operation failed */
  TPURT_ERR_INDEX = 6,            /* index out of range (async or sync) */
  TPURT_ERR_INTERNAL = 7,
  TPURT_ERR_IO = 8,               /* a file-system call failed (kernel cache) */
  TPURT_ERR_TIMEOUT = 9,          /* a wait for another process ran out of time */
  TPURT_ERR_PEER_LOST = 10        /* another process of a rendezvous has exited */
} tpurt_status;

/* Message of the last failing call on this thread ("" if none). */
TPURT_API const char *tpurt_last_error(void);
TPURT_API const char *tpurt_status_name(tpurt_status s);
TPURT_API int tpurt_api_version(void);
TPURT_API const char *tpurt_version_string(void);

/* ---------------------------------------------------------------- dtypes */

typedef enum tpurt_dtype {
  TPURT_BOOL = 0,
  TPURT_U8,
  TPURT_I8,
  TPURT_I16,
  TPURT_I32,
  TPURT_I64,
  TPURT_F16,
  TPURT_BF16,
  TPURT_F32,
  TPURT_F64,
  TPURT_C64,  /* complex of two f32 */
  TPURT_C128, /* complex of two f64 */
  TPURT_U16,
  TPURT_U32,
  TPURT_U64,
  TPURT_NUM_DTYPES
} tpurt_dtype;

TPURT_API size_t tpurt_dtype_size(tpurt_dtype dt);
TPURT_API const char *tpurt_dtype_name(tpurt_dtype dt);

/* A scalar value as the host gives it; converted to the target dtype with
 * PyTorch's rules (float->int truncates, complex->real takes the real part,
 * anything->bool is "!= 0"). */
typedef enum { TPURT_SCALAR_BOOL, TPURT_SCALAR_INT, TPURT_SCALAR_FLOAT, TPURT_SCALAR_COMPLEX } tpurt_scalar_kind;
typedef struct tpurt_scalar {
  tpurt_scalar_kind kind;
  int64_t i;      /* BOOL, INT */
  double re, im;  /* FLOAT (re), COMPLEX (re, im) */
} tpurt_scalar;

/* Read one element of dtype dt at host address p as a scalar (used by the
 * glue for .item() after copying the element to the host). */
TPURT_API tpurt_scalar tpurt_scalar_load(tpurt_dtype dt, const void *p);

/* ------------------------------------------------------------ lifecycle */

/* Idempotent and thread-safe. Reads TPU_NUM_DEVICES (default 1, 1..64),
 * TORCH_TPU_EMULATE (v5e | v6e | v7x, default v6e), TORCH_TPU_HBM_LIMIT
 * (optional per-chip capacity cap in bytes, suffixes K/M/G accepted),
 * TPU_LAUNCH_BLOCKING (1 = every launch waits for completion) and
 * TPU_NUM_THREADS (thread pool size, default = usable cores). */
TPURT_API tpurt_status tpurt_init(void);
TPURT_API int tpurt_is_initialized(void);
/* 1 in the child of a process that had initialized the runtime: its
 * workers did not survive fork(), so every call fails there. */
TPURT_API int tpurt_in_bad_fork(void);
TPURT_API int tpurt_device_count(void);
TPURT_API int tpurt_launch_blocking(void);
TPURT_API void tpurt_set_launch_blocking(int on);

typedef struct tpurt_device_props {
  char name[64];          /* "TPU v6e (emulated)" */
  char generation[8];     /* "v6e" */
  uint64_t hbm_bytes;     /* HBM of the real chip (spec sheet) */
  uint64_t total_memory;  /* capacity of this emulated chip (capped to the host) */
  double peak_bf16_flops; /* spec sheet, per chip */
  double peak_int8_ops;   /* spec sheet, per chip */
  double hbm_bandwidth;   /* spec sheet, bytes/s */
  int tensor_cores;       /* TensorCores per chip (spec sheet) */
  int host_threads;       /* threads of the pool that executes kernels */
} tpurt_device_props;

TPURT_API tpurt_status tpurt_device_get_props(int dev, tpurt_device_props *out);

/* The host CPU as the kernels see it (cpu.c): detected once at run time,
 * never taken from the build host. Feature flags are 1 only where the CPU
 * has the feature and the OS saves its register state. */
typedef struct tpurt_cpu_info {
  char vendor[16];  /* "GenuineIntel", "AuthenticAMD" */
  char model[64];   /* cpuid brand string */
  int avx2, fma, avx512f, avx512dq, avx512bw, avx512vl, avx512_bf16, avx512_fp16;
  int amx_tile, amx_bf16, amx_int8;
  int amx_usable;     /* tile state enabled by the OS and granted to this process */
  char amx_note[160]; /* why AMX is not used where the CPU has it ("" otherwise) */
  int64_t l1d_bytes, l2_bytes, l3_bytes; /* per the OS; 0 when unknown */
  int host_isa;       /* best level of the host: 0 scalar, 1 avx2, 2 avx512, 3 amx */
  int isa;            /* level in force (TORCH_TPU_ISA caps it) */
  char isa_name[16];  /* "scalar" | "avx2" | "avx512" | "amx" */
  char build[16];     /* the x86-64 level this copy of the library was compiled for:
                         "x86-64", "x86-64-v3", "x86-64-v4" (the dynamic loader maps
                         the best variant the host runs) or "native" */
} tpurt_cpu_info;

/* Never NULL; valid for the life of the process. */
TPURT_API const tpurt_cpu_info *tpurt_cpu_get_info(void);
/* The kernel behind bf16 products at the level in force: "amx-bf16 tiles",
 * "avx512-bf16 dot products" or "f32 GEMM". */
TPURT_API const char *tpurt_bf16_gemm_path(void);
/* The kernel behind bf16 2-D convolutions (forward, input and weight
 * gradients) at the level in force: "amx-bf16 tiles", "avx512-bf16 dot
 * products" (TORCH_TPU_CONV_BF16=1), "avx512-bf16 dot products for large
 * passes, f32 implicit GEMM below" (the default without the tile unit) or
 * "f32 implicit GEMM"; and how many convolution passes (one per
 * group and phase) have run on the bf16 kernels (either of the first two)
 * in this process; of those, how many read their patch rows in place
 * (implicit patch rows on the dot products). */
TPURT_API const char *tpurt_bf16_conv_path(void);
TPURT_API uint64_t tpurt_bf16_conv_tile_passes(void);
TPURT_API uint64_t tpurt_bf16_conv_implicit_passes(void);

/* Current device of the calling thread (like cudaSetDevice). Default 0. */
TPURT_API int tpurt_get_device(void);
TPURT_API tpurt_status tpurt_set_device(int dev);

/* Waits for all streams of the device; returns a pending async error. */
TPURT_API tpurt_status tpurt_device_synchronize(int dev);

/* --------------------------------------------------------------- memory */

typedef uint64_t tpurt_devptr; /* opaque device address, 0 = null */

/* Device index encoded in a device address, or -1 if p is not one. */
TPURT_API int tpurt_devptr_device(tpurt_devptr p);

typedef struct tpurt_stream tpurt_stream;
typedef struct tpurt_event tpurt_event;

/* Caching allocator. Memory returned for stream s may be reused by later
 * allocations on s as soon as it is freed (stream order makes this safe);
 * s == NULL means the device's default stream. size 0 returns 0 (null).
 * On exhaustion the allocator frees its cache and retries once, then
 * returns TPURT_ERR_OUT_OF_MEMORY with a message giving the request, the
 * capacity, the free memory and what is allocated and reserved. */
TPURT_API tpurt_status tpurt_malloc(int dev, size_t size, tpurt_stream *s, tpurt_devptr *out);
TPURT_API tpurt_status tpurt_free(tpurt_devptr p);
/* Marks p as used by stream s too: its block is not reused before the work
 * queued on s so far has completed. */
TPURT_API tpurt_status tpurt_record_stream(tpurt_devptr p, tpurt_stream *s);
/* Synchronizes the device, then returns unused cached segments. */
TPURT_API tpurt_status tpurt_empty_cache(int dev);

enum { TPURT_POOL_ALL = 0, TPURT_POOL_SMALL = 1, TPURT_POOL_LARGE = 2, TPURT_NUM_POOLS = 3 };

typedef struct tpurt_stat {
  int64_t current, peak, allocated, freed;
} tpurt_stat;

typedef struct tpurt_memory_stats {
  tpurt_stat allocation[TPURT_NUM_POOLS];     /* number of live allocations */
  tpurt_stat segment[TPURT_NUM_POOLS];        /* number of reserved segments */
  tpurt_stat active[TPURT_NUM_POOLS];         /* live + freed-but-pending blocks */
  tpurt_stat inactive_split[TPURT_NUM_POOLS]; /* free blocks inside used segments */
  tpurt_stat allocated_bytes[TPURT_NUM_POOLS];
  tpurt_stat reserved_bytes[TPURT_NUM_POOLS];
  tpurt_stat active_bytes[TPURT_NUM_POOLS];
  tpurt_stat inactive_split_bytes[TPURT_NUM_POOLS];
  tpurt_stat requested_bytes[TPURT_NUM_POOLS];
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t num_device_alloc;
  int64_t num_device_free;
  int64_t num_sync_all_streams;
} tpurt_memory_stats;

TPURT_API tpurt_status tpurt_memory_get_stats(int dev, tpurt_memory_stats *out);
TPURT_API tpurt_status tpurt_memory_reset_peak(int dev);
TPURT_API tpurt_status tpurt_memory_reset_accumulated(int dev);
/* free = capacity - reserved; total = capacity. */
TPURT_API tpurt_status tpurt_memory_get_info(int dev, size_t *free_bytes, size_t *total_bytes);

/* Pinned host memory: page-aligned host buffers the device may read or
 * write asynchronously. A freed buffer is reused only after the work that
 * was queued on every stream at the time of the free has completed. */
TPURT_API tpurt_status tpurt_host_alloc(size_t size, void **out);
TPURT_API tpurt_status tpurt_host_free(void *p);
/* 1 if p points anywhere inside a live pinned allocation. */
TPURT_API int tpurt_host_is_pinned(const void *p);
TPURT_API tpurt_status tpurt_host_empty_cache(void);

typedef struct tpurt_host_stats {
  tpurt_stat allocation;
  tpurt_stat allocated_bytes;
  tpurt_stat reserved_bytes;
} tpurt_host_stats;
TPURT_API void tpurt_host_get_stats(tpurt_host_stats *out);

/* ------------------------------------------------------ streams, events */

/* The default stream of dev (id 0). */
TPURT_API tpurt_status tpurt_stream_default(int dev, tpurt_stream **out);
/* A stream from the device's pool of TPURT_STREAM_POOL_SIZE streams
 * (round robin, created on first use; ids 1..TPURT_STREAM_POOL_SIZE). */
#define TPURT_STREAM_POOL_SIZE 8
TPURT_API tpurt_status tpurt_stream_from_pool(int dev, int priority, tpurt_stream **out);
/* Stream with a given id on dev (0 = default), created if needed. */
TPURT_API tpurt_status tpurt_stream_get(int dev, int64_t id, tpurt_stream **out);
TPURT_API int tpurt_stream_device(const tpurt_stream *s);
TPURT_API int64_t tpurt_stream_id(const tpurt_stream *s);
TPURT_API int tpurt_stream_priority(const tpurt_stream *s);

/* Current stream of the calling thread for dev (default stream unless set). */
TPURT_API tpurt_stream *tpurt_stream_current(int dev);
TPURT_API tpurt_status tpurt_stream_set_current(tpurt_stream *s);

/* Waits for all work queued on s; returns (and clears) a pending error. */
TPURT_API tpurt_status tpurt_stream_synchronize(tpurt_stream *s);
/* 1 if all work queued on s has completed, else 0. */
TPURT_API int tpurt_stream_query(tpurt_stream *s);

/* An operation executed on the device by the stream's worker. args points
 * to a copy of the launch arguments. Return TPURT_OK or an error status
 * with a message written into err (at most errlen bytes). */
typedef tpurt_status (*tpurt_kernel_fn)(void *args, char *err, size_t errlen);
#define TPURT_MAX_ARGS_INLINE 960
/* Queues fn on s (args copied, any size). Returns immediately unless launch
 * blocking is on, in which case it waits and returns the op's own error.
 * name is a string with static lifetime ("aten::add", "copy_h2d", ...). */
TPURT_API tpurt_status tpurt_launch(tpurt_stream *s, const char *name, tpurt_kernel_fn fn,
                                    const void *args, size_t args_size);

/* ------------------------------------------ execution modes (src/graph/)
 *
 * STRICT runs every launch as it comes (asynchronously); BLOCKING waits for
 * every launch (errors surface at the op that caused them); DEFER records
 * launches per stream instead of queueing them. A recorded graph runs when
 * it is cut: host synchronization (stream/device/event sync, device->host
 * copies), event records and cross-stream waits, record_stream, a mode
 * change, an explicit tpurt_flush, or the size cap. At the cut, consecutive
 * elementwise programs are fused into one program (values pass in
 * registers), stores to buffers that die inside the graph are dropped, and
 * buffers allocated while recording ("promises": device addresses without
 * memory) get memory only if they are still alive or must be read back
 * from memory by another kernel; memory is allocated before its first use
 * and freed after its last use in stream order. The plan (fusion, stores,
 * allocation points) is cached by the graph's structure: launch-time
 * scalars, buffer addresses and the argument values of non-elementwise
 * kernels are not part of the key, so a training loop reuses one plan. */
typedef enum tpurt_exec_mode {
  TPURT_MODE_STRICT = 0,
  TPURT_MODE_BLOCKING = 1,
  TPURT_MODE_DEFER = 2
} tpurt_exec_mode;
/* Leaving DEFER flushes every pending graph first. */
TPURT_API tpurt_status tpurt_set_exec_mode(tpurt_exec_mode mode);
TPURT_API tpurt_exec_mode tpurt_get_exec_mode(void);

typedef enum tpurt_flush_reason {
  TPURT_FLUSH_EXPLICIT = 0, /* tpurt_flush / torch_tpu.flush() */
  TPURT_FLUSH_SYNC,         /* stream or device synchronize, stream query */
  TPURT_FLUSH_EVENT,        /* event record / wait */
  TPURT_FLUSH_STREAM,       /* record_stream, a cross-stream use */
  TPURT_FLUSH_TO_HOST,      /* device->host copy (.cpu(), .tolist(), .numpy()) */
  TPURT_FLUSH_ITEM,         /* .item() or Python control flow on a device value */
  TPURT_FLUSH_PRINT,        /* print / repr of a device tensor */
  TPURT_FLUSH_SAVE,         /* torch.save */
  TPURT_FLUSH_SIZE_CAP,     /* the graph reached the size cap */
  TPURT_FLUSH_LOOP,         /* the recorded ops repeat a cached graph */
  TPURT_FLUSH_MODE,         /* leaving the DEFER mode */
  TPURT_FLUSH_COLLECTIVE,   /* collective communication */
  TPURT_FLUSH_SEGMENT,      /* pipelining: a segment of a graph between program cuts */
  TPURT_FLUSH_NUM_REASONS
} tpurt_flush_reason;
TPURT_API const char *tpurt_flush_reason_name(tpurt_flush_reason r);
/* Runs the pending graphs of every stream of dev (dev < 0: every device). */
TPURT_API tpurt_status tpurt_flush(int dev, tpurt_flush_reason reason);
/* The reason to record for the next implicit cut made by this thread
 * (e.g. the device->host copy of .item()); cleared by that cut. */
TPURT_API void tpurt_flush_hint(tpurt_flush_reason reason);
/* A callback that names the user's source line ("file.py:12") of the op
 * being recorded (reason == NULL) or of a cut (*reason may be refined, e.g.
 * a device->host copy made by print becomes TPURT_FLUSH_PRINT). The string
 * must stay valid for the life of the process. NULL disables it. */
typedef const char *(*tpurt_site_fn)(tpurt_flush_reason *reason);
TPURT_API void tpurt_defer_set_site_fn(tpurt_site_fn fn);
/* Recorded ops per graph before a size-cap cut (default 8192; >= 16). */
TPURT_API void tpurt_defer_set_max_ops(int n);
/* Pipelining: the ops recorded after a program cut (a sync, a host copy,
 * an explicit flush, ...) run in segments of n ops, each launched as soon
 * as it is recorded, so the device executes one segment while the host
 * records the next (0: off, the default; other values >= 8). Segments
 * restart at every program cut, so a loop that cuts every iteration maps
 * to the same cached graphs; they are used once the last two intervals
 * between program cuts had the same number of ops (such a loop), and not
 * past the size cap without a program cut (the size cap and loop
 * detection take over). A value that crosses a segment
 * boundary is materialized and fusion stops there: segments trade the
 * memory plan (activations that die or are recomputed later in the
 * iteration) for overlap, hence off by default. */
TPURT_API void tpurt_defer_set_segment_ops(int n);
TPURT_API int tpurt_defer_get_segment_ops(void);

typedef struct tpurt_defer_stats {
  uint64_t flushes[TPURT_FLUSH_NUM_REASONS];
  uint64_t graphs_built;        /* plans built (cache misses) */
  uint64_t cache_hits;          /* flushes that reused a cached plan */
  uint64_t ops_recorded;        /* launches recorded */
  uint64_t kernels_launched;    /* kernels run by flushes */
  uint64_t fused_kernels;       /* launched programs made of >= 2 recorded ops */
  uint64_t ops_fused;           /* recorded ops that ran inside fused programs */
  uint64_t ops_eliminated;      /* elementwise ops whose results were never needed */
  uint64_t stores_eliminated;   /* outputs kept in registers instead of memory */
  uint64_t bytes_materialized;  /* promise bytes that got memory */
  uint64_t bytes_never_materialized; /* promise bytes that never took memory */
  uint64_t cached_plans;        /* plans in the cache now */
  uint64_t values_recomputed;   /* values recomputed for late readers instead of kept */
  uint64_t bytes_recomputed;    /* their bytes */
  /* Generated kernels (the second tier of elementwise programs, in every
   * mode): counted over launches of programs with >= 2 compute
   * instructions, the ones code generation applies to. */
  uint64_t codegen_kernels;              /* kernels compiled and loaded */
  uint64_t codegen_failures;             /* programs whose compile or load failed (interpreted) */
  uint64_t codegen_not_generated;        /* launches the generator declined (overlapping operands) */
  uint64_t codegen_launches_compiled;    /* launches run by a generated kernel */
  uint64_t codegen_launches_interpreted; /* launches the interpreter ran (compile pending or failed,
                                            declined, TORCH_TPU_CODEGEN=0) */
  double codegen_compile_seconds;        /* wall time spent generating, compiling and loading */
  /* Early execution: a predicted plan's steps run while its graph is recorded. */
  uint64_t early_steps;     /* steps run before their graph's cut */
  uint64_t early_graphs;    /* graphs whose cut resumed an early run */
  uint64_t early_discarded; /* graphs that were not the prediction: early work discarded, run from the start */
} tpurt_defer_stats;
TPURT_API void tpurt_defer_get_stats(tpurt_defer_stats *out);
/* Whether generated elementwise kernels are available: 1 and the compiler
 * (version, target ISA, compile mode) in buf, or 0 and why the interpreter
 * serves every program (TORCH_TPU_CODEGEN=0, no C compiler, ...). May run
 * the compiler once to find it. */
TPURT_API int tpurt_codegen_info(char *buf, size_t n);
TPURT_API void tpurt_defer_reset_stats(void);
/* The i-th most recent cut (0 = latest); returns 0 if there is none. */
typedef struct tpurt_flush_record {
  tpurt_flush_reason reason;
  const char *site;   /* user source line or "" */
  int ops;            /* recorded ops */
  int kernels;        /* kernels launched */
  int cache_hit;
} tpurt_flush_record;
TPURT_API int tpurt_defer_get_flush(int i, tpurt_flush_record *out);

/* --------------------------------------------------------- kernel cache */
/* Compiled kernels (shared objects built by the code generator with the
 * system C compiler) persist in a directory shared by processes:
 * TORCH_TPU_CACHE_DIR, default $XDG_CACHE_HOME/torch_tpu, else
 * ~/.cache/torch_tpu (created with mode 0700). An entry is loaded only after
 * its whole key (kernel source, runtime version, compiler and its version,
 * flags, target ISA) compared equal and its content hash checked; the
 * directory and the entry must belong to the effective user and not be
 * writable by group or others, or the cache is refused (one warning, the
 * kernels run without it). TORCH_TPU_CACHE_READONLY=1: lookups only, nothing
 * written, touched or deleted. TORCH_TPU_CACHE_MAX_BYTES (default 1 GiB,
 * K/M/G suffixes): least recently read entries are evicted past it. Stats
 * are this process's, thread-safe. */
typedef struct tpurt_kcache_stats {
  uint64_t requests;        /* lookups (TorchTPU: num_cache_reqs) */
  uint64_t hits;            /* lookups that returned a verified entry (num_cache_hits) */
  uint64_t misses;          /* lookups that did not (requests - hits) */
  uint64_t refused;         /* of the misses: directory or entry refused by the
                               security checks, or the cache unusable */
  uint64_t corrupt;         /* corrupt entries found (removed unless read-only) */
  uint64_t stores;          /* entries stored (or found already stored) */
  uint64_t stores_skipped;  /* stores not done: read-only, disabled, over the cap */
  uint64_t store_failures;  /* stores that failed (full disk, permissions) */
  uint64_t evictions;       /* entries evicted by the size cap */
  uint64_t max_bytes;       /* the size cap in force */
  int readonly;             /* TORCH_TPU_CACHE_READONLY=1 */
  int usable;               /* the directory passes the checks now */
} tpurt_kcache_stats;
TPURT_API tpurt_status tpurt_kcache_get_stats(tpurt_kcache_stats *out);
/* Entries this process looked up with a hit or stored, in first-seen order. */
typedef struct tpurt_kcache_entry_stats {
  char key_hash[65];        /* entry id: hex SHA-256 of the key (its file name) */
  uint64_t read_count;      /* hits in this process */
  double compile_seconds;   /* compile time reported at store (kept in the entry) */
  double last_read;         /* Unix time of the last hit in this process, 0 if none */
} tpurt_kcache_entry_stats;
TPURT_API int tpurt_kcache_entry_count(void);
/* TPURT_ERR_INVALID_ARGUMENT when i is out of [0, tpurt_kcache_entry_count()). */
TPURT_API tpurt_status tpurt_kcache_get_entry(int i, tpurt_kcache_entry_stats *out);
/* Removes every cache file (entries, locks, temporaries: only files named as
 * the cache names them) from the directory and resets the stats and entry
 * records. In read-only mode, or when the directory is refused, no file is
 * touched and only the stats are reset (still TPURT_OK). */
TPURT_API tpurt_status tpurt_kcache_clear(void);
/* The cache directory (resolved: a symlinked directory by its target) into
 * buf; TPURT_OK when it is usable, otherwise the reason (buf then holds the
 * configured path, or "" if there is none). */
TPURT_API tpurt_status tpurt_kcache_dir(char *buf, size_t n);

enum { TPURT_EVENT_DEFAULT = 0, TPURT_EVENT_TIMING = 1, TPURT_EVENT_BLOCKING_SYNC = 2 };
TPURT_API tpurt_status tpurt_event_create(int flags, tpurt_event **out);
/* Safe while records are pending: the event is freed once they are done. */
TPURT_API void tpurt_event_destroy(tpurt_event *e);
TPURT_API tpurt_status tpurt_event_record(tpurt_event *e, tpurt_stream *s);
/* 1 if the last record has completed (or the event was never recorded). */
TPURT_API int tpurt_event_query(tpurt_event *e);
TPURT_API tpurt_status tpurt_event_synchronize(tpurt_event *e);
/* Work queued on s after this call starts after e's last record completes. */
TPURT_API tpurt_status tpurt_stream_wait_event(tpurt_stream *s, tpurt_event *e);
/* Milliseconds between two completed records of timing events. */
TPURT_API tpurt_status tpurt_event_elapsed_ms(tpurt_event *start, tpurt_event *end, float *ms);
TPURT_API int tpurt_event_device(const tpurt_event *e); /* -1 if never recorded */

/* ---------------------------------------------------------------- copies */

/* Byte copies, ordered on stream s. Blocking forms (non_blocking == 0) wait
 * for completion and return any pending error of s. Non-blocking forms
 * return once queued: the host buffer must stay valid and unchanged until
 * the stream reaches the copy (use pinned memory). Device-to-device copies
 * between chips order themselves after the source chip's current stream. */
TPURT_API tpurt_status tpurt_memcpy_h2d(tpurt_stream *s, tpurt_devptr dst, const void *src, size_t n,
                                        int non_blocking);
TPURT_API tpurt_status tpurt_memcpy_d2h(tpurt_stream *s, void *dst, tpurt_devptr src, size_t n,
                                        int non_blocking);
TPURT_API tpurt_status tpurt_memcpy_d2d(tpurt_stream *s, tpurt_devptr dst, tpurt_devptr src, size_t n);
/* A transport's window onto device memory — the emulator's counterpart of a
 * NIC reading and writing HBM directly (RDMA, a TPU's ICI): runs the chip's
 * pending deferred work (a collective cut), waits until s has completed
 * every command queued on it so far, and sets *host to the host address of
 * the bytes [p, p + n). The address stays valid while the memory stays
 * allocated; the caller orders later device work on those bytes after its
 * own accesses (the collective's completion). */
TPURT_API tpurt_status tpurt_memory_window(tpurt_stream *s, tpurt_devptr p, size_t n, void **host);

/* ------------------------------------------------------------ host board */
/* A rendezvous board in shared memory (/dev/shm) for processes on one host:
 * in each round every member posts a record of rec_bytes (1..4096) and
 * reads every member's record of that round (tpu_dist's collectives check
 * their fingerprints on it when all ranks share the host, instead of a
 * transport round trip). The creator is member 0; it hands the name and
 * token to the others out of band (the process group's store); the file
 * can be unlinked once all have opened it. A member that exits is noticed
 * by the others (TPURT_ERR_PEER_LOST); a member that does not arrive within
 * timeout_ms fails the exchange (TPURT_ERR_TIMEOUT). After a failed
 * exchange the board refuses further rounds (TPURT_ERR_PEER_LOST). One
 * board serves one thread at a time (calls are serialised). */
#define TPURT_BOARD_NAME_LEN 64
typedef struct tpurt_board tpurt_board;
TPURT_API tpurt_status tpurt_board_create(int nranks, size_t rec_bytes, char name[TPURT_BOARD_NAME_LEN],
                                          uint64_t *token, tpurt_board **out);
TPURT_API tpurt_status tpurt_board_open(const char *name, uint64_t token, int nranks, size_t rec_bytes, int rank,
                                        tpurt_board **out);
TPURT_API tpurt_status tpurt_board_unlink(const char *name);
/* Posts `mine` (rec_bytes) and fills all[nranks * rec_bytes], member order. */
TPURT_API tpurt_status tpurt_board_exchange(tpurt_board *b, const void *mine, void *all, int64_t timeout_ms);
TPURT_API void tpurt_board_close(tpurt_board *b);

#define TPURT_MAX_DIMS 25

/* Strided view of device memory: ptr already includes the storage offset;
 * strides are in elements and may be 0 (broadcast) or negative. */
typedef struct tpurt_view {
  tpurt_devptr ptr;
  tpurt_dtype dtype;
  int ndim;
  int64_t sizes[TPURT_MAX_DIMS];
  int64_t strides[TPURT_MAX_DIMS];
} tpurt_view;

/* dst[i] = cast(src[i]) for every index of dst's shape; src must have the
 * same shape (use stride 0 to broadcast). Both on s's device. Async. */
TPURT_API tpurt_status tpurt_copy_strided(tpurt_stream *s, const tpurt_view *dst, const tpurt_view *src);
/* dst[i] = value converted to dst's dtype. Async. */
TPURT_API tpurt_status tpurt_fill(tpurt_stream *s, const tpurt_view *dst, tpurt_scalar value);

/* ------------------------------------------------------------ thread pool */

TPURT_API int tpurt_num_threads(void);
typedef void (*tpurt_parallel_fn)(void *ctx, int64_t begin, int64_t end);
/* Splits [0, n) into chunks of at least grain and runs fn over the pool;
 * the caller takes part. Nested or concurrent calls run inline. */
TPURT_API void tpurt_parallel_for(int64_t n, int64_t grain, tpurt_parallel_fn fn, void *ctx);

/* ------------------------------------------------------------------ RNG */

/* Philox-4x32-10 (Salmon et al., SC'11): counter-based, so the same
 * (seed, offset) gives the same numbers whatever executes them. */
TPURT_API void tpurt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Per-device generator state: a seed and a counter offset (in 128-bit
 * Philox blocks). Kernels that draw n blocks reserve [offset, offset+n). */
typedef struct tpurt_generator {
  uint64_t seed;
  uint64_t offset;
} tpurt_generator;
/* Returns the offset to use and advances the generator by n blocks. */
TPURT_API uint64_t tpurt_generator_reserve(tpurt_generator *g, uint64_t n);
/* Seed from the OS entropy source. */
TPURT_API uint64_t tpurt_nondeterministic_seed(void);

/* ================================================================ KERNELS
 *
 * Every kernel is asynchronous (queued on s, errors at the next sync) and
 * takes tpurt_views: device pointer (storage offset included), dtype, sizes,
 * element strides. Shapes are validated at launch; kernels never read or
 * write outside the views. One engine for every execution mode: strict eager
 * launches one-op programs; DeferAndFuse (later) builds longer programs and
 * prologue/epilogue chains from the same instructions.
 */

/* ------------------------------------------------- elementwise programs */

/* A program over block registers: the kernel walks the output shape in
 * blocks; registers hold one block of values in the compute type. */
typedef enum tpurt_ew_op {
  /* sources */
  TPURT_EW_LOAD = 0,   /* dst = input[p0] converted to the compute type */
  TPURT_EW_SCALAR,     /* dst = scalars[p0] (launch-time value: lr, step, ...) */
  TPURT_EW_CONST,      /* dst = p0 (compile-time constant) */
  /* unary: dst = f(src0) */
  TPURT_EW_NEG, TPURT_EW_ABS, TPURT_EW_SQRT, TPURT_EW_RSQRT, TPURT_EW_RECIPROCAL, TPURT_EW_SQUARE,
  TPURT_EW_EXP, TPURT_EW_EXP2, TPURT_EW_EXPM1, TPURT_EW_LOG, TPURT_EW_LOG2, TPURT_EW_LOG10, TPURT_EW_LOG1P,
  TPURT_EW_SIN, TPURT_EW_COS, TPURT_EW_TAN, TPURT_EW_ASIN, TPURT_EW_ACOS, TPURT_EW_ATAN,
  TPURT_EW_SINH, TPURT_EW_COSH, TPURT_EW_TANH, TPURT_EW_ASINH, TPURT_EW_ACOSH, TPURT_EW_ATANH,
  TPURT_EW_SIGMOID, TPURT_EW_LOGIT, TPURT_EW_ERF, TPURT_EW_ERFC, TPURT_EW_ERFINV, TPURT_EW_LGAMMA,
  TPURT_EW_DIGAMMA, TPURT_EW_SIGN, TPURT_EW_SGN, TPURT_EW_FLOOR, TPURT_EW_CEIL, TPURT_EW_ROUND,
  TPURT_EW_TRUNC, TPURT_EW_FRAC, TPURT_EW_RELU, TPURT_EW_GELU, TPURT_EW_GELU_TANH, TPURT_EW_SILU,
  TPURT_EW_MISH, TPURT_EW_SOFTPLUS,   /* p0 beta, p1 threshold */
  TPURT_EW_LEAKY_RELU,                /* p0 negative slope */
  TPURT_EW_HARDTANH,                  /* p0 min, p1 max (also clamp with scalar bounds) */
  TPURT_EW_ELU,                       /* p0 alpha, p1 scale, p2 input_scale */
  TPURT_EW_HARDSIGMOID, TPURT_EW_HARDSWISH, TPURT_EW_LOGICAL_NOT, TPURT_EW_BITWISE_NOT,
  TPURT_EW_ISNAN, TPURT_EW_ISINF, TPURT_EW_ISFINITE, TPURT_EW_ISPOSINF, TPURT_EW_ISNEGINF,
  TPURT_EW_NAN_TO_NUM,                /* p0 nan, p1 posinf, p2 neginf */
  TPURT_EW_CAST,                      /* dst = src0 rounded through dtype p0 (e.g. bf16) */
  /* binary: dst = f(src0, src1) */
  TPURT_EW_ADD,                       /* src0 + p0 * src1 (p0 = alpha, default 1) */
  TPURT_EW_SUB,                       /* src0 - p0 * src1 */
  TPURT_EW_MUL, TPURT_EW_DIV, TPURT_EW_DIV_TRUNC, TPURT_EW_DIV_FLOOR, TPURT_EW_REMAINDER, TPURT_EW_FMOD,
  TPURT_EW_POW, TPURT_EW_ATAN2, TPURT_EW_HYPOT, TPURT_EW_COPYSIGN, TPURT_EW_XLOGY,
  TPURT_EW_MAXIMUM, TPURT_EW_MINIMUM, TPURT_EW_FMAX, TPURT_EW_FMIN,
  TPURT_EW_EQ, TPURT_EW_NE, TPURT_EW_LT, TPURT_EW_LE, TPURT_EW_GT, TPURT_EW_GE,
  TPURT_EW_LOGICAL_AND, TPURT_EW_LOGICAL_OR, TPURT_EW_LOGICAL_XOR,
  TPURT_EW_BITWISE_AND, TPURT_EW_BITWISE_OR, TPURT_EW_BITWISE_XOR, TPURT_EW_LSHIFT, TPURT_EW_RSHIFT,
  /* activation backward: dst = grad(src0 = grad_output, src1 = input or output) */
  TPURT_EW_THRESHOLD_BACKWARD,        /* src1 <= p0 ? 0 : src0 (relu backward with p0 = 0) */
  TPURT_EW_GELU_BACKWARD, TPURT_EW_GELU_TANH_BACKWARD, TPURT_EW_SILU_BACKWARD,
  TPURT_EW_SIGMOID_BACKWARD,          /* src1 = output */
  TPURT_EW_TANH_BACKWARD,             /* src1 = output */
  TPURT_EW_SOFTPLUS_BACKWARD,         /* p0 beta, p1 threshold; src1 = input */
  TPURT_EW_LEAKY_RELU_BACKWARD,       /* p0 slope */
  TPURT_EW_HARDTANH_BACKWARD,         /* p0 min, p1 max */
  TPURT_EW_ELU_BACKWARD,              /* p0 alpha, p1 scale, p2 input_scale, p3 is_result (src1 = output) */
  TPURT_EW_HARDSIGMOID_BACKWARD, TPURT_EW_HARDSWISH_BACKWARD, TPURT_EW_MISH_BACKWARD,
  /* ternary: dst = f(src0, src1, src2) */
  TPURT_EW_WHERE,                     /* src0 != 0 ? src1 : src2 */
  TPURT_EW_CLAMP,                     /* min(max(src0, src1), src2); NaN bounds propagate */
  TPURT_EW_LERP,                      /* src0 + src2 * (src1 - src0) */
  TPURT_EW_ADDCMUL,                   /* src0 + p0 * src1 * src2 */
  TPURT_EW_ADDCDIV,                   /* src0 + p0 * src1 / src2 */
  /* special functions and remaining pointwise ops (real compute unless noted) */
  TPURT_EW_I0, TPURT_EW_I0E, TPURT_EW_I1, TPURT_EW_I1E,           /* modified Bessel I (e: exp(-|x|) scaled) */
  TPURT_EW_BESSEL_J0, TPURT_EW_BESSEL_J1, TPURT_EW_BESSEL_Y0, TPURT_EW_BESSEL_Y1,
  TPURT_EW_BESSEL_K0, TPURT_EW_BESSEL_K1, TPURT_EW_BESSEL_K0E, TPURT_EW_BESSEL_K1E, /* e: exp(x) scaled */
  TPURT_EW_SPHERICAL_BESSEL_J0, TPURT_EW_AIRY_AI,
  TPURT_EW_POLYGAMMA,                 /* p0 = n (0: digamma, 1: trigamma, ...) */
  TPURT_EW_NDTRI, TPURT_EW_LOG_NDTR, TPURT_EW_ERFCX, TPURT_EW_ENTR, TPURT_EW_SINC,
  TPURT_EW_SIGNBIT,                   /* 1 if the sign bit is set (integers: x < 0) */
  TPURT_EW_HARDSHRINK,                /* |x| <= p0 ? 0 : x */
  TPURT_EW_SOFTSHRINK,                /* x > p0 ? x - p0 : x < -p0 ? x + p0 : 0 */
  TPURT_EW_ANGLE,                     /* real: pi if x < 0 else 0 (NaN kept); complex: arg (zero imag) */
  TPURT_EW_FREXP_MANTISSA, TPURT_EW_FREXP_EXPONENT, /* x = m * 2^e, |m| in [0.5, 1) */
  TPURT_EW_ZETA,                      /* Hurwitz zeta(src0, src1) */
  TPURT_EW_IGAMMA, TPURT_EW_IGAMMAC,  /* regularized lower / upper incomplete gamma (a = src0, x = src1) */
  TPURT_EW_XLOG1PY,                   /* src0 * log1p(src1), 0 where src0 == 0 (NaN src1 propagates) */
  TPURT_EW_LOGADDEXP, TPURT_EW_LOGADDEXP2,
  TPURT_EW_HEAVISIDE,                 /* src0 == 0 ? src1 : src0 > 0 */
  TPURT_EW_NEXTAFTER,                 /* p0 = 0, or TPURT_F16 / TPURT_BF16: step in that format */
  /* orthogonal polynomials: src0 = x, src1 = n (truncated to an integer; n < 0 gives 0) */
  TPURT_EW_CHEBYSHEV_T, TPURT_EW_CHEBYSHEV_U, TPURT_EW_CHEBYSHEV_V, TPURT_EW_CHEBYSHEV_W,
  TPURT_EW_SHIFTED_CHEBYSHEV_T, TPURT_EW_SHIFTED_CHEBYSHEV_U, TPURT_EW_SHIFTED_CHEBYSHEV_V,
  TPURT_EW_SHIFTED_CHEBYSHEV_W, TPURT_EW_HERMITE_H, TPURT_EW_HERMITE_HE, TPURT_EW_LAGUERRE_L,
  TPURT_EW_LEGENDRE_P,
  TPURT_EW_SHRINK_BACKWARD,           /* |src1| <= p0 ? 0 : src0 (hardshrink and softshrink backward) */
  TPURT_EW_LOGIT_BACKWARD,            /* src0 / (src1 (1 - src1)); p0 = eps: src1 outside [eps, 1 - eps] gives 0,
                                         or with p0 < 0 (no eps) outside [0, 1] NaN */
  TPURT_EW_COMPLEX,                   /* complex compute: re(src0) + i re(src1) */
  TPURT_EW_POLAR,                     /* complex compute: re(src0) * (cos re(src1) + i sin re(src1)) */
  /* random source (no register read): dst = a uniform [0, 1) float drawn for
   * the element's row-major index i over the output shape, word i % 4 of the
   * Philox-4x32-10 block (offset + i / 4) under key seed — the mapping of the
   * random kernels' 32-bit draws. Launch scalars: seed = scalars[p0] +
   * 2^32 scalars[p0 + 1], offset = scalars[p0 + 2] + 2^32 scalars[p0 + 3]
   * (each a 32-bit half), so a new draw per launch keeps the program. */
  TPURT_EW_UNIFORM,
  /* integers only: gcd(|src0|, |src1|) (gcd(0, 0) = 0); lcm = |src0 / gcd * src1| (0 when the gcd is 0) */
  TPURT_EW_GCD, TPURT_EW_LCM,
  TPURT_EW_NUM_OPS
} tpurt_ew_op;

#define TPURT_EW_MAX_INST 64
#define TPURT_EW_MAX_REGS 32
#define TPURT_EW_MAX_IO 16

typedef struct tpurt_ew_inst {
  uint16_t op;     /* tpurt_ew_op */
  uint8_t dst;     /* register written */
  uint8_t src[3];  /* registers read */
  double p[4];     /* parameters (see the op) */
} tpurt_ew_inst;

/* compute is the type registers hold: TPURT_F32 (for f32/f16/bf16 data, as
 * PyTorch's opmath), TPURT_F64, TPURT_I64 (integers and bool), TPURT_C64 /
 * TPURT_C128 (complex; only ops defined for complex). Loads convert from
 * each input's dtype; stores convert to each output's dtype (bool: != 0). */
typedef struct tpurt_ew_program {
  tpurt_dtype compute;
  int ninst;
  int nout;
  uint8_t out_reg[TPURT_EW_MAX_IO]; /* register stored to outs[i] */
  tpurt_ew_inst inst[TPURT_EW_MAX_INST];
} tpurt_ew_program;

/* Runs prog over the shape of outs[0]: every view (outputs and inputs) has
 * that shape (inputs broadcast through stride 0). Outputs may alias inputs
 * only exactly (in-place). scalars are read at launch. */
TPURT_API tpurt_status tpurt_elementwise(tpurt_stream *s, const tpurt_ew_program *prog, const tpurt_view *outs,
                                         const tpurt_view *ins, int nin, const double *scalars, int nscalars);
/* Name of an op ("add", "gelu_backward", ...). */
TPURT_API const char *tpurt_ew_op_name(tpurt_ew_op op);

/* ----------------------------------------------------------- reductions */

typedef enum tpurt_reduce_op {
  TPURT_RED_SUM = 0, TPURT_RED_PROD, TPURT_RED_MEAN, TPURT_RED_MAX, TPURT_RED_MIN,
  TPURT_RED_ARGMAX, TPURT_RED_ARGMIN, /* index of the first extreme, NaN counts as extreme */
  TPURT_RED_VAR,       /* p0 = correction (Bessel: 1) */
  TPURT_RED_NORM,      /* p0 = ord (2, 1, inf = INFINITY, -inf, 0, any p) */
  TPURT_RED_LOGSUMEXP, TPURT_RED_ANY, TPURT_RED_ALL, TPURT_RED_NANSUM,
  TPURT_RED_NUM_OPS
} tpurt_reduce_op;

/* out (and out2 when given) have in's ndim; reduced dims are those where
 * out has stride 0 and in has size > 1 (size-1 dims are kept or not by the
 * caller's view). Accumulates in f32 for f16/bf16/f32 data (f64 for f64,
 * i64 for integers). MAX/MIN with out2 also write the index (int64) of the
 * extreme along the single reduced dim (values + indices form). VAR with
 * out2 writes the mean too (var_mean). Empty reductions give the identity
 * (sum 0, prod 1, any false, all true); MAX/MIN/ARG* of nothing is an error. */
TPURT_API tpurt_status tpurt_reduce(tpurt_stream *s, tpurt_reduce_op op, const tpurt_view *out, const tpurt_view *out2,
                                    const tpurt_view *in, double p0);

typedef enum { TPURT_SCAN_CUMSUM = 0, TPURT_SCAN_CUMPROD, TPURT_SCAN_CUMMAX, TPURT_SCAN_CUMMIN,
               TPURT_SCAN_LOGCUMSUMEXP } tpurt_scan_op;
/* Inclusive scan along dim; idx (int64, may be NULL) for CUMMAX/CUMMIN. */
TPURT_API tpurt_status tpurt_scan(tpurt_stream *s, tpurt_scan_op op, const tpurt_view *out, const tpurt_view *idx,
                                  const tpurt_view *in, int dim);

/* softmax / log_softmax along dim and their backward
 * (grad_in = f(grad_out, out)). */
TPURT_API tpurt_status tpurt_softmax(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, int dim, int log);
TPURT_API tpurt_status tpurt_softmax_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                              const tpurt_view *out, int dim, int log);

/* Normalization over the last `norm_ndim` dims of x, rows = the rest.
 * layer norm: y = (x - mean) * rstd * w + b; mean/rstd (f32 for low-precision
 * x, shape [rows]) saved for backward. rms norm: y = x * rstd * w. Any of
 * w, b, mean, rstd may be NULL. Backward computes any non-NULL grad. */
TPURT_API tpurt_status tpurt_layer_norm(tpurt_stream *s, const tpurt_view *y, const tpurt_view *mean,
                                        const tpurt_view *rstd, const tpurt_view *x, const tpurt_view *w,
                                        const tpurt_view *b, int norm_ndim, double eps, int rms);
TPURT_API tpurt_status tpurt_layer_norm_backward(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dw,
                                                 const tpurt_view *db, const tpurt_view *dy, const tpurt_view *x,
                                                 const tpurt_view *mean, const tpurt_view *rstd,
                                                 const tpurt_view *w, int norm_ndim, int rms);

/* ------------------------------------------------------- matmul (GEMM) */

/* Precision of f32 matmuls, as a TPU's MXU: HIGHEST = f32, HIGH = 3-pass
 * bf16 (split each operand into bf16 hi + lo, drop lo*lo), DEFAULT = 1-pass
 * bf16 (round operands to bf16, accumulate in f32). */
typedef enum { TPURT_PRECISION_DEFAULT = 0, TPURT_PRECISION_HIGH = 1, TPURT_PRECISION_HIGHEST = 2 } tpurt_precision;

/* c = alpha * a @ b + beta * c over batched 3-D views: a [B, M, K],
 * b [B, K, N], c [B, M, N] (batch stride 0 broadcasts). Any strides; the
 * kernel picks transposes or packs. f16/bf16 operands accumulate in f32.
 * beta == 0 ignores c's previous contents (NaN included). */
TPURT_API tpurt_status tpurt_gemm(tpurt_stream *s, const tpurt_view *c, const tpurt_view *a, const tpurt_view *b,
                                  double alpha, double beta, tpurt_precision precision);
/* Name of the GEMM library in use ("openblas 0.3.x", "onednn 3.x", ...). */
TPURT_API const char *tpurt_gemm_library(void);

/* ============================================ INDEXING, SHAPE, RANDOM, LOSSES
 *
 * Index views are int64 or int32. Indices are validated inside the kernel:
 * an out-of-range index fails the op with TPURT_ERR_INDEX at the next sync
 * ("<op>: index 12 is out of bounds for dimension 0 with size 3"); the
 * device stays usable. Kernels that reduce into a destination (scatter
 * reductions, index_put with accumulate, index_add, backward of gathers)
 * process duplicates in index order, so results are deterministic.
 */

/* out = self.index_select(dim, index): index 1-D (or 0-D) with n entries,
 * out has self's shape with size n in dim. No negative indices. */
TPURT_API tpurt_status tpurt_index_select(tpurt_stream *s, const tpurt_view *out, const tpurt_view *self, int dim,
                                          const tpurt_view *index);
/* out[p] = self[p with p[dim] = index[p]]; out and index have one shape,
 * with index.size(d) <= self.size(d) for d != dim. */
TPURT_API tpurt_status tpurt_gather(tpurt_stream *s, const tpurt_view *out, const tpurt_view *self, int dim,
                                    const tpurt_view *index);

typedef enum { TPURT_SCATTER_ASSIGN = 0, TPURT_SCATTER_SUM, TPURT_SCATTER_PROD, TPURT_SCATTER_MEAN,
               TPURT_SCATTER_AMAX, TPURT_SCATTER_AMIN } tpurt_scatter_op;
/* For every p of index's shape: self[p with p[dim] = index[p]] op= src[p]
 * (or value when src is NULL). include_self = 0: a destination reached by
 * the index starts from its first scattered value (MEAN then counts only
 * scattered values). MEAN on integers floors like PyTorch. */
TPURT_API tpurt_status tpurt_scatter(tpurt_stream *s, const tpurt_view *self, int dim, const tpurt_view *index,
                                     const tpurt_view *src, tpurt_scalar value, tpurt_scatter_op op,
                                     int include_self);
/* self.index_add_(dim, index, src, alpha): index 1-D; entries equal to
 * skip_index are ignored (pass INT64_MIN for none); scale_by_freq divides
 * each contribution by the number of occurrences of its index (embedding
 * backward). */
TPURT_API tpurt_status tpurt_index_add(tpurt_stream *s, const tpurt_view *self, int dim, const tpurt_view *index,
                                       const tpurt_view *src, double alpha, int64_t skip_index, int scale_by_freq);

/* Advanced indexing over an iteration shape shared by every view (use
 * stride 0 to broadcast). src (index) / dst (index_put) have stride 0 over
 * the indexed region; element p is at base + sum_k idx_k[p] * strides[k]
 * (strides in elements), idx_k[p] in [-sizes[k], sizes[k]) (negative wraps).
 * index_put with accumulate adds (duplicates in order), else assigns. */
TPURT_API tpurt_status tpurt_index(tpurt_stream *s, const tpurt_view *out, const tpurt_view *src,
                                   const tpurt_view *idx, int nidx, const int64_t *sizes, const int64_t *strides);
TPURT_API tpurt_status tpurt_index_put(tpurt_stream *s, const tpurt_view *dst, const tpurt_view *values,
                                       const tpurt_view *idx, int nidx, const int64_t *sizes, const int64_t *strides,
                                       int accumulate);

/* count (0-D int64) = number of nonzero elements of in. */
TPURT_API tpurt_status tpurt_count_nonzero(tpurt_stream *s, const tpurt_view *count, const tpurt_view *in);
/* out [n, in.ndim] int64: coordinates of the nonzero elements of in in
 * row-major order; n must be the count (fewer rows: the first n). */
TPURT_API tpurt_status tpurt_nonzero(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in);

/* out = tril (upper = 0) or triu (upper = 1) of the last two dims of in. */
TPURT_API tpurt_status tpurt_tril(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, int64_t diagonal,
                                  int upper);

typedef enum { TPURT_PAD_REFLECT = 0, TPURT_PAD_REPLICATE = 1 } tpurt_pad_mode;
/* Padding of the last npad (1..3) dims: pads[2*i], pads[2*i+1] = (before,
 * after) for dim ndim-npad+i (negative crops). Backward accumulates
 * grad_out into grad_in (which it zero-fills first). */
TPURT_API tpurt_status tpurt_pad(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, tpurt_pad_mode mode,
                                 int npad, const int64_t *pads);
TPURT_API tpurt_status tpurt_pad_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                          tpurt_pad_mode mode, int npad, const int64_t *pads);

/* out[i] = start + i * step (1-D out); linspace: PyTorch's symmetric form
 * (first half from start, second half from end). */
TPURT_API tpurt_status tpurt_arange(tpurt_stream *s, const tpurt_view *out, tpurt_scalar start, tpurt_scalar step);
TPURT_API tpurt_status tpurt_linspace(tpurt_stream *s, const tpurt_view *out, double start, double end);
/* Indices of the lower (upper = 0) or upper (upper = 1) triangle of a
 * row x col matrix, diagonal shifted by offset (tril: column <= row +
 * offset; triu: column >= row + offset), in row-major order: out [2, n]
 * (int32 or int64) gets the row indices, then the column indices, with
 * n = tpurt_tri_indices_count(...). */
TPURT_API int64_t tpurt_tri_indices_count(int64_t row, int64_t col, int64_t offset, int upper);
TPURT_API tpurt_status tpurt_tri_indices(tpurt_stream *s, const tpurt_view *out, int64_t row, int64_t col,
                                         int64_t offset, int upper);

/* Sorts along dim (stable; NaN sorts as larger than everything, like
 * PyTorch). values/indices (int64) have in's shape; either may be NULL. */
TPURT_API tpurt_status tpurt_sort(tpurt_stream *s, const tpurt_view *values, const tpurt_view *indices,
                                  const tpurt_view *in, int dim, int descending);
/* The k largest (or smallest) along dim, sorted when sorted != 0. */
TPURT_API tpurt_status tpurt_topk(tpurt_stream *s, const tpurt_view *values, const tpurt_view *indices,
                                  const tpurt_view *in, int64_t k, int dim, int largest, int sorted);
/* Unique of a sorted 1-D view: out (capacity n) gets the distinct values,
 * count (0-D int64) their number, inverse (optional, indexed by perm[i]
 * = original position of sorted[i]) the group of each element, counts
 * (optional, capacity n) the group sizes. */
TPURT_API tpurt_status tpurt_unique_sorted(tpurt_stream *s, const tpurt_view *out, const tpurt_view *count,
                                           const tpurt_view *inverse, const tpurt_view *counts,
                                           const tpurt_view *sorted, const tpurt_view *perm);

/* ---- random: every kernel draws from Philox-4x32-10 with key = seed and
 * counter = (offset + b, 0) for block b (128 bits). Element i of the
 * (row-major) output uses block i / 4 word i % 4 for 32-bit draws, block
 * i / 2 words 2(i%2), 2(i%2)+1 for 64-bit draws (f64 uniform, 64-bit ranges),
 * and normals pair words (0,1) and (2,3) of block i / 4 through Box-Muller
 * (4 normals per block; its logarithm, sine and cosine within a few ulps of
 * double, the same bits on every CPU and build variant). tpurt_random_blocks tells how many blocks to
 * reserve from the generator for n elements. */
typedef enum { TPURT_RNG_UNIFORM = 0, /* [p0, p1) */
               TPURT_RNG_NORMAL,      /* mean p0, std p1 */
               TPURT_RNG_BERNOULLI,   /* probability p0 */
               TPURT_RNG_RANDOM,      /* integers in [p0, p0 + range) (range = (uint64)p1, 0 = 2^64) */
               TPURT_RNG_EXPONENTIAL, /* rate p0 */
               TPURT_RNG_GEOMETRIC,   /* p0 */
               TPURT_RNG_LOG_NORMAL,  /* mean p0, std p1 of the log */
               TPURT_RNG_CAUCHY       /* median p0, sigma p1 */
} tpurt_rng_kind;
TPURT_API uint64_t tpurt_random_blocks(tpurt_rng_kind kind, tpurt_dtype dt, int64_t n, uint64_t range);
/* RANDOM draws the integer range from p0 (int) and range; the others use
 * p0/p1 as doubles. */
TPURT_API tpurt_status tpurt_random(tpurt_stream *s, const tpurt_view *out, tpurt_rng_kind kind, double p0, double p1,
                                    int64_t from, uint64_t range, uint64_t seed, uint64_t offset);
/* out[i] = uniform(i) < p[i] (p broadcast to out's shape). 1 block / 4 elements. */
TPURT_API tpurt_status tpurt_bernoulli_tensor(tpurt_stream *s, const tpurt_view *out, const tpurt_view *p,
                                              uint64_t seed, uint64_t offset);
/* Dropout: mask[i] = uniform(i) >= p; out[i] = in[i] * mask[i] * scale.
 * mask (bool) may be NULL; with gen = 0 the mask is an input (backward). */
TPURT_API tpurt_status tpurt_dropout(tpurt_stream *s, const tpurt_view *out, const tpurt_view *mask,
                                     const tpurt_view *in, double p, double scale, int gen, uint64_t seed,
                                     uint64_t offset);
/* Poisson(rate[i]) and Binomial(floor(count[i]), prob[i]) samples into float out (inputs float
 * views of out's shape). Element i (row-major) draws from the counters (offset + i, j) for its
 * j-th block, as many as its rejection sampler needs: reserve numel(out) blocks. A negative or NaN
 * rate is an asynchronous TPURT_ERR_INVALID_ARGUMENT. */
TPURT_API tpurt_status tpurt_poisson(tpurt_stream *s, const tpurt_view *out, const tpurt_view *rate, uint64_t seed,
                                     uint64_t offset);
TPURT_API tpurt_status tpurt_binomial(tpurt_stream *s, const tpurt_view *out, const tpurt_view *count,
                                      const tpurt_view *prob, uint64_t seed, uint64_t offset);
/* Random permutation of 0..n-1 into 1-D out (Fisher-Yates, block i for step i). */
TPURT_API tpurt_status tpurt_randperm(tpurt_stream *s, const tpurt_view *out, uint64_t seed, uint64_t offset);
/* out [rows, nsample] int64 drawn from the rows of probs [rows, cats]
 * (non-negative weights). Row r uses blocks [offset + r * nsample, ...),
 * one a draw (words 0, 1: a 53-bit uniform u); a draw picks the first
 * category whose cumulative weight exceeds u times the remaining total
 * (O(log cats) a draw: a binary search, or a tree of sums without
 * replacement). */
TPURT_API tpurt_status tpurt_multinomial(tpurt_stream *s, const tpurt_view *out, const tpurt_view *probs,
                                         int64_t nsample, int replacement, uint64_t seed, uint64_t offset);

/* ---- losses. reduction: 0 none, 1 mean, 2 sum (PyTorch's enum). */
/* input [N, C, D], target [N, D] (int64/int32), weight [C] or NULL. out is
 * [N, D] (none) or 0-D; total_weight 0-D (may be NULL). Targets outside
 * [0, C) other than ignore_index fail with TPURT_ERR_INDEX. */
TPURT_API tpurt_status tpurt_nll_loss(tpurt_stream *s, const tpurt_view *out, const tpurt_view *total_weight,
                                      const tpurt_view *input, const tpurt_view *target, const tpurt_view *weight,
                                      int reduction, int64_t ignore_index);
/* grad_input [N, C, D] (fully written); grad_out [N, D] or 0-D. */
TPURT_API tpurt_status tpurt_nll_loss_backward(tpurt_stream *s, const tpurt_view *grad_input,
                                               const tpurt_view *grad_out, const tpurt_view *target,
                                               const tpurt_view *weight, const tpurt_view *total_weight,
                                               int reduction, int64_t ignore_index);
typedef enum { TPURT_LOSS_MSE = 0, TPURT_LOSS_L1, TPURT_LOSS_SMOOTH_L1 /* p = beta */, TPURT_LOSS_HUBER /* p = delta */,
               TPURT_LOSS_BCE /* input = probabilities, weight optional */ } tpurt_loss_kind;
/* Pointwise losses over input/target/weight of out's shape (none) or of
 * input's shape reduced to 0-D out (mean/sum, f64 accumulation). */
TPURT_API tpurt_status tpurt_pointwise_loss(tpurt_stream *s, tpurt_loss_kind kind, const tpurt_view *out,
                                            const tpurt_view *input, const tpurt_view *target,
                                            const tpurt_view *weight, int reduction, double p);
/* grad_input (input's shape) = d loss / d input * grad_out (broadcast). */
TPURT_API tpurt_status tpurt_pointwise_loss_backward(tpurt_stream *s, tpurt_loss_kind kind,
                                                     const tpurt_view *grad_input, const tpurt_view *grad_out,
                                                     const tpurt_view *input, const tpurt_view *target,
                                                     const tpurt_view *weight, int reduction, double p);
/* ------------------------------------ optimizers, foreach lists and AMP
 *
 * Multi-tensor kernels: ONE launch updates whole lists of tensors. Entry i
 * of every list forms a tuple (param i, grad i, ...): the views of a tuple
 * have the same shape (any strides; outputs may alias inputs only exactly).
 * Work is split over the pool across (tensor, chunk) pairs. f32/f16/bf16
 * data is computed in f32, f64 data in f64; every view is read and written
 * in its own dtype. Empty lists and empty tensors are no-ops.
 */

/* A scalar operand: a host value, or (ptr != 0) the one element of dtype
 * stored at a device address, read by the kernel when it runs (no sync). */
typedef struct tpurt_dscalar {
  double value;
  tpurt_devptr ptr;
  tpurt_dtype dtype;
} tpurt_dscalar;

/* Shared by the fused optimizers: with has_grad_scale every grad is divided
 * by grad_scale and the unscaled grad is stored back; with has_found_inf a
 * non-zero found_inf skips the whole step (nothing is written). */
typedef struct tpurt_amp_args {
  int has_grad_scale, has_found_inf;
  tpurt_dscalar grad_scale;
  tpurt_dscalar found_inf;
} tpurt_amp_args;

typedef struct tpurt_adam_config {
  tpurt_dscalar lr;
  double beta1, beta2, weight_decay, eps;
  int amsgrad;   /* uses max_exp_avg_sqs */
  int maximize;  /* ascends: grad = -grad */
  int decoupled; /* 1 = AdamW (param *= 1 - lr * wd), 0 = Adam (grad += wd * param) */
  tpurt_amp_args amp;
} tpurt_adam_config;

/* Adam / AdamW step over n tuples. steps[i] is a one-element f32/f64 view
 * holding the (already incremented) step count used for bias correction.
 * max_exp_avg_sqs may be NULL unless amsgrad. */
TPURT_API tpurt_status tpurt_fused_adam(tpurt_stream *s, int n, const tpurt_view *params, const tpurt_view *grads,
                                        const tpurt_view *exp_avgs, const tpurt_view *exp_avg_sqs,
                                        const tpurt_view *max_exp_avg_sqs, const tpurt_view *steps,
                                        const tpurt_adam_config *cfg);

typedef struct tpurt_sgd_config {
  tpurt_dscalar lr;
  double momentum, dampening, weight_decay;
  int nesterov, maximize;
  int first_step; /* momentum buffers are initialised with the grad */
  tpurt_amp_args amp;
} tpurt_sgd_config;

/* SGD step; momentum_bufs may be NULL when momentum == 0. */
TPURT_API tpurt_status tpurt_fused_sgd(tpurt_stream *s, int n, const tpurt_view *params, const tpurt_view *grads,
                                       const tpurt_view *momentum_bufs, const tpurt_sgd_config *cfg);

/* grads[i] *= inv_scale; found_inf (one f32 element) is set to 1 if any
 * grad element was non-finite (left unchanged otherwise). */
TPURT_API tpurt_status tpurt_amp_unscale(tpurt_stream *s, int n, const tpurt_view *grads,
                                         const tpurt_view *found_inf, const tpurt_view *inv_scale);

/* Dynamic loss scale update (one f32 scale, one i32 growth tracker, one f32
 * found_inf): on found_inf scale *= backoff and tracker = 0; otherwise the
 * tracker counts successful steps and every growth_interval of them the
 * scale is multiplied by growth (kept only if finite) and the tracker reset. */
TPURT_API tpurt_status tpurt_amp_update_scale(tpurt_stream *s, const tpurt_view *scale,
                                              const tpurt_view *growth_tracker, const tpurt_view *found_inf,
                                              double growth_factor, double backoff_factor, int64_t growth_interval);

typedef enum tpurt_foreach_op {
  /* unary: out = f(a) */
  TPURT_FE_COPY = 0, TPURT_FE_NEG, TPURT_FE_ABS, TPURT_FE_SQRT, TPURT_FE_EXP, TPURT_FE_RECIPROCAL, TPURT_FE_SIGN,
  /* binary: out = f(a, b) */
  TPURT_FE_ADD,     /* a + alpha * b */
  TPURT_FE_MUL, TPURT_FE_DIV,
  TPURT_FE_MAXIMUM, TPURT_FE_MINIMUM, /* NaN propagates (also clamp_min / clamp_max) */
  TPURT_FE_POW,     /* a ** b */
  TPURT_FE_RPOW,    /* b ** a (scalar base) */
  /* ternary: out = f(a, b, c) */
  TPURT_FE_ADDCMUL, /* a + value * b * c */
  TPURT_FE_ADDCDIV, /* a + value * b / c */
  TPURT_FE_LERP,    /* a + w * (b - a), w = c */
  TPURT_FE_NUM_OPS
} tpurt_foreach_op;

/* Operands of tpurt_foreach: lists of n views. A missing operand (b or c
 * NULL) is the scalar: scalars[i] for tuple i when scalars != NULL (a host
 * ScalarList), else `scalar` (host value or device scalar). For ADDCMUL /
 * ADDCDIV the scalar is `value`. alpha only applies to ADD. */
typedef struct tpurt_foreach_operands {
  const tpurt_view *out, *a, *b, *c;
  const double *scalars;
  tpurt_dscalar scalar;
  double alpha;
} tpurt_foreach_operands;

TPURT_API tpurt_status tpurt_foreach(tpurt_stream *s, tpurt_foreach_op op, int n, const tpurt_foreach_operands *o);
TPURT_API const char *tpurt_foreach_op_name(tpurt_foreach_op op);

/* out[i] (one element, any float dtype) = ord-norm of in[i]: ord 2, 1, 0
 * (count of non-zeros), +-inf (max / min |x|) or any p > 0. Accumulates in
 * f64 (per-chunk partials in f32 for f32 data, combined deterministically). */
TPURT_API tpurt_status tpurt_foreach_norm(tpurt_stream *s, int n, const tpurt_view *out, const tpurt_view *in,
                                          double ord);
/* ------------------------------------------- std, batch norm, group norm */

/* Standard deviation: tpurt_reduce(TPURT_RED_VAR) followed by a square root
 * of the variance (mean_out, may be NULL, gets the mean: std_mean). */
TPURT_API tpurt_status tpurt_reduce_std(tpurt_stream *s, const tpurt_view *out, const tpurt_view *mean_out,
                                        const tpurt_view *in, double correction);


/* Batch norm over x of shape [N, C, *] (channels at dim 1; the spatial dims
 * must merge into one strided dim). training: normalizes with the batch
 * statistics, writes them to save_mean / save_invstd ([C], may be NULL) and
 * updates running_mean / running_var (may be NULL) as
 * r = (1 - momentum) * r + momentum * stat, with the unbiased variance.
 * Evaluation normalizes with running_mean / running_var (required). w, b
 * may be NULL. Statistics are computed in f64. */
TPURT_API tpurt_status tpurt_batch_norm(tpurt_stream *s, const tpurt_view *y, const tpurt_view *save_mean,
                                        const tpurt_view *save_invstd, const tpurt_view *x, const tpurt_view *w,
                                        const tpurt_view *b, const tpurt_view *running_mean,
                                        const tpurt_view *running_var, int training, double momentum, double eps);
/* Gradients of tpurt_batch_norm; any of dx, dw, db may be NULL. training
 * uses save_mean / save_invstd, evaluation the running statistics and eps. */
TPURT_API tpurt_status tpurt_batch_norm_backward(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dw,
                                                 const tpurt_view *db, const tpurt_view *dy, const tpurt_view *x,
                                                 const tpurt_view *w, const tpurt_view *running_mean,
                                                 const tpurt_view *running_var, const tpurt_view *save_mean,
                                                 const tpurt_view *save_invstd, int training, double eps);
/* Group norm over x of shape [N, C, *] with C divisible by groups; mean and
 * rstd (N * groups elements, sample-major, may be NULL) are saved for the
 * backward. w, b ([C]) may be NULL. */
TPURT_API tpurt_status tpurt_group_norm(tpurt_stream *s, const tpurt_view *y, const tpurt_view *mean,
                                        const tpurt_view *rstd, const tpurt_view *x, const tpurt_view *w,
                                        const tpurt_view *b, int groups, double eps);
TPURT_API tpurt_status tpurt_group_norm_backward(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dw,
                                                 const tpurt_view *db, const tpurt_view *dy, const tpurt_view *x,
                                                 const tpurt_view *mean, const tpurt_view *rstd,
                                                 const tpurt_view *w, int groups);
/* ------------------------------------- convolution, pooling, upsampling */

/* 2-D convolution over NCHW views (any strides; 1-D convolutions use H = 1):
 * x [N, C_in, H, W], w [C_out, C_in / groups, kH, kW], y [N, C_out, Ho, Wo]
 * with Ho = (H + 2 pad - dil (kH - 1) - 1) / stride + 1 (likewise Wo).
 * im2col + GEMM; f32 (with the precision modes of tpurt_gemm), f64, f16/bf16
 * (computed in f32, rounded once). bias [C_out] may be NULL. */
typedef struct tpurt_conv_params {
  int64_t stride[2], padding[2], dilation[2];
  int64_t groups;
} tpurt_conv_params;
TPURT_API tpurt_status tpurt_conv2d(tpurt_stream *s, const tpurt_view *y, const tpurt_view *x, const tpurt_view *w,
                                    const tpurt_view *bias, const tpurt_conv_params *p, tpurt_precision precision);
/* dx = d(conv2d)/dx applied to dy (overwrites dx); with bias (may be NULL,
 * [C_in]) added it is also the forward of a transposed convolution. */
TPURT_API tpurt_status tpurt_conv2d_backward_input(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dy,
                                                   const tpurt_view *w, const tpurt_view *bias,
                                                   const tpurt_conv_params *p, tpurt_precision precision);
/* dw [C_out, C_in / groups, kH, kW] and db [C_out] (either may be NULL; x is
 * only read for dw)
 * from dy [N, C_out, Ho, Wo] and x [N, C_in, H, W] (overwritten). */
TPURT_API tpurt_status tpurt_conv2d_backward_weight(tpurt_stream *s, const tpurt_view *dw, const tpurt_view *db,
                                                    const tpurt_view *dy, const tpurt_view *x,
                                                    const tpurt_conv_params *p, tpurt_precision precision);

/* Pooling windows over NCHW views; output sizes come from the caller
 * (ceil_mode decided there). Float dtypes; computed in f32 (f64 for f64). */
typedef struct tpurt_pool_params {
  int64_t kernel[2], stride[2], padding[2], dilation[2];
  int count_include_pad;    /* avg */
  int64_t divisor_override; /* avg, 0 = none */
} tpurt_pool_params;
/* out = max over each window; idx (int64, may be NULL) = h * W + w of the
 * maximum in its plane (NaN wins, like PyTorch). */
TPURT_API tpurt_status tpurt_max_pool2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                        const tpurt_view *in, const tpurt_pool_params *p);
/* grad_in = 0, then grad_in[plane][idx] += grad_out (also for adaptive max). */
TPURT_API tpurt_status tpurt_max_pool2d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                 const tpurt_view *grad_out, const tpurt_view *idx);
TPURT_API tpurt_status tpurt_avg_pool2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                                        const tpurt_pool_params *p);
TPURT_API tpurt_status tpurt_avg_pool2d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                 const tpurt_view *grad_out, const tpurt_pool_params *p);
/* Adaptive pooling: window of output o over input n is
 * [floor(o n / out), ceil((o + 1) n / out)). max: idx as max_pool2d. */
TPURT_API tpurt_status tpurt_adaptive_pool2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                             const tpurt_view *in, int max);
TPURT_API tpurt_status tpurt_adaptive_avg_pool2d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                          const tpurt_view *grad_out);

/* Upsampling NCHW. scale_h/scale_w: the user's scale factors, or <= 0 when
 * not given (then in / out is used). bilinear: align_corners as PyTorch. */
typedef enum { TPURT_UPSAMPLE_NEAREST = 0, TPURT_UPSAMPLE_BILINEAR = 1 } tpurt_upsample_mode;
TPURT_API tpurt_status tpurt_upsample2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                                        tpurt_upsample_mode mode, int align_corners, double scale_h, double scale_w);
/* grad_in = 0, then the adjoint of the interpolation applied to grad_out. */
TPURT_API tpurt_status tpurt_upsample2d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                 const tpurt_view *grad_out, tpurt_upsample_mode mode,
                                                 int align_corners, double scale_h, double scale_w);

/* ------------------------------------ fused scaled dot-product attention
 *
 * q [B, H, L, D], k [B, Hk, S, D], v [B, Hk, S, Dv], out [B, H, L, Dv]
 * (any strides; f32, f16 or bf16, one dtype, computed in f32). H must be a
 * multiple of Hk: query head h reads key/value head h / (H / Hk) (GQA).
 * mask (may be NULL) [B, H, L, S] (stride 0 broadcasts): bool (false =
 * masked out) or a float bias added to the scaled scores. is_causal masks
 * key j for query i when j > i (top-left aligned, as PyTorch). Rows with
 * every key masked give 0. Dropout keeps element (bh, i, j) (bh = b * H + h)
 * iff u >= dropout_p, u the 24-bit uniform of word j % 4 of Philox block
 * offset + (bh * L + i) * ceil(S / 4) + j / 4 (see
 * tpurt_attention_dropout_blocks), and scales kept ones by 1 / (1 - p).
 * lse [B, H, L] f32 (may be NULL in the forward) is the log-sum-exp of
 * every row of scores (-inf for fully masked rows). */
typedef struct tpurt_attention_params {
  double scale;
  int is_causal;
  double dropout_p;
  uint64_t seed, offset;
  tpurt_precision precision; /* of the f32 tile products */
} tpurt_attention_params;
TPURT_API uint64_t tpurt_attention_dropout_blocks(int64_t bh, int64_t L, int64_t S);
TPURT_API tpurt_status tpurt_attention(tpurt_stream *s, const tpurt_view *out, const tpurt_view *lse,
                                       const tpurt_view *q, const tpurt_view *k, const tpurt_view *v,
                                       const tpurt_view *mask, const tpurt_attention_params *p);
/* Gradients from the forward's out and lse; any of dq, dk, dv, dmask may be
 * NULL. dmask [B, H, L, S] receives the gradient of the scores (= of an
 * additive bias) where keys are visible; the caller zero-fills it first. */
TPURT_API tpurt_status tpurt_attention_backward(tpurt_stream *s, const tpurt_view *dq, const tpurt_view *dk,
                                                const tpurt_view *dv, const tpurt_view *dmask,
                                                const tpurt_view *dout, const tpurt_view *q, const tpurt_view *k,
                                                const tpurt_view *v, const tpurt_view *out, const tpurt_view *lse,
                                                const tpurt_view *mask, const tpurt_attention_params *p);
/* ------------------------------------------ vision: 3-D pooling, unpooling,
 * fractional pooling, interpolation, grid sampling, im2col / col2im.
 *
 * Spatial views are 5-D [N, C, D, H, W] (1-D / 2-D callers use size-1 dims
 * with stride 0). Float dtypes; computed in f64, stored in the view dtype.
 * Plane indices (max pooling, unpooling) are (d * H + h) * W + w. */
typedef struct tpurt_pool3d_params {
  int64_t kernel[3], stride[3], padding[3], dilation[3];
  int count_include_pad;    /* avg */
  int64_t divisor_override; /* avg, 0 = none */
} tpurt_pool3d_params;
/* out (and idx, int64, may be NULL) = max over each window (NaN wins). */
TPURT_API tpurt_status tpurt_max_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                        const tpurt_view *in, const tpurt_pool3d_params *p);
TPURT_API tpurt_status tpurt_avg_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                                        const tpurt_pool3d_params *p);
TPURT_API tpurt_status tpurt_avg_pool3d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                 const tpurt_view *grad_out, const tpurt_pool3d_params *p);
/* Adaptive windows [floor(o n / out), ceil((o + 1) n / out)) per dim. */
TPURT_API tpurt_status tpurt_adaptive_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                             const tpurt_view *in, int max);
TPURT_API tpurt_status tpurt_adaptive_avg_pool3d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                          const tpurt_view *grad_out);
/* Fractional max pooling: samples [N, C, K] (float) in [0, 1); sample_dim[k]
 * is the sample used for spatial dim k (D, H, W) or -1 (that dim must have
 * in = out = kernel = 1). */
TPURT_API tpurt_status tpurt_fractional_max_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                                   const tpurt_view *in, const tpurt_view *samples,
                                                   const int64_t kernel[3], const int sample_dim[3]);
/* out = 0, then out[plane][idx] += src (accumulate: max pooling backward)
 * or out[plane][idx] = src (max_unpool; an index outside the plane fails
 * with TPURT_ERR_INVALID_ARGUMENT at the next sync). idx has src's shape. */
TPURT_API tpurt_status tpurt_scatter_planes(tpurt_stream *s, const tpurt_view *out, const tpurt_view *src,
                                            const tpurt_view *idx, int accumulate);

/* Separable interpolation over D, H, W. scales[k]: the user's scale factor
 * of dim k or <= 0 (then in / out is used). */
typedef enum {
  TPURT_INTERP_NEAREST = 0,    /* PyTorch's legacy 'nearest' */
  TPURT_INTERP_NEAREST_EXACT,  /* 'nearest-exact' */
  TPURT_INTERP_LINEAR,         /* linear / bilinear / trilinear */
  TPURT_INTERP_CUBIC,          /* bicubic, A = -0.75, clamped borders */
  TPURT_INTERP_LINEAR_AA,      /* antialiased (triangle filter) */
  TPURT_INTERP_CUBIC_AA        /* antialiased (Keys, a = -0.5) */
} tpurt_interp_mode;
TPURT_API tpurt_status tpurt_interpolate(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                                         tpurt_interp_mode mode, int align_corners, const double scales[3]);
/* grad_in = adjoint of the interpolation applied to grad_out (overwrites). */
TPURT_API tpurt_status tpurt_interpolate_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                  const tpurt_view *grad_out, tpurt_interp_mode mode,
                                                  int align_corners, const double scales[3]);

/* Grid sampling: in [N, C, D, H, W], grid [N, Do, Ho, Wo, dims] (dims 2:
 * (x, y) with D = Do = 1, or 3: (x, y, z)), out [N, C, Do, Ho, Wo].
 * interp 0 bilinear, 1 nearest, 2 bicubic (dims 2); padding 0 zeros,
 * 1 border, 2 reflection. */
TPURT_API tpurt_status tpurt_grid_sample(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                                         const tpurt_view *grid, int interp, int padding, int align_corners);
/* grad_in (may be NULL) and grad_grid (may be NULL), both overwritten. */
TPURT_API tpurt_status tpurt_grid_sample_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                  const tpurt_view *grad_grid, const tpurt_view *grad_out,
                                                  const tpurt_view *in, const tpurt_view *grid, int interp,
                                                  int padding, int align_corners);

/* im2col: col [N, C * kh * kw, L] from img [N, C, H, W] (L = Ho * Wo of a
 * convolution with p); col2im (to_image = 1): img = sum of the columns. */
TPURT_API tpurt_status tpurt_im2col(tpurt_stream *s, const tpurt_view *col, const tpurt_view *img,
                                    const int64_t kernel[2], const tpurt_conv_params *p, int to_image);

/* ---- more losses (reduction: 0 none, 1 mean, 2 sum) */
/* multi_margin: input [N, C], target [N] (int), weight [C] or NULL, p 1 or
 * 2. out [N] or 0-D. Targets outside [0, C) fail with TPURT_ERR_INDEX. */
TPURT_API tpurt_status tpurt_multi_margin_loss(tpurt_stream *s, const tpurt_view *out, const tpurt_view *input,
                                               const tpurt_view *target, const tpurt_view *weight, int p,
                                               double margin, int reduction);
TPURT_API tpurt_status tpurt_multi_margin_loss_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                        const tpurt_view *grad_out, const tpurt_view *input,
                                                        const tpurt_view *target, const tpurt_view *weight, int p,
                                                        double margin, int reduction);
/* multilabel_margin: input/target/is_target [N, C] (target int, -1 ends a
 * row's labels; is_target written by the forward in input's dtype). */
TPURT_API tpurt_status tpurt_multilabel_margin_loss(tpurt_stream *s, const tpurt_view *out,
                                                    const tpurt_view *is_target, const tpurt_view *input,
                                                    const tpurt_view *target, int reduction);
TPURT_API tpurt_status tpurt_multilabel_margin_loss_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                             const tpurt_view *grad_out, const tpurt_view *input,
                                                             const tpurt_view *target, const tpurt_view *is_target,
                                                             int reduction);
/* p-norm distances: out [B, P, R] between rows of x1 [B, P, M] and x2
 * [B, R, M] (p >= 0, inf allowed). backward: grad_x1 from grad_out and the
 * forward's dist. */
TPURT_API tpurt_status tpurt_cdist(tpurt_stream *s, const tpurt_view *out, const tpurt_view *x1,
                                   const tpurt_view *x2, double p);
TPURT_API tpurt_status tpurt_cdist_backward(tpurt_stream *s, const tpurt_view *grad_x1, const tpurt_view *grad_out,
                                            const tpurt_view *x1, const tpurt_view *x2, const tpurt_view *dist,
                                            double p);
/* pdist: out [N (N - 1) / 2] over row pairs i < j of x [N, M]. */
TPURT_API tpurt_status tpurt_pdist(tpurt_stream *s, const tpurt_view *out, const tpurt_view *x, double p);
TPURT_API tpurt_status tpurt_pdist_backward(tpurt_stream *s, const tpurt_view *grad_x, const tpurt_view *grad_out,
                                            const tpurt_view *x, const tpurt_view *dist, double p);
/* CTC loss: log_probs [T, B, C]; targets 1-D int, target b starting at
 * tgt_offsets[b] with stride tgt_stride; input_lengths, target_lengths,
 * tgt_offsets [B] int64. Writes nll [B] and log_alpha [B, T, 2 Smax + 1].
 * Lengths out of range fail with TPURT_ERR_INVALID_ARGUMENT. */
TPURT_API tpurt_status tpurt_ctc_loss(tpurt_stream *s, const tpurt_view *nll, const tpurt_view *log_alpha,
                                      const tpurt_view *log_probs, const tpurt_view *targets,
                                      const tpurt_view *input_lengths, const tpurt_view *target_lengths,
                                      const tpurt_view *tgt_offsets, int64_t tgt_stride, int64_t blank);
/* grad [T, B, C] of sum_b grad_out[b] * nll[b] (zero_infinity zeroes the
 * gradient of infinite losses). */
TPURT_API tpurt_status tpurt_ctc_loss_backward(tpurt_stream *s, const tpurt_view *grad, const tpurt_view *grad_out,
                                               const tpurt_view *log_probs, const tpurt_view *targets,
                                               const tpurt_view *input_lengths, const tpurt_view *target_lengths,
                                               const tpurt_view *tgt_offsets, int64_t tgt_stride,
                                               const tpurt_view *nll, const tpurt_view *log_alpha, int64_t blank,
                                               int zero_infinity);

/* 3-D convolution over NCDHW views (2-D calls use D = 1); same contract as
 * tpurt_conv2d with three spatial dims. */
typedef struct tpurt_conv3d_params {
  int64_t stride[3], padding[3], dilation[3];
  int64_t groups;
} tpurt_conv3d_params;
TPURT_API tpurt_status tpurt_conv3d(tpurt_stream *s, const tpurt_view *y, const tpurt_view *x, const tpurt_view *w,
                                    const tpurt_view *bias, const tpurt_conv3d_params *p, tpurt_precision precision);
TPURT_API tpurt_status tpurt_conv3d_backward_input(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dy,
                                                   const tpurt_view *w, const tpurt_view *bias,
                                                   const tpurt_conv3d_params *p, tpurt_precision precision);
TPURT_API tpurt_status tpurt_conv3d_backward_weight(tpurt_stream *s, const tpurt_view *dw, const tpurt_view *db,
                                                    const tpurt_view *dy, const tpurt_view *x,
                                                    const tpurt_conv3d_params *p, tpurt_precision precision);
/* ------------------------------------------------ linear algebra (LAPACK)
 *
 * tpurt_linalg runs one LAPACK-based operation over a batch. Every view has
 * the same `batch_ndim` leading dims (inputs may broadcast them with stride
 * 0) followed by the operand's own dims, listed per op below as
 * [rows, cols] / [len] / [] (one value per matrix). Matrix data is f32 or
 * f64 (one dtype per call); pivots are int32/int64 (1-based, LAPACK's
 * convention), info int32, rank int64. An output with ndim = -1 is absent
 * (not computed). Any strides. Failures that LAPACK reports per matrix go
 * to `info` when the op has one; otherwise the op fails at the next sync
 * with PyTorch's message. flags[0..3] per op (unused ones 0):
 *   SVD        in A[m,n]; out U[m,m|k], S[k], Vh[n|k,n] (U, Vh absent when
 *              !compute_uv); flags full_matrices, compute_uv. (gesdd)
 *   TRSM       in A[n,n], B[n,r]; out X[n,r]; flags upper, transpose A,
 *              unit diagonal. Left side only (transpose views for right).
 *   LU         in A[m,n]; out LU[m,n], pivots[k], info[]. (getrf)
 *   LU_SOLVE   in LU[n,n], pivots[n], B[n,r]; out X; flags transpose.
 *   LU_UNPACK  in LU[m,n], pivots[k]; out P[m,m], L[m,k], U[k,n] (any absent).
 *   SOLVE      in A[n,n], B[n,r]; out X[n,r], LU, pivots[n], info[].
 *   INV        in A[n,n]; out inverse, info[].
 *   DET        in A[n,n]; out det[] (flags[0] = 0) or sign[], logabsdet[]
 *              (flags[0] = 1; out1 absent for det), LU, pivots (may be absent).
 *   EIGH       in A[n,n]; out w[n], V[n,n] (absent: values only); flags upper.
 *   GEQRF      in A[m,n]; out QR[m,n], tau[k].
 *   ORGQR      in QR[m,n], tau[t]; out Q[m,c] (c <= m). (orgqr)
 *   ORMQR      in QR[nq,>=t], tau[t], C[mc,nc]; out X[mc,nc]; flags left, transpose.
 *   CHOLESKY   in A[n,n]; out L[n,n], info[]; flags upper.
 *   CHOLESKY_SOLVE  in B[n,r], L[n,n]; out X[n,r]; flags upper.
 *   CHOLESKY_INVERSE in L[n,n]; out X[n,n]; flags upper.
 *   EIG        in A[n,n] real; out w[n], V[n,n] complex (V may be absent). (geev)
 *   LDL        in A[n,n]; out LD[n,n], pivots[n], info[]; flags upper. (sytrf)
 *   LDL_SOLVE  in LD[n,n], pivots[n], B[n,r]; out X; flags upper.
 *   LSTSQ      in A[m,n], B[m,r]; out X[max(m,n),r] (LAPACK's raw solution),
 *              rank[], S[k] (both may be absent); flags driver (0 gels,
 *              1 gelsy, 2 gelsd, 3 gelss); rcond.
 *   MATRIX_EXP in A[n,n]; out exp(A). (scaling and squaring, Pade [8/8])
 *   CROSS      in a[3], b[3]; out a x b (any real or integer dtype).
 */
typedef enum tpurt_linalg_op {
  TPURT_LA_SVD = 0, TPURT_LA_TRSM, TPURT_LA_LU, TPURT_LA_LU_SOLVE, TPURT_LA_LU_UNPACK, TPURT_LA_SOLVE, TPURT_LA_INV,
  TPURT_LA_DET, TPURT_LA_EIGH, TPURT_LA_GEQRF, TPURT_LA_ORGQR, TPURT_LA_ORMQR, TPURT_LA_CHOLESKY,
  TPURT_LA_CHOLESKY_SOLVE, TPURT_LA_CHOLESKY_INVERSE, TPURT_LA_EIG, TPURT_LA_LDL, TPURT_LA_LDL_SOLVE, TPURT_LA_LSTSQ,
  TPURT_LA_MATRIX_EXP, TPURT_LA_CROSS,
  TPURT_LA_NUM_OPS
} tpurt_linalg_op;
TPURT_API tpurt_status tpurt_linalg(tpurt_stream *s, tpurt_linalg_op op, int batch_ndim, const tpurt_view *outs,
                                    int nout, const tpurt_view *ins, int nin, const int64_t *flags, double rcond);
TPURT_API const char *tpurt_linalg_op_name(tpurt_linalg_op op);
/* ------------------------------------------------------------------ FFT
 *
 * Discrete Fourier transforms over `ndims` distinct dims of in (any
 * strides), written to out (must not overlap in). Unnormalized sums
 * X_k = sum_j x_j exp(sign 2 pi i j k / n) scaled by `scale` (the caller's
 * normalization: 1, 1/sqrt(n) or 1/n over the signal size):
 *   C2C: complex -> complex of one dtype, sign -1 when forward else +1;
 *   R2C: f32 -> c64 / f64 -> c128, sign -1; out along the last listed dim
 *        has n/2+1 (one-sided) or n (two-sided) entries, n = in's size;
 *   C2R: c64 -> f32 / c128 -> f64, sign +1; the last listed dim of in holds
 *        the half spectrum (entries past out's n/2+1 are ignored, missing
 *        ones read as 0; the imaginary parts of the DC and, for even n,
 *        Nyquist terms are ignored); with ndims > 1 it needs `work`, a
 *        view of in's shape and dtype (overwritten).
 * Other dims must match between in and out. Any length: mixed radix
 * (2, 3, 4, 5, primes <= 61) or Bluestein; plans are cached process-wide
 * per (n, precision, direction, real). Accumulates in the data's precision
 * with twiddles computed in double. Async. */
typedef enum { TPURT_FFT_C2C = 0, TPURT_FFT_R2C = 1, TPURT_FFT_C2R = 2 } tpurt_fft_kind;
TPURT_API tpurt_status tpurt_fft(tpurt_stream *s, tpurt_fft_kind kind, const tpurt_view *out, const tpurt_view *in,
                                 const tpurt_view *work, int ndims, const int *dims, int forward, double scale);
/* Number of cached FFT plans (tests). */
TPURT_API int tpurt_fft_plan_cache_size(void);
/* ------------------------- embedding bags, search, histograms, order stats
 * (index branch) */
typedef enum { TPURT_BAG_SUM = 0, TPURT_BAG_MEAN = 1, TPURT_BAG_MAX = 2 } tpurt_bag_mode;
/* out [B, D] = per bag reduction of rows of weight [W, D] picked by indices
 * [N]; bag b is indices[offsets[b] .. offsets[b+1]) (offsets has B entries,
 * the last bag ending at N, or B + 1). Indices equal to padding_idx (< 0:
 * none) are skipped. psw [N] (sum only, may be NULL) scales each row.
 * Optional outputs (int64, may be NULL): offset2bag [N] (bag of each index,
 * -1 for none), bag_size [B] (rows used), max_idx [B, D] (max: row of the
 * first maximum, -1 for an empty bag). Empty bags give 0. Bad offsets or
 * indices fail with TPURT_ERR_INDEX. */
TPURT_API tpurt_status tpurt_embedding_bag(tpurt_stream *s, const tpurt_view *out, const tpurt_view *offset2bag,
                                           const tpurt_view *bag_size, const tpurt_view *max_idx,
                                           const tpurt_view *weight, const tpurt_view *indices,
                                           const tpurt_view *offsets, const tpurt_view *psw, tpurt_bag_mode mode,
                                           int64_t padding_idx);
/* grad_weight [W, D] (overwritten) of tpurt_embedding_bag from grad [B, D]
 * and the forward's offset2bag / bag_size (mean) or max_idx (max);
 * scale_by_freq divides by the number of occurrences of each row. */
TPURT_API tpurt_status tpurt_embedding_bag_backward(tpurt_stream *s, const tpurt_view *grad_weight,
                                                    const tpurt_view *grad, const tpurt_view *indices,
                                                    const tpurt_view *offset2bag, const tpurt_view *bag_size,
                                                    const tpurt_view *max_idx, const tpurt_view *psw,
                                                    tpurt_bag_mode mode, int64_t padding_idx, int scale_by_freq);
/* out [N] = dot(grad[offset2bag[i]], weight[indices[i]]) (0 for padding). */
TPURT_API tpurt_status tpurt_embedding_bag_psw_backward(tpurt_stream *s, const tpurt_view *out,
                                                        const tpurt_view *grad, const tpurt_view *weight,
                                                        const tpurt_view *indices, const tpurt_view *offset2bag,
                                                        int64_t padding_idx);
/* Every distinct row r of indices: self[r] *= max_norm / (norm + 1e-7)
 * when its norm_type-norm exceeds max_norm. */
TPURT_API tpurt_status tpurt_embedding_renorm(tpurt_stream *s, const tpurt_view *self, const tpurt_view *indices,
                                              double max_norm, double norm_type);
/* out [R, K] (int64/int32) = insertion points of values [R, K] in the
 * ascending rows of seq [R or 1, M] (sorter: argsort of seq, may be NULL);
 * right = 0 first position (lower bound), 1 after equal elements. */
TPURT_API tpurt_status tpurt_searchsorted(tpurt_stream *s, const tpurt_view *out, const tpurt_view *seq,
                                          const tpurt_view *values, const tpurt_view *sorter, int right);
typedef enum { TPURT_HIST_LINEAR = 0,        /* bin by division (histc) */
               TPURT_HIST_LINEAR_SEARCH = 1, /* division, corrected against the edges */
               TPURT_HIST_BINARY = 2         /* binary search in the edges */ } tpurt_hist_mode;
/* hist (D dims, bins[d] = edges[d].size - 1) = counts (or weight [N] sums)
 * of the samples of input [N, D]; samples outside the outer edges (or NaN)
 * are skipped, the last bin includes its right edge. D <= 16. */
TPURT_API tpurt_status tpurt_histogramdd(tpurt_stream *s, const tpurt_view *hist, const tpurt_view *input,
                                         const tpurt_view *weight, const tpurt_view *edges, int D,
                                         tpurt_hist_mode mode);
/* hist [bins] (integer or floating) = counts of the samples of the integer
 * input [N] in [lo, hi] (lo < hi), sample x in bin (x - lo) * bins / (hi - lo)
 * computed exactly in integers, hi in the last bin, the others skipped:
 * histc of an integer tensor as CUDA computes it. */
TPURT_API tpurt_status tpurt_histc_int(tpurt_stream *s, const tpurt_view *hist, const tpurt_view *input, int64_t lo,
                                       int64_t hi);
/* -------------------------------------------- recurrent cells (rnn.c)
 * The pointwise part of the LSTM / GRU cells after their two gate products
 * (PyTorch's layouts and gate orders), computed in double, rounded once.
 * LSTM: igates, hgates [B, 4H] (input, forget, cell, output), cx [B, H],
 * biases [4H] (both or neither, NULL allowed) -> hy, cy [B, H] and the
 * activated gates in workspace [B, 4H]. */
TPURT_API tpurt_status tpurt_lstm_cell(tpurt_stream *s, const tpurt_view *hy, const tpurt_view *cy,
                                       const tpurt_view *workspace, const tpurt_view *igates,
                                       const tpurt_view *hgates, const tpurt_view *cx, const tpurt_view *bias_i,
                                       const tpurt_view *bias_h);
/* grad_gates [B, 4H] (the gates' pre-activation gradient, the same for both
 * gate sets) and grad_cx [B, H] from grad_hy / grad_cy (NULL = zero). */
TPURT_API tpurt_status tpurt_lstm_cell_backward(tpurt_stream *s, const tpurt_view *grad_gates,
                                                const tpurt_view *grad_cx, const tpurt_view *grad_hy,
                                                const tpurt_view *grad_cy, const tpurt_view *cx,
                                                const tpurt_view *cy, const tpurt_view *workspace);
/* GRU: igates, hgates [B, 3H] (reset, update, new), hx [B, H], biases [3H]
 * -> hy [B, H] and workspace [B, 5H] = r, z, n, hx, hidden new-gate term. */
TPURT_API tpurt_status tpurt_gru_cell(tpurt_stream *s, const tpurt_view *hy, const tpurt_view *workspace,
                                      const tpurt_view *igates, const tpurt_view *hgates, const tpurt_view *hx,
                                      const tpurt_view *bias_i, const tpurt_view *bias_h);
/* grad_igates, grad_hgates [B, 3H] and grad_hx [B, H] from grad_hy. */
TPURT_API tpurt_status tpurt_gru_cell_backward(tpurt_stream *s, const tpurt_view *grad_igates,
                                               const tpurt_view *grad_hgates, const tpurt_view *grad_hx,
                                               const tpurt_view *grad_hy, const tpurt_view *workspace);
typedef enum { TPURT_SELECT_KTH = 0, TPURT_SELECT_MEDIAN, TPURT_SELECT_NANMEDIAN, TPURT_SELECT_MODE } tpurt_select_kind;
/* Per row of in [R, n]: values [R, 1] / indices [R, 1] (int64, may be NULL)
 * = the k-th smallest (0-based; NaN largest; equal values in index order),
 * the lower median (NaN if the row has one), the lower median of the
 * non-NaN values, or the most frequent value (smallest on ties; index of
 * its last occurrence). */
TPURT_API tpurt_status tpurt_select_rows(tpurt_stream *s, const tpurt_view *values, const tpurt_view *indices,
                                         const tpurt_view *in, tpurt_select_kind kind, int64_t k);
typedef enum { TPURT_SEG_SUM = 0, TPURT_SEG_MEAN, TPURT_SEG_MAX, TPURT_SEG_MIN, TPURT_SEG_PROD } tpurt_segment_op;
/* out [O, n, I] = reduction of data [O, S, I] over the segments
 * [offsets[o, j], offsets[o, j+1]) of its middle axis; empty segments give
 * initial (if has_initial) or the identity (mean: NaN). */
TPURT_API tpurt_status tpurt_segment_reduce(tpurt_stream *s, const tpurt_view *out, const tpurt_view *data,
                                            const tpurt_view *offsets, tpurt_segment_op op, int has_initial,
                                            double initial);
/* grad_data [O, S, I] from grad / output [O, n, I] (max/min split the
 * gradient between ties). */
TPURT_API tpurt_status tpurt_segment_reduce_backward(tpurt_stream *s, const tpurt_view *grad_data,
                                                     const tpurt_view *grad, const tpurt_view *output,
                                                     const tpurt_view *data, const tpurt_view *offsets,
                                                     tpurt_segment_op op, int has_initial, double initial);

/* ----------------------------------------------------------------- trace */
/* A ring of timestamped events the runtime writes while tracing is on
 * (trace.c): the profiler's device side. Off, each hook costs one relaxed
 * load and a predictable branch. Times are CLOCK_MONOTONIC nanoseconds
 * (tpurt_trace_now_ns). Strings are process-lifetime (literals or interned).
 *   KERNEL   a command a stream worker ran: [ts, ts + dur), name, dev,
 *            stream, seq (the command's number on its stream)
 *   LAUNCH   a command enqueued: host tid, dev, stream, seq, corr (the host
 *            op id the enqueuing thread set, 0 inside a deferred graph),
 *            a = its MEMBER events, b = its context: the op whose flush (or
 *            the compiled call whose replay) ran the graph, else corr
 *   MEMBER   one recorded op a launch of a deferred graph contains: seq and
 *            stream of that launch, corr of the op (one event per op fused)
 *   CUT      a DeferAndFuse graph run: a = reason (tpurt_flush_reason),
 *            b = ops recorded, site = user line, dur = run time on the host;
 *            seq = kernels launched, corr = 1 if its plan came from the cache
 *   PLAN     a plan built (span on the host) — a cache miss
 *   COMPILE  a generated kernel: span on the compile thread; a = 1 if it came
 *            from the persistent kernel cache, b = 1 if it loaded
 *   COPY     a copy enqueued or recorded: a = bytes, b = 0 h2d, 1 d2h, 2 d2d
 *   MEMORY   a counter sample of dev: a = allocated bytes, b = reserved */
typedef enum {
  TPURT_TRACE_KERNEL = 1,
  TPURT_TRACE_LAUNCH,
  TPURT_TRACE_MEMBER,
  TPURT_TRACE_CUT,
  TPURT_TRACE_PLAN,
  TPURT_TRACE_COMPILE,
  TPURT_TRACE_COPY,
  TPURT_TRACE_MEMORY
} tpurt_trace_kind;
typedef struct tpurt_trace_event {
  int64_t ts_ns, dur_ns;
  const char *name, *site;
  uint64_t seq, corr;
  int64_t a, b;
  int32_t kind, dev, stream, tid;
} tpurt_trace_event;
/* Starts tracing into a fresh ring of capacity events (rounded up to a power
 * of two; 0: 1 << 18). When the ring is full the oldest events go (counted). */
TPURT_API tpurt_status tpurt_trace_start(size_t capacity);
TPURT_API void tpurt_trace_stop(void);
TPURT_API int tpurt_trace_enabled(void);
/* The calling thread's current host op id: launches it enqueues or records
 * carry it (0: none). */
TPURT_API void tpurt_trace_set_corr(uint64_t id);
/* Copies up to max events, oldest first, into out; *dropped = events the
 * ring lost. Call after tpurt_trace_stop and a device synchronize. */
TPURT_API size_t tpurt_trace_read(tpurt_trace_event *out, size_t max, uint64_t *dropped);
TPURT_API size_t tpurt_trace_count(void);
TPURT_API int64_t tpurt_trace_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* TPURT_H */
