/*
 * The engines libxfer shares with its components, the way libfabric's prov/util serves its
 * providers: what every transport needs and none should write again - process-wide budgets
 * for what peers make this process hold, tag matching with its unexpected queue, the table
 * of requests awaiting a peer's answer, the pool of operations with their deferred
 * completions, regions, tensor answers, batches walked descriptor by descriptor, and a
 * peer's notifications delivered at the target.
 * Included by component.h; a component uses them through its types.
 */
#ifndef XFER_ENGINE_H
#define XFER_ENGINE_H

#ifndef XFER_COMPONENT_H
#error "include <xfer/component.h>, which includes this"
#endif

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>

/*
 * The clock every deadline and timer is measured on: CLOCK_MONOTONIC, so that a change of
 * the wall clock moves none of them.
 */
static inline uint64_t xfer_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int64_t xfer_now_ms(void)
{
    return (int64_t)(xfer_now_ns() / 1000000u);
}

static inline double xfer_now_sec(void)
{
    return (double)xfer_now_ns() * 1e-9;
}

/* The registration cache and the unmap reports (framework/regcache.c, unmapq.c). */
#include <xfer/regcache.h>

/*
 * Process-wide budgets (framework/budget.c): what peers make this process hold, summed over
 * every endpoint of every context. A transport takes from a kind when a peer makes it hold
 * more (a message nobody receives yet, an answer the peer does not read) and gives back when
 * it lets go; fw_ep is the framework's endpoint (xfer_ep_params_t.fw_ep). A take that does not
 * fit the process's limit or the endpoint's fair share of it returns 0 and takes nothing: the
 * transport then slows its peer down as at its own per-endpoint bound, and tries again once
 * xfer_budget_gives() has moved on.
 */
typedef enum xfer_budget_kind {
    XFER_BUDGET_UNEXPECTED,     /* bytes of messages nobody received yet */
    XFER_BUDGET_ANSWERS,        /* bytes of answers queued for peers */
    XFER_BUDGET_NOTIFY,         /* bytes of notifications not taken (the framework's) */
    XFER_BUDGET_TENSOR,         /* requests waiting for a tensor (the framework's) */
    XFER_BUDGET_KINDS
} xfer_budget_kind_t;

XFER_API int xfer_budget_take(void *fw_ep, xfer_budget_kind_t kind, uint64_t amount);
XFER_API void xfer_budget_give(void *fw_ep, xfer_budget_kind_t kind, uint64_t amount);
/* A count that moves on at every give: a transport that paused a peer on a budget compares
 * it with the one it saw then, and lets the peer try again once it moved. */
XFER_API uint64_t xfer_budget_gives(void);
/* The parameter that sets kind's limit, for log lines. */
XFER_API const char *xfer_budget_name(xfer_budget_kind_t kind);

/* A queue a transport keeps for one peer, charged to a budget kind: what it holds and what of
 * that the budget granted (in steps of XFER_BUDGET_STEP, so that a take is not a lock per
 * item). What is held past the grant - an answer must be queued even when the budget is
 * spent - is the transport's cue to read no more of that peer's requests until
 * xfer_budget_queue_within() says the rest is granted too; removing gives back what the
 * queue no longer needs. Both sides of the queue are the transport's, under its lock. */
#define XFER_BUDGET_STEP (64u << 10)
typedef struct xfer_budget_queue {
    uint64_t held;
    uint64_t granted;
} xfer_budget_queue_t;

XFER_API void xfer_budget_queue_add(void *fw_ep, xfer_budget_kind_t kind,
                                    xfer_budget_queue_t *q, uint64_t amount);
XFER_API void xfer_budget_queue_remove(void *fw_ep, xfer_budget_kind_t kind,
                                       xfer_budget_queue_t *q, uint64_t amount);
/* 1 when all that q holds is granted (trying for the rest now), 0 when the peer must wait. */
XFER_API int xfer_budget_queue_within(void *fw_ep, xfer_budget_kind_t kind,
                                      xfer_budget_queue_t *q);

/*
 * Tag matching (framework/tag_match.c): the receives and the messages nobody received yet
 * are the framework's, for every transport. A component hands it each arriving message's
 * header (fw_arg: the iface's xfer_iface_params_t.fw_arg; fw_ep: the endpoint's) and learns:
 *   XFER_TAG_MATCHED     a receive takes it: move min(length, dest->capacity) bytes into
 *                        dest->buf (dest->memh: its registration here, or NULL), drop the
 *                        rest, then xfer_tag_done(dest->handle, status);
 *   XFER_TAG_UNEXPECTED  the framework keeps it: move its length bytes into dest->buf (none
 *                        for a rendezvous one, whose priv it keeps), then xfer_tag_done();
 *                        dest->over says it was kept past the bounds (FORCE);
 *   XFER_TAG_PAUSE       no room within the bounds: read no more of this peer until
 *                        tag_resume (or the next progress), then offer it again;
 *   XFER_TAG_NO_MEMORY   fail the endpoint.
 * A receive completes with the message's length and tag, XFER_ERR_TRUNCATED when it was
 * longer than the buffer; a failure in xfer_tag_done() fails it (a kept message is lost).
 */
#define XFER_TAG_PRIV_MAX 64u          /* bytes a component keeps about a rendezvous message */
enum {
    XFER_TAG_ARRIVE_RNDV   = 1u << 0,   /* the data stays at the sender: tag_pull moves it */
    XFER_TAG_ARRIVE_FORCE  = 1u << 1,   /* keep it past the bounds (its data is here already,
                                         * or the peer's end bounds what is left) */
    XFER_TAG_ARRIVE_URGENT = 1u << 2,   /* answers to this side wait behind it: the endpoint
                                         * may keep twice its bound */
    XFER_TAG_ARRIVE_NOTIFY = 1u << 3,   /* kept past the bounds: call tag_released when it
                                         * goes */
    XFER_TAG_ARRIVE_INPLACE = 1u << 4,  /* with FORCE: past the bounds, the data stays where
                                         * it arrived (priv says where; dest->buf is NULL)
                                         * and is kept as a rendezvous one - tag_pull copies
                                         * it out, tag_released lets it go - so that what is
                                         * past the bounds costs no memory of its own */
};
enum {
    XFER_TAG_MATCHED,
    XFER_TAG_UNEXPECTED,
    XFER_TAG_PAUSE,
    XFER_TAG_NO_MEMORY,
};
typedef struct xfer_tag_dest {
    void        *buf;
    size_t      capacity;
    xfer_memh_h memh;
    void        *handle;
    int         over;
} xfer_tag_dest_t;

XFER_API int xfer_tag_arrive(void *fw_arg, void *fw_ep, uint64_t tag, uint64_t length,
                             unsigned flags, const void *priv, size_t priv_len,
                             xfer_tag_dest_t *dest);
XFER_API void xfer_tag_done(void *handle, xfer_status_t status);

/*
 * Slot tables (framework/slots.c): the requests an endpoint awaits a peer's answer for, found
 * again by the id the answer carries - the slot's index in the low 32 bits, its generation in
 * the high 32. Freeing a slot moves its generation on (never to 0), so a stale, duplicate or
 * forged id misses instead of hitting a reused slot. The table grows by doubling from 16 up
 * to max slots; kind is the component's (XFER_SLOT_FREE, 0, marks a free one), obj its
 * pointer. The table is the component's, inside its endpoint, under its lock.
 */
