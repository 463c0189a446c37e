/* Socket helpers for the bootstrap (see sock.h). */
#include "sock.h"
#include "xfer_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SOCK_SUBSYS "bootstrap"

xfer_status_t xfer_sock_resolve(const char *address, int allow_any_port,
                                struct addrinfo **list_p, char *why, size_t why_size)
{
    struct addrinfo hints = {0}, *res = NULL;
    char host[256], *end;
    const char *colon, *port_str;
    unsigned long port;
    size_t host_len;
    int ret, wildcard;

    if ((address == NULL) || (*address == '\0')) {
        snprintf(why, why_size, "empty address (expected host:port)");
        return XFER_ERR_INVALID_PARAM;
    }
    if (address[0] == '[') {
        const char *close = strchr(address, ']');
        if ((close == NULL) || (close[1] != ':')) {
            snprintf(why, why_size, "'%s': expected [v6address]:port", address);
            return XFER_ERR_INVALID_PARAM;
        }
        host_len = (size_t)(close - address - 1);
        if (host_len >= sizeof(host)) {
            snprintf(why, why_size, "'%s': host name too long", address);
            return XFER_ERR_INVALID_PARAM;
        }
        memcpy(host, address + 1, host_len);
        port_str = close + 2;
    } else {
        colon = strrchr(address, ':');
        if (colon == NULL) {
            snprintf(why, why_size, "'%s': expected host:port", address);
            return XFER_ERR_INVALID_PARAM;
        }
        host_len = (size_t)(colon - address);
        if (host_len >= sizeof(host)) {
            snprintf(why, why_size, "'%s': host name too long", address);
            return XFER_ERR_INVALID_PARAM;
        }
        memcpy(host, address, host_len);
        port_str = colon + 1;
    }
    host[host_len] = '\0';

    errno = 0;
    port  = strtoul(port_str, &end, 10);
    if ((*port_str == '\0') || (*end != '\0') || (errno != 0) || (port > 65535) ||
        ((port == 0) && !allow_any_port)) {
        snprintf(why, why_size, "'%s': bad port '%s' (1..65535%s)", address, port_str,
                 allow_any_port ? ", or 0 to pick one" : "");
        return XFER_ERR_INVALID_PARAM;
    }

    /* "" is this host's loopback addresses; "*" every interface, which only a listen means */
    wildcard = (strcmp(host, "*") == 0);
    if (wildcard && !allow_any_port) {
        snprintf(why, why_size, "'%s': '*' (every interface) is for listening; a connect "
                 "names a host", address);
        return XFER_ERR_INVALID_PARAM;
    }
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = AI_NUMERICSERV | (wildcard ? AI_PASSIVE : 0);
    ret = getaddrinfo((host_len && !wildcard) ? host : NULL, port_str, &hints, &res);
    if ((ret != 0) || (res == NULL)) {
        snprintf(why, why_size, "'%s': cannot resolve '%s': %s", address, host,
                 (ret != 0) ? gai_strerror(ret) : "no address");
        if (res != NULL) {
            freeaddrinfo(res);
        }
        /* a name that does not exist, against a resolver that cannot answer now */
        if ((ret == EAI_NONAME) || (ret == EAI_NODATA) || (ret == 0)) {
            return XFER_ERR_NOT_FOUND;
        }
        return (ret == EAI_AGAIN) ? XFER_ERR_UNAVAILABLE : XFER_ERR_INVALID_PARAM;
    }
    *list_p = res;
    return XFER_OK;
}

/* The port of an IPv4 or IPv6 address, and setting it. */
static uint16_t sa_port(const struct sockaddr *sa)
{
    return ntohs((sa->sa_family == AF_INET6) ? ((const struct sockaddr_in6*)sa)->sin6_port :
                                               ((const struct sockaddr_in*)sa)->sin_port);
}

