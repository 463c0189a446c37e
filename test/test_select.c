/*
 * Selection and environment tests: XFER_TRANSPORTS grammar (include order, '^', duplicates,
 * empty lists and elements, whitespace, unknown and unavailable names), ranking by capability
 * then estimate, typed per-component parameters and the unknown-variable warning. The
 * candidates are the test plug-ins talpha and tbeta, whose capabilities and estimates are set
 * through their own XFER_TALPHA_* / XFER_TBETA_* parameters.
 */
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static void setup(void)
{
    dir = tu_plugin_dir((const char *[]){"talpha", "tbeta", "tgood", "tfail", NULL});
    setenv("XFER_COMPONENT_PATH", dir, 1);
    unsetenv("XFER_TRANSPORTS");
    /* rank the test plug-ins among themselves: the real tcp and shm (which outrank them all)
     * are made unavailable the way a user would, by naming an interface that does not exist
     * and a ring cell that is not a whole number of cache lines */
    setenv("XFER_TCP_IFACE", "nosuchif0", 1);
    setenv("XFER_SHM_CELL_SIZE", "300", 1);
}

static void teardown(void)
{
    tu_dir_remove(dir);
    dir = NULL;
}

static const xfer_select_req_t host_req = {
    XFER_CAP_MEM_HOST, XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG | XFER_CAP_TENSOR
};

/* Create a context under the current environment and select for req. */
static xfer_context_t *select_with(const char *transports, const xfer_select_req_t *req,
                                   xfer_selection_t *sel)
{
    xfer_context_t *ctx = NULL;
    xfer_status_t status;

    if (transports != NULL) {
        setenv("XFER_TRANSPORTS", transports, 1);
    }
    status = tu_context(0, &ctx);
    cr_assert_eq(status, XFER_OK, "XFER_TRANSPORTS='%s': %s", transports ? transports : "",
                 xfer_status_string(status));
    cr_assert_eq(xfer_select(ctx, req, sel), XFER_OK);
    return ctx;
}

/* The environment must be rejected with a message containing each of the parts. */
static void expect_env_error(const char *part1, const char *part2)
{
    xfer_context_t *ctx = NULL;
    const char *err;

    cr_expect_eq(tu_context(0, &ctx), XFER_ERR_INVALID_PARAM);
    cr_expect_null(ctx);
    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    err = xfer_context_env_error(ctx);
    cr_assert_not_null(err, "no error recorded");
    cr_expect(strstr(err, part1) != NULL, "'%s' lacks '%s'", err, part1);
    if (part2 != NULL) {
        cr_expect(strstr(err, part2) != NULL, "'%s' lacks '%s'", err, part2);
    }
    xfer_context_destroy(ctx);
}

TestSuite(select, .init = setup, .fini = teardown);

Test(select, bandwidth_breaks_ties)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TBETA_BANDWIDTH", "500", 1);
    ctx = select_with(NULL, &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "tbeta");
    cr_expect_eq(tu_select_entry(&sel, "talpha")->rank, 1);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);

    setenv("XFER_TALPHA_BANDWIDTH", "900", 1);
    ctx = select_with(NULL, &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha");
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, latency_breaks_bandwidth_ties)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TALPHA_LATENCY", "5us", 1);
    setenv("XFER_TBETA_LATENCY", "2us", 1);
    ctx = select_with(NULL, &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "tbeta");
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

