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
#define VERSION_MAX 2 /* versions 1 (in order) and 2 (dependency tokens) are read */
#define DATA_SLOT 0xFFFFu
#define RES_SHIFT_MAX 62

/* The cycle model: an instruction's cost depends on its fields only (the README's table). */
#define DMA_SETUP 8   /* cycles before a LOAD or STORE moves its first bytes */
#define DMA_WIDTH 16  /* bytes a DMA moves per cycle */
#define CORE_SETUP 4  /* cycles before a GEMM or ALU issues its first operation */

/* The deps byte (isa.DEP_FLAGS); prev and next in the order load -> compute -> store. */
enum { POP_PREV = 1, POP_NEXT = 2, PUSH_PREV = 4, PUSH_NEXT = 8, DEP_ALL = 15 };
enum { M_LOAD = SNPU_LOAD_MODULE, M_COMPUTE = SNPU_COMPUTE_MODULE, M_STORE = SNPU_STORE_MODULE };
/* The four token queues: producer -> consumer. */
enum { Q_LOAD_COMPUTE, Q_COMPUTE_LOAD, Q_COMPUTE_STORE, Q_STORE_COMPUTE, QUEUES };
#define NONE UINT32_MAX
#define DEADLOCK_BYTES 256

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
    uint8_t deps, module;
    uint64_t cost; /* cycles, from the fields alone */
} insn_t;

/* When each instruction runs: the order instructions issue in, and their intervals. */
typedef struct {
    uint32_t *order;   /* program indices in the order they issue */
    uint32_t issued;   /* entries of order (fewer than the count: a deadlock follows) */
    uint64_t *start, *end; /* per program index (instructions issued only) */
    uint64_t cycles, busy[3], instructions[3];
    char deadlock[DEADLOCK_BYTES]; /* the fault after the issued ones, "" if none */
} sched_t;

struct snpu_program {
    uint32_t buffers, count, data_bytes, version;
    uint64_t data_offset;
    insn_t *insn;
    sched_t sched;
};

/* What the hazard check keeps per on-chip element (INP/WGT byte, ACC word), in one run:
 * the last writer and, of the readers since it, the highest program index and the one
 * completing last (completions are the schedule's: looked up by index). A stale epoch
 * means untouched in this run. */
typedef struct {
    uint32_t epoch, writer, reader_max, reader_late;
} shadow_t;

struct snpu_device {
    uint8_t *dram;
    uint64_t dram_bytes;
    int8_t *inp, *wgt;
    int32_t *acc;
    uint32_t inp_bytes, wgt_bytes, acc_words;
    snpu_counters counters;
    shadow_t *shadow[3]; /* INP, WGT, ACC */
    uint32_t epoch;
};

