/*
 * The tcp receive state machine fed as a byte stream (components/tcp), with the rest of the
 * component as it runs: a real iface and endpoint whose socket is one end of a socketpair,
 * the input written into the other end in chunks of varying size, progress driven until it
 * stops after each. Before the input arrives, receives are posted, a region is registered
 * (id and address fixed, its key put into the input, so that PUT_REQ and GET_REQ frames can
 * hit it) and puts, a
 * get and tensor fetches are outstanding (so that responses can match); the framework's
 * upcalls are this file's (tensor_request answers at once, later, with an error or with a
 * bad tensor, by the key's first byte; release, withdraw and ep_failed record), and so is
 * tag matching: xfer_tag_arrive and xfer_tag_done are defined here, in place of
 * framework/tag_match.c's (which needs a whole context), as a small matcher with three
 * posted receives and a bounded store for what nobody receives. After the input, the peer
 * closes its end, and everything is torn down.
 *
 * The endpoint may fail - a protocol error is a correct outcome. What must not happen: a
 * crash, a sanitizer report, a leak, a hang (progress that never settles), a frame the
 * endpoint sends that a peer's parser would refuse, an operation completed twice or never,
 * a waiter withdrawn after its ready() or never answered nor withdrawn, a tensor released
 * twice or never, ep_failed twice, a message handed to the matcher with a length past the
 * limit, a matcher handle finished twice or never.
 */
#include "fuzz.h"
#include "fuzz_tcp_stream.h"
#include "../../components/tcp/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__has_feature)
# if __has_feature(address_sanitizer)
#  define TS_ASAN 1
# endif
#endif
#if defined(__SANITIZE_ADDRESS__)
# define TS_ASAN 1
#endif
#ifdef TS_ASAN
# include <sanitizer/asan_interface.h>
#endif

extern const xfer_component_v1_t xfer_component_v1;
static const xfer_component_v1_t *const comp = &xfer_component_v1;

typedef struct ts_comp {
    xfer_comp_t   comp;
    const char    *what;
    int           done;
    xfer_status_t status;
    size_t        length;
} ts_comp_t;

/* A receive of the harness's matcher: posted, then matched (its data on the way), then done. */
typedef enum { R_POSTED, R_MATCHED, R_DONE } ts_recv_state_t;

typedef struct ts_recv {
    int             comp;       /* its COMP_RECV_* */
    uint64_t        tag, mask;
    void            *buf;
    size_t          capacity;
    ts_recv_state_t state;
    uint64_t        msg_len;
} ts_recv_t;

/* A message nobody received: its bytes are written into data, then done. */
typedef struct ts_unexp {
    struct ts_unexp *next;
    uint64_t        len;
    int             done;
    uint8_t         data[];
} ts_unexp_t;

enum { COMP_RECV_EXACT, COMP_RECV_ANY_PEER, COMP_RECV_ANY_TAG, COMP_PUT_SMALL, COMP_PUT_LARGE,
       COMP_GET, COMP_FETCH_BUF, COMP_FETCH_ALLOC, COMP_FETCH_CANCELLED, NUM_COMPS };

typedef enum { W_WAITING, W_READY, W_WITHDRAWN } ts_waiter_state_t;

typedef struct ts_waiter {
    xfer_tensor_waiter_t *waiter;
    ts_waiter_state_t    state;
    int                  later;     /* answered by answer_later() */
    int                  handed;    /* ready(XFER_OK) gave a handle: release it once */
    int                  released;
} ts_waiter_t;

/* The peer's view of what the endpoint sends: each frame must parse. */
typedef struct ts_out {
    uint8_t             buf[XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_TRESP_EXT_MAX +
                            XFER_TCP_WIRE_MAX_REASON];
    size_t              have, need;
    uint64_t            skip;
    xfer_tcp_wire_hdr_t hdr;
} ts_out_t;

typedef struct ts {
    xfer_iface_h  iface;
    xfer_ep_h     ep;
    int           peer;             /* the harness's end of the socketpair */
    int           fw_ep;            /* its address is the endpoint's fw_ep */
    unsigned      failed;           /* ep_failed calls */
    ts_comp_t     comps[NUM_COMPS];
    ts_recv_t     recvs[3];         /* in matching order: exact, any peer, any tag */
    ts_unexp_t    *unexp;           /* newest first */
    uint64_t      unexp_bytes;
    unsigned      tag_open;         /* handles given out and not yet done */
    uint64_t      budget_held;      /* charged to the process's budgets, not given back */
    ts_waiter_t   *waiters;
    size_t        num_waiters, cap_waiters;
    void          *alloced;         /* what the alloc callback returned */
    ts_out_t      out;
    uint8_t       recv_exact[16], recv_any_peer[64], recv_any_tag[8];
    uint8_t       put_src[TS_PUT_LARGE_LEN], get_dst[TS_GET_LEN], fetch_buf[TS_FETCH_CAPACITY];
    xfer_tensor_t result_buf, result_alloc, result_cancelled;
} ts_t;

