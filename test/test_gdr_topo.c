/*
 * The framework's topology (framework/topo.c: distances, NUMA nodes) and gdr's choice of a NIC
 * for each GPU (components/gdr/gdr_topo.c) over hwloc topologies read from XML:
 * test/topo/two_sockets.xml is a two-socket server whose GPUs sit at each distance from its
 * NICs:
 *
 *   package 0, host bridge 0000:00
 *     root port 00:01.0 - switch 01:00.0 - switch 03:00.0 - GPU 05:00.0, mlx5_0 (06:00.0)
 *                                        - switch 07:00.0 - GPU 09:00.0
 *     root port 00:02.0 - GPU 0a:00.0
 *   package 0, host bridge 0000:20
 *     root port 20:01.0 - GPU 21:00.0
 *   package 1, host bridge 0000:80
 *     root ports 80:01.0 - mlx5_1, 80:02.0 - GPU 82:00.0, 80:03.0 - mlx5_2
 *
 * The RDMA ports the choice ranges over are written here as verbs_devices.c writes them
 * into a query's result, since the devices of an XML topology are not on this host; one test
 * takes the host's real ports from verbs_devices.c, and one the host's real software device
 * (both run in the Soft-RoCE guest, rxe0, and skip elsewhere). The component's own query,
 * which takes the GPUs from sysfs, is covered by test_info.c and test_cuda.c.
 */
#include "test_util.h"

#include "../components/gdr/gdr_topo.h"
#include "../components/verbs/verbs_devices.h"

#include <criterion/criterion.h>
#include <infiniband/verbs.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GPU_SWITCH   "0000:05:00.0"   /* PIX from mlx5_0 */
#define GPU_SWITCHES "0000:09:00.0"   /* PXB from mlx5_0 */
#define GPU_ROOT     "0000:0a:00.0"   /* PHB from mlx5_0: the same host bridge */
#define GPU_OTHER_HB "0000:21:00.0"   /* PHB from mlx5_0: another host bridge, same package */
#define GPU_SOCKET1  "0000:82:00.0"   /* SYS from mlx5_0, PHB from mlx5_1 and mlx5_2 */

/* a port's state as verbs_devices.c writes it */
#define ACTIVE ibv_port_state_str(IBV_PORT_ACTIVE)
#define DOWN   ibv_port_state_str(IBV_PORT_DOWN)

static xfer_topo_t *topo;
static xfer_component_attr_t *attr;
static char xml[1024];

static void setup(void)
{
    const char *src = getenv("XFERTEST_SRC_DIR");

    cr_assert(src != NULL, "XFERTEST_SRC_DIR is set by make check");
    snprintf(xml, sizeof(xml), "%s/test/topo/two_sockets.xml", src);
    cr_assert_eq(xfer_topo_open(xml, &topo), XFER_OK);
    attr = calloc(1, sizeof(*attr));
    cr_assert(attr != NULL);
}

static void teardown(void)
{
    xfer_topo_close(topo);
    free(attr);
}

TestSuite(gdr_topo, .init = setup, .fini = teardown);

static void add_port(const char *name, const char *state)
{
    xfer_device_attr_t *dev = &attr->devices[attr->num_devices++];

    memset(dev, 0, sizeof(*dev));
    snprintf(dev->name, sizeof(dev->name), "%s", name);
    snprintf(dev->kind, sizeof(dev->kind), "rdma");
    dev->numa_node = -1;
    xfer_device_attr_add(dev, "state", "%s", state);
}

static xfer_device_attr_t *add_gpu(const char *pci, const char *bound)
{
    xfer_device_attr_t *dev = &attr->devices[attr->num_devices++];

    memset(dev, 0, sizeof(*dev));
    snprintf(dev->name, sizeof(dev->name), "gpu%u", attr->num_devices - 1);
    snprintf(dev->kind, sizeof(dev->kind), "gpu");
    dev->numa_node = -1;
    xfer_device_attr_add(dev, "pci", "%s", pci);
    xfer_device_attr_add(dev, "kernel_driver", "%s", bound);
    return dev;
}

static const char *attr_of(const xfer_device_attr_t *dev, const char *key)
{
    for (uint32_t i = 0; i < dev->num_attrs; i++) {
        if (strcmp(dev->attrs[i].key, key) == 0) {
            return dev->attrs[i].value;
        }
    }
    return "(absent)";
}

