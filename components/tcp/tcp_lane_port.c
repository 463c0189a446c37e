/*
 * The lane ports (tcp_lane.c says what lanes are): the server iface's listening sockets for
 * its endpoints' lanes, and the connections to them until they say which lane of which
 * endpoint they are (LANE_HELLO: lane number and the endpoint's random token, from lane 0's
 * host). A lane port binds the one address a server endpoint's bootstrap connection came in
 * at, opened with the first endpoint that came in there: a listener on loopback opens no
 * socket that another interface reaches, and an address nobody connected to has no port.
 *
 * A connection that names no waiting endpoint, a taken lane or another host is closed with a
 * log line. Connections that have not sent their hello yet are held up to the number of
 * lanes our endpoints still wait for plus XFER_TCP_ACCEPT_MAX strangers; past that the
 * oldest is closed, so that idle connections cannot take descriptors without bound while a
 * burst of clients, which send their hellos from progress, is not cut short.
 */
#include "tcp.h"

#include <xfer/byteorder.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connection to the lane port that has not said which lane it is yet. */
struct xfer_tcp_accept {
    ucs_list_link_t list;       /* iface->accepts, oldest first */
    int             fd;
    xfer_tcp_lane_port_t *lport; /* the port it came to */
    unsigned        got;
    unsigned        need;       /* the hello's length: 16, or 48 once it says it is proven */
    uint8_t         buf[XFER_TCP_WIRE_LANE_HELLO_MAX];
};

/* ---- the port ------------------------------------------------------------------------------- */

static unsigned lanes_auto(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    /* two lanes were best on two cores (contrib/README.md, "Reading the tcp figures") */
    return (cores >= 16) ? 4 : 2;
}

void xfer_tcp_lanes_iface_open(xfer_iface_h iface)
{
    unsigned want = iface->cfg->lanes ? (unsigned)iface->cfg->lanes : lanes_auto();

    iface->lanes = 1;
    ucs_list_head_init(&iface->accepts);
    ucs_list_head_init(&iface->lane_ports);
    if (want > XFER_TCP_WIRE_LANES_MAX) {
        want = XFER_TCP_WIRE_LANES_MAX;
    }
    if (want < 2) {
        return;
    }
    iface->scratch = malloc(XFER_TCP_RX_BUF_LEN);
    if (iface->scratch == NULL) {
        xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "out of memory for lanes: endpoints use one "
                 "connection");
        return;
    }
    iface->lanes = want;
}

/* The IP address of a (IPv4, IPv6 or IPv4-mapped IPv6) socket address; 0 when none. */
static int host_of(const struct sockaddr_storage *ss, struct in6_addr *a)
{
    if (ss->ss_family == AF_INET6) {
        *a = ((const struct sockaddr_in6*)ss)->sin6_addr;
        return 1;
    }
    if (ss->ss_family == AF_INET) {
        memset(a, 0, sizeof(*a));
        a->s6_addr[10] = a->s6_addr[11] = 0xff;
        memcpy(&a->s6_addr[12], &((const struct sockaddr_in*)ss)->sin_addr, 4);
        return 1;
    }
    return 0;
}

/* The lane port at the address ep's bootstrap connection came in at: found, or opened now.
 * NULL when it cannot be (ep then uses one connection). */
