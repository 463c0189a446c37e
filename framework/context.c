/*
 * The context: loads the components, reads and validates the XFER_* environment, and answers
 * the introspection calls of xfer/info.h.
 */
#include "xfer_int.h"
#include "auth.h"
#include "cuda_driver.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTEXT_SUBSYS "config"

extern char **environ;

static const xfer_param_desc_t fw_params[] = {
    {"LOG_LEVEL", XFER_PARAM_ENUM, "warn",
     "What reaches stderr: error, warn, info, debug or trace.",
     offsetof(xfer_fw_config_t, log_level), 0, 0, xfer_log_level_names},
    {"TRANSPORTS", XFER_PARAM_STRING, "all",
     "Transports to use: 'all'; 'a,b' (only these, in this order; an unavailable one is an "
     "error); '^a,b' (all but these).",
     offsetof(xfer_fw_config_t, transports), 0, 0, NULL},
    {"COMPONENT_PATH", XFER_PARAM_STRING, "",
     "Colon-separated directories (or xfer_<name>.so files) searched for components before "
     "the install directory.",
     offsetof(xfer_fw_config_t, component_path), 0, 0, NULL},
    {"AUTH_KEY_FILE", XFER_PARAM_STRING, "",
     "A file holding the shared key (16 to 4096 bytes, readable by its owner only) that "
     "every peer must prove it holds: the bootstrap runs a mutual challenge-response "
     "(HMAC-SHA256) covering everything it negotiates, and refuses a peer without the key "
     "before giving it any transport resource. Both sides need the same key. Empty: no "
     "authentication (a listener reachable from other hosts says so once).",
     offsetof(xfer_fw_config_t, auth_key_file), 0, 0, NULL},
    {"BOOTSTRAP_TIMEOUT", XFER_PARAM_TIME, "10s",
     "Longest a connect handshake, or the handshake of one accepted connection (counted "
     "from its accept), may take before it fails with a timeout.",
     offsetof(xfer_fw_config_t, bootstrap_timeout), 0.001, 3600, NULL},
    {"BOOTSTRAP_MAX_PENDING", XFER_PARAM_UINT, "64",
     "Most handshakes a listener carries on at once. At the bound a new connection closes "
     "the oldest unfinished one (logged), so that slow or silent clients cannot lock out a "
     "good one; each holds a socket and at most two frames of the bootstrap protocol.",
     offsetof(xfer_fw_config_t, bootstrap_max_pending), 1, 65536, NULL},
    {"CLOSE_TIMEOUT", XFER_PARAM_TIME, "10s",
     "Longest xfer_endpoint_close() (and context destroy) waits for what was already sent "
     "to reach the peer before it closes anyway, cancelling the rest.",
     offsetof(xfer_fw_config_t, close_timeout), 0, 3600, NULL},
    {"PROGRESS_THREAD", XFER_PARAM_BOOL, "n",
     "Run a thread that sleeps on the transports' file descriptors and progresses them, so "
     "operations move without the application calling xfer_progress().",
     offsetof(xfer_fw_config_t, progress_thread), 0, 0, NULL},
    {"STATS", XFER_PARAM_BOOL, "n",
     "Print every endpoint's transport counters (messages by type, bytes written, cache "
     "hits and misses, credit stalls...) to stderr when it closes, and so at finalize.",
     offsetof(xfer_fw_config_t, stats), 0, 0, NULL},
    {"MAX_KEY_LEN", XFER_PARAM_UINT, "1024",
     "Longest tensor key, in bytes; longer keys are refused locally and from peers.",
     offsetof(xfer_fw_config_t, max_key_len), 1, 65535, NULL},
    {"TENSOR_MAX_REQUESTS", XFER_PARAM_UINT, "4096",
     "Requests from one peer that may wait for tensors not published yet; a request past it "
     "is answered at once with XFER_ERR_NO_RESOURCE, so that a peer cannot make this side "
     "hold without bound.",
     offsetof(xfer_fw_config_t, tensor_max_requests), 1, 1 << 24, NULL},
    {"TENSOR_REQUEST_TIMEOUT", XFER_PARAM_TIME, "600s",
     "Longest a peer's request waits for its tensor to be published; then it is answered "
     "with XFER_ERR_TIMEOUT (its fetch fails with that status). Steps aborted long ago, which "
     "this side no longer remembers, end this way too.",
     offsetof(xfer_fw_config_t, tensor_request_timeout), 0.001, 7 * 86400, NULL},
    {"BATCH_TIMEOUT", XFER_PARAM_TIME, "60s",
     "Deadline of a batch posted without its own (timeout 0): one not done by then "
     "completes with XFER_ERR_TIMEOUT, saying how many of its descriptors landed. 0: none.",
     offsetof(xfer_fw_config_t, batch_timeout), 0, 7 * 86400, NULL},
    {"BATCH_MAX_DESCS", XFER_PARAM_UINT, "65536",
     "Most descriptors in one batch.",
     offsetof(xfer_fw_config_t, batch_max_descs), 1, 1 << 24, NULL},
    {"NOTIFY_MAX_LEN", XFER_PARAM_SIZE, "4k",
     "Longest notification a batch may carry; a peer's longer one is a protocol error.",
     offsetof(xfer_fw_config_t, notify_max_len), 0, 65536, NULL},
    {"NOTIFY_MAX_QUEUED", XFER_PARAM_UINT, "65536",
     "Notifications one endpoint keeps until the application takes them; a peer that sends "
     "more fails the endpoint with XFER_ERR_NO_RESOURCE, so that it cannot make this side "
     "hold without bound.",
     offsetof(xfer_fw_config_t, notify_max_queued), 1, 1 << 24, NULL},
    {"FAIR_SLICE", XFER_PARAM_SIZE, "4m",
     "Most bytes one peer's operation moves in one round of progress: a larger one (a batch "
     "a target moves, a message's or a tensor's data read from the peer, a stream of large "
     "frames) goes on in the next rounds, in turn with the other endpoints, so that one "
     "peer's largest batch or message delays another's round trip by a slice, not by all "
     "of it.",
     offsetof(xfer_fw_config_t, fair_slice), 65536, (double)(1ull << 40), NULL},
    {"UNEXPECTED_BUDGET", XFER_PARAM_SIZE, "256m",
     "Bytes of messages nobody received yet that the whole process buffers, every peer of "
     "every transport together (each endpoint also has XFER_UNEXPECTED_EP): one peer may "
     "hold a fair share of it, and a peer past its share is not read until receives take "
     "its messages. 0: no process-wide bound.",
     offsetof(xfer_fw_config_t, unexpected_budget), 0, (double)(1ull << 42), NULL},
    {"UNEXPECTED_EP", XFER_PARAM_SIZE, "16m",
     "Bytes of one peer's messages nobody received yet that this side buffers (each counts "
     "64 bytes more, so that their number is bounded too); past it the peer is not read until "
     "receives take them. One whose peer waits for answers behind them may go on to twice "
     "it, so that those answers are not held behind messages nobody receives. It also bounds "
     "the buffers of large such messages (64 KiB and more) kept for the next ones once freed.",
     offsetof(xfer_fw_config_t, unexpected_ep), 4096, (double)(1ull << 40), NULL},
    {"ANSWERS_BUDGET", XFER_PARAM_SIZE, "256m",
     "Bytes of answers (get data, acknowledgements, tensors) the whole process queues for "
     "peers that do not read them; a peer past its fair share has its requests left unread "
     "until its answers go. 0: no process-wide bound.",
     offsetof(xfer_fw_config_t, answers_budget), 0, (double)(1ull << 42), NULL},
    {"NOTIFY_BUDGET", XFER_PARAM_SIZE, "64m",
     "Bytes of notifications not taken yet the whole process keeps (each counts 64 bytes "
     "more); a peer past its fair share fails its endpoint with XFER_ERR_NO_RESOURCE. 0: no "
     "process-wide bound.",
     offsetof(xfer_fw_config_t, notify_budget), 0, (double)(1ull << 42), NULL},
    {"TENSOR_BUDGET", XFER_PARAM_UINT, "16384",
     "Peers' requests for tensors not published yet that the whole process keeps waiting; "
     "one past a peer's fair share is answered at once with XFER_ERR_NO_RESOURCE. 0: no "
     "process-wide bound.",
     offsetof(xfer_fw_config_t, tensor_budget), 0, 1 << 30, NULL},
    {"CUDA_LIB", XFER_PARAM_STRING, "libcuda.so.1",
     "The CUDA driver library, loaded with dlopen on the first registration of CUDA memory "
     "(never before, so that a process without device memory does not initialise CUDA). The "
     "first context of a process chooses it.",
     offsetof(xfer_fw_config_t, cuda_lib), 0, 0, NULL},
    {"STAGING_CHUNK", XFER_PARAM_SIZE, "4m",
     "Bytes of one chunk of the staging pipeline, which moves device memory over a transport "
     "that cannot touch it (put and get of CUDA memory over tcp, or verbs without GPUDirect) "
     "through pinned host buffers of this size.",
     offsetof(xfer_fw_config_t, staging_chunk), 1024, (double)(1ull << 30), NULL},
    {"STAGING_DEPTH", XFER_PARAM_UINT, "4",
     "Pinned host buffers of the staging pipeline: chunks in flight at once in a context "
     "(the copy of one overlaps the transfer of another). Allocated and registered on the "
     "first staged operation, released when the context is destroyed.",
     offsetof(xfer_fw_config_t, staging_depth), 1, 256, NULL},
    {NULL}
};

