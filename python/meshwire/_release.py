"""What Python's garbage collector hands back to meshwire, and callbacks
that must never reach a Python object that is gone.

A finalizer (of a buffer from Context.alloc, a Connection, a Listener, a
Communicator dropped without being closed) can run on any thread, at any
allocation, and inside anything: in a callback meshwire runs from
mw_ctx_progress, or while this thread holds a lock.  So a finalizer only
queues what is to be released and wakes the loop (Reaper.later: a deque
append and a call_soon); the loop then releases it on its own thread,
outside meshwire's dispatch, as the C library requires.  A received
message's view is the exception: mw_msg_free only frees memory and is
thread-safe, so its finalizer calls it directly (see _conn._message).

C callbacks (accepted connections, immediates) carry a number, not a cffi
handle: the number names a weak reference (Callbacks), so a callback that
arrives after its Python object was collected finds nothing and does no
harm, where a dead handle would have made cffi abort the process."""
from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any, Callable, Optional

from ._lib import T, ffi


class Reaper:
    """Releases handed over by finalizers, run on the loop's thread."""

    def __init__(self, loop: Any):
        self._loop = loop
        self._thread = threading.get_ident()
        self._queue: collections.deque = collections.deque()
        self._woken = False

    def later(self, fn: Callable, *args: Any) -> None:
        """Run @fn(*args) from the loop soon.  Safe in a finalizer, on any
        thread: an append, and a wake-up unless one is pending."""
        self._queue.append((fn, args))
        if self._woken:
            return
        self._woken = True
        try:
            if threading.get_ident() == self._thread:
                self._loop.call_soon(self.run)
            else:
                self._loop.call_soon_threadsafe(self.run)
        except Exception:                  # the loop is closed (or the interpreter
            self._woken = False            # ending): nobody will run it

    def run(self) -> None:
        """Run what is queued (from the loop, or from the owner's own code:
        never from a finalizer)."""
        self._woken = False                # first: a later() meanwhile wakes again
        while self._queue:
            fn, args = self._queue.popleft()
            try:
                fn(*args)
            except Exception as e:         # one failure must not strand the rest
                self._loop.call_exception_handler(
                    {"message": "meshwire: releasing a collected object failed", "exception": e})


class Callbacks:
    """Numbers standing for Python objects in C callbacks' void *arg."""

    def __init__(self) -> None:
        self._objs: dict = {}
        self._next = itertools.count(1)

    def add(self, obj: Any) -> int:
        key = next(self._next)
        self._objs[key] = weakref.ref(obj)
        return key

    @staticmethod
    def arg(key: int) -> Any:
        return ffi.cast(T.void_p, key)

    def get(self, arg: Any) -> Optional[Any]:
        """The object @arg stands for, or None once it is gone."""
        ref = self._objs.get(int(ffi.cast(T.uintptr, arg)))
        return ref() if ref is not None else None

    def forget(self, key: int) -> None:
        self._objs.pop(key, None)


callbacks = Callbacks()


def finalize(obj: Any, fn: Callable, *args: Any) -> weakref.finalize:
    """weakref.finalize(@obj, @fn, *@args), not run at interpreter exit
    (the loops are gone by then; the process's end releases everything)."""
    f = weakref.finalize(obj, fn, *args)
    f.atexit = False
    return f
