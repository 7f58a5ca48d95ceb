// ATen kernels of the tpu backend for matrix products,
// pooling and upsampling. Each kernel checks arguments like PyTorch's CPU
// backend, allocates outputs and calls the runtime (tpurt_gemm, tpurt_conv2d,
// tpurt_max_pool2d, ...). matmul, linear, conv1d/conv2d and F.interpolate
// are composites of these.
//
// Precision of f32 products: torch_tpu's own setting when set
// (torch.tpu.precision), else torch.get_float32_matmul_precision():
// "highest" -> HIGHEST (f32), "high" -> HIGH (3-pass bf16), "medium" ->
// DEFAULT (1-pass bf16).
#include "glue.h"

#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <atomic>

namespace torch_tpu {

namespace {
std::atomic<int> g_precision{-1};
}

void set_matmul_precision(int p) {
  TORCH_CHECK(p >= -1 && p <= 2, "matmul precision must be -1 (follow torch), 0 (DEFAULT), 1 (HIGH) or 2 (HIGHEST)");
  g_precision.store(p);
}
int matmul_precision() { return g_precision.load(); }

tpurt_precision effective_matmul_precision() {
  int p = g_precision.load(std::memory_order_relaxed);
  if (p >= 0) return static_cast<tpurt_precision>(p);
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGH: return TPURT_PRECISION_HIGH;
    case at::Float32MatmulPrecision::MEDIUM: return TPURT_PRECISION_DEFAULT;
    default: return TPURT_PRECISION_HIGHEST;
  }
}

namespace {

// 3-D view [1, M, N] of a matrix or the tensor's own view when 3-D.
tpurt_view view3(const at::Tensor& t) {
  tpurt_view v = view_of(t);
  if (v.ndim == 3) return v;
  if (v.ndim == 1) {  // [K] used as a column [1, K, 1]
    v.sizes[2] = 1, v.strides[2] = 1;
    v.sizes[1] = t.size(0), v.strides[1] = t.stride(0);
  } else {
    v.sizes[2] = v.sizes[1], v.strides[2] = v.strides[1];
    v.sizes[1] = v.sizes[0], v.strides[1] = v.strides[0];
  }
  v.sizes[0] = 1, v.strides[0] = 0;
  v.ndim = 3;
  return v;
}

void check_tpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().type() == kTpu, "Expected all tensors to be on the same device, but found ", what,
              " on ", t.device());
}

void run_gemm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha, bool use_c,
              const c10::Scalar& beta, const char* name) {
  if (out.numel() == 0) return;
  c10::DeviceGuard guard(out.device());
  tpurt_view c = view3(out), av = view3(a), bv = view3(b);
  check(tpurt_gemm(current_stream(out.device().index()), &c, &av, &bv, alpha.toDouble(),
                   use_c ? beta.toDouble() : 0.0, effective_matmul_precision()),
        name);
}

// --------------------------------------------------------------- mm family

void check_mm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2, "self must be a matrix");
  TORCH_CHECK(b.dim() == 2, "mat2 must be a matrix");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1),
              " and ", b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
  check_tpu(a, "self");
  check_tpu(b, "mat2");
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(a.scalar_type()) && a.scalar_type() != at::kBool,
                              "\"addmm_impl_tpu_\" not implemented for '", a.scalar_type(), "'");
}

void prepare_out(const at::Tensor& out, c10::IntArrayRef sizes, at::ScalarType dt, const char* name) {
  TORCH_CHECK(out.scalar_type() == dt, "Expected out tensor to have dtype ", dt, ", but got ", out.scalar_type(),
              " instead");
  check_tpu(out, "out");
  at::native::resize_output(out, sizes);
}

