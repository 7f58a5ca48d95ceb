/* fuzz_kcache.c — coverage-guided fuzzing of the kernel-cache loader
 * (src/graph/kcache.c): reading and verifying entry files, the directory
 * scan of eviction and clear, the size-cap setting.
 *
 * The input's first byte picks a scenario, the rest drives it:
 *  - raw: the bytes are written as the entry file of one of a few keys and
 *    looked up;
 *  - mutated: a valid entry is stored (payload from the input), then edited
 *    by the input (bytes set or flipped, header fields set to boundary values,
 *    truncation, growth, insertion, deletion), optionally with its header and
 *    payload checksums recomputed so that the checks behind them are reached,
 *    and looked up, sometimes in read-only mode;
 *  - directory: files of cache-like and other names (entries, lock files,
 *    temporaries fresh and an hour old, symlinks, folders, FIFOs, other
 *    users' modes) are laid in the directory, then a store under a size cap
 *    from the input (eviction), the entry records, a lookup and a clear.
 *
 * Oracles (a failure aborts: a crash for libFuzzer, a failed test in replay):
 * a lookup hits exactly when the file is a valid entry of the key by an
 * independent reading of the format (kcache.c's header comment), and a hit
 * hands over exactly the file's payload and compile time; a miss removes an
 * invalid entry (kept in read-only mode, where no file changes); a
 * successful store leaves the entries within the cap with its own entry kept
 * and no temporary older than an hour; a clear removes every regular file and
 * symlink of a cache name and nothing else. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../src/graph/kcache.h"
#include "fuzz_main.h"

#define HDR 112u
#define MAX_FILE (1u << 16)

static uint32_t u32(rd *r) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | u8(r);
  return v;
}

static void fail(const char *what) {
  fprintf(stderr, "fuzz_kcache: oracle failed: %s\n", what);
  abort();
}
#define ORACLE(cond, what) \
  do {                     \
    if (!(cond)) fail(what); \
  } while (0)

/* ------------------------------------------------------------ the keys */

static const tpurt__kkey k_keys[] = {
    {"int f(void) { return 1; }\n", "/usr/bin/cc", "cc (Debian 12.2.0-14) 12.2.0", "-O3 -shared -fPIC", "x86-64"},
    {"", "", "", "", ""},
    {NULL, NULL, NULL, NULL, NULL},
    {"void k(float *x) { x[0] = 2; }", "/usr/bin/clang", "clang 14", "-O2", "x86-64 avx2 fma avx512f"},
    {"/* a\nmultiline\nsource */", "cc", "v\n1", "-shared\n-fPIC", "isa 5\n"},
};
#define NKEYS (sizeof k_keys / sizeof k_keys[0])

static char g_dir[256];

static void path_of(const char *name, char *buf, size_t n) { snprintf(buf, n, "%s/%s", g_dir, name); }

/* Removes everything in the directory (the harness only makes files, links, FIFOs and empty folders). */
static void wipe(void) {
  DIR *d = opendir(g_dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[512];
    path_of(e->d_name, p, sizeof p);
    if (unlink(p) != 0) rmdir(p);
  }
  closedir(d);
}

static void cleanup(void) {
  wipe();
  rmdir(g_dir);
}

static uint8_t *read_path(const char *p, size_t *n) {
  int fd = open(p, O_RDONLY | O_NOFOLLOW);
  if (fd < 0) return NULL;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return NULL;
  }
  uint8_t *b = malloc((size_t)sb.st_size + 1);
  ssize_t got = b ? pread(fd, b, (size_t)sb.st_size, 0) : -1;
  close(fd);
  if (got != sb.st_size) {
    free(b);
    return NULL;
  }
  *n = (size_t)got;
  return b;
}

static void write_path(const char *p, const uint8_t *b, size_t n) {
  unlink(p);
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  ORACLE(fd >= 0, "the harness can't write its file");
  ORACLE(n == 0 || write(fd, b, n) == (ssize_t)n, "the harness can't write its file");
  close(fd);
}

/* The key's text as the cache writes it: read back from a stored entry. */
static char *key_text_of(const tpurt__kkey *k, size_t *klen, char *entry, size_t nentry) {
  static const uint8_t one = 0x5a;
  ORACLE(tpurt__kcache_entry_path(k, entry, nentry) == TPURT_OK, "entry path");
  unlink(entry);
  ORACLE(tpurt__kcache_store(k, &one, 1, 0.0) == TPURT_OK, "storing a one-byte entry failed");
  size_t n;
  uint8_t *b = read_path(entry, &n);
  ORACLE(b && n >= HDR, "the stored entry can't be read back");
  uint64_t kl = 0;
  for (int i = 7; i >= 0; i--) kl = kl << 8 | b[16 + i];
  ORACLE(HDR + kl + 1 == n, "the stored entry's key length");
  char *t = malloc(kl + 1);
  memcpy(t, b + HDR, kl);
  free(b);
  *klen = kl;
  return t;
}

