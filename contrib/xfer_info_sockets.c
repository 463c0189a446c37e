/*
 * xfer_info --sockets[=ADDRESS]: what a listener at ADDRESS opens, shown for real. For each
 * transport, one at a time (XFER_TRANSPORTS=name), this process listens at ADDRESS, connects
 * an endpoint to itself from a second context, and lists every listening socket that
 * appeared meanwhile (from /proc/self/fd): the bootstrap listener's, and those the transport
 * opened for the endpoint that came in (tcp's lane port). The client side opens none.
 */
#include "xfer_info.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_SOCKS 64

typedef struct sock_seen {
    int  fd;
    int  port;          /* -1: not an IP socket */
    char text[128];     /* its local address */
} sock_seen_t;

typedef struct dial {
    xfer_context_t  *ctx;
    const char      *address;
    xfer_endpoint_t *ep;
    xfer_status_t   status;
} dial_t;

/* The listening sockets of this process, with their local addresses. */
static int listening(sock_seen_t *out, int max)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;

    while ((d != NULL) && ((de = readdir(d)) != NULL) && (n < max)) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(int);
        int fd = atoi(de->d_name), v = 0;
        char host[INET6_ADDRSTRLEN] = "?";

        if ((de->d_name[0] == '.') || (fd == dirfd(d)) ||
            (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0) || !v) {
            continue;
        }
        len = sizeof(ss);
        if (getsockname(fd, (struct sockaddr*)&ss, &len) != 0) {
            continue;
        }
        out[n].fd   = fd;
        out[n].port = -1;
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *sin = (struct sockaddr_in*)&ss;

            inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
            out[n].port = ntohs(sin->sin_port);
            snprintf(out[n].text, sizeof(out[n].text), "tcp  %s:%d", host, out[n].port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *sin6 = (struct sockaddr_in6*)&ss;

            inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
            out[n].port = ntohs(sin6->sin6_port);
            snprintf(out[n].text, sizeof(out[n].text), "tcp  [%s]:%d", host, out[n].port);
        } else if (ss.ss_family == AF_UNIX) {
            struct sockaddr_un *sun = (struct sockaddr_un*)&ss;

            snprintf(out[n].text, sizeof(out[n].text), "unix %s%.100s",
                     (sun->sun_path[0] == '\0') ? "@" : "",
                     sun->sun_path + (sun->sun_path[0] == '\0'));
        } else {
            snprintf(out[n].text, sizeof(out[n].text), "family %d", ss.ss_family);
        }
        n++;
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

static void *dial_run(void *arg)
{
    dial_t *d = arg;

    d->status = xfer_connect(d->ctx, d->address, &d->ep);
    return NULL;
}

/* "host:port" for a client of a listener at address on port: loopback for "" and "*". */
static void client_address(const char *address, unsigned port, char *buf, size_t size)
{
    const char *colon = strrchr(address, ':');
    size_t host_len   = colon ? (size_t)(colon - address) : 0;

    if ((host_len == 0) || ((host_len == 1) && (address[0] == '*'))) {
        snprintf(buf, size, "127.0.0.1:%u", port);
    } else {
        snprintf(buf, size, "%.*s:%u", (int)host_len, address, port);
    }
}

/* One transport: 0 when it was shown, 1 when it could not serve here (said why). */
static int show_one(const char *transport, const char *address)
{
    sock_seen_t before[MAX_SOCKS], after[MAX_SOCKS];
    xfer_context_t *server = NULL, *client = NULL;
    xfer_listener_t *l = NULL;
    xfer_endpoint_t *ep = NULL;
    dial_t d = {0};
    char target[300];
    pthread_t th;
    int nb, na, ret = 1;

    setenv("XFER_TRANSPORTS", transport, 1);
    nb = listening(before, MAX_SOCKS);
    if ((tool_context(&server) != XFER_OK) || (tool_context(&client) != XFER_OK)) {
        printf("%s: no context (%s)\n", transport, xfer_last_error());
        goto out;
    }
    if (xfer_listen(server, address, &l) != XFER_OK) {
        printf("%s: cannot listen at \"%s\": %s\n", transport, address, xfer_last_error());
        goto out;
    }
    client_address(address, xfer_listener_port(l), target, sizeof(target));
    d.ctx     = client;
    d.address = target;
    if (pthread_create(&th, NULL, dial_run, &d) != 0) {
        printf("%s: cannot start a thread\n", transport);
        goto out;
    }
    (void)xfer_accept(l, 10000, &ep);
    pthread_join(th, NULL);
    if ((ep == NULL) || (d.status != XFER_OK)) {
        printf("%s: an endpoint from %s did not connect (%s)\n", transport, target,
               xfer_status_string(d.status));
        goto out;
    }
    printf("%s: a listener at \"%s\" and an endpoint that came in from %s open:\n",
           xfer_endpoint_transport(ep), address, target);
    na = listening(after, MAX_SOCKS);
    for (int i = 0; i < na; i++) {
        int old = 0;

        for (int j = 0; j < nb; j++) {
            old |= (before[j].fd == after[i].fd) && (strcmp(before[j].text, after[i].text) == 0);
        }
        if (!old) {
            printf("  %-48s %s\n", after[i].text,
                   (after[i].port == (int)xfer_listener_port(l)) ? "bootstrap listener" :
                   "transport (for endpoints that came in at this address)");
        }
    }
    ret = 0;

out:
    xfer_endpoint_close(d.ep);
    xfer_endpoint_close(ep);
    if (l != NULL) {
        xfer_listener_close(l);
    }
    xfer_context_destroy(client);
    xfer_context_destroy(server);
    return ret;
}

int info_sockets(const char *address, const char *transports)
{
    char *list = strdup(transports), *save = NULL;
    int shown = 0;

    if (list == NULL) {
        return 1;
    }
    for (char *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        shown += (show_one(t, address) == 0);
    }
    free(list);
    return (shown > 0) ? 0 : 1;
}
