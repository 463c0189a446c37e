/*
 * Parameter tables: each component (and the framework) declares typed parameters; this file
 * reads XFER_<COMPONENT>_<NAME> from the environment, checks type and range, stores the value
 * in the component's config struct and remembers where it came from. libucs's scanners parse
 * the unit-bearing types (sizes, times, booleans) so users get UCX's familiar syntax.
 */
#include "xfer_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ucs/config/parser.h>
#include <ucs/sys/string.h>

const char *xfer_param_type_name(xfer_param_type_t type)
{
    switch (type) {
    case XFER_PARAM_INT:    return "int";
    case XFER_PARAM_UINT:   return "uint";
    case XFER_PARAM_SIZE:   return "size";
    case XFER_PARAM_TIME:   return "time";
    case XFER_PARAM_BOOL:   return "bool";
    case XFER_PARAM_STRING: return "string";
    case XFER_PARAM_ENUM:   return "enum";
    }
    return "?";
}

static int has_range(const xfer_param_desc_t *d)
{
    return d->min != d->max;
}

static char *range_string(const xfer_param_desc_t *d)
{
    char *str = NULL;
    size_t len = 0;
    FILE *f;

    if ((d->type == XFER_PARAM_ENUM) && (d->enum_values != NULL)) {
        f = open_memstream(&str, &len);
        if (f == NULL) {
            return NULL;
        }
        for (int i = 0; d->enum_values[i] != NULL; i++) {
            fprintf(f, "%s%s", i ? "|" : "", d->enum_values[i]);
        }
        fclose(f);
        return str;
    }
    if (d->type == XFER_PARAM_BOOL) {
        return strdup("y|n");
    }
    if (has_range(d)) {
        if (d->type == XFER_PARAM_TIME) {
            return xfer_strdup_printf("%gs..%gs", d->min, d->max);
        }
        return xfer_strdup_printf("%.0f..%.0f", d->min, d->max);
    }
    return strdup("");
}

/* Parse one value into dest; on failure dest is untouched and err says why. */
static xfer_status_t parse_value(const xfer_param_desc_t *d, const char *str, void *dest,
                                 char *err, size_t err_size)
{
    union {
        int64_t  i;
        uint64_t u;
        double   t;
        int      b;
    } tmp; /* numbers land here and reach dest only once they pass the range check */
    char *end;
    double num = 0;

    if ((d->type != XFER_PARAM_STRING) && (*str == '\0')) {
        xfer_reason_set(err, err_size, "empty value");
        return XFER_ERR_INVALID_PARAM;
    }

    switch (d->type) {
    case XFER_PARAM_INT: {
        long long v;
        errno = 0;
        v     = strtoll(str, &end, 0);
        if ((errno != 0) || (*end != '\0')) {
            xfer_reason_set(err, err_size, "not an integer");
            return XFER_ERR_INVALID_PARAM;
        }
        tmp.i = v;
        num             = (double)v;
        break;
    }
    case XFER_PARAM_UINT: {
        unsigned long long v;
        errno = 0;
        v     = strtoull(str, &end, 0);
        if ((errno != 0) || (*end != '\0') || (strchr(str, '-') != NULL)) {
            xfer_reason_set(err, err_size, "not a non-negative integer");
            return XFER_ERR_INVALID_PARAM;
        }
        tmp.u = v;
        num              = (double)v;
        break;
    }
    case XFER_PARAM_SIZE: {
        size_t v;
        if (!ucs_config_sscanf_memunits(str, &v, NULL) || (v == UCS_MEMUNITS_AUTO) ||
            (strchr(str, '-') != NULL)) {
            xfer_reason_set(err, err_size, "not a size (examples: 4096, 64k, 1m, 2g, inf)");
            return XFER_ERR_INVALID_PARAM;
        }
        tmp.u = v;
        num              = (v == UCS_MEMUNITS_INF) ? INFINITY : (double)v;
        break;
    }
    case XFER_PARAM_TIME: {
        double v;
        if (!ucs_config_sscanf_time(str, &v, NULL) || isnan(v) || (v < 0)) {
            xfer_reason_set(err, err_size, "not a time (examples: 10s, 500ms, 20us, 1.5)");
            return XFER_ERR_INVALID_PARAM;
        }
        tmp.t = v;
        num            = v;
        break;
    }
    case XFER_PARAM_BOOL: {
        int v;
        if (!ucs_config_sscanf_bool(str, &v, NULL)) {
            xfer_reason_set(err, err_size, "not a boolean (y/yes/1 or n/no/0)");
            return XFER_ERR_INVALID_PARAM;
        }
        *(int*)dest = v ? 1 : 0;
        return XFER_OK;
    }
    case XFER_PARAM_STRING: {
        char *copy = strdup(str);
        if (copy == NULL) {
            xfer_reason_set(err, err_size, "out of memory");
            return XFER_ERR_NO_MEMORY;
        }
        free(*(char**)dest);
        *(char**)dest = copy;
        return XFER_OK;
    }
    case XFER_PARAM_ENUM:
        for (int i = 0; (d->enum_values != NULL) && (d->enum_values[i] != NULL); i++) {
            if (strcasecmp(str, d->enum_values[i]) == 0) {
                *(int*)dest = i;
                return XFER_OK;
            }
        }
        xfer_reason_set(err, err_size, "not one of the allowed values");
        return XFER_ERR_INVALID_PARAM;
    default:
        xfer_reason_set(err, err_size, "unknown parameter type %d", (int)d->type);
        return XFER_ERR_INVALID_PARAM;
    }

    if (has_range(d) && ((num < d->min) || (num > d->max))) {
        xfer_reason_set(err, err_size, "out of range");
        return XFER_ERR_OUT_OF_RANGE;
    }
    memcpy(dest, &tmp, (d->type == XFER_PARAM_TIME) ? sizeof(double) : sizeof(uint64_t));
    return XFER_OK;
}

