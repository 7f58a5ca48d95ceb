/*
 * kcache.c — the persistent kernel cache: compiled kernels (shared objects)
 * on disk, found again by their whole key, checked before they are handed
 * to dlopen (API: kcache.h; stats and clear: tpurt.h).
 *
 * Directory (TORCH_TPU_CACHE_DIR, default $XDG_CACHE_HOME/torch_tpu, else
 * $HOME/.cache/torch_tpu; missing folders are created 0700). File names are
 * the cache's own, <id> being the 64 hex digits of SHA-256(key text):
 *   <id>.tkc              an entry
 *   <id>.lock             the key's lock file (flock), held by its writers
 *   <id>.tmp.<pid>.<n>    a store in progress (stale ones go after an hour)
 * Nothing else in the directory is ever touched, not even by a clear.
 *
 * Entry file, integers little-endian:
 *     0  char[8]  magic "TPUKCACH"
 *     8  u32      format version (1)
 *    12  u32      header bytes (112)
 *    16  u64      key bytes
 *    24  u64      payload bytes (the shared object)
 *    32  u64      compile time reported by the storing process, ns
 *    40  u64      creation time, Unix ns
 *    48  u8[32]   SHA-256 of the payload
 *    80  u8[32]   SHA-256 of bytes 0..79 followed by the key text
 *   112  the key text, then the payload
 * The header hash covers every header field and the key, so one flipped
 * bit anywhere is found: in the header or key by the header hash, in the
 * payload by the payload hash; lengths are checked against the file's size.
 * The entry's mtime is its last-read stamp (set explicitly, at ns
 * precision, when stored and on every hit): eviction removes the oldest.
 *
 * Key text: a version line ("tpurt kernel cache key 1", the runtime's
 * version string and API version) and each field of tpurt__kkey as
 * "<name> <length>\n<bytes>\n" (lengths make field boundaries unambiguous).
 * The whole text is stored and compared byte for byte on load: the hash
 * only names the file, so a collision or an entry written under another
 * name never loads.
 *
 * Safety. Loading a shared object runs its code, so the question is who
 * could have put the bytes there. The threat is another local user (a
 * process of the same user can ptrace this one: nothing to defend there).
 *  - The directory must be a directory owned by the effective user and not
 *    writable by group or others (no sticky shared folders), checked with
 *    lstat and again with fstat on the descriptor that every later call
 *    works through (openat, renameat, unlinkat...): renaming a parent folder
 *    after the check can't redirect the cache. The check is repeated at
 *    every call (one fstat), so a chmod or chown later disables the cache.
 *    A refused directory disables the cache (one warning; the caller runs
 *    without it). A symlinked directory is accepted when the link belongs
 *    to the user or root and its target passes the same checks: ~/.cache
 *    links to a larger disk are common, and a link owned by someone else
 *    (say in /tmp) is refused. The cache then works on the target.
 *  - An entry is opened with O_NOFOLLOW (a symlinked entry is refused) and
 *    O_NONBLOCK (a FIFO can't hang us), then fstat on that descriptor must
 *    show a regular file owned by the user, not group/other-writable; else
 *    it is refused: not loaded, left in place (a store replaces it).
 *  - The entry is read whole into memory once; the checks run on that copy,
 *    and the same memory is what dlopen gets: written into an anonymous
 *    memfd sealed against writes (an unlinked O_TMPFILE/temporary file of
 *    the directory where memfds are unavailable) handed over as
 *    /proc/self/fd/N. There is no path between check and load that anybody
 *    could swap: the file is never read a second time by name.
 *  - Writes: a temporary file created O_EXCL 0600 in the same directory,
 *    written, fsync'ed, renamed over the entry's name (then the directory
 *    fsync'ed), under the key's flock. A reader sees the old file or the new
 *    one, whole. Two writers of one key both succeed: the second finds the
 *    first's valid entry under the lock and keeps it. A failed write (full
 *    disk, EFBIG under RLIMIT_FSIZE, permissions) removes its temporary.
 *  - A corrupt entry is removed under the key's lock, and only while the
 *    name still refers to the file that was read (a writer may just have
 *    renamed a good one there).
 *  - Read-only mode opens entries and the directory, nothing else: no
 *    directory creation, lock files, stamps, evictions or removals.
 */
#include "kcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U /* Linux 6.3: an executable memfd even where vm.memfd_noexec asks otherwise */
#endif

#define KC_MAGIC "TPUKCACH"
#define KC_FORMAT 1u
#define KC_HDR 112u
#define KC_DEFAULT_MAX (1ull << 30)
#define KC_MAX_KEY (256ull << 20)
#define KC_MAX_PAYLOAD (1ull << 30)
#define KC_STALE_TMP_S 3600

/* ------------------------------------------------------------- SHA-256 */

static const uint32_t k_sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) + k_sha_k[i] + w[i];
    uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void tpurt__sha256_init(tpurt__sha256_ctx *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->len = 0;
  c->nbuf = 0;
}

void tpurt__sha256_update(tpurt__sha256_ctx *c, const void *data, size_t n) {
  const uint8_t *p = data;
  c->len += n;
  if (c->nbuf) {
    size_t take = 64 - c->nbuf < n ? 64 - c->nbuf : n;
    memcpy(c->buf + c->nbuf, p, take);
    c->nbuf += take;
    p += take;
    n -= take;
    if (c->nbuf < 64) return;
    sha_block(c->h, c->buf);
    c->nbuf = 0;
  }
  for (; n >= 64; p += 64, n -= 64) sha_block(c->h, p);
  if (n) memcpy(c->buf, p, n);
  c->nbuf = n;
}

