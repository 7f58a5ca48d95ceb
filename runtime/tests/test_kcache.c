/* test_kcache.c — the persistent kernel cache (src/graph/kcache.c): SHA-256
 * vectors; store and verified hit; whole-key comparison; corrupt and
 * truncated entries removed with one warning; concurrent writer processes;
 * refused directories and entry files; read-only mode; LRU eviction; a full
 * disk (RLIMIT_FSIZE); threads of one process; clear; the stats. Each case
 * runs in a fresh cache directory named by TORCH_TPU_CACHE_DIR. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/graph/kcache.h"
#include "check.h"

static char g_base[256];
static char g_dir[512];

/* A new, not yet existing cache directory for the case; default settings. */
static void new_case(const char *name) {
  snprintf(g_dir, sizeof g_dir, "%s/%s", g_base, name);
  setenv("TORCH_TPU_CACHE_DIR", g_dir, 1);
  unsetenv("TORCH_TPU_CACHE_READONLY");
  unsetenv("TORCH_TPU_CACHE_MAX_BYTES");
  tpurt__kcache_reset();
}

static tpurt__kkey mk_key(const char *source) {
  tpurt__kkey k = {source, "/usr/bin/cc", "cc (Debian 12.2.0-14) 12.2.0", "-O2 -shared -fPIC", "x86-64 avx2 fma"};
  return k;
}

static unsigned char *payload(size_t n, unsigned seed) {
  unsigned char *p = malloc(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (unsigned char)(x >> 24);
  }
  return p;
}

static void entry_file(const tpurt__kkey *k, char *buf, size_t n) { CHECK_OK(tpurt__kcache_entry_path(k, buf, n)); }

static int exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

/* Files of dir whose names contain sub. */
static int count_files(const char *dir, const char *sub) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.' && strstr(de->d_name, sub)) n++;
  closedir(d);
  return n;
}

/* Looks k up; on a hit *bytes / *n are the shared object's bytes, read back
 * through the descriptor the cache handed over (free them). */
static int lookup_bytes(const tpurt__kkey *k, unsigned char **bytes, size_t *n, tpurt__kcache_so *so_out) {
  tpurt__kcache_so so;
  int r = tpurt__kcache_lookup(k, &so);
  if (bytes) *bytes = NULL;
  if (r != TPURT__KCACHE_HIT) return r;
  CHECK(strncmp(so.path, "/proc/self/fd/", 14) == 0);
  struct stat sb;
  CHECK(fstat(so.fd, &sb) == 0 && (size_t)sb.st_size == so.size);
  if (bytes) {
    *bytes = malloc(so.size ? so.size : 1);
    CHECK(pread(so.fd, *bytes, so.size, 0) == (ssize_t)so.size);
    *n = so.size;
  }
  if (so_out) *so_out = so;
  else tpurt__kcache_so_close(&so);
  return r;
}

static int hit_equals(const tpurt__kkey *k, const unsigned char *want, size_t n) {
  unsigned char *got;
  size_t gn = 0;
  int r = lookup_bytes(k, &got, &gn, NULL);
  int ok = r == TPURT__KCACHE_HIT && gn == n && memcmp(got, want, n) == 0;
  free(got);
  return ok;
}

