// ATen kernels of the `tpu` backend for indexing and shape ops, random
// sampling and losses. Each kernel checks arguments like PyTorch, computes
// output metadata (shapes, strides, restrided views for advanced indexing)
// and calls the runtime (tpurt.h); no element is computed here.
#include "glue.h"

#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <ATen/core/DistributionsHelper.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/IndexingUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <mutex>

namespace torch_tpu {
namespace {

c10::DeviceIndex didx(const at::Tensor& t) { return t.device().index(); }
tpurt_stream* stream_of(const at::Tensor& t) { return current_stream(didx(t)); }

// index tensors may come from the host: move them to self's device
at::Tensor on_device(const at::Tensor& idx, const at::Tensor& self) {
  return idx.device() == self.device() ? idx : idx.to(self.device());
}

void resize_out(at::Tensor& out, c10::IntArrayRef sizes, const char* op) {
  at::native::resize_output(out, sizes);
}

// An out tensor that must be resized takes the given strides, as PyTorch's structured kernels restride
// theirs (one of the right size keeps its own).
void resize_out_strided(at::Tensor& out, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  if (at::native::resize_output(out, sizes)) out.as_strided_(sizes, strides);
}

// ===================================================================== index_select

}  // namespace

// Raises IndexError (PyTorch's message) for the first index outside [0, size). For the paths that
// launch no kernel (an empty self): the index is read on the host.
void check_indices_on_host(const at::Tensor& index, int64_t size, int64_t dim, const char* op) {
  at::Tensor h = index.reshape({-1}).to(at::kCPU, at::kLong);
  const int64_t* v = h.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < h.numel(); ++i)
    TORCH_CHECK_INDEX(v[i] >= 0 && v[i] < size, op, ": index ", v[i], " is out of bounds for dimension ", dim,
                      " with size ", size);
}

namespace {

at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index_in, at::Tensor& out) {
  TORCH_CHECK_INDEX(index_in.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index_in.scalar_type() == at::kLong || index_in.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  TORCH_CHECK(self.scalar_type() == out.scalar_type(), "index_select(): self and result must have the same scalar type");
  c10::DeviceGuard g(self.device());
  at::Tensor index = on_device(index_in, self);
  dim = at::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes = self.sizes().vec();
  if (self.dim() > 0) sizes[dim] = index.numel();
  resize_out(out, sizes, "index_select");
  if (self.dim() > 0 && self.numel() == 0) {
    // nothing to read, but the CPU still refuses a bad index into an empty self: every index when the
    // indexed dim is empty, else each one out of range (read on the host: this path moves no data)
    if (index.numel() > 0) {
      TORCH_CHECK(self.dim() == 1 || self.size(dim) > 0, "index_select(): self indexing axis dim should be positive");
      check_indices_on_host(index, self.size(dim), dim, "index_select");
    }
    return out;
  }
  if (out.numel() == 0) return out;
  if (self.dim() == 0) {
    TORCH_CHECK_INDEX(index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ",
                      index.numel(), " value(s)");
    at::Tensor s1 = self.view({1}), o1 = out.view({1});
    tpurt_view ov = view_of(o1), sv = view_of(s1), iv = view_of(index.reshape({1}));
    check(tpurt_index_select(stream_of(self), &ov, &sv, 0, &iv), "index_select");
    return out;
  }
  tpurt_view ov = view_of(out), sv = view_of(self), iv = view_of(index);
  check(tpurt_index_select(stream_of(self), &ov, &sv, static_cast<int>(dim), &iv), "index_select");
  return out;
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  at::Tensor out = at::empty({0}, self.options());
  return index_select_out(self, dim, index, out);
}

// ===================================================================== gather / scatter

// A 0-dim tensor is a 1-element vector to the gather/scatter kernels (which
// need the same ndim for every view), as PyTorch treats it.
at::Tensor as1d(const at::Tensor& t) { return t.dim() == 0 ? t.view({1}) : t; }

void gather_shape_check(const at::Tensor& self, int64_t dim, const at::Tensor& index, const char* op) {
  // Like CPU, an empty index of any dtype is accepted (nothing is read).
  TORCH_CHECK(index.numel() == 0 || index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, op,
              "(): Expected dtype int32/int64 for index");
  auto sd = std::max<int64_t>(self.dim(), 1), id = std::max<int64_t>(index.dim(), 1);
  TORCH_CHECK(index.numel() == 0 || sd == id, "Index tensor must have the same number of dimensions as input tensor");
}

at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index_in, bool sparse_grad,
                       at::Tensor& out) {
  c10::DeviceGuard g(self.device());
  at::Tensor index = on_device(index_in, self);
  dim = at::maybe_wrap_dim(dim, self.dim());
  gather_shape_check(self, dim, index, "gather");
  resize_out(out, index.sizes(), "gather");
  if (index.numel() == 0) return out;
  for (int64_t d = 0; d < self.dim(); ++d)
    if (d != dim)
      TORCH_CHECK(index.size(d) <= self.size(d), "Size does not match at dimension ", d, " expected index ",
                  index.sizes(), " to be no larger than self ", self.sizes(), " apart from dimension ", dim);
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "gather(): Expected out tensor to have dtype ",
              self.scalar_type(), ", but got ", out.scalar_type(), " instead");
  tpurt_view ov = view_of(as1d(out)), sv = view_of(as1d(self)), iv = view_of(as1d(index));
  check(tpurt_gather(stream_of(self), &ov, &sv, static_cast<int>(dim), &iv), "gather");
  return out;
}

at::Tensor gather(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad) {
  at::Tensor out = at::empty({0}, self.options());
  return gather_out(self, dim, index, sparse_grad, out);
}

tpurt_scatter_op reduce_of(c10::string_view r, bool two) {
  if (r == "sum" || r == "add") return TPURT_SCATTER_SUM;
  if (r == "prod" || r == "multiply") return TPURT_SCATTER_PROD;
  if (two && r == "mean") return TPURT_SCATTER_MEAN;
  if (two && r == "amax") return TPURT_SCATTER_AMAX;
  if (two && r == "amin") return TPURT_SCATTER_AMIN;
  if (two) TORCH_CHECK(false, "reduce argument must be either sum, prod, mean, amax or amin, got ", r);
  TORCH_CHECK(false, "reduce argument must be either add or multiply, got ", r);
}

// self is modified in place
void scatter_impl(at::Tensor& self, int64_t dim, const at::Tensor& index_in, const at::Tensor* src,
                  const c10::Scalar& value, tpurt_scatter_op op, bool include_self, const char* name) {
  c10::DeviceGuard g(self.device());
  at::Tensor index = on_device(index_in, self);
  dim = at::maybe_wrap_dim(dim, self.dim());
  gather_shape_check(self, dim, index, name);
  // as the CPU: no write into a tensor whose elements share memory, nor over the index or the source
  at::assert_no_internal_overlap(self);
  at::assert_no_overlap(self, index);
  if (src) at::assert_no_overlap(self, *src);
  // the mean of booleans is not defined (the CPU refuses it even with no index)
  TORCH_CHECK_NOT_IMPLEMENTED(!(op == TPURT_SCATTER_MEAN && self.scalar_type() == at::kBool),
                              "scatter_reduce(): reduce='mean' is not implemented for 'Bool'");
  if (index.numel() == 0) return;
  if (src) {
    TORCH_CHECK(src->scalar_type() == self.scalar_type(), name, "(): Expected self.dtype to be equal to src.dtype");
    TORCH_CHECK(src->dim() == index.dim() || (src->dim() <= 1 && index.dim() <= 1),
                "Index tensor must have the same number of dimensions as src tensor");
  }
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (d != dim)
      TORCH_CHECK(index.size(d) <= self.size(d), "Expected index ", index.sizes(), " to be no larger than self ",
                  self.sizes(), " apart from dimension ", dim, src ? " and to be no larger size than src " : "",
                  src ? c10::str(src->sizes()) : "");
    if (src) TORCH_CHECK(index.size(d) <= src->size(d), "Expected index ", index.sizes(),
                         " to be no larger than src ", src->sizes());
  }
  tpurt_view sv = view_of(as1d(self)), iv = view_of(as1d(index));
  tpurt_view rv{};
  at::Tensor srcd;
  if (src) {
    srcd = on_device(*src, self);
    rv = view_of(as1d(srcd));
  }
  check(tpurt_scatter(stream_of(self), &sv, static_cast<int>(dim), &iv, src ? &rv : nullptr, to_runtime(value), op,
                      include_self),
        name);
}

at::Tensor& scatter_src_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  scatter_impl(self, dim, index, &src, 0, TPURT_SCATTER_ASSIGN, true, "scatter");
  return self;
}
at::Tensor& scatter_value_(at::Tensor& self, int64_t dim, const at::Tensor& index, const c10::Scalar& v) {
  scatter_impl(self, dim, index, nullptr, v, TPURT_SCATTER_ASSIGN, true, "scatter");
  return self;
}
at::Tensor& scatter_reduce_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                            c10::string_view reduce) {
  scatter_impl(self, dim, index, &src, 0, reduce_of(reduce, false), true, "scatter");
  return self;
}
at::Tensor& scatter_value_reduce_(at::Tensor& self, int64_t dim, const at::Tensor& index, const c10::Scalar& v,
                                  c10::string_view reduce) {
  scatter_impl(self, dim, index, nullptr, v, reduce_of(reduce, false), true, "scatter");
  return self;
}
at::Tensor& scatter_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  scatter_impl(self, dim, index, &src, 0, TPURT_SCATTER_SUM, true, "scatter_add");
  return self;
}
at::Tensor& scatter_reduce_two_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                                c10::string_view reduce, bool include_self) {
  scatter_impl(self, dim, index, &src, 0, reduce_of(reduce, true), include_self, "scatter_reduce");
  return self;
}

