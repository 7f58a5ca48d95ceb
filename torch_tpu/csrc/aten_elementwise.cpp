// Elementwise ATen kernels of the `tpu` backend. Each kernel lets a
// TensorIterator do broadcasting, type promotion and output allocation
// (metadata only), then builds a small tpurt_ew_program (loads, one or two
// instructions, stores) and launches it asynchronously with
// tpurt_elementwise. 0-dim CPU tensors and Scalar arguments become launch
// scalars (TPURT_EW_SCALAR); hyperparameters of activations are instruction
// parameters.
#include "glue.h"

#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Resize.h>
#include <ATen/ScalarOps.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>
#include <limits>
#include <vector>

namespace torch_tpu {
namespace {

tpurt_dtype compute_for(at::ScalarType t) {
  if (at::isComplexType(t)) return t == at::kComplexFloat ? TPURT_C64 : TPURT_C128;
  if (t == at::kDouble) return TPURT_F64;
  if (at::isFloatingType(t)) return TPURT_F32;
  return TPURT_I64;
}

// A program under construction.
struct Prog {
  tpurt_ew_program p;
  std::vector<double> scalars;
  tpurt_view ins[TPURT_EW_MAX_IO];
  int nin = 0, nreg = 0;
  // the operands' common dtype when the caller knows it: integer operands of another dtype are
  // converted to it before use (load_inputs), as PyTorch's kernels do
  at::ScalarType operand = at::ScalarType::Undefined;
  // PyTorch's CPU kernels of mul and div (every rounding mode) read a scalar second operand of a
  // bfloat16 / float16 op at float precision (original_scalar_value); every other op rounds it to
  // the common dtype first
  bool scalar2_at_opmath = false;
  explicit Prog(tpurt_dtype compute) {
    std::memset(&p, 0, sizeof p);
    p.compute = compute;
  }
  explicit Prog(at::ScalarType common) : Prog(compute_for(common)) { operand = common; }
  bool is_complex() const { return p.compute == TPURT_C64 || p.compute == TPURT_C128; }
  int emit(tpurt_ew_op op, std::initializer_list<int> src, double p0 = 0, double p1 = 0, double p2 = 0,
           double p3 = 0) {
    TORCH_CHECK(p.ninst < TPURT_EW_MAX_INST && nreg < TPURT_EW_MAX_REGS, "elementwise program too long");
    tpurt_ew_inst& I = p.inst[p.ninst++];
    I.op = static_cast<uint16_t>(op);
    I.dst = static_cast<uint8_t>(nreg);
    int k = 0;
    for (int s : src) I.src[k++] = static_cast<uint8_t>(s);
    I.p[0] = p0;
    I.p[1] = p1;
    I.p[2] = p2;
    I.p[3] = p3;
    return nreg++;
  }
  int load(const tpurt_view& v) {
    TORCH_CHECK(nin < TPURT_EW_MAX_IO, "too many elementwise inputs");
    ins[nin] = v;
    return emit(TPURT_EW_LOAD, {}, nin++);
  }
  int scalar(const c10::Scalar& s) {
    int idx = static_cast<int>(scalars.size());
    if (s.isComplex()) {
      auto c = s.toComplexDouble();
      scalars.push_back(c.real());
      scalars.push_back(c.imag());
    } else {
      scalars.push_back(s.isIntegral(true) ? static_cast<double>(s.toLong()) : s.toDouble());
      if (is_complex()) scalars.push_back(0.0);
    }
    return emit(TPURT_EW_SCALAR, {}, idx);
  }
  // A Scalar operand of the op (a clamp bound): converted to the operands' dtype first as the CPU's
  // kernels do (scalar.to<scalar_t>(): -1 is 255 for uint8, 0.1 is 0.10009765625 for bfloat16; a
  // value the dtype cannot hold raises as on the CPU)
  int operand_scalar(const c10::Scalar& s) {
    if (operand == at::ScalarType::Undefined || operand == at::kLong || operand == at::kDouble ||
        operand == at::kFloat || at::isComplexType(operand))
      return scalar(s);
    c10::Scalar v;
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kBFloat16, at::kHalf, operand, "operand_scalar",
                               [&] { v = c10::Scalar(s.to<scalar_t>()); });
    return scalar(v);
  }
};

tpurt_view iter_view(const at::TensorIteratorBase& iter, int arg) {
  tpurt_view v;
  std::memset(&v, 0, sizeof v);
  v.ptr = reinterpret_cast<tpurt_devptr>(iter.data_ptr(arg));
  v.dtype = to_runtime(iter.dtype(arg));
  int nd = iter.ndim();
  v.ndim = nd;
  auto shape = iter.shape();
  auto st = iter.strides(arg);
  int64_t es = static_cast<int64_t>(iter.element_size(arg));
  // TensorIterator's dim 0 is the fastest; the runtime's last dim is.
  for (int k = 0; k < nd; k++) {
    v.sizes[nd - 1 - k] = shape[k];
    v.strides[nd - 1 - k] = st[k] / es;
  }
  return v;
}

// Registers of the iterator's inputs (CPU scalars become launch scalars).
std::vector<int> load_inputs(Prog& pr, const at::TensorIteratorBase& iter) {
  std::vector<int> regs;
  // registers hold integers as int64: an operand of another integer dtype than the common one (an
  // int16 -16 meeting a uint8 tensor, a Python -3 compared with one) takes the common dtype's value first
  bool narrow = pr.operand != at::ScalarType::Undefined && pr.operand != at::kLong &&
                at::isIntegralType(pr.operand, /*includeBool=*/true);
  // registers hold bfloat16 / float16 operands as float: an operand of another dtype (a 0-dim float32
  // tensor, a Python float, an integer tensor) is rounded to the common dtype first, as the CPU's
  // TensorIterator casts it (except mul's and div's scalar second operand, see Prog)
  bool reduced = pr.operand == at::kBFloat16 || pr.operand == at::kHalf;
  for (int i = iter.noutputs(); i < iter.ntensors(); i++) {
    int r = iter.is_cpu_scalar(i) ? pr.scalar(iter.tensor(i).item()) : pr.load(iter_view(iter, i));
    bool opmath = reduced && pr.scalar2_at_opmath && i == iter.noutputs() + 1 && iter.is_scalar(i);
    if ((narrow || (reduced && !opmath)) && iter.dtype(i) != pr.operand)
      r = pr.emit(TPURT_EW_CAST, {r}, static_cast<double>(to_runtime(pr.operand)));
    regs.push_back(r);
  }
  return regs;
}

// An empty iterator launches too: the runtime validates the program against the dtypes first (an op
// the dtype does not support is refused, as the CPU refuses it for an empty tensor) and returns before
// touching memory or recording anything.
void launch(Prog& pr, const at::TensorIteratorBase& iter, std::initializer_list<int> out_regs, const char* name) {
  int k = 0;
  for (int r : out_regs) pr.p.out_reg[k++] = static_cast<uint8_t>(r);
  pr.p.nout = k;
  tpurt_view outs[TPURT_EW_MAX_IO];
  for (int i = 0; i < k; i++) outs[i] = iter_view(iter, i);
  c10::Device dev = iter.device(0);
  c10::DeviceGuard guard(dev);
  check(tpurt_elementwise(current_stream(dev.index()), &pr.p, outs, pr.ins, pr.nin, pr.scalars.data(),
                          static_cast<int>(pr.scalars.size())),
        name);
}

void check_tpu(const at::TensorIteratorBase& iter, const char* name) {
  TORCH_CHECK(iter.device(0).type() == kTpu, name, ": expected the output on a tpu device, got ", iter.device(0));
}

// One instruction over all inputs of iter.
void run_op(const at::TensorIteratorBase& iter, tpurt_ew_op op, const char* name, at::ScalarType compute, double p0 = 0,
            double p1 = 0, double p2 = 0, double p3 = 0, bool scalar2_at_opmath = false) {
  check_tpu(iter, name);
  Prog pr(compute);
  pr.scalar2_at_opmath = scalar2_at_opmath;
  auto r = load_inputs(pr, iter);
  int o;
  switch (r.size()) {
    case 1: o = pr.emit(op, {r[0]}, p0, p1, p2, p3); break;
    case 2: o = pr.emit(op, {r[0], r[1]}, p0, p1, p2, p3); break;
    default: o = pr.emit(op, {r[0], r[1], r[2]}, p0, p1, p2, p3); break;
  }
  launch(pr, iter, {o}, name);
}
void run_op(const at::TensorIteratorBase& iter, tpurt_ew_op op, const char* name) {
  run_op(iter, op, name, iter.common_dtype());
}
// mul and div: a scalar second operand stays at float precision (see Prog::scalar2_at_opmath)
void run_mul_div(const at::TensorIteratorBase& iter, tpurt_ew_op op, const char* name) {
  run_op(iter, op, name, iter.common_dtype(), 0, 0, 0, 0, true);
}

// General iterator: out (may be undefined) and inputs, PyTorch's binary-op
// configuration (promotion to the common dtype, safe cast to the output).
at::TensorIterator make_iter(const at::Tensor& out, std::initializer_list<at::Tensor> ins, bool int_to_float = false) {
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true)
      .allow_cpu_scalars(true)
      .promote_inputs_to_common_dtype(true)
      .cast_common_dtype_to_outputs(true)
      .enforce_safe_casting_to_output(true)
      .promote_integer_inputs_to_float(int_to_float);
  cfg.add_owned_output(out);
  for (const auto& t : ins) cfg.add_owned_const_input(t);
  return cfg.build();
}

// Output bool (or out's dtype), inputs compared in their common dtype.
at::TensorIterator make_cmp_iter(const at::Tensor& out, std::initializer_list<at::Tensor> ins) {
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).allow_cpu_scalars(true).promote_inputs_to_common_dtype(true);
  if (!out.defined()) cfg.declare_static_dtype(at::kBool);
  cfg.add_owned_output(out);
  for (const auto& t : ins) cfg.add_owned_const_input(t);
  return cfg.build();
}

// Output of its own dtype (or bool if undefined), computed in the input's dtype.
at::TensorIterator make_pred_iter(const at::Tensor& out, const at::Tensor& self) {
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(false);
  if (!out.defined()) cfg.declare_static_dtype(at::kBool);
  cfg.add_owned_output(out).add_owned_const_input(self);
  return cfg.build();
}

// A Python scalar operand: a wrapped number, which takes part in type promotion below 0-dim tensors
// (a -3 compared with a 0-dim uint8 tensor is a uint8 253, as on the CPU)
at::Tensor wrap(const c10::Scalar& s) { return at::native::wrapped_scalar_tensor(s); }

