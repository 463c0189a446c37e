/*
 * libxfer internals shared by the framework's files. Not installed.
 */
#ifndef XFER_INT_H
#define XFER_INT_H

#include <xfer/xfer.h>
#include <xfer/component.h>
#include <xfer/info.h>

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>

#include <poll.h>
#include <pthread.h>
#include <time.h>

#define XFER_ENV_PREFIX "XFER_"

/* One parsed parameter: the descriptor and where its current value came from. */
typedef struct xfer_param_value {
    const xfer_param_desc_t *desc;
    char                    *env_name;
    char                    *value;         /* current value, as text */
    char                    *range;         /* printable range, "" when unbounded */
    xfer_param_source_t     source;
} xfer_param_value_t;

/* A component's parameter table, parsed into its config struct. */
typedef struct xfer_param_set {
    const char              *component;     /* NULL for the framework */
    void                    *config;        /* config_size bytes the descs point into */
    size_t                  config_size;
    size_t                  num;
    xfer_param_value_t      *values;
} xfer_param_set_t;

/* One candidate file the loader looked at. */
typedef struct xfer_component_entry {
    ucs_list_link_t             list;
    char                        *name;      /* from the struct, or derived from the file name */
    char                        *path;
    const char                  *origin;
    void                        *dl_handle;
    const xfer_component_v1_t   *comp;      /* NULL when the loader rejected the file */
    const xfer_component_stats_v1_t *stats; /* its optional counters extension, or NULL */
    xfer_component_state_t      state;
    char                        reason[XFER_REASON_MAX * 2];
    xfer_param_set_t            params;
    xfer_component_attr_t       attr;
    struct xfer_fw_iface        *fw_iface;  /* the opened instance, NULL when not open */
} xfer_component_entry_t;

/* One opened transport instance; ctx->ifaces[index]. */
typedef struct xfer_fw_iface {
    xfer_component_entry_t      *entry;
    const xfer_component_v1_t   *comp;
    xfer_iface_h                iface;
    unsigned                    index;
    int                         event_fd;   /* -1 when the component has none */
    uint8_t                     addr[1024]; /* iface_address, for the HELLO */
    size_t                      addr_len;
} xfer_fw_iface_t;

/*
 * ABI v1 grew at its end before it was frozen. The loader accepts a component struct from
 * XFER_COMPONENT_V1_SIZE_MIN bytes (built before iface_reachable existed) up to this build's
 * sizeof; a field past the component's size is not in its struct, so it is read only through
 * a helper that checks size first and says NULL (the field's "not implemented") otherwise.
 */
#define XFER_COMPONENT_V1_SIZE_MIN offsetof(xfer_component_v1_t, iface_reachable)

#define XFER_COMPONENT_V1_HAS(_comp, _field) \
    ((_comp)->size >= offsetof(xfer_component_v1_t, _field) + sizeof((_comp)->_field))

typedef int (*xfer_iface_reachable_func_t)(xfer_iface_h iface, const void *peer_iface_addr,
                                           size_t addr_len, char *why, size_t why_size);

static inline xfer_iface_reachable_func_t
xfer_component_iface_reachable(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, iface_reachable) ? comp->iface_reachable : NULL;
}

typedef xfer_status_t (*xfer_batch_func_t)(xfer_ep_h ep, xfer_batch_args_t *args,
                                           xfer_comp_t *comp);

static inline xfer_batch_func_t xfer_component_batch(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, batch) ? comp->batch : NULL;
}

typedef xfer_status_t (*xfer_ep_shutdown_func_t)(xfer_ep_h ep, xfer_comp_t *comp);

static inline xfer_ep_shutdown_func_t xfer_component_ep_shutdown(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, ep_shutdown) ? comp->ep_shutdown : NULL;
}

typedef xfer_status_t (*xfer_tag_pull_func_t)(xfer_ep_h ep, const void *priv, size_t priv_len,
                                              uint64_t length, void *buf, size_t capacity,
                                              xfer_memh_h memh, void *handle);
typedef xfer_status_t (*xfer_tag_copy_func_t)(xfer_ep_h ep, void *dst, xfer_memh_h memh,
                                              const void *src, size_t len);
typedef void (*xfer_tag_released_func_t)(xfer_ep_h ep, const void *priv, size_t priv_len,
                                         int received);
typedef void (*xfer_tag_resume_func_t)(xfer_iface_h iface);

static inline xfer_tag_pull_func_t xfer_component_tag_pull(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, tag_pull) ? comp->tag_pull : NULL;
}

static inline xfer_tag_copy_func_t xfer_component_tag_copy(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, tag_copy) ? comp->tag_copy : NULL;
}

static inline xfer_tag_released_func_t
xfer_component_tag_released(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, tag_released) ? comp->tag_released : NULL;
}

