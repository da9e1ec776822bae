"""Where the workers of a search meet: a folder with a ticket counter and an
append-only journal of JSON lines (the idea of Optuna's JournalFileStorage,
in forty lines).

* ``tickets``: the next trial number, one integer. A worker takes a number
  by locking the file, reading it, writing it plus one: this is the shared
  queue that hands out trials one by one (dynamic assignment).
* ``trials.jsonl``: one line when a trial starts, one when it ends. A line
  is written whole under the lock and flushed at once: it is then in the
  kernel's hands and survives the worker dying the next instant; a trial with a start line and no
  end line is a trial whose worker died in the middle.

The lock is ``fcntl.flock``: the kernel lets go of it when the process that
holds it dies, even by SIGKILL, so a crashed worker can never leave the
others waiting for a lock it took with it (a semaphore would).
"""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path

TICKETS = "tickets"
TRIALS = "trials.jsonl"


@contextmanager
def _locked(path: Path, mode: str):
    with open(path, mode, encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield file
        finally:
            file.flush()
            fcntl.flock(file, fcntl.LOCK_UN)


class Journal:
    """The shared record of one search, in ``folder`` (created if needed)."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def create(self) -> Journal:
        """A fresh journal: the ticket counter at 0, no trials. A folder that
        already holds a journal is refused rather than silently mixed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if (self.folder / TRIALS).exists() and (self.folder / TRIALS).stat().st_size:
            raise FileExistsError(f"{self.folder / TRIALS} already holds a search's trials; "
                                  "give a new folder (or delete it) to start another search")
        (self.folder / TICKETS).write_text("0\n", encoding="utf-8")
        (self.folder / TRIALS).write_text("", encoding="utf-8")
        return self

    def take_ticket(self) -> int:
        """The next trial number, never handed out twice."""
        with _locked(self.folder / TICKETS, "r+") as file:
            number = int(file.read().strip() or 0)
            file.seek(0)
            file.write(f"{number + 1}\n")
            file.truncate()
        return number

    def append(self, record: dict) -> None:
        line = json.dumps(record, default=_jsonable) + "\n"
        with _locked(self.folder / TRIALS, "a") as file:
            file.write(line)

    def read(self) -> list[dict]:
        """Every record, in the order they were written."""
        path = self.folder / TRIALS
        if not path.exists():
            return []
        with _locked(path, "r") as file:
            return [json.loads(line) for line in file if line.strip()]


def _jsonable(value):
    """NumPy scalars as Python numbers; anything else by its repr."""
    if hasattr(value, "item"):
        return value.item()
    return repr(value)


__all__ = ["Journal"]