// ------------------------------------------------------------ arithmetic

void alpha_check(at::ScalarType dtype, const c10::Scalar& alpha) {
  TORCH_CHECK(!alpha.isBoolean() || dtype == at::kBool, "Boolean alpha only supported for Boolean results.");
  TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype) || alpha.isIntegral(true),
              "For integral input tensors, argument alpha must not be a floating point number.");
  TORCH_CHECK(at::isComplexType(dtype) || !alpha.isComplex(),
              "For non-complex input tensors, argument alpha must not be a complex number.")
}

void sub_check(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.scalar_type() != at::kBool || other.scalar_type() != at::kBool,
              "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` "
              "operator instead.")
  TORCH_CHECK(self.scalar_type() != at::kBool && other.scalar_type() != at::kBool,
              "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
              "mask, use the `~` or `logical_not()` operator instead.");
}

void add_sub(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha, at::Tensor& out, bool sub,
             const char* name) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  alpha_check(iter.common_dtype(), alpha);
  check_tpu(iter, name);
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);
  int b = r[1];
  bool unit = !alpha.isComplex() && (alpha.isIntegral(true) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0);
  if (!unit) b = pr.emit(TPURT_EW_MUL, {b, pr.scalar(alpha)});
  int o = pr.emit(sub ? TPURT_EW_SUB : TPURT_EW_ADD, {r[0], b}, 1.0);
  launch(pr, iter, {o}, name);
}

at::Tensor& k_add_out(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha, at::Tensor& out) {
  add_sub(self, other, alpha, out, false, "add");
  return out;
}
at::Tensor& k_sub_out(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha, at::Tensor& out) {
  sub_check(self, other);
  add_sub(self, other, alpha, out, true, "sub");
  return out;
}

// Ops whose CPU kernels have no bool instantiation: refused by dtype as there (name: the CPU kernel's).
void refuse_bool(const at::TensorIteratorBase& iter, const char* cpu_name) {
  TORCH_CHECK_NOT_IMPLEMENTED(iter.common_dtype() != at::kBool, "\"", cpu_name, "\" not implemented for 'Bool'");
}

template <tpurt_ew_op OP>
at::Tensor& binary_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  if constexpr (OP == TPURT_EW_REMAINDER) refuse_bool(iter, "remainder_cpu");
  if constexpr (OP == TPURT_EW_FMOD) refuse_bool(iter, "fmod_cpu");
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}
template <tpurt_ew_op OP>
at::Tensor& binary_float_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_float_op(out, self, other);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}

at::Tensor& k_mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  run_mul_div(iter, iter.common_dtype() == at::kBool ? TPURT_EW_LOGICAL_AND : TPURT_EW_MUL, "mul");
  return out;
}

at::Tensor& k_div_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_float_op(out, self, other);
  run_mul_div(iter, TPURT_EW_DIV, "div");
  return out;
}

at::Tensor& k_div_mode_out(const at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> mode,
                         at::Tensor& out) {
  if (!mode.has_value()) return k_div_out(self, other, out);
  auto iter = at::TensorIterator::binary_op(out, self, other);
  tpurt_ew_op op;
  if (*mode == "trunc") {
    op = TPURT_EW_DIV_TRUNC;
  } else if (*mode == "floor") {
    op = TPURT_EW_DIV_FLOOR;
  } else {
    TORCH_CHECK(false, "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", *mode, "'");
  }
  refuse_bool(iter, *mode == "trunc" ? "div_trunc_cpu" : "div_floor_cpu");
  run_mul_div(iter, op, *mode == "trunc" ? "div_trunc" : "div_floor");
  return out;
}

at::Tensor& k_floor_divide_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  refuse_bool(iter, "floor_divide");
  run_mul_div(iter, TPURT_EW_DIV_FLOOR, "floor_divide");
  return out;
}
at::Tensor k_floor_divide(const at::Tensor& self, const at::Tensor& other) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, self, other);
  refuse_bool(iter, "floor_divide");
  run_mul_div(iter, TPURT_EW_DIV_FLOOR, "floor_divide");
  return iter.output();
}
at::Tensor& k_floor_divide_(at::Tensor& self, const at::Tensor& other) { return k_floor_divide_out(self, other, self); }

// pow: integer bases with negative integer exponents are rejected like the CPU
at::Tensor& pow_run(const at::Tensor& base, const at::Tensor& exp, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, base, exp);
  refuse_bool(iter, "pow");
  run_op(iter, TPURT_EW_POW, "pow");
  return out;
}
at::Tensor& pow_tt_out(const at::Tensor& base, const at::Tensor& exp, at::Tensor& out) {
  return pow_run(base, exp, out);
}
at::Tensor& pow_ts_out(const at::Tensor& base, const c10::Scalar& exp, at::Tensor& out) {
  TORCH_CHECK(!(at::isIntegralType(base.scalar_type(), true) && exp.isIntegral(true) && exp.toLong() < 0),
              "Integers to negative integer powers are not allowed.");
  auto iter = at::TensorIterator::binary_op(out, base, wrap(exp));
  refuse_bool(iter, "pow");
  at::ScalarType ct = iter.common_dtype();
  bool real_float = at::isFloatingType(ct) && !exp.isComplex();
  if (real_float && (exp.toDouble() == 2.0 || exp.toDouble() == 0.5 || exp.toDouble() == 1.0)) {
    // the CPU kernel's special cases: exact square, sqrt, identity
    check_tpu(iter, "pow");
    Prog pr(ct);
    auto r = load_inputs(pr, iter);
    double e = exp.toDouble();
    int o = e == 2.0 ? pr.emit(TPURT_EW_SQUARE, {r[0]})
                     : e == 0.5 ? pr.emit(TPURT_EW_SQRT, {r[0]}) : pr.emit(TPURT_EW_MUL, {r[0], pr.scalar(1.0)});
    launch(pr, iter, {o}, "pow");
    return out;
  }
  run_op(iter, TPURT_EW_POW, "pow");
  return out;
}
at::Tensor& pow_st_out(const c10::Scalar& base, const at::Tensor& exp, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, wrap(base), exp);
  refuse_bool(iter, "pow");
  run_op(iter, TPURT_EW_POW, "pow");
  return out;
}

// remainder(Scalar, Tensor): the scalar as a wrapped number (a Python scalar's type promotion)
at::Tensor& k_remainder_st_out(const c10::Scalar& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, at::native::wrapped_scalar_tensor(self), other);
  refuse_bool(iter, "remainder_cpu");
  run_op(iter, TPURT_EW_REMAINDER, "remainder");
  return out;
}
at::Tensor k_remainder_st(const c10::Scalar& self, const at::Tensor& other) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, at::native::wrapped_scalar_tensor(self), other);
  refuse_bool(iter, "remainder_cpu");
  run_op(iter, TPURT_EW_REMAINDER, "remainder");
  return iter.output();
}

at::Tensor& k_xlogy_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_float_op(out, self, other);
  run_op(iter, TPURT_EW_XLOGY, "xlogy");
  return out;
}

// ------------------------------------------------------------ comparisons

template <tpurt_ew_op OP>
at::Tensor& cmp_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::comparison_op(out, self, other);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}
template <tpurt_ew_op OP>
at::Tensor& cmp_scalar_out(const at::Tensor& self, const c10::Scalar& other, at::Tensor& out) {
  auto w = wrap(other);
  auto iter = at::TensorIterator::comparison_op(out, self, w);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}

template <tpurt_ew_op OP>
at::Tensor& logical_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = make_cmp_iter(out, {self, other});
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}

at::Tensor& k_logical_not_out(const at::Tensor& self, at::Tensor& out) {
  auto iter = make_pred_iter(out, self);
  run_op(iter, TPURT_EW_LOGICAL_NOT, "logical_not", self.scalar_type());
  return out;
}

at::Tensor& k_bitwise_not_out(const at::Tensor& self, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(iter.common_dtype(), true), "\"bitwise_not_cpu\" not implemented for '",
                              iter.common_dtype(), "'");
  run_op(iter, iter.common_dtype() == at::kBool ? TPURT_EW_LOGICAL_NOT : TPURT_EW_BITWISE_NOT, "bitwise_not");
  return out;
}

// integer ops (bitwise, shifts in place; shifts, gcd / lcm without bool, like the CPU kernels)
template <tpurt_ew_op OP, bool WITH_BOOL = OP != TPURT_EW_LSHIFT && OP != TPURT_EW_RSHIFT>
at::Tensor& bitwise_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(iter.common_dtype(), WITH_BOOL), "\"", tpurt_ew_op_name(OP),
                              "_cpu\" not implemented for '", iter.common_dtype(), "'");
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}

// the << and >> operators (non-structured)
template <tpurt_ew_op OP>
at::Tensor shift_t(const at::Tensor& self, const at::Tensor& other) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, self, other);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isIntegralType(iter.common_dtype(), false), "\"", tpurt_ew_op_name(OP),
                              "_cpu\" not implemented for '", iter.common_dtype(), "'");
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return iter.output();
}
template <tpurt_ew_op OP>
at::Tensor shift_s(const at::Tensor& self, const c10::Scalar& other) {
  return shift_t<OP>(self, wrap(other));
}
template <tpurt_ew_op OP>
at::Tensor& ishift_t(at::Tensor& self, const at::Tensor& other) {
  return bitwise_out<OP>(self, other, self);
}
template <tpurt_ew_op OP>
at::Tensor& ishift_s(at::Tensor& self, const c10::Scalar& other) {
  return bitwise_out<OP>(self, wrap(other), self);
}

// ------------------------------------------------------------------ unary

template <tpurt_ew_op OP>
at::Tensor& unary_out(const at::Tensor& self, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}
template <tpurt_ew_op OP>
at::Tensor& unary_float_out(const at::Tensor& self, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_float_op(out, self);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}

at::Tensor& k_neg_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(self.scalar_type() != at::kBool,
              "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use "
              "the `~` or `logical_not()` operator instead.");
  return unary_out<TPURT_EW_NEG>(self, out);
}

at::Tensor& k_abs_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK_NOT_IMPLEMENTED(self.scalar_type() != at::kBool, "\"abs\" not implemented for 'Bool'");
  if (self.is_complex()) {
    at::native::resize_output(out, self.sizes());
    at::TensorIteratorConfig cfg;
    cfg.set_check_mem_overlap(true).check_all_same_dtype(false).add_owned_output(out).add_owned_const_input(self);
    auto iter = cfg.build();
    run_op(iter, TPURT_EW_ABS, "abs", self.scalar_type());
    return out;
  }
  return unary_out<TPURT_EW_ABS>(self, out);
}

