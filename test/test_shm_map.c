/*
 * shm's puts and gets to memory the peer allocated with xfer_mem_alloc(): the initiator maps
 * the peer's sealed memfd and copies itself, so they complete while the owner does not
 * progress; XFER_SHM_MAP=n hands them to the owner again. What a peer announces is checked
 * before anything is mapped: a key whose memory was freed never reaches a later allocation
 * that reuses its descriptor number (the inode must match), and a memfd that is not sealed
 * against shrinking - one the owner could cut short under the mapping, faulting us - is never
 * mapped (the owner announces it by a key it rewrote itself: a hostile peer, for real).
 *
 * Rendezvous messages sent from such memory: the receiver copies them from a read-only
 * mapping of the sender's memfd, kept for later messages (at most 8 per peer); a descriptor
 * number that names another file now is read by CMA instead, and after 8 such ranges the
 * peer is not mapped at all; a message that claims bytes
 * beyond the range it names (the sender rewrites its frame in our ring) fails the endpoint.
 *
 * Large puts (XFER_SHM_COOP_MIN, lowered here to 256 KiB so that a 1 MiB put has 4 parts) are
 * copied by both sides while the owner progresses: the data lands whole, from a mapped source
 * or by CMA, and the initiator's log shows the owner took parts; an owner that does not
 * progress takes none and the put completes anyway; a flush waits for a shared put. A large
 * message from allocated memory into allocated memory is shared the same way: the sender
 * copies parts into the receive buffer, which it maps.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEN      (1u << 20)
#define MAX_MEMS 12
#define FILL     1
#define MSG_OFF  4096u              /* rendezvous messages start here in an allocation */
#define MSG_LEN  (LEN - 2 * MSG_OFF)
#define MSG_TAG  0x5a

static void suite_init(void)
{
    setenv("XFERTEST_TRANSPORT", "shm", 1);
    tp_env();
}

TestSuite(shm_map, .init = suite_init, .timeout = 120);

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

/* ---- a key's shm part ------------------------------------------------------------------------ */

/* The shm blob inside a packed key (framework/memory.c's layout); NULL if it has none. */
static uint8_t *shm_part(uint8_t *blob, size_t len)
{
    size_t off = 4 + 1 + 3 * 8;
    unsigned num;

    if (len < off) {
        return NULL;
    }
    num = blob[4];
    for (unsigned i = 0; i < num; i++) {
        size_t name_len, part_len;

        if (off + 1 > len) {
            return NULL;
        }
        name_len = blob[off];
        if (off + 1 + name_len + 2 > len) {
            return NULL;
        }
        part_len = ((size_t)blob[off + 1 + name_len] << 8) | blob[off + 2 + name_len];
        if ((name_len == 3) && (memcmp(blob + off + 1, "shm", 3) == 0) &&
            (off + 3 + name_len + part_len <= len) && (part_len >= 48)) {
            return blob + off + 3 + name_len;
        }
        off += 3 + name_len + part_len;
    }
    return NULL;
}

/* The descriptor number a key names (shm_rma.c's layout: at byte 36 of the shm part). */
static uint32_t key_fd(void *blob, size_t len)
{
    uint8_t *part = shm_part(blob, len);
    uint32_t fd;

    cr_assert_not_null(part, "the key has an shm part");
    memcpy(&fd, part + 36, 4);
    return fd;
}

/* ---- the owner ------------------------------------------------------------------------------- */

typedef struct owner {
    tp_side_t      *s;
    xfer_mem_t     *mems[MAX_MEMS];
    unsigned       n;
    uint8_t        *fake;       /* the unsealed memfd's mapping */
    xfer_request_t *send;       /* the last CMD_SEND's */
} owner_t;

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

static void owner_send_key(owner_t *o, unsigned i, int fake_fd)
{
    void *blob;
    size_t len;

    TP_CHECK_STATUS(xfer_rkey_pack(o->mems[i], &blob, &len), XFER_OK);
    if (fake_fd >= 0) {
        uint8_t *part = shm_part(blob, len);
        uint32_t fd   = (uint32_t)fake_fd;
        struct stat st;
        uint64_t ino;

        TP_CHECK((part != NULL) && (fstat(fake_fd, &st) == 0), "shm part, fstat");
        ino = (uint64_t)st.st_ino;
        memcpy(part + 36, &fd, 4);
        memcpy(part + 40, &ino, 8);
    }
    TP_CHECK(tp_ctl_send(o->s->ctl, blob, len) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(o->s->ctl, i) == 0, "ctl");
    xfer_rkey_blob_free(blob);
}

static unsigned owner_alloc(owner_t *o)
{
    TP_CHECK(o->n < MAX_MEMS, "too many allocations");
    TP_CHECK_STATUS(xfer_mem_alloc(o->s->ctx, LEN, XFER_MEM_HOST, &o->mems[o->n]), XFER_OK);
    tp_fill_pattern(xfer_mem_address(o->mems[o->n]), LEN, FILL);
    return o->n++;
}

/* The descriptor number of allocation i's memfd, as its key names it. */
static int owner_fd(owner_t *o, unsigned i)
{
    uint8_t *part;
    uint32_t fd;
    size_t len;
    void *blob;

    TP_CHECK_STATUS(xfer_rkey_pack(o->mems[i], &blob, &len), XFER_OK);
    part = shm_part(blob, len);
    TP_CHECK(part != NULL, "the key has an shm part");
    memcpy(&fd, part + 36, 4);
    xfer_rkey_blob_free(blob);
    return (int)fd;
}

