/*
 * Writes the fuzz harnesses' seed inputs, each made by the real encoders, into
 * DIR/<harness>/<seed> (make fuzz-corpus writes test/fuzz/corpus). Deterministic: running it
 * again gives the same files. A seed is a valid input of the kind its harness reads; the
 * fuzzer mutates from there.
 */
#include "fuzz_shm_ring.h"
#include "fuzz_tcp_stream.h"
#include "rkey_env.h"
#include "../../framework/wire/bootstrap_wire.h"
#include "../../components/tcp/tcp_wire.h"
#include "../../components/verbs/verbs_wire.h"
#include "../../components/verbs/tensor_wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One seed being built. */
typedef struct seed {
    uint8_t buf[65536];
    size_t  len;
} seed_t;

static const char *out_dir;
static seed_t s;

static void fail(const char *what)
{
    fprintf(stderr, "gen_corpus: %s\n", what);
    exit(1);
}

static void *room(size_t n)
{
    if (s.len + n > sizeof(s.buf)) {
        fail("seed too large");
    }
    s.len += n;
    return s.buf + s.len - n;
}

static void add(const void *p, size_t n)
{
    memcpy(room(n), p, n);
}

static void save(const char *harness, const char *name)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", out_dir, harness);
    if ((mkdir(path, 0755) != 0) && (errno != EEXIST)) {
        fail(path);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", out_dir, harness, name);
    f = fopen(path, "wb");
    if ((f == NULL) || (fwrite(s.buf, 1, s.len, f) != s.len) || (fclose(f) != 0)) {
        fail(path);
    }
    s.len = 0;
}

/* ---- bootstrap ------------------------------------------------------------------------------ */

static void boot_frame(xfer_status_t status)
{
    if (status != XFER_OK) {
        fail("bootstrap frame");
    }
}

static void add_hello(const char *const *names, unsigned num)
{
    static xfer_wire_hello_t h;
    size_t len = sizeof(s.buf) - s.len;

    memset(&h, 0, sizeof(h));
    h.num = (uint16_t)num;
    for (unsigned i = 0; i < num; i++) {
        snprintf(h.transports[i].name, sizeof(h.transports[i].name), "%s", names[i]);
        h.transports[i].addr_len = (uint16_t)(8 * i);
        memset(h.transports[i].addr, 'a' + (int)i, h.transports[i].addr_len);
    }
    boot_frame(xfer_wire_pack_hello(&h, s.buf + s.len, &len));
    s.len += len;
}

static void add_accept(const char *name)
{
    size_t len = sizeof(s.buf) - s.len;

    boot_frame(xfer_wire_pack_accept(name, s.buf + s.len, &len));
    s.len += len;
}

static void add_connect(uint64_t id)
{
    static xfer_wire_connect_t c;
    xfer_tcp_wire_ep_addr_t lim = {{TS_MAX_MSG, TS_MAX_KEY}, 1, 0, 0};
    size_t len = sizeof(s.buf) - s.len;

    memset(&c, 0, sizeof(c));
    c.context_id = id;
    c.addr_len   = XFER_TCP_WIRE_EP_ADDR_LEN;
    xfer_tcp_wire_pack_ep_addr(&lim, c.addr);
    boot_frame(xfer_wire_pack_connect(&c, s.buf + s.len, &len));
    s.len += len;
}

static void gen_bootstrap(void)
{
    static const char *const client[] = {"verbs", "tcp"}, *const server[] = {"tcp", "gdr"};
    size_t len;

    add_hello(client, 2);
    save("bootstrap_wire", "hello");
    add_accept("tcp");
    save("bootstrap_wire", "accept");
    len = sizeof(s.buf);
    boot_frame(xfer_wire_pack_reject(XFER_ERR_UNREACHABLE, "no shared transport: client "
                                     "offered verbs; server offered tcp", s.buf, &len));
    s.len = len;
    save("bootstrap_wire", "reject");
    add_connect(0x1122334455667788ull);
    save("bootstrap_wire", "connect");
    add_hello(client, 2);
    add_hello(server, 2);
    add_accept("tcp");
    add_connect(1);
    add_connect(2);
    save("bootstrap_wire", "exchange");
}

/* ---- tcp frames ----------------------------------------------------------------------------- */

static void tcp_hdr(unsigned type, int32_t status, uint64_t id, uint64_t length)
{
    xfer_tcp_wire_hdr_t h = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION, (uint8_t)type, status,
                             id, length, 0};

    xfer_tcp_wire_pack_hdr(&h, room(XFER_TCP_WIRE_HDR_LEN));
}

static void fill(size_t n, uint8_t v)
{
    memset(room(n), v, n);
}

static void tcp_tag(uint64_t tag, size_t len)
{
    tcp_hdr(XFER_TCP_WIRE_TAG, 0, tag, len);
    fill(len, 't');
}

static void tcp_put(uint64_t region, uint64_t cookie, uint64_t addr, size_t len)
{
    xfer_tcp_wire_rma_t r = {region, cookie, addr, len};

    tcp_hdr(XFER_TCP_WIRE_PUT_REQ, 0, 7, XFER_TCP_WIRE_PUT_EXT_LEN + len);
    xfer_tcp_wire_pack_put_ext(&r, room(XFER_TCP_WIRE_PUT_EXT_LEN));
    fill(len, 'p');
}

