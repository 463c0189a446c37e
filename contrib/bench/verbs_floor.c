/*
 * verbs_floor: what the RDMA device itself takes for the three round trips xfer's latency
 * figures are made of, with raw verbs and nothing else, so that bench_verbs.sh can tell
 * xfer's own cost from the device's. perftest has the first two; it has no third.
 *
 *   verbs_floor [-d DEV] [-x GID_INDEX] [-n ITERS] [-w WARMUP] [-g NSEC]
 *               PATTERN A_BYTES B_BYTES
 *
 *   send    A SENDs A_BYTES, B answers with a SEND of B_BYTES; each side polls its CQ for the
 *           receive (ib_send_lat's pattern; xfer_perf -t tag_lat)
 *   write   A RDMA-WRITEs A_BYTES, B answers with a WRITE of B_BYTES; each side polls the
 *           last byte of its buffer (ib_write_lat's pattern; xfer_perf -t put_lat)
 *   fetch   A SENDs A_BYTES (a request), B answers with an RDMA WRITE WITH IMMEDIATE of
 *           B_BYTES, signalled; A polls its CQ for the immediate (a steady-state tensor fetch:
 *           xfer_perf -t tensor_lat, with A_BYTES the TENSOR_REQUEST's size)
 *
 * -g NSEC has each side spin NSEC nanoseconds between seeing the other side's message and
 * posting its own: a stand-in for the software a library runs there, to ask how the device's
 * round trip answers to it (on Soft-RoCE, not always by adding 2 x NSEC).
 *
 * The work requests are the ones xfer posts: inline up to 128 bytes (its MAX_INLINE), sends
 * signalled every 32nd (its SIGNAL_INTERVAL), one CQ per side for sends and receives. Both
 * sides run on this machine, on one device (fork; the QP numbers travel through pipes), as
 * bench_verbs.sh runs perftest and xfer_perf. It prints the median and lower quartile of the
 * round trip A measures, in microseconds:
 *
 *   fetch 92 8: rtt_median_usec 21.98 rtt_p25_usec 21.72 iters 3000
 *
 * Exit status: 0; 1 when something fails (the message says what); 2 on a usage error.
 */
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FLOOR_MAX_INLINE  128u      /* xfer's MAX_INLINE default */
#define FLOOR_SIGNAL      32u       /* xfer's SIGNAL_INTERVAL default */
#define FLOOR_RX_SLOTS    128u      /* receives kept posted */
#define FLOOR_MAX_BYTES   4096u     /* one slot; the patterns are small-message ones */
#define FLOOR_TX_OFF      0u
#define FLOOR_WR_OFF      4096u     /* where the peer's writes land */
#define FLOOR_RX_OFF      8192u     /* receive slots */
#define FLOOR_BUF_LEN     (FLOOR_RX_OFF + FLOOR_RX_SLOTS * FLOOR_MAX_BYTES)

typedef enum { PAT_SEND, PAT_WRITE, PAT_FETCH } pattern_t;

typedef struct {
    uint32_t      qpn, psn, rkey;
    uint64_t      addr;
    union ibv_gid gid;
} peer_info_t;

typedef struct {
    struct ibv_context *ctx;
    struct ibv_pd      *pd;
    struct ibv_cq      *cq;
    struct ibv_qp      *qp;
    struct ibv_mr      *mr;
    uint8_t            *buf;
    unsigned           unsignaled;
    peer_info_t        peer;
    const char         *side;
    uint64_t           gap_ns;      /* -g: spun before each post */
    int                wfd, rfd;    /* pipes to and from the other side */
} floor_t;

