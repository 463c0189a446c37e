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
