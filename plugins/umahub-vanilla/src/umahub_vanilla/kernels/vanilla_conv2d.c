/*
 * vanilla_conv2d.c -- NCHW float32 convolution for umahub-vanilla.
 * See vanilla_conv2d.h for the contract.
 *
 * Plain C99 that also compiles as C++ (TVM's exporter uses g++ by default).
 *
 * The convolution is a matrix product per output row: for batch n and output
 * row oh, out[k][ow] = sum_p W[k][p] * X[p][ow], p = (c, r, s) running over
 * C*R*S, where X[p][ow] is the input element under weight (c, r, s) at output
 * column ow (0 in the padding). X is not copied out (an im2col would write
 * C*R*S*OW floats per row, more than the input rows it reads): the C*R input
 * rows the output row reads are copied once each into a buffer with their
 * padding as zeros, split into their SW column phases (phase q holds the
 * padded row's columns q, q + SW, q + 2*SW, ...). Line p of X is then a
 * contiguous run of one phase, starting s / SW in, for every stride and
 * padding: the product reads it through a pointer per line.
 *
 * The product runs in register tiles of KT (4) output channels by WT (16)
 * output columns: the 64 accumulators stay in vector registers over the whole
 * reduction, each step loads 16 inputs and 4 weights for 64 multiply-adds.
 * The weights are packed once per call so that a tile's 4 weights of one p
 * are adjacent (and the last, partial tile of channels is padded with zeros).
 *
 * x86-64: the tile is also compiled for x86-64-v3 (AVX2 + FMA) and the loader
 * picks that version where the CPU has it (gcc's target_clones); where the CPU
 * has AVX-512, a 16 x 16 tile (16 channels by one 16-float register) runs
 * instead.
 *
 * The output rows are shared out among the threads of TVM's thread pool
 * (TVMBackendParallelLaunch), each with its own buffer of phases; the weights
 * are packed once per call, before.
 *
 * vanilla_conv2d_nchw_bias adds a bias per output channel to the
 * accumulators before they are stored: the bias add that follows a
 * convolution costs no pass of its own over the output. And
 * vanilla_conv2d_nchw_bias_clamp bounds the accumulators (a ReLU, a ReLU6, a
 * clip): in their registers in the AVX-512 tile, in the stored rows while
 * they are in L1 in the portable one.
 *
 * An output of one position per image (a squeeze-and-excitation block's 1x1
 * convolutions on a pooled 1x1 input, a classifier as a convolution) is a
 * matrix-vector product: each weight is used once, so packing the weights
 * would cost as much as the product (48 -> 1152 channels: 24 us of 25); the
 * rows of the weight are read as they are, in dot products of 8 partial sums.
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

/* x86-64 with gcc or clang: a 16 x 16 tile for AVX-512, chosen at run time */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && \
    !defined(VANILLA_NO_AVX512)
#define VANILLA_AVX512 1
#include <immintrin.h>
#else
#define VANILLA_AVX512 0
#endif

/* Bounds of the activation taken into the call (see vanilla_clamp_rows). */
typedef struct {
  float lo, hi;
  int which; /* bit 0: lo applies, bit 1: hi applies; 0: no activation */
} vanilla_bounds;

/* The activation taken into the call: each value v of the stored rows
 * out[j*ldo + t] (j < nk, t < nw) becomes max(v, lo) where bit 0 of `bounds`
 * is set, then min(v, hi) where bit 1 is; a NaN stays NaN. The rows were
 * just stored, so this pass reads them from L1. */
static void vanilla_clamp_rows(float* VANILLA_RESTRICT out, ptrdiff_t ldo, ptrdiff_t nk,
                               ptrdiff_t nw, const vanilla_bounds* VANILLA_RESTRICT act) {
  ptrdiff_t j, t;
  const float lo = act->lo, hi = act->hi;
  for (j = 0; j < nk; ++j) {
    float* VANILLA_RESTRICT row = out + j * ldo;
    if (act->which & 1)
      for (t = 0; t < nw; ++t) row[t] = row[t] < lo ? lo : row[t];
    if (act->which & 2)
      for (t = 0; t < nw; ++t) row[t] = row[t] > hi ? hi : row[t];
  }
}

