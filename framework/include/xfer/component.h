/*
 * xfer plug-in ABI: what a transport component exports and what it may call.
 *
 * A component is a shared object (xfer_<name>.so) that exports exactly one data symbol,
 * XFER_COMPONENT_SYMBOL_V1 ("xfer_component_v1"), of type xfer_component_v1_t. The symbol's
 * name carries the ABI version (NCCL's rule): once a version is released its struct is never
 * edited; a change makes xfer_component_v2_t and a new symbol, and the loader probes the
 * newest version it knows first. The struct starts with the ABI version and its own size, so
 * the loader can reject a mismatched build with a precise reason instead of crashing.
 *
 * Only this header (and xfer.h, for status codes) is visible to components. Components link
 * against libxfer.so for the logging and parameter services declared at the end.
 *
 * Status: ABI v1 is frozen from the first release (1.0). Until then it may still change.
 */
#ifndef XFER_COMPONENT_H
#define XFER_COMPONENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>

#include <xfer/xfer.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XFER_COMPONENT_ABI_V1     1u
#define XFER_COMPONENT_SYMBOL_V1  "xfer_component_v1"
/* The range of ABI versions this library knows, for the loader's too-old/too-new checks. */
#define XFER_COMPONENT_ABI_OLDEST 1u
#define XFER_COMPONENT_ABI_NEWEST 1u

/* Mark the single exported symbol; everything else in a component stays hidden. */
#define XFER_COMPONENT_EXPORT __attribute__((visibility("default")))

/* The head of a component's table (xfer_component_v1_t below): its ABI and size, name,
 * version (the component's build's PACKAGE_VERSION), description, parameter table and the
 * type its parameters are parsed into. */
#define XFER_COMPONENT_V1_HEAD(_name, _description, _params, _config_type) \
    .abi_version = XFER_COMPONENT_ABI_V1, \
    .size        = sizeof(xfer_component_v1_t), \
    .name        = (_name), \
    .version     = PACKAGE_VERSION, \
    .description = (_description), \
    .params      = (_params), \
    .config_size = sizeof(_config_type)

#define XFER_NAME_MAX        32   /* component and parameter names */
#define XFER_REASON_MAX     256   /* one-line human-readable reasons */
#define XFER_DEVICE_MAX      32   /* devices reported by one query */
#define XFER_DEVICE_ATTR_MAX 24   /* key/value attributes per device */

/* The lowest xfer_status_t: a status off the wire below it (or above XFER_OK) is not one. */
#define XFER_ERR_LOWEST XFER_ERR_PEER_CLOSED

/* ---- capabilities --------------------------------------------------------------------------- */

/* What a component really does. A bit is set only when the operation is implemented. */
enum {
    XFER_CAP_PUT        = 1u << 0,  /* one-sided write into registered remote memory */
    XFER_CAP_GET        = 1u << 1,  /* one-sided read from registered remote memory */
    XFER_CAP_TAG        = 1u << 2,  /* tagged send/receive with tag+mask matching */
    XFER_CAP_TENSOR     = 1u << 3,  /* receiver-driven tensor fetch by key */
    XFER_CAP_MEM_HOST   = 1u << 4,  /* moves host (CPU) memory */
    XFER_CAP_MEM_CUDA   = 1u << 5,  /* moves CUDA device memory */
    XFER_CAP_INTER_HOST = 1u << 6,  /* reaches peers on other hosts */
    /* Registers CUDA memory for put, get and batches: a peer's remote key reaches it, and a
     * local registration of it is handed to put, get and batch (a put or get the transport
     * cannot do with it is declined with XFER_ERR_UNSUPPORTED before anything moved, and the
     * framework stages it). Tagged messages and tensors of it are staged as without
     * XFER_CAP_MEM_CUDA. */
    XFER_CAP_RMA_CUDA   = 1u << 7,
};
#define XFER_CAP_ALL ((uint64_t)0xff)

/* ---- parameters ----------------------------------------------------------------------------- */

typedef enum {
    XFER_PARAM_INT,     /* int64_t; min/max apply */
    XFER_PARAM_UINT,    /* uint64_t; min/max apply */
    XFER_PARAM_SIZE,    /* uint64_t bytes; accepts 4096, 64k, 1m, 2g, inf; min/max apply */
    XFER_PARAM_TIME,    /* double seconds; accepts 10s, 500ms, 20us, 1.5 (seconds) */
    XFER_PARAM_BOOL,    /* int 0/1; accepts y/yes/1 and n/no/0 (as UCX parses them) */
    XFER_PARAM_STRING,  /* const char *, owned by the framework for the config's lifetime */
    XFER_PARAM_ENUM,    /* int index into enum_values */
} xfer_param_type_t;

/*
 * One entry of a component's parameter table. The environment variable is
 * XFER_<COMPONENT>_<name> (component name upper-cased). The parsed value is stored at
 * 'offset' in the component's config struct (of config_size bytes), which the framework
 * allocates, fills, and passes to query() and iface_open(). The table ends with name == NULL.
 */
typedef struct xfer_param_desc {
    const char              *name;          /* upper case, e.g. "EAGER_THRESHOLD" */
    xfer_param_type_t       type;
    const char              *default_value; /* parsed like a user value */
    const char              *help;
    size_t                  offset;         /* into the component's config struct */
    double                  min, max;       /* numeric range; ignored when min == max */
    const char *const       *enum_values;   /* NULL-terminated, for XFER_PARAM_ENUM */
} xfer_param_desc_t;

/* ---- query ---------------------------------------------------------------------------------- */

typedef struct xfer_device_attr {
    char     name[XFER_NAME_MAX * 2];       /* "eth0", "rxe0:1" */
    char     kind[16];                      /* "net", "rdma", "gpu" */
    int      numa_node;                     /* -1 when unknown */
    uint32_t num_attrs;
    struct {
        char key[32];
        char value[160];
    } attrs[XFER_DEVICE_ATTR_MAX];          /* "state"="ACTIVE", "mtu"="1024", "gid[1]"=... */
} xfer_device_attr_t;

typedef struct xfer_component_limits {
    uint64_t max_msg_size;      /* largest tag message or put/get; 0 = not applicable */
    uint64_t max_eager_size;    /* messages up to this go eagerly */
    uint32_t max_key_len;       /* tensor keys; 0 = not applicable */
} xfer_component_limits_t;

typedef struct xfer_component_attr {
    int                     available;              /* 1 = usable on this host now */
    char                    reason[XFER_REASON_MAX];/* why not, when !available */
    uint64_t                caps;                   /* XFER_CAP_* actually implemented */
    xfer_component_limits_t limits;
    double                  latency_us;             /* estimate for ranking: small message */
    double                  bandwidth_mbs;          /* estimate for ranking: MB/s (10^6) */
    uint32_t                num_devices;
    xfer_device_attr_t      devices[XFER_DEVICE_MAX];
} xfer_component_attr_t;

