/*
 * The shm ring's sleep handshakes (components/shm/shm_ring.c, compiled in): the consumer's on
 * an empty ring and the producer's on a full one each ring once; then two processes, a child
 * streaming checksummed frames through many wrap-arounds of a 4-cell ring, each side sleeping
 * on its eventfd when it cannot go on, so that a lost wake-up shows as a timeout.
 */
#include "shm_ring_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(shm_ring_wake, .timeout = 120);

/* ---- the sleep handshake ----------------------------------------------------------------- */

Test(shm_ring_wake, doorbell_rings_once_for_a_sleeper)
{
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    cr_assert_eq(rd32(s.peer, OFF_ARMED), 0);
    cr_assert_eq(produce(&s, 0, 1), 0, "nobody sleeps: no doorbell");
    consume(&s, 0, 1);

    /* empty: the consumer may sleep, and the next frame, only that one, rings */
    cr_assert_eq(xfer_shm_ring_ready(&s.in), 0);
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 1, "an empty ring");
    cr_assert_eq(rd32(s.peer, OFF_ARMED), 1, "the producer's view of armed");
    cr_assert_eq(produce(&s, 1, 1), 1, "the first frame after arm rings");
    cr_assert_eq(rd32(s.peer, OFF_ARMED), 0);
    cr_assert_eq(produce(&s, 2, 1), 0, "the second does not");
    cr_assert_eq(produce(&s, 3, 1), 0, "nor the third");
    consume(&s, 1, 1);
    consume(&s, 2, 1);
    consume(&s, 3, 1);

    /* drained: armed again, rung again, once */
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 1, "an empty ring");
    cr_assert_eq(produce(&s, 4, 1), 1);
    cr_assert_eq(produce(&s, 5, 1), 0);

    /* frames waiting: do not sleep, whether the consumer peeked at them yet or not */
    cr_assert_eq(xfer_shm_ring_ready(&s.in), 1);
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 0, "frames are waiting");
    consume(&s, 4, 1);
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 0, "a frame is waiting");
    consume(&s, 5, 1);
    seg_close(&s);
}

Test(shm_ring_wake, producer_sleeps_until_room)
{
    xfer_status_t st;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 0, "nobody waits");
    for (uint64_t i = 0; i < NCELLS; i++) {
        produce(&s, i, 1);
    }

    /* full: the producer may sleep, and the consumer's next cell freed, only that one, rings */
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 1, "a full ring");
    cr_assert_eq(rd32(s.own, OFF_PWAIT), 1, "the consumer's view of pwait");
    cr_assert_eq(rd32(s.own, OFF_ARMED), 0, "pwait is not armed");
    consume(&s, 0, 1);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 1, "the first cell freed rings");
    cr_assert_eq(rd32(s.own, OFF_PWAIT), 0);
    consume(&s, 1, 1);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 0, "the second does not");
    produce(&s, 4, 1);
    produce(&s, 5, 1);

    /* freed between the producer's last claim and its wait, before pwait was set (so that
     * nobody rang): it must see the room rather than sleep */
    consume(&s, 2, 1);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 0, "nobody waited yet");
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 0, "a cell was freed: do not sleep");
    produce(&s, 6, 1);
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 1, "full again");

    /* an impossible tail: do not sleep on it; the next claim says why */
    wr64(s.own, OFF_TAIL, 8);
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 0, "slept on an impossible tail");
    cr_assert_null(xfer_shm_ring_claim(&s.out, &st, why, sizeof(why)));
    cr_assert_eq(st, XFER_ERR_PROTOCOL);
    cr_assert(strstr(why, "8 cells consumed of 7 published") != NULL, "why: '%s'", why);
    seg_close(&s);
}

/* ---- two processes ----------------------------------------------------------------------- */

#define STREAM_FRAMES 20000u

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static uint32_t stream_len(uint64_t seq)
{
    return (uint32_t)(mix(seq + 1) % (PAYLOAD + 1));
}

static uint8_t stream_byte(uint64_t seq, size_t j)
{
    return (uint8_t)mix((seq << 16) ^ j);
}

/* FNV-1a, carried across frames */
static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

/* The child: the peer, with its own mapping of the memfd; the exit status says how it went.
 * It rings efd when the consumer sleeps, and sleeps on room_efd when the ring is full. */
