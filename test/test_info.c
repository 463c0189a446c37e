/*
 * xfer_info, run as a user would run it: text and JSON output, exit status, bad environment,
 * and a junk file in XFER_COMPONENT_PATH. JSON is checked with jq so that it is real JSON.
 */
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static void setup(void)
{
    unsetenv("XFER_COMPONENT_PATH");
    unsetenv("XFER_TRANSPORTS");
    dir = NULL;
}

static void teardown(void)
{
    if (dir != NULL) {
        tu_dir_remove(dir);
    }
}

/* Run "ENV xfer_info ARGS"; returns the exit status, output in *out_p. */
static int info(const char *env, const char *args, int merge_stderr, char **out_p)
{
    char cmd[4096];

    snprintf(cmd, sizeof(cmd), "env %s '%s' %s", env ? env : "", getenv("XFERTEST_INFO"),
             args ? args : "");
    return tu_run(cmd, merge_stderr, out_p);
}

/* Run xfer_info ARGS --json piped into jq -e FILTER; returns jq's exit status. */
static int info_jq(const char *env, const char *args, const char *filter)
{
    char cmd[4096], *out;
    int rc;

    snprintf(cmd, sizeof(cmd), "env %s '%s' %s --json | jq -e '%s' >/dev/null", env ? env : "",
             getenv("XFERTEST_INFO"), args ? args : "", filter);
    rc = tu_run(cmd, 1, &out);
    free(out);
    return rc;
}

#define expect_contains(_text, _part) \
    cr_expect(strstr((_text), (_part)) != NULL, "output lacks '%s':\n%s", (_part), (_text))

TestSuite(info, .init = setup, .fini = teardown);

Test(info, lists_components_with_status)
{
    char *out;

    cr_assert_eq(info(NULL, NULL, 0, &out), 0);
    expect_contains(out, "# Component: tcp ");
    expect_contains(out, "status:   available");
    expect_contains(out, "Device: lo (net)");
    if (!tu_host_has_rdma()) {
        expect_contains(out, "# Component: verbs");
        expect_contains(out, "status:   unavailable: no RDMA devices found");
    }
    /* xfer_info neither loads nor initialises CUDA; gdr finds GPUs in sysfs */
    expect_contains(out, "# CUDA driver: libcuda.so.1 not loaded");
    if (!tu_host_has_cuda_driver()) {
        expect_contains(out, "# Component: gdr");
        expect_contains(out, "unavailable: no NVIDIA GPU on the PCI bus (/sys/bus/pci/devices, "
                        "read without the CUDA driver)");
    }
    free(out);
}

Test(info, gdr_shows_each_gpus_nic_and_plan)
{
    char *out;

    cr_assert_eq(info(NULL, "-c", 0, &out), 0);
    if (strstr(out, "XFER_GDR_") == NULL) {
        free(out);
        cr_skip_test("the gdr component is not built here");
    }
    expect_contains(out, "type enum, range PIX|PXB|PHB|SYS, default 'PXB', from default\n"
                         "XFER_GDR_LEVEL=PXB\n");
    free(out);
    cr_assert_eq(info("XFER_GDR_LEVEL=phb", "-c", 0, &out), 0);
    expect_contains(out, "from environment\nXFER_GDR_LEVEL=phb\n");
    free(out);
    cr_expect_eq(info("XFER_GDR_LEVEL=NVL", NULL, 1, &out), 1);
    expect_contains(out, "XFER_GDR_LEVEL='NVL': not one of the allowed values");
    free(out);
    /* every GPU gdr finds says which NIC, how far, and how its memory would move (on a
     * host without a GPU there is none, and the reason above says so) */
    cr_expect_eq(info_jq(NULL, NULL, "[.components[] | select(.name==\"gdr\") | .devices[] | "
                         "select(.kind==\"gpu\") | .attributes | has(\"nic\") and "
                         "has(\"gdr_plan\") and has(\"topology\")] | all"), 0);
}

Test(info, misspelled_transport_fails_with_suggestion)
{
    char *out;

    cr_expect_eq(info("XFER_TRANSPORTS=^tpc", "-s", 1, &out), 1);
    expect_contains(out, "unknown transport 'tpc'; did you mean 'tcp'?");
    free(out);
}