/* ---- data path (opaque handles owned by the component) -------------------------------------- */

/*
 * Threading: the framework serialises every call into a component (and every callback a
 * component makes into the framework happens inside one of those calls), so a component needs
 * no locks of its own. Completions are reported from progress(), cancel() or ep_destroy() -
 * never from inside the call that posted the operation. The framework only records them: the
 * user's callbacks run after the component's call has returned, so a component is never
 * re-entered by a callback in the middle of its own work.
 */
typedef struct xfer_iface *xfer_iface_h;   /* one opened instance of the transport */
typedef struct xfer_ep    *xfer_ep_h;      /* a connection to one peer */
typedef struct xfer_memh  *xfer_memh_h;    /* local registered memory */
typedef struct xfer_rkey  *xfer_rkey_h;    /* unpacked remote key */

/* Completion of a non-blocking operation: called from progress() exactly once. length is the
 * bytes moved (for XFER_ERR_TRUNCATED: the full message length); tag is the sender's tag for
 * tag receives and 0 otherwise. priv is the component's, for the operations cancel() takes (a
 * fetch, a batch): NULL when the framework posts one; the component may point it at what
 * stands for the operation (xfer_comp_hook, engine.h), so that cancel() finds the operation
 * at once, however many endpoints and operations the iface has. It is NULL again once the
 * operation completes. */
typedef struct xfer_comp {
    void (*cb)(struct xfer_comp *self, xfer_status_t status, size_t length, uint64_t tag);
    void *priv;
} xfer_comp_t;

/*
 * Producer side of a tensor fetch. When a peer asks for (step, key), the component hands the
 * framework a waiter; the framework calls ready() exactly once - maybe before tensor_request()
 * returns - with the published tensor (XFER_OK) or an error (the step was aborted, ...). After
 * ready(XFER_OK) the tensor's data stays valid until the component calls tensor_release() with
 * the handle it got, and the status of the send. A component that no longer wants a waiter
 * whose ready() has not been called (the consumer cancelled, the endpoint closed) calls
 * tensor_withdraw().
 */
typedef struct xfer_tensor_waiter {
    void (*ready)(struct xfer_tensor_waiter *self, xfer_status_t status,
                  const xfer_tensor_t *tensor, void *handle);
} xfer_tensor_waiter_t;

/* One descriptor of a batch, in absolute addresses: the framework has checked that every
 * local range lies in the batch's memh and every remote range in its rkey's packed bounds. */
typedef struct xfer_batch_iov {
    uint64_t local;
    uint64_t remote;
    uint64_t length;
} xfer_batch_iov_t;

/* A batch as the component sees it (xfer_batch_post). iov and notify (the framework's copy)
 * stay valid and unchanged until comp completes. */
typedef struct xfer_batch_args {
    uint32_t               size;        /* sizeof(xfer_batch_args_t) of the caller's build */
    int                    is_put;
    const xfer_batch_iov_t *iov;
    size_t                 count;       /* 0: a notification alone, behind what went */
    xfer_memh_h            memh;        /* NULL when count is 0 */
    xfer_rkey_h            rkey;
    const void             *notify;     /* NULL: no notification */
    size_t                 notify_len;  /* <= the iface's max_notify_len */
    /* The component raises it as descriptors are known to have landed (in the peer's memory
     * for a put, ours for a get); the framework reads it when the batch ends early. */
    size_t                 landed;
    /* The batch's deadline on CLOCK_MONOTONIC in nanoseconds, 0 for none. A target that moves
     * the data itself stops at it and reports XFER_ERR_TIMEOUT with no notification, so that
     * it does not work for a batch that ended. Read only when size covers it. */
    uint64_t               deadline_ns;
} xfer_batch_args_t;

/* What the framework hands a component when it opens an interface. */
typedef struct xfer_iface_params {
    uint32_t size;                  /* sizeof(xfer_iface_params_t) of the caller's build */
    void     *fw_arg;               /* opaque; passed back to the callbacks below */
    uint32_t max_key_len;           /* longest tensor key accepted, in bytes */
    /* A peer (fw_ep: the framework's endpoint of it) asks for (step, key). The framework
     * bounds how many of one peer's requests wait for a publish (XFER_TENSOR_MAX_REQUESTS)
     * and of all peers' (XFER_TENSOR_BUDGET): one past them is answered at once with
     * XFER_ERR_NO_RESOURCE through ready(). */
    void (*tensor_request)(void *fw_arg, void *fw_ep, uint64_t step, const char *key,
                           size_t key_len, xfer_tensor_waiter_t *waiter);
    void (*tensor_withdraw)(void *fw_arg, xfer_tensor_waiter_t *waiter);
    void (*tensor_release)(void *fw_arg, void *handle, xfer_status_t status);
    /* An endpoint failed (peer gone, protocol error) or its peer closed in order
     * (XFER_ERR_PEER_CLOSED, see ep_shutdown): its pending operations have been or are being
     * completed with status; reason says what happened. */
    void (*ep_failed)(void *fw_arg, void *fw_ep, xfer_status_t status, const char *reason);
    /* Requests from one peer (endpoint) that may be pending here - waiting in
     * tensor_request() or being answered; the component answers one past it at once with
     * XFER_ERR_NO_RESOURCE and a reason. Present when size covers it. */
    uint32_t max_tensor_requests;
    /* A peer's batch notification: every byte of its batch is visible here (or was read from
     * here). Delivered in the order the peer posted them. msg is valid during the call. 0:
     * taken; -1: refused (the endpoint's queue is full; the framework logged why): the
     * component fails the endpoint with XFER_ERR_NO_RESOURCE. Present when size covers it. */
    int  (*notify)(void *fw_arg, void *fw_ep, const void *msg, size_t length);
    /* Longest notification; a longer one from a peer is a protocol error. */
    uint32_t max_notify_len;
    /* Most bytes one peer's operation moves in one progress() (XFER_FAIR_SLICE): a larger
     * one goes on in the next calls, in turn with the other endpoints. Present when size
     * covers it (else take 4 MiB). */
    uint64_t fair_slice;
    /* 1: the context has a key (XFER_AUTH_KEY_FILE), so every endpoint is authenticated and
     * gets a secret (xfer_ep_params_t.secret). Present when size covers it. */
    uint32_t authenticated;
} xfer_iface_params_t;

/* iface_open's first step (framework/comp_base.c): check its arguments (config, params
 * carrying what every framework sends, and iface_p) and allocate size zeroed bytes, with
 * config's pointer at cfg_offset and params copied at params_offset in them - what a
 * framework built with a shorter xfer_iface_params_t lacks stays 0, and params->size says
 * so. XFER_ERR_INVALID_PARAM, XFER_ERR_NO_MEMORY. */
XFER_API xfer_status_t xfer_iface_alloc(const void *config, const xfer_iface_params_t *params,
                                        const void *iface_p, size_t size, size_t cfg_offset,
                                        size_t params_offset, void **mem_p);
