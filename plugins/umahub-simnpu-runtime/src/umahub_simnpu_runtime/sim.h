/* simnpu: the simulated NPU's core, in C (the device the Python runtime drives).
 *
 * A device is DRAM addressed by offsets plus three on-chip buffers (INP, WGT:
 * int8; ACC: int32) and four modules (LOAD, GEMM, ALU, STORE) executing a
 * validated program in order. The encoding is defined in isa.py; the README has
 * the table. Every function returns 0 on success, or nonzero with a message in
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

#define SNPU_ABI_VERSION 1

typedef struct snpu_device snpu_device;
typedef struct snpu_program snpu_program;

/* What a device counted since it was made (see the README's cost model). */
typedef struct {
    uint64_t instructions; /* executed */
    uint64_t runs;         /* programs run to the end */
    uint64_t load_cycles;  /* busy cycles of the load module */
    uint64_t gemm_cycles;  /* of the matrix core */
    uint64_t alu_cycles;   /* of the vector unit */
    uint64_t store_cycles; /* of the store module */
    uint64_t macs;         /* int8 multiply-accumulates */
} snpu_counters;

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
 * fault_after >= 0: fail with a fault before executing instruction fault_after. */
int snpu_execute(snpu_device *dev, const snpu_program *prog, const uint64_t *offsets,
                 const uint64_t *sizes, uint32_t nbuffers, int64_t fault_after, char *err,
                 size_t errlen);

void snpu_counters_get(const snpu_device *dev, snpu_counters *out);

#ifdef __cplusplus
}
#endif
#endif
