/*
 * The PCIe distance between GPUs and RDMA devices, classified as NCCL does (PIX, PXB, PHB,
 * SYS), from hwloc's tree of I/O objects: host bridges under the CPU package or NUMA node
 * they belong to, PCI bridges (switch ports) under them, devices under the bridges and the
 * RDMA device's OS device ("mlx5_0") under its PCI function.
 *
 * NCCL counts a PCIe switch, i.e. its upstream port and the downstream port a device hangs
 * from, as one hop. In hwloc's tree that is: the lowest bridge above both devices is a PCI
 * bridge and each device sits at most one bridge below it (PIX); deeper, they meet in a
 * switch of switches (PXB); they meet only at a host bridge, or in the CPU package when they
 * hang from different host bridges of one NUMA node, so that the traffic crosses the root
 * complex (PHB); their host bridges belong to CPU packages or NUMA nodes with disjoint memory,
 * so the traffic crosses the CPUs' interconnect (SYS).
 *
 * The plan for a GPU then reads: staging when no active port is within XFER_GDR_LEVEL, else
 * the registration the kernel allows, known without cuInit as far as it can be: DMA-BUF is
 * exported by NVIDIA's open kernel modules from release 515 and imported by RDMA from Linux
 * 5.12, and the driver itself confirms it at the first registration; nvidia-peermem is
 * there or not.
 */
#include "config.h"

#include "gdr_topo.h"
#include "../verbs/verbs_devices.h"

#include <infiniband/verbs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_HWLOC
#include <hwloc.h>
#include <hwloc/openfabrics-verbs.h>
#endif

#define GDR_IB_CLASS_DIR "/sys/class/infiniband"
#define GDR_MAX_DEPTH    64     /* ancestors kept when looking for a common one */

const char *const xfer_gdr_level_names[] = {"PIX", "PXB", "PHB", "SYS", NULL};

struct xfer_gdr_topo {
#ifdef HAVE_HWLOC
    hwloc_topology_t hwloc;     /* NULL when it could not be loaded */
#endif
    char             source[XFER_REASON_MAX];
};

#ifdef HAVE_HWLOC

static void load_hwloc(xfer_gdr_topo_t *topo, const char *xml_path)
{
    unsigned version = hwloc_get_api_version();
    const char *env_xml = getenv("HWLOC_XMLFILE");
    hwloc_topology_t t;

    if (hwloc_topology_init(&t) != 0) {
        xfer_reason_set(topo->source, sizeof(topo->source),
                        "distance unknown (hwloc_topology_init failed: %m)");
        return;
    }
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    /* an XML tree excludes every other discovery component, the GPU ones too */
    if ((xfer_verbs_hwloc_without_gpu_runtimes(t) != 0) && (xml_path == NULL)) {
        hwloc_topology_destroy(t);
        xfer_reason_set(topo->source, sizeof(topo->source), "distance unknown (hwloc %u.%u "
                        "cannot be kept from initialising CUDA; 2.1 or later can)",
                        version >> 16, (version >> 8) & 0xff);
        return;
    }
    if ((xml_path != NULL) && (hwloc_topology_set_xml(t, xml_path) != 0)) {
        xfer_reason_set(topo->source, sizeof(topo->source),
                        "distance unknown (hwloc cannot read %s: %m)", xml_path);
        hwloc_topology_destroy(t);
        return;
    }
    if (hwloc_topology_load(t) != 0) {
        xfer_reason_set(topo->source, sizeof(topo->source),
                        "distance unknown (hwloc_topology_load failed: %m)");
        hwloc_topology_destroy(t);
        return;
    }
    topo->hwloc = t;
    if (xml_path == NULL) {
        xml_path = env_xml;
    }
    if ((xml_path != NULL) && (*xml_path != '\0')) {
        xfer_reason_set(topo->source, sizeof(topo->source), "hwloc %u.%u.%u, PCI tree from "
                        "XML %s", version >> 16, (version >> 8) & 0xff, version & 0xff,
                        xml_path);
    } else {
        xfer_reason_set(topo->source, sizeof(topo->source), "hwloc %u.%u.%u, this host's PCI "
                        "tree", version >> 16, (version >> 8) & 0xff, version & 0xff);
    }
}

/* The PCI function an RDMA device lives on: its OS device in hwloc's tree, else the PCI
 * address sysfs links it to. NULL with why when there is none: *virtual_p says whether
 * because the device has no PCI location at all (rxe, siw) rather than none hwloc knows. */
