/*
 * The gdr component: GPUDirect RDMA, i.e. verbs moving CUDA device memory. It needs both a
 * CUDA GPU and an RDMA device. The CUDA driver (libcuda.so.1) is loaded at run time with
 * dlopen so that this component, and every machine without a GPU, still loads and reports
 * exactly what is missing. It has no data path yet, so it claims no capability: selection
 * never picks it, and xfer_info shows the GPUs and RDMA ports it found.
 */
#include "config.h"

#include "../verbs/verbs_devices.h"

#include <cuda.h>
#include <dlfcn.h>
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct xfer_gdr_config {
    char *cuda_lib;     /* the driver library to dlopen */
    char *device;       /* RDMA device filter, as for verbs */
} xfer_gdr_config_t;

static const xfer_param_desc_t gdr_params[] = {
    {"CUDA_LIB", XFER_PARAM_STRING, "libcuda.so.1",
     "CUDA driver library loaded at run time.",
     offsetof(xfer_gdr_config_t, cuda_lib), 0, 0, NULL},
    {"DEVICE", XFER_PARAM_STRING, "",
     "RDMA device and port for GPU memory, as 'dev' or 'dev:port'; empty means any active port.",
     offsetof(xfer_gdr_config_t, device), 0, 0, NULL},
    {NULL}
};

/* The few driver entry points query() needs, resolved with dlsym. */
typedef struct cuda_driver {
    void     *handle;
    CUresult (*init)(unsigned int);
    CUresult (*driver_version)(int*);
    CUresult (*device_count)(int*);
    CUresult (*device_get)(CUdevice*, int);
    CUresult (*device_name)(char*, int, CUdevice);
    CUresult (*device_pci_bus_id)(char*, int, CUdevice);
    CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice);
    CUresult (*error_name)(CUresult, const char**);
} cuda_driver_t;

static int cuda_driver_load(const char *lib, cuda_driver_t *drv, char *why, size_t size)
{
    const char *err;

    memset(drv, 0, sizeof(*drv));
    dlerror();
    drv->handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (drv->handle == NULL) {
        err = dlerror();
        if ((err != NULL) && (strstr(err, "No such file") != NULL)) {
            xfer_reason_set(why, size, "%s not found (no NVIDIA driver on this host)", lib);
        } else {
            xfer_reason_set(why, size, "cannot load %s: %s", lib, err ? err : "unknown error");
        }
        return 0;
    }
#define RESOLVE(_field, _sym) \
    if ((*(void**)&drv->_field = dlsym(drv->handle, _sym)) == NULL) { \
        xfer_reason_set(why, size, "%s lacks %s (driver too old?)", lib, _sym); \
        dlclose(drv->handle); \
        drv->handle = NULL; \
        return 0; \
    }
    RESOLVE(init, "cuInit");
    RESOLVE(driver_version, "cuDriverGetVersion");
    RESOLVE(device_count, "cuDeviceGetCount");
    RESOLVE(device_get, "cuDeviceGet");
    RESOLVE(device_name, "cuDeviceGetName");
    RESOLVE(device_pci_bus_id, "cuDeviceGetPCIBusId");
    RESOLVE(device_attribute, "cuDeviceGetAttribute");
    RESOLVE(error_name, "cuGetErrorName");
#undef RESOLVE
    return 1;
}

static const char *cu_error(const cuda_driver_t *drv, CUresult res)
{
    const char *name = NULL;

    if ((drv->error_name == NULL) || (drv->error_name(res, &name) != CUDA_SUCCESS) ||
        (name == NULL)) {
        return "unknown CUDA error";
    }
    return name;
}

static int pci_numa_node(const char *bus_id)
{
    char path[128], lower[32];
    int node = -1;
    FILE *f;

    for (size_t i = 0; i + 1 < sizeof(lower); i++) {
        lower[i] = (char)tolower((unsigned char)bus_id[i]);
        if (bus_id[i] == '\0') {
            break;
        }
    }
    lower[sizeof(lower) - 1] = '\0';
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", lower);
    f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &node) != 1) {
            node = -1;
        }
        fclose(f);
    }
    return node;
}