at::Tensor& k_sign_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(!self.is_complex(), "Unlike NumPy, torch.sign is not intended to support complex numbers. Please use "
                                  "torch.sgn instead.");
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, iter.common_dtype() == at::kBool ? TPURT_EW_ABS : TPURT_EW_SIGN, "sign");
  return out;
}

// floor / ceil / trunc / round are defined for numbers, not for booleans (as on the CPU)
void check_rounding(const at::Tensor& self, const char* name) {
  TORCH_CHECK_NOT_IMPLEMENTED(self.scalar_type() != at::kBool, "\"", name, "\" not implemented for 'Bool'");
}
template <tpurt_ew_op OP>
at::Tensor& rounding_out(const at::Tensor& self, at::Tensor& out) {
  check_rounding(self, tpurt_ew_op_name(OP));
  return unary_out<OP>(self, out);
}
at::Tensor& k_round_decimals_out(const at::Tensor& self, int64_t decimals, at::Tensor& out) {
  check_rounding(self, "round");
  auto iter = at::TensorIterator::unary_op(out, self);
  TORCH_CHECK_NOT_IMPLEMENTED(decimals == 0 || !at::isIntegralType(iter.common_dtype(), true),
                              "\"round_cpu\" not implemented for '", iter.common_dtype(), "'");
  run_op(iter, TPURT_EW_ROUND, "round", iter.common_dtype(), static_cast<double>(decimals));
  return out;
}
at::Tensor& k_round_out(const at::Tensor& self, at::Tensor& out) { return k_round_decimals_out(self, 0, out); }

at::Tensor& k_frac_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()), "\"frac_cpu\" not implemented for '",
                              self.scalar_type(), "'");
  return unary_out<TPURT_EW_FRAC>(self, out);
}

at::Tensor k_isnan(const at::Tensor& self) {
  at::Tensor out;
  auto iter = make_pred_iter(out, self);
  run_op(iter, TPURT_EW_ISNAN, "isnan", self.scalar_type());
  return iter.output();
}
template <tpurt_ew_op OP>
at::Tensor& pred_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(!self.is_complex(), tpurt_ew_op_name(OP), " does not support complex inputs.");
  TORCH_CHECK(out.scalar_type() == at::kBool, tpurt_ew_op_name(OP), " does not support non-boolean outputs.");
  at::native::resize_output(out, self.sizes());
  auto iter = make_pred_iter(out, self);
  run_op(iter, OP, tpurt_ew_op_name(OP), self.scalar_type());
  return out;
}

at::Tensor& k_nan_to_num_out(const at::Tensor& self, std::optional<double> nan, std::optional<double> posinf,
                           std::optional<double> neginf, at::Tensor& out) {
  TORCH_CHECK(self.scalar_type() == out.scalar_type(), "nan_to_num: dtype of out: ", out.scalar_type(),
              " should be same as input: ", self.scalar_type());
  at::native::resize_output(out, self.sizes());
  auto iter = at::TensorIterator::unary_op(out, self);
  double hi, lo;
  switch (self.scalar_type()) {
    case at::kHalf: hi = 65504.0; break;
    case at::kBFloat16: hi = static_cast<double>(std::numeric_limits<c10::BFloat16>::max()); break;
    case at::kFloat: hi = std::numeric_limits<float>::max(); break;
    default: hi = std::numeric_limits<double>::max(); break;
  }
  lo = -hi;
  run_op(iter, TPURT_EW_NAN_TO_NUM, "nan_to_num", iter.common_dtype(), nan.value_or(0.0), posinf.value_or(hi),
         neginf.value_or(lo));
  return out;
}
at::Tensor k_nan_to_num(const at::Tensor& self, std::optional<double> nan, std::optional<double> posinf,
                      std::optional<double> neginf) {
  at::Tensor out = at::empty_like(self);
  return k_nan_to_num_out(self, nan, posinf, neginf, out);
}
at::Tensor& k_nan_to_num_(at::Tensor& self, std::optional<double> nan, std::optional<double> posinf,
                        std::optional<double> neginf) {
  return k_nan_to_num_out(self, nan, posinf, neginf, self);
}

at::Tensor& k_logit_out(const at::Tensor& self, std::optional<double> eps, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_float_op(out, self);
  double e = eps.value_or(-1.0);
  run_op(iter, TPURT_EW_LOGIT, "logit", iter.common_dtype(), e, e >= 0 ? 1.0 : 0.0);
  return out;
}
at::Tensor k_logit(const at::Tensor& self, std::optional<double> eps) {
  at::Tensor out;
  auto iter = at::TensorIterator::unary_float_op(out, self);
  double e = eps.value_or(-1.0);
  run_op(iter, TPURT_EW_LOGIT, "logit", iter.common_dtype(), e, e >= 0 ? 1.0 : 0.0);
  return iter.output();
}
at::Tensor& k_logit_(at::Tensor& self, std::optional<double> eps) { return k_logit_out(self, eps, self); }

// ------------------------------------------------------------ activations

at::Tensor k_relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  at::Tensor out;
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, TPURT_EW_RELU, "relu");
  return iter.output();
}
at::Tensor& k_relu_(at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  return unary_out<TPURT_EW_RELU>(self, self);
}

at::Tensor& k_gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "approximate argument must be either none or tanh.");
  run_op(iter, approximate == "tanh" ? TPURT_EW_GELU_TANH : TPURT_EW_GELU, "gelu");
  return out;
}
at::Tensor& k_gelu_backward_out(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate,
                              at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  run_op(iter, approximate == "tanh" ? TPURT_EW_GELU_TANH_BACKWARD : TPURT_EW_GELU_BACKWARD, "gelu_backward");
  return grad_input;
}

// log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)): a five-instruction
// program (stable for large |x|). Like CUDA's kernel, it needs no buffer
// for the backward: the returned buffer is empty.
at::Tensor& log_sigmoid_run(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()), "\"log_sigmoid\" not implemented for '",
                              self.scalar_type(), "'");
  auto iter = at::TensorIterator::unary_float_op(out, self);
  check_tpu(iter, "log_sigmoid_forward");
  Prog pr(iter.common_dtype());
  int x = load_inputs(pr, iter)[0];
  int e = pr.emit(TPURT_EW_EXP, {pr.emit(TPURT_EW_NEG, {pr.emit(TPURT_EW_ABS, {x})})});
  int lo = pr.emit(TPURT_EW_MINIMUM, {x, pr.emit(TPURT_EW_CONST, {}, 0.0)});
  int o = pr.emit(TPURT_EW_SUB, {lo, pr.emit(TPURT_EW_LOG1P, {e})}, 1.0);
  launch(pr, iter, {o}, "log_sigmoid_forward");
  return out;
}
std::tuple<at::Tensor&, at::Tensor&> k_log_sigmoid_forward_out(const at::Tensor& self, at::Tensor& output,
                                                               at::Tensor& buffer) {
  log_sigmoid_run(self, output);
  buffer.resize_({0});
  return {output, buffer};
}
std::tuple<at::Tensor, at::Tensor> k_log_sigmoid_forward(const at::Tensor& self) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()), "\"log_sigmoid\" not implemented for '",
                              self.scalar_type(), "'");
  // contiguous whatever the input's layout, as the CPU backend's kernel allocates it (an as_strided view of
  // the result then reads the same elements: fuzz seed 97583)
  at::Tensor output = at::empty(self.sizes(), self.options());
  log_sigmoid_run(self, output);
  return {output, at::empty({0}, self.options())};
}
// d/dx log_sigmoid(x) = sigmoid(-x)
at::Tensor& k_log_sigmoid_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& buffer,
                                       at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  check_tpu(iter, "log_sigmoid_backward");
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);
  int o = pr.emit(TPURT_EW_MUL, {r[0], pr.emit(TPURT_EW_SIGMOID, {pr.emit(TPURT_EW_NEG, {r[1]})})});
  launch(pr, iter, {o}, "log_sigmoid_backward");
  return grad_input;
}
at::Tensor k_log_sigmoid_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& buffer) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, grad, self);
  at::Tensor grad_input = iter.output();
  return k_log_sigmoid_backward_out(grad, self, buffer, grad_input);
}

template <tpurt_ew_op OP>
at::Tensor& backward_out(const at::Tensor& grad, const at::Tensor& x, at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, x);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return grad_input;
}
template <tpurt_ew_op OP>
at::Tensor backward_fn(const at::Tensor& grad, const at::Tensor& x) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, grad, x);
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return iter.output();
}

at::Tensor& k_softplus_out(const at::Tensor& self, const c10::Scalar& beta, const c10::Scalar& threshold,
                         at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, TPURT_EW_SOFTPLUS, "softplus", iter.common_dtype(), beta.toDouble(), threshold.toDouble());
  return out;
}
at::Tensor& k_softplus_backward_out(const at::Tensor& grad, const at::Tensor& self, const c10::Scalar& beta,
                                  const c10::Scalar& threshold, at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  run_op(iter, TPURT_EW_SOFTPLUS_BACKWARD, "softplus_backward", iter.common_dtype(), beta.toDouble(),
         threshold.toDouble());
  return grad_input;
}

at::Tensor& k_leaky_relu_out(const at::Tensor& self, const c10::Scalar& slope, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, TPURT_EW_LEAKY_RELU, "leaky_relu", iter.common_dtype(), slope.toDouble());
  return out;
}
at::Tensor& k_leaky_relu_backward_out(const at::Tensor& grad, const at::Tensor& self, const c10::Scalar& slope,
                                    bool self_is_result, at::Tensor& grad_input) {
  TORCH_CHECK(!self_is_result || slope.toDouble() >= 0.0,
              "In-place leakyReLu backward calculation is triggered with a negative slope which is not supported. "
              "This is caused by calling in-place forward function with a negative slope, please call out-of-place "
              "version instead. File an issue at https://github.com/pytorch/pytorch if you do require supporting "
              "in-place leakRelu backward calculation with negative slope");
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  run_op(iter, TPURT_EW_LEAKY_RELU_BACKWARD, "leaky_relu_backward", iter.common_dtype(), slope.toDouble());
  return grad_input;
}

