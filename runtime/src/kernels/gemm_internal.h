/* gemm_internal.h — helpers shared by the GEMM-based kernels (gemm.c,
 * conv.c): per-thread scratch buffers, f32 packing with precision modes,
 * row-major GEMM entry points on host (already translated) pointers. */
#ifndef TPURT_GEMM_INTERNAL_H
#define TPURT_GEMM_INTERNAL_H
#include "../internal.h"

TPURT_INTERNAL void tpurt__gemm_lib_init(void);
/* Per-thread buffer `slot` (0..10) of at least `bytes`; slots 6, 7 belong to tpurt__sgemm, 8 to the
 * elementwise interpreter's register blocks, 9 and 10 to sort's line buffers. */
TPURT_INTERNAL void *tpurt__scratch(int slot, size_t bytes);
/* bgemm.c's grow-only buffer of the calling thread (64-byte aligned; NULL
 * when out of memory) for a kernel that runs no bf16 product meanwhile. */
TPURT_INTERNAL void *tpurt__bgemm_thread_buf(size_t bytes);
TPURT_INTERNAL void tpurt__scratch_trim(void);
/* rows x cols strided matrix -> row-major f32; mode 0 plain, 1 bf16-rounded,
 * 2 HIGH split of a left operand ([hi|hi|lo], ld 3*cols), 3 HIGH split of a
 * right operand (hi rows, lo rows, hi rows; dst holds 3*rows rows). */
TPURT_INTERNAL void tpurt__pack_f32(float *dst, const void *src, tpurt_dtype dt, int64_t rows, int64_t cols,
                                    int64_t rs, int64_t cs, int mode);
TPURT_INTERNAL void tpurt__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                                 tpurt_precision prec);
/* nb f32 products C_i = alpha op(A_i) op(B_i) + beta C_i at batch strides
 * sa, sb, sc (elements; sa/sb may be 0, sc only when nb == 1), full f32
 * precision, tiled over batch x rows x columns on the pool. */
TPURT_INTERNAL void tpurt__sgemm_batched(int ta, int tb, int64_t nb, int64_t M, int64_t N, int64_t K, float alpha,
                                         const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb,
                                         int64_t sb, float beta, float *C, int64_t ldc, int64_t sc);
/* An epilogue of an f32 product: fn(ctx, bi, r0, r1, c0, c1) runs once
 * for each block of a partition of C, on the thread that computed the
 * block, as soon as rows [r0, r1) x columns [c0, c1) of product bi hold
 * their final values. */