/* ------------------------------------------------- the format, independently */

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void hdr_hash(const uint8_t *b, const uint8_t *key, size_t kl, uint8_t out[32]) {
  uint8_t *t = malloc(80 + kl);
  memcpy(t, b, 80);
  memcpy(t + 80, key, kl);
  tpurt__sha256(t, 80 + kl, out);
  free(t);
}

/* Is b a valid entry of key text kt? */
static int valid_entry(const uint8_t *b, size_t n, const char *kt, size_t klen) {
  if (n < HDR || memcmp(b, "TPUKCACH", 8) || le(b + 8, 4) != 1 || le(b + 12, 4) != HDR) return 0;
  uint64_t kl = le(b + 16, 8), pl = le(b + 24, 8);
  if (kl > (256ull << 20) || pl > (1ull << 30) || HDR + kl + pl != n) return 0;
  uint8_t d[32];
  hdr_hash(b, b + HDR, kl, d);
  if (memcmp(d, b + 80, 32)) return 0;
  if (kl != klen || memcmp(b + HDR, kt, klen)) return 0;
  tpurt__sha256(b + HDR + kl, pl, d);
  return !memcmp(d, b + 48, 32);
}

/* Looks key k up with the entry file holding b (n bytes) and checks the result. */
static void lookup_and_check(const tpurt__kkey *k, const char *entry, const uint8_t *b, size_t n, const char *kt,
                             size_t klen, int readonly) {
  write_path(entry, b, n);
  if (readonly) setenv("TORCH_TPU_CACHE_READONLY", "1", 1);
  tpurt__kcache_so so;
  memset(&so, 0, sizeof so);
  so.fd = -1;
  tpurt__kcache_result res = tpurt__kcache_lookup(k, &so);
  unsetenv("TORCH_TPU_CACHE_READONLY");
  int valid = valid_entry(b, n, kt, klen);
  ORACLE(res != TPURT__KCACHE_OFF, "the lookup found the cache unusable");
  ORACLE((res == TPURT__KCACHE_HIT) == valid, valid ? "a valid entry was not loaded" : "an invalid entry was loaded");
  struct stat sb;
  int present = lstat(entry, &sb) == 0;
  if (res == TPURT__KCACHE_HIT) {
    uint64_t kl = le(b + 16, 8), pl = le(b + 24, 8);
    ORACLE(so.fd >= 0 && so.size == pl, "a hit's size");
    uint8_t *got = malloc(pl + 1);
    ORACLE(pread(so.fd, got, pl + 1, 0) == (ssize_t)pl && !memcmp(got, b + HDR + kl, pl),
           "a hit's bytes are not the entry's payload");
    free(got);
    ORACLE(so.compile_seconds == 1e-9 * (double)le(b + 32, 8), "a hit's compile time");
    ORACLE(!strncmp(so.path, "/proc/self/fd/", 14), "a hit's path");
    tpurt__kcache_so_close(&so);
    ORACLE(present, "a valid entry was removed");
  } else {
    ORACLE(readonly ? present : !present,
           readonly ? "a read-only lookup removed an entry" : "an invalid entry was left in place");
  }
  if (readonly) {
    size_t m;
    uint8_t *now = read_path(entry, &m);
    ORACLE(now && m == n && !memcmp(now, b, n), "a read-only lookup changed the entry");
    free(now);
  }
}

/* ------------------------------------------------------------ scenarios */

/* The scenarios of one entry: key k, its entry file's path and its key text. */
static void scenario_raw(rd *r, const tpurt__kkey *k, const char *entry, const char *kt, size_t klen) {
  int readonly = u8(r) & 1;
  size_t n = r->n < MAX_FILE ? r->n : MAX_FILE;
  lookup_and_check(k, entry, r->p, n, kt, klen, readonly);
}