at::Tensor& k_hardtanh_out(const at::Tensor& self, const c10::Scalar& lo, const c10::Scalar& hi, at::Tensor& out) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Bool inputs not supported for hardtanh");
  TORCH_CHECK(self.scalar_type() != at::kByte || (lo.toLong() >= 0 && hi.toLong() >= 0),
              "cannot do hardtanh on an unsigned type with negative limits");
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, TPURT_EW_HARDTANH, "hardtanh", iter.common_dtype(), lo.toDouble(), hi.toDouble());
  return out;
}
at::Tensor k_hardtanh(const at::Tensor& self, const c10::Scalar& lo, const c10::Scalar& hi) {
  at::Tensor out = at::empty_like(self);
  return k_hardtanh_out(self, lo, hi, out);
}
at::Tensor& k_hardtanh_(at::Tensor& self, const c10::Scalar& lo, const c10::Scalar& hi) {
  return k_hardtanh_out(self, lo, hi, self);
}
at::Tensor& k_hardtanh_backward_out(const at::Tensor& grad, const at::Tensor& self, const c10::Scalar& lo,
                                  const c10::Scalar& hi, at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  run_op(iter, TPURT_EW_HARDTANH_BACKWARD, "hardtanh_backward", iter.common_dtype(), lo.toDouble(), hi.toDouble());
  return grad_input;
}
at::Tensor k_hardtanh_backward(const at::Tensor& grad, const at::Tensor& self, const c10::Scalar& lo,
                             const c10::Scalar& hi) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, grad, self);
  run_op(iter, TPURT_EW_HARDTANH_BACKWARD, "hardtanh_backward", iter.common_dtype(), lo.toDouble(), hi.toDouble());
  return iter.output();
}

at::Tensor& k_elu_out(const at::Tensor& self, const c10::Scalar& alpha, const c10::Scalar& scale,
                    const c10::Scalar& input_scale, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, TPURT_EW_ELU, "elu", iter.common_dtype(), alpha.toDouble(), scale.toDouble(), input_scale.toDouble());
  return out;
}
at::Tensor& k_elu_backward_out(const at::Tensor& grad, const c10::Scalar& alpha, const c10::Scalar& scale,
                             const c10::Scalar& input_scale, bool is_result, const at::Tensor& self_or_result,
                             at::Tensor& grad_input) {
  TORCH_CHECK(!is_result || alpha.toDouble() >= 0.0,
              "In-place elu backward calculation is triggered with a negative slope which is not supported. This is "
              "caused by calling in-place forward function with a negative slope, please call out-of-place version "
              "instead.");
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self_or_result);
  run_op(iter, TPURT_EW_ELU_BACKWARD, "elu_backward", iter.common_dtype(), alpha.toDouble(), scale.toDouble(),
         input_scale.toDouble(), is_result ? 1.0 : 0.0);
  return grad_input;
}

at::Tensor k_hardswish(const at::Tensor& self) {
  at::Tensor out;
  auto iter = at::TensorIterator::unary_op(out, self);
  run_op(iter, TPURT_EW_HARDSWISH, "hardswish");
  return iter.output();
}
at::Tensor& k_hardswish_(at::Tensor& self) { return unary_out<TPURT_EW_HARDSWISH>(self, self); }

at::Tensor& k_threshold_out(const at::Tensor& self, const c10::Scalar& threshold, const c10::Scalar& value,
                          at::Tensor& out) {
  auto iter = make_iter(out, {self, self});
  refuse_bool(iter, "threshold_cpu");
  run_op(iter, TPURT_EW_THRESHOLD_BACKWARD, "threshold", iter.common_dtype(), threshold.toDouble(),
         value.toDouble());
  return out;
}
at::Tensor& k_threshold_backward_out(const at::Tensor& grad, const at::Tensor& self, const c10::Scalar& threshold,
                                   at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  run_op(iter, TPURT_EW_THRESHOLD_BACKWARD, "threshold_backward", iter.common_dtype(), threshold.toDouble(), 0.0);
  return grad_input;
}

// --------------------------------------------------------------- ternary

at::Tensor& k_where_out(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  TORCH_CHECK(cond.scalar_type() == at::kBool || cond.scalar_type() == at::kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ", cond.scalar_type());
  at::ScalarType rt = at::result_type(self, other);
  TORCH_CHECK(!out.defined() || out.scalar_type() == rt, "Expected out type to be ", rt, " but got ",
              out.scalar_type());
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(false).allow_cpu_scalars(true);
  if (!out.defined()) cfg.declare_static_dtype(rt);
  cfg.add_owned_output(out).add_owned_const_input(cond).add_owned_const_input(self).add_owned_const_input(other);
  auto iter = cfg.build();
  run_op(iter, TPURT_EW_WHERE, "where", rt);
  return out;
}
at::Tensor k_where(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(cond.scalar_type() == at::kBool || cond.scalar_type() == at::kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ", cond.scalar_type());
  at::ScalarType rt = at::result_type(self, other);
  at::Tensor out;
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(false).allow_cpu_scalars(true).declare_static_dtype(rt);
  cfg.add_owned_output(out).add_owned_const_input(cond).add_owned_const_input(self).add_owned_const_input(other);
  auto iter = cfg.build();
  run_op(iter, TPURT_EW_WHERE, "where", rt);
  return iter.output();
}

// masked_fill / masked_fill_: one program out = where(mask, value, self) —
// no clone + in-place pass, and DeferAndFuse fuses it with its producers
// (e.g. attention's scale -> mask -> softmax input). The value is converted
// to self's dtype first, as PyTorch does (bool: != 0, integers truncate).
void masked_fill_run(const at::Tensor& out, const at::Tensor& self, const at::Tensor& mask_in,
                     const c10::Scalar* value, const at::Tensor* value_t) {
  TORCH_CHECK(mask_in.scalar_type() == at::kBool || mask_in.scalar_type() == at::kByte,
              "masked_fill_ only supports boolean masks, but got mask with dtype ", mask_in.scalar_type());
  if (value_t)
    TORCH_CHECK(value_t->dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
                value_t->dim(), " dimension(s).");
  at::Tensor mask = mask_in.device() == self.device() ? mask_in : mask_in.to(self.device());
  at::ScalarType st = self.scalar_type();
  at::TensorIteratorConfig cfg;
  cfg.check_all_same_dtype(false).resize_outputs(false).set_check_mem_overlap(true);
  cfg.add_output(out).add_const_input(self).add_const_input(mask);
  bool vt_on_device = value_t && value_t->device().type() == kTpu;
  if (vt_on_device) cfg.add_const_input(*value_t);
  auto iter = cfg.build();
  check_tpu(iter, "masked_fill_");
  Prog pr(st);
  int x = pr.load(iter_view(iter, 1)), m = pr.load(iter_view(iter, 2)), v;
  if (vt_on_device) {
    v = pr.load(iter_view(iter, 3));
  } else {
    c10::Scalar s = value_t ? value_t->item() : *value;
    if (st == at::kBool)
      s = s.toBool();
    else if (at::isIntegralType(st, false))
      s = s.toLong();
    else if (!at::isComplexType(st) && s.isComplex())
      s = s.toComplexDouble().real();
    v = pr.scalar(s);
  }
  launch(pr, iter, {pr.emit(TPURT_EW_WHERE, {m, v, x})}, "masked_fill_");
}

at::Tensor& masked_fill_in_place(at::Tensor& self, const at::Tensor& mask, const c10::Scalar* value,
                                 const at::Tensor* value_t) {
  TORCH_CHECK(at::is_expandable_to(mask.sizes(), self.sizes()), "The size of the mask ", mask.sizes(),
              " must match the size of the tensor ", self.sizes(), " for in-place masked_fill_");
  masked_fill_run(self, self, mask, value, value_t);
  return self;
}
at::Tensor& k_masked_fill_(at::Tensor& self, const at::Tensor& mask, const c10::Scalar& value) {
  return masked_fill_in_place(self, mask, &value, nullptr);
}
at::Tensor& k_masked_fill_t_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  return masked_fill_in_place(self, mask, nullptr, &value);
}
at::Tensor masked_fill_out_of_place(const at::Tensor& self, const at::Tensor& mask, const c10::Scalar* value,
                                    const at::Tensor* value_t) {
  c10::DeviceGuard g(self.device());
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  // contiguous whatever self's layout, as the CPU backend's clone(Contiguous) makes it (a view of the
  // result that the CPU allows must work here too: fuzz seed 99852)
  at::Tensor out = at::empty(shape, self.options());
  masked_fill_run(out, self.expand(shape), mask.expand(shape), value, value_t);
  return out;
}
at::Tensor k_masked_fill(const at::Tensor& self, const at::Tensor& mask, const c10::Scalar& value) {
  return masked_fill_out_of_place(self, mask, &value, nullptr);
}
at::Tensor k_masked_fill_t(const at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  return masked_fill_out_of_place(self, mask, nullptr, &value);
}

void clamp_run(at::TensorIterator& iter, bool has_lo, bool has_hi, const char* name) {
  check_tpu(iter, name);
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);
  int o;
  if (has_lo && has_hi)
    o = pr.emit(TPURT_EW_CLAMP, {r[0], r[1], r[2]});
  else if (has_lo)
    o = pr.emit(TPURT_EW_MAXIMUM, {r[0], r[1]});
  else
    o = pr.emit(TPURT_EW_MINIMUM, {r[0], r[1]});
  launch(pr, iter, {o}, name);
}

