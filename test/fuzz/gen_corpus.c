/*
 * Writes the fuzz harnesses' seed inputs, each made by the real encoders, into
 * DIR/<harness>/<seed> (make fuzz-corpus writes test/fuzz/corpus). Deterministic: running it
 * again gives the same files. A seed is a valid input of the kind its harness reads; the
 * fuzzer mutates from there. The shm ring's seeds are in gen_corpus_shm.c.
 */
#include "gen_corpus.h"
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

void gc_fail(const char *what)
{
    fprintf(stderr, "gen_corpus: %s\n", what);
    exit(1);
}

static void *room(size_t n)
{
    if (s.len + n > sizeof(s.buf)) {
        gc_fail("seed too large");
    }
    s.len += n;
    return s.buf + s.len - n;
}

void gc_add(const void *p, size_t n)
{
    memcpy(room(n), p, n);
}

void gc_save(const char *harness, const char *name)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", out_dir, harness);
    if ((mkdir(path, 0755) != 0) && (errno != EEXIST)) {
        gc_fail(path);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", out_dir, harness, name);
    f = fopen(path, "wb");
    if ((f == NULL) || (fwrite(s.buf, 1, s.len, f) != s.len) || (fclose(f) != 0)) {
        gc_fail(path);
    }
    s.len = 0;
}

/* ---- bootstrap ------------------------------------------------------------------------------ */

