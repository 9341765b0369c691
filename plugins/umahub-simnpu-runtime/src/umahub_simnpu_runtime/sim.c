/* simnpu: the simulated NPU's core (see sim.h, isa.py and the README). */
#include "sim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SNPU_SOURCE_HASH
#define SNPU_SOURCE_HASH ""
#endif

enum { OP_LOAD = 1, OP_GEMM = 2, OP_ALU = 3, OP_STORE = 4 };
enum { BUF_INP = 0, BUF_WGT = 1, BUF_ACC = 2 };
enum { T_I8 = 0, T_U8 = 1, T_I32 = 2 };
enum { ALU_ADD = 0, ALU_MAX = 1, ALU_MIN = 2, ALU_FXP = 3 };
enum { FLAG_IMM = 1, FLAG_RESIDUAL = 2, FLAG_RESET = 1 };

#define LANES 16
#define HEADER_BYTES 32
#define INSN_BYTES 64
#define VERSION 1
#define DATA_SLOT 0xFFFFu
#define RES_SHIFT_MAX 62

/* The cost model (per instruction; issue 32 replaces it with a cycle model). */
#define DMA_SETUP 8   /* cycles before a LOAD or STORE moves its first bytes */
#define DMA_WIDTH 16  /* bytes a DMA moves per cycle */
#define CORE_SETUP 4  /* cycles before a GEMM or ALU issues its first operation */

typedef struct {
    uint32_t size, before, after;
    int32_t src_stride, dst_stride;
} dim_t;

/* One decoded, validated instruction. */
typedef struct {
    uint8_t op, a, b, flags;
    uint32_t slot;
    uint32_t dram_offset, base;
    int32_t imm;
    dim_t dim[3];
    uint32_t ext[3];
    uint32_t gbase[3];      /* GEMM: ACC, INP, WGT bases */
    int32_t gstride[3][3];  /* GEMM: [operand][loop] */
    uint32_t abase[2];      /* ALU: dst, src */
    int32_t astride[2][2];  /* ALU: [operand][loop] */
    uint32_t mul_base, shift_base, res_shift_base;
} insn_t;

struct snpu_program {
    uint32_t buffers, count, data_bytes;
    uint64_t data_offset;
    insn_t *insn;
};

struct snpu_device {
    uint8_t *dram;
    uint64_t dram_bytes;
    int8_t *inp, *wgt;
    int32_t *acc;
    uint32_t inp_bytes, wgt_bytes, acc_words;
    snpu_counters counters;
};

static const char *const OP_NAMES[] = {"?", "LOAD", "GEMM", "ALU", "STORE"};

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return 1;
}

int snpu_abi_version(void) { return SNPU_ABI_VERSION; }
const char *snpu_source_hash(void) { return SNPU_SOURCE_HASH; }

/* ------------------------------------------------------------------ the device */

snpu_device *snpu_create(uint64_t dram_bytes, uint32_t inp_bytes, uint32_t wgt_bytes,
                         uint32_t acc_words, char *err, size_t errlen) {
    snpu_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        fail(err, errlen, "out of host memory for the device");
        return NULL;
    }
    dev->dram = calloc(1, dram_bytes ? dram_bytes : 1);
    dev->inp = calloc(1, inp_bytes ? inp_bytes : 1);
    dev->wgt = calloc(1, wgt_bytes ? wgt_bytes : 1);
    dev->acc = calloc(acc_words ? acc_words : 1, sizeof(int32_t));
    if (!dev->dram || !dev->inp || !dev->wgt || !dev->acc) {
        fail(err, errlen, "out of host memory for %llu bytes of device DRAM",
             (unsigned long long)dram_bytes);
        snpu_destroy(dev);
        return NULL;
    }
    dev->dram_bytes = dram_bytes;
    dev->inp_bytes = inp_bytes;
    dev->wgt_bytes = wgt_bytes;
    dev->acc_words = acc_words;
    return dev;
}

void snpu_destroy(snpu_device *dev) {
    if (!dev) return;
    free(dev->dram);
    free(dev->inp);
    free(dev->wgt);
    free(dev->acc);
    free(dev);
}