/* acc[j][t] = bias[j] + sum_p w[p*KT + j] * lines[p][col0 + t], j < KT, t < WT
 * (bias padded to KT, or NULL for none); written to out[j*ldo + t] for j < nk,
 * t < nw, and bounded by act. */
VANILLA_CLONES
static void vanilla_tile(const float* const* VANILLA_RESTRICT lines, ptrdiff_t col0,
                         const float* VANILLA_RESTRICT w, ptrdiff_t depth,
                         const float* VANILLA_RESTRICT bias, float* VANILLA_RESTRICT out,
                         ptrdiff_t ldo, ptrdiff_t nk, ptrdiff_t nw,
                         const vanilla_bounds* VANILLA_RESTRICT act) {
  float a0[VANILLA_WT], a1[VANILLA_WT], a2[VANILLA_WT], a3[VANILLA_WT];
  ptrdiff_t p, t, j;
  for (t = 0; t < VANILLA_WT; ++t) {
    a0[t] = bias ? bias[0] : 0.0f;
    a1[t] = bias ? bias[1] : 0.0f;
    a2[t] = bias ? bias[2] : 0.0f;
    a3[t] = bias ? bias[3] : 0.0f;
  }
  for (p = 0; p < depth; ++p) {
    const float* VANILLA_RESTRICT xp = lines[p] + col0;
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
    /* a whole row in a copy of constant size: a vector store, not a call */
    if (nw == VANILLA_WT)
      for (j = 0; j < nk; ++j) memcpy(out + j * ldo, acc[j], VANILLA_WT * sizeof(float));
    else
      for (j = 0; j < nk; ++j) memcpy(out + j * ldo, acc[j], (size_t)nw * sizeof(float));
  }
  if (act->which) vanilla_clamp_rows(out, ldo, nk, nw, act);
}

#if VANILLA_AVX512
/* The same product in tiles of 16 output channels by 16 columns, for AVX-512:
 * 16 accumulators of one register each, and per step one load of 16 inputs
 * and 16 multiply-adds with a broadcast weight (w packed by 16). The bounds
 * apply to the registers, and a partial row is a masked store. */
#define VANILLA_ACC16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) \
  M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)