/* Whether a library whose name contains part is mapped into this process. */
static int maps_contain(const char *part)
{
    char line[1024];
    int found = 0;
    FILE *f   = fopen("/proc/self/maps", "r");

    cr_assert_not_null(f, "cannot read /proc/self/maps");
    while (!found && (fgets(line, sizeof(line), f) != NULL)) {
        found = (strstr(line, part) != NULL);
    }
    fclose(f);
    return found;
}

static xfer_topo_path_t path(const char *gpu, const char *nic, char *why, size_t size)
{
    return xfer_topo_path(topo, gpu, nic, why, size);
}

#define expect_contains(_text, _part) \
    cr_expect(strstr((_text), (_part)) != NULL, "'%s' lacks '%s'", (_text), (_part))

/* An open kernel module 550 on Linux 6.1 with nvidia_peermem: every way is open. */
static const xfer_gdr_reg_facts_t all_ways = {
    .peermem = 1, .open_module = 1, .driver_major = 550, .linux_major = 6, .linux_minor = 1,
};

Test(gdr_topo, source_names_the_xml)
{
    expect_contains(xfer_topo_source(topo), "hwloc ");
    expect_contains(xfer_topo_source(topo), "PCI tree from XML ");
    expect_contains(xfer_topo_source(topo), "two_sockets.xml");
}

Test(gdr_topo, same_switch_is_pix)
{
    char why[XFER_REASON_MAX];

    cr_expect_eq(path(GPU_SWITCH, "mlx5_0", why, sizeof(why)), XFER_TOPO_PIX, "%s", why);
    expect_contains(why, "under one PCIe switch (0000:03:00.0)");
}

Test(gdr_topo, switches_below_one_root_port_are_pxb)
{
    char why[XFER_REASON_MAX];

    cr_expect_eq(path(GPU_SWITCHES, "mlx5_0", why, sizeof(why)), XFER_TOPO_PXB, "%s", why);
    expect_contains(why, "through PCIe switches below 0000:01:00.0, not the host bridge");
}

Test(gdr_topo, host_bridge_is_phb)
{
    char why[XFER_REASON_MAX];

    cr_expect_eq(path(GPU_ROOT, "mlx5_0", why, sizeof(why)), XFER_TOPO_PHB, "%s", why);
    expect_contains(why, "through host bridge 0000:00");
    /* two host bridges of one package: still through the CPU, not across CPUs */
    cr_expect_eq(path(GPU_OTHER_HB, "mlx5_0", why, sizeof(why)), XFER_TOPO_PHB, "%s",
                 why);
    expect_contains(why, "through the CPU's host bridges (Package, NUMA node 0)");
    cr_expect_eq(path(GPU_SOCKET1, "mlx5_1", why, sizeof(why)), XFER_TOPO_PHB, "%s", why);
}

Test(gdr_topo, other_socket_is_sys)
{
    char why[XFER_REASON_MAX];

    cr_expect_eq(path(GPU_SOCKET1, "mlx5_0", why, sizeof(why)), XFER_TOPO_SYS, "%s", why);
    expect_contains(why, "across the CPU interconnect (NUMA node 1 to 0)");
    cr_expect_eq(path(GPU_SWITCH, "mlx5_2", why, sizeof(why)), XFER_TOPO_SYS, "%s", why);
    expect_contains(why, "(NUMA node 0 to 1)");
}

Test(gdr_topo, an_rdma_device_is_on_its_package_s_numa_node)
{
    xfer_topo_t *bad;

    cr_expect_eq(xfer_topo_rdma_numa(topo, "mlx5_0"), 0);
    cr_expect_eq(xfer_topo_rdma_numa(topo, "mlx5_1"), 1);
    cr_expect_eq(xfer_topo_rdma_numa(topo, "mlx5_2"), 1);
    /* not in the tree (a software device), or no tree at all: unknown */
    cr_expect_eq(xfer_topo_rdma_numa(topo, "rxe0"), -1);
    cr_assert_eq(xfer_topo_open("/nonexistent/topo.xml", &bad), XFER_OK);
    cr_expect_eq(xfer_topo_rdma_numa(bad, "mlx5_0"), -1);
    xfer_topo_close(bad);
    cr_expect_eq(xfer_topo_rdma_numa(NULL, "mlx5_0"), -1);
}