#define XFER_SLOT_FREE 0u

typedef struct xfer_slot {
    uint32_t gen;
    uint32_t next_free;
    uint32_t kind;
    void     *obj;
} xfer_slot_t;

typedef struct xfer_slots {
    xfer_slot_t *s;
    uint32_t    num;
    uint32_t    free_head;
    uint32_t    busy;           /* slots in use */
    uint32_t    max;
} xfer_slots_t;

XFER_API void xfer_slots_init(xfer_slots_t *t, uint32_t max);
XFER_API void xfer_slots_cleanup(xfer_slots_t *t);
/* A free slot for obj: its id in *id_p, its index in *idx_p (NULL: not wanted).
 * XFER_ERR_NO_RESOURCE past max slots, XFER_ERR_NO_MEMORY. */
XFER_API xfer_status_t xfer_slot_alloc(xfer_slots_t *t, uint32_t kind, void *obj,
                                       uint64_t *id_p, uint32_t *idx_p);
XFER_API void xfer_slot_free(xfer_slots_t *t, uint32_t idx);
/* Free every slot in use, lowest first, and end(obj, status) the object of each that holds
 * one (an endpoint's teardown: what it waited for ends with status). */
XFER_API void xfer_slots_end_all(xfer_slots_t *t, void (*end)(void *obj, xfer_status_t status),
                                 xfer_status_t status);

/* The slot an id names, or NULL: out of range, free, or of another generation. */
static inline xfer_slot_t *xfer_slot_find(const xfer_slots_t *t, uint64_t id)
{
    uint32_t idx = (uint32_t)id;

    if ((idx >= t->num) || (t->s[idx].kind == XFER_SLOT_FREE) ||
        (t->s[idx].gen != (uint32_t)(id >> 32))) {
        return NULL;
    }
    return &t->s[idx];
}

/* The object waiting in the slot that an answer's id names, when that slot is of kind; else
 * NULL, with why saying that the answer (what) is for no request of ours in flight - the
 * peer's protocol error. */
XFER_API void *xfer_slot_answered(const xfer_slots_t *t, uint64_t id, uint32_t kind,
                                  const char *what, char *why, size_t why_size);

static inline uint64_t xfer_slot_id(const xfer_slots_t *t, uint32_t idx)
{
    return ((uint64_t)t->s[idx].gen << 32) | idx;
}

/*
 * Flushes of an endpoint whose operations the peer answers (framework/flushes.c; tcp, shm): a
 * flush completes once every answered operation posted before it has its answer - in
 * whatever order the answers come - and the component's own conditions hold (bytes the peer
 * acknowledged, fences answered, ...), which its reached() says. Flushes may complete in any
 * order. The queue is the component's, inside its endpoint, under its lock.
 */
typedef struct xfer_flush {
    ucs_list_link_t list;
    uint64_t        mark;           /* the answered operations posted before it: serial <= */
    uint64_t        pending;        /* ... of those, not answered yet */
} xfer_flush_t;

typedef struct xfer_flushes_ops {
    /* Whether flush f's own conditions hold; if so, *status_p (XFER_OK on entry) is what it
     * completes with. */
    int  (*reached)(void *arg, xfer_flush_t *f, xfer_status_t *status_p);
    /* Complete the op that holds f. */
    void (*complete)(xfer_flush_t *f, xfer_status_t status);
} xfer_flushes_ops_t;

typedef struct xfer_flushes {
    const xfer_flushes_ops_t *ops;
    void            *arg;           /* reached()'s: the component's endpoint */
    ucs_list_link_t waiting;        /* xfer_flush_t, in posting order */
    uint64_t        posted;         /* answered operations ever posted: the last one's serial */
    uint64_t        pending;        /* ... not answered yet */
} xfer_flushes_t;

XFER_API void xfer_flushes_init(xfer_flushes_t *q, const xfer_flushes_ops_t *ops, void *arg);
/* An operation the peer answers is posted: its serial (never 0) for xfer_flushes_answered(),
 * which it must be given exactly once. */
static inline uint64_t xfer_flushes_posted(xfer_flushes_t *q)
{
    q->pending++;
    return ++q->posted;
}
/* The operation of serial has its answer, or ended without one. */
XFER_API void xfer_flushes_answered(xfer_flushes_t *q, uint64_t serial);
/* Whether a flush posted now would wait for no answer and behind no other flush. */
static inline int xfer_flushes_idle(xfer_flushes_t *q)
{
    return (q->pending == 0) && ucs_list_is_empty(&q->waiting);
}
/* f waits from now on, for the answers of the operations posted so far. */
XFER_API void xfer_flushes_add(xfer_flushes_t *q, xfer_flush_t *f);
/* Complete the flushes whose answers are in and whose reached() holds; how many. */
XFER_API unsigned xfer_flushes_check(xfer_flushes_t *q);
/* Complete every waiting flush with status. */
XFER_API void xfer_flushes_fail(xfer_flushes_t *q, xfer_status_t status);

/*
 * Operations (framework/op.c): what a component keeps of each operation in flight comes from
 * a pool of its iface, and its completion is queued there and delivered at the end of the
 * component's progress - the framework's request, or the receive of its tag matching, is
 * told only then, never inside the component's walk of its sockets, rings or queues. A
 * component's op struct starts with an xfer_op_t; xfer_op_get zeroes its first zero_len bytes
 * when it hands one out. Pool and queue are the component's iface's, under its lock.
 */
typedef struct xfer_op {
    struct xfer_op *next;           /* the pool's: its completion queue */
    xfer_comp_t    *comp;           /* told at delivery; NULL: nobody */
    void           *tag_handle;     /* a receive of the framework's matching: xfer_tag_done()
                                     * at delivery instead of comp */
    void           *owner;          /* the component's endpoint (xfer_op_deliver_owner) */
    size_t         length;
    uint64_t       tag;
    xfer_status_t  status;
    uint32_t       pool_flags;      /* the pool's */
} xfer_op_t;

/* The pool, open to the inline paths below (what every operation of every transport passes
 * through: no call into libxfer, no memset of a length known only at run time). Its fields
 * are libxfer's and the inline paths'; a component only holds a pointer to it. */
typedef struct xfer_op_pool {
    xfer_op_t   *head;              /* the oldest completion not delivered */
    xfer_op_t   *tail;
    unsigned    queued;
    size_t      op_size;
    size_t      extra_max;          /* larger extras are allocated on their own */
    ucs_mpool_t mp;
} xfer_op_pool_t;

#define XFER_OP_POOLED  1u          /* pool_flags: from the pool's chunks, not malloc */

/* A pool of ops of op_size bytes and up to extra_max more for each from its chunks (larger
 * ones are allocated on their own). XFER_ERR_NO_MEMORY. */
XFER_API xfer_status_t xfer_op_pool_create(size_t op_size, size_t extra_max, const char *name,
                                           xfer_op_pool_t **pool_p);
