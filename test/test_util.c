#include "config.h"

#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dirent.h>
#include <sys/resource.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef HAVE_VALGRIND_MEMCHECK_H
#include <valgrind/valgrind.h>
#endif

static void copy_file(const char *src, const char *dst)
{
    char buf[65536];
    ssize_t n;
    int in, out;

    in = open(src, O_RDONLY);
    cr_assert(in >= 0, "cannot open test plug-in %s (did 'make check' build it?)", src);
    out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    cr_assert(out >= 0, "cannot create %s", dst);
    while ((n = read(in, buf, sizeof(buf))) > 0) {
        cr_assert(write(out, buf, (size_t)n) == n);
    }
    close(in);
    close(out);
}

char *tu_plugin_dir(const char *const *plugins)
{
    const char *src_dir = getenv("XFERTEST_PLUGIN_DIR");
    char tmpl[]         = "/tmp/xfer-test-XXXXXX";
    char src[1024], dst[1024];
    char *dir;

    cr_assert_not_null(src_dir, "XFERTEST_PLUGIN_DIR is not set: run the tests with 'make check'");
    dir = mkdtemp(tmpl);
    cr_assert_not_null(dir);
    dir = strdup(dir);
    for (size_t i = 0; (plugins != NULL) && (plugins[i] != NULL); i++) {
        snprintf(src, sizeof(src), "%s/xfer_%s.so", src_dir, plugins[i]);
        snprintf(dst, sizeof(dst), "%s/xfer_%s.so", dir, plugins[i]);
        copy_file(src, dst);
    }
    return dir;
}

void tu_write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[1024];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

void tu_dir_remove(char *dir)
{
    struct dirent *de;
    char path[1024];
    DIR *d = opendir(dir);

    while ((d != NULL) && ((de = readdir(d)) != NULL)) {
        if (de->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            unlink(path);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

xfer_status_t tu_context(int inspect, xfer_context_t **ctx_p)
{
    xfer_context_params_t params = {.size  = sizeof(params),
                                    .flags = inspect ? XFER_CONTEXT_FLAG_INSPECT : 0};

    return xfer_context_create(&params, ctx_p);
}

int tu_component(const xfer_context_t *ctx, const char *name, const char *path_part,
                 xfer_component_info_t *info)
{
    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        cr_assert_eq(xfer_component_get(ctx, i, info), XFER_OK);
        if ((strcmp(info->name, name) == 0) &&
            ((path_part == NULL) || (strstr(info->path, path_part) != NULL))) {
            return 1;
        }
    }
    return 0;
}

const char *tu_device_attr(const xfer_component_info_t *info, const char *key)
{
    const xfer_device_attr_t *dev;

    if ((info->attr == NULL) || (info->attr->num_devices == 0)) {
        return NULL;
    }
    dev = &info->attr->devices[0];
    for (uint32_t i = 0; i < dev->num_attrs; i++) {
        if (strcmp(dev->attrs[i].key, key) == 0) {
            return dev->attrs[i].value;
        }
    }
    return NULL;
}

const xfer_select_entry_t *tu_select_entry(const xfer_selection_t *sel, const char *name)
{
    for (size_t i = 0; i < sel->num_entries; i++) {
        if (strcmp(sel->entries[i].name, name) == 0) {
            return &sel->entries[i];
        }
    }
    return NULL;
}

const char *tu_selected(const xfer_selection_t *sel)
{
    for (size_t i = 0; i < sel->num_entries; i++) {
        if (sel->entries[i].rank == 0) {
            return sel->entries[i].name;
        }
    }
    return NULL;
}

/* The value of counter name among the n of c, else missing. */
static int64_t counter_in(const xfer_counter_t *c, size_t n, const char *name, int64_t missing)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(c[i].name, name) == 0) {
            return (int64_t)c[i].value;
        }
    }
    return missing;
}

int64_t tu_ep_counter(xfer_endpoint_t *ep, const char *name)
{
    xfer_counter_t c[64];
    size_t n = 64;

    if (xfer_endpoint_counters(ep, c, &n) != XFER_OK) {
        return -1;
    }
    return counter_in(c, (n < 64) ? n : 64, name, -1);
}

int64_t tu_ctx_counter(xfer_context_t *ctx, const char *name)
{
    xfer_counter_t c[64];
    size_t n = 64;

    if (xfer_context_counters(ctx, c, &n) != XFER_OK) {
        return -1;
    }
    /* a cause that never happened has no counter yet */
    return counter_in(c, (n < 64) ? n : 64, name, 0);
}

/* How many times what occurs in text. */
int tu_count_in(const char *text, const char *what)
{
    int n = 0;

    for (const char *p = text; (p = strstr(p, what)) != NULL; p++) {
        n++;
    }
    return n;
}

