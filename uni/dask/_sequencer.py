"""The client as the sequencer: uni's FIFO/epoch rule per chunk, as Dask graph edges.

For each chunk the session keeps the last writer's task and the readers registered since.
A read depends on the last writer; a write depends on the last writer and every reader since.
Registration happens when the operation is called, in program order, as uni's ``_async``
acquisitions do; readers of one epoch run concurrently on any workers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import threading
import uuid
from collections.abc import Generator, Sequence
from typing import Any

import attrs
import distributed
import numpy as np
import sniffio
import trio
from distributed.scheduler import KilledWorker

import uni
from uni.dask import _current, _layout
from uni.dask._grid import Index
from uni.dask._tasks import TileTask, Token, run_tile_task
from uni.dask._tiled import TiledTensor

log = logging.getLogger("uni.dask")

ChunkId = tuple[str, Index]


class _Task:
    """One registered tile task: its Dask future and its place in the chunk orders."""

    __slots__ = (
        "dependents",
        "deps",
        "epoch",
        "future",
        "key",
        "reads",
        "what",
        "withdrawn",
        "writes",
    )

    def __init__(self, key: Any, what: str, writes: ChunkId, epoch: int | None,
                 reads: tuple[ChunkId, ...], deps: tuple[_Task, ...]) -> None:
        self.key = key
        self.what = what
        self.writes = writes
        self.epoch = epoch
        self.reads = reads
        self.deps = deps
        self.dependents: list[_Task] = []
        self.future: distributed.Future | None = None
        self.withdrawn = False

    @property
    def status(self) -> str:
        if self.future is None:
            return "pending"
        status = str(self.future.status)
        # "lost": the task finished, then the worker holding its token died. Its chunk is
        # committed in the store; only Dask's copy of the token is gone.
        return "finished" if status == "lost" else status


class _Chunk:
    """The registrations on one chunk not yet settled, in program order."""

    __slots__ = ("entries", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch  # the epoch of the last registered writer (or what the store holds)
        self.entries: list[tuple[bool, _Task]] = []

    def last_writer(self) -> _Task | None:
        for write, task in reversed(self.entries):
            if write:
                return task
        return None

    def readers_since(self) -> list[_Task]:
        readers = []
        for write, task in reversed(self.entries):
            if write:
                break
            readers.append(task)
        readers.reverse()
        return readers

    def prune(self) -> None:
        """Drop what no later registration must wait for: whatever has finished, except
        the last writer (its state says whether the chunk is poisoned)."""
        entries = self.entries
        last = max((n for n, (write, _) in enumerate(entries) if write), default=None)
        if last is not None and entries[last][1].status == "finished":
            entries = entries[last:]  # a finished writer settles everything before it
            last = 0
        self.entries = [e for n, e in enumerate(entries)
                        if n == last or e[1].status != "finished"]


@attrs.frozen
class TileItem:
    """One output tile of an operation, for registration."""

    index: Index
    reads: tuple[tuple[TiledTensor, Index], ...]
    overwrite: bool
    body: Any
    #: The worker this tile should run on (a preference: any other runs it if that one is
    #: gone), or None for whichever frees first (uni.dask._placement).
    worker: str | None = None


def _all_done(futures: Sequence[distributed.Future],
              outcome: Any) -> concurrent.futures.Future[Any]:
    """A future that completes, with ``outcome()``, once every Dask future is done."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def finish() -> None:
        try:
            done.set_result(outcome())
        except BaseException as err:  # never lose the waiter: hand it the failure
            done.set_exception(err)

    if not futures:
        finish()
        return done

    def one(_: Any) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            finish()

    for future in futures:
        future.add_done_callback(one)
    return done