static hwloc_obj_t rdma_pcidev(hwloc_topology_t t, const char *dev, int *virtual_p, char *why,
                               size_t size)
{
    char path[PATH_MAX], target[PATH_MAX];
    const char *busid;
    hwloc_obj_t obj;
    ssize_t len;

    *virtual_p = 1;
    obj        = hwloc_ibv_get_device_osdev_by_name(t, dev);
    while ((obj != NULL) && (obj->type != HWLOC_OBJ_PCI_DEVICE)) {
        obj = obj->parent;
    }
    if (obj != NULL) {
        return obj;
    }

    snprintf(path, sizeof(path), "%s/%s", GDR_IB_CLASS_DIR, dev);
    len = readlink(path, target, sizeof(target) - 1);
    if (len > 0) {
        target[len] = '\0';
        if (strstr(target, "/virtual/") != NULL) {
            xfer_reason_set(why, size, "%s has no PCI path (software RDMA device)", dev);
            return NULL;
        }
    }
    snprintf(path, sizeof(path), "%s/%s/device", GDR_IB_CLASS_DIR, dev);
    len = readlink(path, target, sizeof(target) - 1);
    if (len > 0) {
        target[len] = '\0';
        busid = strrchr(target, '/');
        busid = (busid != NULL) ? busid + 1 : target;
        obj   = hwloc_get_pcidev_by_busidstring(t, busid);
        if (obj != NULL) {
            return obj;
        }
        xfer_reason_set(why, size, "distance unknown (%s, PCI %s, is not in hwloc's tree)",
                        dev, busid);
        *virtual_p = 0;
        return NULL;
    }
    xfer_reason_set(why, size, "%s has no PCI path (not in hwloc's tree nor under %s)", dev,
                    GDR_IB_CLASS_DIR);
    return NULL;
}

/* How many bridges lie strictly between obj and its ancestor top. */
static int bridges_between(hwloc_obj_t obj, hwloc_obj_t top)
{
    int count = 0;

    for (obj = obj->parent; (obj != NULL) && (obj != top); obj = obj->parent) {
        count += (obj->type == HWLOC_OBJ_BRIDGE);
    }
    return count;
}

/* The lowest object above (or equal to) both a and b. */
static hwloc_obj_t common_ancestor(hwloc_obj_t a, hwloc_obj_t b)
{
    hwloc_obj_t above_a[GDR_MAX_DEPTH];
    int n = 0;

    for (; (a != NULL) && (n < GDR_MAX_DEPTH); a = a->parent) {
        above_a[n++] = a;
    }
    for (; b != NULL; b = b->parent) {
        for (int i = 0; i < n; i++) {
            if (above_a[i] == b) {
                return b;
            }
        }
    }
    return NULL;
}

static int first_node(hwloc_obj_t obj)
{
    return ((obj->nodeset != NULL) && !hwloc_bitmap_iszero(obj->nodeset)) ?
           hwloc_bitmap_first(obj->nodeset) : -1;
}

/* The distance between two PCI functions of one tree, with what it means in why. */
static xfer_gdr_path_t classify(hwloc_topology_t t, hwloc_obj_t gpu, hwloc_obj_t nic,
                                char *why, size_t size)
{
    hwloc_obj_t common = common_ancestor(gpu, nic), gpu_cpu, nic_cpu;

    if (common == NULL) {
        xfer_reason_set(why, size, "distance unknown (no common ancestor in hwloc's tree)");
        return XFER_GDR_PATH_UNKNOWN;
    }
    if (common->type == HWLOC_OBJ_BRIDGE) {
        const struct hwloc_pcidev_attr_s *at;

        if (common->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
            xfer_reason_set(why, size, "through host bridge %04x:%02x",
                            common->attr->bridge.downstream.pci.domain,
                            common->attr->bridge.downstream.pci.secondary_bus);
            return XFER_GDR_PATH_PHB;
        }
        at = &common->attr->bridge.upstream.pci;
        if ((bridges_between(gpu, common) <= 1) && (bridges_between(nic, common) <= 1)) {
            xfer_reason_set(why, size, "under one PCIe switch (%04x:%02x:%02x.%01x)",
                            at->domain, at->bus, at->dev, at->func);
            return XFER_GDR_PATH_PIX;
        }
        xfer_reason_set(why, size, "through PCIe switches below %04x:%02x:%02x.%01x, not "
                        "the host bridge", at->domain, at->bus, at->dev, at->func);
        return XFER_GDR_PATH_PXB;
    }
    if (hwloc_obj_type_is_io(common->type)) {
        xfer_reason_set(why, size, "distance unknown (they meet at a %s in hwloc's tree)",
                        hwloc_obj_type_string(common->type));
        return XFER_GDR_PATH_UNKNOWN;
    }
    gpu_cpu = hwloc_get_non_io_ancestor_obj(t, gpu);
    nic_cpu = hwloc_get_non_io_ancestor_obj(t, nic);
    if ((gpu_cpu->nodeset != NULL) && (nic_cpu->nodeset != NULL) &&
        !hwloc_bitmap_intersects(gpu_cpu->nodeset, nic_cpu->nodeset)) {
        xfer_reason_set(why, size, "across the CPU interconnect (NUMA node %d to %d)",
                        first_node(gpu_cpu), first_node(nic_cpu));
        return XFER_GDR_PATH_SYS;
    }
    xfer_reason_set(why, size, "through the CPU's host bridges (%s, NUMA node %d)",
                    hwloc_obj_type_string(common->type), first_node(common));
    return XFER_GDR_PATH_PHB;
}