at::Tensor& addmm_impl(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                       const c10::Scalar& alpha, at::Tensor& out, const char* name) {
  check_mm(a, b);
  bool use_c = self.defined() && !(beta.isFloatingPoint() ? beta.toDouble() == 0.0 : beta.toLong() == 0) &&
               self.numel() > 0;
  if (self.defined()) {
    TORCH_CHECK(self.scalar_type() == a.scalar_type(), "self and mat2 must have the same dtype, but got ",
                self.scalar_type(), " and ", a.scalar_type());
    auto e = at::expand_size(self, {a.size(0), b.size(1)}, "addmm");  // raises RuntimeError on mismatch
    (void)e;
  }
  bool in_place = self.defined() && out.is_same(self);
  prepare_out(out, {a.size(0), b.size(1)}, a.scalar_type(), name);
  if (use_c && !in_place) {
    if (out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble) {
      // out = alpha a@b, then out += beta self as an elementwise add: the
      // same rounding as the product's own beta pass in f32/f64, one pass
      // instead of broadcasting self into out first, and in DeferAndFuse
      // the bias add fuses with what follows (activation, dropout, residual
      // add). f16/bf16 keep the single rounding of the product's epilogue.
      run_gemm(out, a, b, alpha, false, 0, name);
      out.add_(self.expand({a.size(0), b.size(1)}), beta);
      return out;
    }
    out.copy_(self.expand({a.size(0), b.size(1)}));
  }
  if (a.size(1) == 0 && !use_c && out.numel() > 0) {
    out.zero_();
    return out;
  }
  run_gemm(out, a, b, alpha, use_c, beta, name);
  return out;
}

at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return addmm_impl(at::Tensor(), a, b, 0, 1, out, "mm");
}
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  check_mm(a, b);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  return mm_out(a, b, out);
}
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                      const c10::Scalar& alpha, at::Tensor& out) {
  return addmm_impl(self, a, b, beta, alpha, out, "addmm");
}
at::Tensor addmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                 const c10::Scalar& alpha) {
  check_mm(a, b);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  return addmm_impl(self, a, b, beta, alpha, out, "addmm");
}
at::Tensor& addmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                   const c10::Scalar& alpha) {
  check_mm(a, b);
  TORCH_CHECK(self.dim() == 2 && self.size(0) == a.size(0) && self.size(1) == b.size(1),
              "The input tensor must be a matrix with size ", a.size(0), "x", b.size(1), ", but got a ", self.dim(),
              "-D tensor with size ", self.size(0), "x", (self.dim() > 1 ? self.size(1) : 1));
  return addmm_impl(self, a, b, beta, alpha, self, "addmm_");
}

void check_bmm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(a.size(0) == b.size(0), "batch1 and batch2 must have same number of batches, got ", a.size(0), " and ",
              b.size(0));
  TORCH_CHECK(a.size(2) == b.size(1), "Expected size for first two dimensions of batch2 tensor to be: [", a.size(0),
              ", ", a.size(2), "] but got: [", b.size(0), ", ", b.size(1), "].");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(), " but found ",
              b.scalar_type());
  check_tpu(a, "batch1");
  check_tpu(b, "batch2");
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(a.scalar_type()) && a.scalar_type() != at::kBool,
                              "\"bmm_tpu\" not implemented for '", a.scalar_type(), "'");
}

at::Tensor& baddbmm_impl(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                         const c10::Scalar& alpha, at::Tensor& out, const char* name) {
  check_bmm(a, b);
  std::vector<int64_t> sz{a.size(0), a.size(1), b.size(2)};
  bool use_c = self.defined() && !(beta.isFloatingPoint() ? beta.toDouble() == 0.0 : beta.toLong() == 0) &&
               self.numel() > 0;
  if (self.defined()) {
    TORCH_CHECK(self.scalar_type() == a.scalar_type(), "self and batch1 must have the same dtype, but got ",
                self.scalar_type(), " and ", a.scalar_type());
    (void)at::expand_size(self, sz, "baddbmm");
  }
  bool in_place = self.defined() && out.is_same(self);
  prepare_out(out, sz, a.scalar_type(), name);
  if (use_c && !in_place) out.copy_(self.expand(sz));
  if (a.size(2) == 0 && !use_c && out.numel() > 0) {
    out.zero_();
    return out;
  }
  run_gemm(out, a, b, alpha, use_c, beta, name);
  return out;
}

at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return baddbmm_impl(at::Tensor(), a, b, 0, 1, out, "bmm");
}
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  check_bmm(a, b);
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  return bmm_out(a, b, out);
}
at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                        const c10::Scalar& alpha, at::Tensor& out) {
  return baddbmm_impl(self, a, b, beta, alpha, out, "baddbmm");
}
at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                   const c10::Scalar& alpha) {
  check_bmm(a, b);
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  return baddbmm_impl(self, a, b, beta, alpha, out, "baddbmm");
}
at::Tensor& baddbmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                     const c10::Scalar& alpha) {
  check_bmm(a, b);
  TORCH_CHECK(self.dim() == 3 && self.size(0) == a.size(0) && self.size(1) == a.size(1) && self.size(2) == b.size(2),
              "Expected self to have size [", a.size(0), ", ", a.size(1), ", ", b.size(2), "], got ", self.sizes());
  return baddbmm_impl(self, a, b, beta, alpha, self, "baddbmm_");
}