static inline xfer_tag_resume_func_t xfer_component_tag_resume(const xfer_component_v1_t *comp)
{
    return XFER_COMPONENT_V1_HAS(comp, tag_resume) ? comp->tag_resume : NULL;
}

/* Framework configuration: the table is in context.c. */
typedef struct xfer_fw_config {
    int         log_level;          /* xfer_log_level_t */
    const char  *transports;        /* XFER_TRANSPORTS, "" = all */
    const char  *component_path;    /* XFER_COMPONENT_PATH */
    double      bootstrap_timeout;  /* XFER_BOOTSTRAP_TIMEOUT, seconds */
    uint64_t    bootstrap_max_pending; /* XFER_BOOTSTRAP_MAX_PENDING, per listener */
    int         progress_thread;    /* XFER_PROGRESS_THREAD */
    uint64_t    max_key_len;        /* XFER_MAX_KEY_LEN */
    int         stats;              /* XFER_STATS: print endpoints' counters when they close */
    double      close_timeout;      /* XFER_CLOSE_TIMEOUT, seconds */
    uint64_t    tensor_max_requests;    /* XFER_TENSOR_MAX_REQUESTS, per peer */
    double      tensor_request_timeout; /* XFER_TENSOR_REQUEST_TIMEOUT, seconds */
    const char  *cuda_lib;          /* XFER_CUDA_LIB */
    uint64_t    staging_chunk;      /* XFER_STAGING_CHUNK, bytes */
    uint64_t    staging_depth;      /* XFER_STAGING_DEPTH, bounce buffers */
    double      batch_timeout;      /* XFER_BATCH_TIMEOUT, seconds; 0 = none */
    uint64_t    batch_max_descs;    /* XFER_BATCH_MAX_DESCS */
    uint64_t    notify_max_len;     /* XFER_NOTIFY_MAX_LEN, bytes */
    uint64_t    notify_max_queued;  /* XFER_NOTIFY_MAX_QUEUED, per endpoint */
    uint64_t    fair_slice;         /* XFER_FAIR_SLICE, bytes */
    uint64_t    unexpected_budget;  /* XFER_UNEXPECTED_BUDGET, bytes, the process's */
    uint64_t    answers_budget;     /* XFER_ANSWERS_BUDGET, bytes */
    uint64_t    notify_budget;      /* XFER_NOTIFY_BUDGET, bytes */
    uint64_t    tensor_budget;      /* XFER_TENSOR_BUDGET, requests */
    uint64_t    unexpected_ep;      /* XFER_UNEXPECTED_EP, bytes, one endpoint's */
    const char  *auth_key_file;     /* XFER_AUTH_KEY_FILE */
} xfer_fw_config_t;

/* XFER_TRANSPORTS parsed: an include list (ordered) or an exclude list. */
typedef struct xfer_transport_spec {
    int     negate;                 /* 1: "^a,b" = all but these */
    int     all;                    /* 1: no restriction */
    size_t  num;
    char    **names;
} xfer_transport_spec_t;

/*
 * Progress hooks: a feature with work that needs the context's progress - a deadline to keep,
 * a copy to poll, a queue to deliver - registers a hook while it has some, and progress calls
 * the registered ones after the transports, in the order they came. Progress then costs what
 * is active, and a new feature adds a hook, not a branch in progress.c. A hook may remove
 * itself (or another) from inside its progress.
 */
typedef struct xfer_progress_hook {
    ucs_list_link_t link;               /* ctx->hooks while registered */
    int             registered;
    unsigned        (*progress)(xfer_context_t *ctx);   /* events it handled */
    int             (*timeout)(xfer_context_t *ctx);    /* ms until due, 0 now, -1 none; or
                                                         * NULL */
    int             (*busy)(xfer_context_t *ctx);       /* it polls: do not sleep; or NULL */
} xfer_progress_hook_t;

struct xfer_context {
    xfer_fw_config_t        fw_config;
    xfer_param_set_t        fw_params;
    ucs_list_link_t         components;     /* xfer_component_entry_t, in load order */
    size_t                  num_components;
    char                    *search_path;
    xfer_transport_spec_t   transports;
    char                    *env_error;     /* NULL when the environment is valid */
    uint8_t                 *auth_key;      /* the shared key peers prove (auth.c); NULL */
    size_t                  auth_key_len;
    xfer_param_info_t       *param_index;   /* flattened for xfer_param_get() */
    size_t                  num_params;

