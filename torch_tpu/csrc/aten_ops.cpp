// ATen kernels of the `tpu` backend that the device foundation needs
// (allocation, views, copies in every direction, fill, .item(), set_,
// resize_) and the boxed fallback for every other operator. Kernels unpack
// at::Tensor into tpurt views and call the runtime; the copy kernel only
// decides which runtime transfers to chain (staging), it computes nothing.
#include "glue.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <set>

namespace torch_tpu {
namespace {

c10::Device resolve(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(kTpu));
  TORCH_CHECK(d.type() == kTpu, "expected a tpu device, got ", d);
  return c10::Device(kTpu, checked_index(d.has_index() ? d.index() : -1));
}

// ------------------------------------------------------------- factories

at::Tensor tpu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<c10::Device> device, std::optional<bool> pin_memory,
                     std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "tpu tensors support only the strided layout, got ",
              *layout);
  c10::DeviceGuard guard(resolve(device));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<c10::Device> device,
                             std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "tpu tensors support only the strided layout, got ",
              *layout);
  c10::DeviceGuard guard(resolve(device));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// ------------------------------------------------------------------ copy

// Same-dtype copies of dtypes the runtime does not compute with (float8,
// complex32, ...) move raw elements as integers of the same width.
at::ScalarType bits_type(at::ScalarType t) {
  if (has_runtime_dtype(t)) return t;
  switch (c10::elementSize(t)) {
    case 1: return at::kByte;
    case 2: return at::kShort;
    case 4: return at::kInt;
    case 8: return at::kLong;
    case 16: return at::kComplexDouble;
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, "copy of dtype ", t, " is not supported on TPU");
  }
}

// Both views describe the same shape (src already expanded to dst's shape).
void device_copy(const at::Tensor& dst, const at::Tensor& src) {
  bool same = dst.scalar_type() == src.scalar_type();
  at::ScalarType dt = same ? bits_type(dst.scalar_type()) : dst.scalar_type();
  at::ScalarType st = same ? bits_type(src.scalar_type()) : src.scalar_type();
  tpurt_view dv = view_of(dst, dt), sv = view_of(src, st);
  check(tpurt_copy_strided(current_stream(dst.device().index()), &dv, &sv), "copy_");
}

bool dense_same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes().equals(b.sizes()) && a.is_contiguous() &&
         b.is_contiguous();
}

void* host_ptr(const at::Tensor& t) { return t.data_ptr(); }
tpurt_devptr dev_ptr(const at::Tensor& t) { return reinterpret_cast<tpurt_devptr>(t.data_ptr()); }

void copy_tpu_to_tpu(const at::Tensor& dst, const at::Tensor& src_in) {
  at::Tensor src = src_in.expand_as(dst);
  c10::DeviceGuard guard(dst.device());
  if (src.device() == dst.device()) {
    if (dense_same(dst, src)) {
      check(tpurt_memcpy_d2d(current_stream(dst.device().index()), dev_ptr(dst), dev_ptr(src), dst.nbytes()),
            "copy_");
    } else {
      device_copy(dst, src);
    }
    return;
  }
  // Between chips: move src's elements densely, then lay them out on dst's chip.
  at::Tensor dense_src = src_in.contiguous();  // on src's chip
  at::Tensor landing = dense_same(dst, src_in) ? dst : at::empty(src_in.sizes(), src_in.options().device(dst.device()));
  check(tpurt_memcpy_d2d(current_stream(dst.device().index()), dev_ptr(landing), dev_ptr(dense_src),
                         dense_src.nbytes()),
        "copy_");
  if (!landing.is_same(dst)) device_copy(dst, landing.expand_as(dst));
}

