/*
 * xfer_info: what transports this host has, what they can do, how they are configured, and
 * which one xfer would pick - like ucx_info, ompi_info and fi_info.
 *
 *   xfer_info            components: version, status (and why not), devices, capabilities
 *   xfer_info -c         every parameter: type, default, current value, where it came from
 *   xfer_info -s         the transport selected for host memory and for CUDA memory, and why
 *                        the others were not; which transports are chosen per peer
 *   xfer_info --json     the same data as JSON (combine with -c / -s)
 *   xfer_info --sockets[=ADDRESS]
 *                        every socket a listener at ADDRESS (default ":0") opens, per
 *                        transport (xfer_info_sockets.c)
 *
 * Exit status: 0; 1 when the environment is invalid (the message says what is wrong);
 * 2 on a usage error.
 */
#include "xfer_info.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    int components;
    int params;
    int select;
    int markdown;
    int json;
    const char *sockets;    /* --sockets: the address to listen at */
} options_t;

/* Reaching other hosts does not rank, as in the framework's offer: a transport that reaches
 * some peers only (shm: this host's) says so per peer at connect, and the next one serves the
 * others. */
static const struct {
    const char        *label;
    xfer_select_req_t req;
} select_cases[] = {
    {"host", {XFER_CAP_MEM_HOST, XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG | XFER_CAP_TENSOR}},
    {"cuda", {XFER_CAP_MEM_CUDA, XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG | XFER_CAP_TENSOR}},
};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: xfer_info [-c] [-s] [--json] [--markdown] [--sockets[=ADDRESS]] [-h]\n"
            "Show the transport components xfer finds, their devices and capabilities.\n"
            "\n"
            "  -c, --config   list every parameter: type, default, current value and source\n"
            "  -s, --select   show which transport would be selected for host and CUDA memory\n"
            "                 under the current environment, and why the others were not;\n"
            "                 which are chosen per peer (same host only, like shm)\n"
            "  -j, --json     print the same data as JSON\n"
            "  -m, --markdown every parameter as a Markdown table, defaults only\n"
            "                 (docs/parameters.md)\n"
            "      --sockets[=ADDRESS]\n"
            "                 listen at ADDRESS (default \":0\", loopback; \"*:0\" every\n"
            "                 interface), connect an endpoint to it over each available\n"
            "                 transport in turn, and list every socket that opened\n"
            "  -h, --help     this text\n"
            "\n"
            "Environment: XFER_TRANSPORTS, XFER_COMPONENT_PATH, XFER_LOG_LEVEL and the\n"
            "per-component XFER_<COMPONENT>_<PARAM> variables listed by -c.\n");
}

static const char *state_name(xfer_component_state_t state)
{
    switch (state) {
    case XFER_COMPONENT_AVAILABLE:   return "available";
    case XFER_COMPONENT_UNAVAILABLE: return "unavailable";
    default:                         return "failed to load";
    }
}

/* ---- text ------------------------------------------------------------------------------------ */

/* The CUDA driver's state, told without loading it: xfer_info does not initialise CUDA, and
 * gdr found its GPUs in sysfs. */
static const char *cuda_line(char *buf, size_t size)
{
    xfer_cuda_describe(buf, size);
    return buf;
}

static void text_components(const xfer_context_t *ctx)
{
    char caps[256], cuda[XFER_REASON_MAX];

    printf("# xfer %d.%d, plug-in ABI v%u\n", XFER_VERSION_MAJOR, XFER_VERSION_MINOR,
           XFER_COMPONENT_ABI_V1);
    printf("# component search path: %s\n", xfer_component_search_path(ctx));
    printf("# CUDA driver: %s\n", cuda_line(cuda, sizeof(cuda)));
    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        xfer_component_info_t info;
        const xfer_component_attr_t *attr;

        if (xfer_component_get(ctx, i, &info) != XFER_OK) {
            continue;
        }
        printf("#\n");
        if (info.state == XFER_COMPONENT_FAILED) {
            printf("# Component: %s\n", info.name);
            printf("#   status:   failed to load: %s: %s\n", info.path, info.reason);
            continue;
        }
        attr = info.attr;
        printf("# Component: %s %s\n", info.name, info.version);
        printf("#   %s\n", info.description);
        printf("#   path:     %s (%s)\n", info.path, info.origin);
        if (info.state == XFER_COMPONENT_AVAILABLE) {
            printf("#   status:   available\n");
            printf("#   capabilities: %s\n", xfer_caps_string(attr->caps, " ", caps, sizeof(caps)));
            printf("#   estimate: latency %.1f us, bandwidth %.0f MB/s\n", attr->latency_us,
                   attr->bandwidth_mbs);
        } else {
            printf("#   status:   unavailable: %s\n", info.reason);
        }
        for (uint32_t d = 0; d < attr->num_devices; d++) {
            const xfer_device_attr_t *dev = &attr->devices[d];
            printf("#   Device: %s (%s", dev->name, dev->kind);
            if (dev->numa_node >= 0) {
                printf(", NUMA node %d", dev->numa_node);
            }
            printf(")\n");
            for (uint32_t a = 0; a < dev->num_attrs; a++) {
                printf("#     %-14s %s\n", dev->attrs[a].key, dev->attrs[a].value);
            }
        }
    }
}

