/* fuzz_main.h — the replay driver of the coverage-guided fuzz harnesses
 * (runtime/tests/fuzz_*.c).
 *
 * Each harness defines LLVMFuzzerTestOneInput. Built with clang
 * -fsanitize=fuzzer (make fuzz-c) libFuzzer provides main(); in every other
 * build (TPURT_FUZZ_REPLAY) this main() runs the harness on each file of the
 * directories or files given on the command line — the seed corpus and every
 * input that once crashed (runtime/tests/fuzz_corpus/NAME/), so that ctest
 * replays them as regression tests under the release and sanitizer builds. */
#ifndef TPURT_FUZZ_MAIN_H
#define TPURT_FUZZ_MAIN_H
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The harnesses' reader of their input: bytes in order, zeros once it is used up. */
typedef struct {
  const uint8_t *p;
  size_t n;
} rd;

static inline uint8_t u8(rd *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}
static inline uint64_t u64(rd *r) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | u8(r);
  return v;
}

#ifdef TPURT_FUZZ_REPLAY
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fuzz_replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
  fclose(f);
  if (!buf || got != (size_t)n) {
    free(buf);
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0, errors = 0;
  for (int a = 1; a < argc; a++) {
    struct stat st;
    if (stat(argv[a], &st) != 0) {
      fprintf(stderr, "no such corpus: %s\n", argv[a]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      errors += fuzz_replay_file(argv[a]);
      files++;
      continue;
    }
    DIR *d = opendir(argv[a]);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
      errors += fuzz_replay_file(path);
      files++;
    }
    if (d) closedir(d);
  }
  printf("replayed %d inputs\n", files);
  return errors || files == 0;
}
#endif
#endif
