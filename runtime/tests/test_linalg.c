/* test_linalg.c — tpurt_linalg against simple references: LU (P L U = A,
 * info on singular input), solve and inverse (A X = B residual), det vs
 * cofactor expansion, Cholesky (L L^T = A, info on indefinite input), SVD
 * (singular values of a diagonal matrix, U S Vh = A), eigh of a diagonal
 * matrix, QR (Q R = A), cross product, batched + broadcast inputs, empty
 * batches, NaN input and argument errors. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static tpurt_devptr upload(const void *h, size_t n) {
  tpurt_devptr d = 0;
  CHECK_OK(tpurt_malloc(0, n ? n : 8, S, &d));
  if (n) CHECK_OK(tpurt_memcpy_h2d(S, d, h, n, 0));
  return d;
}
static void download(void *h, tpurt_devptr d, size_t n) {
  CHECK_OK(tpurt_memcpy_d2h(S, h, d, n, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
}

static tpurt_view none(void) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ndim = -1;
  return v;
}

static const int64_t F0[4] = {0, 0, 0, 0};

static void test_lu_solve_inv_det(void) {
  /* batch of 2 3x3 matrices, the second singular */
  double A[18] = {4, 3, 2, 1, 5, 7, 2, 8, 6, /* */ 1, 2, 3, 2, 4, 6, 1, 1, 1};
  double B[6] = {1, 2, 3, 4, 5, 6}; /* 3x2 shared by both (broadcast) */
  tpurt_devptr dA = upload(A, sizeof A), dB = upload(B, sizeof B);
  tpurt_devptr dX, dLU, dP, dI, dD, dINV;
  CHECK_OK(tpurt_malloc(0, 12 * 8, S, &dX));
  CHECK_OK(tpurt_malloc(0, 18 * 8, S, &dLU));
  CHECK_OK(tpurt_malloc(0, 6 * 4, S, &dP));
  CHECK_OK(tpurt_malloc(0, 2 * 4, S, &dI));
  CHECK_OK(tpurt_malloc(0, 2 * 8, S, &dD));
  CHECK_OK(tpurt_malloc(0, 18 * 8, S, &dINV));
  int64_t s33[3] = {2, 3, 3}, s32[3] = {2, 3, 2}, s3[2] = {2, 3}, s1[1] = {2};
  tpurt_view vA = check_view(dA, TPURT_F64, 3, s33), vB = check_view(dB, TPURT_F64, 3, s32);
  vB.strides[0] = 0; /* broadcast */
  tpurt_view outs[4] = {check_view(dX, TPURT_F64, 3, s32), check_view(dLU, TPURT_F64, 3, s33),
                        check_view(dP, TPURT_I32, 2, s3), check_view(dI, TPURT_I32, 1, s1)};
  tpurt_view ins[2] = {vA, vB};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_SOLVE, 1, outs, 4, ins, 2, F0, 0));
  double X[12], LU[18];
  int32_t piv[6], info[2];
  download(X, dX, sizeof X);
  download(LU, dLU, sizeof LU);
  download(piv, dP, sizeof piv);
  download(info, dI, sizeof info);
  CHECK_EQ(info[0], 0);
  CHECK(info[1] > 0); /* singular */
  for (int i = 0; i < 3; i++) /* residual of A X = B for the first matrix */
    for (int j = 0; j < 2; j++) {
      double r = 0;
      for (int k = 0; k < 3; k++) r += A[i * 3 + k] * X[k * 2 + j];
      CHECK_NEAR(r, B[i * 2 + j], 1e-12);
    }
  /* LU unpack: P L U == A */
  tpurt_devptr dPm, dL, dU;
  CHECK_OK(tpurt_malloc(0, 18 * 8, S, &dPm));
  CHECK_OK(tpurt_malloc(0, 18 * 8, S, &dL));
  CHECK_OK(tpurt_malloc(0, 18 * 8, S, &dU));
  tpurt_view uo[3] = {check_view(dPm, TPURT_F64, 3, s33), check_view(dL, TPURT_F64, 3, s33),
                      check_view(dU, TPURT_F64, 3, s33)};
  tpurt_view ui[2] = {outs[1], outs[2]};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_LU_UNPACK, 1, uo, 3, ui, 2, F0, 0));
  double P[18], L[18], U[18];
  download(P, dPm, sizeof P);
  download(L, dL, sizeof L);
  download(U, dU, sizeof U);
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        double r = 0;
        for (int k = 0; k < 3; k++)
          for (int l = 0; l < 3; l++) r += P[b * 9 + i * 3 + k] * L[b * 9 + k * 3 + l] * U[b * 9 + l * 3 + j];
        CHECK_NEAR(r, A[b * 9 + i * 3 + j], 1e-12);
      }
  /* det: cofactor expansion */
  tpurt_view dout[4] = {check_view(dD, TPURT_F64, 1, s1), none(), none(), none()};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_DET, 1, dout, 4, &vA, 1, F0, 0));
  double D[2];
  download(D, dD, sizeof D);
  for (int b = 0; b < 2; b++) {
    const double *a = A + 9 * b;
    double want = a[0] * (a[4] * a[8] - a[5] * a[7]) - a[1] * (a[3] * a[8] - a[5] * a[6]) +
                  a[2] * (a[3] * a[7] - a[4] * a[6]);
    CHECK_NEAR(D[b], want, 1e-10);
  }
  /* inverse: A A^-1 = I for the regular matrix, info for the singular one */
  tpurt_view io[2] = {check_view(dINV, TPURT_F64, 3, s33), check_view(dI, TPURT_I32, 1, s1)};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_INV, 1, io, 2, &vA, 1, F0, 0));
  double INV[18];
  download(INV, dINV, sizeof INV);
  download(info, dI, sizeof info);
  CHECK_EQ(info[0], 0);
  CHECK(info[1] > 0);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      double r = 0;
      for (int k = 0; k < 3; k++) r += A[i * 3 + k] * INV[k * 3 + j];
      CHECK_NEAR(r, i == j, 1e-12);
    }
  tpurt_devptr all[] = {dA, dB, dX, dLU, dP, dI, dD, dINV, dPm, dL, dU};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpurt_free(all[i]);
}

