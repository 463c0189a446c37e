/*
 * The self-describing remote-key blob (framework/memory.c): what xfer_rkey_unpack parses
 * before a transport sees its part.
 *
 * The whole input is unpacked on a "tcp" endpoint whose peer is RKEY_ENV_OWNER. When it is
 * taken, the owner, bounds and part are packed again with xfer_rkey_pack and must unpack to
 * the same value. Then the bytes are read as a recipe for a context of up to four transports
 * (some without the buffer registered), a buffer and each transport's blob: packed with
 * xfer_rkey_pack, the key must unpack on an endpoint of each registered transport to its own
 * blob and the buffer's bounds, be refused by the others, and be refused for another peer.
 */
#include "fuzz.h"
#include "rkey_env.h"

static rkey_env_t env;

static void check_key(const xfer_rkey_t *rkey, uint64_t owner, uint64_t addr, uint64_t length,
                      const void *part, size_t part_len)
{
    FUZZ_CHECK((rkey->owner_id == owner) && (rkey->addr == addr) && (rkey->length == length),
               "key of %016llx [%llx+%llu] came back as %016llx [%llx+%llu]",
               (unsigned long long)owner, (unsigned long long)addr,
               (unsigned long long)length, (unsigned long long)rkey->owner_id,
               (unsigned long long)rkey->addr, (unsigned long long)rkey->length);
    FUZZ_CHECK((env.seen_len == part_len) &&
               ((part_len == 0) || !memcmp(env.seen, part, part_len)),
               "the transport got %zu bytes, not its %zu", env.seen_len, part_len);
}

static void round_trip_input(const uint8_t *data, size_t size)
{
    uint8_t part[RKEY_ENV_MAX_BLOB];
    xfer_rkey_t *rkey, *rkey2;
    uint64_t addr, length;
    size_t part_len, len;
    void *blob;

    rkey_env_init(&env, 1, 0);
    if (rkey_env_unpack(&env, "tcp", RKEY_ENV_OWNER, data, size, &rkey) != XFER_OK) {
        return;
    }
    FUZZ_CHECK((env.seen >= data) && (env.seen + env.seen_len <= data + size),
               "the part handed to the transport is outside the blob");
    FUZZ_CHECK((rkey->owner_id == RKEY_ENV_OWNER) && (rkey->addr + rkey->length >= rkey->addr),
               "owner or bounds not checked");
    addr     = rkey->addr;
    length   = rkey->length;
    part_len = env.seen_len;
    memcpy(part, env.seen, (part_len < sizeof(part)) ? part_len : sizeof(part));
    xfer_rkey_destroy(rkey);
    if (part_len > RKEY_ENV_MAX_BLOB) {
        return;     /* more than this side packs: nothing to compare with */
    }

    rkey_env_init(&env, RKEY_ENV_OWNER, 1);
    snprintf(env.parts[0].name, sizeof(env.parts[0].name), "tcp");
    env.parts[0].registered = 1;
    memcpy(env.parts[0].blob, part, part_len);
    env.parts[0].blob_len = part_len;
    FUZZ_CHECK(rkey_env_pack(&env, addr, length, &blob, &len) == XFER_OK, "pack");
    FUZZ_CHECK(rkey_env_unpack(&env, "tcp", RKEY_ENV_OWNER, blob, len, &rkey2) == XFER_OK,
               "a key packed from a parsed one does not unpack");
    check_key(rkey2, RKEY_ENV_OWNER, addr, length, part, part_len);
    xfer_rkey_destroy(rkey2);
    xfer_rkey_blob_free(blob);
}

static void round_trip_values(const uint8_t *data, size_t size)
{
    fuzz_cursor_t c = {data, size};
    uint64_t owner, addr, length;
    unsigned num;
    xfer_rkey_t *rkey;
    size_t len;
    void *blob;

    owner  = fuzz_take(&c, 8);
    num    = (unsigned)(fuzz_take(&c, 1) % (RKEY_ENV_MAX_PARTS + 1));
    rkey_env_init(&env, owner, num);
    addr   = fuzz_take(&c, 8);
    length = fuzz_take(&c, 8);
    for (unsigned i = 0; i < num; i++) {
        rkey_env_part_t *part = &env.parts[i];
        size_t n = fuzz_take_name(&c, part->name, XFER_NAME_MAX - 3);

        /* distinct names, as the loader guarantees */
        snprintf(part->name + n, sizeof(part->name) - n, "_%u", i);
        part->registered = (fuzz_take(&c, 1) % 4) != 0;
        part->blob_len   = fuzz_take_bytes(&c, part->blob, 64);
    }
    FUZZ_CHECK(rkey_env_pack(&env, addr, length, &blob, &len) == XFER_OK, "pack");
    for (unsigned i = 0; i < num; i++) {
        const rkey_env_part_t *part = &env.parts[i];
        xfer_status_t status = rkey_env_unpack(&env, part->name, owner, blob, len, &rkey);

        if (!part->registered || ((uint64_t)(uintptr_t)addr + length < addr)) {
            FUZZ_CHECK(status != XFER_OK, "unpacked for '%s', which has no part (or the "
                       "bounds wrap)", part->name);
            continue;
        }
        FUZZ_CHECK(status == XFER_OK, "a packed key does not unpack for '%s'", part->name);
        check_key(rkey, owner, addr, length, part->blob, part->blob_len);
        xfer_rkey_destroy(rkey);
    }
    FUZZ_CHECK(rkey_env_unpack(&env, "tcp", owner ^ 1, blob, len, &rkey) != XFER_OK,
               "a key of another context unpacked");
    xfer_rkey_blob_free(blob);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    round_trip_input(data, size);
    round_trip_values(data, size);
    return 0;
}