/* xfer_iface_alloc for the component's struct xfer_iface, whose members cfg and params take
 * them, into iface (a struct xfer_iface pointer). */
#define XFER_IFACE_ALLOC(config_, params_, iface_p_, iface_) \
    xfer_iface_alloc(config_, params_, iface_p_, sizeof(struct xfer_iface), \
                     offsetof(struct xfer_iface, cfg), offsetof(struct xfer_iface, params), \
                     (void**)&(iface_))

/* The fair slice of params (xfer_iface_params_t of params->size bytes). */
#define XFER_IFACE_FAIR_SLICE(_params) \
    ((((_params)->size >= offsetof(xfer_iface_params_t, fair_slice) + sizeof(uint64_t)) && \
      ((_params)->fair_slice > 0)) ? (_params)->fair_slice : (uint64_t)(4u << 20))

/* What the framework hands a component when it creates an endpoint. */
typedef struct xfer_ep_params {
    uint32_t   size;                /* sizeof(xfer_ep_params_t) of the caller's build */
    void       *fw_ep;              /* opaque; passed back to ep_failed */
    const void *peer_iface_addr;    /* the peer's iface_address, from its HELLO */
    size_t     peer_iface_addr_len;
    /* The connected bootstrap socket. The component may dup() it and carry its own traffic
     * on it (tcp does); the framework closes its own descriptor after the handshake and
     * reads nothing more from it once ep_connect() was called. */
    int        sock_fd;
    int        is_server;           /* 1 on the accepting side */
    /* With the bootstrap's authentication (XFER_AUTH_KEY_FILE): XFER_EP_SECRET_LEN bytes both
     * sides of this endpoint, and nobody else, derived from its handshake; a connection the
     * component opens for the endpoint later proves with it that it belongs there
     * (xfer_ep_secret_tag). NULL without a key. Read it only when size covers it. */
    const uint8_t *secret;
} xfer_ep_params_t;

#define XFER_EP_SECRET_LEN 32u

/* A consumer's tensor fetch, as the component sees it. Strings and buffers are the caller's
 * only during the call, except buffer (until completion) and result (until completion). */
typedef struct xfer_fetch_args {
    uint64_t     step;
    const char   *key;
    size_t       key_len;
    void         *buffer;           /* destination, or NULL: call alloc once the size is known */
    size_t       capacity;
    xfer_memh_h  memh;              /* registration covering buffer, or NULL */
    void         *(*alloc)(void *alloc_arg, const xfer_tensor_t *meta);
    void         *alloc_arg;
    xfer_tensor_t *result;          /* the component fills it before completing with XFER_OK */
} xfer_fetch_args_t;

/* ---- memory attributes ---------------------------------------------------------------------- */

/*
 * What a buffer is, as xfer_mem_detect() finds it. CUDA device memory carries the identity of
 * its allocation: a buffer freed and allocated again at the same address gets another
 * buffer_id, so a cache keyed by address must compare it before reusing a registration.
 */
typedef struct xfer_mem_attr {
    xfer_mem_type_t type;           /* XFER_MEM_HOST or XFER_MEM_CUDA, never AUTO */
    int             cuda_device;    /* device ordinal; -1 for host memory */
    void            *cuda_context;  /* CUcontext of the allocation; NULL for host memory */
    uint64_t        cuda_buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID; 0 for host memory */
    uint64_t        alloc_base;     /* CUDA: the allocation holding the range; host: 0 */
    uint64_t        alloc_length;
    char            how[96];        /* how the type was found, for log lines */
} xfer_mem_attr_t;

/* What the framework hands mem_reg_params(). */
typedef struct xfer_mem_reg_params {
    uint32_t              size;     /* sizeof(xfer_mem_reg_params_t) of the caller's build */
    void                  *addr;
    size_t                length;
    const xfer_mem_attr_t *attr;    /* type resolved (never AUTO); valid during the call */
    /* Host memory from xfer_mem_alloc(): a sealed memfd (it can neither shrink nor grow) that
     * holds [addr, addr + length) at fd_offset, open until the registration ends - a same-host
     * peer may map it. -1 for any other memory. Read only when size covers it. */
    int                   fd;
    uint64_t              fd_offset;
} xfer_mem_reg_params_t;

/* Whether params (of size params->size) carries its fd field. */
#define XFER_MEM_REG_PARAMS_HAS_FD(_params) \
    ((_params)->size >= offsetof(xfer_mem_reg_params_t, fd_offset) + sizeof(uint64_t))

/* ---- the component struct, ABI v1 ----------------------------------------------------------- */

/*
 * The framework is the only caller of these operations, and it checks what a user passes
 * before it calls one (xfer.h's calls refuse bad arguments with a status and a log line):
 * handles are the component's own (never NULL, but to ep_destroy, iface_close and
 * rkey_release, which ignore NULL), out-pointers and comp are never NULL, a buffer is NULL
 * only with length 0, mem_reg_params' params has its attr, a batch's args are complete as
 * xfer_batch_args_t says. A component checks again only what the framework cannot know: its
 * own limits, the peer's (a message limit, its key's part), and everything off the wire.
 */
