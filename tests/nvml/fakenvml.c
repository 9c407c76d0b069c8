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
#include "fakenvml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define POLL_NS 10000000L /* a hung call looks at the file again every 10 ms */
#define MAX_SLOW_MS 600000ULL

struct nvmlDevice_st handles[MAX_GPUS][MAX_MIG + 1];
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

void done(struct ctx *c) {
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

nvmlReturn_t code_named(const struct ctx *c, int node) {
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
nvmlReturn_t begin_system(struct ctx *c, const char *fn, int needs_init) {
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
nvmlReturn_t begin(struct ctx *c, const char *fn, nvmlDevice_t dev, int mig_ok) {
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

/* An unsigned value of the handle's node: NOT_SUPPORTED when absent, UNKNOWN when not a fitting number. */
nvmlReturn_t value(const struct ctx *c, int node, const char *key, unsigned long long max,
                          unsigned long long *out) {
    int member = jget(&c->doc, node, key);
    if (member < 0 || jtypeof(&c->doc, member) == J_NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    return juint(&c->doc, member, max, out) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* Element index of the array at key (NOT_SUPPORTED when the array is absent). */
nvmlReturn_t element(const struct ctx *c, int node, const char *key, int index, unsigned long long max,
                            unsigned long long *out) {
    int array = jget(&c->doc, node, key);
    if (array < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (jtypeof(&c->doc, array) != J_ARRAY || juint(&c->doc, jat(&c->doc, array, index), max, out) != 0)
        return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

nvmlReturn_t copy_text(const char *s, char *out, unsigned int length) {
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t copy_string(const struct ctx *c, int node, const char *key, char *out, unsigned int length) {
    int member = jget(&c->doc, node, key);
    if (member < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const char *s = jstr(&c->doc, member);
    return s == NULL ? NVML_ERROR_UNKNOWN : copy_text(s, out, length);
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
