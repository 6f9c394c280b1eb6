/* protobuf-c messages over the rpc layer: pack and send in one call. */
#ifndef DUET_COMMON_RPC_PB_H
#define DUET_COMMON_RPC_PB_H

#include <protobuf-c/protobuf-c.h>

#include "common/rpc.h"

/* Pack msg into a duet_malloc'd buffer (*len_p bytes). */
duet_status_t duet_pb_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p);

/* duet_rpc_call_reply / duet_rpc_call_write with a packed message.  Same
 * ownership rules as those (reply is terminal). */
duet_status_t duet_pb_reply(duet_rpc_call_t *call, const ProtobufCMessage *msg);
duet_status_t duet_pb_write(duet_rpc_call_t *call, const ProtobufCMessage *msg);

#endif
