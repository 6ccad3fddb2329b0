#include "flce_ref.h"

#include <math.h>
#include <stdlib.h>

static double *zeros(int64_t n) {
  return calloc((size_t)n + 1, sizeof(double));
}

flce_ref flce_ref_compute(const flce_ref_problem *p) {
  const int64_t m = p->m, h = p->h, v = p->v;
  const double a = p->label_smoothing, eps = a / (double)v, lam = p->z_loss_scale;
  const double cap = p->softcap;
  const double *cw = p->class_weight;
  const int64_t *y = p->targets;
  flce_ref r;
  r.tok = zeros(m);
  r.ztok = zeros(m);
  r.logit = zeros(m * v);
  r.dx = zeros(m * h);
  r.dw = zeros(v * h);
  r.db = zeros(v);
  double *chain = zeros(v);
  double wsum = 0.0, d = 0.0, n = 0.0, sum_ce = 0.0, sum_z = 0.0;
  for (int64_t j = 0; j < v; ++j) wsum += cw ? cw[j] : 1.0;
  for (int64_t i = 0; i < m; ++i)
    if (y[i] != p->ignore_index) {
      d += cw ? cw[y[i]] : 1.0;
      n += 1.0;
    }
  for (int64_t i = 0; i < m; ++i) {
    double *z = r.logit + i * v, mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      double s = p->bias ? p->bias[j] : 0.0;
      for (int64_t k = 0; k < h; ++k) s += p->x[i * h + k] * p->w[j * h + k];
      chain[j] = 1.0;
      if (cap > 0.0) {
        const double t = tanh(s / cap);
        s = cap * t;
        chain[j] = 1.0 - t * t;
      }
      z[j] = s;
      mx = s > mx ? s : mx;
    }
    if (y[i] == p->ignore_index) continue;
    double se = 0.0, wz = 0.0;
    for (int64_t j = 0; j < v; ++j) {
      se += exp(z[j] - mx);
      wz += (cw ? cw[j] : 1.0) * z[j];
    }
    const double lse = mx + log(se), wy = cw ? cw[y[i]] : 1.0;
    const double ce = (1 - a) * wy * (lse - z[y[i]]) + eps * (lse * wsum - wz);
    r.ztok[i] = lam * lse * lse;
    r.tok[i] = ce + r.ztok[i];
    sum_ce += ce;
    sum_z += r.ztok[i];
    /* the gradient scales of the two parts: MEAN takes ce over D, zl over N */
    const double up = p->grad_loss == NULL             ? 1.0
                      : p->reduction == OSFT_FLCE_NONE ? p->grad_loss[i]
                                                       : p->grad_loss[0];
    double s_ce = up, s_z = up;
    if (p->reduction == OSFT_FLCE_MEAN) {
      s_ce = d > 0.0 ? up / d : 0.0;
      s_z = n > 0.0 ? up / n : 0.0;
    }
    for (int64_t j = 0; j < v; ++j) {
      const double pj = exp(z[j] - lse);
      const double dce = ((1 - a) * wy + eps * wsum) * pj - eps * (cw ? cw[j] : 1.0) -
                         (j == y[i] ? (1 - a) * wy : 0.0);
      const double g = (s_ce * dce + s_z * 2.0 * lam * lse * pj) * chain[j];
      r.db[j] += g;
      for (int64_t k = 0; k < h; ++k) {
        r.dx[i * h + k] += g * p->w[j * h + k];
        r.dw[j * h + k] += g * p->x[i * h + k];
      }
    }
  }
  if (p->reduction == OSFT_FLCE_MEAN) {
    r.loss = (d > 0.0 ? sum_ce / d : 0.0) + (n > 0.0 ? sum_z / n : 0.0);
    r.z = n > 0.0 ? sum_z / n : 0.0;
  } else {
    r.loss = sum_ce + sum_z;
    r.z = sum_z;
  }
  free(chain);
  return r;
}

void flce_ref_free(flce_ref *r) {
  free(r->tok);
  free(r->ztok);
  free(r->logit);
  free(r->dx);
  free(r->dw);
  free(r->db);
}
