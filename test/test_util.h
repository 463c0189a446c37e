/*
 * Helpers shared by the Criterion suites: temporary component directories filled with real
 * plug-ins built by the test suite, context creation, and running the tools as subprocesses.
 */
#ifndef XFER_TEST_UTIL_H
#define XFER_TEST_UTIL_H

#include <xfer/info.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* A fresh directory under /tmp holding copies of the named test plug-ins (e.g. "tgood"),
 * NULL-terminated list. Removed by tu_dir_remove(). */
char *tu_plugin_dir(const char *const *plugins);
/* Write a file with the given bytes into dir. */
void tu_write_file(const char *dir, const char *name, const void *data, size_t len);
void tu_dir_remove(char *dir);

/* Create a context; inspect != 0 keeps going on a bad environment. */
xfer_status_t tu_context(int inspect, xfer_context_t **ctx_p);
/* Find a component by name (and, when path_part is not NULL, whose path contains it). */
int tu_component(const xfer_context_t *ctx, const char *name, const char *path_part,
                 xfer_component_info_t *info);
/* Value of a device attribute of a component's first device, or NULL. */
const char *tu_device_attr(const xfer_component_info_t *info, const char *key);
/* The selection entry for name, or NULL. */
const xfer_select_entry_t *tu_select_entry(const xfer_selection_t *sel, const char *name);
/* Name of the rank-0 entry, or NULL. */
const char *tu_selected(const xfer_selection_t *sel);

/* What the test wrote to stderr so far, when it runs with .init = cr_redirect_stderr
 * (malloc'd, NUL-terminated, at most 64 KiB). */
char *tu_read_redirected_stderr(void);

/* An endpoint's counter by name (xfer_endpoint_counters); -1 when its transport keeps none of
 * that name, or the endpoint gives none. */
int64_t tu_ep_counter(xfer_endpoint_t *ep, const char *name);

/* The process's counter name (xfer_context_counters: peer_<cause>, ...); 0 when it has none
 * yet, -1 on error. */
int64_t tu_ctx_counter(xfer_context_t *ctx, const char *name);
/* How many times what occurs in text. */
int tu_count_in(const char *text, const char *what);

/* How many descriptors this process has open (/proc/self/fd), to check for leaks. */
int tu_fd_count(void);

/* The largest resident size this process has had, in KiB (getrusage): growth between two
 * reads is what was held in between. */
long tu_peak_rss_kib(void);

/* Network facts of this host, for where listeners listen: its IPv4 address on the default
 * route (0 when it has none but loopback), whether it has ::1, whether sa is a loopback
 * address, the local addresses of this process's listening TCP sockets, and a plain TCP
 * connect to host:port (0, or the errno that refused it). */
int tu_outward_ipv4(char *buf, size_t size);
int tu_host_has_ipv6_loopback(void);
int tu_is_loopback(const struct sockaddr_storage *sa);
int tu_listening_sockets(struct sockaddr_storage *out, int max);
int tu_tcp_connect(const char *host, int port);

/* Run a shell command; returns its exit status and a malloc'd copy of what it printed
 * (stdout, and stderr when merge_stderr). */
int tu_run(const char *cmd, int merge_stderr, char **output_p);
/* Does the host have RDMA devices / a CUDA driver? Used to pick the expected answer. */
int tu_host_has_rdma(void);
int tu_host_has_cuda_driver(void);
/* An XFER_TRANSPORTS value that takes the shm component out ("^shm"; "" when the build tree
 * has none): suites that negotiate or rank among the test plug-ins on one host, where the real
 * shm would outrank them, as they take tcp out by naming no interface. */
const char *tu_without_shm(void);
/* Does a memory checker's allocator serve malloc() in this process (the test built with
 * AddressSanitizer, or run under valgrind)? Its free() unmaps where libucm does not see it. */
int tu_malloc_is_checkers(void);

#endif
