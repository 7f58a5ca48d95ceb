// ATen kernels of the `tpu` backend for embedding bags, fill/copy/reduce by
// index, put/take, masked scatter, order statistics (median, kthvalue,
// mode), histograms, searchsorted/bucketize, isin, unique along a dim,
// segment reductions and a few small composites (trace, renorm, equal,
// channel_shuffle, unfold_backward). Elements are computed by the runtime
// (tpurt.h) or by other tpu operators; the glue only checks arguments and
// computes metadata (a few ops read back a count or a range, as on CPU).
#include "glue.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>

namespace torch_tpu {
// aten_index.cpp
void check_indices_on_host(const at::Tensor& index, int64_t size, int64_t dim, const char* op);

namespace {

tpurt_stream* stream_of(const at::Tensor& t) { return current_stream(t.device().index()); }

at::Tensor on_device(const at::Tensor& t, const at::Tensor& like) {
  return t.device() == like.device() ? t : t.to(like.device());
}

void resize_out(at::Tensor& out, c10::IntArrayRef sizes) { at::native::resize_output(out, sizes); }

bool is_index_dtype(const at::Tensor& t) { return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt; }

// =========================================================== embedding bag

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag_fwd(
    const at::Tensor& weight, const at::Tensor& indices_in, const at::Tensor& offsets_in, bool scale_grad_by_freq,
    int64_t mode, bool sparse, const std::optional<at::Tensor>& psw_opt, bool include_last_offset,
    int64_t padding_idx) {
  TORCH_CHECK(weight.dim() == 2, "weight has to be a 2D Tensor, but got Tensor of dimension ", weight.dim());
  TORCH_CHECK(indices_in.dim() == 1, "input has to be a 1D or 2D Tensor, but got Tensor of dimension ",
              indices_in.dim());
  TORCH_CHECK(offsets_in.dim() == 1, "offsets has to be a 1D Tensor, but got Tensor of dimension ",
              offsets_in.dim());
  TORCH_CHECK(is_index_dtype(indices_in), "embedding_bag: expected indices to have dtype Long or Int, but got ",
              indices_in.scalar_type());
  TORCH_CHECK(is_index_dtype(offsets_in), "embedding_bag: expected offsets to have dtype Long or Int, but got ",
              offsets_in.scalar_type());
  TORCH_CHECK(at::isFloatingType(weight.scalar_type()),
              "embedding_bag: expected weight to be a floating point tensor, but got ", weight.scalar_type());
  TORCH_CHECK(mode >= 0 && mode <= 2, "embedding_bag: mode has to be 0 (sum), 1 (mean) or 2 (max), got ", mode);
  c10::DeviceGuard g(weight.device());
  at::Tensor indices = on_device(indices_in, weight), offsets = on_device(offsets_in, weight);
  at::Tensor psw;
  if (psw_opt.has_value() && psw_opt->defined()) {
    static const char* names[] = {"sum", "mean", "max"};
    TORCH_CHECK(mode == 0, "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported "
                "for mode='sum' (got mode='", names[mode], "'). Please open a feature request on GitHub.");
    psw = on_device(*psw_opt, weight);
    TORCH_CHECK(psw.scalar_type() == weight.scalar_type(), "embedding_bag: expected per_sample_weights to have ",
                "dtype ", weight.scalar_type(), " but got ", psw.scalar_type());
    TORCH_CHECK(psw.dim() == 1 && psw.numel() == indices.numel(), "embedding_bag: per_sample_weights must be 1-D ",
                "with as many elements as input (", indices.numel(), "), got shape ", psw.sizes());
  }
  int64_t B = offsets.size(0);
  if (include_last_offset) {
    TORCH_CHECK(B >= 1, "include_last_offset: number of offset should be at least 1");
    B -= 1;
  }
  int64_t N = indices.numel(), D = weight.size(1);
  auto lopt = weight.options().dtype(at::kLong);
  at::Tensor out = at::empty({B, D}, weight.options());
  at::Tensor o2b = at::empty({N}, lopt), bs = at::empty({B}, lopt);
  at::Tensor mi = mode == 2 ? at::empty({B, D}, lopt) : at::empty({0}, lopt);
  if (B == 0) return {out, o2b, bs, mi};
  tpurt_view ov = view_of(out), o2v = view_of(o2b), bsv = view_of(bs), miv = view_of(mi), wv = view_of(weight),
             iv = view_of(indices), offv = view_of(offsets), pv{};
  if (psw.defined()) pv = view_of(psw);
  check(tpurt_embedding_bag(stream_of(weight), &ov, &o2v, &bsv, mode == 2 ? &miv : nullptr, &wv, &iv, &offv,
                            psw.defined() ? &pv : nullptr, static_cast<tpurt_bag_mode>(mode),
                            padding_idx < 0 ? -1 : padding_idx),
        "embedding_bag");
  return {out, o2b, bs, mi};
}

at::Tensor embedding_bag_dense_backward(const at::Tensor& grad_in, const at::Tensor& indices_in,
                                        const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                        const at::Tensor& max_indices, c10::SymInt num_weights_s,
                                        bool scale_grad_by_freq, int64_t mode,
                                        const std::optional<at::Tensor>& psw_opt, int64_t padding_idx) {
  int64_t num_weights = num_weights_s.guard_int(__FILE__, __LINE__);
  c10::DeviceGuard g(grad_in.device());
  at::Tensor grad = grad_in, indices = on_device(indices_in, grad_in);
  at::Tensor gw = at::empty({num_weights, grad.size(1)}, grad.options());
  at::Tensor psw;
  if (psw_opt.has_value() && psw_opt->defined()) psw = on_device(*psw_opt, grad_in);
  if (gw.numel() == 0) return gw;
  tpurt_view gwv = view_of(gw), gv = view_of(grad), iv = view_of(indices), o2v{}, bsv{}, miv{}, pv{};
  if (mode == 2) miv = view_of(max_indices);
  else o2v = view_of(offset2bag);
  if (mode == 1) bsv = view_of(bag_size);
  if (psw.defined()) pv = view_of(psw);
  check(tpurt_embedding_bag_backward(stream_of(grad), &gwv, &gv, &iv, mode == 2 ? nullptr : &o2v,
                                     mode == 1 ? &bsv : nullptr, mode == 2 ? &miv : nullptr,
                                     psw.defined() ? &pv : nullptr, static_cast<tpurt_bag_mode>(mode),
                                     padding_idx < 0 ? -1 : padding_idx, scale_grad_by_freq),
        "embedding_bag_backward");
  return gw;
}

at::Tensor embedding_bag_backward(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offsets,
                                  const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                  const at::Tensor& max_indices, c10::SymInt num_weights, bool scale_grad_by_freq,
                                  int64_t mode, bool sparse, const std::optional<at::Tensor>& psw,
                                  int64_t padding_idx) {
  TORCH_CHECK_NOT_IMPLEMENTED(!sparse, "embedding_bag: sparse gradients are not supported on the tpu device");
  return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                      scale_grad_by_freq, mode, psw, padding_idx);
}

at::Tensor embedding_bag_psw_backward(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& indices_in,
                                      const at::Tensor& offsets, const at::Tensor& offset2bag, int64_t mode,
                                      int64_t padding_idx) {
  TORCH_CHECK(mode == 0, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
  c10::DeviceGuard g(grad.device());
  at::Tensor indices = on_device(indices_in, grad);
  at::Tensor out = at::empty({indices.numel()}, grad.options());
  if (out.numel() == 0) return out;
  tpurt_view ov = view_of(out), gv = view_of(grad), wv = view_of(weight), iv = view_of(indices),
             o2v = view_of(offset2bag);
  check(tpurt_embedding_bag_psw_backward(stream_of(grad), &ov, &gv, &wv, &iv, &o2v, padding_idx < 0 ? -1 : padding_idx),
        "embedding_bag_per_sample_weights_backward");
  return out;
}

at::Tensor& embedding_renorm_(at::Tensor& self, const at::Tensor& indices_in, double max_norm, double norm_type) {
  TORCH_CHECK(self.dim() == 2, "embedding_renorm_: self must be a 2-D tensor, got ", self.dim(), " dimensions");
  TORCH_CHECK(is_index_dtype(indices_in), "embedding_renorm_: Expected indices to have type Long or Int, but got ",
              indices_in.scalar_type());
  c10::DeviceGuard g(self.device());
  at::Tensor indices = on_device(indices_in, self).reshape({-1});
  if (indices.numel() == 0) return self;
  tpurt_view sv = view_of(self), iv = view_of(indices);
  check(tpurt_embedding_renorm(stream_of(self), &sv, &iv, max_norm, norm_type), "embedding_renorm_");
  return self;
}

// =========================================================== by-index fill / copy / reduce

// self[:, ..., index, ...] (index at dim) as an index list for index_put_
c10::List<std::optional<at::Tensor>> dim_index(int64_t dim, const at::Tensor& index) {
  c10::List<std::optional<at::Tensor>> l;
  for (int64_t d = 0; d < dim; ++d) l.push_back(std::optional<at::Tensor>());
  l.push_back(std::optional<at::Tensor>(index));
  return l;
}

at::Tensor& index_fill_impl(at::Tensor& self, int64_t dim, const at::Tensor& index_in, const at::Tensor& value) {
  TORCH_CHECK_INDEX(index_in.dim() <= 1, "index_fill_(): Index is supposed to be a vector");
  TORCH_CHECK(index_in.scalar_type() == at::kLong, "index_fill_(): Expected dtype int64 for index.");
  c10::DeviceGuard g(self.device());
  dim = at::maybe_wrap_dim(dim, self.dim());
  at::Tensor index = on_device(index_in, self).reshape({-1});
  if (index.numel() == 0 || self.numel() == 0) return self;
  at::Tensor target = self.dim() == 0 ? self.view({1}) : self;
  at::Tensor v = on_device(value, self).to(self.scalar_type());
  target.index_put_(dim_index(dim, index), v);
  return self;
}
at::Tensor& index_fill_scalar_(at::Tensor& self, int64_t dim, const at::Tensor& index, const c10::Scalar& value) {
  return index_fill_impl(self, dim, index, at::scalar_tensor(value, self.options().device(at::kCPU)));
}
at::Tensor& index_fill_tensor_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  return index_fill_impl(self, dim, index, value);
}

at::Tensor& copy_self_into(const at::Tensor& self, at::Tensor& out) {
  if (!out.is_same(self)) {
    resize_out(out, self.sizes());
    out.copy_(self);
  }
  return out;
}

at::Tensor& index_copy_out(const at::Tensor& self, int64_t dim, const at::Tensor& index_in, const at::Tensor& source,
                           at::Tensor& out) {
  dim = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_INDEX(index_in.dim() <= 1, "index_copy_(): Index should have dimension 1 or 0 (got ", index_in.dim(),
                    ")");
  TORCH_CHECK(index_in.scalar_type() == at::kLong, "index_copy_(): Expected a long tensor for index, but got ",
              index_in.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_copy_(): self and source expected to have the same ",
              "dtype, but got (self) ", self.scalar_type(), " and (source) ", source.scalar_type());
  TORCH_CHECK(self.dim() == source.dim() || (self.dim() <= 1 && source.dim() <= 1),
              "index_copy_(): When source and destination are not scalars, their dimensionality must match. Source "
              "dimensionality (", source.dim(), "), destination dimensionality (", self.dim(), ")");
  int64_t n = source.dim() == 0 ? 1 : source.size(dim);
  TORCH_CHECK_INDEX(index_in.numel() == n, "index_copy_(): Number of indices (", index_in.numel(),
                    ") should be equal to source.size(dim) (", n, ")");
  for (int64_t d = 0; d < self.dim(); ++d)
    if (d != dim && source.dim() > 0)
      TORCH_CHECK(self.size(d) == source.size(d), "index_copy_(): Source/destination tensor must have same slice "
                  "shapes. Destination slice shape: ", self.sizes(), " at dimension ", dim, " and source slice shape: ",
                  source.sizes(), " at dimension ", dim, ".");
  c10::DeviceGuard g(self.device());
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, index_in);
  at::assert_no_overlap(out, source);
  copy_self_into(self, out);
  at::Tensor index = on_device(index_in, self).reshape({-1});
  if (index.numel() == 0) return out;
  if (out.numel() == 0) {
    // no index is in range of an empty indexed dim (the CPU fails inside its kernel then, see RELIABILITY.md;
    // with nothing to copy it runs no kernel and accepts any index)
    if (out.dim() > 0 && out.size(dim) == 0 && source.numel() > 0) check_indices_on_host(index, 0, dim, "index_copy_()");
    return out;
  }
  at::Tensor target = out.dim() == 0 ? out.view({1}) : out;
  at::Tensor src = on_device(source, self);
  src = src.dim() == 0 ? src.view({1}) : src;
  target.index_put_(dim_index(dim, index), src);
  return out;
}

