"""numba's cache of the core is dropped when a source numba reads changes, not when the
Python-only glue does (sim/core/compile/jit.py: _drop_stale_cache)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pagesim.sim.core.compile import jit, numba_patches
from tests.sim.helpers import subprocess_path


def numba_loaded() -> None:
    """numba loaded with the core's changes to it, or the test skipped (no numba, or the core run
    in CPython: ``PAGESIM_JIT=0``)."""
    pytest.importorskip("numba")
    jit.use_numba()
    if jit.numba is None:
        pytest.skip("the core runs in CPython here (PAGESIM_JIT=0)")


#: where numba's cache lies: in the core's ``__pycache__`` (NUMBA_CACHE_DIR unset), or the user's
CACHES = pytest.mark.parametrize("users_cache", [False, True], ids=["in-tree", "NUMBA_CACHE_DIR"])


def set_cache(tmp_path, monkeypatch, users_cache: bool) -> None:
    if users_cache:
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "users-cache"))
    else:
        monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)


def cached_core(tmp_path, monkeypatch, users_cache: bool = False):
    """A core in ``tmp_path/core``, its loop cached where numba caches it."""
    set_cache(tmp_path, monkeypatch, users_cache)
    core = tmp_path / "core"
    core.mkdir(exist_ok=True)
    for name in ("loop.py", "state.py", "check.py", "replay.py"):
        (core / name).write_text(f"# {name}\n")
    jit._drop_stale_cache(core)  # the first stamp
    compiled = jit.numbas_cache_dir(core, here=core) / "loop.run-1.nbi"
    compiled.write_text("compiled")
    return core, compiled


@CACHES
def test_editing_a_compiled_source_or_its_constants_drops_the_cache(tmp_path, monkeypatch, users_cache):
    for name in ("loop.py", "state.py"):
        core, compiled = cached_core(tmp_path, monkeypatch, users_cache)
        jit._drop_stale_cache(core)
        assert compiled.exists()  # nothing changed
        (core / name).write_text("# edited\n")
        jit._drop_stale_cache(core)
        assert not compiled.exists(), name


@CACHES
def test_turning_bounds_checking_on_or_off_drops_the_cache(tmp_path, monkeypatch, users_cache):
    """numba's cache is not keyed by ``NUMBA_BOUNDSCHECK`` (its index: the signature, the CPU, the
    bytecode): code cached without checks would run where they are asked for (the test suite's,
    tests/checked_core.py), and the other way round; so the flag is part of the digest."""
    monkeypatch.delenv("NUMBA_BOUNDSCHECK", raising=False)
    core, compiled = cached_core(tmp_path, monkeypatch, users_cache)
    for flag in ("1", "0"):
        monkeypatch.setenv("NUMBA_BOUNDSCHECK", flag)
        jit._drop_stale_cache(core)
        assert not compiled.exists(), flag
        compiled.write_text("compiled")
        jit._drop_stale_cache(core)
        assert compiled.exists()  # the same flag again: kept


@CACHES
def test_editing_the_python_only_glue_keeps_it(tmp_path, monkeypatch, users_cache):
    core, compiled = cached_core(tmp_path, monkeypatch, users_cache)
    for name in jit.NOT_COMPILED:
        (core / name).parent.mkdir(exist_ok=True)  # (a room's)
        (core / name).write_text("# edited\n")
    jit._drop_stale_cache(core)
    assert compiled.exists()


def test_the_cache_is_dropped_where_numba_writes_it_and_nothing_else_there(tmp_path, monkeypatch):
    """With NUMBA_CACHE_DIR set, numba caches a core file's functions in
    ``$NUMBA_CACHE_DIR/<its folder's name>_<sha1 of the folder's path>`` (numba/core/caching.py,
    ``_CacheLocator.get_suitable_cache_subpath``), not in the core's ``__pycache__``; a drop empties
    that folder of numba's files alone, and leaves the user's other entries in their cache."""
    import hashlib

    core, compiled = cached_core(tmp_path, monkeypatch, users_cache=True)
    users = tmp_path / "users-cache"
    assert compiled.parent == users / f"core_{hashlib.sha1(str(core).encode()).hexdigest()}"
    assert not (core / "__pycache__").exists()
    others = [users / "theirs_0123" / "f.g-1.py311.nbi", users / "loose.nbi", compiled.parent / "theirs.txt"]
    for f in others:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("the user's")
    (core / "loop.py").write_text("# edited\n")
    jit._drop_stale_cache(core)
    assert not compiled.exists() and all(f.exists() for f in others)


def test_a_function_cached_by_numba_lies_where_the_drop_looks(tmp_path, monkeypatch):
    """numba itself, with NUMBA_CACHE_DIR set and unset, writes a cached function of a file in a
    folder into jit.numbas_cache_dir of that folder."""
    import importlib.util

    numba = _numba_loaded()
    from numba.core import config

    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "cached.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    for users_cache in (False, True):
        set_cache(tmp_path, monkeypatch, users_cache)
        monkeypatch.setattr(config, "CACHE_DIR", os.environ.get("NUMBA_CACHE_DIR", ""))
        spec = importlib.util.spec_from_file_location(f"cached_{users_cache}", folder / "cached.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.f(1) == 2 and isinstance(module.f, numba.core.registry.CPUDispatcher)
        where = jit.numbas_cache_dir(folder)
        assert [f.name.split("-")[0] for f in where.glob("*.nbi")] == ["cached.f"], users_cache
        assert (where.parent == tmp_path / "users-cache") == users_cache


def test_a_file_in_a_sub_folder_of_the_core_is_a_source_and_its_cache_dropped(tmp_path, monkeypatch):
    """A core file in a sub-folder (a sub-package) is hashed like the others, by its path from the
    core's folder: an edit of it, or a move, changes the digest, and the cache of every folder of
    the core is dropped, the sub-folder's too (numba caches its functions apart)."""
    core, compiled = cached_core(tmp_path, monkeypatch, users_cache=True)
    (core / "sub").mkdir()
    (core / "sub" / "__init__.py").write_text("")
    (core / "sub" / "helpers.py").write_text("LIMIT = 1\n")
    before = jit.sources_digest(core)
    jit._drop_stale_cache(core)
    inner = jit.numbas_cache_dir(core / "sub", here=core) / "helpers.step-1.nbi"
    assert inner.parent != compiled.parent
    for f in (compiled, inner):
        f.write_text("compiled")
    (core / "sub" / "helpers.py").write_text("LIMIT = 2\n")
    assert jit.sources_digest(core) != before
    jit._drop_stale_cache(core)
    assert not compiled.exists() and not inner.exists()
    edited = jit.sources_digest(core)
    (core / "sub" / "helpers.py").rename(core / "sub" / "limits.py")
    assert jit.sources_digest(core) != edited


