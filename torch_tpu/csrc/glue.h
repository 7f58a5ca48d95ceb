// Shared declarations of the C++ glue: status -> PyTorch exception mapping,
// tensor -> tpurt_view adaptation and accessors for the registered pieces
// (allocator, streams, generators). No algorithms live in the glue: every
// computation is a call into the C runtime (runtime/include/tpurt.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <string>

#include "tpurt.h"

namespace torch_tpu {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// Raises the PyTorch exception matching a runtime status, with the
// runtime's message. `what` names the operation ("copy_", "empty", ...).
[[noreturn]] void raise_status(tpurt_status s, const char* what);
inline void check(tpurt_status s, const char* what) {
  if (s != TPURT_OK) raise_status(s, what);
}

// Initializes the runtime (lazily, once) and validates a device index.
void ensure_initialized();
int device_count();
// Resolves -1 to the current device and validates the range.
c10::DeviceIndex checked_index(c10::DeviceIndex index);

// Runtime stream for a c10::Stream / the current stream of a device.
tpurt_stream* to_runtime(const c10::Stream& s);
tpurt_stream* current_stream(c10::DeviceIndex index);
c10::Stream to_c10(tpurt_stream* s);

// dtype mapping; raises NotImplementedError for dtypes the device lacks.
tpurt_dtype to_runtime(at::ScalarType t);
bool has_runtime_dtype(at::ScalarType t);
// View of a tpu tensor's elements (pointer includes the storage offset).
tpurt_view view_of(const at::Tensor& t);
tpurt_view view_of(const at::Tensor& t, at::ScalarType as);
tpurt_scalar to_runtime(const c10::Scalar& s);

// The device allocator (also registered with c10 for PrivateUse1).
c10::DeviceAllocator* device_allocator();
// Pinned host allocator.
c10::Allocator* host_allocator();

// Grows a tpu storage to new_bytes, preserving its contents.
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);

// Default generator of a device.
const at::Generator& default_generator(c10::DeviceIndex index);
// Philox state of a tpu generator (hold g.mutex() while reserving offsets).
tpurt_generator* generator_state(const at::Generator& g);

// CPU fallback switch and per-op counters (aten_ops.cpp).
void set_cpu_fallback(bool on);
bool cpu_fallback_enabled();
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void reset_fallback_counts();

// Precision of f32 matmuls/convolutions (aten_matmul.cpp): -1 follows
// torch.get_float32_matmul_precision(), else a tpurt_precision value.
void set_matmul_precision(int p);
int matmul_precision();
// The precision f32 matmuls, convolutions and attention use now.
tpurt_precision effective_matmul_precision();

}  // namespace torch_tpu
