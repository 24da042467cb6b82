/* sim._replay: the compiled replay of the vLLM default configuration (and chunked prefill, swap).
 *
 * The Python engine (sim/engine.py, sim/sched/continuous.py, sim/memory/paged.py,
 * sim/cost.py) is the specification; this file re-states, step by step, what it does for
 * one configuration and nothing else:
 *
 *     continuous scheduler, prefill-first or chunked prefill, preemption by recompute or
 *     swap, no waiting_served_ratio; paged manager (any block size) without prefix caching;
 *     every request one sequence (n = beam_width = 1); the roofline cost model.
 *
 * sim/compiled.py decides eligibility and falls back to Python for everything else.
 * tests/sim/test_compiled.py compares the two engines' request records, step tables and
 * summaries on random traces (integers and times identical; running sums within float
 * summation order).
 *
 * Why it can be small: with private blocks only (no fork, no prefix hit) a sequence's
 * blocks hold exactly its L computed tokens and min(F, nb * block_size) demand, so the
 * manager is four counters plus (L, nb, F) per request; block ids never reach an output.
 * Time follows SimPy exactly: two processes (arrivals, engine) whose timeouts are ordered by
 * (time, creation order), a wake event when the engine sleeps, and time sums in the same
 * order (now + dt). Floating-point expressions are the cost model's, operation by
 * operation; FP contraction (FMA) is off so each rounds as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* built with -ffp-contract=off (setup.py): no fused multiply-add may change a rounding */

enum { ST_WAITING = 1, ST_RUNNING = 2, ST_SWAPPED = 3, ST_FINISHED = 4, ST_REJECTED = 5 };
enum { REJ_BATCHED = 1, REJ_NEVER = 2 };
enum { BLK_NONE = 0, BLK_MEMORY = 1, BLK_FULL = 2 };
enum { ERR_NONE = 0, ERR_DT = 2, ERR_EMPTY_POOL = 3, ERR_PY = 4, ERR_STALL = 5 };  /* ERR_PY: a Python exception is set */

/* int64 parameters, in this order (sim/compiled.py builds the array) */
enum { P_N, P_BS, P_NBLOCKS, P_LEFTOVER, P_WM, P_MAXSEQ, P_MAXSEQS, P_MAXBATCHED, P_KEEPROWS,
       P_PROGRESS_EVERY, P_CHUNKED, P_CHUNK_BUDGET, P_SWAP, P_SWAP_CAPACITY, P_NPARAMS };
/* float64 parameters: the roofline model's constants (RooflineCostModel) */
enum { C_OVERHEAD, C_PERSEQ, C_LINFPT, C_FLOPS, C_LINWT, C_ARFIXED, C_ARTPT, C_KVBPT, C_BW,
       C_ATTNCOEF, C_ATTNFLOPS, C_PCIEBW, C_NPARAMS };

#define ROW_F 2   /* start_s, dt_s */
#define ROW_I 13  /* batch, prefill, decode, waiting, running, 6 memory categories, used, logical */

typedef struct {
    /* configuration */
    int64_t n, bs, nblocks, leftover, wm, maxseq, maxseqs, maxbatched, keep_rows, progress_every;
    int64_t chunked, chunk_budget, swap, swap_capacity;
    const double *c;
    const double *arrival, *edges;
    const int64_t *prompt, *output;
    int64_t nedges;
    /* per-request state (the RequestTable's columns, written in place) */
    int8_t *status, *reject;
    int64_t *gen, *pref, *target, *preempt;
    double *first, *finish, *last;
    /* per-request memory: computed tokens, blocks, final length; in the decode set (prefill done) */
    int64_t *L, *nb, *F;
    int8_t *dec;
    int64_t ndecset; /* how many are in the decode set */
    /* the waiting and swapped queues (rings), the running list (admission order) */
    int64_t *wq, wcap, whead, wlen;
    int64_t *sq, shead, slen, *swap_len, swap_used, swap_fallbacks;
    int64_t *run, nrun;
    /* the manager's counters */
    int64_t used, tokens, demand, logical, allocations, frees;
    /* the scheduler's */
    int64_t free_epoch, blk_req, blk_epoch, num_preempt, num_rejected;
    int blk_kind, dw;
    /* this iteration's batch: prefilling requests and their new tokens (a whole prompt, or a
     * chunk), decoding requests */
    int64_t *pre_ids, *pre_tok, npre, pre_tokens, ndec, swap_in, swap_out;
    int64_t *done; /* requests finishing this iteration */
    /* records */
    PyObject *rf_obj, *ri_obj; /* the rows, in bytearrays numpy then reads in place (no copy) */
    double *rf;
    int64_t *ri, nrows, caprows;
    double busy, idle, mem_sum[6], blk_sum[2], running_w;
    int64_t prefill_tok, decode_tok;
    double itl_sum;
    int64_t itl_count, *hist;
    /* progress */
    PyObject *progress;
    int64_t finished_total, finished_reported;
} Core;