// out variants: out = self.clone(); out.op_(...). The functional variants' result is contiguous, as
// the CPU's (structured ops: an as_strided view of the result reads the same elements)
at::Tensor& prep_out(const at::Tensor& self, at::Tensor& out) {
  if (!out.is_same(self)) {
    resize_out(out, self.sizes(), "scatter");
    out.copy_(self);
  }
  return out;
}
at::Tensor& scatter_src_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                            at::Tensor& out) {
  return scatter_src_(prep_out(self, out), dim, index, src);
}
at::Tensor& scatter_value_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const c10::Scalar& v,
                              at::Tensor& out) {
  return scatter_value_(prep_out(self, out), dim, index, v);
}
at::Tensor& scatter_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                               c10::string_view reduce, at::Tensor& out) {
  return scatter_reduce_(prep_out(self, out), dim, index, src, reduce);
}
at::Tensor& scatter_value_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                     const c10::Scalar& v, c10::string_view reduce, at::Tensor& out) {
  return scatter_value_reduce_(prep_out(self, out), dim, index, v, reduce);
}
at::Tensor& scatter_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                            at::Tensor& out) {
  return scatter_add_(prep_out(self, out), dim, index, src);
}
at::Tensor& scatter_reduce_two_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                   const at::Tensor& src, c10::string_view reduce, bool include_self,
                                   at::Tensor& out) {
  return scatter_reduce_two_(prep_out(self, out), dim, index, src, reduce, include_self);
}
at::Tensor scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  at::Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return scatter_src_(out, dim, index, src);
}
at::Tensor scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index, const c10::Scalar& v) {
  at::Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return scatter_value_(out, dim, index, v);
}
at::Tensor scatter_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                          c10::string_view reduce) {
  at::Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return scatter_reduce_(out, dim, index, src, reduce);
}
at::Tensor scatter_value_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const c10::Scalar& v,
                                c10::string_view reduce) {
  at::Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return scatter_value_reduce_(out, dim, index, v, reduce);
}
at::Tensor scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  at::Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return scatter_add_(out, dim, index, src);
}
at::Tensor scatter_reduce_two(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                              c10::string_view reduce, bool include_self) {
  at::Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return scatter_reduce_two_(out, dim, index, src, reduce, include_self);
}

// ===================================================================== index_add

at::Tensor& index_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index_in, const at::Tensor& source,
                          const c10::Scalar& alpha, at::Tensor& out) {
  c10::DeviceGuard g(self.device());
  dim = at::maybe_wrap_dim(dim, self.dim());
  at::Tensor index = on_device(index_in, self);
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_add_(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_add_(): Expected dtype int32/int64 for index");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_add_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  TORCH_CHECK(dim == 0 || dim < source.dim(), "index_add_(): Indexing dim ", dim, " is out of bounds of tensor");
  TORCH_CHECK(index.numel() == (source.dim() == 0 ? 1 : source.size(dim)),
              "index_add_(): Number of indices (", index.numel(), ") should be equal to source.size(dim) (",
              (source.dim() == 0 ? 1 : source.size(dim)), ")");
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, index);
  at::assert_no_overlap(out, source);
  prep_out(self, out);
  // as the CPU: nothing to add (no index is read) into an empty tensor of 2+ dimensions
  if (index.numel() == 0 || (self.dim() > 1 && self.numel() == 0)) return out;
  at::Tensor o = out.dim() == 0 ? out.view({1}) : out;
  at::Tensor src = on_device(source, self);
  src = src.dim() == 0 ? src.view({1}) : src;
  tpurt_view ov = view_of(o), rv = view_of(src), iv = view_of(index.reshape({-1}));
  check(tpurt_index_add(stream_of(self), &ov, static_cast<int>(dim), &iv, &rv, alpha.toDouble(), INT64_MIN, 0),
        "index_add");
  return out;
}
at::Tensor& index_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                       const c10::Scalar& alpha) {
  return index_add_out(self, dim, index, source, alpha, self);
}
at::Tensor index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                     const c10::Scalar& alpha) {
  at::Tensor out = at::empty({0}, self.options());
  return index_add_out(self, dim, index, source, alpha, out);
}

// ===================================================================== advanced indexing

// Metadata of an advanced index: src restrided to the result shape (stride
// 0 over the indexed region), index tensors broadcast to it, and the sizes
// and element strides of the indexed dims.
struct AdvIndex {
  at::Tensor src;
  std::vector<at::Tensor> indices;
  std::vector<int64_t> sizes, strides;
};

AdvIndex make_adv(at::Tensor self, const c10::List<std::optional<at::Tensor>>& orig) {
  at::native::checkIndexTensorTypes(orig, /*allow_int=*/true);
  auto idx = at::native::expandTensors(self, orig, /*ensure_same_device=*/true);
  for (auto& t : idx)
    if (t.defined()) t = on_device(t, self);
  try {
    idx = at::expand_outplace(idx);
  } catch (std::exception&) {
    std::string shapes;
    for (auto& t : idx) {
      if (!shapes.empty()) shapes += ", ";
      shapes += t.defined() ? c10::str(t.sizes()) : "None";
    }
    TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ", shapes);
  }
  while (static_cast<int64_t>(idx.size()) < self.dim()) idx.emplace_back();
  TORCH_CHECK_INDEX(static_cast<int64_t>(idx.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", idx.size(), ")");
  if (!at::native::hasContiguousSubspace(idx)) std::tie(self, idx) = at::native::transposeToFront(self, idx);
  AdvIndex r;
  int64_t before = 0, after = 0, nidx = 0;
  c10::IntArrayRef repl;
  for (int64_t d = 0; d < static_cast<int64_t>(idx.size()); ++d) {
    if (!idx[d].defined()) {
      if (nidx == 0) before++; else after++;
    } else {
      nidx++;
      repl = idx[d].sizes();
      r.sizes.push_back(self.size(d));
      r.strides.push_back(self.stride(d));
    }
  }
  for (auto s : r.sizes)
    TORCH_CHECK_INDEX(!(s == 0 && c10::multiply_integers(repl) != 0),
                      "index is out of bounds for dimension with size 0");
  // restride src: [before dims] + repl (stride 0) + [after dims]
  std::vector<int64_t> shape, stride;
  for (int64_t d = 0; d < before; ++d) shape.push_back(self.size(d)), stride.push_back(self.stride(d));
  for (auto s : repl) shape.push_back(s), stride.push_back(0);
  for (int64_t d = self.dim() - after; d < self.dim(); ++d) shape.push_back(self.size(d)), stride.push_back(self.stride(d));
  r.src = self.as_strided(shape, stride);
  for (auto& t : idx) {
    if (!t.defined()) continue;
    std::vector<int64_t> s2(before, 1);
    for (auto s : t.sizes()) s2.push_back(s);
    for (int64_t k = 0; k < after; ++k) s2.push_back(1);
    at::Tensor ti = t.scalar_type() == at::kInt ? t : t.to(at::kLong);
    r.indices.push_back(ti.reshape(s2).expand(shape));
  }
  return r;
}

at::Tensor& index_out(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices, at::Tensor& out) {
  c10::DeviceGuard g(self.device());
  TORCH_CHECK_INDEX(static_cast<int64_t>(indices.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", indices.size(), ")");
  AdvIndex a = make_adv(self, indices);
  resize_out(out, a.src.sizes(), "index");
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "index_out: expected out dtype ", self.scalar_type());
  if (out.numel() == 0) return out;
  std::vector<tpurt_view> iv;
  for (auto& t : a.indices) iv.push_back(view_of(t));
  tpurt_view ov = view_of(out), sv = view_of(a.src);
  check(tpurt_index(stream_of(self), &ov, &sv, iv.data(), static_cast<int>(iv.size()), a.sizes.data(),
                    a.strides.data()),
        "index");
  return out;
}

at::Tensor index_tensor(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  at::Tensor out = at::empty({0}, self.options());
  return index_out(self, indices, out);
}

at::Tensor& index_put_impl_(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                            const at::Tensor& values_in, bool accumulate, bool unsafe) {
  c10::DeviceGuard g(self.device());
  TORCH_CHECK_INDEX(static_cast<int64_t>(indices.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", indices.size(), ")");
  TORCH_CHECK(values_in.scalar_type() == self.scalar_type() || values_in.device().is_cpu(),
              "Index put requires the source and destination dtypes match, got ", self.scalar_type(),
              " for the destination and ", values_in.scalar_type(), " for the source.");
  AdvIndex a = make_adv(self, indices);
  at::Tensor values = on_device(values_in, self).to(self.scalar_type());
  TORCH_CHECK(at::is_expandable_to(values.sizes(), a.src.sizes()), "shape mismatch: value tensor of shape ",
              values.sizes(), " cannot be broadcast to indexing result of shape ", a.src.sizes());
  if (a.src.numel() == 0) return self;
  at::Tensor v = values.expand(a.src.sizes());
  std::vector<tpurt_view> iv;
  for (auto& t : a.indices) iv.push_back(view_of(t));
  tpurt_view dv = view_of(a.src), vv = view_of(v);
  check(tpurt_index_put(stream_of(self), &dv, &vv, iv.data(), static_cast<int>(iv.size()), a.sizes.data(),
                        a.strides.data(), accumulate),
        "index_put_");
  return self;
}

at::Tensor& index_put_(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                       const at::Tensor& values, bool accumulate) {
  return index_put_impl_(self, indices, values, accumulate, false);
}

// ===================================================================== nonzero (masked_fill: aten_elementwise.cpp)

at::Tensor& nonzero_out(const at::Tensor& self, at::Tensor& out) {
  c10::DeviceGuard g(self.device());
  TORCH_CHECK(out.scalar_type() == at::kLong, "nonzero: Expected out tensor to have scalar type Long but got ",
              out.scalar_type());
  at::Tensor count = at::empty({}, self.options().dtype(at::kLong));
  tpurt_view cv = view_of(count), iv = view_of(self);
  tpurt_stream* s = stream_of(self);
  check(tpurt_count_nonzero(s, &cv, &iv), "nonzero");
  int64_t n = 0;
  check(tpurt_memcpy_d2h(s, &n, reinterpret_cast<tpurt_devptr>(count.data_ptr()), sizeof n, 0), "nonzero");
  if (out.sizes() != c10::IntArrayRef({n, self.dim()})) {
    // the CPU's layout: [n, ndim] with strides (1, n), the transpose of an [ndim, n] buffer (a
    // .view of the result fails or succeeds as on the CPU); an out of the right size keeps its own
    resize_out(out, {self.dim(), n}, "nonzero");
    out.t_();
  }
  if (n == 0 || self.dim() == 0) return out;
  tpurt_view ov = view_of(out);
  check(tpurt_nonzero(s, &ov, &iv), "nonzero");
  return out;
}
at::Tensor nonzero(const at::Tensor& self) {
  at::Tensor out = at::empty({0}, self.options().dtype(at::kLong));
  return nonzero_out(self, out);
}

at::Tensor& masked_select_out(const at::Tensor& self, const at::Tensor& mask_in, at::Tensor& out) {
  TORCH_CHECK(mask_in.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  c10::DeviceGuard g(self.device());
  at::Tensor mask = on_device(mask_in, self);
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor se = self.expand(shape), me = mask.expand(shape);
  if (shape.empty()) {  // 0-dim operands: a one-element vector
    se = se.reshape({1});
    me = me.reshape({1});
  }
  c10::List<std::optional<at::Tensor>> idx;
  idx.push_back(me);
  at::Tensor r = index_tensor(se, idx);
  resize_out(out, {r.numel()}, "masked_select");
  out.copy_(r.reshape({-1}));
  return out;
}
at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  at::Tensor out = at::empty({0}, self.options());
  return masked_select_out(self, mask, out);
}

// ===================================================================== embedding backward

at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices_in, int64_t num_weights,
                                    int64_t padding_idx, bool scale_grad_by_freq) {
  c10::DeviceGuard g(grad.device());
  at::Tensor indices = on_device(indices_in, grad).reshape({-1});
  at::Tensor gw = at::zeros({num_weights, grad.size(-1)}, grad.options());
  if (indices.numel() == 0) return gw;
  at::Tensor g2 = grad.reshape({indices.numel(), grad.size(-1)});
  tpurt_view wv = view_of(gw), iv = view_of(indices), gv = view_of(g2);
  check(tpurt_index_add(stream_of(grad), &wv, 0, &iv, &gv, 1.0, padding_idx < 0 ? INT64_MIN : padding_idx,
                        scale_grad_by_freq),
        "embedding_backward");
  return gw;
}

// ===================================================================== cat, flip, roll, tril

at::Tensor& cat_out(const at::ITensorListRef& tensors_ref, int64_t dim, at::Tensor& out) {
  auto tensors = tensors_ref.materialize();
  TORCH_CHECK(!tensors.empty(), "torch.cat(): expected a non-empty list of Tensors");
  auto skip = [](const at::Tensor& t) { return t.dim() == 1 && t.numel() == 0; };
  const at::Tensor* ref = nullptr;
  for (const at::Tensor& t : tensors)
    if (!skip(t)) { ref = &t; break; }
  std::vector<at::Tensor> list;
  for (const at::Tensor& t : tensors) list.push_back(t);
  at::ScalarType dt = at::native::result_type(list);
  TORCH_CHECK(c10::canCast(dt, out.scalar_type()), "torch.cat(): input types can't be cast to the desired output type ",
              out.scalar_type());
  if (!ref) {
    resize_out(out, {0}, "cat");
    return out;
  }
  for (const at::Tensor& t : tensors) TORCH_CHECK(t.dim() > 0, "zero-dimensional tensor cannot be concatenated");
  dim = at::maybe_wrap_dim(dim, ref->dim());
  std::vector<int64_t> shape = ref->sizes().vec();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (skip(t)) continue;
    TORCH_CHECK(t.dim() == ref->dim(), "Tensors must have same number of dimensions: got ", ref->dim(), " and ",
                t.dim());
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != dim)
        TORCH_CHECK(t.size(d) == ref->size(d), "Sizes of tensors must match except in dimension ", dim,
                    ". Expected size ", ref->size(d), " but got size ", t.size(d), " for tensor number ", i,
                    " in the list.");
    TORCH_CHECK(t.device() == out.device(), "Expected all tensors to be on the same device, but found at least two "
                "devices, ", out.device(), " and ", t.device(), "!");
    total += t.size(dim);
  }
  shape[dim] = total;
  resize_out(out, shape, "cat");
  c10::DeviceGuard g(out.device());
  int64_t off = 0;
  for (const at::Tensor& t : tensors) {
    if (skip(t)) continue;
    int64_t n = t.size(dim);
    if (n == 0) continue;
    at::Tensor slot = out.narrow(dim, off, n);
    tpurt_view dv = view_of(slot), sv = view_of(t);
    check(tpurt_copy_strided(stream_of(out), &dv, &sv), "cat");
    off += n;
  }
  return out;
}

