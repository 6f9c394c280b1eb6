/* NUL bytes in protobuf string fields.  protobuf-c hands strings over
 * NUL-terminated, so a string with a NUL inside would be cut short without
 * a word; handlers check the serialized bytes first and refuse it. */
#ifndef DUET_COMMON_PB_STRINGS_H
#define DUET_COMMON_PB_STRINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "common/status.h"

/* True when a string field of the serialized message (sub-messages
 * included) holds a NUL byte; then path gets the field's path
 * ("request.text").  False when there is none, or when the bytes are
 * malformed (the unpacker reports that). */
bool duet_pb_find_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                      char *path, size_t cap);

/* The check every handler runs on its serialized request before unpacking
 * it: DUET_ERR_INVALID "<path>: contains a NUL byte (not allowed in
 * strings)" when a string field holds one, else DUET_OK. */
duet_status_t duet_pb_check_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                size_t len);

#endif
