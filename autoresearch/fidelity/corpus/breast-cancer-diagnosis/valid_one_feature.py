import os

import pandas as pd

d = os.environ["DATA_DIR"]
test = pd.read_csv(os.path.join(d, "test.csv"))
# larger tumours are more often malignant: rank by radius alone
score = (test["mean_radius"] - test["mean_radius"].min()) / (test["mean_radius"].max() - test["mean_radius"].min())
pd.DataFrame({"id": test["id"], "malignant": score}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
