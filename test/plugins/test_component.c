/*
 * A test component, compiled once per variant by Makefile.am into real xfer_<name>.so files
 * that the loader and selection tests dlopen. Each variant is broken in exactly one way (see
 * the TEST_* macros). Its capabilities and estimates come from its own parameters
 * (XFER_<NAME>_CAPS, ...) so selection can be exercised before the real transports have data
 * paths; it is a test double for ranking input only and moves no data. query() echoes every
 * parsed parameter back as a device attribute so tests can check the typed parsing end to end.
 * Its interface and endpoints exist only so that the bootstrap can negotiate it and connect an
 * endpoint (a fake transport is the only way to test negotiation between several transports
 * on a host that has just one real one); XFER_<NAME>_UNREACHABLE=y makes its iface refuse
 * every peer (iface_reachable), for the negotiation's skipping of unreachable transports.
 * Every data operation is absent, so the framework answers XFER_ERR_UNSUPPORTED.
 */
#include <xfer/component.h>

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef TEST_NAME
#error "TEST_NAME must be defined"
#endif
#ifndef TEST_SYMBOL
#define TEST_SYMBOL xfer_component_v1
#endif
#ifndef TEST_ABI_FIELD
#define TEST_ABI_FIELD XFER_COMPONENT_ABI_V1
#endif
#ifndef TEST_SIZE_DELTA
#define TEST_SIZE_DELTA 0
#endif

typedef struct test_config {
    int      available;
    char     *caps;
    uint64_t bandwidth;
    double   latency;
    int64_t  ratio;
    uint64_t buf;
    int      level;
    char     *reason;
    int      unreachable;
} test_config_t;

static const char *const levels[] = {"low", "mid", "high", NULL};

static const xfer_param_desc_t test_params[] = {
    {"AVAILABLE", XFER_PARAM_BOOL, "y", "Report the component as available.",
     offsetof(test_config_t, available), 0, 0, NULL},
    {"CAPS", XFER_PARAM_STRING, "PUT,MEM_HOST", "Capability names to report, comma-separated.",
     offsetof(test_config_t, caps), 0, 0, NULL},
    {"BANDWIDTH", XFER_PARAM_UINT, "100", "Bandwidth estimate, MB/s.",
     offsetof(test_config_t, bandwidth), 1, 1e9, NULL},
#ifdef TEST_BAD_DEFAULT
    {"LATENCY", XFER_PARAM_TIME, "soon", "A default that does not parse.",
     offsetof(test_config_t, latency), 0, 0, NULL},
#else
    {"LATENCY", XFER_PARAM_TIME, "10us", "Latency estimate.",
     offsetof(test_config_t, latency), 0, 10, NULL},
#endif
    {"RATIO", XFER_PARAM_INT, "0", "A signed integer with a range.",
     offsetof(test_config_t, ratio), -5, 100, NULL},
    {"BUF", XFER_PARAM_SIZE, "64k", "A size with a range.",
     offsetof(test_config_t, buf), 1024, 1 << 30, NULL},
    {"LEVEL", XFER_PARAM_ENUM, "mid", "An enumeration.",
     offsetof(test_config_t, level), 0, 0, levels},
    {"REASON", XFER_PARAM_STRING, "disabled by XFER_" TEST_NAME "_AVAILABLE",
     "Reason given when not available.", offsetof(test_config_t, reason), 0, 0, NULL},
    {"UNREACHABLE", XFER_PARAM_BOOL, "n", "Say that no peer is reachable (iface_reachable).",
     offsetof(test_config_t, unreachable), 0, 0, NULL},
    {NULL}
};

#ifdef TEST_UNDEFINED
/* Defined nowhere: dlopen(RTLD_NOW) must fail with "undefined symbol". */
extern int xfer_test_symbol_that_does_not_exist(void);
#endif

static uint64_t parse_caps(const char *list)
{
    static const char *const names[] = {"PUT", "GET", "TAG", "TENSOR", "MEM_HOST", "MEM_CUDA",
                                        "INTER_HOST"};
    uint64_t caps = 0;

    for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *p = strstr(list, names[i]);
        size_t n      = strlen(names[i]);
        /* whole words only: "PUT" must not match inside "INPUT" */
        if ((p != NULL) && ((p == list) || (p[-1] == ',')) && ((p[n] == '\0') || (p[n] == ','))) {
            caps |= 1ull << i;
        }
    }
    return caps;
}