at::Tensor& index_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index_in,
                             const at::Tensor& source, c10::string_view reduce, bool include_self, at::Tensor& out) {
  TORCH_CHECK(reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
              "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  dim = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_INDEX(index_in.dim() <= 1, "index_reduce_(): Index is supposed to be a vector");
  TORCH_CHECK(index_in.scalar_type() == at::kLong || index_in.scalar_type() == at::kInt,
              "index_reduce_(): Expected dtype int32/int64 for index");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_reduce_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  int64_t n = source.dim() == 0 ? 1 : source.size(dim);
  TORCH_CHECK(index_in.numel() == n, "index_reduce_(): Number of indices (", index_in.numel(),
              ") should be equal to source.size(dim) (", n, ")");
  c10::DeviceGuard g(self.device());
  copy_self_into(self, out);
  if (index_in.numel() == 0) return out;
  at::Tensor target = out.dim() == 0 ? out.view({1}) : out;
  at::Tensor src = on_device(source, self);
  src = src.dim() == 0 ? src.view({1}) : src;
  std::vector<int64_t> shape(src.dim(), 1);
  shape[dim] = n;
  at::Tensor idx = on_device(index_in, self).reshape(shape).expand(src.sizes());
  target.scatter_reduce_(dim, idx, src, reduce, include_self);
  return out;
}

// =========================================================== put / take / masked_scatter / nonzero_static

at::Tensor& put_(at::Tensor& self, const at::Tensor& index_in, const at::Tensor& source, bool accumulate) {
  TORCH_CHECK(index_in.scalar_type() == at::kLong, "put_(): Expected a long tensor for index, but got ",
              index_in.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "put_(): self and source expected to have the same dtype, "
              "but got self.dtype = ", self.scalar_type(), " and source.dtype = ", source.scalar_type());
  TORCH_CHECK(index_in.numel() == source.numel(), "put_(): Expected source and index to have the same number of "
              "elements, but got source.numel() = ", source.numel(), ", index.numel() = ", index_in.numel());
  c10::DeviceGuard g(self.device());
  if (index_in.numel() == 0) return self;
  TORCH_CHECK_INDEX(self.numel() > 0, "put_(): Tried to put elements into an empty tensor");
  at::Tensor index = on_device(index_in, self).reshape({-1});
  at::Tensor src = on_device(source, self).reshape({-1});
  c10::List<std::optional<at::Tensor>> l;
  l.push_back(std::optional<at::Tensor>(index));
  if (self.is_contiguous()) {
    at::Tensor flat = self.view({-1});
    flat.index_put_(l, src, accumulate);
  } else {
    at::Tensor tmp = self.contiguous();
    at::Tensor flat = tmp.view({-1});
    flat.index_put_(l, src, accumulate);
    self.copy_(tmp);
  }
  return self;
}

at::Tensor& take_out(const at::Tensor& self, const at::Tensor& index_in, at::Tensor& out) {
  TORCH_CHECK(index_in.scalar_type() == at::kLong, "take(): Expected a long tensor for index, but got ",
              index_in.scalar_type());
  TORCH_CHECK(self.scalar_type() == out.scalar_type(), "take(): self and out expected to have the same dtype, but got "
              "self.dtype = ", self.scalar_type(), " and out.dtype = ", out.scalar_type());
  c10::DeviceGuard g(self.device());
  at::Tensor index = on_device(index_in, self);
  resize_out(out, index.sizes());
  if (index.numel() == 0) return out;
  TORCH_CHECK_INDEX(self.numel() > 0, "take(): tried to take from an empty tensor");
  c10::List<std::optional<at::Tensor>> l;
  l.push_back(std::optional<at::Tensor>(index.reshape({-1})));
  at::Tensor r = self.reshape({-1}).index(l);
  out.copy_(r.view(index.sizes()));
  return out;
}
at::Tensor take(const at::Tensor& self, const at::Tensor& index) {
  at::Tensor out = at::empty({0}, self.options());
  return take_out(self, index, out);
}

at::Tensor& masked_scatter_(at::Tensor& self, const at::Tensor& mask_in, const at::Tensor& source) {
  TORCH_CHECK(mask_in.scalar_type() == at::kBool, "masked_scatter_ only supports boolean masks, but got mask with "
              "dtype ", mask_in.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "masked_scatter_: expected self and source to have same "
              "dtypes but got ", self.scalar_type(), " and ", source.scalar_type());
  c10::DeviceGuard g(self.device());
  at::Tensor mask = on_device(mask_in, self);
  TORCH_CHECK(at::is_expandable_to(mask.sizes(), self.sizes()), "masked_scatter_: expected mask of shape ",
              mask.sizes(), " to be broadcastable to self of shape ", self.sizes());
  if (self.numel() == 0) return self;
  at::Tensor target = self.dim() == 0 ? self.view({1}) : self;
  at::Tensor m = mask.expand(self.sizes());
  if (self.dim() == 0) m = m.view({1});
  int64_t n = at::sum(m, at::kLong).item<int64_t>();
  TORCH_CHECK(n <= source.numel(), "masked_scatter_: expected source to have at least ", n,
              " elements (the number of ones in mask), but it has ", source.numel());
  if (n == 0) return self;
  at::Tensor src = on_device(source, self).reshape({-1}).narrow(0, 0, n);
  c10::List<std::optional<at::Tensor>> l;
  l.push_back(std::optional<at::Tensor>(m));
  target.index_put_(l, src);
  return self;
}

at::Tensor nonzero_static(const at::Tensor& self, c10::SymInt size_s, int64_t fill_value) {
  int64_t size = size_s.guard_int(__FILE__, __LINE__);
  TORCH_CHECK(size >= 0, "nonzero_static: 'size' must be an non-negative integer");
  c10::DeviceGuard g(self.device());
  at::Tensor nz = at::nonzero(self);
  int64_t n = nz.size(0);
  if (n >= size) return nz.narrow(0, 0, size).clone();
  at::Tensor out = at::empty({size, self.dim()}, nz.options());
  if (out.numel() == 0) return out;
  out.narrow(0, n, size - n).fill_(fill_value);
  if (n > 0) out.narrow(0, 0, n).copy_(nz);
  return out;
}

// =========================================================== unique along a dim / consecutive

// rows x [n, m]: returns (unique rows, inverse [n], counts [k]); sorts the
// rows lexicographically first unless consecutive.
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_rows(const at::Tensor& x, bool consecutive,
                                                           bool need_inverse = true) {
  int64_t n = x.size(0), m = x.size(1);
  auto lopt = x.options().dtype(at::kLong);
  at::Tensor perm, xs = x;
  if (!consecutive) {
    perm = at::arange(n, lopt);
    for (int64_t c = m - 1; c >= 0; --c) {
      at::Tensor keys = x.select(1, c).index_select(0, perm);
      at::Tensor order = std::get<1>(keys.sort(/*stable=*/true, 0, false));
      perm = perm.index_select(0, order);
    }
    xs = x.index_select(0, perm);
  }
  at::Tensor flags = at::empty({n}, x.options().dtype(at::kBool));
  flags.narrow(0, 0, 1).fill_(true);
  if (n > 1) {
    at::Tensor d = xs.narrow(0, 1, n - 1).ne(xs.narrow(0, 0, n - 1));
    // one column (unique_consecutive of a flat tensor): the comparison itself
    d = m == 1 ? d.view({n - 1}) : m > 0 ? d.any(1) : at::zeros({n - 1}, flags.options());
    flags.narrow(0, 1, n - 1).copy_(d);
  }
  at::Tensor pos = at::nonzero(flags).reshape({-1});
  int64_t k = pos.size(0);
  at::Tensor uniq = xs.index_select(0, pos);
  at::Tensor inverse;
  if (!need_inverse) {
    inverse = at::empty({0}, lopt); /* not asked for: no running count of the flags */
  } else if (consecutive) {
    inverse = at::cumsum(flags, 0, at::kLong).sub_(1);
  } else {
    at::Tensor group = at::cumsum(flags, 0, at::kLong).sub_(1);
    inverse = at::empty({n}, lopt);
    c10::List<std::optional<at::Tensor>> l;
    l.push_back(std::optional<at::Tensor>(perm));
    inverse.index_put_(l, group);
  }
  at::Tensor ends = at::empty({k + 1}, lopt);
  ends.narrow(0, 0, k).copy_(pos);
  ends.narrow(0, k, 1).fill_(n);
  at::Tensor counts = ends.narrow(0, 1, k).sub(ends.narrow(0, 0, k));
  return {uniq, inverse, counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_along(const at::Tensor& self, int64_t dim, bool consecutive,
                                                            bool return_inverse, bool return_counts) {
  c10::DeviceGuard g(self.device());
  auto lopt = self.options().dtype(at::kLong);
  dim = at::maybe_wrap_dim(dim, self.dim());
  at::Tensor moved = self.movedim(dim, 0);
  int64_t n = moved.size(0);
  if (n == 0 || self.numel() == 0) {
    TORCH_CHECK(n == 0 || self.numel() > 0, "Number of zero sized dimensions is more than one, so unique cannot be "
                "applied ");
    return {self.clone(), at::zeros({n}, lopt), at::zeros({n}, lopt)};
  }
  std::vector<int64_t> rest(moved.sizes().begin() + 1, moved.sizes().end());
  at::Tensor x = moved.reshape({n, -1});
  auto [u, inv, cnt] = unique_rows(x, consecutive);
  std::vector<int64_t> shape{u.size(0)};
  shape.insert(shape.end(), rest.begin(), rest.end());
  at::Tensor out = u.reshape(shape).movedim(0, dim).contiguous();
  return {out, inv, cnt};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_dim(const at::Tensor& self, int64_t dim, bool sorted,
                                                          bool return_inverse, bool return_counts) {
  return unique_along(self, dim, false, return_inverse, return_counts);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_consecutive(const at::Tensor& self, bool return_inverse,
                                                                  bool return_counts, std::optional<int64_t> dim) {
  if (dim.has_value() && self.dim() > 0) return unique_along(self, *dim, true, return_inverse, return_counts);
  c10::DeviceGuard g(self.device());
  auto lopt = self.options().dtype(at::kLong);
  at::Tensor flat = self.reshape({-1, 1});
  if (flat.size(0) == 0) return {self.reshape({0}).clone(), at::empty(self.sizes(), lopt), at::empty({0}, lopt)};
  auto [u, inv, cnt] = unique_rows(flat, true, return_inverse);
  // what was not asked for comes back empty, as on CPU
  return {u.reshape({-1}), return_inverse ? inv.view(self.sizes()) : at::empty({0}, lopt),
          return_counts ? cnt : at::empty({0}, lopt)};
}

// sorted distinct values and the inverse map (through _unique2)
std::tuple<at::Tensor, at::Tensor> unique_legacy(const at::Tensor& self, bool sorted, bool return_inverse) {
  auto [u, inv, cnt] = at::_unique2(self, sorted, return_inverse, false);
  return {u, inv};
}

// =========================================================== order statistics

// values/indices along dim through tpurt_select_rows
void select_dim(const at::Tensor& self, int64_t dim, bool keepdim, tpurt_select_kind kind, int64_t k,
                at::Tensor& values, at::Tensor* indices, const char* op) {
  c10::DeviceGuard g(self.device());
  dim = at::maybe_wrap_dim(dim, self.dim(), /*wrap_scalar=*/true);
  int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  std::vector<int64_t> shape = self.sizes().vec();
  if (self.dim() > 0) {
    if (keepdim) shape[dim] = 1;
    else shape.erase(shape.begin() + dim);
  }
  TORCH_CHECK(values.scalar_type() == self.scalar_type(), op, "(): Expected out tensor to have dtype ",
              self.scalar_type(), ", but got ", values.scalar_type(), " instead");
  resize_out(values, shape);
  if (indices) resize_out(*indices, shape);
  if (c10::multiply_integers(shape) == 0) return;
  TORCH_CHECK_INDEX(n > 0, op, "(): Expected reduction dim ", dim, " to have non-zero size.");
  int64_t R = self.numel() / n;
  at::Tensor x = self.dim() == 0 ? self.view({1, 1}) : self.movedim(dim, -1).reshape({R, n});
  at::Tensor v = at::empty({R, 1}, self.options()), i = at::empty({R, 1}, self.options().dtype(at::kLong));
  tpurt_view vv = view_of(v), iv = view_of(i), xv = view_of(x);
  check(tpurt_select_rows(stream_of(self), &vv, indices ? &iv : nullptr, &xv, kind, k), op);
  values.copy_(v.view(shape));
  if (indices) indices->copy_(i.view(shape));
}

std::tuple<at::Tensor&, at::Tensor&> kthvalue_out(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim,
                                                  at::Tensor& values, at::Tensor& indices) {
  int64_t wd = at::maybe_wrap_dim(dim, self.dim(), true);
  int64_t n = self.dim() == 0 ? 1 : self.size(wd);
  TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", wd);
  select_dim(self, dim, keepdim, TPURT_SELECT_KTH, k - 1, values, &indices, "kthvalue");
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> kthvalue(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(at::kLong));
  kthvalue_out(self, k, dim, keepdim, v, i);
  return {v, i};
}

std::tuple<at::Tensor&, at::Tensor&> median_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                    at::Tensor& values, at::Tensor& indices) {
  select_dim(self, dim, keepdim, TPURT_SELECT_MEDIAN, 0, values, &indices, "median");
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> median_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(at::kLong));
  median_dim_out(self, dim, keepdim, v, i);
  return {v, i};
}
std::tuple<at::Tensor&, at::Tensor&> nanmedian_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                       at::Tensor& values, at::Tensor& indices) {
  select_dim(self, dim, keepdim, TPURT_SELECT_NANMEDIAN, 0, values, &indices, "nanmedian");
  return {values, indices};
}
std::tuple<at::Tensor, at::Tensor> nanmedian_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(at::kLong));
  nanmedian_dim_out(self, dim, keepdim, v, i);
  return {v, i};
}
at::Tensor median_all_impl(const at::Tensor& self, tpurt_select_kind kind, const char* op) {
  c10::DeviceGuard g(self.device());
  if (self.numel() == 0) return at::full({}, NAN, self.options());
  at::Tensor v = at::empty({0}, self.options());
  select_dim(self.reshape({-1}), 0, false, kind, 0, v, nullptr, op);
  return v;
}
at::Tensor median_all(const at::Tensor& self) { return median_all_impl(self, TPURT_SELECT_MEDIAN, "median"); }
at::Tensor nanmedian_all(const at::Tensor& self) {
  return median_all_impl(self, TPURT_SELECT_NANMEDIAN, "nanmedian");
}

