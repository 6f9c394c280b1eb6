/* duet: command-line tools (placeholder until generate/mkmodel land). */
#include <stdio.h>

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "usage: duet <generate|mkmodel> ...\n");
    return 2;
}
