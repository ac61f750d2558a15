/*
 * tma_emu.h - the tensor map as the CPU emulator encodes it: what
 * cudart_emu.cpp's cuTensorMapEncodeTiled writes into a CUtensorMap's 128
 * bytes and what cuda_emu.h's TMA copies read back.
 */
#ifndef FQLA_DEV_TMA_EMU_H
#define FQLA_DEV_TMA_EMU_H

#include <stdint.h>

struct fqla_emu_tmap {
    char *base;
    uint32_t rank, esize;  /* dimensions (1-5); bytes per element */
    uint64_t dims[5];      /* elements, innermost first */
    uint64_t strides[5];   /* bytes; strides[0] = esize */
    uint32_t box[5];       /* elements */
    uint32_t swizzle;      /* 0 none, else the swizzle span in bytes (32, 64, 128) */
};
static_assert(sizeof(fqla_emu_tmap) <= 128, "fits a CUtensorMap");

#endif
