import os

import pandas as pd

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
for column in train.columns
    print(column, train[column].dtype)
