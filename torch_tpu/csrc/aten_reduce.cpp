// ATen kernels of the reduction family: reductions (sum, mean, prod, max /
// min, amax / amin, argmax / argmin, var / std (+ _mean), norms, logsumexp,
// any / all, nansum), scans (cumsum, cumprod, cummax, cummin), softmax /
// log_softmax and their backward, layer / RMS / batch / group norm forward
// and backward. The glue resolves dims, output shapes and dtypes and builds
// runtime views; every computation is a runtime call.
#include "glue.h"

#include <ATen/WrapDimUtils.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <bitset>
#include <cmath>
#include <tuple>

namespace torch_tpu {
namespace {

using Mask = std::bitset<64>;

tpurt_stream* stream_of(const at::Tensor& t) { return current_stream(t.device().index()); }

void check_tpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().type() == kTpu, name, ": expected a tpu tensor, got one on ", t.device());
}

// dims (None or empty = all) -> mask over self's dims; IndexError when out of range
Mask make_mask(const at::Tensor& self, at::OptionalIntArrayRef dims) {
  int64_t nd = self.dim();
  Mask m;
  if (!dims.has_value() || dims->empty()) {
    for (int64_t k = 0; k < nd; k++) m.set(k);
    return m;
  }
  for (int64_t d : *dims) {
    int64_t w = at::maybe_wrap_dim(d, nd);
    if (nd == 0) continue;
    TORCH_CHECK(!m[w], "dim ", w, " appears multiple times in the list of dims");
    m.set(w);
  }
  return m;
}

Mask mask_of(const at::Tensor& self, int64_t dim) {
  int64_t w = at::maybe_wrap_dim(dim, self.dim());
  Mask m;
  if (self.dim() > 0) m.set(w);
  return m;
}

std::vector<int64_t> reduced_shape(const at::Tensor& self, const Mask& m, bool keepdim) {
  std::vector<int64_t> s;
  for (int64_t k = 0; k < self.dim(); k++) {
    if (m[k]) {
      if (keepdim) s.push_back(1);
    } else {
      s.push_back(self.size(k));
    }
  }
  return s;
}

// view of out (shape reduced_shape) with self's ndim: size 1 on reduced dims
tpurt_view out_view(const at::Tensor& self, const at::Tensor& out, const Mask& m, bool keepdim) {
  tpurt_view v = view_of(out);
  v.ndim = static_cast<int>(self.dim());
  int64_t j = 0;
  for (int64_t k = 0; k < self.dim(); k++) {
    if (m[k]) {
      v.sizes[k] = 1;
      v.strides[k] = 0;
      if (keepdim) j++;
    } else {
      v.sizes[k] = out.size(j);
      v.strides[k] = out.stride(j);
      j++;
    }
  }
  return v;
}

// the input as a view in compute-friendly dtype (complex unsupported)
void check_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(t.scalar_type()), name, ": complex tensors are not supported on TPU");
}

void run_reduce(tpurt_reduce_op op, const char* name, const at::Tensor& self, const Mask& m, bool keepdim,
                const at::Tensor& out, const at::Tensor* out2, double p0, bool std_ = false) {
  check_tpu(self, name);
  check_dtype(self, name);
  auto shape = reduced_shape(self, m, keepdim);
  at::native::resize_output(out, shape);
  if (out2) at::native::resize_output(*out2, shape);
  if (out.numel() == 0) return;
  c10::DeviceGuard guard(self.device());
  tpurt_view iv = view_of(self), ov = out_view(self, out, m, keepdim), o2v{};
  if (out2) o2v = out_view(self, *out2, m, keepdim);
  if (std_)
    check(tpurt_reduce_std(stream_of(self), &ov, out2 ? &o2v : nullptr, &iv, p0), name);
  else
    check(tpurt_reduce(stream_of(self), op, &ov, out2 ? &o2v : nullptr, &iv, p0), name);
}

// max / min / arg* / amax of nothing
void check_nonempty(const at::Tensor& self, const Mask& m, bool full, const char* name) {
  if (self.numel() != 0) return;
  if (full) {
    std::string n(name);
    if (n == "argmax" || n == "argmin")
      TORCH_CHECK_INDEX(false, name, "(): Expected reduction dim to be specified for input.numel() == 0.");
    TORCH_CHECK(false, name, "(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
                             "reduction dim with the 'dim' argument.");
  }
  for (int64_t k = 0; k < self.dim(); k++)
    TORCH_CHECK_INDEX(!(m[k] && self.size(k) == 0), name, "(): Expected reduction dim ", k,
                      " to have non-zero size.");
}

at::ScalarType sum_dtype(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  if (dtype) return *dtype;
  if (at::isIntegralType(self.scalar_type(), /*includeBool=*/true)) return at::kLong;
  return self.scalar_type();
}

at::Tensor new_out(const at::Tensor& self, at::ScalarType dt) { return at::empty({0}, self.options().dtype(dt)); }

