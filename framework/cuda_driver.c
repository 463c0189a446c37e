/*
 * The CUDA driver, loaded with dlopen in one place for libxfer and its components: nothing
 * links against CUDA, so a host without a GPU (or without the driver) runs every other
 * transport. Loading resolves every entry point the project uses and keeps the reason when
 * it fails; cuInit is a separate step, taken only by code about to use device memory, so that
 * a process which never touches device memory never initialises CUDA (an initialised driver
 * makes fork() unsafe and costs start-up time).
 */
#include "xfer_int.h"
#include "cuda_driver.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define CUDA_SUBSYS "cuda"

/* Driver constants used here (cuda.h is not needed to build libxfer). */
#define CU_SUCCESS                        0
#define CU_POINTER_ATTRIBUTE_SYNC_MEMOPS  6

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static char            cuda_lib[PATH_MAX] = "libcuda.so.1";
static int             load_done;          /* the load was tried */
static int             init_done;          /* cuInit was tried */
static void            *cuda_handle;
static xfer_cuda_driver_t cuda_drv;         /* valid when cuda_handle != NULL */
static char            load_why[XFER_REASON_MAX];
static char            init_why[XFER_REASON_MAX];
/* xfer_cuda_in_process(): its answer, for the loader's load/unload counts it was found at */
static unsigned long long seen_adds = ~0ull, seen_subs = ~0ull;
static int             seen_found;

void xfer_cuda_lib_set(const char *lib)
{
    if ((lib == NULL) || (lib[0] == '\0')) {
        return;
    }
    pthread_mutex_lock(&cuda_lock);
    if (!load_done) {
        snprintf(cuda_lib, sizeof(cuda_lib), "%s", lib);
        seen_adds = seen_subs = ~0ull;  /* another file name: look again */
    } else if (strcmp(lib, cuda_lib) != 0) {
        xfer_log(XFER_LOG_DEBUG, CUDA_SUBSYS, "XFER_CUDA_LIB=%s ignored: the driver was "
                 "already looked for as %s in this process", lib, cuda_lib);
    }
    pthread_mutex_unlock(&cuda_lock);
}

/* What dl_iterate_phdr() found: the loader's load/unload counts, and whether an object of the
 * driver library's file name is loaded. */
typedef struct lib_scan {
    const char         *base;       /* NULL: read the counts only */
    unsigned long long adds, subs;
    int                counted;
    int                found;
} lib_scan_t;

static int lib_scan_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    lib_scan_t *scan = arg;
    const char *name, *slash;

    if (!scan->counted) {
        scan->counted = size >= offsetof(struct dl_phdr_info, dlpi_subs) +
                                sizeof(info->dlpi_subs);
        if (scan->counted) {
            scan->adds = info->dlpi_adds;
            scan->subs = info->dlpi_subs;
        }
    }
    if (scan->base == NULL) {
        return 1;
    }
    name  = (info->dlpi_name != NULL) ? info->dlpi_name : "";
    slash = strrchr(name, '/');
    if (strcmp(slash ? slash + 1 : name, scan->base) == 0) {
        scan->found = 1;
        return 1;
    }
    return 0;
}

/*
 * Whether the driver library is mapped, asked on data paths for buffers that come without a
 * registration: dlopen(RTLD_NOLOAD) of a bare name searches the library path on every call
 * (tens of microseconds), so the loaded objects are scanned instead, and only again after
 * the loader's load or unload count changed.
 */
int xfer_cuda_in_process(void)
{
    lib_scan_t scan = {NULL, 0, 0, 0, 0};
    const char *slash;
    int found;

    pthread_mutex_lock(&cuda_lock);
    dl_iterate_phdr(lib_scan_cb, &scan);
    if (scan.counted && (scan.adds == seen_adds) && (scan.subs == seen_subs)) {
        found = seen_found;
    } else {
        slash     = strrchr(cuda_lib, '/');
        scan.base = slash ? slash + 1 : cuda_lib;
        scan.counted = 0;
        dl_iterate_phdr(lib_scan_cb, &scan);
        found = scan.found;
        if (scan.counted) {
            seen_adds  = scan.adds;
            seen_subs  = scan.subs;
            seen_found = found;
        }
    }
    pthread_mutex_unlock(&cuda_lock);
    return found;
}

/* Entry points and the symbol each resolves to; optional ones may be missing. */
#define DRV_ENTRY(_field, _sym, _optional) \
    {offsetof(xfer_cuda_driver_t, _field), _sym, _optional}

