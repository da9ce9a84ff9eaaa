#!/usr/bin/env bash
# The paper's 4B setting on verl with the WMRL plug-in (docs/scale-out.md walks through every line).
# NOT YET RUN: no GPU cluster has been available; tests check its overrides against verl's config only.
# Run on the head node of a Ray cluster whose GPU nodes train and whose sandbox nodes declare
# {"sandbox": N}; the world-model servers (one `vllm serve` per GPU) are listed in WMRL_WM_ENDPOINTS.
set -euo pipefail
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export WMRL_VERL_CONFIG="$PWD/examples/verl/wmrl_4b.yaml"
export WMRL_WM_ENDPOINTS="${WMRL_WM_ENDPOINTS:?set the world-model servers, e.g. http://wm0:8000/v1,http://wm1:8000/v1}"
MODEL="${WMRL_POLICY:-Qwen/Qwen3-4B}"   # a local folder on every node (nothing is downloaded)

.venv-verl/bin/python -m verl.trainer.main_ppo \
  trainer.use_v1=true \
  trainer.v1.trainer_mode=wmrl_sync \
  algorithm.adv_estimator=wmrl \
  algorithm.use_kl_in_reward=false \
  reward.reward_manager.name=wmrl \
  data.train_files="${WMRL_TRAIN_FILES:?parquet of prompts with extra_info.task_ref}" \
  data.train_batch_size=32 \
  data.max_prompt_length=4096 \
  data.max_response_length=4096 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes="${NNODES:-1}" \
  trainer.save_freq=10 \
  trainer.default_local_dir=runs/verl-4b \
  "+ray_kwargs.ray_init.address=auto" \
  "+ray_kwargs.ray_init.runtime_env.env_vars.WMRL_VERL_CONFIG=$WMRL_VERL_CONFIG" \
  "+ray_kwargs.ray_init.runtime_env.env_vars.WMRL_WM_ENDPOINTS=$WMRL_WM_ENDPOINTS" \
  "+ray_kwargs.ray_init.runtime_env.env_vars.RAY_AUTH_MODE=$RAY_AUTH_MODE" \
  "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=$PWD" \
  "$@"
