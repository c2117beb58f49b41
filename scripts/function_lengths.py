#!/usr/bin/env python3
"""Lists C++/CUDA function definitions longer than a limit (default 120 lines).

    scripts/function_lengths.py [--max N] [PATH...]     (default PATH: src)

A function's length runs from the first line of its declarator to its closing brace. CUDA
kernels (`__global__`) are exempt. Exit status 1 when any function is over the limit.

The scan needs no compiler: comments, string and character literals and preprocessor lines
are blanked, then braces are matched. A `{` outside any function opens a function body when
the text before it (since the last `;`, `{` or `}`) is a declarator: it has a parameter list
and ends with `)` (then optionally const, noexcept, override, final, a ref-qualifier or a
trailing return type), and it is not a namespace, class, enum or `=` initializer. Braces of a
constructor's member initialisers (`x_{1}`) belong to the declarator. Everything inside a
function body (lambdas, local classes) counts toward that function.
"""
import argparse
import os
import re
import sys

EXTENSIONS = (".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh")
TRAILING_WORDS = re.compile(r"(\s+|\b(const|volatile|noexcept|override|final|mutable)\b|&&|&)$")


def blank(text):
    """Comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # A preprocessor directive, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if c == "\n":
            out.append(c)
            i += 1
            line_start = True
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        m = re.match(r'R"([^(\s]*)\(', text[i:i + 32]) if c == "R" and (i == 0 or not text[i - 1].isalnum()) else None
        if m:
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator: 1'000'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def depth0(s):
    """`s` with everything inside (), [] and <> of template-looking spans removed."""
    out, depth = [], 0
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                out.append("()")
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


def is_declarator(header):
    h = header.strip()
    if not h or "(" not in h:
        return False
    if re.match(r"^(template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern)\b", h, re.S):
        return False
    flat = depth0(h)
    if re.search(r"(?<![=!<>])=(?!=)", flat.split("()")[0]):  # an initializer: `T x = {`
        return False
    h = re.sub(r"->[^(){};]*$", "", h)  # trailing return type
    while True:
        stripped = TRAILING_WORDS.sub("", h)
        if stripped == h:
            break
        h = stripped
    h = re.sub(r"\bnoexcept\s*\([^()]*\)$", "", h).rstrip()
    return h.endswith(")")


def has_ctor_init(header):
    """A constructor's `) : member(...)` list has started in `header`."""
    flat = depth0(header)
    return re.search(r"\)\s*:(?!:)", flat) is not None


def function_name(header):
    flat = depth0(header.strip())
    m = re.search(r"\)\s*:(?!:)", flat)  # drop a constructor's initialiser list
    if m:
        flat = flat[: m.start() + 1]
    flat = re.sub(r"(\s|\bconst\b|\bnoexcept\b|\boverride\b|\bfinal\b|&|->.*)*$", "", flat)
    before = flat[: flat.rfind("()")] if flat.endswith("()") else flat
    m = re.search(r"((?:[~\w]+::)*(?:operator\s*[^\s\w]+|~?\w+))\s*$", before)
    return m.group(1) if m else "?"


def scan(path, text):
    """Yields (line, name, length, is_kernel) for each function definition."""
    code = blank(text)
    stack = []  # entries: "scope", "function", "other", "init"
    header_start = 0
    func_start = None
    func_name = ""
    func_kernel = False
    line = 1
    header_line = None
    for i, ch in enumerate(code):
        if ch == "\n":
            line += 1
            continue
        in_function = "function" in stack
        if not in_function and header_line is None and not ch.isspace() and ch not in ";{}":
            header_line = line
        if ch == ";" and not in_function:
            header_start, header_line = i + 1, None
        elif ch == "{":
            if in_function:
                stack.append("other")
                continue
            header = code[header_start:i]
            before = header.rstrip()
            if has_ctor_init(header) and before and (before[-1].isalnum() or before[-1] in "_>"):
                stack.append("init")  # a member's brace initialiser in a constructor's list
                continue
            if is_declarator(header):
                stack.append("function")
                func_start = header_line or line
                func_name = function_name(header)
                func_kernel = "__global__" in header
            elif re.match(r"^\s*(template\s*<.*>\s*)?(namespace|class|struct|union|extern)\b", header, re.S):
                stack.append("scope")
            else:
                stack.append("other")
            header_start, header_line = i + 1, None
        elif ch == "}":
            kind = stack.pop() if stack else "other"
            if kind == "init":
                continue
            if kind == "function":
                yield func_start, func_name, line - func_start + 1, func_kernel
            if "function" not in stack:
                header_start, header_line = i + 1, None


def files_under(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, _, names in os.walk(p):
            for name in sorted(names):
                if name.endswith(EXTENSIONS):
                    yield os.path.join(root, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=120, help="longest allowed function, in lines")
    ap.add_argument("--all", action="store_true", help="list every function with its length")
    ap.add_argument("paths", nargs="*", default=["src"])
    args = ap.parse_args()
    over = 0
    for path in sorted(files_under(args.paths)):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for line, name, length, kernel in scan(path, text):
            if args.all:
                print(f"{path}:{line}: {name} {length}{' (kernel)' if kernel else ''}")
            elif length > args.max and not kernel:
                print(f"{path}:{line}: {name} is {length} lines (limit {args.max})")
                over += 1
    if over:
        print(f"{over} function(s) over {args.max} lines: split them into named pieces", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
