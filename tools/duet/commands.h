/* Subcommands of the duet tool: each takes argv with argv[0] = its name and
 * returns the process exit status (0 ok, 1 failure, 2 usage). */
#ifndef DUET_TOOLS_DUET_COMMANDS_H
#define DUET_TOOLS_DUET_COMMANDS_H

int duet_cmd_generate(int argc, char **argv);
int duet_cmd_mkmodel(int argc, char **argv);

#endif
