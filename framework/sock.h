/*
 * Blocking-with-deadline socket helpers for the bootstrap: address parsing, listen, connect,
 * and exact reads/writes that give up at a deadline instead of waiting forever.
 */
#ifndef XFER_SOCK_H
#define XFER_SOCK_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* "host:port", "[v6addr]:port" or ":port"; port 0 is allowed when allow_any_port. */
xfer_status_t xfer_sock_parse(const char *address, int allow_any_port,
                              struct sockaddr_storage *ss, socklen_t *len_p,
                              char *why, size_t why_size);
xfer_status_t xfer_sock_listen(const struct sockaddr_storage *ss, socklen_t len, int *fd_p,
                               uint16_t *port_p, char *why, size_t why_size);
xfer_status_t xfer_sock_connect(const struct sockaddr_storage *ss, socklen_t len,
                                int64_t deadline_ms, int *fd_p, char *why, size_t why_size);
/* Wait for a connection on a listening socket until the deadline. */
xfer_status_t xfer_sock_accept(int listen_fd, int64_t deadline_ms, int *fd_p,
                               char *peer, size_t peer_size, char *why, size_t why_size);
xfer_status_t xfer_sock_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                 char *why, size_t why_size);
xfer_status_t xfer_sock_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                                 char *why, size_t why_size);

#endif
