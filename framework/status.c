/* Status codes and their names. */
#include "xfer_int.h"

const char *xfer_status_string(xfer_status_t status)
{
    switch (status) {
    case XFER_OK:                return "success";
    case XFER_INPROGRESS:        return "operation in progress";
    case XFER_ERR_NO_MEMORY:     return "out of memory";
    case XFER_ERR_INVALID_PARAM: return "invalid parameter";
    case XFER_ERR_NOT_FOUND:     return "not found";
    case XFER_ERR_UNSUPPORTED:   return "operation not supported";
    case XFER_ERR_UNAVAILABLE:   return "transport unavailable";
    case XFER_ERR_IO:            return "input/output error";
    case XFER_ERR_CONNECTION:    return "connection error";
    case XFER_ERR_TIMEOUT:       return "timed out";
    case XFER_ERR_TRUNCATED:     return "message truncated";
    case XFER_ERR_CANCELED:      return "canceled";
    case XFER_ERR_PROTOCOL:      return "protocol error";
    case XFER_ERR_BUSY:          return "busy";
    case XFER_ERR_NO_RESOURCE:   return "no resources";
    case XFER_ERR_ABI:           return "plug-in ABI mismatch";
    case XFER_ERR_EXISTS:        return "already exists";
    case XFER_ERR_OUT_OF_RANGE:  return "out of range";
    case XFER_ERR_ABORTED:       return "aborted";
    case XFER_ERR_UNREACHABLE:   return "no shared transport";
    case XFER_ERR_INTERNAL:      return "internal error";
    case XFER_ERR_PEER_CLOSED:   return "the peer closed its endpoint";
    case XFER_ERR_DENIED:        return "access denied";
    }
    return "unknown status";
}
