/*
 * ew_special.h — scalar special functions of the elementwise interpreter,
 * evaluated in double (the float instantiation rounds once at the end).
 * Included by elementwise.c before the instruction loops.
 *
 * Methods (all written from the mathematics):
 *   i0, i1 (and exp-scaled)  power series (positive terms) for |x| <= 30,
 *                            Hankel asymptotic expansion above
 *   k0, k1 (and scaled)      series with harmonic numbers for x <= 2,
 *                            trapezoidal rule on K_v(x) = int_0^inf
 *                            exp(-x cosh t) cosh(v t) dt for 2 < x <= 25,
 *                            asymptotic expansion above
 *   j0, j1, y0, y1           the C library (POSIX)
 *   airy Ai                  Maclaurin series, K_{1/3} for x > 2,
 *                            asymptotic expansions for large |x|
 *   Hurwitz zeta             Euler-Maclaurin summation (polygamma n >= 1)
 *   igamma / igammac         series for x < a + 1, Lentz continued fraction
 *   ndtri                    erfinv in the centre, Newton on log ndtr in the
 *                            tails (Abramowitz-Stegun 26.2.23 start)
 *   erfcx                    erfc * exp with the square split exactly;
 *                            asymptotic series for x > 26
 */

static const double EWS_EULER = 0.57721566490153286061;

/* ---------------------------------------------- modified Bessel I0, I1 */

/* series sum_k (x^2/4)^k / (k! (k+nu)!) for nu = 0, 1 */
static double ews_iseries(double ax, int nu) {
  double q = 0.25 * ax * ax, term = 1.0, sum = 1.0;
  if (nu == 1) term = sum = 1.0;
  for (int k = 1; k < 500; k++) {
    term *= q / ((double)k * (double)(k + nu));
    sum += term;
    if (term < 1e-17 * sum) break;
  }
  return sum;
}

/* e^{-x} I_nu(x) * sqrt(2 pi x) for large x: sum_k (-1)^k a_k(nu) / x^k */
static double ews_iasym(double ax, int nu) {
  double mu = 4.0 * nu * nu, term = 1.0, sum = 1.0;
  for (int k = 1; k < 60; k++) {
    double f = (double)(2 * k - 1);
    double nt = -term * (mu - f * f) / (8.0 * k * ax);
    if (fabs(nt) > fabs(term)) break;
    term = nt;
    sum += term;
    if (fabs(term) < 1e-17 * fabs(sum)) break;
  }
  return sum / sqrt(2.0 * M_PI * ax);
}

/* scaled: e^{-|x|} I_nu(x) */
static double ews_bessel_i(double x, int nu, int scaled) {
  if (x != x) return x;
  double ax = fabs(x), r;
  if (ax == INFINITY) return scaled ? (nu == 1 && x < 0 ? -0.0 : 0.0) : NAN; /* as PyTorch's CPU kernel */
  if (ax <= 30.0) {
    double s = ews_iseries(ax, nu);
    if (nu == 1) s *= 0.5 * ax;
    r = scaled ? s * exp(-ax) : s;
  } else {
    double s = ews_iasym(ax, nu);
    if (scaled) {
      r = s;
    } else {
      r = s * exp(ax); /* overflows where exp(|x|) does */
    }
  }
  return (nu == 1 && x < 0) ? -r : r;
}

/* ---------------------------------------------- modified Bessel K0, K1 */

/* K_nu(x) e^{x} by the trapezoidal rule (2 < x <= 25) */
static double ews_kquad(double x, double nu) {
  const double h = 0.0625;
  double sum = 0.5;
  for (int k = 1; k < 2000; k++) {
    double t = k * h;
    double e = exp(-x * (cosh(t) - 1.0));
    double v = e * cosh(nu * t);
    sum += v;
    if (e < 1e-18) break;
  }
  return sum * h;
}

/* K_nu(x) e^{x} sqrt(2x/pi), asymptotic (x > 25) */
static double ews_kasym(double x, double nu) {
  double mu = 4.0 * nu * nu, term = 1.0, sum = 1.0;
  for (int k = 1; k < 60; k++) {
    double f = (double)(2 * k - 1);
    double nt = term * (mu - f * f) / (8.0 * k * x);
    if (fabs(nt) > fabs(term)) break;
    term = nt;
    sum += term;
    if (fabs(term) < 1e-17 * fabs(sum)) break;
  }
  return sum;
}