static void owner_send(owner_t *o, unsigned i)
{
    uint8_t *addr = xfer_mem_address(o->mems[i]);

    TP_CHECK(o->send == NULL, "a send is pending");
    TP_CHECK(TP_POSTED(xfer_tag_send(o->s->ep, MSG_TAG + i, addr + MSG_OFF, MSG_LEN,
                                     o->mems[i], NULL, NULL, &o->send)), "tag send");
}

static xfer_status_t owner_send_wait(owner_t *o)
{
    xfer_status_t st = xfer_request_wait(o->send, TP_WAIT_MS);

    xfer_request_release(o->send);
    o->send = NULL;
    return st;
}

/* Rewrite the payload of every TAG frame flagged RNDV|MAPPED in the rings this process maps
 * (shm_ring.h's layout; the payload is xfer_shm_rndv_mem_t): its message now starts at the
 * end of its range. */
static unsigned owner_corrupt(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    unsigned n = 0;
    char line[512];

    TP_CHECK(maps != NULL, "maps");
    while (fgets(line, sizeof(line), maps) != NULL) {
        unsigned long lo, hi;
        uint32_t ncells, cell_size;
        uint8_t *base;

        if ((strstr(line, "memfd:xfer-shm") == NULL) ||
            (sscanf(line, "%lx-%lx", &lo, &hi) != 2)) {
            continue;
        }
        base = (uint8_t*)lo;
        memcpy(&ncells, base + 8, 4);
        memcpy(&cell_size, base + 12, 4);
        for (uint32_t c = 0; c < ncells; c++) {
            uint8_t *cell = base + 512 + (size_t)c * cell_size;  /* cells from 512 */
            uint16_t type, flags;
            uint64_t length;

            memcpy(&type, cell + 4, 2);
            memcpy(&flags, cell + 6, 2);
            if ((type != 2) || (flags != (1u | 16u))) {     /* TAG, RNDV | MAPPED */
                continue;
            }
            memcpy(&length, cell + 64 + 24, 8);
            memcpy(cell + 64 + 32, &length, 8);             /* msg_offset = length */
            n++;
        }
    }
    fclose(maps);
    return n;
}

static int srv_owner(tp_side_t *s)
{
    owner_t o = {.s = s};
    int fake_fd = -1;

    for (;;) {
        uint64_t cmd, i, off, len, seed;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        switch (cmd) {
        case CMD_DONE:
            return 0;
        case CMD_ALLOC:
            owner_send_key(&o, owner_alloc(&o), -1);
            break;
        case CMD_FAKE:
            fake_fd = memfd_create("xfer-test-unsealed", MFD_CLOEXEC);
            TP_CHECK((fake_fd >= 0) && (ftruncate(fake_fd, LEN) == 0), "memfd");
            o.fake = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fake_fd, 0);
            TP_CHECK(o.fake != MAP_FAILED, "mmap");
            tp_fill_pattern(o.fake, LEN, FILL);
            owner_send_key(&o, owner_alloc(&o), fake_fd);
            break;
        case CMD_FAKE_CHECK:
            TP_CHECK(tp_ctl_send_u64(s->ctl, tp_check_pattern(o.fake, LEN, FILL) < 0) == 0,
                     "ctl");
            break;
        case CMD_FREE:
            i = ctl_u64(s);
            TP_CHECK((i < o.n) && (o.mems[i] != NULL), "free of %llu", (unsigned long long)i);
            TP_CHECK_STATUS(xfer_mem_deregister(o.mems[i]), XFER_OK);
            o.mems[i] = NULL;
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            break;
        case CMD_CHECK:
            i    = ctl_u64(s);
            off  = ctl_u64(s);
            len  = ctl_u64(s);
            seed = ctl_u64(s);
            TP_CHECK((i < o.n) && (o.mems[i] != NULL) && (off + len <= LEN), "check");
            TP_CHECK(tp_ctl_send_u64(s->ctl, tp_check_pattern_at(xfer_mem_address(o.mems[i]),
                                                                 off, len, seed) < 0) == 0,
                     "ctl");
            break;
        case CMD_PAUSE:
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK(tp_ctl_ready(s->ctl, TP_WAIT_MS), "no command after a pause");
            break;
        case CMD_SEND:
            i = ctl_u64(s);
            TP_CHECK((i < o.n) && (o.mems[i] != NULL), "send from %llu", (unsigned long long)i);
            owner_send(&o, (unsigned)i);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            break;
        case CMD_SEND_WAIT:
            TP_CHECK(tp_ctl_send_u64(s->ctl, owner_send_wait(&o)) == 0, "ctl");
            break;
        case CMD_REPLACE:
            i       = ctl_u64(s);
            fake_fd = memfd_create("xfer-test-unsealed", MFD_CLOEXEC);
            TP_CHECK((i < o.n) && (fake_fd >= 0) && (ftruncate(fake_fd, LEN) == 0), "memfd");
            TP_CHECK(dup2(fake_fd, owner_fd(&o, (unsigned)i)) >= 0, "dup2");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            break;
        case CMD_CORRUPT:
            TP_CHECK(tp_ctl_send_u64(s->ctl, owner_corrupt()) == 0, "ctl");
            break;
        case CMD_PIN: {
            cpu_set_t set;

            i = ctl_u64(s);
            CPU_ZERO(&set);
            CPU_SET((int)i, &set);
            TP_CHECK(tp_ctl_send_u64(s->ctl, sched_setaffinity(0, sizeof(set), &set) == 0) == 0,
                     "ctl");
            break;
        }
        case CMD_SPIN:
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            while (!tp_ctl_ready(s->ctl, 0)) {
                xfer_progress(s->ctx);
            }
            break;
        default:
            TP_CHECK(0, "unknown command %llu", (unsigned long long)cmd);
        }
    }
}

