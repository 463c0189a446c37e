/*
 * The NCCL plug-in's connections: listen, connect (never blocking: the handshake runs on a
 * thread of its own), accept, and the close calls.
 */
#include "nccl_plugin.h"
#include "../common/host_address.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- connections -------------------------------------------------------------------------- */

ncclResult_t xn_listen(int dev, void *handle, void **listen_comm)
{
    xn_handle_t *h = handle;
    char host[64], at[80];
    xn_listen_t *lc;
    xfer_status_t st;
    ncclResult_t ret = xn_check_dev(dev);

    *listen_comm = NULL;
    if (ret != ncclSuccess) {
        return ret;
    }
    lc = calloc(1, sizeof(*lc));
    if (lc == NULL) {
        return ncclSystemError;
    }
    /* listen where peers are told to connect, nothing wider; an advertised name this host
     * cannot bind (a NAT's address) falls back to every interface */
    xfer_contrib_host_address("XFER_NCCL_HOST", host, sizeof(host));
    snprintf(at, sizeof(at), strchr(host, ':') ? "[%s]:0" : "%s:0", host);
    st = xfer_listen(xn.ctx, at, &lc->listener);
    if (st == XFER_ERR_UNAVAILABLE) {
        xn_info("cannot listen at %s (not an address of this host): listening on every "
                "interface", at);
        st = xfer_listen(xn.ctx, "*:0", &lc->listener);
    }
    if (st != XFER_OK) {
        xn_warn("xfer_listen: %s", xfer_status_string(st));
        free(lc);
        return xn_result(st);
    }
    memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    h->magic = XN_HANDLE_MAGIC;
    snprintf(h->address, sizeof(h->address), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
             (unsigned)xfer_listener_port(lc->listener));
    xn_info("listening at %s", h->address);
    *listen_comm = lc;
    return ncclSuccess;
}

static xn_comm_t *comm_new(xfer_endpoint_t *ep, int is_send)
{
    xn_comm_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        xfer_endpoint_close_nb(ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
        return NULL;
    }
    c->ep      = ep;
    c->is_send = is_send;
    pthread_mutex_lock(&xn.lock);
    c->next  = xn.comms;
    xn.comms = c;
    pthread_mutex_unlock(&xn.lock);
    return c;
}

static void *connect_thread(void *arg)
{
    xn_connect_t *pc = arg;

    pc->status = xfer_connect(xn.ctx, pc->address, &pc->ep);
    atomic_store(&pc->done, 1);
    return NULL;
}

ncclResult_t xn_connect(int dev, void *handle, void **send_comm,
                               ncclNetDeviceHandle_v8_t **dev_comm)
{
    const xn_handle_t *h = handle;
    xn_connect_t *pc, **pp;
    ncclResult_t ret = xn_check_dev(dev);

    *send_comm = NULL;
    if (ret != ncclSuccess) {
        return ret;
    }
    if ((dev_comm != NULL) && (*dev_comm != NULL)) {
        xn_warn("device offload was asked for; this plug-in has none");
        return ncclInvalidUsage;
    }
    pthread_mutex_lock(&xn.lock);
    for (pp = &xn.connects; (*pp != NULL) && ((*pp)->key != handle); pp = &(*pp)->next) {
    }
    pc = *pp;
    if (pc == NULL) {
        /* the first call for this handle: it came from the peer, check it as such */
        if ((h->magic != XN_HANDLE_MAGIC) ||
            (memchr(h->address, '\0', sizeof(h->address)) == NULL)) {
            pthread_mutex_unlock(&xn.lock);
            xn_warn("connect: the handle is not one of this plug-in's listen handles");
            return ncclInvalidArgument;
        }
        pc = calloc(1, sizeof(*pc));
        if (pc == NULL) {
            pthread_mutex_unlock(&xn.lock);
            return ncclSystemError;
        }
        pc->key = handle;
        snprintf(pc->address, sizeof(pc->address), "%s", h->address);
        if (pthread_create(&pc->thread, NULL, connect_thread, pc) != 0) {
            pthread_mutex_unlock(&xn.lock);
            free(pc);
            xn_warn("connect to %s: cannot start its thread", h->address);
            return ncclSystemError;
        }
        pc->next    = xn.connects;
        xn.connects = pc;
        pthread_mutex_unlock(&xn.lock);
        return ncclSuccess;     /* called again until *send_comm is set */
    }
    if (!atomic_load(&pc->done)) {
        pthread_mutex_unlock(&xn.lock);
        return ncclSuccess;
    }
    *pp = pc->next;
    pthread_mutex_unlock(&xn.lock);
    pthread_join(pc->thread, NULL);
    if (pc->status != XFER_OK) {
        xn_warn("connect to %s: %s", pc->address, xfer_status_string(pc->status));
        ret = xn_result(pc->status);
        free(pc);
        return ret;
    }
    xn_info("connected to %s over %s", pc->address, xfer_endpoint_transport(pc->ep));
    *send_comm = comm_new(pc->ep, 1);
    free(pc);
    return (*send_comm != NULL) ? ncclSuccess : ncclSystemError;
}

ncclResult_t xn_accept(void *listen_comm, void **recv_comm,
                              ncclNetDeviceHandle_v8_t **dev_comm)
{
    xn_listen_t *lc = listen_comm;
    xfer_endpoint_t *ep;
    xfer_status_t st;

    *recv_comm = NULL;
    if ((dev_comm != NULL) && (*dev_comm != NULL)) {
        xn_warn("device offload was asked for; this plug-in has none");
        return ncclInvalidUsage;
    }
    st = xfer_accept(lc->listener, 0, &ep);
    if (st != XFER_OK) {
        /* nothing yet (XFER_ERR_TIMEOUT), or a handshake that failed - a stranger, a peer
         * that went; xfer logged it - after which the listener keeps working */
        if (st != XFER_ERR_TIMEOUT) {
            xn_info("accept: a handshake failed: %s", xfer_status_string(st));
        }
        return ncclSuccess;
    }
    xn_info("accepted %s over %s", xfer_endpoint_peer(ep), xfer_endpoint_transport(ep));
    *recv_comm = comm_new(ep, 0);
    return (*recv_comm != NULL) ? ncclSuccess : ncclSystemError;
}

/* ---- closing ------------------------------------------------------------------------------ */

static ncclResult_t close_comm(xn_comm_t *c)
{
    if (c == NULL) {
        return ncclSuccess;
    }
    pthread_mutex_lock(&xn.lock);
    for (xn_comm_t **p = &xn.comms; *p != NULL; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    pthread_mutex_unlock(&xn.lock);
    for (int i = 0; i < NCCL_NET_MAX_REQUESTS; i++) {
        if (c->reqs[i].used) {
            xn_req_put(&c->reqs[i]);  /* NCCL tests them no more: they go with the ep */
        }
    }
    xfer_endpoint_close(c->ep);     /* flushes what was reported sent, bounded in time */
    free(c);
    return ncclSuccess;
}

ncclResult_t xn_close_send(void *send_comm)
{
    return close_comm(send_comm);
}

ncclResult_t xn_close_recv(void *recv_comm)
{
    return close_comm(recv_comm);
}

ncclResult_t xn_close_listen(void *listen_comm)
{
    xn_listen_t *lc = listen_comm;

    if (lc != NULL) {
        xfer_listener_close(lc->listener);
        free(lc);
    }
    return ncclSuccess;
}
