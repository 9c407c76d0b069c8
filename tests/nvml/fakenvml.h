/* Internal to the NVML stand-in (see fakenvml.c): one call's view of the state file and the checks every
 * call makes.  Everything declared here is hidden: only the nvml* functions leave the library. */
#ifndef FAKENVML_H
#define FAKENVML_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS /* define the old unversioned names beside the _vN ones */
#include <nvml.h>

#include "json.h"

#define MAX_GPUS 64
#define MAX_MIG 8 /* MIG device slots per GPU (an A100 or H100 has at most 7) */
#define NOT_MIG 0xFFFFFFFFu

#pragma GCC visibility push(hidden)

struct nvmlDevice_st {
    char unused;
};

/* A GPU's handle is &handles[gpu][0]; its MIG device slot s (0-based) is &handles[gpu][s + 1]. */
extern struct nvmlDevice_st handles[MAX_GPUS][MAX_MIG + 1];

/* One call's view of the state file. */
struct ctx {
    struct jdoc doc;
    char *text;
    int root;        /* the document's object */
    int gpu;         /* the GPU the handle names (the parent of a MIG device) */
    int dev;         /* where the handle's own values are: the GPU, or its MIG instance */
    unsigned index;  /* the GPU's index */
    int mig;         /* the MIG slot, or -1 for a GPU handle */
};

/* Loads the state for system call fn (needs_init: NVML_ERROR_UNINITIALIZED before nvmlInit).  On failure c is
 * freed and the code returned. */
nvmlReturn_t begin_system(struct ctx *c, const char *fn, int needs_init);
/* Loads the state for device call fn on handle dev; mig_ok: the call takes a MIG device handle. */
nvmlReturn_t begin(struct ctx *c, const char *fn, nvmlDevice_t dev, int mig_ok);
void done(struct ctx *c);
/* An unsigned value of node's key: NOT_SUPPORTED when absent, UNKNOWN when not a number in [0, max]. */
nvmlReturn_t value(const struct ctx *c, int node, const char *key, unsigned long long max, unsigned long long *out);
/* Element index of the array at key (NOT_SUPPORTED when the array is absent). */
nvmlReturn_t element(const struct ctx *c, int node, const char *key, int index, unsigned long long max,
                     unsigned long long *out);
nvmlReturn_t copy_string(const struct ctx *c, int node, const char *key, char *out, unsigned int length);
nvmlReturn_t copy_text(const char *s, char *out, unsigned int length);
/* The nvmlReturn_t a node names: an NVML_ERROR_* name (with or without the prefix) or a number. */
nvmlReturn_t code_named(const struct ctx *c, int node);

#pragma GCC visibility pop

#define BEGIN(dev, mig_ok)                                         \
    struct ctx c;                                                  \
    do {                                                           \
        nvmlReturn_t begun = begin(&c, __func__, (dev), (mig_ok)); \
        if (begun != NVML_SUCCESS)                                 \
            return begun;                                          \
    } while (0)
#define END(r)                    \
    do {                          \
        nvmlReturn_t ended = (r); \
        done(&c);                 \
        return ended;             \
    } while (0)

#endif
