/*
 * board.c — a rendezvous board in shared memory for the processes of one
 * host.
 *
 * tpu_dist checks before every collective that all ranks are calling the
 * same one (a fixed-size fingerprint each). Through the transport that is
 * a whole extra round trip (a Gloo all_gather: 1.3-1.8 ms between two
 * processes on a 2-core host, as much as a 4 KiB all_reduce itself). When
 * every rank runs on this host the fingerprints meet here instead: each
 * member writes its record of round n into its own slot, publishes the
 * round number, and reads every member's slot of the same round.
 *
 * Layout: a header, then for each member two slots (rounds alternate
 * between them). A member can be at most one round ahead of the slowest:
 * it leaves round n only once every member has posted round n, and a
 * member posts round n + 1 only after reading all of round n, so the slot
 * of round n + 2 (the same as round n's) is never written while someone
 * may still read round n there.
 *
 * Waiting: a short spin that offers the core to other threads (wait.c's;
 * the peer often arrives within microseconds), then futex waits on the slot's round word (the file is MAP_SHARED:
 * futexes work across processes) in slices, so that the deadline and the
 * peers' liveness are checked between them. Liveness: every member holds
 * an open-file-description write lock on one byte of the file (byte = its
 * rank) for as long as it lives; the kernel drops it when the process
 * exits however it ends, so F_OFD_GETLK seeing that byte unlocked (after
 * the member has joined) means the member is gone. (Classic POSIX record
 * locks would not do: a process loses them all when it closes any other
 * descriptor of the same file.)
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define BOARD_MAGIC 0x64726f6275707474ull /* "ttpubord" */
#define BOARD_DIR "/dev/shm/"
#define LINE 64
#define SPIN_NS 50000L /* spin (yielding) this long before the first futex wait */
#define SLICE_NS 2000000L /* 2 ms futex waits between deadline / liveness checks */
#define MAX_MEMBERS 65536
#define MAX_RECORD 4096

typedef struct {
  uint64_t magic, token;
  uint32_t nranks, rec_bytes;
} board_header;

typedef struct {
  _Atomic uint32_t round; /* (n >> 1) + 1 once the record of round n is written */
  _Atomic uint32_t waiters;
  _Atomic uint32_t joined; /* slot 0 of a member: it has taken its liveness lock */
} slot_head;

struct tpurt_board {
  int fd, nranks, rank;
  size_t rec_bytes, slot_bytes, map_bytes;
  unsigned char *map;
  uint64_t round; /* this member's next round */
  int broken;     /* an exchange failed: the members are out of step */
  pthread_mutex_t mu;
};

static size_t up64(size_t n) { return (n + LINE - 1) / LINE * LINE; }

/* a slot: its head's line, then the record */
static size_t slot_bytes(size_t rec_bytes) { return LINE + up64(rec_bytes); }
/* the file: the header's line, then two slots a member */
static size_t board_bytes(int nranks, size_t rec_bytes) { return LINE + (size_t)nranks * 2 * slot_bytes(rec_bytes); }

/* the board's path, from a name already checked for '/' */
typedef char board_path[TPURT_BOARD_NAME_LEN + sizeof BOARD_DIR];
static void path_of(board_path path, const char *name) { snprintf(path, sizeof(board_path), BOARD_DIR "%s", name); }

static slot_head *slot_of(const tpurt_board *b, int member, uint64_t round) {
  return (slot_head *)(b->map + LINE + ((size_t)member * 2 + (size_t)(round & 1)) * b->slot_bytes);
}

static tpurt_status check_shape(int nranks, size_t rec_bytes, int rank) {
  if (nranks < 1 || nranks > MAX_MEMBERS || rank < 0 || rank >= nranks || rec_bytes == 0 || rec_bytes > MAX_RECORD)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "board: %d members, member %d, %zu-byte records (1..%d members, 1..%d bytes)", nranks, rank,
                      rec_bytes, MAX_MEMBERS, MAX_RECORD);
  return TPURT_OK;
}

static int lock_byte(int fd, int member, int cmd, short type) {
  struct flock l;
  memset(&l, 0, sizeof l);
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = member;
  l.l_len = 1;
  if (fcntl(fd, cmd, &l) != 0) return -1;
  return cmd == F_OFD_GETLK ? l.l_type != F_UNLCK : 0;
}

