import os

import pandas as pd

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
test["body_mass_g"] = train["body_mass_g"].mean()
test[["id", "body_mass_g"]].to_csv(os.environ["SUBMISSION_PATH"], index=False)
