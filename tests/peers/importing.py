"""A peer engine's own modules, imported from the cache folder (``fetch.py``) with stubs.

``Peer(version, real, stubs)``: the modules in ``real`` are executed from vLLM's source as they
are; every other module they import must be in ``stubs``: the names it provides, ``None`` for a
``Placeholder`` (a class that may be named, never called), so that a stub can never decide
anything silently. A module in neither is an error naming it. A stub of a top-level package
other than ``vllm`` (``psutil``, ``transformers``) is used only where that package is not
installed. Another engine's package (nano-vllm's ``nanovllm``) is ``Peer(..., package=,
folder=)``.

Both vLLM releases are the package ``vllm``: a peer's modules are in ``sys.modules`` only while
it is ``active()`` (its import, and each run: a vLLM function may import lazily), so the two can
run in one process, one after the other. SGLang's (``package="sglang"``) are the same.
"""

from __future__ import annotations

import __future__
import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

from tests.peers import fetch


class Placeholder(type):
    """A stubbed name: a class that may be named (an annotation, an isinstance, a default
    argument, an enum member read at import) but never called."""

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"the peer called the stub {cls.__module__}.{cls.__name__}")

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{cls.__name__}.{name}", (), {"__module__": cls.__module__})


def placeholders(*names):
    return {name: None for name in names}  # None: a Placeholder of that name


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the peer's package (``vllm.*``, ``nanovllm.*``) and of stubbed packages: the
    packages above ``real`` and ``stubs`` modules as bare packages (their ``__init__`` pulls in
    the whole engine: not run), stubs as stubs, ``real`` from source; anything else is an error
    naming the module."""

    def __init__(self, peer: "Peer"):
        self.peer = peer

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in self.peer.packages or name in self.peer.real:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        name, peer = spec.name, self.peer
        module = types.ModuleType(name)
        module.__path__ = [str(peer.folder.joinpath(*name.split(".")))]
        if name in peer.stubs:
            for attribute, value in peer.stubs[name].items():
                setattr(module, attribute, Placeholder(attribute, (), {"__module__": name}) if value is None else value)
        elif not any(known.startswith(name + ".") for known in (*peer.real, *peer.stubs)):
            raise ImportError(f"{peer.name} module {name} is neither run nor stubbed ({peer.driver} STUBS)")
        return module

    def exec_module(self, module):
        pass


class Peer:
    """One vLLM release's modules: ``real`` run from source, ``stubs`` as given (``driver``:
    the file that lists them, for error messages); or another engine's, its top-level
    ``package`` in ``folder`` (``name``: the engine and its version, for messages)."""

    def __init__(self, version: str, real: tuple, stubs: dict, driver: str, package: str = "vllm",
                 folder: Path | None = None, name: str = ""):
        self.version, self.real, self.driver = version, real, driver
        self.name = name or f"vLLM {version}"
        self.stubs = {module: names for module, names in stubs.items()
                      if module.split(".")[0] == package or not installed(module.split(".")[0])}
        self.packages = {package, *(module.split(".")[0] for module in self.stubs)}
        self.folder = folder or fetch.source_folder(version)
        self.modules: dict = {}  # its modules while it is not active

    def fetched(self) -> bool:
        # fetch.py writes it last: a half-unpacked folder (an interrupted run) is not taken for one
        return (self.folder / ".unpacked").exists()

    @contextlib.contextmanager
    def active(self):
        if not self.fetched():
            raise ImportError(f"{self.name} is not fetched: python -m tests.peers.fetch")
        others = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] in self.packages}
        sys.modules.update(self.modules)
        finder = Finder(self)
        sys.path.insert(0, str(self.folder))
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            sys.path.remove(str(self.folder))
            self.modules = {name: sys.modules.pop(name) for name in list(sys.modules)
                            if name.split(".")[0] in self.packages}
            sys.modules.update(others)


def driver_or_skip(version: str, module: str):
    """The peer driver ``module`` (``tests.peers.vllm_v0``, ...), its release ``version`` (as
    its ``PEER`` has it) imported, or the calling test module skipped, saying why: not fetched,
    or its code does not import here (torch or msgspec missing, or a module the driver's stubs
    do not cover). Where the run requires the engine (``suite.required``: CI) it fails instead."""
    import pytest

    from tests.peers import suite

    driver = importlib.import_module(module)  # a driver imports its peer's code in load() alone
    peer = driver.PEER
    assert peer.version == version, f"{module} drives {peer.name}, not {version}"
    missing = pytest.fail if suite.required(peer.folder.name) else pytest.skip
    where = {"pytrace": False} if missing is pytest.fail else {"allow_module_level": True}
    if not peer.fetched():
        missing(f"{peer.name} is not in {peer.folder}: python -m tests.peers.fetch", **where)
    try:
        driver.load()
    except Exception as error:
        missing(f"{peer.name}'s scheduler does not import here: {type(error).__name__}: {error}", **where)
    return driver


def members(peer: Peer, module: str, class_name: str, names: tuple, namespace: dict | None = None) -> dict:
    """Methods and properties ``names`` of class ``class_name`` in the peer's ``module``, compiled
    from its source alone (the module is not imported: vLLM's configuration classes pull in
    transformers and the platform), to be set on a class of the driver's: the peer's own rules,
    called on the driver's settings, over ``namespace`` (the module globals they read, as
    ``functions``'). Each keeps vLLM's file and line numbers for tracebacks."""
    path, tree = source(peer, module)
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name).body
    return compiled(peer, path, f"{module}.{class_name}", body, names, namespace or {})


def functions(peer: Peer, module: str, names: tuple, namespace: dict) -> dict:
    """Module-level functions ``names`` of the peer's ``module``, compiled from its source alone
    (the module imports what a CPU run cannot: ``torch_utils``' custom ops, ``hisparse``' kernels),
    over ``namespace`` (the globals they read; one they read that is not there raises)."""
    path, tree = source(peer, module)
    return compiled(peer, path, module, tree.body, names, namespace)


def constants(peer: Peer, module: str, names: tuple, namespace: dict) -> dict:
    """Module-level assignments ``names`` of the peer's ``module`` (``STR_DTYPE_TO_TORCH_DTYPE``),
    evaluated from its source alone over ``namespace``, for the same reason as ``functions``."""
    path, tree = source(peer, module)
    found = {}
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and target.id in names:
                code = compile(ast.Expression(node.value), str(path), "eval")
                found[target.id] = eval(code, dict(namespace))  # noqa: S307 - vLLM's own source, fetched
    missing = set(names) - set(found)
    assert not missing, f"{peer.name}'s {module} has no {sorted(missing)}"
    return found


def source(peer: Peer, module: str):
    path = peer.folder.joinpath(*module.split(".")).with_suffix(".py")
    return path, ast.parse(path.read_text(), str(path))


def compiled(peer: Peer, path, where: str, body: list, names: tuple, namespace: dict) -> dict:
    found = {}
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
            node.decorator_list = []
            scope = dict(namespace)
            code = compile(ast.Module([node], []), str(path), "exec", flags=__future__.annotations.compiler_flag)
            exec(code, scope)
            found[node.name] = property(scope[node.name]) if is_property else scope[node.name]
    missing = set(names) - set(found)
    assert not missing, f"{peer.name}'s {where} has no {sorted(missing)}"
    return found