static const struct {
    size_t     offset;
    const char *symbol;
    int        optional;
} cuda_entries[] = {
    DRV_ENTRY(init,                       "cuInit", 0),
    DRV_ENTRY(driver_get_version,         "cuDriverGetVersion", 0),
    DRV_ENTRY(get_error_name,             "cuGetErrorName", 0),
    DRV_ENTRY(get_error_string,           "cuGetErrorString", 0),
    DRV_ENTRY(device_get_count,           "cuDeviceGetCount", 0),
    DRV_ENTRY(device_get,                 "cuDeviceGet", 0),
    DRV_ENTRY(device_get_name,            "cuDeviceGetName", 0),
    DRV_ENTRY(device_get_pci_bus_id,      "cuDeviceGetPCIBusId", 0),
    DRV_ENTRY(device_get_attribute,       "cuDeviceGetAttribute", 0),
    DRV_ENTRY(device_primary_ctx_retain,  "cuDevicePrimaryCtxRetain", 0),
    DRV_ENTRY(device_primary_ctx_release, "cuDevicePrimaryCtxRelease_v2", 0),
    DRV_ENTRY(ctx_get_current,            "cuCtxGetCurrent", 0),
    DRV_ENTRY(ctx_set_current,            "cuCtxSetCurrent", 0),
    DRV_ENTRY(pointer_get_attributes,     "cuPointerGetAttributes", 0),
    DRV_ENTRY(pointer_set_attribute,      "cuPointerSetAttribute", 0),
    DRV_ENTRY(mem_get_address_range,      "cuMemGetAddressRange_v2", 0),
    DRV_ENTRY(mem_alloc,                  "cuMemAlloc_v2", 0),
    DRV_ENTRY(mem_free,                   "cuMemFree_v2", 0),
    DRV_ENTRY(mem_host_alloc,             "cuMemHostAlloc", 0),
    DRV_ENTRY(mem_free_host,              "cuMemFreeHost", 0),
    DRV_ENTRY(memcpy_htod,                "cuMemcpyHtoD_v2", 0),
    DRV_ENTRY(memcpy_dtoh,                "cuMemcpyDtoH_v2", 0),
    DRV_ENTRY(memcpy_async,               "cuMemcpyAsync", 0),
    DRV_ENTRY(memcpy_htod_async,          "cuMemcpyHtoDAsync_v2", 0),
    DRV_ENTRY(memcpy_dtoh_async,          "cuMemcpyDtoHAsync_v2", 0),
    DRV_ENTRY(stream_create,              "cuStreamCreate", 0),
    DRV_ENTRY(stream_destroy,             "cuStreamDestroy_v2", 0),
    DRV_ENTRY(stream_synchronize,         "cuStreamSynchronize", 0),
    DRV_ENTRY(event_create,               "cuEventCreate", 0),
    DRV_ENTRY(event_record,               "cuEventRecord", 0),
    DRV_ENTRY(event_query,                "cuEventQuery", 0),
    DRV_ENTRY(event_destroy,              "cuEventDestroy_v2", 0),
    DRV_ENTRY(mem_get_handle_for_address_range, "cuMemGetHandleForAddressRange", 1),
    DRV_ENTRY(ipc_get_mem_handle,         "cuIpcGetMemHandle", 1),
    DRV_ENTRY(ipc_open_mem_handle,        "cuIpcOpenMemHandle_v2", 1),
    DRV_ENTRY(ipc_close_mem_handle,       "cuIpcCloseMemHandle", 1),
    DRV_ENTRY(memcpy_batch_async,         "cuMemcpyBatchAsync", 1),
    DRV_ENTRY(module_load_data,           "cuModuleLoadData", 1),
    DRV_ENTRY(module_get_function,        "cuModuleGetFunction", 1),
    DRV_ENTRY(module_unload,              "cuModuleUnload", 1),
    DRV_ENTRY(launch_kernel,              "cuLaunchKernel", 1),
};

/* Called with cuda_lock held, once. */
static void driver_load(void)
{
    const char *err;
    void *handle;
    int version = 0;

    load_done = 1;
    dlerror();
    handle = dlopen(cuda_lib, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        err = dlerror();
        if ((err != NULL) && (strstr(err, "No such file") != NULL)) {
            xfer_reason_set(load_why, sizeof(load_why), "%s not found (no NVIDIA driver on this "
                            "host, or XFER_CUDA_LIB names a missing file)", cuda_lib);
        } else {
            xfer_reason_set(load_why, sizeof(load_why), "cannot load %s: %s", cuda_lib,
                            (err != NULL) ? err : "unknown error");
        }
        xfer_log(XFER_LOG_DEBUG, CUDA_SUBSYS, "%s", load_why);
        return;
    }
    memset(&cuda_drv, 0, sizeof(cuda_drv));
    for (size_t i = 0; i < sizeof(cuda_entries) / sizeof(cuda_entries[0]); i++) {
        void *sym = dlsym(handle, cuda_entries[i].symbol);

        if ((sym == NULL) && !cuda_entries[i].optional) {
            xfer_reason_set(load_why, sizeof(load_why), "%s is not a usable CUDA driver: it "
                            "lacks %s (not libcuda, or a driver too old)", cuda_lib,
                            cuda_entries[i].symbol);
            xfer_log(XFER_LOG_DEBUG, CUDA_SUBSYS, "%s", load_why);
            dlclose(handle);
            return;
        }
        memcpy((char*)&cuda_drv + cuda_entries[i].offset, &sym, sizeof(sym));
    }
    cuda_drv.size    = sizeof(cuda_drv);
    cuda_drv.library = cuda_lib;
    if (cuda_drv.driver_get_version(&version) == CU_SUCCESS) {
        cuda_drv.version = version;
    }
    cuda_handle = handle;
    xfer_log(XFER_LOG_DEBUG, CUDA_SUBSYS, "loaded %s (CUDA driver %d.%d)", cuda_lib,
             version / 1000, (version % 1000) / 10);
}