static void test_cholesky_svd_eigh_qr(void) {
  float A[9] = {4, 2, 0, 2, 5, 1, 0, 1, 3}; /* SPD */
  int64_t s33[2] = {3, 3}, s3[1] = {3}, s0[1] = {0};
  (void)s0;
  tpurt_devptr dA = upload(A, sizeof A), dL, dI, dU, dS, dV, dQ, dR;
  CHECK_OK(tpurt_malloc(0, 9 * 4, S, &dL));
  CHECK_OK(tpurt_malloc(0, 4, S, &dI));
  CHECK_OK(tpurt_malloc(0, 9 * 4, S, &dU));
  CHECK_OK(tpurt_malloc(0, 3 * 4, S, &dS));
  CHECK_OK(tpurt_malloc(0, 9 * 4, S, &dV));
  CHECK_OK(tpurt_malloc(0, 9 * 4, S, &dQ));
  CHECK_OK(tpurt_malloc(0, 9 * 4, S, &dR));
  tpurt_view vA = check_view(dA, TPURT_F32, 2, s33);
  tpurt_view co[2] = {check_view(dL, TPURT_F32, 2, s33), check_view(dI, TPURT_I32, 0, NULL)};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_CHOLESKY, 0, co, 2, &vA, 1, F0, 0));
  float L[9];
  int32_t info;
  download(L, dL, sizeof L);
  download(&info, dI, 4);
  CHECK_EQ(info, 0);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      double r = 0;
      for (int k = 0; k < 3; k++) r += L[i * 3 + k] * L[j * 3 + k];
      CHECK_NEAR(r, A[i * 3 + j], 1e-5);
      if (j > i) CHECK(L[i * 3 + j] == 0);
    }
  /* SVD: U S Vh = A */
  tpurt_view so[3] = {check_view(dU, TPURT_F32, 2, s33), check_view(dS, TPURT_F32, 1, s3),
                      check_view(dV, TPURT_F32, 2, s33)};
  int64_t fl[4] = {0, 1, 0, 0};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_SVD, 0, so, 3, &vA, 1, fl, 0));
  float U[9], Sv[3], V[9];
  download(U, dU, sizeof U);
  download(Sv, dS, sizeof Sv);
  download(V, dV, sizeof V);
  CHECK(Sv[0] >= Sv[1] && Sv[1] >= Sv[2] && Sv[2] > 0);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      double r = 0;
      for (int k = 0; k < 3; k++) r += U[i * 3 + k] * Sv[k] * V[k * 3 + j];
      CHECK_NEAR(r, A[i * 3 + j], 1e-4);
    }
  /* eigh of a symmetric matrix: eigenvalues equal the singular values (SPD) */
  float w[3];
  tpurt_view eo[2] = {check_view(dS, TPURT_F32, 1, s3), none()};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_EIGH, 0, eo, 2, &vA, 1, F0, 0));
  download(w, dS, sizeof w);
  CHECK(w[0] <= w[1] && w[1] <= w[2]);
  CHECK_NEAR(w[2], Sv[0], 1e-4);
  CHECK_NEAR(w[0], Sv[2], 1e-4);
  /* QR: geqrf + orgqr, Q R = A */
  tpurt_view go[2] = {check_view(dR, TPURT_F32, 2, s33), check_view(dS, TPURT_F32, 1, s3)};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_GEQRF, 0, go, 2, &vA, 1, F0, 0));
  tpurt_view qo = check_view(dQ, TPURT_F32, 2, s33);
  CHECK_OK(tpurt_linalg(S, TPURT_LA_ORGQR, 0, &qo, 1, go, 2, F0, 0));
  float Q[9], R[9];
  download(Q, dQ, sizeof Q);
  download(R, dR, sizeof R);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      double r = 0;
      for (int k = 0; k <= j; k++) r += Q[i * 3 + k] * R[k * 3 + j];
      CHECK_NEAR(r, A[i * 3 + j], 1e-4);
    }
  /* an indefinite matrix reports info > 0 */
  float N[9] = {-1, 0, 0, 0, 1, 0, 0, 0, 1};
  CHECK_OK(tpurt_memcpy_h2d(S, dA, N, sizeof N, 0));
  CHECK_OK(tpurt_linalg(S, TPURT_LA_CHOLESKY, 0, co, 2, &vA, 1, F0, 0));
  download(&info, dI, 4);
  CHECK_EQ(info, 1);
  /* NaN input to the SVD fails the op at the next sync; the stream stays usable */
  float nan9[9];
  for (int i = 0; i < 9; i++) nan9[i] = NAN;
  CHECK_OK(tpurt_memcpy_h2d(S, dA, nan9, sizeof nan9, 0));
  CHECK_OK(tpurt_linalg(S, TPURT_LA_SVD, 0, so, 3, &vA, 1, fl, 0));
  CHECK(tpurt_stream_synchronize(S) != TPURT_OK);
  CHECK(strstr(tpurt_last_error(), "non-finite") != NULL);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_devptr all[] = {dA, dL, dI, dU, dS, dV, dQ, dR};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tpurt_free(all[i]);
}

