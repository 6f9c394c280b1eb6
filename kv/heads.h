/* The one KV-head ownership rule (DESIGN §2, §3 rule 5), used by the
 * engine's TP sharding and by the transfer slice plan alike.
 *
 * With H total KV heads on a TP group of `tp` ranks:
 *   H >= tp: H % tp == 0 and rank r owns the H/tp consecutive heads
 *            starting at r*H/tp;
 *   H <  tp: tp % H == 0 and head r*H/tp is replicated on the tp/H
 *            consecutive ranks that share it.
 * Other combinations are refused. */
#ifndef DUET_KV_HEADS_H
#define DUET_KV_HEADS_H

#include "common/status.h"

#define DUET_TP_MAX 64

/* Can a TP group of `tp` ranks hold H KV heads?  DUET_ERR_CONFIG with a
 * message "tp <tp>: ..." naming the numbers and the rule when not. */
duet_status_t duet_kv_heads_check(int n_kv_heads, int tp);

/* The first global KV head `rank` owns and how many (1 when replicated).
 * Valid only after duet_kv_heads_check.  Pure. */
void duet_kv_heads_owned(int n_kv_heads, int tp, int rank, int *head0_p, int *count_p);

/* The ranks of the group that hold global head h: returns how many
 * (tp/H when replicated, else 1) and the first of them in *rank0_p (they
 * are consecutive).  Valid only after duet_kv_heads_check.  Pure. */
int duet_kv_heads_holders(int n_kv_heads, int tp, int h, int *rank0_p);

#endif
