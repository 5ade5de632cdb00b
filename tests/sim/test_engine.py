import math

import pytest

from asyncrl.sim.engine import EngineModel, GroupSpec, Turns

INF = math.inf


def model(a=1.0, b=0.0, c=0.0, capacity=10**9, max_seqs=256, prefill=0.0):
    return EngineModel((a, b, c), prefill, capacity, max_seqs, watermark=0.0)


def submit(m, group, *lengths, prompt=10):
    m.submit(GroupSpec(group, prompt, 100, 0.0), list(lengths))


def test_a_group_finishes_with_its_longest_member():
    m = model()  # every step takes 1 s
    submit(m, 0, 3, 5)
    [(group, finished)] = m.advance(INF, stop_after_group=True)
    assert group == 0 and m.t == pytest.approx(5.0, rel=0, abs=1e-9)
    assert [f[2] for f in finished] == pytest.approx([3.0, 5.0], rel=0, abs=1e-9)
    assert [f[1] for f in finished] == [((0, 3),), ((0, 5),)]


def test_step_time_grows_with_batch_and_context():
    # b=1: a step costs 1 + batch. Both run 3 steps at batch 2 (9 s), then 2 at batch 1 (4 s).
    m = model(b=1.0)
    submit(m, 0, 3)
    submit(m, 1, 5)
    assert m.advance(INF, True)[0][0] == 0 and m.t == pytest.approx(9.0, rel=0, abs=1e-9)
    assert m.advance(INF, True)[0][0] == 1 and m.t == pytest.approx(13.0, rel=0, abs=1e-9)
    # c: one sequence of prompt 10 decoding 4 tokens, step = c * context (10, 11, 12, 13 → ∫ = 46)
    m = model(a=0.0, c=1.0)
    submit(m, 0, 4)
    m.advance(INF, True)
    assert m.t == pytest.approx(4 * 10 + 4 * 4 / 2, rel=0, abs=1e-9)


def test_full_kv_cache_preempts_the_newest_and_recomputes_it():
    m = model(capacity=25)  # two prompts of 10 fill it after 2.5 steps each
    submit(m, 0, 4)
    submit(m, 1, 4)
    assert m.advance(INF, True)[0][0] == 0 and m.t == pytest.approx(4.0, rel=0, abs=1e-9)
    assert m.preemptions == 1
    [(group, [(_, runs, end, _, _)])] = m.advance(INF, True)
    assert group == 1 and end == pytest.approx(6.0, rel=0, abs=1e-9)  # kept its 2 tokens
    assert runs == ((0, 4),)


def test_interrupt_keeps_partial_tokens_and_versions_span_the_sync():
    m = model()
    submit(m, 0, 10)
    m.advance(4.0)
    m.paused = True
    assert m.interrupt() == 1
    m.set_version(1)
    m.paused = False
    [(_, [(_, runs, end, _, _)])] = m.advance(INF, True)
    assert runs == ((0, 4), (1, 6))
    assert end == pytest.approx(10.0, rel=0, abs=1e-9)


def test_version_change_without_interrupt_splits_the_runs():
    m = model()
    submit(m, 0, 5)
    m.advance(2.0)
    m.set_version(7)
    [(_, [(_, runs, _, _, _)])] = m.advance(INF, True)
    assert runs == ((0, 2), (7, 3))


def test_max_num_seqs_queues_the_rest():
    m = model(max_seqs=1)
    submit(m, 0, 2)
    submit(m, 1, 2)
    assert m.advance(INF, True)[0][0] == 0 and len(m.waiting) == 1  # the second waited for the slot
    assert m.t == pytest.approx(2.0, rel=0, abs=1e-9)
    assert m.advance(INF, True)[0][0] == 1 and m.t == pytest.approx(4.0, rel=0, abs=1e-9)