/* stderr into a file while a case runs, to count the warnings. */
static int g_saved_err = -1;
static char g_cap_path[600];
static void cap_begin(void) {
  fflush(stderr);
  snprintf(g_cap_path, sizeof g_cap_path, "%s/stderr.txt", g_base);
  int fd = open(g_cap_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  g_saved_err = dup(2);
  dup2(fd, 2);
  close(fd);
}
static char *cap_end(void) {
  fflush(stderr);
  dup2(g_saved_err, 2);
  close(g_saved_err);
  static char buf[16384];
  int fd = open(g_cap_path, O_RDONLY);
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[r > 0 ? r : 0] = 0;
  return buf;
}
static int count_str(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static tpurt_kcache_stats stats(void) {
  tpurt_kcache_stats s;
  CHECK_OK(tpurt_kcache_get_stats(&s));
  return s;
}

/* ------------------------------------------------------------------ cases */

static void hex(const uint8_t d[32], char out[65]) {
  for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void test_sha256(void) {
  static const struct {
    const char *msg, *want;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopq"
       "rstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  uint8_t d[32];
  char h[65];
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    tpurt__sha256(v[i].msg, strlen(v[i].msg), d);
    hex(d, h);
    CHECK_STR(h, v[i].want);
  }
  /* a million 'a', streamed in uneven pieces across block boundaries */
  char *a = malloc(1000000);
  memset(a, 'a', 1000000);
  tpurt__sha256_ctx c;
  tpurt__sha256_init(&c);
  for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 1017 + 1)
    tpurt__sha256_update(&c, a + off, off + step > 1000000 ? 1000000 - off : step);
  tpurt__sha256_final(&c, d);
  hex(d, h);
  CHECK_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  tpurt__sha256(a, 1000000, d);
  hex(d, h);
  CHECK_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  /* 55, 56, 63, 64 bytes: the padding's edge cases */
  static const char *edge[4] = {"9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318",
                                "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a",
                                "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34",
                                "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"};
  const size_t lens[4] = {55, 56, 63, 64};
  for (int i = 0; i < 4; i++) {
    tpurt__sha256(a, lens[i], d);
    hex(d, h);
    CHECK_STR(h, edge[i]);
  }
  free(a);
}

static void test_store_hit(void) {
  new_case("store_hit");
  snprintf(g_dir + strlen(g_dir), sizeof g_dir - strlen(g_dir), "/deeper/cache");
  setenv("TORCH_TPU_CACHE_DIR", g_dir, 1);
  tpurt__kkey k = mk_key("void k(float *x) { x[0] += 1; }\n");
  size_t n = 10000;
  unsigned char *p = payload(n, 1);
  CHECK_EQ(tpurt__kcache_lookup(&k, &(tpurt__kcache_so){0}), TPURT__KCACHE_MISS);
  CHECK(exists(g_dir)); /* created, with its missing parents */
  struct stat sb;
  CHECK(stat(g_dir, &sb) == 0 && (sb.st_mode & 0777) == 0700);
  CHECK_OK(tpurt__kcache_store(&k, p, n, 1.25));
  char path[1024];
  entry_file(&k, path, sizeof path);
  CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  CHECK(strstr(path, ".tkc") != NULL);
  CHECK(hit_equals(&k, p, n));
  tpurt__kcache_so so;
  CHECK_EQ(lookup_bytes(&k, NULL, NULL, &so), TPURT__KCACHE_HIT);
  CHECK_NEAR(so.compile_seconds, 1.25, 1e-9);
  char id[65];
  tpurt__kcache_key_hash(&k, id);
  CHECK_STR(so.key_hash, id);
  CHECK(strstr(path, id) != NULL);
  tpurt__kcache_so_close(&so);
  CHECK_EQ(so.fd, -1);

  tpurt_kcache_stats s = stats();
  CHECK_EQ(s.requests, 3);
  CHECK_EQ(s.hits, 2);
  CHECK_EQ(s.misses, 1);
  CHECK_EQ(s.stores, 1);
  CHECK_EQ(s.corrupt, 0);
  CHECK_EQ(s.max_bytes, 1ull << 30);
  CHECK(s.usable && !s.readonly);
  CHECK_EQ(tpurt_kcache_entry_count(), 1);
  tpurt_kcache_entry_stats es;
  CHECK_OK(tpurt_kcache_get_entry(0, &es));
  CHECK_STR(es.key_hash, id);
  CHECK_EQ(es.read_count, 2);
  CHECK_NEAR(es.compile_seconds, 1.25, 1e-9);
  CHECK(es.last_read > 1.6e9);
  CHECK_ST(tpurt_kcache_get_entry(1, &es), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_kcache_get_entry(-1, &es), TPURT_ERR_INVALID_ARGUMENT);

  /* a later process: the compile time comes from the entry */
  tpurt__kcache_reset();
  CHECK_EQ(tpurt_kcache_entry_count(), 0);
  CHECK(hit_equals(&k, p, n));
  CHECK_OK(tpurt_kcache_get_entry(0, &es));
  CHECK_EQ(es.read_count, 1);
  CHECK_NEAR(es.compile_seconds, 1.25, 1e-9);

  /* every field is part of the key */
  tpurt__kkey other[5] = {k, k, k, k, k};
  other[0].source = "void k(float *x) { x[0] += 2; }\n";
  other[1].compiler = "/usr/bin/clang";
  other[2].compiler_version = "cc (Debian 12.2.0-15) 12.2.0";
  other[3].flags = "-O3 -shared -fPIC";
  other[4].isa = "x86-64 avx2 fma avx512f";
  for (int f = 0; f < 5; f++) CHECK_EQ(tpurt__kcache_lookup(&other[f], &so), TPURT__KCACHE_MISS);
  /* storing the same key again keeps the entry */
  CHECK_OK(tpurt__kcache_store(&k, p, n, 9.0));
  CHECK(hit_equals(&k, p, n));
  CHECK_EQ(count_files(g_dir, ".tkc"), 1);
  CHECK_EQ(count_files(g_dir, ".tmp."), 0);

  char dir[1024];
  CHECK_OK(tpurt_kcache_dir(dir, sizeof dir));
  CHECK_STR(dir, g_dir);
  CHECK_ST(tpurt__kcache_store(&k, NULL, 3, 0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt__kcache_store(&k, p, 0, 0), TPURT_ERR_INVALID_ARGUMENT);
  free(p);
}

/* Compiles a shared object whose kfn() returns v; NULL when no compiler. */
static unsigned char *build_so(int v, size_t *n) {
  char src[700], so[700], cmd[2000];
  snprintf(src, sizeof src, "%s/k%d.c", g_base, v);
  snprintf(so, sizeof so, "%s/k%d.so", g_base, v);
  FILE *f = fopen(src, "w");
  if (!f) return NULL;
  fprintf(f, "int kfn(void) { return %d; }\n", v);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o '%s' '%s' >/dev/null 2>&1", so, src);
  if (system(cmd) != 0) return NULL;
  f = fopen(so, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

static void test_dlopen(void) {
  new_case("dlopen");
  size_t n42 = 0, n7 = 0;
  unsigned char *b42 = build_so(42, &n42), *b7 = build_so(7, &n7);
  if (!b42 || !b7) {
    printf("dlopen: no C compiler, skipped\n");
    free(b42);
    free(b7);
    return;
  }
  tpurt__kkey k42 = mk_key("int kfn(void) { return 42; }"), k7 = mk_key("int kfn(void) { return 7; }");
  CHECK_OK(tpurt__kcache_store(&k42, b42, n42, 0.5));
  CHECK_OK(tpurt__kcache_store(&k7, b7, n7, 0.5));
  tpurt__kcache_so s42, s7;
  CHECK_EQ(tpurt__kcache_lookup(&k42, &s42), TPURT__KCACHE_HIT);
  CHECK_EQ(tpurt__kcache_lookup(&k7, &s7), TPURT__KCACHE_HIT);
  /* the handed-over file is sealed against writes where it is a memfd */
  int seals = fcntl(s42.fd, F_GET_SEALS);
  if (seals > 0) {
    CHECK(seals & F_SEAL_WRITE);
    CHECK(pwrite(s42.fd, "x", 1, 0) < 0);
  }
  void *h42 = dlopen(s42.path, RTLD_NOW | RTLD_LOCAL), *h7 = dlopen(s7.path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h42 && h7 && h42 != h7);
  if (h42 && h7) {
    int (*f42)(void) = (int (*)(void))dlsym(h42, "kfn");
    int (*f7)(void) = (int (*)(void))dlsym(h7, "kfn");
    CHECK(f42 && f7);
    if (f42 && f7) {
      CHECK_EQ(f42(), 42);
      CHECK_EQ(f7(), 7);
    }
  } else {
    fprintf(stderr, "dlopen: %s\n", dlerror());
  }
  if (h42) dlclose(h42);
  if (h7) dlclose(h7);
  tpurt__kcache_so_close(&s42);
  tpurt__kcache_so_close(&s7);
  free(b42);
  free(b7);
}

static void test_key_mismatch(void) {
  new_case("key_mismatch");
  tpurt__kkey a = mk_key("kernel A"), b = mk_key("kernel B");
  unsigned char *p = payload(500, 2);
  CHECK_OK(tpurt__kcache_store(&b, p, 500, 0.1));
  char pa[1024], pb[1024];
  entry_file(&a, pa, sizeof pa);
  entry_file(&b, pb, sizeof pb);
  CHECK(rename(pb, pa) == 0); /* B's valid entry under A's name */
  cap_begin();
  int r = tpurt__kcache_lookup(&a, &(tpurt__kcache_so){0});
  char *err = cap_end();
  CHECK_EQ(r, TPURT__KCACHE_MISS);
  CHECK(!exists(pa));
  CHECK_EQ(count_str(err, "torch_tpu: "), 1);
  CHECK(strstr(err, pa) != NULL && strstr(err, "another key") != NULL);
  CHECK_EQ(stats().corrupt, 1);
  CHECK_EQ(stats().hits, 0);
  CHECK_EQ(tpurt__kcache_lookup(&b, &(tpurt__kcache_so){0}), TPURT__KCACHE_MISS);
  free(p);
}

typedef enum { C_TRUNC_HALF, C_TRUNC_HDR, C_EMPTY, C_EXTEND, C_FLIP_PAYLOAD, C_FLIP_COMPILE, C_FLIP_MAGIC,
               C_FLIP_LEN, C_FLIP_KEY, C_FLIP_PHASH, C_NUM } corruption;

static void corrupt_file(const char *path, corruption c) {
  struct stat sb;
  CHECK(stat(path, &sb) == 0);
  off_t size = sb.st_size;
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  off_t at = -1;
  switch (c) {
    case C_TRUNC_HALF: CHECK(ftruncate(fd, size / 2) == 0); break;
    case C_TRUNC_HDR: CHECK(ftruncate(fd, 50) == 0); break;
    case C_EMPTY: CHECK(ftruncate(fd, 0) == 0); break;
    case C_EXTEND: CHECK(pwrite(fd, "", 1, size) == 1); break;
    case C_FLIP_PAYLOAD: at = size - 1; break;
    case C_FLIP_COMPILE: at = 33; break;
    case C_FLIP_MAGIC: at = 0; break;
    case C_FLIP_LEN: at = 24; break;
    case C_FLIP_KEY: at = 112 + 5; break;
    case C_FLIP_PHASH: at = 60; break;
    default: break;
  }
  if (at >= 0) {
    unsigned char b;
    CHECK(pread(fd, &b, 1, at) == 1);
    b ^= 0x10;
    CHECK(pwrite(fd, &b, 1, at) == 1);
  }
  close(fd);
}

static void test_corrupt(void) {
  new_case("corrupt");
  for (int c = 0; c < C_NUM; c++) {
    char src[64];
    snprintf(src, sizeof src, "kernel %d", c);
    tpurt__kkey k = mk_key(src);
    size_t n = 3000 + 100 * (size_t)c;
    unsigned char *p = payload(n, 10 + (unsigned)c);
    CHECK_OK(tpurt__kcache_store(&k, p, n, 0.2));
    char path[1024];
    entry_file(&k, path, sizeof path);
    corrupt_file(path, (corruption)c);
    uint64_t before = stats().corrupt;
    cap_begin();
    int r = tpurt__kcache_lookup(&k, &(tpurt__kcache_so){0});
    int r2 = tpurt__kcache_lookup(&k, &(tpurt__kcache_so){0});
    char *err = cap_end();
    if (r != TPURT__KCACHE_MISS) fprintf(stderr, "corruption %d: lookup %d\n", c, r);
    CHECK_EQ(r, TPURT__KCACHE_MISS);
    CHECK_EQ(r2, TPURT__KCACHE_MISS);
    CHECK(!exists(path)); /* removed */
    CHECK_EQ(stats().corrupt, before + 1);
    CHECK_EQ(count_str(err, "torch_tpu: "), 1);
    CHECK(strstr(err, path) != NULL && strstr(err, "corrupt") != NULL);
    /* rebuilt: stored again, a hit */
    CHECK_OK(tpurt__kcache_store(&k, p, n, 0.2));
    CHECK(hit_equals(&k, p, n));
    /* the same file corrupt again: no second warning */
    corrupt_file(path, (corruption)c);
    cap_begin();
    r = tpurt__kcache_lookup(&k, &(tpurt__kcache_so){0});
    err = cap_end();
    CHECK_EQ(r, TPURT__KCACHE_MISS);
    CHECK_EQ(count_str(err, "torch_tpu: "), 0);
    CHECK(!exists(path));
    free(p);
  }
  CHECK_EQ(stats().hits, C_NUM);
  CHECK_EQ(count_files(g_dir, ".tmp."), 0);
}

#define NPROC 4
#define ROUNDS 25

static int writer(int id, int go_fd) {
  char c;
  if (read(go_fd, &c, 1) != 1) return 99; /* all start together */
  tpurt__kcache_reset();
  int bad = 0;
  tpurt__kkey shared = mk_key("shared kernel");
  unsigned char *ps = payload(20000, 100);
  char src[64];
  snprintf(src, sizeof src, "own kernel %d", id);
  tpurt__kkey own = mk_key(src);
  unsigned char *po = payload(5000 + 1000 * (size_t)id, 200 + (unsigned)id);
  for (int r = 0; r < ROUNDS; r++) {
    if (tpurt__kcache_store(&shared, ps, 20000, 0.3) != TPURT_OK) bad++;
    if (tpurt__kcache_store(&own, po, 5000 + 1000 * (size_t)id, 0.4) != TPURT_OK) bad++;
    /* the shared entry may have just been removed (below): a miss then, never other bytes */
    unsigned char *got;
    size_t gn = 0;
    int r2 = lookup_bytes(&shared, &got, &gn, NULL);
    if (r2 == TPURT__KCACHE_OFF || (r2 == TPURT__KCACHE_HIT && (gn != 20000 || memcmp(got, ps, gn)))) bad++;
    free(got);
    if (!hit_equals(&own, po, 5000 + 1000 * (size_t)id)) bad++;
    if (r % 5 == 4 && id == 0) { /* remove the shared entry now and then: the writers race again */
      char path[1024];
      if (tpurt__kcache_entry_path(&shared, path, sizeof path) == TPURT_OK) unlink(path);
    }
  }
  free(ps);
  free(po);
  tpurt_kcache_stats st;
  tpurt_kcache_get_stats(&st);
  return bad + (int)st.corrupt + (int)st.store_failures;
}

static void test_concurrent(void) {
  new_case("concurrent");
  CHECK_EQ(tpurt__kcache_lookup(&(tpurt__kkey){0}, &(tpurt__kcache_so){0}), TPURT__KCACHE_MISS); /* creates the dir */
  int go[2];
  CHECK(pipe(go) == 0);
  pid_t pids[NPROC];
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < NPROC; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      close(go[1]);
      _exit(writer(i, go[0]));
    }
  }
  close(go[0]);
  CHECK(write(go[1], "gggg", NPROC) == NPROC);
  close(go[1]);
  for (int i = 0; i < NPROC; i++) {
    int status = 0;
    CHECK(waitpid(pids[i], &status, 0) == pids[i]);
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status) && WEXITSTATUS(status)) fprintf(stderr, "writer %d: %d failures\n", i, WEXITSTATUS(status));
    CHECK_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
  }
  /* every entry there verifies, one per key, no temporaries left */
  tpurt__kkey shared = mk_key("shared kernel");
  unsigned char *ps = payload(20000, 100);
  tpurt_kcache_stats s0 = stats();
  int shared_there = hit_equals(&shared, ps, 20000);
  if (!shared_there) CHECK_OK(tpurt__kcache_store(&shared, ps, 20000, 0.3));
  CHECK(hit_equals(&shared, ps, 20000));
  for (int i = 0; i < NPROC; i++) {
    char src[64];
    snprintf(src, sizeof src, "own kernel %d", i);
    tpurt__kkey own = mk_key(src);
    unsigned char *po = payload(5000 + 1000 * (size_t)i, 200 + (unsigned)i);
    CHECK(hit_equals(&own, po, 5000 + 1000 * (size_t)i));
    free(po);
  }
  CHECK_EQ(stats().corrupt, s0.corrupt);
  CHECK_EQ(count_files(g_dir, ".tkc"), NPROC + 1);
  CHECK_EQ(count_files(g_dir, ".tmp."), 0);
  free(ps);
}

static void test_dir_security(void) {
  tpurt__kcache_so so;
  tpurt__kkey k = mk_key("secure kernel");
  unsigned char *p = payload(800, 3);
  int root = geteuid() == 0;

  /* a directory owned by another user */
  new_case("other_owner");
  CHECK_OK(tpurt__kcache_store(&k, p, 800, 0.1));
  if (root) {
    CHECK(chown(g_dir, 65534, 65534) == 0);
    cap_begin();
    int r1 = tpurt__kcache_lookup(&k, &so), r2 = tpurt__kcache_lookup(&k, &so);
    tpurt_status st = tpurt__kcache_store(&k, p, 800, 0.1);
    char *err = cap_end();
    CHECK_EQ(r1, TPURT__KCACHE_OFF);
    CHECK_EQ(r2, TPURT__KCACHE_OFF);
    CHECK_EQ(st, TPURT_ERR_NOT_SUPPORTED);
    CHECK_EQ(count_str(err, "torch_tpu: "), 1);
    CHECK(strstr(err, g_dir) && strstr(err, "owned by uid 65534"));
    CHECK(strstr(tpurt_last_error(), "owned by uid 65534") != NULL);
    CHECK_EQ(stats().hits, 0);
    CHECK_EQ(stats().refused, 2);
    CHECK_EQ(stats().stores_skipped, 1);
    CHECK(!stats().usable);
    char d[1024];
    CHECK_ST(tpurt_kcache_dir(d, sizeof d), TPURT_ERR_NOT_SUPPORTED);
    CHECK_OK(tpurt_kcache_clear()); /* touches nothing */
    CHECK_EQ(count_files(g_dir, ".tkc"), 1);
    CHECK(chown(g_dir, 0, 0) == 0);
    CHECK_EQ(lookup_bytes(&k, NULL, NULL, NULL), TPURT__KCACHE_HIT);
  } else {
    printf("dir_security: not root, the other-owner cases skipped\n");
  }

  /* writable by group or others; a chmod later is seen at the next call */
  const mode_t bad_modes[3] = {0770, 0707, 0777};
  for (int i = 0; i < 3; i++) {
    CHECK(chmod(g_dir, bad_modes[i]) == 0);
    cap_begin();
    int r = tpurt__kcache_lookup(&k, &so);
    char *err = cap_end();
    CHECK_EQ(r, TPURT__KCACHE_OFF);
    CHECK(strstr(err, "writable by") != NULL);
    CHECK_EQ(tpurt__kcache_store(&k, p, 800, 0.1), TPURT_ERR_NOT_SUPPORTED);
  }
  CHECK(chmod(g_dir, 0700) == 0);
  CHECK_EQ(lookup_bytes(&k, NULL, NULL, NULL), TPURT__KCACHE_HIT);
  /* a fresh process that meets a bad directory first */
  CHECK(chmod(g_dir, 0777) == 0);
  tpurt__kcache_reset();
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_OFF);
  CHECK_EQ(count_str(cap_end(), "torch_tpu: "), 1);
  CHECK(chmod(g_dir, 0700) == 0);

  /* a symlink to a good directory works (on the target); to a bad one, not */
  char good[600], link[600];
  snprintf(good, sizeof good, "%s", g_dir);
  snprintf(link, sizeof link, "%s/link_good", g_base);
  CHECK(symlink(good, link) == 0);
  setenv("TORCH_TPU_CACHE_DIR", link, 1);
  CHECK_EQ(lookup_bytes(&k, NULL, NULL, NULL), TPURT__KCACHE_HIT);
  char d[1024];
  CHECK_OK(tpurt_kcache_dir(d, sizeof d));
  CHECK_STR(d, good);
  char badd[600];
  snprintf(badd, sizeof badd, "%s/world", g_base);
  CHECK(mkdir(badd, 0700) == 0 && chmod(badd, 0777) == 0);
  snprintf(link, sizeof link, "%s/link_bad", g_base);
  CHECK(symlink(badd, link) == 0);
  setenv("TORCH_TPU_CACHE_DIR", link, 1);
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_OFF);
  cap_end();
  CHECK_EQ(count_files(badd, ".tkc"), 0);

  /* a path that is a file */
  snprintf(link, sizeof link, "%s/afile", g_base);
  close(open(link, O_WRONLY | O_CREAT, 0600));
  setenv("TORCH_TPU_CACHE_DIR", link, 1);
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_OFF);
  cap_end();

  /* read-only and missing: refused, not created */
  new_case("ro_missing");
  setenv("TORCH_TPU_CACHE_READONLY", "1", 1);
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_OFF);
  char *err = cap_end();
  CHECK(strstr(err, "does not exist") != NULL);
  CHECK(!exists(g_dir));

  /* entry files: another owner, writable by others, a symlink, a FIFO */
  new_case("entries");
  CHECK_OK(tpurt__kcache_store(&k, p, 800, 0.1));
  char path[1024];
  entry_file(&k, path, sizeof path);
  if (root) {
    CHECK(chown(path, 65534, 65534) == 0);
    cap_begin();
    int r1 = tpurt__kcache_lookup(&k, &so), r2 = tpurt__kcache_lookup(&k, &so);
    err = cap_end();
    CHECK_EQ(r1, TPURT__KCACHE_MISS);
    CHECK_EQ(r2, TPURT__KCACHE_MISS);
    CHECK_EQ(count_str(err, "torch_tpu: "), 1);
    CHECK(strstr(err, path) && strstr(err, "not loaded"));
    CHECK(exists(path)); /* kept: not ours to judge */
    CHECK(chown(path, 0, 0) == 0);
  }
  CHECK(chmod(path, 0644) == 0);
  CHECK_EQ(lookup_bytes(&k, NULL, NULL, NULL), TPURT__KCACHE_HIT);
  CHECK(chmod(path, 0666) == 0);
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_MISS);
  err = cap_end();
  CHECK(strstr(err, "writable by others") != NULL);
  CHECK(exists(path));
  /* a store replaces the refused file */
  CHECK_OK(tpurt__kcache_store(&k, p, 800, 0.1));
  CHECK(hit_equals(&k, p, 800));
  char copy[1100];
  snprintf(copy, sizeof copy, "%s.copy", path);
  CHECK(rename(path, copy) == 0 && symlink(copy, path) == 0);
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_MISS);
  err = cap_end();
  CHECK(strstr(err, "symlink") != NULL);
  CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
  cap_begin();
  CHECK_EQ(tpurt__kcache_lookup(&k, &so), TPURT__KCACHE_MISS); /* returns at once */
  err = cap_end();
  CHECK(strstr(err, "not a regular file") != NULL);
  CHECK_EQ(stats().hits, 2);
  free(p);
}