/* Every XFER_* variable that some table declares, or the caller reads itself (caller_env);
 * the rest get a warning with a suggestion. */
static void warn_unknown_env(xfer_context_t *ctx, const char *const *caller_env)
{
    const char **known;
    size_t num_known = 0, cap = ctx->fw_params.num;
    xfer_component_entry_t *e;

    ucs_list_for_each(e, &ctx->components, list) {
        cap += e->params.num;
    }
    for (size_t i = 0; (caller_env != NULL) && (caller_env[i] != NULL); i++) {
        cap++;
    }
    known = calloc(cap + 1, sizeof(*known));
    if (known == NULL) {
        return;
    }
    for (size_t i = 0; i < ctx->fw_params.num; i++) {
        known[num_known++] = ctx->fw_params.values[i].env_name;
    }
    ucs_list_for_each(e, &ctx->components, list) {
        for (size_t i = 0; i < e->params.num; i++) {
            known[num_known++] = e->params.values[i].env_name;
        }
    }
    for (size_t i = 0; (caller_env != NULL) && (caller_env[i] != NULL); i++) {
        known[num_known++] = caller_env[i];
    }

    for (char **env = environ; (env != NULL) && (*env != NULL); env++) {
        char name[128], prefix[XFER_NAME_MAX + 8];
        const char *eq = strchr(*env, '='), *close;
        size_t len     = eq ? (size_t)(eq - *env) : strlen(*env);
        int found      = 0, failed_component = 0;

        if ((strncmp(*env, XFER_ENV_PREFIX, strlen(XFER_ENV_PREFIX)) != 0) ||
            (len >= sizeof(name))) {
            continue;
        }
        memcpy(name, *env, len);
        name[len] = '\0';
        for (size_t i = 0; (i < num_known) && !found; i++) {
            found = (strcmp(name, known[i]) == 0);
        }
        if (found) {
            continue;
        }
        /* A component that failed to load has no table to check against: stay quiet. */
        ucs_list_for_each(e, &ctx->components, list) {
            char upper[XFER_NAME_MAX];
            xfer_str_upper(upper, e->name, sizeof(upper));
            snprintf(prefix, sizeof(prefix), XFER_ENV_PREFIX "%s_", upper);
            if ((e->comp == NULL) && (strncmp(name, prefix, strlen(prefix)) == 0)) {
                failed_component = 1;
            }
        }
        if (failed_component) {
            xfer_log(XFER_LOG_DEBUG, CONTEXT_SUBSYS, "%s belongs to a component that failed to "
                     "load; not checked", name);
            continue;
        }
        close = xfer_closest_name(name, known, num_known);
        if (close != NULL) {
            xfer_log(XFER_LOG_WARN, CONTEXT_SUBSYS, "unknown environment variable %s; did you "
                     "mean %s? (xfer_info -c lists them all)", name, close);
        } else {
            xfer_log(XFER_LOG_WARN, CONTEXT_SUBSYS, "unknown environment variable %s (xfer_info "
                     "-c lists them all)", name);
        }
    }
    free(known);
}

