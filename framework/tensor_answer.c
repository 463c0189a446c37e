/*
 * Peers' tensor requests, the producer's side of a fetch, for every transport (engine.h). A
 * request is a record of the engine's with the component's bytes behind it; it lives on its
 * endpoint's list from its arrival until the component is done with its answer, then on the
 * engine's release queue until the component's progress releases its tensor:
 *
 *   NEW       its key is arriving                      start -> WAITING (or ANSWERED)
 *   WAITING   the framework has it (tensor_request)    ready, cancel -> ANSWERED
 *   ANSWERED  the component sends the answer           done -> DONE
 *   DONE      on the release queue                     release: tensor_release, freed
 *
 * Whatever the framework hands over is checked before it is answered with - metadata that
 * holds, data where it has bytes, no larger than the component's limit for the endpoint -
 * so that a component never sends a tensor its peer would have to refuse.
 */
#include "xfer_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucs/datastruct/khash.h>

#define TA_SUBSYS "tensor"

enum { TA_NEW, TA_WAITING, TA_ANSWERED, TA_DONE };

/* The pending requests by id: one chain per id, through the endpoints that use it. */
KHASH_MAP_INIT_INT64(xfer_tanswer_ids, xfer_tanswer_t*)

struct xfer_tanswers {
    xfer_tanswers_head_t pub;       /* first: engine.h's inline check reads it */
    khash_t(xfer_tanswer_ids) ids;
    xfer_iface_params_t params;
    size_t              priv_size;
    xfer_tanswer_cb_t   answer;
    xfer_tanswer_t      *done_tail;     /* released by xfer_tanswers_release, from pub */
};