/* Delivers what is queued, then frees the pool: every op must be back. */
XFER_API void xfer_op_pool_destroy(xfer_op_pool_t *pool);
/* An op with an extra larger than the pool's chunks hold, zeroed; NULL: no memory. */
XFER_API void *xfer_op_alloc_large(xfer_op_pool_t *pool, size_t extra);
/* Deliver the queued completions of owner now (its endpoint goes). */
XFER_API void xfer_op_deliver_owner(xfer_op_pool_t *pool, void *owner);

/* An op of op_size + extra bytes for owner, told comp when it completes, its first zero_len
 * bytes zeroed (a constant of the component's; at least its xfer_op_t); NULL: no memory. */
static inline void *xfer_op_get(xfer_op_pool_t *pool, size_t zero_len, size_t extra,
                                xfer_comp_t *comp, void *owner)
{
    int pooled    = (extra <= pool->extra_max);
    xfer_op_t *op = pooled ? ucs_mpool_get(&pool->mp) : xfer_op_alloc_large(pool, extra);

    if (op == NULL) {
        return NULL;
    }
    /* the framework's part at least, whatever the caller passed (a constant: folded) */
    memset(op, 0, (zero_len > sizeof(*op)) ? zero_len : sizeof(*op));
    op->comp       = comp;
    op->owner      = owner;
    op->pool_flags = pooled ? XFER_OP_POOLED : 0;
    return op;
}

/* Give back an op that will not complete (it failed to post; nobody is told). */
static inline void xfer_op_put(xfer_op_pool_t *pool, void *op_ptr)
{
    xfer_op_t *op = op_ptr;

    (void)pool;
    if (op->pool_flags & XFER_OP_POOLED) {
        ucs_mpool_put(op);
    } else {
        free(op);
    }
}

/* The op is done: queued, with its result, for the next delivery. Its comp's cancel hook
 * (xfer_comp_hook) comes off here, whichever path completed it: cancel() no longer finds it. */
static inline void xfer_op_complete(xfer_op_pool_t *pool, void *op_ptr, xfer_status_t status,
                                    size_t length, uint64_t tag)
{
    xfer_op_t *op = op_ptr;

    if (op->comp != NULL) {
        op->comp->priv = NULL;
    }
    op->status = status;
    op->length = length;
    op->tag    = tag;
    op->next   = NULL;
    if (pool->tail != NULL) {
        pool->tail->next = op;
    } else {
        pool->head = op;
    }
    pool->tail = op;
    pool->queued++;
}

/* op leaves the queue (prev: the one before it, or NULL), goes back to the pool, and then
 * its comp or receive is told - so that a callback which posts again may reuse it. */
static inline void xfer_op_deliver_one(xfer_op_pool_t *pool, xfer_op_t *prev, xfer_op_t *op)
{
    xfer_comp_t *comp    = op->comp;
    void *handle         = op->tag_handle;
    xfer_status_t status = op->status;
    size_t length        = op->length;
    uint64_t tag         = op->tag;

    if (prev != NULL) {
        prev->next = op->next;
    } else {
        pool->head = op->next;
    }
    if (pool->tail == op) {
        pool->tail = prev;
    }
    pool->queued--;
    xfer_op_put(pool, op);
    if (handle != NULL) {
        xfer_tag_done(handle, status);
    } else if (comp != NULL) {
        comp->cb(comp, status, length, tag);
    }
}

/* Deliver the completions queued when it is called (those that callbacks queue wait for the
 * next call). How many. xfer_op_deliver is the same out of line. */
static inline unsigned xfer_op_deliver_inline(xfer_op_pool_t *pool)
{
    unsigned n = pool->queued;

    for (unsigned i = 0; (i < n) && (pool->head != NULL); i++) {
        xfer_op_deliver_one(pool, NULL, pool->head);
    }
    return n;
}
XFER_API unsigned xfer_op_deliver(xfer_op_pool_t *pool);

/* Completions wait for delivery: a component does not sleep then, and delivers. */
static inline int xfer_op_queued(const xfer_op_pool_t *pool)
{
    return pool->head != NULL;
}

/*
 * Cancel (component.h) is given a comp alone. A component hangs a hook of the operation's own
 * on comp->priv when it posts a fetch or a batch: its cancel() then reaches the operation at
 * once (xfer_comp_cancel), without a search of its endpoints' slots and queues - a cost that
 * would grow with the peers it serves. xfer_op_complete takes the hook off; a component that
 * calls a hooked comp itself, not through an op, takes it off before.
 */
typedef struct xfer_cancel_hook {
    xfer_status_t (*cancel)(struct xfer_cancel_hook *self, xfer_status_t status);
} xfer_cancel_hook_t;

static inline void xfer_comp_hook(xfer_comp_t *comp, xfer_cancel_hook_t *hook,
                                  xfer_status_t (*cancel)(xfer_cancel_hook_t*, xfer_status_t))
{
    hook->cancel = cancel;
    comp->priv   = hook;
}

/* The whole of a cancel() whose operations hang their hooks: XFER_ERR_NOT_FOUND for a comp
 * that has none (never posted here, or already completed). */
static inline xfer_status_t xfer_comp_cancel(xfer_comp_t *comp, xfer_status_t status)
{
    xfer_cancel_hook_t *hook = (comp != NULL) ? comp->priv : NULL;

    return (hook == NULL) ? XFER_ERR_NOT_FOUND : hook->cancel(hook, status);
}

/* cancel() of a component whose operations all hang their hooks (XFER_COMPONENT_CORE_OPS). */
XFER_API xfer_status_t xfer_iface_cancel(xfer_iface_h iface, xfer_comp_t *comp,
                                         xfer_status_t status);

/*
 * Region tables (framework/regions.c): the memory an iface registered, found again by the id
 * and key a peer's request names. A region is the component's own record (its memh); the
 * table indexes it by an id from 1 up and gives it a random 64-bit key of its own, which goes
 * into its remote key: a key of one region says nothing about another, and an id alone finds
 * nothing. A peer that names keys that fit no region again and again is scanning: past
 * XFER_BAD_KEYS_MAX the component fails its endpoint. The table is the component's iface's,
 * under its lock.
 */
typedef struct xfer_regions xfer_regions_t;

#define XFER_BAD_KEYS_MAX 16

XFER_API xfer_status_t xfer_regions_create(xfer_regions_t **t_p);
/* Frees the table; release (NULL: nothing) is called for every region still in it. */
XFER_API void xfer_regions_destroy(xfer_regions_t *t, void (*release)(void *region));
/* Index region under a new id (*id_p) with a new random key (*key_p). XFER_ERR_NO_MEMORY. */
XFER_API xfer_status_t xfer_region_insert(xfer_regions_t *t, void *region, uint64_t *id_p,
                                          uint64_t *key_p);
/* Drop id, when it indexes region: 1; else 0 and a warning of subsys's that a
 * deregistration named an unknown or foreign region. */
XFER_API int xfer_region_remove(xfer_regions_t *t, uint64_t id, const void *region,
                                const char *subsys);
/* The region id indexes, or NULL: for this side's own use. */
XFER_API void *xfer_region_lookup(xfer_regions_t *t, uint64_t id);
/* The region id indexes when key is its key, else NULL: what a peer's request may reach. */
XFER_API void *xfer_region_find(xfer_regions_t *t, uint64_t id, uint64_t key);
/* A peer's request named no region (xfer_region_find gave NULL): count it in the endpoint's
 * *bad_keys_p. XFER_ERR_PROTOCOL once there were more than XFER_BAD_KEYS_MAX (fail the
 * endpoint: it is scanning), else XFER_OK (refuse the request). */
