/*
 * The conformance suite's declaration and its helpers (contract.h). Its tests are in the files
 * named after the sections of docs/contract.md they prove.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(contract, .init = setup, .timeout = 240);

xfer_status_t ct_send(xfer_endpoint_t *ep, uint64_t tag, const void *buf, size_t len)
{
    xfer_request_t *req = NULL;
    xfer_status_t s     = xfer_tag_send(ep, tag, buf, len, NULL, NULL, NULL, &req);

    return tp_op_result(s, req, TP_WAIT_MS);
}

xfer_status_t ct_put(xfer_endpoint_t *ep, const void *buf, size_t len, xfer_mem_t *mem,
                     uint64_t remote_addr, xfer_rkey_t *rkey)
{
    xfer_request_t *req = NULL;
    xfer_status_t s     = xfer_put(ep, buf, len, mem, remote_addr, rkey, NULL, NULL, &req);

    return tp_op_result(s, req, TP_WAIT_MS);
}

xfer_status_t ct_status_change(xfer_context_t *ctx, xfer_endpoint_t *ep, int timeout_ms)
{
    double until = tp_now_ms() + timeout_ms;

    while ((xfer_endpoint_status(ep) == XFER_OK) && (tp_now_ms() < until)) {
        xfer_progress(ctx);
        usleep(200);
    }
    return xfer_endpoint_status(ep);
}

xfer_mem_t *ct_offer(tp_side_t *s, void *buf, size_t len)
{
    xfer_mem_t *mem;
    size_t blob_len;
    void *blob;

    TP_CHECK_STATUS((buf != NULL) ? xfer_mem_register(s->ctx, buf, len, XFER_MEM_HOST, &mem) :
                    xfer_mem_alloc(s->ctx, len, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &blob_len), XFER_OK);
    TP_CHECK(tp_ctl_send(s->ctl, blob, blob_len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    return mem;
}

/* The target's sends in flight: each message's buffer is its own until the send completes. */
typedef struct ct_sent {
    xfer_request_t *req;
    void           *buf;
} ct_sent_t;

#define CT_SENDS_MAX 256

static uint64_t target_recv(tp_side_t *s, uint64_t tag, uint64_t len, uint64_t seed)
{
    uint8_t *buf        = malloc(len + 1);
    xfer_request_t *req = NULL;
    uint64_t answer     = 0;
    ssize_t bad;

    TP_CHECK(buf != NULL, "malloc");
    if (!TP_POSTED(xfer_tag_recv(s->ctx, s->ep, tag, ~0ull, buf, len + 1, NULL, NULL, NULL,
                                 &req))) {
        answer = 1;     /* refused: the endpoint failed */
    } else if (xfer_request_wait(req, TP_WAIT_MS) != XFER_OK) {
        answer = 1;
    } else if (xfer_request_length(req) != len) {
        answer = 2;
    } else if ((bad = tp_check_pattern(buf, len, seed)) >= 0) {
        answer = 3 + (uint64_t)bad;
    }
    if (req != NULL) {
        xfer_request_release(req);
    }
    free(buf);
    return answer;
}

const char *ct_key(char *buf, uint64_t n)
{
    snprintf(buf, CT_KEY_MAX, "ct-%llu", (unsigned long long)n);
    return buf;
}

/* The target's fetch of tensor key of step into a buffer of len bytes of its own. */
static void target_fetch(tp_side_t *s, ct_sent_t *f, uint64_t step, uint64_t key, uint64_t len)
{
    xfer_fetch_params_t params = {.size = sizeof(params)};
    char name[CT_KEY_MAX];

    f->buf          = malloc(len ? len : 1);
    TP_CHECK(f->buf != NULL, "malloc");
    params.buffer   = f->buf;
    params.capacity = len;
    TP_CHECK(TP_POSTED(xfer_tensor_fetch(s->ep, step, ct_key(name, key), &params, NULL, NULL,
                                         &f->req)), "fetch");
}

