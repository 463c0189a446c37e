/*
 * The gdr component: GPUDirect RDMA, i.e. verbs moving CUDA device memory. It needs both a
 * CUDA GPU and an RDMA device. query() finds the GPUs without the CUDA driver: NVIDIA display
 * and 3D controllers on the PCI bus (sysfs), the kernel driver's version from
 * /proc/driver/nvidia/version and nvidia_peermem from /sys/module. It neither loads libcuda
 * nor calls cuInit, so that a process which never touches device memory does not initialise
 * CUDA (the framework loads the driver on the first registration of CUDA memory); what only
 * the initialised driver knows, such as DMA-BUF support, is reported as unknown until then.
 * Its data path is the verbs component's code under this descriptor (gdr.h): it claims what
 * verbs claims and CUDA memory, where a GPU, an active RDMA port and a way to register device
 * memory (DMA-BUF, or nvidia-peermem) can be there; xfer_info shows what it found and, per
 * GPU, the port closest to it and how its memory would reach that port (gdr_topo.c).
 */
#include "config.h"

#include "gdr.h"
#include "gdr_topo.h"
#include "../verbs/verbs_devices.h"
#include "../verbs/verbs_params.h"

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/utsname.h>

#define GDR_PCI_DIR       "/sys/bus/pci/devices"
#define GDR_NVIDIA_VENDOR 0x10de
#define GDR_PCI_CLASS_DISPLAY 0x03  /* base class: VGA, 3D and other display controllers */

static const char *const flush_values[] = {"auto", "on", "off", NULL};

/* The verbs parameters first (XFER_GDR_DEVICE, XFER_GDR_TX_QUEUE_LEN, ...), then gdr's own. */
static const xfer_param_desc_t gdr_params[] = {
    XFER_VERBS_PARAM_ENTRIES
    {"FLUSH", XFER_PARAM_ENUM, "auto",
     "Flush data the NIC wrote into GPU memory (a 1-byte RDMA READ on a loopback QP) before a "
     "receive, get or tensor fetch into it completes: auto does unless the GPU reports that "
     "it orders GPUDirect RDMA writes for its own use (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_"
     "WRITES_ORDERING), on always, off never.",
     offsetof(xfer_gdr_config_t, flush), 0, 0, flush_values},
    {"DMABUF", XFER_PARAM_BOOL, "y",
     "Register GPU memory by DMA-BUF (cuMemGetHandleForAddressRange, ibv_reg_dmabuf_mr) where "
     "the GPU and the RDMA device support it.",
     offsetof(xfer_gdr_config_t, dmabuf), 0, 0, NULL},
    {"PEERMEM", XFER_PARAM_BOOL, "y",
     "Register GPU memory by ibv_reg_mr on the device pointer where nvidia_peermem is loaded "
     "(after DMA-BUF).",
     offsetof(xfer_gdr_config_t, peermem), 0, 0, NULL},
    {"LEVEL", XFER_PARAM_ENUM, "PXB",
     "Farthest PCIe distance between a GPU and the NIC closest to it at which GPU memory is "
     "registered with the NIC; farther, it is staged through host memory. PIX: one PCIe "
     "switch, PXB: several switches, PHB: through the CPU's host bridge, SYS: across CPU "
     "sockets (NCCL's names). The default is NCCL's (NCCL_NET_GDR_LEVEL): peer-to-peer DMA "
     "through the CPU's root complex is on many hosts slower than staging.",
     offsetof(xfer_gdr_config_t, level), 0, 0, xfer_topo_path_names},
    {NULL}
};

/* One hexadecimal or decimal number from a sysfs file; -1 when it cannot be read. */
static long sysfs_long(const char *dir, const char *file)
{
    char path[512];

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path)) {
        return -1;      /* a path this long is not one of sysfs's */
    }
    return xfer_file_long(path, -1);
}

/* The kernel driver bound to a PCI device ("nvidia", "vfio-pci"), or "none". */
static void pci_bound_driver(const char *dir, char *buf, size_t size)
{
    char path[512], target[512];
    const char *slash;
    ssize_t len;

    xfer_reason_set(path, sizeof(path), "%s/driver", dir);
    len = readlink(path, target, sizeof(target) - 1);
    if (len <= 0) {
        xfer_reason_set(buf, size, "none");
        return;
    }
    target[len] = '\0';
    slash       = strrchr(target, '/');
    xfer_reason_set(buf, size, "%s", (slash != NULL) ? slash + 1 : target);
}

/* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..." -> "550.54.15", or
 * "... NVIDIA UNIX Open Kernel Module for x86_64  550.54.15 ..." (*open_p = 1 for this one). */