XFER_API xfer_status_t xfer_region_refused(uint32_t *bad_keys_p);
/* A random 64-bit number (getrandom, else the clock and the pid): keys and tokens. */
XFER_API uint64_t xfer_random64(void);

/* The start of a region record whose peers' requests the table checks (tcp's and shm's memh
 * begin with one): its id and key in the table, and the memory it covers. */
typedef struct xfer_region {
    uint64_t id;
    uint64_t key;
    uint8_t  *addr;
    size_t   length;
} xfer_region_t;

/* The part of a remote key that tcp's and shm's keys begin with: the region's id and key
 * (what its peers' requests name it by) and the memory it covers, XFER_REGION_KEY_LEN bytes
 * little-endian in that order. */
#define XFER_REGION_KEY_LEN 32u
typedef struct xfer_region_key {
    uint64_t id;
    uint64_t key;
    uint64_t addr;
    uint64_t length;
} xfer_region_key_t;
XFER_API void xfer_region_key_pack(const xfer_region_t *r, void *buf);
/* XFER_OK, or XFER_ERR_INVALID_PARAM when the bounds wrap around (no key of ours). */
XFER_API xfer_status_t xfer_region_key_unpack(const void *buf, xfer_region_key_t *k);

/* A new region record of rec_size bytes (zeroed, its xfer_region_t first) in *rec_p, indexed
 * for [addr, addr + length) under a new id and key. XFER_ERR_INVALID_PARAM when that is no
 * memory to register (xfer_region_args_ok), XFER_ERR_NO_MEMORY. */
XFER_API xfer_status_t xfer_region_new(xfer_regions_t *t, size_t rec_size, void *addr,
                                       size_t length, void *rec_p);
struct xfer_ep_failq;   /* an endpoint's failure, below */
struct xfer_ep_fail;
/* why, when [addr, addr + len) is not inside r (xfer_region_at). */
XFER_API void xfer_region_outside(const xfer_region_t *r, uint64_t addr, uint64_t len,
                                  char *why, size_t why_size);
/*
 * The region a peer's request names by id and key, answered the same on every transport (every
 * record in t an xfer_region_t), or NULL with *status_p and why: XFER_ERR_NOT_FOUND, no region
 * has that id and key (never registered, deregistered, or a wrong key; counted in
 * *bad_keys_p). Past XFER_BAD_KEYS_MAX misses the peer is scanning for keys: its endpoint (f,
 * of q) is failed later with XFER_ERR_PROTOCOL, the request refused as any miss. bad_keys_p
 * NULL: the request was found before and is looked up again (a frame moving in slices) - a
 * miss is this side's deregistration, not the peer's guess, and counts nothing.
 */
XFER_API xfer_region_t *xfer_region_named(xfer_regions_t *t, uint64_t id, uint64_t key,
                                          struct xfer_ep_failq *q, struct xfer_ep_fail *f,
                                          uint32_t *bad_keys_p, xfer_status_t *status_p,
                                          char *why, size_t why_size);
/* The same for [addr, addr + len) of it: also XFER_ERR_OUT_OF_RANGE, the range is not inside. */
XFER_API xfer_region_t *xfer_region_reach(xfer_regions_t *t, uint64_t id, uint64_t key,
                                          uint64_t addr, uint64_t len,
                                          struct xfer_ep_failq *q, struct xfer_ep_fail *f,
                                          uint32_t *bad_keys_p,
                                          xfer_status_t *status_p, char *why,
                                          size_t why_size);

/* [addr, addr + length) is memory one may register: not NULL, not empty, not wrapping. */
static inline int xfer_region_args_ok(const void *addr, size_t length)
{
    return (addr != NULL) && (length > 0) && ((uintptr_t)addr + length >= (uintptr_t)addr);
}

/* [addr, addr + len) lies inside [base, base + blen), without overflow whatever a peer sent. */
static inline int xfer_range_within(uint64_t base, uint64_t blen, uint64_t addr, uint64_t len)
{
    return (addr >= base) && (addr - base <= blen) && (len <= blen - (addr - base));
}

/* Where [addr, addr + len) of r lies here, or NULL and why when it is not inside r. Inline: a
 * peer's batch of small blocks is checked a block at a time. */
static inline uint8_t *xfer_region_at(const xfer_region_t *r, uint64_t addr, uint64_t len,
                                      char *why, size_t why_size)
{
    uint64_t base = (uintptr_t)r->addr;

    if (xfer_range_within(base, r->length, addr, len)) {
        return r->addr + (addr - base);
    }
    xfer_region_outside(r, addr, len, why, why_size);
    return NULL;
}

/*
 * Peers' tensor requests (framework/tensor_answer.c): the producer's side of a fetch, for every
 * transport. A component hands each arriving request - its id on the wire, step and key - to
 * the engine and supplies one primitive, answer(): queue the wire answer to it, the tensor
 * (checked already: metadata that holds, data where it has bytes, within the size the
 * component gave) or an error with its reason. The engine keeps each endpoint's requests (an
 * id already pending is the peer's protocol error), hands them to the framework's tensor
 * table - which bounds how many of one peer's wait (XFER_TENSOR_MAX_REQUESTS) and of all
 * peers' (XFER_TENSOR_BUDGET) - answers one the consumer cancels while it waits, and releases
 * the tensor once the component says it is done with the answer, from the component's
 * progress (xfer_tanswers_release), never inside its walk of its queues.
 *
 * answer() may come inside xfer_tanswer_start(), or later from outside any call into the
 * component; after it the component owns the answer until xfer_tanswer_done(). Everything is
 * the component's iface's, under its lock.
 */
typedef struct xfer_tanswers xfer_tanswers_t;
typedef struct xfer_tanswer xfer_tanswer_t;

/* The first member of every engine: what the inline check below reads; the rest is libxfer's. */
typedef struct xfer_tanswers_head {
    xfer_tanswer_t *done_head;      /* answers done, tensors to release */
} xfer_tanswers_head_t;

/* The requests of one endpoint, in the component's endpoint (zeroed at its creation). */
typedef struct xfer_tanswer_list {
    xfer_tanswer_t *first;
    uint32_t       count;           /* requests on it */
    uint32_t       waiting;         /* ... handed to the framework, not answered yet */
} xfer_tanswer_list_t;

struct xfer_tanswer {
    /* the request; the component reads these */
    void                 *ep;       /* the component's endpoint */
    uint64_t             id;        /* its id on the wire */
    uint64_t             step;
    uint32_t             key_len;
    char                 *key;      /* key_len bytes, filled by the component, and a NUL;
                                     * a key past the iface's max_key_len has no room (NULL
                                     * destination: its bytes are dropped as they arrive) */
    void                 *priv;     /* the component's priv_size bytes, zeroed */
    xfer_tanswer_t       *next;     /* the next request of its endpoint */
    /* the engine's */
    xfer_tensor_waiter_t waiter;
    xfer_tanswers_t      *owner;
    xfer_tanswer_list_t  *list;
    xfer_tanswer_t       *prev;
    xfer_tanswer_t       *id_next;  /* another endpoint's request of the same id */
    void                 *fw_ep;
    uint64_t             max_size;
    void                 *handle;
    xfer_status_t        release_status;
    int                  state;
};

