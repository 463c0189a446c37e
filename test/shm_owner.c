/*
 * The owner of allocated memory and the initiator's side of it (shm_owner.h).
 */
#include "shm_owner.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void shm_owner_suite_init(void)
{
    setenv("XFERTEST_TRANSPORT", "shm", 1);
    tp_env();
}

/* ---- a key's shm part ------------------------------------------------------------------------ */

/* The shm blob inside a packed key (framework/memory.c's layout); NULL if it has none. */
uint8_t *shm_part(uint8_t *blob, size_t len)
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
uint32_t key_fd(void *blob, size_t len)
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

int srv_owner(tp_side_t *s)
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


void key_take(tp_peer_t *p, uint64_t cmd, peer_key_t *k)
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

int owner_holds(tp_peer_t *p, const peer_key_t *k, uint64_t off, uint64_t len, uint64_t seed)
{
    tp_send(p, CMD_CHECK);
    tp_send(p, k->index);
    tp_send(p, off);
    tp_send(p, len);
    tp_send(p, seed);
    return (int)tp_recv(p);
}

void owner_free(tp_peer_t *p, const peer_key_t *k)
{
    tp_send(p, CMD_FREE);
    tp_send(p, k->index);
    cr_assert_eq(tp_recv(p), 1);
}

void owner_pause(tp_peer_t *p)
{
    tp_send(p, CMD_PAUSE);
    cr_assert_eq(tp_recv(p), 1);
}

/* A put (or get) of len bytes at off, waited for up to timeout_ms: its status. */
xfer_status_t rma(tp_peer_t *p, int put, void *buf, xfer_mem_t *mem, const peer_key_t *k,
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


void init_start(init_t *in)
{
    tp_start(&in->p, srv_owner, NULL);
    in->buf = malloc(LEN);
    cr_assert_not_null(in->buf);
    cr_assert_eq(xfer_mem_register(in->p.ctx, in->buf, LEN, XFER_MEM_HOST, &in->mem), XFER_OK);
}

void init_finish(init_t *in, peer_key_t *keys, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        xfer_rkey_destroy(keys[i].rkey);
    }
    tp_send(&in->p, CMD_DONE);
    cr_assert_eq(xfer_mem_deregister(in->mem), XFER_OK);
    free(in->buf);
    tp_finish(&in->p);
}


void send_done(init_t *in, xfer_status_t want)
{
    tp_send(&in->p, CMD_SEND_WAIT);
    cr_assert_eq(tp_recv(&in->p), (uint64_t)want, "the sender's request");
}
