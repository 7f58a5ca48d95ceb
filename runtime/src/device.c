/*
 * device.c — runtime initialisation from the environment, per-generation
 * chip figures, device properties and the thread-local current device.
 */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

tpurt__config tpurt__cfg;
_Atomic int tpurt__inited;
_Atomic int tpurt__blocking;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int t_device;

/* Per-chip figures from Google Cloud TPU documentation:
 *   "TPU v5e"          — 16 GiB HBM2, 819 GB/s, 197 TFLOP/s bf16, 394 TOP/s int8, 1 TensorCore
 *   "TPU v6e (Trillium)" — 32 GiB HBM, 1640 GB/s, 918 TFLOP/s bf16, 1836 TOP/s int8, 1 TensorCore
 *   "TPU7x (Ironwood)" — 192 GiB HBM3e, 7.37 TB/s, 2307 TFLOP/s bf16, 4614 TFLOP/s fp8
 *                        (stored as the 8-bit figure), 2 TensorCores. */
typedef struct gen_spec {
  const char *gen;
  uint64_t hbm;
  double bw, bf16, int8;
  int tc;
} gen_spec;
static const gen_spec k_specs[] = {
    {"v5e", 16ull << 30, 819e9, 197e12, 394e12, 1},
    {"v6e", 32ull << 30, 1640e9, 918e12, 1836e12, 1},
    {"v7x", 192ull << 30, 7.37e12, 2307e12, 4614e12, 2},
};

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  while (*end && isspace((unsigned char)*end)) end++;
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int tpurt__parse_bytes(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  while (isspace((unsigned char)*s)) s++;
  if (*s == '-') return -1;
  double v = strtod(s, &end);
  if (errno || end == s || !(v >= 0)) return -1;
  double mul = 1;
  switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1048576.0; end++; break;
    case 'G': mul = 1073741824.0; end++; break;
    case 'T': mul = 1099511627776.0; end++; break;
    default: break;
  }
  if (mul != 1 && toupper((unsigned char)*end) == 'I') end++;
  if (toupper((unsigned char)*end) == 'B') end++;
  while (isspace((unsigned char)*end)) end++;
  if (*end) return -1;
  double b = v * mul;
  if (b >= 18446744073709551615.0) return -1;
  *out = (uint64_t)b;
  return 0;
}

static tpurt_status do_init(void) {
  tpurt__config c;
  memset(&c, 0, sizeof c);
  const char *e;
  long v;
  tpurt_status cst = tpurt__cpu_check();
  if (cst != TPURT_OK) return cst;
  tpurt__codegen_snapshot_env(); /* compiles never read the live environment (codegen.c) */

  c.num_devices = 1;
  if ((e = getenv("TPU_NUM_DEVICES")) && *e) {
    if (parse_int(e, 1, TPURT_MAX_DEVICES, &v))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "TPU_NUM_DEVICES=\"%s\" is invalid: expected an integer in 1..%d",
                        e, TPURT_MAX_DEVICES);
    c.num_devices = (int)v;
  } else if ((e = getenv("LOCAL_WORLD_SIZE")) && *e) {
    /* Launched by torchrun (or another launcher that sets it): as many chips
     * as processes on this host, so CUDA-style scripts that pick
     * tpu:LOCAL_RANK run unchanged; TPU_NUM_DEVICES overrides. */
    if (parse_int(e, 1, TPURT_MAX_DEVICES, &v))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "LOCAL_WORLD_SIZE=\"%s\" (the launcher's processes on this host, which set the chips per "
                        "process) is invalid: expected an integer in 1..%d; set TPU_NUM_DEVICES to override",
                        e, TPURT_MAX_DEVICES);
    c.num_devices = (int)v;
  }

  const gen_spec *sp = &k_specs[1];
  if ((e = getenv("TORCH_TPU_EMULATE")) && *e) {
    sp = NULL;
    for (size_t i = 0; i < sizeof k_specs / sizeof k_specs[0]; i++)
      if (!strcmp(e, k_specs[i].gen)) sp = &k_specs[i];
    if (!sp)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "TORCH_TPU_EMULATE=\"%s\" is invalid: expected one of v5e, v6e, v7x", e);
  }

  uint64_t limit = UINT64_MAX;
  if ((e = getenv("TORCH_TPU_HBM_LIMIT")) && *e) {
    if (tpurt__parse_bytes(e, &limit) || limit == 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "TORCH_TPU_HBM_LIMIT=\"%s\" is invalid: expected a positive byte count "
                        "(suffixes K, M, G accepted)", e);
  }

  int blocking = 0;
  if ((e = getenv("TPU_LAUNCH_BLOCKING")) && *e) {
    if (parse_int(e, 0, 1, &v))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "TPU_LAUNCH_BLOCKING=\"%s\" is invalid: expected 0 or 1", e);
    blocking = (int)v;
  }
  int defer = 0;
  if ((e = getenv("TORCH_TPU_DEFER_AND_FUSE")) && *e) {
    if (parse_int(e, 0, 1, &v))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "TORCH_TPU_DEFER_AND_FUSE=\"%s\" is invalid: expected 0 or 1", e);
    defer = (int)v && !blocking; /* TPU_LAUNCH_BLOCKING=1 (debugging) wins */
  }

  int nthreads = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) nthreads = CPU_COUNT(&set);
  if (nthreads <= 0) nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (nthreads <= 0) nthreads = 1;
  /* torchrun's processes share the host's cores: each pool gets its share
   * unless TPU_NUM_THREADS says otherwise. */
  if ((e = getenv("LOCAL_WORLD_SIZE")) && *e && !parse_int(e, 1, TPURT_MAX_DEVICES, &v) && v > 1)
    nthreads = nthreads / (int)v > 0 ? nthreads / (int)v : 1;
  if ((e = getenv("TPU_NUM_THREADS")) && *e) {
    if (parse_int(e, 1, 1024, &v))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "TPU_NUM_THREADS=\"%s\" is invalid: expected an integer in 1..1024",
                        e);
    nthreads = (int)v;
  }

  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  uint64_t phys = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : (8ull << 30);
  uint64_t cap = sp->hbm;
  if (limit < cap) cap = limit;
  uint64_t host_share = (uint64_t)(0.8 * (double)phys) / (uint64_t)c.num_devices;
  if (host_share < cap) cap = host_share;
  cap &= ~((2ull << 20) - 1);
  if (cap == 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "emulated TPU capacity is below 2 MiB (TORCH_TPU_HBM_LIMIT too small?)");

  c.num_threads = nthreads;
  tpurt_device_props *p = &c.props;
  snprintf(p->name, sizeof p->name, "TPU %s (emulated)", sp->gen);
  snprintf(p->generation, sizeof p->generation, "%s", sp->gen);
  p->hbm_bytes = sp->hbm;
  p->total_memory = cap;
  p->peak_bf16_flops = sp->bf16;
  p->peak_int8_ops = sp->int8;
  p->hbm_bandwidth = sp->bw;
  p->tensor_cores = sp->tc;
  p->host_threads = nthreads;

  tpurt__cfg = c;
  atomic_store(&tpurt__blocking, blocking);
  atomic_store(&tpurt__defer_on, defer);
  tpurt__pool_configure(nthreads);
  return TPURT_OK;
}

