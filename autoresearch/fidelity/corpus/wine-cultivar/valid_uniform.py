import os

import pandas as pd

d = os.environ["DATA_DIR"]
test = pd.read_csv(os.path.join(d, "test.csv"))
sub = pd.DataFrame({"id": test["id"]})
for name in ("class_0", "class_1", "class_2"):
    sub[name] = 1 / 3
sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)
