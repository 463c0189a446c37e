/*
 * The two processes of the CUDA suites (cuda_peer.h).
 */
#include "cuda_peer.h"

#include <xfer/info.h>

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the peer -------------------------------------------------------------------------------- */

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

static dt_region_t region = DT_REGION_DEVICE;    /* the peer's D, set before it is forked */

void dt_peer_region(dt_region_t kind)
{
    region = kind;
}

static const char *peer_env_name, *peer_env_value;   /* likewise */

void dt_peer_env(const char *name, const char *value)
{
    peer_env_name  = name;
    peer_env_value = value;
}

/* n bytes into D at off from host memory, or out of it. */
static void d_write(const xfer_cuda_driver_t *drv, xfer_cu_ptr_t d, uint64_t off,
                    const void *src, size_t n)
{
    if (region == DT_REGION_DEVICE) {
        TP_CHECK(drv->memcpy_htod(d + off, src, n) == 0, "cuMemcpyHtoD");
    } else {
        memcpy((char*)(uintptr_t)d + off, src, n);
    }
}

static void d_read(const xfer_cuda_driver_t *drv, void *dst, xfer_cu_ptr_t d, uint64_t off,
                   size_t n)
{
    if (region == DT_REGION_DEVICE) {
        TP_CHECK(drv->memcpy_dtoh(dst, d + off, n) == 0, "cuMemcpyDtoH");
    } else {
        memcpy(dst, (const char*)(uintptr_t)d + off, n);
    }
}