/* ---- the initiator --------------------------------------------------------------------------- */

typedef struct key {
    xfer_rkey_t *rkey;
    uint64_t    addr;
    unsigned    index;      /* the owner's allocation */
    uint32_t    fd;         /* the descriptor number it names */
} peer_key_t;

static void key_take(tp_peer_t *p, uint64_t cmd, peer_key_t *k)
{
    size_t len;
    void *blob;

    tp_send(p, cmd);
    blob     = tp_recv_blob(p, &len);
    k->index = (unsigned)tp_recv(p);
    k->fd    = key_fd(blob, len);
    cr_assert_eq(xfer_rkey_unpack(p->ep, blob, len, &k->rkey), XFER_OK);
    k->addr = xfer_rkey_address(k->rkey);
    free(blob);
}

static int owner_holds(tp_peer_t *p, const peer_key_t *k, uint64_t off, uint64_t len, uint64_t seed)
{
    tp_send(p, CMD_CHECK);
    tp_send(p, k->index);
    tp_send(p, off);
    tp_send(p, len);
    tp_send(p, seed);
    return (int)tp_recv(p);
}

static void owner_free(tp_peer_t *p, const peer_key_t *k)
{
    tp_send(p, CMD_FREE);
    tp_send(p, k->index);
    cr_assert_eq(tp_recv(p), 1);
}

static void owner_pause(tp_peer_t *p)
{
    tp_send(p, CMD_PAUSE);
    cr_assert_eq(tp_recv(p), 1);
}

/* A put (or get) of len bytes at off, waited for up to timeout_ms: its status. */
static xfer_status_t rma(tp_peer_t *p, int put, void *buf, xfer_mem_t *mem, const peer_key_t *k,
                         uint64_t off, size_t len, int timeout_ms, xfer_request_t **req_p)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;

    st = put ? xfer_put(p->ep, buf, len, mem, k->addr + off, k->rkey, NULL, NULL, &req) :
               xfer_get(p->ep, buf, len, mem, k->addr + off, k->rkey, NULL, NULL, &req);
    if (!TP_POSTED(st)) {
        return st;
    }
    st = xfer_request_wait(req, timeout_ms);
    if ((st == XFER_ERR_TIMEOUT) && (req_p != NULL)) {
        *req_p = req;       /* still pending: the caller waits again */
        return st;
    }
    xfer_request_release(req);
    return st;
}

typedef struct init {
    tp_peer_t  p;
    uint8_t    *buf;
    xfer_mem_t *mem;
} init_t;

static void init_start(init_t *in)
{
    tp_start(&in->p, srv_owner, NULL);
    in->buf = malloc(LEN);
    cr_assert_not_null(in->buf);
    cr_assert_eq(xfer_mem_register(in->p.ctx, in->buf, LEN, XFER_MEM_HOST, &in->mem), XFER_OK);
}

static void init_finish(init_t *in, peer_key_t *keys, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        xfer_rkey_destroy(keys[i].rkey);
    }
    tp_send(&in->p, CMD_DONE);
    cr_assert_eq(xfer_mem_deregister(in->mem), XFER_OK);
    free(in->buf);
    tp_finish(&in->p);
}

Test(shm_map, puts_and_gets_to_allocated_memory_complete_while_the_owner_sleeps)
{
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    owner_pause(&in.p);
    tp_fill_pattern(in.buf, LEN, 7);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, LEN, 2000, NULL), XFER_OK,
                 "a put to mapped memory waits for nobody");
    memset(in.buf, 0, LEN);
    cr_assert_eq(rma(&in.p, 0, in.buf + 4096, in.mem, &k, 4096, 8192, 2000, NULL), XFER_OK);
    cr_assert_lt(tp_check_pattern_at(in.buf, 4096, 8192, 7), 0, "the get read the put's data");
    /* the command ends the owner's pause: the data is in its memory */
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 7), "the owner's memory holds the put's data");
    init_finish(&in, &k, 1);
}

Test(shm_map, with_XFER_SHM_MAP_n_the_owner_carries_out_the_put)
{
    xfer_request_t *req = NULL;
    init_t in;
    peer_key_t k;

    setenv("XFER_SHM_MAP", "n", 1);
    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    owner_pause(&in.p);
    tp_fill_pattern(in.buf, 65536, 8);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, 65536, 300, &req), XFER_ERR_TIMEOUT,
                 "a put completed while its owner did not progress, with mapping off");
    cr_assert(owner_holds(&in.p, &k, 65536, LEN - 65536, FILL));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    cr_assert(owner_holds(&in.p, &k, 0, 65536, 8));
    init_finish(&in, &k, 1);
}

/* Keys of freed memory: one that was mapped before the free writes the freed pages, which
 * belong to nothing of the owner's; one never mapped names a descriptor number that a later
 * allocation took - its inode differs, nothing is mapped, and the owner refuses the put. */
