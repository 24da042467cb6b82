"""The subcommands come from the ``pagesim.commands`` entry points: setup.cfg in a source tree,
the installed metadata otherwise; both name the same registers."""

from __future__ import annotations

import importlib.metadata

import pytest

from pagesim.sim import cli


def test_source_tree_lists_every_command_in_help_order():
    assert list(cli.subcommands()) == ["trace", "simulate", "reproduce", "report", "plan", "cost", "gpu",
                                       "validate"]


def test_installed_metadata_names_the_same(monkeypatch, tmp_path):
    if not importlib.metadata.entry_points(group=cli.COMMANDS_GROUP):
        pytest.skip("pagesim's metadata has no pagesim.commands (installed before the group existed)")
    source = cli.subcommands()
    monkeypatch.setattr(cli, "SOURCE_SETUP_CFG", tmp_path / "setup.cfg")  # as an installed wheel
    assert cli.subcommands() == source
