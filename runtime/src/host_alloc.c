/*
 * host_alloc.c — pinned host allocator: page-aligned mmap'd buffers in
 * power-of-two buckets (>= 4 KiB), a cache of free buffers, deferred reuse
 * fenced by the per-stream sequence numbers current at free time, and a
 * sorted registry of buffers so any interior pointer can be recognised.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

#define MIN_BUCKET 12 /* 4 KiB */
#define NBUCKETS 64

typedef struct hblk {
  uintptr_t start;
  size_t size; /* bucket size (mapped) */
  size_t req;
  int live;
  int bucket;
  tpurt__fence *fences;
  int nfences;
  struct hblk *next; /* free list / pending list */
} hblk;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static hblk **g_reg; /* sorted by start */
static size_t g_nreg, g_capreg;
static hblk *g_free[NBUCKETS];
static hblk *g_pending;
static tpurt_host_stats g_st;

static void st_upd(tpurt_stat *x, int64_t d) {
  x->current += d;
  if (d > 0) {
    x->allocated += d;
    if (x->current > x->peak) x->peak = x->current;
  } else {
    x->freed -= d;
  }
}

/* index of the last entry with start <= p, or -1 */
static ptrdiff_t reg_floor(uintptr_t p) {
  size_t lo = 0, hi = g_nreg;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_reg[mid]->start <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (ptrdiff_t)lo - 1;
}

static int reg_insert(hblk *b) {
  if (g_nreg == g_capreg) {
    size_t nc = g_capreg ? g_capreg * 2 : 64;
    hblk **nr = realloc(g_reg, nc * sizeof *nr);
    if (!nr) return -1;
    g_reg = nr;
    g_capreg = nc;
  }
  size_t i = (size_t)(reg_floor(b->start) + 1);
  memmove(&g_reg[i + 1], &g_reg[i], (g_nreg - i) * sizeof *g_reg);
  g_reg[i] = b;
  g_nreg++;
  return 0;
}

static void reg_remove(hblk *b) {
  ptrdiff_t i = reg_floor(b->start);
  if (i >= 0 && g_reg[i] == b) {
    memmove(&g_reg[i], &g_reg[i + 1], (g_nreg - (size_t)i - 1) * sizeof *g_reg);
    g_nreg--;
  }
}

static void process_pending(void) {
  hblk **pp = &g_pending;
  while (*pp) {
    hblk *b = *pp;
    int ready = 1;
    for (int i = 0; i < b->nfences && ready; i++)
      ready = tpurt__stream_reached(b->fences[i].s, b->fences[i].seq);
    if (ready) {
      *pp = b->next;
      free(b->fences);
      b->fences = NULL;
      b->nfences = 0;
      b->next = g_free[b->bucket];
      g_free[b->bucket] = b;
    } else {
      pp = &b->next;
    }
  }
}

tpurt_status tpurt_host_alloc(size_t size, void **out) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_host_alloc: out is NULL");
  *out = NULL;
  if (size == 0) return TPURT_OK;
  if (size > ((size_t)1 << 62))
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_host_alloc: cannot allocate %zu bytes of pinned memory", size);
  int bucket = MIN_BUCKET;
  while (((size_t)1 << bucket) < size) bucket++;
  size_t bsize = (size_t)1 << bucket;

  pthread_mutex_lock(&g_mu);
  process_pending();
  hblk *b = g_free[bucket];
  if (b) {
    g_free[bucket] = b->next;
    b->next = NULL;
  } else {
    void *p = mmap(NULL, bsize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    b = p == MAP_FAILED ? NULL : calloc(1, sizeof *b);
    if (b) {
      b->start = (uintptr_t)p;
      b->size = bsize;
      b->bucket = bucket;
      if (reg_insert(b)) {
        free(b);
        b = NULL;
      }
    }
    if (!b) {
      if (p != MAP_FAILED) munmap(p, bsize);
      pthread_mutex_unlock(&g_mu);
      return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_host_alloc: cannot allocate %zu bytes of pinned memory",
                        size);
    }
    st_upd(&g_st.reserved_bytes, (int64_t)bsize);
  }
  b->live = 1;
  b->req = size;
  st_upd(&g_st.allocation, 1);
  st_upd(&g_st.allocated_bytes, (int64_t)b->size);
  pthread_mutex_unlock(&g_mu);
  *out = (void *)b->start;
  return TPURT_OK;
}

tpurt_status tpurt_host_free(void *ptr) {
  if (!ptr) return TPURT_OK;
  /* fences: every stream with queued work not yet completed */
  tpurt_stream **all;
  int n = tpurt__all_streams(&all);
  tpurt__fence *f = NULL;
  int nf = 0;
  for (int i = 0; i < n; i++) {
    uint64_t q = tpurt__stream_enqueued(all[i]);
    if (tpurt__stream_reached(all[i], q)) continue;
    if (!f) f = malloc((size_t)n * sizeof *f);
    if (!f) {
      tpurt__stream_wait_seq(all[i], q); /* host OOM: wait instead */
      continue;
    }
    f[nf].s = all[i];
    f[nf].seq = q;
    nf++;
  }
  pthread_mutex_lock(&g_mu);
  ptrdiff_t i = reg_floor((uintptr_t)ptr);
  hblk *b = i >= 0 ? g_reg[i] : NULL;
  if (!b || b->start != (uintptr_t)ptr || !b->live) {
    pthread_mutex_unlock(&g_mu);
    free(f);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "tpurt_host_free: %p was not returned by tpurt_host_alloc or was already freed", ptr);
  }
  b->live = 0;
  st_upd(&g_st.allocation, -1);
  st_upd(&g_st.allocated_bytes, -(int64_t)b->size);
  if (nf > 0) {
    b->fences = f;
    b->nfences = nf;
    b->next = g_pending;
    g_pending = b;
  } else {
    free(f);
    b->next = g_free[b->bucket];
    g_free[b->bucket] = b;
  }
  pthread_mutex_unlock(&g_mu);
  return TPURT_OK;
}

int tpurt_host_is_pinned(const void *p) {
  if (!p) return 0;
  pthread_mutex_lock(&g_mu);
  ptrdiff_t i = reg_floor((uintptr_t)p);
  int r = 0;
  if (i >= 0) {
    hblk *b = g_reg[i];
    r = b->live && (uintptr_t)p < b->start + b->req;
  }
  pthread_mutex_unlock(&g_mu);
  return r;
}

tpurt_status tpurt_host_empty_cache(void) {
  pthread_mutex_lock(&g_mu);
  process_pending();
  for (int k = 0; k < NBUCKETS; k++) {
    hblk *b = g_free[k];
    while (b) {
      hblk *nx = b->next;
      reg_remove(b);
      munmap((void *)b->start, b->size);
      st_upd(&g_st.reserved_bytes, -(int64_t)b->size);
      free(b);
      b = nx;
    }
    g_free[k] = NULL;
  }
  pthread_mutex_unlock(&g_mu);
  return TPURT_OK;
}

void tpurt_host_get_stats(tpurt_host_stats *out) {
  if (!out) return;
  pthread_mutex_lock(&g_mu);
  *out = g_st;
  pthread_mutex_unlock(&g_mu);
}
