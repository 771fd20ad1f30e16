"""The collector of a process that runs nothing but the simulator (_collector.py).

Each case runs in a fresh interpreter: freezing and thresholds are process-wide, and
the test session's own collector must stay as it is (as the embedded simulator
leaves its host's).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest

from provider_router._collector import GEN0_THRESHOLD


def _in_fresh_interpreter(code: str) -> dict[str, object]:
    done = subprocess.run(  # noqa: S603 - our interpreter, our script
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


_STATE = (
    "print(json.dumps({'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count(),"
    " 'enabled': gc.isenabled()}))"
)


def test_a_server_process_freezes_its_start_up_heap_and_collects_young_objects_less_often() -> None:
    before = _in_fresh_interpreter(f"import gc, json\n{_STATE}")
    after = _in_fresh_interpreter(
        f"""
        import gc, json
        from provider_router._collector import tune_for_process
        tune_for_process()
        {_STATE}
        """
    )
    assert before["frozen"] == 0
    assert after["frozen"] > 1000  # the modules, markets and classes start-up built
    gen0, gen1, gen2 = after["threshold"]  # type: ignore[misc]
    assert gen0 == GEN0_THRESHOLD > before["threshold"][0]  # type: ignore[index]
    assert [gen1, gen2] == before["threshold"][1:]  # type: ignore[index]
    assert after["enabled"] is True


@pytest.mark.parametrize(
    ("setup", "threshold", "enabled"),
    [
        ("gc.set_threshold(50_000, 20, 30)", [50_000, 20, 30], True),  # higher: kept
        ("gc.set_threshold(0)", [0, 10, 10], True),  # a threshold of 0 disables: stays so
        ("gc.disable()", [GEN0_THRESHOLD, 10, 10], False),  # stays disabled
    ],
)
def test_what_the_process_chose_for_its_collector_is_kept(
    setup: str, threshold: list[int], enabled: bool
) -> None:
    state = _in_fresh_interpreter(
        f"""
        import gc, json
        {setup}
        from provider_router._collector import tune_for_process
        tune_for_process()
        {_STATE}
        """
    )
    assert state["threshold"] == threshold
    assert state["enabled"] is enabled


def test_provider_router_simulate_tunes_its_own_process_once_the_server_is_up() -> None:
    # The command's entry with its server replaced by one that reports the collector
    # the moment it is ready: `serve` itself (what tests and embedders call) leaves it.
    state = _in_fresh_interpreter(
        f"""
        import gc, json
        from provider_router.cli import build_parser, simulate

        async def fake_serve(args, stop, *, on_ready=None, **kwargs):
            assert gc.get_freeze_count() == 0
            on_ready(None)
            {_STATE}
            return 0

        simulate.serve = fake_serve
        assert simulate._handle(build_parser().parse_args(["simulate", "--port", "0"])) == 0
        """
    )
    assert state["frozen"] > 0
    assert state["threshold"][0] == GEN0_THRESHOLD  # type: ignore[index]


def test_the_embedded_simulator_leaves_its_hosts_collector_alone() -> None:
    # This test session hosts simulators all along: none of them tuned it.
    assert gc.get_threshold()[0] != GEN0_THRESHOLD
