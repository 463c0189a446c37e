/*
 * Process-wide budgets for what peers make this process hold: messages nobody received yet,
 * answers queued for peers that do not read them, notifications not taken, peers' requests
 * waiting for tensors not published. Each queue has its bound per endpoint (the transport's
 * or the framework's parameter); these bound the sum over every endpoint of every context
 * of the process, so that many peers together cannot make it hold more than one would.
 *
 * Fair shares: beyond a floor of limit / 64, an endpoint may hold at most limit / (n + 2) of a
 * kind, n being the other endpoints that hold some, and only while the process's total stays
 * within three quarters of the limit. The last quarter is kept for floors: however many peers
 * hog theirs, at least 16 others - a peer that takes its notifications and receives its
 * messages holds little - still find room. Every take keeps the total within the limit. A
 * take that does not fit is refused and nothing is taken: the caller slows its peer down
 * (does not read it) or refuses the item, as its queue's bound says (docs/contract.md, C25).
 *
 * The limits are the framework's parameters (XFER_UNEXPECTED_BUDGET ...) as the last context
 * created read them. The state is shared by the contexts of the process, under a mutex of its
 * own: takes and gives come from inside each context's lock, never nested in another.
 */
#include "xfer_int.h"

#include <inttypes.h>
#include <pthread.h>

#define BUDGET_FLOOR    64u     /* every endpoint may hold limit / 64 */
#define BUDGET_RESERVE  4u      /* takes beyond a floor leave limit / 4 free */

static const char *const budget_names[XFER_BUDGET_KINDS] = {
    [XFER_BUDGET_UNEXPECTED] = "XFER_UNEXPECTED_BUDGET",
    [XFER_BUDGET_ANSWERS]    = "XFER_ANSWERS_BUDGET",
    [XFER_BUDGET_NOTIFY]     = "XFER_NOTIFY_BUDGET",
    [XFER_BUDGET_TENSOR]     = "XFER_TENSOR_BUDGET",
};

static struct {
    pthread_mutex_t lock;
    uint64_t        limit[XFER_BUDGET_KINDS];
    uint64_t        used[XFER_BUDGET_KINDS];
    unsigned        holders[XFER_BUDGET_KINDS];     /* endpoints holding some */
    uint64_t        gives;                          /* ever: paused peers may look again */
} budget = {.lock = PTHREAD_MUTEX_INITIALIZER};

void xfer_budget_configure(const xfer_fw_config_t *cfg)
{
    pthread_mutex_lock(&budget.lock);
    budget.limit[XFER_BUDGET_UNEXPECTED] = cfg->unexpected_budget;
    budget.limit[XFER_BUDGET_ANSWERS]    = cfg->answers_budget;
    budget.limit[XFER_BUDGET_NOTIFY]     = cfg->notify_budget;
    budget.limit[XFER_BUDGET_TENSOR]     = cfg->tensor_budget;
    pthread_mutex_unlock(&budget.lock);
}

int xfer_budget_take(void *fw_ep, xfer_budget_kind_t kind, uint64_t amount)
{
    xfer_endpoint_t *ep = fw_ep;
    uint64_t share, limit, mine;
    unsigned others;
    int ok;

    if ((ep == NULL) || ((unsigned)kind >= XFER_BUDGET_KINDS)) {
        return 0;
    }
    if (amount == 0) {
        return 1;
    }
    pthread_mutex_lock(&budget.lock);
    limit  = budget.limit[kind];
    mine   = ep->budget_used[kind];
    others = budget.holders[kind] - (mine > 0);
    share  = limit / ((uint64_t)others + 2);
    ok     = (limit == 0) ||
             ((budget.used[kind] <= limit) && (amount <= limit - budget.used[kind]) &&
              ((mine + amount <= limit / BUDGET_FLOOR) ||
               ((mine + amount <= share) &&
                (budget.used[kind] + amount <= limit - limit / BUDGET_RESERVE))));
    if (ok) {
        budget.used[kind]     += amount;
        budget.holders[kind]  += (mine == 0);
        ep->budget_used[kind]  = mine + amount;
    }
    pthread_mutex_unlock(&budget.lock);
    return ok;
}

void xfer_budget_give(void *fw_ep, xfer_budget_kind_t kind, uint64_t amount)
{
    xfer_endpoint_t *ep = fw_ep;

    if ((ep == NULL) || ((unsigned)kind >= XFER_BUDGET_KINDS) || (amount == 0)) {
        return;
    }
    pthread_mutex_lock(&budget.lock);
    if (amount > ep->budget_used[kind]) {
        xfer_log(XFER_LOG_ERROR, "budget", "endpoint to %s gives back %" PRIu64 " of %s, more "
                 "than the %" PRIu64 " it holds", ep->peer, amount, budget_names[kind],
                 ep->budget_used[kind]);
        amount = ep->budget_used[kind];
    }
    ep->budget_used[kind] -= amount;
    budget.used[kind]     -= amount;
    budget.holders[kind]  -= (ep->budget_used[kind] == 0) && (amount > 0);
    budget.gives++;
    pthread_mutex_unlock(&budget.lock);
}

uint64_t xfer_budget_gives(void)
{
    return __atomic_load_n(&budget.gives, __ATOMIC_RELAXED);
}

void xfer_budget_ep_release(xfer_endpoint_t *ep)
{
    for (unsigned k = 0; k < XFER_BUDGET_KINDS; k++) {
        if (ep->budget_used[k] > 0) {
            xfer_log(XFER_LOG_ERROR, "budget", "endpoint to %s goes still holding %" PRIu64
                     " of %s; given back", ep->peer, ep->budget_used[k], budget_names[k]);
            xfer_budget_give(ep, (xfer_budget_kind_t)k, ep->budget_used[k]);
        }
    }
}

/* Take what q holds past its grant, a step ahead when that fits: 1 when all is granted. */
static int queue_grant(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q)
{
    uint64_t need;

    if (q->held <= q->granted) {
        return 1;
    }
    need = q->held - q->granted;
    if (xfer_budget_take(fw_ep, kind, need + XFER_BUDGET_STEP)) {
        q->granted += need + XFER_BUDGET_STEP;
        return 1;
    }
    if (xfer_budget_take(fw_ep, kind, need)) {
        q->granted += need;
        return 1;
    }
    return 0;
}

void xfer_budget_queue_add(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q,
                           uint64_t amount)
{
    q->held += amount;
    (void)queue_grant(fw_ep, kind, q);
}

void xfer_budget_queue_remove(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q,
                              uint64_t amount)
{
    uint64_t spare;

    q->held = (amount < q->held) ? q->held - amount : 0;
    if (q->granted <= q->held) {
        return;     /* what went was held past the grant */
    }
    spare = q->granted - q->held;
    if (q->held == 0) {
        xfer_budget_give(fw_ep, kind, spare);
        q->granted = 0;
    } else if (spare >= 2 * XFER_BUDGET_STEP) {
        xfer_budget_give(fw_ep, kind, spare - XFER_BUDGET_STEP);
        q->granted -= spare - XFER_BUDGET_STEP;
    }
}

int xfer_budget_queue_within(void *fw_ep, xfer_budget_kind_t kind, xfer_budget_queue_t *q)
{
    return queue_grant(fw_ep, kind, q);
}

const char *xfer_budget_name(xfer_budget_kind_t kind)
{
    return ((unsigned)kind < XFER_BUDGET_KINDS) ? budget_names[kind] : "?";
}
