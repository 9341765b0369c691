/* simnpu: the simulated NPU's core, in C (the device the Python runtime drives).
 *
 * A device is DRAM addressed by offsets plus three on-chip buffers (INP, WGT:
 * int8; ACC: int32) and three modules (load, compute, store) executing a
 * validated program: version 1 in order, version 2 as dataflow ordered by the
 * dependency tokens of each instruction's deps byte, with a cycle model and
 * hazard checking. The encoding is defined in isa.py; the README has the
 * tables. Every function returns 0 on success, or nonzero with a message in
 * err (errlen bytes): nothing here aborts or reads out of bounds on bad input.
 *
 * Threading: a device is used by one thread at a time (the runtime's worker).
 */
#ifndef SIMNPU_SIM_H
#define SIMNPU_SIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SNPU_ABI_VERSION 2

/* The modules, in the order "prev" and "next" of the dependency flags refer to. */
enum { SNPU_LOAD_MODULE = 0, SNPU_COMPUTE_MODULE = 1, SNPU_STORE_MODULE = 2 };

typedef struct snpu_device snpu_device;
typedef struct snpu_program snpu_program;

/* What a device counted since it was made (see the README's cycle model). Busy
 * cycles are added per instruction executed; cycles and last_cycles per run
 * completed. */
typedef struct {
    uint64_t instructions;   /* executed */
    uint64_t runs;           /* programs run to the end */
    uint64_t load_cycles;    /* busy cycles of the load module (LOAD into INP, WGT) */
    uint64_t gemm_cycles;    /* of the matrix core (GEMM) */
    uint64_t alu_cycles;     /* of the vector unit (ALU) */
    uint64_t store_cycles;   /* of the store module */
    uint64_t macs;           /* int8 multiply-accumulates */
    uint64_t compute_cycles; /* of the compute module: GEMM, ALU and LOAD into ACC */
    uint64_t cycles;         /* sum over runs of each run's total, the modules overlapping */
    uint64_t last_cycles;    /* the last completed run's total */
} snpu_counters;

/* A program's timeline, as snpu_timing computes it (no data, no device). Arrays are
 * indexed by module (SNPU_LOAD_MODULE, ...). */
typedef struct {
    uint64_t cycles;          /* total: the latest completion */
    uint64_t busy[3];         /* busy cycles per module */
    uint64_t instructions[3]; /* instructions per module */
    uint64_t trace_len;       /* intervals written to the trace */
} snpu_timing_t;

/* When one instruction ran: cycles [start, end). */
typedef struct {
    uint32_t index; /* in the program */
    uint8_t module;
    uint64_t start, end;
} snpu_interval;

int snpu_abi_version(void);
/* The hash of the sources the library was built from ("" if not given at build). */
const char *snpu_source_hash(void);

snpu_device *snpu_create(uint64_t dram_bytes, uint32_t inp_bytes, uint32_t wgt_bytes,
                         uint32_t acc_words, char *err, size_t errlen);
void snpu_destroy(snpu_device *dev);

int snpu_write(snpu_device *dev, uint64_t offset, const void *src, uint64_t nbytes, char *err,
               size_t errlen);
int snpu_read(snpu_device *dev, uint64_t offset, void *dst, uint64_t nbytes, char *err,
              size_t errlen);

/* Check a program against the device; on success *data_bytes is its data segment's size. */
int snpu_check(const snpu_device *dev, const uint8_t *bytes, uint64_t nbytes,
               uint32_t *buffers, uint32_t *data_bytes, char *err, size_t errlen);
/* Check and keep a program; its data segment is copied to DRAM at data_offset. */
snpu_program *snpu_load(snpu_device *dev, const uint8_t *bytes, uint64_t nbytes,
                        uint64_t data_offset, char *err, size_t errlen);
void snpu_unload(snpu_program *prog);

/* Run a program on buffers (DRAM offset and size of each, in the program's order).
 * Instructions take effect in the order their schedule issues them (version 1: program
 * order). A run faults on a DRAM access outside a buffer, a bad shift, a hazard (version
 * 2: two modules' instructions touching an on-chip element out of program order or
 * overlapping in time) or a deadlock, with a message in err.
 * fault_after >= 0: fail with a fault before executing instruction fault_after. */
int snpu_execute(snpu_device *dev, const snpu_program *prog, const uint64_t *offsets,
                 const uint64_t *sizes, uint32_t nbuffers, int64_t fault_after, char *err,
                 size_t errlen);

void snpu_counters_get(const snpu_device *dev, snpu_counters *out);

/* Check a program (as snpu_check, for on-chip buffers of the given capacities) and
 * compute its timeline without running it: timing depends only on the instructions.
 * A deadlock is an error. trace (may be NULL) gets one interval per instruction, in
 * program order, up to trace_cap. */
int snpu_timing(const uint8_t *bytes, uint64_t nbytes, uint32_t inp_bytes, uint32_t wgt_bytes,
                uint32_t acc_words, snpu_timing_t *out, snpu_interval *trace,
                uint64_t trace_cap, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
