#!/usr/bin/env python3
"""Checks that the docs' links into the source land where they say.

A link such as [`Reducer::launch`](../comm/reducer.cpp#L166) in docs/*.md (or
(nanoddp/...#L166) in README.md) must name a file that exists and a line that exists; when the
link text is code (in backticks), that line must contain it as a whole token, without a
trailing "(...)" (code text may hold brackets: [`acc[i] /= d`](...)). A qualified name (`Optimizer::shard`) must be spelt whole on its line
(`void Optimizer::shard(`, a call `Optimizer::shard(`), or the line must declare the bare name
inside that class (`  void shard(OptimizerShard shard);` in class Optimizer): a bare `shard`
anywhere would let `AdamW::update_slice` land on `SGD::update_slice`. A bare
function name (`enqueue`) speaks of the function: when the file defines it, the link must land on
its definition, not on a caller's line (write a call as `enqueue(...)`). So when code moves, the test names the stale link instead of the
guide silently pointing at the wrong line.

Usage: check_source_links.py SOURCE_DIR [--fix]
  exit 1 and one line per broken link; --fix moves each broken link to the nearest line (within
  40) that contains its text, and reports what it could not fix.
"""
import pathlib
import re
import sys

# The text is either code in backticks, which may hold brackets (`acc[i] /= divisor`), or prose
# without them.
LINK = re.compile(r"\[(`[^`]+`|[^\]]+)\]\(([^)#\s]+)#L(\d+)\)")


def keys_of(label):
    """What the linked line must contain, best first; None for prose links (file and line only)."""
    code = label.strip()
    if not (code.startswith("`") and code.endswith("`")):
        return None
    code = code[1:-1]
    if code.endswith("(...)"):
        code = code[: -len("(...)")]
    # A qualified name (`Reducer::launch`): the definition spells it whole and opens its
    # parameter list (`void Reducer::launch(`); a message may quote it, a call uses the last part.
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)+", code):
        return [code + "(", code]
    return [code]


def qualified_name(label):
    """(class, member) when the link text is a qualified name (`Reducer::launch`), else None."""
    m = re.fullmatch(r"`((?:[A-Za-z_][A-Za-z0-9_]*::)+)([A-Za-z_][A-Za-z0-9_]*)(?:\(\.\.\.\))?`",
                     label.strip())
    if not m:
        return None
    return m.group(1)[:-2].split("::")[-1], m.group(2)


def enclosing_class(lines, n):
    """The name of the class or struct whose body holds line n (1-based), or None: walk up to
    the first `{` left open, and read `class X`/`struct X` on its line or the line above."""
    depth = 0
    for k in range(n - 1, 0, -1):
        text = lines[k - 1].split("//")[0]
        for ch in reversed(text):
            if ch == "}":
                depth += 1
            elif ch == "{":
                if depth == 0:
                    head = (lines[k - 2] if k > 1 else "") + " " + text
                    m = re.findall(r"\b(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?"
                                   r"([A-Za-z_][A-Za-z0-9_]*)", head)
                    return m[-1] if m else None
                depth -= 1
    return None


def declares_member(lines, n, cls, member):
    """True when line n declares (or defines inline) member function `member` inside class
    `cls`: `  virtual void update_slice(`, `  void shard(OptimizerShard shard);` - a return type
    before the name, no call syntax (`.`, `->`, `=`, `return`) and no other class's `X::`."""
    line = lines[n - 1]
    if line.lstrip().startswith(("//", "*", "#")):
        return False
    m = re.search(r"(?<![A-Za-z0-9_])" + re.escape(member) + r"\s*\(", line)
    if not m:
        return False
    head = line[: m.start()].rstrip()
    if not re.fullmatch(r"\s*(?:\[\[[^\]]*\]\]\s*)?[A-Za-z_][A-Za-z0-9_:<>,&*\s]*[A-Za-z0-9_>&*]",
                        head):
        return False  # no return type, or call syntax before the name
    if head.endswith("::") or re.search(r"\b(return|else|throw|co_return|co_await|new|delete)$",
                                         head):
        return False
    return enclosing_class(lines, n) == cls


def declares(line, key):
    """True when `line` declares `key` as a variable, parameter or member (`float divide_by,`,
    `int pending_;`, `std::vector<T> works_ = ...`) rather than calling or defining a function."""
    name = key.split("::")[-1].split("(")[0].split("->")[-1].split(".")[-1]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return False
    # The type may be a template whose arguments hold parentheses (std::function<void(int)>&).
    m = re.search(r"([A-Za-z_][A-Za-z0-9_:]*(?:<[^;{}]*>)?)\s*[&*]*\s+[&*]?" + re.escape(name)
                  + r"\s*(?:[,);=]|\[|\{(?!\s*$))", line)
    if not m:
        return False
    return m.group(1) not in {"return", "else", "throw", "co_return", "new", "delete", "case",
                              "goto", "sizeof", "typename", "using", "namespace"}


