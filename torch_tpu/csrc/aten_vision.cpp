// ATen kernels of the tpu backend for convolution (1-D, 2-D, 3-D, plain and
// transposed), 3-D pooling, unpooling, fractional pooling, interpolation
// (nearest, nearest-exact, linear, bicubic, trilinear, antialiased), grid
// sampling, im2col / col2im and the margin, distance and CTC losses.
// Arguments are checked like PyTorch's CPU backend; every computation is a
// runtime call (runtime/src/kernels/vision.c, conv.c, loss_more.c).
#include "glue.h"

#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <vector>

namespace torch_tpu {
namespace {

void on_tpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().type() == kTpu, "Expected all tensors to be on the same device, but found ", what, " on ",
              t.device());
}

void float_input(const at::Tensor& t, const char* name) {
  on_tpu(t, "input");
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(t.scalar_type()), "\"", name, "\" not implemented for '", t.scalar_type(), "'");
}

tpurt_stream* stream_of(const at::Tensor& t) { return current_stream(t.device().index()); }

// 5-D [N, C, D, H, W] view of a tensor whose last sd dims are spatial,
// preceded by a channel dim and optionally a batch dim.
tpurt_view v5(const at::Tensor& t, int64_t sd) {
  tpurt_view v = view_of(t);
  tpurt_view r = v;
  r.ndim = 5;
  int64_t nd = t.dim();
  for (int k = 0; k < 5; k++) r.sizes[k] = 1, r.strides[k] = 0;
  for (int64_t k = 0; k < sd; k++) {
    r.sizes[4 - k] = v.sizes[nd - 1 - k];
    r.strides[4 - k] = v.strides[nd - 1 - k];
  }
  if (nd >= sd + 1) r.sizes[1] = v.sizes[nd - 1 - sd], r.strides[1] = v.strides[nd - 1 - sd];
  if (nd >= sd + 2) r.sizes[0] = v.sizes[nd - 2 - sd], r.strides[0] = v.strides[nd - 2 - sd];
  return r;
}

std::vector<int64_t> with_spatial(const at::Tensor& in, int64_t sd, c10::IntArrayRef sp) {
  std::vector<int64_t> s(in.sizes().begin(), in.sizes().end() - sd);
  s.insert(s.end(), sp.begin(), sp.end());
  return s;
}

// n ints from a list of 1 or n (empty -> dflt when given)
std::vector<int64_t> expand_arg(c10::IntArrayRef a, int64_t n, const char* what, std::optional<c10::IntArrayRef> dflt,
                                const char* op) {
  if (a.empty() && dflt) return expand_arg(*dflt, n, what, std::nullopt, op);
  TORCH_CHECK(a.size() == 1 || (int64_t)a.size() == n, op, ": ", what, " must either be a single int, or a tuple of ",
              n, " ints");
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; i++) r[i] = a.size() == 1 ? a[0] : a[i];
  return r;
}

int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, bool ceil) {
  int64_t num = in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil && (o - 1) * s >= in + pad) --o;
  return o;
}

// ------------------------------------------------------------ convolution

struct Conv3 {
  int64_t sd;
  tpurt_conv3d_params p;
};

Conv3 conv_geom(const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
                c10::IntArrayRef dilation, int64_t groups) {
  int64_t sd = input.dim() - 2;
  TORCH_CHECK(sd >= 1 && sd <= 3, "tpu convolution expects a 3-D, 4-D or 5-D input, got a ", input.dim(), "-D input");
  TORCH_CHECK(weight.dim() == input.dim(), "Expected ", input.dim(), "-dimensional weight for ", input.dim(),
              "-dimensional input, but got ", weight.dim(), "-dimensional weight of size ", weight.sizes());
  Conv3 g;
  g.sd = sd;
  auto at_ = [&](c10::IntArrayRef a, int64_t i, int64_t dflt) {
    if (a.empty()) return dflt;
    return a.size() == 1 ? a[0] : a[i];
  };
  for (int k = 0; k < 3; k++) {
    int64_t i = k - (3 - sd);
    bool dummy = i < 0;
    g.p.stride[k] = dummy ? 1 : at_(stride, i, 1);
    g.p.padding[k] = dummy ? 0 : at_(padding, i, 0);
    g.p.dilation[k] = dummy ? 1 : at_(dilation, i, 1);
  }
  g.p.groups = groups;
  return g;
}

tpurt_view cv5(const at::Tensor& t, int64_t sd) { return v5(t, sd); }

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  Conv3 g = conv_geom(input, weight, stride, padding, dilation, groups);
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), "Input type (", input.scalar_type(), ") and weight type (",
              weight.scalar_type(), ") should be the same");
  on_tpu(weight, "weight");
  int64_t sd = g.sd;
  std::vector<int64_t> out_sz{input.size(0), 0};
  if (!transposed) {
    out_sz[1] = weight.size(0);
    for (int64_t k = 0; k < sd; k++) {
      int64_t kk = 3 - sd + k;
      out_sz.push_back((input.size(2 + k) + 2 * g.p.padding[kk] - g.p.dilation[kk] * (weight.size(2 + k) - 1) - 1) /
                           g.p.stride[kk] + 1);
    }
  } else {
    out_sz[1] = weight.size(1) * groups;
    for (int64_t k = 0; k < sd; k++) {
      int64_t kk = 3 - sd + k;
      int64_t op = output_padding.empty() ? 0 : (output_padding.size() == 1 ? output_padding[0] : output_padding[k]);
      out_sz.push_back((input.size(2 + k) - 1) * g.p.stride[kk] - 2 * g.p.padding[kk] +
                       g.p.dilation[kk] * (weight.size(2 + k) - 1) + op + 1);
    }
  }
  at::Tensor out = at::empty(out_sz, input.options());
  c10::DeviceGuard guard(input.device());
  tpurt_view y = cv5(out, sd), x = cv5(input, sd), w = cv5(weight, sd);
  tpurt_view bv;
  const tpurt_view* bp = nullptr;
  if (bias && bias->defined()) {
    on_tpu(*bias, "bias");
    TORCH_CHECK(bias->scalar_type() == input.scalar_type(), "Input type (", input.scalar_type(), ") and bias type (",
                bias->scalar_type(), ") should be the same");
    bv = view_of(*bias);
    bp = &bv;
  }
  auto* s = stream_of(input);
  if (!transposed)
    check(tpurt_conv3d(s, &y, &x, &w, bp, &g.p, effective_matmul_precision()), "convolution");
  else
    check(tpurt_conv3d_backward_input(s, &y, &x, &w, bp, &g.p, effective_matmul_precision()), "conv_transpose");
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  Conv3 g = conv_geom(input, weight, stride, padding, dilation, groups);
  int64_t sd = g.sd;
  c10::DeviceGuard guard(input.device());
  auto* s = stream_of(input);
  at::Tensor gi, gw, gb;
  tpurt_view go = cv5(grad_output, sd), x = cv5(input, sd), w = cv5(weight, sd);
  tpurt_precision prec = effective_matmul_precision();
  if (output_mask[0]) {
    gi = at::empty(input.sizes(), input.options());
    tpurt_view v = cv5(gi, sd);
    if (!transposed)
      check(tpurt_conv3d_backward_input(s, &v, &go, &w, nullptr, &g.p, prec), "convolution_backward");
    else
      check(tpurt_conv3d(s, &v, &go, &w, nullptr, &g.p, prec), "convolution_backward");
  }
  tpurt_view bv;
  if (output_mask[2]) {
    gb = at::empty({grad_output.size(1)}, grad_output.options());
    bv = view_of(gb);
  }
  if (output_mask[1]) {
    gw = at::empty(weight.sizes(), weight.options());
    tpurt_view v = cv5(gw, sd);
    if (!transposed) {
      check(tpurt_conv3d_backward_weight(s, &v, output_mask[2] ? &bv : nullptr, &go, &x, &g.p, prec),
            "convolution_backward");
      return {gi, gw, gb};
    }
    check(tpurt_conv3d_backward_weight(s, &v, nullptr, &x, &go, &g.p, prec), "convolution_backward");
  }
  if (output_mask[2])
    check(tpurt_conv3d_backward_weight(s, nullptr, &bv, &go, nullptr, nullptr, prec), "convolution_backward");
  return {gi, gw, gb};
}

// ------------------------------------------------------------- 3-D pooling

struct Pool3 {
  tpurt_pool3d_params p;
  int64_t o[3];
};

