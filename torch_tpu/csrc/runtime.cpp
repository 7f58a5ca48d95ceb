// Device-level registrations for the `tpu` (PrivateUse1) backend:
// status -> exception mapping, the device allocator, the pinned host
// allocator, the DeviceGuard implementation (chips, streams, events), the
// PrivateUse1 hooks and the per-device counter-based generator.
// Each piece forwards to the C runtime (tpurt.h).
#include <atomic>
#include "glue.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <deque>
#include <mutex>

namespace torch_tpu {

// ------------------------------------------------------------------ errors

namespace {
bool index_error_is_runtime_error(const std::string& msg) {
  // the CPU's IndexError of an index_add into a vector
  if (msg.find("index out of range in self") != std::string::npos) return false;
  size_t end = msg.find_first_of(": (");
  std::string op = msg.substr(0, end == std::string::npos ? 0 : end);
  return op == "gather" || op == "scatter" || op == "scatter_add" || op == "scatter_reduce" || op == "index_add";
}
}  // namespace

void raise_status(tpurt_status s, const char* what) {
  std::string msg = tpurt_last_error();
  switch (s) {
    case TPURT_ERR_OUT_OF_MEMORY:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "TPU out of memory. ", msg);
    case TPURT_ERR_INDEX:
      // PyTorch's CPU kernels report an out-of-range index of gather, the
      // scatters and index_add as RuntimeError, every other one as
      // IndexError; the message starts with the failing launch's name (an
      // asynchronous error knows nothing else of its op).
      if (index_error_is_runtime_error(msg)) TORCH_CHECK(false, msg);
      TORCH_CHECK_INDEX(false, msg);
    case TPURT_ERR_NOT_SUPPORTED:
      TORCH_CHECK_NOT_IMPLEMENTED(false, what, ": ", msg);
    case TPURT_ERR_INVALID_ARGUMENT:
      TORCH_CHECK(false, what, ": ", msg);
    case TPURT_ERR_INVALID_DEVICE:
      TORCH_CHECK(false, "TPU error: ", msg);
    default:
      TORCH_CHECK(false, "TPU error (", tpurt_status_name(s), "): ", msg);
  }
}

// torch.tpu.is_initialized(), as torch.cuda's: true once the process has
// used a chip (a tensor allocated, a device set, torch's lazy device init),
// not merely asked how many there are. DeviceMesh sets the current device
// from LOCAL_RANK only while this is false.
static std::atomic<bool> g_device_used{false};
void mark_device_used() { g_device_used.store(true, std::memory_order_relaxed); }
bool device_used() { return g_device_used.load(std::memory_order_relaxed) && tpurt_is_initialized(); }

void ensure_initialized() {
  static std::once_flag once;
  static tpurt_status status = TPURT_OK;
  std::call_once(once, [] { status = tpurt_init(); });
  if (status != TPURT_OK) raise_status(status, "tpu init");
  if (tpurt_in_bad_fork()) {
    tpurt_init();  // sets the message
    TORCH_CHECK(false, "TPU error: ", tpurt_last_error());
  }
}

int device_count() {
  ensure_initialized();
  return tpurt_device_count();
}

c10::DeviceIndex checked_index(c10::DeviceIndex index) {
  ensure_initialized();
  if (index == -1) return static_cast<c10::DeviceIndex>(tpurt_get_device());
  TORCH_CHECK(index >= 0, "Device index must be -1 or non-negative, got ", static_cast<int>(index));
  TORCH_CHECK(index < tpurt_device_count(), "TPU error: invalid device ordinal ", static_cast<int>(index),
              " (", tpurt_device_count(), " TPU chip(s) visible; set TPU_NUM_DEVICES for more)");
  return index;
}

// --------------------------------------------------------------- streams

tpurt_stream* to_runtime(const c10::Stream& s) {
  tpurt_stream* rs = nullptr;
  check(tpurt_stream_get(checked_index(s.device_index()), s.id(), &rs), "stream");
  return rs;
}

tpurt_stream* current_stream(c10::DeviceIndex index) {
  return tpurt_stream_current(checked_index(index));
}

c10::Stream to_c10(tpurt_stream* s) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kTpu, static_cast<c10::DeviceIndex>(tpurt_stream_device(s))),
                     static_cast<c10::StreamId>(tpurt_stream_id(s)));
}

// ----------------------------------------------------------------- dtypes