def bare_name(label):
    """The function name when the link text is a bare name (`enqueue`), else None. A bare name
    speaks of the function itself; a call is written as one (`impl->enqueue(...)`, `launch(...)`)."""
    m = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", label.strip())
    return m.group(1) if m else None


def defines(line, name):
    """True when `line` starts a definition of function `name` at file scope (column 0:
    `void Reducer::launch(`, `std::shared_ptr<Work> GlooProcessGroup::Impl::enqueue(`), not a
    call (`impl->enqueue(`, `x = launch(`) nor a statement."""
    if not line or line[0] in " \t/#*}":
        return False
    m = re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\s*\(", line)
    if not m:
        return False
    head = line[: m.start()]
    return not head.endswith((".", "->")) and "=" not in head and not head.startswith("return")


def contains(line, key):
    # As a whole token: `launch` must not match "launched", nor `run` "run_allreduce".
    before = r"(?<![A-Za-z0-9_])" if re.match(r"[A-Za-z0-9_]", key) else ""
    after = r"(?![A-Za-z0-9_])" if re.search(r"[A-Za-z0-9_]$", key) else ""
    return re.search(before + re.escape(key) + after, line) is not None


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    fix = "--fix" in sys.argv[2:]
    docs = sorted((root / "docs").glob("*.md")) + [root / "README.md"]
    problems, checked, fixed = [], 0, 0
    for doc in docs:
        doc_lines = doc.read_text(encoding="utf-8").splitlines(keepends=True)
        for number, text in enumerate(list(doc_lines), 1):
            for match in LINK.finditer(text):
                label, target, line = match.group(1), match.group(2), int(match.group(3))
                where = f"{doc.relative_to(root)}:{number}: [{label}]({target}#L{line})"
                path = (doc.parent / target).resolve()
                checked += 1
                if not path.is_file():
                    problems.append(f"{where}: no such file {path}")
                    continue
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
                if line < 1 or line > len(lines):
                    problems.append(f"{where}: the file has {len(lines)} lines")
                    continue
                keys = keys_of(label)
                if keys is None:
                    problems.append(f"{where}: a link with a line number must name the code on "
                                    f"that line in backticks (prose cannot be checked)")
                    continue
                qualified = "::" in label
                # A bare function name the file defines must land on its definition, not on
                # some caller's line (`enqueue` on `return impl->enqueue(` of another op).
                name = bare_name(label)
                definitions = ({n for n in range(1, len(lines) + 1) if defines(lines[n - 1], name)}
                               if name else set())

                member = qualified_name(label)

                def holds(n):  # line n uses the text (a declaration does not count)
                    if definitions:
                        return n in definitions
                    if member:  # spelt whole, or declared in its class
                        return (any(contains(lines[n - 1], k) for k in keys)
                                or declares_member(lines, n, *member))
                    return (any(contains(lines[n - 1], k) for k in keys)
                            and (qualified or not declares(lines[n - 1], keys[0])))

                declared = (any(contains(lines[line - 1], k) for k in keys)
                            and not holds(line))
                if not holds(line):
                    near = []
                    for key in keys:  # the best key found anywhere nearby wins
                        near = [n for n in range(max(1, line - 40), min(len(lines), line + 40) + 1)
                                if (contains(lines[n - 1], key)
                                    or (member and declares_member(lines, n, *member)))
                                and holds(n)
                                and not lines[n - 1].lstrip().startswith(("//", "*", "#"))]
                        if near:
                            break
                    if not near and definitions:  # a function defined further away
                        near = sorted(definitions)
                    near.sort(key=lambda n: abs(n - line))
                    if fix and near:
                        old_link = match.group(0)
                        new_link = old_link.replace(f"#L{line})", f"#L{near[0]})")
                        doc_lines[number - 1] = doc_lines[number - 1].replace(old_link, new_link, 1)
                        fixed += 1
                        continue
                    if definitions and contains(lines[line - 1], name):
                        where_defined = ", ".join(str(n) for n in sorted(definitions))
                        problems.append(f"{where}: line {line} uses '{name}' but the link names "
                                        f"the function, defined at line {where_defined} (link a "
                                        f"call as `{name}(...)`): {lines[line - 1].strip()!r}")
                        continue
                    if declared:
                        problems.append(f"{where}: line {line} declares '{keys[0]}' instead of "
                                        f"using it: {lines[line - 1].strip()!r}")
                        continue
                    hint = f" (nearest match: line {near[0]})" if near else ""
                    problems.append(f"{where}: line {line} does not contain '{keys[0]}'{hint}: "
                                    f"{lines[line - 1].strip()!r}")
        if fix:
            doc.write_text("".join(doc_lines), encoding="utf-8")
    for p in problems:
        print(p)
    print(f"{checked} source links checked, {len(problems)} broken"
          + (f", {fixed} moved to the line that now holds their text" if fix else ""))
    if problems and not fix:
        print("(tests/docs/check_source_links.py SOURCE_DIR --fix moves links whose text is nearby)")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