Test(gdr_topo, software_device_has_no_pci_path)
{
    char why[XFER_REASON_MAX];

    /* rxe0 is not in the XML's tree; on a host that has it, sysfs places it under
     * /devices/virtual; either way it has no PCI path */
    cr_expect_eq(path(GPU_SWITCH, "rxe0", why, sizeof(why)), XFER_TOPO_NONE, "%s", why);
    expect_contains(why, "rxe0 has no PCI path");
}

Test(gdr_topo, gpu_missing_from_the_tree_is_unknown)
{
    char why[XFER_REASON_MAX];

    cr_expect_eq(path("0000:aa:00.0", "mlx5_0", why, sizeof(why)), XFER_TOPO_UNKNOWN);
    expect_contains(why, "GPU 0000:aa:00.0 is not in hwloc's tree");
}

Test(gdr_topo, unreadable_xml_says_why)
{
    xfer_topo_t *bad;
    char why[XFER_REASON_MAX];

    cr_assert_eq(xfer_topo_open("/nonexistent/topo.xml", &bad), XFER_OK);
    expect_contains(xfer_topo_source(bad), "distance unknown (hwloc cannot read "
                    "/nonexistent/topo.xml");
    cr_expect_eq(xfer_topo_path(bad, GPU_SWITCH, "mlx5_0", why, sizeof(why)),
                 XFER_TOPO_UNKNOWN);
    expect_contains(why, "hwloc cannot read");
    xfer_topo_close(bad);
}

Test(gdr_topo, hwloc_xmlfile_replaces_the_host_tree)
{
    xfer_topo_t *env_topo;
    char why[XFER_REASON_MAX];

    /* the component opens the host's tree (NULL); hwloc's own variable points it elsewhere */
    setenv("HWLOC_XMLFILE", xml, 1);
    cr_assert_eq(xfer_topo_open(NULL, &env_topo), XFER_OK);
    unsetenv("HWLOC_XMLFILE");
    expect_contains(xfer_topo_source(env_topo), "two_sockets.xml");
    cr_expect_eq(xfer_topo_path(env_topo, GPU_SWITCH, "mlx5_0", why, sizeof(why)),
                 XFER_TOPO_PIX, "%s", why);
    xfer_topo_close(env_topo);
}

Test(gdr_topo, host_tree_loads_without_a_gpu_runtime)
{
    xfer_topo_t *host;
    char why[XFER_REASON_MAX];

    unsetenv("HWLOC_XMLFILE");
    cr_assert_eq(xfer_topo_open(NULL, &host), XFER_OK);
    expect_contains(xfer_topo_source(host), "this host's PCI tree");
    /* no such GPU here: said, not guessed */
    cr_expect_eq(xfer_topo_path(host, "0000:aa:00.0", "nosuchdev0", why, sizeof(why)),
                 XFER_TOPO_NONE);
    expect_contains(why, "nosuchdev0 has no PCI path");
    cr_expect_not(maps_contain("libcuda"), "loading the host's tree mapped libcuda");
    cr_expect_not(maps_contain("libnvidia-ml"), "loading the host's tree mapped NVML");
    xfer_topo_close(host);
}

