/*
 * memory.c — device address space and caching allocator.
 *
 * Each device owns an address range 0xE000000000000000 + (d << 44) + offset.
 * Its backing is one MAP_NORESERVE reservation of `capacity` bytes made at
 * the first allocation; translation is base + offset. A range allocator
 * (sorted free extents, first fit, coalescing) hands out segments; released
 * segments are madvise(MADV_DONTNEED)'d so the host gets the RAM back.
 *
 * The caching allocator (one per device, one mutex) follows the design of
 * the CUDA caching allocator: 512-byte rounding, a small pool (<= 1 MiB,
 * 2 MiB segments) and a large pool (segments rounded to 2 MiB), per-stream
 * best-fit free blocks, splitting and merging, record_stream fences, a
 * free-cache-and-retry step before reporting out-of-memory, and statistics.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

#define K_ROUND 512ull
#define K_SMALL_MAX (1ull << 20)
#define K_SMALL_SEG (2ull << 20)
#define K_SEG_ROUND (2ull << 20)
#define K_LARGE_SPLIT_MIN (1ull << 20)
/* Mid-size requests (1 MiB, 10 MiB) share 20 MiB segments, so that they are
 * split exactly (allocated bytes == rounded request) and pack together
 * instead of each wasting up to 2 MiB of its own segment. */
#define K_MID_MAX (10ull << 20)
#define K_MID_SEG (20ull << 20)

typedef struct seg seg;
typedef struct blk blk;
struct seg {
  uint64_t off, size;
  int pool;
  int nblocks, nfree;
  uint64_t free_bytes;
};
struct blk {
  uint64_t off, size, req;
  blk *prev, *next; /* neighbours inside the segment */
  seg *sg;
  tpurt_stream *stream;
  int pool;
  int allocated; /* held by the user */
  int pending;   /* freed, waiting for fences */
  tpurt_stream **uses;
  int nuses, capuses;
  tpurt__fence *fences;
  int nfences;
  blk *hnext; /* hash chain (allocated and pending blocks) */
  blk *pnext; /* pending list */
};
typedef struct extent {
  uint64_t off, len;
} extent;
typedef struct freeidx {
  blk **v;
  size_t n, cap;
} freeidx;

typedef struct devmem {
  pthread_mutex_t mu;
  int inited;
  _Atomic(unsigned char *) base;
  uint64_t cap;
  extent *ext;
  size_t next, capext;
  freeidx free[3]; /* [1] small, [2] large */
  blk **ht;
  size_t htcap, htn;
  blk *pending;
  tpurt_memory_stats st;
} devmem;

static devmem g_mem[TPURT_MAX_DEVICES];
static pthread_once_t g_mem_once = PTHREAD_ONCE_INIT;
static void mem_once(void) {
  for (int i = 0; i < TPURT_MAX_DEVICES; i++) pthread_mutex_init(&g_mem[i].mu, NULL);
}

/* ------------------------------------------------------------- helpers */

int tpurt_devptr_device(tpurt_devptr p) {
  if (tpurt__is_promise(p)) {
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
    return q && q->used ? q->dev : -1;
  }
  if ((p & 0xF000000000000000ull) != TPURT_DEVPTR_BASE) return -1;
  uint64_t d = (p - TPURT_DEVPTR_BASE) >> TPURT_DEVPTR_SHIFT;
  if (d >= TPURT_MAX_DEVICES) return -1;
  if (atomic_load(&tpurt__inited) && (int)d >= tpurt__cfg.num_devices) return -1;
  return (int)d;
}

/* NULL for an address that names no chip — a promise with no memory: the
 * chip index read from such an address was far past g_mem, a read that
 * faulted whenever nothing happened to be mapped there (a segfault on the
 * stream worker in one CI run: the foreach chains of a deferred optimizer
 * step translated a temporary the plan gives no memory, which they now
 * skip, optim.c k_fe_chain). A kernel that dereferenced such a result
 * would fault at NULL instead of reading another library's memory. */