/* ---- the waiting queue ------------------------------------------------------------ */
static void wq_push_back(Core *s, int64_t i) { s->wq[(s->whead + s->wlen) % s->wcap] = i; s->wlen++; }
static void wq_push_front(Core *s, int64_t i) { s->whead = (s->whead + s->wcap - 1) % s->wcap; s->wq[s->whead] = i; s->wlen++; }
static int64_t wq_front(Core *s) { return s->wq[s->whead]; }
static void wq_pop_front(Core *s) { s->whead = (s->whead + 1) % s->wcap; s->wlen--; }
static void sq_push_back(Core *s, int64_t i) { s->sq[(s->shead + s->slen) % s->wcap] = i; s->slen++; }
static void sq_pop_front(Core *s) { s->shead = (s->shead + 1) % s->wcap; s->slen--; }

/* ---- the manager (PagedManager with private blocks) ------------------------------------ */
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void mgr_free(Core *s, int64_t i) {
    s->used -= s->nb[i];
    s->logical -= s->nb[i];
    s->tokens -= s->L[i];
    s->demand -= min64(s->F[i], s->nb[i] * s->bs);
    s->L[i] = s->nb[i] = 0;
    s->frees++;
}

/* ---- the cost model (RooflineCostModel.step_time, the same operations in order) ------- */
static double linear_time(const double *c, int64_t tokens) {
    double a = (double)tokens * c[C_LINFPT] / c[C_FLOPS];
    double b = c[C_LINWT];
    return b > a ? b : a; /* Python's max(a, b) */
}

static double step_time(Core *s, int64_t ctx_sum) {
    const double *c = s->c;
    int64_t tokens = s->pre_tokens + s->ndec;
    double t = c[C_OVERHEAD] + c[C_PERSEQ] * (double)(s->npre + s->ndec);
    if (tokens) {
        t += linear_time(c, tokens);
        t += c[C_ARFIXED] + c[C_ARTPT] * (double)tokens;
    }
    if (ctx_sum)
        t += (double)ctx_sum * c[C_KVBPT] / c[C_BW];
    if (s->npre) {
        /* n new tokens after b computed ones: sum(n * (b + n * 0.5)) adds multiples of 0.5 far
         * below 2**52, so every product and partial sum is exact: the same double in any
         * order, as numpy's dot gives it */
        double dot = 0.0;
        int64_t before = 0;
        for (int64_t k = 0; k < s->npre; k++) {
            int64_t n = s->pre_tok[k], b = s->pref[s->pre_ids[k]] - n;
            dot += (double)n * ((double)b + (double)n * 0.5);
            before += b;
        }
        double flops = c[C_ATTNCOEF] * dot;
        t += flops / c[C_ATTNFLOPS] + (double)before * c[C_KVBPT] / c[C_BW];
    }
    int64_t swapped = s->swap_in + s->swap_out;
    if (swapped)
        t += (double)swapped * c[C_KVBPT] / c[C_PCIEBW];
    return t;
}

