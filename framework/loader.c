/*
 * Component loader: find xfer_<name>.so files, dlopen them, check the ABI, and record every
 * rejected candidate with a one-line reason instead of failing.
 *
 * Search order: XFER_COMPONENT_PATH (colon-separated directories or files), then the install
 * directory (next to the libxfer.so that is running, and the configured one), then - when
 * libxfer.so itself was loaded from the build tree - the build tree's component directories.
 * The first component with a given name wins; later ones are reported as duplicates.
 */
#include "xfer_int.h"
#include "names.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOADER_SUBSYS "loader"

/* Where a search directory came from; printed by xfer_info. */
static const char *const origin_env     = "XFER_COMPONENT_PATH";
static const char *const origin_install = "install";
static const char *const origin_build   = "build tree";

typedef struct search_dir {
    char        *path;
    const char  *origin;
} search_dir_t;

/* "xfer_tcp.so" -> "tcp"; NULL when the file name is not a component's. */
static char *name_from_file(const char *file)
{
    size_t len = strlen(file);

    if ((len <= 8) || (strncmp(file, "xfer_", 5) != 0) || (strcmp(file + len - 3, ".so") != 0)) {
        return NULL;
    }
    return strndup(file + 5, len - 8);
}

static xfer_component_entry_t *entry_new(xfer_context_t *ctx, const char *path,
                                         const char *origin)
{
    xfer_component_entry_t *e = calloc(1, sizeof(*e));
    const char *base          = strrchr(path, '/');

    if (e == NULL) {
        return NULL;
    }
    e->path   = strdup(path);
    e->name   = name_from_file(base ? base + 1 : path);
    e->origin = origin;
    e->state  = XFER_COMPONENT_FAILED;
    if ((e->path == NULL) || (e->name == NULL)) {
        free(e->path);
        free(e->name);
        free(e);
        return NULL;
    }
    ucs_list_add_tail(&ctx->components, &e->list);
    ctx->num_components++;
    return e;
}

static void entry_reject(xfer_component_entry_t *e, xfer_log_level_t level, const char *fmt,
                         ...) __attribute__((format(printf, 3, 4)));

static void entry_reject(xfer_component_entry_t *e, xfer_log_level_t level, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(e->reason, sizeof(e->reason), fmt, ap);
    va_end(ap);
    e->state = XFER_COMPONENT_FAILED;
    e->comp  = NULL;
    if (e->dl_handle != NULL) {
        dlclose(e->dl_handle);
        e->dl_handle = NULL;
    }
    xfer_log(level, LOADER_SUBSYS, "skipping %s: %s", e->path, e->reason);
}

/* Is the file an ELF object? Lets us say "not a shared object" instead of a dlerror puzzle. */
static int file_is_elf(const char *path, char *why, size_t why_size)
{
    unsigned char magic[4];
    ssize_t n;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        xfer_reason_set(why, why_size, "cannot open: %s", strerror(errno));
        return 0;
    }
    n = read(fd, magic, sizeof(magic));
    close(fd);
    if ((n != (ssize_t)sizeof(magic)) || (memcmp(magic, "\177ELF", 4) != 0)) {
        xfer_reason_set(why, why_size, "not a shared object (no ELF header)");
        return 0;
    }
    return 1;
}

/* Accept the entry symbol only if the plug-in itself defines it, not a library it pulls in. */
static int symbol_is_own(void *handle, const void *sym)
{
    struct link_map *lm = NULL;
    Dl_info info;

    if ((dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0) || (lm == NULL) ||
        (dladdr(sym, &info) == 0) || (info.dli_fname == NULL)) {
        return 0;
    }
    return strcmp(info.dli_fname, lm->l_name) == 0;
}

/* When v1 is missing, look for a neighbouring ABI version to explain the mismatch. */
static void explain_missing_symbol(xfer_component_entry_t *e)
{
    char sym[64];

    for (unsigned v = XFER_COMPONENT_ABI_NEWEST + 1; v < XFER_COMPONENT_ABI_NEWEST + 16; v++) {
        snprintf(sym, sizeof(sym), "xfer_component_v%u", v);
        if (dlsym(e->dl_handle, sym) != NULL) {
            entry_reject(e, XFER_LOG_WARN, "built for plug-in ABI v%u, newer than this "
                         "library's v%u (found %s, need %s); upgrade libxfer", v,
                         XFER_COMPONENT_ABI_NEWEST, sym, XFER_COMPONENT_SYMBOL_V1);
            return;
        }
    }
    for (unsigned v = 0; v < XFER_COMPONENT_ABI_OLDEST; v++) {
        snprintf(sym, sizeof(sym), "xfer_component_v%u", v);
        if (dlsym(e->dl_handle, sym) != NULL) {
            entry_reject(e, XFER_LOG_WARN, "built for plug-in ABI v%u, older than the oldest "
                         "this library supports (v%u); rebuild the component", v,
                         XFER_COMPONENT_ABI_OLDEST);
            return;
        }
    }
    entry_reject(e, XFER_LOG_WARN, "missing entry symbol %s (not an xfer component?)",
                 XFER_COMPONENT_SYMBOL_V1);
}

