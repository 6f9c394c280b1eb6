#include "common/rpc_pb.h"

#include "common/alloc.h"

duet_status_t duet_pb_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = duet_malloc(len ? len : 1);
    if (buf == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory for a %zu-byte message", len);
    protobuf_c_message_pack(msg, buf);
    *buf_p = buf;
    *len_p = len;
    return DUET_OK;
}

duet_status_t duet_pb_reply(duet_rpc_call_t *call, const ProtobufCMessage *msg)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_status_t st = duet_pb_pack(msg, &buf, &len);
    if (st != DUET_OK)
        return duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, duet_error_msg());
    st = duet_rpc_call_reply(call, buf, len);
    duet_free(buf);
    return st;
}

duet_status_t duet_pb_write(duet_rpc_call_t *call, const ProtobufCMessage *msg)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_status_t st = duet_pb_pack(msg, &buf, &len);
    if (st != DUET_OK)
        return st;
    st = duet_rpc_call_write(call, buf, len);
    duet_free(buf);
    return st;
}
