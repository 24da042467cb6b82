"""Priority scheduling (``--system vllm-v1 --scheduling-policy priority``: sim/core/sched/policy_priority.py
and what scheduler_v1.py does around its victim), pinned by tiny runs worked out by hand.

Pools of a few blocks of 4 slots (OPT-13B); a lower ``priority`` is served first. Each test
says, step by step, what vLLM 0.33.0's scheduler does; the records or the core's state must say
the same. Where FCFS would do otherwise, the test says what it would do, so that the test fails
if the policy's rule falls back to FCFS's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.sched import lifecycle, scheduler_v1
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import PagesimWarning
from pagesim.sim.run import initial_state, run_simulation

from tests.sim.helpers import OPT13B_SLOT
from pagesim.sim.core.sched.scheduler_v1 import LAST_SCHEDULE_S

# the FCFS runs beside the priority ones read the same traces: their warning is tested apart
pytestmark = pytest.mark.filterwarnings("ignore:.*first come first served, whatever their priority")

schedule_running_v1 = interpreted(scheduler_v1.schedule_running)
admit_waiting_v1 = interpreted(scheduler_v1.admit_waiting)
abort_timed_out = interpreted(scheduler_v1.abort_timed_out)
add_arrival = interpreted(lifecycle.add_arrival)


def v1(slots: int, policy: str = "priority", **settings) -> SimConfig:
    """vllm-v1 with a pool of exactly ``slots`` token slots in blocks of 4, every iteration checked
    (``--check``, which also checks the waiting queue's order), priced by the roofline, without
    async scheduling unless asked (as tests/sim/core/test_vllm_v1.py's)."""
    settings.setdefault("async_scheduling", False)
    settings.setdefault("max_num_seqs", 4)
    return SimConfig.for_system("vllm-v1", model="opt-13b", gpu="a100-40gb", kv_gib=slots * OPT13B_SLOT / 2**30,
                                block_size=4, max_seq_len=slots, check=True, cost_model="roofline",
                                scheduling_policy=policy, **settings)


def trace(*rows) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens, priority)."""
    arrival, prompt, output, priority = zip(*rows)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [float(a) for a in arrival],
                         "prompt_tokens": list(prompt), "output_tokens": list(output),
                         "priority": np.array(priority, dtype=np.int64)})


def column(result, name):
    return result.steps[name].tolist()


def test_waiting_requests_are_served_by_priority_then_arrival():
    """A (priority 1), B (0) and C (1) arrive together, prompts 4, outputs 1, a budget of 4
    tokens: one prompt a step. By (priority, arrival): B, then A, then C. (FCFS: A, B, C.)"""
    rows = ((0, 4, 1, 1), (0, 4, 1, 0), (0, 4, 1, 1))
    result = run_simulation(v1(64, max_num_batched_tokens=4), trace(*rows))
    first = result.requests["first_token_s"].to_numpy()
    assert list(np.argsort(first)) == [1, 0, 2]
    fcfs = run_simulation(v1(64, "fcfs", max_num_batched_tokens=4), trace(*rows))
    assert list(np.argsort(fcfs.requests["first_token_s"].to_numpy())) == [0, 1, 2]


def test_the_victim_is_the_largest_priority_and_gives_back_what_it_was_scheduled():
    """3 blocks of 4. B (priority 2, prompt 4, output 4) arrives first; A (priority 0) and C
    (priority 1), prompts 4 and outputs 3, arrive during B's first step.

    step 0  B admitted: 1 block, its first token; 2 blocks free
    step 1  B decodes (5 tokens: a 2nd block). Waiting, by priority: A, C. A is admitted (1
            block, its first token); C does not fit the 0 blocks left. Running: B, A
    step 2  B decodes into its 2nd block (6 tokens). A's 5th token needs a block, none is
            free: the victim is the largest (priority, arrival), B, scheduled before A in
            this step: its token goes back to the budget and it is preempted (2 blocks free).
            A takes one and decodes, alone. (FCFS: A, the last running, preempts itself and B
            decodes.) Waiting, by priority: C, then B (it rejoins by its key, not at the front)
    step 3  A decodes its 3rd token (done). C is admitted (1 block, its first token); B (4 + 2
            generated = 6 tokens, 2 blocks) does not fit the 0 left
    step 4  C decodes (a 2nd block, A's freed); B still does not fit the 1 free block
    step 5  C decodes its 3rd token (done)
    step 6  B is admitted: 6 tokens recomputed, its 3rd token
    step 7  B decodes its 4th token (done)

    (FCFS: A preempts itself in step 2 and B runs on; A, back at the queue's front, and C come
    in when B is done, and C, the last, preempts itself at its 5th token: preemptions 0, 1, 1.)
    """
    rows = ((0, 4, 4, 2), (1e-9, 4, 3, 0), (1e-9, 4, 3, 1))
    result = run_simulation(v1(12), trace(*rows))
    assert result.requests["preemptions"].tolist() == [1, 0, 0]
    assert column(result, "num_prefill_tokens") == [4, 4, 0, 4, 0, 0, 6, 0]
    assert column(result, "num_decode_tokens") == [0, 1, 1, 1, 1, 1, 0, 1]
    assert column(result, "num_waiting") == [0, 1, 2, 1, 1, 1, 0, 0]
    assert result.summary["completed"] == 3
    fcfs = run_simulation(v1(12, "fcfs"), trace(*rows))
    assert fcfs.requests["preemptions"].tolist() == [0, 1, 1]


def admitted(s, i, computed, decoding):
    """Request ``i`` runs, holding the blocks of its first ``computed`` prompt tokens (all
    computed); ``decoding``: its prompt was whole and its first token is out."""
    c = s.count
    lifecycle.take_waiting(s, [lifecycle.waiting_at(s, p) for p in range(c[state.WAITING_LEN])].index(i))
    kv_cache.allocate(s, i, 0, 0)
    kv_cache.grow(s, i, computed)
    lifecycle.start_running(s, i)
    kv_cache.compute_tokens(s, i, computed, s.config[state.FAMILY_TRAITS])
    s.num_prompt_computed[i] = computed
    if decoding:
        s.num_generated[i] = 1
        s.in_decode[i] = 1
        c[state.DECODE_SET_SIZE] += 1


def three_running(policy):
    """4 blocks of 4, a budget of 16; running in this order: X (priority 0) decoding, 1 block of
    4 tokens; V (priority 3), 4 of its 12 prompt tokens in 1 block; Y (priority 1) decoding, 1
    block of 4. One block free."""
    s = initial_state(v1(16, policy, max_num_batched_tokens=16), trace((0, 4, 5, 0), (0, 12, 1, 3), (0, 4, 5, 1)))
    X, V, Y = 0, 1, 2
    for i in (X, V, Y):
        add_arrival(s, i)
    for i, computed, decoding in ((X, 4, True), (V, 4, False), (Y, 4, True)):
        admitted(s, i, computed, decoding)
    assert kv_cache.num_free_blocks(s) == 1
    return s


def test_a_request_that_preempts_itself_lets_the_requests_after_it_run():
    """X's 5th token takes the free block. V's next 8 prompt tokens need 2 blocks, none is free:
    the victim is V itself (priority 3); its block comes free and the running list goes on after
    it (scheduler.py:982-992): Y's 5th token takes that block. X and Y decode; the budget lost
    only their 2 tokens."""
    s = three_running("priority")
    budget, preempted, context, _ = schedule_running_v1(s)
    assert preempted and s.num_preemptions.tolist() == [0, 1, 0]
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [0, 2]
    assert s.count[state.STEP_DECODE_SEQS] == 2 and budget == 14 and context == 5 + 5


def test_fcfs_preempts_the_last_running_request_first():
    """The same state under FCFS: V's tokens preempt the last running request, Y (1 block
    free: still not the 2 V needs), then V itself; only X decodes."""
    s = three_running("fcfs")
    budget, preempted, context, _ = schedule_running_v1(s)
    assert s.num_preemptions.tolist() == [0, 1, 1]
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [0]
    assert s.count[state.STEP_DECODE_SEQS] == 1 and budget == 15 and context == 5


def test_a_victim_scheduled_earlier_gives_back_its_prefill_chunk():
    """4 blocks of 4, a budget of 16; running: P (priority 2) with 4 of its 8 prompt tokens in
    1 block, then Q (priority 0) decoding, 8 tokens in 2 full blocks. One block free.
    P's last 4 prompt tokens take the free block (a chunk of 4 in the step). Q's 9th token
    needs a block, none is free: the victim is P, scheduled before Q in this step: its chunk
    leaves the step and its 4 tokens go back to the budget (scheduler.py:944-966); P is
    preempted (2 blocks free) and Q decodes. (FCFS: Q, the last, preempts itself and P's chunk
    stays.)"""
    for policy, prefill, decode, left in (("priority", 0, 1, 15), ("fcfs", 4, 0, 12)):
        s = initial_state(v1(16, policy, max_num_batched_tokens=16), trace((0, 8, 1, 2), (0, 8, 5, 0)))
        P, Q = 0, 1
        for i in (P, Q):
            add_arrival(s, i)
        admitted(s, P, 4, False)
        admitted(s, Q, 8, True)
        budget, preempted, context, _ = schedule_running_v1(s)
        assert preempted, policy
        assert s.count[state.STEP_PREFILL_TOKENS] == prefill and s.count[state.STEP_PREFILL_SEQS] == int(prefill > 0)
        assert s.count[state.STEP_DECODE_SEQS] == decode and budget == left, policy
    assert context == 0 and s.num_preemptions.tolist() == [0, 1]


def test_unschedule_takes_a_chunk_out_of_the_step_keeping_the_others_order():
    """Three chunks in the step (rows 0, 1, 2 with 3, 5, 7 tokens): taking row 1's out leaves
    rows 0 and 2 in order, 10 tokens, and gives back 5; a decoding request gives back 1 token
    and its context."""
    s = initial_state(v1(64), trace((0, 8, 2, 0), (0, 8, 2, 0), (0, 8, 2, 0), (0, 8, 2, 0)))
    c = s.count
    s.step_prefill_ids[:3] = [0, 1, 2]
    s.step_prefill_tokens[:3] = [3, 5, 7]
    s.step_prefill_context[:3] = [3, 5, 7]
    c[state.STEP_PREFILL_SEQS], c[state.STEP_PREFILL_TOKENS] = 3, 15
    unschedule = interpreted(scheduler_v1.unschedule)
    assert unschedule(s, 1) == (5, 0)
    assert s.step_prefill_ids[:2].tolist() == [0, 2] and s.step_prefill_context[:2].tolist() == [3, 7]
    assert c[state.STEP_PREFILL_SEQS] == 2 and c[state.STEP_PREFILL_TOKENS] == 10
    s.num_computed_tokens[3] = 9
    assert unschedule(s, 3) == (1, 9)


def test_a_returning_request_rejoins_by_its_key_and_arrivals_are_placed_among_the_waiting():
    """Waiting: W1 (priority 1, arrived 0), W3 (3, 0). A preempted R (priority 2, arrived 0)
    goes between them, not to the front; N (priority 1, arrived 1) after W1, its equal in
    priority but earlier; M (priority 0, arrived 2) first. The queue: M, W1, N, R, W3 (FCFS:
    R at the front, then in arrival order)."""
    rows = ((0, 4, 2, 1), (0, 4, 2, 3), (0, 4, 2, 2), (1, 4, 2, 1), (2, 4, 2, 0))
    W1, W3, R, N, M = range(5)
    for policy, want in (("priority", [M, W1, N, R, W3]), ("fcfs", [R, W1, W3, N, M])):
        s = initial_state(v1(64, policy), trace(*rows))
        for i in (W1, W3, R):
            add_arrival(s, i)
        admitted(s, R, 4, True)
        interpreted(lifecycle.preempt)(s, 0, s.config[state.FAMILY_TRAITS])
        add_arrival(s, N)
        add_arrival(s, M)
        assert [lifecycle.waiting_at(s, p) for p in range(s.count[state.WAITING_LEN])] == want, policy


def test_a_victim_scheduled_earlier_gives_back_its_decode_token_and_context():
    """3 blocks of 4, a budget of 16; running: B (priority 2) decoding, 5 tokens in 2 blocks,
    then A (priority 0) decoding, 4 tokens in 1 block. None free. B's 6th token needs no block
    (context 6); A's 5th needs one: the victim is B, scheduled before A: its token and its
    context 6 leave the step, and A decodes in B's freed blocks. The step: 1 decode, context 5."""
    s = initial_state(v1(12, max_num_batched_tokens=16), trace((0, 5, 4, 2), (0, 4, 4, 0)))
    B, A = 0, 1
    for i in (B, A):
        add_arrival(s, i)
    admitted(s, B, 5, True)
    admitted(s, A, 4, True)
    assert kv_cache.num_free_blocks(s) == 0
    budget, preempted, context, _ = schedule_running_v1(s)
    assert preempted and s.num_preemptions.tolist() == [1, 0]
    assert s.count[state.STEP_DECODE_SEQS] == 1 and budget == 15 and context == 5


def test_under_async_scheduling_a_later_arrival_of_higher_priority_is_not_seen_yet():
    """Async scheduling, a step in flight: L (priority 1) arrived before the last scheduling
    decision, H (priority 0) after it. H heads the queue but is not in vLLM's queue yet; L is
    admitted (a queue read as FCFS's would stop at H and admit nobody)."""
    s = initial_state(v1(64, async_scheduling=True), trace((0, 4, 3, 0), (0, 4, 3, 1), (2, 4, 3, 0)))
    RUN, L, H = 0, 1, 2
    for i in (RUN, L):
        add_arrival(s, i)
    admitted(s, RUN, 4, True)
    s.clock[LAST_SCHEDULE_S] = 1.0
    add_arrival(s, H)
    assert lifecycle.waiting_at(s, 0) == H
    admit_waiting_v1(s, 100)
    assert s.status[L] == state.RUNNING and s.status[H] == state.WAITING


def test_a_client_timeout_aborts_waiting_requests_wherever_they_stand():
    """--client-timeout 5 at t = 6: waiting by priority: F (priority 0, sent at 3), T (priority
    1, sent at 0). T, behind F, has waited 6 s: aborted; F stays."""
    s = initial_state(v1(64, client_timeout_s=5.0), trace((0, 4, 3, 1), (3, 4, 3, 0)))
    T, F = 0, 1
    for i in (T, F):
        add_arrival(s, i)
    s.clock[state.NOW] = 6.0
    abort_timed_out(s)
    assert s.status[T] == state.REJECTED and s.reject_code[T] == state.REJECT_CLIENT_TIMEOUT
    assert [lifecycle.waiting_at(s, p) for p in range(s.count[state.WAITING_LEN])] == [F]


def test_the_policy_is_vllm_v1s_only(capsys):
    """A system other than vllm-v1 refuses the flag in one line (exit 2)."""
    assert main(["simulate", "--system", "vllm", "--scheduling-policy", "priority", "--num-requests", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheduling_policy='priority' applies to the vllm-v1 scheduler" in err[0]


def write_csv(tmp_path, priorities) -> str:
    path = tmp_path / "trace.csv"
    lines = ["request_id,arrival_s,prompt_tokens,output_tokens,priority"]
    lines += [f"r{i},{i * 0.01},64,8,{p}" for i, p in enumerate(priorities)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_trace_file_carries_priorities_to_the_scheduler(tmp_path, capsys):
    """A canonical CSV's priority column, negative values too, reaches the run: the request of
    priority -1 sent last is the first to finish its prompt among those waiting together."""
    path = write_csv(tmp_path, [3, 3, 3, -1])
    out = tmp_path / "out"
    assert main(["simulate", "--trace", path, "--system", "vllm-v1", "--scheduling-policy", "priority",
                 "--max-num-seqs", "1", "--max-num-batched-tokens", "64", "--out", str(out)]) == 0
    requests = pd.read_csv(next(out.glob("**/*requests*.csv")))
    order = requests.sort_values("first_token_s")["request_id"].tolist()
    assert order[:2] == ["r0", "r3"]  # r0 runs alone before the rest arrive; then r3 jumps the queue


def test_a_priority_that_is_not_a_whole_number_is_refused_naming_its_row(tmp_path, capsys):
    path = write_csv(tmp_path, [0, "high", 1])
    assert main(["simulate", "--trace", path, "--system", "vllm-v1", "--scheduling-policy", "priority"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row 2" in err[0] and "priority" in err[0] and "high" in err[0]


def test_priorities_under_fcfs_are_warned_about(tmp_path):
    path = write_csv(tmp_path, [0, 2, 1])
    with pytest.warns(PagesimWarning, match="first come first served, whatever their priority"):
        assert main(["simulate", "--trace", path, "--system", "vllm-v1", "--no-steps"]) == 0


def test_a_victim_leaves_the_running_list_the_rest_in_admission_order():
    """Running W, X, Y, Z; preempting X (a priority victim need not be the last) leaves W, Y, Z
    in that order (vLLM: ``del self.running[victim_index]``), and X waits."""
    s = initial_state(v1(64), trace(*((0, 4, 3, 0),) * 4))
    for i in range(4):
        add_arrival(s, i)
    for i in range(4):
        admitted(s, i, 4, True)
    assert interpreted(lifecycle.preempt)(s, 1, s.config[state.FAMILY_TRAITS]) == 1
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [0, 2, 3] and s.status[1] == state.WAITING


def test_the_summary_and_the_records_break_latency_down_by_priority():
    """Worked from the run above (test_the_victim_is_...): steps end at t1..t8; B (priority 2)
    finishes at step 7's end after 1 preemption, A (0) at step 3's, C (1) at step 5's. Each level
    has one request: its mean and p99 are its own latency; the records carry the column."""
    rows = ((0, 4, 4, 2), (1e-9, 4, 3, 0), (1e-9, 4, 3, 1))
    result = run_simulation(v1(12), trace(*rows))
    requests = result.requests
    levels = result.summary["by_priority"]
    assert [level["priority"] for level in levels] == [0, 1, 2]
    assert [level["preemptions"] for level in levels] == [0, 0, 1]
    for level, row in zip(levels, (1, 2, 0)):
        assert level["requests"] == level["completed"] == 1
        assert level["mean_e2el_ms"] == pytest.approx(requests["e2el_s"][row] * 1e3)
        assert level["p99_ttft_ms"] == pytest.approx(requests["ttft_s"][row] * 1e3)
    assert requests["priority"].tolist() == [2, 0, 1]


def test_priority_weights_draw_each_requests_level_seeded():
    """--priority-weights 1,3: about a quarter of the requests at priority 0, the same draw for
    the same seed, another for another seed."""
    from pagesim.traces.synth import make_workload
    from pagesim.traces.transform import draw_priorities
    df = make_workload("sharegpt", 10.0, num_requests=4000, seed=0)
    first, again, other = (draw_priorities(df, (1, 3), seed=k) for k in (0, 0, 1))
    assert (first["priority"] == again["priority"]).all() and not (first["priority"] == other["priority"]).all()
    assert set(first["priority"]) == {0, 1} and 0.23 < (first["priority"] == 0).mean() < 0.27