typedef void (*xfer_tanswer_cb_t)(xfer_tanswer_t *a, xfer_status_t status,
                                  const xfer_tensor_t *tensor, const char *reason);

XFER_API xfer_status_t xfer_tanswers_create(const xfer_iface_params_t *params, size_t priv_size,
                                            xfer_tanswer_cb_t answer, xfer_tanswers_t **t_p);
/* Releases what is done, then frees the engine: every endpoint is gone. */
XFER_API void xfer_tanswers_destroy(xfer_tanswers_t *t);
/* A request of ep (fw_ep: its framework endpoint) arrives; its key_len bytes of key are the
 * component's to fill into a->key (xfer_tanswer_key_room() of them), then
 * xfer_tanswer_start(). NULL with *status_p:
 * XFER_ERR_PROTOCOL (the id is pending; why says so) or XFER_ERR_NO_MEMORY. max_size: the
 * largest tensor the answer may carry. */
XFER_API xfer_tanswer_t *xfer_tanswer_new(xfer_tanswers_t *t, xfer_tanswer_list_t *list,
                                          void *ep, void *fw_ep, uint64_t id, uint64_t step,
                                          uint32_t key_len, uint64_t max_size,
                                          xfer_status_t *status_p, char *why, size_t why_size);
/* Bytes of key a->key has room for: key_len, or 0 for a key past the iface's limit. */
XFER_API uint32_t xfer_tanswer_key_room(const xfer_tanswer_t *a);
/* The key is in: ask the framework (or answer at once: a key past the iface's limit, no
 * tensors served here). */
XFER_API void xfer_tanswer_start(xfer_tanswer_t *a);
/* Drop a request whose key never arrived (its endpoint failed meanwhile). */
XFER_API void xfer_tanswer_discard(xfer_tanswer_t *a);
/* The consumer cancelled request id: one still waiting is withdrawn and answered with
 * XFER_ERR_CANCELED (1); one answered already is left to its answer (0). */
XFER_API int xfer_tanswer_cancel(xfer_tanswers_t *t, xfer_tanswer_list_t *list, uint64_t id);
/* The pending request id of list, or NULL. */
XFER_API xfer_tanswer_t *xfer_tanswer_find(xfer_tanswers_t *t, xfer_tanswer_list_t *list,
                                           uint64_t id);
/* The component is done with the answer (written, read by the peer, or dropped with status):
 * the tensor is released at the next xfer_tanswers_release(). */
XFER_API void xfer_tanswer_done(xfer_tanswer_t *a, xfer_status_t status);
/* Release the tensors of the answers done; how many. */
XFER_API unsigned xfer_tanswers_release(xfer_tanswers_t *t);
/* Releases are due: the component does not sleep, and releases. Inline: asked at every
 * progress, mostly to find nothing. */
static inline int xfer_tanswers_pending(const xfer_tanswers_t *t)
{
    return ((const xfer_tanswers_head_t*)(const void*)t)->done_head != NULL;
}
/* The endpoint of list goes: requests still waiting are withdrawn, answers the component still
 * held (it let go of them first) released with status; the list is empty after. */
XFER_API void xfer_tanswers_ep_gone(xfer_tanswer_list_t *list, xfer_status_t status);

/*
 * Tensor fetches over a component's own frames (framework/tensor_frames.c), both sides, for
 * the transports that frame their messages themselves (tcp, shm):
 *
 *   REQ     id, step, key                                           consumer -> producer
 *   RESP    id, status, the description or the reason, the data     producer -> consumer
 *   CANCEL  id                                                      consumer -> producer
 *
 * A RESP answers every REQ exactly once, also after a CANCEL (then XFER_ERR_CANCELED unless
 * it was already on its way). The component carries the frames - its wire format, its queues,
 * how the data moves - and hands the engine what arrives. The engine keeps this side's
 * fetches (a slot each; a cancelled one leaves a tombstone there that drops the answer which
 * still comes), says where an answer's data goes and completes its fetch; the peer's requests
 * go to the producer's engine above (xfer_tanswer_*). Everything is under the iface's lock.
 */
typedef struct xfer_tframes xfer_tframes_t;

/* A fetch's part of the component's op, zeroed with it. */
typedef struct xfer_tfetch {
    xfer_fetch_dest_t  dest;        /* where its tensor goes */
    xfer_cancel_hook_t hook;        /* on its comp until it completes */
    xfer_tframes_t     *tf;
    uint32_t           slot;        /* its index in tf->slots; its id is the REQ's */
    int                busy;        /* its answer arrives: too late to cancel */
    uint64_t           size;        /* the tensor's size, reported at completion */
} xfer_tfetch_t;

/* What the component does for the engine. */
typedef struct xfer_tframes_ops {
    const char    *subsys;
    uint32_t      slot_kind;        /* the kind of a fetch's slot, and of a cancelled one's */
    uint32_t      tomb_kind;
    size_t        fetch_offset;     /* of the xfer_tfetch_t in the component's op */
    /* May a fetch be posted now: XFER_OK, or the status that says why not. */
    xfer_status_t (*check)(xfer_ep_h ep);
    /* A zeroed op from the iface's pool for a fetch with comp into args' buffer (its memory
     * checked: XFER_ERR_INVALID_PARAM), or XFER_ERR_NO_MEMORY. */
    xfer_status_t (*op_new)(xfer_ep_h ep, const xfer_fetch_args_t *args, xfer_comp_t *comp,
                            void **op_p);
    /* Queue REQ (XFER_ERR_NO_MEMORY: nothing queued), then send what is queued (a failure
     * fails the ep, which completes the fetch; what send returns is not looked at). */
    xfer_status_t (*send_req)(xfer_ep_h ep, uint64_t id, const xfer_fetch_args_t *args);
    int           (*send)(xfer_ep_h ep);
    /* Queue CANCEL and send it, where the ep still sends; nothing otherwise. */
    void          (*send_cancel)(xfer_ep_h ep, uint64_t id);
} xfer_tframes_ops_t;

/* An endpoint's fetches, both ways (in the component's endpoint). */
struct xfer_tframes {
    const xfer_tframes_ops_t *ops;
    xfer_ep_h           ep;
    xfer_op_pool_t      *pool;          /* the iface's: the fetches' ops */
    xfer_slots_t        *slots;         /* the endpoint's, shared with its other requests */
    xfer_tanswers_t     *tanswers;
    void                *fw_ep;
    xfer_tanswer_list_t treqs;          /* the peer's requests */
    /* the frame being received */
    xfer_tfetch_t       *rx_fetch;      /* RESP: the fetch it answers (NULL: cancelled) */
    uint64_t            rx_id;
    xfer_status_t       rx_status;
    xfer_tanswer_t      *rx_treq;       /* REQ: the request whose key arrives */
};

XFER_API void xfer_tframes_init(xfer_tframes_t *tf, const xfer_tframes_ops_t *ops, xfer_ep_h ep,
                                xfer_op_pool_t *pool, xfer_slots_t *slots,
                                xfer_tanswers_t *tanswers, void *fw_ep);
/* Post a fetch (its key at most max_key_len bytes): XFER_INPROGRESS, or the error with
 * nothing left behind. */
