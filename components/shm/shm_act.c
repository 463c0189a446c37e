/*
 * The interface's activity map (its layout and the producer's side: shm_ring.h, shm_ring.c)
 * and the list of watched endpoints: what makes progress cost what is active, not what is
 * connected.
 *
 * progress() looks at the watched endpoints only: those that had work within the last
 * XFER_SHM_IDLE_ROUNDS looks (frames, a send queue waiting for room, a shared put, a frame
 * whose work goes on), and those without a bit in the map. An endpoint idle that long is
 * unwatched: its ring's watched flag is cleared, and its producer sets its bit in the map for
 * the next frame. progress() takes the bits set (one load when there are none) and watches
 * their endpoints again. Every XFER_SHM_ACT_SWEEP calls it looks at every ring once, so that
 * a bit lost to a peer that clears what it does not own hides nobody for long.
 *
 * Cost: an idle endpoint costs nothing per progress(); a ping-pong pair stays watched and
 * pays no atomic operation per frame; a frame to an unwatched endpoint costs its producer two
 * atomic ORs and the owner two exchanges.
 */
#include "shm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t *act_word(uint8_t *base, size_t off)
{
    return (uint64_t*)(void*)(base + off);
}

void xfer_shm_act_open(xfer_iface_h iface)
{
    xfer_shm_act_t *act = &iface->act;
    char why[XFER_REASON_MAX];
    uint32_t head[2] = {XFER_SHM_ACT_MAGIC, XFER_SHM_ACT_VERSION};

    ucs_list_head_init(&act->watched);
    act->fd    = -1;
    act->base  = NULL;
    act->nfree = 0;
    act->eps   = calloc(XFER_SHM_ACT_MAX, sizeof(*act->eps));
    act->free  = malloc(XFER_SHM_ACT_MAX * sizeof(*act->free));
    if ((act->eps == NULL) || (act->free == NULL)) {
        snprintf(why, sizeof(why), "out of memory");
        goto fail;
    }
    act->fd = xfer_memfd_sealed("xfer-act", XFER_SHM_ACT_LEN, why, sizeof(why));
    if (act->fd < 0) {
        goto fail;
    }
    act->base = mmap(NULL, XFER_SHM_ACT_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, act->fd, 0);
    if (act->base == MAP_FAILED) {
        act->base = NULL;
        snprintf(why, sizeof(why), "mmap: %s", strerror(errno));
        goto fail;
    }
    memcpy(act->base, head, sizeof(head));
    act->ino = xfer_shm_fd_ino(act->fd);
    /* a stack of the free bits, bit 0 on top */
    for (uint32_t i = 0; i < XFER_SHM_ACT_MAX; i++) {
        act->free[i] = XFER_SHM_ACT_MAX - 1 - i;
    }
    act->nfree = XFER_SHM_ACT_MAX;
    return;

fail:
    xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "no activity map (%s): progress looks at every "
             "endpoint", why);
    xfer_shm_act_close(iface);
}

void xfer_shm_act_close(xfer_iface_h iface)
{
    xfer_shm_act_t *act = &iface->act;

    if (act->base != NULL) {
        munmap(act->base, XFER_SHM_ACT_LEN);
    }
    if (act->fd >= 0) {
        close(act->fd);
    }
    free(act->eps);
    free(act->free);
    act->base  = NULL;
    act->fd    = -1;
    act->eps   = NULL;
    act->free  = NULL;
    act->nfree = 0;
}

void xfer_shm_act_bind(xfer_ep_h ep)
{
    xfer_shm_act_t *act = &ep->iface->act;

    ucs_list_head_init(&ep->watch_link);
    ep->act_idx = XFER_SHM_ACT_NONE;
    if ((act->base != NULL) && (act->nfree > 0)) {
        ep->act_idx           = act->free[--act->nfree];
        act->eps[ep->act_idx] = ep;
    }
}

