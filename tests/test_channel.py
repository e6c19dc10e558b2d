"""A worker's channel to its supervisor: typed notes on a pipe of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from kascade.dataflow import channel
from kascade.dataflow.channel import Event, Note

CHILD = textwrap.dedent(
    """
    import os, subprocess, sys
    from kascade.dataflow import channel
    from kascade.dataflow.channel import Event, Note
    channel.open_from_environment()
    print("worker:", channel.is_worker(), flush=True)
    channel.announce_joined()
    channel.tell(Note(event=Event.TOTALS, counts={"labeled": 3}))
    # a process it starts has no channel
    subprocess.run([sys.executable, "-c", "import os; print(os.environ.get(%r))" % channel.ENV])
    channel.tell(Note(event=Event.FAILED, cause="worker 1: boom\\nsecond line"))
    """
)


def test_a_worker_tells_its_supervisor_on_the_pipe_and_its_output_stays_its_own() -> None:
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(write_end,),
        env=os.environ | {channel.ENV: str(write_end)},
    )
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as stream:
        notes = list(channel.notes(stream))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert [n.event for n in notes] == [Event.JOINED, Event.TOTALS, Event.FAILED]
    assert notes[1].counts == {"labeled": 3}
    assert notes[2].cause == "worker 1: boom\nsecond line"  # one note, whatever it holds
    assert out.splitlines() == ["worker: True", "None"]


def test_without_a_supervisor_telling_does_nothing() -> None:
    assert not channel.is_worker()
    channel.announce_joined()
    channel.tell(Note(event=Event.FAILED, cause="x"))


def test_a_line_that_is_not_a_note_is_skipped_not_fatal() -> None:
    import io

    stream = io.StringIO('garbage\n{"event": "joined"}\n{"event": "nope"}\n')
    assert [n.event for n in channel.notes(stream)] == [Event.JOINED]
