/*
 * The host's topology for the transports (xfer/topo.h): hwloc's tree of I/O objects - host
 * bridges under the CPU package or NUMA node they belong to, PCI bridges (switch ports) under
 * them, devices under the bridges and an RDMA device's OS device ("mlx5_0") under its PCI
 * function - and the questions transports ask of it.
 *
 * NCCL counts a PCIe switch, i.e. its upstream port and the downstream port a device hangs
 * from, as one hop. In hwloc's tree that is: the lowest bridge above both devices is a PCI
 * bridge and each device sits at most one bridge below it (PIX); deeper, they meet in a
 * switch of switches (PXB); they meet only at a host bridge, or in the CPU package when they
 * hang from different host bridges of one NUMA node, so that the traffic crosses the root
 * complex (PHB); their host bridges belong to CPU packages or NUMA nodes with disjoint memory,
 * so the traffic crosses the CPUs' interconnect (SYS).
 */
#include "config.h"

#include "xfer_int.h"

#include <xfer/topo.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_HWLOC
#include <hwloc.h>
#endif

#define TOPO_IB_CLASS_DIR "/sys/class/infiniband"
#define TOPO_MAX_DEPTH    64     /* ancestors kept when looking for a common one */

const char *const xfer_topo_path_names[] = {"PIX", "PXB", "PHB", "SYS", NULL};

struct xfer_topo {
#ifdef HAVE_HWLOC
    hwloc_topology_t hwloc;     /* NULL when it could not be loaded */
#endif
    char             source[XFER_REASON_MAX];
};

#ifdef HAVE_HWLOC

/* Keep the discovery components that would load a GPU runtime or open an X display out of
 * t, before it is loaded: 0, or -1 when this hwloc (older than 2.1) cannot keep them out. */
static int without_gpu_runtimes(hwloc_topology_t t)
{
#if HWLOC_API_VERSION >= 0x00020100
    static const char *const gpu_components[] = {"cuda", "nvml", "opencl", "rsmi",
                                                 "levelzero", "gl"};

    /* -1 for a component this hwloc was built without, which is as good */
    for (size_t i = 0; i < sizeof(gpu_components) / sizeof(gpu_components[0]); i++) {
        (void)hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                            gpu_components[i]);
    }
    return 0;
#else
    (void)t;
    return -1;
#endif
}