Test(info, unavailable_transport_named_fails_with_reason)
{
    char *out;

    if (tu_host_has_rdma()) {
        cr_skip_test("this host has RDMA devices, so verbs may be available");
    }
    cr_expect_eq(info("XFER_TRANSPORTS=verbs,tcp", "-s", 1, &out), 1);
    expect_contains(out, "transport 'verbs' is unavailable: no RDMA devices found");
    free(out);
}

Test(info, junk_file_is_reported_and_the_rest_works)
{
    char env[1200], *out;

    dir = tu_plugin_dir(NULL);
    tu_write_file(dir, "xfer_junk.so", "#!/bin/sh\necho junk\n", 20);
    snprintf(env, sizeof(env), "XFER_COMPONENT_PATH=%s", dir);
    cr_assert_eq(info(env, NULL, 0, &out), 0);
    expect_contains(out, "# Component: junk");
    expect_contains(out, "failed to load: ");
    expect_contains(out, "/xfer_junk.so: not a shared object");
    expect_contains(out, "# Component: tcp ");
    expect_contains(out, "status:   available");
    free(out);
    cr_expect_eq(info_jq(env, NULL, ".components[] | select(.name==\"junk\") | "
                         ".status == \"failed to load\""), 0);
    cr_expect_eq(info_jq(env, NULL, ".components[] | select(.name==\"tcp\") | "
                         ".status == \"available\""), 0);
}

Test(info, config_lists_parameters_and_sources)
{
    char *out;

    cr_assert_eq(info("XFER_TCP_IFACE=lo", "-c", 0, &out), 0);
    expect_contains(out, "XFER_TCP_IFACE=lo\n");
    expect_contains(out, "type string, default '', from environment\nXFER_TCP_IFACE=lo");
    expect_contains(out, "from default\nXFER_LOG_LEVEL=warn");
    expect_contains(out, "XFER_VERBS_GID_INDEX=-1");
    expect_contains(out, "range -1..255");
    free(out);
    cr_expect_eq(info_jq("XFER_TCP_IFACE=lo", "-c", ".parameters[] | select(.name==\"XFER_TCP_IFACE\")"
                         " | .value == \"lo\" and .source == \"environment\" and .type == \"string\""),
                 0);
    cr_expect_eq(info_jq(NULL, "-c", "[.parameters[] | select(.name==\"XFER_TRANSPORTS\")] | "
                         "length == 1"), 0);
}

Test(info, iface_parameter_filters_tcp_devices)
{
    cr_expect_eq(info_jq("XFER_TCP_IFACE=lo", NULL, ".components[] | select(.name==\"tcp\") | "
                         "[.devices[].name] == [\"lo\"]"), 0);
    cr_expect_eq(info_jq("XFER_TCP_IFACE=nosuchif0", NULL, ".components[] | select(.name==\"tcp\")"
                         " | .status == \"unavailable\" and (.reason | contains(\"XFER_TCP_IFACE="
                         "nosuchif0\"))"), 0);
}

