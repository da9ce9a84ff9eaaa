"""Demonstrations for behaviour cloning: one in-memory form and the formats users have.

* :class:`Demo` (:mod:`.types`): one trajectory, frames paired with the actions taken after them;
* LIBERO's HDF5 demonstration files (:mod:`.libero_hdf5`, read and write, with h5py);
* the LeRobot dataset format v3.0 (:mod:`.lerobot_format`: parquet + mp4, read and write, with
  pyarrow and imageio-ffmpeg), as the LIBERO datasets on the hub are published;
* replay of a demonstration's actions in our simulator (:mod:`.replay`), which regenerates its
  observations in our orientation and resolution (the official code replays ``demo_0``), and
  recording of new ones.

Everything here is imported lazily by the SFT stage; h5py and pyarrow come with the embodied extra.
"""

from wmrl.embodied.demos.types import Demo, convert_orientation

__all__ = ["Demo", "convert_orientation"]