__attribute__((target("avx512f,fma")))
static void vanilla_tile16(const float* const* VANILLA_RESTRICT lines, ptrdiff_t col0,
                           const float* VANILLA_RESTRICT w, ptrdiff_t depth,
                           const float* VANILLA_RESTRICT bias, float* VANILLA_RESTRICT out,
                           ptrdiff_t ldo, ptrdiff_t nk, ptrdiff_t nw,
                           const vanilla_bounds* VANILLA_RESTRICT act) {
  const __mmask16 all = (__mmask16)0xFFFF;
  const __mmask16 cols = nw >= 16 ? all : (__mmask16)((1u << nw) - 1u);
  ptrdiff_t p;
#define VANILLA_DECL(j) __m512 a##j = bias ? _mm512_set1_ps(bias[j]) : _mm512_setzero_ps();
  VANILLA_ACC16(VANILLA_DECL)
#undef VANILLA_DECL
  for (p = 0; p < depth; ++p) {
    const __m512 v = _mm512_loadu_ps(lines[p] + col0);
    const float* VANILLA_RESTRICT wp = w + p * 16;
#define VANILLA_FMA(j) a##j = _mm512_fmadd_ps(_mm512_set1_ps(wp[j]), v, a##j);
    VANILLA_ACC16(VANILLA_FMA)
#undef VANILLA_FMA
  }
  /* max(lo, v) and min(hi, v) give v where v is a NaN: a NaN stays NaN. (The
   * masked forms, all lanes set: gcc 12 warns of its own header's unmasked ones.) */
  if (act->which & 1) {
    const __m512 lo = _mm512_set1_ps(act->lo);
#define VANILLA_LO(j) a##j = _mm512_mask_max_ps(a##j, all, lo, a##j);
    VANILLA_ACC16(VANILLA_LO)
#undef VANILLA_LO
  }
  if (act->which & 2) {
    const __m512 hi = _mm512_set1_ps(act->hi);
#define VANILLA_HI(j) a##j = _mm512_mask_min_ps(a##j, all, hi, a##j);
    VANILLA_ACC16(VANILLA_HI)
#undef VANILLA_HI
  }
  if (nk == 16) {
#define VANILLA_STORE(j) _mm512_mask_storeu_ps(out + j * ldo, cols, a##j);
    VANILLA_ACC16(VANILLA_STORE)
#undef VANILLA_STORE
  } else {
#define VANILLA_STORE_SOME(j) \
  if (j < nk) _mm512_mask_storeu_ps(out + j * ldo, cols, a##j);
    VANILLA_ACC16(VANILLA_STORE_SOME)
#undef VANILLA_STORE_SOME
  }
}
#endif

/* TVM's thread pool, as its runtime exports it (c_backend_api.h); declared weak,
 * so that without the runtime (the kernel on its own) the work runs here. On a
 * thread whose pool TVM was told to keep to one thread (an emulated
 * accelerator's worker), the launch runs every task on that thread. */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} vanilla_parallel_env;
typedef int (*vanilla_lambda)(int task_id, vanilla_parallel_env* penv, void* cdata);
#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__) || defined(__clang__)
int TVMBackendParallelLaunch(vanilla_lambda flambda, void* cdata, int num_task)
    __attribute__((weak));
#define VANILLA_HAVE_POOL (TVMBackendParallelLaunch != NULL)
#else
#define VANILLA_HAVE_POOL 0
#define TVMBackendParallelLaunch(f, c, n) (-1)
#endif
#ifdef __cplusplus
}
#endif

/* One convolution's numbers, shared by its tasks. */
typedef struct {
  const float* data;
  const float* packed;
  const float* bias; /* K floats padded to a whole tile of channels, or NULL */
  vanilla_bounds act;
  float* out;
  ptrdiff_t N, C, H, W, K, R, S, PT, PL, SH, SW, OH, OW, OWP, CRS, KT;
  ptrdiff_t PWP; /* floats of one phase of a padded input row */
  int wide;      /* the 16 x 16 tile */
  volatile int failed;
} vanilla_job;

/* The input row in_row (W floats; NULL for a row of the padding) with PL zeros
 * before it and zeros after, split into its SW phases of PWP floats:
 * phases[q * PWP + i] = padded[q + SW * i], padded[PL + j] = in_row[j]. */
VANILLA_CLONES
static void vanilla_phase_row(const float* VANILLA_RESTRICT in_row, ptrdiff_t W, ptrdiff_t PL,
                              ptrdiff_t SW, ptrdiff_t PWP, float* VANILLA_RESTRICT phases) {
  ptrdiff_t q, i;
  memset(phases, 0, (size_t)(SW * PWP) * sizeof(float));
  if (in_row == NULL) return;
  if (SW == 1) {
    memcpy(phases + PL, in_row, (size_t)W * sizeof(float));
    return;
  }
  for (q = 0; q < SW; ++q) {
    /* the first input column in phase q, and its place there */
    const ptrdiff_t j0 = ((q - PL) % SW + SW) % SW, i0 = (j0 + PL) / SW;
    float* VANILLA_RESTRICT to = phases + q * PWP + i0;
    const float* VANILLA_RESTRICT from = in_row + j0;
    const ptrdiff_t count = j0 < W ? (W - j0 + SW - 1) / SW : 0;
    if (SW == 2) /* the common stride, in a loop the compiler vectorises */
      for (i = 0; i < count; ++i) to[i] = from[2 * i];
    else
      for (i = 0; i < count; ++i) to[i] = from[SW * i];
  }
}

