/* Part of test_fault: common/fault.h as a release build (DUET_FAULT_INJECTION
 * OFF) compiles it, in a build that has fault points.  The queries must be
 * constants that need nothing from common/fault.c. */
#undef DUET_FAULT_INJECTION
#define DUET_FAULT_INJECTION 0
#include "common/fault.h"

#include <string.h>

int fault_off_check(const char **why_p);

int fault_off_check(const char **why_p)
{
    duet_fault_count_t c;
    if (duet_fault("prefill.delay_ms") || duet_fault("nope"))
        return *why_p = "duet_fault is not false", 1;
    if (duet_fault_value("prefill.delay_ms", 17) != 17)
        return *why_p = "duet_fault_value is not the caller's default", 1;
    if (duet_fault_arm("prefill.delay_ms", 1) != DUET_ERR_UNSUPPORTED ||
        strstr(duet_error_msg(), "compiled out") == NULL)
        return *why_p = "arming did not answer UNSUPPORTED", 1;
    if (duet_fault_disarm("prefill.delay_ms") != DUET_OK)
        return *why_p = "disarming failed", 1;
    duet_fault_reset();
    duet_fault_count_init(&c, "xfer.corrupt_put");
    if (duet_fault_count_arm(&c, 0) != DUET_ERR_UNSUPPORTED || duet_fault_count_arm(&c, -1) != 0)
        return *why_p = "a counter armed", 1;
    for (int i = 0; i < 4; i++)
        if (duet_fault_count_hit(&c))
            return *why_p = "a counter fired", 1;
    return 0;
}