async def _await_trio(future: concurrent.futures.Future[Any]) -> Any:
    if future.done():
        await trio.lowlevel.checkpoint()
        return future.result()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    lock = threading.Lock()
    parked = [True]

    def wake(_: Any) -> None:
        with lock:
            if not parked[0]:
                return
            parked[0] = False
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(trio.lowlevel.reschedule, task)

    def abort(_: Any) -> trio.lowlevel.Abort:
        # Cancelling the waiter stops the waiting, not the work (cancel() withdraws it).
        with lock:
            if not parked[0]:
                return trio.lowlevel.Abort.FAILED
            parked[0] = False
        return trio.lowlevel.Abort.SUCCEEDED

    future.add_done_callback(wake)
    await trio.lowlevel.wait_task_rescheduled(abort)
    return future.result()


class TiledFuture:
    """A registered tiled operation: ``await`` it (trio, asyncio) or ``.result(timeout=)``.

    Raises what its own task raised, or ``uni.PoisonedError`` (``__cause__``: the original
    failure) when a task it depended on failed first.
    """

    def __init__(self, session: Session, what: str, out: TiledTensor,
                 tasks: list[_Task]) -> None:
        self._session = session
        self.op = what
        self.out = out
        self._tasks = tasks
        self._done = _all_done([t.future for t in tasks if t.future is not None],
                               self._outcome)

    @property
    def futures(self) -> list[distributed.Future]:
        """The Dask futures of the tasks, one per output tile."""
        return [t.future for t in self._tasks if t.future is not None]

    def done(self) -> bool:
        return self._done.done()

    def _outcome(self) -> BaseException | None:
        own: BaseException | None = None
        poisoned: BaseException | None = None
        for task in self._tasks:
            status = task.status
            if status == "cancelled" or task.withdrawn:
                if own is None:
                    own = concurrent.futures.CancelledError(
                        f"{self.op}: the task of tile {task.writes[1]} was cancelled "
                        "(withdrawn from the sequencer)")
                continue
            if status != "error":
                continue
            assert task.future is not None
            err = task.future.exception()
            if err is None:
                continue
            if self._session.caused_by(task, err):
                own = own or err
            elif poisoned is None:
                poisoned = uni.PoisonedError(
                    f"{self.op}: tile {task.writes[1]} of {task.writes[0]} was not computed: "
                    f"an operation it waited for failed ({type(err).__name__}: {err})"
                )
                poisoned.__cause__ = err
        return own or poisoned

    def result(self, timeout: float | None = None) -> TiledTensor:
        """Wait for every tile (``timeout`` in seconds); raise the operation's error.

        Returns the output tensor (``await`` returns it too).
        """
        try:
            outcome = self._done.result(timeout)
        except concurrent.futures.TimeoutError:
            pending = sum(1 for t in self._tasks if t.status not in ("finished", "error",
                                                                      "cancelled"))
            raise TimeoutError(
                f"{self.op} on {self.out.path}: {pending} of {len(self._tasks)} tiles not "
                f"finished within {timeout} s") from None
        if outcome is not None:
            raise outcome
        return self.out

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as err:
            return err
        return None

    def cancel(self) -> None:
        """Withdraw the tasks that have not finished from the sequencer, and cancel them.

        Tasks registered later that wait for them are withdrawn and cancelled too (Dask
        cancels the dependents of a cancelled task). A task already running on a worker
        cannot be stopped there: it may still commit its chunk.
        """
        self._session.withdraw(self._tasks)

    def cancelled(self) -> bool:
        return any(t.withdrawn for t in self._tasks)

    def tokens(self, timeout: float | None = None) -> list[Token]:
        """The few-byte tokens the tasks returned (tile, epoch, backends that ran)."""
        self.result(timeout)
        return list(self._session.client.gather(self.futures))

    def __await__(self) -> Generator[Any, None, TiledTensor]:
        return self._await().__await__()

    async def _await(self) -> TiledTensor:
        library = sniffio.current_async_library()
        if library == "trio":
            outcome = await _await_trio(self._done)
        else:
            import asyncio  # only under asyncio: trio programs never load it here

            outcome = await asyncio.wrap_future(self._done)
        if outcome is not None:
            raise outcome
        return self.out

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<uni.dask.TiledFuture {self.op} -> {self.out.path}: {len(self._tasks)} tiles, {state}>"