at::Tensor& k_clamp_out(const at::Tensor& self, const std::optional<c10::Scalar>& lo,
                        const std::optional<c10::Scalar>& hi, at::Tensor& out) {
  TORCH_CHECK(lo.has_value() || hi.has_value(), "torch.clamp: At least one of 'min' or 'max' must not be None");
  TORCH_CHECK(!self.is_complex(), "clamp is not supported for complex types");
  // promotion over (self, min, max); both bounds become launch scalars
  at::native::ResultTypeState st{};
  st = at::native::update_result_type_state(self, st);
  if (lo) st = at::native::update_result_type_state(*lo, st);
  if (hi) st = at::native::update_result_type_state(*hi, st);
  at::ScalarType rt = at::native::result_type(st);
  if (out.defined()) {
    TORCH_CHECK(c10::canCast(rt, out.scalar_type()), "result type ", rt, " can't be cast to the desired output type ",
                out.scalar_type());
    at::native::resize_output(out, self.sizes());
  }
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(false);
  if (!out.defined()) cfg.declare_static_dtype(rt);
  cfg.add_owned_output(out).add_owned_const_input(self);
  auto iter = cfg.build();
  check_tpu(iter, "clamp");
  Prog pr(rt);
  int x = load_inputs(pr, iter)[0], o;
  if (lo && hi)
    o = pr.emit(TPURT_EW_CLAMP, {x, pr.operand_scalar(*lo), pr.operand_scalar(*hi)});
  else if (lo)
    o = pr.emit(TPURT_EW_MAXIMUM, {x, pr.operand_scalar(*lo)});
  else
    o = pr.emit(TPURT_EW_MINIMUM, {x, pr.operand_scalar(*hi)});
  launch(pr, iter, {o}, "clamp");
  return out;
}
at::Tensor& k_clamp_tensor_out(const at::Tensor& self, const std::optional<at::Tensor>& lo,
                             const std::optional<at::Tensor>& hi, at::Tensor& out) {
  bool hl = lo.has_value() && lo->defined(), hh = hi.has_value() && hi->defined();
  TORCH_CHECK(hl || hh, "torch.clamp: At least one of 'min' or 'max' must not be None");
  TORCH_CHECK(!self.is_complex(), "clamp is not supported for complex types");
  auto iter = hl && hh ? make_iter(out, {self, *lo, *hi}) : hl ? make_iter(out, {self, *lo}) : make_iter(out, {self, *hi});
  clamp_run(iter, hl, hh, "clamp");
  return out;
}
at::Tensor& k_clamp_min_out(const at::Tensor& self, const c10::Scalar& lo, at::Tensor& out) {
  return k_clamp_out(self, lo, std::nullopt, out);
}
at::Tensor& k_clamp_max_out(const at::Tensor& self, const c10::Scalar& hi, at::Tensor& out) {
  return k_clamp_out(self, std::nullopt, hi, out);
}
at::Tensor& k_clamp_min_tensor_out(const at::Tensor& self, const at::Tensor& lo, at::Tensor& out) {
  return k_clamp_tensor_out(self, lo, std::nullopt, out);
}
at::Tensor& k_clamp_max_tensor_out(const at::Tensor& self, const at::Tensor& hi, at::Tensor& out) {
  return k_clamp_tensor_out(self, std::nullopt, hi, out);
}

void check_lerp(const at::Tensor& self) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()),
                              "\"lerp\" not implemented for '", self.scalar_type(), "'");
}
at::Tensor& k_lerp_scalar_out(const at::Tensor& self, const at::Tensor& end, const c10::Scalar& weight, at::Tensor& out) {
  TORCH_CHECK(self.dtype() == end.dtype(), "expected dtype ", self.dtype(), " for `end` but got dtype ", end.dtype());
  check_lerp(self);
  auto iter = make_iter(out, {self, end, wrap(weight)});
  run_op(iter, TPURT_EW_LERP, "lerp", self.scalar_type());
  return out;
}
at::Tensor& k_lerp_tensor_out(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight, at::Tensor& out) {
  TORCH_CHECK(self.dtype() == end.dtype(), "expected dtype ", self.dtype(), " for `end` but got dtype ", end.dtype());
  TORCH_CHECK(self.dtype() == weight.dtype(), "expected dtype ", self.dtype(), " for `weight` but got dtype ",
              weight.dtype());
  check_lerp(self);
  auto iter = make_iter(out, {self, end, weight});
  run_op(iter, TPURT_EW_LERP, "lerp", self.scalar_type());
  return out;
}

at::Tensor& k_addcmul_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const c10::Scalar& value,
                        at::Tensor& out) {
  auto iter = make_iter(out, {self, t1, t2});
  TORCH_CHECK_NOT_IMPLEMENTED(iter.common_dtype() != at::kBool, "\"addcmul\" not implemented for 'Bool'");
  TORCH_CHECK(!value.isComplex() || iter.common_dtype() == at::kComplexFloat ||
                  iter.common_dtype() == at::kComplexDouble,
              "addcmul: complex value needs complex tensors");
  run_op(iter, TPURT_EW_ADDCMUL, "addcmul", iter.common_dtype(),
         value.isIntegral(true) ? static_cast<double>(value.toLong()) : value.toDouble());
  return out;
}
at::Tensor& k_addcdiv_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const c10::Scalar& value,
                        at::Tensor& out) {
  TORCH_CHECK(!(at::isIntegralType(t1.scalar_type(), true) && at::isIntegralType(t2.scalar_type(), true)),
              "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a "
              "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + "
              "value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * "
              "tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: "
              "(input + value * tensor1 / tensor2), for all dtypes.");
  auto iter = make_iter(out, {self, t1, t2});
  run_op(iter, TPURT_EW_ADDCDIV, "addcdiv", iter.common_dtype(), value.toDouble());
  return out;
}


// ----------------------------------------------- special functions & co.
// Each is one instruction of the engine (computed in double inside the
// instruction for f32/f16/bf16 data, rounded once at the store).

// Only floating (and, where CPU allows, integer) compute types.
void float_only(const at::TensorIteratorBase& iter, const char* name) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(iter.common_dtype()), "\"", name, "_cpu\" not implemented for '",
                              iter.common_dtype(), "'");
}

template <tpurt_ew_op OP>
at::Tensor& binary_float_only_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  float_only(iter, tpurt_ew_op_name(OP));
  run_op(iter, OP, tpurt_ew_op_name(OP));
  return out;
}

at::Tensor& k_polygamma_out(int64_t n, const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "polygamma(n, x) does not support negative n.");
  auto iter = at::TensorIterator::unary_float_op(out, self);
  run_op(iter, TPURT_EW_POLYGAMMA, "polygamma", iter.common_dtype(), static_cast<double>(n));
  return out;
}

at::Tensor& k_signbit_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(!self.is_complex(), "signbit is not implemented for complex tensors.");
  TORCH_CHECK(!out.defined() || out.scalar_type() == at::kBool, "signbit does not support non-boolean outputs.");
  at::native::resize_output(out, self.sizes());
  auto iter = make_pred_iter(out, self);
  if (self.scalar_type() == at::kBool) {
    // never negative
    check_tpu(iter, "signbit");
    Prog pr(TPURT_I64);
    load_inputs(pr, iter);
    launch(pr, iter, {pr.emit(TPURT_EW_CONST, {}, 0.0)}, "signbit");
    return out;
  }
  run_op(iter, TPURT_EW_SIGNBIT, "signbit", self.scalar_type());
  return out;
}

at::Tensor& k_heaviside_out(const at::Tensor& self, const at::Tensor& values, at::Tensor& out) {
  TORCH_CHECK(!self.is_complex() && !values.is_complex() && (!out.defined() || !out.is_complex()),
              "heaviside is not yet implemented for complex tensors.");
  TORCH_CHECK(self.dtype() == values.dtype(), "heaviside is not yet implemented for tensors with different dtypes");
  auto iter = at::TensorIterator::binary_op(out, self, values);
  run_op(iter, TPURT_EW_HEAVISIDE, "heaviside");
  return out;
}

at::Tensor& k_nextafter_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto iter = at::TensorIterator::binary_op(out, self, other);
  float_only(iter, "nextafter");
  at::ScalarType ct = iter.common_dtype();
  double via = ct == at::kHalf ? TPURT_F16 : ct == at::kBFloat16 ? TPURT_BF16 : 0;
  run_op(iter, TPURT_EW_NEXTAFTER, "nextafter", ct, via);
  return out;
}

// frexp: mantissa (self's dtype) and exponent (int32) from one program
std::tuple<at::Tensor&, at::Tensor&> k_frexp_out(const at::Tensor& self, at::Tensor& mantissa, at::Tensor& exponent) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "torch.frexp() only supports floating-point dtypes");
  TORCH_CHECK(mantissa.dtype() == self.dtype(), "torch.frexp() expects mantissa to have dtype ", self.dtype(),
              " but got ", mantissa.dtype());
  TORCH_CHECK(exponent.dtype() == at::kInt, "torch.frexp() expects exponent to have int dtype but got ",
              exponent.dtype());
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(false);
  cfg.add_output(mantissa).add_output(exponent).add_const_input(self);
  auto iter = cfg.build();
  check_tpu(iter, "frexp");
  Prog pr(self.scalar_type());
  int x = load_inputs(pr, iter)[0];
  int m = pr.emit(TPURT_EW_FREXP_MANTISSA, {x});
  int e = pr.emit(TPURT_EW_FREXP_EXPONENT, {x});
  launch(pr, iter, {m, e}, "frexp");
  return {mantissa, exponent};
}

// rsub(self, other, alpha) = other - alpha * self
at::Tensor k_rsub(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  sub_check(self, other);
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, other, self);
  alpha_check(iter.common_dtype(), alpha);
  check_tpu(iter, "rsub");
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);
  int b = r[1];
  bool unit = !alpha.isComplex() && (alpha.isIntegral(true) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0);
  if (!unit) b = pr.emit(TPURT_EW_MUL, {b, pr.scalar(alpha)});
  int o = pr.emit(TPURT_EW_SUB, {r[0], b}, 1.0);
  launch(pr, iter, {o}, "rsub");
  return iter.output();
}

// angle: real inputs give 0 or pi (integers promoted to float), complex the
// argument as a real tensor
at::Tensor& k_angle_out(const at::Tensor& self, at::Tensor& out) {
  if (self.is_complex()) {
    at::ScalarType rt = c10::toRealValueType(self.scalar_type());
    TORCH_CHECK(out.scalar_type() == rt, "angle(): expected out tensor to have dtype ", rt, " but got ",
                out.scalar_type());
    at::native::resize_output(out, self.sizes());
    at::TensorIteratorConfig cfg;
    cfg.set_check_mem_overlap(true).check_all_same_dtype(false).add_output(out).add_const_input(self);
    auto iter = cfg.build();
    run_op(iter, TPURT_EW_ANGLE, "angle", self.scalar_type());
    return out;
  }
  auto iter = at::TensorIterator::unary_float_op(out, self);
  run_op(iter, TPURT_EW_ANGLE, "angle");
  return out;
}
at::Tensor k_angle(const at::Tensor& self) {
  if (self.is_complex()) {
    at::Tensor out = at::empty({0}, self.options().dtype(c10::toRealValueType(self.scalar_type())));
    return k_angle_out(self, out);
  }
  at::Tensor out;
  auto iter = at::TensorIterator::unary_float_op(out, self);
  run_op(iter, TPURT_EW_ANGLE, "angle");
  return iter.output();
}