def grouped_core(tmp_path, monkeypatch, users_cache: bool = False):
    """A core of a shared file and two families' scheduler files, each family's loop cached."""
    set_cache(tmp_path, monkeypatch, users_cache)
    monkeypatch.setattr(jit, "_GROUP_FILES", {"a": ("scheduler_a.py",), "b": ("scheduler_b.py",)})
    core = tmp_path / "core"
    core.mkdir(exist_ok=True)
    for name in ("loop.py", "scheduler_a.py", "scheduler_b.py", "replay.py"):
        (core / name).write_text(f"# {name}\n")
    jit._drop_stale_cache(core)
    cached = {"shared": jit.numbas_cache_dir(core, here=core) / "loop.step-1.nbi"}
    jit.modules_dir(core).mkdir(parents=True, exist_ok=True)
    for group in ("a", "b"):
        cached[group] = jit.numbas_cache_dir(core, group, core) / "loop.run-1.nbi"
        (jit.modules_dir(core) / f"pagesim_core_{group}_0123.so").write_text("module")
    for f in cached.values():
        f.write_text("compiled")
    return core, cached


@CACHES
def test_editing_one_familys_scheduler_drops_that_family_alone(tmp_path, monkeypatch, users_cache):
    core, cached = grouped_core(tmp_path, monkeypatch, users_cache)
    assert len({f.parent for f in cached.values()}) == 3  # a folder each
    (core / "scheduler_b.py").write_text("# edited\n")
    jit._drop_stale_cache(core)
    assert cached["shared"].exists() and cached["a"].exists() and not cached["b"].exists()
    modules = sorted(f.name for f in jit.modules_dir(core).glob("pagesim_core_*"))
    assert modules == ["pagesim_core_a_0123.so"]  # b's extension module went with its cache
    assert jit.sources_digest(core, "a") != jit.sources_digest(core, "b")


def test_a_process_with_a_cache_of_its_own_drops_its_own_modules_alone(tmp_path, monkeypatch):
    """With NUMBA_CACHE_DIR, a family's folder and its extension modules lie there: finding that
    folder new drops the modules there (the engine's and the cluster's), not those beside the
    checkout's cache, which other processes load."""
    core, _ = grouped_core(tmp_path, monkeypatch)
    mine = tmp_path / "mine"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(mine))
    jit.modules_dir(core).mkdir(parents=True)
    for loop_kind in ("core", "cluster"):
        (jit.modules_dir(core) / f"pagesim_{loop_kind}_a_4567.so").write_text("module")
    jit._drop_stale_cache(core)  # mine/pagesim-a: new, no stamp
    assert jit.modules_dir(core) == mine / "pagesim_core"
    assert not list(jit.modules_dir(core).glob("pagesim_*"))
    kept = sorted(f.name for f in (core / "__pycache__").glob("pagesim_core_*"))
    assert kept == ["pagesim_core_a_0123.so", "pagesim_core_b_0123.so"]


@CACHES
def test_editing_a_shared_source_drops_every_family(tmp_path, monkeypatch, users_cache):
    core, cached = grouped_core(tmp_path, monkeypatch, users_cache)
    (core / "loop.py").write_text("# edited\n")
    jit._drop_stale_cache(core)
    assert not any(f.exists() for f in cached.values())