static int dram_range(const snpu_device *dev, uint64_t offset, uint64_t nbytes, char *err,
                      size_t errlen) {
    if (offset > dev->dram_bytes || nbytes > dev->dram_bytes - offset)
        return fail(err, errlen, "bytes [%llu, %llu) are outside the device's %llu bytes of DRAM",
                    (unsigned long long)offset, (unsigned long long)(offset + nbytes),
                    (unsigned long long)dev->dram_bytes);
    return 0;
}

int snpu_write(snpu_device *dev, uint64_t offset, const void *src, uint64_t nbytes, char *err,
               size_t errlen) {
    if (dram_range(dev, offset, nbytes, err, errlen)) return 1;
    if (nbytes) memcpy(dev->dram + offset, src, nbytes);
    return 0;
}

int snpu_read(snpu_device *dev, uint64_t offset, void *dst, uint64_t nbytes, char *err,
              size_t errlen) {
    if (dram_range(dev, offset, nbytes, err, errlen)) return 1;
    if (nbytes) memcpy(dst, dev->dram + offset, nbytes);
    return 0;
}

void snpu_counters_get(const snpu_device *dev, snpu_counters *out) { *out = dev->counters; }

/* ------------------------------------------------------------------ decoding */

static uint32_t u8(const uint8_t *p) { return p[0]; }
static uint32_t u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
static uint32_t u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static int32_t i32(const uint8_t *p) {
    uint32_t v = u32(p);
    return v <= 0x7FFFFFFFu ? (int32_t)v : -(int32_t)(~v) - 1;
}

static uint32_t type_bytes(uint32_t t) { return t == T_I32 ? 4 : 1; }

/* The lowest and highest element an affine walk touches: base + sum(i_d * stride_d),
 * 0 <= i_d < extent_d (every extent >= 1), plus len - 1 at the top. */
static void span(int64_t base, const uint32_t *extent, const int32_t *stride, int n, int64_t len,
                 int64_t *lo, int64_t *hi) {
    int64_t a = base, b = base;
    for (int d = 0; d < n; d++) {
        int64_t reach = (int64_t)(extent[d] - 1) * stride[d];
        if (reach < 0) a += reach;
        else b += reach;
    }
    *lo = a;
    *hi = b + len - 1;
}

static int any_zero(const uint32_t *extent, int n) {
    for (int d = 0; d < n; d++)
        if (extent[d] == 0) return 1;
    return 0;
}

static int onchip(int64_t lo, int64_t hi, uint64_t capacity, const char *what, uint32_t index,
                  const char *op, char *err, size_t errlen) {
    if (lo < 0 || hi >= (int64_t)capacity)
        return fail(err, errlen,
                    "program rejected: instruction %u (%s) reaches %s[%lld..%lld], outside its "
                    "%llu entries",
                    index, op, what, (long long)lo, (long long)hi, (unsigned long long)capacity);
    return 0;
}

static const char *BUF_NAMES[] = {"INP", "WGT", "ACC"};

static uint64_t capacity(const snpu_device *dev, uint32_t buf) {
    return buf == BUF_INP ? dev->inp_bytes : buf == BUF_WGT ? dev->wgt_bytes : dev->acc_words;
}

