/*
 * The GPUDirect RDMA flush (NCCL's, src/transport/net_ib: the "flush QP"). A completion says
 * the NIC has written the data, not that the GPU will see it: the writes may still be on
 * their way through the PCIe fabric to GPU memory when the completion reaches host memory.
 * A read of the same GPU memory by the NIC cannot pass those writes (PCIe ordering), so once
 * a 1-byte RDMA READ of the buffer completes, every earlier write into it is visible to the
 * GPU. The read goes through a QP connected to itself on the same port and protection domain
 * (so the buffer's rkey serves it) and lands in an 8-byte host word.
 *
 * The flush runs synchronously where the verbs code completes an operation into GPU memory:
 * a loopback read on an idle QP is one PCIe round trip, and waiting for it there keeps the
 * verbs state machines as they are. It has its own CQ, polled only here, so the adapter's
 * completion handling never sees it.
 */
#include "gdr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct xfer_gdr_flush {
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;          /* of word */
    uint64_t      word;         /* where the read lands */
    double        timeout;
    uint64_t      count;
    int           broken;
    char          broken_why[XFER_REASON_MAX];
};

static xfer_status_t qp_connect_self(xfer_gdr_flush_t *f, const xfer_gdr_flush_params_t *p,
                                     char *why, size_t why_size)
{
    struct ibv_qp_attr attr;
    union ibv_gid gid;

    memset(&attr, 0, sizeof(attr));
    attr.qp_state        = IBV_QPS_INIT;
    attr.port_num        = p->port;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(f->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                      IBV_QP_ACCESS_FLAGS) != 0) {
        xfer_reason_set(why, why_size, "flush QP to INIT: %s", strerror(errno));
        return XFER_ERR_IO;
    }

    memset(&attr, 0, sizeof(attr));
    attr.qp_state           = IBV_QPS_RTR;
    attr.path_mtu           = p->port_attr->active_mtu;
    attr.dest_qp_num        = f->qp->qp_num;
    attr.rq_psn             = 0;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer      = 12;
    attr.ah_attr.dlid       = p->port_attr->lid;
    attr.ah_attr.port_num   = p->port;
    if ((p->port_attr->link_layer == IBV_LINK_LAYER_ETHERNET) || (p->port_attr->lid == 0)) {
        if ((p->gid_index < 0) || (ibv_query_gid(p->ctx, p->port, p->gid_index, &gid) != 0)) {
            xfer_reason_set(why, why_size, "flush QP: no GID at index %d of port %u",
                            p->gid_index, (unsigned)p->port);
            return XFER_ERR_IO;
        }
        attr.ah_attr.is_global      = 1;
        attr.ah_attr.grh.hop_limit  = 1;
        attr.ah_attr.grh.sgid_index = (uint8_t)p->gid_index;
        attr.ah_attr.grh.dgid       = gid;
    }
    if (ibv_modify_qp(f->qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                      IBV_QP_MIN_RNR_TIMER) != 0) {
        xfer_reason_set(why, why_size, "flush QP 0x%x to RTR (to itself): %s", f->qp->qp_num,
                        strerror(errno));
        return XFER_ERR_IO;
    }

    memset(&attr, 0, sizeof(attr));
    attr.qp_state      = IBV_QPS_RTS;
    attr.sq_psn        = 0;
    attr.timeout       = 14;    /* 67 ms per try; the read never leaves the device */
    attr.retry_cnt     = 6;     /* not 7, which rxe takes as "retry forever" */
    attr.rnr_retry     = 7;
    attr.max_rd_atomic = 1;
    if (ibv_modify_qp(f->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        xfer_reason_set(why, why_size, "flush QP 0x%x to RTS: %s", f->qp->qp_num,
                        strerror(errno));
        return XFER_ERR_IO;
    }
    return XFER_OK;
}