int dt_serve(tp_side_t *s)
{
    char why[XFER_REASON_MAX];
    const xfer_cuda_driver_t *drv;
    char *host = malloc(DT_MAXLEN);
    xfer_cu_ptr_t dptr = 0;
    void *cu_ctx, *blob, *malloced = NULL;
    xfer_mem_t *mem;
    size_t len;

    TP_CHECK(host != NULL, "malloc");
    if (peer_env_name != NULL) {
        setenv(peer_env_name, peer_env_value, 1);
    }
    if (xfer_cuda_init(why, sizeof(why)) != XFER_OK) {
        TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");  /* no GPU: the parent skips */
        free(host);
        return 0;
    }
    drv = xfer_cuda_driver(why, sizeof(why));
    TP_CHECK(drv != NULL, "%s", why);
    TP_CHECK(drv->device_primary_ctx_retain(&cu_ctx, 0) == 0, "primary context");
    TP_CHECK(drv->ctx_set_current(cu_ctx) == 0, "set context");
    if (region == DT_REGION_DEVICE) {
        TP_CHECK(drv->mem_alloc(&dptr, DT_MAXLEN) == 0, "cuMemAlloc");
        TP_CHECK_STATUS(xfer_mem_register(s->ctx, (void*)(uintptr_t)dptr, DT_MAXLEN,
                                          XFER_MEM_CUDA, &mem), XFER_OK);
    } else if (region == DT_REGION_XFER_ALLOC) {
        TP_CHECK_STATUS(xfer_mem_alloc(s->ctx, DT_MAXLEN, XFER_MEM_HOST, &mem), XFER_OK);
        dptr = (uintptr_t)xfer_mem_address(mem);
    } else {
        malloced = malloc(DT_MAXLEN);
        TP_CHECK(malloced != NULL, "malloc");
        dptr = (uintptr_t)malloced;
        TP_CHECK_STATUS(xfer_mem_register(s->ctx, malloced, DT_MAXLEN, XFER_MEM_HOST, &mem),
                        XFER_OK);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, dptr) == 0, "ctl");
    if (xfer_rkey_pack(mem, &blob, &len) != XFER_OK) {
        /* the transport does not move CUDA memory itself: no puts and gets into it (only the
         * initiator's side of those is staged), tags and tensors through host memory */
        TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");
    } else {
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
        xfer_rkey_blob_free(blob);
    }
    for (;;) {
        xfer_request_t *req = NULL;
        uint64_t cmd, a, b, c;

        TP_CHECK(tp_progress_until_ctl(s, 120000) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        if (cmd == CMD_DONE) {
            break;
        }
        switch (cmd) {
        case CMD_ECHO:
            a = ctl_u64(s);
            b = ctl_u64(s);
            TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, b, UINT64_MAX, (void*)(uintptr_t)dptr,
                                             a, mem, NULL, NULL, &req)), "tag recv");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
            TP_CHECK(xfer_request_length(req) == a, "received %zu bytes of %llu",
                     xfer_request_length(req), (unsigned long long)a);
            xfer_request_release(req);
            req = NULL;
            TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, b + 1, (void*)(uintptr_t)dptr, a, mem,
                                             NULL, NULL, &req)), "tag send");
            if (req != NULL) {
                TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
                xfer_request_release(req);
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 2) == 0, "ctl");
            break;
        case CMD_FILL:
            tp_fill_pattern(host, DT_MAXLEN, ctl_u64(s));
            d_write(drv, dptr, 0, host, DT_MAXLEN);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            break;
        case CMD_CHECK: {
            ssize_t bad;

            a = ctl_u64(s);
            b = ctl_u64(s);
            c = ctl_u64(s);
            d_read(drv, host, dptr, a, b);
            bad = tp_check_pattern(host, b, c);
            TP_CHECK(tp_ctl_send_u64(s->ctl, (bad < 0) ? 1 : (uint64_t)bad + 2) == 0, "ctl");
            break;
        }
        case CMD_PUBLISH: {
            xfer_tensor_t t = {XFER_DTYPE_UINT8, 1, {0}, 0, NULL, 0};

            a = ctl_u64(s);
            b = ctl_u64(s);
            c = ctl_u64(s);
            tp_fill_pattern(host, b, c);
            d_write(drv, dptr, 0, host, b);
            t.dims[0] = (int64_t)b;
            t.size    = b;
            t.data    = (void*)(uintptr_t)dptr;
            if (ctl_u64(s) != 0) {
                /* XFER_PUBLISH_COPY: the tensor is copied at once; the device buffer is the
                 * caller's again and changes before anyone fetches */
                TP_CHECK(TP_POSTED(xfer_tensor_publish(s->ctx, a, "t", &t, XFER_PUBLISH_COPY,
                                                       NULL, NULL, &req)), "publish");
                tp_fill_pattern(host, b, c + 1000);
                d_write(drv, dptr, 0, host, b);
            } else {
                TP_CHECK(TP_POSTED(xfer_tensor_publish(s->ctx, a, "t", &t, 0, NULL, NULL,
                                                       &req)), "publish");
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
            xfer_request_release(req);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 2) == 0, "ctl");
            break;
        }
        case CMD_STALL_SENDING: {
            char *big;

            a   = ctl_u64(s);
            b   = ctl_u64(s);
            big = malloc(a);
            TP_CHECK(big != NULL, "malloc");
            memset(big, 0x5a, a);
            TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, b, big, a, NULL, NULL, NULL, &req)),
                     "tag send");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            tp_ctl_recv_u64(s->ctl, &c, TP_WAIT_MS * 3);    /* killed before this returns */
            return 1;
        }
        case CMD_WATCH: {
            uint64_t pause_ms;
            char last = 0;
            double end;

            a        = ctl_u64(s);
            b        = ctl_u64(s);
            pause_ms = ctl_u64(s);
            TP_CHECK(a > 0 && a <= DT_MAXLEN, "length");
            tp_fill_pattern(host, a, b);
            c = (uint8_t)host[a - 1];
            for (uint64_t other = b + 1000; (uint8_t)host[a - 1] == c; other++) {
                tp_fill_pattern(host, a, other);
            }
            d_write(drv, dptr, 0, host, a);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            /* over tcp a pause lets the put pile up in the socket: it is then read in one
             * go, more of it than there are bounce buffers; none watches a put that the
             * initiator copies itself (shm) while it lands */
            usleep((useconds_t)pause_ms * 1000);
            end = tp_now_ms() + TP_WAIT_MS;
            do {
                TP_CHECK(tp_now_ms() < end, "the put's last byte never came");
                xfer_progress(s->ctx);
                d_read(drv, &last, dptr, a - 1, 1);
            } while ((uint8_t)last != c);
            d_read(drv, host, dptr, 0, a);
            TP_CHECK(tp_ctl_send_u64(s->ctl, (tp_check_pattern(host, a, b) < 0) ? 2 : 3) == 0,
                     "ctl");
            break;
        }
        case CMD_AWAIT_NOTIFY: {
            char note[64], want[64];
            size_t nlen = 0;
            xfer_status_t st;
            double end;

            a = ctl_u64(s);
            b = ctl_u64(s);
            TP_CHECK(a > 0 && a <= DT_MAXLEN, "length");
            tp_fill_pattern(host, a, b + 1000);
            d_write(drv, dptr, 0, host, a);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            end = tp_now_ms() + TP_WAIT_MS;
            while ((st = xfer_notify_poll(s->ep, note, sizeof(note) - 1, &nlen)) ==
                   XFER_ERR_NOT_FOUND) {
                TP_CHECK(tp_now_ms() < end, "no notification came");
            }
            TP_CHECK_STATUS(st, XFER_OK);
            /* what D holds the moment the notification is taken */
            d_read(drv, host, dptr, 0, a);
            note[nlen] = '\0';
            snprintf(want, sizeof(want), "batch %llu", (unsigned long long)b);
            TP_CHECK(tp_ctl_send_u64(s->ctl, ((tp_check_pattern(host, a, b) < 0) &&
                                              (strcmp(note, want) == 0)) ? 2 : 3) == 0, "ctl");
            break;
        }
        case CMD_KEY:
            TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
            xfer_rkey_blob_free(blob);
            break;
        case CMD_STALL:
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            tp_ctl_recv_u64(s->ctl, &c, TP_WAIT_MS * 3);    /* killed before this returns */
            return 1;
        default:
            TP_CHECK(0, "unknown command %llu", (unsigned long long)cmd);
        }
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    if (region == DT_REGION_DEVICE) {
        TP_CHECK(drv->mem_free(dptr) == 0, "cuMemFree");
    }
    free(malloced);
    drv->device_primary_ctx_release(0);
    free(host);
    return 0;
}