/* scaled: e^{x} K_nu(x) */
static double ews_bessel_k(double x, int nu, int scaled) {
  if (x != x) return x;
  if (x < 0) return NAN;
  if (x == 0) return INFINITY;
  if (x == INFINITY) return scaled ? 0.0 : 0.0;
  if (x <= 2.0) {
    double q = 0.25 * x * x, lg = log(0.5 * x), r;
    if (nu == 0) {
      /* K0 = -(ln(x/2) + gamma) I0 + sum q^k / (k!)^2 H_k */
      double term = 1.0, i0 = 1.0, hs = 0.0, H = 0.0;
      for (int k = 1; k < 100; k++) {
        term *= q / ((double)k * k);
        H += 1.0 / k;
        i0 += term;
        hs += term * H;
        if (term < 1e-18 * i0) break;
      }
      r = -(lg + EWS_EULER) * i0 + hs;
    } else {
      /* K1 = 1/x + ln(x/2) I1 - x/4 sum (psi(k+1) + psi(k+2)) q^k / (k!(k+1)!) */
      double term = 1.0, i1 = 1.0, H = 0.0;
      double ps = (-2.0 * EWS_EULER + 1.0) * term;
      for (int k = 1; k < 100; k++) {
        term *= q / ((double)k * (k + 1));
        H += 1.0 / k;
        i1 += term;
        ps += term * (-2.0 * EWS_EULER + 2.0 * H + 1.0 / (k + 1));
        if (term < 1e-18 * i1) break;
      }
      r = 1.0 / x + lg * 0.5 * x * i1 - 0.25 * x * ps;
    }
    return scaled ? r * exp(x) : r;
  }
  double s = x <= 25.0 ? ews_kquad(x, nu) : ews_kasym(x, nu) * sqrt(M_PI / (2.0 * x));
  return scaled ? s : s * exp(-x);
}

/* --------------------------------------------------------------- Airy */

static double ews_airy_ai(double x) {
  if (x != x) return x;
  if (isinf(x)) return NAN; /* as PyTorch's CPU kernel */
  if (x > 2.0) {
    double z = 2.0 / 3.0 * x * sqrt(x);
    if (z > 740.0) return 0.0;
    double ks;
    if (z <= 25.0) {
      ks = ews_kquad(z, 1.0 / 3.0);
    } else {
      /* Ai ~ e^{-z} / (2 sqrt(pi) x^{1/4}) sum (-1)^k u_k z^{-k} */
      double u = 1.0, sum = 1.0;
      for (int k = 1; k < 40; k++) {
        double nu = u * (6.0 * k - 5.0) * (6.0 * k - 3.0) * (6.0 * k - 1.0) / ((2.0 * k - 1.0) * 216.0 * k) / z;
        if (nu > u) break;
        u = nu;
        sum += (k & 1) ? -u : u;
        if (u < 1e-17) break;
      }
      return exp(-z) * sum / (2.0 * sqrt(M_PI) * sqrt(sqrt(x)));
    }
    return sqrt(x / 3.0) / M_PI * ks * exp(-z);
  }
  if (x < -7.0) {
    double ax = -x, z = 2.0 / 3.0 * ax * sqrt(ax);
    double u = 1.0, P = 1.0, Q = 0.0;
    for (int k = 1; k < 60; k++) {
      double nu = u * (6.0 * k - 5.0) * (6.0 * k - 3.0) * (6.0 * k - 1.0) / ((2.0 * k - 1.0) * 216.0 * k) / z;
      if (nu > u) break;
      u = nu;
      /* even k -> P with sign (-1)^(k/2); odd k -> Q with sign (-1)^((k-1)/2) */
      if (k & 1)
        Q += ((k >> 1) & 1) ? -u : u;
      else
        P += ((k >> 1) & 1) ? -u : u;
      if (u < 1e-17) break;
    }
    double th = z + M_PI / 4.0;
    return (sin(th) * P - cos(th) * Q) / (sqrt(M_PI) * sqrt(sqrt(ax)));
  }
  const double c1 = 0.355028053887817239260, c2 = 0.258819403792806798405;
  double x3 = x * x * x, f = 1.0, g = x, tf = 1.0, tg = x;
  for (int k = 1; k < 200; k++) {
    tf *= x3 / ((3.0 * k - 1.0) * (3.0 * k));
    tg *= x3 / ((3.0 * k) * (3.0 * k + 1.0));
    f += tf;
    g += tg;
    if (fabs(tf) < 1e-18 * fabs(f) && fabs(tg) < 1e-18 * fabs(g) + 1e-300) break;
  }
  return c1 * f - c2 * g;
}