/* An unacknowledged PUT: its id is its rank among the peer's PUTs (1, 2, ...). */
static void tcp_put_noack(uint64_t id, uint64_t region, uint64_t cookie, uint64_t addr,
                          size_t len)
{
    xfer_tcp_wire_rma_t r = {region, cookie, addr, len};

    tcp_hdr(XFER_TCP_WIRE_PUT, 0, id, XFER_TCP_WIRE_PUT_EXT_LEN + len);
    xfer_tcp_wire_pack_put_ext(&r, room(XFER_TCP_WIRE_PUT_EXT_LEN));
    fill(len, 'q');
}

/* A PUTV of n blocks of len bytes, block i at addr + i * stride; its id is its PUT rank. */
static void tcp_putv(uint64_t id, uint64_t region, uint64_t cookie, uint64_t addr,
                     uint64_t stride, uint32_t n, size_t len)
{
    xfer_tcp_wire_putv_t v = {region, cookie, n};
    uint8_t *table;

    tcp_hdr(XFER_TCP_WIRE_PUTV, 0, id, XFER_TCP_WIRE_PUTV_EXT_LEN +
            (uint64_t)n * XFER_TCP_WIRE_PUTV_DESC_LEN + (uint64_t)n * len);
    xfer_tcp_wire_pack_putv_ext(&v, room(XFER_TCP_WIRE_PUTV_EXT_LEN));
    table = room((size_t)n * XFER_TCP_WIRE_PUTV_DESC_LEN);
    for (uint32_t i = 0; i < n; i++) {
        xfer_tcp_wire_pack_putv_desc(table, i, addr + i * stride, len);
    }
    fill((size_t)n * len, 'v');
}

static void tcp_get(uint64_t region, uint64_t cookie, uint64_t addr, size_t len)
{
    xfer_tcp_wire_rma_t r = {region, cookie, addr, len};

    tcp_hdr(XFER_TCP_WIRE_GET_REQ, 0, 8, XFER_TCP_WIRE_GET_EXT_LEN);
    xfer_tcp_wire_pack_get_ext(&r, room(XFER_TCP_WIRE_GET_EXT_LEN));
}

static void tcp_tensor_req(uint64_t id, uint64_t step, const char *key)
{
    xfer_tcp_wire_tensor_req_t r = {step, (uint32_t)strlen(key)};

    tcp_hdr(XFER_TCP_WIRE_TENSOR_REQ, 0, id, XFER_TCP_WIRE_TREQ_EXT_LEN + r.key_len);
    xfer_tcp_wire_pack_tensor_req_ext(&r, room(XFER_TCP_WIRE_TREQ_EXT_LEN));
    add(key, r.key_len);
}

/* A TENSOR_RESP: status 0 with a tensor of dtype and dims (rank of them), or an error with
 * a reason. */
static void tcp_tensor_resp(uint64_t id, int32_t status, unsigned dtype, unsigned rank,
                            const int64_t *dims, int is_dead, const char *reason)
{
    xfer_tcp_wire_tensor_resp_t r;
    uint64_t elems = 1, data;

    memset(&r, 0, sizeof(r));
    if (status == 0) {
        r.dtype   = (uint16_t)dtype;
        r.rank    = (uint8_t)rank;
        r.is_dead = (uint8_t)is_dead;
        for (unsigned i = 0; i < rank; i++) {
            r.dims[i] = dims[i];
            elems    *= (uint64_t)dims[i];
        }
        r.size = is_dead ? 0 : elems * xfer_dtype_size((xfer_dtype_t)dtype);
    } else {
        r.reason_len = (uint32_t)strlen(reason);
    }
    tcp_hdr(XFER_TCP_WIRE_TENSOR_RESP, status, id, XFER_TCP_WIRE_TRESP_EXT_LEN + r.reason_len +
            r.size);
    xfer_tcp_wire_pack_tensor_resp_ext(&r, room(XFER_TCP_WIRE_TRESP_EXT_LEN));
    add(reason ? reason : "", r.reason_len);
    data = r.size;
    fill((size_t)data, 'd');
}

static const int64_t dims_2x3[] = {2, 3}, dims_4[] = {4}, dims_32[] = {32};

static void gen_tcp_wire(void)
{
    xfer_tcp_wire_rkey_t k = {TS_REGION_ID, TS_COOKIE, TS_REGION_ADDR, TS_REGION_LEN};
    xfer_tcp_wire_ep_addr_t addr = {{TS_MAX_MSG, TS_MAX_KEY}, 4, 40000, 0x0123456789abcdefull};

    tcp_tag(5, 11);
    save("tcp_wire", "tag");
    tcp_put(1, 2, 0x1000, 16);
    save("tcp_wire", "put_req");
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, XFER_ERR_OUT_OF_RANGE, 7, 0);
    save("tcp_wire", "put_ack");
    tcp_get(1, 2, 0x1000, 16);
    save("tcp_wire", "get_req");
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, 0, 8, 16);
    fill(16, 'g');
    save("tcp_wire", "get_resp");
    tcp_tensor_req(9, 3, "weights");
    save("tcp_wire", "tensor_req");
    tcp_tensor_resp(9, 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0, NULL);
    save("tcp_wire", "tensor_resp");
    tcp_tensor_resp(9, XFER_ERR_NOT_FOUND, 0, 0, NULL, 0, "no such tensor");
    save("tcp_wire", "tensor_resp_error");
    tcp_tensor_resp(9, 0, XFER_DTYPE_INT8, 1, dims_4, 1, NULL);
    save("tcp_wire", "tensor_resp_dead");
    tcp_hdr(XFER_TCP_WIRE_TENSOR_CANCEL, 0, 9, 0);
    save("tcp_wire", "tensor_cancel");
    tcp_put_noack(1, 1, 2, 0x1000, 16);
    save("tcp_wire", "put");
    tcp_putv(1, 1, 2, 0x1000, 64, 3, 16);
    save("tcp_wire", "putv");
    tcp_hdr(XFER_TCP_WIRE_PUT_FAIL, XFER_ERR_INVALID_PARAM, 1, 0);
    save("tcp_wire", "put_fail");
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 1, 0);
    save("tcp_wire", "flush_req");
    tcp_hdr(XFER_TCP_WIRE_FLUSH_ACK, 0, 1, 0);
    save("tcp_wire", "flush_ack");
    xfer_tcp_wire_pack_rkey(&k, room(XFER_TCP_WIRE_RKEY_LEN));
    save("tcp_wire", "rkey");
    xfer_tcp_wire_pack_ep_addr(&addr, room(XFER_TCP_WIRE_EP_ADDR_LEN));
    save("tcp_wire", "ep_addr");
    {
        xfer_tcp_wire_lane_hello_t hello = {1, 0x0123456789abcdefull};

        xfer_tcp_wire_pack_lane_hello(&hello, room(XFER_TCP_WIRE_LANE_HELLO_LEN));
        save("tcp_wire", "lane_hello");
    }
}