at::Tensor cat(const at::ITensorListRef& tensors_ref, int64_t dim) {
  auto tensors = tensors_ref.materialize();
  TORCH_CHECK(!tensors.empty(), "torch.cat(): expected a non-empty list of Tensors");
  std::vector<at::Tensor> list;
  for (const at::Tensor& t : tensors) list.push_back(t);
  at::ScalarType dt = at::native::result_type(list);
  at::Tensor out = at::empty({0}, tensors[0].get().options().dtype(dt));
  return cat_out(tensors_ref, dim, out);
}

// flip: a copy from a view with negated strides
at::Tensor flip(const at::Tensor& self, c10::IntArrayRef dims) {
  c10::DeviceGuard g(self.device());
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  if (self.numel() == 0) return out;
  auto flags = at::dim_list_to_bitset(dims, self.dim());
  tpurt_view sv = view_of(self);
  int64_t es = static_cast<int64_t>(self.element_size());
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!flags[d]) continue;
    sv.ptr += static_cast<uint64_t>((self.size(d) - 1) * self.stride(d) * es);
    sv.strides[d] = -self.stride(d);
  }
  tpurt_view ov = view_of(out);
  check(tpurt_copy_strided(stream_of(self), &ov, &sv), "flip");
  return out;
}

// roll: per rolled dim, two slice copies
at::Tensor roll(const at::Tensor& self, c10::IntArrayRef shifts, c10::IntArrayRef dims) {
  c10::DeviceGuard g(self.device());
  if (dims.empty()) {
    TORCH_CHECK(shifts.size() == 1, "roll: shifts must be a single value when dims is empty");
    return (roll)(self.flatten(), shifts, c10::IntArrayRef{0}).view(self.sizes());
  }
  TORCH_CHECK(shifts.size() == dims.size(), "shifts and dimensions must align. shifts: ", shifts.size(), ", dims:",
              dims.size());
  at::Tensor cur = self;
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = at::maybe_wrap_dim(dims[i], self.dim());
    at::Tensor out = at::empty_like(cur, at::MemoryFormat::Contiguous);
    int64_t n = cur.size(d);
    if (n == 0 || cur.numel() == 0) {
      cur = cur.clone();
      continue;
    }
    int64_t s = ((shifts[i] % n) + n) % n;
    auto cp = [&](const at::Tensor& dst, const at::Tensor& src) {
      if (dst.numel() == 0) return;
      tpurt_view dv = view_of(dst), sv = view_of(src);
      check(tpurt_copy_strided(stream_of(self), &dv, &sv), "roll");
    };
    cp(out.narrow(d, s, n - s), cur.narrow(d, 0, n - s));
    cp(out.narrow(d, 0, s), cur.narrow(d, n - s, s));
    cur = out;
  }
  return cur;
}

at::Tensor& tril_triu_out(const at::Tensor& self, int64_t diagonal, at::Tensor& out, bool upper) {
  TORCH_CHECK(self.dim() >= 2, upper ? "triu" : "tril", ": input tensor must have at least 2 dimensions");
  c10::DeviceGuard g(self.device());
  if (!out.is_same(self)) resize_out(out, self.sizes(), "tril");
  if (self.numel() == 0) return out;
  tpurt_view ov = view_of(out), iv = view_of(self);
  check(tpurt_tril(stream_of(self), &ov, &iv, diagonal, upper), upper ? "triu" : "tril");
  return out;
}
at::Tensor& tril_out(const at::Tensor& self, int64_t d, at::Tensor& out) { return tril_triu_out(self, d, out, false); }
at::Tensor& triu_out(const at::Tensor& self, int64_t d, at::Tensor& out) { return tril_triu_out(self, d, out, true); }
at::Tensor tril(const at::Tensor& self, int64_t d) {
  at::Tensor out = at::empty({0}, self.options());
  return tril_out(self, d, out);
}
at::Tensor triu(const at::Tensor& self, int64_t d) {
  at::Tensor out = at::empty({0}, self.options());
  return triu_out(self, d, out);
}
at::Tensor& tril_(at::Tensor& self, int64_t d) { return tril_out(self, d, self); }
at::Tensor& triu_(at::Tensor& self, int64_t d) { return triu_out(self, d, self); }

// ===================================================================== padding

at::Tensor& pad_out(const at::Tensor& self, c10::IntArrayRef padding, at::Tensor& out, tpurt_pad_mode mode,
                    int npad, const char* op) {
  TORCH_CHECK(static_cast<int>(padding.size()) == 2 * npad, op, ": padding size is expected to be ", 2 * npad,
              ", but got: ", padding.size());
  TORCH_CHECK(self.dim() == npad + 1 || self.dim() == npad + 2, op, ": Expected ", npad + 1, "D or ", npad + 2,
              "D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: ",
              self.sizes());
  c10::DeviceGuard g(self.device());
  // PyTorch's padding lists the last dim first
  int64_t pads[6];
  for (int i = 0; i < npad; ++i) {
    pads[2 * (npad - 1 - i)] = padding[2 * i];
    pads[2 * (npad - 1 - i) + 1] = padding[2 * i + 1];
  }
  std::vector<int64_t> shape = self.sizes().vec();
  int first = static_cast<int>(self.dim()) - npad;
  for (int i = 0; i < npad; ++i) {
    int64_t in = self.size(first + i), o = in + pads[2 * i] + pads[2 * i + 1];
    if (mode == TPURT_PAD_REFLECT)
      TORCH_CHECK(pads[2 * i] < in && pads[2 * i + 1] < in, "Argument #4: Padding size should be less than the "
                  "corresponding input dimension, but got: padding (", pads[2 * i], ", ", pads[2 * i + 1],
                  ") at dimension ", first + i, " of input ", self.sizes());
    TORCH_CHECK(o >= 1, op, ": input (", self.sizes(), ") and padding give an output size < 1");
    shape[first + i] = o;
  }
  resize_out(out, shape, op);
  if (out.numel() == 0) return out;
  tpurt_view ov = view_of(out), iv = view_of(self);
  check(tpurt_pad(stream_of(self), &ov, &iv, mode, npad, pads), op);
  return out;
}