    /* data path; everything below is guarded by lock */
    pthread_mutex_t         lock;           /* see xfer_ctx_lock */
    pthread_t               lock_owner;     /* the thread that holds it, 0 when free */
    unsigned                lock_depth;     /* how often the owner took it */
    int                     serialized;     /* XFER_CONTEXT_FLAG_SERIALIZED: no lock at all */
    pthread_cond_t          cond;           /* broadcast when a request completes */
    uint64_t                id;             /* random, non-zero; remote keys carry it */
    xfer_fw_iface_t         *ifaces;
    unsigned                num_ifaces;
    int                     wake_fd;        /* eventfd: wakes the thread sleeping in poll */
    int                     poller_busy;    /* a thread sleeps in poll on the fds */
    int                     user_epfd;      /* xfer_context_event_fd(); -1 until asked for */
    int                     user_timerfd;   /* in it: the nearest deadline at arm time */
    int                     user_armed;     /* xfer_context_arm() said sleep: wake it */
    int                     stopping;
    int                     destroying;     /* xfer_context_destroy runs: nothing new is posted */
    int                     thread_started;
    pthread_t               thread;         /* XFER_PROGRESS_THREAD */
    ucs_list_link_t         hooks;          /* xfer_progress_hook_t registered */
    ucs_list_link_t         endpoints;      /* xfer_endpoint_t, open */
    ucs_list_link_t         closing;        /* xfer_endpoint_t flushing before they close */
    ucs_list_link_t         closed;         /* their close requests, completed next round */
    xfer_progress_hook_t    closing_hook;   /* endpoint.c, while some close */
    ucs_list_link_t         flush_ready;    /* ep_sends.c: endpoints with flushes to hand on */
    xfer_progress_hook_t    flush_hook;     /* ep_sends.c, while flush_ready is not empty */
    ucs_list_link_t         listeners;      /* xfer_listener_t */
    xfer_progress_hook_t    listen_hook;    /* listener.c, while a listener exists */
    unsigned                listen_polls;   /* progress calls since the clock was read */
    int64_t                 listen_pass_ms; /* the listeners' last pass (xfer_now_ms) */
    ucs_list_link_t         rkeys;          /* xfer_rkey_t */
    ucs_list_link_t         mems;           /* xfer_mem_t */
    ucs_list_link_t         requests;       /* every live xfer_request_t */
    ucs_list_link_t         ready;          /* completed requests, delivery due (request.c) */
    unsigned                num_ready;
    ucs_mpool_t             req_mp;         /* where they come from */
    int                     req_mp_ready;
    struct xfer_tensor_table *tensors;
    xfer_tensor_access_cb_t access_cb;      /* tensor_access.c: who may fetch; NULL: all */
    void                    *access_arg;
    xfer_progress_hook_t    tensor_hook;    /* tensor.c, while peers' requests wait */
    struct xfer_staging     *staging;       /* staging.c; NULL until first needed */
    xfer_progress_hook_t    staging_hook;   /* staging.c, while it exists */
    int                     staging_host;   /* xfer_staging_test_host(): host memory staged */
    struct msg_copier       *msg_copiers;   /* staging_msg.c's copy engines, per CUDA context */
    uint64_t                msg_staged;     /* staging_msg.c: messages and tensors staged */
    uint64_t                msg_copies;     /* staging_msg.c: their copies */
    ucs_list_link_t         batch_ops;      /* batch.c: posted batches, for their deadlines */
    int64_t                 batch_deadline; /* the nearest of them; INT64_MAX: none */
    xfer_progress_hook_t    batch_hook;     /* batch.c, while one has a deadline */
    ucs_list_link_t         batches;        /* batch.c: prepared lists */
    xfer_notify_cb_t        notify_cb;      /* notify.c: the handler, or NULL */
    void                    *notify_arg;
    ucs_list_link_t         notify_ready;   /* endpoints with notifications for the handler */
    xfer_progress_hook_t    notify_hook;    /* notify.c, while notify_ready has some */
    struct {                                /* tag_match.c */
        ucs_list_link_t     posted;         /* receives (xfer_request_t), posting order */
        ucs_list_link_t     unexp;          /* messages nobody received yet, arrival order */
        ucs_list_link_t     kept;           /* their large buffers, kept for the next ones */
        uint64_t            kept_bytes;
        int                 paused;         /* a transport paused a peer at the bounds */
        uint64_t            gives_seen;     /* xfer_budget_gives() then */
        xfer_progress_hook_t hook;          /* while paused */
    } tm;
};

typedef enum {
    XFER_REQ_PUT, XFER_REQ_GET, XFER_REQ_SEND, XFER_REQ_RECV, XFER_REQ_FETCH, XFER_REQ_PUBLISH,
    XFER_REQ_FLUSH, XFER_REQ_CLOSE, XFER_REQ_BATCH
} xfer_req_kind_t;

/*
 * What a request's owner - the feature that made it (tag matching, tensors, batches, staging)
 * - does for it, so that requests and progress know no feature: its last work at the end,
 * which may change the outcome (a staged message copied back), how to cancel it, and what to
 * let go of when the request is freed. Any may be NULL; a request without cancel cannot be
 * cancelled (XFER_ERR_UNSUPPORTED). A feature that wraps another's request (staging) keeps
 * the owner's ops and calls them from its own.
 */
