/* duet: command-line tools.
 *   duet generate   single-process generation
 *   duet mkmodel    write a synthetic Hugging Face model */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "tools/duet/commands.h"

static void duet__usage(FILE *f)
{
    fprintf(f, "usage: duet <command> [options]\n"
               "commands:\n"
               "  generate   generate text with one process (--help for options)\n"
               "  mkmodel    write a synthetic Hugging Face Llama-family model\n");
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
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        duet__usage(stdout);
        return 0;
    }
    fprintf(stderr, "duet: unknown command '%s'\n", argv[1]);
    duet__usage(stderr);
    return 2;
}