void tpurt__sha256_final(tpurt__sha256_ctx *c, uint8_t out[32]) {
  uint64_t bits = c->len * 8;
  uint8_t pad[72] = {0x80};
  size_t npad = (c->nbuf < 56 ? 56 : 120) - c->nbuf;
  for (int i = 0; i < 8; i++) pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
  tpurt__sha256_update(c, pad, npad + 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(c->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)c->h[i];
  }
}

void tpurt__sha256(const void *p, size_t n, uint8_t out[32]) {
  tpurt__sha256_ctx c;
  tpurt__sha256_init(&c);
  tpurt__sha256_update(&c, p, n);
  tpurt__sha256_final(&c, out);
}

static void to_hex(const uint8_t d[32], char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = digits[d[i] >> 4];
    hex[2 * i + 1] = digits[d[i] & 15];
  }
  hex[64] = 0;
}

/* ---------------------------------------------------------- state, stats */

typedef struct entry_rec {
  char id[65];
  uint64_t reads;
  double compile_s;
  double last_read;
} entry_rec;

static struct {
  pthread_mutex_t mu;
  int dirfd;                /* the checked directory, -1: none */
  char cfg_path[PATH_MAX];  /* the path the environment named when dirfd was opened */
  char real_path[PATH_MAX]; /* the directory dirfd is (a symlink's target) */
  uint64_t requests, hits, refused, corrupt, stores, skipped, failures, evictions;
  entry_rec *ents;
  int nents, capents;
  char **warned; /* problems already reported on stderr */
  int nwarned, capwarned;
  uint64_t tmp_seq;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .dirfd = -1};

static void count(uint64_t *c) {
  pthread_mutex_lock(&g.mu);
  (*c)++;
  pthread_mutex_unlock(&g.mu);
}

static double now_unix(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prints "torch_tpu: <msg>" once per tag (a problem: a file and its
 * reason, a directory, a kind of store failure). Never called with g.mu held. */
static void warn_once(const char *tag, const char *msg) {
  int print = 1;
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < g.nwarned && print; i++)
    if (!strcmp(g.warned[i], tag)) print = 0;
  if (print) {
    if (g.nwarned == g.capwarned) {
      int cap = g.capwarned ? 2 * g.capwarned : 16;
      char **w = realloc(g.warned, (size_t)cap * sizeof *w);
      if (w) {
        g.warned = w;
        g.capwarned = cap;
      }
    }
    char *t = g.nwarned < g.capwarned ? strdup(tag) : NULL;
    if (t) g.warned[g.nwarned++] = t;
  }
  pthread_mutex_unlock(&g.mu);
  if (print) fprintf(stderr, "torch_tpu: %s\n", msg);
}

/* Sets the thread's last error to the formatted message, warns once under
 * tag (NULL: the message itself) and returns st. */
static tpurt_status fail_warn(tpurt_status st, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tpurt_status fail_warn(tpurt_status st, const char *tag, const char *fmt, ...) {
  char msg[TPURT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  warn_once(tag ? tag : msg, msg);
  return tpurt__err_str(st, msg);
}

/* The entry's record (created), g.mu held; NULL if out of memory. */
static entry_rec *record_locked(const char *id) {
  for (int i = 0; i < g.nents; i++)
    if (!strcmp(g.ents[i].id, id)) return &g.ents[i];
  if (g.nents == g.capents) {
    int cap = g.capents ? 2 * g.capents : 32;
    entry_rec *e = realloc(g.ents, (size_t)cap * sizeof *e);
    if (!e) return NULL;
    g.ents = e;
    g.capents = cap;
  }
  entry_rec *r = &g.ents[g.nents++];
  memset(r, 0, sizeof *r);
  memcpy(r->id, id, 65);
  return r;
}

static void record(const char *id, int hit, double compile_s) {
  pthread_mutex_lock(&g.mu);
  if (hit) g.hits++;
  else g.stores++;
  entry_rec *r = record_locked(id);
  if (r) {
    r->compile_s = compile_s;
    if (hit) {
      r->reads++;
      r->last_read = now_unix();
    }
  }
  pthread_mutex_unlock(&g.mu);
}

static void reset_stats_locked(void) {
  g.requests = g.hits = g.refused = g.corrupt = g.stores = g.skipped = g.failures = g.evictions = 0;
  free(g.ents);
  g.ents = NULL;
  g.nents = g.capents = 0;
}

void tpurt__kcache_reset(void) {
  pthread_mutex_lock(&g.mu);
  if (g.dirfd >= 0) close(g.dirfd);
  g.dirfd = -1;
  g.cfg_path[0] = g.real_path[0] = 0;
  reset_stats_locked();
  for (int i = 0; i < g.nwarned; i++) free(g.warned[i]);
  free(g.warned);
  g.warned = NULL;
  g.nwarned = g.capwarned = 0;
  pthread_mutex_unlock(&g.mu);
}

/* ------------------------------------------------------------ directory */

/* One call's view of the cache: its own descriptor of the directory (the
 * shared one may be replaced meanwhile) and the settings of the environment. */
typedef struct kctx {
  int dirfd;
  int readonly;
  uint64_t max_bytes;
  char dir[PATH_MAX];
} kctx;

static int env_readonly(void) {
  const char *e = getenv("TORCH_TPU_CACHE_READONLY");
  return e && (!strcmp(e, "1") || !strcasecmp(e, "true") || !strcasecmp(e, "yes") || !strcasecmp(e, "on"));
}

static uint64_t env_max_bytes(void) {
  const char *e = getenv("TORCH_TPU_CACHE_MAX_BYTES");
  uint64_t v;
  if (!e || !*e) return KC_DEFAULT_MAX;
  if (tpurt__parse_bytes(e, &v) || v == 0) {
    char tag[64 + 64];
    snprintf(tag, sizeof tag, "max_bytes:%.60s", e);
    char msg[256];
    snprintf(msg, sizeof msg,
             "TORCH_TPU_CACHE_MAX_BYTES=\"%.100s\" is invalid (expected a positive byte count, suffixes K, M, G): "
             "using 1 GiB", e);
    warn_once(tag, msg);
    return KC_DEFAULT_MAX;
  }
  return v;
}

/* The directory the environment names. */
static tpurt_status configured_dir(char *buf, size_t n) {
  const char *e = getenv("TORCH_TPU_CACHE_DIR");
  int len;
  if (e && *e) {
    len = snprintf(buf, n, "%s", e);
  } else if ((e = getenv("XDG_CACHE_HOME")) && e[0] == '/') { /* the XDG spec: relative values are ignored */
    len = snprintf(buf, n, "%s/torch_tpu", e);
  } else if ((e = getenv("HOME")) && *e) {
    len = snprintf(buf, n, "%s/.cache/torch_tpu", e);
  } else {
    struct passwd pw, *res = NULL;
    char pwbuf[4096];
    if (getpwuid_r(geteuid(), &pw, pwbuf, sizeof pwbuf, &res) || !res || !res->pw_dir || !*res->pw_dir) {
      buf[0] = 0;
      return tpurt__err(TPURT_ERR_NOT_SUPPORTED,
                        "kernel cache: no directory (no HOME, no home in the user database): set TORCH_TPU_CACHE_DIR");
    }
    len = snprintf(buf, n, "%s/.cache/torch_tpu", res->pw_dir);
  }
  if (len < 0 || (size_t)len >= n) {
    buf[0] = 0;
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "kernel cache: directory path too long");
  }
  while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
  return TPURT_OK;
}

/* mkdir -p with mode 0700 for every folder it creates. */
static int mkdir_p(const char *path) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0700) != 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  return mkdir(p, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* Why a directory's or file's stat disqualifies it, or NULL. */
static const char *owner_mode_problem(const struct stat *sb, char *why, size_t n) {
  if (sb->st_uid != geteuid()) {
    snprintf(why, n, "is owned by uid %u, not by this user (uid %u)", (unsigned)sb->st_uid, (unsigned)geteuid());
    return why;
  }
  if (sb->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, n, "is writable by %s (mode %03o)", (sb->st_mode & S_IWOTH) ? "others" : "its group",
             (unsigned)(sb->st_mode & 07777));
    return why;
  }
  return NULL;
}