static xfer_status_t build_param_index(xfer_context_t *ctx)
{
    xfer_component_entry_t *e;
    size_t n = ctx->fw_params.num;
    const xfer_param_set_t *set;

    ucs_list_for_each(e, &ctx->components, list) {
        n += e->params.num;
    }
    ctx->param_index = calloc(n + 1, sizeof(*ctx->param_index));
    if (ctx->param_index == NULL) {
        return XFER_ERR_NO_MEMORY;
    }

    set = &ctx->fw_params;
    e   = ucs_list_head(&ctx->components, xfer_component_entry_t, list);
    for (;;) {
        for (size_t i = 0; i < set->num; i++) {
            const xfer_param_value_t *pv = &set->values[i];
            xfer_param_info_t *info      = &ctx->param_index[ctx->num_params++];
            info->component     = set->component;
            info->env_name      = pv->env_name;
            info->type          = xfer_param_type_name(pv->desc->type);
            info->default_value = pv->desc->default_value;
            info->value         = pv->value;
            info->source        = pv->source;
            info->help          = pv->desc->help ? pv->desc->help : "";
            info->range         = pv->range;
        }
        if (&e->list == &ctx->components) {
            break;
        }
        set = &e->params;
        e   = ucs_list_next(&e->list, xfer_component_entry_t, list);
    }
    return XFER_OK;
}

