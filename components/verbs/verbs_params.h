/*
 * The verbs transport's parameters, as entries of a parameter table. The verbs component's
 * table is these entries; gdr, which runs the same code on GPU memory, puts them first in its
 * own table (XFER_GDR_TX_QUEUE_LEN, ...) with a config struct that begins with an
 * xfer_verbs_config_t, so one definition serves both and each can be tuned on its own.
 */
#ifndef XFER_VERBS_PARAMS_H
#define XFER_VERBS_PARAMS_H

#include "verbs.h"

#include <stddef.h>

extern const char *const xfer_verbs_mtu_values[] __attribute__((visibility("hidden")));
extern const char *const xfer_verbs_mr_cache_values[] __attribute__((visibility("hidden")));

#define XFER_VERBS_CFG(_f) offsetof(xfer_verbs_config_t, _f)

/* The entries, without the table's terminator: offsets into an xfer_verbs_config_t that
 * starts the component's config struct. */
#define XFER_VERBS_PARAM_ENTRIES \
    {"DEVICE", XFER_PARAM_STRING, "",                                                              \
     "RDMA device and port to use, as 'dev' or 'dev:port' (e.g. 'rxe0:1'); empty means the "       \
     "first active port.", XFER_VERBS_CFG(device), 0, 0, NULL},                                    \
    {"GID_INDEX", XFER_PARAM_INT, "-1",                                                            \
     "GID table index for RoCE; -1 picks the RoCE v2 GID of the interface's IPv4 address.",        \
     XFER_VERBS_CFG(gid_index), -1, 255, NULL},                                                    \
    {"TX_QUEUE_LEN", XFER_PARAM_UINT, "256",                                                       \
     "Send queue entries per channel.", XFER_VERBS_CFG(tx_queue_len), 16, 16384, NULL},            \
    {"RX_QUEUE_LEN", XFER_PARAM_UINT, "128",                                                       \
     "Message slots (posted receives) per channel: the credits a peer starts with.",               \
     XFER_VERBS_CFG(rx_queue_len), 16, 16384, NULL},                                               \
    {"SEG_SIZE", XFER_PARAM_SIZE, "8k",                                                            \
     "Bytes of one message slot; tag messages up to this (less a 16-byte header) go eagerly, "     \
     "larger ones by rendezvous (RDMA READ).", XFER_VERBS_CFG(seg_size), 512, 1024 * 1024, NULL},  \
    {"MAX_INLINE", XFER_PARAM_SIZE, "128",                                                         \
     "Messages and RDMA writes up to this many bytes are sent inline (the device may lower "       \
     "it).",                                                                                       \
     XFER_VERBS_CFG(max_inline), 0, 1024, NULL},                                                   \
    {"SIGNAL_INTERVAL", XFER_PARAM_UINT, "32",                                                     \
     "Ask for a send completion every this many sends (RDMA operations always); at most a "        \
     "quarter of TX_QUEUE_LEN, to which a larger value is lowered.",                               \
     XFER_VERBS_CFG(signal_interval), 1, 1024, NULL},                                              \
    {"CQ_SIZE", XFER_PARAM_UINT, "1024",                                                           \
     "Initial completion queue entries; it grows as channels are added.",                          \
     XFER_VERBS_CFG(cq_size), 64, 4194304, NULL},                                                  \
    {"MTU", XFER_PARAM_ENUM, "auto",                                                               \
     "Path MTU: auto uses the smaller of both ports' active MTUs.", XFER_VERBS_CFG(mtu), 0, 0, xfer_verbs_mtu_values}, \
    {"TIMEOUT", XFER_PARAM_TIME, "100ms",                                                          \
     "Acknowledgement timeout of one RC retry (rounded up to 4.096 us x 2^n).",                    \
     XFER_VERBS_CFG(timeout), 1e-5, 8000.0, NULL},                                                 \
    {"RETRY_COUNT", XFER_PARAM_UINT, "6",                                                          \
     "RC retries before a channel fails (dead peer or link). 7 means 'retry forever' to "          \
     "Soft-RoCE (rdma_rxe), so a dead link would stall instead of failing.",                       \
     XFER_VERBS_CFG(retry_count), 0, 7, NULL},                                                     \
    {"RNR_RETRY", XFER_PARAM_UINT, "7",                                                            \
     "Receiver-not-ready retries (7 = without limit).", XFER_VERBS_CFG(rnr_retry), 0, 7, NULL},    \
    {"MAX_RD_ATOMIC", XFER_PARAM_UINT, "16",                                                       \
     "RDMA READs in flight per channel (capped by the device).", XFER_VERBS_CFG(max_rd_atomic), 1, 255, \
     NULL},                                                                                        \
    {"KEEPALIVE", XFER_PARAM_TIME, "1s",                                                           \
     "Probe a channel idle this long; a dead peer is found within this plus TIMEOUT x "            \
     "(RETRY_COUNT + 1). 0 turns probes off.", XFER_VERBS_CFG(keepalive), 0, 3600.0, NULL},        \
    {"MAX_MSG_SIZE", XFER_PARAM_SIZE, "2g",                                                        \
     "Largest tag message, put, get or tensor.", XFER_VERBS_CFG(max_msg_size), 1,                  \
     1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},                                                     \
    {"RDMA_CHUNK", XFER_PARAM_SIZE, "1g",                                                          \
     "Bytes of one RDMA WRITE or READ work request: longer puts, gets, rendezvous reads and "      \
     "tensor writes are split into chunks of this size (lowered to the port's largest "            \
     "message). The endpoint address tells the peer, which checks a tensor's last chunk by "       \
     "it.", XFER_VERBS_CFG(rdma_chunk), 4096, 2048.0 * 1024.0 * 1024.0, NULL},                     \
    {"MR_CACHE", XFER_PARAM_ENUM, "auto",                                                          \
     "Registrations of buffers the user did not register (tag messages, published tensors, "       \
     "fetch destinations given without xfer_mem_register): auto keeps them for reuse while "       \
     "libucm (UCX) reports every unmapping in the process, so that memory mapped again at an "     \
     "old address never meets an old registration; where it cannot (UCX_MEM_EVENTS=no, hooks "     \
     "libucm cannot install, a memory checker's malloc), and with off, each such buffer is "       \
     "registered for its operation and deregistered at its completion, which costs an "            \
     "ibv_reg_mr and an ibv_dereg_mr per operation. xfer_info shows the outcome as each "          \
     "port's mr_cache.",                                                                           \
     XFER_VERBS_CFG(mr_cache), 0, 0, xfer_verbs_mr_cache_values},                                  \
    {"MR_CACHE_MAX_ENTRIES", XFER_PARAM_UINT, "1024",                                              \
     "Registrations of unregistered user buffers kept for reuse; 0 turns the cache off.",          \
     XFER_VERBS_CFG(mrc_max_entries), 0, 1048576, NULL},                                           \
    {"MR_CACHE_MAX_BYTES", XFER_PARAM_SIZE, "4g",                                                  \
     "Bytes of such registrations kept (least recently used unused ones go first).",               \
     XFER_VERBS_CFG(mrc_max_bytes), 0, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},                   \
    {"TENSOR_META_CACHE", XFER_PARAM_UINT, "4096",                                                 \
     "Tensor metadata kept per channel, by key: a fetch whose tensor is as last time takes "       \
     "one message and one write; 0 turns the cache off (every fetch asks first).",                 \
     XFER_VERBS_CFG(meta_cache), 0, 1048576, NULL},

#endif