Test(shm_map, a_key_of_freed_memory_never_reaches_a_later_allocation)
{
    peer_key_t k[4];     /* a: mapped, then freed; b: freed unused; c, d: allocated after */
    init_t in;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k[0]);
    key_take(&in.p, CMD_ALLOC, &k[1]);
    tp_fill_pattern(in.buf, LEN, 11);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k[0], 0, 4096, TP_WAIT_MS, NULL), XFER_OK);
    owner_free(&in.p, &k[0]);
    owner_free(&in.p, &k[1]);
    key_take(&in.p, CMD_ALLOC, &k[2]);
    key_take(&in.p, CMD_ALLOC, &k[3]);
    cr_assert((k[2].fd == k[1].fd) || (k[3].fd == k[1].fd), "a later allocation took the "
              "freed key's descriptor number %u (%u, %u): the case this test is about",
              k[1].fd, k[2].fd, k[3].fd);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k[0], 0, LEN, TP_WAIT_MS, NULL), XFER_OK,
                 "a mapped key writes its own (freed) pages");
    cr_assert_neq(rma(&in.p, 1, in.buf, in.mem, &k[1], 0, LEN, TP_WAIT_MS, NULL), XFER_OK,
                  "a put through the key of freed memory succeeded");
    cr_assert(owner_holds(&in.p, &k[2], 0, LEN, FILL), "a later allocation was written");
    cr_assert(owner_holds(&in.p, &k[3], 0, LEN, FILL), "a later allocation was written");
    init_finish(&in, k, 4);
}

Test(shm_map, a_memfd_that_is_not_sealed_is_never_mapped)
{
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_FAKE, &k);
    tp_fill_pattern(in.buf, LEN, 13);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, LEN, TP_WAIT_MS, NULL), XFER_OK,
                 "the put goes through the owner instead");
    tp_send(&in.p, CMD_FAKE_CHECK);
    cr_assert_eq(tp_recv(&in.p), 1, "the unsealed memfd was written");
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 13), "the registered memory holds the put");
    init_finish(&in, &k, 1);
}

/* A key of memory registered by its owner (not allocated by xfer) names no file: the
 * descriptor is the no-file mark, and the inode and offset after it are zeros, not whatever
 * the heap held (they go to the peer). */
Test(shm_map, a_key_of_registered_memory_names_no_file_and_carries_no_stray_bytes)
{
    static const uint8_t zeros[16];
    void *blob;
    uint8_t *part;
    size_t len;
    init_t in;

    init_start(&in);
    cr_assert_eq(xfer_rkey_pack(in.mem, &blob, &len), XFER_OK);
    part = shm_part(blob, len);
    cr_assert_not_null(part, "the key has an shm part");
    cr_assert_eq(key_fd(blob, len), UINT32_MAX, "a descriptor named for malloc'd memory");
    cr_assert_eq(memcmp(part + 40, zeros, sizeof(zeros)), 0, "inode and offset are not zero");
    xfer_rkey_blob_free(blob);
    init_finish(&in, NULL, 0);
}

/* Copies from XFER_SHM_NT_COPY_MIN on use non-temporal stores (shm_copy.c), which align the
 * destination themselves: every byte lands, at any alignment of either side, and the bytes
 * beside the range stay as they were. */
Test(shm_map, non_temporal_copies_move_every_byte_at_any_alignment)
{
    static const struct {
        size_t src, dst, len;
    } cases[] = {
        {1, 7, 65536 + 13},             /* both unaligned, differently */
        {4099, 70033, 8192 + 5},
        {15, 81920, 4096},              /* the destination aligned, the source not */
        {0, 131072, LEN - 131072 - 4096},
    };
    uint8_t *want = malloc(LEN);
    init_t in;
    peer_key_t k;

    cr_assert_not_null(want);
    setenv("XFER_SHM_NT_COPY_MIN", "4k", 1);
    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t s = cases[i].src, d = cases[i].dst, n = cases[i].len;

        /* the owner checks by offset: what lands at d must be pattern(seed) of d */
        tp_fill_pattern_at(want, d, n, 20 + i);
        memcpy(in.buf + s, want + d, n);
        cr_assert_eq(rma(&in.p, 1, in.buf + s, in.mem, &k, d, n, TP_WAIT_MS, NULL), XFER_OK);
        cr_assert(owner_holds(&in.p, &k, d, n, 20 + i), "case %zu: the put's bytes", i);
        cr_assert(owner_holds(&in.p, &k, d - ((d < 64) ? d : 64), (d < 64) ? d : 64, FILL),
                  "case %zu: bytes before the range changed", i);
        cr_assert(owner_holds(&in.p, &k, d + n, 64, FILL), "case %zu: bytes after it", i);

        memset(in.buf, 0, LEN);
        cr_assert_eq(rma(&in.p, 0, in.buf + s, in.mem, &k, d, n, TP_WAIT_MS, NULL), XFER_OK);
        cr_assert_eq(memcmp(in.buf + s, want + d, n), 0, "case %zu: the get's bytes", i);
        cr_assert_eq(in.buf[s + n], 0, "case %zu: the get wrote past its range", i);
        cr_assert((s == 0) || (in.buf[s - 1] == 0), "case %zu: ... or before it", i);
    }
    init_finish(&in, &k, 1);
    free(want);
}

/* ---- rendezvous messages from allocated memory ------------------------------------------------ */

/* Mappings of a peer's xfer_mem_alloc memfd in this process: read-only ones in *ro. */
static unsigned peer_mem_mappings(unsigned *ro)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    unsigned n = 0;
    char line[512];

    cr_assert_not_null(maps);
    *ro = 0;
    while (fgets(line, sizeof(line), maps) != NULL) {
        char perms[8];

        if ((strstr(line, "memfd:xfer-mem") == NULL) ||
            (sscanf(line, "%*x-%*x %7s", perms) != 1)) {
            continue;
        }
        n++;
        *ro += (strcmp(perms, "r--s") == 0);
    }
    fclose(maps);
    return n;
}