#endif /* HAVE_HWLOC */

xfer_status_t xfer_gdr_topo_open(const char *xml_path, xfer_gdr_topo_t **topo_p)
{
    xfer_gdr_topo_t *topo = calloc(1, sizeof(*topo));

    if (topo == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
#ifdef HAVE_HWLOC
    load_hwloc(topo, xml_path);
#else
    (void)xml_path;
    xfer_reason_set(topo->source, sizeof(topo->source),
                    "distance unknown (built without hwloc)");
#endif
    *topo_p = topo;
    return XFER_OK;
}

void xfer_gdr_topo_close(xfer_gdr_topo_t *topo)
{
    if (topo == NULL) {
        return;
    }
#ifdef HAVE_HWLOC
    if (topo->hwloc != NULL) {
        hwloc_topology_destroy(topo->hwloc);
    }
#endif
    free(topo);
}

const char *xfer_gdr_topo_source(const xfer_gdr_topo_t *topo)
{
    return topo->source;
}

xfer_gdr_path_t xfer_gdr_topo_path(const xfer_gdr_topo_t *topo, const char *gpu_pci,
                                   const char *rdma_dev, char *why, size_t why_size)
{
#ifdef HAVE_HWLOC
    hwloc_obj_t gpu, nic;
    int is_virtual;

    if (topo->hwloc == NULL) {
        xfer_reason_set(why, why_size, "%s", topo->source);
        return XFER_GDR_PATH_UNKNOWN;
    }
    nic = rdma_pcidev(topo->hwloc, rdma_dev, &is_virtual, why, why_size);
    if (nic == NULL) {
        return is_virtual ? XFER_GDR_PATH_NONE : XFER_GDR_PATH_UNKNOWN;
    }
    gpu = hwloc_get_pcidev_by_busidstring(topo->hwloc, gpu_pci);
    if (gpu == NULL) {
        xfer_reason_set(why, why_size, "distance unknown (GPU %s is not in hwloc's tree)",
                        gpu_pci);
        return XFER_GDR_PATH_UNKNOWN;
    }
    return classify(topo->hwloc, gpu, nic, why, why_size);
#else
    (void)gpu_pci;
    (void)rdma_dev;
    xfer_reason_set(why, why_size, "%s", topo->source);
    return XFER_GDR_PATH_UNKNOWN;
#endif
}

static const char *device_attr(const xfer_device_attr_t *dev, const char *key)
{
    for (uint32_t i = 0; i < dev->num_attrs; i++) {
        if (strcmp(dev->attrs[i].key, key) == 0) {
            return dev->attrs[i].value;
        }
    }
    return NULL;
}

void xfer_gdr_topo_choose(const xfer_gdr_topo_t *topo, const char *gpu_pci,
                          const xfer_component_attr_t *attr, xfer_gdr_path_t level,
                          xfer_gdr_choice_t *choice_p)
{
    xfer_gdr_choice_t best = {.port = -1, .path = XFER_GDR_PATH_UNKNOWN};

    xfer_reason_set(best.why, sizeof(best.why), "no active RDMA port");
    for (uint32_t d = 0; d < attr->num_devices; d++) {
        const xfer_device_attr_t *dev = &attr->devices[d];
        const char *state = device_attr(dev, "state");
        char name[sizeof(dev->name)], why[XFER_REASON_MAX];
        xfer_gdr_path_t path;

        if ((strcmp(dev->kind, "rdma") != 0) || (state == NULL) ||
            (strcmp(state, ibv_port_state_str(IBV_PORT_ACTIVE)) != 0)) {
            continue;
        }
        snprintf(name, sizeof(name), "%s", dev->name);
        name[strcspn(name, ":")] = '\0';
        path = xfer_gdr_topo_path(topo, gpu_pci, name, why, sizeof(why));
        if ((best.port < 0) || (path < best.path)) {
            best.port = (int)d;
            best.path = path;
            xfer_reason_set(best.why, sizeof(best.why), "%s", why);
        }
    }
    best.within_level = (best.path <= level);
    *choice_p         = best;
}

/* The registration half of the plan, for a GPU whose NIC is within XFER_GDR_LEVEL. */
static void reg_plan(const xfer_gdr_reg_facts_t *facts, const char *bound, char *buf,
                     size_t size)
{
    char dmabuf[96] = "";
    int linux_ok = (facts->linux_major > 5) ||
                   ((facts->linux_major == 5) && (facts->linux_minor >= 12));

    if ((bound == NULL) || (strcmp(bound, "nvidia") != 0)) {
        xfer_reason_set(buf, size, "staging: the GPU is bound to %s, not nvidia",
                        (bound != NULL) ? bound : "no driver");
        return;
    }
    if ((facts->linux_major != 0) && !linux_ok) {
        xfer_reason_set(dmabuf, sizeof(dmabuf), "Linux %d.%d imports DMA-BUF into RDMA from "
                        "5.12", facts->linux_major, facts->linux_minor);
    } else if (facts->open_module == 0) {
        xfer_reason_set(dmabuf, sizeof(dmabuf), "the proprietary NVIDIA kernel module "
                        "exports no DMA-BUF");
    } else if ((facts->driver_major >= 0) && (facts->driver_major < 515)) {
        xfer_reason_set(dmabuf, sizeof(dmabuf), "NVIDIA driver %d exports DMA-BUF from 515",
                        facts->driver_major);
    }
    if (dmabuf[0] == '\0') {
        xfer_reason_set(buf, size, "dmabuf if the driver confirms at first registration, "
                        "else %s", facts->peermem ? "peermem (nvidia_peermem loaded)" :
                        "staging (nvidia_peermem not loaded)");
    } else if (facts->peermem) {
        xfer_reason_set(buf, size, "peermem (nvidia_peermem loaded); no DMA-BUF: %s", dmabuf);
    } else {
        xfer_reason_set(buf, size, "staging: nvidia_peermem not loaded and %s", dmabuf);
    }
}

void xfer_gdr_topo_describe_gpu(const xfer_gdr_topo_t *topo, xfer_gdr_path_t level,
                                const xfer_gdr_reg_facts_t *facts,
                                const xfer_component_attr_t *attr, xfer_device_attr_t *gpu)
{
    const char *pci = device_attr(gpu, "pci"), *port;
    char plan[XFER_REASON_MAX];
    xfer_gdr_choice_t choice;

    if (pci == NULL) {
        return;
    }
    xfer_gdr_topo_choose(topo, pci, attr, level, &choice);
    xfer_device_attr_add(gpu, "topology", "%s", xfer_gdr_topo_source(topo));
    if (choice.port < 0) {
        xfer_device_attr_add(gpu, "nic", "none: %s", choice.why);
        xfer_device_attr_add(gpu, "gdr_plan", "staging: %s", choice.why);
        return;
    }
    port = attr->devices[choice.port].name;
    if (choice.path > XFER_GDR_PATH_SYS) {
        xfer_device_attr_add(gpu, "nic", "%s: %s", port, choice.why);
        xfer_device_attr_add(gpu, "gdr_plan", "staging: %s", choice.why);
        return;
    }
    xfer_device_attr_add(gpu, "nic", "%s, %s: %s", port, xfer_gdr_level_names[choice.path],
                         choice.why);
    if (!choice.within_level) {
        xfer_device_attr_add(gpu, "gdr_plan", "staging: NIC %s is %s from GPU %s, beyond "
                             "XFER_GDR_LEVEL=%s", port, xfer_gdr_level_names[choice.path], pci,
                             xfer_gdr_level_names[level]);
    } else {
        reg_plan(facts, device_attr(gpu, "kernel_driver"), plan, sizeof(plan));
        xfer_device_attr_add(gpu, "gdr_plan", "%s", plan);
    }
}
