/*
 * A channel's outstanding exchanges: what this side awaits an answer for (an RTS its FIN, a
 * tensor request its end), found again by its id: the slot's index in the lower 32 bits,
 * its generation in the upper (a tensor request packs both into its 32-bit index, see
 * tensor_wire.h). The table grows by doubling, from SLOTS_INITIAL to SLOTS_MAX slots; free
 * slots are chained through next_free.
 */
#include "verbs.h"

#include <stdlib.h>

#define SLOTS_INITIAL       64
#define SLOTS_MAX           (1u << 20)

xfer_status_t xfer_verbs_slot_alloc(xfer_ep_h ch, xfer_verbs_slot_kind_t kind, void *obj,
                                    uint64_t *id_p)
{
    xfer_verbs_slot_t *slot;
    uint32_t idx;

    if (ch->free_slot == UINT32_MAX) {
        uint32_t n = ch->num_slots ? ch->num_slots * 2 : SLOTS_INITIAL;
        xfer_verbs_slot_t *slots;

        if (n > SLOTS_MAX) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "more than %u exchanges outstanding "
                     "on one channel", SLOTS_MAX);
            return XFER_ERR_NO_RESOURCE;
        }
        slots = realloc(ch->slots, n * sizeof(*slots));
        if (slots == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        for (uint32_t i = ch->num_slots; i < n; i++) {
            slots[i].gen       = 1;
            slots[i].kind      = XFER_VERBS_SLOT_FREE;
            slots[i].obj       = NULL;
            slots[i].next_free = (i + 1 < n) ? i + 1 : UINT32_MAX;
        }
        ch->free_slot = ch->num_slots;
        ch->slots     = slots;
        ch->num_slots = n;
    }
    idx           = ch->free_slot;
    slot          = &ch->slots[idx];
    ch->free_slot = slot->next_free;
    slot->kind    = kind;
    slot->obj     = obj;
    ch->busy_slots++;
    *id_p = ((uint64_t)slot->gen << 32) | idx;
    if (kind == XFER_VERBS_SLOT_FETCH) {
        ((xfer_verbs_treq_t*)obj)->slot = idx;
    } else {
        ((xfer_verbs_op_t*)obj)->slot = idx;
    }
    return XFER_OK;
}

/* The generation makes a stale or duplicate id miss instead of hitting a reused slot. */
xfer_verbs_slot_t *xfer_verbs_slot_find(xfer_ep_h ch, uint64_t id)
{
    uint32_t idx = (uint32_t)id;

    if ((idx >= ch->num_slots) || (ch->slots[idx].gen != (uint32_t)(id >> 32)) ||
        (ch->slots[idx].kind == XFER_VERBS_SLOT_FREE)) {
        return NULL;
    }
    return &ch->slots[idx];
}

void xfer_verbs_slot_free(xfer_ep_h ch, uint32_t idx)
{
    xfer_verbs_slot_t *slot = &ch->slots[idx];

    slot->gen++;
    if (slot->gen == 0) {
        slot->gen = 1;
    }
    slot->kind      = XFER_VERBS_SLOT_FREE;
    slot->obj       = NULL;
    slot->next_free = ch->free_slot;
    ch->free_slot   = idx;
    ch->busy_slots--;
}