Test(info, select_explains_choice_and_rejections)
{
    char env[1200], *out;

    dir = tu_plugin_dir((const char *[]){"talpha", NULL});
    /* talpha has tcp's capabilities but CUDA memory and outranks it on its estimate: it
     * carries host memory, tcp (which moves CUDA memory through bounce buffers) CUDA memory;
     * the real shm, which would outrank both, is out */
    snprintf(env, sizeof(env), "XFER_COMPONENT_PATH=%s XFER_TRANSPORTS=%s "
             "XFER_TALPHA_CAPS=PUT,GET,TAG,TENSOR,MEM_HOST,INTER_HOST "
             "XFER_TALPHA_BANDWIDTH=1000000", dir, tu_without_shm());
    cr_assert_eq(info(env, "-s", 0, &out), 0);
    expect_contains(out, "# host memory (requires MEM_HOST):\n#   selected: talpha");
    expect_contains(out, "# cuda memory (requires MEM_CUDA):\n#   selected: tcp");
    expect_contains(out, "not selected: talpha: lacks capabilities: Supported: "
                         "PUT|GET|TAG|TENSOR|MEM_HOST|INTER_HOST / Requested: MEM_CUDA");
    if (!tu_host_has_rdma()) {
        expect_contains(out, "not selected: verbs: unavailable: no RDMA devices found");
    }
    free(out);
    cr_expect_eq(info_jq(env, "-s", ".selection.host.selected == \"talpha\""), 0);
    cr_expect_eq(info_jq(env, "-s", ".selection.cuda.selected == \"tcp\""), 0);
    cr_expect_eq(info_jq(env, "-s", "[.selection.cuda.rejected[].name] | index(\"talpha\") != "
                         "null"), 0);

    /* with talpha alone, nothing moves CUDA memory: put and get of it are staged through the
     * best host transport */
    snprintf(env, sizeof(env), "XFER_COMPONENT_PATH=%s XFER_TRANSPORTS=talpha "
             "XFER_TALPHA_CAPS=PUT,GET,TAG,TENSOR,MEM_HOST,INTER_HOST "
             "XFER_TALPHA_BANDWIDTH=1000000", dir);
    cr_assert_eq(info(env, "-s", 0, &out), 0);
    expect_contains(out, "# cuda memory (requires MEM_CUDA):\n#   selected: none");
    expect_contains(out, "# cuda memory, staged: put/get through talpha and pinned host "
                         "buffers (XFER_STAGING_CHUNK=4m x XFER_STAGING_DEPTH=4); tagged "
                         "messages and tensors through a host buffer of their size; a peer's "
                         "put or get cannot reach it\n");
    free(out);
    cr_expect_eq(info_jq(env, "-s", ".selection.cuda.selected == null"), 0);
    cr_expect_eq(info_jq(env, "-s", ".selection.cuda.staged == \"talpha\""), 0);
}

/* A transport that says per peer whether it reaches it (the test plug-ins implement
 * iface_reachable) and lacks INTER_HOST, as shm does: it still ranks first, the capability
 * does not count, and -s says it serves this host's peers and the next one the others. The
 * real shm is out, so that talpha plays its part. */
Test(info, same_host_transport_is_chosen_per_peer)
{
    char env[1200], *out;

    dir = tu_plugin_dir((const char *[]){"talpha", NULL});
    snprintf(env, sizeof(env), "XFER_COMPONENT_PATH=%s XFER_TRANSPORTS=%s "
             "XFER_TALPHA_CAPS=PUT,GET,TAG,TENSOR,MEM_HOST XFER_TALPHA_BANDWIDTH=1000000", dir,
             tu_without_shm());
    cr_assert_eq(info(env, "-s", 0, &out), 0);
    expect_contains(out, "# host memory (requires MEM_HOST):\n#   selected: talpha");
    expect_contains(out, "#   fallback 1: tcp");
    expect_contains(out, "# same host only: talpha is chosen for peers on this host "
                         "(reachability checked per peer at connect); others use tcp\n");
    cr_expect(strstr(out, "# same host only: tcp") == NULL, "tcp reaches every host:\n%s", out);
    free(out);
    cr_expect_eq(info_jq(env, "-s", ".selection.host.per_peer == [{\"name\": \"talpha\", "
                         "\"same_host_only\": true, \"others\": \"tcp\"}]"), 0);

    /* reaching other hosts too, it is still chosen per peer */
    snprintf(env, sizeof(env), "XFER_COMPONENT_PATH=%s XFER_TRANSPORTS=talpha "
             "XFER_TALPHA_CAPS=PUT,GET,TAG,TENSOR,MEM_HOST,INTER_HOST", dir);
    cr_assert_eq(info(env, "-s", 0, &out), 0);
    expect_contains(out, "# per peer: talpha is chosen for the peers it reaches (reachability "
                         "checked per peer at connect); no other transport is selected for the "
                         "others\n");
    free(out);
    cr_expect_eq(info_jq(env, "-s", ".selection.host.per_peer[0].others == null"), 0);

    /* tcp decides nothing per peer */
    cr_expect_eq(info_jq("XFER_TRANSPORTS=tcp", "-s", ".selection.host.per_peer == []"), 0);
}

