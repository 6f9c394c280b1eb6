/* The prefill side's send state, shared by the files that drive it
 * (private to transfer/).  Each file calls only the ones below it:
 *
 *   xfer_send_post.c    the put loop: the posting cursor and the puts
 *   xfer_send.c         the state's course: commands from the caller,
 *                       events (acks, deadlines, peers gone), the plan ->
 *                       state preparation, the move from posting to flushing
 *   xfer_send_notify.c  a pair's end (flush, checksum, notification) and a
 *                       packed send's progress messages
 *   xfer_send_state.c   bookkeeping: the rank's lists, a pair's failure, the
 *                       outcome, the state's end
 *
 * The state machine is described in xfer_send.c. */
#ifndef DUET_TRANSFER_XFER_SEND_STATE_H
#define DUET_TRANSFER_XFER_SEND_STATE_H

#include "transfer/xfer_internal.h"

enum {
    DUET__DST_POSTING,
    DUET__DST_FLUSHING,
    DUET__DST_NOTIFYING,
    DUET__DST_ACK_WAIT,
    DUET__DST_DONE
};

typedef struct {
    duet__send_t *s;
    int d;                        /* decode engine rank */
    duet_xfer_peer_t *peer;       /* NULL once the peer is gone */
    const duet_slice_run_t *runs; /* into s->runs, dst_head order */
    int n_runs;
    uint32_t crc;
    uint64_t bytes, puts;
    int slot0; /* packed: the first run's slot in the sender's staging */
    int state;
    int next_page;      /* in the current plane: first page index not yet posted */
    int failure_notice; /* the notification reports a failure */
    int told;           /* packed: the layers a progress message announced so far */
    uint8_t msg[DUET__MSG_BYTES];
} duet__send_dst_t;

struct duet__send {
    duet__outcome_t o; /* first: outcome pointers are send pointers */
    duet_xfer_rank_t *r;
    duet__send_t *next, *prev;           /* r->send_list */
    duet__send_t *post_next, *post_prev; /* r->posting */
    int in_posting, in_table, detached;
    int n_dst;
    duet__send_dst_t *dst;
    duet_slice_run_t *runs;
    int32_t *pages; /* [2][n_pages]: source ids, then destination ids */
    int n_pages;
    unsigned flags;
    int32_t src_stage0, dst_stage0; /* DUET_XFER_SEND_PACKED */
    int n_layers;
    int limit;                               /* layers [0, limit) may be posted */
    int c_layer, c_kv, c_page, c_dst, c_run; /* the posting cursor */
    int c_end;                               /* packed: the chunk is layers [c_layer, c_end) */
    int stop_posting, failing, ended;
    int timed_out;       /* the deadline passed: failing, waiting for puts in flight */
    int progress_layers; /* packed: announce landed layers at least this far apart (0: never) */
    int64_t first_token;
    long inflight; /* transport operations with a dst of this state as argument */
    int crc_hook;  /* DUET_XFER_SEND_CRC through the rank's hook (xfer_checksum.c) */
    int crc_flush; /* the pair's CRC taken at flush (hook, or packed: posting order is
                      by chunk, not the checksum order); else inline, put by put */
};

/* After a deadline, how long the outcome waits for puts already in flight:
 * the outcome tells the caller nothing writes the destination any more (the
 * decode daemon then reuses those pages), so it is not given while a put
 * could still land -- unless the puts are stuck past this grace too. */
#define DUET__SEND_DRAIN_GRACE_NS (5 * DUET_NS_PER_S)

/* xfer_send.c */
/* Move on once posting is over: flush and notify every dst still posting. */
void duet__send_advance(duet_xfer_rank_t *r, duet__send_t *s);

/* xfer_send_notify.c */
/* Flush dst's data endpoint, then notify its decode rank. */
void duet__send_flush(duet_xfer_rank_t *r, duet__send_dst_t *dst);
/* A message of kind to dst's decode rank about this send (the rest zero). */
void duet__send_msg_init(const duet_xfer_rank_t *r, const duet__send_dst_t *dst, int kind,
                         duet__msg_t *m);
/* Packed: dst's puts of layers [0, layers) are posted: announce them once
 * flushed, if they are far enough from the last announcement and not the
 * end. */
void duet__send_progress(duet_xfer_rank_t *r, duet__send_t *s, duet__send_dst_t *dst, int layers);

/* xfer_send_state.c */
void duet__send_posting_add(duet_xfer_rank_t *r, duet__send_t *s);
void duet__send_posting_remove(duet_xfer_rank_t *r, duet__send_t *s);
/* Free s once nothing refers to it any more. */
void duet__send_maybe_free(duet_xfer_rank_t *r, duet__send_t *s);
/* Deliver the outcome once every dst is done. */
void duet__send_check_done(duet_xfer_rank_t *r, duet__send_t *s);
/* dst is done with an error (the send's outcome keeps the first). */
void duet__send_dst_fail(duet_xfer_rank_t *r, duet__send_dst_t *dst, duet_status_t st,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
