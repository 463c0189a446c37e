/*
 * NIXL's XFER backend: transfers.
 *
 * prepXfer() groups a transfer's descriptors by the pair of registrations they lie in (one
 * of this agent's, one of the peer's) and prepares each group as one xfer batch
 * (xfer_batch_create: checked once, posted at every postXfer). postXfer() posts them; a
 * transfer's notification goes with its last batch, which xfer delivers to the peer only
 * after that batch's data. A transfer of several batches with a notification posts the last
 * one only once the others completed, so that the notification also follows their data -
 * what NIXL's users wait on it for. checkXfer() reports the first failure, or success once
 * every batch completed. releaseReqH() of a transfer in flight cancels it: xfer stops the
 * batches, which then deliver no notification, unless the notification had already left
 * (then the target's word stands). Transfers to this same agent are copies, done at post.
 */
#include "xfer_nixl.h"

#include <cstring>

namespace xfer_nixl {

/* Bound on how long releaseReqH() waits for cancelled batches to let go of the memory: the
 * registrations may be deregistered right after. */
constexpr int kReleaseWaitMs = 10000;

/* Batches of more descriptors are split (XFER_BATCH_MAX_DESCS's default). */
constexpr size_t kBatchMaxDescs = 65536;

static void batch_done(xfer_request_t *req, xfer_status_t status, void *arg)
{
    auto *d = static_cast<Done *>(arg);

    (void)req;
    d->status = status;
    if (d->state.exchange(Done::Complete) == Done::Orphaned) {
        delete d;   /* the handle was released first */
    }
}

/* Let go of the posted batches: cancel those in flight and, with wait, give them up to
 * kReleaseWaitMs to end (a cancelled batch ends once what it posted has completed). */
static void posts_release(std::vector<Group> &groups, bool wait)
{
    for (Group &g : groups) {
        if (g.req == nullptr) {
            continue;
        }
        if (g.done->state != Done::Complete) {
            xfer_status_t st = xfer_request_cancel(g.req);

            if (wait && ((st == XFER_OK) || (st == XFER_ERR_BUSY))) {
                xfer_request_wait(g.req, kReleaseWaitMs);
            }
        }
        xfer_request_release(g.req);
        g.req = nullptr;
        if (g.done->state.exchange(Done::Orphaned) == Done::Complete) {
            delete g.done;
        }
        g.done = nullptr;
    }
}

void ReqH::release_posts()
{
    posts_release(groups, true);
}

ReqH::~ReqH()
{
    release_posts();
    for (Group &g : groups) {
        if (g.batch != nullptr) {
            xfer_batch_destroy(g.batch);
        }
    }
}

/* ---- preparing ------------------------------------------------------------------------------ */

nixl_status_t Engine::groups_build(ReqH *h, const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote) const
{
    std::map<std::pair<LocalMD *, RemoteMD *>, size_t> open;   /* the group still filling */
    xfer_endpoint_t *ep = nullptr;
    nixl_status_t ret;
    xfer_status_t st;

    ret = endpoint_of(h->agent, &ep);
    if (ret != NIXL_SUCCESS) {
        return ret;
    }
    for (size_t i = 0; i < local.descCount(); i++) {
        auto *lmd = static_cast<MD *>(local[i].metadataP);
        auto *rmd = static_cast<MD *>(remote[i].metadataP);
        xfer_batch_desc_t d;

        if ((lmd == nullptr) || (lmd->kind != MD::Local) || (rmd == nullptr) ||
            (rmd->kind != MD::Remote) || (static_cast<RemoteMD *>(rmd)->agent != h->agent)) {
            log_error("descriptor %zu: not one of this agent's registrations and one of %s's",
                      i, h->agent.c_str());
            return NIXL_ERR_INVALID_PARAM;
        }
        auto *l = static_cast<LocalMD *>(lmd);
        auto *r = static_cast<RemoteMD *>(rmd);
        if (r->rkey == nullptr) {
            xfer_rkey_t *rkey = nullptr;

            st = xfer_rkey_unpack(ep, r->blob.data(), r->blob.size(), &rkey);
            if (st != XFER_OK) {
                log_error("%s's remote key does not unpack: %s", h->agent.c_str(),
                          xfer_status_string(st));
                return status_of(st);
            }
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (r->rkey == nullptr) {
                    r->rkey = rkey;
                    rkey    = nullptr;
                }
            }
            if (rkey != nullptr) {
                xfer_rkey_destroy(rkey);    /* another thread unpacked it meanwhile */
            }
        }
        if (local[i].len != remote[i].len) {
            log_error("descriptor %zu: %zu local bytes against %zu remote", i, local[i].len,
                      remote[i].len);
            return NIXL_ERR_INVALID_PARAM;
        }
        /* below the registration's start: the wrapped offset is out of its range, which
         * xfer_batch_create refuses */
        d.local_offset  = local[i].addr - reinterpret_cast<uintptr_t>(xfer_mem_address(l->mem));
        d.remote_offset = remote[i].addr - xfer_rkey_address(r->rkey);
        d.length        = local[i].len;
        auto it = open.find({l, r});
        if ((it == open.end()) || (h->groups[it->second].descs.size() >= kBatchMaxDescs)) {
            h->groups.emplace_back();
            h->groups.back().local  = l;
            h->groups.back().remote = r;
            open[{l, r}]            = h->groups.size() - 1;
            it                      = open.find({l, r});
        }
        h->groups[it->second].descs.push_back(d);
    }
    for (Group &g : h->groups) {
        st = xfer_batch_create(ep, (h->op == NIXL_WRITE) ? XFER_BATCH_PUT : XFER_BATCH_GET,
                               g.local->mem, g.remote->rkey, g.descs.data(), g.descs.size(),
                               &g.batch);
        if (st != XFER_OK) {
            log_error("a batch of %zu descriptors to %s: %s", g.descs.size(), h->agent.c_str(),
                      xfer_status_string(st));
            return status_of(st);
        }
    }
    return NIXL_SUCCESS;
}