typedef struct xfer_component_v1 {
    uint32_t                abi_version;    /* XFER_COMPONENT_ABI_V1 */
    uint32_t                size;           /* sizeof(xfer_component_v1_t) */
    const char              *name;          /* lower case, [a-z0-9_], < XFER_NAME_MAX */
    const char              *version;       /* the component's own version string */
    const char              *description;   /* one line */

    const xfer_param_desc_t *params;        /* NULL-terminated table, may be NULL */
    size_t                  config_size;    /* bytes of the config struct params point into */

    /* Fill attr truthfully. Return XFER_OK with attr->available = 0 and a reason when the
     * transport cannot work here; return an error only when the query itself failed. */
    xfer_status_t (*query)(const void *config, xfer_component_attr_t *attr);

    /* Open/close one instance; config outlives the iface. */
    xfer_status_t (*iface_open)(const void *config, const xfer_iface_params_t *params,
                                xfer_iface_h *iface_p);
    void          (*iface_close)(xfer_iface_h iface);
    /* Address the peer needs to connect to this iface; *len_p is in/out. */
    xfer_status_t (*iface_address)(xfer_iface_h iface, void *buf, size_t *len_p);

    /* Connecting is two-phase so that transports which need the peer's per-connection
     * address (a QP number) can get it: create, exchange ep_address through the bootstrap,
     * then connect. ep_address may report 0 bytes. */
    xfer_status_t (*ep_create)(xfer_iface_h iface, const xfer_ep_params_t *params,
                               xfer_ep_h *ep_p);
    xfer_status_t (*ep_address)(xfer_ep_h ep, void *buf, size_t *len_p);
    xfer_status_t (*ep_connect)(xfer_ep_h ep, const void *peer_ep_addr, size_t addr_len);
    /* Pending operations on the ep complete with XFER_ERR_CANCELED before this returns. */
    void          (*ep_destroy)(xfer_ep_h ep);

    xfer_status_t (*mem_reg)(xfer_iface_h iface, void *addr, size_t length,
                             xfer_mem_type_t mem_type, xfer_memh_h *memh_p);
    void          (*mem_dereg)(xfer_iface_h iface, xfer_memh_h memh);
    xfer_status_t (*rkey_pack)(xfer_iface_h iface, xfer_memh_h memh, void *buf, size_t *len_p);
    xfer_status_t (*rkey_unpack)(xfer_iface_h iface, const void *buf, size_t len,
                                 xfer_rkey_h *rkey_p);
    void          (*rkey_release)(xfer_iface_h iface, xfer_rkey_h rkey);

    /* The framework has checked that buf lies in memh and remote_addr..+length in the rkey's
     * packed bounds; the component must still check on the target side what came off the
     * wire. put, get and tag_send return XFER_OK when the operation completed while it was
     * posted (all length bytes moved; comp will not be called), XFER_INPROGRESS when comp
     * will be called, or an error (comp will not be called). tensor_fetch returns
     * XFER_INPROGRESS or an error. */
    xfer_status_t (*put)(xfer_ep_h ep, const void *buf, size_t length, xfer_memh_h memh,
                         uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp);
    xfer_status_t (*get)(xfer_ep_h ep, void *buf, size_t length, xfer_memh_h memh,
                         uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp);

    /* memh may be NULL (the buffer is not registered). */
    xfer_status_t (*tag_send)(xfer_ep_h ep, uint64_t tag, const void *buf, size_t length,
                              xfer_memh_h memh, xfer_comp_t *comp);

    xfer_status_t (*tensor_fetch)(xfer_ep_h ep, const xfer_fetch_args_t *args,
                                  xfer_comp_t *comp);

    /* Cancel a pending tensor fetch or a batch: comp completes with status (from the next
     * progress()). XFER_ERR_BUSY when it is too late (data is arriving),
     * XFER_ERR_NOT_FOUND when comp is not pending here. */
    xfer_status_t (*cancel)(xfer_iface_h iface, xfer_comp_t *comp, xfer_status_t status);

    /* Drive completions; returns how many events it processed. */
    unsigned      (*progress)(xfer_iface_h iface);
    /* A file descriptor that becomes readable when progress() has work; -1 if none. */
    int           (*event_fd)(xfer_iface_h iface);
    /* Arm event_fd; XFER_ERR_BUSY means "call progress() first, events are pending". */
    xfer_status_t (*event_arm)(xfer_iface_h iface);

    /* Complete comp once everything posted on ep before this call that this side can finish
     * alone has finished and everything it sent has been acknowledged by the peer's host
     * (its memory, or the transport's receive buffers there): puts and gets complete, sent
     * bytes and messages acknowledged. A send that waits for its receiver to pull it
     * (rendezvous) is not waited for. XFER_OK when nothing is outstanding (comp will not be
     * called), XFER_INPROGRESS, or an error. A failure of ep completes comp with its status,
     * ep_destroy with XFER_ERR_CANCELED. NULL: flushing completes at once. */
    xfer_status_t (*ep_flush)(xfer_ep_h ep, xfer_comp_t *comp);

    /* Register memory with what the framework found out about it (xfer_mem_reg_params_t:
     * its type, and for CUDA memory the device, context, buffer id and allocation). When set,
     * the framework calls it instead of mem_reg; NULL: mem_reg is called. */
    xfer_status_t (*mem_reg_params)(xfer_iface_h iface, const struct xfer_mem_reg_params *params,
                                    xfer_memh_h *memh_p);

    /* Whether an endpoint of this iface to the peer whose iface_address is peer_iface_addr
     * can work: 1 when it can (the peer is on this host, ...), 0 with why filled (one line:
     * "other host (boot id differs)"). The bootstrap asks on both sides before it creates an
     * endpoint: the server skips a transport whose iface says 0 for the client's address and
     * takes the client's next one; the client fails the connect with XFER_ERR_UNREACHABLE
     * when its own iface says 0 for the server's address of the transport chosen. A transport
     * without XFER_CAP_INTER_HOST must set it: offers are ranked without that capability,
     * since which peers a transport reaches is decided here, per peer. NULL: every peer is
     * reachable. The framework reads it only when size covers it (components built before it
     * existed are loaded without it). */
    int           (*iface_reachable)(xfer_iface_h iface, const void *peer_iface_addr,
                                     size_t addr_len, char *why, size_t why_size);

    /* Post a batch (xfer_batch_args_t) as one unit and, with args->notify, a notification
     * that the peer delivers (its iface_params' notify) only once every byte of the batch is
     * visible in its memory, or read from it. comp completes once with the status and
     * length = descriptors landed: XFER_OK when all landed. Returns XFER_INPROGRESS, or
     * XFER_OK when every descriptor landed and the notification (if any) is on its way, in
     * order, before it returns, or an error (comp will not be called in either case).
     * cancel(comp, status) decides the batch once: XFER_OK when its notification has not
     * left and never will - nothing more of it is posted, and comp completes once what is
     * already in flight has ended (maybe much later), or at ep_destroy; XFER_ERR_BUSY when
     * the notification has left: the batch goes on and comp completes with the target's
     * answer (XFER_OK when it delivered the notification). A batch without a notification
     * can always be stopped. A batch of no descriptors carries its notification alone, behind
     * everything sent before: the framework sends one so when a batch's notification must
     * wait for an earlier one's (docs/contract.md, C8). NULL: the framework posts the
     * descriptors one by one through put and get, and refuses notifications. Read only when
     * size covers it. */
    xfer_status_t (*batch)(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp);

    /* An orderly close, after a flush that completed: tell the peer, behind everything
     * already sent, that this endpoint closes in order. The peer's transport handles what
     * came before, then fails its endpoint with XFER_ERR_PEER_CLOSED (ep_failed): its pending
     * operations that needed this side complete with it, what it had received stays
     * receivable. comp completes once the notice is in the peer's host (XFER_OK), or with
     * the endpoint's error; ep_destroy follows. Returns XFER_INPROGRESS, XFER_OK (delivered
     * already; comp is not called) or an error. NULL: the peer sees the connection end
     * (XFER_ERR_CONNECTION), as after a forced close. Read only when size covers it. */
    xfer_status_t (*ep_shutdown)(xfer_ep_h ep, xfer_comp_t *comp);

    /* Tag matching is the framework's (xfer_tag_arrive): a component with XFER_CAP_TAG
     * offers tag_send and these. Read only when size covers them. */

    /* Pull a rendezvous message the framework kept (priv, priv_len: what the component gave
     * xfer_tag_arrive) into buf: min(length, capacity) bytes, memh its registration or NULL;
     * then xfer_tag_done(handle, status), maybe before this returns. XFER_INPROGRESS, or an
     * error (xfer_tag_done is not called; the receive completes with it). */
    xfer_status_t (*tag_pull)(xfer_ep_h ep, const void *priv, size_t priv_len,
                              uint64_t length, void *buf, size_t capacity, xfer_memh_h memh,
                              void *handle);
    /* Copy len bytes of a message the framework kept into a receive's buffer dst (memh its
     * registration or NULL), where a CPU copy cannot (device memory). NULL: memcpy. */
    xfer_status_t (*tag_copy)(xfer_ep_h ep, void *dst, xfer_memh_h memh, const void *src,
                              size_t len);
    /* A message kept past the bounds (FORCE) with XFER_TAG_ARRIVE_NOTIFY leaves the
     * framework: received (1) or dropped (0) - the transport stops slowing its peer for it.
     * Not called for those of an endpoint being destroyed. */
    void          (*tag_released)(xfer_ep_h ep, const void *priv, size_t priv_len,
                                  int received);
    /* Room was made (a receive was posted, a kept message taken): the endpoints the
     * component paused at XFER_TAG_PAUSE may read again. NULL: it tries at each progress. */
    void          (*tag_resume)(xfer_iface_h iface);
} xfer_component_v1_t;

