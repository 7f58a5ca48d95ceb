// Optimizer, AMP and foreach kernels of the tpu backend: the fused Adam /
// AdamW / SGD steps, GradScaler's unscale and scale update, and the
// _foreach_* list ops. Lists whose tensors share a floating dtype, a device
// and per-tuple shapes go to the runtime's multi-tensor kernels (one launch
// for the whole list); any other list takes PyTorch's per-tensor reference
// path (at::native::foreach_tensor_*_slow), which dispatches every tensor to
// the device's own per-tensor kernels.
#include "glue.h"

#include <ATen/native/ForeachUtils.h>
#include <ATen/ops/_foreach_abs_native.h>
#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_addcdiv_native.h>
#include <ATen/ops/_foreach_addcmul_native.h>
#include <ATen/ops/_foreach_clamp_max_native.h>
#include <ATen/ops/_foreach_clamp_min_native.h>
#include <ATen/ops/_foreach_copy_native.h>
#include <ATen/ops/_foreach_div_native.h>
#include <ATen/ops/_foreach_exp_native.h>
#include <ATen/ops/_foreach_lerp_native.h>
#include <ATen/ops/_foreach_maximum_native.h>
#include <ATen/ops/_foreach_minimum_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <ATen/ops/_foreach_neg_native.h>
#include <ATen/ops/_foreach_norm_native.h>
#include <ATen/ops/_foreach_pow_native.h>
#include <ATen/ops/_foreach_reciprocal_native.h>
#include <ATen/ops/_foreach_sign_native.h>
#include <ATen/ops/_foreach_sqrt_native.h>
#include <ATen/ops/_foreach_sub_native.h>
#include <ATen/ops/_foreach_zero_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <initializer_list>
#include <vector>