static void test_cross_and_errors(void) {
  int64_t a[6] = {1, 0, 0, 0, 1, 0}, b[3] = {0, 1, 0}, o[6];
  int64_t s23[2] = {2, 3}, s3[2] = {2, 3};
  tpurt_devptr da = upload(a, sizeof a), db = upload(b, sizeof b), dout;
  CHECK_OK(tpurt_malloc(0, sizeof o, S, &dout));
  tpurt_view ins[2] = {check_view(da, TPURT_I64, 2, s23), check_view(db, TPURT_I64, 2, s3)};
  ins[1].strides[0] = 0;
  tpurt_view ov = check_view(dout, TPURT_I64, 2, s23);
  CHECK_OK(tpurt_linalg(S, TPURT_LA_CROSS, 1, &ov, 1, ins, 2, F0, 0));
  download(o, dout, sizeof o);
  int64_t want[6] = {0, 0, 1, 0, 0, 0};
  for (int i = 0; i < 6; i++) CHECK_EQ(o[i], want[i]);
  /* errors: wrong dtype, wrong arity, mismatched shapes */
  tpurt_view sq = check_view(da, TPURT_I64, 2, s23);
  tpurt_view lo[2] = {ov, ov};
  CHECK_ST(tpurt_linalg(S, TPURT_LA_INV, 0, lo, 2, &sq, 1, F0, 0), TPURT_ERR_NOT_SUPPORTED);
  CHECK_ST(tpurt_linalg(S, TPURT_LA_INV, 0, lo, 1, &sq, 1, F0, 0), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_view fa = check_view(da, TPURT_F64, 2, s23); /* 2x3: not square */
  tpurt_view fo[2] = {check_view(dout, TPURT_F64, 2, s23), check_view(dout, TPURT_I32, 0, NULL)};
  CHECK_ST(tpurt_linalg(S, TPURT_LA_INV, 0, fo, 2, &fa, 1, F0, 0), TPURT_ERR_INVALID_ARGUMENT);
  /* empty batch: nothing to do */
  int64_t e33[3] = {0, 3, 3}, e0[1] = {0};
  tpurt_view ea = check_view(0, TPURT_F64, 3, e33);
  tpurt_view eo[2] = {check_view(0, TPURT_F64, 3, e33), check_view(0, TPURT_I32, 1, e0)};
  CHECK_OK(tpurt_linalg(S, TPURT_LA_INV, 1, eo, 2, &ea, 1, F0, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(da);
  tpurt_free(db);
  tpurt_free(dout);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  test_lu_solve_inv_det();
  test_cholesky_svd_eigh_qr();
  test_cross_and_errors();
  TEST_MAIN_END();
}
