"""Two threads parse at once without the interpreter's SystemError (quantize_serve/core/ast_lock.py).

CPython 3.11 before 3.11.8 shares the AST constructor's recursion depth between threads: a garbage
collection inside ``ast.parse`` lets the other thread parse, and one of them fails with ``SystemError: AST
constructor recursion depth mismatch`` (CI, Python 3.11.7: Prefect's server import beside the work-ahead
thread's torch import, 30 tests errored). Each case runs in a fresh interpreter: a collection callback that
yields the GIL makes the interleaving happen within a few hundred parses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from quantize_serve.core import ast_lock
from tests.conftest import ROOT

RACE = textwrap.dedent("""\
    import ast, gc, sys, threading, time
    if sys.argv[1] == "guarded":
        import quantize_serve  # installs the lock on an affected interpreter
    SOURCE = "\\n".join(f"def f{i}(a, b=1, *c, **d):\\n    return [x for x in (a, b, c, d) if x]\\n"
                       for i in range(30))
    errors = []

    def parse(depth):
        if depth:  # the two threads parse at different stack depths, as a flow's threads do
            return parse(depth - 1)
        for _ in range(int(sys.argv[2])):
            if errors:
                return
            try:
                ast.parse(SOURCE)
            except SystemError as e:
                errors.append(str(e))
                return

    gc.callbacks.append(lambda phase, info: phase == "start" and time.sleep(0.0001))  # yield in a collection
    gc.set_threshold(200)
    threads = [threading.Thread(target=parse, args=(d,)) for d in (5, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(errors), errors[:1])
""")


def race(mode: str, parses: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", RACE, mode, str(parses)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not ast_lock.affected(), reason="this interpreter's AST constructor does not race")
def test_the_race_happens_on_this_interpreter_without_the_lock():
    """The case below is a real test: unguarded, the same parses fail here."""
    assert race("bare", 3_000).startswith("1 ['AST constructor recursion depth mismatch")


def test_two_threads_parse_at_once_without_error_once_the_package_is_imported():
    assert race("guarded", 500) == "0 []"


def test_the_lock_is_installed_only_where_the_interpreter_needs_it():
    assert ast_lock.affected((3, 11, 7)) and ast_lock.affected((3, 12, 1))
    assert not ast_lock.affected((3, 11, 8)) and not ast_lock.affected((3, 12, 2))
    assert not ast_lock.affected((3, 13, 0))


def test_calls_that_do_not_ask_for_an_ast_pass_straight_through():
    code = ast_lock._compile("x = 1", "<test>", "exec")
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["x"] == 1
    tree = ast_lock._compile("y = 2", "<test>", "exec", 0x400)  # PyCF_ONLY_AST
    assert type(tree).__name__ == "Module"