namespace torch_tpu {
namespace {

using at::Tensor;
using at::TensorList;
using ScalarList = at::ArrayRef<c10::Scalar>;

bool fast_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// True when the multi-tensor kernel can run the lists: every tensor on the
// same tpu chip, one floating dtype (unless mixed_dtypes), equal shapes per
// tuple, no complex scalar.
bool can_fast(std::initializer_list<TensorList> lists, bool mixed_dtypes = false) {
  const TensorList& first = *lists.begin();
  if (first.empty()) return false;
  const Tensor& t0 = first[0];
  if (!t0.defined() || t0.device().type() != kTpu || !fast_dtype(t0.scalar_type())) return false;
  for (const TensorList& l : lists) {
    if (l.size() != first.size()) return false;
    for (size_t i = 0; i < l.size(); i++) {
      const Tensor& t = l[i];
      if (!t.defined() || t.device() != t0.device()) return false;
      if (mixed_dtypes ? !fast_dtype(t.scalar_type()) : t.scalar_type() != t0.scalar_type()) return false;
      if (!t.sizes().equals(first[i].sizes())) return false;
    }
  }
  return true;
}

// `other` of a List overload as the multi-tensor kernel takes it: as it is
// when the lists fit (can_fast); a list of one-element tensors against
// tensors with dims (a capturable optimizer's per-parameter bias corrections,
// kept on the device) spread over each tensor's shape with zero strides, so
// the list still runs as one launch instead of an op per tensor. Empty when
// neither applies: the per-tensor reference path runs.
// The 0-dim tensors may have another floating dtype than the list (f32 bias
// corrections of bf16 parameters): a 0-dim operand does not promote within
// its category, so the result keeps the list's dtype and the kernel computes
// in f32 (f64 for an f64 list), as PyTorch's per-tensor path does.
std::vector<Tensor> fast_other(TensorList self, TensorList other) {
  if (can_fast({self, other})) return other.vec();
  if (other.size() != self.size() || !can_fast({self})) return {};
  std::vector<Tensor> v;
  v.reserve(other.size());
  for (size_t i = 0; i < other.size(); i++) {
    if (!other[i].defined() || other[i].dim() != 0 || self[i].dim() == 0 || !fast_dtype(other[i].scalar_type()))
      return {};
    v.push_back(other[i].expand(self[i].sizes()));
  }
  if (!can_fast({self, v}, /*mixed_dtypes=*/true)) return {};
  return v;
}

bool fast_scalar(const c10::Scalar& s) { return !s.isComplex(); }
bool fast_scalars(ScalarList s) {
  for (const auto& x : s)
    if (x.isComplex()) return false;
  return true;
}

std::vector<tpurt_view> views(TensorList l) {
  std::vector<tpurt_view> v;
  v.reserve(l.size());
  for (const Tensor& t : l) v.push_back(view_of(t));
  return v;
}

std::vector<Tensor> like(TensorList l) {
  std::vector<Tensor> out;
  out.reserve(l.size());
  for (const Tensor& t : l) out.push_back(at::empty_like(t));
  return out;
}

// A 0-dim tensor operand: a host value for CPU tensors, else read by the kernel.
tpurt_dscalar dscalar_of(const Tensor& t, const char* what) {
  tpurt_dscalar d{};
  if (t.device().is_cpu()) {
    d.value = t.item().toDouble();
    return d;
  }
  TORCH_CHECK(t.device().type() == kTpu, what, " must be on the CPU or a tpu device, got ", t.device());
  TORCH_CHECK(t.numel() == 1, what, " must have one element, got ", t.numel());
  d.ptr = reinterpret_cast<tpurt_devptr>(t.data_ptr());
  d.dtype = to_runtime(t.scalar_type());
  return d;
}

struct Operands {
  TensorList out, a, b, c;
  const std::vector<double>* scalars = nullptr;
  tpurt_dscalar scalar{};
  double alpha = 1.0;
};

void launch(tpurt_foreach_op op, const Operands& o) {
  int n = static_cast<int>(o.a.size());
  if (n == 0) return;
  c10::DeviceGuard guard(o.a[0].device());
  std::vector<tpurt_view> ov = views(o.out), av = views(o.a), bv = views(o.b), cv = views(o.c);
  tpurt_foreach_operands x{};
  x.out = ov.data();
  x.a = av.data();
  x.b = o.b.empty() ? nullptr : bv.data();
  x.c = o.c.empty() ? nullptr : cv.data();
  x.scalars = o.scalars ? o.scalars->data() : nullptr;
  x.scalar = o.scalar;
  x.alpha = o.alpha;
  check(tpurt_foreach(current_stream(o.a[0].device().index()), op, n, &x), tpurt_foreach_op_name(op));
}

tpurt_dscalar host_scalar(const c10::Scalar& s) {
  tpurt_dscalar d{};
  d.value = s.toDouble();
  return d;
}

std::vector<double> to_doubles(ScalarList s, double sign = 1.0) {
  std::vector<double> v;
  v.reserve(s.size());
  for (const auto& x : s) v.push_back(sign * x.toDouble());
  return v;
}

// ------------------------------------------------------------ unary ops

#define TPU_FOREACH_UNARY(NAME, OP, SLOW)                                       \
  void NAME##_(TensorList self) {                                                \
    at::native::check_foreach_api_restrictions(self);                            \
    if (!can_fast({self})) return at::native::SLOW##_(self);                     \
    Operands o;                                                                  \
    o.out = self;                                                                \
    o.a = self;                                                                  \
    launch(OP, o);                                                               \
  }                                                                              \
  std::vector<Tensor> NAME(TensorList self) {                                    \
    at::native::check_foreach_api_restrictions(self);                            \
    if (!can_fast({self})) return at::native::SLOW(self);                        \
    auto out = like(self);                                                       \
    Operands o;                                                                  \
    o.out = out;                                                                 \
    o.a = self;                                                                  \
    launch(OP, o);                                                               \
    return out;                                                                  \
  }

TPU_FOREACH_UNARY(fe_sqrt, TPURT_FE_SQRT, foreach_tensor_sqrt_slow)
TPU_FOREACH_UNARY(fe_neg, TPURT_FE_NEG, foreach_tensor_neg_slow)
TPU_FOREACH_UNARY(fe_abs, TPURT_FE_ABS, foreach_tensor_abs_slow)
TPU_FOREACH_UNARY(fe_exp, TPURT_FE_EXP, foreach_tensor_exp_slow)
TPU_FOREACH_UNARY(fe_reciprocal, TPURT_FE_RECIPROCAL, foreach_tensor_reciprocal_slow)
TPU_FOREACH_UNARY(fe_sign, TPURT_FE_SIGN, foreach_tensor_sign_slow)

// ----------------------------------------------------------- binary ops

// List / Scalar / ScalarList overloads without alpha.
#define TPU_FOREACH_BINARY(NAME, OP, SLOW_LIST, SLOW_SCALAR, SLOW_SCALARLIST)          \
  void NAME##_list_(TensorList self, TensorList other) {                                \
    at::native::check_foreach_api_restrictions(self, other);                            \
    auto ob = fast_other(self, other);                                                  \
    if (ob.empty()) return at::native::SLOW_LIST##_(self, other);                       \
    Operands o;                                                                         \
    o.out = self, o.a = self, o.b = ob;                                                 \
    launch(OP, o);                                                                      \
  }                                                                                     \
  std::vector<Tensor> NAME##_list(TensorList self, TensorList other) {                  \
    at::native::check_foreach_api_restrictions(self, other);                            \
    auto ob = fast_other(self, other);                                                  \
    if (ob.empty()) return at::native::SLOW_LIST(self, other);                          \
    auto out = like(self);                                                              \
    Operands o;                                                                         \
    o.out = out, o.a = self, o.b = ob;                                                  \
    launch(OP, o);                                                                      \
    return out;                                                                         \
  }                                                                                     \
  void NAME##_scalar_(TensorList self, const c10::Scalar& s) {                          \
    at::native::check_foreach_api_restrictions(self);                                   \
    if (!can_fast({self}) || !fast_scalar(s)) return at::native::SLOW_SCALAR##_(self, s); \
    Operands o;                                                                         \
    o.out = self, o.a = self, o.scalar = host_scalar(s);                                \
    launch(OP, o);                                                                      \
  }                                                                                     \
  std::vector<Tensor> NAME##_scalar(TensorList self, const c10::Scalar& s) {            \
    at::native::check_foreach_api_restrictions(self);                                   \
    if (!can_fast({self}) || !fast_scalar(s)) return at::native::SLOW_SCALAR(self, s);  \
    auto out = like(self);                                                              \
    Operands o;                                                                         \
    o.out = out, o.a = self, o.scalar = host_scalar(s);                                 \
    launch(OP, o);                                                                      \
    return out;                                                                         \
  }                                                                                     \
  void NAME##_scalarlist_(TensorList self, ScalarList s) {                              \
    at::native::check_foreach_api_restrictions(self, s);                                \
    if (!can_fast({self}) || !fast_scalars(s)) return at::native::SLOW_SCALARLIST##_(self, s); \
    auto v = to_doubles(s);                                                             \
    Operands o;                                                                         \
    o.out = self, o.a = self, o.scalars = &v;                                           \
    launch(OP, o);                                                                      \
  }                                                                                     \
  std::vector<Tensor> NAME##_scalarlist(TensorList self, ScalarList s) {                \
    at::native::check_foreach_api_restrictions(self, s);                                \
    if (!can_fast({self}) || !fast_scalars(s)) return at::native::SLOW_SCALARLIST(self, s); \
    auto v = to_doubles(s);                                                             \
    auto out = like(self);                                                              \
    Operands o;                                                                         \
    o.out = out, o.a = self, o.scalars = &v;                                            \
    launch(OP, o);                                                                      \
    return out;                                                                         \
  }