nixl_status_t Engine::prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                               const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                               nixlBackendReqH *&handle, const nixl_opt_b_args_t *opt_args) const
{
    auto h = std::make_unique<ReqH>();
    nixl_status_t ret;

    (void)opt_args;
    if ((operation != NIXL_READ) && (operation != NIXL_WRITE)) {
        return NIXL_ERR_INVALID_PARAM;
    }
    if (local.descCount() != remote.descCount()) {
        log_error("prepXfer: %zu local descriptors against %zu remote", local.descCount(),
                  remote.descCount());
        return NIXL_ERR_INVALID_PARAM;
    }
    for (nixl_mem_t seg : {local.getType(), remote.getType()}) {
        xfer_mem_type_t type;

        if (!mem_type_of(seg, &type)) {
            log_error("prepXfer: only DRAM_SEG%s memory", vram_ ? " and VRAM_SEG" : "");
            return NIXL_ERR_NOT_SUPPORTED;
        }
    }
    h->op    = operation;
    h->agent = remote_agent;
    h->local = (remote_agent == localAgent);
    if (!h->local) {
        ret = groups_build(h.get(), local, remote);
        if (ret != NIXL_SUCCESS) {
            return ret;
        }
    }
    handle = h.release();
    return NIXL_SUCCESS;
}

/* ---- posting -------------------------------------------------------------------------------- */

/* Whether [addr, addr + len) lies in mem. */
static bool within(xfer_mem_t *mem, uintptr_t addr, size_t len)
{
    auto base = reinterpret_cast<uintptr_t>(xfer_mem_address(mem));

    return (addr >= base) && (len <= xfer_mem_length(mem)) &&
           (addr - base <= xfer_mem_length(mem) - len);
}

nixl_status_t Engine::local_copy(ReqH *h, const nixl_meta_dlist_t &local,
                                 const nixl_meta_dlist_t &remote) const
{
    for (size_t i = 0; i < local.descCount(); i++) {
        auto *l = static_cast<MD *>(local[i].metadataP);
        auto *r = static_cast<MD *>(remote[i].metadataP);

        if ((l == nullptr) || (l->kind != MD::Local) || (r == nullptr) ||
            (r->kind != MD::LocalRef) || (local[i].len != remote[i].len) ||
            !within(static_cast<LocalMD *>(l)->mem, local[i].addr, local[i].len) ||
            !within(static_cast<LocalRefMD *>(r)->md->mem, remote[i].addr, remote[i].len)) {
            log_error("local transfer, descriptor %zu: not inside this agent's registrations",
                      i);
            return NIXL_ERR_INVALID_PARAM;
        }
        if ((xfer_mem_type(static_cast<LocalMD *>(l)->mem) != XFER_MEM_HOST) ||
            (xfer_mem_type(static_cast<LocalRefMD *>(r)->md->mem) != XFER_MEM_HOST)) {
            /* a copy within one agent is a memmove, which device memory does not take */
            log_error("local transfer, descriptor %zu: VRAM within one agent is not supported "
                      "(only between agents)", i);
            return NIXL_ERR_NOT_SUPPORTED;
        }
    }
    for (size_t i = 0; i < local.descCount(); i++) {
        auto *lp = reinterpret_cast<void *>(local[i].addr);
        auto *rp = reinterpret_cast<void *>(remote[i].addr);

        memmove((h->op == NIXL_WRITE) ? rp : lp, (h->op == NIXL_WRITE) ? lp : rp, local[i].len);
    }
    if (h->has_notif) {
        notif_add(h->notif.data(), h->notif.size());
    }
    return NIXL_SUCCESS;
}

