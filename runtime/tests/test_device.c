/* test_device.c — initialisation from the environment (one scenario per
 * ctest entry, selected by argv[1]), properties, current device, device
 * address encoding. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <unistd.h>

#include "check.h"

static uint64_t expected_total(uint64_t hbm, uint64_t limit, int ndev) {
  uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t cap = hbm < limit ? hbm : limit;
  uint64_t share = (uint64_t)(0.8 * (double)phys) / (uint64_t)ndev;
  if (share < cap) cap = share;
  return cap & ~((2ull << 20) - 1);
}

static int host_can_read(uint64_t addr) {
  int fd[2];
  if (pipe(fd)) return -1;
  ssize_t r = write(fd[1], (const void *)(uintptr_t)addr, 1); /* kernel checks, no deref here */
  int e = errno;
  close(fd[0]);
  close(fd[1]);
  return r == 1 ? 1 : (e == EFAULT ? 0 : -1);
}

static void common(int ndev) {
  CHECK_EQ(tpurt_device_count(), ndev);
  CHECK_EQ(tpurt_get_device(), 0);
  CHECK_ST(tpurt_set_device(ndev), TPURT_ERR_INVALID_DEVICE);
  CHECK_ST(tpurt_set_device(-1), TPURT_ERR_INVALID_DEVICE);
  CHECK_OK(tpurt_set_device(ndev - 1));
  CHECK_EQ(tpurt_get_device(), ndev - 1);
  CHECK_OK(tpurt_set_device(0));
  tpurt_device_props p;
  CHECK_ST(tpurt_device_get_props(ndev, &p), TPURT_ERR_INVALID_DEVICE);
  /* encoding */
  CHECK_EQ(tpurt_devptr_device(0), -1);
  CHECK_EQ(tpurt_devptr_device(0x1000), -1);
  CHECK_EQ(tpurt_devptr_device(0xE000000000000000ull), 0);
  CHECK_EQ(tpurt_devptr_device(0xE000000000000000ull + ((uint64_t)(ndev - 1) << 44) + 12345), ndev - 1);
  CHECK_EQ(tpurt_devptr_device(0xE000000000000000ull + ((uint64_t)ndev << 44)), -1);
  tpurt_devptr d;
  CHECK_OK(tpurt_malloc(ndev - 1, 1000, NULL, &d));
  CHECK_EQ(tpurt_devptr_device(d), ndev - 1);
  CHECK((d >> 60) == 0xE);
  CHECK_EQ(host_can_read(d), 0);
  int x = 0;
  CHECK_EQ(host_can_read((uint64_t)(uintptr_t)&x), 1);
  CHECK_OK(tpurt_free(d));
  CHECK_ST(tpurt_free(d), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_empty_cache(ndev - 1));
}

