"""MiniVLA as a WMRL policy: act in LIBERO, re-score action tokens for RL, LoRA, save and load.

One step (openvla-mini's ``predict_action`` with our RL additions):

1. the image under ``config.image_key`` goes through :class:`DinoSigLIPTransform` (followed by the one
   under ``config.wrist_image_key`` for a wrist-camera model, in openvla-mini's order: third-person, wrist);
2. the prompt is Prismatic's Qwen chat prompt ``<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n
   What action should the robot take to {instruction.lower()}?<|im_end|>\\n<|im_start|>assistant\\n``
   (the ``QwenPromptBuilder`` text; the "In: ... Out:" prompt belongs to Llama-based OpenVLA);
3. 7 tokens are decoded with a KV cache: greedy at ``temperature == 0`` (evaluation), sampled from
   ``softmax(logits / temperature)`` otherwise. With ``constrain_to_actions`` (default) the choice is
   restricted to the 256 action tokens, so every sample decodes to a valid action; without it the full
   vocabulary is used as in Prismatic's ``generate`` (a non-action id then clips to an end bin);
4. tokens -> bin centres -> q01/q99 un-normalisation -> LIBERO gripper (:mod:`action_tokenizer`).

``ActionStep.log_prob`` is the sum over the 7 tokens of ``log_softmax(logits / T)`` at the chosen ids,
over the same support (action tokens or full vocabulary), with ``T = temperature`` when sampling and
``T = 1`` for greedy decoding. :meth:`action_log_probs` recomputes exactly these per-token terms with a
single teacher-forced forward pass, differentiably.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.core.config import require
from wmrl.embodied.policy.action_tokenizer import ActionNormalizer, ActionTokenizer, gripper_to_libero
from wmrl.embodied.policy.base import ActionStep
from wmrl.embodied.policy.image_transforms import DinoSigLIPTransform, jpeg_round_trip
from wmrl.embodied.policy.minivla import MiniVLA, MiniVLAConfig
from wmrl.embodied.policy.prismatic_checkpoint import (
    load_checkpoint_groups,
    load_into,
    load_mapped_state,
    prismatic_to_ours,
    read_run,
    write_run,
)
from wmrl.embodied.policy.tokenizer import add_extra_tokens, load_tokenizer

__all__ = [
    "LORA_TARGETS",
    "WRIST_IMAGE_KEY",
    "MiniVLAPolicy",
    "MiniVLAPolicyConfig",
    "load_minivla",
    "load_saved_policy",
]

META_FILE = "minivla.json"
META_FORMAT = "wmrl-minivla-policy/1"
QWEN_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The wrist camera openvla-mini's LIBERO evaluation feeds a ``-wrist`` checkpoint (robosuite's eye-in-hand).
WRIST_IMAGE_KEY = "robot0_eye_in_hand_image"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class MiniVLAPolicyConfig:
    """How the policy turns observations into actions.

    Attributes:
        image_key: observation entry holding the upright ``uint8 (H, W, 3)`` third-person image.
        wrist_image_key: observation entry of the wrist camera's image, read after the third-person
            one, for a model with ``image_sequence_len == 2`` (openvla-mini's ``-wrist`` variant);
            ``None`` for a one-image model. Rendered in the same orientation and size.
        unnorm_key: dataset statistics to un-normalise with (None: the only one in the checkpoint).
        temperature: 0 = greedy (evaluation); > 0 = sample (RL rollouts).
        constrain_to_actions: sample/score only among the 256 action tokens.
        center_crop: openvla-mini's 0.9-area test-time centre crop (for image-augmented checkpoints).
        pre_resize: Lanczos-resize frames to the backbone size first (openvla-mini's ``get_libero_image``).
        gripper: ``"libero"`` (0/1 open/close -> -1 open / +1 close) or ``"raw"`` (no conversion).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available, else CPU).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``"auto"`` (bfloat16 on CUDA, as upstream's
            eval; float32 on CPU, where bf16 is pathologically slow).
        seed: seed of the sampling generator (None: nondeterministic).
        system_prompt: the Qwen system turn Prismatic's prompt builder inserts.
        orientation: the image orientation the policy was trained on (``upright``, ``rotate180``,
            ``raw``; see ``wmrl.embodied.env.images``). Recorded in every saved policy; evaluation
            renders in it and refuses another unless told to.
        render_size: the square camera render side (pixels) of the training images, ``None`` when
            unknown. Upstream renders LIBERO at 224 directly; resizing a 256 px render to 224 is not
            the same pixels, so evaluation renders at this size and refuses another unless told to.
        jpeg_quality: JPEG-encode and decode every frame at this quality before preprocessing (the
            official worker's round trip, matching RLDS's JPEG-stored training images; OpenVLA uses
            95), ``None`` for none. Applied identically in training and acting.
    """

    image_key: str = "agentview_image"
    wrist_image_key: str | None = None
    unnorm_key: str | None = None
    temperature: float = 0.0
    constrain_to_actions: bool = True
    center_crop: bool = True
    pre_resize: bool = True
    gripper: str = "libero"
    device: str = "cpu"
    dtype: str = "float32"
    seed: int | None = 0
    system_prompt: str = QWEN_SYSTEM_PROMPT
    orientation: str = "upright"
    render_size: int | None = None
    jpeg_quality: int | None = None

    def __post_init__(self) -> None:
        from wmrl.embodied.env.images import ORIENTATIONS

        require(self.temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        require(self.gripper in ("libero", "raw"), f"gripper must be 'libero' or 'raw', got {self.gripper!r}")
        require(
            self.dtype in (*_DTYPES, "auto"), f"dtype must be one of {[*_DTYPES, 'auto']}, got {self.dtype!r}"
        )
        require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith(("cuda", "mps")),
            f"device must be cpu, cuda, cuda:N, mps or auto; got {self.device!r}",
        )
        require(bool(self.image_key), "image_key must be a non-empty observation key")
        require(
            self.wrist_image_key is None
            or (bool(self.wrist_image_key) and self.wrist_image_key != self.image_key),
            f"wrist_image_key must be None or another observation key than image_key; got {self.wrist_image_key!r}",
        )
        require(
            self.orientation in ORIENTATIONS,
            f"orientation must be one of {', '.join(ORIENTATIONS)}; got {self.orientation!r}",
        )
        require(
            self.render_size is None or (isinstance(self.render_size, int) and self.render_size >= 8),
            f"render_size must be an integer >= 8 or None; got {self.render_size!r}",
        )
        require(
            self.jpeg_quality is None
            or (isinstance(self.jpeg_quality, int) and 1 <= self.jpeg_quality <= 100),
            f"jpeg_quality must be an integer in [1, 100] or None; got {self.jpeg_quality!r}",
        )

    def resolved(self) -> MiniVLAPolicyConfig:
        """``device``/``dtype`` ``"auto"`` made concrete for this machine (CUDA + bfloat16 when available)."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        return replace(self, device=device, dtype=dtype)

    def observation_contract(self) -> dict[str, Any]:
        """What the policy expects its images to be (evaluation and training check against it)."""
        cameras = self.cameras
        return {
            "camera": cameras[0],
            "wrist_camera": cameras[1] if len(cameras) > 1 else None,
            "orientation": self.orientation,
            "render_size": self.render_size,
            "jpeg_quality": self.jpeg_quality,
        }

    @property
    def image_keys(self) -> tuple[str, ...]:
        """The observation entries read a step, in the model's order (third-person, then wrist)."""
        return (self.image_key,) if self.wrist_image_key is None else (self.image_key, self.wrist_image_key)

    @property
    def cameras(self) -> tuple[str, ...]:
        """The cameras those entries come from (``agentview_image`` -> ``agentview``), in the same order."""
        return tuple(key.removesuffix("_image") for key in self.image_keys)

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the distribution log-probs are reported under (1 for greedy)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class _LoraState:
    r: int
    alpha: int
    targets: tuple[str, ...]
    dropout: float
    merged: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class MiniVLAPolicy:
    """A :class:`~wmrl.embodied.policy.base.TrainablePolicy` around a :class:`MiniVLA` network."""

    def __init__(
        self,
        model: MiniVLA,
        tokenizer: Any,
        dataset_statistics: Mapping[str, Any],
        config: MiniVLAPolicyConfig | None = None,
    ) -> None:
        self.config = (config or MiniVLAPolicyConfig()).resolved()
        self.tokenizer = add_extra_tokens(tokenizer, model.config.n_bins)
        vocab_len = len(self.tokenizer)
        rows = int(model.config.llm["vocab_size"])
        if rows < vocab_len:
            raise ValueError(f"the LLM has {rows} embedding rows but the tokenizer has {vocab_len} ids")
        images = len(self.config.image_keys)
        if model.config.image_sequence_len != images:
            raise ValueError(
                f"the model reads {model.config.image_sequence_len} image(s) a step but the policy gives it "
                f"{images} ({list(self.config.image_keys)}); a wrist-camera model needs wrist_image_key "
                "and a one-image model must not have one"
            )
        self.dataset_statistics = dict(dataset_statistics)
        self.action_tokenizer = ActionTokenizer(vocab_len=vocab_len, n_bins=model.config.n_bins)
        self.normalizer = ActionNormalizer.from_statistics(self.dataset_statistics, self.config.unnorm_key)
        if self.normalizer.action_dim != model.config.action_dim:
            raise ValueError(
                f"dataset statistics have {self.normalizer.action_dim} action dims, the model writes {model.config.action_dim}"
            )
        self.transform = DinoSigLIPTransform(
            image_size=model.config.image_size,
            pre_resize=self.config.pre_resize,
            center_crop=self.config.center_crop,
        )
        self.device = torch.device(self.config.device)
        self.model = model.to(device=self.device, dtype=_DTYPES[self.config.dtype]).eval()
        self._prompt_cache: dict[str, list[int]] = {}
        self._generator = torch.Generator(device=self.device)
        if self.config.seed is not None:
            self._generator.manual_seed(self.config.seed)
        else:
            self._generator.seed()
        self._lora: _LoraState | None = None
        self.set_trainable(vision=False, projector=True, llm=True)

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_prismatic(
        cls,
        run_dir: str | Path,
        tokenizer_path: str | Path | None = None,
        config: MiniVLAPolicyConfig | None = None,
        step: int | None = None,
        allow_missing_vision: bool = False,
    ) -> MiniVLAPolicy:
        """Load a local Prismatic/openvla-mini run directory (see :mod:`prismatic_checkpoint`).

        Args:
            run_dir: directory with ``config.json``, ``dataset_statistics.json``, ``checkpoints/step-*.pt``.
            tokenizer_path: local Qwen2.5-0.5B tokenizer directory; default ``run_dir/tokenizer``.
            step: checkpoint step to load (default: the highest).
        """
        run = read_run(run_dir, step)
        if (
            run.model_config.image_sequence_len == 2
            and (config or MiniVLAPolicyConfig()).wrist_image_key is None
        ):
            config = replace(config or MiniVLAPolicyConfig(), wrist_image_key=WRIST_IMAGE_KEY)
        tok_dir = Path(tokenizer_path) if tokenizer_path is not None else Path(run_dir) / "tokenizer"
        tokenizer = load_tokenizer(tok_dir)
        model = MiniVLA(run.model_config)
        state = prismatic_to_ours(load_checkpoint_groups(run.checkpoint))
        load_mapped_state(model, state, allow_missing_vision=allow_missing_vision)
        return cls(model, tokenizer, run.dataset_statistics, config)

    @classmethod
    def tiny(cls, seed: int = 0, config: MiniVLAPolicyConfig | None = None) -> MiniVLAPolicy:
        """The random tiny model (:mod:`wmrl.embodied.policy.tiny`) with placeholder statistics.

        It reads two images a step when ``config.wrist_image_key`` is set, else one.
        """
        from wmrl.embodied.policy.tiny import TINY_MINIVLA, tiny_dataset_statistics, tiny_tokenizer

        config = config or MiniVLAPolicyConfig()
        torch.manual_seed(seed)
        model_config = replace(TINY_MINIVLA, image_sequence_len=len(config.image_keys))
        return cls(MiniVLA(model_config), tiny_tokenizer(), tiny_dataset_statistics(), config)

    def save_prismatic(self, run_dir: str | Path, step: int = 0) -> Path:
        """Export a Prismatic-format run directory; LoRA adapters, if any, are merged into the exported copy."""
        return write_run(
            run_dir,
            self.merged_state_dict(),
            self.model.config,
            self.dataset_statistics,
            self.tokenizer,
            step=step,
        )

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """Plain-key tensors with each LoRA delta ``scale · B A`` added to a *copy* of its base weight.

        The live weights are not touched (an in-place merge followed by an unmerge leaves round-off).
        """
        state = {k: v.detach().clone() for k, v in self.base_state_dict().items()}
        if self._lora is None or self._lora.merged:
            return state
        from peft.tuners.lora import LoraLayer

        for name, module in self.model.named_modules():
            if isinstance(module, LoraLayer):
                key = _plain_key(f"{name}.base_layer.weight")
                # every concrete LoRA layer defines it; peft's LoraLayer base class does not declare it
                delta = module.get_delta_weight("default").detach()  # type: ignore[attr-defined]
                state[key] = state[key] + delta.to(state[key].dtype)
        return state

    def base_state_dict(self, keep_vars: bool = False) -> dict[str, torch.Tensor]:
        """The network's tensors under plain MiniVLA keys, LoRA adapters excluded.

        peft renames a wrapped LLM's keys (``llm.base_model.model.…``) and moves each adapted linear's
        weight to ``….base_layer.weight``; this undoes both so checkpoints keep one key space.
        """
        out = {}
        for key, value in self.model.state_dict(keep_vars=keep_vars).items():
            if "lora_" in key:
                continue
            out[_plain_key(key)] = value
        return out

    # -- prompts and observations --------------------------------------------------------------------
    def prompt(self, instruction: str) -> str:
        """Prismatic's Qwen prompt for ``instruction`` (lower-cased, as ``predict_action`` does)."""
        message = f"What action should the robot take to {instruction.lower()}?".replace(
            "<image>", ""
        ).strip()
        return (
            f"<|im_start|>system\n{self.config.system_prompt.strip()}<|im_end|>\n"
            f"<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
        )

    def prompt_ids(self, instruction: str) -> list[int]:
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            ids = list(self.tokenizer(self.prompt(instruction), add_special_tokens=True).input_ids)
            self._prompt_cache[instruction] = ids
        return ids

    def pixel_values(self, observations: Sequence[Mapping[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        """Preprocess B observations on the model's device.

        Returns:
            ``{"dino", "siglip"}``, each ``(B, 3, S, S)`` for a one-image model, ``(B, T, 3, S, S)``
            for a model reading ``T = len(config.image_keys)`` images a step.
        """
        keys = self.config.image_keys
        per_key: list[list[np.ndarray]] = [[] for _ in keys]
        for obs in observations:
            for key, frames in zip(keys, per_key, strict=True):
                if key not in obs:
                    raise KeyError(
                        f"observation has no {key!r} image; keys: {sorted(obs)} "
                        "(set MiniVLAPolicyConfig.image_key / wrist_image_key, and render that camera)"
                    )
                frames.append(obs[key])
        if self.config.jpeg_quality is not None:
            per_key = [[jpeg_round_trip(f, self.config.jpeg_quality) for f in frames] for frames in per_key]
        batches = [self.transform.batch(frames) for frames in per_key]
        dtype = _DTYPES[self.config.dtype]
        if len(batches) == 1:
            return {k: v.to(self.device, dtype) for k, v in batches[0].items()}
        return {k: torch.stack([b[k] for b in batches], dim=1).to(self.device, dtype) for k in batches[0]}

    # -- acting ------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """Start an episode. MiniVLA keeps no per-episode state; ``seed`` re-seeds action sampling.

        The rollout runner passes each episode's seed here, so sampled episodes are reproducible
        whatever worker or order runs them.
        """
        if seed is not None:
            self._generator.manual_seed(int(seed))

    def act(self, observation: Mapping[str, np.ndarray], instruction: str) -> ActionStep:
        return self.act_batch([observation], [instruction])[0]

    def act_batch(
        self, observations: Sequence[Mapping[str, np.ndarray]], instructions: Sequence[str]
    ) -> list[ActionStep]:
        """One action per (observation, instruction) pair, decoded in one batched pass."""
        if len(observations) != len(instructions):
            raise ValueError(f"{len(observations)} observations for {len(instructions)} instructions")
        tokens, logps = self.generate(
            self.pixel_values(observations), [self.prompt_ids(i) for i in instructions]
        )
        steps = []
        for row in range(tokens.shape[0]):
            ids = tokens[row].cpu().numpy()
            action, info = self.tokens_to_action(ids)
            info["token_log_probs"] = logps[row].cpu().numpy()
            lo, hi = self.action_tokenizer.token_range
            info["non_action_tokens"] = int(((ids < lo) | (ids > hi)).sum())
            steps.append(
                ActionStep(action=action, token_ids=ids, log_prob=float(logps[row].sum()), info=info)
            )
        return steps

    @torch.no_grad()
    def generate(
        self, pixel_values: Mapping[str, torch.Tensor], prompt_ids: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode ``action_dim`` tokens per row with a KV cache.

        Returns:
            ``(token_ids, log_probs)``, both ``(B, action_dim)``; ids in the full vocabulary (int64),
            log-probs float32 under the reported temperature (see the module docstring).
        """
        model = self.model
        patches = model.embed_images(pixel_values)
        inputs = model.assemble(patches, prompt_ids)
        cache = model.new_cache()
        hidden = model.hidden_states(inputs, cache)[:, -1]
        mask, positions = inputs.mask, inputs.positions[:, -1:]
        ones = torch.ones(mask.shape[0], 1, dtype=mask.dtype, device=mask.device)
        tokens, logps = [], []
        for k in range(model.config.action_dim):
            token, logp = self._choose(self._head(hidden))
            tokens.append(token)
            logps.append(logp)
            if k == model.config.action_dim - 1:
                break
            mask = torch.cat([mask, ones], dim=1)
            positions = positions + 1
            step = type(inputs)(model.embed_tokens(token[:, None]), mask, positions)
            hidden = model.hidden_states(step, cache)[:, -1]
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)

    def _support(self) -> tuple[slice | None, int]:
        if self.config.constrain_to_actions:
            first = self.action_tokenizer.first_token
            return slice(first, first + self.action_tokenizer.n_bins), first
        return None, 0

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        support, _ = self._support()
        return self.model.logits(hidden, support).float()

    def _choose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, offset = self._support()
        logp_all = torch.log_softmax(logits / self.config.logprob_temperature, dim=-1)
        if self.config.temperature == 0:
            local = logits.argmax(dim=-1)
        else:
            probs = logp_all.exp()
            local = torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)
        logp = logp_all.gather(-1, local[:, None]).squeeze(-1)
        return local + offset, logp

    def tokens_to_action(self, token_ids: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """7 token ids -> the environment's ``float32 (7,)`` action, plus the intermediate values."""
        normalized = self.action_tokenizer.decode(token_ids)
        raw = self.normalizer.unnormalize(normalized)
        action = gripper_to_libero(raw) if self.config.gripper == "libero" else raw
        return action.astype(np.float32), {"normalized_action": normalized, "raw_action": raw}

    # -- RL -----------------------------------------------------------------------------------------
    def action_log_probs(
        self,
        observations: Sequence[Mapping[str, np.ndarray]],
        instructions: Sequence[str],
        token_ids: np.ndarray | torch.Tensor,
    ) -> torch.Tensor:
        """Teacher-forced per-token log-probs ``(B, action_dim)``, differentiable (see the module docstring)."""
        logits, local = self.action_logits(observations, instructions, token_ids)
        logp = torch.log_softmax(logits / self.config.logprob_temperature, dim=-1)
        return logp.gather(-1, local[..., None]).squeeze(-1)

    def action_logits(
        self,
        observations: Sequence[Mapping[str, np.ndarray]],
        instructions: Sequence[str],
        token_ids: np.ndarray | torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced logits of the action positions, differentiable.

        Returns:
            ``(logits, targets)``: ``float32 (B, action_dim, S)`` over the support ``S`` (the 256 action
            tokens with ``constrain_to_actions``, else the full vocabulary) and the ``int64 (B,
            action_dim)`` indices of ``token_ids`` in that support (behaviour cloning's targets).
        """
        ids = torch.as_tensor(np.asarray(token_ids) if not torch.is_tensor(token_ids) else token_ids)
        ids = ids.to(self.device, torch.long)
        a = self.model.config.action_dim
        if ids.ndim != 2 or ids.shape[1] != a or ids.shape[0] != len(observations):
            raise ValueError(f"token_ids must have shape ({len(observations)}, {a}), got {tuple(ids.shape)}")
        if len(instructions) != len(observations):
            raise ValueError(f"{len(observations)} observations for {len(instructions)} instructions")
        support, offset = self._support()
        if support is not None and ((ids < support.start) | (ids >= support.stop)).any():
            raise ValueError(
                f"token ids outside the action range [{support.start}, {support.stop - 1}] cannot be scored "
                "by a policy with constrain_to_actions=True"
            )
        model = self.model
        patches = model.embed_images(self.pixel_values(observations))
        inputs = model.assemble(patches, [self.prompt_ids(i) for i in instructions], suffix_ids=ids[:, :-1])
        hidden = model.hidden_states(inputs)[:, -a:]
        return model.logits(hidden, support).float(), ids - offset

    def set_trainable(self, vision: bool = False, projector: bool = True, llm: bool = True) -> None:
        """Choose what full fine-tuning updates (ignored for the LLM once LoRA is applied)."""
        self.model.vision.requires_grad_(vision)
        self.model.projector.requires_grad_(projector)
        if self._lora is None:
            self.model.llm.requires_grad_(llm)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self, mode: bool = True) -> MiniVLAPolicy:
        self.model.train(mode)
        return self

    def eval(self) -> MiniVLAPolicy:
        return self.train(False)

    # -- LoRA ------------------------------------------------------------------------------------------
    def apply_lora(
        self, r: int = 16, alpha: int = 32, targets: Sequence[str] = LORA_TARGETS, dropout: float = 0.0
    ) -> None:
        """Wrap the LLM with peft LoRA adapters on ``targets``; freeze everything else.

        The official WMRL recipe uses r=16, alpha=32 on q/k/v/o/gate/up/down.
        """
        from peft import LoraConfig, get_peft_model

        if self._lora is not None:
            raise RuntimeError("LoRA is already applied to this policy")
        require(r > 0 and alpha > 0, f"LoRA r and alpha must be > 0, got r={r}, alpha={alpha}")
        config = LoraConfig(
            r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=dropout, bias="none"
        )
        self.model.requires_grad_(False)
        self.model.llm = get_peft_model(self.model.llm, config)
        self.model.llm.to(self.device)
        self._lora = _LoraState(r=r, alpha=alpha, targets=tuple(targets), dropout=dropout)

    @property
    def lora(self) -> dict[str, Any] | None:
        return None if self._lora is None else asdict(self._lora)

    def merge_lora(self) -> None:
        """Add the adapters into the base weights in place (faster inference); :meth:`unmerge_lora` undoes it.

        Unmerging subtracts the same delta, which leaves float round-off (~1e-7) in the base weights.
        """
        self._require_lora().merged = True
        self.model.llm.merge_adapter()

    def unmerge_lora(self) -> None:
        self._require_lora().merged = False
        self.model.llm.unmerge_adapter()

    def _require_lora(self) -> _LoraState:
        if self._lora is None:
            raise RuntimeError("no LoRA adapters: call apply_lora first")
        return self._lora

    # -- save / load ----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write a policy folder ``wmrl eval libero --policy FOLDER`` can load.

        Files: ``policy.json`` (the loader's ``{"type", "factory", "kwargs"}`` record), ``minivla.json``
        (architecture, acting settings, LoRA settings), ``model.safetensors`` (base weights, plain keys),
        ``adapter/`` (peft LoRA adapter, if any), ``tokenizer/`` and ``dataset_statistics.json``.
        """
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self._lora is not None and self._lora.merged:
            raise RuntimeError(
                "unmerge the LoRA adapters before saving (merged weights would be saved twice)"
            )
        tied = bool(self.model.config.llm.get("tie_word_embeddings", False))
        state = {
            k: v.detach().cpu().contiguous()
            for k, v in self.base_state_dict().items()
            if not (tied and k == "llm.lm_head.weight")
        }
        save_file(state, str(path / "model.safetensors"))
        if self._lora is not None:
            self.model.llm.save_pretrained(str(path / "adapter"))
        self.tokenizer.save_pretrained(str(path / "tokenizer"))
        (path / "dataset_statistics.json").write_text(json.dumps(self.dataset_statistics, indent=2))
        meta = {
            "format": META_FORMAT,
            "model": self.model.config.to_json(),
            # device and dtype are the loading machine's business: "auto" picks CUDA + bfloat16 there
            "policy": {**asdict(self.config), "device": "auto", "dtype": "auto"},
            "lora": None
            if self._lora is None
            else {k: v for k, v in asdict(self._lora).items() if k != "merged"},
        }
        (path / META_FILE).write_text(json.dumps(meta, indent=2))
        loader = {"type": "minivla", "kwargs": {}}  # wmrl.embodied.eval.policy_loader.POLICY_TYPES
        (path / "policy.json").write_text(json.dumps(loader, indent=2))

    @classmethod
    def from_saved(cls, path: str | Path, config: MiniVLAPolicyConfig | None = None) -> MiniVLAPolicy:
        """Rebuild a policy written by :meth:`save` (``config`` overrides the saved acting settings)."""
        path = Path(path)
        meta = _read_meta(path)
        model = MiniVLA(MiniVLAConfig.from_json(meta["model"]))
        policy_config = config or MiniVLAPolicyConfig(**meta["policy"])
        tokenizer = load_tokenizer(path / "tokenizer")
        stats = json.loads((path / "dataset_statistics.json").read_text())
        policy = cls(model, tokenizer, stats, policy_config)
        policy.load(path)
        return policy

    def load(self, path: str | Path) -> None:
        """Load weights (and LoRA adapters) written by :meth:`save` into this policy, in place."""
        from safetensors.torch import load_file

        path = Path(path)
        meta = _read_meta(path)
        if MiniVLAConfig.from_json(meta["model"]) != self.model.config:
            raise ValueError(f"{path} holds a different architecture than this policy")
        state = load_file(str(path / "model.safetensors"), device=str(self.device))
        tied = bool(self.model.config.llm.get("tie_word_embeddings", False))
        load_into(self.base_state_dict(keep_vars=True), state, tied=tied)
        saved_lora = meta.get("lora")
        if saved_lora is None:
            return
        if self._lora is None:
            self.apply_lora(
                r=saved_lora["r"],
                alpha=saved_lora["alpha"],
                targets=saved_lora["targets"],
                dropout=saved_lora["dropout"],
            )
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file as load_adapter

        adapter = load_adapter(str(path / "adapter" / "adapter_model.safetensors"), device=str(self.device))
        result = set_peft_model_state_dict(self.model.llm, adapter)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(f"adapter keys do not match this policy's LoRA layers: {unexpected[:10]}")

    def set_dataset_statistics(self, statistics: Mapping[str, Any], unnorm_key: str) -> None:
        """Replace the action statistics (fine-tuning on another dataset) and un-normalise with ``unnorm_key``."""
        normalizer = ActionNormalizer.from_statistics(statistics, unnorm_key)
        if normalizer.action_dim != self.model.config.action_dim:
            raise ValueError(
                f"statistics have {normalizer.action_dim} action dims, the model writes {self.model.config.action_dim}"
            )
        self.dataset_statistics = dict(statistics)
        self.normalizer = normalizer
        self.config = replace(self.config, unnorm_key=unnorm_key)

    def with_config(self, **changes: Any) -> MiniVLAPolicy:
        """A policy sharing this network with some acting settings changed (e.g. ``temperature=0`` for eval)."""
        other = MiniVLAPolicy.__new__(MiniVLAPolicy)
        other.__dict__.update(self.__dict__)
        other.config = replace(self.config, **changes).resolved()
        if len(other.config.image_keys) != self.model.config.image_sequence_len:
            raise ValueError(
                f"the model reads {self.model.config.image_sequence_len} image(s) a step; "
                f"image keys {list(other.config.image_keys)} do not match"
            )
        other._prompt_cache = {}
        if "unnorm_key" in changes:
            other.normalizer = ActionNormalizer.from_statistics(
                self.dataset_statistics, other.config.unnorm_key
            )
        return other

    @property
    def observation_contract(self) -> dict[str, Any]:
        """See :meth:`MiniVLAPolicyConfig.observation_contract`."""
        return self.config.observation_contract()


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} has no {META_FILE} (not a policy saved by MiniVLAPolicy.save)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != META_FORMAT:
        raise ValueError(f"{meta_path}: unknown format {meta.get('format')!r}")
    return meta


def load_saved_policy(folder: str | Path, **overrides: Any) -> MiniVLAPolicy:
    """Factory for the policy loader: rebuild a saved MiniVLA, ``overrides`` replacing acting settings.

    ``overrides`` are :class:`MiniVLAPolicyConfig` fields (``temperature``, ``seed``, ``device``...).
    """
    meta = _read_meta(Path(folder))
    _check_overrides(overrides)
    config = MiniVLAPolicyConfig(**{**meta["policy"], **overrides})
    return MiniVLAPolicy.from_saved(folder, config=config)


def _check_overrides(overrides: Mapping[str, Any]) -> None:
    unknown = set(overrides) - set(MiniVLAPolicyConfig.__dataclass_fields__) - {"tokenizer_path", "step"}
    if unknown:
        raise ValueError(f"unknown MiniVLA policy settings: {sorted(unknown)}")


def load_minivla(folder: str | Path, **settings: Any) -> MiniVLAPolicy:
    """The ``{"type": "minivla"}`` factory of ``policy.json``: a saved policy folder or a Prismatic run.

    A folder with ``minivla.json`` (:meth:`MiniVLAPolicy.save`) is rebuilt with its saved acting
    settings; a Prismatic/openvla-mini run directory (``config.json`` + ``checkpoints/step-*.pt``)
    is read as upstream's ``load_vla`` reads it. ``settings`` are :class:`MiniVLAPolicyConfig`
    fields (``device``, ``dtype``, ``unnorm_key``, ``temperature``...) plus, for a Prismatic run,
    ``tokenizer_path`` and ``step``.
    """
    folder = Path(folder)
    _check_overrides(settings)
    if (folder / META_FILE).is_file():
        extra = {k for k in ("tokenizer_path", "step") if k in settings}
        if extra:
            raise ValueError(f"{sorted(extra)} apply to Prismatic run directories, not to {folder}")
        return load_saved_policy(folder, **settings)
    if (folder / "checkpoints").is_dir():
        settings = dict(settings)
        tokenizer_path = settings.pop("tokenizer_path", None)
        step = settings.pop("step", None)
        return MiniVLAPolicy.from_prismatic(
            folder, tokenizer_path=tokenizer_path, config=MiniVLAPolicyConfig(**settings), step=step
        )
    raise FileNotFoundError(
        f"{folder} is neither a saved MiniVLA policy ({META_FILE}) nor a Prismatic run directory (checkpoints/)"
    )


def _plain_key(key: str) -> str:
    return key.replace("llm.base_model.model.", "llm.", 1).replace(".base_layer.", ".")
