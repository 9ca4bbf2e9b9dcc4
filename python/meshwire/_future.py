"""meshwire futures as asyncio futures.  Each operation's mw_future_t gets
one callback (a single cffi trampoline for all of them); the callback
resolves an asyncio future on the context's loop.  Cancelling that asyncio
future (the awaiting task was cancelled) cancels the meshwire operation;
whatever the operation was lent stays referenced until meshwire says it is
done with it, which is when its callback runs."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from ._lib import error, ffi, lib


class Op:
    """One operation in flight: its meshwire future (our reference), the
    asyncio future awaiting it, and what it was lent."""

    __slots__ = ("ctx", "f", "af", "convert", "orphan", "keep", "after", "handle")

    def __init__(self, ctx: Any, f: Any, af: asyncio.Future, convert: Optional[Callable],
                 orphan: Optional[Callable], keep: Any, after: Optional[Callable]):
        self.ctx, self.f, self.af = ctx, f, af
        self.convert, self.orphan, self.keep, self.after = convert, orphan, keep, after
        self.handle = ffi.new_handle(self)

    def cancel_if_abandoned(self, af: asyncio.Future) -> None:
        if af.cancelled() and self.f is not None:
            lib.mw_future_cancel(self.f)   # its callback still runs, when meshwire is done


def _settle(op: Op, f: Any) -> None:
    if lib.mw_future_state(f) == lib.MW_FUTURE_DONE:
        value = lib.mw_future_value(f)
        if op.af.done():                   # nobody waits any more: keep nothing lost
            if op.orphan:
                op.orphan(op.convert(value) if op.convert else None)
        else:
            try:
                op.af.set_result(op.convert(value) if op.convert else None)
            except Exception as e:         # the conversion's own failure
                op.af.set_exception(e)
    elif not op.af.done():
        msg = ffi.string(lib.mw_future_message(f)).decode(errors="replace")
        op.af.set_exception(error(lib.mw_future_error(f), msg))


@ffi.callback("void(mw_future_t *, void *)")
def _on_done(f: Any, arg: Any) -> None:
    op: Op = ffi.from_handle(arg)
    try:
        _settle(op, f)
        if op.after:
            op.after()
    except BaseException as e:             # never let one escape into C
        op.ctx._loop.call_exception_handler(
            {"message": "meshwire: a completion handler failed", "exception": e})
    finally:
        op.ctx._ops.discard(op)
        op.keep = None
        lib.mw_future_unref(op.f)
        op.f = None
        # The handle keeps the Op alive, and the Op its result (a received
        # message's view, say): dropped, neither waits for the cycle
        # collector.
        op.handle = None


async def wait(af: asyncio.Future, orphan: Optional[Callable]) -> Any:
    """Await @af; when the awaiting task is cancelled after @af got its
    result (the result was set, the task not yet resumed), hand the result
    to @orphan instead of dropping it."""
    try:
        return await af
    except asyncio.CancelledError:
        if orphan and af.done() and not af.cancelled() and af.exception() is None:
            orphan(af.result())
        raise


def bridge(ctx: Any, f: Any, what: str, *, convert: Optional[Callable] = None,
           orphan: Optional[Callable] = None, keep: Any = None,
           after: Optional[Callable] = None) -> asyncio.Future:
    """An asyncio future for the meshwire future @f (whose reference it
    takes).  @convert turns the value into the result; @orphan receives a
    result nobody will take, the awaiting task having given up (a message
    to keep for the next receive, a connection to abort); @keep stays
    referenced until meshwire is done; @after runs then."""
    if f == ffi.NULL:
        if after:
            after()
        raise error(-(ffi.errno or 12), f"{what}: refused")
    af = ctx._loop.create_future()
    op = Op(ctx, f, af, convert, orphan, keep, after)
    ctx._ops.add(op)
    rc = lib.mw_future_then(f, _on_done, op.handle)
    if rc < 0:                             # a refused handle: fail with why
        ctx._ops.discard(op)
        lib.mw_future_unref(f)
        if after:
            after()
        raise error(rc, f"{what}: {ffi.string(lib.mw_strerror(rc)).decode()}")
    af.add_done_callback(op.cancel_if_abandoned)
    return af
