/*
 * vanilla_conv2d.c -- direct NCHW float32 convolution for umahub-vanilla.
 * See vanilla_conv2d.h for the contract.
 *
 * Plain C99 that also compiles as C++ (TVM's exporter uses g++ by default).
 * Loop order, per batch n and output row oh:
 *   for a block of KB (4) output channels: KB output rows stay hot in L1,
 *   for c, r: one input row (ih = oh*stride_h + r - pad_top, skipped when it
 *   lies in the padding), for s: KB weights in registers, then one pass over
 *   the valid output columns (ow range clipped so that the input column lies
 *   inside [0, W): padding costs nothing and needs no padded copy).
 * With stride_w == 1 the innermost loop is a contiguous multiply-add that the
 * compiler vectorises at -O2 (gcc >= 12) / -O3.
 */
#include "vanilla_conv2d.h"

#include <stddef.h>
#include <string.h>

#if defined(__cplusplus) || defined(__GNUC__) || defined(__clang__)
#define VANILLA_RESTRICT __restrict
#else
#define VANILLA_RESTRICT restrict
#endif

#define VANILLA_KB 4

/* The innermost loops are written to be auto-vectorised.  gcc vectorises them
 * at -O3 but not at -O2 (its "very cheap" -O2 cost model refuses loops that
 * need a scalar epilogue), which costs ~2.5x here; TVM's exporter passes
 * whatever -O level the caller chose (none = -O0).  So this file asks gcc
 * for -O3 itself.  clang vectorises at -O2 already and ignores the pragma. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(VANILLA_NO_OPT_PRAGMA)
#pragma GCC optimize("O3")
#endif

/* floor(a / b) for b > 0 */
static ptrdiff_t vanilla_floordiv(ptrdiff_t a, ptrdiff_t b) {
  ptrdiff_t q = a / b;
  if ((a % b != 0) && (a < 0)) q -= 1;
  return q;
}

/* The output columns ow in [0, ow_count) for which
 * 0 <= ow*stride + off < extent, as [*lo, *hi). */
static void vanilla_valid_range(ptrdiff_t off, ptrdiff_t stride, ptrdiff_t extent,
                                ptrdiff_t ow_count, ptrdiff_t* lo, ptrdiff_t* hi) {
  /* ow >= ceil(-off / stride) */
  ptrdiff_t l = -vanilla_floordiv(off, stride);
  /* ow <= floor((extent - 1 - off) / stride) */
  ptrdiff_t h = vanilla_floordiv(extent - 1 - off, stride) + 1;
  if (l < 0) l = 0;
  if (h > ow_count) h = ow_count;
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

int32_t vanilla_conv2d_nchw(float* data, float* weight, float* out,
                            int32_t n, int32_t c, int32_t h, int32_t w,
                            int32_t k, int32_t r, int32_t s,
                            int32_t pad_top, int32_t pad_left,
                            int32_t pad_bottom, int32_t pad_right,
                            int32_t stride_h, int32_t stride_w) {
  const float* VANILLA_RESTRICT in = data;
  const float* VANILLA_RESTRICT wt = weight;
  float* VANILLA_RESTRICT o = out;
  ptrdiff_t N = n, C = c, H = h, W = w, K = k, R = r, S = s;
  ptrdiff_t PT = pad_top, PL = pad_left, SH = stride_h, SW = stride_w;
  ptrdiff_t OH, OW, plane_in, plane_out;
  ptrdiff_t in_n, oh, kb;

  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || k <= 0 || r <= 0 || s <= 0) return -1;
  if (pad_top < 0 || pad_left < 0 || pad_bottom < 0 || pad_right < 0) return -1;
  if (stride_h <= 0 || stride_w <= 0) return -1;
  if (H + PT + pad_bottom < R || W + PL + pad_right < S) return -1;
  if (data == NULL || weight == NULL || out == NULL) return -1;

  OH = (H + PT + pad_bottom - R) / SH + 1;
  OW = (W + PL + pad_right - S) / SW + 1;
  plane_in = H * W;
  plane_out = OH * OW;

  for (in_n = 0; in_n < N; ++in_n) {
    const float* VANILLA_RESTRICT in_b = in + in_n * C * plane_in;
    float* VANILLA_RESTRICT out_b = o + in_n * K * plane_out;
    for (oh = 0; oh < OH; ++oh) {
      for (kb = 0; kb < K; kb += VANILLA_KB) {
        ptrdiff_t nk = (K - kb < VANILLA_KB) ? (K - kb) : VANILLA_KB;
        float* rows[VANILLA_KB];
        ptrdiff_t j, ci, ri, si, ow;
        for (j = 0; j < nk; ++j) {
          rows[j] = out_b + (kb + j) * plane_out + oh * OW;
          memset(rows[j], 0, (size_t)OW * sizeof(float));
        }
        for (ci = 0; ci < C; ++ci) {
          const float* in_c = in_b + ci * plane_in;
          for (ri = 0; ri < R; ++ri) {
            ptrdiff_t ih = oh * SH + ri - PT;
            const float* in_row;
            if (ih < 0 || ih >= H) continue; /* a padded row: contributes 0 */
            in_row = in_c + ih * W;
            for (si = 0; si < S; ++si) {
              ptrdiff_t off = si - PL; /* input column = ow*SW + off */
              ptrdiff_t lo, hi;
              ptrdiff_t widx = ((kb * C + ci) * R + ri) * S + si;
              ptrdiff_t kstride = C * R * S;
              vanilla_valid_range(off, SW, W, OW, &lo, &hi);
              if (lo >= hi) continue;
              if (nk == VANILLA_KB) {
                const float w0 = wt[widx];
                const float w1 = wt[widx + kstride];
                const float w2 = wt[widx + 2 * kstride];
                const float w3 = wt[widx + 3 * kstride];
                float* VANILLA_RESTRICT o0 = rows[0];
                float* VANILLA_RESTRICT o1 = rows[1];
                float* VANILLA_RESTRICT o2 = rows[2];
                float* VANILLA_RESTRICT o3 = rows[3];
                if (SW == 1) {
                  const float* VANILLA_RESTRICT x = in_row + off;
                  for (ow = lo; ow < hi; ++ow) {
                    const float v = x[ow];
                    o0[ow] += w0 * v;
                    o1[ow] += w1 * v;
                    o2[ow] += w2 * v;
                    o3[ow] += w3 * v;
                  }
                } else {
                  for (ow = lo; ow < hi; ++ow) {
                    const float v = in_row[ow * SW + off];
                    o0[ow] += w0 * v;
                    o1[ow] += w1 * v;
                    o2[ow] += w2 * v;
                    o3[ow] += w3 * v;
                  }
                }
              } else {
                for (j = 0; j < nk; ++j) {
                  const float wv = wt[widx + j * kstride];
                  float* VANILLA_RESTRICT oj = rows[j];
                  for (ow = lo; ow < hi; ++ow) oj[ow] += wv * in_row[ow * SW + off];
                }
              }
            }
          }
        }
      }
    }
  }
  return 0;
}