static void sa_set_port(struct sockaddr *sa, uint16_t port)
{
    if (sa->sa_family == AF_INET6) {
        ((struct sockaddr_in6*)sa)->sin6_port = htons(port);
    } else if (sa->sa_family == AF_INET) {
        ((struct sockaddr_in*)sa)->sin_port = htons(port);
    }
}

/* "1.2.3.4:80" or "[::1]:80" */
static void addr_str(const struct sockaddr *sa, char *buf, size_t size)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6*)sa;

        inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
        snprintf(buf, size, "[%s]:%u", host, ntohs(sin6->sin6_port));
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in*)sa;

        inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
        snprintf(buf, size, "%s:%u", host, ntohs(sin->sin_port));
    } else {
        snprintf(buf, size, "(address family %d)", sa->sa_family);
    }
}

static void sock_tune(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

xfer_status_t xfer_sock_listen(const struct sockaddr *sa, socklen_t len, int *fd_p,
                               uint16_t *port_p, char *why, size_t why_size)
{
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof(bound);
    int one = 1, fd, err;

    fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, why_size, "socket(): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* an IPv6 socket takes IPv6 alone: IPv4 is listened on only where it was asked for */
    if (sa->sa_family == AF_INET6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    if ((bind(fd, sa, len) != 0) || (listen(fd, SOMAXCONN) != 0) ||
        (getsockname(fd, (struct sockaddr*)&bound, &bound_len) != 0)) {
        char at[INET6_ADDRSTRLEN + 16];

        err = errno;
        addr_str(sa, at, sizeof(at));
        if (err == EADDRNOTAVAIL) {
            snprintf(why, why_size, "%s: this host has no such address (%s)", at,
                     strerror(err));
        } else {
            snprintf(why, why_size, "%s: bind/listen: %s", at, strerror(err));
        }
        close(fd);
        switch (err) {
        case EADDRINUSE:
            return XFER_ERR_BUSY;
        case EADDRNOTAVAIL:
            return XFER_ERR_UNAVAILABLE;
        case EACCES:
            return XFER_ERR_INVALID_PARAM;  /* a privileged port */
        default:
            return XFER_ERR_IO;
        }
    }
    *port_p = sa_port((struct sockaddr*)&bound);
    *fd_p   = fd;
    return XFER_OK;
}

static int sa_same(const struct addrinfo *a, const struct addrinfo *b)
{
    return (a->ai_addrlen == b->ai_addrlen) &&
           (memcmp(a->ai_addr, b->ai_addr, a->ai_addrlen) == 0);
}

/* Bind every address of list (duplicates once) on one port: the list's own, or, for port 0,
 * the one the first socket got. 1 with the sockets; 0 when a later address found that port
 * taken (port 0: try again with another); -1 with the error. An address family or address
 * this host lacks is skipped while another address binds. */
static int listen_list(struct addrinfo *list, uint16_t want, int *fds, unsigned max,
                       unsigned *num_p, uint16_t *port_p, xfer_status_t *status_p, char *why,
                       size_t why_size)
{
    xfer_status_t first = XFER_OK;
    char first_why[256] = "";
    uint16_t port = want;
    unsigned n = 0;

    for (struct addrinfo *ai = list; (ai != NULL) && (n < max); ai = ai->ai_next) {
        struct addrinfo *seen = list;
        xfer_status_t st;
        uint16_t got;
        int fd;

        while ((seen != ai) && !sa_same(seen, ai)) {
            seen = seen->ai_next;
        }
        if ((seen != ai) || ((ai->ai_family != AF_INET) && (ai->ai_family != AF_INET6))) {
            continue;
        }
        sa_set_port(ai->ai_addr, port);
        st = xfer_sock_listen(ai->ai_addr, ai->ai_addrlen, &fd, &got, why, why_size);
        if (st == XFER_OK) {
            fds[n++] = fd;
            port     = got;
            continue;
        }
        if ((st == XFER_ERR_BUSY) && (want == 0) && (n > 0)) {
            while (n > 0) {
                close(fds[--n]);
            }
            return 0;
        }
        if (first == XFER_OK) {
            first = st;
            snprintf(first_why, sizeof(first_why), "%s", why);
        }
        if ((st != XFER_ERR_UNAVAILABLE) && (st != XFER_ERR_IO)) {
            break;      /* taken, or privileged: the listen fails as a whole */
        }
        xfer_log(XFER_LOG_DEBUG, SOCK_SUBSYS, "listen: %s; skipped", why);
    }
    if ((n == 0) || ((first != XFER_OK) && (first != XFER_ERR_UNAVAILABLE) &&
                     (first != XFER_ERR_IO))) {
        while (n > 0) {
            close(fds[--n]);
        }
        snprintf(why, why_size, "%s", first_why[0] ? first_why : "no address to listen on");
        *status_p = (first != XFER_OK) ? first : XFER_ERR_UNAVAILABLE;
        return -1;
    }
    *num_p  = n;
    *port_p = port;
    return 1;
}

xfer_status_t xfer_sock_listen_at(const char *address, int *fds, unsigned max, unsigned *num_p,
                                  uint16_t *port_p, char *why, size_t why_size)
{
    struct addrinfo *list = NULL;
    xfer_status_t status = XFER_OK;
    uint16_t want;
    int ret = 0;

    status = xfer_sock_resolve(address, 1, &list, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    want = sa_port(list->ai_addr);
    /* port 0 on several addresses: another process may take the first one's port on the
     * others between the binds; a few tries with new ports */
    for (int tries = 0; (ret == 0) && (tries < 8); tries++) {
        ret = listen_list(list, want, fds, max, num_p, port_p, &status, why, why_size);
    }
    freeaddrinfo(list);
    if (ret == 0) {
        snprintf(why, why_size, "'%s': no free port common to all its addresses", address);
        return XFER_ERR_BUSY;
    }
    return (ret > 0) ? XFER_OK : status;
}

xfer_status_t xfer_sock_wait(int fd, short events, int64_t deadline_ms, const char *what,
                             char *why, size_t why_size)
{
    struct pollfd pfd = {fd, events, 0};

    for (;;) {
        int64_t left = deadline_ms - xfer_now_ms();
        int ret;

        if (left <= 0) {
            snprintf(why, why_size, "timed out waiting to %s", what);
            return XFER_ERR_TIMEOUT;
        }
        ret = poll(&pfd, 1, (int)((left > 1000000) ? 1000000 : left));
        if (ret > 0) {
            return XFER_OK;
        }
        if ((ret < 0) && (errno != EINTR)) {
            snprintf(why, why_size, "poll(): %s", strerror(errno));
            return XFER_ERR_IO;
        }
    }
}

xfer_status_t xfer_sock_connect(const struct sockaddr *sa, socklen_t len, int64_t deadline_ms,
                                int *fd_p, char *why, size_t why_size)
{
    socklen_t err_len = sizeof(int);
    xfer_status_t status;
    int fd, err = 0;

    fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, why_size, "socket(): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    if ((connect(fd, sa, len) != 0) && (errno != EINPROGRESS)) {
        err = errno;
    } else {
        status = xfer_sock_wait(fd, POLLOUT, deadline_ms, "connect", why, why_size);
        if (status != XFER_OK) {
            close(fd);
            return status;
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
    }
    if (err != 0) {
        snprintf(why, why_size, "connect: %s", strerror(err));
        close(fd);
        return XFER_ERR_CONNECTION;
    }
    sock_tune(fd);
    *fd_p = fd;
    return XFER_OK;
}

xfer_status_t xfer_sock_connect_any(const struct addrinfo *list, int64_t deadline_ms,
                                    int *fd_p, char *why, size_t why_size)
{
    xfer_status_t status = XFER_ERR_INVALID_PARAM;
    const struct addrinfo *ai;
    char addr[INET6_ADDRSTRLEN + 16], last[512];
    unsigned left = 0, tried = 0;
    int64_t now, until;

    snprintf(why, why_size, "no address to connect to");
    for (ai = list; ai != NULL; ai = ai->ai_next) {
        left++;
    }
    for (ai = list; ai != NULL; ai = ai->ai_next, left--) {
        now = xfer_now_ms();
        if ((now >= deadline_ms) && (tried > 0)) {
            break;      /* the last failure says why; nothing is left for the rest */
        }
        until = now + (deadline_ms - now) / (int64_t)left;
        addr_str(ai->ai_addr, addr, sizeof(addr));
        status = xfer_sock_connect(ai->ai_addr, ai->ai_addrlen, until, fd_p, last,
                                   sizeof(last));
        tried++;
        if (status == XFER_OK) {
            return XFER_OK;
        }
        snprintf(why, why_size, "%s: %s", addr, last);
        if (ai->ai_next != NULL) {
            xfer_log(XFER_LOG_DEBUG, SOCK_SUBSYS, "%s; trying the next address", why);
        }
    }
    if (tried > 1) {
        size_t n = strlen(why);

        snprintf(why + n, why_size - n, " (the last of %u addresses tried)", tried);
    }
    return status;
}

xfer_status_t xfer_sock_accept(int listen_fd, int *fd_p, char *peer, size_t peer_size,
                               char *why, size_t why_size)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int fd;

    for (;;) {
        len = sizeof(ss);
        fd  = accept4(listen_fd, (struct sockaddr*)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            break;
        }
        switch (errno) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return XFER_INPROGRESS;
        case EINTR:
        case ECONNABORTED:      /* the client gave up while it waited: take the next */
        case EPROTO:
            continue;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            snprintf(why, why_size, "accept(): %s", strerror(errno));
            return XFER_ERR_NO_RESOURCE;
        default:
            snprintf(why, why_size, "accept(): %s", strerror(errno));
            return XFER_ERR_IO;
        }
    }
    addr_str((const struct sockaddr*)&ss, peer, peer_size);
    sock_tune(fd);
    *fd_p = fd;
    return XFER_OK;
}

xfer_status_t xfer_sock_send_some(int fd, const void *buf, size_t len, size_t *done_p,
                                  char *why, size_t why_size)
{
    ssize_t n;

    do {
        n = send(fd, buf, len, MSG_NOSIGNAL);
    } while ((n < 0) && (errno == EINTR));
    if (n >= 0) {
        *done_p = (size_t)n;
        return XFER_OK;
    }
    if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
        *done_p = 0;
        return XFER_OK;
    }
    snprintf(why, why_size, "send: %s", strerror(errno));
    return XFER_ERR_CONNECTION;
}

xfer_status_t xfer_sock_recv_some(int fd, void *buf, size_t len, size_t *done_p,
                                  char *why, size_t why_size)
{
    ssize_t n;

    do {
        n = recv(fd, buf, len, 0);
    } while ((n < 0) && (errno == EINTR));
    if (n > 0) {
        *done_p = (size_t)n;
        return XFER_OK;
    }
    if (n == 0) {
        snprintf(why, why_size, "peer closed the connection");
        return XFER_ERR_CONNECTION;
    }
    if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
        *done_p = 0;
        return XFER_OK;
    }
    snprintf(why, why_size, "recv: %s", strerror(errno));
    return XFER_ERR_CONNECTION;
}

xfer_status_t xfer_sock_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                 char *why, size_t why_size)
{
    const char *p = buf;
    xfer_status_t status;
    size_t n;

    while (len > 0) {
        status = xfer_sock_send_some(fd, p, len, &n, why, why_size);
        if (status != XFER_OK) {
            return status;
        }
        p   += n;
        len -= n;
        if ((n == 0) &&
            ((status = xfer_sock_wait(fd, POLLOUT, deadline_ms, "send", why, why_size)) !=
             XFER_OK)) {
            return status;
        }
    }
    return XFER_OK;
}