/* The output rows [lo, hi) of the batch (rows numbered n * OH + oh). */
static int vanilla_rows(const vanilla_job* job, ptrdiff_t lo, ptrdiff_t hi) {
  const ptrdiff_t C = job->C, H = job->H, W = job->W, K = job->K, R = job->R, S = job->S;
  const ptrdiff_t PT = job->PT, PL = job->PL, SH = job->SH, SW = job->SW;
  const ptrdiff_t OH = job->OH, OW = job->OW, CRS = job->CRS, KT = job->KT;
  const ptrdiff_t PWP = job->PWP, plane_in = H * W, plane_out = OH * OW;
  ptrdiff_t row, ci, ri, si, k0, ow0;
  /* The padded input rows: slot ih % R holds input row ih of every channel, for
   * the R consecutive rows an output row reads; the next output row keeps the
   * ones it shares with this one (R - SH of them). slot_row[] says which row a
   * slot holds, as n * span + ih + PT (span: the rows from -PT on that output
   * rows read, padding included), -1 for none yet. */
  const ptrdiff_t span = (OH - 1) * SH + R;
  float* phases = (float*)malloc((size_t)(C * R * SW * PWP) * sizeof(float));
  const float** lines = (const float**)malloc((size_t)CRS * sizeof(const float*));
  ptrdiff_t* slot_row = (ptrdiff_t*)malloc((size_t)R * sizeof(ptrdiff_t));
  if (phases == NULL || lines == NULL || slot_row == NULL) {
    free(phases);
    free((void*)lines);
    free(slot_row);
    return -2;
  }
  for (ri = 0; ri < R; ++ri) slot_row[ri] = -1;
  for (row = lo; row < hi; ++row) {
    const ptrdiff_t in_n = row / OH, oh = row % OH;
    const float* in_b = job->data + in_n * C * plane_in;
    float* out_b = job->out + in_n * K * plane_out;
    /* the R input rows under output row oh, and a line per (c, r, s) into them */
    for (ri = 0; ri < R; ++ri) {
      const ptrdiff_t ih = oh * SH + ri - PT, slot = (ih % R + R) % R;
      const int padding = ih < 0 || ih >= H;
      if (slot_row[slot] != in_n * span + ih + PT) {
        for (ci = 0; ci < C; ++ci)
          vanilla_phase_row(padding ? NULL : in_b + ci * plane_in + ih * W, W, PL, SW, PWP,
                            phases + (ci * R + slot) * SW * PWP);
        slot_row[slot] = in_n * span + ih + PT;
      }
      for (ci = 0; ci < C; ++ci)
        for (si = 0; si < S; ++si)
          lines[(ci * R + ri) * S + si] =
              phases + (ci * R + slot) * SW * PWP + (si % SW) * PWP + si / SW;
    }
    for (k0 = 0; k0 < K; k0 += KT) {
      ptrdiff_t nk = (K - k0 < KT) ? (K - k0) : KT;
      float* out_k = out_b + k0 * plane_out + oh * OW;
      for (ow0 = 0; ow0 < OW; ow0 += VANILLA_WT) {
        ptrdiff_t nw = (OW - ow0 < VANILLA_WT) ? (OW - ow0) : VANILLA_WT;
#if VANILLA_AVX512
        if (job->wide) {
          vanilla_tile16(lines, ow0, job->packed + k0 * CRS, CRS,
                         job->bias ? job->bias + k0 : NULL, out_k + ow0, plane_out, nk, nw,
                         &job->act);
          continue;
        }
#endif
        vanilla_tile(lines, ow0, job->packed + k0 * CRS, CRS,
                     job->bias ? job->bias + k0 : NULL, out_k + ow0, plane_out, nk, nw,
                     &job->act);
      }
    }
  }
  free(phases);
  free((void*)lines);
  free(slot_row);
  return 0;
}

