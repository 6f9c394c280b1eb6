#include "kv/heads.h"

duet_status_t duet_kv_heads_check(int n_kv_heads, int tp)
{
    if (tp < 1 || tp > DUET_TP_MAX)
        return duet_error(DUET_ERR_CONFIG, "tp %d: must be between 1 and %d", tp, DUET_TP_MAX);
    if (n_kv_heads < 1)
        return duet_error(DUET_ERR_CONFIG, "tp %d: model has %d kv heads", tp, n_kv_heads);
    if (n_kv_heads >= tp && n_kv_heads % tp != 0)
        return duet_error(DUET_ERR_CONFIG,
                          "tp %d: num_key_value_heads %d is not divisible by tp (%d kv heads >= "
                          "tp must split evenly)",
                          tp, n_kv_heads, n_kv_heads);
    if (n_kv_heads < tp && tp % n_kv_heads != 0)
        return duet_error(DUET_ERR_CONFIG,
                          "tp %d: tp is not a multiple of num_key_value_heads %d (%d kv heads < "
                          "tp are replicated on tp/kv ranks each)",
                          tp, n_kv_heads, n_kv_heads);
    return DUET_OK;
}

void duet_kv_heads_owned(int n_kv_heads, int tp, int rank, int *head0_p, int *count_p)
{
    if (n_kv_heads >= tp) {
        *count_p = n_kv_heads / tp;
        *head0_p = rank * (n_kv_heads / tp);
    } else {
        *count_p = 1;
        *head0_p = rank * n_kv_heads / tp;
    }
}

int duet_kv_heads_holders(int n_kv_heads, int tp, int h, int *rank0_p)
{
    if (n_kv_heads >= tp) {
        *rank0_p = h / (n_kv_heads / tp);
        return 1;
    }
    *rank0_p = h * (tp / n_kv_heads);
    return tp / n_kv_heads;
}
