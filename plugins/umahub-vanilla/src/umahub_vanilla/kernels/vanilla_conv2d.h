/*
 * vanilla_conv2d.h -- the kernel library of umahub-vanilla ("vanilla_accel").
 *
 * A direct 2-D convolution, NCHW data, KCRS (OIHW) weights, float32,
 * groups = 1, dilation = 1, any stride >= 1, any zero padding (the padding is
 * done here: the caller passes the unpadded input); without a bias
 * (vanilla_conv2d_nchw) or with one per output channel, added before the
 * output is stored (vanilla_conv2d_nchw_bias), and then bounded by an
 * activation (vanilla_conv2d_nchw_bias_clamp).
 *
 *   out[n][k][oh][ow] = sum_{c<C, r<R, s<S}
 *       data[n][c][oh*stride_h + r - pad_top][ow*stride_w + s - pad_left]
 *       * weight[k][c][r][s]
 *   (a data element outside [0,H) x [0,W) counts as 0)
 *
 * with  OH = (H + pad_top + pad_bottom - R) / stride_h + 1
 *       OW = (W + pad_left + pad_right - S) / stride_w + 1
 *
 *   data   : N*C*H*W floats, dense row-major (read only)
 *   weight : K*C*R*S floats, dense row-major (read only)
 *   out    : N*K*OH*OW floats, dense row-major; fully overwritten
 *            (must not alias data or weight)
 *
 * Returns 0 on success, -1 when an argument is out of range (non-positive
 * size or stride, negative padding, kernel larger than the padded input;
 * out is left untouched then), -2 when its scratch memory (the C*R padded
 * input rows of an output row, with C*R*S pointers into them, per thread;
 * K*C*R*S floats for the packed weights) cannot be had (out is then left
 * partly written).
 *
 * The work is shared among the threads of TVM's thread pool when the TVM
 * runtime is there (TVMBackendParallelLaunch), else done on the calling thread.
 *
 * The pointer parameters are deliberately NOT const-qualified: TVM's C
 * codegen emits its own prototype for every T.call_extern callee, e.g.
 *   int32_t vanilla_conv2d_nchw(float*, float*, float*, int32_t, ...);
 * and a `const float*` declaration here would conflict with it
 * ("conflicting types") in the generated source that includes this header.
 *
 * The generated host code is compiled as C++ by TVM's default compiler
 * (g++), so the declaration has C linkage in both languages.
 */
#ifndef UMAHUB_VANILLA_CONV2D_H_
#define UMAHUB_VANILLA_CONV2D_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int32_t vanilla_conv2d_nchw(float* data, float* weight, float* out,
                            int32_t n, int32_t c, int32_t h, int32_t w,
                            int32_t k, int32_t r, int32_t s,
                            int32_t pad_top, int32_t pad_left,
                            int32_t pad_bottom, int32_t pad_right,
                            int32_t stride_h, int32_t stride_w);

/* The same convolution plus a bias per output channel:
 *   out[n][k][oh][ow] = (the sum above) + bias[k]
 *   bias : K floats (read only), or NULL for none. */
int32_t vanilla_conv2d_nchw_bias(float* data, float* weight, float* bias, float* out,
                                 int32_t n, int32_t c, int32_t h, int32_t w,
                                 int32_t k, int32_t r, int32_t s,
                                 int32_t pad_top, int32_t pad_left,
                                 int32_t pad_bottom, int32_t pad_right,
                                 int32_t stride_h, int32_t stride_w);

/* The same, and then an activation that bounds the output (a ReLU, a ReLU6, a clip):
 *   out = max(out, lo)  where bit 0 of bounds is set,
 *   out = min(out, hi)  where bit 1 is, in that order (a NaN stays NaN);
 *   bounds 0: no activation; outside 0..3: -1. */
int32_t vanilla_conv2d_nchw_bias_clamp(float* data, float* weight, float* bias, float* out,
                                       float lo, float hi, int32_t bounds,
                                       int32_t n, int32_t c, int32_t h, int32_t w,
                                       int32_t k, int32_t r, int32_t s,
                                       int32_t pad_top, int32_t pad_left,
                                       int32_t pad_bottom, int32_t pad_right,
                                       int32_t stride_h, int32_t stride_w);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* UMAHUB_VANILLA_CONV2D_H_ */