/* Maps an open board file and joins it as `rank` (takes its liveness
 * lock). On failure closes fd. */
static tpurt_status attach(int fd, int nranks, size_t rec_bytes, int rank, const char *name, tpurt_board **out) {
  tpurt_board *b = calloc(1, sizeof *b);
  if (!b) {
    close(fd);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "board: out of host memory");
  }
  pthread_mutex_init(&b->mu, NULL);
  b->fd = fd;
  b->nranks = nranks;
  b->rank = rank;
  b->rec_bytes = rec_bytes;
  b->slot_bytes = slot_bytes(rec_bytes);
  b->map_bytes = board_bytes(nranks, rec_bytes);
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != b->map_bytes) {
    close(fd);
    pthread_mutex_destroy(&b->mu);
    free(b);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board %s: its size is not that of %d members of %zu bytes", name,
                      nranks, rec_bytes);
  }
  b->map = mmap(NULL, b->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (b->map == MAP_FAILED) {
    int e = errno;
    close(fd);
    pthread_mutex_destroy(&b->mu);
    free(b);
    return tpurt__err(TPURT_ERR_IO, "board %s: mmap failed: %s", name, strerror(e));
  }
  if (lock_byte(fd, rank, F_OFD_SETLK, F_WRLCK) != 0) {
    int e = errno;
    tpurt_board_close(b);
    return tpurt__err(TPURT_ERR_IO, "board %s: member %d is taken (%s)", name, rank, strerror(e));
  }
  atomic_store_explicit(&slot_of(b, rank, 0)->joined, 1, memory_order_release);
  *out = b;
  return TPURT_OK;
}

tpurt_status tpurt_board_create(int nranks, size_t rec_bytes, char name[TPURT_BOARD_NAME_LEN], uint64_t *token,
                                tpurt_board **out) {
  tpurt_status st;
  if (!name || !token || !out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board: NULL argument");
  *out = NULL;
  if ((st = check_shape(nranks, rec_bytes, 0))) return st;
  uint64_t rnd[2];
  if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
    return tpurt__err(TPURT_ERR_IO, "board: getrandom failed: %s", strerror(errno));
  snprintf(name, TPURT_BOARD_NAME_LEN, "tpu_dist-%ld-%016llx", (long)getpid(), (unsigned long long)rnd[0]);
  board_path path;
  path_of(path, name);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return tpurt__err(TPURT_ERR_IO, "board: cannot create %s: %s", path, strerror(errno));
  size_t bytes = board_bytes(nranks, rec_bytes);
  board_header h = {BOARD_MAGIC, rnd[1], (uint32_t)nranks, (uint32_t)rec_bytes};
  /* the file reads as zeros (every round word "nothing posted") but for
   * the header, written before anyone can know the name */
  if (ftruncate(fd, (off_t)bytes) != 0 || pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
    int e = errno;
    close(fd);
    unlink(path);
    return tpurt__err(TPURT_ERR_IO, "board: cannot size %s: %s", path, strerror(e));
  }
  if ((st = attach(fd, nranks, rec_bytes, 0, name, out))) {
    unlink(path);
    return st;
  }
  *token = rnd[1];
  return TPURT_OK;
}

tpurt_status tpurt_board_open(const char *name, uint64_t token, int nranks, size_t rec_bytes, int rank,
                              tpurt_board **out) {
  tpurt_status st;
  if (!name || !out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board: NULL argument");
  *out = NULL;
  if ((st = check_shape(nranks, rec_bytes, rank))) return st;
  if (!*name || strchr(name, '/') || strlen(name) >= TPURT_BOARD_NAME_LEN)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board: bad name \"%s\"", name);
  board_path path;
  path_of(path, name);
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return tpurt__err(TPURT_ERR_IO, "board: cannot open %s: %s", path, strerror(errno));
  board_header h;
  if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != BOARD_MAGIC || h.token != token ||
      h.nranks != (uint32_t)nranks || h.rec_bytes != (uint32_t)rec_bytes) {
    close(fd);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board: %s is not the board announced (token or shape differ)",
                      path);
  }
  return attach(fd, nranks, rec_bytes, rank, name, out);
}

