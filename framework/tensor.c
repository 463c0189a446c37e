/*
 * The rendezvous table: tensors by (step, key).
 *
 * Producer side: xfer_tensor_publish() files a tensor under its key; a peer's request (which a
 * transport hands over as a waiter through tensor_request) takes it - at once when it is
 * there, else the waiter parks under the key until the publish. One publish satisfies one
 * fetch. The tensor's data stays with the transport until it calls tensor_release(), which
 * completes the publish request.
 *
 * Consumer side: xfer_tensor_fetch() hands the fetch to the endpoint's transport and keeps the
 * request on a list so that aborting its step can cancel it.
 *
 * Aborting a step fails everything of that step on this side with the abort status - parked
 * waiters (their peers get the error), unfetched publishes, pending fetches - and remembers
 * the step so that later requests and publishes for it fail as well.
 */
#include "xfer_int.h"
#include "staging.h"

#include <ucs/datastruct/khash.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TENSOR_SUBSYS     "tensor"
#define ABORTED_REMEMBERED 1024     /* aborted steps remembered, oldest forgotten first */

/* A published tensor, pending in the table or handed to a transport. */
typedef struct publication {
    xfer_tensor_t   tensor;
    void            *copy;          /* XFER_PUBLISH_COPY */
    xfer_request_t  *req;
    xfer_endpoint_t *ep;            /* handed to that peer's transport: until released */
    ucs_list_link_t ep_link;        /* ep->tensor_answers */
} publication_t;

/* A peer's request waiting for a key. */
typedef struct waiter_node {
    ucs_list_link_t         list;
    ucs_list_link_t         age;            /* table->parked */
    int64_t                 deadline;       /* xfer_now_ms(): answered XFER_ERR_TIMEOUT then */
    xfer_tensor_waiter_t    *waiter;
    struct slot             *slot;
    xfer_endpoint_t         *ep;            /* the peer's: its count and budget */
} waiter_node_t;

/* One (step, key). The table is a set of slots hashed by their own (step, key); a lookup
 * hashes the caller's pair once into a probe on the stack, so no key string is built and
 * none is hashed twice. */
typedef struct slot {
    uint64_t        step;
    const char      *key;           /* the slot's copy, right after it; a probe's: the caller's */
    size_t          key_len;
    khint_t         hash;           /* of (step, key), see slot_hash() */
    publication_t   *pub;           /* pending publication, at most one */
    ucs_list_link_t waiters;        /* waiter_node_t, in arrival order */
} slot_t;

/* FNV-1a over the key, then the step mixed in (a multiply by 2^64 / golden ratio and a fold) */
static khint_t slot_hash(uint64_t step, const char *key, size_t key_len)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < key_len; i++) {
        h = (h ^ (uint8_t)key[i]) * 0x100000001b3ull;
    }
    h ^= step * 0x9e3779b97f4a7c15ull;
    return (khint_t)(h ^ (h >> 32));
}

#define slot_hash_of(_slot)     ((_slot)->hash)
#define slot_equal(_a, _b) \
    (((_a) == (_b)) || \
     (((_a)->hash == (_b)->hash) && ((_a)->step == (_b)->step) && \
      ((_a)->key_len == (_b)->key_len) && (memcmp((_a)->key, (_b)->key, (_a)->key_len) == 0)))

KHASH_INIT(xfer_slot, slot_t*, char, 0, slot_hash_of, slot_equal)
KHASH_MAP_INIT_INT64(xfer_waiter, waiter_node_t*)

typedef struct xfer_tensor_table {
    khash_t(xfer_slot)      slots;
    khash_t(xfer_waiter)    waiters;        /* waiter pointer -> node, for withdraw */
    ucs_list_link_t         fetches;        /* pending xfer_request_t (fetch_list) */
    ucs_list_link_t         parked;         /* waiter_node_t by arrival: oldest expires first */
    struct {
        uint64_t      step;
        xfer_status_t status;
    }                       aborted[ABORTED_REMEMBERED];
    unsigned                num_aborted, next_aborted;
    xfer_status_t           all_aborted;    /* XFER_OK, or the status of XFER_STEP_ALL */
} xfer_tensor_table_t;

