/*
 * The one rule for transport component names, shared by the loader (names in plug-ins) and
 * the bootstrap parser (names off the wire): 1..max characters from [a-z0-9_].
 */
#ifndef XFER_NAMES_H
#define XFER_NAMES_H

#include <stddef.h>

static inline int xfer_name_is_valid(const char *name, size_t len, size_t max)
{
    if ((name == NULL) || (len == 0) || (len > max)) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!(((c >= 'a') && (c <= 'z')) || ((c >= '0') && (c <= '9')) || (c == '_'))) {
            return 0;
        }
    }
    return 1;
}

#endif
