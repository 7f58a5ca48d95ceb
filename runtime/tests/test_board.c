/* test_board.c — the shared-memory rendezvous board: members in separate
 * processes exchange records round after round (every record of every
 * round seen by everyone), a wrong token / shape / taken member is
 * refused, a member that never arrives times out, a member that exits is
 * reported as lost, and a failed board refuses further rounds. */
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define REC 24
#define ROUNDS 3000

typedef struct {
  int64_t rank, round, mix;
} rec;

/* Exchanges ROUNDS rounds as `rank` of n; returns the failures. */
static int run_member(tpurt_board *b, int rank, int n) {
  rec all[8], mine;
  for (int64_t r = 0; r < ROUNDS; r++) {
    mine = (rec){rank, r, rank * 1000003 + r * 7};
    CHECK_OK(tpurt_board_exchange(b, &mine, all, 20000));
    for (int m = 0; m < n; m++)
      if (all[m].rank != m || all[m].round != r || all[m].mix != m * 1000003 + r * 7) {
        fprintf(stderr, "member %d round %lld: record of %d is (%lld, %lld)\n", rank, (long long)r, m,
                (long long)all[m].rank, (long long)all[m].round);
        g_failures++;
        return g_failures;
      }
  }
  return g_failures;
}

static int wait_child(pid_t p) {
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

int main(void) {
  char name[TPURT_BOARD_NAME_LEN];
  uint64_t token = 0;
  tpurt_board *b = NULL, *c = NULL;

  /* bad arguments */
  CHECK_ST(tpurt_board_create(0, REC, name, &token, &b), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_board_create(2, 0, name, &token, &b), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_board_create(2, 5000, name, &token, &b), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_board_open("../etc/passwd", 1, 2, REC, 1, &b), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_board_open("tpu_dist-none", 1, 2, REC, 1, &b), TPURT_ERR_IO);
  CHECK_ST(tpurt_board_exchange(NULL, name, name, 1), TPURT_ERR_INVALID_ARGUMENT);

  /* three members in three processes, many rounds (members run up to a
   * round apart: the slots alternate) */
  CHECK_OK(tpurt_board_create(3, REC, name, &token, &b));
  CHECK(strncmp(name, "tpu_dist-", 9) == 0);
  CHECK_ST(tpurt_board_open(name, token + 1, 3, REC, 1, &c), TPURT_ERR_INVALID_ARGUMENT); /* wrong token */
  CHECK_ST(tpurt_board_open(name, token, 2, REC, 1, &c), TPURT_ERR_INVALID_ARGUMENT);     /* wrong shape */
  CHECK_ST(tpurt_board_open(name, token, 3, REC, 3, &c), TPURT_ERR_INVALID_ARGUMENT);     /* no such member */
  pid_t kids[2];
  for (int k = 0; k < 2; k++) {
    kids[k] = fork();
    if (kids[k] == 0) {
      tpurt_board *m = NULL;
      CHECK_OK(tpurt_board_open(name, token, 3, REC, k + 1, &m));
      if (!m) _exit(1);
      if (k == 0) { /* member 1 is taken: no one else joins as it */
        tpurt_board *x = NULL;
        CHECK_ST(tpurt_board_open(name, token, 3, REC, 1, &x), TPURT_ERR_IO);
      }
      run_member(m, k + 1, 3);
      tpurt_board_close(m);
      _exit(g_failures ? 1 : 0);
    }
  }
  run_member(b, 0, 3);
  CHECK_OK(tpurt_board_unlink(name)); /* everyone has it open: still works */
  for (int k = 0; k < 2; k++) CHECK_EQ(wait_child(kids[k]), 0);
  tpurt_board_close(b);
  CHECK_ST(tpurt_board_open(name, token, 3, REC, 1, &c), TPURT_ERR_IO); /* gone */

  /* a member that never arrives: timeout, then the board refuses */
  CHECK_OK(tpurt_board_create(2, REC, name, &token, &b));
  int up[2], down[2]; /* child -> parent "joined", parent -> child "done" */
  CHECK(pipe(up) == 0 && pipe(down) == 0);
  pid_t late = fork();
  if (late == 0) {
    tpurt_board *m = NULL;
    CHECK_OK(tpurt_board_open(name, token, 2, REC, 1, &m));
    char x = 'r';
    CHECK(write(up[1], &x, 1) == 1);
    CHECK(read(down[0], &x, 1) >= 0); /* blocks until the parent is done (or exits) */
    _exit(0);
  }
  char x;
  CHECK(read(up[0], &x, 1) == 1);
  rec r0 = {0, 0, 0}, got[2];
  CHECK_ST(tpurt_board_exchange(b, &r0, got, 50), TPURT_ERR_TIMEOUT);
  CHECK(strstr(tpurt_last_error(), "rank 1") != NULL);
  CHECK_ST(tpurt_board_exchange(b, &r0, got, 50), TPURT_ERR_PEER_LOST);
  CHECK(write(down[1], &x, 1) == 1);
  CHECK_EQ(wait_child(late), 0);
  tpurt_board_close(b);
  tpurt_board_unlink(name);

  /* a member that exits: reported as lost long before the timeout */
  CHECK_OK(tpurt_board_create(2, REC, name, &token, &b));
  pid_t gone = fork();
  if (gone == 0) {
    tpurt_board *m = NULL;
    CHECK_OK(tpurt_board_open(name, token, 2, REC, 1, &m));
    rec r = {1, 0, 1000003}, a[2];
    CHECK_OK(tpurt_board_exchange(m, &r, a, 20000));
    _exit(g_failures ? 1 : 0); /* exits holding the board */
  }
  CHECK_OK(tpurt_board_exchange(b, &r0, got, 20000));
  CHECK_EQ(got[1].rank, 1);
  CHECK_EQ(wait_child(gone), 0);
  r0.round = 1;
  CHECK_ST(tpurt_board_exchange(b, &r0, got, 600000), TPURT_ERR_PEER_LOST);
  CHECK(strstr(tpurt_last_error(), "rank 1 has exited") != NULL);
  tpurt_board_close(b);
  tpurt_board_unlink(name);

  if (g_failures) {
    fprintf(stderr, "%d failures\n", g_failures);
    return 1;
  }
  printf("board ok\n");
  return 0;
}
