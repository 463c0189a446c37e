/*
 * NIXL's XFER backend: a nixlBackendEngine (nixl_abi.h) whose every transfer is an xfer batch.
 * What the engine's parts share: the engine, its registrations, its peers and its transfer
 * handles.
 */
#ifndef XFER_NIXL_H
#define XFER_NIXL_H

#include "nixl_abi.h"

#include <xfer/xfer.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <thread>

namespace xfer_nixl {

/* Log a line to stderr, prefixed "NIXL/XFER", with xfer's last error when there is one. */
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* What a failed xfer call or transfer means to NIXL. */
nixl_status_t status_of(xfer_status_t st);

/* Tagged messages with this tag carry genNotif()'s notifications (the sender's name first). */
constexpr uint64_t kNotifTag = 0x4e49584c00000001ull;   /* "NIXL", 1 */

/* A registration: this engine's own (Local), NIXL's view of it for a transfer to this same
 * agent (LocalRef, from loadLocalMD), or a peer's (Remote, from loadRemoteMD). */
struct MD : public nixlBackendMD {
    enum Kind { Local, LocalRef, Remote };
    explicit MD(Kind k) : nixlBackendMD(k != Remote), kind(k) {}
    Kind kind;
};

struct LocalMD : public MD {
    LocalMD() : MD(Local) {}
    xfer_mem_t  *mem = nullptr;
    std::string blob;           /* the packed remote key: the public data */
};

struct LocalRefMD : public MD {
    explicit LocalRefMD(LocalMD *m) : MD(LocalRef), md(m) {}
    LocalMD *md;
};

struct Peer;

struct RemoteMD : public MD {
    RemoteMD() : MD(Remote) {}
    std::string agent;
    std::string blob;
    xfer_rkey_t *rkey = nullptr;    /* unpacked on the peer's endpoint at first use */
};

/* A peer agent: where it listens, and this side's endpoint to it (for transfers to it and
 * notifications; what it sends here comes on the endpoint it connected). */
struct Peer {
    std::string              conn;
    xfer_endpoint_t          *ep = nullptr;
    std::set<RemoteMD *>     mds;   /* loaded and not yet unloaded: their keys need ep */
};

/* The completion of one posted batch: shared by the handle and the batch's callback, freed by
 * whichever of the two lets go last (the handle may be released while a batch is in flight). */
struct Done {
    enum { Pending, Complete, Orphaned };
    std::atomic<int>           state{Pending};
    std::atomic<xfer_status_t> status{XFER_INPROGRESS};
};

/* The descriptors of a transfer that go between one local registration and one of the
 * peer's: one xfer batch. */
struct Group {
    LocalMD                        *local = nullptr;
    RemoteMD                       *remote = nullptr;
    std::vector<xfer_batch_desc_t> descs;
    xfer_batch_t                   *batch = nullptr;
    xfer_request_t                 *req = nullptr;
    Done                           *done = nullptr;
};

struct ReqH : public nixlBackendReqH {
    ~ReqH() override;
    nixl_xfer_op_t     op = NIXL_WRITE;
    std::string        agent;
    bool               local = false;   /* to this same agent: copied at post */
    std::vector<Group> groups;
    std::string        notif;           /* packed: the sender's name, then the message */
    bool               has_notif = false;
    bool               notif_posted = false;
    bool               posted = false;
    nixl_status_t      failed = NIXL_SUCCESS;
    void release_posts();
};

class Engine : public nixlBackendEngine {
public:
    explicit Engine(const nixlBackendInitParams *params);
    ~Engine() override;

    bool supportsRemote() const override { return true; }
    bool supportsLocal() const override { return true; }
    bool supportsNotif() const override { return true; }
    /* DRAM always; VRAM when the CUDA driver xfer loads is there (XFER_CUDA_LIB, default
     * libcuda.so.1): xfer registers device memory and moves it - by GPUDirect RDMA, by CUDA
     * IPC between processes of one host, else staged through pinned host buffers */
    nixl_mem_list_t getSupportedMems() const override
    {
        return vram_ ? nixl_mem_list_t{DRAM_SEG, VRAM_SEG} : nixl_mem_list_t{DRAM_SEG};
    }

    nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                              nixlBackendMD *&out) override;
    nixl_status_t deregisterMem(nixlBackendMD *meta) override;
    nixl_status_t getPublicData(const nixlBackendMD *meta, std::string &str) const override;
    nixl_status_t loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) override;
    nixl_status_t loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem,
                               const std::string &remote_agent, nixlBackendMD *&output) override;
    nixl_status_t unloadMD(nixlBackendMD *input) override;

    nixl_status_t getConnInfo(std::string &str) const override;
    nixl_status_t loadRemoteConnInfo(const std::string &remote_agent,
                                     const std::string &remote_conn_info) override;
    nixl_status_t connect(const std::string &remote_agent) override;
    nixl_status_t disconnect(const std::string &remote_agent) override;

    nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt_args) const override;
    nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt_args) const override;
    nixl_status_t checkXfer(nixlBackendReqH *handle) const override;
    nixl_status_t releaseReqH(nixlBackendReqH *handle) const override;

    nixl_status_t getNotifs(notif_list_t &notif_list) override;
    nixl_status_t genNotif(const std::string &remote_agent, const std::string &msg) const override;

    bool failed() const { return initErr; }

private:
    /* connections (xfer_nixl_conn.cpp) */
    bool start(const nixlBackendInitParams *params);
    void accept_loop();
    nixl_status_t endpoint_of(const std::string &agent, xfer_endpoint_t **ep_p) const;
    static void on_notify(xfer_endpoint_t *ep, const void *msg, size_t length, void *arg);
    static void on_notif_msg(xfer_request_t *req, xfer_status_t status, void *arg);
    bool post_notif_recv(std::vector<char> *buf) const;
    void notif_add(const void *msg, size_t length) const;
    std::string notif_pack(const std::string &msg) const;

    /* transfers (xfer_nixl_xfer.cpp) */
    nixl_status_t groups_build(ReqH *h, const nixl_meta_dlist_t &local,
                               const nixl_meta_dlist_t &remote) const;
    nixl_status_t local_copy(ReqH *h, const nixl_meta_dlist_t &local,
                             const nixl_meta_dlist_t &remote) const;
    nixl_status_t group_post(ReqH *h, Group &g, bool with_notif) const;

    static bool cuda_driver_present();
    /* xfer's memory type for a NIXL segment type this engine takes, or false */
    bool mem_type_of(nixl_mem_t nixl_mem, xfer_mem_type_t *type) const;

    xfer_context_t          *ctx_ = nullptr;
    xfer_listener_t         *listener_ = nullptr;
    std::string             conn_info_;
    bool                    progress_thread_ = false;
    bool                    vram_ = false;
    std::atomic<bool>       stopping_{false};
    std::thread             acceptor_;

    /* Guards what follows. Never held across an xfer call that can run callbacks (progress,
     * waits, closes): those run under the context's lock and take this one. */
    mutable std::mutex                     mu_;
    mutable std::map<std::string, Peer>    peers_;
    mutable std::vector<xfer_endpoint_t *> accepted_;
    mutable notif_list_t                   notifs_;
};

} // namespace xfer_nixl

#endif /* XFER_NIXL_H */