/* ---- records ------------------------------------------------------------------------- */
static int record(Core *s, double start, double dt) {
    int64_t free_slots = (s->nblocks - s->used) * s->bs + s->leftover;
    int64_t mem[6] = {s->tokens, s->demand - s->tokens, s->used * s->bs - s->demand, 0,
                      s->dw ? free_slots : 0, s->dw ? 0 : free_slots};
    if (s->keep_rows) {
        if (s->nrows == s->caprows) {
            int64_t cap = s->caprows ? s->caprows * 2 : 4096;
            if (PyByteArray_Resize(s->rf_obj, (Py_ssize_t)(cap * ROW_F * 8)) < 0 ||
                PyByteArray_Resize(s->ri_obj, (Py_ssize_t)(cap * ROW_I * 8)) < 0)
                return -1;  /* MemoryError set */
            s->rf = (double *)PyByteArray_AS_STRING(s->rf_obj);
            s->ri = (int64_t *)PyByteArray_AS_STRING(s->ri_obj);
            s->caprows = cap;
        }
        double *f = s->rf + s->nrows * ROW_F;
        int64_t *r = s->ri + s->nrows * ROW_I;
        f[0] = start;
        f[1] = dt;
        r[0] = s->npre + s->ndec;
        r[1] = s->pre_tokens;
        r[2] = s->ndec;
        r[3] = s->wlen + s->slen;
        r[4] = s->nrun;
        memcpy(r + 5, mem, sizeof mem);
        r[11] = s->used;
        r[12] = s->logical;
    } else { /* StepRecorder._sum_row, in its order */
        s->blk_sum[0] += (double)s->used * dt;
        s->blk_sum[1] += (double)s->logical * dt;
        s->busy += dt;
        for (int k = 0; k < 6; k++)
            s->mem_sum[k] = s->mem_sum[k] + (double)mem[k] * dt;
        s->running_w += (double)s->nrun * dt;
        s->prefill_tok += s->pre_tokens;
        s->decode_tok += s->ndec;
    }
    s->nrows++;
    return 0;
}

/* the histogram bin of an inter-token latency: np.searchsorted(edges, v) (side left), the
 * number of edges below v */
static int64_t itl_bin(Core *s, double v) {
    int64_t lo = 0, hi = s->nedges;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (!(s->edges[mid] >= v)) lo = mid + 1; else hi = mid;  /* NaN: past the last edge, as numpy */
    }
    return lo;
}

static void itl(Core *s, double v) {
    s->hist[itl_bin(s, v)]++;
    s->itl_sum += v;
    s->itl_count++;
}

/* ---- the scheduler (ContinuousScheduler) ---------------------------------------------------- */
static int still_blocked(Core *s) {
    if (s->blk_kind == BLK_NONE || !s->wlen || s->blk_req != wq_front(s) || s->blk_epoch != s->free_epoch) {
        s->blk_kind = BLK_NONE;
        return 0;
    }
    if (s->blk_kind == BLK_MEMORY) s->dw = 1;
    return 1;
}

/* PagedManager.allocate of ``len`` tokens' blocks for request i (no token computed yet) */
static void mgr_allocate(Core *s, int64_t i, int64_t len) {
    int64_t need = ceil_div(len, s->bs), final_len = s->prompt[i] + s->output[i];
    int64_t F = final_len > len ? final_len : len;
    s->nb[i] = need;
    s->F[i] = F;
    s->L[i] = 0;
    s->used += need;
    s->logical += need;
    s->demand += min64(F, need * s->bs);
    s->allocations++;
}

/* PagedManager.can_allocate of ``len`` tokens for request i (its watermark included) */
enum { ADMIT_OK, ADMIT_LATER, ADMIT_NEVER };
static int mgr_can_allocate(Core *s, int64_t i, int64_t len) {
    int64_t need = ceil_div(len, s->bs);
    if (s->prompt[i] + s->output[i] > s->maxseq || len > s->maxseq || need > s->nblocks - s->wm)
        return ADMIT_NEVER;
    return (s->nblocks - s->used) - need >= s->wm ? ADMIT_OK : ADMIT_LATER;
}

