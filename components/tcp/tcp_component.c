/*
 * The tcp component: TCP sockets over any IP interface; works everywhere and is the embedded
 * default. This file holds the component descriptor, its parameters and query(); the data
 * path lives in tcp_iface.c (progress, events), tcp_ep.c (connections), tcp_tx.c (sending),
 * tcp_rx.c (receiving), tcp_tag.c, tcp_rma.c and tcp_tensor.c, speaking the protocol of
 * tcp_wire.h.
 */
#include "config.h"

#include "tcp.h"

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

static const xfer_param_desc_t tcp_params[] = {
    {"IFACE", XFER_PARAM_STRING, "",
     "Comma-separated network interfaces to use (e.g. 'lo,eth0'); empty means all that are up.",
     offsetof(xfer_tcp_config_t, iface), 0, 0, NULL},
    {"EAGER_THRESHOLD", XFER_PARAM_SIZE, "16k",
     "Messages (and put/get data) up to this size are copied into the endpoint's send buffer, "
     "so that many go out in one write and a send completes at once; larger ones are written "
     "straight from the caller's buffer and complete when written.",
     offsetof(xfer_tcp_config_t, eager_threshold), 0, 1024.0 * 1024.0, NULL},
    {"MAX_MSG_SIZE", XFER_PARAM_SIZE, "1g",
     "Largest tag message, put/get or tensor this side sends or accepts. A peer announcing a "
     "longer frame is treated as broken and its connection closed.",
     offsetof(xfer_tcp_config_t, max_msg_size), 1, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"SNDBUF", XFER_PARAM_SIZE, "0",
     "Socket send buffer size (SO_SNDBUF); 0 keeps the system default and its auto-tuning.",
     offsetof(xfer_tcp_config_t, sndbuf), 0, 1024.0 * 1024.0 * 1024.0, NULL},
    {"RCVBUF", XFER_PARAM_SIZE, "0",
     "Socket receive buffer size (SO_RCVBUF); 0 keeps the system default and its auto-tuning.",
     offsetof(xfer_tcp_config_t, rcvbuf), 0, 1024.0 * 1024.0 * 1024.0, NULL},
    {"KEEPALIVE", XFER_PARAM_BOOL, "y",
     "Send TCP keepalive probes on idle connections (SO_KEEPALIVE), so that a peer that "
     "vanished is detected after KEEPIDLE + KEEPINTVL * KEEPCNT (with USER_TIMEOUT set, "
     "Linux gives up once USER_TIMEOUT passed without an answer).",
     offsetof(xfer_tcp_config_t, keepalive), 0, 0, NULL},
    {"KEEPIDLE", XFER_PARAM_TIME, "10s",
     "Idle time before the first keepalive probe (TCP_KEEPIDLE; whole seconds).",
     offsetof(xfer_tcp_config_t, keepidle), 1, 32767, NULL},
    {"KEEPINTVL", XFER_PARAM_TIME, "2s",
     "Time between keepalive probes (TCP_KEEPINTVL; whole seconds).",
     offsetof(xfer_tcp_config_t, keepintvl), 1, 32767, NULL},
    {"KEEPCNT", XFER_PARAM_UINT, "5",
     "Unanswered keepalive probes before the connection is declared dead (TCP_KEEPCNT).",
     offsetof(xfer_tcp_config_t, keepcnt), 1, 127, NULL},
    {"USER_TIMEOUT", XFER_PARAM_TIME, "30s",
     "How long sent data may stay unacknowledged before the connection is declared dead "
     "(TCP_USER_TIMEOUT); 0 keeps the system default (many minutes of retransmissions).",
     offsetof(xfer_tcp_config_t, user_timeout), 0, 2000000, NULL},
    {"MAX_RESPONSE_BACKLOG", XFER_PARAM_SIZE, "64m",
     "Bytes of answers to a peer's requests (put acknowledgements, get data, tensors) queued "
     "and not yet written, each counting 64 bytes more; past it the endpoint stops reading "
     "the peer's requests until half has gone, so that a peer that asks without reading "
     "cannot make this side queue without bound.",
     offsetof(xfer_tcp_config_t, max_backlog), 4096, 1ull << 40, NULL},
    {"CUDA_CHUNK", XFER_PARAM_SIZE, "1m",
     "Bytes of one pinned bounce buffer through which CUDA device memory is read from and "
     "written to the socket; the copy of one overlaps the socket's work on the next.",
     offsetof(xfer_tcp_config_t, cuda_chunk), 4096, 1ull << 30, NULL},
    {"CUDA_DEPTH", XFER_PARAM_UINT, "4",
     "Bounce buffers for CUDA memory in each direction (receive, send) of an iface, allocated "
     "on the first registration of CUDA memory.",
     offsetof(xfer_tcp_config_t, cuda_depth), 2, XFER_TCP_CUDA_DEPTH_MAX, NULL},
    {"PUT_ACK", XFER_PARAM_BOOL, "n",
     "n: a put completes once its data is handed to the socket (its buffer may be reused); "
     "a flush of the endpoint then completes once the data of every put before it is in the "
     "peer's memory, and fails with the status of a put the peer refused. y: every put "
     "waits for the peer's acknowledgement, a round trip each, and completes when its data "
     "is in the peer's memory or with the peer's error.",
     offsetof(xfer_tcp_config_t, put_ack), 0, 0, NULL},
    {"BUSY_POLL", XFER_PARAM_BOOL, "n",
     "y: progress reads the sockets of the endpoints with recent traffic directly instead "
     "of asking epoll which have input (one system call less per message received; the "
     "others are left to epoll after 256 quiet looks), a wait never sleeps on the "
     "interface's file descriptor, and sockets get SO_BUSY_POLL (50 us) so that a receive "
     "polls the NIC's queue where the driver supports it. For latency-critical users with "
     "a core to spin on.",
     offsetof(xfer_tcp_config_t, busy_poll), 0, 0, NULL},
    {"LANES", XFER_PARAM_UINT, "0",
     "TCP connections per endpoint (1-8): the data of large messages, puts and tensors is cut "
     "over them, frames and their order staying on the first. The server listens for the "
     "extra ones on a port of its own (any address); the client connects them to the address "
     "its first connection reached. 0 chooses by the cores online: 2 below 16, 4 from 16 "
     "(measured on two cores: 2 lanes move 1 MiB messages 1.3x faster than one when "
     "polling, 1.8x when sleeping; 4 lanes are slower than 2 there).",
     offsetof(xfer_tcp_config_t, lanes), 0, XFER_TCP_WIRE_LANES_MAX, NULL},
    {"LANE_WAIT", XFER_PARAM_TIME, "200ms",
     "How long xfer_connect waits for the connects of an endpoint's lanes (started "
     "together). A lane not connected by then connects from progress and carries data from "
     "then on; one whose connect fails is tried again after 10, 20, 40 ... ms, six times in "
     "all. 0: xfer_connect does not wait for them.",
     offsetof(xfer_tcp_config_t, lane_wait), 0.0, 60.0, NULL},
    {"LANE_MIN_SIZE", XFER_PARAM_SIZE, "1m",
     "Data from this size on is cut over the lanes, one share per lane; smaller data goes on "
     "the first connection alone.",
     offsetof(xfer_tcp_config_t, lane_min), 64.0 * 1024.0, 1024.0 * 1024.0 * 1024.0 * 1024.0,
     NULL},
    {"SPLICE", XFER_PARAM_BOOL, "y",
     "y: the blocks of a batch's puts leave without a copy: vmsplice puts references to their "
     "pages in a pipe, splice moves them into the socket. A batch allows it, as a put does "
     "not: it completes only once its data is in the peer's memory, so its pages are not "
     "reused while the socket still refers to them. Costs each endpoint that sends a batch a "
     "pipe (two file descriptors, XFER_TCP_SPLICE_PIPE); where none can be had, or only a "
     "small one, or a block's pages cannot be referenced, the blocks are copied. n: always "
     "copied.",
     offsetof(xfer_tcp_config_t, splice), 0, 0, NULL},
    {"SPLICE_PIPE", XFER_PARAM_SIZE, "256k",
     "Bytes of the pipe an endpoint sends a batch's blocks through (XFER_TCP_SPLICE), asked of "
     "the kernel (fs.pipe-max-size bounds it). Its pages count against the user's "
     "fs.pipe-user-pages-soft, which every pipe of the user's processes shares (by default "
     "16384 pages: 64 endpoints at 1 MiB, 256 at 256 KiB); past it a new pipe gets two pages, "
     "too few to gain by, and the endpoint copies.",
     offsetof(xfer_tcp_config_t, splice_pipe), 64.0 * 1024.0, 64.0 * 1024.0 * 1024.0, NULL},
    {"TLS", XFER_PARAM_BOOL, "n",
     "y: every connection of an endpoint (lanes included) carries TLS 1.3 records "
     "(TLS_AES_128_GCM_SHA256) sealed by the kernel (kernel TLS, the 'tls' module), so that "
     "splice and direct reads keep working. The keys come from a TLS 1.3 handshake whose "
     "pre-shared key is the authenticated bootstrap's endpoint secret, with an ECDHE exchange "
     "for forward secrecy: it needs XFER_AUTH_KEY_FILE (or the context's auth_key), and both "
     "sides must set it. Where the kernel has no TLS the tcp transport is not opened, saying "
     "why, rather than carry the data in the clear.",
     offsetof(xfer_tcp_config_t, tls), 0, 0, NULL},
    {"TLS_TIMEOUT", XFER_PARAM_TIME, "2s",
     "How long an endpoint's TLS handshake (XFER_TCP_TLS=y, two round trips) may take, inside "
     "xfer_connect and on the server while it connects the endpoint - there inside progress, "
     "which a key holder that stalls its handshake holds up to this long.",
     offsetof(xfer_tcp_config_t, tls_timeout), 0.001, 600.0, NULL},
    {NULL}
};

