/*
 * The bootstrap frames (framework/wire/bootstrap_wire.c), the first bytes a peer sends.
 *
 * The input is read as the stream bootstrap.c reads: a header, then exactly body_len bytes
 * handed to the parser of the header's type, then the next frame. Every frame that parses is
 * packed again and must come out byte for byte as it went in (REJECT: the reason is made
 * printable, so its packing must parse to the same value). Two parsed HELLOs are negotiated.
 * Then the same bytes are read as a recipe for values (a HELLO, an ACCEPT, a REJECT, a
 * CONNECT) that are packed and parsed back: parse(pack(x)) == x.
 */
#include "fuzz.h"
#include "../../framework/wire/bootstrap_wire.h"

#define FRAME_MAX (XFER_WIRE_HEADER_LEN + XFER_WIRE_MAX_BODY)

static uint8_t frame[FRAME_MAX];
static xfer_wire_hello_t hellos[2], hello_in, hello_out;

static void check_same_hello(const xfer_wire_hello_t *a, const xfer_wire_hello_t *b)
{
    FUZZ_CHECK(a->num == b->num, "%u transports became %u", a->num, b->num);
    for (uint16_t i = 0; i < a->num; i++) {
        const xfer_wire_transport_t *x = &a->transports[i], *y = &b->transports[i];

        FUZZ_CHECK(strcmp(x->name, y->name) == 0, "name '%s' became '%s'", x->name, y->name);
        FUZZ_CHECK((x->addr_len == y->addr_len) && !memcmp(x->addr, y->addr, x->addr_len),
                   "address of '%s' changed", x->name);
    }
}

static void check_negotiation(const xfer_wire_hello_t *client, const xfer_wire_hello_t *server)
{
    char why[512];
    int i = xfer_wire_negotiate(client, server, why, sizeof(why));

    if (i < 0) {
        for (uint16_t c = 0; c < client->num; c++) {
            for (uint16_t s = 0; s < server->num; s++) {
                FUZZ_CHECK(strcmp(client->transports[c].name, server->transports[s].name),
                           "no transport chosen although both offer '%s'",
                           client->transports[c].name);
            }
        }
        return;
    }
    FUZZ_CHECK(i < client->num, "chose transport %d of %u", i, client->num);
    for (int c = 0; c < i; c++) {
        for (uint16_t s = 0; s < server->num; s++) {
            FUZZ_CHECK(strcmp(client->transports[c].name, server->transports[s].name),
                       "chose %d although the client prefers shared %d", i, c);
        }
    }
}

