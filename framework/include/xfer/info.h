/*
 * Introspection: what components a context found, their parameters, and how transports are
 * ranked for a given need. xfer_info is written against this header alone.
 *
 * Every pointer returned here belongs to the context and stays valid until it is destroyed.
 */
#ifndef XFER_INFO_H
#define XFER_INFO_H

#include <xfer/xfer.h>
#include <xfer/component.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    XFER_COMPONENT_AVAILABLE,       /* loaded, query says it works here */
    XFER_COMPONENT_UNAVAILABLE,     /* loaded, query says why it cannot work here */
    XFER_COMPONENT_FAILED,          /* rejected by the loader or its query failed */
} xfer_component_state_t;

typedef struct xfer_component_info {
    const char                  *name;        /* from the plug-in; for a failed one, from the file */
    const char                  *path;        /* the .so it came from */
    const char                  *origin;      /* "XFER_COMPONENT_PATH", "install", "build tree" */
    const char                  *version;     /* NULL when it failed to load */
    const char                  *description; /* NULL when it failed to load */
    xfer_component_state_t      state;
    const char                  *reason;      /* why unavailable or failed; "" otherwise */
    const xfer_component_attr_t *attr;        /* query result; NULL when it failed */
    int                         per_peer;     /* 1: it says per peer whether it reaches it
                                               * (iface_reachable), checked at connect */
} xfer_component_info_t;

XFER_API size_t xfer_component_count(const xfer_context_t *ctx);
XFER_API xfer_status_t xfer_component_get(const xfer_context_t *ctx, size_t index,
                                          xfer_component_info_t *info_p);

/* The directories searched for components, in order, colon-separated. */
XFER_API const char *xfer_component_search_path(const xfer_context_t *ctx);

typedef enum {
    XFER_PARAM_SOURCE_DEFAULT,
    XFER_PARAM_SOURCE_ENV,
} xfer_param_source_t;

typedef struct xfer_param_info {
    const char          *component;     /* NULL for the framework's own parameters */
    const char          *env_name;      /* XFER_<COMPONENT>_<NAME> */
    const char          *type;          /* "int", "size", "time", "bool", "string", "enum" */
    const char          *default_value;
    const char          *value;         /* current value as text */
    xfer_param_source_t source;
    const char          *help;
    const char          *range;         /* "0..65535", "error|warn|...", or "" */
} xfer_param_info_t;

XFER_API size_t xfer_param_count(const xfer_context_t *ctx);
XFER_API xfer_status_t xfer_param_get(const xfer_context_t *ctx, size_t index,
                                      xfer_param_info_t *info_p);

/* Capability names ("PUT", "MEM_HOST", ...) joined by sep into buf; returns buf. */
XFER_API const char *xfer_caps_string(uint64_t caps, const char *sep, char *buf, size_t size);

/* ---- selection ------------------------------------------------------------------------------ */

typedef struct xfer_select_req {
    uint64_t required_caps;     /* every one of these must be supported */
    uint64_t optional_caps;     /* more of these ranks higher */
} xfer_select_req_t;

typedef struct xfer_select_entry {
    const char *name;
    int        rank;                        /* 0 = chosen, 1.. = fallbacks, -1 = rejected */
    char       reason[XFER_REASON_MAX * 2]; /* why rejected, or how it was ranked */
} xfer_select_entry_t;

typedef struct xfer_selection {
    size_t              num_entries;        /* ranked ones first, then the rejected */
    xfer_select_entry_t *entries;
} xfer_selection_t;

/* Rank the transports for req under the context's XFER_TRANSPORTS. Returns XFER_OK even when
 * nothing qualifies (entries then say why each was rejected). Release with
 * xfer_selection_release(). */
XFER_API xfer_status_t xfer_select(const xfer_context_t *ctx, const xfer_select_req_t *req,
                                   xfer_selection_t *sel_p);
XFER_API void xfer_selection_release(xfer_selection_t *sel);

#ifdef __cplusplus
}
#endif

#endif /* XFER_INFO_H */