/* Describe the GPUs; returns how many there are, or -1 with why set. */
static int describe_gpus(const xfer_gdr_config_t *cfg, xfer_component_attr_t *attr, char *why,
                         size_t size)
{
    cuda_driver_t drv;
    int count = 0, version = 0;
    CUresult res;

    if (!cuda_driver_load(cfg->cuda_lib, &drv, why, size)) {
        return -1;
    }
    res = drv.init(0);
    if (res != CUDA_SUCCESS) {
        xfer_reason_set(why, size, "cuInit failed: %s", cu_error(&drv, res));
        count = -1;
        goto out;
    }
    drv.driver_version(&version);
    res = drv.device_count(&count);
    if ((res != CUDA_SUCCESS) || (count == 0)) {
        xfer_reason_set(why, size, "no CUDA devices found (%s)",
                        (res == CUDA_SUCCESS) ? "count is 0" : cu_error(&drv, res));
        count = (res == CUDA_SUCCESS) ? 0 : -1;
        goto out;
    }
    for (int i = 0; (i < count) && (attr->num_devices < XFER_DEVICE_MAX); i++) {
        xfer_device_attr_t *dev = &attr->devices[attr->num_devices];
        char name[96] = "", bus[32] = "";
        int dmabuf = 0;
        CUdevice cudev;

        if (drv.device_get(&cudev, i) != CUDA_SUCCESS) {
            continue;
        }
        attr->num_devices++;
        memset(dev, 0, sizeof(*dev));
        drv.device_name(name, sizeof(name), cudev);
        drv.device_pci_bus_id(bus, sizeof(bus), cudev);
        drv.device_attribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, cudev);
        snprintf(dev->name, sizeof(dev->name), "cuda%d", i);
        snprintf(dev->kind, sizeof(dev->kind), "gpu");
        dev->numa_node = pci_numa_node(bus);
        xfer_device_attr_add(dev, "model", "%s", name);
        xfer_device_attr_add(dev, "pci", "%s", bus);
        xfer_device_attr_add(dev, "driver", "%d.%d", version / 1000, (version % 1000) / 10);
        xfer_device_attr_add(dev, "dmabuf", "%s", dmabuf ? "yes" : "no");
        xfer_device_attr_add(dev, "nvidia_peermem", "%s",
                             (access("/sys/module/nvidia_peermem", F_OK) == 0) ? "loaded" :
                             "not loaded");
    }
out:
    dlclose(drv.handle);
    return count;
}

static xfer_status_t gdr_query(const void *config, xfer_component_attr_t *attr)
{
    const xfer_gdr_config_t *cfg = config;
    char gpu_why[XFER_REASON_MAX / 2] = "", rdma_why[XFER_REASON_MAX / 2] = "";
    unsigned found, active;
    double best_mbs;
    int gpus;

    gpus = describe_gpus(cfg, attr, gpu_why, sizeof(gpu_why));
    xfer_verbs_describe_ports(cfg->device, attr, &found, &active, &best_mbs);
    if (found == 0) {
        snprintf(rdma_why, sizeof(rdma_why), "no RDMA devices found");
    } else if (active == 0) {
        snprintf(rdma_why, sizeof(rdma_why), "no matching RDMA port is ACTIVE");
    }

    if ((gpus > 0) && (rdma_why[0] == '\0')) {
        attr->available     = 1;
        attr->caps          = 0; /* no data path: nothing to select it for */
        attr->latency_us    = 5.0;
        attr->bandwidth_mbs = best_mbs;
        return XFER_OK;
    }
    xfer_reason_set(attr->reason, sizeof(attr->reason), "%s%s%s", gpu_why,
                    (gpu_why[0] && rdma_why[0]) ? "; " : "", rdma_why);
    return XFER_OK;
}

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    .abi_version = XFER_COMPONENT_ABI_V1,
    .size        = sizeof(xfer_component_v1_t),
    .name        = "gdr",
    .version     = PACKAGE_VERSION,
    .description = "GPUDirect RDMA: verbs on CUDA device memory (driver loaded at run time)",
    .params      = gdr_params,
    .config_size = sizeof(xfer_gdr_config_t),
    .query       = gdr_query,
};