/* One parsed body of the frame at f (frame_len bytes): pack it again and compare. */
static void round_trip_body(const xfer_wire_header_t *hdr, const uint8_t *f, size_t frame_len,
                            unsigned *num_hellos)
{
    const uint8_t *body = f + XFER_WIRE_HEADER_LEN;
    xfer_wire_reject_t reject, reject2;
    xfer_wire_connect_t conn;
    xfer_wire_header_t hdr2;
    char name[XFER_WIRE_MAX_NAME + 1], why[512];
    xfer_wire_hello_t *hello = &hellos[*num_hellos % 2];
    size_t len = sizeof(frame);
    xfer_status_t status;

    switch (hdr->type) {
    case XFER_WIRE_HELLO:
        if (xfer_wire_parse_hello(body, hdr->body_len, hello, why, sizeof(why)) != XFER_OK) {
            return;
        }
        status = xfer_wire_pack_hello(hello, frame, &len);
        if (++*num_hellos >= 2) {
            check_negotiation(&hellos[0], &hellos[1]);
            check_negotiation(&hellos[1], &hellos[0]);
        }
        break;
    case XFER_WIRE_ACCEPT:
        if (xfer_wire_parse_accept(body, hdr->body_len, name, why, sizeof(why)) != XFER_OK) {
            return;
        }
        status = xfer_wire_pack_accept(name, frame, &len);
        break;
    case XFER_WIRE_REJECT:
        if (xfer_wire_parse_reject(body, hdr->body_len, &reject, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK(strlen(reject.reason) <= XFER_WIRE_MAX_REASON, "reason too long");
        status = xfer_wire_pack_reject((xfer_status_t)reject.status, reject.reason, frame,
                                       &len);
        FUZZ_CHECK(status == XFER_OK, "packing a parsed REJECT: %d", status);
        FUZZ_CHECK(xfer_wire_parse_header(frame, len, &hdr2, why, sizeof(why)) == XFER_OK,
                   "packed REJECT header: %s", why);
        FUZZ_CHECK(xfer_wire_parse_reject(frame + XFER_WIRE_HEADER_LEN, hdr2.body_len,
                                          &reject2, why, sizeof(why)) == XFER_OK,
                   "packed REJECT: %s", why);
        FUZZ_CHECK((reject.status == reject2.status) &&
                   (strcmp(reject.reason, reject2.reason) == 0), "REJECT changed");
        return;
    case XFER_WIRE_CONNECT:
        if (xfer_wire_parse_connect(body, hdr->body_len, &conn, why, sizeof(why)) != XFER_OK) {
            return;
        }
        status = xfer_wire_pack_connect(&conn, frame, &len);
        break;
    case XFER_WIRE_AUTH_NONCE:
    case XFER_WIRE_AUTH_MAC: {
        uint8_t data[XFER_WIRE_AUTH_LEN];

        if (xfer_wire_parse_auth(body, hdr->body_len, data, why, sizeof(why)) != XFER_OK) {
            return;
        }
        status = xfer_wire_pack_auth((xfer_wire_type_t)hdr->type, data, frame, &len);
        break;
    }
    default:
        FUZZ_CHECK(0, "the header parser let type %u through", hdr->type);
        return;
    }
    FUZZ_CHECK(status == XFER_OK, "packing a parsed frame of type %u: %d", hdr->type, status);
    FUZZ_CHECK((len == frame_len) && (memcmp(frame, f, len) == 0),
               "frame of type %u (%zu bytes) packs to %zu different bytes", hdr->type,
               frame_len, len);
}

static void parse_stream(const uint8_t *data, size_t size)
{
    unsigned num_hellos = 0;
    char why[512];

    while (size > 0) {
        xfer_wire_header_t hdr;

        if (xfer_wire_parse_header(data, size, &hdr, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK(hdr.body_len <= XFER_WIRE_MAX_BODY, "body_len %u passed", hdr.body_len);
        if (size - XFER_WIRE_HEADER_LEN < hdr.body_len) {
            return;     /* the reader would wait for the rest */
        }
        round_trip_body(&hdr, data, XFER_WIRE_HEADER_LEN + hdr.body_len, &num_hellos);
        data += XFER_WIRE_HEADER_LEN + hdr.body_len;
        size -= XFER_WIRE_HEADER_LEN + hdr.body_len;
    }
}

/* Parse the one frame in frame[0..len) and return its body and header. */
static const uint8_t *reparse_header(size_t len, xfer_wire_type_t type, xfer_wire_header_t *hdr)
{
    char why[512];

    FUZZ_CHECK(xfer_wire_parse_header(frame, len, hdr, why, sizeof(why)) == XFER_OK,
               "packed header: %s", why);
    FUZZ_CHECK((hdr->type == type) && (hdr->body_len == len - XFER_WIRE_HEADER_LEN),
               "packed header says type %u, %u bytes", hdr->type, hdr->body_len);
    return frame + XFER_WIRE_HEADER_LEN;
}

static void round_trip_values(const uint8_t *data, size_t size)
{
    fuzz_cursor_t c = {data, size};
    xfer_wire_header_t hdr;
    xfer_wire_connect_t conn, conn2;
    xfer_wire_reject_t reject;
    char name[XFER_WIRE_MAX_NAME + 1], name2[XFER_WIRE_MAX_NAME + 1], why[512];
    char reason[XFER_WIRE_MAX_REASON + 1];
    const uint8_t *body;
    size_t len, n;
    int dup = 0;

    /* HELLO: names of the wire's alphabet; duplicates are refused by the parser only */
    memset(&hello_in, 0, sizeof(hello_in));
    hello_in.num = (uint16_t)(fuzz_take(&c, 1) % (XFER_WIRE_MAX_TRANSPORTS + 1));
    for (uint16_t i = 0; i < hello_in.num; i++) {
        xfer_wire_transport_t *t = &hello_in.transports[i];

        fuzz_take_name(&c, t->name, XFER_WIRE_MAX_NAME);
        t->addr_len = (uint16_t)fuzz_take_bytes(&c, t->addr, 64);
        for (uint16_t j = 0; j < i; j++) {
            dup |= (strcmp(hello_in.transports[j].name, t->name) == 0);
        }
    }
    len = sizeof(frame);
    FUZZ_CHECK(xfer_wire_pack_hello(&hello_in, frame, &len) == XFER_OK, "pack HELLO");
    body = reparse_header(len, XFER_WIRE_HELLO, &hdr);
    if (xfer_wire_parse_hello(body, hdr.body_len, &hello_out, why, sizeof(why)) == XFER_OK) {
        FUZZ_CHECK(!dup, "a HELLO naming a transport twice parsed");
        check_same_hello(&hello_in, &hello_out);
    } else {
        FUZZ_CHECK(dup, "a packed HELLO does not parse: %s", why);
    }

    fuzz_take_name(&c, name, XFER_WIRE_MAX_NAME);
    len = sizeof(frame);
    FUZZ_CHECK(xfer_wire_pack_accept(name, frame, &len) == XFER_OK, "pack ACCEPT");
    body = reparse_header(len, XFER_WIRE_ACCEPT, &hdr);
    FUZZ_CHECK(xfer_wire_parse_accept(body, hdr.body_len, name2, why, sizeof(why)) == XFER_OK,
               "a packed ACCEPT does not parse: %s", why);
    FUZZ_CHECK(strcmp(name, name2) == 0, "ACCEPT '%s' became '%s'", name, name2);

    /* REJECT: printable text, as a reason is once parsed */
    n = fuzz_take_bytes(&c, reason, XFER_WIRE_MAX_REASON);
    for (size_t i = 0; i < n; i++) {
        reason[i] = (char)(' ' + (uint8_t)reason[i] % 95);
    }
    reason[n] = '\0';
    int16_t st = (int16_t)fuzz_take(&c, 2);
    len = sizeof(frame);
    FUZZ_CHECK(xfer_wire_pack_reject((xfer_status_t)st, reason, frame, &len) == XFER_OK,
               "pack REJECT");
    body = reparse_header(len, XFER_WIRE_REJECT, &hdr);
    FUZZ_CHECK(xfer_wire_parse_reject(body, hdr.body_len, &reject, why, sizeof(why)) == XFER_OK,
               "a packed REJECT does not parse: %s", why);
    FUZZ_CHECK((reject.status == st) && (strcmp(reject.reason, reason) == 0), "REJECT changed");

    memset(&conn, 0, sizeof(conn));
    conn.context_id = fuzz_take(&c, 8);
    conn.addr_len   = (uint16_t)fuzz_take_bytes(&c, conn.addr, XFER_WIRE_MAX_ADDR);
    len = sizeof(frame);
    FUZZ_CHECK(xfer_wire_pack_connect(&conn, frame, &len) == XFER_OK, "pack CONNECT");
    body = reparse_header(len, XFER_WIRE_CONNECT, &hdr);
    FUZZ_CHECK(xfer_wire_parse_connect(body, hdr.body_len, &conn2, why, sizeof(why)) == XFER_OK,
               "a packed CONNECT does not parse: %s", why);
    FUZZ_CHECK((conn.context_id == conn2.context_id) && (conn.addr_len == conn2.addr_len) &&
               !memcmp(conn.addr, conn2.addr, conn.addr_len), "CONNECT changed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_stream(data, size);
    round_trip_values(data, size);
    return 0;
}
