/*
 * batch_notify: a batch of puts with a notification, the way a KV-cache mover hands pages to
 * another process. One run forks into two processes on loopback:
 *
 *   target      registers a cache of PAGES pages, sends its remote key, then waits for the
 *               notification that says which step's pages landed, and checks them at once:
 *               a notification arrives only after every byte of its batch;
 *   initiator   writes PAGES / 2 scattered pages into the target's cache with one batch,
 *               posted with the notification "step 7" and a deadline.
 *
 * Run it from the build tree: ./contrib/examples/batch_notify (XFER_TRANSPORTS=shm etc. work
 * as everywhere). It exits 0 when the target saw every page right at its notification.
 */
#include <xfer/xfer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGES     256
#define PAGE      16384
#define WAIT_MS   10000
#define TAG_RKEY  1
#define NOTE      "step 7"

static const char *who = "target";

static void check(xfer_status_t status, const char *what)
{
    if ((status != XFER_OK) && (status != XFER_INPROGRESS)) {
        fprintf(stderr, "%s: %s: %s (%s)\n", who, what, xfer_status_string(status),
                xfer_last_error());
        exit(1);
    }
}

/* Page p of the initiator's buffer goes to page 2p+1 of the target's cache. */
static size_t dest_page(size_t p)
{
    return 2 * p + 1;
}

static int target(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    uint8_t *cache = calloc(PAGES, PAGE);
    char note[64] = "";
    xfer_request_t *req = NULL;
    size_t blob_len, note_len = 0;
    xfer_status_t st;
    xfer_mem_t *mem;
    void *blob;

    check(xfer_mem_register(ctx, cache, (size_t)PAGES * PAGE, XFER_MEM_HOST, &mem), "register");
    check(xfer_rkey_pack(mem, &blob, &blob_len), "rkey_pack");
    check(xfer_tag_send(ep, TAG_RKEY, blob, blob_len, NULL, NULL, NULL, &req), "send the key");
    check(xfer_request_wait(req, WAIT_MS), "send the key");
    xfer_request_release(req);
    xfer_rkey_blob_free(blob);
    /* polling: progresses once when nothing is queued; the handler is the other way */
    do {
        st = xfer_notify_poll(ep, note, sizeof(note) - 1, &note_len);
    } while (st == XFER_ERR_NOT_FOUND);
    check(st, "notify_poll");
    note[note_len] = '\0';
    for (size_t p = 0; p < PAGES / 2; p++) {
        const uint8_t *page = cache + dest_page(p) * PAGE;

        if ((page[0] != (uint8_t)p) || (page[PAGE - 1] != (uint8_t)p)) {
            fprintf(stderr, "target: '%s' arrived before page %zu\n", note, dest_page(p));
            return 1;
        }
    }
    printf("target: '%s' arrived; all %d pages were already in place\n", note, PAGES / 2);
    check(xfer_mem_deregister(mem), "deregister");
    free(cache);
    return 0;
}

static int initiator(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    uint8_t *pages = malloc((size_t)PAGES / 2 * PAGE), blob[1024];
    xfer_batch_desc_t descs[PAGES / 2];
    xfer_request_t *req = NULL;
    xfer_batch_t *batch;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;

    who = "initiator";
    check(xfer_tag_recv(ctx, ep, TAG_RKEY, UINT64_MAX, blob, sizeof(blob), NULL, NULL, NULL,
                        &req), "receive the key");
    check(xfer_request_wait(req, WAIT_MS), "receive the key");
    check(xfer_rkey_unpack(ep, blob, xfer_request_length(req), &rkey), "rkey_unpack");
    xfer_request_release(req);
    for (size_t p = 0; p < PAGES / 2; p++) {
        memset(pages + p * PAGE, (int)p, PAGE);
        descs[p] = (xfer_batch_desc_t){p * PAGE, dest_page(p) * PAGE, PAGE};
    }
    check(xfer_mem_register(ctx, pages, (size_t)PAGES / 2 * PAGE, XFER_MEM_HOST, &mem),
          "register");
    /* checked once, posted as often as wanted */
    check(xfer_batch_create(ep, XFER_BATCH_PUT, mem, rkey, descs, PAGES / 2, &batch),
          "batch_create");
    check(xfer_batch_post(batch, NOTE, strlen(NOTE), WAIT_MS, NULL, NULL, &req), "batch_post");
    check(xfer_request_wait(req, WAIT_MS), "the batch");
    printf("initiator: %zu of %d pages landed, '%s' sent behind them over %s\n",
           xfer_request_landed(req), PAGES / 2, NOTE, xfer_endpoint_transport(ep));
    xfer_request_release(req);
    check(xfer_batch_destroy(batch), "batch_destroy");
    xfer_rkey_destroy(rkey);
    check(xfer_mem_deregister(mem), "deregister");
    free(pages);
    return 0;
}

int main(void)
{
    xfer_context_t *ctx;
    xfer_listener_t *l;
    xfer_endpoint_t *ep;
    char address[64];
    int fds[2], status, rc;
    uint16_t port = 0;
    pid_t pid;

    /* fork first: each process makes its own context; a pipe carries the port */
    if ((pipe(fds) != 0) || ((pid = fork()) < 0)) {
        perror("pipe/fork");
        return 1;
    }
    if (pid == 0) {
        who = "initiator";
        close(fds[1]);
        if (read(fds[0], &port, sizeof(port)) != (ssize_t)sizeof(port)) {
            fprintf(stderr, "initiator: no port from the target\n");
            return 1;
        }
        snprintf(address, sizeof(address), "127.0.0.1:%u", port);
        check(xfer_context_create(NULL, &ctx), "context_create");
        check(xfer_connect(ctx, address, &ep), "connect");
        rc = initiator(ctx, ep);
        xfer_endpoint_close(ep);
        xfer_context_destroy(ctx);
        return rc;
    }
    close(fds[0]);
    check(xfer_context_create(NULL, &ctx), "context_create");
    check(xfer_listen(ctx, "127.0.0.1:0", &l), "listen");
    port = xfer_listener_port(l);
    if (write(fds[1], &port, sizeof(port)) != (ssize_t)sizeof(port)) {
        perror("write");
        return 1;
    }
    close(fds[1]);
    check(xfer_accept(l, WAIT_MS, &ep), "accept");
    rc = target(ctx, ep);
    xfer_endpoint_close(ep);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
    if ((waitpid(pid, &status, 0) != pid) || !WIFEXITED(status) || (WEXITSTATUS(status) != 0)) {
        fprintf(stderr, "target: the initiator failed\n");
        rc = 1;
    }
    return rc;
}
