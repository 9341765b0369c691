/*
 * vanilla_conv2d.c -- NCHW float32 convolution for umahub-vanilla.
 * See vanilla_conv2d.h for the contract.
 *
 * Plain C99 that also compiles as C++ (TVM's exporter uses g++ by default).
 *
 * The convolution is a matrix product per output row: for batch n and output
 * row oh, out[k][ow] = sum_p W[k][p] * X[p][ow], p = (c, r, s) running over
 * C*R*S, where X is the im2col of that row (X[p][ow] = the input element under
 * weight (c, r, s) at output column ow, 0 in the padding). Building X costs
 * C*R*S*OW copies per row; the product costs K times more multiply-adds,
 * so the copy is cheap, and it makes every stride and padding the same
 * contiguous, vectorisable inner loop.
 *
 * The product runs in register tiles of KT (4) output channels by WT (16)
 * output columns: the 64 accumulators stay in vector registers over the whole
 * reduction, each step loads 16 inputs and 4 weights for 64 multiply-adds.
 * The weights are packed once per call so that a tile's 4 weights of one p
 * are adjacent (and the last, partial tile of channels is padded with zeros).
 *
 * x86-64: the tile is also compiled for x86-64-v3 (AVX2 + FMA) and the loader
 * picks that version where the CPU has it (gcc's target_clones).
 */
#include "vanilla_conv2d.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__cplusplus) || defined(__GNUC__) || defined(__clang__)
#define VANILLA_RESTRICT __restrict
#else
#define VANILLA_RESTRICT restrict
#endif

#define VANILLA_KT 4
#define VANILLA_WT 16

/* gcc vectorises the tile at -O3, not at -O2 (its cheap -O2 cost model), and
 * TVM's exporter passes whatever -O level the caller chose; so this file asks
 * for -O3 itself. clang vectorises at -O2 and ignores the pragma. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(VANILLA_NO_OPT_PRAGMA)
#pragma GCC optimize("O3")
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(VANILLA_NO_CLONES)
#define VANILLA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define VANILLA_CLONES
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
  ptrdiff_t l = -vanilla_floordiv(off, stride);                    /* ceil(-off / stride) */
  ptrdiff_t h = vanilla_floordiv(extent - 1 - off, stride) + 1;
  if (l < 0) l = 0;
  if (h > ow_count) h = ow_count;
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

/* acc[j][t] = sum_p w[p*KT + j] * x[p*ldx + t], j < KT, t < WT; written to
 * out[j*ldo + t] for j < nk, t < nw. */
VANILLA_CLONES
static void vanilla_tile(const float* VANILLA_RESTRICT x, ptrdiff_t ldx,
                         const float* VANILLA_RESTRICT w, ptrdiff_t depth,
                         float* VANILLA_RESTRICT out, ptrdiff_t ldo, ptrdiff_t nk,
                         ptrdiff_t nw) {
  float a0[VANILLA_WT] = {0}, a1[VANILLA_WT] = {0}, a2[VANILLA_WT] = {0}, a3[VANILLA_WT] = {0};
  ptrdiff_t p, t, j;
  for (p = 0; p < depth; ++p) {
    const float* VANILLA_RESTRICT xp = x + p * ldx;
    const float w0 = w[p * VANILLA_KT], w1 = w[p * VANILLA_KT + 1];
    const float w2 = w[p * VANILLA_KT + 2], w3 = w[p * VANILLA_KT + 3];
    for (t = 0; t < VANILLA_WT; ++t) {
      const float v = xp[t];
      a0[t] += w0 * v;
      a1[t] += w1 * v;
      a2[t] += w2 * v;
      a3[t] += w3 * v;
    }
  }
  {
    float* acc[VANILLA_KT];
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
    for (j = 0; j < nk; ++j) memcpy(out + j * ldo, acc[j], (size_t)nw * sizeof(float));
  }
}