static void scenario_mutated(rd *r, const tpurt__kkey *k, const char *entry, const char *kt, size_t klen) {
  size_t pn = 1 + u8(r) % 200;
  uint8_t pay[256];
  for (size_t i = 0; i < pn; i++) pay[i] = u8(r);
  double cs = (double)u8(r) / 8;
  unlink(entry);
  ORACLE(tpurt__kcache_store(k, pay, pn, cs) == TPURT_OK, "storing an entry failed");
  size_t n;
  uint8_t *stored = read_path(entry, &n);
  ORACLE(stored && valid_entry(stored, n, kt, klen), "a stored entry is not valid");
  uint8_t *b = malloc(MAX_FILE + 64);
  memcpy(b, stored, n);
  free(stored);
  int edits = u8(r) % 6;
  for (int i = 0; i < edits; i++) {
    uint8_t op = u8(r);
    uint32_t off = u32(r);
    switch (op % 8) {
      case 0:
        if (n) b[off % n] = u8(r);
        break;
      case 1:
        if (n) b[off % n] ^= (uint8_t)(1u << (u8(r) & 7));
        break;
      case 2: { /* a header field to a boundary value */
        static const int at[] = {8, 12, 16, 24, 32, 40};
        static const int width[] = {4, 4, 8, 8, 8, 8};
        int f = off % 6;
        uint64_t kl = le(b + 16, 8);
        uint64_t vals[] = {0, 1, HDR, kl + 1, kl - 1, n, 256ull << 20, (256ull << 20) + 1, 1ull << 30,
                           (1ull << 30) + 1, ~0ull, ~0ull - HDR + 1, u64(r)};
        uint64_t v = vals[u8(r) % (sizeof vals / sizeof vals[0])];
        if (n >= HDR) put_le(b + at[f], v, width[f]);
        break;
      }
      case 3:
        n = off % (n + 1);
        break;
      case 4: {
        size_t add = 1 + u8(r) % 64;
        if (n + add <= MAX_FILE)
          for (size_t j = 0; j < add; j++) b[n++] = u8(r);
        break;
      }
      case 5: /* insert a byte */
        if (n < MAX_FILE) {
          size_t at = off % (n + 1);
          memmove(b + at + 1, b + at, n - at);
          b[at] = u8(r);
          n++;
        }
        break;
      case 6: /* delete a run */
        if (n) {
          size_t at = off % n, len = 1 + u8(r) % 16;
          if (len > n - at) len = n - at;
          memmove(b + at, b + at + len, n - at - len);
          n -= len;
        }
        break;
      default: /* the key region of another key */
        if (n >= HDR) {
          const tpurt__kkey *o = &k_keys[off % NKEYS];
          char oentry[512];
          size_t olen;
          char *ot = key_text_of(o, &olen, oentry, sizeof oentry);
          uint64_t kl = le(b + 16, 8);
          size_t rest = kl <= n - HDR ? n - HDR - kl : 0;
          if (HDR + olen + rest <= MAX_FILE && kl <= n - HDR) {
            memmove(b + HDR + olen, b + HDR + kl, rest);
            memcpy(b + HDR, ot, olen);
            put_le(b + 16, olen, 8);
            n = HDR + olen + rest;
          }
          free(ot);
        }
        break;
    }
  }
  uint8_t fix = u8(r);
  if (n >= HDR) {
    uint64_t kl = le(b + 16, 8), pl = le(b + 24, 8);
    int key_in = kl <= n - HDR; /* (lengths from the file: no sum that could wrap) */
    if ((fix & 1) && key_in && pl <= n - HDR - kl) tpurt__sha256(b + HDR + kl, pl, b + 48);
    if ((fix & 2) && key_in) hdr_hash(b, b + HDR, kl, b + 80);
  }
  lookup_and_check(k, entry, b, n, kt, klen, (fix & 12) == 12);
  free(b);
}