def test_where_a_familys_folder_cannot_be_written_its_cache_is_keyed_where_numba_puts_it(tmp_path, monkeypatch):
    """numba caches a group's functions with the shared ones where the group's folder cannot be
    written (its locators fall back to the core's ``__pycache__``): that folder is then keyed by
    the shared digest and that group's, and an edit of the group's file drops it."""
    core, cached = grouped_core(tmp_path, monkeypatch)
    blocked = tmp_path / "a file"
    blocked.write_text("")
    folders = jit.group_cache_dir
    monkeypatch.setattr(jit, "group_cache_dir", lambda group, here=None: blocked / group if group == "a"
                        else folders(group, here))
    assert jit.numbas_cache_dir(core, "a", core) == cached["shared"].parent
    jit._drop_stale_cache(core)  # the shared folder's stamp now names a's digest too
    cached["shared"].write_text("compiled")
    (core / "scheduler_a.py").write_text("# edited\n")
    jit._drop_stale_cache(core)
    assert not cached["shared"].exists() and cached["b"].exists()


def test_editing_or_adding_a_policy_keeps_every_cache(tmp_path, monkeypatch):
    """A policy's file (jit.lazy_only: every one but the inlined default's) is compiled by its
    implementations' entries alone, each keyed by its own file (jit._lazy_digest): an edit, or a
    new policy's file, drops no family's cache (and so renames no extension module, named by
    those digests: aot.module_name)."""
    core, cached = grouped_core(tmp_path, monkeypatch)
    policy = core / jit.lazy_only()[0]
    policy.parent.mkdir(exist_ok=True)
    policy.write_text("# the policy\n")
    jit._drop_stale_cache(core)
    digests = {group: jit.sources_digest(core, group) for group in (None, "a", "b")}
    policy.write_text("# edited\n")
    (core / "sched" / "policy_new.py").write_text("# a new policy\n")
    first = jit.lazy_only()[0]
    monkeypatch.setattr(jit, "lazy_only", lambda: (first, "sched/policy_new.py"))
    jit._drop_stale_cache(core)
    assert all(f.exists() for f in cached.values())
    assert {group: jit.sources_digest(core, group) for group in (None, "a", "b")} == digests
    (core / "shared.py").write_text("# a shared file edited\n")  # (the check can fail: a shared edit)
    assert jit.sources_digest(core) != digests[None]


