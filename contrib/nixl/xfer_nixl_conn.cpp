/*
 * NIXL's XFER backend: the plug-in's entry point, the engine's context and listener, its
 * peers (connection info, connect, disconnect), registrations and notifications.
 *
 * One xfer context per engine. Its listener is at the host peers are told (the "host"
 * parameter, else XFER_NIXL_HOST, else the first IPv4 address of an interface that is up and
 * not loopback), on the "port" parameter (0: any); that host:port is the engine's connection
 * info. A thread of the engine takes the connections peers make to it; each side connects
 * its own endpoint to a peer for what it sends there, so an agent pair has two endpoints.
 * Progress: xfer's own progress thread when NIXL asks for one (enableProgTh), else
 * checkXfer() and getNotifs() progress.
 */
#include "xfer_nixl.h"
#include "../common/host_address.h"

#include <dlfcn.h>
#include <poll.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace xfer_nixl {

void log_error(const char *fmt, ...)
{
    const char *last = xfer_last_error();
    char line[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if ((last != nullptr) && (*last != '\0')) {
        fprintf(stderr, "NIXL/XFER: %s (%s)\n", line, last);
        xfer_last_error_clear();
    } else {
        fprintf(stderr, "NIXL/XFER: %s\n", line);
    }
}

nixl_status_t status_of(xfer_status_t st)
{
    switch (st) {
    case XFER_OK:
        return NIXL_SUCCESS;
    case XFER_INPROGRESS:
        return NIXL_IN_PROG;
    case XFER_ERR_INVALID_PARAM:
    case XFER_ERR_OUT_OF_RANGE:
    case XFER_ERR_TRUNCATED:
        return NIXL_ERR_INVALID_PARAM;
    case XFER_ERR_NOT_FOUND:
        return NIXL_ERR_NOT_FOUND;
    case XFER_ERR_UNSUPPORTED:
        return NIXL_ERR_NOT_SUPPORTED;
    case XFER_ERR_CONNECTION:
    case XFER_ERR_PEER_CLOSED:
    case XFER_ERR_UNREACHABLE:
        return NIXL_ERR_REMOTE_DISCONNECT;
    case XFER_ERR_CANCELED:
        return NIXL_ERR_CANCELED;
    case XFER_ERR_DENIED:
        return NIXL_ERR_NOT_ALLOWED;
    default:
        return NIXL_ERR_BACKEND;
    }
}

/* ---- the engine ----------------------------------------------------------------------------- */

/* Receives of genNotif()'s messages kept posted, and the largest such message. */
constexpr int    kNotifRecvs  = 4;
constexpr size_t kNotifMaxLen = 16384;

static std::string param(const nixlBackendInitParams *p, const char *name)
{
    if (p->customParams == nullptr) {
        return "";
    }
    auto it = p->customParams->find(name);
    return (it == p->customParams->end()) ? "" : it->second;
}

/* The XFER_* variables the plug-in reads itself (not xfer's: not reported as unknown). */
static const char *const env_names[] = {"XFER_NIXL_HOST", nullptr};

Engine::Engine(const nixlBackendInitParams *params) : nixlBackendEngine(params)
{
    initErr = !start(params);
}

bool Engine::start(const nixlBackendInitParams *params)
{
    xfer_context_params_t cp = {};
    std::string host = param(params, "host");
    std::string port = param(params, "port");
    char at[300], buf[256];
    xfer_status_t st;

    if (localAgent.size() > UINT16_MAX) {
        log_error("an agent name of %zu bytes is longer than notifications carry (65535)",
                  localAgent.size());
        return false;
    }
    progress_thread_ = params->enableProgTh;
    vram_            = cuda_driver_present();
    cp.size      = sizeof(cp);
    cp.flags     = progress_thread_ ? XFER_CONTEXT_FLAG_PROGRESS_THREAD : 0;
    cp.env_names = env_names;
    st       = xfer_context_create(&cp, &ctx_);
    if (st != XFER_OK) {
        log_error("cannot create the xfer context: %s", xfer_status_string(st));
        return false;
    }
    if (host.empty()) {
        xfer_contrib_host_address("XFER_NIXL_HOST", buf, sizeof(buf));
        host = buf;
    }
    snprintf(at, sizeof(at), "%s%s%s:%s", (host.find(':') != std::string::npos) ? "[" : "",
             host.c_str(), (host.find(':') != std::string::npos) ? "]" : "",
             port.empty() ? "0" : port.c_str());
    st = xfer_listen(ctx_, at, &listener_);
    if (st != XFER_OK) {
        log_error("cannot listen at %s: %s", at, xfer_status_string(st));
        return false;
    }
    snprintf(at, sizeof(at), "%s%s%s:%u", (host.find(':') != std::string::npos) ? "[" : "",
             host.c_str(), (host.find(':') != std::string::npos) ? "]" : "",
             (unsigned)xfer_listener_port(listener_));
    conn_info_ = at;
    st = xfer_notify_handler_set(ctx_, on_notify, this);
    if (st != XFER_OK) {
        log_error("cannot set the notification handler: %s", xfer_status_string(st));
        return false;
    }
    for (int i = 0; i < kNotifRecvs; i++) {
        if (!post_notif_recv(new std::vector<char>(kNotifMaxLen))) {
            return false;
        }
    }
    acceptor_ = std::thread(&Engine::accept_loop, this);
    return true;
}

Engine::~Engine()
{
    stopping_ = true;
    if (acceptor_.joinable()) {
        acceptor_.join();
    }
    /* closes the endpoints (flushing what was sent), cancels the notification receives and
     * frees the registrations NIXL did not deregister */
    xfer_context_destroy(ctx_);
}

/* Take the connections peers make, and move their handshakes, until the engine goes; close
 * the accepted endpoints whose peer went (what they received was delivered before). */
void Engine::accept_loop()
{
    struct pollfd pfd = {xfer_listener_fd(listener_), POLLIN, 0};
    std::vector<xfer_endpoint_t *> gone;
    xfer_endpoint_t *ep;

    while (!stopping_) {
        if (poll(&pfd, 1, 100) > 0) {
            while (xfer_accept(listener_, 0, &ep) == XFER_OK) {
                std::lock_guard<std::mutex> lock(mu_);
                accepted_.push_back(ep);
            }
            xfer_last_error_clear();    /* a refused handshake is logged by xfer itself */
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (auto it = accepted_.begin(); it != accepted_.end();) {
                if (xfer_endpoint_status(*it) != XFER_OK) {
                    gone.push_back(*it);
                    it = accepted_.erase(it);
                } else {
                    ++it;
                }
            }
        }
        for (xfer_endpoint_t *g : gone) {
            xfer_endpoint_close_nb(g, XFER_CLOSE_FLAG_FORCE, nullptr, nullptr, nullptr);
        }
        gone.clear();
    }
}

/* ---- peers ---------------------------------------------------------------------------------- */

nixl_status_t Engine::getConnInfo(std::string &str) const
{
    str = conn_info_;
    return NIXL_SUCCESS;
}

nixl_status_t Engine::loadRemoteConnInfo(const std::string &remote_agent,
                                         const std::string &remote_conn_info)
{
    std::lock_guard<std::mutex> lock(mu_);

    if (remote_conn_info.empty() || (remote_conn_info.size() > 280)) {
        log_error("connection info of %zu bytes from %s is not a host:port",
                  remote_conn_info.size(), remote_agent.c_str());
        return NIXL_ERR_INVALID_PARAM;
    }
    peers_[remote_agent].conn = remote_conn_info;
    return NIXL_SUCCESS;
}

/* The endpoint to agent, connected now when there is none yet. */
nixl_status_t Engine::endpoint_of(const std::string &agent, xfer_endpoint_t **ep_p) const
{
    std::string conn;
    xfer_endpoint_t *ep = nullptr;
    xfer_status_t st;

    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = peers_.find(agent);
        if ((it == peers_.end()) || it->second.conn.empty()) {
            log_error("no connection info for agent %s: load its metadata first",
                      agent.c_str());
            return NIXL_ERR_NOT_FOUND;
        }
        if (it->second.ep != nullptr) {
            *ep_p = it->second.ep;
            return NIXL_SUCCESS;
        }
        conn = it->second.conn;
    }
    st = xfer_connect(ctx_, conn.c_str(), &ep);     /* blocks for the handshake, unlocked */
    if (st != XFER_OK) {
        log_error("cannot connect to agent %s at %s: %s", agent.c_str(), conn.c_str(),
                  xfer_status_string(st));
        return status_of(st);
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        Peer &p = peers_[agent];
        if (p.ep == nullptr) {
            p.ep  = ep;
            *ep_p = ep;
            return NIXL_SUCCESS;
        }
        *ep_p = p.ep;       /* another thread connected meanwhile */
    }
    xfer_endpoint_close(ep);
    return NIXL_SUCCESS;
}

