"""The docs name only what exists (issue 51): every file and every flag that
docs/ARCHITECTURE.md names is in the tree. A file is named in backticks
(`common/retry.h`, `core/sync_round.*`, `exchanger.*`) or as an entry of the
"Code layout" block, relative to the directory the block is in; a flag is
any --name. Unit tier: reads the tree, runs nothing."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIRS = ["common", "services", "tools", "tests", "python", "protos", "scripts", "bench",
               "deploy", "examples", "docs"]
FILE_SUFFIX = re.compile(r"\.(h|cc|py|sh|md|proto|cmake|txt|yml|yaml|json|\*|\{h,cc\})$")


def tree_files():
    files = set()
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("build", "__pycache__")]
            for name in filenames:
                files.add(os.path.relpath(os.path.join(dirpath, name), ROOT))
    for name in os.listdir(ROOT):
        if os.path.isfile(os.path.join(ROOT, name)):
            files.add(name)
    return files


FILES = tree_files()


def exists(name):
    """True when some file of the tree ends with `name` (a path suffix;
    `x.*` and `x.{h,cc}` stand for its extensions; `dir/` for a directory)."""
    name = name.rstrip(",.;:")
    if name.endswith("/"):
        return any(f.startswith(name) or ("/" + name) in ("/" + f) for f in FILES)
    if name.endswith(".{h,cc}"):
        base = name[: -len("{h,cc}")]
        return exists(base + "h") and exists(base + "cc")
    if name.endswith(".*"):
        base = "/" + name[:-2]
        return any(("/" + os.path.splitext(f)[0]).endswith(base) for f in FILES)
    return any(("/" + f).endswith("/" + name) for f in FILES)


def named_files(text):
    """The file names the text gives in backticks."""
    names = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        if token.startswith("--") or "://" in token:
            continue
        path = token.split("(")[0]
        # A proto field or a config key is not a file: Message.field, group.key.
        if FILE_SUFFIX.search(path) or (path.endswith("/") and "/" in path[:-1]):
            names.add(path)
    return names


def layout_entries(text):
    """The entries of the "Code layout" block with the directory each is in."""
    block = text.split("## Code layout", 1)[1].split("```", 2)[1]
    entries, directory = set(), ""
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            first = line.split()[0]
            directory = first if first.endswith("/") else ""
            if not first.endswith("/"):
                entries.add(first)
            continue
        first = line.split()[0]
        if line.startswith("  ") and not line.startswith("   ") and FILE_SUFFIX.search(first):
            entries.add(directory + first)
    return entries


def defined_flags():
    flags = set()
    patterns = [
        (r"ABSL_FLAG\(\s*[\w:]+\s*,\s*(\w+)", ("*.cc", "*.h")),
        (r'^\s*flag: "(\w+)"', ("*.proto",)),
        (r'\{"(\w+)", \d+, "', ("cli.cc",)),
        (r'add_argument\(\s*"--(\w+)"', ("*.py",)),
        (r"--(\w+)\)", ("*.sh",)),
    ]
    for regex, globs in patterns:
        for pattern in globs:
            for path in glob.glob(os.path.join(ROOT, "**", pattern), recursive=True):
                if "/build" in path:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    flags.update(re.findall(regex, f.read(), re.M))
    return flags


def test_every_file_architecture_names_exists():
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = f.read()
    names = named_files(text) | layout_entries(text)
    assert len(names) > 100, sorted(names)  # the checker reads the names
    missing = sorted(n for n in names if not exists(n))
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"


def test_every_flag_architecture_names_is_defined():
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = f.read()
    # Not a hyphenated option of another tool (pip's --no-build-isolation).
    named = set(re.findall(r"--([a-z][a-z0-9_]*[a-z0-9])(?![a-z0-9_-])", text))
    # Abseil's own, and the TLS flags named as a family (--tls_*).
    named -= {"help", "version", "tls"}
    missing = sorted(named - defined_flags())
    assert not missing, f"docs/ARCHITECTURE.md names flags no binary defines: {missing}"


def test_the_checker_sees_a_missing_file_and_flag():
    assert not exists("common/no_such_file.h")
    assert not exists("core/sync_roundz.*") and not exists("etry.*")
    assert exists("common/retry.h") and exists("retry.*") and exists("common/model_file.{h,cc}")
    assert "no_such_flag" not in defined_flags()
    assert {"min_participants", "uplink_mbps", "coordinator", "nat", "replot"} <= defined_flags()
