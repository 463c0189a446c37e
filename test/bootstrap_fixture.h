/*
 * What the bootstrap suites share (test_bootstrap.c, test_listener.c): the test plug-ins as
 * the only transports, a listening context, an xfer client in a child process, and the check
 * of the listener's log line for a connection it closed.
 */
#ifndef XFERTEST_BOOTSTRAP_FIXTURE_H
#define XFERTEST_BOOTSTRAP_FIXTURE_H

#include <xfer/xfer.h>

#include <sys/types.h>

/* The directory of test plug-ins (talpha, tbeta) that bootstrap_setup() made. */
extern char *bootstrap_dir;

/* Criterion .init/.fini: plug-ins talpha and tbeta only (the real tcp and shm taken out),
 * XFER_BOOTSTRAP_TIMEOUT 2 s. */
void bootstrap_setup(void);
void bootstrap_teardown(void);

typedef struct listener_ctx {
    xfer_context_t  *ctx;
    xfer_listener_t *listener;
    char            address[64];
} listener_ctx_t;

void server_start(listener_ctx_t *s);
void server_stop(listener_ctx_t *s);

/* A child process that connects with xfer under its own XFER_TRANSPORTS and reports the
 * status and chosen transport through its exit code (0 = ok + transport matched). */
pid_t client_spawn(const char *address, const char *transports, const char *expect,
                   xfer_status_t expect_status);

/* The child's exit code, or 128 + the signal that ended it. */
int child_exit(pid_t pid);

/* The log line of a handshake the listener closed: who, and the status. */
void expect_closed_logged(const char *log, xfer_status_t status);

#endif