/* Receive the message CMD_SEND sends from allocation k into buf at MSG_OFF, posted before the
 * send (expected) or after it arrived (unexpected); the receive's status. */
static xfer_status_t recv_msg(init_t *in, const peer_key_t *k, int expected)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;

    memset(in->buf, 0, LEN);
    if (!expected) {
        tp_send(&in->p, CMD_SEND);
        tp_send(&in->p, k->index);
        cr_assert_eq(tp_recv(&in->p), 1);
        tp_progress_for(in->p.ctx, 50);     /* the descriptor arrives unexpected */
    }
    st = xfer_tag_recv(in->p.ctx, in->p.ep, MSG_TAG + k->index, UINT64_MAX,
                       in->buf + MSG_OFF, MSG_LEN, in->mem, NULL, NULL, &req);
    cr_assert(TP_POSTED(st), "tag recv: %s", xfer_status_string(st));
    if (expected) {
        tp_send(&in->p, CMD_SEND);
        tp_send(&in->p, k->index);
        cr_assert_eq(tp_recv(&in->p), 1);
    }
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    return st;
}

static void send_done(init_t *in, xfer_status_t want)
{
    tp_send(&in->p, CMD_SEND_WAIT);
    cr_assert_eq(tp_recv(&in->p), (uint64_t)want, "the sender's request");
}

/* Messages from 10 allocations, expected and unexpected: all arrive whole; they were read
 * from read-only mappings, of which no more than 8 stay. */
Test(shm_map, messages_from_allocated_memory_are_copied_from_a_read_only_mapping)
{
    peer_key_t k[10];
    unsigned n, ro;
    init_t in;

    init_start(&in);
    for (unsigned i = 0; i < 10; i++) {
        key_take(&in.p, CMD_ALLOC, &k[i]);
        for (int expected = 0; expected < 2; expected++) {
            cr_assert_eq(recv_msg(&in, &k[i], expected), XFER_OK);
            cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0,
                         "message %u (%s) arrived whole", i, expected ? "expected" :
                         "unexpected");
            send_done(&in, XFER_OK);
        }
        n = peer_mem_mappings(&ro);
        cr_assert_eq(n, (i < 8) ? i + 1 : 8, "%u of the peer's memfds are mapped after %u "
                     "allocations sent from", n, i + 1);
        cr_assert_eq(ro, n, "%u of %u mappings are read only", ro, n);
    }
    init_finish(&in, k, 10);
}

Test(shm_map, with_XFER_SHM_MAP_n_messages_are_read_by_cma)
{
    unsigned ro;
    init_t in;
    peer_key_t k;

    setenv("XFER_SHM_MAP", "n", 1);
    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    cr_assert_eq(recv_msg(&in, &k, 1), XFER_OK);
    cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0);
    send_done(&in, XFER_OK);
    cr_assert_eq(peer_mem_mappings(&ro), 0, "the peer's memory was mapped");
    init_finish(&in, &k, 1);
}

/* The sender's descriptor number names another file (a memfd it put in its place): the inode
 * the message announces does not match, so nothing is mapped and the data comes by CMA. */
Test(shm_map, a_message_whose_descriptor_names_another_file_is_read_by_cma)
{
    unsigned ro;
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    tp_send(&in.p, CMD_REPLACE);
    tp_send(&in.p, k.index);
    cr_assert_eq(tp_recv(&in.p), 1);
    cr_assert_eq(recv_msg(&in, &k, 0), XFER_OK);
    cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0,
                 "the message came whole, from the sender's memory");
    send_done(&in, XFER_OK);
    cr_assert_eq(peer_mem_mappings(&ro), 0, "another file was mapped");
    init_finish(&in, &k, 1);
}

/* A peer whose ranges keep failing the checks: after 8 of them its memory is not mapped any
 * more, even a range that would map - every message still arrives, by CMA. */
Test(shm_map, after_8_ranges_that_do_not_map_the_peer_is_read_by_cma)
{
    peer_key_t k[9];
    unsigned ro;
    init_t in;

    init_start(&in);
    for (unsigned i = 0; i < 9; i++) {
        key_take(&in.p, CMD_ALLOC, &k[i]);
        if (i < 8) {
            tp_send(&in.p, CMD_REPLACE);
            tp_send(&in.p, k[i].index);
            cr_assert_eq(tp_recv(&in.p), 1);
        }
        cr_assert_eq(recv_msg(&in, &k[i], 1), XFER_OK);
        cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0,
                     "message %u arrived whole", i);
        send_done(&in, XFER_OK);
    }
    cr_assert_eq(peer_mem_mappings(&ro), 0, "the peer's memory was mapped after 8 refusals");
    init_finish(&in, k, 9);
}

/* The sender rewrites its frame in our ring before we read it: the message now claims bytes
 * past the range it names. The endpoint fails with a protocol error; nothing is read. */
Test(shm_map, a_message_claiming_bytes_beyond_its_range_fails_the_endpoint)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;
    unsigned ro;
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    tp_send(&in.p, CMD_SEND);
    tp_send(&in.p, k.index);
    cr_assert_eq(tp_recv(&in.p), 1);
    tp_send(&in.p, CMD_CORRUPT);
    cr_assert_eq(tp_recv(&in.p), 1, "the sender found its frame in our ring");
    memset(in.buf, 0, LEN);
    cr_assert(TP_POSTED(xfer_tag_recv(in.p.ctx, in.p.ep, MSG_TAG + k.index, UINT64_MAX,
                                      in.buf + MSG_OFF, MSG_LEN, in.mem, NULL, NULL, &req)));
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    cr_assert_eq(st, XFER_ERR_PROTOCOL, "the receive: %s", xfer_status_string(st));
    cr_assert_eq(xfer_endpoint_status(in.p.ep), XFER_ERR_PROTOCOL);
    for (size_t i = 0; i < LEN; i++) {
        cr_assert_eq(in.buf[i], 0, "byte %zu of the receive buffer was written", i);
    }
    cr_assert_eq(peer_mem_mappings(&ro), 0);
    init_finish(&in, &k, 1);
}