/* RDMA-class latency (kernel bypass) beats a larger bandwidth estimate of a socket path. */
Test(select, kernel_bypass_outranks_bandwidth)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TALPHA_LATENCY", "2us", 1);
    setenv("XFER_TALPHA_BANDWIDTH", "100", 1);
    setenv("XFER_TBETA_BANDWIDTH", "900", 1);
    ctx = select_with(NULL, &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha");
    cr_expect_eq(tu_select_entry(&sel, "tbeta")->rank, 1);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, capability_outranks_estimate)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TALPHA_CAPS", "PUT,GET,TAG,MEM_HOST", 1);
    setenv("XFER_TBETA_BANDWIDTH", "100000", 1);
    ctx = select_with(NULL, &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha");
    cr_expect(strstr(tu_select_entry(&sel, "talpha")->reason, "PUT|GET|TAG|MEM_HOST") != NULL);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, required_capability_missing_is_explained)
{
    xfer_select_req_t cuda = {XFER_CAP_MEM_CUDA, 0};
    const xfer_select_entry_t *e;
    xfer_selection_t sel;
    xfer_context_t *ctx;

    ctx = select_with(NULL, &cuda, &sel);
    cr_expect_null(tu_selected(&sel));
    e = tu_select_entry(&sel, "talpha");
    cr_assert_not_null(e);
    cr_expect_eq(e->rank, -1);
    cr_expect_str_eq(e->reason, "lacks capabilities: Supported: PUT|MEM_HOST / Requested: MEM_CUDA");
    /* a component that failed to load is listed with the loader's reason */
    e = tu_select_entry(&sel, "tfail");
    cr_assert_not_null(e);
    cr_expect(strstr(e->reason, "failed to load:") != NULL, "%s", e->reason);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, include_list_sets_order_and_restricts)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TBETA_BANDWIDTH", "500", 1);
    ctx = select_with("talpha,tbeta", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha", "user order beats the estimate");
    cr_expect_eq(tu_select_entry(&sel, "tbeta")->rank, 1);
    cr_expect_eq(tu_select_entry(&sel, "tgood")->rank, -1);
    cr_expect(strstr(tu_select_entry(&sel, "tgood")->reason, "not listed in XFER_TRANSPORTS") !=
              NULL);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);

    ctx = select_with("tbeta,talpha", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "tbeta");
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);

    ctx = select_with("talpha", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha");
    cr_expect_eq(tu_select_entry(&sel, "tbeta")->rank, -1);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, exclude_list)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TBETA_BANDWIDTH", "500", 1);
    ctx = select_with("^tbeta,tgood", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha");
    cr_expect_str_eq(tu_select_entry(&sel, "tbeta")->reason,
                     "excluded by XFER_TRANSPORTS=^tbeta,tgood");
    cr_expect_eq(tu_select_entry(&sel, "tgood")->rank, -1);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, whitespace_duplicates_empty_and_all)
{
    static const char *const all_forms[] = {"", "   ", "all", " all "};
    xfer_selection_t sel;
    xfer_context_t *ctx;

    ctx = select_with("  tbeta ,\ttalpha  ", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "tbeta");
    cr_expect_eq(tu_select_entry(&sel, "talpha")->rank, 1);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);

    /* a duplicate keeps its first place */
    ctx = select_with("talpha,tbeta,talpha", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "talpha");
    cr_expect_eq(tu_select_entry(&sel, "tbeta")->rank, 1);
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);

    for (size_t i = 0; i < 4; i++) {
        ctx = select_with(all_forms[i], &host_req, &sel);
        cr_expect_eq(tu_select_entry(&sel, "talpha")->rank >= 0, 1, "'%s'", all_forms[i]);
        cr_expect_eq(tu_select_entry(&sel, "tbeta")->rank >= 0, 1, "'%s'", all_forms[i]);
        cr_expect_eq(tu_select_entry(&sel, "tgood")->rank >= 0, 1, "'%s'", all_forms[i]);
        xfer_selection_release(&sel);
        xfer_context_destroy(ctx);
    }
}

Test(select, malformed_lists)
{
    setenv("XFER_TRANSPORTS", "talpha,,tbeta", 1);
    expect_env_error("empty name at position 2", NULL);
    setenv("XFER_TRANSPORTS", "talpha,", 1);
    expect_env_error("empty name at position 2", NULL);
    setenv("XFER_TRANSPORTS", "^", 1);
    expect_env_error("'^' must be followed by", NULL);
    setenv("XFER_TRANSPORTS", "talpha,^tbeta", 1);
    expect_env_error("'^' negates the whole list and may only come first", NULL);
}

