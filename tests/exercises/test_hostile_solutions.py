"""`minidist exercise check` cannot be fooled or held by the solution it runs.

Each solution here is hostile on purpose: it exits the process, swallows the
deadline, sits in one long C call, forks children and leaves them, stops the
checker, allocates past the memory limit, or is not a `.py` file. Each is
checked by the real command in a fresh process, as a grader would run it:
the status is 0 only for a verified pass, the first line says what happened,
the command ends within its deadline and a few seconds, and no process of
the check (its command line names this test's folder) nor any shared memory
it made is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from minidist.exercises.exercise import CHECK_DEADLINE
from minidist.exercises.supervised import GRACE

#: seconds a check may take besides its deadline: an interpreter, NumPy and
#: minidist to import, eight launches, on a loaded two-core machine
SLACK = 8.0

CORRECT = "from minidist.exercises.ring_allreduce import ring_allreduce  # noqa: F401\n"

# (name, file name, source, exit status, words of the first line, seconds at most);
# PIDS in a source is replaced by the path of a file the solution writes pids to.
HOSTILE = [
    ("sys_exit_at_import", "solution.py", "import sys\nsys.exit(0)\n", 1,
     "your solution called sys.exit(0) while being checked", SLACK),
    ("sys_exit_in_function", "solution.py",
     "import sys\n\ndef ring_allreduce(comm, buffer):\n    sys.exit(0)\n    yield []\n", 1,
     "your solution called sys.exit(0) while being checked", SLACK),
    ("os_exit_in_function", "solution.py",
     "import os\n\ndef ring_allreduce(comm, buffer):\n    os._exit(0)\n    yield []\n", 1,
     "your solution exited the process (status 0)", SLACK),
    ("swallows_the_deadline", "solution.py",
     "import time\nwhile True:\n    try:\n        time.sleep(1)\n    except BaseException:\n"
     "        pass\n", 1, f"did not finish within {CHECK_DEADLINE:g} s (importing",
     CHECK_DEADLINE + GRACE + SLACK),
    ("one_long_c_call", "solution.py", "sum(range(10**10))\n", 1,
     f"did not finish within {CHECK_DEADLINE:g} s (importing", CHECK_DEADLINE + GRACE + SLACK),
    ("forks_and_leaves_children", "solution.py",
     CORRECT + "import os, time\nwith open(PIDS, 'w') as file:\n    for _ in range(30):\n"
     "        pid = os.fork()\n        if pid == 0:\n            time.sleep(600)\n"
     "            os._exit(0)\n        file.write(f'{pid}\\n')\n", 1,
     "your solution left 30 process(es) running after the check", SLACK),
    ("stops_the_checker_in_a_launch", "solution.py",
     "import os, signal\nCHECKER = os.getpid()\nwith open(PIDS, 'w') as file:\n"
     "    file.write(f'{CHECKER}\\n')\n\n"
     "def ring_allreduce(comm, buffer):\n"
     "    if os.getpid() != CHECKER:  # a real process: stop the launcher\n"
     "        os.kill(CHECKER, signal.SIGSTOP)\n"
     "    from minidist.exercises.ring_allreduce import ring_allreduce as right\n"
     "    yield from right(comm, buffer)\n", 1,
     f"did not finish within {CHECK_DEADLINE:g} s (ring_allreduce on 1 processes)",
     CHECK_DEADLINE + GRACE + SLACK),
    ("past_the_memory_limit", "solution.py",
     "import numpy as np\nhuge = np.empty(3 << 30, dtype=np.uint8)\n", 1,
     "your solution ran out of memory: the check may map 2 GiB more", SLACK),
    ("not_a_py_name", "solution.txt", CORRECT, 0, "", SLACK),
    ("a_syntax_error", "solution.py", "def ring_allreduce(comm, buffer:\n", 2,
     "solution.py is not valid Python: '(' was never closed at line 1", SLACK),
    ("an_import_error", "solution.py", "import no_such_module_here\n", 2,
     "raised while being imported: ModuleNotFoundError", SLACK),
]


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie waits for an init that may
    never reap it: it holds no memory and runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _processes_naming(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    if marker.encode() in file.read() and _alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,file,source,status,words,seconds", HOSTILE,
                         ids=[case[0] for case in HOSTILE])
def test_a_hostile_solution_is_stopped_and_told(tmp_path, name, file, source, status, words,
                                               seconds):
    pids = tmp_path / "pids"
    solution = tmp_path / file
    solution.write_text(source.replace("PIDS", repr(str(pids))))
    command = [sys.executable, "-c", "import sys; from minidist.cli import main; "
               "sys.exit(main())", "exercise", "check", "ring_allreduce", str(solution),
               "--no-files"]
    started = time.monotonic()
    check = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=tmp_path)
    try:
        output, _ = check.communicate(timeout=seconds + 10)
    except subprocess.TimeoutExpired:
        os.killpg(check.pid, signal.SIGKILL)  # the check's and the solution's processes
        check.communicate()
        pytest.fail(f"the check still ran after {seconds + 10:g} s")
    took = time.monotonic() - started
    text = output.decode(errors="replace")
    lines = text.strip().splitlines()
    assert check.returncode == status, text
    if status == 0:
        assert lines[-1] == "ring_allreduce: passed", text
    else:
        assert words in lines[0], text
    assert took < seconds, f"{took:.1f} s: {text}"
    deadline = time.monotonic() + 2  # a SIGKILLed process ends a moment after the kill
    while _processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_naming(str(tmp_path))
    for pid in map(int, pids.read_text().split()) if pids.exists() else []:
        assert not _alive(pid), f"the solution's process {pid} is still alive"
        assert not [segment for segment in os.listdir("/dev/shm")
                    if segment.startswith(f"minidist_{pid}_")]
