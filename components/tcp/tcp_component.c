/*
 * The tcp component: TCP sockets over any IP interface; works everywhere and is the embedded
 * default. This file holds the component descriptor, its parameters and query(). The data path
 * is not implemented yet, so no capability bit is claimed and the op slots stay empty.
 */
#include "config.h"

#include <xfer/component.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct xfer_tcp_config {
    char *iface;    /* comma-separated interface names; "" = all */
} xfer_tcp_config_t;

static const xfer_param_desc_t tcp_params[] = {
    {"IFACE", XFER_PARAM_STRING, "",
     "Comma-separated network interfaces to use (e.g. 'lo,eth0'); empty means all that are up.",
     offsetof(xfer_tcp_config_t, iface), 0, 0, NULL},
    {NULL}
};

static int iface_selected(const xfer_tcp_config_t *cfg, const char *name)
{
    const char *p = cfg->iface;
    size_t len    = strlen(name);

    if ((p == NULL) || (*p == '\0')) {
        return 1;
    }
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t n        = end ? (size_t)(end - p) : strlen(p);
        if ((n == len) && (strncmp(p, name, n) == 0)) {
            return 1;
        }
        p += n + (end ? 1 : 0);
    }
    return 0;
}

static xfer_device_attr_t *device_find_or_add(xfer_component_attr_t *attr, const char *name)
{
    xfer_device_attr_t *dev;
    char path[128];
    FILE *f;

    for (uint32_t i = 0; i < attr->num_devices; i++) {
        if (strcmp(attr->devices[i].name, name) == 0) {
            return &attr->devices[i];
        }
    }
    if (attr->num_devices >= XFER_DEVICE_MAX) {
        return NULL;
    }
    dev = &attr->devices[attr->num_devices++];
    memset(dev, 0, sizeof(*dev));
    snprintf(dev->name, sizeof(dev->name), "%s", name);
    snprintf(dev->kind, sizeof(dev->kind), "net");
    dev->numa_node = -1;
    snprintf(path, sizeof(path), "/sys/class/net/%s/device/numa_node", name);
    f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &dev->numa_node) != 1) {
            dev->numa_node = -1;
        }
        fclose(f);
    }
    return dev;
}

static void device_add_link_attrs(xfer_device_attr_t *dev, int sock, unsigned flags)
{
    struct ifreq ifr;

    xfer_device_attr_add(dev, "state", "%s", (flags & IFF_RUNNING) ? "running" :
                                             (flags & IFF_UP) ? "up" : "down");
    if (flags & IFF_LOOPBACK) {
        xfer_device_attr_add(dev, "loopback", "yes");
    }
    memset(&ifr, 0, sizeof(ifr));
    if (strlen(dev->name) >= sizeof(ifr.ifr_name)) {
        return;
    }
    memcpy(ifr.ifr_name, dev->name, strlen(dev->name) + 1);
    if ((sock >= 0) && (ioctl(sock, SIOCGIFMTU, &ifr) == 0)) {
        xfer_device_attr_add(dev, "mtu", "%d", ifr.ifr_mtu);
    }
}

static xfer_status_t tcp_query(const void *config, xfer_component_attr_t *attr)
{
    const xfer_tcp_config_t *cfg = config;
    struct ifaddrs *ifa_list, *ifa;
    int sock;

    if (getifaddrs(&ifa_list) != 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "getifaddrs() failed: %s",
                        strerror(errno));
        return XFER_ERR_IO;
    }
    sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    for (ifa = ifa_list; ifa != NULL; ifa = ifa->ifa_next) {
        char addr[INET6_ADDRSTRLEN];
        xfer_device_attr_t *dev;
        int fresh;
        const void *src;

        if ((ifa->ifa_addr == NULL) || !(ifa->ifa_flags & IFF_UP) ||
            ((ifa->ifa_addr->sa_family != AF_INET) && (ifa->ifa_addr->sa_family != AF_INET6)) ||
            !iface_selected(cfg, ifa->ifa_name)) {
            continue;
        }
        fresh = 1;
        for (uint32_t i = 0; i < attr->num_devices; i++) {
            fresh &= (strcmp(attr->devices[i].name, ifa->ifa_name) != 0);
        }
        dev = device_find_or_add(attr, ifa->ifa_name);
        if (dev == NULL) {
            continue;
        }
        if (fresh) {
            device_add_link_attrs(dev, sock, ifa->ifa_flags);
        }
        src = (ifa->ifa_addr->sa_family == AF_INET) ?
                      (const void*)&((struct sockaddr_in*)ifa->ifa_addr)->sin_addr :
                      (const void*)&((struct sockaddr_in6*)ifa->ifa_addr)->sin6_addr;
        if (inet_ntop(ifa->ifa_addr->sa_family, src, addr, sizeof(addr)) != NULL) {
            xfer_device_attr_add(dev, (ifa->ifa_addr->sa_family == AF_INET) ? "inet" : "inet6",
                                 "%s", addr);
        }
    }
    if (sock >= 0) {
        close(sock);
    }
    freeifaddrs(ifa_list);

    if (attr->num_devices == 0) {
        attr->available = 0;
        if ((cfg->iface != NULL) && (*cfg->iface != '\0')) {
            xfer_reason_set(attr->reason, sizeof(attr->reason), "no interface that is up "
                            "matches XFER_TCP_IFACE=%s", cfg->iface);
        } else {
            xfer_reason_set(attr->reason, sizeof(attr->reason), "no network interface is up");
        }
        return XFER_OK;
    }
    attr->available = 1;
    attr->caps      = 0; /* the data path arrives with the TCP data-path issue */
    /* Ranking estimates for a kernel TCP stack: tens of microseconds, about a GB/s. */
    attr->latency_us    = 20.0;
    attr->bandwidth_mbs = 1000.0;
    return XFER_OK;
}

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    .abi_version = XFER_COMPONENT_ABI_V1,
    .size        = sizeof(xfer_component_v1_t),
    .name        = "tcp",
    .version     = PACKAGE_VERSION,
    .description = "TCP sockets over any IP interface",
    .params      = tcp_params,
    .config_size = sizeof(xfer_tcp_config_t),
    .query       = tcp_query,
};
