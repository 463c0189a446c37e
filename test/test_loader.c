/*
 * Loader tests: real shared objects built by the test suite (test/plugins/), each broken in
 * one way, put in a temporary XFER_COMPONENT_PATH. Every bad candidate must be recorded with
 * a precise reason while the good ones (and the built-in components) keep working.
 */
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static void teardown(void)
{
    if (dir != NULL) {
        tu_dir_remove(dir);
        dir = NULL;
    }
}

/* Put the plug-ins in a fresh XFER_COMPONENT_PATH and create an inspect-mode context. */
static xfer_context_t *load(const char *const *plugins)
{
    xfer_context_t *ctx = NULL;

    dir = tu_plugin_dir(plugins);
    setenv("XFER_COMPONENT_PATH", dir, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    return ctx;
}

static void expect_failed(const xfer_context_t *ctx, const char *name, const char *reason_part)
{
    xfer_component_info_t info;

    cr_assert(tu_component(ctx, name, dir, &info), "%s was not recorded at all", name);
    cr_expect_eq(info.state, XFER_COMPONENT_FAILED, "%s: state %d", name, info.state);
    cr_expect_null(info.attr);
    cr_expect(strstr(info.reason, reason_part) != NULL, "%s: reason '%s' lacks '%s'", name,
              info.reason, reason_part);
    /* a broken candidate never takes the rest down */
    cr_expect(tu_component(ctx, "tcp", NULL, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE, "tcp stopped working: %s", info.reason);
}

TestSuite(loader, .fini = teardown);

Test(loader, good_component_loads_with_defaults)
{
    xfer_context_t *ctx = load((const char *[]){"tgood", NULL});
    xfer_component_info_t info;

    cr_assert(tu_component(ctx, "tgood", dir, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    cr_expect_str_eq(info.version, "9.9.9");
    cr_expect_str_eq(info.origin, "XFER_COMPONENT_PATH");
    cr_expect_str_eq(info.description, "test component tgood");
    cr_assert_not_null(info.attr);
    cr_expect_eq(info.attr->caps, XFER_CAP_PUT | XFER_CAP_MEM_HOST);
    cr_expect_str_eq(tu_device_attr(&info, "ratio"), "0");
    cr_expect_str_eq(tu_device_attr(&info, "buf"), "65536");
    cr_expect_str_eq(tu_device_attr(&info, "level"), "mid");
    cr_expect_null(xfer_context_env_error(ctx));
    /* XFER_COMPONENT_PATH is searched first */
    cr_expect(strncmp(xfer_component_search_path(ctx), dir, strlen(dir)) == 0,
              "search path %s does not start with %s", xfer_component_search_path(ctx), dir);
    xfer_context_destroy(ctx);
}

Test(loader, builtin_components_are_found_in_build_tree)
{
    xfer_context_t *ctx = NULL;
    xfer_component_info_t info;

    unsetenv("XFER_COMPONENT_PATH");
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    cr_assert(tu_component(ctx, "tcp", NULL, &info));
    cr_expect_str_eq(info.origin, "build tree");
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    cr_expect_gt(info.attr->num_devices, 0, "tcp reports no interfaces (not even lo)");
    xfer_context_destroy(ctx);
}

Test(loader, abi_too_new)
{
    xfer_context_t *ctx = load((const char *[]){"tabinew", NULL});
    expect_failed(ctx, "tabinew", "built for plug-in ABI v2, newer than this library's v1");
    xfer_context_destroy(ctx);
}

Test(loader, abi_too_old)
{
    xfer_context_t *ctx = load((const char *[]){"tabiold", NULL});
    expect_failed(ctx, "tabiold", "built for plug-in ABI v0, older than the oldest");
    xfer_context_destroy(ctx);
}

Test(loader, abi_field_disagrees_with_symbol)
{
    xfer_context_t *ctx = load((const char *[]){"tabifield", NULL});
    expect_failed(ctx, "tabifield", "declares ABI version 7, expected 1");
    xfer_context_destroy(ctx);
}

Test(loader, struct_size_mismatch)
{
    char want[64];
    xfer_context_t *ctx = load((const char *[]){"tsize", NULL});

    snprintf(want, sizeof(want), "component struct is %zu bytes",
             sizeof(xfer_component_v1_t) + 8);
    expect_failed(ctx, "tsize", want);
    xfer_context_destroy(ctx);
}

Test(loader, missing_entry_symbol)
{
    xfer_context_t *ctx = load((const char *[]){"tnosym", NULL});
    expect_failed(ctx, "tnosym", "missing entry symbol xfer_component_v1");
    xfer_context_destroy(ctx);
}

Test(loader, unresolved_symbol)
{
    xfer_context_t *ctx = load((const char *[]){"tundef", NULL});
    expect_failed(ctx, "tundef", "undefined symbol: xfer_test_symbol_that_does_not_exist");
    xfer_context_destroy(ctx);
}

Test(loader, not_an_elf_file)
{
    xfer_context_t *ctx;

    dir = tu_plugin_dir(NULL);
    tu_write_file(dir, "xfer_junk.so", "this is not a library\n", 22);
    setenv("XFER_COMPONENT_PATH", dir, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    expect_failed(ctx, "junk", "not a shared object");
    xfer_context_destroy(ctx);
}

Test(loader, truncated_elf_file)
{
    static const char elf[] = "\177ELF\2\1\1\0garbage";
    xfer_context_t *ctx;

    dir = tu_plugin_dir(NULL);
    tu_write_file(dir, "xfer_trunc.so", elf, sizeof(elf));
    setenv("XFER_COMPONENT_PATH", dir, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    expect_failed(ctx, "trunc", "dlopen failed:");
    xfer_context_destroy(ctx);
}

Test(loader, empty_file)
{
    xfer_context_t *ctx;

    dir = tu_plugin_dir(NULL);
    tu_write_file(dir, "xfer_empty.so", "", 0);
    setenv("XFER_COMPONENT_PATH", dir, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    expect_failed(ctx, "empty", "not a shared object");
    xfer_context_destroy(ctx);
}

Test(loader, failing_query)
{
    xfer_context_t *ctx = load((const char *[]){"tfail", NULL});
    expect_failed(ctx, "tfail", "query failed: input/output error: simulated device probe failure");
    xfer_context_destroy(ctx);
}

Test(loader, bad_parameter_table_is_the_components_fault_not_the_users)
{
    xfer_context_t *ctx = NULL;

    dir = tu_plugin_dir((const char *[]){"tbadtable", NULL});
    setenv("XFER_COMPONENT_PATH", dir, 1);
    /* strict mode: a broken component must not make the environment invalid */
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    expect_failed(ctx, "tbadtable", "built-in default 'soon' is invalid");
    cr_expect_null(xfer_context_env_error(ctx));
    xfer_context_destroy(ctx);
}

Test(loader, duplicate_name_first_in_path_wins)
{
    xfer_context_t *ctx;
    xfer_component_info_t info;
    char *dir_b, path[2100], want[1200];

    /* dir holds xfer_tgood.so, dir_b holds xfer_tdup.so, which also calls itself "tgood" */
    dir   = tu_plugin_dir((const char *[]){"tgood", NULL});
    dir_b = tu_plugin_dir((const char *[]){"tdup", NULL});

    snprintf(path, sizeof(path), "%s:%s", dir, dir_b);
    setenv("XFER_COMPONENT_PATH", path, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    cr_assert(tu_component(ctx, "tgood", dir, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    cr_assert(tu_component(ctx, "tgood", dir_b, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_FAILED);
    snprintf(want, sizeof(want), "duplicate component 'tgood': %s/xfer_tgood.so wins, found "
             "first", dir);
    cr_expect(strstr(info.reason, want) != NULL, "reason: %s", info.reason);
    xfer_context_destroy(ctx);

    /* reverse the path: now the other file wins */
    snprintf(path, sizeof(path), "%s:%s", dir_b, dir);
    setenv("XFER_COMPONENT_PATH", path, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    cr_assert(tu_component(ctx, "tgood", dir_b, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    cr_assert(tu_component(ctx, "tgood", dir, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_FAILED);
    cr_expect(strstr(info.reason, "xfer_tdup.so wins") != NULL, "reason: %s", info.reason);
    xfer_context_destroy(ctx);
    tu_dir_remove(dir_b);
}

Test(loader, component_path_overrides_builtin)
{
    xfer_context_t *ctx;
    xfer_component_info_t info;
    char src[1024];

    /* a tcp built elsewhere, placed first in the path, shadows the build tree's */
    dir = tu_plugin_dir(NULL);
    snprintf(src, sizeof(src), "cp '%s/components/tcp/.libs/xfer_tcp.so' '%s/'",
             getenv("XFERTEST_BUILD_DIR"), dir);
    cr_assert_eq(system(src), 0);
    setenv("XFER_COMPONENT_PATH", dir, 1);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    cr_assert(tu_component(ctx, "tcp", dir, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    cr_assert(tu_component(ctx, "tcp", getenv("XFERTEST_BUILD_DIR"), &info));
    cr_expect_eq(info.state, XFER_COMPONENT_FAILED);
    cr_expect(strstr(info.reason, "duplicate component 'tcp'") != NULL, "%s", info.reason);
    cr_expect(strstr(info.reason, "in XFER_COMPONENT_PATH, searched before build tree") != NULL,
              "%s", info.reason);
    xfer_context_destroy(ctx);
}

Test(loader, everything_broken_at_once_still_leaves_the_good_ones)
{
    xfer_context_t *ctx;
    xfer_component_info_t info;
    size_t failed = 0;

    dir = tu_plugin_dir((const char *[]){"tgood", "tabinew", "tabiold", "tsize", "tnosym",
                                         "tundef", "tfail", "tbadtable", NULL});
    tu_write_file(dir, "xfer_junk.so", "junk", 4);
    setenv("XFER_COMPONENT_PATH", dir, 1);
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        cr_assert_eq(xfer_component_get(ctx, i, &info), XFER_OK);
        if (strstr(info.path, dir) != NULL) {
            failed += (info.state == XFER_COMPONENT_FAILED);
            cr_expect_gt(strlen(info.reason) + (info.state != XFER_COMPONENT_FAILED), 0,
                         "%s failed without a reason", info.path);
        }
    }
    cr_expect_eq(failed, 8);
    cr_expect(tu_component(ctx, "tgood", dir, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    xfer_context_destroy(ctx);
}

Test(loader, path_entries_files_duplicates_and_missing_dirs)
{
    xfer_context_t *ctx;
    xfer_component_info_t info;
    char path[4096];
    size_t seen = 0;

    dir = tu_plugin_dir((const char *[]){"tgood", "talpha", NULL});
    /* a missing directory, the same directory twice, and a file named directly */
    snprintf(path, sizeof(path), "/nonexistent/xfer:%s:%s:%s/xfer_talpha.so", dir, dir, dir);
    setenv("XFER_COMPONENT_PATH", path, 1);
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        cr_assert_eq(xfer_component_get(ctx, i, &info), XFER_OK);
        seen += (strstr(info.path, dir) != NULL);
    }
    cr_expect_eq(seen, 2, "each file must be considered once, saw %zu", seen);
    cr_expect(tu_component(ctx, "talpha", dir, &info));
    cr_expect_eq(info.state, XFER_COMPONENT_AVAILABLE);
    xfer_context_destroy(ctx);
}

Test(loader, context_params_are_checked)
{
    xfer_context_params_t params = {.size = 2};
    xfer_context_t *ctx          = NULL;

    cr_expect_eq(xfer_context_create(&params, &ctx), XFER_ERR_INVALID_PARAM);
    cr_expect_null(ctx);
    cr_expect_eq(xfer_context_create(NULL, NULL), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_component_get(NULL, 0, NULL), XFER_ERR_INVALID_PARAM);
    cr_expect_str_eq(xfer_status_string(XFER_ERR_ABI), "plug-in ABI mismatch");
    cr_expect_str_eq(xfer_status_string((xfer_status_t)12345), "unknown status");
}