TPU_FOREACH_BINARY(fe_mul, TPURT_FE_MUL, foreach_tensor_mul_list_kernel_slow, foreach_tensor_mul_scalar_kernel_slow,
                   foreach_tensor_mul_scalarlist_kernel_slow)
TPU_FOREACH_BINARY(fe_div, TPURT_FE_DIV, foreach_tensor_div_list_kernel_slow, foreach_tensor_div_scalar_kernel_slow,
                   foreach_tensor_div_scalarlist_kernel_slow)
TPU_FOREACH_BINARY(fe_max, TPURT_FE_MAXIMUM, foreach_tensor_clamp_min_list_kernel_slow,
                   foreach_tensor_clamp_min_scalar_kernel_slow, foreach_tensor_clamp_min_scalarlist_kernel_slow)
TPU_FOREACH_BINARY(fe_min, TPURT_FE_MINIMUM, foreach_tensor_clamp_max_list_kernel_slow,
                   foreach_tensor_clamp_max_scalar_kernel_slow, foreach_tensor_clamp_max_scalarlist_kernel_slow)
TPU_FOREACH_BINARY(fe_pow, TPURT_FE_POW, foreach_tensor_pow_list_kernel_slow, foreach_tensor_pow_scalar_kernel_slow,
                   foreach_tensor_pow_scalarlist_kernel_slow)

std::vector<Tensor> fe_rpow(const c10::Scalar& base, TensorList exponent) {
  at::native::check_foreach_api_restrictions(exponent);
  if (!can_fast({exponent}) || !fast_scalar(base)) return at::native::foreach_scalar_pow_list_kernel_slow(base, exponent);
  auto out = like(exponent);
  Operands o;
  o.out = out, o.a = exponent, o.scalar = host_scalar(base);
  launch(TPURT_FE_RPOW, o);
  return out;
}

// add / sub: alpha on the List and Tensor overloads; sub = add with -alpha.
#define TPU_FOREACH_ADDSUB(NAME, SIGN, SLOW_LIST, SLOW_SCALAR, SLOW_SCALARLIST)                    \
  void NAME##_list_(TensorList self, TensorList other, const c10::Scalar& alpha) {                  \
    at::native::check_foreach_api_restrictions(self, other);                                        \
    auto ob = fast_other(self, other);                                                              \
    if (ob.empty() || !fast_scalar(alpha)) return at::native::SLOW_LIST##_(self, other, alpha);     \
    Operands o;                                                                                     \
    o.out = self, o.a = self, o.b = ob, o.alpha = SIGN * alpha.toDouble();                          \
    launch(TPURT_FE_ADD, o);                                                                        \
  }                                                                                                 \
  std::vector<Tensor> NAME##_list(TensorList self, TensorList other, const c10::Scalar& alpha) {    \
    at::native::check_foreach_api_restrictions(self, other);                                        \
    auto ob = fast_other(self, other);                                                              \
    if (ob.empty() || !fast_scalar(alpha)) return at::native::SLOW_LIST(self, other, alpha);        \
    auto out = like(self);                                                                          \
    Operands o;                                                                                     \
    o.out = out, o.a = self, o.b = ob, o.alpha = SIGN * alpha.toDouble();                           \
    launch(TPURT_FE_ADD, o);                                                                        \
    return out;                                                                                     \
  }                                                                                                 \
  void NAME##_scalar_(TensorList self, const c10::Scalar& s) {                                      \
    at::native::check_foreach_api_restrictions(self);                                               \
    if (!can_fast({self}) || !fast_scalar(s)) return at::native::SLOW_SCALAR##_(self, s);           \
    Operands o;                                                                                     \
    o.out = self, o.a = self, o.scalar = host_scalar(s), o.alpha = SIGN;                            \
    launch(TPURT_FE_ADD, o);                                                                        \
  }                                                                                                 \
  std::vector<Tensor> NAME##_scalar(TensorList self, const c10::Scalar& s) {                        \
    at::native::check_foreach_api_restrictions(self);                                               \
    if (!can_fast({self}) || !fast_scalar(s)) return at::native::SLOW_SCALAR(self, s);              \
    auto out = like(self);                                                                          \
    Operands o;                                                                                     \
    o.out = out, o.a = self, o.scalar = host_scalar(s), o.alpha = SIGN;                             \
    launch(TPURT_FE_ADD, o);                                                                        \
    return out;                                                                                     \
  }                                                                                                 \
  void NAME##_scalarlist_(TensorList self, ScalarList s) {                                          \
    at::native::check_foreach_api_restrictions(self, s);                                            \
    if (!can_fast({self}) || !fast_scalars(s)) return at::native::SLOW_SCALARLIST##_(self, s);      \
    auto v = to_doubles(s);                                                                         \
    Operands o;                                                                                     \
    o.out = self, o.a = self, o.scalars = &v, o.alpha = SIGN;                                       \
    launch(TPURT_FE_ADD, o);                                                                        \
  }                                                                                                 \
  std::vector<Tensor> NAME##_scalarlist(TensorList self, ScalarList s) {                            \
    at::native::check_foreach_api_restrictions(self, s);                                            \
    if (!can_fast({self}) || !fast_scalars(s)) return at::native::SLOW_SCALARLIST(self, s);         \
    auto v = to_doubles(s);                                                                         \
    auto out = like(self);                                                                          \
    Operands o;                                                                                     \
    o.out = out, o.a = self, o.scalars = &v, o.alpha = SIGN;                                        \
    launch(TPURT_FE_ADD, o);                                                                        \
    return out;                                                                                     \
  }