/* ContinuousScheduler._resume_swapped: swap requests back in, FCFS; 1 when none is left */
static int resume_swapped(Core *s) {
    while (s->slen) {
        int64_t i = s->sq[s->shead];
        if (s->nrun + 1 > s->maxseqs) return 0;
        int64_t len = s->swap_len[i];
        if (mgr_can_allocate(s, i, len) != ADMIT_OK) {
            s->dw = 1;
            return 0;
        }
        mgr_allocate(s, i, len);
        s->L[i] = len;
        s->tokens += len;
        sq_pop_front(s);
        s->swap_used -= len;
        s->swap_in += len;
        s->status[i] = ST_RUNNING;
        s->run[s->nrun++] = i;
        s->dec[i] = 1;  /* straight back into the decode set */
        s->ndecset++;
    }
    return 1;
}

/* n more prompt tokens of request i this iteration (into blocks allocated at admission) */
static void prefill(Core *s, int64_t i, int64_t n) {
    s->L[i] += n;
    s->tokens += n;
    s->pref[i] += n;
    s->pre_ids[s->npre] = i;
    s->pre_tok[s->npre++] = n;
    s->pre_tokens += n;
}

/* the queue head i can never be admitted: rejected (Python writes the reason from the code) */
static void reject_head(Core *s, int64_t i, int code) {
    wq_pop_front(s);
    s->status[i] = ST_REJECTED;
    s->reject[i] = (int8_t)code;
    s->num_rejected++;
}

/* ContinuousScheduler._admit_waiting: FCFS while the budget, max_num_seqs and memory allow.
 * Prefill-first: whole prompts within max_num_batched_tokens; chunked: a chunk of the budget */
static void admit_waiting(Core *s, int64_t budget) {
    while (s->wlen && (budget > 0 || !s->chunked)) {
        int64_t i = wq_front(s);
        int64_t target = s->target[i];
        int blocked = BLK_NONE;
        if (s->nrun + 1 > s->maxseqs) {
            blocked = BLK_FULL;
        } else if (!s->chunked && target > s->maxbatched) {
            reject_head(s, i, REJ_BATCHED);
            continue;
        } else if (!s->chunked && target > budget) {
            break;  /* this iteration's budget: no block recorded */
        } else {
            int adm = mgr_can_allocate(s, i, target);
            if (adm == ADMIT_NEVER) {
                reject_head(s, i, REJ_NEVER);
                continue;
            }
            if (adm == ADMIT_LATER) {
                s->dw = 1;
                blocked = BLK_MEMORY;
            } else {  /* admit: allocate the prompt's blocks, write this iteration's tokens */
                wq_pop_front(s);
                mgr_allocate(s, i, target);
                s->pref[i] = 0;
                s->status[i] = ST_RUNNING;
                s->run[s->nrun++] = i;
                int64_t n = s->chunked && budget < target ? budget : target;
                prefill(s, i, n);
                budget -= n;
                continue;
            }
        }
        /* memory or max_num_seqs: blocked until something is freed */
        s->blk_kind = blocked;
        s->blk_req = i;
        s->blk_epoch = s->free_epoch;
        break;
    }
}

static void preempt_last(Core *s) {
    int64_t i = s->run[--s->nrun];
    s->ndecset -= s->dec[i];
    s->dec[i] = 0;
    s->free_epoch++;
    s->preempt[i]++;
    s->num_preempt++;
    s->dw = 1;
    int64_t len = s->L[i];
    if (s->swap && s->pref[i] >= s->target[i] && s->swap_used + len <= s->swap_capacity) {
        mgr_free(s, i);  /* its K/V go to the CPU; it comes back as it was */
        s->swap_len[i] = len;
        s->swap_used += len;
        s->swap_out += len;
        s->status[i] = ST_SWAPPED;
        sq_push_back(s, i);
        return;
    }
    if (s->swap) s->swap_fallbacks++;  /* no swap space (or mid-prefill): recompute */
    mgr_free(s, i);
    if (s->gen[i] > 0) s->target[i] = s->prompt[i] + s->gen[i];  /* generated tokens become prompt */
    s->pref[i] = 0;
    s->status[i] = ST_WAITING;
    wq_push_front(s, i);
}