nixl_status_t Engine::group_post(ReqH *h, Group &g, bool with_notif) const
{
    xfer_status_t st;

    g.done = new Done;
    st     = xfer_batch_post(g.batch, with_notif ? h->notif.data() : nullptr,
                             with_notif ? h->notif.size() : 0, XFER_BATCH_NO_TIMEOUT, batch_done,
                             g.done, &g.req);
    if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {
        delete g.done;
        g.done = nullptr;
        log_error("posting a batch of %zu descriptors to %s%s: %s", g.descs.size(),
                  h->agent.c_str(), with_notif ? " with its notification" : "",
                  xfer_status_string(st));
        return status_of(st);
    }
    if (with_notif) {
        h->notif_posted = true;
    }
    return NIXL_SUCCESS;
}

nixl_status_t Engine::postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                               const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                               nixlBackendReqH *&handle, const nixl_opt_b_args_t *opt_args) const
{
    auto *h = static_cast<ReqH *>(handle);
    size_t n;

    (void)operation;
    (void)remote_agent;
    if (h->posted && (checkXfer(h) == NIXL_IN_PROG)) {
        return NIXL_ERR_REPOST_ACTIVE;
    }
    posts_release(h->groups, false);    /* the previous post's, all complete */
    h->has_notif    = (opt_args != nullptr) && opt_args->hasNotif;
    h->notif        = h->has_notif ? notif_pack(opt_args->notifMsg) : std::string();
    h->notif_posted = false;
    h->failed       = NIXL_SUCCESS;
    h->posted       = false;
    if (h->local) {
        return local_copy(h, local, remote);
    }
    n = h->groups.size();
    if (n == 0) {
        return h->has_notif ? genNotif(h->agent, opt_args->notifMsg) : NIXL_SUCCESS;
    }
    h->posted = true;
    for (size_t i = 0; i < n; i++) {
        nixl_status_t ret;

        if (h->has_notif && (i == n - 1) && (n > 1)) {
            break;  /* the last batch carries it, once the others completed (checkXfer) */
        }
        ret = group_post(h, h->groups[i], h->has_notif && (n == 1));
        if (ret != NIXL_SUCCESS) {
            posts_release(h->groups, true);
            h->posted = false;
            return ret;
        }
    }
    return NIXL_IN_PROG;
}

nixl_status_t Engine::checkXfer(nixlBackendReqH *handle) const
{
    auto *h = static_cast<ReqH *>(handle);
    bool pending = false, waiting = false;

    if (!h->posted || (h->failed != NIXL_SUCCESS)) {
        return h->failed;
    }
    if (!progress_thread_) {
        xfer_progress(ctx_);
    }
    for (Group &g : h->groups) {
        if (g.done == nullptr) {
            waiting = true;     /* the last batch, held back for the notification */
            continue;
        }
        if (g.done->state != Done::Complete) {
            pending = true;
            continue;
        }
        if (g.done->status != XFER_OK) {
            log_error("a transfer to %s failed: %s", h->agent.c_str(),
                      xfer_status_string(g.done->status));
            h->failed = status_of(g.done->status);
            posts_release(h->groups, false);    /* cancel the rest; nothing notifies */
            return h->failed;
        }
    }
    if (pending) {
        return NIXL_IN_PROG;
    }
    if (waiting) {
        h->failed = group_post(h, h->groups.back(), true);
        return (h->failed == NIXL_SUCCESS) ? NIXL_IN_PROG : h->failed;
    }
    h->posted = false;
    return NIXL_SUCCESS;
}

nixl_status_t Engine::releaseReqH(nixlBackendReqH *handle) const
{
    delete static_cast<ReqH *>(handle);     /* cancels what is in flight */
    return NIXL_SUCCESS;
}

} // namespace xfer_nixl