nixl_status_t Engine::connect(const std::string &remote_agent)
{
    xfer_endpoint_t *ep;

    if (remote_agent == localAgent) {
        return NIXL_SUCCESS;    /* transfers to this agent are copies */
    }
    return endpoint_of(remote_agent, &ep);
}

nixl_status_t Engine::disconnect(const std::string &remote_agent)
{
    xfer_endpoint_t *ep = nullptr;
    std::vector<xfer_rkey_t *> rkeys;

    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = peers_.find(remote_agent);
        if (it == peers_.end()) {
            return NIXL_SUCCESS;
        }
        ep            = it->second.ep;
        it->second.ep = nullptr;
        for (RemoteMD *md : it->second.mds) {
            if (md->rkey != nullptr) {
                rkeys.push_back(md->rkey);  /* unpacked on ep: unpacked again on the next */
                md->rkey = nullptr;
            }
        }
    }
    for (xfer_rkey_t *rkey : rkeys) {
        xfer_rkey_destroy(rkey);
    }
    if (ep != nullptr) {
        xfer_endpoint_close(ep);    /* flushes what was sent, at most XFER_CLOSE_TIMEOUT */
    }
    return NIXL_SUCCESS;
}

/* ---- registrations -------------------------------------------------------------------------- */

/* Whether the CUDA driver library that xfer loads for device memory (XFER_CUDA_LIB, default
 * libcuda.so.1) is there: then VRAM registrations go to xfer, which says why if it cannot use
 * it after all. Loaded and closed again; xfer loads it itself when device memory comes. */
