"""The native module's classes and functions are what its stub declares: no more, no less (the
stub's type aliases are the stub's own)."""

import ast
from pathlib import Path

import agentloop._agentloop as native


def _stub_names() -> set[str]:
    stub = Path(__file__).resolve().parent.parent / "agentloop" / "_agentloop.pyi"
    tree = ast.parse(stub.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
    return names


def test_the_native_module_exports_what_its_stub_declares() -> None:
    exported = {name for name in dir(native) if not name.startswith("__")}
    assert exported == _stub_names()
