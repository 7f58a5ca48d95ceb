// ATen kernels of the FFT family: _fft_r2c, _fft_c2c, _fft_c2r (functional
// and out=), which torch.fft.* and stft / istft decompose into, and
// conj_physical.out (used by the Hermitian transforms' autograd). The glue
// resolves dims, output shapes / dtypes and the normalization factor; the
// transforms are tpurt_fft calls.
#include "glue.h"

#include <ATen/WrapDimUtils.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

namespace torch_tpu {
namespace {

void check_tpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().type() == kTpu, name, ": expected a tpu tensor, got one on ", t.device());
}

// normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n (PyTorch's fft_norm_mode)
double norm_scale(int64_t normalization, int64_t signal_numel) {
  switch (normalization) {
    case 0:
      return 1.0;
    case 1:
      return 1.0 / std::sqrt(static_cast<double>(signal_numel));
    case 2:
      return 1.0 / static_cast<double>(signal_numel);
    default:
      TORCH_CHECK(false, "Unsupported normalization type: ", normalization);
  }
}

std::vector<int> wrap_dims(const at::Tensor& self, at::IntArrayRef dim, const char* name) {
  TORCH_CHECK(!dim.empty(), name, ": expected at least one dim to transform");
  std::vector<int> d;
  std::vector<bool> seen(self.dim(), false);
  for (int64_t x : dim) {
    int64_t w = at::maybe_wrap_dim(x, self.dim());
    TORCH_CHECK(!seen[w], "FFT dims must be unique");
    seen[w] = true;
    d.push_back(static_cast<int>(w));
  }
  return d;
}

// The input with its lazy conjugate / negative bits applied.
at::Tensor resolved(const at::Tensor& self) { return self.resolve_conj().resolve_neg(); }

void run(tpurt_fft_kind kind, const char* name, const at::Tensor& out, const at::Tensor& in, const at::Tensor* work,
         const std::vector<int>& dims, bool forward, double scale) {
  c10::DeviceGuard guard(out.device());
  tpurt_view vo = view_of(out), vi = view_of(in), vw;
  if (work) vw = view_of(*work);
  check(tpurt_fft(current_stream(out.device().index()), kind, &vo, &vi, work ? &vw : nullptr,
                  static_cast<int>(dims.size()), dims.data(), forward ? 1 : 0, scale),
        name);
}

at::Tensor fft_r2c(const at::Tensor& self, at::IntArrayRef dim, int64_t normalization, bool onesided) {
  check_tpu(self, "_fft_r2c");
  TORCH_CHECK(self.scalar_type() == at::kFloat || self.scalar_type() == at::kDouble, "Unsupported dtype ",
              self.scalar_type());
  auto dims = wrap_dims(self, dim, "_fft_r2c");
  at::Tensor in = resolved(self);
  int64_t n = 1;
  for (int d : dims) n *= in.size(d);
  auto sizes = in.sizes().vec();
  int last = dims.back();
  if (onesided) sizes[last] = sizes[last] / 2 + 1;
  at::Tensor out = at::empty(sizes, in.options().dtype(c10::toComplexType(in.scalar_type())));
  run(TPURT_FFT_R2C, "_fft_r2c", out, in, nullptr, dims, true, norm_scale(normalization, n));
  return out;
}

at::Tensor fft_c2c(const at::Tensor& self, c10::SymIntArrayRef dim, int64_t normalization, bool forward) {
  check_tpu(self, "_fft_c2c");
  TORCH_CHECK(self.is_complex(), "_fft_c2c: expected a complex input tensor, but got ", self.scalar_type());
  TORCH_CHECK(self.scalar_type() == at::kComplexFloat || self.scalar_type() == at::kComplexDouble,
              "Unsupported dtype ", self.scalar_type());
  auto dims = wrap_dims(self, C10_AS_INTARRAYREF_SLOW(dim), "_fft_c2c");
  at::Tensor in = resolved(self);
  int64_t n = 1;
  for (int d : dims) n *= in.size(d);
  at::Tensor out = at::empty(in.sizes(), in.options());
  run(TPURT_FFT_C2C, "_fft_c2c", out, in, nullptr, dims, forward, norm_scale(normalization, n));
  return out;
}