XFER_API xfer_status_t xfer_tframes_fetch(xfer_tframes_t *tf, const xfer_fetch_args_t *args,
                                          xfer_comp_t *comp, uint32_t max_key_len);
/* The fetch op holds, or NULL. */
static inline xfer_tfetch_t *xfer_tframes_fetch_of(const xfer_tframes_t *tf, void *op)
{
    return (op == NULL) ? NULL : (xfer_tfetch_t*)(void*)((char*)op + tf->ops->fetch_offset);
}
/* A RESP for id begins to arrive. Of a status not XFER_OK it carries reason (reason_len
 * bytes) and no data; else it describes meta, whose data_len bytes go to *dest_p (NULL: they
 * are dropped - the fetch was cancelled, or its buffer is too small, or alloc gave none).
 * tf->rx_fetch is the fetch it answers, NULL when cancelled; it ends at
 * xfer_tframes_resp_done(). XFER_ERR_PROTOCOL (why) when id answers no fetch. */
XFER_API xfer_status_t xfer_tframes_resp(xfer_tframes_t *tf, uint64_t id, xfer_status_t status,
                                         const xfer_tensor_wire_meta_t *meta, const void *reason,
                                         size_t reason_len, void **dest_p, char *why,
                                         size_t why_size);
/* The RESP was received whole: its slot freed, its fetch (tf->rx_fetch, unless the component
 * took it away) completed. */
XFER_API void xfer_tframes_resp_done(xfer_tframes_t *tf);
/* A REQ {id, step, key_len} begins to arrive (max_size: the largest tensor its answer may
 * carry): its key goes to *key_p, *room_p bytes of it (NULL: dropped as it arrives, to be
 * answered with an error). XFER_ERR_PROTOCOL or XFER_ERR_NO_MEMORY with why. */
XFER_API xfer_status_t xfer_tframes_req(xfer_tframes_t *tf, uint64_t id, uint64_t step,
                                        uint32_t key_len, uint64_t max_size, void **key_p,
                                        uint32_t *room_p, char *why, size_t why_size);
/* Its key is in: the request goes to the framework (answered maybe before this returns). */
XFER_API void xfer_tframes_req_done(xfer_tframes_t *tf);
/* A CANCEL for id arrived. */
XFER_API void xfer_tframes_cancel_rx(xfer_tframes_t *tf, uint64_t id);
/* The frame being received is abandoned (the endpoint fails): a request whose key was
 * arriving is dropped. */
XFER_API void xfer_tframes_rx_abort(xfer_tframes_t *tf);
/* The endpoint goes: the peer's requests withdrawn, the tensors answered with released with
 * status (the component let go of its answers first). Its fetches end with its slots. */
XFER_API void xfer_tframes_ep_gone(xfer_tframes_t *tf, xfer_status_t status);

/*
 * Batch walks (framework/batch_walk.c): a batch (xfer_batch_args_t) moved descriptor by
 * descriptor through the transport's own puts and gets - tcp's gets and its small puts
 * gathered into frames, shm's ring, the framework's batches on a transport without a batch
 * entry point. The walk posts descriptors while the owner says there is room (by default:
 * fewer than XFER_BATCH_WINDOW bytes of them in flight), counts what landed, stops at the first
 * failure or at xfer_batch_walk_stop(), and calls done() once: when every descriptor it posted
 * has completed and every hold of the owner's (the posting, a notification, an answer) has
 * been released. What goes on the wire, the notification and the answer stay the owner's.
 * The walk lives inside the owner's record, under the owner's lock.
 */
typedef struct xfer_batch_walk xfer_batch_walk_t;

/* Bytes of one batch the initiator has in flight at a time, on every transport (a walk's
 * default room, tcp's frames ahead of its socket, verbs' work requests not completed): the
 * rest is posted as they complete, so that a batch that ends early stops within this much of
 * where it was (contract C17) and a large one holds neither memory nor the endpoint. */
#define XFER_BATCH_WINDOW (8u << 20)

typedef struct xfer_batch_walk_sub {
    xfer_comp_t       comp;
    xfer_batch_walk_t *walk;
} xfer_batch_walk_sub_t;

typedef struct xfer_batch_walk_ops {
    /* Post descriptor i through comp. *n_p is 1; the owner may take more descriptors in one
     * operation that nobody is told of (tcp: a frame of many small puts) and say how many.
     * XFER_INPROGRESS: comp will be told (with *n_p 1); XFER_OK: done now, nobody is told;
     * an error: nothing of them went, and the walk stops. */
    xfer_status_t (*post)(xfer_batch_walk_t *w, size_t i, xfer_comp_t *comp, size_t *n_p);
    /* Whether more may be posted now; NULL: while fewer than XFER_BATCH_WINDOW bytes are in
     * flight. */
    int (*room)(xfer_batch_walk_t *w);
    /* A descriptor completed and room may have opened: post more (and whatever the owner
     * sends behind the last). NULL: xfer_batch_walk_fill(). */
    void (*more)(xfer_batch_walk_t *w);
    /* Every hold ended: the owner ends the batch with status and landed. */
    void (*done)(xfer_batch_walk_t *w);
} xfer_batch_walk_ops_t;

struct xfer_batch_walk {
    const xfer_batch_walk_ops_t *ops;
    xfer_batch_args_t           *args;      /* landed is raised there too */
    int                         puts_land;  /* a put's completion says it landed; else the
                                             * owner raises landed (an answer, a flush) */
    size_t                      next;       /* the first descriptor not posted */
    size_t                      holds;      /* descriptors in flight, and the owner's */
    size_t                      landed;
    uint64_t                    inflight;   /* bytes of the descriptors in flight */
    xfer_status_t               status;     /* the first failure */
    int                         stopped;    /* nothing more is posted */
    xfer_batch_walk_sub_t       *subs;
};

/* A walk of args, holding once for the posting (released by the owner once it has filled).
 * Its per-descriptor records are allocated by the first fill (no memory: the walk stops with
 * XFER_ERR_NO_MEMORY). */
XFER_API void xfer_batch_walk_init(xfer_batch_walk_t *w, const xfer_batch_walk_ops_t *ops,
                                   xfer_batch_args_t *args, int puts_land);
XFER_API void xfer_batch_walk_cleanup(xfer_batch_walk_t *w);
/* Post descriptors while there is room and the walk goes on; 1 when it posted any. */
XFER_API int xfer_batch_walk_fill(xfer_batch_walk_t *w);
/* No more descriptors go; status (not XFER_OK) is kept when it is the first failure. */
XFER_API void xfer_batch_walk_stop(xfer_batch_walk_t *w, xfer_status_t status);
/* One hold fewer; at none, done(). */
XFER_API void xfer_batch_walk_release(xfer_batch_walk_t *w);
/* For done(): the batch completes on comp with what landed (in its args too) and its status -
 * XFER_ERR_CANCELED when it ended early with nothing failed; the walk's records go. */
XFER_API void xfer_batch_walk_complete(xfer_batch_walk_t *w, xfer_comp_t *comp);

static inline void xfer_batch_walk_hold(xfer_batch_walk_t *w)
{
    w->holds++;
}

