/*
 * Transfers past 4 GiB for the data-path suites, at the memory cost of the receiving side
 * alone.
 *
 * A big buffer is an anonymous mapping of TP_BIG_MAP bytes. The sending side writes the
 * pattern (tp_fill_pattern_at: each byte depends on its offset) only into the probes - the
 * first and last 64 KiB of the transfer, 64 KiB on both sides of 2^31 and of 2^32, and 64 bytes
 * at every MiB - and never touches the rest, which the kernel backs with its shared zero
 * page: sending 4 GiB costs it about 16 MiB. The receiving side's buffer fills as the data
 * arrives. Before each transfer the receiver spoils its probes and the 64 KiB after the
 * transfer's end, so that nothing an earlier transfer left passes; after it, every probe must
 * hold the pattern of its offsets (a byte misplaced, a length cut to 32 bits, a lost tail
 * show) and the bytes after the end must still be spoilt (nothing written past it).
 */
#ifndef XFER_TEST_BIG_BUFFERS_H
#define XFER_TEST_BIG_BUFFERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TP_BIG_GUARD  (64u << 10)
/* The sizes the tests move: on both sides of 2^32 (a u32 length or cast would cut them). */
#define TP_BIG_SIZES  {0xffffffffull, 0x100000000ull, 0x100000001ull}
#define TP_BIG_MAX    0x100000001ull
#define TP_BIG_MAP    ((size_t)TP_BIG_MAX + TP_BIG_GUARD)
/* Bytes of MemAvailable a test asks for over tcp: one side's buffer, the other's probes,
 * slack; over a transport that registers (pins) memory, another TP_BIG_MAP. */
#define TP_BIG_NEED   ((uint64_t)TP_BIG_MAP + (512ull << 20))
/* A transfer of 4 GiB takes seconds over tcp, over two minutes over Soft-RoCE in the guest
 * (about 32 MB/s): a wait allows five minutes, a test's peer half an hour. */
#define TP_BIG_WAIT_MS  300000
#define TP_BIG_ALARM_S  1800

/* Skip the calling test where it cannot run, with a line on stderr saying why: under valgrind
 * (XFERTEST_VALGRIND), or with less MemAvailable than it needs (TP_BIG_NEED) - looked at once
 * this process holds the machine's lock for big transfers (a file in /tmp), which it keeps
 * until it exits. Otherwise raise the transport's message limit (XFER_<TRANSPORT>_MAX_MSG_SIZE,
 * inherited by the peers it forks) past TP_BIG_MAX. Call it before tp_start(). */
void tp_big_prepare(void);
/* A mapping of TP_BIG_MAP bytes, nothing touched; NULL when there is no room. */
void *tp_big_map(void);
void tp_big_unmap(void *buf);
/* The sender: the probes of a len-byte transfer from buf hold pattern(seed). */
void tp_big_fill(void *buf, size_t len, uint64_t seed);
/* The receiver, before the transfer: spoil the probes and the guard after len. */
void tp_big_spoil(void *buf, size_t len);
/* The receiver, after it: the first wrong offset (a probe that is not pattern(seed), or a
 * guard byte after len that was written), or -1. */
ssize_t tp_big_check(const void *buf, size_t len, uint64_t seed);

#endif
