/*
 * gpu_attrs: what the CUDA driver reports about GPUDirect RDMA and DMA-BUF, per device, for
 * bench_gpu.sh - the attributes that decide how xfer can move device memory to a NIC:
 *   CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED                    (124) cuMemGetHandleForAddressRange
 *                                                                  + ibv_reg_dmabuf_mr
 *   CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED            (116) nvidia-peermem / DMA-BUF
 *   CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS (117) how a NIC's writes are
 *                                                                  flushed: HOST, MEMOPS bits
 *   CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING      (118) NONE, OWNER, ALL_DEVICES
 *   CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (110) the same for cuMemCreate
 * The driver is loaded with dlopen (XFER_CUDA_LIB, else libcuda.so.1), as libxfer loads it:
 * nothing here links against CUDA, so it builds everywhere and says why where it cannot run.
 *
 *   gpu_attrs        one block per device; exit 0, or 1 with one line saying why
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cu_result_t;

enum {
    ATTR_COMPUTE_MAJOR        = 75,
    ATTR_COMPUTE_MINOR        = 76,
    ATTR_GDR_WITH_VMM         = 110,
    ATTR_GDR_SUPPORTED        = 116,
    ATTR_GDR_FLUSH_OPTIONS    = 117,
    ATTR_GDR_WRITES_ORDERING  = 118,
    ATTR_DMA_BUF_SUPPORTED    = 124,
};

static struct {
    cu_result_t (*init)(unsigned flags);
    cu_result_t (*driver_get_version)(int *version);
    cu_result_t (*get_error_name)(cu_result_t res, const char **name);
    cu_result_t (*device_get_count)(int *count);
    cu_result_t (*device_get)(int *dev, int ordinal);
    cu_result_t (*device_get_name)(char *name, int len, int dev);
    cu_result_t (*device_get_pci_bus_id)(char *id, int len, int dev);
    cu_result_t (*device_get_attribute)(int *value, int attr, int dev);
    cu_result_t (*device_total_mem)(size_t *bytes, int dev);     /* optional */
} cu;

static const char *cu_error(cu_result_t res)
{
    static char buf[64];
    const char *name = NULL;

    if ((cu.get_error_name != NULL) && (cu.get_error_name(res, &name) == 0) && (name != NULL)) {
        return name;
    }
    snprintf(buf, sizeof(buf), "CUDA error %d", res);
    return buf;
}

static int load(const char *lib)
{
    static const struct {
        const char *symbol;
        void       **fn;
        int        optional;
    } entries[] = {
        {"cuInit",              (void**)&cu.init, 0},
        {"cuDriverGetVersion",  (void**)&cu.driver_get_version, 0},
        {"cuGetErrorName",      (void**)&cu.get_error_name, 0},
        {"cuDeviceGetCount",    (void**)&cu.device_get_count, 0},
        {"cuDeviceGet",         (void**)&cu.device_get, 0},
        {"cuDeviceGetName",     (void**)&cu.device_get_name, 0},
        {"cuDeviceGetPCIBusId", (void**)&cu.device_get_pci_bus_id, 0},
        {"cuDeviceGetAttribute", (void**)&cu.device_get_attribute, 0},
        {"cuDeviceTotalMem_v2", (void**)&cu.device_total_mem, 1},
    };
    void *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

    if (handle == NULL) {
        fprintf(stderr, "gpu_attrs: cannot load the CUDA driver library %s: %s\n", lib,
                dlerror());
        return -1;
    }
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        *entries[i].fn = dlsym(handle, entries[i].symbol);
        if ((*entries[i].fn == NULL) && !entries[i].optional) {
            fprintf(stderr, "gpu_attrs: %s is not a usable CUDA driver library: it has no %s\n",
                    lib, entries[i].symbol);
            return -1;
        }
    }
    return 0;
}