static void text_params(const xfer_context_t *ctx)
{
    printf("# Parameters: NAME=VALUE  (type, range, default, source)\n");
    for (size_t i = 0; i < xfer_param_count(ctx); i++) {
        xfer_param_info_t p;

        if (xfer_param_get(ctx, i, &p) != XFER_OK) {
            continue;
        }
        printf("#\n# %s\n", p.help);
        printf("# type %s%s%s, default '%s', from %s\n", p.type, *p.range ? ", range " : "",
               p.range, p.default_value,
               (p.source == XFER_PARAM_SOURCE_ENV) ? "environment" : "default");
        printf("%s=%s\n", p.env_name, p.value);
    }
}

/* A cell of a Markdown table: '|' escaped, one line. */
static void md_cell(const char *s)
{
    for (; (s != NULL) && (*s != '\0'); s++) {
        if (*s == '|') {
            fputs("\\|", stdout);
        } else {
            putchar((*s == '\n') ? ' ' : *s);
        }
    }
}

/* Every parameter as a Markdown table, from the parameter tables alone (defaults, never the
 * environment's values): docs/parameters.md is this output, and make check compares them. */
static void markdown_params(const xfer_context_t *ctx)
{
    const char *last = "";

    printf("<!-- generated by `xfer_info --markdown` from the parameter tables; do not edit -->\n"
           "# Parameters\n\nEvery `XFER_*` variable xfer reads: the framework's, then each "
           "component's. Sizes take k, m, g; times s, ms, us; booleans y or n.\n");
    for (size_t i = 0; i < xfer_param_count(ctx); i++) {
        const char *owner;
        xfer_param_info_t p;

        if (xfer_param_get(ctx, i, &p) != XFER_OK) {
            continue;
        }
        owner = (p.component != NULL) ? p.component : "framework";
        if (strcmp(owner, last) != 0) {
            printf("\n## %s\n\n| variable | type | default | range | meaning |\n"
                   "| --- | --- | --- | --- | --- |\n", owner);
            last = owner;
        }
        printf("| `%s` | %s | ", p.env_name, p.type);
        if (*p.default_value != '\0') {
            printf("`%s`", p.default_value);
        } else {
            printf("(none)");
        }
        printf(" | ");
        md_cell(p.range);
        printf(" | ");
        md_cell(p.help);
        printf(" |\n");
    }
}

/* The current value of a framework parameter, "?" when there is none. */
static const char *param_value(const xfer_context_t *ctx, const char *env_name)
{
    xfer_param_info_t info;

    for (size_t i = 0; i < xfer_param_count(ctx); i++) {
        if ((xfer_param_get(ctx, i, &info) == XFER_OK) &&
            (strcmp(info.env_name, env_name) == 0)) {
            return info.value;
        }
    }
    return "?";
}

/* The transport ranked first for req, into name; NULL when none is. */
static const char *selected_name(const xfer_context_t *ctx, const xfer_select_req_t *req,
                                 char *name, size_t size)
{
    xfer_selection_t sel;
    const char *found = NULL;

    if (xfer_select(ctx, req, &sel) != XFER_OK) {
        return NULL;
    }
    for (size_t i = 0; (found == NULL) && (i < sel.num_entries); i++) {
        if (sel.entries[i].rank == 0) {
            snprintf(name, size, "%s", sel.entries[i].name);
            found = name;
        }
    }
    xfer_selection_release(&sel);
    return found;
}

