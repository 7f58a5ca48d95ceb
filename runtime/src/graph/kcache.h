/*
 * kcache.h — the persistent kernel cache: compiled kernels (shared objects
 * the code generator builds with the system C compiler) kept on disk across
 * processes. Internal API for the code generator; the public side (stats,
 * clear, directory) is the "kernel cache" section of tpurt.h.
 *
 * Use (the code generator):
 *
 *     tpurt__kkey key = {source, "/usr/bin/cc", "cc (Debian 12.2.0-14) 12.2.0",
 *                        "-O3 -shared -fPIC -march=native", "x86-64 avx2 fma avx512f"};
 *     tpurt__kcache_so so;
 *     switch (tpurt__kcache_lookup(&key, &so)) {
 *       case TPURT__KCACHE_HIT:          // verified bytes, ready to load
 *         handle = dlopen(so.path, RTLD_NOW | RTLD_LOCAL);
 *         ...                            // keep so.fd open while handle is loaded
 *         break;
 *       case TPURT__KCACHE_MISS:         // compile, then
 *         tpurt__kcache_store(&key, so_bytes, so_len, compile_seconds);
 *         break;                         // (its status never needs handling)
 *       case TPURT__KCACHE_OFF:          // cache unusable: tpurt_last_error() says why
 *         break;                         // (compile without storing, or interpret)
 *     }
 *
 * Every function is thread-safe and safe across processes sharing the
 * directory. Nothing here aborts: a file-system problem is a status with a
 * message (and one "torch_tpu: " warning on stderr per problem), and the
 * caller carries on without the cache.
 *
 * Environment (read at every call, so a test can point each case elsewhere):
 *   TORCH_TPU_CACHE_DIR       the directory (default $XDG_CACHE_HOME/torch_tpu,
 *                             else $HOME/.cache/torch_tpu), created 0700
 *   TORCH_TPU_CACHE_READONLY  1: lookups only; never writes, touches,
 *                             evicts or deletes anything (shared caches)
 *   TORCH_TPU_CACHE_MAX_BYTES size cap of the entries (K/M/G suffixes; default
 *                             1 GiB); after a store the least recently read
 *                             entries are evicted until the rest fit
 *
 * The entry format, the safety rules and why they are what they are: the
 * header comment of kcache.c.
 */
#ifndef TPURT_KCACHE_H
#define TPURT_KCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"

/* What a compiled kernel depends on. Every field is a NUL-terminated string
 * ("" allowed, NULL means ""). The cache adds the runtime's own version
 * (tpurt_version_string(), TPURT_API_VERSION) and its format version, so a
 * runtime upgrade never loads an old kernel. The whole text of all fields is
 * the key: it is stored in the entry and compared on load, its SHA-256 only
 * names the file. */
typedef struct tpurt__kkey {
  const char *source;           /* the full C source of the kernel */
  const char *compiler;         /* compiler path as invoked ("/usr/bin/cc") */
  const char *compiler_version; /* first line of `<compiler> --version` */
  const char *flags;            /* every flag of the compile and link command */
  const char *isa;              /* target ISA the flags select ("x86-64 avx2 fma") */
} tpurt__kkey;

typedef enum tpurt__kcache_result {
  TPURT__KCACHE_OFF = -1, /* the cache can't be used now: refused or missing
                             directory, no way to hand over the bytes;
                             tpurt_last_error() says why */
  TPURT__KCACHE_MISS = 0, /* no usable entry: compile and store. Also for a
                             corrupt entry (removed) and an entry file the
                             security checks refuse (kept, never loaded; a
                             store replaces it) */
  TPURT__KCACHE_HIT = 1   /* *out holds the verified shared object */
} tpurt__kcache_result;

/* A verified shared object, handed over as an anonymous in-memory file
 * (memfd, sealed against writes) or, where memfds are unavailable, an
 * unlinked temporary file of the cache directory: no other process can
 * name it, so the bytes dlopen maps are the bytes that were verified. */
typedef struct tpurt__kcache_so {
  char path[32];          /* "/proc/self/fd/N": the name to dlopen */
  int fd;                 /* the descriptor behind path */
  size_t size;            /* bytes of the shared object */
  double compile_seconds; /* compile time the storing process reported */
  char key_hash[65];      /* the entry's id: hex SHA-256 of the key text */
} tpurt__kcache_so;

/* Looks the key up; on a hit fills *out (untouched otherwise). Counts a
 * request, and a hit or a miss, in the stats.
 * Keep out->fd open for as long as the library stays loaded and close it
 * (tpurt__kcache_so_close) only after dlclose, or never: glibc recognizes a
 * loaded object by the path string, so a reused descriptor number would make
 * a later dlopen of the same "/proc/self/fd/N" return the earlier library. */
TPURT_TESTABLE tpurt__kcache_result tpurt__kcache_lookup(const tpurt__kkey *key, tpurt__kcache_so *out);
TPURT_TESTABLE void tpurt__kcache_so_close(tpurt__kcache_so *so);

/* Stores the shared object's n bytes under key, atomically (temporary file
 * in the directory, fsync, rename, under a per-key lock; an existing valid
 * entry of the key is kept), records compile_seconds in the entry, then
 * evicts over the size cap. Returns
 *   TPURT_OK                    stored, or the key's entry already there
 *   TPURT_ERR_NOT_SUPPORTED     skipped: read-only mode, cache disabled or
 *                               refused, or the entry is larger than the cap
 *   TPURT_ERR_IO                the write failed (full disk, permissions,
 *                               ...): nothing of it is left in the directory
 *   TPURT_ERR_INVALID_ARGUMENT  NULL key or bytes, n == 0
 * with a message. The caller needs no branch on it: it has the object. */
TPURT_TESTABLE tpurt_status tpurt__kcache_store(const tpurt__kkey *key, const void *so_bytes, size_t n,
                                                double compile_seconds);

/* The entry's id (64 hex digits + NUL) of a key. */
TPURT_TESTABLE void tpurt__kcache_key_hash(const tpurt__kkey *key, char hex[65]);
/* The path of the key's entry file in the current directory (tests, tools). */
TPURT_TESTABLE tpurt_status tpurt__kcache_entry_path(const tpurt__kkey *key, char *buf, size_t n);
/* Forgets the directory, the stats, the per-entry records and the warnings
 * already printed, as a new process would start (tests). Touches no file. */
TPURT_TESTABLE void tpurt__kcache_reset(void);

/* SHA-256 (FIPS 180-4), streaming and one-shot. */
typedef struct tpurt__sha256_ctx {
  uint32_t h[8];
  uint64_t len; /* bytes hashed */
  uint8_t buf[64];
  size_t nbuf;
} tpurt__sha256_ctx;
TPURT_TESTABLE void tpurt__sha256_init(tpurt__sha256_ctx *c);
TPURT_TESTABLE void tpurt__sha256_update(tpurt__sha256_ctx *c, const void *p, size_t n);
TPURT_TESTABLE void tpurt__sha256_final(tpurt__sha256_ctx *c, uint8_t out[32]);
TPURT_TESTABLE void tpurt__sha256(const void *p, size_t n, uint8_t out[32]);

#endif
