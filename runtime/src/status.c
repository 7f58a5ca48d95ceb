/*
 * status.c — thread-local last-error message, status names, version, and
 * PyTorch-style size formatting used in messages.
 */
#include <stdio.h>

#include "internal.h"

static _Thread_local char t_last_error[TPURT_ERRMSG_LEN];

const char *tpurt_last_error(void) { return t_last_error; }

tpurt_status tpurt__err_str(tpurt_status st, const char *msg) {
  snprintf(t_last_error, sizeof t_last_error, "%s", msg ? msg : "");
  return st;
}

tpurt_status tpurt__err(tpurt_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
  va_end(ap);
  return st;
}

const char *tpurt_status_name(tpurt_status s) {
  switch (s) {
    case TPURT_OK: return "TPURT_OK";
    case TPURT_ERR_INVALID_ARGUMENT: return "TPURT_ERR_INVALID_ARGUMENT";
    case TPURT_ERR_INVALID_DEVICE: return "TPURT_ERR_INVALID_DEVICE";
    case TPURT_ERR_OUT_OF_MEMORY: return "TPURT_ERR_OUT_OF_MEMORY";
    case TPURT_ERR_NOT_SUPPORTED: return "TPURT_ERR_NOT_SUPPORTED";
    case TPURT_ERR_KERNEL: return "TPURT_ERR_KERNEL";
    case TPURT_ERR_INDEX: return "TPURT_ERR_INDEX";
    case TPURT_ERR_INTERNAL: return "TPURT_ERR_INTERNAL";
    case TPURT_ERR_IO: return "TPURT_ERR_IO";
    case TPURT_ERR_TIMEOUT: return "TPURT_ERR_TIMEOUT";
    case TPURT_ERR_PEER_LOST: return "TPURT_ERR_PEER_LOST";
  }
  return "TPURT_ERR_UNKNOWN";
}

int tpurt_api_version(void) { return TPURT_API_VERSION; }

const char *tpurt_version_string(void) { return "tpurt 0.1.0"; }

void tpurt__format_size(uint64_t size, char *buf, size_t len) {
  if (size <= 1024)
    snprintf(buf, len, "%llu bytes", (unsigned long long)size);
  else if (size <= 1048576ull)
    snprintf(buf, len, "%.2f KiB", (double)size / 1024.0);
  else if (size <= 1073741824ull)
    snprintf(buf, len, "%.2f MiB", (double)size / 1048576.0);
  else
    snprintf(buf, len, "%.2f GiB", (double)size / 1073741824.0);
}