TPU_FOREACH_ADDSUB(fe_add, 1.0, foreach_tensor_add_list_kernel_slow, foreach_tensor_add_scalar_kernel_slow,
                   foreach_tensor_add_scalarlist_kernel_slow)
TPU_FOREACH_ADDSUB(fe_sub, -1.0, foreach_tensor_sub_list_kernel_slow, foreach_tensor_sub_scalar_kernel_slow,
                   foreach_tensor_sub_scalarlist_kernel_slow)

// Tensor overloads: `other` is a 0-dim tensor (CPU or on the list's chip).
void check_scalar_tensor(const Tensor& other) {
  TORCH_CHECK(other.dim() == 0, "scalar tensor expected to be 0 dim but it has ", other.dim(), " dimensions and ",
              other.numel(), " elements.");
}
// out_of_place: the result dtype (0-dim members promote with a 0-dim
// `other`) must be the member's own dtype.
bool fast_tensor(TensorList self, const Tensor& other, bool out_of_place = false) {
  if (!can_fast({self}) || other.is_complex()) return false;
  if (out_of_place)
    for (const Tensor& t : self)
      if (at::result_type(t, other) != t.scalar_type()) return false;
  return other.device().is_cpu() || other.device() == self[0].device();
}

void fe_add_tensor_(TensorList self, const Tensor& other, const c10::Scalar& alpha) {
  at::native::check_foreach_api_restrictions(self);
  check_scalar_tensor(other);
  if (!fast_tensor(self, other) || !fast_scalar(alpha))
    return at::native::foreach_tensor_add_tensor_kernel_slow_(self, other, alpha);
  Operands o;
  o.out = self, o.a = self, o.scalar = dscalar_of(other, "other"), o.alpha = alpha.toDouble();
  launch(TPURT_FE_ADD, o);
}
std::vector<Tensor> fe_add_tensor(TensorList self, const Tensor& other, const c10::Scalar& alpha) {
  at::native::check_foreach_api_restrictions(self);
  check_scalar_tensor(other);
  if (!fast_tensor(self, other, true) || !fast_scalar(alpha))
    return at::native::foreach_tensor_add_tensor_kernel_slow(self, other, alpha);
  auto out = like(self);
  Operands o;
  o.out = out, o.a = self, o.scalar = dscalar_of(other, "other"), o.alpha = alpha.toDouble();
  launch(TPURT_FE_ADD, o);
  return out;
}

#define TPU_FOREACH_TENSOR(NAME, OP, SLOW)                                      \
  void NAME##_tensor_(TensorList self, const Tensor& other) {                    \
    at::native::check_foreach_api_restrictions(self);                            \
    check_scalar_tensor(other);                                                  \
    if (!fast_tensor(self, other)) return at::native::SLOW##_(self, other);      \
    Operands o;                                                                  \
    o.out = self, o.a = self, o.scalar = dscalar_of(other, "other");             \
    launch(OP, o);                                                               \
  }                                                                              \
  std::vector<Tensor> NAME##_tensor(TensorList self, const Tensor& other) {      \
    at::native::check_foreach_api_restrictions(self);                            \
    check_scalar_tensor(other);                                                  \
    if (!fast_tensor(self, other, true)) return at::native::SLOW(self, other);   \
    auto out = like(self);                                                       \
    Operands o;                                                                  \
    o.out = out, o.a = self, o.scalar = dscalar_of(other, "other");              \
    launch(OP, o);                                                               \
    return out;                                                                  \
  }

TPU_FOREACH_TENSOR(fe_mul, TPURT_FE_MUL, foreach_tensor_mul_tensor_kernel_slow)
TPU_FOREACH_TENSOR(fe_div, TPURT_FE_DIV, foreach_tensor_div_tensor_kernel_slow)

// ------------------------------------------------------- ternary ops

