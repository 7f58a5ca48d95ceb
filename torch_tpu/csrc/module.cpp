// Python bindings of the glue: the `torch_tpu._C` extension module. Only
// what the Python device module needs that PyTorch's generic APIs
// (torch.accelerator, torch.Stream, torch.Event) do not already reach.
#include <vector>
#include <ATen/record_function.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <unistd.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "glue.h"
#include "tpurt_replay.h"

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

py::dict cpu_info() {
  const tpurt_cpu_info* c = tpurt_cpu_get_info();
  py::dict d;
  d["vendor"] = std::string(c->vendor);
  d["model"] = std::string(c->model);
  py::dict f;
  f["avx2"] = c->avx2 && c->fma;
  f["avx512"] = c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq;
  f["avx512_bf16"] = static_cast<bool>(c->avx512_bf16);
  f["avx512_fp16"] = static_cast<bool>(c->avx512_fp16);
  f["amx_tile"] = static_cast<bool>(c->amx_tile);
  f["amx_bf16"] = static_cast<bool>(c->amx_bf16);
  f["amx_int8"] = static_cast<bool>(c->amx_int8);
  f["amx_usable"] = static_cast<bool>(c->amx_usable);
  d["features"] = f;
  d["amx_note"] = std::string(c->amx_note);
  d["l1d_bytes"] = c->l1d_bytes;
  d["l2_bytes"] = c->l2_bytes;
  d["l3_bytes"] = c->l3_bytes;
  static const char* names[] = {"scalar", "avx2", "avx512", "amx"};
  d["host_isa"] = std::string(names[c->host_isa & 3]);
  d["isa"] = std::string(c->isa_name);
  d["build"] = std::string(c->build);
  d["bf16_matmul"] = std::string(tpurt_bf16_gemm_path());
  d["bf16_conv"] = std::string(tpurt_bf16_conv_path());
  d["gemm_library"] = std::string(tpurt_gemm_library());
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

// ---------------------------------------------------------- DeferAndFuse
// The runtime asks for the user's source line of each recorded op (error
// attribution) and of each cut (the flush log); a cut made by a host copy
// inside print/repr or torch.save is refined to that reason.

std::string g_skip_prefix[2];   // torch's and torch_tpu's package folders
bool g_node_sites = true;       // TORCH_TPU_DEFER_SITES=0 turns per-op lines off
std::mutex g_site_mu;
std::unordered_map<std::string, std::unique_ptr<std::string>> g_sites;

const char* intern_site(const std::string& s) {
  std::lock_guard<std::mutex> lock(g_site_mu);
  auto it = g_sites.find(s);
  if (it != g_sites.end()) return it->second->c_str();
  auto owned = std::make_unique<std::string>(s);
  const char* p = owned->c_str();
  g_sites.emplace(s, std::move(owned));
  return p;
}

bool starts_with(const char* s, const std::string& prefix) {
  return !prefix.empty() && std::strncmp(s, prefix.c_str(), prefix.size()) == 0;
}
bool ends_with(const char* s, const char* suffix) {
  size_t n = std::strlen(s), m = std::strlen(suffix);
  return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

// Per-op lines come from a direct-mapped cache keyed by (code object,
// instruction offset): a recorded op costs a frame walk and one compare per
// frame, not a line-table decode, a string and a map lookup. Entries hold a
// reference to their code object, so a key never names a freed one. The GIL
// guards the cache.
struct SiteEntry {
  PyCodeObject* code = nullptr;
  int lasti = -1;
  bool library = false;
  const char* site = nullptr;
};
constexpr size_t kSiteCacheSize = 4096;
SiteEntry g_site_cache[kSiteCacheSize];

bool is_library(const char* file) {
  return !file || starts_with(file, g_skip_prefix[0]) || starts_with(file, g_skip_prefix[1]);
}

const SiteEntry& frame_site(PyFrameObject* f, PyCodeObject* code) {
  int lasti = PyFrame_GetLasti(f);
  size_t h = ((reinterpret_cast<uintptr_t>(code) >> 4) ^ static_cast<size_t>(lasti) * 0x9E3779B97F4A7C15ull) %
             kSiteCacheSize;
  SiteEntry& e = g_site_cache[h];
  if (e.code == code && e.lasti == lasti) return e;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  bool library = is_library(file);
  const char* site =
      library ? nullptr : intern_site(std::string(file) + ":" + std::to_string(PyFrame_GetLineNumber(f)));
  Py_INCREF(code);
  Py_XDECREF(e.code);
  e.code = code;
  e.lasti = lasti;
  e.library = library;
  e.site = site;
  return e;
}

// Inside a compiled call (torch_tpu/compiler.py) every op of the graph is
// recorded at one user line, the innermost user frame when the call starts
// (the compiled function's own frame, which Dynamo runs it in): the graph's
// generated code names no line of the user's, and walking the frames for
// each op was ~8 % of a compiled decode step's host time.
thread_local int t_site_hold = 0;
thread_local const char* t_held_site = nullptr;

const char* site_fn(tpurt_flush_reason* reason) {
  if (!reason && t_site_hold) return t_held_site;
  if (!reason && !g_node_sites) return nullptr;
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return nullptr;
  PyGILState_STATE gil = PyGILState_Ensure();
  const char* out = nullptr;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);
    if (reason && (*reason == TPURT_FLUSH_TO_HOST || *reason == TPURT_FLUSH_ITEM)) {
      const char* file = PyUnicode_AsUTF8(code->co_filename);
      if (file && ends_with(file, "torch/_tensor_str.py"))
        *reason = TPURT_FLUSH_PRINT;
      else if (file && ends_with(file, "torch/serialization.py"))
        *reason = TPURT_FLUSH_SAVE;
    }
    const SiteEntry& e = frame_site(f, code);
    Py_DECREF(code);
    if (!e.library) {
      out = e.site;
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  if (PyErr_Occurred()) PyErr_Clear();
  PyGILState_Release(gil);
  return out;
}

// The innermost frame outside torch and torch_tpu as "file:line" (or
// nullptr), whatever the held site or TORCH_TPU_DEFER_SITES: site_fn with a
// reason always walks the frames.
const char* user_site() {
  tpurt_flush_reason r = TPURT_FLUSH_EXPLICIT;
  return site_fn(&r);
}

void install_site_fn(const std::string& torch_dir, const std::string& tpu_dir, bool node_sites) {
  for (SiteEntry& e : g_site_cache) {  // library flags depend on the prefixes
    Py_XDECREF(e.code);
    e = SiteEntry{};
  }
  g_skip_prefix[0] = torch_dir;
  g_skip_prefix[1] = tpu_dir;
  g_node_sites = node_sites;
  tpurt_defer_set_site_fn(&site_fn);
}

py::dict defer_stats() {
  tpurt_defer_stats s;
  tpurt_defer_get_stats(&s);
  py::dict flushes;
  for (int r = 0; r < TPURT_FLUSH_NUM_REASONS; r++)
    flushes[tpurt_flush_reason_name(static_cast<tpurt_flush_reason>(r))] = s.flushes[r];
  py::dict d;
  d["flushes"] = flushes;
  d["graphs_built"] = s.graphs_built;
  d["cache_hits"] = s.cache_hits;
  d["cached_graphs"] = s.cached_plans;
  d["ops_recorded"] = s.ops_recorded;
  d["kernels_launched"] = s.kernels_launched;
  d["fused_kernels"] = s.fused_kernels;
  d["ops_fused"] = s.ops_fused;
  d["ops_eliminated"] = s.ops_eliminated;
  d["stores_eliminated"] = s.stores_eliminated;
  d["bytes_materialized"] = s.bytes_materialized;
  d["bytes_never_materialized"] = s.bytes_never_materialized;
  d["values_recomputed"] = s.values_recomputed;
  d["early_steps"] = s.early_steps;
  d["early_graphs"] = s.early_graphs;
  d["early_discarded"] = s.early_discarded;
  d["bytes_recomputed"] = s.bytes_recomputed;
  d["codegen_kernels"] = s.codegen_kernels;
  d["codegen_failures"] = s.codegen_failures;
  d["codegen_not_generated"] = s.codegen_not_generated;
  d["codegen_launches_compiled"] = s.codegen_launches_compiled;
  d["codegen_launches_interpreted"] = s.codegen_launches_interpreted;
  d["codegen_compile_seconds"] = s.codegen_compile_seconds;
  py::list recent;
  tpurt_flush_record r;
  for (int i = 0; tpurt_defer_get_flush(i, &r); i++) {
    py::dict e;
    e["reason"] = std::string(tpurt_flush_reason_name(r.reason));
    e["site"] = std::string(r.site ? r.site : "");
    e["ops"] = r.ops;
    e["kernels"] = r.kernels;
    e["cache_hit"] = static_cast<bool>(r.cache_hit);
    recent.append(e);
  }
  d["recent_flushes"] = recent;
  return d;
}

// torch.tpu._get_cache_stats(): the kernel cache's counters under TorchTPU's
// names, per_entry_stats keyed by entry id (the key's SHA-256).
py::dict kcache_stats() {
  tpurt_kcache_stats s;
  check(tpurt_kcache_get_stats(&s), "_get_cache_stats");
  py::dict d;
  d["num_cache_reqs"] = s.requests;
  d["num_cache_hits"] = s.hits;
  d["num_cache_misses"] = s.misses;
  d["num_cache_refused"] = s.refused;
  d["num_cache_corrupt"] = s.corrupt;
  d["num_cache_stores"] = s.stores;
  d["num_cache_stores_skipped"] = s.stores_skipped;
  d["num_cache_store_failures"] = s.store_failures;
  d["num_cache_evictions"] = s.evictions;
  d["max_bytes"] = s.max_bytes;
  d["readonly"] = static_cast<bool>(s.readonly);
  py::dict per;
  tpurt_kcache_entry_stats e;
  for (int i = 0; tpurt_kcache_get_entry(i, &e) == TPURT_OK; i++) {
    py::dict x;
    x["read_count"] = e.read_count;
    x["compile_duration"] = e.compile_seconds;
    x["last_read"] = e.read_count ? py::object(py::float_(e.last_read)) : py::object(py::none());
    per[py::str(e.key_hash)] = x;
  }
  d["per_entry_stats"] = per;
  return d;
}

// The runtime's trace ring (tpurt_trace_*) as tuples for torch_tpu.profiler:
// (kind, ts_ns, dur_ns, name, site, dev, stream, seq, corr, a, b, tid).
py::tuple trace_read() {
  size_t n = tpurt_trace_count();
  std::vector<tpurt_trace_event> ev(n);
  uint64_t dropped = 0;
  n = tpurt_trace_read(ev.data(), n, &dropped);
  py::list out;
  for (size_t i = 0; i < n; i++) {
    const tpurt_trace_event &e = ev[i];
    out.append(py::make_tuple(e.kind, e.ts_ns, e.dur_ns, e.name ? py::object(py::str(e.name)) : py::object(py::none()),
                              e.site ? py::object(py::str(e.site)) : py::object(py::none()), e.dev, e.stream, e.seq,
                              e.corr, e.a, e.b, e.tid));
  }
  return py::make_tuple(out, dropped);
}


// ------------------------------------------------------------ host ops
// torch_tpu.profiler's host op spans: a global RecordFunction callback
// (ATen/record_function.h) sees every operator the dispatcher runs, in eager
// code and in the ops a torch.compile'd call records alike (a Python
// dispatch mode would make Dynamo run the function eagerly). An op is kept
// when it touches the device: a tpu tensor among its inputs or outputs, or a
// tpu device argument (factories); tensors of tracing (fake, functional
// wrappers: the Python or Functionalize key) are not the device's. While an
// op runs, the runtime's launches carry its id (the trace ring's corr), so
// each kernel names the innermost op that launched it. Off: no callback is
// registered, so the dispatch path pays nothing.
struct HostArg {  // an op's argument or result, as Python reads it back
  enum Kind : uint8_t { NONE, TENSOR, LIST, INT, DOUBLE, BOOL, STR, INTS, DOUBLES, OTHER } kind = NONE;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool tpu = false;
  uint64_t ptr = 0;
  int64_t nbytes = 0, i = 0;
  double d = 0;
  std::string s;
  std::vector<int64_t> ints;  // TENSOR: its sizes; INTS: the values
  std::vector<double> doubles;
  std::vector<HostArg> items;  // LIST
};

struct HostOpRecord {
  uint64_t corr, parent;
  std::string name, overload;
  int64_t t0, dur, tid;
  const char* site;
  std::vector<HostArg> in, out;
};

struct HostOpCtx : at::ObserverContext {
  HostOpCtx* up = nullptr;  // the op it runs inside (its context), if recorded
  uint64_t corr = 0, parent = 0;
  int64_t t0 = 0;
  const char* site = nullptr;
  bool keep = false;
  std::vector<HostArg> in;
};

std::mutex g_hostops_mu;
std::vector<HostOpRecord> g_hostops;
std::atomic<uint64_t> g_hostops_next{0}, g_hostops_dropped{0};
size_t g_hostops_cap = 0;
bool g_hostops_stack = true;
std::optional<at::CallbackHandle> g_hostops_handle;  // (g_hostops_mu)
std::atomic<bool> g_hostops_on{false};            // the handle is set: read without the lock
thread_local uint64_t t_hostop = 0;  // the innermost recorded op of this thread
thread_local HostOpCtx* t_hostop_ctx = nullptr;  // ... and its context (nullptr: a compiled call)

// Tensors of tracing (fake tensors, functional wrappers, other Python
// subclasses: the Python or Functionalize key) or with symbolic sizes are
// not read at all: asking them their sizes would call back into Python.
bool plain_tensor(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::DispatchKeySet ks = impl->key_set();
  return !ks.has(c10::DispatchKey::Python) && !ks.has(c10::DispatchKey::Functionalize) &&
         !ks.has(c10::DispatchKey::PythonTLSSnapshot) && !impl->has_symbolic_sizes_strides();
}

// The tensors of v, or its value (shapes only: what FLOP formulas read).
HostArg host_arg(const c10::IValue& v, bool* device) {
  HostArg a;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return a;
    if (!plain_tensor(t)) {
      a.kind = HostArg::OTHER;
      return a;
    }
    a.kind = HostArg::TENSOR;
    a.dtype = t.scalar_type();
    a.tpu = t.device().type() == kTpu;
    *device |= a.tpu;
    a.ints = t.sizes().vec();
    a.nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    a.ptr = a.tpu && t.has_storage() ? reinterpret_cast<uint64_t>(t.unsafeGetTensorImpl()->storage().data()) +
                                           static_cast<uint64_t>(t.storage_offset() * t.element_size())
                                     : 0;
  } else if (v.isList()) {
    a.kind = HostArg::LIST;
    for (const c10::IValue& e : v.toListRef()) a.items.push_back(host_arg(e, device));
    if (v.isIntList() && !v.isSymIntList()) {
      a.kind = HostArg::INTS;
      a.ints = v.toIntVector();
      a.items.clear();
    } else if (v.isDoubleList()) {
      a.kind = HostArg::DOUBLES;
      a.doubles = v.toDoubleVector();
      a.items.clear();
    }
  } else if (v.isInt()) {
    a.kind = HostArg::INT;
    a.i = v.toInt();
  } else if (v.isDouble()) {
    a.kind = HostArg::DOUBLE;
    a.d = v.toDouble();
  } else if (v.isBool()) {
    a.kind = HostArg::BOOL;
    a.i = v.toBool();
  } else if (v.isString()) {
    a.kind = HostArg::STR;
    a.s = v.toStringRef();
  } else if (v.isDevice()) {
    *device |= v.toDevice().type() == kTpu;
    a.kind = HostArg::OTHER;
  } else if (v.isScalar()) {
    c10::Scalar sc = v.toScalar();
    if (sc.isIntegral(false) || sc.isBoolean()) {
      a.kind = HostArg::INT;
      a.i = sc.toLong();
    } else {
      a.kind = HostArg::DOUBLE;
      a.d = sc.isComplex() ? sc.toComplexDouble().real() : sc.toDouble();
    }
  } else if (!v.isNone()) {
    a.kind = HostArg::OTHER;
  }
  return a;
}

// A finished op into the profile's records, or counted as dropped past the cap.
void keep_record(HostOpRecord&& r) {
  std::lock_guard<std::mutex> lock(g_hostops_mu);
  if (g_hostops.size() >= g_hostops_cap)
    ++g_hostops_dropped;
  else
    g_hostops.push_back(std::move(r));
}

std::unique_ptr<at::ObserverContext> hostop_start(const at::RecordFunction& fn) {
  if (!fn.operator_name()) return nullptr;  // a range of PyTorch's own (PythonDispatchMode, ...), not an operator
  auto ctx = std::make_unique<HostOpCtx>();
  bool device = false;
  try {
    for (const c10::IValue& v : fn.inputs()) ctx->in.push_back(host_arg(v, &device));
  } catch (const std::exception&) {  // an argument that cannot be read: the op is not kept
    ctx->in.clear();
    device = false;
  }
  ctx->keep = device;
  ctx->corr = ++g_hostops_next;
  ctx->parent = t_hostop;
  ctx->up = t_hostop_ctx;
  t_hostop = ctx->corr;
  t_hostop_ctx = ctx.get();
  tpurt_trace_set_corr(ctx->corr);
  // an op inside another runs at its user line: no second frame walk
  if (device && g_hostops_stack) ctx->site = ctx->up && ctx->up->site ? ctx->up->site : user_site();
  ctx->t0 = tpurt_trace_now_ns();
  return ctx;
}

void hostop_end(const at::RecordFunction& fn, at::ObserverContext* c) {
  auto* ctx = static_cast<HostOpCtx*>(c);
  if (!ctx) return;
  int64_t t1 = tpurt_trace_now_ns();
  t_hostop = ctx->parent;
  t_hostop_ctx = ctx->up;
  tpurt_trace_set_corr(ctx->parent);
  HostOpRecord r{ctx->corr, ctx->parent, fn.name(), fn.overload_name(), ctx->t0, t1 - ctx->t0, 0, ctx->site, {}, {}};
  bool device = ctx->keep;
  try {
    for (const c10::IValue& v : fn.outputs()) r.out.push_back(host_arg(v, &device));
  } catch (const std::exception&) {
    r.out.clear();
  }
  if (!device) return;  // an op of the host or of tracing
  if (!r.site && g_hostops_stack && !ctx->keep) r.site = user_site();  // a factory: known only now
  r.tid = static_cast<int64_t>(gettid());
  r.in = std::move(ctx->in);
  keep_record(std::move(r));
}

void hostops_start(bool with_stack, size_t capacity) {
  std::lock_guard<std::mutex> lock(g_hostops_mu);
  if (g_hostops_handle) throw std::runtime_error("torch_tpu.profiler: host op recording is already on");
  g_hostops.clear();
  g_hostops_dropped = 0;
  g_hostops_cap = capacity;
  g_hostops_stack = with_stack;
  g_hostops_handle = at::addGlobalCallback(at::RecordFunctionCallback(&hostop_start, &hostop_end)
                                               .needsInputs(true)
                                               .needsOutputs(true)
                                               .scopes({at::RecordScope::FUNCTION}));
  g_hostops_on = true;
}

void hostops_stop() {
  std::lock_guard<std::mutex> lock(g_hostops_mu);
  if (g_hostops_handle) at::removeCallback(*g_hostops_handle);
  g_hostops_handle.reset();
  g_hostops_on = false;
}

// A replayed compiled call dispatches no operator: it is one host op of its
// own (its kernels carry its id), when host ops are recorded.
struct CompiledCallScope {
  HostOpRecord r{};
  HostOpCtx* up = nullptr;
  bool on;
  CompiledCallScope() : on(g_hostops_on.load()) {
    if (!on) return;
    r.corr = ++g_hostops_next;
    r.parent = t_hostop;
    r.name = "torch_tpu::compiled_graph";
    r.site = g_hostops_stack ? user_site() : nullptr;
    r.tid = static_cast<int64_t>(gettid());
    up = t_hostop_ctx;
    t_hostop_ctx = nullptr;
    t_hostop = r.corr;
    tpurt_trace_set_corr(r.corr);
    r.t0 = tpurt_trace_now_ns();
  }
  ~CompiledCallScope() {
    if (!on) return;
    r.dur = tpurt_trace_now_ns() - r.t0;
    t_hostop = r.parent;
    t_hostop_ctx = up;
    tpurt_trace_set_corr(r.parent);
    keep_record(std::move(r));
  }
};

py::object host_arg_py(const HostArg& a) {
  switch (a.kind) {
    case HostArg::TENSOR: {
      py::object dt = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(a.dtype)));
      return py::make_tuple(py::tuple(py::cast(a.ints)), dt, a.tpu, a.ptr, a.nbytes);
    }
    case HostArg::LIST: {
      py::list l;
      for (const HostArg& e : a.items) l.append(host_arg_py(e));
      return std::move(l);
    }
    case HostArg::INT: return py::int_(a.i);
    case HostArg::DOUBLE: return py::float_(a.d);
    case HostArg::BOOL: return py::bool_(a.i != 0);
    case HostArg::STR: return py::str(a.s);
    case HostArg::INTS: return py::cast(a.ints);
    case HostArg::DOUBLES: return py::cast(a.doubles);
    default: return py::none();
  }
}

