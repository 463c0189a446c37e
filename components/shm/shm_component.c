/*
 * The shm component: peers on one host, through rings in shared memory and cross-memory
 * attach (CMA). This file holds the component descriptor, its parameters, query() and what a
 * process tells its peers about itself (the iface address) so that both sides can tell whether
 * they share a host; the data path lives in shm_iface.c (progress, events), shm_ep.c
 * (segments, liveness, CMA), shm_tx.c, shm_rx.c, shm_tag.c, shm_rma.c and shm_tensor.c.
 */
#include "config.h"

#include "shm.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *const cma_modes[] = {"auto", "on", "off", NULL};

static const xfer_param_desc_t shm_params[] = {
    {"CELLS", XFER_PARAM_UINT, "256",
     "Cells of each endpoint's ring, one per direction (each cell holds one frame).",
     offsetof(xfer_shm_config_t, cells), XFER_SHM_CELLS_MIN, XFER_SHM_CELLS_MAX, NULL},
    {"CELL_SIZE", XFER_PARAM_SIZE, "4k",
     "Bytes of one ring cell, its 64-byte header included; a multiple of 64. Messages up to "
     "a cell's payload take one cell; longer ones continue in the next cells.",
     offsetof(xfer_shm_config_t, cell_size), XFER_SHM_CELL_MIN, XFER_SHM_CELL_MAX, NULL},
    {"RNDV_THRESH", XFER_PARAM_SIZE, "16k",
     "Messages, put/get and tensor data from this size move with one copy by cross-memory "
     "attach (process_vm_readv/writev) when CMA is on; smaller ones, or all when CMA is off, "
     "are copied through the ring.",
     offsetof(xfer_shm_config_t, rndv_thresh), 0, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"CMA", XFER_PARAM_ENUM, "auto",
     "Cross-memory attach: auto uses it where the kernel's ptrace policy allows it between "
     "the peers (Yama ptrace_scope 0), on forces it, off copies everything through the ring "
     "(two copies, pipelined).",
     offsetof(xfer_shm_config_t, cma), 0, 0, cma_modes},
    {"MAP", XFER_PARAM_BOOL, "y",
     "Map a peer's memory that it allocated with xfer_mem_alloc() (a sealed memfd) at the "
     "first put or get to it, and move that data with one memcpy here, without a round trip "
     "through the peer. n: the peer carries out every put and get, after checking it "
     "against its live registrations.",
     offsetof(xfer_shm_config_t, map), 0, 0, NULL},
    {"NT_COPY_MIN", XFER_PARAM_SIZE, "4m",
     "Copies to and from a mapped peer's memory (MAP) of this size and more write with "
     "non-temporal stores, which bypass the cache: faster for data too large to stay there, "
     "slower for data read soon after. Set it above any transfer (1t) to always use memcpy.",
     offsetof(xfer_shm_config_t, nt_copy_min), 4096, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"COOP_MIN", XFER_PARAM_SIZE, "1m",
     "Puts into a mapped peer's memory (MAP) of this size and more, and messages from such "
     "memory into a receive buffer of such memory, are copied by both sides when the peer is "
     "in progress() meanwhile: it takes parts of the copy from the back, the side that "
     "copies from the front; a peer that does not progress takes none. Below 1 MiB it "
     "measured slower with many transfers in flight (two cores). Set it above any transfer "
     "(1t) to have one side always copy alone.",
     offsetof(xfer_shm_config_t, coop_min), 4096, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"MAX_MSG_SIZE", XFER_PARAM_SIZE, "64g",
     "Largest tag message, put/get or tensor this side sends or accepts.",
     offsetof(xfer_shm_config_t, max_msg_size), 1, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"MAX_ANSWERS", XFER_PARAM_UINT, "4096",
     "Answers to one peer's requests (put acknowledgements, get data, tensors) queued for its "
     "ring before its requests are no longer read.",
     offsetof(xfer_shm_config_t, max_answers), 16, 1u << 24, NULL},
    {"CUDA_IPC", XFER_PARAM_BOOL, "y",
     "Put, get and batches to and from a peer's CUDA memory by CUDA IPC: a registration of "
     "CUDA memory carries its allocation's IPC handle in the remote key, and the initiator "
     "opens it and copies with the CUDA driver (device to device without host memory). A "
     "handle opens the whole allocation to the peer. n: CUDA memory is not registered with "
     "shm; puts and gets of it are staged through host memory and a peer's CUDA memory takes "
     "none over shm.",
     offsetof(xfer_shm_config_t, cuda_ipc), 0, 0, NULL},
    {"CUDA_BATCH_COPY", XFER_PARAM_BOOL, "y",
     "A batch to or from a peer's CUDA memory hands its copies to the driver up to 256 in one "
     "cuMemcpyBatchAsync call, where the driver has it (CUDA 12.8 and later); a call costs "
     "about what one cuMemcpyAsync does, so a batch of small blocks does not pay a driver call "
     "per block. n: one cuMemcpyAsync per block.",
     offsetof(xfer_shm_config_t, cuda_batch_copy), 0, 0, NULL},
    {"CUDA_GATHER", XFER_PARAM_BOOL, "y",
     "A batch between CUDA memory here and a peer's (opened by IPC) moves by one launch of a "
     "copy kernel per XFER_SHM_CUDA_GATHER_DESCS pieces of up to 64 KiB, not by a driver "
     "copy per block: on an H200, 128 blocks of 4 KiB in about 11 us instead of 480. The "
     "kernel is loaded (its PTX compiled by the driver) at the first such batch; where that "
     "fails the batch goes by copies and the reason is logged once. n: copies only.",
     offsetof(xfer_shm_config_t, cuda_gather), 0, 0, NULL},
    {"CUDA_GATHER_DESCS", XFER_PARAM_UINT, "4096",
     "Entries of the copy kernel's table, in pinned host memory (24 bytes each): one launch "
     "copies a full table, and a batch that needs more waits for it before filling it again.",
     offsetof(xfer_shm_config_t, cuda_gather_descs), 16, 1u << 20, NULL},
    {NULL}
};