// ------------------------------------------------------------------ sums

at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<at::ScalarType> dtype, at::Tensor& out) {
  run_reduce(TPURT_RED_SUM, "sum", self, make_mask(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor sum_full(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  at::Tensor out = new_out(self, sum_dtype(self, dtype));
  return sum_out(self, std::nullopt, false, dtype, out);
}
at::Tensor& sum_full_out(const at::Tensor& self, std::optional<at::ScalarType> dtype, at::Tensor& out) {
  return sum_out(self, std::nullopt, false, dtype, out);
}

at::Tensor& nansum_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                       std::optional<at::ScalarType> dtype, at::Tensor& out) {
  run_reduce(TPURT_RED_NANSUM, "nansum", self, make_mask(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor nansum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                  std::optional<at::ScalarType> dtype) {
  at::Tensor out = new_out(self, sum_dtype(self, dtype));
  return nansum_out(self, dim, keepdim, dtype, out);
}

at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                     std::optional<at::ScalarType> dtype, at::Tensor& out) {
  at::ScalarType dt = dtype.value_or(out.scalar_type());
  TORCH_CHECK(at::isFloatingType(dt) || at::isComplexType(dt),
              "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. "
              "Got: ",
              self.scalar_type());
  run_reduce(TPURT_RED_MEAN, "mean", self, make_mask(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor mean_full(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  at::ScalarType dt = dtype.value_or(self.scalar_type());
  TORCH_CHECK(at::isFloatingType(dt) || at::isComplexType(dt),
              "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. "
              "Got: ",
              dt);
  at::Tensor out = new_out(self, dt);
  return mean_out(self, std::nullopt, false, dtype, out);
}
at::Tensor& mean_full_out(const at::Tensor& self, std::optional<at::ScalarType> dtype, at::Tensor& out) {
  return mean_out(self, std::nullopt, false, dtype, out);
}

at::Tensor& prod_int_out(const at::Tensor& self, int64_t dim, bool keepdim, std::optional<at::ScalarType> dtype,
                         at::Tensor& out) {
  run_reduce(TPURT_RED_PROD, "prod", self, mask_of(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& prod_full_out(const at::Tensor& self, std::optional<at::ScalarType> dtype, at::Tensor& out) {
  run_reduce(TPURT_RED_PROD, "prod", self, make_mask(self, std::nullopt), false, out, nullptr, 0);
  return out;
}
at::Tensor prod_full(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  at::Tensor out = new_out(self, sum_dtype(self, dtype));
  return prod_full_out(self, dtype, out);
}

// -------------------------------------------------------- max, min, arg

at::Tensor max_min_full(const at::Tensor& self, bool mx) {
  const char* name = mx ? "max" : "min";
  check_nonempty(self, Mask(), true, name);
  at::Tensor out = new_out(self, self.scalar_type());
  run_reduce(mx ? TPURT_RED_MAX : TPURT_RED_MIN, name, self, make_mask(self, std::nullopt), false, out, nullptr, 0);
  return out;
}
at::Tensor max_full(const at::Tensor& self) { return max_min_full(self, true); }
at::Tensor min_full(const at::Tensor& self) { return max_min_full(self, false); }
at::Tensor& max_full_out(const at::Tensor& self, at::Tensor& out) {
  check_nonempty(self, Mask(), true, "max");
  run_reduce(TPURT_RED_MAX, "max", self, make_mask(self, std::nullopt), false, out, nullptr, 0);
  return out;
}
at::Tensor& min_full_out(const at::Tensor& self, at::Tensor& out) {
  check_nonempty(self, Mask(), true, "min");
  run_reduce(TPURT_RED_MIN, "min", self, make_mask(self, std::nullopt), false, out, nullptr, 0);
  return out;
}

std::tuple<at::Tensor&, at::Tensor&> max_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                                 at::Tensor& indices) {
  Mask m = mask_of(self, dim);
  check_nonempty(self, m, false, "max");
  run_reduce(TPURT_RED_MAX, "max", self, m, keepdim, values, &indices, 0);
  return {values, indices};
}
std::tuple<at::Tensor&, at::Tensor&> min_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& values,
                                                 at::Tensor& indices) {
  Mask m = mask_of(self, dim);
  check_nonempty(self, m, false, "min");
  run_reduce(TPURT_RED_MIN, "min", self, m, keepdim, values, &indices, 0);
  return {values, indices};
}

at::Tensor& amax_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  Mask m = make_mask(self, dim);
  check_nonempty(self, m, false, "amax");
  run_reduce(TPURT_RED_MAX, "amax", self, m, keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& amin_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  Mask m = make_mask(self, dim);
  check_nonempty(self, m, false, "amin");
  run_reduce(TPURT_RED_MIN, "amin", self, m, keepdim, out, nullptr, 0);
  return out;
}

at::Tensor& arg_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out, bool mx) {
  const char* name = mx ? "argmax" : "argmin";
  tpurt_reduce_op op = mx ? TPURT_RED_ARGMAX : TPURT_RED_ARGMIN;
  if (!dim) {
    check_nonempty(self, Mask(), true, name);
    // flattened index: row-major over all dims
    if (keepdim) {
      run_reduce(op, name, self, make_mask(self, std::nullopt), true, out, nullptr, 0);
    } else {
      run_reduce(op, name, self, make_mask(self, std::nullopt), false, out, nullptr, 0);
    }
    return out;
  }
  Mask m = mask_of(self, *dim);
  check_nonempty(self, m, false, name);
  run_reduce(op, name, self, m, keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& argmax_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  return arg_out(self, dim, keepdim, out, true);
}
at::Tensor& argmin_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  return arg_out(self, dim, keepdim, out, false);
}

// ------------------------------------------------------------- var, std

at::ScalarType real_dtype(const at::Tensor& self) {
  at::ScalarType t = self.scalar_type();
  TORCH_CHECK(at::isFloatingType(t), "std and var only support floating point and complex dtypes");
  return t;
}
double correction_of(const std::optional<c10::Scalar>& c) { return c ? c->toDouble() : 1.0; }

at::Tensor& var_out(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<c10::Scalar>& correction,
                    bool keepdim, at::Tensor& out) {
  real_dtype(self);
  run_reduce(TPURT_RED_VAR, "var", self, make_mask(self, dim), keepdim, out, nullptr, correction_of(correction));
  return out;
}
at::Tensor var(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<c10::Scalar>& correction,
               bool keepdim) {
  at::Tensor out = new_out(self, real_dtype(self));
  return var_out(self, dim, correction, keepdim, out);
}
at::Tensor& std_out(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<c10::Scalar>& correction,
                    bool keepdim, at::Tensor& out) {
  real_dtype(self);
  run_reduce(TPURT_RED_VAR, "std", self, make_mask(self, dim), keepdim, out, nullptr, correction_of(correction), true);
  return out;
}
at::Tensor std_(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<c10::Scalar>& correction,
                bool keepdim) {
  at::Tensor out = new_out(self, real_dtype(self));
  return std_out(self, dim, correction, keepdim, out);
}
std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                            const std::optional<c10::Scalar>& correction, bool keepdim) {
  at::Tensor v = new_out(self, real_dtype(self)), m = new_out(self, self.scalar_type());
  run_reduce(TPURT_RED_VAR, "var_mean", self, make_mask(self, dim), keepdim, v, &m, correction_of(correction));
  return {v, m};
}
std::tuple<at::Tensor, at::Tensor> std_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                            const std::optional<c10::Scalar>& correction, bool keepdim) {
  at::Tensor v = new_out(self, real_dtype(self)), m = new_out(self, self.scalar_type());
  run_reduce(TPURT_RED_VAR, "std_mean", self, make_mask(self, dim), keepdim, v, &m, correction_of(correction), true);
  return {v, m};
}

// ----------------------------------------------------- norms, logsumexp

double ord_of(const c10::Scalar& s) { return s.toDouble(); }

at::Tensor& vector_norm_out(const at::Tensor& self, const c10::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype, at::Tensor& out) {
  double p = ord_of(ord);
  Mask m = make_mask(self, dim);
  if (self.numel() == 0 && (p < 0 || std::isinf(p))) {
    for (int64_t k = 0; k < self.dim(); k++)
      TORCH_CHECK_INDEX(!(m[k] && self.size(k) == 0), "linalg.vector_norm cannot compute the ", ord,
                        " norm on the empty tensor because the operation does not have an identity");
  }
  run_reduce(TPURT_RED_NORM, "linalg_vector_norm", self, m, keepdim, out, nullptr, p);
  return out;
}

at::Tensor& norm_out(const at::Tensor& self, const std::optional<c10::Scalar>& p, at::IntArrayRef dim, bool keepdim,
                     at::Tensor& out) {
  return vector_norm_out(self, p.value_or(2), dim, keepdim, std::nullopt, out);
}
at::Tensor& norm_dtype_out(const at::Tensor& self, const std::optional<c10::Scalar>& p, at::IntArrayRef dim,
                           bool keepdim, at::ScalarType dtype, at::Tensor& out) {
  return vector_norm_out(self, p.value_or(2), dim, keepdim, dtype, out);
}

at::Tensor& logsumexp_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  run_reduce(TPURT_RED_LOGSUMEXP, "logsumexp", self, make_mask(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor logsumexp(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  at::ScalarType dt = at::isIntegralType(self.scalar_type(), true) ? at::typeMetaToScalarType(at::get_default_dtype())
                                                                   : self.scalar_type();
  at::Tensor out = new_out(self, dt);
  return logsumexp_out(self, dim, keepdim, out);
}

// ------------------------------------------------------------- any, all

at::Tensor& any_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out) {
  run_reduce(TPURT_RED_ANY, "any", self, make_mask(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& any_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  run_reduce(TPURT_RED_ANY, "any", self, mask_of(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& any_all_out(const at::Tensor& self, at::Tensor& out) { return any_dims_out(self, std::nullopt, false, out); }
at::Tensor& all_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out) {
  run_reduce(TPURT_RED_ALL, "all", self, make_mask(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& all_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  run_reduce(TPURT_RED_ALL, "all", self, mask_of(self, dim), keepdim, out, nullptr, 0);
  return out;
}
at::Tensor& all_all_out(const at::Tensor& self, at::Tensor& out) { return all_dims_out(self, std::nullopt, false, out); }

// ----------------------------------------------------------------- scans

void run_scan(tpurt_scan_op op, const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& out,
              const at::Tensor* idx) {
  check_tpu(self, name);
  check_dtype(self, name);
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  at::native::resize_output(out, self.sizes());
  if (idx) at::native::resize_output(*idx, self.sizes());
  if (self.numel() == 0) return;
  c10::DeviceGuard guard(self.device());
  tpurt_view iv = view_of(self), ov = view_of(out), xv{};
  if (idx) xv = view_of(*idx);
  check(tpurt_scan(stream_of(self), op, &ov, idx ? &xv : nullptr, &iv, static_cast<int>(d)), name);
}

at::Tensor& cumsum_out(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, at::Tensor& out) {
  run_scan(TPURT_SCAN_CUMSUM, "cumsum", self, dim, out, nullptr);
  return out;
}
at::Tensor& cumprod_out(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, at::Tensor& out) {
  run_scan(TPURT_SCAN_CUMPROD, "cumprod", self, dim, out, nullptr);
  return out;
}
void cummax_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  run_scan(TPURT_SCAN_CUMMAX, "cummax", self, dim, values, &indices);
}
void cummin_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  run_scan(TPURT_SCAN_CUMMIN, "cummin", self, dim, values, &indices);
}
at::Tensor& logcumsumexp_out(const at::Tensor& self, int64_t dim, at::Tensor& out) {
  run_scan(TPURT_SCAN_LOGCUMSUMEXP, "logcumsumexp", self, dim, out, nullptr);
  return out;
}
at::Tensor logcumsumexp(const at::Tensor& self, int64_t dim) {
  at::Tensor out = at::empty(self.sizes(), self.options());
  return logcumsumexp_out(self, dim, out);
}

// --------------------------------------------------------------- softmax

void run_softmax(const at::Tensor& self, int64_t dim, const at::Tensor& out, bool log) {
  const char* name = log ? "_log_softmax" : "_softmax";
  check_tpu(self, name);
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  at::native::resize_output(out, self.sizes());
  if (self.numel() == 0) return;
  c10::DeviceGuard guard(self.device());
  tpurt_view iv = view_of(self), ov = view_of(out);
  check(tpurt_softmax(stream_of(self), &ov, &iv, static_cast<int>(d), log ? 1 : 0), name);
}
at::Tensor& softmax_out(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  run_softmax(self, dim, out, false);
  return out;
}
at::Tensor& log_softmax_out(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  run_softmax(self, dim, out, true);
  return out;
}
void run_softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim, const at::Tensor& grad_input,
                     bool log) {
  const char* name = log ? "_log_softmax_backward_data" : "_softmax_backward_data";
  int64_t d = at::maybe_wrap_dim(dim, grad_output.dim());
  TORCH_CHECK(grad_output.sizes() == output.sizes(), name, ": grad_output and output shapes differ");
  at::native::resize_output(grad_input, grad_output.sizes());
  if (grad_output.numel() == 0) return;
  c10::DeviceGuard guard(grad_output.device());
  tpurt_view gi = view_of(grad_input), go = view_of(grad_output), ov = view_of(output);
  check(tpurt_softmax_backward(stream_of(grad_output), &gi, &go, &ov, static_cast<int>(d), log ? 1 : 0), name);
}
at::Tensor& softmax_bwd_out(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype, at::Tensor& grad_input) {
  run_softmax_bwd(grad_output, output, dim, grad_input, false);
  return grad_input;
}
at::Tensor& log_softmax_bwd_out(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                at::ScalarType input_dtype, at::Tensor& grad_input) {
  run_softmax_bwd(grad_output, output, dim, grad_input, true);
  return grad_input;
}

// ------------------------------------------------------------ layer norm

const tpurt_view* opt_view(const std::optional<at::Tensor>& t, tpurt_view& storage) {
  if (!t || !t->defined()) return nullptr;
  storage = view_of(*t);
  return &storage;
}
const tpurt_view* opt_view(const at::Tensor& t, tpurt_view& storage) {
  if (!t.defined()) return nullptr;
  storage = view_of(t);
  return &storage;
}

int64_t check_normalized_shape(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias) {
  int64_t nn = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(nn >= 1, "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, "
                       "but got normalized_shape = ", normalized_shape);
  if (weight && weight->defined())
    TORCH_CHECK(weight->sym_sizes().equals(normalized_shape), "Expected weight to be of same shape as normalized_shape, "
                "but got weight of shape ", weight->sizes(), " and normalized_shape = ", normalized_shape);
  if (bias && bias->defined())
    TORCH_CHECK(bias->sym_sizes().equals(normalized_shape), "Expected bias to be of same shape as normalized_shape, "
                "but got bias of shape ", bias->sizes(), " and normalized_shape = ", normalized_shape);
  int64_t nd = input.dim();
  bool ok = nd >= nn;
  for (int64_t i = 0; ok && i < nn; i++) ok = input.sym_size(nd - nn + i) == normalized_shape[i];
  TORCH_CHECK(ok, "Given normalized_shape=", normalized_shape, ", expected input with shape [*, ",
              c10::SymIntArrayRef(normalized_shape), "], but got input of size", input.sizes());
  return nn;
}

std::vector<int64_t> stat_shape(const at::Tensor& x, int64_t nn) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  for (int64_t i = x.dim() - nn; i < x.dim(); i++) s[i] = 1;
  return s;
}

// dtype of a layer / group norm's saved mean and rstd, CPU's rule: float
// when a bf16 / f16 input comes with float32 affine parameters (autocast's
// case; the backward pass then reads unrounded statistics), else the input's
at::ScalarType norm_stat_type(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias) {
  if (!at::isReducedFloatingType(x.scalar_type())) return x.scalar_type();
  for (const auto* p : {&weight, &bias})
    if (*p && (*p)->defined() && (*p)->scalar_type() == at::kFloat) return at::kFloat;
  return x.scalar_type();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input,
                                                                 c10::SymIntArrayRef normalized_shape,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps) {
  check_tpu(input, "native_layer_norm");
  int64_t nn = check_normalized_shape(input, normalized_shape, weight, bias);
  at::Tensor x = input.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::TensorOptions sopt = x.options().dtype(norm_stat_type(x, weight, bias));
  at::Tensor mean = at::empty(stat_shape(x, nn), sopt), rstd = at::empty(stat_shape(x, nn), sopt);
  if (x.numel() == 0 && mean.numel() == 0) return {y, mean, rstd};
  c10::DeviceGuard guard(x.device());
  tpurt_view yv = view_of(y), mv = view_of(mean), rv = view_of(rstd), xv = view_of(x), wv, bv;
  std::optional<at::Tensor> w = weight && weight->defined() ? std::optional<at::Tensor>(weight->contiguous()) : std::nullopt;
  std::optional<at::Tensor> b = bias && bias->defined() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  check(tpurt_layer_norm(stream_of(x), &yv, &mv, &rv, &xv, opt_view(w, wv), opt_view(b, bv), static_cast<int>(nn), eps,
                         0),
        "native_layer_norm");
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> output_mask) {
  int64_t nn = check_normalized_shape(input, normalized_shape, weight, bias);
  at::Tensor x = input.contiguous(), dy = grad_out.contiguous();
  at::Tensor dx, dw, db;
  if (output_mask[0]) dx = at::empty(x.sizes(), x.options());
  std::vector<int64_t> ns;
  for (auto& s : normalized_shape) ns.push_back(s.expect_int());
  bool has_w = weight && weight->defined();
  if (output_mask[1] && has_w) dw = at::empty(ns, weight->options());
  if (output_mask[2] && bias && bias->defined()) db = at::empty(ns, bias->options());
  c10::DeviceGuard guard(x.device());
  std::optional<at::Tensor> w = has_w ? std::optional<at::Tensor>(weight->contiguous()) : std::nullopt;
  tpurt_view dxv, dwv, dbv, dyv = view_of(dy), xv = view_of(x), mv = view_of(mean), rv = view_of(rstd), wv;
  if (dx.defined() || dw.defined() || db.defined())
    check(tpurt_layer_norm_backward(stream_of(x), opt_view(dx, dxv), opt_view(dw, dwv), opt_view(db, dbv), &dyv, &xv,
                                    &mv, &rv, opt_view(w, wv), static_cast<int>(nn), 0),
          "native_layer_norm_backward");
  return {dx, dw, db};
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape_i,
                                                  const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  check_tpu(input, "_fused_rms_norm");
  c10::SymIntArrayRef normalized_shape = c10::fromIntArrayRefSlow(normalized_shape_i);
  int64_t nn = check_normalized_shape(input, normalized_shape, weight, std::nullopt);
  at::Tensor x = input.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::ScalarType st = at::isReducedFloatingType(x.scalar_type()) ? at::kFloat : x.scalar_type();
  at::Tensor rstd = at::empty(stat_shape(x, nn), x.options().dtype(st));
  double e = eps ? *eps : std::numeric_limits<float>::epsilon();
  if (x.scalar_type() == at::kDouble && !eps) e = std::numeric_limits<double>::epsilon();
  if (x.numel() == 0) return {y, rstd};
  c10::DeviceGuard guard(x.device());
  std::optional<at::Tensor> w = weight && weight->defined() ? std::optional<at::Tensor>(weight->contiguous()) : std::nullopt;
  tpurt_view yv = view_of(y), rv = view_of(rstd), xv = view_of(x), wv;
  check(tpurt_layer_norm(stream_of(x), &yv, nullptr, &rv, &xv, opt_view(w, wv), nullptr, static_cast<int>(nn), e, 1),
        "_fused_rms_norm");
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                           c10::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::array<bool, 2> output_mask) {
  int64_t nn = static_cast<int64_t>(normalized_shape.size());
  at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), dx, dw;
  bool has_w = weight && weight->defined();
  if (output_mask[0]) dx = at::empty(x.sizes(), x.options());
  if (output_mask[1] && has_w) dw = at::empty(normalized_shape, weight->options());
  c10::DeviceGuard guard(x.device());
  std::optional<at::Tensor> w = has_w ? std::optional<at::Tensor>(weight->contiguous()) : std::nullopt;
  tpurt_view dxv, dwv, dyv = view_of(dy), xv = view_of(x), rv = view_of(rstd), wv;
  if (dx.defined() || dw.defined())
    check(tpurt_layer_norm_backward(stream_of(x), opt_view(dx, dxv), opt_view(dw, dwv), nullptr, &dyv, &xv, nullptr,
                                    &rv, opt_view(w, wv), static_cast<int>(nn), 1),
          "_fused_rms_norm_backward");
  return {dx, dw};
}

// ------------------------------------------------------------ batch norm

// [N, C, S] view of a tensor with >= 2 dims (made contiguous if the spatial dims do not merge)
at::Tensor as_ncs(const at::Tensor& t) {
  if (t.dim() == 2) return t.unsqueeze(2);
  std::vector<int64_t> s = {t.size(0), t.size(1), -1};
  if (t.numel() == 0) return t.contiguous().view({t.size(0), t.size(1), 0});
  std::vector<int64_t> shape = {t.size(0), t.size(1), t.numel() / (t.size(0) * t.size(1))};
  auto v = at::detail::computeStride(t.sizes(), t.strides(), c10::IntArrayRef(shape));
  if (v) return t.as_strided(shape, *v);
  return t.contiguous().view(s);
}

at::Tensor defined_or_undef(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? *t : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_forward(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const at::Tensor& running_mean, const at::Tensor& running_var,
                                                          bool training, double momentum, double eps) {
  check_tpu(input, "batch_norm");
  TORCH_CHECK(input.dim() >= 2, "batch_norm: expected an input with at least 2 dimensions, got ", input.dim());
  int64_t C = input.size(1);
  at::Tensor y = at::empty(input.sizes(), input.options().memory_format(input.suggest_memory_format()));
  at::ScalarType st = at::isReducedFloatingType(input.scalar_type()) ? at::kFloat : input.scalar_type();
  at::Tensor sm = at::empty({training ? C : 0}, input.options().dtype(st));
  at::Tensor si = at::empty({training ? C : 0}, input.options().dtype(st));
  if (input.numel() == 0 && !training) return {y, sm, si};
  c10::DeviceGuard guard(input.device());
  at::Tensor x3 = as_ncs(input), y3 = as_ncs(y);
  tpurt_view xv = view_of(x3), yv = view_of(y3), smv, siv, wv, bv, rmv, rvv;
  check(tpurt_batch_norm(stream_of(input), &yv, training ? opt_view(sm, smv) : nullptr,
                         training ? opt_view(si, siv) : nullptr, &xv, opt_view(weight, wv), opt_view(bias, bv),
                         opt_view(running_mean, rmv), opt_view(running_var, rvv), training ? 1 : 0, momentum, eps),
        "batch_norm");
  return {y, sm, si};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const std::optional<at::Tensor>& running_mean,
                                                                 const std::optional<at::Tensor>& running_var,
                                                                 bool training, double momentum, double eps) {
  return bn_forward(input, weight, bias, defined_or_undef(running_mean), defined_or_undef(running_var), training,
                    momentum, eps);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, at::Tensor& running_mean,
                                                        at::Tensor& running_var, bool training, double momentum,
                                                        double eps) {
  return bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit_no_stats(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, bool training,
                                                                 double momentum, double eps) {
  return bn_forward(input, weight, bias, at::Tensor(), at::Tensor(), training, momentum, eps);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_legit_no_training(const at::Tensor& input,
                                                                    const std::optional<at::Tensor>& weight,
                                                                    const std::optional<at::Tensor>& bias,
                                                                    const at::Tensor& running_mean,
                                                                    const at::Tensor& running_var, double momentum,
                                                                    double eps) {
  return bn_forward(input, weight, bias, running_mean, running_var, false, momentum, eps);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bn_with_update(const at::Tensor& input,
                                                                          const std::optional<at::Tensor>& weight,
                                                                          const std::optional<at::Tensor>& bias,
                                                                          at::Tensor& running_mean,
                                                                          at::Tensor& running_var, double momentum,
                                                                          double eps) {
  auto [y, m, i] = bn_forward(input, weight, bias, running_mean, running_var, true, momentum, eps);
  return {y, m, i, at::empty({0}, input.options().dtype(at::kByte))};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bn_no_update(const at::Tensor& input,
                                                                        const std::optional<at::Tensor>& weight,
                                                                        const std::optional<at::Tensor>& bias,
                                                                        const std::optional<at::Tensor>& running_mean,
                                                                        const std::optional<at::Tensor>& running_var,
                                                                        double momentum, double eps) {
  bool have = running_mean && running_mean->defined() && running_var && running_var->defined();
  auto [y, m, i] = bn_forward(input, weight, bias, defined_or_undef(running_mean), defined_or_undef(running_var), !have,
                              momentum, eps);
  return {y, m, i, at::empty({0}, input.options().dtype(at::kByte))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> output_mask) {
  check_tpu(input, "native_batch_norm_backward");
  int64_t C = input.size(1);
  at::Tensor dx, dw, db;
  bool has_w = weight && weight->defined();
  at::TensorOptions popt = has_w ? weight->options() : input.options();
  if (output_mask[0]) dx = at::empty(input.sizes(), input.options().memory_format(input.suggest_memory_format()));
  if (output_mask[1]) dw = at::empty({C}, popt);
  if (output_mask[2]) db = at::empty({C}, popt);
  if (!dx.defined() && !dw.defined() && !db.defined()) return {dx, dw, db};
  c10::DeviceGuard guard(input.device());
  at::Tensor x3 = as_ncs(input), g3 = as_ncs(grad_out), dx3 = dx.defined() ? as_ncs(dx) : at::Tensor();
  tpurt_view xv = view_of(x3), gv = view_of(g3), dxv, dwv, dbv, wv, rmv, rvv, smv, siv;
  check(tpurt_batch_norm_backward(stream_of(input), opt_view(dx3, dxv), opt_view(dw, dwv), opt_view(db, dbv), &gv, &xv,
                                  opt_view(weight, wv), opt_view(running_mean, rmv), opt_view(running_var, rvv),
                                  train ? opt_view(save_mean, smv) : nullptr, train ? opt_view(save_invstd, siv) : nullptr,
                                  train ? 1 : 0, eps),
        "native_batch_norm_backward");
  return {dx, dw, db};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_var, bool update, double eps,
    std::array<bool, 3> output_mask, const at::Tensor& reserve) {
  bool train = update || !(running_mean && running_mean->defined());
  return bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, train, eps,
                                    output_mask);
}

// ------------------------------------------------------------ group norm

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, int64_t N,
                                                                 int64_t C, int64_t HxW, int64_t group, double eps) {
  check_tpu(input, "native_group_norm");
  TORCH_CHECK(group > 0 && C % group == 0, "Expected number of channels in input to be divisible by num_groups, but got "
              "input of shape ", input.sizes(), " and num_groups=", group);
  at::Tensor x = input.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::TensorOptions sopt = x.options().dtype(norm_stat_type(x, weight, bias));
  at::Tensor mean = at::empty({N, group}, sopt), rstd = at::empty({N, group}, sopt);
  if (N * C == 0) return {y, mean, rstd};
  c10::DeviceGuard guard(x.device());
  at::Tensor x3 = x.view({N, C, HxW}), y3 = y.view({N, C, HxW});
  tpurt_view xv = view_of(x3), yv = view_of(y3), mv = view_of(mean), rv = view_of(rstd), wv, bv;
  check(tpurt_group_norm(stream_of(x), &yv, &mv, &rv, &xv, opt_view(weight, wv), opt_view(bias, bv),
                         static_cast<int>(group), eps),
        "native_group_norm");
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, int64_t N, int64_t C, int64_t HxW, int64_t group,
    std::array<bool, 3> output_mask) {
  at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), dx, dw, db;
  at::TensorOptions popt = weight && weight->defined() ? weight->options() : x.options();
  if (output_mask[0]) dx = at::empty(x.sizes(), x.options());
  if (output_mask[1]) dw = at::empty({C}, popt);
  if (output_mask[2]) db = at::empty({C}, popt);
  if (!dx.defined() && !dw.defined() && !db.defined()) return {dx, dw, db};
  c10::DeviceGuard guard(x.device());
  at::Tensor x3 = x.view({N, C, HxW}), g3 = dy.view({N, C, HxW}), dx3 = dx.defined() ? dx.view({N, C, HxW}) : at::Tensor();
  tpurt_view xv = view_of(x3), gv = view_of(g3), mv = view_of(mean), rv = view_of(rstd), dxv, dwv, dbv, wv;
  check(tpurt_group_norm_backward(stream_of(x), opt_view(dx3, dxv), opt_view(dw, dwv), opt_view(db, dbv), &gv, &xv, &mv,
                                  &rv, opt_view(weight, wv), static_cast<int>(group)),
        "native_group_norm_backward");
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum.IntList_out", TORCH_FN(sum_out));
  m.impl("sum", TORCH_FN(sum_full));
  m.impl("sum.out", TORCH_FN(sum_full_out));
  m.impl("nansum", TORCH_FN(nansum));
  m.impl("nansum.out", TORCH_FN(nansum_out));
  m.impl("mean.out", TORCH_FN(mean_out));
  m.impl("mean", TORCH_FN(mean_full));
  m.impl("mean.dtype_out", TORCH_FN(mean_full_out));
  m.impl("prod.int_out", TORCH_FN(prod_int_out));
  m.impl("prod", TORCH_FN(prod_full));
  m.impl("prod.out", TORCH_FN(prod_full_out));
  m.impl("max", TORCH_FN(max_full));
  m.impl("min", TORCH_FN(min_full));
  m.impl("max.unary_out", TORCH_FN(max_full_out));
  m.impl("min.unary_out", TORCH_FN(min_full_out));
  m.impl("max.dim_max", TORCH_FN(max_dim_out));
  m.impl("min.dim_min", TORCH_FN(min_dim_out));
  m.impl("amax.out", TORCH_FN(amax_out));
  m.impl("amin.out", TORCH_FN(amin_out));
  m.impl("argmax.out", TORCH_FN(argmax_out));
  m.impl("argmin.out", TORCH_FN(argmin_out));
  m.impl("var.correction", TORCH_FN(var));
  m.impl("var.correction_out", TORCH_FN(var_out));
  m.impl("std.correction", TORCH_FN(std_));
  m.impl("std.correction_out", TORCH_FN(std_out));
  m.impl("var_mean.correction", TORCH_FN(var_mean));
  m.impl("std_mean.correction", TORCH_FN(std_mean));
  m.impl("linalg_vector_norm.out", TORCH_FN(vector_norm_out));
  m.impl("norm.out", TORCH_FN(norm_out));
  m.impl("norm.dtype_out", TORCH_FN(norm_dtype_out));
  m.impl("logsumexp", TORCH_FN(logsumexp));
  m.impl("logsumexp.out", TORCH_FN(logsumexp_out));
  m.impl("any.dims_out", TORCH_FN(any_dims_out));
  m.impl("any.out", TORCH_FN(any_dim_out));
  m.impl("any.all_out", TORCH_FN(any_all_out));
  m.impl("all.dims_out", TORCH_FN(all_dims_out));
  m.impl("all.out", TORCH_FN(all_dim_out));
  m.impl("all.all_out", TORCH_FN(all_all_out));
  m.impl("cumsum.out", TORCH_FN(cumsum_out));
  m.impl("cumprod.out", TORCH_FN(cumprod_out));
  m.impl("_cummax_helper", TORCH_FN(cummax_helper));
  m.impl("_cummin_helper", TORCH_FN(cummin_helper));
  m.impl("_logcumsumexp", TORCH_FN(logcumsumexp));
  m.impl("_logcumsumexp.out", TORCH_FN(logcumsumexp_out));
  m.impl("_softmax.out", TORCH_FN(softmax_out));
  m.impl("_log_softmax.out", TORCH_FN(log_softmax_out));
  m.impl("_softmax_backward_data.out", TORCH_FN(softmax_bwd_out));
  m.impl("_log_softmax_backward_data.out", TORCH_FN(log_softmax_bwd_out));
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
  m.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward));
  m.impl("_fused_rms_norm", TORCH_FN(fused_rms_norm));
  m.impl("_fused_rms_norm_backward", TORCH_FN(fused_rms_norm_backward));
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("_native_batch_norm_legit", TORCH_FN(bn_legit));
  m.impl("_native_batch_norm_legit.no_stats", TORCH_FN(bn_legit_no_stats));
  m.impl("_native_batch_norm_legit_no_training", TORCH_FN(bn_legit_no_training));
  m.impl("_batch_norm_with_update", TORCH_FN(bn_with_update));
  m.impl("_batch_norm_no_update", TORCH_FN(bn_no_update));
  m.impl("native_batch_norm_backward", TORCH_FN(bn_backward));
  m.impl("batch_norm_backward", TORCH_FN(batch_norm_backward));
  m.impl("native_group_norm", TORCH_FN(native_group_norm));
  m.impl("native_group_norm_backward", TORCH_FN(native_group_norm_backward));
}

}  // namespace torch_tpu
