import os

import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
features = [c for c in test.columns if c != "id"]
model = make_pipeline(StandardScaler(), LogisticRegression()).fit(train[features], train["malignant"])
sub = pd.DataFrame({"id": test["id"], "malignant": model.predict_probability(test[features])[:, 1]})
sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)
