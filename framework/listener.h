/*
 * What the listener (listener.c) and its handshakes (handshake.c) share: the listener, and
 * one handshake - the server's side of the bootstrap over one accepted socket, a state
 * machine that never blocks.
 */
#ifndef XFER_LISTENER_H
#define XFER_LISTENER_H

#include "auth.h"
#include "bootstrap.h"

/* A listen takes at most this many sockets: both families of loopback or of every interface,
 * or the first addresses a name resolves to. */
#define XFER_LISTEN_SOCKS_MAX 4

typedef enum { HS_AUTH_IN, HS_HELLO_IN, HS_REPLY_OUT, HS_CONNECT_IN } hs_state_t;

/* What a handshake in each state waits for, for log lines. */
extern const char *const hs_waiting_for[];

typedef struct handshake {
    ucs_list_link_t list;       /* listener->pending: oldest, so nearest deadline, first */
    int             fd;
    hs_state_t      state;
    uint32_t        events;     /* what the epoll set watches on fd */
    int64_t         deadline;   /* xfer_now_ms() */
    char            peer[80];
    xfer_boot_rx_t  rx;
    uint8_t         *out;       /* our reply: out_len bytes, out_sent of them sent */
    size_t          out_len;
    size_t          out_sent;
    xfer_status_t   refused;    /* the reply ends in a REJECT: the status it carries */
    char            *refusal;   /* and its reason */
    xfer_endpoint_t *ep;        /* prepared, waiting for the client's CONNECT */
    hs_state_t      next;       /* what REPLY_OUT leads to once the reply is sent */
    xfer_auth_t     *auth;      /* with a key: the proofs; NULL: none */
    xfer_boot_rx_t  held;       /* with a key: a HELLO or CONNECT until its AUTH_MAC checks */
    int             holding;
    uint8_t         secret[XFER_EP_SECRET_LEN];     /* with a key: the endpoint's */
} handshake_t;

struct xfer_listener {
    xfer_context_t    *ctx;
    ucs_list_link_t   list;         /* ctx->listeners: closed at context destroy */
    int               fds[XFER_LISTEN_SOCKS_MAX];  /* the listening sockets, one per address */
    unsigned          num_fds;
    unsigned          next_fd;      /* the socket accept_waiting() asks first */
    int               epfd;         /* xfer_listener_fd() */
    int               timer_fd;     /* fires at the nearest handshake deadline */
    int64_t           timer_at;     /* the deadline it is armed for; 0: disarmed */
    uint16_t          port;
    ucs_list_link_t   pending;      /* handshake_t */
    unsigned          num_pending;
    unsigned          max_pending;  /* XFER_BOOTSTRAP_MAX_PENDING */
    int64_t           timeout_ms;   /* XFER_BOOTSTRAP_TIMEOUT */
    xfer_endpoint_t   **done;       /* completed outside xfer_accept(), for it to return */
    unsigned          num_done;     /* at most max_pending */
    xfer_wire_hello_t *offer;       /* what we offer, the same to every client */
    uint8_t           *hello;       /* ... packed as our HELLO frame */
    size_t            hello_len;
};

/* Start a handshake on fd, accepted from peer at now (ms): XFER_OK, or the connection is
 * closed (logged) and the error returned. */
xfer_status_t hs_start(xfer_listener_t *l, int fd, const char *peer, int64_t now);
/* Move hs as far as its socket allows now. XFER_OK: done, the endpoint in *ep_p and hs gone;
 * XFER_INPROGRESS: waiting, watched for what it waits for; else it failed and is gone. */
xfer_status_t hs_progress(xfer_listener_t *l, handshake_t *hs, xfer_endpoint_t **ep_p);
/* End hs with status: a log line at level (the peer's doing at WARN: bounded per cause),
 * its socket closed, its endpoint discarded. */
void hs_fail(xfer_listener_t *l, handshake_t *hs, xfer_status_t status, const char *why,
             xfer_log_level_t level);

#endif