// The recorded ops, oldest first: (corr, parent, name, overload, ts, dur,
// tid, site, inputs, outputs); a tensor reads back as (sizes, dtype, on the
// device, data address, bytes). And the count of ops not kept (cap).
py::tuple hostops_read() {
  std::vector<HostOpRecord> ops;
  {
    std::lock_guard<std::mutex> lock(g_hostops_mu);
    ops.swap(g_hostops);
  }
  py::list out;
  for (const HostOpRecord& r : ops) {
    py::list in, res;
    for (const HostArg& a : r.in) in.append(host_arg_py(a));
    for (const HostArg& a : r.out) res.append(host_arg_py(a));
    out.append(py::make_tuple(r.corr, r.parent, r.name, r.overload, r.t0, r.dur, r.tid,
                              r.site ? py::object(py::str(r.site)) : py::object(py::none()), in, res));
  }
  return py::make_tuple(out, g_hostops_dropped.load());
}


// A compiled graph's template (tpurt_replay.h) and what the glue checks and
// rebuilds around it. Inputs: tpu tensors by the memory block they live in
// (inputs that share a block keep sharing it, at the same offsets), small
// host tensors by value (a kernel may have read it into its arguments: a
// replay needs the same value), None. Outputs: tpu tensors over the memory
// the graph allocates (fresh at each replay), an input itself, a view of an
// input's memory, a small host tensor whose value was the same on both
// recorded calls, None. Tensors without memory (no elements) are kept by
// metadata only, and such an output is made anew. Outputs over one block of
// graph memory share one version counter (a forward graph's result and the
// alias of it saved for its backward: an in-place change of the result
// still fails the backward's check as on a recorded call).
enum MetaKind { K_TPU, K_HOST, K_NONE, K_INPUT, K_INPUT_VIEW, K_EMPTY };
constexpr int64_t kHostValueMax = 64;  // elements of a host tensor kept by value