/* ------------------------------------------------- Hurwitz zeta, polygamma */

static double ews_zeta(double s, double q) {
  if (s != s || q != q) return NAN;
  if (s == 1.0) return INFINITY;
  if (s < 1.0) return NAN;
  if (s == INFINITY) return q == 1.0 ? 1.0 : (q > 0 && q < 1.0 ? INFINITY : NAN); /* as PyTorch's CPU kernel */
  if (q <= 0.0) {
    if (q == floor(q)) return INFINITY;
    if (s != floor(s)) return NAN;
  }
  if (q == INFINITY) return NAN; /* as PyTorch's CPU kernel */
  /* B_{2j} / (2j)! */
  static const double B[12] = {8.333333333333333e-02,  -1.388888888888889e-03, 3.306878306878307e-05,
                               -8.267195767195768e-07, 2.08767569878681e-08,   -5.284190138687493e-10,
                               1.3382536530684679e-11, -3.3896802963225827e-13, 8.586062056277845e-15,
                               -2.174868698558062e-16, 5.5090028283602295e-18, -1.3954464685812522e-19};
  double sum = 0.0, a = q;
  int n = 0;
  while (a < 10.0 || n < 2) {
    sum += pow(a, -s);
    a += 1.0;
    n++;
    if (n > 100000) break;
  }
  double tail = pow(a, 1.0 - s) / (s - 1.0) + 0.5 * pow(a, -s);
  double fac = s * pow(a, -s - 1.0); /* s (s+1) ... (s+2j-2) a^{-s-2j+1} */
  for (int j = 0; j < 12; j++) {
    double t = B[j] * fac;
    tail += t;
    if (fabs(t) < 1e-17 * fabs(sum + tail)) break;
    fac *= (s + 2.0 * j + 1.0) * (s + 2.0 * j + 2.0) / (a * a);
  }
  return sum + tail;
}

static double ews_trigamma(double x) {
  if (x != x) return x;
  if (x == INFINITY) return 0.0;
  if (x == -INFINITY) return NAN;
  if (x <= 0 && x == floor(x)) return INFINITY;
  if (x < 0) {
    /* psi1(x) + psi1(1 - x) = pi^2 / sin^2(pi x) */
    double r = x - floor(x);
    double s = sin(M_PI * r);
    return M_PI * M_PI / (s * s) - ews_zeta(2.0, 1.0 - x);
  }
  return ews_zeta(2.0, x);
}

static double ews_polygamma(int64_t n, double x) {
  if (n == 0) return ew_digamma(x);
  if (n == 1) return ews_trigamma(x);
  /* (-1)^(n+1) n! zeta(n + 1, x) */
  double f = 1.0;
  for (int64_t k = 2; k <= n; k++) f *= (double)k;
  double z = ews_zeta((double)n + 1.0, x);
  return ((n + 1) & 1) ? -f * z : f * z;
}

/* --------------------------------------------- incomplete gamma functions */

/* returns P(a, x) when upper == 0, Q(a, x) when upper == 1 (a, x > 0 finite) */
static double ews_igam_core(double a, double x, int upper) {
  double lpre = a * log(x) - x - lgamma(a);
  if (x < a + 1.0) {
    /* P = x^a e^-x / Gamma(a+1) sum x^n / ((a+1)...(a+n)) */
    double term = 1.0 / a, sum = term, ap = a;
    for (int k = 0; k < 100000; k++) {
      ap += 1.0;
      term *= x / ap;
      sum += term;
      if (term < sum * 1e-17) break;
    }
    double p = exp(lpre) * sum;
    if (p > 1.0) p = 1.0;
    return upper ? 1.0 - p : p;
  }
  /* Q by the continued fraction (modified Lentz) */
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int k = 1; k < 100000; k++) {
    double an = -k * (k - a);
    b += 2.0;
    d = an * d + b;
    if (fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    double del = d * c;
    h *= del;
    if (fabs(del - 1.0) < 1e-16) break;
  }
  double q = exp(lpre) * h;
  if (q > 1.0) q = 1.0;
  return upper ? q : 1.0 - q;
}