void *tpurt__host_view(tpurt_devptr p) {
  if (__builtin_expect(tpurt__is_promise(p), 0)) {
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
    p = (q ? atomic_load_explicit(&q->real, memory_order_acquire) : 0) + (p & TPURT_PROMISE_OFFMASK);
  }
  uint64_t d = (p - TPURT_DEVPTR_BASE) >> TPURT_DEVPTR_SHIFT;
  if (__builtin_expect(d >= TPURT_MAX_DEVICES, 0)) return NULL;
  unsigned char *b = atomic_load_explicit(&g_mem[d].base, memory_order_acquire);
  return b + tpurt__devptr_offset(p);
}

tpurt_status tpurt__check_dev_range(int dev, tpurt_devptr p, int64_t lo, int64_t hi, const char *what) {
  if (tpurt__is_promise(p)) {
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
    if (!q || !q->used)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: 0x%016" PRIx64 " is not a live TPU buffer", what, p);
    if (q->dev != dev)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: address 0x%016" PRIx64 " is on TPU %d, expected TPU %d",
                        what, p, q->dev, dev);
    if (q->lost)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "%s: this tensor has no data: the deferred graph that was to produce it failed (see the "
                        "error it raised)", what);
    int64_t off = (int64_t)(p & TPURT_PROMISE_OFFMASK);
    if (off + lo < 0 || (uint64_t)(off + hi) > q->size)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "%s: range [0x%016" PRIx64 "%+" PRId64 ", %+" PRId64 ") is outside its buffer of %" PRIu64
                        " bytes", what, p, lo, hi, q->size);
    tpurt__defer_note(p, lo, hi);
    return TPURT_OK;
  }
  tpurt__defer_note(p, lo, hi);
  int d = tpurt_devptr_device(p);
  if (d < 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: 0x%016" PRIx64 " is not a TPU device address", what, p);
  if (d != dev)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: address 0x%016" PRIx64 " is on TPU %d, expected TPU %d",
                      what, p, d, dev);
  int64_t off = (int64_t)tpurt__devptr_offset(p);
  uint64_t cap = tpurt__cfg.props.total_memory;
  if (!atomic_load(&g_mem[d].base) || off + lo < 0 || off + hi < 0 || (uint64_t)(off + hi) > cap)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: range [0x%016" PRIx64 "%+" PRId64 ", %+" PRId64 ") is outside the memory of TPU %d", what, p, lo,
                      hi, d);
  return TPURT_OK;
}

static void stat_upd(tpurt_stat *s, int pool, int64_t delta) {
  int idx[2] = {TPURT_POOL_ALL, pool};
  for (int k = 0; k < 2; k++) {
    tpurt_stat *x = &s[idx[k]];
    x->current += delta;
    if (delta > 0) {
      x->allocated += delta;
      if (x->current > x->peak) x->peak = x->current;
    } else {
      x->freed -= delta;
    }
  }
}

/* inactive_split contribution of a segment: its free blocks when split */
static void seg_contrib(devmem *m, seg *g, int sign) {
  if (g->nblocks > 1 && g->nfree > 0) {
    stat_upd(m->st.inactive_split, g->pool, sign * (int64_t)g->nfree);
    stat_upd(m->st.inactive_split_bytes, g->pool, sign * (int64_t)g->free_bytes);
  }
}