std::tuple<at::Tensor, at::Tensor> mode(const at::Tensor& self, int64_t dim, bool keepdim) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(at::kLong));
  select_dim(self, dim, keepdim, TPURT_SELECT_MODE, 0, v, &i, "mode");
  return {v, i};
}
std::tuple<at::Tensor&, at::Tensor&> mode_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                              at::Tensor& indices) {
  select_dim(self, dim, keepdim, TPURT_SELECT_MODE, 0, values, &indices, "mode");
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> aminmax_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim,
                                                 at::Tensor& mn, at::Tensor& mx) {
  c10::DeviceGuard g(self.device());
  if (dim.has_value()) {
    int64_t d = at::maybe_wrap_dim(*dim, self.dim(), true);
    TORCH_CHECK_INDEX(self.dim() == 0 || self.size(d) != 0, "aminmax(): Expected reduction dim ", d,
                      " to have non-zero size.");
    if (self.dim() == 0) {
      resize_out(mn, {});
      resize_out(mx, {});
      mn.copy_(self);
      mx.copy_(self);
      return {mn, mx};
    }
    at::amin_out(mn, self, {d}, keepdim);
    at::amax_out(mx, self, {d}, keepdim);
  } else {
    TORCH_CHECK(self.numel() > 0, "aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
                "identity.");
    at::Tensor flat = self.reshape({-1});
    at::Tensor a = at::amin(flat, {0}, false), b = at::amax(flat, {0}, false);
    std::vector<int64_t> shape = keepdim ? std::vector<int64_t>(self.dim(), 1) : std::vector<int64_t>{};
    resize_out(mn, shape);
    resize_out(mx, shape);
    mn.copy_(a.view(shape));
    mx.copy_(b.view(shape));
  }
  return {mn, mx};
}