bool Engine::cuda_driver_present()
{
    const char *lib = getenv("XFER_CUDA_LIB");
    void *handle    = dlopen((lib != nullptr) && (*lib != '\0') ? lib : "libcuda.so.1",
                             RTLD_LAZY | RTLD_LOCAL);

    if (handle == nullptr) {
        return false;
    }
    dlclose(handle);
    return true;
}

bool Engine::mem_type_of(nixl_mem_t nixl_mem, xfer_mem_type_t *type) const
{
    if (nixl_mem == DRAM_SEG) {
        *type = XFER_MEM_HOST;
        return true;
    }
    if ((nixl_mem == VRAM_SEG) && vram_) {
        *type = XFER_MEM_CUDA;
        return true;
    }
    return false;
}

nixl_status_t Engine::registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                                  nixlBackendMD *&out)
{
    auto md = std::make_unique<LocalMD>();
    void *blob = nullptr;
    size_t len = 0;
    xfer_status_t st;
    xfer_mem_type_t type;

    if (!mem_type_of(nixl_mem, &type)) {
        log_error("registerMem: %s memory is not supported here (DRAM_SEG%s)",
                  (nixl_mem == VRAM_SEG) ? "VRAM_SEG" : "this kind of",
                  vram_ ? ", VRAM_SEG" : "; VRAM_SEG needs the CUDA driver (XFER_CUDA_LIB)");
        return NIXL_ERR_NOT_SUPPORTED;
    }
    st = xfer_mem_register(ctx_, reinterpret_cast<void *>(mem.addr), mem.len, type, &md->mem);
    if (st != XFER_OK) {
        log_error("registerMem of %zu bytes at 0x%lx: %s", mem.len, (unsigned long)mem.addr,
                  xfer_status_string(st));
        return status_of(st);
    }
    st = xfer_rkey_pack(md->mem, &blob, &len);
    if (st != XFER_OK) {
        log_error("registerMem: cannot pack the remote key: %s", xfer_status_string(st));
        xfer_mem_deregister(md->mem);
        return status_of(st);
    }
    md->blob.assign(static_cast<const char *>(blob), len);
    xfer_rkey_blob_free(blob);
    out = md.release();
    return NIXL_SUCCESS;
}

