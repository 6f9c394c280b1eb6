/* Status mapping, byte buffers, deadlines and gRPC library lifetime. */
#include <stdint.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/rpc_internal.h"

grpc_status_code duet_rpc_status_to_grpc(duet_status_t st)
{
    switch (st) {
    case DUET_OK:
        return GRPC_STATUS_OK;
    case DUET_ERR_INVALID:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case DUET_ERR_NOT_FOUND:
        return GRPC_STATUS_NOT_FOUND;
    case DUET_ERR_EXHAUSTED:
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case DUET_ERR_TIMEOUT:
        return GRPC_STATUS_DEADLINE_EXCEEDED;
    case DUET_ERR_CANCELLED:
        return GRPC_STATUS_CANCELLED;
    case DUET_ERR_UNSUPPORTED:
        return GRPC_STATUS_UNIMPLEMENTED;
    case DUET_ERR_PEER:
    case DUET_ERR_SHUTDOWN:
        return GRPC_STATUS_UNAVAILABLE;
    case DUET_ERR_CONFIG:
    case DUET_ERR_MISMATCH:
        return GRPC_STATUS_FAILED_PRECONDITION;
    case DUET_ERR_TOO_LONG:
        return GRPC_STATUS_OUT_OF_RANGE;
    default:
        return GRPC_STATUS_INTERNAL;
    }
}

duet_status_t duet_rpc_status_from_grpc(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return DUET_OK;
    case GRPC_STATUS_CANCELLED:
        return DUET_ERR_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_ALREADY_EXISTS:
        return DUET_ERR_INVALID;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return DUET_ERR_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND:
        return DUET_ERR_NOT_FOUND;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return DUET_ERR_EXHAUSTED;
    case GRPC_STATUS_FAILED_PRECONDITION:
        return DUET_ERR_MISMATCH;
    case GRPC_STATUS_OUT_OF_RANGE:
        return DUET_ERR_TOO_LONG;
    case GRPC_STATUS_UNIMPLEMENTED:
        return DUET_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_ABORTED:
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
        return DUET_ERR_PEER;
    default:
        return DUET_ERR_INTERNAL;
    }
}

const char *duet_rpc_code_name(grpc_status_code code)
{
    static const char *const names[] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((int)code >= 0 && (size_t)code < sizeof(names) / sizeof(names[0]))
        return names[code];
    return "UNKNOWN_CODE";
}

duet_status_t duet__rpc_bb_flatten(grpc_byte_buffer *bb, uint8_t **data_p, size_t *len_p)
{
    grpc_byte_buffer_reader reader;
    grpc_slice slice;
    uint8_t *buf = NULL;
    size_t len = 0, cap;

    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return duet_error(DUET_ERR_FORMAT, "rpc: cannot read message (bad compression)");
    /* Exact for uncompressed buffers; a compressed one grows below. */
    cap = grpc_byte_buffer_length(bb);
    if (cap > 0) {
        buf = duet_malloc(cap);
        if (!buf)
            goto err_reader;
    }
    while (grpc_byte_buffer_reader_next(&reader, &slice)) {
        size_t n = GRPC_SLICE_LENGTH(slice);
        if (len + n > cap) {
            size_t ncap = cap ? cap : 64;
            while (ncap < len + n)
                ncap *= 2;
            uint8_t *nbuf = duet_realloc(buf, ncap);
            if (!nbuf) {
                grpc_slice_unref(slice);
                goto err_reader;
            }
            buf = nbuf;
            cap = ncap;
        }
        if (n > 0)
            memcpy(buf + len, GRPC_SLICE_START_PTR(slice), n);
        len += n;
        grpc_slice_unref(slice);
    }
    grpc_byte_buffer_reader_destroy(&reader);
    if (len == 0) {
        duet_free(buf);
        buf = NULL;
    }
    *data_p = buf;
    *len_p = len;
    return DUET_OK;

err_reader:
    grpc_byte_buffer_reader_destroy(&reader);
    duet_free(buf);
    return duet_error(DUET_ERR_NO_MEMORY, "rpc: message of %zu bytes", cap);
}

grpc_byte_buffer *duet__rpc_bb_from(const void *data, size_t len)
{
    grpc_slice slice = len > 0 ? grpc_slice_from_copied_buffer(data, len) : grpc_empty_slice();
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

int64_t duet__rpc_deadline_from_gpr(gpr_timespec t)
{
    if (t.tv_sec == INT64_MAX)
        return INT64_MAX;
    /* gRPC clocks and CLOCK_MONOTONIC may have different origins: carry the
     * remaining time over rather than the absolute value. */
    gpr_timespec rem = gpr_time_sub(t, gpr_now(t.clock_type));
    int64_t now = duet_now_ns();
    if (rem.tv_sec >= (INT64_MAX - now) / DUET_NS_PER_S - 1)
        return INT64_MAX;
    return now + (int64_t)rem.tv_sec * DUET_NS_PER_S + rem.tv_nsec;
}

gpr_timespec duet__rpc_deadline_to_gpr(int64_t deadline_ns)
{
    if (deadline_ns == INT64_MAX)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    int64_t rem = deadline_ns - duet_now_ns();
    if (rem < 0)
        rem = 0;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(rem, GPR_TIMESPAN));
}

/* The only thread-local state: which rpc object's CQ thread this is, so that
 * blocking calls made from a callback fail instead of deadlocking. */
static _Thread_local const void *duet__rpc_cq_owner;

void duet__rpc_cq_thread_set(const void *owner)
{
    duet__rpc_cq_owner = owner;
}

bool duet__rpc_on_cq_thread(void)
{
    return duet__rpc_cq_owner != NULL;
}

void duet__rpc_grpc_acquire(void)
{
    grpc_init();
}

void duet__rpc_grpc_release(void)
{
    grpc_shutdown();
}

grpc_arg duet__rpc_int_arg(const char *key, int value)
{
    grpc_arg a;
    memset(&a, 0, sizeof(a));
    a.type = GRPC_ARG_INTEGER;
    a.key = (char *)key;
    a.value.integer = value;
    return a;
}