static const xfer_tcp_wire_limits_t peer_limits = {TS_MAX_MSG, TS_MAX_KEY};
static const float tensor_data[6] = {1, 2, 3, 4, 5, 6};

/* ---- the registered region: guarded on both sides ------------------------------------------- */

static uint8_t *region_get(void)
{
    static uint8_t *region;
    const size_t page = TS_REGION_LEN;
    uint8_t *p;

    if (region != NULL) {
        return region;
    }
    p = mmap((void*)(uintptr_t)(TS_REGION_ADDR - page), 3 * page, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) {      /* seeds will miss it; everything else still runs */
        p = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    FUZZ_CHECK(p != MAP_FAILED, "mmap: %s", strerror(errno));
#ifdef TS_ASAN
    /* a write past the region is reported, also one made by readv() */
    ASAN_POISON_MEMORY_REGION(p, page);
    ASAN_POISON_MEMORY_REGION(p + 2 * page, page);
#else
    FUZZ_CHECK(!mprotect(p, page, PROT_NONE) && !mprotect(p + 2 * page, page, PROT_NONE),
               "mprotect: %s", strerror(errno));
#endif
    region = p + page;
    return region;
}

/* ---- upcalls -------------------------------------------------------------------------------- */

static void comp_cb(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    ts_comp_t *c = (ts_comp_t*)self;

    (void)tag;
    FUZZ_CHECK(!c->done, "%s completed twice", c->what);
    c->done   = 1;
    c->status = status;
    c->length = length;
}

static ts_waiter_t *waiter_find(ts_t *ts, xfer_tensor_waiter_t *waiter)
{
    for (size_t i = 0; i < ts->num_waiters; i++) {
        if ((ts->waiters[i].waiter == waiter) && (ts->waiters[i].state == W_WAITING)) {
            return &ts->waiters[i];
        }
    }
    return NULL;
}

/* Answer waiter number i; the handle is its number + 1. */
static void waiter_answer(ts_t *ts, size_t i, char how)
{
    xfer_tensor_t t;
    ts_waiter_t *w = &ts->waiters[i];
    xfer_tensor_waiter_t *waiter = w->waiter;

    w->state = W_READY;
    if (how == TS_KEY_ERROR) {
        waiter->ready(waiter, XFER_ERR_NOT_FOUND, NULL, NULL);
        return;
    }
    memset(&t, 0, sizeof(t));
    t.dtype   = XFER_DTYPE_FLOAT32;
    t.rank    = 2;
    t.dims[0] = 2;
    t.dims[1] = 3;
    t.size    = sizeof(tensor_data);
    t.data    = (void*)tensor_data;
    if (how == TS_KEY_DEAD) {
        t.is_dead = 1;
        t.size    = 0;
        t.data    = NULL;
    } else if (how == TS_KEY_BAD) {
        t.size = 7;
    }
    w->handed = 1;
    waiter->ready(waiter, XFER_OK, &t, (void*)(uintptr_t)(i + 1));
}

static void up_tensor_request(void *fw_arg, void *fw_ep, uint64_t step, const char *key,
                              size_t key_len, xfer_tensor_waiter_t *waiter)
{
    ts_t *ts = fw_arg;
    char how = (key_len > 0) ? key[0] : 0;

    (void)step;
    FUZZ_CHECK(fw_ep == &ts->fw_ep, "tensor_request names another endpoint");
    FUZZ_CHECK(key_len <= TS_MAX_KEY, "a %zu-byte key reached the framework", key_len);
    FUZZ_CHECK(waiter_find(ts, waiter) == NULL, "a waiting waiter handed over again");
    if (ts->num_waiters == ts->cap_waiters) {
        size_t cap = ts->cap_waiters ? 2 * ts->cap_waiters : 16;
        ts_waiter_t *w = realloc(ts->waiters, cap * sizeof(*w));

        FUZZ_CHECK(w != NULL, "out of memory");
        ts->waiters     = w;
        ts->cap_waiters = cap;
    }
    memset(&ts->waiters[ts->num_waiters], 0, sizeof(ts->waiters[0]));
    ts->waiters[ts->num_waiters].waiter = waiter;
    ts->waiters[ts->num_waiters].state  = W_WAITING;
    ts->num_waiters++;
    if (how == TS_KEY_LATER) {
        ts->waiters[ts->num_waiters - 1].later = 1;
        return;
    }
    waiter_answer(ts, ts->num_waiters - 1, how);
}

static void up_tensor_withdraw(void *fw_arg, xfer_tensor_waiter_t *waiter)
{
    ts_waiter_t *w = waiter_find(fw_arg, waiter);

    FUZZ_CHECK(w != NULL, "withdraws a waiter that is not waiting");
    w->state = W_WITHDRAWN;
}

static void up_tensor_release(void *fw_arg, void *handle, xfer_status_t status)
{
    ts_t *ts = fw_arg;
    size_t i = (size_t)(uintptr_t)handle;

    (void)status;
    FUZZ_CHECK((i >= 1) && (i <= ts->num_waiters), "releases an unknown handle %p", handle);
    FUZZ_CHECK(ts->waiters[i - 1].handed && !ts->waiters[i - 1].released,
               "releases tensor %zu twice, or one it was not given", i);
    ts->waiters[i - 1].released = 1;
}

static void up_ep_failed(void *fw_arg, void *fw_ep, xfer_status_t status, const char *reason)
{
    ts_t *ts = fw_arg;

    FUZZ_CHECK(fw_ep == &ts->fw_ep, "ep_failed names another endpoint");
    FUZZ_CHECK((status != XFER_OK) && (reason != NULL), "ep_failed without a failure");
    FUZZ_CHECK(++ts->failed == 1, "ep_failed reported twice");
}

static void *fetch_alloc(void *alloc_arg, const xfer_tensor_t *meta)
{
    ts_t *ts = alloc_arg;
    char why[XFER_REASON_MAX];

    FUZZ_CHECK(ts->alloced == NULL, "alloc called twice for one fetch");
    FUZZ_CHECK(xfer_tensor_meta_check(meta->dtype, meta->rank, meta->dims, meta->size,
                                      meta->is_dead, why, sizeof(why)) == XFER_OK,
               "alloc called with metadata that does not hold: %s", why);
    if (meta->size > TS_ALLOC_MAX) {
        return NULL;
    }
    ts->alloced = malloc(meta->size ? meta->size : 1);
    return ts->alloced;
}

/* ---- tag matching: the framework's, in small ------------------------------------------------ */

static ts_t *ts_current;        /* handles carry no harness pointer of their own */

static void recv_init(ts_t *ts, int i, int ci, uint64_t tag, uint64_t mask, void *buf,
                      size_t capacity)
{
    ts_recv_t *r = &ts->recvs[i];

    r->comp     = ci;
    r->tag      = tag;
    r->mask     = mask;
    r->buf      = buf;
    r->capacity = capacity;
    r->state    = R_POSTED;
}

static void recv_complete(ts_t *ts, ts_recv_t *r, xfer_status_t status)
{
    r->state = R_DONE;
    comp_cb(&ts->comps[r->comp].comp, status, (size_t)r->msg_len, r->tag);
}

/* The component offers an arriving message's header; the contract is component.h's. */
int xfer_tag_arrive(void *fw_arg, void *fw_ep, uint64_t tag, uint64_t length, unsigned flags,
                    const void *priv, size_t priv_len, xfer_tag_dest_t *dest)
{
    ts_t *ts = fw_arg;
    uint64_t room;
    ts_unexp_t *ue;

    (void)priv;
    FUZZ_CHECK(ts == ts_current, "xfer_tag_arrive with another iface's fw_arg");
    FUZZ_CHECK(fw_ep == &ts->fw_ep, "xfer_tag_arrive names another endpoint");
    FUZZ_CHECK(length <= TS_MAX_MSG, "a %llu-byte message reached the matcher",
               (unsigned long long)length);
    FUZZ_CHECK(!(flags & XFER_TAG_ARRIVE_RNDV) && (priv_len == 0),
               "tcp offers a rendezvous message");
    memset(dest, 0, sizeof(*dest));
    for (int i = 0; i < 3; i++) {
        ts_recv_t *r = &ts->recvs[i];

        if ((r->state == R_POSTED) && (((tag ^ r->tag) & r->mask) == 0)) {
            r->state       = R_MATCHED;
            r->msg_len     = length;
            dest->buf      = r->buf;
            dest->capacity = r->capacity;
            dest->handle   = r;
            ts->tag_open++;
            return XFER_TAG_MATCHED;
        }
    }
    room = TS_MAX_UNEXPECTED * ((flags & XFER_TAG_ARRIVE_URGENT) ? 2 : 1);
    if (!(flags & XFER_TAG_ARRIVE_FORCE) && (ts->unexp_bytes + length > room)) {
        return XFER_TAG_PAUSE;
    }
    ue = malloc(sizeof(*ue) + length);
    if (ue == NULL) {
        return XFER_TAG_NO_MEMORY;
    }
    ue->len          = length;
    ue->done         = 0;
    ue->next         = ts->unexp;
    ts->unexp        = ue;
    ts->unexp_bytes += length;
    dest->buf        = ue->data;
    dest->capacity   = (size_t)length;
    dest->handle     = (uint8_t*)ue + 1;   /* odd: tells it from a receive */
    dest->over       = ts->unexp_bytes > TS_MAX_UNEXPECTED;
    ts->tag_open++;
    return XFER_TAG_UNEXPECTED;
}

void xfer_tag_done(void *handle, xfer_status_t status)
{
    ts_t *ts = ts_current;

    FUZZ_CHECK((ts != NULL) && (ts->tag_open > 0), "xfer_tag_done without a message");
    ts->tag_open--;
    if ((uintptr_t)handle & 1) {
        ts_unexp_t *ue = (ts_unexp_t*)((uint8_t*)handle - 1);

        FUZZ_CHECK(!ue->done, "xfer_tag_done twice for a message nobody received");
        ue->done = 1;
        return;
    }
    {
        ts_recv_t *r = handle;

        FUZZ_CHECK((r >= ts->recvs) && (r < ts->recvs + 3) && (r->state == R_MATCHED),
                   "xfer_tag_done for a receive that is not being filled");
        if ((status == XFER_OK) && (r->msg_len > r->capacity)) {
            status = XFER_ERR_TRUNCATED;
        }
        recv_complete(ts, r, status);
    }
}

/* A receive cancelled: as xfer_cancel answers for one the framework holds. */
static xfer_status_t recv_cancel(ts_t *ts, int i)
{
    ts_recv_t *r = &ts->recvs[i];

    switch (r->state) {
    case R_POSTED:
        r->msg_len = 0;
        recv_complete(ts, r, XFER_ERR_CANCELED);
        return XFER_OK;
    case R_MATCHED:
        return XFER_ERR_BUSY;
    default:
        return XFER_ERR_NOT_FOUND;
    }
}

static void matcher_cleanup(ts_t *ts)
{
    FUZZ_CHECK(ts->tag_open == 0, "%u message(s) handed to the matcher never finished",
               ts->tag_open);
    for (int i = 0; i < 3; i++) {
        (void)recv_cancel(ts, i);
    }
    while (ts->unexp != NULL) {
        ts_unexp_t *ue = ts->unexp;

        ts->unexp = ue->next;
        free(ue);
    }
}

/* ---- the process's budgets: the framework's, in small ----------------------------------------
 * Every amount is granted (the budget's limits are libxfer's to test); what is checked is
 * that the component never gives back more than its queue holds and holds nothing at the
 * end. */

void xfer_budget_queue_add(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q,
                           uint64_t amount)
{
    FUZZ_CHECK((ts_current != NULL) && (fw_ep == &ts_current->fw_ep),
               "a budget charged to another endpoint");
    FUZZ_CHECK(kind == XFER_BUDGET_ANSWERS, "tcp charges budget kind %d", (int)kind);
    q->held    += amount;
    q->granted  = q->held;
    ts_current->budget_held += amount;
}

void xfer_budget_queue_remove(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q,
                              uint64_t amount)
{
    (void)kind;
    FUZZ_CHECK((ts_current != NULL) && (fw_ep == &ts_current->fw_ep),
               "a budget given back by another endpoint");
    FUZZ_CHECK((amount <= q->held) && (amount <= ts_current->budget_held),
               "gives back %llu of a queue that holds %llu", (unsigned long long)amount,
               (unsigned long long)q->held);
    q->held    -= amount;
    q->granted  = q->held;
    ts_current->budget_held -= amount;
}

int xfer_budget_queue_within(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q)
{
    (void)fw_ep;
    (void)kind;
    FUZZ_CHECK(q->granted == q->held, "a queue held past what was granted");
    return 1;
}

/* ---- the peer's side ------------------------------------------------------------------------ */

static size_t out_ext_len(unsigned type)
{
    switch (type) {
    case XFER_TCP_WIRE_PUT_REQ:     return XFER_TCP_WIRE_PUT_EXT_LEN;
    case XFER_TCP_WIRE_GET_REQ:     return XFER_TCP_WIRE_GET_EXT_LEN;
    case XFER_TCP_WIRE_TENSOR_REQ:  return XFER_TCP_WIRE_TREQ_EXT_LEN;
    case XFER_TCP_WIRE_TENSOR_RESP: return XFER_TCP_WIRE_TRESP_EXT_LEN;
    default:                        return 0;
    }
}

/* The frame header (and extension) in out->buf is complete: check it, set what to skip. */
static void out_frame(ts_out_t *out)
{
    const uint8_t *ext = out->buf + XFER_TCP_WIRE_HDR_LEN;
    xfer_tcp_wire_tensor_resp_t resp;
    xfer_tcp_wire_tensor_req_t req;
    xfer_tcp_wire_rma_t rma;
    char why[XFER_REASON_MAX] = "";
    size_t ext_len;

    if (out->have == XFER_TCP_WIRE_HDR_LEN) {
        FUZZ_CHECK(xfer_tcp_wire_unpack_hdr(out->buf, &peer_limits, &out->hdr, why,
                                            sizeof(why)) == XFER_OK,
                   "the endpoint sent a header its peer refuses: %s", why);
        ext_len = out_ext_len(out->hdr.type);
        if (ext_len > 0) {
            out->need += ext_len;
            return;
        }
    } else if (out->hdr.type == XFER_TCP_WIRE_TENSOR_RESP) {
        size_t need;
        xfer_status_t st = xfer_tcp_wire_unpack_tensor_resp_ext(ext, out->have -
                                                                XFER_TCP_WIRE_HDR_LEN,
                                                                &out->hdr, &peer_limits, &resp,
                                                                &need, why, sizeof(why));

        if (st == XFER_INPROGRESS) {
            out->need = XFER_TCP_WIRE_HDR_LEN + need;   /* its dims and reason */
            return;
        }
        FUZZ_CHECK(st == XFER_OK, "the endpoint sent a bad TENSOR_RESP: %s", why);
    } else if (out->need == XFER_TCP_WIRE_HDR_LEN + out_ext_len(out->hdr.type)) {
        switch (out->hdr.type) {
        case XFER_TCP_WIRE_PUT_REQ:
            FUZZ_CHECK(xfer_tcp_wire_unpack_put_ext(ext, &out->hdr, &rma, why, sizeof(why)) ==
                       XFER_OK, "the endpoint sent a bad PUT_REQ: %s", why);
            break;
        case XFER_TCP_WIRE_GET_REQ:
            FUZZ_CHECK(xfer_tcp_wire_unpack_get_ext(ext, &out->hdr, &peer_limits, &rma, why,
                                                    sizeof(why)) == XFER_OK,
                       "the endpoint sent a bad GET_REQ: %s", why);
            break;
        case XFER_TCP_WIRE_TENSOR_REQ:
            FUZZ_CHECK(xfer_tcp_wire_unpack_tensor_req_ext(ext, &out->hdr, &peer_limits, &req,
                                                           why, sizeof(why)) == XFER_OK,
                       "the endpoint sent a bad TENSOR_REQ: %s", why);
            break;
        default:
            break;
        }
    }
    out->skip = out->hdr.length - (out->have - XFER_TCP_WIRE_HDR_LEN);
    out->have = 0;
    out->need = XFER_TCP_WIRE_HDR_LEN;
}

static void out_feed(ts_out_t *out, const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t k;

        if (out->skip > 0) {
            k = (out->skip < n) ? (size_t)out->skip : n;
            out->skip -= k;
        } else {
            k = (out->need - out->have < n) ? out->need - out->have : n;
            memcpy(out->buf + out->have, p, k);
            out->have += k;
            if (out->have == out->need) {
                out_frame(out);
            }
        }
        p += k;
        n -= k;
    }
}

