// Autocast for the tpu device: `torch.autocast("tpu", dtype=torch.bfloat16)`
// (or float16) applies PyTorch's lower-precision op policy, the same op
// lists CUDA uses (ATen/autocast_mode.h): matmuls, convolutions, linear and
// attention run in the autocast dtype; reductions, norms, losses, softmax
// and transcendental ops run in float32; ops mixing dtypes promote. Every
// other op passes through unchanged.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using namespace at::autocast;  // NOLINT: the policy macros name these types unqualified
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPU_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
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
