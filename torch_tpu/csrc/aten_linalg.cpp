// ATen kernels of the tpu backend for linear algebra: argument checks like
// PyTorch's CPU backend, output allocation / resizing, then one call of
// tpurt_linalg (runtime/src/kernels/linalg.c, LAPACK) per factorization or
// solve. Batch dims are broadcast here (expanded views, stride 0); right-
// side solves are handed to the runtime as left-side solves on transposed
// views. The _ex operators return the device-written `info`; their
// check_errors paths use PyTorch's _linalg_check_errors (LinAlgError).
#include "glue.h"

#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

namespace torch_tpu {
namespace {

using at::Tensor;
using Tup2 = std::tuple<Tensor&, Tensor&>;
using Tup3 = std::tuple<Tensor&, Tensor&, Tensor&>;
using Tup4 = std::tuple<Tensor&, Tensor&, Tensor&, Tensor&>;

tpurt_view absent() {
  tpurt_view v;
  std::memset(&v, 0, sizeof v);
  v.ndim = -1;
  return v;
}

void run(tpurt_linalg_op op, int64_t nb, std::vector<tpurt_view> outs, std::vector<tpurt_view> ins,
         std::array<int64_t, 4> f, const Tensor& dev, double rcond = 0.0) {
  c10::DeviceGuard guard(dev.device());
  check(tpurt_linalg(current_stream(dev.device().index()), op, (int)nb, outs.data(), (int)outs.size(), ins.data(),
                     (int)ins.size(), f.data(), rcond),
        tpurt_linalg_op_name(op));
}

std::vector<int64_t> shape(c10::IntArrayRef batch, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> s(batch.begin(), batch.end());
  s.insert(s.end(), tail.begin(), tail.end());
  return s;
}
c10::IntArrayRef batch_of(const Tensor& t, int64_t trailing = 2) { return t.sizes().slice(0, t.dim() - trailing); }

void out_as(const Tensor& out, c10::IntArrayRef sizes, at::ScalarType dt, const char* fn, const char* what) {
  TORCH_CHECK(out.device().type() == kTpu, fn, ": Expected ", what, " to be on the tpu device, got ", out.device());
  TORCH_CHECK(out.scalar_type() == dt, fn, ": Expected ", what, " to have dtype ", dt, ", but got ",
              out.scalar_type());
  at::native::resize_output(out, sizes);
}

void check_input(const Tensor& A, const char* fn, const char* name = "A") {
  TORCH_CHECK(A.dim() >= 2, fn, ": The input tensor ", name, " must have at least 2 dimensions.");
  TORCH_CHECK(A.device().type() == kTpu, fn, ": Expected ", name, " on the tpu device, got ", A.device());
  auto t = A.scalar_type();
  TORCH_CHECK(at::isFloatingType(t) || at::isComplexType(t), fn,
              ": Expected a floating point or complex tensor as input. Got ", t);
  TORCH_CHECK_NOT_IMPLEMENTED(t == at::kFloat || t == at::kDouble, fn, ": not implemented on the tpu device for '",
                              t, "' (float32 and float64 are supported)");
}
void check_square(const Tensor& A, const char* fn, const char* name = "A") {
  check_input(A, fn, name);
  TORCH_CHECK(A.size(-1) == A.size(-2), fn, ": ", name, " must be batches of square matrices, but they are ",
              A.size(-2), " by ", A.size(-1), " matrices");
}
void check_same_dtype(const Tensor& A, const Tensor& B, const char* fn, const char* na = "A", const char* nb = "B") {
  TORCH_CHECK(A.scalar_type() == B.scalar_type(), fn, ": Expected ", na, " and ", nb,
              " to have the same dtype, but found ", na, " of type ", A.scalar_type(), " and ", nb, " of type ",
              B.scalar_type(), " instead.");
}

// ---------------------------------------------------------------- SVD

Tup3 svd_out(const Tensor& A, bool full, bool uv, std::optional<c10::string_view> driver, Tensor& U, Tensor& S,
             Tensor& Vh) {
  check_input(A, "linalg.svd");
  TORCH_CHECK(!driver.has_value(),
              "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend.");
  auto b = batch_of(A);
  int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  out_as(S, shape(b, {k}), A.scalar_type(), "linalg.svd", "S");
  if (uv) {
    out_as(U, shape(b, {m, full ? m : k}), A.scalar_type(), "linalg.svd", "U");
    out_as(Vh, shape(b, {full ? n : k, n}), A.scalar_type(), "linalg.svd", "Vh");
  } else {
    out_as(U, {0}, A.scalar_type(), "linalg.svd", "U");
    out_as(Vh, {0}, A.scalar_type(), "linalg.svd", "Vh");
  }
  run(TPURT_LA_SVD, (int64_t)b.size(), {uv ? view_of(U) : absent(), view_of(S), uv ? view_of(Vh) : absent()},
      {view_of(A)}, {full, uv, 0, 0}, A);
  return {U, S, Vh};
}

// ------------------------------------------------------ triangular solves

// X = A^-1 B (left) or B A^-1 with A triangular, batch dims broadcast.
void trsm(const Tensor& A, const Tensor& B, const Tensor& X, bool upper, bool trans, bool left, bool unit) {
  auto b = batch_of(X);
  int64_t n = A.size(-1);
  Tensor Ae = A.expand(shape(b, {n, n}));
  Tensor Be = B.expand(shape(b, {B.size(-2), B.size(-1)}));
  if (left)
    run(TPURT_LA_TRSM, (int64_t)b.size(), {view_of(X)}, {view_of(Ae), view_of(Be)}, {upper, trans, unit, 0}, X);
  else  // X A = B  <=>  A^T X^T = B^T
    run(TPURT_LA_TRSM, (int64_t)b.size(), {view_of(X.mT())}, {view_of(Ae.mT()), view_of(Be.mT())},
        {!upper, trans, unit, 0}, X);
}

Tensor& solve_triangular_out(const Tensor& A, const Tensor& B, bool upper, bool left, bool unit, Tensor& out) {
  check_square(A, "linalg.solve_triangular");
  check_input(B, "linalg.solve_triangular", "B");
  check_same_dtype(A, B, "linalg.solve_triangular");
  if (left) {
    TORCH_CHECK(A.size(-1) == B.size(-2), "linalg.solve_triangular: Incompatible shapes of A and B for the equation ",
                "AX = B (", A.size(-2), "x", A.size(-1), " and ", B.size(-2), "x", B.size(-1), ")");
  } else {
    TORCH_CHECK(A.size(-2) == B.size(-1), "linalg.solve_triangular: Incompatible shapes of A and B for the equation ",
                "XA = B (", A.size(-2), "x", A.size(-1), " and ", B.size(-2), "x", B.size(-1), ")");
  }
  auto b = at::infer_size(batch_of(A), batch_of(B));
  out_as(out, shape(b, {B.size(-2), B.size(-1)}), A.scalar_type(), "linalg.solve_triangular", "out");
  if (out.numel() == 0) return out;
  trsm(A, B, out, upper, false, left, unit);
  return out;
}
Tensor solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left, bool unit) {
  Tensor out = at::empty({0}, A.options());
  return solve_triangular_out(A, B, upper, left, unit, out);
}

Tup2 triangular_solve_out(const Tensor& B, const Tensor& A, bool upper, bool transpose, bool unit, Tensor& X,
                          Tensor& M) {
  TORCH_CHECK(B.dim() >= 2, "torch.triangular_solve: Expected b to have at least 2 dimensions, but it has ", B.dim(),
              " dimensions instead");
  TORCH_CHECK(A.dim() >= 2, "torch.triangular_solve: Expected A to have at least 2 dimensions, but it has ", A.dim(),
              " dimensions instead");
  check_square(A, "torch.triangular_solve");
  check_input(B, "torch.triangular_solve", "b");
  check_same_dtype(B, A, "torch.triangular_solve", "b", "A");
  TORCH_CHECK(A.size(-1) == B.size(-2), "Incompatible matrix sizes for triangular_solve: each A matrix is ",
              A.size(-1), " by ", A.size(-1), " but each b matrix is ", B.size(-2), " by ", B.size(-1));
  auto b = at::infer_size(batch_of(A), batch_of(B));
  out_as(X, shape(b, {B.size(-2), B.size(-1)}), A.scalar_type(), "torch.triangular_solve", "X");
  out_as(M, shape(b, {A.size(-1), A.size(-1)}), A.scalar_type(), "torch.triangular_solve", "M");
  if (M.numel()) M.copy_(A.expand(M.sizes()));
  if (X.numel()) trsm(A, B, X, upper, transpose, true, unit);
  return {X, M};
}

// ------------------------------------------------------------------ LU

Tup3 lu_factor_ex_out(const Tensor& A, bool pivot, bool check_errors, Tensor& LU, Tensor& piv, Tensor& info) {
  check_input(A, "torch.linalg.lu_factor");
  TORCH_CHECK(pivot, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
  auto b = batch_of(A);
  int64_t m = A.size(-2), n = A.size(-1);
  out_as(LU, A.sizes(), A.scalar_type(), "linalg.lu_factor", "LU");
  out_as(piv, shape(b, {std::min(m, n)}), at::kInt, "linalg.lu_factor", "pivots");
  out_as(info, b, at::kInt, "linalg.lu_factor", "info");
  run(TPURT_LA_LU, (int64_t)b.size(), {view_of(LU), view_of(piv), view_of(info)}, {view_of(A)}, {0, 0, 0, 0}, A);
  if (check_errors) at::_linalg_check_errors(info, "torch.linalg.lu_factor_ex", A.dim() == 2);
  return {LU, piv, info};
}

Tup3 lu_unpack_out(const Tensor& LU, const Tensor& piv, bool unpack_data, bool unpack_pivots, Tensor& P, Tensor& L,
                   Tensor& U) {
  TORCH_CHECK(LU.dim() >= 2, "torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: ", LU.sizes(),
              " instead");
  check_input(LU, "torch.lu_unpack", "LU_data");
  if (unpack_pivots)
    TORCH_CHECK(piv.scalar_type() == at::kInt,
                "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype.\n"
                "Note: this function is intended to be used with the output produced by torch.linalg.lu_factor");
  auto b = batch_of(LU);
  int64_t m = LU.size(-2), n = LU.size(-1), k = std::min(m, n);
  if (unpack_pivots)
    TORCH_CHECK(piv.dim() >= 1 && piv.size(-1) == k && batch_of(piv, 1).equals(b),
                "torch.lu_unpack: Expected LU_pivots to have shape ", c10::IntArrayRef(shape(b, {k})), ", got ",
                piv.sizes());
  auto dt = LU.scalar_type();
  out_as(L, unpack_data ? shape(b, {m, k}) : std::vector<int64_t>{0}, dt, "torch.lu_unpack", "L");
  out_as(U, unpack_data ? shape(b, {k, n}) : std::vector<int64_t>{0}, dt, "torch.lu_unpack", "U");
  out_as(P, unpack_pivots ? shape(b, {m, m}) : std::vector<int64_t>{0}, dt, "torch.lu_unpack", "P");
  if (!unpack_data && !unpack_pivots) return {P, L, U};
  tpurt_view pv = unpack_pivots ? view_of(piv) : view_of(at::empty(shape(b, {k}), LU.options().dtype(at::kInt)));
  run(TPURT_LA_LU_UNPACK, (int64_t)b.size(),
      {unpack_pivots ? view_of(P) : absent(), unpack_data ? view_of(L) : absent(), unpack_data ? view_of(U) : absent()},
      {view_of(LU), pv}, {0, 0, 0, 0}, LU);
  return {P, L, U};
}

Tup3 linalg_lu_out(const Tensor& A, bool pivot, Tensor& P, Tensor& L, Tensor& U) {
  check_input(A, "linalg.lu");
  TORCH_CHECK(pivot, "linalg.lu: LU without pivoting is not implemented on the CPU");
  Tensor LU = at::empty({0}, A.options()), piv = at::empty({0}, A.options().dtype(at::kInt)),
         info = at::empty({0}, A.options().dtype(at::kInt));
  lu_factor_ex_out(A, true, false, LU, piv, info);
  return lu_unpack_out(LU, piv, true, true, P, L, U);
}

// B's rows (left: AX = B) or columns (XA = B) must match the n x n A.
void check_solve_shapes(int64_t n, const Tensor& B, bool left, const char* op) {
  TORCH_CHECK(B.size(left ? -2 : -1) == n, op, ": Incompatible shapes of A and B for the equation ",
              left ? "AX = B (" : "XA = B (", n, "x", n, " and ", B.size(-2), "x", B.size(-1), ")");
}

Tensor& lu_solve_out(const Tensor& LU, const Tensor& piv, const Tensor& B, bool left, bool adjoint, Tensor& out) {
  check_square(LU, "torch.linalg.lu_solve", "LU");
  check_input(B, "torch.linalg.lu_solve", "B");
  check_same_dtype(LU, B, "linalg.lu_solve", "LU", "B");
  TORCH_CHECK(piv.scalar_type() == at::kInt, "linalg.lu_solve: pivots should be a Tensor of scalar type torch.int32");
  int64_t n = LU.size(-1);
  TORCH_CHECK(piv.dim() >= 1 && piv.size(-1) == n && batch_of(piv, 1).equals(batch_of(LU)),
              "linalg.lu_solve: Expected LU.shape[:-1] and pivots.shape to be the same, but got pivots with shape ",
              piv.sizes(), " instead");
  check_solve_shapes(n, B, left, "linalg.lu_solve");
  auto b = at::infer_size(batch_of(LU), batch_of(B));
  out_as(out, shape(b, {B.size(-2), B.size(-1)}), B.scalar_type(), "linalg.lu_solve", "out");
  if (out.numel() == 0) return out;
  Tensor LUe = LU.expand(shape(b, {n, n})), Pe = piv.expand(shape(b, {n}));
  Tensor Be = B.expand(out.sizes());
  bool trans = left ? adjoint : !adjoint;
  if (left)
    run(TPURT_LA_LU_SOLVE, (int64_t)b.size(), {view_of(out)}, {view_of(LUe), view_of(Pe), view_of(Be)},
        {trans, 0, 0, 0}, out);
  else
    run(TPURT_LA_LU_SOLVE, (int64_t)b.size(), {view_of(out.mT())}, {view_of(LUe), view_of(Pe), view_of(Be.mT())},
        {trans, 0, 0, 0}, out);
  return out;
}

Tup4 solve_ex_out(const Tensor& A, const Tensor& B, bool left, bool check_errors, Tensor& result, Tensor& LU,
                  Tensor& piv, Tensor& info) {
  check_square(A, "linalg.solve");
  TORCH_CHECK(B.device().type() == kTpu, "linalg.solve: Expected B on the tpu device, got ", B.device());
  check_same_dtype(A, B, "linalg.solve");
  bool vector_case = B.dim() == 1 || (A.dim() - 1 == B.dim() && B.sizes().equals(A.sizes().slice(0, A.dim() - 1)));
  TORCH_CHECK(left || !vector_case, "linalg.solve: Vector broadcasting of the left hand side is not supported for "
              "left=False. In this case linalg.solve is equivalent to B / A.squeeze(-1)");
  Tensor B_ = vector_case ? B.unsqueeze(-1) : B;
  TORCH_CHECK(B_.dim() >= 2, "linalg.solve: The input tensor B must have at least 2 dimensions.");
  int64_t n = A.size(-1);
  check_solve_shapes(n, B_, left, "linalg.solve");
  auto b = at::infer_size(batch_of(A), batch_of(B_));
  auto rs = shape(b, {B_.size(-2), B_.size(-1)});
  if (vector_case) rs.pop_back();
  out_as(result, rs, A.scalar_type(), "linalg.solve", "result");
  lu_factor_ex_out(A, true, false, LU, piv, info);
  if (check_errors) at::_linalg_check_errors(info, "torch.linalg.solve_ex", A.dim() == 2);
  Tensor r_ = vector_case ? result.unsqueeze(-1) : result;
  lu_solve_out(LU, piv, B_, left, false, r_);
  return {result, LU, piv, info};
}

Tup2 inv_ex_out(const Tensor& A, bool check_errors, Tensor& inv, Tensor& info) {
  check_square(A, "linalg.inv");
  auto b = batch_of(A);
  out_as(inv, A.sizes(), A.scalar_type(), "linalg.inv", "inverse");
  out_as(info, b, at::kInt, "linalg.inv", "info");
  run(TPURT_LA_INV, (int64_t)b.size(), {view_of(inv), view_of(info)}, {view_of(A)}, {0, 0, 0, 0}, A);
  if (check_errors) at::_linalg_check_errors(info, "torch.linalg.inv_ex", A.dim() == 2);
  return {inv, info};
}

Tup3 det_out(const Tensor& A, Tensor& det, Tensor& LU, Tensor& piv) {
  check_square(A, "linalg.det");
  auto b = batch_of(A);
  out_as(det, b, A.scalar_type(), "linalg.det", "result");
  out_as(LU, A.sizes(), A.scalar_type(), "linalg.det", "LU");
  out_as(piv, shape(b, {A.size(-1)}), at::kInt, "linalg.det", "pivots");
  // like CPU: a contiguous A is factored as A^T (the backward expects that LU)
  run(TPURT_LA_DET, (int64_t)b.size(), {view_of(det), absent(), view_of(LU), view_of(piv)},
      {view_of(A.is_contiguous() ? A.mT() : A)}, {0, 0, 0, 0}, A);
  return {det, LU, piv};
}

Tup4 slogdet_out(const Tensor& A, Tensor& sign, Tensor& logabs, Tensor& LU, Tensor& piv) {
  check_square(A, "linalg.slogdet");
  auto b = batch_of(A);
  out_as(sign, b, A.scalar_type(), "linalg.slogdet", "sign");
  out_as(logabs, b, A.scalar_type(), "linalg.slogdet", "logabsdet");
  out_as(LU, A.sizes(), A.scalar_type(), "linalg.slogdet", "LU");
  out_as(piv, shape(b, {A.size(-1)}), at::kInt, "linalg.slogdet", "pivots");
  run(TPURT_LA_DET, (int64_t)b.size(), {view_of(sign), view_of(logabs), view_of(LU), view_of(piv)},
      {view_of(A.is_contiguous() ? A.mT() : A)}, {1, 0, 0, 0}, A);
  return {sign, logabs, LU, piv};
}

// ------------------------------------------------------------- eigh / eig

Tup2 eigh_out(const Tensor& A, c10::string_view uplo, bool compute_v, Tensor& L, Tensor& V) {
  check_square(A, "linalg.eigh");
  TORCH_CHECK(uplo == "L" || uplo == "U" || uplo == "l" || uplo == "u",
              "Expected UPLO argument to be 'L' or 'U', but got ", uplo);
  auto b = batch_of(A);
  out_as(L, shape(b, {A.size(-1)}), A.scalar_type(), "linalg.eigh", "eigenvalues");
  out_as(V, compute_v ? A.sizes() : c10::IntArrayRef({0}), A.scalar_type(), "linalg.eigh", "eigenvectors");
  bool upper = uplo == "U" || uplo == "u";
  run(TPURT_LA_EIGH, (int64_t)b.size(), {view_of(L), compute_v ? view_of(V) : absent()}, {view_of(A)},
      {upper, 0, 0, 0}, A);
  return {L, V};
}

void check_finite(const Tensor& A, const char* fn) {
  TORCH_CHECK(at::isfinite(A).all().item<bool>(), fn, ": input tensor should not contain infs or NaNs.");
}

Tup2 eig_out(const Tensor& A, Tensor& W, Tensor& V) {
  check_square(A, "linalg.eig");
  check_finite(A, "torch.linalg.eig");
  auto b = batch_of(A);
  auto ct = at::toComplexType(A.scalar_type());
  out_as(W, shape(b, {A.size(-1)}), ct, "linalg.eig", "eigenvalues");
  out_as(V, A.sizes(), ct, "linalg.eig", "eigenvectors");
  run(TPURT_LA_EIG, (int64_t)b.size(), {view_of(W), view_of(V)}, {view_of(A)}, {0, 0, 0, 0}, A);
  return {W, V};
}
std::tuple<Tensor, Tensor> eig(const Tensor& A) {
  Tensor W = at::empty({0}, A.options()), V = at::empty({0}, A.options());
  if (at::isFloatingType(A.scalar_type())) {
    W = at::empty({0}, A.options().dtype(at::toComplexType(A.scalar_type())));
    V = at::empty({0}, W.options());
  }
  eig_out(A, W, V);
  return {W, V};
}
Tensor eigvals(const Tensor& A) {
  check_square(A, "linalg.eigvals");
  check_finite(A, "torch.linalg.eigvals");
  auto b = batch_of(A);
  Tensor W = at::empty(shape(b, {A.size(-1)}), A.options().dtype(at::toComplexType(A.scalar_type())));
  run(TPURT_LA_EIG, (int64_t)b.size(), {view_of(W), absent()}, {view_of(A)}, {0, 0, 0, 0}, A);
  return W;
}
Tensor& eigvals_out(const Tensor& A, Tensor& out) {
  Tensor W = eigvals(A);
  out_as(out, W.sizes(), W.scalar_type(), "linalg.eigvals", "out");
  out.copy_(W);
  return out;
}

// ------------------------------------------------------------------- QR

void geqrf_into(const Tensor& A, const Tensor& QR, const Tensor& tau) {
  auto b = batch_of(A);
  out_as(QR, A.sizes(), A.scalar_type(), "geqrf", "a");
  out_as(tau, shape(b, {std::min(A.size(-2), A.size(-1))}), A.scalar_type(), "geqrf", "tau");
  run(TPURT_LA_GEQRF, (int64_t)b.size(), {view_of(QR), view_of(tau)}, {view_of(A)}, {0, 0, 0, 0}, A);
}
Tup2 geqrf_out(const Tensor& A, Tensor& QR, Tensor& tau) {
  TORCH_CHECK(A.dim() >= 2, "torch.geqrf: input must have at least 2 dimensions.");
  check_input(A, "torch.geqrf");
  geqrf_into(A, QR, tau);
  return {QR, tau};
}
std::tuple<Tensor, Tensor> geqrf(const Tensor& A) {
  Tensor QR = at::empty({0}, A.options()), tau = at::empty({0}, A.options());
  geqrf_out(A, QR, tau);
  return {QR, tau};
}

// Q [.., m, c] from reflectors
void orgqr_into(const Tensor& QR, const Tensor& tau, const Tensor& Q) {
  auto b = batch_of(QR);
  Tensor te = tau.expand(shape(b, {tau.size(-1)}));
  run(TPURT_LA_ORGQR, (int64_t)b.size(), {view_of(Q)}, {view_of(QR), view_of(te)}, {0, 0, 0, 0}, QR);
}

Tup2 qr_out(const Tensor& A, c10::string_view mode, Tensor& Q, Tensor& R) {
  TORCH_CHECK(mode == "reduced" || mode == "r" || mode == "complete", "qr received unrecognized mode '", mode,
              "' but expected one of 'reduced' (default), 'r', or 'complete'");
  check_input(A, "linalg.qr");
  auto b = batch_of(A);
  int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  bool complete = mode == "complete", want_q = mode != "r";
  int64_t qc = complete ? m : k, rr = complete ? m : k;
  out_as(Q, want_q ? shape(b, {m, qc}) : std::vector<int64_t>{0}, A.scalar_type(), "linalg.qr", "Q");
  out_as(R, shape(b, {rr, n}), A.scalar_type(), "linalg.qr", "R");
  Tensor QR = at::empty({0}, A.options()), tau = at::empty({0}, A.options());
  if (A.numel() == 0) {
    if (R.numel()) R.zero_();
    if (want_q && Q.numel()) {
      Q.zero_();
      Q.diagonal(0, -2, -1).fill_(1);
    }
    return {Q, R};
  }
  geqrf_into(A, QR, tau);
  if (rr <= m) at::triu_out(R, QR.narrow(-2, 0, rr));
  if (want_q) orgqr_into(QR, tau, Q);
  return {Q, R};
}

Tensor& householder_product_out(const Tensor& A, const Tensor& tau, Tensor& out) {
  TORCH_CHECK(A.dim() >= 2, "torch.linalg.householder_product: input must have at least 2 dimensions.");
  TORCH_CHECK(A.size(-2) >= A.size(-1),
              "torch.linalg.householder_product: input.shape[-2] must be greater than or equal to input.shape[-1]");
  TORCH_CHECK(A.size(-1) >= tau.size(-1),
              "torch.linalg.householder_product: input.shape[-1] must be greater than or equal to tau.shape[-1]");
  TORCH_CHECK(A.dim() - tau.dim() == 1, "torch.linalg.householder_product: Expected tau to have one dimension less "
              "than input, but got tau.ndim equal to ", tau.dim(), " and input.ndim is equal to ", A.dim());
  TORCH_CHECK(batch_of(tau, 1).equals(batch_of(A)), "torch.linalg.householder_product: Expected batch dimensions of "
              "tau to be equal to input.shape[:-2], but got ", batch_of(tau, 1));
  check_input(A, "torch.linalg.householder_product", "input");
  check_same_dtype(A, tau, "torch.linalg.householder_product", "input", "tau");
  out_as(out, A.sizes(), A.scalar_type(), "torch.linalg.householder_product", "out");
  if (out.numel() == 0) return out;
  orgqr_into(A, tau, out);
  return out;
}
Tensor householder_product(const Tensor& A, const Tensor& tau) {
  Tensor out = at::empty({0}, A.options());
  return householder_product_out(A, tau, out);
}

Tensor& ormqr_out(const Tensor& A, const Tensor& tau, const Tensor& C, bool left, bool transpose, Tensor& out) {
  TORCH_CHECK(A.dim() >= 2, "torch.ormqr: input must have at least 2 dimensions.");
  TORCH_CHECK(C.dim() >= 2, "torch.ormqr: other must have at least 2 dimensions.");
  int64_t nq = left ? C.size(-2) : C.size(-1);
  TORCH_CHECK(tau.size(-1) <= A.size(-1), "torch.ormqr: tau.shape[-1] must be less than or equal to input.shape[-1]");
  TORCH_CHECK(A.size(-2) == nq, "torch.ormqr: input.shape[-2] must be equal to other.shape[", left ? -2 : -1, "]");
  TORCH_CHECK(tau.size(-1) <= nq, "torch.ormqr: tau.shape[-1] must be less than or equal to other.shape[",
              left ? -2 : -1, "]");
  TORCH_CHECK(A.dim() - tau.dim() == 1, "torch.ormqr: Expected tau to have one dimension less than input, but got "
              "tau.ndim equal to ", tau.dim(), " and input.ndim is equal to ", A.dim());
  TORCH_CHECK(A.dim() == C.dim(), "torch.ormqr: Expected other to have the same number of dimensions as input, but "
              "got other.ndim equal to ", C.dim(), " and input.ndim is equal to ", A.dim());
  TORCH_CHECK(batch_of(C).equals(batch_of(A)) && batch_of(tau, 1).equals(batch_of(A)),
              "torch.ormqr: Expected batch dimensions of tau and other to be equal to input.shape[:-2]");
  check_input(A, "torch.ormqr", "input");
  check_same_dtype(A, C, "torch.ormqr", "input", "other");
  check_same_dtype(A, tau, "torch.ormqr", "input", "tau");
  out_as(out, C.sizes(), C.scalar_type(), "torch.ormqr", "out");
  if (out.numel() == 0) return out;
  run(TPURT_LA_ORMQR, A.dim() - 2, {view_of(out)}, {view_of(A), view_of(tau), view_of(C)}, {left, transpose, 0, 0},
      out);
  return out;
}
Tensor ormqr(const Tensor& A, const Tensor& tau, const Tensor& C, bool left, bool transpose) {
  Tensor out = at::empty({0}, A.options());
  return ormqr_out(A, tau, C, left, transpose, out);
}

// ------------------------------------------------------------- Cholesky

Tup2 cholesky_ex_out(const Tensor& A, bool upper, bool check_errors, Tensor& L, Tensor& info) {
  check_square(A, "linalg.cholesky");
  auto b = batch_of(A);
  out_as(L, A.sizes(), A.scalar_type(), "linalg.cholesky", "L");
  out_as(info, b, at::kInt, "linalg.cholesky", "info");
  run(TPURT_LA_CHOLESKY, (int64_t)b.size(), {view_of(L), view_of(info)}, {view_of(A)}, {upper, 0, 0, 0}, A);
  if (check_errors) at::_linalg_check_errors(info, "torch.linalg.cholesky_ex", A.dim() == 2);
  return {L, info};
}
Tensor& cholesky_out(const Tensor& A, bool upper, Tensor& out) {
  TORCH_WARN_ONCE("torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in a future "
                  "PyTorch release.");
  Tensor info = at::empty({0}, A.options().dtype(at::kInt));
  cholesky_ex_out(A, upper, false, out, info);
  at::_linalg_check_errors(info, "cholesky", A.dim() == 2);
  return out;
}
Tensor cholesky(const Tensor& A, bool upper) {
  Tensor out = at::empty({0}, A.options());
  return cholesky_out(A, upper, out);
}

Tensor& cholesky_inverse_out(const Tensor& L, bool upper, Tensor& out) {
  check_square(L, "cholesky_inverse", "input");
  out_as(out, L.sizes(), L.scalar_type(), "cholesky_inverse", "out");
  if (out.numel() == 0) return out;
  run(TPURT_LA_CHOLESKY_INVERSE, L.dim() - 2, {view_of(out)}, {view_of(L)}, {upper, 0, 0, 0}, L);
  return out;
}
Tensor cholesky_inverse(const Tensor& L, bool upper) {
  Tensor out = at::empty({0}, L.options());
  return cholesky_inverse_out(L, upper, out);
}

Tensor cholesky_solve_helper(const Tensor& B, const Tensor& L, bool upper) {
  check_square(L, "cholesky_solve", "input2");
  check_input(B, "cholesky_solve", "input");
  auto b = at::infer_size(batch_of(B), batch_of(L));
  Tensor X = at::empty(shape(b, {B.size(-2), B.size(-1)}), B.options());
  if (X.numel() == 0) return X;
  Tensor Be = B.expand(X.sizes()), Le = L.expand(shape(b, {L.size(-1), L.size(-1)}));
  run(TPURT_LA_CHOLESKY_SOLVE, (int64_t)b.size(), {view_of(X)}, {view_of(Be), view_of(Le)}, {upper, 0, 0, 0}, X);
  return X;
}

// ------------------------------------------------------------------ LDL

Tup3 ldl_factor_ex_out(const Tensor& A, bool hermitian, bool check_errors, Tensor& LD, Tensor& piv, Tensor& info) {
  (void)hermitian;  // real symmetric == hermitian
  check_square(A, "torch.linalg.ldl_factor_ex");
  auto b = batch_of(A);
  out_as(LD, A.sizes(), A.scalar_type(), "torch.linalg.ldl_factor_ex", "LD");
  out_as(piv, shape(b, {A.size(-1)}), at::kInt, "torch.linalg.ldl_factor_ex", "pivots");
  out_as(info, b, at::kInt, "torch.linalg.ldl_factor_ex", "info");
  run(TPURT_LA_LDL, (int64_t)b.size(), {view_of(LD), view_of(piv), view_of(info)}, {view_of(A)}, {0, 0, 0, 0}, A);
  if (check_errors) at::_linalg_check_errors(info, "torch.linalg.ldl_factor_ex", A.dim() == 2);
  return {LD, piv, info};
}

Tensor& ldl_solve_out(const Tensor& LD, const Tensor& piv, const Tensor& B, bool hermitian, Tensor& out) {
  (void)hermitian;
  check_square(LD, "torch.linalg.ldl_solve", "LD");
  check_input(B, "torch.linalg.ldl_solve", "B");
  check_same_dtype(LD, B, "torch.linalg.ldl_solve", "LD", "B");
  TORCH_CHECK(piv.scalar_type() == at::kInt, "torch.linalg.ldl_solve: Expected pivots to be integers. Got ",
              piv.scalar_type());
  int64_t n = LD.size(-1);
  TORCH_CHECK(piv.dim() >= 1 && piv.size(-1) == n && batch_of(piv, 1).equals(batch_of(LD)),
              "torch.linalg.ldl_solve: Expected LD.shape[:-1] and pivots.shape to be the same, but got pivots with "
              "shape ", piv.sizes(), " instead");
  TORCH_CHECK(B.size(-2) == n, "torch.linalg.ldl_solve: Incompatible shapes of A and B for the equation AX = B (", n,
              "x", n, " and ", B.size(-2), "x", B.size(-1), ")");
  auto b = at::infer_size(batch_of(LD), batch_of(B));
  out_as(out, shape(b, {B.size(-2), B.size(-1)}), B.scalar_type(), "torch.linalg.ldl_solve", "out");
  if (out.numel() == 0) return out;
  Tensor LDe = LD.expand(shape(b, {n, n})), Pe = piv.expand(shape(b, {n})), Be = B.expand(out.sizes());
  run(TPURT_LA_LDL_SOLVE, (int64_t)b.size(), {view_of(out)}, {view_of(LDe), view_of(Pe), view_of(Be)}, {0, 0, 0, 0},
      out);
  return out;
}

// ---------------------------------------------------------------- lstsq

Tup4 lstsq_out(const Tensor& A, const Tensor& B, std::optional<double> rcond, std::optional<c10::string_view> driver,
               Tensor& sol, Tensor& res, Tensor& rank, Tensor& sv) {
  TORCH_CHECK(A.dim() >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.");
  TORCH_CHECK(B.dim() >= 1, "torch.linalg.lstsq: other must have at least 1 dimension.");
  check_input(A, "torch.linalg.lstsq", "input");
  check_same_dtype(A, B, "torch.linalg.lstsq", "input", "other");
  bool vector_case = A.dim() - 1 == B.dim();
  Tensor B_ = vector_case ? B.unsqueeze(-1) : B;
  TORCH_CHECK(A.size(-2) == B_.size(-2), "torch.linalg.lstsq: input.size(-2) should match other.size(-",
              vector_case ? 1 : 2, ")");
  std::string drv = driver.has_value() ? std::string(*driver) : "gelsy";
  int64_t d = drv == "gels" ? 0 : drv == "gelsy" ? 1 : drv == "gelsd" ? 2 : drv == "gelss" ? 3 : -1;
  TORCH_CHECK(d >= 0, "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
  int64_t m = A.size(-2), n = A.size(-1), r = B_.size(-1), k = std::min(m, n), mx = std::max(m, n);
  double rc = rcond.has_value() ? *rcond : (double)std::max(m, n) *
      (A.scalar_type() == at::kFloat ? (double)std::numeric_limits<float>::epsilon()
                                     : std::numeric_limits<double>::epsilon());
  auto b = at::infer_size(batch_of(A), batch_of(B_));
  Tensor Ae = A.expand(shape(b, {m, n})), Be = B_.expand(shape(b, {m, r}));
  Tensor raw = at::empty(shape(b, {mx, r}), A.options());
  Tensor rk = at::empty(b, A.options().dtype(at::kLong));
  Tensor s = at::empty(shape(b, {(d == 2 || d == 3) ? k : 0}), A.options());
  bool want_rank = d != 0, want_s = d == 2 || d == 3;
  if (raw.numel() > 0 || rk.numel() > 0)
    run(TPURT_LA_LSTSQ, (int64_t)b.size(), {view_of(raw), want_rank ? view_of(rk) : absent(),
        want_s ? view_of(s) : absent()}, {view_of(Ae), view_of(Be)}, {d, 0, 0, 0}, A, rc);
  else if (raw.numel() == 0 && rk.numel() > 0)
    rk.zero_();
  Tensor resid = at::empty({0}, A.options());
  if (m > n && d != 1) {
    bool full = true;
    if (d == 2 || d == 3) full = rk.numel() == 0 || (rk == n).all().item<bool>();
    if (full) resid = raw.narrow(-2, n, m - n).pow(2).sum(-2);
  }
  Tensor x = raw.narrow(-2, 0, n);
  if (vector_case) x = x.squeeze(-1);
  auto dt = A.scalar_type();
  out_as(sol, x.sizes(), dt, "torch.linalg.lstsq", "solution");
  sol.copy_(x);
  if (m == 0 && sol.numel()) sol.zero_();
  out_as(res, resid.sizes(), dt, "torch.linalg.lstsq", "residuals");
  if (resid.numel()) res.copy_(resid);
  out_as(rank, want_rank ? rk.sizes() : c10::IntArrayRef({0}), at::kLong, "torch.linalg.lstsq", "rank");
  if (want_rank && rk.numel()) rank.copy_(rk);
  out_as(sv, want_s ? s.sizes() : c10::IntArrayRef({0}), dt, "torch.linalg.lstsq", "singular_values");
  if (want_s && s.numel()) sv.copy_(s);
  return {sol, res, rank, sv};
}

// ----------------------------------------------------------- matrix_exp

Tensor matrix_exp(const Tensor& A) {
  check_square(A, "linalg.matrix_exp");
  Tensor out = at::empty(A.sizes(), A.options());
  if (out.numel() == 0) return out;
  if (A.scalar_type() == at::kFloat) {  // evaluated in f64, rounded once
    Tensor Ad = A.to(at::kDouble), Ed = at::empty(A.sizes(), Ad.options());
    run(TPURT_LA_MATRIX_EXP, A.dim() - 2, {view_of(Ed)}, {view_of(Ad)}, {0, 0, 0, 0}, A);
    out.copy_(Ed);
    return out;
  }
  run(TPURT_LA_MATRIX_EXP, A.dim() - 2, {view_of(out)}, {view_of(A)}, {0, 0, 0, 0}, A);
  return out;
}

// ---------------------------------------------------------------- cross

Tensor& cross_out(const Tensor& a, const Tensor& b, int64_t dim, Tensor& out) {
  TORCH_CHECK(a.dim() == b.dim(), "linalg.cross: inputs must have the same number of dimensions.");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "linalg.cross: expected both inputs to have the same dtype, got ",
              a.scalar_type(), " and ", b.scalar_type());
  auto sz = at::infer_size(a.sizes(), b.sizes());
  dim = c10::maybe_wrap_dim(dim, (int64_t)sz.size());
  TORCH_CHECK(a.size(dim) == 3 && b.size(dim) == 3, "linalg.cross: inputs dimension ", dim,
              " must have length 3. Got ", a.size(dim), " and ", b.size(dim));
  out_as(out, sz, a.scalar_type(), "linalg.cross", "out");
  if (out.numel() == 0) return out;
  Tensor ae = a.expand(sz).movedim(dim, -1), be = b.expand(sz).movedim(dim, -1), oe = out.movedim(dim, -1);
  run(TPURT_LA_CROSS, oe.dim() - 1, {view_of(oe)}, {view_of(ae), view_of(be)}, {0, 0, 0, 0}, out);
  return out;
}

// -------------------------------------------- vdot, addbmm (trace: aten_index2.cpp)

Tensor vdot(const Tensor& a, const Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(), " but found ",
              b.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [",
              b.numel(), "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(),
              " elements respectively");
  return at::dot(a.is_complex() ? a.conj() : a, b);
}

Tensor& addbmm_out(const Tensor& self, const Tensor& b1, const Tensor& b2, const c10::Scalar& beta,
                   const c10::Scalar& alpha, Tensor& out) {
  TORCH_CHECK(b1.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b2.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(b1.size(0) == b2.size(0), "batch1 and batch2 must have same number of batches, got ", b1.size(0),
              " and ", b2.size(0));
  TORCH_CHECK(b1.size(2) == b2.size(1), "Incompatible matrix sizes for bmm (", b1.size(1), "x", b1.size(2), " and ",
              b2.size(1), "x", b2.size(2), ")");
  int64_t M = b1.size(1), N = b2.size(2);
  auto e = at::expand_size(self, {M, N}, "addbmm");
  (void)e;
  // sum_b b1[b] @ b2[b] is ONE product over K' = B * K: [b1[0] ... b1[B-1]] @ [b2[0]; ...; b2[B-1]]
  int64_t B = b1.size(0), K = b1.size(2);
  Tensor lhs = b1.permute({1, 0, 2}).reshape({M, B * K}), rhs = b2.reshape({B * K, N});
  Tensor r = at::addmm(self.expand({M, N}), lhs, rhs, beta, alpha);
  if (!out.is_same(self)) at::native::resize_output(out, {M, N});
  out.copy_(r);
  return out;
}
Tensor addbmm(const Tensor& self, const Tensor& b1, const Tensor& b2, const c10::Scalar& beta,
              const c10::Scalar& alpha) {
  Tensor out = at::empty({0}, b1.options());
  return addbmm_out(self, b1, b2, beta, alpha, out);
}
Tensor& addbmm_(Tensor& self, const Tensor& b1, const Tensor& b2, const c10::Scalar& beta, const c10::Scalar& alpha) {
  TORCH_CHECK(self.dim() == 2 && self.size(0) == b1.size(1) && self.size(1) == b2.size(2),
              "The input tensor must be a matrix with size ", b1.size(1), "x", b2.size(2));
  return addbmm_out(self, b1, b2, beta, alpha, self);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_linalg_svd.U", svd_out);
  m.impl("linalg_solve_triangular", solve_triangular);
  m.impl("linalg_solve_triangular.out", solve_triangular_out);
  m.impl("triangular_solve.X", triangular_solve_out);
  m.impl("linalg_lu_factor_ex.out", lu_factor_ex_out);
  m.impl("linalg_lu.out", linalg_lu_out);
  m.impl("lu_unpack.out", lu_unpack_out);
  m.impl("linalg_lu_solve.out", lu_solve_out);
  m.impl("_linalg_solve_ex.result", solve_ex_out);
  m.impl("linalg_inv_ex.inverse", inv_ex_out);
  m.impl("_linalg_det.result", det_out);
  m.impl("_linalg_slogdet.sign", slogdet_out);
  m.impl("_linalg_eigh.eigenvalues", eigh_out);
  m.impl("linalg_eig", eig);
  m.impl("linalg_eig.out", eig_out);
  m.impl("_linalg_eigvals", eigvals);
  m.impl("linalg_eigvals.out", eigvals_out);
  m.impl("linalg_qr.out", qr_out);
  m.impl("geqrf", geqrf);
  m.impl("geqrf.a", geqrf_out);
  m.impl("ormqr", ormqr);
  m.impl("ormqr.out", ormqr_out);
  m.impl("linalg_householder_product", householder_product);
  m.impl("linalg_householder_product.out", householder_product_out);
  m.impl("linalg_cholesky_ex.L", cholesky_ex_out);
  m.impl("cholesky", cholesky);
  m.impl("cholesky.out", cholesky_out);
  m.impl("cholesky_inverse", cholesky_inverse);
  m.impl("cholesky_inverse.out", cholesky_inverse_out);
  m.impl("_cholesky_solve_helper", cholesky_solve_helper);
  m.impl("linalg_ldl_factor_ex.out", ldl_factor_ex_out);
  m.impl("linalg_ldl_solve.out", ldl_solve_out);
  m.impl("linalg_lstsq.out", lstsq_out);
  m.impl("linalg_matrix_exp", matrix_exp);
  m.impl("linalg_cross.out", cross_out);
  m.impl("vdot", vdot);
  m.impl("addbmm", addbmm);
  m.impl("addbmm.out", addbmm_out);
  m.impl("addbmm_", addbmm_);
}

}  // namespace torch_tpu
