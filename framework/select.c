/*
 * Transport selection. XFER_TRANSPORTS restricts and orders the candidates:
 *   ""  or "all"   every available component, ranked by capability then estimate
 *   "verbs,tcp"    only these, in this order; naming an unavailable one is an error
 *   "^gdr,verbs"   all but these ('^' negates the whole list and may only come first)
 * An unknown name is an error that lists the valid names and suggests the closest one.
 * Ranking filters by the required capabilities first (libfabric/UCP style: the request must be
 * a subset of what the component supports), then prefers more of the optional capabilities,
 * then transports that bypass the kernel (a small-message latency estimate under
 * XFER_SELECT_BYPASS_US: RDMA) over those that do not (sockets), then the bandwidth and latency
 * estimate. The bypass class comes before bandwidth because port speeds are reported well
 * (RDMA) or not at all (loopback, virtual NICs), while the CPU a socket path costs is sure.
 */
#include "xfer_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SELECT_SUBSYS "select"

static const char *const cap_names[] = {
    "PUT", "GET", "TAG", "TENSOR", "MEM_HOST", "MEM_CUDA", "INTER_HOST", "RMA_CUDA"
};

const char *xfer_caps_string(uint64_t caps, const char *sep, char *buf, size_t size)
{
    size_t off = 0;

    if (size == 0) {
        return buf;
    }
    buf[0] = '\0';
    for (unsigned i = 0; i < sizeof(cap_names) / sizeof(cap_names[0]); i++) {
        if (caps & (1ull << i)) {
            int n = snprintf(buf + off, size - off, "%s%s", off ? sep : "", cap_names[i]);
            if ((n < 0) || ((size_t)n >= size - off)) {
                break;
            }
            off += (size_t)n;
        }
    }
    if (off == 0) {
        snprintf(buf, size, "none");
    }
    return buf;
}

void xfer_transport_spec_cleanup(xfer_transport_spec_t *spec)
{
    for (size_t i = 0; i < spec->num; i++) {
        free(spec->names[i]);
    }
    free(spec->names);
    memset(spec, 0, sizeof(*spec));
}