#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"
#define YAMA_PATH    "/proc/sys/kernel/yama/ptrace_scope"

static xfer_status_t boot_id_read(uint8_t *id, char *why, size_t why_size)
{
    char text[64];
    size_t n = 0;
    FILE *f = fopen(BOOT_ID_PATH, "r");

    if ((f == NULL) || (fgets(text, sizeof(text), f) == NULL)) {
        snprintf(why, why_size, "cannot read %s: %s", BOOT_ID_PATH, strerror(errno));
        if (f != NULL) {
            fclose(f);
        }
        return XFER_ERR_UNAVAILABLE;
    }
    fclose(f);
    memset(id, 0, 16);
    for (const char *p = text; (*p != '\0') && (n < 32); p++) {
        unsigned v;

        if ((*p >= '0') && (*p <= '9')) {
            v = (unsigned)(*p - '0');
        } else if ((*p >= 'a') && (*p <= 'f')) {
            v = (unsigned)(*p - 'a' + 10);
        } else {
            continue;
        }
        id[n / 2] |= (uint8_t)(v << ((n % 2) ? 0 : 4));
        n++;
    }
    if (n != 32) {
        snprintf(why, why_size, "%s does not hold a boot id", BOOT_ID_PATH);
        return XFER_ERR_UNAVAILABLE;
    }
    return XFER_OK;
}

static xfer_status_t ns_inode(const char *name, uint64_t *ino, char *why, size_t why_size)
{
    char path[64];
    struct stat st;

    snprintf(path, sizeof(path), "/proc/self/ns/%s", name);
    if (stat(path, &st) != 0) {
        snprintf(why, why_size, "cannot stat %s: %s", path, strerror(errno));
        return XFER_ERR_UNAVAILABLE;
    }
    *ino = (uint64_t)st.st_ino;
    return XFER_OK;
}

xfer_status_t xfer_shm_host_id(xfer_shm_host_id_t *id, int cma, char *why, size_t why_size)
{
    xfer_status_t status;

    memset(id, 0, sizeof(*id));
    status = boot_id_read(id->boot_id, why, why_size);
    if (status == XFER_OK) {
        status = ns_inode("pid", &id->pid_ns, why, why_size);
    }
    if (status == XFER_OK) {
        status = ns_inode("mnt", &id->mnt_ns, why, why_size);
    }
    id->uid = (uint32_t)getuid();
    id->pid = (uint32_t)getpid();
    id->cma = (uint32_t)cma;
    return status;
}

/* The kernel's Yama ptrace policy: -1 when there is none (no restriction from it). */
static int yama_scope(void)
{
    return (int)xfer_file_long(YAMA_PATH, -1);
}