/* A component's functions are named xfer_<name>_<operation> (xfer_tcp_put). These declare
 * one with the type of its slot in xfer_component_v1_t, so that a prototype cannot drift
 * from the ABI, and fill the slots every data-moving transport has. */
#define XFER_COMPONENT_OP_DECLARE(_prefix, _fn, _slot) \
    extern __typeof__(*((xfer_component_v1_t*)0)->_slot) xfer_##_prefix##_##_fn

#define XFER_COMPONENT_CORE_DECLARE(_p) \
    XFER_COMPONENT_OP_DECLARE(_p, iface_open, iface_open); \
    XFER_COMPONENT_OP_DECLARE(_p, iface_close, iface_close); \
    XFER_COMPONENT_OP_DECLARE(_p, iface_address, iface_address); \
    XFER_COMPONENT_OP_DECLARE(_p, ep_create, ep_create); \
    XFER_COMPONENT_OP_DECLARE(_p, ep_address, ep_address); \
    XFER_COMPONENT_OP_DECLARE(_p, ep_connect, ep_connect); \
    XFER_COMPONENT_OP_DECLARE(_p, ep_destroy, ep_destroy); \
    XFER_COMPONENT_OP_DECLARE(_p, mem_reg, mem_reg); \
    XFER_COMPONENT_OP_DECLARE(_p, mem_dereg, mem_dereg); \
    XFER_COMPONENT_OP_DECLARE(_p, rkey_pack, rkey_pack); \
    XFER_COMPONENT_OP_DECLARE(_p, rkey_unpack, rkey_unpack); \
    XFER_COMPONENT_OP_DECLARE(_p, rkey_release, rkey_release); \
    XFER_COMPONENT_OP_DECLARE(_p, put, put); \
    XFER_COMPONENT_OP_DECLARE(_p, get, get); \
    XFER_COMPONENT_OP_DECLARE(_p, tag_send, tag_send); \
    XFER_COMPONENT_OP_DECLARE(_p, tensor_fetch, tensor_fetch); \
    XFER_COMPONENT_OP_DECLARE(_p, iface_progress, progress); \
    XFER_COMPONENT_OP_DECLARE(_p, iface_event_fd, event_fd); \
    XFER_COMPONENT_OP_DECLARE(_p, iface_event_arm, event_arm); \
    XFER_COMPONENT_OP_DECLARE(_p, ep_flush, ep_flush); \
    XFER_COMPONENT_OP_DECLARE(_p, ep_shutdown, ep_shutdown); \
    XFER_COMPONENT_OP_DECLARE(_p, batch, batch)

/* The slots of XFER_COMPONENT_CORE_DECLARE but for iface_open, iface_close, mem_dereg and
 * batch, which a component that reuses another's functions (gdr: verbs') names itself. */
#define XFER_COMPONENT_CORE_OPS(_p) \
    .iface_address = xfer_##_p##_iface_address, \
    .ep_create     = xfer_##_p##_ep_create, \
    .ep_address    = xfer_##_p##_ep_address, \
    .ep_connect    = xfer_##_p##_ep_connect, \
    .ep_destroy    = xfer_##_p##_ep_destroy, \
    .mem_reg       = xfer_##_p##_mem_reg, \
    .rkey_pack     = xfer_##_p##_rkey_pack, \
    .rkey_unpack   = xfer_##_p##_rkey_unpack, \
    .rkey_release  = xfer_##_p##_rkey_release, \
    .put           = xfer_##_p##_put, \
    .get           = xfer_##_p##_get, \
    .tag_send      = xfer_##_p##_tag_send, \
    .tensor_fetch  = xfer_##_p##_tensor_fetch, \
    .cancel        = xfer_iface_cancel, \
    .progress      = xfer_##_p##_iface_progress, \
    .event_fd      = xfer_##_p##_iface_event_fd, \
    .event_arm     = xfer_##_p##_iface_event_arm, \
    .ep_flush      = xfer_##_p##_ep_flush, \
    .ep_shutdown   = xfer_##_p##_ep_shutdown

/*
 * Optional extension of ABI v1, in its own exported symbol so that the v1 struct stays as it
 * is: a component that keeps per-endpoint counters exports
 *     XFER_COMPONENT_EXPORT const xfer_component_stats_v1_t xfer_component_stats_v1 = {...};
 */
#define XFER_COMPONENT_STATS_SYMBOL_V1 "xfer_component_stats_v1"

typedef struct xfer_component_stats_v1 {
    uint32_t size;                  /* sizeof(xfer_component_stats_v1_t) */
    /* Fill up to *count_p counters of ep and set *count_p to how many ep has. */
    void     (*ep_counters)(xfer_ep_h ep, xfer_counter_t *counters, size_t *count_p);
} xfer_component_stats_v1_t;

/* ---- services libxfer offers components ----------------------------------------------------- */

