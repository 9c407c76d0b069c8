/* A stand-in libnvidia-ml.so.1 for tpuwatch's tests: NVML's C API answering from a JSON state file.
 *
 * Written for tpuwatch (Apache-2.0); no NVIDIA code.  Compiled against NVIDIA's own nvml.h from the
 * PyPI package nvidia-nvml-dev (13.5.37: NVML_API_VERSION 13; the header is used at build time only,
 * never copied into the project) and loaded by the real nvidia-ml-py (pynvml.py of 13.615.71), which
 * looks every function up by name (_nvmlGetFunctionPointer): the versioned names it asks for are the
 * ones defined here (nvmlInitWithFlags, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
 * nvmlDeviceGetPciInfo_v3, nvmlDeviceGetMemoryInfo_v2, nvmlDevice{Compute,Graphics}RunningProcesses_v3,
 * nvmlDeviceGetGpuFabricInfoV ...), beside the older names C callers of older headers link to.
 *
 * Every call reads the file named by $FAKE_NVML_STATE afresh (a test may rewrite it while a daemon
 * runs); tests/nvml/README.md lists its keys.  NVML's semantics, as nvml.h documents them:
 * NVML_ERROR_UNINITIALIZED before nvmlInit, NVML_ERROR_INVALID_ARGUMENT for a NULL pointer or a bad
 * handle or index, NVML_ERROR_ARGUMENT_VERSION_MISMATCH for a versioned struct of an unknown version,
 * the INSUFFICIENT_SIZE protocol of the list calls (too small a count: *count is set to the number
 * needed), NVML_ERROR_GPU_IS_LOST for a GPU marked lost, NVML_ERROR_NOT_SUPPORTED for what a GPU does
 * not have.  A state file that cannot be read or parsed, is too large or has the wrong shape makes the
 * call answer NVML_ERROR_UNKNOWN: the reader is bounded (json.h) and never trusts a length it read.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* define the old unversioned names beside the _vN ones */
#include <nvml.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#include "json.h"

#define MAX_GPUS 64
#define MAX_MIG 8 /* MIG device slots per GPU (an A100 or H100 has at most 7) */
#define NOT_MIG 0xFFFFFFFFu
#define POLL_NS 10000000L /* a hung call looks at the file again every 10 ms */
#define MAX_SLOW_MS 600000ULL

struct nvmlDevice_st {
    char unused;
};

/* A GPU's handle is &handles[gpu][0]; its MIG device slot s (0-based) is &handles[gpu][s + 1]. */
static struct nvmlDevice_st handles[MAX_GPUS][MAX_MIG + 1];
static int initialized; /* nvmlInit's reference count */