// mv / addmv / dot as GEMMs with N = 1
at::Tensor& addmv_impl(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const c10::Scalar& beta,
                       const c10::Scalar& alpha, at::Tensor& out, const char* name) {
  TORCH_CHECK(mat.dim() == 2 && vec.dim() == 1, "vector + matrix @ vector expected, got ", (self.defined() ? self.dim() : 1),
              ", ", mat.dim(), ", ", vec.dim());
  TORCH_CHECK(mat.size(1) == vec.size(0), "size mismatch, got input (", mat.size(0), "), mat (", mat.size(0), "x",
              mat.size(1), "), vec (", vec.size(0), ")");
  TORCH_CHECK(mat.scalar_type() == vec.scalar_type(), "expected scalar type ", mat.scalar_type(), " but found ",
              vec.scalar_type());
  check_tpu(mat, "mat");
  check_tpu(vec, "vec");
  bool use_c = self.defined() && !(beta.isFloatingPoint() ? beta.toDouble() == 0.0 : beta.toLong() == 0) &&
               self.numel() > 0;
  if (self.defined()) (void)at::expand_size(self, {mat.size(0)}, "addmv");
  bool in_place = self.defined() && out.is_same(self);
  prepare_out(out, {mat.size(0)}, mat.scalar_type(), name);
  if (use_c && !in_place) out.copy_(self.expand({mat.size(0)}));
  if (mat.size(1) == 0 && !use_c && out.numel() > 0) {
    out.zero_();
    return out;
  }
  if (out.numel() == 0) return out;
  c10::DeviceGuard guard(out.device());
  tpurt_view c = view3(out), av = view3(mat), bv = view3(vec);
  check(tpurt_gemm(current_stream(out.device().index()), &c, &av, &bv, alpha.toDouble(), use_c ? beta.toDouble() : 0,
                   effective_matmul_precision()),
        name);
  return out;
}
at::Tensor& addmv_out(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const c10::Scalar& beta,
                      const c10::Scalar& alpha, at::Tensor& out) {
  return addmv_impl(self, mat, vec, beta, alpha, out, "addmv");
}
at::Tensor addmv(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const c10::Scalar& beta,
                 const c10::Scalar& alpha) {
  at::Tensor out = at::empty({0}, mat.options());
  return addmv_impl(self, mat, vec, beta, alpha, out, "addmv");
}
at::Tensor& addmv_(at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const c10::Scalar& beta,
                   const c10::Scalar& alpha) {
  return addmv_impl(self, mat, vec, beta, alpha, self, "addmv_");
}
at::Tensor& mv_out(const at::Tensor& mat, const at::Tensor& vec, at::Tensor& out) {
  return addmv_impl(at::Tensor(), mat, vec, 0, 1, out, "mv");
}
at::Tensor mv(const at::Tensor& mat, const at::Tensor& vec) {
  at::Tensor out = at::empty({0}, mat.options());
  return mv_out(mat, vec, out);
}

at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [",
              b.numel(), "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(),
              " elements respectively");
  check_tpu(a, "self");
  check_tpu(b, "tensor");
  TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(a.scalar_type()) && a.scalar_type() != at::kBool, "\"dot\" not implemented for '",
                              a.scalar_type(), "'");
  at::Tensor out = at::empty({}, a.options());
  c10::DeviceGuard guard(out.device());
  tpurt_view c = view_of(out), av = view_of(a), bv = view_of(b);
  c.ndim = 3;
  c.sizes[0] = c.sizes[1] = c.sizes[2] = 1;
  c.strides[0] = c.strides[1] = c.strides[2] = 1;
  av.ndim = 3;  // [1, 1, K]
  av.sizes[2] = a.numel(), av.strides[2] = a.stride(0);
  av.sizes[0] = av.sizes[1] = 1, av.strides[0] = av.strides[1] = 0;
  bv.ndim = 3;  // [1, K, 1]
  bv.sizes[1] = b.numel(), bv.strides[1] = b.stride(0);
  bv.sizes[0] = bv.sizes[2] = 1, bv.strides[0] = bv.strides[2] = 0;
  check(tpurt_gemm(current_stream(out.device().index()), &c, &av, &bv, 1.0, 0.0, effective_matmul_precision()), "dot");
  return out;
}