typedef struct xfer_req_ops {
    void          (*end)(xfer_request_t *req, xfer_status_t *status_p, size_t *length_p);
    xfer_status_t (*cancel)(xfer_request_t *req, xfer_status_t status);
    void          (*release)(xfer_request_t *req);
} xfer_req_ops_t;

struct xfer_request {
    xfer_comp_t         comp;           /* what the component completes */
    const xfer_req_ops_t *ops;          /* its owner's (NULL: none) */
    xfer_context_t      *ctx;
    ucs_list_link_t     list;           /* ctx->requests */
    ucs_list_link_t     fetch_list;     /* pending fetches, for abort */
    ucs_list_link_t     ready_link;     /* ctx->ready */
    xfer_req_kind_t     kind;
    xfer_fw_iface_t     *fw_iface;      /* where it was posted; NULL for publish */
    xfer_status_t       status;         /* XFER_INPROGRESS until its completion is delivered */
    xfer_status_t       result;         /* the outcome, from completion until delivery */
    int                 queued;         /* on ctx->ready */
    size_t              length;
    uint64_t            tag;
    xfer_request_cb_t   cb;
    void                *user_data;
    struct xfer_mem     *mem;           /* held busy until completion */
    struct xfer_msg_stage *stage;       /* a message or tensor staged whole (staging_msg.c) */
    int                 released;       /* free on completion */
    int                 in_callback;
    struct xfer_batch_op *batch_op;     /* a batch's transport side, until it ends */
    size_t              landed;         /* a batch: descriptors known landed */
    /* from here on not cleared by xfer_request_new (but for a fetch): each kind sets what it
     * reads */
    uint64_t            step;           /* fetch */
    xfer_tensor_alloc_cb_t alloc;
    void                *alloc_arg;
    xfer_tensor_t       tensor;         /* fetch result */
    /* a tag receive (tag_match.c): every field set by xfer_tm_post */
    ucs_list_link_t     recv_list;      /* ctx->tm.posted */
    struct xfer_endpoint *recv_ep;      /* the filter (NULL: any peer), then the message's */
    uint64_t            recv_tag, recv_mask;
    void                *recv_buf;
    size_t              recv_cap;
    struct xfer_mem     *recv_mem;      /* the registration the transports are given */
    int                 recv_busy;      /* a message is arriving into it */
    uint64_t            msg_tag, msg_len;
    /* a send the transport has not finished, or a flush waiting for such sends (ep_sends.c) */
    ucs_list_link_t     ord_link;       /* ord_ep->sends or ->send_flushes; a close request:
                                         * ctx->closed (endpoint.c) */
    struct xfer_endpoint *ord_ep;       /* NULL when on neither */
    uint64_t            ord_seq;        /* a send's number; a flush's: the last send before it */
};

struct xfer_endpoint {
    xfer_context_t      *ctx;
    ucs_list_link_t     list;           /* ctx->endpoints, or ctx->closing */
    xfer_fw_iface_t     *fw_iface;
    xfer_ep_h           ep;
    uint64_t            peer_id;        /* the peer context's id */
    xfer_status_t       status;
    char                transport[XFER_NAME_MAX];
    char                peer[80];
    /* closing: the user's handle is gone, the transport flushes (endpoint.c) */
    int                 closing;
    xfer_request_t      *close_req;
    int64_t             close_deadline; /* xfer_now_ms() */
    xfer_comp_t         flush_comp;
    int                 flush_done;
    xfer_status_t       flush_status;
    int                 flush_deferred; /* closing: the flush waits for staged_ops to end */
    int                 shutting_down;  /* closing: the step under way is ep_shutdown */
    int                 destroying;     /* its transport's endpoint goes: nothing more posts */
    unsigned            staged_ops;     /* staging.c operations still using it */
    unsigned            batch_ops;      /* batch.c: batches posted on it, not ended */
    ucs_list_link_t     sends;          /* ep_sends.c: sends not finished, in posting order */
    ucs_list_link_t     send_flushes;   /* ep_sends.c: flushes waiting for them */
    uint64_t            send_seq;       /* ep_sends.c: sends posted */
    xfer_status_t       send_failed;    /* ep_sends.c: the first failure of a tracked send */
    ucs_list_link_t     flush_link;     /* ctx->flush_ready */
    int                 flush_listed;
    ucs_list_link_t     batches;        /* batch.c: the lists prepared for it */
    ucs_list_link_t     notify_late;    /* batch.c: posted batches whose notification leaves
                                         * later than their post, in posting order */
    ucs_list_link_t     notifies;       /* notify.c: notifications not taken yet, oldest first */
    size_t              num_notifies;
    ucs_list_link_t     notify_link;    /* ctx->notify_ready */
    int                 notify_listed;
    uint64_t            budget_used[XFER_BUDGET_KINDS];    /* budget.c */
    uint64_t            unexp_bytes;    /* tag_match.c: what its kept messages count */
    uint32_t            tensor_waiting; /* this peer's requests parked in the tensor table */
    ucs_list_link_t     tensor_answers; /* tensor.c: publications its transport holds */
};

