"""``pagesim completion {bash,zsh}`` prints the shell's completion script (shtab, from the
command line's parser): it names every subcommand; another shell is refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagesim.sim import cli


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_naming_every_subcommand(shell):
    done = subprocess.run([sys.executable, "-m", "pagesim.sim.cli", "completion", shell], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in cli.subcommands():
        assert command in done.stdout, command
    assert "--num-requests" in done.stdout  # the subcommands' options too


def test_another_shell_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["completion", "fish"])
    assert stop.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