typedef struct snap {
  int n;
  char names[32][96];
  off_t size[32];
  struct timespec mtime[32];
} snap;
static void take_snap(snap *s) {
  memset(s, 0, sizeof *s);
  DIR *d = opendir(g_dir);
  struct dirent *de;
  while (d && (de = readdir(d)) && s->n < 32) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
    struct stat sb;
    lstat(p, &sb);
    snprintf(s->names[s->n], 96, "%.95s", de->d_name);
    s->size[s->n] = sb.st_size;
    s->mtime[s->n] = sb.st_mtim;
    s->n++;
  }
  if (d) closedir(d);
}
static int same_snap(const snap *a, const snap *b) {
  if (a->n != b->n) return 0;
  for (int i = 0; i < a->n; i++) {
    int found = 0;
    for (int j = 0; j < b->n; j++)
      if (!strcmp(a->names[i], b->names[j]) && a->size[i] == b->size[j] &&
          a->mtime[i].tv_sec == b->mtime[j].tv_sec && a->mtime[i].tv_nsec == b->mtime[j].tv_nsec)
        found = 1;
    if (!found) return 0;
  }
  return 1;
}

static void test_readonly(void) {
  new_case("readonly");
  tpurt__kkey a = mk_key("ro A"), b = mk_key("ro B"), c = mk_key("ro C");
  unsigned char *p = payload(2000, 4);
  CHECK_OK(tpurt__kcache_store(&a, p, 2000, 0.1));
  CHECK_OK(tpurt__kcache_store(&b, p, 2000, 0.1));
  char pb[1024];
  entry_file(&b, pb, sizeof pb);
  corrupt_file(pb, C_FLIP_PAYLOAD);
  snap before, after;
  take_snap(&before);
  setenv("TORCH_TPU_CACHE_READONLY", "1", 1);
  setenv("TORCH_TPU_CACHE_MAX_BYTES", "1K", 1);
  tpurt__kcache_reset();
  CHECK(stats().readonly);
  CHECK_EQ(stats().max_bytes, 1024);
  CHECK(hit_equals(&a, p, 2000));
  CHECK(hit_equals(&a, p, 2000));
  cap_begin();
  int r1 = tpurt__kcache_lookup(&b, &(tpurt__kcache_so){0}), r2 = tpurt__kcache_lookup(&b, &(tpurt__kcache_so){0});
  char *err = cap_end();
  CHECK_EQ(r1, TPURT__KCACHE_MISS);
  CHECK_EQ(r2, TPURT__KCACHE_MISS);
  CHECK_EQ(count_str(err, "torch_tpu: "), 1);
  CHECK(strstr(err, "read-only") != NULL);
  CHECK_EQ(stats().corrupt, 2);
  CHECK(exists(pb));
  CHECK_ST(tpurt__kcache_store(&c, p, 2000, 0.1), TPURT_ERR_NOT_SUPPORTED);
  CHECK(strstr(tpurt_last_error(), "read-only") != NULL);
  CHECK_ST(tpurt__kcache_store(&b, p, 2000, 0.1), TPURT_ERR_NOT_SUPPORTED);
  CHECK_EQ(stats().stores_skipped, 2);
  CHECK_EQ(stats().stores, 0);
  CHECK_OK(tpurt_kcache_clear());
  CHECK_EQ(stats().requests, 0);
  take_snap(&after);
  CHECK(same_snap(&before, &after)); /* nothing written, stamped, evicted or deleted */
  CHECK_EQ(after.n, 4);              /* two entries, two lock files */
  free(p);
}

