/* The NVML stand-in: running processes and MIG devices (see fakenvml.c). */
#include "fakenvml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- processes ---- */

/* One listed process: [pid, bytes or null]; null is NVML_VALUE_NOT_AVAILABLE. */
static int process(const struct ctx *c, int entry, unsigned *pid, unsigned long long *used) {
    unsigned long long p;
    if (juint(&c->doc, jat(&c->doc, entry, 0), 0xFFFFFFFFULL, &p) != 0)
        return -1;
    *pid = (unsigned)p;
    int bytes = jat(&c->doc, entry, 1);
    if (jtypeof(&c->doc, bytes) == J_NULL) {
        *used = (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
        return 0;
    }
    return juint(&c->doc, bytes, ~0ULL, used);
}

struct sink {
    unsigned n, cap; /* found so far; the caller's room */
    void *infos;
    size_t size; /* of one entry: v1 has no instance ids */
};

static int emit(struct sink *s, unsigned pid, unsigned long long used, unsigned gi, unsigned ci) {
    if (s->n >= 4096)
        return -1;
    if (s->infos && s->n < s->cap) {
        char *at = (char *)s->infos + s->n * s->size;
        if (s->size == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t e = {.pid = pid, .usedGpuMemory = used};
            memcpy(at, &e, sizeof e);
        } else {
            nvmlProcessInfo_v2_t e = {.pid = pid, .usedGpuMemory = used, .gpuInstanceId = gi, .computeInstanceId = ci};
            memcpy(at, &e, sizeof e);
        }
    }
    s->n++;
    return 0;
}

/* The processes of kind listed on node (a GPU or a MIG instance) with the instance's ids. */
static int emit_listed(const struct ctx *c, int node, const char *kind, struct sink *s, unsigned gi, unsigned ci) {
    int list = jget(&c->doc, jget(&c->doc, node, "processes"), kind);
    if (list >= 0 && jtypeof(&c->doc, list) != J_ARRAY)
        return -1;
    for (int e = jfirst(&c->doc, list); e >= 0; e = jnext(&c->doc, e)) {
        unsigned pid;
        unsigned long long used;
        if (process(c, e, &pid, &used) != 0 || emit(s, pid, used, gi, ci) != 0)
            return -1;
    }
    return 0;
}

static int instance_ids(const struct ctx *c, int instance, unsigned *gi, unsigned *ci) {
    unsigned long long g, k;
    if (value(c, instance, "gpu_instance_id", 0xFFFFFFFEULL, &g) != NVML_SUCCESS ||
        value(c, instance, "compute_instance_id", 0xFFFFFFFEULL, &k) != NVML_SUCCESS)
        return -1;
    *gi = (unsigned)g;
    *ci = (unsigned)k;
    return 0;
}

static nvmlReturn_t processes(const char *fn, const char *kind, nvmlDevice_t device, unsigned int *infoCount,
                              void *infos, size_t size) {
    struct ctx c;
    nvmlReturn_t r = begin(&c, fn, device, 1);
    if (r != NVML_SUCCESS)
        return r;
    if (infoCount == NULL) {
        done(&c);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    struct sink s = {0, *infoCount, infos, size};
    unsigned gi = NOT_MIG, ci = NOT_MIG;
    int bad = 0;
    if (c.mig >= 0) { /* a MIG device: its instance's processes */
        bad = instance_ids(&c, c.dev, &gi, &ci) != 0 || emit_listed(&c, c.dev, kind, &s, gi, ci) != 0;
    } else { /* the GPU: its own list, and in MIG mode every instance's with the instance's ids */
        bad = emit_listed(&c, c.gpu, kind, &s, NOT_MIG, NOT_MIG) != 0;
        int mig = jget(&c.doc, c.gpu, "mig");
        unsigned long long current = 0;
        if (!bad && value(&c, mig, "current", 1, &current) == NVML_SUCCESS && current)
            for (int i = jfirst(&c.doc, jget(&c.doc, mig, "instances")); i >= 0 && !bad; i = jnext(&c.doc, i))
                if (jtypeof(&c.doc, i) == J_OBJECT)
                    bad = instance_ids(&c, i, &gi, &ci) != 0 || emit_listed(&c, i, kind, &s, gi, ci) != 0;
    }
    done(&c);
    if (bad)
        return NVML_ERROR_UNKNOWN;
    if (s.n > s.cap || (infos == NULL && s.n > 0)) {
        *infoCount = s.n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = s.n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos) {
    return processes(__func__, "compute", device, infoCount, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    return processes(__func__, "compute", device, infoCount, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    return processes(__func__, "compute", device, infoCount, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos) {
    return processes(__func__, "graphics", device, infoCount, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos) {
    return processes(__func__, "graphics", device, infoCount, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    return processes(__func__, "graphics", device, infoCount, infos, sizeof *infos);
}

/* ---- MIG ---- */

/* The GPU's "mig" object: NOT_SUPPORTED when absent (a GPU without MIG). */
static nvmlReturn_t mig_of(const struct ctx *c, int *mig) {
    *mig = jget(&c->doc, c->gpu, "mig");
    if (*mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return jtypeof(&c->doc, *mig) == J_OBJECT ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    BEGIN(device, 0);
    int mig;
    unsigned long long current = 0, pending = 0;
    nvmlReturn_t r = currentMode && pendingMode ? mig_of(&c, &mig) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS && (value(&c, mig, "current", 1, &current) == NVML_ERROR_UNKNOWN ||
                              value(&c, mig, "pending", 1, &pending) == NVML_ERROR_UNKNOWN))
        r = NVML_ERROR_UNKNOWN;
    if (r == NVML_SUCCESS) {
        *currentMode = (unsigned)current;
        *pendingMode = (unsigned)pending;
    }
    END(r);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count_) {
    BEGIN(device, 0);
    int mig;
    nvmlReturn_t r = count_ ? mig_of(&c, &mig) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        int n = jlen(&c.doc, jget(&c.doc, mig, "instances"));
        if (n > MAX_MIG)
            r = NVML_ERROR_UNKNOWN;
        else
            *count_ = (unsigned)n;
    }
    END(r);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    BEGIN(device, 0);
    int mig;
    nvmlReturn_t r = migDevice ? mig_of(&c, &mig) : NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        END(r);
    int instances = jget(&c.doc, mig, "instances");
    if (jlen(&c.doc, instances) > MAX_MIG)
        END(NVML_ERROR_UNKNOWN);
    if (index >= (unsigned)jlen(&c.doc, instances))
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (jtypeof(&c.doc, jat(&c.doc, instances, (int)index)) != J_OBJECT)
        END(NVML_ERROR_NOT_FOUND);
    *migDevice = &handles[c.index][index + 1];
    END(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    BEGIN(device, 1);
    if (isMigDevice == NULL)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = c.mig >= 0;
    END(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    BEGIN(migDevice, 1);
    if (device == NULL || c.mig < 0)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *device = &handles[c.index][0];
    END(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(const char *fn, nvmlDevice_t device, const char *key, unsigned int *id) {
    struct ctx c;
    nvmlReturn_t r = begin(&c, fn, device, 1);
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long v = 0;
    if (id == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (c.mig < 0)
        r = NVML_ERROR_NOT_SUPPORTED; /* not a MIG device handle, as nvml.h documents */
    else if ((r = value(&c, c.dev, key, 0xFFFFFFFEULL, &v)) == NVML_SUCCESS)
        *id = (unsigned)v;
    done(&c);
    return r;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(__func__, device, "gpu_instance_id", id);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(__func__, device, "compute_instance_id", id);
}