static int fail(const floor_t *f, const char *what, int err)
{
    fprintf(stderr, "verbs_floor (%s): %s: %s\n", f->side, what, strerror(err));
    return -1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double now_usec(void)
{
    return (double)now_ns() / 1e3;
}

/* Spin f->gap_ns nanoseconds (-g): the software between a completion and the next post. */
static void gap(const floor_t *f)
{
    uint64_t t0 = now_ns();

    while ((f->gap_ns > 0) && (now_ns() - t0 < f->gap_ns)) {
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static int open_device(floor_t *f, const char *dev_name)
{
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_qp_init_attr init;
    int i;

    if (list == NULL) {
        return fail(f, "ibv_get_device_list", errno);
    }
    for (i = 0; list[i] != NULL; i++) {
        if ((dev_name == NULL) || (strcmp(ibv_get_device_name(list[i]), dev_name) == 0)) {
            break;
        }
    }
    if (list[i] == NULL) {
        fprintf(stderr, "verbs_floor: no RDMA device%s%s\n", dev_name ? " named " : "",
                dev_name ? dev_name : "");
        ibv_free_device_list(list);
        return -1;
    }
    f->ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (f->ctx == NULL) {
        return fail(f, "ibv_open_device", errno);
    }
    if (((f->pd = ibv_alloc_pd(f->ctx)) == NULL) ||
        ((f->cq = ibv_create_cq(f->ctx, 1024, NULL, NULL, 0)) == NULL)) {
        return fail(f, "ibv_alloc_pd/ibv_create_cq", errno);
    }
    if ((f->buf = aligned_alloc(4096, FLOOR_BUF_LEN)) == NULL) {
        return fail(f, "aligned_alloc", ENOMEM);
    }
    memset(f->buf, 0, FLOOR_BUF_LEN);
    f->mr = ibv_reg_mr(f->pd, f->buf, FLOOR_BUF_LEN, IBV_ACCESS_LOCAL_WRITE |
                       IBV_ACCESS_REMOTE_WRITE);
    if (f->mr == NULL) {
        return fail(f, "ibv_reg_mr", errno);
    }
    memset(&init, 0, sizeof(init));
    init.send_cq = f->cq;
    init.recv_cq = f->cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr     = 256;
    init.cap.max_recv_wr     = FLOOR_RX_SLOTS;
    init.cap.max_send_sge    = 1;
    init.cap.max_recv_sge    = 1;
    init.cap.max_inline_data = FLOOR_MAX_INLINE;
    if ((f->qp = ibv_create_qp(f->pd, &init)) == NULL) {
        return fail(f, "ibv_create_qp", errno);
    }
    return 0;
}

static int connect_qp(floor_t *f, const peer_info_t *me, int gid_index)
{
    struct ibv_qp_attr a;
    struct ibv_port_attr port;

    if (ibv_query_port(f->ctx, 1, &port) != 0) {
        return fail(f, "ibv_query_port", errno);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state        = IBV_QPS_INIT;
    a.port_num        = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(f->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                      IBV_QP_ACCESS_FLAGS) != 0) {
        return fail(f, "ibv_modify_qp(INIT)", errno);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state              = IBV_QPS_RTR;
    a.path_mtu              = port.active_mtu;
    a.dest_qp_num           = f->peer.qpn;
    a.rq_psn                = f->peer.psn;
    a.max_dest_rd_atomic    = 1;
    a.min_rnr_timer         = 12;
    a.ah_attr.is_global     = 1;
    a.ah_attr.grh.dgid      = f->peer.gid;
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.dlid          = 0;
    a.ah_attr.port_num      = 1;
    if (ibv_modify_qp(f->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                      IBV_QP_MIN_RNR_TIMER) != 0) {
        return fail(f, "ibv_modify_qp(RTR)", errno);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state      = IBV_QPS_RTS;
    a.sq_psn        = me->psn;
    a.timeout       = 14;
    a.retry_cnt     = 6;
    a.rnr_retry     = 6;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(f->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        return fail(f, "ibv_modify_qp(RTS)", errno);
    }
    return 0;
}

static int post_recv(floor_t *f, uint64_t slot)
{
    struct ibv_sge sge = {
        .addr   = (uintptr_t)(f->buf + FLOOR_RX_OFF + slot * FLOOR_MAX_BYTES),
        .length = FLOOR_MAX_BYTES,
        .lkey   = f->mr->lkey,
    };
    struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
    int ret = ibv_post_recv(f->qp, &wr, &bad);

    return (ret == 0) ? 0 : fail(f, "ibv_post_recv", ret);
}

/* Post one work request as xfer would: inline when small, signalled every FLOOR_SIGNAL-th
 * send and always for RDMA operations. */
static int post(floor_t *f, enum ibv_wr_opcode opcode, size_t len, uint32_t imm)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)(f->buf + FLOOR_TX_OFF), .length = (uint32_t)len, .lkey = f->mr->lkey,
    };
    struct ibv_send_wr wr, *bad;
    int ret;

    gap(f);
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = (len > 0) ? 1 : 0;
    wr.opcode  = opcode;
    if (len <= FLOOR_MAX_INLINE) {
        wr.send_flags = IBV_SEND_INLINE;
    }
    if ((opcode != IBV_WR_SEND) || (++f->unsignaled >= FLOOR_SIGNAL)) {
        wr.send_flags |= IBV_SEND_SIGNALED;
        f->unsignaled  = 0;
    }
    wr.wr.rdma.remote_addr = f->peer.addr + FLOOR_WR_OFF;
    wr.wr.rdma.rkey        = f->peer.rkey;
    wr.imm_data            = htonl(imm);
    ret = ibv_post_send(f->qp, &wr, &bad);
    return (ret == 0) ? 0 : fail(f, "ibv_post_send", ret);
}

/* Poll the CQ: send completions are taken on the way; with want_recv, return once a receive
 * (or an immediate) has arrived, its slot posted again. */
static int poll_cq(floor_t *f, int want_recv)
{
    struct ibv_wc wc[16];

    for (;;) {
        int n = ibv_poll_cq(f->cq, 16, wc), got = 0;

        if (n < 0) {
            return fail(f, "ibv_poll_cq", EIO);
        }
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) {
                fprintf(stderr, "verbs_floor (%s): completion error: %s\n", f->side,
                        ibv_wc_status_str(wc[i].status));
                return -1;
            }
            if (wc[i].opcode & IBV_WC_RECV) {
                if (post_recv(f, wc[i].wr_id) != 0) {
                    return -1;
                }
                got++;
            }
        }
        if (got > 1) {
            fprintf(stderr, "verbs_floor (%s): %d receives at once in a ping-pong\n", f->side,
                    got);
            return -1;
        }
        if (!want_recv || got) {
            return 0;
        }
    }
}