#define TPU_FOREACH_ADDC(NAME, OP, SLOW)                                                                   \
  void NAME##_scalar_(TensorList self, TensorList t1, TensorList t2, const c10::Scalar& value) {           \
    at::native::check_foreach_api_restrictions(self, t1, t2);                                              \
    if (!can_fast({self, t1, t2}) || !fast_scalar(value))                                                  \
      return at::native::foreach_tensor_##SLOW##_scalar_slow_(self, t1, t2, value);                        \
    Operands o;                                                                                            \
    o.out = self, o.a = self, o.b = t1, o.c = t2, o.scalar = host_scalar(value);                           \
    launch(OP, o);                                                                                         \
  }                                                                                                        \
  std::vector<Tensor> NAME##_scalar(TensorList self, TensorList t1, TensorList t2, const c10::Scalar& value) { \
    at::native::check_foreach_api_restrictions(self, t1, t2);                                              \
    if (!can_fast({self, t1, t2}) || !fast_scalar(value))                                                  \
      return at::native::foreach_tensor_##SLOW##_scalar_slow(self, t1, t2, value);                         \
    auto out = like(self);                                                                                 \
    Operands o;                                                                                            \
    o.out = out, o.a = self, o.b = t1, o.c = t2, o.scalar = host_scalar(value);                            \
    launch(OP, o);                                                                                         \
    return out;                                                                                            \
  }                                                                                                        \
  void NAME##_scalarlist_(TensorList self, TensorList t1, TensorList t2, ScalarList s) {                   \
    at::native::check_foreach_api_restrictions(self, t1, t2, s);                                           \
    if (!can_fast({self, t1, t2}) || !fast_scalars(s))                                                     \
      return at::native::foreach_tensor_##SLOW##_scalarlist_slow_(self, t1, t2, s);                        \
    auto v = to_doubles(s);                                                                                \
    Operands o;                                                                                            \
    o.out = self, o.a = self, o.b = t1, o.c = t2, o.scalars = &v;                                          \
    launch(OP, o);                                                                                         \
  }                                                                                                        \
  std::vector<Tensor> NAME##_scalarlist(TensorList self, TensorList t1, TensorList t2, ScalarList s) {     \
    at::native::check_foreach_api_restrictions(self, t1, t2, s);                                           \
    if (!can_fast({self, t1, t2}) || !fast_scalars(s))                                                     \
      return at::native::foreach_tensor_##SLOW##_scalarlist_slow(self, t1, t2, s);                         \
    auto v = to_doubles(s);                                                                                \
    auto out = like(self);                                                                                 \
    Operands o;                                                                                            \
    o.out = out, o.a = self, o.b = t1, o.c = t2, o.scalars = &v;                                           \
    launch(OP, o);                                                                                         \
    return out;                                                                                            \
  }                                                                                                        \
  void NAME##_tensor_(TensorList self, TensorList t1, TensorList t2, const Tensor& scalars) {              \
    auto list = at::native::convert_tensor_to_scalar_list(scalars, self.size());                           \
    NAME##_scalarlist_(self, t1, t2, list);                                                                \
  }                                                                                                        \
  std::vector<Tensor> NAME##_tensor(TensorList self, TensorList t1, TensorList t2, const Tensor& scalars) { \
    auto list = at::native::convert_tensor_to_scalar_list(scalars, self.size());                           \
    return NAME##_scalarlist(self, t1, t2, list);                                                          \
  }

TPU_FOREACH_ADDC(fe_addcmul, TPURT_FE_ADDCMUL, addcmul)
TPU_FOREACH_ADDC(fe_addcdiv, TPURT_FE_ADDCDIV, addcdiv)

void fe_lerp_list_(TensorList self, TensorList end, TensorList weights) {
  at::native::check_foreach_api_restrictions(self, end, weights);
  if (!can_fast({self, end, weights})) return at::native::foreach_tensor_ternary_lerp_slow_(self, end, weights);
  Operands o;
  o.out = self, o.a = self, o.b = end, o.c = weights;
  launch(TPURT_FE_LERP, o);
}
std::vector<Tensor> fe_lerp_list(TensorList self, TensorList end, TensorList weights) {
  at::native::check_foreach_api_restrictions(self, end, weights);
  if (!can_fast({self, end, weights})) return at::native::foreach_tensor_ternary_lerp_slow(self, end, weights);
  auto out = like(self);
  Operands o;
  o.out = out, o.a = self, o.b = end, o.c = weights;
  launch(TPURT_FE_LERP, o);
  return out;
}
void fe_lerp_scalar_(TensorList self, TensorList end, const c10::Scalar& w) {
  at::native::check_foreach_api_restrictions(self, end);
  if (!can_fast({self, end}) || !fast_scalar(w)) return at::native::foreach_tensor_lerp_list_kernel_slow_(self, end, w);
  Operands o;
  o.out = self, o.a = self, o.b = end, o.scalar = host_scalar(w);
  launch(TPURT_FE_LERP, o);
}
std::vector<Tensor> fe_lerp_scalar(TensorList self, TensorList end, const c10::Scalar& w) {
  at::native::check_foreach_api_restrictions(self, end);
  if (!can_fast({self, end}) || !fast_scalar(w)) return at::native::foreach_tensor_lerp_list_kernel_slow(self, end, w);
  auto out = like(self);
  Operands o;
  o.out = out, o.a = self, o.b = end, o.scalar = host_scalar(w);
  launch(TPURT_FE_LERP, o);
  return out;
}
void fe_lerp_scalarlist_(TensorList self, TensorList end, ScalarList w) {
  at::native::check_foreach_api_restrictions(self, end, w);
  if (!can_fast({self, end}) || !fast_scalars(w))
    return at::native::foreach_tensor_lerp_scalarlist_kernel_slow_(self, end, w);
  auto v = to_doubles(w);
  Operands o;
  o.out = self, o.a = self, o.b = end, o.scalars = &v;
  launch(TPURT_FE_LERP, o);
}
std::vector<Tensor> fe_lerp_scalarlist(TensorList self, TensorList end, ScalarList w) {
  at::native::check_foreach_api_restrictions(self, end, w);
  if (!can_fast({self, end}) || !fast_scalars(w))
    return at::native::foreach_tensor_lerp_scalarlist_kernel_slow(self, end, w);
  auto v = to_doubles(w);
  auto out = like(self);
  Operands o;
  o.out = out, o.a = self, o.b = end, o.scalars = &v;
  launch(TPURT_FE_LERP, o);
  return out;
}

// ------------------------------------------------------ copy, zero, norm

