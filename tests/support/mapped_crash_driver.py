"""Crash trials for MappedFileStorage commits (run by tests/storage/test_mapped.py).

Usage: ``python mapped_crash_driver.py TRIALS.json``; prints one JSON line per trial.

A single-threaded process that imports uni once, then for each trial forks a writer that
commits one write lease and is stopped at a step of the commit (``UNI_TEST_CRASH_AT``:
``os._exit`` or SIGKILL), optionally forks a second process that stops in the middle of
rolling that commit back, and then opens the file itself (which rolls back whatever was
left) and reports what it finds: the elements, what an ``np.memmap`` opened before all the
trials shows, and every file left beside the data file once its storage is closed. A trial
with ``"recover": true`` first runs ``uni.storage.recover`` and reports what plain
``numpy.fromfile`` then reads (no storage opened yet). The test compares all that with its
own model of what each trial must leave.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
from typing import Any

import numpy as np

import uni
from uni.storage import MappedFileStorage, _file_state, recover


def _view(t: uni.Tensor, key: list[Any]) -> uni.Tensor:
    rows, step = key
    return t[rows[0] : rows[1], :: step]


def _fork(env: dict[str, str], body: Any) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never returns into the driver's loop
        code = 0
        try:
            os.environ.update(env)
            body()
        except BaseException as err:  # report and exit: a child must not run the trials too
            print(json.dumps({"child_error": repr(err)}), file=sys.stderr, flush=True)
            code = 70
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    path, offset, shape = config["path"], config["offset"], tuple(config["shape"])
    n = int(np.prod(shape))
    directory = os.path.dirname(path)
    # Opened once, before every trial: it must see each committed write as it happens.
    watcher = np.memmap(path, dtype=np.float64, mode="r", offset=offset, shape=shape)

    def open_tensor() -> tuple[MappedFileStorage, uni.Tensor]:
        storage = MappedFileStorage(path, np.float64, n, offset=offset)
        return storage, uni.Tensor.from_storage(storage, uni.layout_right(shape))

    for trial in config["trials"]:
        def write(trial: dict[str, Any] = trial) -> None:
            _file_state.CHECK_LIMIT = trial["check_limit"]
            _, t = open_tensor()
            view = _view(t, trial["view"])
            values = np.random.default_rng(trial["seed"]).standard_normal(view.shape)
            with uni.acquire_host_write_access_sync(view, overwrite=trial["overwrite"]) as lease:
                np.asarray(lease.mdspan())[...] = values

        status = _fork({"UNI_TEST_CRASH_AT": trial["crash"]}, write)
        recovery_status = None
        if trial.get("recovery_crash"):
            recovery_status = _fork({"UNI_TEST_CRASH_AT": trial["recovery_crash"]}, open_tensor)
        torn = bool(os.path.isdir(os.path.join(directory, f".{os.path.basename(path)}.uni-journal")))
        extra: dict[str, Any] = {}
        if trial.get("recover"):
            done = recover(path)
            plain = np.fromfile(path, dtype=np.float64, offset=offset)[:n]
            extra = {"plain": hashlib.sha256(plain.tobytes()).hexdigest(),
                     "actions": [j.action for j in done.journals]}
        storage, t = open_tensor()  # rolls back what the crash left (if recover did not)
        with uni.acquire_host_read_access_sync(t) as lease:
            after = np.array(lease.mdspan())
        seen = np.array(watcher)
        storage.close()
        del storage, t, lease
        gc.collect()
        left = sorted(name for name in os.listdir(directory) if name != os.path.basename(path))
        print(json.dumps({
            "status": status, "recovery_status": recovery_status, "journal_dir_before": torn,
            "after": hashlib.sha256(after.tobytes()).hexdigest(),
            "memmap": hashlib.sha256(seen.tobytes()).hexdigest(), "left": left, **extra,
        }), flush=True)


if __name__ == "__main__":
    main()