static size_t param_table_length(const xfer_param_desc_t *descs)
{
    size_t n = 0;

    while ((descs != NULL) && (descs[n].name != NULL)) {
        n++;
    }
    return n;
}

static size_t param_value_size(xfer_param_type_t type)
{
    switch (type) {
    case XFER_PARAM_INT:    return sizeof(int64_t);
    case XFER_PARAM_UINT:
    case XFER_PARAM_SIZE:   return sizeof(uint64_t);
    case XFER_PARAM_TIME:   return sizeof(double);
    case XFER_PARAM_STRING: return sizeof(char*);
    default:                return sizeof(int);
    }
}

/*
 * Fill set->config from defaults and the environment. Bad environment values are appended
 * to *env_errors_p (the default is kept for them, so a tool can still look at the config);
 * a problem in the table itself (a default that does not parse, an offset past the config)
 * fails the whole set and is described in why.
 */
xfer_status_t xfer_param_set_init(xfer_param_set_t *set, const char *component,
                                  const xfer_param_desc_t *descs, size_t config_size,
                                  char **env_errors_p, char *why, size_t why_size)
{
    char upper[XFER_NAME_MAX], err[128];
    xfer_status_t status;

    memset(set, 0, sizeof(*set));
    set->component   = component;
    set->config_size = config_size;
    set->num         = param_table_length(descs);
    set->config      = calloc(1, config_size ? config_size : 1);
    set->values      = calloc(set->num ? set->num : 1, sizeof(*set->values));
    if ((set->config == NULL) || (set->values == NULL)) {
        status = XFER_ERR_NO_MEMORY;
        goto err_cleanup;
    }

    xfer_str_upper(upper, component ? component : "", sizeof(upper));
    for (size_t i = 0; i < set->num; i++) {
        const xfer_param_desc_t *d = &descs[i];
        xfer_param_value_t *pv     = &set->values[i];
        void *dest                 = (char*)set->config + d->offset;
        const char *env;

        pv->desc     = d;
        pv->env_name = component ? xfer_strdup_printf(XFER_ENV_PREFIX "%s_%s", upper, d->name)
                                 : xfer_strdup_printf(XFER_ENV_PREFIX "%s", d->name);
        pv->range    = range_string(d);
        if ((pv->env_name == NULL) || (pv->range == NULL)) {
            status = XFER_ERR_NO_MEMORY;
            goto err_cleanup;
        }
        if ((d->offset + param_value_size(d->type) > config_size) ||
            (d->default_value == NULL)) {
            xfer_reason_set(why, why_size, "%s: bad parameter table entry (offset %zu, config "
                            "%zu bytes, default %s)", pv->env_name, d->offset, config_size,
                            d->default_value ? "set" : "missing");
            status = XFER_ERR_INVALID_PARAM;
            goto err_cleanup;
        }
        status = parse_value(d, d->default_value, dest, err, sizeof(err));
        if (status != XFER_OK) {
            xfer_reason_set(why, why_size, "%s: built-in default '%s' is invalid: %s",
                            pv->env_name, d->default_value, err);
            goto err_cleanup;
        }
        pv->value  = strdup(d->default_value);
        pv->source = XFER_PARAM_SOURCE_DEFAULT;

        env = getenv(pv->env_name);
        if (env == NULL) {
            continue;
        }
        status = parse_value(d, env, dest, err, sizeof(err));
        if (status == XFER_ERR_NO_MEMORY) {
            goto err_cleanup;
        } else if (status != XFER_OK) {
            xfer_errors_append(env_errors_p, "%s='%s': %s (%s%s%s, default %s)",
                               pv->env_name, env, err, xfer_param_type_name(d->type),
                               *pv->range ? " " : "", pv->range, d->default_value);
            xfer_log(XFER_LOG_ERROR, "config", "%s='%s': %s; expected %s%s%s",
                     pv->env_name, env, err, xfer_param_type_name(d->type),
                     *pv->range ? " in " : "", pv->range);
            continue;
        }
        free(pv->value);
        pv->value  = strdup(env);
        pv->source = XFER_PARAM_SOURCE_ENV;
        if (pv->value == NULL) {
            status = XFER_ERR_NO_MEMORY;
            goto err_cleanup;
        }
    }
    return XFER_OK;

err_cleanup:
    xfer_param_set_cleanup(set);
    return status;
}

void xfer_param_set_cleanup(xfer_param_set_t *set)
{
    for (size_t i = 0; (set->values != NULL) && (i < set->num); i++) {
        xfer_param_value_t *pv = &set->values[i];
        if ((pv->desc != NULL) && (pv->desc->type == XFER_PARAM_STRING) &&
            (set->config != NULL)) {
            free(*(char**)((char*)set->config + pv->desc->offset));
        }
        free(pv->env_name);
        free(pv->value);
        free(pv->range);
    }
    free(set->values);
    free(set->config);
    memset(set, 0, sizeof(*set));
}