at::Tensor& pad_backward_out(const at::Tensor& grad_out, const at::Tensor& self, c10::IntArrayRef padding,
                             at::Tensor& grad_in, tpurt_pad_mode mode, int npad, const char* op) {
  c10::DeviceGuard g(self.device());
  int64_t pads[6];
  for (int i = 0; i < npad; ++i) {
    pads[2 * (npad - 1 - i)] = padding[2 * i];
    pads[2 * (npad - 1 - i) + 1] = padding[2 * i + 1];
  }
  resize_out(grad_in, self.sizes(), op);
  if (grad_in.numel() == 0) return grad_in;
  at::Tensor go = grad_out.contiguous();
  tpurt_view gi = view_of(grad_in), gv = view_of(go);
  check(tpurt_pad_backward(stream_of(self), &gi, &gv, mode, npad, pads), op);
  return grad_in;
}

#define PAD_FNS(NAME, MODE, NP)                                                                                  \
  at::Tensor& NAME##_out(const at::Tensor& self, c10::IntArrayRef p, at::Tensor& out) {                          \
    return pad_out(self, p, out, MODE, NP, #NAME);                                                               \
  }                                                                                                              \
  at::Tensor NAME(const at::Tensor& self, c10::IntArrayRef p) {                                                  \
    at::Tensor out = at::empty({0}, self.options());                                                             \
    return NAME##_out(self, p, out);                                                                             \
  }                                                                                                              \
  at::Tensor& NAME##_backward_out(const at::Tensor& go, const at::Tensor& self, c10::IntArrayRef p,              \
                                  at::Tensor& gi) {                                                              \
    return pad_backward_out(go, self, p, gi, MODE, NP, #NAME "_backward");                                       \
  }                                                                                                              \
  at::Tensor NAME##_backward(const at::Tensor& go, const at::Tensor& self, c10::IntArrayRef p) {                 \
    at::Tensor gi = at::empty({0}, self.options());                                                              \
    return NAME##_backward_out(go, self, p, gi);                                                                 \
  }
PAD_FNS(reflection_pad1d, TPURT_PAD_REFLECT, 1)
PAD_FNS(reflection_pad2d, TPURT_PAD_REFLECT, 2)
PAD_FNS(reflection_pad3d, TPURT_PAD_REFLECT, 3)
PAD_FNS(replication_pad1d, TPURT_PAD_REPLICATE, 1)
PAD_FNS(replication_pad2d, TPURT_PAD_REPLICATE, 2)
PAD_FNS(replication_pad3d, TPURT_PAD_REPLICATE, 3)

// ===================================================================== factories

at::Tensor& arange_out(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step, at::Tensor& out) {
  double xs = start.toDouble(), xe = end.toDouble(), xst = step.toDouble();
  TORCH_CHECK(xst > 0 || xst < 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(xs) && std::isfinite(xe), "unsupported range: ", xs, " -> ", xe);
  TORCH_CHECK(((xst > 0) && (xe >= xs)) || ((xst < 0) && (xe <= xs)),
              "upper bound and larger bound inconsistent with step sign");
  int64_t n;
  if (at::isIntegralType(out.scalar_type(), true) && start.isIntegral(true) && end.isIntegral(true) &&
      step.isIntegral(true)) {
    int64_t a = start.toLong(), b = end.toLong(), s = step.toLong();
    n = s > 0 ? (b - a + s - 1) / s : (a - b + (-s) - 1) / (-s);
  } else {
    n = static_cast<int64_t>(std::ceil((xe - xs) / xst));
  }
  TORCH_CHECK(n >= 0, "arange: invalid size ", n);
  c10::DeviceGuard g(out.device());
  if (out.numel() != n) resize_out(out, {n}, "arange");
  if (n == 0) return out;
  at::Tensor o = out.dim() == 1 ? out : out.view({n});
  tpurt_view ov = view_of(o);
  check(tpurt_arange(stream_of(out), &ov, to_runtime(start), to_runtime(step)), "arange");
  return out;
}

at::Tensor& linspace_out(const c10::Scalar& start, const c10::Scalar& end, int64_t steps, at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  c10::DeviceGuard g(out.device());
  if (out.numel() != steps) resize_out(out, {steps}, "linspace");
  if (steps == 0) return out;
  tpurt_view ov = view_of(out.view({steps}));
  if (steps == 1) {
    check(tpurt_fill(stream_of(out), &ov, to_runtime(start)), "linspace");
    return out;
  }
  if (at::isIntegralType(out.scalar_type(), true)) {
    // integer linspace: compute in double on the device then cast
    at::Tensor tmp = at::empty({steps}, out.options().dtype(at::kDouble));
    tpurt_view tv = view_of(tmp);
    check(tpurt_linspace(stream_of(out), &tv, start.toDouble(), end.toDouble()), "linspace");
    out.copy_(tmp);
    return out;
  }
  check(tpurt_linspace(stream_of(out), &ov, start.toDouble(), end.toDouble()), "linspace");
  return out;
}

// bincount: the length depends on the data (max + 1): one sync for min and max
// together, then a scatter-add of ones (or the weights) on the device. Checks,
// their order and the result dtype as on CPU (float32 weights -> float32,
// other weights -> float64, none -> int64).
at::Tensor bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights_opt, int64_t minlength) {
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(self.scalar_type(), false), "\"bincount_cpu\" not implemented for '",
                              self.scalar_type(), "'");
  c10::DeviceGuard g(self.device());
  if (self.dim() == 1 && self.numel() == 0) return at::zeros({minlength}, self.options().dtype(at::kLong));
  TORCH_CHECK(self.dim() == 1, "bincount only supports 1-d non-negative integral inputs.");
  auto [mn, mx] = at::aminmax(self);
  at::Tensor range = at::stack({mn.to(at::kLong), mx.to(at::kLong)}).cpu();
  const int64_t* r = range.data_ptr<int64_t>();
  TORCH_CHECK(r[0] >= 0, "bincount only supports 1-d non-negative integral inputs.");
  int64_t n = std::max(r[1] + 1, minlength);
  const at::Tensor* w = weights_opt && weights_opt->defined() ? &*weights_opt : nullptr;
  if (w) TORCH_CHECK(w->dim() == 1 && w->size(0) == self.size(0), "weights should be 1-d and have the same length as input");
  at::ScalarType dt = !w ? at::kLong : w->scalar_type() == at::kFloat ? at::kFloat : at::kDouble;
  at::Tensor out = at::zeros({n}, self.options().dtype(dt));
  at::Tensor src = w ? w->to(dt) : at::ones({self.size(0)}, self.options().dtype(at::kLong));
  bool index_type = self.scalar_type() == at::kLong || self.scalar_type() == at::kInt;
  out.index_add_(0, index_type ? self : self.to(at::kLong), src);
  return out;
}

at::Tensor tri_indices(int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                       std::optional<at::Layout> layout, std::optional<at::Device> device, bool upper) {
  const char* op = upper ? "triu_indices" : "tril_indices";
  TORCH_CHECK(row >= 0, "row must be non-negative, got", row);
  TORCH_CHECK(col >= 0, "col must be non-negative, got", col);
  TORCH_CHECK(!layout || *layout == at::kStrided, "only support layout=torch.strided, got", layout.value());
  at::ScalarType dt = dtype.value_or(at::kLong);
  TORCH_CHECK_NOT_IMPLEMENTED(dt == at::kLong || dt == at::kInt, "\"", op, "\" not implemented for '",
                              c10::toString(dt), "'");
  int64_t n = tpurt_tri_indices_count(row, col, offset, upper ? 1 : 0);
  at::Device dev = device.value_or(at::Device(c10::DeviceType::PrivateUse1));
  c10::DeviceGuard g(dev);
  at::Tensor out = at::empty({2, n}, at::TensorOptions().dtype(dt).device(dev));
  if (n == 0) return out;
  tpurt_view ov = view_of(out);
  check(tpurt_tri_indices(stream_of(out), &ov, row, col, offset, upper ? 1 : 0), op);
  return out;
}
at::Tensor tril_indices(int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool>) {
  return tri_indices(row, col, offset, dtype, layout, device, false);
}
at::Tensor triu_indices(int64_t row, int64_t col, int64_t offset, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool>) {
  return tri_indices(row, col, offset, dtype, layout, device, true);
}

at::Tensor& eye_m_out(int64_t n, int64_t m, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "n must be greater or equal to 0, got ", n);
  TORCH_CHECK(m >= 0, "m must be greater or equal to 0, got ", m);
  c10::DeviceGuard g(out.device());
  resize_out(out, {n, m}, "eye");
  if (out.numel() == 0) return out;
  tpurt_view ov = view_of(out);
  check(tpurt_fill(stream_of(out), &ov, to_runtime(c10::Scalar(0))), "eye");
  at::Tensor diag = out.diagonal();
  tpurt_view dv = view_of(diag);
  check(tpurt_fill(stream_of(out), &dv, to_runtime(c10::Scalar(1))), "eye");
  return out;
}
at::Tensor& eye_out(int64_t n, at::Tensor& out) { return eye_m_out(n, n, out); }

// ===================================================================== sort, topk, unique

