"""Linear algebra on the tpu device (LAPACK in the runtime) vs PyTorch CPU:
SVD, triangular solves, LU family, solve/inv/det/slogdet, eigh/eig, QR
family, Cholesky family, LDL, lstsq, matrix_exp, cross, vdot, addbmm,
trace. float32/float64, batches with broadcasting, non-contiguous inputs,
out=, autograd against CPU, and the error cases (LinAlgError for singular /
non positive-definite matrices, RuntimeError for bad shapes)."""
from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-9, atol=1e-9)}
FLOATS = [torch.float32, torch.float64]


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def well_cond(*shape, dtype=torch.float64, seed=0):
    a = rand(*shape, dtype=torch.float64, seed=seed)
    n = shape[-1]
    return (a + n * torch.eye(n, dtype=torch.float64)).to(dtype)


def spd(*shape, dtype=torch.float64, seed=0):
    a = rand(*shape, dtype=torch.float64, seed=seed)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


def tpu(x):
    return x.to("tpu")


def close(got, want):
    assert got.device.type == "tpu"
    got = got.cpu()
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = TOL.get(want.dtype if not want.is_complex() else (torch.float32 if want.dtype == torch.complex64 else torch.float64), dict(rtol=0, atol=0))
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3), (0, 3), (2, 0, 0)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(dtype, shape, full):
    a = rand(*shape, dtype=dtype)
    U, S, Vh = torch.linalg.svd(tpu(a), full_matrices=full)
    U0, S0, Vh0 = torch.linalg.svd(a, full_matrices=full)
    close(S, S0)
    assert U.shape == U0.shape and Vh.shape == Vh0.shape
    k = min(shape[-2], shape[-1])
    rec = U.cpu()[..., :k] @ torch.diag_embed(S.cpu()).to(dtype) @ Vh.cpu()[..., :k, :]
    torch.testing.assert_close(rec, a, **TOL[dtype])
    # singular vectors agree up to sign
    torch.testing.assert_close(U.cpu()[..., :k].abs(), U0[..., :k].abs(), **TOL[dtype])
    close(torch.linalg.svdvals(tpu(a)), torch.linalg.svdvals(a))


def test_svd_noncontig_out_and_grad():
    a = rand(6, 4).mT  # non-contiguous 4x6
    S = torch.empty(0, dtype=torch.float64, device="tpu")
    U = torch.empty(0, dtype=torch.float64, device="tpu")
    Vh = torch.empty(0, dtype=torch.float64, device="tpu")
    torch.linalg.svd(tpu(a), full_matrices=False, out=(U, S, Vh))
    close(S, torch.linalg.svdvals(a))
    x = tpu(a).requires_grad_()
    x0 = a.clone().requires_grad_()
    torch.linalg.svdvals(x).sum().backward()
    torch.linalg.svdvals(x0).sum().backward()
    close(x.grad, x0.grad)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular(dtype, upper, left, unit):
    A = well_cond(2, 4, 4, dtype=dtype)
    A = A.triu() if upper else A.tril()
    B = rand(3, 1, 4, 2, dtype=dtype, seed=1) if left else rand(3, 1, 2, 4, dtype=dtype, seed=1)
    want = torch.linalg.solve_triangular(A, B, upper=upper, left=left, unitriangular=unit)
    close(torch.linalg.solve_triangular(tpu(A), tpu(B), upper=upper, left=left, unitriangular=unit), want)
    out = torch.empty(0, dtype=dtype, device="tpu")
    torch.linalg.solve_triangular(tpu(A), tpu(B), upper=upper, left=left, unitriangular=unit, out=out)
    close(out, want)


