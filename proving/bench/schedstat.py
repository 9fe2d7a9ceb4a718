"""How long this thread ran on a CPU and how long it waited for one (Linux).

`/proc/thread-self/schedstat` holds three counters of the calling thread since
it started: nanoseconds on a CPU, nanoseconds runnable but waiting on a run
queue, and time slices. The bench reads them at a run's first delivery and at
its last ack, on the event loop's thread (where every consumer it times runs),
so a paced run can say what share of its window the consumer spent waiting for
a core that another process held: a latency no code of the consumer's causes.
Elsewhere (another system, a kernel without schedstats) it reads None.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDSTAT = "/proc/thread-self/schedstat"


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The calling thread's counters, in seconds."""

    ran: float  # on a CPU
    waited: float  # runnable, waiting for a CPU

    def __sub__(self, earlier: CpuTimes) -> CpuTimes:
        return CpuTimes(ran=self.ran - earlier.ran, waited=self.waited - earlier.waited)


def read(path: str = SCHEDSTAT) -> CpuTimes | None:
    """The calling thread's counters now (or those `path` names); None where the kernel
    does not keep them."""
    try:
        with open(path) as counters:
            ran, waited, _slices = counters.read().split()
        return CpuTimes(ran=int(ran) / 1e9, waited=int(waited) / 1e9)
    except (OSError, ValueError):
        return None


def of_process(pid: int) -> CpuTimes | None:
    """The counters of process `pid`'s main thread (where a child's event loop runs)."""
    return read(f"/proc/{pid}/schedstat")


def between(first: CpuTimes | None, last: CpuTimes | None) -> CpuTimes | None:
    """What the thread spent from `first` to `last`; None if either was not read."""
    return last - first if first and last else None


def shares(cpu: CpuTimes | None, seconds: float) -> str:
    """`ran=55% waited=36%`: `cpu` as shares of a window of `seconds`; empty if unknown."""
    if cpu is None or seconds <= 0:
        return ""
    return f"ran={cpu.ran / seconds:.0%} waited={cpu.waited / seconds:.0%}"
