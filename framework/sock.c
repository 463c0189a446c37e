/* Socket helpers for the bootstrap (see sock.h). */
#include "sock.h"
#include "clock.h"
#include "xfer_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

xfer_status_t xfer_sock_parse(const char *address, int allow_any_port,
                              struct sockaddr_storage *ss, socklen_t *len_p,
                              char *why, size_t why_size)
{
    struct addrinfo hints = {0}, *res = NULL;
    char host[256], *end;
    const char *colon, *port_str;
    unsigned long port;
    size_t host_len;
    int ret;

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

    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = AI_NUMERICSERV | (host_len ? 0 : AI_PASSIVE);
    ret = getaddrinfo(host_len ? host : NULL, port_str, &hints, &res);
    if ((ret != 0) || (res == NULL)) {
        snprintf(why, why_size, "'%s': cannot resolve '%s': %s", address, host,
                 gai_strerror(ret));
        return XFER_ERR_INVALID_PARAM;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    return XFER_OK;
}

static void sock_tune(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

xfer_status_t xfer_sock_listen(const struct sockaddr_storage *ss, socklen_t len, int *fd_p,
                               uint16_t *port_p, char *why, size_t why_size)
{
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof(bound);
    int one = 1, fd;

    fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, why_size, "socket(): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if ((bind(fd, (const struct sockaddr*)ss, len) != 0) || (listen(fd, 128) != 0) ||
        (getsockname(fd, (struct sockaddr*)&bound, &bound_len) != 0)) {
        snprintf(why, why_size, "bind/listen: %s", strerror(errno));
        close(fd);
        return (errno == EADDRINUSE) ? XFER_ERR_BUSY : XFER_ERR_IO;
    }
    *port_p = ntohs((bound.ss_family == AF_INET6) ?
                    ((struct sockaddr_in6*)&bound)->sin6_port :
                    ((struct sockaddr_in*)&bound)->sin_port);
    *fd_p   = fd;
    return XFER_OK;
}

/* Wait for events on fd until the deadline; XFER_ERR_TIMEOUT when it passes. */
static xfer_status_t wait_fd(int fd, short events, int64_t deadline_ms, char *why,
                             size_t why_size, const char *what)
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

xfer_status_t xfer_sock_connect(const struct sockaddr_storage *ss, socklen_t len,
                                int64_t deadline_ms, int *fd_p, char *why, size_t why_size)
{
    socklen_t err_len = sizeof(int);
    xfer_status_t status;
    int fd, err = 0;

    fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, why_size, "socket(): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    if ((connect(fd, (const struct sockaddr*)ss, len) != 0) && (errno != EINPROGRESS)) {
        err = errno;
    } else {
        status = wait_fd(fd, POLLOUT, deadline_ms, why, why_size, "connect");
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

xfer_status_t xfer_sock_accept(int listen_fd, int64_t deadline_ms, int *fd_p,
                               char *peer, size_t peer_size, char *why, size_t why_size)
{
    struct sockaddr_storage ss;
    socklen_t len;
    xfer_status_t status;
    char host[INET6_ADDRSTRLEN] = "?";
    int fd;

    for (;;) {
        len = sizeof(ss);
        fd  = accept4(listen_fd, (struct sockaddr*)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            break;
        }
        if ((errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR) &&
            (errno != ECONNABORTED)) {
            snprintf(why, why_size, "accept(): %s", strerror(errno));
            return XFER_ERR_IO;
        }
        status = wait_fd(listen_fd, POLLIN, deadline_ms, why, why_size, "accept a connection");
        if (status != XFER_OK) {
            return status;
        }
    }
    if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6*)&ss)->sin6_addr, host, sizeof(host));
        snprintf(peer, peer_size, "[%s]:%u", host,
                 ntohs(((struct sockaddr_in6*)&ss)->sin6_port));
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in*)&ss)->sin_addr, host, sizeof(host));
        snprintf(peer, peer_size, "%s:%u", host, ntohs(((struct sockaddr_in*)&ss)->sin_port));
    }
    sock_tune(fd);
    *fd_p = fd;
    return XFER_OK;
}

xfer_status_t xfer_sock_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                 char *why, size_t why_size)
{
    const char *p = buf;
    xfer_status_t status;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p   += n;
            len -= (size_t)n;
            continue;
        }
        if ((n < 0) && (errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR)) {
            snprintf(why, why_size, "send: %s", strerror(errno));
            return XFER_ERR_CONNECTION;
        }
        status = wait_fd(fd, POLLOUT, deadline_ms, why, why_size, "send");
        if (status != XFER_OK) {
            return status;
        }
    }
    return XFER_OK;
}

xfer_status_t xfer_sock_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                                 char *why, size_t why_size)
{
    char *p     = buf;
    size_t want = len;
    xfer_status_t status;

    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p   += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) {
            snprintf(why, why_size, "peer closed the connection after %zu of %zu bytes",
                     want - len, want);
            return XFER_ERR_CONNECTION;
        }
        if ((errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR)) {
            snprintf(why, why_size, "recv: %s", strerror(errno));
            return XFER_ERR_CONNECTION;
        }
        status = wait_fd(fd, POLLIN, deadline_ms, why, why_size, "receive");
        if (status != XFER_OK) {
            return status;
        }
    }
    return XFER_OK;
}