xfer_status_t xfer_gdr_flush_create(const xfer_gdr_flush_params_t *params,
                                    xfer_gdr_flush_t **flush_p, char *why, size_t why_size)
{
    struct ibv_qp_init_attr init;
    xfer_gdr_flush_t *f;
    xfer_status_t status;

    f = calloc(1, sizeof(*f));
    if (f == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    f->timeout = params->timeout;
    f->cq      = ibv_create_cq(params->ctx, 1, NULL, NULL, 0);
    if (f->cq == NULL) {
        xfer_reason_set(why, why_size, "flush CQ: %s", strerror(errno));
        status = XFER_ERR_NO_RESOURCE;
        goto err_free;
    }
    f->mr = ibv_reg_mr(params->pd, &f->word, sizeof(f->word), IBV_ACCESS_LOCAL_WRITE);
    if (f->mr == NULL) {
        xfer_reason_set(why, why_size, "flush landing word: ibv_reg_mr: %s", strerror(errno));
        status = XFER_ERR_NO_RESOURCE;
        goto err_destroy_cq;
    }
    memset(&init, 0, sizeof(init));
    init.send_cq          = f->cq;
    init.recv_cq          = f->cq;
    init.qp_type          = IBV_QPT_RC;
    init.cap.max_send_wr  = 1;
    init.cap.max_recv_wr  = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    f->qp = ibv_create_qp(params->pd, &init);
    if (f->qp == NULL) {
        xfer_reason_set(why, why_size, "flush QP: %s", strerror(errno));
        status = XFER_ERR_NO_RESOURCE;
        goto err_dereg;
    }
    status = qp_connect_self(f, params, why, why_size);
    if (status != XFER_OK) {
        goto err_destroy_qp;
    }
    *flush_p = f;
    return XFER_OK;

err_destroy_qp:
    ibv_destroy_qp(f->qp);
err_dereg:
    ibv_dereg_mr(f->mr);
err_destroy_cq:
    ibv_destroy_cq(f->cq);
err_free:
    free(f);
    return status;
}

void xfer_gdr_flush_destroy(xfer_gdr_flush_t *f)
{
    if (f == NULL) {
        return;
    }
    ibv_destroy_qp(f->qp);
    ibv_dereg_mr(f->mr);
    ibv_destroy_cq(f->cq);
    free(f);
}

xfer_status_t xfer_gdr_flush_run(xfer_gdr_flush_t *f, uint64_t addr, uint32_t rkey, char *why,
                                 size_t why_size)
{
    struct ibv_send_wr wr, *bad;
    struct ibv_sge sge;
    struct ibv_wc wc;
    double deadline;
    int n;

    if (f->broken) {
        xfer_reason_set(why, why_size, "%s", f->broken_why);
        return XFER_ERR_IO;
    }
    sge.addr   = (uintptr_t)&f->word;
    sge.length = 1;
    sge.lkey   = f->mr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id               = ++f->count;
    wr.opcode              = IBV_WR_RDMA_READ;
    wr.send_flags          = IBV_SEND_SIGNALED;
    wr.sg_list             = &sge;
    wr.num_sge             = 1;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey        = rkey;
    if (ibv_post_send(f->qp, &wr, &bad) != 0) {
        xfer_reason_set(f->broken_why, sizeof(f->broken_why), "flush read: ibv_post_send: %s",
                        strerror(errno));
        goto broken;
    }
    deadline = xfer_now_sec() + f->timeout;
    while ((n = ibv_poll_cq(f->cq, 1, &wc)) == 0) {
        if (xfer_now_sec() > deadline) {
            xfer_reason_set(f->broken_why, sizeof(f->broken_why), "flush read of 0x%llx did "
                            "not complete within %.3f s", (unsigned long long)addr, f->timeout);
            goto broken;
        }
    }
    if (n < 0) {
        xfer_reason_set(f->broken_why, sizeof(f->broken_why), "flush: ibv_poll_cq failed");
        goto broken;
    }
    if (wc.status != IBV_WC_SUCCESS) {
        xfer_reason_set(f->broken_why, sizeof(f->broken_why), "flush read of 0x%llx: %s",
                        (unsigned long long)addr, ibv_wc_status_str(wc.status));
        goto broken;
    }
    return XFER_OK;

broken:
    f->broken = 1;
    xfer_reason_set(why, why_size, "%s", f->broken_why);
    return XFER_ERR_IO;
}

uint64_t xfer_gdr_flush_count(const xfer_gdr_flush_t *f)
{
    return f->count;
}
