import os

import pandas as pd
from sklearn.linear_model import Ridge
from sklearn.model_selection import cross_val_score

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
features = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm"]
X = train[features].fillna(train[features].mean())
scores = cross_val_score(Ridge(), X, train["body_mass_g"], cv=5, scoring="r2")
print("cross-validated R2:", scores.mean())