Pool3 pool3_geom(const at::Tensor& in, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                 c10::IntArrayRef dilation, bool ceil, const char* op) {
  auto k = expand_arg(kernel, 3, "kernel_size", std::nullopt, op);
  auto s = expand_arg(stride, 3, "stride", kernel, op);
  auto p = expand_arg(padding, 3, "padding", std::nullopt, op);
  std::vector<int64_t> one{1};
  auto d = expand_arg(dilation, 3, "dilation", c10::IntArrayRef(one), op);
  TORCH_CHECK(in.dim() == 4 || in.dim() == 5, "non-empty 4D or 5D (batch mode) tensor expected for input");
  for (int i = 0; i < 3; i++) {
    TORCH_CHECK(k[i] > 0, "kernel size should be greater than zero, but got kT: ", k[0], " kH: ", k[1], " kW: ", k[2]);
    TORCH_CHECK(s[i] > 0, "stride should be greater than zero, but got dT: ", s[0], " dH: ", s[1], " dW: ", s[2]);
    TORCH_CHECK(d[i] > 0, "dilation should be greater than zero, but got dilationT: ", d[0], " dilationH: ", d[1],
                " dilationW: ", d[2]);
    TORCH_CHECK(p[i] <= k[i] / 2, "pad should be smaller than or equal to half of kernel size, but got kT: ", k[0],
                " kH: ", k[1], " kW: ", k[2], " padT: ", p[0], " padH: ", p[1], " padW: ", p[2]);
  }
  for (int64_t i = 1; i < in.dim(); i++)
    TORCH_CHECK(in.size(i) > 0, op, ": Expected input's non-batch dimensions to have positive length, but input has "
                "a shape of ", in.sizes(), " and non-batch dimension ", in.size(i), " has length zero!");
  Pool3 g;
  for (int i = 0; i < 3; i++) {
    g.o[i] = pool_out(in.size(in.dim() - 3 + i), k[i], p[i], s[i], d[i], ceil);
    g.p.kernel[i] = k[i], g.p.stride[i] = s[i], g.p.padding[i] = p[i], g.p.dilation[i] = d[i];
  }
  TORCH_CHECK(g.o[0] >= 1 && g.o[1] >= 1 && g.o[2] >= 1, "Given input size: (", in.size(-4), "x", in.size(-3), "x",
              in.size(-2), "x", in.size(-1), "). Calculated output size: (", in.size(-4), "x", g.o[0], "x", g.o[1],
              "x", g.o[2], "). Output size is too small");
  g.p.count_include_pad = 1;
  g.p.divisor_override = 0;
  return g;
}