def test_abort_stops_selected_responses_where_they_are():
    m = model()
    submit(m, 0, 4, 10)  # group 0: responses 0 and 1 (4 and 10 tokens)
    m.advance(2.0)  # 2 tokens each so far
    partials, completed = m.abort(0, {1})
    assert [(n, runs, index, aborted) for n, runs, _, index, aborted in partials] == [(2, ((0, 2),), 1, True)]
    assert completed == []  # response 0 still running
    [(group, finished)] = m.advance(INF, True)
    assert group == 0 and sorted((f[3], f[0], f[4]) for f in finished) == [(0, 4, False), (1, 2, True)]
    assert not m.running and not m.waiting


def test_abort_of_the_last_response_completes_the_group():
    m = model(max_seqs=1)
    submit(m, 0, 3, 5)  # the second waits for the slot
    m.advance(1.0)
    partials, completed = m.abort(0, {0, 1})
    assert sorted((p[3], p[0]) for p in partials) == [(0, 1), (1, 0)]  # the queued one had nothing
    assert [g for g, _ in completed] == [0] and not m.running and not m.waiting


def test_retune_changes_the_step_cost_from_now_on():
    m = model()  # 1 s a step
    submit(m, 0, 10)
    m.advance(4.0)  # 4 tokens
    m.retune((0.5, 0.0, 0.0), 0.0, 10**9, 256)  # twice as fast: 6 tokens in 3 s
    [(_, [(n, _, end, _, _)])] = m.advance(INF, True)
    assert n == 10 and end == pytest.approx(7.0, rel=0, abs=1e-9)


def test_retune_to_a_smaller_cache_preempts_the_newest():
    m = model()
    submit(m, 0, 10)
    submit(m, 1, 10)
    m.advance(2.0)  # context 2 x (10 + 2) = 24
    m.retune((1.0, 0.0, 0.0), 0.0, 20, 256)
    m.advance(2.0 + 1e-9)  # the next advance finds the cache over-full
    assert m.preemptions == 1 and len(m.running) == 1 and len(m.waiting) == 1


def _scenario(seed: int, capacity: int, max_seqs: int, c: float):
    """60 groups of 8 arriving at random times, with version changes, interrupts and aborts."""
    import random
    rng = random.Random(seed)
    m = EngineModel((0.004, 1e-4, c), 1e-5, capacity, max_seqs)
    out, t = [], 0.0
    for g in range(60):
        m.submit(GroupSpec(g, rng.randint(20, 200), 4000, t), [rng.randint(1, 3000) for _ in range(8)])
        t += rng.uniform(0.0, 3.0)
        out += m.advance(t)
        if g % 15 == 7:
            m.set_version(m.version + 1)
        if g % 20 == 11:
            m.paused = True
            m.interrupt()
            m.paused = False
        if g % 13 == 5 and g - 2 in m.remaining:
            out += m.abort(g - 2, {0, 3, 5})[1]
    while m.busy:
        out += m.advance(INF, stop_after_group=True)
    return sorted((g, f[3], f[0], f[1], f[2], f[4]) for g, fs in out for f in fs), m


@pytest.mark.parametrize("args, expected", [
    ((1, 10**9, 1024, 1e-8),
     (0, 699259, 120.89529224499745, 32961.90011218116, 9837053.222463036, "b50384bbf850d92d")),
    ((2, 60000, 256, 1e-8),
     (880, 721123, 152.83727619401472, 38028.82990314808, 11753297.153077703, "af736b8d77383de7")),
    ((3, 20000, 64, 2e-7),
     (1811, 718667, 408.2443417732636, 98154.44760715729, 30747539.583390377, "9babf90c30ed4c11")),
])
def test_completions_match_the_recorded_reference(args, expected):
    """Recorded from the engine before it was optimised: lengths, version runs, indices, aborts
    (hashed), finish times (sum and position-weighted sum), preemptions and tokens generated."""
    import hashlib
    rows, m = _scenario(*args)
    ints = hashlib.sha256(repr([(r[0], r[1], r[2], r[3], r[5]) for r in rows]).encode()).hexdigest()[:16]
    preemptions, generated, end, t_sum, t_weighted, digest = expected
    assert (m.preemptions, m.generated, ints, len(rows)) == (preemptions, generated, digest, 480)
    assert m.t == pytest.approx(end, rel=1e-9, abs=1e-6)
    assert sum(r[4] for r in rows) == pytest.approx(t_sum, rel=1e-9, abs=1e-6)
    assert sum(i * r[4] for i, r in enumerate(rows)) == pytest.approx(t_weighted, rel=1e-9, abs=1e-3)


