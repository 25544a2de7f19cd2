#!/usr/bin/env python3
"""Checks the import graph inside the workspace's crates: no circle of files, and in the core
(`crates/agentloop`) imports that run down its layers.

Each crate's module tree is read from its `lib.rs`/`main.rs` through its `mod` declarations. A
file's imports are the `crate::`, `super::` and `self::` paths in its `use` statements and its
code (comments, string literals and `#[cfg(test)]` items left out). A path is resolved to the file
that defines the item: a name that a module only re-exports (`pub use x::Y`, or a plain `use` that
a child reaches through `super::`) is followed to where it is defined, so a folder's `mod.rs` that
merely re-exports does not tie its files into a knot. `mod` declarations are not imports.

Checks:
- circles: in every crate listed in STRICT, any circle of files fails; in the other crates a
  circle is printed as a warning (their knots are still being untied);
- layers: the core's modules are placed on the layers declared in LAYERS (docs/architecture.md
  says why each sits where it does). An import from a lower layer to a higher one is "upward";
  more than MAX_UPWARD of them fail, and each must carry a comment starting `// Upward:` on the
  line of the import or the lines just above it, saying why.

Usage: .ci/import-graph.py [ROOT]   Prints what it found; exit status 1 on a failure.
"""

import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))

# Crates whose file graph must have no circle (by their folder under crates/): every crate, now
# that the last circles (the CLI's, the MCP crate's and the tools crate's) are open, so none
# comes back.
STRICT = {
    "agentloop",
    "agentloop-a2a",
    "agentloop-cli",
    "agentloop-eval",
    "agentloop-macros",
    "agentloop-mcp",
    "agentloop-observe",
    "agentloop-otel",
    "agentloop-providers",
    "agentloop-python",
    "agentloop-restate",
    "agentloop-sandbox",
    "agentloop-serve",
    "agentloop-store",
    "agentloop-tools",
}

