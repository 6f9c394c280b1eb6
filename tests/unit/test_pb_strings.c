/* duet_pb_find_nul (common/pb_strings.h): a NUL inside any string field of
 * a serialized message, sub-messages included, is found and named; bytes
 * fields, other fields and malformed input are not reported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/pb_strings.h"
#include "common/rpc_pb.h"
#include "duet/v1/decode.pb-c.h"

static bool find(const ProtobufCMessage *m, char *path, size_t cap)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(duet_pb_pack(m, &buf, &len), DUET_OK);
    bool found = duet_pb_find_nul(m->descriptor, buf, len, path, cap);
    duet_free(buf);
    return found;
}

static void test_find_nul(void **state)
{
    Duet__V1__DecodeGenerateRequest d = DUET__V1__DECODE_GENERATE_REQUEST__INIT;
    Duet__V1__GenerateRequest g = DUET__V1__GENERATE_REQUEST__INIT;
    Duet__V1__TokenIds ids = DUET__V1__TOKEN_IDS__INIT;
    int32_t some[] = {0, 1, 0, 300};
    char text[] = "Once\0upon", stop1[] = "x\0", path[64];
    char *stops[] = {"fine", stop1};
    (void)state;

    d.request = &g;
    g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TEXT;
    g.text = "Once upon";
    g.request_id = "r-1";
    d.prefill_target = "127.0.0.1:1";
    assert_false(find(&d.base, path, sizeof(path)));
    assert_string_equal(path, "");

    /* protobuf-c packs strings by strlen: build the wire bytes by hand for
     * an embedded NUL: field 1 (request), length, field 2 (text), length */
    uint8_t wire[32];
    size_t n = 0, tl = sizeof(text) - 1;
    wire[n++] = (1 << 3) | 2;
    wire[n++] = (uint8_t)(2 + tl);
    wire[n++] = (2 << 3) | 2;
    wire[n++] = (uint8_t)tl;
    memcpy(wire + n, text, tl);
    n += tl;
    assert_true(duet_pb_find_nul(&duet__v1__decode_generate_request__descriptor, wire, n, path,
                                 sizeof(path)));
    assert_string_equal(path, "request.text");
    /* the same bytes cut short: malformed, not reported */
    assert_false(duet_pb_find_nul(&duet__v1__decode_generate_request__descriptor, wire, n - 2, path,
                                  sizeof(path)));
    /* a repeated string: stop (field 7), second element "x\0" */
    n = 0;
    wire[n++] = (1 << 3) | 2;
    wire[n++] = 2 + 4 + 2 + 2;
    wire[n++] = (7 << 3) | 2;
    wire[n++] = 4;
    memcpy(wire + n, stops[0], 4);
    n += 4;
    wire[n++] = (7 << 3) | 2;
    wire[n++] = 2;
    memcpy(wire + n, stop1, 2);
    n += 2;
    assert_true(duet_pb_find_nul(&duet__v1__decode_generate_request__descriptor, wire, n, path,
                                 sizeof(path)));
    assert_string_equal(path, "request.stop");
    /* zeros in packed ids (not a string) are fine */
    g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g.token_ids = &ids;
    ids.ids = some;
    ids.n_ids = 4;
    assert_false(find(&d.base, path, sizeof(path)));
    /* a group wire type is malformed for proto3 */
    uint8_t grp[] = {(1 << 3) | 3};
    assert_false(duet_pb_find_nul(&duet__v1__decode_generate_request__descriptor, grp, 1, path,
                                  sizeof(path)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_find_nul)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