/* An NVIDIA display-class device on the PCI bus, found as gdr finds it. */
static int host_has_nvidia_gpu(void)
{
    char cmd[] = "grep -l '^0x10de$' /sys/bus/pci/devices/*/vendor 2>/dev/null | "
                 "sed 's/vendor$/class/' | xargs -r grep -l '^0x03' 2>/dev/null | head -1";
    char *out;
    int found;

    tu_run(cmd, 0, &out);
    found = (out != NULL) && (out[0] != '\0');
    free(out);
    return found;
}

/* No GPU: gdr is unavailable and says so; CUDA memory goes with the transport endpoints use:
 * tcp moves it through its bounce buffers, verbs (where an RDMA port is active) stages puts
 * and gets of it; -s says which and why. Run in the Soft-RoCE guest too, where verbs stages
 * it. Peers on other hosts are the case: shm, which serves those on this one, is out. */
Test(info, cuda_memory_without_a_gpu_is_staged_and_says_why)
{
    char want[256], env[64], *out;

    if (host_has_nvidia_gpu()) {
        cr_skip_test("this host has an NVIDIA GPU");
    }
    cr_assert_eq(info(NULL, NULL, 0, &out), 0);
    expect_contains(out, "# Component: gdr");
    expect_contains(out, "unavailable: no NVIDIA GPU on the PCI bus");
    free(out);
    snprintf(env, sizeof(env), "XFER_TRANSPORTS=%s", tu_without_shm());
    cr_assert_eq(info(env, "-s", 0, &out), 0);
    expect_contains(out, "#   not selected: gdr: unavailable: no NVIDIA GPU on the PCI bus");
    if (tu_host_has_rdma()) {
        /* verbs endpoints stage it; tcp would move it through its bounce buffers */
        snprintf(want, sizeof(want), "# cuda memory, staged: put/get through verbs and pinned "
                 "host buffers");
        expect_contains(out, want);
        expect_contains(out, "#   why: endpoints use verbs, the best for host memory, which "
                             "does not move CUDA memory itself; tcp does (XFER_TRANSPORTS=tcp): "
                             "gdr, which would, is not selected: unavailable: no NVIDIA GPU on "
                             "the PCI bus");
    } else {
        expect_contains(out, "# cuda memory, through bounce buffers: tcp copies it to and from "
                             "pinned host buffers");
        expect_contains(out, "#   why: tcp cannot hand device memory to the socket: gdr, which "
                             "would, is not selected: unavailable: no NVIDIA GPU on the PCI bus");
    }
    free(out);
    cr_expect_eq(info_jq(NULL, NULL, ".components[] | select(.name==\"gdr\") | .status == "
                         "\"unavailable\" and .capabilities == []"), 0);
}

/* Peers on this host: shm puts and gets CUDA memory by IPC handles (RMA_CUDA), and -s says
 * so; with XFER_SHM_CUDA_IPC=n it stages it like any transport without. */
Test(info, shm_moves_a_peers_cuda_memory_by_ipc_and_says_so)
{
    char *out;

    cr_assert_eq(info("XFER_TRANSPORTS=shm,tcp", "-s", 0, &out), 0);
    expect_contains(out, "# cuda memory, by CUDA IPC over shm (peers on this host): put, get "
                         "and batches to and from a peer's CUDA memory open its allocation's "
                         "IPC handle");
    free(out);
    cr_assert_eq(info("XFER_SHM_CUDA_IPC=n", "-s", 0, &out), 0);
    cr_expect_null(strstr(out, "by CUDA IPC"), "XFER_SHM_CUDA_IPC=n, yet:\n%s", out);
    free(out);
    cr_expect_eq(info_jq(NULL, NULL, ".components[] | select(.name==\"shm\") | "
                         ".capabilities | index(\"RMA_CUDA\") != null"), 0);
    cr_expect_eq(info_jq("XFER_SHM_CUDA_IPC=n", NULL, ".components[] | select(.name==\"shm\") "
                         "| .capabilities | index(\"RMA_CUDA\") == null"), 0);
}