static double ews_igamma(double a, double x, int upper) {
  if (a != a || x != x) return NAN;
  if (a < 0 || x < 0) return NAN;
  if (a == 0) {
    if (x > 0) return upper ? 0.0 : 1.0;
    return NAN;
  }
  if (x == 0) return upper ? 1.0 : 0.0;
  if (a == INFINITY) {
    if (x == INFINITY) return NAN;
    return upper ? 1.0 : 0.0;
  }
  if (x == INFINITY) return upper ? 0.0 : 1.0;
  return ews_igam_core(a, x, upper);
}

/* ------------------------------------------------- normal distribution */

static double ews_ndtri(double p) {
  if (p != p || p < 0 || p > 1) return NAN;
  if (p == 0) return -INFINITY;
  if (p == 1) return INFINITY;
  if (p >= 0.25 && p <= 0.75) return M_SQRT2 * ew_erfinv(2.0 * p - 1.0);
  double q = p < 0.5 ? p : 1.0 - p;
  /* start (Abramowitz-Stegun 26.2.23), then Newton on log(ndtr(x)) = log(q) */
  double t = sqrt(-2.0 * log(q));
  double x = -(t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308))));
  double lq = log(q);
  for (int k = 0; k < 6; k++) {
    double c = 0.5 * erfc(-x * M_SQRT1_2);
    if (!(c > 0)) break;
    double pdf = exp(-0.5 * x * x) * 0.39894228040143267794;
    double dx = (log(c) - lq) * c / pdf;
    x -= dx;
    if (fabs(dx) < 1e-16 * fabs(x)) break;
  }
  return p < 0.5 ? x : -x;
}

static double ews_erfcx(double x) {
  if (x != x) return x;
  if (x < 0) {
    if (x < -26.7) return INFINITY;
    double hi = x * x, lo = fma(x, x, -hi);
    return 2.0 * exp(hi) * exp(lo) - ews_erfcx(-x);
  }
  if (x > 26.0) {
    /* 1/(x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k */
    if (x > 1e8) return 1.0 / (x * 1.7724538509055160273);
    double z = 1.0 / (2.0 * x * x), term = 1.0, sum = 1.0;
    for (int k = 1; k < 30; k++) {
      term *= -(2.0 * k - 1.0) * z;
      sum += term;
      if (fabs(term) < 1e-17) break;
    }
    return sum / (x * 1.7724538509055160273);
  }
  double hi = x * x, lo = fma(x, x, -hi);
  return erfc(x) * exp(hi) * exp(lo);
}

static double ews_log_ndtr(double x) {
  if (x != x) return x;
  if (x >= 0) return log1p(-0.5 * erfc(x * M_SQRT1_2));
  if (x == -INFINITY) return -INFINITY;
  double t = -x * M_SQRT1_2;
  return log(0.5 * ews_erfcx(t)) - t * t;
}

/* ------------------------------------------------------------ polynomials */

static int ews_poly_n(double nv, int64_t *n) {
  if (nv != nv) return 0;
  if (nv >= 9.2e18) *n = INT64_MAX;
  else if (nv <= -9.2e18) *n = INT64_MIN;
  else *n = (int64_t)nv;
  return 1;
}