/* The transport endpoints use - the best for host memory, as the framework offers them -
 * and its capabilities; NULL when there is none. */
static const char *endpoint_transport(const xfer_context_t *ctx, char *name, size_t size,
                                      uint64_t *caps_p)
{
    const char *found = selected_name(ctx, &select_cases[0].req, name, size);

    for (size_t i = 0; (found != NULL) && (i < xfer_component_count(ctx)); i++) {
        xfer_component_info_t info;

        if ((xfer_component_get(ctx, i, &info) == XFER_OK) && (info.attr != NULL) &&
            (strcmp(info.name, found) == 0)) {
            *caps_p = info.attr->caps;
        }
    }
    return found;
}

/* The transport that stages CUDA memory: the one endpoints use, when it does not move CUDA
 * memory itself but has put and get (framework/staging.c); NULL otherwise. */
static const char *cuda_staged_by(const xfer_context_t *ctx, char *name, size_t size)
{
    uint64_t caps = 0;

    if ((endpoint_transport(ctx, name, size, &caps) == NULL) || (caps & XFER_CAP_MEM_CUDA) ||
        ((caps & (XFER_CAP_PUT | XFER_CAP_GET)) != (XFER_CAP_PUT | XFER_CAP_GET))) {
        return NULL;
    }
    return name;
}

/* The transport selected for CUDA memory (one that moves it itself), into name; NULL when
 * none is. */
static const char *cuda_mover(const xfer_context_t *ctx, char *name, size_t size)
{
    return selected_name(ctx, &select_cases[1].req, name, size);
}

/* ": gdr, which would, is not selected: REASON" when gdr is among the rejected for CUDA
 * memory; "" otherwise. */
static const char *gdr_not_selected(const xfer_context_t *ctx, char *buf, size_t size)
{
    xfer_selection_t sel;

    buf[0] = '\0';
    if (xfer_select(ctx, &select_cases[1].req, &sel) != XFER_OK) {
        return buf;
    }
    for (size_t i = 0; i < sel.num_entries; i++) {
        if ((sel.entries[i].rank < 0) && (strcmp(sel.entries[i].name, "gdr") == 0)) {
            snprintf(buf, size, ": gdr, which would, is not selected: %s",
                     sel.entries[i].reason);
        }
    }
    xfer_selection_release(&sel);
    return buf;
}

/* Whether gdr is the transport selected for CUDA memory. */
static int cuda_direct_is_gdr(const xfer_context_t *ctx)
{
    xfer_selection_t sel;
    int gdr = 0;

    if (xfer_select(ctx, &select_cases[1].req, &sel) != XFER_OK) {
        return 0;
    }
    for (size_t i = 0; i < sel.num_entries; i++) {
        gdr |= (sel.entries[i].rank == 0) && (strcmp(sel.entries[i].name, "gdr") == 0);
    }
    xfer_selection_release(&sel);
    return gdr;
}

/* A transport of the host ranking that says per peer whether it reaches it
 * (iface_reachable): whether that is this host's peers only (it lacks XFER_CAP_INTER_HOST),
 * and the transport ranked next, which the other peers get (NULL: none). */
typedef struct per_peer {
    const char *name;
    int        same_host_only;
    const char *others;
    const xfer_component_attr_t *attr;  /* its devices say how it reaches peers */
} per_peer_t;

/* The per-peer transports of sel, in rank order, into out; how many. Names are sel's. */
static size_t per_peer_list(const xfer_context_t *ctx, const xfer_selection_t *sel,
                            per_peer_t *out, size_t max)
{
    size_t num = 0;

    for (int rank = 0; num < max; rank++) {
        const xfer_select_entry_t *entry = NULL, *next = NULL;
        xfer_component_info_t info;

        for (size_t i = 0; i < sel->num_entries; i++) {
            entry = (sel->entries[i].rank == rank) ? &sel->entries[i] : entry;
            next  = (sel->entries[i].rank == rank + 1) ? &sel->entries[i] : next;
        }
        if (entry == NULL) {
            break;
        }
        for (size_t i = 0; i < xfer_component_count(ctx); i++) {
            if ((xfer_component_get(ctx, i, &info) != XFER_OK) || !info.per_peer ||
                (info.attr == NULL) || (strcmp(info.name, entry->name) != 0)) {
                continue;
            }
            out[num].name           = entry->name;
            out[num].same_host_only = !(info.attr->caps & XFER_CAP_INTER_HOST);
            out[num].others         = next ? next->name : NULL;
            out[num].attr           = info.attr;
            num++;
            break;
        }
    }
    return num;
}

