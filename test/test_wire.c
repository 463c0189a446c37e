/*
 * Bootstrap wire format: round trips, and every way a peer can lie - truncation at each byte,
 * wrong magic/version/type, lengths over the limits, bad names, trailing bytes, duplicates,
 * and random bytes. The parser must answer with an error and a reason, never read past the
 * buffer (ASan and valgrind runs check that), never crash.
 */
#include "../framework/wire/bootstrap_wire.h"

#include <xfer/component.h>

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t frame[XFER_WIRE_HEADER_LEN + XFER_WIRE_MAX_BODY];
static char why[512];

static void add(xfer_wire_hello_t *h, const char *name, size_t addr_len, uint8_t fill)
{
    xfer_wire_transport_t *t = &h->transports[h->num++];

    snprintf(t->name, sizeof(t->name), "%s", name);
    t->addr_len = (uint16_t)addr_len;
    memset(t->addr, fill, addr_len);
}

static size_t pack_sample(xfer_wire_hello_t *h)
{
    size_t len = sizeof(frame);

    memset(h, 0, sizeof(*h));
    add(h, "verbs", 40, 0xab);
    add(h, "tcp", 0, 0);
    add(h, "gdr", XFER_WIRE_MAX_ADDR, 0x5a);
    cr_assert_eq(xfer_wire_pack_hello(h, frame, &len), XFER_OK);
    return len;
}

Test(wire, hello_round_trip)
{
    xfer_wire_hello_t in, out;
    xfer_wire_header_t hdr;
    size_t len = pack_sample(&in);

    cr_assert_eq(xfer_wire_parse_header(frame, len, &hdr, why, sizeof(why)), XFER_OK, "%s", why);
    cr_expect_eq(hdr.type, XFER_WIRE_HELLO);
    cr_expect_eq(hdr.body_len, len - XFER_WIRE_HEADER_LEN);
    cr_assert_eq(xfer_wire_parse_hello(frame + XFER_WIRE_HEADER_LEN, hdr.body_len, &out, why,
                                       sizeof(why)), XFER_OK, "%s", why);
    cr_assert_eq(out.num, 3);
    for (int i = 0; i < 3; i++) {
        cr_expect_str_eq(out.transports[i].name, in.transports[i].name);
        cr_expect_eq(out.transports[i].addr_len, in.transports[i].addr_len);
        cr_expect_eq(memcmp(out.transports[i].addr, in.transports[i].addr,
                            in.transports[i].addr_len), 0);
    }
    /* network byte order on the wire */
    cr_expect_eq(frame[0], 'X');
    cr_expect_eq(frame[3], 'R');
    cr_expect_eq(frame[5], XFER_WIRE_VERSION);
}

Test(wire, every_truncation_is_rejected)
{
    xfer_wire_hello_t h, out;
    size_t len = pack_sample(&h), body = len - XFER_WIRE_HEADER_LEN;
    xfer_wire_header_t hdr;

    for (size_t n = 0; n < XFER_WIRE_HEADER_LEN; n++) {
        cr_expect_eq(xfer_wire_parse_header(frame, n, &hdr, why, sizeof(why)),
                     XFER_ERR_TRUNCATED, "header of %zu bytes", n);
    }
    for (size_t n = 0; n < body; n++) {
        /* copy the prefix to an exact-size heap buffer so ASan sees any over-read */
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, frame + XFER_WIRE_HEADER_LEN, n);
        cr_expect_eq(xfer_wire_parse_hello(copy, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL,
                     "body of %zu of %zu bytes accepted", n, body);
        free(copy);
    }
}

Test(wire, bad_headers)
{
    xfer_wire_header_t hdr;
    xfer_wire_hello_t h;
    uint32_t be;

    pack_sample(&h);
    frame[0] = 'Y';
    cr_expect_eq(xfer_wire_parse_header(frame, 64, &hdr, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "wrong magic") != NULL, "%s", why);

    pack_sample(&h);
    frame[5] = 2;
    cr_expect_eq(xfer_wire_parse_header(frame, 64, &hdr, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "protocol version 2, this library speaks 1") != NULL, "%s", why);

    pack_sample(&h);
    frame[7] = 9;
    cr_expect_eq(xfer_wire_parse_header(frame, 64, &hdr, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "unknown frame type 9") != NULL, "%s", why);

    pack_sample(&h);
    be = htonl(XFER_WIRE_MAX_BODY + 1);
    memcpy(frame + 8, &be, 4);
    cr_expect_eq(xfer_wire_parse_header(frame, 64, &hdr, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "exceeds the limit") != NULL, "%s", why);
}

