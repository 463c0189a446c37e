/*
 * gdr's reading of the host's topology (xfer/topo.h gives the PCIe distance between a GPU and
 * each RDMA device, classified as NCCL does): the active port nearest each GPU, and the plan
 * that follows for its memory. Staging when no active port is within XFER_GDR_LEVEL, else the
 * registration the kernel allows, known without cuInit as far as it can be: DMA-BUF is
 * exported by NVIDIA's open kernel modules from release 515 and imported by RDMA from Linux
 * 5.12, and the driver itself confirms it at the first registration; nvidia-peermem is
 * there or not.
 */
#include "config.h"

#include "gdr_topo.h"

#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

static const char *device_attr(const xfer_device_attr_t *dev, const char *key)
{
    for (uint32_t i = 0; i < dev->num_attrs; i++) {
        if (strcmp(dev->attrs[i].key, key) == 0) {
            return dev->attrs[i].value;
        }
    }
    return NULL;
}

void xfer_gdr_topo_choose(const xfer_topo_t *topo, const char *gpu_pci,
                          const xfer_component_attr_t *attr, xfer_topo_path_t level,
                          xfer_gdr_choice_t *choice_p)
{
    xfer_gdr_choice_t best = {.port = -1, .path = XFER_TOPO_UNKNOWN};

    xfer_reason_set(best.why, sizeof(best.why), "no active RDMA port");
    for (uint32_t d = 0; d < attr->num_devices; d++) {
        const xfer_device_attr_t *dev = &attr->devices[d];
        const char *state = device_attr(dev, "state");
        char name[sizeof(dev->name)], why[XFER_REASON_MAX];
        xfer_topo_path_t path;

        if ((strcmp(dev->kind, "rdma") != 0) || (state == NULL) ||
            (strcmp(state, ibv_port_state_str(IBV_PORT_ACTIVE)) != 0)) {
            continue;
        }
        snprintf(name, sizeof(name), "%s", dev->name);
        name[strcspn(name, ":")] = '\0';
        path = xfer_topo_path(topo, gpu_pci, name, why, sizeof(why));
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

void xfer_gdr_topo_describe_gpu(const xfer_topo_t *topo, xfer_topo_path_t level,
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
    xfer_device_attr_add(gpu, "topology", "%s", xfer_topo_source(topo));
    if (choice.port < 0) {
        xfer_device_attr_add(gpu, "nic", "none: %s", choice.why);
        xfer_device_attr_add(gpu, "gdr_plan", "staging: %s", choice.why);
        return;
    }
    port = attr->devices[choice.port].name;
    if (choice.path > XFER_TOPO_SYS) {
        xfer_device_attr_add(gpu, "nic", "%s: %s", port, choice.why);
        xfer_device_attr_add(gpu, "gdr_plan", "staging: %s", choice.why);
        return;
    }
    xfer_device_attr_add(gpu, "nic", "%s, %s: %s", port, xfer_topo_path_names[choice.path],
                         choice.why);
    if (!choice.within_level) {
        xfer_device_attr_add(gpu, "gdr_plan", "staging: NIC %s is %s from GPU %s, beyond "
                             "XFER_GDR_LEVEL=%s", port, xfer_topo_path_names[choice.path], pci,
                             xfer_topo_path_names[level]);
    } else {
        reg_plan(facts, device_attr(gpu, "kernel_driver"), plan, sizeof(plan));
        xfer_device_attr_add(gpu, "gdr_plan", "%s", plan);
    }
}
