/*
 * What the bootstrap suites share: see bootstrap_fixture.h.
 */
#include "bootstrap_fixture.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *bootstrap_dir;

void bootstrap_setup(void)
{
    bootstrap_dir = tu_plugin_dir((const char *[]){"talpha", "tbeta", NULL});
    setenv("XFER_COMPONENT_PATH", bootstrap_dir, 1);
    /* the real shm reaches a peer on this host and would outrank them: out too, unless a
     * test names its own list */
    setenv("XFER_TRANSPORTS", tu_without_shm(), 1);
    setenv("XFER_BOOTSTRAP_TIMEOUT", "2s", 1);
    /* what the bootstrap requires of a transport before it offers it */
    setenv("XFER_TALPHA_CAPS", "TAG,MEM_HOST", 1);
    setenv("XFER_TBETA_CAPS", "TAG,MEM_HOST", 1);
    /* negotiate among the test plug-ins: take the real tcp out by naming no interface */
    setenv("XFER_TCP_IFACE", "nosuchif0", 1);
}

void bootstrap_teardown(void)
{
    tu_dir_remove(bootstrap_dir);
}

void server_start(listener_ctx_t *s)
{
    cr_assert_eq(tu_context(0, &s->ctx), XFER_OK);
    cr_assert_eq(xfer_listen(s->ctx, "127.0.0.1:0", &s->listener), XFER_OK);
    cr_assert_gt(xfer_listener_port(s->listener), 0);
    snprintf(s->address, sizeof(s->address), "127.0.0.1:%u", xfer_listener_port(s->listener));
}

void server_stop(listener_ctx_t *s)
{
    xfer_listener_close(s->listener);
    xfer_context_destroy(s->ctx);
}

pid_t client_spawn(const char *address, const char *transports, const char *expect,
                   xfer_status_t expect_status)
{
    pid_t pid = fork();

    cr_assert_geq(pid, 0);
    if (pid == 0) {
        xfer_context_t *ctx;
        xfer_endpoint_t *ep = NULL;
        xfer_status_t status;
        int ok;

        if (transports != NULL) {
            setenv("XFER_TRANSPORTS", transports, 1);
        }
        if (tu_context(0, &ctx) != XFER_OK) {
            _exit(10);
        }
        status = xfer_connect(ctx, address, &ep);
        ok     = (status == expect_status) &&
             ((ep == NULL) || (strcmp(xfer_endpoint_transport(ep), expect) == 0));
        xfer_endpoint_close(ep);
        xfer_context_destroy(ctx);
        _exit(ok ? 0 : 20 - status);
    }
    return pid;
}

int child_exit(pid_t pid)
{
    int st;

    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void expect_closed_logged(const char *log, xfer_status_t status)
{
    char line[128];
    const char *p = strstr(log, "closing connection from 127.0.0.1:");

    cr_assert_not_null(p, "no log line for the closed connection in:\n%s", log);
    snprintf(line, sizeof(line), "(%s)\n", xfer_status_string(status));
    cr_expect(strstr(p, line) != NULL, "the log does not say '%s':\n%s", line, log);
}