int xfer_shm_cma_allowed(const xfer_shm_config_t *cfg, char *why, size_t why_size)
{
    uint64_t probe = 0x5846455250524f42ull, copy = 0;
    struct iovec local = {&copy, sizeof(copy)}, remote = {&probe, sizeof(probe)};
    int scope;

    if (cfg->cma == XFER_SHM_CMA_OFF) {
        snprintf(why, why_size, "CMA off (XFER_SHM_CMA=off): data goes through the ring, "
                 "two copies");
        return 0;
    }
    if ((process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)sizeof(copy)) ||
        (copy != probe)) {
        snprintf(why, why_size, "CMA unavailable: process_vm_readv: %s (a seccomp filter or a "
                 "kernel without CONFIG_CROSS_MEMORY_ATTACH); data goes through the ring, two "
                 "copies", strerror(errno));
        return 0;
    }
    scope = yama_scope();
    if ((scope > 0) && (cfg->cma == XFER_SHM_CMA_AUTO)) {
        snprintf(why, why_size, "CMA denied by the kernel's ptrace policy (Yama ptrace_scope="
                 "%d: only a parent may attach to its children); data goes through the ring, "
                 "two copies (XFER_SHM_CMA=on forces CMA)", scope);
        return 0;
    }
    snprintf(why, why_size, "CMA on (process_vm_readv/writev: one copy from %s)",
             (scope < 0) ? "no Yama policy" : "Yama ptrace_scope=0");
    return 1;
}

/* The iface address: magic, boot id, pid and mount namespaces, uid, pid, CMA, in host order
 * (only a peer on this host can use it; one elsewhere is told apart by the boot id). */
void xfer_shm_host_id_pack(const xfer_shm_host_id_t *id, uint8_t *buf)
{
    uint32_t magic = XFER_SHM_ADDR_MAGIC;

    memcpy(buf, &magic, 4);
    memcpy(buf + 4, id->boot_id, 16);
    memcpy(buf + 20, &id->pid_ns, 8);
    memcpy(buf + 28, &id->mnt_ns, 8);
    memcpy(buf + 36, &id->uid, 4);
    memcpy(buf + 40, &id->pid, 4);
    memcpy(buf + 44, &id->cma, 4);
    memset(buf + 48, 0, XFER_SHM_IFACE_ADDR_LEN - 48);
}

xfer_status_t xfer_shm_host_id_unpack(const void *buf, size_t len, xfer_shm_host_id_t *id,
                                      char *why, size_t why_size)
{
    const uint8_t *b = buf;
    uint32_t magic;

    if ((buf == NULL) || (len != XFER_SHM_IFACE_ADDR_LEN)) {
        snprintf(why, why_size, "an shm address of %zu bytes (expected %u)", len,
                 XFER_SHM_IFACE_ADDR_LEN);
        return XFER_ERR_PROTOCOL;
    }
    memcpy(&magic, b, 4);
    if (magic != XFER_SHM_ADDR_MAGIC) {
        snprintf(why, why_size, "not an shm address (magic 0x%08x)", magic);
        return XFER_ERR_PROTOCOL;
    }
    memcpy(id->boot_id, b + 4, 16);
    memcpy(&id->pid_ns, b + 20, 8);
    memcpy(&id->mnt_ns, b + 28, 8);
    memcpy(&id->uid, b + 36, 4);
    memcpy(&id->pid, b + 40, 4);
    memcpy(&id->cma, b + 44, 4);
    return XFER_OK;
}