def test_triangular_solve_and_errors():
    A = well_cond(4, 4).triu()
    B = rand(4, 3, seed=2)
    for tr in (False, True):
        X, M = torch.triangular_solve(tpu(B), tpu(A), upper=True, transpose=tr)
        X0, M0 = torch.triangular_solve(B, A, upper=True, transpose=tr)
        close(X, X0)
        close(M, M0)
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        torch.linalg.solve_triangular(tpu(A), tpu(rand(3, 2)), upper=True)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.linalg.solve_triangular(tpu(A), tpu(B.float()), upper=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 3, 3)])
def test_lu_family(dtype, shape):
    a = rand(*shape, dtype=dtype)
    LU, piv, info = torch.linalg.lu_factor_ex(tpu(a))
    LU0, piv0, info0 = torch.linalg.lu_factor_ex(a)
    close(LU, LU0)
    close(piv, piv0)
    close(info, info0)
    P, L, U = torch.linalg.lu(tpu(a))
    P0, L0, U0 = torch.linalg.lu(a)
    close(P, P0)
    close(L, L0)
    close(U, U0)
    P, L, U = torch.lu_unpack(LU, piv)
    close(P, P0)
    close(L, L0)
    close(U, U0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(dtype, left, adjoint):
    A = well_cond(2, 4, 4, dtype=dtype)
    B = rand(2, 4, 3, dtype=dtype, seed=3) if left else rand(2, 3, 4, dtype=dtype, seed=3)
    LU, piv = torch.linalg.lu_factor(A)
    want = torch.linalg.lu_solve(LU, piv, B, left=left, adjoint=adjoint)
    close(torch.linalg.lu_solve(tpu(LU), tpu(piv), tpu(B), left=left, adjoint=adjoint), want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_solve_inv_det(dtype):
    A = well_cond(3, 4, 4, dtype=dtype)
    B = rand(4, 2, dtype=dtype, seed=4)
    b = rand(3, 4, dtype=dtype, seed=5)
    close(torch.linalg.solve(tpu(A), tpu(B)), torch.linalg.solve(A, B))
    close(torch.linalg.solve(tpu(A), tpu(b)), torch.linalg.solve(A, b))
    close(torch.linalg.solve(tpu(A), tpu(B.mT), left=False), torch.linalg.solve(A, B.mT, left=False))
    close(torch.linalg.inv(tpu(A)), torch.linalg.inv(A))
    close(torch.linalg.det(tpu(A)), torch.linalg.det(A))
    s, l = torch.linalg.slogdet(tpu(A))
    s0, l0 = torch.linalg.slogdet(A)
    close(s, s0)
    close(l, l0)
    close(torch.logdet(tpu(spd(4, 4, dtype=dtype))), torch.logdet(spd(4, 4, dtype=dtype)))
    sing = torch.zeros(3, 3, dtype=dtype)
    close(torch.linalg.det(tpu(sing)), torch.linalg.det(sing))
    s, l = torch.linalg.slogdet(tpu(sing))
    assert s.item() == 0 and l.item() == float("-inf")


def test_singular_errors():
    sing = torch.ones(3, 3, dtype=torch.float64)
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(tpu(sing))
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.solve(tpu(sing), tpu(torch.ones(3, 1, dtype=torch.float64)))
    inv, info = torch.linalg.inv_ex(tpu(sing))
    assert info.item() == torch.linalg.inv_ex(sing)[1].item()
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        torch.linalg.cholesky(tpu(-torch.eye(3, dtype=torch.float64)))
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.inv(tpu(rand(3, 4)))
    # the device stays usable
    close(torch.linalg.inv(tpu(well_cond(3, 3))), torch.linalg.inv(well_cond(3, 3)))


@pytest.mark.parametrize("dtype", FLOATS)
def test_autograd_solve_inv_det(dtype):
    A = well_cond(3, 3, dtype=dtype)
    B = rand(3, 2, dtype=dtype, seed=6)
    for fn in (lambda a, b: torch.linalg.solve(a, b).sum(), lambda a, b: (torch.linalg.inv(a) @ b).sum(),
               lambda a, b: torch.linalg.det(a) * b.sum(), lambda a, b: torch.linalg.slogdet(a)[1] + b.sum()):
        a, bb = tpu(A).requires_grad_(), tpu(B).requires_grad_()
        a0, b0 = A.clone().requires_grad_(), B.clone().requires_grad_()
        fn(a, bb).backward()
        fn(a0, b0).backward()
        close(a.grad, a0.grad)
        close(bb.grad, b0.grad)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(dtype, uplo):
    A = spd(2, 5, 5, dtype=dtype)
    w, V = torch.linalg.eigh(tpu(A), UPLO=uplo)
    w0, V0 = torch.linalg.eigh(A, UPLO=uplo)
    close(w, w0)
    close(V.abs(), V0.abs())
    close(torch.linalg.eigvalsh(tpu(A)), torch.linalg.eigvalsh(A))
    x, x0 = tpu(A).requires_grad_(), A.clone().requires_grad_()
    torch.linalg.eigvalsh(x).sum().backward()
    torch.linalg.eigvalsh(x0).sum().backward()
    close(x.grad, x0.grad)


@pytest.mark.parametrize("dtype", FLOATS)
def test_eig(dtype):
    A = rand(4, 4, dtype=dtype, seed=7)
    w, V = torch.linalg.eig(tpu(A))
    w0, V0 = torch.linalg.eig(A)
    close(w, w0)
    close(V.abs(), V0.abs())  # eigenvectors agree up to a phase
    close(torch.linalg.eigvals(tpu(A)), torch.linalg.eigvals(A))
    with pytest.raises(RuntimeError, match="infs or NaNs"):
        torch.linalg.eig(tpu(torch.full((2, 2), float("nan"), dtype=dtype)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr(dtype, mode, shape):
    a = rand(*shape, dtype=dtype)
    Q, R = torch.linalg.qr(tpu(a), mode=mode)
    Q0, R0 = torch.linalg.qr(a, mode=mode)
    close(R, R0)
    if mode != "r":
        close(Q, Q0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_geqrf_ormqr_householder(dtype):
    a = rand(5, 3, dtype=dtype)
    qr, tau = torch.geqrf(tpu(a))
    qr0, tau0 = torch.geqrf(a)
    close(qr, qr0)
    close(tau, tau0)
    close(torch.linalg.householder_product(qr, tau), torch.linalg.householder_product(qr0, tau0))
    c = rand(5, 2, dtype=dtype, seed=8)
    for left, tr in ((True, False), (True, True)):
        close(torch.ormqr(qr, tau, tpu(c), left, tr), torch.ormqr(qr0, tau0, c, left, tr))
    c2 = rand(2, 5, dtype=dtype, seed=9)
    close(torch.ormqr(qr, tau, tpu(c2), False, True), torch.ormqr(qr0, tau0, c2, False, True))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family(dtype, upper):
    A = spd(2, 4, 4, dtype=dtype)
    L = torch.linalg.cholesky(tpu(A), upper=upper)
    L0 = torch.linalg.cholesky(A, upper=upper)
    close(L, L0)
    close(torch.cholesky_inverse(L, upper=upper), torch.cholesky_inverse(L0, upper=upper))
    B = rand(4, 3, dtype=dtype, seed=10)
    close(torch.cholesky_solve(tpu(B), L, upper=upper), torch.cholesky_solve(B, L0, upper=upper))
    x, x0 = tpu(A).requires_grad_(), A.clone().requires_grad_()
    torch.linalg.cholesky(x, upper=upper).sum().backward()
    torch.linalg.cholesky(x0, upper=upper).sum().backward()
    close(x.grad, x0.grad)


@pytest.mark.parametrize("dtype", FLOATS)
def test_ldl(dtype):
    a = rand(4, 4, dtype=dtype)
    A = a + a.mT
    LD, piv = torch.linalg.ldl_factor(tpu(A))
    LD0, piv0 = torch.linalg.ldl_factor(A)
    close(LD, LD0)
    close(piv, piv0)
    B = rand(4, 2, dtype=dtype, seed=11)
    close(torch.linalg.ldl_solve(LD, piv, tpu(B)), torch.linalg.ldl_solve(LD0, piv0, B))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", [(6, 3), (3, 5)])
def test_lstsq(dtype, driver, shape):
    if driver == "gels" and shape[0] < shape[1]:
        shape = (shape[1], shape[0])
    A = rand(*shape, dtype=dtype)
    B = rand(shape[0], 2, dtype=dtype, seed=12)
    r = torch.linalg.lstsq(tpu(A), tpu(B), driver=driver)
    r0 = torch.linalg.lstsq(A, B, driver=driver)
    for g, w in zip(r, r0):
        close(g, w)


@pytest.mark.parametrize("dtype", FLOATS)
def test_matrix_exp(dtype):
    A = rand(3, 4, 4, dtype=dtype) * 2
    close(torch.linalg.matrix_exp(tpu(A)), torch.linalg.matrix_exp(A))
    z = torch.zeros(2, 2, dtype=dtype)
    close(torch.linalg.matrix_exp(tpu(z)), torch.linalg.matrix_exp(z))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_cross(dtype):
    a = (rand(4, 3, 2) * 10).to(dtype)
    b = (rand(1, 3, 2, seed=13) * 10).to(dtype)
    close(torch.linalg.cross(tpu(a), tpu(b), dim=1), torch.linalg.cross(a, b, dim=1))
    out = torch.empty(0, dtype=dtype, device="tpu")
    torch.linalg.cross(tpu(a.mT), tpu(b.mT), out=out)
    close(out, torch.linalg.cross(a.mT, b.mT))
    with pytest.raises(RuntimeError, match="must have length 3"):
        torch.linalg.cross(tpu(a), tpu(b), dim=2)


def test_vdot_addbmm_trace():
    a, b = rand(7), rand(7, seed=14)
    close(torch.vdot(tpu(a), tpu(b)), torch.vdot(a, b))
    s, b1, b2 = rand(3, 4), rand(5, 3, 2, seed=15), rand(5, 2, 4, seed=16)
    close(torch.addbmm(tpu(s), tpu(b1), tpu(b2), beta=0.5, alpha=2), torch.addbmm(s, b1, b2, beta=0.5, alpha=2))
    x = tpu(s)
    x.addbmm_(tpu(b1), tpu(b2))
    close(x, s.clone().addbmm_(b1, b2))
    m = rand(4, 5)
    close(torch.trace(tpu(m)), torch.trace(m))
    mi = (m * 10).long()
    close(torch.trace(tpu(mi)), torch.trace(mi))


def test_pinv_matrix_norm_and_lowrank():
    a = rand(5, 3)
    close(torch.linalg.pinv(tpu(a)), torch.linalg.pinv(a))
    close(torch.linalg.matrix_norm(tpu(a), ord="nuc"), torch.linalg.matrix_norm(a, ord="nuc"))
    close(torch.linalg.matrix_norm(tpu(a), ord=2), torch.linalg.matrix_norm(a, ord=2))
    close(torch.linalg.matrix_rank(tpu(a)), torch.linalg.matrix_rank(a))


def test_unsupported_dtypes():
    with pytest.raises(RuntimeError, match="Low precision"):
        torch.linalg.inv(tpu(well_cond(3, 3)).half())
    with pytest.raises(NotImplementedError):
        torch.geqrf(tpu(well_cond(3, 3)).to(torch.complex64))