static void test_eviction(void) {
  new_case("eviction");
  tpurt__kkey k[6];
  char src[6][32];
  unsigned char *p[6];
  for (int i = 0; i < 6; i++) {
    snprintf(src[i], sizeof src[i], "evict kernel %d", i);
    k[i] = mk_key(src[i]);
    p[i] = payload(4000, 50 + (unsigned)i);
  }
  CHECK_OK(tpurt__kcache_store(&k[0], p[0], 4000, 0.1));
  char path[1024];
  entry_file(&k[0], path, sizeof path);
  struct stat sb;
  CHECK(stat(path, &sb) == 0);
  char cap[32];
  snprintf(cap, sizeof cap, "%lld", (long long)(3 * sb.st_size + sb.st_size / 2)); /* three entries fit */
  setenv("TORCH_TPU_CACHE_MAX_BYTES", cap, 1);
  CHECK_OK(tpurt__kcache_store(&k[1], p[1], 4000, 0.1));
  CHECK_OK(tpurt__kcache_store(&k[2], p[2], 4000, 0.1));
  CHECK_EQ(stats().evictions, 0);
  CHECK(hit_equals(&k[0], p[0], 4000)); /* 0 is now the most recently read */
  CHECK_OK(tpurt__kcache_store(&k[3], p[3], 4000, 0.1)); /* evicts 1 */
  CHECK_EQ(stats().evictions, 1);
  CHECK_EQ(count_files(g_dir, ".tkc"), 3);
  CHECK_EQ(tpurt__kcache_lookup(&k[1], &(tpurt__kcache_so){0}), TPURT__KCACHE_MISS);
  CHECK(hit_equals(&k[2], p[2], 4000)); /* order of last reads: 0, 3, 2 */
  CHECK_OK(tpurt__kcache_store(&k[4], p[4], 4000, 0.1)); /* evicts 0 */
  CHECK_EQ(tpurt__kcache_lookup(&k[0], &(tpurt__kcache_so){0}), TPURT__KCACHE_MISS);
  CHECK(hit_equals(&k[3], p[3], 4000));
  CHECK(hit_equals(&k[2], p[2], 4000));
  CHECK(hit_equals(&k[4], p[4], 4000));
  CHECK_EQ(stats().evictions, 2);
  /* a later process sees the stamps of this one: 3, 2, 4 read in that order */
  tpurt__kcache_reset();
  CHECK_OK(tpurt__kcache_store(&k[5], p[5], 4000, 0.1)); /* evicts 3 */
  CHECK_EQ(tpurt__kcache_lookup(&k[3], &(tpurt__kcache_so){0}), TPURT__KCACHE_MISS);
  CHECK(hit_equals(&k[2], p[2], 4000) && hit_equals(&k[4], p[4], 4000) && hit_equals(&k[5], p[5], 4000));
  /* an entry larger than the cap is not stored */
  setenv("TORCH_TPU_CACHE_MAX_BYTES", "2K", 1);
  tpurt__kkey big = mk_key("big");
  CHECK_ST(tpurt__kcache_store(&big, p[0], 4000, 0.1), TPURT_ERR_NOT_SUPPORTED);
  CHECK(strstr(tpurt_last_error(), "exceeds the cap") != NULL);
  for (int i = 0; i < 6; i++) free(p[i]);
}

