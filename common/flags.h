/* The command-line parser of every duet binary: a table of flags, each with
 * its type, where its value goes, its range and a line of help.
 *
 *   static const duet_flag_t flags[] = {
 *       {"config", DUET_FLAG_STRING, &opt.config_path, .arg = "FILE", .help = "..."},
 *       {"http-threads", DUET_FLAG_INT, &opt.http_threads, 1, 64, .arg = "N", .help = "..."},
 *       {"check-config", DUET_FLAG_TRUE, &check, .help = "..."},
 *   };
 *   st = duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, NULL, NULL);
 *
 * Accepted: --name VALUE and --name=VALUE; flags without a value (TRUE,
 * FALSE, STOP) take none; "-h" stands for "--help" when the table has a
 * "help" flag; "--" ends the flags.  Names are matched whole (no
 * abbreviations).  A later flag overrides an earlier one.
 *
 * Errors (the status, and duet_error_msg() naming the flag; the caller
 * prefixes its program name and exits 2):
 *   --foo: unknown flag
 *   --config: needs a value
 *   --check-config: takes no value
 *   --http-threads 0: expected an integer in [1, 64]
 *   --temperature x: expected a number in [0, 100]
 *   --backend foo: expected openai, openai-chat or grpc
 *   unexpected argument 'x'
 * The destinations hold the defaults before the parse; a flag's
 * destination is written only with a valid value. */
#ifndef DUET_COMMON_FLAGS_H
#define DUET_COMMON_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

typedef enum {
    DUET_FLAG_HEADING, /* not a flag: a line of the help (help is its text) */
    DUET_FLAG_STRING,  /* const char **dest = the value (argv's string, not copied) */
    DUET_FLAG_INT,     /* int *dest = an integer in [min, max] */
    DUET_FLAG_INT64,   /* int64_t *dest = an integer in [min, max] (|x| <= 2^53) */
    DUET_FLAG_DOUBLE,  /* double *dest = a number in [min, max] */
    DUET_FLAG_CHOICE,  /* int *dest = the index of the value in choices */
    DUET_FLAG_TRUE,    /* bool *dest = true; no value */
    DUET_FLAG_FALSE,   /* bool *dest = false; no value (--no-usage) */
    DUET_FLAG_STOP,    /* bool *dest = true and the parse ends there (--help); no value */
    DUET_FLAG_FUNC,    /* fn(dest, flag, value) takes the value */
} duet_flag_type_t;

/* A FUNC flag's parser: flag is "--name" (for messages), value the text
 * given.  Returns DUET_OK, or an error whose message names the flag. */
typedef duet_status_t (*duet_flag_fn)(void *dest, const char *flag, const char *value);

typedef struct {
    const char *name; /* without the dashes: "http-threads" */
    duet_flag_type_t type;
    void *dest;
    double min, max;            /* INT, INT64, DOUBLE: the accepted range, inclusive */
    const char *const *choices; /* CHOICE: the accepted values, NULL-terminated */
    duet_flag_fn fn;            /* FUNC */
    const char *arg;            /* the value's name in the help ("N", "FILE") */
    const char *help;           /* the help text; '\n' starts an indented line */
} duet_flag_t;

#define DUET_FLAGS_N(table) (sizeof(table) / sizeof((table)[0]))

/* Flags not in the table (name without the dashes, value always taken):
 * DUET_OK when the flag was taken, DUET_ERR_NOT_FOUND to report it as an
 * unknown flag, another error (with its message) to fail the parse. */
typedef duet_status_t (*duet_flags_other_fn)(void *ud, const char *name, const char *value);

/* Parse argv[1 .. argc) against flags[n].  other (may be NULL: every flag
 * not in the table is unknown) takes the flags not in the table.  Stops at
 * the first error (DUET_ERR_CONFIG, or what a FUNC / other returned) or at
 * a STOP flag (DUET_OK).  The error message is per thread (duet_error);
 * the parse touches nothing but the destinations. */
duet_status_t duet_flags_parse(const duet_flag_t *flags, size_t n, int argc, char *const *argv,
                               duet_flags_other_fn other, void *ud);

/* The help of the table to f: each flag as "  --name ARG" and its help
 * text in a column, headings as they are. */
void duet_flags_help(FILE *f, const duet_flag_t *flags, size_t n);

/* A FUNC for --log-level: dest unused; sets the process's log level
 * (error, warn, info, debug or trace). */
duet_status_t duet_flag_log_level(void *dest, const char *flag, const char *value);

/* A FUNC parser for a seed: dest is a duet_flag_seed_t, value a
 * non-negative integer (decimal, or 0x hex); set records that it was given. */
typedef struct {
    uint64_t value;
    bool set;
} duet_flag_seed_t;
duet_status_t duet_flag_seed(void *dest, const char *flag, const char *value);

#endif
