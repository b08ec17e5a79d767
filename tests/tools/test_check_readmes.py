#!/usr/bin/env python3
"""tools/check-readmes must refuse a planted 61-word sentence and an over-long first screen, naming the
file, line and count, and pass the same tree without them (so the tree's own pass means something). Its
splitter must not end a sentence at "e.g.", "i.e.", a file name or a version number, must split list items
and must leave code blocks, tables and headings out.
  test_check_readmes.py CHECKER"""
import os
import subprocess
import sys
import tempfile

checker = sys.argv[1]
failures = []


def run(root):
    r = subprocess.run([sys.executable, checker, root], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def expect(name, root, code, *needles):
    rc, out = run(root)
    if rc != code or any(n not in out for n in needles):
        failures.append(f"{name}: exit {rc} (want {code}), wanted {needles} in:\n{out}")


def sentence(n, start="Word"):
    return " ".join([start] + [f"w{i}" for i in range(1, n)]) + "."


with tempfile.TemporaryDirectory() as root:
    def write(path, text):
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)

    ok = "# title\n\nA short first screen.\n\n## Part\n\n" + sentence(60) + " " + sentence(60, "Next") + "\n"
    write("README.md", ok)
    write("a/b/README.md", "Nested.\n")
    expect("a clean tree passes", root, 0, "2 READMEs")

    # A 61-word sentence in a nested folder README, wrapped over lines, on line 3.
    write("a/b/README.md", "# b\n\n" + sentence(61).replace(" w30 ", "\nw30 ") + "\n")
    expect("a planted 61-word sentence fails", root, 1, "a/b/README.md:3: a sentence of 61 words")
    write("a/b/README.md", "Nested.\n")

    # build/ and .venv are not the project's READMEs.
    write("build/x/README.md", sentence(80) + "\n")
    write(".venv/lib/README.md", sentence(80) + "\n")
    expect("build/ and .venv are left out", root, 0)

    # Abbreviations, file names, version numbers and code spans do not end a sentence: one 61-word sentence.
    tricky = ("Set it, e.g. `Model.layers` or i.e. Reference in plan/README.md and data/v1.2.3.bin with torch 1.13 "
              "or cf. Vs. " + sentence(44, "the"))  # 17 words before it
    write("a/b/README.md", tricky + "\n")
    expect("e.g., i.e., cf., file names and versions stay in one sentence", root, 1, "a sentence of 61 words")

    # ...while real sentence ends split, also before a code span, a digit or a bracket.
    split = (sentence(40) + " `megatrain` " + sentence(30, "runs") + " " + sentence(40, "Then") + " 3 " +
             sentence(40, "items") + " (" + sentence(40, "Aside") + ")")
    write("a/b/README.md", split + "\n")
    expect("sentence ends before code, digits and brackets split", root, 0)

    # A sentence may start in lower case (a tool's name); an ellipsis does not end one.
    write("a/b/README.md", sentence(40) + " megatrain-top " + sentence(40, "shows") + "\n")
    expect("a lower-case start splits", root, 0)
    write("a/b/README.md", sentence(30).rstrip(".") + " d, d + N, ... (the loader " + sentence(26, "routes") + "\n")
    expect("an ellipsis does not end a sentence", root, 1, "a sentence of 61 words")

    # List items are units of their own; a lowercase continuation line still belongs to its item.
    items = "\n".join("- " + sentence(40, "item") for _ in range(4)) + "\n  " + sentence(15, "more") + "\n"
    write("a/b/README.md", "Tests:\n" + items + "1. " + sentence(40, "one") + "\n2. " + sentence(40, "two") + "\n")
    expect("list items split", root, 0)

    # Code blocks, tables, headings and comments are not prose; a code span is one word.
    write("a/b/README.md", "```\n" + sentence(90) + "\n```\n| " + sentence(90) + " |\n## " + sentence(90) +
          "\n<!-- " + sentence(90) + " -->\n" + sentence(59) + " `a b c d e f`\n")
    expect("code, tables, headings and comments are left out", root, 0)
    write("a/b/README.md", sentence(60).replace(" w1 ", " `a b c` w1 ") + "\n")
    expect("a code span is one word", root, 1, "a sentence of 61 words")
    write("a/b/README.md", "Nested.\n")

    # The first screen: at most 250 words between the title and the next heading.
    write("README.md", "# title\n\n" + " ".join(f"W{i}." for i in range(251)) + "\n\n## Part\n\nText.\n")
    expect("a 251-word first screen fails", root, 1, "README.md: the first screen has 251 words")
    write("README.md", "# title\n\n" + " ".join(f"W{i}." for i in range(250)) + "\n\n## Part\n\n" +
          " ".join(f"W{i}." for i in range(400)) + "\n")
    expect("a 250-word first screen passes", root, 0)

    os.remove(os.path.join(root, "README.md"))
    expect("no README.md is a usage error", root, 2, "no README.md")

for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print("check-readmes refuses planted long sentences and first screens; its splitter handles abbreviations, "
      "file names, versions, list items and code")
