"""The task overview: a brief of the task built from the task itself, within a token budget.

Sections, in order:

* ``TASK``: the description's head; if the budget cuts off its evaluation section (the part that
  names the metric and the submission format), that section is put back after the head.
* ``DATA``: an inventory of the public folder: every file with its size; CSV/TSV/Parquet files
  with row counts and column schemas (dtype and example values; runs of numbered columns such
  as ``pixel0 ... pixel783`` compressed to one line); folders of many files summarised by type.
* ``TARGET COLUMNS``: what to predict (columns in the training file but not in the test file,
  or the task's own list).
* ``SUBMISSION CONTRACT``: from the sample submission: exact header, row count, the id column(s)
  copied from the test file and the prediction column(s).
* ``MODALITY``: tabular, text, image, ...
* ``ENVIRONMENT``: the sandbox's limits (time, memory, the GPUs of the run's slot) and libraries;
  the agent's system prompt lists the libraries already, so its overview leaves them out
  (``OverviewConfig.libraries``).

The budget (``OverviewConfig.max_tokens``) is shared: the fixed sections are paid first, then the
head of the evaluation section (the metric), then the data inventory up to all of the rest, then
the description (its head, with the evaluation section put back) in what the inventory leaves. The
inventory comes first because the script cannot run without the file and column names, while the
metric and the submission format also reach it through the fixed sections.
Building fails loudly (:class:`OverviewError`) if the description, the data or the sample
submission is missing, rather than prompting with a hollow brief.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wmrl.autoresearch.agent.environment import SandboxEnvironment
from wmrl.autoresearch.agent.tokens import TokenCounter, as_token_counter

__all__ = ["OverviewConfig", "OverviewError", "build_overview", "evaluation_section", "from_task"]

_TABLE_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz")
_IMAGE = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".gif", ".webp", ".dcm"}
_AUDIO = {".wav", ".mp3", ".flac", ".ogg", ".aif", ".aiff"}
_READ_WHOLE_BYTES = 32 * 1024 * 1024  # read tables this small fully (exact dtypes and row counts)
_SCHEMA_ROWS = 2000  # rows sampled for dtypes/examples of a larger table
_DIR_LIST_LIMIT = 12  # a folder with more files than this is summarised by file type


class OverviewError(ValueError):
    """The task lacks something an overview must contain (description, data, sample submission)."""


@dataclass(frozen=True)
class OverviewConfig:
    """Budgets of the overview, in tokens of the counter used.

    Attributes:
        max_tokens: hard cap on the whole overview.
        description_tokens: cap on the description's head.
        evaluation_tokens: cap on the evaluation section when it is put back after a cut head.
        inventory_tokens: cap on the data inventory.
        example_values: example values shown per column.
        max_columns: columns described per table before the rest are only counted.
        libraries: list the libraries in the ``ENVIRONMENT`` section. ``False`` for a reader whose
            prompt lists them elsewhere (the agent's system prompt): the budget goes to the data
            instead of saying them twice.
    """

    max_tokens: int = 1500
    description_tokens: int = 900
    evaluation_tokens: int = 220
    inventory_tokens: int = 800
    example_values: int = 3
    max_columns: int = 40
    libraries: bool = True

    def __post_init__(self) -> None:
        for name in (
            "max_tokens",
            "description_tokens",
            "evaluation_tokens",
            "inventory_tokens",
            "max_columns",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"OverviewConfig.{name} must be an int >= 1; got {value!r}")
        if (
            isinstance(self.example_values, bool)
            or not isinstance(self.example_values, int)
            or self.example_values < 0
        ):
            raise ValueError(
                f"OverviewConfig.example_values must be an int >= 0; got {self.example_values!r}"
            )
        if self.max_tokens < 200:
            raise ValueError(
                f"OverviewConfig.max_tokens must be >= 200 to hold the fixed sections; got {self.max_tokens}"
            )


# --------------------------------------------------------------------------- description


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_BOLD_HEADING = re.compile(r"^\*\*([^*]{2,80})\*\*:?\s*$")
_PLAIN_HEADING = re.compile(
    r"^(evaluation|evaluation metric|metric|scoring|submission format|submission file)\s*:?\s*$", re.I
)
_EVAL_WORDS = re.compile(r"evaluat|metric|scoring", re.I)


def _heading(line: str) -> tuple[int, str] | None:
    """(level, title) of a heading line; bold and plain title lines rank below every # level."""
    md = _MD_HEADING.match(line)
    if md:
        return len(md.group(1)), md.group(2)
    bold = _BOLD_HEADING.match(line.strip())
    if bold:
        return 7, bold.group(1)
    if _PLAIN_HEADING.match(line.strip()):
        return 7, line.strip()
    return None


def evaluation_section(description: str) -> tuple[int, int] | None:
    """Character span ``(start, end)`` of the description's evaluation section, or ``None``.

    The section starts at the first heading whose title mentions evaluation, a metric or scoring
    and ends at the next heading of the same or a higher level.
    """
    offset = 0
    start: int | None = None
    level = 0  # the section heading's level, set with start
    for line in description.splitlines(keepends=True):
        head = _heading(line.rstrip("\n"))
        if start is None:
            if head and _EVAL_WORDS.search(head[1]):
                start, level = offset, head[0]
        elif head and head[0] <= level:
            return start, offset
        offset += len(line)
    return (start, len(description)) if start is not None else None


def _first_paragraph(section: str) -> str:
    """A section's heading and its first paragraph of text (where a description names its metric)."""
    paragraphs = [p for p in re.split(r"\n\s*\n", section.strip()) if p.strip()]
    if paragraphs and _heading(paragraphs[0].splitlines()[0]) is not None and len(paragraphs) > 1:
        return f"{paragraphs[0]}\n\n{paragraphs[1]}"
    return paragraphs[0] if paragraphs else ""


def _description_text(description: str, budget: int, cfg: OverviewConfig, tokens: TokenCounter) -> str:
    """The description within ``budget`` tokens, its evaluation section put back if the head cut it."""
    text = description.strip()
    if tokens.count(text) <= budget:
        return text
    cut = "\n[... description cut ...]"
    span = evaluation_section(text)
    if span is None:
        return tokens.head(text, max(budget - tokens.count(cut), 0)).rstrip() + cut
    evaluation = text[span[0] : span[1]].strip()
    eval_cut = "\n[... evaluation section cut ...]"
    room = budget - tokens.count(cut) - 1
    # The evaluation section (metric, format) is worth more than background prose: it may take
    # all but a few tokens of the budget, up to its own cap.
    eval_budget = max(min(cfg.evaluation_tokens, tokens.count(evaluation), room - 8), 0)
    if tokens.count(evaluation) > eval_budget:
        evaluation = tokens.head(evaluation, max(eval_budget - tokens.count(eval_cut), 0)).rstrip() + eval_cut
    head = tokens.head(text, max(room - tokens.count(evaluation), 0)).rstrip()
    if len(head) >= span[1]:  # the head already holds the whole section
        return head + cut
    if len(head) > span[0]:  # the head holds the start of the section: drop it, re-add it whole
        head = text[: span[0]].rstrip()
    return f"{head}{cut}\n{evaluation}"


# --------------------------------------------------------------------------- inventory


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _is_table(path: Path) -> bool:
    return path.name.lower().endswith(_TABLE_SUFFIXES)


def _count_rows(path: Path) -> int:
    """Data rows of a CSV (lines minus the header); counts raw newlines for big files."""
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    lines = 0
    last = b"\n"
    with opener(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    if last != b"\n":
        lines += 1
    return max(lines - 1, 0)


def _read_table(path: Path):
    """(frame sample, exact row count) of a CSV/TSV/Parquet file, or raise OSError/ValueError."""
    import pandas as pd

    if path.suffix.lower() == ".parquet":
        frame = pd.read_parquet(path)
        return frame.head(_SCHEMA_ROWS), len(frame)
    sep = "\t" if ".tsv" in path.name.lower() else ","
    if path.stat().st_size <= _READ_WHOLE_BYTES:
        frame = pd.read_csv(path, sep=sep, low_memory=False)
        return frame, len(frame)
    return pd.read_csv(path, sep=sep, nrows=_SCHEMA_ROWS, low_memory=False), _count_rows(path)


def _example(value: Any) -> str:
    if isinstance(value, float) and abs(value) < 1e6:  # 0.3333333333333333: ~18 tokens, no more than 0.3333
        return str(round(value, 4))
    text = str(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def _column_line(frame: Any, name: str, examples: int) -> str:
    series = frame[name]
    dtype = str(series.dtype)
    values = series.dropna()
    shown = [_example(v) for v in values.unique()[:examples]] if examples else []
    missing = int(series.isna().sum())
    extra = f", {missing} missing in sample" if missing else ""
    sample = f" e.g. {', '.join(shown)}" if shown else ""
    return f"{name} ({dtype}){extra}:{sample}" if sample else f"{name} ({dtype}){extra}"


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _schema_lines(frame: Any, cfg: OverviewConfig) -> list[str]:
    """One line per column, runs of numbered same-dtype columns collapsed into one line."""
    columns = [str(c) for c in frame.columns]
    lines: list[str] = []
    i = 0
    while i < len(columns) and len(lines) < cfg.max_columns:
        match = _NUMBERED.match(columns[i])
        j = i + 1
        if match:
            prefix, dtype = match.group(1), frame[columns[i]].dtype
            while j < len(columns):
                m = _NUMBERED.match(columns[j])
                if not m or m.group(1) != prefix or frame[columns[j]].dtype != dtype:
                    break
                j += 1
        if j - i >= 4:  # a run worth collapsing
            lines.append(f"{columns[i]} ... {columns[j - 1]} ({j - i} columns, {frame[columns[i]].dtype})")
            i = j
        else:
            lines.append(_column_line(frame, columns[i], cfg.example_values))
            i += 1
    if i < len(columns):
        lines.append(f"... and {len(columns) - i} more columns")
    return lines


def _table_entry(
    path: Path, rel: str, cfg: OverviewConfig, seen: dict[str, dict[str, str]], tables: dict[Path, Any]
) -> list[str]:
    try:
        if path not in tables:
            tables[path] = _read_table(path)
        frame, rows = tables[path]
    except Exception as err:  # a broken file is reported in the overview, not fatal
        return [
            f"- {rel} ({_size(path.stat().st_size)}): could not be read as a table ({type(err).__name__})"
        ]
    head = f"- {rel} ({_size(path.stat().st_size)}): {rows} rows x {frame.shape[1]} columns"
    dtypes = {str(c): str(frame[c].dtype) for c in frame.columns}
    # A test file usually repeats the training schema minus the target: say so in one line.
    for other, other_dtypes in seen.items():
        if dtypes and all(other_dtypes.get(c) == d for c, d in dtypes.items()):
            missing = [c for c in other_dtypes if c not in dtypes]
            tail = f" without {', '.join(missing)}" if missing else ""
            return [f"{head}; same columns and dtypes as {other}{tail}"]
    seen[rel] = dtypes
    return [head, *("    " + line for line in _schema_lines(frame, cfg))]


def _file_rank(rel: str) -> tuple[int, str]:
    """Inventory order: training data, test data, other tables, sample submission, the rest."""
    name = rel.lower()
    if "sample" in name:
        rank = 3
    elif "train" in name:
        rank = 0
    elif "test" in name:
        rank = 1
    elif name.endswith((*_TABLE_SUFFIXES, ".parquet")):
        rank = 2
    else:
        rank = 4
    return rank, rel


def _image_size(path: Path) -> str | None:
    try:
        from PIL import Image
    except ImportError:
        return None
    try:
        with Image.open(path) as image:
            return f"{image.width}x{image.height} {image.mode}"
    except Exception:
        return None


def _folder_summary(rel: str, files: list[Path]) -> list[str]:
    kinds = Counter(p.suffix.lower() or "(no extension)" for p in files)
    total = sum(p.stat().st_size for p in files)
    kinds_text = ", ".join(f"{n} {ext}" for ext, n in kinds.most_common(5))
    line = f"- {rel}/ ({len(files)} files, {_size(total)}: {kinds_text})"
    images = [p for p in files if p.suffix.lower() in _IMAGE]
    if images:
        sizes = Counter(s for s in (_image_size(p) for p in images[:5]) if s)
        if sizes:
            line += "; sampled image sizes: " + ", ".join(sizes)
    return [line]


def _inventory(public_dir: Path, cfg: OverviewConfig, tables: dict[Path, Any] | None = None) -> list[str]:
    """The inventory's lines. ``tables``: (frame sample, row count) per table already read, filled as
    tables are read, so one overview renders its inventory at several detail levels reading each once."""
    tables = {} if tables is None else tables
    lines: list[str] = []
    seen: dict[str, dict[str, str]] = {}
    for root, dirs, files in os.walk(public_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        root_path = Path(root)
        rel_root = root_path.relative_to(public_dir).as_posix()
        paths = [root_path / f for f in files if not f.startswith(".")]
        paths.sort(key=lambda p: _file_rank(p.relative_to(public_dir).as_posix()))
        if rel_root != "." and len(paths) > _DIR_LIST_LIMIT:
            lines += _folder_summary(rel_root, paths)
            continue
        for path in paths:
            rel = path.relative_to(public_dir).as_posix()
            if _is_table(path) or path.suffix.lower() == ".parquet":
                lines += _table_entry(path, rel, cfg, seen, tables)
            elif path.suffix.lower() == ".zip":
                import zipfile

                try:
                    with zipfile.ZipFile(path) as archive:
                        members = archive.namelist()
                    lines.append(
                        f"- {rel} ({_size(path.stat().st_size)}): zip archive, {len(members)} members, e.g. {', '.join(members[:3])}"
                    )
                except zipfile.BadZipFile:
                    lines.append(f"- {rel} ({_size(path.stat().st_size)}): not a valid zip archive")
            else:
                lines.append(f"- {rel} ({_size(path.stat().st_size)})")
    return lines


def _fit_lines(lines: Sequence[str], budget: int, tokens: TokenCounter) -> str:
    """Whole lines while they fit, then a note of how many were left out."""
    whole = "\n".join(lines)
    if tokens.count(whole) <= budget:
        return whole
    out: list[str] = []
    used = 0
    for k, line in enumerate(lines):
        cost = tokens.count(line + "\n")
        if used + cost > budget - 12:
            out.append(f"[... {len(lines) - k} more inventory lines not shown ...]")
            break
        out.append(line)
        used += cost
    return "\n".join(out)


# --------------------------------------------------------------------------- contract


def _header(path: Path) -> list[str]:
    import pandas as pd

    sep = "\t" if ".tsv" in path.name.lower() else ","
    return [str(c) for c in pd.read_csv(path, sep=sep, nrows=0).columns]


def _find(public_dir: Path, names: Sequence[str], word: str) -> Path | None:
    for name in names:
        if (public_dir / name).is_file():
            return public_dir / name
    candidates = sorted(
        p
        for p in public_dir.rglob("*")
        if p.is_file() and word in p.name.lower() and _is_table(p) and "sample" not in p.name.lower()
    )
    return candidates[0] if candidates else None


def _find_sample(public_dir: Path, name: str | None) -> Path:
    if name:
        path = public_dir / name
        if not path.is_file():
            raise OverviewError(f"the sample submission {name!r} is not in {public_dir}")
        return path
    found = sorted(
        p for p in public_dir.rglob("*") if p.is_file() and "sample" in p.name.lower() and _is_table(p)
    )
    if not found:
        raise OverviewError(
            f"no sample submission (a CSV named like sample_submission.csv) in {public_dir}: the submission "
            "contract cannot be stated"
        )
    return found[0]


def _contract(
    sample: Path,
    public_dir: Path,
    test_file: Path | None,
    id_columns: Sequence[str] | None,
    cfg: OverviewConfig,
) -> tuple[str, list[str]]:
    frame, rows = _read_table(sample)
    header = [str(c) for c in frame.columns]
    test_columns = _header(test_file) if test_file is not None else []
    ids = list(id_columns) if id_columns else [c for c in header if c in test_columns] or header[:1]
    predictions = [c for c in header if c not in ids]
    rel = sample.relative_to(public_dir).as_posix()
    lines = [
        f"Write a CSV file to the path in SUBMISSION_PATH with exactly this header: {','.join(header)}",
        f"One row per test example: {rows} rows (the sample submission {rel} has the right shape and ids).",
        f"Id column(s), copied from the test data: {', '.join(ids)}.",
        f"Prediction column(s): {', '.join(predictions) if predictions else '(none besides the ids)'}.",
    ]
    if len(frame):
        example = ", ".join(f"{c}={_example(frame[c].iloc[0])}" for c in header[: cfg.max_columns])
        lines.append(f"Example row: {example}")
    return "\n".join(lines), predictions


def _modality(public_dir: Path, train_file: Path | None) -> str:
    suffixes = Counter(p.suffix.lower() for p in public_dir.rglob("*") if p.is_file())
    if sum(suffixes[s] for s in _IMAGE) >= 10:
        return "image"
    if sum(suffixes[s] for s in _AUDIO) >= 10:
        return "audio"
    if train_file is not None:
        try:
            frame, _ = _read_table(train_file)
            for column in frame.columns:
                if frame[column].dtype == object and frame[column].dropna().astype(str).str.len().mean() > 40:
                    return "text"
        except Exception:
            pass
    return "tabular"


_MODALITY_HINT = {
    "tabular": "tabular: rows of numeric/categorical features (gradient boosting or linear models are strong baselines)",
    "text": "text: at least one column holds free text (TF-IDF + a linear model is a strong, fast baseline)",
    "image": "image: the inputs are image files (small CNNs or pretrained-free features; mind the time limit)",
    "audio": "audio: the inputs are sound files",
    "time_series": "time series: rows are ordered in time (do not shuffle across time when validating)",
    "mixed": "mixed: several input types",
    "other": "other",
}


# --------------------------------------------------------------------------- assembly


def build_overview(
    public_dir: str | os.PathLike[str],
    description: str,
    *,
    environment: SandboxEnvironment | None = None,
    sample_submission: str | None = None,
    id_columns: Sequence[str] | None = None,
    target_columns: Sequence[str] | None = None,
    train_file: str | None = None,
    test_file: str | None = None,
    modality: str | None = None,
    config: OverviewConfig | None = None,
    tokens: Any = None,
) -> str:
    """Build the overview of a task folder (see the module docstring).

    Args:
        public_dir: the folder the solution sees as ``DATA_DIR``.
        description: the task statement (markdown).
        environment: sandbox limits and libraries; ``SandboxEnvironment.detect()`` when None.
        sample_submission: file name of the sample submission (found by name when None).
        id_columns: submission key columns (inferred from the sample and test headers when None).
        target_columns: what to predict (train columns absent from test when None).
        train_file / test_file: file names inside ``public_dir`` (found by name when None).
        modality: the task's modality (inferred from the files when None).
        config: budgets.
        tokens: a token counter or Hugging Face tokenizer (approximate counts when None).

    Returns:
        The overview text, at most ``config.max_tokens`` tokens.

    Raises:
        OverviewError: empty description, missing/empty data folder, or no sample submission.
    """
    cfg = config or OverviewConfig()
    counter = as_token_counter(tokens)
    folder = Path(public_dir)
    if not isinstance(description, str) or not description.strip():
        raise OverviewError("the task description is empty: an overview starts from the task statement")
    if not folder.is_dir():
        raise OverviewError(f"the public data folder {folder} does not exist")
    if not any(p.is_file() for p in folder.rglob("*")):
        raise OverviewError(f"the public data folder {folder} holds no files")
    env = environment or SandboxEnvironment.detect()
    sample = _find_sample(folder, sample_submission)
    train = folder / train_file if train_file else _find(folder, ["train.csv"], "train")
    test = folder / test_file if test_file else _find(folder, ["test.csv"], "test")
    contract, predicted = _contract(sample, folder, test, id_columns, cfg)
    if target_columns:
        targets = list(target_columns)
    elif train is not None and test is not None:
        test_cols = set(_header(test))
        targets = [c for c in _header(train) if c not in test_cols]
    else:
        targets = predicted
    target_text = ", ".join(targets) if targets else "(could not be inferred; see the description)"
    if train is not None:
        target_text += f"  (present in {train.relative_to(folder).as_posix()}"
        target_text += f", absent from {test.relative_to(folder).as_posix()})" if test is not None else ")"
    kind = modality or _modality(folder, train)
    fixed = [
        ("TARGET COLUMNS", target_text),
        ("SUBMISSION CONTRACT", contract),
        ("MODALITY", _MODALITY_HINT.get(kind, kind)),
        (
            "ENVIRONMENT",
            f"{env.limits_line()}." + (f"\nLibraries: {env.libraries_line()}." if cfg.libraries else ""),
        ),
    ]
    fixed_text = "".join(f"\n\n## {title}\n{body}" for title, body in fixed)
    headers = "# TASK\n\n\n## DATA (read-only, in DATA_DIR)\n"
    remaining = cfg.max_tokens - counter.count(fixed_text) - counter.count(headers) - 8
    if remaining < 40:
        raise OverviewError(
            f"OverviewConfig.max_tokens={cfg.max_tokens} leaves {remaining} tokens for the description and data "
            "after the fixed sections; raise it"
        )
    tables: dict[Path, Any] = {}
    inventory_lines = _inventory(folder, cfg, tables)
    inventory_need = min(counter.count("\n".join(inventory_lines)), cfg.inventory_tokens)
    description_need = min(counter.count(description.strip()), cfg.description_tokens + cfg.evaluation_tokens)
    # Priorities: first the head of the evaluation section (its first sentence names the metric and
    # its direction; the fixed sections already give the submission format), then the data
    # inventory (file and column names: a script that guesses them fails) up to all that is left,
    # then the rest of the description in what the inventory does not need.
    # Deducting the whole evaluation section first, as agent-v1 did, left a 400-token agent overview
    # no inventory line on any bundled task.
    span = evaluation_section(description.strip())
    evaluation_head = 0
    if span is not None:
        evaluation_head = min(
            counter.count(_first_paragraph(description.strip()[span[0] : span[1]])), cfg.evaluation_tokens
        )
        evaluation_head += 24  # the two cut markers and the lines around them
    rest = max(remaining - evaluation_head, 0)
    inventory_budget = max(min(inventory_need, max(rest, remaining - description_need)), 1)
    description_budget = min(remaining - inventory_budget, cfg.description_tokens + cfg.evaluation_tokens)
    # Names before examples: a schema that does not fit with its example values is shown with fewer
    # (down to none) before whole lines are cut.
    for examples in range(cfg.example_values - 1, -1, -1):
        if counter.count("\n".join(inventory_lines)) <= inventory_budget:
            break
        inventory_lines = _inventory(folder, replace(cfg, example_values=examples), tables)
    inventory_text = _fit_lines(inventory_lines, inventory_budget, counter)
    for _ in range(4):  # tokenizers merge across the cut points: shrink the description until it fits
        text = (
            f"# TASK\n{_description_text(description, description_budget, cfg, counter)}"
            f"\n\n## DATA (read-only, in DATA_DIR)\n{inventory_text}{fixed_text}"
        )
        excess = counter.count(text) - cfg.max_tokens
        if excess <= 0:
            return text
        description_budget -= excess + 2
    return counter.head(text, cfg.max_tokens)  # last resort; not reached in practice


def from_task(
    task: Any,
    *,
    environment: SandboxEnvironment | None = None,
    config: OverviewConfig | None = None,
    tokens: Any = None,
) -> str:
    """Build the overview of a :class:`wmrl.autoresearch.tasks.Task` (its own columns, files, limits)."""
    env = environment or SandboxEnvironment.from_task(task)
    return build_overview(
        task.public_dir,
        task.description,
        environment=env,
        sample_submission=task.sample_submission,
        id_columns=task.id_columns,
        target_columns=task.target_columns,
        train_file=task.train_files[0] if task.train_files else None,
        test_file=task.test_files[0] if task.test_files else None,
        modality=task.modality,
        config=config,
        tokens=tokens,
    )