static int cache_name(const char *s) {
  if (strlen(s) < 68) return 0;
  for (int i = 0; i < 64; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return !strcmp(s + 64, ".tkc") || !strcmp(s + 64, ".lock") || !strncmp(s + 64, ".tmp.", 5);
}

static void scenario_dir(rd *r) {
  static const char *caps[] = {"", "300", "1K", "2k", "4096", "1M", "0", "-5", "12Q", "lots", "1KB", " 64",
                               "99999999999999999999G", "0x400"};
  static const char *suffix[] = {".tkc", ".lock", ".tmp.1.2", ".tmp.", ".tkc.old", ".TKC", "", ".tkcx"};
  const char *cap = caps[u8(r) % (sizeof caps / sizeof caps[0])];
  int nfiles = u8(r) % 12;
  for (int i = 0; i < nfiles; i++) {
    char name[128], p[512];
    uint8_t idb = u8(r), how = u8(r);
    char hex[65];
    if (idb < 200) {
      uint8_t d[32], seed[2] = {idb, (uint8_t)i};
      tpurt__sha256(seed, 2, d);
      for (int j = 0; j < 32; j++) sprintf(hex + 2 * j, "%02x", d[j]);
    } else { /* not quite an id: 63 digits, an upper-case digit */
      memset(hex, 'a', 64);
      hex[64] = 0;
      if (idb & 1) hex[63] = 0;
      else hex[5] = 'A';
    }
    snprintf(name, sizeof name, "%s%s", hex, suffix[how % 8]);
    path_of(name, p, sizeof p);
    struct stat sb;
    if (lstat(p, &sb) == 0) continue;
    switch ((how >> 3) % 6) {
      case 0:
      case 1: { /* a regular file, fresh or an hour old, of some size */
        size_t sz = u8(r) * 8;
        uint8_t *z = calloc(1, sz + 1);
        write_path(p, z, sz);
        free(z);
        if (how & 0x80) {
          struct timespec ts[2] = {{time(NULL) - 3700, 0}, {time(NULL) - 3700 - u8(r), 0}};
          utimensat(AT_FDCWD, p, ts, 0);
        }
        break;
      }
      case 2: {
        char target[512];
        path_of(u8(r) & 1 ? "missing" : ".", target, sizeof target);
        if (symlink(target, p) != 0) fail("symlink");
        break;
      }
      case 3:
        mkdir(p, 0700);
        break;
      case 4:
        mkfifo(p, 0600);
        break;
      default: { /* writable by others: refused when loaded, still a cache file to evict and clear */
        uint8_t z[16] = {0};
        write_path(p, z, sizeof z);
        chmod(p, 0666);
        break;
      }
    }
  }
  /* a store under the cap: eviction scans the directory */
  setenv("TORCH_TPU_CACHE_MAX_BYTES", cap, 1);
  const tpurt__kkey *k = &k_keys[u8(r) % NKEYS];
  size_t pn = 1 + u8(r) % 128;
  uint8_t pay[128];
  memset(pay, u8(r), sizeof pay);
  char entry[512];
  ORACLE(tpurt__kcache_entry_path(k, entry, sizeof entry) == TPURT_OK, "entry path");
  tpurt_status st = tpurt__kcache_store(k, pay, pn, 0.5);
  tpurt_kcache_stats stats;
  ORACLE(tpurt_kcache_get_stats(&stats) == TPURT_OK, "stats");
  if (st == TPURT_OK) {
    struct stat sb;
    ORACLE(lstat(entry, &sb) == 0 && S_ISREG(sb.st_mode), "a stored entry was evicted");
    uint64_t total = 0;
    DIR *d = opendir(g_dir);
    struct dirent *e;
    time_t now = time(NULL);
    while (d && (e = readdir(d))) {
      char p[512];
      path_of(e->d_name, p, sizeof p);
      if (!cache_name(e->d_name) || lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
      if (!strcmp(e->d_name + 64, ".tkc")) total += (uint64_t)sb.st_size;
      if (!strncmp(e->d_name + 64, ".tmp.", 5))
        ORACLE(now - sb.st_mtime <= 3600 + 5, "a temporary older than an hour was kept");
    }
    if (d) closedir(d);
    ORACLE(total <= stats.max_bytes, "the entries exceed the cap after a store");
  }
  /* the records, a lookup of a laid file's key (none: its id is no key's), then a clear */
  int ne = tpurt_kcache_entry_count();
  for (int i = -1; i <= ne; i++) {
    tpurt_kcache_entry_stats es;
    tpurt_status s = tpurt_kcache_get_entry(i, &es);
    ORACLE((s == TPURT_OK) == (i >= 0 && i < ne), "entry record bounds");
  }
  tpurt__kcache_so so;
  so.fd = -1;
  if (tpurt__kcache_lookup(k, &so) == TPURT__KCACHE_HIT) {
    ORACLE(st == TPURT_OK, "a hit for an entry that was not stored");
    tpurt__kcache_so_close(&so);
  }
  unsetenv("TORCH_TPU_CACHE_MAX_BYTES");
  tpurt_kcache_clear();
  ORACLE(tpurt_kcache_entry_count() == 0, "records after a clear");
  DIR *d = opendir(g_dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char p[512];
    struct stat sb;
    path_of(e->d_name, p, sizeof p);
    if (cache_name(e->d_name) && lstat(p, &sb) == 0)
      ORACLE(!S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode), "a clear left a cache file");
  }
  if (d) closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/fuzz_kcache.XXXXXX", base);
    if (!mkdtemp(g_dir)) fail("mkdtemp");
    setenv("TORCH_TPU_CACHE_DIR", g_dir, 1);
    unsetenv("TORCH_TPU_CACHE_READONLY");
    unsetenv("TORCH_TPU_CACHE_MAX_BYTES");
    atexit(cleanup);
    tpurt__kcache_reset();
  }
  rd r = {data, size};
  wipe();
  uint8_t which = u8(&r) % 3;
  if (which == 2) {
    scenario_dir(&r);
    return 0;
  }
  const tpurt__kkey *k = &k_keys[u8(&r) % NKEYS];
  char entry[512];
  size_t klen;
  char *kt = key_text_of(k, &klen, entry, sizeof entry);
  if (which == 0) scenario_raw(&r, k, entry, kt, klen);
  else scenario_mutated(&r, k, entry, kt, klen);
  free(kt);
  return 0;
}