// Convolution (1-D, 2-D, 3-D, transposed) lives in aten_vision.cpp.

// ---------------------------------------------------------------- pooling

int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, bool ceil) {
  int64_t num = in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil && (o - 1) * s >= in + pad) --o;
  return o;
}

struct Pool2d {
  tpurt_pool_params p;
  int64_t oh, ow;
};

// Two ints from an IntArrayRef of 1 or 2 (empty -> dflt).
std::pair<int64_t, int64_t> two(c10::IntArrayRef a, const char* what, std::optional<std::pair<int64_t, int64_t>> dflt) {
  if (a.empty() && dflt) return *dflt;
  TORCH_CHECK(a.size() == 1 || a.size() == 2, what, " must either be a single int, or a tuple of two ints");
  return {a[0], a.size() == 1 ? a[0] : a[1]};
}

Pool2d pool_geom(const at::Tensor& in, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                 c10::IntArrayRef dilation, bool ceil, const char* name, bool is_max) {
  auto k = two(kernel, is_max ? "max_pool2d: kernel_size" : "avg_pool2d: kernel_size", std::nullopt);
  auto s = two(stride, is_max ? "max_pool2d: stride" : "avg_pool2d: stride", k);
  auto p = two(padding, is_max ? "max_pool2d: padding" : "avg_pool2d: padding", std::nullopt);
  auto d = two(dilation, "max_pool2d: dilation", std::make_pair<int64_t, int64_t>(1, 1));
  TORCH_CHECK(k.first > 0 && k.second > 0, "kernel_size should be greater than zero, but got kH: ", k.first,
              " kW: ", k.second);
  TORCH_CHECK(s.first > 0 && s.second > 0, "stride should be greater than zero, but got dH: ", s.first, " dW: ",
              s.second);
  TORCH_CHECK(d.first > 0 && d.second > 0, "dilation should be greater than zero, but got dilationH: ", d.first,
              " dilationW: ", d.second);
  TORCH_CHECK(in.dim() == 3 || in.dim() == 4, "non-empty 3D or 4D (batch mode) tensor expected for input");
  TORCH_CHECK(p.first <= k.first / 2 && p.second <= k.second / 2,
              "pad should be at most half of effective kernel size, but got pad=", p.first, ", kernel_size=", k.first,
              " and dilation=", d.first);
  int64_t H = in.size(-2), W = in.size(-1);
  Pool2d g;
  g.oh = pool_out_size(H, k.first, p.first, s.first, d.first, ceil);
  g.ow = pool_out_size(W, k.second, p.second, s.second, d.second, ceil);
  TORCH_CHECK(g.oh >= 1 && g.ow >= 1, "Given input size: (", in.size(-3), "x", H, "x", W,
              "). Calculated output size: (", in.size(-3), "x", g.oh, "x", g.ow, "). Output size is too small");
  g.p = tpurt_pool_params{{k.first, k.second}, {s.first, s.second}, {p.first, p.second}, {d.first, d.second}, 1, 0};
  return g;
}

std::vector<int64_t> out_shape(const at::Tensor& in, int64_t oh, int64_t ow) {
  std::vector<int64_t> s(in.sizes().begin(), in.sizes().end() - 2);
  s.push_back(oh);
  s.push_back(ow);
  return s;
}

// 4-D view of a 3-D (C, H, W) or 4-D tensor.
tpurt_view pview(const at::Tensor& t) {
  tpurt_view v = view_of(t);
  if (v.ndim == 4) return v;
  for (int k = 3; k >= 1; k--) v.sizes[k] = v.sizes[k - 1], v.strides[k] = v.strides[k - 1];
  v.sizes[0] = 1, v.strides[0] = 0;
  v.ndim = 4;
  return v;
}

void check_float_input(const at::Tensor& t, const char* name) {
  check_tpu(t, "input");
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t.scalar_type()), "\"", name, "\" not implemented for '", t.scalar_type(), "'");
}