/* The first RDMA device of this host that sysfs places under /devices/virtual (rxe, siw). */
static int host_virtual_rdma(char *name, size_t size)
{
    char path[512], target[512];
    struct dirent *de;
    int found = 0;
    DIR *d    = opendir("/sys/class/infiniband");

    while (!found && (d != NULL) && ((de = readdir(d)) != NULL)) {
        ssize_t len;

        snprintf(path, sizeof(path), "/sys/class/infiniband/%s", de->d_name);
        len = readlink(path, target, sizeof(target) - 1);
        if ((de->d_name[0] != '.') && (len > 0)) {
            target[len] = '\0';
            found       = (strstr(target, "/virtual/") != NULL);
            snprintf(name, size, "%s", de->d_name);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return found;
}

Test(gdr_topo, host_software_device_is_said_so)
{
    xfer_topo_t *host;
    char dev[256], why[XFER_REASON_MAX], expect[300];

    if (!host_virtual_rdma(dev, sizeof(dev))) {
        cr_skip_test("no software RDMA device here (the Soft-RoCE guest has rxe0)");
    }
    unsetenv("HWLOC_XMLFILE");
    cr_assert_eq(xfer_topo_open(NULL, &host), XFER_OK);
    cr_expect_eq(xfer_topo_path(host, "0000:00:00.0", dev, why, sizeof(why)),
                 XFER_TOPO_NONE, "%s", why);
    snprintf(expect, sizeof(expect), "%s has no PCI path (software RDMA device)", dev);
    cr_expect_str_eq(why, expect);
    xfer_topo_close(host);
}

Test(gdr_topo, ports_as_verbs_describes_them_are_understood)
{
    unsigned found, active;
    xfer_gdr_choice_t choice;
    double mbs;

    /* the query's own port list (verbs_devices.c), not one written here */
    cr_assert_eq(xfer_verbs_describe_ports("", NULL, attr, &found, &active, &mbs), XFER_OK);
    if (active == 0) {
        cr_skip_test("no active RDMA port here (the Soft-RoCE guest has rxe0:1)");
    }
    xfer_gdr_topo_choose(topo, GPU_SWITCH, attr, XFER_TOPO_SYS, &choice);
    cr_assert_geq(choice.port, 0, "none of %u active ports was taken as active: %s", active,
                  choice.why);
    cr_expect_str_eq(attr->devices[choice.port].kind, "rdma");
}

Test(gdr_topo, closest_active_port_wins)
{
    xfer_gdr_choice_t choice;

    add_port("mlx5_1:1", ACTIVE);    /* SYS from GPU_SWITCH, listed first */
    add_port("mlx5_0:1", ACTIVE);    /* PIX */
    xfer_gdr_topo_choose(topo, GPU_SWITCH, attr, XFER_TOPO_PXB, &choice);
    cr_expect_eq(choice.port, 1);
    cr_expect_eq(choice.path, XFER_TOPO_PIX);
    cr_expect(choice.within_level);
}

Test(gdr_topo, inactive_port_is_not_chosen)
{
    xfer_gdr_choice_t choice;

    add_port("mlx5_0:1", DOWN);
    add_port("mlx5_1:1", ACTIVE);
    xfer_gdr_topo_choose(topo, GPU_SWITCH, attr, XFER_TOPO_SYS, &choice);
    cr_expect_eq(choice.port, 1);
    cr_expect_eq(choice.path, XFER_TOPO_SYS);
    cr_expect(choice.within_level);
}

Test(gdr_topo, tie_goes_to_the_first_port)
{
    xfer_gdr_choice_t choice;

    add_port("mlx5_2:1", ACTIVE);    /* both PHB from GPU_SOCKET1 */
    add_port("mlx5_1:1", ACTIVE);
    xfer_gdr_topo_choose(topo, GPU_SOCKET1, attr, XFER_TOPO_PXB, &choice);
    cr_expect_eq(choice.port, 0);
    cr_expect_eq(choice.path, XFER_TOPO_PHB);
    cr_expect_not(choice.within_level, "PHB is beyond PXB");

    attr->num_devices = 0;
    add_port("mlx5_1:1", ACTIVE);
    add_port("mlx5_2:1", ACTIVE);
    xfer_gdr_topo_choose(topo, GPU_SOCKET1, attr, XFER_TOPO_PHB, &choice);
    cr_expect_eq(choice.port, 0);
    cr_expect(choice.within_level);
}

Test(gdr_topo, level_cuts_off_with_the_reason)
{
    xfer_device_attr_t *gpu;

    add_port("mlx5_0:1", ACTIVE);
    gpu = add_gpu(GPU_SOCKET1, "nvidia");
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_PHB, &all_ways, attr, gpu);
    cr_expect_str_eq(attr_of(gpu, "nic"), "mlx5_0:1, SYS: across the CPU interconnect (NUMA "
                     "node 1 to 0)");
    cr_expect_str_eq(attr_of(gpu, "gdr_plan"), "staging: NIC mlx5_0:1 is SYS from GPU "
                     "0000:82:00.0, beyond XFER_GDR_LEVEL=PHB");
    expect_contains(attr_of(gpu, "topology"), "two_sockets.xml");

    /* PXB is within PXB and beyond PIX */
    gpu = add_gpu(GPU_SWITCHES, "nvidia");
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_PXB, &all_ways, attr, gpu);
    cr_expect_str_eq(attr_of(gpu, "gdr_plan"), "dmabuf if the driver confirms at first "
                     "registration, else peermem (nvidia_peermem loaded)");
    gpu = add_gpu(GPU_SWITCHES, "nvidia");
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_PIX, &all_ways, attr, gpu);
    cr_expect_str_eq(attr_of(gpu, "gdr_plan"), "staging: NIC mlx5_0:1 is PXB from GPU "
                     "0000:09:00.0, beyond XFER_GDR_LEVEL=PIX");

    /* SYS lets everything through */
    gpu = add_gpu(GPU_SOCKET1, "nvidia");
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_SYS, &all_ways, attr, gpu);
    expect_contains(attr_of(gpu, "gdr_plan"), "dmabuf if the driver confirms");
}