class Session:
    """The sequencer of one program on one Dask client. Use ``uni.dask.session(client)``."""

    def __init__(self, client: distributed.Client, *, ordered: bool = True,
                 cache_bytes: int | None = None,
                 diagnostics: bool = False, close_timeout: float | None = None) -> None:
        if not isinstance(client, distributed.Client):
            raise TypeError(f"uni.dask.session needs a distributed.Client, got {client!r}")
        if client.asynchronous:
            raise TypeError("uni.dask.session needs a synchronous distributed.Client "
                            "(asynchronous=False); await its operations instead")
        self.client = client
        self.ordered = bool(ordered)
        self.cache_bytes = cache_bytes
        self.diagnostics = bool(diagnostics)
        self.close_timeout = close_timeout
        self._lock = threading.RLock()
        self._chunks: dict[ChunkId, _Chunk] = {}
        self._base: dict[str, dict[Index, int]] = {}
        self._live: dict[Any, _Task] = {}
        self._ids = itertools.count()
        self._closed = False

    # -- context -------------------------------------------------------------------------
    def __enter__(self) -> Session:
        implicit = _implicit_session(self.client)
        if implicit is not None and implicit is not self:
            # Program order across the two sequencers: what the client's own session
            # registered finishes first, and it forgets its chunk state (it reads the epochs
            # from the stores again when next used, after this block's commits).
            implicit.drain(self.close_timeout)
            implicit.reset()
        _current.push(self)
        return self

    def reset(self) -> None:
        """Forget the chunk state (call only once every registered task has finished)."""
        with self._lock:
            self._chunks.clear()
            self._base.clear()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self.drain(self.close_timeout)
            else:
                self.withdraw(list(self._live.values()))
        finally:
            self.close()

    def close(self) -> None:
        """Leave the session (idempotent). Registered tasks keep running on the cluster."""
        if self._closed:
            return
        self._closed = True
        _current.pop(self)
        with self._lock:
            self._chunks.clear()
            self._live.clear()

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every registered task has finished; record the poison of failed
        writers in their stores (errors are not raised here: ``wait()`` raises them)."""
        with self._lock:
            tasks = list(self._live.values())
        futures = [t.future for t in tasks if t.future is not None and t.status != "finished"]
        if futures:
            try:
                distributed.wait(futures, timeout=timeout)
            except (TimeoutError, distributed.TimeoutError):
                raise TimeoutError(
                    f"uni.dask.session: tasks still running after {timeout} s") from None
        for task in tasks:
            self._settle(task)

    def _settle(self, task: _Task) -> None:
        """A failed writer leaves a poison marker in its store (idempotent)."""
        if task.status != "error" or task.epoch is None or task.withdrawn:
            return
        assert task.future is not None
        err = task.future.exception()
        if err is not None:
            with contextlib.suppress(OSError):
                _layout.write_marker(task.writes[0], task.writes[1], task.epoch, err)

    # -- chunk state ------------------------------------------------------------------------
    def _chunk(self, tiled: TiledTensor, index: Index) -> _Chunk:
        # By the whole array's index: a view and its array order on the same chunks.
        key = tiled.chunk_id(index)
        found = self._chunks.get(key)
        if found is None:
            base = self._base.get(tiled.path)
            if base is None:
                base = self._base[tiled.path] = _layout.scan_epochs(tiled.path)
            found = self._chunks[key] = _Chunk(base.get(key[1], 0))
        return found

    def forget_store(self, path: str) -> None:
        with self._lock:
            busy = [t for t in self._live.values()
                    if (t.writes[0] == path or any(r[0] == path for r in t.reads))
                    and t.status not in ("finished", "error", "cancelled")]
            if busy:
                raise uni.UniError(
                    f"{path} is still used by {len(busy)} unfinished uni.dask tasks of this "
                    "session; wait for them (tensor.wait()) before replacing the store"
                )
            for key in [k for k in self._chunks if k[0] == path]:
                del self._chunks[key]
            self._base.pop(path, None)

    def _doomed(self, task: _Task) -> bool:
        """Failed, or waits for something that failed (Dask will fail it with that error)."""
        seen: set[int] = set()
        todo = [task]
        while todo:
            t = todo.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.status == "error":
                return True
            todo.extend(t.deps)
        return False

    def caused_by(self, task: _Task, err: BaseException) -> bool:
        """Did ``task`` itself raise ``err`` (not a task it waited for)?"""
        if isinstance(err, KilledWorker):
            return bool(err.task == task.key)
        tagged = getattr(err, "uni_dask_task", None)
        if tagged is not None:
            return bool(tagged == task.key)
        return not any(self._doomed(d) for d in task.deps)

    # -- registration -------------------------------------------------------------------
    def workers(self) -> list[str]:
        """The addresses of the cluster's workers now, sorted (for placing tiles)."""
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def register(self, what: str, out: TiledTensor, items: Sequence[TileItem], *,
                 resources: dict[str, float] | None = None) -> TiledFuture:
        """Register one task per item now, in program order, and submit them to Dask."""
        if self._closed:
            raise uni.UniError("this uni.dask session is closed; open a new one")
        op_id = f"uni-dask-{what.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:12]}"
        tasks: list[_Task] = []
        with self._lock:
            for item in items:
                tasks.append(self._register_one(what, op_id, out, item, resources))
        for task in tasks:
            assert task.future is not None
            task.future.add_done_callback(self._on_done)
        return TiledFuture(self, what, out, tasks)

    def _register_one(self, what: str, op_id: str, out: TiledTensor, item: TileItem,
                      resources: dict[str, float] | None) -> _Task:
        out_chunk = self._chunk(out, item.index)
        key = (op_id, *item.index)
        read_deps: list[_Task] = []
        reads: list[tuple[TiledTensor, Index, int | None]] = []
        read_ids: list[ChunkId] = []
        for tiled, index in item.reads:
            chunk = self._chunk(tiled, index)
            if chunk is out_chunk:
                continue  # in place: the write below orders it
            writer = chunk.last_writer()
            if writer is not None:
                read_deps.append(writer)
            reads.append((tiled, index, chunk.epoch if self.ordered else None))
            read_ids.append(tiled.chunk_id(index))
        writer = out_chunk.last_writer()
        write_deps = ([writer] if writer is not None else []) + out_chunk.readers_since()
        if item.overwrite:
            # A whole-tile overwrite clears poison: it need not wait for failed writers.
            write_deps = [d for d in write_deps if not self._doomed(d)]
        else:
            reads.append((out, item.index, out_chunk.epoch if self.ordered else None))
        deps: list[_Task] = []
        if self.ordered:
            for d in read_deps + write_deps:
                if d not in deps and d.status != "finished":
                    deps.append(d)
        epoch = out_chunk.epoch + 1 if self.ordered else None
        task = _Task(key, what, out.chunk_id(item.index), epoch, tuple(read_ids), tuple(deps))
        spec = TileTask(what, key, out, item.index, epoch, tuple(reads), item.overwrite,
                        item.body, self.cache_bytes, self.diagnostics)
        # Note: a placed tile (item.worker, gemm's panel blocks) is a loose restriction: any
        # worker runs it while its own is gone, and uni.dask._placement's scheduler plugin
        # frees it from Dask's "no-worker" state when every worker died at once. Unplaced
        # tiles go to whichever worker frees first.
        task.future = self.client.submit(
            run_tile_task, spec, [d.future for d in deps], key=key, pure=False,
            resources=resources, retries=0,
            workers=None if item.worker is None else [item.worker],
            allow_other_workers=item.worker is not None,
        )
        for d in deps:
            d.dependents.append(task)
        out_chunk.entries.append((True, task))
        if epoch is not None:
            out_chunk.epoch = epoch
        for tiled, index in item.reads:
            chunk = self._chunk(tiled, index)
            if chunk is not out_chunk:
                chunk.entries.append((False, task))
                chunk.prune()
        out_chunk.prune()
        self._live[key] = task
        return task

    def register_blocks(self, what: str, target: TiledTensor, x: Any,
                        store_block: Any) -> TiledTensor:
        """Register the writers of a fresh store whose chunks come from the blocks of the
        dask array ``x`` (already chunked like ``target``): one writing task per block."""
        if self._closed:
            raise uni.UniError("this uni.dask session is closed; open a new one")
        if target.nchunks == 0:
            return target
        with self._lock:
            indices = list(target.tiles())
            chunks = [self._chunk(target, index) for index in indices]
            if any(chunk.entries for chunk in chunks):
                raise uni.UniError(f"{what}: {target.path} is in use in this session")
            epochs = {index: (chunk.epoch + 1 if self.ordered else None)
                      for index, chunk in zip(indices, chunks, strict=True)}
            tokens = x.map_blocks(
                store_block, target=target, epochs=epochs, cache_bytes=self.cache_bytes,
                dtype=np.int8, chunks=tuple((1,) * len(c) for c in x.chunks),
                meta=np.empty((0,) * x.ndim, np.int8))
            futures = self.client.compute(list(tokens.to_delayed().ravel()))
            tasks = []
            for index, chunk, future in zip(indices, chunks, futures, strict=True):
                epoch = epochs[index]
                task = _Task(future.key, what, (target.path, index), epoch, (), ())
                task.future = future
                chunk.entries.append((True, task))
                if epoch is not None:
                    chunk.epoch = epoch
                self._live[future.key] = task
                tasks.append(task)
        for task in tasks:
            assert task.future is not None
            task.future.add_done_callback(self._on_done)
        return target

    def _on_done(self, future: distributed.Future) -> None:
        """Runs on Dask's callback thread when a task ends: settle it, record poison."""
        try:
            with self._lock:
                task = self._live.get(future.key)
                if task is None:
                    return
                status = future.status
                if status == "finished":
                    task.deps = ()  # nothing more to learn from them: let them go
                    del self._live[future.key]
                    return
                if status == "cancelled":
                    del self._live[future.key]
                    return
            self._settle(task)
            with self._lock:
                self._live.pop(future.key, None)
        except Exception:  # a callback must not raise into Dask's thread
            log.exception("uni.dask: settling task %s failed", future.key)

    def withdraw(self, tasks: Sequence[_Task]) -> None:
        """Take unfinished tasks, and everything registered to wait for them, out of the
        chunk orders, and cancel them on the cluster."""
        with self._lock:
            todo = list(tasks)
            gone: list[_Task] = []
            while todo:
                task = todo.pop()
                if task.withdrawn or task.status == "finished":
                    continue
                task.withdrawn = True
                gone.append(task)
                todo.extend(task.dependents)
            for task in gone:
                for chunk_id in (task.writes, *task.reads):
                    chunk = self._chunks.get(chunk_id)
                    if chunk is not None:
                        chunk.entries = [e for e in chunk.entries if e[1] is not task]
        futures = [t.future for t in gone if t.future is not None]
        if futures:
            self.client.cancel(futures)

    # -- what tensors ask ----------------------------------------------------------------
    def _writers(self, tiled: TiledTensor) -> dict[Index, _Task]:
        with self._lock:
            found = {}
            for (path, whole_index), chunk in self._chunks.items():
                if path == tiled.path:
                    index = tiled.own_index(whole_index)  # None: outside a view
                    writer = chunk.last_writer()
                    if writer is not None and index is not None:
                        found[index] = writer
            return found

    def wait_tensor(self, tiled: TiledTensor, timeout: float | None) -> None:
        writers = self._writers(tiled)
        futures = [w.future for w in writers.values()
                   if w.future is not None and w.status != "finished"]
        if futures:
            try:
                distributed.wait(futures, timeout=timeout)
            except (TimeoutError, distributed.TimeoutError):
                pending = sum(1 for f in futures if not f.done())
                raise TimeoutError(
                    f"{tiled.path}: {pending} writers not finished within {timeout} s"
                ) from None
        poisoned = self._poisoned(tiled, writers)
        if poisoned:
            _, err = poisoned[0]
            raise err

    def _poisoned(self, tiled: TiledTensor, writers: dict[Index, _Task]
                  ) -> list[tuple[Index, uni.PoisonedError]]:
        found: list[tuple[Index, uni.PoisonedError]] = []
        for index, writer in writers.items():
            self._settle(writer)
            if writer.status == "error" or (writer.status != "finished" and self._doomed(writer)):
                cause = writer.future.exception() if writer.status == "error" and \
                    writer.future is not None else None
                err = uni.PoisonedError(
                    f"chunk {tiled.whole_index(index)} of {tiled.path} is poisoned: its last writer "
                    f"({writer.what}, epoch {writer.epoch}) failed; overwrite the whole chunk "
                    "to clear it"
                )
                err.__cause__ = cause
                found.append((index, err))
        known = {i for i, _ in found}
        for whole_index, marker in _layout.markers(tiled.path).items():
            own = tiled.own_index(whole_index)
            if own is None:
                continue  # outside the view
            last = writers.get(own)
            if own in known or (last is not None and last.status != "finished"):
                continue
            found.append((own, _current.poisoned_error(tiled, own, marker)))
        found.sort(key=lambda item: item[0])
        return found

    def poisoned_chunks(self, tiled: TiledTensor) -> tuple[Index, ...]:
        return tuple(index for index, _ in self._poisoned(tiled, self._writers(tiled)))