/* Task task_id of num_task: an equal share of the rows. */
static int vanilla_task(int task_id, vanilla_parallel_env* penv, void* cdata) {
  vanilla_job* job = (vanilla_job*)cdata;
  ptrdiff_t rows = job->N * job->OH, tasks = penv->num_task > 0 ? penv->num_task : 1;
  ptrdiff_t lo = rows * task_id / tasks, hi = rows * (task_id + 1) / tasks;
  if (lo < hi && vanilla_rows(job, lo, hi) != 0) job->failed = 1;
  return 0;
}

/* out[n][k] = weight[k] . column(n), the input under the one output position. */
static int vanilla_one_position(const vanilla_job* job, const float* VANILLA_RESTRICT weight) {
  const ptrdiff_t C = job->C, H = job->H, W = job->W, R = job->R, S = job->S, CRS = job->CRS;
  ptrdiff_t n, k, ci, ri, si, p, j;
  float* col = (float*)malloc((size_t)CRS * sizeof(float));
  if (col == NULL) return -2;
  for (n = 0; n < job->N; ++n) {
    const float* in_b = job->data + n * C * H * W;
    for (ci = 0; ci < C; ++ci)
      for (ri = 0; ri < R; ++ri)
        for (si = 0; si < S; ++si) {
          const ptrdiff_t ih = ri - job->PT, iw = si - job->PL;
          col[(ci * R + ri) * S + si] =
              (ih >= 0 && ih < H && iw >= 0 && iw < W) ? in_b[(ci * H + ih) * W + iw] : 0.0f;
        }
    for (k = 0; k < job->K; ++k) {
      const float* VANILLA_RESTRICT row = weight + k * CRS;
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = job->bias ? job->bias[k] : 0.0f;
      for (p = 0; p + 8 <= CRS; p += 8)
        for (j = 0; j < 8; ++j) part[j] += row[p + j] * col[p + j];
      for (; p < CRS; ++p) sum += row[p] * col[p];
      for (j = 0; j < 8; ++j) sum += part[j];
      job->out[n * job->K + k] = sum;
    }
    vanilla_clamp_rows(job->out + n * job->K, 1, job->K, 1, &job->act);
  }
  free(col);
  return 0;
}

int32_t vanilla_conv2d_nchw(float* data, float* weight, float* out,
                            int32_t n, int32_t c, int32_t h, int32_t w,
                            int32_t k, int32_t r, int32_t s,
                            int32_t pad_top, int32_t pad_left,
                            int32_t pad_bottom, int32_t pad_right,
                            int32_t stride_h, int32_t stride_w) {
  return vanilla_conv2d_nchw_bias(data, weight, NULL, out, n, c, h, w, k, r, s, pad_top,
                                  pad_left, pad_bottom, pad_right, stride_h, stride_w);
}

int32_t vanilla_conv2d_nchw_bias(float* data, float* weight, float* bias, float* out,
                                 int32_t n, int32_t c, int32_t h, int32_t w,
                                 int32_t k, int32_t r, int32_t s,
                                 int32_t pad_top, int32_t pad_left,
                                 int32_t pad_bottom, int32_t pad_right,
                                 int32_t stride_h, int32_t stride_w) {
  return vanilla_conv2d_nchw_bias_clamp(data, weight, bias, out, 0.0f, 0.0f, 0, n, c, h, w, k,
                                        r, s, pad_top, pad_left, pad_bottom, pad_right,
                                        stride_h, stride_w);
}

