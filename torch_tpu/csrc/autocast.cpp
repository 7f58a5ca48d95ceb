// Autocast for the tpu device: `torch.autocast("tpu", dtype=torch.bfloat16)`
// (or float16) applies PyTorch's lower-precision op policy, the op lists
// CUDA uses (ATen/autocast_mode.h): matmuls, convolutions, linear and
// attention run in the autocast dtype; reductions, losses, softmax and
// transcendental ops run in float32; ops mixing dtypes promote. Every other
// op passes through unchanged.
//
// One departure, the TPU one (PyTorch/XLA's TPU policy and CPU autocast make
// the same choice): layer / group norm and nearest upsampling keep their
// input's dtype. The device's norm kernels compute the statistics and the
// affine map in f32 or wider whatever the input dtype, rounding once to the
// output; CUDA's float32 rule only adds a widening copy before the op, f32
// activations after it (and in its saved tensors) and a narrowing copy at the
// next convolution or product. A nearest upsample moves values; its backward
// sums in f32 or wider and rounds once. Their inputs are still cast when
// they mix dtypes the op itself accepts (bf16 data, f32 affine parameters).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <cstring>

namespace {

using namespace at::autocast;  // NOLINT: the policy macros name these types unqualified
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// The float32-list ops that run in their input's dtype on the device (above).
bool keeps_input_dtype(const char* op) {
  static const char* const kept[] = {"layer_norm", "native_layer_norm", "group_norm", "upsample_nearest1d",
                                     "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
                                     "upsample_nearest3d", "_upsample_nearest_exact3d"};
  for (const char* k : kept)
    if (std::strcmp(op, k) == 0) return true;
  return false;
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPU_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_AUTOCAST_FP32(OP, ...) \
  if (!keeps_input_dtype(#OP)) {   \
    KERNEL_PRIVATEUSEONE(OP, ##__VA_ARGS__, fp32)    \
  }
#define TPU_AUTOCAST_FP32_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(TPU_AUTOCAST_LOWER)
  AT_FORALL_FP32(TPU_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_AUTOCAST_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_AUTOCAST_PROMOTE)
#undef TPU_AUTOCAST_LOWER
#undef TPU_AUTOCAST_FP32
#undef TPU_AUTOCAST_FP32_OPT_DTYPE
#undef TPU_AUTOCAST_PROMOTE
}

}  // namespace