static xfer_component_entry_t *find_loaded(const xfer_context_t *ctx, const char *name)
{
    xfer_component_entry_t *e;

    ucs_list_for_each(e, &ctx->components, list) {
        if ((e->comp != NULL) && (strcmp(e->name, name) == 0)) {
            return e;
        }
    }
    return NULL;
}

xfer_component_entry_t *xfer_loader_find(const xfer_context_t *ctx, const char *name)
{
    xfer_component_entry_t *e = find_loaded(ctx, name);

    if (e != NULL) {
        return e;
    }
    /* A component that failed to load is known only by its file name. */
    ucs_list_for_each(e, &ctx->components, list) {
        if (strcmp(e->name, name) == 0) {
            return e;
        }
    }
    return NULL;
}

static void load_one(xfer_context_t *ctx, const char *path, const char *origin, char **errors_p)
{
    const xfer_component_v1_t *comp;
    xfer_component_entry_t *e, *winner;
    char why[XFER_REASON_MAX];
    xfer_status_t status;

    e = entry_new(ctx, path, origin);
    if (e == NULL) {
        xfer_log(XFER_LOG_ERROR, LOADER_SUBSYS, "out of memory recording %s", path);
        return;
    }

    if (!file_is_elf(path, why, sizeof(why))) {
        entry_reject(e, XFER_LOG_WARN, "%s", why);
        return;
    }
    dlerror();
    e->dl_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (e->dl_handle == NULL) {
        const char *err = dlerror();
        entry_reject(e, XFER_LOG_WARN, "dlopen failed: %s", err ? err : "unknown error");
        return;
    }

    comp = dlsym(e->dl_handle, XFER_COMPONENT_SYMBOL_V1);
    if (comp == NULL) {
        explain_missing_symbol(e);
        return;
    }
    if (!symbol_is_own(e->dl_handle, comp)) {
        entry_reject(e, XFER_LOG_WARN, "%s is not defined in this file (it comes from a "
                     "library it depends on)", XFER_COMPONENT_SYMBOL_V1);
        return;
    }
    if (comp->abi_version != XFER_COMPONENT_ABI_V1) {
        entry_reject(e, XFER_LOG_WARN, "%s declares ABI version %u, expected %u (corrupt or "
                     "mis-built component)", XFER_COMPONENT_SYMBOL_V1, comp->abi_version,
                     XFER_COMPONENT_ABI_V1);
        return;
    }
    /* Smaller is a build from before the optional fields at the end were added (they read
     * as absent); larger is a newer header whose fields this library cannot honour. */
    if ((comp->size < XFER_COMPONENT_V1_SIZE_MIN) || (comp->size > sizeof(xfer_component_v1_t))) {
        entry_reject(e, XFER_LOG_WARN, "component struct is %u bytes, this library's ABI v%u "
                     "struct is %zu bytes, or %zu from a header before iface_reachable (built "
                     "against a different xfer/component.h)", comp->size,
                     XFER_COMPONENT_ABI_V1, sizeof(xfer_component_v1_t),
                     (size_t)XFER_COMPONENT_V1_SIZE_MIN);
        return;
    }
    if (comp->size < sizeof(xfer_component_v1_t)) {
        xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "%s: component struct of %u bytes, built "
                 "before iface_reachable: every peer counts as reachable", path, comp->size);
    }
    if ((comp->name == NULL) ||
        !xfer_name_is_valid(comp->name, strlen(comp->name), XFER_NAME_MAX - 1) ||
        (comp->version == NULL) || (comp->description == NULL) || (comp->query == NULL)) {
        entry_reject(e, XFER_LOG_WARN, "component struct is incomplete (name must be [a-z0-9_]"
                     " and shorter than %d; version, description and query are required)",
                     XFER_NAME_MAX);
        return;
    }

    winner = find_loaded(ctx, comp->name);
    if (winner != NULL) {
        free(e->name);
        e->name = strdup(comp->name);
        entry_reject(e, XFER_LOG_WARN, "duplicate component '%s': %s wins, found first (in "
                     "%s, searched before %s)", comp->name, winner->path, winner->origin,
                     origin);
        return;
    }
    if (strcmp(e->name, comp->name) != 0) {
        xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "%s holds component '%s'", path, comp->name);
        free(e->name);
        e->name = strdup(comp->name);
    }

    e->comp  = comp;
    e->stats = dlsym(e->dl_handle, XFER_COMPONENT_STATS_SYMBOL_V1);
    if ((e->stats != NULL) && (!symbol_is_own(e->dl_handle, e->stats) ||
                               (e->stats->size < sizeof(xfer_component_stats_v1_t)) ||
                               (e->stats->ep_counters == NULL))) {
        xfer_log(XFER_LOG_WARN, LOADER_SUBSYS, "%s: ignoring its %s (not its own, too small or "
                 "incomplete)", path, XFER_COMPONENT_STATS_SYMBOL_V1);
        e->stats = NULL;
    }
    status  = xfer_param_set_init(&e->params, comp->name, comp->params, comp->config_size,
                                  errors_p, why, sizeof(why));
    if (status != XFER_OK) {
        entry_reject(e, XFER_LOG_WARN, "parameter table rejected: %s",
                     (status == XFER_ERR_NO_MEMORY) ? xfer_status_string(status) : why);
        return;
    }

    memset(&e->attr, 0, sizeof(e->attr));
    status = comp->query(e->params.config, &e->attr);
    e->attr.reason[sizeof(e->attr.reason) - 1] = '\0';
    if (e->attr.num_devices > XFER_DEVICE_MAX) {
        e->attr.num_devices = XFER_DEVICE_MAX;
    }
    if (status != XFER_OK) {
        xfer_param_set_cleanup(&e->params);
        entry_reject(e, XFER_LOG_WARN, "query failed: %s%s%s", xfer_status_string(status),
                     e->attr.reason[0] ? ": " : "", e->attr.reason);
        return;
    }
    if (e->attr.available) {
        e->state = XFER_COMPONENT_AVAILABLE;
        xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "loaded %s from %s: available", comp->name,
                 path);
    } else {
        e->state = XFER_COMPONENT_UNAVAILABLE;
        snprintf(e->reason, sizeof(e->reason), "%s",
                 e->attr.reason[0] ? e->attr.reason : "the component gave no reason");
        xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "loaded %s from %s: unavailable: %s",
                 comp->name, path, e->reason);
    }
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const*)a, *(char *const*)b);
}