/* ---- this side ------------------------------------------------------------------------------- */

void dt_start(dev_test_t *t)
{
    void *blob;
    size_t blen;

    memset(t, 0, sizeof(*t));
    t->host = malloc(DT_MAXLEN);
    cr_assert_not_null(t->host);
    tp_start(&t->peer, dt_serve, NULL);
    t->remote = tp_recv(&t->peer);
    if (t->remote == 0) {
        tp_finish(&t->peer);
        fprintf(stderr, "cuda: skipped: the peer found no usable CUDA device\n");
        cr_skip_test("the peer found no usable CUDA device");
    }
    if (tp_recv(&t->peer) != 0) {
        blob = tp_recv_blob(&t->peer, &blen);
        cr_assert_eq(xfer_rkey_unpack(t->peer.ep, blob, blen, &t->rkey), XFER_OK);
        free(blob);
    }
    tg_gpu_open(&t->gpu, "cuda");
    cr_assert_eq(t->gpu.drv->mem_alloc(&t->src, DT_MAXLEN), 0);
    cr_assert_eq(t->gpu.drv->mem_alloc(&t->dst, DT_MAXLEN), 0);
    cr_assert_eq(xfer_mem_register(t->peer.ctx, (void*)(uintptr_t)t->src, DT_MAXLEN, XFER_MEM_CUDA,
                                   &t->src_mem), XFER_OK);
    cr_assert_eq(xfer_mem_register(t->peer.ctx, (void*)(uintptr_t)t->dst, DT_MAXLEN, XFER_MEM_CUDA,
                                   &t->dst_mem), XFER_OK);
}

void dt_finish(dev_test_t *t)
{
    cr_expect_eq(xfer_mem_deregister(t->src_mem), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(t->dst_mem), XFER_OK);
    cr_expect_eq(t->gpu.drv->mem_free(t->src), 0);
    cr_expect_eq(t->gpu.drv->mem_free(t->dst), 0);
    xfer_rkey_destroy(t->rkey);
    if (t->peer.ctl >= 0) {
        tp_send(&t->peer, CMD_DONE);
        tp_finish(&t->peer);
    } else {    /* killed: nothing to wait for */
        xfer_endpoint_close(t->peer.ep);
        xfer_context_destroy(t->peer.ctx);
    }
    t->gpu.drv->device_primary_ctx_release(t->gpu.device);
    free(t->host);
}

void dt_kill(dev_test_t *t)
{
    cr_assert_eq(kill(t->peer.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&t->peer, 10), 128 + SIGKILL);
    close(t->peer.ctl);
    t->peer.ctl = -1;
}

void dt_fill(dev_test_t *t, xfer_cu_ptr_t ptr, size_t len, uint64_t seed)
{
    tp_fill_pattern(t->host, len, seed);
    cr_assert_eq(t->gpu.drv->memcpy_htod(ptr, t->host, len), 0);
}

ssize_t dt_check(dev_test_t *t, xfer_cu_ptr_t ptr, size_t len, uint64_t seed)
{
    cr_assert_eq(t->gpu.drv->memcpy_dtoh(t->host, ptr, len), 0);
    return tp_check_pattern(t->host, len, seed);
}

uint64_t dt_cmd(dev_test_t *t, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c)
{
    tp_send(&t->peer, cmd);
    tp_send(&t->peer, a);
    tp_send(&t->peer, b);
    tp_send(&t->peer, c);
    return tp_recv(&t->peer);
}

void dt_wait_ok(xfer_status_t s, xfer_request_t *req, const char *what, size_t len)
{
    cr_assert(TP_POSTED(s), "%s of %zu bytes: %s", what, len, xfer_status_string(s));
    cr_assert_eq(tp_op_result(s, req, TP_WAIT_MS), XFER_OK, "%s of %zu bytes", what, len);
}