void copy_cpu_to_tpu(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  c10::DeviceGuard guard(dst.device());
  tpurt_stream* s = current_stream(dst.device().index());
  if (dense_same(dst, src)) {
    bool async = non_blocking && tpurt_host_is_pinned(host_ptr(src));
    check(tpurt_memcpy_h2d(s, dev_ptr(dst), host_ptr(src), dst.nbytes(), async), "copy_");
    return;
  }
  // Stage: dense host elements -> device buffer -> cast / broadcast / stride on device.
  at::Tensor host = src.contiguous();
  at::Tensor staged = at::empty(host.sizes(), host.options().device(dst.device()));
  check(tpurt_memcpy_h2d(s, dev_ptr(staged), host_ptr(host), host.nbytes(), /*non_blocking=*/0), "copy_");
  device_copy(dst, staged.expand_as(dst));
}

void copy_tpu_to_cpu(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  c10::DeviceGuard guard(src.device());
  tpurt_stream* s = current_stream(src.device().index());
  if (dense_same(dst, src)) {
    bool async = non_blocking && tpurt_host_is_pinned(host_ptr(dst));
    check(tpurt_memcpy_d2h(s, host_ptr(dst), dev_ptr(src), dst.nbytes(), async), "copy_");
    return;
  }
  // Stage: cast / broadcast / densify on device -> host -> host strides.
  at::Tensor dense = at::empty(dst.sizes(), src.options().dtype(dst.scalar_type()));
  device_copy(dense, src.expand_as(dst));
  if (dst.is_contiguous()) {
    check(tpurt_memcpy_d2h(s, host_ptr(dst), dev_ptr(dense), dst.nbytes(), 0), "copy_");
  } else {
    at::Tensor host = at::empty(dst.sizes(), dst.options());
    check(tpurt_memcpy_d2h(s, host_ptr(host), dev_ptr(dense), host.nbytes(), 0), "copy_");
    dst.copy_(host);
  }
}

// The same memory without the lazy conjugate / negative bits (a view).
at::Tensor physical(const at::Tensor& t) {
  at::Tensor r = t;
  if (r.is_conj()) r = at::_conj(r);
  if (r.is_neg()) r = at::_neg_view(r);
  return r;
}

at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy_: undefined tensor");
  at::assert_no_internal_overlap(dst);
  // the source must broadcast to the destination's shape (the CPU's iterator
  // checks it, empty tensors included: seed 53470, [1, 1, 0] into [1, 0])
  auto shape = at::infer_size(dst.sizes(), self.sizes());
  TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  if (dst.numel() == 0) return dst;  // nothing to move
  // Copies move stored values; the conjugate / negative bits of the two
  // sides (PyTorch's lazy math views) are then reconciled on the
  // destination: stored dst = conj^(sc^dc) neg^(sn^dn) (stored src).
  bool flip_conj = self.is_conj() != dst.is_conj(), flip_neg = self.is_neg() != dst.is_neg();
  at::Tensor src = physical(self), out = physical(dst);
  bool src_tpu = src.device().type() == kTpu, dst_tpu = out.device().type() == kTpu;
  if (src_tpu && dst_tpu) {
    copy_tpu_to_tpu(out, src);
  } else if (dst_tpu) {
    TORCH_CHECK(src.device().is_cpu(), "copy_ from ", src.device(), " to ", out.device(), " is not supported");
    copy_cpu_to_tpu(out, src, non_blocking);
  } else {
    TORCH_CHECK(out.device().is_cpu(), "copy_ from ", src.device(), " to ", out.device(), " is not supported");
    copy_tpu_to_cpu(out, src, non_blocking);
  }
  if (flip_neg) out.neg_();
  if (flip_conj && out.is_complex()) at::view_as_real(out).select(-1, 1).neg_();
  return dst;
}

at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_output(dst, self.sizes());
  return tpu_copy_from(self, dst, false);
}

// ------------------------------------------------------------ fill, item

at::Tensor& tpu_fill_scalar(at::Tensor& self, const c10::Scalar& value) {
  if (self.numel() == 0) return self;
  c10::DeviceGuard guard(self.device());
  tpurt_view v = view_of(self);
  check(tpurt_fill(current_stream(self.device().index()), &v, to_runtime(value)), "fill_");
  return self;
}