typedef struct {
  void (*fn)(void *ctx, int64_t bi, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
  void *ctx;
} tpurt__gemm_epi;
/* The runtime's own packed f32 GEMM (sgemm.c): same contract as
 * tpurt__sgemm_batched with K > 0; flags: 1 the portable micro-kernel, 2
 * the path taken when its packing buffers cannot be allocated; epi: an
 * epilogue or NULL. */
TPURT_INTERNAL void tpurt__sgemm_own(int ta, int tb, int64_t nb, int64_t M, int64_t N, int64_t K, float alpha,
                                     const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb,
                                     float beta, float *C, int64_t ldc, int64_t sc, int flags,
                                     const tpurt__gemm_epi *epi);
/* Implicit-GEMM convolution on the own kernel (sgemm.c): the column
 * matrix of a 2-D convolution is never stored, its panels are gathered
 * from the images while the GEMM packs them. One group's geometry:
 * element (c, h, w) of image n at x[n * img + (c * H + h) * W + w];
 * output position (oh, ow) reads input (oh * sh - ph + r * dh, ow * sw -
 * pw + s * dw) for tap (r, s), zero outside [0, H) x [0, W). */
typedef struct {
  const float *x;
  int64_t img, C, H, W;
  int64_t N, Ho, Wo;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} tpurt_conv_cols;
/* kind 0 (forward): y[n * y_img + m * L + o] = sum_k w[m * ldw + k] col[k][(n, o)]
 *   for m < M, L = Ho * Wo, k over (c, r, s).
 * kind 1 (weight gradient): dw[m * ldw + k] = beta * dw + sum_(n, o)
 *   dy[n * y_img + m * L + o] col[k][(n, o)]  (w is dw, y is dy).
 * flags as tpurt__sgemm_own. */
TPURT_INTERNAL void tpurt__sgemm_conv(int kind, const tpurt_conv_cols *g, int64_t M, float *w, int64_t ldw,
                                      float *y, int64_t y_img, float beta, int flags);
/* TORCH_TPU_SGEMM: 0 auto (by shape), 1 own kernel, 2 OpenBLAS tiles,
 * 3 own kernel with the portable micro-kernel, 4 own kernel without its
 * packing buffers, 5 own kernel with the AVX2 6 x 16 tiles on an AVX-512 CPU. */
TPURT_INTERNAL int tpurt__sgemm_mode(void);
/* CPU features (detected once): AVX2 with FMA (the 8-lane kernels), and
 * AVX-512F (16-lane kernels: the own GEMM then runs full pairs of 16-wide
 * slivers as 8 x 32 tiles). */
TPURT_INTERNAL int tpurt__cpu_has_avx2_fma(void);
TPURT_INTERNAL int tpurt__cpu_has_avx512(void);
/* "8x32 + 8x16 AVX-512", "6x16 AVX2/FMA" or "6x16 portable": the
 * micro-kernels chosen for this CPU. */
TPURT_INTERNAL const char *tpurt__sgemm_kernel_name(void);
/* A strided matrix of bf16 or f32 elements (host pointer; strides in
 * elements), an operand or result of tpurt__bgemm. */
typedef struct {
  const void *p;
  tpurt_dtype dt;
  int64_t rs, cs;
} tpurt__bmat;
/* The CPU has a bf16 GEMM at the level in force (AMX tiles or AVX512-BF16
 * dot products) and TORCH_TPU_BGEMM is not 0. */
TPURT_INTERNAL int tpurt__bgemm_applies(void);
/* ... and it runs on the AMX tiles. */
TPURT_INTERNAL int tpurt__bgemm_amx(void);
/* nb products C_i = alpha op(A_i) op(B_i) + beta C_i on bf16 values with f32
 * accumulation (bgemm.c): A (M x K) and B (K x N) bf16 or f32 (rounded to
 * bf16; split != 0: HIGH precision's hi/lo split, K tripled), C f32, bf16
 * or f16; batch strides sa, sb, sc in elements. 0 (nothing written) when
 * its buffers cannot be allocated. */
TPURT_INTERNAL int tpurt__bgemm(int64_t nb, int64_t M, int64_t N, int64_t K, float alpha, const tpurt__bmat *A,
                                int64_t sa, const tpurt__bmat *B, int64_t sb, int split, float beta,
                                const tpurt__bmat *C, int64_t sc);
/* A product on the tile unit whose operands the caller packs and whose
 * result it stores (bconv.c: a convolution's column matrix gathered from
 * the images, the result scattered into them). Each hook gets the hooks
 * pointer back (embed it first in a larger struct for context).
 *   pack_a: rows i0..i0+31 of A, k's k0..k0+kc-1 (kc a multiple of 32) as
 *           bf16 at d[r * ld + q], zero past M and K; NULL: A from the bmat
 *   pack_b: columns j0..j0+15 of B, k's k0..k0+kc-1 (kc even) as pairs
 *           d[p * 16 + j] = B[k0 + 2p, j] | B[k0 + 2p + 1, j] << 16, zero
 *           past N and K
 *   out:    rows i0..i0+m-1, columns j0..j0+n-1 of the f32 product C = A B
 *           at t[(i - i0) * ldt + (j - j0)], each element once, when final.
 * Hooks run on pool threads, concurrently. 0 (nothing run) without the
 * tile unit (TORCH_TPU_ISA, TORCH_TPU_BGEMM=0) or buffers. */
typedef struct tpurt__bhooks tpurt__bhooks;
struct tpurt__bhooks {
  void (*pack_a)(const tpurt__bhooks *h, uint16_t *d, int64_t ld, int64_t i0, int64_t k0, int64_t kc);
  void (*pack_b)(const tpurt__bhooks *h, uint32_t *d, int64_t j0, int64_t k0, int64_t kc);
  void (*out)(const tpurt__bhooks *h, const float *t, int64_t ldt, int64_t i0, int64_t m, int64_t j0, int64_t n);
};
TPURT_INTERNAL int tpurt__bgemm_hooked(int64_t M, int64_t N, int64_t K, const tpurt__bmat *A,
                                       const tpurt__bhooks *hk);
/* bf16 2-D convolutions on the tile unit (bconv.c), 5-D views with D = 1:
 * applies when the tile unit serves bf16 products and TORCH_TPU_CONV_AMX
 * is not 0; each returns 1 when done, 0 when the caller must run the f32
 * path (memory, a non-finite image value in a weight gradient). */
TPURT_INTERNAL int tpurt__bconv_applies(void);
TPURT_INTERNAL int tpurt__bconv_forward(const tpurt_view *y, const tpurt_view *x, const tpurt_view *w,
                                        const tpurt_view *bias, const tpurt_conv3d_params *p);
TPURT_INTERNAL int tpurt__bconv_backward_input(const tpurt_view *dx, const tpurt_view *dy, const tpurt_view *w,
                                               const tpurt_view *bias, const tpurt_conv3d_params *p);
TPURT_INTERNAL int tpurt__bconv_backward_weight(const tpurt_view *dw, const tpurt_view *dy, const tpurt_view *x,
                                                const tpurt_conv3d_params *p);
TPURT_INTERNAL void tpurt__dgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A,
                                 int64_t lda, const double *B, int64_t ldb, double beta, double *C, int64_t ldc);
/* Validates a view of ndim dims (dtype, sizes, device range). */
TPURT_INTERNAL tpurt_status tpurt__check_kernel_view(const tpurt_view *v, int ndim, const char *op, const char *what);
/* The same for a view the kernel only reads (noted read-only while the
 * launch is recorded: DeferAndFuse then knows the kernel does not write it). */
TPURT_INTERNAL tpurt_status tpurt__check_kernel_input(const tpurt_view *v, int ndim, const char *op, const char *what);
#endif