struct TensorMeta {
  MetaKind kind;
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  int block;      // K_TPU: its memory block (inputs) or distinct graph memory (outputs); K_INPUT_VIEW: input block
  int input;      // K_INPUT, K_INPUT_VIEW: the input it is / views
  at::Tensor value;  // K_HOST
  int view_of = -1;  // K_TPU outputs: a view of output view_of (>= 0), of hidden base -2 - view_of (< -1), or none
};

class Replay : public std::enable_shared_from_this<Replay> {
 public:
  ~Replay() { tpurt_replay_destroy(r_); }

  // A call's inputs described before the call runs (its graph may let go
  // of them inside): the probe a capture or a check takes.
  static std::shared_ptr<Replay> inputs(const py::list& inputs) {
    auto r = std::make_shared<Replay>();
    r->bad_ = r->describe_inputs(inputs);
    if (r->dev_ >= 0) {  // the default generator before the call (its draws: from here to after it)
      tpurt_generator g = generator_now(r->dev_);
      r->rng_ = {g.seed, g.offset, g.offset};
    }
    return r;
  }

  // (template or None, why not): the current stream's pending graph, the
  // recording of the call this probe described, as its template.
  py::tuple capture(const py::list& outputs) {
    std::string bad = bad_.empty() ? describe_outputs(outputs) : bad_;
    if (!bad.empty()) return py::make_tuple(py::none(), bad);
    char why[256];
    tpurt_replay* t = nullptr;
    rng_.to = generator_now(dev_).offset;
    check(tpurt_replay_capture(dev_, bases_.data(), bytes_.data(), static_cast<int>(bases_.size()), outs_.data(),
                               static_cast<int>(outs_.size()), &rng_, &t, why, sizeof why),
          "compiled graph capture");
    if (!t) return py::make_tuple(py::none(), std::string(why));
    r_ = t;
    return py::make_tuple(py::cast(shared_from_this()), std::string());
  }