/* Load path unless the same file (a directory listed twice, a symlink) was seen already. */
static void consider_file(xfer_context_t *ctx, const char *path, const char *origin,
                          char **errors_p, char ***seen_p, size_t *num_seen_p)
{
    char real[PATH_MAX];
    char **grown;

    if (realpath(path, real) == NULL) {
        snprintf(real, sizeof(real), "%s", path);
    }
    for (size_t j = 0; j < *num_seen_p; j++) {
        if (strcmp((*seen_p)[j], real) == 0) {
            xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "%s was already considered", path);
            return;
        }
    }
    grown = realloc(*seen_p, (*num_seen_p + 1) * sizeof(char*));
    if (grown != NULL) {
        *seen_p                    = grown;
        (*seen_p)[(*num_seen_p)++] = strdup(real);
    }
    load_one(ctx, path, origin, errors_p);
}

/* Load every xfer_*.so in dir, in name order so that results do not depend on readdir. */
static void scan_dir(xfer_context_t *ctx, const char *dir, const char *origin, char **errors_p,
                     char ***seen_p, size_t *num_seen_p)
{
    struct dirent *de;
    char **files = NULL;
    size_t num = 0;
    DIR *d;

    d = opendir(dir);
    if (d == NULL) {
        xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "not searching %s (%s): %s", dir, origin,
                 strerror(errno));
        return;
    }
    while ((de = readdir(d)) != NULL) {
        char **grown;
        char *name = name_from_file(de->d_name);
        if (name == NULL) {
            continue;
        }
        free(name);
        grown = realloc(files, (num + 1) * sizeof(*files));
        if (grown == NULL) {
            break;
        }
        files        = grown;
        files[num++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(files, num, sizeof(*files), compare_names);

    for (size_t i = 0; i < num; i++) {
        char path[PATH_MAX];

        if (files[i] == NULL) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        free(files[i]);
        consider_file(ctx, path, origin, errors_p, seen_p, num_seen_p);
    }
    free(files);
}

/* The directory of the libxfer.so that is running, found from one of its own symbols. */
static char *own_library_dir(void)
{
    Dl_info info;
    char real[PATH_MAX], *slash;

    if ((dladdr((void*)xfer_loader_load, &info) == 0) || (info.dli_fname == NULL) ||
        (realpath(info.dli_fname, real) == NULL)) {
        return NULL;
    }
    slash = strrchr(real, '/');
    if (slash == NULL) {
        return NULL;
    }
    *slash = '\0';
    return strdup(real);
}

static int add_dir(search_dir_t *dirs, size_t *num, size_t max, const char *path,
                   const char *origin)
{
    if ((*num >= max) || (path == NULL) || (*path == '\0')) {
        return 0;
    }
    for (size_t i = 0; i < *num; i++) {
        if (strcmp(dirs[i].path, path) == 0) {
            return 0;   /* the configured install dir is often the one next to libxfer.so */
        }
    }
    dirs[*num].path   = strdup(path);
    dirs[*num].origin = origin;
    if (dirs[*num].path == NULL) {
        return 0;
    }
    (*num)++;
    return 1;
}

xfer_status_t xfer_loader_load(xfer_context_t *ctx)
{
    static const char *const build_components[] = {"tcp", "shm", "verbs", "gdr"};
    search_dir_t dirs[64];
    size_t num_dirs = 0, num_seen = 0;
    char **seen = NULL;
    char *libdir, *env_copy, *tok, *save = NULL;
    char path[PATH_MAX];
    size_t len = 0;
    FILE *f;

    /* 1. XFER_COMPONENT_PATH */
    if ((ctx->fw_config.component_path != NULL) && (*ctx->fw_config.component_path != '\0')) {
        env_copy = strdup(ctx->fw_config.component_path);
        if (env_copy == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        for (tok = strtok_r(env_copy, ":", &save); tok != NULL;
             tok = strtok_r(NULL, ":", &save)) {
            add_dir(dirs, &num_dirs, 48, tok, origin_env);
        }
        free(env_copy);
    }

    /* 2. the install directory, or 3. the build tree when running uninstalled */
    libdir = own_library_dir();
    if ((libdir != NULL) && (strcmp(libdir, XFER_BUILD_DIR "/framework/.libs") == 0)) {
        for (size_t i = 0; i < sizeof(build_components) / sizeof(build_components[0]); i++) {
            snprintf(path, sizeof(path), "%s/components/%s/.libs", XFER_BUILD_DIR,
                     build_components[i]);
            add_dir(dirs, &num_dirs, 64, path, origin_build);
        }
    } else {
        if (libdir != NULL) {
            snprintf(path, sizeof(path), "%s/xfer", libdir);
            add_dir(dirs, &num_dirs, 64, path, origin_install);
        }
        add_dir(dirs, &num_dirs, 64, XFER_COMPONENT_DIR, origin_install);
    }
    free(libdir);

    f = open_memstream(&ctx->search_path, &len);
    for (size_t i = 0; i < num_dirs; i++) {
        if (f != NULL) {
            fprintf(f, "%s%s", i ? ":" : "", dirs[i].path);
        }
        xfer_log(XFER_LOG_DEBUG, LOADER_SUBSYS, "search %s (%s)", dirs[i].path, dirs[i].origin);
    }
    if (f != NULL) {
        fclose(f);
    }

    for (size_t i = 0; i < num_dirs; i++) {
        struct stat st;
        const char *base;

        /* An XFER_COMPONENT_PATH entry may name a component file directly. */
        if ((stat(dirs[i].path, &st) == 0) && S_ISREG(st.st_mode)) {
            base = strrchr(dirs[i].path, '/');
            char *name = name_from_file(base ? base + 1 : dirs[i].path);
            if (name != NULL) {
                free(name);
                consider_file(ctx, dirs[i].path, dirs[i].origin, &ctx->env_error, &seen,
                              &num_seen);
            } else {
                xfer_log(XFER_LOG_WARN, LOADER_SUBSYS, "%s in %s is not named xfer_<name>.so; "
                         "ignored", dirs[i].path, dirs[i].origin);
            }
        } else {
            scan_dir(ctx, dirs[i].path, dirs[i].origin, &ctx->env_error, &seen, &num_seen);
        }
        free(dirs[i].path);
    }
    for (size_t i = 0; i < num_seen; i++) {
        free(seen[i]);
    }
    free(seen);
    return XFER_OK;
}

void xfer_loader_unload(xfer_context_t *ctx)
{
    xfer_component_entry_t *e, *tmp;

    ucs_list_for_each_safe(e, tmp, &ctx->components, list) {
        ucs_list_del(&e->list);
        xfer_param_set_cleanup(&e->params);
        if (e->dl_handle != NULL) {
            dlclose(e->dl_handle);
        }
        free(e->name);
        free(e->path);
        free(e);
    }
    ctx->num_components = 0;
    free(ctx->search_path);
    ctx->search_path = NULL;
}