static const char *const OP_NAMES[] = {"?", "LOAD", "GEMM", "ALU", "STORE"};
static const char *const MODULE_NAMES[] = {"load", "compute", "store"};

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
    dev->shadow[BUF_INP] = calloc(inp_bytes ? inp_bytes : 1, sizeof(shadow_t));
    dev->shadow[BUF_WGT] = calloc(wgt_bytes ? wgt_bytes : 1, sizeof(shadow_t));
    dev->shadow[BUF_ACC] = calloc(acc_words ? acc_words : 1, sizeof(shadow_t));
    if (!dev->dram || !dev->inp || !dev->wgt || !dev->acc || !dev->shadow[0] ||
        !dev->shadow[1] || !dev->shadow[2]) {
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
    for (int b = 0; b < 3; b++) free(dev->shadow[b]);
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

/* The fields of an instruction, checked; not its deps byte, module or cost. */
static int decode_fields(const snpu_device *dev, const uint8_t *p, uint32_t index,
                         uint32_t buffers, uint32_t data_bytes, insn_t *in, char *err,
                         size_t errlen) {
    memset(in, 0, sizeof *in);
    in->op = (uint8_t)u8(p);
    if (in->op < OP_LOAD || in->op > OP_STORE)
        return fail(err, errlen, "program rejected: instruction %u has opcode %u (1-4 exist)",
                    index, in->op);
    const char *name = OP_NAMES[in->op];
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

/* a * b, saturated: costs of absurd programs stay ordered instead of wrapping. */
static uint64_t mul_sat(uint64_t a, uint64_t b) {
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}
static uint64_t add_sat(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

static uint64_t product(const uint32_t *extent, int n) {
    uint64_t v = 1;
    for (int d = 0; d < n; d++) v = mul_sat(v, extent[d]);
    return v;
}

static uint64_t dma_cycles(uint64_t bytes) {
    return add_sat(DMA_SETUP, bytes / DMA_WIDTH + (bytes % DMA_WIDTH != 0));
}

/* An instruction's cycles (the README's cycle model): from its fields, never its data. A
 * LOAD or STORE that moves nothing costs nothing (a no-op, e.g. carrying tokens only). */
static uint64_t cost(const insn_t *in) {
    uint32_t e[3];
    if (in->op == OP_LOAD || in->op == OP_STORE) {
        for (int d = 0; d < 3; d++)
            e[d] = in->op == OP_LOAD ? in->dim[d].before + in->dim[d].size + in->dim[d].after
                                     : in->dim[d].size;
        uint64_t elements = product(e, 3);
        if (!elements) return 0;
        uint64_t bytes = in->op == OP_LOAD ? (in->a == BUF_ACC ? 4 : 1) : type_bytes(in->b);
        return dma_cycles(mul_sat(elements, bytes));
    }
    return add_sat(CORE_SETUP, product(in->ext, in->op == OP_GEMM ? 3 : 2));
}

static int module_of(const insn_t *in) {
    if (in->op == OP_LOAD) return in->a == BUF_ACC ? M_COMPUTE : M_LOAD;
    return in->op == OP_STORE ? M_STORE : M_COMPUTE;
}

/* An instruction of a program of format version `version`, checked and classified. */
static int decode(const snpu_device *dev, const uint8_t *p, uint32_t index, uint32_t buffers,
                  uint32_t data_bytes, uint32_t version, insn_t *in, char *err, size_t errlen) {
    if (decode_fields(dev, p, index, buffers, data_bytes, in, err, errlen)) return 1;
    const char *name = OP_NAMES[in->op];
    uint32_t deps = u8(p + 1);
    in->deps = (uint8_t)deps;
    in->module = (uint8_t)module_of(in);
    in->cost = cost(in);
    if (!deps) return 0;
    if (version == 1)
        return fail(err, errlen,
                    "program rejected: instruction %u (%s) sets dependency flags 0x%02x; "
                    "version 1 executes in order and takes none",
                    index, name, deps);
    if (deps & ~DEP_ALL)
        return fail(err, errlen, "program rejected: instruction %u (%s) sets dependency flags "
                    "0x%02x; only pop_prev, pop_next, push_prev, push_next (0x0f) exist", index,
                    name, deps);
    const char *module = MODULE_NAMES[in->module];
    if (in->module == M_LOAD && (deps & (POP_PREV | PUSH_PREV)))
        return fail(err, errlen, "program rejected: instruction %u (%s) %s a token %s a module "
                    "before load; the %s module is the first (flags 0x%02x)", index, name,
                    deps & POP_PREV ? "pops" : "pushes", deps & POP_PREV ? "from" : "to",
                    module, deps);
    if (in->module == M_STORE && (deps & (POP_NEXT | PUSH_NEXT)))
        return fail(err, errlen, "program rejected: instruction %u (%s) %s a token %s a module "
                    "after store; the %s module is the last (flags 0x%02x)", index, name,
                    deps & POP_NEXT ? "pops" : "pushes", deps & POP_NEXT ? "from" : "to",
                    module, deps);
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
    if (version < 1 || version > VERSION_MAX)
        return fail(err, errlen, "program rejected: format version %u; this runtime reads "
                    "versions 1 to %d", version, VERSION_MAX);
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
        if (decode(dev, bytes + HEADER_BYTES + (uint64_t)i * INSN_BYTES, i, *buffers, data,
                   version, &in, err, errlen))
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ the schedule */

static void sched_free(sched_t *s) {
    free(s->order);
    free(s->start);
    free(s->end);
    s->order = NULL;
    s->start = s->end = NULL;
}

/* The queue a module pops from (POP_PREV or POP_NEXT), or pushes to; -1: none (rejected at
 * decode). */
static int queue_popped(int module, int flag) {
    if (flag == POP_PREV)
        return module == M_COMPUTE ? Q_LOAD_COMPUTE : module == M_STORE ? Q_COMPUTE_STORE : -1;
    return module == M_LOAD ? Q_COMPUTE_LOAD : module == M_COMPUTE ? Q_STORE_COMPUTE : -1;
}
static int queue_pushed(int module, int flag) {
    if (flag == PUSH_PREV)
        return module == M_COMPUTE ? Q_COMPUTE_LOAD : module == M_STORE ? Q_STORE_COMPUTE : -1;
    return module == M_LOAD ? Q_LOAD_COMPUTE : module == M_COMPUTE ? Q_COMPUTE_STORE : -1;
}
static const int QUEUE_PRODUCER[QUEUES] = {M_LOAD, M_COMPUTE, M_COMPUTE, M_STORE};

static uint32_t next_of(const insn_t *insn, uint32_t count, int module, uint32_t from) {
    while (from < count && insn[from].module != module) from++;
    return from;
}

/* When each instruction runs. Version 1: each waits for the previous one's completion.
 * Version 2: event-driven over the three modules, each in program order; an instruction
 * issues when its module is free and the tokens it pops are available (pushed at the
 * completion of their pusher); the earliest issue goes first, ties to the lower index.
 * Nonzero only when out of host memory; a deadlock is recorded in s->deadlock. */
static int schedule(const insn_t *insn, uint32_t count, uint32_t version, sched_t *s, char *err,
                    size_t errlen) {
    memset(s, 0, sizeof *s);
    size_t n = count ? count : 1;
    s->order = calloc(n, sizeof *s->order);
    s->start = calloc(n, sizeof *s->start);
    s->end = calloc(n, sizeof *s->end);
    uint64_t *avail = version == 1 ? NULL : calloc((size_t)QUEUES * n, sizeof *avail);
    if (!s->order || !s->start || !s->end || (version != 1 && !avail)) {
        sched_free(s);
        free(avail);
        return fail(err, errlen, "out of host memory for the schedule of %u instructions",
                    count);
    }
    for (uint32_t i = 0; i < count; i++) {
        s->instructions[insn[i].module]++;
        s->busy[insn[i].module] = add_sat(s->busy[insn[i].module], insn[i].cost);
    }
    if (version == 1) {
        uint64_t t = 0;
        for (uint32_t i = 0; i < count; i++) {
            s->order[i] = i;
            s->start[i] = t;
            s->end[i] = t = add_sat(t, insn[i].cost);
        }
        s->issued = count;
        s->cycles = t;
        return 0;
    }
    /* tokens of queue q, available at avail[q * n + k] for head[q] <= k < tail[q] */
    uint32_t head[QUEUES] = {0}, tail[QUEUES] = {0};
    uint32_t next[3];
    uint64_t free_at[3] = {0};
    for (int m = 0; m < 3; m++) next[m] = next_of(insn, count, m, 0);
    while (s->issued < count) {
        int best = -1, stuck = -1, stuck_queue = -1;
        uint64_t best_t = 0;
        for (int m = 0; m < 3; m++) {
            uint32_t i = next[m];
            if (i >= count) continue;
            uint64_t t = free_at[m];
            int waits = -1;
            for (int flag = POP_PREV; flag <= POP_NEXT; flag <<= 1) {
                if (!(insn[i].deps & flag)) continue;
                int q = queue_popped(m, flag);
                if (head[q] == tail[q]) {
                    waits = q;
                    break;
                }
                if (avail[(size_t)q * n + head[q]] > t) t = avail[(size_t)q * n + head[q]];
            }
            if (waits >= 0) {
                if (stuck < 0 || i < next[stuck]) stuck = m, stuck_queue = waits;
            } else if (best < 0 || t < best_t || (t == best_t && i < next[best])) {
                best = m;
                best_t = t;
            }
        }
        if (best < 0) {
            uint32_t i = next[stuck];
            snprintf(s->deadlock, sizeof s->deadlock, "fault: deadlock: the %s module waits at "
                     "instruction %u (%s) for a token from %s that is never pushed",
                     MODULE_NAMES[stuck], i, OP_NAMES[insn[i].op],
                     MODULE_NAMES[QUEUE_PRODUCER[stuck_queue]]);
            break;
        }
        uint32_t i = next[best];
        const insn_t *in = &insn[i];
        uint64_t end = add_sat(best_t, in->cost);
        for (int flag = POP_PREV; flag <= POP_NEXT; flag <<= 1)
            if (in->deps & flag) head[queue_popped(best, flag)]++;
        for (int flag = PUSH_PREV; flag <= PUSH_NEXT; flag <<= 1)
            if (in->deps & flag) {
                int q = queue_pushed(best, flag);
                avail[(size_t)q * n + tail[q]++] = end;
            }
        s->order[s->issued++] = i;
        s->start[i] = best_t;
        s->end[i] = end;
        free_at[best] = end;
        if (end > s->cycles) s->cycles = end;
        next[best] = next_of(insn, count, best, i + 1);
    }
    free(avail);
    return 0;
}

/* The instructions of a program snpu_check accepted, decoded, and their schedule. */
static insn_t *decode_all(const snpu_device *dev, const uint8_t *bytes, uint32_t buffers,
                          uint32_t data, sched_t *sched, char *err, size_t errlen) {
    uint32_t count = u32(bytes + 12), version = u16(bytes + 4);
    insn_t *insn = calloc(count ? count : 1, sizeof *insn);
    if (!insn) {
        fail(err, errlen, "out of host memory for a program of %u instructions", count);
        return NULL;
    }
    for (uint32_t i = 0; i < count; i++)
        decode(dev, bytes + HEADER_BYTES + (uint64_t)i * INSN_BYTES, i, buffers, data, version,
               &insn[i], err, errlen);
    if (schedule(insn, count, version, sched, err, errlen)) {
        free(insn);
        return NULL;
    }
    return insn;
}

snpu_program *snpu_load(snpu_device *dev, const uint8_t *bytes, uint64_t nbytes,
                        uint64_t data_offset, char *err, size_t errlen) {
    uint32_t buffers, data;
    if (snpu_check(dev, bytes, nbytes, &buffers, &data, err, errlen)) return NULL;
    uint32_t count = u32(bytes + 12);
    if (data && dram_range(dev, data_offset, data, err, errlen)) return NULL;
    snpu_program *prog = calloc(1, sizeof *prog);
    if (!prog) {
        fail(err, errlen, "out of host memory for a program of %u instructions", count);
        return NULL;
    }
    prog->insn = decode_all(dev, bytes, buffers, data, &prog->sched, err, errlen);
    if (!prog->insn) {
        free(prog);
        return NULL;
    }
    if (data) memcpy(dev->dram + data_offset, bytes + HEADER_BYTES + (uint64_t)count * INSN_BYTES,
                     data);
    prog->buffers = buffers;
    prog->count = count;
    prog->data_bytes = data;
    prog->version = u16(bytes + 4);
    prog->data_offset = data_offset;
    return prog;
}

void snpu_unload(snpu_program *prog) {
    if (!prog) return;
    sched_free(&prog->sched);
    free(prog->insn);
    free(prog);
}

int snpu_timing(const uint8_t *bytes, uint64_t nbytes, uint32_t inp_bytes, uint32_t wgt_bytes,
                uint32_t acc_words, snpu_timing_t *out, snpu_interval *trace,
                uint64_t trace_cap, char *err, size_t errlen) {
    /* checking reads the capacities only: a device without memory stands in */
    snpu_device shape;
    memset(&shape, 0, sizeof shape);
    shape.inp_bytes = inp_bytes;
    shape.wgt_bytes = wgt_bytes;
    shape.acc_words = acc_words;
    uint32_t buffers, data;
    if (!bytes || !out) return fail(err, errlen, "snpu_timing: no program or no output");
    if (snpu_check(&shape, bytes, nbytes, &buffers, &data, err, errlen)) return 1;
    sched_t sched;
    insn_t *insn = decode_all(&shape, bytes, buffers, data, &sched, err, errlen);
    if (!insn) return 1;
    int rc = 0;
    if (sched.deadlock[0]) {
        rc = fail(err, errlen, "%s", sched.deadlock);
    } else {
        uint32_t count = u32(bytes + 12);
        memset(out, 0, sizeof *out);
        out->cycles = sched.cycles;
        for (int m = 0; m < 3; m++) {
            out->busy[m] = sched.busy[m];
            out->instructions[m] = sched.instructions[m];
        }
        for (uint32_t i = 0; trace && i < count && i < trace_cap; i++) {
            trace[i].index = i;
            trace[i].module = insn[i].module;
            trace[i].start = sched.start[i];
            trace[i].end = sched.end[i];
            out->trace_len++;
        }
    }
    sched_free(&sched);
    free(insn);
    return rc;
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
            }
        }
    }
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
    if (!(in->flags & FLAG_RESET)) dev->counters.macs += ops * LANES * LANES;
    return 0;
}

static int run_alu(run_t *r, const insn_t *in) {
    snpu_device *dev = r->dev;
    int32_t *acc = dev->acc;
    const int32_t *mul = acc + in->mul_base, *shift = acc + in->shift_base;
    const int32_t *res_shift = acc + in->res_shift_base;
    for (uint32_t i0 = 0; i0 < in->ext[0]; i0++)
        for (uint32_t i1 = 0; i1 < in->ext[1]; i1++) {
            int32_t *dst = acc + in->abase[0] + (int64_t)i0 * in->astride[0][0] +
                           (int64_t)i1 * in->astride[0][1];
            const int32_t *src = acc + in->abase[1] + (int64_t)i0 * in->astride[1][0] +
                                 (int64_t)i1 * in->astride[1][1];
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
            }
    return 0;
}

/* ------------------------------------------------------------------ hazards */

/* One affine walk over an on-chip buffer: base + sum(i_d * stride_d) + l, 0 <= l < len. */
typedef struct {
    uint8_t buf, write; /* write: written (or read and written) */
    int64_t base;
    uint32_t ext[3], len;
    int32_t stride[3];
} access_t;

static access_t walk_of(int buf, int write, int64_t base, const uint32_t *ext,
                        const int32_t *stride, int n, uint32_t len) {
    access_t a = {(uint8_t)buf, (uint8_t)write, base, {1, 1, 1}, len, {0, 0, 0}};
    for (int d = 0; d < n; d++) {
        /* a loop of stride 0 touches the same elements each time (a GEMM's weights
         * across rows): once is enough for the hazard check */
        a.ext[3 - n + d] = stride[d] ? ext[d] : 1;
        a.stride[3 - n + d] = stride[d];
    }
    return a;
}

/* The on-chip elements an instruction touches, as up to 5 walks (what run_* touch). */
static int accesses(const insn_t *in, access_t *a) {
    uint32_t ext[3];
    int32_t stride[3];
    int n = 0;
    if (in->op == OP_LOAD || in->op == OP_STORE) {
        int load = in->op == OP_LOAD;
        for (int d = 0; d < 3; d++) {
            ext[d] = load ? in->dim[d].before + in->dim[d].size + in->dim[d].after
                          : in->dim[d].size;
            stride[d] = load ? in->dim[d].dst_stride : in->dim[d].src_stride;
        }
        if (!any_zero(ext, 3)) a[n++] = walk_of(load ? in->a : BUF_ACC, load, in->base, ext,
                                                stride, 3, 1);
        return n;
    }
    if (in->op == OP_GEMM) {
        if (any_zero(in->ext, 3)) return 0;
        static const int bufs[3] = {BUF_ACC, BUF_INP, BUF_WGT};
        static const uint32_t len[3] = {LANES, LANES, LANES * LANES};
        int operands = (in->flags & FLAG_RESET) ? 1 : 3;
        for (int o = 0; o < operands; o++)
            a[n++] = walk_of(bufs[o], o == 0, in->gbase[o], in->ext, in->gstride[o], 3, len[o]);
        return n;
    }
    if (any_zero(in->ext, 2)) return 0;
    static const uint32_t one[1] = {1};
    static const int32_t zero[1] = {0};
    a[n++] = walk_of(BUF_ACC, 1, in->abase[0], in->ext, in->astride[0], 2, LANES);
    int uses_src = in->a == ALU_FXP ? (in->flags & FLAG_RESIDUAL) : !(in->flags & FLAG_IMM);
    if (uses_src) a[n++] = walk_of(BUF_ACC, 0, in->abase[1], in->ext, in->astride[1], 2, LANES);
    if (in->a == ALU_FXP) {
        a[n++] = walk_of(BUF_ACC, 0, in->mul_base, one, zero, 1, LANES);
        a[n++] = walk_of(BUF_ACC, 0, in->shift_base, one, zero, 1, LANES);
        if (in->flags & FLAG_RESIDUAL)
            a[n++] = walk_of(BUF_ACC, 0, in->res_shift_base, one, zero, 1, LANES);
    }
    return n;
}

enum { HZ_NONE, HZ_WRITER_EARLY, HZ_WRITER_OVERLAP, HZ_READER_EARLY, HZ_READER_OVERLAP };

typedef struct {
    shadow_t *shadow;
    const uint64_t *end_of; /* completion per program index: the schedule's */
    uint32_t epoch, index;  /* the instruction checked */
    uint64_t start, end;
    int write;
    int kind;        /* what was found first */
    uint32_t other;  /* and with which instruction */
    int64_t lo, hi;  /* the elements where it was found */
} hazard_t;

/* How touching element x at h->start conflicts with what touched it before in this run.
 * Instructions of one module never conflict here: the module runs them in program order,
 * each after the previous one's completion. So an earlier writer (or reader) whose
 * completion is after h->start, or a later one that already ran, is of another module. */
static inline int conflict(const hazard_t *h, int64_t x, uint32_t *other) {
    const shadow_t *s = &h->shadow[x];
    if (s->epoch != h->epoch) return HZ_NONE;
    if (s->writer != NONE) {
        *other = s->writer;
        if (s->writer > h->index) return HZ_WRITER_EARLY;
        if (h->end_of[s->writer] > h->start) return HZ_WRITER_OVERLAP;
    }
    if (h->write && s->reader_max != NONE && s->reader_max > h->index) {
        *other = s->reader_max;
        return HZ_READER_EARLY;
    }
    if (h->write && s->reader_late != NONE && h->end_of[s->reader_late] > h->start) {
        *other = s->reader_late;
        return HZ_READER_OVERLAP;
    }
    return HZ_NONE;
}

static inline void note(const hazard_t *h, int64_t x) {
    shadow_t *s = &h->shadow[x];
    if (s->epoch != h->epoch) {
        s->epoch = h->epoch;
        s->writer = s->reader_max = s->reader_late = NONE;
    }
    if (h->write) {
        s->writer = h->index;
        s->reader_max = s->reader_late = NONE;
        return;
    }
    if (s->reader_max == NONE || h->index > s->reader_max) s->reader_max = h->index;
    if (s->reader_late == NONE || h->end >= h->end_of[s->reader_late]) s->reader_late = h->index;
}

/* Every element x of a walk, in a loop with `body` inside (a macro: no call per element). */
#define FOR_EACH_ELEMENT(a, x, body)                                                        \
    for (uint32_t i0_ = 0; i0_ < (a)->ext[0]; i0_++)                                        \
        for (uint32_t i1_ = 0; i1_ < (a)->ext[1]; i1_++)                                    \
            for (uint32_t i2_ = 0; i2_ < (a)->ext[2]; i2_++) {                              \
                int64_t at_ = (a)->base + (int64_t)i0_ * (a)->stride[0] +                   \
                              (int64_t)i1_ * (a)->stride[1] + (int64_t)i2_ * (a)->stride[2]; \
                for (int64_t x = at_; x < at_ + (a)->len; x++) body                         \
            }

/* The first conflict of a walk: nonzero and h->kind, h->other, h->lo..h->hi (every
 * element where the same conflict with the same instruction occurs). */
static int find(hazard_t *h, const access_t *a) {
    uint32_t other = NONE;
    FOR_EACH_ELEMENT(a, x, {
        int kind = conflict(h, x, &other);
        if (kind == HZ_NONE) continue;
        if (!h->kind) {
            h->kind = kind;
            h->other = other;
            h->lo = h->hi = x;
        } else if (kind == h->kind && other == h->other) {
            if (x < h->lo) h->lo = x;
            if (x > h->hi) h->hi = x;
        }
    })
    return h->kind != HZ_NONE;
}

/* Instruction i about to run: fail on its first conflict with an instruction of another
 * module (one that should come before it in program order but has not completed, or
 * that should come after it but has run), then record its reads and writes. */
static int hazards(snpu_device *dev, const snpu_program *prog, uint32_t i, char *err,
                   size_t errlen) {
    const insn_t *in = &prog->insn[i];
    const sched_t *sc = &prog->sched;
    access_t a[5];
    int n = accesses(in, a);
    hazard_t h;
    memset(&h, 0, sizeof h);
    h.epoch = dev->epoch;
    h.end_of = sc->end;
    h.index = i;
    h.start = sc->start[i];
    h.end = sc->end[i];
    for (int k = 0; k < n; k++) {
        h.shadow = dev->shadow[a[k].buf];
        h.write = a[k].write;
        if (!find(&h, &a[k])) continue;
        /* name the pair in program order */
        int other_writes = h.kind == HZ_WRITER_EARLY || h.kind == HZ_WRITER_OVERLAP;
        int early = h.kind == HZ_WRITER_EARLY || h.kind == HZ_READER_EARLY;
        uint32_t first = early ? i : h.other, second = early ? h.other : i;
        int first_writes = early ? a[k].write : other_writes;
        int second_writes = early ? other_writes : a[k].write;
        const insn_t *f = &prog->insn[first], *g = &prog->insn[second];
        char detail[160];
        if (early)
            snprintf(detail, sizeof detail, "instruction %u ran early (issued at cycle %llu, "
                     "instruction %u at cycle %llu)", second,
                     (unsigned long long)sc->start[second], first,
                     (unsigned long long)sc->start[first]);
        else
            snprintf(detail, sizeof detail, "they overlapped (cycles [%llu, %llu) and [%llu, "
                     "%llu))", (unsigned long long)sc->start[first],
                     (unsigned long long)sc->end[first], (unsigned long long)sc->start[second],
                     (unsigned long long)sc->end[second]);
        return fail(err, errlen, "fault: hazard: instruction %u (%s, %s) %s %s[%lld..%lld] "
                    "while instruction %u (%s, %s) %s it: %s: a missing dependency token",
                    first, OP_NAMES[f->op], MODULE_NAMES[f->module],
                    first_writes ? "writes" : "reads", BUF_NAMES[a[k].buf], (long long)h.lo,
                    (long long)h.hi, second, OP_NAMES[g->op], MODULE_NAMES[g->module],
                    second_writes ? "writes" : "reads", detail);
    }
    /* reads first: an element read and written ends up written */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < n; k++) {
            if (a[k].write != pass) continue;
            h.shadow = dev->shadow[a[k].buf];
            h.write = a[k].write;
            FOR_EACH_ELEMENT(&a[k], x, { note(&h, x); })
        }
    return 0;
}

