"""The repository's prose tells what the project does, not how a particular GPU machine was reserved or operated,
nor which numbered work period ran what: a result names its date, card, versions and command instead
(benchmarks/README.md). Every tracked Markdown, Python, shell, YAML and TOML file, notebook and the Makefile is read
line by line against a curated list of phrases that only such text uses."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".ipynb", "Makefile")
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|\d+(?:st|nd|rd|th)")

# name → pattern (case-insensitive); each names text about machine logistics or who ran what, never the product
LOGISTICS = {
    "numbered session": rf"\b(?:{ORDINALS})\s+(?:GPU\s+|work\s+)?sessions?\b",
    "a GPU or work session": r"\b(?:this|that|next|later|earlier|previous|same|one)\s+(?:GPU|work)\s+session\b",
    "work period": r"\bwork\s+periods?\b",
    "device time": r"\bdevice\s+(?:time|budget)\b|\bbudget_left",
    "lease": r"\blease\b",
    "borrowed / lent / booked": r"\b(?:borrowed|lent|booked)\b",
    "reserved machine": r"\breserv(?:ed|ing|ation)\s+(?:of\s+)?(?:a\s+|the\s+|one\s+)?(?:GPU|machine|H100|H200|card)",
    "a machine's hold": r"\bholds?\s+of\s+(?:an?\s+|one\s+|the\s+|two\s+)?(?:H100|H200|GPU|machine|card)"
                        r"|\b(?:\d+-minute|the\s+machine's|a\s+later|one|two|three|four)\s+holds?\b"
                        r"|\bheld\s+time\b",
    "files that came back": r"\b(?:files?|results?|outputs?|weights|nothing|what)\s+(?:came|come|comes)\s+back\b",
    "given back": r"\bgiven\s+back\b|\bwent\s+back\s+with\b",
    "idle limit": r"\bidle\s+limit\b",
    "machine kind": r"\bnvidia-h[12]00(?:-x\d)?\b",
    "the device tool's folder": r"(?-i:(?<![{\"])\$OUT/)",
    "carried wheels": r"\b(?:wheels?|bundle)\s+carried\b|\bcarried\s+as\s+(?:a\s+)?wheels?\b",
    "issue number": r"\bissue\s+#?\d+\b",
}
MATCHER = re.compile("|".join(f"(?P<g{i}>{pattern})" for i, pattern in enumerate(LOGISTICS.values())), re.I)
NAMES = list(LOGISTICS)


def logistics(line: str) -> str | None:
    """The name of the first phrase of ``line`` that tells machine logistics or who ran what, else None."""
    match = MATCHER.search(line)
    return None if match is None else NAMES[int(match.lastgroup[1:])]


def tracked_texts() -> list[Path]:
    """Tracked and new (not ignored) files of the checked kinds; this file, which spells the phrases, left out."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    here = Path(__file__).resolve()
    return [ROOT / name for name in sorted(set(listed))
            if name.endswith(SUFFIXES) and (ROOT / name).is_file() and (ROOT / name).resolve() != here]


@pytest.mark.parametrize("line, name", [
    ("GPU runs used the lent machine (one H100)", "borrowed / lent / booked"),
    ("The ninth session (2026-11-26) held three H200s", "numbered session"),
    ("(2026-11-23, 2nd session, one H100)", "numbered session"),
    ("the device time ran out during the second wave", "device time"),
    ("read `lease.counts` in every reply", "lease"),
    ("what came back from the run", "files that came back"),
    ("the report did not finish within the machine's 30-minute hold", "a machine's hold"),
    ("the `nvidia-h200-x2` machine", "machine kind"),
    ("python x.py --out $OUT/fp8.json", "the device tool's folder"),
    ("Target (issue 44): at 64 drives", "issue number"),
    ("torchao 0.18.0 carried as a wheel", "carried wheels"),
    ("a later work period ran it", "work period"),
])
def test_the_matcher_finds_a_planted_line(line, name):
    assert logistics(line) == name


@pytest.mark.parametrize("line", [
    "a session's first frame equals the batch rollout's (tests/session/)",
    "one run at a time holds the folder's lock; a second one stops at once",
    "frames carried into the next window for rollouts longer than one window",
    "Ray actor 1 did not come back; its samples run again; any record came back once run() returned",
    "the rate between the last two rows (the first holds the compile); $out/train_log.jsonl",
    "Measured on 2026-11-26 on one H200 with vLLM 0.26: `python scripts/bench/benchmark_alpasim.py --sessions 16`",
    "held-out clips of the synthetic world; the host's cap for this session",
])
def test_the_matcher_leaves_the_project_s_own_words(line):
    assert logistics(line) is None