// complex(real, imag) and polar(abs, angle): real inputs of one float dtype,
// complex output of the matching dtype
at::Tensor& complex_like_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, tpurt_ew_op op,
                             const char* name) {
  auto ta = a.scalar_type(), tb = b.scalar_type();
  TORCH_CHECK(ta == tb, "Expected object of scalar type ", ta, " but got scalar type ", tb, " for second argument");
  TORCH_CHECK(ta == at::kFloat || ta == at::kDouble || ta == at::kHalf,
              "Expected both inputs to be Half, Float or Double tensors but got ", ta, " and ", tb);
  at::ScalarType ct = c10::toComplexType(ta);
  TORCH_CHECK(out.scalar_type() == ct, "Expected object of scalar type ", ct, " but got scalar type ",
              out.scalar_type(), " for argument 'out'");
  TORCH_CHECK_NOT_IMPLEMENTED(ta != at::kHalf, name, ": complex32 is not supported on TPU");
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(false).add_output(out).add_const_input(a).add_const_input(b);
  auto iter = cfg.build();
  run_op(iter, op, name, ct);
  return out;
}
at::Tensor& k_complex_out(const at::Tensor& re, const at::Tensor& im, at::Tensor& out) {
  return complex_like_out(re, im, out, TPURT_EW_COMPLEX, "complex");
}
at::Tensor& k_polar_out(const at::Tensor& abs, const at::Tensor& angle, at::Tensor& out) {
  return complex_like_out(abs, angle, out, TPURT_EW_POLAR, "polar");
}

// hardshrink / softshrink and their backward
at::Tensor& k_hardshrink_out(const at::Tensor& self, const c10::Scalar& lambd, at::Tensor& out) {
  auto iter = at::TensorIterator::unary_op(out, self);
  float_only(iter, "hardshrink");
  run_op(iter, TPURT_EW_HARDSHRINK, "hardshrink", iter.common_dtype(), lambd.toDouble());
  return out;
}
at::Tensor& k_softshrink_out(const at::Tensor& self, const c10::Scalar& lambd, at::Tensor& out) {
  TORCH_CHECK(lambd.toDouble() >= 0, "lambda must be greater or equal to 0, but found to be ", lambd.toDouble(), ".");
  auto iter = at::TensorIterator::unary_op(out, self);
  float_only(iter, "softshrink");
  run_op(iter, TPURT_EW_SOFTSHRINK, "softshrink", iter.common_dtype(), lambd.toDouble());
  return out;
}
at::Tensor& k_shrink_backward_out(const at::Tensor& grad, const at::Tensor& self, const c10::Scalar& lambd,
                                  at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  float_only(iter, "shrink_backward");
  run_op(iter, TPURT_EW_SHRINK_BACKWARD, "shrink_backward", iter.common_dtype(), lambd.toDouble());
  return grad_input;
}

at::Tensor& k_logit_backward_out(const at::Tensor& grad, const at::Tensor& self, std::optional<double> eps,
                                 at::Tensor& grad_input) {
  auto iter = at::TensorIterator::binary_op(grad_input, grad, self);
  float_only(iter, "logit_backward");
  run_op(iter, TPURT_EW_LOGIT_BACKWARD, "logit_backward", iter.common_dtype(), eps ? *eps : -1.0);
  return grad_input;
}
at::Tensor k_logit_backward(const at::Tensor& grad, const at::Tensor& self, std::optional<double> eps) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, grad, self);
  float_only(iter, "logit_backward");
  run_op(iter, TPURT_EW_LOGIT_BACKWARD, "logit_backward", iter.common_dtype(), eps ? *eps : -1.0);
  return iter.output();
}

// glu: a * sigmoid(b) over the two halves of dim
std::pair<at::Tensor, at::Tensor> glu_halves(const at::Tensor& self, int64_t dim) {
  TORCH_CHECK(self.dim() > 0, "glu does not support scalars because halving size must be even");
  int64_t wd = at::maybe_wrap_dim(dim, self.dim());
  int64_t n = self.size(wd);
  TORCH_CHECK(n % 2 == 0, "Halving dimension must be even, but dimension ", wd, " is size ", n);
  return {self.narrow(wd, 0, n / 2), self.narrow(wd, n / 2, n / 2)};
}
at::Tensor& k_glu_out(const at::Tensor& self, int64_t dim, at::Tensor& out) {
  auto [a, b] = glu_halves(self, dim);
  auto iter = at::TensorIterator::binary_op(out, a, b);
  float_only(iter, "glu");
  check_tpu(iter, "glu");
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);
  int o = pr.emit(TPURT_EW_MUL, {r[0], pr.emit(TPURT_EW_SIGMOID, {r[1]})});
  launch(pr, iter, {o}, "glu");
  return out;
}
at::Tensor& k_glu_backward_out(const at::Tensor& grad, const at::Tensor& self, int64_t dim, at::Tensor& grad_input) {
  auto [a, b] = glu_halves(self, dim);
  at::native::resize_output(grad_input, self.sizes());
  int64_t wd = at::maybe_wrap_dim(dim, self.dim());
  int64_t h = self.size(wd) / 2;
  at::Tensor ga = grad_input.narrow(wd, 0, h), gb = grad_input.narrow(wd, h, h);
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).check_all_same_dtype(true);
  cfg.add_output(ga).add_output(gb).add_const_input(a).add_const_input(b).add_const_input(grad);
  auto iter = cfg.build();
  float_only(iter, "glu_backward");
  check_tpu(iter, "glu_backward");
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);  // a, b, grad
  int s = pr.emit(TPURT_EW_SIGMOID, {r[1]});
  int oa = pr.emit(TPURT_EW_MUL, {r[2], s});
  int one_minus = pr.emit(TPURT_EW_SUB, {pr.emit(TPURT_EW_CONST, {}, 1.0), s}, 1.0);
  int ob = pr.emit(TPURT_EW_MUL, {pr.emit(TPURT_EW_MUL, {oa, r[0]}), one_minus});
  launch(pr, iter, {oa, ob}, "glu_backward");
  return grad_input;
}
at::Tensor k_glu_backward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  at::Tensor gi = at::empty_like(self, at::MemoryFormat::Contiguous);
  return k_glu_backward_out(grad, self, dim, gi);
}

// PReLU (weight already broadcastable to self)
at::Tensor k_prelu_kernel(const at::Tensor& self, const at::Tensor& weight) {
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, self, weight);
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(iter.common_dtype()), "\"prelu_cpu\" not implemented for '",
                              iter.common_dtype(), "'");
  check_tpu(iter, "_prelu_kernel");
  Prog pr(iter.common_dtype());
  auto r = load_inputs(pr, iter);
  int pos = pr.emit(TPURT_EW_GT, {r[0], pr.emit(TPURT_EW_CONST, {}, 0.0)});
  int o = pr.emit(TPURT_EW_WHERE, {pos, r[0], pr.emit(TPURT_EW_MUL, {r[1], r[0]})});
  launch(pr, iter, {o}, "_prelu_kernel");
  return iter.output();
}
std::tuple<at::Tensor, at::Tensor> k_prelu_kernel_backward(const at::Tensor& grad, const at::Tensor& self,
                                                           const at::Tensor& weight) {
  at::Tensor gi, gw;
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(true).promote_inputs_to_common_dtype(true).cast_common_dtype_to_outputs(true);
  cfg.add_output(gi).add_output(gw).add_const_input(self).add_const_input(weight).add_const_input(grad);
  auto iter = cfg.build();
  if (iter.numel() > 0) {
    check_tpu(iter, "_prelu_kernel_backward");
    Prog pr(iter.common_dtype());
    auto r = load_inputs(pr, iter);  // x, w, g
    int zero = pr.emit(TPURT_EW_CONST, {}, 0.0);
    int pos = pr.emit(TPURT_EW_GT, {r[0], zero});
    int oi = pr.emit(TPURT_EW_WHERE, {pos, r[2], pr.emit(TPURT_EW_MUL, {r[1], r[2]})});
    int ow = pr.emit(TPURT_EW_WHERE, {pos, zero, pr.emit(TPURT_EW_MUL, {r[0], r[2]})});
    launch(pr, iter, {oi, ow}, "_prelu_kernel_backward");
  }
  return {iter.output(0), iter.output(1)};
}

