/*
 * What the shm suites on the peer's allocated memory (test_shm_map.c, test_shm_coop.c) share:
 * the owner - a child process that allocates memory with xfer_mem_alloc() and answers
 * commands over the control socket - and the initiator's side of it: the owner's keys, puts
 * and gets into its memory, checks of what landed there.
 */
#ifndef XFER_TEST_SHM_OWNER_H
#define XFER_TEST_SHM_OWNER_H

#include "test_peer.h"

#include <stddef.h>
#include <stdint.h>

#define LEN      (1u << 20)
#define MAX_MEMS 12
#define FILL     1
#define MSG_OFF  4096u              /* rendezvous messages start here in an allocation */
#define MSG_LEN  (LEN - 2 * MSG_OFF)
#define MSG_TAG  0x5a

enum {
    CMD_DONE = 1,
    CMD_ALLOC,      /* allocate LEN bytes filled with pattern(FILL); send its key and index */
    CMD_FREE,       /* i: deregister (free) allocation i */
    CMD_CHECK,      /* i off len seed: answer 1 when [off, off + len) of i holds pattern(seed) */
    CMD_PAUSE,      /* answer, then wait for the next command without progressing */
    CMD_FAKE,       /* allocate, and send its key naming an unsealed memfd instead */
    CMD_FAKE_CHECK, /* answer 1 when the unsealed memfd still holds pattern(FILL) */
    CMD_SEND,       /* i: send MSG_LEN bytes at MSG_OFF of allocation i (tag MSG_TAG + i) */
    CMD_SEND_WAIT,  /* answer the status of the last send */
    CMD_REPLACE,    /* i: put an unsealed memfd in place of allocation i's descriptor */
    CMD_CORRUPT,    /* point the mapped rendezvous frames in the peer's ring past their range;
                     * answer how many */
    CMD_SPIN,       /* answer, then progress without ever sleeping until the next command */
    CMD_PIN,        /* cpu: run on that cpu only; answer 1 (0 if the kernel refuses) */
};

/* An owner's allocation as the initiator holds it. */
typedef struct key {
    xfer_rkey_t *rkey;
    uint64_t    addr;
    unsigned    index;      /* the owner's allocation */
    uint32_t    fd;         /* the descriptor number it names */
} peer_key_t;

/* The initiator: its end of the owner, and LEN bytes of malloc'd memory it registered. */
typedef struct init {
    tp_peer_t  p;
    uint8_t    *buf;
    xfer_mem_t *mem;
} init_t;

/* Both suites run over shm. */
void shm_owner_suite_init(void);

/* The shm blob inside a packed key (framework/memory.c's layout); NULL if it has none. */
uint8_t *shm_part(uint8_t *blob, size_t len);
/* The descriptor number a key names (shm_rma.c's layout: at byte 36 of the shm part). */
uint32_t key_fd(void *blob, size_t len);
/* The owner's side: commands until CMD_DONE. */
int srv_owner(tp_side_t *s);

/* Send cmd (CMD_ALLOC, CMD_FAKE) and take the key it answers. */
void key_take(tp_peer_t *p, uint64_t cmd, peer_key_t *k);
/* Does [off, off + len) of the owner's allocation hold pattern(seed)? */
int owner_holds(tp_peer_t *p, const peer_key_t *k, uint64_t off, uint64_t len, uint64_t seed);
void owner_free(tp_peer_t *p, const peer_key_t *k);
/* The owner answers, then stops progressing until the next command. */
void owner_pause(tp_peer_t *p);
/* A put (or get) of len bytes at off, waited for up to timeout_ms: its status. */
xfer_status_t rma(tp_peer_t *p, int put, void *buf, xfer_mem_t *mem, const peer_key_t *k,
                  uint64_t off, size_t len, int timeout_ms, xfer_request_t **req_p);
void init_start(init_t *in);
/* Destroy n keys, end the owner, release our memory. */
void init_finish(init_t *in, peer_key_t *keys, unsigned n);
/* The owner's last CMD_SEND completed with want. */
void send_done(init_t *in, xfer_status_t want);

#endif