/* Temporaries of stores that died: named as the cache names them
 * ("<id>.tmp.<pid>.<n>", longer than an entry's name), an hour old, they go
 * at the next store; a fresh one (a store in progress) stays. Found by
 * fuzz_kcache: the scan skipped every name longer than an entry's, so no
 * stale temporary was ever removed. */
static void test_stale_temporaries(void) {
  new_case("stale_tmp");
  tpurt__kkey k = mk_key("stale tmp kernel");
  unsigned char *p = payload(100, 7);
  CHECK_OK(tpurt__kcache_store(&k, p, 100, 0.1)); /* creates the directory */
  char hex[65], stale[1024], fresh[1024];
  tpurt__kcache_key_hash(&k, hex);
  snprintf(stale, sizeof stale, "%s/%s.tmp.%d.%d", g_dir, hex, 4242, 17);
  snprintf(fresh, sizeof fresh, "%s/%s.tmp.%d.%d", g_dir, hex, 4243, 0);
  for (int i = 0; i < 2; i++) {
    int fd = open(i ? fresh : stale, O_WRONLY | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0 && write(fd, p, 100) == 100);
    close(fd);
  }
  struct timespec old[2] = {{time(NULL) - 2 * 3600, 0}, {time(NULL) - 2 * 3600, 0}};
  CHECK(utimensat(AT_FDCWD, stale, old, 0) == 0);
  tpurt__kkey k2 = mk_key("another kernel");
  CHECK_OK(tpurt__kcache_store(&k2, p, 100, 0.1)); /* its eviction scan */
  CHECK(!exists(stale));
  CHECK(exists(fresh));
  free(p);
}

