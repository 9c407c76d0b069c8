/* The NVML stand-in: GPU fabric registration (NVSwitch systems) (see fakenvml.c). */
#include "fakenvml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    unsigned version = *(const unsigned *)gpuFabricInfo; /* the first member of every versioned struct */
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    /* "max_version": 2 - a driver that predates the v3 struct (it answers a version mismatch for v3). */
    unsigned long long newest = 3;
    if (value(&c, jget(&c.doc, c.dev, "fabric"), "max_version", 0xFF, &newest) == NVML_ERROR_UNKNOWN)
        END(NVML_ERROR_UNKNOWN);
    if ((version >> 24) > newest)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    struct fabric f;
    nvmlReturn_t r = fabric_of(&c, &f);
    if (r != NVML_SUCCESS)
        END(r);
    /* nvml.h: v3 is v2 with healthSummary appended, so v2's fields are written through the v2 layout. */
    nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)gpuFabricInfo;
    memcpy(v2->clusterUuid, f.uuid, sizeof f.uuid);
    v2->status = f.status;
    v2->cliqueId = (unsigned)f.clique;
    v2->state = (nvmlGpuFabricState_t)f.state;
    v2->healthMask = (unsigned)f.mask;
    if (version != nvmlGpuFabricInfo_v2)
        ((nvmlGpuFabricInfo_v3_t *)gpuFabricInfo)->healthSummary = (unsigned char)f.summary;
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
