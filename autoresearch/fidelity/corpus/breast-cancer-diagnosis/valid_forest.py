import os

import pandas as pd
from sklearn.ensemble import RandomForestClassifier

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
features = [c for c in test.columns if c != "id"]
model = RandomForestClassifier(n_estimators=300, random_state=0).fit(train[features], train["malignant"])
sub = pd.DataFrame({"id": test["id"], "malignant": model.predict_proba(test[features])[:, 1]})
sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)