at::Tensor& tpu_fill_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ",
              value.dim(), " dimensions.");
  if (value.device().is_cpu()) return tpu_fill_scalar(self, value.item());
  if (self.numel() == 0) return self;
  // Device value: a broadcast copy keeps it on the device (no sync).
  tpu_copy_from(value, self, false);
  return self;
}

at::Tensor& tpu_zero(at::Tensor& self) { return tpu_fill_scalar(self, 0); }

// An "efficient" zero tensor (autograd's zero gradients, e.g. sgn's
// backward for real inputs). The device has no storage-less zero tensors: it
// is a dense tensor of zeros (the same values; _is_zerotensor() is false).
at::Tensor tpu_efficientzerotensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                   std::optional<at::Layout> layout, std::optional<c10::Device> device,
                                   std::optional<bool> pin_memory) {
  at::Tensor t = tpu_empty(size, dtype, layout, device, pin_memory, std::nullopt);
  return tpu_zero(t);
}

c10::Scalar tpu_local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  tpurt_flush_hint(TPURT_FLUSH_ITEM);  // a deferred graph cut here is named after .item()
  tpu_copy_from(self.reshape({}), host, false);
  return host.item();
}

// aten::_assert_async (and .msg, which torch.compile graphs carry for
// torch._check and the like): CPU's check, a read of the value (CUDA asserts
// on the device asynchronously); in DeferAndFuse a cut, as .item() is.
bool tpu_is_nonzero(const at::Tensor& self) {
  TORCH_CHECK(self.numel() != 0, "Boolean value of Tensor with no values is ambiguous");
  TORCH_CHECK(self.numel() == 1, "Boolean value of Tensor with more than one value is ambiguous");
  c10::Scalar v = tpu_local_scalar_dense(self);
  if (v.isComplex()) return v.toComplexDouble() != c10::complex<double>(0, 0);
  if (v.isFloatingPoint()) return v.toDouble() != 0;
  if (v.isBoolean()) return v.toBool();
  return v.toLong() != 0;
}

void tpu_assert_async(const at::Tensor& self) {
  TORCH_CHECK(tpu_is_nonzero(self), "Expected Tensor with single nonzero value, but got zero");
}

void tpu_assert_async_msg(const at::Tensor& self, c10::string_view assert_msg) {
  TORCH_CHECK(tpu_is_nonzero(self), !assert_msg.empty() ? assert_msg : "Assertion is failed");
}

// ----------------------------------------------------- views and storage

// Grows the storage of impl (on its device) to hold its current geometry.
void grow_storage_for(c10::TensorImpl* impl) {
  if (impl->numel() == 0) return;
  size_t needed = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), impl->dtype().itemsize(),
                                                   impl->storage_offset());
  const at::Storage& storage = impl->unsafe_storage();
  if (needed > storage.nbytes()) resize_storage_bytes(storage, needed);
}

at::Tensor tpu_as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                          std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor tpu_view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor tpu_reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Like the CPU kernel, set_ grows a storage that is too small for the
// requested geometry (on the device, keeping its contents).
at::Tensor& tpu_set_storage(at::Tensor& self, at::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                            c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, std::move(source), storage_offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(storage_offset);
  at::OptionalIntArrayRef stride_opt = stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  at::native::resize_impl_cpu_(impl, size, stride_opt, /*resize_storage=*/false);
  grow_storage_for(impl);
  return self;
}

at::Tensor& tpu_set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  at::Storage storage(at::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return tpu_set_storage(self, std::move(storage), 0, {0}, {});
}