nixl_status_t Engine::deregisterMem(nixlBackendMD *meta)
{
    auto *md = static_cast<LocalMD *>(meta);
    xfer_status_t st;

    st = xfer_mem_deregister(md->mem);
    if (st != XFER_OK) {
        /* a transfer still uses it (NIXL releases its handles first): keep both */
        log_error("deregisterMem: %s", xfer_status_string(st));
        return status_of(st);
    }
    delete md;
    return NIXL_SUCCESS;
}

nixl_status_t Engine::getPublicData(const nixlBackendMD *meta, std::string &str) const
{
    str = static_cast<const LocalMD *>(meta)->blob;
    return NIXL_SUCCESS;
}

nixl_status_t Engine::loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output)
{
    output = new LocalRefMD(static_cast<LocalMD *>(input));
    return NIXL_SUCCESS;
}

nixl_status_t Engine::loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem,
                                   const std::string &remote_agent, nixlBackendMD *&output)
{
    auto md = std::make_unique<RemoteMD>();

    /* a peer's VRAM too: its key says what xfer can do with it over the transport the two
     * agree on (no part for tcp: a transfer to it fails then, saying so) */
    if ((nixl_mem != DRAM_SEG) && (nixl_mem != VRAM_SEG)) {
        log_error("loadRemoteMD: only DRAM_SEG and VRAM_SEG memory");
        return NIXL_ERR_NOT_SUPPORTED;
    }
    if (input.metaInfo.empty()) {
        log_error("loadRemoteMD: %s's registration carries no remote key",
                  remote_agent.c_str());
        return NIXL_ERR_INVALID_PARAM;
    }
    md->agent = remote_agent;
    md->blob  = input.metaInfo;     /* unpacked once the endpoint to the agent exists */
    {
        std::lock_guard<std::mutex> lock(mu_);
        peers_[remote_agent].mds.insert(md.get());
    }
    output = md.release();
    return NIXL_SUCCESS;
}

nixl_status_t Engine::unloadMD(nixlBackendMD *input)
{
    auto *md = static_cast<MD *>(input);

    if (md->kind == MD::Remote) {
        auto *r = static_cast<RemoteMD *>(md);
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = peers_.find(r->agent);
            if (it != peers_.end()) {
                it->second.mds.erase(r);
            }
        }
        if (r->rkey != nullptr) {
            xfer_rkey_destroy(r->rkey);
        }
    }
    delete md;
    return NIXL_SUCCESS;
}

/* ---- notifications --------------------------------------------------------------------------
 *
 * Every notification - a transfer's, delivered by xfer after its data, or genNotif()'s, a
 * tagged message - starts with its sender's agent name (two bytes of length, little-endian,
 * then the name), so that whatever endpoint it came on, getNotifs() can say who sent it. */

std::string Engine::notif_pack(const std::string &msg) const
{
    std::string s;
    uint16_t n = static_cast<uint16_t>(localAgent.size());

    s.reserve(2 + n + msg.size());
    s.push_back(static_cast<char>(n & 0xff));
    s.push_back(static_cast<char>(n >> 8));
    s += localAgent;
    s += msg;
    return s;
}