xfer_status_t xfer_tanswers_create(const xfer_iface_params_t *params, size_t priv_size,
                                   xfer_tanswer_cb_t answer, xfer_tanswers_t **t_p)
{
    xfer_tanswers_t *t;

    if ((params == NULL) || (answer == NULL) || (t_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    memcpy(&t->params, params,
           (params->size < sizeof(t->params)) ? params->size : sizeof(t->params));
    kh_init_inplace(xfer_tanswer_ids, &t->ids);
    t->priv_size = (priv_size + 15) & ~(size_t)15;
    t->answer    = answer;
    *t_p         = t;
    return XFER_OK;
}

void xfer_tanswers_destroy(xfer_tanswers_t *t)
{
    if (t == NULL) {
        return;
    }
    xfer_tanswers_release(t);
    kh_destroy_inplace(xfer_tanswer_ids, &t->ids);
    free(t);
}

/* ---- an endpoint's list, and the ids ------------------------------------------------------- */

static xfer_status_t list_add(xfer_tanswers_t *t, xfer_tanswer_list_t *list, xfer_tanswer_t *a)
{
    khiter_t it;
    int ret;

    it = kh_put(xfer_tanswer_ids, &t->ids, a->id, &ret);
    if (ret < 0) {
        return XFER_ERR_NO_MEMORY;
    }
    a->id_next = (ret == 0) ? kh_value(&t->ids, it) : NULL;
    kh_value(&t->ids, it) = a;
    a->list = list;
    a->prev = NULL;
    a->next = list->first;
    if (list->first != NULL) {
        list->first->prev = a;
    }
    list->first = a;
    list->count++;
    return XFER_OK;
}

static void list_del(xfer_tanswer_t *a)
{
    xfer_tanswers_t *t = a->owner;
    khiter_t it;

    if (a->list == NULL) {
        return;
    }
    it = kh_get(xfer_tanswer_ids, &t->ids, a->id);
    if (it != kh_end(&t->ids)) {
        xfer_tanswer_t **pp = &kh_value(&t->ids, it);

        while ((*pp != NULL) && (*pp != a)) {
            pp = &(*pp)->id_next;
        }
        if (*pp == a) {
            *pp = a->id_next;
        }
        if (kh_value(&t->ids, it) == NULL) {
            kh_del(xfer_tanswer_ids, &t->ids, it);
        }
    }
    if (a->prev != NULL) {
        a->prev->next = a->next;
    } else {
        a->list->first = a->next;
    }
    if (a->next != NULL) {
        a->next->prev = a->prev;
    }
    a->list->count--;
    if (a->state == TA_WAITING) {
        a->list->waiting--;
    }
    a->list = NULL;
    a->next = a->prev = a->id_next = NULL;
}

xfer_tanswer_t *xfer_tanswer_find(xfer_tanswers_t *t, xfer_tanswer_list_t *list, uint64_t id)
{
    khiter_t it = kh_get(xfer_tanswer_ids, &t->ids, id);
    xfer_tanswer_t *a;

    if (it == kh_end(&t->ids)) {
        return NULL;
    }
    for (a = kh_value(&t->ids, it); (a != NULL) && (a->list != list); a = a->id_next) {
    }
    return a;
}

/* ---- answering ----------------------------------------------------------------------------- */

/* What the framework handed over may go to the peer: XFER_OK, or why not. */
static xfer_status_t tensor_sendable(const xfer_tanswer_t *a, const xfer_tensor_t *tensor,
                                     char *why, size_t why_size)
{
    int is_dead;

    if (tensor == NULL) {
        snprintf(why, why_size, "producer handed over no tensor");
        return XFER_ERR_INTERNAL;
    }
    is_dead = tensor->is_dead;
    if (xfer_tensor_meta_check((unsigned)tensor->dtype, tensor->rank, tensor->dims,
                               is_dead ? 0 : tensor->size, is_dead, why, why_size) != XFER_OK) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (!is_dead && (tensor->size > a->max_size)) {
        snprintf(why, why_size, "tensor of %" PRIu64 " bytes exceeds the message limit of %"
                 PRIu64 " bytes", tensor->size, a->max_size);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (!is_dead && (tensor->size > 0) && (tensor->data == NULL)) {
        snprintf(why, why_size, "tensor of %" PRIu64 " bytes has no data", tensor->size);
        return XFER_ERR_INVALID_PARAM;
    }
    return XFER_OK;
}

/* a leaves WAITING (or NEW) and the component sends status: the tensor, or the error. */
static void answer(xfer_tanswer_t *a, xfer_status_t status, const xfer_tensor_t *tensor,
                   void *handle, const char *reason)
{
    char why[XFER_REASON_MAX];

    if (a->state == TA_WAITING) {
        a->list->waiting--;
    }
    a->state          = TA_ANSWERED;
    a->handle         = (status == XFER_OK) ? handle : NULL;
    a->release_status = XFER_OK;
    if (status == XFER_OK) {
        status = tensor_sendable(a, tensor, why, sizeof(why));
        if (status != XFER_OK) {
            char key[65];

            xfer_reason_copy(key, sizeof(key), a->key, strnlen(a->key, a->key_len));
            xfer_log(XFER_LOG_WARN, TA_SUBSYS, "cannot send tensor of step %" PRIu64 " '%s': "
                     "%s", a->step, key, why);
            a->release_status = status;
            tensor            = NULL;
            reason            = why;
        }
    }
    a->owner->answer(a, status, (status == XFER_OK) ? tensor : NULL,
                     (status == XFER_OK) ? NULL :
                     (reason != NULL) ? reason : xfer_status_string(status));
}

/* The framework's answer to tensor_request(): inside it, or later from outside any call of
 * the component. */
static void waiter_ready(xfer_tensor_waiter_t *waiter, xfer_status_t status,
                         const xfer_tensor_t *tensor, void *handle)
{
    answer(ucs_container_of(waiter, xfer_tanswer_t, waiter), status, tensor, handle, NULL);
}

xfer_tanswer_t *xfer_tanswer_new(xfer_tanswers_t *t, xfer_tanswer_list_t *list, void *ep,
                                 void *fw_ep, uint64_t id, uint64_t step, uint32_t key_len,
                                 uint64_t max_size, xfer_status_t *status_p, char *why,
                                 size_t why_size)
{
    /* a key past this side's limit is not kept: the peer hears so (xfer_tanswer_start) */
    uint32_t keep = (key_len <= t->params.max_key_len) ? key_len : 0;
    xfer_tanswer_t *a;

    if (xfer_tanswer_find(t, list, id) != NULL) {
        snprintf(why, why_size, "a tensor request reuses the id 0x%016" PRIx64 " of one still "
                 "pending", id);
        *status_p = XFER_ERR_PROTOCOL;
        return NULL;
    }
    a = calloc(1, sizeof(*a) + t->priv_size + keep + 1);
    if (a == NULL) {
        snprintf(why, why_size, "out of memory for a tensor request");
        *status_p = XFER_ERR_NO_MEMORY;
        return NULL;
    }
    a->ep           = ep;
    a->fw_ep        = fw_ep;
    a->id           = id;
    a->step         = step;
    a->key_len      = key_len;
    a->max_size     = max_size;
    a->priv         = a + 1;
    a->key          = (char*)(a + 1) + t->priv_size;
    a->owner        = t;
    a->state        = TA_NEW;
    a->waiter.ready = waiter_ready;
    if (list_add(t, list, a) != XFER_OK) {
        free(a);
        snprintf(why, why_size, "out of memory for a tensor request");
        *status_p = XFER_ERR_NO_MEMORY;
        return NULL;
    }
    *status_p = XFER_OK;
    return a;
}

uint32_t xfer_tanswer_key_room(const xfer_tanswer_t *a)
{
    return (a->key_len <= a->owner->params.max_key_len) ? a->key_len : 0;
}

void xfer_tanswer_start(xfer_tanswer_t *a)
{
    const xfer_iface_params_t *p = &a->owner->params;
    char reason[XFER_REASON_MAX];

    if (a->key_len > p->max_key_len) {
        snprintf(reason, sizeof(reason), "tensor key of %" PRIu32 " bytes exceeds the "
                 "producer's limit of %" PRIu32 " bytes (XFER_MAX_KEY_LEN)", a->key_len,
                 p->max_key_len);
        xfer_log_peer("tensor_request_refused", XFER_LOG_WARN, TA_SUBSYS,
                      "refusing a tensor request: %s", reason);
        answer(a, XFER_ERR_OUT_OF_RANGE, NULL, NULL, reason);
        return;
    }
    a->key[a->key_len] = '\0';
    if (p->tensor_request == NULL) {
        answer(a, XFER_ERR_UNSUPPORTED, NULL, NULL, "this side serves no tensors");
        return;
    }
    a->state = TA_WAITING;
    a->list->waiting++;
    p->tensor_request(p->fw_arg, a->fw_ep, a->step, a->key, a->key_len, &a->waiter);
}

void xfer_tanswer_discard(xfer_tanswer_t *a)
{
    list_del(a);
    free(a);
}

static void withdraw(xfer_tanswer_t *a)
{
    const xfer_iface_params_t *p = &a->owner->params;

    if (p->tensor_withdraw != NULL) {
        p->tensor_withdraw(p->fw_arg, &a->waiter);
    }
}

int xfer_tanswer_cancel(xfer_tanswers_t *t, xfer_tanswer_list_t *list, uint64_t id)
{
    xfer_tanswer_t *a = xfer_tanswer_find(t, list, id);

    if ((a == NULL) || (a->state != TA_WAITING)) {
        return 0;   /* answered already: the consumer's tombstone takes that answer */
    }
    withdraw(a);
    answer(a, XFER_ERR_CANCELED, NULL, NULL, "cancelled by the consumer");
    return 1;
}

/* ---- releasing ----------------------------------------------------------------------------- */

static void release(xfer_tanswer_t *a, xfer_status_t status)
{
    const xfer_iface_params_t *p = &a->owner->params;

    if ((a->handle != NULL) && (p->tensor_release != NULL)) {
        p->tensor_release(p->fw_arg, a->handle, status);
    }
    free(a);
}

void xfer_tanswer_done(xfer_tanswer_t *a, xfer_status_t status)
{
    xfer_tanswers_t *t = a->owner;

    list_del(a);
    if (a->release_status == XFER_OK) {
        a->release_status = status;
    }
    a->state = TA_DONE;
    a->next  = NULL;
    if (t->done_tail != NULL) {
        t->done_tail->next = a;
    } else {
        t->pub.done_head = a;
    }
    t->done_tail = a;
}

unsigned xfer_tanswers_release(xfer_tanswers_t *t)
{
    unsigned count = 0;

    while (t->pub.done_head != NULL) {
        xfer_tanswer_t *a = t->pub.done_head;

        t->pub.done_head = a->next;
        if (t->pub.done_head == NULL) {
            t->done_tail = NULL;
        }
        release(a, a->release_status);
        count++;
    }
    return count;
}

void xfer_tanswers_ep_gone(xfer_tanswer_list_t *list, xfer_status_t status)
{
    while (list->first != NULL) {
        xfer_tanswer_t *a = list->first;
        int state         = a->state;

        list_del(a);
        if (state == TA_WAITING) {
            withdraw(a);
            free(a);
        } else if (state == TA_ANSWERED) {
            release(a, (a->release_status != XFER_OK) ? a->release_status : status);
        } else {
            free(a);
        }
    }
}