static void load_hwloc(xfer_topo_t *topo, const char *xml_path)
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
    if ((without_gpu_runtimes(t) != 0) && (xml_path == NULL) &&
        ((env_xml == NULL) || (*env_xml == '\0'))) {
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

/* The OS device hwloc names dev ("mlx5_0"), or NULL. */
static hwloc_obj_t osdev_by_name(hwloc_topology_t t, const char *dev)
{
    hwloc_obj_t obj = NULL;

    while ((obj = hwloc_get_next_osdev(t, obj)) != NULL) {
        if ((obj->name != NULL) && (strcmp(obj->name, dev) == 0)) {
            return obj;
        }
    }
    return NULL;
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
    obj        = osdev_by_name(t, dev);
    while ((obj != NULL) && (obj->type != HWLOC_OBJ_PCI_DEVICE)) {
        obj = obj->parent;
    }
    if (obj != NULL) {
        return obj;
    }

    snprintf(path, sizeof(path), "%s/%s", TOPO_IB_CLASS_DIR, dev);
    len = readlink(path, target, sizeof(target) - 1);
    if (len > 0) {
        target[len] = '\0';
        if (strstr(target, "/virtual/") != NULL) {
            xfer_reason_set(why, size, "%s has no PCI path (software RDMA device)", dev);
            return NULL;
        }
    }
    snprintf(path, sizeof(path), "%s/%s/device", TOPO_IB_CLASS_DIR, dev);
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
                    TOPO_IB_CLASS_DIR);
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
    hwloc_obj_t above_a[TOPO_MAX_DEPTH];
    int n = 0;

    for (; (a != NULL) && (n < TOPO_MAX_DEPTH); a = a->parent) {
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
static xfer_topo_path_t classify(hwloc_topology_t t, hwloc_obj_t gpu, hwloc_obj_t nic,
                                char *why, size_t size)
{
    hwloc_obj_t common = common_ancestor(gpu, nic), gpu_cpu, nic_cpu;

    if (common == NULL) {
        xfer_reason_set(why, size, "distance unknown (no common ancestor in hwloc's tree)");
        return XFER_TOPO_UNKNOWN;
    }
    if (common->type == HWLOC_OBJ_BRIDGE) {
        const struct hwloc_pcidev_attr_s *at;

        if (common->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
            xfer_reason_set(why, size, "through host bridge %04x:%02x",
                            common->attr->bridge.downstream.pci.domain,
                            common->attr->bridge.downstream.pci.secondary_bus);
            return XFER_TOPO_PHB;
        }
        at = &common->attr->bridge.upstream.pci;
        if ((bridges_between(gpu, common) <= 1) && (bridges_between(nic, common) <= 1)) {
            xfer_reason_set(why, size, "under one PCIe switch (%04x:%02x:%02x.%01x)",
                            at->domain, at->bus, at->dev, at->func);
            return XFER_TOPO_PIX;
        }
        xfer_reason_set(why, size, "through PCIe switches below %04x:%02x:%02x.%01x, not "
                        "the host bridge", at->domain, at->bus, at->dev, at->func);
        return XFER_TOPO_PXB;
    }
    if (hwloc_obj_type_is_io(common->type)) {
        xfer_reason_set(why, size, "distance unknown (they meet at a %s in hwloc's tree)",
                        hwloc_obj_type_string(common->type));
        return XFER_TOPO_UNKNOWN;
    }
    gpu_cpu = hwloc_get_non_io_ancestor_obj(t, gpu);
    nic_cpu = hwloc_get_non_io_ancestor_obj(t, nic);
    if ((gpu_cpu->nodeset != NULL) && (nic_cpu->nodeset != NULL) &&
        !hwloc_bitmap_intersects(gpu_cpu->nodeset, nic_cpu->nodeset)) {
        xfer_reason_set(why, size, "across the CPU interconnect (NUMA node %d to %d)",
                        first_node(gpu_cpu), first_node(nic_cpu));
        return XFER_TOPO_SYS;
    }
    xfer_reason_set(why, size, "through the CPU's host bridges (%s, NUMA node %d)",
                    hwloc_obj_type_string(common->type), first_node(common));
    return XFER_TOPO_PHB;
}

#endif /* HAVE_HWLOC */

xfer_status_t xfer_topo_open(const char *xml_path, xfer_topo_t **topo_p)
{
    xfer_topo_t *topo = calloc(1, sizeof(*topo));

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

void xfer_topo_close(xfer_topo_t *topo)
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

const char *xfer_topo_source(const xfer_topo_t *topo)
{
    return topo->source;
}

int xfer_topo_rdma_numa(const xfer_topo_t *topo, const char *rdma_dev)
{
#ifdef HAVE_HWLOC
    hwloc_obj_t obj;

    if ((topo == NULL) || (topo->hwloc == NULL) ||
        ((obj = osdev_by_name(topo->hwloc, rdma_dev)) == NULL)) {
        return -1;
    }
    obj = hwloc_get_non_io_ancestor_obj(topo->hwloc, obj);
    return (obj != NULL) ? first_node(obj) : -1;
#else
    (void)topo;
    (void)rdma_dev;
    return -1;
#endif
}

xfer_topo_path_t xfer_topo_path(const xfer_topo_t *topo, const char *gpu_pci,
                                   const char *rdma_dev, char *why, size_t why_size)
{
#ifdef HAVE_HWLOC
    hwloc_obj_t gpu, nic;
    int is_virtual;

    if (topo->hwloc == NULL) {
        xfer_reason_set(why, why_size, "%s", topo->source);
        return XFER_TOPO_UNKNOWN;
    }
    nic = rdma_pcidev(topo->hwloc, rdma_dev, &is_virtual, why, why_size);
    if (nic == NULL) {
        return is_virtual ? XFER_TOPO_NONE : XFER_TOPO_UNKNOWN;
    }
    gpu = hwloc_get_pcidev_by_busidstring(topo->hwloc, gpu_pci);
    if (gpu == NULL) {
        xfer_reason_set(why, why_size, "distance unknown (GPU %s is not in hwloc's tree)",
                        gpu_pci);
        return XFER_TOPO_UNKNOWN;
    }
    return classify(topo->hwloc, gpu, nic, why, why_size);
#else
    (void)gpu_pci;
    (void)rdma_dev;
    xfer_reason_set(why, why_size, "%s", topo->source);
    return XFER_TOPO_UNKNOWN;
#endif
}

