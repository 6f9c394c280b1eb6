/* What every duet daemon does the same way: the command line
 * (--config FILE --name NAME, overrides of the instance's keys), the
 * shutdown signals, and identities.
 *
 *   duet-decode --config cluster.json --name decode-0 [--tp 4] [--n-pages 512]
 *               [--listen 0.0.0.0:9200] [--model DIR] [--check-config]
 *               [--log-level info]
 *
 * Any instance key of the cluster config (common/cluster.h) may be given as
 * a flag, with '-' or '_' ("--n-pages" = "n_pages"); flags override the
 * file. */
#ifndef DUET_COMMON_DAEMON_H
#define DUET_COMMON_DAEMON_H

#include <stdbool.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/status.h"

typedef struct {
    duet_cluster_config_t *cluster;
    duet_instance_config_t *self; /* this daemon's entry in cluster */
    duet_role_t role;
    bool check_config;            /* validate and exit */
    char instance_id[40];         /* "<name>-<16 hex>", new on every start */
} duet_daemon_args_t;

/* Parse argv for a daemon of `role`: load the config, find --name (it must
 * be an instance of that role), apply overrides.  On error the message names
 * the flag or config key; exit code 2 is appropriate.  --help prints usage
 * to stdout and returns DUET_ERR_CANCELLED. */
duet_status_t duet_daemon_args_parse(int argc, char **argv, duet_role_t role,
                                     duet_daemon_args_t *args_p);
void duet_daemon_args_cleanup(duet_daemon_args_t *args);

/* Block SIGINT/SIGTERM (and ignore SIGPIPE) in the calling thread; call in
 * main before starting any thread so every thread inherits the mask.  Also
 * installs a handler for both (never run while they stay blocked): the
 * kernel drops a SIG_DFL signal sent to the PID 1 of a PID namespace, which
 * a daemon is in a container without an init. */
void duet_daemon_signals_block(void);

/* Wait up to timeout_ms (< 0: forever) for SIGINT/SIGTERM; returns the
 * signal number or 0 on timeout. */
int duet_daemon_signal_wait(int64_t timeout_ms);

/* 64 random bits for seeds and instance ids, not secrets (libcrypto's
 * CSPRNG; falls back to time and pid). */
uint64_t duet_random_u64(void);

#endif