def session(client: distributed.Client, *, ordered: bool = True,
            cache_bytes: int | None = None, diagnostics: bool = False,
            close_timeout: float | None = None) -> Session:
    """The sequencer for one program on ``client``: ``with uni.dask.session(client): ...``.

    ``ordered=False`` switches the sequencer off (no graph edges, unversioned commits): for
    demonstrating what it prevents, never for real work. ``cache_bytes`` sets the workers' read-cache
    budget (default: 40 % of a worker's memory limit). ``diagnostics`` makes every task
    return which backend ran each of its uni operations (``TiledFuture.tokens()``).
    Leaving the block waits for every registered task (``close_timeout``); leaving it by an
    exception withdraws what has not finished.
    """
    return Session(client, ordered=ordered, cache_bytes=cache_bytes,
                   diagnostics=diagnostics, close_timeout=close_timeout)


# -- the current client's session -------------------------------------------------------------
_CLIENT_ATTRIBUTE = "_uni_dask_session"
_implicit_lock = threading.Lock()


def _implicit_session(client: distributed.Client) -> Session | None:
    found = getattr(client, _CLIENT_ATTRIBUTE, None)
    return found if isinstance(found, Session) and not found._closed else None


def _default_client() -> distributed.Client | None:
    try:
        return distributed.default_client()
    except ValueError:  # no client in this process (or every one is closed)
        return None


def client_session(client: distributed.Client) -> Session:
    """The session of ``client`` itself (created on first use): the sequencer of operations
    called outside any ``with uni.dask.session(...)`` block while ``client`` is current.

    It lives as long as the client (kept on it, so that both go together) and is never
    drained for you: wait on the futures or tensors. Opening ``uni.dask.session(client)``
    first waits for what it registered.
    """
    with _implicit_lock:
        found = _implicit_session(client)
        if found is None:
            found = Session(client)
            setattr(client, _CLIENT_ATTRIBUTE, found)
        return found


def _fallback() -> Session | None:
    """What tensors wait on outside a ``with`` block: the current client's session, if any."""
    client = _default_client()
    return None if client is None else _implicit_session(client)


_current.set_fallback(_fallback)


def current_session(what: str) -> Session:
    """The innermost ``with uni.dask.session(client):``, else the current client's session."""
    found = _current.current()
    if isinstance(found, Session) and not found._closed:
        return found
    client = _default_client()
    if client is None:
        raise uni.UniError(
            f"{what} registers its tasks with a sequencer, and there is none: call it inside "
            "`with uni.dask.session(client):`, or once a distributed.Client exists in this "
            "process (operations then use that client's own session)"
        )
    return client_session(client)