void fe_copy_(TensorList self, TensorList src, bool non_blocking) {
  at::native::check_foreach_api_restrictions(self, src);
  if (!can_fast({self, src}, /*mixed_dtypes=*/true))
    return at::native::foreach_tensor_copy_list_kernel_slow_(self, src, non_blocking);
  Operands o;
  o.out = self, o.a = src;
  launch(TPURT_FE_COPY, o);
}

void fe_zero_(TensorList self) {
  at::native::check_foreach_api_restrictions(self);
  at::native::foreach_tensor_zero_slow_(self);
}

std::vector<Tensor> fe_norm(TensorList self, const c10::Scalar& ord, std::optional<at::ScalarType> dtype) {
  at::native::check_foreach_api_restrictions(self);
  double p = ord.isComplex() ? 2.0 : ord.toDouble();
  bool ok = can_fast({self}) && !ord.isComplex() && (p >= 0 || std::isinf(p)) && !std::isnan(p) &&
            (!dtype || fast_dtype(*dtype));
  if (ok && std::isinf(p) && p < 0)
    for (const Tensor& t : self) ok = ok && t.numel() > 0;
  if (!ok) return at::native::foreach_tensor_norm_slow(self, ord, dtype);
  std::vector<Tensor> out;
  out.reserve(self.size());
  for (const Tensor& t : self) out.push_back(at::empty({}, t.options().dtype(dtype.value_or(t.scalar_type()))));
  c10::DeviceGuard guard(self[0].device());
  std::vector<tpurt_view> ov = views(out), iv = views(self);
  check(tpurt_foreach_norm(current_stream(self[0].device().index()), static_cast<int>(self.size()), ov.data(),
                           iv.data(), p),
        "_foreach_norm");
  return out;
}

// ---------------------------------------------------- fused optimizers

// grad_scale / found_inf: device scalars (read by the kernel) or CPU values.
// Returns false when a CPU found_inf says the step must be skipped.
bool amp_args(const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf, tpurt_amp_args* a) {
  *a = tpurt_amp_args{};
  if (found_inf && found_inf->defined()) {
    if (found_inf->device().is_cpu()) {
      if (found_inf->item().toDouble() != 0) return false;
    } else {
      a->found_inf = dscalar_of(*found_inf, "found_inf");
      a->has_found_inf = 1;
    }
  }
  if (grad_scale && grad_scale->defined()) {
    a->grad_scale = dscalar_of(*grad_scale, "grad_scale");
    a->has_grad_scale = 1;
  }
  return true;
}

void check_optim_lists(const char* op, TensorList params, std::initializer_list<TensorList> others) {
  for (const TensorList& l : others)
    TORCH_CHECK(l.size() == params.size(), op, ": expected all tensor lists to have ", params.size(),
                " tensors, got ", l.size());
  for (size_t i = 0; i < params.size(); i++) {
    TORCH_CHECK(params[i].device().type() == kTpu && params[i].device() == params[0].device(), op,
                ": expected all params on the same tpu device, got ", params[i].device());
    TORCH_CHECK(fast_dtype(params[i].scalar_type()), op, ": params must be floating point, got ",
                params[i].scalar_type());
    for (const TensorList& l : others) {
      TORCH_CHECK(l[i].device() == params[0].device(), op, ": expected all tensors on ", params[0].device(),
                  ", got ", l[i].device());
    }
  }
}