// =========================================================== histograms

at::Tensor hist_input_2d(const at::Tensor& self, int64_t D) { return self.reshape({-1, D}); }

// Runs the kernel: hist of shape bins (given by the edges), optional weight
void run_hist(at::Tensor& hist, const at::Tensor& in2d, const std::optional<at::Tensor>& weight,
              const std::vector<at::Tensor>& edges, tpurt_hist_mode mode, bool density, const char* op) {
  int64_t D = in2d.size(1);
  std::vector<int64_t> shape;
  for (auto& e : edges) shape.push_back(e.numel() - 1);
  resize_out(hist, shape);
  if (hist.numel() == 0) return;
  std::vector<tpurt_view> ev;
  for (auto& e : edges) ev.push_back(view_of(e));
  tpurt_view hv = view_of(hist), iv = view_of(in2d), wv{};
  at::Tensor w;
  if (weight.has_value() && weight->defined()) {
    w = on_device(*weight, hist).reshape({-1});
    wv = view_of(w);
  }
  check(tpurt_histogramdd(stream_of(hist), &hv, &iv, w.defined() ? &wv : nullptr, ev.data(), static_cast<int>(D),
                          mode),
        op);
  if (density) {
    at::Tensor total = hist.sum();
    hist.div_(total);
    for (int64_t d = 0; d < D; ++d) {
      at::Tensor e = edges[d];
      at::Tensor widths = e.narrow(0, 1, e.numel() - 1).sub(e.narrow(0, 0, e.numel() - 1));
      std::vector<int64_t> vs(D, 1);
      vs[d] = widths.numel();
      hist.div_(widths.view(vs));
    }
  }
}

void check_hist_input(const at::Tensor& self, const std::optional<at::Tensor>& weight, const char* op) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), op, ": input tensor must be floating point, but got ",
              self.scalar_type());
  if (weight.has_value() && weight->defined())
    TORCH_CHECK(weight->scalar_type() == self.scalar_type(), op, ": if weight tensor is provided, input tensor and "
                "weight tensor should have the same dtype");
}

// outer edges of every dim: the range, or the data's min and max
std::vector<std::pair<double, double>> outer_edges(const at::Tensor& in2d, std::optional<at::ArrayRef<double>> range,
                                                   double expand, const char* op) {
  int64_t D = in2d.size(1);
  std::vector<std::pair<double, double>> r(D, {0.0, 0.0});
  if (range.has_value()) {
    TORCH_CHECK(static_cast<int64_t>(range->size()) == 2 * D, op, ": for a ", D, "-dimensional histogram, range "
                "should have ", 2 * D, " elements, but got ", range->size());
    for (int64_t d = 0; d < D; ++d) r[d] = {(*range)[2 * d], (*range)[2 * d + 1]};
  } else if (in2d.size(0) == 0) {
    for (int64_t d = 0; d < D; ++d) r[d] = {0.0, 1.0};  // no data: the unit range, as CPU
  } else {
    at::Tensor mn = at::amin(in2d, {0}).to(at::kDouble).cpu(), mx = at::amax(in2d, {0}).to(at::kDouble).cpu();
    for (int64_t d = 0; d < D; ++d) r[d] = {mn[d].item<double>(), mx[d].item<double>()};
  }
  for (int64_t d = 0; d < D; ++d) {
    auto& [lo, hi] = r[d];
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), op, ": range of [", lo, ", ", hi, "] is not finite");
    TORCH_CHECK(lo <= hi, op, ": min should not exceed max, but got min ", lo, " max ", hi);
    if (lo == hi) {
      lo -= expand;
      hi += expand;
    }
  }
  return r;
}