int32_t vanilla_conv2d_nchw_bias_clamp(float* data, float* weight, float* bias, float* out,
                                       float lo, float hi, int32_t bounds,
                                       int32_t n, int32_t c, int32_t h, int32_t w,
                                       int32_t k, int32_t r, int32_t s,
                                       int32_t pad_top, int32_t pad_left,
                                       int32_t pad_bottom, int32_t pad_right,
                                       int32_t stride_h, int32_t stride_w) {
  vanilla_job job;
  ptrdiff_t KP, k0, p, j;
  float* packed;
  float* padded_bias = NULL;

  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || k <= 0 || r <= 0 || s <= 0) return -1;
  if (pad_top < 0 || pad_left < 0 || pad_bottom < 0 || pad_right < 0) return -1;
  if (stride_h <= 0 || stride_w <= 0) return -1;
  if ((ptrdiff_t)h + pad_top + pad_bottom < r || (ptrdiff_t)w + pad_left + pad_right < s) return -1;
  if (data == NULL || weight == NULL || out == NULL) return -1;
  if (bounds < 0 || bounds > 3) return -1;

  job.data = data;
  job.out = out;
  job.N = n, job.C = c, job.H = h, job.W = w, job.K = k, job.R = r, job.S = s;
  job.PT = pad_top, job.PL = pad_left, job.SH = stride_h, job.SW = stride_w;
  job.OH = ((ptrdiff_t)h + pad_top + pad_bottom - r) / stride_h + 1;
  job.OW = ((ptrdiff_t)w + pad_left + pad_right - s) / stride_w + 1;
  job.OWP = (job.OW + VANILLA_WT - 1) / VANILLA_WT * VANILLA_WT;
  job.CRS = (ptrdiff_t)c * r * s;
  /* a phase holds its share of the padded row, and the OWP columns a tile reads
   * from the last line's start (s / SW in) */
  job.PWP = ((ptrdiff_t)pad_left + w + stride_w - 1) / stride_w;
  if (job.PWP < job.OWP + (s - 1) / stride_w) job.PWP = job.OWP + (s - 1) / stride_w;
  job.failed = 0;
  job.wide = 0;
#if VANILLA_AVX512
  job.wide = __builtin_cpu_supports("avx512f") && k > VANILLA_KT;
#endif
  job.KT = job.wide ? 16 : VANILLA_KT;
  KP = (job.K + job.KT - 1) / job.KT * job.KT;
  job.bias = bias;
  job.act.lo = lo, job.act.hi = hi, job.act.which = bounds;
  if (job.OH * job.OW == 1) return vanilla_one_position(&job, weight);

  packed = (float*)malloc((size_t)(KP * job.CRS + (bias ? KP : 0)) * sizeof(float));
  if (packed == NULL) return -2;
  if (bias) { /* padded with zeros to whole tiles of channels, as the weights */
    padded_bias = packed + KP * job.CRS;
    for (k0 = 0; k0 < KP; ++k0) padded_bias[k0] = k0 < job.K ? bias[k0] : 0.0f;
    job.bias = padded_bias;
  }
  /* packed[(k0/KT)*CRS*KT + p*KT + j] = weight[k0 + j][p], 0 past K */
  for (k0 = 0; k0 < KP; k0 += job.KT)
    for (p = 0; p < job.CRS; ++p)
      for (j = 0; j < job.KT; ++j)
        packed[k0 * job.CRS + p * job.KT + j] =
            (k0 + j < job.K) ? weight[(k0 + j) * job.CRS + p] : 0.0f;
  job.packed = packed;

  /* rows in parallel on TVM's thread pool when there are enough of them */
  if (!VANILLA_HAVE_POOL || job.N * job.OH < 2 ||
      TVMBackendParallelLaunch(vanilla_task, &job, 0) != 0) {
    vanilla_parallel_env one = {NULL, 1};
    job.failed = 0;
    vanilla_task(0, &one, &job);
  }
  free(packed);
  return job.failed ? -2 : 0;
}
