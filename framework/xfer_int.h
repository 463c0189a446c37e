/*
 * libxfer internals shared by the framework's files. Not installed.
 */
#ifndef XFER_INT_H
#define XFER_INT_H

#include <xfer/xfer.h>
#include <xfer/component.h>
#include <xfer/info.h>

#include <ucs/datastruct/list.h>

#define XFER_ENV_PREFIX "XFER_"

/* One parsed parameter: the descriptor and where its current value came from. */
typedef struct xfer_param_value {
    const xfer_param_desc_t *desc;
    char                    *env_name;
    char                    *value;         /* current value, as text */
    char                    *range;         /* printable range, "" when unbounded */
    xfer_param_source_t     source;
} xfer_param_value_t;

/* A component's parameter table, parsed into its config struct. */
typedef struct xfer_param_set {
    const char              *component;     /* NULL for the framework */
    void                    *config;        /* config_size bytes the descs point into */
    size_t                  config_size;
    size_t                  num;
    xfer_param_value_t      *values;
} xfer_param_set_t;

/* One candidate file the loader looked at. */
typedef struct xfer_component_entry {
    ucs_list_link_t             list;
    char                        *name;      /* from the struct, or derived from the file name */
    char                        *path;
    const char                  *origin;
    void                        *dl_handle;
    const xfer_component_v1_t   *comp;      /* NULL when the loader rejected the file */
    xfer_component_state_t      state;
    char                        reason[XFER_REASON_MAX * 2];
    xfer_param_set_t            params;
    xfer_component_attr_t       attr;
} xfer_component_entry_t;

/* Framework configuration: the table is in context.c. */
typedef struct xfer_fw_config {
    int         log_level;          /* xfer_log_level_t */
    const char  *transports;        /* XFER_TRANSPORTS, "" = all */
    const char  *component_path;    /* XFER_COMPONENT_PATH */
    double      bootstrap_timeout;  /* XFER_BOOTSTRAP_TIMEOUT, seconds */
} xfer_fw_config_t;

/* XFER_TRANSPORTS parsed: an include list (ordered) or an exclude list. */
typedef struct xfer_transport_spec {
    int     negate;                 /* 1: "^a,b" = all but these */
    int     all;                    /* 1: no restriction */
    size_t  num;
    char    **names;
} xfer_transport_spec_t;

struct xfer_context {
    xfer_fw_config_t        fw_config;
    xfer_param_set_t        fw_params;
    ucs_list_link_t         components;     /* xfer_component_entry_t, in load order */
    size_t                  num_components;
    char                    *search_path;
    xfer_transport_spec_t   transports;
    char                    *env_error;     /* NULL when the environment is valid */
    xfer_param_info_t       *param_index;   /* flattened for xfer_param_get() */
    size_t                  num_params;
};

/* log.c */
void xfer_log_set_level(xfer_log_level_t level);
xfer_status_t xfer_log_level_parse(const char *str, xfer_log_level_t *level_p);
extern const char *const xfer_log_level_names[];

/* util.c */
size_t xfer_edit_distance(const char *a, const char *b);
const char *xfer_closest_name(const char *word, const char *const *names, size_t num);
char *xfer_strtrim(char *s);
void xfer_str_upper(char *dst, const char *src, size_t size);
char *xfer_strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* param.c */
xfer_status_t xfer_param_set_init(xfer_param_set_t *set, const char *component,
                                  const xfer_param_desc_t *descs, size_t config_size,
                                  char **env_errors_p, char *why, size_t why_size);
void xfer_param_set_cleanup(xfer_param_set_t *set);
const char *xfer_param_type_name(xfer_param_type_t type);

/* loader.c */
xfer_status_t xfer_loader_load(xfer_context_t *ctx);
void xfer_loader_unload(xfer_context_t *ctx);
xfer_component_entry_t *xfer_loader_find(const xfer_context_t *ctx, const char *name);

/* select.c */
xfer_status_t xfer_transport_spec_parse(const char *str, xfer_transport_spec_t *spec,
                                        char *err, size_t err_size);
void xfer_transport_spec_cleanup(xfer_transport_spec_t *spec);
xfer_status_t xfer_transport_spec_check(const xfer_context_t *ctx, char **errors_p);

/* Append a formatted line to a malloc'd error text (*text_p may be NULL). */
void xfer_errors_append(char **text_p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* XFER_INT_H */
