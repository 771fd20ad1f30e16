"""The job directory's lock cannot be defeated by deleting a file (issue #10, item 8)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from provider_router import ConfigurationError
from provider_router.jobs.store import _journal_file
from provider_router.jobs.store.journal import FileJournal
from provider_router.testing import DEFAULT_TEST_KEY, SimulatorServer

HOLDER = textwrap.dedent(
    """
    import sys
    from provider_router.jobs.store.journal import FileJournal

    journal = FileJournal.open(sys.argv[1])
    journal.claim("a", "q1")
    journal.flush()
    print("held", flush=True)
    sys.stdin.read()  # hold the journal until the test closes our stdin
    journal.close()
    """
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds ``tmp_path / "job"``'s journal."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(  # noqa: S603 - our own fixed argument list
        [sys.executable, "-c", HOLDER, str(tmp_path / "job")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "held\n"  # blocks until the child holds the lock
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def delete_everything_but_the_journal(directory: Path) -> list[str]:
    deleted = []
    for path in directory.iterdir():
        if path.name != "journal.jsonl":
            path.unlink()
            deleted.append(path.name)
    return deleted


def test_deleting_files_during_a_run_does_not_let_a_second_run_in(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    job = tmp_path / "job"
    # Older releases locked `.journal.lock`: deleting it let a second run write
    # beside the first (and every later run failed on "an id ... is done twice").
    delete_everything_but_the_journal(job)
    with pytest.raises(ConfigurationError, match="another provider-router process is using"):
        FileJournal.open(job)
    assert holder.poll() is None
    # The holder ends normally: the lock is free again.
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait(timeout=30) == 0
    journal = FileJournal.open(job)
    assert journal.claim("a", "q2")
    journal.close()


def test_a_killed_holder_leaves_no_stale_lock(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    holder.send_signal(signal.SIGKILL)
    assert holder.wait(timeout=30) == -signal.SIGKILL
    journal = FileJournal.open(tmp_path / "job")
    journal.close()


def test_without_directory_locks_the_journal_file_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_flock = _journal_file.fcntl.flock

    def no_directory_locks(fd: int, operation: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.ENOLCK, "no locks on directories here")
        real_flock(fd, operation)

    monkeypatch.setattr(_journal_file.fcntl, "flock", no_directory_locks)
    first = FileJournal.open(tmp_path)
    try:
        with pytest.raises(ConfigurationError, match="another provider-router process"):
            FileJournal.open(tmp_path)
    finally:
        first.close()
    FileJournal.open(tmp_path).close()


@pytest.mark.slow
async def test_a_second_run_on_a_live_directory_is_refused_even_without_lock_files(
    tmp_path: Path, openrouter_sim_factory: Callable[..., Awaitable[SimulatorServer]]
) -> None:
    # The repro: delete the lock file during a run, start the same command again.
    sim = await openrouter_sim_factory(seed=41, speed=1.0)  # real-speed answers: A stays busy
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"q{n}", "prompt": f"question {n}"}) + "\n" for n in range(400))
    )
    out = tmp_path / "out"
    env = {**os.environ, "OPENROUTER_API_KEY": DEFAULT_TEST_KEY}
    command = [
        sys.executable, "-m", "provider_router", "--log-level", "error", "run", str(prompts),
        "--out", str(out), "--model", "moonshotai/kimi-k2.5", "--budget", "5",
        "--max-tokens", "2000", "--concurrency", "4", "--base-url", sim.url, "--progress", "off",
    ]  # fmt: skip
    first = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env
    )
    try:
        journal = out / "journal.jsonl"
        for _ in range(6000):  # until the first run has claimed work (30 s at most)
            if journal.exists() and b'"op":"claim"' in journal.read_bytes():
                break
            assert first.returncode is None, "the first run ended early"
            await asyncio.sleep(0.005)
        for path in out.iterdir():
            if path.name.startswith("."):
                path.unlink()  # whatever lock file there may be
        second = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
        )
        try:  # refused at once; a second run let in would keep running beside the first
            _, err = await asyncio.wait_for(second.communicate(), timeout=60)
        except TimeoutError:
            second.kill()
            await second.wait()
            pytest.fail("a second run was let in beside the first")
        assert second.returncode == 1, err.decode()
        assert "another provider-router process is using" in err.decode()
        assert first.returncode is None  # the first run goes on undisturbed
    finally:
        if first.returncode is None:
            first.kill()
        await first.wait()