struct xfer_mem {
    xfer_context_t      *ctx;
    ucs_list_link_t     list;
    void                *addr;
    size_t              length;
    xfer_mem_attr_t     attr;           /* what the memory was found to be (mem_type.c) */
    unsigned            busy;           /* outstanding operations using it */
    int                 staged;         /* NULL memh = moved through staging.c there */
    xfer_memh_h         *memh;          /* per ctx->ifaces[i] */
    int                 fd;             /* memfd holding it from offset 0 (memory.c), or -1 */
    size_t              alloc_length;   /* xfer_mem_alloc: mapped bytes to unmap; else 0 */
};

struct xfer_rkey {
    xfer_context_t      *ctx;
    ucs_list_link_t     list;           /* ctx->rkeys */
    xfer_fw_iface_t     *fw_iface;
    xfer_rkey_h         rkey;
    uint64_t            owner_id;
    uint64_t            addr;
    uint64_t            length;
    unsigned            busy;           /* staged operations still using it */
    int                 destroyed;      /* xfer_rkey_destroy came while busy */
};

/* Required of a transport before it is offered to a peer. */
#define XFER_OFFER_CAPS (XFER_CAP_TAG | XFER_CAP_MEM_HOST)

/* progress.c: the context lock, progress and sleeping */
/* The context lock is re-entrant - callbacks run with it held and may call the API - but
 * built from a plain mutex and an owner: a recursive pthread mutex costs about three times as
 * much per lock and unlock, and every call takes it. Only the owner ever stores its own id in
 * lock_owner, so a thread that reads its own id there holds the lock. A serialized context
 * (XFER_CONTEXT_FLAG_SERIALIZED) has no lock: its one thread at a time is the application's
 * promise, and nothing in the library starts a thread for it. */
static inline void xfer_ctx_lock(xfer_context_t *ctx)
{
    pthread_t self;

    if (ctx->serialized) {
        return;
    }
    self = pthread_self();
    if (__atomic_load_n(&ctx->lock_owner, __ATOMIC_RELAXED) == self) {
        ctx->lock_depth++;
        return;
    }
    pthread_mutex_lock(&ctx->lock);
    __atomic_store_n(&ctx->lock_owner, self, __ATOMIC_RELAXED);
    ctx->lock_depth = 1;
}

static inline void xfer_ctx_unlock(xfer_context_t *ctx)
{
    if (ctx->serialized) {
        return;
    }
    if (--ctx->lock_depth == 0) {
        __atomic_store_n(&ctx->lock_owner, (pthread_t)0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ctx->lock);
    }
}

/* pthread_cond_*wait on ctx->cond with the lock held once: the owner goes while it waits. */
void xfer_ctx_cond_wait(xfer_context_t *ctx, const struct timespec *deadline);
xfer_status_t xfer_ctx_data_init(xfer_context_t *ctx, int open_ifaces);
xfer_status_t xfer_ctx_thread_start(xfer_context_t *ctx);
void xfer_ctx_data_cleanup(xfer_context_t *ctx);
unsigned xfer_progress_locked(xfer_context_t *ctx);
/* The transports' progress alone: what they complete waits in ctx->ready for the next
 * progress, no callback runs. xfer_accept() calls it, so that a server that accepts a burst
 * of peers still drains its transports' own listening sockets (tcp's lane port). */
unsigned xfer_progress_transports_locked(xfer_context_t *ctx);
/* The transports' event fds to sleep on, armed, into fds (at most max): how many, or -1 when
 * one has work now (do not sleep). */
int xfer_transports_wait_fds(xfer_context_t *ctx, struct pollfd *fds, unsigned max);
/* Sleep on the transports' fds (or on cond while another thread does) up to timeout_ms. */
void xfer_sleep_locked(xfer_context_t *ctx, int timeout_ms);
/* Tell a thread sleeping in poll that there is work (a posted op, a completion). */
void xfer_wake_locked(xfer_context_t *ctx);
/* Per-thread flags read by every call (xfer_api_check). Initial-exec: a load at a fixed
 * offset from the thread pointer instead of a call to __tls_get_addr, which cost more than
 * the check; the 8 bytes come from the static TLS that glibc keeps for libraries loaded
 * later, so dlopen (Python's cffi) still works. */
#define XFER_TLS __thread __attribute__((tls_model("initial-exec")))
extern XFER_TLS int xfer_in_callback;
/* Inside a callback that runs in the middle of what it could change, and may only answer:
 * a fetch's allocation callback, which a transport calls in its receive path (the size is
 * known only there), and the producer's access callback (tensor_access.c), which the tensor
 * engine asks while it walks its waiting requests. What it is, for the log. */
extern XFER_TLS const char *xfer_in_engine_cb;