const at::Tensor& tpu_resize(const at::Tensor& self, c10::IntArrayRef size,
                             std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  at::native::resize_impl_cpu_(impl, size, std::nullopt, /*resize_storage=*/false);
  grow_storage_for(impl);
  if (memory_format) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

// -------------------------------------------------------------- fallback

std::mutex g_fallback_mutex;
bool g_cpu_fallback = false;
std::map<std::string, int64_t> g_fallback_counts;

void check_same_chip(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  const auto n = op.schema().arguments().size();
  std::optional<c10::Device> seen;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kTpu) return;
    if (!seen) seen = t.device();
    TORCH_CHECK(*seen == t.device(),
                "Expected all tensors to be on the same device, but found at least two devices, ", *seen, " and ",
                t.device(), "!");
  };
  for (const auto& iv : torch::jit::last(*stack, n)) {
    if (iv.isTensor()) {
      visit(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) visit(t);
    } else if (iv.isOptionalTensorList()) {
      for (const auto& t : iv.toOptionalTensorList()) {
        std::optional<at::Tensor> ot = t;
        if (ot) visit(*ot);
      }
    }
  }
}

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_same_chip(op, stack);
  std::string name = c10::toString(op.operator_name());
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mutex);
    TORCH_CHECK_NOT_IMPLEMENTED(g_cpu_fallback, "operator '", name,
                                "' is not implemented for TPU. To run it on the CPU instead (slow: the tensors "
                                "are copied to the host and back), set TORCH_TPU_CPU_FALLBACK=1 or call "
                                "torch_tpu._internal.execution_mode.cpu_fallback_mode(True).");
    first = g_fallback_counts[name]++ == 0;
  }
  if (first) {
    TORCH_WARN("operator '", name,
               "' is not implemented for TPU; it runs on the CPU (CPU fallback is on). Every fallback is counted "
               "in torch.tpu.fallback_stats().");
  }
  at::native::cpu_fallback(op, stack);
}

}  // namespace

void set_cpu_fallback(bool on) {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  g_cpu_fallback = on;
}

bool cpu_fallback_enabled() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return g_cpu_fallback;
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return {g_fallback_counts.begin(), g_fallback_counts.end()};
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  g_fallback_counts.clear();
}

// A strided tpu tensor and a strided CPU (or tpu) tensor can take each
// other's metadata (`param.data = moved`): Module.to() then keeps the
// Parameter objects, so weights shared between modules stay shared. The
// core check knows only its built-in dense backends.
bool tpu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return self.key_set() == from.key_set() || (dense(self) && dense(from));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(tpu_has_compatible_shallow_copy_type));
  m.impl("empty.memory_format", TORCH_FN(tpu_empty));
  m.impl("empty_strided", TORCH_FN(tpu_empty_strided));
  m.impl("as_strided", TORCH_FN(tpu_as_strided));
  m.impl("view", TORCH_FN(tpu_view));
  m.impl("_reshape_alias", TORCH_FN(tpu_reshape_alias));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", TORCH_FN(tpu_resize));
  m.impl("_copy_from", TORCH_FN(tpu_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(tpu_copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(tpu_local_scalar_dense));
  m.impl("_assert_async", TORCH_FN(tpu_assert_async));
  m.impl("_assert_async.msg", TORCH_FN(tpu_assert_async_msg));
  m.impl("fill_.Scalar", TORCH_FN(tpu_fill_scalar));
  m.impl("fill_.Tensor", TORCH_FN(tpu_fill_tensor));
  m.impl("zero_", TORCH_FN(tpu_zero));
  m.impl("_efficientzerotensor", TORCH_FN(tpu_efficientzerotensor));
  m.impl("set_.source_Storage", TORCH_FN(static_cast<at::Tensor& (*)(at::Tensor&, at::Storage)>(&at::native::set_)));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(tpu_set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  m.impl("set_", TORCH_FN(tpu_set_empty));
}

// _copy_from reconciles the lazy conjugate / negative bits itself: the
// generic math-bit fallbacks would materialize its inputs with clone(),
// which copies through _copy_from again (endless recursion).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>());
}

}  // namespace torch_tpu