std::tuple<at::Tensor&, at::Tensor&> max_pool2d_with_indices_out(const at::Tensor& self, c10::IntArrayRef kernel,
                                                                 c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                                 c10::IntArrayRef dilation, bool ceil,
                                                                 at::Tensor& out, at::Tensor& idx) {
  check_float_input(self, "max_pool2d");
  Pool2d g = pool_geom(self, kernel, stride, padding, dilation, ceil, "max_pool2d", true);
  auto sz = out_shape(self, g.oh, g.ow);
  at::native::resize_output(out, sz);
  at::native::resize_output(idx, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view o = pview(out), i = pview(idx), x = pview(self);
  check(tpurt_max_pool2d(current_stream(self.device().index()), &o, &i, &x, &g.p), "max_pool2d");
  return {out, idx};
}
std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, c10::IntArrayRef kernel,
                                                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                           c10::IntArrayRef dilation, bool ceil) {
  at::Tensor out = at::empty({0}, self.options()), idx = at::empty({0}, self.options().dtype(at::kLong));
  max_pool2d_with_indices_out(self, kernel, stride, padding, dilation, ceil, out, idx);
  return {out, idx};
}
at::Tensor& max_pool2d_with_indices_backward_out(const at::Tensor& grad_out, const at::Tensor& self,
                                                 c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                                 c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil,
                                                 const at::Tensor& indices, at::Tensor& grad_in) {
  at::native::resize_output(grad_in, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view gi = pview(grad_in), go = pview(grad_out), ix = pview(indices);
  check(tpurt_max_pool2d_backward(current_stream(self.device().index()), &gi, &go, &ix), "max_pool2d_backward");
  return grad_in;
}
at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad_out, const at::Tensor& self,
                                            c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                            c10::IntArrayRef dilation, bool ceil, const at::Tensor& indices) {
  at::Tensor gi = at::empty(self.sizes(), grad_out.options());
  return max_pool2d_with_indices_backward_out(grad_out, self, kernel, stride, padding, dilation, ceil, indices, gi);
}

tpurt_pool_params avg_params(const Pool2d& g, bool count_include_pad, std::optional<int64_t> div) {
  tpurt_pool_params p = g.p;
  p.count_include_pad = count_include_pad;
  TORCH_CHECK(!div || *div != 0, "divisor must be not zero");
  p.divisor_override = div ? *div : 0;
  return p;
}

