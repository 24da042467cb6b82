"""The documentation (README and the site under docs/): the site builds with MkDocs in strict
mode, where a warning, a link to a missing page or a missing anchor fails the build; README
stays one screen that links into the site; every ``pagesim`` command shown in a code block is
one the command line accepts (its subcommand, flags and their values parse: the check that
keeps an example from going stale when an option is renamed; ``python3 docs/examples.py`` runs
them all, which takes minutes); the Python API page's example runs. The numbers the pages quote
are rerun and compared by ``tests/test_doc_numbers.py``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pagesim.sim import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
spec = importlib.util.spec_from_file_location("docs_examples", DOCS / "examples.py")
examples = importlib.util.module_from_spec(spec)
spec.loader.exec_module(examples)  # docs/ is no package: the runner of the examples, by path

COMMANDS = [command for page in examples.pages() for command in examples.commands(page)]


def test_the_pages_show_the_commands_of_every_job():
    # the checker finds what it checks: each subcommand appears in some page's examples
    shown = {argv[0] for _, argv in COMMANDS if argv}
    assert shown >= set(cli.subcommands()), set(cli.subcommands()) - shown
    assert len(COMMANDS) > 60


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_command_shown_parses(where, argv):
    assert parses(argv) is None, f"{where}: pagesim {shlex.join(argv)}\n{parses(argv)}"


def parses(argv: list[str]) -> str | None:
    """None where ``pagesim ARGV`` parses, else what argparse printed."""
    parser = cli.build_parser(argv[0] if argv and argv[0] in cli.subcommands() else None)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exit:
        return None if exit.code == 0 else stderr.getvalue()
    return None


def test_a_stale_example_is_caught(tmp_path):
    # continuation lines joined, the comment and the VAR=value prefix dropped, the flag refused
    page = tmp_path / "page.md"
    page.write_text("text\n```bash\nPAGESIM_JIT=0 pagesim simulate --workload sharegpt \\\n"
                    "    --no-such-flag 3   # an old flag\necho done\n```\n```python\npagesim = 1\n```\n")
    [(where, argv)] = examples.commands(page)
    assert where == "page.md:3" and argv == ["simulate", "--workload", "sharegpt", "--no-such-flag", "3"]
    assert "unrecognized arguments: --no-such-flag 3" in parses(argv)
    assert parses(["simulate", "--system", "vllm-v9"]) and parses(["reproduce", "fig99"])
    assert parses(argv[:3]) is None


def test_readme_is_one_screen_of_essentials_with_links_into_the_site():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    linked = set(re.findall(r"\]\((docs/[^)#]+)", text))
    assert {"docs/quickstart/reproduce.md", "docs/quickstart/plan.md", "docs/quickstart/validate.md"} <= linked
    for target in linked:
        assert (ROOT / target).is_file(), target


def test_the_api_example_runs():
    blocks = examples.code_blocks(DOCS / "reference" / "api.md")
    [example] = [lines for _, language, lines in blocks if language == "python"]
    source = "\n".join(example).replace('duration_s=600', 'duration_s=30')  # the same calls, a shorter trace
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "docs/reference/api.md", "exec"), {})
    throughput, token_states = map(float, out.getvalue().split())
    assert 0 < throughput and 0 < token_states <= 1


def test_the_site_builds_with_no_warning(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, env=environment, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "WARNING" not in p.stderr, p.stderr[-3000:]
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in cli.subcommands():  # the generated reference has every command's help
        assert f"pagesim {command}</code>" in cli_page, command


def test_every_code_block_names_its_language():
    # a shell example must say bash to be checked; a diagram says text
    for page in examples.pages():
        for first, language, _ in examples.code_blocks(page):
            assert language, f"{examples.where(page, first - 1)}: a code block without a language"
