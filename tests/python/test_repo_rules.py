"""The product's comments state contracts, not history: no run ordinals ("twenty-second run"), issue
numbers, dates, commit hashes or "variant N" in llmc/ or the top-level programs (measurements and
history live in docs/ and git), and one include style. Each rule is also checked against a line that must trip it."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# ordinals from the tenth up: "a second run" is plain English, "the twenty-sixth run" is a journal
ORDINAL = r"(tenth|eleventh|twelfth|\w+teenth|\w+tieth|\w+ty-\w+)"
RULES = {
    "a run ordinal": re.compile(ORDINAL + r" (verification |GPU |lab )?runs?\b", re.I),
    "a numbered run or call": re.compile(r"\b(run|call) [0-9]+\b"),
    "an issue number": re.compile(r"\bissues? #?[0-9]+", re.I),
    "a date": re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b"),
    "a commit hash": re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-e])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w.])"),
    "a numbered variant": re.compile(r"\bvariants? [0-9]+", re.I),
}


def product_files():
    files = sorted(ROOT.glob("llmc/**/*.h")) + sorted(ROOT.glob("llmc/**/*.cuh"))
    files += sorted(ROOT.glob("*.cu")) + sorted(ROOT.glob("*.cpp"))
    assert len(files) > 20, "the product's sources were not found"
    return files


@pytest.mark.parametrize("line,rule", [
    ("// measured slower (docs/perf.md, twenty-second run)", "a run ordinal"),
    ("// the thirty-fourth verification run", "a run ordinal"),
    ("// (fifteenth run)", "a run ordinal"),
    ("// see call 4", "a numbered run or call"),
    ("// fixed for issue 17", "an issue number"),
    ("// measured 2026-12-04", "a date"),
    ("// on the H200 (--profile, e1adc67)", "a commit hash"),
    ("// lab variant 9", "a numbered variant"),
])
def test_rules_trip(line, rule):
    assert RULES[rule].search(line), f"the rule for {rule} misses {line!r}"


@pytest.mark.parametrize("line", [
    "const float k = 0.7978845608028654f;", "x * 0.044715f", "// 1.4426950408889634f = log2(e)",
    "// variants live in dev/cuda", "// run the kernel", "failed on a second run", "#define MAGIC 0x44545047",
])
def test_rules_pass_contracts(line):
    hits = [name for name, rule in RULES.items() if rule.search(line)]
    assert not hits, f"{line!r} trips {hits}"


def test_product_comments_carry_no_history():
    found = []
    for path in product_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for name, rule in RULES.items():
                if rule.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {name}: {line.strip()[:120]}")
    assert not found, "history in the product's comments (move it to docs/ or drop it):\n" + "\n".join(found)


# One include style: a project header is named from the repo root ("llmc/x.cuh", "llmc/cpu/x.h"), never
# relative to the including file, so every file reads the same and a header moves with one edit.
BARE_INCLUDE = re.compile(r'^\s*#\s*include\s+"(?!llmc/|tests/|dev/)[^"]+"')


def test_bare_include_trips():
    assert BARE_INCLUDE.search('#include "cuda_common.cuh"')
    assert not BARE_INCLUDE.search('#include "llmc/cuda_common.cuh"')


def test_one_include_style():
    bad = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in product_files()
           for i, line in enumerate(f.read_text().splitlines(), 1) if BARE_INCLUDE.search(line)]
    assert not bad, "includes relative to the file (name them from the repo root):\n" + "\n".join(bad)