size_t xfer_dtype_size(xfer_dtype_t dtype)
{
    switch (dtype) {
    case XFER_DTYPE_INT8: case XFER_DTYPE_UINT8: case XFER_DTYPE_BOOL:
        return 1;
    case XFER_DTYPE_FLOAT16: case XFER_DTYPE_BFLOAT16: case XFER_DTYPE_INT16:
    case XFER_DTYPE_UINT16:
        return 2;
    case XFER_DTYPE_FLOAT32: case XFER_DTYPE_INT32: case XFER_DTYPE_UINT32:
        return 4;
    case XFER_DTYPE_FLOAT64: case XFER_DTYPE_INT64: case XFER_DTYPE_UINT64:
        return 8;
    default:
        return 0;   /* BYTES: variable; the size is authoritative */
    }
}

xfer_status_t xfer_tensor_table_create(xfer_context_t *ctx)
{
    xfer_tensor_table_t *t = calloc(1, sizeof(*t));

    if (t == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    kh_init_inplace(xfer_slot, &t->slots);
    /* Slots come and go with every step: from a table of 4 buckets the deleted marks forced
     * a rehash every other publish. 64 buckets rehash every ~45 (and never shrink below). */
    if (kh_resize(xfer_slot, &t->slots, 64) < 0) {
        kh_destroy_inplace(xfer_slot, &t->slots);
        free(t);
        return XFER_ERR_NO_MEMORY;
    }
    kh_init_inplace(xfer_waiter, &t->waiters);
    ucs_list_head_init(&t->fetches);
    ucs_list_head_init(&t->parked);
    t->all_aborted = XFER_OK;
    ctx->tensors   = t;
    return XFER_OK;
}

static void publication_finish(publication_t *pub, xfer_status_t status)
{
    if (pub->ep != NULL) {
        ucs_list_del(&pub->ep_link);
    }
    if (pub->req != NULL) {
        xfer_request_complete(pub->req, status, (size_t)pub->tensor.size, 0);
    }
    free(pub->copy);
    free(pub);
}

static void slot_maybe_free(xfer_tensor_table_t *t, slot_t *slot)
{
    khiter_t it;

    if ((slot->pub != NULL) || !ucs_list_is_empty(&slot->waiters)) {
        return;
    }
    it = kh_get(xfer_slot, &t->slots, slot);
    if (it != kh_end(&t->slots)) {
        kh_del(xfer_slot, &t->slots, it);
    }
    free(slot);
}

/* Find (create when asked) the slot of (step, key). */
static slot_t *slot_get(xfer_tensor_table_t *t, uint64_t step, const char *key, size_t key_len,
                        int create)
{
    slot_t probe = {.step = step, .key = key, .key_len = key_len,
                    .hash = slot_hash(step, key, key_len)};
    slot_t *slot;
    char *copy;
    khiter_t it;
    int ret;

    it = kh_get(xfer_slot, &t->slots, &probe);
    if (it != kh_end(&t->slots)) {
        return kh_key(&t->slots, it);
    }
    if (!create) {
        return NULL;
    }
    /* malloc and fill, here and for publications: glibc's calloc bypasses the per-thread
     * cache, and each is once per tensor */
    slot = malloc(sizeof(*slot) + key_len + 1);
    if (slot == NULL) {
        return NULL;
    }
    *slot = probe;
    copy  = (char*)(slot + 1);
    memcpy(copy, key, key_len);
    copy[key_len] = '\0';
    slot->key     = copy;
    slot->pub     = NULL;
    ucs_list_head_init(&slot->waiters);
    kh_put(xfer_slot, &t->slots, slot, &ret);
    if (ret < 0) {
        free(slot);
        return NULL;
    }
    return slot;
}

xfer_status_t xfer_tensor_step_status(xfer_context_t *ctx, uint64_t step)
{
    xfer_tensor_table_t *t = ctx->tensors;

    if (t->all_aborted != XFER_OK) {
        return t->all_aborted;
    }
    for (unsigned i = 0; i < t->num_aborted; i++) {
        if (t->aborted[i].step == step) {
            return t->aborted[i].status;
        }
    }
    return XFER_OK;
}

/* Take a parked waiter off the table (its slot list and the withdraw index); returns it. */
static xfer_tensor_waiter_t *node_take(xfer_tensor_table_t *t, waiter_node_t *node)
{
    xfer_tensor_waiter_t *waiter = node->waiter;
    khiter_t it = kh_get(xfer_waiter, &t->waiters, (uint64_t)(uintptr_t)waiter);

    if (it != kh_end(&t->waiters)) {
        kh_del(xfer_waiter, &t->waiters, it);
    }
    ucs_list_del(&node->list);
    ucs_list_del(&node->age);
    node->ep->tensor_waiting--;
    xfer_budget_give(node->ep, XFER_BUDGET_TENSOR, 1);
    free(node);
    return waiter;
}

/* The oldest of slot's waiting requests that the producer lets have it (tensor_access.c),
 * or NULL: the others go on waiting, as for a tensor that does not exist. */
static waiter_node_t *first_allowed(xfer_context_t *ctx, slot_t *slot)
{
    waiter_node_t *node;

    ucs_list_for_each(node, &slot->waiters, list) {
        /* a closing endpoint's request goes with it: it takes nothing published now */
        if (!node->ep->closing &&
            xfer_tensor_access_allows(ctx, node->ep, slot->step, slot->key, slot->key_len)) {
            return node;
        }
    }
    return NULL;
}

/* Hand a publication to a waiter of ep's (the waiter's node is already off the lists). Until
 * the transport releases it, ep's orderly close waits for it (its data may still be read). */
static void hand_over(publication_t *pub, xfer_tensor_waiter_t *waiter, xfer_endpoint_t *ep)
{
    pub->ep = ep;
    ucs_list_add_tail(&ep->tensor_answers, &pub->ep_link);
    waiter->ready(waiter, XFER_OK, &pub->tensor, pub);
}

void xfer_tensor_ep_gone(xfer_endpoint_t *ep)
{
    while (!ucs_list_is_empty(&ep->tensor_answers)) {
        ucs_list_extract_head(&ep->tensor_answers, publication_t, ep_link)->ep = NULL;
    }
}

xfer_status_t xfer_tensor_publish(xfer_context_t *ctx, uint64_t step, const char *key,
                                  const xfer_tensor_t *tensor, uint32_t flags,
                                  xfer_request_cb_t cb, void *user_data,
                                  xfer_request_t **req_p)
{
    xfer_tensor_table_t *t;
    publication_t *pub = NULL;
    waiter_node_t *node;
    xfer_status_t status;
    size_t key_len;
    slot_t *slot;

    if ((ctx == NULL) || (tensor == NULL) || (flags & ~(uint32_t)XFER_PUBLISH_COPY)) {
        xfer_refuse(TENSOR_SUBSYS, "xfer_tensor_publish: %s",
                    (ctx && tensor) ? "unknown flags" : "NULL argument");
        return XFER_ERR_INVALID_PARAM;
    }
    status = xfer_tensor_key_check(ctx, key, &key_len);
    if (status == XFER_OK) {
        status = xfer_tensor_check(tensor);
    }
    if (status != XFER_OK) {
        return status;
    }
    xfer_ctx_lock(ctx);
    t      = ctx->tensors;
    status = xfer_api_check(ctx, "xfer_tensor_publish", 1);
    if (status != XFER_OK) {
        goto out;
    }
    status = xfer_tensor_step_status(ctx, step);
    if (status != XFER_OK) {
        xfer_refuse(TENSOR_SUBSYS, "cannot publish '%s': step %llu was aborted "
                    "(%s)", key, (unsigned long long)step, xfer_status_string(status));
        status = XFER_ERR_ABORTED;
        goto out;
    }
    slot = slot_get(t, step, key, key_len, 1);
    if (slot == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    if (slot->pub != NULL) {
        xfer_refuse(TENSOR_SUBSYS, "'%s' is already published in step %llu and "
                    "not fetched yet", key, (unsigned long long)step);
        status = XFER_ERR_EXISTS;
        goto out;
    }
    pub = malloc(sizeof(*pub));
    if (pub == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto out_slot;
    }
    memset(pub, 0, sizeof(*pub));
    pub->tensor = *tensor;
    if (tensor->is_dead) {
        pub->tensor.size = 0;
        pub->tensor.data = NULL;
    } else {
        /* a copy when asked, or of device memory a transport here cannot touch */
        status = xfer_msg_stage_publish(ctx, tensor, (flags & XFER_PUBLISH_COPY) != 0,
                                        &pub->copy);
        if (status != XFER_OK) {
            goto out_slot;
        }
        if (pub->copy != NULL) {
            pub->tensor.data = pub->copy;
        }
    }
    pub->req = xfer_request_new(ctx, XFER_REQ_PUBLISH, NULL, NULL, cb, user_data);
    if (pub->req == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto out_slot;
    }
    xfer_request_posted(pub->req, req_p);

    node = first_allowed(ctx, slot);
    if (node != NULL) {
        xfer_endpoint_t *wep         = node->ep;
        xfer_tensor_waiter_t *waiter = node_take(t, node);

        slot_maybe_free(t, slot);
        hand_over(pub, waiter, wep);
    } else {
        slot->pub = pub;
    }
    pub    = NULL;
    status = XFER_OK;
    goto out;

out_slot:
    if (pub != NULL) {
        free(pub->copy);
        free(pub);
        pub = NULL;
    }
    slot_maybe_free(t, slot);
out:
    xfer_ctx_unlock(ctx);
    return status;
}

/* ---- upcalls from transports (producer side), under the context lock ---- */

void xfer_tensor_upcall_request(void *fw_arg, void *fw_ep, uint64_t step, const char *key,
                                size_t key_len, xfer_tensor_waiter_t *waiter)
{
    xfer_context_t *ctx    = fw_arg;
    xfer_endpoint_t *ep    = fw_ep;
    xfer_tensor_table_t *t = ctx->tensors;
    xfer_status_t status;
    waiter_node_t *node;
    slot_t *slot;
    khiter_t it;
    int ret;

    if ((key == NULL) || (key_len == 0) || (key_len > ctx->fw_config.max_key_len)) {
        xfer_log_peer("tensor_request_refused", XFER_LOG_WARN, TENSOR_SUBSYS,
                      "peer asked for a key of %zu bytes (limit %llu)",
                      key_len, (unsigned long long)ctx->fw_config.max_key_len);
        waiter->ready(waiter, XFER_ERR_OUT_OF_RANGE, NULL, NULL);
        return;
    }
    status = xfer_tensor_step_status(ctx, step);
    if (status != XFER_OK) {
        waiter->ready(waiter, status, NULL, NULL);
        return;
    }
    if (ep->closing) {
        /* read after this side began to close: what is published stays for another peer */
        waiter->ready(waiter, XFER_ERR_PEER_CLOSED, NULL, NULL);
        return;
    }
    slot = slot_get(t, step, key, key_len, 1);
    if (slot == NULL) {
        waiter->ready(waiter, XFER_ERR_NO_MEMORY, NULL, NULL);
        return;
    }
    /* a peer the producer does not let have it is answered as if it were not published */
    if ((slot->pub != NULL) && xfer_tensor_access_allows(ctx, ep, step, key, key_len)) {
        publication_t *pub = slot->pub;

        slot->pub = NULL;
        slot_maybe_free(t, slot);
        hand_over(pub, waiter, ep);
        return;
    }
    /* it waits for a publish: within this peer's bound and its share of the process's */
    if ((ep->tensor_waiting >= ctx->fw_config.tensor_max_requests) ||
        !xfer_budget_take(ep, XFER_BUDGET_TENSOR, 1)) {
        xfer_log_at(XFER_LOG_DEBUG, TENSOR_SUBSYS, "refusing a tensor request of %s: %u of its "
                    "requests wait for a publish (XFER_TENSOR_MAX_REQUESTS=%llu, or its share "
                    "of XFER_TENSOR_BUDGET=%llu)", ep->peer, ep->tensor_waiting,
                    (unsigned long long)ctx->fw_config.tensor_max_requests,
                    (unsigned long long)ctx->fw_config.tensor_budget);
        slot_maybe_free(t, slot);
        waiter->ready(waiter, XFER_ERR_NO_RESOURCE, NULL, NULL);
        return;
    }
    node = calloc(1, sizeof(*node));
    if (node == NULL) {
        xfer_budget_give(ep, XFER_BUDGET_TENSOR, 1);
        slot_maybe_free(t, slot);
        waiter->ready(waiter, XFER_ERR_NO_MEMORY, NULL, NULL);
        return;
    }
    it = kh_put(xfer_waiter, &t->waiters, (uint64_t)(uintptr_t)waiter, &ret);
    if (ret < 0) {
        free(node);
        xfer_budget_give(ep, XFER_BUDGET_TENSOR, 1);
        slot_maybe_free(t, slot);
        waiter->ready(waiter, XFER_ERR_NO_MEMORY, NULL, NULL);
        return;
    }
    kh_value(&t->waiters, it) = node;
    node->waiter   = waiter;
    node->slot     = slot;
    node->ep       = ep;
    ep->tensor_waiting++;
    node->deadline = xfer_now_ms() + (int64_t)(ctx->fw_config.tensor_request_timeout * 1000.0);
    ucs_list_add_tail(&slot->waiters, &node->list);
    ucs_list_add_tail(&t->parked, &node->age);
    xfer_progress_hook_add(ctx, &ctx->tensor_hook, xfer_tensor_expire,
                           xfer_tensor_expiry_timeout, NULL);
}

unsigned xfer_tensor_expire(xfer_context_t *ctx)
{
    xfer_tensor_table_t *t = ctx->tensors;
    unsigned count         = 0;
    int64_t now;

    if ((t == NULL) || ucs_list_is_empty(&t->parked)) {
        xfer_progress_hook_del(ctx, &ctx->tensor_hook);    /* none waits: nothing expires */
        return 0;
    }
    now = xfer_now_ms();
    while (!ucs_list_is_empty(&t->parked)) {
        waiter_node_t *node = ucs_list_head(&t->parked, waiter_node_t, age);
        slot_t *slot        = node->slot;
        xfer_tensor_waiter_t *waiter;

        if (node->deadline > now) {
            break;      /* the rest came later */
        }
        xfer_log(XFER_LOG_INFO, TENSOR_SUBSYS, "a peer's request for '%.64s' of step %llu "
                 "waited XFER_TENSOR_REQUEST_TIMEOUT=%gs for a publish: answered with a "
                 "timeout", slot->key, (unsigned long long)slot->step,
                 ctx->fw_config.tensor_request_timeout);
        waiter = node_take(t, node);
        slot_maybe_free(t, slot);
        waiter->ready(waiter, XFER_ERR_TIMEOUT, NULL, NULL);
        count++;
    }
    return count;
}

int xfer_tensor_expiry_timeout(xfer_context_t *ctx)
{
    xfer_tensor_table_t *t = ctx->tensors;
    int64_t left;

    if ((t == NULL) || ucs_list_is_empty(&t->parked)) {
        return -1;
    }
    left = ucs_list_head(&t->parked, waiter_node_t, age)->deadline - xfer_now_ms();
    return (left <= 0) ? 0 : (left > INT32_MAX) ? INT32_MAX : (int)left;
}

void xfer_tensor_upcall_withdraw(void *fw_arg, xfer_tensor_waiter_t *waiter)
{
    xfer_context_t *ctx    = fw_arg;
    xfer_tensor_table_t *t = ctx->tensors;
    khiter_t it            = kh_get(xfer_waiter, &t->waiters, (uint64_t)(uintptr_t)waiter);
    slot_t *slot;

    if (it == kh_end(&t->waiters)) {
        return;     /* ready() was called already */
    }
    slot = kh_value(&t->waiters, it)->slot;
    node_take(t, kh_value(&t->waiters, it));
    slot_maybe_free(t, slot);
}

void xfer_tensor_upcall_release(void *fw_arg, void *handle, xfer_status_t status)
{
    (void)fw_arg;
    if (handle != NULL) {
        publication_finish(handle, status);
    }
}

/* ---- consumer side ---- */

void *xfer_tensor_fetch_alloc(xfer_request_t *req, const xfer_tensor_t *meta)
{
    void *buf;

    xfer_in_callback++;
    xfer_in_engine_cb = "a tensor allocation callback, which runs inside the transport's "
                        "receive path";
    buf = req->alloc(meta, req->alloc_arg);
    xfer_in_engine_cb = NULL;
    xfer_in_callback--;
    return buf;
}

static void *fetch_alloc(void *alloc_arg, const xfer_tensor_t *meta)
{
    return xfer_tensor_fetch_alloc(alloc_arg, meta);
}

/* A fetch ends: it leaves the pending ones an abort reaches. */
static void fetch_end(xfer_request_t *req, xfer_status_t *status_p, size_t *length_p)
{
    (void)status_p;
    (void)length_p;
    ucs_list_del(&req->fetch_list);
    ucs_list_head_init(&req->fetch_list);
}

/* Its transport takes it back while its answer has not started to arrive. */
static xfer_status_t fetch_cancel(xfer_request_t *req, xfer_status_t status)
{
    const xfer_component_v1_t *comp = req->fw_iface->comp;

    return (comp->cancel == NULL) ? XFER_ERR_UNSUPPORTED :
           comp->cancel(req->fw_iface->iface, &req->comp, status);
}

static const xfer_req_ops_t fetch_ops = {fetch_end, fetch_cancel, NULL};

xfer_status_t xfer_tensor_fetch(xfer_endpoint_t *ep, uint64_t step, const char *key,
                                const xfer_fetch_params_t *params, xfer_request_cb_t cb,
                                void *user_data, xfer_request_t **req_p)
{
    xfer_fetch_args_t args;
    xfer_context_t *ctx;
    xfer_request_t *req;
    xfer_status_t status;
    size_t key_len;

    if ((ep == NULL) || (params == NULL) ||
        (params->size < offsetof(xfer_fetch_params_t, alloc_arg) + sizeof(void*))) {
        xfer_refuse(TENSOR_SUBSYS, "xfer_tensor_fetch: %s",
                    (ep && params) ? "xfer_fetch_params_t.size is too small" : "NULL argument");
        return XFER_ERR_INVALID_PARAM;
    }
    ctx    = ep->ctx;
    status = xfer_tensor_key_check(ctx, key, &key_len);
    if (status != XFER_OK) {
        return status;
    }
    if ((params->buffer == NULL) == (params->alloc == NULL)) {
        xfer_refuse(TENSOR_SUBSYS, "xfer_tensor_fetch: give either a buffer or "
                    "an allocation callback (got %s)", params->buffer ? "both" : "neither");
        return XFER_ERR_INVALID_PARAM;
    }
    if ((params->mem != NULL) &&
        ((params->mem->ctx != ctx) || (params->buffer == NULL) ||
         !xfer_mem_covers(params->mem, params->buffer, params->capacity))) {
        xfer_refuse(TENSOR_SUBSYS, "xfer_tensor_fetch: mem does not cover the "
                    "buffer or belongs to another context");
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, "xfer_tensor_fetch", 1);
    if (status != XFER_OK) {
        goto out;
    }
    if (ep->status != XFER_OK) {
        status = ep->status;
        goto out;
    }
    if (ep->fw_iface->comp->tensor_fetch == NULL) {
        xfer_refuse(TENSOR_SUBSYS, "transport %s cannot fetch tensors",
                    ep->transport);
        status = XFER_ERR_UNSUPPORTED;
        goto out;
    }
    status = xfer_tensor_step_status(ctx, step);
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_DEBUG, TENSOR_SUBSYS, "fetch of '%s' in aborted step %llu: %s", key,
                 (unsigned long long)step, xfer_status_string(status));
        goto out;
    }
    req = xfer_request_new(ctx, XFER_REQ_FETCH, ep->fw_iface, &fetch_ops, cb, user_data);
    if (req == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    req->step      = step;
    req->alloc     = params->alloc;
    req->alloc_arg = params->alloc_arg;
    if (params->mem != NULL) {
        req->mem = params->mem;
        params->mem->busy++;
    }
    memset(&args, 0, sizeof(args));
    args.step      = step;
    args.key       = key;
    args.key_len   = key_len;
    args.buffer    = params->buffer;
    args.capacity  = params->buffer ? params->capacity : 0;
    args.memh      = params->mem ? params->mem->memh[ep->fw_iface->index] : NULL;
    args.alloc     = params->alloc ? fetch_alloc : NULL;
    args.alloc_arg = req;
    args.result    = &req->tensor;
    if (xfer_msg_stage_fetch_needed(ep, params)) {
        /* a destination the transport cannot touch: through host memory (staging_msg.c) */
        status = xfer_msg_stage_fetch(req, params, &args);
        if (status != XFER_OK) {
            xfer_request_discard(req);
            goto out;
        }
    }
    status = xfer_endpoint_fetch_post(ep, req, &args);
    if ((status == XFER_OK) || (status == XFER_INPROGRESS)) {
        ucs_list_add_tail(&ctx->tensors->fetches, &req->fetch_list);
        xfer_request_posted(req, req_p);
        status = XFER_OK;
    } else {
        xfer_request_discard(req);
    }
out:
    xfer_ctx_unlock(ctx);
    return status;
}

/* ---- abort ---- */

static void abort_slot(xfer_tensor_table_t *t, slot_t *slot, xfer_status_t status)
{
    publication_t *pub = slot->pub;
    waiter_node_t *node, *tmp;

    slot->pub = NULL;
    ucs_list_for_each_safe(node, tmp, &slot->waiters, list) {
        xfer_tensor_waiter_t *waiter = node_take(t, node);

        waiter->ready(waiter, status, NULL, NULL);
    }
    if (pub != NULL) {
        publication_finish(pub, status);
    }
}

xfer_status_t xfer_tensor_abort(xfer_context_t *ctx, uint64_t step, xfer_status_t status)
{
    xfer_tensor_table_t *t;
    xfer_request_t *req, *tmp;
    slot_t **victims;
    size_t num = 0;
    slot_t *slot;

    if ((ctx == NULL) || (status >= 0)) {
        xfer_refuse(TENSOR_SUBSYS, "xfer_tensor_abort: %s",
                    ctx ? "the status must be an error" : "context is NULL");
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(ctx);
    if (xfer_api_check(ctx, "xfer_tensor_abort", 1) != XFER_OK) {
        xfer_ctx_unlock(ctx);
        return XFER_ERR_BUSY;
    }
    t = ctx->tensors;
    xfer_log(XFER_LOG_INFO, TENSOR_SUBSYS, "aborting step %s%llu: %s",
             (step == XFER_STEP_ALL) ? "(all) " : "", (unsigned long long)step,
             xfer_status_string(status));
    if (step == XFER_STEP_ALL) {
        t->all_aborted = status;
    } else if (xfer_tensor_step_status(ctx, step) == XFER_OK) {
        t->aborted[t->next_aborted].step   = step;
        t->aborted[t->next_aborted].status = status;
        t->next_aborted = (t->next_aborted + 1) % ABORTED_REMEMBERED;
        if (t->num_aborted < ABORTED_REMEMBERED) {
            t->num_aborted++;
        }
    }

    /* Collect first: completing requests runs user callbacks, which may touch the table. */
    victims = calloc(kh_size(&t->slots) + 1, sizeof(*victims));
    if (victims == NULL) {
        xfer_ctx_unlock(ctx);
        return XFER_ERR_NO_MEMORY;
    }
    kh_foreach_key(&t->slots, slot, {
        if ((step == XFER_STEP_ALL) || (slot->step == step)) {
            victims[num++] = slot;
        }
    });
    for (size_t i = 0; i < num; i++) {
        khiter_t it = kh_get(xfer_slot, &t->slots, victims[i]);
        if (it != kh_end(&t->slots)) {
            kh_del(xfer_slot, &t->slots, it);
        }
    }
    for (size_t i = 0; i < num; i++) {
        abort_slot(t, victims[i], status);
        free(victims[i]);
    }
    free(victims);

    ucs_list_for_each_safe(req, tmp, &t->fetches, fetch_list) {
        if ((step == XFER_STEP_ALL) || (req->step == step)) {
            xfer_status_t ret = req->fw_iface->comp->cancel ?
                req->fw_iface->comp->cancel(req->fw_iface->iface, &req->comp, status) :
                XFER_ERR_UNSUPPORTED;
            if (ret != XFER_OK) {
                xfer_log(XFER_LOG_DEBUG, TENSOR_SUBSYS, "fetch of step %llu not cancelled: "
                         "%s (it completes on its own)", (unsigned long long)req->step,
                         xfer_status_string(ret));
            }
        }
    }
    xfer_wake_locked(ctx);
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}

void xfer_tensor_table_destroy(xfer_context_t *ctx)
{
    xfer_tensor_table_t *t = ctx->tensors;
    slot_t *slot;

    kh_foreach_key(&t->slots, slot, {
        abort_slot(t, slot, XFER_ERR_CANCELED);
        free(slot);
    });
    kh_destroy_inplace(xfer_slot, &t->slots);
    kh_destroy_inplace(xfer_waiter, &t->waiters);
    free(t);
    ctx->tensors = NULL;
}
