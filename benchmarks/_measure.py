"""A command run to its end as a fresh process and measured by ``wait4``: the CPU seconds it
used (user + system, its threads and the children it waited for) and its peak resident memory,
the figures the whole-process benchmarks quote."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    cpu_s: float  # user + system
    peak_bytes: int  # the peak resident set (ru_maxrss: KiB on Linux)
    exit_code: int
    out: str  # its standard output, where it was kept
    err: str  # its standard error's last 2,000 characters

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / 1e9


def measured(argv: list[str], env: dict | None = None, cwd: Path | str | None = None, keep_output: bool = False,
             check: bool = True) -> Measured:
    """Run ``argv`` (``env``: ``_import_path.child_env()``'s by default, imported only then: it
    sets the benchmarks' environment) and measure it. Its standard error is read as it runs (a
    full pipe would stall it), its standard output only with ``keep_output``. With ``check``, a
    non-zero exit ends the benchmark with the command's error."""
    if env is None:
        from _import_path import child_env

        env = child_env()
    proc = subprocess.Popen(argv, env=env, cwd=cwd,
                            stdout=subprocess.PIPE if keep_output else subprocess.DEVNULL, stderr=subprocess.PIPE)
    texts: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda name=name, pipe=pipe: texts.__setitem__(name, pipe.read()))
               for name, pipe in (("out", proc.stdout), ("err", proc.stderr)) if pipe is not None]
    for reader in readers:
        reader.start()
    _pid, status, usage = os.wait4(proc.pid, 0)
    for reader in readers:
        reader.join()
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    err = texts.get("err", b"").decode(errors="replace")[-2000:]
    if check and code:
        raise SystemExit(f"{' '.join(map(str, argv))} failed ({code}): {err.strip()[-600:]}")
    return Measured(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, code,
                    texts.get("out", b"").decode(errors="replace"), err)