static int decode(const snpu_device *dev, const uint8_t *p, uint32_t index, uint32_t buffers,
                  uint32_t data_bytes, insn_t *in, char *err, size_t errlen) {
    memset(in, 0, sizeof *in);
    in->op = (uint8_t)u8(p);
    if (in->op < OP_LOAD || in->op > OP_STORE)
        return fail(err, errlen, "program rejected: instruction %u has opcode %u (1-4 exist)",
                    index, in->op);
    const char *name = OP_NAMES[in->op];
    if (u8(p + 1))
        return fail(err, errlen,
                    "program rejected: instruction %u (%s) sets dependency flags 0x%02x; "
                    "version 1 executes in order and takes none",
                    index, name, u8(p + 1));
    if (in->op == OP_LOAD || in->op == OP_STORE) {
        int load = in->op == OP_LOAD;
        in->a = (uint8_t)u8(p + 2); /* LOAD: dst buffer; STORE: src buffer */
        in->b = (uint8_t)u8(p + 3); /* the DRAM element type */
        in->slot = u16(p + 4);
        in->dram_offset = u32(p + 8);
        in->base = u32(p + 12);
        if (in->a > BUF_ACC || in->b > T_I32)
            return fail(err, errlen, "program rejected: instruction %u (%s) names buffer %u, "
                        "type %u", index, name, in->a, in->b);
        if (!load && in->a != BUF_ACC)
            return fail(err, errlen, "program rejected: instruction %u (STORE) stores from %s; "
                        "only ACC is stored", index, BUF_NAMES[in->a]);
        if (load && in->a != BUF_ACC && in->b == T_I32)
            return fail(err, errlen, "program rejected: instruction %u (LOAD) loads int32 into "
                        "%s (int8)", index, BUF_NAMES[in->a]);
        if (in->slot >= buffers && !(load && in->slot == DATA_SLOT))
            return fail(err, errlen, "program rejected: instruction %u (%s) names buffer %u; "
                        "the program has %u", index, name, in->slot, buffers);
        uint32_t ext[3], total[3];
        int32_t sstride[3], dstride[3];
        for (int d = 0; d < 3; d++) {
            const uint8_t *q = p + (load ? 20 : 16) + 12 * d;
            dim_t *dm = &in->dim[d];
            dm->size = u16(q);
            if (load) {
                dm->before = u8(q + 2);
                dm->after = u8(q + 3);
                dm->src_stride = i32(q + 4);
                dm->dst_stride = i32(q + 8);
            } else {
                dm->dst_stride = i32(q + 4);
                dm->src_stride = i32(q + 8);
            }
            ext[d] = dm->size;
            total[d] = dm->before + dm->size + dm->after;
            sstride[d] = dm->src_stride;
            dstride[d] = dm->dst_stride;
        }
        int64_t lo, hi;
        if (load) {
            in->imm = i32(p + 16);
            if (in->a != BUF_ACC && (in->imm < -128 || in->imm > 127))
                return fail(err, errlen, "program rejected: instruction %u (LOAD) pads %s with "
                            "%d, not an int8", index, BUF_NAMES[in->a], in->imm);
            if (!any_zero(total, 3)) {
                span(in->base, total, dstride, 3, 1, &lo, &hi);
                if (onchip(lo, hi, capacity(dev, in->a), BUF_NAMES[in->a], index, name, err,
                           errlen))
                    return 1;
            }
            if (in->slot == DATA_SLOT && !any_zero(ext, 3)) {
                span(0, ext, sstride, 3, 1, &lo, &hi);
                int64_t es = type_bytes(in->b);
                int64_t first = (int64_t)in->dram_offset + lo * es;
                int64_t last = (int64_t)in->dram_offset + hi * es + es;
                if (first < 0 || last > (int64_t)data_bytes)
                    return fail(err, errlen, "program rejected: instruction %u (LOAD) reads bytes "
                                "[%lld, %lld) of the data segment, which has %u", index,
                                (long long)first, (long long)last, data_bytes);
            }
        } else if (!any_zero(ext, 3)) {
            span(in->base, ext, sstride, 3, 1, &lo, &hi);
            if (onchip(lo, hi, dev->acc_words, "ACC", index, name, err, errlen)) return 1;
        }
        return 0;
    }
    if (in->op == OP_GEMM) {
        in->flags = (uint8_t)u8(p + 2);
        if (in->flags & ~FLAG_RESET)
            return fail(err, errlen, "program rejected: instruction %u (GEMM) has flags 0x%02x",
                        index, in->flags);
        for (int d = 0; d < 3; d++) in->ext[d] = u16(p + 4 + 2 * d);
        for (int o = 0; o < 3; o++) {
            const uint8_t *q = p + 12 + 16 * o;
            in->gbase[o] = u32(q);
            for (int d = 0; d < 3; d++) in->gstride[o][d] = i32(q + 4 + 4 * d);
        }
        if (any_zero(in->ext, 3)) return 0;
        static const int64_t len[3] = {LANES, LANES, LANES * LANES};
        static const uint32_t bufs[3] = {BUF_ACC, BUF_INP, BUF_WGT};
        for (int o = 0; o < 3; o++) {
            if (o > 0 && (in->flags & FLAG_RESET)) break;
            int64_t lo, hi;
            span(in->gbase[o], in->ext, in->gstride[o], 3, len[o], &lo, &hi);
            if (onchip(lo, hi, capacity(dev, bufs[o]), BUF_NAMES[bufs[o]], index, name, err,
                       errlen))
                return 1;
        }
        return 0;
    }
    /* ALU */
    in->a = (uint8_t)u8(p + 2);
    in->flags = (uint8_t)u8(p + 3);
    if (in->a > ALU_FXP)
        return fail(err, errlen, "program rejected: instruction %u (ALU) has operation %u (0-3 "
                    "exist)", index, in->a);
    uint32_t allowed = in->a == ALU_FXP ? FLAG_RESIDUAL : FLAG_IMM;
    if (in->flags & ~allowed)
        return fail(err, errlen, "program rejected: instruction %u (ALU) has flags 0x%02x",
                    index, in->flags);
    in->ext[0] = u16(p + 4);
    in->ext[1] = u16(p + 6);
    for (int o = 0; o < 2; o++) {
        in->abase[o] = u32(p + 8 + 12 * o);
        in->astride[o][0] = i32(p + 12 + 12 * o);
        in->astride[o][1] = i32(p + 16 + 12 * o);
    }
    in->imm = i32(p + 32);
    in->mul_base = u32(p + 36);
    in->shift_base = u32(p + 40);
    in->res_shift_base = u32(p + 44);
    if (any_zero(in->ext, 2)) return 0;
    int64_t lo, hi;
    span(in->abase[0], in->ext, in->astride[0], 2, LANES, &lo, &hi);
    if (onchip(lo, hi, dev->acc_words, "ACC", index, name, err, errlen)) return 1;
    int uses_src = in->a == ALU_FXP ? (in->flags & FLAG_RESIDUAL) : !(in->flags & FLAG_IMM);
    if (uses_src) {
        span(in->abase[1], in->ext, in->astride[1], 2, LANES, &lo, &hi);
        if (onchip(lo, hi, dev->acc_words, "ACC", index, name, err, errlen)) return 1;
    }
    if (in->a == ALU_FXP) {
        if (onchip(in->mul_base, (int64_t)in->mul_base + LANES - 1, dev->acc_words, "ACC", index,
                   name, err, errlen) ||
            onchip(in->shift_base, (int64_t)in->shift_base + LANES - 1, dev->acc_words, "ACC",
                   index, name, err, errlen))
            return 1;
        if ((in->flags & FLAG_RESIDUAL) &&
            onchip(in->res_shift_base, (int64_t)in->res_shift_base + LANES - 1, dev->acc_words,
                   "ACC", index, name, err, errlen))
            return 1;
    }
    return 0;
}