void fused_adam_impl(const char* op, bool decoupled, TensorList params, TensorList grads, TensorList exp_avgs,
                     TensorList exp_avg_sqs, TensorList max_exp_avg_sqs, TensorList state_steps, tpurt_dscalar lr,
                     double beta1, double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                     const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {
  if (params.empty()) return;
  if (amsgrad)
    check_optim_lists(op, params, {grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps});
  else
    check_optim_lists(op, params, {grads, exp_avgs, exp_avg_sqs, state_steps});
  for (size_t i = 0; i < params.size(); i++) {
    TORCH_CHECK(grads[i].sizes().equals(params[i].sizes()), op, ": grad ", i, " has shape ", grads[i].sizes(),
                " but the param has shape ", params[i].sizes());
    TORCH_CHECK(state_steps[i].numel() == 1, op, ": state_steps must hold one element each, got ",
                state_steps[i].numel());
  }
  tpurt_adam_config cfg{};
  if (!amp_args(grad_scale, found_inf, &cfg.amp)) return;
  cfg.lr = lr;
  cfg.beta1 = beta1, cfg.beta2 = beta2, cfg.weight_decay = weight_decay, cfg.eps = eps;
  cfg.amsgrad = amsgrad, cfg.maximize = maximize, cfg.decoupled = decoupled;
  c10::DeviceGuard guard(params[0].device());
  auto pv = views(params), gv = views(grads), mv = views(exp_avgs), vv = views(exp_avg_sqs), sv = views(state_steps);
  std::vector<tpurt_view> xv = amsgrad ? views(max_exp_avg_sqs) : std::vector<tpurt_view>{};
  check(tpurt_fused_adam(current_stream(params[0].device().index()), static_cast<int>(params.size()), pv.data(),
                         gv.data(), mv.data(), vv.data(), amsgrad ? xv.data() : nullptr, sv.data(), &cfg),
        op);
}

tpurt_dscalar lr_of(const Tensor& lr, const at::Device& dev) {
  TORCH_CHECK(lr.numel() == 1, "lr must be a one-element tensor, got ", lr.numel(), " elements");
  if (lr.device().is_cpu()) return host_scalar(lr.item());
  TORCH_CHECK(lr.device() == dev, "lr must be on the CPU or on the params' device ", dev, ", got ", lr.device());
  return dscalar_of(lr, "lr");
}

#define TPU_FUSED_ADAM(NAME, OPNAME, DECOUPLED)                                                                  \
  void NAME(TensorList params, TensorList grads, TensorList exp_avgs, TensorList exp_avg_sqs,                     \
            TensorList max_exp_avg_sqs, TensorList state_steps, double lr, double beta1, double beta2,           \
            double weight_decay, double eps, bool amsgrad, bool maximize, const std::optional<Tensor>& grad_scale, \
            const std::optional<Tensor>& found_inf) {                                                            \
    tpurt_dscalar l{};                                                                                           \
    l.value = lr;                                                                                                \
    fused_adam_impl(OPNAME, DECOUPLED, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, l,     \
                    beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);                  \
  }                                                                                                              \
  void NAME##_tensor_lr(TensorList params, TensorList grads, TensorList exp_avgs, TensorList exp_avg_sqs,        \
                        TensorList max_exp_avg_sqs, TensorList state_steps, const Tensor& lr, double beta1,      \
                        double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,              \
                        const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {       \
    if (params.empty()) return;                                                                                  \
    fused_adam_impl(OPNAME, DECOUPLED, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,        \
                    lr_of(lr, params[0].device()), beta1, beta2, weight_decay, eps, amsgrad, maximize,           \
                    grad_scale, found_inf);                                                                      \
  }

TPU_FUSED_ADAM(fused_adam, "_fused_adam_", false)
TPU_FUSED_ADAM(fused_adamw, "_fused_adamw_", true)

void fused_sgd_impl(TensorList params, TensorList grads, TensorList bufs, double weight_decay, double momentum,
                    tpurt_dscalar lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
                    const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {
  const char* op = "_fused_sgd_";
  if (params.empty()) return;
  bool has_buf = momentum != 0;
  if (has_buf)
    check_optim_lists(op, params, {grads, bufs});
  else
    check_optim_lists(op, params, {grads});
  for (size_t i = 0; i < params.size(); i++)
    TORCH_CHECK(grads[i].sizes().equals(params[i].sizes()), op, ": grad ", i, " has shape ", grads[i].sizes(),
                " but the param has shape ", params[i].sizes());
  tpurt_sgd_config cfg{};
  if (!amp_args(grad_scale, found_inf, &cfg.amp)) return;
  cfg.lr = lr;
  cfg.momentum = momentum, cfg.dampening = dampening, cfg.weight_decay = weight_decay;
  cfg.nesterov = nesterov, cfg.maximize = maximize, cfg.first_step = is_first_step;
  c10::DeviceGuard guard(params[0].device());
  auto pv = views(params), gv = views(grads);
  std::vector<tpurt_view> bv = has_buf ? views(bufs) : std::vector<tpurt_view>{};
  check(tpurt_fused_sgd(current_stream(params[0].device().index()), static_cast<int>(params.size()), pv.data(),
                        gv.data(), has_buf ? bv.data() : nullptr, &cfg),
        op);
}

void fused_sgd(TensorList params, TensorList grads, TensorList bufs, double weight_decay, double momentum, double lr,
               double dampening, bool nesterov, bool maximize, bool is_first_step,
               const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {
  tpurt_dscalar l{};
  l.value = lr;
  fused_sgd_impl(params, grads, bufs, weight_decay, momentum, l, dampening, nesterov, maximize, is_first_step,
                 grad_scale, found_inf);
}

void fused_sgd_tensor_lr(TensorList params, TensorList grads, TensorList bufs, double weight_decay, double momentum,
                         const Tensor& lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
                         const std::optional<Tensor>& grad_scale, const std::optional<Tensor>& found_inf) {
  if (params.empty()) return;
  fused_sgd_impl(params, grads, bufs, weight_decay, momentum, lr_of(lr, params[0].device()), dampening, nesterov,
                 maximize, is_first_step, grad_scale, found_inf);
}

// ------------------------------------------------------------------ AMP

void amp_unscale_(TensorList self, Tensor& found_inf, const Tensor& inv_scale) {
  if (self.empty()) return;
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::kFloat, "inv_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");
  TORCH_CHECK(found_inf.device() == inv_scale.device() && found_inf.device().type() == kTpu,
              "found_inf and inv_scale must be on the same tpu device, got ", found_inf.device(), " and ",
              inv_scale.device());
  for (const Tensor& t : self) {
    TORCH_CHECK(t.device() == found_inf.device(), "scaled_grads must be on the same device as found_inf (",
                found_inf.device(), "), got ", t.device());
    TORCH_CHECK(t.layout() == at::kStrided, "one of scaled_grads was not a strided tensor.");
    TORCH_CHECK(fast_dtype(t.scalar_type()), "scaled_grads must be floating point, got ", t.scalar_type());
  }
  c10::DeviceGuard guard(found_inf.device());
  auto gv = views(self);
  tpurt_view fv = view_of(found_inf), iv = view_of(inv_scale);
  check(tpurt_amp_unscale(current_stream(found_inf.device().index()), static_cast<int>(self.size()), gv.data(), &fv,
                          &iv),
        "_amp_foreach_non_finite_check_and_unscale_");
}

Tensor& amp_update_scale_(Tensor& self, Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,
                          double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(growth_tracker.device() == self.device() && found_inf.device() == self.device(),
              "current_scale, growth_tracker and found_inf must be on the same device");
  TORCH_CHECK(self.numel() == 1, "current_scale must be a 1-element tensor.");
  TORCH_CHECK(growth_tracker.numel() == 1, "growth_tracker must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(self.scalar_type() == at::kFloat, "current_scale must be a float tensor.");
  TORCH_CHECK(growth_tracker.scalar_type() == at::kInt, "growth_tracker must be an int tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");
  c10::DeviceGuard guard(self.device());
  tpurt_view sv = view_of(self), gv = view_of(growth_tracker), fv = view_of(found_inf);
  check(tpurt_amp_update_scale(current_stream(self.device().index()), &sv, &gv, &fv, growth_factor, backoff_factor,
                               growth_interval),
        "_amp_update_scale_");
  return self;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // fused optimizers and AMP
  m.impl("_fused_adam_", TORCH_FN(fused_adam));
  m.impl("_fused_adam_.tensor_lr", TORCH_FN(fused_adam_tensor_lr));
  m.impl("_fused_adamw_", TORCH_FN(fused_adamw));
  m.impl("_fused_adamw_.tensor_lr", TORCH_FN(fused_adamw_tensor_lr));
  m.impl("_fused_sgd_", TORCH_FN(fused_sgd));
  m.impl("_fused_sgd_.tensor_lr", TORCH_FN(fused_sgd_tensor_lr));
  m.impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(amp_unscale_));
  m.impl("_amp_update_scale_", TORCH_FN(amp_update_scale_));

  // unary
#define REG_UNARY(OP, FN)          \
  m.impl("_foreach_" #OP, TORCH_FN(FN)); \
  m.impl("_foreach_" #OP "_", TORCH_FN(FN##_));
  REG_UNARY(sqrt, fe_sqrt)
  REG_UNARY(neg, fe_neg)
  REG_UNARY(abs, fe_abs)
  REG_UNARY(exp, fe_exp)
  REG_UNARY(reciprocal, fe_reciprocal)
  REG_UNARY(sign, fe_sign)
#undef REG_UNARY

  // binary: List / Scalar / ScalarList
#define REG_BINARY(OP, FN)                                          \
  m.impl("_foreach_" #OP ".List", TORCH_FN(FN##_list));             \
  m.impl("_foreach_" #OP "_.List", TORCH_FN(FN##_list_));           \
  m.impl("_foreach_" #OP ".Scalar", TORCH_FN(FN##_scalar));         \
  m.impl("_foreach_" #OP "_.Scalar", TORCH_FN(FN##_scalar_));       \
  m.impl("_foreach_" #OP ".ScalarList", TORCH_FN(FN##_scalarlist)); \
  m.impl("_foreach_" #OP "_.ScalarList", TORCH_FN(FN##_scalarlist_));
  REG_BINARY(add, fe_add)
  REG_BINARY(sub, fe_sub)
  REG_BINARY(mul, fe_mul)
  REG_BINARY(div, fe_div)
  REG_BINARY(maximum, fe_max)
  REG_BINARY(minimum, fe_min)
  REG_BINARY(clamp_min, fe_max)
  REG_BINARY(clamp_max, fe_min)
  REG_BINARY(pow, fe_pow)
#undef REG_BINARY
  m.impl("_foreach_pow.ScalarAndTensor", TORCH_FN(fe_rpow));
  m.impl("_foreach_add.Tensor", TORCH_FN(fe_add_tensor));
  m.impl("_foreach_add_.Tensor", TORCH_FN(fe_add_tensor_));
  m.impl("_foreach_mul.Tensor", TORCH_FN(fe_mul_tensor));
  m.impl("_foreach_mul_.Tensor", TORCH_FN(fe_mul_tensor_));
  m.impl("_foreach_div.Tensor", TORCH_FN(fe_div_tensor));
  m.impl("_foreach_div_.Tensor", TORCH_FN(fe_div_tensor_));

  // ternary
#define REG_ADDC(OP, FN)                                                \
  m.impl("_foreach_" #OP ".Scalar", TORCH_FN(FN##_scalar));             \
  m.impl("_foreach_" #OP "_.Scalar", TORCH_FN(FN##_scalar_));           \
  m.impl("_foreach_" #OP ".ScalarList", TORCH_FN(FN##_scalarlist));     \
  m.impl("_foreach_" #OP "_.ScalarList", TORCH_FN(FN##_scalarlist_));   \
  m.impl("_foreach_" #OP ".Tensor", TORCH_FN(FN##_tensor));             \
  m.impl("_foreach_" #OP "_.Tensor", TORCH_FN(FN##_tensor_));
  REG_ADDC(addcmul, fe_addcmul)
  REG_ADDC(addcdiv, fe_addcdiv)
#undef REG_ADDC
  m.impl("_foreach_lerp.List", TORCH_FN(fe_lerp_list));
  m.impl("_foreach_lerp_.List", TORCH_FN(fe_lerp_list_));
  m.impl("_foreach_lerp.Scalar", TORCH_FN(fe_lerp_scalar));
  m.impl("_foreach_lerp_.Scalar", TORCH_FN(fe_lerp_scalar_));
  m.impl("_foreach_lerp.ScalarList", TORCH_FN(fe_lerp_scalarlist));
  m.impl("_foreach_lerp_.ScalarList", TORCH_FN(fe_lerp_scalarlist_));

  m.impl("_foreach_copy_", TORCH_FN(fe_copy_));
  m.impl("_foreach_zero_", TORCH_FN(fe_zero_));
  m.impl("_foreach_norm.Scalar", TORCH_FN(fe_norm));
}

}  // namespace torch_tpu