def test_a_policys_file_is_named_elsewhere_by_nothing():
    """What makes jit.lazy_only right: every function of a policy's file implements an interface
    (policies.py), is inlined into one of those, or is Python's alone (``order_key``, which
    --check reads), and no other core file names anything of it (an inlined helper or an ordinary
    call would compile the file into a family's code, which its edits leave stale)."""
    import ast
    from pathlib import Path

    here = Path(jit.__file__).parents[1]  # (the core's folder: jit.py is in its compile room)
    assert jit.lazy_only() == ("sched/policy_priority.py", "sched/policy_sjf.py")
    for name in jit.lazy_only():
        module = Path(name).stem
        tree = ast.parse((here / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.decorator_list:
                options = {k.arg: k.value for d in node.decorator_list if isinstance(d, ast.Call) for k in d.keywords}
                inlined = isinstance(options.get("inline"), ast.Constant) and options["inline"].value is True
                assert "implements" in options or inlined, f"{name}: {node.name} neither implements nor is inlined"
        for path, text in jit._sources(here).items():  # (a sub-folder's files too)
            if path in (*jit.NOT_COMPILED, name):
                continue
            named = set()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("." + module):
                    named |= {a.name for a in node.names}
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == module:
                    named.add(node.attr)
            assert not named, f"{path} names {named} of {name}"


def test_editing_a_familys_scheduler_recompiles_its_scheduler_not_its_loop(tmp_path, monkeypatch):
    """A family's loop calls its scheduler by address (``loop.call_scheduler``): an edit of
    scheduler_v1.py recompiles vLLM v1's scheduler, not its loop, nor any other family's; the
    extension modules of the family (each links its loop and its scheduler) go with it."""
    import shutil
    from pathlib import Path

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    core = Path(jit.__file__).parents[1]
    for path in core.rglob("*.py"):
        (tmp_path / path.relative_to(core)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / path.relative_to(core))
    groups = ("v1", "v1-scheduler", "continuous", "continuous-scheduler", "static", "static-scheduler")
    before = {group: jit.sources_digest(tmp_path, group) for group in groups}
    jit._drop_stale_cache(tmp_path)
    (tmp_path / "__pycache__" / "pagesim_core_v1_0123.so").write_text("module")
    with open(tmp_path / "sched" / "scheduler_v1.py", "a") as f:
        f.write("# edited\n")
    after = {group: jit.sources_digest(tmp_path, group) for group in groups}
    assert [group for group in groups if after[group] != before[group]] == ["v1-scheduler"]
    jit._drop_stale_cache(tmp_path)
    assert not list((tmp_path / "__pycache__").glob("pagesim_core_v1_*"))
    with open(tmp_path / "sched" / "static.py", "a") as f:  # static batching's loop ends a batch: static.py is its too
        f.write("# edited\n")
    assert [group for group in groups if jit.sources_digest(tmp_path, group) != after[group]] == [
        "static", "static-scheduler"]


def test_a_familys_loop_reaches_its_scheduler_only_through_its_entry():
    """The names loop.py imports from the families' scheduler files appear only in
    ``scheduler_entry_for``: a loop that called one itself would compile it, and keep it stale after an
    edit its cache is not keyed by (but the files its loop compiles, ``LOOP_FILES``: static.py,
    and vLLM v0's and Orca's, whose loop inlines its scheduler)."""
    import ast
    from pathlib import Path

    from pagesim.sim.core.compile import families

    source = ast.parse((Path(jit.__file__).parents[1] / "events" / "loop.py").read_text())
    own = {Path(name).stem for kind, files in families.FAMILY_FILES.items() for name in files
           if name not in families.LOOP_FILES[kind]}
    imported = {(a.asname or a.name) for node in source.body if isinstance(node, ast.ImportFrom)
                and node.module and node.module.rsplit(".", 1)[-1] in own for a in node.names}
    assert {"schedule_v1", "schedule_sglang", "holding_admissible"} <= imported
    for node in source.body:
        if isinstance(node, ast.FunctionDef) and node.name != "scheduler_entry_for":
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert not used & imported, f"{node.name} uses {used & imported}"


def test_only_the_loop_imports_a_familys_own_files():
    """What makes a family's files its own: no other core file imports them (a shared function
    calling into one would keep stale machine code when that file changed)."""
    import ast
    from pathlib import Path

    from pagesim.sim.core.compile import families

    here = Path(jit.__file__).parents[1]  # (the core's folder)
    own = {kind: {Path(name).stem for name in files} for kind, files in families.FAMILY_FILES.items()}
    for path, text in jit._sources(here).items():  # (a sub-folder's files too)
        if path in jit.NOT_COMPILED or path == "events/loop.py":
            continue
        family = {k for k, names in own.items() if Path(path).stem in names}  # (vLLM v0's files: two families')
        imported = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pagesim.sim.core"):
                imported |= {node.module.rsplit(".", 1)[-1], *(a.name for a in node.names)}
        for kind, names in own.items():
            assert kind in family or not imported & names, f"{path} imports {imported & names}"


def test_a_function_is_optimized_once_with_its_callees_not_alone_first():
    """numba_patches._one_llvm_optimization: a function's code added to its library is left as written (its
    data layout set); the library's module passes, after its callees are linked in, optimize it."""
    numba_loaded()
    import llvmlite.binding as ll
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    written = """
        define i64 @twice(i64 %x) {
          %a = alloca i64
          store i64 %x, i64* %a
          %y = load i64, i64* %a
          %z = add i64 %y, %y
          ret i64 %z
        }"""
    library = cpu_target.target_context.codegen().create_library("twice")
    module = ll.parse_assembly(written)
    library._optimize_functions(module)
    text = str(module)
    assert "alloca" in text and "store" in text  # LLVM's function passes would have made it a register
    assert str(module.data_layout) == str(library._codegen._data_layout)
    library.add_llvm_module(module)
    with global_compiler_lock:
        library.finalize()  # the module passes: optimized now
    assert "alloca" not in str(library.get_function("twice"))


def test_a_function_compiled_code_calls_has_no_python_wrapper_and_python_runs_its_source():
    """jit._interpreted_from_python: a function compiled code calls (or inlines) is compiled
    without the Python wrapper; a call from Python runs the same source in CPython and compiles
    nothing (a compiled call would first compile the function again, with the wrapper)."""
    numba_loaded()
    import numpy as np

    from pagesim.sim.core.kv import placement
    from pagesim.sim.core.price import cost_table

    called = jit.compiled(cost_table.interp_extrap)
    inlined = jit.compiled(placement.next_pow2)
    assert jit._OPTIONS[inlined.py_func][0] and not jit._OPTIONS[called.py_func][0]  # inline=True, a call
    for dispatcher in (called, inlined):
        assert dispatcher.targetoptions["no_cpython_wrapper"]
    from numba.core import event

    xs, ys = np.array([1.0, 3.0]), np.array([10.0, 30.0])
    with event.install_recorder("numba:compile") as compiles:
        assert called(2.0, xs, ys) == 20.0 and inlined(5) == 8
    assert compiles.buffer == []  # nothing compiled for Python's calls


def sign(x):  # four blocks: the test, two branches, their join
    if x > 0:
        y = 1
    else:
        y = -1
    return y


def _numba_loaded():
    numba_loaded()
    return jit.numba


def test_an_inlined_functions_scope_is_copied_as_often_whatever_its_blocks(monkeypatch):
    """numba_patches._inlined_scope_copied_once: numba copies an inlined function's blocks (twice, in
    inline_ir), and its variable scope once with each copy, not once per block: a function of
    four blocks costs as many copies of its scope as one of a single block; both compute as
    before."""
    import copy

    from numba.core import ir

    numba = _numba_loaded()
    scopes = []
    reconstruct = copy._reconstruct

    def counted(x, memo, *args, **kwargs):
        if isinstance(x, ir.Scope):
            scopes.append(x)
        return reconstruct(x, memo, *args, **kwargs)

    monkeypatch.setattr(copy, "_reconstruct", counted)

    inlined_sign = numba.njit(inline="always")(sign)

    @numba.njit(inline="always")
    def tenfold(x):  # one block
        return x * 10

    @numba.njit
    def branching(x):
        return inlined_sign(x)

    @numba.njit
    def straight(x):
        return tenfold(x)

    assert branching(3) == 1 and branching(-3) == -1
    copies_of_four_blocks = len(scopes)
    scopes.clear()
    assert straight(3) == 30
    assert copies_of_four_blocks == len(scopes) > 0


def test_an_inlined_functions_blocks_are_deep_copied_once_at_each_place(monkeypatch):
    """numba_patches._inlined_ir_copied_once: numba's inline_ir deep-copies the inlined function's blocks,
    then that copy again as an "original" its callers drop; each block is now copied once at each
    place it is inlined, and the code computes as before."""
    import copy

    from numba.core import compiler, ir

    numba = _numba_loaded()
    copied = []
    deepcopy = copy.deepcopy

    def counted(x, memo=None, *args):
        if isinstance(x, ir.Block):
            copied.append(x)
        return deepcopy(x, memo, *args)

    monkeypatch.setattr(copy, "deepcopy", counted)

    inlined = numba.njit(inline="always")(sign)

    @numba.njit
    def twice(x):  # two places
        return inlined(x) + inlined(-x)

    assert twice(3) == 0 and twice(0) == -2
    assert len(copied) == 2 * len(compiler.run_frontend(sign).blocks) == 8


def test_compile_flags_compare_and_hash_as_numbas_options_read_one_by_one():
    """numba_patches._compile_flags_compared_quickly: a flags object's values() is every option as its
    property reads it, set or default, and its hash numba's (of the sorted option names)."""
    _numba_loaded()
    from numba.core.compiler import Flags

    flags = Flags()
    flags.nrt = True
    flags.inline = "always"
    assert flags.values() == {name: getattr(flags, name) for name in Flags.options}
    assert flags.values()["nrt"] is True  # set
    assert flags.values()["boundscheck"] == Flags.options["boundscheck"].default  # not set
    assert hash(flags) == hash(tuple(sorted(Flags.options))) == hash(Flags())
    assert flags == Flags(flags) and flags != Flags()
    other = Flags(flags)
    other.nrt = False
    assert other != flags


def test_compile_flags_set_alike_are_equal_without_reading_every_option(monkeypatch):
    """numba_patches._compile_flags_compared_quickly: two flags of one class with the same options set
    compare equal without values() (numba's typing compares them ~80,000 times a family)."""
    _numba_loaded()
    from numba.core.compiler import Flags

    flags = Flags()
    flags.nrt = True
    copied, unset = Flags(flags), Flags()
    unset_but_default = Flags()
    unset_but_default.boundscheck = Flags.options["boundscheck"].default
    monkeypatch.setattr(Flags, "values", lambda self: pytest.fail("values() read"))
    assert flags == copied
    monkeypatch.undo()
    assert unset == unset_but_default and flags != unset  # set to its default: still equal, by values()


def test_the_variables_live_at_a_blocks_entry_are_numbas_when_asked_for():
    """numba_patches._lifetimes_on_demand: numba's post-processing computes no liveness until it is asked
    for; asked, each block's live variables at entry are those numba's own run gives."""
    numba_loaded()
    from numba.core import compiler, postproc

    def f(a, n):
        total = 0
        for i in range(n):
            if a[i] > 0:
                total += a[i]
            else:
                total -= 1
        return total

    numbas, ours = compiler.run_frontend(f), compiler.run_frontend(f)
    postproc.PostProcessor.run.numbas(postproc.PostProcessor(numbas))
    postproc.PostProcessor(ours).run()
    assert not dict(ours.block_entry_vars) and "livemap" not in vars(ours.variable_lifetime)  # nothing computed
    assert sorted(ours.blocks) == sorted(numbas.blocks) and len(numbas.blocks) > 3
    for offset in numbas.blocks:
        assert ours.get_block_entry_vars(ours.blocks[offset]) == numbas.get_block_entry_vars(numbas.blocks[offset])


def test_numbas_error_messages_are_built_plain():
    """numba_patches._plain_error_messages: where colorama is installed numba marks up every error message
    it builds (each overload typing tried that did not match), wrapping stdout and stderr around
    each; the core's numba builds them as plain text, without touching the streams."""
    _numba_loaded()
    import sys

    from numba.core import errors

    streams = sys.stdout, sys.stderr
    assert errors.termcolor().errmsg("an overload did not match") == "an overload did not match"
    assert errors.termcolor().highlight("x") == "x" and (sys.stdout, sys.stderr) == streams


def closures_source() -> str:
    """Two functions of one qualified name, closures of different constants (as the families'
    loops are), each called by a function of its own: 40 branches, too large for LLVM to
    inline it into its caller, so that the caller calls it by its name."""
    maths = ["np.sin", "np.cos", "np.exp", "np.sqrt", "np.log1p", "np.tanh", "np.arctan"]
    branches = "".join(f"            {'if' if b == 0 else 'elif'} v > {5 - b / 8}:\n"
                       f"                t += {maths[b % 7]}(abs(v) * {b + 1}) * (k + {b}) - t / (k + {b + 2})\n"
                       for b in range(40))
    return ("import numba\nimport numpy as np\n\n\ndef make(k):\n    def f(a):\n        t = 0.0\n"
            "        for i in range(a.size):\n            v = a[i]\n" + branches +
            "        return t\n    return f\n\n\n"
            "f1 = numba.njit(make(1), cache=True)\nf2 = numba.njit(make(2), cache=True)\n\n\n"
            "@numba.njit(cache=True)\ndef g1(a):\n    return f1(a) + f1(a[1:]) + f1(a[2:])\n\n\n"
            "@numba.njit(cache=True)\ndef g2(a):\n    return f2(a) + f2(a[1:]) + f2(a[2:])\n")


@pytest.mark.skipif(not jit.COMPILED, reason="numba not installed")
def test_two_processes_never_give_two_functions_one_name(tmp_path):
    """Each of two processes compiles one of two closures of one qualified name into one cache;
    a third loads both and gets each one's own result. With numba's counter of ids, which starts
    at 1 in every process, both had one name, and the third ran the first loaded for both."""
    (tmp_path / "closures.py").write_text(closures_source())
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join((str(tmp_path), subprocess_path()))}
    env.pop("PAGESIM_JIT", None)  # compiled, as this process is
    start = ("from pagesim.sim.core.compile import jit; jit.use_numba(); import numpy as np, closures; "
             "a = np.linspace(0, 5, 50)")

    def run(code: str) -> list[float]:
        out = subprocess.run([sys.executable, "-c", f"{start}; print({code})"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return [float(x) for x in out.stdout.split()]

    [alone_1], [alone_2] = run("closures.g1(a)"), run("closures.g2(a)")
    assert alone_1 != alone_2
    assert run("closures.g1(a), closures.g2(a)") == [alone_1, alone_2]  # both loaded from the cache
    assert run("closures.g2(a), closures.g1(a)") == [alone_2, alone_1]


def test_a_loop_that_inlines_its_scheduler_is_keyed_by_its_schedulers_files():
    """vLLM v0's and Orca's loops (over paged memory, over contiguous extents) inline their
    scheduler (``families.SCHEDULER_BY_ADDRESS``): its files are then their loops' too, else an
    edit of them would leave them stale."""
    from pagesim.sim.core.compile import families

    inlined = [kind for kind, by_address in families.SCHEDULER_BY_ADDRESS.items() if not by_address]
    assert inlined == [families.CONTINUOUS, families.CONTINUOUS_CONTIGUOUS]
    for kind in families.FAMILIES:
        assert set(families.LOOP_FILES[kind]) <= set(families.FAMILY_FILES[kind])
        assert kind not in inlined or families.LOOP_FILES[kind] == families.FAMILY_FILES[kind]


def copies_lowered(monkeypatch, fn, args, kind, **options) -> int:
    """``fn`` compiled with numba's ``options`` and run on ``args``: its result, and how many
    assignments ``y = x`` of a value of numba type class ``kind`` its code had as it was lowered."""
    import numba
    from numba.core import ir, lowering

    lowered = []
    lower = lowering.Lower.lower

    def kept(self):
        lowered.append(sum(1 for block in self.func_ir.blocks.values() for stmt in block.find_insts(ir.Assign)
                           if isinstance(stmt.value, ir.Var) and isinstance(self.typeof(stmt.target.name), kind)))
        return lower(self)

    monkeypatch.setattr(lowering.Lower, "lower", kept)
    result = numba.njit(**options)(fn)(*args)
    monkeypatch.setattr(lowering.Lower, "lower", lower)
    return result, lowered[-1]


def test_a_functions_copies_of_a_value_its_first_block_assigns_once_are_that_value(monkeypatch):
    """numba_patches._copies_shared: a helper inlined at three places copies its caller's tuple into its
    own parameter at each; lowered without reference counting, the copies are gone (each reads
    the argument) and the result is the same; with reference counting they are left. A loop
    that keeps a copy of the last odd value it read computes the same."""
    numba_loaded()
    import numba
    import numpy as np
    from numba import types

    @numba.njit(inline="always", _nrt=False)
    def first_plus(t, k):
        return t[0][k] + t[1][k]

    def three_sums(t):
        return first_plus(t, 0) + first_plus(t, 1) + first_plus(t, 2)

    def last_odd(a):
        for k in range(a.size):
            v = a[k]
            if v % 2:
                kept = v  # assigned once, in the loop
        return kept

    t = (np.arange(3), np.arange(3) * 10)
    assert copies_lowered(monkeypatch, three_sums, (t,), types.BaseTuple, _nrt=False) == (33, 0)
    # counted references: left as numba has it, a copy at each of the three places
    assert copies_lowered(monkeypatch, three_sums, (t,), types.BaseTuple, _nrt=True) == (33, 3)
    a = np.array([3, 5, 4, 6])
    assert copies_lowered(monkeypatch, last_odd, (a,), types.Integer, _nrt=False)[0] == last_odd(a) == 5


def test_only_copies_of_a_value_the_first_block_assigns_once_are_shared():
    """numba_patches.share_copies on numba's untyped code of a function worked by hand: ``s = a`` and
    ``t = s`` (a copy of a copy) read the argument ``a``; ``kept = v``, a copy of a value
    assigned in the loop (which moves on after it), stays a copy, as does the loop's ``k``."""
    numba_loaded()
    from numba.core import compiler, ir

    def f(a, n):
        s = a
        for k in range(n):
            v = a[k]
            if v > 0:
                kept = v
        t = s
        return t[0] + kept

    class OneType(dict):
        def get(self, name, default=None):
            return "T"

    code = compiler.run_frontend(f)
    shared = numba_patches.share_copies(code, OneType())
    assert shared["s"] == shared["t"] == "a" and "kept" not in shared and "k" not in shared
    assigned = {stmt.target.name for block in code.blocks.values() for stmt in block.find_insts(ir.Assign)}
    assert {"s", "t"}.isdisjoint(assigned) and {"kept", "k", "v"} <= assigned
    read = {var.name for block in code.blocks.values() for stmt in block.body for var in stmt.list_vars()}
    assert "kept" in read and not {"s", "t"} & read


def lowered_text(monkeypatch, fn, args, **options):
    """``fn`` compiled with numba's ``options`` and run on ``args``: its result, and the text of
    its LLVM code as lowered, before any optimization. The options' ``boundscheck`` holds where the
    environment sets none for every function (the suite's ``NUMBA_BOUNDSCHECK``: tests/checked_core.py)."""
    import numba
    from numba.core import config, lowering

    monkeypatch.setattr(config, "BOUNDSCHECK", None)
    texts = []
    lower = lowering.Lower.lower

    def kept(self):
        lower(self)
        texts.append(str(self.module))

    monkeypatch.setattr(lowering.Lower, "lower", kept)
    result = numba.njit(**options)(fn)(*args)
    monkeypatch.setattr(lowering.Lower, "lower", lower)
    return result, texts[-1]


def test_a_field_of_a_large_named_tuple_is_read_from_its_place_not_the_whole_tuple_first(monkeypatch):
    """numba_patches._fields_read_in_place: a function without reference counting that reads two fields
    of a 20-field named tuple in a loop loads each from the tuple's stack slot alone; numba's way
    (a 10-field tuple, or reference counting) loads the whole tuple at each, then takes the field
    out. The sums are the same."""
    numba_loaded()
    from collections import namedtuple

    def pick(b, n):
        total = 0
        for k in range(n):
            total += b.f3 if k % 2 else b.f7
        return total

    for size, counted, whole in ((20, False, False), (20, True, True), (10, False, True)):
        b = namedtuple(f"Big{size}", [f"f{k}" for k in range(size)])(*range(size))
        result, text = lowered_text(monkeypatch, pick, (b, 5), _nrt=counted)
        assert result == pick(b, 5) == 3 * 7 + 2 * 3
        # the tuple loaded whole: for each of the two fields numba's way, and at its del
        assert text.count(f"load [{size} x i64]") == (3 if whole else 1), (size, counted)


def test_an_element_indexed_by_integers_is_read_and_written_from_the_arrays_description(monkeypatch):
    """numba_patches._array_elements_direct: ``a[i]``, ``m[i, j]`` and their stores take the data pointer
    and the dimensions from the array's description itself; numba's way (here: its bounds check
    on, where the core leaves it as numba has it) first stores each description into a stack
    slot of its own. The elements are the same in every layout and index kind: a negative index
    counts from the end, an unsigned one does not, a value stored is cast to the array's type,
    an F-ordered and a strided array are read by their strides, and a row or a slice (a view) is
    numba's."""
    numba_loaded()
    import re

    import numpy as np

    def touch(a, m, f, strided, out):
        i, last = np.uint64(1), np.int64(-1)
        out[0] = a[i] + a[last] + a[-2]          # 1-D: unsigned, negative (a variable), negative
        out[1] = m[1, 2] + m[-1, -1]             # 2-D, C-ordered
        out[2] = f[1, 0] + f[0, 1]               # 2-D, F-ordered
        out[3] = strided[1] + strided[-1]        # every other element: strides
        m[0, 1] = 7                              # an integer stored into floats
        out[4] = m[1].sum() + a[1:3].sum()       # a row and a slice: views (numba's)
        total = 0.0
        for k in range(a.size):
            total += a[k] * m[k % 2, k % 3]
        return total

    def arrays():
        m = np.arange(6.0).reshape(2, 3)
        return np.arange(5), m, np.asfortranarray(m), np.arange(10)[::2], np.zeros(5)

    expected = arrays()
    want = touch(*expected)
    description = re.compile(r"alloca \{i8\*, i8\*, i64, i64, \w+\*, \[1 x i64\], \[1 x i64\]\}")  # a 1-D array's
    counts = {}
    for checked in (False, True):
        given = arrays()
        result, text = lowered_text(monkeypatch, touch, given, _nrt=False, boundscheck=checked)
        assert result == want
        assert np.array_equal(given[4], expected[4]) and np.array_equal(given[1], expected[1])
        counts[checked] = len(description.findall(text))
    assert list(expected[4]) == [1 + 4 + 3, 5 + 5, 3 + 1, 2 + 8, 3 + 4 + 5 + 1 + 2]
    assert expected[1][0, 1] == 7.0
    # a description stored for each 1-D read or write numba's way (~10 here), none more directly
    assert counts[True] >= counts[False] + 8, counts


#: a static batch priced by a measured table, run on the core of the ``pagesim`` first on the
#: path: which core ran, and each step's seconds (``cost_table.table_step_time``, a function
#: compiled as a call, cached with the shared functions, inlines ``cost.plus_transfers``)
TABLE_PRICED_RUN = """
import json, sys
from pagesim.sim.core.compile import jit
from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for, trace, write_table_profile
cfg = cfg_for("static", slots=192, max_seq_len=64, profile=str(write_table_profile(sys.argv[1])))
r = run_simulation(cfg, trace([(0, 20, 3), (0, 40, 2), (0, 30, 2)]))
print(json.dumps([jit.__file__, r.summary["engine"], r.steps["dt_s"].tolist()]))
"""


@pytest.mark.skipif(not jit.COMPILED, reason="numba not installed")
def test_an_edit_of_a_shared_source_leaves_no_stale_code_in_the_users_cache(tmp_path):
    """With NUMBA_CACHE_DIR set, numba caches the shared functions there (jit.numbas_cache_dir), not
    in sim/core/__pycache__: after an edit of cost.py, cost_table.py's compiled function, whose
    own file is unchanged, inlined the old ``plus_transfers`` from that cache, and the run's
    seconds were the old ones while CPython's were the new. A copy of the core is run compiled,
    its cost.py edited (each step 0.25 s dearer), run again compiled in a fresh process: the
    same seconds as CPython's (``PAGESIM_JIT=0``) over the edited sources."""
    import json
    import shutil
    from pathlib import Path

    copy = tmp_path / "import" / "pagesim"
    shutil.copytree(Path(jit.__file__).parents[2], copy / "sim",
                    ignore=shutil.ignore_patterns("__pycache__", "compiled"))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PAGESIM_JIT": "numba",  # no extension module
           "PYTHONPATH": os.pathsep.join((str(tmp_path / "import"), subprocess_path()))}

    def run(**extra) -> list:
        out = subprocess.run([sys.executable, "-c", TABLE_PRICED_RUN, str(tmp_path / "profile.csv")],
                             env={**env, **extra}, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        where, engine, seconds = json.loads(out.stdout.splitlines()[-1])
        assert Path(where) == copy / "sim" / "core" / "compile" / "jit.py"
        return [engine, seconds]

    engine, before = run()
    assert engine == "core"
    cost = copy / "sim" / "core" / "price" / "cost.py"
    written = "        t += 2 * copied_tokens * c[KV_BYTES_PER_TOKEN] / c[MEMORY_BANDWIDTH]\n    return t\n"
    assert cost.read_text().count(written) == 1
    cost.write_text(cost.read_text().replace(written, written.replace("return t\n", "return t + 0.25\n")))
    interpreted = run(PAGESIM_JIT="0")
    assert interpreted == ["core-cpython", [t + 0.25 for t in before]]  # the edit priced
    assert run() == ["core", interpreted[1]]


CACHED_WITH_SOURCES = """
import sys

import numba

from pagesim.sim.core.compile import numba_patches

numba_patches._index_keyed_by_sources()
sys.path.insert(0, sys.argv[1])
import toy

dispatcher = numba.njit(cache=True)(toy.add_one)
dispatcher._cache.pagesim_sources = sys.argv[2]
assert dispatcher(1) == 2
print(len(dispatcher.stats.cache_hits), len(dispatcher.stats.cache_misses))
"""


def test_an_entry_cached_from_other_core_sources_is_never_loaded(tmp_path):
    """A process that read the core's sources before an edit may still compile after it, and
    save its code where a newer process already dropped the cache (_drop_stale_cache runs as a
    process starts). numba keys an entry by the function's own bytecode alone, so the key also
    names the digest of the sources it was compiled from: each process, in a cache of its own
    folder, hits its own sources' entry alone, and both entries stay."""
    pytest.importorskip("numba")
    (tmp_path / "toy.py").write_text("def add_one(x):\n    return x + 1\n")
    script = tmp_path / "script.py"
    script.write_text(CACHED_WITH_SOURCES)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=subprocess_path())

    def hits_and_misses(sources: str) -> str:
        done = subprocess.run([sys.executable, str(script), str(tmp_path), sources], env=env,
                              capture_output=True, text=True, check=True)
        return done.stdout.split("\n")[-2]

    assert hits_and_misses("old sources") == "0 1"
    assert hits_and_misses("old sources") == "1 0"
    assert hits_and_misses("new sources") == "0 1"  # without the digest in the key: a hit (1 0)
    assert hits_and_misses("new sources") == "1 0"
    assert hits_and_misses("old sources") == "1 0"


def test_the_cores_dispatchers_are_keyed_by_the_sources_this_process_read():
    """Every dispatcher of the core carries the digest its cache group's sources had when numba
    loaded (jit.keyed_by_sources): the shared functions' and each family's loop's."""
    numba_loaded()
    from pagesim.sim.core.sched import lifecycle

    assert jit.compiled(lifecycle.start_running)._cache.pagesim_sources == jit.digest_read(None)
    grouped = [fn for fn, group in jit._GROUPS.items() if getattr(jit.compiled(fn), "_cache", None) is not None]
    assert grouped, "no cache group's dispatcher"
    for fn in grouped:
        assert jit.compiled(fn)._cache.pagesim_sources == jit.digest_read(jit._GROUPS[fn])
