/*
 * A hand-made peer's blocking I/O, for the suites that speak the wire protocols by hand
 * (test_tcp_proto.c, test_lane_retry.c). Meant for a forked child: any failure ends the process
 * with the exit code given, which the parent's check names.
 */
#ifndef XFER_TEST_RAW_PEER_H
#define XFER_TEST_RAW_PEER_H

#include <stddef.h>
#include <stdint.h>

#define RAW_WAIT_MS 10000

/* All of buf to fd, or _exit(code). */
void raw_write(int fd, const void *buf, size_t len, int code);
/* len bytes from fd within RAW_WAIT_MS, or _exit(code). */
void raw_read(int fd, void *buf, size_t len, int code);
/* One bootstrap frame of type: its body into body (at most cap bytes), its length returned;
 * anything else ends the process (code, code + 1, code + 2). */
size_t raw_boot_read(int fd, uint16_t type, void *body, size_t cap, int code);

#endif