/* Read what the endpoint sent; 1 when there was something. */
static int peer_drain(ts_t *ts)
{
    uint8_t buf[65536];
    int any = 0;
    ssize_t n;

    while ((n = recv(ts->peer, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
        out_feed(&ts->out, buf, (size_t)n);
        any = 1;
    }
    return any;
}

/* Answer the waiters that wait for "later", as the framework does once a tensor is
 * published: from outside any call into the component. */
static int answer_later(ts_t *ts)
{
    int any = 0;

    for (size_t i = 0; i < ts->num_waiters; i++) {
        if ((ts->waiters[i].state == W_WAITING) && ts->waiters[i].later) {
            waiter_answer(ts, i, (i % 3 == 2) ? TS_KEY_ERROR : 0);
            any = 1;
        }
    }
    return any;
}

/* Progress until nothing happens any more. */
static void drive(ts_t *ts)
{
    for (unsigned rounds = 0;; rounds++) {
        unsigned n = comp->progress(ts->iface);

        n += (unsigned)peer_drain(ts);
        n += (unsigned)answer_later(ts);
        if (n == 0) {
            return;
        }
        FUZZ_CHECK(rounds < 100000, "progress never settles");
    }
}

/* ---- set-up and teardown -------------------------------------------------------------------- */

static void comp_init(ts_t *ts, int i, const char *what)
{
    ts->comps[i].comp.cb = comp_cb;
    ts->comps[i].what    = what;
}

static void fetch(ts_t *ts, const char *key, uint64_t step, void *buffer, xfer_tensor_t *result,
                  int ci)
{
    xfer_fetch_args_t args = {0};

    args.step      = step;
    args.key       = key;
    args.key_len   = strlen(key);
    args.buffer    = buffer;
    args.capacity  = buffer ? TS_FETCH_CAPACITY : 0;
    args.alloc     = buffer ? NULL : fetch_alloc;
    args.alloc_arg = ts;
    args.result    = result;
    FUZZ_CHECK(comp->tensor_fetch(ts->ep, &args, &ts->comps[ci].comp) == XFER_INPROGRESS,
               "fetch '%s'", key);
}

static void setup(ts_t *ts, const xfer_tcp_config_t *cfg, uint8_t *region, xfer_memh_h *memh_p,
                  xfer_rkey_h *rkey_p)
{
    xfer_iface_params_t params = {0};
    xfer_ep_params_t ep_params = {0};
    uint8_t addr[XFER_TCP_WIRE_EP_ADDR_LEN], rkey_buf[XFER_REGION_KEY_LEN];
    size_t rkey_len = sizeof(rkey_buf);
    uintptr_t base = (uintptr_t)region;
    int sv[2];

    comp_init(ts, COMP_RECV_EXACT, "receive of the exact tag");
    comp_init(ts, COMP_RECV_ANY_PEER, "receive from any peer");
    comp_init(ts, COMP_RECV_ANY_TAG, "receive of any tag");
    comp_init(ts, COMP_PUT_SMALL, "small put");
    comp_init(ts, COMP_PUT_LARGE, "large put");
    comp_init(ts, COMP_GET, "get");
    comp_init(ts, COMP_FETCH_BUF, "fetch into a buffer");
    comp_init(ts, COMP_FETCH_ALLOC, "fetch with alloc");
    comp_init(ts, COMP_FETCH_CANCELLED, "cancelled fetch");

    params.size            = sizeof(params);
    params.fw_arg          = ts;
    params.max_key_len     = TS_MAX_KEY;
    params.tensor_request  = up_tensor_request;
    params.tensor_withdraw = up_tensor_withdraw;
    params.tensor_release  = up_tensor_release;
    params.ep_failed       = up_ep_failed;
    FUZZ_CHECK(comp->iface_open(cfg, &params, &ts->iface) == XFER_OK, "iface_open");

    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
               strerror(errno));
    ts->peer            = sv[1];
    ep_params.size      = sizeof(ep_params);
    ep_params.fw_ep     = &ts->fw_ep;
    ep_params.sock_fd   = sv[0];
    ep_params.is_server = 1;
    FUZZ_CHECK(comp->ep_create(ts->iface, &ep_params, &ts->ep) == XFER_OK, "ep_create");
    close(sv[0]);       /* the component keeps its own descriptor, as with the framework's */
    {
        /* one lane: the harness is the peer's whole connection (a socketpair has no port) */
        xfer_tcp_wire_ep_addr_t peer_addr = {peer_limits, 1, 0, 0, 0};

        xfer_tcp_wire_pack_ep_addr(&peer_addr, addr);
    }
    FUZZ_CHECK(comp->ep_connect(ts->ep, addr, sizeof(addr)) == XFER_OK, "ep_connect");

    FUZZ_CHECK(comp->mem_reg(ts->iface, region, TS_REGION_LEN, XFER_MEM_HOST, memh_p) ==
               XFER_OK, "mem_reg");
    FUZZ_CHECK((*memh_p)->region.id == TS_REGION_ID, "region id %llu",
               (unsigned long long)(*memh_p)->region.id);
    FUZZ_CHECK((comp->rkey_pack(ts->iface, *memh_p, rkey_buf, &rkey_len) == XFER_OK) &&
               (comp->rkey_unpack(ts->iface, rkey_buf, rkey_len, rkey_p) == XFER_OK), "rkey");

    recv_init(ts, 0, COMP_RECV_EXACT, TS_TAG_EXACT, UINT64_MAX, ts->recv_exact,
              sizeof(ts->recv_exact));
    recv_init(ts, 1, COMP_RECV_ANY_PEER, TS_TAG_ANY_PEER, UINT64_MAX, ts->recv_any_peer,
              sizeof(ts->recv_any_peer));
    recv_init(ts, 2, COMP_RECV_ANY_TAG, 0, 0, ts->recv_any_tag, sizeof(ts->recv_any_tag));

    /* in slot order (fuzz_tcp_stream.h): their ids are TS_ID(slot) */
    FUZZ_CHECK(comp->put(ts->ep, ts->put_src, TS_PUT_SMALL_LEN, NULL, base, *rkey_p,
                         &ts->comps[COMP_PUT_SMALL].comp) == XFER_INPROGRESS, "put");
    FUZZ_CHECK(comp->put(ts->ep, ts->put_src, TS_PUT_LARGE_LEN, NULL, base + 1024, *rkey_p,
                         &ts->comps[COMP_PUT_LARGE].comp) == XFER_INPROGRESS, "put");
    FUZZ_CHECK(comp->get(ts->ep, ts->get_dst, TS_GET_LEN, NULL, base + 64, *rkey_p,
                         &ts->comps[COMP_GET].comp) == XFER_INPROGRESS, "get");
    fetch(ts, "fetch_buf", 1, ts->fetch_buf, &ts->result_buf, COMP_FETCH_BUF);
    fetch(ts, "fetch_alloc", 2, NULL, &ts->result_alloc, COMP_FETCH_ALLOC);
    fetch(ts, "fetch_cancelled", 3, ts->fetch_buf, &ts->result_cancelled,
          COMP_FETCH_CANCELLED);
    FUZZ_CHECK(comp->cancel(ts->iface, &ts->comps[COMP_FETCH_CANCELLED].comp,
                            XFER_ERR_CANCELED) == XFER_OK, "cancel");
}

/* Write the input in chunks of varying size, progressing after each. */
static void feed(ts_t *ts, const uint8_t *data, size_t size)
{
    static const size_t chunks[] = {1, 24, 7, 100, 3, 4096, 57, 512};
    size_t off = 0;

    for (unsigned i = 0; off < size; i++) {
        size_t n = chunks[i % (sizeof(chunks) / sizeof(chunks[0]))];
        ssize_t w;

        if (n > size - off) {
            n = size - off;
        }
        w = send(ts->peer, data + off, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += (size_t)w;
            drive(ts);
            continue;
        }
        if ((w < 0) && (errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR)) {
            return;     /* the endpoint closed its end */
        }
        drive(ts);
        w = send(ts->peer, data + off, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) {
            return;     /* the endpoint reads no more (paused, or failed) */
        }
        off += (size_t)w;
        drive(ts);
    }
}

static void check_done(ts_t *ts)
{
    for (int i = 0; i < NUM_COMPS; i++) {
        FUZZ_CHECK(ts->comps[i].done, "%s never completed", ts->comps[i].what);
    }
    if (ts->comps[COMP_RECV_EXACT].status == XFER_OK) {
        FUZZ_CHECK(ts->comps[COMP_RECV_EXACT].length <= sizeof(ts->recv_exact), "length");
    }
    if (ts->comps[COMP_RECV_ANY_PEER].status == XFER_OK) {
        FUZZ_CHECK(ts->comps[COMP_RECV_ANY_PEER].length <= sizeof(ts->recv_any_peer), "length");
    }
    if (ts->comps[COMP_RECV_ANY_TAG].status == XFER_OK) {
        FUZZ_CHECK(ts->comps[COMP_RECV_ANY_TAG].length <= sizeof(ts->recv_any_tag), "length");
    }
    if (ts->comps[COMP_FETCH_BUF].status == XFER_OK) {
        FUZZ_CHECK((ts->result_buf.size <= TS_FETCH_CAPACITY) &&
                   (ts->result_buf.data == ts->fetch_buf), "fetch result");
    }
    if ((ts->comps[COMP_FETCH_ALLOC].status == XFER_OK) && (ts->result_alloc.size > 0) &&
        !ts->result_alloc.is_dead) {
        FUZZ_CHECK(ts->result_alloc.data == ts->alloced, "fetch result");
    }
    FUZZ_CHECK(ts->comps[COMP_FETCH_CANCELLED].status == XFER_ERR_CANCELED, "cancelled");
    for (size_t i = 0; i < ts->num_waiters; i++) {
        const ts_waiter_t *w = &ts->waiters[i];

        FUZZ_CHECK(w->state != W_WAITING, "waiter %zu neither answered nor withdrawn", i);
        FUZZ_CHECK(w->released == w->handed, "tensor %zu handed over but never released", i);
    }
}

/* The input with every TS_COOKIE (little-endian) replaced by the region's real key: a
 * region's key is random, and the seeds name it by that stand-in. */
static uint8_t *with_region_key(const uint8_t *data, size_t size, uint64_t key)
{
    uint8_t *in = malloc(size ? size : 1), from[8], to[8];

    FUZZ_CHECK(in != NULL, "out of memory");
    memcpy(in, data, size);
    for (int i = 0; i < 8; i++) {
        from[i] = (uint8_t)(TS_COOKIE >> (8 * i));
        to[i]   = (uint8_t)(key >> (8 * i));
    }
    for (size_t at = 0; at + 8 <= size; at++) {
        if (memcmp(in + at, from, 8) == 0) {
            memcpy(in + at, to, 8);
            at += 7;
        }
    }
    return in;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    xfer_tcp_config_t cfg = {0};
    xfer_memh_h memh      = NULL;
    xfer_rkey_h rkey      = NULL;
    uint8_t *region       = region_get();
    xfer_status_t status;
    uint8_t *in;
    ts_t *ts;

    ts = calloc(1, sizeof(*ts));
    FUZZ_CHECK(ts != NULL, "out of memory");
    ts_current          = ts;
    ts->out.need        = XFER_TCP_WIRE_HDR_LEN;
    cfg.iface           = "lo";
    cfg.eager_threshold = TS_EAGER;
    cfg.max_msg_size    = TS_MAX_MSG;
    /* acknowledged puts hold request ids that answers in the input can match; a PUT_FAIL or
     * FLUSH_ACK in the input meets an endpoint that sent no PUT and no FLUSH_REQ */
    cfg.put_ack         = 1;
    memset(region, 0, TS_REGION_LEN);

    setup(ts, &cfg, region, &memh, &rkey);
    drive(ts);
    in = with_region_key(data, size, memh->region.key);
    feed(ts, in, size);
    free(in);
    /* what the state machine holds mid-frame: cancels that may find it busy */
    status = recv_cancel(ts, 1);
    FUZZ_CHECK((status == XFER_OK) || (status == XFER_ERR_BUSY) ||
               (status == XFER_ERR_NOT_FOUND), "cancel: %d", status);
    status = comp->cancel(ts->iface, &ts->comps[COMP_FETCH_BUF].comp, XFER_ERR_CANCELED);
    FUZZ_CHECK((status == XFER_OK) || (status == XFER_ERR_BUSY) ||
               (status == XFER_ERR_NOT_FOUND), "cancel: %d", status);
    drive(ts);
    shutdown(ts->peer, SHUT_WR);
    drive(ts);

    /* a region deregistered while the endpoint may still read into or send from it */
    comp->mem_dereg(ts->iface, memh);
    comp->rkey_release(ts->iface, rkey);
    drive(ts);
    comp->ep_destroy(ts->ep);
    comp->iface_close(ts->iface);
    close(ts->peer);
    matcher_cleanup(ts);
    FUZZ_CHECK(ts->budget_held == 0, "the endpoint went holding %llu bytes of budget",
               (unsigned long long)ts->budget_held);
    check_done(ts);
    free(ts->alloced);
    free(ts->waiters);
    free(ts);
    ts_current = NULL;
    return 0;
}
