"""TorchEngine end to end on tiny random models: batching, log-probs, preemption, abort, weights."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from asyncrl.errors import RolloutError
from asyncrl.rollout import TorchEngine, run_sync
from asyncrl.types import GenerationRequest, SamplingParams, Trajectory
from tests.rollout.rollout_testlib import (
    EOS,
    FAST_ARCHS,
    GENERIC_ARCHS,
    engine,
    one_at_a_time,
    prompt,
    request,
    settings_of,
    staggered_requests,
    teacher_forced_logprobs,
    tiny_model,
    wait_for_tokens,
)

# The fast forward, the generic path batched (gpt2) and one row at a time (gemma2, sliding
# window): scheduling semantics must not depend on which forward runs.
ENGINE_ARCHS = ("llama", "gpt2", "gemma2")


def assert_same(outs: list[Trajectory], refs: list[Trajectory]) -> None:
    for out, ref in zip(outs, refs, strict=True):
        assert out.response_ids == ref.response_ids, out.request_id
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(ref.logprobs), rtol=0, atol=1e-5
        )
        assert out.finish_reason == ref.finish_reason


@pytest.mark.parametrize("arch", FAST_ARCHS + GENERIC_ARCHS)
def test_continuous_batching_equals_one_at_a_time(arch: str) -> None:
    model = tiny_model(arch)
    reqs = staggered_requests(10)
    refs = one_at_a_time(model, reqs)

    async def main() -> list[Trajectory]:
        eng = engine(model, max_num_seqs=4)  # 10 requests through 4 slots: admission mid-run
        first = [asyncio.create_task(eng.generate(r)) for r in reqs[:6]]
        await wait_for_tokens(eng, 12)  # the rest arrive while the first ones decode
        late = [asyncio.create_task(eng.generate(r)) for r in reqs[6:]]
        outs = await asyncio.gather(*first, *late)
        assert eng.stats().running == 0 and eng.stats().waiting == 0
        await eng.aclose()
        return list(outs)

    outs = asyncio.run(main())
    assert_same(outs, refs)
    assert [len(o.response_ids) for o in outs] == [r.params.max_tokens for r in reqs]
    assert all(o.finish_reason == "length" for o in outs)


def test_greedy_matches_hf_generate_and_stops_on_eos_and_stop_tokens() -> None:
    model = tiny_model()
    prompt_ids = prompt(6, seed=1)
    ref = model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
        pad_token_id=EOS,
    )[0, 6:].tolist()
    eng = engine(model)
    out = run_sync(eng, [request("a", prompt_ids, 12)])[0]
    assert out.response_ids == ref
    stop_at = ref[4]
    params = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_at,))
    stopped = run_sync(eng, [GenerationRequest("b", prompt_ids, params)])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.response_ids == ref[: ref.index(stop_at) + 1]
    eos_engine = TorchEngine(model, eos_token_id=[99, ref[2]])
    params = SamplingParams(max_tokens=12, temperature=0.0)
    assert run_sync(eos_engine, [GenerationRequest("c", prompt_ids, params)])[0].response_ids == ref[:3]
    eng.close()
    eos_engine.close()


def test_sampled_logprobs_equal_teacher_forced_hf_logprobs() -> None:
    model = tiny_model("qwen2")
    eng = engine(model, seed=0)
    outs = run_sync(eng, staggered_requests(6, temperature=0.7))
    for out in outs:
        expected = teacher_forced_logprobs(model, out.prompt_ids, out.response_ids, 0.7)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, rtol=0, atol=1e-5)
    assert len({tuple(o.response_ids) for o in outs}) == len(outs)
    eng.close()


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_tiny_kv_budget_preempts_and_keeps_greedy_outputs(arch: str) -> None:
    model = tiny_model(arch)
    reqs = staggered_requests(8)
    refs = run_sync(engine(model), reqs)
    need = max(len(r.prompt_ids) + r.params.max_tokens for r in reqs)
    eng = engine(model, kv_budget_tokens=need + 10)
    outs = run_sync(eng, reqs)
    assert eng.stats().preemptions > 0
    assert_same(outs, refs)
    eng.close()


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_abort_returns_partials_that_continue_to_the_same_output(arch: str) -> None:
    model = tiny_model(arch)
    reqs = [request(f"r{i}", prompt(5 + i, seed=i), 30) for i in range(4)]
    refs = run_sync(engine(model), reqs)

    async def main() -> tuple[list[Trajectory], list[Trajectory], list[Trajectory]]:
        eng = engine(model)
        tasks = [asyncio.create_task(eng.generate(r)) for r in reqs]
        await wait_for_tokens(eng, 20)
        partials = await eng.abort(["r1", "r3", "unknown"])
        from_futures = [await tasks[1], await tasks[3]]
        done = [await tasks[0], await tasks[2]]
        continued = []
        for part in partials:  # resubmit as partial-rollout continuations
            req = next(r for r in reqs if r.request_id == part.request_id)
            cont = dataclasses.replace(
                req, prefix_ids=tuple(part.response_ids), prefix_logprobs=tuple(part.logprobs),
                prefix_versions=tuple(part.versions),
            )
            continued.append(await eng.generate(cont))
        assert from_futures == partials
        await eng.aclose()
        return partials, done, continued

    partials, done, continued = asyncio.run(main())
    assert_same(done, [refs[0], refs[2]])
    for part, ref in zip(partials, [refs[1], refs[3]]):
        assert part.finish_reason == "aborted"
        assert 0 < len(part.response_ids) < 30
        assert part.response_ids == ref.response_ids[: len(part.response_ids)]
        assert part.logprobs == ref.logprobs[: len(part.logprobs)]
    assert_same(continued, [refs[1], refs[3]])


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_abort_all_resolves_waiting_and_running_requests(arch: str) -> None:
    async def main() -> None:
        eng = engine(tiny_model(arch), max_num_seqs=2)
        tasks = [asyncio.create_task(eng.generate(r)) for r in staggered_requests(5)]
        await wait_for_tokens(eng, 3)
        partials = await eng.abort_all()
        outs = await asyncio.gather(*tasks)
        assert sorted(p.request_id for p in partials) == [f"r{i}" for i in range(5)]
        assert all(o.finish_reason == "aborted" for o in outs)
        assert any(o.response_ids == [] for o in outs)  # some never left the waiting queue
        assert eng.stats().running == 0 and eng.stats().waiting == 0
        await eng.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_load_weights_changes_outputs_and_versions(arch: str) -> None:
    model, other = tiny_model(arch, seed=0), tiny_model(arch, seed=1)
    reqs = staggered_requests(3)
    ref_other = run_sync(engine(other), reqs)
    eng = engine(model, version=3)
    before = run_sync(eng, reqs)
    assert all(o.versions == [3] * len(o.response_ids) for o in before)
    asyncio.run(eng.load_weights(other.state_dict().items(), version=7))  # includes tied/alias names
    after = run_sync(eng, reqs)
    assert_same(after, ref_other)
    assert [o.response_ids for o in after] != [o.response_ids for o in before]
    assert all(o.versions == [7] * len(o.response_ids) for o in after)
    assert eng.stats().version == 7 and eng.version == 7
    eng.close()


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_pause_holds_requests_in_flight_and_resume_continues_under_new_version(arch: str) -> None:
    model, other = tiny_model(arch, seed=0), tiny_model(arch, seed=1)

    async def main() -> list[Trajectory]:
        eng = engine(model)
        tasks = [asyncio.create_task(eng.generate(r)) for r in staggered_requests(4)]
        await wait_for_tokens(eng, 8)
        await eng.pause()
        frozen = eng.stats()
        await asyncio.sleep(0.05)
        assert eng.stats().generated_tokens == frozen.generated_tokens
        assert frozen.running > 0 and not any(t.done() for t in tasks[2:])
        await eng.load_weights(other.named_parameters(), version=1)
        await eng.resume()
        outs = await asyncio.gather(*tasks)
        await eng.aclose()
        return list(outs)

    outs = asyncio.run(main())
    long = [o for o in outs if len(o.response_ids) > 8]
    assert long and all(o.start_version == 0 and o.end_version == 1 for o in long)
    for o in outs:
        assert o.versions == sorted(o.versions)  # one cut, old then new


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_seeded_sampling_is_independent_of_batch_composition(arch: str) -> None:
    model = tiny_model(arch)
    seeded = request("seeded", prompt(7, seed=9), 20, temperature=1.0, seed=1234)
    alone = run_sync(engine(model), [seeded])[0]

    async def crowded() -> Trajectory:
        eng = engine(model, seed=5)
        others = [asyncio.create_task(eng.generate(r)) for r in staggered_requests(5, 1.0)]
        await wait_for_tokens(eng, 6)  # join mid-run, in a different slot
        out = await eng.generate(seeded)
        await asyncio.gather(*others)
        await eng.aclose()
        return out

    out = asyncio.run(crowded())
    assert out.response_ids == alone.response_ids
    torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(alone.logprobs), rtol=0, atol=1e-5)


def test_invalid_requests_raise_and_cancelled_callers_free_their_slot() -> None:
    async def main() -> None:
        eng = engine(tiny_model(), kv_budget_tokens=40)
        with pytest.raises(RolloutError, match="kv_budget_tokens"):
            await eng.generate(request("big", prompt(10, 0), 31))
        with pytest.raises(RolloutError, match="vocabulary"):
            await eng.generate(request("oov", (1, 2, 1000), 3))
        task = asyncio.create_task(eng.generate(request("c", prompt(4, 0), 30)))
        await wait_for_tokens(eng, 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        assert eng.stats().running == 0
        await eng.aclose()
        with pytest.raises(RolloutError, match="closed"):
            await eng.generate(request("late", prompt(4, 0), 3))

    asyncio.run(main())


def test_load_weights_without_a_pause_lands_between_steps() -> None:
    model, other = tiny_model(seed=0), tiny_model(seed=1)
    new_weights = [(n, p.detach().clone()) for n, p in other.named_parameters()]

    async def main() -> list[Trajectory]:
        eng = engine(model)
        tasks = [asyncio.create_task(eng.generate(r)) for r in staggered_requests(6)]
        await wait_for_tokens(eng, 10)
        await eng.load_weights(new_weights, 2)  # no pause: the copy takes the step lock off the loop
        outs = await asyncio.gather(*tasks)
        await eng.aclose()
        return list(outs)

    outs = asyncio.run(main())
    assert any(o.end_version == 2 for o in outs)
    for o in outs:
        assert o.versions == sorted(o.versions) and set(o.versions) <= {0, 2}
    for name, tensor in new_weights:
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), tensor)


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_pause_abort_returns_every_partial_and_keeps_the_engine_usable(arch: str) -> None:
    model = tiny_model(arch)

    async def main() -> None:
        eng = engine(model)
        tasks = [asyncio.create_task(eng.generate(r)) for r in staggered_requests(3)]
        await wait_for_tokens(eng, 6)
        partials = await eng.pause("abort")
        assert sorted(p.request_id for p in partials) == ["r0", "r1", "r2"]
        assert [await t for t in tasks] == sorted(partials, key=lambda p: p.request_id)
        await eng.resume()
        again = await eng.generate(request("again", prompt(5, seed=1), 4))
        assert again.finish_reason != "aborted"
        await eng.aclose()

    asyncio.run(main())


def test_weights_checksum_follows_load_weights() -> None:
    model, other = tiny_model(seed=0), tiny_model(seed=1)
    eng = engine(model)
    before = eng.weights_checksum()
    asyncio.run(eng.load_weights(other.named_parameters(), version=1))
    assert eng.weights_checksum() != before
    assert eng.weights_checksum() == engine(other).weights_checksum()
    eng.close()


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_a_groups_shared_prompt_is_prefilled_once_with_the_same_outputs(arch: str) -> None:
    """n samples of one prompt admitted in one step share its prefill (the fast path computes
    it once and copies the K/V); each sample's tokens and log-probs are those it gets alone."""
    model = tiny_model(arch)
    shared, other = prompt(7, seed=3), prompt(5, seed=4)
    reqs = [request(f"s{i}", shared, 9, temperature=1.0, seed=100 + i) for i in range(4)]
    reqs.insert(2, request("o", other, 9, temperature=1.0, seed=7))
    alone = [run_sync(engine(model), [r])[0] for r in reqs]
    eng = engine(model)
    calls: list[int] = []  # rows of each prefill forward, padded or packed
    for name in ("_prefill_padded", "_prefill_packed"):
        inner = getattr(eng._runner, name)
        setattr(eng._runner, name, lambda rows, first, inner=inner: calls.append(len(rows)) or inner(rows, first))
    together = run_sync(eng, reqs)
    assert_same(together, alone)
    assert len({tuple(o.response_ids) for o in together}) > 2  # the samples differ from each other
    assert calls[0] == (2 if arch != "gemma2" else 5)  # gemma2's per-row cache: no sharing
    eng.close()


def test_a_given_compute_thread_runs_steps_and_weight_loads_and_outlives_the_engine() -> None:
    import threading

    from asyncrl.compute import compute_thread

    shared = compute_thread(1, "shared")
    shared_ident = shared.submit(threading.get_ident).result()
    model = tiny_model(seed=0)
    eng = TorchEngine(model, EOS, settings_of(kv_budget_tokens=512, max_num_seqs=4), executor=shared)
    seen: set[int] = set()
    run, load = eng._runner.run, eng._runner.load_weights
    eng._runner.run = lambda plan: seen.add(threading.get_ident()) or run(plan)
    eng._runner.load_weights = lambda named, version: seen.add(threading.get_ident()) or load(named, version)
    asyncio.run(eng.load_weights(tiny_model(seed=1).named_parameters(), version=1))
    out = run_sync(eng, [request("a", prompt(4, seed=0), max_tokens=3)])
    assert list(out[0].versions) == [1, 1, 1] and seen == {shared_ident}
    eng.close()
    assert shared.submit(lambda: 7).result() == 7, "the engine leaves a thread it was given running"
    shared.shutdown()