int32_t vanilla_conv2d_nchw(float* data, float* weight, float* out,
                            int32_t n, int32_t c, int32_t h, int32_t w,
                            int32_t k, int32_t r, int32_t s,
                            int32_t pad_top, int32_t pad_left,
                            int32_t pad_bottom, int32_t pad_right,
                            int32_t stride_h, int32_t stride_w) {
  ptrdiff_t N = n, C = c, H = h, W = w, K = k, R = r, S = s;
  ptrdiff_t PT = pad_top, PL = pad_left, SH = stride_h, SW = stride_w;
  ptrdiff_t OH, OW, OWP, CRS, KP, plane_in, plane_out;
  ptrdiff_t in_n, oh, k0, ow0, ci, ri, si, ow, j, p;
  float *cols, *packed;

  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || k <= 0 || r <= 0 || s <= 0) return -1;
  if (pad_top < 0 || pad_left < 0 || pad_bottom < 0 || pad_right < 0) return -1;
  if (stride_h <= 0 || stride_w <= 0) return -1;
  if (H + PT + pad_bottom < R || W + PL + pad_right < S) return -1;
  if (data == NULL || weight == NULL || out == NULL) return -1;

  OH = (H + PT + pad_bottom - R) / SH + 1;
  OW = (W + PL + pad_right - S) / SW + 1;
  OWP = (OW + VANILLA_WT - 1) / VANILLA_WT * VANILLA_WT;
  CRS = C * R * S;
  KP = (K + VANILLA_KT - 1) / VANILLA_KT * VANILLA_KT;
  plane_in = H * W;
  plane_out = OH * OW;

  cols = (float*)malloc((size_t)(CRS * OWP) * sizeof(float));
  packed = (float*)malloc((size_t)(KP * CRS) * sizeof(float));
  if (cols == NULL || packed == NULL) {
    free(cols);
    free(packed);
    return -2;
  }
  /* packed[(k0/KT)*CRS*KT + p*KT + j] = weight[k0 + j][p], 0 past K */
  for (k0 = 0; k0 < KP; k0 += VANILLA_KT)
    for (p = 0; p < CRS; ++p)
      for (j = 0; j < VANILLA_KT; ++j)
        packed[k0 * CRS + p * VANILLA_KT + j] = (k0 + j < K) ? weight[(k0 + j) * CRS + p] : 0.0f;

  for (in_n = 0; in_n < N; ++in_n) {
    const float* in_b = data + in_n * C * plane_in;
    float* out_b = out + in_n * K * plane_out;
    for (oh = 0; oh < OH; ++oh) {
      /* the im2col of output row oh */
      for (ci = 0; ci < C; ++ci) {
        for (ri = 0; ri < R; ++ri) {
          ptrdiff_t ih = oh * SH + ri - PT;
          for (si = 0; si < S; ++si) {
            float* row = cols + ((ci * R + ri) * S + si) * OWP;
            ptrdiff_t off = si - PL, lo, hi;
            const float* in_row;
            if (ih < 0 || ih >= H) { /* a padded row */
              memset(row, 0, (size_t)OWP * sizeof(float));
              continue;
            }
            in_row = in_b + ci * plane_in + ih * W;
            vanilla_valid_range(off, SW, W, OW, &lo, &hi);
            for (ow = 0; ow < lo; ++ow) row[ow] = 0.0f;
            if (SW == 1) {
              if (hi > lo) memcpy(row + lo, in_row + lo + off, (size_t)(hi - lo) * sizeof(float));
            } else {
              for (ow = lo; ow < hi; ++ow) row[ow] = in_row[ow * SW + off];
            }
            for (ow = hi; ow < OWP; ++ow) row[ow] = 0.0f;
          }
        }
      }
      for (k0 = 0; k0 < K; k0 += VANILLA_KT) {
        ptrdiff_t nk = (K - k0 < VANILLA_KT) ? (K - k0) : VANILLA_KT;
        float* out_k = out_b + k0 * plane_out + oh * OW;
        for (ow0 = 0; ow0 < OW; ow0 += VANILLA_WT) {
          ptrdiff_t nw = (OW - ow0 < VANILLA_WT) ? (OW - ow0) : VANILLA_WT;
          vanilla_tile(cols + ow0, OWP, packed + k0 * CRS, CRS, out_k + ow0, plane_out, nk, nw);
        }
      }
    }
  }
  free(cols);
  free(packed);
  return 0;
}
