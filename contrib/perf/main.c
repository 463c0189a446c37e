/*
 * xfer_perf: bandwidth and latency between two processes over xfer, like ib_write_bw /
 * ib_write_lat and ucx_perftest.
 *
 *   xfer_perf [-p PORT] [-x TRANSPORTS]       server: serves one client, then exits
 *   xfer_perf [options] HOST                  client: runs the test and prints the table
 *
 * The server skips, with a line on stderr, connections that fail their handshake and clients
 * that send no valid parameters: a port scanner does not end a benchmark.
 *
 * Before each message size the client sends the test parameters to the server in a tag
 * message, so the server needs no options but -p (and -x to restrict what it offers).
 *
 * What the columns mean (MB = 10^6 bytes; BW average = bytes * iterations / time, MsgRate =
 * iterations / time):
 *   put_bw, get_bw, tag_bw, tensor_bw   WINDOW operations are kept in flight; the clock runs on
 *       the client from the first timed operation until the server has acknowledged the end
 *       (a final tag handshake), so it covers completion at the peer. t_typical and t_99% are
 *       the median and 99th percentile of the time between consecutive completions; t_avg is
 *       the whole time divided by the iterations.
 *   tag_lat      ping-pong of tagged messages; t_* is half the round trip.
 *   put_lat      ping-pong of puts, like ib_write_lat: each side puts into the other's buffer and
 *       waits - calling xfer_progress() - for the last byte of its own buffer to change;
 *       t_* is half the round trip. (It relies on the last byte landing last, as ib_write_lat
 *       does; -V checks the rest of the buffer once the last byte has changed.)
 *   tensor_lat   the server keeps (step i, "perf") published ahead; t_* is one whole fetch on
 *       the client - request to the producer and data back into a registered buffer - not
 *       halved.
 *   For latency tests BW average = bytes / t_avg and MsgRate = 1 / t_avg.
 *   batch_put, batch_get   WINDOW batches (default 1) of -b blocks of -s bytes in flight, each
 *       a list prepared once and posted again and again (batch.c); BW counts the blocks'
 *       bytes over the same clock as the bandwidth tests, MsgRate the descriptors; t_* is one
 *       batch from its post to its completion; post is the time inside xfer_batch_post per
 *       descriptor; notify_* the time from the client's post to the notification taken at
 *       the server.
 *
 * -V fills every buffer with a pattern that depends on the iteration and the offset and checks
 * it where it lands; figures taken with -V include that work.
 *
 * -m cuda puts a side's buffers in CUDA device memory (cuda_mem.c), registered as
 * XFER_MEM_CUDA; -V fills and checks them through host copies. The client's -m names both
 * sides and travels in PARAMS, as ucx_perftest's server takes the client's parameters; each
 * side picks its own GPU (--cuda-device). A side whose memory cannot take its part of a test
 * (the target of a put or get over a transport that cannot reach cuda memory: no remote key
 * exists for it) refuses it before it starts, saying why (control.c).
 *
 * Exit status: 0; 1 on an error or a verification failure (the message says which); 2 on a
 * usage error.
 *
 * This file creates the context, runs the client's or the server's side and cleans up; perf.h
 * says where the other parts live.
 */
#include "perf.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    static perf_t perf;     /* large (the result rows): not on the stack */
    xfer_status_t st;
    int ret;

    ret = perf_options_parse(argc, argv, &perf.opts);
    if (ret != 0) {
        return ret;
    }
    /* the client's CUDA buffers need the driver: without one, say so before connecting
     * (the server loads it when a client asks for cuda memory on its side) */
    if (perf.opts.host != NULL && perf.opts.mem[SIDE_CLIENT] == PERF_MEM_CUDA) {
        char why[512];

        if (perf_cuda_open(perf.opts.cuda_device, why, sizeof(why)) != 0) {
            fprintf(stderr, "xfer_perf: -m cuda: %s\n", why);
            return 1;
        }
    }
    /* the client's offer restricts the negotiation; the server's what it accepts */
    if (perf.opts.transports != NULL && setenv("XFER_TRANSPORTS", perf.opts.transports, 1) != 0) {
        perror("xfer_perf: setenv");
        return 1;
    }
    {
        xfer_context_params_t params = {
            .size  = sizeof(params),
            .flags = perf.opts.multi ? 0 : XFER_CONTEXT_FLAG_SERIALIZED};

        st = xfer_context_create(&params, &perf.ctx);
    }
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: cannot create a context: %s%s\n", xfer_status_string(st),
                (st == XFER_ERR_INVALID_PARAM) ? " (check the XFER_* environment and -x; with "
                "XFER_PROGRESS_THREAD=y use -T multi)" : "");
        return 1;
    }

    perf_runs_plan(&perf.opts, perf.runs, &perf.nruns);
    ret = (perf.opts.host != NULL) ? perf_client_run(&perf) : perf_server_run(&perf);

    /* after an error requests may be pending: closing the endpoint cancels them first */
    perf_buffers_release_requests(&perf);
    if (perf.ctrl_req != NULL) {
        xfer_request_release(perf.ctrl_req);
    }
    if (perf.ep != NULL) {
        xfer_endpoint_close(perf.ep);
    }
    perf_buffers_release(&perf);
    if (perf.listener != NULL) {
        xfer_listener_close(perf.listener);
    }
    xfer_context_destroy(perf.ctx);
    perf_buffers_free(&perf);
    perf_cuda_close();
    return (ret == 0) ? 0 : 1;
}