/* Every descriptor went and nothing stopped the walk. */
static inline int xfer_batch_walk_all_posted(const xfer_batch_walk_t *w)
{
    return !w->stopped && (w->status == XFER_OK) && (w->next == w->args->count);
}

/*
 * A peer's notifications (framework/notify.c), on every transport: one arrives once its
 * batch's data is in this side's memory, or was read from it. Where a batch's puts come as
 * frames of their own (tcp, shm's ring) and are checked one by one, its notification names
 * how many of them came just before it, and is dropped when one of those was refused: the
 * data it announces is not all there.
 */
typedef struct xfer_batch_rx {
    uint64_t      puts;             /* puts of batches received */
    uint64_t      refused_at;       /* puts when the last refused one came; 0: none */
    xfer_status_t refused_status;   /* what refused it */
} xfer_batch_rx_t;

/* A put (n puts of one frame) of a batch came; xfer_batch_rx_refused() after, if refused. */
static inline void xfer_batch_rx_put(xfer_batch_rx_t *r, uint64_t n)
{
    r->puts += n;
}

static inline void xfer_batch_rx_refused(xfer_batch_rx_t *r, xfer_status_t status)
{
    r->refused_at     = r->puts;
    r->refused_status = status;
}

/* A batch ends after its last puts puts (at most r->puts): XFER_OK when every one landed,
 * else the status that refused one of them. */
static inline xfer_status_t xfer_batch_rx_end(const xfer_batch_rx_t *r, uint64_t puts)
{
    return ((r->refused_at != 0) && (r->refused_at > r->puts - puts)) ? r->refused_status :
           XFER_OK;
}

/* Hand a peer's notification of len bytes to the framework - or drop it (logged) when r says
 * a put of its batch was refused (r NULL: none can be). XFER_ERR_PROTOCOL: this side takes
 * none that long; XFER_ERR_NO_RESOURCE: refused (too many not taken) - the endpoint fails,
 * why says so. */
XFER_API xfer_status_t xfer_notify_deliver(const xfer_iface_params_t *params, void *fw_ep,
                                           const xfer_batch_rx_t *r, uint64_t puts,
                                           const void *msg, size_t len, const char *subsys,
                                           char *why, size_t why_size);

/*
 * A notification that arrives in pieces (longer than the frame that announced it): its room,
 * allocated at the first piece and charged to the process's XFER_NOTIFY_BUDGET until it is
 * delivered or dropped, so that peers part-way through theirs are held to the budget like the
 * notifications queued, and a peer that never sends the rest holds only its share. The caller
 * checked len against the iface's max_notify_len. Refused, and the endpoint fails:
 * XFER_ERR_NO_RESOURCE past the peer's share, XFER_ERR_NO_MEMORY, XFER_ERR_PROTOCOL while
 * another is arriving; why says so.
 */
typedef struct xfer_notify_rx {
    uint8_t *buf;       /* NULL: none arriving */
    size_t   len;
} xfer_notify_rx_t;

XFER_API xfer_status_t xfer_notify_rx_begin(void *fw_ep, xfer_notify_rx_t *n, size_t len,
                                            char *why, size_t why_size);
/* Hand the whole notification over as xfer_notify_deliver does; the room goes either way. */
XFER_API xfer_status_t xfer_notify_rx_deliver(const xfer_iface_params_t *params, void *fw_ep,
                                              xfer_notify_rx_t *n, const xfer_batch_rx_t *r,
                                              uint64_t puts, const char *subsys, char *why,
                                              size_t why_size);
/* Drop what arrived (a voided notification, a failing endpoint); none arriving is fine. */
XFER_API void xfer_notify_rx_end(void *fw_ep, xfer_notify_rx_t *n);

/*
 * An endpoint's failure, told once (framework/comp_base.c). The component records status and
 * reason and completes what is pending on the endpoint - at once, or, where it finds the
 * failure inside a walk of its own queues, at the start of its next progress (deferred).
 * The framework's ep_failed is then told at the end of a progress, never inside the
 * component's walk, and never twice. Both queues are the iface's, under its lock.
 */
/* An endpoint's life as the record below keeps it: CREATED until the component connects it
 * (it sets CONNECTED), FAILING once failed later (it refuses new operations until the next
 * progress tears it down), FAILED from the start of its teardown on. */
typedef enum xfer_ep_state {
    XFER_EP_CREATED,
    XFER_EP_CONNECTED,
    XFER_EP_FAILING,
    XFER_EP_FAILED,
} xfer_ep_state_t;

typedef struct xfer_ep_fail {
    xfer_ep_state_t state;          /* first: read at every progress, with what precedes it */
    xfer_status_t   status;         /* XFER_OK until it fails */
    ucs_list_link_t link;           /* on one of the queues while queued */
    void            *fw_ep;         /* the framework's endpoint, as ep_failed takes it */
    void            *owner;         /* the component's endpoint */
    int             bye_clean;      /* the peer closed in order (BYE) when everything this side
                                     * sent was delivered: a flush after it succeeds */
    int             queued;         /* 0, or which queue: deferred or told */
    int             torn;           /* the component's teardown ran */
    char            reason[XFER_REASON_MAX];
} xfer_ep_fail_t;

/* What the component does for the queue (owner: its endpoint; subsys: its log lines').
 * who: names the endpoint in the failure's log line and returns the line's level (INFO for
 * a peer that just left; an orderly close by the peer is always INFO). teardown: complete
 * what is pending on the endpoint with status and close it - called once per endpoint, by
 * the failure or by xfer_ep_fail_destroy (the record's state is FAILED by then). failing
 * (NULL: none): the endpoint was failed later, for a component that keeps its own state. */
typedef struct xfer_ep_fail_ops {
    const char       *subsys;
    xfer_log_level_t (*who)(void *owner, char *buf, size_t size);
    void             (*teardown)(void *owner, xfer_status_t status);
    void             (*failing)(void *owner);
} xfer_ep_fail_ops_t;

typedef struct xfer_ep_failq {
    ucs_list_link_t          deferred;  /* to be torn down at the next progress */
    ucs_list_link_t          tell;      /* torn down: ep_failed is told next */
    const xfer_ep_fail_ops_t *ops;
} xfer_ep_failq_t;

XFER_API void xfer_ep_failq_init(xfer_ep_failq_t *q, const xfer_ep_fail_ops_t *ops);
/* f belongs to owner, the framework's fw_ep; not failed. */
XFER_API void xfer_ep_fail_init(xfer_ep_fail_t *f, void *owner, void *fw_ep);
/* Fail f's endpoint now (from progress): record status and the reason fmt formats, unless a
 * failure is recorded already (the first one is what the framework is told); then, unless
 * it was torn down already, log, q's teardown, and queue it for ep_failed. */
XFER_API void xfer_ep_fail(xfer_ep_failq_t *q, xfer_ep_fail_t *f, xfer_status_t status,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));
XFER_API void xfer_ep_fail_v(xfer_ep_failq_t *q, xfer_ep_fail_t *f, xfer_status_t status,
                             const char *fmt, va_list ap);
/* Fail it at the start of the next progress (from anywhere, a walk of the component's own
 * queues included): record, queue, and q's failing - unless a failure is recorded already. */