std::vector<at::Tensor> linear_edges(const at::Tensor& in2d, c10::IntArrayRef bins,
                                     std::optional<at::ArrayRef<double>> range, const char* op) {
  int64_t D = in2d.size(1);
  TORCH_CHECK(static_cast<int64_t>(bins.size()) == D, op, ": The size of bins must be equal to the innermost "
              "dimension of the input.");
  for (auto b : bins) TORCH_CHECK(b > 0, op, ": bins must be > 0, but got ", b);
  auto oe = outer_edges(in2d, range, 0.5, op);
  std::vector<at::Tensor> edges;
  for (int64_t d = 0; d < D; ++d)
    edges.push_back(at::linspace(oe[d].first, oe[d].second, bins[d] + 1, in2d.options()));
  return edges;
}

std::vector<at::Tensor> histogramdd_bin_edges(const at::Tensor& self, c10::IntArrayRef bins,
                                              std::optional<at::ArrayRef<double>> range,
                                              const std::optional<at::Tensor>& weight, bool density) {
  check_hist_input(self, weight, "torch.histogramdd");
  c10::DeviceGuard g(self.device());
  int64_t D = self.dim() == 0 ? 1 : self.size(-1);
  return linear_edges(hist_input_2d(self, D), bins, range, "torch.histogramdd");
}

at::Tensor histogramdd_from_bin_cts(const at::Tensor& self, c10::IntArrayRef bins,
                                    std::optional<at::ArrayRef<double>> range, const std::optional<at::Tensor>& weight,
                                    bool density) {
  check_hist_input(self, weight, "torch.histogramdd");
  c10::DeviceGuard g(self.device());
  int64_t D = self.dim() == 0 ? 1 : self.size(-1);
  at::Tensor in2d = hist_input_2d(self, D);
  auto edges = linear_edges(in2d, bins, range, "torch.histogramdd");
  at::Tensor hist = at::empty({0}, self.options());
  run_hist(hist, in2d, weight, edges, TPURT_HIST_LINEAR_SEARCH, density, "histogramdd");
  return hist;
}

at::Tensor histogramdd_from_bin_tensors(const at::Tensor& self, at::TensorList bins,
                                        const std::optional<at::Tensor>& weight, bool density) {
  check_hist_input(self, weight, "torch.histogramdd");
  c10::DeviceGuard g(self.device());
  int64_t D = self.dim() == 0 ? 1 : self.size(-1);
  TORCH_CHECK(static_cast<int64_t>(bins.size()) == D, "torch.histogramdd: expected ", D, " sequences of bin edges "
              "for each of the ", D, " dimensions of the histogram but got ", bins.size());
  std::vector<at::Tensor> edges;
  for (auto& b : bins) {
    TORCH_CHECK(b.dim() == 1, "torch.histogramdd: bins tensor should have one dimension, but got ", b.dim(),
                " dimensions");
    TORCH_CHECK(b.numel() > 0, "torch.histogramdd: bins tensor should have at least 1 element, but got ",
                b.numel(), " elements");
    TORCH_CHECK(b.scalar_type() == self.scalar_type(), "torch.histogramdd: input tensor and bins tensors should have ",
                "the same dtype, but got input ", self.scalar_type(), " and bins ", b.scalar_type());
    edges.push_back(on_device(b, self));
  }
  at::Tensor hist = at::empty({0}, self.options());
  run_hist(hist, hist_input_2d(self, D), weight, edges, TPURT_HIST_BINARY, density, "histogramdd");
  return hist;
}

std::tuple<at::Tensor&, at::Tensor&> histogram_bin_ct_out(const at::Tensor& self, int64_t bins,
                                                          std::optional<at::ArrayRef<double>> range,
                                                          const std::optional<at::Tensor>& weight, bool density,
                                                          at::Tensor& hist, at::Tensor& bin_edges) {
  check_hist_input(self, weight, "torch.histogram");
  c10::DeviceGuard g(self.device());
  at::Tensor in2d = self.reshape({-1, 1});
  int64_t b[1] = {bins};
  auto edges = linear_edges(in2d, b, range, "torch.histogram");
  resize_out(bin_edges, {bins + 1});
  bin_edges.copy_(edges[0]);
  run_hist(hist, in2d, weight, edges, TPURT_HIST_LINEAR_SEARCH, density, "histogram");
  return {hist, bin_edges};
}
std::tuple<at::Tensor, at::Tensor> histogram_bin_ct(const at::Tensor& self, int64_t bins,
                                                    std::optional<at::ArrayRef<double>> range,
                                                    const std::optional<at::Tensor>& weight, bool density) {
  at::Tensor h = at::empty({0}, self.options()), e = at::empty({0}, self.options());
  histogram_bin_ct_out(self, bins, range, weight, density, h, e);
  return {h, e};
}
std::tuple<at::Tensor&, at::Tensor&> histogram_bins_tensor_out(const at::Tensor& self, const at::Tensor& bins,
                                                               const std::optional<at::Tensor>& weight, bool density,
                                                               at::Tensor& hist, at::Tensor& bin_edges) {
  check_hist_input(self, weight, "torch.histogram");
  TORCH_CHECK(bins.dim() == 1, "torch.histogram: bins tensor should have one dimension, but got ", bins.dim(),
              " dimensions");
  c10::DeviceGuard g(self.device());
  at::Tensor e = on_device(bins, self);
  resize_out(bin_edges, e.sizes());
  bin_edges.copy_(e);
  run_hist(hist, self.reshape({-1, 1}), weight, {e}, TPURT_HIST_BINARY, density, "histogram");
  return {hist, bin_edges};
}
std::tuple<at::Tensor, at::Tensor> histogram_bins_tensor(const at::Tensor& self, const at::Tensor& bins,
                                                         const std::optional<at::Tensor>& weight, bool density) {
  at::Tensor h = at::empty({0}, self.options()), e = at::empty({0}, self.options());
  histogram_bins_tensor_out(self, bins, weight, density, h, e);
  return {h, e};
}

// Integer input as CUDA accepts it (Transformers' grouped-experts MoE routing
// counts tokens per expert with histc on int32 ids on every non-CPU device):
// a histogram of the input's dtype, bins computed exactly in integers.
at::Tensor& histc_int_out(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max,
                          at::Tensor& out) {
  int64_t lo = min.toLong(), hi = max.toLong();
  at::Tensor flat = self.reshape({-1});
  if (lo == hi && flat.numel() > 0) {
    lo = at::amin(flat, {0}).item<int64_t>();
    hi = at::amax(flat, {0}).item<int64_t>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(lo < hi, "torch.histc: max must be larger than min");
  resize_out(out, {bins});
  tpurt_view hv = view_of(out), iv = view_of(flat);
  check(tpurt_histc_int(stream_of(out), &hv, &iv, lo, hi), "histc");
  return out;
}

at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max,
                      at::Tensor& out) {
  bool integer = at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
  TORCH_CHECK(integer || at::isFloatingType(self.scalar_type()),
              "torch.histc: input tensor must be floating point or integer, but got ", self.scalar_type());
  TORCH_CHECK(bins > 0, "torch.histc(): bins must be > 0, but got ", bins, " for bins");
  c10::DeviceGuard g(self.device());
  if (integer) return histc_int_out(self, bins, min, max, out);
  double lo = min.toDouble(), hi = max.toDouble();
  at::Tensor in2d = self.reshape({-1, 1});
  if (lo == hi && in2d.size(0) > 0) {
    at::Tensor flat = in2d.reshape({-1});
    lo = at::amin(flat, {0}).item<double>();
    hi = at::amax(flat, {0}).item<double>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(!(std::isinf(lo) || std::isinf(hi) || std::isnan(lo) || std::isnan(hi)), "torch.histc: range of [",
              lo, ", ", hi, "] is not finite");
  TORCH_CHECK(lo < hi, "torch.histc: max must be larger than min");
  std::vector<at::Tensor> edges{at::linspace(lo, hi, bins + 1, self.options())};
  run_hist(out, in2d, std::nullopt, edges, TPURT_HIST_LINEAR, false, "histc");
  return out;
}
at::Tensor histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  at::Tensor out = at::empty({0}, self.options());
  return histc_out(self, bins, min, max, out);
}

