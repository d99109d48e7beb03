"""Load-adaptive coalescing of stream writes: a worker that is behind forwards a stream's
chunks a few at a time, one that keeps up forwards each at once.

Each open stream wakes once per upstream chunk: a wait on its socket, a read, a parse, a
client write, a scheduler pass. Trio runs every runnable task once per pass, so when a
worker has more to do than it can, a pass grows as long as all the busy streams' steps
together, and a request being admitted (about ten passes: the gate, the batch scope, the
Redis reply, the upstream's head) waits that many passes for its first event.

**The trade.** A real LLM stream sends a token every 10-30 ms. When the worker is behind,
a stream that has just written waits up to ``window_s`` (``triogate.
stream_coalesce_window_s``, 0.1 s by default, at most 1 s) before its next read; that read
then carries the tokens of the whole window, and one client write carries them all. The
client sees its tokens in groups, at most one window late, instead of every later stream
on the worker getting its first token seconds late: a reader does not notice 100 ms
between groups of words, and a first token seconds late is a failed request for most
clients. When the worker keeps up nothing is held: every chunk goes on as it comes, with no
added inter-token delay. The first event of a stream is never held (the hold follows a
write).

**The signal.** One probe task (:meth:`StreamPacer.run`, in the app nursery) sleeps one
tick (:data:`TICK_S`) at a time while any stream is open and measures how late it woke.
Trio looks at its timers between passes, so the lateness is about as long as the pass
that was running: more than a tick late means passes are long, i.e. the worker is behind
(ten passes of one tick are 50 ms, the bound on added time to first event). It takes
two late wake-ups in a row: one alone is as often the host running another process for a
few ms (on a shared 2-vCPU host a worker with 256 streams saw that often enough to hold
half its writes), which passes without anything held. The flag
is read by the streams (an attribute read per write); the probe costs one wake-up per
tick while streams are open, none while the worker has no stream.

**The hold.** A timing wheel of parking lots, one per tick: a stream parks in the lot due
``window_s`` from now, and the probe unparks the lots that came due at each tick. A
``trio.sleep`` per hold would register a deadline scope each time (10-27 µs on the bench
host, more than the wake-up it saves). A parked stream is cancelled as any waiting task
is (client gone, shutdown); errors, the upstream read timeout (its clock runs while the
stream reads, from the end of the hold), settlement and spend rows are unchanged. The
probe tells the run's upstream transport (``providers/http1.set_pacer``): a read that
follows a hold skips the extra scheduler pass a read behind otherwise takes first.
"""

from __future__ import annotations

import math

import trio

from triogate.providers.http1 import set_pacer

#: How often the probe looks at the run loop, and the hold's granularity (seconds).
TICK_S = 0.005

#: A probe that woke this much later than asked means the worker is behind (seconds).
BEHIND_S = TICK_S


class StreamPacer:
    """Decides whether streams hold between writes, and holds them (see the module).

    ``window_s`` 0 or a probe that does not run: nothing is ever held. Counters for tests
    and metrics: :attr:`holds` (holds so far), :attr:`open` (streams open now).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        #: Whether the probe's last two wake-ups were late (the streams read this).
        self.behind = False
        self.holds = 0
        self.open = 0
        self._wheel: dict[int, trio.lowlevel.ParkingLot] = {}
        self._next_slot = 0  # the first slot the probe has not unparked yet
        self._woken = trio.Event()  # set when the first stream opens

    def opened(self) -> None:
        """A stream started forwarding."""
        self.open += 1
        if self.open == 1:
            self._woken.set()

    def closed(self) -> None:
        """A stream stopped forwarding."""
        self.open -= 1

    async def hold(self) -> None:
        """Wait about one window (rounded up to the next tick); a checkpoint."""
        self.holds += 1
        slot = math.ceil((trio.current_time() + self.window_s) / TICK_S)
        slot = max(slot, self._next_slot)
        lot = self._wheel.get(slot)
        if lot is None:
            lot = self._wheel[slot] = trio.lowlevel.ParkingLot()
        await lot.park()

    async def run(self) -> None:
        """The probe: while streams are open, wake every tick, measure how late, and
        release the held streams that are due. Never returns (cancelled with the app)."""
        if self.window_s <= 0:
            await trio.sleep_forever()
        set_pacer(self)  # a held stream's next upstream read takes no extra pass
        was_late = False
        self._next_slot = math.floor(trio.current_time() / TICK_S)
        try:
            while True:
                if not self.open and not self._wheel:
                    self.behind = False  # nothing can park until the probe sees lateness
                    self._woken = trio.Event()
                    await self._woken.wait()
                    was_late = False
                    self._next_slot = math.floor(trio.current_time() / TICK_S)
                # The next tick strictly after now (a wake-up exactly on a tick may divide
                # to just below it, and sleeping until now again would spin).
                due = (math.floor(trio.current_time() / TICK_S + 1e-9) + 1) * TICK_S
                await trio.sleep_until(due)
                now = trio.current_time()
                late = now - due > BEHIND_S
                self.behind = late and was_late
                was_late = late
                self._release(math.floor(now / TICK_S + 1e-9))
        finally:
            self.behind = False
            for lot in self._wheel.values():
                lot.unpark_all()
            self._wheel.clear()

    def _release(self, upto: int) -> None:
        """Unpark the slots due by slot ``upto``."""
        wheel = self._wheel
        if wheel:
            # Walk the slots passed since the last tick; after a long pause, the few
            # slots in use instead.
            slots = range(self._next_slot, upto + 1) if upto - self._next_slot < len(wheel) \
                else sorted(slot for slot in wheel if slot <= upto)
            for slot in slots:
                lot = wheel.pop(slot, None)
                if lot is not None:
                    lot.unpark_all()
        self._next_slot = max(self._next_slot, upto + 1)