int xfer_tcp_iface_selected(const xfer_tcp_config_t *cfg, const char *name)
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

int xfer_tcp_host_text(const struct sockaddr *sa, char *buf, size_t size)
{
    const void *a = (sa->sa_family == AF_INET6) ?
                            (const void*)&((const struct sockaddr_in6*)sa)->sin6_addr :
                            (const void*)&((const struct sockaddr_in*)sa)->sin_addr;

    if (((sa->sa_family == AF_INET) || (sa->sa_family == AF_INET6)) &&
        (inet_ntop(sa->sa_family, a, buf, (socklen_t)size) != NULL)) {
        return 1;
    }
    snprintf(buf, size, "?");
    return 0;
}

int xfer_tcp_ifaddr_text(const xfer_tcp_config_t *cfg, const struct ifaddrs *ifa, char *buf,
                         size_t size)
{
    return (ifa->ifa_addr != NULL) && (ifa->ifa_flags & IFF_UP) &&
           ((ifa->ifa_addr->sa_family == AF_INET) || (ifa->ifa_addr->sa_family == AF_INET6)) &&
           xfer_tcp_iface_selected(cfg, ifa->ifa_name) &&
           xfer_tcp_host_text(ifa->ifa_addr, buf, size);
}

static xfer_device_attr_t *device_find_or_add(xfer_component_attr_t *attr, const char *name)
{
    xfer_device_attr_t *dev;
    char path[128];

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
    snprintf(path, sizeof(path), "/sys/class/net/%s/device/numa_node", name);
    dev->numa_node = (int)xfer_file_long(path, -1);
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

        if (!xfer_tcp_ifaddr_text(cfg, ifa, addr, sizeof(addr))) {
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
        xfer_device_attr_add(dev, (ifa->ifa_addr->sa_family == AF_INET) ? "inet" : "inet6",
                             "%s", addr);
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
    /* CUDA memory passes bounce buffers (tcp_cuda.c); the driver is loaded only once such
     * memory is registered, never here */
    attr->caps      = XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG | XFER_CAP_TENSOR |
                      XFER_CAP_MEM_HOST | XFER_CAP_MEM_CUDA | XFER_CAP_INTER_HOST;
    attr->limits.max_msg_size   = cfg->max_msg_size;
    attr->limits.max_eager_size = cfg->eager_threshold;
    attr->limits.max_key_len    = 0;    /* the framework's XFER_MAX_KEY_LEN applies */
    /* Ranking estimates for a kernel TCP stack: tens of microseconds, about a GB/s. */
    attr->latency_us    = 20.0;
    attr->bandwidth_mbs = 1000.0;
    return XFER_OK;
}

XFER_COMPONENT_EXPORT const xfer_component_stats_v1_t xfer_component_stats_v1 = {
    .size        = sizeof(xfer_component_stats_v1_t),
    .ep_counters = xfer_tcp_ep_counters,
};

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    XFER_COMPONENT_V1_HEAD("tcp", "TCP sockets over any IP interface",
                           tcp_params, xfer_tcp_config_t),
    .query       = tcp_query,

    .iface_open    = xfer_tcp_iface_open,
    .iface_close   = xfer_tcp_iface_close,
    XFER_COMPONENT_CORE_OPS(tcp),
    .mem_dereg     = xfer_tcp_mem_dereg,
    .mem_reg_params = xfer_tcp_mem_reg_params,
#ifndef XFER_TCP_TEST_NO_BATCH
    .batch         = xfer_tcp_batch,
#endif
    .tag_copy      = xfer_tcp_tag_copy,
    .tag_resume    = xfer_tcp_tag_resume,
};
