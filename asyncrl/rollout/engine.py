"""TorchEngine: a continuous-batching rollout engine for HF causal LMs in plain torch,
registered as `rollout.engine=torch` (it implements `asyncrl.roles.Engine`).

Llama (incl. 3.x rope scaling), Qwen2 and Qwen3 run on the fast forward
(`asyncrl.rollout.forward`); any other causal LM runs on the generic HF-forward path
(`asyncrl.rollout.generic`), which the engine logs once (logger "asyncrl.rollout") at start.
Scheduling, sampling, abort, pause and continuation are the same on both.

Threading model::

    event-loop thread (asyncio task `_run`)            step thread (1 worker)
    ─────────────────────────────────────────          ──────────────────────────────
    sweep · preempt · admit → StepPlan t ──submit──▶   queue step t: moves · decode · prefill · sample
    generate()/abort()/stats() keep running      ◀──   StepResult of step t-1 (plain lists)
    apply tokens t-1 · resolve finished futures

On CUDA results are read one step late (`StepRunner.run`, `read_late`): the device runs step t
while the host applies step t-1 and plans t+1, whose decode rows read t's sampled tokens on the
device. So a row that finished at step t-1 is in step t too (its extra token is dropped), and a
step is planned with the tokens of two steps ago known on the host. Pausing, idling and a failed
step read or drop the queued step first. On the CPU, where nothing runs while the host plans,
each step's results come back with it (lock-step) and nothing stays queued.

All bookkeeping (queues, sequences, futures) lives in the event-loop thread, so it needs no lock;
the step thread only sees a frozen `StepPlan`. The step thread is the engine's own, or the
compute thread it is given to share with other torch work on the same cores (`asyncrl.compute`
says why). The model runs only inside `StepRunner.run`, which holds `StepRunner.lock`;
`load_weights` runs on the step thread and takes the same lock, so a weight load lands between
two steps.

Semantics callers rely on:
- `generate` resolves as soon as its sequence finishes ("stop" on EOS/stop token, "length" at
  `max_tokens`, counting a continuation prefix), or when it is aborted: then it resolves to the
  same partial `Trajectory` (finish_reason "aborted") that `abort`/`abort_all` return.
- `await pause()` (mode "keep") returns once no step is in flight or unread; requests keep their state
  and new ones queue. `pause("abort")` also aborts every request and returns the partials.
  `await resume()` continues. Tokens sampled after `load_weights(.., version)` carry `version`.
- An engine is bound to one event loop at a time; after that loop ends (e.g. `asyncio.run`
  returns) the next `generate` from a new loop restarts it, with nothing left in flight.
- Call `generate`/`abort`/`pause`/`resume`/`stats` from the event-loop thread only.
- On CUDA with `rollout.cuda_graphs` the KV cache is allocated when the engine is built: `max_num_seqs`
  slots of `max_model_len` tokens, within `gpu_memory_utilization` of the device
  (`asyncrl.rollout.memory`); fewer slots when they do not fit (logged once), `ConfigError` when
  not one does. A request longer than `max_model_len` raises `RolloutError` from `generate`.
- CUDA running out of memory while the engine is built or in a step raises `OutOfMemory`
  (`asyncrl.oom`: one line naming `rollout.gpu_memory_utilization` and the trainer's budgets),
  from the constructor or from the step's requests' `generate`.

- With `EngineSettings.prefix_cache` (rollout.multi_turn.enable) a finished sequence's K/V stay
  in a free slot, and a request whose prompt starts with them prefills only the rest
  (`asyncrl.rollout.prefix_cache`: a multi-turn episode's next turn); `pin`/`unpin` hold an
  entry through a tool call. A weight load drops the unpinned entries.

Not here: tokenization, chunked prefill, speculative decoding, tensor parallel.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as SequenceABC
from concurrent.futures import Executor

import torch
from torch import nn

from asyncrl.compute import compute_thread
from asyncrl.errors import OutOfMemory, RolloutError
from asyncrl.models.tensors import checksum, export_named
from asyncrl.oom import out_of_memory_as
from asyncrl.roles import PauseMode
from asyncrl.rollout.generic import describe
from asyncrl.rollout.prefix_cache import PrefixCache
from asyncrl.rollout.runner import StepRunner
from asyncrl.rollout.scheduler import Scheduler, StepPlan, StepResult
from asyncrl.rollout.sequence import Sequence
from asyncrl.rollout.settings import EngineSettings, engine_settings
from asyncrl.types import EngineStats, GenerationRequest, Trajectory

_RATE_WINDOW_S = 10.0
logger = logging.getLogger("asyncrl.rollout")


class TorchEngine:
    """Continuous-batching generation over a HF causal LM, with async abort/pause/weight load."""

    def __init__(self, model: nn.Module, eos_token_id: int | list[int], settings: EngineSettings | None = None,
                 *, version: int = 0, executor: Executor | None = None) -> None:
        """`settings`: `engine_settings(...)` (None: the `rollout.*` defaults on the CPU); `version`:
        the weight version of `model` (tokens carry it until `load_weights`); `executor`: a compute
        thread to run steps on (shared with other torch work), else its own."""
        settings = engine_settings() if settings is None else settings
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self._eos_ids = tuple(int(t) for t in eos)
        # a colocated or processes trainer holds the rest of the device: its budgets count too
        self._memory_keys = (f"rollout.gpu_memory_utilization (now {settings.gpu_memory_utilization:g})",
                             "actor.ppo_micro_batch_tokens", "actor.log_prob_micro_batch_tokens")
        with out_of_memory_as("building the rollout engine (its KV cache and CUDA graphs)", self._memory_keys):
            self._runner = StepRunner(model, settings, version)
        self._vocab_size = self._runner.forward.vocab_size
        self._log_limits(model, settings.max_num_seqs)
        self._prefix = self._prefix_cache(settings)
        self._scheduler = Scheduler(self._runner.max_num_seqs, settings.kv_budget_tokens, settings.max_prefill_tokens,
                                    admit_min_free_slots=settings.admit_min_free_slots, prefix=self._prefix)
        self._kv_budget = settings.kv_budget_tokens
        self._max_model_len = settings.max_model_len
        self._num_threads = settings.num_threads
        self._keys = random.Random(settings.seed)
        """Where the sampling keys of requests without a seed come from, one per request."""
        self._seqs: dict[str, Sequence] = {}
        self._futures: dict[str, asyncio.Future[Trajectory]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: Executor | None = executor
        self._owns_executor = executor is None
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._paused = False
        self._closed = False
        self._generated_tokens = 0
        self._rate: deque[tuple[float, int]] = deque()

    def _log_limits(self, model: nn.Module, max_num_seqs: int) -> None:
        """Warn once at start about the generic forward path, or a KV cache too small for
        `max_num_seqs` sequences."""
        if self._runner.fast_path_problem is not None:
            model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
            logger.warning("TorchEngine: model_type %r runs on the %s", model_type,
                           describe(self._runner.forward, self._runner.fast_path_problem))
        kv = self._runner.kv_plan
        if kv is not None and kv.slots < max_num_seqs:
            logger.warning("TorchEngine: the KV cache holds %d sequences of %d tokens (%.2f GiB of %.2f "
                           "available), fewer than max_num_seqs=%d; raise rollout.gpu_memory_utilization "
                           "to run more at once", kv.slots, kv.capacity, kv.kv_bytes / 2**30,
                           kv.available_bytes / 2**30, max_num_seqs)

    def _prefix_cache(self, settings: EngineSettings) -> PrefixCache | None:
        """The prefix cache when asked for and the forward's cache can hold one (logged once if not)."""
        if settings.prefix_cache and not self._runner.prefix_cacheable:
            logger.warning("TorchEngine: no prefix cache on the generic path's per-row HF cache")
        if not settings.prefix_cache or not self._runner.prefix_cacheable:
            return None
        return PrefixCache(self._runner.max_num_seqs, settings.max_model_len - 1)  # graph padding rows write the last

    # ---- public API ----

    @property
    def version(self) -> int:
        return self._runner.version

    async def generate(self, request: GenerationRequest) -> Trajectory:
        """One response for `request`; many calls may be in flight at once."""
        self._validate(request)
        seq = Sequence.from_request(request, self._eos_ids, self._keys.getrandbits(32))
        done = seq.finished_by()  # a continuation whose prefix already ends the response
        if done is not None:
            return seq.to_trajectory(done)
        loop = self._ensure_started()
        future: asyncio.Future[Trajectory] = loop.create_future()
        self._seqs[request.request_id] = seq
        self._futures[request.request_id] = future
        self._scheduler.add(seq)
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._abort_seq(seq)  # the caller gave up: free the slot instead of decoding on
            raise

    async def generate_many(self, requests: Iterable[GenerationRequest]) -> list[Trajectory]:
        """All responses, in request order (convenience for sync callers via asyncio.run)."""
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    async def abort(self, request_ids: Iterable[str]) -> list[Trajectory]:
        """Stop these requests; returns their partial trajectories (unknown ids are skipped).

        Each one's pending `generate` resolves to the same trajectory, finish_reason "aborted".
        A token being computed by the step in flight is discarded.
        """
        return self._abort(request_ids)

    async def abort_all(self) -> list[Trajectory]:
        return self._abort(list(self._seqs))

    async def pause(self, mode: PauseMode = "keep") -> list[Trajectory]:
        """Stop stepping; returns once the step in flight (if any) has been applied. "abort"
        first aborts every request (their partials are returned)."""
        self._paused = True
        partials = self._abort(list(self._seqs)) if mode == "abort" else []
        await self._idle.wait()
        return partials

    async def resume(self) -> None:
        self._paused = False
        self._wakeup.set()

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy `named_tensors` into the model in place and set the version, between steps.

        The copy runs on the step thread, after the step in flight; pause first for a clean
        cut. On a `SyncError` midway the model is partly updated and the version unchanged.
        """
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._compute(), self._runner.load_weights, named_tensors, version)
        if self._prefix is not None:
            self._prefix.drop_unpinned()

    def pin(self, token_ids: SequenceABC[int], timeout_s: float) -> bool:
        """Keep the prefix-cache entry of a finished request whose prompt + response is `token_ids`
        from eviction for `timeout_s` seconds, or until a request extending it is admitted or
        `unpin` (rollout.multi_turn.keep_slot=keep, during a tool call). False when it is not
        cached (no prefix cache, not kept, or evicted). Not in `asyncrl.roles.Engine`: an extra."""
        if self._prefix is None:
            return False
        if self._idle.is_set():
            self._scheduler.sweep()  # finished while paused: its entry is made at the sweep
        return self._prefix.pin(token_ids, timeout_s)

    def unpin(self, token_ids: SequenceABC[int]) -> bool:
        """Make `pin`'s entry evictable again (the episode ended); False when it is not cached."""
        return self._prefix is not None and self._prefix.unpin(token_ids)

    def weights_checksum(self) -> str:
        return checksum(export_named(self._runner.model))

    def stats(self) -> EngineStats:
        running = sum(1 for s in self._scheduler.running if s.finish_reason is None)
        return EngineStats(
            running=running,
            waiting=len(self._scheduler.waiting),
            preemptions=self._scheduler.preemptions,
            kv_used_tokens=self._scheduler.kv_used_tokens,
            kv_capacity_tokens=self._kv_budget,
            generated_tokens=self._generated_tokens,
            tokens_per_s=self._tokens_per_s(),
            version=self._runner.version,
            prefill_tokens=self._scheduler.prefill_tokens,
            prefix_cache_queries=self._scheduler.prefix_queries,
            prefix_cache_hit_tokens=self._scheduler.prefix_hit_tokens,
        )

    async def aclose(self) -> None:
        """Abort everything, stop the loop task, wait for the step thread, free the cache."""
        if self._closed:
            return
        self._closed = True
        self._abort(list(self._seqs))
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._executor is not None and self._owns_executor:
            await asyncio.to_thread(self._executor.shutdown, True)
        self._runner.release_cache()

    def close(self) -> None:
        """Sync shutdown for use after the event loop has finished (or from its thread)."""
        if self._closed:
            return
        self._closed = True
        loop_open = self._loop is not None and not self._loop.is_closed()
        if loop_open:
            self._abort(list(self._seqs))
        if self._task is not None and not self._task.done() and loop_open:
            self._task.cancel()
        if self._executor is not None and self._owns_executor:
            self._executor.shutdown(wait=True)
        self._runner.release_cache()

    # ---- request handling ----

    def _abort(self, request_ids: Iterable[str]) -> list[Trajectory]:
        partials = [self._abort_seq(self._seqs[rid]) for rid in request_ids if rid in self._seqs]
        if self._idle.is_set():
            self._scheduler.sweep()
        self._wakeup.set()
        return partials

    def _validate(self, request: GenerationRequest) -> None:
        if self._closed:
            raise RolloutError("TorchEngine is closed")
        if request.request_id in self._seqs:
            raise RolloutError(f"request_id {request.request_id!r} is already in flight")
        if not request.prompt_ids:
            raise RolloutError(f"request {request.request_id!r} has an empty prompt")
        n = len(request.prefix_ids)
        if len(request.prefix_logprobs) != n or len(request.prefix_versions) != n:
            raise RolloutError(
                f"request {request.request_id!r}: prefix_ids, prefix_logprobs and "
                "prefix_versions must have the same length"
            )
        ids = request.prompt_ids + request.prefix_ids
        if min(ids) < 0 or max(ids) >= self._vocab_size:
            raise RolloutError(f"request {request.request_id!r} has token ids outside the vocabulary")
        need = len(request.prompt_ids) + request.params.max_tokens
        if need > self._max_model_len:
            key = "kv_budget_tokens" if self._max_model_len == self._kv_budget else "max_model_len"
            raise RolloutError(
                f"request {request.request_id!r} needs {need} cached tokens (prompt + max_tokens) "
                f"but {key} is {self._max_model_len}; raise {key}"
            )

    def _abort_seq(self, seq: Sequence) -> Trajectory:
        seq.finish_reason = "aborted"
        self._scheduler.drop_waiting(seq)
        partial = seq.to_trajectory("aborted")
        self._resolve(seq, partial)
        return partial

    def _resolve(self, seq: Sequence, trajectory: Trajectory) -> None:
        self._seqs.pop(seq.request_id, None)
        future = self._futures.pop(seq.request_id, None)
        if future is not None and not future.done() and not future.get_loop().is_closed():
            future.set_result(trajectory)

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        seq.finish_reason = "aborted"
        self._seqs.pop(seq.request_id, None)
        future = self._futures.pop(seq.request_id, None)
        if future is not None and not future.done() and not future.get_loop().is_closed():
            future.set_exception(error)

    # ---- the loop ----

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        alive = self._task is not None and not self._task.done()
        if alive and self._loop is loop:
            return loop
        if alive and self._loop is not None and not self._loop.is_closed():
            raise RolloutError("TorchEngine is bound to another running event loop")
        self._forget_in_flight()  # anything left belongs to a loop that is gone
        self._loop = loop
        self._wakeup, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._task = loop.create_task(self._run(), name="asyncrl-torch-engine")
        return loop

    def _compute(self) -> Executor:
        """The thread steps and weight loads run on: the one given, else the engine's own."""
        if self._executor is None:
            self._executor = compute_thread(self._num_threads or torch.get_num_threads(), "asyncrl-engine")
        return self._executor

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                plan = None if self._paused else self._scheduler.schedule()
                if plan is None and self._runner.pending is not None:
                    await self._step(loop, None)  # read the queued step before pausing or idling
                elif plan is None:
                    await self._wait_for_work(loop)
                else:
                    await self._step(loop, plan)
        except Exception as error:  # a scheduler bug: fail every caller loudly, not "aborted"
            wrapped = RolloutError(f"TorchEngine loop crashed: {error!r}")
            for seq in self._scheduler.clear():
                self._fail(seq, wrapped)
            raise
        finally:
            self._forget_in_flight()

    async def _wait_for_work(self, loop: asyncio.AbstractEventLoop) -> None:
        self._wakeup.clear()
        # Idle: give the cache's memory back, unless graphs were captured over it (cuda_graphs)
        # or it holds prefix-cache entries (a multi-turn episode's next turn comes after its tools).
        runner = self._runner
        if not self._scheduler.running and runner.cache.allocated_tokens and runner.bucketed_decode is None \
                and not self._prefix:
            await loop.run_in_executor(self._compute(), self._runner.release_cache)
            if self._wakeup.is_set():
                return
        # requests blocked by pinned prefix-cache slots are admitted once a pin expires
        blocked_for = self._prefix.pinned_for() if self._prefix is not None and self._scheduler.waiting else None
        try:
            await asyncio.wait_for(self._wakeup.wait(), blocked_for)
        except asyncio.TimeoutError:
            pass

    async def _step(self, loop: asyncio.AbstractEventLoop, plan: StepPlan | None) -> None:
        """Queue `plan`'s step (None: queue nothing) and apply the step queued before it."""
        self._idle.clear()
        queued = self._runner.pending
        try:
            with out_of_memory_as("the rollout engine's step", self._memory_keys):
                done = await loop.run_in_executor(self._compute(), self._runner.flush if plan is None
                                                  else functools.partial(self._runner.run, plan))
        except Exception as error:  # a failed step fails its rows (and the queued step's), not the engine
            self._runner.drop()
            if self._prefix is not None:  # the step's moves may not have run: trust no entry
                self._prefix.clear()
            wrapped = error if isinstance(error, OutOfMemory) else RolloutError(f"TorchEngine step failed: {error!r}")
            for failed in (queued, plan):
                for seq in failed.seqs if failed is not None else ():
                    self._fail(seq, wrapped)
            self._scheduler.sweep()
            return
        finally:
            if self._runner.pending is None:
                self._idle.set()
        if done is not None:
            self._apply(*done)

    def _apply(self, plan: StepPlan, result: StepResult) -> None:
        appended = sum(1 for s in plan.seqs if s.finish_reason is None)
        for seq in self._scheduler.apply(plan, result):
            assert seq.finish_reason is not None, "the scheduler returns finished sequences only"
            if seq.slot < 0:  # preempted while its last token was sampled, and that token ends it
                self._scheduler.drop_waiting(seq)
            self._resolve(seq, seq.to_trajectory(seq.finish_reason))
        self._generated_tokens += appended
        now = time.perf_counter()
        self._rate.append((now, appended))
        while self._rate and now - self._rate[0][0] > _RATE_WINDOW_S:
            self._rate.popleft()

    def _forget_in_flight(self) -> None:
        """Resolve every pending future as aborted and empty the queues (loop ending)."""
        self._runner.drop()
        for seq in self._scheduler.clear():
            if seq.finish_reason is None:
                self._abort_seq(seq)
        self._seqs.clear()
        self._futures.clear()

    def _tokens_per_s(self) -> float:
        if len(self._rate) < 2:
            return 0.0
        span = self._rate[-1][0] - self._rate[0][0]
        tokens = sum(n for _, n in self._rate) - self._rate[0][1]
        return tokens / span if span > 0 else 0.0


def run_sync(engine: TorchEngine, requests: SequenceABC[GenerationRequest]) -> list[Trajectory]:
    """Generate from synchronous code: runs a private event loop until all requests finish."""
    return asyncio.run(engine.generate_many(requests))