/* ---- the tcp stream: frames that meet what fuzz_tcp_stream.c set up ------------------------- */

/* A good answer to each request the harness has outstanding. */
static void answer_all(void)
{
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, 0, TS_ID(TS_SLOT_PUT_SMALL), 0);
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, 0, TS_ID(TS_SLOT_PUT_LARGE), 0);
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, 0, TS_ID(TS_SLOT_GET), TS_GET_LEN);
    fill(TS_GET_LEN, 'g');
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0, NULL);
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_ALLOC), 0, XFER_DTYPE_FLOAT64, 1, dims_4, 0, NULL);
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_CANCELLED), XFER_ERR_CANCELED, 0, 0, NULL, 0, "gone");
}

static void gen_tcp_stream(void)
{
    const uint64_t base = TS_REGION_ADDR;

    tcp_tag(TS_TAG_EXACT, 10);
    save("tcp_stream", "tag_exact");
    tcp_tag(TS_TAG_ANY_PEER, 100);
    save("tcp_stream", "tag_truncated");
    tcp_tag(77, 12);
    tcp_tag(78, 0);
    save("tcp_stream", "tag_any");
    tcp_tag(TS_TAG_ANY_PEER, 1);
    tcp_tag(TS_TAG_ANY_PEER, 2);
    tcp_tag(TS_TAG_EXACT, 3);
    tcp_tag(TS_TAG_EXACT, 4);
    tcp_tag(300, 40);
    save("tcp_stream", "tag_unexpected");
    /* with every request answered, unexpected messages beyond the limit pause the input */
    answer_all();
    tcp_tag(301, 8);
    tcp_tag(302, 3000);
    tcp_tag(303, 2000);
    tcp_tag(TS_TAG_EXACT, 5);
    save("tcp_stream", "tag_pause");

    tcp_put(TS_REGION_ID, TS_COOKIE, base + 16, 32);
    save("tcp_stream", "put");
    tcp_put(TS_REGION_ID, TS_COOKIE, base + 100, 600);
    save("tcp_stream", "put_large");
    tcp_put(TS_REGION_ID, TS_COOKIE, base + TS_REGION_LEN - 8, 32);
    tcp_put(TS_REGION_ID, TS_COOKIE ^ 1, base, 8);
    tcp_put(TS_REGION_ID + 1, TS_COOKIE, base, 8);
    save("tcp_stream", "put_refused");
    /* unacknowledged puts, refused ones answered with PUT_FAIL, then a flush's FLUSH_REQ */
    tcp_put_noack(1, TS_REGION_ID, TS_COOKIE, base + 16, 32);
    tcp_put_noack(2, TS_REGION_ID, TS_COOKIE, base + 100, 600);
    tcp_put_noack(3, TS_REGION_ID + 1, TS_COOKIE, base, 8);
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 1, 0);
    tcp_put_noack(4, TS_REGION_ID, TS_COOKIE, base, 8);
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 2, 0);
    save("tcp_stream", "put_noack_flush");
    tcp_put_noack(2, TS_REGION_ID, TS_COOKIE, base, 8);
    save("tcp_stream", "put_noack_bad_id");
    /* a batch's small puts in one frame: into the region, then one refused (a block past it:
     * nothing of it is written, PUT_FAIL), then one whose rank is wrong */
    tcp_putv(1, TS_REGION_ID, TS_COOKIE, base + 16, 256, 4, 100);
    tcp_putv(2, TS_REGION_ID, TS_COOKIE, base + TS_REGION_LEN - 300, 200, 2, 100);
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 1, 0);
    save("tcp_stream", "putv");
    tcp_putv(5, TS_REGION_ID, TS_COOKIE, base, 64, 2, 8);
    save("tcp_stream", "putv_bad_id");
    tcp_hdr(XFER_TCP_WIRE_FLUSH_ACK, 0, 1, 0);
    save("tcp_stream", "flush_ack_unasked");
    /* a striped frame on a connection that has no lanes */
    tcp_hdr(XFER_TCP_WIRE_TAG, 2, 1, 8);     /* status field: 2 lanes */
    s.buf[s.len - XFER_TCP_WIRE_HDR_LEN + 3] |= XFER_TCP_WIRE_STRIPED;
    fill(8, 0x5a);
    save("tcp_stream", "striped_without_lanes");
    tcp_hdr(XFER_TCP_WIRE_PUT_FAIL, XFER_ERR_INVALID_PARAM, 1, 0);
    save("tcp_stream", "put_fail_unasked");
    tcp_get(TS_REGION_ID, TS_COOKIE, base + 8, 16);
    save("tcp_stream", "get");
    tcp_get(TS_REGION_ID, TS_COOKIE, base, TS_REGION_LEN);
    save("tcp_stream", "get_large");
    tcp_get(TS_REGION_ID, TS_COOKIE, base + 1, TS_REGION_LEN);
    tcp_get(TS_REGION_ID, 0, base, 1);
    save("tcp_stream", "get_refused");

    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, 0, TS_ID(TS_SLOT_PUT_SMALL), 0);
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, XFER_ERR_OUT_OF_RANGE, TS_ID(TS_SLOT_PUT_LARGE), 0);
    save("tcp_stream", "put_ack");
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, 0, TS_ID(TS_SLOT_GET), TS_GET_LEN);
    fill(TS_GET_LEN, 'g');
    save("tcp_stream", "get_resp");
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, XFER_ERR_INVALID_PARAM, TS_ID(TS_SLOT_GET), 0);
    save("tcp_stream", "get_resp_error");

    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0, NULL);
    save("tcp_stream", "fetch_buf");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), 0, XFER_DTYPE_FLOAT32, 1, dims_32, 0, NULL);
    save("tcp_stream", "fetch_truncated");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_ALLOC), 0, XFER_DTYPE_FLOAT64, 1, dims_4, 0, NULL);
    save("tcp_stream", "fetch_alloc");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_ALLOC), 0, XFER_DTYPE_INT8, 1, dims_4, 1, NULL);
    save("tcp_stream", "fetch_dead");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), XFER_ERR_NOT_FOUND, 0, 0, NULL, 0,
                    "no tensor of that key");
    save("tcp_stream", "fetch_error");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_CANCELLED), 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0,
                    NULL);
    save("tcp_stream", "fetch_tombstone");

    tcp_tensor_req(100, 1, "ok");
    tcp_tensor_req(101, 1, "e");
    tcp_tensor_req(102, 1, "d");
    tcp_tensor_req(103, 1, "b");
    save("tcp_stream", "tensor_req");
    tcp_tensor_req(104, 2, "l1");
    tcp_tensor_req(105, 2, "l2");
    tcp_hdr(XFER_TCP_WIRE_TENSOR_CANCEL, 0, 104, 0);
    tcp_hdr(XFER_TCP_WIRE_TENSOR_CANCEL, 0, 100, 0);
    save("tcp_stream", "tensor_req_later");

    /* everything that leaves the endpoint working, in one stream */
    tcp_tag(TS_TAG_EXACT, 10);
    tcp_tag(TS_TAG_ANY_PEER, 20);
    tcp_tag(55, 3);
    tcp_put(TS_REGION_ID, TS_COOKIE, base + 16, 32);
    tcp_get(TS_REGION_ID, TS_COOKIE, base, 512);
    answer_all();
    tcp_tensor_req(200, 5, "x");
    tcp_tensor_req(201, 5, "later");
    save("tcp_stream", "session");

    /* failures: a wrong magic, and a response nobody asked for */
    tcp_tag(TS_TAG_EXACT, 4);
    add("GARBAGE GARBAGE GARBAGE!", 24);
    save("tcp_stream", "garbage");
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, 0, TS_ID(40), 0);
    save("tcp_stream", "unknown_id");
}