static void text_per_peer(const xfer_context_t *ctx)
{
    xfer_selection_t sel;
    per_peer_t pp[32];
    size_t num;

    if (xfer_select(ctx, &select_cases[0].req, &sel) != XFER_OK) {
        return;
    }
    num = per_peer_list(ctx, &sel, pp, sizeof(pp) / sizeof(pp[0]));
    for (size_t i = 0; i < num; i++) {
        if (pp[i].same_host_only) {
            printf("# same host only: %s is chosen for peers on this host", pp[i].name);
        } else {
            printf("# per peer: %s is chosen for the peers it reaches", pp[i].name);
        }
        printf(" (reachability checked per peer at connect); ");
        if (pp[i].others != NULL) {
            printf("others use %s\n", pp[i].others);
        } else {
            printf("no other transport is selected for the others\n");
        }
        /* what decides it and what it costs, as the component reports them (shm: reach, cma) */
        for (uint32_t d = 0; d < pp[i].attr->num_devices; d++) {
            const xfer_device_attr_t *dev = &pp[i].attr->devices[d];

            for (uint32_t a = 0; a < dev->num_attrs; a++) {
                if ((strcmp(dev->attrs[a].key, "reach") == 0) ||
                    (strcmp(dev->attrs[a].key, "cma") == 0)) {
                    printf("#   %s: %s\n", dev->attrs[a].key, dev->attrs[a].value);
                }
            }
        }
    }
    xfer_selection_release(&sel);
}

