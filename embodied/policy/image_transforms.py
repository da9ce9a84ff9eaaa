"""MiniVLA's image preprocessing without torchvision: openvla-mini's LIBERO eval steps + Prismatic's transform.

For one upright ``uint8`` RGB frame ``(H, W, 3)`` the policy input is built exactly as openvla-mini's
LIBERO evaluation and Prismatic's ``dinosiglip-vit-so-224px`` / ``resize-naive`` transform do it:

1. ``get_libero_image``: resize to 224 x 224 with PIL Lanczos (a no-op when the camera renders 224 px);
2. optional ``center_crop`` (for checkpoints trained with random-crop augmentation): crop the central
   ``sqrt(0.9)`` of each side and resize back with PIL bilinear;
3. per backbone, torchvision's ``Resize((224, 224), BICUBIC)`` on the PIL image (again a no-op at
   224 px), ``ToTensor`` (``/ 255``, CHW) and ``Normalize(mean, std)`` with the timm data config:
   DINOv2 uses ImageNet mean/std, SigLIP uses 0.5/0.5.

torchvision applies PIL's own resize to PIL images, so calling PIL directly is the same computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

__all__ = [
    "DINO_MEAN",
    "DINO_STD",
    "SIGLIP_MEAN",
    "SIGLIP_STD",
    "DinoSigLIPTransform",
    "center_crop_resize",
    "jpeg_round_trip",
]

# timm data configs: IMAGENET_DEFAULT_{MEAN,STD} for DINOv2, IMAGENET_INCEPTION_{MEAN,STD} for SigLIP.
DINO_MEAN = (0.485, 0.456, 0.406)
DINO_STD = (0.229, 0.224, 0.225)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


def _check_frame(frame: np.ndarray) -> np.ndarray:
    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise ValueError(f"expected an RGB frame of shape (H, W, 3), got {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"expected a uint8 frame, got {arr.dtype}")
    return arr


def jpeg_round_trip(frame: np.ndarray, quality: int = 95) -> np.ndarray:
    """Encode ``uint8 (H, W, 3)`` as JPEG at ``quality`` and decode it again (same shape and dtype).

    OpenVLA's RLDS training images were stored as JPEG, so its LIBERO worker passes every observation
    through this round trip before the policy sees it (``tf.image.encode_jpeg``, quality 95); we use
    libjpeg through PIL with 4:2:0 chroma subsampling, TensorFlow's default too.
    """
    import io

    buf = io.BytesIO()
    Image.fromarray(_check_frame(frame)).save(buf, format="JPEG", quality=int(quality), subsampling="4:2:0")
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"), dtype=np.uint8)


def center_crop_resize(image: Image.Image, crop_scale: float = 0.9) -> Image.Image:
    """openvla-mini's test-time centre crop: keep ``crop_scale`` of the *area*, resize back (bilinear)."""
    arr = np.asarray(image)
    side = math.sqrt(crop_scale)
    t_h, t_w = int(side * arr.shape[0]), int(side * arr.shape[1])
    top, left = int((arr.shape[0] - t_h) / 2), int((arr.shape[1] - t_w) / 2)
    cropped = Image.fromarray(np.ascontiguousarray(arr[top : top + t_h, left : left + t_w]))
    return cropped.resize(image.size, Image.Resampling.BILINEAR)


def _to_normalized_tensor(
    image: Image.Image, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    # ToTensor: HWC uint8 -> CHW float32 / 255; Normalize: (x - mean) / std, in float32 as torchvision.
    x = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous().float().div(255)
    m = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    return x.sub(m).div(s)


@dataclass(frozen=True)
class DinoSigLIPTransform:
    """Frame -> ``{"dino": (3, S, S), "siglip": (3, S, S)}`` float32 tensors.

    Attributes:
        image_size: the backbones' input side S (224 for MiniVLA).
        pre_resize: apply openvla-mini's Lanczos resize to ``S x S`` first (step 1 above).
        center_crop: apply the 0.9-area centre crop (step 2); needed for checkpoints trained with
            image augmentation (openvla-mini's LIBERO eval defaults to ``center_crop=True``).
    """

    image_size: int = 224
    pre_resize: bool = True
    center_crop: bool = True
    crop_scale: float = 0.9

    def __post_init__(self) -> None:
        if self.image_size <= 0:
            raise ValueError(f"image_size must be > 0, got {self.image_size}")
        if not 0 < self.crop_scale <= 1:
            raise ValueError(f"crop_scale must be in (0, 1], got {self.crop_scale}")

    def prepare(self, frame: np.ndarray) -> Image.Image:
        """Steps 1-2: the 224 px PIL image the backbones' transforms receive."""
        image = Image.fromarray(_check_frame(frame)).convert("RGB")
        size = (self.image_size, self.image_size)
        if self.pre_resize and image.size != size:
            image = image.resize(size, Image.Resampling.LANCZOS)
        if self.center_crop:
            image = center_crop_resize(image, self.crop_scale)
        return image

    def __call__(self, frame: np.ndarray) -> dict[str, torch.Tensor]:
        image = self.prepare(frame)
        size = (self.image_size, self.image_size)
        # Prismatic "resize-naive": Resize((S, S), bicubic); PIL returns a copy when the size already matches.
        resized = image.resize(size, Image.Resampling.BICUBIC) if image.size != size else image
        return {
            "dino": _to_normalized_tensor(resized, DINO_MEAN, DINO_STD),
            "siglip": _to_normalized_tensor(resized, SIGLIP_MEAN, SIGLIP_STD),
        }

    def batch(self, frames: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """Stack a list of frames: ``{"dino": (B, 3, S, S), "siglip": (B, 3, S, S)}``."""
        if not frames:
            raise ValueError("need at least one frame")
        items = [self(f) for f in frames]
        return {k: torch.stack([it[k] for it in items]) for k in ("dino", "siglip")}