/* ---- verbs ---------------------------------------------------------------------------------- */

static void verbs_hdr(unsigned type, int32_t status, uint64_t id, uint64_t tag, uint64_t size,
                      uint32_t length)
{
    xfer_verbs_wire_hdr_t h;

    memset(&h, 0, sizeof(h));
    h.type    = (uint8_t)type;
    h.credits = 3;
    h.status  = status;
    h.id      = id;
    h.tag     = tag;
    h.size    = size;
    h.length  = length;
    s.len    += xfer_verbs_wire_pack_hdr(&h, s.buf + s.len);
}

static void meta_of(xfer_tensor_wire_meta_t *m, unsigned dtype, unsigned rank,
                    const int64_t *dims, uint32_t flags)
{
    uint64_t elems = 1;

    memset(m, 0, sizeof(*m));
    m->flags = flags;
    if (flags & XFER_TENSOR_META_NONE) {
        return;
    }
    m->dtype = dtype;
    m->rank  = rank;
    for (unsigned i = 0; i < rank; i++) {
        m->dims[i] = dims[i];
        elems     *= (uint64_t)dims[i];
    }
    m->size = (flags & XFER_TENSOR_META_DEAD) ? 0 : elems * xfer_dtype_size((xfer_dtype_t)dtype);
}

/* The four tensor extensions; with_prefix: the tensor_wire harness's selector byte. */
static size_t tensor_req_ext(uint8_t *p, uint32_t flags)
{
    xfer_tensor_wire_req_t r;

    memset(&r, 0, sizeof(r));
    r.addr    = 0x7f0000001000ull;
    r.rkey    = 0x1234;
    r.key     = (const uint8_t*)"layer0.weights";
    r.key_len = 14;
    meta_of(&r.expect, XFER_DTYPE_FLOAT32, 2, dims_2x3, flags);
    return xfer_tensor_wire_pack_req(&r, p);
}

