"""The shape of a Robometer model and the exact input format it was trained on.

Robometer (Liang et al., arXiv 2603.02115; weights ``robometer/Robometer-4B``) is a
``Qwen3VLModel`` backbone (Qwen3-VL-4B-Instruct with five added special tokens) plus small MLP heads
read at the ``<|prog_token|>`` that follows every frame. The facts below were read from the
robometer sources (``robometer/models/rbm.py``, ``heads.py``, ``data/collators/rbm_heads.py``,
``utils/setup_utils.py``, ``configs/config.yaml``) and from Qwen3-VL's published configuration; they
are data, not code copied from those projects.

Input format (multi-image mode with per-frame progress tokens, Robometer-4B's training setting):
one user turn of the Qwen3-VL chat template, without a system turn or generation prompt::

    <|im_start|>user\\n{PROGRESS_PROMPT}Picture 1: <|vision_start|><|image_pad|>…<|vision_end|><|prog_token|>
    Picture 2: <|vision_start|>…<|vision_end|><|prog_token|> … <|im_end|>\\n

(one line in reality; ``add_vision_id=True`` writes the ``Picture i: `` labels). Each
``<|image_pad|>`` is repeated once per merged 2×2 patch group of its frame. Frames are resized by
qwen-vl-utils' ``smart_resize`` (sides rounded to multiples of 32, between 4·32² and 16384·32²
pixels; a 256×256 or 128×128 LIBERO frame is kept as is), rescaled to ``[0, 1]``, normalised with
mean = std = 0.5 and cut into 16-pixel patches (see :mod:`robometer_inputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wmrl.core.config import require

__all__ = [
    "PROGRESS_PROMPT",
    "PROG_TOKEN",
    "QWEN3_VL_4B_ROBOMETER",
    "QWEN_VL_SPECIAL_TOKENS",
    "ROBOMETER_SPECIAL_TOKENS",
    "ImageConfig",
    "RobometerConfig",
]

# Added by Robometer to the Qwen3-VL tokenizer, in this order (ids 151669..151673 for Qwen3-VL).
ROBOMETER_SPECIAL_TOKENS = (
    "<|split_token|>",
    "<|reward_token|>",
    "<|pref_token|>",
    "<|sim_token|>",
    "<|prog_token|>",
)
PROG_TOKEN = "<|prog_token|>"
# The Qwen chat/vision special tokens this input format uses.
QWEN_VL_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# Robometer's progress-sample prompt, verbatim (the model was trained on exactly this text).
PROGRESS_PROMPT = (
    "The task for the robot is '{task}'. Given the trajectory video, predict the task progress at each "
    "frame, how far along the robot is towards completing the task, a float between 0 and 1, where 0 is "
    "the starting state and 1 is when the task is completed. If the robot is not performing the same "
    "task, predict 0 progress."
)

# Qwen/Qwen3-VL-4B-Instruct's config.json with the text vocabulary resized to Robometer's tokenizer
# (151 669 Qwen3 tokens + 5 Robometer tokens = 151 674 rows).
QWEN3_VL_4B_ROBOMETER: dict[str, Any] = {
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "qwen3_vl_text",
        "vocab_size": 151674,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": [24, 20, 20],
            "mrope_interleaved": True,
        },
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    "vision_config": {
        "model_type": "qwen3_vl_vision",
        "depth": 24,
        "hidden_size": 1024,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 4096,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 2560,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [5, 11, 17],
    },
}


@dataclass(frozen=True)
class ImageConfig:
    """How frames become ``pixel_values`` (Qwen3-VL's image processor + qwen-vl-utils' resize).

    Attributes:
        patch_size: pixels per patch side (16 for Qwen3-VL).
        merge_size: patches merged per side into one LLM token (2).
        temporal_patch_size: frames per temporal patch; a still image is repeated this many times (2).
        image_mean, image_std: per-channel normalisation after rescaling to ``[0, 1]``.
        min_pixels, max_pixels: qwen-vl-utils' area bounds for ``smart_resize`` (4 and 16384 tokens of 32²).
    """

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    min_pixels: int = 4 * 32 * 32
    max_pixels: int = 16384 * 32 * 32

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            require(
                isinstance(value, int) and value > 0,
                f"ImageConfig.{name} must be a positive integer; got {value!r}",
            )
        require(self.min_pixels <= self.max_pixels, "ImageConfig.min_pixels must be <= max_pixels")
        require(
            len(self.image_mean) == 3 and len(self.image_std) == 3,
            "ImageConfig.image_mean and image_std need one value per RGB channel",
        )
        require(all(s > 0 for s in self.image_std), "ImageConfig.image_std must be > 0")
        object.__setattr__(self, "image_mean", tuple(float(v) for v in self.image_mean))
        object.__setattr__(self, "image_std", tuple(float(v) for v in self.image_std))

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this (one merged token = ``factor × factor`` pixels)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Length of one ``pixel_values`` row: ``3 · temporal_patch_size · patch_size²``."""
        return 3 * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class RobometerConfig:
    """Shape of a Robometer model.

    Attributes:
        backbone: keyword arguments of ``transformers.Qwen3VLConfig`` (``text_config.vocab_size`` =
            embedding rows, which must cover the tokenizer).
        n_bins: progress bins; the progress head outputs ``n_bins`` logits whose softmax-weighted mean
            of the bin centres ``linspace(0, 1, n_bins)`` is the progress (10 for Robometer-4B).
        image: frame preprocessing.
        prompt: the progress prompt, with a ``{task}`` field.
        add_vision_id: write ``Picture i: `` before every frame (Robometer's collator sets it).
        head_dropout: dropout of the heads (inactive at inference; kept for training parity).
        name: a label for reports.
        data_resized: ``(height, width)`` of the checkpoint's ``config.yaml`` ``data.resized_height`` /
            ``data.resized_width`` (``None`` when unset). Recorded, and deliberately not applied:
            Robometer's own collator ignores them in multi-image mode (``rbm_heads.py``: the resize
            branch of ``use_multi_image`` is commented out; frames go in at their size through
            qwen-vl-utils' ``smart_resize``), which is the only mode this implementation runs. Applying
            them would feed the model other pixels than it was trained and evaluated on.
    """

    backbone: Mapping[str, Any] = field(default_factory=lambda: dict(QWEN3_VL_4B_ROBOMETER))
    n_bins: int = 10
    image: ImageConfig = field(default_factory=ImageConfig)
    prompt: str = PROGRESS_PROMPT
    add_vision_id: bool = True
    head_dropout: float = 0.1
    name: str = "robometer-4b"
    data_resized: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.data_resized is not None:
            require(
                len(self.data_resized) == 2 and all(isinstance(v, int) and v > 0 for v in self.data_resized),
                f"data_resized must be (height, width) positive integers or None; got {self.data_resized!r}",
            )
            object.__setattr__(self, "data_resized", tuple(self.data_resized))
        backbone = dict(self.backbone)
        for key in ("text_config", "vision_config"):
            require(
                isinstance(backbone.get(key), Mapping), f"RobometerConfig.backbone needs a {key!r} mapping"
            )
        text, vision = dict(backbone["text_config"]), dict(backbone["vision_config"])
        for key in ("vocab_size", "hidden_size"):
            require(key in text, f"RobometerConfig.backbone['text_config'] needs {key!r}")
        require(
            isinstance(self.n_bins, int) and self.n_bins >= 2,
            f"n_bins must be an integer >= 2; got {self.n_bins!r}",
        )
        require("{task}" in self.prompt, "the progress prompt must contain a '{task}' field")
        require(0.0 <= self.head_dropout < 1.0, f"head_dropout must be in [0, 1); got {self.head_dropout}")
        if not isinstance(self.image, ImageConfig):
            object.__setattr__(self, "image", ImageConfig(**dict(self.image)))
        for ours, theirs in (
            ("patch_size", "patch_size"),
            ("merge_size", "spatial_merge_size"),
            ("temporal_patch_size", "temporal_patch_size"),
        ):
            if theirs in vision:
                require(
                    int(vision[theirs]) == getattr(self.image, ours),
                    f"image.{ours}={getattr(self.image, ours)} disagrees with the vision tower's {theirs}={vision[theirs]}",
                )
        backbone["text_config"], backbone["vision_config"] = text, vision
        object.__setattr__(self, "backbone", backbone)

    @property
    def hidden_size(self) -> int:
        """Width of the LLM hidden states the heads read."""
        return int(self.backbone["text_config"]["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.backbone["text_config"]["vocab_size"])

    def with_vocab(self, vocab_size: int) -> RobometerConfig:
        """The same model with ``vocab_size`` embedding rows."""
        backbone = dict(self.backbone)
        backbone["text_config"] = {**backbone["text_config"], "vocab_size": int(vocab_size)}
        return RobometerConfig(
            backbone=backbone,
            n_bins=self.n_bins,
            image=self.image,
            prompt=self.prompt,
            add_vision_id=self.add_vision_id,
            head_dropout=self.head_dropout,
            name=self.name,
            data_resized=self.data_resized,
        )

    def qwen3_vl_config(self) -> Any:
        """The ``transformers.Qwen3VLConfig`` of the backbone (accepts old ``rope_scaling`` dicts too)."""
        from transformers import Qwen3VLConfig

        return Qwen3VLConfig.from_dict(dict(self.backbone))

    def to_json(self) -> dict[str, Any]:
        from wmrl.core.config import to_dict

        return to_dict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RobometerConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown RobometerConfig keys: {sorted(unknown)}")
        kwargs = dict(data)
        if "image" in kwargs and not isinstance(kwargs["image"], ImageConfig):
            image = dict(kwargs["image"])
            unknown_image = set(image) - set(ImageConfig.__dataclass_fields__)
            if unknown_image:
                raise ValueError(f"unknown ImageConfig keys: {sorted(unknown_image)}")
            kwargs["image"] = ImageConfig(**image)
        return cls(**kwargs)
