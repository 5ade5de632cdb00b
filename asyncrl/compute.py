"""The threads that run torch in a process: one compute thread per side, single-threaded torch
everywhere else.

torch's intra-op thread count is per thread, and every thread that runs a parallel op keeps its
own OpenMP team for as long as it lives. libgomp counts the threads of all teams: once they
outnumber the cores, a team's workers stop spinning between parallel regions and sleep on a
futex, so each small op pays a wake-up. On 2 cores, one idle extra team made the engine's
decoding 3-4x slower and the colocated pipeline's generation 3x slower (docs/engine.md, "One
OpenMP team per side"). So work that runs on the same cores shares one thread: a colocated run's engines and
trainer run on one compute thread, a decoupled run has one per side, and the event loop and
`asyncio.to_thread`'s pool run torch single-threaded.

Not here: which side gets how many cores (`asyncrl.substrates.real.side_cpus`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import torch


def pin_threads(threads: int) -> None:
    """Give the calling thread `threads` torch intra-op threads, for good.

    torch keeps the count per thread but initialises a thread lazily, at its first parallel op,
    from the count last set by any thread; a bare `torch.set_num_threads` before that is undone.
    Reading the count first runs that initialisation, so the setting sticks."""
    torch.get_num_threads()
    torch.set_num_threads(max(1, threads))


def compute_thread(threads: int, name: str) -> ThreadPoolExecutor:
    """A one-thread executor whose thread runs torch with `threads` intra-op threads."""
    return ThreadPoolExecutor(1, thread_name_prefix=name, initializer=pin_threads, initargs=(threads,))


def quiet_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    """From the loop's thread: torch single-threaded here and in the loop's default executor
    (`asyncio.to_thread`), so neither keeps an OpenMP team beside the compute threads'."""
    pin_threads(1)
    loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio", initializer=pin_threads,
                                                 initargs=(1,)))