/* Build a HELLO body by hand, to say things the packer refuses to say. */
static size_t body(uint8_t *b, uint16_t num, const char *name, uint8_t name_len,
                   uint16_t addr_len, size_t addr_bytes)
{
    size_t off = 0;
    uint16_t be;

    be = htons(num);
    memcpy(b + off, &be, 2);
    off += 2;
    b[off++] = name_len;
    memcpy(b + off, name, strlen(name));
    off += strlen(name);
    be = htons(addr_len);
    memcpy(b + off, &be, 2);
    off += 2;
    memset(b + off, 0, addr_bytes);
    return off + addr_bytes;
}

Test(wire, lying_hello_bodies)
{
    static uint8_t b[4096];
    xfer_wire_hello_t out;
    size_t n;

    n = body(b, 17, "tcp", 3, 0, 0);
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "lists 17 transports, the limit is 16") != NULL, "%s", why);

    n = body(b, 1, "", 0, 0, 0);
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);

    n = body(b, 1, "abcdefghijklmnopqrstuvwxyzabcdef", 32, 0, 0);
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);

    n = body(b, 1, "TCP!", 4, 0, 0);
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "outside [a-z0-9_]") != NULL, "%s", why);

    n = body(b, 1, "tcp", 3, XFER_WIRE_MAX_ADDR + 1, XFER_WIRE_MAX_ADDR + 1);
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "over the limit of 1024") != NULL, "%s", why);

    n = body(b, 1, "tcp", 3, 100, 10);   /* claims 100 address bytes, has 10 */
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);

    n = body(b, 1, "tcp", 3, 4, 4) + 3;  /* trailing garbage */
    cr_expect_eq(xfer_wire_parse_hello(b, n, &out, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_expect(strstr(why, "3 trailing bytes") != NULL, "%s", why);

    {
        static const uint8_t dup[] = {0, 2, 3, 't', 'c', 'p', 0, 0, 3, 't', 'c', 'p', 0, 0};
        cr_expect_eq(xfer_wire_parse_hello(dup, sizeof(dup), &out, why, sizeof(why)),
                     XFER_ERR_PROTOCOL);
        cr_expect(strstr(why, "lists transport 'tcp' twice") != NULL, "%s", why);
    }
}

Test(wire, accept_and_reject)
{
    xfer_wire_header_t hdr;
    xfer_wire_reject_t rej;
    char name[XFER_WIRE_MAX_NAME + 1];
    size_t len = sizeof(frame);

    cr_assert_eq(xfer_wire_pack_accept("verbs", frame, &len), XFER_OK);
    cr_assert_eq(xfer_wire_parse_header(frame, len, &hdr, why, sizeof(why)), XFER_OK);
    cr_expect_eq(hdr.type, XFER_WIRE_ACCEPT);
    cr_assert_eq(xfer_wire_parse_accept(frame + XFER_WIRE_HEADER_LEN, hdr.body_len, name, why,
                                        sizeof(why)), XFER_OK);
    cr_expect_str_eq(name, "verbs");
    cr_expect_eq(xfer_wire_parse_accept(frame + XFER_WIRE_HEADER_LEN, hdr.body_len - 1, name,
                                        why, sizeof(why)), XFER_ERR_PROTOCOL);
    len = sizeof(frame);
    cr_expect_eq(xfer_wire_pack_accept("Bad Name", frame, &len), XFER_ERR_INVALID_PARAM);

    len = sizeof(frame);
    cr_assert_eq(xfer_wire_pack_reject(XFER_ERR_UNREACHABLE, "no shared\ttransport", frame,
                                       &len), XFER_OK);
    cr_assert_eq(xfer_wire_parse_header(frame, len, &hdr, why, sizeof(why)), XFER_OK);
    cr_assert_eq(xfer_wire_parse_reject(frame + XFER_WIRE_HEADER_LEN, hdr.body_len, &rej, why,
                                        sizeof(why)), XFER_OK);
    cr_expect_eq(rej.status, XFER_ERR_UNREACHABLE);
    cr_expect_str_eq(rej.reason, "no shared?transport", "control characters are neutralised");
    cr_expect_eq(xfer_wire_parse_reject(frame + XFER_WIRE_HEADER_LEN, 3, &rej, why, sizeof(why)),
                 XFER_ERR_PROTOCOL);
}

Test(wire, reason_copy_neutralises_and_truncates)
{
    const char src[] = {'o', 'k', '\n', (char)0x80, (char)0xff, 'x', '\0', 'y'};
    char dst[8];

    memset(dst, '#', sizeof(dst));
    xfer_reason_copy(dst, sizeof(dst), src, sizeof(src));
    cr_expect_str_eq(dst, "ok???x?", "non-printable bytes, high ones and NUL included, are '?'");

    memset(dst, '#', sizeof(dst));
    xfer_reason_copy(dst, 3, src, sizeof(src));
    cr_expect_str_eq(dst, "ok", "at most size - 1 characters");
    cr_expect_eq(dst[3], '#', "nothing written past size");

    memset(dst, '#', sizeof(dst));
    xfer_reason_copy(dst, sizeof(dst), src, 0);
    cr_expect_str_eq(dst, "");
    xfer_reason_copy(dst + 1, 0, src, sizeof(src));
    cr_expect_eq(dst[1], '#', "size 0 writes nothing");
}

Test(wire, packing_never_overflows)
{
    xfer_wire_hello_t h;
    uint8_t small[64 + 16];
    size_t len;

    pack_sample(&h);
    memset(small, 0xee, sizeof(small));
    len = 64;
    cr_expect_eq(xfer_wire_pack_hello(&h, small, &len), XFER_ERR_NO_RESOURCE);
    for (size_t i = 64; i < sizeof(small); i++) {
        cr_expect_eq(small[i], 0xee, "byte %zu past the buffer was written", i);
    }
    h.num = XFER_WIRE_MAX_TRANSPORTS + 1;
    len   = sizeof(frame);
    cr_expect_eq(xfer_wire_pack_hello(&h, frame, &len), XFER_ERR_OUT_OF_RANGE);
}

Test(wire, negotiation)
{
    xfer_wire_hello_t client = {0}, server = {0};

    add(&client, "verbs", 0, 0);
    add(&client, "tcp", 0, 0);
    add(&server, "tcp", 0, 0);
    add(&server, "verbs", 0, 0);
    cr_expect_eq(xfer_wire_negotiate(&client, &server, why, sizeof(why)), 0,
                 "the client's preference order decides");

    memset(&server, 0, sizeof(server));
    add(&server, "gdr", 0, 0);
    cr_expect_eq(xfer_wire_negotiate(&client, &server, why, sizeof(why)), -1);
    cr_expect_str_eq(why, "no shared transport: client offered verbs,tcp; server offered gdr");

    memset(&server, 0, sizeof(server));
    cr_expect_eq(xfer_wire_negotiate(&client, &server, why, sizeof(why)), -1);
    cr_expect(strstr(why, "server offered nothing") != NULL, "%s", why);
}

/* A reachability check that records what it was asked and refuses the names in refuse. */
typedef struct reach_probe {
    const char *refuse[XFER_WIRE_MAX_TRANSPORTS];
    const char *reason;             /* NULL: refuse without a reason */
    unsigned   calls;
    char       asked[XFER_WIRE_MAX_TRANSPORTS][XFER_WIRE_MAX_NAME + 1];
    size_t     addr_len[XFER_WIRE_MAX_TRANSPORTS];
    uint8_t    addr_first[XFER_WIRE_MAX_TRANSPORTS];
} reach_probe_t;

static int probe_reachable(void *arg, const char *name, const void *addr, size_t addr_len,
                           char *reason, size_t reason_size)
{
    reach_probe_t *p = arg;
    unsigned i       = p->calls++;

    snprintf(p->asked[i], sizeof(p->asked[i]), "%s", name);
    p->addr_len[i]   = addr_len;
    p->addr_first[i] = addr_len ? *(const uint8_t*)addr : 0;
    for (unsigned r = 0; (r < XFER_WIRE_MAX_TRANSPORTS) && (p->refuse[r] != NULL); r++) {
        if (strcmp(p->refuse[r], name) == 0) {
            if (p->reason != NULL) {
                snprintf(reason, reason_size, "%s", p->reason);
            }
            return 0;
        }
    }
    return 1;
}

Test(wire, negotiation_skips_unreachable_transports)
{
    xfer_wire_hello_t client = {0}, server = {0};
    reach_probe_t probe      = {.refuse = {"shm"}, .reason = "other host (boot id differs)"};

    add(&client, "verbs", 4, 0x0f);     /* the server does not offer it: never asked */
    add(&client, "shm", 52, 0x51);
    add(&client, "tcp", 20, 0x7c);
    add(&server, "tcp", 0, 0);
    add(&server, "shm", 0, 0);
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, probe_reachable, &probe, why,
                                               sizeof(why)), 2, "shm is skipped, tcp chosen");
    cr_assert_eq(probe.calls, 2);
    /* asked in client order, each with the client's address for that transport */
    cr_expect_str_eq(probe.asked[0], "shm");
    cr_expect_eq(probe.addr_len[0], 52);
    cr_expect_eq(probe.addr_first[0], 0x51);
    cr_expect_str_eq(probe.asked[1], "tcp");
    cr_expect_eq(probe.addr_len[1], 20);
    cr_expect_eq(probe.addr_first[1], 0x7c);

    /* the first reachable one ends the search */
    memset(&probe, 0, sizeof(probe));
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, probe_reachable, &probe, why,
                                               sizeof(why)), 1);
    cr_expect_eq(probe.calls, 1);

    /* without a check, names alone decide */
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, NULL, NULL, why, sizeof(why)),
                 1);
}

