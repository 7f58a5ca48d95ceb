/* check_child.h — a test binary running itself as a child process (one
 * kernel level per process: TORCH_TPU_ISA is read once). Include after
 * defining _GNU_SOURCE. */
#ifndef TPURT_TEST_CHECK_CHILD_H
#define TPURT_TEST_CHECK_CHILD_H
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs argv (this binary: /proc/self/exe) as a child with the env
 * assignments added (and pre(), when given, right before the exec; the
 * child exits 99 if it fails); its stdout+stderr in out (n bytes with the
 * terminating 0). The exit status, 128 when killed. */
static inline int check_run_child(char *const argv[], const char *const *env, char *out, size_t n, int (*pre)(void)) {
  int fd[2];
  if (pipe(fd)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    dup2(fd[1], 2);
    close(fd[0]);
    for (const char *const *e = env; *e; e++) putenv((char *)*e);
    if (pre && pre()) _exit(99);
    execv("/proc/self/exe", argv);
    _exit(98);
  }
  close(fd[1]);
  size_t got = 0;
  ssize_t r;
  while ((r = read(fd[0], out + got, n - 1 - got)) > 0) got += (size_t)r;
  out[got] = 0;
  close(fd[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#endif
