/*
 * The address a plug-in's listener tells its peers to connect to (NCCL's and NIXL's).
 */
#ifndef XFER_CONTRIB_HOST_ADDRESS_H
#define XFER_CONTRIB_HOST_ADDRESS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The host peers reach this process at: the environment variable env_name when it is set and
 * not empty, else the first IPv4 address of an interface that is up and not loopback, else
 * 127.0.0.1. */
void xfer_contrib_host_address(const char *env_name, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* XFER_CONTRIB_HOST_ADDRESS_H */