std::tuple<at::Tensor&, at::Tensor&> sort_values_stable(const at::Tensor& self, std::optional<bool> stable,
                                                        int64_t dim, bool descending, at::Tensor& values,
                                                        at::Tensor& indices) {
  c10::DeviceGuard g(self.device());
  TORCH_CHECK(!self.is_complex(), "sort(): input tensor must be of non-complex type");
  dim = at::maybe_wrap_dim(dim, self.dim());
  // dense in the input's layout, as sort's meta function has it (a transposed input's results are
  // transposed too: a reshape of them copies on tpu as it does on the CPU)
  std::vector<int64_t> strides = at::infer_dense_strides(self.sizes(), self.strides());
  resize_out_strided(values, self.sizes(), strides);
  resize_out_strided(indices, self.sizes(), strides);
  TORCH_CHECK(values.scalar_type() == self.scalar_type(), "sort(): values dtype must match self");
  TORCH_CHECK(indices.scalar_type() == at::kLong, "sort(): indices must be int64");
  if (self.numel() == 0) return {values, indices};
  tpurt_view vv = view_of(values), iv = view_of(indices), sv = view_of(self);
  check(tpurt_sort(stream_of(self), &vv, &iv, &sv, static_cast<int>(dim), descending), "sort");
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                               bool descending) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(at::kLong));
  sort_values_stable(self, stable, dim, descending, v, i);
  return {v, i};
}

std::tuple<at::Tensor&, at::Tensor&> topk_values(const at::Tensor& self, int64_t k, int64_t dim, bool largest,
                                                 bool sorted, at::Tensor& values, at::Tensor& indices) {
  c10::DeviceGuard g(self.device());
  dim = at::maybe_wrap_dim(dim, self.dim(), true);
  int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  TORCH_CHECK(k >= 0 && k <= n, "selected index k out of range");
  std::vector<int64_t> shape = self.sizes().vec();
  if (self.dim() > 0) shape[dim] = k;
  resize_out(values, shape, "topk");
  resize_out(indices, shape, "topk");
  if (values.numel() == 0) return {values, indices};
  tpurt_view vv = view_of(values), iv = view_of(indices), sv = view_of(self);
  check(tpurt_topk(stream_of(self), &vv, &iv, &sv, k, static_cast<int>(dim), largest, sorted), "topk");
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> topk(const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(at::kLong));
  topk_values(self, k, dim, largest, sorted, v, i);
  return {v, i};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2(const at::Tensor& self, bool sorted, bool return_inverse,
                                                       bool return_counts) {
  c10::DeviceGuard g(self.device());
  at::Tensor flat = self.reshape({-1});
  int64_t n = flat.numel();
  at::Tensor vals = at::empty({n}, self.options()), perm = at::empty({n}, self.options().dtype(at::kLong));
  at::Tensor out = at::empty({n}, self.options());
  at::Tensor count = at::empty({}, self.options().dtype(at::kLong));
  at::Tensor inv = at::empty({n}, self.options().dtype(at::kLong));
  at::Tensor counts = at::empty({n}, self.options().dtype(at::kLong));
  tpurt_stream* s = stream_of(self);
  if (n > 0) {
    tpurt_view vv = view_of(vals), pv = view_of(perm), fv = view_of(flat);
    check(tpurt_sort(s, &vv, &pv, &fv, 0, 0), "unique");
  }
  tpurt_view ov = view_of(out), cv = view_of(count), iv = view_of(inv), csv = view_of(counts),
             vv = view_of(vals), pv = view_of(perm);
  check(tpurt_unique_sorted(s, &ov, &cv, return_inverse ? &iv : nullptr, return_counts ? &csv : nullptr, &vv,
                            return_inverse ? &pv : nullptr),
        "unique");
  int64_t m = 0;
  check(tpurt_memcpy_d2h(s, &m, reinterpret_cast<tpurt_devptr>(count.data_ptr()), sizeof m, 0), "unique");
  at::Tensor res = out.narrow(0, 0, m).clone();
  at::Tensor inverse = return_inverse ? inv.view(self.sizes()) : at::empty({0}, self.options().dtype(at::kLong));
  at::Tensor cnt = return_counts ? counts.narrow(0, 0, m).clone() : at::empty({0}, self.options().dtype(at::kLong));
  return {res, inverse, cnt};
}

// ===================================================================== random

struct Draw {
  uint64_t seed, offset;
};

Draw reserve(const std::optional<at::Generator>& gen, const at::Tensor& t, uint64_t blocks) {
  const at::Generator& g = gen.has_value() && gen->defined() ? *gen : default_generator(didx(t));
  TORCH_CHECK(g.device().type() == kTpu, "Expected a 'tpu' device type for generator but found '",
              g.device().type(), "'");
  std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(g).mutex());
  tpurt_generator* st = generator_state(g);
  Draw d;
  d.seed = st->seed;
  d.offset = tpurt_generator_reserve(st, blocks);
  return d;
}

at::Tensor& launch_random(at::Tensor& self, tpurt_rng_kind kind, double p0, double p1, int64_t from, uint64_t range,
                          const std::optional<at::Generator>& gen, const char* op) {
  c10::DeviceGuard g(self.device());
  if (self.numel() == 0) return self;
  tpurt_view v = view_of(self);
  Draw d = reserve(gen, self, tpurt_random_blocks(kind, v.dtype, self.numel(), range));
  check(tpurt_random(stream_of(self), &v, kind, p0, p1, from, range, d.seed, d.offset), op);
  return self;
}

at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "uniform_ only supports floating-point dtypes");
  return launch_random(self, TPURT_RNG_UNIFORM, from, to, 0, 0, gen, "uniform_");
}
at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "normal_ only supports floating-point dtypes");
  return launch_random(self, TPURT_RNG_NORMAL, mean, std, 0, 0, gen, "normal_");
}
// normal with tensor mean and/or std (PyTorch's composition: draws of
// N(0, 1) (or N(0, std)) scaled by std and shifted by mean, broadcast)
void check_normal_std(const at::Tensor& std) {
  TORCH_CHECK(!std.is_complex(), "normal expects standard deviation to be non-complex");
  TORCH_CHECK(std.numel() == 0 || std.min().ge(0).item<bool>(), "normal expects all elements of std >= 0.0");
}
at::Tensor& normal_tt_out(const at::Tensor& mean, const at::Tensor& std, std::optional<at::Generator> gen,
                          at::Tensor& out) {
  check_normal_std(std);
  at::native::resize_output(out, at::infer_size(mean.sizes(), std.sizes()));
  normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}
at::Tensor normal_tt(const at::Tensor& mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty({0}, mean.options());
  return normal_tt_out(mean, std, gen, out);
}
at::Tensor& normal_tf_out(const at::Tensor& mean, double std, std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  at::native::resize_output(out, mean.sizes());
  normal_(out, 0.0, std, gen);
  return out.add_(mean);
}
at::Tensor normal_tf(const at::Tensor& mean, double std, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty({0}, mean.options());
  return normal_tf_out(mean, std, gen, out);
}
at::Tensor& normal_ft_out(double mean, const at::Tensor& std, std::optional<at::Generator> gen, at::Tensor& out) {
  check_normal_std(std);
  at::native::resize_output(out, std.sizes());
  normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}
at::Tensor normal_ft(double mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty({0}, std.options());
  return normal_ft_out(mean, std, gen, out);
}
at::Tensor& exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  return launch_random(self, TPURT_RNG_EXPONENTIAL, lambd, 0, 0, 0, gen, "exponential_");
}
at::Tensor& geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  return launch_random(self, TPURT_RNG_GEOMETRIC, p, 0, 0, 0, gen, "geometric_");
}
at::Tensor& log_normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  return launch_random(self, TPURT_RNG_LOG_NORMAL, mean, std, 0, 0, gen, "log_normal_");
}
at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  return launch_random(self, TPURT_RNG_CAUCHY, median, sigma, 0, 0, gen, "cauchy_");
}
at::Tensor& bernoulli_float_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  return launch_random(self, TPURT_RNG_BERNOULLI, p, 0, 0, 0, gen, "bernoulli_");
}
at::Tensor& bernoulli_tensor_(at::Tensor& self, const at::Tensor& p_in, std::optional<at::Generator> gen) {
  c10::DeviceGuard g(self.device());
  if (self.numel() == 0) return self;
  at::Tensor p = on_device(p_in, self).expand(self.sizes());
  tpurt_view v = view_of(self), pv = view_of(p);
  Draw d = reserve(gen, self, (static_cast<uint64_t>(self.numel()) + 3) / 4);
  check(tpurt_bernoulli_tensor(stream_of(self), &v, &pv, d.seed, d.offset), "bernoulli_");
  return self;
}
at::Tensor bernoulli(const at::Tensor& self, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  return bernoulli_tensor_(out, self, gen);
}
at::Tensor& bernoulli_out(const at::Tensor& self, std::optional<at::Generator> gen, at::Tensor& out) {
  resize_out(out, self.sizes(), "bernoulli");
  return bernoulli_tensor_(out, self, gen);
}
at::Tensor bernoulli_p(const at::Tensor& self, double p, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  return bernoulli_float_(out, p, gen);
}

