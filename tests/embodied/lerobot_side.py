"""Run by the lerobot compatibility test with a Python that has lerobot (not imported by pytest).

``python lerobot_side.py read ROOT OUT``: load a dataset we wrote with ``LeRobotDataset`` and dump what
lerobot sees (frames as uint8, actions, tasks). ``python lerobot_side.py write SRC.npz ROOT``: write the
episodes of ``SRC.npz`` with ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``.
"""

import json
import sys

import numpy as np


def read(root: str, out: str) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/wmrl-written", root=root)
    items = [ds[i] for i in range(len(ds))]
    frames = np.stack(
        [
            (it["observation.images.image"].numpy() * 255).round().astype(np.uint8).transpose(1, 2, 0)
            for it in items
        ]
    )
    np.save(f"{out}/frames.npy", frames)
    summary = {
        "num_episodes": ds.num_episodes,
        "num_frames": ds.num_frames,
        "fps": ds.fps,
        "actions": [it["action"].numpy().tolist() for it in items],
        "tasks": [it["task"] for it in items],
        "episode_index": [int(it["episode_index"]) for it in items],
        "frame_index": [int(it["frame_index"]) for it in items],
    }
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f)


def write(src: str, root: str) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    data = np.load(src, allow_pickle=False)
    frames, actions, instructions = data["frames"], data["actions"], [str(x) for x in data["instructions"]]
    h, w = frames.shape[2:4]
    features = {
        "observation.images.image": {
            "dtype": "video",
            "shape": (h, w, 3),
            "names": ["height", "width", "channels"],
        },
        "action": {"dtype": "float32", "shape": (7,), "names": None},
    }
    ds = LeRobotDataset.create("local/lerobot-written", fps=20, features=features, root=root, use_videos=True)
    for e in range(frames.shape[0]):
        for t in range(frames.shape[1]):
            ds.add_frame(
                {"observation.images.image": frames[e, t], "action": actions[e, t], "task": instructions[e]}
            )
        ds.save_episode()
    ds.finalize()


if __name__ == "__main__":
    {"read": read, "write": write}[sys.argv[1]](*sys.argv[2:])