/* ---- large puts, copied by both sides -------------------------------------------------------- */

#define COOP_TRIES 20

static void coop_env(void)
{
    setenv("XFER_SHM_COOP_MIN", "256k", 1);
    setenv("XFER_LOG_LEVEL", "debug", 1);
}

/* The owner with one allocation (k), sharing from 256 KiB. */
static void coop_start_owner(init_t *in, peer_key_t *k)
{
    coop_env();
    init_start(in);
    key_take(&in->p, CMD_ALLOC, k);
}

/* The same, and LEN bytes of ours from xfer_mem_alloc (*mem). */
static void coop_start(init_t *in, peer_key_t *k, xfer_mem_t **mem)
{
    coop_start_owner(in, k);
    cr_assert_eq(xfer_mem_alloc(in->p.ctx, LEN, XFER_MEM_HOST, mem), XFER_OK);
}

static void coop_finish(init_t *in, peer_key_t *k, xfer_mem_t *mem)
{
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    init_finish(in, k, 1);
}

/* stderr goes to a file while the puts run: the initiator's debug log says, per shared put,
 * how many of its parts the target copied. The file is read through a description of its
 * own, so reading does not move where the log writes. */
typedef struct log_capture {
    char     path[64];
    int      saved;
    FILE     *reader;
    unsigned shared;    /* shared puts logged so far */
    unsigned took;      /* ... of which the target took parts */
} log_capture_t;

static void capture_start(log_capture_t *c)
{
    int fd;

    fflush(stderr);
    memset(c, 0, sizeof(*c));
    snprintf(c->path, sizeof(c->path), "/tmp/xfer-test-log-XXXXXX");
    fd = mkstemp(c->path);
    cr_assert_geq(fd, 0);
    c->saved  = dup(2);
    c->reader = fopen(c->path, "r");
    cr_assert((c->saved >= 0) && (c->reader != NULL));
    cr_assert_geq(dup2(fd, 2), 0);
    close(fd);
    unlink(c->path);
}

/* Read what was logged since the last scan. */
static void capture_scan(log_capture_t *c)
{
    char line[512];

    fflush(stderr);
    clearerr(c->reader);
    for (;;) {
        long at = ftell(c->reader);
        const char *p;
        unsigned theirs, parts;

        if (fgets(line, sizeof(line), c->reader) == NULL) {
            break;
        }
        if (strchr(line, '\n') == NULL) {
            fseek(c->reader, at, SEEK_SET);     /* the rest of the line is still coming */
            break;
        }
        p = strstr(line, "the peer copied ");
        if ((p != NULL) && (sscanf(p, "the peer copied %u of its %u parts", &theirs,
                                   &parts) == 2)) {
            cr_assert_eq(parts, LEN / (256u * 1024u), "a 1 MiB put in %u parts", parts);
            cr_assert_leq(theirs, parts);
            c->shared++;
            c->took += (theirs > 0);
        }
    }
}

static void capture_end(log_capture_t *c)
{
    capture_scan(c);
    cr_assert_geq(dup2(c->saved, 2), 0);
    close(c->saved);
    fclose(c->reader);
}

/* Pin this process and the owner to two cpus of ours: left to itself, the scheduler of a
 * busy machine runs two processes that talk over a socket on one core, and then the owner
 * never runs while a put is being copied. 0 when there is only one cpu. */
static int coop_pin(init_t *in)
{
    cpu_set_t set, one;
    int cpus[2], n = 0;

    cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    for (int c = 0; (c < CPU_SETSIZE) && (n < 2); c++) {
        if (CPU_ISSET(c, &set)) {
            cpus[n++] = c;
        }
    }
    if (n < 2) {
        return 0;
    }
    CPU_ZERO(&one);
    CPU_SET(cpus[0], &one);
    cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0);
    tp_send(&in->p, CMD_PIN);
    tp_send(&in->p, (uint64_t)cpus[1]);
    cr_assert_eq(tp_recv(&in->p), 1, "the owner could not be pinned");
    return 1;
}

/* Puts of the whole allocation from src while the owner spins in progress, each checked
 * whole (a new pattern each time), until the owner took parts of COOP_TRIES of them or
 * COOP_MS passed (the cpus may be busy with other work). */
#define COOP_MS 5000
static void coop_puts(init_t *in, const peer_key_t *k, uint8_t *src, xfer_mem_t *mem,
                      log_capture_t *cap)
{
    double end = tp_now_ms() + COOP_MS;
    unsigned i;

    capture_start(cap);
    for (i = 0; (cap->took < COOP_TRIES) && (tp_now_ms() < end); i++) {
        tp_send(&in->p, CMD_SPIN);
        cr_assert_eq(tp_recv(&in->p), 1);
        tp_fill_pattern(src, LEN, 100 + i);
        cr_assert_eq(rma(&in->p, 1, src, mem, k, 0, LEN, TP_WAIT_MS, NULL), XFER_OK);
        /* the check is a command: it ends the owner's spin */
        cr_assert(owner_holds(&in->p, k, 0, LEN, 100 + i), "put %u landed whole", i);
        capture_scan(cap);
    }
    capture_end(cap);
    /* the first put is announced; a later one only once the owner read the last announcement
     * (it spins, but may not have run since) */
    cr_assert((cap->shared >= 1) && (cap->shared <= i), "%u of %u puts were shared",
              cap->shared, i);
    cr_log_info("the owner took parts of %u of %u puts", cap->took, i);
}