/* Calls refuse to run inside such a callback (they could change what the transport or the
 * engine is walking: close the asking endpoint, publish into the slot), and posting calls refuse while the context is destroyed
 * (from the callbacks that destroy runs). XFER_OK, or the error after a log line naming fn.
 * Takes the lock's view of ctx: call it with the lock held. */
xfer_status_t xfer_api_refuse(const xfer_context_t *ctx, const char *fn, int posting);
static inline xfer_status_t xfer_api_check(const xfer_context_t *ctx, const char *fn,
                                           int posting)
{
    if (__builtin_expect((xfer_in_engine_cb != NULL) || (posting && ctx->destroying), 0)) {
        return xfer_api_refuse(ctx, fn, posting);
    }
    return XFER_OK;
}

/* progress.c: register hook (its functions given here) while its feature has work; again
 * is nothing. */
void xfer_progress_hook_add(xfer_context_t *ctx, xfer_progress_hook_t *hook,
                            unsigned (*progress)(xfer_context_t *ctx),
                            int (*timeout)(xfer_context_t *ctx), int (*busy)(xfer_context_t *ctx));
void xfer_progress_hook_del(xfer_context_t *ctx, xfer_progress_hook_t *hook);

/* ep_sends.c: a flush covers the sends posted before it. init: at the endpoint's creation;
 * track: a send the transport did not finish while posting it (its request gets the ops that
 * untrack it when it ends); flush_post: hand req to the transport now or once every send
 * before it ended (XFER_INPROGRESS), or its status; gone: the endpoint goes, its waiting
 * flushes complete XFER_ERR_CANCELED and its sends are no longer tracked. */
void xfer_ep_sends_init(xfer_endpoint_t *ep);
void xfer_ep_send_track(xfer_endpoint_t *ep, xfer_request_t *req);
void xfer_ep_send_untrack(xfer_request_t *req);
int xfer_ep_sends_pending(xfer_endpoint_t *ep);
/* The transport's flush of ep with comp, or the status of a send that failed before it. */
xfer_status_t xfer_ep_flush_start(xfer_endpoint_t *ep, xfer_comp_t *comp);
xfer_status_t xfer_ep_flush_post(xfer_endpoint_t *ep, xfer_request_t *req);
/* ep goes: its sends are no longer tracked (before the transport cancels them), then the
 * flushes that waited for them are cancelled - after the sends, which they cover. */
void xfer_ep_sends_gone(xfer_endpoint_t *ep);
void xfer_ep_send_flushes_gone(xfer_endpoint_t *ep);

/* request.c; ops: its owner's (NULL: none) */
xfer_request_t *xfer_request_new(xfer_context_t *ctx, xfer_req_kind_t kind,
                                 xfer_fw_iface_t *fw_iface, const xfer_req_ops_t *ops,
                                 xfer_request_cb_t cb, void *user_data);
/* A posted request: hand it to the caller or mark it self-releasing. */
void xfer_request_posted(xfer_request_t *req, xfer_request_t **req_p);
/* The component finished the operation while posting it (XFER_OK): the request is complete
 * now, or - when it has a callback - at the next progress, which runs the callback. */
void xfer_request_posted_done(xfer_request_t *req, size_t length, xfer_request_t **req_p);
/* Deliver the completions queued on ctx->ready (outcome, callback, wake-up, free); how many.
 * Called only where no transport is in the middle of its own work. */
unsigned xfer_requests_dispatch(xfer_context_t *ctx);
/* Undo xfer_request_new when posting failed. */
void xfer_request_discard(xfer_request_t *req);
/* Record a request's outcome and queue it for xfer_requests_dispatch(): safe from anywhere,
 * a transport's progress or teardown included, since no user code runs here. */
void xfer_request_complete(xfer_request_t *req, xfer_status_t status, size_t length,
                           uint64_t tag);
void xfer_requests_free_all(xfer_context_t *ctx);
xfer_status_t xfer_request_pool_init(xfer_context_t *ctx);
void xfer_request_pool_cleanup(xfer_context_t *ctx);

/* listener.c */
/* Close every listener of ctx and the handshakes in progress on them. */
void xfer_listeners_close_all(xfer_context_t *ctx);

/* endpoint.c */
/* An endpoint is made around the bootstrap's CONNECT exchange, in steps that never block, so
 * that the listener can interleave many handshakes: prepare creates the transport's endpoint
 * on the bootstrap socket and fills this side's CONNECT (mine); complete takes the peer's
 * CONNECT, connects the transport's endpoint and lists it in the context; discard undoes a
 * prepared endpoint whose handshake failed. */
struct xfer_wire_connect;
xfer_status_t xfer_endpoint_prepare(xfer_context_t *ctx, int fd, const uint8_t *secret,
                                    const char *transport,
                                    const void *peer_addr, size_t peer_addr_len, int is_server,
                                    const char *peer, struct xfer_wire_connect *mine,
                                    xfer_endpoint_t **ep_p, char *why, size_t why_size);