static void test_full_disk(void) {
  new_case("full_disk");
  tpurt__kkey small = mk_key("small kernel"), big = mk_key("big kernel"), big2 = mk_key("big kernel 2");
  unsigned char *ps = payload(1000, 5), *pb = payload(64 * 1024, 6);
  CHECK_OK(tpurt__kcache_store(&small, ps, 1000, 0.1));
  struct rlimit old, lim;
  CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
  lim = old;
  lim.rlim_cur = 16 * 1024;
  void (*old_h)(int) = signal(SIGXFSZ, SIG_IGN);
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  cap_begin();
  tpurt_status s1 = tpurt__kcache_store(&big, pb, 64 * 1024, 0.1);
  char msg[TPURT_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", tpurt_last_error());
  tpurt_status s2 = tpurt__kcache_store(&big2, pb, 64 * 1024, 0.1);
  int hit_small = hit_equals(&small, ps, 1000); /* lookups still work */
  int r_big = tpurt__kcache_lookup(&big, &(tpurt__kcache_so){0});
  char *err = cap_end();
  CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
  signal(SIGXFSZ, old_h);
  CHECK_EQ(s1, TPURT_ERR_IO);
  CHECK_EQ(s2, TPURT_ERR_IO);
  CHECK(strstr(msg, "storing") && strstr(msg, "File too large") && strstr(msg, "RLIMIT_FSIZE"));
  CHECK_EQ(count_str(err, "torch_tpu: "), 1); /* one warning for the kind of failure */
  CHECK(hit_small);
  CHECK_EQ(r_big, TPURT__KCACHE_MISS);
  CHECK_EQ(stats().store_failures, 2);
  CHECK_EQ(count_files(g_dir, ".tmp."), 0); /* no partial entry left */
  CHECK_EQ(count_files(g_dir, ".tkc"), 1);
  /* with room again the store works */
  CHECK_OK(tpurt__kcache_store(&big, pb, 64 * 1024, 0.1));
  CHECK(hit_equals(&big, pb, 64 * 1024));
  free(ps);
  free(pb);
}

#define NTHREADS 4
#define TROUNDS 40

static void *thread_body(void *arg) {
  int id = (int)(intptr_t)arg, bad = 0;
  unsigned char *p = payload(3000, 300);
  for (int r = 0; r < TROUNDS; r++) {
    char src[32];
    snprintf(src, sizeof src, "thread kernel %d", (r + id) % 6);
    tpurt__kkey k = mk_key(src);
    int res = tpurt__kcache_lookup(&k, &(tpurt__kcache_so){0});
    if (res == TPURT__KCACHE_MISS) bad += tpurt__kcache_store(&k, p, 3000, 0.1) != TPURT_OK;
    else if (res != TPURT__KCACHE_HIT) bad++;
  }
  free(p);
  return (void *)(intptr_t)bad;
}

/* threads of one process: the counters add up */
static void test_threads(void) {
  new_case("threads");
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) CHECK(pthread_create(&t[i], NULL, thread_body, (void *)(intptr_t)i) == 0);
  for (int i = 0; i < NTHREADS; i++) {
    void *bad = NULL;
    pthread_join(t[i], &bad);
    CHECK_EQ((intptr_t)bad, 0);
  }
  tpurt_kcache_stats s = stats();
  CHECK_EQ(s.requests, NTHREADS * TROUNDS);
  CHECK_EQ(s.hits + s.misses, s.requests);
  CHECK_EQ(s.stores, s.misses);
  CHECK(s.hits >= NTHREADS * TROUNDS - 6 * NTHREADS);
  CHECK_EQ(tpurt_kcache_entry_count(), 6);
  uint64_t reads = 0;
  for (int i = 0; i < 6; i++) {
    tpurt_kcache_entry_stats e;
    CHECK_OK(tpurt_kcache_get_entry(i, &e));
    reads += e.read_count;
  }
  CHECK_EQ(reads, s.hits);
  CHECK_EQ(count_files(g_dir, ".tkc"), 6);
}

