/* test_status.c — status names, version, last-error behaviour. */
#include "check.h"

int main(void) {
  CHECK_STR(tpurt_last_error(), "");
  CHECK_STR(tpurt_status_name(TPURT_OK), "TPURT_OK");
  CHECK_STR(tpurt_status_name(TPURT_ERR_OUT_OF_MEMORY), "TPURT_ERR_OUT_OF_MEMORY");
  CHECK_STR(tpurt_status_name((tpurt_status)99), "TPURT_ERR_UNKNOWN");
  CHECK_EQ(tpurt_api_version(), TPURT_API_VERSION);
  CHECK(strlen(tpurt_version_string()) > 0);
  CHECK_ST(tpurt_set_device(5), TPURT_ERR_INVALID_DEVICE);
  CHECK(strstr(tpurt_last_error(), "invalid device index 5") != NULL);
  CHECK_ST(tpurt_free(0x1234), TPURT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tpurt_last_error(), "not a TPU device address") != NULL);
  TEST_MAIN_END();
}