  // (equal, first difference): the recording of the call probe described
  // against the template.
  py::tuple matches(const Replay& probe, const py::list& outputs) {
    std::vector<tpurt_devptr> outs;
    std::string bad = probe.bad_.empty() ? same_inputs(probe) : probe.bad_;
    if (bad.empty()) bad = outputs_of(probe, outputs, &outs);
    if (!bad.empty()) return py::make_tuple(false, bad);
    char why[256];
    tpurt_replay_rng rng = probe.rng_;
    rng.to = generator_now(dev_).offset;
    int ok = tpurt_replay_matches(r_, probe.bases_.data(), static_cast<int>(probe.bases_.size()), outs.data(),
                                  static_cast<int>(outs.size()), &rng, why, sizeof why);
    return py::make_tuple(static_cast<bool>(ok), std::string(ok ? "" : why));
  }

  // The outputs of the template run on these inputs, or None when it cannot
  // run on them (the caller records the call).
  py::object run(const py::list& inputs) {
    std::vector<tpurt_devptr> bases;
    if (!bind(inputs, &bases).empty()) return py::none();
    std::vector<c10::StorageImpl*> given;  // memory the graph frees: the inputs' last references are the list's
    for (size_t b = 0; b < bases_.size(); ++b)
      if (tpurt_replay_input_freed(r_, static_cast<int>(b)) && !last_references(inputs, static_cast<int>(b), &given))
        return py::none();
    std::vector<tpurt_devptr> outs(out_bytes_.size());
    int refused = 1;
    tpurt_status st;
    {
      CompiledCallScope scope;
      py::gil_scoped_release nogil;
      // the call's random draws (if it has any) come from the default generator, as a recorded call's
      std::unique_lock<std::mutex> lock;
      tpurt_generator* gen = nullptr;
      if (rng_.to != rng_.from) {
        const at::Generator& g = default_generator(static_cast<c10::DeviceIndex>(dev_));
        lock = std::unique_lock<std::mutex>(const_cast<at::Generator&>(g).mutex());
        gen = generator_state(g);
      }
      st = tpurt_replay_run(r_, bases.data(), static_cast<int>(bases.size()), outs.data(), gen, &refused);
    }
    if (refused && !st) return py::none();
    check(st, "compiled graph");  // (nothing ran: out of promise ids)
    // the replay freed that memory (at its point in the graph): the tensors
    // still naming it must not free it again (last_references checked the deleter is the allocator's)
    for (c10::StorageImpl* si : given)
      (void)si->mutable_data_ptr().compare_exchange_deleter(device_allocator()->raw_deleter(), &keep_memory);
    check(st, "compiled graph");
    c10::Device device(kTpu, static_cast<c10::DeviceIndex>(dev_));
    std::vector<c10::Storage> storages;
    storages.reserve(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      void* vp = reinterpret_cast<void*>(outs[k]);
      storages.emplace_back(c10::Storage::use_byte_size_t(), out_bytes_[k],
                            c10::DataPtr(vp, vp, device_allocator()->raw_deleter(), device), device_allocator(), false);
    }
    std::vector<at::Tensor> block_first(outs.size());  // the first output over each block of graph memory
    auto unviewed = [&](const TensorMeta& m) {
      auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storages[m.block]),
                                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                        caffe2::TypeMeta::fromScalarType(m.dtype));
      t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides, m.offset);
      // outputs over one block alias each other as on a recorded call (a result and the alias of it
      // saved for the backward): one version counter, so an in-place change of one is seen through
      // the others (the backward's check of its saved values)
      at::Tensor& first = block_first[static_cast<size_t>(m.block)];
      if (first.defined())
        t.unsafeGetTensorImpl()->set_version_counter(first.unsafeGetTensorImpl()->version_counter());
      else
        first = t;
      return t;
    };
    // views as on the recorded call: of another output, or of a base the call did not return
    std::vector<at::Tensor> tpu(out_meta_.size()), hidden(hidden_.size());
    for (size_t k = 0; k < out_meta_.size(); ++k)
      if (out_meta_[k].kind == K_TPU && out_meta_[k].view_of == -1 && same_out_[k] < 0) tpu[k] = unviewed(out_meta_[k]);
    for (size_t h = 0; h < hidden_.size(); ++h) hidden[h] = unviewed(hidden_[h]);
    for (size_t k = 0; k < out_meta_.size(); ++k) {
      const TensorMeta& m = out_meta_[k];
      if (m.kind != K_TPU || m.view_of == -1) continue;
      const at::Tensor& base = m.view_of >= 0 ? tpu[static_cast<size_t>(m.view_of)] : hidden[static_cast<size_t>(-2 - m.view_of)];
      tpu[k] = base.as_strided(m.sizes, m.strides, m.offset);
    }
    py::list res;
    for (size_t k = 0; k < out_meta_.size(); ++k) {
      const TensorMeta& m = out_meta_[k];
      if (same_out_[k] >= 0) {
        res.append(res[static_cast<size_t>(same_out_[k])]);
      } else if (m.kind == K_NONE) {
        res.append(py::none());
      } else if (m.kind == K_HOST) {
        res.append(m.value.clone());
      } else if (m.kind == K_INPUT) {
        res.append(inputs[m.input]);
      } else if (m.kind == K_INPUT_VIEW) {
        res.append(THPVariable_Unpack(inputs[m.input].ptr()).as_strided(m.sizes, m.strides, m.offset));
      } else if (m.kind == K_EMPTY) {
        res.append(at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(device)));
      } else {
        res.append(tpu[k]);
      }
    }
    return res;
  }

  bool verified() const { return r_ && tpurt_replay_verified(r_); }

 private:
  static TensorMeta meta_of(MetaKind kind, const at::TensorBase& t, int block, int input = -1) {
    return {kind, t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset(), block, input, {}};
  }

  static tpurt_devptr base_of(const at::Tensor& t) {
    return reinterpret_cast<tpurt_devptr>(t.storage().data_ptr().get());
  }

  // Index of t's memory in blocks (appended, with its size, when new and add).
  static int block_of(const at::Tensor& t, std::vector<tpurt_devptr>* blocks, std::vector<uint64_t>* bytes,
                      bool add = true) {
    tpurt_devptr base = base_of(t);
    for (size_t b = 0; b < blocks->size(); ++b)
      if ((*blocks)[b] == base) return static_cast<int>(b);
    if (!add) return -1;
    blocks->push_back(base);
    bytes->push_back(t.storage().nbytes());
    return static_cast<int>(blocks->size() - 1);
  }

  static bool same_meta(const at::Tensor& t, const TensorMeta& m) {
    return t.scalar_type() == m.dtype && t.storage_offset() == m.offset && t.sizes() == c10::IntArrayRef(m.sizes) &&
           t.strides() == c10::IntArrayRef(m.strides);
  }

  static bool same_value(const at::Tensor& t, const TensorMeta& m) {
    return t.device().is_cpu() && t.scalar_type() == m.value.scalar_type() && t.sizes() == m.value.sizes() &&
           at::equal(t, m.value);
  }

  // What h is: a tpu tensor on the chip (*t set), a small host tensor (*t set), None, or why not.
  const char* classify(const py::handle& h, at::Tensor* t, MetaKind* kind) {
    if (h.is_none()) return *kind = K_NONE, nullptr;
    if (!THPVariable_Check(h.ptr())) return "a value that is not a tensor";
    *t = THPVariable_Unpack(h.ptr());
    if (!t->defined()) return "an undefined tensor";
    if (t->device().is_cpu()) {
      if (t->numel() > kHostValueMax) return "a large host tensor";
      return *kind = K_HOST, nullptr;
    }
    if (t->device().type() != kTpu) return "a tensor on another device";
    if (dev_ < 0) dev_ = t->device().index();
    if (t->device().index() != dev_) return "tensors on two chips";
    if (!t->storage().data_ptr().get()) return *kind = K_EMPTY, nullptr;  // (no memory: no block)
    return *kind = K_TPU, nullptr;
  }

  // The inputs' description; "" or why not.
  std::string describe_inputs(const py::list& inputs) {
    dev_ = -1;
    for (const py::handle& h : inputs) {
      at::Tensor t;
      MetaKind kind;
      if (const char* bad = classify(h, &t, &kind)) return std::string(bad) + " among its inputs";
      TensorMeta m{kind, {}, {}, {}, 0, -1, -1, {}};
      if (kind == K_TPU) m = meta_of(K_TPU, t, block_of(t, &bases_, &bytes_));
      if (kind == K_EMPTY) m = meta_of(K_EMPTY, t, -1);
      if (kind == K_HOST) m.value = t.clone();
      in_meta_.push_back(std::move(m));
      in_obj_.push_back(h.ptr());  // identity only (not a reference: the call may let go of it)
    }
    return "";
  }

  // The outputs' description (after the inputs'); "" or why not.
  std::string describe_outputs(const py::list& outputs) {
    for (const py::handle& h : outputs) {
      at::Tensor t;
      MetaKind kind;
      if (const char* bad = classify(h, &t, &kind)) return std::string(bad) + " among its outputs";
      TensorMeta m{kind, {}, {}, {}, 0, -1, -1, {}};
      if (kind == K_HOST) m.value = t.clone();
      if (kind == K_EMPTY) m = meta_of(K_EMPTY, t, -1);
      if (kind == K_TPU) {
        int b = block_of(t, &bases_, &bytes_, false);
        if (b < 0) {
          m = meta_of(K_TPU, t, block_of(t, &outs_, &out_bytes_));
        } else {  // the memory of an input: that input itself, or a view of it
          int same = -1, first = -1;
          for (size_t i = 0; i < in_meta_.size(); ++i) {
            if (in_meta_[i].kind != K_TPU || in_meta_[i].block != b) continue;
            if (first < 0) first = static_cast<int>(i);
            if (same < 0 && in_obj_[i] == h.ptr() && same_meta(t, in_meta_[i])) same = static_cast<int>(i);
          }
          m = same >= 0 ? meta_of(K_INPUT, t, b, same) : meta_of(K_INPUT_VIEW, t, b, first);
        }
      }
      out_meta_.push_back(std::move(m));
    }
    if (dev_ < 0) return "no tensor on the chip";
    std::vector<c10::TensorImpl*> hidden;
    for (size_t i = 0; i < out_meta_.size(); ++i)
      if (out_meta_[i].kind == K_TPU) out_meta_[i].view_of = view_of(outputs, i, &hidden, &hidden_);
    same_out_ = same_outputs(outputs);
    return "";
  }

  // For each output, the first earlier output that is the same tensor object (a graph that returns
  // one value twice: x and x.contiguous()), or -1. A replay returns that object again, as the
  // recorded call did: two objects over one memory would be inputs that alias without being views
  // of each other to the next graph, which AOTAutograd refuses to compile when one of them changes.
  static std::vector<int> same_outputs(const py::list& outputs) {
    std::vector<int> same(outputs.size(), -1);
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].is_none()) continue;
      for (size_t j = 0; j < k && same[k] < 0; ++j)
        if (outputs[j].ptr() == outputs[k].ptr()) same[k] = static_cast<int>(j);
    }
    return same;
  }

  // Which tensor output i (a K_TPU output of the recorded call) is a view of, as a recorded call's
  // outputs are (eager's x, x.t(); Dynamo treats inputs that are views of one base as aliases): another
  // output (its index), a base that is not an output (-2 - its index in seen, whose metadata
  // *metas gets when new), or none (-1: not a view, or a view of another dtype, rebuilt unviewed).
  int view_of(const py::list& outputs, size_t i, std::vector<c10::TensorImpl*>* seen,
              std::vector<TensorMeta>* metas) const {
    const at::Tensor& t = THPVariable_Unpack(outputs[i].ptr());
    if (!t.is_view()) return -1;
    const at::TensorBase& base = t._base();
    if (base.scalar_type() != t.scalar_type() || base.storage().data_ptr().get() != t.storage().data_ptr().get())
      return -1;
    for (size_t j = 0; j < out_meta_.size(); ++j)
      if (j != i && out_meta_[j].kind == K_TPU && THPVariable_Unpack(outputs[j].ptr()).unsafeGetTensorImpl() == base.unsafeGetTensorImpl())
        return static_cast<int>(j);
    c10::TensorImpl* b = base.unsafeGetTensorImpl();
    auto it = std::find(seen->begin(), seen->end(), b);
    if (it != seen->end()) return -2 - static_cast<int>(it - seen->begin());
    seen->push_back(b);
    if (metas) metas->push_back(meta_of(K_TPU, base, out_meta_[i].block));
    return -2 - static_cast<int>(seen->size() - 1);
  }

  // Does probe describe inputs like the template's? "" or why not.
  std::string same_inputs(const Replay& probe) const {
    if (probe.in_meta_.size() != in_meta_.size()) return "another number of inputs";
    if (probe.bases_.size() != bases_.size() || probe.bytes_ != bytes_ || probe.dev_ != dev_)
      return "inputs in other memory blocks";
    for (size_t i = 0; i < in_meta_.size(); ++i) {
      const TensorMeta &a = probe.in_meta_[i], &b = in_meta_[i];
      if (a.kind != b.kind || a.block != b.block) return "inputs of other kinds";
      if ((a.kind == K_TPU || a.kind == K_EMPTY) && (a.dtype != b.dtype || a.sizes != b.sizes || a.strides != b.strides || a.offset != b.offset))
        return "an input of another shape, layout or type";
      if (a.kind == K_HOST && !same_value(a.value, b)) return "a host input of another value";
    }
    return "";
  }

  // Are the list's references to block b's inputs the last ones to its
  // memory (so the recorded call let go of it inside)? Each input of the
  // block only in the list, and the memory held by nothing else than them
  // and the bases of those that are views (when only those views hold the
  // bases). Adds its storage to given.
  bool last_references(const py::list& inputs, int b, std::vector<c10::StorageImpl*>* given) const {
    c10::StorageImpl* si = nullptr;
    size_t n = 0, uses = 0;
    std::vector<std::pair<c10::TensorImpl*, size_t>> bases;  // a view's base, and views of it among the inputs
    for (size_t i = 0; i < in_meta_.size(); ++i) {
      if (in_meta_[i].kind != K_TPU || in_meta_[i].block != b) continue;
      PyObject* o = inputs[i].ptr();
      const at::Tensor& t = THPVariable_Unpack(o);
      if (Py_REFCNT(o) != 1 || t.use_count() != 1) return false;
      si = t.storage().unsafeGetStorageImpl();
      uses = t.storage().use_count();
      ++n;
      if (t.is_view()) {
        c10::TensorImpl* base = t._base().unsafeGetTensorImpl();
        auto it = std::find_if(bases.begin(), bases.end(), [&](const auto& e) { return e.first == base; });
        if (it == bases.end())
          bases.emplace_back(base, 1);
        else
          ++it->second;
      }
    }
    for (const auto& [base, views] : bases) {
      if (base->storage().unsafeGetStorageImpl() != si || c10::raw::intrusive_ptr::use_count(base) != views) return false;
      ++n;
    }
    if (!si || uses != n || si->data_ptr().get_deleter() != device_allocator()->raw_deleter()) return false;
    given->push_back(si);
    return true;
  }

  static void keep_memory(void*) {}

  // The default generator of device dev now (seed and offset).
  static tpurt_generator generator_now(int dev) {
    const at::Generator& gen = default_generator(static_cast<c10::DeviceIndex>(dev));
    std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(gen).mutex());
    return *generator_state(gen);
  }

  // This call's input blocks (inputs as at capture: metadata, sharing, host
  // values); "" or why not.
  std::string bind(const py::list& inputs, std::vector<tpurt_devptr>* bases) const {
    if (inputs.size() != in_meta_.size()) return "another number of inputs";
    bases->assign(bases_.size(), 0);
    size_t i = 0;
    for (const py::handle& h : inputs) {
      const TensorMeta& m = in_meta_[i++];
      if (m.kind == K_NONE) {
        if (!h.is_none()) return "an input that is no longer None";
        continue;
      }
      if (!THPVariable_Check(h.ptr())) return "an input that is not a tensor";
      const at::Tensor& t = THPVariable_Unpack(h.ptr());
      if (m.kind == K_HOST) {
        if (!t.defined() || !same_value(t, m)) return "a host input of another value";
        continue;
      }
      if (!t.defined() || t.device().type() != kTpu || t.device().index() != dev_) return "an input not on the chip";
      if (m.kind == K_EMPTY) {
        if (!same_meta(t, m) || t.storage().data_ptr().get()) return "an input of another shape, layout or type";
        continue;
      }
      if (!same_meta(t, m) || t.storage().nbytes() != bytes_[m.block]) return "an input of another shape, layout or type";
      tpurt_devptr& b = (*bases)[m.block];
      if (b && b != base_of(t)) return "inputs that no longer share memory";
      b = base_of(t);
    }
    return "";
  }

  // This call's distinct graph memory among its outputs, if they are what
  // the capture's were; "" or why not.
  std::string outputs_of(const Replay& probe, const py::list& outputs, std::vector<tpurt_devptr>* outs) const {
    if (outputs.size() != out_meta_.size()) return "another number of outputs";
    outs->assign(outs_.size(), 0);
    size_t i = 0;
    for (const py::handle& h : outputs) {
      const TensorMeta& m = out_meta_[i++];
      if (m.kind == K_NONE) {
        if (!h.is_none()) return "an output that is no longer None";
        continue;
      }
      if (m.kind == K_INPUT) {
        if (h.ptr() != probe.in_obj_[m.input]) return "an output that is no longer its input";
        continue;
      }
      if (!THPVariable_Check(h.ptr())) return "an output that is not a tensor";
      const at::Tensor& t = THPVariable_Unpack(h.ptr());
      if (!t.defined()) return "an undefined output";
      if (m.kind == K_HOST) {
        if (!same_value(t, m)) return "a host output of another value";
        continue;
      }
      if (t.device().type() != kTpu || !same_meta(t, m)) return "an output of another shape, layout or type";
      if (m.kind == K_EMPTY) {
        if (t.storage().data_ptr().get()) return "an output that now has memory";
        continue;
      }
      if (m.kind == K_INPUT_VIEW) {
        if (base_of(t) != probe.bases_[m.block]) return "an output that no longer views its input";
        continue;
      }
      (*outs)[m.block] = base_of(t);
    }
    std::vector<c10::TensorImpl*> hidden;
    for (size_t k = 0; k < out_meta_.size(); ++k)
      if (out_meta_[k].kind == K_TPU && view_of(outputs, k, &hidden, nullptr) != out_meta_[k].view_of)
        return "outputs that view others differently";
    if (same_outputs(outputs) != same_out_) return "outputs that repeat others differently";
    return "";
  }

  tpurt_replay* r_ = nullptr;
  int dev_ = -1;
  std::vector<tpurt_devptr> bases_;  // the capture's input blocks
  std::vector<uint64_t> bytes_;
  std::vector<TensorMeta> in_meta_;
  std::vector<PyObject*> in_obj_;  // the described call's inputs (identity only)
  std::string bad_;                // why the described inputs cannot be a template's
  std::vector<tpurt_devptr> outs_;  // the capture's distinct graph memory among the outputs
  std::vector<uint64_t> out_bytes_;
  std::vector<TensorMeta> out_meta_;
  std::vector<TensorMeta> hidden_;  // the bases of outputs that view a tensor the call did not return
  std::vector<int> same_out_;       // per output: the earlier output that is the same object, or -1
  tpurt_replay_rng rng_{0, 0, 0};  // the default generator around the described call
};

}  // namespace
}  // namespace torch_tpu

