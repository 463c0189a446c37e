/*
 * Logging to stderr, filtered by XFER_LOG_LEVEL. The level is read on first use so that the
 * loader can log before any context exists; xfer_context_create() re-applies the validated
 * value from the parameter table.
 */
#include "xfer_int.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

const char *const xfer_log_level_names[] = {"error", "warn", "info", "debug", "trace", NULL};

static int log_level = XFER_LOG_WARN;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/* this thread's last ERROR or WARN text, for xfer_last_error() */
static __thread char last_error[1024];

xfer_status_t xfer_log_level_parse(const char *str, xfer_log_level_t *level_p)
{
    for (int i = 0; xfer_log_level_names[i] != NULL; i++) {
        if (strcasecmp(str, xfer_log_level_names[i]) == 0) {
            *level_p = (xfer_log_level_t)i;
            return XFER_OK;
        }
    }
    return XFER_ERR_INVALID_PARAM;
}

static void log_init_once(void)
{
    const char *env = getenv("XFER_LOG_LEVEL");
    xfer_log_level_t level;

    /* A bad value is reported by xfer_context_create(); until then keep the default. */
    if ((env != NULL) && (xfer_log_level_parse(env, &level) == XFER_OK)) {
        __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
    }
}

void xfer_log_set_level(xfer_log_level_t level)
{
    pthread_once(&log_once, log_init_once);
    __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

int xfer_log_enabled(xfer_log_level_t level)
{
    pthread_once(&log_once, log_init_once);
    return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

/* One line to stderr, in one fprintf so that lines from several threads do not interleave. */
static void log_line(xfer_log_level_t level, const char *subsys, const char *msg)
{
    static const char *const tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG", "TRACE"};

    fprintf(stderr, "[xfer:%d] %s %s: %s\n", (int)getpid(),
            tags[(unsigned)level < 5 ? level : XFER_LOG_TRACE], subsys, msg);
}

void xfer_log(xfer_log_level_t level, const char *subsys, const char *fmt, ...)
{
    int enabled = xfer_log_enabled(level);
    char msg[1024];
    va_list ap;

    if (!enabled && (level > XFER_LOG_WARN)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level <= XFER_LOG_WARN) {
        snprintf(last_error, sizeof(last_error), "%s", msg);
    }
    if (enabled) {
        log_line(level, subsys, msg);
    }
}

void xfer_refuse(const char *subsys, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    if (xfer_log_enabled(XFER_LOG_INFO)) {
        log_line(XFER_LOG_INFO, subsys, last_error);
    }
}

/* ---- lines a peer causes ------------------------------------------------------------------- */

/* Per cause, at most LIMIT_BURST lines in a window of LIMIT_WINDOW_MS; the rest are counted,
 * and the first line of a later window says how many were held back. Process-wide: a flood
 * spread over many endpoints or listeners is one flood. */
#define LIMIT_BURST      10
#define LIMIT_WINDOW_MS  10000
#define LIMIT_CAUSES     32

typedef struct log_cause {
    char     name[32];
    uint64_t events;        /* every occurrence */
    uint64_t unlogged;      /* ... whose line was held back */
    int64_t  window_ms;     /* start of the current window */
    unsigned lines;         /* written in it */
    unsigned held;          /* held back since the last line written */
    int64_t  held_since_ms;
} log_cause_t;

static pthread_mutex_t causes_lock = PTHREAD_MUTEX_INITIALIZER;
static log_cause_t causes[LIMIT_CAUSES];
static unsigned num_causes;

/* The cause named name, made on first use; the last slot takes every name past the table. */
static log_cause_t *cause_get(const char *name)
{
    for (unsigned i = 0; i < num_causes; i++) {
        if (strcmp(causes[i].name, name) == 0) {
            return &causes[i];
        }
    }
    if (num_causes == LIMIT_CAUSES) {
        return &causes[LIMIT_CAUSES - 1];
    }
    snprintf(causes[num_causes].name, sizeof(causes[num_causes].name), "%s",
             (num_causes == LIMIT_CAUSES - 1) ? "other" : name);
    return &causes[num_causes++];
}

void xfer_log_peer(const char *cause, xfer_log_level_t level, const char *subsys,
                   const char *fmt, ...)
{
    char msg[1024], line[1200];
    unsigned held = 0;
    int64_t now = xfer_now_ms(), held_ms = 0;
    int write = 0, last = 0, n;
    log_cause_t *c;
    va_list ap;

    pthread_mutex_lock(&causes_lock);
    c = cause_get(cause);
    c->events++;
    if (now - c->window_ms >= LIMIT_WINDOW_MS) {
        c->window_ms = now;
        c->lines     = 0;
    }
    if (c->lines < LIMIT_BURST) {
        write   = 1;
        last    = (++c->lines == LIMIT_BURST);
        held    = c->held;
        held_ms = now - c->held_since_ms;
        c->held = 0;
    } else {
        c->unlogged++;
        if (c->held++ == 0) {
            c->held_since_ms = now;
        }
    }
    pthread_mutex_unlock(&causes_lock);
    if (!write || !xfer_log_enabled(level)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    n = snprintf(line, sizeof(line), "%s", msg);
    if (held && (n < (int)sizeof(line))) {
        n += snprintf(line + n, sizeof(line) - (size_t)n, " (%u more like this in the last "
                      "%.1f s)", held, (double)held_ms / 1000.0);
    }
    if (last && (n < (int)sizeof(line))) {
        snprintf(line + n, sizeof(line) - (size_t)n, " (more lines like this in the next %d s "
                 "are held back and counted: xfer_context_counters)", LIMIT_WINDOW_MS / 1000);
    }
    log_line(level, subsys, line);
}

size_t xfer_log_peer_counters(xfer_counter_t *counters, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&causes_lock);
    for (unsigned i = 0; i < num_causes; i++) {
        if (n < max) {
            snprintf(counters[n].name, sizeof(counters[n].name), "peer_%s", causes[i].name);
            counters[n].value = causes[i].events;
        }
        n++;
        if (n < max) {
            snprintf(counters[n].name, sizeof(counters[n].name), "peer_%s_unlogged",
                     causes[i].name);
            counters[n].value = causes[i].unlogged;
        }
        n++;
    }
    pthread_mutex_unlock(&causes_lock);
    return n;
}

const char *xfer_last_error(void)
{
    return last_error;
}

void xfer_last_error_clear(void)
{
    last_error[0] = '\0';
}

void xfer_reason_set(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    if (size == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

void xfer_reason_copy(char *dst, size_t size, const void *src, size_t len)
{
    const unsigned char *in = src;
    size_t n;

    if (size == 0) {
        return;
    }
    n = (len < size - 1) ? len : size - 1;
    for (size_t i = 0; i < n; i++) {
        dst[i] = ((in[i] >= 0x20) && (in[i] <= 0x7e)) ? (char)in[i] : '?';
    }
    dst[n] = '\0';
}

void xfer_device_attr_add(xfer_device_attr_t *dev, const char *key, const char *fmt, ...)
{
    va_list ap;

    if (dev->num_attrs >= XFER_DEVICE_ATTR_MAX) {
        return;
    }
    snprintf(dev->attrs[dev->num_attrs].key, sizeof(dev->attrs[0].key), "%s", key);
    va_start(ap, fmt);
    vsnprintf(dev->attrs[dev->num_attrs].value, sizeof(dev->attrs[0].value), fmt, ap);
    va_end(ap);
    dev->num_attrs++;
}