#define REFUSE_DIR(path, fmt, ...) \
  fail_warn(TPURT_ERR_NOT_SUPPORTED, NULL, "kernel cache disabled: directory %s " fmt, path, ##__VA_ARGS__)

/* The refusal of a directory that fails the owner / mode checks; real is
 * the symlink's target (or path itself). */
static tpurt_status refuse_unsafe(const char *path, const char *real, const char *why) {
  int link = strcmp(path, real) != 0;
  return REFUSE_DIR(path, "%s%s%s%s: refusing to load kernels from it (chmod 700 / chown it, or set "
                    "TORCH_TPU_CACHE_DIR)", link ? "-> " : "", link ? real : "", link ? " " : "", why);
}

/* Opens and checks the directory (creating it unless read-only). */
static tpurt_status dir_open(const char *path, int readonly, int *fd_out, char *real, size_t nreal) {
  struct stat ls, fs;
  char why[160];
  if (lstat(path, &ls) != 0) {
    if (errno != ENOENT)
      return REFUSE_DIR(path, "can't be examined: %s", strerror(errno));
    if (readonly) return REFUSE_DIR(path, "does not exist (read-only mode creates nothing)");
    if (mkdir_p(path) != 0 || lstat(path, &ls) != 0)
      return REFUSE_DIR(path, "can't be created: %s", strerror(errno));
  }
  char resolved[PATH_MAX];
  const char *open_path = path;
  if (S_ISLNK(ls.st_mode)) {
    if (ls.st_uid != geteuid() && ls.st_uid != 0)
      return REFUSE_DIR(path, "is a symlink owned by uid %u (neither this user nor root)", (unsigned)ls.st_uid);
    if (!realpath(path, resolved)) return REFUSE_DIR(path, "is a symlink that can't be resolved: %s", strerror(errno));
    open_path = resolved;
  }
  int fd = open(open_path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return REFUSE_DIR(path, "can't be opened: %s", strerror(errno));
  if (fstat(fd, &fs) != 0 || !S_ISDIR(fs.st_mode)) {
    close(fd);
    return REFUSE_DIR(path, "is not a directory");
  }
  if (owner_mode_problem(&fs, why, sizeof why)) {
    close(fd);
    return refuse_unsafe(path, open_path, why);
  }
  *fd_out = fd;
  snprintf(real, nreal, "%s", open_path);
  return TPURT_OK;
}

/* Fills c for one call: TPURT_OK with c->dirfd a descriptor of the checked
 * directory (close with ctx_close), otherwise the reason (warned once). */
static tpurt_status ctx_open(kctx *c) {
  char want[PATH_MAX], why[160];
  c->dirfd = -1;
  c->readonly = env_readonly();
  c->max_bytes = env_max_bytes();
  tpurt_status st = configured_dir(want, sizeof want);
  if (st != TPURT_OK) {
    warn_once("nodir", tpurt_last_error());
    return st;
  }
  pthread_mutex_lock(&g.mu);
  if (g.dirfd >= 0 && !strcmp(g.cfg_path, want)) {
    struct stat sb;
    if (fstat(g.dirfd, &sb) == 0 && sb.st_nlink > 0) {
      if (owner_mode_problem(&sb, why, sizeof why)) {
        close(g.dirfd); /* unusable until it passes again */
        g.dirfd = -1;
        g.cfg_path[0] = 0;
        char real[PATH_MAX];
        snprintf(real, sizeof real, "%s", g.real_path);
        pthread_mutex_unlock(&g.mu);
        return refuse_unsafe(want, real, why);
      }
      c->dirfd = fcntl(g.dirfd, F_DUPFD_CLOEXEC, 0);
      snprintf(c->dir, sizeof c->dir, "%s", g.real_path);
      pthread_mutex_unlock(&g.mu);
      if (c->dirfd < 0) return tpurt__err(TPURT_ERR_IO, "kernel cache: %s", strerror(errno));
      return TPURT_OK;
    }
  }
  /* first use, another directory named, or the old one was removed */
  if (g.dirfd >= 0) close(g.dirfd);
  g.dirfd = -1;
  g.cfg_path[0] = 0;
  pthread_mutex_unlock(&g.mu);
  int fd = -1;
  char real[PATH_MAX];
  st = dir_open(want, c->readonly, &fd, real, sizeof real);
  if (st != TPURT_OK) return st;
  pthread_mutex_lock(&g.mu);
  if (g.dirfd >= 0) close(g.dirfd); /* another thread opened it meanwhile: keep ours */
  g.dirfd = fd;
  snprintf(g.cfg_path, sizeof g.cfg_path, "%s", want);
  snprintf(g.real_path, sizeof g.real_path, "%s", real);
  c->dirfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  pthread_mutex_unlock(&g.mu);
  snprintf(c->dir, sizeof c->dir, "%s", real);
  if (c->dirfd < 0) return tpurt__err(TPURT_ERR_IO, "kernel cache: %s", strerror(errno));
  return TPURT_OK;
}

static void ctx_close(kctx *c) {
  if (c->dirfd >= 0) close(c->dirfd);
  c->dirfd = -1;
}

/* ------------------------------------------------------------- key text */

static size_t put_field(char *out, const char *name, const char *v) {
  if (!v) v = "";
  size_t n = strlen(v);
  int h = snprintf(out, out ? 64 + strlen(name) : 0, "%s %zu\n", name, n);
  if (out) {
    memcpy(out + h, v, n);
    out[h + n] = '\n';
  }
  return (size_t)h + n + 1;
}

/* The key text (malloc'ed, *len bytes, no NUL counted), NULL if out of memory. */
static char *key_text(const tpurt__kkey *k, size_t *len) {
  char head[160];
  int hn = snprintf(head, sizeof head, "tpurt kernel cache key %u\nruntime %s api %d\n", KC_FORMAT,
                    tpurt_version_string(), TPURT_API_VERSION);
  const char *names[5] = {"compiler", "compiler_version", "flags", "isa", "source"};
  const char *vals[5] = {k->compiler, k->compiler_version, k->flags, k->isa, k->source};
  size_t n = (size_t)hn;
  for (int i = 0; i < 5; i++) n += put_field(NULL, names[i], vals[i]);
  char *t = malloc(n + 1);
  if (!t) return NULL;
  memcpy(t, head, (size_t)hn);
  size_t off = (size_t)hn;
  for (int i = 0; i < 5; i++) off += put_field(t + off, names[i], vals[i]);
  t[off] = 0;
  *len = off;
  return t;
}

void tpurt__kcache_key_hash(const tpurt__kkey *key, char hex[65]) {
  size_t n = 0;
  char *t = key_text(key, &n);
  uint8_t d[32];
  tpurt__sha256(t ? t : "", t ? n : 0, d);
  free(t);
  to_hex(d, hex);
}

tpurt_status tpurt__kcache_entry_path(const tpurt__kkey *key, char *buf, size_t n) {
  if (!key || !buf || !n) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "kernel cache: NULL key or buffer");
  char id[65], dir[PATH_MAX];
  tpurt__kcache_key_hash(key, id);
  kctx c;
  tpurt_status st = ctx_open(&c);
  if (st == TPURT_OK) {
    snprintf(dir, sizeof dir, "%s", c.dir);
    ctx_close(&c);
  } else if (configured_dir(dir, sizeof dir) != TPURT_OK) {
    return st;
  }
  int len = snprintf(buf, n, "%s/%s.tkc", dir, id);
  return len < 0 || (size_t)len >= n ? tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "kernel cache: buffer too small") : st;
}