xfer_tcp_lane_port_t *xfer_tcp_lane_port_get(xfer_ep_h ep)
{
    xfer_iface_h iface = ep->iface;
    struct epoll_event ev = {.events = EPOLLIN};
    struct sockaddr_storage here;
    socklen_t len = sizeof(here);
    xfer_tcp_lane_port_t *lp;
    char why[XFER_REASON_MAX];
    struct in6_addr host;
    char at[INET6_ADDRSTRLEN];

    if ((getsockname(ep->fd, (struct sockaddr*)&here, &len) != 0) || !host_of(&here, &host)) {
        return NULL;
    }
    ucs_list_for_each(lp, &iface->lane_ports, list) {
        if ((lp->family == here.ss_family) && (memcmp(&lp->host, &host, sizeof(host)) == 0)) {
            return lp;
        }
    }
    (void)xfer_tcp_host_text((struct sockaddr*)&here, at, sizeof(at));
    if (iface->num_lane_ports >= XFER_TCP_LANE_PORTS_MAX) {
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "no lane port at %s: %u addresses have "
                    "theirs already; its endpoints use one connection", at,
                    iface->num_lane_ports);
        return NULL;
    }
    lp = calloc(1, sizeof(*lp));
    if (lp == NULL) {
        return NULL;
    }
    lp->family  = here.ss_family;
    lp->host    = host;
    lp->fd      = -1;
    ev.data.u64 = (uintptr_t)lp | XFER_TCP_EV_LPORT;
    /* the address lane 0 came in at, a port the kernel picks (host_of: IPv4 or IPv6) */
    if (here.ss_family == AF_INET6) {
        ((struct sockaddr_in6*)&here)->sin6_port = 0;
    } else {
        ((struct sockaddr_in*)&here)->sin_port = 0;
    }
    if ((xfer_sock_listen((struct sockaddr*)&here, len, &lp->fd, &lp->port, why,
                          sizeof(why)) != XFER_OK) ||
        ((epoll_ctl(iface->base.epfd, EPOLL_CTL_ADD, lp->fd, &ev) != 0) &&
         (snprintf(why, sizeof(why), "epoll_ctl: %s", strerror(errno)) > 0))) {
        xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "no lane port at %s (%s): its endpoints use "
                 "one connection (XFER_TCP_LANES=1 says so without trying)", at, why);
        if (lp->fd >= 0) {
            close(lp->fd);
        }
        free(lp);
        return NULL;
    }
    ucs_list_add_tail(&iface->lane_ports, &lp->list);
    iface->num_lane_ports++;
    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "endpoints take %u lanes, port %u at %s",
                iface->lanes, lp->port, at);
    return lp;
}

/* acc is done with: off the list, its connection closed unless fd was taken (-1). */
static void accept_drop(xfer_iface_h iface, struct xfer_tcp_accept *acc)
{
    if (acc->fd >= 0) {
        epoll_ctl(iface->base.epfd, EPOLL_CTL_DEL, acc->fd, NULL);
        close(acc->fd);
    }
    ucs_list_del(&acc->list);
    iface->num_accepts--;
    free(acc);
}

void xfer_tcp_lanes_iface_close(xfer_iface_h iface)
{
    if (iface->accepts.next != NULL) {
        while (!ucs_list_is_empty(&iface->accepts)) {
            accept_drop(iface, ucs_list_head(&iface->accepts, struct xfer_tcp_accept, list));
        }
    }
    if (iface->lane_ports.next != NULL) {
        while (!ucs_list_is_empty(&iface->lane_ports)) {
            xfer_tcp_lane_port_t *lp = ucs_list_extract_head(&iface->lane_ports,
                                                             xfer_tcp_lane_port_t, list);

            close(lp->fd);
            free(lp);
        }
    }
    free(iface->scratch);
}

void xfer_tcp_lanes_awaited(xfer_ep_h ep, unsigned n)
{
    ep->iface->lanes_awaited -= ep->lanes_awaited;
    ep->iface->lanes_awaited += n;
    ep->lanes_awaited         = n;
}

/* ---- hellos ------------------------------------------------------------------------------- */

static int same_host(const struct sockaddr_storage *x, const struct sockaddr_storage *y)
{
    struct in6_addr a, b;

    return host_of(x, &a) && host_of(y, &b) && (memcmp(&a, &b, sizeof(a)) == 0);
}

/* Does hello (raw: its bytes) carry ep's proof? */
static int lane_proven(xfer_ep_h ep, const xfer_tcp_wire_lane_hello_t *hello,
                       const uint8_t *raw)
{
    uint8_t want[XFER_TCP_WIRE_LANE_PROOF_LEN];

    return hello->proven &&
           xfer_ep_secret_tag(ep->secret, raw, XFER_TCP_WIRE_LANE_HELLO_LEN, want) &&
           xfer_ep_secret_tag_equal(want, raw + XFER_TCP_WIRE_LANE_HELLO_LEN);
}

