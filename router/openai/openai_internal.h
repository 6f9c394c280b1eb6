/* Shared by the OpenAI request parsers (openai.c, openai_choices.c).
 * Router-internal. */
#ifndef DUET_ROUTER_OPENAI_OPENAI_INTERNAL_H
#define DUET_ROUTER_OPENAI_OPENAI_INTERNAL_H

#include <stdbool.h>

#include <cjson/cJSON.h>

/* root's field key; absent and JSON null both mean "not given" (NULL). */
const cJSON *duet__oai_field(const cJSON *root, const char *key);
/* v is a number with an integer value in lo..hi. */
bool duet__oai_int_in(const cJSON *v, double lo, double hi);

#endif