namespace torch_tpu {
void init_c10d(pybind11::module_& m);  // c10d.cpp: the tpu_dist backend
void mark_device_used();                // runtime.cpp: torch.tpu.is_initialized()
bool device_used();
}

PYBIND11_MODULE(_C, m) {
  using namespace torch_tpu;
  m.doc() = "torch_tpu native glue (C++ adapter over the tpurt C runtime)";
  m.def("_init", [] {
    ensure_initialized();
    mark_device_used();
  });
  m.def("_in_bad_fork", [] { return static_cast<bool>(tpurt_in_bad_fork()); });
  m.def("_is_initialized", [] { return device_used(); });
  m.def("_device_count", [] { return device_count(); });
  m.def("_get_device", [] {
    ensure_initialized();
    return tpurt_get_device();
  });
  m.def("_set_device", [](int index) {
    check(tpurt_set_device(checked_index(static_cast<c10::DeviceIndex>(index))), "set_device");
    mark_device_used();
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
  m.def("_cpu_info", &cpu_info);
  m.def("_set_exec_mode", [](int mode) {
    ensure_initialized();
    py::gil_scoped_release nogil;
    check(tpurt_set_exec_mode(static_cast<tpurt_exec_mode>(mode)), "set_execution_mode");
  });
  m.def("_exec_mode", [] {
    ensure_initialized();
    return static_cast<int>(tpurt_get_exec_mode());
  });
  m.def("_flush", [](int index) {
    ensure_initialized();
    py::gil_scoped_release nogil;
    check(tpurt_flush(index, TPURT_FLUSH_EXPLICIT), "flush");
  });
  m.def("_defer_stats", &defer_stats);
  m.def("_cut_count", [] {  // graphs cut so far (every reason): a compiled call checks none cut it inside
    tpurt_defer_stats s;
    tpurt_defer_get_stats(&s);
    uint64_t n = 0;
    for (int r = 0; r < TPURT_FLUSH_NUM_REASONS; r++) n += s.flushes[r];
    return n;
  });
  m.def("_reset_defer_stats", [] { tpurt_defer_reset_stats(); });
  m.def("_codegen_info", [] {
    char buf[512];
    int ok = tpurt_codegen_info(buf, sizeof buf);
    return py::make_tuple(static_cast<bool>(ok), std::string(buf));
  });
  m.def("_set_defer_max_ops", [](int n) { tpurt_defer_set_max_ops(n); });
  m.def("_set_defer_segment_ops", [](int n) { tpurt_defer_set_segment_ops(n); });
  m.def("_get_defer_segment_ops", [] { return tpurt_defer_get_segment_ops(); });
  m.def("_install_site_fn", &install_site_fn);
  m.def("_kcache_stats", &kcache_stats);
  m.def("_kcache_clear", [] { check(tpurt_kcache_clear(), "_clear_cache"); });
  m.def("_kcache_dir", [] {
    char buf[4096];
    tpurt_status st = tpurt_kcache_dir(buf, sizeof buf);
    return py::make_tuple(std::string(buf), st == TPURT_OK, std::string(st == TPURT_OK ? "" : tpurt_last_error()));
  });
  m.def("_trace_start", [](size_t capacity) { check(tpurt_trace_start(capacity), "profiler"); });
  m.def("_trace_stop", [] { tpurt_trace_stop(); });
  m.def("_trace_enabled", [] { return static_cast<bool>(tpurt_trace_enabled()); });
  m.def("_trace_set_corr", [](uint64_t id) { tpurt_trace_set_corr(id); });
  m.def("_trace_read", &trace_read);
  m.def("_hostops_start", &hostops_start);
  m.def("_hostops_stop", &hostops_stop);
  m.def("_hostops_read", &hostops_read);
  m.def("_hostops_on", [] { return g_hostops_on.load(); });
  m.def("_trace_now_ns", [] { return tpurt_trace_now_ns(); });
  m.def("_hold_site", [](bool on) {  // on: ops record the caller's line until the matching off
    if (on && t_site_hold++ == 0) {
      t_held_site = g_node_sites ? user_site() : nullptr;
    } else if (!on && t_site_hold > 0) {
      --t_site_hold;
    }
  });
  m.def("_user_site", [] {
    const char* s = user_site();
    return s ? py::object(py::str(s)) : py::object(py::none());
  });
  py::class_<Replay, std::shared_ptr<Replay>>(m, "_Replay")
      .def_static("inputs", &Replay::inputs)
      .def("capture", &Replay::capture)
      .def("matches", &Replay::matches)
      .def("run", &Replay::run)
      .def_property_readonly("verified", &Replay::verified);
  m.attr("_api_version") = TPURT_API_VERSION;
  init_c10d(m);
}