static void stream_producer(int fd, size_t len, int efd, int room_efd)
{
    uint64_t total = FNV_INIT;
    xfer_shm_ring_t out;
    uint8_t *base;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(100);
    base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if ((base == MAP_FAILED) ||
        (xfer_shm_seg_attach(&out, base, len, TOKEN, why, sizeof(why)) != XFER_OK)) {
        _exit(2);
    }
    for (uint64_t seq = 0; seq <= STREAM_FRAMES; ) {
        xfer_shm_frame_t h = {.id = seq};
        xfer_status_t st;
        uint8_t *c = xfer_shm_ring_claim(&out, &st, why, sizeof(why));

        if (c == NULL) {
            struct pollfd pfd = {.fd = room_efd, .events = POLLIN};
            uint64_t n;

            if (st != XFER_OK) {
                _exit(3);
            }
            if (xfer_shm_ring_wait_room(&out) == 0) {
                continue;
            }
            /* asleep: only the consumer's bell wakes us; a lost wake-up is a timeout */
            if ((poll(&pfd, 1, 20000) != 1) || (read(room_efd, &n, sizeof(n)) != sizeof(n))) {
                _exit(5);
            }
            continue;
        }
        if (seq < STREAM_FRAMES) {
            h.type = (uint16_t)frame_type(seq);
            h.len  = stream_len(seq);
            for (size_t j = 0; j < h.len; j++) {
                c[XFER_SHM_FRAME_HDR + j] = stream_byte(seq, j);
            }
            h.a   = fnv(FNV_INIT, c + XFER_SHM_FRAME_HDR, h.len);
            total = fnv(total, c + XFER_SHM_FRAME_HDR, h.len);
        } else {
            h.type = XFER_SHM_F_TCANCEL;    /* the end, and the checksum of everything */
            h.a    = total;
        }
        memcpy(c, &h, sizeof(h));
        if (xfer_shm_ring_publish(&out)) {
            uint64_t one = 1;

            if (write(efd, &one, sizeof(one)) != sizeof(one)) {
                _exit(4);
            }
        }
        seq++;
    }
    _exit(0);
}

Test(shm_ring_wake, fork_streams_checksummed_frames)
{
    uint64_t total = FNV_INIT, sleeps = 0, room_bells = 0;
    xfer_shm_ring_t in;
    size_t len = xfer_shm_seg_len(NCELLS, CELL);
    uint8_t *base;
    int fd, efd, room_efd, status;
    pid_t pid;

    fd       = memfd_create("test_shm_ring_fork", MFD_CLOEXEC);
    efd      = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    room_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    cr_assert(fd >= 0 && efd >= 0 && room_efd >= 0, "%s", strerror(errno));
    cr_assert_eq(ftruncate(fd, (off_t)len), 0);
    base = map_seg(fd, len);
    xfer_shm_seg_init(&in, base, NCELLS, CELL, TOKEN);
    pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        stream_producer(fd, len, efd, room_efd);
    }

    for (uint64_t seq = 0; seq <= STREAM_FRAMES; ) {
        const uint8_t *payload = NULL;
        xfer_shm_frame_t h;
        int ret = xfer_shm_ring_peek(&in, &h, &payload, why, sizeof(why));

        if (ret == 0) {
            struct pollfd pfd = {.fd = efd, .events = POLLIN};
            uint64_t n;

            if (xfer_shm_ring_arm(&in) == 0) {
                continue;
            }
            /* asleep: only the doorbell wakes us; a lost wake-up is a timeout */
            cr_assert_eq(poll(&pfd, 1, 20000), 1, "frame %llu never rang the doorbell",
                         (unsigned long long)seq);
            cr_assert_eq(read(efd, &n, sizeof(n)), (ssize_t)sizeof(n));
            sleeps++;
            continue;
        }
        cr_assert_eq(ret, 1, "frame %llu: %s", (unsigned long long)seq, why);
        cr_assert(payload >= base + XFER_SHM_SEG_CTRL + XFER_SHM_FRAME_HDR &&
                  payload + h.len <= base + len, "frame %llu outside the segment",
                  (unsigned long long)seq);
        if (h.id != seq) {
            cr_assert_fail("frame %llu came as %llu", (unsigned long long)seq,
                           (unsigned long long)h.id);
        }
        if (seq == STREAM_FRAMES) {
            cr_assert_eq(h.type, XFER_SHM_F_TCANCEL);
            cr_assert_eq(h.a, total, "the stream's checksum: 0x%llx here, 0x%llx sent",
                         (unsigned long long)total, (unsigned long long)h.a);
        } else {
            if ((h.len != stream_len(seq)) || (h.type != frame_type(seq)) ||
                (h.a != fnv(FNV_INIT, payload, h.len))) {
                cr_assert_fail("frame %llu: len %u type %u checksum 0x%llx",
                               (unsigned long long)seq, h.len, h.type,
                               (unsigned long long)h.a);
            }
            for (size_t j = 0; j < h.len; j++) {
                if (payload[j] != stream_byte(seq, j)) {
                    cr_assert_fail("frame %llu byte %zu", (unsigned long long)seq, j);
                }
            }
            total = fnv(total, payload, h.len);
        }
        xfer_shm_ring_consume(&in);
        if (xfer_shm_ring_room_notify(&in)) {
            uint64_t one = 1;

            cr_assert_eq(write(room_efd, &one, sizeof(one)), (ssize_t)sizeof(one));
            room_bells++;
        }
        seq++;
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the producer: status 0x%x "
              "(exit 3: an impossible tail, 5: never woken for room)", status);
    cr_assert_eq(rd64(base, OFF_TAIL), STREAM_FRAMES + 1);
    cr_log_info("%u frames, %u wrap-arounds, the consumer slept %llu times, the producer was "
                "woken %llu times", STREAM_FRAMES + 1, (STREAM_FRAMES + 1) / NCELLS,
                (unsigned long long)sleeps, (unsigned long long)room_bells);
    munmap(base, len);
    close(room_efd);
    close(efd);
    close(fd);
}