// =========================================================== searchsorted / bucketize / isin

at::Tensor& searchsorted_out(const at::Tensor& seq_in, const at::Tensor& self_in, bool out_int32, bool right,
                             std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter_opt,
                             at::Tensor& out) {
  if (side.has_value()) {
    TORCH_CHECK(*side == "left" || *side == "right", "torch.searchsorted(): side can only be 'left' or 'right' but ",
                "got ", *side);
    TORCH_CHECK(!right || *side == "right", "torch.searchsorted(): side and right can't be set to opposites, got side "
                "of ", *side, " while right was True");
    right = *side == "right";
  }
  TORCH_CHECK(seq_in.dim() >= 1, "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 "
              "dimension");
  bool one_d = seq_in.dim() == 1;
  if (!one_d) {
    bool ok = seq_in.dim() == self_in.dim() &&
              seq_in.sizes().slice(0, seq_in.dim() - 1) == self_in.sizes().slice(0, self_in.dim() - 1);
    TORCH_CHECK(ok, "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of "
                "boundaries tensor and input value tensor must match, but we got boundaries tensor ", seq_in.sizes(),
                " and input value tensor ", self_in.sizes());
  }
  at::Tensor sorter;
  if (sorter_opt.has_value() && sorter_opt->defined()) {
    sorter = *sorter_opt;
    TORCH_CHECK(sorter.scalar_type() == at::kLong, "torch.searchsorted(): sorter must be a tensor of long dtype but "
                "got ", sorter.scalar_type());
    TORCH_CHECK(sorter.sizes() == seq_in.sizes(), "torch.searchsorted(): boundary and sorter must have the same size, "
                "but got boundary tensor ", seq_in.sizes(), "and got sorter tensor ", sorter.sizes());
  }
  TORCH_CHECK(!seq_in.is_complex() && !self_in.is_complex(), "torch.searchsorted(): complex inputs are not "
              "supported");
  TORCH_CHECK(out.scalar_type() == (out_int32 ? at::kInt : at::kLong), "torch.searchsorted(): output tensor's dtype ",
              "is wrong, it can only be Int(int32) or Long(int64) depending on whether out_int32 flag is True, but we ",
              "got output tensor's dtype ", out.scalar_type(), " and out_int32 flag is ", out_int32 ? "True" : "False");
  c10::DeviceGuard g(seq_in.device());
  at::ScalarType dt = at::promote_types(seq_in.scalar_type(), self_in.scalar_type());
  if (dt == at::kBool) dt = at::kLong;
  at::Tensor seq = on_device(seq_in, seq_in).to(dt), self = on_device(self_in, seq_in).to(dt);
  resize_out(out, self.sizes());
  if (out.numel() == 0) return out;
  int64_t M = seq.size(-1);
  at::Tensor seq2 = one_d ? seq.view({1, M}) : seq.reshape({-1, M});
  int64_t R = one_d ? 1 : seq2.size(0);
  at::Tensor vals = self.reshape({R, -1});
  at::Tensor o = out.is_contiguous() ? out.view({R, -1}) : at::empty({R, vals.size(1)}, out.options());
  tpurt_view ov = view_of(o), sv = view_of(seq2), vv = view_of(vals), srv{};
  at::Tensor srt;
  if (sorter.defined()) {
    srt = on_device(sorter, seq_in).reshape({seq2.size(0), M});
    srv = view_of(srt);
  }
  check(tpurt_searchsorted(stream_of(seq), &ov, &sv, &vv, srt.defined() ? &srv : nullptr, right), "searchsorted");
  if (!o.is_same(out) && !out.is_contiguous()) out.copy_(o.view(out.sizes()));
  return out;
}
at::Tensor ss_tensor(const at::Tensor& seq, const at::Tensor& self, bool out_int32, bool right,
                        std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  at::Tensor out = at::empty({0}, seq.options().dtype(out_int32 ? at::kInt : at::kLong));
  return searchsorted_out(seq, self, out_int32, right, side, sorter, out);
}
at::Tensor searchsorted_scalar(const at::Tensor& seq, const c10::Scalar& self, bool out_int32, bool right,
                               std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter) {
  TORCH_CHECK(seq.dim() == 1, "torch.searchsorted(): input value can be a scalar only when boundaries tensor "
              "dimension is 1, but we got boundaries tensor dim(", seq.dim(), ") and input value's dim(0) numel(1)");
  at::Tensor v = at::scalar_tensor(self, seq.options().dtype(at::native::result_type(seq, self)));
  return ss_tensor(seq, v, out_int32, right, side, sorter);
}
at::Tensor& searchsorted_scalar_out(const at::Tensor& seq, const c10::Scalar& self, bool out_int32, bool right,
                                    std::optional<c10::string_view> side, const std::optional<at::Tensor>& sorter,
                                    at::Tensor& out) {
  at::Tensor v = at::scalar_tensor(self, seq.options().dtype(at::native::result_type(seq, self)));
  return searchsorted_out(seq, v, out_int32, right, side, sorter, out);
}
at::Tensor& bucketize_out(const at::Tensor& self, const at::Tensor& boundaries, bool out_int32, bool right,
                          at::Tensor& out) {
  TORCH_CHECK(boundaries.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
  return searchsorted_out(boundaries, self, out_int32, right, std::nullopt, std::nullopt, out);
}
at::Tensor bucketize_t(const at::Tensor& self, const at::Tensor& boundaries, bool out_int32, bool right) {
  at::Tensor out = at::empty({0}, boundaries.options().dtype(out_int32 ? at::kInt : at::kLong));
  return bucketize_out(self, boundaries, out_int32, right, out);
}
at::Tensor bucketize_scalar(const c10::Scalar& self, const at::Tensor& boundaries, bool out_int32, bool right) {
  TORCH_CHECK(boundaries.dim() == 1, "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
  at::Tensor v = at::scalar_tensor(self, boundaries.options().dtype(at::native::result_type(boundaries, self)));
  return bucketize_t(v, boundaries, out_int32, right);
}

at::Tensor& isin_tt_out(const at::Tensor& elements, const at::Tensor& test, bool assume_unique, bool invert,
                        at::Tensor& out) {
  c10::DeviceGuard g(elements.device());
  resize_out(out, elements.sizes());
  if (elements.numel() == 0) return out;
  at::ScalarType dt = at::promote_types(elements.scalar_type(), test.scalar_type());
  at::Tensor t = on_device(test, elements).to(dt).reshape({-1});
  if (t.numel() == 0) {
    out.fill_(invert);
    return out;
  }
  at::Tensor e = elements.to(dt).reshape({-1});
  at::Tensor s = std::get<0>(t.sort(false, 0, false));
  at::Tensor pos = ss_tensor(s, e, false, false, std::nullopt, std::nullopt);
  pos = at::clamp_max(pos, t.numel() - 1);
  at::Tensor found = s.index_select(0, pos).eq(e);
  if (invert) found = at::logical_not(found);
  out.copy_(found.view(elements.sizes()));
  return out;
}
at::Tensor& isin_ts_out(const at::Tensor& elements, const c10::Scalar& test, bool assume_unique, bool invert,
                        at::Tensor& out) {
  c10::DeviceGuard g(elements.device());
  resize_out(out, elements.sizes());
  if (elements.numel() == 0) return out;
  at::Tensor r = invert ? elements.ne(test) : elements.eq(test);
  out.copy_(r);
  return out;
}
at::Tensor& isin_st_out(const c10::Scalar& element, const at::Tensor& test, bool assume_unique, bool invert,
                        at::Tensor& out) {
  at::Tensor e = at::scalar_tensor(element, test.options().dtype(at::native::result_type(test, element)));
  return isin_tt_out(e, test, assume_unique, invert, out);
}

// =========================================================== repeat_interleave, count_nonzero

at::Tensor repeat_interleave_tensor(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  c10::DeviceGuard g(repeats.device());
  if (repeats.numel() == 0) return at::empty({0}, repeats.options());
  at::Tensor cum = at::cumsum(repeats, 0, at::kLong);
  TORCH_CHECK(!at::lt(repeats, 0).any().item<bool>(), "repeats can not be negative");
  int64_t total = cum[-1].item<int64_t>();
  if (output_size.has_value())
    TORCH_CHECK(output_size->guard_int(__FILE__, __LINE__) == total, "allocated size does not match required size");
  at::Tensor pos = at::arange(total, cum.options());
  at::Tensor r = ss_tensor(cum, pos, repeats.scalar_type() == at::kInt, true, std::nullopt, std::nullopt);
  return r;
}

at::Tensor count_nonzero_dims(const at::Tensor& self, c10::IntArrayRef dims) {
  c10::DeviceGuard g(self.device());
  return at::sum(self.ne(0), dims, false, at::kLong);
}

// =========================================================== segment reduce

tpurt_segment_op seg_op(c10::string_view r) {
  if (r == "sum") return TPURT_SEG_SUM;
  if (r == "mean") return TPURT_SEG_MEAN;
  if (r == "max") return TPURT_SEG_MAX;
  if (r == "min") return TPURT_SEG_MIN;
  if (r == "prod") return TPURT_SEG_PROD;
  TORCH_CHECK(false, "reduce argument must be either sum, max, min, mean or prod, got ", r);
}

// offsets [O, nseg + 1] from lengths or offsets
at::Tensor seg_offsets(const at::Tensor& data, const std::optional<at::Tensor>& lengths,
                       const std::optional<at::Tensor>& offsets, int64_t axis, int64_t* nseg) {
  int64_t O = 1;
  for (int64_t d = 0; d < axis; ++d) O *= data.size(d);
  if (lengths.has_value() && lengths->defined()) {
    at::Tensor l = on_device(*lengths, data);
    TORCH_CHECK(is_index_dtype(l), "segment_reduce(): lengths must be int32 or int64");
    TORCH_CHECK(l.dim() == axis + 1, "segment_reduce(): Expected axis to be the last dimension of lengths but got ",
                axis, ".");
    *nseg = l.size(-1);
    at::Tensor l2 = l.reshape({O, *nseg});
    at::Tensor off = at::zeros({O, *nseg + 1}, l.options().dtype(at::kLong));
    if (*nseg > 0) off.narrow(1, 1, *nseg).copy_(at::cumsum(l2, 1, at::kLong));
    return off;
  }
  TORCH_CHECK(offsets.has_value() && offsets->defined(), "segment_reduce(): Either lengths or offsets must be defined");
  at::Tensor o = on_device(*offsets, data);
  TORCH_CHECK(is_index_dtype(o), "segment_reduce(): offsets must be int32 or int64");
  TORCH_CHECK(o.dim() == axis + 1, "segment_reduce(): Expected axis to be the last dimension of offsets but got ",
              axis, ".");
  *nseg = o.size(-1) - 1;
  return o.reshape({O, *nseg + 1});
}

at::Tensor segment_reduce(const at::Tensor& data, c10::string_view reduce, const std::optional<at::Tensor>& lengths,
                          const std::optional<at::Tensor>& indices, const std::optional<at::Tensor>& offsets,
                          int64_t axis, bool unsafe, const std::optional<c10::Scalar>& initial) {
  TORCH_CHECK(!(indices.has_value() && indices->defined()),
              "segment_reduce(): indices based reduction is not supported yet.");
  tpurt_segment_op op = seg_op(reduce);
  axis = at::maybe_wrap_dim(axis, data.dim());
  TORCH_CHECK(data.numel() >= 0);
  c10::DeviceGuard g(data.device());
  int64_t nseg = 0;
  at::Tensor off = seg_offsets(data, lengths, offsets, axis, &nseg);
  if (!unsafe && lengths.has_value() && lengths->defined() && off.numel() > 0) {
    bool ok = off.select(1, nseg).eq(data.size(axis)).all().item<bool>();
    TORCH_CHECK(ok, "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) "
                "when !unsafe.");
  }
  int64_t O = off.size(0), S = data.size(axis), I = data.numel() / std::max<int64_t>(1, O * S);
  if (O * S == 0) {
    I = 1;
    for (int64_t d = axis + 1; d < data.dim(); ++d) I *= data.size(d);
  }
  std::vector<int64_t> shape = data.sizes().vec();
  shape[axis] = nseg;
  at::Tensor out = at::empty(shape, data.options());
  if (out.numel() == 0) return out;
  at::Tensor d3 = data.contiguous().view({O, S, I});
  tpurt_view ov = view_of(out.view({O, nseg, I})), dv = view_of(d3), fv = view_of(off);
  check(tpurt_segment_reduce(stream_of(data), &ov, &dv, &fv, op, initial.has_value(),
                             initial.has_value() ? initial->toDouble() : 0.0),
        "segment_reduce");
  return out;
}

at::Tensor segment_reduce_backward(const at::Tensor& grad, const at::Tensor& output, const at::Tensor& data,
                                   c10::string_view reduce, const std::optional<at::Tensor>& lengths,
                                   const std::optional<at::Tensor>& offsets, int64_t axis,
                                   const std::optional<c10::Scalar>& initial) {
  tpurt_segment_op op = seg_op(reduce);
  axis = at::maybe_wrap_dim(axis, data.dim());
  c10::DeviceGuard g(data.device());
  int64_t nseg = 0;
  at::Tensor off = seg_offsets(data, lengths, offsets, axis, &nseg);
  int64_t O = off.size(0), S = data.size(axis), I = 1;
  for (int64_t d = axis + 1; d < data.dim(); ++d) I *= data.size(d);
  at::Tensor gd = at::empty(data.sizes(), data.options());
  if (gd.numel() == 0) return gd;
  at::Tensor d3 = data.contiguous().view({O, S, I});
  at::Tensor g3 = grad.contiguous().view({O, nseg, I}), r3 = output.contiguous().view({O, nseg, I});
  tpurt_view gdv = view_of(gd.view({O, S, I})), gv = view_of(g3), rv = view_of(r3), dv = view_of(d3),
             fv = view_of(off);
  check(tpurt_segment_reduce_backward(stream_of(data), &gdv, &gv, &rv, &dv, &fv, op, initial.has_value(),
                                      initial.has_value() ? initial->toDouble() : 0.0),
        "segment_reduce_backward");
  return gd;
}

// =========================================================== small composites

at::Tensor& renorm_out(const at::Tensor& self, const c10::Scalar& p, int64_t dim, const c10::Scalar& maxnorm,
                       at::Tensor& out) {
  TORCH_CHECK(!maxnorm.isComplex(), "renorm: maxnorm must be real-valued");
  TORCH_CHECK(maxnorm.toDouble() >= 0.0, "renorm: expected maxnorm to be >= 0 but got ", maxnorm.toDouble());
  TORCH_CHECK(p.toDouble() > 0.0, "renorm: non-positive-norm not supported");
  const auto ndim = self.dim();
  TORCH_CHECK(ndim > 1, "renorm: input needs at least 2 dimensions, got ", ndim, " dimensions");
  c10::DeviceGuard g(self.device());
  dim = at::maybe_wrap_dim(dim, ndim);
  std::vector<int64_t> rd;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != dim) rd.push_back(d);
  at::Tensor norm = at::linalg_vector_norm(self, p, rd, /*keepdim=*/true);
  double mx = maxnorm.toDouble();
  at::Tensor factor = at::where(norm.gt(mx), norm.add(1e-7).reciprocal().mul(mx), at::ones_like(norm));
  at::Tensor r = self.mul(factor);
  resize_out(out, self.sizes());
  out.copy_(r);
  return out;
}

at::Tensor trace(const at::Tensor& self) {
  TORCH_CHECK(self.dim() == 2, "trace: expected a matrix, but got tensor with dim ", self.dim());
  c10::DeviceGuard g(self.device());
  at::Tensor d = self.diagonal();
  return at::isIntegralType(self.scalar_type(), true) ? at::sum(d, at::kLong) : at::sum(d);
}

at::Tensor channel_shuffle(const at::Tensor& self, c10::SymInt groups_s) {
  int64_t groups = groups_s.guard_int(__FILE__, __LINE__);
  TORCH_CHECK(self.dim() > 2, "channel_shuffle expects input to have at least 3 dimensions, but got input with "
              "sizes ", self.sizes());
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive.", " Value of groups:", groups);
  int64_t c = self.size(1);
  TORCH_CHECK(c % groups == 0, "Number of channels must be divisible by groups. Got ", c, " channels and ", groups,
              " groups.");
  c10::DeviceGuard g(self.device());
  std::vector<int64_t> s{self.size(0), groups, c / groups};
  for (int64_t d = 2; d < self.dim(); ++d) s.push_back(self.size(d));
  at::Tensor r = self.reshape(s).transpose(1, 2).contiguous();
  return r.view(self.sizes());
}

at::Tensor unfold_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes_s, int64_t dim, int64_t size,
                           int64_t step) {
  std::vector<int64_t> input_sizes;
  for (auto& x : input_sizes_s) input_sizes.push_back(x.guard_int(__FILE__, __LINE__));
  c10::DeviceGuard g(grad.device());
  int64_t nd = static_cast<int64_t>(input_sizes.size());
  if (nd == 0) return grad.reshape({}).clone();
  dim = at::maybe_wrap_dim(dim, nd);
  at::Tensor out = at::zeros(input_sizes, grad.options());
  int64_t nw = grad.size(dim);
  if (grad.numel() == 0 || nw == 0 || size == 0) return out;
  at::Tensor src = grad.movedim(-1, dim + 1);
  std::vector<int64_t> shape = src.sizes().vec();
  shape[dim] = nw * size;
  shape.erase(shape.begin() + dim + 1);
  src = src.reshape(shape);
  auto lopt = grad.options().dtype(at::kLong);
  at::Tensor idx = at::arange(nw, lopt).mul_(step).unsqueeze(1).add(at::arange(size, lopt).unsqueeze(0)).reshape({-1});
  out.index_add_(dim, idx, src);
  return out;
}

