/*
 * The fixed world of the fuzz_tcp_stream harness, shared with the seed generator so that
 * seeds can name what the harness sets up: the endpoint's limits, the registered region (id,
 * cookie, address) a PUT_REQ or GET_REQ can hit, the ids of the requests outstanding when
 * the input starts to arrive (answers can match them), the tags of the posted receives and
 * the keys the tensor_request upcall answers in each way.
 */
#ifndef XFER_FUZZ_TCP_STREAM_H
#define XFER_FUZZ_TCP_STREAM_H

#include <stdint.h>

#define TS_MAX_MSG        (1u << 20)   /* XFER_TCP_MAX_MSG_SIZE of both sides */
#define TS_MAX_KEY        64u          /* key limit of both sides */
#define TS_EAGER          256u         /* larger puts and get responses go zero-copy */
#define TS_MAX_UNEXPECTED 4096u        /* the harness's matcher: beyond it a TAG with no
                                        * receive pauses the input */

/* The registered region: id 1 (the iface's first), its key - random, so the seeds carry
 * TS_COOKIE in its place and the harness puts the real key there before the input is fed -
 * and, where the address can be mapped there, a fixed address. */
#define TS_REGION_ID      1u
#define TS_COOKIE         0x5453434f4f4b4945ull
#define TS_REGION_ADDR    0x10000000ull
#define TS_REGION_LEN     4096u

/* Requests posted before the input arrives, in this order: slot i has id TS_ID(i). */
enum {
    TS_SLOT_PUT_SMALL,          /* put of TS_PUT_SMALL_LEN bytes (copied): wants a PUT_ACK */
    TS_SLOT_PUT_LARGE,          /* put of TS_PUT_LARGE_LEN bytes (zero-copy) */
    TS_SLOT_GET,                /* get of TS_GET_LEN bytes: wants a GET_RESP of that length */
    TS_SLOT_FETCH_BUF,          /* tensor fetch into a TS_FETCH_CAPACITY-byte buffer */
    TS_SLOT_FETCH_ALLOC,        /* tensor fetch whose buffer the alloc callback returns */
    TS_SLOT_FETCH_CANCELLED,    /* tensor fetch cancelled at once: its answer is dropped */
    TS_NUM_SLOTS
};
#define TS_ID(slot)       ((1ull << 32) | (uint64_t)(slot))
#define TS_PUT_SMALL_LEN  100u
#define TS_PUT_LARGE_LEN  1000u
#define TS_GET_LEN        64u
#define TS_FETCH_CAPACITY 64u
#define TS_ALLOC_MAX      4096u        /* the alloc callback refuses larger tensors */

/* Posted receives: tag TS_TAG_EXACT from this endpoint (16 bytes), TS_TAG_ANY_PEER from any
 * endpoint (64 bytes), and one that matches every tag (8 bytes). */
#define TS_TAG_EXACT      1u
#define TS_TAG_ANY_PEER   2u

/* How tensor_request answers a key, by its first byte: */
#define TS_KEY_ERROR      'e'   /* ready() with XFER_ERR_NOT_FOUND at once */
#define TS_KEY_LATER      'l'   /* ready() later, from outside any call into the component */
#define TS_KEY_DEAD       'd'   /* a dead tensor */
#define TS_KEY_BAD        'b'   /* metadata that does not hold (the component must refuse) */
                                /* anything else: float32 [2, 3], 24 bytes */

#endif