/* ------------------------------------------------------------ free index */
/* sorted by (stream, size, off) */
static int blk_less(const blk *a, tpurt_stream *s, uint64_t size, uint64_t off) {
  if ((uintptr_t)a->stream != (uintptr_t)s) return (uintptr_t)a->stream < (uintptr_t)s;
  if (a->size != size) return a->size < size;
  return a->off < off;
}
static size_t fi_lower(freeidx *f, tpurt_stream *s, uint64_t size, uint64_t off) {
  size_t lo = 0, hi = f->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (blk_less(f->v[mid], s, size, off))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
static int fi_insert(freeidx *f, blk *b) {
  if (f->n == f->cap) {
    size_t nc = f->cap ? f->cap * 2 : 64;
    blk **nv = realloc(f->v, nc * sizeof *nv);
    if (!nv) return -1;
    f->v = nv;
    f->cap = nc;
  }
  size_t i = fi_lower(f, b->stream, b->size, b->off);
  memmove(&f->v[i + 1], &f->v[i], (f->n - i) * sizeof *f->v);
  f->v[i] = b;
  f->n++;
  return 0;
}
static void fi_remove(freeidx *f, blk *b) {
  size_t i = fi_lower(f, b->stream, b->size, b->off);
  if (i < f->n && f->v[i] == b) {
    memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof *f->v);
    f->n--;
  }
}
static blk *fi_find(freeidx *f, tpurt_stream *s, uint64_t size) {
  size_t i = fi_lower(f, s, size, 0);
  if (i < f->n && f->v[i]->stream == s) return f->v[i];
  return NULL;
}