at::Tensor& avg_pool3d_out(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, bool ceil, bool cip, std::optional<int64_t> div, at::Tensor& out) {
  float_input(self, "avg_pool3d");
  Pool3 g = pool3_geom(self, kernel, stride, padding, {}, ceil, "avg_pool3d");
  TORCH_CHECK(!div || *div != 0, "divisor must be not zero");
  g.p.count_include_pad = cip;
  g.p.divisor_override = div ? *div : 0;
  at::native::resize_output(out, with_spatial(self, 3, g.o));
  c10::DeviceGuard guard(self.device());
  tpurt_view o = v5(out, 3), x = v5(self, 3);
  check(tpurt_avg_pool3d(stream_of(self), &o, &x, &g.p), "avg_pool3d");
  return out;
}
at::Tensor& avg_pool3d_backward_out(const at::Tensor& grad_out, const at::Tensor& self, c10::IntArrayRef kernel,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil, bool cip,
                                    std::optional<int64_t> div, at::Tensor& grad_in) {
  Pool3 g = pool3_geom(self, kernel, stride, padding, {}, ceil, "avg_pool3d_backward");
  TORCH_CHECK(!div || *div != 0, "divisor must be not zero");
  g.p.count_include_pad = cip;
  g.p.divisor_override = div ? *div : 0;
  TORCH_CHECK(grad_out.sizes() == c10::IntArrayRef(with_spatial(self, 3, g.o)),
              "avg_pool3d_backward: grad_output has the wrong shape ", grad_out.sizes());
  at::native::resize_output(grad_in, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view gi = v5(grad_in, 3), go = v5(grad_out, 3);
  check(tpurt_avg_pool3d_backward(stream_of(self), &gi, &go, &g.p), "avg_pool3d_backward");
  return grad_in;
}

std::tuple<at::Tensor&, at::Tensor&> max_pool3d_with_indices_out(const at::Tensor& self, c10::IntArrayRef kernel,
                                                                 c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                                 c10::IntArrayRef dilation, bool ceil,
                                                                 at::Tensor& out, at::Tensor& idx) {
  float_input(self, "max_pool3d");
  Pool3 g = pool3_geom(self, kernel, stride, padding, dilation, ceil, "max_pool3d");
  auto sz = with_spatial(self, 3, g.o);
  at::native::resize_output(out, sz);
  at::native::resize_output(idx, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view o = v5(out, 3), i = v5(idx, 3), x = v5(self, 3);
  check(tpurt_max_pool3d(stream_of(self), &o, &i, &x, &g.p), "max_pool3d");
  return {out, idx};
}
std::tuple<at::Tensor, at::Tensor> max_pool3d_with_indices(const at::Tensor& self, c10::IntArrayRef kernel,
                                                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                           c10::IntArrayRef dilation, bool ceil) {
  at::Tensor out = at::empty({0}, self.options()), idx = at::empty({0}, self.options().dtype(at::kLong));
  max_pool3d_with_indices_out(self, kernel, stride, padding, dilation, ceil, out, idx);
  return {out, idx};
}

// grad_in = 0; grad_in[plane][indices] += grad_out (sd spatial dims)
at::Tensor& scatter_back(const at::Tensor& grad_out, const at::Tensor& self, const at::Tensor& indices, int64_t sd,
                         at::Tensor& grad_in, const char* name) {
  TORCH_CHECK(grad_out.sizes() == indices.sizes(), name, ": grad_output and indices shapes differ (",
              grad_out.sizes(), " vs ", indices.sizes(), ")");
  at::native::resize_output(grad_in, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view gi = v5(grad_in, sd), go = v5(grad_out, sd), ix = v5(indices, sd);
  check(tpurt_scatter_planes(stream_of(self), &gi, &go, &ix, 1), name);
  return grad_in;
}
at::Tensor& max_pool3d_with_indices_backward_out(const at::Tensor& grad_out, const at::Tensor& self,
                                                 c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef,
                                                 c10::IntArrayRef, bool, const at::Tensor& indices,
                                                 at::Tensor& grad_in) {
  return scatter_back(grad_out, self, indices, 3, grad_in, "max_pool3d_backward");
}
at::Tensor max_pool3d_with_indices_backward(const at::Tensor& grad_out, const at::Tensor& self,
                                            c10::IntArrayRef k, c10::IntArrayRef s, c10::IntArrayRef p,
                                            c10::IntArrayRef d, bool c, const at::Tensor& indices) {
  at::Tensor gi = at::empty(self.sizes(), grad_out.options());
  return max_pool3d_with_indices_backward_out(grad_out, self, k, s, p, d, c, indices, gi);
}

std::vector<int64_t> adaptive3(const at::Tensor& self, c10::IntArrayRef os, const char* name) {
  TORCH_CHECK(os.size() == 3, name, ": internal error: output_size.size() must be 3");
  TORCH_CHECK(self.dim() == 4 || self.dim() == 5, name, "(): Expected 4D or 5D tensor, but got ", self.sizes());
  for (int64_t i = 1; i < self.dim(); i++)
    TORCH_CHECK(self.size(i) > 0, name, "(): Expected input to have non-zero size for non-batch dimensions, but input "
                "has sizes ", self.sizes(), " with dimension ", i, " being empty");
  for (auto v : os) TORCH_CHECK(v >= 0, name, ": elements of output_size must be greater than or equal to 0");
  return std::vector<int64_t>(os.begin(), os.end());
}

at::Tensor& adaptive_avg_pool3d_out_impl(const at::Tensor& self, c10::IntArrayRef output_size, at::Tensor& out) {
  float_input(self, "adaptive_avg_pool3d");
  auto o = adaptive3(self, output_size, "adaptive_avg_pool3d");
  at::native::resize_output(out, with_spatial(self, 3, o));
  c10::DeviceGuard guard(self.device());
  tpurt_view ov = v5(out, 3), x = v5(self, 3);
  check(tpurt_adaptive_pool3d(stream_of(self), &ov, nullptr, &x, 0), "adaptive_avg_pool3d");
  return out;
}
at::Tensor adaptive_avg_pool3d(const at::Tensor& self, c10::SymIntArrayRef output_size) {
  at::Tensor out = at::empty({0}, self.options());
  return adaptive_avg_pool3d_out_impl(self, C10_AS_INTARRAYREF_SLOW(output_size), out);
}
at::Tensor& adaptive_avg_pool3d_out(const at::Tensor& self, c10::SymIntArrayRef output_size, at::Tensor& out) {
  return adaptive_avg_pool3d_out_impl(self, C10_AS_INTARRAYREF_SLOW(output_size), out);
}
at::Tensor& adaptive_avg_pool3d_backward_out(const at::Tensor& grad_out, const at::Tensor& self, at::Tensor& gi) {
  at::native::resize_output(gi, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view v = v5(gi, 3), go = v5(grad_out, 3);
  check(tpurt_adaptive_avg_pool3d_backward(stream_of(self), &v, &go), "adaptive_avg_pool3d_backward");
  return gi;
}
at::Tensor adaptive_avg_pool3d_backward(const at::Tensor& grad_out, const at::Tensor& self) {
  at::Tensor gi = at::empty(self.sizes(), grad_out.options());
  return adaptive_avg_pool3d_backward_out(grad_out, self, gi);
}
std::tuple<at::Tensor&, at::Tensor&> adaptive_max_pool3d_out(const at::Tensor& self, c10::IntArrayRef output_size,
                                                             at::Tensor& out, at::Tensor& idx) {
  float_input(self, "adaptive_max_pool3d");
  auto o = adaptive3(self, output_size, "adaptive_max_pool3d");
  auto sz = with_spatial(self, 3, o);
  at::native::resize_output(out, sz);
  at::native::resize_output(idx, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view ov = v5(out, 3), iv = v5(idx, 3), x = v5(self, 3);
  check(tpurt_adaptive_pool3d(stream_of(self), &ov, &iv, &x, 1), "adaptive_max_pool3d");
  return {out, idx};
}
at::Tensor& adaptive_max_pool3d_backward_out(const at::Tensor& grad_out, const at::Tensor& self,
                                             const at::Tensor& indices, at::Tensor& gi) {
  return scatter_back(grad_out, self, indices, 3, gi, "adaptive_max_pool3d_backward");
}

// ------------------------------------------------------------- unpooling

at::Tensor& max_unpool_impl(const at::Tensor& self, const at::Tensor& indices, c10::IntArrayRef output_size,
                            int64_t sd, at::Tensor& out, const char* name) {
  float_input(self, name);
  on_tpu(indices, "indices");
  TORCH_CHECK(indices.scalar_type() == at::kLong, "elements in indices should be type int64 but got: ",
              indices.scalar_type());
  TORCH_CHECK((int64_t)output_size.size() == sd, "There should be exactly ", sd,
              " elements (depth, height, width) in output_size, but got ", output_size.size(), " elements.");
  TORCH_CHECK(self.dim() == sd + 1 || self.dim() == sd + 2, name, ": Input to max_unpooling", sd,
              "d should be a ", sd + 1, "d or ", sd + 2, "d Tensor, but got a tensor with ", self.dim(),
              " dimensions.");
  TORCH_CHECK(self.sizes() == indices.sizes(), "Expected shape of indices to be same as that of the input tensor (",
              self.sizes(), ") but got indices tensor with shape: ", indices.sizes());
  for (int64_t i = 1; i < self.dim(); i++)
    TORCH_CHECK(self.size(i) > 0, name, "(): Expected input to have non-zero size for non-batch dimensions, but got ",
                self.sizes(), " with dimension ", i, " being empty.");
  at::native::resize_output(out, with_spatial(self, sd, output_size));
  c10::DeviceGuard guard(self.device());
  tpurt_view o = v5(out, sd), x = v5(self, sd), ix = v5(indices, sd);
  check(tpurt_scatter_planes(stream_of(self), &o, &x, &ix, 0), name);
  return out;
}
at::Tensor& max_unpool2d_out(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef os,
                             at::Tensor& out) {
  return max_unpool_impl(self, indices, C10_AS_INTARRAYREF_SLOW(os), 2, out, "max_unpool2d");
}
at::Tensor max_unpool2d(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef os) {
  at::Tensor out = at::empty({0}, self.options());
  return max_unpool2d_out(self, indices, os, out);
}
at::Tensor& max_unpool3d_out(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef os,
                             c10::IntArrayRef stride, c10::IntArrayRef padding, at::Tensor& out) {
  TORCH_CHECK(stride.size() == 3, "There should be exactly three elements (depth, height, width) in stride, but got: ",
              stride.size(), " elements.");
  TORCH_CHECK(padding.size() == 3, "There should be exactly three elements (depth, height, width) in padding, but "
              "got: ", padding.size(), " elements.");
  for (int i = 0; i < 3; i++)
    TORCH_CHECK(stride[i] > 0, "strides should be greater than zero, but got stride: ", stride);
  return max_unpool_impl(self, indices, C10_AS_INTARRAYREF_SLOW(os), 3, out, "max_unpool3d");
}
at::Tensor max_unpool3d(const at::Tensor& self, const at::Tensor& indices, c10::SymIntArrayRef os,
                        c10::IntArrayRef stride, c10::IntArrayRef padding) {
  at::Tensor out = at::empty({0}, self.options());
  return max_unpool3d_out(self, indices, os, stride, padding, out);
}

// ---------------------------------------------------- fractional pooling

std::tuple<at::Tensor&, at::Tensor&> fractional_impl(const at::Tensor& self, c10::IntArrayRef kernel,
                                                     c10::IntArrayRef output_size, const at::Tensor& samples,
                                                     int64_t sd, at::Tensor& out, at::Tensor& idx, const char* name) {
  float_input(self, name);
  on_tpu(samples, "random_samples");
  TORCH_CHECK((int64_t)kernel.size() == sd, name, ": kernel_size must either be a single Int or tuple of ", sd,
              " Ints");
  TORCH_CHECK((int64_t)output_size.size() == sd, name, ": output_size must either be a single Int or tuple of ", sd,
              " Ints");
  TORCH_CHECK(self.dim() == sd + 1 || self.dim() == sd + 2, name, "(): Expected ", sd + 1, "D or ", sd + 2,
              "D tensor, but got: ", self.sizes());
  for (int64_t i = 1; i < self.dim(); i++)
    TORCH_CHECK(self.size(i) > 0, name, "(): Expected input to have non-zero size for non-batch dimensions, but got ",
                self.sizes(), " with dimension ", i, " being empty.");
  int64_t N = self.dim() == sd + 2 ? self.size(0) : 1, C = self.size(-sd - 1);
  TORCH_CHECK(samples.dim() == 3 && samples.size(0) >= N && samples.size(1) == C && samples.size(2) == sd, name,
              "(): random_samples must be [N, C, ", sd, "], got ", samples.sizes());
  TORCH_CHECK(samples.scalar_type() == self.scalar_type(), name, "(): expected random_samples of the input's dtype");
  for (int64_t i = 0; i < sd; i++)
    TORCH_CHECK(output_size[i] + kernel[i] - 1 <= self.size(-sd + i), name, "(): pool size ", kernel[i],
                " too large relative to input size ", self.size(-sd + i), " and output size ", output_size[i]);
  auto sz = with_spatial(self, sd, output_size);
  at::native::resize_output(out, sz);
  at::native::resize_output(idx, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view o = v5(out, sd), iv = v5(idx, sd), x = v5(self, sd), sv = view_of(samples);
  sv.sizes[0] = N;
  int64_t k3[3] = {1, 1, 1};
  int map[3] = {-1, -1, -1};
  for (int64_t i = 0; i < sd; i++) k3[3 - sd + i] = kernel[i];
  if (sd == 2) map[1] = 1, map[2] = 0;  // samples: (w, h)
  else map[0] = 0, map[1] = 1, map[2] = 2;
  check(tpurt_fractional_max_pool3d(stream_of(self), &o, &iv, &x, &sv, k3, map), name);
  return {out, idx};
}
std::tuple<at::Tensor&, at::Tensor&> fractional2d_out(const at::Tensor& self, c10::IntArrayRef k,
                                                      c10::IntArrayRef os, const at::Tensor& rs, at::Tensor& out,
                                                      at::Tensor& idx) {
  return fractional_impl(self, k, os, rs, 2, out, idx, "fractional_max_pool2d");
}
std::tuple<at::Tensor&, at::Tensor&> fractional3d_out(const at::Tensor& self, c10::IntArrayRef k,
                                                      c10::IntArrayRef os, const at::Tensor& rs, at::Tensor& out,
                                                      at::Tensor& idx) {
  return fractional_impl(self, k, os, rs, 3, out, idx, "fractional_max_pool3d");
}
at::Tensor& fractional2d_bwd_out(const at::Tensor& go, const at::Tensor& self, c10::IntArrayRef, c10::IntArrayRef,
                                 const at::Tensor& indices, at::Tensor& gi) {
  return scatter_back(go, self, indices, 2, gi, "fractional_max_pool2d_backward");
}
at::Tensor& fractional3d_bwd_out(const at::Tensor& go, const at::Tensor& self, c10::IntArrayRef, c10::IntArrayRef,
                                 const at::Tensor& indices, at::Tensor& gi) {
  return scatter_back(go, self, indices, 3, gi, "fractional_max_pool3d_backward");
}
at::Tensor fractional3d_bwd(const at::Tensor& go, const at::Tensor& self, c10::IntArrayRef k, c10::IntArrayRef os,
                            const at::Tensor& indices) {
  at::Tensor gi = at::empty(self.sizes(), go.options());
  return fractional3d_bwd_out(go, self, k, os, indices, gi);
}

// ---------------------------------------------------------- interpolation

void fill_scales(double sc[3], std::initializer_list<std::optional<double>> s) {
  sc[0] = sc[1] = sc[2] = -1.0;
  int64_t n = (int64_t)s.size(), i = 0;
  for (auto& v : s) sc[3 - n + i++] = v ? *v : -1.0;
}

at::Tensor& interp_out(const at::Tensor& self, c10::SymIntArrayRef os_, tpurt_interp_mode mode, bool align,
                       std::initializer_list<std::optional<double>> scales, at::Tensor& out, const char* name) {
  c10::IntArrayRef os = C10_AS_INTARRAYREF_SLOW(os_);
  int64_t sd = (int64_t)os.size();
  float_input(self, name);
  TORCH_CHECK(self.dim() == sd + 2, "Expected ", sd + 2, "D input (got ", self.dim(), "D) for ", name);
  bool ok = true;
  for (int64_t i = 0; i < sd; i++) ok = ok && self.size(2 + i) > 0 && os[i] > 0;
  TORCH_CHECK(ok, "Input and output sizes should be greater than 0, but got input ", self.sizes().slice(2),
              " output ", os);
  at::native::resize_output(out, with_spatial(self, sd, os));
  c10::DeviceGuard guard(self.device());
  double sc[3];
  fill_scales(sc, scales);
  tpurt_view o = v5(out, sd), x = v5(self, sd);
  check(tpurt_interpolate(stream_of(self), &o, &x, mode, align, sc), name);
  return out;
}
at::Tensor& interp_bwd(const at::Tensor& go, c10::SymIntArrayRef os_, c10::SymIntArrayRef is_, tpurt_interp_mode mode,
                       bool align, std::initializer_list<std::optional<double>> scales, at::Tensor& gi,
                       const char* name) {
  c10::IntArrayRef os = C10_AS_INTARRAYREF_SLOW(os_), is = C10_AS_INTARRAYREF_SLOW(is_);
  int64_t sd = (int64_t)os.size();
  TORCH_CHECK((int64_t)is.size() == sd + 2, "It is expected input_size equals to ", sd + 2, ", but got size ",
              is.size());
  TORCH_CHECK(go.dim() == sd + 2, "Expected grad_output to be a tensor of dimension ", sd + 2, " but got: dimension ",
              go.dim());
  for (int64_t i = 0; i < sd; i++)
    TORCH_CHECK(go.size(2 + i) == os[i], "Expected grad_output to have the output size ", os, ", but got ",
                go.sizes());
  at::native::resize_output(gi, is);
  c10::DeviceGuard guard(go.device());
  double sc[3];
  fill_scales(sc, scales);
  tpurt_view g = v5(gi, sd), o = v5(go, sd);
  check(tpurt_interpolate_backward(stream_of(go), &g, &o, mode, align, sc), name);
  return gi;
}

using OD = std::optional<double>;
#define NEAREST(NAME, MODE)                                                                                        \
  at::Tensor& NAME##1d_out(const at::Tensor& s, c10::SymIntArrayRef os, OD a, at::Tensor& o) {                       \
    return interp_out(s, os, MODE, false, {a}, o, #NAME "1d");                                                     \
  }                                                                                                                \
  [[maybe_unused]] /* 2-d nearest: aten_matmul.cpp */                                                              \
  at::Tensor& NAME##2d_out(const at::Tensor& s, c10::SymIntArrayRef os, OD a, OD b, at::Tensor& o) {                 \
    return interp_out(s, os, MODE, false, {a, b}, o, #NAME "2d");                                                  \
  }                                                                                                                \
  at::Tensor& NAME##3d_out(const at::Tensor& s, c10::SymIntArrayRef os, OD a, OD b, OD c, at::Tensor& o) {           \
    return interp_out(s, os, MODE, false, {a, b, c}, o, #NAME "3d");                                               \
  }                                                                                                                \
  at::Tensor& NAME##1d_bwd(const at::Tensor& g, c10::SymIntArrayRef os, c10::SymIntArrayRef is, OD a, at::Tensor& o) {  \
    return interp_bwd(g, os, is, MODE, false, {a}, o, #NAME "1d_backward");                                        \
  }                                                                                                                \
  [[maybe_unused]]                                                                                                 \
  at::Tensor& NAME##2d_bwd(const at::Tensor& g, c10::SymIntArrayRef os, c10::SymIntArrayRef is, OD a, OD b,             \
                           at::Tensor& o) {                                                                        \
    return interp_bwd(g, os, is, MODE, false, {a, b}, o, #NAME "2d_backward");                                     \
  }                                                                                                                \
  at::Tensor& NAME##3d_bwd(const at::Tensor& g, c10::SymIntArrayRef os, c10::SymIntArrayRef is, OD a, OD b, OD c,       \
                           at::Tensor& o) {                                                                        \
    return interp_bwd(g, os, is, MODE, false, {a, b, c}, o, #NAME "3d_backward");                                  \
  }
NEAREST(upsample_nearest, TPURT_INTERP_NEAREST)
NEAREST(upsample_nearest_exact, TPURT_INTERP_NEAREST_EXACT)
#undef NEAREST

at::Tensor& linear1d_out(const at::Tensor& s, c10::SymIntArrayRef os, bool al, OD a, at::Tensor& o) {
  return interp_out(s, os, TPURT_INTERP_LINEAR, al, {a}, o, "upsample_linear1d");
}
at::Tensor& linear1d_bwd(const at::Tensor& g, c10::SymIntArrayRef os, c10::SymIntArrayRef is, bool al, OD a,
                         at::Tensor& o) {
  return interp_bwd(g, os, is, TPURT_INTERP_LINEAR, al, {a}, o, "upsample_linear1d_backward");
}
at::Tensor& trilinear_out(const at::Tensor& s, c10::SymIntArrayRef os, bool al, OD a, OD b, OD c, at::Tensor& o) {
  return interp_out(s, os, TPURT_INTERP_LINEAR, al, {a, b, c}, o, "upsample_trilinear3d");
}
at::Tensor& trilinear_bwd(const at::Tensor& g, c10::SymIntArrayRef os, c10::SymIntArrayRef is, bool al, OD a, OD b, OD c,
                          at::Tensor& o) {
  return interp_bwd(g, os, is, TPURT_INTERP_LINEAR, al, {a, b, c}, o, "upsample_trilinear3d_backward");
}
#define TWO_D(NAME, MODE)                                                                                          \
  at::Tensor& NAME##_out(const at::Tensor& s, c10::SymIntArrayRef os, bool al, OD a, OD b, at::Tensor& o) {          \
    return interp_out(s, os, MODE, al, {a, b}, o, #NAME);                                                          \
  }                                                                                                                \
  at::Tensor& NAME##_bwd(const at::Tensor& g, c10::SymIntArrayRef os, c10::SymIntArrayRef is, bool al, OD a, OD b,      \
                         at::Tensor& o) {                                                                          \
    return interp_bwd(g, os, is, MODE, al, {a, b}, o, #NAME "_backward");                                          \
  }
TWO_D(bicubic2d, TPURT_INTERP_CUBIC)
TWO_D(bilinear2d_aa, TPURT_INTERP_LINEAR_AA)
TWO_D(bicubic2d_aa, TPURT_INTERP_CUBIC_AA)
#undef TWO_D

// ----------------------------------------------------------- grid sampling

at::Tensor grid_sampler_impl(const at::Tensor& input, const at::Tensor& grid, int64_t interp, int64_t padding,
                             bool align, int64_t sd) {
  float_input(input, sd == 2 ? "grid_sampler_2d" : "grid_sampler_3d");
  on_tpu(grid, "grid");
  TORCH_CHECK(input.scalar_type() == grid.scalar_type(), "grid_sampler(): expected input and grid to have same dtype, "
              "but input has ", input.scalar_type(), " and grid has ", grid.scalar_type());
  TORCH_CHECK(input.dim() == sd + 2 && grid.dim() == sd + 2, "grid_sampler(): expected ", sd + 2,
              "D input and grid with same number of dimensions, but got input with sizes ", input.sizes(),
              " and grid with sizes ", grid.sizes());
  TORCH_CHECK(input.size(0) == grid.size(0), "grid_sampler(): expected grid and input to have same batch size, but got "
              "input with sizes ", input.sizes(), " and grid with sizes ", grid.sizes());
  TORCH_CHECK(grid.size(-1) == sd, "grid_sampler(): expected grid to have size ", sd, " in last dimension, but got "
              "grid with sizes ", grid.sizes());
  for (int64_t i = 2; i < input.dim(); i++)
    TORCH_CHECK(input.size(i) > 0, "grid_sampler(): expected input to have non-empty spatial dimensions, but input has "
                "sizes ", input.sizes(), " with dimension ", i, " being empty");
  TORCH_CHECK(!(interp == 2 && sd == 3), "grid_sampler(): bicubic interpolation only supports 4D input");
  std::vector<int64_t> osz{input.size(0), input.size(1)};
  for (int64_t i = 1; i <= sd; i++) osz.push_back(grid.size(i));
  at::Tensor out = at::empty(osz, input.options());
  c10::DeviceGuard guard(input.device());
  tpurt_view o = v5(out, sd), x = v5(input, sd), g = view_of(grid);
  if (sd == 2) {  // [N, Ho, Wo, 2] -> [N, 1, Ho, Wo, 2]
    for (int k = 4; k >= 2; k--) g.sizes[k] = g.sizes[k - 1], g.strides[k] = g.strides[k - 1];
    g.sizes[1] = 1, g.strides[1] = 0, g.ndim = 5;
  }
  check(tpurt_grid_sample(stream_of(input), &o, &x, &g, (int)interp, (int)padding, align), "grid_sampler");
  return out;
}
at::Tensor grid_sampler_2d(const at::Tensor& input, const at::Tensor& grid, int64_t i, int64_t p, bool a) {
  return grid_sampler_impl(input, grid, i, p, a, 2);
}
at::Tensor grid_sampler_3d(const at::Tensor& input, const at::Tensor& grid, int64_t i, int64_t p, bool a) {
  return grid_sampler_impl(input, grid, i, p, a, 3);
}
std::tuple<at::Tensor, at::Tensor> grid_sampler_bwd(const at::Tensor& go, const at::Tensor& input,
                                                    const at::Tensor& grid, int64_t interp, int64_t padding,
                                                    bool align, std::array<bool, 2> mask, int64_t sd) {
  at::Tensor gi, gg;
  c10::DeviceGuard guard(input.device());
  tpurt_view giv, ggv, gov = v5(go, sd), x = v5(input, sd), g = view_of(grid);
  auto to5g = [&](tpurt_view& v) {
    if (sd != 2) return;
    for (int k = 4; k >= 2; k--) v.sizes[k] = v.sizes[k - 1], v.strides[k] = v.strides[k - 1];
    v.sizes[1] = 1, v.strides[1] = 0, v.ndim = 5;
  };
  to5g(g);
  if (mask[0]) {
    gi = at::empty(input.sizes(), input.options());
    giv = v5(gi, sd);
  }
  gg = at::empty(grid.sizes(), grid.options());
  ggv = view_of(gg);
  to5g(ggv);
  check(tpurt_grid_sample_backward(stream_of(input), mask[0] ? &giv : nullptr, &ggv, &gov, &x, &g, (int)interp,
                                   (int)padding, align),
        "grid_sampler_backward");
  return {gi, gg};
}
std::tuple<at::Tensor, at::Tensor> grid_sampler_2d_backward(const at::Tensor& go, const at::Tensor& input,
                                                            const at::Tensor& grid, int64_t i, int64_t p, bool a,
                                                            std::array<bool, 2> m) {
  return grid_sampler_bwd(go, input, grid, i, p, a, m, 2);
}
std::tuple<at::Tensor, at::Tensor> grid_sampler_3d_backward(const at::Tensor& go, const at::Tensor& input,
                                                            const at::Tensor& grid, int64_t i, int64_t p, bool a,
                                                            std::array<bool, 2> m) {
  return grid_sampler_bwd(go, input, grid, i, p, a, m, 3);
}

// ---------------------------------------------------------- im2col/col2im

struct Fold {
  int64_t k[2];
  tpurt_conv_params p;
};
Fold fold_args(c10::IntArrayRef kernel, c10::IntArrayRef dilation, c10::IntArrayRef padding, c10::IntArrayRef stride,
               const char* op) {
  TORCH_CHECK(kernel.size() == 2, "It is expected kernel_size equals to 2, but got size ", kernel.size());
  TORCH_CHECK(dilation.size() == 2, "It is expected dilation equals to 2, but got size ", dilation.size());
  TORCH_CHECK(padding.size() == 2, "It is expected padding equals to 2, but got size ", padding.size());
  TORCH_CHECK(stride.size() == 2, "It is expected stride equals to 2, but got size ", stride.size());
  TORCH_CHECK(kernel[0] > 0 && kernel[1] > 0, "kernel size should be greater than zero, but got kernel_height: ",
              kernel[0], " kernel_width: ", kernel[1]);
  TORCH_CHECK(dilation[0] > 0 && dilation[1] > 0, "dilation should be greater than zero, but got dilation_height: ",
              dilation[0], " dilation_width: ", dilation[1]);
  TORCH_CHECK(padding[0] >= 0 && padding[1] >= 0, "padding should be non-negative, but got pad_height: ", padding[0],
              " pad_width: ", padding[1]);
  TORCH_CHECK(stride[0] > 0 && stride[1] > 0, "stride should be greater than zero, but got stride_height: ",
              stride[0], " stride_width: ", stride[1]);
  Fold f;
  f.k[0] = kernel[0], f.k[1] = kernel[1];
  f.p = tpurt_conv_params{{stride[0], stride[1]}, {padding[0], padding[1]}, {dilation[0], dilation[1]}, 1};
  (void)op;
  return f;
}
int64_t fold_blocks(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d) {
  return (in + 2 * pad - (d * (k - 1) + 1)) / s + 1;
}

at::Tensor& im2col_out(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef dilation,
                       c10::IntArrayRef padding, c10::IntArrayRef stride, at::Tensor& out) {
  float_input(self, "im2col");
  Fold f = fold_args(kernel, dilation, padding, stride, "im2col");
  TORCH_CHECK((self.dim() == 3 || self.dim() == 4) && self.size(-1) > 0 && self.size(-2) > 0 && self.size(-3) > 0,
              "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for "
              "input, but got: ", self.sizes());
  int64_t H = self.size(-2), W = self.size(-1), C = self.size(-3);
  int64_t oh = fold_blocks(H, f.k[0], f.p.padding[0], f.p.stride[0], f.p.dilation[0]);
  int64_t ow = fold_blocks(W, f.k[1], f.p.padding[1], f.p.stride[1], f.p.dilation[1]);
  TORCH_CHECK(oh >= 1 && ow >= 1, "Given input with spatial size (", H, ", ", W, "), kernel_size=(", f.k[0], ", ",
              f.k[1], "), dilation=(", f.p.dilation[0], ", ", f.p.dilation[1], "), padding=(", f.p.padding[0], ", ",
              f.p.padding[1], "), calculated shape of the array of sliding blocks as (", oh, ", ", ow,
              "), but its components must be at least one.");
  bool batched = self.dim() == 4;
  std::vector<int64_t> sz{C * f.k[0] * f.k[1], oh * ow};
  if (batched) sz.insert(sz.begin(), self.size(0));
  at::native::resize_output(out, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view img = v5(self, 2), col = view_of(out);
  // img [N, C, 1, H, W] -> 4-D [N, C, H, W]
  img.ndim = 4;
  img.sizes[2] = img.sizes[3], img.strides[2] = img.strides[3];
  img.sizes[3] = img.sizes[4], img.strides[3] = img.strides[4];
  if (!batched) {
    col.ndim = 3;
    col.sizes[2] = col.sizes[1], col.strides[2] = col.strides[1];
    col.sizes[1] = col.sizes[0], col.strides[1] = col.strides[0];
    col.sizes[0] = 1, col.strides[0] = 0;
  }
  check(tpurt_im2col(stream_of(self), &col, &img, f.k, &f.p, 0), "im2col");
  return out;
}
at::Tensor im2col(const at::Tensor& self, c10::IntArrayRef k, c10::IntArrayRef d, c10::IntArrayRef p,
                  c10::IntArrayRef s) {
  at::Tensor out = at::empty({0}, self.options());
  return im2col_out(self, k, d, p, s, out);
}
at::Tensor& col2im_out(const at::Tensor& self, c10::SymIntArrayRef output_size_, c10::IntArrayRef kernel,
                       c10::IntArrayRef dilation, c10::IntArrayRef padding, c10::IntArrayRef stride, at::Tensor& out) {
  auto output_size = C10_AS_INTARRAYREF_SLOW(output_size_);
  float_input(self, "col2im");
  Fold f = fold_args(kernel, dilation, padding, stride, "col2im");
  TORCH_CHECK(output_size.size() == 2, "It is expected output_size equals to 2, but got size ", output_size.size());
  TORCH_CHECK((self.dim() == 2 || self.dim() == 3) && self.size(-1) > 0 && self.size(-2) > 0,
              "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for "
              "input, but got: ", self.sizes());
  int64_t kk = f.k[0] * f.k[1];
  TORCH_CHECK(self.size(-2) % kk == 0, "Expected size of input's dimension 1 to be divisible by the product of "
              "kernel_size, but got input.size(1)=", self.size(-2), " and kernel_size=(", f.k[0], ", ", f.k[1], ")");
  int64_t oh = fold_blocks(output_size[0], f.k[0], f.p.padding[0], f.p.stride[0], f.p.dilation[0]);
  int64_t ow = fold_blocks(output_size[1], f.k[1], f.p.padding[1], f.p.stride[1], f.p.dilation[1]);
  TORCH_CHECK(oh >= 1 && ow >= 1 && self.size(-1) == oh * ow, "Given output_size=(", output_size[0], ", ",
              output_size[1], "), kernel_size=(", f.k[0], ", ", f.k[1], "), dilation=(", f.p.dilation[0], ", ",
              f.p.dilation[1], "), padding=(", f.p.padding[0], ", ", f.p.padding[1], "), stride=(", f.p.stride[0],
              ", ", f.p.stride[1], "), expected size of input's dimension 2 to match the calculated number of sliding "
              "blocks ", oh, " * ", ow, " = ", oh * ow, ", but got input.size(2)=", self.size(-1), ".");
  bool batched = self.dim() == 3;
  std::vector<int64_t> sz{self.size(-2) / kk, output_size[0], output_size[1]};
  if (batched) sz.insert(sz.begin(), self.size(0));
  at::native::resize_output(out, sz);
  c10::DeviceGuard guard(self.device());
  tpurt_view img = v5(out, 2), col = view_of(self);
  img.ndim = 4;
  img.sizes[2] = img.sizes[3], img.strides[2] = img.strides[3];
  img.sizes[3] = img.sizes[4], img.strides[3] = img.strides[4];
  if (!batched) {
    col.ndim = 3;
    col.sizes[2] = col.sizes[1], col.strides[2] = col.strides[1];
    col.sizes[1] = col.sizes[0], col.strides[1] = col.strides[0];
    col.sizes[0] = 1, col.strides[0] = 0;
  }
  check(tpurt_im2col(stream_of(self), &col, &img, f.k, &f.p, 1), "col2im");
  return out;
}
at::Tensor col2im(const at::Tensor& self, c10::SymIntArrayRef os, c10::IntArrayRef k, c10::IntArrayRef d,
                  c10::IntArrayRef p, c10::IntArrayRef s) {
  at::Tensor out = at::empty({0}, self.options());
  return col2im_out(self, os, k, d, p, s, out);
}

// ------------------------------------------------------------------ losses

// [N, C] view of a 0/1/2-D input
tpurt_view as2d(const at::Tensor& t) {
  tpurt_view v = view_of(t);
  if (t.dim() == 2) return v;
  tpurt_view r = v;
  r.ndim = 2;
  r.sizes[0] = 1, r.strides[0] = 0;
  r.sizes[1] = t.dim() == 1 ? t.size(0) : 1;
  r.strides[1] = t.dim() == 1 ? t.stride(0) : 0;
  return r;
}
tpurt_view as1d(const at::Tensor& t) {
  tpurt_view v = view_of(t);
  if (t.dim() == 1) return v;
  v.ndim = 1;
  v.sizes[0] = 1, v.strides[0] = 0;
  return v;
}

int64_t mm_check(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                 const c10::Scalar& p) {
  float_input(self, "multi_margin_loss");
  on_tpu(target, "target");
  TORCH_CHECK(p.toLong() == 1 || p.toLong() == 2, "only p == 1 and p == 2 supported");
  int64_t nframe = self.dim() <= 1 ? 1 : self.size(0), dim = self.dim() == 0 ? 1 : self.size(-1);
  TORCH_CHECK((self.dim() == 2 && self.size(1) != 0) || (self.dim() == 1 && self.size(0) != 0) || self.dim() == 0,
              "Expected non-empty vector or matrix with optional 0-dim batch size, but got: ", self.sizes());
  TORCH_CHECK(target.dim() <= 1 && target.numel() == nframe, "inconsistent target size, expected ", nframe,
              " but got ", target.sizes());
  if (weight && weight->defined())
    TORCH_CHECK(weight->dim() <= 1 && weight->numel() == dim, "inconsistent weight size, expected ", dim, " but got ",
                weight->sizes());
  return nframe;
}
at::Tensor& multi_margin_loss_out(const at::Tensor& self, const at::Tensor& target, const c10::Scalar& p,
                                  const c10::Scalar& margin, const std::optional<at::Tensor>& weight,
                                  int64_t reduction, at::Tensor& out) {
  int64_t n = mm_check(self, target, weight, p);
  if (reduction == 0 && target.dim() > 0) at::native::resize_output(out, {n});
  else at::native::resize_output(out, {});
  c10::DeviceGuard guard(self.device());
  tpurt_view o = as1d(out), x = as2d(self), t = as1d(target), w;
  bool hw = weight && weight->defined();
  if (hw) w = as1d(*weight);
  if (reduction != 0) o.ndim = 0;
  check(tpurt_multi_margin_loss(stream_of(self), &o, &x, &t, hw ? &w : nullptr, (int)p.toLong(), margin.toDouble(),
                                (int)reduction),
        "multi_margin_loss");
  return out;
}
at::Tensor multi_margin_loss(const at::Tensor& self, const at::Tensor& target, const c10::Scalar& p,
                             const c10::Scalar& margin, const std::optional<at::Tensor>& weight, int64_t reduction) {
  at::Tensor out = at::empty({0}, self.options());
  return multi_margin_loss_out(self, target, p, margin, weight, reduction, out);
}
at::Tensor& multi_margin_loss_backward_out(const at::Tensor& go, const at::Tensor& self, const at::Tensor& target,
                                           const c10::Scalar& p, const c10::Scalar& margin,
                                           const std::optional<at::Tensor>& weight, int64_t reduction,
                                           at::Tensor& gi) {
  mm_check(self, target, weight, p);
  at::native::resize_output(gi, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view g = as2d(gi), x = as2d(self), t = as1d(target), gov = as1d(go), w;
  bool hw = weight && weight->defined();
  if (hw) w = as1d(*weight);
  check(tpurt_multi_margin_loss_backward(stream_of(self), &g, &gov, &x, &t, hw ? &w : nullptr, (int)p.toLong(),
                                         margin.toDouble(), (int)reduction),
        "multi_margin_loss_backward");
  return gi;
}
at::Tensor multi_margin_loss_backward(const at::Tensor& go, const at::Tensor& self, const at::Tensor& target,
                                      const c10::Scalar& p, const c10::Scalar& margin,
                                      const std::optional<at::Tensor>& weight, int64_t reduction) {
  at::Tensor gi = at::empty(self.sizes(), self.options());
  return multi_margin_loss_backward_out(go, self, target, p, margin, weight, reduction, gi);
}

void ml_check(const at::Tensor& self, const at::Tensor& target) {
  float_input(self, "multilabel_margin_loss");
  on_tpu(target, "target");
  TORCH_CHECK(target.scalar_type() == at::kLong, "multilabel_margin_loss: expected target of dtype int64");
  if (self.dim() <= 1) {
    int64_t dim = self.dim() == 0 ? 1 : self.size(0);
    TORCH_CHECK(target.dim() <= 1 && target.numel() == dim, "inconsistent target size: ", target.sizes(),
                " for input of size: ", self.sizes());
  } else {
    TORCH_CHECK(self.dim() == 2 && self.size(1) != 0, "Expected non-empty vector or matrix with optional 0-dim batch "
                "size, but got: ", self.sizes());
    TORCH_CHECK(target.dim() == 2 && target.sizes() == self.sizes(), "inconsistent target size: ", target.sizes(),
                " for input of size: ", self.sizes());
  }
}
std::tuple<at::Tensor&, at::Tensor&> multilabel_fwd_out(const at::Tensor& self, const at::Tensor& target,
                                                        int64_t reduction, at::Tensor& out, at::Tensor& is_target) {
  ml_check(self, target);
  if (reduction == 0 && self.dim() == 2) at::native::resize_output(out, {self.size(0)});
  else at::native::resize_output(out, {});
  at::native::resize_output(is_target, target.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view o = as1d(out), it = as2d(is_target), x = as2d(self), t = as2d(target);
  if (reduction != 0) o.ndim = 0;
  check(tpurt_multilabel_margin_loss(stream_of(self), &o, &it, &x, &t, (int)reduction), "multilabel_margin_loss");
  return {out, is_target};
}
std::tuple<at::Tensor, at::Tensor> multilabel_fwd(const at::Tensor& self, const at::Tensor& target,
                                                  int64_t reduction) {
  at::Tensor out = at::empty({0}, self.options()), it = at::empty({0}, self.options());
  multilabel_fwd_out(self, target, reduction, out, it);
  return {out, it};
}
at::Tensor& multilabel_bwd_out(const at::Tensor& go, const at::Tensor& self, const at::Tensor& target,
                               int64_t reduction, const at::Tensor& is_target, at::Tensor& gi) {
  ml_check(self, target);
  at::native::resize_output(gi, self.sizes());
  c10::DeviceGuard guard(self.device());
  tpurt_view g = as2d(gi), gov = as1d(go), x = as2d(self), t = as2d(target), it = as2d(is_target);
  check(tpurt_multilabel_margin_loss_backward(stream_of(self), &g, &gov, &x, &t, &it, (int)reduction),
        "multilabel_margin_loss_backward");
  return gi;
}
at::Tensor multilabel_bwd(const at::Tensor& go, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                          const at::Tensor& is_target) {
  at::Tensor gi = at::empty(self.sizes(), self.options());
  return multilabel_bwd_out(go, self, target, reduction, is_target, gi);
}

// ------------------------------------------------------------- distances

at::Tensor cdist_forward(const at::Tensor& x1, const at::Tensor& x2, double p, std::optional<int64_t>) {
  float_input(x1, "cdist");
  on_tpu(x2, "x2");
  TORCH_CHECK(x1.dim() >= 2, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  TORCH_CHECK(x2.dim() >= 2, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  TORCH_CHECK(x1.size(-1) == x2.size(-1), "X1 and X2 must have the same number of columns. X1: ", x1.size(-1),
              " X2: ", x2.size(-1));
  TORCH_CHECK(x1.scalar_type() == x2.scalar_type(), "cdist: X1 and X2 must have the same dtype");
  TORCH_CHECK(p >= 0, "cdist only supports non-negative p values");
  auto b1 = x1.sizes().slice(0, x1.dim() - 2), b2 = x2.sizes().slice(0, x2.dim() - 2);
  std::vector<int64_t> batch = at::infer_size(b1, b2);
  int64_t B = 1;
  for (auto v : batch) B *= v;
  int64_t P = x1.size(-2), R = x2.size(-2), M = x1.size(-1);
  std::vector<int64_t> e1 = batch, e2 = batch;
  e1.insert(e1.end(), {P, M});
  e2.insert(e2.end(), {R, M});
  at::Tensor a = x1.expand(e1).reshape({B, P, M}), b = x2.expand(e2).reshape({B, R, M});
  std::vector<int64_t> osz = batch;
  osz.insert(osz.end(), {P, R});
  at::Tensor out = at::empty(osz, x1.options());
  c10::DeviceGuard guard(x1.device());
  tpurt_view o = view_of(out.view({B, P, R})), av = view_of(a), bv = view_of(b);
  check(tpurt_cdist(stream_of(x1), &o, &av, &bv, p), "cdist");
  return out;
}
at::Tensor cdist_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, double p,
                          const at::Tensor& cdist) {
  auto b1 = x1.sizes().slice(0, x1.dim() - 2), b2 = x2.sizes().slice(0, x2.dim() - 2);
  std::vector<int64_t> batch = at::infer_size(b1, b2);
  int64_t B = 1;
  for (auto v : batch) B *= v;
  int64_t P = x1.size(-2), R = x2.size(-2), M = x1.size(-1);
  std::vector<int64_t> e1 = batch, e2 = batch;
  e1.insert(e1.end(), {P, M});
  e2.insert(e2.end(), {R, M});
  at::Tensor a = x1.expand(e1).reshape({B, P, M}), b = x2.expand(e2).reshape({B, R, M});
  at::Tensor g = grad.reshape({B, P, R}), d = cdist.reshape({B, P, R});
  at::Tensor gx = at::empty({B, P, M}, x1.options());
  c10::DeviceGuard guard(x1.device());
  tpurt_view gv = view_of(gx), gov = view_of(g), av = view_of(a), bv = view_of(b), dv = view_of(d);
  check(tpurt_cdist_backward(stream_of(x1), &gv, &gov, &av, &bv, &dv, p), "cdist_backward");
  at::Tensor r = gx.view(e1);
  if (r.sizes() != x1.sizes()) r = r.sum_to_size(x1.sizes());
  return r;
}
at::Tensor pdist_forward(const at::Tensor& self, double p) {
  float_input(self, "pdist");
  TORCH_CHECK(self.is_contiguous(), "_pdist_forward requires contiguous input");
  TORCH_CHECK(self.dim() == 2, "pdist only supports 2D tensors, got: ", self.dim(), "D");
  TORCH_CHECK(p >= 0, "pdist only supports non-negative p values");
  int64_t n = self.size(0);
  at::Tensor out = at::empty({n > 1 ? n * (n - 1) / 2 : 0}, self.options());
  c10::DeviceGuard guard(self.device());
  tpurt_view o = view_of(out), x = view_of(self);
  check(tpurt_pdist(stream_of(self), &o, &x, p), "pdist");
  return out;
}
at::Tensor pdist_backward(const at::Tensor& grad, const at::Tensor& self, double p, const at::Tensor& pdist) {
  TORCH_CHECK(self.is_contiguous(), "_pdist_backward requires self to be contiguous");
  TORCH_CHECK(pdist.is_contiguous(), "_pdist_backward requires pdist to be contiguous");
  at::Tensor gi = at::empty(self.sizes(), self.options());
  c10::DeviceGuard guard(self.device());
  tpurt_view g = view_of(gi), gov = view_of(grad), x = view_of(self), d = view_of(pdist);
  check(tpurt_pdist_backward(stream_of(self), &g, &gov, &x, &d, p), "pdist_backward");
  return gi;
}

// ------------------------------------------------------------------- CTC

struct CtcMeta {
  at::Tensor il, tl, off;
  int64_t stride, max_len;
};
CtcMeta ctc_meta(const at::Tensor& log_probs, const at::Tensor& targets, c10::IntArrayRef il, c10::IntArrayRef tl,
                 int64_t blank) {
  float_input(log_probs, "ctc_loss");
  on_tpu(targets, "targets");
  TORCH_CHECK(log_probs.dim() == 3, "ctc_loss: expected log_probs to be 3-D (T, B, C), got ", log_probs.sizes());
  int64_t T = log_probs.size(0), B = log_probs.size(1), C = log_probs.size(2);
  TORCH_CHECK(blank >= 0 && blank < C, "blank must be in label range");
  TORCH_CHECK((int64_t)il.size() == B, "input_lengths must be of size batch_size");
  TORCH_CHECK((int64_t)tl.size() == B, "target_lengths must be of size batch_size");
  TORCH_CHECK(targets.scalar_type() == at::kLong || targets.scalar_type() == at::kInt,
              "ctc_loss: targets must be int32 or int64");
  CtcMeta m;
  std::vector<int64_t> off(B);
  int64_t pos = 0;
  m.max_len = 0;
  for (int64_t b = 0; b < B; b++) {
    TORCH_CHECK(il[b] >= 0 && il[b] <= T, "Expected input_lengths to have value at most ", T, ", but got value ",
                il[b], " (while checking arguments for ctc_loss_cpu)");
    TORCH_CHECK(tl[b] >= 0, "Expected target_lengths to be non-negative, but got ", tl[b]);
    m.max_len = std::max(m.max_len, tl[b]);
  }
  if (targets.dim() == 1) {
    for (int64_t b = 0; b < B; b++) off[b] = pos * targets.stride(0), pos += tl[b];
    TORCH_CHECK(targets.size(0) >= pos, "Expected tensor to have size at least ", pos, " at dimension 1, but got size ",
                targets.size(0), " for argument #2 'targets' (while checking arguments for ctc_loss_cpu)");
    m.stride = targets.stride(0);
  } else {
    TORCH_CHECK(targets.dim() == 2 && targets.size(0) == B, "ctc_loss: targets must be 1-D or [B, S]");
    for (int64_t b = 0; b < B; b++) {
      TORCH_CHECK(tl[b] <= targets.size(1), "Expected tensor to have size at least ", tl[b],
                  " at dimension 1, but got size ", targets.size(1),
                  " for argument #2 'targets' (while checking arguments for ctc_loss_cpu)");
      off[b] = b * targets.stride(0);
    }
    m.stride = targets.stride(1);
    m.max_len = std::max(m.max_len, targets.size(1));
  }
  auto opt = log_probs.options().dtype(at::kLong);
  m.il = at::tensor(std::vector<int64_t>(il.begin(), il.end()), at::TensorOptions().dtype(at::kLong)).to(opt.device());
  m.tl = at::tensor(std::vector<int64_t>(tl.begin(), tl.end()), at::TensorOptions().dtype(at::kLong)).to(opt.device());
  m.off = at::tensor(off, at::TensorOptions().dtype(at::kLong)).to(opt.device());
  return m;
}
tpurt_view flat_targets(const at::Tensor& targets) {
  tpurt_view v = view_of(targets);
  v.ndim = 1;
  v.sizes[0] = targets.numel();
  v.strides[0] = 1;  // offsets and stride are in elements from the data pointer
  return v;
}
std::tuple<at::Tensor, at::Tensor> ctc_loss(const at::Tensor& log_probs, const at::Tensor& targets,
                                            c10::IntArrayRef il, c10::IntArrayRef tl, int64_t blank, bool) {
  CtcMeta m = ctc_meta(log_probs, targets, il, tl, blank);
  int64_t B = log_probs.size(1), T = log_probs.size(0);
  at::Tensor nll = at::empty({B}, log_probs.options());
  at::Tensor la = at::empty({B, T, 2 * m.max_len + 1}, log_probs.options());
  c10::DeviceGuard guard(log_probs.device());
  tpurt_view nv = view_of(nll), lav = view_of(la), lp = view_of(log_probs), tg = flat_targets(targets),
             ilv = view_of(m.il), tlv = view_of(m.tl), ov = view_of(m.off);
  check(tpurt_ctc_loss(stream_of(log_probs), &nv, &lav, &lp, &tg, &ilv, &tlv, &ov, m.stride, blank), "ctc_loss");
  return {nll, la};
}
std::vector<int64_t> host_lengths(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}
std::tuple<at::Tensor, at::Tensor> ctc_loss_t(const at::Tensor& log_probs, const at::Tensor& targets,
                                              const at::Tensor& il, const at::Tensor& tl, int64_t blank, bool zi) {
  auto a = host_lengths(il), b = host_lengths(tl);
  return ctc_loss(log_probs, targets, a, b, blank, zi);
}
at::Tensor ctc_loss_backward(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                             c10::IntArrayRef il, c10::IntArrayRef tl, const at::Tensor& nll, const at::Tensor& la,
                             int64_t blank, bool zero_infinity) {
  CtcMeta m = ctc_meta(log_probs, targets, il, tl, blank);
  at::Tensor g = at::empty(log_probs.sizes(), log_probs.options());
  c10::DeviceGuard guard(log_probs.device());
  tpurt_view gv = view_of(g), gov = view_of(grad), nv = view_of(nll), lav = view_of(la), lp = view_of(log_probs),
             tg = flat_targets(targets), ilv = view_of(m.il), tlv = view_of(m.tl), ov = view_of(m.off);
  if (grad.dim() == 0) gov.ndim = 0;
  check(tpurt_ctc_loss_backward(stream_of(log_probs), &gv, &gov, &lp, &tg, &ilv, &tlv, &ov, m.stride, &nv, &lav,
                                blank, zero_infinity),
        "ctc_loss_backward");
  return g;
}
at::Tensor ctc_loss_backward_t(const at::Tensor& grad, const at::Tensor& log_probs, const at::Tensor& targets,
                               const at::Tensor& il, const at::Tensor& tl, const at::Tensor& nll,
                               const at::Tensor& la, int64_t blank, bool zi) {
  auto a = host_lengths(il), b = host_lengths(tl);
  return ctc_loss_backward(grad, log_probs, targets, a, b, nll, la, blank, zi);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
  m.impl("avg_pool3d.out", TORCH_FN(avg_pool3d_out));
  m.impl("avg_pool3d_backward.grad_input", TORCH_FN(avg_pool3d_backward_out));
  m.impl("max_pool3d_with_indices", TORCH_FN(max_pool3d_with_indices));
  m.impl("max_pool3d_with_indices.out", TORCH_FN(max_pool3d_with_indices_out));
  m.impl("max_pool3d_with_indices_backward", TORCH_FN(max_pool3d_with_indices_backward));
  m.impl("max_pool3d_with_indices_backward.grad_input", TORCH_FN(max_pool3d_with_indices_backward_out));
  m.impl("_adaptive_avg_pool3d", TORCH_FN(adaptive_avg_pool3d));
  m.impl("adaptive_avg_pool3d.out", TORCH_FN(adaptive_avg_pool3d_out));
  m.impl("_adaptive_avg_pool3d_backward", TORCH_FN(adaptive_avg_pool3d_backward));
  m.impl("adaptive_avg_pool3d_backward.grad_input", TORCH_FN(adaptive_avg_pool3d_backward_out));
  m.impl("adaptive_max_pool3d.out", TORCH_FN(adaptive_max_pool3d_out));
  m.impl("adaptive_max_pool3d_backward.grad_input", TORCH_FN(adaptive_max_pool3d_backward_out));
  m.impl("max_unpool2d", TORCH_FN(max_unpool2d));
  m.impl("max_unpool2d.out", TORCH_FN(max_unpool2d_out));
  m.impl("max_unpool3d", TORCH_FN(max_unpool3d));
  m.impl("max_unpool3d.out", TORCH_FN(max_unpool3d_out));
  m.impl("fractional_max_pool2d.output", TORCH_FN(fractional2d_out));
  m.impl("fractional_max_pool2d_backward.grad_input", TORCH_FN(fractional2d_bwd_out));
  m.impl("fractional_max_pool3d.output", TORCH_FN(fractional3d_out));
  m.impl("fractional_max_pool3d_backward", TORCH_FN(fractional3d_bwd));
  m.impl("fractional_max_pool3d_backward.grad_input", TORCH_FN(fractional3d_bwd_out));
  m.impl("upsample_nearest1d.out", TORCH_FN(upsample_nearest1d_out));
  m.impl("upsample_nearest1d_backward.grad_input", TORCH_FN(upsample_nearest1d_bwd));
  m.impl("upsample_nearest3d.out", TORCH_FN(upsample_nearest3d_out));
  m.impl("upsample_nearest3d_backward.grad_input", TORCH_FN(upsample_nearest3d_bwd));
  m.impl("_upsample_nearest_exact1d.out", TORCH_FN(upsample_nearest_exact1d_out));
  m.impl("_upsample_nearest_exact1d_backward.grad_input", TORCH_FN(upsample_nearest_exact1d_bwd));
  m.impl("_upsample_nearest_exact2d.out", TORCH_FN(upsample_nearest_exact2d_out));
  m.impl("_upsample_nearest_exact2d_backward.grad_input", TORCH_FN(upsample_nearest_exact2d_bwd));
  m.impl("_upsample_nearest_exact3d.out", TORCH_FN(upsample_nearest_exact3d_out));
  m.impl("_upsample_nearest_exact3d_backward.grad_input", TORCH_FN(upsample_nearest_exact3d_bwd));
  m.impl("upsample_linear1d.out", TORCH_FN(linear1d_out));
  m.impl("upsample_linear1d_backward.grad_input", TORCH_FN(linear1d_bwd));
  m.impl("upsample_trilinear3d.out", TORCH_FN(trilinear_out));
  m.impl("upsample_trilinear3d_backward.grad_input", TORCH_FN(trilinear_bwd));
  m.impl("upsample_bicubic2d.out", TORCH_FN(bicubic2d_out));
  m.impl("upsample_bicubic2d_backward.grad_input", TORCH_FN(bicubic2d_bwd));
  m.impl("_upsample_bilinear2d_aa.out", TORCH_FN(bilinear2d_aa_out));
  m.impl("_upsample_bilinear2d_aa_backward.grad_input", TORCH_FN(bilinear2d_aa_bwd));
  m.impl("_upsample_bicubic2d_aa.out", TORCH_FN(bicubic2d_aa_out));
  m.impl("_upsample_bicubic2d_aa_backward.grad_input", TORCH_FN(bicubic2d_aa_bwd));
  m.impl("grid_sampler_2d", TORCH_FN(grid_sampler_2d));
  m.impl("grid_sampler_2d_backward", TORCH_FN(grid_sampler_2d_backward));
  m.impl("grid_sampler_3d", TORCH_FN(grid_sampler_3d));
  m.impl("grid_sampler_3d_backward", TORCH_FN(grid_sampler_3d_backward));
  m.impl("im2col", TORCH_FN(im2col));
  m.impl("im2col.out", TORCH_FN(im2col_out));
  m.impl("col2im", TORCH_FN(col2im));
  m.impl("col2im.out", TORCH_FN(col2im_out));
  m.impl("multi_margin_loss", TORCH_FN(multi_margin_loss));
  m.impl("multi_margin_loss.out", TORCH_FN(multi_margin_loss_out));
  m.impl("multi_margin_loss_backward", TORCH_FN(multi_margin_loss_backward));
  m.impl("multi_margin_loss_backward.grad_input", TORCH_FN(multi_margin_loss_backward_out));
  m.impl("multilabel_margin_loss_forward", TORCH_FN(multilabel_fwd));
  m.impl("multilabel_margin_loss_forward.output", TORCH_FN(multilabel_fwd_out));
  m.impl("multilabel_margin_loss_backward", TORCH_FN(multilabel_bwd));
  m.impl("multilabel_margin_loss_backward.grad_input", TORCH_FN(multilabel_bwd_out));
  m.impl("_cdist_forward", TORCH_FN(cdist_forward));
  m.impl("_cdist_backward", TORCH_FN(cdist_backward));
  m.impl("_pdist_forward", TORCH_FN(pdist_forward));
  m.impl("_pdist_backward", TORCH_FN(pdist_backward));
  m.impl("_ctc_loss", TORCH_FN(ctc_loss));
  m.impl("_ctc_loss.Tensor", TORCH_FN(ctc_loss_t));
  m.impl("_ctc_loss_backward", TORCH_FN(ctc_loss_backward));
  m.impl("_ctc_loss_backward.Tensor", TORCH_FN(ctc_loss_backward_t));
}

}  // namespace torch_tpu