/* ------------------------------------------------------------ file I/O */

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (w == 0) {
      errno = EIO;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* SHA-256 of the header's first 80 bytes and the key. */
static void header_hash(const uint8_t *hdr, const char *key, size_t klen, uint8_t out[32]) {
  tpurt__sha256_ctx c;
  tpurt__sha256_init(&c);
  tpurt__sha256_update(&c, hdr, 80);
  tpurt__sha256_update(&c, key, klen);
  tpurt__sha256_final(&c, out);
}

/* A flock'ed descriptor of the key's lock file, or -1 (errno set). */
static int lock_key(int dirfd, const char *id) {
  char name[80];
  snprintf(name, sizeof name, "%s.lock", id);
  int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  while (flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
  }
  return fd;
}

static void unlock_key(int fd) {
  if (fd >= 0) close(fd); /* closing the last descriptor releases the flock */
}

typedef enum { ENT_OK, ENT_ABSENT, ENT_REFUSED, ENT_CORRUPT, ENT_ERROR } ent_state;

/* An entry read whole and checked against the key. */
typedef struct ent {
  int fd;          /* the entry's descriptor (ENT_OK, ENT_CORRUPT), else -1 */
  struct stat st;  /* its fstat */
  uint8_t *buf;    /* the file's bytes */
  size_t size;
  const uint8_t *payload;
  size_t payload_len;
  double compile_s;
  char why[192];   /* ENT_REFUSED / ENT_CORRUPT / ENT_ERROR: the reason */
} ent;

static void ent_free(ent *e) {
  if (e->fd >= 0) close(e->fd);
  free(e->buf);
  e->fd = -1;
  e->buf = NULL;
}

/* The reason the bytes are not a valid entry of key kt, or NULL. */
static const char *verify(const uint8_t *b, size_t size, const char *kt, size_t klen, char *why, size_t n) {
  if (size < KC_HDR) {
    snprintf(why, n, "truncated: %zu bytes, shorter than the %u-byte header", size, KC_HDR);
    return why;
  }
  if (memcmp(b, KC_MAGIC, 8) != 0) return snprintf(why, n, "bad magic"), why;
  if (get_u32(b + 8) != KC_FORMAT || get_u32(b + 12) != KC_HDR) {
    snprintf(why, n, "format %u / header %u bytes, expected %u / %u", get_u32(b + 8), get_u32(b + 12), KC_FORMAT,
             KC_HDR);
    return why;
  }
  uint64_t kl = get_u64(b + 16), pl = get_u64(b + 24);
  if (kl > KC_MAX_KEY || pl > KC_MAX_PAYLOAD || KC_HDR + kl + pl != size) {
    snprintf(why, n, "truncated or extended: the header says %llu + %llu + %llu bytes, the file has %zu",
             (unsigned long long)KC_HDR, (unsigned long long)kl, (unsigned long long)pl, size);
    return why;
  }
  uint8_t d[32];
  header_hash(b, (const char *)b + KC_HDR, (size_t)kl, d);
  if (memcmp(d, b + 80, 32) != 0) return snprintf(why, n, "header checksum mismatch"), why;
  if (kl != klen || memcmp(b + KC_HDR, kt, klen) != 0)
    return snprintf(why, n, "holds another key (a foreign entry or a hash collision)"), why;
  tpurt__sha256(b + KC_HDR + kl, (size_t)pl, d);
  if (memcmp(d, b + 48, 32) != 0) return snprintf(why, n, "payload checksum mismatch"), why;
  return NULL;
}

/* Opens, checks and reads the entry `name` of key kt. */
static ent_state ent_read(int dirfd, const char *name, const char *kt, size_t klen, ent *e) {
  memset(e, 0, sizeof *e);
  e->fd = -1;
  int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return ENT_ABSENT;
    if (errno == ELOOP) return snprintf(e->why, sizeof e->why, "is a symlink"), ENT_REFUSED;
    snprintf(e->why, sizeof e->why, "can't be opened: %s", strerror(errno));
    return errno == EACCES || errno == EPERM ? ENT_REFUSED : ENT_ERROR;
  }
  if (fstat(fd, &e->st) != 0) {
    snprintf(e->why, sizeof e->why, "can't be examined: %s", strerror(errno));
    close(fd);
    return ENT_ERROR;
  }
  if (!S_ISREG(e->st.st_mode)) {
    close(fd);
    return snprintf(e->why, sizeof e->why, "is not a regular file"), ENT_REFUSED;
  }
  if (owner_mode_problem(&e->st, e->why, sizeof e->why)) {
    close(fd);
    return ENT_REFUSED;
  }
  e->fd = fd;
  uint64_t fsize = (uint64_t)e->st.st_size;
  if (fsize > KC_HDR + KC_MAX_KEY + KC_MAX_PAYLOAD) {
    snprintf(e->why, sizeof e->why, "is too large for an entry (%llu bytes)", (unsigned long long)fsize);
    return ENT_CORRUPT;
  }
  e->buf = malloc(fsize ? (size_t)fsize : 1);
  if (!e->buf) {
    snprintf(e->why, sizeof e->why, "out of host memory reading %llu bytes", (unsigned long long)fsize);
    return ENT_ERROR;
  }
  size_t got = 0;
  while (got < fsize) {
    ssize_t r = pread(fd, e->buf + got, (size_t)fsize - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(e->why, sizeof e->why, "can't be read: %s", strerror(errno));
      return ENT_ERROR;
    }
    if (r == 0) break; /* shrank meanwhile: verify sees the bytes there are */
    got += (size_t)r;
  }
  e->size = got;
  if (verify(e->buf, got, kt, klen, e->why, sizeof e->why)) return ENT_CORRUPT;
  uint64_t kl = get_u64(e->buf + 16);
  e->payload = e->buf + KC_HDR + kl;
  e->payload_len = (size_t)get_u64(e->buf + 24);
  e->compile_s = 1e-9 * (double)get_u64(e->buf + 32);
  return ENT_OK;
}