at::Tensor fft_c2r(const at::Tensor& self, at::IntArrayRef dim, int64_t normalization, c10::SymInt last_dim_size_s) {
  check_tpu(self, "_fft_c2r");
  TORCH_CHECK(self.is_complex(), "_fft_c2r: expected a complex input tensor, but got ", self.scalar_type());
  TORCH_CHECK(self.scalar_type() == at::kComplexFloat || self.scalar_type() == at::kComplexDouble,
              "Unsupported dtype ", self.scalar_type());
  int64_t last_dim_size = last_dim_size_s.expect_int();
  TORCH_CHECK(last_dim_size >= 1, "Invalid number of data points (", last_dim_size, ") specified");
  auto dims = wrap_dims(self, dim, "_fft_c2r");
  at::Tensor in = resolved(self);
  auto sizes = in.sizes().vec();
  int last = dims.back();
  sizes[last] = last_dim_size;
  int64_t n = 1;
  for (int d : dims) n *= sizes[d];
  at::Tensor out = at::empty(sizes, in.options().dtype(c10::toRealValueType(in.scalar_type())));
  at::Tensor work;
  if (dims.size() > 1) work = at::empty(in.sizes(), in.options());
  run(TPURT_FFT_C2R, "_fft_c2r", out, in, dims.size() > 1 ? &work : nullptr, dims, false,
      norm_scale(normalization, n));
  return out;
}

at::Tensor& into(const at::Tensor& r, at::Tensor& out) {
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

at::Tensor& fft_r2c_out(const at::Tensor& self, at::IntArrayRef dim, int64_t normalization, bool onesided,
                        at::Tensor& out) {
  return into(fft_r2c(self, dim, normalization, onesided), out);
}
at::Tensor& fft_c2c_out(const at::Tensor& self, c10::SymIntArrayRef dim, int64_t normalization, bool forward,
                        at::Tensor& out) {
  return into(fft_c2c(self, dim, normalization, forward), out);
}
at::Tensor& fft_c2r_out(const at::Tensor& self, at::IntArrayRef dim, int64_t normalization, c10::SymInt last_dim_size,
                        at::Tensor& out) {
  return into(fft_c2r(self, dim, normalization, std::move(last_dim_size)), out);
}

// conj_physical: a copy of the logical values, then the imaginary parts negated.
at::Tensor& k_conj_physical_out(const at::Tensor& self, at::Tensor& out) {
  check_tpu(self, "conj_physical");
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "conj_physical: expected out dtype ", self.scalar_type(),
              " but got ", out.scalar_type());
  at::native::resize_output(out, self.sizes());
  c10::DeviceGuard guard(out.device());
  if (out.numel() == 0) return out;
  out.copy_(self);
  if (out.is_complex()) at::view_as_real(out).select(-1, 1).neg_();
  return out;
}

at::Tensor& conj_physical_inplace(at::Tensor& self) { return k_conj_physical_out(self, self); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fft_r2c", TORCH_FN(fft_r2c));
  m.impl("_fft_r2c.out", TORCH_FN(fft_r2c_out));
  m.impl("_fft_c2c", TORCH_FN(fft_c2c));
  m.impl("_fft_c2c.out", TORCH_FN(fft_c2c_out));
  m.impl("_fft_c2r", TORCH_FN(fft_c2r));
  m.impl("_fft_c2r.out", TORCH_FN(fft_c2r_out));
  m.impl("conj_physical.out", TORCH_FN(k_conj_physical_out));
  m.impl("conj_physical_", TORCH_FN(conj_physical_inplace));
}

}  // namespace torch_tpu
