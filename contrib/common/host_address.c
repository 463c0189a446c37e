/*
 * The address a plug-in's listener tells its peers to connect to (host_address.h).
 */
#include "host_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>

void xfer_contrib_host_address(const char *env_name, char *buf, size_t size)
{
    const char *env = (env_name != NULL) ? getenv(env_name) : NULL;
    struct ifaddrs *ifs = NULL;

    if ((env != NULL) && (*env != '\0')) {
        snprintf(buf, size, "%s", env);
        return;
    }
    snprintf(buf, size, "127.0.0.1");
    if (getifaddrs(&ifs) != 0) {
        return;
    }
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if ((i->ifa_addr != NULL) && (i->ifa_addr->sa_family == AF_INET) &&
            (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
            inet_ntop(AF_INET, &((struct sockaddr_in*)i->ifa_addr)->sin_addr, buf,
                      (socklen_t)size);
            break;
        }
    }
    freeifaddrs(ifs);
}
