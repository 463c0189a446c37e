/*
 * Slot tables for every transport (engine.h): a growing array whose free slots are chained
 * through next_free, each with a generation that moves on when it is freed, so that an id a
 * peer sends back names the request it was given for or nothing.
 */
#include "xfer_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define SLOTS_INITIAL 16u
#define SLOT_NONE     UINT32_MAX

void xfer_slots_init(xfer_slots_t *t, uint32_t max)
{
    t->s         = NULL;
    t->num       = 0;
    t->free_head = SLOT_NONE;
    t->busy      = 0;
    t->max       = max;
}

void xfer_slots_cleanup(xfer_slots_t *t)
{
    free(t->s);
    xfer_slots_init(t, t->max);
}

static xfer_status_t slots_grow(xfer_slots_t *t)
{
    uint32_t num = t->num ? 2 * t->num : SLOTS_INITIAL;
    xfer_slot_t *s;

    if ((t->num >= t->max) || (num > t->max)) {
        if (t->num >= t->max) {
            return XFER_ERR_NO_RESOURCE;
        }
        num = t->max;
    }
    s = realloc(t->s, (size_t)num * sizeof(*s));
    if (s == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    for (uint32_t i = t->num; i < num; i++) {
        s[i].gen       = 1;
        s[i].kind      = XFER_SLOT_FREE;
        s[i].obj       = NULL;
        s[i].next_free = (i + 1 < num) ? i + 1 : SLOT_NONE;
    }
    t->free_head = t->num;
    t->s         = s;
    t->num       = num;
    return XFER_OK;
}

xfer_status_t xfer_slot_alloc(xfer_slots_t *t, uint32_t kind, void *obj, uint64_t *id_p,
                              uint32_t *idx_p)
{
    xfer_status_t status;
    uint32_t idx;

    if (t->free_head == SLOT_NONE) {
        status = slots_grow(t);
        if (status != XFER_OK) {
            return status;
        }
    }
    idx          = t->free_head;
    t->free_head = t->s[idx].next_free;
    t->s[idx].kind = kind;
    t->s[idx].obj  = obj;
    t->busy++;
    if (id_p != NULL) {
        *id_p = xfer_slot_id(t, idx);
    }
    if (idx_p != NULL) {
        *idx_p = idx;
    }
    return XFER_OK;
}

void xfer_slot_free(xfer_slots_t *t, uint32_t idx)
{
    xfer_slot_t *slot = &t->s[idx];

    slot->kind = XFER_SLOT_FREE;
    slot->obj  = NULL;
    if (++slot->gen == 0) {
        slot->gen = 1;
    }
    slot->next_free = t->free_head;
    t->free_head    = idx;
    t->busy--;
}

void xfer_slots_end_all(xfer_slots_t *t, void (*end)(void *obj, xfer_status_t status),
                        xfer_status_t status)
{
    for (uint32_t i = 0; i < t->num; i++) {
        void *obj = t->s[i].obj;

        if (t->s[i].kind == XFER_SLOT_FREE) {
            continue;
        }
        xfer_slot_free(t, i);
        if (obj != NULL) {
            end(obj, status);
        }
    }
}

void *xfer_slot_answered(const xfer_slots_t *t, uint64_t id, uint32_t kind, const char *what,
                         char *why, size_t why_size)
{
    const xfer_slot_t *s = xfer_slot_find(t, id);

    if ((s == NULL) || (s->kind != kind) || (s->obj == NULL)) {
        snprintf(why, why_size, "%s for request 0x%016" PRIx64 ", which is not one of ours in "
                 "flight", what, id);
        return NULL;
    }
    return s->obj;
}