static size_t tensor_meta_ext(uint8_t *p)
{
    xfer_tensor_wire_meta_t m;

    meta_of(&m, XFER_DTYPE_BFLOAT16, 1, dims_32, 0);
    return xfer_tensor_wire_pack_meta(&m, p);
}

static size_t tensor_rereq_ext(uint8_t *p)
{
    xfer_tensor_wire_rereq_t r = {0x7f0000002000ull, 0x4321};

    return xfer_tensor_wire_pack_rereq(&r, p);
}

static size_t tensor_err_ext(uint8_t *p)
{
    static const char reason[] = "step 3 was aborted";

    return xfer_tensor_wire_pack_err(reason, sizeof(reason) - 1, p);
}

static void gen_verbs(void)
{
    xfer_verbs_wire_iface_addr_t ia;
    xfer_verbs_wire_ep_addr_t ea;
    xfer_verbs_wire_rts_t rts = {0x7f0000003000ull, 0x99};
    xfer_verbs_wire_rkey_t k  = {0x77, 0x7f0000004000ull, 65536};
    uint8_t ext[512];
    size_t n;
    int32_t st = XFER_ERR_CANCELED;

    verbs_hdr(XFER_VERBS_MSG_TAG, 0, 0, 42, 0, 0);
    fill(5, 'm');
    save("verbs_wire", "tag");
    verbs_hdr(XFER_VERBS_MSG_RTS, 0, 17, 42, 1 << 20, XFER_VERBS_WIRE_RTS_LEN);
    xfer_verbs_wire_pack_rts(&rts, room(XFER_VERBS_WIRE_RTS_LEN));
    save("verbs_wire", "rts");
    verbs_hdr(XFER_VERBS_MSG_FIN, XFER_ERR_TRUNCATED, 17, 0, 0, 0);
    save("verbs_wire", "fin");
    n = tensor_req_ext(ext, 0);
    verbs_hdr(XFER_VERBS_MSG_TENSOR_REQUEST, 0, xfer_tensor_idx_make(5, 1), 3, 0, (uint32_t)n);
    add(ext, n);
    save("verbs_wire", "tensor_request");
    n = tensor_req_ext(ext, XFER_TENSOR_META_NONE);
    verbs_hdr(XFER_VERBS_MSG_TENSOR_REQUEST, 0, xfer_tensor_idx_make(6, 1), 3, 0, (uint32_t)n);
    add(ext, n);
    save("verbs_wire", "tensor_request_first");
    n = tensor_meta_ext(ext);
    verbs_hdr(XFER_VERBS_MSG_META_DATA_UPDATE, 0, xfer_tensor_idx_make(5, 1), 0, 0,
              (uint32_t)n);
    add(ext, n);
    save("verbs_wire", "meta_data_update");
    n = tensor_rereq_ext(ext);
    verbs_hdr(XFER_VERBS_MSG_TENSOR_RE_REQUEST, 0, xfer_tensor_idx_make(5, 1), 0, 64,
              (uint32_t)n);
    add(ext, n);
    save("verbs_wire", "tensor_re_request");
    n = tensor_err_ext(ext);
    verbs_hdr(XFER_VERBS_MSG_ERROR_STATUS, XFER_ERR_CANCELED, xfer_tensor_idx_make(5, 1),
              XFER_TENSOR_ERR_WITHDRAW, 0, (uint32_t)n);
    add(ext, n);
    save("verbs_wire", "error_status");

    memset(&ia, 0, sizeof(ia));
    memset(ia.gid, 0xfe, sizeof(ia.gid));
    ia.lid        = 0;
    ia.port       = 1;
    ia.link_layer = 2;
    ia.active_mtu = 3;
    ia.gid_index  = 1;
    xfer_verbs_wire_pack_iface_addr(&ia, room(XFER_VERBS_WIRE_IFACE_ADDR_LEN));
    save("verbs_wire", "iface_addr");
    memset(&ea, 0, sizeof(ea));
    ea.qpn           = 0x11;
    ea.psn           = 0x123456;
    ea.rx_slots      = 64;
    ea.seg_size      = 8192;
    ea.max_msg_size  = 1 << 30;
    ea.max_key_len   = 256;
    ea.max_rd_atomic = 16;
    ea.ka_addr       = 0x7f0000005000ull;
    ea.ka_rkey       = 0x55;
    ea.rdma_chunk    = 1 << 30;
    xfer_verbs_wire_pack_ep_addr(&ea, room(XFER_VERBS_WIRE_EP_ADDR_LEN));
    save("verbs_wire", "ep_addr");
    xfer_verbs_wire_pack_rkey(&k, room(XFER_VERBS_WIRE_RKEY_LEN));
    save("verbs_wire", "rkey");

    /* the tensor harness: a selector byte, then the extension */
    fill(1, 0);
    s.len += tensor_req_ext(s.buf + s.len, 0);
    save("tensor_wire", "tensor_request");
    fill(1, 0);
    s.len += tensor_req_ext(s.buf + s.len, XFER_TENSOR_META_NONE);
    save("tensor_wire", "tensor_request_first");
    fill(1, 0);
    s.len += tensor_req_ext(s.buf + s.len, XFER_TENSOR_META_DEAD);
    save("tensor_wire", "tensor_request_dead");
    fill(1, 1);
    s.len += tensor_meta_ext(s.buf + s.len);
    save("tensor_wire", "meta_data_update");
    fill(1, 2);
    s.len += tensor_rereq_ext(s.buf + s.len);
    save("tensor_wire", "tensor_re_request");
    fill(1, 3);
    add(&st, sizeof(st));
    s.len += tensor_err_ext(s.buf + s.len);
    save("tensor_wire", "error_status");
}