// random_: integers in a range, stored in self's dtype
at::Tensor& random_from_to(at::Tensor& self, int64_t from, std::optional<int64_t> to_opt,
                           std::optional<at::Generator> gen) {
  uint64_t range;
  if (to_opt) {
    TORCH_CHECK(from < *to_opt, "random_ expects 'from' to be less than 'to', but got from=", from,
                " >= to=", *to_opt);
    range = static_cast<uint64_t>(*to_opt) - static_cast<uint64_t>(from);
  } else {
    // [from, max of dtype]
    int64_t hi;
    switch (self.scalar_type()) {
      case at::kBool: hi = 1; break;
      case at::kByte: hi = 255; break;
      case at::kChar: hi = 127; break;
      case at::kShort: hi = 32767; break;
      case at::kInt: hi = INT32_MAX; break;
      case at::kHalf: hi = 1 << 11; break;
      case at::kBFloat16: hi = 1 << 8; break;
      case at::kFloat: hi = 1 << 24; break;
      case at::kDouble: hi = int64_t(1) << 53; break;
      default: hi = INT64_MAX; break;
    }
    range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(from) + 1;
  }
  return launch_random(self, TPURT_RNG_RANDOM, 0, 0, from, range, gen, "random_");
}
at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from_to(self, 0, to, gen);
}
at::Tensor& random_full(at::Tensor& self, std::optional<at::Generator> gen) {
  // [0, 2^mantissa] for floats, [0, max] for integers (PyTorch's default range)
  int64_t hi;
  switch (self.scalar_type()) {
    case at::kBool: hi = 1; break;
    case at::kByte: hi = 255; break;
    case at::kChar: hi = 127; break;
    case at::kShort: hi = 32767; break;
    case at::kInt: hi = INT32_MAX; break;
    case at::kLong: hi = INT64_MAX; break;
    case at::kHalf: hi = 1 << 11; break;
    case at::kBFloat16: hi = 1 << 8; break;
    case at::kFloat: hi = 1 << 24; break;
    case at::kDouble: hi = int64_t(1) << 53; break;
    default: hi = INT64_MAX; break;
  }
  uint64_t range = static_cast<uint64_t>(hi) + 1;  // INT64_MAX + 1 fits in uint64
  return launch_random(self, TPURT_RNG_RANDOM, 0, 0, 0, range, gen, "random_");
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  c10::DeviceGuard g(input.device());
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool), at::MemoryFormat::Contiguous);
  if (train.has_value() && !*train) {
    out.copy_(input);
    mask.fill_(true);
    return {out, mask};
  }
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) return {out, mask};
  double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  tpurt_view ov = view_of(out), mv = view_of(mask), iv = view_of(input);
  Draw d = reserve(std::nullopt, input, (static_cast<uint64_t>(input.numel()) + 3) / 4);
  check(tpurt_dropout(stream_of(input), &ov, &mv, &iv, p, scale, 1, d.seed, d.offset), "native_dropout");
  return {out, mask};
}

at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  c10::DeviceGuard g(grad.device());
  at::Tensor out = at::empty_like(grad, at::MemoryFormat::Contiguous);
  if (grad.numel() == 0) return out;
  at::Tensor m = mask.expand(grad.sizes());
  tpurt_view ov = view_of(out), mv = view_of(m), iv = view_of(grad);
  check(tpurt_dropout(stream_of(grad), &ov, &mv, &iv, 0, scale, 0, 0, 0), "native_dropout_backward");
  return out;
}

at::Tensor& randperm_out(int64_t n, std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  c10::DeviceGuard g(out.device());
  resize_out(out, {n}, "randperm");
  if (n == 0) return out;
  tpurt_view ov = view_of(out);
  Draw d = reserve(gen, out, static_cast<uint64_t>(n));
  check(tpurt_randperm(stream_of(out), &ov, d.seed, d.offset), "randperm");
  return out;
}

// poisson / binomial: each element's rejection sampler draws from its own counters (tpurt.h), one
// reserved block per element; the result is contiguous (as the CPU's)
at::Tensor poisson(const at::Tensor& rate, std::optional<at::Generator> gen) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(rate.scalar_type()), "\"poisson\" not implemented for '",
                              rate.scalar_type(), "'");
  c10::DeviceGuard g(rate.device());
  at::Tensor out = at::empty(rate.sizes(), rate.options());
  if (out.numel() == 0) return out;
  tpurt_view ov = view_of(out), rv = view_of(rate);
  Draw d = reserve(gen, rate, static_cast<uint64_t>(out.numel()));
  check(tpurt_poisson(stream_of(rate), &ov, &rv, d.seed, d.offset), "poisson");
  return out;
}

at::Tensor binomial(const at::Tensor& count, const at::Tensor& prob_in, std::optional<at::Generator> gen) {
  TORCH_CHECK_VALUE(at::isFloatingType(count.scalar_type()), "binomial only supports floating-point dtypes for count, got: ",
                    count.scalar_type());
  TORCH_CHECK_VALUE(at::isFloatingType(prob_in.scalar_type()), "binomial only supports floating-point dtypes for prob, got: ",
                    prob_in.scalar_type());
  TORCH_CHECK(prob_in.scalar_type() == count.scalar_type(), "Found dtype ", prob_in.scalar_type(), " but expected ",
              count.scalar_type());
  c10::DeviceGuard g(count.device());
  TORCH_CHECK(at::is_expandable_to(prob_in.sizes(), count.sizes()), "output with shape ", count.sizes(),
              " doesn't match the broadcast shape ", at::infer_size(count.sizes(), prob_in.sizes()));
  at::Tensor prob = on_device(prob_in, count).expand(count.sizes());
  at::Tensor out = at::empty(count.sizes(), count.options());
  if (out.numel() == 0) return out;
  tpurt_view ov = view_of(out), cv = view_of(count), pv = view_of(prob);
  Draw d = reserve(gen, count, static_cast<uint64_t>(out.numel()));
  check(tpurt_binomial(stream_of(count), &ov, &cv, &pv, d.seed, d.offset), "binomial");
  return out;
}

at::Tensor& multinomial_out(const at::Tensor& self, int64_t n_sample, bool replacement,
                            std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  TORCH_CHECK(n_sample > 0, "cannot sample n_sample <= 0 samples");
  int64_t cats = self.size(-1);
  TORCH_CHECK(replacement || n_sample <= cats, "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  c10::DeviceGuard g(self.device());
  at::Tensor p2 = self.dim() == 1 ? self.unsqueeze(0) : self;
  if (self.dim() == 1)
    resize_out(out, {n_sample}, "multinomial");
  else
    resize_out(out, {self.size(0), n_sample}, "multinomial");
  at::Tensor o2 = self.dim() == 1 ? out.unsqueeze(0) : out;
  if (o2.numel() == 0) return out;
  tpurt_view ov = view_of(o2), pv = view_of(p2);
  Draw d = reserve(gen, self, static_cast<uint64_t>(p2.size(0) * n_sample));
  check(tpurt_multinomial(stream_of(self), &ov, &pv, n_sample, replacement, d.seed, d.offset), "multinomial");
  return out;
}
at::Tensor multinomial(const at::Tensor& self, int64_t n_sample, bool replacement, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty({0}, self.options().dtype(at::kLong));
  return multinomial_out(self, n_sample, replacement, gen, out);
}

// ===================================================================== losses

// input [N, C, *] or [C]; target [N, *] or []
void nll_shapes(const at::Tensor& self, const at::Tensor& target, at::Tensor& in3, at::Tensor& t2, const char* op) {
  TORCH_CHECK(self.dim() >= 1, op, ": input tensor should be 1D or more");
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kByte ||
                  target.scalar_type() == at::kInt,
              "expected scalar type Long but found ", target.scalar_type());
  if (self.dim() == 1) {
    TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
    in3 = self.view({1, self.size(0), 1});
    t2 = target.reshape({1, 1});
    return;
  }
  int64_t N = self.size(0), C = self.size(1);
  TORCH_CHECK(target.dim() == self.dim() - 1, op, ": expected target of dim ", self.dim() - 1, " but got ",
              target.dim());
  TORCH_CHECK(target.size(0) == N, "Expected input batch_size (", N, ") to match target batch_size (", target.size(0),
              ").");
  for (int64_t d = 2; d < self.dim(); ++d)
    TORCH_CHECK(target.size(d - 1) == self.size(d), "size mismatch (got input: ", self.sizes(), ", target: ",
                target.sizes(), ")");
  int64_t D = N == 0 ? 0 : self.numel() / (N * std::max<int64_t>(C, 1));
  if (self.dim() == 2) D = 1;
  in3 = self.reshape({N, C, D});
  t2 = target.reshape({N, D});
}

std::tuple<at::Tensor&, at::Tensor&> nll_loss_forward_out(const at::Tensor& self, const at::Tensor& target_in,
                                                          const std::optional<at::Tensor>& weight_opt,
                                                          int64_t reduction, int64_t ignore_index, at::Tensor& out,
                                                          at::Tensor& total_weight) {
  c10::DeviceGuard g(self.device());
  at::Tensor target = on_device(target_in, self);
  if (target.scalar_type() == at::kByte) target = target.to(at::kLong);
  at::Tensor in3, t2;
  nll_shapes(self, target, in3, t2, "nll_loss");
  int64_t C = in3.size(1);
  at::Tensor weight;
  if (weight_opt && weight_opt->defined()) {
    weight = on_device(*weight_opt, self).contiguous();
    TORCH_CHECK(weight.dim() == 1 && weight.numel() == C, "weight tensor should be defined either for all ", C,
                " classes or no classes but got weight tensor of shape: ", weight.sizes());
  }
  if (reduction == 0 && self.dim() >= 2)
    resize_out(out, target.sizes(), "nll_loss");
  else
    resize_out(out, {}, "nll_loss");
  resize_out(total_weight, {}, "nll_loss");
  at::Tensor o2 = reduction == 0 ? (self.dim() >= 2 ? out.view(t2.sizes()) : out.view({1, 1})) : out;
  if (reduction == 0 && o2.numel() == 0) return {out, total_weight};
  tpurt_view ov = view_of(o2), tw = view_of(total_weight), iv = view_of(in3), tv = view_of(t2);
  tpurt_view wv{};
  if (weight.defined()) wv = view_of(weight);
  check(tpurt_nll_loss(stream_of(self), &ov, &tw, &iv, &tv, weight.defined() ? &wv : nullptr,
                       static_cast<int>(reduction), ignore_index),
        "nll_loss");
  return {out, total_weight};
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                    const std::optional<at::Tensor>& weight, int64_t reduction,
                                                    int64_t ignore_index) {
  at::Tensor out = at::empty({0}, self.options()), tw = at::empty({0}, self.options());
  nll_loss_forward_out(self, target, weight, reduction, ignore_index, out, tw);
  return {out, tw};
}