int main(int argc, char **argv) {
  const char *sc = argc > 1 ? argv[1] : "default";
  tpurt_device_props p;
  if (!strcmp(sc, "default")) {
    CHECK(!tpurt_is_initialized());
    CHECK_OK(tpurt_init());
    CHECK_OK(tpurt_init());
    CHECK(tpurt_is_initialized());
    common(1);
    CHECK_OK(tpurt_device_get_props(0, &p));
    CHECK_STR(p.name, "TPU v6e (emulated)");
    CHECK_STR(p.generation, "v6e");
    CHECK_EQ(p.hbm_bytes, 32ull << 30);
    CHECK_EQ(p.total_memory, expected_total(32ull << 30, UINT64_MAX, 1));
    CHECK(p.peak_bf16_flops == 918e12);
    CHECK(p.peak_int8_ops == 1836e12);
    CHECK(p.hbm_bandwidth == 1640e9);
    CHECK_EQ(p.tensor_cores, 1);
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    CHECK_EQ(p.host_threads, CPU_COUNT(&set));
    CHECK_EQ(tpurt_num_threads(), CPU_COUNT(&set));
    CHECK_EQ(tpurt_launch_blocking(), 0);
    tpurt_set_launch_blocking(1);
    CHECK_EQ(tpurt_launch_blocking(), 1);
    tpurt_set_launch_blocking(0);
    size_t fr, tot;
    CHECK_OK(tpurt_memory_get_info(0, &fr, &tot));
    CHECK_EQ(tot, p.total_memory);
    CHECK_EQ(fr, p.total_memory);
  } else if (!strcmp(sc, "v5e")) {
    CHECK_EQ(tpurt_device_count(), 4); /* lazy init */
    common(4);
    CHECK_OK(tpurt_device_get_props(3, &p));
    CHECK_STR(p.name, "TPU v5e (emulated)");
    CHECK_EQ(p.hbm_bytes, 16ull << 30);
    CHECK_EQ(p.total_memory, expected_total(16ull << 30, UINT64_MAX, 4));
    CHECK(p.peak_bf16_flops == 197e12 && p.peak_int8_ops == 394e12 && p.hbm_bandwidth == 819e9);
    CHECK_EQ(p.tensor_cores, 1);
    CHECK_EQ(p.host_threads, 3);
    CHECK_EQ(tpurt_num_threads(), 3);
    CHECK_EQ(tpurt_launch_blocking(), 1);
  } else if (!strcmp(sc, "v7x")) {
    common(2);
    CHECK_OK(tpurt_device_get_props(1, &p));
    CHECK_STR(p.name, "TPU v7x (emulated)");
    CHECK_STR(p.generation, "v7x");
    CHECK_EQ(p.hbm_bytes, 192ull << 30);
    CHECK_EQ(p.total_memory, expected_total(192ull << 30, 512ull << 20, 2));
    CHECK_EQ(p.total_memory, 512ull << 20);
    CHECK(p.peak_bf16_flops == 2307e12 && p.peak_int8_ops == 4614e12 && p.hbm_bandwidth == 7.37e12);
    CHECK_EQ(p.tensor_cores, 2);
    CHECK_EQ(tpurt_launch_blocking(), 0);
  } else if (!strcmp(sc, "bad")) {
    CHECK_ST(tpurt_init(), TPURT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tpurt_last_error(), "TPU_NUM_DEVICES") != NULL);
    CHECK(!tpurt_is_initialized());
    CHECK_EQ(tpurt_device_count(), 0);
    tpurt_devptr d;
    CHECK_ST(tpurt_malloc(0, 16, NULL, &d), TPURT_ERR_INVALID_ARGUMENT);
    setenv("TPU_NUM_DEVICES", "65", 1);
    CHECK_ST(tpurt_init(), TPURT_ERR_INVALID_ARGUMENT);
    setenv("TPU_NUM_DEVICES", "2x", 1);
    CHECK_ST(tpurt_init(), TPURT_ERR_INVALID_ARGUMENT);
    setenv("TPU_NUM_DEVICES", "3", 1);
    CHECK_ST(tpurt_init(), TPURT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tpurt_last_error(), "TORCH_TPU_EMULATE") != NULL);
    setenv("TORCH_TPU_EMULATE", "v5e", 1);
    CHECK_ST(tpurt_init(), TPURT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tpurt_last_error(), "TORCH_TPU_HBM_LIMIT") != NULL);
    setenv("TORCH_TPU_HBM_LIMIT", "64M", 1);
    setenv("TPU_NUM_THREADS", "0", 1);
    CHECK_ST(tpurt_init(), TPURT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tpurt_last_error(), "TPU_NUM_THREADS") != NULL);
    setenv("TPU_NUM_THREADS", "2", 1);
    CHECK_OK(tpurt_init());
    CHECK_EQ(tpurt_device_count(), 3);
    CHECK_OK(tpurt_device_get_props(2, &p));
    CHECK_EQ(p.total_memory, 64ull << 20);
    CHECK_STR(p.generation, "v5e");
    common(3);
  } else {
    fprintf(stderr, "unknown scenario %s\n", sc);
    return 2;
  }
  TEST_MAIN_END();
}