at::Tensor& avg_pool2d_out(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, bool ceil, bool count_include_pad,
                           std::optional<int64_t> div, at::Tensor& out) {
  check_float_input(self, "avg_pool2d");
  Pool2d g = pool_geom(self, kernel, stride, padding, {}, ceil, "avg_pool2d", false);
  tpurt_pool_params p = avg_params(g, count_include_pad, div);
  at::native::resize_output(out, out_shape(self, g.oh, g.ow));
  c10::DeviceGuard guard(self.device());
  tpurt_view o = pview(out), x = pview(self);
  check(tpurt_avg_pool2d(current_stream(self.device().index()), &o, &x, &p), "avg_pool2d");
  return out;
}
at::Tensor avg_pool2d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, bool ceil, bool count_include_pad, std::optional<int64_t> div) {
  at::Tensor out = at::empty({0}, self.options());
  return avg_pool2d_out(self, kernel, stride, padding, ceil, count_include_pad, div, out);
}
at::Tensor& avg_pool2d_backward_out(const at::Tensor& grad_out, const at::Tensor& self, c10::IntArrayRef kernel,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil,
                                    bool count_include_pad, std::optional<int64_t> div, at::Tensor& grad_in) {
  Pool2d g = pool_geom(self, kernel, stride, padding, {}, ceil, "avg_pool2d", false);
  tpurt_pool_params p = avg_params(g, count_include_pad, div);
  at::native::resize_output(grad_in, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view gi = pview(grad_in), go = pview(grad_out);
  check(tpurt_avg_pool2d_backward(current_stream(self.device().index()), &gi, &go, &p), "avg_pool2d_backward");
  return grad_in;
}
at::Tensor avg_pool2d_backward(const at::Tensor& grad_out, const at::Tensor& self, c10::IntArrayRef kernel,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil, bool count_include_pad,
                               std::optional<int64_t> div) {
  at::Tensor gi = at::empty(self.sizes(), grad_out.options());
  return avg_pool2d_backward_out(grad_out, self, kernel, stride, padding, ceil, count_include_pad, div, gi);
}

std::pair<int64_t, int64_t> adaptive_size(const at::Tensor& self, c10::IntArrayRef output_size, const char* name) {
  TORCH_CHECK(output_size.size() == 2, name, ": output_size must be 2");
  TORCH_CHECK(self.dim() == 3 || self.dim() == 4, name, ": Expected 3D or 4D tensor, but got: ", self.sizes());
  for (int64_t i = 1; i < self.dim(); i++)
    TORCH_CHECK(self.size(i) > 0, name, "(): Expected input to have non-zero size for non-batch dimensions, but input "
                "has sizes ", self.sizes(), " with dimension ", i, " being empty");
  TORCH_CHECK(output_size[0] >= 0 && output_size[1] >= 0, name, ": elements of output_size must be greater than or "
              "equal to 0 but received {", output_size[0], ", ", output_size[1], "}");
  return {output_size[0], output_size[1]};
}

at::Tensor& adaptive_avg_pool2d_out(const at::Tensor& self, c10::SymIntArrayRef output_size, at::Tensor& out) {
  check_float_input(self, "adaptive_avg_pool2d");
  auto os = C10_AS_INTARRAYREF_SLOW(output_size);
  auto [oh, ow] = adaptive_size(self, os, "adaptive_avg_pool2d");
  at::native::resize_output(out, out_shape(self, oh, ow));
  c10::DeviceGuard guard(self.device());
  tpurt_view o = pview(out), x = pview(self);
  check(tpurt_adaptive_pool2d(current_stream(self.device().index()), &o, nullptr, &x, 0), "adaptive_avg_pool2d");
  return out;
}
at::Tensor adaptive_avg_pool2d(const at::Tensor& self, c10::SymIntArrayRef output_size) {
  at::Tensor out = at::empty({0}, self.options());
  return adaptive_avg_pool2d_out(self, output_size, out);
}
at::Tensor adaptive_avg_pool2d_backward(const at::Tensor& grad_out, const at::Tensor& self) {
  at::Tensor gi = at::empty(self.sizes(), grad_out.options());
  c10::DeviceGuard guard(self.device());
  tpurt_view v = pview(gi), go = pview(grad_out);
  check(tpurt_adaptive_avg_pool2d_backward(current_stream(self.device().index()), &v, &go),
        "adaptive_avg_pool2d_backward");
  return gi;
}

std::tuple<at::Tensor&, at::Tensor&> adaptive_max_pool2d_out(const at::Tensor& self, c10::IntArrayRef output_size,
                                                             at::Tensor& out, at::Tensor& idx) {
  check_float_input(self, "adaptive_max_pool2d");
  auto [oh, ow] = adaptive_size(self, output_size, "adaptive_max_pool2d");
  auto sz = out_shape(self, oh, ow);
  at::native::resize_output(out, sz);
  at::native::resize_output(idx, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view o = pview(out), i = pview(idx), x = pview(self);
  check(tpurt_adaptive_pool2d(current_stream(self.device().index()), &o, &i, &x, 1), "adaptive_max_pool2d");
  return {out, idx};
}
std::tuple<at::Tensor, at::Tensor> adaptive_max_pool2d(const at::Tensor& self, c10::IntArrayRef output_size) {
  at::Tensor out = at::empty({0}, self.options()), idx = at::empty({0}, self.options().dtype(at::kLong));
  adaptive_max_pool2d_out(self, output_size, out, idx);
  return {out, idx};
}
at::Tensor& adaptive_max_pool2d_backward_out(const at::Tensor& grad_out, const at::Tensor& self,
                                             const at::Tensor& indices, at::Tensor& grad_in) {
  at::native::resize_output(grad_in, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view gi = pview(grad_in), go = pview(grad_out), ix = pview(indices);
  check(tpurt_max_pool2d_backward(current_stream(self.device().index()), &gi, &go, &ix),
        "adaptive_max_pool2d_backward");
  return grad_in;
}
at::Tensor adaptive_max_pool2d_backward(const at::Tensor& grad_out, const at::Tensor& self,
                                        const at::Tensor& indices) {
  at::Tensor gi = at::empty(self.sizes(), grad_out.options());
  return adaptive_max_pool2d_backward_out(grad_out, self, indices, gi);
}

// --------------------------------------------------------------- upsample

void check_up(const at::Tensor& in, c10::IntArrayRef output_size, const char* name) {
  TORCH_CHECK(output_size.size() == 2, "It is expected output_size equals to 2, but got size ", output_size.size());
  TORCH_CHECK(in.dim() == 4, "Non-empty 4D data tensor expected but got a tensor with sizes ", in.sizes());
  TORCH_CHECK(in.size(2) > 0 && in.size(3) > 0 && output_size[0] > 0 && output_size[1] > 0,
              "Input and output sizes should be greater than 0, but got input (H: ", in.size(2), ", W: ", in.size(3),
              ") output (H: ", output_size[0], ", W: ", output_size[1], ")");
}

at::Tensor& upsample_out(const at::Tensor& self, c10::IntArrayRef output_size, tpurt_upsample_mode mode, bool align,
                         std::optional<double> sh, std::optional<double> sw, at::Tensor& out, const char* name) {
  check_float_input(self, name);
  check_up(self, output_size, name);
  at::native::resize_output(out, {self.size(0), self.size(1), output_size[0], output_size[1]});
  c10::DeviceGuard guard(self.device());
  tpurt_view o = view_of(out), x = view_of(self);
  check(tpurt_upsample2d(current_stream(self.device().index()), &o, &x, mode, align, sh.value_or(-1.0),
                         sw.value_or(-1.0)),
        name);
  return out;
}
at::Tensor& upsample_backward_out(const at::Tensor& grad_out, c10::IntArrayRef output_size,
                                  c10::IntArrayRef input_size, tpurt_upsample_mode mode, bool align,
                                  std::optional<double> sh, std::optional<double> sw, at::Tensor& grad_in,
                                  const char* name) {
  TORCH_CHECK(input_size.size() == 4, "It is expected input_size equals to 4, but got size ", input_size.size());
  TORCH_CHECK(grad_out.dim() == 4 && grad_out.size(2) == output_size[0] && grad_out.size(3) == output_size[1],
              "Expected grad_output to have the output size ", output_size, ", but got ", grad_out.sizes());
  at::native::resize_output(grad_in, input_size);
  c10::DeviceGuard guard(grad_out.device());
  tpurt_view gi = view_of(grad_in), go = view_of(grad_out);
  check(tpurt_upsample2d_backward(current_stream(grad_out.device().index()), &gi, &go, mode, align,
                                  sh.value_or(-1.0), sw.value_or(-1.0)),
        name);
  return grad_in;
}

at::Tensor& up_nearest_out(const at::Tensor& self, c10::SymIntArrayRef os, std::optional<double> sh,
                           std::optional<double> sw, at::Tensor& out) {
  return upsample_out(self, C10_AS_INTARRAYREF_SLOW(os), TPURT_UPSAMPLE_NEAREST, false, sh, sw, out,
                      "upsample_nearest2d");
}
at::Tensor up_nearest(const at::Tensor& self, c10::SymIntArrayRef os, std::optional<double> sh,
                      std::optional<double> sw) {
  at::Tensor out = at::empty({0}, self.options());
  return up_nearest_out(self, os, sh, sw, out);
}
at::Tensor& up_nearest_bwd_out(const at::Tensor& go, c10::SymIntArrayRef os, c10::SymIntArrayRef is,
                               std::optional<double> sh, std::optional<double> sw, at::Tensor& gi) {
  return upsample_backward_out(go, C10_AS_INTARRAYREF_SLOW(os), C10_AS_INTARRAYREF_SLOW(is), TPURT_UPSAMPLE_NEAREST,
                               false, sh, sw, gi, "upsample_nearest2d_backward");
}
at::Tensor up_nearest_bwd(const at::Tensor& go, c10::SymIntArrayRef os, c10::SymIntArrayRef is,
                          std::optional<double> sh, std::optional<double> sw) {
  at::Tensor gi = at::empty({0}, go.options());
  return up_nearest_bwd_out(go, os, is, sh, sw, gi);
}
at::Tensor& up_bilinear_out(const at::Tensor& self, c10::SymIntArrayRef os, bool align, std::optional<double> sh,
                            std::optional<double> sw, at::Tensor& out) {
  return upsample_out(self, C10_AS_INTARRAYREF_SLOW(os), TPURT_UPSAMPLE_BILINEAR, align, sh, sw, out,
                      "upsample_bilinear2d");
}
at::Tensor up_bilinear(const at::Tensor& self, c10::SymIntArrayRef os, bool align, std::optional<double> sh,
                       std::optional<double> sw) {
  at::Tensor out = at::empty({0}, self.options());
  return up_bilinear_out(self, os, align, sh, sw, out);
}
at::Tensor& up_bilinear_bwd_out(const at::Tensor& go, c10::SymIntArrayRef os, c10::SymIntArrayRef is, bool align,
                                std::optional<double> sh, std::optional<double> sw, at::Tensor& gi) {
  return upsample_backward_out(go, C10_AS_INTARRAYREF_SLOW(os), C10_AS_INTARRAYREF_SLOW(is), TPURT_UPSAMPLE_BILINEAR,
                               align, sh, sw, gi, "upsample_bilinear2d_backward");
}
at::Tensor up_bilinear_bwd(const at::Tensor& go, c10::SymIntArrayRef os, c10::SymIntArrayRef is, bool align,
                           std::optional<double> sh, std::optional<double> sw) {
  at::Tensor gi = at::empty({0}, go.options());
  return up_bilinear_bwd_out(go, os, is, align, sh, sw, gi);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", TORCH_FN(mm));
  m.impl("mm.out", TORCH_FN(mm_out));
  m.impl("addmm", TORCH_FN(addmm));
  m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("addmm_", TORCH_FN(addmm_));
  m.impl("bmm", TORCH_FN(bmm));
  m.impl("bmm.out", TORCH_FN(bmm_out));
  m.impl("baddbmm", TORCH_FN(baddbmm));
  m.impl("baddbmm.out", TORCH_FN(baddbmm_out));
  m.impl("baddbmm_", TORCH_FN(baddbmm_));
  m.impl("addmv", TORCH_FN(addmv));
  m.impl("addmv.out", TORCH_FN(addmv_out));
  m.impl("addmv_", TORCH_FN(addmv_));
  m.impl("mv", TORCH_FN(mv));
  m.impl("mv.out", TORCH_FN(mv_out));
  m.impl("dot", TORCH_FN(dot));
  m.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
  m.impl("max_pool2d_with_indices.out", TORCH_FN(max_pool2d_with_indices_out));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
  m.impl("max_pool2d_with_indices_backward.grad_input", TORCH_FN(max_pool2d_with_indices_backward_out));
  m.impl("avg_pool2d", TORCH_FN(avg_pool2d));
  m.impl("avg_pool2d.out", TORCH_FN(avg_pool2d_out));
  m.impl("avg_pool2d_backward", TORCH_FN(avg_pool2d_backward));
  m.impl("avg_pool2d_backward.grad_input", TORCH_FN(avg_pool2d_backward_out));
  m.impl("_adaptive_avg_pool2d", TORCH_FN(adaptive_avg_pool2d));
  m.impl("adaptive_avg_pool2d.out", TORCH_FN(adaptive_avg_pool2d_out));
  m.impl("_adaptive_avg_pool2d_backward", TORCH_FN(adaptive_avg_pool2d_backward));
  m.impl("adaptive_max_pool2d", TORCH_FN(adaptive_max_pool2d));
  m.impl("adaptive_max_pool2d.out", TORCH_FN(adaptive_max_pool2d_out));
  m.impl("adaptive_max_pool2d_backward", TORCH_FN(adaptive_max_pool2d_backward));
  m.impl("adaptive_max_pool2d_backward.grad_input", TORCH_FN(adaptive_max_pool2d_backward_out));
  m.impl("upsample_nearest2d", TORCH_FN(up_nearest));
  m.impl("upsample_nearest2d.out", TORCH_FN(up_nearest_out));
  m.impl("upsample_nearest2d_backward", TORCH_FN(up_nearest_bwd));
  m.impl("upsample_nearest2d_backward.grad_input", TORCH_FN(up_nearest_bwd_out));
  m.impl("upsample_bilinear2d", TORCH_FN(up_bilinear));
  m.impl("upsample_bilinear2d.out", TORCH_FN(up_bilinear_out));
  m.impl("upsample_bilinear2d_backward", TORCH_FN(up_bilinear_bwd));
  m.impl("upsample_bilinear2d_backward.grad_input", TORCH_FN(up_bilinear_bwd_out));
}

}  // namespace torch_tpu