def test_no_file_tells_machine_logistics_or_who_ran_what():
    found = [f"{path.relative_to(ROOT)}:{number}: [{name}] {line.strip()[:120]}"
             for path in tracked_texts()
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if (name := logistics(line))]
    assert not found, "cite results by date, card, versions and command instead:\n" + "\n".join(found)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (code blocks' comment lines are no headings)."""
    found, code = set(), False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            code = not code
        elif not code and (match := re.match(r"#+\s+(.*)", line)):
            found.add(slug(match.group(1)))
    return found


def test_slug_matches_github_anchors():
    assert slug("Running across nodes (`executor=ray`)") == "running-across-nodes-executorray"
    assert slug("AlpaSim's metrics") == "alpasims-metrics"
    assert slug("When decoding=auto is speculative") == "when-decodingauto-is-speculative"


def test_every_relative_link_of_the_markdown_resolves():
    """A page moved or a heading renamed leaves no link of the repository's Markdown pointing nowhere."""
    broken = []
    for page in (p for p in tracked_texts() if p.suffix == ".md"):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                path = (page.parent / file).resolve() if file else page
                if not path.exists():
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such file)")
                elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_stays_short_and_benchmarks_md_is_gone():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    assert not (ROOT / "BENCHMARKS.md").exists()
    pointing = [f"{path.relative_to(ROOT)}:{number}" for path in tracked_texts()
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                if "BENCHMARKS.md" in line]
    assert not pointing, f"BENCHMARKS.md is now benchmarks/ (one file per topic): {pointing}"


def test_the_readme_table_names_every_console_script():
    """README's table of commands has a row per console script of pyproject.toml, and no script that is not one."""
    import tomllib

    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    rows = set(re.findall(r"^\| `(terra-[a-z-]+)", (ROOT / "README.md").read_text(), re.M))
    assert rows == scripts, f"missing: {sorted(scripts - rows)}; not scripts: {sorted(rows - scripts)}"


# a path of the repository as prose names it: a top-level folder of the project, then its path below
REPO_PATH = re.compile(r"(?<![\w./-])((?:terra|tokenizer|decoder|conf|scripts|tests|docs|benchmarks|notebooks)/"
                       r"[\w./-]*[\w/])")
INSTALLED = {"terra/conf", "terra/tokenizer", "terra/decoder"}  # conf/, tokenizer/, decoder/ as a wheel holds them
# a placeholder (conf/GROUP/OPTION.yaml) or a gymnasium id (terra/Drive-v0)
NOT_A_PATH = re.compile(r"/[A-Z_]+(?:/|\.|$)|-v\d+$")


def missing_paths(files: list[Path], under: str = "") -> list[str]:
    """``file:line: path`` for each repository path the files name that does not exist (``under``: only the paths
    that start so)."""
    missing = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for found in REPO_PATH.finditer(line):
                name = found.group(1).rstrip("./")
                if line[found.end():found.end() + 1] in ("*", "{", "<", "$") or not name.startswith(under):
                    continue  # a pattern, not a path; or not a path asked about
                if not ((ROOT / name).exists() or name in INSTALLED or NOT_A_PATH.search(name)):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    return missing


def test_every_repo_path_named_in_the_docs_configs_and_code_exists():
    """A module or page moved leaves no path in the Markdown, the configs' comments, the code's docstrings and
    comments or pyproject.toml pointing nowhere (conf/backend/auto.yaml named terra/backends.py long after it moved),
    nor a script's path in a shell recipe or the Makefile (whose other paths are their runs' folders)."""
    texts = [path for path in tracked_texts() if path.suffix in (".md", ".yaml", ".py", ".toml")]
    commands = [path for path in tracked_texts() if path.suffix == ".sh" or path.name == "Makefile"]
    missing = missing_paths(texts) + missing_paths(commands, under="scripts/")
    assert not missing, "no such file or folder (name where it is now):\n" + "\n".join(missing)


SCRIPT_KINDS = ("bench", "experiments", "checks", "recipes", "tools")  # scripts/README.md says what each is for


def test_every_script_a_page_quotes_is_where_the_page_says():
    """Each ``scripts/...`` path of the docs, the benchmarks, the model card and the READMEs exists: a command quoted
    there runs as written."""
    pages = [path for path in tracked_texts() if path.suffix == ".md"]
    missing = [line for line in missing_paths(pages) if line.split(": ", 1)[1].startswith("scripts/")]
    assert not missing, "no such script (scripts/README.md lists where each is):\n" + "\n".join(missing)


def test_every_script_lies_in_a_folder_of_its_kind_and_the_readme_lists_it():
    scripts = ROOT / "scripts"
    loose = sorted(p.name for p in scripts.iterdir() if p.is_file() and p.name != "README.md")
    kinds = sorted(p.name for p in scripts.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert not loose and kinds == sorted(SCRIPT_KINDS), (loose, kinds)
    readme = (scripts / "README.md").read_text()
    listed = set(re.findall(r"^\| `((?:\w+/)+\w+\.(?:py|sh))`", readme, re.M))
    runnable = {str(p.relative_to(scripts)) for kind in SCRIPT_KINDS for p in (scripts / kind).iterdir()
                if p.suffix in (".py", ".sh") and p.name != "__init__.py"}
    assert listed == runnable, f"not in scripts/README.md: {sorted(runnable - listed)}; " \
                               f"listed, not there: {sorted(listed - runnable)}"