static void text_select(const xfer_context_t *ctx)
{
    char caps[128];

    for (size_t c = 0; c < sizeof(select_cases) / sizeof(select_cases[0]); c++) {
        xfer_selection_t sel;
        int any = 0;

        if (xfer_select(ctx, &select_cases[c].req, &sel) != XFER_OK) {
            printf("# %s memory: selection failed\n", select_cases[c].label);
            continue;
        }
        printf("# %s memory (requires %s):\n", select_cases[c].label,
               xfer_caps_string(select_cases[c].req.required_caps, "|", caps, sizeof(caps)));
        for (size_t i = 0; i < sel.num_entries; i++) {
            if (sel.entries[i].rank == 0) {
                printf("#   selected: %s (%s)\n", sel.entries[i].name, sel.entries[i].reason);
                any = 1;
            }
        }
        if (!any) {
            printf("#   selected: none\n");
        }
        for (size_t i = 0; i < sel.num_entries; i++) {
            if (sel.entries[i].rank > 0) {
                printf("#   fallback %d: %s (%s)\n", sel.entries[i].rank, sel.entries[i].name,
                       sel.entries[i].reason);
            } else if (sel.entries[i].rank < 0) {
                printf("#   not selected: %s: %s\n", sel.entries[i].name, sel.entries[i].reason);
            }
        }
        xfer_selection_release(&sel);
    }
    {
        char name[XFER_NAME_MAX], gdr_why[XFER_REASON_MAX * 2 + 48];

        char mover[XFER_NAME_MAX];
        uint64_t ep_caps = 0;

        if ((endpoint_transport(ctx, name, sizeof(name), &ep_caps) != NULL) &&
            (ep_caps & XFER_CAP_RMA_CUDA) && !(ep_caps & XFER_CAP_MEM_CUDA)) {
            printf("# cuda memory, by CUDA IPC over %s (peers on this host): put, get and "
                   "batches to and from a peer's CUDA memory open its allocation's IPC handle "
                   "and copy with the CUDA driver here; put and get of CUDA memory here with a "
                   "peer's host memory through pinned host buffers (XFER_STAGING_CHUNK=%s x "
                   "XFER_STAGING_DEPTH=%s) unless it came from xfer_mem_alloc; tagged messages "
                   "and tensors through a host buffer of their size\n", name,
                   param_value(ctx, "XFER_STAGING_CHUNK"),
                   param_value(ctx, "XFER_STAGING_DEPTH"));
        } else if (cuda_staged_by(ctx, name, sizeof(name)) != NULL) {
            printf("# cuda memory, staged: put/get through %s and pinned host buffers "
                   "(XFER_STAGING_CHUNK=%s x XFER_STAGING_DEPTH=%s); tagged messages and "
                   "tensors through a host buffer of their size; a peer's put or get cannot "
                   "reach it\n", name,
                   param_value(ctx, "XFER_STAGING_CHUNK"), param_value(ctx, "XFER_STAGING_DEPTH"));
            if (cuda_mover(ctx, mover, sizeof(mover)) != NULL) {
                printf("#   why: endpoints use %s, the best for host memory, which does not "
                       "move CUDA memory itself; %s does (XFER_TRANSPORTS=%s)%s\n", name,
                       mover, mover, gdr_not_selected(ctx, gdr_why, sizeof(gdr_why)));
            } else {
                printf("#   why: no open transport moves CUDA memory itself%s\n",
                       gdr_not_selected(ctx, gdr_why, sizeof(gdr_why)));
            }
        } else if ((endpoint_transport(ctx, name, sizeof(name), &ep_caps) != NULL) &&
                   (strcmp(name, "tcp") == 0) && (ep_caps & XFER_CAP_MEM_CUDA)) {
            printf("# cuda memory, through bounce buffers: tcp copies it to and from pinned "
                   "host buffers (XFER_TCP_CUDA_CHUNK=%s, XFER_TCP_CUDA_DEPTH=%s each way), "
                   "the copies overlapping the socket; put, get, tagged messages and tensors\n",
                   param_value(ctx, "XFER_TCP_CUDA_CHUNK"), param_value(ctx, "XFER_TCP_CUDA_DEPTH"));
            printf("#   why: tcp cannot hand device memory to the socket%s\n",
                   gdr_not_selected(ctx, gdr_why, sizeof(gdr_why)));
        } else if (cuda_direct_is_gdr(ctx)) {
            printf("# cuda memory, direct: gdr registers it with its RDMA device (DMA-BUF "
                   "first, XFER_GDR_DMABUF=%s; then nvidia-peermem, XFER_GDR_PEERMEM=%s) and "
                   "flushes what the device wrote into it before a transfer completes "
                   "(XFER_GDR_FLUSH=%s); a buffer neither way registers is staged through "
                   "host buffers over gdr, the reason logged when it is registered\n",
                   param_value(ctx, "XFER_GDR_DMABUF"), param_value(ctx, "XFER_GDR_PEERMEM"),
                   param_value(ctx, "XFER_GDR_FLUSH"));
        }
    }
    text_per_peer(ctx);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static void json_str(const char *s)
{
    putchar('"');
    for (; (s != NULL) && (*s != '\0'); s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '"':  fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        default:
            if (c < 0x20) {
                printf("\\u%04x", c);
            } else {
                putchar(c);
            }
        }
    }
    putchar('"');
}

static void json_kv(const char *key, const char *value, int comma)
{
    json_str(key);
    putchar(':');
    if (value == NULL) {
        fputs("null", stdout);
    } else {
        json_str(value);
    }
    if (comma) {
        putchar(',');
    }
}

static void json_caps(uint64_t caps)
{
    char buf[256], *save = NULL, *tok;
    int first = 1;

    putchar('[');
    if (caps != 0) {
        xfer_caps_string(caps, " ", buf, sizeof(buf));
        for (tok = strtok_r(buf, " ", &save); tok != NULL; tok = strtok_r(NULL, " ", &save)) {
            printf("%s", first ? "" : ",");
            json_str(tok);
            first = 0;
        }
    }
    putchar(']');
}

