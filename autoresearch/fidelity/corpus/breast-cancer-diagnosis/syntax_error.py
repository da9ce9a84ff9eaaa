import os

import pandas as pd

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
if train.shape[0] > 0
    print("rows:", train.shape[0])
