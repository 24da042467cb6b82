"""MkDocs hook: the command-line reference, generated from the argparse parser at build time,
so the page is every option the installed ``pagesim`` has, never a copy that goes stale."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

PAGE = "reference/cli.md"
WIDTH = 100  # the help as a 100-column terminal prints it


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("pagesim",)):
    """(command words, its parser) for ``parser`` and every subcommand under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, path + (name,))


def reference() -> str:
    from pagesim.sim.cli import build_parser

    os.environ["COLUMNS"] = str(WIDTH + 2)  # argparse wraps at COLUMNS - 2
    lines = ["# Command line", "",
             "Every command and its options, as `pagesim ... --help` prints them (this page is generated",
             "from the parser when the site is built).", ""]
    from pagesim.experiments.plan_cli import MODE_HELP, mode_parser

    for path, parser in commands(build_parser()):
        lines += [f"## `{' '.join(path)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        if path == ("pagesim", "plan"):  # plan's modes are a positional, each with its own help
            for mode in MODE_HELP:
                lines += [f"### `pagesim plan {mode}`", "", "```text", mode_parser(mode).format_help().rstrip(),
                          "```", ""]
    return "\n".join(lines)


@event_priority(100)  # before mkdocstrings' own on_config reads the handler's options
def on_config(config):
    """mkdocstrings reads the API from source, by package name; setup.cfg maps ``pagesim`` onto
    the repository root, which has no folder of that name: give it one, a link in a temporary
    folder on the handler's search path."""
    folder = Path(tempfile.mkdtemp(prefix="pagesim-api-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "pagesim").symlink_to(Path(config.config_file_path).resolve().parent, target_is_directory=True)
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python.setdefault("paths", []).append(str(folder))
    return config


def on_files(files, config):
    files.append(File.generated(config, PAGE, content=reference()))
    return files