Test(shm_map, a_large_put_from_allocated_memory_is_copied_by_both_sides)
{
    log_capture_t cap;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;
    int pinned;

    coop_start(&in, &k, &mem);
    pinned = coop_pin(&in);
    coop_puts(&in, &k, xfer_mem_address(mem), mem, &cap);
    if (pinned) {
        cr_assert_gt(cap.took, 0, "a spinning owner on a cpu of its own took parts of none "
                     "of %u puts", cap.shared);
    } else {
        cr_log_warn("one cpu: the owner never runs beside the initiator, nothing to check");
    }
    coop_finish(&in, &k, mem);
}

/* From malloc'd memory the owner reads its parts by CMA, where the kernel allows it; where it
 * does not, the initiator copies them all. Either way every put lands whole. */
Test(shm_map, a_large_put_from_registered_memory_lands_whole)
{
    log_capture_t cap;
    init_t in;
    peer_key_t k;

    coop_start_owner(&in, &k);
    coop_puts(&in, &k, in.buf, in.mem, &cap);
    init_finish(&in, &k, 1);
}

/* An owner that does not progress takes no part, and is told of the first put only: the
 * rest are not announced, so that its ring does not fill with frames it would skip (and a
 * flush, which waits for what is queued for the ring, still completes). */
Test(shm_map, large_puts_complete_while_the_owner_does_not_progress)
{
    xfer_request_t *flush = NULL;
    log_capture_t cap;
    init_t in;
    peer_key_t k;

    coop_start_owner(&in, &k);
    owner_pause(&in.p);
    capture_start(&cap);
    for (unsigned i = 0; i < 300; i++) {
        tp_fill_pattern(in.buf, LEN, 21 + i);
        cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, LEN, 2000, NULL), XFER_OK,
                     "large put %u waited for an owner that does not progress", i);
    }
    cr_assert(TP_POSTED(xfer_endpoint_flush(in.p.ep, NULL, NULL, &flush)));
    cr_assert_eq(xfer_request_wait(flush, 2000), XFER_OK, "a flush waited for the owner");
    xfer_request_release(flush);
    capture_end(&cap);
    cr_assert_eq(cap.shared, 1, "%u puts were announced to an owner that reads none",
                 cap.shared);
    cr_assert_eq(cap.took, 0, "an owner in a pause took parts");
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 21 + 299));
    init_finish(&in, &k, 1);
}

/* Shared puts, each followed by a flush: the flush completes after its put. */
Test(shm_map, a_flush_completes_after_the_shared_puts_before_it)
{
    xfer_request_t *put, *flush;
    xfer_mem_t *mem;
    uint8_t *src;
    init_t in;
    peer_key_t k;

    coop_start(&in, &k, &mem);
    src = xfer_mem_address(mem);
    tp_send(&in.p, CMD_SPIN);
    cr_assert_eq(tp_recv(&in.p), 1);
    for (unsigned round = 0; round < COOP_TRIES; round++) {
        tp_fill_pattern(src, LEN, 40 + round);
        cr_assert(TP_POSTED(xfer_put(in.p.ep, src, LEN, mem, k.addr, k.rkey, NULL, NULL,
                                     &put)));
        cr_assert(TP_POSTED(xfer_endpoint_flush(in.p.ep, NULL, NULL, &flush)));
        cr_assert_eq(xfer_request_wait(flush, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(xfer_request_test(put), XFER_OK, "round %u: the put is not done at its "
                     "flush", round);
        xfer_request_release(put);
        xfer_request_release(flush);
    }
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 40 + COOP_TRIES - 1));
    coop_finish(&in, &k, mem);
}

/* Messages from the owner's allocation into one of ours, the owner spinning meanwhile: each
 * arrives whole, and the owner (the sender) copied parts of some. */