XFER_API void xfer_log(xfer_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
XFER_API int  xfer_log_enabled(xfer_log_level_t level);
/* A call refuses its input or cannot do what it was asked, and returns an error status: its
 * caller learns of it from that status, so the reason goes to the log at INFO, not ERROR
 * (XFER_LOG_LEVEL=info shows it), and to xfer_last_error() - never shouted twice. */
XFER_API void xfer_refuse(const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A line a peer causes (a junk connection, a bad request): written like xfer_log, but at most
 * 10 per cause (a short name, e.g. "lane_refused") in 10 s, process-wide; the rest are
 * counted (xfer_context_counters: peer_<cause>, peer_<cause>_unlogged) and the next line
 * written says how many were held back. A peer cannot fill the disk or bury other lines. */
XFER_API void xfer_log_peer(const char *cause, xfer_log_level_t level, const char *subsys,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* A proof of an endpoint's secret over msg: HMAC-SHA256, XFER_EP_SECRET_LEN bytes into tag
 * (1; 0 when it cannot be made - then nothing may be proven); and its check, in constant time
 * (1: equal). */
XFER_API int  xfer_ep_secret_tag(const uint8_t *secret, const void *msg, size_t len,
                                 uint8_t *tag);
XFER_API int  xfer_ep_secret_tag_equal(const uint8_t *a, const uint8_t *b);

#define xfer_log_at(_lvl, _subsys, ...) \
    do { if (xfer_log_enabled(_lvl)) xfer_log(_lvl, _subsys, __VA_ARGS__); } while (0)

/* Wait until fd reports one of events (poll's) - XFER_OK - or XFER_ERR_TIMEOUT at
 * deadline_ms (xfer_now_ms()), why saying "timed out waiting to <what>"; XFER_ERR_IO when
 * poll fails. */
XFER_API xfer_status_t xfer_sock_wait(int fd, short events, int64_t deadline_ms,
                                      const char *what, char *why, size_t why_size);
/* A non-blocking listening socket bound to sa (its port 0: one the kernel picks), with the
 * largest backlog the kernel allows, and the port it got. XFER_ERR_BUSY: the port is taken;
 * XFER_ERR_UNAVAILABLE: this host has no such address; XFER_ERR_INVALID_PARAM: a privileged
 * port; XFER_ERR_IO otherwise (why says which call failed). */
XFER_API xfer_status_t xfer_sock_listen(const struct sockaddr *sa, socklen_t len, int *fd_p,
                                        uint16_t *port_p, char *why, size_t why_size);

/* An address or key of need bytes into the caller's buf of *len_p: 1 when it fits; else 0,
 * and the caller returns XFER_ERR_NO_RESOURCE. Either way *len_p is need. */
static inline int xfer_out_room(const void *buf, size_t *len_p, size_t need)
{
    int fits = (*len_p >= need) && ((buf != NULL) || (need == 0));

    *len_p = need;
    return fits;
}

/* Copy a formatted reason into a fixed buffer (truncating safely). */
XFER_API void xfer_reason_set(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copy len bytes of text a peer sent into a terminated string of at most size - 1 characters,
 * each byte outside printable ASCII replaced by '?', so that it can go into a log line. */
XFER_API void xfer_reason_copy(char *dst, size_t size, const void *src, size_t len);

/* One counter of an ep_counters list: entry *n of counters, named prefix + name, when *n < max;
 * *n counts it either way, so that the list reports how many counters there are. */
XFER_API void xfer_counter_put(xfer_counter_t *counters, size_t max, size_t *n,
                               const char *prefix, const char *name, uint64_t value);

/* A table of uint64_t counters of a struct, by name: XFER_COUNTER_FIELD(type, "name", field)
 * each; xfer_counter_put_table() puts every one of them, read from base, in order. */
typedef struct xfer_counter_field {
    const char *name;
    size_t     offset;
} xfer_counter_field_t;

#define XFER_COUNTER_FIELD(_type, _name, _field) {(_name), offsetof(_type, _field)}

XFER_API void xfer_counter_put_table(xfer_counter_t *counters, size_t max, size_t *n,
                                     const void *base, const xfer_counter_field_t *table,
                                     size_t count);

/* The one number (decimal, or hexadecimal with 0x) a file holds - a sysfs or procfs
 * attribute - or dflt when it cannot be read. */
XFER_API long xfer_file_long(const char *path, long dflt);

/* Append one key/value attribute to a device; silently drops past XFER_DEVICE_ATTR_MAX. */
XFER_API void xfer_device_attr_add(xfer_device_attr_t *dev, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Check tensor metadata (off the wire or from a producer): a valid dtype, rank and
 * non-negative dims whose product times the element size is size (unless is_dead, which
 * carries no data). XFER_ERR_PROTOCOL with why filled when it does not hold. */
XFER_API xfer_status_t xfer_tensor_meta_check(unsigned dtype, unsigned rank, const int64_t *dims,
                                              uint64_t size, int is_dead, char *why,
                                              size_t why_size);

/*
 * A tensor's description on the wire (framework/wire/tensor_meta_wire.c), the same on every
 * transport, every field with an explicit width, little-endian:
 *
 *   0 u64 size   8 u8 dtype   9 u8 rank   10 u8 flags (DEAD, NONE)   11 u8 reserved (0)
 *  12 i64 dims[rank]                                        = 12 + 8 x rank bytes
 *
 * The shape travels as rank + dims, never as a memory image of a struct. NONE says "no tensor
 * described" (a first request that knows nothing, a failed answer): then nothing else is set.
 */
#define XFER_TENSOR_WIRE_META_FIXED 12u
#define XFER_TENSOR_WIRE_META_MAX   (XFER_TENSOR_WIRE_META_FIXED + 8u * XFER_TENSOR_MAX_RANK)
#define XFER_TENSOR_META_DEAD       0x1u    /* a dead tensor: no data, size 0 */
#define XFER_TENSOR_META_NONE       0x2u    /* no tensor described */

typedef struct xfer_tensor_wire_meta {
    uint32_t dtype;
    uint32_t rank;
    uint32_t flags;                 /* XFER_TENSOR_META_* */
    uint64_t size;
    int64_t  dims[XFER_TENSOR_MAX_RANK];
} xfer_tensor_wire_meta_t;

static inline size_t xfer_tensor_wire_meta_len(const xfer_tensor_wire_meta_t *m)
{
    return XFER_TENSOR_WIRE_META_FIXED + 8u * m->rank;
}

/* The bytes of data a tensor of this description carries: its size, or 0 when it is dead or
 * none is described. */
static inline uint64_t xfer_tensor_wire_data_len(const xfer_tensor_wire_meta_t *m)
{
    return (m->flags & (XFER_TENSOR_META_DEAD | XFER_TENSOR_META_NONE)) ? 0 : m->size;
}

/* m from a tensor's metadata (t NULL: NONE, no tensor), and the tensor m describes. */
XFER_API void xfer_tensor_wire_meta_from(xfer_tensor_wire_meta_t *m, const xfer_tensor_t *t);
XFER_API void xfer_tensor_wire_meta_to(const xfer_tensor_wire_meta_t *m, xfer_tensor_t *t);
/* Pack m (checked, or built by xfer_tensor_wire_meta_from) at buf, which has room for
 * xfer_tensor_wire_meta_len(m) bytes; returns that length. */
XFER_API size_t xfer_tensor_wire_pack_meta(const xfer_tensor_wire_meta_t *m, uint8_t *buf);
/* The description at the start of buf (len bytes there), checked - its length against len,
 * reserved bits 0, a known dtype, rank, dims and size that agree (xfer_tensor_meta_check), or
 * NONE with nothing else set - and its length in *used_p; else XFER_ERR_PROTOCOL and why. */
XFER_API xfer_status_t xfer_tensor_wire_parse_meta(const uint8_t *buf, size_t len,
                                                   xfer_tensor_wire_meta_t *m, size_t *used_p,
                                                   char *why, size_t why_size);
/* Whether two descriptions are of the same layout (dtype, shape, size, deadness). */
XFER_API int xfer_tensor_wire_meta_equal(const xfer_tensor_wire_meta_t *a,
                                         const xfer_tensor_wire_meta_t *b);

/* Where a fetch's tensor goes at the consumer: the caller's buffer of capacity bytes, or
 * (buf NULL) one alloc returns once the size is known; result is the caller's. */
typedef struct xfer_fetch_dest {
    void          *buf;
    size_t        capacity;
    void          *(*alloc)(void *alloc_arg, const xfer_tensor_t *meta);
    void          *alloc_arg;
    xfer_tensor_t *result;
} xfer_fetch_dest_t;

/* A fetch's arguments hold (XFER_ERR_INVALID_PARAM) and its key is at most max_key_len bytes
 * (XFER_ERR_OUT_OF_RANGE, logged under subsys); dest (may be NULL) taken from them. */
XFER_API xfer_status_t xfer_fetch_start(const xfer_fetch_args_t *args, const xfer_comp_t *comp,
                                        uint32_t max_key_len, const char *subsys,
                                        xfer_fetch_dest_t *dest);
/* The producer's answer describes meta (checked; its data pointer ignored) with data_len
 * bytes of data: dest's result filled and *data_p set to where the bytes go (NULL when there
 * are none) - XFER_OK - or XFER_ERR_TRUNCATED (they do not fit the caller's buffer) or
 * XFER_ERR_NO_MEMORY (alloc gave nothing), the bytes then to be dropped. */
XFER_API xfer_status_t xfer_fetch_land(const xfer_fetch_dest_t *dest, const xfer_tensor_t *meta,
                                       uint64_t data_len, void **data_p);

/*
 * A consumer's cache of the metadata last seen per tensor key (step left out), so that the
 * next fetch of the key can say what it expects (verbs sends it with its request and gets the
 * data written at once). At most max keys, the least recently used going first; each value is
 * value_size bytes of the caller's, copied in and out. A cache: out of memory, it keeps less.
 */
typedef struct xfer_meta_cache xfer_meta_cache_t;

/* NULL: no memory (max 0: a cache that keeps nothing). */
XFER_API xfer_meta_cache_t *xfer_meta_cache_create(uint64_t max, size_t value_size);
XFER_API void xfer_meta_cache_destroy(xfer_meta_cache_t *c);
/* Copy key's value into value and make it the most recent: 1, or 0 when there is none. */
XFER_API int xfer_meta_cache_find(xfer_meta_cache_t *c, const char *key, void *value);
XFER_API void xfer_meta_cache_store(xfer_meta_cache_t *c, const char *key, const void *value);

/* ---- CUDA driver ---------------------------------------------------------------------------- */

/*
 * The CUDA driver API, loaded by libxfer with dlopen (XFER_CUDA_LIB, default libcuda.so.1) in
 * one place for the framework and every component, so that nothing links against CUDA and a
 * host without a GPU runs everything else. The types are the driver's own in plain C: CUresult
 * and CUdevice are int, CUdeviceptr is unsigned long long, CUcontext, CUstream and CUevent
 * are pointers. Entries resolve to the symbols cuda.h maps the names to (cuMemAlloc_v2...).
 * The table grows at its end; size says how far a build's table goes.
 */
typedef unsigned long long xfer_cu_ptr_t;

#define XFER_CUDA_IPC_HANDLE_SIZE  64u
#define XFER_CUDA_IPC_LAZY_PEER    0x1u    /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */
typedef struct xfer_cuda_ipc_handle {
    char reserved[XFER_CUDA_IPC_HANDLE_SIZE];
} xfer_cuda_ipc_handle_t;

typedef struct xfer_cuda_driver {
    uint32_t    size;               /* sizeof(xfer_cuda_driver_t) of libxfer's build */
    int         version;            /* cuDriverGetVersion(): 1000 * major + 10 * minor */
    const char  *library;           /* the file that was loaded */
    int (*init)(unsigned flags);
    int (*driver_get_version)(int *version);
    int (*get_error_name)(int result, const char **name);
    int (*get_error_string)(int result, const char **text);
    int (*device_get_count)(int *count);
    int (*device_get)(int *device, int ordinal);
    int (*device_get_name)(char *name, int len, int device);
    int (*device_get_pci_bus_id)(char *bus_id, int len, int device);
    int (*device_get_attribute)(int *value, int attribute, int device);
    int (*device_primary_ctx_retain)(void **cu_ctx, int device);
    int (*device_primary_ctx_release)(int device);
    int (*ctx_get_current)(void **cu_ctx);
    int (*ctx_set_current)(void *cu_ctx);
    int (*pointer_get_attributes)(unsigned num, int *attributes, void **data, xfer_cu_ptr_t ptr);
    int (*pointer_set_attribute)(const void *value, int attribute, xfer_cu_ptr_t ptr);
    int (*mem_get_address_range)(xfer_cu_ptr_t *base, size_t *size, xfer_cu_ptr_t ptr);
    int (*mem_alloc)(xfer_cu_ptr_t *ptr, size_t size);
    int (*mem_free)(xfer_cu_ptr_t ptr);
    int (*mem_host_alloc)(void **ptr, size_t size, unsigned flags);
    int (*mem_free_host)(void *ptr);
    int (*memcpy_htod)(xfer_cu_ptr_t dst, const void *src, size_t size);
    int (*memcpy_dtoh)(void *dst, xfer_cu_ptr_t src, size_t size);
    int (*memcpy_async)(xfer_cu_ptr_t dst, xfer_cu_ptr_t src, size_t size, void *stream);
    int (*memcpy_htod_async)(xfer_cu_ptr_t dst, const void *src, size_t size, void *stream);
    int (*memcpy_dtoh_async)(void *dst, xfer_cu_ptr_t src, size_t size, void *stream);
    int (*stream_create)(void **stream, unsigned flags);
    int (*stream_destroy)(void *stream);
    int (*stream_synchronize)(void *stream);
    int (*event_create)(void **event, unsigned flags);
    int (*event_record)(void *event, void *stream);
    int (*event_query)(void *event);
    int (*event_destroy)(void *event);
    /* NULL with a driver older than CUDA 11.7 (no DMA-BUF export). */
    int (*mem_get_handle_for_address_range)(void *handle, xfer_cu_ptr_t ptr, size_t size,
                                            int handle_type, unsigned long long flags);
    /* CUDA IPC (legacy handles of cuMemAlloc memory); NULL where the driver lacks them. The
     * handle is XFER_CUDA_IPC_HANDLE_SIZE bytes (CUipcMemHandle), passed by value to open. */
    int (*ipc_get_mem_handle)(void *handle, xfer_cu_ptr_t ptr);
    int (*ipc_open_mem_handle)(xfer_cu_ptr_t *ptr, xfer_cuda_ipc_handle_t handle,
                               unsigned flags);
    int (*ipc_close_mem_handle)(xfer_cu_ptr_t ptr);
    /* cuMemcpyBatchAsync (CUDA 12.8, the form with failIdx): count copies between pointers
     * in one call, in stream order as a whole, in no order among themselves; NULL where the
     * driver lacks it. attrs points to num_attrs xfer_cuda_memcpy_attr_t. */
    int (*memcpy_batch_async)(xfer_cu_ptr_t *dsts, xfer_cu_ptr_t *srcs, size_t *sizes,
                              size_t count, void *attrs, size_t *attr_idxs, size_t num_attrs,
                              size_t *fail_idx, void *stream);
    /* Modules and kernel launches (cuModuleLoadData takes PTX, which the driver compiles for
     * its GPU); NULL where the library lacks them. */
    int (*module_load_data)(void **module, const void *image);
    int (*module_get_function)(void **function, void *module, const char *name);
    int (*module_unload)(void *module);
    int (*launch_kernel)(void *function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                         unsigned block_x, unsigned block_y, unsigned block_z,
                         unsigned shared_bytes, void *stream, void **params, void **extra);
} xfer_cuda_driver_t;

/* Whether drv's table (drv->size: libxfer's build) reaches the optional entry _field and the
 * driver has it: what a component asks before it calls one, whichever libxfer it runs with. */
#define XFER_CUDA_DRIVER_HAS(_drv, _field) \
    (((_drv)->size >= offsetof(xfer_cuda_driver_t, _field) + sizeof((_drv)->_field)) && \
     ((_drv)->_field != NULL))

/* CUmemcpyAttributes: how the copies of a batch from attr_idxs[k] on access their source.
 * The location hints apply to managed and pageable memory only; type 0 leaves them unset. */
#define XFER_CUDA_SRC_ACCESS_ORDER_STREAM  1   /* CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */
typedef struct xfer_cuda_memcpy_attr {
    int      src_access_order;
    int      src_loc_type, src_loc_id;
    int      dst_loc_type, dst_loc_id;
    unsigned flags;
} xfer_cuda_memcpy_attr_t;

/* The driver table, loading the library on the first call; cuInit is not called (see
 * xfer_cuda_init). NULL with why filled when the library cannot be loaded or lacks an entry
 * point (too old). Safe from any thread. */
XFER_API const xfer_cuda_driver_t *xfer_cuda_driver(char *why, size_t why_size);

/* cuInit(0), once per process, for code about to use device memory. XFER_ERR_UNAVAILABLE with
 * why filled when the driver cannot be loaded or initialised. */
XFER_API xfer_status_t xfer_cuda_init(char *why, size_t why_size);

/* The driver's state without loading it, one line: not loaded yet, loaded (version), or why
 * loading failed. For query() and xfer_info, which must not load or initialise CUDA. */
XFER_API void xfer_cuda_describe(char *buf, size_t size);

/* A driver result as "NAME: text" (e.g. "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is
 * detected"), into buf. */
XFER_API const char *xfer_cuda_result_string(int result, char *buf, size_t size);

/*
 * A memfd of length bytes (named name in /proc/<pid>/maps) sealed against shrinking and
 * growing, for a peer on this host to map: a file its owner could shrink under a peer's
 * mapping would fault the peer. -1 with why filled when it cannot be made.
 */
XFER_API int xfer_memfd_sealed(const char *name, size_t length, char *why, size_t why_size);

/*
 * Find what [addr, addr + length) is, without loading or initialising CUDA: when the driver
 * is not loaded in this process, or loaded but not initialised, no device memory exists and
 * the range is host memory. Otherwise the driver is asked (cuPointerGetAttributes) about both
 * ends. XFER_ERR_INVALID_PARAM with why filled when the range is not one kind of memory: it
 * runs past the end of its CUDA allocation, or starts in host and ends in device memory.
 */
XFER_API xfer_status_t xfer_mem_detect(const void *addr, size_t length, xfer_mem_attr_t *attr_p,
                                       char *why, size_t why_size);

/*
 * Copies between CUDA device memory and pinned host buffers, for a transport that moves device
 * memory through host memory of its own (tcp): num_slots bounce buffers of slot_size bytes,
 * pinned by the driver, and a non-blocking stream of xfer's own in the CUDA context of the
 * memory it was opened for, one event per slot. A copy starts at once and is asked about with
 * xfer_devcopy_poll(), never waited for; the engine serves one context (memory of another is
 * refused with xfer_devcopy_serves()). Calls are serialised by the framework as every call
 * into a component is.
 */
typedef struct xfer_devcopy xfer_devcopy_t;

/* Open an engine for memory of attr (XFER_MEM_CUDA); XFER_OK or an error with why filled. */
XFER_API xfer_status_t xfer_devcopy_open(const xfer_mem_attr_t *attr, unsigned num_slots,
                                         size_t slot_size, xfer_devcopy_t **dc_p, char *why,
                                         size_t why_size);
/* Wait for the copies in flight and release the stream, events and bounce buffers. */
XFER_API void xfer_devcopy_close(xfer_devcopy_t *dc);
/* 1 when dc copies memory of attr (the same CUDA context). */
XFER_API int xfer_devcopy_serves(const xfer_devcopy_t *dc, const xfer_mem_attr_t *attr);
/* The bounce buffer of slot (slot_size bytes). */
XFER_API void *xfer_devcopy_buf(xfer_devcopy_t *dc, unsigned slot);
/* Start copying len bytes from the slot's buffer to device memory at dst (to_device = 1), or
 * from device memory at dev into the slot's buffer (to_device = 0); dev is the device
 * address. One copy per slot at a time. */
XFER_API xfer_status_t xfer_devcopy_start(xfer_devcopy_t *dc, unsigned slot, void *dev,
                                          size_t len, int to_device, char *why,
                                          size_t why_size);
/* XFER_OK once the slot's copy landed (or none was started), XFER_INPROGRESS, or the copy's
 * error with why filled. */
XFER_API xfer_status_t xfer_devcopy_poll(xfer_devcopy_t *dc, unsigned slot, char *why,
                                         size_t why_size);
/* A copy that completes before the call returns, between device memory and any host memory
 * (small or rare data: an eager message, an unexpected message landing in device memory). */
XFER_API xfer_status_t xfer_devcopy_sync(xfer_devcopy_t *dc, void *dst, const void *src,
                                         size_t len, int to_device, char *why,
                                         size_t why_size);

#ifdef __cplusplus
}
#endif

/* The shared engines: budgets, tag matching, slot tables, operation pools. */
#include <xfer/engine.h>

#endif /* XFER_COMPONENT_H */