/* ---- remote keys ---------------------------------------------------------------------------- */

static void gen_rkey(void)
{
    static rkey_env_t env;
    static const char *const names[] = {"tcp", "verbs"};
    xfer_tcp_wire_rkey_t tk = {TS_REGION_ID, TS_COOKIE, TS_REGION_ADDR, TS_REGION_LEN};
    xfer_verbs_wire_rkey_t vk = {0x77, TS_REGION_ADDR, TS_REGION_LEN};
    void *blob;
    size_t len;

    for (unsigned variant = 0; variant < 3; variant++) {
        static const char *const seed_names[] = {"tcp", "tcp_verbs", "verbs_only"};

        rkey_env_init(&env, RKEY_ENV_OWNER, 2);
        for (unsigned i = 0; i < 2; i++) {
            snprintf(env.parts[i].name, sizeof(env.parts[i].name), "%s", names[i]);
        }
        env.parts[0].registered = (variant != 2);
        env.parts[1].registered = (variant != 0);
        xfer_tcp_wire_pack_rkey(&tk, env.parts[0].blob);
        env.parts[0].blob_len = XFER_TCP_WIRE_RKEY_LEN;
        xfer_verbs_wire_pack_rkey(&vk, env.parts[1].blob);
        env.parts[1].blob_len = XFER_VERBS_WIRE_RKEY_LEN;
        if (rkey_env_pack(&env, TS_REGION_ADDR, TS_REGION_LEN, &blob, &len) != XFER_OK) {
            fail("rkey");
        }
        add(blob, len);
        xfer_rkey_blob_free(blob);
        save("rkey", seed_names[variant]);
    }
    rkey_env_cleanup(&env);
}

/* ---- shm ring ------------------------------------------------------------------------------ */

static uint8_t shm_img[XFER_SHM_SEG_CTRL + 16 * 512];

/* A segment of ncells x cell_size into shm_img, through the real ring: produced frames
 * published (frame i: a known type, (i * 29) % (payload + 1) bytes), consumed of them
 * consumed. Returns its length. */
static size_t shm_segment(uint32_t ncells, uint32_t cell_size, unsigned produced,
                          unsigned consumed)
{
    const size_t len = xfer_shm_seg_len(ncells, cell_size);
    const size_t payload = cell_size - XFER_SHM_FRAME_HDR;
    xfer_shm_ring_t owner, peer;
    const uint8_t *data;
    xfer_shm_frame_t h;
    xfer_status_t st;
    char why[256];
    unsigned p = 0, k = 0;

    if (len > sizeof(shm_img)) {
        fail("shm segment too large");
    }
    memset(shm_img, 0, sizeof(shm_img));
    xfer_shm_seg_init(&owner, shm_img, ncells, cell_size, SHM_FUZZ_TOKEN);
    if (xfer_shm_seg_attach(&peer, shm_img, len, SHM_FUZZ_TOKEN, why, sizeof(why)) != XFER_OK) {
        fail(why);
    }
    while ((p < produced) || (k < consumed)) {
        uint8_t *c = (p < produced) ? xfer_shm_ring_claim(&peer, &st, why, sizeof(why)) : NULL;

        if (c != NULL) {
            memset(&h, 0, sizeof(h));
            h.type = (uint16_t)(XFER_SHM_F_DATA + p % (XFER_SHM_F_TYPE_MAX - XFER_SHM_F_DATA));
            h.len  = (uint32_t)((p * 29u) % (payload + 1));
            h.id   = p;
            h.a    = 0x1000u + p;
            memcpy(c, &h, sizeof(h));
            memset(c + XFER_SHM_FRAME_HDR, 'a' + (int)(p % 26), h.len);
            xfer_shm_ring_publish(&peer);
            p++;
        } else if ((k < consumed) &&
                   (xfer_shm_ring_peek(&owner, &h, &data, why, sizeof(why)) == 1)) {
            xfer_shm_ring_consume(&owner);
            k++;
        } else {
            fail("shm ring: neither room nor a frame");
        }
    }
    return len;
}

static void shm_word32(size_t off, uint32_t v)
{
    memcpy(shm_img + off, &v, sizeof(v));
}

static void shm_word64(size_t off, uint64_t v)
{
    memcpy(shm_img + off, &v, sizeof(v));
}

/* The input's header, then the image of len bytes from shm_img. */
static void shm_input(unsigned flags, uint8_t ncells_sel, uint8_t cell_sel, int8_t seg,
                      size_t len)
{
    uint8_t h[SHM_FUZZ_HDR_LEN] = {(uint8_t)flags, ncells_sel, cell_sel, (uint8_t)seg,
                                   (uint8_t)(len & 0xff), (uint8_t)(len >> 8)};

    add(h, sizeof(h));
    add(shm_img, len);
}

static void shm_op(unsigned op)
{
    uint8_t b = (uint8_t)op;

    add(&b, 1);
}

static void shm_op8(unsigned op, uint8_t v)
{
    shm_op(op);
    add(&v, 1);
}