static xfer_status_t test_query(const void *config, xfer_component_attr_t *attr)
{
    const test_config_t *cfg = config;
    xfer_device_attr_t *dev  = &attr->devices[0];

#ifdef TEST_UNDEFINED
    if (xfer_test_symbol_that_does_not_exist()) {
        return XFER_ERR_INTERNAL;
    }
#endif
#ifdef TEST_QUERY_FAILS
    xfer_reason_set(attr->reason, sizeof(attr->reason), "simulated device probe failure");
    return XFER_ERR_IO;
#endif
    attr->num_devices = 1;
    snprintf(dev->name, sizeof(dev->name), "cfg");
    snprintf(dev->kind, sizeof(dev->kind), "test");
    dev->numa_node = -1;
    xfer_device_attr_add(dev, "available", "%d", cfg->available);
    xfer_device_attr_add(dev, "bandwidth", "%llu", (unsigned long long)cfg->bandwidth);
    xfer_device_attr_add(dev, "latency", "%g", cfg->latency);
    xfer_device_attr_add(dev, "ratio", "%lld", (long long)cfg->ratio);
    xfer_device_attr_add(dev, "buf", "%llu", (unsigned long long)cfg->buf);
    xfer_device_attr_add(dev, "level", "%s", levels[cfg->level]);

    attr->available = cfg->available;
    if (!cfg->available) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "%s", cfg->reason);
        return XFER_OK;
    }
    attr->caps          = parse_caps(cfg->caps);
    attr->bandwidth_mbs = (double)cfg->bandwidth;
    attr->latency_us    = cfg->latency * 1e6;
    return XFER_OK;
}

/* Negotiation-only iface and endpoints: allocated so leaks show, no data path. The iface
 * is its config, for iface_reachable. */
struct xfer_iface {
    const test_config_t *cfg;
};

static xfer_status_t test_iface_open(const void *config, const xfer_iface_params_t *params,
                                     xfer_iface_h *iface_p)
{
    (void)params;
    *iface_p = malloc(sizeof(**iface_p));
    if (*iface_p == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    (*iface_p)->cfg = config;
    return XFER_OK;
}

static void test_iface_close(xfer_iface_h iface)
{
    free(iface);
}

static xfer_status_t test_iface_address(xfer_iface_h iface, void *buf, size_t *len_p)
{
    (void)iface;
    if (*len_p < sizeof(TEST_NAME)) {
        return XFER_ERR_NO_RESOURCE;
    }
    memcpy(buf, TEST_NAME, sizeof(TEST_NAME));
    *len_p = sizeof(TEST_NAME);
    return XFER_OK;
}

static int test_iface_reachable(xfer_iface_h iface, const void *peer_iface_addr,
                                size_t addr_len, char *why, size_t why_size)
{
    char upper[sizeof(TEST_NAME)];

    (void)peer_iface_addr;
    (void)addr_len;
    if (!iface->cfg->unreachable) {
        return 1;
    }
    for (size_t i = 0; i < sizeof(upper); i++) {
        upper[i] = (char)toupper((unsigned char)TEST_NAME[i]);
    }
    snprintf(why, why_size, "refused by XFER_%s_UNREACHABLE", upper);
    return 0;
}

static xfer_status_t test_ep_create(xfer_iface_h iface, const xfer_ep_params_t *params,
                                    xfer_ep_h *ep_p)
{
    (void)iface;
    /* the peer's HELLO must have carried our address */
    if ((params->peer_iface_addr_len != sizeof(TEST_NAME)) ||
        (memcmp(params->peer_iface_addr, TEST_NAME, sizeof(TEST_NAME)) != 0)) {
        return XFER_ERR_PROTOCOL;
    }
    *ep_p = malloc(1);
    return (*ep_p != NULL) ? XFER_OK : XFER_ERR_NO_MEMORY;
}

static void test_ep_destroy(xfer_ep_h ep)
{
    free(ep);
}

static unsigned test_progress(xfer_iface_h iface)
{
    (void)iface;
    return 0;
}

XFER_COMPONENT_EXPORT const xfer_component_v1_t TEST_SYMBOL = {
    .abi_version = TEST_ABI_FIELD,
    .size        = sizeof(xfer_component_v1_t) + TEST_SIZE_DELTA,
    .name        = TEST_NAME,
    .version     = "9.9.9",
    .description = "test component " TEST_NAME,
    .params      = test_params,
    .config_size = sizeof(test_config_t),
    .query       = test_query,
    .iface_open    = test_iface_open,
    .iface_close   = test_iface_close,
    .iface_address = test_iface_address,
    .ep_create     = test_ep_create,
    .ep_destroy    = test_ep_destroy,
    .progress      = test_progress,
    .iface_reachable = test_iface_reachable,
};