/* kind: 0 T, 1 U, 2 V, 3 W (Chebyshev) */
static double ews_chebyshev(double x, double nv, int kind) {
  int64_t n;
  if (!ews_poly_n(nv, &n)) return NAN;
  if (n < 0) return 0.0;
  int odd = (int)(n & 1);
  if (fabs(x) == 1.0) {
    double nn = (double)n;
    switch (kind) {
      case 0: return (x > 0 || !odd) ? 1.0 : -1.0;
      case 1: return (x > 0 || !odd) ? nn + 1.0 : -(nn + 1.0);
      case 2: return x > 0 ? 1.0 : (!odd ? 2.0 * nn + 1.0 : -(2.0 * nn + 1.0));
      default: return x > 0 ? 2.0 * nn + 1.0 : (!odd ? 1.0 : -1.0);
    }
  }
  if (n > 8 && fabs(x) < 1.0) {
    double th = acos(x), nn = (double)n;
    switch (kind) {
      case 0: return cos(nn * th);
      case 1: {
        double s = sin(th);
        return s != 0 ? sin((nn + 1.0) * th) / s : (nn + 1.0) * cos((nn + 1.0) * th) / x;
      }
      case 2: {
        double c = cos(0.5 * th);
        if (c != 0) return cos((nn + 0.5) * th) / c;
        return !odd ? 2.0 * nn + 1.0 : -(2.0 * nn + 1.0);
      }
      default: {
        double s = sin(0.5 * th);
        if (s != 0) return sin((nn + 0.5) * th) / s;
        return x > 0 ? 2.0 * nn + 1.0 : (!odd ? 1.0 : -1.0);
      }
    }
  }
  if (n == 0) return 1.0;
  double p = 1.0, q;
  switch (kind) {
    case 0: q = x; break;
    case 1: q = 2.0 * x; break;
    case 2: q = 2.0 * x - 1.0; break;
    default: q = 2.0 * x + 1.0; break;
  }
  for (int64_t k = 1; k < n; k++) {
    double r = 2.0 * x * q - p;
    p = q;
    q = r;
  }
  return q;
}

/* kind: 0 Hermite H (physicists'), 1 Hermite He, 2 Laguerre L, 3 Legendre P */
static double ews_orthopoly(double x, double nv, int kind) {
  int64_t n;
  if (!ews_poly_n(nv, &n)) return NAN;
  if (n < 0) return 0.0;
  if (kind == 2 && x == 0) return 1.0;
  if (kind == 3 && fabs(x) == 1.0) return (x > 0 || !(n & 1)) ? 1.0 : -1.0;
  if (n == 0) return 1.0;
  double p = 1.0, q;
  switch (kind) {
    case 0: q = 2.0 * x; break;
    case 1: q = x; break;
    case 2: q = 1.0 - x; break;
    default: q = x; break;
  }
  for (int64_t k = 1; k < n; k++) {
    double kk = (double)k, r;
    switch (kind) {
      case 0: r = 2.0 * x * q - 2.0 * kk * p; break;
      case 1: r = x * q - kk * p; break;
      case 2: r = ((2.0 * kk + 1.0 - x) * q - kk * p) / (kk + 1.0); break;
      default: r = ((2.0 * kk + 1.0) * x * q - kk * p) / (kk + 1.0); break;
    }
    p = q;
    q = r;
  }
  return q;
}

/* ----------------------------------------------------------- misc */

static double ews_entr(double x) {
  if (x != x) return x;
  if (x > 0) return -x * log(x);
  if (x == 0) return 0.0;
  return -INFINITY;
}

static double ews_spherical_j0(double x) {
  if (x != x) return x;
  if (isinf(x)) return 0.0;
  if (fabs(x) < 0.5) {
    double x2 = x * x;
    /* sin(x)/x = sum (-x^2)^k / (2k+1)! */
    double t = 1.0, s = 1.0;
    for (int k = 1; k < 12; k++) {
      t *= -x2 / ((2.0 * k) * (2.0 * k + 1.0));
      s += t;
    }
    return s;
  }
  return sin(x) / x;
}

/* next representable value of a 16-bit float format (bits of x, via dtype) */
static float ews_nextafter16(float x, float y, int bf16) {
  if (x != x || y != y) return x + y;
  if (x == y) return y;
  uint16_t b = bf16 ? tpurt__f32_to_bf16(x) : tpurt__f32_to_f16(x);
  if (x == 0) {
    b = 1;
    if (y < 0) b |= 0x8000;
  } else if ((x < y) == (x > 0)) {
    b++;
  } else {
    b--;
  }
  return bf16 ? tpurt__bf16_to_f32(b) : tpurt__f16_to_f32(b);
}
