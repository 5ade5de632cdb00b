"""Scheduler policy on hand-built sequences: slots stay compact, budget drives preemption."""

from __future__ import annotations

from asyncrl.rollout.scheduler import Scheduler, StepPlan, StepResult
from asyncrl.rollout.sequence import Sequence
from asyncrl.types import GenerationRequest, SamplingParams


def seq(rid: str, prompt_len: int, max_tokens: int = 100) -> Sequence:
    req = GenerationRequest(rid, tuple(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens))
    return Sequence.from_request(req, eos_ids=(0,))


def step(sched: Scheduler, token: int = 5) -> list[Sequence]:
    plan = sched.schedule()
    assert plan is not None
    return sched.apply(plan, StepResult([token] * plan.num_rows, [-1.0] * plan.num_rows, 0))


def test_admission_respects_slots_and_prefill_budget() -> None:
    sched = Scheduler(max_num_seqs=3, kv_budget_tokens=1000, max_prefill_tokens=10)
    for i in range(5):
        sched.add(seq(f"s{i}", prompt_len=4))
    plan = sched.schedule()
    assert plan is not None
    assert [s.request_id for s in plan.seqs] == ["s0", "s1"]  # 4 + 4 <= 10 < 12
    sched.apply(plan, StepResult([5, 5], [-1.0, -1.0], 0))
    plan = sched.schedule()
    assert plan is not None
    assert plan.decode_positions == (4, 4) and len(plan.prefill_contexts) == 1  # slots full at 3
    assert [s.slot for s in sched.running] == [0, 1, 2]


def test_admission_waits_for_min_free_slots_unless_the_queue_is_shorter() -> None:
    sched = Scheduler(max_num_seqs=4, kv_budget_tokens=1000, max_prefill_tokens=100, admit_min_free_slots=3)
    seqs = [seq(f"s{i}", prompt_len=2, max_tokens=2 + i) for i in range(7)]
    for s in seqs:
        sched.add(s)
    step(sched)  # nothing runs: admit what fits (s0..s3)
    step(sched)  # s0 finishes (max_tokens 2)
    plan = sched.schedule()  # 1 free < min(3, 3 waiting): decode only
    assert plan is not None and not plan.prefill_contexts and len(plan.decode_positions) == 3
    sched.apply(plan, StepResult([5] * 3, [-1.0] * 3, 0))  # s1 finishes
    sched.apply(_planned(sched), StepResult([5] * 2, [-1.0] * 2, 0))  # s2 finishes; 2 free < 3
    plan = sched.schedule()  # 3 free: s4, s5, s6 share one prefill
    assert plan is not None and [s.request_id for s in plan.seqs] == ["s3", "s4", "s5", "s6"]
    assert len(plan.prefill_contexts) == 3


def test_a_queue_shorter_than_min_free_slots_never_waits() -> None:
    sched = Scheduler(max_num_seqs=4, kv_budget_tokens=1000, max_prefill_tokens=100, admit_min_free_slots=8)
    assert sched.admit_min_free_slots == 4  # capped at max_num_seqs
    for i in range(3):
        sched.add(seq(f"s{i}", prompt_len=2, max_tokens=50))
    step(sched)
    sched.add(seq("late", prompt_len=2))
    plan = sched.schedule()  # 1 free >= min(4, 1 waiting)
    assert plan is not None and [s.request_id for s in plan.seqs][-1] == "late" and len(plan.prefill_contexts) == 1


def _planned(sched: Scheduler) -> StepPlan:
    plan = sched.schedule()
    assert plan is not None and not plan.prefill_contexts
    return plan


def test_leaving_sequence_is_replaced_by_the_last_slot() -> None:
    sched = Scheduler(max_num_seqs=4, kv_budget_tokens=1000, max_prefill_tokens=100)
    seqs = [seq(f"s{i}", prompt_len=2 + i) for i in range(4)]
    for s in seqs:
        sched.add(s)
    step(sched)
    seqs[1].finish_reason = "aborted"
    plan = sched.schedule()
    assert plan is not None
    assert plan.moves == ((3, 1, seqs[3].cached_len - 1),)  # what was cached before this step's token
    assert [s.request_id for s in sched.running] == ["s0", "s3", "s2"]
    assert [s.slot for s in sched.running] == [0, 1, 2]


def test_budget_preempts_the_youngest_and_requeues_it_first() -> None:
    # Three prompts of 4: after prefill 12 cached; the next decode needs 15 > 14.
    sched = Scheduler(max_num_seqs=8, kv_budget_tokens=14, max_prefill_tokens=100)
    seqs = [seq(f"s{i}", prompt_len=4) for i in range(3)]
    for s in seqs:
        sched.add(s)
    step(sched)
    assert sched.kv_used_tokens == 12
    plan = sched.schedule()
    assert plan is not None
    assert sched.preemptions == 1
    assert [s.request_id for s in sched.running] == ["s0", "s1"]
    assert list(sched.waiting) == [seqs[2]]
    assert seqs[2].response_ids == [5] and seqs[2].cached_len == 0  # keeps its token


def test_finished_by_length_and_stop() -> None:
    sched = Scheduler(max_num_seqs=2, kv_budget_tokens=100, max_prefill_tokens=100)
    a, b = seq("a", 3, max_tokens=2), seq("b", 3)
    sched.add(a)
    sched.add(b)
    assert step(sched, token=5) == []
    plan = sched.schedule()
    assert plan is not None
    finished = sched.apply(plan, StepResult([6, 0], [-1.0, -1.0], 0))
    assert finished == [a, b]  # a hits max_tokens, b hits EOS
    assert (a.finish_reason, b.finish_reason) == ("length", "stop")
    assert a.response_ids == [5, 6] and b.response_ids == [5, 0]


def test_time_to_first_token_is_stamped_once_at_the_first_token() -> None:
    sched = Scheduler(max_num_seqs=1, kv_budget_tokens=100, max_prefill_tokens=100)
    a, b = seq("a", 3, max_tokens=3), seq("b", 3)
    sched.add(a)
    sched.add(b)
    step(sched)
    stamped = a.first_token_at
    assert stamped is not None and b.first_token_at is None  # b waits for the slot
    assert "first_token_s" not in b.to_trajectory("aborted").timings
    step(sched)
    assert a.first_token_at == stamped  # later tokens leave it
    timings = a.to_trajectory("length").timings
    assert timings["first_token_s"] == stamped - a.submitted_at
    assert 0 <= timings["queue_s"] <= timings["first_token_s"] <= timings["generate_s"]