at::Tensor& nll_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target_in,
                                  const std::optional<at::Tensor>& weight_opt, int64_t reduction,
                                  int64_t ignore_index, const at::Tensor& total_weight, at::Tensor& grad_input) {
  c10::DeviceGuard g(self.device());
  at::Tensor target = on_device(target_in, self);
  if (target.scalar_type() == at::kByte) target = target.to(at::kLong);
  at::Tensor in3, t2;
  nll_shapes(self, target, in3, t2, "nll_loss_backward");
  resize_out(grad_input, self.sizes(), "nll_loss_backward");
  if (grad_input.numel() == 0) return grad_input;
  at::Tensor gi = grad_input.is_contiguous() ? grad_input : at::empty(self.sizes(), self.options());
  at::Tensor gi3 = gi.view(in3.sizes());
  at::Tensor weight;
  if (weight_opt && weight_opt->defined()) weight = on_device(*weight_opt, self).contiguous();
  at::Tensor go = grad_output;
  if (reduction == 0) {
    TORCH_CHECK(grad_output.numel() == t2.numel(), "Expected a tensor of dimension ", target.dim(),
                " and tensor.size[0] == ", t2.size(0), " but got: ", grad_output.sizes());
    go = grad_output.reshape(t2.sizes());
  } else {
    TORCH_CHECK(grad_output.numel() == 1, "Expected a single element grad_output tensor, but got: ",
                grad_output.sizes());
    go = grad_output.reshape({});
  }
  at::Tensor tw = total_weight.reshape({});
  tpurt_view gv = view_of(gi3), gov = view_of(go), tv = view_of(t2), twv = view_of(tw);
  tpurt_view wv{};
  if (weight.defined()) wv = view_of(weight);
  check(tpurt_nll_loss_backward(stream_of(self), &gv, &gov, &tv, weight.defined() ? &wv : nullptr, &twv,
                                static_cast<int>(reduction), ignore_index),
        "nll_loss_backward");
  if (!gi.is_same(grad_input)) grad_input.copy_(gi);
  return grad_input;
}

at::Tensor nll_loss_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                             const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight) {
  at::Tensor gi = at::empty({0}, self.options());
  return nll_loss_backward_out(grad_output, self, target, weight, reduction, ignore_index, total_weight, gi);
}

// 2d variants: input [N, C, H, W], target [N, H, W]
std::tuple<at::Tensor&, at::Tensor&> nll_loss2d_forward_out(const at::Tensor& self, const at::Tensor& target,
                                                            const std::optional<at::Tensor>& weight,
                                                            int64_t reduction, int64_t ignore_index, at::Tensor& out,
                                                            at::Tensor& tw) {
  TORCH_CHECK(self.dim() == 4, "only batches of spatial inputs supported (4D tensors), but got input of size: ",
              self.sizes());
  TORCH_CHECK(target.dim() == 3, "only batches of spatial targets supported (3D tensors) but got targets of size: ",
              target.sizes());
  return nll_loss_forward_out(self, target, weight, reduction, ignore_index, out, tw);
}
std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self, const at::Tensor& target,
                                                      const std::optional<at::Tensor>& weight, int64_t reduction,
                                                      int64_t ignore_index) {
  at::Tensor out = at::empty({0}, self.options()), tw = at::empty({0}, self.options());
  nll_loss2d_forward_out(self, target, weight, reduction, ignore_index, out, tw);
  return {out, tw};
}
at::Tensor& nll_loss2d_backward_out(const at::Tensor& go, const at::Tensor& self, const at::Tensor& target,
                                    const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                                    const at::Tensor& tw, at::Tensor& gi) {
  return nll_loss_backward_out(go, self, target, weight, reduction, ignore_index, tw, gi);
}
at::Tensor nll_loss2d_backward(const at::Tensor& go, const at::Tensor& self, const at::Tensor& target,
                               const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                               const at::Tensor& tw) {
  return (nll_loss_backward)(go, self, target, weight, reduction, ignore_index, tw);
}

// pointwise losses
at::Tensor& pl_out(tpurt_loss_kind kind, const at::Tensor& self, const at::Tensor& target_in,
                   const at::Tensor* weight_in, int64_t reduction, double p, at::Tensor& out, const char* op) {
  c10::DeviceGuard g(self.device());
  at::Tensor target = on_device(target_in, self);
  auto shape = kind == TPURT_LOSS_BCE ? self.sizes().vec() : at::infer_size(self.sizes(), target.sizes());
  if (kind == TPURT_LOSS_BCE)
    TORCH_CHECK(self.sizes() == target.sizes(), "Using a target size (", target.sizes(),
                ") that is different to the input size (", self.sizes(), ") is deprecated. Please ensure they "
                "have the same size.");
  at::Tensor x = self.expand(shape), y = target.expand(shape);
  at::Tensor w;
  if (weight_in && weight_in->defined()) w = on_device(*weight_in, self).expand(shape);
  if (reduction == 0)
    resize_out(out, shape, op);
  else
    resize_out(out, {}, op);
  tpurt_view ov = view_of(out), xv = view_of(x), yv = view_of(y), wv{};
  if (w.defined()) wv = view_of(w);
  check(tpurt_pointwise_loss(stream_of(self), kind, &ov, &xv, &yv, w.defined() ? &wv : nullptr,
                             static_cast<int>(reduction), p),
        op);
  return out;
}

at::Tensor& pl_backward_out(tpurt_loss_kind kind, const at::Tensor& grad_output, const at::Tensor& self,
                            const at::Tensor& target_in, const at::Tensor* weight_in, int64_t reduction, double p,
                            at::Tensor& grad_input, const char* op) {
  c10::DeviceGuard g(self.device());
  at::Tensor target = on_device(target_in, self);
  auto shape = at::infer_size(self.sizes(), target.sizes());
  at::Tensor x = self.expand(shape), y = target.expand(shape);
  at::Tensor w;
  if (weight_in && weight_in->defined()) w = on_device(*weight_in, self).expand(shape);
  at::Tensor go = grad_output.expand(shape);
  resize_out(grad_input, shape, op);
  if (grad_input.numel() == 0) return grad_input;
  tpurt_view gv = view_of(grad_input), gov = view_of(go), xv = view_of(x), yv = view_of(y), wv{};
  if (w.defined()) wv = view_of(w);
  check(tpurt_pointwise_loss_backward(stream_of(self), kind, &gv, &gov, &xv, &yv, w.defined() ? &wv : nullptr,
                                      static_cast<int>(reduction), p),
        op);
  return grad_input;
}