/* ------------------------------------------------------------ hash table */
static size_t hslot(devmem *m, uint64_t off) {
  return (size_t)(((off >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & (m->htcap - 1);
}
static int ht_insert(devmem *m, blk *b) {
  if (m->htn + 1 > m->htcap / 2 * 1 + m->htcap / 4 || !m->ht) {
    size_t nc = m->htcap ? m->htcap * 2 : 1024;
    blk **nt = calloc(nc, sizeof *nt);
    if (!nt) return -1;
    size_t oc = m->htcap;
    blk **ot = m->ht;
    m->ht = nt;
    m->htcap = nc;
    for (size_t i = 0; i < oc; i++) {
      blk *x = ot[i];
      while (x) {
        blk *nx = x->hnext;
        size_t h = hslot(m, x->off);
        x->hnext = m->ht[h];
        m->ht[h] = x;
        x = nx;
      }
    }
    free(ot);
  }
  size_t h = hslot(m, b->off);
  b->hnext = m->ht[h];
  m->ht[h] = b;
  m->htn++;
  return 0;
}
static blk *ht_find(devmem *m, uint64_t off, int remove) {
  if (!m->ht) return NULL;
  blk **pp = &m->ht[hslot(m, off)];
  while (*pp) {
    blk *b = *pp;
    if (b->off == off) {
      if (remove) {
        *pp = b->hnext;
        b->hnext = NULL;
        m->htn--;
      }
      return b;
    }
    pp = &b->hnext;
  }
  return NULL;
}

/* ---------------------------------------------------------- range alloc */
static int range_alloc(devmem *m, uint64_t size, uint64_t *off) {
  for (size_t i = 0; i < m->next; i++) {
    if (m->ext[i].len >= size) {
      *off = m->ext[i].off;
      m->ext[i].off += size;
      m->ext[i].len -= size;
      if (m->ext[i].len == 0) {
        memmove(&m->ext[i], &m->ext[i + 1], (m->next - i - 1) * sizeof *m->ext);
        m->next--;
      }
      return 0;
    }
  }
  return -1;
}
static void range_free(devmem *m, uint64_t off, uint64_t len) {
  size_t i = 0;
  while (i < m->next && m->ext[i].off < off) i++;
  int merge_prev = i > 0 && m->ext[i - 1].off + m->ext[i - 1].len == off;
  int merge_next = i < m->next && off + len == m->ext[i].off;
  if (merge_prev && merge_next) {
    m->ext[i - 1].len += len + m->ext[i].len;
    memmove(&m->ext[i], &m->ext[i + 1], (m->next - i - 1) * sizeof *m->ext);
    m->next--;
  } else if (merge_prev) {
    m->ext[i - 1].len += len;
  } else if (merge_next) {
    m->ext[i].off = off;
    m->ext[i].len += len;
  } else {
    if (m->next == m->capext) {
      size_t nc = m->capext * 2;
      extent *ne = realloc(m->ext, nc * sizeof *ne);
      if (!ne) return; /* leaks address space only; cannot happen in practice */
      m->ext = ne;
      m->capext = nc;
    }
    memmove(&m->ext[i + 1], &m->ext[i], (m->next - i) * sizeof *m->ext);
    m->ext[i].off = off;
    m->ext[i].len = len;
    m->next++;
  }
}

static devmem *get_mem(int dev) {
  pthread_once(&g_mem_once, mem_once);
  return &g_mem[dev];
}

/* called with m->mu held */
static int mem_lazy_init(devmem *m) {
  if (m->inited) return 0;
  m->cap = tpurt__cfg.props.total_memory;
  m->capext = 16;
  m->ext = malloc(m->capext * sizeof *m->ext);
  if (!m->ext) return -1;
  m->ext[0].off = 0;
  m->ext[0].len = m->cap;
  m->next = 1;
  m->inited = 1;
  return 0;
}

static int ensure_backing(devmem *m) {
  if (atomic_load(&m->base)) return 0;
  void *p = mmap(NULL, m->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return -1;
  atomic_store_explicit(&m->base, (unsigned char *)p, memory_order_release);
  return 0;
}

/* ------------------------------------------------------------ allocator */

static blk *new_segment(devmem *m, uint64_t size, int pool, tpurt_stream *s) {
  if (ensure_backing(m)) return NULL;
  uint64_t off;
  if (size > m->cap || range_alloc(m, size, &off)) return NULL;
  seg *g = calloc(1, sizeof *g);
  blk *b = calloc(1, sizeof *b);
  if (!g || !b) {
    free(g);
    free(b);
    range_free(m, off, size);
    return NULL;
  }
  g->off = off;
  g->size = size;
  g->pool = pool;
  g->nblocks = 1;
  g->nfree = 1;
  g->free_bytes = size;
  b->off = off;
  b->size = size;
  b->sg = g;
  b->stream = s;
  b->pool = pool;
  if (fi_insert(&m->free[pool], b)) {
    free(g);
    free(b);
    range_free(m, off, size);
    return NULL;
  }
  stat_upd(m->st.segment, pool, 1);
  stat_upd(m->st.reserved_bytes, pool, (int64_t)size);
  m->st.num_device_alloc++;
  return b;
}

static void release_segment(devmem *m, blk *b) {
  seg *g = b->sg;
  fi_remove(&m->free[b->pool], b);
  madvise(atomic_load(&m->base) + g->off, g->size, MADV_DONTNEED);
  range_free(m, g->off, g->size);
  stat_upd(m->st.segment, g->pool, -1);
  stat_upd(m->st.reserved_bytes, g->pool, -(int64_t)g->size);
  m->st.num_device_free++;
  free(g);
  free(b);
}

static void release_cached(devmem *m) {
  for (int pool = 1; pool <= 2; pool++) {
    freeidx *f = &m->free[pool];
    for (size_t i = f->n; i-- > 0;) {
      blk *b = f->v[i];
      if (!b->prev && !b->next) release_segment(m, b);
    }
  }
}

/* returns -1 if the block could not be split (host OOM) */
static int take_block(devmem *m, blk *b, uint64_t rounded, uint64_t req) {
  seg *g = b->sg;
  uint64_t rem = b->size - rounded;
  int split = b->pool == TPURT_POOL_SMALL ? rem >= K_ROUND : rem > K_LARGE_SPLIT_MIN;
  blk *r = NULL;
  if (split) {
    r = calloc(1, sizeof *r);
    if (!r) split = 0;
  }
  fi_remove(&m->free[b->pool], b);
  seg_contrib(m, g, -1);
  if (split) {
    r->off = b->off + rounded;
    r->size = rem;
    r->sg = g;
    r->stream = b->stream;
    r->pool = b->pool;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = rounded;
    g->nblocks++;
    g->nfree++;
    if (fi_insert(&m->free[r->pool], r)) { /* undo */
      b->next = r->next;
      if (r->next) r->next->prev = b;
      b->size += rem;
      g->nblocks--;
      g->nfree--;
      free(r);
      seg_contrib(m, g, 1);
      fi_insert(&m->free[b->pool], b);
      return -1;
    }
  }
  g->nfree--;
  g->free_bytes -= b->size;
  seg_contrib(m, g, 1);
  b->allocated = 1;
  b->req = req;
  stat_upd(m->st.allocation, b->pool, 1);
  stat_upd(m->st.allocated_bytes, b->pool, (int64_t)b->size);
  stat_upd(m->st.active, b->pool, 1);
  stat_upd(m->st.active_bytes, b->pool, (int64_t)b->size);
  stat_upd(m->st.requested_bytes, b->pool, (int64_t)req);
  return 0;
}

static int blk_is_free(const blk *b) { return b && !b->allocated && !b->pending; }

/* return a (no longer used) block to the free index, merging neighbours */
static void free_block(devmem *m, blk *b) {
  seg *g = b->sg;
  seg_contrib(m, g, -1);
  stat_upd(m->st.active, b->pool, -1);
  stat_upd(m->st.active_bytes, b->pool, -(int64_t)b->size);
  stat_upd(m->st.requested_bytes, b->pool, -(int64_t)b->req);
  b->req = 0;
  g->nfree++;
  g->free_bytes += b->size;
  if (blk_is_free(b->prev)) {
    blk *p = b->prev;
    fi_remove(&m->free[p->pool], p);
    b->off = p->off;
    b->size += p->size;
    b->prev = p->prev;
    if (p->prev) p->prev->next = b;
    g->nblocks--;
    g->nfree--;
    free(p);
  }
  if (blk_is_free(b->next)) {
    blk *n = b->next;
    fi_remove(&m->free[n->pool], n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    g->nblocks--;
    g->nfree--;
    free(n);
  }
  if (fi_insert(&m->free[b->pool], b)) {
    /* cannot index it: leave it out of the cache (memory stays reserved) */
  }
  seg_contrib(m, g, 1);
}

static void process_pending(devmem *m) {
  blk **pp = &m->pending;
  while (*pp) {
    blk *b = *pp;
    int ready = 1;
    for (int i = 0; i < b->nfences; i++)
      if (!tpurt__stream_reached(b->fences[i].s, b->fences[i].seq)) {
        ready = 0;
        break;
      }
    if (ready) {
      *pp = b->pnext;
      b->pnext = NULL;
      ht_find(m, b->off, 1);
      free(b->fences);
      b->fences = NULL;
      b->nfences = 0;
      b->pending = 0;
      free_block(m, b);
    } else {
      pp = &b->pnext;
    }
  }
}

static blk *try_alloc(devmem *m, uint64_t rounded, int pool, tpurt_stream *s, int allow_new) {
  blk *b = fi_find(&m->free[pool], s, rounded);
  if (b) return b;
  if (!allow_new) return NULL;
  uint64_t segsize = pool == TPURT_POOL_SMALL ? K_SMALL_SEG
                     : rounded < K_MID_MAX     ? K_MID_SEG
                                               : (rounded + K_SEG_ROUND - 1) & ~(K_SEG_ROUND - 1);
  blk *fresh = new_segment(m, segsize, pool, s);
  /* Near the capacity a 20 MiB segment may not fit where the request does. */
  if (!fresh && segsize == K_MID_SEG) {
    segsize = (rounded + K_SEG_ROUND - 1) & ~(K_SEG_ROUND - 1);
    fresh = new_segment(m, segsize, pool, s);
  }
  return fresh;
}

/* a counter sample for the trace (under m->mu) */
static void trace_memory(const devmem *m, int dev) {
  tpurt__trace_emit(TPURT_TRACE_MEMORY, tpurt__now_ns(), 0, "memory", NULL, dev, -1, 0, 0,
                    m->st.allocated_bytes[TPURT_POOL_ALL].current, m->st.reserved_bytes[TPURT_POOL_ALL].current);
}

tpurt_status tpurt_malloc(int dev, size_t size, tpurt_stream *s, tpurt_devptr *out) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_malloc: out is NULL");
  *out = 0;
  if (size == 0) return TPURT_OK;
  if (!s) {
    s = tpurt__default_stream(dev);
    if (!s) return tpurt__err(TPURT_ERR_INTERNAL, "could not create the default stream of TPU %d", dev);
  } else if (s->dev != dev) {
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_malloc: stream belongs to TPU %d, not TPU %d", s->dev, dev);
  }
  if (tpurt__deferring()) return tpurt__promise_new(dev, size, s, out);
  devmem *m = get_mem(dev);
  uint64_t rounded = size > UINT64_MAX - K_ROUND ? UINT64_MAX : (((uint64_t)size + K_ROUND - 1) & ~(K_ROUND - 1));
  int pool = rounded <= K_SMALL_MAX ? TPURT_POOL_SMALL : TPURT_POOL_LARGE;
  int too_big = rounded > UINT64_MAX - K_SEG_ROUND;

  pthread_mutex_lock(&m->mu);
  if (mem_lazy_init(m)) {
    pthread_mutex_unlock(&m->mu);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_malloc: out of host memory");
  }
  process_pending(m);
  blk *b = too_big ? NULL : try_alloc(m, rounded, pool, s, 1);
  if (!b) {
    /* free the cache and retry once */
    pthread_mutex_unlock(&m->mu);
    tpurt__device_wait(dev);
    pthread_mutex_lock(&m->mu);
    m->st.num_sync_all_streams++;
    process_pending(m);
    release_cached(m);
    m->st.num_alloc_retries++;
    b = too_big ? NULL : try_alloc(m, rounded, pool, s, 1);
  }
  if (b && take_block(m, b, rounded, size) == 0) {
    if (ht_insert(m, b) == 0) {
      if (TPURT__TRACE_ON()) trace_memory(m, dev);
      pthread_mutex_unlock(&m->mu);
      *out = tpurt__devptr_make(dev, b->off);
      return TPURT_OK;
    }
    /* host OOM for the table: give the block back */
    b->allocated = 0;
    stat_upd(m->st.allocation, b->pool, -1);
    stat_upd(m->st.allocated_bytes, b->pool, -(int64_t)b->size);
    free_block(m, b);
  }
  m->st.num_ooms++;
  char req[32], cap[32], fr[32], al[32], un[32];
  uint64_t reserved = (uint64_t)m->st.reserved_bytes[TPURT_POOL_ALL].current;
  uint64_t allocated = (uint64_t)m->st.allocated_bytes[TPURT_POOL_ALL].current;
  tpurt__format_size(rounded, req, sizeof req);
  tpurt__format_size(m->cap, cap, sizeof cap);
  tpurt__format_size(m->cap - reserved, fr, sizeof fr);
  tpurt__format_size(allocated, al, sizeof al);
  tpurt__format_size(reserved - allocated, un, sizeof un);
  pthread_mutex_unlock(&m->mu);
  return tpurt__err(TPURT_ERR_OUT_OF_MEMORY,
                    "Tried to allocate %s. TPU %d has a total capacity of %s of which %s is free. Of the allocated "
                    "memory %s is allocated by PyTorch, and %s is reserved by PyTorch but unallocated.",
                    req, dev, cap, fr, al, un);
}

static tpurt_status lookup_dev(tpurt_devptr p, const char *what, int *dev) {
  TPURT__INIT_OR_RETURN();
  int d = tpurt_devptr_device(p);
  if (d < 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: 0x%016" PRIx64 " is not a TPU device address", what, p);
  *dev = d;
  return TPURT_OK;
}

tpurt_status tpurt_free(tpurt_devptr p) {
  if (p == 0) return TPURT_OK;
  if (tpurt__is_promise(p)) return tpurt__promise_free(p);
  int dev = -1;
  tpurt_status st = lookup_dev(p, "tpurt_free", &dev);
  if (st) return st;
  devmem *m = get_mem(dev);
  uint64_t off = tpurt__devptr_offset(p);
  pthread_mutex_lock(&m->mu);
  blk *b = ht_find(m, off, 0);
  if (b && b->allocated && !tpurt__defer_bypass && atomic_load_explicit(&tpurt__defer_on, memory_order_relaxed)) {
    /* kernels recorded on its stream may still use it: free when they have run */
    tpurt_stream *bs = b->stream;
    pthread_mutex_unlock(&m->mu);
    if (tpurt__defer_record_free(bs, p)) return TPURT_OK;
    pthread_mutex_lock(&m->mu);
    b = ht_find(m, off, 0);
  }
  if (!b || !b->allocated) {
    pthread_mutex_unlock(&m->mu);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "tpurt_free: 0x%016" PRIx64 " was not returned by tpurt_malloc or was already freed", p);
  }
  b->allocated = 0;
  stat_upd(m->st.allocation, b->pool, -1);
  stat_upd(m->st.allocated_bytes, b->pool, -(int64_t)b->size);
  if (TPURT__TRACE_ON()) trace_memory(m, dev);
  if (b->nuses > 0) {
    tpurt__fence *f = malloc((size_t)b->nuses * sizeof *f);
    int nf = 0;
    for (int i = 0; i < b->nuses; i++) {
      tpurt_stream *u = b->uses[i];
      uint64_t q = tpurt__stream_enqueued(u);
      if (!tpurt__stream_reached(u, q)) {
        if (f) {
          f[nf].s = u;
          f[nf].seq = q;
          nf++;
        } else {
          /* host OOM: be safe by waiting, without the allocator's lock (a
           * thread replaying a graph may hold launches of u back until it
           * takes that lock); pending keeps the block out of neighbours'
           * merges meanwhile (it is in no list, so nothing else takes it) */
          b->pending = 1;
          pthread_mutex_unlock(&m->mu);
          tpurt__stream_wait_seq(u, q);
          pthread_mutex_lock(&m->mu);
          b->pending = 0;
        }
      }
    }
    free(b->uses);
    b->uses = NULL;
    b->nuses = b->capuses = 0;
    if (nf > 0) {
      b->fences = f;
      b->nfences = nf;
      b->pending = 1;
      b->pnext = m->pending;
      m->pending = b;
      pthread_mutex_unlock(&m->mu);
      return TPURT_OK;
    }
    free(f);
  }
  ht_find(m, off, 1);
  free_block(m, b);
  pthread_mutex_unlock(&m->mu);
  return TPURT_OK;
}

tpurt_status tpurt_record_stream(tpurt_devptr p, tpurt_stream *s) {
  if (p == 0) return TPURT_OK;
  int dev = -1;
  tpurt_status st = lookup_dev(p, "tpurt_record_stream", &dev);
  if (st) return st;
  st = tpurt__resolve_stream(&s, dev);
  if (st) return st;
  /* a use on another stream: what is recorded must be ordered first */
  if ((st = tpurt__defer_flush_device(dev, TPURT_FLUSH_STREAM))) return st;
  if (tpurt__is_promise(p)) {
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
    p = atomic_load(&q->real);
    if (!p) return TPURT_OK; /* never needed memory */
  }
  devmem *m = get_mem(dev);
  pthread_mutex_lock(&m->mu);
  blk *b = ht_find(m, tpurt__devptr_offset(p), 0);
  if (!b || !b->allocated) {
    pthread_mutex_unlock(&m->mu);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "tpurt_record_stream: 0x%016" PRIx64 " is not the start of a live allocation", p);
  }
  if (s != b->stream) {
    int found = 0;
    for (int i = 0; i < b->nuses; i++) found |= b->uses[i] == s;
    if (!found) {
      if (b->nuses == b->capuses) {
        int nc = b->capuses ? b->capuses * 2 : 4;
        tpurt_stream **nu = realloc(b->uses, (size_t)nc * sizeof *nu);
        if (!nu) {
          pthread_mutex_unlock(&m->mu);
          return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_record_stream: out of host memory");
        }
        b->uses = nu;
        b->capuses = nc;
      }
      b->uses[b->nuses++] = s;
    }
  }
  pthread_mutex_unlock(&m->mu);
  return TPURT_OK;
}

tpurt_status tpurt_empty_cache(int dev) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  devmem *m = get_mem(dev);
  tpurt__device_wait(dev);
  pthread_mutex_lock(&m->mu);
  m->st.num_sync_all_streams++;
  process_pending(m);
  release_cached(m);
  pthread_mutex_unlock(&m->mu);
  return TPURT_OK;
}

tpurt_status tpurt_memory_get_stats(int dev, tpurt_memory_stats *out) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_memory_get_stats: out is NULL");
  devmem *m = get_mem(dev);
  pthread_mutex_lock(&m->mu);
  *out = m->st;
  pthread_mutex_unlock(&m->mu);
  return TPURT_OK;
}

static void each_stat(tpurt_memory_stats *s, void (*f)(tpurt_stat *)) {
  tpurt_stat *arrs[] = {s->allocation, s->segment, s->active, s->inactive_split, s->allocated_bytes,
                        s->reserved_bytes, s->active_bytes, s->inactive_split_bytes, s->requested_bytes};
  for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++)
    for (int p = 0; p < TPURT_NUM_POOLS; p++) f(&arrs[i][p]);
}
static void reset_peak_one(tpurt_stat *s) { s->peak = s->current; }
static void reset_acc_one(tpurt_stat *s) { s->allocated = s->freed = 0; }

