// Python bindings of the glue: the `torch_tpu._C` extension module. Only
// what the Python device module needs that PyTorch's generic APIs
// (torch.accelerator, torch.Stream, torch.Event) do not already reach.
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include "glue.h"

namespace torch_tpu {
namespace {

py::dict device_props(int index) {
  tpurt_device_props p;
  check(tpurt_device_get_props(checked_index(static_cast<c10::DeviceIndex>(index)), &p), "get_device_properties");
  py::dict d;
  d["name"] = std::string(p.name);
  d["generation"] = std::string(p.generation);
  d["hbm_bytes"] = p.hbm_bytes;
  d["total_memory"] = p.total_memory;
  d["peak_bf16_flops"] = p.peak_bf16_flops;
  d["peak_int8_ops"] = p.peak_int8_ops;
  d["hbm_bandwidth"] = p.hbm_bandwidth;
  d["tensor_cores"] = p.tensor_cores;
  d["host_threads"] = p.host_threads;
  return d;
}

py::dict host_stats() {
  tpurt_host_stats s;
  tpurt_host_get_stats(&s);
  auto stat = [](const tpurt_stat& x) {
    py::dict d;
    d["current"] = x.current;
    d["peak"] = x.peak;
    d["allocated"] = x.allocated;
    d["freed"] = x.freed;
    return d;
  };
  py::dict d;
  d["allocation"] = stat(s.allocation);
  d["allocated_bytes"] = stat(s.allocated_bytes);
  d["reserved_bytes"] = stat(s.reserved_bytes);
  return d;
}

// A device operation that fails with the given message when the stream
// reaches it: exercises asynchronous error reporting end to end (tests and
// `torch-tpu doctor`).
tpurt_status failing_kernel(void* args, char* err, size_t errlen) {
  std::snprintf(err, errlen, "%s", static_cast<const char*>(args));
  return TPURT_ERR_KERNEL;
}

void debug_launch_error(const std::string& message) {
  c10::DeviceIndex dev = checked_index(-1);
  check(tpurt_launch(current_stream(dev), "debug_error", &failing_kernel, message.c_str(), message.size() + 1),
        "debug_error");
}

}  // namespace
}  // namespace torch_tpu

PYBIND11_MODULE(_C, m) {
  using namespace torch_tpu;
  m.doc() = "torch_tpu native glue (C++ adapter over the tpurt C runtime)";
  m.def("_init", [] { ensure_initialized(); });
  m.def("_in_bad_fork", [] { return static_cast<bool>(tpurt_in_bad_fork()); });
  m.def("_is_initialized", [] { return static_cast<bool>(tpurt_is_initialized()); });
  m.def("_device_count", [] { return device_count(); });
  m.def("_get_device", [] {
    ensure_initialized();
    return tpurt_get_device();
  });
  m.def("_set_device", [](int index) {
    check(tpurt_set_device(checked_index(static_cast<c10::DeviceIndex>(index))), "set_device");
  });
  m.def("_synchronize", [](int index) {
    py::gil_scoped_release nogil;
    check(tpurt_device_synchronize(checked_index(static_cast<c10::DeviceIndex>(index))), "synchronize");
  });
  m.def("_device_properties", &device_props);
  m.def("_default_generator", [](int index) {
    const at::Generator& g = default_generator(static_cast<c10::DeviceIndex>(index));
    return py::reinterpret_steal<py::object>(py::handle(THPGenerator_initDefaultGenerator(g)));
  });
  m.def("_set_cpu_fallback", &set_cpu_fallback);
  m.def("_cpu_fallback_enabled", &cpu_fallback_enabled);
  m.def("_fallback_counts", [] {
    py::dict d;
    for (const auto& kv : fallback_counts()) d[py::str(kv.first)] = kv.second;
    return d;
  });
  m.def("_reset_fallback_counts", &reset_fallback_counts);
  m.def("_launch_blocking", [] {
    ensure_initialized();
    return static_cast<bool>(tpurt_launch_blocking());
  });
  m.def("_set_launch_blocking", [](bool on) {
    ensure_initialized();
    tpurt_set_launch_blocking(on ? 1 : 0);
  });
  m.def("_host_memory_stats", &host_stats);
  m.def("_host_empty_cache", [] { check(tpurt_host_empty_cache(), "empty_host_cache"); });
  m.def("_debug_launch_error", &debug_launch_error);
  m.def("_runtime_version", [] { return std::string(tpurt_version_string()); });
  m.def("_set_matmul_precision", &set_matmul_precision);
  m.def("_matmul_precision", &matmul_precision);
  m.def("_gemm_library", [] { return std::string(tpurt_gemm_library()); });
  m.attr("_api_version") = TPURT_API_VERSION;
}