/* ContinuousScheduler._decode_into: make room (preempt the latest-admitted request), then one
 * token for each member of the decode set; returns their context sum */
static int64_t decode(Core *s) {
    for (;;) {
        /* at most one new block per member: with as many free blocks as members it fits */
        if (!s->ndecset || s->ndecset <= s->nblocks - s->used) break;
        int64_t crossing = 0;
        for (int64_t k = 0; k < s->nrun; k++) {
            int64_t i = s->run[k];
            crossing += s->dec[i] && s->L[i] == s->nb[i] * s->bs;
        }
        if (crossing <= s->nblocks - s->used) break;
        preempt_last(s);
    }
    int64_t ctx = 0;
    for (int64_t k = 0; k < s->nrun; k++) {
        int64_t i = s->run[k];
        if (!s->dec[i]) continue;
        if (s->L[i] == s->nb[i] * s->bs) {  /* a block boundary: a fresh block */
            int64_t d = s->F[i] - s->L[i];
            s->demand += d < s->bs ? d : s->bs;
            s->nb[i]++;
            s->used++;
            s->logical++;
        }
        s->L[i]++;  /* stays below F: a member has generated fewer than its output tokens */
        ctx += s->L[i];
    }
    s->tokens += s->ndecset;
    s->ndec = s->ndecset;
    return ctx;
}

/* ContinuousScheduler.schedule: one iteration's memory operations; returns the decode context sum */
static int64_t schedule(Core *s) {
    s->dw = 0;
    s->npre = s->pre_tokens = s->ndec = s->swap_in = s->swap_out = 0;
    /* swapped requests first; while any stays swapped nobody new is admitted (and the blocked
     * head's shortcut is not even looked at, as Python's `and` short-circuits) */
    int all_resumed = resume_swapped(s);
    if (!s->chunked) {  /* prefill-first: new prompts only, else decode */
        if (all_resumed && !still_blocked(s)) admit_waiting(s, s->maxbatched);
        return s->npre ? 0 : decode(s);
    }
    /* chunked prefill: decode first, then ongoing prefills, then new prompts, in the budget */
    int64_t ctx = decode(s);
    int64_t budget = s->chunk_budget - s->ndec;
    for (int64_t k = 0; k < s->nrun && budget > 0; k++) {
        int64_t i = s->run[k];
        int64_t todo = s->target[i] - s->pref[i];
        if (todo > 0) {
            int64_t n = todo < budget ? todo : budget;
            prefill(s, i, n);
            budget -= n;
        }
    }
    if (all_resumed && !still_blocked(s)) admit_waiting(s, budget);
    return ctx;
}

/* ContinuousScheduler.complete_step */
static void complete_step(Core *s, double now) {
    int64_t ndone = 0;
    if (s->ndec) {
        /* most members got their last token at the same time (the last decode step): one
         * latency, one bin lookup for the run of them */
        double prev = NAN, v = 0.0;
        int64_t bin = 0;
        for (int64_t k = 0; k < s->nrun; k++) {
            int64_t i = s->run[k];
            if (!s->dec[i]) continue;
            if (s->last[i] != prev) {
                prev = s->last[i];
                v = now - prev;
                bin = itl_bin(s, v);
            }
            s->hist[bin]++;
            s->itl_sum += v;
            s->itl_count++;
            s->last[i] = now;
            if (++s->gen[i] >= s->output[i]) s->done[ndone++] = i;
        }
    }
    for (int64_t k = 0; k < s->npre; k++) {
        int64_t i = s->pre_ids[k];
        if (s->pref[i] < s->target[i]) continue;  /* a chunk, not the prompt's last */
        s->gen[i]++;
        if (isnan(s->first[i])) s->first[i] = now;
        else itl(s, now - s->last[i]);  /* a recompute: the gap since its last token */
        s->last[i] = now;
        if (s->gen[i] >= s->output[i]) s->done[ndone++] = i;
        else { s->dec[i] = 1; s->ndecset++; }  /* joins the decode set */
    }
    if (!ndone) return;
    for (int64_t k = 0; k < ndone; k++) {
        int64_t i = s->done[k];
        s->free_epoch++;
        mgr_free(s, i);
        s->ndecset -= s->dec[i];
        s->dec[i] = 0;
        s->status[i] = ST_FINISHED;
        s->finish[i] = now;
    }
    int64_t w = 0;  /* drop them from the running list, keeping admission order */
    for (int64_t k = 0; k < s->nrun; k++) {
        int64_t i = s->run[k];
        if (s->status[i] != ST_FINISHED) s->run[w++] = i;
    }
    s->nrun = w;
    s->finished_total += ndone;
}