// RReLU with noise: training draws slopes uniform(lower, upper) on the
// device generator for the non-positive elements (noise = 1 elsewhere);
// evaluation is leaky_relu with the mean slope.
at::Tensor& k_rrelu_with_noise_out(const at::Tensor& self, at::Tensor& noise, const c10::Scalar& lower,
                                   const c10::Scalar& upper, bool training, std::optional<at::Generator> gen,
                                   at::Tensor& out) {
  double lo = lower.toDouble(), hi = upper.toDouble();
  TORCH_CHECK(lo <= hi, "Lower bound should be less than or equal to the upper bound");
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(self.scalar_type()), "\"rrelu_with_noise_out_cpu\" not implemented for '",
                              self.scalar_type(), "'");
  if (!training) return k_leaky_relu_out(self, (lo + hi) / 2.0, out);
  TORCH_CHECK(noise.sizes() == self.sizes(), "rrelu_with_noise: noise of shape ", noise.sizes(),
              " does not match the input's shape ", self.sizes());
  at::native::resize_output(out, self.sizes());
  noise.uniform_(lo, hi, gen);
  at::TensorIteratorConfig cfg;
  cfg.set_check_mem_overlap(false).check_all_same_dtype(false);
  cfg.add_output(out).add_output(noise).add_const_input(self).add_const_input(noise);
  auto iter = cfg.build();
  check_tpu(iter, "rrelu_with_noise");
  Prog pr(self.scalar_type());
  auto r = load_inputs(pr, iter);  // x, drawn noise
  int pos = pr.emit(TPURT_EW_GT, {r[0], pr.emit(TPURT_EW_CONST, {}, 0.0)});
  int slope = pr.emit(TPURT_EW_WHERE, {pos, pr.emit(TPURT_EW_CONST, {}, 1.0), r[1]});
  int o = pr.emit(TPURT_EW_MUL, {r[0], slope});
  launch(pr, iter, {o, slope}, "rrelu_with_noise");
  return out;
}
at::Tensor k_rrelu_with_noise(const at::Tensor& self, at::Tensor& noise, const c10::Scalar& lower,
                              const c10::Scalar& upper, bool training, std::optional<at::Generator> gen) {
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  return k_rrelu_with_noise_out(self, noise, lower, upper, training, gen, out);
}
at::Tensor& k_rrelu_with_noise_(at::Tensor& self, at::Tensor& noise, const c10::Scalar& lower,
                                const c10::Scalar& upper, bool training, std::optional<at::Generator> gen) {
  return k_rrelu_with_noise_out(self, noise, lower, upper, training, gen, self);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // arithmetic
  m.impl("add.out", TORCH_FN(k_add_out));
  m.impl("sub.out", TORCH_FN(k_sub_out));
  m.impl("mul.out", TORCH_FN(k_mul_out));
  m.impl("div.out", TORCH_FN(k_div_out));
  m.impl("div.out_mode", TORCH_FN(k_div_mode_out));
  m.impl("floor_divide", TORCH_FN(k_floor_divide));
  m.impl("floor_divide_.Tensor", TORCH_FN(k_floor_divide_));
  m.impl("floor_divide.out", TORCH_FN(k_floor_divide_out));
  m.impl("remainder.Tensor_out", TORCH_FN(binary_out<TPURT_EW_REMAINDER>));
  m.impl("remainder.Scalar_Tensor", TORCH_FN(k_remainder_st));
  m.impl("remainder.Scalar_Tensor_out", TORCH_FN(k_remainder_st_out));
  m.impl("fmod.Tensor_out", TORCH_FN(binary_out<TPURT_EW_FMOD>));
  m.impl("pow.Tensor_Tensor_out", TORCH_FN(pow_tt_out));
  m.impl("pow.Tensor_Scalar_out", TORCH_FN(pow_ts_out));
  m.impl("pow.Scalar_out", TORCH_FN(pow_st_out));
  m.impl("atan2.out", TORCH_FN(binary_float_out<TPURT_EW_ATAN2>));
  m.impl("hypot.out", TORCH_FN(binary_out<TPURT_EW_HYPOT>));
  m.impl("copysign.out", TORCH_FN(binary_float_out<TPURT_EW_COPYSIGN>));
  m.impl("xlogy.OutTensor", TORCH_FN(k_xlogy_out));
  m.impl("maximum.out", TORCH_FN(binary_out<TPURT_EW_MAXIMUM>));
  m.impl("minimum.out", TORCH_FN(binary_out<TPURT_EW_MINIMUM>));
  m.impl("fmax.out", TORCH_FN(binary_out<TPURT_EW_FMAX>));
  m.impl("fmin.out", TORCH_FN(binary_out<TPURT_EW_FMIN>));
  // comparisons and logic
  m.impl("eq.Tensor_out", TORCH_FN(cmp_out<TPURT_EW_EQ>));
  m.impl("ne.Tensor_out", TORCH_FN(cmp_out<TPURT_EW_NE>));
  m.impl("lt.Tensor_out", TORCH_FN(cmp_out<TPURT_EW_LT>));
  m.impl("le.Tensor_out", TORCH_FN(cmp_out<TPURT_EW_LE>));
  m.impl("gt.Tensor_out", TORCH_FN(cmp_out<TPURT_EW_GT>));
  m.impl("ge.Tensor_out", TORCH_FN(cmp_out<TPURT_EW_GE>));
  m.impl("eq.Scalar_out", TORCH_FN(cmp_scalar_out<TPURT_EW_EQ>));
  m.impl("ne.Scalar_out", TORCH_FN(cmp_scalar_out<TPURT_EW_NE>));
  m.impl("lt.Scalar_out", TORCH_FN(cmp_scalar_out<TPURT_EW_LT>));
  m.impl("le.Scalar_out", TORCH_FN(cmp_scalar_out<TPURT_EW_LE>));
  m.impl("gt.Scalar_out", TORCH_FN(cmp_scalar_out<TPURT_EW_GT>));
  m.impl("ge.Scalar_out", TORCH_FN(cmp_scalar_out<TPURT_EW_GE>));
  m.impl("logical_and.out", TORCH_FN(logical_out<TPURT_EW_LOGICAL_AND>));
  m.impl("logical_or.out", TORCH_FN(logical_out<TPURT_EW_LOGICAL_OR>));
  m.impl("logical_xor.out", TORCH_FN(logical_out<TPURT_EW_LOGICAL_XOR>));
  m.impl("logical_not.out", TORCH_FN(k_logical_not_out));
  m.impl("bitwise_and.Tensor_out", TORCH_FN(bitwise_out<TPURT_EW_BITWISE_AND>));
  m.impl("bitwise_or.Tensor_out", TORCH_FN(bitwise_out<TPURT_EW_BITWISE_OR>));
  m.impl("bitwise_xor.Tensor_out", TORCH_FN(bitwise_out<TPURT_EW_BITWISE_XOR>));
  m.impl("bitwise_not.out", TORCH_FN(k_bitwise_not_out));
  m.impl("bitwise_left_shift.Tensor_out", TORCH_FN(bitwise_out<TPURT_EW_LSHIFT>));
  m.impl("bitwise_right_shift.Tensor_out", TORCH_FN(bitwise_out<TPURT_EW_RSHIFT>));
  m.impl("__lshift__.Tensor", TORCH_FN(shift_t<TPURT_EW_LSHIFT>));
  m.impl("__lshift__.Scalar", TORCH_FN(shift_s<TPURT_EW_LSHIFT>));
  m.impl("__ilshift__.Tensor", TORCH_FN(ishift_t<TPURT_EW_LSHIFT>));
  m.impl("__ilshift__.Scalar", TORCH_FN(ishift_s<TPURT_EW_LSHIFT>));
  m.impl("__rshift__.Tensor", TORCH_FN(shift_t<TPURT_EW_RSHIFT>));
  m.impl("__rshift__.Scalar", TORCH_FN(shift_s<TPURT_EW_RSHIFT>));
  m.impl("__irshift__.Tensor", TORCH_FN(ishift_t<TPURT_EW_RSHIFT>));
  m.impl("__irshift__.Scalar", TORCH_FN(ishift_s<TPURT_EW_RSHIFT>));
  // unary
  m.impl("neg.out", TORCH_FN(k_neg_out));
  m.impl("abs.out", TORCH_FN(k_abs_out));
  m.impl("sqrt.out", TORCH_FN(unary_float_out<TPURT_EW_SQRT>));
  m.impl("rsqrt.out", TORCH_FN(unary_float_out<TPURT_EW_RSQRT>));
  m.impl("reciprocal.out", TORCH_FN(unary_float_out<TPURT_EW_RECIPROCAL>));
  m.impl("exp.out", TORCH_FN(unary_float_out<TPURT_EW_EXP>));
  m.impl("exp2.out", TORCH_FN(unary_float_out<TPURT_EW_EXP2>));
  m.impl("expm1.out", TORCH_FN(unary_float_out<TPURT_EW_EXPM1>));
  m.impl("log.out", TORCH_FN(unary_float_out<TPURT_EW_LOG>));
  m.impl("log2.out", TORCH_FN(unary_float_out<TPURT_EW_LOG2>));
  m.impl("log10.out", TORCH_FN(unary_float_out<TPURT_EW_LOG10>));
  m.impl("log1p.out", TORCH_FN(unary_float_out<TPURT_EW_LOG1P>));
  m.impl("sin.out", TORCH_FN(unary_float_out<TPURT_EW_SIN>));
  m.impl("cos.out", TORCH_FN(unary_float_out<TPURT_EW_COS>));
  m.impl("tan.out", TORCH_FN(unary_float_out<TPURT_EW_TAN>));
  m.impl("asin.out", TORCH_FN(unary_float_out<TPURT_EW_ASIN>));
  m.impl("acos.out", TORCH_FN(unary_float_out<TPURT_EW_ACOS>));
  m.impl("atan.out", TORCH_FN(unary_float_out<TPURT_EW_ATAN>));
  m.impl("sinh.out", TORCH_FN(unary_float_out<TPURT_EW_SINH>));
  m.impl("cosh.out", TORCH_FN(unary_float_out<TPURT_EW_COSH>));
  m.impl("tanh.out", TORCH_FN(unary_float_out<TPURT_EW_TANH>));
  m.impl("asinh.out", TORCH_FN(unary_float_out<TPURT_EW_ASINH>));
  m.impl("acosh.out", TORCH_FN(unary_float_out<TPURT_EW_ACOSH>));
  m.impl("atanh.out", TORCH_FN(unary_float_out<TPURT_EW_ATANH>));
  m.impl("sigmoid.out", TORCH_FN(unary_float_out<TPURT_EW_SIGMOID>));
  m.impl("erf.out", TORCH_FN(unary_float_out<TPURT_EW_ERF>));
  m.impl("erfc.out", TORCH_FN(unary_float_out<TPURT_EW_ERFC>));
  m.impl("erfinv.out", TORCH_FN(unary_float_out<TPURT_EW_ERFINV>));
  m.impl("lgamma.out", TORCH_FN(unary_float_out<TPURT_EW_LGAMMA>));
  m.impl("digamma.out", TORCH_FN(unary_float_out<TPURT_EW_DIGAMMA>));
  m.impl("logit.out", TORCH_FN(k_logit_out));
  m.impl("logit", TORCH_FN(k_logit));
  m.impl("logit_", TORCH_FN(k_logit_));
  m.impl("logit_backward", TORCH_FN(k_logit_backward));
  m.impl("logit_backward.grad_input", TORCH_FN(k_logit_backward_out));
  m.impl("sign.out", TORCH_FN(k_sign_out));
  m.impl("sgn.out", TORCH_FN(unary_out<TPURT_EW_SGN>));
  m.impl("floor.out", TORCH_FN(rounding_out<TPURT_EW_FLOOR>));
  m.impl("ceil.out", TORCH_FN(rounding_out<TPURT_EW_CEIL>));
  m.impl("trunc.out", TORCH_FN(rounding_out<TPURT_EW_TRUNC>));
  m.impl("round.out", TORCH_FN(k_round_out));
  m.impl("round.decimals_out", TORCH_FN(k_round_decimals_out));
  m.impl("frac.out", TORCH_FN(k_frac_out));
  m.impl("isnan", TORCH_FN(k_isnan));
  m.impl("isposinf.out", TORCH_FN(pred_out<TPURT_EW_ISPOSINF>));
  m.impl("isneginf.out", TORCH_FN(pred_out<TPURT_EW_ISNEGINF>));
  m.impl("nan_to_num.out", TORCH_FN(k_nan_to_num_out));
  m.impl("nan_to_num", TORCH_FN(k_nan_to_num));
  m.impl("nan_to_num_", TORCH_FN(k_nan_to_num_));
  // activations
  m.impl("relu", TORCH_FN(k_relu));
  m.impl("relu_", TORCH_FN(k_relu_));
  m.impl("gelu.out", TORCH_FN(k_gelu_out));
  m.impl("gelu_backward.grad_input", TORCH_FN(k_gelu_backward_out));
  m.impl("log_sigmoid_forward", TORCH_FN(k_log_sigmoid_forward));
  m.impl("log_sigmoid_forward.output", TORCH_FN(k_log_sigmoid_forward_out));
  m.impl("log_sigmoid_backward", TORCH_FN(k_log_sigmoid_backward));
  m.impl("log_sigmoid_backward.grad_input", TORCH_FN(k_log_sigmoid_backward_out));
  m.impl("silu.out", TORCH_FN(unary_out<TPURT_EW_SILU>));
  m.impl("silu_backward.grad_input", TORCH_FN(backward_out<TPURT_EW_SILU_BACKWARD>));
  // the functional form has a composite decomposition (sigmoid, 1 - s, three
  // products, an add: six kernels) that autograd's SiLU backward would take
  m.impl("silu_backward", TORCH_FN(backward_fn<TPURT_EW_SILU_BACKWARD>));
  m.impl("mish.out", TORCH_FN(unary_out<TPURT_EW_MISH>));
  m.impl("mish_backward", TORCH_FN(backward_fn<TPURT_EW_MISH_BACKWARD>));
  m.impl("softplus.out", TORCH_FN(k_softplus_out));
  m.impl("softplus_backward.grad_input", TORCH_FN(k_softplus_backward_out));
  m.impl("leaky_relu.out", TORCH_FN(k_leaky_relu_out));
  m.impl("leaky_relu_backward.grad_input", TORCH_FN(k_leaky_relu_backward_out));
  m.impl("hardtanh.out", TORCH_FN(k_hardtanh_out));
  m.impl("hardtanh", TORCH_FN(k_hardtanh));
  m.impl("hardtanh_", TORCH_FN(k_hardtanh_));
  m.impl("hardtanh_backward.grad_input", TORCH_FN(k_hardtanh_backward_out));
  m.impl("hardtanh_backward", TORCH_FN(k_hardtanh_backward));
  m.impl("elu.out", TORCH_FN(k_elu_out));
  m.impl("elu_backward.grad_input", TORCH_FN(k_elu_backward_out));
  m.impl("hardsigmoid.out", TORCH_FN(unary_out<TPURT_EW_HARDSIGMOID>));
  m.impl("hardsigmoid_backward.grad_input", TORCH_FN(backward_out<TPURT_EW_HARDSIGMOID_BACKWARD>));
  m.impl("hardswish.out", TORCH_FN(unary_out<TPURT_EW_HARDSWISH>));
  m.impl("hardswish", TORCH_FN(k_hardswish));
  m.impl("hardswish_", TORCH_FN(k_hardswish_));
  m.impl("hardswish_backward", TORCH_FN(backward_fn<TPURT_EW_HARDSWISH_BACKWARD>));
  m.impl("threshold.out", TORCH_FN(k_threshold_out));
  m.impl("threshold_backward.grad_input", TORCH_FN(k_threshold_backward_out));
  m.impl("sigmoid_backward.grad_input", TORCH_FN(backward_out<TPURT_EW_SIGMOID_BACKWARD>));
  m.impl("tanh_backward.grad_input", TORCH_FN(backward_out<TPURT_EW_TANH_BACKWARD>));
  // ternary
  m.impl("masked_fill.Scalar", TORCH_FN(k_masked_fill));
  m.impl("masked_fill.Tensor", TORCH_FN(k_masked_fill_t));
  m.impl("masked_fill_.Scalar", TORCH_FN(k_masked_fill_));
  m.impl("masked_fill_.Tensor", TORCH_FN(k_masked_fill_t_));
  m.impl("where.self", TORCH_FN(k_where));
  m.impl("where.self_out", TORCH_FN(k_where_out));
  m.impl("clamp.out", TORCH_FN(k_clamp_out));
  m.impl("clamp.Tensor_out", TORCH_FN(k_clamp_tensor_out));
  m.impl("clamp_min.out", TORCH_FN(k_clamp_min_out));
  m.impl("clamp_max.out", TORCH_FN(k_clamp_max_out));
  m.impl("clamp_min.Tensor_out", TORCH_FN(k_clamp_min_tensor_out));
  m.impl("clamp_max.Tensor_out", TORCH_FN(k_clamp_max_tensor_out));
  m.impl("lerp.Scalar_out", TORCH_FN(k_lerp_scalar_out));
  m.impl("lerp.Tensor_out", TORCH_FN(k_lerp_tensor_out));
  m.impl("addcmul.out", TORCH_FN(k_addcmul_out));
  m.impl("addcdiv.out", TORCH_FN(k_addcdiv_out));
  // special functions and the remaining pointwise ops
  m.impl("i0.out", TORCH_FN(unary_float_out<TPURT_EW_I0>));
  m.impl("special_i0e.out", TORCH_FN(unary_float_out<TPURT_EW_I0E>));
  m.impl("special_i1.out", TORCH_FN(unary_float_out<TPURT_EW_I1>));
  m.impl("special_i1e.out", TORCH_FN(unary_float_out<TPURT_EW_I1E>));
  m.impl("special_modified_bessel_i0.out", TORCH_FN(unary_float_out<TPURT_EW_I0>));
  m.impl("special_modified_bessel_i1.out", TORCH_FN(unary_float_out<TPURT_EW_I1>));
  m.impl("special_modified_bessel_k0.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_K0>));
  m.impl("special_modified_bessel_k1.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_K1>));
  m.impl("special_scaled_modified_bessel_k0.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_K0E>));
  m.impl("special_scaled_modified_bessel_k1.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_K1E>));
  m.impl("special_bessel_j0.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_J0>));
  m.impl("special_bessel_j1.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_J1>));
  m.impl("special_bessel_y0.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_Y0>));
  m.impl("special_bessel_y1.out", TORCH_FN(unary_float_out<TPURT_EW_BESSEL_Y1>));
  m.impl("special_spherical_bessel_j0.out", TORCH_FN(unary_float_out<TPURT_EW_SPHERICAL_BESSEL_J0>));
  m.impl("special_airy_ai.out", TORCH_FN(unary_float_out<TPURT_EW_AIRY_AI>));
  m.impl("special_ndtri.out", TORCH_FN(unary_float_out<TPURT_EW_NDTRI>));
  m.impl("special_log_ndtr.out", TORCH_FN(unary_float_out<TPURT_EW_LOG_NDTR>));
  m.impl("special_erfcx.out", TORCH_FN(unary_float_out<TPURT_EW_ERFCX>));
  m.impl("special_entr.out", TORCH_FN(unary_float_out<TPURT_EW_ENTR>));
  m.impl("sinc.out", TORCH_FN(unary_float_out<TPURT_EW_SINC>));
  m.impl("polygamma.out", TORCH_FN(k_polygamma_out));
  m.impl("special_zeta.out", TORCH_FN(binary_float_out<TPURT_EW_ZETA>));
  m.impl("special_xlog1py.out", TORCH_FN(binary_float_out<TPURT_EW_XLOG1PY>));
  m.impl("igamma.out", TORCH_FN(binary_float_only_out<TPURT_EW_IGAMMA>));
  m.impl("igammac.out", TORCH_FN(binary_float_only_out<TPURT_EW_IGAMMAC>));
  m.impl("logaddexp.out", TORCH_FN(binary_float_only_out<TPURT_EW_LOGADDEXP>));
  m.impl("logaddexp2.out", TORCH_FN(binary_float_only_out<TPURT_EW_LOGADDEXP2>));
  m.impl("special_chebyshev_polynomial_t.out", TORCH_FN(binary_float_out<TPURT_EW_CHEBYSHEV_T>));
  m.impl("special_chebyshev_polynomial_u.out", TORCH_FN(binary_float_out<TPURT_EW_CHEBYSHEV_U>));
  m.impl("special_chebyshev_polynomial_v.out", TORCH_FN(binary_float_out<TPURT_EW_CHEBYSHEV_V>));
  m.impl("special_chebyshev_polynomial_w.out", TORCH_FN(binary_float_out<TPURT_EW_CHEBYSHEV_W>));
  m.impl("special_shifted_chebyshev_polynomial_t.out", TORCH_FN(binary_float_out<TPURT_EW_SHIFTED_CHEBYSHEV_T>));
  m.impl("special_shifted_chebyshev_polynomial_u.out", TORCH_FN(binary_float_out<TPURT_EW_SHIFTED_CHEBYSHEV_U>));
  m.impl("special_shifted_chebyshev_polynomial_v.out", TORCH_FN(binary_float_out<TPURT_EW_SHIFTED_CHEBYSHEV_V>));
  m.impl("special_shifted_chebyshev_polynomial_w.out", TORCH_FN(binary_float_out<TPURT_EW_SHIFTED_CHEBYSHEV_W>));
  m.impl("special_hermite_polynomial_h.out", TORCH_FN(binary_float_out<TPURT_EW_HERMITE_H>));
  m.impl("special_hermite_polynomial_he.out", TORCH_FN(binary_float_out<TPURT_EW_HERMITE_HE>));
  m.impl("special_laguerre_polynomial_l.out", TORCH_FN(binary_float_out<TPURT_EW_LAGUERRE_L>));
  m.impl("special_legendre_polynomial_p.out", TORCH_FN(binary_float_out<TPURT_EW_LEGENDRE_P>));
  m.impl("heaviside.out", TORCH_FN(k_heaviside_out));
  m.impl("gcd.out", TORCH_FN((bitwise_out<TPURT_EW_GCD, false>)));
  m.impl("lcm.out", TORCH_FN((bitwise_out<TPURT_EW_LCM, false>)));
  m.impl("nextafter.out", TORCH_FN(k_nextafter_out));
  m.impl("signbit.out", TORCH_FN(k_signbit_out));
  m.impl("frexp.Tensor_out", TORCH_FN(k_frexp_out));
  m.impl("rsub.Tensor", TORCH_FN(k_rsub));
  m.impl("angle", TORCH_FN(k_angle));
  m.impl("angle.out", TORCH_FN(k_angle_out));
  m.impl("complex.out", TORCH_FN(k_complex_out));
  m.impl("polar.out", TORCH_FN(k_polar_out));
  m.impl("hardshrink.out", TORCH_FN(k_hardshrink_out));
  m.impl("hardshrink_backward.grad_input", TORCH_FN(k_shrink_backward_out));
  m.impl("softshrink.out", TORCH_FN(k_softshrink_out));
  m.impl("softshrink_backward.grad_input", TORCH_FN(k_shrink_backward_out));
  m.impl("glu.out", TORCH_FN(k_glu_out));
  m.impl("glu_backward.grad_input", TORCH_FN(k_glu_backward_out));
  m.impl("glu_backward", TORCH_FN(k_glu_backward));
  m.impl("_prelu_kernel", TORCH_FN(k_prelu_kernel));
  m.impl("_prelu_kernel_backward", TORCH_FN(k_prelu_kernel_backward));
  m.impl("rrelu_with_noise", TORCH_FN(k_rrelu_with_noise));
  m.impl("rrelu_with_noise.out", TORCH_FN(k_rrelu_with_noise_out));
  m.impl("rrelu_with_noise_", TORCH_FN(k_rrelu_with_noise_));
}

}  // namespace torch_tpu