static void set_mtime_now(int fd) {
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[1] = ts[0];
  (void)futimens(fd, ts); /* a stamp that can't be set only ages the entry for eviction */
}

/* Hands the verified bytes over as an anonymous file: a sealed memfd, or an
 * unlinked temporary file of the cache directory. */
static int materialize(int dirfd, const void *p, size_t n, tpurt__kcache_so *so, char *why, size_t nwhy) {
  int fd = memfd_create("tpurt-kcache", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
  if (fd < 0 && errno == EINVAL) fd = memfd_create("tpurt-kcache", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int memfd = fd >= 0;
  if (fd < 0) fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    char name[64];
    pthread_mutex_lock(&g.mu);
    uint64_t seq = g.tmp_seq++;
    pthread_mutex_unlock(&g.mu);
    snprintf(name, sizeof name, ".load.%ld.%llu", (long)getpid(), (unsigned long long)seq);
    fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) unlinkat(dirfd, name, 0);
  }
  if (fd < 0) {
    snprintf(why, nwhy, "no anonymous file for the shared object: %s", strerror(errno));
    return -1;
  }
  if (write_all(fd, p, n) != 0) {
    snprintf(why, nwhy, "writing the shared object (%zu bytes) to an anonymous file failed: %s", n, strerror(errno));
    close(fd);
    return -1;
  }
  if (memfd) (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  so->fd = fd;
  snprintf(so->path, sizeof so->path, "/proc/self/fd/%d", fd);
  so->size = n;
  return 0;
}

void tpurt__kcache_so_close(tpurt__kcache_so *so) {
  if (so && so->fd >= 0) close(so->fd);
  if (so) {
    so->fd = -1;
    so->path[0] = 0;
  }
}

/* Removes a corrupt entry if the name still refers to the file read. */
static void drop_corrupt(const kctx *c, const char *id, const char *name, const struct stat *seen) {
  if (c->readonly) return;
  int lk = lock_key(c->dirfd, id);
  if (lk < 0) return;
  struct stat now;
  if (fstatat(c->dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == seen->st_dev &&
      now.st_ino == seen->st_ino)
    unlinkat(c->dirfd, name, 0);
  unlock_key(lk);
}

/* --------------------------------------------------------------- lookup */

tpurt__kcache_result tpurt__kcache_lookup(const tpurt__kkey *key, tpurt__kcache_so *out) {
  count(&g.requests);
  if (!key || !out) {
    count(&g.refused);
    tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "kernel cache: NULL key or result");
    return TPURT__KCACHE_OFF;
  }
  kctx c;
  if (ctx_open(&c) != TPURT_OK) {
    count(&g.refused);
    return TPURT__KCACHE_OFF;
  }
  size_t klen;
  char *kt = key_text(key, &klen);
  if (!kt) {
    ctx_close(&c);
    count(&g.refused);
    tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "kernel cache: out of host memory");
    return TPURT__KCACHE_OFF;
  }
  uint8_t d[32];
  char id[65], name[80], tag[PATH_MAX + 384];
  tpurt__sha256(kt, klen, d);
  to_hex(d, id);
  snprintf(name, sizeof name, "%s.tkc", id);
  ent e;
  ent_state s = ent_read(c.dirfd, name, kt, klen, &e);
  free(kt);
  tpurt__kcache_result res = TPURT__KCACHE_MISS;
  switch (s) {
    case ENT_ABSENT:
      break;
    case ENT_REFUSED:
      count(&g.refused);
      snprintf(tag, sizeof tag, "refused:%s/%s:%s", c.dir, name, e.why);
      fail_warn(TPURT_ERR_NOT_SUPPORTED, tag, "kernel cache entry %s/%s %s: not loaded (the kernel is rebuilt)",
                c.dir, name, e.why);
      break;
    case ENT_CORRUPT:
      count(&g.corrupt);
      drop_corrupt(&c, id, name, &e.st);
      snprintf(tag, sizeof tag, "corrupt:%s/%s", c.dir, name);
      fail_warn(TPURT_ERR_IO, tag, "kernel cache entry %s/%s is corrupt (%s): %s", c.dir, name, e.why,
                c.readonly ? "ignored (read-only cache, left in place)" : "removed, the kernel is rebuilt");
      break;
    case ENT_ERROR:
      count(&g.refused);
      snprintf(tag, sizeof tag, "error:%s/%s", c.dir, name);
      fail_warn(TPURT_ERR_IO, tag, "kernel cache entry %s/%s %s", c.dir, name, e.why);
      res = TPURT__KCACHE_OFF;
      break;
    case ENT_OK: {
      char why[256];
      tpurt__kcache_so so;
      memset(&so, 0, sizeof so);
      so.fd = -1;
      if (materialize(c.dirfd, e.payload, e.payload_len, &so, why, sizeof why) != 0) {
        count(&g.refused);
        snprintf(tag, sizeof tag, "materialize:%s", why);
        fail_warn(TPURT_ERR_IO, tag, "kernel cache: %s", why);
        res = TPURT__KCACHE_OFF;
        break;
      }
      if (!c.readonly) set_mtime_now(e.fd); /* the last-read stamp of the LRU */
      so.compile_seconds = e.compile_s;
      memcpy(so.key_hash, id, 65);
      *out = so;
      record(id, 1, e.compile_s);
      res = TPURT__KCACHE_HIT;
      break;
    }
  }
  ent_free(&e);
  ctx_close(&c);
  return res;
}

