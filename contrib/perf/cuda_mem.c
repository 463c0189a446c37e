/*
 * CUDA device memory for xfer_perf's buffers (-m cuda). xfer_perf uses the public libxfer
 * only, so it loads the driver itself, with dlopen, the library libxfer would load: the one
 * XFER_CUDA_LIB names, else libcuda.so.1. Nothing links against CUDA, and a run with host
 * buffers on both sides never loads or initialises it.
 *
 * Buffers are cuMemAlloc'd in the primary context of one device (--cuda-device), made
 * current on the thread that runs the test for the life of the process. Fills and reads
 * (-V, put_lat's last byte) are synchronous copies followed by cuCtxSynchronize: a memset,
 * or a copy from pageable memory, may return before it landed, and xfer's own copies run on
 * a stream of their own.
 */
#include "perf.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_LIB_DEFAULT  "libcuda.so.1"

typedef int                cu_result_t;
typedef unsigned long long cu_ptr_t;

typedef struct cuda_driver {
    cu_result_t (*init)(unsigned flags);
    cu_result_t (*get_error_name)(cu_result_t res, const char **name);
    cu_result_t (*get_error_string)(cu_result_t res, const char **text);
    cu_result_t (*device_get_count)(int *count);
    cu_result_t (*device_get)(int *dev, int ordinal);
    cu_result_t (*device_get_name)(char *name, int len, int dev);
    cu_result_t (*primary_ctx_retain)(void **ctx, int dev);
    cu_result_t (*primary_ctx_release)(int dev);
    cu_result_t (*ctx_set_current)(void *ctx);
    cu_result_t (*ctx_synchronize)(void);
    cu_result_t (*mem_alloc)(cu_ptr_t *ptr, size_t size);
    cu_result_t (*mem_free)(cu_ptr_t ptr);
    cu_result_t (*memset_d8)(cu_ptr_t dst, unsigned char value, size_t len);
    cu_result_t (*memcpy_htod)(cu_ptr_t dst, const void *src, size_t len);
    cu_result_t (*memcpy_dtoh)(void *dst, cu_ptr_t src, size_t len);
} cuda_driver_t;

#define ENTRY(_field, _sym) {offsetof(cuda_driver_t, _field), _sym}