long tu_peak_rss_kib(void)
{
    struct rusage ru;

    cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

int tu_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n  = 0;

    while ((d != NULL) && ((de = readdir(d)) != NULL)) {
        n += (de->d_name[0] != '.');
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

int tu_outward_ipv4(char *buf, size_t size)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(9)};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_DGRAM, 0), ok = 0;

    /* a datagram socket "connected" to TEST-NET-1 takes the default route's source address;
     * no packet leaves */
    inet_pton(AF_INET, "192.0.2.1", &sin.sin_addr);
    if ((fd >= 0) && (connect(fd, (struct sockaddr*)&sin, sizeof(sin)) == 0) &&
        (getsockname(fd, (struct sockaddr*)&sin, &len) == 0) &&
        ((ntohl(sin.sin_addr.s_addr) >> 24) != 127) && (sin.sin_addr.s_addr != 0)) {
        ok = (inet_ntop(AF_INET, &sin.sin_addr, buf, (socklen_t)size) != NULL);
    }
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

int tu_host_has_ipv6_loopback(void)
{
    struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int fd = socket(AF_INET6, SOCK_STREAM, 0), ok;

    ok = (fd >= 0) && (bind(fd, (struct sockaddr*)&sin6, sizeof(sin6)) == 0);
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

int tu_is_loopback(const struct sockaddr_storage *sa)
{
    if (sa->ss_family == AF_INET) {
        return (ntohl(((const struct sockaddr_in*)sa)->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6*)sa)->sin6_addr;

        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && (a->s6_addr[12] == 127));
    }
    return 0;
}

int tu_listening_sockets(struct sockaddr_storage *out, int max)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;

    while ((d != NULL) && ((de = readdir(d)) != NULL) && (n < max)) {
        int fd = atoi(de->d_name), v = 0;
        socklen_t len = sizeof(v);

        if ((de->d_name[0] == '.') || (fd == dirfd(d)) ||
            (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0) || !v) {
            continue;
        }
        len = sizeof(out[n]);
        if ((getsockname(fd, (struct sockaddr*)&out[n], &len) == 0) &&
            ((out[n].ss_family == AF_INET) || (out[n].ss_family == AF_INET6))) {
            n++;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

int tu_tcp_connect(const char *host, int port)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    int fd, err = 0;

    if (inet_pton(AF_INET, host, &((struct sockaddr_in*)&ss)->sin_addr) == 1) {
        ss.ss_family = AF_INET;
        ((struct sockaddr_in*)&ss)->sin_port = htons((uint16_t)port);
        len = sizeof(struct sockaddr_in);
    } else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6*)&ss)->sin6_addr) == 1) {
        ss.ss_family = AF_INET6;
        ((struct sockaddr_in6*)&ss)->sin6_port = htons((uint16_t)port);
        len = sizeof(struct sockaddr_in6);
    } else {
        return EINVAL;
    }
    fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0) {
        return errno;
    }
    if (connect(fd, (struct sockaddr*)&ss, len) != 0) {
        err = errno;
    }
    close(fd);
    return err;
}

int tu_run(const char *cmd, int merge_stderr, char **output_p)
{
    char *full, *out = NULL;
    size_t len = 0, n;
    char buf[4096];
    FILE *p;
    int status;

    cr_assert(asprintf(&full, "%s%s", cmd, merge_stderr ? " 2>&1" : " 2>/dev/null") > 0);
    p = popen(full, "r");
    cr_assert_not_null(p, "popen(%s) failed", full);
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) {
        out = realloc(out, len + n + 1);
        memcpy(out + len, buf, n);
        len += n;
    }
    if (out == NULL) {
        out = calloc(1, 1);
    }
    out[len] = '\0';
    status   = pclose(p);
    free(full);
    *output_p = out;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int tu_host_has_rdma(void)
{
    struct dirent *de;
    int found = 0;
    DIR *d    = opendir("/sys/class/infiniband");

    while ((d != NULL) && ((de = readdir(d)) != NULL)) {
        found |= (de->d_name[0] != '.');
    }
    if (d != NULL) {
        closedir(d);
    }
    return found;
}

const char *tu_without_shm(void)
{
    char path[4096];

    snprintf(path, sizeof(path), "%s/components/shm/.libs/xfer_shm.so",
             getenv("XFERTEST_BUILD_DIR") ? getenv("XFERTEST_BUILD_DIR") : ".");
    return (access(path, F_OK) == 0) ? "^shm" : "";
}

int tu_host_has_cuda_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

    if (h != NULL) {
        dlclose(h);
        return 1;
    }
    return 0;
}

char *tu_read_redirected_stderr(void)
{
    char *buf = calloc(1, 65536);
    size_t n;

    cr_assert_not_null(buf);
    fflush(stderr);
    n = fread(buf, 1, 65535, cr_get_redirected_stderr());
    buf[n] = '\0';
    return buf;
}

int tu_malloc_is_checkers(void)
{
#ifdef __SANITIZE_ADDRESS__
    return 1;
#elif defined(HAVE_VALGRIND_MEMCHECK_H)
    return RUNNING_ON_VALGRIND != 0;
#else
    return 0;
#endif
}