tpurt_status tpurt_board_unlink(const char *name) {
  if (!name || !*name || strchr(name, '/')) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board: bad name");
  board_path path;
  path_of(path, name);
  if (unlink(path) != 0 && errno != ENOENT)
    return tpurt__err(TPURT_ERR_IO, "board: cannot remove %s: %s", path, strerror(errno));
  return TPURT_OK;
}

void tpurt_board_close(tpurt_board *b) {
  if (!b) return;
  if (b->map && b->map != MAP_FAILED) munmap(b->map, b->map_bytes);
  close(b->fd); /* drops the liveness lock */
  pthread_mutex_destroy(&b->mu);
  free(b);
}

static void publish(slot_head *s, uint32_t v) {
  atomic_store_explicit(&s->round, v, memory_order_seq_cst);
  if (atomic_load_explicit(&s->waiters, memory_order_seq_cst))
    syscall(SYS_futex, (uint32_t *)&s->round, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

typedef struct {
  slot_head *s;
  uint32_t want;
} posted_ctx;
static int posted(void *p) {
  const posted_ctx *c = p;
  return atomic_load_explicit(&c->s->round, memory_order_acquire) == c->want;
}

/* Waits until member m's slot shows `want`: 0, or -1 past the deadline,
 * -2 when m's process is gone. */
static int await(tpurt_board *b, int m, slot_head *s, uint32_t want, int64_t deadline) {
  posted_ctx c = {s, want};
  if (tpurt__spin_for(posted, &c, SPIN_NS)) return 0;
  for (;;) {
    uint32_t seen = atomic_load_explicit(&s->round, memory_order_acquire);
    if (seen == want) return 0;
    int64_t left = deadline - tpurt__now_ns();
    if (left <= 0) return -1;
    if (atomic_load_explicit(&slot_of(b, m, 0)->joined, memory_order_acquire) &&
        lock_byte(b->fd, m, F_OFD_GETLK, F_WRLCK) == 0) {
      /* joined and unlocked: gone, unless it posted just before exiting */
      return posted(&c) ? 0 : -2;
    }
    struct timespec ts = {0, left < SLICE_NS ? left : SLICE_NS};
    atomic_fetch_add_explicit(&s->waiters, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&s->round, memory_order_seq_cst) == seen)
      syscall(SYS_futex, (uint32_t *)&s->round, FUTEX_WAIT, seen, &ts, NULL, 0);
    atomic_fetch_sub_explicit(&s->waiters, 1, memory_order_seq_cst);
  }
}

tpurt_status tpurt_board_exchange(tpurt_board *b, const void *mine, void *all, int64_t timeout_ms) {
  if (!b || !mine || !all) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "board: NULL argument");
  pthread_mutex_lock(&b->mu);
  tpurt_status st = TPURT_OK;
  if (b->broken) {
    st = tpurt__err(TPURT_ERR_PEER_LOST, "board: an earlier exchange failed; the members are out of step");
    goto out;
  }
  uint64_t n = b->round;
  uint32_t want = (uint32_t)((n >> 1) + 1);
  slot_head *me = slot_of(b, b->rank, n);
  memcpy((unsigned char *)(me) + LINE, mine, b->rec_bytes);
  publish(me, want);
  int64_t deadline = tpurt__now_ns() + (timeout_ms > 0 ? timeout_ms : 0) * 1000000;
  for (int m = 0; m < b->nranks; m++) {
    slot_head *s = slot_of(b, m, n);
    int w = m == b->rank ? 0 : await(b, m, s, want, deadline);
    if (w == -1) {
      b->broken = 1;
      st = tpurt__err(TPURT_ERR_TIMEOUT, "rank %d did not arrive within the timeout of %lld ms", m,
                      (long long)timeout_ms);
      goto out;
    }
    if (w == -2) {
      b->broken = 1;
      st = tpurt__err(TPURT_ERR_PEER_LOST, "rank %d has exited (its process is gone)", m);
      goto out;
    }
    memcpy((unsigned char *)all + (size_t)m * b->rec_bytes, (unsigned char *)(s) + LINE, b->rec_bytes);
  }
  b->round = n + 1;
out:
  pthread_mutex_unlock(&b->mu);
  return st;
}