const xfer_cuda_driver_t *xfer_cuda_driver(char *why, size_t why_size)
{
    const xfer_cuda_driver_t *drv;

    pthread_mutex_lock(&cuda_lock);
    if (!load_done) {
        driver_load();
    }
    drv = (cuda_handle != NULL) ? &cuda_drv : NULL;
    if ((drv == NULL) && (why != NULL)) {
        xfer_reason_set(why, why_size, "%s", load_why);
    }
    pthread_mutex_unlock(&cuda_lock);
    return drv;
}

const char *xfer_cuda_result_string(int result, char *buf, size_t size)
{
    const char *name = NULL, *text = NULL;

    if ((cuda_handle == NULL) || (cuda_drv.get_error_name(result, &name) != CU_SUCCESS)) {
        name = NULL;
    }
    if ((cuda_handle == NULL) || (cuda_drv.get_error_string(result, &text) != CU_SUCCESS)) {
        text = NULL;
    }
    if (name == NULL) {
        xfer_reason_set(buf, size, "CUDA error %d", result);
    } else {
        xfer_reason_set(buf, size, "%s%s%s", name, text ? ": " : "", text ? text : "");
    }
    return buf;
}

xfer_status_t xfer_cuda_init(char *why, size_t why_size)
{
    xfer_status_t status = XFER_OK;
    char res_str[160];
    int res;

    pthread_mutex_lock(&cuda_lock);
    if (!load_done) {
        driver_load();
    }
    if (cuda_handle == NULL) {
        xfer_reason_set(why, why_size, "%s", load_why);
        pthread_mutex_unlock(&cuda_lock);
        return XFER_ERR_UNAVAILABLE;
    }
    if (!init_done) {
        init_done = 1;
        res = cuda_drv.init(0);
        if (res != CU_SUCCESS) {
            xfer_reason_set(init_why, sizeof(init_why), "cuInit failed in %s: %s", cuda_lib,
                            xfer_cuda_result_string(res, res_str, sizeof(res_str)));
            xfer_log(XFER_LOG_DEBUG, CUDA_SUBSYS, "%s", init_why);
        }
    }
    if (init_why[0] != '\0') {
        xfer_reason_set(why, why_size, "%s", init_why);
        status = XFER_ERR_UNAVAILABLE;
    }
    pthread_mutex_unlock(&cuda_lock);
    return status;
}

void xfer_cuda_describe(char *buf, size_t size)
{
    pthread_mutex_lock(&cuda_lock);
    if (!load_done) {
        xfer_reason_set(buf, size, "%s not loaded (it is loaded, and CUDA initialised, on the "
                        "first registration of CUDA memory)", cuda_lib);
    } else if (cuda_handle == NULL) {
        xfer_reason_set(buf, size, "%s", load_why);
    } else if (init_why[0] != '\0') {
        xfer_reason_set(buf, size, "%s", init_why);
    } else {
        xfer_reason_set(buf, size, "%s loaded, CUDA driver %d.%d%s", cuda_lib,
                        cuda_drv.version / 1000, (cuda_drv.version % 1000) / 10,
                        init_done ? ", initialised" : "");
    }
    pthread_mutex_unlock(&cuda_lock);
}

xfer_status_t xfer_cuda_sync_memops(const xfer_mem_attr_t *attr, char *why, size_t why_size)
{
    const xfer_cuda_driver_t *drv = xfer_cuda_driver(why, why_size);
    void *saved = NULL;
    unsigned one = 1;
    char res_str[160];
    int res, switched = 0;

    if (drv == NULL) {
        return XFER_ERR_UNAVAILABLE;
    }
    if ((drv->ctx_get_current(&saved) == CU_SUCCESS) && (attr->cuda_context != NULL) &&
        (saved != attr->cuda_context)) {
        switched = (drv->ctx_set_current(attr->cuda_context) == CU_SUCCESS);
    }
    res = drv->pointer_set_attribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                     (xfer_cu_ptr_t)attr->alloc_base);
    if (switched) {
        drv->ctx_set_current(saved);
    }
    if (res != CU_SUCCESS) {
        xfer_reason_set(why, why_size, "cannot set SYNC_MEMOPS on the allocation at 0x%llx: %s",
                        (unsigned long long)attr->alloc_base,
                        xfer_cuda_result_string(res, res_str, sizeof(res_str)));
        return XFER_ERR_IO;
    }
    return XFER_OK;
}