xfer_status_t xfer_endpoint_complete(xfer_endpoint_t *ep,
                                     const struct xfer_wire_connect *theirs, char *why,
                                     size_t why_size);
void xfer_endpoint_discard(xfer_endpoint_t *ep);
/* Destroy: every endpoint closes as xfer_endpoint_close() does (flushing, bounded by
 * XFER_CLOSE_TIMEOUT), progressing until all are gone. */
void xfer_endpoints_close_all(xfer_context_t *ctx);
/* Milliseconds until the nearest close deadline (a sleep must not pass it); -1: none. */
int xfer_endpoints_closing_timeout(xfer_context_t *ctx);
xfer_fw_iface_t *xfer_fw_iface_find(xfer_context_t *ctx, const char *name);
/* Whether this side's iface of transport reaches the peer whose iface address for it is
 * peer_addr (the component's iface_reachable; 1 when it has none or the transport is not
 * open): 1, or 0 with why filled. Takes the context lock. */
int xfer_endpoint_reachable(xfer_context_t *ctx, const char *transport, const void *peer_addr,
                            size_t peer_addr_len, char *why, size_t why_size);
xfer_status_t xfer_endpoint_fetch_post(xfer_endpoint_t *ep, xfer_request_t *req,
                                       const xfer_fetch_args_t *args);

/* memory.c */
void xfer_mems_release_all(xfer_context_t *ctx);
void xfer_rkeys_release_all(xfer_context_t *ctx);
/* The staging pool's registration: host memory, with every open transport, outside
 * ctx->mems (the user neither sees nor deregisters it). */
xfer_status_t xfer_mem_register_internal(xfer_context_t *ctx, void *addr, size_t length,
                                         xfer_mem_t **mem_p);
void xfer_mem_deregister_internal(xfer_mem_t *mem);
/* A staged operation is done with rkey: free it when xfer_rkey_destroy came meanwhile. */
void xfer_rkey_put(xfer_rkey_t *rkey);
/* Is [buf, buf + length) inside mem? */
int xfer_mem_covers(const xfer_mem_t *mem, const void *buf, size_t length);

/* tag_match.c: the receives and the messages nobody received yet, for every transport */
void xfer_tm_init(xfer_context_t *ctx);
void xfer_tm_cleanup(xfer_context_t *ctx);
/* Post req, a receive (for ep, or any peer when ep is NULL): matched now against what
 * arrived, or queued. XFER_INPROGRESS, or ep's status when it ended and nothing it sent
 * before matches. */
xfer_status_t xfer_tm_post(xfer_context_t *ctx, xfer_endpoint_t *ep, xfer_request_t *req,
                           uint64_t tag, uint64_t mask, void *buf, size_t length,
                           xfer_mem_t *mem);
/* Cancel a posted receive: XFER_OK (it completes with status), XFER_ERR_BUSY (a message is
 * arriving into it). */
xfer_status_t xfer_tm_cancel(xfer_request_t *req, xfer_status_t status);
/* A receive's ops (xfer_req_ops_t): the matcher cancels it. */
extern const xfer_req_ops_t xfer_tm_recv_ops;
/* ep failed or its peer closed: the receives for it alone complete with status. */
void xfer_tm_ep_failed(xfer_endpoint_t *ep, xfer_status_t status);
/* ep goes: its receives complete cancelled, its messages nobody received go. */
void xfer_tm_ep_gone(xfer_endpoint_t *ep);
/* Peers paused at the process's budget try again when it moved; how many events. */
unsigned xfer_tm_progress(xfer_context_t *ctx);

/* tensor.c */
xfer_status_t xfer_tensor_table_create(xfer_context_t *ctx);
void xfer_tensor_table_destroy(xfer_context_t *ctx);
void xfer_tensor_upcall_request(void *fw_arg, void *fw_ep, uint64_t step, const char *key,
                                size_t key_len, xfer_tensor_waiter_t *waiter);
void xfer_tensor_upcall_withdraw(void *fw_arg, xfer_tensor_waiter_t *waiter);
void xfer_tensor_upcall_release(void *fw_arg, void *handle, xfer_status_t status);
/* ep's transport endpoint went: the publications it held are no longer counted on ep. */
void xfer_tensor_ep_gone(xfer_endpoint_t *ep);
/* Fetch-side bookkeeping: is the step aborted here (returns the status or XFER_OK)? */
xfer_status_t xfer_tensor_step_status(xfer_context_t *ctx, uint64_t step);
/* Run the fetch's allocation callback (req->alloc) as the API allows it to run. */
void *xfer_tensor_fetch_alloc(xfer_request_t *req, const xfer_tensor_t *meta);
xfer_status_t xfer_tensor_key_check(const xfer_context_t *ctx, const char *key,
                                    size_t *key_len_p);
/* Answer the peers' requests that waited XFER_TENSOR_REQUEST_TIMEOUT with XFER_ERR_TIMEOUT;
 * how many. Called from progress, after the transports. */
