"""Flags a run would ignore are refused by name, as a swept flag given too is: a run
that looks configured and is not answers the wrong question."""

from __future__ import annotations

import pytest

from gateway.cli import main
from tests.simulate.test_cli import simulate_in_process


@pytest.mark.parametrize(
    ("flags", "named", "says"),
    [
        (["--policy=reject"], "--policy 'reject'", "give a limit too"),
        (["--max-queue=4"], "--max-queue 4", "give a limit too"),
        (["--queue-timeout=2"], "--queue-timeout 2.0", "give a limit too"),
        (["--fairness-cost=tokens"], "--fairness-cost 'tokens'", "give a limit too"),
        (["--prefix-groups=5"], "--prefix-groups 5", "give --prefix-tokens too"),
        (
            ["--capacity-providers=static", "--policy=reject"],
            "--policy 'reject'",
            "give a limit too",
        ),
    ],
)
def test_a_flag_with_nothing_to_act_on_exits_2_naming_it(
    flags: list[str], named: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a limit every request is admitted at once (``static`` alone has none
    without --max-in-flight), so the queue's flags had no effect at all; groups of a
    shared prefix with no shared prefix neither."""
    assert main(["simulate", "--num-requests=5", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"obleth: {named}") and says in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "flags",
    [
        ["--policy=reject", "--max-in-flight=2"],
        ["--policy=reject", "--sweep=max-in-flight=2,4"],
        ["--queue-timeout=2", "--tenant-max-in-flight=default:1"],
        ["--capacity-providers=static", "--max-in-flight=2"],
        ["--capacity-providers=static,adaptive", "--policy=reject"],
        ["--capacity-providers=kv-pressure", "--queue-timeout=2"],
        ["--prefix-groups=2", "--prefix-tokens=64"],
        ["--policy=reject", "--max-tokens-in-flight=20000"],
        ["--fairness-cost=tokens", "--max-in-flight=2"],
    ],
)
def test_the_same_flags_with_something_to_act_on_run(flags: list[str]) -> None:
    assert simulate_in_process("--num-requests=5", *flags)