Test(wire, negotiation_names_every_unreachable_transport)
{
    xfer_wire_hello_t client = {0}, server = {0};
    reach_probe_t probe      = {.refuse = {"shm", "tcp"}, .reason = "other host (boot id differs)"};

    add(&client, "shm", 52, 0x51);
    add(&client, "tcp", 20, 0x7c);
    add(&server, "shm", 0, 0);
    add(&server, "tcp", 0, 0);
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, probe_reachable, &probe, why,
                                               sizeof(why)), -1);
    cr_expect_str_eq(why, "no shared transport reaches the client: client offered shm,tcp; "
                          "server offered shm,tcp; shm unreachable: other host (boot id "
                          "differs); tcp unreachable: other host (boot id differs)");

    /* a refusal without a reason still names the transport */
    memset(&probe, 0, sizeof(probe));
    probe.refuse[0] = "shm";
    probe.refuse[1] = "tcp";
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, probe_reachable, &probe, why,
                                               sizeof(why)), -1);
    cr_expect(strstr(why, "; shm unreachable: no reason given; tcp unreachable: no reason "
                          "given") != NULL, "%s", why);

    /* nothing shared: nothing to ask, the plain wording */
    memset(&probe, 0, sizeof(probe));
    memset(&server, 0, sizeof(server));
    add(&server, "verbs", 0, 0);
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, probe_reachable, &probe, why,
                                               sizeof(why)), -1);
    cr_expect_eq(probe.calls, 0);
    cr_expect_str_eq(why, "no shared transport: client offered shm,tcp; server offered verbs");
}