xfer_status_t xfer_transport_spec_parse(const char *str, xfer_transport_spec_t *spec,
                                        char *err, size_t err_size)
{
    char *copy, *list, *tok, *next;
    xfer_status_t status = XFER_OK;
    size_t pos           = 0;

    memset(spec, 0, sizeof(*spec));
    copy = strdup(str ? str : "");
    if (copy == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    list = xfer_strtrim(copy);
    if ((*list == '\0') || (strcmp(list, "all") == 0)) {
        spec->all = 1;
        goto out;
    }
    if (*list == '^') {
        spec->negate = 1;
        list         = xfer_strtrim(list + 1);
        if (*list == '\0') {
            xfer_reason_set(err, err_size, "'^' must be followed by the transports to exclude");
            status = XFER_ERR_INVALID_PARAM;
            goto out;
        }
    }

    for (tok = list; tok != NULL; tok = next) {
        char *name, **grown;
        int dup = 0;

        next = strchr(tok, ',');
        if (next != NULL) {
            *next++ = '\0';
        }
        name = xfer_strtrim(tok);
        pos++;
        if (*name == '\0') {
            xfer_reason_set(err, err_size, "empty name at position %zu", pos);
            status = XFER_ERR_INVALID_PARAM;
            goto out;
        }
        if (strchr(name, '^') != NULL) {
            xfer_reason_set(err, err_size, "'^' negates the whole list and may only come "
                            "first (found in '%s')", name);
            status = XFER_ERR_INVALID_PARAM;
            goto out;
        }
        for (size_t i = 0; i < spec->num; i++) {
            dup |= (strcmp(spec->names[i], name) == 0);
        }
        if (dup) {
            xfer_log(XFER_LOG_WARN, SELECT_SUBSYS, "XFER_TRANSPORTS names '%s' twice; the "
                     "first place counts", name);
            continue;
        }
        grown = realloc(spec->names, (spec->num + 1) * sizeof(*grown));
        if (grown == NULL) {
            status = XFER_ERR_NO_MEMORY;
            goto out;
        }
        spec->names = grown;
        spec->names[spec->num] = strdup(name);
        if (spec->names[spec->num] == NULL) {
            status = XFER_ERR_NO_MEMORY;
            goto out;
        }
        spec->num++;
    }

out:
    free(copy);
    if (status != XFER_OK) {
        xfer_transport_spec_cleanup(spec);
    }
    return status;
}

/* Names of all components the loader saw, sorted and unique, for "valid names" messages. */
static size_t valid_names(const xfer_context_t *ctx, const char **names, size_t max)
{
    xfer_component_entry_t *e;
    size_t num = 0;

    ucs_list_for_each(e, &ctx->components, list) {
        int dup = 0;
        for (size_t i = 0; i < num; i++) {
            dup |= (strcmp(names[i], e->name) == 0);
        }
        if (!dup && (num < max)) {
            names[num++] = e->name;
        }
    }
    for (size_t i = 1; i < num; i++) {
        for (size_t j = i; (j > 0) && (strcmp(names[j - 1], names[j]) > 0); j--) {
            const char *t = names[j];
            names[j]      = names[j - 1];
            names[j - 1]  = t;
        }
    }
    return num;
}

xfer_status_t xfer_transport_spec_check(const xfer_context_t *ctx, char **errors_p)
{
    const xfer_transport_spec_t *spec = &ctx->transports;
    const char *names[64];
    xfer_status_t status = XFER_OK;
    size_t num_names     = valid_names(ctx, names, 64);

    for (size_t i = 0; i < spec->num; i++) {
        const xfer_component_entry_t *e = xfer_loader_find(ctx, spec->names[i]);
        char list[512] = "";
        size_t off     = 0;

        if (e == NULL) {
            const char *close = xfer_closest_name(spec->names[i], names, num_names);
            for (size_t j = 0; (j < num_names) && (off < sizeof(list)); j++) {
                off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", j ? ", " : "",
                                        names[j]);
            }
            if (close != NULL) {
                xfer_errors_append(errors_p, "XFER_TRANSPORTS='%s': unknown transport '%s'; "
                                   "did you mean '%s'? (valid names: %s)",
                                   ctx->fw_config.transports, spec->names[i], close,
                                   num_names ? list : "none found");
            } else {
                xfer_errors_append(errors_p, "XFER_TRANSPORTS='%s': unknown transport '%s' "
                                   "(valid names: %s)", ctx->fw_config.transports,
                                   spec->names[i], num_names ? list : "none found");
            }
            status = XFER_ERR_INVALID_PARAM;
        } else if (!spec->negate && (e->state == XFER_COMPONENT_UNAVAILABLE)) {
            xfer_errors_append(errors_p, "XFER_TRANSPORTS='%s': transport '%s' is unavailable: "
                               "%s", ctx->fw_config.transports, e->name, e->reason);
            status = XFER_ERR_UNAVAILABLE;
        } else if (!spec->negate && (e->state == XFER_COMPONENT_FAILED)) {
            xfer_errors_append(errors_p, "XFER_TRANSPORTS='%s': transport '%s' failed to load: "
                               "%s: %s", ctx->fw_config.transports, e->name, e->path, e->reason);
            status = XFER_ERR_UNAVAILABLE;
        }
    }
    return status;
}

/* Position of name in the spec's list, or -1. */
static int spec_position(const xfer_transport_spec_t *spec, const char *name)
{
    for (size_t i = 0; i < spec->num; i++) {
        if (strcmp(spec->names[i], name) == 0) {
            return (int)i;
        }
    }
    return -1;
}

typedef struct candidate {
    const xfer_component_entry_t *e;
    int                          spec_pos;
    int                          optional_hits;
} candidate_t;

#define XFER_SELECT_BYPASS_US 10.0

/* Include list: the user's order. Otherwise: more optional caps, kernel bypass, more
 * bandwidth, less latency. */
static int compare_candidates(const void *pa, const void *pb, void *arg)
{
    const xfer_transport_spec_t *spec = arg;
    const candidate_t *a = pa, *b = pb;

    if (!spec->all && !spec->negate) {
        return a->spec_pos - b->spec_pos;
    }
    if (a->optional_hits != b->optional_hits) {
        return b->optional_hits - a->optional_hits;
    }
    if ((a->e->attr.latency_us < XFER_SELECT_BYPASS_US) !=
        (b->e->attr.latency_us < XFER_SELECT_BYPASS_US)) {
        return (a->e->attr.latency_us < XFER_SELECT_BYPASS_US) ? -1 : 1;
    }
    if (a->e->attr.bandwidth_mbs != b->e->attr.bandwidth_mbs) {
        return (a->e->attr.bandwidth_mbs < b->e->attr.bandwidth_mbs) ? 1 : -1;
    }
    if (a->e->attr.latency_us != b->e->attr.latency_us) {
        return (a->e->attr.latency_us > b->e->attr.latency_us) ? 1 : -1;
    }
    return strcmp(a->e->name, b->e->name);
}

