#include "common/pb_strings.h"

#include <stdio.h>
#include <string.h>

#define DUET__PB_MAX_DEPTH 16

static bool duet__pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;

    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *v = r;
            return true;
        }
    }
    return false;
}

static bool duet__pb_walk(const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                          const uint8_t *end, int depth, char *path, size_t cap, size_t at)
{
    uint64_t tag, v;

    while (p < end) {
        if (!duet__pb_varint(&p, end, &tag))
            return false;
        switch (tag & 7) {
        case 0:
            if (!duet__pb_varint(&p, end, &v))
                return false;
            break;
        case 1:
            if (end - p < 8)
                return false;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return false;
            p += 4;
            break;
        case 2: {
            if (!duet__pb_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return false;
            const ProtobufCFieldDescriptor *f =
                tag >> 3 <= UINT32_MAX
                    ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3))
                    : NULL;
            if (f != NULL && (f->type == PROTOBUF_C_TYPE_STRING ||
                              (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < DUET__PB_MAX_DEPTH))) {
                int n =
                    snprintf(path + at, at < cap ? cap - at : 0, "%s%s", at ? "." : "", f->name);
                size_t next = n > 0 && at + (size_t)n < cap ? at + (size_t)n : at;
                if (f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)v) != NULL)
                    return true;
                if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
                    duet__pb_walk(f->descriptor, p, p + v, depth + 1, path, cap, next))
                    return true;
                if (at < cap)
                    path[at] = '\0';
            }
            p += v;
            break;
        }
        default: /* groups: not in proto3 */
            return false;
        }
    }
    return false;
}

bool duet_pb_find_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                      char *path, size_t cap)
{
    if (cap > 0)
        path[0] = '\0';
    if (data == NULL || len == 0 || cap == 0)
        return false;
    return duet__pb_walk(desc, data, data + len, 0, path, cap, 0);
}

duet_status_t duet_pb_check_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                size_t len)
{
    char path[128];
    if (duet_pb_find_nul(desc, data, len, path, sizeof(path)))
        return duet_error(DUET_ERR_INVALID, "%s: contains a NUL byte (not allowed in strings)",
                          path);
    return DUET_OK;
}
