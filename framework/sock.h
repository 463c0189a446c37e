/*
 * Socket helpers for the bootstrap: address resolution, listen, connect (to each address a
 * name resolves to, in turn), accept, and reads and writes in two flavours - non-blocking
 * ("what the socket takes now", for the listener's handshakes) and blocking with a deadline
 * (for the client's side), so that nothing waits forever.
 */
#ifndef XFER_SOCK_H
#define XFER_SOCK_H

#include <xfer/xfer.h>

#include <netdb.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* "host:port", "[v6addr]:port", ":port" (this host's loopback addresses) or, when
 * allow_any_port (a listen), "*:port" (every interface), resolved to getaddrinfo's list of
 * stream addresses, in its order; port 0 is allowed when allow_any_port. Free the
 * list with freeaddrinfo(). XFER_ERR_INVALID_PARAM: malformed; XFER_ERR_NOT_FOUND: the name
 * does not resolve; XFER_ERR_UNAVAILABLE: the resolver cannot answer now (why: its words). */
xfer_status_t xfer_sock_resolve(const char *address, int allow_any_port,
                                struct addrinfo **list_p, char *why, size_t why_size);
/* xfer_sock_listen(): component.h, for tcp's lane ports too. */
/* Listen at address on every address it resolves to, one socket each (at most max, IPv6
 * sockets IPv6 only), all on one port: ":port" is loopback in both families, "*:port" every
 * interface in both. A family or address the host lacks is skipped while another binds. */
xfer_status_t xfer_sock_listen_at(const char *address, int *fds, unsigned max, unsigned *num_p,
                                  uint16_t *port_p, char *why, size_t why_size);
/* A connected non-blocking socket to sa, or the reason there is none by the deadline. */
xfer_status_t xfer_sock_connect(const struct sockaddr *sa, socklen_t len, int64_t deadline_ms,
                                int *fd_p, char *why, size_t why_size);
/* Try each address of list in order until one connects (e.g. "localhost" as ::1, then
 * 127.0.0.1). Each attempt gets an equal share of the time left, so that an address that
 * drops packets cannot use up the deadline of those after it. Each failure is logged at
 * debug level; why names the last one. */
xfer_status_t xfer_sock_connect_any(const struct addrinfo *list, int64_t deadline_ms,
                                    int *fd_p, char *why, size_t why_size);
/* Take one waiting connection without blocking: XFER_OK (a non-blocking socket and the
 * peer's address as text), XFER_INPROGRESS when none is waiting, or the error. */
xfer_status_t xfer_sock_accept(int listen_fd, int *fd_p, char *peer, size_t peer_size,
                               char *why, size_t why_size);
/* xfer_sock_wait(): component.h, for the components' handshakes too. */
/* Non-blocking: send or receive what the socket takes or has now, up to len bytes;
 * *done_p is how many (0 when it would block). A receive that finds the connection closed
 * fails with XFER_ERR_CONNECTION. */
xfer_status_t xfer_sock_send_some(int fd, const void *buf, size_t len, size_t *done_p,
                                  char *why, size_t why_size);
xfer_status_t xfer_sock_recv_some(int fd, void *buf, size_t len, size_t *done_p,
                                  char *why, size_t why_size);
/* Blocking: send all of buf by the deadline. */
xfer_status_t xfer_sock_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                 char *why, size_t why_size);

#endif