XFER_API void xfer_ep_fail_later(xfer_ep_failq_t *q, xfer_ep_fail_t *f, xfer_status_t status,
                                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Tear down every endpoint failed later; how many. progress() calls it first, through
 * xfer_ep_failq_progress(). */
XFER_API unsigned xfer_ep_failq_teardown(xfer_ep_failq_t *q);
/* Tell params' ep_failed of every endpoint torn down; how many. */
XFER_API unsigned xfer_ep_failq_tell(xfer_ep_failq_t *q, const xfer_iface_params_t *params);
/* f's endpoint is destroyed: torn down with XFER_ERR_CANCELED unless it was, off any
 * queue, nobody told. */
XFER_API void xfer_ep_fail_destroy(xfer_ep_failq_t *q, xfer_ep_fail_t *f);

/* What a new operation on the endpoint of f is answered: XFER_OK while it is connected,
 * created before it is, and its failure once it failed. */
static inline xfer_status_t xfer_ep_state_check(const xfer_ep_fail_t *f, xfer_status_t created)
{
    if (ucs_likely(f->state == XFER_EP_CONNECTED)) {
        return XFER_OK;
    }
    if (f->state == XFER_EP_CREATED) {
        return created;
    }
    return (f->status != XFER_OK) ? f->status : XFER_ERR_CONNECTION;
}

/* The peer's BYE is handled: clean, everything this side sent was delivered by then (what a
 * flush after it is answered); why says so for the failure it returns, XFER_ERR_PEER_CLOSED,
 * with which the endpoint ends. */
static inline xfer_status_t xfer_ep_bye(xfer_ep_fail_t *f, int clean, char *why,
                                        size_t why_size)
{
    f->bye_clean = clean;
    snprintf(why, why_size, "the peer closed its endpoint");
    return XFER_ERR_PEER_CLOSED;
}

/* A flush on an endpoint that ended: after the peer's BYE, what was known then; else the
 * endpoint's failure. */
static inline xfer_status_t xfer_ep_flush_ended(const xfer_ep_fail_t *f)
{
    return ((f->status == XFER_ERR_PEER_CLOSED) && f->bye_clean) ? XFER_OK : f->status;
}

/* The endpoint's own copy of the bootstrap's connected socket (close-on-exec): the
 * descriptor, or -1 with a log line of subsys's. */
XFER_API int xfer_ep_sock_take(int sock_fd, const char *subsys);
/* Watch the endpoint's socket in epfd for input and the peer's hang-up (data.ptr = ep):
 * XFER_OK, or XFER_ERR_NO_RESOURCE with a log line of subsys's. */
XFER_API xfer_status_t xfer_ep_sock_watch(int epfd, int fd, void *ep, const char *subsys);
/* Out of epfd, if it was watched there, and closed; *fd_p -1 (nothing when it is already). */
XFER_API void xfer_ep_sock_close(int epfd, int *fd_p);

/* xfer_ep_failq_teardown() when there is one to tear down: every progress() asks, and
 * almost never finds one. */
static inline unsigned xfer_ep_failq_progress(xfer_ep_failq_t *q)
{
    return ucs_list_is_empty(&q->deferred) ? 0 : xfer_ep_failq_teardown(q);
}

/* Work is queued: a component does not sleep then. */
static inline int xfer_ep_failq_busy(xfer_ep_failq_t *q)
{
    return !ucs_list_is_empty(&q->deferred) || !ucs_list_is_empty(&q->tell);
}

/* xfer_iface_deliver's how: the completions delivered inline, for a component that completes
 * an op for nearly every message (verbs: a call per completion showed in its round trips);
 * without it, by a call, for one whose progress loop inlining the delivery weighed on (tcp:
 * tag_lat 8 B 3 % slower, with no op delivered in it). */
#define XFER_IFACE_DELIVER_INLINE 1u

/*
 * What every component's iface holds of the framework's engines (comp_base.c), the way
 * libfabric's util_domain serves its providers: the epoll set progress waits on, the region
 * table peers' requests are checked against (tcp, shm), the pool of operations with their
 * completions, the tensor answers, and the queues of failed endpoints.
 */
typedef struct xfer_iface_base {
    int             epfd;
    int             timerfd;        /* in epfd (data.ptr = &timerfd), disarmed; -1: none */
    uint64_t        timer_ns;       /* its period now, 0 disarmed */
    xfer_regions_t  *regions;       /* NULL where the component keeps none */
    xfer_op_pool_t  *ops;
    xfer_tanswers_t *tanswers;
    xfer_ep_failq_t failq;
} xfer_iface_base_t;

typedef struct xfer_iface_base_desc {
    const char               *subsys;       /* its log lines' */
    const xfer_ep_fail_ops_t *fail_ops;
    size_t                   op_size;       /* the component's op, an xfer_op_t first */
    size_t                   op_extra;      /* payload bytes an op of the pool may carry */
    const char               *op_pool_name;
    size_t                   answer_size;   /* the component's part of a tensor answer */
    xfer_tanswer_cb_t        answer;
    int                      regions;       /* keep a region table */
    int                      timer;         /* keep a timer in the epoll set */
} xfer_iface_base_desc_t;

/* Create b's engines as d says, for an iface opened with params: XFER_OK, or the error with
 * a log line and nothing left behind. */
XFER_API xfer_status_t xfer_iface_base_open(xfer_iface_base_t *b,
                                            const xfer_iface_base_desc_t *d,
                                            const xfer_iface_params_t *params);
/* Free them, every endpoint gone: what completed is delivered first. What open left NULL or
 * -1 is skipped, so that a half-opened iface closes too. */
XFER_API void xfer_iface_base_close(xfer_iface_base_t *b);
/* Let b's timer fire every period_ns (at least 1 ms), or never again (0); a period it has
 * already costs nothing. XFER_ERR_IO when the kernel refuses (the timer stays as it was). */
XFER_API xfer_status_t xfer_iface_base_timer(xfer_iface_base_t *b, uint64_t period_ns);

/* An operation of length bytes past limit, the smaller of both sides' message limits (param
 * names the setting): logged for subsys as what ("put", "tag send") exceeding it; returns
 * XFER_ERR_OUT_OF_RANGE. */
XFER_API xfer_status_t xfer_op_too_long(const char *subsys, const char *what, size_t length,
                                        uint64_t limit, const char *param)
    __attribute__((cold));

/* The end of a component's progress, in this order: the framework told of endpoints torn
 * down, tensors handed out released, then the completions queued by now (a callback that
 * posts and completes at once waits for the next progress); how many. Inline, each step
 * asked first: it runs at every progress, mostly to find nothing. how: a constant, 0 or
 * XFER_IFACE_DELIVER_INLINE. */
static inline unsigned xfer_iface_deliver(xfer_iface_base_t *b, const xfer_iface_params_t *params,
                                          unsigned how)
{
    unsigned count = ucs_list_is_empty(&b->failq.tell) ? 0 : xfer_ep_failq_tell(&b->failq,
                                                                                params);

    if (xfer_tanswers_pending(b->tanswers)) {
        count += xfer_tanswers_release(b->tanswers);
    }
    if (!xfer_op_queued(b->ops)) {
        return count;
    }
    return count + ((how & XFER_IFACE_DELIVER_INLINE) ? xfer_op_deliver_inline(b->ops) :
                    xfer_op_deliver(b->ops));
}

#endif /* XFER_ENGINE_H */
