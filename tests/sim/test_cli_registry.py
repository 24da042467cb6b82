"""The subcommands come from the ``pagesim.commands`` entry points: setup.cfg in a source tree,
the installed metadata otherwise; both name the same registers."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shlex

import pytest

from pagesim.sim import cli


def test_source_tree_lists_every_command_in_help_order():
    assert list(cli.subcommands()) == ["trace", "simulate", "reproduce", "report", "plan", "cost", "gpu",
                                       "validate", "completion"]


def test_installed_metadata_names_the_same(monkeypatch, tmp_path):
    if not importlib.metadata.entry_points(group=cli.COMMANDS_GROUP):
        pytest.skip("pagesim's metadata has no pagesim.commands (installed before the group existed)")
    source = cli.subcommands()
    monkeypatch.setattr(cli, "SOURCE_SETUP_CFG", tmp_path / "setup.cfg")  # as an installed wheel
    assert cli.subcommands() == source


def _helps(parser, prefix=()):
    """Every (sub)command's help text: the parser's, then its subparsers' in turn."""
    yield prefix, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, (*prefix, name))


def test_every_help_fits_100_columns_and_its_examples_still_run(monkeypatch):
    # argparse wraps to COLUMNS - 2; a long description or example wraps too (cli.HelpFormatter),
    # an example into " \" continuation lines that join back into the very command
    monkeypatch.setenv("COLUMNS", "100")
    wrapped = 0
    for command in cli.subcommands():
        for where, text in _helps(cli.build_parser(command)):
            lines = text.splitlines()
            assert max(map(len, lines)) <= 100, (where, max(lines, key=len))
            # an option's help never breaks at a hyphen: no line ends in "--num-" or "leave-"
            assert not [line for line in lines if re.search(r"\w-$", line)], where
            for i, line in enumerate(lines):
                if line.startswith("  pagesim ") and line.endswith(" \\"):
                    wrapped += 1
                    assert lines[i + 1].startswith("      "), where  # continued under the command
    assert wrapped >= 3  # simulate's own examples are longer than 100 columns
    formatter = cli.HelpFormatter("pagesim")
    # 98 columns fall inside the quoted argument: a break between words, not inside the quotes
    example = ("  pagesim simulate --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv --model llama-2-13b "
               "--gpu a100-80gb --system vllm --seed 1 --max-len-policy drop --goodput 'ttft:2000 tpot:100' "
               "--out out/run")
    text = formatter._fill_text(example, 98, "")
    assert len(text.splitlines()) == 3 and all(len(line) <= 98 for line in text.splitlines())
    # the shell reads the continued lines as the very command, the quoted argument whole
    assert shlex.split(text.replace(" \\\n", " ")) == shlex.split(example)
    assert "'ttft:2000 tpot:100'" in text
