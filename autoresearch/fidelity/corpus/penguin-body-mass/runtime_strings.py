import os

import pandas as pd
from sklearn.linear_model import LinearRegression

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
X = train.drop(columns=["id", "body_mass_g"])
model = LinearRegression().fit(X, train["body_mass_g"])
pred = model.predict(test.drop(columns=["id"]))
pd.DataFrame({"id": test["id"], "body_mass_g": pred}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