static const struct {
    size_t     offset;
    const char *symbol;
} cuda_entries[] = {
    ENTRY(init,                "cuInit"),
    ENTRY(get_error_name,      "cuGetErrorName"),
    ENTRY(get_error_string,    "cuGetErrorString"),
    ENTRY(device_get_count,    "cuDeviceGetCount"),
    ENTRY(device_get,          "cuDeviceGet"),
    ENTRY(device_get_name,     "cuDeviceGetName"),
    ENTRY(primary_ctx_retain,  "cuDevicePrimaryCtxRetain"),
    ENTRY(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2"),
    ENTRY(ctx_set_current,     "cuCtxSetCurrent"),
    ENTRY(ctx_synchronize,     "cuCtxSynchronize"),
    ENTRY(mem_alloc,           "cuMemAlloc_v2"),
    ENTRY(mem_free,            "cuMemFree_v2"),
    ENTRY(memset_d8,           "cuMemsetD8_v2"),
    ENTRY(memcpy_htod,         "cuMemcpyHtoD_v2"),
    ENTRY(memcpy_dtoh,         "cuMemcpyDtoH_v2"),
};

static struct {
    void          *handle;
    cuda_driver_t drv;
    int           device;       /* the CUdevice whose primary context is retained */
    int           ordinal;      /* --cuda-device */
    char          name[128];
} cuda;

/* "CUDA_ERROR_NAME (what the driver says)" */
static const char *cu_error(cu_result_t res, char *buf, size_t size)
{
    const char *name = NULL, *text = NULL;

    if ((cuda.drv.get_error_name == NULL) || (cuda.drv.get_error_name(res, &name) != 0)) {
        name = NULL;
    }
    if ((cuda.drv.get_error_string == NULL) || (cuda.drv.get_error_string(res, &text) != 0)) {
        text = NULL;
    }
    if (name != NULL) {
        snprintf(buf, size, "%s (%s)", name, (text != NULL) ? text : "no description");
    } else {
        snprintf(buf, size, "CUDA error %d", res);
    }
    return buf;
}

static int cu_fail(const char *call, cu_result_t res)
{
    char err[160];

    fprintf(stderr, "xfer_perf: %s: %s\n", call, cu_error(res, err, sizeof(err)));
    return -1;
}

static int load(char *why, size_t why_size)
{
    const char *env = getenv("XFER_CUDA_LIB");
    const char *lib = ((env != NULL) && (*env != '\0')) ? env : CUDA_LIB_DEFAULT;
    const char *err;
    void *sym;

    dlerror();
    cuda.handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (cuda.handle == NULL) {
        err = dlerror();
        snprintf(why, why_size, "cannot load the CUDA driver library %s (%s): %s", lib,
                 (lib == env) ? "from XFER_CUDA_LIB" :
                 "the default; XFER_CUDA_LIB may name another",
                 (err != NULL) ? err : "unknown error");
        return -1;
    }
    for (size_t i = 0; i < sizeof(cuda_entries) / sizeof(cuda_entries[0]); i++) {
        sym = dlsym(cuda.handle, cuda_entries[i].symbol);
        if (sym == NULL) {
            snprintf(why, why_size, "%s is not a usable CUDA driver library: it has no %s", lib,
                     cuda_entries[i].symbol);
            dlclose(cuda.handle);
            cuda.handle = NULL;
            memset(&cuda.drv, 0, sizeof(cuda.drv));
            return -1;
        }
        memcpy((char*)&cuda.drv + cuda_entries[i].offset, &sym, sizeof(sym));
    }
    return 0;
}

/* Load the driver, initialise it and make device's primary context current; once. */
int perf_cuda_open(int device, char *why, size_t why_size)
{
    char err[160];
    void *ctx;
    int count = 0;
    cu_result_t res;

    if (cuda.handle != NULL) {
        return 0;
    }
    if (load(why, why_size) != 0) {
        return -1;
    }
    res = cuda.drv.init(0);
    if (res == 0) {
        res = cuda.drv.device_get_count(&count);
    }
    if (res != 0) {
        snprintf(why, why_size, "cuInit: %s", cu_error(res, err, sizeof(err)));
        goto err_unload;
    }
    if (device >= count) {
        snprintf(why, why_size, "--cuda-device %d: the driver sees %d device%s", device, count,
                 (count == 1) ? "" : "s");
        goto err_unload;
    }
    res = cuda.drv.device_get(&cuda.device, device);
    if (res != 0) {
        snprintf(why, why_size, "cuDeviceGet(%d): %s", device, cu_error(res, err, sizeof(err)));
        goto err_unload;
    }
    res = cuda.drv.primary_ctx_retain(&ctx, cuda.device);
    if (res != 0) {
        snprintf(why, why_size, "cuDevicePrimaryCtxRetain(device %d): %s", device,
                 cu_error(res, err, sizeof(err)));
        goto err_unload;
    }
    res = cuda.drv.ctx_set_current(ctx);
    if (res != 0) {
        snprintf(why, why_size, "cuCtxSetCurrent(device %d): %s", device,
                 cu_error(res, err, sizeof(err)));
        cuda.drv.primary_ctx_release(cuda.device);
        goto err_unload;
    }
    if (cuda.drv.device_get_name(cuda.name, sizeof(cuda.name), cuda.device) != 0) {
        snprintf(cuda.name, sizeof(cuda.name), "?");
    }
    cuda.name[sizeof(cuda.name) - 1] = '\0';
    cuda.ordinal = device;
    return 0;

err_unload:
    dlclose(cuda.handle);
    cuda.handle = NULL;
    memset(&cuda.drv, 0, sizeof(cuda.drv));
    return -1;
}

/* After every buffer is freed. The library stays mapped: libxfer may hold it too. */
void perf_cuda_close(void)
{
    if (cuda.handle == NULL) {
        return;
    }
    cuda.drv.ctx_set_current(NULL);
    cuda.drv.primary_ctx_release(cuda.device);
}

/* "device N (name)", for the report; "" before perf_cuda_open. */
const char *perf_cuda_device_name(void)
{
    static char text[160];

    if (cuda.handle == NULL) {
        return "";
    }
    snprintf(text, sizeof(text), "device %d (%s)", cuda.ordinal, cuda.name);
    return text;
}

int perf_cuda_alloc(size_t size, void **ptr_p, char *why, size_t why_size)
{
    char err[160];
    cu_ptr_t ptr;
    cu_result_t res;

    res = cuda.drv.mem_alloc(&ptr, size);
    if (res != 0) {
        snprintf(why, why_size, "cuMemAlloc of %zu bytes on %s: %s", size,
                 perf_cuda_device_name(), cu_error(res, err, sizeof(err)));
        return -1;
    }
    *ptr_p = (void*)(uintptr_t)ptr;
    return 0;
}

void perf_cuda_free(void *ptr)
{
    cu_result_t res;

    if (ptr == NULL) {
        return;
    }
    res = cuda.drv.mem_free((cu_ptr_t)(uintptr_t)ptr);
    if (res != 0) {
        cu_fail("cuMemFree", res);
    }
}

int perf_cuda_memset(void *dst, uint8_t value, size_t len)
{
    cu_result_t res = cuda.drv.memset_d8((cu_ptr_t)(uintptr_t)dst, value, len);

    if (res == 0) {
        res = cuda.drv.ctx_synchronize();
    }
    return (res == 0) ? 0 : cu_fail("cuMemsetD8", res);
}

int perf_cuda_to_host(void *dst, const void *src, size_t len)
{
    cu_result_t res = cuda.drv.memcpy_dtoh(dst, (cu_ptr_t)(uintptr_t)src, len);

    return (res == 0) ? 0 : cu_fail("cuMemcpyDtoH", res);
}

int perf_cuda_from_host(void *dst, const void *src, size_t len)
{
    cu_result_t res = cuda.drv.memcpy_htod((cu_ptr_t)(uintptr_t)dst, src, len);

    if (res == 0) {
        res = cuda.drv.ctx_synchronize();
    }
    return (res == 0) ? 0 : cu_fail("cuMemcpyHtoD", res);
}