xfer_status_t xfer_context_create(const xfer_context_params_t *params, xfer_context_t **ctx_p)
{
    const char *const *caller_env = NULL;
    uint32_t flags = 0;
    xfer_context_t *ctx;
    xfer_status_t status;
    char err[256];

    if (ctx_p == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (params != NULL) {
        if (params->size < offsetof(xfer_context_params_t, flags) + sizeof(params->flags)) {
            xfer_log(XFER_LOG_ERROR, CONTEXT_SUBSYS, "xfer_context_params_t.size %u is too "
                     "small", params->size);
            return XFER_ERR_INVALID_PARAM;
        }
        flags = params->flags;
        if (params->size >= offsetof(xfer_context_params_t, env_names) +
                            sizeof(params->env_names)) {
            caller_env = params->env_names;
        }
    }

    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ucs_list_head_init(&ctx->components);

    status = xfer_param_set_init(&ctx->fw_params, NULL, fw_params, sizeof(xfer_fw_config_t),
                                 &ctx->env_error, err, sizeof(err));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, CONTEXT_SUBSYS, "framework parameters: %s", err);
        goto err_free_ctx;
    }
    /* The params' config struct is the framework config. */
    ctx->fw_config = *(xfer_fw_config_t*)ctx->fw_params.config;
    xfer_log_set_level((xfer_log_level_t)ctx->fw_config.log_level);
    xfer_cuda_lib_set(ctx->fw_config.cuda_lib);
    xfer_budget_configure(&ctx->fw_config);
    if ((flags & XFER_CONTEXT_FLAG_SERIALIZED) &&
        (ctx->fw_config.progress_thread || (flags & XFER_CONTEXT_FLAG_PROGRESS_THREAD))) {
        xfer_log(XFER_LOG_ERROR, CONTEXT_SUBSYS, "XFER_CONTEXT_FLAG_SERIALIZED with a progress "
                 "thread (%s): the thread would call into the context beside the application",
                 (flags & XFER_CONTEXT_FLAG_PROGRESS_THREAD) ? "XFER_CONTEXT_FLAG_PROGRESS_THREAD" :
                 "XFER_PROGRESS_THREAD=y");
        status = XFER_ERR_INVALID_PARAM;
        goto err_cleanup_params;
    }
    ctx->serialized = !!(flags & XFER_CONTEXT_FLAG_SERIALIZED);

    status = xfer_loader_load(ctx);
    if (status != XFER_OK) {
        goto err_cleanup_params;
    }

    if (xfer_transport_spec_parse(ctx->fw_config.transports, &ctx->transports, err,
                                  sizeof(err)) != XFER_OK) {
        xfer_errors_append(&ctx->env_error, "XFER_TRANSPORTS='%s': %s",
                           ctx->fw_config.transports, err);
    } else {
        xfer_transport_spec_check(ctx, &ctx->env_error);
    }

    if (xfer_auth_key_load(ctx, params, err, sizeof(err)) != XFER_OK) {
        xfer_errors_append(&ctx->env_error, "%s", err);
    }
    warn_unknown_env(ctx, caller_env);
    status = build_param_index(ctx);
    if (status != XFER_OK) {
        goto err_unload;
    }

    if ((ctx->env_error != NULL) && !(flags & XFER_CONTEXT_FLAG_INSPECT)) {
        xfer_log(XFER_LOG_ERROR, CONTEXT_SUBSYS, "invalid environment:\n%s", ctx->env_error);
        status = XFER_ERR_INVALID_PARAM;
        goto err_unload;
    }
    /* An inspecting context (xfer_info) only looks: it opens no transport. */
    status = xfer_ctx_data_init(ctx, !(flags & XFER_CONTEXT_FLAG_INSPECT));
    if (status != XFER_OK) {
        goto err_data;
    }
    if ((ctx->fw_config.progress_thread || (flags & XFER_CONTEXT_FLAG_PROGRESS_THREAD)) &&
        !(flags & XFER_CONTEXT_FLAG_INSPECT)) {
        status = xfer_ctx_thread_start(ctx);
        if (status != XFER_OK) {
            goto err_data;
        }
    }
    *ctx_p = ctx;
    return XFER_OK;

