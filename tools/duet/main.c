/* duet: command-line tools.
 *   duet generate      single-process generation
 *   duet mkmodel       write a synthetic Hugging Face model
 *   duet bench-serve   serving benchmark (tools/bench_serve/) */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "tools/duet/commands.h"
#ifdef DUET_HAVE_BENCH_SERVE
#include "tools/bench_serve/bench_serve.h"
#endif

static void duet__usage(FILE *f)
{
    fprintf(f, "usage: duet <command> [options]\n"
               "commands:\n"
               "  generate   generate text with one process (--help for options)\n"
               "  mkmodel    write a synthetic Hugging Face Llama-family model\n"
               "  bench-serve  load an OpenAI-compatible or duet gRPC server: TTFT, TPOT,\n"
               "             ITL, throughput, goodput (--help for options)\n");
}

int main(int argc, char **argv)
{
    duet_log_init_from_env();
    if (argc < 2) {
        duet__usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "generate") == 0)
        return duet_cmd_generate(argc - 1, argv + 1);
    if (strcmp(argv[1], "mkmodel") == 0)
        return duet_cmd_mkmodel(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench-serve") == 0) {
#ifdef DUET_HAVE_BENCH_SERVE
        return duet_bs_main(argc - 1, argv + 1);
#else
        fprintf(stderr, "duet: bench-serve was not built (it needs libcurl4-openssl-dev and "
                        "gRPC: scripts/install-deps.sh, then re-run cmake)\n");
        return 1;
#endif
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        duet__usage(stdout);
        return 0;
    }
    fprintf(stderr, "duet: unknown command '%s'\n", argv[1]);
    duet__usage(stderr);
    return 2;
}