tpurt_status tpurt_memory_reset_peak(int dev) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  devmem *m = get_mem(dev);
  pthread_mutex_lock(&m->mu);
  each_stat(&m->st, reset_peak_one);
  pthread_mutex_unlock(&m->mu);
  return TPURT_OK;
}

tpurt_status tpurt_memory_reset_accumulated(int dev) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  devmem *m = get_mem(dev);
  pthread_mutex_lock(&m->mu);
  each_stat(&m->st, reset_acc_one);
  m->st.num_alloc_retries = m->st.num_ooms = m->st.num_device_alloc = m->st.num_device_free =
      m->st.num_sync_all_streams = 0;
  pthread_mutex_unlock(&m->mu);
  return TPURT_OK;
}

uint64_t tpurt__alloc_bytes(tpurt_devptr p) {
  if (tpurt__is_promise(p)) {
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
    return q && q->used ? q->size : 0;
  }
  int dev = tpurt_devptr_device(p);
  if (dev < 0) return 0;
  devmem *m = get_mem(dev);
  if (!m) return 0;
  pthread_mutex_lock(&m->mu);
  blk *b = ht_find(m, tpurt__devptr_offset(p), 0);
  uint64_t n = b && b->allocated ? b->size : 0;
  pthread_mutex_unlock(&m->mu);
  return n;
}

tpurt_status tpurt_memory_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  devmem *m = get_mem(dev);
  uint64_t cap = tpurt__cfg.props.total_memory;
  pthread_mutex_lock(&m->mu);
  uint64_t reserved = (uint64_t)m->st.reserved_bytes[TPURT_POOL_ALL].current;
  pthread_mutex_unlock(&m->mu);
  if (free_bytes) *free_bytes = (size_t)(cap - reserved);
  if (total_bytes) *total_bytes = (size_t)cap;
  return TPURT_OK;
}