static int nvidia_kernel_version(char *buf, size_t size, int *open_p)
{
    char line[512], *p, *save = NULL;
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    int found = 0;

    if (f == NULL) {
        return 0;
    }
    if ((fgets(line, sizeof(line), f) != NULL) &&
        ((p = strstr(line, "Kernel Module")) != NULL)) {
        *open_p = (strstr(line, "Open Kernel Module") != NULL);
        /* the first word after it that reads as a version: past "for x86_64" */
        for (p = strtok_r(p + strlen("Kernel Module"), " \t\n", &save); p != NULL;
             p = strtok_r(NULL, " \t\n", &save)) {
            if ((*p >= '0') && (*p <= '9') && (strchr(p, '.') != NULL)) {
                snprintf(buf, size, "%s", p);
                found = 1;
                break;
            }
        }
    }
    fclose(f);
    return found;
}

/* The kernel's peer-memory client for NVIDIA GPUs (what ibv_reg_mr on device memory needs
 * without DMA-BUF), as NCCL and UCX look for it. */
static const char *peermem_state(void)
{
    static const char *const paths[] = {
        "/sys/module/nvidia_peermem", "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/module/nv_peer_mem",
    };

    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        if (access(paths[i], F_OK) == 0) {
            return "loaded";
        }
    }
    return "not loaded";
}