static void json_components(const xfer_context_t *ctx)
{
    printf("\"components\":[");
    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        xfer_component_info_t info;
        const xfer_component_attr_t *attr;

        if (xfer_component_get(ctx, i, &info) != XFER_OK) {
            continue;
        }
        attr = info.attr;
        printf("%s{", i ? "," : "");
        json_kv("name", info.name, 1);
        json_kv("version", info.version, 1);
        json_kv("description", info.description, 1);
        json_kv("path", info.path, 1);
        json_kv("origin", info.origin, 1);
        json_kv("status", state_name(info.state), 1);
        json_kv("reason", (info.state == XFER_COMPONENT_AVAILABLE) ? NULL : info.reason, 1);
        printf("\"capabilities\":");
        json_caps(attr ? attr->caps : 0);
        if (attr == NULL) {
            printf(",\"devices\":[]}");
            continue;
        }
        printf(",\"latency_us\":%.3f,\"bandwidth_mbs\":%.1f", attr->latency_us,
               attr->bandwidth_mbs);
        printf(",\"limits\":{\"max_msg_size\":%llu,\"max_eager_size\":%llu,\"max_key_len\":%u}",
               (unsigned long long)attr->limits.max_msg_size,
               (unsigned long long)attr->limits.max_eager_size, attr->limits.max_key_len);
        printf(",\"devices\":[");
        for (uint32_t d = 0; d < attr->num_devices; d++) {
            const xfer_device_attr_t *dev = &attr->devices[d];
            printf("%s{", d ? "," : "");
            json_kv("name", dev->name, 1);
            json_kv("kind", dev->kind, 1);
            printf("\"numa_node\":%d,\"attributes\":{", dev->numa_node);
            for (uint32_t a = 0; a < dev->num_attrs; a++) {
                json_kv(dev->attrs[a].key, dev->attrs[a].value, a + 1 < dev->num_attrs);
            }
            printf("}}");
        }
        printf("]}");
    }
    printf("]");
}

static void json_params(const xfer_context_t *ctx)
{
    printf("\"parameters\":[");
    for (size_t i = 0; i < xfer_param_count(ctx); i++) {
        xfer_param_info_t p;

        if (xfer_param_get(ctx, i, &p) != XFER_OK) {
            continue;
        }
        printf("%s{", i ? "," : "");
        json_kv("name", p.env_name, 1);
        json_kv("component", p.component, 1);
        json_kv("type", p.type, 1);
        json_kv("range", p.range, 1);
        json_kv("default", p.default_value, 1);
        json_kv("value", p.value, 1);
        json_kv("source", (p.source == XFER_PARAM_SOURCE_ENV) ? "environment" : "default", 1);
        json_kv("help", p.help, 0);
        printf("}");
    }
    printf("]");
}

/* The ranked entries (ranked != 0) or the rejected ones, as a JSON array. */
static void json_select_entries(const xfer_selection_t *sel, int ranked)
{
    int first = 1;

    printf("[");
    for (size_t i = 0; i < sel->num_entries; i++) {
        if ((sel->entries[i].rank >= 0) != ranked) {
            continue;
        }
        printf("%s{", first ? "" : ",");
        json_kv("name", sel->entries[i].name, 1);
        json_kv("why", sel->entries[i].reason, 0);
        printf("}");
        first = 0;
    }
    printf("]");
}

static void json_select(const xfer_context_t *ctx)
{
    printf("\"selection\":{");
    for (size_t c = 0; c < sizeof(select_cases) / sizeof(select_cases[0]); c++) {
        xfer_selection_t sel = {0};
        const char *chosen   = NULL;

        xfer_select(ctx, &select_cases[c].req, &sel);
        for (size_t i = 0; i < sel.num_entries; i++) {
            if (sel.entries[i].rank == 0) {
                chosen = sel.entries[i].name;
            }
        }
        printf("%s", c ? "," : "");
        json_str(select_cases[c].label);
        printf(":{\"required\":");
        json_caps(select_cases[c].req.required_caps);
        printf(",");
        json_kv("selected", chosen, 1);
        if (c == 0) {
            per_peer_t pp[32];
            size_t num = per_peer_list(ctx, &sel, pp, sizeof(pp) / sizeof(pp[0]));

            printf("\"per_peer\":[");
            for (size_t i = 0; i < num; i++) {
                printf("%s{", i ? "," : "");
                json_kv("name", pp[i].name, 1);
                printf("\"same_host_only\":%s,", pp[i].same_host_only ? "true" : "false");
                json_kv("others", pp[i].others, 0);
                printf("}");
            }
            printf("],");
        }
        if (c == 1) {
            char name[XFER_NAME_MAX];

            json_kv("staged", cuda_staged_by(ctx, name, sizeof(name)), 1);
        }
        printf("\"ranking\":");
        json_select_entries(&sel, 1);
        printf(",\"rejected\":");
        json_select_entries(&sel, 0);
        printf("}");
        xfer_selection_release(&sel);
    }
    printf("}");
}

static void json_errors(const char *errors)
{
    char *copy, *save = NULL, *line;
    int first = 1;

    printf("\"errors\":[");
    copy = errors ? strdup(errors) : NULL;
    for (line = copy ? strtok_r(copy, "\n", &save) : NULL; line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        printf("%s", first ? "" : ",");
        json_str(line);
        first = 0;
    }
    free(copy);
    printf("]");
}