int snpu_check(const snpu_device *dev, const uint8_t *bytes, uint64_t nbytes, uint32_t *buffers,
               uint32_t *data_bytes, char *err, size_t errlen) {
    if (nbytes < HEADER_BYTES)
        return fail(err, errlen, "program rejected: %llu bytes, shorter than the %d-byte header",
                    (unsigned long long)nbytes, HEADER_BYTES);
    if (memcmp(bytes, "SNPU", 4) != 0)
        return fail(err, errlen, "program rejected: bad magic %02x %02x %02x %02x (not a simnpu "
                    "program)", bytes[0], bytes[1], bytes[2], bytes[3]);
    uint32_t version = u16(bytes + 4);
    if (version != VERSION)
        return fail(err, errlen, "program rejected: format version %u; this runtime reads "
                    "version %d", version, VERSION);
    if (u16(bytes + 6) != HEADER_BYTES || u16(bytes + 8) != INSN_BYTES)
        return fail(err, errlen, "program rejected: header of %u bytes, instructions of %u "
                    "(expected %d and %d)", u16(bytes + 6), u16(bytes + 8), HEADER_BYTES,
                    INSN_BYTES);
    for (int i = 20; i < HEADER_BYTES; i++)
        if (bytes[i])
            return fail(err, errlen, "program rejected: reserved header byte %d is not zero", i);
    uint32_t count = u32(bytes + 12), data = u32(bytes + 16);
    uint64_t want = HEADER_BYTES + (uint64_t)count * INSN_BYTES + data;
    if (want != nbytes)
        return fail(err, errlen, "program rejected: %llu bytes, but its header says %llu "
                    "(%u instructions, %u bytes of data)", (unsigned long long)nbytes,
                    (unsigned long long)want, count, data);
    *buffers = u16(bytes + 10);
    *data_bytes = data;
    insn_t in;
    for (uint32_t i = 0; i < count; i++)
        if (decode(dev, bytes + HEADER_BYTES + (uint64_t)i * INSN_BYTES, i, *buffers, data, &in,
                   err, errlen))
            return 1;
    return 0;
}

