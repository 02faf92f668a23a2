"""The client's modules import one way (#35 item 6): no module imports one
that imports it back, counting every import, including those made only for
type checking (``if TYPE_CHECKING:``) and those inside functions. Read with
ast, so the check needs nothing imported."""

import ast
import os
import tempfile
import unittest
from typing import Dict, List, Optional, Set

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spotagent")
NAME = "spotagent"


def module_of(path: str) -> str:
    base = os.path.splitext(os.path.basename(path))[0]
    return NAME if base == "__init__" else NAME + "." + base


def imports(path: str, modules: Set[str]) -> Set[str]:
    """The package's modules that the file at path imports."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    me = module_of(path)
    pkg = NAME  # every module sits at the package's top
    out = set()  # type: Set[str]
    for node in ast.walk(tree):
        names = []  # type: List[str]
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level and not node.module:
                # from . import x: the module x (the package itself is the
                # one being imported already).
                names = [pkg + "." + a.name for a in node.names]
            else:
                base = pkg + "." + node.module if node.level else (node.module or "")
                names = [base] + [base + "." + a.name for a in node.names]
        for n in names:
            if n in modules and n != me:
                out.add(n)
    return out


def graph() -> Dict[str, Set[str]]:
    files = [os.path.join(PKG, f) for f in sorted(os.listdir(PKG)) if f.endswith(".py")]
    modules = {module_of(f) for f in files}
    return {module_of(f): imports(f, modules) for f in files}


def find_cycle(g: Dict[str, Set[str]]) -> Optional[List[str]]:
    """A cycle of g as a list of modules (first == last), or None."""
    state = {}  # type: Dict[str, int]  # 1: on the path, 2: done
    path = []  # type: List[str]

    def visit(m: str) -> Optional[List[str]]:
        state[m] = 1
        path.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                c = visit(n)
                if c is not None:
                    return c
        path.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            c = visit(m)
            if c is not None:
                return c
    return None


class TestImportGraph(unittest.TestCase):
    def test_acyclic(self):
        g = graph()
        # The graph is the package's: every module is seen, and the ones
        # everybody leans on are imported.
        self.assertIn("spotagent.client", g)
        self.assertIn("spotagent.client", g["spotagent"])
        self.assertIn("spotagent._state", g["spotagent.client"])
        cycle = find_cycle(g)
        self.assertIsNone(cycle, "import circle: %s" % " -> ".join(cycle or []))

    def test_no_module_but_client_and_init_imports_client(self):
        # The pieces take the state they need, never the Agent.
        g = graph()
        users = sorted(m for m, deps in g.items() if "spotagent.client" in deps)
        self.assertEqual(users, ["spotagent"])

    def test_the_check_can_fail(self):
        self.assertEqual(find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}), ["a", "b", "c", "a"])
        self.assertIsNone(find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}))
        # A type-checking-only import counts.
        src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .client import Agent\n"
        with tempfile.TemporaryDirectory() as d:
            probe = os.path.join(d, "probe.py")
            with open(probe, "w") as f:
                f.write(src)
            self.assertEqual(imports(probe, {"spotagent.client"}), {"spotagent.client"})


if __name__ == "__main__":
    unittest.main()
