"""The AutoResearch solution key: what is executed, not how it is written."""

from wmrl.autoresearch.tasks.model import Solution
from wmrl.autoresearch.training.streams import normalised_code, solution_key
from wmrl.core.rollouts import Exact

SCRIPT = "import pandas as pd\nx = pd.read_csv('train.csv')\nprint(x.shape)\n"


def test_comments_spacing_and_quotes_do_not_make_a_new_solution():
    same = '# load the data\nimport pandas as pd\n\nx = pd.read_csv( "train.csv" )   # here\nprint(x.shape)\n'
    assert solution_key(Solution("t", SCRIPT)) == solution_key(Solution("t", same))


def test_what_runs_differently_is_another_solution():
    other = SCRIPT.replace("print(x.shape)", "print(x.columns)")
    assert solution_key(Solution("t", SCRIPT)) != solution_key(Solution("t", other))
    assert solution_key(Solution("t", SCRIPT)) != solution_key(
        Solution("u", SCRIPT)
    )  # the task is part of it


def test_a_script_that_does_not_parse_keeps_its_text():
    broken = "def f(:\n    pass\n"
    assert normalised_code(broken) == "def f(:\n    pass"
    assert solution_key(Solution("t", broken)) == solution_key(Solution("t", broken + "\n\n"))
    assert solution_key(Solution("t", broken)) != solution_key(Solution("t", "def g(:\n"))


def test_only_scripts_have_keys():
    assert solution_key(Exact(0.0, "malformed")) is None and solution_key("text") is None