/* Stream workers and pool threads do not survive fork(): a child of an
 * initialized process must not touch the device (it would wait forever on
 * workers that do not exist). The child handler marks the runtime unusable. */
static void mark_forked_child(void) { atomic_store(&tpurt__inited, TPURT__FORKED); }

tpurt_status tpurt_init(void) {
  int state = atomic_load_explicit(&tpurt__inited, memory_order_acquire);
  if (state == 1) return TPURT_OK;
  if (state == TPURT__FORKED) {
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED,
                      "the TPU runtime was initialized in a parent process and cannot be used in a forked "
                      "child; use the 'spawn' start method for multiprocessing");
  }
  pthread_mutex_lock(&g_init_mu);
  tpurt_status st = TPURT_OK;
  if (!atomic_load(&tpurt__inited)) {
    st = do_init();
    if (st == TPURT_OK) {
      pthread_atfork(NULL, NULL, mark_forked_child);
      atomic_store_explicit(&tpurt__inited, 1, memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_init_mu);
  return st;
}

int tpurt_is_initialized(void) { return atomic_load(&tpurt__inited) == 1; }

int tpurt_in_bad_fork(void) { return atomic_load(&tpurt__inited) == TPURT__FORKED; }

int tpurt_device_count(void) {
  if (tpurt__ensure_init() != TPURT_OK) return 0;
  return tpurt__cfg.num_devices;
}

int tpurt_launch_blocking(void) {
  if (tpurt__ensure_init() != TPURT_OK) return 0;
  return atomic_load(&tpurt__blocking);
}

void tpurt_set_launch_blocking(int on) {
  if (tpurt__ensure_init() != TPURT_OK) return;
  atomic_store(&tpurt__blocking, on ? 1 : 0);
}

tpurt_status tpurt__check_device(int dev) {
  TPURT__INIT_OR_RETURN();
  if (dev < 0 || dev >= tpurt__cfg.num_devices)
    return tpurt__err(TPURT_ERR_INVALID_DEVICE, "invalid device index %d (%d TPU device%s available)", dev,
                      tpurt__cfg.num_devices, tpurt__cfg.num_devices == 1 ? "" : "s");
  return TPURT_OK;
}

tpurt_status tpurt_device_get_props(int dev, tpurt_device_props *out) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_device_get_props: out is NULL");
  *out = tpurt__cfg.props;
  return TPURT_OK;
}

int tpurt_get_device(void) { return t_device; }

tpurt_status tpurt_set_device(int dev) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  t_device = dev;
  return TPURT_OK;
}