/* Wait for the peer's write: the last byte of what it writes changes to v. */
static int wait_byte(floor_t *f, size_t len, uint8_t v)
{
    volatile uint8_t *last = f->buf + FLOOR_WR_OFF + len - 1;

    do {    /* at least once: the write's own completion is taken here */
        if (poll_cq(f, 0) != 0) {
            return -1;
        }
    } while (*last != v);
    return 0;
}

/* One side's part of iteration i; A times it. */
static int step(floor_t *f, int is_a, pattern_t pat, size_t a_len, size_t b_len, uint8_t v)
{
    if (is_a) {
        if (pat == PAT_WRITE) {
            f->buf[FLOOR_TX_OFF + a_len - 1] = v;
            return (post(f, IBV_WR_RDMA_WRITE, a_len, 0) != 0) ? -1 : wait_byte(f, b_len, v);
        }
        return (post(f, IBV_WR_SEND, a_len, 0) != 0) ? -1 : poll_cq(f, 1);
    }
    switch (pat) {
    case PAT_WRITE:
        if (wait_byte(f, a_len, v) != 0) {
            return -1;
        }
        f->buf[FLOOR_TX_OFF + b_len - 1] = v;
        return post(f, IBV_WR_RDMA_WRITE, b_len, 0);
    case PAT_SEND:
        return (poll_cq(f, 1) != 0) ? -1 : post(f, IBV_WR_SEND, b_len, 0);
    default:
        return (poll_cq(f, 1) != 0) ? -1 : post(f, IBV_WR_RDMA_WRITE_WITH_IMM, b_len, v);
    }
}

/* Send len bytes to the other side and take as many from it (through the pipes). */
static int xchg(const floor_t *f, const void *out, void *in, size_t len)
{
    if ((write(f->wfd, out, len) == (ssize_t)len) && (read(f->rfd, in, len) == (ssize_t)len)) {
        return 0;
    }
    fprintf(stderr, "verbs_floor (%s): the other side is gone\n", f->side);
    return -1;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: verbs_floor [-d DEV] [-x GID_INDEX] [-n ITERS] [-w WARMUP] "
                 "[-g NSEC] send|write|fetch A_BYTES B_BYTES\n"
                 "  send   SEND of A_BYTES, answered by a SEND of B_BYTES\n"
                 "  write  RDMA WRITE of A_BYTES, answered by a WRITE of B_BYTES (memory polled)\n"
                 "  fetch  SEND of A_BYTES, answered by a WRITE WITH IMMEDIATE of B_BYTES\n"
                 "  -g     spin NSEC before each post (software between a completion and a post)\n"
                 "Prints the median and lower quartile of the round trip, in usec.\n");
}