Test(shm_map, a_large_message_between_allocated_memory_is_copied_by_both_sides)
{
    double end = tp_now_ms() + COOP_MS;
    xfer_request_t *req;
    log_capture_t cap;
    xfer_mem_t *mem;
    uint8_t *dst;
    init_t in;
    peer_key_t k;
    int pinned;
    unsigned i;

    coop_start(&in, &k, &mem);
    dst    = xfer_mem_address(mem);
    pinned = coop_pin(&in);
    capture_start(&cap);
    for (i = 0; (cap.took < COOP_TRIES) && (tp_now_ms() < end); i++) {
        memset(dst, 0, LEN);
        tp_send(&in.p, CMD_SEND);
        tp_send(&in.p, k.index);
        cr_assert_eq(tp_recv(&in.p), 1);
        tp_send(&in.p, CMD_SPIN);
        cr_assert_eq(tp_recv(&in.p), 1);
        req = NULL;
        cr_assert(TP_POSTED(xfer_tag_recv(in.p.ctx, in.p.ep, MSG_TAG + k.index, UINT64_MAX,
                                          dst + MSG_OFF, MSG_LEN, mem, NULL, NULL, &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(xfer_request_length(req), MSG_LEN);
        xfer_request_release(req);
        cr_assert_lt(tp_check_pattern_at(dst, MSG_OFF, MSG_LEN, FILL), 0,
                     "message %u arrived whole", i);
        for (size_t b = 0; b < MSG_OFF; b++) {
            cr_assert((dst[b] == 0) && (dst[MSG_OFF + MSG_LEN + b] == 0),
                      "message %u wrote outside its buffer", i);
        }
        send_done(&in, XFER_OK);    /* a command: it ends the spin */
        capture_scan(&cap);
    }
    capture_end(&cap);
    cr_assert((cap.shared >= 1) && (cap.shared <= i), "%u of %u messages were shared",
              cap.shared, i);
    cr_log_info("the sender took parts of %u of %u messages", cap.took, i);
    if (pinned) {
        cr_assert_gt(cap.took, 0, "a spinning sender on a cpu of its own took parts of none "
                     "of %u messages", i);
    }
    coop_finish(&in, &k, mem);
}

/* A forced close while a shared put may still wait for the owner's parts: the put completes
 * (done, or cancelled), the close completes, and nothing is touched after (ASan, valgrind).
 * The close comes right after a post that had not completed yet; with the owner spinning on
 * a cpu of its own that is mostly a put whose owner still copies a part. */
Test(shm_map, a_forced_close_completes_a_shared_put_that_waits)
{
    xfer_request_t *put = NULL, *close_req = NULL;
    xfer_status_t st = XFER_OK;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;

    coop_start(&in, &k, &mem);
    (void)coop_pin(&in);
    tp_send(&in.p, CMD_SPIN);
    cr_assert_eq(tp_recv(&in.p), 1);
    for (unsigned i = 0; i < 1000; i++) {
        cr_assert(TP_POSTED(xfer_put(in.p.ep, xfer_mem_address(mem), LEN, mem, k.addr, k.rkey,
                                     NULL, NULL, &put)));
        st = xfer_request_test(put);
        if (st == XFER_INPROGRESS) {
            break;
        }
        cr_assert_eq(st, XFER_OK);
        xfer_request_release(put);
        put = NULL;
    }
    cr_log_info("closing with a put %s", (put != NULL) ? "not completed" : "none pending");
    cr_assert(TP_POSTED(xfer_endpoint_close_nb(in.p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL,
                                               &close_req)));
    in.p.ep = NULL;
    cr_assert_eq(xfer_request_wait(close_req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(close_req);
    if (put != NULL) {
        st = xfer_request_wait(put, TP_WAIT_MS);
        cr_assert((st == XFER_OK) || (st == XFER_ERR_CANCELED), "the put after a forced close: "
                  "%s", xfer_status_string(st));
        cr_log_info("the put ended: %s", xfer_status_string(st));
        xfer_request_release(put);
    }
    coop_finish(&in, &k, mem);
}

/* Shared puts posted from completion callbacks, each from the one before it (with a pattern of
 * its own, written into the source the completed put let go of): a callback runs from
 * progress once its put's parts are all counted, so the put it posts opens a slot anew; the
 * chain runs to its end and the last put lands whole. */
#define CHAIN_LEN 20

typedef struct put_chain {
    xfer_endpoint_t  *ep;
    xfer_mem_t       *mem;
    uint8_t          *src;
    const peer_key_t *k;
    unsigned         posted, done, failed;
    xfer_status_t    last;
} put_chain_t;

static void chain_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    put_chain_t *c = arg;
    xfer_status_t st;

    (void)req;
    c->done++;
    if (status != XFER_OK) {
        c->failed++;
        c->last = status;
        return;
    }
    if (c->posted < CHAIN_LEN) {
        /* the put before is done with src: the next one carries a pattern of its own */
        tp_fill_pattern(c->src, LEN, 77 + c->posted);
        st = xfer_put(c->ep, c->src, LEN, c->mem, c->k->addr, c->k->rkey, chain_cb, c, NULL);
        if (st == XFER_OK) {
            c->posted++;
        } else {
            c->failed++;
            c->last = st;
        }
    }
}

Test(shm_map, shared_puts_posted_from_completion_callbacks_run_to_the_end)
{
    put_chain_t c = {0};
    log_capture_t cap;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;
    double end;

    coop_start(&in, &k, &mem);
    (void)coop_pin(&in);
    c.ep  = in.p.ep;
    c.mem = mem;
    c.src = xfer_mem_address(mem);
    c.k   = &k;
    tp_fill_pattern(c.src, LEN, 77);
    tp_send(&in.p, CMD_SPIN);
    cr_assert_eq(tp_recv(&in.p), 1);
    capture_start(&cap);
    cr_assert_eq(xfer_put(c.ep, c.src, LEN, mem, k.addr, k.rkey, chain_cb, &c, NULL), XFER_OK);
    c.posted = 1;
    end = tp_now_ms() + TP_WAIT_MS;
    while ((c.done < c.posted || c.posted < CHAIN_LEN) && (c.failed == 0) &&
           (tp_now_ms() < end)) {
        xfer_progress(in.p.ctx);
    }
    capture_end(&cap);
    cr_assert_eq(c.failed, 0, "a put of the chain failed: %s", xfer_status_string(c.last));
    cr_assert_eq(c.done, CHAIN_LEN, "%u of %u puts completed (%u posted)", c.done, CHAIN_LEN,
                 c.posted);
    cr_assert_geq(cap.shared, 1, "no put of the chain was shared");
    cr_log_info("%u of %u chained puts shared, the owner took parts of %u", cap.shared,
                CHAIN_LEN, cap.took);
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 77 + CHAIN_LEN - 1),
              "the chain's last put landed whole");
    coop_finish(&in, &k, mem);
}