Test(select, unknown_name_suggests_closest)
{
    setenv("XFER_TRANSPORTS", "talhpa,tbeta", 1);
    expect_env_error("unknown transport 'talhpa'; did you mean 'talpha'?",
                     "shm, talpha, tbeta, tcp, tfail, tgood");
    setenv("XFER_TRANSPORTS", "^tpc", 1);
    expect_env_error("unknown transport 'tpc'; did you mean 'tcp'?", NULL);
    setenv("XFER_TRANSPORTS", "infiniband", 1);
    expect_env_error("unknown transport 'infiniband' (valid names:", NULL);
}

Test(select, unavailable_name_is_an_error_only_when_included)
{
    xfer_selection_t sel;
    xfer_context_t *ctx;

    setenv("XFER_TALPHA_AVAILABLE", "no", 1);
    setenv("XFER_TALPHA_REASON", "cable unplugged", 1);
    setenv("XFER_TRANSPORTS", "talpha,tbeta", 1);
    expect_env_error("transport 'talpha' is unavailable: cable unplugged", NULL);

    setenv("XFER_TRANSPORTS", "tfail", 1);
    expect_env_error("transport 'tfail' failed to load:", "simulated device probe failure");

    /* excluding an unavailable transport is fine, and no fallback is silent */
    ctx = select_with("^talpha", &host_req, &sel);
    cr_expect_str_eq(tu_selected(&sel), "tbeta");
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);

    /* with no list, an unavailable one is simply not selected, and says why */
    unsetenv("XFER_TRANSPORTS");
    ctx = select_with(NULL, &host_req, &sel);
    cr_expect_str_eq(tu_select_entry(&sel, "talpha")->reason, "unavailable: cable unplugged");
    xfer_selection_release(&sel);
    xfer_context_destroy(ctx);
}

Test(select, typed_parameters_reach_the_component)
{
    xfer_component_info_t info;
    xfer_context_t *ctx = NULL;
    xfer_param_info_t p;
    int found = 0;

    setenv("XFER_TGOOD_RATIO", "-5", 1);
    setenv("XFER_TGOOD_BUF", "1m", 1);
    setenv("XFER_TGOOD_LEVEL", "HIGH", 1);
    setenv("XFER_TGOOD_LATENCY", "250us", 1);
    setenv("XFER_TGOOD_BANDWIDTH", "0x10", 1);
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    cr_assert(tu_component(ctx, "tgood", NULL, &info));
    cr_expect_str_eq(tu_device_attr(&info, "ratio"), "-5");
    cr_expect_str_eq(tu_device_attr(&info, "buf"), "1048576");
    cr_expect_str_eq(tu_device_attr(&info, "level"), "high");
    cr_expect_str_eq(tu_device_attr(&info, "latency"), "0.00025");
    cr_expect_str_eq(tu_device_attr(&info, "bandwidth"), "16");
    for (size_t i = 0; i < xfer_param_count(ctx); i++) {
        cr_assert_eq(xfer_param_get(ctx, i, &p), XFER_OK);
        if (strcmp(p.env_name, "XFER_TGOOD_BUF") == 0) {
            found = 1;
            cr_expect_str_eq(p.value, "1m");
            cr_expect_str_eq(p.default_value, "64k");
            cr_expect_eq(p.source, XFER_PARAM_SOURCE_ENV);
            cr_expect_str_eq(p.type, "size");
            cr_expect_str_eq(p.range, "1024..1073741824");
            cr_expect_str_eq(p.component, "tgood");
        } else if (strcmp(p.env_name, "XFER_TGOOD_RATIO") != 0) {
            cr_expect((p.source == XFER_PARAM_SOURCE_DEFAULT) ||
                      (strncmp(p.env_name, "XFER_TGOOD_", 11) == 0) ||
                      (strcmp(p.env_name, "XFER_COMPONENT_PATH") == 0) ||
                      (strcmp(p.env_name, "XFER_TCP_IFACE") == 0) ||
                      (strcmp(p.env_name, "XFER_SHM_CELL_SIZE") == 0), "%s", p.env_name);
        }
    }
    cr_expect(found);
    xfer_context_destroy(ctx);
}