Test(gdr_topo, software_port_means_staging)
{
    xfer_device_attr_t *gpu;

    add_port("rxe0:1", ACTIVE);
    gpu = add_gpu(GPU_SWITCH, "nvidia");
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_SYS, &all_ways, attr, gpu);
    expect_contains(attr_of(gpu, "nic"), "rxe0:1: rxe0 has no PCI path");
    expect_contains(attr_of(gpu, "gdr_plan"), "staging: rxe0 has no PCI path");
}

Test(gdr_topo, no_active_port_means_staging)
{
    xfer_device_attr_t *gpu;

    add_port("mlx5_0:1", DOWN);
    gpu = add_gpu(GPU_SWITCH, "nvidia");
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_SYS, &all_ways, attr, gpu);
    cr_expect_str_eq(attr_of(gpu, "nic"), "none: no active RDMA port");
    cr_expect_str_eq(attr_of(gpu, "gdr_plan"), "staging: no active RDMA port");
}

/* The registration half of the plan, for a GPU whose NIC is close enough. */
static const char *plan_with(const xfer_gdr_reg_facts_t *facts, const char *bound)
{
    xfer_device_attr_t *gpu;

    attr->num_devices = 0;
    add_port("mlx5_0:1", ACTIVE);
    gpu = add_gpu(GPU_SWITCH, bound);
    xfer_gdr_topo_describe_gpu(topo, XFER_TOPO_PXB, facts, attr, gpu);
    return attr_of(gpu, "gdr_plan");
}

Test(gdr_topo, plan_follows_what_the_kernel_allows)
{
    xfer_gdr_reg_facts_t f = all_ways;

    f.peermem = 0;
    cr_expect_str_eq(plan_with(&f, "nvidia"), "dmabuf if the driver confirms at first "
                     "registration, else staging (nvidia_peermem not loaded)");
    f = all_ways;
    f.open_module = 0;
    cr_expect_str_eq(plan_with(&f, "nvidia"), "peermem (nvidia_peermem loaded); no DMA-BUF: "
                     "the proprietary NVIDIA kernel module exports no DMA-BUF");
    f.peermem = 0;
    cr_expect_str_eq(plan_with(&f, "nvidia"), "staging: nvidia_peermem not loaded and the "
                     "proprietary NVIDIA kernel module exports no DMA-BUF");
    f = all_ways;
    f.driver_major = 470;
    expect_contains(plan_with(&f, "nvidia"), "no DMA-BUF: NVIDIA driver 470 exports DMA-BUF "
                    "from 515");
    f = all_ways;
    f.linux_major = 5;
    f.linux_minor = 4;
    expect_contains(plan_with(&f, "nvidia"), "no DMA-BUF: Linux 5.4 imports DMA-BUF into RDMA "
                    "from 5.12");
    /* what is unknown is left to the driver, not assumed absent */
    f = all_ways;
    f.open_module  = -1;
    f.driver_major = -1;
    expect_contains(plan_with(&f, "nvidia"), "dmabuf if the driver confirms");
    cr_expect_str_eq(plan_with(&all_ways, "vfio-pci"), "staging: the GPU is bound to vfio-pci, "
                     "not nvidia");
}