/* ---- time: SimPy's two processes -------------------------------------------------- */
typedef struct {
    int pending;
    double t;
    uint64_t eid;
} Pending;

static int run_core(Core *s, double *end_s) {
    uint64_t eid = 2;  /* 0 and 1: the two processes' Initialize events */
    double now = 0.0, idle_from = 0.0;
    int64_t ai = 0;
    int arrivals_done = 0, idle = 0, wake_triggered = 0, in_step = 0;
    uint64_t polls = 0;
    Pending arr = {0, 0.0, 0}, eng = {0, 0.0, 0};

#define WAKE_CHECK()                                              \
    do {                                                          \
        if (idle && !wake_triggered) {                            \
            wake_triggered = 1;                                   \
            eng.pending = 1; eng.t = now; eng.eid = eid++;        \
        }                                                         \
    } while (0)

/* the arrivals process from its current position to its next yield */
#define ARRIVALS()                                                \
    do {                                                          \
        for (;;) {                                                \
            if (ai >= s->n) { arrivals_done = 1; WAKE_CHECK(); break; } \
            double at = s->arrival[ai];                           \
            if (at > now) { arr.pending = 1; arr.t = now + (at - now); arr.eid = eid++; break; } \
            s->status[ai] = ST_WAITING; wq_push_back(s, ai); ai++; \
            WAKE_CHECK();                                         \
        }                                                         \
    } while (0)

    ARRIVALS();
    int started = 0;
    for (;;) {
        if (started) {
            /* the next event: earliest time, then creation order (SimPy's heap) */
            int take_arr;
            if (arr.pending && eng.pending)
                take_arr = arr.t < eng.t || (arr.t == eng.t && arr.eid < eng.eid);
            else if (arr.pending)
                take_arr = 1;
            else if (eng.pending)
                take_arr = 0;
            else
                break;
            if (take_arr) {
                arr.pending = 0;
                now = arr.t;
                s->status[ai] = ST_WAITING;
                wq_push_back(s, ai);
                ai++;
                WAKE_CHECK();
                ARRIVALS();
                continue;
            }
            eng.pending = 0;
            now = eng.t;
            if (!(++polls & 4095) && PyErr_CheckSignals() < 0) return ERR_PY;  /* Ctrl-C */
            if (in_step) {
                complete_step(s, now);
                in_step = 0;
                if (s->progress && s->finished_total - s->finished_reported >= s->progress_every) {
                    PyObject *r = PyObject_CallFunction(s->progress, "L", (long long)(s->finished_total - s->finished_reported));
                    if (!r) return ERR_PY;
                    Py_DECREF(r);
                    s->finished_reported = s->finished_total;
                }
            } else {  /* woken from idle */
                idle = 0;
                s->idle += now - idle_from;
            }
        }
        started = 1;
        /* the engine process's loop body, up to its next yield */
        int64_t ctx = schedule(s);
        if (!s->npre && !s->ndec && !s->swap_in && !s->swap_out) {
            if (arrivals_done && !s->wlen && !s->nrun && !s->slen) {
                *end_s = now;
                return ERR_NONE;
            }
            if (!s->nrun && s->slen && arrivals_done && !s->wlen) return ERR_STALL;
            if (!s->nrun && s->wlen && s->dw) return ERR_EMPTY_POOL;
            idle = 1;
            wake_triggered = 0;
            idle_from = now;
            continue;
        }
        double dt = step_time(s, ctx);
        if (!(dt > 0)) return ERR_DT;
        if (record(s, now, dt)) return ERR_PY;
        eng.pending = 1;
        eng.t = now + dt;
        eng.eid = eid++;
        in_step = 1;
    }
    *end_s = now;  /* not reached: the engine ends the run */
    return ERR_NONE;
#undef ARRIVALS
#undef WAKE_CHECK
}

