"""``pagesim completion {bash,zsh}``: the shell's completion script for the ``pagesim`` command,
written by shtab from the command line's own parser (every subcommand and option, as ``--help``
lists them), so it never lags behind the commands.

Install it once per shell, e.g. ``pagesim completion bash > ~/.local/share/bash-completion/completions/pagesim``.
"""

from __future__ import annotations

from pagesim.sim.cli import HelpFormatter, build_parser, example

SHELLS = ("bash", "zsh")


def register(sub) -> None:
    p = sub.add_parser("completion", help="Print the shell completion script (bash, zsh)", description=__doc__,
                       formatter_class=HelpFormatter,
                       epilog=example("pagesim completion bash > ~/.local/share/bash-completion/completions/pagesim",
                                      "pagesim completion zsh > ~/.zfunc/_pagesim"))
    p.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")
    p.set_defaults(func=run)


def run(args) -> int:
    import shtab  # here: only this command needs it

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