/* A connection that sent its LANE_HELLO: attach it to its endpoint, or close it. */
static void accept_hello(xfer_iface_h iface, struct xfer_tcp_accept *acc)
{
    struct sockaddr_storage mine, theirs;
    socklen_t mlen = sizeof(mine), tlen = sizeof(theirs);
    xfer_tcp_wire_lane_hello_t hello;
    char why[XFER_REASON_MAX] = "";
    char host[INET6_ADDRSTRLEN] = "?";
    xfer_ep_h ep;
    int fd = acc->fd;

    if (getpeername(fd, (struct sockaddr*)&theirs, &tlen) == 0) {
        (void)xfer_tcp_host_text((struct sockaddr*)&theirs, host, sizeof(host));
    }
    if (xfer_tcp_wire_unpack_lane_hello(acc->buf, &hello, why, sizeof(why)) != XFER_OK) {
        goto refuse;
    }
    snprintf(why, sizeof(why), "no endpoint waits for lane %u with this token", hello.lane);
    ucs_list_for_each(ep, &iface->eps, list) {
        xfer_tcp_lane_t *lane;

        if ((ep->token != hello.token) || !ep->is_server || (ep->lport != acc->lport) ||
            (hello.lane >= ep->lanes_max) ||
            ((ep->fail.state != XFER_EP_CREATED) && (ep->fail.state != XFER_EP_CONNECTED))) {
            continue;
        }
        lane = &ep->lanes[hello.lane];
        if ((lane->fd >= 0) || lane->peer_closed) {
            snprintf(why, sizeof(why), "lane %u of its endpoint is taken", hello.lane);
            break;
        }
        /* an authenticated endpoint's lanes prove its secret: its token went in the clear */
        if (ep->has_secret && !lane_proven(ep, &hello, acc->buf)) {
            snprintf(why, sizeof(why), "lane %u does not prove its endpoint's secret",
                     hello.lane);
            break;
        }
        /* its keys come from lane 0's TLS, which a client finishes before its lanes */
        if (iface->cfg->tls && (ep->fail.state == XFER_EP_CREATED)) {
            snprintf(why, sizeof(why), "lane %u came before its endpoint's TLS", hello.lane);
            break;
        }
        if (!ep->has_secret && hello.proven) {
            snprintf(why, sizeof(why), "lane %u proves a secret its endpoint does not have",
                     hello.lane);
            break;
        }
        /* the token is the secret; the peer's host must be lane 0's too */
        if ((getpeername(ep->fd, (struct sockaddr*)&mine, &mlen) != 0) ||
            !same_host(&mine, &theirs)) {
            snprintf(why, sizeof(why), "lane %u comes from another host than its endpoint",
                     hello.lane);
            break;
        }
        epoll_ctl(iface->base.epfd, EPOLL_CTL_DEL, fd, NULL);
        acc->fd = -1;
        accept_drop(iface, acc);
        if (ep->lanes_awaited > 0) {
            xfer_tcp_lanes_awaited(ep, ep->lanes_awaited - 1);
        }
        if (xfer_tcp_lane_attach(lane, fd, 0) != XFER_OK) {
            close(fd);
            xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_RESOURCE, "lane %u could not be "
                                   "attached (epoll_ctl, or its TLS: see the log)", hello.lane);
            return;
        }
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p: lane %u attached (fd %d)",
                    (void*)ep, hello.lane, fd);
        xfer_tcp_lane_write(lane);
        if (lane->rx_active && (ep->fail.state == XFER_EP_CONNECTED)) {
            xfer_tcp_iface_rx_kick(iface, ep);
        }
        return;
    }

refuse:
    xfer_log_peer("lane_refused", XFER_LOG_WARN, XFER_TCP_SUBSYS,
                  "lane connection from %s closed: %s", host, why);
    accept_drop(iface, acc);
}