/* Describe the NVIDIA GPUs on the PCI bus; returns how many there are. */
static int describe_gpus(xfer_component_attr_t *attr)
{
    char kver[64] = "", driver_line[XFER_REASON_MAX];
    int open_module = 0, have_kver = nvidia_kernel_version(kver, sizeof(kver), &open_module);
    struct dirent *de;
    int count = 0;
    DIR *dir;

    xfer_cuda_describe(driver_line, sizeof(driver_line));
    dir = opendir(GDR_PCI_DIR);
    if (dir == NULL) {
        return 0;
    }
    while ((de = readdir(dir)) != NULL) {
        char path[512], bound[64];
        xfer_device_attr_t *dev;
        long pci_class;

        if (de->d_name[0] == '.') {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", GDR_PCI_DIR, de->d_name);
        pci_class = sysfs_long(path, "class");
        if ((sysfs_long(path, "vendor") != GDR_NVIDIA_VENDOR) || (pci_class < 0) ||
            (((pci_class >> 16) & 0xff) != GDR_PCI_CLASS_DISPLAY)) {
            continue;
        }
        count++;
        if (attr->num_devices >= XFER_DEVICE_MAX) {
            continue;
        }
        dev = &attr->devices[attr->num_devices++];
        memset(dev, 0, sizeof(*dev));
        snprintf(dev->name, sizeof(dev->name), "gpu%d", count - 1);
        snprintf(dev->kind, sizeof(dev->kind), "gpu");
        dev->numa_node = (int)sysfs_long(path, "numa_node");
        pci_bound_driver(path, bound, sizeof(bound));
        xfer_device_attr_add(dev, "pci", "%s", de->d_name);
        xfer_device_attr_add(dev, "pci_id", "%04lx:%04lx", (long)GDR_NVIDIA_VENDOR,
                             sysfs_long(path, "device"));
        xfer_device_attr_add(dev, "kernel_driver", "%s", bound);
        xfer_device_attr_add(dev, "driver_version", "%s%s", have_kver ? kver :
                             "unknown (/proc/driver/nvidia/version absent)",
                             (have_kver && open_module) ? " (open kernel module)" : "");
        xfer_device_attr_add(dev, "nvidia_peermem", "%s", peermem_state());
        xfer_device_attr_add(dev, "dmabuf", "unknown until first use (needs cuInit)");
        xfer_device_attr_add(dev, "cuda_driver", "%s", driver_line);
        xfer_device_attr_add(dev, "found_by", "sysfs " GDR_PCI_DIR " (CUDA not initialised)");
    }
    closedir(dir);
    return count;
}

/* Whether no way to register GPU memory can work here: DMA-BUF turned off and no peer-memory
 * client to use. Whether DMA-BUF works is known only once the driver is initialised. */
static int strategy_ruled_out(const xfer_gdr_config_t *cfg, char *why, size_t why_size)
{
    char peermem_why[128];

    if (cfg->dmabuf) {
        return 0;
    }
    if (cfg->peermem && xfer_gdr_peermem_loaded(peermem_why, sizeof(peermem_why))) {
        return 0;
    }
    xfer_reason_set(why, why_size, "no way to register GPU memory with the NIC: "
                    "XFER_GDR_DMABUF=n and %s", cfg->peermem ? peermem_why :
                    "XFER_GDR_PEERMEM=n");
    return 1;
}

/* For each GPU described, the RDMA port closest to it in topo and how its memory would reach
 * it (gdr_topo.c), from what the kernel says without the CUDA driver. */
static void describe_gdr_paths(const xfer_gdr_config_t *cfg, const xfer_topo_t *topo,
                               xfer_component_attr_t *attr)
{
    xfer_gdr_reg_facts_t facts = {.open_module = -1, .driver_major = -1};
    char kver[64];
    struct utsname uts;

    if (nvidia_kernel_version(kver, sizeof(kver), &facts.open_module)) {
        facts.driver_major = atoi(kver);
    }
    facts.peermem = (strcmp(peermem_state(), "loaded") == 0);
    if ((uname(&uts) != 0) ||
        (sscanf(uts.release, "%d.%d", &facts.linux_major, &facts.linux_minor) != 2)) {
        facts.linux_major = facts.linux_minor = 0;
    }
    for (uint32_t d = 0; d < attr->num_devices; d++) {
        if (strcmp(attr->devices[d].kind, "gpu") == 0) {
            xfer_gdr_topo_describe_gpu(topo, (xfer_topo_path_t)cfg->level, &facts, attr,
                                       &attr->devices[d]);
        }
    }
}

static xfer_status_t gdr_query(const void *config, xfer_component_attr_t *attr)
{
    const xfer_gdr_config_t *cfg = config;
    char gpu_why[XFER_REASON_MAX / 2] = "", rdma_why[XFER_REASON_MAX / 2] = "";
    xfer_topo_t *topo = NULL;
    unsigned found, active;
    double best_mbs;
    int gpus;

    gpus = describe_gpus(attr);
    if (gpus == 0) {
        char kver[64];
        int open_module;

        xfer_reason_set(gpu_why, sizeof(gpu_why), "no NVIDIA GPU on the PCI bus (%s, read "
                        "without the CUDA driver)%s", GDR_PCI_DIR,
                        nvidia_kernel_version(kver, sizeof(kver), &open_module) ? "" :
                        ", no NVIDIA kernel driver");
    }
    /* one tree for the ports' NUMA nodes and the GPUs' NICs: read once per query, where there
     * is a GPU to place (without one, the ports' description reads it if there are ports) */
    if ((gpus > 0) && (xfer_topo_open(NULL, &topo) != XFER_OK)) {
        xfer_log(XFER_LOG_WARN, "gdr", "out of memory: GPUs are listed without their NIC");
    }
    xfer_verbs_describe_ports(cfg->verbs.device, topo, attr, &found, &active, &best_mbs);
    if (found == 0) {
        snprintf(rdma_why, sizeof(rdma_why), "no RDMA devices found");
    } else if (active == 0) {
        snprintf(rdma_why, sizeof(rdma_why), "no matching RDMA port is ACTIVE");
    }
    if ((gpus > 0) && (topo != NULL)) {
        describe_gdr_paths(cfg, topo, attr);
    }
    xfer_topo_close(topo);

    if ((gpus > 0) && (rdma_why[0] == '\0') && !strategy_ruled_out(cfg, gpu_why,
                                                                     sizeof(gpu_why))) {
        attr->available             = 1;
        attr->caps                  = XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG |
                                      XFER_CAP_TENSOR | XFER_CAP_MEM_HOST |
                                      XFER_CAP_MEM_CUDA | XFER_CAP_INTER_HOST;
        attr->limits.max_msg_size   = cfg->verbs.max_msg_size;
        attr->limits.max_eager_size = cfg->verbs.seg_size - XFER_VERBS_WIRE_TAG_HDR_LEN;
        attr->latency_us            = 3.0;  /* the verbs data path */
        attr->bandwidth_mbs         = best_mbs;
        return XFER_OK;
    }
    xfer_reason_set(attr->reason, sizeof(attr->reason), "%s%s%s", gpu_why,
                    (gpu_why[0] && rdma_why[0]) ? "; " : "", rdma_why);
    return XFER_OK;
}

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    XFER_COMPONENT_V1_HEAD("gdr",
                           "GPUDirect RDMA: verbs on CUDA device memory "
                           "(driver loaded at run time)",
                           gdr_params, xfer_gdr_config_t),
    .query          = gdr_query,
    .iface_open     = xfer_gdr_iface_open,
    .iface_close    = xfer_gdr_iface_close,
    .mem_dereg      = xfer_gdr_mem_dereg,
    .mem_reg_params = xfer_gdr_mem_reg_params,
    XFER_VERBS_COMPONENT_OPS,
};

XFER_VERBS_STATS_EXPORT;
