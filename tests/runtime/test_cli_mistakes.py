"""Every mistake on the `minidist` command line is one line and exit status 2.

The table runs in this process (``main(argv)``), stopping before anything is
started: a mistake must be found before a rank runs.
"""

from __future__ import annotations

import pytest

from minidist.cli import main

MISTAKES = [
    # (command line, words the one line must contain)
    ("run -n 0 examples/hello.py", "-n/--nproc: must be at least 1, got 0"),
    ("run -n -3 examples/hello.py", "must be at least 1, got -3"),
    ("run -n two examples/hello.py", "expected a whole number, got 'two'"),
    ("run examples/hello.py", "required: -n/--nproc"),
    ("run -n 2", "required: script"),
    ("run -n 2 --transport tcp examples/hello.py", "invalid choice: 'tcp'"),
    ("run -n 2 --timeout 0 examples/hello.py", "--timeout: must be a number above 0"),
    ("run -n 2 --timeout soon examples/hello.py", "expected a number, got 'soon'"),
    ("run -n 2 no_such_script.py", "no such script: no_such_script.py"),
    ("run -n 2 --trace /no/such/folder/t.jsonl examples/hello.py", "/no/such/folder does not exist"),
    ("train --model rnn", "invalid choice: 'rnn'"),
    ("train --epochs 0", "--epochs: must be at least 1"),
    ("train --batch-size -1", "--batch-size: must be at least 1"),
    ("train --lr 0", "--lr: must be a number above 0"),
    ("demo --epochs 0", "--epochs must be at least 1, got 0"),
    ("demo no_such_collective", "no collective called 'no_such_collective'"),
    ("demo all_reduce --algorithm no_such_algorithm", "no algorithm 'no_such_algorithm'"),
    ("demo all_reduce -n 0", "at least 2 ranks"),
    ("demo ring-allreduce --speed 0", "--speed 0"),
    ("viz no_such_trace.jsonl", "no trace at no_such_trace.jsonl"),
    ("profile no_such_trace.jsonl", "no trace at no_such_trace.jsonl"),
    ("profile README.md", "README.md is not a minidist trace"),
    ("profile examples/hello.py --rank two", "invalid int value: 'two'"),
    ("plan --html no_such_folder/plan.html", "the folder"),
    ("simulate all_reduce -n 0", "must be at least 1, got 0"),
    ("simulate all_reduce -n 4 --size banana", "'banana'"),
    ("simulate no_such_collective -n 4", "cannot simulate 'no_such_collective'"),
    ("simulate all_reduce -n 4 --algorithm no_such_algorithm", "no algorithm"),
    ("predict -n 0", "must be at least 1, got 0"),
    ("predict --copies 0", "--copies must be at least 1"),
    ("predict --epochs 0", "--epochs must be at least 1"),
    ("bench collectives --world-sizes 0", "--world-sizes"),
    ("lesson 99", "there is no lesson 99"),
    ("lesson one", "invalid int value: 'one'"),
    ("no_such_command", "invalid choice: 'no_such_command'"),
    ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
]


@pytest.mark.parametrize("command, words", MISTAKES, ids=[c for c, _ in MISTAKES])
def test_a_mistake_is_one_line_and_status_2(command, words, capsys, monkeypatch):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    status = main(command.split())
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, (status, captured.err, captured.out)
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("minidist") and words in lines[0], lines[0]
    assert "Traceback" not in captured.out + captured.err


def test_help_and_version_still_exit_0(capsys):
    assert main(["--version"]) == 0
    assert "minidist 0.1.0" in capsys.readouterr().out
    assert main(["run", "--help"]) == 0
    assert "--nproc" in capsys.readouterr().out
