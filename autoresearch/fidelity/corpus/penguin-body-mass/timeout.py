import os

import pandas as pd

d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
best = None
while best is None or best > 0:  # a search that never ends
    best = abs(hash(str(best))) % 1000 + 1
