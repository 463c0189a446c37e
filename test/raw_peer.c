/*
 * A hand-made peer's blocking I/O: see raw_peer.h.
 */
#include "raw_peer.h"
#include "../framework/wire/bootstrap_wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

void raw_write(int fd, const void *buf, size_t len, int code)
{
    const uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0) {
            _exit(code);
        }
        p   += n;
        len -= (size_t)n;
    }
}

void raw_read(int fd, void *buf, size_t len, int code)
{
    uint8_t *p = buf;

    while (len > 0) {
        struct pollfd pfd = {fd, POLLIN, 0};
        ssize_t n;

        if (poll(&pfd, 1, RAW_WAIT_MS) != 1) {
            _exit(code);
        }
        n = recv(fd, p, len, 0);
        if (n <= 0) {
            _exit(code);
        }
        p   += n;
        len -= (size_t)n;
    }
}

/* Read one bootstrap frame of the expected type; returns its body length. */
size_t raw_boot_read(int fd, uint16_t type, void *body, size_t cap, int code)
{
    uint8_t head[XFER_WIRE_HEADER_LEN];
    xfer_wire_header_t hdr;
    char why[256];

    raw_read(fd, head, sizeof(head), code);
    if ((xfer_wire_parse_header(head, sizeof(head), &hdr, why, sizeof(why)) != XFER_OK) ||
        (hdr.type != type) || (hdr.body_len > cap)) {
        _exit(code + 1);
    }
    raw_read(fd, body, hdr.body_len, code + 2);
    return hdr.body_len;
}