int main(int argc, char **argv)
{
    const char *dev = NULL;
    int gid_index = 1, iters = 3000, warmup = 200, opt, to_b[2], to_a[2], is_a, ret = 1;
    long gap_ns = 0;
    size_t a_len, b_len;
    pattern_t pat;
    floor_t f;
    peer_info_t me;
    double *rtt = NULL;
    pid_t pid;
    char c = 0;

    while ((opt = getopt(argc, argv, "d:x:n:w:g:h")) != -1) {
        switch (opt) {
        case 'd': dev = optarg; break;
        case 'x': gid_index = atoi(optarg); break;
        case 'n': iters = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'g': gap_ns = atol(optarg); break;
        case 'h': usage(stdout); return 0;
        default:  usage(stderr); return 2;
        }
    }
    if (argc - optind != 3) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[optind], "send") == 0) {
        pat = PAT_SEND;
    } else if (strcmp(argv[optind], "write") == 0) {
        pat = PAT_WRITE;
    } else if (strcmp(argv[optind], "fetch") == 0) {
        pat = PAT_FETCH;
    } else {
        fprintf(stderr, "verbs_floor: unknown pattern '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    a_len = strtoul(argv[optind + 1], NULL, 0);
    b_len = strtoul(argv[optind + 2], NULL, 0);
    if ((a_len > FLOOR_MAX_BYTES) || (b_len > FLOOR_MAX_BYTES) || (iters < 4) || (warmup < 0) ||
        (gap_ns < 0) || ((pat == PAT_WRITE) && ((a_len == 0) || (b_len == 0)))) {
        fprintf(stderr, "verbs_floor: sizes 0..%u (1.. for write), at least 4 iterations, "
                "-g 0 or more\n", FLOOR_MAX_BYTES);
        return 2;
    }
    if ((pipe(to_b) != 0) || (pipe(to_a) != 0)) {
        perror("verbs_floor: pipe");
        return 1;
    }
    pid = fork();
    if (pid < 0) {
        perror("verbs_floor: fork");
        return 1;
    }
    is_a = (pid != 0);
    memset(&f, 0, sizeof(f));
    f.side   = is_a ? "A" : "B";
    f.gap_ns = (uint64_t)gap_ns;
    f.wfd  = is_a ? to_b[1] : to_a[1];
    f.rfd  = is_a ? to_a[0] : to_b[0];
    if (open_device(&f, dev) != 0) {
        goto out;
    }
    memset(&me, 0, sizeof(me));
    me.qpn  = f.qp->qp_num;
    me.psn  = ((uint32_t)getpid() * 2654435761u) & 0xffffffu;
    me.rkey = f.mr->rkey;
    me.addr = (uintptr_t)f.buf;
    if (ibv_query_gid(f.ctx, 1, gid_index, &me.gid) != 0) {
        fail(&f, "ibv_query_gid", errno);
        goto out;
    }
    if (xchg(&f, &me, &f.peer, sizeof(me)) != 0) {
        goto out;
    }
    if (connect_qp(&f, &me, gid_index) != 0) {
        goto out;
    }
    for (uint64_t s = 0; s < FLOOR_RX_SLOTS; s++) {
        if (post_recv(&f, s) != 0) {
            goto out;
        }
    }
    /* both QPs are ready to receive before either sends */
    if (xchg(&f, &c, &c, 1) != 0) {
        goto out;
    }
    if (is_a && ((rtt = calloc((size_t)iters, sizeof(*rtt))) == NULL)) {
        fail(&f, "calloc", ENOMEM);
        goto out;
    }
    for (int i = -warmup; i < iters; i++) {
        uint8_t v = (uint8_t)(1 + (i + warmup) % 255);   /* never 0, never twice in a row */
        double t0 = now_usec();

        if (step(&f, is_a, pat, a_len, b_len, v) != 0) {
            goto out;
        }
        if (is_a && (i >= 0)) {
            rtt[i] = now_usec() - t0;
        }
    }
    if (is_a) {
        qsort(rtt, (size_t)iters, sizeof(*rtt), cmp_double);
        printf("%s %zu %zu: rtt_median_usec %.2f rtt_p25_usec %.2f iters %d\n", argv[optind],
               a_len, b_len, rtt[iters / 2], rtt[iters / 4], iters);
    }
    /* the last answer may still be in flight to A: B leaves only once A has it */
    if (xchg(&f, &c, &c, 1) != 0) {
        goto out;
    }
    ret = 0;
out:
    free(rtt);
    if (f.qp != NULL) {
        ibv_destroy_qp(f.qp);
    }
    if (f.mr != NULL) {
        ibv_dereg_mr(f.mr);
    }
    free(f.buf);
    if (f.cq != NULL) {
        ibv_destroy_cq(f.cq);
    }
    if (f.pd != NULL) {
        ibv_dealloc_pd(f.pd);
    }
    if (f.ctx != NULL) {
        ibv_close_device(f.ctx);
    }
    if (is_a) {
        int status = 0;

        if (ret != 0) {
            kill(pid, SIGTERM);
        }
        if ((waitpid(pid, &status, 0) == pid) && (!WIFEXITED(status) ||
                                                   (WEXITSTATUS(status) != 0)) && (ret == 0)) {
            fprintf(stderr, "verbs_floor: side B failed\n");
            ret = 1;
        }
    }
    return ret;
}
