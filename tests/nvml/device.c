/* The NVML stand-in: a GPU's identity, memory, sensors, memory errors, NVLinks and field values (see fakenvml.c). */
#include "fakenvml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

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