/* One attribute: its value, or why the driver would not say (an older driver lacks it). */
static void attr_print(int dev, const char *name, int attr, const char *(*meaning)(int))
{
    cu_result_t res;
    int value = 0;

    res = cu.device_get_attribute(&value, attr, dev);
    if (res != 0) {
        printf("  %-40s unknown (%s: the driver does not know attribute %d)\n", name,
               cu_error(res), attr);
        return;
    }
    printf("  %-40s %d%s\n", name, value, (meaning != NULL) ? meaning(value) : "");
}

static const char *yes_no(int v)
{
    return v ? " (yes)" : " (no)";
}

static const char *flush_options(int v)
{
    static char buf[64];

    /* CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST = 1, _MEMOPS = 2 */
    snprintf(buf, sizeof(buf), " (%s%s%s)", (v & 1) ? "HOST" : "", ((v & 3) == 3) ? "|" : "",
             (v & 2) ? "MEMOPS" : ((v & 1) ? "" : "none"));
    return buf;
}

static const char *writes_ordering(int v)
{
    /* CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE = 0, _OWNER = 100, _ALL_DEVICES = 200 */
    return (v == 0) ? " (NONE: a flush is needed before the GPU reads what a NIC wrote)" :
           (v == 100) ? " (OWNER)" : (v == 200) ? " (ALL_DEVICES)" : " (?)";
}

int main(int argc, char **argv)
{
    const char *env = getenv("XFER_CUDA_LIB");
    const char *lib = ((env != NULL) && (*env != '\0')) ? env : "libcuda.so.1";
    char name[256], bus[64];
    int version = 0, count = 0, dev, major = 0, minor = 0;
    size_t mem = 0;
    cu_result_t res;

    if (argc > 1) {
        fprintf(stderr, "usage: %s (no arguments; XFER_CUDA_LIB names the driver library)\n",
                argv[0]);
        return 2;
    }
    if (load(lib) != 0) {
        return 1;
    }
    res = cu.init(0);
    if (res == 0) {
        res = cu.driver_get_version(&version);
    }
    if (res == 0) {
        res = cu.device_get_count(&count);
    }
    if (res != 0) {
        fprintf(stderr, "gpu_attrs: cuInit: %s\n", cu_error(res));
        return 1;
    }
    printf("driver library %s, CUDA driver API %d.%d, %d device%s\n", lib, version / 1000,
           (version % 1000) / 10, count, (count == 1) ? "" : "s");
    for (int i = 0; i < count; i++) {
        if ((cu.device_get(&dev, i) != 0) ||
            (cu.device_get_name(name, sizeof(name), dev) != 0) ||
            (cu.device_get_pci_bus_id(bus, sizeof(bus), dev) != 0)) {
            printf("device %d: cannot be queried\n", i);
            continue;
        }
        name[sizeof(name) - 1] = '\0';
        bus[sizeof(bus) - 1]   = '\0';
        cu.device_get_attribute(&major, ATTR_COMPUTE_MAJOR, dev);
        cu.device_get_attribute(&minor, ATTR_COMPUTE_MINOR, dev);
        if ((cu.device_total_mem == NULL) || (cu.device_total_mem(&mem, dev) != 0)) {
            mem = 0;
        }
        printf("device %d: %s, PCI %s, compute capability %d.%d, %.1f GiB\n", i, name, bus,
               major, minor, (double)mem / (double)(1ull << 30));
        attr_print(dev, "DMA_BUF_SUPPORTED", ATTR_DMA_BUF_SUPPORTED, yes_no);
        attr_print(dev, "GPU_DIRECT_RDMA_SUPPORTED", ATTR_GDR_SUPPORTED, yes_no);
        attr_print(dev, "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS", ATTR_GDR_FLUSH_OPTIONS,
                   flush_options);
        attr_print(dev, "GPU_DIRECT_RDMA_WRITES_ORDERING", ATTR_GDR_WRITES_ORDERING,
                   writes_ordering);
        attr_print(dev, "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", ATTR_GDR_WITH_VMM, yes_no);
    }
    if (count == 0) {
        fprintf(stderr, "gpu_attrs: the driver sees no CUDA device\n");
        return 1;
    }
    return 0;
}
