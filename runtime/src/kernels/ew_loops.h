/*
 * ew_loops.h — the loop shapes of the elementwise instruction bodies
 * (ew_real.h, ew_complex.h, the integer body in elementwise.c): U, B and TR
 * apply `expr` over a block for one, two or three source registers a, b, c
 * into d (n elements, element type T, all in scope at the use). Each user
 * includes this inside its function and #undefs U, B and TR at its end.
 */
#define U(expr)                   \
  for (int i = 0; i < n; i++) {   \
    T x = a[i];                   \
    d[i] = (expr);                \
  }                               \
  break
#define B(expr)                   \
  for (int i = 0; i < n; i++) {   \
    T x = a[i], y = b[i];         \
    d[i] = (expr);                \
  }                               \
  break
#define TR(expr)                    \
  for (int i = 0; i < n; i++) {     \
    T x = a[i], y = b[i], z = c[i]; \
    d[i] = (expr);                  \
  }                                 \
  break