at::Tensor& mse_loss_out(const at::Tensor& s, const at::Tensor& t, int64_t r, at::Tensor& o) {
  return pl_out(TPURT_LOSS_MSE, s, t, nullptr, r, 0, o, "mse_loss");
}
at::Tensor mse_loss(const at::Tensor& s, const at::Tensor& t, int64_t r) {
  at::Tensor o = at::empty({0}, s.options());
  return mse_loss_out(s, t, r, o);
}
at::Tensor& mse_loss_backward_out(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t, int64_t r,
                                  at::Tensor& gi) {
  return pl_backward_out(TPURT_LOSS_MSE, go, s, t, nullptr, r, 0, gi, "mse_loss_backward");
}
at::Tensor mse_loss_backward(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t, int64_t r) {
  at::Tensor gi = at::empty({0}, s.options());
  return mse_loss_backward_out(go, s, t, r, gi);
}
at::Tensor& smooth_l1_loss_out(const at::Tensor& s, const at::Tensor& t, int64_t r, double beta, at::Tensor& o) {
  TORCH_CHECK(beta >= 0, "smooth_l1_loss does not support negative values for beta.");
  return pl_out(TPURT_LOSS_SMOOTH_L1, s, t, nullptr, r, beta, o, "smooth_l1_loss");
}
at::Tensor smooth_l1_loss(const at::Tensor& s, const at::Tensor& t, int64_t r, double beta) {
  at::Tensor o = at::empty({0}, s.options());
  return smooth_l1_loss_out(s, t, r, beta, o);
}
at::Tensor& smooth_l1_loss_backward_out(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t, int64_t r,
                                        double beta, at::Tensor& gi) {
  return pl_backward_out(TPURT_LOSS_SMOOTH_L1, go, s, t, nullptr, r, beta, gi, "smooth_l1_loss_backward");
}
at::Tensor smooth_l1_loss_backward(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t, int64_t r,
                                   double beta) {
  at::Tensor gi = at::empty({0}, s.options());
  return smooth_l1_loss_backward_out(go, s, t, r, beta, gi);
}
at::Tensor& huber_loss_out(const at::Tensor& s, const at::Tensor& t, int64_t r, double delta, at::Tensor& o) {
  TORCH_CHECK(delta > 0, "huber_loss does not support non-positive values for delta.");
  return pl_out(TPURT_LOSS_HUBER, s, t, nullptr, r, delta, o, "huber_loss");
}
at::Tensor huber_loss(const at::Tensor& s, const at::Tensor& t, int64_t r, double delta) {
  at::Tensor o = at::empty({0}, s.options());
  return huber_loss_out(s, t, r, delta, o);
}
at::Tensor& huber_loss_backward_out(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t, int64_t r,
                                    double delta, at::Tensor& gi) {
  return pl_backward_out(TPURT_LOSS_HUBER, go, s, t, nullptr, r, delta, gi, "huber_loss_backward");
}
at::Tensor huber_loss_backward(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t, int64_t r,
                               double delta) {
  at::Tensor gi = at::empty({0}, s.options());
  return huber_loss_backward_out(go, s, t, r, delta, gi);
}
at::Tensor& bce_out(const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& w, int64_t r,
                    at::Tensor& o) {
  at::Tensor wt = w.has_value() ? *w : at::Tensor();
  return pl_out(TPURT_LOSS_BCE, s, t, &wt, r, 0, o, "binary_cross_entropy");
}
at::Tensor bce(const at::Tensor& s, const at::Tensor& t, const std::optional<at::Tensor>& w, int64_t r) {
  at::Tensor o = at::empty({0}, s.options());
  return bce_out(s, t, w, r, o);
}
at::Tensor& bce_backward_out(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t,
                             const std::optional<at::Tensor>& w, int64_t r, at::Tensor& gi) {
  at::Tensor wt = w.has_value() ? *w : at::Tensor();
  return pl_backward_out(TPURT_LOSS_BCE, go, s, t, &wt, r, 0, gi, "binary_cross_entropy_backward");
}
at::Tensor bce_backward(const at::Tensor& go, const at::Tensor& s, const at::Tensor& t,
                        const std::optional<at::Tensor>& w, int64_t r) {
  at::Tensor gi = at::empty({0}, s.options());
  return bce_backward_out(go, s, t, w, r, gi);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index_select", TORCH_FN(index_select));
  m.impl("index_select.out", TORCH_FN(index_select_out));
  m.impl("gather", TORCH_FN(gather));
  m.impl("gather.out", TORCH_FN(gather_out));
  m.impl("scatter.src", TORCH_FN(scatter_src));
  m.impl("scatter.value", TORCH_FN(scatter_value));
  m.impl("scatter.reduce", TORCH_FN(scatter_reduce));
  m.impl("scatter.value_reduce", TORCH_FN(scatter_value_reduce));
  m.impl("scatter_.src", TORCH_FN(scatter_src_));
  m.impl("scatter_.value", TORCH_FN(scatter_value_));
  m.impl("scatter_.reduce", TORCH_FN(scatter_reduce_));
  m.impl("scatter_.value_reduce", TORCH_FN(scatter_value_reduce_));
  m.impl("scatter.src_out", TORCH_FN(scatter_src_out));
  m.impl("scatter.value_out", TORCH_FN(scatter_value_out));
  m.impl("scatter.reduce_out", TORCH_FN(scatter_reduce_out));
  m.impl("scatter.value_reduce_out", TORCH_FN(scatter_value_reduce_out));
  m.impl("scatter_add", TORCH_FN(scatter_add));
  m.impl("scatter_add_", TORCH_FN(scatter_add_));
  m.impl("scatter_add.out", TORCH_FN(scatter_add_out));
  m.impl("scatter_reduce.two", TORCH_FN(scatter_reduce_two));
  m.impl("scatter_reduce_.two", TORCH_FN(scatter_reduce_two_));
  m.impl("scatter_reduce.two_out", TORCH_FN(scatter_reduce_two_out));
  m.impl("index_add", TORCH_FN(index_add));
  m.impl("index_add_", TORCH_FN(index_add_));
  m.impl("index_add.out", TORCH_FN(index_add_out));
  m.impl("index.Tensor", TORCH_FN(index_tensor));
  m.impl("index.Tensor_out", TORCH_FN(index_out));
  m.impl("_index_put_impl_", TORCH_FN(index_put_impl_));
  m.impl("index_put_", TORCH_FN(index_put_));
  m.impl("masked_select", TORCH_FN(masked_select));
  m.impl("masked_select.out", TORCH_FN(masked_select_out));
  m.impl("nonzero", TORCH_FN(nonzero));
  m.impl("nonzero.out", TORCH_FN(nonzero_out));
  m.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
  m.impl("cat", TORCH_FN(cat));
  m.impl("cat.out", TORCH_FN(cat_out));
  m.impl("flip", TORCH_FN(flip));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("roll", TORCH_FN(roll));
  m.impl("tril", TORCH_FN(tril));
  m.impl("tril_", TORCH_FN(tril_));
  m.impl("tril.out", TORCH_FN(tril_out));
  m.impl("triu", TORCH_FN(triu));
  m.impl("triu_", TORCH_FN(triu_));
  m.impl("triu.out", TORCH_FN(triu_out));
  m.impl("reflection_pad1d", TORCH_FN(reflection_pad1d));
  m.impl("reflection_pad1d.out", TORCH_FN(reflection_pad1d_out));
  m.impl("reflection_pad1d_backward", TORCH_FN(reflection_pad1d_backward));
  m.impl("reflection_pad1d_backward.grad_input", TORCH_FN(reflection_pad1d_backward_out));
  m.impl("reflection_pad2d", TORCH_FN(reflection_pad2d));
  m.impl("reflection_pad2d.out", TORCH_FN(reflection_pad2d_out));
  m.impl("reflection_pad2d_backward", TORCH_FN(reflection_pad2d_backward));
  m.impl("reflection_pad2d_backward.grad_input", TORCH_FN(reflection_pad2d_backward_out));
  m.impl("reflection_pad3d", TORCH_FN(reflection_pad3d));
  m.impl("reflection_pad3d.out", TORCH_FN(reflection_pad3d_out));
  m.impl("reflection_pad3d_backward", TORCH_FN(reflection_pad3d_backward));
  m.impl("reflection_pad3d_backward.grad_input", TORCH_FN(reflection_pad3d_backward_out));
  m.impl("replication_pad1d", TORCH_FN(replication_pad1d));
  m.impl("replication_pad1d.out", TORCH_FN(replication_pad1d_out));
  m.impl("replication_pad1d_backward", TORCH_FN(replication_pad1d_backward));
  m.impl("replication_pad1d_backward.grad_input", TORCH_FN(replication_pad1d_backward_out));
  m.impl("replication_pad2d", TORCH_FN(replication_pad2d));
  m.impl("replication_pad2d.out", TORCH_FN(replication_pad2d_out));
  m.impl("replication_pad2d_backward", TORCH_FN(replication_pad2d_backward));
  m.impl("replication_pad2d_backward.grad_input", TORCH_FN(replication_pad2d_backward_out));
  m.impl("replication_pad3d", TORCH_FN(replication_pad3d));
  m.impl("replication_pad3d.out", TORCH_FN(replication_pad3d_out));
  m.impl("replication_pad3d_backward", TORCH_FN(replication_pad3d_backward));
  m.impl("replication_pad3d_backward.grad_input", TORCH_FN(replication_pad3d_backward_out));
  m.impl("arange.start_out", TORCH_FN(arange_out));
  m.impl("linspace.out", TORCH_FN(linspace_out));
  m.impl("tril_indices", TORCH_FN(tril_indices));
  m.impl("bincount", TORCH_FN(bincount));
  m.impl("triu_indices", TORCH_FN(triu_indices));
  m.impl("eye.m_out", TORCH_FN(eye_m_out));
  m.impl("eye.out", TORCH_FN(eye_out));
  m.impl("sort.stable", TORCH_FN(sort_stable));
  m.impl("sort.values_stable", TORCH_FN(sort_values_stable));
  m.impl("topk", TORCH_FN(topk));
  m.impl("topk.values", TORCH_FN(topk_values));
  m.impl("_unique2", TORCH_FN(unique2));
  m.impl("uniform_", TORCH_FN(uniform_));
  m.impl("normal_", TORCH_FN(normal_));
  m.impl("normal.Tensor_Tensor", TORCH_FN(normal_tt));
  m.impl("normal.Tensor_Tensor_out", TORCH_FN(normal_tt_out));
  m.impl("normal.Tensor_float", TORCH_FN(normal_tf));
  m.impl("normal.Tensor_float_out", TORCH_FN(normal_tf_out));
  m.impl("normal.float_Tensor", TORCH_FN(normal_ft));
  m.impl("normal.float_Tensor_out", TORCH_FN(normal_ft_out));
  m.impl("exponential_", TORCH_FN(exponential_));
  m.impl("geometric_", TORCH_FN(geometric_));
  m.impl("log_normal_", TORCH_FN(log_normal_));
  m.impl("cauchy_", TORCH_FN(cauchy_));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_float_));
  m.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_tensor_));
  m.impl("bernoulli", TORCH_FN(bernoulli));
  m.impl("bernoulli.out", TORCH_FN(bernoulli_out));
  m.impl("bernoulli.p", TORCH_FN(bernoulli_p));
  m.impl("random_.from", TORCH_FN(random_from_to));
  m.impl("random_.to", TORCH_FN(random_to));
  m.impl("random_", TORCH_FN(random_full));
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("native_dropout_backward", TORCH_FN(native_dropout_backward));
  m.impl("randperm.generator_out", TORCH_FN(randperm_out));
  m.impl("poisson", TORCH_FN(poisson));
  m.impl("binomial", TORCH_FN(binomial));
  m.impl("multinomial", TORCH_FN(multinomial));
  m.impl("multinomial.out", TORCH_FN(multinomial_out));
  m.impl("nll_loss_forward", TORCH_FN(nll_loss_forward));
  m.impl("nll_loss_forward.output", TORCH_FN(nll_loss_forward_out));
  m.impl("nll_loss_backward", TORCH_FN(nll_loss_backward));
  m.impl("nll_loss_backward.grad_input", TORCH_FN(nll_loss_backward_out));
  m.impl("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward));
  m.impl("nll_loss2d_forward.output", TORCH_FN(nll_loss2d_forward_out));
  m.impl("nll_loss2d_backward", TORCH_FN(nll_loss2d_backward));
  m.impl("nll_loss2d_backward.grad_input", TORCH_FN(nll_loss2d_backward_out));
  m.impl("mse_loss", TORCH_FN(mse_loss));
  m.impl("mse_loss.out", TORCH_FN(mse_loss_out));
  m.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
  m.impl("mse_loss_backward.grad_input", TORCH_FN(mse_loss_backward_out));
  m.impl("smooth_l1_loss", TORCH_FN(smooth_l1_loss));
  m.impl("smooth_l1_loss.out", TORCH_FN(smooth_l1_loss_out));
  m.impl("smooth_l1_loss_backward", TORCH_FN(smooth_l1_loss_backward));
  m.impl("smooth_l1_loss_backward.grad_input", TORCH_FN(smooth_l1_loss_backward_out));
  m.impl("huber_loss", TORCH_FN(huber_loss));
  m.impl("huber_loss.out", TORCH_FN(huber_loss_out));
  m.impl("huber_loss_backward", TORCH_FN(huber_loss_backward));
  m.impl("huber_loss_backward.out", TORCH_FN(huber_loss_backward_out));
  m.impl("binary_cross_entropy", TORCH_FN(bce));
  m.impl("binary_cross_entropy.out", TORCH_FN(bce_out));
  m.impl("binary_cross_entropy_backward", TORCH_FN(bce_backward));
  m.impl("binary_cross_entropy_backward.grad_input", TORCH_FN(bce_backward_out));
}

}  // namespace torch_tpu
