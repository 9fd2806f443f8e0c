"""No test asserts a wall-clock time: a test on a loaded machine (``make test`` beside other
jobs, CI) must fail for a fault only, so tests check what the code does and speed targets go to
the benchmark (``coda bench``, :mod:`coda.experiments.bench`). Found here: every ``assert``
of the test files that compares a clock reading (``time.perf_counter()``, ``time.time()``,
``time.monotonic()``, ...), a name computed from one, or a dict entry holding one."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]   # tests/: every folder under it
CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
          "process_time", "process_time_ns"}


def _timed_asserts(tree: ast.AST) -> list[int]:
    """Lines of the asserts of ``tree`` that compare a clock reading."""
    names: set[str] = set()      # variables holding a clock reading or a value computed from one
    keys: set[str] = set()       # string keys of dict literals whose values hold one

    def timed(node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                f = sub.func
                if (isinstance(f, ast.Attribute) and f.attr in CLOCKS
                        and isinstance(f.value, ast.Name) and f.value.id.lstrip("_") == "time"):
                    return True
                if isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}:
                    return True
            if isinstance(sub, ast.Name) and sub.id in names:
                return True
            if (isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant)
                    and sub.slice.value in keys):
                return True
        return False

    grew = True
    while grew:                  # to a fixed point: t0 -> dt = ... - t0 -> rate = n / dt
        grew = False
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
                if timed(node.value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name) and n.id not in names:
                                names.add(n.id)
                                grew = True
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if (isinstance(k, ast.Constant) and isinstance(k.value, str)
                            and k.value not in keys and timed(v)):
                        keys.add(k.value)
                        grew = True
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)
            and any(isinstance(c, ast.Compare) and timed(c) for c in ast.walk(node.test)))


def test_the_finder_sees_the_usual_forms():
    code = ("import time\n"
            "def test_a():\n"
            "    t0 = time.perf_counter()\n"
            "    run()\n"
            "    dt = time.perf_counter() - t0\n"
            "    assert dt < 10\n"
            "def check():\n"
            "    t0 = time.monotonic()\n"
            "    return {'wall': time.monotonic() - t0, 'n': 3}\n"
            "def test_b(c):\n"
            "    ass" "ert c['wall'] < 60\n"
            "    assert c['n'] == 3\n"
            "def test_c():\n"
            "    t0 = time.time()\n"
            "    ass" "ert time.time() - t0 <= 5\n"
            "    assert report['wall_s'] > 0\n")
    assert _timed_asserts(ast.parse(code)) == [6, 11, 15]


def test_no_test_asserts_a_wall_time():
    found = [f"{path.relative_to(TESTS)}:{line}" for path in sorted(TESTS.rglob("*.py"))
             for line in _timed_asserts(ast.parse(path.read_text(), str(path)))]
    assert not found, ("asserts on a wall-clock time (check behaviour in the test, measure speed "
                       f"in coda bench): {', '.join(found)}")