Test(select, bad_parameter_values_are_errors)
{
    static const struct {
        const char *var, *value, *why;
    } cases[] = {
        {"XFER_TGOOD_RATIO", "101", "XFER_TGOOD_RATIO='101': out of range (int -5..100"},
        {"XFER_TGOOD_RATIO", "-6", "out of range"},
        {"XFER_TGOOD_RATIO", "abc", "not an integer"},
        {"XFER_TGOOD_RATIO", "5x", "not an integer"},
        {"XFER_TGOOD_RATIO", "", "empty value"},
        {"XFER_TGOOD_RATIO", "99999999999999999999999", "not an integer"},
        {"XFER_TGOOD_BANDWIDTH", "-1", "not a non-negative integer"},
        {"XFER_TGOOD_BANDWIDTH", "0", "out of range"},
        {"XFER_TGOOD_BUF", "12q", "not a size"},
        {"XFER_TGOOD_BUF", "512", "out of range"},
        {"XFER_TGOOD_BUF", "auto", "not a size"},
        {"XFER_TGOOD_LEVEL", "max", "not one of the allowed values (enum low|mid|high"},
        {"XFER_TGOOD_AVAILABLE", "maybe", "not a boolean"},
        {"XFER_TGOOD_LATENCY", "fast", "not a time"},
        {"XFER_TGOOD_LATENCY", "11s", "out of range"},
        {"XFER_LOG_LEVEL", "loud", "XFER_LOG_LEVEL='loud': not one of the allowed values"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        xfer_component_info_t info;
        xfer_context_t *ctx = NULL;

        setenv(cases[i].var, cases[i].value, 1);
        expect_env_error(cases[i].why, NULL);
        /* inspect mode keeps the default so tools can still show the component */
        cr_assert_eq(tu_context(1, &ctx), XFER_OK);
        cr_assert(tu_component(ctx, "tgood", NULL, &info));
        cr_expect_str_eq(tu_device_attr(&info, "ratio"), "0", "%s", cases[i].var);
        xfer_context_destroy(ctx);
        unsetenv(cases[i].var);
    }
}

Test(select, unknown_variable_is_warned_with_suggestion, .init = cr_redirect_stderr)
{
    xfer_context_t *ctx = NULL;
    char *text;

    setenv("XFER_TGOOD_RATIOO", "3", 1);
    setenv("XFER_NONSENSE_THING", "1", 1);
    cr_assert_eq(tu_context(0, &ctx), XFER_OK, "an unknown variable is a warning, not an error");
    xfer_context_destroy(ctx);
    text = tu_read_redirected_stderr();
    cr_expect(strstr(text, "unknown environment variable XFER_TGOOD_RATIOO; did you mean "
                           "XFER_TGOOD_RATIO?") != NULL, "stderr: %s", text);
    cr_expect(strstr(text, "unknown environment variable XFER_NONSENSE_THING") != NULL,
              "stderr: %s", text);
    free(text);
}

Test(select, duplicate_in_list_is_warned, .init = cr_redirect_stderr)
{
    xfer_context_t *ctx = NULL;
    char *text;

    setenv("XFER_TRANSPORTS", "talpha,talpha", 1);
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    xfer_context_destroy(ctx);
    text = tu_read_redirected_stderr();
    cr_expect(strstr(text, "XFER_TRANSPORTS names 'talpha' twice") != NULL, "stderr: %s", text);
    free(text);
}