static void shm_op16(unsigned op, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)(v & 0xff), (uint8_t)(v >> 8)};

    shm_op(op);
    add(b, 2);
}

static void shm_op64(unsigned op, uint64_t v)
{
    shm_op(op);
    for (unsigned i = 0; i < 8; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));

        add(&b, 1);
    }
}

/* 8 bytes of an operand, after an op written with its first operands */
static void shm_op64_raw(uint64_t v)
{
    for (unsigned i = 0; i < 8; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));

        add(&b, 1);
    }
}

static void shm_ops(unsigned op, unsigned times)
{
    for (unsigned i = 0; i < times; i++) {
        shm_op(op);
    }
}

/* times claims and publishes, of varied lengths */
static void shm_publish(unsigned times)
{
    for (unsigned i = 0; i < times; i++) {
        shm_op16(SHM_OP_CLAIM_PUBLISH, (uint16_t)((i * 37u) % 200u));
    }
}

static void shm_hdr_op(uint8_t cell, uint8_t type, uint16_t len)
{
    uint8_t b[4] = {cell, type, (uint8_t)(len & 0xff), (uint8_t)(len >> 8)};

    shm_op(SHM_OP_HDR);
    add(b, sizeof(b));
}

static void shm_raw_op(uint16_t off, const void *bytes, uint8_t n)
{
    uint8_t b[3] = {(uint8_t)(off & 0xff), (uint8_t)(off >> 8), n};

    shm_op(SHM_OP_RAW);
    add(b, sizeof(b));
    add(bytes, n);
}