bool equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (!self.is_same_size(other)) return false;
  if (self.numel() == 0) return true;
  c10::DeviceGuard g(self.device());
  return at::eq(self, other).all().item<bool>();
}

at::Tensor& logspace_out(const c10::Scalar& start, const c10::Scalar& end, int64_t steps, double base,
                         at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  c10::DeviceGuard g(out.device());
  resize_out(out, {steps});
  if (steps == 0) return out;
  at::ScalarType ct = out.scalar_type() == at::kDouble || at::isIntegralType(out.scalar_type(), true) ? at::kDouble
                                                                                                    : at::kFloat;
  at::Tensor e = at::linspace(start, end, steps, out.options().dtype(ct));
  at::Tensor r = at::pow(c10::Scalar(base), e);
  out.copy_(r);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_embedding_bag", TORCH_FN(embedding_bag_fwd));
  m.impl("_embedding_bag_forward_only", TORCH_FN(embedding_bag_fwd));
  m.impl("_embedding_bag_backward", TORCH_FN(embedding_bag_backward));
  m.impl("_embedding_bag_dense_backward", TORCH_FN(embedding_bag_dense_backward));
  m.impl("_embedding_bag_per_sample_weights_backward", TORCH_FN(embedding_bag_psw_backward));
  m.impl("embedding_renorm_", TORCH_FN(embedding_renorm_));
  m.impl("index_fill_.int_Scalar", TORCH_FN(index_fill_scalar_));
  m.impl("index_fill_.int_Tensor", TORCH_FN(index_fill_tensor_));
  m.impl("index_copy.out", TORCH_FN(index_copy_out));
  m.impl("index_reduce.out", TORCH_FN(index_reduce_out));
  m.impl("put_", TORCH_FN(put_));
  m.impl("take", TORCH_FN(take));
  m.impl("take.out", TORCH_FN(take_out));
  m.impl("masked_scatter_", TORCH_FN(masked_scatter_));
  m.impl("nonzero_static", TORCH_FN(nonzero_static));
  m.impl("unique_dim", TORCH_FN(unique_dim));
  m.impl("unique_consecutive", TORCH_FN(unique_consecutive));
  m.impl("_unique", TORCH_FN(unique_legacy));
  m.impl("kthvalue.values", TORCH_FN(kthvalue_out));
  m.impl("kthvalue", TORCH_FN(kthvalue));
  m.impl("median", TORCH_FN(median_all));
  m.impl("nanmedian", TORCH_FN(nanmedian_all));
  m.impl("median.dim_values", TORCH_FN(median_dim_out));
  m.impl("median.dim", TORCH_FN(median_dim));
  m.impl("nanmedian.dim_values", TORCH_FN(nanmedian_dim_out));
  m.impl("nanmedian.dim", TORCH_FN(nanmedian_dim));
  m.impl("mode", TORCH_FN(mode));
  m.impl("mode.values", TORCH_FN(mode_out));
  m.impl("aminmax.out", TORCH_FN(aminmax_out));
  m.impl("histc", TORCH_FN(histc));
  m.impl("histc.out", TORCH_FN(histc_out));
  m.impl("histogram.bin_ct", TORCH_FN(histogram_bin_ct));
  m.impl("histogram.bin_ct_out", TORCH_FN(histogram_bin_ct_out));
  m.impl("histogram.bins_tensor", TORCH_FN(histogram_bins_tensor));
  m.impl("histogram.bins_tensor_out", TORCH_FN(histogram_bins_tensor_out));
  m.impl("_histogramdd_bin_edges", TORCH_FN(histogramdd_bin_edges));
  m.impl("_histogramdd_from_bin_cts", TORCH_FN(histogramdd_from_bin_cts));
  m.impl("_histogramdd_from_bin_tensors", TORCH_FN(histogramdd_from_bin_tensors));
  m.impl("searchsorted.Tensor", TORCH_FN(ss_tensor));
  m.impl("searchsorted.Tensor_out", TORCH_FN(searchsorted_out));
  m.impl("searchsorted.Scalar", TORCH_FN(searchsorted_scalar));
  m.impl("searchsorted.Scalar_out", TORCH_FN(searchsorted_scalar_out));
  m.impl("bucketize.Tensor", TORCH_FN(bucketize_t));
  m.impl("bucketize.Tensor_out", TORCH_FN(bucketize_out));
  m.impl("bucketize.Scalar", TORCH_FN(bucketize_scalar));
  m.impl("isin.Tensor_Tensor_out", TORCH_FN(isin_tt_out));
  m.impl("isin.Tensor_Scalar_out", TORCH_FN(isin_ts_out));
  m.impl("isin.Scalar_Tensor_out", TORCH_FN(isin_st_out));
  m.impl("repeat_interleave.Tensor", TORCH_FN(repeat_interleave_tensor));
  m.impl("count_nonzero.dim_IntList", TORCH_FN(count_nonzero_dims));
  m.impl("segment_reduce", TORCH_FN(segment_reduce));
  m.impl("_segment_reduce_backward", TORCH_FN(segment_reduce_backward));
  m.impl("renorm.out", TORCH_FN(renorm_out));
  m.impl("trace", TORCH_FN(trace));
  m.impl("channel_shuffle", TORCH_FN(channel_shuffle));
  m.impl("unfold_backward", TORCH_FN(unfold_backward));
  m.impl("equal", TORCH_FN(equal));
  m.impl("logspace.out", TORCH_FN(logspace_out));
}

}  // namespace torch_tpu