/* Why e cannot serve req under the context's XFER_TRANSPORTS; 0 when it can. */
static int rejected(const xfer_context_t *ctx, const xfer_component_entry_t *e,
                    const xfer_select_req_t *req, char *why, size_t size)
{
    const xfer_transport_spec_t *spec = &ctx->transports;
    int pos = spec_position(spec, e->name);
    char have[128], want[128];

    if (spec->negate && (pos >= 0)) {
        xfer_reason_set(why, size, "excluded by XFER_TRANSPORTS=%s", ctx->fw_config.transports);
    } else if (!spec->all && !spec->negate && (pos < 0)) {
        xfer_reason_set(why, size, "not listed in XFER_TRANSPORTS=%s",
                        ctx->fw_config.transports);
    } else if (e->state == XFER_COMPONENT_FAILED) {
        xfer_reason_set(why, size, "failed to load: %s: %s", e->path, e->reason);
    } else if (e->state == XFER_COMPONENT_UNAVAILABLE) {
        xfer_reason_set(why, size, "unavailable: %s", e->reason);
    } else if ((e->attr.caps & req->required_caps) != req->required_caps) {
        xfer_reason_set(why, size, "lacks capabilities: Supported: %s / Requested: %s",
                        xfer_caps_string(e->attr.caps, "|", have, sizeof(have)),
                        xfer_caps_string(req->required_caps, "|", want, sizeof(want)));
    } else {
        return 0;
    }
    return 1;
}

xfer_status_t xfer_select(const xfer_context_t *ctx, const xfer_select_req_t *req,
                          xfer_selection_t *sel_p)
{
    const xfer_transport_spec_t *spec;
    xfer_select_entry_t *ranked, *rejects;
    size_t num_cands = 0, num_rejects = 0;
    xfer_component_entry_t *e;
    candidate_t *cands;
    char have[128];

    if ((ctx == NULL) || (req == NULL) || (sel_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    spec    = &ctx->transports;
    ranked  = calloc(ctx->num_components + 1, sizeof(*ranked));
    rejects = calloc(ctx->num_components + 1, sizeof(*rejects));
    cands   = calloc(ctx->num_components + 1, sizeof(*cands));
    if ((ranked == NULL) || (rejects == NULL) || (cands == NULL)) {
        free(ranked);
        free(rejects);
        free(cands);
        return XFER_ERR_NO_MEMORY;
    }

    ucs_list_for_each(e, &ctx->components, list) {
        xfer_select_entry_t *rej = &rejects[num_rejects];

        /* A losing duplicate shares its name with the winner, which speaks for it. */
        if ((e->comp == NULL) && (xfer_loader_find(ctx, e->name) != e)) {
            continue;
        }
        if (rejected(ctx, e, req, rej->reason, sizeof(rej->reason))) {
            rej->name = e->name;
            rej->rank = -1;
            num_rejects++;
            continue;
        }
        cands[num_cands].e             = e;
        cands[num_cands].spec_pos      = spec_position(spec, e->name);
        cands[num_cands].optional_hits = __builtin_popcountll(e->attr.caps & req->optional_caps);
        num_cands++;
    }

    qsort_r(cands, num_cands, sizeof(*cands), compare_candidates, (void*)spec);
    for (size_t i = 0; i < num_cands; i++) {
        xfer_select_entry_t *s = &ranked[i];
        s->name = cands[i].e->name;
        s->rank = (int)i;
        if (!spec->all && !spec->negate) {
            xfer_reason_set(s->reason, sizeof(s->reason), "position %d in XFER_TRANSPORTS=%s",
                            cands[i].spec_pos + 1, ctx->fw_config.transports);
        } else {
            xfer_reason_set(s->reason, sizeof(s->reason), "capabilities %s; estimate %.1f us, "
                            "%.0f MB/s", xfer_caps_string(cands[i].e->attr.caps, "|", have,
                                                          sizeof(have)),
                            cands[i].e->attr.latency_us, cands[i].e->attr.bandwidth_mbs);
        }
    }
    memcpy(&ranked[num_cands], rejects, num_rejects * sizeof(*rejects));
    free(rejects);
    free(cands);
    sel_p->num_entries = num_cands + num_rejects;
    sel_p->entries     = ranked;
    return XFER_OK;
}

void xfer_selection_release(xfer_selection_t *sel)
{
    if (sel != NULL) {
        free(sel->entries);
        sel->entries     = NULL;
        sel->num_entries = 0;
    }
}