@pytest.mark.parametrize(("min_free_slots", "second_group_ends"), [(1, 4.0), (3, 5.0), (8, 5.0)])
def test_admission_waits_for_min_free_slots_as_the_engine_does(min_free_slots, second_group_ends):
    # Four slots, full; they free at t = 2, 3, 4. k = 1 admits one at 2 and two at 3 (done by 4);
    # k = 3 (and 8, capped at 4 slots but only 3 waiting) waits for three free slots at t = 4.
    m = EngineModel((1.0, 0.0, 0.0), 0.0, 10**9, 4, watermark=0.0, min_free_slots=min_free_slots)
    submit(m, 0, 2, 3, 4, 10)
    submit(m, 1, 1, 1, 1)
    [(group, finished)] = m.advance(INF, stop_after_group=True)
    assert group == 1 and m.t == pytest.approx(second_group_ends, rel=0, abs=1e-9)


def test_a_queue_shorter_than_min_free_slots_never_waits():
    m = EngineModel((1.0, 0.0, 0.0), 0.0, 10**9, 4, watermark=0.0, min_free_slots=3)
    submit(m, 0, 2, 3, 4, 10)
    submit(m, 1, 1)  # one waiting: one free slot (t = 2) is enough
    [(group, _)] = m.advance(INF, stop_after_group=True)
    assert group == 1 and m.t == pytest.approx(3.0, rel=0, abs=1e-9)


def test_an_episode_leaves_the_batch_for_its_tool_call_and_prefills_only_the_result():
    """Each step 1 s, prefill 0.5 s a token, prompt 10: the prompt's prefill (5 s), turn 1 (3
    tokens, 3 s), the tool call (2.5 s), its 2-token result prefilled alone (1 s; without the
    cache the 15-token conversation: 7.5 s), turn 2 (4 tokens, 4 s)."""
    for caching, end in ((True, 15.5), (False, 22.0)):
        m = EngineModel((1.0, 0.0, 0.0), 0.5, 10**9, 256, watermark=0.0, prefix_caching=caching)
        m.submit(GroupSpec(0, 10, 100, 0.0, (Turns((3,), (2.5,), 2),)), [9])
        [(group, [(n, runs, finished_at, _, aborted)])] = m.advance(INF, True)
        assert (n, runs, aborted) == (9, ((0, 9),), False)
        assert finished_at == pytest.approx(end, rel=0, abs=1e-9)
        assert m.prefilled == (10 + 2 if caching else 10 + 15)


def test_a_kept_slot_idles_through_the_tool_call_a_released_one_serves_another_request():
    """One slot: released, a 2-token request decodes during the episode's 2.5 s call (t 3-5);
    kept, it waits for the episode to finish (t 9.5)."""
    for keep, other_done in ((False, 5.0), (True, 11.5)):
        m = EngineModel((1.0, 0.0, 0.0), 0.0, 10**9, 1, watermark=0.0, keep_slot=keep)
        m.submit(GroupSpec(0, 10, 100, 0.0, (Turns((3,), (2.5,), 0),)), [7])
        m.submit(GroupSpec(1, 10, 100, 0.0), [2])
        ends = {group: finished[0][2] for group, finished in m.advance(INF)}
        assert ends == pytest.approx({0: 9.5, 1: other_done}, rel=0, abs=1e-9)
        assert m.held_seqs == 0 and m.held_tokens == 0