# The core's layers, from the ground up. A module belongs to the layer of the longest prefix
# listed here; every module of the crate must be covered.
LAYERS = [
    ("vocabulary", [
        "message", "ids", "serde_duration", "panic", "fingerprint", "retry", "limits", "error",
        "model", "tool", "outcome", "event", "budget", "compaction", "config", "hooks",
        "guardrail", "steering", "url_secrets", "printable", "surrogates",
    ]),
    ("machine", ["machine"]),
    ("seams over the machine", ["gate", "journal"]),
    ("driver", ["driver"]),
    ("agent and its features", ["agent", "testing"]),
]
CORE = "agentloop"
MAX_UPWARD = 5
UPWARD_MARK = "// Upward:"

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text):
    """The text with comments and string literals blanked (line numbers kept) and
    `#[cfg(test)]` items removed."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or (c == "'" and re.match(r"'\\u\{", text[i:i + 4])):
            j = text.find("'", i + 2) + 1
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    return drop_test_items(code)


def drop_test_items(code):
    """Blanks each item under `#[cfg(test)]`: up to its `;` or its balanced braces."""
    result = list(code)
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        j = m.end()
        depth = 0
        while j < len(code):
            ch = code[j]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif ch == ";" and depth == 0:
                j += 1
                break
            j += 1
        for k in range(m.start(), min(j, len(code))):
            if result[k] != "\n":
                result[k] = " "
    return "".join(result)


def parse_use_tree(s, prefix, found):
    """Appends (path, alias) for each leaf of a use tree `s` (without `use` and `;`)."""
    s = s.strip()
    brace = s.find("{")
    if brace >= 0:
        head = [p for p in s[:brace].split("::") if p.strip()]
        body = s[brace + 1:s.rfind("}")]
        depth, start = 0, 0
        for k, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parse_use_tree(body[start:k], prefix + [h.strip() for h in head], found)
                start = k + 1
        parse_use_tree(body[start:], prefix + [h.strip() for h in head], found)
        return
    if not s:
        return
    alias = None
    m = re.match(r"(.*)\s+as\s+(" + IDENT + r")$", s)
    if m:
        s, alias = m.group(1).strip(), m.group(2)
    parts = prefix + [p.strip() for p in s.split("::") if p.strip()]
    if parts and parts[-1] == "self":
        parts = parts[:-1]
    if not parts or parts[-1] == "*":
        return
    found.append((parts, alias or parts[-1]))


class Crate:
    def __init__(self, name, src):
        self.name = name
        self.src = src
        self.files = {}  # module path (tuple) -> file path relative to src
        self.code = {}  # module path -> stripped code
        self.raw = {}  # module path -> raw lines
        self.uses = {}  # module path -> {visible name: (absolute path list, line)}
        self.refs = {}  # module path -> [(absolute path list, line)]
        root = "lib.rs" if os.path.exists(os.path.join(src, "lib.rs")) else "main.rs"
        self.load((), root)

    def load(self, module, rel):
        path = os.path.join(self.src, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.files[module] = rel
        self.raw[module] = text.split("\n")
        code = strip_code(text)
        self.code[module] = code
        folder = os.path.dirname(rel) if os.path.basename(rel) in ("lib.rs", "main.rs", "mod.rs") else rel[:-3]
        for m in re.finditer(r"(?:#\[path\s*=\s*\"([^\"]+)\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            # Declarations are read from the raw text: a `#[path]` needs its string literal.
            start = m.start()
            if code[start:m.end()].strip() == "" :
                continue  # inside a comment or a test item
            name = m.group(2)
            if m.group(1):
                child = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1)))
            elif os.path.exists(os.path.join(self.src, folder, name + ".rs")):
                child = os.path.join(folder, name + ".rs")
            else:
                child = os.path.join(folder, name, "mod.rs")
            self.load(module + (name,), child)

    def absolute(self, module, parts):
        """A use path made absolute (a list of segments after `crate`), or None if external."""
        if parts[0] == "crate":
            return parts[1:]
        base = list(module)
        k = 0
        while k < len(parts) and parts[k] in ("super", "self"):
            if parts[k] == "super":
                base = base[:-1]
            k += 1
        if k == 0:
            # A path through a name this module declared or imported.
            if (tuple(module) + (parts[0],)) in self.files:
                return list(module) + parts
            return None
        return base + parts[k:]

    def parse(self):
        for module, code in self.code.items():
            uses, refs = {}, []
            for m in re.finditer(r"\buse\s+([^;]+);", code):
                line = code.count("\n", 0, m.start()) + 1
                found = []
                parse_use_tree(m.group(1), [], found)
                for parts, alias in found:
                    ab = self.absolute(module, parts)
                    if ab is not None:
                        uses[alias] = (ab, line)
                        refs.append((ab, line))
            for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::" + IDENT + r")+)", code):
                pre = code[max(0, code.rfind("\n", 0, m.start())):m.start()]
                if re.search(r"\buse\s", pre) or re.search(r"\buse\s+[^;]*$", code[max(0, m.start() - 400):m.start()]):
                    continue  # part of a use statement, already read
                line = code.count("\n", 0, m.start()) + 1
                ab = self.absolute(module, m.group(1).split("::"))
                if ab is not None:
                    refs.append((ab, line))
            self.uses[module], self.refs[module] = uses, refs

    def resolve(self, parts, seen=None):
        """The module whose file defines the item at `parts`."""
        seen = seen or set()
        module = ()
        k = 0
        while k < len(parts) and module + (parts[k],) in self.files:
            module += (parts[k],)
            k += 1
        if k == len(parts):
            return module
        name = parts[k]
        key = (module, name)
        if key in seen:
            return module
        seen.add(key)
        hit = self.uses.get(module, {}).get(name)
        if hit is not None:
            return self.resolve(hit[0] + parts[k + 1:], seen)
        return module

    def edges(self):
        """{(from module, to module): first line} over every file but the crate root."""
        out = {}
        for module, refs in self.refs.items():
            if module == ():
                continue
            for parts, line in refs:
                target = self.resolve(parts)
                if target == () or target == module:
                    continue
                # A module's own children are its parts, not its imports.
                if target[:len(module)] == module:
                    continue
                out.setdefault((module, target), line)
        return out


def name(module):
    return "::".join(module) or "crate"


def circles(nodes, edges):
    """The strongly connected components with more than one member (Tarjan)."""
    graph = {n: [] for n in nodes}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def one_cycle(comp, edges):
    """A readable cycle through the component: a -> b -> ... -> a."""
    members = set(comp)
    nxt = {}
    for a, b in edges:
        if a in members and b in members:
            nxt.setdefault(a, []).append(b)
    start = comp[0]
    path, seen = [start], {start: 0}
    while True:
        choices = sorted(nxt.get(path[-1], []))
        step = next((c for c in choices if c in seen), None) or choices[0]
        if step in seen:
            return path[seen[step]:] + [step]
        seen[step] = len(path)
        path.append(step)


def layer_of(module):
    best, which = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            pp = tuple(p.split("::"))
            if module[:len(pp)] == pp and len(pp) > best:
                best, which = len(pp), i
    return which


def main():
    failed = False
    crates_dir = os.path.join(ROOT, "crates")
    for crate in sorted(os.listdir(crates_dir)):
        src = os.path.join(crates_dir, crate, "src")
        if not os.path.isdir(src):
            continue
        c = Crate(crate, src)
        c.parse()
        edges = c.edges()
        nodes = [m for m in c.files if m != ()]
        strict = crate in STRICT
        comps = circles(nodes, edges)
        for comp in comps:
            cycle = one_cycle(comp, edges)
            files = " -> ".join(c.files[m] for m in cycle)
            where = "; ".join(
                f"{c.files[a]}:{edges[(a, b)]} imports {c.files[b]}" for a, b in zip(cycle, cycle[1:])
            )
            kind = "error" if strict else "warning"
            print(f"{kind}: crates/{crate}: a circle of {len(comp)} files: {files}\n  ({where})")
            failed |= strict
        if crate != CORE:
            if not comps:
                print(f"crates/{crate}: {len(nodes)} files, no circle")
            continue
        upward = []
        for m in nodes:
            if layer_of(m) is None:
                print(f"error: crates/{crate}/src/{c.files[m]}: module {name(m)} is on no layer (.ci/import-graph.py LAYERS)")
                failed = True
        for (a, b), line in sorted(edges.items()):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and la < lb:
                upward.append((a, b, line))
        for a, b, line in upward:
            lines = c.raw[a]
            context = lines[max(0, line - 4):line]
            marked = any(UPWARD_MARK in l for l in context)
            note = "" if marked else f"  <- no `{UPWARD_MARK}` comment says why"
            print(
                f"upward: crates/{crate}/src/{c.files[a]}:{line} ({LAYERS[layer_of(a)][0]}) imports "
                f"{c.files[b]} ({LAYERS[layer_of(b)][0]}){note}"
            )
            if not marked:
                failed = True
        if len(upward) > MAX_UPWARD:
            print(f"error: crates/{crate}: {len(upward)} upward imports, at most {MAX_UPWARD} are allowed")
            failed = True
        if not comps:
            print(f"crates/{crate}: {len(nodes)} files, no circle, {len(upward)} upward imports (at most {MAX_UPWARD})")
    if failed:
        print("import graph: FAILED (see docs/architecture.md for the layers and how to mend a circle)")
        return 1
    print("import graph: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