Test(wire, negotiation_reasons_are_bounded)
{
    xfer_wire_hello_t client = {0}, server = {0};
    reach_probe_t probe      = {0};
    char name[16], reason[400], big[XFER_WIRE_MAX_REASON + 1];

    memset(reason, 'r', sizeof(reason) - 1);
    reason[sizeof(reason) - 1] = '\0';
    probe.reason = reason;
    for (unsigned i = 0; i < XFER_WIRE_MAX_TRANSPORTS; i++) {
        snprintf(name, sizeof(name), "t%u", i);
        add(&client, name, 1, (uint8_t)i);
        add(&server, name, 1, (uint8_t)i);
        probe.refuse[i] = client.transports[i].name;
    }
    memset(big, 0xee, sizeof(big));
    cr_expect_eq(xfer_wire_negotiate_reachable(&client, &server, probe_reachable, &probe, big,
                                               sizeof(big)), -1);
    cr_expect_eq(probe.calls, XFER_WIRE_MAX_TRANSPORTS);
    cr_expect_lt(strlen(big), sizeof(big));
    /* it still fits a REJECT */
    {
        size_t len = sizeof(frame);
        cr_expect_eq(xfer_wire_pack_reject(XFER_ERR_UNREACHABLE, big, frame, &len), XFER_OK);
    }
}

Test(wire, random_bytes_never_crash)
{
    xfer_wire_header_t hdr;
    xfer_wire_hello_t hello;
    xfer_wire_reject_t rej;
    char name[XFER_WIRE_MAX_NAME + 1];
    unsigned seed = 12345, accepted = 0;

    for (int iter = 0; iter < 20000; iter++) {
        size_t n    = (size_t)(rand_r(&seed) % 300);
        uint8_t *buf = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) {
            buf[i] = (uint8_t)rand_r(&seed);
        }
        /* half of the time, give it a valid-looking start so the body parsers get exercised */
        if ((iter & 1) && (n >= 2)) {
            buf[0] = 0;
            buf[1] = (uint8_t)(rand_r(&seed) % 4);
        }
        xfer_wire_parse_header(buf, n, &hdr, why, sizeof(why));
        if (xfer_wire_parse_hello(buf, n, &hello, why, sizeof(why)) == XFER_OK) {
            cr_assert_leq(hello.num, XFER_WIRE_MAX_TRANSPORTS);
            accepted++;
        }
        xfer_wire_parse_accept(buf, n, name, why, sizeof(why));
        xfer_wire_parse_reject(buf, n, &rej, why, sizeof(why));
        free(buf);
    }
    cr_log_info("%u of 20000 random bodies parsed as HELLO", accepted);
}