/* ------------------------------------------------------------------ runs */

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
    /* version 1 runs in program order, one instruction at a time: nothing to check */
    int check = prog->version >= 2;
    if (check && ++dev->epoch == 0) {
        memset(dev->shadow[BUF_INP], 0, (dev->inp_bytes ? dev->inp_bytes : 1) * sizeof(shadow_t));
        memset(dev->shadow[BUF_WGT], 0, (dev->wgt_bytes ? dev->wgt_bytes : 1) * sizeof(shadow_t));
        memset(dev->shadow[BUF_ACC], 0, (dev->acc_words ? dev->acc_words : 1) * sizeof(shadow_t));
        dev->epoch = 1;
    }
    const sched_t *sc = &prog->sched;
    run_t r = {dev, prog, offsets, sizes, 0, err, errlen};
    /* in the order the schedule issues them: each one's effect happens at its issue */
    for (uint32_t k = 0; k < sc->issued; k++) {
        uint32_t i = sc->order[k];
        r.index = i;
        if (fault_after >= 0 && (int64_t)i == fault_after)
            return fail(err, errlen, "fault at instruction %u (%s): injected", i,
                        OP_NAMES[prog->insn[i].op]);
        const insn_t *in = &prog->insn[i];
        if (check && hazards(dev, prog, i, err, errlen)) return 1;
        int rc = in->op == OP_LOAD ? run_load(&r, in)
                 : in->op == OP_GEMM ? run_gemm(&r, in)
                 : in->op == OP_ALU  ? run_alu(&r, in)
                                     : run_store(&r, in);
        if (rc) return rc;
        snpu_counters *c = &dev->counters;
        c->instructions++;
        uint64_t *busy = in->module == M_LOAD    ? &c->load_cycles
                         : in->module == M_STORE ? &c->store_cycles
                                                 : &c->compute_cycles;
        *busy = add_sat(*busy, in->cost);
        if (in->op == OP_GEMM) c->gemm_cycles = add_sat(c->gemm_cycles, in->cost);
        if (in->op == OP_ALU) c->alu_cycles = add_sat(c->alu_cycles, in->cost);
    }
    if (sc->deadlock[0]) return fail(err, errlen, "%s", sc->deadlock);
    dev->counters.runs++;
    dev->counters.cycles = add_sat(dev->counters.cycles, sc->cycles);
    dev->counters.last_cycles = sc->cycles;
    return 0;
}