int ct_target(tp_side_t *s)
{
    static uint8_t region[CT_REGION];
    xfer_mem_t *mem = ct_offer(s, region, sizeof(region));
    static ct_sent_t sent[CT_SENDS_MAX], fetches[CT_SENDS_MAX];
    unsigned nsent = 0, nfetches = 0;

    for (;;) {
        uint64_t cmd, a, b, c, answer = 0;
        ssize_t bad;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no command");
        TP_CHECK((tp_ctl_recv_u64(s->ctl, &cmd, TP_WAIT_MS) == 0) &&
                 (tp_ctl_recv_u64(s->ctl, &a, TP_WAIT_MS) == 0) &&
                 (tp_ctl_recv_u64(s->ctl, &b, TP_WAIT_MS) == 0) &&
                 (tp_ctl_recv_u64(s->ctl, &c, TP_WAIT_MS) == 0), "ctl");
        switch (cmd) {
        case CT_CHECK:
            TP_CHECK(a + b <= sizeof(region), "range");
            bad    = tp_check_pattern(region + a, b, c);
            answer = (bad < 0) ? 0 : 1 + (uint64_t)bad;
            break;
        case CT_FILL:
            TP_CHECK(a + b <= sizeof(region), "range");
            tp_fill_pattern(region + a, b, c);
            break;
        case CT_SEND:
            TP_CHECK(nsent < CT_SENDS_MAX, "too many sends");
            sent[nsent].buf = malloc(b ? b : 1);
            TP_CHECK(sent[nsent].buf != NULL, "malloc");
            tp_fill_pattern(sent[nsent].buf, b, c);
            TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, a, sent[nsent].buf, b, NULL, NULL, NULL,
                                             &sent[nsent].req)), "send");
            nsent++;
            break;
        case CT_RECV:
            answer = target_recv(s, a, b, c);
            break;
        case CT_STATUS:
            answer = (uint64_t)(int64_t)xfer_endpoint_status(s->ep);
            break;
        case CT_FAILED:
            answer = (uint64_t)(int64_t)ct_status_change(s->ctx, s->ep, TP_WAIT_MS);
            break;
        case CT_FETCH:
            TP_CHECK(nfetches < CT_SENDS_MAX, "too many fetches");
            target_fetch(s, &fetches[nfetches++], a, b, c);
            break;
        case CT_FETCHED:
            TP_CHECK(a < nfetches, "no fetch %llu", (unsigned long long)a);
            answer = (uint64_t)(int64_t)xfer_request_wait(fetches[a].req, TP_WAIT_MS);
            break;
        case CT_STOP:
            for (unsigned i = 0; i < nsent; i++) {
                (void)xfer_request_wait(sent[i].req, TP_WAIT_MS);
                xfer_request_release(sent[i].req);
                free(sent[i].buf);
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");
            xfer_endpoint_close(s->ep);     /* its pending fetches end with it */
            s->ep = NULL;
            for (unsigned i = 0; i < nfetches; i++) {
                (void)xfer_request_wait(fetches[i].req, TP_WAIT_MS);
                xfer_request_release(fetches[i].req);
                free(fetches[i].buf);
            }
            TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
            return 0;
        default:
            TP_CHECK(0, "unknown command %llu", (unsigned long long)cmd);
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, answer) == 0, "ctl");
    }
}

void ct_ask(tp_peer_t *p, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c)
{
    tp_send(p, cmd);
    tp_send(p, a);
    tp_send(p, b);
    tp_send(p, c);
}

uint64_t ct_answer(tp_peer_t *p)
{
    /* this side progresses meanwhile: what the target waits for may be ours to write */
    while ((p->ctx != NULL) && !tp_ctl_ready(p->ctl, 0)) {
        xfer_progress(p->ctx);
    }
    return tp_recv(p);
}

uint64_t ct_do(tp_peer_t *p, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c)
{
    ct_ask(p, cmd, a, b, c);
    return ct_answer(p);
}

void ct_close_timeout_scaled(void)
{
    char value[32];

    snprintf(value, sizeof(value), "%dms", TP_WAIT_MS / 2);
    cr_assert_eq(setenv("XFER_CLOSE_TIMEOUT", value, 1), 0);
}

xfer_rkey_t *ct_start(tp_peer_t *p)
{
    xfer_rkey_t *rkey;
    size_t len;
    void *blob;

    tp_start(p, ct_target, NULL);
    blob = tp_recv_blob(p, &len);
    cr_assert_eq(xfer_rkey_unpack(p->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    return rkey;
}