static xfer_status_t shm_query(const void *config, xfer_component_attr_t *attr)
{
    const xfer_shm_config_t *cfg = config;
    xfer_device_attr_t *dev      = &attr->devices[0];
    char why[XFER_REASON_MAX], cma_why[XFER_REASON_MAX], driver[XFER_REASON_MAX];
    xfer_shm_host_id_t me;
    int cma;

    memset(attr, 0, sizeof(*attr));
    if (xfer_shm_geometry_check(cfg->cells, cfg->cell_size, why, sizeof(why)) != XFER_OK) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "XFER_SHM_CELLS/CELL_SIZE: %s",
                        why);
        return XFER_OK;
    }
    cma = xfer_shm_cma_allowed(cfg, cma_why, sizeof(cma_why));
    if (xfer_shm_host_id(&me, cma, why, sizeof(why)) != XFER_OK) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "cannot tell which peers share "
                        "this host: %s", why);
        return XFER_OK;
    }
    attr->available = 1;
    attr->caps      = XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG | XFER_CAP_TENSOR |
                      XFER_CAP_MEM_HOST | (cfg->cuda_ipc ? XFER_CAP_RMA_CUDA : 0);
    attr->limits.max_msg_size   = cfg->max_msg_size;
    attr->limits.max_eager_size = cfg->cell_size - XFER_SHM_FRAME_HDR;
    attr->limits.max_key_len    = 65535;
    /* memory speed, not a wire's: ahead of every network transport for a peer it reaches */
    attr->latency_us    = 0.3;
    attr->bandwidth_mbs = cma ? 20000.0 : 8000.0;
    attr->num_devices   = 1;
    snprintf(dev->name, sizeof(dev->name), "memory");
    snprintf(dev->kind, sizeof(dev->kind), "shm");
    dev->numa_node = -1;
    xfer_device_attr_add(dev, "reach", "processes on this host (same boot id, pid and mount "
                         "namespaces, user); others use the next transport");
    xfer_device_attr_add(dev, "segments", "memfd per endpoint and direction, opened by the "
                         "peer through /proc/<pid>/fd: in no mount, nothing left behind");
    xfer_device_attr_add(dev, "ring", "%llu cells x %llu bytes per direction",
                         (unsigned long long)cfg->cells, (unsigned long long)cfg->cell_size);
    xfer_device_attr_add(dev, "cma", "%s", cma_why);
    xfer_device_attr_add(dev, "map", "%s", cfg->map ? "put/get to a peer's xfer_mem_alloc "
                         "memory: one memcpy here (its sealed memfd mapped at first use)" :
                         "off (XFER_SHM_MAP=n): the peer carries out every put and get");
    xfer_cuda_describe(driver, sizeof(driver));
    xfer_device_attr_add(dev, "cuda", "%s", cfg->cuda_ipc ? "put/get/batches to and from a "
                         "peer's CUDA memory by IPC handles, copied here by the CUDA driver; "
                         "messages and tensors of CUDA memory staged through host memory" :
                         "off (XFER_SHM_CUDA_IPC=n): CUDA memory staged through host memory");
    if (cfg->cuda_ipc) {
        xfer_device_attr_add(dev, "cuda_batches", "%s", cfg->cuda_gather ?
                             "between device memory on one GPU: one launch of a copy kernel "
                             "per table of pieces (loaded and checked at the first); others "
                             "by the driver's copies" :
                             "by the driver's copies (XFER_SHM_CUDA_GATHER=n)");
    }
    xfer_device_attr_add(dev, "cuda_driver", "%s", driver);
    xfer_device_attr_add(dev, "wakeup", "busy poll; sleeping peers woken by a byte on the "
                         "endpoint's bootstrap connection, whose end also says the peer died");
    return XFER_OK;
}

/* An endpoint's counters (xfer_endpoint_counters, XFER_STATS=y). */
static const xfer_counter_field_t ep_stats[] = {
    XFER_COUNTER_FIELD(struct xfer_ep, "tx_frames", tx_done),
    XFER_COUNTER_FIELD(struct xfer_ep, "rx_bytes", rx_bytes),
};

static void shm_ep_counters(xfer_ep_h ep, xfer_counter_t *c, size_t *count_p)
{
    size_t n = 0;

    xfer_counter_put_table(c, *count_p, &n, ep, ep_stats, sizeof(ep_stats) / sizeof(ep_stats[0]));
    *count_p = n;
}

XFER_COMPONENT_EXPORT const xfer_component_stats_v1_t xfer_component_stats_v1 = {
    sizeof(xfer_component_stats_v1_t), shm_ep_counters
};

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    XFER_COMPONENT_V1_HEAD("shm",
                           "shared-memory rings and cross-memory attach between "
                           "processes of one host",
                           shm_params, xfer_shm_config_t),
    .query       = shm_query,

    .iface_open    = xfer_shm_iface_open,
    .iface_close   = xfer_shm_iface_close,
    XFER_COMPONENT_CORE_OPS(shm),
    .mem_dereg     = xfer_shm_mem_dereg,
    .mem_reg_params = xfer_shm_mem_reg_params,
    .iface_reachable = xfer_shm_iface_reachable,
    .batch         = xfer_shm_batch,
    .tag_pull      = xfer_shm_tag_pull,
};