/* gdr's parameters are the verbs ones under its own name, and its own. */
Test(info, gdr_parameters_include_the_verbs_ones)
{
    char *out;

    cr_assert_eq(info(NULL, "-c", 0, &out), 0);
    expect_contains(out, "XFER_GDR_TX_QUEUE_LEN");
    expect_contains(out, "XFER_GDR_MR_CACHE");
    expect_contains(out, "XFER_GDR_FLUSH");
    expect_contains(out, "XFER_GDR_DMABUF");
    expect_contains(out, "XFER_GDR_PEERMEM");
    expect_contains(out, "XFER_VERBS_TX_QUEUE_LEN");
    free(out);
    cr_expect_neq(info("XFER_GDR_FLUSH=sometimes", NULL, 1, &out), 0);
    expect_contains(out, "XFER_GDR_FLUSH");
    free(out);
}

Test(info, json_is_valid_and_complete)
{
    cr_expect_eq(info_jq(NULL, NULL, ".abi == 1 and (.components | length) >= 1 and "
                         ".errors == []"), 0);
    cr_expect_eq(info_jq(NULL, "-c -s", "has(\"parameters\") and has(\"selection\")"), 0);
    cr_expect_eq(info_jq(NULL, NULL, ".components[] | select(.name==\"tcp\") | "
                         "(.devices | length) > 0 and .capabilities == [\"PUT\", \"GET\", \"TAG\", "
                         "\"TENSOR\", \"MEM_HOST\", \"MEM_CUDA\", \"INTER_HOST\"]"), 0);
    if (!tu_host_has_rdma()) {
        cr_expect_eq(info_jq(NULL, NULL, ".components[] | select(.name==\"verbs\") | "
                             ".reason == \"no RDMA devices found\""), 0);
    }
    /* a bad environment still gives JSON, with the errors in it, and exit status 1 */
    cr_expect_eq(info_jq("XFER_TRANSPORTS=tpc", NULL, ".errors[0] | contains(\"did you mean "
                         "'\\''tcp'\\''\")"), 0);
}

/* --sockets: a loopback listener and its tcp endpoint open sockets on loopback only - the
 * listener's in each family the host has, and tcp's lane port; "*:0" listens on every
 * interface. */
Test(info, sockets_lists_what_a_listener_opens)
{
    int v6 = tu_host_has_ipv6_loopback(), lines = 0, boot = 0, lane = 0;
    char *out, *save = NULL;

    cr_assert_eq(info("XFER_TRANSPORTS=tcp XFER_TCP_LANES=2", "--sockets", 1, &out), 0, "%s",
                 out);
    expect_contains(out, "tcp: a listener at \":0\"");
    for (char *l = strtok_r(out, "\n", &save); l != NULL; l = strtok_r(NULL, "\n", &save)) {
        if (strncmp(l, "  tcp  ", 7) != 0) {
            continue;
        }
        lines++;
        cr_expect((strncmp(l + 7, "127.0.0.1:", 10) == 0) || (strncmp(l + 7, "[::1]:", 6) == 0),
                  "a socket off loopback: %s", l);
        boot += (strstr(l, "bootstrap listener") != NULL);
        lane += (strstr(l, "transport (for endpoints") != NULL);
    }
    cr_expect_eq(boot, 1 + v6, "%d bootstrap sockets", boot);
    cr_expect_eq(lane, 1, "%d lane ports", lane);
    cr_expect_eq(lines, boot + lane);
    free(out);

    cr_assert_eq(info("XFER_TRANSPORTS=tcp", "--sockets='*:0'", 1, &out), 0, "%s", out);
    expect_contains(out, "  tcp  0.0.0.0:");
    if (v6) {
        expect_contains(out, "  tcp  [::]:");
    }
    free(out);
}

Test(info, exit_status_and_usage)
{
    char *out;

    cr_expect_eq(info(NULL, "-h", 0, &out), 0);
    expect_contains(out, "Usage: xfer_info");
    free(out);
    cr_expect_eq(info(NULL, "--bogus", 1, &out), 2);
    free(out);
    cr_expect_eq(info(NULL, "extra", 1, &out), 2);
    free(out);
    cr_expect_eq(info("XFER_LOG_LEVEL=loud", NULL, 1, &out), 1);
    expect_contains(out, "XFER_LOG_LEVEL='loud': not one of the allowed values");
    free(out);
    cr_expect_eq(info("XFER_TCP_IFAC=lo", NULL, 1, &out), 0);
    expect_contains(out, "unknown environment variable XFER_TCP_IFAC; did you mean XFER_TCP_IFACE?");
    free(out);
}