static void boot_frame(xfer_status_t status)
{
    if (status != XFER_OK) {
        gc_fail("bootstrap frame");
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
    gc_save("bootstrap_wire", "hello");
    add_accept("tcp");
    gc_save("bootstrap_wire", "accept");
    len = sizeof(s.buf);
    boot_frame(xfer_wire_pack_reject(XFER_ERR_UNREACHABLE, "no shared transport: client "
                                     "offered verbs; server offered tcp", s.buf, &len));
    s.len = len;
    gc_save("bootstrap_wire", "reject");
    add_connect(0x1122334455667788ull);
    gc_save("bootstrap_wire", "connect");
    add_hello(client, 2);
    add_hello(server, 2);
    add_accept("tcp");
    add_connect(1);
    add_connect(2);
    gc_save("bootstrap_wire", "exchange");
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
    gc_add(key, r.key_len);
}

/* A TENSOR_RESP: status 0 with a tensor of dtype and dims (rank of them), or an error with
 * a reason. */
static void tcp_tensor_resp(uint64_t id, int32_t status, unsigned dtype, unsigned rank,
                            const int64_t *dims, int is_dead, const char *reason)
{
    xfer_tcp_wire_tensor_resp_t r;
    uint64_t elems = 1, data;
    size_t ext_len;

    memset(&r, 0, sizeof(r));
    if (status == 0) {
        r.meta.dtype = dtype;
        r.meta.rank  = rank;
        r.meta.flags = is_dead ? XFER_TENSOR_META_DEAD : 0;
        for (unsigned i = 0; i < rank; i++) {
            r.meta.dims[i] = dims[i];
            elems         *= (uint64_t)dims[i];
        }
        r.meta.size = is_dead ? 0 : elems * xfer_dtype_size((xfer_dtype_t)dtype);
    } else {
        r.meta.flags = XFER_TENSOR_META_NONE;
        r.reason_len = (uint32_t)strlen(reason);
    }
    data    = xfer_tensor_wire_data_len(&r.meta);
    ext_len = 8 + xfer_tensor_wire_meta_len(&r.meta);
    tcp_hdr(XFER_TCP_WIRE_TENSOR_RESP, status, id, ext_len + r.reason_len + data);
    xfer_tcp_wire_pack_tensor_resp_ext(&r, room(ext_len));
    gc_add(reason ? reason : "", r.reason_len);
    fill((size_t)data, 'd');
}

static const int64_t dims_2x3[] = {2, 3}, dims_4[] = {4}, dims_32[] = {32};

static void gen_tcp_wire(void)
{
    xfer_region_t k = {TS_REGION_ID, TS_COOKIE, (uint8_t*)(uintptr_t)TS_REGION_ADDR,
                       TS_REGION_LEN};
    xfer_tcp_wire_ep_addr_t addr = {{TS_MAX_MSG, TS_MAX_KEY}, 4, 40000, 0x0123456789abcdefull};

    tcp_tag(5, 11);
    gc_save("tcp_wire", "tag");
    tcp_put(1, 2, 0x1000, 16);
    gc_save("tcp_wire", "put_req");
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, XFER_ERR_OUT_OF_RANGE, 7, 0);
    gc_save("tcp_wire", "put_ack");
    tcp_get(1, 2, 0x1000, 16);
    gc_save("tcp_wire", "get_req");
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, 0, 8, 16);
    fill(16, 'g');
    gc_save("tcp_wire", "get_resp");
    tcp_tensor_req(9, 3, "weights");
    gc_save("tcp_wire", "tensor_req");
    tcp_tensor_resp(9, 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0, NULL);
    gc_save("tcp_wire", "tensor_resp");
    tcp_tensor_resp(9, XFER_ERR_NOT_FOUND, 0, 0, NULL, 0, "no such tensor");
    gc_save("tcp_wire", "tensor_resp_error");
    tcp_tensor_resp(9, 0, XFER_DTYPE_INT8, 1, dims_4, 1, NULL);
    gc_save("tcp_wire", "tensor_resp_dead");
    tcp_hdr(XFER_TCP_WIRE_TENSOR_CANCEL, 0, 9, 0);
    gc_save("tcp_wire", "tensor_cancel");
    tcp_put_noack(1, 1, 2, 0x1000, 16);
    gc_save("tcp_wire", "put");
    tcp_putv(1, 1, 2, 0x1000, 64, 3, 16);
    gc_save("tcp_wire", "putv");
    tcp_hdr(XFER_TCP_WIRE_PUT_FAIL, XFER_ERR_INVALID_PARAM, 1, 0);
    gc_save("tcp_wire", "put_fail");
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 1, 0);
    gc_save("tcp_wire", "flush_req");
    tcp_hdr(XFER_TCP_WIRE_FLUSH_ACK, 0, 1, 0);
    gc_save("tcp_wire", "flush_ack");
    xfer_region_key_pack(&k, room(XFER_REGION_KEY_LEN));
    gc_save("tcp_wire", "rkey");
    xfer_tcp_wire_pack_ep_addr(&addr, room(XFER_TCP_WIRE_EP_ADDR_LEN));
    gc_save("tcp_wire", "ep_addr");
    {
        xfer_tcp_wire_lane_hello_t hello = {1, 0x0123456789abcdefull};

        xfer_tcp_wire_pack_lane_hello(&hello, room(XFER_TCP_WIRE_LANE_HELLO_LEN));
        gc_save("tcp_wire", "lane_hello");
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
    gc_save("tcp_stream", "tag_exact");
    tcp_tag(TS_TAG_ANY_PEER, 100);
    gc_save("tcp_stream", "tag_truncated");
    tcp_tag(77, 12);
    tcp_tag(78, 0);
    gc_save("tcp_stream", "tag_any");
    tcp_tag(TS_TAG_ANY_PEER, 1);
    tcp_tag(TS_TAG_ANY_PEER, 2);
    tcp_tag(TS_TAG_EXACT, 3);
    tcp_tag(TS_TAG_EXACT, 4);
    tcp_tag(300, 40);
    gc_save("tcp_stream", "tag_unexpected");
    /* with every request answered, unexpected messages beyond the limit pause the input */
    answer_all();
    tcp_tag(301, 8);
    tcp_tag(302, 3000);
    tcp_tag(303, 2000);
    tcp_tag(TS_TAG_EXACT, 5);
    gc_save("tcp_stream", "tag_pause");

    tcp_put(TS_REGION_ID, TS_COOKIE, base + 16, 32);
    gc_save("tcp_stream", "put");
    tcp_put(TS_REGION_ID, TS_COOKIE, base + 100, 600);
    gc_save("tcp_stream", "put_large");
    tcp_put(TS_REGION_ID, TS_COOKIE, base + TS_REGION_LEN - 8, 32);
    tcp_put(TS_REGION_ID, TS_COOKIE ^ 1, base, 8);
    tcp_put(TS_REGION_ID + 1, TS_COOKIE, base, 8);
    gc_save("tcp_stream", "put_refused");
    /* unacknowledged puts, refused ones answered with PUT_FAIL, then a flush's FLUSH_REQ */
    tcp_put_noack(1, TS_REGION_ID, TS_COOKIE, base + 16, 32);
    tcp_put_noack(2, TS_REGION_ID, TS_COOKIE, base + 100, 600);
    tcp_put_noack(3, TS_REGION_ID + 1, TS_COOKIE, base, 8);
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 1, 0);
    tcp_put_noack(4, TS_REGION_ID, TS_COOKIE, base, 8);
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 2, 0);
    gc_save("tcp_stream", "put_noack_flush");
    tcp_put_noack(2, TS_REGION_ID, TS_COOKIE, base, 8);
    gc_save("tcp_stream", "put_noack_bad_id");
    /* a batch's small puts in one frame: into the region, then one refused (a block past it:
     * nothing of it is written, PUT_FAIL), then one whose rank is wrong */
    tcp_putv(1, TS_REGION_ID, TS_COOKIE, base + 16, 256, 4, 100);
    tcp_putv(2, TS_REGION_ID, TS_COOKIE, base + TS_REGION_LEN - 300, 200, 2, 100);
    tcp_hdr(XFER_TCP_WIRE_FLUSH_REQ, 0, 1, 0);
    gc_save("tcp_stream", "putv");
    tcp_putv(5, TS_REGION_ID, TS_COOKIE, base, 64, 2, 8);
    gc_save("tcp_stream", "putv_bad_id");
    tcp_hdr(XFER_TCP_WIRE_FLUSH_ACK, 0, 1, 0);
    gc_save("tcp_stream", "flush_ack_unasked");
    /* a striped frame on a connection that has no lanes */
    tcp_hdr(XFER_TCP_WIRE_TAG, 2, 1, 8);     /* status field: 2 lanes */
    s.buf[s.len - XFER_TCP_WIRE_HDR_LEN + 3] |= XFER_TCP_WIRE_STRIPED;
    fill(8, 0x5a);
    gc_save("tcp_stream", "striped_without_lanes");
    tcp_hdr(XFER_TCP_WIRE_PUT_FAIL, XFER_ERR_INVALID_PARAM, 1, 0);
    gc_save("tcp_stream", "put_fail_unasked");
    tcp_get(TS_REGION_ID, TS_COOKIE, base + 8, 16);
    gc_save("tcp_stream", "get");
    tcp_get(TS_REGION_ID, TS_COOKIE, base, TS_REGION_LEN);
    gc_save("tcp_stream", "get_large");
    tcp_get(TS_REGION_ID, TS_COOKIE, base + 1, TS_REGION_LEN);
    tcp_get(TS_REGION_ID, 0, base, 1);
    gc_save("tcp_stream", "get_refused");

    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, 0, TS_ID(TS_SLOT_PUT_SMALL), 0);
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, XFER_ERR_OUT_OF_RANGE, TS_ID(TS_SLOT_PUT_LARGE), 0);
    gc_save("tcp_stream", "put_ack");
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, 0, TS_ID(TS_SLOT_GET), TS_GET_LEN);
    fill(TS_GET_LEN, 'g');
    gc_save("tcp_stream", "get_resp");
    tcp_hdr(XFER_TCP_WIRE_GET_RESP, XFER_ERR_INVALID_PARAM, TS_ID(TS_SLOT_GET), 0);
    gc_save("tcp_stream", "get_resp_error");

    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0, NULL);
    gc_save("tcp_stream", "fetch_buf");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), 0, XFER_DTYPE_FLOAT32, 1, dims_32, 0, NULL);
    gc_save("tcp_stream", "fetch_truncated");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_ALLOC), 0, XFER_DTYPE_FLOAT64, 1, dims_4, 0, NULL);
    gc_save("tcp_stream", "fetch_alloc");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_ALLOC), 0, XFER_DTYPE_INT8, 1, dims_4, 1, NULL);
    gc_save("tcp_stream", "fetch_dead");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_BUF), XFER_ERR_NOT_FOUND, 0, 0, NULL, 0,
                    "no tensor of that key");
    gc_save("tcp_stream", "fetch_error");
    tcp_tensor_resp(TS_ID(TS_SLOT_FETCH_CANCELLED), 0, XFER_DTYPE_FLOAT32, 2, dims_2x3, 0,
                    NULL);
    gc_save("tcp_stream", "fetch_tombstone");

    tcp_tensor_req(100, 1, "ok");
    tcp_tensor_req(101, 1, "e");
    tcp_tensor_req(102, 1, "d");
    tcp_tensor_req(103, 1, "b");
    gc_save("tcp_stream", "tensor_req");
    tcp_tensor_req(104, 2, "l1");
    tcp_tensor_req(105, 2, "l2");
    tcp_hdr(XFER_TCP_WIRE_TENSOR_CANCEL, 0, 104, 0);
    tcp_hdr(XFER_TCP_WIRE_TENSOR_CANCEL, 0, 100, 0);
    gc_save("tcp_stream", "tensor_req_later");

    /* everything that leaves the endpoint working, in one stream */
    tcp_tag(TS_TAG_EXACT, 10);
    tcp_tag(TS_TAG_ANY_PEER, 20);
    tcp_tag(55, 3);
    tcp_put(TS_REGION_ID, TS_COOKIE, base + 16, 32);
    tcp_get(TS_REGION_ID, TS_COOKIE, base, 512);
    answer_all();
    tcp_tensor_req(200, 5, "x");
    tcp_tensor_req(201, 5, "later");
    gc_save("tcp_stream", "session");

    /* failures: a wrong magic, and a response nobody asked for */
    tcp_tag(TS_TAG_EXACT, 4);
    gc_add("GARBAGE GARBAGE GARBAGE!", 24);
    gc_save("tcp_stream", "garbage");
    tcp_hdr(XFER_TCP_WIRE_PUT_ACK, 0, TS_ID(40), 0);
    gc_save("tcp_stream", "unknown_id");
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
    gc_save("verbs_wire", "tag");
    verbs_hdr(XFER_VERBS_MSG_RTS, 0, 17, 42, 1 << 20, XFER_VERBS_WIRE_RTS_LEN);
    xfer_verbs_wire_pack_rts(&rts, room(XFER_VERBS_WIRE_RTS_LEN));
    gc_save("verbs_wire", "rts");
    verbs_hdr(XFER_VERBS_MSG_FIN, XFER_ERR_TRUNCATED, 17, 0, 0, 0);
    gc_save("verbs_wire", "fin");
    n = tensor_req_ext(ext, 0);
    verbs_hdr(XFER_VERBS_MSG_TENSOR_REQUEST, 0, xfer_tensor_idx_make(5, 1), 3, 0, (uint32_t)n);
    gc_add(ext, n);
    gc_save("verbs_wire", "tensor_request");
    n = tensor_req_ext(ext, XFER_TENSOR_META_NONE);
    verbs_hdr(XFER_VERBS_MSG_TENSOR_REQUEST, 0, xfer_tensor_idx_make(6, 1), 3, 0, (uint32_t)n);
    gc_add(ext, n);
    gc_save("verbs_wire", "tensor_request_first");
    n = tensor_meta_ext(ext);
    verbs_hdr(XFER_VERBS_MSG_META_DATA_UPDATE, 0, xfer_tensor_idx_make(5, 1), 0, 0,
              (uint32_t)n);
    gc_add(ext, n);
    gc_save("verbs_wire", "meta_data_update");
    n = tensor_rereq_ext(ext);
    verbs_hdr(XFER_VERBS_MSG_TENSOR_RE_REQUEST, 0, xfer_tensor_idx_make(5, 1), 0, 64,
              (uint32_t)n);
    gc_add(ext, n);
    gc_save("verbs_wire", "tensor_re_request");
    n = tensor_err_ext(ext);
    verbs_hdr(XFER_VERBS_MSG_ERROR_STATUS, XFER_ERR_CANCELED, xfer_tensor_idx_make(5, 1),
              XFER_TENSOR_ERR_WITHDRAW, 0, (uint32_t)n);
    gc_add(ext, n);
    gc_save("verbs_wire", "error_status");

    memset(&ia, 0, sizeof(ia));
    memset(ia.gid, 0xfe, sizeof(ia.gid));
    ia.lid        = 0;
    ia.port       = 1;
    ia.link_layer = 2;
    ia.active_mtu = 3;
    ia.gid_index  = 1;
    xfer_verbs_wire_pack_iface_addr(&ia, room(XFER_VERBS_WIRE_IFACE_ADDR_LEN));
    gc_save("verbs_wire", "iface_addr");
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
    gc_save("verbs_wire", "ep_addr");
    xfer_verbs_wire_pack_rkey(&k, room(XFER_VERBS_WIRE_RKEY_LEN));
    gc_save("verbs_wire", "rkey");

    /* the tensor harness: a selector byte, then the extension */
    fill(1, 0);
    s.len += tensor_req_ext(s.buf + s.len, 0);
    gc_save("tensor_wire", "tensor_request");
    fill(1, 0);
    s.len += tensor_req_ext(s.buf + s.len, XFER_TENSOR_META_NONE);
    gc_save("tensor_wire", "tensor_request_first");
    fill(1, 0);
    s.len += tensor_req_ext(s.buf + s.len, XFER_TENSOR_META_DEAD);
    gc_save("tensor_wire", "tensor_request_dead");
    fill(1, 1);
    s.len += tensor_meta_ext(s.buf + s.len);
    gc_save("tensor_wire", "meta_data_update");
    fill(1, 2);
    s.len += tensor_rereq_ext(s.buf + s.len);
    gc_save("tensor_wire", "tensor_re_request");
    fill(1, 3);
    gc_add(&st, sizeof(st));
    s.len += tensor_err_ext(s.buf + s.len);
    gc_save("tensor_wire", "error_status");
}

