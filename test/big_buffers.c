/* Big buffers for transfers past 4 GiB: see big_buffers.h. */
#include "big_buffers.h"
#include "test_peer.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

/* Held by the test process that moves big buffers, until it exits: the suites and their tests
 * run side by side, and two such tests at once would need twice the memory. */
#define BIG_LOCK "/tmp/xfertest-big.lock"

#define PROBE_EDGE   (64u << 10)    /* around the ends and the 2^31, 2^32 boundaries */
#define PROBE_STRIDE (1u << 20)     /* and a stamp at every MiB ... */
#define PROBE_STAMP  64u            /* ... of this many bytes */
#define SPOIL        0xa5

typedef ssize_t (*probe_fn_t)(void *buf, size_t off, size_t len, uint64_t seed);

/* Call fn on every probe of a len-byte transfer, clipped to [0, len); the first answer that
 * is not -1 ends the walk. */
static ssize_t probes_walk(void *buf, size_t len, uint64_t seed, probe_fn_t fn)
{
    const uint64_t edges[] = {0, 1ull << 31, 1ull << 32, len};
    ssize_t ret;

    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
        uint64_t a = (edges[i] > PROBE_EDGE) ? edges[i] - PROBE_EDGE : 0;
        uint64_t b = edges[i] + PROBE_EDGE;

        b = (b < len) ? b : len;
        if ((a < b) && ((ret = fn(buf, (size_t)a, (size_t)(b - a), seed)) >= 0)) {
            return ret;
        }
    }
    for (uint64_t off = PROBE_STRIDE; off < len; off += PROBE_STRIDE) {
        size_t n = (len - off < PROBE_STAMP) ? (size_t)(len - off) : PROBE_STAMP;

        if ((ret = fn(buf, (size_t)off, n, seed)) >= 0) {
            return ret;
        }
    }
    return -1;
}

static ssize_t probe_fill(void *buf, size_t off, size_t len, uint64_t seed)
{
    tp_fill_pattern_at(buf, off, len, seed);
    return -1;
}

static ssize_t probe_spoil(void *buf, size_t off, size_t len, uint64_t seed)
{
    (void)seed;
    memset((char*)buf + off, SPOIL, len);
    return -1;
}

static ssize_t probe_check(void *buf, size_t off, size_t len, uint64_t seed)
{
    return tp_check_pattern_at(buf, off, len, seed);
}

/* MemAvailable in bytes, or 0 when /proc/meminfo does not say. */
static uint64_t mem_available(void)
{
    unsigned long long kib = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");

    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            break;
        }
    }
    fclose(f);
    return (uint64_t)kib << 10;
}

/* Skip the test, and say so where the runner's output shows it: Criterion lists skipped
 * tests only when asked to be verbose. */
static void big_skip(const char *why)
{
    const struct criterion_test *test = criterion_current_test;

    fprintf(stderr, "SKIP %s::%s: %s\n", test ? test->category : "?", test ? test->name : "?",
            why);
    cr_skip_test("%s", why);
}

void tp_big_prepare(void)
{
    uint64_t avail, need;
    char name[64], why[160];
    int fd;

    if (getenv("XFERTEST_VALGRIND") != NULL) {
        big_skip("transfers past 4 GiB are not run under valgrind (XFERTEST_VALGRIND): "
                 "memcheck would take hours over them");
    }
    fd = open(BIG_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    cr_assert(fd >= 0, "open %s: %s", BIG_LOCK, strerror(errno));
    cr_assert_eq(flock(fd, LOCK_EX), 0, "flock %s: %s", BIG_LOCK, strerror(errno));
    /* tcp reads the sender's untouched pages as the zero page; a transport that registers
     * memory pins them, and then both sides' buffers are backed */
    need  = TP_BIG_NEED + ((strcmp(tp_transport(), "tcp") == 0) ? 0 : TP_BIG_MAP);
    avail = mem_available();
    if (avail < need) {
        snprintf(why, sizeof(why), "a transfer past 4 GiB over %s needs %.1f GiB of free "
                 "memory, MemAvailable is %.1f GiB", tp_transport(), (double)need / (1 << 30),
                 (double)avail / (1 << 30));
        big_skip(why);
    }
    snprintf(name, sizeof(name), "XFER_%s_MAX_MSG_SIZE", tp_transport());
    for (char *c = name; *c != '\0'; c++) {
        *c = (char)toupper((unsigned char)*c);
    }
    setenv(name, "8g", 1);
}

void *tp_big_map(void)
{
    void *p = mmap(NULL, TP_BIG_MAP, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    return (p == MAP_FAILED) ? NULL : p;
}

void tp_big_unmap(void *buf)
{
    if (buf != NULL) {
        munmap(buf, TP_BIG_MAP);
    }
}

void tp_big_fill(void *buf, size_t len, uint64_t seed)
{
    probes_walk(buf, len, seed, probe_fill);
}

void tp_big_spoil(void *buf, size_t len)
{
    /* the receiver's pages all fill: huge ones fault 512 times less often */
    madvise(buf, TP_BIG_MAP, MADV_HUGEPAGE);
    probes_walk(buf, len, 0, probe_spoil);
    memset((char*)buf + len, SPOIL, TP_BIG_GUARD);
}

ssize_t tp_big_check(const void *buf, size_t len, uint64_t seed)
{
    const uint8_t *guard = (const uint8_t*)buf + len;
    ssize_t bad          = probes_walk((void*)buf, len, seed, probe_check);

    if (bad >= 0) {
        return bad;
    }
    for (size_t i = 0; i < TP_BIG_GUARD; i++) {
        if (guard[i] != SPOIL) {
            return (ssize_t)(len + i);
        }
    }
    return -1;
}