unsigned xfer_tcp_lane_port_event(xfer_iface_h iface, struct xfer_tcp_accept *acc,
                                  uint32_t events)
{
    ssize_t n;

    (void)events;
    do {
        n = recv(acc->fd, acc->buf + acc->got, acc->need - acc->got, 0);
    } while ((n < 0) && (errno == EINTR));
    if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK))) {
        return 0;
    }
    if (n <= 0) {
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "a lane connection went before its "
                    "hello: %s", (n == 0) ? "closed" : strerror(errno));
        accept_drop(iface, acc);
        return 1;
    }
    acc->got += (unsigned)n;
    if ((acc->got == XFER_TCP_WIRE_LANE_HELLO_LEN) &&
        (xfer_get_le16(acc->buf) == XFER_TCP_WIRE_LANE_PROVEN_MAGIC)) {
        acc->need = XFER_TCP_WIRE_LANE_HELLO_MAX;   /* its proof follows */
        return xfer_tcp_lane_port_event(iface, acc, events) + 1;
    }
    if (acc->got == acc->need) {
        accept_hello(iface, acc);
    }
    return 1;
}

/* Read what every held connection has sent: those whose hello is in are attached. */
static void accepts_read(xfer_iface_h iface)
{
    struct xfer_tcp_accept *acc, *tmp;

    ucs_list_for_each_safe(acc, tmp, &iface->accepts, list) {
        (void)xfer_tcp_lane_port_event(iface, acc, EPOLLIN);
    }
}

/* Hold at most the lanes our endpoints wait for and XFER_TCP_ACCEPT_MAX strangers, with room
 * for `room` more: the hellos that came meanwhile are read first (those connections are
 * attached), then the oldest silent ones are closed. */
static void accepts_bound(xfer_iface_h iface, unsigned room)
{
    if (iface->num_accepts + room > XFER_TCP_ACCEPT_MAX + iface->lanes_awaited) {
        accepts_read(iface);
    }
    while ((iface->num_accepts > 0) &&
           (iface->num_accepts + room > XFER_TCP_ACCEPT_MAX + iface->lanes_awaited)) {
        xfer_log_peer("lane_evicted", XFER_LOG_WARN, XFER_TCP_SUBSYS,
                      "%u lane connections have not said which lane they are, more than the "
                      "%u lanes our endpoints wait for and %u others: the oldest is closed",
                      iface->num_accepts, iface->lanes_awaited,
                      XFER_TCP_ACCEPT_MAX);
        accept_drop(iface, ucs_list_head(&iface->accepts, struct xfer_tcp_accept, list));
    }
}

void xfer_tcp_lanes_trim(xfer_iface_h iface)
{
    accepts_bound(iface, 0);
}

unsigned xfer_tcp_lanes_accept(xfer_iface_h iface, xfer_tcp_lane_port_t *lp)
{
    unsigned count = 0;

    for (;;) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
        int fd = accept4(lp->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct xfer_tcp_accept *acc;

        if (fd < 0) {
            if ((errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR)) {
                xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "accept on the lane port: %s",
                         strerror(errno));
            }
            xfer_tcp_lanes_trim(iface);     /* lanes attached meanwhile lowered the bound */
            return count;
        }
        /* the lanes our endpoints wait for may all be silent for a while (their clients
         * send the hello from progress), and 32 strangers besides */
        accepts_bound(iface, 1);
        acc = malloc(sizeof(*acc));
        if (acc == NULL) {
            close(fd);
            continue;
        }
        acc->fd     = fd;
        acc->lport  = lp;
        acc->got    = 0;
        acc->need   = XFER_TCP_WIRE_LANE_HELLO_LEN;
        ev.data.u64 = (uintptr_t)acc | XFER_TCP_EV_ACCEPT;
        if (epoll_ctl(iface->base.epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(acc);
            continue;
        }
        ucs_list_add_tail(&iface->accepts, &acc->list);
        iface->num_accepts++;
        count++;
        xfer_tcp_lane_port_event(iface, acc, EPOLLIN);    /* its hello is often there */
    }
}