err_data:
    xfer_ctx_data_cleanup(ctx);
err_unload:
    xfer_auth_key_free(ctx);
    free(ctx->param_index);
    xfer_transport_spec_cleanup(&ctx->transports);
    xfer_loader_unload(ctx);
err_cleanup_params:
    xfer_param_set_cleanup(&ctx->fw_params);
err_free_ctx:
    free(ctx->env_error);
    free(ctx);
    return status;
}

void xfer_context_destroy(xfer_context_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    if (xfer_in_callback) {
        /* the callback's own request and the walk that runs it belong to this context */
        xfer_log(XFER_LOG_ERROR, "context", "xfer_context_destroy called from a completion or "
                 "allocation callback: refused; destroy the context after progress returns");
        return;
    }
    xfer_ctx_data_cleanup(ctx);
    xfer_auth_key_free(ctx);
    free(ctx->param_index);
    xfer_transport_spec_cleanup(&ctx->transports);
    xfer_loader_unload(ctx);
    xfer_param_set_cleanup(&ctx->fw_params);
    free(ctx->env_error);
    free(ctx);
}

const char *xfer_context_env_error(const xfer_context_t *ctx)
{
    return ctx ? ctx->env_error : NULL;
}

size_t xfer_component_count(const xfer_context_t *ctx)
{
    return ctx ? ctx->num_components : 0;
}

xfer_status_t xfer_component_get(const xfer_context_t *ctx, size_t index,
                                 xfer_component_info_t *info_p)
{
    const xfer_component_entry_t *e;
    size_t i = 0;

    if ((ctx == NULL) || (info_p == NULL) || (index >= ctx->num_components)) {
        return XFER_ERR_INVALID_PARAM;
    }
    ucs_list_for_each(e, &ctx->components, list) {
        if (i++ != index) {
            continue;
        }
        info_p->name        = e->name;
        info_p->path        = e->path;
        info_p->origin      = e->origin;
        info_p->version     = e->comp ? e->comp->version : NULL;
        info_p->description = e->comp ? e->comp->description : NULL;
        info_p->state       = e->state;
        info_p->reason      = e->reason;
        info_p->attr        = e->comp ? &e->attr : NULL;
        info_p->per_peer    = (e->comp != NULL) &&
                              (xfer_component_iface_reachable(e->comp) != NULL);
        return XFER_OK;
    }
    return XFER_ERR_INVALID_PARAM;
}

const char *xfer_component_search_path(const xfer_context_t *ctx)
{
    return (ctx && ctx->search_path) ? ctx->search_path : "";
}

size_t xfer_param_count(const xfer_context_t *ctx)
{
    return ctx ? ctx->num_params : 0;
}

xfer_status_t xfer_param_get(const xfer_context_t *ctx, size_t index, xfer_param_info_t *info_p)
{
    if ((ctx == NULL) || (info_p == NULL) || (index >= ctx->num_params)) {
        return XFER_ERR_INVALID_PARAM;
    }
    *info_p = ctx->param_index[index];
    return XFER_OK;
}