/* ---- the Python entry point ---------------------------------------------------------- */
static int get_buf(PyObject *o, Py_buffer *b, int writable, Py_ssize_t itemsize, Py_ssize_t n, const char *name) {
    if (PyObject_GetBuffer(o, b, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (b->itemsize != itemsize || (n >= 0 && b->len != n * itemsize)) {
        PyErr_Format(PyExc_ValueError, "_replay: %s has the wrong item size or length", name);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *replay(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[16], *progress;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &progress))
        return NULL;
    /* params, cost, arrival, prompt, output, edges, then the outputs: status, reject, generated,
     * prefilled, target, preemptions, first_token_s, finish_s, last_token_s, itl_hist */
    Py_buffer b[16];
    memset(b, 0, sizeof b);
    int nb = 0;
    PyObject *result = NULL;
    Core s;
    memset(&s, 0, sizeof s);
#define GET(k, w, size, cnt, name) do { if (get_buf(o[k], &b[k], w, size, cnt, name) < 0) goto done; nb = k + 1; } while (0)
    GET(0, 0, 8, P_NPARAMS, "params");
    const int64_t *p = b[0].buf;
    int64_t n = p[P_N];
    GET(1, 0, 8, C_NPARAMS, "cost");
    GET(2, 0, 8, n, "arrival");
    GET(3, 0, 8, n, "prompt");
    GET(4, 0, 8, n, "output");
    GET(5, 0, 8, -1, "edges");
    GET(6, 1, 1, n, "status");
    GET(7, 1, 1, n, "reject");
    GET(8, 1, 8, n, "generated");
    GET(9, 1, 8, n, "prefilled");
    GET(10, 1, 8, n, "target");
    GET(11, 1, 8, n, "preemptions");
    GET(12, 1, 8, n, "first_token_s");
    GET(13, 1, 8, n, "finish_s");
    GET(14, 1, 8, n, "last_token_s");
    GET(15, 1, 8, b[5].len / 8 + 1, "itl_hist");
#undef GET
    s.n = n; s.bs = p[P_BS]; s.nblocks = p[P_NBLOCKS]; s.leftover = p[P_LEFTOVER]; s.wm = p[P_WM];
    s.maxseq = p[P_MAXSEQ]; s.maxseqs = p[P_MAXSEQS]; s.maxbatched = p[P_MAXBATCHED];
    s.keep_rows = p[P_KEEPROWS]; s.progress_every = p[P_PROGRESS_EVERY] > 0 ? p[P_PROGRESS_EVERY] : 1;
    s.chunked = p[P_CHUNKED]; s.chunk_budget = p[P_CHUNK_BUDGET];
    s.swap = p[P_SWAP]; s.swap_capacity = p[P_SWAP_CAPACITY];
    s.c = b[1].buf; s.arrival = b[2].buf; s.prompt = b[3].buf; s.output = b[4].buf;
    s.edges = b[5].buf; s.nedges = b[5].len / 8;
    s.status = b[6].buf; s.reject = b[7].buf; s.gen = b[8].buf; s.pref = b[9].buf; s.target = b[10].buf;
    s.preempt = b[11].buf; s.first = b[12].buf; s.finish = b[13].buf; s.last = b[14].buf; s.hist = b[15].buf;
    s.progress = progress == Py_None ? NULL : progress;
    if (s.bs < 1 || s.n < 0) { PyErr_SetString(PyExc_ValueError, "_replay: bad parameters"); goto done; }
    size_t nn = (size_t)(n > 0 ? n : 1);
    s.L = calloc(nn, 8); s.nb = calloc(nn, 8); s.F = calloc(nn, 8);
    s.wq = malloc(nn * 8); s.wcap = (int64_t)nn;
    s.run = malloc(nn * 8); s.pre_ids = malloc(nn * 8); s.pre_tok = malloc(nn * 8); s.done = malloc(nn * 8);
    s.dec = calloc(nn, 1);
    s.sq = malloc(nn * 8); s.swap_len = calloc(nn, 8);
    if (!s.L || !s.nb || !s.F || !s.wq || !s.run || !s.pre_ids || !s.pre_tok || !s.done || !s.dec || !s.sq ||
        !s.swap_len) {
        PyErr_NoMemory();
        goto done;
    }
    s.rf_obj = PyByteArray_FromStringAndSize(NULL, 0);
    s.ri_obj = PyByteArray_FromStringAndSize(NULL, 0);
    if (!s.rf_obj || !s.ri_obj) goto done;

    double end_s = 0.0;
    int err = run_core(&s, &end_s);
    if (err == ERR_PY) goto done;
    if (s.progress && s.finished_total > s.finished_reported) {
        PyObject *r = PyObject_CallFunction(s.progress, "L", (long long)(s.finished_total - s.finished_reported));
        if (!r) goto done;
        Py_DECREF(r);
    }
    if (PyByteArray_Resize(s.rf_obj, (Py_ssize_t)(s.keep_rows ? s.nrows * ROW_F * 8 : 0)) < 0 ||
        PyByteArray_Resize(s.ri_obj, (Py_ssize_t)(s.keep_rows ? s.nrows * ROW_I * 8 : 0)) < 0)
        goto done;
    result = Py_BuildValue(
        "{s:i,s:d,s:d,s:d,s:L,s:L,s:L,s:d,s:(dddddd),s:(dd),s:d,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:O,s:O,s:L,s:L}",
        "error", err, "end_s", end_s, "idle_s", s.idle, "busy_s", s.busy, "num_steps", (long long)s.nrows,
        "prefill_tokens", (long long)s.prefill_tok, "decode_tokens", (long long)s.decode_tok,
        "running_weighted", s.running_w,
        "mem_sum", s.mem_sum[0], s.mem_sum[1], s.mem_sum[2], s.mem_sum[3], s.mem_sum[4], s.mem_sum[5],
        "blk_sum", s.blk_sum[0], s.blk_sum[1], "itl_sum", s.itl_sum, "itl_count", (long long)s.itl_count,
        "num_preemptions", (long long)s.num_preempt, "num_rejected", (long long)s.num_rejected,
        "allocations", (long long)s.allocations, "frees", (long long)s.frees, "used_blocks", (long long)s.used,
        "num_running", (long long)s.nrun, "rows_f", s.rf_obj, "rows_i", s.ri_obj,
        "num_swap_fallbacks", (long long)s.swap_fallbacks,
        "waiting_head", (long long)(s.wlen ? wq_front(&s) : -1));
done:
    for (int k = 0; k < nb; k++) PyBuffer_Release(&b[k]);
    free(s.L); free(s.nb); free(s.F); free(s.wq); free(s.run); free(s.pre_ids); free(s.pre_tok); free(s.done);
    free(s.dec); free(s.sq); free(s.swap_len);
    Py_XDECREF(s.rf_obj); /* the result holds its own references */
    Py_XDECREF(s.ri_obj);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", replay, METH_VARARGS,
     "replay(params, cost, arrival, prompt, output, edges, status, reject, generated, prefilled, target, "
     "preemptions, first_token_s, finish_s, last_token_s, itl_hist, progress) -> dict\n\n"
     "Run the vLLM default configuration to the end (see sim/compiled.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replay",
                                    "Compiled replay of the vLLM default configuration (see sim/compiled.py).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