xfer_status_t tool_context(xfer_context_t **ctx_p)
{
    xfer_context_params_t params = {.size = sizeof(params)};

    return xfer_context_create(&params, ctx_p);
}

/* --sockets over the transports XFER_TRANSPORTS names, else every one this host has. */
static int sockets_per_transport(const xfer_context_t *ctx, const char *address)
{
    const char *env = getenv("XFER_TRANSPORTS");
    char names[512] = "";
    size_t len = 0;

    if ((env != NULL) && (*env != '\0') && (*env != '^')) {
        return info_sockets(address, env);      /* the ones named, in their order */
    }
    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        xfer_component_info_t info;

        if ((xfer_component_get(ctx, i, &info) == XFER_OK) &&
            (info.state == XFER_COMPONENT_AVAILABLE) &&
            (len + strlen(info.name) + 2 < sizeof(names))) {
            len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", len ? "," : "",
                                    info.name);
        }
    }
    if (len == 0) {
        fprintf(stderr, "xfer_info: no transport is available\n");
        return 1;
    }
    return info_sockets(address, names);
}

int main(int argc, char **argv)
{
    char cuda[XFER_REASON_MAX];
    static const struct option long_opts[] = {
        {"config", no_argument, NULL, 'c'},
        {"select", no_argument, NULL, 's'},
        {"json",   no_argument, NULL, 'j'},
        {"markdown", no_argument, NULL, 'm'},
        {"sockets", optional_argument, NULL, 'S'},
        {"help",   no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}
    };
    xfer_context_params_t params = {.size = sizeof(params), .flags = XFER_CONTEXT_FLAG_INSPECT};
    options_t opts = {0};
    xfer_context_t *ctx;
    const char *errors;
    xfer_status_t status;
    int c;

    while ((c = getopt_long(argc, argv, "csjmh", long_opts, NULL)) != -1) {
        switch (c) {
        case 'c': opts.params = 1; break;
        case 'm': opts.markdown = 1; break;
        case 's': opts.select = 1; break;
        case 'j': opts.json = 1; break;
        case 'S': opts.sockets = optarg ? optarg : ":0"; break;
        case 'h': usage(stdout); return 0;
        default:  usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "xfer_info: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    opts.components = !opts.params && !opts.select && !opts.markdown;

    status = xfer_context_create(&params, &ctx);
    if (status != XFER_OK) {
        fprintf(stderr, "xfer_info: cannot create a context: %s\n", xfer_status_string(status));
        return 1;
    }
    errors = xfer_context_env_error(ctx);

    if (opts.sockets != NULL) {
        int ret = (errors != NULL) ? 1 : sockets_per_transport(ctx, opts.sockets);

        if (errors != NULL) {
            fprintf(stderr, "xfer_info: invalid environment:\n%s\n", errors);
        }
        xfer_context_destroy(ctx);
        return ret;
    }
    if (opts.markdown) {
        markdown_params(ctx);
    } else if (opts.json) {
        int sep = 0;
        printf("{\"version\":\"%d.%d\",\"abi\":%u,", XFER_VERSION_MAJOR, XFER_VERSION_MINOR,
               XFER_COMPONENT_ABI_V1);
        json_kv("search_path", xfer_component_search_path(ctx), 1);
        json_kv("cuda_driver", cuda_line(cuda, sizeof(cuda)), 1);
        if (opts.components) {
            json_components(ctx);
            sep = 1;
        }
        if (opts.params) {
            printf("%s", sep ? "," : "");
            json_params(ctx);
            sep = 1;
        }
        if (opts.select) {
            printf("%s", sep ? "," : "");
            json_select(ctx);
        }
        printf(",");
        json_errors(errors);
        printf("}\n");
    } else {
        if (opts.components) {
            text_components(ctx);
        }
        if (opts.params) {
            text_params(ctx);
        }
        /* With a bad environment, a selection would be a guess: say what is wrong instead. */
        if (opts.select && (errors == NULL)) {
            text_select(ctx);
        }
    }
    if (errors != NULL) {
        fprintf(stderr, "xfer_info: invalid environment:\n%s\n", errors);
    }
    xfer_context_destroy(ctx);
    return (errors != NULL) ? 1 : 0;
}