static const struct {
    nvmlReturn_t code;
    const char *name;
    const char *text; /* nvmlErrorString: pynvml.py's NVMLError._errcode_to_string where it has one */
} errors[] = {
    {NVML_SUCCESS, "SUCCESS", "Success"},
    {NVML_ERROR_UNINITIALIZED, "UNINITIALIZED", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "NO_PERMISSION", "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "ALREADY_INITIALIZED", "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "NOT_FOUND", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "TIMEOUT", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "IRQ_ISSUE", "Interrupt Request Issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED", "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_IN_USE, "IN_USE", "In use by another client"},
    {NVML_ERROR_MEMORY, "MEMORY", "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "NO_DATA", "No data"},
    {NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "VGPU_ECC_NOT_SUPPORTED", "vGPU ECC not supported"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "INSUFFICIENT_RESOURCES", "Insufficient resources"},
    {NVML_ERROR_FREQ_NOT_SUPPORTED, "FREQ_NOT_SUPPORTED", "Frequency not supported"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"},
    {NVML_ERROR_DEPRECATED, "DEPRECATED", "Deprecated"},
    {NVML_ERROR_NOT_READY, "NOT_READY", "Not ready"},
    {NVML_ERROR_GPU_NOT_FOUND, "GPU_NOT_FOUND", "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "INVALID_STATE", "Invalid state"},
    {NVML_ERROR_RESET_TYPE_NOT_SUPPORTED, "RESET_TYPE_NOT_SUPPORTED", "Reset type not supported"},
    {NVML_ERROR_UNKNOWN, "UNKNOWN", "Unknown Error"},
};

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

static void done(struct ctx *c) {
    jfree(&c->doc);
    free(c->text);
    c->text = NULL;
}

static nvmlReturn_t load(struct ctx *c) {
    memset(c, 0, sizeof *c);
    c->gpu = c->dev = c->mig = -1;
    const char *path = getenv("FAKE_NVML_STATE");
    FILE *file = path ? fopen(path, "rb") : NULL;
    struct stat st;
    if (file == NULL || fstat(fileno(file), &st) != 0 || st.st_size < 0 || st.st_size > JSON_MAX_BYTES) {
        if (file)
            fclose(file);
        return NVML_ERROR_UNKNOWN;
    }
    size_t room = (size_t)st.st_size + 1; /* one byte more than the file: a file that grew is seen to */
    c->text = malloc(room + 1);
    size_t len = c->text ? fread(c->text, 1, room, file) : 0;
    fclose(file);
    if (c->text == NULL || len == room) {
        done(c);
        return NVML_ERROR_UNKNOWN;
    }
    c->text[len] = '\0';
    if (jparse(&c->doc, c->text, len) != 0 || jtypeof(&c->doc, 0) != J_OBJECT ||
        jtypeof(&c->doc, jget(&c->doc, 0, "gpus")) != J_ARRAY || jlen(&c->doc, jget(&c->doc, 0, "gpus")) > MAX_GPUS) {
        done(c);
        return NVML_ERROR_UNKNOWN;
    }
    c->root = 0;
    for (int gpu = jfirst(&c->doc, jget(&c->doc, 0, "gpus")); gpu >= 0; gpu = jnext(&c->doc, gpu))
        if (jtypeof(&c->doc, gpu) != J_OBJECT) {
            done(c);
            return NVML_ERROR_UNKNOWN;
        }
    return NVML_SUCCESS;
}

/* Whether key names function fn: exactly, or fn less its version suffix ("_v3", or the "V" of ...InfoV). */
static int names(const char *key, const char *fn) {
    size_t k = strlen(key), f = strlen(fn);
    if (k > f || strncmp(key, fn, k) != 0)
        return 0;
    const char *rest = fn + k;
    if (*rest == '\0' || strcmp(rest, "V") == 0)
        return 1;
    if (rest[0] != '_' || rest[1] != 'v' || rest[2] == '\0')
        return 0;
    for (rest += 2; *rest; rest++)
        if (*rest < '0' || *rest > '9')
            return 0;
    return 1;
}

/* The member of object node that names fn (see names()), or -1. */
static int keyed(const struct ctx *c, int node, const char *fn) {
    int exact = jget(&c->doc, node, fn);
    if (exact >= 0)
        return exact;
    if (jtypeof(&c->doc, node) != J_OBJECT)
        return -1;
    for (int m = jfirst(&c->doc, node); m >= 0; m = jnext(&c->doc, m))
        if (names(c->doc.nodes[m].key, fn))
            return m;
    return -1;
}

/* Whether node (a string or an array of strings) names fn. */
static int listed(const struct ctx *c, int node, const char *fn, int exact) {
    const char *s = jstr(&c->doc, node);
    if (s)
        return exact ? strcmp(s, fn) == 0 : names(s, fn);
    for (int e = jfirst(&c->doc, node); e >= 0 && jtypeof(&c->doc, node) == J_ARRAY; e = jnext(&c->doc, e))
        if (listed(c, e, fn, exact))
            return 1;
    return 0;
}

static nvmlReturn_t code_named(const struct ctx *c, int node) {
    unsigned long long n;
    if (juint(&c->doc, node, 0xFFFFFFFFULL, &n) == 0)
        return (nvmlReturn_t)n;
    const char *s = jstr(&c->doc, node);
    if (s && strncmp(s, "NVML_ERROR_", 11) == 0)
        s += 11;
    for (size_t i = 0; s && i < sizeof errors / sizeof errors[0]; i++)
        if (strcmp(errors[i].name, s) == 0)
            return errors[i].code;
    return NVML_ERROR_UNKNOWN;
}

static void sleep_ms(unsigned long long ms) {
    struct timespec t = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

/* "slow", "errors" and "unsupported" of node (a GPU, or the top level for system calls) for fn. */
static nvmlReturn_t faults(const struct ctx *c, int node, const char *fn) {
    unsigned long long ms;
    if (juint(&c->doc, keyed(c, jget(&c->doc, node, "slow"), fn), MAX_SLOW_MS, &ms) == 0)
        sleep_ms(ms);
    int error = keyed(c, jget(&c->doc, node, "errors"), fn);
    if (error >= 0)
        return code_named(c, error);
    if (listed(c, jget(&c->doc, node, "unsupported"), fn, 0))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Loads the state for system call fn, waiting while the top level's "hang" names it.  On failure c is freed. */
static nvmlReturn_t begin_system(struct ctx *c, const char *fn, int needs_init) {
    for (;;) {
        nvmlReturn_t r = load(c);
        if (r != NVML_SUCCESS)
            return r;
        if (listed(c, jget(&c->doc, c->root, "missing_symbols"), fn, 1))
            r = NVML_ERROR_FUNCTION_NOT_FOUND;
        else if (needs_init && __atomic_load_n(&initialized, __ATOMIC_SEQ_CST) <= 0)
            r = NVML_ERROR_UNINITIALIZED;
        else if (listed(c, jget(&c->doc, c->root, "hang"), fn, 0)) {
            done(c);
            sleep_ms(POLL_NS / 1000000L);
            continue;
        } else
            r = faults(c, c->root, fn);
        if (r != NVML_SUCCESS)
            done(c);
        return r;
    }
}

/* Loads the state for device call fn on handle dev.  mig_ok: the call takes a MIG device handle. */
static nvmlReturn_t begin(struct ctx *c, const char *fn, nvmlDevice_t dev, int mig_ok) {
    for (;;) {
        nvmlReturn_t r = begin_system(c, fn, 1);
        if (r != NVML_SUCCESS)
            return r;
        ptrdiff_t slot = dev - &handles[0][0];
        int gpus = jget(&c->doc, c->root, "gpus");
        if (dev == NULL || slot < 0 || slot >= MAX_GPUS * (MAX_MIG + 1) ||
            (c->index = (unsigned)(slot / (MAX_MIG + 1))) >= (unsigned)jlen(&c->doc, gpus)) {
            done(c);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        c->gpu = c->dev = jat(&c->doc, gpus, (int)c->index);
        c->mig = (int)(slot % (MAX_MIG + 1)) - 1; /* load() made sure every GPU is an object */
        if (c->mig >= 0) {
            c->dev = jat(&c->doc, jget(&c->doc, jget(&c->doc, c->gpu, "mig"), "instances"), c->mig);
            if (jtypeof(&c->doc, c->dev) != J_OBJECT) { /* the instance was destroyed */
                done(c);
                return NVML_ERROR_INVALID_ARGUMENT;
            }
        }
        if (jtrue(&c->doc, jget(&c->doc, c->gpu, "lost")))
            r = NVML_ERROR_GPU_IS_LOST;
        else if (listed(c, jget(&c->doc, c->gpu, "hang"), fn, 0)) {
            done(c);
            sleep_ms(POLL_NS / 1000000L);
            continue;
        } else if (c->mig >= 0 && !mig_ok)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            r = faults(c, c->gpu, fn);
        if (r != NVML_SUCCESS)
            done(c);
        return r;
    }
}

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

/* An unsigned value of the handle's node: NOT_SUPPORTED when absent, UNKNOWN when not a fitting number. */
static nvmlReturn_t value(const struct ctx *c, int node, const char *key, unsigned long long max,
                          unsigned long long *out) {
    int member = jget(&c->doc, node, key);
    if (member < 0 || jtypeof(&c->doc, member) == J_NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    return juint(&c->doc, member, max, out) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* Element index of the array at key (NOT_SUPPORTED when the array is absent). */
static nvmlReturn_t element(const struct ctx *c, int node, const char *key, int index, unsigned long long max,
                            unsigned long long *out) {
    int array = jget(&c->doc, node, key);
    if (array < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (jtypeof(&c->doc, array) != J_ARRAY || juint(&c->doc, jat(&c->doc, array, index), max, out) != 0)
        return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const struct ctx *c, int node, const char *key, char *out, unsigned int length) {
    int member = jget(&c->doc, node, key);
    if (member < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const char *s = jstr(&c->doc, member);
    if (s == NULL)
        return NVML_ERROR_UNKNOWN;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *s, char *out, unsigned int length) {
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ---- system ---- */

static nvmlReturn_t init(const char *fn) {
    struct ctx c;
    nvmlReturn_t r = begin_system(&c, fn, 0);
    if (r != NVML_SUCCESS)
        return r;
    done(&c);
    __atomic_add_fetch(&initialized, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return init(__func__); }
nvmlReturn_t nvmlInit_v2(void) { return init(__func__); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init(__func__);
}

nvmlReturn_t nvmlShutdown(void) {
    int now = __atomic_load_n(&initialized, __ATOMIC_SEQ_CST);
    while (now > 0 && !__atomic_compare_exchange_n(&initialized, &now, now - 1, 0, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return now > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == result)
            return errors[i].text;
    return "Unknown Error";
}

static nvmlReturn_t system_string(const char *fn, const char *key, const char *fallback, char *out,
                                  unsigned int length) {
    struct ctx c;
    nvmlReturn_t r = begin_system(&c, fn, 1);
    if (r != NVML_SUCCESS)
        return r;
    const char *s = jget(&c.doc, c.root, key) >= 0 ? jstr(&c.doc, jget(&c.doc, c.root, key)) : fallback;
    r = s ? copy_text(s, out, length) : NVML_ERROR_UNKNOWN;
    done(&c);
    return r;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return system_string(__func__, "driver_version", "580.95.05", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return system_string(__func__, "nvml_version", "13.580.95.05", version, length);
}

static nvmlReturn_t count(const char *fn, unsigned int *deviceCount) {
    struct ctx c;
    nvmlReturn_t r = begin_system(&c, fn, 1);
    if (r != NVML_SUCCESS)
        return r;
    if (deviceCount == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        *deviceCount = (unsigned)jlen(&c.doc, jget(&c.doc, c.root, "gpus"));
    done(&c);
    return r;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return count(__func__, deviceCount); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return count(__func__, deviceCount); }

static nvmlReturn_t handle_by_index(const char *fn, unsigned int index, nvmlDevice_t *device) {
    struct ctx c;
    nvmlReturn_t r = begin_system(&c, fn, 1);
    if (r != NVML_SUCCESS)
        return r;
    unsigned gpus = (unsigned)jlen(&c.doc, jget(&c.doc, c.root, "gpus"));
    done(&c);
    if (device == NULL || index >= gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The GPU's own faults (lost, hang, errors) apply to getting its handle, as on a GPU off the bus. */
    r = begin(&c, fn, &handles[index][0], 0);
    if (r != NVML_SUCCESS)
        return r;
    *device = &handles[index][0];
    done(&c);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(__func__, index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(__func__, index, device);
}

/* ---- identity ---- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    BEGIN(device, 1);
    END(copy_string(&c, c.dev, "name", name, length));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    BEGIN(device, 1);
    END(copy_string(&c, c.dev, "uuid", uuid, length));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    BEGIN(device, 0);
    unsigned long long v = 0;
    nvmlReturn_t r = minorNumber ? value(&c, c.dev, "minor", 0xFFFFFFFFULL, &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *minorNumber = (unsigned)v;
    END(r);
}

static nvmlReturn_t pci_info(struct ctx *c, nvmlPciInfo_t *pci) {
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    nvmlReturn_t r = copy_string(c, c->gpu, "bus_id", bus_id, sizeof bus_id);
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_INSUFFICIENT_SIZE ? NVML_ERROR_UNKNOWN : r;
    unsigned domain, bus, slot, function;
    if (sscanf(bus_id, "%8x:%2x:%2x.%1x", &domain, &bus, &slot, &function) != 4)
        return NVML_ERROR_UNKNOWN;
    unsigned long long device_id = 0, subsystem = 0;
    value(c, c->gpu, "pci_device_id", 0xFFFFFFFFULL, &device_id); /* optional: 0 when absent */
    value(c, c->gpu, "pci_subsystem_id", 0xFFFFFFFFULL, &subsystem);
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busId, bus_id, sizeof bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xFFFF, bus, slot, function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = (unsigned)device_id;
    pci->pciSubSystemId = (unsigned)subsystem;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    BEGIN(device, 0);
    END(pci_info(&c, pci));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    BEGIN(device, 0);
    END(pci_info(&c, pci));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    BEGIN(device, 0);
    END(pci_info(&c, pci));
}

/* ---- memory and sensors ---- */

static nvmlReturn_t memory(const struct ctx *c, unsigned long long *total, unsigned long long *used,
                           unsigned long long *reserved) {
    nvmlReturn_t r = value(c, c->dev, "memory_total", ~0ULL, total);
    if (r == NVML_SUCCESS)
        r = value(c, c->dev, "memory_used", *total, used);
    *reserved = 0;
    if (r == NVML_SUCCESS && value(c, c->dev, "memory_reserved", *total - *used, reserved) == NVML_ERROR_UNKNOWN)
        r = NVML_ERROR_UNKNOWN;
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *out) {
    BEGIN(device, 1);
    unsigned long long total, used, reserved;
    nvmlReturn_t r = out ? memory(&c, &total, &used, &reserved) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        out->total = total;
        out->used = used;
        out->free = total - used;
    }
    END(r);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *out) {
    BEGIN(device, 1);
    if (out == NULL)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (out->version != nvmlMemory_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, used, reserved;
    nvmlReturn_t r = memory(&c, &total, &used, &reserved);
    if (r == NVML_SUCCESS) {
        out->total = total;
        out->reserved = reserved;
        out->used = used;
        out->free = total - used - reserved;
    }
    END(r);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    BEGIN(device, 0);
    unsigned long long gpu = 0, mem = 0;
    nvmlReturn_t r = utilization ? value(&c, c.dev, "utilization_gpu", 100, &gpu) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS && value(&c, c.dev, "utilization_memory", 100, &mem) == NVML_ERROR_UNKNOWN)
        r = NVML_ERROR_UNKNOWN;
    if (r == NVML_SUCCESS) {
        utilization->gpu = (unsigned)gpu;
        utilization->memory = (unsigned)mem;
    }
    END(r);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    BEGIN(device, 0);
    unsigned long long v = 0;
    nvmlReturn_t r = NVML_ERROR_INVALID_ARGUMENT;
    if (temp && sensorType == NVML_TEMPERATURE_GPU && (r = value(&c, c.dev, "temperature", 0xFFFF, &v)) == 0)
        *temp = (unsigned)v;
    END(r);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    BEGIN(device, 0);
    unsigned long long v = 0;
    nvmlReturn_t r = power ? value(&c, c.dev, "power_mw", 0xFFFFFFFFULL, &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *power = (unsigned)v;
    END(r);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *counter) {
    BEGIN(device, 0);
    unsigned long long v = 0;
    nvmlReturn_t r = counter ? value(&c, c.dev, "pcie_replays", 0xFFFFFFFFULL, &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *counter = (unsigned)v;
    END(r);
}

/* throttle: [supported, current] for both the clocks "event" reasons and the deprecated "throttle" ones. */
static nvmlReturn_t reasons(const char *fn, nvmlDevice_t device, int which, unsigned long long *out) {
    struct ctx c;
    nvmlReturn_t r = begin(&c, fn, device, 0);
    if (r != NVML_SUCCESS)
        return r;
    r = out ? element(&c, c.dev, "throttle", which, ~0ULL, out) : NVML_ERROR_INVALID_ARGUMENT;
    done(&c);
    return r;
}

nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons_) {
    return reasons(__func__, device, 0, reasons_);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons_) {
    return reasons(__func__, device, 1, reasons_);
}

nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons_) {
    return reasons(__func__, device, 0, reasons_);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons_) {
    return reasons(__func__, device, 1, reasons_);
}

/* ---- memory errors ---- */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    BEGIN(device, 0);
    if (eccCounts == NULL || (unsigned)errorType > NVML_MEMORY_ERROR_TYPE_UNCORRECTED ||
        (unsigned)counterType > NVML_AGGREGATE_ECC)
        END(NVML_ERROR_INVALID_ARGUMENT);
    int ecc = jget(&c.doc, c.dev, "ecc");
    if (ecc < 0)
        END(NVML_ERROR_NOT_SUPPORTED);
    const char *kind = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "corrected" : "uncorrected";
    END(element(&c, ecc, kind, (int)counterType, ~0ULL, eccCounts) == NVML_SUCCESS ? NVML_SUCCESS
                                                                                    : NVML_ERROR_UNKNOWN);
}

static nvmlReturn_t retired(const char *fn, nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                            unsigned int *pageCount, unsigned long long *addresses, unsigned long long *times) {
    struct ctx c;
    nvmlReturn_t r = begin(&c, fn, device, 0);
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long pages = 0;
    if (pageCount == NULL || (unsigned)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else
        r = value(&c, jget(&c.doc, c.dev, "retired_pages"),
                  cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS ? "single_bit" : "double_bit",
                  65536, &pages);
    if (r == NVML_SUCCESS && (*pageCount < pages || addresses == NULL)) {
        r = pages == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
        *pageCount = (unsigned)pages;
    } else if (r == NVML_SUCCESS) {
        for (unsigned long long i = 0; i < pages; i++) {
            addresses[i] = 0x1000 * (i + 1);
            if (times)
                times[i] = 1700000000ULL + i;
        }
        *pageCount = (unsigned)pages;
    }
    done(&c);
    return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                       unsigned long long *addresses) {
    return retired(__func__, device, cause, pageCount, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    return retired(__func__, device, cause, pageCount, addresses, timestamps);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    BEGIN(device, 0);
    unsigned long long v = 0;
    nvmlReturn_t r = isPending ? value(&c, c.dev, "retired_pending", 1, &v) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *isPending = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    END(r);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    BEGIN(device, 0);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long v[4];
    for (int i = 0; i < 4; i++) {
        nvmlReturn_t r = element(&c, c.dev, "remapped_rows", i, 0xFFFFFFFFULL, &v[i]);
        if (r != NVML_SUCCESS)
            END(r);
    }
    *corrRows = (unsigned)v[0];
    *uncRows = (unsigned)v[1];
    *isPending = v[2] != 0;
    *failureOccurred = v[3] != 0;
    END(NVML_SUCCESS);
}

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

/* ---- NVLink ---- */

static const char *const nvlink_counters[] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};

/* The state-file node of link on the handle's GPU: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT for a link it
 * lacks (links 0 .. len(nvlinks) - 1 exist). */
static nvmlReturn_t link_of(const struct ctx *c, unsigned int link, int *state) {
    int links = jget(&c->doc, c->dev, "nvlinks");
    if (links < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (jtypeof(&c->doc, links) != J_ARRAY)
        return NVML_ERROR_UNKNOWN;
    if (link >= NVML_NVLINK_MAX_LINKS || link >= (unsigned)jlen(&c->doc, links))
        return NVML_ERROR_INVALID_ARGUMENT;
    *state = jat(&c->doc, links, (int)link);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    BEGIN(device, 0);
    int state;
    nvmlReturn_t r = isActive ? link_of(&c, link, &state) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *isActive = jtrue(&c.doc, state) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    END(r);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue) {
    BEGIN(device, 0);
    int state;
    if (counterValue == NULL || (unsigned)counter >= sizeof nvlink_counters / sizeof nvlink_counters[0])
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t r = link_of(&c, link, &state);
    if (r != NVML_SUCCESS)
        END(r);
    char name[16];
    snprintf(name, sizeof name, "%u", link);
    unsigned long long v = 0;
    r = value(&c, jget(&c.doc, jget(&c.doc, c.dev, "nvlink_errors"), name), nvlink_counters[counter], ~0ULL, &v);
    if (r == NVML_ERROR_UNKNOWN)
        END(r);
    *counterValue = v; /* a counter the file does not name has counted nothing */
    END(NVML_SUCCESS);
}

/* ---- field values ---- */

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    BEGIN(device, 0);
    if (values == NULL || valuesCount < 0)
        END(NVML_ERROR_INVALID_ARGUMENT);
    struct timeval now;
    gettimeofday(&now, NULL);
    int fields = jget(&c.doc, c.dev, "fields");
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        char name[16];
        snprintf(name, sizeof name, "%u", v->fieldId);
        int field = jget(&c.doc, fields, name);
        v->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_usec;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        if (field < 0) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (jtypeof(&c.doc, field) == J_STRING) {
            v->nvmlReturn = code_named(&c, field);
        } else if (jtypeof(&c.doc, field) != J_NUMBER) {
            v->nvmlReturn = NVML_ERROR_UNKNOWN;
        } else {
            const struct jnode *n = &c.doc.nodes[field];
            v->nvmlReturn = NVML_SUCCESS;
            if (n->integral && n->integral != 2 && n->integer >= 0 && n->integer <= 0xFFFFFFFFLL) {
                v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                v->value.uiVal = (unsigned)n->integer;
            } else if (n->integral == 2 || (n->integral && n->integer >= 0)) {
                v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                v->value.ullVal = (unsigned long long)n->integer;
            } else if (n->integral) {
                v->valueType = NVML_VALUE_TYPE_SIGNED_LONG_LONG;
                v->value.sllVal = n->integer;
            } else {
                v->valueType = NVML_VALUE_TYPE_DOUBLE;
                v->value.dVal = n->number;
            }
        }
    }
    END(NVML_SUCCESS);
}

/* ---- fabric ---- */

struct fabric {
    unsigned char uuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned long long clique, state, mask, summary;
};

static nvmlReturn_t fabric_of(const struct ctx *c, struct fabric *f) {
    int node = jget(&c->doc, c->dev, "fabric");
    if (node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (jtypeof(&c->doc, node) != J_OBJECT)
        return NVML_ERROR_UNKNOWN;
    memset(f, 0, sizeof *f);
    const char *hex = jstr(&c->doc, jget(&c->doc, node, "cluster_uuid"));
    for (int i = 0; hex && i < NVML_GPU_FABRIC_UUID_LEN && hex[2 * i] && hex[2 * i + 1]; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            return NVML_ERROR_UNKNOWN;
        f->uuid[i] = (unsigned char)byte;
    }
    int status = jget(&c->doc, node, "status");
    f->status = status < 0 ? NVML_SUCCESS : code_named(c, status);
    if (value(c, node, "clique_id", 0xFFFFFFFFULL, &f->clique) == NVML_ERROR_UNKNOWN ||
        value(c, node, "state", 0xFF, &f->state) == NVML_ERROR_UNKNOWN ||
        value(c, node, "health_mask", 0xFFFFFFFFULL, &f->mask) == NVML_ERROR_UNKNOWN ||
        value(c, node, "health_summary", 0xFF, &f->summary) == NVML_ERROR_UNKNOWN)
        return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    BEGIN(device, 0);
    struct fabric f;
    nvmlReturn_t r = gpuFabricInfo ? fabric_of(&c, &f) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof f.uuid);
        gpuFabricInfo->status = f.status;
        gpuFabricInfo->cliqueId = (unsigned)f.clique;
        gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
    }
    END(r);
}

/* Takes nvmlGpuFabricInfo_v2_t or _v3_t (nvmlGpuFabricInfoV_t), told apart by their version field. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    BEGIN(device, 0);
    if (gpuFabricInfo == NULL)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    struct fabric f;
    nvmlReturn_t r = fabric_of(&c, &f);
    if (r != NVML_SUCCESS)
        END(r);
    if (version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)gpuFabricInfo;
        memcpy(v2->clusterUuid, f.uuid, sizeof f.uuid);
        v2->status = f.status;
        v2->cliqueId = (unsigned)f.clique;
        v2->state = (nvmlGpuFabricState_t)f.state;
        v2->healthMask = (unsigned)f.mask;
    } else {
        memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof f.uuid);
        gpuFabricInfo->status = f.status;
        gpuFabricInfo->cliqueId = (unsigned)f.clique;
        gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
        gpuFabricInfo->healthMask = (unsigned)f.mask;
        gpuFabricInfo->healthSummary = (unsigned char)f.summary;
    }
    END(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo_v4(nvmlDevice_t device, nvmlGpuFabricInfo_v4_t *gpuFabricInfo) {
    BEGIN(device, 0);
    struct fabric f;
    nvmlReturn_t r = gpuFabricInfo ? fabric_of(&c, &f) : NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        memset(gpuFabricInfo, 0, sizeof *gpuFabricInfo);
        memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof f.uuid);
        gpuFabricInfo->status = f.status;
        gpuFabricInfo->cliques[0].type = NVML_GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER; /* v3's cliqueId, per nvml.h */
        gpuFabricInfo->cliques[0].id = (unsigned)f.clique;
        gpuFabricInfo->numCliques = 1;
        gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
        gpuFabricInfo->healthMask = (unsigned)f.mask;
        gpuFabricInfo->healthSummary = (unsigned char)f.summary;
    }
    END(r);
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