void xfer_shm_act_unbind(xfer_ep_h ep)
{
    xfer_shm_act_t *act = &ep->iface->act;

    if (ep->watched) {
        ucs_list_del(&ep->watch_link);
        ep->watched = 0;
    }
    if (ep->act_idx != XFER_SHM_ACT_NONE) {
        /* a bit the peer sets late finds no endpoint, or the next one: a look, no more */
        act->eps[ep->act_idx]   = NULL;
        act->free[act->nfree++] = ep->act_idx;
        ep->act_idx             = XFER_SHM_ACT_NONE;
    }
}

void xfer_shm_ep_watch(xfer_ep_h ep)
{
    ep->idle = 0;
    if (ep->watched) {
        return;
    }
    ep->watched = 1;
    ucs_list_add_tail(&ep->iface->act.watched, &ep->watch_link);
    if (ep->in.base != NULL) {
        xfer_shm_ring_watch(&ep->in);
    }
}

int xfer_shm_ep_idle(xfer_ep_h ep)
{
    if ((ep->fail.state != XFER_EP_CONNECTED) ||
        (++ep->idle >= XFER_SHM_IDLE_ROUNDS && (ep->act_idx != XFER_SHM_ACT_NONE) &&
         xfer_shm_ring_unwatch(&ep->in))) {
        ucs_list_del(&ep->watch_link);
        ep->watched = 0;
        return 1;
    }
    if (ep->idle >= XFER_SHM_IDLE_ROUNDS) {
        ep->idle = 0;   /* a frame came meanwhile, or the endpoint has no bit */
    }
    return 0;
}

/* Watch the endpoints of the bits set in word w. */
static void word_take(xfer_shm_act_t *act, unsigned w)
{
    uint64_t bits = __atomic_exchange_n(act_word(act->base, XFER_SHM_ACT_BITS + w * 8u), 0,
                                        __ATOMIC_SEQ_CST);

    while (bits != 0) {
        unsigned k  = (unsigned)__builtin_ctzll(bits);
        xfer_ep_h e = act->eps[w * 64u + k];

        bits &= bits - 1;
        if ((e != NULL) && (e->fail.state == XFER_EP_CONNECTED)) {
            xfer_shm_ep_watch(e);
        }
    }
}

void xfer_shm_act_collect(xfer_iface_h iface)
{
    xfer_shm_act_t *act = &iface->act;
    uint64_t *summary, s;
    xfer_ep_h ep;

    if (++act->sweep >= XFER_SHM_ACT_SWEEP) {
        /* one look at each ring, whatever the map says: a frame there is watched */
        act->sweep = 0;
        ucs_list_for_each(ep, &iface->eps, list) {
            if (!ep->watched && (ep->fail.state == XFER_EP_CONNECTED) &&
                xfer_shm_ring_ready(&ep->in)) {
                xfer_shm_ep_watch(ep);
            }
        }
    }
    if (act->base == NULL) {
        return;
    }
    summary = act_word(act->base, XFER_SHM_ACT_SUMMARY);
    if (__atomic_load_n(summary, __ATOMIC_RELAXED) == 0) {
        return;
    }
    s = __atomic_exchange_n(summary, 0, __ATOMIC_SEQ_CST);
    while (s != 0) {
        unsigned w = (unsigned)__builtin_ctzll(s);

        s &= s - 1;
        if (w < XFER_SHM_ACT_WORDS) {
            word_take(act, w);
        }
    }
    /* the rings are read after the bits are taken: a frame published before its producer
     * found its bit set is seen (shm_ring.c's fences) */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int xfer_shm_act_arm(xfer_iface_h iface)
{
    xfer_shm_act_t *act = &iface->act;

    if (act->base == NULL) {
        return 1;
    }
    __atomic_store_n((uint32_t*)(void*)(act->base + XFER_SHM_ACT_ARMED), 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(act_word(act->base, XFER_SHM_ACT_SUMMARY), __ATOMIC_RELAXED) == 0;
}

void xfer_shm_act_disarm(xfer_iface_h iface)
{
    if (iface->act.base != NULL) {
        __atomic_store_n((uint32_t*)(void*)(iface->act.base + XFER_SHM_ACT_ARMED), 0,
                         __ATOMIC_RELAXED);
    }
}