unsigned xfer_tensor_expire(xfer_context_t *ctx);
/* Milliseconds until the oldest waiting request expires (a sleep must not pass it); -1:
 * none waits. */
int xfer_tensor_expiry_timeout(xfer_context_t *ctx);

/* endpoint.c, for the other files that post on an endpoint: lock the context and check that
 * ep can take an operation (fn != NULL: the transport implements it). On an error the lock
 * is released and the cause logged. */
xfer_status_t xfer_endpoint_op_begin(xfer_endpoint_t *ep, const char *op, void *fn);
/* The same; with peer_closed_ok an endpoint whose peer closed in order is let through. */
xfer_status_t xfer_endpoint_op_begin_closed(xfer_endpoint_t *ep, const char *op, void *fn,
                                            int peer_closed_ok);

/* batch.c */
void xfer_batch_ctx_init(xfer_context_t *ctx);
/* Complete the batches past their deadline; how many. Called from progress. */
unsigned xfer_batch_expire(xfer_context_t *ctx);
/* Milliseconds to the nearest batch deadline (0: one is due), -1: none. */
int xfer_batch_timeout(xfer_context_t *ctx);
/* The endpoint is closing: its prepared lists can no longer be posted. */
/* ep's transport endpoint went: batches whose notification waited for its turn end. */
void xfer_batch_ep_gone(xfer_endpoint_t *ep);
void xfer_batch_ep_closing(xfer_endpoint_t *ep);
/* Cancel a batch request (xfer_request_cancel). */
xfer_status_t xfer_batch_cancel(xfer_request_t *req, xfer_status_t status);
/* Context destroy, after every endpoint is gone: free what is left. */
void xfer_batch_ctx_cleanup(xfer_context_t *ctx);

/* notify.c */
int xfer_notify_upcall(void *fw_arg, void *fw_ep, const void *msg, size_t length);
/* Hand queued notifications to the context's handler; how many. Called from progress. */
unsigned xfer_notify_dispatch(xfer_context_t *ctx);
/* The endpoint goes: drop what it still queues. */
void xfer_notify_ep_cleanup(xfer_endpoint_t *ep);

/* budget.c */
/* The limits, from the context being created (the process's: the last context's word). */
void xfer_budget_configure(const xfer_fw_config_t *cfg);
/* The endpoint goes: what it still holds is given back (logged: it should be none). */
void xfer_budget_ep_release(xfer_endpoint_t *ep);

/* log.c */
void xfer_log_set_level(xfer_log_level_t level);
xfer_status_t xfer_log_level_parse(const char *str, xfer_log_level_t *level_p);
extern const char *const xfer_log_level_names[];

/* util.c */
size_t xfer_edit_distance(const char *a, const char *b);
const char *xfer_closest_name(const char *word, const char *const *names, size_t num);
char *xfer_strtrim(char *s);
void xfer_str_upper(char *dst, const char *src, size_t size);
char *xfer_strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* param.c */
xfer_status_t xfer_param_set_init(xfer_param_set_t *set, const char *component,
                                  const xfer_param_desc_t *descs, size_t config_size,
                                  char **env_errors_p, char *why, size_t why_size);
void xfer_param_set_cleanup(xfer_param_set_t *set);
const char *xfer_param_type_name(xfer_param_type_t type);

/* loader.c */
xfer_status_t xfer_loader_load(xfer_context_t *ctx);
void xfer_loader_unload(xfer_context_t *ctx);
xfer_component_entry_t *xfer_loader_find(const xfer_context_t *ctx, const char *name);

/* select.c */
xfer_status_t xfer_transport_spec_parse(const char *str, xfer_transport_spec_t *spec,
                                        char *err, size_t err_size);
void xfer_transport_spec_cleanup(xfer_transport_spec_t *spec);
xfer_status_t xfer_transport_spec_check(const xfer_context_t *ctx, char **errors_p);

/* Append a formatted line to a malloc'd error text (*text_p may be NULL). */
void xfer_errors_append(char **text_p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* log.c: the per-cause counts of xfer_log_peer(), as counters (up to max filled); returns
 * how many there are. */
size_t xfer_log_peer_counters(xfer_counter_t *counters, size_t max);

/* tensor_access.c: whether the producer lets ep's request of (step, key) have the tensor;
 * under the context lock. */
int xfer_tensor_access_allows(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t step,
                              const char *key, size_t key_len);

/* counters.c: XFER_STATS=y - ep's counters to stderr, one line each, before it goes. */
void xfer_endpoint_stats_print(xfer_endpoint_t *ep);

/* tensor_meta.c: a tensor the caller publishes is well formed (dtype, rank, dims, size,
 * data): XFER_OK, or the refusal, logged at INFO. */
xfer_status_t xfer_tensor_check(const xfer_tensor_t *tensor);

#endif /* XFER_INT_H */