/* ---------------------------------------------------------- eviction */

static int is_hex_id(const char *s) {
  for (int i = 0; i < 64; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

typedef enum { NAME_OTHER, NAME_ENTRY, NAME_LOCK, NAME_TMP } name_kind;

/* What the cache made a file of that name for (NAME_OTHER: not the cache's). */
static name_kind kind_of(const char *s) {
  if (strlen(s) < 68 || !is_hex_id(s)) return NAME_OTHER;
  if (!strcmp(s + 64, ".tkc")) return NAME_ENTRY;
  if (!strcmp(s + 64, ".lock")) return NAME_LOCK;
  if (!strncmp(s + 64, ".tmp.", 5)) return NAME_TMP;
  return NAME_OTHER;
}

typedef struct scan_ent {
  char name[72];
  uint64_t size;
  struct timespec mtime;
} scan_ent;

static int by_mtime(const void *a, const void *b) {
  const scan_ent *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* A fresh directory stream of the checked directory (its own offset). */
static DIR *open_scan(int dirfd) {
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return NULL;
  DIR *d = fdopendir(fd);
  if (!d) close(fd);
  return d;
}

/* Evicts the least recently read entries (never `keep`) until the entries
 * fit the cap; removes temporaries of stores that died an hour ago. */
static void evict(const kctx *c, const char *keep) {
  DIR *d = open_scan(c->dirfd);
  if (!d) return;
  scan_ent *v = NULL;
  size_t n = 0, cap = 0;
  uint64_t total = 0;
  time_t now = time(NULL);
  struct dirent *de;
  while ((de = readdir(d))) {
    name_kind k = kind_of(de->d_name);
    struct stat sb;
    /* (a temporary's name, "<id>.tmp.<pid>.<n>", is longer than an entry's: only entries are kept in v) */
    if (k == NAME_OTHER || k == NAME_LOCK) continue;
    if (fstatat(c->dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != geteuid())
      continue;
    if (k == NAME_TMP) {
      if (now - sb.st_mtim.tv_sec > KC_STALE_TMP_S) unlinkat(c->dirfd, de->d_name, 0);
      continue;
    }
    if (strlen(de->d_name) >= sizeof v->name) continue;
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 64;
      scan_ent *nv = realloc(v, nc * sizeof *nv);
      if (!nv) break;
      v = nv;
      cap = nc;
    }
    snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
    v[n].size = (uint64_t)sb.st_size;
    v[n].mtime = sb.st_mtim;
    total += v[n].size;
    n++;
  }
  closedir(d);
  if (total > c->max_bytes) {
    qsort(v, n, sizeof *v, by_mtime);
    for (size_t i = 0; i < n && total > c->max_bytes; i++) {
      if (keep && !strcmp(v[i].name, keep)) continue;
      if (unlinkat(c->dirfd, v[i].name, 0) != 0) continue;
      total -= v[i].size;
      char lock[80];
      snprintf(lock, sizeof lock, "%.64s.lock", v[i].name);
      unlinkat(c->dirfd, lock, 0); /* a writer still holding it loses nothing: renames stay atomic */
      count(&g.evictions);
    }
  }
  free(v);
}

/* ---------------------------------------------------------------- store */

/* The tag that makes one warning per kind of write failure. */
static const char *store_fail_tag(int err) {
  switch (err) {
    case ENOSPC: case EDQUOT: return "store:full";
    case EFBIG: return "store:fsize";
    case EACCES: case EPERM: case EROFS: return "store:perm";
    default: return "store:other";
  }
}

static const char *store_fail_hint(int err) {
  switch (err) {
    case ENOSPC: case EDQUOT: return " (the disk or quota is full)";
    case EFBIG: return " (file size limit: RLIMIT_FSIZE / ulimit -f)";
    default: return "";
  }
}

/* Writes the entry as a temporary file and renames it into place. */
static tpurt_status write_entry(const kctx *c, const char *id, const char *name, const char *kt, size_t klen,
                                const void *bytes, size_t n, double compile_s) {
  uint8_t hdr[KC_HDR];
  memset(hdr, 0, sizeof hdr);
  memcpy(hdr, KC_MAGIC, 8);
  put_u32(hdr + 8, KC_FORMAT);
  put_u32(hdr + 12, KC_HDR);
  put_u64(hdr + 16, klen);
  put_u64(hdr + 24, n);
  put_u64(hdr + 32, compile_s > 0 && compile_s < 1e9 ? (uint64_t)(compile_s * 1e9 + 0.5) : 0);
  put_u64(hdr + 40, (uint64_t)(now_unix() * 1e9));
  tpurt__sha256(bytes, n, hdr + 48);
  header_hash(hdr, kt, klen, hdr + 80);

  char tmp[128];
  pthread_mutex_lock(&g.mu);
  uint64_t seq = g.tmp_seq++;
  pthread_mutex_unlock(&g.mu);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%llu", id, (long)getpid(), (unsigned long long)seq);
  const char *step = "creating";
  int fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int ok = fd >= 0;
  if (ok) {
    step = "writing";
    ok = write_all(fd, hdr, sizeof hdr) == 0 && write_all(fd, kt, klen) == 0 && write_all(fd, bytes, n) == 0;
  }
  if (ok) {
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[1] = ts[0];
    (void)futimens(fd, ts); /* the LRU's clock, not the file system's coarse one */
    step = "syncing";
    ok = fsync(fd) == 0;
  }
  int err = errno;
  if (fd >= 0 && close(fd) != 0 && ok) {
    step = "closing";
    ok = 0;
    err = errno;
  }
  if (ok) {
    step = "renaming";
    ok = renameat(c->dirfd, tmp, c->dirfd, name) == 0;
    err = errno;
  }
  if (!ok) {
    if (fd >= 0) unlinkat(c->dirfd, tmp, 0);
    count(&g.failures);
    return fail_warn(TPURT_ERR_IO, store_fail_tag(err), "kernel cache: storing %s/%s failed while %s: %s%s: "
                     "not cached, the kernel is used from memory", c->dir, name, step, strerror(err),
                     store_fail_hint(err));
  }
  (void)fsync(c->dirfd); /* the rename itself durable; a failure here loses only the entry */
  return TPURT_OK;
}

tpurt_status tpurt__kcache_store(const tpurt__kkey *key, const void *so_bytes, size_t n, double compile_seconds) {
  if (!key || !so_bytes || !n)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "kernel cache store: NULL key or bytes, or 0 bytes");
  kctx c;
  tpurt_status st = ctx_open(&c);
  if (st != TPURT_OK) {
    count(&g.skipped);
    return st == TPURT_ERR_NOT_SUPPORTED ? st : tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s", tpurt_last_error());
  }
  if (c.readonly) {
    ctx_close(&c);
    count(&g.skipped);
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "kernel cache is read-only (TORCH_TPU_CACHE_READONLY): not stored");
  }
  size_t klen;
  char *kt = key_text(key, &klen);
  if (!kt) {
    ctx_close(&c);
    count(&g.failures);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "kernel cache store: out of host memory");
  }
  if (n > KC_MAX_PAYLOAD || klen > KC_MAX_KEY || KC_HDR + klen + n > c.max_bytes) {
    free(kt);
    ctx_close(&c);
    count(&g.skipped);
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "kernel cache: an entry of %zu bytes (key %zu) exceeds the cap "
                      "(TORCH_TPU_CACHE_MAX_BYTES=%llu; keys up to 256 MiB, objects up to 1 GiB): not stored",
                      KC_HDR + klen + n, klen, (unsigned long long)c.max_bytes);
  }
  uint8_t d[32];
  char id[65], name[80];
  tpurt__sha256(kt, klen, d);
  to_hex(d, id);
  snprintf(name, sizeof name, "%s.tkc", id);
  int lk = lock_key(c.dirfd, id);
  if (lk < 0) {
    int err = errno;
    free(kt);
    count(&g.failures);
    st = fail_warn(TPURT_ERR_IO, store_fail_tag(err), "kernel cache: can't lock %s/%s.lock: %s%s: not cached",
                   c.dir, id, strerror(err), store_fail_hint(err));
    ctx_close(&c);
    return st;
  }
  ent e;
  double stored_s = compile_seconds;
  if (ent_read(c.dirfd, name, kt, klen, &e) == ENT_OK) {
    stored_s = e.compile_s; /* another writer was first: its entry stays */
  } else {
    st = write_entry(&c, id, name, kt, klen, so_bytes, n, compile_seconds);
  }
  ent_free(&e);
  unlock_key(lk);
  free(kt);
  if (st == TPURT_OK) {
    record(id, 0, stored_s);
    evict(&c, name);
  }
  ctx_close(&c);
  return st;
}