bool has_runtime_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
    case at::kComplexFloat: case at::kComplexDouble:
    case at::kUInt16: case at::kUInt32: case at::kUInt64:
      return true;
    default:
      return false;
  }
}

tpurt_dtype to_runtime(at::ScalarType t) {
  switch (t) {
    case at::kBool: return TPURT_BOOL;
    case at::kByte: return TPURT_U8;
    case at::kChar: return TPURT_I8;
    case at::kShort: return TPURT_I16;
    case at::kInt: return TPURT_I32;
    case at::kLong: return TPURT_I64;
    case at::kHalf: return TPURT_F16;
    case at::kBFloat16: return TPURT_BF16;
    case at::kFloat: return TPURT_F32;
    case at::kDouble: return TPURT_F64;
    case at::kComplexFloat: return TPURT_C64;
    case at::kComplexDouble: return TPURT_C128;
    case at::kUInt16: return TPURT_U16;
    case at::kUInt32: return TPURT_U32;
    case at::kUInt64: return TPURT_U64;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "dtype ", t, " is not supported on TPU");
  }
}

tpurt_view view_of(const at::Tensor& t, at::ScalarType as) {
  TORCH_CHECK(t.dim() <= TPURT_MAX_DIMS, "TPU tensors support at most ", TPURT_MAX_DIMS,
              " dimensions, got ", t.dim());
  tpurt_view v{};
  v.ptr = reinterpret_cast<tpurt_devptr>(t.data_ptr());
  v.dtype = to_runtime(as);
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.sizes[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

tpurt_view view_of(const at::Tensor& t) { return view_of(t, t.scalar_type()); }

tpurt_scalar to_runtime(const c10::Scalar& s) {
  tpurt_scalar r{};
  if (s.isBoolean()) {
    r.kind = TPURT_SCALAR_BOOL;
    r.i = s.toBool();
  } else if (s.isIntegral(false)) {
    r.kind = TPURT_SCALAR_INT;
    r.i = s.toLong();
  } else if (s.isComplex()) {
    r.kind = TPURT_SCALAR_COMPLEX;
    auto c = s.toComplexDouble();
    r.re = c.real();
    r.im = c.imag();
  } else {
    r.kind = TPURT_SCALAR_FLOAT;
    r.re = s.toDouble();
  }
  return r;
}

// -------------------------------------------------------- device allocator

namespace {

void delete_device(void* ctx) {
  // Called from destructors: never throw. A failure here is an internal
  // invariant violation (the pointer came from tpurt_malloc).
  tpurt_status s = tpurt_free(reinterpret_cast<tpurt_devptr>(ctx));
  if (s != TPURT_OK) TORCH_WARN("tpurt_free failed: ", tpurt_last_error());
}

c10::CachingAllocator::Stat to_stat(const tpurt_stat& s) {
  c10::CachingAllocator::Stat r;
  r.current = s.current;
  r.peak = s.peak;
  r.allocated = s.allocated;
  r.freed = s.freed;
  return r;
}

void copy_stats(c10::CachingAllocator::StatArray& dst, const tpurt_stat* src) {
  for (int i = 0; i < TPURT_NUM_POOLS; ++i) dst[i] = to_stat(src[i]);
}

struct TpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override {
    ensure_initialized();
    mark_device_used();
    c10::DeviceIndex dev = static_cast<c10::DeviceIndex>(tpurt_get_device());
    tpurt_devptr p = 0;
    if (n > 0) check(tpurt_malloc(dev, n, tpurt_stream_current(dev), &p), "allocate");
    void* vp = reinterpret_cast<void*>(p);
    return {vp, vp, &delete_device, c10::Device(kTpu, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_device; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    tpurt_devptr d = reinterpret_cast<tpurt_devptr>(dest);
    tpurt_stream* s = current_stream(static_cast<c10::DeviceIndex>(tpurt_devptr_device(d)));
    check(tpurt_memcpy_d2d(s, d, reinterpret_cast<tpurt_devptr>(src), count), "copy_data");
  }
  bool initialized() override { return tpurt_is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {
    for (int d = 0; d < device_count(); ++d) check(tpurt_empty_cache(d), "empty_cache");
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (!ptr.get()) return;
    check(tpurt_record_stream(reinterpret_cast<tpurt_devptr>(ptr.get()), to_runtime(stream)), "record_stream");
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    tpurt_memory_stats s;
    check(tpurt_memory_get_stats(checked_index(device), &s), "memory_stats");
    c10::CachingDeviceAllocator::DeviceStats r;
    copy_stats(r.allocation, s.allocation);
    copy_stats(r.segment, s.segment);
    copy_stats(r.active, s.active);
    copy_stats(r.inactive_split, s.inactive_split);
    copy_stats(r.allocated_bytes, s.allocated_bytes);
    copy_stats(r.reserved_bytes, s.reserved_bytes);
    copy_stats(r.active_bytes, s.active_bytes);
    copy_stats(r.inactive_split_bytes, s.inactive_split_bytes);
    copy_stats(r.requested_bytes, s.requested_bytes);
    r.num_alloc_retries = s.num_alloc_retries;
    r.num_ooms = s.num_ooms;
    r.num_device_alloc = s.num_device_alloc;
    r.num_device_free = s.num_device_free;
    r.num_sync_all_streams = s.num_sync_all_streams;
    return r;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(tpurt_memory_reset_accumulated(checked_index(device)), "reset_accumulated_memory_stats");
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check(tpurt_memory_reset_peak(checked_index(device)), "reset_peak_memory_stats");
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    size_t free_b = 0, total_b = 0;
    check(tpurt_memory_get_info(checked_index(device), &free_b, &total_b), "mem_get_info");
    return {free_b, total_b};
  }
};

TpuAllocator g_device_allocator;

// ---------------------------------------------------------- host allocator

void delete_host(void* p) {
  if (tpurt_host_free(p) != TPURT_OK) TORCH_WARN("tpurt_host_free failed: ", tpurt_last_error());
}

struct TpuHostAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) check(tpurt_host_alloc(n, &p), "pin_memory");
    return {p, p, &delete_host, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_host; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  // The runtime defers reuse of a freed pinned buffer until every stream has
  // passed the point of the free, which covers any recorded use.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override { check(tpurt_host_empty_cache(), "empty_host_cache"); }
  at::HostStats get_stats() override {
    tpurt_host_stats s;
    tpurt_host_get_stats(&s);
    at::HostStats r;
    r.active_requests = to_stat(s.allocation);
    r.active_bytes = to_stat(s.allocated_bytes);
    r.allocations = to_stat(s.allocation);
    r.allocated_bytes = to_stat(s.reserved_bytes);
    return r;
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

TpuHostAllocator g_host_allocator;

}  // namespace

c10::DeviceAllocator* device_allocator() { return &g_device_allocator; }
c10::Allocator* host_allocator() { return &g_host_allocator; }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator);

void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  size_t old_bytes = storage.nbytes();
  if (new_bytes == old_bytes) return;
  c10::DeviceIndex dev = storage.device().index();
  c10::DataPtr fresh;
  {
    c10::DeviceGuard guard(storage.device());
    fresh = g_device_allocator.allocate(new_bytes);
  }
  size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0) {
    check(tpurt_memcpy_d2d(current_stream(dev), reinterpret_cast<tpurt_devptr>(fresh.get()),
                           reinterpret_cast<tpurt_devptr>(storage.data()), keep),
          "resize_");
  }
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(new_bytes);
}

// ---------------------------------------------------------------- generator

namespace {

// Counter-based generator: (seed, offset) fully determine the stream of
// numbers, so every execution mode draws the same values. The state tensor
// holds the two 64-bit words.
struct TpuGenerator final : c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {
    state_.seed = c10::default_rng_seed_val;
    state_.offset = 0;
  }
  void set_current_seed(uint64_t seed) override {
    state_.seed = seed;
    state_.offset = 0;
  }
  uint64_t current_seed() const override { return state_.seed; }
  uint64_t seed() override {
    set_current_seed(tpurt_nondeterministic_seed());
    return state_.seed;
  }
  void set_offset(uint64_t offset) override { state_.offset = offset; }
  uint64_t get_offset() const override { return state_.offset; }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({static_cast<int64_t>(sizeof(state_))}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), &state_, sizeof(state_));
    return t.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "RNG state must be a torch.ByteTensor");
    TORCH_CHECK(new_state.numel() == static_cast<int64_t>(sizeof(state_)),
                "TPU RNG state must have ", sizeof(state_), " bytes, got ", new_state.numel());
    TORCH_CHECK(new_state.device().is_cpu(), "RNG state must be a CPU tensor");
    std::memcpy(&state_, new_state.data(), sizeof(state_));
  }
  static c10::DeviceType device_type() { return kTpu; }
  tpurt_generator* state() { return &state_; }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->state_ = state_;
    return g;
  }
  tpurt_generator state_;
};

