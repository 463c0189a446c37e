/*
 * What the parts of xfer_info share: xfer_info.c (components, parameters, selection) and
 * xfer_info_sockets.c (what a listener opens).
 */
#ifndef XFER_INFO_TOOL_H
#define XFER_INFO_TOOL_H

#include <xfer/info.h>

/* A context for real connections (not an inspecting one), under the current environment. */
xfer_status_t tool_context(xfer_context_t **ctx_p);

/* --sockets: for each of the comma-separated transports, what a listener at address opens
 * once an endpoint came in. 0 when at least one was shown. */
int info_sockets(const char *address, const char *transports);

#endif