/* ---- remote keys ---------------------------------------------------------------------------- */

static void gen_rkey(void)
{
    static rkey_env_t env;
    static const char *const names[] = {"tcp", "verbs"};
    xfer_region_t tk = {TS_REGION_ID, TS_COOKIE, (uint8_t*)(uintptr_t)TS_REGION_ADDR,
                        TS_REGION_LEN};
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
        xfer_region_key_pack(&tk, env.parts[0].blob);
        env.parts[0].blob_len = XFER_REGION_KEY_LEN;
        xfer_verbs_wire_pack_rkey(&vk, env.parts[1].blob);
        env.parts[1].blob_len = XFER_VERBS_WIRE_RKEY_LEN;
        if (rkey_env_pack(&env, TS_REGION_ADDR, TS_REGION_LEN, &blob, &len) != XFER_OK) {
            gc_fail("rkey");
        }
        gc_add(blob, len);
        xfer_rkey_blob_free(blob);
        gc_save("rkey", seed_names[variant]);
    }
    rkey_env_cleanup(&env);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (writes DIR/<harness>/<seed>)\n", argv[0]);
        return 1;
    }
    out_dir = argv[1];
    if ((mkdir(out_dir, 0755) != 0) && (errno != EEXIST)) {
        gc_fail(out_dir);
    }
    gen_bootstrap();
    gen_tcp_wire();
    gen_tcp_stream();
    gen_verbs();
    gen_rkey();
    gc_gen_shm_ring();
    return 0;
}