snpu_program *snpu_load(snpu_device *dev, const uint8_t *bytes, uint64_t nbytes,
                        uint64_t data_offset, char *err, size_t errlen) {
    uint32_t buffers, data;
    if (snpu_check(dev, bytes, nbytes, &buffers, &data, err, errlen)) return NULL;
    uint32_t count = u32(bytes + 12);
    if (data && dram_range(dev, data_offset, data, err, errlen)) return NULL;
    snpu_program *prog = calloc(1, sizeof *prog);
    insn_t *insn = calloc(count ? count : 1, sizeof *insn);
    if (!prog || !insn) {
        free(prog);
        free(insn);
        fail(err, errlen, "out of host memory for a program of %u instructions", count);
        return NULL;
    }
    for (uint32_t i = 0; i < count; i++)
        decode(dev, bytes + HEADER_BYTES + (uint64_t)i * INSN_BYTES, i, buffers, data, &insn[i],
               err, errlen);
    if (data) memcpy(dev->dram + data_offset, bytes + HEADER_BYTES + (uint64_t)count * INSN_BYTES,
                     data);
    prog->buffers = buffers;
    prog->count = count;
    prog->data_bytes = data;
    prog->data_offset = data_offset;
    prog->insn = insn;
    return prog;
}

void snpu_unload(snpu_program *prog) {
    if (!prog) return;
    free(prog->insn);
    free(prog);
}

/* ------------------------------------------------------------------ execution */

typedef struct {
    snpu_device *dev;
    const snpu_program *prog;
    const uint64_t *offsets, *sizes;
    uint32_t index;
    char *err;
    size_t errlen;
} run_t;