void Engine::notif_add(const void *msg, size_t length) const
{
    const auto *p = static_cast<const unsigned char *>(msg);
    size_t n;

    if (length < 2) {
        log_error("a notification of %zu bytes carries no sender: dropped", length);
        return;
    }
    n = p[0] | (static_cast<size_t>(p[1]) << 8);
    if (2 + n > length) {
        log_error("a notification of %zu bytes names a sender of %zu: dropped", length, n);
        return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    notifs_.emplace_back(std::string(reinterpret_cast<const char *>(p + 2), n),
                         std::string(reinterpret_cast<const char *>(p + 2 + n), length - 2 - n));
}

void Engine::on_notify(xfer_endpoint_t *ep, const void *msg, size_t length, void *arg)
{
    (void)ep;
    static_cast<Engine *>(arg)->notif_add(msg, length);
}

struct NotifRecv {
    const Engine      *engine;
    std::vector<char> *buf;
};

void Engine::on_notif_msg(xfer_request_t *req, xfer_status_t status, void *arg)
{
    auto *r = static_cast<NotifRecv *>(arg);
    const Engine *e = r->engine;
    std::vector<char> *buf = r->buf;

    delete r;
    if (status == XFER_OK) {
        e->notif_add(buf->data(), xfer_request_length(req));
    } else if (status == XFER_ERR_TRUNCATED) {
        log_error("a genNotif message of %zu bytes is longer than %zu: dropped",
                  xfer_request_length(req), kNotifMaxLen);
    }
    if (e->stopping_ || (status == XFER_ERR_CANCELED) || !e->post_notif_recv(buf)) {
        delete buf;
    }
}

/* Post a receive of genNotif() messages from any peer into buf. */
bool Engine::post_notif_recv(std::vector<char> *buf) const
{
    auto *r = new NotifRecv{this, buf};
    xfer_status_t st;

    st = xfer_tag_recv(ctx_, nullptr, kNotifTag, ~0ull, buf->data(), buf->size(), nullptr,
                       on_notif_msg, r, nullptr);
    if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {
        log_error("cannot post a receive for notifications: %s", xfer_status_string(st));
        delete r;
        return false;
    }
    return true;
}

nixl_status_t Engine::getNotifs(notif_list_t &notif_list)
{
    if (!progress_thread_) {
        xfer_progress(ctx_);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &n : notifs_) {
        notif_list.push_back(std::move(n));
    }
    notifs_.clear();
    return NIXL_SUCCESS;
}

static void send_done(xfer_request_t *req, xfer_status_t status, void *arg)
{
    (void)req;
    if (status != XFER_OK) {
        log_error("a genNotif message was not sent: %s", xfer_status_string(status));
    }
    delete static_cast<std::string *>(arg);
}

nixl_status_t Engine::genNotif(const std::string &remote_agent, const std::string &msg) const
{
    xfer_endpoint_t *ep = nullptr;
    std::string *packed;
    nixl_status_t ret;
    xfer_status_t st;

    if (remote_agent == localAgent) {
        std::string p = notif_pack(msg);
        notif_add(p.data(), p.size());
        return NIXL_SUCCESS;
    }
    if (2 + localAgent.size() + msg.size() > kNotifMaxLen) {
        log_error("genNotif of %zu bytes: at most %zu with the agent's name", msg.size(),
                  kNotifMaxLen - 2 - localAgent.size());
        return NIXL_ERR_INVALID_PARAM;
    }
    ret = endpoint_of(remote_agent, &ep);
    if (ret != NIXL_SUCCESS) {
        return ret;
    }
    packed = new std::string(notif_pack(msg));
    st     = xfer_tag_send(ep, kNotifTag, packed->data(), packed->size(), nullptr, send_done,
                           packed, nullptr);
    if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {   /* else the callback frees it */
        delete packed;
        log_error("genNotif to %s: %s", remote_agent.c_str(), xfer_status_string(st));
        return status_of(st);
    }
    return NIXL_SUCCESS;
}

} // namespace xfer_nixl

/* ---- the plug-in ---------------------------------------------------------------------------- */

namespace {

nixlBackendEngine *create_engine(const nixlBackendInitParams *params)
{
    try {
        return new xfer_nixl::Engine(params);   /* NIXL checks its initErr */
    } catch (const std::exception &e) {
        xfer_nixl::log_error("cannot create the engine: %s", e.what());
        return nullptr;
    }
}

void destroy_engine(nixlBackendEngine *engine)
{
    delete engine;
}

const char *plugin_name()
{
    return "XFER";
}

const char *plugin_version()
{
    return PACKAGE_VERSION;
}

nixl_b_params_t backend_options()
{
    return {{"host", ""}, {"port", "0"}};
}

nixl_mem_list_t backend_mems()
{
    return {DRAM_SEG};
}

nixlBackendPlugin plugin = {XFER_NIXL_PLUGIN_API_VERSION, create_engine, destroy_engine,
                            plugin_name, plugin_version, backend_options, backend_mems};

} // namespace

extern "C" __attribute__((visibility("default"))) nixlBackendPlugin *nixl_plugin_init()
{
    return &plugin;
}

extern "C" __attribute__((visibility("default"))) void nixl_plugin_fini() {}
