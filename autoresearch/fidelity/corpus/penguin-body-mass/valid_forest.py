import os

import pandas as pd
from sklearn.ensemble import RandomForestRegressor

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
target = "body_mass_g"
features = [c for c in test.columns if c != "id"]
X = pd.get_dummies(pd.concat([train[features], test[features]]), dummy_na=True).fillna(-1)
model = RandomForestRegressor(n_estimators=300, random_state=0).fit(X.iloc[: len(train)], train[target])
pred = model.predict(X.iloc[len(train) :])
pd.DataFrame({"id": test["id"], target: pred}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