static void test_clear(void) {
  new_case("clear");
  unsigned char *p = payload(700, 7);
  for (int i = 0; i < 3; i++) {
    char src[32];
    snprintf(src, sizeof src, "clear kernel %d", i);
    tpurt__kkey k = mk_key(src);
    CHECK_OK(tpurt__kcache_store(&k, p, 700, 0.1));
    CHECK(hit_equals(&k, p, 700));
  }
  char other[700];
  snprintf(other, sizeof other, "%s/notes.txt", g_dir);
  close(open(other, O_WRONLY | O_CREAT, 0600));
  CHECK_EQ(tpurt_kcache_entry_count(), 3);
  CHECK_OK(tpurt_kcache_clear());
  CHECK_EQ(count_files(g_dir, ".tkc"), 0);
  CHECK_EQ(count_files(g_dir, ".lock"), 0);
  CHECK(exists(other)); /* not the cache's: kept */
  tpurt_kcache_stats s = stats();
  CHECK_EQ(s.requests + s.hits + s.stores + s.corrupt, 0);
  CHECK_EQ(tpurt_kcache_entry_count(), 0);
  free(p);
}

int main(void) {
  snprintf(g_base, sizeof g_base, "/tmp/tpurt-kcache-XXXXXX");
  if (!mkdtemp(g_base)) {
    perror("mkdtemp");
    return 1;
  }
  unsetenv("XDG_CACHE_HOME");
  test_sha256();
  test_store_hit();
  test_dlopen();
  test_key_mismatch();
  test_corrupt();
  test_concurrent();
  test_dir_security();
  test_readonly();
  test_eviction();
  test_stale_temporaries();
  test_full_disk();
  test_threads();
  test_clear();
  tpurt__kcache_reset();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_base);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_base);
  TEST_MAIN_END();
}