/* ------------------------------------------------------------ public API */

tpurt_status tpurt_kcache_get_stats(tpurt_kcache_stats *out) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_kcache_get_stats: NULL output");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&g.mu);
  out->requests = g.requests;
  out->hits = g.hits;
  out->misses = g.requests - g.hits;
  out->refused = g.refused;
  out->corrupt = g.corrupt;
  out->stores = g.stores;
  out->stores_skipped = g.skipped;
  out->store_failures = g.failures;
  out->evictions = g.evictions;
  out->usable = g.dirfd >= 0;
  pthread_mutex_unlock(&g.mu);
  out->max_bytes = env_max_bytes();
  out->readonly = env_readonly();
  return TPURT_OK;
}

int tpurt_kcache_entry_count(void) {
  pthread_mutex_lock(&g.mu);
  int n = g.nents;
  pthread_mutex_unlock(&g.mu);
  return n;
}

tpurt_status tpurt_kcache_get_entry(int i, tpurt_kcache_entry_stats *out) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_kcache_get_entry: NULL output");
  pthread_mutex_lock(&g.mu);
  if (i < 0 || i >= g.nents) {
    int n = g.nents;
    pthread_mutex_unlock(&g.mu);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "kernel cache entry %d out of range (%d entries)", i, n);
  }
  memcpy(out->key_hash, g.ents[i].id, 65);
  out->read_count = g.ents[i].reads;
  out->compile_seconds = g.ents[i].compile_s;
  out->last_read = g.ents[i].last_read;
  pthread_mutex_unlock(&g.mu);
  return TPURT_OK;
}

