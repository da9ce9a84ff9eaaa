import os

import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
features = [c for c in test.columns if c != "id"]
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(train[features], train["cultivar"])
proba = pd.DataFrame(model.predict_proba(test[features]), columns=model.classes_)
proba.insert(0, "id", test["id"].to_numpy())
proba.to_csv(os.environ["SUBMISSION_PATH"], index=False)
