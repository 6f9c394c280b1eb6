/* ISA choice for the cpu backend's non-matmul kernels (ops_internal.h). */
#include "engine/cpu/ops_internal.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_once_t duet__ops_isa_once = PTHREAD_ONCE_INIT;
static duet__mm_isa_t duet__ops_isa_value; /* written once under duet__ops_isa_once */

static void duet__ops_isa_init(void)
{
    int ignored;
    /* matmul.c makes the same choice from the same variable and logs a
     * refused value; saying it twice would only be noise */
    duet__ops_isa_value = duet__mm_isa_choose(duet__mm_isa_detect(), getenv("DUET_CPU_ISA"),
                                              &ignored);
}

duet__mm_isa_t duet__cpu_ops_isa(void)
{
    pthread_once(&duet__ops_isa_once, duet__ops_isa_init);
    return duet__ops_isa_value;
}

const duet__cpu_ops_t *duet__cpu_ops(duet__mm_isa_t isa)
{
    if (isa > duet__mm_isa_detect()) /* never run instructions the CPU lacks */
        isa = duet__mm_isa_detect();
    switch (isa) {
#if DUET__MM_X86
    case DUET__MM_ISA_AVX512:
        return &duet__cpu_ops_avx512;
    case DUET__MM_ISA_AVX2:
        return &duet__cpu_ops_avx2;
#else
    case DUET__MM_ISA_AVX512:
    case DUET__MM_ISA_AVX2:
#endif
    case DUET__MM_ISA_GENERIC:
        break;
    }
    return &duet__cpu_ops_generic;
}

size_t duet__attn_scratch_bytes(int rows, int hd)
{
    size_t rp = ((size_t)rows + 15) & ~(size_t)15; /* rows rounded up to the widest vector */
    /* the wide kernel's buffers; the narrow one needs less, with its head
     * dims rounded up to 16 and 5 lane vectors (covered by the +64) */
    return ((2u * (size_t)hd + DUET__ATTN_KB + 4u) * rp + 64u) * sizeof(float);
}