tpurt_status tpurt_kcache_clear(void) {
  pthread_mutex_lock(&g.mu);
  reset_stats_locked();
  pthread_mutex_unlock(&g.mu);
  kctx c;
  if (ctx_open(&c) != TPURT_OK) return TPURT_OK; /* nothing that could be touched */
  if (c.readonly) {
    ctx_close(&c);
    return TPURT_OK;
  }
  DIR *d = open_scan(c.dirfd);
  tpurt_status st = TPURT_OK;
  if (!d) st = tpurt__err(TPURT_ERR_IO, "kernel cache: can't list %s: %s", c.dir, strerror(errno));
  struct dirent *de;
  while (d && (de = readdir(d))) {
    struct stat sb;
    if (kind_of(de->d_name) == NAME_OTHER) continue;
    if (fstatat(c.dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode)) continue;
    if (unlinkat(c.dirfd, de->d_name, 0) != 0 && errno != ENOENT && st == TPURT_OK)
      st = tpurt__err(TPURT_ERR_IO, "kernel cache: can't remove %s/%s: %s", c.dir, de->d_name, strerror(errno));
  }
  if (d) closedir(d);
  ctx_close(&c);
  return st;
}

tpurt_status tpurt_kcache_dir(char *buf, size_t n) {
  if (!buf || !n) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_kcache_dir: NULL or empty buffer");
  kctx c;
  tpurt_status st = ctx_open(&c);
  if (st == TPURT_OK) {
    int len = snprintf(buf, n, "%s", c.dir);
    ctx_close(&c);
    return len < 0 || (size_t)len >= n ? tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_kcache_dir: buffer too small")
                                       : TPURT_OK;
  }
  char msg[TPURT_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", tpurt_last_error());
  if (configured_dir(buf, n) != TPURT_OK) buf[0] = 0;
  return tpurt__err_str(st, msg);
}