std::mutex g_gen_mutex;
std::deque<at::Generator> g_default_generators;  // deque: stable references

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = checked_index(index);
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  while (static_cast<int>(g_default_generators.size()) < device_count()) {
    auto idx = static_cast<c10::DeviceIndex>(g_default_generators.size());
    g_default_generators.push_back(at::make_generator<TpuGenerator>(idx));
  }
  return g_default_generators[index];
}

tpurt_generator* generator_state(const at::Generator& g) {
  return at::check_generator<TpuGenerator>(g)->state();
}

// ------------------------------------------------------------ device guard

namespace {

struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    ensure_initialized();
    return c10::Device(kTpu, static_cast<c10::DeviceIndex>(tpurt_get_device()));
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "expected a tpu device, got ", d);
    check(tpurt_set_device(checked_index(d.index())), "set_device");
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { (void)tpurt_set_device(d.index()); }
  c10::Stream getStream(c10::Device d) const override { return to_c10(current_stream(d.index())); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    tpurt_stream* s = nullptr;
    check(tpurt_stream_default(checked_index(d.index()), &s), "default_stream");
    return to_c10(s);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    tpurt_stream* s = nullptr;
    check(tpurt_stream_from_pool(checked_index(d.index()), priority, &s), "Stream");
    return to_c10(s);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return getNewStream(d, high_priority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    tpurt_stream* rs = to_runtime(s);
    c10::Stream old = to_c10(tpurt_stream_current(tpurt_stream_device(rs)));
    check(tpurt_stream_set_current(rs), "set_stream");
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 0;
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event) tpurt_event_destroy(static_cast<tpurt_event*>(event));
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) {
      int flags = flag == c10::EventFlag::BACKEND_DEFAULT ? TPURT_EVENT_TIMING : TPURT_EVENT_DEFAULT;
      tpurt_event* e = nullptr;
      check(tpurt_event_create(flags, &e), "Event");
      *event = e;
    }
    check(tpurt_event_record(static_cast<tpurt_event*>(*event), to_runtime(stream)), "Event.record");
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    check(tpurt_stream_wait_event(to_runtime(stream), static_cast<tpurt_event*>(event)), "Event.wait");
  }
  bool queryEvent(void* event) const override {
    return !event || tpurt_event_query(static_cast<tpurt_event*>(event));
  }
  void synchronizeEvent(void* event) const override {
    if (event) check(tpurt_event_synchronize(static_cast<tpurt_event*>(event)), "Event.synchronize");
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    check(tpurt_event_elapsed_ms(static_cast<tpurt_event*>(start), static_cast<tpurt_event*>(end), &ms),
          "Event.elapsed_time");
    return ms;
  }
  bool queryStream(const c10::Stream& s) const override { return tpurt_stream_query(to_runtime(s)); }
  void synchronizeStream(const c10::Stream& s) const override {
    check(tpurt_stream_synchronize(to_runtime(s)), "Stream.synchronize");
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    check(tpurt_device_synchronize(checked_index(index)), "synchronize");
  }
  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& s) const override {
    g_device_allocator.recordStream(ptr, s);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ------------------------------------------------------------------- hooks

struct TpuHooks final : at::PrivateUse1HooksInterface {
  void init() const override {
    ensure_initialized();
    mark_device_used();
  }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return tpurt_is_initialized(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check(tpurt_set_device(checked_index(d)), "set_device");
    mark_device_used();
  }
  c10::DeviceIndex getCurrentDevice() const override {
    ensure_initialized();
    return static_cast<c10::DeviceIndex>(tpurt_get_device());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    c10::DeviceIndex old = getCurrentDevice();
    if (d != old) setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<TpuGenerator>(checked_index(index));
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = tpurt_devptr_device(reinterpret_cast<tpurt_devptr>(data));
    TORCH_CHECK(d >= 0, "pointer ", data, " is not a TPU device address");
    return at::Device(kTpu, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override { return tpurt_host_is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_host_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

const bool g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  return true;
}();

}  // namespace
}  // namespace torch_tpu