static int32_t sat32(int64_t v) {
    return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

/* Arithmetic shift right of an int64, without relying on the compiler's choice. */
static int64_t asr64(int64_t v, uint32_t k) { return v < 0 ? ~(~v >> k) : v >> k; }

/* The DRAM bytes [first, last) of a slot, as a pointer, checked against the slot's extent. */
static int dram_span(run_t *r, const insn_t *in, uint32_t slot, int64_t first, int64_t last,
                     uint8_t **base) {
    uint64_t offset, size;
    if (slot == DATA_SLOT) {
        offset = r->prog->data_offset;
        size = r->prog->data_bytes;
    } else {
        offset = r->offsets[slot];
        size = r->sizes[slot];
    }
    if (first < 0 || last > (int64_t)size)
        return fail(r->err, r->errlen, "fault at instruction %u (%s): bytes [%lld, %lld) of "
                    "buffer %u, which holds %llu bytes", r->index, OP_NAMES[in->op],
                    (long long)first, (long long)last, slot, (unsigned long long)size);
    *base = r->dev->dram + offset;
    return 0;
}

static uint64_t dma_cycles(uint64_t bytes) { return DMA_SETUP + (bytes + DMA_WIDTH - 1) / DMA_WIDTH; }

static int run_load(run_t *r, const insn_t *in) {
    snpu_device *dev = r->dev;
    const dim_t *d = in->dim;
    uint32_t total[3], ext[3];
    int32_t sstride[3];
    for (int k = 0; k < 3; k++) {
        total[k] = d[k].before + d[k].size + d[k].after;
        ext[k] = d[k].size;
        sstride[k] = d[k].src_stride;
    }
    if (any_zero(total, 3)) return 0;
    int64_t es = type_bytes(in->b);
    uint8_t *src = NULL;
    if (!any_zero(ext, 3)) {
        int64_t lo, hi;
        span(0, ext, sstride, 3, 1, &lo, &hi);
        if (dram_span(r, in, in->slot, (int64_t)in->dram_offset + lo * es,
                      (int64_t)in->dram_offset + hi * es + es, &src))
            return 1;
        src += in->dram_offset;
    }
    uint64_t moved = 0;
    for (uint32_t i0 = 0; i0 < total[0]; i0++) {
        int in0 = i0 >= d[0].before && i0 < d[0].before + d[0].size;
        for (uint32_t i1 = 0; i1 < total[1]; i1++) {
            int in1 = in0 && i1 >= d[1].before && i1 < d[1].before + d[1].size;
            for (uint32_t i2 = 0; i2 < total[2]; i2++) {
                int inside = in1 && i2 >= d[2].before && i2 < d[2].before + d[2].size;
                int64_t dst = (int64_t)in->base + (int64_t)i0 * d[0].dst_stride +
                              (int64_t)i1 * d[1].dst_stride + (int64_t)i2 * d[2].dst_stride;
                int32_t v = in->imm;
                if (inside) {
                    int64_t at = ((int64_t)(i0 - d[0].before) * d[0].src_stride +
                                  (int64_t)(i1 - d[1].before) * d[1].src_stride +
                                  (int64_t)(i2 - d[2].before) * d[2].src_stride) * es;
                    const uint8_t *s = src + at;
                    v = in->b == T_I8 ? (int32_t)(int8_t)s[0]
                        : in->b == T_U8 ? (int32_t)s[0]
                                        : i32(s);
                    if (in->a != BUF_ACC && in->b == T_U8) v -= 128;
                }
                if (in->a == BUF_ACC) dev->acc[dst] = v;
                else if (in->a == BUF_INP) dev->inp[dst] = (int8_t)v;
                else dev->wgt[dst] = (int8_t)v;
                moved++;
            }
        }
    }
    dev->counters.load_cycles += dma_cycles(moved * (in->a == BUF_ACC ? 4 : 1));
    return 0;
}

static int run_gemm(run_t *r, const insn_t *in) {
    snpu_device *dev = r->dev;
    uint64_t ops = 0;
    for (uint32_t i0 = 0; i0 < in->ext[0]; i0++)
        for (uint32_t i1 = 0; i1 < in->ext[1]; i1++)
            for (uint32_t i2 = 0; i2 < in->ext[2]; i2++) {
                int64_t at[3];
                for (int o = 0; o < 3; o++)
                    at[o] = (int64_t)in->gbase[o] + (int64_t)i0 * in->gstride[o][0] +
                            (int64_t)i1 * in->gstride[o][1] + (int64_t)i2 * in->gstride[o][2];
                int32_t *acc = dev->acc + at[0];
                ops++;
                if (in->flags & FLAG_RESET) {
                    memset(acc, 0, LANES * sizeof *acc);
                    continue;
                }
                const int8_t *x = dev->inp + at[1];
                const int8_t *w = dev->wgt + at[2];
                for (int o = 0; o < LANES; o++) {
                    int32_t sum = 0; /* at most 16 * 128 * 128: no overflow */
                    for (int l = 0; l < LANES; l++) sum += (int32_t)x[l] * (int32_t)w[o * LANES + l];
                    acc[o] = (int32_t)((uint32_t)acc[o] + (uint32_t)sum); /* wraps, as int32 does */
                }
            }
    dev->counters.gemm_cycles += CORE_SETUP + ops;
    if (!(in->flags & FLAG_RESET)) dev->counters.macs += ops * LANES * LANES;
    return 0;
}

static int run_alu(run_t *r, const insn_t *in) {
    snpu_device *dev = r->dev;
    int32_t *acc = dev->acc;
    const int32_t *mul = acc + in->mul_base, *shift = acc + in->shift_base;
    const int32_t *res_shift = acc + in->res_shift_base;
    uint64_t ops = 0;
    for (uint32_t i0 = 0; i0 < in->ext[0]; i0++)
        for (uint32_t i1 = 0; i1 < in->ext[1]; i1++) {
            int32_t *dst = acc + in->abase[0] + (int64_t)i0 * in->astride[0][0] +
                           (int64_t)i1 * in->astride[0][1];
            const int32_t *src = acc + in->abase[1] + (int64_t)i0 * in->astride[1][0] +
                                 (int64_t)i1 * in->astride[1][1];
            ops++;
            for (int l = 0; l < LANES; l++) {
                if (in->a == ALU_FXP) {
                    int32_t k = shift[l];
                    if (k < 1 || k > 62)
                        return fail(r->err, r->errlen, "fault at instruction %u (ALU): a shift "
                                    "of %d bits (1 to 62)", r->index, k);
                    /* int64 arithmetic that wraps (as the host's does), computed unsigned */
                    uint64_t p = (uint64_t)((int64_t)dst[l] * (int64_t)mul[l]);
                    if (in->flags & FLAG_RESIDUAL) {
                        int32_t rs = res_shift[l];
                        if (rs < 0 || rs > RES_SHIFT_MAX)
                            return fail(r->err, r->errlen, "fault at instruction %u (ALU): a "
                                        "residual shift of %d bits (0 to %d)", r->index, rs,
                                        RES_SHIFT_MAX);
                        p += (uint64_t)((int64_t)src[l] * (int64_t)in->imm) << rs;
                    }
                    uint64_t bit = (uint64_t)(asr64((int64_t)p, (uint32_t)k) & 1);
                    uint64_t q = p + ((uint64_t)1 << (k - 1)) - 1 + bit;
                    dst[l] = sat32(asr64((int64_t)q, (uint32_t)k));
                } else {
                    int64_t b = (in->flags & FLAG_IMM) ? in->imm : src[l];
                    int64_t a = dst[l];
                    dst[l] = in->a == ALU_ADD ? sat32(a + b) : in->a == ALU_MAX ? (int32_t)(a > b ? a : b)
                                                                             : (int32_t)(a < b ? a : b);
                }
            }
        }
    dev->counters.alu_cycles += CORE_SETUP + ops;
    return 0;
}

static int run_store(run_t *r, const insn_t *in) {
    snpu_device *dev = r->dev;
    const dim_t *d = in->dim;
    uint32_t ext[3];
    int32_t dstride[3];
    for (int k = 0; k < 3; k++) {
        ext[k] = d[k].size;
        dstride[k] = d[k].dst_stride;
    }
    if (any_zero(ext, 3)) return 0;
    int64_t es = type_bytes(in->b), lo, hi;
    span(0, ext, dstride, 3, 1, &lo, &hi);
    uint8_t *dst;
    if (dram_span(r, in, in->slot, (int64_t)in->dram_offset + lo * es,
                  (int64_t)in->dram_offset + hi * es + es, &dst))
        return 1;
    dst += in->dram_offset;
    uint64_t moved = 0;
    for (uint32_t i0 = 0; i0 < ext[0]; i0++)
        for (uint32_t i1 = 0; i1 < ext[1]; i1++)
            for (uint32_t i2 = 0; i2 < ext[2]; i2++) {
                int32_t v = dev->acc[(int64_t)in->base + (int64_t)i0 * d[0].src_stride +
                                     (int64_t)i1 * d[1].src_stride + (int64_t)i2 * d[2].src_stride];
                uint8_t *p = dst + ((int64_t)i0 * d[0].dst_stride + (int64_t)i1 * d[1].dst_stride +
                                    (int64_t)i2 * d[2].dst_stride) * es;
                if (in->b == T_I8) p[0] = (uint8_t)(int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
                else if (in->b == T_U8) p[0] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                else {
                    uint32_t u = (uint32_t)v;
                    p[0] = (uint8_t)u, p[1] = (uint8_t)(u >> 8), p[2] = (uint8_t)(u >> 16),
                    p[3] = (uint8_t)(u >> 24);
                }
                moved++;
            }
    dev->counters.store_cycles += dma_cycles(moved * es);
    return 0;
}

int snpu_execute(snpu_device *dev, const snpu_program *prog, const uint64_t *offsets,
                 const uint64_t *sizes, uint32_t nbuffers, int64_t fault_after, char *err,
                 size_t errlen) {
    if (nbuffers != prog->buffers)
        return fail(err, errlen, "the program runs on %u buffers, it was given %u", prog->buffers,
                    nbuffers);
    for (uint32_t i = 0; i < nbuffers; i++)
        if (offsets[i] > dev->dram_bytes || sizes[i] > dev->dram_bytes - offsets[i])
            return fail(err, errlen, "buffer %u ([%llu, +%llu)) is outside the device's DRAM", i,
                        (unsigned long long)offsets[i], (unsigned long long)sizes[i]);
    run_t r = {dev, prog, offsets, sizes, 0, err, errlen};
    for (uint32_t i = 0; i < prog->count; i++) {
        r.index = i;
        if (fault_after >= 0 && (int64_t)i == fault_after)
            return fail(err, errlen, "fault at instruction %u (%s): injected", i,
                        OP_NAMES[prog->insn[i].op]);
        const insn_t *in = &prog->insn[i];
        int rc = in->op == OP_LOAD ? run_load(&r, in)
                 : in->op == OP_GEMM ? run_gemm(&r, in)
                 : in->op == OP_ALU  ? run_alu(&r, in)
                                     : run_store(&r, in);
        if (rc) return rc;
        dev->counters.instructions++;
    }
    dev->counters.runs++;
    return 0;
}