static void gen_shm_ring(void)
{
    static const uint16_t ffff = 0xffff;
    size_t len;

    /* frames waiting; read, the consumer arms, one more comes; the producer fills the ring */
    len = shm_segment(4, 256, 3, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_READY);
    shm_ops(SHM_OP_PEEK_CONSUME, 3);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_ARM);
    shm_op(SHM_OP_READY);
    shm_hdr_op(3, XFER_SHM_F_TAG, 5);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_ARM);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_op8(SHM_OP_ARMED, 1);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 10);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 192);
    shm_op(SHM_OP_USED);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 0);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 1);
    shm_op(SHM_OP_CLAIM);
    shm_op8(SHM_OP_TAIL_REL, 0);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 100);
    shm_op(SHM_OP_USED);
    save("shm_ring", "frames");

    /* three times round the ring on both sides, in a 4-cell and a 7-cell ring */
    for (unsigned big = 0; big < 2; big++) {
        uint32_t ncells = big ? 7 : 4, cell = big ? 384 : 256;

        len = shm_segment(ncells, cell, ncells + 2, 2);
        shm_input(SHM_FIX_ALL, (uint8_t)(ncells - 4), (uint8_t)((cell - 256) / 64), 0, len);
        for (unsigned round = 0; round < 3; round++) {
            for (unsigned i = 0; i < ncells; i++) {
                shm_op8(SHM_OP_STAMP_REL, 0);
                shm_op(SHM_OP_PEEK_CONSUME);
            }
            shm_publish(ncells);
            shm_op8(SHM_OP_TAIL_REL, 0);
        }
        save("shm_ring", big ? "wrapped_7_cells" : "wrapped");
    }

    /* a full ring on both sides; the producer waits for room, the consumer frees some */
    len = shm_segment(4, 256, 4, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_ROOM_NOTIFY);
    shm_op8(SHM_OP_PWAIT, 1);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_op(SHM_OP_ROOM_NOTIFY);
    shm_ops(SHM_OP_PEEK_CONSUME, 4);
    shm_op(SHM_OP_ROOM_NOTIFY);
    shm_publish(4);
    shm_op(SHM_OP_CLAIM);
    shm_op(SHM_OP_USED);
    shm_op(SHM_OP_WAIT_ROOM);
    shm_op8(SHM_OP_TAIL_REL, (uint8_t)-3);
    shm_op(SHM_OP_WAIT_ROOM);
    shm_publish(1);
    shm_op(SHM_OP_WAIT_ROOM);
    save("shm_ring", "full");

    /* a shared put's slot: both sides take parts until they meet, the target's are counted;
     * a stale generation takes nothing; then the peer rewrites the words */
    len = shm_segment(4, 256, 0, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op16(SHM_OP_COOP_OPEN, 1 | (7 << 8));          /* slot 1, 8 parts */
    for (unsigned i = 0; i < 5; i++) {
        shm_op16(SHM_OP_COOP_TAKE, 1 | ((i & 1) << 8));
    }
    shm_op16(SHM_OP_COOP_TAKE, 1 | (2 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op16(SHM_OP_COOP_TAKE, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_DONE, 1);
    shm_op16(SHM_OP_COOP_DONE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_OPEN, 1 | (255 << 8));        /* the same slot anew, 256 parts */
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_WORD, 1);
    shm_op64_raw(((uint64_t)2 << 32) | (0xffffull << 16) | 0xffffu);
    shm_op16(SHM_OP_COOP_TAKE, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_WORD, 1 | (1 << 8));
    shm_op64_raw(UINT64_MAX);
    shm_op8(SHM_OP_COOP_CHECK, 1);
    save("shm_ring", "coop_slot");

    /* stamps that are not the position's: a lap before and after, zero, the largest, a cell
     * ahead stamped for its own position while the one before is not */
    len = shm_segment(4, 256, 2, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op8(SHM_OP_STAMP_REL, (uint8_t)-4);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_READY);
    shm_op8(SHM_OP_STAMP_REL, 4);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_ARM);
    save("shm_ring", "stamp_a_lap_away");
    len = shm_segment(4, 256, 4, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_ops(SHM_OP_PEEK_CONSUME, 2);
    shm_op64(SHM_OP_STAMP_RAW, 2ull << 32);
    shm_op(SHM_OP_PEEK);
    shm_op64(SHM_OP_STAMP_RAW, (2ull << 32) | UINT32_MAX);
    shm_op(SHM_OP_PEEK);
    shm_op64(SHM_OP_STAMP_RAW, (3ull << 32) | 4);
    shm_op(SHM_OP_PEEK);
    shm_op64(SHM_OP_STAMP_RAW, (2ull << 32) | 3);
    shm_ops(SHM_OP_PEEK_CONSUME, 2);
    save("shm_ring", "stamp_raw");

    /* inline payloads: a message's in its header, then ones no sender writes (too long, of
     * a PUT, of a rendezvous message) */
    len = shm_segment(4, 256, 0, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, 0x80 | XFER_SHM_F_TAG, 8);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_hdr_op(1, 0x80 | XFER_SHM_F_NOTIFY, XFER_SHM_INLINE_MAX);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_hdr_op(2, 0x80 | XFER_SHM_F_TAG, XFER_SHM_INLINE_MAX + 1);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "inline");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, 0x80 | XFER_SHM_F_PUT, 8);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "inline_put");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, 0xc0 | XFER_SHM_F_TAG, 8);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "inline_rndv");

    /* bad headers: type 0 in the image, type 0xffff and a length past the cell by script */
    len = shm_segment(4, 256, 2, 0);
    shm_word32(XFER_SHM_SEG_CTRL + 4, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "bad_type_zero");
    len = shm_segment(4, 256, 2, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_raw_op(XFER_SHM_SEG_CTRL + 256 + 4, &ffff, sizeof(ffff));
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "bad_type_ffff");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, XFER_SHM_F_TAG, 256 - XFER_SHM_FRAME_HDR + 1);
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "bad_len");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, XFER_SHM_F_TYPE_MAX, 0);
    shm_op(SHM_OP_PEEK);
    save("shm_ring", "bad_type_max");
    /* the limits that hold: a frame filling its cell, the last type */
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, XFER_SHM_F_TAG, 256 - XFER_SHM_FRAME_HDR);
    shm_hdr_op(1, XFER_SHM_F_TYPE_MAX - 1, 0);
    shm_ops(SHM_OP_PEEK_CONSUME, 3);
    save("shm_ring", "whole_cell_last_type");

    /* impossible tails: ahead of head, more than a ring behind */
    len = shm_segment(4, 256, 0, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_publish(4);
    shm_op8(SHM_OP_TAIL_REL, 1);
    shm_op(SHM_OP_WAIT_ROOM);
    shm_publish(1);
    save("shm_ring", "tail_ahead");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_publish(4);
    shm_op8(SHM_OP_TAIL_REL, 0);
    shm_publish(4);
    shm_op64(SHM_OP_TAIL_RAW, 3);
    shm_publish(1);
    save("shm_ring", "tail_behind_ring");

    /* attach: each field wrong, a segment too short for the ring or its control block, and
     * the image's own geometry in a larger segment */
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_MAGIC, XFER_SHM_SEG_MAGIC + 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_MAGIC, 0, 0, 0, len);
    save("shm_ring", "attach_bad_magic");
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_VERSION, XFER_SHM_SEG_VERSION + 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_VERSION, 0, 0, 0, len);
    save("shm_ring", "attach_bad_version");
    len = shm_segment(4, 256, 1, 0);
    shm_word64(SHM_OFF_TOKEN, SHM_FUZZ_TOKEN + 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_TOKEN, 0, 0, 0, len);
    save("shm_ring", "attach_bad_token");
    len = shm_segment(4, 256, 1, 0);
    shm_input(SHM_FIX_ALL, 0, 0, -1, len);
    save("shm_ring", "attach_one_byte_short");
    shm_input(SHM_FIX_ALL | SHM_FIX_SHORT, 0, 0, (int8_t)255, len);
    save("shm_ring", "attach_below_control_block");
    shm_input(SHM_FIX_ALL | SHM_FIX_SHORT, 0, 0, 16, len);
    save("shm_ring", "attach_16_bytes");
    len = shm_segment(5, 256, 1, 0);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 0, 0, 0, len);
    save("shm_ring", "attach_geometry_too_large");
    /* geometry that would fit, but is no valid geometry (the segment: 4 cells of 320) */
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_NCELLS, 3);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 0, 1, 0, len);
    save("shm_ring", "attach_3_cells");
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_CELLSIZE, 260);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 0, 1, 0, len);
    save("shm_ring", "attach_cell_not_64");
    len = shm_segment(4, 256, 3, 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 2, 1, 100, len);
    shm_publish(5);
    shm_op8(SHM_OP_TAIL_REL, (uint8_t)-2);
    shm_publish(3);
    save("shm_ring", "attach_larger_segment");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (writes DIR/<harness>/<seed>)\n", argv[0]);
        return 1;
    }
    out_dir = argv[1];
    if ((mkdir(out_dir, 0755) != 0) && (errno != EEXIST)) {
        fail(out_dir);
    }
    gen_bootstrap();
    gen_tcp_wire();
    gen_tcp_stream();
    gen_verbs();
    gen_rkey();
    gen_shm_ring();
    return 0;
}
